// IEEE 754 binary16 ("half", float16) <-> binary32 conversions for the float16 KV cache.
// 128-bit wasm SIMD has no half arithmetic, so halves are widened to float32 in registers.
//
// A half h = s eeeee mmmmmmmmmm (sign, 5-bit exponent biased by 15, 10-bit mantissa) is
//   e = 0:       (-1)^s · m · 2^-24                 (zero and subnormals)
//   e in 1..30:  (-1)^s · (1 + m/1024) · 2^(e-15)   (normal)
//   e = 31:      (-1)^s · Inf if m = 0, else NaN (payload m)
//
// Widening, 4 lanes at once (load4 below), in float32 bit terms:
//   x    := sign_extend_16_to_32(h) << 13     s in bits 31..28, e in 27..23, m in 22..13
//   bits := x & 0x8FFFFFFF                    s | exponent field e | mantissa m·2^13
//   f    := as_float(bits) · 2^112
// For e in 1..30 as_float(bits) = (-1)^s (1 + m/1024) 2^(e-127), so f = (1 + m/1024) 2^(e-15):
// exact (a power-of-two product). For e = 0 as_float(bits) is the float32 subnormal
// (m·2^13)·2^-149 = m·2^-136, and f = m·2^-24: exact, and -0 stays -0.
// For e = 31 the product is finite, 2^16 (1 + m/1024), exponent field 31 + 112 = 143; setting
// that field to all ones (OR 0x7F800000, only in those lanes) makes Inf (m = 0) or NaN
// (m != 0, payload kept) with the sign kept. Every one of the 65536 patterns is checked
// against the scalar form in tests/cpp/f16-kv-test.cc.
//
// Narrowing (f32_to_f16, scalar; appends are small next to the reads): round to nearest,
// ties to even. Finite values beyond the largest half (±65504, after rounding) and ±Inf
// SATURATE to ±65504, so a float16 cache never holds an infinity it was not given as raw
// halves, and a score q·k is never Inf·0 = NaN. NaN stays NaN (quiet, sign kept).
#pragma once

#include <cstdint>
#include <cstring>

#include "simd/f32x4.h"

namespace sdpa {

// The scalar widening: exact for every pattern (the oracle of the SIMD form, and the
// kernel's path for the last E % 4 dims).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1Fu) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // Inf or NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  } else {
    // m·2^-24: m < 1024 is exact in float32, and so is the power-of-two scaling.
    float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    std::memcpy(&bits, &magnitude, sizeof bits);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even; beyond ±65504 (and ±Inf) saturate to ±65504; NaN -> quiet NaN.
inline uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  // 65520 = 65504 + half an ulp (16): from there on (and Inf) rounding would go to Inf.
  if (magnitude >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7BFFu);
  if (magnitude >= 0x38800000u) {  // >= 2^-14: a normal half
    // Rebias the exponent (127 -> 15) and drop 13 mantissa bits, rounding to nearest even:
    // adding 0xFFF plus the lowest kept bit carries into the kept part exactly when the
    // dropped part is above half, or exactly half with the kept part odd. A carry out of
    // the mantissa bumps the exponent, which is right (1.111…1 rounds up to 2.0).
    const uint32_t rebased = magnitude - ((127u - 15u) << 23);
    const uint32_t rounded = rebased + 0xFFFu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }
  // Subnormal half (or zero): m = round_even(|f| · 2^24), possibly 1024 = the smallest
  // normal, which is the right encoding too. |f|·2^24 < 1024 is exact; nearbyint rounds to
  // even in the default rounding mode, which wasm always uses.
  float scaled;
  const uint32_t abs_bits = magnitude;
  std::memcpy(&scaled, &abs_bits, sizeof scaled);
  scaled *= 0x1p24f;
  // Round half to even by hand (no <cmath> rounding-mode dependence).
  uint32_t m = static_cast<uint32_t>(scaled);
  const float rest = scaled - static_cast<float>(m);
  if (rest > 0.5f || (rest == 0.5f && (m & 1u) != 0)) m++;
  return static_cast<uint16_t>(sign | m);
}

// Constants of the SIMD widening, built once per kernel call and passed by reference (V8
// may rematerialise vector constants that clang can see inside loops: PERF-NOTES).
struct F16Constants {
  v128_t keep;           // 0x8FFFFFFF: sign, the exponent field's low 5 bits, mantissa
  v128_t scale;          // 2^112
  v128_t exponent_mask;  // 0x0F800000: e after the shift
  v128_t exponent_ones;  // 0x7F800000
};

inline F16Constants make_f16_constants() {
  static const uint32_t k[4] = {0x8FFFFFFFu, 0x77800000u /* 2^112 */, 0x0F800000u, 0x7F800000u};
  F16Constants c;
  c.keep = wasm_v128_load32_splat(&k[0]);
  c.scale = wasm_v128_load32_splat(&k[1]);
  c.exponent_mask = wasm_v128_load32_splat(&k[2]);
  c.exponent_ones = wasm_v128_load32_splat(&k[3]);
  return c;
}

// Four halves at p (any 2-byte alignment) as four floats, exactly for every pattern whose
// exponent is not 31 (no Inf, no NaN): the first half of f16x4_load_as_f32, without its fix-up
// of the e = 31 lanes (which would come out finite, 2^16·(1 + m/1024)).
inline v128_t f16x4_load_finite_as_f32(const uint16_t* p, const F16Constants& c) {
  const v128_t x = wasm_i32x4_shl(wasm_i32x4_load16x4(p), 13);
  return wasm_f32x4_mul(wasm_v128_and(x, c.keep), c.scale);
}

// Four halves at p (any 2-byte alignment) as four floats times 2^-112, exactly for every
// pattern whose exponent is not 31: f16x4_load_finite_as_f32 without its multiply by 2^112
// (3 instructions per 4 halves). The caller multiplies the other factor of each product by
// 2^112 instead: for a float y whose y·2^112 is finite, (y·2^112)·as_float(bits) is the same
// real number as y·f, so it rounds to the same float (and a fused multiply-add gives the same
// sum): the same bits as widening first.
inline v128_t f16x4_load_finite_as_f32_times_2_minus_112(const uint16_t* p, const F16Constants& c) {
  return wasm_v128_and(wasm_i32x4_shl(wasm_i32x4_load16x4(p), 13), c.keep);
}

// Four halves at p (any 2-byte alignment) as four floats, exactly (see the top).
inline v128_t f16x4_load_as_f32(const uint16_t* p, const F16Constants& c) {
  const v128_t x = wasm_i32x4_shl(wasm_i32x4_load16x4(p), 13);
  const v128_t f = wasm_f32x4_mul(wasm_v128_and(x, c.keep), c.scale);
  const v128_t special = wasm_i32x4_eq(wasm_v128_and(x, c.exponent_mask), c.exponent_mask);  // e = 31
  return wasm_v128_or(f, wasm_v128_and(special, c.exponent_ones));
}

}  // namespace sdpa
