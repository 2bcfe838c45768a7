// bfloat16 ("brain float", bf16) <-> binary32 conversions for the bfloat16 KV cache.
//
// A bfloat16 b is the upper 16 bits of a float32: s eeeeeeee mmmmmmm (sign, the float32's
// 8-bit exponent, the top 7 of its 23 mantissa bits). So its value is exactly
//   as_float(b << 16)
// for every one of the 65536 patterns (zero, subnormals, normals, ±Inf, NaN with its payload's
// top bits): no case analysis, no constants. The float32 range (up to ±3.39e38), with 8
// significant bits against float16's 11: the format of most current model weights (and so of
// their K/V), which never overflow where a float16 cache saturates at ±65504.
//
// Widening in 32-bit lanes (every form is exact for every pattern, so every form gives the
// same bits and a reader may pick the cheapest for its loop):
//   4 at p:           (u32 of the 4 halves) << 16                  a widening load and a shift
//   8 at p in order:  interleave the 8 halves with zeros            two shuffles, no arithmetic
//                     (16-bit lanes: 0, b0, 0, b1, …: the 32-bit lane i is b_i << 16)
//   8 at p, even/odd: a 32-bit lane of the load holds b_{2i} in its low 16 bits and b_{2i+1}
//                     in its high ones: lane << 16 is b_{2i}'s float, lane & 0xFFFF0000 is
//                     b_{2i+1}'s: two operations on 8 elements (float16's take 5).
//
// Narrowing (f32_to_bf16, scalar, and f32x4_to_bf16_bits, 4 lanes): round to nearest, ties
// to even, on the float's bits: add 0x7FFF plus the lowest kept bit, keep the upper 16 (a carry
// out of the mantissa bumps the exponent, which is right). Finite floats that would round past
// the largest bfloat16 (±0x7F7F = ±3.3895e38: magnitudes from 0x7F7F8000 on, the midpoint to
// 2^128, a tie that would round to the even Inf pattern) SATURATE to ±0x7F7F, so rounding never
// makes an infinity; ±Inf stays ±Inf and NaN stays NaN (quiet: bit 6 of the bfloat16 set, the
// sign and the payload's top bits kept), as a float32 cache stores them. Checked against
// every float32 exponent and rounding case in tests/cpp/bf16-kv-test.cc.
#pragma once

#include <cstdint>
#include <cstring>

#include "simd/f32x4.h"

namespace sdpa {

// The float32 value of bfloat16 pattern b: exact for every pattern.
inline float bf16_to_f32(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even; finite beyond the largest bfloat16 saturate to ±0x7F7F; ±Inf stay
// ±Inf; NaN -> quiet NaN (sign and top payload bits kept).
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint32_t sign = bits & 0x80000000u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);            // NaN
  if (magnitude == 0x7F800000u) return static_cast<uint16_t>(bits >> 16);                       // ±Inf
  if (magnitude >= 0x7F7F8000u) return static_cast<uint16_t>((sign >> 16) | 0x7F7Fu);           // would round to Inf
  // magnitude + 0x7FFF + odd <= 0x7F7F7FFF + 0x8000: no carry into the sign bit.
  const uint32_t rounded = magnitude + 0x7FFFu + ((magnitude >> 16) & 1u);
  return static_cast<uint16_t>((sign | rounded) >> 16);
}

// Constants of the SIMD narrowing, built once per row copy and passed by reference.
struct F32ToBF16Constants {
  v128_t magnitude_mask;  // 0x7FFFFFFF
  v128_t sign_bit;        // 0x80000000
  v128_t round_down;      // 0x7FFF: just under half of the 16 dropped bits
  v128_t one;             // 1
  v128_t saturate_from;   // 0x7F7F8000: rounds past the largest bfloat16
  v128_t infinity;        // 0x7F800000
  v128_t largest;         // 0x7F7F0000: the largest bfloat16, in the upper 16 bits
  v128_t quiet;           // 0x00400000: a bfloat16's quiet-NaN bit, in the upper 16 bits
};

