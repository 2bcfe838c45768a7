// Blocked online-softmax attention forward (FlashAttention style), 128-bit wasm SIMD.
// Tiles: 4 query rows × 512 keys (src/tiles.h). Never materialises the [Lq, Lk] scores.
//
// Online softmax, for one query row over key tiles t = 1, 2, …:
//   m_t = max(m_{t-1}, max_j s_j)                running maximum (m_0 = -inf)
//   α_t = exp(m_{t-1} - m_t)                     rescale of what was summed so far
//   l_t = α_t·l_{t-1} + Σ_j exp(s_j - m_t)       running sum of the softmax denominator
//   o_t = α_t·o_{t-1} + Σ_j exp(s_j - m_t)·v_j   unnormalised output row
// and finally out = o / l, or exact zeros when l == 0 (every key of the row was blocked).
// Each tile's Σ_j is summed from zero and then added (pv_block; l's Σ_j is the tile's row sum):
// sums over many tiles lose a tile's and the tiles' count's bits, not a bit per doubling of o.
// With dropout (src/kernels/dropout.h) o sums exp(s_j - m_t)·z_j·v_j instead, z_j the key's
// dropout factor or 0, while l stays the softmax's own sum: each tile's probabilities are
// dropped after its row sums are taken and before P·V (drop_tile).
// A sink (gpt-oss, Problem::sinks) joins each row once, at that end: M = max(m, sink),
// L = l·exp(m - M) + exp(sink - M), out = o·exp(m - M) / L (softmax-sink.h, add_sink).
// Every exponent is s - m <= 0, so exp never overflows whatever the logits' magnitude; and
// exp flushes weights under 2^-64 (of the row maximum's 1) to exact zeros, so no subnormal
// number is ever made (src/math/f32-vexp-nonpositive-rr1-p5-wasmsimd.h).
// Independent partial results (m, l, o) over disjoint key ranges merge exactly the same way
// (split-K, for decoding: see sdpa_f32_fwd_merge_partials). The weights exp(s - m) / l need each row's
// final m and l: a pass of their own after the online softmax, or after the merge, scores the
// keys again (write_row_tile_weights).
//
// The rows of a tile are "flat rows" f = (h - first head of the KV group)·Lq + i: the query
// rows of all heads sharing one KV head (GQA), so that a decode step (Lq = 1) with 4 query
// heads per KV head fills one tile and reads each key once for all of them.
//
// K and V are float32, or 16-bit (a KV cache's float16 or bfloat16 storage, p.kv_type): 16-bit
// elements are widened to float32 as they are loaded (F16Elements, BF16Elements), exactly, so
// all arithmetic is float32 and a 16-bit problem gives what the float32 kernel gives on the
// elements' values, but for a decode of one query row per KV head read in memory order, where
// the two read K and V in a different number of streams (kDecodeStreams): there the sums'
// order, and the last bits, differ. The loops depend on the element's size only, so float16
// and bfloat16 problems on the same values give the same bits.
//
// K and V are either packed into scratch once per call (prefill: many row tiles reuse them)
// or read in place (decode: up to kDecodeMaxRowTiles row tiles read each key segment, the
// first from memory and the others from the core's cache, where a packing pass would add a
// whole extra read and write). Packed, K is [Lk/8][E][8] (two loads give 8 keys at one
// dim: Q·Kᵀ) and V is [Ev8/8][Lk][8] (8-column blocks, zero-padded past Ev: a P·V pass over
// one block reads its keys' columns as one contiguous run; row-major V read in place was 10%
// slower at N = 2048 in A/B runs, the same at N = 512). In place, a decode whose K/V come
// from main memory (a KV cache's storage, p.read_kv_in_order) scores keys in memory order
// (score_tile_in_place): only sequential streams keep the hardware prefetcher ahead, and
// several far-apart streams side by side keep more of it in flight (score_keys_in_streams,
// kDecodeStreams: 2 to 4 parts of the tile). With one query row (MHA), P·V then streams V the
// same way (pv_row_in_order); with more rows, each V row is touched as its key is scored, and
// P·V (column blocks, fewer instructions per row) finds the tile in cache. A 16-bit MHA
// decode's split-K segments (one tile each) read whole groups of 4 tiles interleaved, so that
// each stream runs through a quarter of the group rather than of one tile
// (interleaved_first_key, KeyValueSource::stream_keys).
// K/V just copied in are still in cache: there four keys at a time take fewer instructions
// (score_tile_4_keys).
// Where each path lives: this file has the element readers, the scratch layout, the bias, the
// softmax, the prefill's packing and micro-kernels, P·V by column blocks and the tile loop;
// the decode's scoring of K read in place (four keys at a time, or in streams in memory
// order) is f32-sdpa-fwd-score-in-place-wasmsimd.inc, and one row's P·V streaming V in memory
// order is f32-sdpa-fwd-pv-in-order-wasmsimd.inc, both included below inside this file's
// anonymous namespace.
//
// Blocked keys never reach the arithmetic as values: causal and key-length limits are loop
// bounds (per row: keys j < limit[r]), a row's start another (keys j >= start[r]: the batch's first key, its window's);
// K/V are packed only up to the furthest key any row may see; tiles whose keys are all blocked
// (every row's start lies past them, or its limit ends before them) are skipped, and the
// columns blocked for every row at either end of a tile are not scored; and inside a partly blocked tile
// a blocked key's probability is exactly 0 and its V row is skipped, not multiplied by 0,
// so NaN or garbage in padding cannot leak into the output.
#include "kernels/sdpa-kernels.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/alibi.h"
#include "kernels/dropout.h"
#include "kernels/f32-tile-ops-wasmsimd.h"
#include "kernels/row-limits.h"
#include "kernels/softmax-sink.h"
#include "math/bf16-f32-cvt-wasmsimd.h"
#include "math/f16-f32-cvt-wasmsimd.h"
#include "math/f32-vexp-nonpositive-rr1-p5-wasmsimd.h"
#include "simd/copy-bytes.h"
#include "simd/f32x4.h"
#include "tiles.h"

