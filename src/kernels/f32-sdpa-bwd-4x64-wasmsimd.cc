// Attention backward (FlashAttention-2 style), 128-bit wasm SIMD. Tiles: 4 query rows × 64
// keys (kQueryTile × kBackwardKeyTile, src/tiles.h). The math is in src/sdpa-backward.h.
//
// First, per query row, RowStats (sdpa-bwd-kernels.h): D = dO·O, and the shift and log_sum that
// rebuild p: the forward's lse (shift = lse, log_sum = 0), or, where a float32 lse is too coarse
// for that, the row's maximum score m and log(Σ exp(s - m)) recomputed from the scores below.
// Then per (row tile, key tile) the gradient kernels recompute, from Q, K, V and dO:
//   s[4][64]  = (scale·Q)·Kᵀ, finished as the forward does (softcap, mask + ALiBi, blocked → -inf)
//   dp[4][64] = dO·Vᵀ
//   p  = exp(min((s - shift) - log_sum, 0))
//                                 s <= m <= shift + log_sum = m + log(Σ exp(s - m)) in exact
//                                 arithmetic; the min() absorbs rounding, so p <= 1
//   ds = p·(dp - D)·(1 - t²)      t = tanh(r / softcap) when softcap > 0, else the factor is 1;
//                                 ds := 0 wherever p == 0 (blocked, or flushed by exp), so a
//                                 NaN dp from NaN in a blocked V row is dropped
// With dropout (src/kernels/dropout.h: the forward's output is Σ_j p_j·z_j·v_j, z_j the key's
// factor or 0, drawn again here from the same seed and indices), the output's gradient reaches
// p_j through z_j·dp_j, and D = dO·O is still Σ_j p_j·z_j·dp_j, so
//   ds = p·(z·dp - D)·(1 - t²)    and dV takes p·z in place of p
// (probabilities_and_ds leaves p·z in s; ds := 0 still wherever p == 0).
// then the dK/dV kernel accumulates dv_j += Σ_r p[r][j]·dO_r and dk_j += Σ_r ds[r][j]·(scale·q_r)
// over the rows of its KV group (p and ds of 16 rows at a time, so each dK/dV accumulator stays
// in a register over them; the sums of each 512 rows apart, then added: kSumBlockRows), and the
// dQ kernel dq_r += Σ_j ds[r][j]·k_j over the keys (each 64-key tile's sum from zero, then added;
// times scale at the end). Padding rows of a tile (r >= rows) have p = ds = 0. The fused kernel is the
// dK/dV kernel over all key blocks of a (batch, KV head) in order, adding each tile's
// dq += ds·K as the dQ kernel would: one computation of s and dp instead of two, the same bits.
// The mask gradient kernel recomputes p and ds (not dr: the mask is added after the softcap)
// for the (b, h, i, j) that map to its block of the mask's elements and adds ds into them.
//
// Both products with a packed operand, s and dp, are score_4x8_packed (f32-tile-ops-wasmsimd.h):
// A interleaved [D][4] (q_cols, go_cols) against B packed [keys/8][D][8] (K, V).
//
// Blocked keys never reach the arithmetic as values: the scores of blocked keys are -inf
// before exp (p = 0 exactly), ds is selected to 0 where p == 0, and where a key's row of K
// would be multiplied by ds (dq += ds·k), keys past the first blocked column of any row are
// skipped per row when ds == 0 rather than multiplied by it. Keys at or past every row's
// limit (causal frontier, key length) are not read at all; keys before a row's start (its
// batch's first key, its sliding window's) are blocked like masked ones (scored, then -inf), and
// key tiles before every row's start are skipped.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <new>

#include "kernels/alibi.h"
#include "kernels/dropout.h"
#include "kernels/f32-tile-ops-wasmsimd.h"
#include "kernels/row-limits.h"
#include "kernels/sdpa-bwd-kernels.h"
#include "kernels/softmax-sink.h"
#include "math/f32-vexp-nonpositive-rr1-p5-wasmsimd.h"
#include "simd/copy-bytes.h"
#include "simd/f32x4.h"
#include "tiles.h"

namespace sdpa {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kTile = kBackwardKeyTile;
// Rows whose p and ds the dK/dV kernel collects before adding them into dK and dV: each
// accumulator of dK/dV then stays in a register over 16 rows instead of being loaded and stored
// for every row tile.
constexpr int kGroupRows = 4 * kQueryTile;
// Rows whose dK/dV terms are summed apart before they join dK and dV (blocked summation): each
// key's dK and dV sum a term per query row of its KV group, and added one by one to a sum that
// grows with the rows they lose a bit per doubling of it (dV of uniform weights and dO about
// 0.5: 4.6e-5 of dV at 262144 rows); summed 512 rows at a time, the blocks' sums then added
// with Kahan's compensation (dkdv_block), the error is about a block's. A multiple of kGroupRows.
constexpr int kSumBlockRows = 32 * kGroupRows;
static_assert(kSumBlockRows % kGroupRows == 0, "blocks of whole groups");
// Rows whose statistics the row statistics kernel recomputes together: each 64-key tile of K is
// packed once for them all (packed per 4-row tile, the packing had cost about as much as the
// scoring: see the performance log).
constexpr int kStatsGroupRows = 16 * kQueryTile;
constexpr int kStatsGroupTiles = kStatsGroupRows / kQueryTile;

uint64_t align4(uint64_t n) { return (n + 3) / 4 * 4; }

// sum += term with Kahan's compensation: comp holds what the additions into sum so far dropped
// (taken off the next term), so that many like terms do not add up their roundings. A
// non-finite sum clears comp: Inf stays Inf (Inf - Inf would make comp NaN, and the next term
// the sum). From sum = comp = 0 the first term gives sum = term, comp = 0: a plain addition's bits.
inline void compensated_add(float& sum, float& comp, float term) {
  const float y = term - comp;
  const float t = sum + y;
  comp = std::isfinite(t) ? (t - sum) - y : 0.0f;
  sum = t;
}

// The same for 4 lanes: sum[0..4) += term, comp[0..4) the lanes' compensation.
inline void compensated_add4(float* sum, float* comp, v128_t term) {
  const v128_t s = wasm_v128_load(sum);
  const v128_t y = wasm_f32x4_sub(term, wasm_v128_load(comp));
  const v128_t t = wasm_f32x4_add(s, y);
  const v128_t finite = wasm_f32x4_lt(wasm_f32x4_abs(t), wasm_f32x4_splat(std::numeric_limits<float>::infinity()));
  wasm_v128_store(comp, wasm_v128_and(wasm_f32x4_sub(wasm_f32x4_sub(t, s), y), finite));
  wasm_v128_store(sum, t);
}

// Splits scratch into consecutive 16-byte-aligned parts of the given float counts; with a
// null base only returns the total (+ 4 floats to align the base).
template <int N>
uint64_t carve(float* base, const uint64_t (&sizes)[N], float* (&parts)[N]) {
  float* aligned = base == nullptr
                       ? nullptr
                       : reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(base) + 15) & ~uintptr_t{15});
  uint64_t offset = 0;
  for (int i = 0; i < N; i++) {
    parts[i] = aligned == nullptr ? nullptr : aligned + offset;
    offset += align4(sizes[i]);
  }
  return offset + 4;
}

// The query rows of one tile: flat rows f = (h - first head)·Lq + i of one (batch, KV head).
struct RowTile {
  int32_t b = 0;
  int32_t rows = 0;
  int32_t h[kQueryTile] = {}, i[kQueryTile] = {};
  int32_t start[kQueryTile] = {};  // row r may attend keys start[r] <= j (the batch's first key or the window's, else 0)
  int32_t limit[kQueryTile] = {};  // ... and j < limit[r]
  int32_t keys_end = 0;            // max over rows of limit[r]
  int32_t keys_begin = 0;          // min over rows attending a key of start[r]: keys before it are blocked for all
  float shift[kQueryTile] = {}, log_sum[kQueryTile] = {}, delta[kQueryTile] = {};  // RowStats
};

// Query row i of (b, h).
const float* query_row(const Problem& p, int32_t b, int32_t h, int32_t i) {
  return p.query + b * p.q_stride_b + h * p.q_stride_h + static_cast<int64_t>(i) * p.q_stride_l;
}

