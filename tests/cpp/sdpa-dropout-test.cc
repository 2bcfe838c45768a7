// Attention dropout (src/kernels/dropout.h, Problem::dropout_threshold/seed/batch_base) in every
// kernel, against the double-precision reference (reference_forward, reference_backward), which
// draws the mask from the definition with its own plain hash:
//   - the forward's output and weights over tile edges, GQA, Ev != E and every score option, and
//     the decode path (split-K segments, float16 K/V read in order, MHA and GQA);
//   - what the contract says is bitwise: the log-sum-exp is the softmax's own (dropout does not
//     change it), threshold 0 is no dropout whatever the seed, any thread count, a batch computed
//     alone with its place as dropout_batch_base;
//   - the mask's statistics (the kept share, the kept weights = softmax·factor) and the SIMD row
//     (apply_dropout_row) against the scalar definition (dropout_kept, dropout_factor) and a
//     plain hash written here, around 2^31 and the 2^32 wrap of j;
//   - the backward's dQ, dK, dV, dMask and dSinks, packed sequences (each its own batch index);
//   - kBadDropout from every entry point, with nothing written.
// Thresholds are round(q·2^32) for the dropout probabilities q = 0.1, 0.5, 0.9; tolerances are
// the forward and backward tests', times the dropout factor 1/(1 - q) (the kept terms are that
// much larger).
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/dropout.h"
#include "math/f16-f32-cvt-wasmsimd.h"
#include "parallel/thread-pool.h"
#include "reference/sdpa-reference.h"
#include "sdpa-backward.h"
#include "sdpa-packed.h"
#include "sdpa.h"
#include "tiles.h"

#include "attention-test-case.h"

