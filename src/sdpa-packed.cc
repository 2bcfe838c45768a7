// Packed variable-length sequences (src/sdpa-packed.h): each sequence is run as a problem of
// its own by forward() or backward(), over pointers into the packed tensors.
#include "sdpa-packed.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>

#include "parallel/thread-pool.h"
#include "parallel/work-split.h"

namespace sdpa {

namespace {

// p + n elements, or null for null: the scratch sizes are asked for before the addresses exist.
template <typename T>
T* advance(T* p, int64_t n) {
  return p == nullptr ? nullptr : p + n;
}

int32_t rows_of(const int32_t* starts, int32_t s) { return starts[s + 1] - starts[s]; }

Problem& packed_whole(PackedProblem& p) { return p.whole; }
Problem& packed_whole(PackedBackwardProblem& p) { return p.whole.forward; }

// Starts of S sequences over `total` rows or keys: 0 = starts[0] <= … <= starts[S] = total.
bool valid_starts(const int32_t* starts, int32_t sequences, int32_t total) {
  if (starts[0] != 0 || starts[sequences] != total) return false;
  for (int32_t s = 0; s < sequences; s++) {
    if (starts[s + 1] < starts[s]) return false;
  }
  return true;
}

// What a packed problem's whole Problem must be beyond validate(): see sdpa-packed.h.
Status check_packing(const Problem& whole, int32_t sequences, const int32_t* q_starts, const int32_t* k_starts) {
  if (whole.batch != 1 || sequences < 1 || sequences > kMaxCount || whole.mask_kind != MaskKind::kNone ||
      whole.key_lengths != nullptr || whole.key_starts != nullptr || whole.weights != nullptr ||
      whole.kv_type != KvType::kFloat32) {
    return Status::kBadPacking;
  }
  if (q_starts == nullptr || k_starts == nullptr) return Status::kNullPointer;
  if (!valid_starts(q_starts, sequences, whole.q_len) || !valid_starts(k_starts, sequences, whole.kv_len)) {
    return Status::kBadPacking;
  }
  // validate() checked the slopes of batch 0 (batch 1); per-sequence slopes ([S, Hq]) have S rows.
  if (!alibi_slopes_valid(whole, sequences)) return Status::kBadAlibi;
  // Sequence s draws the dropout mask of batch dropout_batch_base + s, an int32 (packed_sequence).
  if (whole.dropout_batch_base > INT32_MAX - (sequences - 1)) return Status::kBadDropout;
  return Status::kOk;
}

double multiply_adds(const Problem& p) {
  return static_cast<double>(p.q_heads) * p.q_len * p.kv_len * (p.head_dim + p.value_dim);
}

// Sequences run side by side, one per pool item, unless one holds at least 1/(kSequencesPerThread
// · threads) of the whole problem's multiply-adds (and kMinParallelMultiplyAdds, below which
// forward() runs on one thread anyway): handed out whole, it would keep one thread busy while the
// others wait, so it runs after them, alone, split over the pool.
constexpr double kSequencesPerThread = 4;

// Scratch floats of one sequence's own region, rounded to 64 bytes (threads' regions on
// separate cache lines).
uint64_t region(uint64_t floats) { return (floats + 15) / 16 * 16; }

// How a packed problem runs: the multiply-adds from which a sequence is split over the pool, and
// the two places a sequence's work runs in the scratch: [threads][small] for the sequences run
// side by side (below split_from, or without rows or keys), then the split ones one at a time in
// [large]. They run one after the other, so both start at the same address.
struct PackedPlan {
  double split_from = 0;
  uint64_t small = 0;  // per thread
  uint64_t large = 0;
  uint64_t total(int32_t threads) const { return std::max(small * static_cast<uint64_t>(threads), large); }
  bool side_by_side(const Problem& seq) const {
    return seq.q_len == 0 || seq.kv_len == 0 || multiply_adds(seq) < split_from;
  }
};

// The sequence's [Hq, Lq] log-sum-exps in the dense layout forward() writes, staged before the
// packed [Hq, Tq] (forward) or gathered from it (backward).
uint64_t lse_floats(const Problem& seq) { return static_cast<uint64_t>(seq.q_heads) * seq.q_len; }

}  // namespace

Problem packed_sequence(const PackedProblem& p, int32_t s) {
  const Problem& w = p.whole;
  const int32_t q0 = p.q_starts[s], k0 = p.k_starts[s];
  Problem seq = w;
  seq.q_len = rows_of(p.q_starts, s);
  seq.kv_len = rows_of(p.k_starts, s);
  seq.query = advance(w.query, q0 * w.q_stride_l);
  seq.key = advance(static_cast<const float*>(w.key), k0 * w.k_stride_l);
  seq.value = advance(static_cast<const float*>(w.value), k0 * w.v_stride_l);
  seq.output = advance(w.output, q0 * w.o_stride_l);
  seq.causal_offsets = nullptr;
  seq.causal_offset = w.causal_offsets != nullptr ? w.causal_offsets[s] : w.causal_offset;
  if (w.alibi_slopes != nullptr) seq.alibi_slopes = w.alibi_slopes + s * w.alibi_stride_b;
  seq.alibi_stride_b = 0;
  // The sequence's own dropout mask: its index as the batch. (Added as uint32: the scratch sizes
  // call this before validate_packed() has refused a base + s past INT32_MAX.)
  seq.dropout_batch_base = static_cast<int32_t>(static_cast<uint32_t>(w.dropout_batch_base) + static_cast<uint32_t>(s));
  seq.logsumexp = nullptr;
  return seq;
}

namespace {

// The whole problem as validate() takes it: Tq or Tk may be 0 here (every sequence without rows,
// or without keys: a caller's chunk of sequences), which validate() refuses for a problem of its own.
template <typename P>
P with_lengths_at_least_one(P p) {
  Problem& whole = packed_whole(p);
  whole.q_len = std::max(whole.q_len, 1);
  whole.kv_len = std::max(whole.kv_len, 1);
  return p;
}

}  // namespace

Status validate_packed(const PackedProblem& p) {
  if (p.whole.q_len < 0 || p.whole.kv_len < 0) return Status::kBadShape;
  const Status status = validate(with_lengths_at_least_one(p).whole);
  if (status != Status::kOk) return status;
  return check_packing(p.whole, p.sequences, p.q_starts, p.k_starts);
}

namespace {

// The multiply-adds from which a sequence is split over the pool (kSequencesPerThread).
template <typename SequenceOf>
double split_threshold(int32_t sequences, int32_t threads, SequenceOf sequence_of) {
  double total = 0;
  for (int32_t s = 0; s < sequences; s++) total += multiply_adds(sequence_of(s));
  return std::max(kMinParallelMultiplyAdds, total / (kSequencesPerThread * threads));
}

PackedPlan plan_packed(const PackedProblem& p, int32_t threads) {
  PackedPlan plan;
  plan.split_from = split_threshold(p.sequences, threads, [&p](int32_t s) { return packed_sequence(p, s); });
  for (int32_t s = 0; s < p.sequences; s++) {
    const Problem seq = packed_sequence(p, s);
    if (seq.q_len == 0 || seq.kv_len == 0) continue;  // nothing, or zeros: no scratch
    const bool side_by_side = plan.side_by_side(seq);
    // The lse's staging whether or not it is asked for: the size depends on the shapes alone
    // (as scratch_floats(), sdpa.h), so a caller sizes the scratch before it has the addresses.
    const uint64_t floats = region(scratch_floats(seq, side_by_side ? 1 : threads) + lse_floats(seq));
    uint64_t& slot = side_by_side ? plan.small : plan.large;
    slot = std::max(slot, floats);
  }
  return plan;
}

// One side-by-side sequence in the order they are handed out: the most multiply-adds first (the
// longest items handed out first keep the threads' finishing times close; the order changes no
// result). The order lives in the scratch, [S] of these in a region of their own
// (order_floats(); where, each entry point's scratch layout says), not in a std::vector: a call
// allocates nothing beyond the blocks its caller asked for (with -fno-exceptions a failed
// operator new aborts the module; the caller's request, checked against the memory limits
// before anything is allocated, is the call's whole footprint).
struct SequenceWork {
  double negative_multiply_adds;  // sorted ascending: the most work first, then by index
  int32_t sequence;
};
static_assert(sizeof(SequenceWork) == 4 * sizeof(float), "four floats a sequence");

// A scratch of `needed` floats or more, aligned for the order's doubles (8 bytes: malloc's blocks
// are; every region starts a whole number of 64-byte regions in, so each stays so aligned).
bool scratch_fits(const float* scratch, uint64_t size, uint64_t needed) {
  return scratch != nullptr && reinterpret_cast<uintptr_t>(scratch) % alignof(SequenceWork) == 0 && size >= needed;
}

uint64_t order_floats(int32_t sequences) {
  return region(static_cast<uint64_t>(sequences) * (sizeof(SequenceWork) / sizeof(float)));
}

// The side-by-side sequences, sorted, into `order` (order_floats(sequences) of scratch, aligned
// for SequenceWork); their count. std::sort sorts in place (no allocation).
template <typename SequenceOf>
int32_t side_by_side_order(const PackedPlan& plan, int32_t sequences, SequenceOf sequence_of, SequenceWork* order) {
  int32_t count = 0;
  for (int32_t s = 0; s < sequences; s++) {
    const Problem seq = sequence_of(s);
    if (plan.side_by_side(seq)) new (order + count++) SequenceWork{-multiply_adds(seq), s};  // in the scratch's floats
  }
  std::sort(order, order + count, [](const SequenceWork& a, const SequenceWork& b) {
    return a.negative_multiply_adds < b.negative_multiply_adds ||
           (a.negative_multiply_adds == b.negative_multiply_adds && a.sequence < b.sequence);
  });
  return count;
}

struct PackedForwardWork {
  const PackedProblem* p;
  PackedPlan plan;
  float* scratch;  // the plan's regions (after the order)
  const SequenceWork* order;  // the side-by-side sequences, one per item
};

// Sequence s's rows when it has no keys: nothing to attend (sdpa.h): zeros, lse = the sink or -inf.
void write_empty_rows(const PackedProblem& p, const Problem& seq, int32_t q0) {
  const Problem& w = p.whole;
  for (int32_t i = 0; i < seq.q_len; i++) {
    for (int32_t h = 0; h < w.q_heads; h++) {
      std::memset(seq.output + i * w.o_stride_l + h * w.o_stride_h, 0, sizeof(float) * static_cast<size_t>(w.value_dim));
      if (w.logsumexp != nullptr) {
        w.logsumexp[static_cast<int64_t>(h) * w.q_len + q0 + i] =
            w.sinks != nullptr ? w.sinks[h] : -std::numeric_limits<float>::infinity();
      }
    }
  }
}

// forward() of sequence s with `floats` of scratch at `scratch` (its lse staged at the end).
void run_sequence(const PackedProblem& p, int32_t s, float* scratch, uint64_t floats, ThreadPool* pool) {
  const Problem& w = p.whole;
  Problem seq = packed_sequence(p, s);
  if (seq.q_len == 0) return;
  if (seq.kv_len == 0) {
    write_empty_rows(p, seq, p.q_starts[s]);
    return;
  }
  floats -= lse_floats(seq);
  if (w.logsumexp != nullptr) seq.logsumexp = scratch + floats;
  forward(seq, scratch, floats, pool);  // validated with the whole problem
  if (w.logsumexp == nullptr) return;
  for (int32_t h = 0; h < w.q_heads; h++) {
    std::memcpy(w.logsumexp + static_cast<int64_t>(h) * w.q_len + p.q_starts[s],
                seq.logsumexp + static_cast<int64_t>(h) * seq.q_len, sizeof(float) * static_cast<size_t>(seq.q_len));
  }
}

void small_sequence_item(void* context, int32_t item, int32_t thread) {
  const PackedForwardWork& fw = *static_cast<const PackedForwardWork*>(context);
  run_sequence(*fw.p, fw.order[item].sequence, fw.scratch + static_cast<uint64_t>(thread) * fw.plan.small, fw.plan.small, nullptr);
}

// The forward's scratch: [order_floats(S)] the side-by-side order, then the plan's regions.
uint64_t forward_layout_floats(const PackedProblem& p, const PackedPlan& plan, int32_t threads) {
  return order_floats(p.sequences) + plan.total(threads);
}

}  // namespace

uint64_t packed_scratch_floats(const PackedProblem& p, int32_t threads) {
  return forward_layout_floats(p, plan_packed(p, threads), threads);
}

Status forward_packed(const PackedProblem& p, float* scratch, uint64_t scratch_size, ThreadPool* pool) {
  const Status status = validate_packed(p);
  if (status != Status::kOk) return status;
  const int32_t threads = pool != nullptr ? pool->threads() : 1;
  const PackedPlan plan = plan_packed(p, threads);
  if (!scratch_fits(scratch, scratch_size, forward_layout_floats(p, plan, threads))) return Status::kBadScratch;
  auto sequence_of = [&p](int32_t s) { return packed_sequence(p, s); };
  SequenceWork* order = reinterpret_cast<SequenceWork*>(scratch);
  const int32_t side_by_side = side_by_side_order(plan, p.sequences, sequence_of, order);
  float* regions = scratch + order_floats(p.sequences);
  PackedForwardWork fw{&p, plan, regions, order};
  run_tasks(pool, side_by_side, small_sequence_item, &fw);
  for (int32_t s = 0; s < p.sequences; s++) {
    if (!plan.side_by_side(sequence_of(s))) run_sequence(p, s, regions, plan.large, pool);
  }
  return Status::kOk;
}

// The backward.

namespace {

BackwardProblem backward_sequence(const PackedBackwardProblem& p, int32_t s) {
  const BackwardProblem& w = p.whole;
  const int32_t q0 = p.q_starts[s], k0 = p.k_starts[s];
  BackwardProblem seq = w;
  seq.forward = packed_sequence(PackedProblem{w.forward, p.sequences, p.q_starts, p.k_starts}, s);
  seq.logsumexp = nullptr;  // staged
  seq.grad_output = advance(w.grad_output, q0 * w.go_stride_l);
  seq.d_query = advance(w.d_query, q0 * w.dq_stride_l);
  seq.d_key = advance(w.d_key, k0 * w.dk_stride_l);
  seq.d_value = advance(w.d_value, k0 * w.dv_stride_l);
  seq.d_sinks = nullptr;  // staged
  return seq;
}

// backward_scratch_floats() depends on the shapes (and d_mask, never given here), not on the
// staged pointers, so a sequence is sized before they are set.
PackedPlan plan_packed_backward(const PackedBackwardProblem& p, int32_t threads) {
  PackedPlan plan;
  plan.split_from = split_threshold(p.sequences, threads, [&p](int32_t s) { return backward_sequence(p, s).forward; });
  for (int32_t s = 0; s < p.sequences; s++) {
    const BackwardProblem seq = backward_sequence(p, s);
    const Problem& f = seq.forward;
    if (f.q_len == 0 || f.kv_len == 0) continue;
    const bool side_by_side = plan.side_by_side(f);
    const uint64_t floats = region(backward_scratch_floats(seq, side_by_side ? 1 : threads) + lse_floats(f));
    uint64_t& slot = side_by_side ? plan.small : plan.large;
    slot = std::max(slot, floats);
  }
  return plan;
}

// Each sequence's d_sinks [S][Hq], summed in order at the end; then the regions. Counted
// whether or not d_sinks is asked for: the size depends on the shapes alone (the caller sizes
// the scratch before it has the addresses).
uint64_t sink_partials_floats(const PackedBackwardProblem& p) {
  return region(static_cast<uint64_t>(p.sequences) * p.whole.forward.q_heads);
}

struct PackedBackwardWork {
  const PackedBackwardProblem* p;
  PackedPlan plan;
  float* sink_partials;  // [S][Hq], when d_sinks
  float* scratch;  // the plan's regions
  const SequenceWork* order;  // the side-by-side sequences, one per item
};

void zero_rows(float* first, int32_t rows, int64_t row_stride, int32_t heads, int64_t head_stride, int32_t dim) {
  for (int32_t i = 0; i < rows; i++) {
    for (int32_t h = 0; h < heads; h++) {
      std::memset(first + i * row_stride + h * head_stride, 0, sizeof(float) * static_cast<size_t>(dim));
    }
  }
}

void run_backward_sequence(const PackedBackwardWork& bw, int32_t s, float* scratch, uint64_t floats,
                           ThreadPool* pool) {
  const PackedBackwardProblem& p = *bw.p;
  const BackwardProblem& w = p.whole;
  const Problem& wf = w.forward;
  BackwardProblem seq = backward_sequence(p, s);
  const Problem& f = seq.forward;
  float* sinks = bw.sink_partials == nullptr ? nullptr : bw.sink_partials + static_cast<int64_t>(s) * wf.q_heads;
  if (f.q_len == 0 || f.kv_len == 0) {
    // No row attends a key: dQ of its rows, dK and dV of its keys are zeros, and no sink term.
    zero_rows(seq.d_query, f.q_len, w.dq_stride_l, wf.q_heads, w.dq_stride_h, wf.head_dim);
    zero_rows(seq.d_key, f.kv_len, w.dk_stride_l, wf.kv_heads, w.dk_stride_h, wf.head_dim);
    zero_rows(seq.d_value, f.kv_len, w.dv_stride_l, wf.kv_heads, w.dv_stride_h, wf.value_dim);
    if (sinks != nullptr) std::fill(sinks, sinks + wf.q_heads, 0.0f);
    return;
  }
  floats -= lse_floats(f);
  float* lse = scratch + floats;
  for (int32_t h = 0; h < wf.q_heads; h++) {
    std::memcpy(lse + static_cast<int64_t>(h) * f.q_len, w.logsumexp + static_cast<int64_t>(h) * wf.q_len + p.q_starts[s],
                sizeof(float) * static_cast<size_t>(f.q_len));
  }
  seq.logsumexp = lse;
  seq.d_sinks = sinks;
  backward(seq, scratch, floats, pool);  // validated with the whole problem
}

void small_backward_item(void* context, int32_t item, int32_t thread) {
  const PackedBackwardWork& bw = *static_cast<const PackedBackwardWork*>(context);
  run_backward_sequence(bw, bw.order[item].sequence, bw.scratch + static_cast<uint64_t>(thread) * bw.plan.small, bw.plan.small,
                        nullptr);
}

}  // namespace

Status validate_packed_backward(const PackedBackwardProblem& p) {
  if (p.whole.forward.q_len < 0 || p.whole.forward.kv_len < 0) return Status::kBadShape;
  const Status status = validate_backward(with_lengths_at_least_one(p).whole);
  if (status != Status::kOk) return status;
  if (p.whole.d_mask != nullptr) return Status::kBadPacking;
  return check_packing(p.whole.forward, p.sequences, p.q_starts, p.k_starts);
}

namespace {

// The backward's scratch: [sink_partials_floats] the sinks' partials, [order_floats(S)] the
// side-by-side order, then the plan's regions.
uint64_t backward_layout_floats(const PackedBackwardProblem& p, const PackedPlan& plan, int32_t threads) {
  return sink_partials_floats(p) + order_floats(p.sequences) + plan.total(threads);
}

}  // namespace

uint64_t packed_backward_scratch_floats(const PackedBackwardProblem& p, int32_t threads) {
  return backward_layout_floats(p, plan_packed_backward(p, threads), threads);
}

Status backward_packed(const PackedBackwardProblem& p, float* scratch, uint64_t scratch_size, ThreadPool* pool) {
  const Status status = validate_packed_backward(p);
  if (status != Status::kOk) return status;
  const int32_t threads = pool != nullptr ? pool->threads() : 1;
  const PackedPlan plan = plan_packed_backward(p, threads);
  if (!scratch_fits(scratch, scratch_size, backward_layout_floats(p, plan, threads))) return Status::kBadScratch;
  auto sequence_of = [&p](int32_t s) { return backward_sequence(p, s).forward; };
  float* const order_at = scratch + sink_partials_floats(p);
  SequenceWork* order = reinterpret_cast<SequenceWork*>(order_at);
  const int32_t side_by_side = side_by_side_order(plan, p.sequences, sequence_of, order);
  PackedBackwardWork bw{&p, plan, nullptr, order_at + order_floats(p.sequences), order};
  if (p.whole.d_sinks != nullptr) bw.sink_partials = scratch;
  run_tasks(pool, side_by_side, small_backward_item, &bw);
  for (int32_t s = 0; s < p.sequences; s++) {
    if (!plan.side_by_side(sequence_of(s))) run_backward_sequence(bw, s, bw.scratch, plan.large, pool);
  }
  if (p.whole.d_sinks != nullptr) {
    const int32_t heads = p.whole.forward.q_heads;
    for (int32_t h = 0; h < heads; h++) {
      double sum = 0.0;
      for (int32_t s = 0; s < p.sequences; s++) sum += bw.sink_partials[static_cast<int64_t>(s) * heads + h];
      p.whole.d_sinks[h] = static_cast<float>(sum);
    }
    if (p.d_sinks_by_sequence != nullptr) {
      std::memcpy(p.d_sinks_by_sequence, bw.sink_partials, sizeof(float) * static_cast<size_t>(p.sequences) * heads);
    }
  }
  return Status::kOk;
}

}  // namespace sdpa