RowTile make_row_tile(const BackwardProblem& bp, int32_t b, int32_t kv_head, int32_t f0, int32_t row_end,
                      const RowStats& stats) {
  const Problem& p = bp.forward;
  const int32_t group = p.q_heads / p.kv_heads;
  const RowLimits limit_of = row_limits(p, b);
  RowTile rt;
  rt.b = b;
  rt.rows = std::min(kQueryTile, row_end - f0);
  for (int r = 0; r < rt.rows; r++) {
    const int32_t f = f0 + r;
    rt.h[r] = kv_head * group + f / p.q_len;
    rt.i[r] = f % p.q_len;
    const int64_t row = (static_cast<int64_t>(b) * p.q_heads + rt.h[r]) * p.q_len + rt.i[r];
    rt.shift[r] = stats.shift[row];
    rt.log_sum[r] = stats.log_sum[row];
    rt.delta[r] = stats.delta[row];
    // A row with nothing to attend (shift = lse = -inf) contributes nothing: no keys.
    rt.limit[r] = rt.shift[r] == kNegInf ? 0 : limit_of(rt.i[r]);
    rt.start[r] = std::min(limit_of.start(rt.i[r]), rt.limit[r]);
    rt.keys_end = std::max(rt.keys_end, rt.limit[r]);
  }
  rt.keys_begin = rt.keys_end;
  for (int r = 0; r < rt.rows; r++) {
    if (rt.start[r] < rt.limit[r]) rt.keys_begin = std::min(rt.keys_begin, rt.start[r]);
  }
  return rt;
}

// The tile's rows of scale·Q and dO: row-major ([4][E], [4][Ev]) and interleaved ([E][4],
// [Ev][4]) for score_4x8_packed; zeros for padding rows.
struct RowOperands {
  float* q_rows;
  float* q_cols;
  float* go_rows;
  float* go_cols;
};

void load_row_operands(const BackwardProblem& bp, const RowTile& rt, const RowOperands& o) {
  const Problem& p = bp.forward;
  const int32_t E = p.head_dim, Ev = p.value_dim;
  for (int r = 0; r < kQueryTile; r++) {
    float* q = o.q_rows + r * E;
    float* go = o.go_rows + r * Ev;
    if (r < rt.rows) {
      const float* q_src = query_row(p, rt.b, rt.h[r], rt.i[r]);
      const float* go_src = bp.grad_output + rt.b * bp.go_stride_b + rt.h[r] * bp.go_stride_h +
                            static_cast<int64_t>(rt.i[r]) * bp.go_stride_l;
      for (int32_t d = 0; d < E; d++) q[d] = q_src[d] * p.scale;
      copy_bytes(go, go_src, sizeof(float) * Ev);
    } else {
      std::fill(q, q + E, 0.0f);
      std::fill(go, go + Ev, 0.0f);
    }
  }
  for (int32_t d = 0; d < E; d++) {
    for (int r = 0; r < kQueryTile; r++) o.q_cols[d * kQueryTile + r] = o.q_rows[r * E + d];
  }
  for (int32_t c = 0; c < Ev; c++) {
    for (int r = 0; r < kQueryTile; r++) o.go_cols[c * kQueryTile + r] = o.go_rows[r * Ev + c];
  }
}

// 1 when the row x[0 .. dim) holds an Inf or a NaN: x·0 is ±0 for finite x, NaN otherwise.
uint8_t holds_nonfinite(const float* x, int32_t dim) {
  float zero = 0.0f;
  for (int32_t d = 0; d < dim; d++) zero += x[d] * 0.0f;
  return zero != 0.0f;
}

constexpr uint64_t kRowTileFloats = (sizeof(RowTile) + sizeof(float) - 1) / sizeof(float);
static_assert(alignof(RowTile) <= alignof(float), "row tiles live in float scratch");

// Query rows of one (batch, KV head) made ready for the kernels, tile by tile: 4T consecutive
// flat rows (from a multiple of 4) as T row tiles, each with its statistics and operands:
//   tiles                       [T]          RowTile: RowStats, key limits
//   q_rows [4T][E], go_rows [4T][Ev]         scale·q and dO, zero rows for padding
//   q_cols [T][E][4], go_cols [T][Ev][4]     the same, interleaved per tile (score_4x8_packed)
//   q_nonfinite, go_nonfinite   [4T]         holds_nonfinite of each row (accumulate_transposed)
// The fused kernel prepares every row of its pair once: each key block reads them all. The
// dK/dV kernel prepares a group of kGroupRows rows at a time, the dQ kernel one tile.
struct PreparedRows {
  RowTile* tiles;
  float *q_rows, *q_cols, *go_rows, *go_cols;
  uint8_t *q_nonfinite, *go_nonfinite;

  // Tile t's operands, for probabilities_and_ds.
  RowOperands operands(int32_t t, int32_t E, int32_t Ev) const {
    return {q_rows + static_cast<size_t>(t) * kQueryTile * E, q_cols + static_cast<size_t>(t) * kQueryTile * E,
            go_rows + static_cast<size_t>(t) * kQueryTile * Ev, go_cols + static_cast<size_t>(t) * kQueryTile * Ev};
  }
  // The rows from tile t on.
  PreparedRows from_tile(int32_t t, int32_t E, int32_t Ev) const {
    const RowOperands o = operands(t, E, Ev);
    return {tiles + t, o.q_rows, o.q_cols, o.go_rows, o.go_cols, q_nonfinite + t * kQueryTile,
            go_nonfinite + t * kQueryTile};
  }
};

// Prepares flat rows [f_begin, f_end) of (b, kv_head) (f_begin a multiple of 4; rows of the
// pair: row_end) into `out`, which holds round_up(f_end - f_begin, 4) / 4 tiles.
void prepare_rows(const BackwardProblem& bp, int32_t b, int32_t kv_head, int32_t f_begin, int32_t f_end,
                  int32_t row_end, const RowStats& stats, const PreparedRows& out) {
  const int32_t E = bp.forward.head_dim, Ev = bp.forward.value_dim;
  for (int32_t f0 = f_begin, t = 0; f0 < f_end; f0 += kQueryTile, t++) {
    RowTile* rt = new (out.tiles + t) RowTile(make_row_tile(bp, b, kv_head, f0, row_end, stats));
    const RowOperands o = out.operands(t, E, Ev);
    load_row_operands(bp, *rt, o);
    for (int r = 0; r < kQueryTile; r++) {
      out.q_nonfinite[t * kQueryTile + r] = holds_nonfinite(o.q_rows + r * E, E);
      out.go_nonfinite[t * kQueryTile + r] = holds_nonfinite(o.go_rows + r * Ev, Ev);
    }
  }
}

// Columns [0, c) of one score row finished with the mask row at `mask_at` (mask_stride_k == 1),
// for c, the returned multiple of 4 not past allowed_end: score + bias, or -inf where the mask
// blocks (a float -inf, a bool 0); open_cols lowered to the first blocked column among them.
// The same values as finished_scores' loop one column at a time (the same additions).
int32_t add_contiguous_mask(const Problem& p, int64_t mask_at, int32_t allowed_end, float* row, int32_t& open_cols) {
  const v128_t neg_inf = wasm_f32x4_splat(kNegInf);
  int32_t c = 0;
  if (p.mask_kind == MaskKind::kFloat) {
    const float* m = static_cast<const float*>(p.mask) + mask_at;
    for (; c + 4 <= allowed_end; c += 4) {
      const v128_t bias = wasm_v128_load(m + c);
      const v128_t blocked = wasm_f32x4_eq(bias, neg_inf);
      const uint32_t bits = wasm_i32x4_bitmask(blocked);
      if (bits != 0) open_cols = std::min(open_cols, c + __builtin_ctz(bits));
      wasm_v128_store(row + c, wasm_v128_bitselect(neg_inf, wasm_f32x4_add(wasm_v128_load(row + c), bias), blocked));
    }
  } else {
    const uint8_t* m = static_cast<const uint8_t*>(p.mask) + mask_at;
    for (; c + 4 <= allowed_end; c += 4) {
      const v128_t blocked = wasm_i32x4_eq(wasm_i32x4_make(m[c], m[c + 1], m[c + 2], m[c + 3]), wasm_i32x4_splat(0));
      const uint32_t bits = wasm_i32x4_bitmask(blocked);
      if (bits != 0) open_cols = std::min(open_cols, c + __builtin_ctz(bits));
      // + 0: a bool mask's bias, as one column at a time (-0 becomes +0 there too)
      const v128_t score = wasm_f32x4_add(wasm_v128_load(row + c), wasm_f32x4_splat(0.0f));
      wasm_v128_store(row + c, wasm_v128_bitselect(neg_inf, score, blocked));
    }
  }
  return c;
}

