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
  // With pack: K/V of (b, kv_head) already packed here by sdpa_f32_fwd_pack_4x512__wasmsimd
  // (at least the keys this work's rows attend; 16-byte aligned), shared with other calls:
  // this call packs nothing and its scratch needs no room for them. Null: pack into scratch.
  const float* packed = nullptr;
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

// How a call reads K/V, as its scratch needs to know: in place (no KernelWork::pack), packed
// into its own scratch (pack), or packed once for several calls (pack and KernelWork::packed).
enum class KvReading { kInPlace, kPacksIntoScratch, kPackedElsewhere };
// Floats of scratch one call needs: packing into it, room for the packed K/V of one head
// (O(Lk·(E + Ev))); else O(tile): a row tile's query forms and o, kRowTileBlock of them when
// K/V are packed (src/tiles.h), and one tile's scores and bias.
uint64_t sdpa_f32_fwd_4x512__wasmsimd_scratch(const Problem& p, KvReading reading);

// K/V of one (batch, KV head) packed once for several calls (KernelWork::packed), in the layout
// a packing call gives its scratch: K [round_up(Lk, 8)/8][E][8], then V [Ev8/8][Lk][8].
// Floats they take (the buffer 16-byte aligned):
uint64_t sdpa_f32_fwd_4x512__wasmsimd_packed_floats(const Problem& p);
// The keys a packing call for flat rows [row_begin, row_end) of batch b packs: the most any
// of its rows attends (its key limit: key length, causal frontier).
int32_t sdpa_f32_fwd_4x512__wasmsimd_packed_keys(const Problem& p, int32_t b, int32_t row_begin, int32_t row_end);
// Packs keys [key_begin, key_end) of (b, kv_head) into `packed` (packed_floats(p), 16-byte
// aligned): key_begin a multiple of kKeyGroup, key_end <= Lk; the last group is zero padded
// when key_end is not a multiple of kKeyGroup. Calls over consecutive ranges (from any
// threads) that cover [0, n) give one packing call's bytes for the keys [0, n): n must be at
// least the packed keys of every call that reads them (…_packed_keys of its rows).
void sdpa_f32_fwd_pack_4x512__wasmsimd(const Problem& p, int32_t b, int32_t kv_head, int32_t key_begin,
                                       int32_t key_end, float* packed);
// Floats of partial state one row tile writes in a split-K call.
uint64_t sdpa_f32_fwd_4x512__wasmsimd_partial_floats(const Problem& p);

inline KvReading kv_reading(const KernelWork& w) {
  return !w.pack ? KvReading::kInPlace : w.packed == nullptr ? KvReading::kPacksIntoScratch : KvReading::kPackedElsewhere;
}

// Preconditions (asserted): validate(p) == kOk and the KernelWork ranges above; scratch
// holds sdpa_f32_fwd_4x512__wasmsimd_scratch(p, kv_reading(work)) floats (any 4-byte alignment) used by this
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
