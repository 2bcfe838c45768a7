// Forward kernels. See src/sdpa.h for the problem's contract.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sdpa.h"

namespace sdpa {

// One call's share of the work: one (batch, KV head), a range of its "flat rows"
// f = (h - kv_head·group)·Lq + i (the query rows of every head sharing the KV head), and a
// range of keys.
struct KernelWork {
  int32_t b = 0, kv_head = 0;
  int32_t row_begin = 0, row_end = 0;  // 0 <= row_begin < row_end <= group·Lq
  int32_t key_begin = 0, key_end = 0;  // key_begin a multiple of kKeyTile; key_end <= Lk
  // Pack K/V into scratch first (worth it when many row tiles reuse them), or read in place.
  bool pack = false;
  // Null: write output rows (and weights when p.weights is set, over the whole key range).
  // Else a split-K segment: write each row's unnormalised (m, l, o) here, partial_floats(p)
  // per row tile, for sdpa_f32_fwd_merge_partials (a row that attends nothing in the segment
  // may leave o unwritten: with m = -inf its o is never read); no weights, which need the
  // rows' final (m, l): sdpa_f32_fwd_weights_4x512__wasmsimd writes them after the merge.
  float* partials = nullptr;
  // Without pack: the key the K/V pointers of (b, kv_head) start at. 0 for the whole head;
  // key_begin for a streamed segment, whose keys alone were copied in (sdpa.h).
  int32_t stored_from = 0;
  // K/V hold the keys [key_begin, key_end) alone (a streamed segment, segment 0 included): no
  // key outside them may be read.
  bool stored_alone = false;
};

// Floats of scratch one call needs: with KernelWork::pack, room for the packed K/V of one
// head (O(Lk·(E + Ev))); without, only O(tile).
uint64_t sdpa_f32_fwd_4x512__wasmsimd_scratch(const Problem& p, bool packs);
// Floats of partial state one row tile writes in a split-K call.
uint64_t sdpa_f32_fwd_4x512__wasmsimd_partial_floats(const Problem& p);

// Preconditions (asserted): validate(p) == kOk and the KernelWork ranges above; scratch
// holds sdpa_f32_fwd_4x512__wasmsimd_scratch(p, work.pack) floats (any 4-byte alignment) used by this
// call alone.
void sdpa_f32_fwd_ukernel_4x512__wasmsimd(const Problem& p, const KernelWork& work, float* scratch);

// Whether the problem lets the kernel read a split-K decode's float16 K/V in interleaved groups
// of tiles (a KV cache's MHA decode: one query row per KV head, read in order, no mask, ALiBi
// or dropout, E and Ev multiples of 4): the problem's part of the choice, a segment's is that its
// whole group is open to the row. A row read so sums its keys in another order than the same
// row in a problem of more rows per KV head.
bool sdpa_f32_fwd_4x512__wasmsimd_reads_interleaved(const Problem& p);

// Output rows [0, rows) of one (batch, KV head) from `segments` split-K calls' partials,
// laid out [segments][row tiles][partial_floats / 4 per row]. When row_stats is non-null, also
// each row's final (m, l) there, [rows][2], for the weights (with a sink, softmax-sink.h's
// (M, L): the sink included).
void sdpa_f32_fwd_merge_partials(const Problem& p, int32_t b, int32_t kv_head, int32_t rows,
                                 int32_t segments, const float* partials, float* row_stats = nullptr);

// The weights (p.weights) of keys [key_begin, key_end) for flat rows [row_begin, row_end) of
// one (batch, KV head) (work.partials null): exp(s_ij - m_i) / l_i from each row's final
// (m, l), row_stats [row_end - row_begin][2] as the merge writes them, the scores recomputed.
// Scratch as for sdpa_f32_fwd_ukernel_4x512__wasmsimd.
void sdpa_f32_fwd_weights_4x512__wasmsimd(const Problem& p, const KernelWork& work, const float* row_stats,
                                          float* scratch);

}  // namespace sdpa