// The scores s[4][kTile] of one (row tile, key tile) of keys [j0, j0 + count), computed from
// the tile's scale·Q and K packed from key j0 on, and finished in the forward's order: softcap
// (t = tanh(r / softcap) kept in tanh_r), mask + ALiBi (bias = mask + alibi, then s + bias, as the
// forward's bias rows), blocked → -inf (past a row's limit, before its window's start). Columns [count, round_up(count,
// 8)) and padding rows end -inf. Returns the first column that is blocked for some real row
// (columns before it are open for every row). Row statistics and gradients both take their
// scores from here: the same bits.
int32_t finished_scores(const BackwardProblem& bp, const RowTile& rt, const RowOperands& o, const float* k_packed,
                        int32_t j0, int32_t count, float* s, float* tanh_r) {
  const Problem& p = bp.forward;
  const int32_t cols = round_up(count, kKeyGroup);
  score_4x8_packed<kTile>(o.q_cols, k_packed, p.head_dim, cols, s);

  // Scalar: per element a few compares (and a tanh with softcap) against the E multiply-adds
  // above.
  int32_t open_cols = cols;
  const bool capped = p.softcap > 0.0f;
  const float cap = p.softcap;
  const bool has_alibi = p.alibi_slopes != nullptr;
  const bool plain = !capped && p.mask_kind == MaskKind::kNone && !has_alibi;
  if (plain) {
    // The scores stand as computed; only each row's limit blocks: columns past it are -inf.
    for (int r = 0; r < kQueryTile; r++) {
      const int32_t allowed_end = r < rt.rows ? std::clamp(rt.limit[r] - j0, 0, count) : 0;
      if (r < rt.rows) open_cols = std::min(open_cols, allowed_end);
      std::fill(s + r * kTile + allowed_end, s + r * kTile + cols, kNegInf);
    }
  }
  for (int r = 0; r < kQueryTile && !plain; r++) {
    float* row = s + r * kTile;
    if (r >= rt.rows) {
      std::fill(row, row + cols, kNegInf);
      continue;
    }
    const int32_t allowed_end = std::clamp(rt.limit[r] - j0, 0, count);
    const int64_t mask_row = rt.b * p.mask_stride_b + rt.h[r] * p.mask_stride_h +
                             static_cast<int64_t>(rt.i[r]) * p.mask_stride_q;
    const AlibiRow alibi = has_alibi ? alibi_row(p, rt.b, rt.h[r], rt.i[r]) : AlibiRow{0.0f, 0};
    // A mask contiguous along keys, without softcap or ALiBi: 4 columns at a time, then one at a time.
    int32_t c = !capped && !has_alibi && p.mask_kind != MaskKind::kNone && p.mask_stride_k == 1
                    ? add_contiguous_mask(p, mask_row + j0, allowed_end, row, open_cols)
                    : 0;
    for (; c < cols; c++) {
      bool blocked = c >= allowed_end;
      float bias = 0.0f;
      if (!blocked && p.mask_kind != MaskKind::kNone) {
        const int64_t at = mask_row + static_cast<int64_t>(j0 + c) * p.mask_stride_k;
        if (p.mask_kind == MaskKind::kFloat) {
          bias = static_cast<const float*>(p.mask)[at];
          blocked = bias == kNegInf;
        } else {
          blocked = static_cast<const uint8_t*>(p.mask)[at] == 0;
        }
      }
      if (blocked) {
        open_cols = std::min(open_cols, c);
        row[c] = kNegInf;
        continue;
      }
      if (has_alibi) bias += alibi_bias(alibi, j0 + c);
      float score = row[c];
      if (capped) {
        const float t = std::tanh(score / cap);  // as the forward: 1/cap may overflow
        tanh_r[r * kTile + c] = t;
        score = cap * t;
      }
      row[c] = score + bias;
    }
  }
  // Keys before a row's start (its batch's first key, its window's) are blocked whatever the
  // scores and the mask gave them.
  for (int r = 0; r < rt.rows && (p.sliding_window != 0 || p.key_starts != nullptr); r++) {
    const int32_t window_begin = std::clamp(rt.start[r] - j0, 0, count);
    if (window_begin == 0) continue;
    open_cols = 0;
    std::fill(s + r * kTile, s + r * kTile + window_begin, kNegInf);
  }
  return open_cols;
}

// What probabilities_and_ds leaves in dp: the gradient of the scores before the softcap
// (dr = ds·(1 - t²), for dQ and dK), or after it, where the mask is added (ds, for the mask).
enum class ScoreGrad { kBeforeSoftcap, kAfterSoftcap };

// One (row tile, key tile) of keys [j0, j0 + count): s (finished_scores) and dp computed, then
// turned into p (in s; p·z with dropout, what dV takes) and ds or dr (in dp, as `grad` says), as
// the file's opening comment says. Returns finished_scores' first blocked column. Columns [count, round_up(count, 8)) and
// padding rows end with p = ds = 0.
int32_t probabilities_and_ds(const BackwardProblem& bp, const RowTile& rt, const RowOperands& o,
                             const float* k_packed, const float* v_packed, int32_t j0, int32_t count,
                             float* s, float* dp, float* tanh_r, const ExpConstants& ec,
                             ScoreGrad grad = ScoreGrad::kBeforeSoftcap) {
  const Problem& p = bp.forward;
  const int32_t cols = round_up(count, kKeyGroup);
  const int32_t open_cols = finished_scores(bp, rt, o, k_packed, j0, count, s, tanh_r);
  score_4x8_packed<kTile>(o.go_cols, v_packed, p.value_dim, cols, dp);
  const bool capped = p.softcap > 0.0f && grad == ScoreGrad::kBeforeSoftcap;
  const bool dropout = p.dropout_threshold != 0;
  // Dropout's z per column of a row, [kTile]: the factor where kept, else 0 (1s dropped to z).
  alignas(16) float z[kTile];
  const float dropout_scale = dropout ? dropout_factor(p) : 1.0f;

  const v128_t zero = wasm_f32x4_splat(0.0f);
  for (int r = 0; r < kQueryTile; r++) {
    float* s_row = s + r * kTile;
    float* dp_row = dp + r * kTile;
    // A row with no keys (padding, or shift = -inf) has only -inf scores: shift by 0, not by
    // -inf (-inf - -inf would be NaN).
    const bool attends = r < rt.rows && rt.limit[r] > 0;
    const float shift = attends ? rt.shift[r] : 0.0f, log_sum = attends ? rt.log_sum[r] : 0.0f;
    const v128_t vshift = wasm_f32x4_splat(shift), vlog_sum = wasm_f32x4_splat(log_sum);
    const v128_t vdelta = wasm_f32x4_splat(r < rt.rows ? rt.delta[r] : 0.0f);
    // A NaN shift (the row attends a NaN or +Inf score) makes p NaN for the keys it attends,
    // and -inf - NaN is NaN too: its blocked keys are set back to p = 0.
    const bool nan_shift = std::isnan(shift);
    const bool dropped = dropout && r < rt.rows;
    if (dropped) {
      std::fill(z, z + cols, 1.0f);
      apply_dropout_row(p, dropout_row(p, rt.b, rt.h[r], rt.i[r]), j0, cols, dropout_scale, z);
    }
    for (int32_t c = 0; c < cols; c += 4) {
      // p = exp(min((s - shift) - log_sum, 0)): exactly 0 for s = -inf. With log_sum = 0 (the
      // forward's lse) x - 0 = x: the bits of exp(min(s - lse, 0)).
      const v128_t sv = wasm_v128_load(s_row + c);
      const v128_t x = wasm_f32x4_pmin(wasm_f32x4_sub(wasm_f32x4_sub(sv, vshift), vlog_sum), zero);
      v128_t prob = exp_nonpositive(x, ec);
      if (nan_shift) prob = wasm_v128_andnot(prob, wasm_f32x4_eq(sv, wasm_f32x4_splat(kNegInf)));
      v128_t dp_c = wasm_v128_load(dp_row + c);
      if (dropped) dp_c = wasm_f32x4_mul(dp_c, wasm_v128_load(z + c));  // z·dp
      v128_t ds = wasm_f32x4_mul(prob, wasm_f32x4_sub(dp_c, vdelta));
      // ds := 0 where p == 0 (and p·NaN would be NaN).
      ds = wasm_v128_andnot(ds, wasm_f32x4_eq(prob, zero));
      if (dropped) prob = wasm_f32x4_mul(prob, wasm_v128_load(z + c));  // p·z for dV
      wasm_v128_store(s_row + c, prob);
      wasm_v128_store(dp_row + c, ds);
    }
    if (capped && r < rt.rows) {  // dr = ds·(1 - t²); blocked columns have ds = 0 already
      const float* t = tanh_r + r * kTile;
      for (int32_t c = 0; c < cols; c++) {
        if (dp_row[c] != 0.0f) dp_row[c] *= 1.0f - t[c] * t[c];
      }
    }
  }
  return open_cols;
}

