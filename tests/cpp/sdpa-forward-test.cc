// The SIMD forward kernel (through sdpa::forward) against the double-precision reference.
// Shapes come from the tile sizes in src/tiles.h: 1, tile-1, tile, tile+1, primes.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/alibi.h"
#include "math/f16-f32-cvt-wasmsimd.h"
#include "parallel/thread-pool.h"
#include "reference/sdpa-reference.h"
#include "sdpa.h"
#include "tiles.h"

#include "attention-test-case.h"

namespace sdpa {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A test problem (attention-test-case.h), and whether forward() also writes the weights.
struct Case : test::AttentionCase {
  bool weights = true;
};

struct Harness : test::OptionArrays {
  Case c;
  std::vector<float> q, k, v, out, weights;
  Problem p;

  explicit Harness(const Case& cs) : c(cs) {
    test::CaseRandom random(c.seed);
    test::draw_qkv(c, random, q, k, v);
    out.assign(size_t(c.B) * c.Hq * c.Lq * c.Ev, kNaN);  // NaN: every element must be written
    if (c.weights) weights.assign(size_t(c.B) * c.Hq * c.Lq * c.Lk, kNaN);

    test::set_shapes(c, p);
    p.query = q.data(), p.key = k.data(), p.value = v.data(), p.output = out.data();
    p.weights = c.weights ? weights.data() : nullptr;
    test::set_options(c, random, *this, p);
  }

  float& value_at(int b, int h, int j, int c_) {
    return v[size_t(b * p.v_stride_b + h * p.v_stride_h + j * p.v_stride_l + c_)];
  }
  float& key_at(int b, int h, int j, int d) {
    return k[size_t(b * p.k_stride_b + h * p.k_stride_h + j * p.k_stride_l + d)];
  }

  Status run() {
    std::vector<float> scratch(scratch_floats(p));
    return forward(p, scratch.data(), scratch.size());
  }

  // Output (in the case's layout) element for logical (b, h, i, c).
  float output_at(int b, int h, int i, int c_) const {
    return out[size_t(b * p.o_stride_b + h * p.o_stride_h + i * p.o_stride_l + c_)];
  }

  // Compares against the reference: |got - ref| <= tol·(1 + |ref|) for every element.
  void expect_matches_reference(double tol = 2e-5) const {
    std::vector<double> ref_w;
    const std::vector<double> ref = reference_forward(p, c.weights ? &ref_w : nullptr);
    double worst = 0.0;
    for (int b = 0; b < c.B; b++)
      for (int h = 0; h < c.Hq; h++)
        for (int i = 0; i < c.Lq; i++)
          for (int e = 0; e < c.Ev; e++) {
            const double r = ref[size_t(((b * c.Hq + h) * c.Lq + i) * c.Ev + e)];
            const float g = output_at(b, h, i, e);
            const double err = std::abs(g - r) / (1.0 + std::abs(r));
            worst = std::max(worst, err);
            ASSERT_TRUE(std::isfinite(g) && err <= tol)
                << c.describe() << "\n output[" << b << "," << h << "," << i << "," << e
                << "] got " << g << " ref " << r;
          }
    if (c.weights) {
      for (size_t n = 0; n < ref_w.size(); n++) {
        const double err = std::abs(weights[n] - ref_w[n]);
        ASSERT_TRUE(std::isfinite(weights[n]) && err <= tol)
            << c.describe() << "\n weights[" << n << "] got " << weights[n] << " ref " << ref_w[n];
      }
    }
  }
};

void check(const Case& c, double tol = 2e-5) {
  Harness h(c);
  ASSERT_EQ(h.run(), Status::kOk) << c.describe();
  h.expect_matches_reference(tol);
}

const int kEdgeLengths[] = {1, 2, kQueryTile - 1, kQueryTile, kQueryTile + 1, 13,
                            kKeyTile - 1, kKeyTile, kKeyTile + 1, 2 * kKeyTile + 1, 97};

using test::cycling_sinks;

TEST(SdpaForward, QueryAndKeyLengthsAroundTileEdges) {
  uint32_t seed = 1;
  for (int lq : kEdgeLengths)
    for (int lk : kEdgeLengths) {
      Case c;
      c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 8, c.seed = seed++;
      check(c);
    }
}

TEST(SdpaForward, HeadDimsAroundVectorAndBlockWidths) {
  uint32_t seed = 100;
  for (int e : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 64, 128, 256})
    for (int ev : {1, 3, 4, kValueBlock - 1, kValueBlock, kValueBlock + 1, 24, 64}) {
      Case c;
      c.Lq = 5, c.Lk = 37, c.E = e, c.Ev = ev, c.seed = seed++;
      check(c);
    }
}

TEST(SdpaForward, GroupedAndMultiQueryHeads) {
  const int heads[][2] = {{2, 2}, {4, 2}, {6, 3}, {8, 1}, {6, 2}};
  uint32_t seed = 200;
  for (auto& hh : heads)
    for (bool bshd : {false, true}) {
      Case c;
      c.B = 2, c.Hq = hh[0], c.Hkv = hh[1], c.Lq = 6, c.Lk = 35, c.E = 12, c.Ev = 10;
      c.bshd = bshd, c.seed = seed++;
      check(c);
    }
}

TEST(SdpaForward, MasksOfEveryBroadcastShape) {
  const std::vector<std::vector<int>> shapes = {
      {7, 41}, {1, 41}, {7, 1}, {41}, {1}, {3, 7, 41}, {1, 7, 41}, {3, 1, 41},
      {2, 3, 7, 41}, {2, 1, 1, 41}, {1, 3, 7, 41}, {2, 1, 7, 41}, {1, 1, 1, 1}};
  uint32_t seed = 300;
  for (const auto& dims : shapes)
    for (MaskKind kind : {MaskKind::kFloat, MaskKind::kBool})
      for (bool causal : {false, true}) {
        Case c;
        c.B = 2, c.Hq = 3, c.Hkv = 1, c.Lq = 7, c.Lk = 41, c.E = 8, c.Ev = 5;
        c.mask_kind = kind, c.mask_dims = dims, c.mask_block_fraction = 0.3;
        c.causal = causal, c.offsets = {3}, c.seed = seed++;
        check(c);
      }
}

TEST(SdpaForward, CausalOffsetsTopLeftBottomRightNegativeAndPerBatch) {
  uint32_t seed = 400;
  for (int lq : {1, 4, 5, 33})
    for (int lk : {1, 31, 33, 70})
      for (int offset : {0, lk - lq, -2, -lq, 5, 1000, -1000}) {
        Case c;
        c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 8, c.causal = true, c.offsets = {offset};
        c.seed = seed++;
        check(c);
      }
  Case c;
  c.B = 3, c.Lq = 9, c.Lk = 40, c.E = 8, c.Ev = 8, c.causal = true, c.offsets = {0, 31, -4};
  check(c);
}

TEST(SdpaForward, KeyLengthsSoftcapAndScale) {
  Case c;
  c.B = 4, c.Hq = 2, c.Lq = 6, c.Lk = 70, c.E = 16, c.Ev = 16;
  c.key_lengths = {70, 0, 33, 1};
  check(c);
  c.causal = true, c.offsets = {64};
  check(c);
  c.key_lengths = {}, c.causal = false, c.softcap = 2.5f, c.scale = 0.7f;
  check(c);
  c.softcap = 0.0f, c.scale = -0.01f;
  check(c);
  c.scale = 0.0f;  // every score 0: uniform softmax
  check(c);
}

TEST(SdpaForward, FullyMaskedRowsAreExactZeros) {
  Case c;
  c.B = 2, c.Hq = 2, c.Lq = 6, c.Lk = 40, c.E = 8, c.Ev = 8, c.causal = true;
  c.offsets = {-3, -100};  // batch 0: rows 0..2 see nothing; batch 1: no row sees anything
  Harness h(c);
  ASSERT_EQ(h.run(), Status::kOk);
  h.expect_matches_reference();
  for (int hh = 0; hh < 2; hh++)
    for (int e = 0; e < 8; e++) {
      for (int i = 0; i < 3; i++) EXPECT_PRED1(test::is_plus_zero, h.output_at(0, hh, i, e));
      for (int i = 0; i < 6; i++) EXPECT_PRED1(test::is_plus_zero, h.output_at(1, hh, i, e));
    }

  Case m;  // a bool mask row of all zeros, and key length 0
  m.B = 2, m.Lq = 5, m.Lk = 9, m.mask_kind = MaskKind::kBool, m.mask_dims = {5, 9};
  m.key_lengths = {9, 0};
  Harness hm(m);
  std::fill(hm.mask_b.begin() + 2 * 9, hm.mask_b.begin() + 3 * 9, 0);
  ASSERT_EQ(hm.run(), Status::kOk);
  hm.expect_matches_reference();
  for (int e = 0; e < m.Ev; e++) {
    EXPECT_PRED1(test::is_plus_zero, hm.output_at(0, 0, 2, e));
    for (int i = 0; i < 5; i++) EXPECT_PRED1(test::is_plus_zero, hm.output_at(1, 0, i, e));
  }
  for (int j = 0; j < 9; j++) EXPECT_PRED1(test::is_plus_zero, hm.weights[2 * 9 + j]);
}

TEST(SdpaForward, NanInBlockedKeysNeverReachesTheOutput) {
  // Padding past key_lengths, keys past the causal frontier, and keys blocked by a mask
  // hold NaN in K and V; the reference (which never reads them) stays finite. Ev = 9 has V
  // copied with padding, Ev = 16 read in place.
  for (int ev : {9, 16}) {
    Case c;
    c.B = 2, c.Hq = 2, c.Lq = 7, c.Lk = 45, c.E = 8, c.Ev = ev;
    c.key_lengths = {30, 45}, c.causal = true, c.offsets = {20};
    c.mask_kind = MaskKind::kFloat, c.mask_dims = {7, 45};
    Harness h(c);
    for (int j = 0; j < 45; j++) h.mask_f[size_t(3 * 45 + j)] = j % 3 == 0 ? -kInf : 0.5f;
    for (int b = 0; b < 2; b++)
      for (int kvh = 0; kvh < h.c.Hkv; kvh++)
        for (int j = 0; j < 45; j++) {
          const bool padding = j >= h.c.key_lengths[size_t(b)];
          const bool after_frontier = j > 6 + 20;  // no row may see it
          if (padding || after_frontier) {
            for (int d = 0; d < 8; d++) h.key_at(b, kvh, j, d) = kNaN;
            for (int e = 0; e < ev; e++) h.value_at(b, kvh, j, e) = kNaN;
          }
        }
    ASSERT_EQ(h.run(), Status::kOk);
    h.expect_matches_reference();
  }

  // V rows blocked for one query row only (mask) but attended by other rows: row 3 must
  // not see the NaN those rows legitimately produce.
  Case m;
  m.Lq = 4, m.Lk = 12, m.mask_kind = MaskKind::kBool, m.mask_dims = {4, 12};
  Harness hm(m);
  for (int j = 0; j < 12; j++) hm.mask_b[size_t(3 * 12 + j)] = j == 5 ? 0 : 1;
  for (int e = 0; e < m.Ev; e++) hm.value_at(0, 0, 5, e) = kNaN;
  for (int d = 0; d < m.E; d++) hm.key_at(0, 0, 5, d) = kNaN;
  ASSERT_EQ(hm.run(), Status::kOk);
  for (int e = 0; e < m.Ev; e++) {
    EXPECT_TRUE(std::isfinite(hm.output_at(0, 0, 3, e))) << "row 3 col " << e;
    EXPECT_TRUE(std::isnan(hm.output_at(0, 0, 0, e))) << "row 0 attends the NaN key";
  }
}

TEST(SdpaForward, SlidingWindowsAroundTileEdges) {
  // A window W: row i attends keys i + offset - W < j <= i + offset. Windows of 1 key, of a
  // tile of keys and one either side, wider than Lk; starts on and off tile edges; offsets
  // bottom-right, top-left, negative; with key lengths cutting the windows, on the prefill
  // (packed) and decode (in place, split-K) paths.
  uint32_t seed = 900;
  for (int lq : {1, 5, 37})
    for (int lk : {1, 13, kKeyTile - 1, kKeyTile + 1, 2 * kKeyTile + 3})
      for (int window : {1, 2, 7, kKeyTile - 1, kKeyTile, kKeyTile + 1, 5000}) {
        Case c;
        c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 8, c.causal = true, c.window = window, c.seed = seed++;
        c.offsets = {lk - lq};
        check(c);
        c.B = 2, c.offsets = {0, lk / 2 - lq}, c.key_lengths = {lk, (lk + 1) / 2};
        check(c);
      }
}

