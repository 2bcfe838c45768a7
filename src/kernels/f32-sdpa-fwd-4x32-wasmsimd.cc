// Blocked online-softmax attention forward (FlashAttention style), 128-bit wasm SIMD.
// Tiles: 4 query rows × 32 keys (src/tiles.h). Never materialises the [Lq, Lk] scores.
//
// Online softmax, for one query row over key tiles t = 1, 2, …:
//   m_t = max(m_{t-1}, max_j s_j)                running maximum (m_0 = -inf)
//   α_t = exp(m_{t-1} - m_t)                     rescale of what was summed so far
//   l_t = α_t·l_{t-1} + Σ_j exp(s_j - m_t)       running sum of the softmax denominator
//   o_t = α_t·o_{t-1} + Σ_j exp(s_j - m_t)·v_j   unnormalised output row
// and finally out = o / l, or exact zeros when l == 0 (every key of the row was blocked).
// Every exponent is s - m <= 0, so exp never overflows whatever the logits' magnitude.
//
// Blocked keys never reach the arithmetic as values: causal and key-length limits are loop
// bounds (per row: keys j < limit[r]); K/V are packed only up to the furthest key any row
// may see; tiles whose keys are all blocked are skipped; and inside a partly blocked tile
// a blocked key's probability is exactly 0 and its V row is skipped, not multiplied by 0,
// so NaN or garbage in padding cannot leak into the output.
#include "kernels/sdpa-kernels.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#include "math/f32-vexp-nonpositive-rr2-p6-wasmsimd.h"
#include "simd/f32x4.h"
#include "tiles.h"