// acc[j][col .. col + 4·kVecs) += Σ_{r < rows} w[r][j] · x[r][col ..] for the 4 keys j0 .. j0+3
// (w rows kTile apart, x rows `dim` apart, acc rows `dim` apart): 4 keys × 8 columns = 8
// accumulators kept in registers over all the rows; per row 2 loads of x and 4 broadcasts of w.
template <int kVecs, bool kCareful>
void transposed_block(const float* w, const float* x, int32_t rows, int32_t dim, float* acc, const uint8_t* nonfinite) {
  v128_t o[4][kVecs];
  for (int jj = 0; jj < 4; jj++) {
    for (int v = 0; v < kVecs; v++) o[jj][v] = wasm_v128_load(acc + jj * dim + 4 * v);
  }
  const float* const w_end = w + static_cast<size_t>(rows) * kTile;
#pragma clang loop unroll(disable)
  for (int32_t r = 0; w != w_end; w += kTile, x += dim, r++) {
    v128_t xv[kVecs];
    for (int v = 0; v < kVecs; v++) xv[v] = wasm_v128_load(x + 4 * v);
    if (kCareful && nonfinite[r]) {  // skip zero weights: 0·Inf would be NaN
      for (int jj = 0; jj < 4; jj++) {
        if (w[jj] == 0.0f) continue;
        const v128_t wj = wasm_v128_load32_splat(w + jj);
        for (int v = 0; v < kVecs; v++) o[jj][v] = f32x4_madd(wj, xv[v], o[jj][v]);
      }
      continue;
    }
    for (int jj = 0; jj < 4; jj++) {
      const v128_t wj = wasm_v128_load32_splat(w + jj);
      for (int v = 0; v < kVecs; v++) o[jj][v] = f32x4_madd(wj, xv[v], o[jj][v]);
    }
  }
  for (int jj = 0; jj < 4; jj++) {
    for (int v = 0; v < kVecs; v++) wasm_v128_store(acc + jj * dim + 4 * v, o[jj][v]);
  }
}

// acc[j][0 .. dim) += Σ_{r < rows} w[r][j] · x[r][0 .. dim) for j < round_up(count, 4): dV += pᵀ·dO
// and dK += dsᵀ·(scale·Q) over a group of row tiles (w: p or ds [rows][kTile], x: dO or scale·Q
// [rows][dim], acc [kTile][dim]). Weights past count are 0 (blocked columns), padding rows have
// w = 0 and x = 0. Each acc element's sum runs over the rows in order whatever the blocking.
// A row of x holding Inf or NaN (nonfinite[r]: a non-finite q or dO, scale·q overflowing) skips its zero
// weights instead of multiplying them (0·Inf is NaN: a key the row does not attend would get
// it); other rows multiply them (adding 0·x, a zero, to the sum), so each row's rule depends
// only on its data, and the same bits come out whatever the grouping of rows into calls.
void accumulate_transposed(const float* w, const float* x, const uint8_t* nonfinite, int32_t rows, int32_t dim,
                           int32_t count, float* acc) {
  bool any_nonfinite = false;
  for (int32_t r = 0; r < rows; r++) any_nonfinite |= nonfinite[r] != 0;
  for (int32_t j0 = 0; j0 < count; j0 += 4) {
    const float* wj = w + j0;
    float* a = acc + static_cast<size_t>(j0) * dim;
    int32_t col = 0;
    if (any_nonfinite) {
      for (; col + 8 <= dim; col += 8) transposed_block<2, true>(wj, x + col, rows, dim, a + col, nonfinite);
      if (col + 4 <= dim) {
        transposed_block<1, true>(wj, x + col, rows, dim, a + col, nonfinite);
        col += 4;
      }
    } else {
      for (; col + 8 <= dim; col += 8) transposed_block<2, false>(wj, x + col, rows, dim, a + col, nullptr);
      if (col + 4 <= dim) {
        transposed_block<1, false>(wj, x + col, rows, dim, a + col, nullptr);
        col += 4;
      }
    }
    for (; col < dim; col++) {
      for (int jj = 0; jj < 4; jj++) {
        float sum = a[jj * dim + col];
        for (int32_t r = 0; r < rows; r++) {
          if (nonfinite[r] && wj[r * kTile + jj] == 0.0f) continue;
          sum = sum + wj[r * kTile + jj] * x[r * dim + col];
        }
        a[jj * dim + col] = sum;
      }
    }
  }
}

// acc[r][col .. col + 4·kVecs) += Σ_{j < count} ds[r][j] · K[j][col ..] for r < 4 (K rows
// k_stride apart, read in place): dq += ds·K. Keys j < open are open for every row and are
// multiplied unconditionally; from open on a row skips keys whose ds is exactly 0 (blocked:
// K there may be NaN padding). 4 rows × 8 columns = 8 accumulators at most.
// The key tile's sum is made from zero, then added to acc (blocked summation: added one key at
// a time to a dq that sums every key tile, the terms lost a bit per doubling of it: 1.4e-3 of
// dQ's size at 262144 keys where the terms cancel, 8.8e-6 summed a tile at a time).
template <int kVecs>
void dq_block(const float* ds, const float* key, int64_t k_stride, int32_t open, int32_t count, float* acc,
              int32_t acc_stride) {
  v128_t o[kQueryTile][kVecs];  // this key tile's Σ_j ds[r][j]·K[j][…]
  for (int r = 0; r < kQueryTile; r++) {
    for (int v = 0; v < kVecs; v++) o[r][v] = wasm_f32x4_splat(0.0f);
  }
  const float* k_row = key;
  const float* w = ds;
  const float* const w_open_end = ds + open;
#pragma clang loop unroll(disable)
  for (; w != w_open_end; w++, k_row += k_stride) {
    v128_t k[kVecs];
    for (int v = 0; v < kVecs; v++) k[v] = wasm_v128_load(k_row + 4 * v);
    for (int r = 0; r < kQueryTile; r++) {
      const v128_t wr = wasm_v128_load32_splat(w + r * kTile);
      for (int v = 0; v < kVecs; v++) o[r][v] = f32x4_madd(wr, k[v], o[r][v]);
    }
  }
  for (int32_t j = open; j < count; j++) {
    v128_t k[kVecs];
    for (int v = 0; v < kVecs; v++) k[v] = wasm_v128_load(key + j * k_stride + 4 * v);
    for (int r = 0; r < kQueryTile; r++) {
      const float wr = ds[r * kTile + j];
      if (wr == 0.0f) continue;
      for (int v = 0; v < kVecs; v++) o[r][v] = f32x4_madd(wasm_f32x4_splat(wr), k[v], o[r][v]);
    }
  }
  for (int r = 0; r < kQueryTile; r++) {
    for (int v = 0; v < kVecs; v++) {
      float* const at = acc + r * acc_stride + 4 * v;
      wasm_v128_store(at, wasm_f32x4_add(wasm_v128_load(at), o[r][v]));
    }
  }
}

void accumulate_dq(const float* ds, const float* key, int64_t k_stride, int32_t head_dim, int32_t open,
                   int32_t count, float* acc) {
  int32_t col = 0;
  for (; col + 8 <= head_dim; col += 8) dq_block<2>(ds, key + col, k_stride, open, count, acc + col, head_dim);
  if (col + 4 <= head_dim) {
    dq_block<1>(ds, key + col, k_stride, open, count, acc + col, head_dim);
    col += 4;
  }
  for (; col < head_dim; col++) {
    for (int r = 0; r < kQueryTile; r++) {
      float sum = 0.0f;  // from zero, as dq_block's
      for (int32_t j = 0; j < count; j++) {
        const float wr = ds[r * kTile + j];
        if (j >= open && wr == 0.0f) continue;
        sum += wr * key[j * k_stride + col];
      }
      acc[r * head_dim + col] += sum;
    }
  }
}

// Scratch of one kernel call, in floats:
//   k_packed  [keys/8][E][8], v_packed [keys/8][Ev][8]   keys: one tile (dK/dV and fused
//                                                        kernels), or round_up(Lk, tile) (dQ kernel)
//   rows      PreparedRows of T tiles: every row of the pair (fused kernel), a group of
//             kGroupRows rows (dK/dV kernel), one tile (dQ kernel), a group of kStatsGroupRows
//             rows or the pair's rows if fewer (row statistics)
//   s, dp [G][kTile], tanh_r [4][kTile]    p and ds of a group of G rows (kGroupRows; dQ: 4),
//                                          the scores of one row tile (row statistics: G = 4)
//   acc0: dK [kTile][E], acc1: dV [kTile][Ev]  (dK/dV, fused)  |  acc0: dQ [4][E]  (dQ kernel)
//   block0, block1: the same as acc0, acc1     (dK/dV, fused: the sums over the current block of
//                                              kSumBlockRows rows, added to acc0, acc1 after it)
//   comp0, comp1: the same as acc0, acc1       (dK/dV, fused: what those additions dropped, Kahan)
//   dq_all [4T][E]                          (fused kernel: every row's dQ over all key blocks)
//   key_norm_max [Lk]                       (row statistics: max_{j' <= j} ‖k_j'‖₂)
// The mask gradient kernel packs kMaskGradKeys keys at a time and keeps one tile's rows, s,
// dp and tanh_r, and mask_comp [rows][keys] of its block (up to kMaskGradRows, kMaskGradKeys;
// 1 on an axis the mask broadcasts on): what its additions into the block's elements of the
// mask's gradient dropped (Kahan).

