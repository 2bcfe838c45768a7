// Packed variable-length sequences (src/sdpa-packed.h) against the double-precision reference
// of the whole packed problem with a block-diagonal mask: row r of sequence s may attend key c
// only when c is one of s's keys and (causal) within s's causal frontier and window, counted
// in s's own positions. That oracle never cuts the problem into sequences, so it checks the
// cutting too. With ALiBi the oracle's mask is a float one [Hq, Tq, Tk]: -inf where the block
// mask blocks, else the bias of row r and key c in s's own positions and offset, -(slope·|i +
// offset - j|), i = r - q_starts[s], j = c - k_starts[s], slope = s's row of [S, Hq] (or the
// shared [Hq]), computed as the contract computes it (float(d), times the slope in float). Sequence lengths from the tile sizes (src/tiles.h): 0, 1, tile - 1, tile,
// tile + 1, primes; sequences long enough to be split over threads beside short ones run side
// by side.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/thread-pool.h"
#include "reference/sdpa-reference.h"
#include "sdpa-backward.h"
#include "sdpa-packed.h"
#include "sdpa.h"
#include "tiles.h"

#include "attention-test-case.h"

// Cases name only the fields they set (designated initializers; the rest keep their defaults).
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace sdpa {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct PackedCase {
  int Hq = 2, Hkv = 1, E = 8, Ev = 8;
  std::vector<int32_t> q_lens;
  std::vector<int32_t> k_lens;     // empty: the same as q_lens
  bool causal = false;
  std::vector<int32_t> offsets;    // empty: 0; one: every sequence; S: per sequence
  int32_t window = 0;
  float softcap = 0.0f;
  std::vector<float> sinks;        // [Hq] or empty
  std::vector<float> alibi;        // ALiBi slopes: [Hq] for every sequence (stride 0), [S, Hq] per sequence; empty: none
  uint32_t seed = 1;

  std::string describe() const {
    std::ostringstream s;
    s << "Hq" << Hq << " Hkv" << Hkv << " E" << E << " Ev" << Ev << " q_lens";
    for (int32_t n : q_lens) s << " " << n;
    if (!k_lens.empty()) {
      s << " k_lens";
      for (int32_t n : k_lens) s << " " << n;
    }
    s << (causal ? " causal" : "") << (window > 0 ? " window" + std::to_string(window) : "")
 << (sinks.empty() ? "" : " sinks")
      << (alibi.empty() ? "" : int(alibi.size()) == Hq ? " alibi[Hq]" : " alibi[S,Hq]") << " softcap" << softcap << " seed" << seed;
    return s.str();
  }
};

std::vector<int32_t> starts_of(const std::vector<int32_t>& lens) {
  std::vector<int32_t> starts(lens.size() + 1, 0);
  std::partial_sum(lens.begin(), lens.end(), starts.begin() + 1);
  return starts;
}

// The packed tensors [T, H, D] and a PackedProblem over them, and the oracle's problem: the
// same tensors as one batch with the block-diagonal bool mask [Tq, Tk].
struct PackedHarness {
  PackedCase c;
  std::vector<int32_t> q_starts, k_starts, offsets;
  std::vector<float> q, k, v, out, lse, sinks, alibi;
  std::vector<uint8_t> block_mask;
  std::vector<float> alibi_mask;  // the oracle's float mask [Hq, Tq, Tk] with ALiBi
  PackedProblem pp;
  int32_t Tq = 0, Tk = 0;

  explicit PackedHarness(const PackedCase& cs) : c(cs) {
    const std::vector<int32_t>& k_lens = c.k_lens.empty() ? c.q_lens : c.k_lens;
    q_starts = starts_of(c.q_lens);
    k_starts = starts_of(k_lens);
    Tq = q_starts.back(), Tk = k_starts.back();
    const int S = int(c.q_lens.size());
    test::CaseRandom random(c.seed);
    random.fill(q, size_t(Tq) * c.Hq * c.E, 1.0f);
    random.fill(k, size_t(Tk) * c.Hkv * c.E, 1.0f);
    random.fill(v, size_t(Tk) * c.Hkv * c.Ev, 1.0f);
    out.assign(size_t(Tq) * c.Hq * c.Ev, kNaN);  // NaN: every element must be written
    lse.assign(size_t(c.Hq) * Tq, kNaN);
    sinks = c.sinks;
    Problem& p = pp.whole;
    p.batch = 1, p.q_heads = c.Hq, p.kv_heads = c.Hkv, p.q_len = Tq, p.kv_len = Tk;
    p.head_dim = c.E, p.value_dim = c.Ev;
    p.query = q.data(), p.key = k.data(), p.value = v.data(), p.output = out.data();
    // [T, H, D]: what sdpa-packed.h describes (the batch strides are not used).
    p.q_stride_h = c.E, p.q_stride_l = int64_t(c.Hq) * c.E;
    p.k_stride_h = c.E, p.k_stride_l = int64_t(c.Hkv) * c.E;
    p.v_stride_h = c.Ev, p.v_stride_l = int64_t(c.Hkv) * c.Ev;
    p.o_stride_h = c.Ev, p.o_stride_l = int64_t(c.Hq) * c.Ev;
    p.scale = 1.0f / std::sqrt(float(c.E));
    p.softcap = c.softcap;
    p.causal = c.causal;
    p.sliding_window = c.window;
    if (c.offsets.size() == 1) p.causal_offset = c.offsets[0];
    if (c.offsets.size() > 1) {
      offsets = c.offsets;
      p.causal_offsets = offsets.data();
    }
    if (!sinks.empty()) p.sinks = sinks.data();
    alibi = c.alibi;
    if (!alibi.empty()) {
      p.alibi_slopes = alibi.data();
      p.alibi_stride_b = int(alibi.size()) == c.Hq ? 0 : c.Hq;  // the batch stride counts sequences here
    }
    p.logsumexp = lse.data();
    pp.sequences = S;
    pp.q_starts = q_starts.data();
    pp.k_starts = k_starts.data();

    block_mask.assign(size_t(Tq) * Tk, 0);
    for (int s = 0; s < S; s++) {
      const int32_t off = c.offsets.empty() ? 0 : c.offsets.size() == 1 ? c.offsets[0] : c.offsets[size_t(s)];
      for (int32_t i = 0; i < c.q_lens[size_t(s)]; i++) {
        for (int32_t j = 0; j < k_lens[size_t(s)]; j++) {
          const bool open = !c.causal || (j <= i + off && (c.window == 0 || j > i + off - c.window));
          block_mask[size_t(q_starts[s] + i) * Tk + size_t(k_starts[s] + j)] = open ? 1 : 0;
        }
      }
    }
    if (alibi.empty()) return;
    alibi_mask.assign(size_t(c.Hq) * Tq * Tk, -kInf);
    for (int s = 0; s < S; s++) {
      const int64_t off = c.offsets.empty() ? 0 : c.offsets.size() == 1 ? c.offsets[0] : c.offsets[size_t(s)];
      for (int h = 0; h < c.Hq; h++) {
        const float slope = alibi[size_t(p.alibi_stride_b * s + h)];
        for (int32_t i = 0; i < c.q_lens[size_t(s)]; i++) {
          for (int32_t j = 0; j < k_lens[size_t(s)]; j++) {
            const size_t r = size_t(q_starts[s] + i), col = size_t(k_starts[s] + j);
            if (block_mask[r * Tk + col] == 0) continue;
            alibi_mask[(size_t(h) * Tq + r) * Tk + col] = -(slope * static_cast<float>(std::abs(i + off - j)));
          }
        }
      }
    }
  }

  // The oracle's problem: one batch of Tq rows and Tk keys, the block-diagonal mask in place
  // of the packing (causal and the window are in it), or with ALiBi the float mask that holds
  // its biases too.
  Problem oracle_problem() const {
    Problem p = pp.whole;
    p.causal = false, p.sliding_window = 0, p.causal_offsets = nullptr, p.causal_offset = 0;
    p.alibi_slopes = nullptr, p.alibi_stride_b = 0;
    p.mask_kind = MaskKind::kBool;
    p.mask = block_mask.data();
    p.mask_stride_q = Tk, p.mask_stride_k = 1;
    if (!alibi.empty()) {
      p.mask_kind = MaskKind::kFloat;
      p.mask = alibi_mask.data();
      p.mask_stride_h = int64_t(Tq) * Tk;
    }
    p.logsumexp = nullptr;
    return p;
  }

  // forward_packed on `threads` threads into out and lse.
  Status run(int threads) {
    std::fill(out.begin(), out.end(), kNaN);
    std::fill(lse.begin(), lse.end(), kNaN);
    std::unique_ptr<ThreadPool> pool = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
    std::vector<float> scratch(packed_scratch_floats(pp, threads));
    return forward_packed(pp, scratch.data(), scratch.size(), pool.get());
  }

  // Output [Tq, Hq, Ev] against the reference's [1, Hq, Tq, Ev]; lse [Hq, Tq] the same order.
  void expect_matches_reference() const {
    std::vector<double> ref_lse;
    const std::vector<double> ref = reference_forward(oracle_problem(), nullptr, &ref_lse);
    for (int32_t r = 0; r < Tq; r++) {
      for (int h = 0; h < c.Hq; h++) {
        for (int d = 0; d < c.Ev; d++) {
          const double want = ref[(size_t(h) * Tq + r) * c.Ev + d];
          const float got = out[(size_t(r) * c.Hq + h) * c.Ev + d];
          ASSERT_NEAR(got, want, 2e-5) << c.describe() << " row " << r << " head " << h << " dim " << d;
        }
        const double want_lse = ref_lse[size_t(h) * Tq + r];
        const float got_lse = lse[size_t(h) * Tq + r];
        if (std::isinf(want_lse)) {
          ASSERT_EQ(got_lse, want_lse) << c.describe() << " lse row " << r << " head " << h;
        } else {
          ASSERT_NEAR(got_lse, want_lse, 2e-5 * (1 + std::abs(want_lse))) << c.describe() << " lse row " << r;
        }
      }
    }
  }
};

void check_forward(const PackedCase& c) {
  PackedHarness h(c);
  ASSERT_EQ(h.run(1), Status::kOk) << c.describe();
  h.expect_matches_reference();
  const std::vector<float> one_out = h.out, one_lse = h.lse;
  ASSERT_EQ(h.run(2), Status::kOk) << c.describe();
  EXPECT_EQ(0, std::memcmp(one_out.data(), h.out.data(), one_out.size() * 4)) << "threads differ " << c.describe();
  EXPECT_EQ(0, std::memcmp(one_lse.data(), h.lse.data(), one_lse.size() * 4)) << "threads differ " << c.describe();

  // Each sequence's rows are the bits forward() gives that sequence alone, copied out dense
  // ([1, H, L, D]) and with its own offset.
  for (int32_t s = 0; s < h.pp.sequences; s++) {
    const int32_t Lq = h.q_starts[s + 1] - h.q_starts[s], Lk = h.k_starts[s + 1] - h.k_starts[s];
    if (Lq == 0 || Lk == 0) continue;
    test::AttentionCase one;
    one.Hq = c.Hq, one.Hkv = c.Hkv, one.Lq = Lq, one.Lk = Lk, one.E = c.E, one.Ev = c.Ev;
    Problem p;
    test::set_shapes(one, p);
    p.softcap = c.softcap, p.causal = c.causal, p.sliding_window = c.window;
    p.causal_offset = c.offsets.empty() ? 0 : c.offsets.size() == 1 ? c.offsets[0] : c.offsets[size_t(s)];
    p.sinks = c.sinks.empty() ? nullptr : c.sinks.data();
    if (!c.alibi.empty()) p.alibi_slopes = c.alibi.data() + (int(c.alibi.size()) == c.Hq ? 0 : s * c.Hq);  // its row
    std::vector<float> q(size_t(c.Hq) * Lq * c.E), k(size_t(c.Hkv) * Lk * c.E), v(size_t(c.Hkv) * Lk * c.Ev),
        o(size_t(c.Hq) * Lq * c.Ev);
    auto gather = [](std::vector<float>& dst, const std::vector<float>& src, int32_t first, int32_t rows, int H, int D) {
      for (int32_t r = 0; r < rows; r++)
        for (int hd = 0; hd < H; hd++)
          for (int d = 0; d < D; d++) dst[(size_t(hd) * rows + r) * D + d] = src[(size_t(first + r) * H + hd) * D + d];
    };
    gather(q, h.q, h.q_starts[s], Lq, c.Hq, c.E);
    gather(k, h.k, h.k_starts[s], Lk, c.Hkv, c.E);
    gather(v, h.v, h.k_starts[s], Lk, c.Hkv, c.Ev);
    p.query = q.data(), p.key = k.data(), p.value = v.data(), p.output = o.data();
    std::vector<float> scratch(scratch_floats(p, 1));
    ASSERT_EQ(forward(p, scratch.data(), scratch.size()), Status::kOk);
    for (int32_t r = 0; r < Lq; r++)
      for (int hd = 0; hd < c.Hq; hd++)
        for (int d = 0; d < c.Ev; d++) {
          const float alone = o[(size_t(hd) * Lq + r) * c.Ev + d];
          const float packed = h.out[(size_t(h.q_starts[s] + r) * c.Hq + hd) * c.Ev + d];
          ASSERT_EQ(std::memcmp(&alone, &packed, 4), 0) << c.describe() << " sequence " << s << " row " << r;
        }
  }
}

TEST(PackedForward, SequencesAtTileEdges) {
  const int tile = kKeyTile;
  check_forward({.q_lens = {1, 3, tile - 1, 0, tile, 5, tile + 1, 17}});
  check_forward({.Hq = 4, .Hkv = 2, .E = 16, .Ev = 24, .q_lens = {31, 1, 2, 97}, .seed = 2});
  // Lq != Lk per sequence, and sequences without rows or without keys.
  check_forward({.Hq = 3, .Hkv = 1, .E = 5, .Ev = 7, .q_lens = {1, 7, 0, 4, 13}, .k_lens = {29, 0, 3, tile + 3, 13},
                 .seed = 3});
}

TEST(PackedForward, CausalOffsetsWindowsSoftcapSinks) {
  // Every sequence top-left aligned (offset 0), and bottom-right per sequence (Lk - Lq).
  check_forward({.Hq = 2, .Hkv = 2, .q_lens = {9, 1, 33}, .causal = true, .seed = 4});
  check_forward({.Hq = 4, .Hkv = 2, .q_lens = {3, 1, 8, 2}, .k_lens = {10, 50, 8, 0}, .causal = true,
                 .offsets = {7, 49, 0, -2}, .seed = 5});
  check_forward({.Hq = 2, .Hkv = 1, .q_lens = {40, 70, 3}, .causal = true, .window = 16, .softcap = 5.0f,
                 .seed = 6});
  check_forward({.Hq = 5, .Hkv = 1, .q_lens = {6, 0, 21, 1}, .k_lens = {6, 4, 0, 1}, .causal = true, .offsets = {2},
                 .sinks = test::cycling_sinks(5), .seed = 7});
}

TEST(PackedForward, LongSequencesSplitOverThreadsBesideShortOnes) {
  // 4 heads × 700² × 32 multiply-adds: past kMinParallelMultiplyAdds, so forward() splits it;
  // the short ones run side by side before it.
  check_forward({.Hq = 4, .Hkv = 2, .E = 16, .Ev = 16, .q_lens = {3, 700, 1, 5, 650, 2}, .causal = true, .seed = 8});
  check_forward({.Hq = 4, .Hkv = 4, .E = 16, .Ev = 16, .q_lens = {1, 1, 1}, .k_lens = {3000, 2, 2100},
                 .sinks = test::cycling_sinks(4), .seed = 9});
}

TEST(PackedForward, NaNAfterTheLastSequenceOrInOtherSequencesIsNeverRead) {
  PackedHarness h({.Hq = 2, .Hkv = 1, .q_lens = {4, 3}, .k_lens = {5, 2}, .causal = true, .offsets = {1, 0}});
  // Sequence 0's causal frontier blocks its keys 2..4 for row 0: NaN there must not reach row 0.
  for (int d = 0; d < h.c.E; d++) h.k[size_t(4) * h.c.E + d] = kNaN;
  ASSERT_EQ(h.run(1), Status::kOk);
  for (int hd = 0; hd < 2; hd++)
    for (int d = 0; d < h.c.Ev; d++) EXPECT_FALSE(std::isnan(h.out[(size_t(0) * 2 + hd) * h.c.Ev + d]));
  for (int32_t r = 4; r < 7; r++)  // sequence 1's rows never see sequence 0's keys
    for (int hd = 0; hd < 2; hd++)
      for (int d = 0; d < h.c.Ev; d++) EXPECT_FALSE(std::isnan(h.out[(size_t(r) * 2 + hd) * h.c.Ev + d])) << r;
}

TEST(PackedForward, EmptyRowsAreZerosWithTheSinkAsLse) {
  std::vector<float> sinks = {-kInf, -0.0f};
  PackedHarness h({.Hq = 2, .Hkv = 1, .q_lens = {2, 3}, .k_lens = {0, 4}, .sinks = sinks});
  ASSERT_EQ(h.run(1), Status::kOk);
  for (int32_t r = 0; r < 2; r++) {
    for (int hd = 0; hd < 2; hd++) {
      for (int d = 0; d < h.c.Ev; d++) EXPECT_PRED1(test::is_plus_zero, h.out[(size_t(r) * 2 + hd) * h.c.Ev + d]);
      const float lse = h.lse[size_t(hd) * h.Tq + r];
      EXPECT_EQ(std::memcmp(&lse, &sinks[size_t(hd)], 4), 0) << "head " << hd;
    }
  }
}

TEST(PackedForward, AWholeProblemWithoutKeysOrWithoutRows) {
  // Tk = 0: every row has nothing to attend (zeros, lse -inf); Tq = 0: nothing to write.
  PackedHarness no_keys({.Hq = 2, .Hkv = 1, .q_lens = {2, 3}, .k_lens = {0, 0}});
  float dummy[8] = {};
  no_keys.pp.whole.key = dummy, no_keys.pp.whole.value = dummy;
  ASSERT_EQ(no_keys.run(1), Status::kOk);
  for (float x : no_keys.out) EXPECT_PRED1(test::is_plus_zero, x);
  for (float x : no_keys.lse) EXPECT_EQ(x, -kInf);
  PackedHarness no_rows({.Hq = 2, .Hkv = 1, .q_lens = {0, 0}, .k_lens = {3, 1}});
  no_rows.pp.whole.query = dummy, no_rows.pp.whole.output = dummy, no_rows.pp.whole.logsumexp = dummy;
  ASSERT_EQ(no_rows.run(2), Status::kOk);
  PackedProblem negative = no_rows.pp;
  negative.whole.q_len = -1;
  EXPECT_EQ(validate_packed(negative), Status::kBadShape);
}

TEST(PackedForward, RejectsWhatItDoesNotTake) {
  PackedHarness h({.Hq = 2, .Hkv = 1, .q_lens = {2, 3}, .k_lens = {4, 1}});
  auto expect = [&](PackedProblem p, Status want, const char* what) {
    std::fill(h.out.begin(), h.out.end(), 7.0f);
    std::vector<float> scratch(1 << 16);
    EXPECT_EQ(forward_packed(p, scratch.data(), scratch.size()), want) << what;
    EXPECT_TRUE(std::all_of(h.out.begin(), h.out.end(), [](float x) { return x == 7.0f; })) << what << ": written";
  };
  std::vector<int32_t> bad = {0, 3, 2};  // decreasing: sequence 1 would have -1 rows
  PackedProblem p = h.pp;
  p.q_starts = bad.data();
  expect(p, Status::kBadPacking, "decreasing starts");
  std::vector<int32_t> short_total = {0, 2, 4};  // ends before Tq = 5
  p = h.pp, p.q_starts = short_total.data();
  expect(p, Status::kBadPacking, "starts ending before Tq");
  std::vector<int32_t> not_zero = {1, 2, 5};
  p = h.pp, p.k_starts = not_zero.data();
  expect(p, Status::kBadPacking, "first start not 0");
  p = h.pp, p.k_starts = nullptr;
  expect(p, Status::kNullPointer, "null starts");
  p = h.pp, p.sequences = 0;
  expect(p, Status::kBadPacking, "no sequences");
  p = h.pp, p.whole.batch = 2;
  expect(p, Status::kBadPacking, "batch 2");
  std::vector<uint8_t> mask(5 * 5, 1);
  p = h.pp, p.whole.mask_kind = MaskKind::kBool, p.whole.mask = mask.data();
  expect(p, Status::kBadPacking, "a mask");
  std::vector<int32_t> lengths = {1};
  p = h.pp, p.whole.key_lengths = lengths.data();
  expect(p, Status::kBadPacking, "key lengths");
  std::vector<float> weights(100);
  p = h.pp, p.whole.weights = weights.data();
  expect(p, Status::kBadPacking, "weights");
  p = h.pp, p.whole.kv_type = KvType::kFloat16;
  expect(p, Status::kBadPacking, "float16");
  p = h.pp, p.whole.scale = kInf;
  expect(p, Status::kBadScale, "the whole problem's own checks");
  p = h.pp;
  std::vector<float> tiny(1);
  EXPECT_EQ(forward_packed(p, tiny.data(), tiny.size()), Status::kBadScratch);
}

// The backward: gradients against reference_backward of the oracle problem (a bool mask gets
// no gradient; the packing's causal and window are in it), threads bitwise.
struct PackedBackwardHarness : PackedHarness {
  std::vector<float> go, dq, dk, dv, ds;
  PackedBackwardProblem bp;

  explicit PackedBackwardHarness(const PackedCase& c) : PackedHarness(c) {
    test::CaseRandom random(c.seed + 1000);
    random.fill(go, out.size(), 1.0f);
    EXPECT_EQ(run(1), Status::kOk);  // O and lse, as forward_packed gives them
    BackwardProblem& w = bp.whole;
    w.forward = pp.whole;
    w.forward.logsumexp = nullptr;
    w.logsumexp = lse.data();
    w.grad_output = go.data();
    w.go_stride_h = c.Ev, w.go_stride_l = int64_t(c.Hq) * c.Ev;
    w.dq_stride_h = c.E, w.dq_stride_l = int64_t(c.Hq) * c.E;
    w.dk_stride_h = c.E, w.dk_stride_l = int64_t(c.Hkv) * c.E;
    w.dv_stride_h = c.Ev, w.dv_stride_l = int64_t(c.Hkv) * c.Ev;
    bp.sequences = pp.sequences, bp.q_starts = pp.q_starts, bp.k_starts = pp.k_starts;
  }

  Status run_backward(int threads) {
    dq.assign(q.size(), kNaN), dk.assign(k.size(), kNaN), dv.assign(v.size(), kNaN);
    BackwardProblem& w = bp.whole;
    w.d_query = dq.data(), w.d_key = dk.data(), w.d_value = dv.data();
    if (!c.sinks.empty()) {
      ds.assign(c.sinks.size(), kNaN);
      w.d_sinks = ds.data();
    }
    std::unique_ptr<ThreadPool> pool = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
    std::vector<float> scratch(packed_backward_scratch_floats(bp, threads));
    return backward_packed(bp, scratch.data(), scratch.size(), pool.get());
  }
};

using test::relative_error;

void check_backward(const PackedCase& c) {
  PackedBackwardHarness h(c);
  ASSERT_EQ(h.run_backward(1), Status::kOk) << c.describe();
  BackwardProblem oracle;
  oracle.forward = h.oracle_problem();
  oracle.grad_output = h.go.data();
  oracle.go_stride_h = c.Ev, oracle.go_stride_l = int64_t(c.Hq) * c.Ev;
  oracle.forward.o_stride_h = c.Ev, oracle.forward.o_stride_l = int64_t(c.Hq) * c.Ev;
  const ReferenceGradients ref = reference_backward(oracle);
  // The reference's gradients are dense [1, H, T, D]; the packed ones [T, H, D].
  auto worst = [](const std::vector<float>& got, const std::vector<double>& want, int H, int T, int D) {
    double w = 0;
    for (int t = 0; t < T; t++)
      for (int hd = 0; hd < H; hd++)
        for (int d = 0; d < D; d++)
          w = std::max(w, relative_error(got[(size_t(t) * H + hd) * D + d], want[(size_t(hd) * T + t) * D + d]));
    return w;
  };
  EXPECT_LE(worst(h.dq, ref.d_query, c.Hq, h.Tq, c.E), 1e-4) << "dQ " << c.describe();
  EXPECT_LE(worst(h.dk, ref.d_key, c.Hkv, h.Tk, c.E), 1e-4) << "dK " << c.describe();
  EXPECT_LE(worst(h.dv, ref.d_value, c.Hkv, h.Tk, c.Ev), 1e-4) << "dV " << c.describe();
  for (size_t n = 0; n < h.ds.size(); n++) EXPECT_LE(relative_error(h.ds[n], ref.d_sinks[n]), 1e-4) << "dSinks " << n;
  const std::vector<float> dq = h.dq, dk = h.dk, dv = h.dv, ds = h.ds;
  ASSERT_EQ(h.run_backward(2), Status::kOk);
  EXPECT_EQ(0, std::memcmp(dq.data(), h.dq.data(), dq.size() * 4)) << "threads differ: dQ " << c.describe();
  EXPECT_EQ(0, std::memcmp(dk.data(), h.dk.data(), dk.size() * 4)) << "threads differ: dK " << c.describe();
  EXPECT_EQ(0, std::memcmp(dv.data(), h.dv.data(), dv.size() * 4)) << "threads differ: dV " << c.describe();
  EXPECT_TRUE(ds == h.ds || std::memcmp(ds.data(), h.ds.data(), ds.size() * 4) == 0)
      << "threads differ: dSinks " << c.describe();
}

TEST(PackedBackward, MatchesTheReference) {
  check_backward({.q_lens = {1, 3, 63, 0, 64, 5, 65, 17}});
  check_backward({.Hq = 4, .Hkv = 2, .E = 16, .Ev = 24, .q_lens = {31, 1, 2, 97}, .causal = true, .seed = 2});
  // Sequences without rows (their keys' gradients are zeros) or without keys (their rows').
  check_backward({.Hq = 3, .Hkv = 1, .E = 5, .Ev = 7, .q_lens = {1, 7, 0, 4, 13}, .k_lens = {29, 0, 3, 70, 13},
                  .causal = true, .offsets = {28, 0, 0, 66, 0}, .window = 9, .softcap = 4.0f,
                  .sinks = test::cycling_sinks(3), .seed = 3});
  // Long ones split over the pool beside short ones side by side.
  check_backward({.Hq = 4, .Hkv = 2, .E = 16, .Ev = 16, .q_lens = {3, 700, 1, 650}, .causal = true,
                  .sinks = test::cycling_sinks(4), .seed = 4});
}

// d_sinks_by_sequence [S, Hq]: each sequence's d_sinks, which added in double in sequence order
// and rounded once are d_sinks' bits (the TypeScript layer, running the sequences in chunks, adds
// them so); a sequence without rows or keys contributes +0; the same bits on 1 and 2 threads.
TEST(PackedBackward, SinkGradientsBySequenceAddUpToDSinks) {
  const PackedCase c{.Hq = 3, .Hkv = 1, .E = 5, .Ev = 7, .q_lens = {1, 7, 0, 4, 13, 300}, .k_lens = {29, 0, 3, 70, 13, 280},
                     .causal = true, .offsets = {28, 0, 0, 66, 0, -20}, .sinks = test::cycling_sinks(3), .seed = 31};
  PackedBackwardHarness h(c);
  const int32_t S = h.bp.sequences, Hq = c.Hq;
  std::vector<float> by_sequence_one;
  for (int threads : {1, 2}) {
    std::vector<float> by_sequence(size_t(S) * Hq, kNaN);
    h.bp.d_sinks_by_sequence = by_sequence.data();
    ASSERT_EQ(h.run_backward(threads), Status::kOk) << threads;
    for (int32_t hd = 0; hd < Hq; hd++) {
      double sum = 0.0;
      for (int32_t s = 0; s < S; s++) sum += by_sequence[size_t(s) * Hq + hd];
      const float total = static_cast<float>(sum);
      EXPECT_EQ(0, std::memcmp(&total, &h.ds[hd], 4)) << "head " << hd << ", threads " << threads << ": " << total
                                                       << " vs " << h.ds[hd];
    }
    for (int32_t s : {1, 2}) {  // no keys, no rows
      for (int32_t hd = 0; hd < Hq; hd++) EXPECT_PRED1(test::is_plus_zero, by_sequence[size_t(s) * Hq + hd]) << s;
    }
    for (float x : by_sequence) EXPECT_TRUE(std::isfinite(x));
    if (threads == 1) {
      by_sequence_one = by_sequence;
    } else {
      EXPECT_EQ(0, std::memcmp(by_sequence_one.data(), by_sequence.data(), by_sequence.size() * 4)) << "threads differ";
    }
  }
}

TEST(PackedBackward, RejectsAMaskGradient) {
  PackedBackwardHarness h({.q_lens = {2, 3}});
  std::vector<float> dm(25);
  h.bp.whole.d_mask = dm.data();
  h.dq.assign(h.q.size(), 0.0f), h.dk.assign(h.k.size(), 0.0f), h.dv.assign(h.v.size(), 0.0f);
  h.bp.whole.d_query = h.dq.data(), h.bp.whole.d_key = h.dk.data(), h.bp.whole.d_value = h.dv.data();
  EXPECT_EQ(validate_packed_backward(h.bp), Status::kBadMaskGrad);  // validate_backward: not a float mask
}

TEST(PackedScratch, DependsOnTheShapesAloneNotOnWhichPointersAreSet) {
  // The TypeScript layer sizes the scratch before it has the addresses (all null then).
  PackedBackwardHarness h({.Hq = 3, .Hkv = 1, .q_lens = {5, 700, 0, 9}, .k_lens = {5, 600, 3, 0},
                           .sinks = test::cycling_sinks(3)});
  PackedProblem bare = h.pp;
  bare.whole.query = nullptr, bare.whole.key = nullptr, bare.whole.value = nullptr, bare.whole.output = nullptr;
  bare.whole.logsumexp = nullptr, bare.whole.sinks = nullptr;
  for (int threads : {1, 2}) {
    EXPECT_EQ(packed_scratch_floats(bare, threads), packed_scratch_floats(h.pp, threads)) << threads;
    PackedBackwardProblem bare_backward = h.bp;
    bare_backward.whole.forward = bare.whole;
    bare_backward.whole.logsumexp = nullptr, bare_backward.whole.grad_output = nullptr;
    bare_backward.whole.d_query = nullptr, bare_backward.whole.d_key = nullptr, bare_backward.whole.d_value = nullptr;
    bare_backward.whole.d_sinks = nullptr;
    EXPECT_EQ(packed_backward_scratch_floats(bare_backward, threads), packed_backward_scratch_floats(h.bp, threads))
        << threads;
  }
}


TEST(PackedScratch, AllTheCallNeedsAlignedForItsOrderElseBadScratch) {
  // The sequences' order lives in the scratch (doubles: 8-byte aligned), so the calls allocate
  // nothing; a scratch one float short, or 4 bytes off, is refused and nothing is written.
  PackedBackwardHarness h({.Hq = 2, .Hkv = 1, .q_lens = {3, 1, 6}, .k_lens = {4, 2, 5}, .sinks = test::cycling_sinks(2)});
  const uint64_t forward_floats = packed_scratch_floats(h.pp, 1);
  const uint64_t backward_floats = packed_backward_scratch_floats(h.bp, 1);
  std::vector<double> storage((std::max(forward_floats, backward_floats) + 2) / 2 + 1);  // 8-byte aligned
  float* aligned = reinterpret_cast<float*>(storage.data());
  const std::vector<float> computed = h.out;  // the harness's forward_packed, into h.out
  std::fill(h.out.begin(), h.out.end(), kNaN);
  EXPECT_EQ(forward_packed(h.pp, aligned, forward_floats - 1), Status::kBadScratch);
  EXPECT_EQ(forward_packed(h.pp, aligned + 1, forward_floats), Status::kBadScratch);  // 4 bytes off
  EXPECT_TRUE(std::all_of(h.out.begin(), h.out.end(), [](float x) { return std::isnan(x); })) << "written on failure";
  EXPECT_EQ(forward_packed(h.pp, aligned, forward_floats), Status::kOk);
  EXPECT_EQ(std::memcmp(h.out.data(), computed.data(), sizeof(float) * computed.size()), 0);
  h.dq.assign(h.q.size(), 0.0f), h.dk.assign(h.k.size(), 0.0f), h.dv.assign(h.v.size(), 0.0f), h.ds.assign(2, 0.0f);
  BackwardProblem& w = h.bp.whole;
  w.d_query = h.dq.data(), w.d_key = h.dk.data(), w.d_value = h.dv.data(), w.d_sinks = h.ds.data();
  EXPECT_EQ(backward_packed(h.bp, aligned, backward_floats - 1), Status::kBadScratch);
  EXPECT_EQ(backward_packed(h.bp, aligned + 1, backward_floats), Status::kBadScratch);
  EXPECT_EQ(backward_packed(h.bp, aligned, backward_floats), Status::kOk);
}

// ALiBi in packed sequences: per-sequence slopes [S, Hq] (alibi_stride_b counts sequences) or
// shared [Hq]; each sequence's biases in its own positions and offset (the oracle's float mask,
// see the top), and each sequence the bits of forward() on it alone with its row of slopes.
TEST(PackedForward, AlibiPerSequenceAndSharedSlopes) {
  const int tile = kKeyTile;
  check_forward({.q_lens = {1, 3, tile - 1, 0, tile + 1, 17}, .alibi = test::geometric_slopes(2), .seed = 20});
  check_forward({.Hq = 4, .Hkv = 2, .E = 16, .Ev = 24, .q_lens = {31, 1, 2, 97}, .causal = true,
                 .alibi = test::per_batch_slopes(4, 4), .seed = 21});
  // Not causal: each sequence's offset still places its diagonal (7, 49, 0, -2).
  check_forward({.Hq = 4, .Hkv = 2, .q_lens = {3, 1, 8, 2}, .k_lens = {10, 50, 8, 0}, .offsets = {7, 49, 0, -2},
                 .alibi = test::per_batch_slopes(4, 4), .seed = 22});
  check_forward({.Hq = 5, .Hkv = 1, .q_lens = {40, 0, 21, 1}, .k_lens = {40, 4, 0, 1}, .causal = true, .offsets = {2},
                 .window = 16, .softcap = 5.0f, .sinks = test::cycling_sinks(5), .alibi = test::per_batch_slopes(4, 5),
                 .seed = 23});
  // A long sequence split over the pool beside short ones side by side.
  check_forward({.Hq = 4, .Hkv = 2, .E = 16, .Ev = 16, .q_lens = {3, 400, 1, 5}, .causal = true,
                 .alibi = test::per_batch_slopes(4, 4), .seed = 24});
}

TEST(PackedForward, AlibiBadSlopeOfALaterSequence) {
  // validate() reads batch 0's row of the whole problem (batch 1); the packing's check reads the
  // other sequences' rows: a bad slope in sequence 1's or 2's is kBadAlibi, nothing written;
  // forward, backward alike. A shared [Hq] array is not read past its end (ASan) with three
  // sequences.
  PackedCase c{.Hq = 2, .Hkv = 1, .q_lens = {2, 3, 4}, .k_lens = {4, 1, 5}, .alibi = test::per_batch_slopes(3, 2)};
  for (int at : {2 * 2 + 1, 1 * 2 + 0})  // sequence 2, head 1; sequence 1, head 0
  for (float bad : {kNaN, -0.5f, kInf, 0x1p65f}) {
    PackedBackwardHarness h(c);
    std::vector<float> slopes = c.alibi;
    slopes[size_t(at)] = bad;
    PackedProblem p = h.pp;
    p.whole.alibi_slopes = slopes.data();
    EXPECT_EQ(validate_packed(p), Status::kBadAlibi) << bad;
    std::fill(h.out.begin(), h.out.end(), 7.0f);
    std::vector<float> scratch(1 << 16);
    EXPECT_EQ(forward_packed(p, scratch.data(), scratch.size()), Status::kBadAlibi) << bad;
    EXPECT_TRUE(std::all_of(h.out.begin(), h.out.end(), [](float x) { return x == 7.0f; })) << bad << ": written";
    PackedBackwardProblem b = h.bp;
    b.whole.forward.alibi_slopes = slopes.data();
    h.dq.assign(h.q.size(), 7.0f), h.dk.assign(h.k.size(), 7.0f), h.dv.assign(h.v.size(), 7.0f);
    b.whole.d_query = h.dq.data(), b.whole.d_key = h.dk.data(), b.whole.d_value = h.dv.data();
    EXPECT_EQ(validate_packed_backward(b), Status::kBadAlibi) << bad;
    EXPECT_EQ(backward_packed(b, scratch.data(), scratch.size()), Status::kBadAlibi) << bad;
    for (const std::vector<float>* g : {&h.dq, &h.dk, &h.dv}) {
      EXPECT_TRUE(std::all_of(g->begin(), g->end(), [](float x) { return x == 7.0f; })) << bad << ": gradient written";
    }
  }
  PackedCase shared = c;
  shared.alibi = {0.5f, 0.25f};
  PackedHarness h(shared);
  ASSERT_EQ(h.run(1), Status::kOk);
  h.expect_matches_reference();
  PackedProblem negative = h.pp;
  negative.whole.alibi_stride_b = -2;
  EXPECT_EQ(validate_packed(negative), Status::kBadStride);
}

TEST(PackedBackward, AlibiMatchesTheReference) {
  check_backward({.Hq = 4, .Hkv = 2, .E = 16, .Ev = 24, .q_lens = {31, 1, 2, 97}, .causal = true,
                  .alibi = test::per_batch_slopes(4, 4), .seed = 30});
  check_backward({.Hq = 3, .Hkv = 1, .E = 5, .Ev = 7, .q_lens = {1, 7, 0, 4, 13}, .k_lens = {29, 0, 3, 70, 13},
                  .offsets = {28, 0, 0, 66, -3}, .softcap = 4.0f, .sinks = test::cycling_sinks(3),
                  .alibi = test::geometric_slopes(3), .seed = 31});
  check_backward({.Hq = 4, .Hkv = 2, .E = 16, .Ev = 16, .q_lens = {3, 300, 1, 250}, .causal = true, .window = 40,
                  .alibi = test::per_batch_slopes(4, 4), .seed = 32});
}

}  // namespace
}  // namespace sdpa