namespace sdpa {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// How key and value elements are read where they are read in place (and when packed):
// float32 as they are, or float16 or bfloat16 widened to float32 in registers (exactly: every
// half and every bfloat16 is a float). Everything after the load is float32 arithmetic, the
// same for all.
// kReadScale: what load4 and scalar return is the element's value times kReadScale, a power
// of two; 1 but for F16FiniteScaledElements, whose readers multiply the other factor of every
// product (the scaled query, the probability) by 1 / kReadScale instead (exact: see there).
// F32Elements (float32 as they are) is in f32-tile-ops-wasmsimd.h: the backward packs with it.
struct F16Elements {
  using Elem = uint16_t;
  static constexpr float kReadScale = 1.0f;
  F16Constants c = make_f16_constants();
  v128_t load4(const uint16_t* p) const { return f16x4_load_as_f32(p, c); }
  float scalar(uint16_t h) const { return f16_to_f32(h); }
};
// Halves without Inf/NaN patterns (KvType::kFloat16Finite): 4 instructions per 4 halves, not 8
// (packing, and a decode whose queries are too large for F16FiniteScaledElements' 3).
struct F16FiniteElements {
  using Elem = uint16_t;
  static constexpr float kReadScale = 1.0f;
  F16Constants c = make_f16_constants();
  v128_t load4(const uint16_t* p) const { return f16x4_load_finite_as_f32(p, c); }
  float scalar(uint16_t h) const { return f16_to_f32(h); }
};
// The same halves read as value·2^-112: 3 instructions per 4 halves, or 6 per 8 (load8). The
// 2^112 goes into the other factor: q_tile = (scale·q)·2^112 and p·2^112 in P·V. Both products
// are then the same real numbers as with the widened halves, so every rounding, and the
// result, is bitwise the same, provided (scale·q)·2^112 stays finite: |scale·q| < 2^16 for
// every query element (query_fits_scaled_halves), and p·2^112 too: p <= 1 fits, and so does
// a dropped p·z <= z while the dropout factor z < 2^16 (probabilities_fit_scaled_halves; a
// keep share of 2^-16 or less makes z·2^112 overflow). Only for K/V read in place (packed
// K/V are float32, read by kF32Elements).
struct F16FiniteScaledElements {
  using Elem = uint16_t;
  static constexpr float kReadScale = 0x1p-112f;
  F16Constants c = make_f16_constants();
  v128_t load4(const uint16_t* p) const { return f16x4_load_finite_as_f32_times_2_minus_112(p, c); }
  void load8(const uint16_t* p, v128_t* first, v128_t* second) const {
    f16x8_load_finite_as_f32_times_2_minus_112(p, c, first, second);
  }
  void load8_even_odd(const uint16_t* p, v128_t* even, v128_t* odd) const {
    f16x8_load_finite_even_odd_as_f32_times_2_minus_112(p, c, even, odd);
  }
  float scalar(uint16_t h) const { return f16_to_f32(h) * kReadScale; }  // exact: at least 2^-136
};
// bfloat16 (KvType::kBFloat16), exact for every pattern: 2 instructions per 4 elements (load4),
// two shuffles per 8 (load8), or a shift and an AND per 8 (load8_even_odd).
struct BF16Elements {
  using Elem = uint16_t;
  static constexpr float kReadScale = 1.0f;
  v128_t upper_mask = wasm_i32x4_splat(static_cast<int32_t>(0xFFFF0000u));
  v128_t load4(const uint16_t* p) const { return bf16x4_load_as_f32(p); }
  void load8(const uint16_t* p, v128_t* first, v128_t* second) const { bf16x8_load_as_f32(p, first, second); }
  void load8_even_odd(const uint16_t* p, v128_t* even, v128_t* odd) const {
    bf16x8_load_even_odd_as_f32(p, upper_mask, even, odd);
  }
  float scalar(uint16_t b) const { return bf16_to_f32(b); }
};

// Whether Src has load8 (8 elements as two vectors, with fewer instructions than two load4s;
// its halves are also what load8_even_odd reads without shuffles). load8 serves P·V's column
// blocks (pv_block, GQA's tiles: 0.93–0.98× the time; in even-odd order, the accumulators
// rearranged around the loop, 1.17× from main memory on the Zen 5 host); GQA's scoring (4 rows
// × 2 streams) in 8-dim steps took 1.05–1.14× the time (4 vectors of K live per step, not 2).
// The float16 MHA decode's loops with a constant stream spacing (score_keys_in_streams,
// add_value_rows) took load8 too (with K/V in L2, 0.89–0.93× the step's time of load4s on an
// Intel Xeon, family 6 model 167) until load8_even_odd (0.91–0.99× on an AMD EPYC Zen 5,
// family 26 model 2).
// BF16Elements has both as well, each cheaper than two load4s.
template <typename Src>
constexpr bool kLoadsEight = std::is_same_v<Src, F16FiniteScaledElements> || std::is_same_v<Src, BF16Elements>;

// The float16 MHA decode (one query row per tile, halves read in place in memory order:
// score_keys_in_streams, add_value_parts) takes each block of 8 dims as its even dims (0, 2, 4,
// 6) and its odd dims (1, 3, 5, 7): F16FiniteScaledElements reads them with shifts and ANDs
// (f16x8_load_finite_even_odd_as_f32_times_2_minus_112), where dims 0..3 and 4..7 take two
// shuffles too. Scoring's two chains are then the even and the odd dims, for
// every reader of halves (the other readers shuffle two 4-dim loads): one key's score has the
// same bits whichever reader and loop scores it. The one place that says when.
template <typename Elem>
constexpr bool even_odd_dims(int rows) {
  return std::is_same_v<Elem, uint16_t> && rows == 1;
}

// Elements 0..3 in first and 4..7 in second as *even (0, 2, 4, 6) and *odd (1, 3, 5, 7).
inline void split_even_odd(v128_t first, v128_t second, v128_t* even, v128_t* odd) {
  *even = wasm_i32x4_shuffle(first, second, 0, 2, 4, 6);
  *odd = wasm_i32x4_shuffle(first, second, 1, 3, 5, 7);
}

// The 8 elements at p as *even (0, 2, 4, 6) and *odd (1, 3, 5, 7).
template <typename Src>
inline void load8_even_odd(const Src& src, const typename Src::Elem* p, v128_t* even, v128_t* odd) {
  if constexpr (kLoadsEight<Src>) {
    src.load8_even_odd(p, even, odd);
  } else {
    split_even_odd(src.load4(p), src.load4(p + 4), even, odd);
  }
}

// x[0 .. 8) in even-odd order (x0 x2 x4 x6 x1 x3 x5 x7) at to, and back.
inline void store_even_odd(const float* x, float* to) {
  v128_t even, odd;
  split_even_odd(wasm_v128_load(x), wasm_v128_load(x + 4), &even, &odd);
  wasm_v128_store(to, even), wasm_v128_store(to + 4, odd);
}
inline void store_in_order(const float* even_odd, float* to) {
  const v128_t even = wasm_v128_load(even_odd), odd = wasm_v128_load(even_odd + 4);
  wasm_v128_store(to, wasm_i32x4_shuffle(even, odd, 0, 4, 1, 5));
  wasm_v128_store(to + 4, wasm_i32x4_shuffle(even, odd, 2, 6, 3, 7));
}

// v[0 .. kVecs) = the 4·kVecs elements at row, 8 at a time where Src has load8 (the same values).
template <int kVecs, typename Src>
inline void load_row_vectors(const Src& src, const typename Src::Elem* row, v128_t* v) {
  int k = 0;
  if constexpr (kLoadsEight<Src>) {
    for (; k + 2 <= kVecs; k += 2) src.load8(row + 4 * k, &v[k], &v[k + 1]);
  }
  for (; k < kVecs; k++) v[k] = src.load4(row + 4 * k);
}

int32_t value_cols_padded(const Problem& p) { return round_up(p.value_dim, kValueBlock); }

// Floats between the 8-column blocks of packed V: one block holds every key's 8 columns.
int64_t packed_value_block_floats(const Problem& p) { return static_cast<int64_t>(p.kv_len) * kValueBlock; }

// Scratch layout, in floats, for one call; every part starts 16-byte aligned.
//   packed_key   [round_up(Lk, 8) / 8][E][8]         key j, dim d at ((j/8)·E + d)·8 + j%8
//   packed_value [Ev8/8][Lk][8]                      Ev8 = round_up(Ev, kValueBlock): key j,
//                                                    column c at (c/8)·Lk·8 + j·8 + c%8
//   q_tile       [T][4][E]                           scale·q of the tile's rows, 0 past its rows
//   q_cols       [T][E][4]                           q_tile interleaved (for packed K), or
//   q_blocks     [T][E4/4][rows][4]                  q_tile by 4-dim blocks (for K read in place
//                                                    in memory order): dim d < E4 = E & ~3 of
//                                                    row r at (d/4)·rows·4 + r·4 + d%4; one
//                                                    part, as a call reads K one way
//   scores       [4][kKeyTile]                       scores, then probabilities, of one tile
//   bias         [4][kKeyTile]                       0, mask value, or -inf (blocked)
//   acc          [T][4][Ev8]                         unnormalised output rows o
// T slots, one per row tile of a block sharing each key tile (row_tile_slot): kRowTileBlock
// when K/V are packed (prefill), else 1 (K/V read in place: one row tile at a time).
// The two packed parts are the call's own only when it packs K/V itself; else they are empty
// (K/V read in place, or packed once for several calls: KernelWork::packed, the same two
// parts in a buffer of their own).
struct Scratch {
  float* packed_key;
  float* packed_value;
  float* q_tile;
  float* q_cols;
  float* q_blocks;
  float* scores;
  float* bias;
  float* acc;
};

// Sizes in 64 bits: for huge problems the total must not wrap around a 32-bit size_t (it is
// checked against the scratch the caller provides before any pointer is formed).
uint64_t align4(uint64_t n) { return (n + 3) / 4 * 4; }

// The packed K/V at `base`: K, then V from the next 16-byte boundary. Returns their floats.
uint64_t packed_parts(const Problem& p, float* base, float** packed_key, float** packed_value) {
  const uint64_t key_floats = align4(static_cast<uint64_t>(round_up(p.kv_len, kKeyGroup)) * p.head_dim);
  const uint64_t value_floats = align4(static_cast<uint64_t>(p.kv_len) * value_cols_padded(p));
  if (base != nullptr) *packed_key = base, *packed_value = base + key_floats;
  return key_floats + value_floats;
}

// The most keys any of flat rows [row_begin, row_end) attends (flat row f is query row f % Lq).
int32_t packed_key_count(const RowLimits& limit_of, int32_t q_len, int32_t row_begin, int32_t row_end) {
  int32_t keys = 0;
  for (int32_t f = row_begin; f < row_end; f++) keys = std::max(keys, limit_of(f % q_len));
  return keys;
}

int row_tile_slots(KvReading reading) { return reading == KvReading::kInPlace ? 1 : kRowTileBlock; }

// Floats of one slot's q_tile (and of its q_cols or q_blocks).
uint64_t slot_query_floats(const Problem& p) { return align4(kQueryTile * static_cast<uint64_t>(p.head_dim)); }

uint64_t layout(const Problem& p, KvReading reading, float* base, Scratch* s) {
  uint64_t offset = 0;
  s->packed_key = s->packed_value = nullptr;
  if (reading == KvReading::kPacksIntoScratch) offset = packed_parts(p, base, &s->packed_key, &s->packed_value);
  const uint64_t slots = static_cast<uint64_t>(row_tile_slots(reading));
  const uint64_t ev8 = static_cast<uint64_t>(value_cols_padded(p));
  const uint64_t q_floats = slots * slot_query_floats(p);
  const uint64_t sizes[5] = {q_floats, q_floats, kQueryTile * kKeyTile, kQueryTile * kKeyTile, slots * kQueryTile * ev8};
  float** parts[5] = {&s->q_tile, &s->q_cols, &s->scores, &s->bias, &s->acc};
  for (int i = 0; i < 5; i++) {
    if (base != nullptr) *parts[i] = base + offset;
    offset += align4(sizes[i]);
  }
  s->q_blocks = s->q_cols;
  return offset;
}

// Slot t < row_tile_slots of the scratch: its row tile's query forms and o; scores and bias
// shared (one key tile of one row tile at a time).
Scratch row_tile_slot(const Problem& p, const Scratch& s, int t) {
  const size_t q_floats = slot_query_floats(p);
  Scratch slot = s;
  slot.q_tile += t * q_floats;
  slot.q_cols += t * q_floats;
  slot.q_blocks = slot.q_cols;
  slot.acc += static_cast<size_t>(t) * kQueryTile * value_cols_padded(p);
  return slot;
}

// The additive bias and the blocked keys of one tile, for the rows of the query tile.
enum class TileKind {
  kAllBlocked,  // no row may attend any key of the tile: skip it
  kPartial,     // a mask or ALiBi: bias[] holds the tile's bias, -inf where blocked
  kLimited,     // no mask, but some row's key limit ends inside the tile (a causal diagonal,
                // the key-length edge) or its sliding window starts inside it: scores past the
                // limit and before the start are set to -inf; bias[] unused
  kClean,       // every row attends every key, no mask: bias[] unused
};

struct TileBias {
  TileKind kind;
  // Columns [0, open_cols) are blocked for no (real) row: P·V may multiply them
  // unconditionally.
  // Blocked entries only occur from open_cols on (a causal diagonal or a key-length edge
  // leaves at most a few such columns; a mask with -inf or a window's start can leave many).
  int32_t open_cols;
  // Columns [attended_cols, kKeyTile) are blocked for every row (past every row's key limit,
  // or a mask blocks them): they need no score, no exponent and no P·V, as the columns past a
  // causal frontier (an explicit causal mask then costs what isCausal does).
  int32_t attended_cols;
  // Columns [0, first_attended_col) are blocked for every row too (a sliding window, the
  // option's or a mask's, that starts inside the tile): also not scored.
  int32_t first_attended_col;
};

// The query rows of one tile. Rows r >= rows are padding: limit 0, zero q, never written.
struct RowTile {
  int32_t b;
  int32_t rows;
  int32_t h[kQueryTile], i[kQueryTile];  // query head and query row of each row
  int32_t start[kQueryTile];  // ... and keys j >= start[r] (the batch's first key or the window's, else 0)
  int32_t limit[kQueryTile];  // row r may attend keys j < limit[r] (within this call's keys)
  int32_t keys_end;           // max over rows of limit[r]
};

// Where query row i of head h, batch b, starts in the mask (its broadcast strides; key j of
// it at + j·mask_stride_k).
int64_t mask_row_of(const Problem& p, int32_t b, int32_t h, int32_t i) {
  return b * p.mask_stride_b + h * p.mask_stride_h + static_cast<int64_t>(i) * p.mask_stride_q;
}

// One row of a tile's bias from the mask and ALiBi: bias_row[c] for allowed_begin <= c < allowed_end
// is the mask's value at key j0 + c (a float mask's value; 0 or -inf for a boolean one; 0
// without a mask) plus the row's ALiBi bias of that key when `alibi` is not null (which never
// blocks: src/kernels/alibi.h), -inf
// before allowed_begin (a row's start: its batch's first key, its sliding window's) and from allowed_end on.
// Returns the first column whose bias is -inf (allowed_end if none before it), one past the
// last column whose bias is not (0 if none) and the first such column (kKeyTile if none). A
// mask contiguous along keys (mask_stride_k == 1, the usual layout) is read 16 keys (boolean)
// or 4 keys (float) at a time; the values are the same as one at a time.
struct MaskedRow {
  int32_t first_blocked;
  int32_t attended_end;   // one past the last allowed column; 0: none allowed
  int32_t first_allowed;  // the first allowed column; kKeyTile: none allowed
};

MaskedRow mask_bias_row(const Problem& p, int64_t mask_row, const AlibiRow* alibi, int32_t j0, int32_t allowed_begin,
                        int32_t allowed_end, float* bias_row) {
  assert(0 <= allowed_begin && allowed_begin <= allowed_end && allowed_end <= kKeyTile);
  MaskedRow out{allowed_begin > 0 ? 0 : allowed_end, 0, kKeyTile};
  std::fill(bias_row, bias_row + allowed_begin, kNegInf);
  // blocked_bits: bit n set when column c + n is blocked, for the lanes in all_lanes.
  const auto note = [&](int32_t c, uint32_t blocked_bits, uint32_t all_lanes) {
    const uint32_t allowed_bits = ~blocked_bits & all_lanes;
    if (allowed_bits != 0) out.attended_end = c + 32 - __builtin_clz(allowed_bits);
    if (allowed_bits != 0 && out.first_allowed == kKeyTile) out.first_allowed = c + __builtin_ctz(allowed_bits);
    if (blocked_bits != 0 && out.first_blocked == allowed_end) out.first_blocked = c + __builtin_ctz(blocked_bits);
  };
  int32_t c = allowed_begin;
  if (p.mask_kind == MaskKind::kNone) {  // ALiBi alone: zeros, then its bias; no column blocked
    std::fill(bias_row + allowed_begin, bias_row + allowed_end, 0.0f);
    c = allowed_end;
    out.attended_end = allowed_begin < allowed_end ? allowed_end : 0;
    out.first_allowed = allowed_begin < allowed_end ? allowed_begin : kKeyTile;
  } else if (p.mask_stride_k == 1 && p.mask_kind == MaskKind::kBool) {
    const uint8_t* m = static_cast<const uint8_t*>(p.mask) + mask_row + j0;
    const v128_t neg_inf_bits = wasm_f32x4_splat(kNegInf), zero = wasm_i8x16_splat(0);
    for (; c + 16 <= allowed_end; c += 16) {
      // blocked: 0xFF per blocked key, widened (sign-extended) to a 32-bit lane mask per key.
      const v128_t blocked = wasm_i8x16_eq(wasm_v128_load(m + c), zero);
      const v128_t lo = wasm_i16x8_extend_low_i8x16(blocked), hi = wasm_i16x8_extend_high_i8x16(blocked);
      wasm_v128_store(bias_row + c, wasm_v128_and(wasm_i32x4_extend_low_i16x8(lo), neg_inf_bits));
      wasm_v128_store(bias_row + c + 4, wasm_v128_and(wasm_i32x4_extend_high_i16x8(lo), neg_inf_bits));
      wasm_v128_store(bias_row + c + 8, wasm_v128_and(wasm_i32x4_extend_low_i16x8(hi), neg_inf_bits));
      wasm_v128_store(bias_row + c + 12, wasm_v128_and(wasm_i32x4_extend_high_i16x8(hi), neg_inf_bits));
      note(c, wasm_i8x16_bitmask(blocked), 0xFFFFu);
    }
  } else if (p.mask_stride_k == 1 && p.mask_kind == MaskKind::kFloat) {
    const float* m = static_cast<const float*>(p.mask) + mask_row + j0;
    const v128_t neg_inf = wasm_f32x4_splat(kNegInf);
    for (; c + 4 <= allowed_end; c += 4) {
      const v128_t value = wasm_v128_load(m + c);
      wasm_v128_store(bias_row + c, value);
      note(c, wasm_i32x4_bitmask(wasm_f32x4_eq(value, neg_inf)), 0xFu);
    }
  }
  for (; c < allowed_end; c++) {
    const int64_t at = mask_row + static_cast<int64_t>(j0 + c) * p.mask_stride_k;
    float value = 0.0f;
    if (p.mask_kind == MaskKind::kFloat) {
      value = static_cast<const float*>(p.mask)[at];
    } else if (p.mask_kind == MaskKind::kBool) {
      value = static_cast<const uint8_t*>(p.mask)[at] != 0 ? 0.0f : kNegInf;
    }
    bias_row[c] = value;
    note(c, value == kNegInf ? 1u : 0u, 1u);
  }
  if (alibi != nullptr) add_alibi(*alibi, j0, allowed_begin, allowed_end, bias_row);
  std::fill(bias_row + allowed_end, bias_row + kKeyTile, kNegInf);
  return out;
}

// Padding rows (r >= rt.rows) are never read after the scores, so they do not make a
// tile partial; their bias rows are -inf all the same (no uninitialised scratch is read).
// Row r may attend the tile's columns [allowed_begin(r), allowed_end(r)) before any mask.
int32_t allowed_end_of(const RowTile& rt, int r, int32_t j0) { return std::clamp(rt.limit[r] - j0, 0, kKeyTile); }
int32_t allowed_begin_of(const RowTile& rt, int r, int32_t j0) {
  return std::clamp(rt.start[r] - j0, 0, allowed_end_of(rt, r, j0));
}

TileBias build_bias(const Problem& p, const RowTile& rt, int32_t j0, float* bias) {
  int32_t open_cols = kKeyTile;         // min over real rows of the columns open from column 0
  int32_t allowed_max = 0;              // max over real rows of their allowed ends
  int32_t first_allowed = kKeyTile;     // min over real rows of their allowed begins
  for (int r = 0; r < rt.rows; r++) {
    const int32_t allowed_begin = allowed_begin_of(rt, r, j0), allowed_end = allowed_end_of(rt, r, j0);
    open_cols = std::min(open_cols, allowed_begin > 0 ? 0 : allowed_end);
    if (allowed_begin == allowed_end) continue;  // the row attends no key of the tile
    allowed_max = std::max(allowed_max, allowed_end);
    first_allowed = std::min(first_allowed, allowed_begin);
  }
  if (allowed_max == 0) return {TileKind::kAllBlocked, 0, 0, 0};
  if (p.mask_kind == MaskKind::kNone && p.alibi_slopes == nullptr) {
    return {open_cols == kKeyTile ? TileKind::kClean : TileKind::kLimited, open_cols, allowed_max, first_allowed};
  }

  int32_t attended_cols = 0;          // max over rows
  int32_t first_attended = kKeyTile;  // min over rows
  MaskedRow previous{0, 0, kKeyTile};
  int64_t previous_mask_row = -1;
  int32_t previous_begin = -1, previous_end = -1;
  AlibiRow previous_alibi{0.0f, 0};
  for (int r = 0; r < kQueryTile; r++) {
    float* bias_row = bias + r * kKeyTile;
    const int32_t allowed_begin = allowed_begin_of(rt, r, j0), allowed_end = allowed_end_of(rt, r, j0);
    const int64_t mask_row = mask_row_of(p, rt.b, rt.h[r], rt.i[r]);
    const bool has_alibi = p.alibi_slopes != nullptr;
    const AlibiRow alibi = has_alibi ? alibi_row(p, rt.b, rt.h[r], rt.i[r]) : AlibiRow{0.0f, 0};
    // Rows reading the same mask row over the same columns (a mask broadcast over heads:
    // the query heads of a GQA group) and with the same ALiBi slope and diagonal, if any, get
    // the same bias row: copied, not computed again.
    MaskedRow row;
    if (mask_row == previous_mask_row && allowed_begin == previous_begin && allowed_end == previous_end &&
        (!has_alibi || (alibi.slope == previous_alibi.slope && alibi.position == previous_alibi.position))) {
      const float* src = bias_row - kKeyTile;
      for (int32_t c = 0; c < kKeyTile; c += 4) wasm_v128_store(bias_row + c, wasm_v128_load(src + c));
      row = previous;
    } else {
      row = mask_bias_row(p, mask_row, has_alibi ? &alibi : nullptr, j0, allowed_begin, allowed_end, bias_row);
    }
    if (r < rt.rows) open_cols = std::min(open_cols, row.first_blocked);
    attended_cols = std::max(attended_cols, row.attended_end);
    first_attended = std::min(first_attended, row.first_allowed);
    previous = row, previous_mask_row = mask_row, previous_begin = allowed_begin, previous_end = allowed_end;
    previous_alibi = alibi;
  }
  if (attended_cols == 0) return {TileKind::kAllBlocked, 0, 0, 0};
  return {TileKind::kPartial, open_cols, attended_cols, first_attended};
}

float hsum(v128_t v) {
  return (wasm_f32x4_extract_lane(v, 0) + wasm_f32x4_extract_lane(v, 1)) +
         (wasm_f32x4_extract_lane(v, 2) + wasm_f32x4_extract_lane(v, 3));
}

// Per-row maxima of the first `cols` columns (a multiple of 8) of one score tile, as one
// 4-lane vector (lane r = row r); -inf for the padding rows r >= rows, which attend nothing.
// Row r's maximum is two chains, m0 over each group's columns 0..3 and m1 over 4..7, merged
// at the end; the four rows' chains run side by side (8 independent chains, where one row
// at a time waited on each pmax's latency: 1.6% of a V8 profile of (b), relaxed build). A
// padding row reads row 0's scores (written, unlike the padding rows') and is then replaced
// by -inf. pmax keeps its first operand when either is NaN, so the order within a chain
// matters for NaN scores; it is the same as one row at a time.
v128_t tile_row_max(const float* scores, int32_t rows, int32_t cols) {
  const float* s[kQueryTile];
  v128_t m0[kQueryTile], m1[kQueryTile];
  for (int r = 0; r < kQueryTile; r++) {
    s[r] = scores + (r < rows ? r : 0) * kKeyTile;
    m0[r] = wasm_v128_load(s[r]), m1[r] = wasm_v128_load(s[r] + 4);
  }
  for (int32_t c = 8; c < cols; c += 8) {
    for (int r = 0; r < kQueryTile; r++) {
      m0[r] = wasm_f32x4_pmax(m0[r], wasm_v128_load(s[r] + c));
      m1[r] = wasm_f32x4_pmax(m1[r], wasm_v128_load(s[r] + c + 4));
    }
  }
  v128_t row_max[kQueryTile];
  for (int r = 0; r < kQueryTile; r++) {
    row_max[r] = r < rows ? wasm_f32x4_pmax(m0[r], m1[r]) : wasm_f32x4_splat(kNegInf);
  }
  return reduce_4x4<true>(row_max[0], row_max[1], row_max[2], row_max[3]);
}

// scores := exp(scores - shift[r]) in place for rows r < rows and the first `cols` columns
// (a multiple of 8), returning the per-row sums as one vector (0 for padding rows, whose
// scores are left as they are and never read). `shift` lane r is the row's running maximum,
// or 0 when that maximum is still -inf (no key attended yet): then every score of the row
// is -inf too and exp(-inf - 0) = 0, where -inf - (-inf) would be NaN.
// Not inlined (and P·V is called through a table, see accumulate_pv): inside the one big
// kernel function V8's register allocator spilled the hot loops' accumulators (P·V ran 25%
// slower); in functions of their own it does not. Called from two places, Binaryen keeps it.
__attribute__((noinline)) v128_t exponentiate_tile(float* scores, int32_t rows, int32_t cols,
                                                   v128_t shift, const ExpConstants& ec) {
  float row_shift[kQueryTile];
  wasm_v128_store(row_shift, shift);
  v128_t row_sum[kQueryTile];
  for (int r = 0; r < kQueryTile; r++) {
    row_sum[r] = wasm_f32x4_splat(0.0f);
    if (r >= rows) continue;
    const v128_t m = wasm_v128_load32_splat(&row_shift[r]);
    float* s = scores + r * kKeyTile;
    float* const s_end = s + cols;
    v128_t sum = row_sum[r];
    // Four vectors at a time (exp_nonpositive_n: four independent chains), then the rest.
    constexpr int kVectors = 4;
    for (; s + 4 * kVectors <= s_end; s += 4 * kVectors) {
      v128_t e[kVectors];
      for (int i = 0; i < kVectors; i++) e[i] = wasm_f32x4_sub(wasm_v128_load(s + 4 * i), m);
      exp_nonpositive_n<kVectors>(e, ec);
      for (int i = 0; i < kVectors; i++) {
        wasm_v128_store(s + 4 * i, e[i]);
        sum = wasm_f32x4_add(sum, e[i]);  // in column order, as one vector at a time would
      }
    }
    for (; s != s_end; s += 4) {
      const v128_t e = exp_nonpositive(wasm_f32x4_sub(wasm_v128_load(s), m), ec);
      wasm_v128_store(s, e);
      sum = wasm_f32x4_add(sum, e);
    }
    row_sum[r] = sum;
  }
  return reduce_4x4<false>(row_sum[0], row_sum[1], row_sum[2], row_sum[3]);
}

#include "kernels/f32-sdpa-fwd-score-in-place-wasmsimd.inc"

// Softcap and bias in the order of the contract: s = softcap·tanh(s/softcap), then
// s = s + bias, where a -inf bias replaces s by -inf (so a NaN score of a blocked key,
// from NaN in padding, becomes -inf instead of staying NaN). A limited tile's blocked
// scores, past each row's limit or before its start (first key, window), are replaced by -inf the same way. Only the first `cols`
// columns (a multiple of 4) are finished: those read afterwards.
void finish_scores(const Problem& p, const RowTile& rt, int32_t j0, TileKind kind, int32_t cols,
                   const float* bias, float* scores) {
  if (p.softcap > 0.0f) {
    // s / softcap as written, not s·(1/softcap): for softcap < 2^-128 the reciprocal is Inf,
    // and a zero score times Inf is NaN (the contract's tanh(0 / softcap) is 0).
    const float cap = p.softcap;
    for (int r = 0; r < kQueryTile; r++) {
      float* row = scores + r * kKeyTile;
      for (int32_t c = 0; c < cols; c++) row[c] = cap * std::tanh(row[c] / cap);
    }
  }
  if (kind == TileKind::kLimited) {
    for (int r = 0; r < rt.rows; r++) {
      float* row = scores + r * kKeyTile;
      std::fill(row, row + std::clamp(rt.start[r] - j0, 0, cols), kNegInf);
      std::fill(row + std::clamp(rt.limit[r] - j0, 0, cols), row + cols, kNegInf);
    }
    return;
  }
  if (kind != TileKind::kPartial) return;
  const v128_t neg_inf = wasm_f32x4_splat(kNegInf);
  for (int r = 0; r < kQueryTile; r++) {
    for (int32_t c = r * kKeyTile; c < r * kKeyTile + cols; c += 4) {
      const v128_t b = wasm_v128_load(bias + c);
      const v128_t s = wasm_f32x4_add(wasm_v128_load(scores + c), b);
      wasm_v128_store(scores + c, wasm_v128_bitselect(neg_inf, s, wasm_f32x4_eq(b, neg_inf)));
    }
  }
}

// Dropout of a tile's probabilities (src/kernels/dropout.h): rows r < rt.rows, keys j0 + c
// for c in [0, cols) (a multiple of 4), each times its z: the factor where kept, else 0.
// After the row sums are taken (the softmax is the one without dropout), before P·V and the
// weights. Nothing without dropout.
void drop_tile(const Problem& p, const RowTile& rt, int32_t j0, int32_t cols, float* probs) {
  if (p.dropout_threshold == 0) return;
  const float factor = dropout_factor(p);
  for (int r = 0; r < rt.rows; r++) {
    apply_dropout_row(p, dropout_row(p, rt.b, rt.h[r], rt.i[r]), j0, cols, factor, probs + r * kKeyTile);
  }
}

// acc[r][col .. col+4·kVecs) = alpha[r]·acc[r][…] + Σ_{j < key_count} probs[r][j]·V[j][…]
// for r < kRows. Keys j < open_count are open for every row and are multiplied
// unconditionally; from open_count on, a key whose probability is exactly 0 for a row
// (blocked, or flushed by exp) is skipped for that row, not multiplied by 0, so NaN in a
// blocked V row cannot leak. 4 rows × 8 columns = 8 accumulators at most.
// The tile's sum Σ_j is made from zero and then added to alpha·acc (blocked summation): o
// grows with every key tile, and adding each key's p·v to it one by one lost a bit per
// doubling of o (uniform weights, V about 0.7: 1.6e-6 of the output at 32768 keys, 1.6e-4 at
// 262144); a tile's sum of at most kKeyTile terms, then one addition per tile, keeps the
// error to a tile's and the tiles' count's (8e-7 at 262144). For a row tile's first key tile,
// acc is 0 and 0·alpha + sum is the sum itself: the same bits as summing into acc directly.
template <int kRows, int kVecs, typename Src>
void pv_block(const Src& src, const float* probs, const typename Src::Elem* value, int64_t v_stride,
              int32_t open_count, int32_t key_count, const float* alpha, float* acc, int32_t acc_stride) {
  v128_t o[kRows][kVecs];  // this tile's Σ_j probs[r][j]·V[j][…]
  for (int r = 0; r < kRows; r++) {
    for (int k = 0; k < kVecs; k++) o[r][k] = wasm_f32x4_splat(0.0f);
  }
  // Pointers stepped by hand and constant offsets from them: the loads' addresses fold into
  // the wasm instructions' offset fields, leaving no address arithmetic in the loop
  // (Emscripten builds with LLVM's loop strength reduction off).
  const typename Src::Elem* v_row = value;
  const float* p_col = probs;
  const float* const p_open_end = probs + open_count;
#pragma clang loop unroll(disable)
  for (; p_col != p_open_end; p_col++, v_row += v_stride) {
    v128_t v[kVecs];
    load_row_vectors<kVecs>(src, v_row, v);
    for (int r = 0; r < kRows; r++) {
      const v128_t p = wasm_v128_load32_splat(p_col + r * kKeyTile);
      for (int k = 0; k < kVecs; k++) o[r][k] = f32x4_madd(p, v[k], o[r][k]);
    }
  }
  for (int32_t j = open_count; j < key_count; j++) {
    v128_t v[kVecs];
    load_row_vectors<kVecs>(src, value + j * v_stride, v);
    for (int r = 0; r < kRows; r++) {
      const float pr = probs[r * kKeyTile + j];
      if (pr == 0.0f) continue;
      const v128_t p = wasm_f32x4_splat(pr);
      for (int k = 0; k < kVecs; k++) o[r][k] = f32x4_madd(p, v[k], o[r][k]);
    }
  }
  for (int r = 0; r < kRows; r++) {
    const v128_t a = wasm_f32x4_splat(alpha[r]);
    for (int k = 0; k < kVecs; k++) {
      float* const at = acc + r * acc_stride + 4 * k;
      wasm_v128_store(at, f32x4_madd(wasm_v128_load(at), a, o[r][k]));
    }
  }
}

// The same for the last 1..3 columns of an in-place V whose width is not a multiple of 4.
template <int kRows, typename Src>
void pv_columns_scalar(const Src& src, const float* probs, const typename Src::Elem* value, int64_t v_stride,
                       int32_t cols, int32_t key_count, const float* alpha, float* acc, int32_t acc_stride) {
  for (int r = 0; r < kRows; r++) {
    for (int32_t c = 0; c < cols; c++) {
      float o = acc[r * acc_stride + c] * alpha[r];
      for (int32_t j = 0; j < key_count; j++) {
        const float pr = probs[r * kKeyTile + j];
        if (pr != 0.0f) o += pr * src.scalar(value[j * v_stride + c]);
      }
      acc[r * acc_stride + c] = o;
    }
  }
}

#include "kernels/f32-sdpa-fwd-pv-in-order-wasmsimd.inc"

template <int kRows, typename Src>
void accumulate_pv_rows(const Src& src, const float* probs, const typename Src::Elem* value, int64_t v_stride,
                        int32_t cols, int32_t open_count, int32_t key_count, const float* alpha, float* acc,
                        int32_t acc_stride, int64_t block_floats) {
  int32_t col = 0;
  if (block_floats != 0) {  // packed [Ev8/8][Lk][8]: blocks of 8 columns, keys 8 floats apart
    assert(v_stride == kValueBlock && cols % kValueBlock == 0);
    for (; col < cols; col += kValueBlock) {
      pv_block<kRows, 2>(src, probs, value + (col / kValueBlock) * block_floats, kValueBlock, open_count, key_count,
                         alpha, acc + col, acc_stride);
    }
    return;
  }
  // Fewer rows leave registers for wider blocks: 8 accumulators either way, and each key's
  // loop overhead (the probability, the pointers) is shared by more columns. A column's sum
  // over the keys is the same sequence of operations whatever the block width.
  constexpr int kWideVecs = kRows == 1 ? 8 : kRows == 2 ? 4 : 2;
  for (; col + 4 * kWideVecs <= cols; col += 4 * kWideVecs) {
    pv_block<kRows, kWideVecs>(src, probs, value + col, v_stride, open_count, key_count, alpha, acc + col, acc_stride);
  }
  for (; col + 8 <= cols; col += 8) {
    pv_block<kRows, 2>(src, probs, value + col, v_stride, open_count, key_count, alpha, acc + col, acc_stride);
  }
  if (col + 4 <= cols) {
    pv_block<kRows, 1>(src, probs, value + col, v_stride, open_count, key_count, alpha, acc + col, acc_stride);
    col += 4;
  }
  if (col < cols) {
    pv_columns_scalar<kRows>(src, probs, value + col, v_stride, cols - col, key_count, alpha, acc + col,
                             acc_stride);
  }
}

// acc[r][0 .. cols) = alpha[r]·acc[r][…] + Σ_j probs[r][j]·V[j][0 .. cols) for r < rows.
// Packed V (block_floats != 0: value at the tile's first key in block 0, 8-column blocks
// block_floats apart, v_stride = 8) has cols = Ev8 (zero padded); in-place V (block_floats
// == 0: rows v_stride apart) has cols = Ev.
template <typename Src>
void accumulate_pv(const Src& src, const float* probs, const typename Src::Elem* value, int64_t v_stride,
                   int32_t cols, int32_t rows, int32_t open_count, int32_t key_count, v128_t alpha_v,
                   float* acc, int32_t acc_stride, int64_t block_floats = 0) {
  float alpha[kQueryTile];
  wasm_v128_store(alpha, alpha_v);
  // Through a table: an indirect call is inlined neither by clang nor by Binaryen (which
  // inlines any function that has a single caller, noinline or not). See exponentiate_tile.
  using PvRows = void (*)(const Src&, const float*, const typename Src::Elem*, int64_t, int32_t, int32_t,
                          int32_t, const float*, float*, int32_t, int64_t);
  static PvRows const kByRows[kQueryTile] = {accumulate_pv_rows<1, Src>, accumulate_pv_rows<2, Src>,
                                             accumulate_pv_rows<3, Src>, accumulate_pv_rows<4, Src>};
  assert(rows >= 1 && rows <= kQueryTile);
  kByRows[rows - 1](src, probs, value, v_stride, cols, open_count, key_count, alpha, acc, acc_stride, block_floats);
}

// V of one (batch, KV head), keys [0, key_count), into 8-column blocks [Ev8/8][Lk][8]
// (block_floats = Lk·8 apart), zeros in the columns past Ev. Float16 values are widened.
// Whole blocks are two vector copies (element by element, packing took 1.1% of a V8 profile
// of (b), relaxed build); only the last, partial block goes column by column.
template <typename Src>
void pack_value(const Src& src, const typename Src::Elem* value, int64_t stride_l, int32_t key_count,
                int32_t value_dim, int64_t block_floats, float* packed) {
  static_assert(kValueBlock == 8, "two vectors per block");
  const int32_t whole = value_dim / kValueBlock * kValueBlock;  // columns in whole blocks
  for (int32_t j = 0; j < key_count; j++) {
    const typename Src::Elem* row = value + j * stride_l;
    float* dst = packed + static_cast<size_t>(j) * kValueBlock;
    for (int32_t c0 = 0; c0 < whole; c0 += kValueBlock, dst += block_floats) {
      v128_t block[2];
      load_row_vectors<2>(src, row + c0, block);
      wasm_v128_store(dst, block[0]), wasm_v128_store(dst + 4, block[1]);
    }
    if (whole < value_dim) {  // the last, partial block and its zero padding
      for (int32_t c = 0; c < kValueBlock; c++) dst[c] = whole + c < value_dim ? src.scalar(row[whole + c]) : 0.0f;
    }
  }
}

// Keys [key_begin, key_end) of one (batch, KV head)'s K and V (`key`, `value` at its key 0)
// into packed K/V of its whole length (packed_parts): whole groups of K from group
// key_begin / 8 on (the last may be partial, zero padded), rows key_begin.. of every
// 8-column block of V. key_begin a multiple of kKeyGroup.
template <typename Src>
void pack_key_range(const Src& src, const Problem& p, const typename Src::Elem* key, const typename Src::Elem* value,
                    int32_t key_begin, int32_t key_end, float* packed_key, float* packed_value) {
  assert(key_begin % kKeyGroup == 0 && key_begin <= key_end);
  pack_key_groups(src, key + key_begin * p.k_stride_l, p.k_stride_l, key_end - key_begin, p.head_dim,
                  packed_key + static_cast<size_t>(key_begin) * p.head_dim);
  pack_value(src, value + key_begin * p.v_stride_l, p.v_stride_l, key_end - key_begin, p.value_dim,
             packed_value_block_floats(p), packed_value + static_cast<size_t>(key_begin) * kValueBlock);
}

// Where one call reads K and V: packed (float32) into scratch, or in place in the caller's
// tensors (elements of Src, float32 or float16, widened as loaded).
template <typename Src>
struct KeyValueSource {
  using Elem = typename Src::Elem;
  const Src& src;
  const float* packed_key;    // non-null: K packed [groups][E][8] from key 0 (prefill)
  const Elem* key;            // in place: key first_key's row
  int64_t key_stride;         // in place: elements between consecutive keys
  const float* packed_value;  // non-null: V packed [Ev8/8][Lk][8] (prefill)
  const Elem* value;          // in place: key first_key's row
  int64_t value_stride;       // in place: elements between consecutive keys
  int32_t value_cols;         // packed: Ev8; in place: Ev
  int32_t first_key;          // the key the in-place pointers start at: 0, or a streamed segment's first
                              // (for an interleaved group's segment, its first key: see stream_keys)
  bool in_memory_order;       // in place: p.read_kv_in_order (score_tile_in_place, else score_tile_4_keys)
  int64_t value_block_floats = 0;  // packed: floats between its 8-column blocks
  // In place, one row's decode (score_keys_in_streams, pv_row_in_order): 0 for a tile of
  // contiguous keys, whose kStreams streams are key_count / kStreams keys apart; else a
  // segment of an interleaved group, whose tile's column n·part + i is the key stream_keys·n + i
  // rows past key_row(the tile's first key) (interleaved_first_key).
  int32_t stream_keys = 0;
  const Elem* key_row(int32_t j) const { return key + (j - first_key) * key_stride; }
  const Elem* value_row(int32_t j) const { return value + (j - first_key) * value_stride; }
};


// Scores of the tile's keys [j0, j0 + key_count), valid in the first round_up(key_count, 8)
// columns (the rest of those columns are blocked by the bias; later columns are not used).
template <typename Src>
void score_tile_from(const KeyValueSource<Src>& kv, const float* q_tile, const float* q_cols, const float* q_blocks,
                     int32_t rows, int32_t j0, int32_t key_count, int32_t head_dim, float* scores) {
  if (kv.packed_key != nullptr) {
    score_4x8_packed<kKeyTile>(q_cols, kv.packed_key + static_cast<size_t>(j0) * head_dim, head_dim,
                               round_up(key_count, kKeyGroup), scores);
  } else if (kv.in_memory_order) {
    // V rows are touched for P·V by column blocks (pv_block), not for one row's P·V, which
    // streams V itself (pv_row_in_order): then an empty prefetch (no elements).
    uint32_t sink = 0;
    const int32_t touched_cols = pv_streams_value(rows) ? 0 : kv.value_cols;
    score_tile_in_place(kv.src, q_blocks, q_tile, rows, kv.key_row(j0), kv.key_stride, key_count, kv.stream_keys,
                        head_dim, scores,
                        RowPrefetch<typename Src::Elem>{kv.value_row(j0), kv.value_stride, touched_cols}, &sink);
    volatile uint32_t keep = sink;  // the touched values are "used": their loads stay
    (void)keep;
  } else {
    score_tile_4_keys(kv.src, q_tile, rows, kv.key_row(j0), kv.key_stride, key_count, head_dim, scores);
  }
}

// P·V of one tile, from the packed float32 copy of V or from V in place. V read in place by
// a Src with kReadScale != 1 first gets the probabilities times 1 / kReadScale, in place
// (exact: p <= 1 and the factor is a power of two; a 0 stays 0, so skipped keys stay skipped).
template <typename Src>
void accumulate_pv_from(const KeyValueSource<Src>& kv, float* probs, int32_t j0, int32_t rows,
                        int32_t open_count, int32_t key_count, v128_t alpha, float* acc, int32_t acc_stride) {
  if (kv.packed_value != nullptr) {
    accumulate_pv(kF32Elements, probs, kv.packed_value + static_cast<size_t>(j0) * kValueBlock, kValueBlock,
                  kv.value_cols, rows, open_count, key_count, alpha, acc, acc_stride, kv.value_block_floats);
  } else {
    if constexpr (Src::kReadScale != 1.0f) {
      const v128_t factor = wasm_f32x4_splat(1.0f / Src::kReadScale);
      const int32_t cols = round_up(key_count, 4);
      for (int32_t r = 0; r < rows; r++) {
        for (float* x = probs + r * kKeyTile; x != probs + r * kKeyTile + cols; x += 4) {
          wasm_v128_store(x, wasm_f32x4_mul(wasm_v128_load(x), factor));
        }
      }
    }
    if (kv.in_memory_order && pv_streams_value(rows)) {
      pv_row_in_order(kv.src, probs, kv.value_row(j0), kv.value_stride, kv.value_cols, open_count, key_count,
                      kv.stream_keys, wasm_f32x4_extract_lane(alpha, 0), acc);
      return;
    }
    accumulate_pv(kv.src, probs, kv.value_row(j0), kv.value_stride, kv.value_cols, rows, open_count, key_count,
                  alpha, acc, acc_stride);
  }
}

// The query rows of a row tile in the forms the scoring reads: q_tile = scale·q (the scale
// folded into Q once), times 1 / kReadScale (exact, see F16FiniteScaledElements), zero rows
// past rt.rows; then q_cols for packed K, or q_blocks for K read in place in memory order.
template <typename Src>
void prepare_query_tile(const Problem& p, const RowTile& rt, bool packed_key, bool in_memory_order, const Scratch& s) {
  const int32_t E = p.head_dim;
  constexpr float kQueryFactor = 1.0f / Src::kReadScale;
  for (int r = 0; r < kQueryTile; r++) {
    float* dst = s.q_tile + r * E;
    if (r < rt.rows) {
      const float* src = p.query + rt.b * p.q_stride_b + rt.h[r] * p.q_stride_h +
                         static_cast<int64_t>(rt.i[r]) * p.q_stride_l;
      for (int32_t d = 0; d < E; d++) dst[d] = (src[d] * p.scale) * kQueryFactor;
    } else {
      std::fill(dst, dst + E, 0.0f);
    }
  }
  if (packed_key) {  // q_cols[d][r] = q_tile[r][d], by 4×4 blocks
    const int32_t e4 = E & ~3;
    for (int32_t d = 0; d < e4; d += 4) {
      v128_t r0 = wasm_v128_load(s.q_tile + d), r1 = wasm_v128_load(s.q_tile + E + d);
      v128_t r2 = wasm_v128_load(s.q_tile + 2 * E + d), r3 = wasm_v128_load(s.q_tile + 3 * E + d);
      transpose4x4(r0, r1, r2, r3);
      float* dst = s.q_cols + d * kQueryTile;
      wasm_v128_store(dst, r0), wasm_v128_store(dst + 4, r1);
      wasm_v128_store(dst + 8, r2), wasm_v128_store(dst + 12, r3);
    }
    for (int32_t d = e4; d < E; d++) {
      for (int r = 0; r < kQueryTile; r++) s.q_cols[d * kQueryTile + r] = s.q_tile[r * E + d];
    }
  } else if (in_memory_order) {  // q_blocks[d/4][r][d%4] = q_tile[r][d] for the real rows
    const int32_t e4 = E & ~3;
    int32_t d = 0;
    if (even_odd_dims<typename Src::Elem>(rt.rows)) {
      for (; d + 8 <= E; d += 8) store_even_odd(s.q_tile + d, s.q_blocks + d);
    }
    for (; d < e4; d += 4) {
      for (int r = 0; r < rt.rows; r++) {
        wasm_v128_store(s.q_blocks + d * rt.rows + r * 4, wasm_v128_load(s.q_tile + r * E + d));
      }
    }
  }
}

// weights[i][j] = exp(s_ij - m_i) / l_i for the keys [key_begin, key_end) of one row tile
// (key_begin a multiple of kKeyTile), given each row's final maximum m (lane r of row_max)
// and 1 / l (inv_sum[r]: 0 for a row that attended nothing), recomputing the scores tile by
// tile: zeros for blocked keys, skipped tiles and empty rows. m is the maximum of these very
// scores (one key's score has the same bits whichever pass or loop scores it), so every
// exponent s - m is <= 0. The query rows are prepared here unless query_ready says the caller
// has (attend_row_tile, after its online softmax). K is read again; V is not touched.
template <typename Src>
__attribute__((noinline)) void write_row_tile_weights(const Problem& p, const RowTile& rt, const KeyValueSource<Src>& kv, int32_t key_begin,
                            int32_t key_end, v128_t row_max, const float* inv_sum, bool query_ready,
                            const Scratch& s, const ExpConstants& ec) {
  assert(key_begin % kKeyTile == 0 && key_begin < key_end && key_end <= p.kv_len);
  // Scoring in place touches each tile's V rows for a later P·V (score_tile_from); here there
  // is none: an empty prefetch.
  KeyValueSource<Src> keys = kv;
  keys.value_cols = 0;
  // A row still at -inf attended nothing: shift by 0, as the online softmax does.
  const v128_t neg_inf = wasm_f32x4_splat(kNegInf);
  const v128_t final_shift = wasm_v128_bitselect(wasm_f32x4_splat(0.0f), row_max, wasm_f32x4_eq(row_max, neg_inf));
  for (int32_t j0 = key_begin; j0 < key_end; j0 += kKeyTile) {
    const int32_t cols = std::min(kKeyTile, key_end - j0);
    const TileBias tile =
        j0 < rt.keys_end ? build_bias(p, rt, j0, s.bias) : TileBias{TileKind::kAllBlocked, 0, 0, 0};
    if (tile.kind == TileKind::kAllBlocked) {
      std::fill(s.scores, s.scores + kQueryTile * kKeyTile, 0.0f);
    } else {
      if (!query_ready) {
        prepare_query_tile<Src>(p, rt, keys.packed_key != nullptr, keys.in_memory_order, s);
        query_ready = true;
      }
      score_tile_from(keys, s.q_tile, s.q_cols, s.q_blocks, rt.rows, j0, std::min(kKeyTile, rt.keys_end - j0), p.head_dim,
                      s.scores);
      finish_scores(p, rt, j0, tile.kind, kKeyTile, s.bias, s.scores);
      exponentiate_tile(s.scores, rt.rows, kKeyTile, final_shift, ec);
      drop_tile(p, rt, j0, kKeyTile, s.scores);  // the weights P·V used
    }
    for (int r = 0; r < rt.rows; r++) {
      float* dst = p.weights +
                   ((static_cast<int64_t>(rt.b) * p.q_heads + rt.h[r]) * p.q_len + rt.i[r]) * p.kv_len + j0;
      const float* src = s.scores + r * kKeyTile;
      for (int32_t c = 0; c < cols; c++) dst[c] = src[c] * inv_sum[r];
    }
  }
}

// The online softmax of one row tile between its key tiles: m and l (lane r = row r), and
// whether its query forms are made. Its o (acc) and query forms are in its Scratch slot.
struct RowTileSoftmax {
  v128_t running_max;  // m
  v128_t running_sum;  // l
  bool query_ready;    // q_tile and q_cols or q_blocks made (before the first tile scored)
};

// m = -inf, l = 0, o = 0: nothing attended yet.
RowTileSoftmax begin_row_tile(const Problem& p, const Scratch& s) {
  std::fill(s.acc, s.acc + kQueryTile * value_cols_padded(p), 0.0f);
  return {wasm_f32x4_splat(kNegInf), wasm_f32x4_splat(0.0f), false};
}

// One key tile [j0, j0 + kKeyTile) of a row tile's online softmax (j0 < rt.keys_end).
// Not inlined: the same code for a row tile alone (attend_row_tile) and for a block of row
// tiles sharing each key tile (run_work), the loop body V8 compiled before.
template <typename Src>
__attribute__((noinline)) void attend_key_tile(const Problem& p, const RowTile& rt, const KeyValueSource<Src>& kv,
                                               int32_t j0, RowTileSoftmax& state, const Scratch& s,
                                               const ExpConstants& ec) {
  const TileBias tile = build_bias(p, rt, j0, s.bias);
  if (tile.kind == TileKind::kAllBlocked) return;  // m, l, o unchanged
  // The query rows in the forms the scoring reads, made before the first tile that is scored
  // (a decode's segment whose keys no row attends, e.g. outside a sliding window, needs none).
  if (!state.query_ready) {
    state.query_ready = true;
    prepare_query_tile<Src>(p, rt, kv.packed_key != nullptr, kv.in_memory_order, s);
  }
  const v128_t running_max = state.running_max;
  const v128_t neg_inf = wasm_f32x4_splat(kNegInf);
  const v128_t zero = wasm_f32x4_splat(0.0f);
  const v128_t one = wasm_f32x4_splat(1.0f);
  // Keys before first_attended_col and past attended_cols are blocked for every row: their
  // scores would be -inf, their probabilities 0, added to no sum (+0) and skipped by P·V.
  // They are left out by whole key groups, so every key still scored is scored in the same
  // group of 4 or 8 as before (the same operations), and each column keeps its lane in the
  // 4-lane row sums: the same bits as scoring them. The tile is then worked on from column
  // `lead` on: scores and bias from there, rows still kKeyTile apart.
  const int32_t lead = tile.first_attended_col / kKeyGroup * kKeyGroup;
  const int32_t key_count = std::min({kKeyTile, rt.keys_end - j0, round_up(tile.attended_cols, kKeyGroup)}) - lead;
  const int32_t cols = round_up(key_count, kKeyGroup);  // columns holding scores, from `lead`
  float* const scores = s.scores + lead;
  score_tile_from(kv, s.q_tile, s.q_cols, s.q_blocks, rt.rows, j0 + lead, key_count, p.head_dim, scores);
  finish_scores(p, rt, j0 + lead, tile.kind, cols, s.bias + lead, scores);

  const v128_t new_max = wasm_f32x4_pmax(running_max, tile_row_max(scores, rt.rows, cols));
  // A row still at -inf has attended nothing: shift by 0 (its scores are all -inf,
  // so its probabilities are exp(-inf) = 0) and keep α = 1 (its o and l are 0).
  const v128_t still_empty = wasm_f32x4_eq(new_max, neg_inf);
  const v128_t shift = wasm_v128_bitselect(zero, new_max, still_empty);
  // α = exp(m_old - m_new) <= 1: 1 when the maximum did not grow, 0 when m_old = -inf.
  const v128_t alpha = wasm_v128_bitselect(
      one, exp_nonpositive(wasm_f32x4_sub(running_max, new_max), ec), still_empty);
  const v128_t tile_sum = exponentiate_tile(scores, rt.rows, cols, shift, ec);
  state.running_sum = wasm_f32x4_add(wasm_f32x4_mul(state.running_sum, alpha), tile_sum);
  state.running_max = new_max;
  drop_tile(p, rt, j0 + lead, cols, scores);  // l is the softmax's own; o sums the kept p·z

  // open_cols > 0 only when no row's first column is blocked, so then lead is 0.
  accumulate_pv_from(kv, scores, j0 + lead, rt.rows, std::min(tile.open_cols, key_count), key_count, alpha,
                     s.acc, value_cols_padded(p));
}

// A row tile's output once its online softmax has seen its keys: the normalised rows (and
// weights) when `partial` is null, else the unnormalised state (m, l, o) of each row for
// sdpa_f32_fwd_merge_partials.
template <typename Src>
void finish_row_tile(const Problem& p, const RowTile& rt, const KeyValueSource<Src>& kv, float* partial,
                     const RowTileSoftmax& state, const Scratch& s, const ExpConstants& ec) {
  const int32_t Ev = p.value_dim, ev8 = value_cols_padded(p);
  float maxima[kQueryTile], sums[kQueryTile];
  wasm_v128_store(maxima, state.running_max);
  wasm_v128_store(sums, state.running_sum);
  if (partial != nullptr) {  // [4][2 + Ev8]: m, l, o
    for (int r = 0; r < rt.rows; r++) {
      float* dst = partial + r * (2 + ev8);
      dst[0] = maxima[r];
      dst[1] = sums[r];
      copy_bytes(dst + 2, s.acc + r * ev8, sizeof(float) * Ev);
    }
    return;
  }

  // Each row's sink joins its softmax here, at its end (softmax-sink.h): the final maximum M
  // and sum L, and o's factor α. Without one (or for a padding row) M = m, L = l, α = 1.
  float final_max[kQueryTile], inv_sum[kQueryTile], output_scale[kQueryTile];
  for (int r = 0; r < kQueryTile; r++) {
    const SinkedRow row = add_sink(maxima[r], sums[r], r < rt.rows ? sink_of(p, rt.h[r]) : kNegInf);
    final_max[r] = row.max, output_scale[r] = row.output_scale;
    inv_sum[r] = row.sum == 0.0f ? 0.0f : 1.0f / row.sum;  // 1 / L; 0 for a row with nothing at all
    if (p.logsumexp != nullptr && r < rt.rows) {  // M + log L; -inf when L == 0; the sink itself when l == 0
      p.logsumexp[(static_cast<int64_t>(rt.b) * p.q_heads + rt.h[r]) * p.q_len + rt.i[r]] = sinked_logsumexp(row, sums[r]);
    }
  }

  // out = o·α / L; l == 0 means the row attended nothing (every score -inf): exact zeros, not
  // 0/0 = NaN, and not o·0 either: o is NaN when a key of probability 0 had Inf/NaN in its V
  // row (P·V multiplies the open columns unconditionally). α·(1/L) is 1/l's bits without a sink.
  for (int r = 0; r < rt.rows; r++) {
    float* dst = p.output + rt.b * p.o_stride_b + rt.h[r] * p.o_stride_h +
                 static_cast<int64_t>(rt.i[r]) * p.o_stride_l;
    const float* o = s.acc + r * ev8;
    if (sums[r] == 0.0f) {
      std::fill(dst, dst + Ev, 0.0f);
    } else {
      const float factor = output_scale[r] * inv_sum[r];
      for (int32_t c = 0; c < Ev; c++) dst[c] = o[c] * factor;
    }
  }

  if (p.weights == nullptr) return;
  write_row_tile_weights(p, rt, kv, 0, p.kv_len, wasm_v128_load(final_max), inv_sum, state.query_ready, s, ec);
}

// The online softmax of one row tile over keys [key_begin, rt.keys_end), then its output
// (finish_row_tile).
// Not inlined into run_work, which also runs the weights pass: inlined there, the four readers'
// copies made the relaxed build 8.7 kB larger; the A/B runs of prefill and decode timed the two
// forms alike (0.97–1.02×).
template <typename Src>
__attribute__((noinline)) void attend_row_tile(const Problem& p, const RowTile& rt, const KeyValueSource<Src>& kv,
                                               int32_t key_begin, float* partial, const Scratch& s,
                                               const ExpConstants& ec) {
  RowTileSoftmax state = begin_row_tile(p, s);
  for (int32_t j0 = key_begin; j0 < rt.keys_end; j0 += kKeyTile) attend_key_tile(p, rt, kv, j0, state, s, ec);
  finish_row_tile(p, rt, kv, partial, state, s, ec);
}

}  // namespace