struct Scratch {
  float *k_packed, *v_packed, *s, *dp, *tanh_r, *acc0, *acc1, *block0, *block1, *comp0, *comp1, *dq_all,
      *key_norm_max, *mask_comp;
  PreparedRows rows;
};

enum class KernelKind { kRowStats, kDkDv, kDq, kFused, kMaskGrad };

uint64_t layout(const BackwardProblem& bp, KernelKind kind, float* base, Scratch* out) {
  const Problem& p = bp.forward;
  const uint64_t E = p.head_dim, Ev = p.value_dim;
  const bool fused = kind == KernelKind::kFused, mask_grad = kind == KernelKind::kMaskGrad;
  // kMaskGrad: as kDq (one row tile, s, dp, tanh_r) but its own keys, and no accumulators
  const bool dq = kind == KernelKind::kDq || mask_grad;
  // kRowStats: k_packed (one tile), a group of row tiles, s, tanh_r, and key_norm_max [Lk]
  const bool stats = kind == KernelKind::kRowStats;
  const uint64_t all_keys = static_cast<uint64_t>(round_up(p.kv_len, kTile));
  const uint64_t keys = !dq ? kTile : mask_grad ? std::min<uint64_t>(kMaskGradKeys, all_keys) : all_keys;
  const uint64_t G = dq || stats ? kQueryTile : kGroupRows;
  const uint64_t pair_rows = static_cast<uint64_t>(p.q_heads / p.kv_heads) * p.q_len;
  const uint64_t pair_tiles = (pair_rows + kQueryTile - 1) / kQueryTile;
  const uint64_t T = fused ? pair_tiles : stats ? std::min<uint64_t>(kStatsGroupTiles, pair_tiles) : G / kQueryTile;
  const uint64_t flag_floats = (T * kQueryTile + sizeof(float) - 1) / sizeof(float);  // uint8_t flags
  const bool dkdv = !dq && !stats;  // the dK/dV and fused kernels
  // The mask gradient's block: up to kMaskGradRows rows and kMaskGradKeys keys, 1 on an axis the
  // mask broadcasts on.
  const uint64_t mask_comp_floats =
      static_cast<uint64_t>(p.mask_stride_q != 0 ? std::min(p.q_len, kMaskGradRows) : 1) *
      static_cast<uint64_t>(p.mask_stride_k != 0 ? std::min(p.kv_len, kMaskGradKeys) : 1);
  const uint64_t sizes[21] = {keys * E,
                              stats ? 0 : keys * Ev,
                              T * kRowTileFloats,
                              kQueryTile * T * E,
                              kQueryTile * T * E,
                              kQueryTile * T * Ev,
                              kQueryTile * T * Ev,
                              flag_floats,
                              flag_floats,
                              G * kTile,
                              stats ? 0 : G * kTile,
                              kQueryTile * kTile,
                              stats || mask_grad ? 0 : dq ? kQueryTile * E : kTile * E,
                              stats || dq ? 0 : kTile * Ev,
                              fused ? kQueryTile * T * E : 0,
                              stats ? static_cast<uint64_t>(p.kv_len) : 0,
                              dkdv ? kTile * E : 0,
                              dkdv ? kTile * Ev : 0,
                              dkdv ? kTile * E : 0,
                              dkdv ? kTile * Ev : 0,
                              mask_grad ? mask_comp_floats : 0};
  float* parts[21];
  const uint64_t total = carve(base, sizes, parts);
  if (out != nullptr) {
    out->k_packed = parts[0], out->v_packed = parts[1];
    out->rows = PreparedRows{reinterpret_cast<RowTile*>(parts[2]), parts[3], parts[4], parts[5], parts[6],
                             reinterpret_cast<uint8_t*>(parts[7]), reinterpret_cast<uint8_t*>(parts[8])};
    out->s = parts[9], out->dp = parts[10], out->tanh_r = parts[11];
    out->acc0 = parts[12], out->acc1 = parts[13], out->dq_all = parts[14], out->key_norm_max = parts[15];
    out->block0 = parts[16], out->block1 = parts[17], out->comp0 = parts[18], out->comp1 = parts[19];
    out->mask_comp = parts[20];
  }
  return total;
}

// dK and dV of the keys [key_begin, key_begin + kTile) of (b, kv_head) from every query row of
// the KV group, into d_key/d_value; and, when dq_all is given (the fused kernel), each row's
// dq += ds·K over these keys, exactly the dQ kernel's sequence of operations for this key tile.
// `prepared`: every row of the pair, prepared once by the caller (fused kernel), or null: each
// group of rows is prepared here, into s.rows.
// Each row tile's p and ds are computed over its own keys (the dQ kernel's count) and its
// columns up to the group's count are zero-filled (blocked), so dK/dV see the group as a block.
void dkdv_block(const BackwardProblem& bp, int32_t b, int32_t kv_head, int32_t key_begin, const RowStats& stats,
                const Scratch& s, const ExpConstants& ec, const PreparedRows* prepared, float* dq_all) {
  const Problem& p = bp.forward;
  const int32_t E = p.head_dim, Ev = p.value_dim;
  const int32_t count = std::min(kTile, p.kv_len - key_begin);
  const float* key = static_cast<const float*>(p.key) + b * p.k_stride_b + kv_head * p.k_stride_h +
                     static_cast<int64_t>(key_begin) * p.k_stride_l;
  const float* value = static_cast<const float*>(p.value) + b * p.v_stride_b + kv_head * p.v_stride_h +
                       static_cast<int64_t>(key_begin) * p.v_stride_l;
  std::fill(s.acc0, s.acc0 + kTile * E, 0.0f);
  std::fill(s.acc1, s.acc1 + kTile * Ev, 0.0f);
  for (float* part : {s.block0, s.comp0}) std::fill(part, part + kTile * E, 0.0f);
  for (float* part : {s.block1, s.comp1}) std::fill(part, part + kTile * Ev, 0.0f);
  bool block_holds_sums = false;  // block0/block1 hold terms not yet in acc0/acc1
  // acc += block, block := 0: the blocks' sums in row order, compensated (compensated_add), so
  // that many like blocks do not add up their roundings (1024 identical query heads of 1024
  // rows: dV 1.8e-5 of its size added plainly). The first block gives acc the block's sum
  // itself: the same bits as one block alone.
  const auto add_block = [&] {
    if (!block_holds_sums) return;
    const auto add = [](float* to, float* comp, float* from, int32_t floats) {
      for (int32_t i = 0; i < floats; i++) compensated_add(to[i], comp[i], from[i]), from[i] = 0.0f;
    };
    add(s.acc0, s.comp0, s.block0, kTile * E);
    add(s.acc1, s.comp1, s.block1, kTile * Ev);
    block_holds_sums = false;
  };

  const int32_t rows = p.q_heads / p.kv_heads * p.q_len;
  // A tile's keys in the block: up to its rows' furthest limit, none when the block ends before
  // every row's start (its p and ds would be all zeros, and accumulate_dq would skip them all).
  auto keys_of = [&](const RowTile& rt) {
    return key_begin + count <= rt.keys_begin ? 0 : std::clamp(rt.keys_end - key_begin, 0, count);
  };
  // Keys of the block some row may attend: those are packed (the others may hold padding).
  int32_t packed_keys = 0;
  for (int32_t f0 = 0, t = 0; f0 < rows; f0 += kQueryTile, t++) {
    packed_keys = std::max(packed_keys, keys_of(prepared != nullptr ? prepared->tiles[t]
                                                                    : make_row_tile(bp, b, kv_head, f0, rows, stats)));
  }
  if (packed_keys > 0) {
    pack_key_groups(kF32Elements, key, p.k_stride_l, packed_keys, E, s.k_packed);
    pack_key_groups(kF32Elements, value, p.v_stride_l, packed_keys, Ev, s.v_packed);
    for (int32_t g0 = 0; g0 < rows; g0 += kGroupRows) {
      if (g0 % kSumBlockRows == 0) add_block();
      const int32_t g_end = std::min(rows, g0 + kGroupRows);
      const int32_t g_tiles = (g_end - g0 + kQueryTile - 1) / kQueryTile;
      if (prepared == nullptr) prepare_rows(bp, b, kv_head, g0, g_end, rows, stats, s.rows);
      const PreparedRows g = prepared != nullptr ? prepared->from_tile(g0 / kQueryTile, E, Ev) : s.rows;
      int32_t group_cols = 0;  // columns of p and ds the group defines: its most keys, rounded to 8
      for (int32_t t = 0; t < g_tiles; t++) group_cols = std::max(group_cols, round_up(keys_of(g.tiles[t]), kKeyGroup));
      if (group_cols == 0) continue;  // no row of the group attends a key of the block
      for (int32_t t = 0; t < g_tiles; t++) {
        const RowTile& rt = g.tiles[t];
        const int32_t tile_keys = keys_of(rt);
        float* tile_p = s.s + t * kQueryTile * kTile;
        float* tile_ds = s.dp + t * kQueryTile * kTile;
        const int32_t tile_cols = round_up(tile_keys, kKeyGroup);
        for (int r = 0; r < kQueryTile; r++) {  // columns this tile does not compute: blocked
          std::fill(tile_p + r * kTile + tile_cols, tile_p + r * kTile + group_cols, 0.0f);
          std::fill(tile_ds + r * kTile + tile_cols, tile_ds + r * kTile + group_cols, 0.0f);
        }
        if (tile_keys == 0) continue;  // p and ds all zero
        const int32_t open = probabilities_and_ds(bp, rt, g.operands(t, E, Ev), s.k_packed, s.v_packed, key_begin,
                                                  tile_keys, tile_p, tile_ds, s.tanh_r, ec);
        if (dq_all != nullptr) {
          accumulate_dq(tile_ds, key, p.k_stride_l, E, std::min(open, tile_keys), tile_keys,
                        dq_all + static_cast<size_t>(g0 + t * kQueryTile) * E);
        }
      }
      const int32_t group_rows = g_tiles * kQueryTile;
      // dV += pᵀ·dO, dK += dsᵀ·(scale·Q), into the block's sums
      accumulate_transposed(s.s, g.go_rows, g.go_nonfinite, group_rows, Ev, group_cols, s.block1);
      accumulate_transposed(s.dp, g.q_rows, g.q_nonfinite, group_rows, E, group_cols, s.block0);
      block_holds_sums = true;
    }
    add_block();
  }
  for (int32_t j = 0; j < count; j++) {
    const int64_t key_row = static_cast<int64_t>(key_begin + j);
    copy_bytes(bp.d_key + b * bp.dk_stride_b + kv_head * bp.dk_stride_h + key_row * bp.dk_stride_l,
               s.acc0 + static_cast<size_t>(j) * E, sizeof(float) * E);
    copy_bytes(bp.d_value + b * bp.dv_stride_b + kv_head * bp.dv_stride_h + key_row * bp.dv_stride_l,
               s.acc1 + static_cast<size_t>(j) * Ev, sizeof(float) * Ev);
  }
}