// Packed cases name only the fields they set (designated initializers; the rest keep their defaults).
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace sdpa {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The threshold of dropout probability q, as the JS layer makes it: min(round(q·2^32), 2^32 - 1).
uint32_t threshold_of(double q) {
  const double t = std::round(q * 4294967296.0);
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}

const uint32_t kThresholds[] = {threshold_of(0.1), threshold_of(0.5), threshold_of(0.9)};

// 1 / (1 - threshold/2^32) in double: the reference's factor.
double factor_of(uint32_t threshold) { return 4294967296.0 / (4294967296.0 - static_cast<double>(threshold)); }

// The definition of src/kernels/dropout.h written out once more, plainly, for the checks here.
uint32_t plain_mix(uint32_t x) {
  x = (x ^ (x >> 16)) * 0x85EBCA6Bu;
  x = (x ^ (x >> 13)) * 0xC2B2AE35u;
  return x ^ (x >> 16);
}
bool plain_kept(uint32_t threshold, uint32_t seed, int64_t batch, int64_t h, int64_t i, int64_t j) {
  uint32_t row = plain_mix(seed);
  row = plain_mix(row + static_cast<uint32_t>(batch));
  row = plain_mix(row + static_cast<uint32_t>(h));
  row = plain_mix(row + static_cast<uint32_t>(i));
  return plain_mix(row ^ (static_cast<uint32_t>(j) * 0x9E3779B9u)) >= threshold;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

struct Dropout {
  uint32_t threshold = 0, seed = 0;
  int32_t base = 0;
};

// A test problem (attention-test-case.h) with dropout, weights or not, and K/V as float32 or
// halves (converted from the drawn float32 values; the reference decodes the halves itself).
struct Case : test::AttentionCase {
  Dropout dropout;
  bool weights = true;
  KvType kv_type = KvType::kFloat32;
  bool in_order = false;  // read_kv_in_order

  std::string what() const {
    std::ostringstream s;
    s << describe() << " dropout threshold " << dropout.threshold << " seed " << dropout.seed << " base "
      << dropout.base << (weights ? " weights" : "") << " kv_type" << static_cast<int>(kv_type)
      << (in_order ? " in_order" : "");
    return s.str();
  }
  double factor() const { return factor_of(dropout.threshold); }
};

void set_dropout(const Dropout& d, Problem& p) {
  p.dropout_threshold = d.threshold, p.dropout_seed = d.seed, p.dropout_batch_base = d.base;
}

struct Harness : test::OptionArrays {
  Case c;
  std::vector<float> q, k, v, out, weights, lse;
  std::vector<uint16_t> k_half, v_half;
  Problem p;

  explicit Harness(const Case& cs) : c(cs) {
    test::CaseRandom random(c.seed);
    test::draw_qkv(c, random, q, k, v);
    out.assign(size_t(c.B) * c.Hq * c.Lq * c.Ev, kNaN);  // NaN: every element must be written
    if (c.weights) weights.assign(size_t(c.B) * c.Hq * c.Lq * c.Lk, kNaN);
    lse.assign(size_t(c.B) * c.Hq * c.Lq, kNaN);
    test::set_shapes(c, p);
    p.query = q.data(), p.key = k.data(), p.value = v.data(), p.output = out.data();
    p.weights = c.weights ? weights.data() : nullptr;
    p.logsumexp = lse.data();
    test::set_options(c, random, *this, p);
    set_dropout(c.dropout, p);
    if (is_half(c.kv_type)) {
      k_half.resize(k.size()), v_half.resize(v.size());
      std::transform(k.begin(), k.end(), k_half.begin(), f32_to_f16);
      std::transform(v.begin(), v.end(), v_half.begin(), f32_to_f16);
      p.kv_type = c.kv_type, p.key = k_half.data(), p.value = v_half.data();
    }
    p.read_kv_in_order = c.in_order;
  }

  Status run(ThreadPool* pool = nullptr) {
    std::vector<float> scratch(scratch_floats(p, pool != nullptr ? pool->threads() : 1));
    return forward(p, scratch.data(), scratch.size(), pool);
  }

  float output_at(int b, int h, int i, int e) const {
    return out[size_t(b * p.o_stride_b + h * p.o_stride_h + i * p.o_stride_l + e)];
  }

  // Output: |got - ref| <= tol·(1 + |ref|); weights: |got - ref| <= tol, and exactly +0 where
  // the reference's is 0 (blocked or dropped); lse as the packed tests check it. tol = 2e-5
  // times the dropout factor.
  void expect_matches_reference() const {
    const double tol = 2e-5 * c.factor();
    std::vector<double> ref_w, ref_lse;
    const std::vector<double> ref = reference_forward(p, c.weights ? &ref_w : nullptr, &ref_lse);
    for (int b = 0; b < c.B; b++)
      for (int h = 0; h < c.Hq; h++)
        for (int i = 0; i < c.Lq; i++) {
          for (int e = 0; e < c.Ev; e++) {
            const double r = ref[size_t(((b * c.Hq + h) * c.Lq + i) * c.Ev + e)];
            const float g = output_at(b, h, i, e);
            ASSERT_TRUE(std::isfinite(g) && std::abs(g - r) <= tol * (1.0 + std::abs(r)))
                << c.what() << "\n output[" << b << "," << h << "," << i << "," << e << "] got " << g << " ref " << r;
          }
          const size_t row = size_t((b * c.Hq + h) * c.Lq + i);
          const double want_lse = ref_lse[row];
          if (std::isinf(want_lse)) {
            ASSERT_EQ(lse[row], want_lse) << c.what() << " lse row " << row;
          } else {
            ASSERT_NEAR(lse[row], want_lse, 2e-5 * (1 + std::abs(want_lse))) << c.what() << " lse row " << row;
          }
        }
    for (size_t n = 0; n < ref_w.size(); n++) {
      ASSERT_TRUE(std::isfinite(weights[n]) && std::abs(weights[n] - ref_w[n]) <= tol)
          << c.what() << "\n weights[" << n << "] got " << weights[n] << " ref " << ref_w[n];
      if (ref_w[n] == 0.0) {
        ASSERT_PRED1(test::is_plus_zero, weights[n]) << c.what() << " weights[" << n << "]";
      }
    }
  }
};

void check(const Case& c) {
  Harness h(c);
  ASSERT_EQ(h.run(), Status::kOk) << c.what();
  h.expect_matches_reference();
}

// ---------------------------------------------------------------------------------------
// 1. The forward against the reference.
// ---------------------------------------------------------------------------------------

TEST(DropoutForward, OutputAndWeightsAroundTileEdges) {
  // Keys: 1, a key group - 1, a group, a group + 1, a key tile - 1, a tile, a tile + 1, a prime
  // past two tiles; rows: 1, a row tile - 1, a tile, a tile + 1, 37. Each at three probabilities,
  // with the dimensions cycling through E = Ev, Ev != E and odd sizes.
  const std::pair<int, int> dims[] = {{8, 8}, {5, 3}, {16, 9}, {4, 7}};
  uint32_t seed = 1;
  int n = 0;
  for (int lk : {1, 7, 8, 9, 511, 512, 513, 1031})
    for (int lq : {1, 3, 4, 5, 37})
      for (uint32_t threshold : kThresholds) {
        Case c;
        c.B = 2, c.Hq = 2, c.Hkv = 1, c.Lq = lq, c.Lk = lk;
        c.E = dims[n % 4].first, c.Ev = dims[n % 4].second, n++;
        c.seed = seed++;
        c.dropout = {threshold, 0x9E37u * seed + 11u, 0};
        check(c);
      }
}

TEST(DropoutForward, GroupedHeadsValueDimsLayoutsAndEveryOption) {
  auto base = [] {
    Case c;
    c.B = 2, c.Hq = 8, c.Hkv = 2, c.Lq = 37, c.Lk = 513, c.E = 64, c.Ev = 40;
    return c;
  };
  std::vector<Case> cases;
  cases.push_back(base());
  {  // odd head sizes, Lq > Lk, [B, L, H, E]
    Case c = base();
    c.Lq = 45, c.Lk = 11, c.E = 5, c.Ev = 3, c.bshd = true;
    cases.push_back(c);
  }
  {  // causal with per-batch offsets (top-left and bottom-right)
    Case c = base();
    c.causal = true, c.offsets = {0, 513 - 37};
    cases.push_back(c);
  }
  {  // a float mask broadcast over the heads, with blocked entries
    Case c = base();
    c.mask_kind = MaskKind::kFloat, c.mask_dims = {2, 1, 37, 513}, c.mask_block_fraction = 0.2;
    cases.push_back(c);
  }
  {  // a bool mask [Lk] (broadcast over batch, heads and rows)
    Case c = base();
    c.mask_kind = MaskKind::kBool, c.mask_dims = {513}, c.mask_block_fraction = 0.3;
    cases.push_back(c);
  }
  {  // key lengths and starts
    Case c = base();
    c.key_lengths = {400, 513}, c.key_starts = {3, 100};
    cases.push_back(c);
  }
  {  // sliding window
    Case c = base();
    c.causal = true, c.offsets = {513 - 37}, c.window = 70;
    cases.push_back(c);
  }
  {  // sinks and softcap
    Case c = base();
    c.sinks = test::cycling_sinks(8), c.softcap = 5.0f;
    cases.push_back(c);
  }
  {  // ALiBi per batch, not causal (the offset places the diagonal), with a float mask
    Case c = base();
    c.offsets = {476, 10}, c.alibi_slopes = test::per_batch_slopes(2, 8);
    c.mask_kind = MaskKind::kFloat, c.mask_dims = {37, 513}, c.mask_block_fraction = 0.1;
    cases.push_back(c);
  }
  {  // everything at once, MHA, no weights
    Case c = base();
    c.Hq = 3, c.Hkv = 3, c.Lq = 20, c.Lk = 1031, c.E = 24, c.Ev = 17, c.weights = false;
    c.causal = true, c.offsets = {1011, 500}, c.window = 600, c.key_lengths = {1031, 900}, c.key_starts = {0, 7};
    c.sinks = test::cycling_sinks(3), c.alibi_slopes = test::geometric_slopes(3), c.softcap = 20.0f;
    c.mask_kind = MaskKind::kBool, c.mask_dims = {2, 3, 1, 1031}, c.mask_block_fraction = 0.1;
    cases.push_back(c);
  }
  uint32_t seed = 100;
  for (const Case& shape : cases)
    for (uint32_t threshold : kThresholds) {
      Case c = shape;
      c.seed = seed++;
      c.dropout = {threshold, seed * 2654435761u, 0};
      check(c);
    }
  // The extreme thresholds: 1 (factor 1.0f, almost nothing dropped) and 2^32 - 1 (factor 2^32,
  // almost everything dropped), and a batch base.
  for (uint32_t threshold : {1u, 0xFFFFFFFFu}) {
    Case c = cases[2];
    c.seed = seed++;
    c.dropout = {threshold, 12345u, 7};
    check(c);
  }
}

// ---------------------------------------------------------------------------------------
// 2. The decode path: K/V read in place, split-K segments, float16 read in order.
// ---------------------------------------------------------------------------------------

TEST(DropoutDecode, SplitKSegmentsFloat32AndHalvesInOrderMhaAndGqa) {
  uint32_t seed = 200;
  int n = 0;
  for (int lk : {1500, 4096})
    for (auto heads : {std::pair<int, int>{4, 4}, {8, 2}})
      for (KvType kv_type : {KvType::kFloat32, KvType::kFloat16, KvType::kFloat16Finite})
        for (bool in_order : {false, true})
          for (bool weights : {false, true}) {
            Case c;
            c.B = 2, c.Hq = heads.first, c.Hkv = heads.second, c.Lq = 1, c.Lk = lk, c.E = 64, c.Ev = 64;
            c.kv_type = kv_type, c.in_order = in_order, c.weights = weights;
            c.seed = seed++;
            c.dropout = {kThresholds[n++ % 3], 77u + seed, 0};
            if (n % 4 == 0) c.causal = true, c.offsets = {lk - 1, lk - 300}, c.key_lengths = {lk, lk - 200};
            Harness h(c);
            ASSERT_TRUE(reads_keys_in_place(h.p)) << c.what();
            ASSERT_GT(segment_count(h.p), 1) << c.what();
            ASSERT_EQ(h.run(), Status::kOk) << c.what();
            h.expect_matches_reference();
          }
  // The streamed decode of one (batch, KV head): forward()'s bits.
  for (int group : {1, 8}) {
    Case c;
    c.Hq = group, c.Lq = 1, c.Lk = 1300, c.E = 20, c.Ev = 13, c.weights = false, c.seed = seed++;
    c.dropout = {kThresholds[1], 5u, 3};
    Harness h(c);
    ASSERT_EQ(h.run(), Status::kOk);
    h.expect_matches_reference();
    Problem streamed = h.p;
    streamed.logsumexp = nullptr;
    const std::vector<float> out = test::run_streamed(streamed, h.k, h.v, h.out.size());
    EXPECT_TRUE(same_bits(out, h.out)) << c.what();
  }
}

// Halves without Inf/NaN (a float16 cache's) are read as value·2^-112 with the probabilities
// times 2^112 where that stays finite (F16FiniteScaledElements): a kept p·z can reach the
// factor z, and z·2^112 overflows from z = 2^16 on (a keep share of 2^-16 or less), which once
// made the output Inf (found by the sdpa fuzzer: threshold 4294908699, a key with p near 1).
// Here each head's key kDominant scores far above the rest (K row = 8·q, so p = 1 - 1e-6 or
// so), and the seed is the first one (from 1000, by the plain hash above) keeping that key in
// some head: factors just below 2^16, at it, the fuzzer's and 2^20; the decode (MHA, one row
// per KV head, as a float16 cache's), V read in order or not. Finite and the reference's.
TEST(DropoutDecode, KeptKeyWithPNearOneAndFactorsFrom2To16OnStaysFinite) {
  constexpr int kDominant = 1234;
  const uint32_t thresholds[] = {0xFFFFFFFFu - 0x10000u,  // keep 2^-16 + 2^-32: z just below 2^16
                                 0xFFFFFFFFu - 0xFFFFu,   // keep 2^-16: z = 2^16
                                 4294908699u,             // the fuzzer's: z ≈ 73298
                                 0xFFFFFFFFu - 0x0FFFu};  // keep 2^-20: z = 2^20
  uint32_t case_seed = 900;
  for (uint32_t threshold : thresholds)
    for (bool in_order : {false, true}) {
      Case c;
      c.B = 1, c.Hq = 8, c.Hkv = 8, c.Lq = 1, c.Lk = 2048, c.E = 64, c.Ev = 64;
      c.kv_type = KvType::kFloat16Finite, c.in_order = in_order, c.seed = case_seed++;
      c.dropout = {threshold, 0, 0};
      Harness h(c);
      for (int hd = 0; hd < c.Hq; hd++) {
        for (int e = 0; e < c.E; e++) {
          const size_t at = (size_t(hd) * c.Lk + kDominant) * c.E + e;
          h.k[at] = 8.0f * h.q[size_t(hd) * c.E + e];  // a half's 11 bits: 8·q rounded
          h.k_half[at] = f32_to_f16(h.k[at]);
        }
      }
      uint32_t seed = 1000;
      auto kept_somewhere = [&](uint32_t s) {
        for (int hd = 0; hd < c.Hq; hd++)
          if (plain_kept(threshold, s, 0, hd, 0, kDominant)) return true;
        return false;
      };
      while (!kept_somewhere(seed)) seed++;
      h.c.dropout.seed = h.p.dropout_seed = seed;
      ASSERT_EQ(h.run(), Status::kOk) << h.c.what();
      h.expect_matches_reference();
      int dominant_kept = 0;
      for (int hd = 0; hd < c.Hq; hd++) {
        const float w = h.weights[size_t(hd) * c.Lk + kDominant];
        if (w > 0.0f) {
          dominant_kept++;
          EXPECT_GT(w, 0.99 * h.c.factor()) << h.c.what() << " head " << hd << ": p·z, p near 1";
        }
      }
      EXPECT_GT(dominant_kept, 0) << h.c.what();
    }
}

// ---------------------------------------------------------------------------------------
// 3. The log-sum-exp is the softmax's own; threshold 0 is no dropout.
// ---------------------------------------------------------------------------------------

TEST(DropoutForward, LogSumExpIsTheSoftmaxsOwnAndThresholdZeroIsNoDropout) {
  std::vector<Case> cases;
  {
    Case c;
    c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = 37, c.Lk = 600, c.E = 16, c.Ev = 12, c.causal = true, c.offsets = {563};
    cases.push_back(c);
  }
  {
    Case c;  // decode split-K with weights, sinks
    c.B = 2, c.Hq = 8, c.Hkv = 2, c.Lq = 1, c.Lk = 2100, c.E = 32, c.Ev = 32, c.sinks = test::cycling_sinks(8);
    cases.push_back(c);
  }
  {
    Case c;  // float16 MHA decode in order: the interleaved streams without dropout (below)
    c.B = 1, c.Hq = 2, c.Hkv = 2, c.Lq = 1, c.Lk = 4096, c.E = 64, c.Ev = 64, c.weights = false;
    c.kv_type = KvType::kFloat16, c.in_order = true;
    cases.push_back(c);
  }
  for (const Case& shape : cases) {
    Harness none(shape);
    ASSERT_EQ(none.run(), Status::kOk) << shape.what();
    // Float16 MHA decode read in order takes the keys of whole groups of tiles interleaved
    // without dropout, and in order with it (interleaved_first_key): the same sum, added in
    // another order, so there the log-sum-exp is the same within rounding, not bitwise.
    const bool interleaved = is_half(shape.kv_type) && shape.in_order && shape.Hq == shape.Hkv;
    for (uint32_t threshold : kThresholds) {
      Case c = shape;
      c.dropout = {threshold, 99u, 0};
      Harness h(c);
      ASSERT_EQ(h.run(), Status::kOk) << c.what();
      if (interleaved) {
        for (size_t n = 0; n < h.lse.size(); n++) EXPECT_NEAR(h.lse[n], none.lse[n], 1e-6 * (1 + std::abs(none.lse[n])));
      } else {
        EXPECT_TRUE(same_bits(h.lse, none.lse)) << c.what();
      }
      EXPECT_FALSE(same_bits(h.out, none.out)) << c.what();
    }
    for (uint32_t seed : {0u, 1u, 0xDEADBEEFu, 0xFFFFFFFFu})
      for (int32_t base : {0, 1, INT32_MAX - 2}) {
        Case c = shape;
        c.dropout = {0, seed, base};
        Harness h(c);
        ASSERT_EQ(h.run(), Status::kOk) << c.what();
        EXPECT_TRUE(same_bits(h.out, none.out)) << c.what();
        EXPECT_TRUE(same_bits(h.weights, none.weights)) << c.what();
        EXPECT_TRUE(same_bits(h.lse, none.lse)) << c.what();
      }
  }
}

// ---------------------------------------------------------------------------------------
// 4. Threads: the same bits.
// ---------------------------------------------------------------------------------------

TEST(DropoutThreads, OneAndTwoThreadsGiveTheSameBitsForward) {
  // Above the size under which forward() stays on the calling thread.
  std::vector<Case> cases;
  {
    Case c;  // prefill, split by blocks of rows
    c.B = 2, c.Hq = 6, c.Hkv = 2, c.Lq = 200, c.Lk = 300, c.E = 16, c.Ev = 9, c.causal = true, c.offsets = {-3};
    c.sinks = test::cycling_sinks(6);
    cases.push_back(c);
  }
  {
    Case c;  // decode, split-K, no weights
    c.Hq = 8, c.Hkv = 2, c.Lq = 1, c.Lk = 8000, c.E = 64, c.Ev = 64, c.weights = false;
    cases.push_back(c);
  }
  {
    Case c;  // decode, split-K with the weights pass, halves in order
    c.B = 2, c.Hq = 4, c.Hkv = 4, c.Lq = 1, c.Lk = 5000, c.E = 64, c.Ev = 64, c.kv_type = KvType::kFloat16;
    c.in_order = true;
    cases.push_back(c);
  }
  ThreadPool pool(2);
  uint32_t seed = 300;
  for (const Case& shape : cases)
    for (uint32_t threshold : kThresholds) {
      Case c = shape;
      c.seed = seed++;
      c.dropout = {threshold, seed, 0};
      Harness one(c), two(c);
      ASSERT_EQ(one.run(), Status::kOk) << c.what();
      one.expect_matches_reference();
      for (int repeat = 0; repeat < 2; repeat++) {
        ASSERT_EQ(two.run(&pool), Status::kOk) << c.what();
        EXPECT_TRUE(same_bits(one.out, two.out)) << c.what();
        EXPECT_TRUE(same_bits(one.weights, two.weights)) << c.what();
        EXPECT_TRUE(same_bits(one.lse, two.lse)) << c.what();
      }
    }
}

// ---------------------------------------------------------------------------------------
// 5. dropout_batch_base: a batch alone draws the call's mask; rows draw different masks.
// ---------------------------------------------------------------------------------------

// Batch b of h's problem as a problem of its own: the same arrays from batch b on, batch 1,
// dropout_batch_base = the problem's + b. Output, weights and lse into the given buffers.
Problem batch_alone(const Harness& h, int b, std::vector<float>& out, std::vector<float>& weights, std::vector<float>& lse) {
  const Case& c = h.c;
  Problem one = h.p;
  one.batch = 1;
  one.query += b * h.p.q_stride_b;
  const size_t elem = is_half(h.p.kv_type) ? 2 : 4;
  one.key = static_cast<const char*>(h.p.key) + size_t(b * h.p.k_stride_b) * elem;
  one.value = static_cast<const char*>(h.p.value) + size_t(b * h.p.v_stride_b) * elem;
  out.assign(size_t(c.Hq) * c.Lq * c.Ev, kNaN);
  one.output = out.data();  // dense [B, H, L, D]: batch 0 of the same strides
  weights.assign(c.weights ? size_t(c.Hq) * c.Lq * c.Lk : 0, kNaN);
  one.weights = c.weights ? weights.data() : nullptr;
  lse.assign(size_t(c.Hq) * c.Lq, kNaN);
  one.logsumexp = lse.data();
  if (h.p.mask != nullptr) {
    const size_t mask_elem = h.p.mask_kind == MaskKind::kFloat ? 4 : 1;
    one.mask = static_cast<const char*>(h.p.mask) + size_t(b * h.p.mask_stride_b) * mask_elem;
  }
  if (h.p.causal_offsets != nullptr) one.causal_offsets = h.p.causal_offsets + b;
  if (h.p.key_lengths != nullptr) one.key_lengths = h.p.key_lengths + b;
  if (h.p.key_starts != nullptr) one.key_starts = h.p.key_starts + b;
  if (h.p.alibi_slopes != nullptr) one.alibi_slopes = h.p.alibi_slopes + b * h.p.alibi_stride_b;
  one.dropout_batch_base = h.p.dropout_batch_base + b;
  return one;
}

// Elements [from, from + n) of x.
std::vector<float> slice(const std::vector<float>& x, size_t from, size_t n) {
  return std::vector<float>(x.begin() + static_cast<std::ptrdiff_t>(from), x.begin() + static_cast<std::ptrdiff_t>(from + n));
}

TEST(DropoutBatchBase, ABatchAloneWithItsPlaceAsBaseGivesTheCallsBits) {
  std::vector<Case> cases;
  {
    Case c;  // prefill, every per-batch option
    c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = 37, c.Lk = 300, c.E = 16, c.Ev = 12, c.causal = true, c.offsets = {263, 100};
    c.key_lengths = {300, 250}, c.key_starts = {0, 5}, c.alibi_slopes = test::per_batch_slopes(2, 4);
    c.mask_kind = MaskKind::kFloat, c.mask_dims = {2, 1, 37, 300}, c.mask_block_fraction = 0.1;
    cases.push_back(c);
  }
  {
    Case c;  // decode split-K with weights
    c.B = 2, c.Hq = 8, c.Hkv = 2, c.Lq = 1, c.Lk = 1500, c.E = 32, c.Ev = 32;
    cases.push_back(c);
  }
  {
    Case c;  // float16 MHA decode in order
    c.B = 2, c.Hq = 2, c.Hkv = 2, c.Lq = 1, c.Lk = 2100, c.E = 64, c.Ev = 64, c.weights = false;
    c.kv_type = KvType::kFloat16, c.in_order = true;
    cases.push_back(c);
  }
  for (const Case& shape : cases)
    for (int32_t base : {0, 5}) {
      Case c = shape;
      c.dropout = {kThresholds[1], 4242u, base};
      Harness h(c);
      ASSERT_EQ(h.run(), Status::kOk) << c.what();
      h.expect_matches_reference();
      std::vector<float> out, weights, lse;
      const Problem one = batch_alone(h, 1, out, weights, lse);
      EXPECT_EQ(one.dropout_batch_base, base + 1);
      std::vector<float> scratch(scratch_floats(one));
      ASSERT_EQ(forward(one, scratch.data(), scratch.size()), Status::kOk) << c.what();
      EXPECT_TRUE(same_bits(out, slice(h.out, out.size(), out.size()))) << c.what();
      EXPECT_TRUE(same_bits(weights, slice(h.weights, weights.size(), weights.size()))) << c.what();
      EXPECT_TRUE(same_bits(lse, slice(h.lse, lse.size(), lse.size()))) << c.what();
      // With the base of batch 0 instead, batch 1's data draw batch 0's mask: other bits.
      Problem wrong = one;
      wrong.dropout_batch_base = base;
      ASSERT_EQ(forward(wrong, scratch.data(), scratch.size()), Status::kOk) << c.what();
      EXPECT_FALSE(same_bits(out, slice(h.out, out.size(), out.size()))) << c.what();
    }
}

// The keys whose weight is 0 in row (b, h, i) of h's weights.
std::vector<int> dropped_keys(const Harness& h, int b, int hd, int i) {
  std::vector<int> keys;
  const float* row = h.weights.data() + size_t(((b * h.c.Hq + hd) * h.c.Lq + i) * h.c.Lk);
  for (int j = 0; j < h.c.Lk; j++) {
    if (row[j] == 0.0f) keys.push_back(j);
  }
  return keys;
}

TEST(DropoutBatchBase, RowsHeadsBatchesSeedsAndBasesDrawDifferentMasks) {
  Case c;
  c.B = 2, c.Hq = 2, c.Hkv = 1, c.Lq = 2, c.Lk = 512, c.E = 8, c.Ev = 8;
  c.dropout = {kThresholds[1], 1u, 0};
  Harness h(c);
  ASSERT_EQ(h.run(), Status::kOk);
  h.expect_matches_reference();
  const std::vector<int> first = dropped_keys(h, 0, 0, 0);
  EXPECT_GT(first.size(), 200u);  // about half of 512
  EXPECT_LT(first.size(), 312u);
  // Each index moved alone: another mask.
  EXPECT_NE(first, dropped_keys(h, 0, 0, 1));
  EXPECT_NE(first, dropped_keys(h, 0, 1, 0));
  EXPECT_NE(first, dropped_keys(h, 1, 0, 0));
  EXPECT_NE(dropped_keys(h, 0, 1, 1), dropped_keys(h, 1, 1, 1));
  // Another seed, another base: another mask of the same row; every dropped key as the
  // definition says.
  for (Dropout d : {Dropout{kThresholds[1], 2u, 0}, Dropout{kThresholds[1], 1u, 1}}) {
    Case other = c;
    other.dropout = d;
    Harness g(other);
    ASSERT_EQ(g.run(), Status::kOk);
    EXPECT_NE(first, dropped_keys(g, 0, 0, 0)) << other.what();
    for (int b = 0; b < c.B; b++)
      for (int hd = 0; hd < c.Hq; hd++)
        for (int i = 0; i < c.Lq; i++)
          for (int j = 0; j < c.Lk; j++) {
            const bool kept = g.weights[size_t(((b * c.Hq + hd) * c.Lq + i) * c.Lk + j)] != 0.0f;
            ASSERT_EQ(kept, plain_kept(d.threshold, d.seed, d.base + b, hd, i, j)) << other.what();
          }
  }
}

// Bases near INT32_MAX: the call's batch index base + b is an int32 (validate() refuses a base
// with base + B - 1 past INT32_MAX; packed: base + S - 1), and at the limit the kernels draw the
// definition's mask (no signed overflow: UBSan would abort).
TEST(DropoutBatchBase, BasesAtTheInt32LimitAreTakenAndPastItRefused) {
  Case c;
  c.B = 3, c.Hq = 2, c.Hkv = 1, c.Lq = 5, c.Lk = 40, c.E = 8, c.Ev = 8;
  for (int32_t base : {INT32_MAX - 2, INT32_MAX - 1, INT32_MAX}) {
    c.dropout = {kThresholds[1], 31u, base};
    Harness h(c);
    const Status want = base <= INT32_MAX - 2 ? Status::kOk : Status::kBadDropout;
    EXPECT_EQ(validate(h.p), want) << c.what();
    ASSERT_EQ(h.run(), want) << c.what();
    if (want == Status::kOk) h.expect_matches_reference();
    Problem one = h.p;  // batch 1 alone at the limit
    one.batch = 1;
    one.dropout_batch_base = INT32_MAX;
    EXPECT_EQ(validate(one), Status::kOk);
  }
}

// One KV group of h's problem, (batch b, KV head g), as a problem of its own, the way
// js/strategies.ts streams a call one (batch, KV head) at a time: its query heads' rows against
// its K/V, batch 1 and one KV head, dropout_batch_base = b and dropout_head_base = its first
// query head. Output, weights and lse dense, into the given buffers.
Problem kv_group_alone(const Harness& h, int b, int g, std::vector<float>& out, std::vector<float>& weights,
                       std::vector<float>& lse) {
  const Case& c = h.c;
  const int group = c.Hq / c.Hkv, first = g * group;
  Problem one = h.p;
  one.batch = 1, one.q_heads = group, one.kv_heads = 1;
  one.query += b * h.p.q_stride_b + first * h.p.q_stride_h;
  const size_t elem = is_half(h.p.kv_type) ? 2 : 4;
  one.key = static_cast<const char*>(h.p.key) + size_t(b * h.p.k_stride_b + g * h.p.k_stride_h) * elem;
  one.value = static_cast<const char*>(h.p.value) + size_t(b * h.p.v_stride_b + g * h.p.v_stride_h) * elem;
  out.assign(size_t(group) * c.Lq * c.Ev, kNaN);
  one.output = out.data(), one.o_stride_b = 0, one.o_stride_h = int64_t(c.Lq) * c.Ev, one.o_stride_l = c.Ev;
  weights.assign(c.weights ? size_t(group) * c.Lq * c.Lk : 0, kNaN);
  one.weights = c.weights ? weights.data() : nullptr;
  lse.assign(size_t(group) * c.Lq, kNaN);
  one.logsumexp = lse.data();
  if (h.p.mask != nullptr) {
    const size_t mask_elem = h.p.mask_kind == MaskKind::kFloat ? 4 : 1;
    one.mask = static_cast<const char*>(h.p.mask) + size_t(b * h.p.mask_stride_b + first * h.p.mask_stride_h) * mask_elem;
  }
  if (h.p.causal_offsets != nullptr) one.causal_offsets = h.p.causal_offsets + b;
  if (h.p.sinks != nullptr) one.sinks = h.p.sinks + first;
  if (h.p.alibi_slopes != nullptr) one.alibi_slopes = h.p.alibi_slopes + b * h.p.alibi_stride_b + first;
  one.dropout_batch_base = h.p.dropout_batch_base + b;
  one.dropout_head_base = h.p.dropout_head_base + first;
  return one;
}

TEST(DropoutHeadBase, AKvGroupAloneWithItsPlaceAsBasesGivesTheCallsBits) {
  std::vector<Case> cases;
  {
    Case c;  // prefill: GQA, causal, a float mask per head, sinks, ALiBi per batch
    c.B = 2, c.Hq = 8, c.Hkv = 2, c.Lq = 37, c.Lk = 300, c.E = 16, c.Ev = 12, c.causal = true, c.offsets = {263, 100};
    c.mask_kind = MaskKind::kFloat, c.mask_dims = {8, 37, 300}, c.mask_block_fraction = 0.1;
    c.sinks = test::cycling_sinks(8), c.alibi_slopes = test::per_batch_slopes(2, 8);
    cases.push_back(c);
  }
  {
    Case c;  // decode split-K with weights, GQA
    c.B = 2, c.Hq = 8, c.Hkv = 2, c.Lq = 1, c.Lk = 1500, c.E = 32, c.Ev = 32;
    cases.push_back(c);
  }
  {
    Case c;  // float16 MHA decode in order
    c.B = 1, c.Hq = 3, c.Hkv = 3, c.Lq = 1, c.Lk = 2100, c.E = 64, c.Ev = 64, c.weights = false;
    c.kv_type = KvType::kFloat16, c.in_order = true;
    cases.push_back(c);
  }
  for (const Case& shape : cases) {
    Case c = shape;
    c.dropout = {kThresholds[1], 777u, 0};
    Harness h(c);
    ASSERT_EQ(h.run(), Status::kOk) << c.what();
    h.expect_matches_reference();
    const int group = c.Hq / c.Hkv;
    const int b = c.B - 1, g = c.Hkv - 1, first = g * group;
    std::vector<float> out, weights, lse;
    const Problem one = kv_group_alone(h, b, g, out, weights, lse);
    EXPECT_EQ(one.dropout_head_base, first);
    std::vector<float> scratch(scratch_floats(one));
    ASSERT_EQ(forward(one, scratch.data(), scratch.size()), Status::kOk) << c.what();
    for (int hd = 0; hd < group; hd++) {
      const size_t row = size_t(b * c.Hq + first + hd) * c.Lq;
      EXPECT_TRUE(same_bits(slice(out, size_t(hd) * c.Lq * c.Ev, size_t(c.Lq) * c.Ev), slice(h.out, row * c.Ev, size_t(c.Lq) * c.Ev)))
          << c.what() << " head " << hd;
      EXPECT_TRUE(same_bits(slice(lse, size_t(hd) * c.Lq, c.Lq), slice(h.lse, row, c.Lq))) << c.what();
      if (c.weights) {
        EXPECT_TRUE(same_bits(slice(weights, size_t(hd) * c.Lq * c.Lk, size_t(c.Lq) * c.Lk),
                              slice(h.weights, row * c.Lk, size_t(c.Lq) * c.Lk))) << c.what();
      }
    }
    // Without the head base, the group's heads draw heads 0.. instead: other bits.
    Problem wrong = one;
    wrong.dropout_head_base = 0;
    ASSERT_EQ(forward(wrong, scratch.data(), scratch.size()), Status::kOk) << c.what();
    const size_t row = size_t(b * c.Hq + first) * c.Lq;
    EXPECT_FALSE(same_bits(slice(out, 0, size_t(c.Lq) * c.Ev), slice(h.out, row * c.Ev, size_t(c.Lq) * c.Ev))) << c.what();
  }
}

// Head and row bases (a few query heads, or a few rows of one, computed alone: js/slices.ts):
// row i of head h of batch b draws the mask of (b, head base + h, row base + i); near INT32_MAX,
// base + Hq - 1 and base + Lq - 1 must be int32s, and past that the problem is refused with
// nothing written.
TEST(DropoutBases, HeadAndRowBasesDrawTheirPlaceInTheCallAndPastTheInt32LimitAreRefused) {
  Case c;
  c.B = 2, c.Hq = 3, c.Hkv = 1, c.Lq = 5, c.Lk = 40, c.E = 8, c.Ev = 8;
  struct Base {
    const char* name;
    int32_t count;  // Hq or Lq: base + count - 1 is the last index drawn
    int32_t Problem::*field;
  };
  for (const Base& which : {Base{"head", c.Hq, &Problem::dropout_head_base}, Base{"row", c.Lq, &Problem::dropout_row_base}}) {
    for (int32_t base : {0, 3, 1000, -1, INT32_MIN, INT32_MAX - (which.count - 1), INT32_MAX - (which.count - 2)}) {
      const std::string what = std::string(which.name) + " base " + std::to_string(base);
      c.dropout = {kThresholds[1], 31u, 0};
      Harness h(c);
      h.p.*which.field = base;
      const Status want = base >= 0 && base <= INT32_MAX - (which.count - 1) ? Status::kOk : Status::kBadDropout;
      EXPECT_EQ(validate(h.p), want) << what;
      std::fill(h.out.begin(), h.out.end(), kNaN);
      ASSERT_EQ(h.run(), want) << what;
      if (want != Status::kOk) {
        EXPECT_TRUE(std::all_of(h.out.begin(), h.out.end(), [](float x) { return std::isnan(x); })) << what << ": written on refusal";
        continue;
      }
      for (int b = 0; b < c.B; b++)
        for (int hd = 0; hd < c.Hq; hd++)
          for (int i = 0; i < c.Lq; i++)
            for (int j = 0; j < c.Lk; j++) {
              const bool kept = h.weights[size_t(((b * c.Hq + hd) * c.Lq + i) * c.Lk + j)] != 0.0f;
              ASSERT_EQ(kept, plain_kept(kThresholds[1], 31u, b, int64_t(h.p.dropout_head_base) + hd,
                                         int64_t(h.p.dropout_row_base) + i, j)) << what;
            }
    }
  }
}

// ---------------------------------------------------------------------------------------
// 6. Statistics.
// ---------------------------------------------------------------------------------------

TEST(DropoutStatistics, KeptShareIsOneMinusPAndKeptWeightsAreTheSoftmaxTimesTheFactor) {
  // p = 0.3 over 2·4·64·256 = 131072 (b, h, i, j), none blocked.
  Case c;
  c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = 64, c.Lk = 256, c.E = 16, c.Ev = 8;
  Harness none(c);
  ASSERT_EQ(none.run(), Status::kOk);
  c.dropout = {threshold_of(0.3), 0xC0FFEEu, 0};
  Harness h(c);
  ASSERT_EQ(h.run(), Status::kOk);
  h.expect_matches_reference();
  const float factor = dropout_factor(h.p);
  EXPECT_EQ(factor, static_cast<float>(1.0 / 0.7));
  size_t kept = 0;
  for (int b = 0; b < c.B; b++)
    for (int hd = 0; hd < c.Hq; hd++)
      for (int i = 0; i < c.Lq; i++) {
        const uint32_t row = dropout_row(h.p, b, hd, i);
        for (int j = 0; j < c.Lk; j++) {
          const size_t n = size_t(((b * c.Hq + hd) * c.Lq + i) * c.Lk + j);
          ASSERT_GT(none.weights[n], 0.0f);  // attended, and not flushed
          const bool is_kept = h.weights[n] != 0.0f;
          ASSERT_EQ(is_kept, dropout_kept(h.p, row, j)) << "b" << b << " h" << hd << " i" << i << " j" << j;
          ASSERT_EQ(is_kept, plain_kept(h.p.dropout_threshold, h.p.dropout_seed, b, hd, i, j));
          if (!is_kept) continue;
          kept++;
          ASSERT_NEAR(h.weights[n], double(none.weights[n]) * factor, 4e-7 * none.weights[n] * factor) << n;
        }
      }
  const double total = double(c.B) * c.Hq * c.Lq * c.Lk, share = double(kept) / total;
  const double sigma = std::sqrt(0.7 * 0.3 / total);
  EXPECT_LE(std::abs(share - 0.7), 5 * sigma) << "kept " << kept << " of " << total;
}

// ---------------------------------------------------------------------------------------
// 7. The SIMD row against the scalar definition.
// ---------------------------------------------------------------------------------------

TEST(DropoutDefinition, SimdRowEqualsTheScalarKeptAndFactorAroundTheWrapOfJ) {
  const uint32_t thresholds[] = {1u, 0x80000000u, 0xFFFFFFFFu, threshold_of(0.3)};
  const int64_t two31 = int64_t{1} << 31, two32 = int64_t{1} << 32;
  const int64_t starts[] = {0, 1, 3, 4, 508, two31 - 9, two31 - 4, two31 - 1, two31, two31 + 2,
                            two32 - 9, two32 - 4, two32 - 1, two32, two32 + 5, 3 * two32 - 2};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Problem p;
  for (uint32_t threshold : thresholds) {
    p.dropout_threshold = threshold;
    const float factor = dropout_factor(p);
    EXPECT_EQ(factor, static_cast<float>(factor_of(threshold)));
    std::vector<uint32_t> rows = {0u, 1u, 0xFFFFFFFFu, 0x9E3779B9u};
    for (int n = 0; n < 60; n++) rows.push_back(rng());
    size_t kept = 0, total = 0;
    for (uint32_t row : rows)
      for (int64_t j0 : starts)
        for (int cols : {4, 8, 36, 512}) {
          alignas(16) float probs[512], got[512];
          for (int c = 0; c < cols; c++) probs[c] = c % 17 == 5 ? kNaN : c % 23 == 7 ? 0.0f : u(rng);
          std::memcpy(got, probs, sizeof(float) * size_t(cols));
          apply_dropout_row(p, row, j0, cols, factor, got);
          for (int c = 0; c < cols; c++) {
            const int64_t j = j0 + c;
            const bool is_kept = dropout_kept(p, row, j);
            // The definition, plainly: bits(j) = mix(row + uint32(j)·step), j mod 2^32.
            ASSERT_EQ(is_kept, plain_mix(row ^ (static_cast<uint32_t>(j) * 0x9E3779B9u)) >= threshold);
            const float want = is_kept ? probs[c] * factor : 0.0f;
            ASSERT_EQ(0, std::memcmp(&want, &got[c], 4))
                << "threshold " << threshold << " row " << row << " j " << j << ": " << got[c] << " want " << want;
            kept += is_kept, total++;
          }
        }
    // The kept share is near 1 - threshold/2^32 (loosely: these keys are few and correlated).
    const double share = double(kept) / double(total), want = 1.0 - double(threshold) / 4294967296.0;
    EXPECT_NEAR(share, want, 0.02) << "threshold " << threshold;
  }
  // The factor of the extreme thresholds, and of 2^31 exactly 2.
  p.dropout_threshold = 0x80000000u;
  EXPECT_EQ(dropout_factor(p), 2.0f);
  p.dropout_threshold = 0xFFFFFFFFu;
  EXPECT_EQ(dropout_factor(p), 4294967296.0f);
  p.dropout_threshold = 1u;
  EXPECT_EQ(dropout_factor(p), 1.0f);
}

TEST(DropoutDefinition, RowHashIsTheChainOfFinalisersOverSeedBatchHeadAndRow) {
  EXPECT_EQ(dropout_mix(0u), 0u);
  std::mt19937 rng(5);
  Problem p;
  for (int n = 0; n < 2000; n++) {
    p.dropout_seed = rng();
    p.dropout_batch_base = static_cast<int32_t>(rng() % 1000);
    p.dropout_head_base = static_cast<int32_t>(rng() % 1000);
    p.dropout_row_base = n % 2 == 0 ? 0 : static_cast<int32_t>(rng() % 100000);
    const int32_t b = static_cast<int32_t>(rng() % 64), h = static_cast<int32_t>(rng() % 64);
    const int32_t i = static_cast<int32_t>(rng() % 100000);
    const uint32_t x = rng();
    ASSERT_EQ(dropout_mix(x), plain_mix(x));
    uint32_t row = plain_mix(plain_mix(plain_mix(plain_mix(p.dropout_seed) + uint32_t(p.dropout_batch_base + b)) +
                                       uint32_t(p.dropout_head_base + h)) + uint32_t(p.dropout_row_base + i));
    ASSERT_EQ(dropout_row(p, b, h, i), row);
  }
}

// ---------------------------------------------------------------------------------------
// 8. The backward against the reference; packed sequences.
// ---------------------------------------------------------------------------------------

struct BackwardHarness : test::OptionArrays {
  Case c;
  std::vector<float> q, k, v, out, lse, go, dq, dk, dv, dm, ds;
  BackwardProblem bp;

  explicit BackwardHarness(const Case& cs) : c(cs) {
    Problem& p = bp.forward;
    test::CaseRandom random(c.seed);
    test::draw_qkv(c, random, q, k, v);
    random.fill(go, size_t(c.B) * c.Hq * c.Lq * c.Ev, 1.0f);
    out.assign(size_t(c.B) * c.Hq * c.Lq * c.Ev, kNaN);
    lse.assign(size_t(c.B) * c.Hq * c.Lq, kNaN);
    test::set_shapes(c, p);
    // dO, dQ, dK, dV in the case's layout, as Q, K, V and O.
    bp.go_stride_b = p.o_stride_b, bp.go_stride_h = p.o_stride_h, bp.go_stride_l = p.o_stride_l;
    bp.dq_stride_b = p.q_stride_b, bp.dq_stride_h = p.q_stride_h, bp.dq_stride_l = p.q_stride_l;
    bp.dk_stride_b = p.k_stride_b, bp.dk_stride_h = p.k_stride_h, bp.dk_stride_l = p.k_stride_l;
    bp.dv_stride_b = p.v_stride_b, bp.dv_stride_h = p.v_stride_h, bp.dv_stride_l = p.v_stride_l;
    p.query = q.data(), p.key = k.data(), p.value = v.data(), p.output = out.data();
    p.logsumexp = lse.data();
    bp.logsumexp = lse.data(), bp.grad_output = go.data();
    test::set_options(c, random, *this, p);
    set_dropout(c.dropout, p);
    // Padding past each batch's key length and before its first key holds NaN: it must not
    // reach any gradient.
    for (int b = 0; b < c.B; b++)
      for (int h = 0; h < c.Hkv; h++)
        for (int j = 0; j < c.Lk; j++) {
          const bool padding = (!c.key_lengths.empty() && j >= c.key_lengths[size_t(b)]) ||
                               (!c.key_starts.empty() && j < c.key_starts[size_t(b)]);
          if (!padding) continue;
          for (int d = 0; d < c.E; d++) k[size_t(b * p.k_stride_b + h * p.k_stride_h + j * p.k_stride_l + d)] = kNaN;
          for (int d = 0; d < c.Ev; d++) v[size_t(b * p.v_stride_b + h * p.v_stride_h + j * p.v_stride_l + d)] = kNaN;
        }
  }

  // forward (O and lse), then backward, on `threads` threads, into fresh NaN-filled gradients.
  void run(int threads) {
    std::unique_ptr<ThreadPool> pool = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
    std::vector<float> scratch(scratch_floats(bp.forward, threads));
    ASSERT_EQ(forward(bp.forward, scratch.data(), scratch.size(), pool.get()), Status::kOk) << c.what();
    dq.assign(q.size(), kNaN), dk.assign(k.size(), kNaN), dv.assign(v.size(), kNaN);
    bp.d_query = dq.data(), bp.d_key = dk.data(), bp.d_value = dv.data();
    if (c.mask_kind == MaskKind::kFloat) {
      dm.assign(mask_f.size(), kNaN);
      bp.d_mask = dm.data();
    }
    if (!c.sinks.empty()) {
      ds.assign(c.sinks.size(), kNaN);
      bp.d_sinks = ds.data();
    }
    std::vector<float> bwd_scratch(backward_scratch_floats(bp, threads));
    ASSERT_EQ(backward(bp, bwd_scratch.data(), bwd_scratch.size(), pool.get()), Status::kOk) << c.what();
  }

  // max relative_error of a gradient in the case's layout (H heads, L rows, D columns) against
  // the dense reference.
  double error(const std::vector<float>& got, const std::vector<double>& ref, int H, int L, int D) const {
    int64_t sb, sh, sl;
    test::set_strides(c.bshd, H, L, D, &sb, &sh, &sl);
    double worst = 0.0;
    for (int b = 0; b < c.B; b++)
      for (int h = 0; h < H; h++)
        for (int l = 0; l < L; l++)
          for (int d = 0; d < D; d++) {
            worst = std::max(worst, test::relative_error(got[size_t(b * sb + h * sh + l * sl + d)],
                                                         ref[size_t(((int64_t(b) * H + h) * L + l) * D + d)]));
          }
    return worst;
  }

  // The backward test's tolerance (1e-4) times the dropout factor.
  void expect_matches_reference() const {
    const double tol = 1e-4 * c.factor();
    const ReferenceGradients ref = reference_backward(bp);
    EXPECT_LE(error(dq, ref.d_query, c.Hq, c.Lq, c.E), tol) << "dQ " << c.what();
    EXPECT_LE(error(dk, ref.d_key, c.Hkv, c.Lk, c.E), tol) << "dK " << c.what();
    EXPECT_LE(error(dv, ref.d_value, c.Hkv, c.Lk, c.Ev), tol) << "dV " << c.what();
    ASSERT_EQ(ref.d_mask.size(), dm.size()) << c.what();
    double worst = 0.0;
    for (size_t n = 0; n < dm.size(); n++) worst = std::max(worst, test::relative_error(dm[n], ref.d_mask[n]));
    EXPECT_LE(worst, tol) << "dMask " << c.what();
    ASSERT_EQ(ref.d_sinks.size(), ds.size()) << c.what();
    for (size_t h = 0; h < ds.size(); h++) {
      EXPECT_LE(test::relative_error(ds[h], ref.d_sinks[h]), tol) << "dSinks[" << h << "] " << c.what();
    }
  }

  void expect_same_bits(const BackwardHarness& o) const {
    EXPECT_TRUE(same_bits(dq, o.dq)) << "dQ " << c.what();
    EXPECT_TRUE(same_bits(dk, o.dk)) << "dK " << c.what();
    EXPECT_TRUE(same_bits(dv, o.dv)) << "dV " << c.what();
    EXPECT_TRUE(same_bits(dm, o.dm)) << "dMask " << c.what();
    EXPECT_TRUE(same_bits(ds, o.ds)) << "dSinks " << c.what();
  }
};

void check_backward(const Case& c) {
  BackwardHarness h(c);
  h.run(1);
  h.expect_matches_reference();
}

TEST(DropoutBackward, TileEdgesOfKeysAndRows) {
  const int kt = kBackwardKeyTile;
  uint32_t seed = 400;
  int n = 0;
  for (int lk : {1, 7, kKeyGroup, kKeyGroup + 1, kt - 1, kt, kt + 1, 2 * kt + 3})
    for (int lq : {1, kQueryTile - 1, kQueryTile, kQueryTile + 1, 13}) {
      Case c;
      c.Lq = lq, c.Lk = lk, c.E = 8, c.Ev = 8, c.seed = seed++;
      c.dropout = {kThresholds[n++ % 3], seed, 0};
      check_backward(c);
    }
}

TEST(DropoutBackward, GqaValueDimsCausalMasksSinksAlibiSoftcap) {
  std::vector<Case> cases;
  {
    Case c;  // GQA, Ev != E, both layouts below
    c.B = 2, c.Hq = 8, c.Hkv = 2, c.Lq = 13, c.Lk = 70, c.E = 64, c.Ev = 40;
    cases.push_back(c);
    c.bshd = true, c.E = 5, c.Ev = 3;
    cases.push_back(c);
  }
  {
    Case c;  // causal with offsets, window, key lengths and starts (NaN padding)
    c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = 30, c.Lk = 140, c.E = 16, c.Ev = 24, c.causal = true, c.offsets = {110, 40};
    c.window = 50, c.key_lengths = {140, 120}, c.key_starts = {0, 9};
    cases.push_back(c);
  }
  {
    Case c;  // a float mask broadcast over heads, with its gradient; softcap
    c.B = 2, c.Hq = 4, c.Hkv = 1, c.Lq = 9, c.Lk = 100, c.E = 12, c.Ev = 7, c.softcap = 4.0f;
    c.mask_kind = MaskKind::kFloat, c.mask_dims = {2, 1, 9, 100}, c.mask_block_fraction = 0.2;
    cases.push_back(c);
  }
  {
    Case c;  // a float mask [Lk] (summed over batch, heads and rows), sinks with their gradient
    c.B = 2, c.Hq = 5, c.Hkv = 1, c.Lq = 6, c.Lk = 129, c.E = 8, c.Ev = 8, c.sinks = test::cycling_sinks(5);
    c.mask_kind = MaskKind::kFloat, c.mask_dims = {129}, c.mask_block_fraction = 0.1;
    cases.push_back(c);
  }
  {
    Case c;  // ALiBi per batch, a bool mask, sinks
    c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = 11, c.Lk = 90, c.E = 16, c.Ev = 16, c.offsets = {79, 3};
    c.alibi_slopes = test::per_batch_slopes(2, 4), c.sinks = test::cycling_sinks(4);
    c.mask_kind = MaskKind::kBool, c.mask_dims = {11, 90}, c.mask_block_fraction = 0.2;
    cases.push_back(c);
  }
  uint32_t seed = 500;
  for (const Case& shape : cases)
    for (uint32_t threshold : kThresholds) {
      Case c = shape;
      c.seed = seed++;
      c.dropout = {threshold, seed * 7u, 2};
      check_backward(c);
    }
}

TEST(DropoutThreads, OneAndTwoThreadsGiveTheSameBitsBackward) {
  // One (batch, KV head) pair or two: on 2 threads the split dK/dV and dQ kernels (the fused one
  // on 1), and the mask gradient's own pass; above the size forward() splits.
  std::vector<Case> cases;
  {
    Case c;
    c.B = 1, c.Hq = 4, c.Hkv = 2, c.Lq = 100, c.Lk = 150, c.E = 16, c.Ev = 12, c.causal = true, c.offsets = {50};
    c.sinks = test::cycling_sinks(4);
    c.mask_kind = MaskKind::kFloat, c.mask_dims = {4, 100, 150}, c.mask_block_fraction = 0.1;
    cases.push_back(c);
  }
  {
    Case c;
    c.B = 1, c.Hq = 1, c.Hkv = 1, c.Lq = 300, c.Lk = 400, c.E = 24, c.Ev = 24, c.softcap = 10.0f;
    cases.push_back(c);
  }
  uint32_t seed = 600;
  for (const Case& shape : cases)
    for (uint32_t threshold : kThresholds) {
      Case c = shape;
      c.seed = seed++;
      c.dropout = {threshold, seed, 0};
      BackwardHarness one(c), two(c);
      one.run(1);
      one.expect_matches_reference();
      two.run(2);
      one.expect_same_bits(two);
    }
}

TEST(DropoutBatchBase, ABatchsGradientsAloneWithItsPlaceAsBaseAreTheCallsBits) {
  Case c;
  c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = 9, c.Lk = 70, c.E = 8, c.Ev = 8, c.causal = true, c.offsets = {61, 20};
  c.dropout = {kThresholds[1], 17u, 0};
  BackwardHarness whole(c);
  whole.run(1);
  whole.expect_matches_reference();
  // Batch 1 alone: its own arrays (dense [1, H, L, D]: the same strides), base 1.
  Case one_case = c;
  one_case.B = 1, one_case.offsets = {20};
  one_case.dropout.base = 1;
  BackwardHarness one(one_case);
  auto second_half = [](std::vector<float>& dst, const std::vector<float>& src) {
    dst.assign(src.begin() + static_cast<std::ptrdiff_t>(src.size() / 2), src.end());
  };
  second_half(one.q, whole.q), second_half(one.k, whole.k), second_half(one.v, whole.v), second_half(one.go, whole.go);
  one.bp.forward.query = one.q.data(), one.bp.forward.key = one.k.data(), one.bp.forward.value = one.v.data();
  one.bp.grad_output = one.go.data();
  one.run(1);
  one.expect_matches_reference();
  EXPECT_TRUE(same_bits(one.out, slice(whole.out, one.out.size(), one.out.size())));
  EXPECT_TRUE(same_bits(one.lse, slice(whole.lse, one.lse.size(), one.lse.size())));
  EXPECT_TRUE(same_bits(one.dq, slice(whole.dq, one.dq.size(), one.dq.size())));
  EXPECT_TRUE(same_bits(one.dk, slice(whole.dk, one.dk.size(), one.dk.size())));
  EXPECT_TRUE(same_bits(one.dv, slice(whole.dv, one.dv.size(), one.dv.size())));
}

// Packed sequences [T, H, D] with dropout: sequence s draws the mask of batch base + s. Each
// sequence against the reference of its own dense problem with dropout_batch_base = base + s
// (forward and backward), and bitwise forward() of it alone; 1 and 2 threads the same bits.
struct PackedDropoutCase {
  int Hq = 2, Hkv = 1, E = 8, Ev = 8;
  std::vector<int32_t> q_lens, k_lens;  // k_lens empty: q_lens
  bool causal = false;
  std::vector<int32_t> offsets;         // empty: 0; S: per sequence
  int32_t window = 0;
  float softcap = 0.0f;
  std::vector<float> sinks;
  std::vector<float> alibi;             // [S, Hq] or empty
  Dropout dropout;
  uint32_t seed = 1;
};

std::vector<int32_t> starts_of(const std::vector<int32_t>& lens) {
  std::vector<int32_t> starts(lens.size() + 1, 0);
  std::partial_sum(lens.begin(), lens.end(), starts.begin() + 1);
  return starts;
}

// Rows [first, first + rows) of a packed [T, H, D] tensor, dense [H, rows, D].
std::vector<float> unpack(const std::vector<float>& x, int32_t first, int32_t rows, int H, int D) {
  std::vector<float> out(size_t(H) * rows * D);
  for (int32_t i = 0; i < rows; i++)
    for (int h = 0; h < H; h++)
      for (int d = 0; d < D; d++) out[(size_t(h) * rows + i) * D + d] = x[(size_t(first + i) * H + h) * D + d];
  return out;
}

void check_packed(const PackedDropoutCase& c) {
  const std::vector<int32_t>& k_lens = c.k_lens.empty() ? c.q_lens : c.k_lens;
  const std::vector<int32_t> q_starts = starts_of(c.q_lens), k_starts = starts_of(k_lens);
  const int32_t Tq = q_starts.back(), Tk = k_starts.back(), S = int32_t(c.q_lens.size());
  const double factor = factor_of(c.dropout.threshold);
  test::CaseRandom random(c.seed);
  std::vector<float> q, k, v, go;
  random.fill(q, size_t(Tq) * c.Hq * c.E, 1.0f);
  random.fill(k, size_t(Tk) * c.Hkv * c.E, 1.0f);
  random.fill(v, size_t(Tk) * c.Hkv * c.Ev, 1.0f);
  random.fill(go, size_t(Tq) * c.Hq * c.Ev, 1.0f);
  std::vector<int32_t> offsets = c.offsets;
  std::vector<float> sinks = c.sinks, alibi = c.alibi;
  PackedProblem pp;
  Problem& w = pp.whole;
  w.batch = 1, w.q_heads = c.Hq, w.kv_heads = c.Hkv, w.q_len = Tq, w.kv_len = Tk, w.head_dim = c.E, w.value_dim = c.Ev;
  w.q_stride_h = c.E, w.q_stride_l = int64_t(c.Hq) * c.E;
  w.k_stride_h = c.E, w.k_stride_l = int64_t(c.Hkv) * c.E;
  w.v_stride_h = c.Ev, w.v_stride_l = int64_t(c.Hkv) * c.Ev;
  w.o_stride_h = c.Ev, w.o_stride_l = int64_t(c.Hq) * c.Ev;
  w.scale = 1.0f / std::sqrt(float(c.E));
  w.softcap = c.softcap, w.causal = c.causal, w.sliding_window = c.window;
  if (!offsets.empty()) w.causal_offsets = offsets.data();
  if (!sinks.empty()) w.sinks = sinks.data();
  if (!alibi.empty()) w.alibi_slopes = alibi.data(), w.alibi_stride_b = c.Hq;
  set_dropout(c.dropout, w);
  pp.sequences = S, pp.q_starts = q_starts.data(), pp.k_starts = k_starts.data();
  float none = 0.0f;
  auto at = [&none](std::vector<float>& x) { return x.empty() ? &none : x.data(); };

  // Forward on 1 and 2 threads.
  std::vector<float> out(size_t(Tq) * c.Hq * c.Ev, kNaN), lse(size_t(c.Hq) * Tq, kNaN);
  w.query = at(q), w.key = at(k), w.value = at(v), w.output = at(out), w.logsumexp = at(lse);
  {
    std::vector<float> scratch(packed_scratch_floats(pp, 1));
    ASSERT_EQ(forward_packed(pp, scratch.data(), scratch.size()), Status::kOk);
    ThreadPool pool(2);
    PackedProblem two = pp;
    std::vector<float> out2(out.size(), kNaN), lse2(lse.size(), kNaN);
    two.whole.output = at(out2), two.whole.logsumexp = at(lse2);
    std::vector<float> scratch2(packed_scratch_floats(two, 2));
    ASSERT_EQ(forward_packed(two, scratch2.data(), scratch2.size(), &pool), Status::kOk);
    EXPECT_TRUE(same_bits(out, out2));
    EXPECT_TRUE(same_bits(lse, lse2));
  }
  // Backward on 1 and 2 threads.
  PackedBackwardProblem pb;
  pb.whole.forward = w;
  pb.whole.forward.logsumexp = nullptr;
  pb.whole.logsumexp = at(lse), pb.whole.grad_output = at(go);
  pb.whole.go_stride_h = c.Ev, pb.whole.go_stride_l = int64_t(c.Hq) * c.Ev;
  pb.whole.dq_stride_h = c.E, pb.whole.dq_stride_l = int64_t(c.Hq) * c.E;
  pb.whole.dk_stride_h = c.E, pb.whole.dk_stride_l = int64_t(c.Hkv) * c.E;
  pb.whole.dv_stride_h = c.Ev, pb.whole.dv_stride_l = int64_t(c.Hkv) * c.Ev;
  pb.sequences = S, pb.q_starts = q_starts.data(), pb.k_starts = k_starts.data();
  struct Grads {
    std::vector<float> dq, dk, dv, ds;
  };
  auto run_backward = [&](int threads) {
    Grads g;
    g.dq.assign(q.size(), kNaN), g.dk.assign(k.size(), kNaN), g.dv.assign(v.size(), kNaN);
    PackedBackwardProblem b = pb;
    b.whole.d_query = at(g.dq), b.whole.d_key = at(g.dk), b.whole.d_value = at(g.dv);
    if (!sinks.empty()) {
      g.ds.assign(sinks.size(), kNaN);
      b.whole.d_sinks = g.ds.data();
    }
    std::unique_ptr<ThreadPool> pool = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
    std::vector<float> scratch(packed_backward_scratch_floats(b, threads));
    EXPECT_EQ(backward_packed(b, scratch.data(), scratch.size(), pool.get()), Status::kOk);
    return g;
  };
  const Grads grads = run_backward(1), grads2 = run_backward(2);
  EXPECT_TRUE(same_bits(grads.dq, grads2.dq) && same_bits(grads.dk, grads2.dk) && same_bits(grads.dv, grads2.dv) &&
              same_bits(grads.ds, grads2.ds));

  // Each sequence alone, dense [1, H, L, D].
  std::vector<double> sink_sum(sinks.size(), 0.0);
  int dropped = 0;
  for (int32_t s = 0; s < S; s++) {
    const int32_t Lq = c.q_lens[size_t(s)], Lk = k_lens[size_t(s)], q0 = q_starts[size_t(s)], k0 = k_starts[size_t(s)];
    std::vector<float> oq = unpack(q, q0, Lq, c.Hq, c.E), ok = unpack(k, k0, Lk, c.Hkv, c.E),
                       ov = unpack(v, k0, Lk, c.Hkv, c.Ev), ogo = unpack(go, q0, Lq, c.Hq, c.Ev);
    const std::vector<float> packed_out = unpack(out, q0, Lq, c.Hq, c.Ev), packed_dq = unpack(grads.dq, q0, Lq, c.Hq, c.E),
                             packed_dk = unpack(grads.dk, k0, Lk, c.Hkv, c.E),
                             packed_dv = unpack(grads.dv, k0, Lk, c.Hkv, c.Ev);
    if (Lq == 0 || Lk == 0) {  // zeros: dQ of rows without keys, dK/dV of keys without rows
      for (float x : packed_dq) EXPECT_PRED1(test::is_plus_zero, x);
      for (float x : packed_dk) EXPECT_PRED1(test::is_plus_zero, x);
      for (float x : packed_dv) EXPECT_PRED1(test::is_plus_zero, x);
      continue;
    }
    test::AttentionCase shape;
    shape.Hq = c.Hq, shape.Hkv = c.Hkv, shape.Lq = Lq, shape.Lk = Lk, shape.E = c.E, shape.Ev = c.Ev;
    Problem one;
    test::set_shapes(shape, one);
    one.softcap = c.softcap, one.causal = c.causal, one.sliding_window = c.window;
    one.causal_offset = offsets.empty() ? 0 : offsets[size_t(s)];
    one.sinks = sinks.empty() ? nullptr : sinks.data();
    if (!alibi.empty()) one.alibi_slopes = alibi.data() + s * c.Hq;
    one.dropout_threshold = c.dropout.threshold, one.dropout_seed = c.dropout.seed;
    one.dropout_batch_base = c.dropout.base + s;
    std::vector<float> oo(size_t(c.Hq) * Lq * c.Ev, kNaN), olse(size_t(c.Hq) * Lq, kNaN);
    one.query = oq.data(), one.key = ok.data(), one.value = ov.data(), one.output = oo.data(), one.logsumexp = olse.data();
    std::vector<double> ref_w;
    const std::vector<double> ref = reference_forward(one, &ref_w);
    for (double x : ref_w) dropped += x == 0.0;
    for (size_t n = 0; n < ref.size(); n++) {
      ASSERT_NEAR(packed_out[n], ref[n], 2e-5 * factor * (1 + std::abs(ref[n]))) << "sequence " << s << " output " << n;
    }
    std::vector<float> scratch(scratch_floats(one));
    ASSERT_EQ(forward(one, scratch.data(), scratch.size()), Status::kOk);
    EXPECT_TRUE(same_bits(oo, packed_out)) << "sequence " << s;
    BackwardProblem ob;
    ob.forward = one;
    ob.logsumexp = olse.data(), ob.grad_output = ogo.data();
    ob.go_stride_b = one.o_stride_b, ob.go_stride_h = one.o_stride_h, ob.go_stride_l = one.o_stride_l;
    const ReferenceGradients g = reference_backward(ob);
    const double tol = 1e-4 * factor;
    for (size_t n = 0; n < g.d_query.size(); n++) ASSERT_LE(test::relative_error(packed_dq[n], g.d_query[n]), tol) << "dQ " << s;
    for (size_t n = 0; n < g.d_key.size(); n++) ASSERT_LE(test::relative_error(packed_dk[n], g.d_key[n]), tol) << "dK " << s;
    for (size_t n = 0; n < g.d_value.size(); n++) ASSERT_LE(test::relative_error(packed_dv[n], g.d_value[n]), tol) << "dV " << s;
    for (size_t h = 0; h < sink_sum.size(); h++) sink_sum[h] += g.d_sinks[h];
  }
  for (size_t h = 0; h < sink_sum.size(); h++) EXPECT_LE(test::relative_error(grads.ds[h], sink_sum[h]), 1e-4 * factor);
  EXPECT_GT(dropped, 0);
}

TEST(DropoutPacked, EachSequenceDrawsItsOwnBatchsMaskForwardAndBackward) {
  for (uint32_t threshold : kThresholds)
    for (int32_t base : {0, 3}) {
      const Dropout d{threshold, 0xABCDu + threshold % 97u, base};
      check_packed({.q_lens = {1, 3, 63, 0, 64, 5, 65, 17}, .dropout = d, .seed = 1});
      check_packed({.Hq = 4, .Hkv = 2, .E = 16, .Ev = 24, .q_lens = {31, 1, 2, 97}, .causal = true,
                    .offsets = {0, 0, 1, 0}, .dropout = d, .seed = 2});
      check_packed({.Hq = 3, .Hkv = 1, .E = 5, .Ev = 7, .q_lens = {1, 7, 0, 4, 13}, .k_lens = {29, 0, 3, 70, 13},
                    .causal = true, .offsets = {28, 0, 0, 66, 0}, .window = 9, .softcap = 4.0f,
                    .sinks = test::cycling_sinks(3), .alibi = test::per_batch_slopes(5, 3), .dropout = d, .seed = 3});
    }
  // Long sequences split over the pool beside short ones side by side.
  check_packed({.Hq = 4, .Hkv = 2, .E = 16, .Ev = 16, .q_lens = {3, 300, 1, 250}, .causal = true,
                .offsets = {0, 0, 0, 0}, .dropout = {kThresholds[2], 8u, 1}, .seed = 4});
}

// ---------------------------------------------------------------------------------------
// 9. kBadDropout, with nothing written.
// ---------------------------------------------------------------------------------------

bool all_nan(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float f) { return std::isnan(f); });
}