TEST(SdpaForward, SlidingWindowsWithGqaMasksSoftcapAndWeights) {
  // Windows combine with everything else that blocks keys, in the contract's order; GQA rows
  // of one tile have different windows (several query rows per head).
  uint32_t seed = 1000;
  for (auto hh : {std::pair<int, int>{1, 1}, {4, 1}, {6, 2}})
    for (int lq : {1, 3, 9})
      for (int lk : {40, 700, 1100}) {
        Case c;
        c.B = 2, c.Hq = hh.first, c.Hkv = hh.second, c.Lq = lq, c.Lk = lk, c.E = 12, c.Ev = 7;
        c.causal = true, c.offsets = {lk - lq, lk - lq - 30}, c.window = lk / 3 + 1, c.seed = seed++;
        c.weights = lk < 1000;
        check(c);
        c.mask_kind = MaskKind::kBool, c.mask_dims = {c.B, 1, lq, lk}, c.mask_block_fraction = 0.3;
        check(c);
        c.mask_kind = MaskKind::kFloat, c.mask_dims = {lk}, c.softcap = 4.0f, c.bshd = true;
        check(c);
      }
}

TEST(SdpaForward, NanBeforeTheWindowNeverReachesTheOutput) {
  // Keys before every row's window hold NaN in K and V, and so does a key inside some rows'
  // windows but before others' (rows attending it are NaN, the others finite): the keys before
  // a window are skipped, not multiplied by 0. Prefill and decode, float and no mask.
  for (int lq : {1, 6})
    for (int lk : {50, 1300})
      for (int masked : {0, 1}) {
        Case c;
        c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 16, c.causal = true, c.offsets = {lk - lq}, c.window = 20;
        if (masked) c.mask_kind = MaskKind::kFloat, c.mask_dims = {lq, lk};
        Harness h(c);
        const int first_window_key = lk - lq - 20 + 1;  // row 0's first key
        for (int j = 0; j < first_window_key; j++) {
          for (int d = 0; d < 8; d++) h.key_at(0, 0, j, d) = kNaN;
          for (int e = 0; e < 16; e++) h.value_at(0, 0, j, e) = kNaN;
        }
        ASSERT_EQ(h.run(), Status::kOk);
        h.expect_matches_reference();
        if (lq == 1) continue;
        for (int e = 0; e < 16; e++) h.value_at(0, 0, first_window_key, e) = kNaN;  // row 0's first key only
        ASSERT_EQ(h.run(), Status::kOk);
        for (int e = 0; e < 16; e++) {
          EXPECT_TRUE(std::isnan(h.output_at(0, 0, 0, e))) << "row 0 attends the NaN key";
          for (int i = 1; i < lq; i++) EXPECT_TRUE(std::isfinite(h.output_at(0, 0, i, e))) << "row " << i;
        }
      }
}

TEST(SdpaForward, KeyStartsSkipLeftPaddingHoldingNaN) {
  // A left-padded batch: keys j < key_starts[b] are padding, hold NaN in K and V, and are never
  // read into the arithmetic. Starts at 0, mid-tile, on and beside the 512-key tile and segment
  // edges, Lk (an empty batch); with key lengths, causal offsets, a window, masks; prefill and
  // decode (one query row per KV head, split into segments).
  uint32_t seed = 1200;
  for (int lq : {1, 6})
    for (int lk : {40, 1100}) {
      const std::vector<std::vector<int32_t>> starts = {{0, 7}, {kKeyTile - 1, kKeyTile}, {kKeyTile + 1, lk}, {lk - 1, 3}};
      for (const auto& ks : starts) {
        if (ks[0] > lk || ks[1] > lk) continue;
        for (int variant = 0; variant < 3; variant++) {
          Case c;
          c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 9, c.seed = seed++, c.key_starts = ks;
          if (variant == 1) c.causal = true, c.offsets = {lk - lq, lk / 2}, c.key_lengths = {lk, lk - 2};
          if (variant == 2) c.causal = true, c.offsets = {lk - lq}, c.window = 30, c.mask_kind = MaskKind::kBool,
                            c.mask_dims = {c.B, 1, lq, lk}, c.mask_block_fraction = 0.2;
          Harness h(c);
          for (int b = 0; b < 2; b++)
            for (int kvh = 0; kvh < 2; kvh++)
              for (int j = 0; j < ks[size_t(b)]; j++) {
                for (int d = 0; d < 8; d++) h.key_at(b, kvh, j, d) = kNaN;
                for (int e = 0; e < 9; e++) h.value_at(b, kvh, j, e) = kNaN;
              }
          ASSERT_EQ(h.run(), Status::kOk) << c.describe();
          h.expect_matches_reference();
        }
      }
    }
}

TEST(SdpaForward, SinksAroundTileEdgesOnEveryPath) {
  // gpt-oss's sinks: one more logit per query head whose value row is zero, so each row's
  // weights sum to less than one. Heads without a sink (-inf), with one below, about and far
  // above the scores; MHA and GQA; prefill (packed) and decode (in place, split-K past 512
  // keys) with weights; causal rows with nothing to attend (a negative offset), key lengths.
  uint32_t seed = 1300;
  for (auto hh : {std::pair<int, int>{5, 5}, {5, 1}})
    for (int lq : {1, 5, 37})
      for (int lk : {1, 13, kKeyTile - 1, kKeyTile + 1, 2 * kKeyTile + 3}) {
        Case c;
        c.B = 2, c.Hq = hh.first, c.Hkv = hh.second, c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 12, c.seed = seed++;
        c.sinks = cycling_sinks(c.Hq);
        check(c);
        c.causal = true, c.offsets = {lk - lq, -2}, c.key_lengths = {lk, (lk + 1) / 2};
        check(c);
        c.mask_kind = MaskKind::kFloat, c.mask_dims = {lq, lk}, c.mask_block_fraction = 0.3, c.softcap = 5.0f;
        c.window = 9;
        check(c);
      }
}

TEST(SdpaForward, SinksKeepEmptyRowsZeroAndEnterTheLogSumExp) {
  // A row with nothing to attend still gets exact +0 (output and weights) with a sink; its
  // lse is the sink itself (log of exp(sink)), -inf without one. Every other row's lse
  // includes exp(sink), as the reference's. Sinks of -inf everywhere give the bits of no sinks.
  uint32_t seed = 1400;
  for (int lq : {1, 6})
    for (int lk : {40, 1100}) {
      Case c;
      c.B = 2, c.Hq = 5, c.Hkv = 5, c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 8, c.seed = seed++;
      c.key_lengths = {lk, 0};  // batch 1: every row empty
      c.sinks = cycling_sinks(c.Hq);
      Harness h(c);
      std::vector<float> lse(size_t(c.B) * c.Hq * c.Lq, kNaN);
      h.p.logsumexp = lse.data();
      ASSERT_EQ(h.run(), Status::kOk) << c.describe();
      h.expect_matches_reference();
      const std::vector<double> ref_lse = reference_logsumexp(h.p);
      for (int hd = 0; hd < c.Hq; hd++)
        for (int i = 0; i < lq; i++) {
          for (int e = 0; e < c.Ev; e++) EXPECT_PRED1(test::is_plus_zero, h.output_at(1, hd, i, e));
          for (int j = 0; j < lk; j++) {
            EXPECT_PRED1(test::is_plus_zero, h.weights[size_t(((1 * c.Hq + hd) * lq + i) * lk + j)]);
          }
          EXPECT_EQ(lse[size_t((1 * c.Hq + hd) * lq + i)], c.sinks[size_t(hd)]) << "empty row, head " << hd;
          const size_t row = size_t((0 * c.Hq + hd) * lq + i);
          EXPECT_NEAR(lse[row], ref_lse[row], 2e-5 * (1 + std::abs(ref_lse[row]))) << c.describe() << " head " << hd;
        }
      // A sink of -0: an empty row's lse is -0 itself, bit for bit (not -0 + log 1 = +0).
      Case negative_zero = c;
      negative_zero.sinks.assign(size_t(c.Hq), -0.0f);
      Harness nz(negative_zero);
      std::vector<float> nz_lse(lse.size(), kNaN);
      nz.p.logsumexp = nz_lse.data();
      ASSERT_EQ(nz.run(), Status::kOk);
      for (int hd = 0; hd < c.Hq; hd++)
        for (int i = 0; i < lq; i++) {
          const float x = nz_lse[size_t((1 * c.Hq + hd) * lq + i)];
          EXPECT_TRUE(x == 0.0f && std::signbit(x)) << "empty row, head " << hd << ": " << x;
        }
      // All -inf: the bits of no sinks at all.
      Case none = c;
      none.sinks.clear();
      Case minus_inf = c;
      minus_inf.sinks.assign(size_t(c.Hq), -kInf);
      Harness a(none), b(minus_inf);
      ASSERT_EQ(a.run(), Status::kOk);
      ASSERT_EQ(b.run(), Status::kOk);
      EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float))) << c.describe();
      EXPECT_EQ(0, std::memcmp(a.weights.data(), b.weights.data(), a.weights.size() * sizeof(float))) << c.describe();
    }
}

TEST(SdpaForward, HugeLogitsNeitherOverflowNorNaN) {
  for (float magnitude : {1e2f, 1e4f, 1e6f}) {
    Case c;
    c.Lq = 9, c.Lk = 70, c.E = 16, c.Ev = 8, c.input_scale = magnitude, c.seed = 77;
    Harness h(c);
    ASSERT_EQ(h.run(), Status::kOk);
    // fp32 rounding of a score s costs about |s|·2^-23 in its exponent; scores here reach
    // ~|q|·|k|/4 ≈ magnitude·4, so the tolerance follows that bound (3.8e-4 at 1e2)...
    double tol = std::max(2e-5, 8.0 * magnitude * 4.0 * std::ldexp(1.0, -23));
    // ...unless every row's softmax is one-hot: its best weight is 1 in double (every other
    // score more than 37 below the best: e^-37 < 2^-53), while rounding moves a score by about
    // magnitude·2^-21 (0.5 at 1e6). Then float32 picks the reference's key and 2e-5 holds.
    std::vector<double> ref_w;
    reference_forward(h.p, &ref_w);
    bool one_hot = true;
    for (size_t row = 0; row < ref_w.size() / size_t(c.Lk); row++) {
      const double* w = ref_w.data() + row * size_t(c.Lk);
      one_hot = one_hot && *std::max_element(w, w + c.Lk) == 1.0;
    }
    if (one_hot && magnitude >= 1e4f) tol = 2e-5;
    EXPECT_EQ(one_hot, magnitude >= 1e4f) << magnitude;
    h.expect_matches_reference(tol);
  }
}

