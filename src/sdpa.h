// sdpa-wasm: scaled dot-product attention, softmax(Q·Kᵀ·scale + mask)·V.
//
// Shapes (logical; strides below say where each element lives):
//   query  [B, Hq,  Lq, E ]
//   key    [B, Hkv, Lk, E ]
//   value  [B, Hkv, Lk, Ev]
//   output [B, Hq,  Lq, Ev]
//   weights (optional) [B, Hq, Lq, Lk], always dense row-major
//   mask (optional), broadcast to [B, Hq, Lq, Lk] through zero strides
// Hq % Hkv == 0; query head h reads KV head h / (Hq / Hkv) (grouped-query attention).
//
// Key and value elements are float32, or IEEE float16 (binary16) or bfloat16 for the 16-bit KV
// caches (kv_type): the kernel widens them to float32 as it reads them
// (src/math/f16-f32-cvt-wasmsimd.h, src/math/bf16-f32-cvt-wasmsimd.h), so a 16-bit problem is
// the float32 problem on the elements' exact values.
//
// All strides are in ELEMENTS (not bytes). The innermost axis of query, key, value and
// output (E or Ev) is contiguous; the others have explicit strides, so both the
// [B, H, L, E] and the [B, L, H, E] layouts are described without copies.
//
// The score of query row i and key j, in the order the operations are applied:
//   s  = scale · (q_i · k_j)
//   s  = softcap · tanh(s / softcap)                     if softcap > 0
//   s  = s + (mask[b, h, i, j] + alibi[b, h, i, j])      float mask (may be -inf), ALiBi bias
//        alibi = -(slope[b, h] · |i + offset - j|)         with ALiBi slopes, else 0 (a bool mask
//                                                          or none: s + alibi); offset as below,
//                                                          causal or not (src/kernels/alibi.h)
//   s  = -inf  where bool mask == 0, where j >= key_lengths[b] or j < key_starts[b],
//              or (causal) where j > i + offset (causal_offsets[b], or causal_offset for every b),
//              or (causal, sliding window W) where j <= i + offset - W: each row attends at most the
//              W most recent keys up to its causal frontier
// Output row i = Σ_j softmax_j(s) · v_j. A row whose every key is blocked (-inf) has no
// softmax; its output (and weights) are exact zeros.
// With dropout (dropout_threshold > 0), each softmax_j(s) is then dropped or kept and multiplied
// by 1 / (1 - dropout probability), by a mask drawn from the seed and (b, h, i, j): output row
// i = Σ_j softmax_j(s)·z_ij·v_j, and the weights are softmax_j(s)·z_ij (src/kernels/dropout.h).
// The log-sum-exp is the softmax's own, without dropout.
// With sinks (gpt-oss), the softmax of each row of query head h has one more logit, sinks[h],
// taken as it is (not scaled, capped or masked), whose value row is zero: the keys' weights
// sum to 1 - exp(sinks[h] - lse), and the output is Σ_j p_j·v_j with those weights. A fully
// blocked row's output is still exact zeros (its lse is sinks[h]). src/kernels/softmax-sink.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sdpa {

enum class MaskKind : int32_t { kNone = 0, kFloat = 1, kBool = 2 };
// The element type of key and value (query, output, weights and float masks are float32).
// kFloat16Finite: IEEE halves known to hold no exponent-31 pattern (no Inf, no NaN), which the
// kernel widens with half the instructions (a KV cache knows what it stored; the results are
// the same bits as kFloat16 on such data).
// kBFloat16: bfloat16, the upper 16 bits of a float32 (every pattern widens exactly with a shift).
enum class KvType : int32_t { kFloat32 = 0, kFloat16 = 1, kFloat16Finite = 2, kBFloat16 = 3 };

// IEEE halves (either kind).
inline bool is_half(KvType type) { return type == KvType::kFloat16 || type == KvType::kFloat16Finite; }
// Stored in 16 bits (uint16_t elements): halves or bfloat16.
inline bool is_16_bit(KvType type) { return is_half(type) || type == KvType::kBFloat16; }
inline bool is_known(KvType type) { return type == KvType::kFloat32 || is_16_bit(type); }

// One attention problem. Pointers are not owned. Inputs are never written.
struct Problem {
  int32_t batch = 0;        // B
  int32_t q_heads = 0;      // Hq
  int32_t kv_heads = 0;     // Hkv
  int32_t q_len = 0;        // Lq
  int32_t kv_len = 0;       // Lk
  int32_t head_dim = 0;     // E  (query and key)
  int32_t value_dim = 0;    // Ev (value and output)

