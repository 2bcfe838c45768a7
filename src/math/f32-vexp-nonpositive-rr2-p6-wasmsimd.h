// exp(x) of 4 lanes with x <= 0, for softmax: x = s - max, so x <= 0 (or -inf for a
// blocked key, or NaN when a legitimate score is NaN).
//
// Math (scalar form; every lane does the same):
//   n := round(x / ln2)          so x = n·ln2 + t with |t| <= ln2/2
//   t := x - n·ln2_hi - n·ln2_lo (two-constant "rr2" reduction: ln2_hi has 16 significant
//                                 bits, so n·ln2_hi is exact for |n| < 2^8)
//   exp(t) ≈ 1 + t + t²/2! + … + t⁶/6!   (Taylor, "p6"; the dropped term is
//                                 |t|⁷/7! <= 1.2e-7 on |t| <= ln2/2: about 1 ulp)
//   exp(x) = 2^n · exp(t)
// round() uses the magic-bias trick: adding 1.5·2^23 pushes the fraction bits out, so the
// low mantissa bits of (x/ln2 + magic) hold the integer n. The magic number also carries the
// exponent bias 127, so shifting those bits left by 23 gives the float 2^n directly. This
// is valid while n + 127 is in [1, 254]; for x >= kDenormCutoff = ln(2^-126), n >= -126.
// Lanes with x < kDenormCutoff (including x = -inf, where t would be NaN) are flushed to
// exactly +0: blocked keys must contribute exactly nothing.
#pragma once

#include "simd/f32x4.h"

namespace sdpa {

struct ExpConstants {
  v128_t log2e, magic_bias, minus_ln2_hi, minus_ln2_lo, denorm_cutoff;
  v128_t c6, c5, c4, c3, c2, one;
};

// Built once per kernel call and passed by reference: V8 may rematerialise vector
// constants inside loops when clang can see their value (PERF-NOTES), so they are loaded
// from memory once instead of being spelled as splat literals at the point of use.
inline ExpConstants make_exp_constants() {
  static const float k[11] = {
      1.44269504088896341f,      // log2(e)
      12582912.0f + 127.0f,      // 1.5·2^23 + exponent bias
      -0.693145751953125f,       // -ln2_hi (0x1.62E4p-1, 16 significant bits)
      -1.42860682030941723e-6f,  // -ln2_lo = -(ln2 - ln2_hi)
      -87.3365478515625f,        // ≈ ln(2^-126); n = round(x/ln2) >= -126 for x >= this
      1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f};
  ExpConstants c;
  c.log2e = wasm_v128_load32_splat(&k[0]);
  c.magic_bias = wasm_v128_load32_splat(&k[1]);
  c.minus_ln2_hi = wasm_v128_load32_splat(&k[2]);
  c.minus_ln2_lo = wasm_v128_load32_splat(&k[3]);
  c.denorm_cutoff = wasm_v128_load32_splat(&k[4]);
  c.c6 = wasm_v128_load32_splat(&k[5]);
  c.c5 = wasm_v128_load32_splat(&k[6]);
  c.c4 = wasm_v128_load32_splat(&k[7]);
  c.c3 = wasm_v128_load32_splat(&k[8]);
  c.c2 = wasm_v128_load32_splat(&k[9]);
  c.one = wasm_v128_load32_splat(&k[10]);
  return c;
}

inline v128_t exp_nonpositive(v128_t x, const ExpConstants& c) {
  // n_biased holds round(x / ln2) + 127 in its low mantissa bits.
  const v128_t n_biased = wasm_f32x4_add(wasm_f32x4_mul(x, c.log2e), c.magic_bias);
  const v128_t n = wasm_f32x4_sub(n_biased, c.magic_bias);
  // 2^n: the biased exponent n + 127 moved into the exponent field.
  const v128_t two_n = wasm_i32x4_shl(n_biased, 23);
  // t := x - n·ln2, |t| <= ln2/2.
  v128_t t = wasm_f32x4_add(wasm_f32x4_mul(n, c.minus_ln2_hi), x);
  t = wasm_f32x4_add(wasm_f32x4_mul(n, c.minus_ln2_lo), t);
  // Horner: p = 1 + t(1 + t(1/2 + t(1/6 + t(1/24 + t(1/120 + t/720))))).
  v128_t p = wasm_f32x4_add(wasm_f32x4_mul(c.c6, t), c.c5);
  p = wasm_f32x4_add(wasm_f32x4_mul(p, t), c.c4);
  p = wasm_f32x4_add(wasm_f32x4_mul(p, t), c.c3);
  p = wasm_f32x4_add(wasm_f32x4_mul(p, t), c.c2);
  p = wasm_f32x4_add(wasm_f32x4_mul(p, t), c.one);
  p = wasm_f32x4_add(wasm_f32x4_mul(p, t), c.one);
  const v128_t y = wasm_f32x4_mul(two_n, p);
  // x < cutoff (or x = -inf): flush to +0. NaN compares false and stays NaN.
  return wasm_v128_andnot(y, wasm_f32x4_lt(x, c.denorm_cutoff));
}

}  // namespace sdpa