namespace sdpa {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Scratch layout, in floats, for one (batch, KV head); every part starts 16-byte aligned.
//   packed_key   [round_up(Lk, kKeyTile) / 4][E][4]  key j, dim d at ((j/4)·E + d)·4 + j%4
//   packed_value [Lk][Ev8]                           Ev8 = round_up(Ev, kValueBlock)
//   q_tile       [4][E]                              scale·q of the tile's rows, 0 past Lq
//   scores       [4][kKeyTile]                       scores, then probabilities, of one tile
//   bias         [4][kKeyTile]                       0, mask value, or -inf (blocked)
//   acc          [4][Ev8]                            unnormalised output rows o
struct Scratch {
  float* packed_key;
  float* packed_value;
  float* q_tile;
  float* scores;
  float* bias;
  float* acc;
};

size_t align4(size_t n) { return (n + 3) / 4 * 4; }

size_t layout(const Problem& p, float* base, Scratch* s) {
  const size_t key_rows = static_cast<size_t>(round_up(p.kv_len, kKeyTile));
  const size_t ev8 = static_cast<size_t>(round_up(p.value_dim, kValueBlock));
  const size_t sizes[6] = {
      key_rows * p.head_dim,          static_cast<size_t>(p.kv_len) * ev8,
      align4(kQueryTile * static_cast<size_t>(p.head_dim)), kQueryTile * kKeyTile,
      kQueryTile * kKeyTile,          kQueryTile * ev8};
  float** parts[6] = {&s->packed_key, &s->packed_value, &s->q_tile,
                      &s->scores,     &s->bias,         &s->acc};
  size_t offset = 0;
  for (int i = 0; i < 6; i++) {
    if (base != nullptr) *parts[i] = base + offset;
    offset += align4(sizes[i]);
  }
  return offset;
}

// The additive bias and the blocked keys of one tile, for the rows of the query tile.
enum class TileKind {
  kAllBlocked,  // no row may attend any key of the tile: skip it
  kPartial,     // some entries blocked or biased: bias[] holds the tile's bias
  kClean,       // every row attends every key, no mask: bias[] unused
};

struct TileBias {
  TileKind kind;
  // Columns [0, open_cols) are blocked for no row: P·V may multiply them unconditionally.
  // Blocked entries only occur from open_cols on (a causal diagonal or a key-length edge
  // leaves at most a few such columns; a mask with -inf can leave many).
  int32_t open_cols;
};

struct RowTile {
  int32_t b, h, i0;        // batch, query head, first query row of the tile
  int32_t limit[kQueryTile];  // row r may attend keys j < limit[r] (0 for rows past Lq)
};

TileBias build_bias(const Problem& p, const RowTile& rt, int32_t j0, float* bias) {
  bool clean = p.mask_kind == MaskKind::kNone;
  for (int r = 0; r < kQueryTile; r++) clean = clean && rt.limit[r] >= j0 + kKeyTile;
  if (clean) return {TileKind::kClean, kKeyTile};

  bool any_allowed = false;
  int32_t open_cols = kKeyTile;
  for (int r = 0; r < kQueryTile; r++) {
    float* bias_row = bias + r * kKeyTile;
    const int32_t allowed_end = std::clamp(rt.limit[r] - j0, 0, kKeyTile);
    const int64_t mask_row = rt.b * p.mask_stride_b + rt.h * p.mask_stride_h +
                             static_cast<int64_t>(rt.i0 + r) * p.mask_stride_q;
    for (int c = 0; c < allowed_end; c++) {
      const int64_t at = mask_row + static_cast<int64_t>(j0 + c) * p.mask_stride_k;
      float value = 0.0f;
      if (p.mask_kind == MaskKind::kFloat) {
        value = static_cast<const float*>(p.mask)[at];
      } else if (p.mask_kind == MaskKind::kBool) {
        value = static_cast<const uint8_t*>(p.mask)[at] != 0 ? 0.0f : kNegInf;
      }
      bias_row[c] = value;
      if (value == kNegInf) {
        open_cols = std::min(open_cols, c);
      } else {
        any_allowed = true;
      }
    }
    for (int c = allowed_end; c < kKeyTile; c++) bias_row[c] = kNegInf;
    open_cols = std::min(open_cols, allowed_end);
  }
  return {any_allowed ? TileKind::kPartial : TileKind::kAllBlocked, open_cols};
}

// scores[4][32] = q_tile[4][E] · K[j0 .. j0+32)ᵀ, K packed [groups][E][4].
// 4 rows × 8 keys per pass: 8 accumulators, 2 key loads and 4 broadcasts per dim.
void score_tile(const float* q_tile, const float* packed_key_tile, int32_t head_dim,
                float* scores) {
  for (int g = 0; g < kKeyTile; g += 2 * kKeyGroup) {
    const float* k0 = packed_key_tile + static_cast<size_t>(g) * head_dim;
    const float* k1 = k0 + static_cast<size_t>(kKeyGroup) * head_dim;
    v128_t acc0x0123 = wasm_f32x4_splat(0.0f), acc0x4567 = acc0x0123;
    v128_t acc1x0123 = acc0x0123, acc1x4567 = acc0x0123;
    v128_t acc2x0123 = acc0x0123, acc2x4567 = acc0x0123;
    v128_t acc3x0123 = acc0x0123, acc3x4567 = acc0x0123;
    const float* q0 = q_tile;
    const float* q1 = q0 + head_dim;
    const float* q2 = q1 + head_dim;
    const float* q3 = q2 + head_dim;
#pragma clang loop unroll(disable)
    for (int32_t d = 0; d < head_dim; d++) {
      const v128_t k0123 = wasm_v128_load(k0 + 4 * d);
      const v128_t k4567 = wasm_v128_load(k1 + 4 * d);
      const v128_t vq0 = wasm_v128_load32_splat(q0 + d);
      acc0x0123 = wasm_f32x4_add(acc0x0123, wasm_f32x4_mul(vq0, k0123));
      acc0x4567 = wasm_f32x4_add(acc0x4567, wasm_f32x4_mul(vq0, k4567));
      const v128_t vq1 = wasm_v128_load32_splat(q1 + d);
      acc1x0123 = wasm_f32x4_add(acc1x0123, wasm_f32x4_mul(vq1, k0123));
      acc1x4567 = wasm_f32x4_add(acc1x4567, wasm_f32x4_mul(vq1, k4567));
      const v128_t vq2 = wasm_v128_load32_splat(q2 + d);
      acc2x0123 = wasm_f32x4_add(acc2x0123, wasm_f32x4_mul(vq2, k0123));
      acc2x4567 = wasm_f32x4_add(acc2x4567, wasm_f32x4_mul(vq2, k4567));
      const v128_t vq3 = wasm_v128_load32_splat(q3 + d);
      acc3x0123 = wasm_f32x4_add(acc3x0123, wasm_f32x4_mul(vq3, k0123));
      acc3x4567 = wasm_f32x4_add(acc3x4567, wasm_f32x4_mul(vq3, k4567));
    }
    wasm_v128_store(scores + 0 * kKeyTile + g, acc0x0123);
    wasm_v128_store(scores + 0 * kKeyTile + g + 4, acc0x4567);
    wasm_v128_store(scores + 1 * kKeyTile + g, acc1x0123);
    wasm_v128_store(scores + 1 * kKeyTile + g + 4, acc1x4567);
    wasm_v128_store(scores + 2 * kKeyTile + g, acc2x0123);
    wasm_v128_store(scores + 2 * kKeyTile + g + 4, acc2x4567);
    wasm_v128_store(scores + 3 * kKeyTile + g, acc3x0123);
    wasm_v128_store(scores + 3 * kKeyTile + g + 4, acc3x4567);
  }
}

// Softcap and bias in the order of the contract: s = softcap·tanh(s/softcap), then
// s = s + bias, where a -inf bias replaces s by -inf (so a NaN score of a blocked key,
// from NaN in padding, becomes -inf instead of staying NaN).
void finish_scores(const Problem& p, TileKind kind, const float* bias, float* scores) {
  if (p.softcap > 0.0f) {
    const float cap = p.softcap, inv_cap = 1.0f / p.softcap;
    for (int e = 0; e < kQueryTile * kKeyTile; e++) scores[e] = cap * std::tanh(scores[e] * inv_cap);
  }
  if (kind != TileKind::kPartial) return;
  const v128_t neg_inf = wasm_f32x4_splat(kNegInf);
  for (int e = 0; e < kQueryTile * kKeyTile; e += 4) {
    const v128_t b = wasm_v128_load(bias + e);
    const v128_t s = wasm_f32x4_add(wasm_v128_load(scores + e), b);
    wasm_v128_store(scores + e, wasm_v128_bitselect(neg_inf, s, wasm_f32x4_eq(b, neg_inf)));
  }
}

float hmax(v128_t v) {
  const float a = std::max(wasm_f32x4_extract_lane(v, 0), wasm_f32x4_extract_lane(v, 1));
  const float b = std::max(wasm_f32x4_extract_lane(v, 2), wasm_f32x4_extract_lane(v, 3));
  return std::max(a, b);
}

float hsum(v128_t v) {
  return (wasm_f32x4_extract_lane(v, 0) + wasm_f32x4_extract_lane(v, 1)) +
         (wasm_f32x4_extract_lane(v, 2) + wasm_f32x4_extract_lane(v, 3));
}

// Per-row maxima of one score tile, as one 4-lane vector (lane r = row r).
v128_t tile_row_max(const float* scores) {
  float row_max[kQueryTile];
  for (int r = 0; r < kQueryTile; r++) {
    const float* s = scores + r * kKeyTile;
    v128_t m = wasm_v128_load(s);
    for (int c = 4; c < kKeyTile; c += 4) m = wasm_f32x4_pmax(m, wasm_v128_load(s + c));
    row_max[r] = hmax(m);
  }
  return wasm_v128_load(row_max);
}

// scores := exp(scores - max[r]) in place, returning the per-row sums as one vector.
// `shift` lane r is the row's running maximum, or 0 when that maximum is still -inf (no key
// attended yet): then every score of the row is -inf too and exp(-inf - 0) = 0, where
// -inf - (-inf) would be NaN.
v128_t exponentiate_tile(float* scores, v128_t shift, const ExpConstants& ec) {
  float row_sum[kQueryTile];
  for (int r = 0; r < kQueryTile; r++) {
    float* s = scores + r * kKeyTile;
    const v128_t m = wasm_f32x4_splat(wasm_f32x4_extract_lane(shift, 0));
    v128_t sum = wasm_f32x4_splat(0.0f);
    for (int c = 0; c < kKeyTile; c += 4) {
      const v128_t e = exp_nonpositive(wasm_f32x4_sub(wasm_v128_load(s + c), m), ec);
      wasm_v128_store(s + c, e);
      sum = wasm_f32x4_add(sum, e);
    }
    row_sum[r] = hsum(sum);
    shift = wasm_i32x4_shuffle(shift, shift, 1, 2, 3, 0);  // next row's shift to lane 0
  }
  return wasm_v128_load(row_sum);
}

// acc[r][:] = alpha[r]·acc[r][:] + Σ_{j < key_count} probs[r][j]·V[j][:]
// Keys j < open_count are open for every row and are multiplied unconditionally; from
// open_count on, a key whose probability is exactly 0 for a row (blocked, or exp underflow)
// is skipped for that row, not multiplied by 0, so NaN in a blocked V row cannot leak.
void accumulate_pv(const float* probs, const float* packed_value_tile, int32_t open_count,
                   int32_t key_count, int32_t ev8, v128_t alpha, float* acc) {
  const v128_t a0 = wasm_i32x4_shuffle(alpha, alpha, 0, 0, 0, 0);
  const v128_t a1 = wasm_i32x4_shuffle(alpha, alpha, 1, 1, 1, 1);
  const v128_t a2 = wasm_i32x4_shuffle(alpha, alpha, 2, 2, 2, 2);
  const v128_t a3 = wasm_i32x4_shuffle(alpha, alpha, 3, 3, 3, 3);
  const float* p0 = probs;
  const float* p1 = p0 + kKeyTile;
  const float* p2 = p1 + kKeyTile;
  const float* p3 = p2 + kKeyTile;
  for (int32_t col = 0; col < ev8; col += kValueBlock) {
    float* o0 = acc + col;
    float* o1 = o0 + ev8;
    float* o2 = o1 + ev8;
    float* o3 = o2 + ev8;
    v128_t acc0x0123 = wasm_f32x4_mul(wasm_v128_load(o0), a0);
    v128_t acc0x4567 = wasm_f32x4_mul(wasm_v128_load(o0 + 4), a0);
    v128_t acc1x0123 = wasm_f32x4_mul(wasm_v128_load(o1), a1);
    v128_t acc1x4567 = wasm_f32x4_mul(wasm_v128_load(o1 + 4), a1);
    v128_t acc2x0123 = wasm_f32x4_mul(wasm_v128_load(o2), a2);
    v128_t acc2x4567 = wasm_f32x4_mul(wasm_v128_load(o2 + 4), a2);
    v128_t acc3x0123 = wasm_f32x4_mul(wasm_v128_load(o3), a3);
    v128_t acc3x4567 = wasm_f32x4_mul(wasm_v128_load(o3 + 4), a3);
    const float* v = packed_value_tile + col;
#pragma clang loop unroll(disable)
    for (int32_t j = 0; j < open_count; j++) {
      const v128_t v0123 = wasm_v128_load(v + static_cast<size_t>(j) * ev8);
      const v128_t v4567 = wasm_v128_load(v + static_cast<size_t>(j) * ev8 + 4);
      const v128_t vp0 = wasm_v128_load32_splat(p0 + j);
      acc0x0123 = wasm_f32x4_add(acc0x0123, wasm_f32x4_mul(vp0, v0123));
      acc0x4567 = wasm_f32x4_add(acc0x4567, wasm_f32x4_mul(vp0, v4567));
      const v128_t vp1 = wasm_v128_load32_splat(p1 + j);
      acc1x0123 = wasm_f32x4_add(acc1x0123, wasm_f32x4_mul(vp1, v0123));
      acc1x4567 = wasm_f32x4_add(acc1x4567, wasm_f32x4_mul(vp1, v4567));
      const v128_t vp2 = wasm_v128_load32_splat(p2 + j);
      acc2x0123 = wasm_f32x4_add(acc2x0123, wasm_f32x4_mul(vp2, v0123));
      acc2x4567 = wasm_f32x4_add(acc2x4567, wasm_f32x4_mul(vp2, v4567));
      const v128_t vp3 = wasm_v128_load32_splat(p3 + j);
      acc3x0123 = wasm_f32x4_add(acc3x0123, wasm_f32x4_mul(vp3, v0123));
      acc3x4567 = wasm_f32x4_add(acc3x4567, wasm_f32x4_mul(vp3, v4567));
    }
    for (int32_t j = open_count; j < key_count; j++) {
      const v128_t v0123 = wasm_v128_load(v + static_cast<size_t>(j) * ev8);
      const v128_t v4567 = wasm_v128_load(v + static_cast<size_t>(j) * ev8 + 4);
      if (p0[j] != 0.0f) {
        const v128_t vp = wasm_f32x4_splat(p0[j]);
        acc0x0123 = wasm_f32x4_add(acc0x0123, wasm_f32x4_mul(vp, v0123));
        acc0x4567 = wasm_f32x4_add(acc0x4567, wasm_f32x4_mul(vp, v4567));
      }
      if (p1[j] != 0.0f) {
        const v128_t vp = wasm_f32x4_splat(p1[j]);
        acc1x0123 = wasm_f32x4_add(acc1x0123, wasm_f32x4_mul(vp, v0123));
        acc1x4567 = wasm_f32x4_add(acc1x4567, wasm_f32x4_mul(vp, v4567));
      }
      if (p2[j] != 0.0f) {
        const v128_t vp = wasm_f32x4_splat(p2[j]);
        acc2x0123 = wasm_f32x4_add(acc2x0123, wasm_f32x4_mul(vp, v0123));
        acc2x4567 = wasm_f32x4_add(acc2x4567, wasm_f32x4_mul(vp, v4567));
      }
      if (p3[j] != 0.0f) {
        const v128_t vp = wasm_f32x4_splat(p3[j]);
        acc3x0123 = wasm_f32x4_add(acc3x0123, wasm_f32x4_mul(vp, v0123));
        acc3x4567 = wasm_f32x4_add(acc3x4567, wasm_f32x4_mul(vp, v4567));
      }
    }
    wasm_v128_store(o0, acc0x0123);
    wasm_v128_store(o0 + 4, acc0x4567);
    wasm_v128_store(o1, acc1x0123);
    wasm_v128_store(o1 + 4, acc1x4567);
    wasm_v128_store(o2, acc2x0123);
    wasm_v128_store(o2 + 4, acc2x4567);
    wasm_v128_store(o3, acc3x0123);
    wasm_v128_store(o3 + 4, acc3x4567);
  }
}

// K of one (batch, KV head), keys [0, key_count), into [groups][E][4]; zeros up to the
// end of the last key tile, so score_tile may always read whole tiles.
void pack_key(const float* key, int64_t stride_l, int32_t key_count, int32_t head_dim,
              float* packed) {
  const int32_t padded = round_up(key_count, kKeyTile);
  for (int32_t j = 0; j < padded; j++) {
    float* dst = packed + (static_cast<size_t>(j / kKeyGroup) * head_dim) * kKeyGroup + j % kKeyGroup;
    if (j < key_count) {
      const float* src = key + j * stride_l;
      for (int32_t d = 0; d < head_dim; d++) dst[d * kKeyGroup] = src[d];
    } else {
      for (int32_t d = 0; d < head_dim; d++) dst[d * kKeyGroup] = 0.0f;
    }
  }
}

// V of one (batch, KV head), keys [0, key_count), into [key_count][Ev8], zero columns
// past Ev.
void pack_value(const float* value, int64_t stride_l, int32_t key_count, int32_t value_dim,
                int32_t ev8, float* packed) {
  for (int32_t j = 0; j < key_count; j++) {
    float* dst = packed + static_cast<size_t>(j) * ev8;
    std::memcpy(dst, value + j * stride_l, sizeof(float) * value_dim);
    std::fill(dst + value_dim, dst + ev8, 0.0f);
  }
}

}  // namespace