uint64_t sdpa_f32_fwd_4x512__wasmsimd_scratch(const Problem& p, KvReading reading) {
  Scratch unused;
  return layout(p, reading, nullptr, &unused) + 4;  // + 4: room to align the base to 16 bytes
}

uint64_t sdpa_f32_fwd_4x512__wasmsimd_packed_floats(const Problem& p) {
  return packed_parts(p, nullptr, nullptr, nullptr);
}

int32_t sdpa_f32_fwd_4x512__wasmsimd_packed_keys(const Problem& p, int32_t b, int32_t row_begin, int32_t row_end) {
  return packed_key_count(row_limits(p, b), p.q_len, row_begin, row_end);
}

uint64_t sdpa_f32_fwd_4x512__wasmsimd_partial_floats(const Problem& p) {
  return static_cast<uint64_t>(kQueryTile) * (2 + value_cols_padded(p));
}

bool sdpa_f32_fwd_4x512__wasmsimd_reads_interleaved(const Problem& p) {
  return is_16_bit(p.kv_type) && p.q_heads == p.kv_heads && p.q_len == 1 && p.read_kv_in_order &&
         p.mask_kind == MaskKind::kNone && p.alibi_slopes == nullptr && p.dropout_threshold == 0 &&
         p.head_dim % 4 == 0 && p.value_dim % 4 == 0;
}

