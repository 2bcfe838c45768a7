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
// Eight lanes at once (f16x8_load_finite_as_f32_times_2_minus_112, for P·V by column blocks,
// pv_block: the GQA decode), the same bits as two 4-lane loads, made in 16-bit lanes before
// they are paired up: bits is
//   upper 16 bits := (h >>arithmetic 3) & 0x8FFF   s, then 000, then e and m9..m3
//   lower 16 bits := h << 13                        m2..m0, then zeros
// and interleaving the eight upper halves with the eight lower ones gives the 32-bit lanes of
// halves 0..3 and 4..7: a load and 5 operations on 8 halves (two shifts, an AND, two
// shuffles), where two 4-lane loads take two widening loads and 4 operations (a shift and an
// AND each), and on x86 each widening load is itself a load and a shuffle: 6 operations on 8
// halves against 8.
// Or as even and odd halves (f16x8_load_finite_even_odd_as_f32_times_2_minus_112, for the
// float16 MHA decode, whose dot products and P·V may take the 8 dims in any fixed order),
// without shuffles: a 32-bit lane of the load holds h_{2i} in its low 16 bits and h_{2i+1} in
// its high ones. (lane >>arithmetic 3) puts the high half where x puts it above (sign copies
// in bits 31..28, e and m in 27..13) and the low half's top 13 bits in bits 12..0, which the
// AND with 0x8FFFE000 clears with the sign copies: the bits of h_{2i+1}. (lane << 16) first
// makes the low half the high one (and zeros below it): the bits of h_{2i}. A load and 5
// operations on 8 halves too (three shifts and two ANDs), which took 0.91–0.99× the time of the
// interleaving form in the float16 MHA decode (relaxed build, AMD EPYC Zen 5, family 26 model 2).
// (Two overlapping loads, at p and p - 1 half, each shifted and masked, are 4 operations, but
// took 0.95–1.05× the time there; the load at p - 1 crosses a cache line once in four, and
// reads the 2 bytes before the first row.)
//
// Narrowing (f32_to_f16, scalar, and f32x4_to_f16_bits, the same four lanes at once, for
// the appends of long prompts): round to nearest, ties to even. Finite values beyond the
// largest half (±65504, after rounding) and ±Inf SATURATE to ±65504, so a float16 cache never
// holds an infinity it was not given as raw halves, and a score q·k is never Inf·0 = NaN. NaN
// stays NaN (quiet, sign kept).
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

// Constants of the SIMD narrowing, built once per row copy and passed by reference.
struct F32ToF16Constants {
  v128_t magnitude_mask;  // 0x7FFFFFFF
  v128_t sign_bit;        // 0x8000, after the shift
  v128_t nan_above;       // 0x7F800000: magnitudes above it are NaN
  v128_t saturate_from;   // 0x477FF000: 65520 (rounds past 65504), and Inf
  v128_t normal_from;     // 0x38800000: 2^-14, the smallest normal half
  v128_t rebias;          // (127 - 15) << 23
  v128_t round_down;      // 0xFFF: just under half of the 13 dropped bits
  v128_t one;             // 1
  v128_t half_max;        // 0x7BFF: 65504
  v128_t quiet_nan;       // 0x7E00
  v128_t payload_mask;    // 0x3FF
  v128_t one_half;        // 0.5f (bits 0x3F000000)
};

inline F32ToF16Constants make_f32_to_f16_constants() {
  F32ToF16Constants c;
  c.magnitude_mask = wasm_i32x4_splat(0x7FFFFFFF);
  c.sign_bit = wasm_i32x4_splat(0x8000);
  c.nan_above = wasm_i32x4_splat(0x7F800000);
  c.saturate_from = wasm_i32x4_splat(0x477FF000);
  c.normal_from = wasm_i32x4_splat(0x38800000);
  c.rebias = wasm_i32x4_splat((127 - 15) << 23);
  c.round_down = wasm_i32x4_splat(0xFFF);
  c.one = wasm_i32x4_splat(1);
  c.half_max = wasm_i32x4_splat(0x7BFF);
  c.quiet_nan = wasm_i32x4_splat(0x7E00);
  c.payload_mask = wasm_i32x4_splat(0x3FF);
  c.one_half = wasm_f32x4_splat(0.5f);
  return c;
}