// d_query rows of flat rows [row_begin, row_end) = scale · acc (acc rows from row_begin, E apart).
void write_dq(const BackwardProblem& bp, int32_t b, int32_t kv_head, int32_t row_begin, int32_t row_end,
              const float* acc) {
  const Problem& p = bp.forward;
  const int32_t group = p.q_heads / p.kv_heads, E = p.head_dim;
  for (int32_t f = row_begin; f < row_end; f++) {
    const int32_t h = kv_head * group + f / p.q_len, i = f % p.q_len;
    float* dst = bp.d_query + b * bp.dq_stride_b + h * bp.dq_stride_h + static_cast<int64_t>(i) * bp.dq_stride_l;
    const float* a = acc + static_cast<size_t>(f - row_begin) * E;
    for (int32_t d = 0; d < E; d++) dst[d] = a[d] * p.scale;
  }
}

}  // namespace

namespace {

// ‖x‖₂ of `dim` floats, summed in double, as a float (NaN if x holds one).
float row_norm(const float* x, int32_t dim) {
  double sum = 0.0;
  for (int32_t d = 0; d < dim; d++) sum += static_cast<double>(x[d]) * x[d];
  return static_cast<float>(std::sqrt(sum));
}

// Whether a row with forward lse `lse`, keys j < limit, query q and max_{j < limit} ‖k_j‖₂ =
// key_norm_max gets its statistics recomputed rather than taken from its lse (RowStats). A NaN
// norm (NaN in q or in every key's row) compares false: the lse then decides alone.
bool recomputes_stats(const Problem& p, float lse, int32_t limit, const float* q, float key_norm_max) {
  if (limit == 0 || !std::isfinite(lse)) return false;
  if (std::fabs(lse) > kExactLseLimit) return true;
  return std::fabs(static_cast<double>(p.scale)) * row_norm(q, p.head_dim) * key_norm_max > kExactScoreTerms;
}

// The statistics of the rows marked in `recompute` (bit r of recompute[t]: row r of tile t),
// for the group's row tiles in s.rows (tiles [0, tile_count), the marked ones with their
// operands loaded): row (t, r)'s shift = m = max_j s_j and log_sum = log(l), l = Σ_j exp(s_j - m),
// over its keys [0, limit), one key tile at a time in order:
//   tile maximum mt = -inf     the tile has no key of the row: m and l unchanged
//   mt > m                     new maximum: l *= exp(m - mt) (0 while m = -inf), m = mt
//   then                       l += Σ_tile exp(s - m), each term in [0, 1], the maximum's 1
// so l >= 1 once a key is seen, and log_sum >= 0; a sink then joins m and l as the forward's does. Each tile of K is packed once for the group;
// each row tile scores it over its own keys (up to the largest limit of its marked rows), so a
// row's scores and sums do not depend on the rows it is grouped with.
void recompute_row_stats(const BackwardProblem& bp, int32_t b, int32_t kv_head, const uint8_t* recompute,
                         int32_t tile_count, const Scratch& s, const ExpConstants& ec, const RowStats& stats) {
  const Problem& p = bp.forward;
  const int32_t E = p.head_dim, Ev = p.value_dim;
  const float* key = static_cast<const float*>(p.key) + b * p.k_stride_b + kv_head * p.k_stride_h;
  float m[kStatsGroupRows], l[kStatsGroupRows];
  int32_t tile_keys[kStatsGroupTiles];  // keys tile t scores: the largest limit of its marked rows
  int32_t keys_end = 0;
  for (int32_t t = 0; t < tile_count; t++) {
    tile_keys[t] = 0;
    for (int r = 0; r < kQueryTile; r++) {
      m[t * kQueryTile + r] = kNegInf;
      l[t * kQueryTile + r] = 0.0f;
      if (recompute[t] >> r & 1) tile_keys[t] = std::max(tile_keys[t], s.rows.tiles[t].limit[r]);
    }
    keys_end = std::max(keys_end, tile_keys[t]);
  }
  const v128_t zero = wasm_f32x4_splat(0.0f);
  for (int32_t j0 = 0; j0 < keys_end; j0 += kTile) {
    pack_key_groups(kF32Elements, key + static_cast<int64_t>(j0) * p.k_stride_l, p.k_stride_l,
                    std::min(kTile, keys_end - j0), E, s.k_packed);
    for (int32_t t = 0; t < tile_count; t++) {
      if (tile_keys[t] <= j0) continue;  // no marked row of the tile attends these keys
      const int32_t count = std::min(kTile, tile_keys[t] - j0);
      const int32_t cols = round_up(count, kKeyGroup);
      finished_scores(bp, s.rows.tiles[t], s.rows.operands(t, E, Ev), s.k_packed, j0, count, s.s, s.tanh_r);
      for (int r = 0; r < kQueryTile; r++) {
        if (!(recompute[t] >> r & 1)) continue;
        float& row_m = m[t * kQueryTile + r];
        float& row_l = l[t * kQueryTile + r];
        const float* row = s.s + r * kTile;
        v128_t vmax = wasm_f32x4_splat(kNegInf);
        for (int32_t c = 0; c < cols; c += 4) vmax = wasm_f32x4_pmax(vmax, wasm_v128_load(row + c));
        const float tile_max = std::max(std::max(wasm_f32x4_extract_lane(vmax, 0), wasm_f32x4_extract_lane(vmax, 1)),
                                        std::max(wasm_f32x4_extract_lane(vmax, 2), wasm_f32x4_extract_lane(vmax, 3)));
        if (tile_max == kNegInf) continue;  // no key of the row in this tile: m, l unchanged
        if (tile_max > row_m) {             // new maximum: rescale what was summed
          row_l *= std::exp(row_m - tile_max);
          row_m = tile_max;
        }
        const v128_t vm = wasm_f32x4_splat(row_m);
        v128_t vsum = zero;
        for (int32_t c = 0; c < cols; c += 4) {
          vsum = wasm_f32x4_add(vsum, exp_nonpositive(wasm_f32x4_pmin(wasm_f32x4_sub(wasm_v128_load(row + c), vm), zero), ec));
        }
        row_l += (wasm_f32x4_extract_lane(vsum, 0) + wasm_f32x4_extract_lane(vsum, 1)) +
                 (wasm_f32x4_extract_lane(vsum, 2) + wasm_f32x4_extract_lane(vsum, 3));
      }
    }
  }
  // Only a finite maximum replaces the lse. The scores here can overflow where the forward's
  // did not (q·k summed in another order): m = +inf (and l = NaN from inf - inf) would make p
  // NaN even for blocked keys; such a row (or one whose l is NaN from a NaN score) keeps its lse.
  for (int32_t t = 0; t < tile_count; t++) {
    const RowTile& rt = s.rows.tiles[t];
    for (int r = 0; r < kQueryTile; r++) {
      const float row_m = m[t * kQueryTile + r], row_l = l[t * kQueryTile + r];
      if (!(recompute[t] >> r & 1) || !std::isfinite(row_m) || !std::isfinite(row_l)) continue;
      const int64_t row = (static_cast<int64_t>(rt.b) * p.q_heads + rt.h[r]) * p.q_len + rt.i[r];
      // The row's sink, as the forward's lse has it (softmax-sink.h): M = max(m, sink), and
      // L = l·exp(m - M) + exp(sink - M) >= 1 still (one of its two terms is exp(0) = 1).
      const SinkedRow sinked = add_sink(row_m, row_l, sink_of(p, rt.h[r]));
      stats.shift[row] = sinked.max;
      stats.log_sum[row] = std::log(sinked.sum);
    }
  }
}

}  // namespace