namespace {

// The partial state (m, l, o) of flat row f of a split-K work: w.partials is
// [row tiles][4][2 + Ev8], from row_begin (attend_row_tile writes one row tile's [4][2 + Ev8]).
float* partial_row(const Problem& p, const KernelWork& w, int32_t f) {
  const size_t tile_floats = static_cast<size_t>(sdpa_f32_fwd_4x512__wasmsimd_partial_floats(p));
  return w.partials + static_cast<size_t>((f - w.row_begin) / kQueryTile) * tile_floats +
         static_cast<size_t>((f - w.row_begin) % kQueryTile) * (tile_floats / kQueryTile);
}

// The key whose row the in-place pointers of an interleaved group's segment start at (stream
// 0's first key), or -1 when the work reads its keys in order. A segment is read interleaved
// when it is one tile of split-K decode of one query row per KV head (MHA), K/V float16 stored
// whole in memory order (a KV cache; not a streamed segment, whose buffer holds its own keys
// alone: stored_alone), and its whole group of kInterleavedTiles tiles is open
// to the row: within Lk, the batch's key length, the causal frontier and the window, no mask,
// no ALiBi and no dropout (whose biases and masks need the keys in order), E and Ev multiples of 4 (no column goes to the scalar loops). The
// choice depends on the problem and the segment only, never on the reader of the halves or the
// thread count: kFloat16 and kFloat16Finite, one thread or many, give the same bits.
int32_t interleaved_first_key(const Problem& p, const KernelWork& w, const RowLimits& limit_of) {
  constexpr int32_t kGroupKeys = kInterleavedTiles * kKeyTile;
  constexpr int32_t kSlice = kKeyTile / kDecodeStreams<uint16_t, 1>;
  if (!sdpa_f32_fwd_4x512__wasmsimd_reads_interleaved(p) || w.partials == nullptr || w.pack || w.stored_alone ||
      w.key_end - w.key_begin != kKeyTile) {
    return -1;
  }
  const int32_t group_begin = w.key_begin / kGroupKeys * kGroupKeys;
  if (p.kv_len - group_begin < kGroupKeys || limit_of(0) - group_begin < kGroupKeys || limit_of.start(0) > group_begin) {
    return -1;
  }
  return group_begin + (w.key_begin - group_begin) / kKeyTile * kSlice;
}

// One call of the kernel: sets up the scratch and the K/V source (packing K/V if asked), then
// for each row tile of the work either its online softmax (attend_row_tile: row_stats null)
// or, after a split-K merge, its weights from the rows' final (m, l) in row_stats,
// [row_end - row_begin][2] from row_begin (write_row_tile_weights).
template <typename Src>
void run_work(const Problem& p, const KernelWork& w, const float* row_stats, float* scratch_base) {
  assert(p.head_dim >= 1 && p.value_dim >= 1 && p.q_len >= 1 && p.kv_len >= 1);
  assert(p.q_heads % p.kv_heads == 0);
  assert(w.b >= 0 && w.b < p.batch && w.kv_head >= 0 && w.kv_head < p.kv_heads);
  const int32_t group = p.q_heads / p.kv_heads;
  assert(0 <= w.row_begin && w.row_begin < w.row_end && w.row_end <= group * p.q_len);
  assert(0 <= w.key_begin && w.key_begin % kKeyTile == 0 && w.key_begin < w.key_end && w.key_end <= p.kv_len);
  assert(!w.pack || (w.key_begin == 0 && w.partials == nullptr));
  assert(w.packed == nullptr || (w.pack && reinterpret_cast<uintptr_t>(w.packed) % 16 == 0));
  assert(w.stored_from <= w.key_begin && (!w.pack || w.stored_from == 0));
  assert(!w.stored_alone || (w.stored_from == w.key_begin && !w.pack));
  assert(scratch_base != nullptr);

  const RowLimits limit_of = row_limits(p, w.b);
  const int32_t first_head = w.kv_head * group;
  // Flat row f is query row f % Lq of head first_head + f / Lq. Its keys: [key_begin, end).
  auto limit_of_flat = [&](int32_t f) { return std::min(limit_of(f % p.q_len), w.key_end); };

  Scratch s;
  layout(p, kv_reading(w), reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch_base) + 15) & ~uintptr_t{15}), &s);
  const ExpConstants ec = make_exp_constants();

  using Elem = typename Src::Elem;
  const Src src;
  assert(Src::kReadScale == 1.0f || !w.pack);  // packed K/V are read as float32
  const Elem* key = static_cast<const Elem*>(p.key) + w.b * p.k_stride_b + w.kv_head * p.k_stride_h;
  const Elem* value = static_cast<const Elem*>(p.value) + w.b * p.v_stride_b + w.kv_head * p.v_stride_h;
  KeyValueSource<Src> kv{src,   nullptr,      key,         p.k_stride_l, nullptr,
                         value, p.v_stride_l, p.value_dim, w.stored_from, p.read_kv_in_order};
  if (const int32_t first = interleaved_first_key(p, w, limit_of); first >= 0) {
    kv.key = key + first * p.k_stride_l, kv.value = value + first * p.v_stride_l;
    kv.first_key = w.key_begin;  // key_row(key_begin): stream 0's first row
    kv.stream_keys = kInterleavedStreamKeys;
  }
  if (w.pack) {
    if (w.packed != nullptr) {  // packed once for several calls: at least the keys these rows attend
      packed_parts(p, const_cast<float*>(w.packed), &s.packed_key, &s.packed_value);
    } else {  // pack only the keys some row of this call may attend
      const int32_t packed_keys = packed_key_count(limit_of, p.q_len, w.row_begin, w.row_end);
      pack_key_range(src, p, key, value, 0, packed_keys, s.packed_key, s.packed_value);
    }
    kv.packed_key = s.packed_key;
    kv.packed_value = s.packed_value, kv.value_cols = value_cols_padded(p);
    kv.value_block_floats = packed_value_block_floats(p);
  }

  // The row tile of flat rows [f0, f0 + 4) (fewer at the work's end).
  const auto row_tile_at = [&](int32_t f0) {
    RowTile rt{};
    rt.b = w.b;
    rt.rows = std::min(kQueryTile, w.row_end - f0);
    for (int r = 0; r < kQueryTile; r++) {
      const int32_t f = f0 + r;
      rt.h[r] = first_head + (r < rt.rows ? f / p.q_len : 0);
      rt.i[r] = r < rt.rows ? f % p.q_len : 0;
      rt.start[r] = r < rt.rows ? limit_of.start(f % p.q_len) : 0;
      rt.limit[r] = r < rt.rows ? limit_of_flat(f) : 0;
      rt.keys_end = std::max(rt.keys_end, rt.limit[r]);
    }
    return rt;
  };

  if (kv.packed_key != nullptr && row_stats == nullptr && w.partials == nullptr) {
    // Prefill: blocks of kRowTileBlock row tiles, each key tile attended by every row tile of
    // the block that reaches it, in turn, then the next key tile. Each row tile's softmax
    // sees its key tiles in order, as alone: the same operations, the same bits.
    assert(row_tile_slots(kv_reading(w)) == kRowTileBlock);
    constexpr int32_t kBlockRows = kRowTileBlock * kQueryTile;
    for (int32_t block_begin = w.row_begin; block_begin < w.row_end; block_begin += kBlockRows) {
      const int32_t tiles = (std::min(kBlockRows, w.row_end - block_begin) + kQueryTile - 1) / kQueryTile;
      RowTile tile[kRowTileBlock];
      Scratch slot[kRowTileBlock];
      RowTileSoftmax state[kRowTileBlock];
      int32_t keys_end = 0;
      for (int32_t t = 0; t < tiles; t++) {
        tile[t] = row_tile_at(block_begin + t * kQueryTile);
        slot[t] = row_tile_slot(p, s, t);
        state[t] = begin_row_tile(p, slot[t]);
        keys_end = std::max(keys_end, tile[t].keys_end);
      }
      for (int32_t j0 = w.key_begin; j0 < keys_end; j0 += kKeyTile) {
        for (int32_t t = 0; t < tiles; t++) {
          if (j0 < tile[t].keys_end) attend_key_tile(p, tile[t], kv, j0, state[t], slot[t], ec);
        }
      }
      for (int32_t t = 0; t < tiles; t++) finish_row_tile(p, tile[t], kv, nullptr, state[t], slot[t], ec);
    }
    return;
  }

  for (int32_t f0 = w.row_begin; f0 < w.row_end; f0 += kQueryTile) {
    const RowTile rt = row_tile_at(f0);
    if (row_stats == nullptr) {
      float* partial = w.partials == nullptr ? nullptr : partial_row(p, w, f0);
      attend_row_tile(p, rt, kv, w.key_begin, partial, s, ec);
      continue;
    }
    float maxima[kQueryTile], inv_sum[kQueryTile];
    for (int r = 0; r < kQueryTile; r++) {
      maxima[r] = kNegInf, inv_sum[r] = 0.0f;  // padding rows: attend nothing
      if (r >= rt.rows) continue;
      const float* stats = row_stats + 2 * static_cast<size_t>(f0 - w.row_begin + r);
      maxima[r] = stats[0];
      inv_sum[r] = stats[1] == 0.0f ? 0.0f : 1.0f / stats[1];  // as attend_row_tile's
    }
    write_row_tile_weights(p, rt, kv, w.key_begin, w.key_end, wasm_v128_load(maxima), inv_sum, false, s, ec);
  }
}