size_t sdpa_f32_fwd_4x32__wasmsimd_scratch(const Problem& p) {
  Scratch unused;
  return layout(p, nullptr, &unused) + 4;  // + 4: room to align the base to 16 bytes
}

void sdpa_f32_fwd_ukernel_4x32__wasmsimd(const Problem& p, int32_t b, int32_t kv_head,
                                         int32_t q_begin, int32_t q_end, float* scratch_base) {
  assert(p.head_dim >= 1 && p.value_dim >= 1 && p.q_len >= 1 && p.kv_len >= 1);
  assert(p.q_heads % p.kv_heads == 0);
  assert(b >= 0 && b < p.batch && kv_head >= 0 && kv_head < p.kv_heads);
  assert(0 <= q_begin && q_begin < q_end && q_end <= p.q_len);
  assert(scratch_base != nullptr);

  Scratch s;
  layout(p, reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch_base) + 15) & ~uintptr_t{15}),
         &s);
  const int32_t E = p.head_dim, Ev = p.value_dim, Lq = p.q_len;  // Lq: the weights' row count
  const int32_t ev8 = round_up(Ev, kValueBlock);
  const ExpConstants ec = make_exp_constants();

  // Keys this batch may attend at all: j < valid_keys (padding past key_lengths[b]).
  const int32_t valid_keys = p.key_lengths != nullptr ? p.key_lengths[b] : p.kv_len;
  assert(valid_keys >= 0 && valid_keys <= p.kv_len);
  const int64_t offset = p.causal_offsets != nullptr ? p.causal_offsets[b] : p.causal_offset;
  // Row i may attend keys j < limit(i) (causal: j <= i + offset), a value in [0, valid_keys].
  auto row_limit = [&](int32_t i) -> int32_t {
    if (i >= q_end) return 0;  // rows of the last tile past q_end: nothing to attend, never written
    if (!p.causal) return valid_keys;
    return static_cast<int32_t>(std::clamp<int64_t>(i + offset + 1, 0, valid_keys));
  };
  // Pack only the keys some row may attend: the causal frontier of the last row.
  // row_limit grows with i, so the last row's limit bounds every row's.
  const int32_t packed_keys = row_limit(q_end - 1);
  pack_key(p.key + b * p.k_stride_b + kv_head * p.k_stride_h, p.k_stride_l, packed_keys, E,
           s.packed_key);
  pack_value(p.value + b * p.v_stride_b + kv_head * p.v_stride_h, p.v_stride_l, packed_keys, Ev,
             ev8, s.packed_value);

  const int32_t group = p.q_heads / p.kv_heads;
  for (int32_t h = kv_head * group; h < (kv_head + 1) * group; h++) {
    const float* q_head = p.query + b * p.q_stride_b + h * p.q_stride_h;
    float* out_head = p.output + b * p.o_stride_b + h * p.o_stride_h;
    for (int32_t i0 = q_begin; i0 < q_end; i0 += kQueryTile) {
      const int32_t rows = std::min(kQueryTile, q_end - i0);
      RowTile rt{b, h, i0, {}};
      int32_t keys_end = 0;  // furthest key any row of the tile may attend
      for (int r = 0; r < kQueryTile; r++) {
        rt.limit[r] = row_limit(i0 + r);
        keys_end = std::max(keys_end, rt.limit[r]);
      }
      // q_tile = scale·q (the scale folded into Q once), zero rows past Lq.
      for (int r = 0; r < kQueryTile; r++) {
        float* dst = s.q_tile + r * E;
        if (r < rows) {
          const float* src = q_head + static_cast<int64_t>(i0 + r) * p.q_stride_l;
          for (int32_t d = 0; d < E; d++) dst[d] = src[d] * p.scale;
        } else {
          std::fill(dst, dst + E, 0.0f);
        }
      }
      std::fill(s.acc, s.acc + kQueryTile * ev8, 0.0f);
      v128_t running_max = wasm_f32x4_splat(kNegInf);  // m, lane r = row r
      v128_t running_sum = wasm_f32x4_splat(0.0f);     // l
      const v128_t neg_inf = running_max;
      const v128_t zero = running_sum;

      for (int32_t j0 = 0; j0 < keys_end; j0 += kKeyTile) {
        const TileBias tile = build_bias(p, rt, j0, s.bias);
        if (tile.kind == TileKind::kAllBlocked) continue;  // m, l, o unchanged
        score_tile(s.q_tile, s.packed_key + static_cast<size_t>(j0) * E, E, s.scores);
        finish_scores(p, tile.kind, s.bias, s.scores);

        const v128_t new_max = wasm_f32x4_pmax(running_max, tile_row_max(s.scores));
        // A row still at -inf has attended nothing: shift by 0 (its scores are all -inf,
        // so its probabilities are exp(-inf) = 0) and keep α = 1 (its o and l are 0).
        const v128_t still_empty = wasm_f32x4_eq(new_max, neg_inf);
        const v128_t shift = wasm_v128_bitselect(zero, new_max, still_empty);
        // α = exp(m_old - m_new) <= 1: 1 when the maximum did not grow, 0 when m_old = -inf.
        const v128_t alpha = wasm_v128_bitselect(
            ec.one, exp_nonpositive(wasm_f32x4_sub(running_max, new_max), ec), still_empty);
        const v128_t tile_sum = exponentiate_tile(s.scores, shift, ec);
        running_sum = wasm_f32x4_add(wasm_f32x4_mul(running_sum, alpha), tile_sum);
        running_max = new_max;

        const int32_t key_count = std::min(kKeyTile, keys_end - j0);
        accumulate_pv(s.scores, s.packed_value + static_cast<size_t>(j0) * ev8,
                      std::min(tile.open_cols, key_count), key_count, ev8, alpha, s.acc);
      }

      // out = o / l; l == 0 means the row attended nothing: exact zeros, not 0/0 = NaN.
      float sums[kQueryTile], inv_sum[kQueryTile];
      wasm_v128_store(sums, running_sum);
      for (int r = 0; r < kQueryTile; r++) inv_sum[r] = sums[r] == 0.0f ? 0.0f : 1.0f / sums[r];
      for (int r = 0; r < rows; r++) {
        float* dst = out_head + static_cast<int64_t>(i0 + r) * p.o_stride_l;
        const float* o = s.acc + r * ev8;
        for (int32_t c = 0; c < Ev; c++) dst[c] = o[c] * inv_sum[r];
      }

      if (p.weights == nullptr) continue;
      // weights[i][j] = exp(s_ij - m_i) / l_i, recomputing the scores tile by tile with the
      // final m and l; zeros for blocked keys, skipped tiles and empty rows.
      const v128_t final_shift =
          wasm_v128_bitselect(zero, running_max, wasm_f32x4_eq(running_max, neg_inf));
      float* w_head = p.weights + (static_cast<int64_t>(b) * p.q_heads + h) * Lq * p.kv_len;
      for (int32_t j0 = 0; j0 < p.kv_len; j0 += kKeyTile) {
        const int32_t cols = std::min(kKeyTile, p.kv_len - j0);
        const TileBias tile =
            j0 < keys_end ? build_bias(p, rt, j0, s.bias) : TileBias{TileKind::kAllBlocked, 0};
        if (tile.kind == TileKind::kAllBlocked) {
          std::fill(s.scores, s.scores + kQueryTile * kKeyTile, 0.0f);
        } else {
          score_tile(s.q_tile, s.packed_key + static_cast<size_t>(j0) * E, E, s.scores);
          finish_scores(p, tile.kind, s.bias, s.scores);
          exponentiate_tile(s.scores, final_shift, ec);
        }
        for (int r = 0; r < rows; r++) {
          float* dst = w_head + static_cast<int64_t>(i0 + r) * p.kv_len + j0;
          const float* src = s.scores + r * kKeyTile;
          for (int32_t c = 0; c < cols; c++) dst[c] = src[c] * inv_sum[r];
        }
      }
    }
  }
}

}  // namespace sdpa