bool sdpa_f32_bwd_row_stats_recomputed(const BackwardProblem& bp, int32_t b, int32_t h, int32_t i, float lse) {
  const Problem& p = bp.forward;
  const int32_t limit = row_limits(p, b)(i);
  const float* key = static_cast<const float*>(p.key) + b * p.k_stride_b + h / (p.q_heads / p.kv_heads) * p.k_stride_h;
  float key_norm_max = 0.0f;  // as the kernel's running maximum, in key order
  for (int32_t j = 0; j < limit; j++) key_norm_max = std::fmax(key_norm_max, row_norm(key + j * p.k_stride_l, p.head_dim));
  return recomputes_stats(p, lse, limit, query_row(p, b, h, i), key_norm_max);
}

uint64_t sdpa_f32_bwd_row_stats_4x64__wasmsimd_scratch(const BackwardProblem& p) {
  return layout(p, KernelKind::kRowStats, nullptr, nullptr);
}

void sdpa_f32_bwd_row_stats_4x64__wasmsimd(const BackwardProblem& bp, int32_t b, int32_t kv_head, int32_t row_begin,
                                           int32_t row_end, const RowStats& stats, float* scratch_base) {
  const Problem& p = bp.forward;
  assert(row_begin % kQueryTile == 0);
  const int32_t group = p.q_heads / p.kv_heads;
  // D_i = dO_i · O_i, and the forward's lse as shift (log_sum = 0), for every row.
  for (int32_t f = row_begin; f < row_end; f++) {
    const int32_t h = kv_head * group + f / p.q_len, i = f % p.q_len;
    const int64_t row = (static_cast<int64_t>(b) * p.q_heads + h) * p.q_len + i;
    const float* o = p.output + b * p.o_stride_b + h * p.o_stride_h + static_cast<int64_t>(i) * p.o_stride_l;
    const float* go = bp.grad_output + b * bp.go_stride_b + h * bp.go_stride_h + static_cast<int64_t>(i) * bp.go_stride_l;
    float sum = 0.0f;
    for (int32_t c = 0; c < p.value_dim; c++) sum += o[c] * go[c];
    stats.delta[row] = sum;
    stats.shift[row] = bp.logsumexp[row];
    stats.log_sum[row] = 0.0f;
  }
  // Rows whose lse is too coarse, or whose scores' terms too large, to rebuild p from the lse:
  // recomputed, kStatsGroupRows rows at a time. The running maximum of the key norms,
  // key_norm_max[j] = max_{j' <= j} ‖k_j'‖₂, is made once for the block's rows (up to their
  // largest key limit).
  Scratch s;
  layout(bp, KernelKind::kRowStats, scratch_base, &s);
  const ExpConstants ec = make_exp_constants();
  const int32_t E = p.head_dim, Ev = p.value_dim;
  const float* key = static_cast<const float*>(p.key) + b * p.k_stride_b + kv_head * p.k_stride_h;
  int32_t normed_keys = 0;
  for (int32_t g0 = row_begin; g0 < row_end; g0 += kStatsGroupRows) {
    const int32_t g_end = std::min(row_end, g0 + kStatsGroupRows);
    uint8_t recompute[kStatsGroupTiles] = {};  // bit r: row r of tile t is recomputed
    bool any = false;
    int32_t t = 0;
    for (int32_t f0 = g0; f0 < g_end; f0 += kQueryTile, t++) {
      const RowTile& rt = *new (s.rows.tiles + t) RowTile(make_row_tile(bp, b, kv_head, f0, row_end, stats));
      for (; normed_keys < rt.keys_end; normed_keys++) {
        const float norm = row_norm(key + normed_keys * p.k_stride_l, p.head_dim);
        s.key_norm_max[normed_keys] =
            normed_keys == 0 ? std::fmax(0.0f, norm) : std::fmax(s.key_norm_max[normed_keys - 1], norm);
      }
      for (int r = 0; r < rt.rows; r++) {
        const int32_t limit = rt.limit[r];
        if (recomputes_stats(p, rt.shift[r], limit, query_row(p, b, rt.h[r], rt.i[r]),
                             limit > 0 ? s.key_norm_max[limit - 1] : 0.0f)) {
          recompute[t] |= static_cast<uint8_t>(1 << r);
        }
      }
      if (recompute[t] != 0) load_row_operands(bp, rt, s.rows.operands(t, E, Ev));
      any = any || recompute[t] != 0;
    }
    if (any) recompute_row_stats(bp, b, kv_head, recompute, t, s, ec, stats);
  }
}

uint64_t sdpa_f32_bwd_dkdv_4x64__wasmsimd_scratch(const BackwardProblem& p) { return layout(p, KernelKind::kDkDv, nullptr, nullptr); }

uint64_t sdpa_f32_bwd_dq_4x64__wasmsimd_scratch(const BackwardProblem& p) { return layout(p, KernelKind::kDq, nullptr, nullptr); }

uint64_t sdpa_f32_bwd_fused_4x64__wasmsimd_scratch(const BackwardProblem& p) { return layout(p, KernelKind::kFused, nullptr, nullptr); }

void sdpa_f32_bwd_dkdv_ukernel_4x64__wasmsimd(const BackwardProblem& bp, int32_t b, int32_t kv_head,
                                              int32_t key_begin, const RowStats& stats, float* scratch_base) {
  [[maybe_unused]] const Problem& p = bp.forward;  // for the asserts
  assert(p.kv_type == KvType::kFloat32);
  assert(key_begin >= 0 && key_begin < p.kv_len && key_begin % kTile == 0);
  Scratch s;
  layout(bp, KernelKind::kDkDv, scratch_base, &s);
  dkdv_block(bp, b, kv_head, key_begin, stats, s, make_exp_constants(), nullptr, nullptr);
}

void sdpa_f32_bwd_fused_ukernel_4x64__wasmsimd(const BackwardProblem& bp, int32_t b, int32_t kv_head,
                                               const RowStats& stats, float* scratch_base) {
  const Problem& p = bp.forward;
  assert(p.kv_type == KvType::kFloat32);
  Scratch s;
  layout(bp, KernelKind::kFused, scratch_base, &s);
  const ExpConstants ec = make_exp_constants();
  const int32_t rows = p.q_heads / p.kv_heads * p.q_len;
  std::fill(s.dq_all, s.dq_all + static_cast<size_t>(round_up(rows, kQueryTile)) * p.head_dim, 0.0f);
  prepare_rows(bp, b, kv_head, 0, rows, rows, stats, s.rows);
  for (int32_t key_begin = 0; key_begin < p.kv_len; key_begin += kTile) {
    dkdv_block(bp, b, kv_head, key_begin, stats, s, ec, &s.rows, s.dq_all);
  }
  write_dq(bp, b, kv_head, 0, rows, s.dq_all);
}

uint64_t sdpa_f32_bwd_dmask_4x64__wasmsimd_scratch(const BackwardProblem& p) {
  return layout(p, KernelKind::kMaskGrad, nullptr, nullptr);
}