// Whether some row of the work may attend some key of [key_begin, key_end): a key before the
// row's limit (key length, causal frontier), not before its start (the batch's first key, the window's), that the mask, if
// any, does not block (a boolean
// mask's 0, a float mask's -inf; a NaN is not blocked). Rows reading the same mask row up to
// the same key (a mask broadcast over the query heads of a GQA group) are scanned once; a
// boolean mask is read 16 keys at a time, a float mask 4.
bool work_attends_any_key(const Problem& p, const KernelWork& w) {
  const RowLimits limit_of = row_limits(p, w.b);
  const int32_t first_head = w.kv_head * (p.q_heads / p.kv_heads);
  int64_t previous_mask_row = -1;
  int32_t previous_begin = -1, previous_end = -1;
  for (int32_t f = w.row_begin; f < w.row_end; f++) {
    const int32_t i = f % p.q_len, end = std::min(limit_of(i), w.key_end);
    const int32_t begin = std::max(limit_of.start(i), w.key_begin);
    if (end <= begin) continue;
    if (p.mask_kind == MaskKind::kNone) return true;
    const int64_t mask_row = mask_row_of(p, w.b, first_head + f / p.q_len, i);
    if (mask_row == previous_mask_row && begin == previous_begin && end == previous_end) continue;  // scanned: none allowed
    previous_mask_row = mask_row, previous_begin = begin, previous_end = end;
    int32_t j = begin;
    if (p.mask_stride_k == 1 && p.mask_kind == MaskKind::kBool) {
      const uint8_t* m = static_cast<const uint8_t*>(p.mask) + mask_row;
      for (; j + 16 <= end; j += 16) {
        if (wasm_v128_any_true(wasm_v128_load(m + j))) return true;
      }
    } else if (p.mask_stride_k == 1 && p.mask_kind == MaskKind::kFloat) {
      const float* m = static_cast<const float*>(p.mask) + mask_row;
      const v128_t neg_inf = wasm_f32x4_splat(kNegInf);
      for (; j + 4 <= end; j += 4) {
        if (!wasm_i32x4_all_true(wasm_f32x4_eq(wasm_v128_load(m + j), neg_inf))) return true;
      }
    }
    for (; j < end; j++) {
      const int64_t at = mask_row + static_cast<int64_t>(j) * p.mask_stride_k;
      const bool allowed = p.mask_kind == MaskKind::kBool ? static_cast<const uint8_t*>(p.mask)[at] != 0
                                                           : static_cast<const float*>(p.mask)[at] != kNegInf;
      if (allowed) return true;
    }
  }
  return false;
}