  const float* query = nullptr;
  int64_t q_stride_b = 0, q_stride_h = 0, q_stride_l = 0;
  KvType kv_type = KvType::kFloat32;
  const void* key = nullptr;  // float (kFloat32) or uint16_t (halves: kFloat16, kFloat16Finite; kBFloat16)
  int64_t k_stride_b = 0, k_stride_h = 0, k_stride_l = 0;
  const void* value = nullptr;  // like key
  int64_t v_stride_b = 0, v_stride_h = 0, v_stride_l = 0;
  float* output = nullptr;
  int64_t o_stride_b = 0, o_stride_h = 0, o_stride_l = 0;

  float scale = 0.0f;       // any finite number
  float softcap = 0.0f;     // 0 = off, else > 0

  MaskKind mask_kind = MaskKind::kNone;
  const void* mask = nullptr;  // float* (kFloat) or uint8_t* (kBool, 1 = may attend)
  // Broadcast strides over [B, Hq, Lq, Lk]: 0 on an axis the mask does not have.
  int64_t mask_stride_b = 0, mask_stride_h = 0, mask_stride_q = 0, mask_stride_k = 0;

  bool causal = false;
  // Per-batch causal offsets [B], or nullptr for one offset for all batches.
  const int32_t* causal_offsets = nullptr;
  int32_t causal_offset = 0;
  // 0: no window. W >= 1 (causal only): row i may attend keys j > i + offset - W besides
  // j <= i + offset, the W keys ending at its diagonal (Mistral's and Gemma's sliding window;
  // FlashAttention's window_size = (W - 1, 0)). Blocked keys before the window are skipped as
  // those past the frontier are.
  int32_t sliding_window = 0;
  // Per-batch valid key counts [B] in [0, Lk], or nullptr for Lk.
  const int32_t* key_lengths = nullptr;
  // Per-batch first valid keys [B] in [0, Lk], or nullptr for 0: keys j < key_starts[b] are
  // padding (a left-padded batch), skipped as those past key_lengths[b] are.
  const int32_t* key_starts = nullptr;
  // Per-query-head sink logits [Hq] (finite, or -inf for a head without one), or nullptr for
  // none: see the score pipeline above.
  const float* sinks = nullptr;
  // ALiBi (Press et al.; FlashAttention's alibi_slopes, llama.cpp's max_bias): slopes in
  // [0, kMaxAlibiSlope], slope of (b, h) at alibi_slopes[b·alibi_stride_b + h] ([Hq] with
  // stride 0, [B, Hq] with stride Hq), or nullptr for none. Key j of row i gets the bias
  // -(slope · |i + offset - j|) (offset: causal_offsets[b] or causal_offset, used whether or not
  // the problem is causal), added with the mask: see the score pipeline above.
  const float* alibi_slopes = nullptr;
  int64_t alibi_stride_b = 0;
  // Attention dropout (src/kernels/dropout.h): 0 for none; else the probability of (b, h, i, j)
  // is dropped where its bits, drawn from dropout_seed and (dropout_batch_base + b,
  // dropout_head_base + h, dropout_row_base + i, j), are below dropout_threshold, and kept and
  // scaled otherwise. The bases (>= 0) place this problem's batch 0, query head 0 and query row 0
  // in the call's (a packed sequence, a chunk of them, one (batch, KV head) or a few rows of one
  // query head computed alone draws the call's mask); base + B - 1, base + Hq - 1 and
  // base + Lq - 1 are at most INT32_MAX.
  uint32_t dropout_threshold = 0;
  uint32_t dropout_seed = 0;
  int32_t dropout_batch_base = 0;
  int32_t dropout_head_base = 0;
  int32_t dropout_row_base = 0;

  float* weights = nullptr;  // optional [B, Hq, Lq, Lk] softmax probabilities
  // Optional [B, Hq, Lq], dense: each row's log-sum-exp of its scores, log Σ_j exp(s_j)
  // (computed as m + log l from the online softmax's maximum m and sum l), -inf for a row
  // with nothing to attend. What the backward pass recomputes the probabilities from
  // (src/sdpa-backward.h): p_j = exp(s_j - lse), for the rows where float32 makes that
  // precise enough (src/kernels/sdpa-bwd-kernels.h, RowStats).
  float* logsumexp = nullptr;

  // A hint for the decode path (K/V read in place), which never changes the result's value
  // beyond float rounding and never depends on the thread count: true when K/V come from main
  // memory rather than the core's caches (a KV cache's storage, read once per step). Keys
  // are then read in memory order, as a few far-apart streams the hardware prefetcher follows
  // (float16 MHA: each stream's keys from a whole group of tiles, interleaved); V
  // rows too, key after key, in P·V (one query row per KV head), or touched as their keys are
  // scored (more rows); false (K/V just copied in, still in cache): four keys at a time, fewer
  // instructions per key.
  bool read_kv_in_order = false;
};