TEST(SdpaForward, DeterministicAndInputsUntouched) {
  Case c;
  c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = 19, c.Lk = 67, c.E = 24, c.Ev = 20;
  c.mask_kind = MaskKind::kFloat, c.mask_dims = {19, 67}, c.mask_block_fraction = 0.2;
  Harness h(c);
  const auto q = h.q, k = h.k, v = h.v, mask = h.mask_f;
  ASSERT_EQ(h.run(), Status::kOk);
  const auto first_out = h.out, first_w = h.weights;
  ASSERT_EQ(h.run(), Status::kOk);
  EXPECT_EQ(0, std::memcmp(first_out.data(), h.out.data(), first_out.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(first_w.data(), h.weights.data(), first_w.size() * sizeof(float)));
  EXPECT_EQ(q, h.q);
  EXPECT_EQ(k, h.k);
  EXPECT_EQ(v, h.v);
  EXPECT_EQ(0, std::memcmp(mask.data(), h.mask_f.data(), mask.size() * sizeof(float)));
}

TEST(SdpaForward, DecodeReadsKeysInPlaceAndSplitsThemIntoSegments) {
  // At most kDecodeMaxRowTiles row tiles per KV head: K/V are read in place, and the keys
  // are split into 512-key segments merged afterwards. Cover one and several
  // segments, a segment edge (511..513), GQA groups filling 1..8 rows (scored in place two
  // rows at a time, then the odd one) and up to 32 rows (8 row tiles, the last one partial
  // with 14 heads), a head dim that is not whole vectors, and everything that blocks keys.
  uint32_t seed = 500;
  for (int lk : {1, 31, 511, 512, 513, 1100, 2053})
    for (auto hh : {std::pair<int, int>{1, 1}, {4, 1}, {6, 2}, {8, 1}, {3, 1}, {14, 1}, {16, 1}})
      for (int lq : {1, 2}) {
        Case c;
        c.B = 2, c.Hq = hh.first, c.Hkv = hh.second, c.Lq = lq, c.Lk = lk, c.Ev = 13;
        c.E = lq == 1 ? 20 : 7;
        c.weights = false, c.seed = seed++;
        check(c);
        c.causal = true, c.offsets = {lk - lq - 600, lk - lq};  // batch 0 sees fewer keys
        c.key_lengths = {lk, lk / 2};
        check(c);
        c.mask_kind = MaskKind::kFloat, c.mask_dims = {c.B, 1, lq, lk}, c.mask_block_fraction = 0.5;
        c.bshd = true, c.softcap = 3.0f;
        check(c);
      }
  // Every key of a row blocked in every segment: zeros, as with a single pass.
  Case c;
  c.Lq = 1, c.Lk = 1500, c.causal = true, c.offsets = {-1}, c.weights = false;
  Harness h(c);
  ASSERT_EQ(h.run(), Status::kOk);
  for (int e = 0; e < c.Ev; e++) EXPECT_PRED1(test::is_plus_zero, h.output_at(0, 0, 0, e));
}

TEST(SdpaForward, DecodeWeightsLeaveTheOutputBitsUnchanged) {
  // Split-K decode with weights: the segments are merged first, then a pass over the same
  // segments writes each key's weight from its row's final (m, l). The output (and the
  // log-sum-exp) must have the bits of the same call without weights; the weights must match
  // the reference (a row's weights sum to 1 within it), be zero for blocked keys and empty
  // rows, and be the same bits for any thread count.
  uint32_t seed = 5000;
  for (int lk : {511, 512, 513, 1100, 2053})
    for (auto hh : {std::pair<int, int>{1, 1}, {4, 1}, {6, 2}, {14, 1}})
      for (int lq : {1, 2})
        for (int variant = 0; variant < 4; variant++) {
          Case c;
          c.B = 2, c.Hq = hh.first, c.Hkv = hh.second, c.Lq = lq, c.Lk = lk, c.E = 20, c.Ev = 13, c.seed = seed++;
          // Sinks: the merge's final (M, L) are what the weights pass divides by.
          if (variant == 3) c.sinks = cycling_sinks(c.Hq), c.causal = true, c.offsets = {lk - lq - 600, -1};
          if (variant == 1) c.causal = true, c.offsets = {lk - lq - 600, lk - lq}, c.key_lengths = {lk, lk / 2};
          if (variant == 2) {
            c.mask_kind = MaskKind::kFloat, c.mask_dims = {c.B, 1, lq, lk}, c.mask_block_fraction = 0.5;
            c.bshd = true, c.softcap = 3.0f;
          }
          Harness with_weights(c);
          ASSERT_TRUE(reads_keys_in_place(with_weights.p)) << c.describe();
          Problem sized_without_addresses = with_weights.p;  // as the bindings' callers size it
          sized_without_addresses.weights = nullptr;
          EXPECT_EQ(scratch_floats(sized_without_addresses, 3), scratch_floats(with_weights.p, 3)) << c.describe();
          std::vector<float> lse_with(size_t(c.B) * c.Hq * c.Lq, kNaN), lse_without = lse_with;
          with_weights.p.logsumexp = lse_with.data();
          ASSERT_EQ(with_weights.run(), Status::kOk) << c.describe();
          with_weights.expect_matches_reference();
          Case no_weights_case = c;
          no_weights_case.weights = false;
          Harness without(no_weights_case);
          without.p.logsumexp = lse_without.data();
          ASSERT_EQ(without.run(), Status::kOk) << c.describe();
          EXPECT_EQ(0, std::memcmp(without.out.data(), with_weights.out.data(), without.out.size() * sizeof(float)))
              << c.describe();
          EXPECT_EQ(0, std::memcmp(lse_without.data(), lse_with.data(), lse_with.size() * sizeof(float)))
              << c.describe();
        }
  // Threads: problems above the size under which forward() stays on the calling thread (4e6
  // multiply-adds, src/sdpa.cc), so the pairs (each: its segments, merge, weights) run on the
  // pool's threads.
  for (int variant = 0; variant < 4; variant++) {
    Case c;
    c.B = 2, c.Hq = 8, c.Hkv = 2, c.Lq = 1, c.Lk = 5000, c.E = 64, c.Ev = 64, c.seed = seed++;
    if (variant == 3) c.sinks = cycling_sinks(c.Hq);
    if (variant == 1) c.causal = true, c.offsets = {-1, 4000}, c.key_lengths = {5000, 2100};
    if (variant == 2) c.mask_kind = MaskKind::kBool, c.mask_dims = {c.B, c.Hq, 1, c.Lk}, c.mask_block_fraction = 0.5;
    ASSERT_GT(double(c.B) * c.Hq * c.Lq * c.Lk * (c.E + c.Ev), 4e6);
    Harness single(c);
    ASSERT_EQ(single.run(), Status::kOk) << c.describe();
    single.expect_matches_reference();
    Case no_weights_case = c;
    no_weights_case.weights = false;
    Harness without(no_weights_case);
    ASSERT_EQ(without.run(), Status::kOk) << c.describe();
    EXPECT_EQ(0, std::memcmp(without.out.data(), single.out.data(), single.out.size() * sizeof(float))) << c.describe();
    for (int threads : {2, 3}) {
      ThreadPool pool(threads);
      Harness threaded(c);
      std::vector<float> scratch(scratch_floats(threaded.p, threads));
      ASSERT_EQ(forward(threaded.p, scratch.data(), scratch.size(), &pool), Status::kOk) << c.describe();
      EXPECT_EQ(0, std::memcmp(threaded.out.data(), single.out.data(), single.out.size() * sizeof(float)))
          << c.describe() << " threads " << threads;
      EXPECT_EQ(0, std::memcmp(threaded.weights.data(), single.weights.data(), single.weights.size() * sizeof(float)))
          << c.describe() << " threads " << threads;
    }
  }
  // A row whose every key is blocked in every segment: zero output and zero weights.
  Case c;
  c.Lq = 1, c.Lk = 1500, c.causal = true, c.offsets = {-1};
  Harness h(c);
  ASSERT_EQ(h.run(), Status::kOk);
  for (int e = 0; e < c.Ev; e++) EXPECT_PRED1(test::is_plus_zero, h.output_at(0, 0, 0, e));
  for (float w : h.weights) EXPECT_PRED1(test::is_plus_zero, w);
}

// Runs h.p as a streamed decode (test::run_streamed).
std::vector<float> run_streamed(const Harness& h) { return test::run_streamed(h.p, h.k, h.v, h.out.size()); }

TEST(SdpaForward, StreamedSegmentsMatchForwardBitwise) {
  // The streamed decode (sdpa.h: forward_segment, merge_segments) computes forward()'s own
  // split-K segments from K/V copies of each segment alone: the same bits, for one and
  // several segments, segment edges, GQA groups of 1..32 rows (up to kDecodeMaxRowTiles row
  // tiles), and everything that blocks keys.
  uint32_t seed = 700;
  for (int lk : {1, 511, 512, 513, 1100, 2053})
    for (int group : {1, 4, 8, 14, 16})
      for (int lq : {1, 2, 3}) {
        if (group * lq > kDecodeMaxRowTiles * kQueryTile) continue;  // packed: not the decode path
        Case c;
        c.Hq = group, c.Lq = lq, c.Lk = lk, c.E = 20, c.Ev = 13, c.weights = false, c.seed = seed++;
        for (int variant = 0; variant < 4; variant++) {
          if (variant == 1) c.causal = true, c.offsets = {lk - lq - 300}, c.key_lengths = {lk - lk / 3};
          if (variant == 3) c.sinks = cycling_sinks(group);  // with variant 2's options
          if (variant == 2) {
            c.mask_kind = MaskKind::kBool, c.mask_dims = {1, group, lq, lk}, c.mask_block_fraction = 0.5;
            c.bshd = true, c.softcap = 3.0f;
          }
          Harness h(c);
          ASSERT_TRUE(reads_keys_in_place(h.p)) << c.describe();
          ASSERT_EQ(h.run(), Status::kOk);
          h.expect_matches_reference();
          const std::vector<float> streamed = run_streamed(h);
          EXPECT_EQ(0, std::memcmp(streamed.data(), h.out.data(), h.out.size() * sizeof(float))) << c.describe();
        }
      }
}

TEST(SdpaForward, SegmentCallsRejectWhatTheyCannotDo) {
  Case c;
  c.Hq = 4, c.Lk = 1100, c.weights = false;
  Harness h(c);
  std::vector<float> partials(segment_partials_floats(h.p));
  std::vector<float> scratch(segment_scratch_floats(h.p));
  auto segment = [&](const Problem& p, int s) {
    return forward_segment(p, s, partials.data(), scratch.data(), scratch.size());
  };
  EXPECT_EQ(segment_count(h.p), 3);
  EXPECT_EQ(segment(h.p, 2), Status::kOk);
  EXPECT_EQ(segment(h.p, -1), Status::kBadSegment);
  EXPECT_EQ(segment(h.p, 3), Status::kBadSegment);
  EXPECT_EQ(forward_segment(h.p, 0, nullptr, scratch.data(), scratch.size()), Status::kBadSegment);
  EXPECT_EQ(forward_segment(h.p, 0, partials.data(), scratch.data(), scratch.size() - 1), Status::kBadScratch);
  EXPECT_EQ(merge_segments(h.p, nullptr), Status::kBadSegment);
  Problem p = h.p;
  p.batch = 2;  // more than one (batch, KV head)
  EXPECT_EQ(segment(p, 0), Status::kBadSegment);
  EXPECT_EQ(merge_segments(p, partials.data()), Status::kBadSegment);
  p = h.p;
  std::vector<float> weights(size_t(c.Hq) * c.Lk);
  p.weights = weights.data();  // the streamed calls write no weights
  EXPECT_EQ(segment(p, 0), Status::kBadSegment);
  p = h.p;
  p.q_len = kDecodeMaxRowTiles + 1;  // 4 heads: more row tiles than a decode reads in place
  EXPECT_EQ(segment(p, 0), Status::kBadSegment);
  p = h.p;
  p.head_dim = 0;  // validate() runs first
  EXPECT_EQ(segment(p, 0), Status::kBadShape);
}

// Found by the fuzzer (tests/fuzz/sdpa-fuzz.cc; the inputs are in tests/fuzz/corpus/sdpa/).

TEST(SdpaForward, SoftcapTooSmallToInvertStillFollowsTheContract) {
  // softcap = 2^-149: 1/softcap overflows float32, and a zero score (scale 0) times that
  // Inf was NaN. The contract's softcap·tanh(s / softcap) is 0 for s = 0.
  for (float scale : {0.0f, 1.0f}) {
    Case c;
    c.Lq = 5, c.Lk = 19, c.E = 9, c.Ev = 8, c.softcap = 0x1p-149f, c.scale = scale;
    check(c);
  }
}

TEST(SdpaForward, NanScoresPoisonTheRowOnEveryPath) {
  // A NaN in a query row makes every score of the row NaN: the row's output is NaN, on the
  // direct path and through split-K. The split-K merge used to read the segments' maxima
  // only, which never take a NaN (pmax keeps -inf), so it took the row for one that attends
  // nothing and wrote zeros.
  for (int lk : {100, 1100}) {
    Case c;
    c.Hq = 2, c.Lq = 1, c.Lk = lk, c.E = 8, c.Ev = 8, c.weights = false;
    Harness h(c);
    h.q[3] = kNaN;  // head 0's only row
    ASSERT_EQ(h.run(), Status::kOk);
    const std::vector<float> streamed = run_streamed(h);
    for (int e = 0; e < c.Ev; e++) {
      EXPECT_TRUE(std::isnan(h.output_at(0, 0, 0, e))) << "Lk " << lk << " col " << e;
      EXPECT_TRUE(std::isnan(streamed[size_t(e)])) << "streamed, Lk " << lk << " col " << e;
      EXPECT_TRUE(std::isfinite(h.output_at(0, 1, 0, e))) << "head 1 has no NaN";
    }
  }
}

TEST(SdpaForward, RowsWhoseScoresAreAllMinusInfAreExactZeros) {
  // Every score -inf through the data (q·k = -inf: an infinite key), not through blocking,
  // and a NaN in V: the row has no softmax, so exact zeros (src/sdpa.h). The direct path
  // wrote o·0 with o = 0·NaN = NaN from P·V's unconditional columns; split-K wrote zeros.
  for (int lq : {1, 9})
    for (int lk : {20, 1100}) {
      Case c;
      c.Lq = lq, c.Lk = lk, c.E = 4, c.Ev = 8, c.weights = lq == 9;
      Harness h(c);
      for (float& q : h.q) q = 1.0f;
      for (int j = 0; j < lk; j++) h.key_at(0, 0, j, 0) = -kInf;
      h.value_at(0, 0, 1, 3) = kNaN;
      ASSERT_EQ(h.run(), Status::kOk);
      for (int i = 0; i < lq; i++)
        for (int e = 0; e < c.Ev; e++) EXPECT_PRED1(test::is_plus_zero, h.output_at(0, 0, i, e)) << c.describe() << " row " << i;
      for (float w : h.weights) EXPECT_PRED1(test::is_plus_zero, w) << c.describe();
      if (lq == 1) {
        const std::vector<float> streamed = run_streamed(h);
        for (float o : streamed) EXPECT_PRED1(test::is_plus_zero, o) << "streamed " << c.describe();
      }
    }
}

TEST(SdpaForward, StreamedSegmentKeepsTheSignOfZero) {
  // One segment: forward() writes o / l directly, the streamed path merges its one partial
  // and must give the same bits, signed zeros included. Here the output is -0: three equal
  // scores (p = 1 each, l = 3), o = -2^-149 (the least subnormal, from key 0; the other V
  // rows are -0), and o·(1/3) rounds to -0. (A segment is one key tile, so o itself is never
  // -0: it starts at +0, and +0 + -0 = +0.)
  Case c;
  c.Lq = 1, c.Lk = 3, c.E = 1, c.Ev = 1, c.scale = 1.0f, c.weights = false;
  Harness h(c);
  h.q[0] = 1.0f;
  for (int j = 0; j < c.Lk; j++) h.key_at(0, 0, j, 0) = 0.0f;
  for (int j = 0; j < c.Lk; j++) h.value_at(0, 0, j, 0) = j == 0 ? -std::numeric_limits<float>::denorm_min() : -0.0f;
  ASSERT_EQ(h.run(), Status::kOk);
  EXPECT_TRUE(h.output_at(0, 0, 0, 0) == 0.0f && std::signbit(h.output_at(0, 0, 0, 0))) << h.output_at(0, 0, 0, 0);
  const std::vector<float> streamed = run_streamed(h);
  EXPECT_EQ(0, std::memcmp(streamed.data(), h.out.data(), h.out.size() * sizeof(float)))
      << "streamed " << streamed[0] << " forward " << h.out[0];
}

TEST(SdpaForward, ValidateBoundsSizesByTheKernelsThirtyTwoBitCounts) {
  // With every stride 0 a few floats describe any size. Up to kMaxCount / kMaxHeadDim the
  // planning arithmetic must not overflow (UBSan in this build); past them validate() says
  // kBadShape. (Hq·Lq = 2^32 overflowed the flat row count; with a first bound of 2^30, the
  // fuzzer's probe of the largest accepted sizes found "rows + block_rows - 1" overflowing.)
  float x[1] = {0.0f};
  Problem p;
  p.query = x, p.key = x, p.value = x, p.output = x, p.scale = 1.0f;
  auto reset = [&] { p.batch = p.q_heads = p.kv_heads = p.q_len = p.kv_len = p.head_dim = p.value_dim = 1; };
  reset();
  p.q_len = kMaxCount;
  EXPECT_EQ(validate(p), Status::kOk);
  for (int threads : {1, 2, 64}) EXPECT_GT(scratch_floats(p, threads), 0u);
  p.q_len = kMaxCount + 1;
  EXPECT_EQ(validate(p), Status::kBadShape);
  reset();
  p.q_heads = 65536, p.q_len = 65536;  // (Hq/Hkv)·Lq = 2^32
  EXPECT_EQ(validate(p), Status::kBadShape);
  reset();
  p.kv_len = kMaxCount, p.batch = kMaxCount / segment_count(p);
  EXPECT_EQ(validate(p), Status::kOk);
  EXPECT_GT(scratch_floats(p, 2), 0u);
  EXPECT_GT(segment_partials_floats(p), 0u);
  p.batch += 1;
  EXPECT_EQ(validate(p), Status::kBadShape);
  reset();
  p.head_dim = p.value_dim = kMaxHeadDim;
  EXPECT_EQ(validate(p), Status::kOk);
  EXPECT_GT(scratch_floats(p), 0u);
  p.value_dim = kMaxHeadDim + 1;
  EXPECT_EQ(validate(p), Status::kBadShape);
}

TEST(SdpaForward, ThreadsGiveBitwiseIdenticalResults) {
  // Splits by (batch, KV head, block of query rows) only regroup whole rows, so any thread
  // count must reproduce the single-threaded bits exactly; and match the reference. Every
  // case is above the size under which forward() stays on the calling thread.
  const Case cases[] = {
      [] { Case c; c.B = 2, c.Hq = 6, c.Hkv = 2, c.Lq = 200, c.Lk = 97, c.E = 16, c.Ev = 9; return c; }(),
      [] { Case c; c.Lq = 701, c.Lk = 701, c.E = 8, c.Ev = 8, c.causal = true, c.offsets = {0}; return c; }(),
      [] { Case c; c.Hq = 8, c.Hkv = 2, c.Lq = 1, c.Lk = 8000, c.E = 64, c.Ev = 64, c.weights = false; return c; }(),
      [] { Case c; c.B = 3, c.Lq = 200, c.Lk = 300, c.E = 16, c.Ev = 16, c.causal = true, c.offsets = {-5}, c.key_lengths = {300, 0, 170};
           c.mask_kind = MaskKind::kBool, c.mask_dims = {200, 300}, c.mask_block_fraction = 0.3; return c; }(),
      [] { Case c; c.Lq = 900, c.Lk = 1400, c.E = 8, c.Ev = 8, c.causal = true, c.offsets = {500}, c.window = 300; return c; }(),
      [] { Case c; c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = 1, c.Lk = 5000, c.E = 64, c.Ev = 64, c.weights = false;
           c.key_starts = {1300, 0}, c.key_lengths = {5000, 4000}; return c; }(),
      [] { Case c; c.Hq = 8, c.Hkv = 2, c.Lq = 1, c.Lk = 8000, c.E = 64, c.Ev = 64, c.weights = false;
           c.causal = true, c.offsets = {7999}, c.window = 1500; return c; }(),
      [] { Case c; c.B = 2, c.Hq = 6, c.Hkv = 2, c.Lq = 200, c.Lk = 300, c.E = 16, c.Ev = 9, c.causal = true,
           c.offsets = {-3}, c.sinks = cycling_sinks(6); return c; }(),
      [] { Case c; c.Hq = 8, c.Hkv = 2, c.Lq = 1, c.Lk = 8000, c.E = 64, c.Ev = 64, c.sinks = cycling_sinks(8); return c; }(),
  };
  for (const Case& c : cases) {
    Harness single(c);
    ASSERT_EQ(single.run(), Status::kOk);
    single.expect_matches_reference();
    for (int threads : {2, 3, 5}) {
      ThreadPool pool(threads);
      Harness h(c);
      std::vector<float> scratch(scratch_floats(h.p, threads));
      for (int repeat = 0; repeat < 2; repeat++) {  // the pool is reused across calls
        ASSERT_EQ(forward(h.p, scratch.data(), scratch.size(), &pool), Status::kOk);
        EXPECT_EQ(0, std::memcmp(single.out.data(), h.out.data(), h.out.size() * sizeof(float)))
            << c.describe() << " threads " << threads;
        EXPECT_EQ(single.weights, h.weights) << c.describe() << " threads " << threads;
      }
      std::vector<float> too_small(scratch_floats(h.p, threads) - 1);
      EXPECT_EQ(forward(h.p, too_small.data(), too_small.size(), &pool), Status::kBadScratch);
    }
  }
}

TEST(SdpaForward, RowTileBlocksAroundTheirEdges) {
  // A prefill's row tiles go in blocks of kRowTileBlock that take each key tile in turn
  // (src/tiles.h), and on several threads with no more (batch, KV head) pairs than threads each
  // pair is packed once for all of its row blocks (src/sdpa.cc). Flat rows just past the
  // in-place path's and around one and two whole blocks; keys over three key tiles; causal
  // offsets that end the row tiles of one block in different key tiles, a window, GQA whose
  // heads share a block; weights. Each against the reference, and bitwise on 2 and 3 threads.
  constexpr int kBlockRows = kRowTileBlock * kQueryTile;
  const int packed_rows = kDecodeMaxRowTiles * kQueryTile + 1;  // the first count that packs K/V
  const int lk = 2 * kKeyTile + 37;
  std::vector<Case> cases;
  uint32_t seed = 900;
  for (int lq : {packed_rows, kBlockRows + 1, 2 * kBlockRows - 1, 2 * kBlockRows, 2 * kBlockRows + 1}) {
    for (int variant = 0; variant < 3; variant++) {
      Case c;
      c.Lq = lq, c.Lk = lk, c.E = 32, c.Ev = 32, c.seed = seed++;
      if (variant >= 1) c.causal = true, c.offsets = {kKeyTile - kBlockRows / 2};  // a block's rows end in two key tiles
      if (variant == 2) c.window = kKeyTile / 2 + 3, c.offsets = {lk - lq};
      cases.push_back(c);
    }
  }
  {
    Case c;  // 4 query heads of 17 rows on one KV head: tiles and blocks straddle the heads
    c.Hq = 4, c.Hkv = 1, c.Lq = 17, c.Lk = lk, c.E = 40, c.Ev = 24, c.causal = true, c.offsets = {kKeyTile - 9};
    c.seed = seed++;
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    Harness single(c);
    ASSERT_EQ(single.run(), Status::kOk) << c.describe();
    single.expect_matches_reference();
    for (int threads : {2, 3}) {
      ThreadPool pool(threads);
      Harness h(c);
      std::vector<float> scratch(scratch_floats(h.p, threads));
      ASSERT_EQ(forward(h.p, scratch.data(), scratch.size(), &pool), Status::kOk);
      EXPECT_EQ(0, std::memcmp(single.out.data(), h.out.data(), h.out.size() * sizeof(float)))
          << c.describe() << " threads " << threads;
      EXPECT_EQ(single.weights, h.weights) << c.describe() << " threads " << threads;
    }
  }
}

// A whole call of the slice tests below (query heads, rows): a Case and how its K/V are stored
// and read, and its dropout.
struct SliceCase {
  Case c;
  bool read_kv_in_order = false;
  uint32_t dropout_threshold = 0;
  bool halves = false;  // K/V as float16 (rounded first: the reference runs on their values)
};
constexpr uint32_t kDropHalf = 1u << 31;

// A SliceCase's whole call, set up (K/V as halves if asked, its log-sum-exp in `lse`); run() it,
// then every slice must give its bits.
struct WholeCall {
  Harness whole;
  std::vector<uint16_t> key_halves, value_halves;
  std::vector<float> lse;

  WholeCall(const SliceCase& sc, uint32_t dropout_seed) : whole(sc.c) {
    if (sc.halves) {
      for (float& x : whole.k) key_halves.push_back(f32_to_f16(x)), x = f16_to_f32(key_halves.back());
      for (float& x : whole.v) value_halves.push_back(f32_to_f16(x)), x = f16_to_f32(value_halves.back());
      whole.p.kv_type = KvType::kFloat16, whole.p.key = key_halves.data(), whole.p.value = value_halves.data();
    }
    lse.assign(size_t(sc.c.B) * sc.c.Hq * sc.c.Lq, kNaN);
    whole.p.logsumexp = lse.data();
    whole.p.read_kv_in_order = sc.read_kv_in_order;
    whole.p.dropout_threshold = sc.dropout_threshold, whole.p.dropout_seed = dropout_seed;
  }
};

// Query heads [first, first + count) of KV head kvh's group in batch b of p, as a
// problem of their own (what query_heads_keep_bits() speaks of): batch 1, count query heads, one
// KV head, every pointer moved to its first (batch, head), the strides kept; the dropout bases
// place it in the whole call. Its output, weights and log-sum-exp go to the harness's arrays
// out, weights and lse (the whole call's shapes), where the whole call's would be.
Problem query_head_slice(const Problem& p, int b, int kvh, int first, int count, float* out, float* weights,
                         float* lse) {
  const int group = p.q_heads / p.kv_heads, h0 = kvh * group + first;
  const int64_t rows = (int64_t(b) * p.q_heads + h0) * p.q_len;  // the dense weights' and lse's
  const int64_t element_bytes = is_half(p.kv_type) ? 2 : 4;
  Problem s = p;
  s.batch = 1, s.q_heads = count, s.kv_heads = 1;
  s.query = p.query + b * p.q_stride_b + h0 * p.q_stride_h;
  s.key = static_cast<const char*>(p.key) + element_bytes * (b * p.k_stride_b + kvh * p.k_stride_h);
  s.value = static_cast<const char*>(p.value) + element_bytes * (b * p.v_stride_b + kvh * p.v_stride_h);
  s.output = out + b * p.o_stride_b + h0 * p.o_stride_h;
  s.weights = p.weights == nullptr ? nullptr : weights + rows * p.kv_len;
  s.logsumexp = p.logsumexp == nullptr ? nullptr : lse + rows;
  const int64_t mask_at = b * p.mask_stride_b + h0 * p.mask_stride_h;
  if (p.mask_kind == MaskKind::kFloat) s.mask = static_cast<const float*>(p.mask) + mask_at;
  if (p.mask_kind == MaskKind::kBool) s.mask = static_cast<const uint8_t*>(p.mask) + mask_at;
  if (p.causal_offsets != nullptr) s.causal_offsets = p.causal_offsets + b;
  if (p.key_lengths != nullptr) s.key_lengths = p.key_lengths + b;
  if (p.key_starts != nullptr) s.key_starts = p.key_starts + b;
  if (p.sinks != nullptr) s.sinks = p.sinks + h0;
  if (p.alibi_slopes != nullptr) s.alibi_slopes = p.alibi_slopes + b * p.alibi_stride_b + h0;
  s.dropout_batch_base = p.dropout_batch_base + b, s.dropout_head_base = p.dropout_head_base + h0;
  return s;
}

TEST(SdpaForward, QueryHeadSlicesThatKeepTheTilesGiveTheWholeCallsBits) {
  // query_heads_keep_bits() is what lets a call too large for its memory run a few query heads
  // at a time (js/slices.ts). Every slice it accepts, each run alone on 1 and 2 threads, must
  // write the bits of the whole call (output, weights, log-sum-exp), on the packed path and in
  // place (K/V copied or read in order, float32 or float16), with every option, and the whole
  // call must match the reference; the slices it refuses change the path, split a row tile or
  // read a KV cache's float16 keys in another order.
  const SliceCase cases[] = {
      // Multi-query prefill: 37 rows per head (tiles shared by two heads), causal, per-head sinks.
      {[] { Case c; c.Hq = 8, c.Lq = 37, c.Lk = 300, c.E = 16, c.Ev = 9, c.causal = true, c.offsets = {263};
            c.sinks = cycling_sinks(8); return c; }()},
      // Prefill, a float mask [Hq, Lq, Lk] with blocked entries, ALiBi [Hq], softcap, dropout.
      {[] { Case c; c.Hq = 6, c.Lq = 18, c.Lk = 530, c.E = 8, c.Ev = 8, c.mask_kind = MaskKind::kFloat;
            c.mask_dims = {6, 18, 530}, c.mask_block_fraction = 0.4, c.alibi_slopes = test::geometric_slopes(6);
            c.softcap = 3.0f; return c; }(), false, kDropHalf},
      // Prefill of two batches and two KV heads (GQA), bshd, a bool mask [B, 1, Lq, Lk], window.
      {[] { Case c; c.B = 2, c.Hq = 10, c.Hkv = 2, c.Lq = 13, c.Lk = 700, c.E = 12, c.Ev = 5, c.bshd = true;
            c.causal = true, c.offsets = {600, 650}, c.window = 200, c.mask_kind = MaskKind::kBool;
            c.mask_dims = {2, 1, 13, 700}, c.mask_block_fraction = 0.2; return c; }()},
      // Decode in place (32 rows per KV head): 8 heads of 4 rows, causal, key starts and lengths.
      {[] { Case c; c.Hq = 8, c.Lq = 4, c.Lk = 1500, c.E = 16, c.Ev = 16, c.causal = true, c.offsets = {1496};
            c.key_starts = {40}, c.key_lengths = {1400}; return c; }()},
      // Decode read in order (a KV cache's), 7 rows per head (tiles shared by heads), per-batch ALiBi.
      {[] { Case c; c.B = 2, c.Hq = 4, c.Lq = 7, c.Lk = 1100, c.E = 16, c.Ev = 16, c.causal = true,
            c.offsets = {1093, 900}, c.alibi_slopes = test::per_batch_slopes(2, 4); return c; }(), true},
      // One token, 12 query heads on one KV head, read in order, sinks and dropout.
      {[] { Case c; c.Hq = 12, c.Lq = 1, c.Lk = 2100, c.E = 32, c.Ev = 32, c.sinks = cycling_sinks(12);
            return c; }(), true, kDropHalf},
      // A float16 cache's decode, one token, 8 and 5 query heads on one KV head and 2 tokens of 6
      // heads, past a whole group of 4 key tiles: a head alone (one row) would be read
      // interleaved, so only slices of more rows keep the bits (none of 5 heads: 4 + 1).
      {[] { Case c; c.Hq = 8, c.Lq = 1, c.Lk = 4500, c.E = 16, c.Ev = 16; return c; }(), true, 0, true},
      {[] { Case c; c.Hq = 5, c.Lq = 1, c.Lk = 4500, c.E = 16, c.Ev = 16; return c; }(), true, 0, true},
      {[] { Case c; c.Hq = 6, c.Lq = 2, c.Lk = 2600, c.E = 16, c.Ev = 16, c.causal = true, c.offsets = {2598};
            return c; }(), true, 0, true},
  };
  int accepted = 0;
  for (const SliceCase& sc : cases) {
    WholeCall call(sc, 77);
    Harness& whole = call.whole;
    const std::vector<float>& lse = call.lse;
    ASSERT_EQ(whole.run(), Status::kOk) << sc.c.describe();
    if (sc.dropout_threshold == 0) whole.expect_matches_reference();
    const int group = sc.c.Hq / sc.c.Hkv;
    for (int count = 1; count < group; count++) {
      for (int first = 0; first + count <= group; first += count) {
        if (!query_heads_keep_bits(whole.p, first, count)) continue;
        accepted++;
        for (int threads : {1, 2}) {
          ThreadPool pool(threads);
          Harness sliced(sc.c);
          std::vector<float> sliced_lse(lse.size(), kNaN);
          for (int b = 0; b < sc.c.B; b++) {
            for (int kvh = 0; kvh < sc.c.Hkv; kvh++) {
              const Problem s = query_head_slice(whole.p, b, kvh, first, count, sliced.out.data(),
                                                 sliced.weights.data(), sliced_lse.data());
              std::vector<float> scratch(scratch_floats(s, threads));
              ASSERT_EQ(forward(s, scratch.data(), scratch.size(), threads > 1 ? &pool : nullptr), Status::kOk);
            }
          }
          // Only the slice's heads were written: the rest stay NaN in `sliced`.
          for (int b = 0; b < sc.c.B; b++)
            for (int h = 0; h < sc.c.Hq; h++)
              for (int i = 0; i < sc.c.Lq; i++)
                for (int e = 0; e < sc.c.Ev; e++) {
                  const bool in_slice = h % group >= first && h % group < first + count;
                  const float got = sliced.output_at(b, h, i, e), want = whole.output_at(b, h, i, e);
                  ASSERT_TRUE(in_slice ? std::memcmp(&got, &want, sizeof got) == 0 : std::isnan(got))
                      << sc.c.describe() << " heads [" << first << ", " << first + count << ") threads " << threads
                      << " output[" << b << "," << h << "," << i << "," << e << "] " << got << " whole " << want;
                }
          for (size_t n = 0; n < lse.size(); n++) {
            const int h = int(n / size_t(sc.c.Lq) % size_t(sc.c.Hq));
            if (h % group < first || h % group >= first + count) continue;
            ASSERT_EQ(0, std::memcmp(&sliced_lse[n], &lse[n], sizeof(float))) << sc.c.describe() << " lse[" << n << "]";
            ASSERT_EQ(0, std::memcmp(&sliced.weights[n * size_t(sc.c.Lk)], &whole.weights[n * size_t(sc.c.Lk)],
                                     size_t(sc.c.Lk) * sizeof(float)))
                << sc.c.describe() << " weights of row " << n;
          }
        }
      }
    }
  }
  EXPECT_GE(accepted, 20);  // the cases above give that many slices to check

  // The rule itself. Prefill of 8 heads × 37 rows (296 per KV head): slices of 4 heads keep
  // every tile (148 rows), of 1 or 2 heads they split one (37, 74); the last slice may end
  // at the group's end.
  Harness prefill([] { Case c; c.Hq = 8, c.Lq = 37, c.Lk = 300; return c; }());
  EXPECT_TRUE(query_heads_keep_bits(prefill.p, 0, 4));
  EXPECT_TRUE(query_heads_keep_bits(prefill.p, 4, 4));
  EXPECT_FALSE(query_heads_keep_bits(prefill.p, 0, 1));
  EXPECT_FALSE(query_heads_keep_bits(prefill.p, 2, 2));
  EXPECT_TRUE(query_heads_keep_bits(prefill.p, 0, 8));
  EXPECT_FALSE(query_heads_keep_bits(prefill.p, 4, 5));  // past the group
  EXPECT_FALSE(query_heads_keep_bits(prefill.p, -4, 4));
  EXPECT_FALSE(query_heads_keep_bits(prefill.p, 0, 0));
  // Prefill of 8 heads × 8 rows (64 rows): 4 heads are 32 rows, the decode path; 5 are not.
  Harness short_prefill([] { Case c; c.Hq = 8, c.Lq = 8, c.Lk = 300; return c; }());
  ASSERT_FALSE(reads_keys_in_place(short_prefill.p));
  EXPECT_FALSE(query_heads_keep_bits(short_prefill.p, 0, 4));
  EXPECT_TRUE(query_heads_keep_bits(short_prefill.p, 0, 5));
  EXPECT_FALSE(query_heads_keep_bits(short_prefill.p, 5, 3));  // 24 rows: the decode path
  // Decode of 4 heads × 7 rows (28 rows, in place): a head alone splits a tile, and so do two.
  Harness decode([] { Case c; c.Hq = 4, c.Lq = 7, c.Lk = 300; return c; }());
  ASSERT_TRUE(reads_keys_in_place(decode.p));
  EXPECT_FALSE(query_heads_keep_bits(decode.p, 0, 1));
  EXPECT_FALSE(query_heads_keep_bits(decode.p, 0, 2));
  EXPECT_TRUE(query_heads_keep_bits(decode.p, 0, 4));
  // One token of 5 heads: the last head alone is a whole tile of its own (rows 4..4), but as a
  // problem of one row per KV head a float16 cache's keys would be read interleaved.
  Harness token([] { Case c; c.Hq = 5, c.Lq = 1, c.Lk = 300, c.E = 16, c.Ev = 16; return c; }());
  EXPECT_TRUE(query_heads_keep_bits(token.p, 0, 4));
  EXPECT_TRUE(query_heads_keep_bits(token.p, 4, 1));  // float32: read in order either way
  token.p.kv_type = KvType::kFloat16, token.p.read_kv_in_order = true;
  EXPECT_TRUE(query_heads_keep_bits(token.p, 0, 4));
  EXPECT_FALSE(query_heads_keep_bits(token.p, 4, 1));
  token.p.read_kv_in_order = false;  // (K/V copied in: never interleaved)
  EXPECT_TRUE(query_heads_keep_bits(token.p, 4, 1));
}

// Rows [r0, r0 + rows) of query head g of KV head kvh's group in batch b of p, as a problem of
// its own (what query_rows_keep_bits() speaks of): query_head_slice()'s one head, its pointers
// moved on to row r0, the batch's causal offset plus r0 (so that its rows keep their diagonal,
// causal frontier, window and ALiBi distances), and dropout_row_base r0.
Problem query_row_slice(const Problem& p, int b, int kvh, int g, int r0, int rows, float* out, float* weights,
                        float* lse) {
  Problem s = query_head_slice(p, b, kvh, g, 1, out, weights, lse);
  s.q_len = rows;
  s.query += r0 * p.q_stride_l;
  s.output += r0 * p.o_stride_l;
  if (s.weights != nullptr) s.weights += int64_t(r0) * p.kv_len;
  if (s.logsumexp != nullptr) s.logsumexp += r0;
  if (p.mask_kind == MaskKind::kFloat) s.mask = static_cast<const float*>(s.mask) + r0 * p.mask_stride_q;
  if (p.mask_kind == MaskKind::kBool) s.mask = static_cast<const uint8_t*>(s.mask) + r0 * p.mask_stride_q;
  s.causal_offset = (p.causal_offsets != nullptr ? p.causal_offsets[b] : p.causal_offset) + r0;
  s.causal_offsets = nullptr;
  s.dropout_row_base = p.dropout_row_base + r0;
  return s;
}

TEST(SdpaForward, QueryRowSlicesThatKeepTheTilesGiveTheWholeCallsBits) {
  // query_rows_keep_bits() is what lets a call whose single query head is too large for its
  // memory run a few rows at a time (js/slices.ts). For every row count it accepts, the slices
  // of every head, each run alone on 1 and 2 threads, must write the bits of the whole call
  // (output, weights, log-sum-exp), on the packed path and in place (float32 or float16 read in
  // order), with every option that depends on the row: causal offsets (one, per batch), a
  // window, ALiBi, dropout, masks with and without a row axis; the whole call must match the
  // reference.
  const SliceCase cases[] = {
      // One head of 150 rows per batch (packed), per-batch causal offsets (one not aligned with
      // the tiles), a window, per-batch ALiBi, dropout.
      {[] { Case c; c.B = 2, c.Lq = 150, c.Lk = 300, c.E = 16, c.Ev = 9, c.causal = true, c.offsets = {150, 7};
            c.window = 60, c.alibi_slopes = test::per_batch_slopes(2, 1); return c; }(), false, kDropHalf},
      // GQA prefill (2 query heads per KV head, 72 rows each), bshd, a float mask [Hq, Lq, Lk] with
      // blocked entries, softcap, sinks, ALiBi [Hq] without causal (offset 5).
      {[] { Case c; c.Hq = 4, c.Hkv = 2, c.Lq = 72, c.Lk = 530, c.E = 8, c.Ev = 12, c.bshd = true;
            c.mask_kind = MaskKind::kFloat, c.mask_dims = {4, 72, 530}, c.mask_block_fraction = 0.3;
            c.softcap = 4.0f, c.sinks = cycling_sinks(4), c.alibi_slopes = test::geometric_slopes(4);
            c.offsets = {5}; return c; }()},
      // A bool mask without a row axis [B, 1, 1, Lk], key starts and lengths, causal (one offset).
      {[] { Case c; c.B = 2, c.Hq = 2, c.Hkv = 2, c.Lq = 80, c.Lk = 700, c.E = 12, c.Ev = 5, c.causal = true;
            c.offsets = {620}, c.mask_kind = MaskKind::kBool, c.mask_dims = {2, 1, 1, 700}, c.mask_block_fraction = 0.2;
            c.key_starts = {3, 40}, c.key_lengths = {690, 500}; return c; }()},
      // In place (24 rows of one head), read in order from float16 halves, causal, dropout.
      {[] { Case c; c.Lq = 24, c.Lk = 1500, c.E = 16, c.Ev = 16, c.causal = true, c.offsets = {1476};
            return c; }(), true, kDropHalf, true},
      // In place, 2 query heads of 12 rows on one KV head, float32 read in order, ALiBi, causal.
      {[] { Case c; c.Hq = 2, c.Lq = 12, c.Lk = 2100, c.E = 32, c.Ev = 32, c.causal = true, c.offsets = {2088};
            c.alibi_slopes = test::geometric_slopes(2); return c; }(), true},
  };
  int accepted = 0;
  for (const SliceCase& rc : cases) {
    WholeCall call(rc, 91);
    Harness& whole = call.whole;
    const std::vector<float>& lse = call.lse;
    ASSERT_EQ(whole.run(), Status::kOk) << rc.c.describe();
    whole.expect_matches_reference();
    const int group = rc.c.Hq / rc.c.Hkv;
    for (int rows = 1; rows < rc.c.Lq; rows++) {
      if (!query_rows_keep_bits(whole.p, rows)) continue;
      accepted++;
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        Harness sliced(rc.c);
        std::vector<float> sliced_lse(lse.size(), kNaN);
        for (int b = 0; b < rc.c.B; b++)
          for (int kvh = 0; kvh < rc.c.Hkv; kvh++)
            for (int g = 0; g < group; g++)
              for (int r0 = 0; r0 < rc.c.Lq; r0 += rows) {
                const Problem s = query_row_slice(whole.p, b, kvh, g, r0, std::min(rows, rc.c.Lq - r0), sliced.out.data(),
                                                  sliced.weights.data(), sliced_lse.data());
                std::vector<float> scratch(scratch_floats(s, threads));
                ASSERT_EQ(forward(s, scratch.data(), scratch.size(), threads > 1 ? &pool : nullptr), Status::kOk);
              }
        // Every row is in one slice: all of the output, weights and log-sum-exp are the whole call's.
        for (size_t n = 0; n < whole.out.size(); n++) {
          ASSERT_EQ(0, std::memcmp(&sliced.out[n], &whole.out[n], sizeof(float)))
              << rc.c.describe() << " slices of " << rows << " rows, threads " << threads << " output element " << n
              << ": " << sliced.out[n] << " whole " << whole.out[n];
        }
        ASSERT_EQ(0, std::memcmp(sliced_lse.data(), lse.data(), lse.size() * sizeof(float)))
            << rc.c.describe() << " slices of " << rows << " rows: log-sum-exp";
        ASSERT_EQ(0, std::memcmp(sliced.weights.data(), whole.weights.data(), whole.weights.size() * sizeof(float)))
            << rc.c.describe() << " slices of " << rows << " rows: weights";
      }
    }
  }
  EXPECT_GE(accepted, 12);  // the cases above give that many row counts to check

  // The rule itself. One head of 150 rows (packed): slices of a multiple of 4 rows whose last
  // slice has more than 32 rows (the packed path) or none.
  Harness prefill([] { Case c; c.Lq = 150, c.Lk = 300; return c; }());
  ASSERT_FALSE(reads_keys_in_place(prefill.p));
  EXPECT_TRUE(query_rows_keep_bits(prefill.p, 100));   // 100 + 50
  EXPECT_TRUE(query_rows_keep_bits(prefill.p, 76));    // 76 + 74
  EXPECT_FALSE(query_rows_keep_bits(prefill.p, 75));   // splits a tile
  EXPECT_FALSE(query_rows_keep_bits(prefill.p, 40));   // 40·3 + 30: the last slice in place
  EXPECT_FALSE(query_rows_keep_bits(prefill.p, 32));   // in place
  EXPECT_FALSE(query_rows_keep_bits(prefill.p, 150));  // not a slice of rows
  EXPECT_FALSE(query_rows_keep_bits(prefill.p, 0));
  // Two query heads of 150 rows: head 1 starts at flat row 150, inside a tile.
  Harness gqa([] { Case c; c.Hq = 2, c.Lq = 150, c.Lk = 300; return c; }());
  EXPECT_FALSE(query_rows_keep_bits(gqa.p, 100));
  // ALiBi measures from the offset as given: a slice's offset + r0 must stay an int32.
  Harness alibi([] { Case c; c.Lq = 150, c.Lk = 300, c.alibi_slopes = test::geometric_slopes(1); return c; }());
  alibi.p.causal_offset = INT32_MAX - 149;
  EXPECT_TRUE(query_rows_keep_bits(alibi.p, 100));
  alibi.p.causal_offset = INT32_MAX - 148;
  EXPECT_FALSE(query_rows_keep_bits(alibi.p, 100));
  // A float16 cache's decode of 9 rows, read in order past a whole group of 4 key tiles: a last
  // slice of one row would read its keys interleaved; of 10 rows, the last slice has 2.
  Harness decode([] { Case c; c.Lq = 9, c.Lk = 4500, c.E = 16, c.Ev = 16; return c; }());
  decode.p.kv_type = KvType::kFloat16, decode.p.read_kv_in_order = true;
  ASSERT_TRUE(reads_keys_in_place(decode.p));
  EXPECT_FALSE(query_rows_keep_bits(decode.p, 4));
  EXPECT_FALSE(query_rows_keep_bits(decode.p, 8));
  decode.p.q_len = 10;
  EXPECT_TRUE(query_rows_keep_bits(decode.p, 4));
  EXPECT_TRUE(query_rows_keep_bits(decode.p, 8));
  decode.p.read_kv_in_order = false;  // (K/V copied in: never interleaved)
  decode.p.q_len = 9;
  EXPECT_TRUE(query_rows_keep_bits(decode.p, 4));
  // One row has no slice of rows.
  decode.p.q_len = 1;
  EXPECT_FALSE(query_rows_keep_bits(decode.p, 1));

  // least_query_rows() is the least count from its argument up that the rule takes.
  decode.p.q_len = 10, decode.p.read_kv_in_order = true;
  Harness in_place([] { Case c; c.Lq = 24, c.Lk = 300; return c; }());
  Harness long_head([] { Case c; c.Lq = 1000, c.Lk = 300; return c; }());
  for (const Problem* p : {&prefill.p, &gqa.p, &alibi.p, &decode.p, &in_place.p, &long_head.p}) {
    for (int at_least = 0; at_least <= p->q_len + 1; at_least++) {
      int want = 0;
      for (int rows = std::max(at_least, 1); rows < p->q_len && want == 0; rows++) {
        if (query_rows_keep_bits(*p, rows)) want = rows;
      }
      ASSERT_EQ(least_query_rows(*p, at_least), want) << "Lq " << p->q_len << " from " << at_least;
    }
  }
  EXPECT_EQ(least_query_rows(prefill.p, 38), 52);   // 40, 44, 48 leave 30, 18, 6 rows (in place)
  EXPECT_EQ(least_query_rows(in_place.p, 1), 4);    // all in place
  EXPECT_EQ(least_query_rows(gqa.p, 1), 0);         // heads start inside tiles
}

