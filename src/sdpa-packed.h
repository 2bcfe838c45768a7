// Packed variable-length sequences (FlashAttention's varlen API, cu_seqlens): S independent
// sequences stored back to back, without padding. Sequence s has the query rows
// [q_starts[s], q_starts[s + 1]) and the keys [k_starts[s], k_starts[s + 1]) of one packed
// problem, and attends only to its own keys (a block-diagonal attention):
//   query  [Tq, Hq,  E ]     Tq = q_starts[S]      (any row and head strides: Problem's _l, _h)
//   key    [Tk, Hkv, E ]     Tk = k_starts[S]
//   value  [Tk, Hkv, Ev]
//   output [Tq, Hq,  Ev]
//   logsumexp (optional) [Hq, Tq], dense: row r of head h at h·Tq + r
// The packed problem is a Problem (src/sdpa.h) with batch = 1, q_len = Tq, kv_len = Tk and the
// packed tensors' pointers and strides (the batch strides are not used). Sequence s is then
// the sub-problem of its rows and keys, with every score option of the packed one (scale,
// softcap, causal, sliding_window, sinks) and the causal offset causal_offsets[s] (an array
// of S offsets here), or causal_offset for every sequence, and ALiBi slopes alibi_slopes +
// s·alibi_stride_b (the batch stride counts sequences here: [S, Hq] with stride Hq, or [Hq] for
// every sequence with stride 0), and with dropout the mask of batch dropout_batch_base + s (the
// sequence's index as its batch, src/kernels/dropout.h); so a sequence's rows get the bits
// that forward() gives that sequence alone. Not taken (kBadPacking): a mask, key lengths or
// starts, weights (each sequence has its own Lq × Lk), float16 K/V.
// Tq or Tk may be 0 (every sequence without rows, or without keys).
// A sequence without keys (k_starts[s] == k_starts[s + 1]) has rows with nothing to attend:
// exact zeros, lse = the row's sink or -inf, as in forward(). One without rows adds nothing,
// and its keys get zero gradients.
//
// Work: sequences run whole, side by side, one per pool item (the most multiply-adds first),
// unless one holds at least 1/(4·threads) of the problem's multiply-adds and at least what
// forward() splits over threads (kMinParallelMultiplyAdds, src/parallel/work-split.h): those
// run after them, alone, split over the pool by forward() or backward() itself. Either way a
// sequence's result does not depend on the thread count: bitwise identical for any number of
// threads.
#pragma once

#include <cstdint>

#include "sdpa-backward.h"
#include "sdpa.h"

namespace sdpa {

struct PackedProblem {
  Problem whole;  // batch 1, q_len Tq >= 0, kv_len Tk >= 0; causal_offsets, if not null, has S entries
  int32_t sequences = 0;               // S >= 1
  const int32_t* q_starts = nullptr;   // [S + 1]: 0 = q_starts[0] <= … <= q_starts[S] = Tq
  const int32_t* k_starts = nullptr;   // [S + 1]: 0 = k_starts[0] <= … <= k_starts[S] = Tk
};

// The whole problem's own checks (validate()), then kBadPacking for what it does not take
// (above) or starts that are not as described (kNullPointer for null starts), and kBadDropout
// for a dropout_batch_base + S - 1 past INT32_MAX (the last sequence's batch index). Each sequence is
// then within the whole problem's checked sizes.
Status validate_packed(const PackedProblem& p);

// Sequence s as a problem of its own (batch 1, its rows and keys; no logsumexp). Its q_len or
// kv_len may be 0: forward_packed() handles those without forward().
Problem packed_sequence(const PackedProblem& p, int32_t s);

// Floats of scratch forward_packed() needs on `threads` threads (reads the starts; S ≥ 1 needs
// some). The scratch is the call's only memory besides its tensors (nothing is allocated), at an
// address aligned to 8 bytes (malloc's are): kBadScratch for one smaller, missing or misaligned.
uint64_t packed_scratch_floats(const PackedProblem& p, int32_t threads = 1);

// Writes every output row (and the logsumexp, when whole.logsumexp is set). On failure nothing
// is written.
Status forward_packed(const PackedProblem& p, float* scratch, uint64_t scratch_size, ThreadPool* pool = nullptr);

// The backward of a packed problem: `whole` is the BackwardProblem of the packed one (its
// forward as above, logsumexp [Hq, Tq] from forward_packed(), the gradients' packed pointers
// and strides; d_mask not taken). Sequence s's gradients are backward()'s for it alone;
// d_sinks, when asked for, is the sum over the sequences in order: each sequence's d_sinks
// (a float: its sum in double, as backward() makes it), added in double from 0 and rounded to
// float once. d_sinks_by_sequence [S, Hq], when set with d_sinks, receives those per-sequence
// floats, so that a caller running the sequences in several calls (the TypeScript layer's
// chunks) can add them itself and get d_sinks' bits.
struct PackedBackwardProblem {
  BackwardProblem whole;
  int32_t sequences = 0;
  const int32_t* q_starts = nullptr;
  const int32_t* k_starts = nullptr;
  float* d_sinks_by_sequence = nullptr;  // [S, Hq]; only with whole.d_sinks
};

Status validate_packed_backward(const PackedBackwardProblem& p);
// As packed_scratch_floats(): the call's only memory besides its tensors, 8-byte aligned.
uint64_t packed_backward_scratch_floats(const PackedBackwardProblem& p, int32_t threads = 1);
// Writes every element of d_query, d_key, d_value (and d_sinks). On failure nothing is written.
Status backward_packed(const PackedBackwardProblem& p, float* scratch, uint64_t scratch_size,
                       ThreadPool* pool = nullptr);

}  // namespace sdpa
