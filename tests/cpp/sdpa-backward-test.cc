// The SIMD backward kernels (through sdpa::backward, fed by sdpa::forward's output and
// log-sum-exp) against the double-precision reference gradients (reference_backward), and
// that reference against central finite differences of the double reference forward.
// Shapes come from the tile sizes in src/tiles.h: 1, tile-1, tile, tile+1, primes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/sdpa-bwd-kernels.h"
#include "parallel/thread-pool.h"
#include "reference/sdpa-reference.h"
#include "sdpa-backward.h"
#include "sdpa.h"
#include "tiles.h"

#include "attention-test-case.h"

namespace sdpa {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kTolerance = 1e-4;  // max |got - ref| / (1 + |ref|)

using Case = test::AttentionCase;

using test::relative_error;

struct Harness : test::OptionArrays {
  Case c;
  std::vector<float> q, k, v, out, lse, go, dq, dk, dv;
  std::vector<float> dm;  // a float mask's gradient, laid out as the mask (mask_f)
  std::vector<float> ds;  // the sinks' gradient [Hq]
  BackwardProblem bp;

  explicit Harness(const Case& cs) : c(cs) {
    Problem& p = bp.forward;
    test::CaseRandom random(c.seed);
    test::draw_qkv(c, random, q, k, v);
    random.fill(go, size_t(c.B) * c.Hq * c.Lq * c.Ev, 1.0f);
    out.assign(size_t(c.B) * c.Hq * c.Lq * c.Ev, kNaN);
    lse.assign(size_t(c.B) * c.Hq * c.Lq, kNaN);
    dq.assign(q.size(), kNaN);  // NaN: every element must be written
    dk.assign(k.size(), kNaN);
    dv.assign(v.size(), kNaN);

    test::set_shapes(c, p);
    strides(c.Hq, c.Lq, c.Ev, &bp.go_stride_b, &bp.go_stride_h, &bp.go_stride_l);
    strides(c.Hq, c.Lq, c.E, &bp.dq_stride_b, &bp.dq_stride_h, &bp.dq_stride_l);
    strides(c.Hkv, c.Lk, c.E, &bp.dk_stride_b, &bp.dk_stride_h, &bp.dk_stride_l);
    strides(c.Hkv, c.Lk, c.Ev, &bp.dv_stride_b, &bp.dv_stride_h, &bp.dv_stride_l);
    p.query = q.data(), p.key = k.data(), p.value = v.data(), p.output = out.data();
    p.logsumexp = lse.data();
    bp.logsumexp = lse.data(), bp.grad_output = go.data();
    bp.d_query = dq.data(), bp.d_key = dk.data(), bp.d_value = dv.data();
    test::set_options(c, random, *this, p);
    if (c.mask_kind == MaskKind::kFloat) {  // a float mask's gradient: every case asks for it
      dm.assign(mask_f.size(), kNaN);
      bp.d_mask = dm.data();
    }
    if (!c.sinks.empty()) {  // sinks' gradient: every case with sinks asks for it
      ds.assign(c.sinks.size(), kNaN);
      bp.d_sinks = ds.data();
    }
    if (!c.key_starts.empty()) {
      // Left padding, before each batch's first key, holds NaN: it must not reach any gradient.
      for (int b = 0; b < c.B; b++) {
        for (int h = 0; h < c.Hkv; h++) {
          for (int j = 0; j < key_starts[b]; j++) {
            for (int d = 0; d < c.E; d++) k[size_t(b * p.k_stride_b + h * p.k_stride_h + j * p.k_stride_l + d)] = kNaN;
            for (int d = 0; d < c.Ev; d++) v[size_t(b * p.v_stride_b + h * p.v_stride_h + j * p.v_stride_l + d)] = kNaN;
          }
        }
      }
    }
    if (!c.key_lengths.empty()) {
      // Padding past each batch's key length holds NaN: it must not reach any gradient.
      for (int b = 0; b < c.B; b++) {
        for (int h = 0; h < c.Hkv; h++) {
          for (int j = key_lengths[b]; j < c.Lk; j++) {
            for (int d = 0; d < c.E; d++) k[size_t(b * p.k_stride_b + h * p.k_stride_h + j * p.k_stride_l + d)] = kNaN;
            for (int d = 0; d < c.Ev; d++) v[size_t(b * p.v_stride_b + h * p.v_stride_h + j * p.v_stride_l + d)] = kNaN;
          }
        }
      }
    }
  }

  void strides(int H, int L, int D, int64_t* sb, int64_t* sh, int64_t* sl) const {
    test::set_strides(c.bshd, H, L, D, sb, sh, sl);
  }

  // forward (output and lse), then backward, on `threads` threads.
  void run(int threads) {
    std::unique_ptr<ThreadPool> pool = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
    std::vector<float> scratch(scratch_floats(bp.forward, threads));
    ASSERT_EQ(forward(bp.forward, scratch.data(), scratch.size(), pool.get()), Status::kOk);
    std::vector<float> bwd_scratch(backward_scratch_floats(bp, threads));
    ASSERT_EQ(backward(bp, bwd_scratch.data(), bwd_scratch.size(), pool.get()), Status::kOk);
  }

  // Element (b, h, l, d) of a tensor of this case's layout with H heads, L rows, D columns.
  size_t at(int H, int L, int D, int b, int h, int l, int d) const {
    int64_t sb, sh, sl;
    strides(H, L, D, &sb, &sh, &sl);
    return size_t(b * sb + h * sh + l * sl + d);
  }

  // max |got - ref| / (1 + |ref|) of a gradient stored in the case's layout vs the dense reference.
  double error(const std::vector<float>& got, const std::vector<double>& ref, int H, int L, int D) const {
    double worst = 0.0;
    for (int b = 0; b < c.B; b++) {
      for (int h = 0; h < H; h++) {
        for (int l = 0; l < L; l++) {
          for (int d = 0; d < D; d++) {
            const double r = ref[size_t(((int64_t(b) * H + h) * L + l) * D + d)];
            const double g = got[at(H, L, D, b, h, l, d)];
            const double e = std::isnan(g) ? std::numeric_limits<double>::infinity() : std::abs(g - r) / (1.0 + std::abs(r));
            worst = std::max(worst, e);
          }
        }
      }
    }
    return worst;
  }

  void expect_matches_reference() {
    const ReferenceGradients ref = reference_backward(bp);
    EXPECT_LE(error(dq, ref.d_query, c.Hq, c.Lq, c.E), kTolerance) << "dQ " << c.describe();
    EXPECT_LE(error(dk, ref.d_key, c.Hkv, c.Lk, c.E), kTolerance) << "dK " << c.describe();
    EXPECT_LE(error(dv, ref.d_value, c.Hkv, c.Lk, c.Ev), kTolerance) << "dV " << c.describe();
    ASSERT_EQ(ref.d_mask.size(), dm.size()) << c.describe();
    double worst = 0.0;
    for (size_t n = 0; n < dm.size(); n++) worst = std::max(worst, relative_error(dm[n], ref.d_mask[n]));
    EXPECT_LE(worst, kTolerance) << "dMask " << c.describe();
    ASSERT_EQ(ref.d_sinks.size(), ds.size()) << c.describe();
    for (size_t h = 0; h < ds.size(); h++) {
      EXPECT_LE(relative_error(ds[h], ref.d_sinks[h]), kTolerance) << "dSinks[" << h << "] " << c.describe();
    }
  }