TEST(SdpaForward, ManyKeyTilesAreSummedATileAtATime) {
  // A row's output o sums p·v over every key tile. With uniform weights (scale 0) and values
  // around 0.7 it is about 0.7 times the keys so far, and each term added straight to it loses
  // a bit per doubling of o: at 262144 keys the prefill's outputs were off by 9.9e-6 of their
  // size. pv_block sums each tile apart and adds the sum: 2.8e-7 (the decode's 5.9e-7).
  // Prefill (36 flat rows: packed K/V, blocks of row tiles) and decode (split-K segments,
  // merged afterwards) with the same K/V; flat rows [B, Hq, Lq] = [1, 9, 4] of one KV head.
  for (const int lq : {4, 1}) {
    Case c;
    c.Hq = 9, c.Hkv = 1, c.Lq = lq, c.Lk = 262144, c.E = 4, c.Ev = 3, c.scale = 0.0f, c.weights = false;
    Harness h(c);
    for (float& x : h.v) x = 0.7f + 0.05f * x;
    ASSERT_EQ(h.run(), Status::kOk);
    const std::vector<double> ref = reference_forward(h.p, nullptr);
    EXPECT_LE(test::normwise_error(h.out, ref), 2e-6) << c.describe();
  }
}

TEST(SdpaForward, LongSequencesUseTileSizedScratch) {
  Case c;
  c.Lq = 32768, c.Lk = 32768, c.E = 16, c.Ev = 16, c.weights = false;
  Harness h(c);
  // Packed K and V of one head plus tiles: O(Lk·(E + Ev)), nowhere near Lq·Lk.
  const uint64_t tiles = 4 * kQueryTile * kKeyTile;  // scores and bias [4][kKeyTile], with room
  const uint64_t floats = scratch_floats(h.p);
  EXPECT_LT(floats, uint64_t(32768) * (16 + 16) + tiles);
  // Decode reads K/V in place: tiles plus one (m, l, o) state per 512-key segment and row.
  Case d = c;
  d.Lq = 1;
  Harness hd(d);
  EXPECT_LT(scratch_floats(hd.p), tiles + (32768 / 512) * 4 * (2 + 16));
}

