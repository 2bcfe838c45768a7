// Attention backward (FlashAttention-2 style), 128-bit wasm SIMD. Tiles: 4 query rows × 64
// keys (kQueryTile × kBackwardKeyTile, src/tiles.h). The math is in src/sdpa-backward.h.
//
// Per (row tile, key tile) both kernels recompute, from Q, K, V, dO and the forward's lse:
//   s[4][64]  = (scale·Q)·Kᵀ, finished as the forward does (softcap, mask, blocked → -inf)
//   dp[4][64] = dO·Vᵀ
//   p  = exp(min(s - lse, 0))     s <= max_j s_j <= lse = max + log(Σ exp(s - max)) in exact
//                                 arithmetic; the min() absorbs rounding, so p <= 1
//   ds = p·(dp - D)·(1 - t²)      t = tanh(r / softcap) when softcap > 0, else the factor is 1;
//                                 ds := 0 wherever p == 0 (blocked, or flushed by exp), so a
//                                 NaN dp from NaN in a blocked V row is dropped
// then the dK/dV kernel accumulates dv_j += Σ_r p[r][j]·dO_r and dk_j += Σ_r ds[r][j]·(scale·q_r)
// over the rows of its KV group, and the dQ kernel dq_r += Σ_j ds[r][j]·k_j over the keys
// (times scale at the end). Padding rows of a tile (r >= rows) have p = ds = 0.
//
// Both products with a packed operand, s and dp, are score_4x8_packed (f32-tile-ops-wasmsimd.h):
// A interleaved [D][4] (q_cols, do_cols) against B packed [keys/8][D][8] (K, V).
//
// Blocked keys never reach the arithmetic as values: the scores of blocked keys are -inf
// before exp (p = 0 exactly), ds is selected to 0 where p == 0, and where a key's row of K
// would be multiplied by ds (dq += ds·k), keys past the first blocked column of any row are
// skipped per row when ds == 0 rather than multiplied by it. Keys at or past every row's
// limit (causal frontier, key length) are not read at all.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/f32-tile-ops-wasmsimd.h"
#include "kernels/sdpa-bwd-kernels.h"
#include "math/f32-vexp-nonpositive-rr1-p5-wasmsimd.h"
#include "simd/f32x4.h"
#include "tiles.h"

namespace sdpa {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kTile = kBackwardKeyTile;

uint64_t align4(uint64_t n) { return (n + 3) / 4 * 4; }

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
  int32_t limit[kQueryTile] = {};  // row r may attend keys j < limit[r]
  int32_t keys_end = 0;            // max over rows of limit[r]
  float lse[kQueryTile] = {}, delta[kQueryTile] = {};
};

int32_t row_limit(const Problem& p, int32_t b, int32_t i) {
  const int32_t valid_keys = p.key_lengths != nullptr ? p.key_lengths[b] : p.kv_len;
  if (!p.causal) return valid_keys;
  const int64_t offset = p.causal_offsets != nullptr ? p.causal_offsets[b] : p.causal_offset;
  return static_cast<int32_t>(std::clamp<int64_t>(i + offset + 1, 0, valid_keys));
}

