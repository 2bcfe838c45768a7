// ALiBi biases (Press et al., "Train Short, Test Long"; FlashAttention's alibi_slopes, llama.cpp's
// max_bias), as every kernel and the contract (src/sdpa.h) compute them. Key j of query row i
// of head h, batch b gets
//   alibi = -(slope · |position - j|),   position = i + offset (the row's causal diagonal)
// with slope = p.alibi_slopes[b·alibi_stride_b + h] in [0, kMaxAlibiSlope]. The distance
// d = |position - j| is an integer below 2^32, converted to float once (exact below 2^24, else
// rounded to nearest), then multiplied by the slope in float and negated: the bias is finite
// (kMaxAlibiSlope · 2^32 < FLT_MAX), so it never blocks a key. The forward and the backward
// kernels add it to the mask's value the same way (bias = mask + alibi, then s + bias), so they
// compute the same scores bit for bit.
#pragma once

#include <cstdint>

#include "sdpa.h"
#include "simd/f32x4.h"

namespace sdpa {

// The slope and the diagonal of one query row: alibi(j) = -(slope · |position - j|).
struct AlibiRow {
  float slope;
  int64_t position;
};

inline int64_t alibi_offset(const Problem& p, int32_t b) {
  return p.causal_offsets != nullptr ? p.causal_offsets[b] : p.causal_offset;
}

inline AlibiRow alibi_row(const Problem& p, int32_t b, int32_t h, int32_t i) {
  return {p.alibi_slopes[b * p.alibi_stride_b + h], i + alibi_offset(p, b)};
}

inline float alibi_bias(const AlibiRow& row, int64_t j) {
  const int64_t d = row.position - j;
  return -(row.slope * static_cast<float>(d < 0 ? -d : d));
}

// bias_row[c] += alibi(j0 + c) for c in [begin, end). Where every distance of the run is below
// 2^24 (the usual case), four columns at a time: |position - j0 - c| as float(position - j0)
// minus float(c), both exact integers, as is their difference; the same values as alibi_bias.
inline void add_alibi(const AlibiRow& row, int64_t j0, int32_t begin, int32_t end, float* bias_row) {
  constexpr int64_t kExact = int64_t{1} << 24;
  const int64_t base = row.position - j0;  // the distance of column 0, before |·|
  int32_t c = begin;
  if (base - end > -kExact && base < kExact) {  // |base| and every |base - c| below 2^24
    const v128_t base_v = wasm_f32x4_splat(static_cast<float>(base));
    const v128_t slope = wasm_f32x4_splat(row.slope);
    v128_t col = wasm_f32x4_make(static_cast<float>(c), static_cast<float>(c + 1), static_cast<float>(c + 2),
                                 static_cast<float>(c + 3));
    const v128_t four = wasm_f32x4_splat(4.0f);
    for (; c + 4 <= end; c += 4, col = wasm_f32x4_add(col, four)) {
      const v128_t distance = wasm_f32x4_abs(wasm_f32x4_sub(base_v, col));
      const v128_t alibi = wasm_f32x4_neg(wasm_f32x4_mul(slope, distance));
      wasm_v128_store(bias_row + c, wasm_f32x4_add(wasm_v128_load(bias_row + c), alibi));
    }
  }
  for (; c < end; c++) bias_row[c] += alibi_bias(row, j0 + c);
}

}  // namespace sdpa