TEST(SdpaForward, ValidateRejectsWhatTheKernelCannotDo) {
  Case c;
  c.Lq = 4, c.Lk = 8;
  {
    Harness h(c);
    h.p.q_heads = 3, h.p.kv_heads = 2;
    EXPECT_EQ(h.run(), Status::kBadShape);
  }
  {
    Harness h(c);
    h.p.head_dim = 0;
    EXPECT_EQ(h.run(), Status::kBadShape);
  }
  {
    Harness h(c);
    h.p.scale = kNaN;
    EXPECT_EQ(h.run(), Status::kBadScale);
  }
  {
    Harness h(c);
    h.p.softcap = -1.0f;
    EXPECT_EQ(h.run(), Status::kBadSoftcap);
  }
  {  // a window needs causal's diagonal, and a size
    Harness h(c);
    h.p.sliding_window = 3;
    EXPECT_EQ(h.run(), Status::kBadWindow);
    h.p.causal = true, h.p.sliding_window = -1;
    EXPECT_EQ(h.run(), Status::kBadWindow);
  }
  {
    Harness h(c);
    int32_t too_long = 9;
    h.p.key_lengths = &too_long;
    EXPECT_EQ(h.run(), Status::kBadKeyLength);
  }
  {  // a sink is finite, or -inf for none
    Harness h(c);
    float sink = kNaN;
    h.p.sinks = &sink;
    EXPECT_EQ(h.run(), Status::kBadSink);
    sink = kInf;
    EXPECT_EQ(h.run(), Status::kBadSink);
    sink = -kInf;
    EXPECT_EQ(h.run(), Status::kOk);
    sink = -3.4e38f;
    EXPECT_EQ(h.run(), Status::kOk);
  }
  {
    Harness h(c);
    int32_t bad_start = 9;
    h.p.key_starts = &bad_start;
    EXPECT_EQ(h.run(), Status::kBadKeyLength);
    bad_start = -1;
    EXPECT_EQ(h.run(), Status::kBadKeyLength);
    bad_start = 8;  // Lk: every key padding, valid
    EXPECT_EQ(h.run(), Status::kOk);
  }
  {
    Harness h(c);
    h.p.value = nullptr;
    EXPECT_EQ(h.run(), Status::kNullPointer);
  }
  {  // an unknown mask kind is refused (not read as "no mask"), like an unknown KvType
    Harness h(c);
    static const float mask[1] = {0.0f};
    h.p.mask = mask;
    h.p.mask_kind = static_cast<MaskKind>(3);
    EXPECT_EQ(h.run(), Status::kBadMaskKind);
    h.p.kv_type = static_cast<KvType>(7);
    EXPECT_EQ(h.run(), Status::kBadKvType);
  }
  {
    Harness h(c);
    std::vector<float> scratch(scratch_floats(h.p) - 1);
    EXPECT_EQ(forward(h.p, scratch.data(), scratch.size()), Status::kBadScratch);
  }
}