// f32_to_f16 of four floats: lane i holds the half's bits in its low 16 bits (0 above), for
// wasm_u16x8_narrow_i32x4. Each case of f32_to_f16 is computed in every lane and the lane's
// own case chosen, from the float's magnitude bits m (m <= 0x7FFFFFFF: the signed compares
// and shifts below act as unsigned ones):
//   m > 0x7F800000 (NaN):              0x7E00 | ((m >> 13) & 0x3FF)
//   m >= 0x477FF000 (>= 65520, Inf):   0x7BFF
//   m >= 0x38800000 (a normal half):   f32_to_f16's integer rounding, the same operations
//   m <  0x38800000 (subnormal, zero): bits(|x| + 0.5f) - bits(0.5f). The floats in [0.5, 1)
//     are the multiples of 2^-24 there, so the addition (round to nearest, ties to even:
//     0.5 + k·2^-24 has an even significand exactly when k is even) rounds |x| to
//     k·2^-24 with k = round_even(|x|·2^24), f32_to_f16's m; the difference of the bits is k.
//     |x| < 2^-14 keeps the sum below 1 (k <= 1024; 1024 is the smallest normal's pattern).
// then the sign: bit 15 from bit 31.
inline v128_t f32x4_to_f16_bits(v128_t x, const F32ToF16Constants& c) {
  const v128_t m = wasm_v128_and(x, c.magnitude_mask);
  const v128_t sign = wasm_v128_and(wasm_i32x4_shr(x, 16), c.sign_bit);
  const v128_t rebased = wasm_i32x4_sub(m, c.rebias);
  const v128_t odd = wasm_v128_and(wasm_i32x4_shr(rebased, 13), c.one);
  const v128_t normal = wasm_i32x4_shr(wasm_i32x4_add(wasm_i32x4_add(rebased, c.round_down), odd), 13);
  const v128_t subnormal = wasm_i32x4_sub(wasm_f32x4_add(m, c.one_half), c.one_half);
  const v128_t nan = wasm_v128_or(c.quiet_nan, wasm_v128_and(wasm_i32x4_shr(m, 13), c.payload_mask));
  v128_t h = wasm_v128_bitselect(normal, subnormal, wasm_i32x4_ge(m, c.normal_from));
  h = wasm_v128_bitselect(c.half_max, h, wasm_i32x4_ge(m, c.saturate_from));
  h = wasm_v128_bitselect(nan, h, wasm_i32x4_gt(m, c.nan_above));
  return wasm_v128_or(h, sign);
}

// Constants of the SIMD widening, built once per kernel call and passed by reference (V8
// may rematerialise vector constants that clang can see inside loops: see make_exp_constants).
struct F16Constants {
  v128_t keep;           // 0x8FFFFFFF: sign, the exponent field's low 5 bits, mantissa
  v128_t keep16;         // 0x8FFF in each 16-bit lane: keep's upper half, for 8 lanes at once
  v128_t keep_upper;     // 0x8FFFE000: keep without the 13 bits below a half's mantissa
  v128_t scale;          // 2^112
  v128_t exponent_mask;  // 0x0F800000: e after the shift
  v128_t exponent_ones;  // 0x7F800000
};