// The partial state of every row of a split-K segment that no row attends: that of a row tile
// with no key to attend, m = -inf and l = 0, written without preparing anything. Its o is left
// unwritten: sdpa_f32_fwd_merge_partials never reads the o of a segment whose m is -inf.
void write_empty_partials(const Problem& p, const KernelWork& w) {
  for (int32_t f = w.row_begin; f < w.row_end; f++) {
    float* dst = partial_row(p, w, f);
    dst[0] = kNegInf, dst[1] = 0.0f;
  }
}

// Whether every query element of the work's rows has |scale·q| < 2^16 (or is Inf or NaN,
// which stay so times 2^112): then F16FiniteScaledElements may read its K/V.
bool query_fits_scaled_halves(const Problem& p, const KernelWork& w) {
  const int32_t group = p.q_heads / p.kv_heads;
  const v128_t scale = wasm_f32x4_splat(p.scale), limit = wasm_f32x4_splat(0x1p16f);
  const v128_t inf = wasm_f32x4_splat(std::numeric_limits<float>::infinity());
  v128_t too_large = wasm_i32x4_splat(0);  // lanes with 2^16 <= |scale·q| < Inf (not NaN)
  for (int32_t f = w.row_begin; f < w.row_end; f++) {
    const float* q = p.query + w.b * p.q_stride_b + (w.kv_head * group + f / p.q_len) * p.q_stride_h +
                     static_cast<int64_t>(f % p.q_len) * p.q_stride_l;
    int32_t d = 0;
    for (; d + 4 <= p.head_dim; d += 4) {
      const v128_t x = wasm_f32x4_abs(wasm_f32x4_mul(wasm_v128_load(q + d), scale));
      too_large = wasm_v128_or(too_large, wasm_v128_and(wasm_f32x4_ge(x, limit), wasm_f32x4_lt(x, inf)));
    }
    for (; d < p.head_dim; d++) {
      if (std::fabs(q[d] * p.scale) >= 0x1p16f && std::isfinite(q[d] * p.scale)) return false;
    }
  }
  return !wasm_v128_any_true(too_large);
}