// ALiBi (Problem::alibi_slopes, src/kernels/alibi.h): key j of row i gets the bias
// -(slope·|i + offset - j|), added with the mask, the offset (causal_offsets[b] or causal_offset)
// placing each row's diagonal whether or not the problem is causal. Slopes [Hq] (stride 0) or
// [B, Hq] (stride Hq), each array exactly that long (ASan sees a read of another row).

// The worst |bias| of the keys that matter to a row is about slope·(distance from the row's
// diagonal to its nearest key) plus a few; the kernel rounds each bias (the distance past 2^24,
// the product, the sum with the mask) at that magnitude, as it rounds a score: the tolerance
// HugeLogitsNeitherOverflowNorNaN gives scores of that size.
double alibi_tolerance(double bias_magnitude) { return std::max(2e-5, 8.0 * bias_magnitude * std::ldexp(1.0, -23)); }

TEST(SdpaForward, AlibiAroundTileEdgesOfKeysAndRowsMhaAndGqa) {
  // Keys around the 512-key tile and primes, rows around the 4-row tile; MHA and GQA (8 query
  // heads on 2 KV heads: the heads of one row tile have different slopes); Ev != E, Lq != Lk;
  // shared slopes on a problem that is not causal (its diagonal bottom-right all the same), then
  // per-batch slopes with per-batch causal offsets, the other layout and key lengths.
  uint32_t seed = 2000;
  for (auto hh : {std::pair<int, int>{2, 2}, {8, 2}})
    for (int lq : {1, 3, 4, 5, 67})
      for (int lk : {1, 37, 511, 512, 513, 1031}) {
        // (Time: 513 and 1031 cut the key tiles too, and MHA takes 67 rows of 1031 keys.)
        if (lq == 67 && (lk == 511 || lk == 512 || (lk == 1031 && hh.first == 8))) continue;
        Case c;
        c.B = 2, c.Hq = hh.first, c.Hkv = hh.second, c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 12, c.seed = seed++;
        c.alibi_slopes = test::geometric_slopes(c.Hq);
        c.offsets = {lk - lq};
        c.weights = lq * lk < 20000;
        check(c);
        c.alibi_slopes = test::per_batch_slopes(c.B, c.Hq);
        c.causal = true, c.offsets = {lk - lq, lk / 2 - lq}, c.key_lengths = {lk, (lk + 1) / 2}, c.bshd = true;
        if (lq == 67) c.B = 1, c.alibi_slopes.resize(size_t(c.Hq)), c.offsets.resize(1), c.key_lengths.resize(1);
        check(c);
      }
}