TEST(DropoutValidate, NegativeBatchBaseIsRefusedByEveryEntryPointAndNothingIsWritten) {
  for (uint32_t threshold : {0u, kThresholds[1]})
    for (int32_t base : {-1, -7, INT32_MIN}) {
      const std::string what = "threshold " + std::to_string(threshold) + " base " + std::to_string(base);
      // forward(), validate(), the streamed calls.
      Case c;
      c.B = 2, c.Hq = 2, c.Hkv = 1, c.Lq = 3, c.Lk = 600, c.E = 8, c.Ev = 8;
      c.dropout = {threshold, 1u, base};
      Harness h(c);
      EXPECT_EQ(validate(h.p), Status::kBadDropout) << what;
      EXPECT_EQ(h.run(), Status::kBadDropout) << what;
      EXPECT_TRUE(all_nan(h.out) && all_nan(h.weights) && all_nan(h.lse)) << what;
      Problem pair = h.p;
      pair.batch = 1, pair.weights = nullptr, pair.logsumexp = nullptr, pair.q_len = 1;
      std::vector<float> partials(segment_partials_floats(pair), kNaN), scratch(segment_scratch_floats(pair));
      EXPECT_EQ(forward_segment(pair, 0, partials.data(), scratch.data(), scratch.size()), Status::kBadDropout) << what;
      EXPECT_EQ(merge_segments(pair, partials.data()), Status::kBadDropout) << what;
      EXPECT_TRUE(all_nan(partials) && all_nan(h.out)) << what;
      // backward(), validate_backward().
      BackwardHarness bh(c);
      bh.bp.forward.dropout_batch_base = 0;
      bh.run(1);  // a valid forward and backward first: O and lse
      bh.bp.forward.dropout_batch_base = base;
      std::fill(bh.dq.begin(), bh.dq.end(), kNaN), std::fill(bh.dk.begin(), bh.dk.end(), kNaN);
      std::fill(bh.dv.begin(), bh.dv.end(), kNaN);
      EXPECT_EQ(validate_backward(bh.bp), Status::kBadDropout) << what;
      std::vector<float> bwd_scratch(backward_scratch_floats(bh.bp, 1));
      EXPECT_EQ(backward(bh.bp, bwd_scratch.data(), bwd_scratch.size()), Status::kBadDropout) << what;
      EXPECT_TRUE(all_nan(bh.dq) && all_nan(bh.dk) && all_nan(bh.dv)) << what;
      // The packed entry points.
      const std::vector<int32_t> q_starts = {0, 2, 5}, k_starts = {0, 4, 9};
      std::vector<float> pq(5 * 2 * 8, 0.5f), pk(9 * 8, 0.25f), pv(9 * 8, 1.0f), pout(5 * 2 * 8, kNaN), plse(2 * 5, kNaN);
      PackedProblem pp;
      Problem& w = pp.whole;
      w.batch = 1, w.q_heads = 2, w.kv_heads = 1, w.q_len = 5, w.kv_len = 9, w.head_dim = 8, w.value_dim = 8;
      w.q_stride_h = 8, w.q_stride_l = 16, w.k_stride_h = 8, w.k_stride_l = 8, w.v_stride_h = 8, w.v_stride_l = 8;
      w.o_stride_h = 8, w.o_stride_l = 16, w.scale = 0.25f;
      w.query = pq.data(), w.key = pk.data(), w.value = pv.data(), w.output = pout.data(), w.logsumexp = plse.data();
      set_dropout(c.dropout, w);
      pp.sequences = 2, pp.q_starts = q_starts.data(), pp.k_starts = k_starts.data();
      EXPECT_EQ(validate_packed(pp), Status::kBadDropout) << what;
      std::vector<float> pscratch(1 << 14);
      EXPECT_EQ(forward_packed(pp, pscratch.data(), pscratch.size()), Status::kBadDropout) << what;
      EXPECT_TRUE(all_nan(pout) && all_nan(plse)) << what;
      std::vector<float> pgo(pout.size(), 1.0f), pdq(pq.size(), kNaN), pdk(pk.size(), kNaN), pdv(pv.size(), kNaN);
      PackedBackwardProblem pb;
      pb.whole.forward = w;
      pb.whole.forward.logsumexp = nullptr;
      pb.whole.logsumexp = plse.data(), pb.whole.grad_output = pgo.data();
      pb.whole.go_stride_h = 8, pb.whole.go_stride_l = 16, pb.whole.dq_stride_h = 8, pb.whole.dq_stride_l = 16;
      pb.whole.dk_stride_h = 8, pb.whole.dk_stride_l = 8, pb.whole.dv_stride_h = 8, pb.whole.dv_stride_l = 8;
      pb.whole.d_query = pdq.data(), pb.whole.d_key = pdk.data(), pb.whole.d_value = pdv.data();
      pb.sequences = 2, pb.q_starts = q_starts.data(), pb.k_starts = k_starts.data();
      EXPECT_EQ(validate_packed_backward(pb), Status::kBadDropout) << what;
      EXPECT_EQ(backward_packed(pb, pscratch.data(), pscratch.size()), Status::kBadDropout) << what;
      EXPECT_TRUE(all_nan(pdq) && all_nan(pdk) && all_nan(pdv)) << what;
      // The same packed problem with a base whose last sequence's batch index passes INT32_MAX.
      if (base == -1) {
        pp.whole.dropout_batch_base = INT32_MAX;  // sequence 1: INT32_MAX + 1
        EXPECT_GT(packed_scratch_floats(pp, 2), 0u);  // sized before validation: no overflow (UBSan)
        EXPECT_EQ(validate_packed(pp), Status::kBadDropout) << what;
        EXPECT_EQ(forward_packed(pp, pscratch.data(), pscratch.size()), Status::kBadDropout) << what;
        EXPECT_TRUE(all_nan(pout)) << what;
        pb.whole.forward.dropout_batch_base = INT32_MAX;
        EXPECT_GT(packed_backward_scratch_floats(pb, 2), 0u);
        EXPECT_EQ(validate_packed_backward(pb), Status::kBadDropout) << what;
        EXPECT_EQ(backward_packed(pb, pscratch.data(), pscratch.size()), Status::kBadDropout) << what;
        EXPECT_TRUE(all_nan(pdq) && all_nan(pdk) && all_nan(pdv)) << what;
        pp.whole.dropout_batch_base = INT32_MAX - 1;  // sequence 1: INT32_MAX
        EXPECT_EQ(validate_packed(pp), Status::kOk) << what;
      }
    }
}

}  // namespace
}  // namespace sdpa