enum class Status : int32_t {
  kOk = 0,
  kBadShape = 1,        // a dimension < 1, or Hq % Hkv != 0, or sizes past kMaxCount or
                        // kMaxHeadDim (below)
  kNullPointer = 2,     // a required pointer is null
  kBadScale = 3,        // scale not finite
  kBadSoftcap = 4,      // softcap < 0 or not finite
  kBadKeyLength = 5,    // key_lengths[b] or key_starts[b] outside [0, Lk]
  kBadStride = 6,       // a negative stride
  kBadScratch = 7,      // scratch missing or smaller than scratch_floats() (packed calls: or not 8-byte aligned)
  kBadKvType = 9,       // kv_type is not a KvType
  kBadMaskKind = 10,    // mask_kind is not a MaskKind
  kBadSegment = 8,      // forward_segment()/merge_segments() on a problem they do not take,
                        // a segment index outside [0, segment_count(p)), or partials null
  kBadMaskGrad = 11,    // backward() asked for the mask's gradient (d_mask) of a problem whose
                        // mask is not MaskKind::kFloat
  kBadWindow = 12,      // sliding_window < 0, or > 0 without causal
  kBadSink = 13,        // a sink that is NaN or +inf
  kBadAlibi = 15,       // an ALiBi slope that is NaN, negative or above kMaxAlibiSlope
  kBadDropout = 16,     // dropout_batch_base < 0, or past INT32_MAX - (B - 1) (a packed problem's:
                        // INT32_MAX - (S - 1)), or dropout_head_base < 0 or past
                        // INT32_MAX - (Hq - 1), or dropout_row_base < 0 or past INT32_MAX - (Lq - 1):
                        // the call's indices base + b, base + h and base + i are int32
  kBadPacking = 14,     // packed sequences (src/sdpa-packed.h): starts not 0 = s[0] <= … <= s[S] =
                        // Tq (or Tk), S < 1, or what a packed problem does not take (batch != 1,
                        // a mask, key lengths or starts, weights, float16 K/V, d_mask)
};

const char* status_name(Status status);

// The largest sizes validate() accepts. The kernels count flat rows, keys, key tiles and work
// items in 32-bit integers: Lq, Lk, B·Hq, (Hq/Hkv)·Lq and B·Hkv·segment_count(p) are at most
// kMaxCount, so that sums of a few counts (one rounded up to a tile, stepped past its end)
// never overflow; E and Ev at most kMaxHeadDim. No problem whose elements all exist comes near
// this (the wasm module's 2 GB memory holds 2^29 floats); only zero strides describe one.
constexpr int32_t kMaxCount = 1 << 29;
constexpr int32_t kMaxHeadDim = 1 << 20;
// The largest ALiBi slope validate() accepts: a distance |i + offset - j| is below 2^32, so every
// bias -(slope · distance) stays finite (at least -2^96) and never blocks a key as -inf would.
constexpr float kMaxAlibiSlope = 18446744073709551616.0f;  // 2^64
// Whether every ALiBi slope of rows [0, rows) of p.alibi_slopes (rows alibi_stride_b apart, Hq
// each; a stride of 0 has one row) is in [0, kMaxAlibiSlope]; true without slopes. validate()
// checks B rows; a packed problem (src/sdpa-packed.h) S, one per sequence.
bool alibi_slopes_valid(const Problem& p, int32_t rows);

// Checks what the kernel relies on. The TypeScript layer validates first and gives the
// user-facing message; this is the C++ boundary's own guard (tests, fuzzers, bindings).
Status validate(const Problem& p);

class ThreadPool;

// Whether forward() takes the decode path for this problem: at most kDecodeMaxRowTiles row
// tiles of query rows per KV head (src/tiles.h: e.g. Lq = 1 with up to 32 query heads per KV
// head), so K and V are read in place, once, instead of being packed. Callers that copy K/V
// in may then copy and run one (batch, KV head) at a time, so that the kernel reads them
// while they are in cache.
bool reads_keys_in_place(const Problem& p);