TEST(SdpaForward, AlibiOffsetsMoveTheDiagonalCausalOrNot) {
  // Offsets 0 (top-left), Lk - Lq (bottom-right), negative (rows before key 0: not causal, their
  // nearest key is key 0; causal, nothing to attend) and past the end; causal and not; then per
  // batch, with sliding windows and softcap. A head with slope 0 among them.
  uint32_t seed = 2200;
  for (int lq : {1, 5, 33})
    for (int lk : {1, 31, 70, 600})
      for (int offset : {0, lk - lq, -3, lk + 4})
        for (bool causal : {false, true}) {
          Case c;
          c.Hq = 3, c.Hkv = 1, c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 8, c.seed = seed++;
          c.causal = causal, c.offsets = {offset}, c.alibi_slopes = {0.5f, 0.0625f, 0.0f};
          check(c);
        }
  for (bool causal : {false, true})
    for (int window : {0, 1, 9, 600}) {
      if (window > 0 && !causal) continue;
      Case c;
      c.B = 3, c.Hq = 4, c.Hkv = 2, c.Lq = 9, c.Lk = 700, c.E = 8, c.Ev = 6, c.seed = seed++;
      c.causal = causal, c.window = window, c.offsets = {691, 0, -4}, c.softcap = window == 9 ? 4.0f : 0.0f;
      c.alibi_slopes = test::per_batch_slopes(c.B, c.Hq);
      check(c);
    }
}

TEST(SdpaForward, AlibiOfUniformScoresIsTheSoftmaxOfTheBiasesByHand) {
  // scale 0: every score is 0, so row i's weights are exp(-slope·|i + offset - j|) normalised,
  // computed here from the definition (the reference not involved). Not causal: the offset moves
  // the diagonal all the same (per batch: 2 and -1); per-batch slopes, one of them 0 (uniform).
  Case c;
  c.B = 2, c.Hq = 2, c.Hkv = 1, c.Lq = 3, c.Lk = 7, c.E = 4, c.Ev = 5, c.scale = 0.0f;
  c.offsets = {2, -1}, c.alibi_slopes = {0.6931472f, 0.25f, 1.5f, 0.0f};
  Harness h(c);
  ASSERT_EQ(h.run(), Status::kOk);
  h.expect_matches_reference();
  for (int b = 0; b < c.B; b++)
    for (int hd = 0; hd < c.Hq; hd++)
      for (int i = 0; i < c.Lq; i++) {
        const double slope = c.alibi_slopes[size_t(b * c.Hq + hd)];
        std::vector<double> w(size_t(c.Lk));
        double sum = 0.0;
        for (int j = 0; j < c.Lk; j++) sum += w[size_t(j)] = std::exp(-slope * std::abs(i + c.offsets[size_t(b)] - j));
        for (int e = 0; e < c.Ev; e++) {
          double want = 0.0;
          for (int j = 0; j < c.Lk; j++) want += w[size_t(j)] / sum * h.value_at(b, 0, j, e);
          EXPECT_NEAR(h.output_at(b, hd, i, e), want, 1e-5) << "b" << b << " h" << hd << " i" << i << " e" << e;
        }
        for (int j = 0; j < c.Lk; j++) {
          EXPECT_NEAR(h.weights[size_t(((b * c.Hq + hd) * c.Lq + i) * c.Lk + j)], w[size_t(j)] / sum, 1e-6)
              << "b" << b << " h" << hd << " i" << i << " j" << j;
        }
      }
}

TEST(SdpaForward, AlibiAddsToFloatAndBoolMasksOfEveryBroadcast) {
  // The bias row of a tile is the mask's plus ALiBi's. Masks broadcast over heads (the rows of a
  // GQA tile then read one mask row: with different slopes each gets its own bias row, with equal
  // slopes and one query row per head the first row's is copied), over rows (rows of one head
  // read one mask row with different diagonals), over keys; float and bool; causal and not.
  const std::vector<std::vector<int>> shapes = {{-1}, {-2, -1}, {1, -2, -1}, {2, 4, -2, -1}, {-2, 1}};
  uint32_t seed = 2400;
  for (int lq : {1, 7})
    for (int lk : {41, 600})
      for (const auto& shape : shapes)
        for (MaskKind kind : {MaskKind::kFloat, MaskKind::kBool})
          for (bool equal_slopes : {false, true}) {
            Case c;
            c.B = 2, c.Hq = 4, c.Hkv = 1, c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 5, c.seed = seed++;
            for (int d : shape) c.mask_dims.push_back(d == -1 ? lk : d == -2 ? lq : d);
            c.mask_kind = kind, c.mask_block_fraction = 0.3;
            c.causal = seed % 2 == 0, c.offsets = {lk - lq};
            c.alibi_slopes = equal_slopes ? std::vector<float>(4, 0.125f) : test::geometric_slopes(4);
            c.weights = lk < 600;
            check(c);
          }
}

TEST(SdpaForward, AlibiWithKeyLengthsStartsSinksAndLogSumExp) {
  // Left padding (NaN in K/V before each batch's first key), key lengths, sinks (one far above
  // every score among them), prefill and split-K decode, causal and not; the log-sum-exp
  // against the reference's too.
  uint32_t seed = 2600;
  for (int lq : {1, 6})
    for (int lk : {40, 1100})
      for (bool causal : {false, true}) {
        Case c;
        c.B = 2, c.Hq = 5, c.Hkv = 5, c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 9, c.seed = seed++;
        c.key_starts = {3, lk / 3}, c.key_lengths = {lk, lk - 5};
        c.sinks = cycling_sinks(c.Hq), c.alibi_slopes = test::per_batch_slopes(c.B, c.Hq);
        c.causal = causal, c.offsets = {lk - lq, lk - lq - 7};
        c.weights = lq == 6;
        Harness h(c);
        for (int b = 0; b < c.B; b++)
          for (int kvh = 0; kvh < c.Hkv; kvh++)
            for (int j = 0; j < c.key_starts[size_t(b)]; j++) {
              for (int d = 0; d < c.E; d++) h.key_at(b, kvh, j, d) = kNaN;
              for (int e = 0; e < c.Ev; e++) h.value_at(b, kvh, j, e) = kNaN;
            }
        std::vector<float> lse(size_t(c.B) * c.Hq * c.Lq, kNaN);
        h.p.logsumexp = lse.data();
        ASSERT_EQ(h.run(), Status::kOk) << c.describe();
        h.expect_matches_reference();
        const std::vector<double> ref_lse = reference_logsumexp(h.p);
        for (size_t n = 0; n < lse.size(); n++) {
          EXPECT_NEAR(lse[n], ref_lse[n], 2e-5 * (1 + std::abs(ref_lse[n]))) << c.describe() << " row " << n;
        }
      }
}

TEST(SdpaForward, AlibiDecodeSplitKOnOneAndTwoThreadsBitwise) {
  // Lq = 1 with many heads and Lk past one 512-key segment: K/V read in place, split-K segments
  // merged; above the size under which forward() stays on one thread. Two threads give the bits
  // of one (output, weights, log-sum-exp); the streamed segments of one (batch, KV head) too.
  const Case cases[] = {
      [] { Case c; c.Hq = 16, c.Hkv = 4, c.Lq = 1, c.Lk = 2600, c.E = 96, c.Ev = 96, c.weights = false;
           c.offsets = {2599}, c.alibi_slopes = test::geometric_slopes(16); return c; }(),
      [] { Case c; c.B = 2, c.Hq = 8, c.Hkv = 8, c.Lq = 1, c.Lk = 2100, c.E = 64, c.Ev = 64, c.causal = true;
           c.offsets = {2099, 1400}, c.key_lengths = {2100, 1900}, c.alibi_slopes = test::per_batch_slopes(2, 8);
           return c; }(),
      [] { Case c; c.B = 2, c.Hq = 8, c.Hkv = 2, c.Lq = 2, c.Lk = 2100, c.E = 64, c.Ev = 40, c.weights = false;
           c.offsets = {2098, 1500}, c.sinks = cycling_sinks(8), c.alibi_slopes = test::per_batch_slopes(2, 8);
           c.mask_kind = MaskKind::kFloat, c.mask_dims = {2, 1, 2, 2100}, c.mask_block_fraction = 0.2; return c; }(),
  };
  for (const Case& c : cases) {
    Harness single(c);
    ASSERT_TRUE(reads_keys_in_place(single.p)) << c.describe();
    std::vector<float> lse(size_t(c.B) * c.Hq * c.Lq, kNaN);
    single.p.logsumexp = lse.data();
    ASSERT_EQ(single.run(), Status::kOk) << c.describe();
    single.expect_matches_reference();
    ThreadPool pool(2);
    Harness two(c);
    std::vector<float> two_lse(lse.size(), kNaN);
    two.p.logsumexp = two_lse.data();
    std::vector<float> scratch(scratch_floats(two.p, 2));
    ASSERT_EQ(forward(two.p, scratch.data(), scratch.size(), &pool), Status::kOk) << c.describe();
    EXPECT_EQ(0, std::memcmp(two.out.data(), single.out.data(), single.out.size() * sizeof(float))) << c.describe();
    EXPECT_EQ(single.weights, two.weights) << c.describe();
    EXPECT_EQ(0, std::memcmp(two_lse.data(), lse.data(), lse.size() * sizeof(float))) << c.describe();
  }
  // One (batch, KV head): the streamed decode's segments, each K/V copy alone.
  for (int group : {1, 8}) {
    Case c;
    c.Hq = group, c.Lq = 1, c.Lk = 1300, c.E = 20, c.Ev = 13, c.weights = false, c.seed = uint32_t(group);
    c.offsets = {1299 - 400}, c.alibi_slopes = test::geometric_slopes(group, 0.05f);
    c.mask_kind = MaskKind::kBool, c.mask_dims = {1300}, c.mask_block_fraction = 0.2;
    Harness h(c);
    ASSERT_EQ(h.run(), Status::kOk);
    h.expect_matches_reference();
    const std::vector<float> streamed = run_streamed(h);
    EXPECT_EQ(0, std::memcmp(streamed.data(), h.out.data(), h.out.size() * sizeof(float))) << c.describe();
  }
}