void sdpa_f32_bwd_dmask_ukernel_4x64__wasmsimd(const BackwardProblem& bp, const MaskGradBlock& block,
                                               const RowStats& stats, float* scratch_base) {
  const Problem& p = bp.forward;
  assert(p.kv_type == KvType::kFloat32 && p.mask_kind == MaskKind::kFloat && block.out != nullptr);
  assert(block.key_begin % kTile == 0 && block.key_begin < block.key_end && block.row_begin < block.row_end);
  const int32_t E = p.head_dim, Ev = p.value_dim, group = p.q_heads / p.kv_heads;
  Scratch s;
  layout(bp, KernelKind::kMaskGrad, scratch_base, &s);
  const ExpConstants ec = make_exp_constants();
  // Broadcast axes (stride 0) are summed over: every (b, h, i, j) of the block's ranges adds
  // into the block's element (i - row_begin, j - key_begin), or its only row or key where the
  // mask has no Lq or Lk axis (out_q or out_k 0 there).
  const bool all_b = p.mask_stride_b == 0, all_h = p.mask_stride_h == 0;
  const int64_t out_q = block.out_q, out_k = block.out_k;
  const int32_t block_rows = block.row_end - block.row_begin;
  const int32_t rows_out = p.mask_stride_q == 0 ? 1 : block_rows;
  const int32_t keys_out = p.mask_stride_k == 0 ? 1 : block.key_end - block.key_begin;
  assert(rows_out <= kMaskGradRows && keys_out <= kMaskGradKeys);
  for (int32_t i = 0; i < rows_out; i++) {
    for (int32_t j = 0; j < keys_out; j++) block.out[i * out_q + j * out_k] = 0.0f;
  }
  // Each element sums a term per (batch, head, row) mapping to it, in order, compensated
  // (compensated_add): a mask shared by many batches and heads sums as many terms (32768 like
  // ones added plainly: 2.5e-5 of the gradient's size). comp[i][j]: element (i, j)'s
  // compensation. An element's first term gives the element the term itself.
  float* const comp = s.mask_comp;
  const int64_t comp_q = p.mask_stride_q != 0 ? keys_out : 0, comp_k = p.mask_stride_k != 0 ? 1 : 0;
  std::fill(comp, comp + static_cast<size_t>(rows_out) * keys_out, 0.0f);
  // The row tiles adding into the block, in order: (b, h, tile) over the summed batches and
  // heads (or the block's own), tiles_per_head tiles of the block's rows each; this call sums
  // [tile_begin, tile_end) of them.
  const int32_t heads = all_h ? p.q_heads : 1;
  const int64_t tiles_per_head = (block_rows + kQueryTile - 1) / kQueryTile;
  const RowOperands operands = s.rows.operands(0, E, Ev);
  for (int64_t head_at = block.tile_begin / tiles_per_head; head_at * tiles_per_head < block.tile_end; head_at++) {
    const int32_t b = all_b ? static_cast<int32_t>(head_at / heads) : block.b;
    const int32_t h = all_h ? static_cast<int32_t>(head_at % heads) : block.h;
    const int64_t first_tile = head_at * tiles_per_head;
    const int32_t t_begin = static_cast<int32_t>(std::max<int64_t>(block.tile_begin - first_tile, 0));
    const int32_t t_end = static_cast<int32_t>(std::min<int64_t>(block.tile_end - first_tile, tiles_per_head));
    // Those rows of head h are the flat rows [f_begin, f_end) of (b, kv_head).
    const int32_t kv_head = h / group, head_rows = (h - kv_head * group) * p.q_len + block.row_begin;
    const int32_t f_begin = head_rows + t_begin * kQueryTile;
    const int32_t f_end = std::min(head_rows + t_end * kQueryTile, head_rows + block_rows);
    int32_t keys_end = block.key_begin;  // the block's keys some of the rows attend
    for (int32_t f0 = f_begin; f0 < f_end; f0 += kQueryTile) {
      keys_end = std::max(keys_end, std::min(block.key_end, make_row_tile(bp, b, kv_head, f0, f_end, stats).keys_end));
    }
    const float* key = static_cast<const float*>(p.key) + b * p.k_stride_b + kv_head * p.k_stride_h;
    const float* value = static_cast<const float*>(p.value) + b * p.v_stride_b + kv_head * p.v_stride_h;
    // kMaskGradKeys keys packed at a time (a block without the Lk axis spans every key).
    for (int32_t k0 = block.key_begin; k0 < keys_end; k0 += kMaskGradKeys) {
      const int32_t packed_end = std::min(keys_end, k0 + kMaskGradKeys);
      pack_key_groups(kF32Elements, key + static_cast<int64_t>(k0) * p.k_stride_l, p.k_stride_l, packed_end - k0, E,
                      s.k_packed);
      pack_key_groups(kF32Elements, value + static_cast<int64_t>(k0) * p.v_stride_l, p.v_stride_l, packed_end - k0,
                      Ev, s.v_packed);
      for (int32_t f0 = f_begin; f0 < f_end; f0 += kQueryTile) {
        const RowTile rt = make_row_tile(bp, b, kv_head, f0, f_end, stats);
        const int32_t tile_end = std::min(packed_end, rt.keys_end);
        if (tile_end <= k0) continue;  // the tile's rows attend none of these keys
        load_row_operands(bp, rt, operands);
        for (int32_t j0 = k0; j0 < tile_end; j0 += kTile) {
          const int32_t count = std::min(kTile, tile_end - j0);
          const size_t packed_at = static_cast<size_t>(j0 - k0);
          probabilities_and_ds(bp, rt, operands, s.k_packed + packed_at * E, s.v_packed + packed_at * Ev, j0, count,
                               s.s, s.dp, s.tanh_r, ec, ScoreGrad::kAfterSoftcap);
          // ds is 0 for blocked keys (and padding rows are not read): adding it only takes
          // off comp (what earlier additions dropped), as a later term would.
          for (int r = 0; r < rt.rows; r++) {
            float* out = block.out + (rt.i[r] - block.row_begin) * out_q + (j0 - block.key_begin) * out_k;
            float* cmp = comp + (rt.i[r] - block.row_begin) * comp_q + (j0 - block.key_begin) * comp_k;
            const float* ds = s.dp + r * kTile;
            int32_t c = 0;
            if (out_k == 1) {
              for (; c + 4 <= count; c += 4) compensated_add4(out + c, cmp + c, wasm_v128_load(ds + c));
            }
            for (; c < count; c++) compensated_add(out[c * out_k], cmp[c * comp_k], ds[c]);
          }
        }
      }
    }
  }
}

void sdpa_f32_bwd_dq_ukernel_4x64__wasmsimd(const BackwardProblem& bp, int32_t b, int32_t kv_head,
                                            int32_t row_begin, int32_t row_end, const RowStats& stats,
                                            float* scratch_base) {
  const Problem& p = bp.forward;
  assert(p.kv_type == KvType::kFloat32);
  const int32_t E = p.head_dim, Ev = p.value_dim;
  Scratch s;
  layout(bp, KernelKind::kDq, scratch_base, &s);
  const ExpConstants ec = make_exp_constants();
  const float* key = static_cast<const float*>(p.key) + b * p.k_stride_b + kv_head * p.k_stride_h;
  const float* value = static_cast<const float*>(p.value) + b * p.v_stride_b + kv_head * p.v_stride_h;

  int32_t packed_keys = 0;
  for (int32_t f0 = row_begin; f0 < row_end; f0 += kQueryTile) {
    packed_keys = std::max(packed_keys, make_row_tile(bp, b, kv_head, f0, row_end, stats).keys_end);
  }
  pack_key_groups(kF32Elements, key, p.k_stride_l, packed_keys, E, s.k_packed);
  pack_key_groups(kF32Elements, value, p.v_stride_l, packed_keys, Ev, s.v_packed);

  for (int32_t f0 = row_begin; f0 < row_end; f0 += kQueryTile) {
    const RowTile rt = make_row_tile(bp, b, kv_head, f0, row_end, stats);
    std::fill(s.acc0, s.acc0 + kQueryTile * E, 0.0f);
    const RowOperands operands = s.rows.operands(0, E, Ev);
    if (rt.keys_end > 0) load_row_operands(bp, rt, operands);
    // Key tiles before every row's start are skipped: all their ds are 0, which accumulate_dq
    // would skip (open is 0 in a tile where a start falls), so the bits are those of the fused kernel.
    for (int32_t j0 = rt.keys_begin / kTile * kTile; j0 < rt.keys_end; j0 += kTile) {
      const int32_t count = std::min(kTile, rt.keys_end - j0);
      const int32_t open = probabilities_and_ds(bp, rt, operands, s.k_packed + static_cast<size_t>(j0) * E,
                                                s.v_packed + static_cast<size_t>(j0) * Ev, j0, count, s.s, s.dp,
                                                s.tanh_r, ec);
      accumulate_dq(s.dp, key + static_cast<int64_t>(j0) * p.k_stride_l, p.k_stride_l, E, std::min(open, count),
                    count, s.acc0);
    }
    write_dq(bp, b, kv_head, f0, f0 + rt.rows, s.acc0);
  }
}

}  // namespace sdpa