// Whether forward() of query heads [first, first + count) of one KV head's group (its Hq / Hkv
// query heads) of p, run as a problem of their own (batch = 1, q_heads = count, kv_heads = 1,
// the pointers moved to those heads), gives their rows the bits forward(p) gives them: a
// caller may then run a call too large for its memory a few query heads at a time. A row's
// bits depend on the path (packed or in place: reads_keys_in_place) and on the rows sharing its
// row tile of kQueryTile flat rows (src/tiles.h; flat row (h - first head of the group)·Lq + i):
// the tile's row count picks the decode's chains and streams, and its rows' limits which keys
// P·V multiplies unconditionally and where the decode's four-key groups end; and a problem of
// one row per KV head may read a KV cache's float16 keys in another order (interleaved groups of
// tiles). So the slice must take the same path, keep the same tiles (start on a tile's first
// row, end on a tile's last or at the group's end) and read its keys in the same order
// (sdpa_f32_fwd_4x512__wasmsimd_reads_interleaved, src/kernels/sdpa-kernels.h).
bool query_heads_keep_bits(const Problem& p, int32_t first, int32_t count);

// Whether forward() of every query head of p cut into slices of `rows` query rows (rows
// [r, r + rows) of a head, r = 0, rows, 2·rows…; the last slice of a head may have fewer), each
// run as a problem of its own (batch = 1, q_heads = 1, kv_heads = 1, q_len = the slice's rows,
// the pointers moved to its first row, causal_offset = the batch's offset + r, causal_offsets
// null, dropout_row_base = r), gives their rows the bits forward(p) gives them: a caller may then
// run a query head too large for its memory a few rows at a time. As for query_heads_keep_bits,
// every slice must take p's path, keep p's row tiles (the group's flat rows g·Lq + r of head g:
// each slice starts on a tile's first row) and read its keys in p's order; and each slice's
// offset, the batch's + r, must be an int32 (ALiBi's offsets are not clamped to [-Lq, Lk]).
// False for rows outside [1, Lq).
bool query_rows_keep_bits(const Problem& p, int32_t rows);
// The least row count r >= at_least (r < Lq) for which query_rows_keep_bits(p, r), or 0 if
// there is none: what a caller going down from half of Lq asks, without trying every count.
int32_t least_query_rows(const Problem& p, int32_t at_least);

// Number of floats of scratch that forward() needs on `threads` threads: per thread, the
// packed K/V of one head (O(Lk·(E + Ev)); none on the decode path, which reads K/V in place)
// plus O(tile) for the rest, the split-K partial states and each row's final (m, l) for the
// weights; never O(Lq·Lk). It depends on the shapes alone, not on which pointers are set, so a
// caller may size the scratch before it has the addresses.
// 64-bit even in wasm32, where a 32-bit size_t could wrap around for huge problems.
uint64_t scratch_floats(const Problem& p, int32_t threads = 1);

// Computes p.output (and p.weights when non-null). `scratch` holds at least
// scratch_floats(p, threads) floats, where threads = pool ? pool->threads() : 1. Work is split
// over (batch, KV head, block of query rows); every output row is computed by the same
// sequence of operations whatever the split, so results are bitwise identical for any
// number of threads. Returns kOk or the first check that failed; on failure nothing is
// written.
Status forward(const Problem& p, float* scratch, uint64_t scratch_size, ThreadPool* pool = nullptr);

// Streamed decoding, for a caller that copies K/V in (the TypeScript layer): instead of
// copying a whole (batch, KV head) (megabytes, which land in the last-level cache) and then
// reading it, the caller copies one segment of keys at a time into a buffer the size of a
// segment, which stays in the core's own cache, and runs the kernel on it at once:
//   for s in [0, segment_count(p)): copy keys [s·K, min(Lk, (s+1)·K)) of K and V, where
//       K = segment_keys(); forward_segment(p, s, …)
//   merge_segments(p, partials)
// p is one (batch, KV head): batch == 1 and kv_heads == 1 (point query/output/mask at the
// pair's first query head), on the decode path (reads_keys_in_place(p)), without weights, and
// not float16 read in order (forward() reads those as a KV cache's, whose float16 MHA decode
// takes each stream's keys from a whole group of tiles: a segment copied alone cannot).
// For each call, p.key and p.value point at the segment's first key, with the problem's
// strides (k_stride_b/h and v_stride_b/h are not used). The segments are forward()'s own
// split-K segments, merged in the same order: the output is bitwise identical to forward().
int32_t segment_keys();
int32_t segment_count(const Problem& p);
// Floats of scratch one forward_segment() call needs: O(tile).
uint64_t segment_scratch_floats(const Problem& p);
// Floats of partial state for all segments: forward_segment(p, s) writes the s-th part.
uint64_t segment_partials_floats(const Problem& p);
Status forward_segment(const Problem& p, int32_t segment, float* partials, float* scratch,
                       uint64_t scratch_size);
// Writes p.output from the partials of every segment.
Status merge_segments(const Problem& p, const float* partials);

}  // namespace sdpa