inline F32ToBF16Constants make_f32_to_bf16_constants() {
  F32ToBF16Constants c;
  c.magnitude_mask = wasm_i32x4_splat(0x7FFFFFFF);
  c.sign_bit = wasm_i32x4_splat(static_cast<int32_t>(0x80000000u));
  c.round_down = wasm_i32x4_splat(0x7FFF);
  c.one = wasm_i32x4_splat(1);
  c.saturate_from = wasm_i32x4_splat(0x7F7F8000);
  c.infinity = wasm_i32x4_splat(0x7F800000);
  c.largest = wasm_i32x4_splat(0x7F7F0000);
  c.quiet = wasm_i32x4_splat(0x00400000);
  return c;
}

// f32_to_bf16 of four floats, each bfloat16 in the UPPER 16 bits of its lane (the low 16 bits
// are not specified): the caller takes the odd 16-bit lanes. Each of f32_to_bf16's cases is
// computed in every lane and the lane's own one chosen, from the magnitude bits m (m <=
// 0x7FFFFFFF, so the signed compares act as unsigned ones):
//   m > 0x7F800000 (NaN):       x | 0x00400000
//   m == 0x7F800000 (±Inf):     x
//   m >= 0x7F7F8000:            sign | 0x7F7F0000
//   otherwise:                  sign | (m + 0x7FFF + ((m >> 16) & 1))
inline v128_t f32x4_to_bf16_bits(v128_t x, const F32ToBF16Constants& c) {
  const v128_t m = wasm_v128_and(x, c.magnitude_mask);
  const v128_t sign = wasm_v128_and(x, c.sign_bit);
  const v128_t odd = wasm_v128_and(wasm_u32x4_shr(m, 16), c.one);
  const v128_t rounded = wasm_i32x4_add(wasm_i32x4_add(m, c.round_down), odd);
  v128_t b = wasm_v128_bitselect(c.largest, rounded, wasm_i32x4_ge(m, c.saturate_from));
  b = wasm_v128_bitselect(m, b, wasm_i32x4_eq(m, c.infinity));
  b = wasm_v128_bitselect(wasm_v128_or(m, c.quiet), b, wasm_i32x4_gt(m, c.infinity));
  return wasm_v128_or(b, sign);
}

// Eight floats at from as eight bfloat16 at to (f32x4_to_bf16_bits' upper halves).
inline void f32x8_store_as_bf16(uint16_t* to, const float* from, const F32ToBF16Constants& c) {
  const v128_t low = f32x4_to_bf16_bits(wasm_v128_load(from), c);
  const v128_t high = f32x4_to_bf16_bits(wasm_v128_load(from + 4), c);
  wasm_v128_store(to, wasm_i16x8_shuffle(low, high, 1, 3, 5, 7, 9, 11, 13, 15));
}

// Four bfloat16 at p (any 2-byte alignment) as four floats (exact).
inline v128_t bf16x4_load_as_f32(const uint16_t* p) {
  return wasm_i32x4_shl(wasm_u32x4_load16x4(p), 16);
}

// Eight bfloat16 at p as *first (elements 0..3) and *second (4..7), exact: interleaved with zeros.
inline void bf16x8_load_as_f32(const uint16_t* p, v128_t* first, v128_t* second) {
  const v128_t b = wasm_v128_load(p), zero = wasm_i32x4_splat(0);
  *first = wasm_i16x8_shuffle(zero, b, 0, 8, 1, 9, 2, 10, 3, 11);
  *second = wasm_i16x8_shuffle(zero, b, 4, 12, 5, 13, 6, 14, 7, 15);
}

// Eight bfloat16 at p as *even (elements 0, 2, 4, 6) and *odd (1, 3, 5, 7), exact (see the top).
// upper_mask: 0xFFFF0000 in every lane (a loop's constant, built once by its caller).
inline void bf16x8_load_even_odd_as_f32(const uint16_t* p, v128_t upper_mask, v128_t* even, v128_t* odd) {
  const v128_t b = wasm_v128_load(p);
  *even = wasm_i32x4_shl(b, 16);
  *odd = wasm_v128_and(b, upper_mask);
}

}  // namespace sdpa
