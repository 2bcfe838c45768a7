// Register-level building blocks shared by the forward and backward attention kernels
// (f32-sdpa-fwd-4x512-wasmsimd.cc, f32-sdpa-bwd-4x64-wasmsimd.cc): 4×4 transposes and
// reductions, the packing of K (and, in the backward, V) into key groups [groups][E][8], and the
// 4-row × 8-key score micro-kernel over them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "simd/f32x4.h"
#include "tiles.h"

namespace sdpa {

// (a[0][0], a[1][0], a[2][0], a[3][0]), …: rows of a become columns.
inline void transpose4x4(v128_t& a0, v128_t& a1, v128_t& a2, v128_t& a3) {
  const v128_t lo01 = wasm_i32x4_shuffle(a0, a1, 0, 4, 1, 5), hi01 = wasm_i32x4_shuffle(a0, a1, 2, 6, 3, 7);
  const v128_t lo23 = wasm_i32x4_shuffle(a2, a3, 0, 4, 1, 5), hi23 = wasm_i32x4_shuffle(a2, a3, 2, 6, 3, 7);
  a0 = wasm_i32x4_shuffle(lo01, lo23, 0, 1, 4, 5);
  a1 = wasm_i32x4_shuffle(lo01, lo23, 2, 3, 6, 7);
  a2 = wasm_i32x4_shuffle(hi01, hi23, 0, 1, 4, 5);
  a3 = wasm_i32x4_shuffle(hi01, hi23, 2, 3, 6, 7);
}

// Lane n = the maximum (kMax) or the sum of the 4 lanes of a_n: a 4×4 transpose-reduce,
// with no scalar extraction.
template <bool kMax>
inline v128_t reduce_4x4(v128_t a0, v128_t a1, v128_t a2, v128_t a3) {
  auto op = [](v128_t x, v128_t y) { return kMax ? wasm_f32x4_pmax(x, y) : wasm_f32x4_add(x, y); };
  // (a0: lanes 0·2, a1: 0·2, a0: 1·3, a1: 1·3), and the same for a2, a3.
  const v128_t r01 = op(wasm_i32x4_shuffle(a0, a1, 0, 4, 1, 5), wasm_i32x4_shuffle(a0, a1, 2, 6, 3, 7));
  const v128_t r23 = op(wasm_i32x4_shuffle(a2, a3, 0, 4, 1, 5), wasm_i32x4_shuffle(a2, a3, 2, 6, 3, 7));
  return op(wasm_i32x4_shuffle(r01, r23, 0, 1, 4, 5), wasm_i32x4_shuffle(r01, r23, 2, 3, 6, 7));
}

// Float32 elements read as they are: the reader of pack_key_groups (and of the forward kernel's
// loops, whose float16 readers, with the same members, are in f32-sdpa-fwd-4x512-wasmsimd.cc).
// kReadScale: what load4 and scalar return is the element's value times this power of two.
struct F32Elements {
  using Elem = float;
  static constexpr float kReadScale = 1.0f;
  v128_t load4(const float* p) const { return wasm_v128_load(p); }
  float scalar(float x) const { return x; }
};
constexpr F32Elements kF32Elements{};

// Rows [0, count) of a [L, D] operand (rows `stride` elements apart, read by `src`: float16 is
// widened as it is loaded) into key groups [round_up(count, 8)/8][D][8], the B operand of
// score_4x8_packed; zeros in the last group's columns past count (scores are made in whole
// groups). A whole group is 8 rows × D read 4 dims at a time and written as two transposed
// 4×4 blocks per 4 dims (sequential stores; the scalar form scatters every float).
template <typename Src>
void pack_key_groups(const Src& src, const typename Src::Elem* rows, int64_t stride, int32_t count, int32_t dim,
                     float* packed) {
  static_assert(kKeyGroup == 8, "two 4×4 blocks per group");
  const int32_t padded = round_up(count, kKeyGroup);
  const int32_t d4 = dim & ~3;
  for (int32_t j0 = 0; j0 < padded; j0 += kKeyGroup) {
    float* group = packed + static_cast<size_t>(j0) * dim;  // [D][8]
    const int32_t valid = std::clamp(count - j0, 0, kKeyGroup);
    if (valid < kKeyGroup) {  // the last, partial group and the zero padding
      for (int32_t d = 0; d < dim; d++) {
        for (int i = 0; i < kKeyGroup; i++) {
          group[d * kKeyGroup + i] = i < valid ? src.scalar(rows[(j0 + i) * stride + d]) : 0.0f;
        }
      }
      continue;
    }
    using Elem = typename Src::Elem;
    const Elem* r0 = rows + j0 * stride;
    const Elem* r1 = r0 + stride;
    const Elem* r2 = r1 + stride;
    const Elem* r3 = r2 + stride;
    const Elem* r4 = r3 + stride;
    const Elem* r5 = r4 + stride;
    const Elem* r6 = r5 + stride;
    const Elem* r7 = r6 + stride;
    for (int32_t d = 0; d < d4; d += 4) {
      v128_t a0 = src.load4(r0 + d), a1 = src.load4(r1 + d);
      v128_t a2 = src.load4(r2 + d), a3 = src.load4(r3 + d);
      v128_t b0 = src.load4(r4 + d), b1 = src.load4(r5 + d);
      v128_t b2 = src.load4(r6 + d), b3 = src.load4(r7 + d);
      transpose4x4(a0, a1, a2, a3);  // a_t: dim d + t of rows 0..3
      transpose4x4(b0, b1, b2, b3);  // b_t: dim d + t of rows 4..7
      float* dst = group + d * kKeyGroup;
      wasm_v128_store(dst, a0), wasm_v128_store(dst + 4, b0);
      wasm_v128_store(dst + 8, a1), wasm_v128_store(dst + 12, b1);
      wasm_v128_store(dst + 16, a2), wasm_v128_store(dst + 20, b2);
      wasm_v128_store(dst + 24, a3), wasm_v128_store(dst + 28, b3);
    }
    for (int32_t d = d4; d < dim; d++) {
      for (int i = 0; i < kKeyGroup; i++) group[d * kKeyGroup + i] = src.scalar(rows[(j0 + i) * stride + d]);
    }
  }
}

// scores[4][0 .. cols) = A[4][D] · B[0 .. cols)ᵀ, rows kScoreStride floats apart, with A
// interleaved [D][4] (a_cols: a_cols[d·4 + r] = A[r][d]) and B packed [cols/8][D][8]
// (b_packed[(j/8·D + d)·8 + j%8] = B[j][d]), cols a multiple of 8. In the forward pass A is
// scale·Q and B is K (the scores); in the backward pass also dO and V (dP = dO·Vᵀ).
// 4 rows × 8 columns per pass: 8 accumulators; per d 2 loads of B and 4 broadcasts of A, all
// at constant offsets from two pointers stepped by hand (the loads' addresses fold into the
// instructions' offset fields: no address arithmetic in the loop).
template <int kScoreStride>
inline void score_4x8_packed(const float* a_cols, const float* b_packed, int32_t dim, int32_t cols,
                             float* scores) {
  const float* const a_end = a_cols + kQueryTile * dim;
  for (int g = 0; g < cols; g += kKeyGroup) {
    const float* k = b_packed + static_cast<size_t>(g) * dim;
    v128_t acc0x0123 = wasm_f32x4_splat(0.0f), acc0x4567 = acc0x0123;
    v128_t acc1x0123 = acc0x0123, acc1x4567 = acc0x0123;
    v128_t acc2x0123 = acc0x0123, acc2x4567 = acc0x0123;
    v128_t acc3x0123 = acc0x0123, acc3x4567 = acc0x0123;
#pragma clang loop unroll(disable)
    for (const float* q = a_cols; q != a_end; q += kQueryTile, k += kKeyGroup) {
      const v128_t k0123 = wasm_v128_load(k);
      const v128_t k4567 = wasm_v128_load(k + 4);
      const v128_t vq0 = wasm_v128_load32_splat(q);
      acc0x0123 = f32x4_madd(vq0, k0123, acc0x0123);
      acc0x4567 = f32x4_madd(vq0, k4567, acc0x4567);
      const v128_t vq1 = wasm_v128_load32_splat(q + 1);
      acc1x0123 = f32x4_madd(vq1, k0123, acc1x0123);
      acc1x4567 = f32x4_madd(vq1, k4567, acc1x4567);
      const v128_t vq2 = wasm_v128_load32_splat(q + 2);
      acc2x0123 = f32x4_madd(vq2, k0123, acc2x0123);
      acc2x4567 = f32x4_madd(vq2, k4567, acc2x4567);
      const v128_t vq3 = wasm_v128_load32_splat(q + 3);
      acc3x0123 = f32x4_madd(vq3, k0123, acc3x0123);
      acc3x4567 = f32x4_madd(vq3, k4567, acc3x4567);
    }
    wasm_v128_store(scores + 0 * kScoreStride + g, acc0x0123);
    wasm_v128_store(scores + 0 * kScoreStride + g + 4, acc0x4567);
    wasm_v128_store(scores + 1 * kScoreStride + g, acc1x0123);
    wasm_v128_store(scores + 1 * kScoreStride + g + 4, acc1x4567);
    wasm_v128_store(scores + 2 * kScoreStride + g, acc2x0123);
    wasm_v128_store(scores + 2 * kScoreStride + g + 4, acc2x4567);
    wasm_v128_store(scores + 3 * kScoreStride + g, acc3x0123);
    wasm_v128_store(scores + 3 * kScoreStride + g + 4, acc3x4567);
  }
}

}  // namespace sdpa