  // Whether every gradient has the bits of `other`'s.
  void expect_same_bits(const Harness& other, const std::string& what) const {
    EXPECT_EQ(std::memcmp(dq.data(), other.dq.data(), dq.size() * 4), 0) << "dQ " << what;
    EXPECT_EQ(std::memcmp(dk.data(), other.dk.data(), dk.size() * 4), 0) << "dK " << what;
    EXPECT_EQ(std::memcmp(dv.data(), other.dv.data(), dv.size() * 4), 0) << "dV " << what;
    ASSERT_EQ(dm.size(), other.dm.size());
    if (!dm.empty()) {
      EXPECT_EQ(std::memcmp(dm.data(), other.dm.data(), dm.size() * 4), 0) << "dMask " << what;
    }
    ASSERT_EQ(ds.size(), other.ds.size());
    if (!ds.empty()) {
      EXPECT_EQ(std::memcmp(ds.data(), other.ds.data(), ds.size() * 4), 0) << "dSinks " << what;
    }
  }
};

void check(const Case& c) {
  Harness h(c);
  h.run(1);
  h.expect_matches_reference();
}

TEST(Backward, TileEdgesOfKeysAndRows) {
  const int kt = kBackwardKeyTile;
  for (int lk : {1, 7, kKeyGroup, kKeyGroup + 1, kt - 1, kt, kt + 1, 2 * kt + 3}) {
    for (int lq : {1, kQueryTile - 1, kQueryTile, kQueryTile + 1, 13}) {
      Case c;
      c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 8, c.seed = uint32_t(lk * 100 + lq);
      check(c);
    }
  }
}

TEST(Backward, HeadDimsAndValueDims) {
  // E 131, Ev 128 and 131: rows of 512 bytes and more, whole or with a tail of 3 floats (the
  // dO rows copied in, the dK/dV rows copied out by copy_bytes).
  for (int e : {1, 3, 4, 5, 8, 17, 64, 131}) {
    for (int ev : {1, 6, 8, 13, 128, 131}) {
      Case c;
      c.Lq = 5, c.Lk = 11, c.E = e, c.Ev = ev, c.seed = uint32_t(e * 31 + ev);
      check(c);
    }
  }
}

TEST(Backward, GroupedQueryHeadsSumIntoTheirKvHead) {
  for (auto [hq, hkv] : {std::pair{4, 2}, std::pair{6, 1}, std::pair{3, 3}}) {
    Case c;
    c.B = 2, c.Hq = hq, c.Hkv = hkv, c.Lq = 6, c.Lk = 70, c.E = 12, c.Ev = 7, c.seed = uint32_t(hq * 10 + hkv);
    check(c);
    c.bshd = true;
    check(c);
  }
}

TEST(Backward, MasksOfEveryBroadcastShape) {
  const std::vector<std::vector<int>> shapes = {{70}, {5, 70}, {3, 1, 70}, {2, 3, 5, 70}, {2, 1, 1, 70}, {1, 3, 5, 1}};
  for (MaskKind kind : {MaskKind::kFloat, MaskKind::kBool}) {
    for (const auto& dims : shapes) {
      Case c;
      c.B = 2, c.Hq = 3, c.Hkv = 1, c.Lq = 5, c.Lk = 70, c.E = 8, c.Ev = 6;
      c.mask_kind = kind, c.mask_dims = dims, c.mask_block_fraction = 0.3, c.seed = uint32_t(dims.size() * 7);
      check(c);
    }
  }
}

TEST(Backward, CausalOffsetsAndKeyLengthsWithNaNPadding) {
  for (std::vector<int32_t> offsets : {std::vector<int32_t>{0}, {-3}, {65}, {2, 70}, {-10, 0}}) {
    Case c;
    c.B = 2, c.Hq = 2, c.Hkv = 1, c.Lq = 9, c.Lk = 71, c.E = 8, c.Ev = 8;
    c.causal = true, c.offsets = offsets, c.seed = 3;
    check(c);
    c.key_lengths = {64, 0};  // batch 1: nothing to attend
    check(c);
  }
}

TEST(Backward, SlidingWindowsAroundTileEdgesWithMasksAndGqa) {
  // Windows of 1 key, of a key tile and one either side, wider than Lk; rows of one tile with
  // different windows; with key lengths, masks (the float mask's gradient too) and GQA. Keys
  // before every row's window hold NaN: no gradient may see them.
  const int kt = kBackwardKeyTile;
  uint32_t seed = 700;
  for (int lq : {1, 5, 13})
    for (int lk : {7, kt, kt + 1, 2 * kt + 3})
      for (int window : {1, 3, kt, kt + 1, 500}) {
        Case c;
        c.B = 2, c.Hq = 2, c.Hkv = 1, c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 6, c.seed = seed++;
        c.causal = true, c.offsets = {lk - lq, lk / 2 - lq}, c.window = window;
        check(c);
        c.key_lengths = {lk, (lk + 1) / 2};
        c.mask_kind = seed % 2 == 0 ? MaskKind::kFloat : MaskKind::kBool, c.mask_dims = {c.B, 1, lq, lk};
        c.mask_block_fraction = 0.2;
        check(c);
      }
  for (int lq : {1, 9}) {
    Case c;
    c.Hq = 4, c.Hkv = 2, c.Lq = lq, c.Lk = 3 * kt + 5, c.E = 12, c.Ev = 7, c.seed = seed++;
    c.causal = true, c.offsets = {c.Lk - lq}, c.window = kt + 7;
    Harness h(c);
    const int before_every_window = c.Lk - lq - c.window + 1;  // row 0's first key
    for (int kvh = 0; kvh < c.Hkv; kvh++)
      for (int j = 0; j < before_every_window; j++) {
        for (int d = 0; d < c.E; d++) h.k[h.at(c.Hkv, c.Lk, c.E, 0, kvh, j, d)] = kNaN;
        for (int d = 0; d < c.Ev; d++) h.v[h.at(c.Hkv, c.Lk, c.Ev, 0, kvh, j, d)] = kNaN;
      }
    h.run(1);
    h.expect_matches_reference();
    for (int kvh = 0; kvh < c.Hkv; kvh++)
      for (int j = 0; j < before_every_window; j++) {
        for (int d = 0; d < c.E; d++) EXPECT_PRED1(test::is_plus_zero, h.dk[h.at(c.Hkv, c.Lk, c.E, 0, kvh, j, d)]);
        for (int d = 0; d < c.Ev; d++) EXPECT_PRED1(test::is_plus_zero, h.dv[h.at(c.Hkv, c.Lk, c.Ev, 0, kvh, j, d)]);
      }
  }
}

TEST(Backward, KeyStartsWithNaNLeftPadding) {
  // Keys before each batch's first key hold NaN (the harness writes it): every gradient finite
  // and within the tolerance; those keys' dK and dV exact zeros. With windows, masks, GQA.
  const int kt = kBackwardKeyTile;
  uint32_t seed = 800;
  for (const std::vector<int32_t>& ks : {std::vector<int32_t>{0, 5}, {kt - 1, kt}, {kt + 1, 2 * kt + 3}, {2 * kt + 3, 0}})
    for (int variant = 0; variant < 3; variant++) {
      Case c;
      c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = 9, c.Lk = 2 * kt + 3, c.E = 8, c.Ev = 6, c.seed = seed++, c.key_starts = ks;
      if (variant == 1) c.causal = true, c.offsets = {c.Lk - c.Lq, 70}, c.window = 40;
      if (variant == 2) c.mask_kind = MaskKind::kFloat, c.mask_dims = {c.B, 1, c.Lq, c.Lk}, c.mask_block_fraction = 0.2;
      Harness h(c);
      h.run(1);
      h.expect_matches_reference();
      for (int b = 0; b < c.B; b++)
        for (int kvh = 0; kvh < c.Hkv; kvh++)
          for (int j = 0; j < ks[size_t(b)]; j++) {
            for (int d = 0; d < c.E; d++) EXPECT_PRED1(test::is_plus_zero, h.dk[h.at(c.Hkv, c.Lk, c.E, b, kvh, j, d)]);
            for (int d = 0; d < c.Ev; d++) EXPECT_PRED1(test::is_plus_zero, h.dv[h.at(c.Hkv, c.Lk, c.Ev, b, kvh, j, d)]);
          }
      Harness two(c);
      two.run(2);
      two.expect_same_bits(h, "2 threads " + c.describe());
    }
}

// (test::cycling_sinks: a sink of 30 is above every score, |lse| > kExactLseLimit, so those rows'
// statistics are recomputed with the sink.)
using test::cycling_sinks;

TEST(Backward, SinksAroundTileEdgesWithMasksWindowsAndGqa) {
  // The sinks' lse saved by the forward rebuilds every p; dSinks[h] = -Σ exp(sink - lse)·D.
  // Heads without a sink, below, about and far above the scores (rows recomputed); MHA and
  // GQA; rows with nothing to attend (a negative offset: their lse is the sink, their
  // gradients zero); float masks with their gradient, windows, softcap; 1 and 2 threads.
  const int kt = kBackwardKeyTile;
  uint32_t seed = 1500;
  for (auto hh : {std::pair<int, int>{5, 5}, {5, 1}})
    for (int lq : {1, 5, 37})
      for (int lk : {1, kt - 1, kt, kt + 1, 2 * kt + 3})
        for (int variant = 0; variant < 2; variant++) {
          Case c;
          c.B = 2, c.Hq = hh.first, c.Hkv = hh.second, c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 6, c.seed = seed++;
          c.sinks = cycling_sinks(c.Hq);
          if (variant == 1) {
            c.causal = true, c.offsets = {lk - lq, -2}, c.window = 20, c.softcap = 5.0f;
            c.mask_kind = MaskKind::kFloat, c.mask_dims = {c.B, 1, lq, lk}, c.mask_block_fraction = 0.2;
          }
          Harness h(c);
          if (variant == 1) {
            // dO of batch 1's first rows, which attend nothing (offset -2), holds NaN and Inf: it
            // reaches no gradient, dSinks included (their output is zero, their D is 0).
            for (int hd = 0; hd < c.Hq; hd++)
              for (int i = 0; i < std::min(2, lq); i++)
                for (int e = 0; e < c.Ev; e++) h.go[h.at(c.Hq, lq, c.Ev, 1, hd, i, e)] = e % 2 == 0 ? kNaN : kInf;
          }
          h.run(1);
          h.expect_matches_reference();
          for (float d : h.ds) EXPECT_TRUE(std::isfinite(d)) << c.describe();
          Harness two(c);
          if (variant == 1) std::copy(h.go.begin(), h.go.end(), two.go.begin());
          two.run(2);
          two.expect_same_bits(h, "2 threads " + c.describe());
        }
}

TEST(Backward, SoftcapScaleAndLargeLogits) {
  for (float softcap : {0.0f, 1.0f, 20.0f}) {
    for (float input_scale : {1.0f, 8.0f}) {
      Case c;
      c.Lq = 7, c.Lk = 66, c.E = 16, c.Ev = 5, c.softcap = softcap, c.input_scale = input_scale;
      c.scale = 0.3f, c.seed = uint32_t(softcap * 10 + input_scale);
      check(c);
    }
  }
}

// Scores far from zero: a float32 lse of size |lse| carries an error of ulp(lse)/2, and at
// |lse| >= 2^24·log(Lk) loses log(Lk) entirely, so p rebuilt as exp(s - lse) would be 1 for
// each of Lk tied scores. Such rows rebuild p from their own maximum and sum instead
// (RowStats in src/kernels/sdpa-bwd-kernels.h). The reference works in doubles throughout.
TEST(Backward, ScoresFarFromZeroRebuildProbabilitiesFromTheRowsOwnMaximum) {
  // Rows of tied scores far from zero: q = 0 on every other row, so that its scores are
  // exactly the row's float mask (-1e9 is how Hugging Face masks padding): p is uniform, its
  // gradients those of a plain average. The other rows have scores of their own plus 0.5.
  for (float bias : {-1e2f, -1e4f, -1e9f, -3.4e38f}) {
    Case c;
    c.B = 1, c.Hq = 2, c.Hkv = 1, c.Lq = 5, c.Lk = 70, c.E = 16, c.Ev = 8, c.seed = 7;
    c.mask_kind = MaskKind::kFloat, c.mask_dims = {c.Hq, c.Lq, 1};
    Harness h(c);
    for (int row = 0; row < c.Hq * c.Lq; row += 2) std::fill_n(h.q.begin() + row * c.E, c.E, 0.0f);
    for (int row = 0; row < c.Hq * c.Lq; row++) h.mask_f[size_t(row)] = row % 2 == 0 ? bias : 0.5f;
    h.run(1);
    h.expect_matches_reference();
    h.run(2);  // the split path: the same statistics
    h.expect_matches_reference();
  }
  // Huge logits (scores ~1e3 .. 1e7): nearly one-hot rows, with and without softcap; Lk past
  // one key tile so that the maximum moves between tiles.
  for (float input_scale : {1e2f, 1e3f, 1e4f}) {
    for (float softcap : {0.0f, 5e4f}) {
      Case c;
      c.B = 1, c.Hq = 2, c.Hkv = 1, c.Lq = 9, c.Lk = 131, c.E = 16, c.Ev = 8, c.scale = 1.0f;
      c.input_scale = input_scale, c.softcap = softcap, c.seed = uint32_t(input_scale) + uint32_t(softcap);
      Harness h(c);
      for (float& x : h.k) x *= input_scale;
      h.run(1);
      h.expect_matches_reference();
    }
  }
}

// The row statistics kernel recomputes the rows that need it in groups of row tiles (each key
// tile packed once per group). Three kinds of rows, interleaved across tiles: rows that keep
// their lse; rows with q 16 times larger (|scale|·‖q‖₂·max ‖k‖₂ ≈ 0.25·16·4·6 > 64: recomputed,
// nearly one-hot); rows with q = 0 under a float mask of their own far from zero (-1e4 and below:
// |lse| > 16, recomputed, their scores tied at the row's bias, p uniform over its causal
// limit). So a row given another row's statistics gets p off by far more than the tolerance.
// Each (batch, KV head) has 141 rows: three groups of 64 rows or fewer, with rows of three
// heads; on 2 and 3 threads the row blocks (72 and 48 rows) cut the groups elsewhere.
TEST(Backward, RowStatisticsOfManyRowsRecomputedTogether) {
  Case c;
  c.B = 2, c.Hq = 6, c.Hkv = 2, c.Lq = 47, c.Lk = 150, c.E = 16, c.Ev = 12, c.seed = 11;
  c.causal = true, c.offsets = {c.Lk - c.Lq, 20};
  c.mask_kind = MaskKind::kFloat, c.mask_dims = {c.Hq, c.Lq, 1};
  auto make = [&c] {
    auto h = std::make_unique<Harness>(c);
    for (int row = 0; row < c.Hq * c.Lq; row++) {  // mask rows [Hq, Lq]
      h->mask_f[size_t(row)] = row % 3 == 2 ? -1e4f - 37.25f * float(row % 29) : 0.25f;
    }
    for (int b = 0; b < c.B; b++) {
      for (int row = 0; row < c.Hq * c.Lq; row++) {  // Q rows [B, Hq, Lq]
        float* q = h->q.data() + (size_t(b) * c.Hq * c.Lq + row) * c.E;
        for (int d = 0; d < c.E; d++) q[d] = row % 3 == 1 ? 16.0f * q[d] : row % 3 == 2 ? 0.0f : q[d];
      }
    }
    return h;
  };
  const std::unique_ptr<Harness> one = make();
  one->run(1);
  one->expect_matches_reference();
  int recomputed = 0, kept = 0;
  for (int b = 0; b < c.B; b++) {
    for (int h = 0; h < c.Hq; h++) {
      for (int i = 0; i < c.Lq; i++) {
        const float lse = one->lse[size_t((b * c.Hq + h) * c.Lq + i)];
        (sdpa_f32_bwd_row_stats_recomputed(one->bp, b, h, i, lse) ? recomputed : kept)++;
      }
    }
  }
  EXPECT_GT(recomputed, c.B * c.Hq * c.Lq / 2);  // about two rows in three
  EXPECT_GT(kept, c.B * c.Hq * c.Lq / 4);
  for (int threads : {2, 3}) {
    const std::unique_ptr<Harness> many = make();
    many->run(threads);
    EXPECT_EQ(std::memcmp(many->dq.data(), one->dq.data(), one->dq.size() * 4), 0) << threads;
    EXPECT_EQ(std::memcmp(many->dk.data(), one->dk.data(), one->dk.size() * 4), 0) << threads;
    EXPECT_EQ(std::memcmp(many->dv.data(), one->dv.data(), one->dv.size() * 4), 0) << threads;
  }
}

TEST(Backward, FullyMaskedRowsGetExactZeros) {
  Case c;
  c.B = 1, c.Hq = 2, c.Lq = 6, c.Lk = 20, c.E = 8, c.Ev = 8;
  c.causal = true, c.offsets = {-3};  // rows 0..2 attend nothing
  Harness h(c);
  h.run(1);
  h.expect_matches_reference();
  for (int head = 0; head < 2; head++) {
    for (int i = 0; i < 3; i++) {
      for (int d = 0; d < c.E; d++) EXPECT_PRED1(test::is_plus_zero, h.dq[h.at(2, 6, 8, 0, head, i, d)]);
    }
  }
  // Keys no row attends (j > 5 - 3 = 2 for the last row) have exact-zero dK and dV.
  for (int j = 3; j < c.Lk; j++) {
    for (int d = 0; d < c.E; d++) EXPECT_PRED1(test::is_plus_zero, h.dk[h.at(1, 20, 8, 0, 0, j, d)]);
    for (int d = 0; d < c.Ev; d++) EXPECT_PRED1(test::is_plus_zero, h.dv[h.at(1, 20, 8, 0, 0, j, d)]);
  }
}

// One thread runs the fused kernel (by (batch, KV head) pairs); with more threads than pairs
// to share, the two-kernel split (key blocks, row blocks) runs instead: the same bits.
TEST(Backward, BitwiseIdenticalForAnyThreadCountAndSplit) {
  std::vector<Case> cases(4);
  cases[0].B = 2, cases[0].Hq = 4, cases[0].Hkv = 2, cases[0].Lq = 37, cases[0].Lk = 150, cases[0].E = 16;
  cases[0].Ev = 12, cases[0].causal = true, cases[0].offsets = {100};
  cases[0].mask_kind = MaskKind::kFloat, cases[0].mask_dims = {37, 150}, cases[0].mask_block_fraction = 0.1;
  cases[1].B = 2, cases[1].Hq = 6, cases[1].Hkv = 3, cases[1].Lq = 21, cases[1].Lk = 131, cases[1].E = 9;
  cases[1].Ev = 5, cases[1].softcap = 3.0f, cases[1].key_lengths = {131, 70};
  cases[1].mask_kind = MaskKind::kBool, cases[1].mask_dims = {6, 21, 131}, cases[1].mask_block_fraction = 0.2;
  cases[2].B = 1, cases[2].Hq = 1, cases[2].Hkv = 1, cases[2].Lq = 200, cases[2].Lk = 200, cases[2].E = 64;
  cases[2].Ev = 64, cases[2].causal = true, cases[2].bshd = true;
  cases[3] = cases[0], cases[3].Lq = 150, cases[3].Lk = 400, cases[3].offsets = {250, 100}, cases[3].window = 90;
  cases[3].mask_dims = {150, 400};
  cases.push_back(cases[1]);
  cases[4].sinks = {1.0f, -kInf, 30.0f, -2.0f, 0.0f, 4.0f};
  // dK/dV sum their rows in blocks of kSumBlockRows (ManyRowsAndKeysAreSummedInBlocks): 1300
  // flat rows of one KV head (a last block of 276) over 3 key tiles, causal, GQA.
  cases.emplace_back();
  cases[5].Hq = 2, cases[5].Hkv = 1, cases[5].Lq = 650, cases[5].Lk = 150, cases[5].E = 8, cases[5].Ev = 5;
  cases[5].causal = true, cases[5].offsets = {-400};
  for (const Case& c : cases) {
    Harness one(c);
    one.run(1);
    one.expect_matches_reference();
    for (int threads : {2, 3, 5}) {
      Harness many(c);
      many.run(threads);
      many.expect_same_bits(one, std::to_string(threads) + " " + c.describe());
    }
  }
}

TEST(Backward, ManyRowsAndKeysAreSummedInBlocks) {
  // dK and dV sum a term per query row of the KV group, dQ a term per key. Added one by one to
  // sums that grow (values about 0.7, dO about 0.5), the terms lost a bit per doubling; the
  // kernels sum 512 rows (kSumBlockRows) and one 64-key tile (dq_block) apart and add the
  // sums (dK/dV's compensated). The errors (max error ÷ max gradient), before and after: many
  // rows dV 4.7e-6 and 3.5e-8, dK 1.3e-5 and 1.4e-6; many keys dQ 1.2e-4 and 2.4e-6, dK 7.2e-6
  // and 5.1e-7 (tests/node/backward.test.mjs has the like at 262144 rows, on both wasm builds).
  // Many rows: 2 query heads of 65536 rows (131072 flat rows) on 64 keys, every key the same
  // (each row's scores equal, so p = 1/64 whatever the query, and dK does not vanish with the
  // scale; nor does dQ, which is about 0 and not checked).
  Case rows;
  rows.Hq = 2, rows.Hkv = 1, rows.Lq = 65536, rows.Lk = 64, rows.E = 4, rows.Ev = 3;
  // Many keys: 9 query heads of 4 rows (36 flat rows) on 262144 keys, the values leaning on
  // the keys' first dimension (so that dQ sums terms of one sign, not noise around zero).
  Case keys;
  keys.Hq = 9, keys.Hkv = 1, keys.Lq = 4, keys.Lk = 262144, keys.E = 4, keys.Ev = 3;
  for (const Case& c : {rows, keys}) {
    Harness h(c);
    for (float& x : h.v) x = 0.7f + 0.05f * x;
    for (float& x : h.go) x = 0.5f + 0.05f * x;
    for (int j = 0; j < c.Lk; j++) {
      if (c.Lk == 64) {
        std::copy_n(h.k.begin(), c.E, h.k.begin() + size_t(j) * c.E);
      } else {
        for (int d = 0; d < c.Ev; d++) h.v[size_t(j) * c.Ev + d] += 0.3f * h.k[size_t(j) * c.E];
      }
    }
    h.run(1);
    const ReferenceGradients ref = reference_backward(h.bp);
    const double dq = test::normwise_error(h.dq, ref.d_query), dk = test::normwise_error(h.dk, ref.d_key);
    const double dv = test::normwise_error(h.dv, ref.d_value);
    EXPECT_LE(dv, 2e-6) << "dV " << c.describe();
    EXPECT_LE(dk, 4e-6) << "dK " << c.describe();
    if (c.Lk != 64) {
      EXPECT_LE(dq, 1e-5) << "dQ " << c.describe();
    }
  }
}

TEST(Backward, SumsOfManyEqualBlocksAreCompensated) {
  // Blocks whose sums are equal round alike, and added one after another their roundings add
  // up: many query heads that are copies of one (dK/dV's 512-row blocks) and a [Lq, Lk] mask
  // shared by many (batch, head) pairs that are copies of one (its gradient's terms). Both sums
  // take Kahan's compensation. Before and after (max error ÷ max gradient): dK 6.2e-6 and
  // 4.6e-7, dV 6.2e-6 and 6.3e-7 under the copied heads; the mask's gradient 7.7e-6 and 7.8e-7.
  // 1024 copies of one query head of 256 rows (262144 flat rows, 512 blocks) on 16 keys.
  Case heads;
  heads.Hq = 1024, heads.Hkv = 1, heads.Lq = 256, heads.Lk = 16, heads.E = 4, heads.Ev = 3;
  // 16384 copies of one (batch, head) of 8 rows on 16 keys, under one [8, 16] float mask.
  Case mask;
  mask.B = 128, mask.Hq = 128, mask.Hkv = 1, mask.Lq = 8, mask.Lk = 16, mask.E = 4, mask.Ev = 3;
  mask.mask_kind = MaskKind::kFloat, mask.mask_dims = {8, 16};
  for (const Case& c : {heads, mask}) {
    Harness h(c);
    for (float& x : h.v) x = 0.7f + 0.05f * x;
    for (float& x : h.go) x = 0.5f + 0.05f * x;
    // Every (batch, head) a copy of (0, 0), every batch's K and V a copy of batch 0's.
    const size_t q_head = size_t(c.Lq) * c.E, go_head = size_t(c.Lq) * c.Ev;
    for (int n = 1; n < c.B * c.Hq; n++) {
      std::copy_n(h.q.begin(), q_head, h.q.begin() + n * q_head);
      std::copy_n(h.go.begin(), go_head, h.go.begin() + n * go_head);
    }
    // The values lean on the keys' first dimension: ds = p·(dp - D) is then not mostly the
    // rounding of dp - D.
    for (int j = 0; j < c.Lk; j++) {
      for (int d = 0; d < c.Ev; d++) h.v[size_t(j) * c.Ev + d] += 0.3f * h.k[size_t(j) * c.E];
    }
    for (int b = 1; b < c.B; b++) {
      std::copy_n(h.k.begin(), size_t(c.Lk) * c.E, h.k.begin() + size_t(b) * c.Lk * c.E);
      std::copy_n(h.v.begin(), size_t(c.Lk) * c.Ev, h.v.begin() + size_t(b) * c.Lk * c.Ev);
    }
    h.run(1);
    const ReferenceGradients ref = reference_backward(h.bp);
    if (c.mask_kind == MaskKind::kFloat) {
      EXPECT_LE(test::normwise_error(h.dm, ref.d_mask), 2e-6) << "dMask " << c.describe();
    } else {
      EXPECT_LE(test::normwise_error(h.dk, ref.d_key), 2e-6) << "dK " << c.describe();
      EXPECT_LE(test::normwise_error(h.dv, ref.d_value), 2e-6) << "dV " << c.describe();
    }
  }
}

TEST(Backward, CompensatedSumsKeepInfinities) {
  // Kahan's compensation after an infinite sum would be Inf - Inf = NaN, and the next term would
  // turn the sum into NaN; a non-finite sum clears it instead. dV: an infinite dO row among 1400
  // flat rows (3 blocks of kSumBlockRows) makes every element of dV +Inf. The mask's gradient:
  // a value of 3e38 makes dp = dO·v overflow to +Inf for its key, so ds and each of the 4 heads'
  // terms of that key's mask gradient are +Inf.
  Case rows;
  rows.Hq = 2, rows.Hkv = 1, rows.Lq = 700, rows.Lk = 20, rows.E = 4, rows.Ev = 3;
  Harness h(rows);
  for (float& x : h.go) x = 0.5f + 0.05f * x;
  std::fill_n(h.go.begin(), rows.Ev, kInf);  // row 0 of head 0
  h.run(1);
  for (float x : h.dv) EXPECT_EQ(x, kInf);

  Case mask;
  mask.Hq = 4, mask.Hkv = 1, mask.Lq = 3, mask.Lk = 20, mask.E = 4, mask.Ev = 3;
  mask.mask_kind = MaskKind::kFloat, mask.mask_dims = {3, 20};
  Harness m(mask);
  for (float& x : m.go) x = 0.5f + 0.05f * x;
  std::fill_n(m.v.begin() + 5 * mask.Ev, mask.Ev, 3e38f);  // key 5
  m.run(1);
  for (int i = 0; i < mask.Lq; i++) EXPECT_EQ(m.dm[size_t(i) * mask.Lk + 5], kInf) << "row " << i;
}

// The oracle itself: reference_backward against central differences of reference_forward's
// loss L = Σ dO ∘ O (double precision), for every input element of a small problem.
TEST(Backward, ReferenceGradientsMatchFiniteDifferences) {
  Case c;
  c.B = 1, c.Hq = 2, c.Hkv = 1, c.Lq = 3, c.Lk = 5, c.E = 3, c.Ev = 2, c.softcap = 2.0f;
  c.causal = true, c.offsets = {1}, c.mask_kind = MaskKind::kFloat, c.mask_dims = {3, 5}, c.seed = 9;
  Harness h(c);
  const ReferenceGradients ref = reference_backward(h.bp);
  auto loss = [&]() {
    const std::vector<double> out = reference_forward(h.bp.forward, nullptr);
    double sum = 0.0;
    for (size_t n = 0; n < out.size(); n++) sum += out[n] * h.go[n];  // bhsd: both dense
    return sum;
  };
  auto expect_fd = [&](std::vector<float>& x, const std::vector<double>& grad, const char* name) {
    for (size_t n = 0; n < x.size(); n++) {
      if (!std::isfinite(x[n])) continue;  // a sink of -inf (none): no neighbourhood to step in
      const float saved = x[n];
      const float step = 1e-2f;
      x[n] = saved + step;
      const double up = loss();
      x[n] = saved - step;
      const double down = loss();
      x[n] = saved;
      const double fd = (up - down) / (double(x[n] + step) - double(x[n] - step));
      EXPECT_NEAR(grad[n], fd, 1e-3 * (1.0 + std::abs(fd))) << name << "[" << n << "]";
    }
  };
  expect_fd(h.q, ref.d_query, "dQ");
  expect_fd(h.k, ref.d_key, "dK");
  expect_fd(h.v, ref.d_value, "dV");
  expect_fd(h.mask_f, ref.d_mask, "dMask");
  // The same for a mask broadcast over heads and rows: its gradient sums theirs.
  Case broadcast = c;
  broadcast.mask_dims = {1, 1, 5}, broadcast.seed = 10;
  Harness hb(broadcast);
  const ReferenceGradients ref_b = reference_backward(hb.bp);
  ASSERT_EQ(ref_b.d_mask.size(), 5u);
  std::swap(h.mask_f, hb.mask_f);  // expect_fd perturbs h; point its problem at the [5] mask
  h.bp.forward.mask = h.mask_f.data();
  h.bp.forward.mask_stride_q = 0;
  const ReferenceGradients ref_h = reference_backward(h.bp);
  expect_fd(h.mask_f, ref_h.d_mask, "dMask [Lk]");
  // The sinks' gradient, a head with none (-inf: its gradient is 0) among them, and rows with
  // nothing to attend (a negative offset), whose output stays zero whatever the sink.
  Case sinks = c;
  sinks.sinks = {0.7f, -kInf}, sinks.offsets = {-1}, sinks.seed = 11;
  Harness hs(sinks);
  const ReferenceGradients ref_s = reference_backward(hs.bp);
  ASSERT_EQ(ref_s.d_sinks.size(), 2u);
  EXPECT_EQ(ref_s.d_sinks[1], 0.0);
  std::swap(h, hs);  // expect_fd perturbs h (and loss() reads it); moves keep each vector's buffer
  expect_fd(h.sinks, ref_s.d_sinks, "dSinks");
  expect_fd(h.q, ref_s.d_query, "dQ with sinks");
  expect_fd(h.v, ref_s.d_value, "dV with sinks");
}

// The float mask's gradient for a mask of each of the 16 broadcast shapes over [B, Hq, Lq, Lk]:
// summed over the broadcast axes, against the reference; blocks of kMaskGradRows rows and
// kMaskGradKeys keys cut by Lq = kMaskGradRows + 5 and Lk = kMaskGradKeys + 45; with causal
// offsets, key lengths (NaN padding), softcap (the mask is added after it: ds, not dr), -inf
// entries and GQA; bitwise the same on 1, 2 and 3 threads. Masks of fewer than 16 blocks of
// their own (a [Lk] mask: 2 blocks) have each block's sum split into parts, added after.
TEST(Backward, MaskGradientOfEveryBroadcastShape) {
  for (int shape = 0; shape < 16; shape++) {
    Case c;
    c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = kMaskGradRows + 5, c.Lk = kMaskGradKeys + 45, c.E = 8, c.Ev = 5;
    const int full[4] = {c.B, c.Hq, c.Lq, c.Lk};
    c.mask_dims.clear();
    for (int a = 0; a < 4; a++) c.mask_dims.push_back(shape >> (3 - a) & 1 ? full[a] : 1);
    c.mask_kind = MaskKind::kFloat, c.mask_block_fraction = 0.1, c.seed = uint32_t(40 + shape);
    c.softcap = shape % 3 == 0 ? 4.0f : 0.0f;
    c.causal = shape % 2 == 0, c.offsets = {c.Lk - c.Lq, 20};
    if (shape % 4 == 1) c.key_lengths = {c.Lk, 100};
    Harness one(c);
    one.run(1);
    one.expect_matches_reference();
    for (int threads : {2, 3}) {
      Harness many(c);
      many.run(threads);
      many.expect_same_bits(one, std::to_string(threads) + " " + c.describe());
    }
  }
}

// Where nothing attends, the mask's gradient is exactly zero: -inf entries, keys past the
// causal frontier or a key length, rows with nothing to attend.
TEST(Backward, MaskGradientIsZeroWhereNothingAttends) {
  Case c;
  c.B = 2, c.Hq = 2, c.Hkv = 1, c.Lq = 6, c.Lk = 20, c.E = 8, c.Ev = 8;
  c.causal = true, c.offsets = {-3, 5};  // batch 0: rows 0..2 attend nothing
  c.key_lengths = {20, 7};
  c.mask_kind = MaskKind::kFloat, c.mask_dims = {2, 2, 6, 20}, c.mask_block_fraction = 0.2, c.seed = 4;
  Harness h(c);
  h.run(1);
  h.expect_matches_reference();
  int zeros = 0;
  for (int b = 0; b < c.B; b++) {
    for (int head = 0; head < c.Hq; head++) {
      for (int i = 0; i < c.Lq; i++) {
        for (int j = 0; j < c.Lk; j++) {
          const size_t n = size_t(((b * c.Hq + head) * c.Lq + i) * c.Lk + j);
          const int limit = std::min(std::max(i + c.offsets[size_t(b)] + 1, 0), c.key_lengths[size_t(b)]);
          if (j < limit && h.mask_f[n] != -kInf) continue;
          EXPECT_PRED1(test::is_plus_zero, h.dm[n]) << b << " " << head << " " << i << " " << j;
          zeros++;
        }
      }
    }
  }
  EXPECT_GT(zeros, c.B * c.Hq * c.Lq * c.Lk / 2);
}

// The forward's log-sum-exp (Problem::logsumexp), on the prefill path and the split-K decode
// path (merged segments), with fully masked rows: against the reference, and bitwise the same
// for any thread count.
TEST(Backward, ForwardLogSumExpOnEveryPath) {
  for (auto [lq, lk] : {std::pair{9, 70}, std::pair{1, 1500}, std::pair{2, 700}}) {
    Case c;
    c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 8, c.causal = true;
    c.offsets = {lk - lq, -lq};  // batch 1: every row attends nothing
    c.mask_kind = MaskKind::kFloat, c.mask_dims = {lk}, c.mask_block_fraction = 0.2;
    Harness one(c);
    one.run(1);
    const std::vector<double> ref = reference_logsumexp(one.bp.forward);
    for (size_t n = 0; n < ref.size(); n++) {
      if (std::isinf(ref[n])) {
        EXPECT_EQ(one.lse[n], -kInf) << n;
      } else {
        EXPECT_NEAR(one.lse[n], ref[n], 1e-5 * (1.0 + std::abs(ref[n]))) << n << " " << c.describe();
      }
    }
    Harness two(c);
    two.run(2);
    EXPECT_EQ(std::memcmp(two.lse.data(), one.lse.data(), one.lse.size() * 4), 0);
  }
}

// Fuzzing findings (tests/fuzz/backward-fuzz.cc): a row's q, dO or lse that is not finite
// reached keys the row does not attend, through 0·Inf and -inf - NaN = NaN.

// dV += pᵀ·dO multiplied p = 0 by a NaN dO (and dK += dsᵀ·(scale·Q) ds = 0 by an Inf q·scale):
// a key the row does not attend got NaN. The row's own dQ may be NaN, nothing else.
TEST(Backward, NonFiniteRowOperandsDoNotReachKeysTheRowDoesNotAttend) {
  for (int threads : {1, 2}) {
    for (int which : {0, 1, 2}) {  // dO row 0 NaN, dO row 0 Inf, scale·q of row 0 overflows
      Case c;
      c.B = 1, c.Hq = 1, c.Hkv = 1, c.Lq = 6, c.Lk = 20, c.E = 8, c.Ev = 8;
      c.causal = true, c.offsets = {0};  // row i attends keys 0..i; keys 6.. no row
      c.seed = uint32_t(11 + which);
      Harness h(c);
      if (which < 2) {
        h.go[h.at(1, 6, 8, 0, 0, 0, 3)] = which == 0 ? kNaN : kInf;
      } else {
        h.bp.forward.scale = 1e30f;
        h.q.assign(h.q.size(), 0.0f);
        h.q[h.at(1, 6, 8, 0, 0, 0, 2)] = 1e9f;  // scale·q = 1e39: Inf in float
      }
      h.run(threads);
      const ReferenceGradients ref = reference_backward(h.bp);
      for (int j = 1; j < c.Lk; j++) {  // keys row 0 does not attend
        for (int d = 0; d < c.E; d++) {
          const size_t n = size_t(j) * c.E + d;
          EXPECT_LE(relative_error(h.dk[h.at(1, 20, 8, 0, 0, j, d)], ref.d_key[n]), kTolerance) << which << " dK " << j;
          EXPECT_LE(relative_error(h.dv[h.at(1, 20, 8, 0, 0, j, d)], ref.d_value[n]), kTolerance) << which << " dV " << j;
          if (j >= c.Lq) {
            EXPECT_PRED1(test::is_plus_zero, h.dk[h.at(1, 20, 8, 0, 0, j, d)]) << which;
            EXPECT_PRED1(test::is_plus_zero, h.dv[h.at(1, 20, 8, 0, 0, j, d)]) << which;
          }
        }
      }
      if (which < 2) {  // rows 1.. attend key 0 too, but their dQ does not involve row 0
        for (int i = 1; i < c.Lq; i++) {
          for (int d = 0; d < c.E; d++) {
            EXPECT_LE(relative_error(h.dq[h.at(1, 6, 8, 0, 0, i, d)], ref.d_query[size_t(i) * c.E + d]), kTolerance)
                << which << " dQ " << i;
          }
        }
      }
    }
  }
}

// A row attending a NaN key has lse = NaN; exp(-inf - NaN) made p NaN for the keys it does
// not attend, and their dK/dV NaN.
TEST(Backward, NaNLogSumExpRowDoesNotReachKeysItDoesNotAttend) {
  for (int threads : {1, 2}) {
    Case c;
    c.B = 1, c.Hq = 1, c.Hkv = 1, c.Lq = 4, c.Lk = 8, c.E = 8, c.Ev = 8;
    c.mask_kind = MaskKind::kBool, c.mask_dims = {4, 8}, c.seed = 5;
    Harness h(c);
    for (int i = 0; i < c.Lq; i++) {  // row 0 attends keys 0, 1; rows 1..3 keys 2..7
      for (int j = 0; j < c.Lk; j++) h.mask_b[size_t(i) * c.Lk + j] = (i == 0) == (j < 2);
    }
    h.k[h.at(1, 8, 8, 0, 0, 0, 5)] = kNaN;  // row 0's score of key 0: NaN, its lse NaN
    h.run(threads);
    EXPECT_TRUE(std::isnan(h.lse[0]));
    const ReferenceGradients ref = reference_backward(h.bp);
    for (int j = 2; j < c.Lk; j++) {
      for (int d = 0; d < c.E; d++) {
        const size_t n = size_t(j) * c.E + d;
        EXPECT_LE(relative_error(h.dk[h.at(1, 8, 8, 0, 0, j, d)], ref.d_key[n]), kTolerance) << "dK " << j;
        EXPECT_LE(relative_error(h.dv[h.at(1, 8, 8, 0, 0, j, d)], ref.d_value[n]), kTolerance) << "dV " << j;
      }
    }
    for (int i = 1; i < c.Lq; i++) {
      for (int d = 0; d < c.E; d++) {
        EXPECT_LE(relative_error(h.dq[h.at(1, 4, 8, 0, 0, i, d)], ref.d_query[size_t(i) * c.E + d]), kTolerance) << "dQ " << i;
      }
    }
  }
}

TEST(Backward, RejectsWhatItDoesNotTake) {
  Case c;
  c.Lq = 2, c.Lk = 3;
  Harness h(c);
  BackwardProblem bad = h.bp;
  bad.grad_output = nullptr;
  EXPECT_EQ(validate_backward(bad), Status::kNullPointer);
  bad = h.bp;
  bad.forward.kv_type = KvType::kFloat16;
  EXPECT_EQ(validate_backward(bad), Status::kBadKvType);
  bad = h.bp;
  bad.dk_stride_l = -1;
  EXPECT_EQ(validate_backward(bad), Status::kBadStride);
  std::vector<float> scratch(1);
  EXPECT_EQ(backward(h.bp, scratch.data(), scratch.size()), Status::kBadScratch);
  // A mask gradient without a float mask: none, or a bool one.
  std::vector<float> dm(6);
  bad = h.bp;
  bad.d_mask = dm.data();
  EXPECT_EQ(validate_backward(bad), Status::kBadMaskGrad);
  Case bool_mask = c;
  bool_mask.mask_kind = MaskKind::kBool, bool_mask.mask_dims = {2, 3};
  Harness hb(bool_mask);
  hb.bp.d_mask = dm.data();
  EXPECT_EQ(validate_backward(hb.bp), Status::kBadMaskGrad);
  // The sinks' gradient without sinks; a NaN sink (the forward's own check).
  std::vector<float> d_sinks(1);
  bad = h.bp;
  bad.d_sinks = d_sinks.data();
  EXPECT_EQ(validate_backward(bad), Status::kNullPointer);
  float sink = kNaN;
  bad.forward.sinks = &sink;
  EXPECT_EQ(validate_backward(bad), Status::kBadSink);
  sink = 1.0f;
  EXPECT_EQ(validate_backward(bad), Status::kOk);
  // A negative count of the mask gradient's parts.
  bad = h.bp;
  bad.mask_grad_parts = -1;
  EXPECT_EQ(validate_backward(bad), Status::kBadMaskGrad);
}

TEST(Backward, MaskGradientPartsGivenByTheCaller) {
  // BackwardProblem::mask_grad_parts: a caller running a call in slices passes the whole call's
  // parts (js/backward.ts). Any count gives the same dQ, dK, dV bits and a d_mask within the
  // tolerance of the reference; the count backward() would choose gives its own bits; counts
  // past the block's row tiles are capped at them. A mask [Hq, Lq, Lk] of 3 batches: 2 blocks,
  // each the sum over 3 batches of 10 row tiles, split by backward() itself into 7 parts.
  Case c;
  c.B = 3, c.Hq = 2, c.Hkv = 1, c.Lq = 37, c.Lk = 150, c.E = 8, c.Ev = 8, c.causal = true, c.offsets = {113};
  c.mask_kind = MaskKind::kFloat, c.mask_dims = {2, 37, 150}, c.mask_block_fraction = 0.1;
  Harness own(c);
  own.run(2);
  own.expect_matches_reference();
  const int32_t chosen = backward_mask_grad_parts(own.bp);
  EXPECT_EQ(chosen, 7);
  for (int32_t parts : {1, 2, chosen, 30, 1000}) {
    Harness given(c);
    given.bp.mask_grad_parts = parts;
    EXPECT_EQ(backward_mask_grad_parts(given.bp), std::min(parts, 30)) << parts;
    given.run(parts % 2 == 0 ? 2 : 1);
    given.expect_matches_reference();
    if (parts == chosen) {
      given.expect_same_bits(own, "the parts backward() chooses");
    } else {
      EXPECT_EQ(std::memcmp(given.dq.data(), own.dq.data(), own.dq.size() * 4), 0) << parts;
      EXPECT_EQ(std::memcmp(given.dk.data(), own.dk.data(), own.dk.size() * 4), 0) << parts;
      EXPECT_EQ(std::memcmp(given.dv.data(), own.dv.data(), own.dv.size() * 4), 0) << parts;
    }
  }
  Harness none(c);
  none.bp.d_mask = nullptr;
  none.bp.mask_grad_parts = 5;
  EXPECT_EQ(backward_mask_grad_parts(none.bp), 1);  // no d_mask: nothing to split
}


// ALiBi (Problem::alibi_slopes): the backward finishes its scores as the forward does (bias =
// mask + alibi, then s + bias), so the forward's lse rebuilds its probabilities; the bias has no
// gradient of its own, d_mask is still ds (the mask is added with it, after the softcap).
TEST(Backward, AlibiTileEdgesCausalOrNotWithMasksSinksAndGqa) {
  // Keys around the 64-key tile, rows around the 4-row tile; MHA and GQA (the heads of a KV
  // group have different slopes); shared slopes on a problem that is not causal (offset
  // bottom-right), then per-batch slopes with per-batch causal offsets, a float mask (d_mask),
  // sinks (d_sinks), softcap; 1 and 2 threads bitwise.
  const int kt = kBackwardKeyTile;
  uint32_t seed = 2000;
  for (auto hh : {std::pair<int, int>{2, 2}, {4, 2}})
    for (int lq : {1, 5, 13})
      for (int lk : {1, kt - 1, kt, kt + 1, 2 * kt + 3})
        for (int variant = 0; variant < 2; variant++) {
          Case c;
          c.B = 2, c.Hq = hh.first, c.Hkv = hh.second, c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 6, c.seed = seed++;
          c.alibi_slopes = test::geometric_slopes(c.Hq), c.offsets = {lk - lq};
          if (variant == 1) {
            c.alibi_slopes = test::per_batch_slopes(c.B, c.Hq);
            c.causal = true, c.offsets = {lk - lq, lk / 2 - lq}, c.softcap = 5.0f, c.sinks = cycling_sinks(c.Hq);
            c.mask_kind = MaskKind::kFloat, c.mask_dims = {c.B, 1, lq, lk}, c.mask_block_fraction = 0.2;
          }
          Harness h(c);
          h.run(1);
          h.expect_matches_reference();
          Harness two(c);
          two.run(2);
          two.expect_same_bits(h, "2 threads " + c.describe());
        }
}

TEST(Backward, AlibiMasksWindowsKeyBoundsAndTheSplitKernels) {
  // Bool and float masks broadcast over heads and rows, a window, key lengths and starts (NaN
  // padding, from the harness), the layout [B, L, H, D]; 1, 2 and 3 threads (the fused kernel,
  // then the dK/dV + dQ split), bitwise.
  uint32_t seed = 2100;
  for (MaskKind kind : {MaskKind::kFloat, MaskKind::kBool})
    for (bool causal : {false, true}) {
      Case c;
      c.B = 2, c.Hq = 6, c.Hkv = 3, c.Lq = 21, c.Lk = 150, c.E = 9, c.Ev = 5, c.seed = seed++, c.bshd = true;
      c.mask_kind = kind, c.mask_dims = {150}, c.mask_block_fraction = 0.2;
      c.causal = causal, c.offsets = {129, 40}, c.window = causal ? 50 : 0;
      c.key_starts = {4, 0}, c.key_lengths = {150, 120};
      c.alibi_slopes = test::per_batch_slopes(c.B, c.Hq);
      Harness one(c);
      one.run(1);
      one.expect_matches_reference();
      for (int threads : {2, 3}) {
        Harness many(c);
        many.run(threads);
        many.expect_same_bits(one, std::to_string(threads) + " threads " + c.describe());
      }
    }
}

TEST(Backward, AlibiRowsFarFromTheirDiagonalRecomputeTheirStatistics) {
  // Not causal, the diagonal 200 keys before key 0 (or 200 past the last): every bias of a row is
  // below -100·slope, so |lse| > kExactLseLimit and the row's maximum and sum are recomputed from
  // the backward's own scores (slope 0: a head whose rows keep their lse).
  for (int offset : {-200, 200 + 70}) {
    Case c;
    c.B = 1, c.Hq = 4, c.Hkv = 2, c.Lq = 9, c.Lk = 70, c.E = 8, c.Ev = 8, c.seed = uint32_t(offset + 1000);
    c.offsets = {offset}, c.alibi_slopes = {1.0f, 0.5f, 0.0f, 0.125f};
    c.mask_kind = MaskKind::kFloat, c.mask_dims = {9, 70};
    Harness h(c);
    h.run(1);
    h.expect_matches_reference();
    int recomputed = 0;
    for (int hd = 0; hd < c.Hq; hd++)
      for (int i = 0; i < c.Lq; i++) {
        const float lse = h.lse[size_t(hd * c.Lq + i)];
        recomputed += sdpa_f32_bwd_row_stats_recomputed(h.bp, 0, hd, i, lse);
      }
    EXPECT_GE(recomputed, 3 * c.Lq) << c.describe();  // the heads with a slope
    Harness two(c);
    two.run(2);
    two.expect_same_bits(h, "2 threads " + c.describe());
  }
}

TEST(Backward, AlibiSlopesOfZeroGiveTheBitsOfNoAlibi) {
  // -(0·d) = -0 added to the mask's bias (or 0): every score keeps its value, so every gradient
  // has the bits of the same problem without ALiBi (and the forward's lse too).
  std::vector<Case> cases(3);
  cases[0].B = 2, cases[0].Hq = 4, cases[0].Hkv = 2, cases[0].Lq = 13, cases[0].Lk = 131, cases[0].E = 8, cases[0].Ev = 6;
  cases[0].causal = true, cases[0].offsets = {118, 3};
  cases[1] = cases[0], cases[1].mask_kind = MaskKind::kFloat, cases[1].mask_dims = {13, 131};
  cases[1].mask_block_fraction = 0.2, cases[1].softcap = 3.0f, cases[1].sinks = cycling_sinks(4);
  cases[2] = cases[0], cases[2].mask_kind = MaskKind::kBool, cases[2].mask_dims = {2, 1, 13, 131};
  cases[2].mask_block_fraction = 0.2, cases[2].window = 40;
  for (Case c : cases) {
    Harness none(c);
    none.run(1);
    none.expect_matches_reference();
    c.alibi_slopes.assign(size_t(c.B) * c.Hq, 0.0f);
    Harness zero(c);
    zero.run(1);
    zero.expect_same_bits(none, "zero slopes " + c.describe());
    EXPECT_EQ(std::memcmp(zero.lse.data(), none.lse.data(), none.lse.size() * 4), 0) << c.describe();
  }
}

// The oracle with ALiBi: reference_backward against central differences of reference_forward's
// loss, with per-batch slopes and offsets, not causal and causal with a float mask.
TEST(Backward, AlibiReferenceGradientsMatchFiniteDifferences) {
  for (bool causal : {false, true}) {
    Case c;
    c.B = 2, c.Hq = 2, c.Hkv = 1, c.Lq = 3, c.Lk = 5, c.E = 3, c.Ev = 2, c.seed = 12;
    c.causal = causal, c.offsets = {1, 3}, c.alibi_slopes = {0.7f, 0.2f, 0.0f, 1.3f};
    if (causal) c.mask_kind = MaskKind::kFloat, c.mask_dims = {3, 5}, c.softcap = 2.0f;
    Harness h(c);
    const ReferenceGradients ref = reference_backward(h.bp);
    auto loss = [&]() {
      const std::vector<double> out = reference_forward(h.bp.forward, nullptr);
      double sum = 0.0;
      for (size_t n = 0; n < out.size(); n++) sum += out[n] * h.go[n];
      return sum;
    };
    auto expect_fd = [&](std::vector<float>& x, const std::vector<double>& grad, const char* name) {
      for (size_t n = 0; n < x.size(); n++) {
        const float saved = x[n], step = 1e-2f;
        x[n] = saved + step;
        const double up = loss();
        x[n] = saved - step;
        const double down = loss();
        x[n] = saved;
        const double fd = (up - down) / (double(saved + step) - double(saved - step));
        EXPECT_NEAR(grad[n], fd, 1e-3 * (1.0 + std::abs(fd))) << name << "[" << n << "] causal " << causal;
      }
    };
    expect_fd(h.q, ref.d_query, "dQ");
    expect_fd(h.k, ref.d_key, "dK");
    expect_fd(h.v, ref.d_value, "dV");
    expect_fd(h.mask_f, ref.d_mask, "dMask");
  }
}

TEST(Backward, AlibiValidateRejectsBadSlopes) {
  Case c;
  c.B = 2, c.Hq = 2, c.Lq = 2, c.Lk = 3, c.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0f};
  Harness h(c);
  EXPECT_EQ(validate_backward(h.bp), Status::kOk);
  std::vector<float> bad = c.alibi_slopes;
  bad[3] = kNaN;  // batch 1's row
  h.bp.forward.alibi_slopes = bad.data();
  EXPECT_EQ(validate_backward(h.bp), Status::kBadAlibi);
  std::vector<float> scratch(backward_scratch_floats(h.bp, 1));
  EXPECT_EQ(backward(h.bp, scratch.data(), scratch.size()), Status::kBadAlibi);
  for (const std::vector<float>* g : {&h.dq, &h.dk, &h.dv}) {
    EXPECT_TRUE(std::all_of(g->begin(), g->end(), [](float x) { return std::isnan(x); })) << "written";
  }
  bad[3] = -1.0f;
  EXPECT_EQ(validate_backward(h.bp), Status::kBadAlibi);
  h.bp.forward.alibi_slopes = c.alibi_slopes.data(), h.bp.forward.alibi_stride_b = -1;
  EXPECT_EQ(validate_backward(h.bp), Status::kBadStride);
}

}  // namespace
}  // namespace sdpa