TEST(SdpaForward, AlibiSlopesOfZeroGiveTheBitsOfNoAlibi) {
  // A bias of -(0·d) = -0 added to the mask's (or to 0): every score keeps its value, so the
  // output, weights and log-sum-exp have the bits of the same problem without ALiBi, on every path
  // (prefill, decode, split-K with weights, masks, windows, softcap, sinks, left padding).
  std::vector<Case> cases;
  {
    Case c;
    c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = 37, c.Lk = 600, c.E = 8, c.Ev = 9, c.causal = true, c.offsets = {563, 10};
    c.window = 70;
    cases.push_back(c);
    c.mask_kind = MaskKind::kFloat, c.mask_dims = {37, 600}, c.mask_block_fraction = 0.2, c.softcap = 3.0f;
    cases.push_back(c);
    c.mask_kind = MaskKind::kBool, c.mask_dims = {2, 1, 37, 600}, c.window = 0, c.sinks = cycling_sinks(4);
    c.key_starts = {5, 0};
    cases.push_back(c);
  }
  for (int lk : {700, 1500}) {
    Case c;
    c.B = 2, c.Hq = 6, c.Hkv = 3, c.Lq = 1, c.Lk = lk, c.E = 16, c.Ev = 8, c.offsets = {lk - 1};
    cases.push_back(c);
    c.causal = true, c.key_lengths = {lk, lk / 2}, c.mask_kind = MaskKind::kFloat, c.mask_dims = {lk};
    cases.push_back(c);
  }
  for (Case c : cases) {
    Harness none(c);
    c.alibi_slopes.assign(size_t(c.B) * c.Hq, 0.0f);  // per batch
    Harness zero(c);
    c.alibi_slopes.assign(size_t(c.Hq), -0.0f);  // shared, -0 (valid: not below 0)
    Harness negative_zero(c);
    std::vector<float> lse[3];
    Harness* hs[3] = {&none, &zero, &negative_zero};
    for (int n = 0; n < 3; n++) {
      lse[n].assign(size_t(c.B) * c.Hq * c.Lq, kNaN);
      hs[n]->p.logsumexp = lse[n].data();
      ASSERT_EQ(hs[n]->run(), Status::kOk) << c.describe();
    }
    none.expect_matches_reference();
    for (int n = 1; n < 3; n++) {
      EXPECT_EQ(0, std::memcmp(none.out.data(), hs[n]->out.data(), none.out.size() * sizeof(float))) << n << " " << c.describe();
      EXPECT_EQ(0, std::memcmp(none.weights.data(), hs[n]->weights.data(), none.weights.size() * sizeof(float))) << n << " " << c.describe();
      EXPECT_EQ(0, std::memcmp(lse[0].data(), lse[n].data(), lse[0].size() * sizeof(float))) << n << " " << c.describe();
    }
  }
}

TEST(SdpaForward, AlibiRunOfFourColumnsGivesTheBitsOfOneAtATime) {
  // add_alibi (src/kernels/alibi.h) takes four columns at a time where every distance of the run
  // is below 2^24, else one at a time (alibi_bias): the same bits, either side of 2^24, and both
  // the bits of the contract, -(slope · float(|position - j|)), float(d) rounded to nearest.
  const int64_t kExact = int64_t{1} << 24;
  const int64_t bases[] = {0, 5, -5, 511, -511, kExact - 600, kExact - 512, kExact - 511, kExact - 1, kExact,
                           kExact + 1, -kExact + 600, -kExact + 512, -kExact + 511, -kExact, 2 * kExact + 3,
                           -2 * kExact - 3, int64_t{1} << 31, -(int64_t{1} << 31) - 600};
  const std::pair<int, int> runs[] = {{0, kKeyTile}, {3, 509}, {0, 1}, {0, 0}, {5, 7}, {1, kKeyTile}, {100, 101}};
  const float slopes[] = {0.5f, 0x1p-20f, 3.0f, 0.3f, 0.0f, kMaxAlibiSlope};
  const int64_t j0 = 1024;
  for (int64_t base : bases)
    for (auto run : runs)
      for (float slope : slopes) {
        const AlibiRow row{slope, base + j0};
        std::vector<float> bias(kKeyTile), want(kKeyTile);
        for (int c = 0; c < kKeyTile; c++) bias[size_t(c)] = c % 7 == 3 ? -kInf : 0.25f * float(c % 5) - 0.5f;
        want = bias;
        for (int c = run.first; c < run.second; c++) {
          const int64_t d = std::abs(base - c);
          const float alibi = -(slope * static_cast<float>(d));
          const float scalar = alibi_bias(row, j0 + c);
          ASSERT_EQ(0, std::memcmp(&alibi, &scalar, sizeof(float))) << "base " << base << " c " << c << " slope " << slope;
          want[size_t(c)] += alibi;
        }
        add_alibi(row, j0, run.first, run.second, bias.data());
        ASSERT_EQ(0, std::memcmp(bias.data(), want.data(), bias.size() * sizeof(float)))
            << "base " << base << " run " << run.first << ".." << run.second << " slope " << slope;
      }
}

TEST(SdpaForward, AlibiDistancesPastTwoToThe24AreRoundedAndStayClose) {
  // Offsets far from the keys: distances of 2^24 and more, where add_alibi goes one column at a
  // time and float(d) rounds; a slope small enough (bias about -32) for the reference's exact
  // distances to stay within a tolerance for scores of that size. Distances straddling 2^24
  // inside a tile (offset 2^24 + 300), and both ends of int32.
  struct Far {
    int32_t offset;
    float slope;
  };
  const Far fars[] = {{1 << 25, 0x1p-20f}, {-(1 << 25), 0x1p-20f}, {(1 << 24) + 300, 0x1p-19f},
                      {INT32_MAX, 0x1p-26f}, {INT32_MIN, 0x1p-26f}};
  uint32_t seed = 2800;
  for (const Far& far : fars)
    for (int lk : {37, 1031}) {
      Case c;
      c.B = 2, c.Hq = 2, c.Hkv = 1, c.Lq = 5, c.Lk = lk, c.E = 8, c.Ev = 8, c.seed = seed++;
      c.offsets = {far.offset}, c.alibi_slopes = {far.slope, far.slope / 2};
      const double magnitude = double(far.slope) * (std::abs(double(far.offset)) + lk + 5);
      check(c, alibi_tolerance(magnitude));
    }
}

TEST(SdpaForward, AlibiTheLargestSlopeNeverBlocksAKey) {
  // slope = kMaxAlibiSlope (2^64): biases down to -2^64·d, finite, so every row keeps its nearest
  // key (weight 1, its V row exactly), even a row whose diagonal is 1000 keys before key 0, whose
  // every bias is below -2^73: not a row with nothing to attend (zeros).
  for (int lk : {9, 600}) {
    Case c;
    c.B = 2, c.Hq = 2, c.Hkv = 1, c.Lq = 3, c.Lk = lk, c.E = 8, c.Ev = 8, c.offsets = {1, -1000};
    c.alibi_slopes = {kMaxAlibiSlope, kMaxAlibiSlope};
    Harness h(c);
    ASSERT_EQ(h.run(), Status::kOk);
    h.expect_matches_reference();
    for (int b = 0; b < 2; b++)
      for (int i = 0; i < c.Lq; i++) {
        const int nearest = std::clamp(i + c.offsets[size_t(b)], 0, lk - 1);
        for (int e = 0; e < c.Ev; e++) EXPECT_EQ(h.output_at(b, 0, i, e), h.value_at(b, 0, nearest, e)) << b << " " << i;
        EXPECT_EQ(h.weights[size_t(((b * c.Hq) * c.Lq + i) * lk + nearest)], 1.0f) << b << " " << i;
      }
  }
}

TEST(SdpaForward, AlibiValidateRejectsBadSlopesAndWritesNothing) {
  // Slopes in [0, kMaxAlibiSlope] (-0 included); NaN, negative, +inf and past 2^64 are kBadAlibi,
  // in a shared [Hq] array or in any batch's row of [B, Hq] (only in batch 1's); a negative
  // alibi_stride_b is kBadStride. Nothing written on failure: output, weights, log-sum-exp keep
  // their NaN; forward_segment() and validate_backward() say the same.
  Case c;
  c.B = 2, c.Hq = 2, c.Hkv = 1, c.Lq = 1, c.Lk = 8;
  const float bad[] = {kNaN, -0.5f, kInf, 0x1p65f, std::nextafter(kMaxAlibiSlope, kInf), -kInf, -0x1p-149f};
  const float good[] = {0.0f, -0.0f, 0x1p-149f, 1.0f, kMaxAlibiSlope};
  auto expect_nothing_written = [](const Harness& h, const std::vector<float>& lse, const std::string& what) {
    EXPECT_TRUE(std::all_of(h.out.begin(), h.out.end(), [](float x) { return std::isnan(x); })) << what;
    EXPECT_TRUE(std::all_of(h.weights.begin(), h.weights.end(), [](float x) { return std::isnan(x); })) << what;
    EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float x) { return std::isnan(x); })) << what;
  };
  for (bool per_batch : {false, true})
    for (int at = 0; at < (per_batch ? 4 : 2); at++) {
      for (float slope : bad) {
        Case bc = c;
        bc.alibi_slopes.assign(per_batch ? 4 : 2, 0.25f);
        bc.alibi_slopes[size_t(at)] = slope;
        Harness h(bc);
        std::vector<float> lse(2, kNaN);
        h.p.logsumexp = lse.data();
        const std::string what = bc.describe() + " slope " + std::to_string(slope) + " at " + std::to_string(at);
        EXPECT_EQ(validate(h.p), Status::kBadAlibi) << what;
        EXPECT_EQ(h.run(), Status::kBadAlibi) << what;
        expect_nothing_written(h, lse, what);
        std::vector<float> partials(segment_partials_floats(h.p)), scratch(segment_scratch_floats(h.p));
        Problem pair = h.p;  // one (batch, KV head) of the streamed decode: batch 0's row
        pair.batch = 1, pair.weights = nullptr, pair.logsumexp = nullptr;
        EXPECT_EQ(forward_segment(pair, 0, partials.data(), scratch.data(), scratch.size()),
                  at < 2 ? Status::kBadAlibi : Status::kOk) << what;
        BackwardProblem bp;
        bp.forward = h.p;
        std::vector<float> go(2 * 2 * 4), dq(go.size()), dk(2 * 8 * 4), dv(dk.size());
        bp.logsumexp = lse.data(), bp.grad_output = go.data(), bp.d_query = dq.data(), bp.d_key = dk.data();
        bp.d_value = dv.data();
        EXPECT_EQ(validate_backward(bp), Status::kBadAlibi) << what;
      }
      for (float slope : good) {
        Case gc = c;
        gc.alibi_slopes.assign(per_batch ? 4 : 2, 0.25f);
        gc.alibi_slopes[size_t(at)] = slope;
        Harness h(gc);
        EXPECT_EQ(h.run(), Status::kOk) << gc.describe() << " slope " << slope;
        h.expect_matches_reference();
      }
    }
  // A shared array is read at [h] for every batch: what lies past it is never read (ASan), even
  // with B > 1.
  {
    Case sc = c;
    sc.alibi_slopes = {0.5f, 0.25f};
    Harness h(sc);
    EXPECT_EQ(h.p.alibi_stride_b, 0);
    EXPECT_EQ(h.run(), Status::kOk);
    h.expect_matches_reference();
  }
  Case sc = c;
  sc.alibi_slopes = test::per_batch_slopes(2, 2);
  Harness h(sc);
  std::vector<float> lse(2, kNaN);
  h.p.logsumexp = lse.data();
  h.p.alibi_stride_b = -2;
  EXPECT_EQ(validate(h.p), Status::kBadStride);
  EXPECT_EQ(h.run(), Status::kBadStride);
  expect_nothing_written(h, lse, "negative alibi_stride_b");
}

}  // namespace
}  // namespace sdpa