inline F16Constants make_f16_constants() {
  static const uint32_t k[5] = {0x8FFFFFFFu, 0x77800000u /* 2^112 */, 0x0F800000u, 0x7F800000u, 0x8FFFE000u};
  F16Constants c;
  c.keep = wasm_v128_load32_splat(&k[0]);
  c.keep16 = wasm_v128_load16_splat(reinterpret_cast<const uint16_t*>(&k[0]) + 1);  // little-endian: 0x8FFF
  c.scale = wasm_v128_load32_splat(&k[1]);
  c.exponent_mask = wasm_v128_load32_splat(&k[2]);
  c.exponent_ones = wasm_v128_load32_splat(&k[3]);
  c.keep_upper = wasm_v128_load32_splat(&k[4]);
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

// Eight halves at p (any 2-byte alignment) as *first (halves 0..3) and *second (4..7), the
// bits of f16x4_load_finite_as_f32_times_2_minus_112 at p and p + 4 for every pattern (see the
// top: the same integer function of h, made in 16-bit lanes).
inline void f16x8_load_finite_as_f32_times_2_minus_112(const uint16_t* p, const F16Constants& c, v128_t* first,
                                                       v128_t* second) {
  const v128_t h = wasm_v128_load(p);
  const v128_t upper = wasm_v128_and(wasm_i16x8_shr(h, 3), c.keep16);
  const v128_t lower = wasm_i16x8_shl(h, 13);
  *first = wasm_i16x8_shuffle(lower, upper, 0, 8, 1, 9, 2, 10, 3, 11);
  *second = wasm_i16x8_shuffle(lower, upper, 4, 12, 5, 13, 6, 14, 7, 15);
}

// Eight halves at p (any 2-byte alignment) as *even (halves 0, 2, 4, 6) and *odd (1, 3, 5, 7),
// each the bits of f16x4_load_finite_as_f32_times_2_minus_112 for that half (see the top).
inline void f16x8_load_finite_even_odd_as_f32_times_2_minus_112(const uint16_t* p, const F16Constants& c,
                                                                 v128_t* even, v128_t* odd) {
  const v128_t h = wasm_v128_load(p);
  *odd = wasm_v128_and(wasm_i32x4_shr(h, 3), c.keep_upper);
  *even = wasm_v128_and(wasm_i32x4_shr(wasm_i32x4_shl(h, 16), 3), c.keep_upper);
}

// Four halves at p (any 2-byte alignment) as four floats, exactly (see the top).
inline v128_t f16x4_load_as_f32(const uint16_t* p, const F16Constants& c) {
  const v128_t x = wasm_i32x4_shl(wasm_i32x4_load16x4(p), 13);
  const v128_t f = wasm_f32x4_mul(wasm_v128_and(x, c.keep), c.scale);
  const v128_t special = wasm_i32x4_eq(wasm_v128_and(x, c.exponent_mask), c.exponent_mask);  // e = 31
  return wasm_v128_or(f, wasm_v128_and(special, c.exponent_ones));
}

// The `count` halves stored in the upper half of `block` (bytes [2·count, 4·count)) widened in
// place into its `count` floats, exactly (f16x4_load_as_f32, f16_to_f32 for the last count % 4;
// NaN payloads kept as they are): how a Float16Array's values reach wasm memory
// (js/memory.ts, writeFloats), copied in as raw halves by a plain copy, where a typed array's
// set() from a Float16Array widens one element at a time (4-8x the time of a float32 copy).
// Front to back, so a store never reaches a half still to be read: floats [i, i + 4) are bytes
// [4i, 4i + 16), and the halves not read yet start at byte 2·count + 2(i + 4) >= 4i + 16 for
// every i + 4 <= count (for the last ones, one at a time, 2·count + 2(i + 1) >= 4i + 4 for
// i < count). The two element types overlap, so every access is a v128 load or store or a
// memcpy (which may alias), not a typed one. About 0.2 ns an element (Zen 5, V8); twice that
// where one half in 30 is subnormal (a subnormal float32 operand of the multiply by 2^112 takes
// the CPU's slow path), which real activations rarely are.
inline void f16_widen_in_place(float* block, int64_t count) {
  const unsigned char* const halves = reinterpret_cast<const unsigned char*>(block) + 2 * count;
  const F16Constants c = make_f16_constants();
  int64_t i = 0;
  for (; i + 4 <= count; i += 4) {
    wasm_v128_store(block + i, f16x4_load_as_f32(reinterpret_cast<const uint16_t*>(halves + 2 * i), c));
  }
  for (; i < count; i++) {
    uint16_t h;
    std::memcpy(&h, halves + 2 * i, sizeof h);
    const float f = f16_to_f32(h);
    std::memcpy(block + i, &f, sizeof f);
  }
}

}  // namespace sdpa