RowTile make_row_tile(const BackwardProblem& bp, int32_t b, int32_t kv_head, int32_t f0, int32_t row_end,
                      const float* delta) {
  const Problem& p = bp.forward;
  const int32_t group = p.q_heads / p.kv_heads;
  RowTile rt;
  rt.b = b;
  rt.rows = std::min(kQueryTile, row_end - f0);
  for (int r = 0; r < rt.rows; r++) {
    const int32_t f = f0 + r;
    rt.h[r] = kv_head * group + f / p.q_len;
    rt.i[r] = f % p.q_len;
    const int64_t row = (static_cast<int64_t>(b) * p.q_heads + rt.h[r]) * p.q_len + rt.i[r];
    rt.lse[r] = bp.logsumexp[row];
    rt.delta[r] = delta[row];
    // A row with nothing to attend (lse = -inf) contributes nothing: no keys.
    rt.limit[r] = rt.lse[r] == kNegInf ? 0 : row_limit(p, b, rt.i[r]);
    rt.keys_end = std::max(rt.keys_end, rt.limit[r]);
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
      const float* q_src = p.query + rt.b * p.q_stride_b + rt.h[r] * p.q_stride_h +
                           static_cast<int64_t>(rt.i[r]) * p.q_stride_l;
      const float* go_src = bp.grad_output + rt.b * bp.go_stride_b + rt.h[r] * bp.go_stride_h +
                            static_cast<int64_t>(rt.i[r]) * bp.go_stride_l;
      for (int32_t d = 0; d < E; d++) q[d] = q_src[d] * p.scale;
      std::memcpy(go, go_src, sizeof(float) * Ev);
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

// Rows [0, count) of a [L, D] operand (row stride `stride`) into [round_up(count, 8)/8][D][8],
// zero columns past count.
void pack_rows(const float* src, int64_t stride, int32_t count, int32_t dim, float* packed) {
  const int32_t padded = round_up(count, kKeyGroup);
  for (int32_t j0 = 0; j0 < padded; j0 += kKeyGroup) {
    float* group = packed + static_cast<size_t>(j0) * dim;
    for (int i = 0; i < kKeyGroup; i++) {
      const int32_t j = j0 + i;
      if (j < count) {
        const float* row = src + j * stride;
        for (int32_t d = 0; d < dim; d++) group[d * kKeyGroup + i] = row[d];
      } else {
        for (int32_t d = 0; d < dim; d++) group[d * kKeyGroup + i] = 0.0f;
      }
    }
  }
}

// One (row tile, key tile) of keys [j0, j0 + count): s and dp computed, then turned into
// p (in s) and ds (in dp), as the file's opening comment says. Returns the first column
// that is blocked for some real row (columns before it are open for every row).
// Columns [count, round_up(count, 8)) and padding rows end with p = ds = 0.
int32_t probabilities_and_ds(const BackwardProblem& bp, const RowTile& rt, const RowOperands& o,
                             const float* k_packed, const float* v_packed, int32_t j0, int32_t count,
                             float* s, float* dp, float* tanh_r, const ExpConstants& ec) {
  const Problem& p = bp.forward;
  const int32_t cols = round_up(count, kKeyGroup);
  score_4x8_packed<kTile>(o.q_cols, k_packed, p.head_dim, cols, s);
  score_4x8_packed<kTile>(o.go_cols, v_packed, p.value_dim, cols, dp);

  // Finish the scores in the forward's order; blocked → -inf. Scalar: per element a few
  // compares (and a tanh with softcap) against the 2·(E + Ev) multiply-adds above.
  int32_t open_cols = cols;
  const bool capped = p.softcap > 0.0f;
  const float cap = p.softcap;
  for (int r = 0; r < kQueryTile; r++) {
    float* row = s + r * kTile;
    if (r >= rt.rows) {
      std::fill(row, row + cols, kNegInf);
      continue;
    }
    const int32_t allowed_end = std::clamp(rt.limit[r] - j0, 0, count);
    const int64_t mask_row = rt.b * p.mask_stride_b + rt.h[r] * p.mask_stride_h +
                             static_cast<int64_t>(rt.i[r]) * p.mask_stride_q;
    for (int32_t c = 0; c < cols; c++) {
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
      float score = row[c];
      if (capped) {
        const float t = std::tanh(score / cap);  // as the forward: 1/cap may overflow
        tanh_r[r * kTile + c] = t;
        score = cap * t;
      }
      row[c] = score + bias;
    }
  }

  const v128_t zero = wasm_f32x4_splat(0.0f);
  for (int r = 0; r < kQueryTile; r++) {
    float* s_row = s + r * kTile;
    float* dp_row = dp + r * kTile;
    // A row with no keys (padding, or lse = -inf) has only -inf scores: shift by 0, not by
    // -inf (-inf - -inf would be NaN).
    const float lse = r < rt.rows && rt.limit[r] > 0 ? rt.lse[r] : 0.0f;
    const v128_t vlse = wasm_f32x4_splat(lse), vdelta = wasm_f32x4_splat(r < rt.rows ? rt.delta[r] : 0.0f);
    for (int32_t c = 0; c < cols; c += 4) {
      // p = exp(min(s - lse, 0)): exactly 0 for s = -inf.
      const v128_t x = wasm_f32x4_pmin(wasm_f32x4_sub(wasm_v128_load(s_row + c), vlse), zero);
      const v128_t prob = exp_nonpositive(x, ec);
      v128_t ds = wasm_f32x4_mul(prob, wasm_f32x4_sub(wasm_v128_load(dp_row + c), vdelta));
      // ds := 0 where p == 0 (and p·NaN would be NaN).
      ds = wasm_v128_andnot(ds, wasm_f32x4_eq(prob, zero));
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

// acc[j][0 .. dim) += Σ_{r < 4} w[r][j] · x[r][0 .. dim) for j < count (w rows kTile apart,
// x rows dim apart): dV += pᵀ·dO and dK += dsᵀ·(scale·Q). Padding rows have w = 0 and x = 0.
void accumulate_transposed(const float* w, const float* x, int32_t dim, int32_t count, float* acc) {
  const int32_t d4 = dim & ~3;
  for (int32_t j = 0; j < count; j++) {
    const float w0 = w[j], w1 = w[kTile + j], w2 = w[2 * kTile + j], w3 = w[3 * kTile + j];
    if (w0 == 0.0f && w1 == 0.0f && w2 == 0.0f && w3 == 0.0f) continue;  // e.g. a blocked key
    const v128_t v0 = wasm_f32x4_splat(w0), v1 = wasm_f32x4_splat(w1);
    const v128_t v2 = wasm_f32x4_splat(w2), v3 = wasm_f32x4_splat(w3);
    float* a = acc + static_cast<size_t>(j) * dim;
    for (int32_t d = 0; d < d4; d += 4) {
      v128_t sum = wasm_v128_load(a + d);
      sum = f32x4_madd(v0, wasm_v128_load(x + d), sum);
      sum = f32x4_madd(v1, wasm_v128_load(x + dim + d), sum);
      sum = f32x4_madd(v2, wasm_v128_load(x + 2 * dim + d), sum);
      sum = f32x4_madd(v3, wasm_v128_load(x + 3 * dim + d), sum);
      wasm_v128_store(a + d, sum);
    }
    for (int32_t d = d4; d < dim; d++) {
      a[d] = a[d] + w0 * x[d] + w1 * x[dim + d] + w2 * x[2 * dim + d] + w3 * x[3 * dim + d];
    }
  }
}

// acc[r][col .. col + 4·kVecs) += Σ_{j < count} ds[r][j] · K[j][col ..] for r < 4 (K rows
// k_stride apart, read in place): dq += ds·K. Keys j < open are open for every row and are
// multiplied unconditionally; from open on a row skips keys whose ds is exactly 0 (blocked:
// K there may be NaN padding). 4 rows × 8 columns = 8 accumulators at most.
template <int kVecs>
void dq_block(const float* ds, const float* key, int64_t k_stride, int32_t open, int32_t count, float* acc,
              int32_t acc_stride) {
  v128_t o[kQueryTile][kVecs];
  for (int r = 0; r < kQueryTile; r++) {
    for (int v = 0; v < kVecs; v++) o[r][v] = wasm_v128_load(acc + r * acc_stride + 4 * v);
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
    for (int v = 0; v < kVecs; v++) wasm_v128_store(acc + r * acc_stride + 4 * v, o[r][v]);
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
      float a = acc[r * head_dim + col];
      for (int32_t j = 0; j < count; j++) {
        const float wr = ds[r * kTile + j];
        if (j >= open && wr == 0.0f) continue;
        a += wr * key[j * k_stride + col];
      }
      acc[r * head_dim + col] = a;
    }
  }
}

// Scratch of one kernel call, in floats:
//   k_packed  [keys/8][E][8], v_packed [keys/8][Ev][8]   keys: one tile (dK/dV kernel), or
//                                                        round_up(Lk, tile) (dQ kernel)
//   q_rows [4][E], q_cols [E][4], go_rows [4][Ev], go_cols [Ev][4]
//   s, dp, tanh_r [4][kTile]
//   dk_acc [kTile][E], dv_acc [kTile][Ev]   (dK/dV kernel)  |  dq_acc [4][E]  (dQ kernel)
struct Scratch {
  float *k_packed, *v_packed, *q_rows, *q_cols, *go_rows, *go_cols, *s, *dp, *tanh_r, *acc0, *acc1;
  RowOperands operands() const { return {q_rows, q_cols, go_rows, go_cols}; }
};

uint64_t layout(const BackwardProblem& bp, bool dq_kernel, float* base, Scratch* out) {
  const Problem& p = bp.forward;
  const uint64_t E = p.head_dim, Ev = p.value_dim;
  const uint64_t keys = dq_kernel ? static_cast<uint64_t>(round_up(p.kv_len, kTile)) : kTile;
  const uint64_t sizes[11] = {keys * E, keys * Ev, 4 * E, 4 * E, 4 * Ev, 4 * Ev, 4 * kTile, 4 * kTile,
                              4 * kTile, dq_kernel ? 4 * E : kTile * E, dq_kernel ? 0 : kTile * Ev};
  float* parts[11];
  const uint64_t total = carve(base, sizes, parts);
  if (out != nullptr) {
    *out = Scratch{parts[0], parts[1], parts[2], parts[3], parts[4], parts[5],
                   parts[6], parts[7], parts[8], parts[9], parts[10]};
  }
  return total;
}

}  // namespace

void sdpa_f32_bwd_delta(const BackwardProblem& bp, int32_t b, int32_t h, float* delta) {
  const Problem& p = bp.forward;
  for (int32_t i = 0; i < p.q_len; i++) {
    const float* o = p.output + b * p.o_stride_b + h * p.o_stride_h + static_cast<int64_t>(i) * p.o_stride_l;
    const float* go = bp.grad_output + b * bp.go_stride_b + h * bp.go_stride_h + static_cast<int64_t>(i) * bp.go_stride_l;
    float sum = 0.0f;
    for (int32_t c = 0; c < p.value_dim; c++) sum += o[c] * go[c];
    delta[i] = sum;
  }
}

uint64_t sdpa_f32_bwd_dkdv_4x64__wasmsimd_scratch(const BackwardProblem& p) { return layout(p, false, nullptr, nullptr); }

uint64_t sdpa_f32_bwd_dq_4x64__wasmsimd_scratch(const BackwardProblem& p) { return layout(p, true, nullptr, nullptr); }

void sdpa_f32_bwd_dkdv_ukernel_4x64__wasmsimd(const BackwardProblem& bp, int32_t b, int32_t kv_head,
                                              int32_t key_begin, const float* delta, float* scratch_base) {
  const Problem& p = bp.forward;
  assert(p.kv_type == KvType::kFloat32);
  assert(key_begin >= 0 && key_begin < p.kv_len && key_begin % kTile == 0);
  const int32_t E = p.head_dim, Ev = p.value_dim;
  const int32_t count = std::min(kTile, p.kv_len - key_begin);
  Scratch s;
  layout(bp, false, scratch_base, &s);
  const ExpConstants ec = make_exp_constants();
  const float* key = static_cast<const float*>(p.key) + b * p.k_stride_b + kv_head * p.k_stride_h +
                     static_cast<int64_t>(key_begin) * p.k_stride_l;
  const float* value = static_cast<const float*>(p.value) + b * p.v_stride_b + kv_head * p.v_stride_h +
                       static_cast<int64_t>(key_begin) * p.v_stride_l;
  std::fill(s.acc0, s.acc0 + kTile * E, 0.0f);
  std::fill(s.acc1, s.acc1 + kTile * Ev, 0.0f);

  const int32_t rows = p.q_heads / p.kv_heads * p.q_len;
  // Keys of the block some row may attend: those are packed (the others may hold padding).
  int32_t packed_keys = 0;
  for (int32_t f0 = 0; f0 < rows; f0 += kQueryTile) {
    const RowTile rt = make_row_tile(bp, b, kv_head, f0, rows, delta);
    packed_keys = std::max(packed_keys, std::clamp(rt.keys_end - key_begin, 0, count));
  }
  if (packed_keys > 0) {
    pack_rows(key, p.k_stride_l, packed_keys, E, s.k_packed);
    pack_rows(value, p.v_stride_l, packed_keys, Ev, s.v_packed);
    for (int32_t f0 = 0; f0 < rows; f0 += kQueryTile) {
      const RowTile rt = make_row_tile(bp, b, kv_head, f0, rows, delta);
      const int32_t tile_keys = std::clamp(rt.keys_end - key_begin, 0, packed_keys);
      if (tile_keys == 0) continue;  // no row of the tile attends a key of the block
      load_row_operands(bp, rt, s.operands());
      probabilities_and_ds(bp, rt, s.operands(), s.k_packed, s.v_packed, key_begin, tile_keys, s.s, s.dp,
                           s.tanh_r, ec);
      accumulate_transposed(s.s, s.go_rows, Ev, tile_keys, s.acc1);   // dV += pᵀ·dO
      accumulate_transposed(s.dp, s.q_rows, E, tile_keys, s.acc0);    // dK += dsᵀ·(scale·Q)
    }
  }
  for (int32_t j = 0; j < count; j++) {
    const int64_t key_row = static_cast<int64_t>(key_begin + j);
    std::memcpy(bp.d_key + b * bp.dk_stride_b + kv_head * bp.dk_stride_h + key_row * bp.dk_stride_l,
                s.acc0 + static_cast<size_t>(j) * E, sizeof(float) * E);
    std::memcpy(bp.d_value + b * bp.dv_stride_b + kv_head * bp.dv_stride_h + key_row * bp.dv_stride_l,
                s.acc1 + static_cast<size_t>(j) * Ev, sizeof(float) * Ev);
  }
}

void sdpa_f32_bwd_dq_ukernel_4x64__wasmsimd(const BackwardProblem& bp, int32_t b, int32_t kv_head,
                                            int32_t row_begin, int32_t row_end, const float* delta,
                                            float* scratch_base) {
  const Problem& p = bp.forward;
  assert(p.kv_type == KvType::kFloat32);
  const int32_t E = p.head_dim, Ev = p.value_dim;
  Scratch s;
  layout(bp, true, scratch_base, &s);
  const ExpConstants ec = make_exp_constants();
  const float* key = static_cast<const float*>(p.key) + b * p.k_stride_b + kv_head * p.k_stride_h;
  const float* value = static_cast<const float*>(p.value) + b * p.v_stride_b + kv_head * p.v_stride_h;

  int32_t packed_keys = 0;
  for (int32_t f0 = row_begin; f0 < row_end; f0 += kQueryTile) {
    packed_keys = std::max(packed_keys, make_row_tile(bp, b, kv_head, f0, row_end, delta).keys_end);
  }
  pack_rows(key, p.k_stride_l, packed_keys, E, s.k_packed);
  pack_rows(value, p.v_stride_l, packed_keys, Ev, s.v_packed);

  for (int32_t f0 = row_begin; f0 < row_end; f0 += kQueryTile) {
    const RowTile rt = make_row_tile(bp, b, kv_head, f0, row_end, delta);
    std::fill(s.acc0, s.acc0 + kQueryTile * E, 0.0f);
    if (rt.keys_end > 0) load_row_operands(bp, rt, s.operands());
    for (int32_t j0 = 0; j0 < rt.keys_end; j0 += kTile) {
      const int32_t count = std::min(kTile, rt.keys_end - j0);
      const int32_t open = probabilities_and_ds(bp, rt, s.operands(), s.k_packed + static_cast<size_t>(j0) * E,
                                                s.v_packed + static_cast<size_t>(j0) * Ev, j0, count, s.s, s.dp,
                                                s.tanh_r, ec);
      accumulate_dq(s.dp, key + static_cast<int64_t>(j0) * p.k_stride_l, p.k_stride_l, E, std::min(open, count),
                    count, s.acc0);
    }
    for (int r = 0; r < rt.rows; r++) {
      float* dst = bp.d_query + b * bp.dq_stride_b + rt.h[r] * bp.dq_stride_h +
                   static_cast<int64_t>(rt.i[r]) * bp.dq_stride_l;
      const float* acc = s.acc0 + r * E;
      for (int32_t d = 0; d < E; d++) dst[d] = acc[d] * p.scale;
    }
  }
}

}  // namespace sdpa