// Whether every probability P·V multiplies, times 2^112, stays finite: p <= 1 does, and a kept
// p·z <= z (dropout, src/kernels/dropout.h) does while the factor z < 2^16. Then
// F16FiniteScaledElements may read V. A property of the problem alone.
bool probabilities_fit_scaled_halves(const Problem& p) {
  return p.dropout_threshold == 0 || dropout_factor(p) < 0x1p16f;
}

template <typename T>
struct ReaderTag {
  using type = T;
};

// Calls run(ReaderTag<Src>{}) with the reader Src of K/V elements for this problem and work:
// float32, or float16 widened (read as value·2^-112 where the queries and the dropout factor
// allow it: query_fits_scaled_halves, probabilities_fit_scaled_halves). The choice depends on
// the problem and the work's rows only, so an attend call and a weights call over the same
// rows read alike (and every reader gives a key's score the same bits).
template <typename Run>
void with_element_reader(const Problem& p, const KernelWork& w, const Run& run) {
  if (p.kv_type == KvType::kFloat16Finite) {
    if (!w.pack && probabilities_fit_scaled_halves(p) && query_fits_scaled_halves(p, w)) {
      run(ReaderTag<F16FiniteScaledElements>{});
    } else {
      run(ReaderTag<F16FiniteElements>{});
    }
  } else if (p.kv_type == KvType::kFloat16) {
    run(ReaderTag<F16Elements>{});
  } else if (p.kv_type == KvType::kBFloat16) {
    run(ReaderTag<BF16Elements>{});
  } else {
    run(ReaderTag<F32Elements>{});
  }
}

}  // namespace

void sdpa_f32_fwd_ukernel_4x512__wasmsimd(const Problem& p, const KernelWork& w, float* scratch) {
  // A split-K segment no row attends (past every row's key length or causal frontier, before
  // its sliding window, or blocked by the mask) costs only this check and its empty
  // partials: no query check, no scratch set-up, no bias rows.
  if (w.partials != nullptr && !work_attends_any_key(p, w)) {
    write_empty_partials(p, w);
    return;
  }
  with_element_reader(p, w, [&](auto tag) { run_work<typename decltype(tag)::type>(p, w, nullptr, scratch); });
}

void sdpa_f32_fwd_weights_4x512__wasmsimd(const Problem& p, const KernelWork& w, const float* row_stats,
                                          float* scratch) {
  assert(p.weights != nullptr && row_stats != nullptr && w.partials == nullptr);
  with_element_reader(p, w, [&](auto tag) {
    run_work<typename decltype(tag)::type>(p, w, row_stats, scratch);
  });
}

void sdpa_f32_fwd_pack_4x512__wasmsimd(const Problem& p, int32_t b, int32_t kv_head, int32_t key_begin,
                                       int32_t key_end, float* packed) {
  assert(b >= 0 && b < p.batch && kv_head >= 0 && kv_head < p.kv_heads);
  assert(key_begin >= 0 && key_begin % kKeyGroup == 0 && key_begin < key_end && key_end <= p.kv_len);
  assert(packed != nullptr && reinterpret_cast<uintptr_t>(packed) % 16 == 0);
  KernelWork w;
  w.b = b, w.kv_head = kv_head, w.pack = true;  // packing reads K/V as float32 (no scaled halves)
  with_element_reader(p, w, [&](auto tag) {
    using Src = typename decltype(tag)::type;
    using Elem = typename Src::Elem;
    assert(Src::kReadScale == 1.0f);  // with_element_reader picks no scaled reader for packing
    const Src src;
    const Elem* key = static_cast<const Elem*>(p.key) + b * p.k_stride_b + kv_head * p.k_stride_h;
    const Elem* value = static_cast<const Elem*>(p.value) + b * p.v_stride_b + kv_head * p.v_stride_h;
    float *packed_key, *packed_value;
    packed_parts(p, packed, &packed_key, &packed_value);
    pack_key_range(src, p, key, value, key_begin, key_end, packed_key, packed_value);
  });
}

void sdpa_f32_fwd_merge_partials(const Problem& p, int32_t b, int32_t kv_head, int32_t rows,
                                 int32_t segments, const float* partials, float* row_stats) {
  // partials: [segments][ceil(rows / 4)][4][2 + Ev8], each row (m_s, l_s, o_s) over segment s.
  // row_stats (for the weights pass): each row's final (M, L), its sink included.
  // With m = max_s m_s, the whole row is l = Σ_s exp(m_s - m)·l_s, o = Σ_s exp(m_s - m)·o_s;
  // segments with m_s = -inf are skipped (their exp would be NaN when m is -inf too): they
  // attended nothing (l_s = 0), or every score they saw was NaN (the running maximum never
  // takes a NaN, pmax keeps -inf, but the sum does: l_s = NaN), which must make the row NaN,
  // not look empty. Summed in segment order: the same bits for any number of threads.
  const int32_t group = p.q_heads / p.kv_heads;
  const int32_t Ev = p.value_dim;
  const size_t tile_floats = static_cast<size_t>(sdpa_f32_fwd_4x512__wasmsimd_partial_floats(p));
  const size_t row_floats = tile_floats / kQueryTile;
  const size_t segment_floats = static_cast<size_t>((rows + kQueryTile - 1) / kQueryTile) * tile_floats;
  for (int32_t f = 0; f < rows; f++) {
    const float* row0 = partials + static_cast<size_t>(f / kQueryTile) * tile_floats + (f % kQueryTile) * row_floats;
    float m = kNegInf;
    for (int32_t seg = 0; seg < segments; seg++) m = std::max(m, row0[seg * segment_floats]);
    float* dst = p.output + b * p.o_stride_b + (kv_head * group + f / p.q_len) * p.o_stride_h +
                 static_cast<int64_t>(f % p.q_len) * p.o_stride_l;
    std::fill(dst, dst + Ev, 0.0f);
    float* const lse = p.logsumexp == nullptr
                           ? nullptr
                           : p.logsumexp + (static_cast<int64_t>(b) * p.q_heads + kv_head * group + f / p.q_len) * p.q_len +
                                 f % p.q_len;
    if (lse != nullptr) *lse = kNegInf;
    float l = 0.0f;
    bool first = true;
    for (int32_t seg = 0; seg < segments; seg++) {
      const float* part = row0 + seg * segment_floats;
      if (part[0] == kNegInf) {  // its o is not read (nor always written: write_empty_partials)
        l += part[1];  // 0, or NaN
        continue;
      }
      const float scale = std::exp(part[0] - m);
      l += scale * part[1];
      // The first segment's terms are stored, not added to the +0 fill: an o of -0 stays
      // -0, so one segment gives forward()'s direct path bits (src/sdpa.h promises the
      // streamed path the same bits). (o is -0 only when a segment spans several key tiles,
      // a tiny negative sum rescaled to zero by a later tile's α; today a segment is one.)
      if (first) {
        for (int32_t c = 0; c < Ev; c++) dst[c] = scale * part[2 + c];
        first = false;
      } else {
        for (int32_t c = 0; c < Ev; c++) dst[c] += scale * part[2 + c];
      }
    }
    // The row's sink joins here, once, after the segments (softmax-sink.h): M, L and α.
    const SinkedRow row = add_sink(m, l, sink_of(p, kv_head * group + f / p.q_len));
    if (row_stats != nullptr) row_stats[2 * f] = row.max, row_stats[2 * f + 1] = row.sum;
    if (lse != nullptr) *lse = sinked_logsumexp(row, l);
    if (l == 0.0f) continue;  // every key of the row blocked: exact zeros
    const float factor = row.output_scale * (1.0f / row.sum);  // 1/l's bits without a sink
    for (int32_t c = 0; c < Ev; c++) dst[c] *= factor;
  }
}

}  // namespace sdpa
