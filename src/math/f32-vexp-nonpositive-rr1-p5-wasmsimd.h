// exp(x) of 4 lanes with x <= 0, for softmax: x = s - max, so x <= 0 (or -inf for a
// blocked key, or NaN when a legitimate score is NaN). Lanes with exp(x) < 2^-64 are
// flushed to exactly +0.
//
// Math (scalar form; every lane does the same):
//   z := max(x·log2(e), -64)     exp(x) = 2^z; below -64 the result is flushed (see below)
//   n := round(z)                so z = n + t with |t| <= 1/2, and n in [-64, 0]
//   t := z - n                   exact (z and n are within 1/2 of each other)
//   2^t ≈ 1 + t·(c1 + t·(c2 + t·(c3 + t·(c4 + t·c5))))   ("p5": minimax for the relative
//                                error on |t| <= 1/2, fitted by iterated reweighted least
//                                squares; 1.6e-7 worst in float32, about 1.3 ulp)
//   exp(x) = 2^n · 2^t
// "rr1": the reduction has one constant, log2(e). Rounding x·log2(e) (the product, and
// log2(e) itself) costs a relative error of at most 1.5·|x|·2^-24 in the result, which is
// tiny where it occurs: at x = -40 it is 3.6e-6 of a value of 4e-18, while the softmax sums
// values of up to 1 (the row maximum's).
//
// round() uses the magic-bias trick: adding 1.5·2^23 + 64 pushes the fraction bits out, so
// the low mantissa bits of z + magic hold the integer n + 64 in [0, 64]. Shifting those bits
// left by 23 puts n + 64 into the exponent field: the float 2^(n + 64 - 127) = 2^(n - 63),
// never subnormal. The polynomial carries the missing 2^63 (its coefficients are scaled by
// 2^63, exactly, being a power of two), so 2^(n - 63) · (2^63·2^t) = 2^n·2^t.
//
// Flush to zero: z is clamped at -64, where n + 64 = 0 gives the exponent field 0, the
// float +0, and +0 · anything finite = +0. So exp(x) = +0 exactly for x·log2(e) <= -63.5
// (x <= -44.0), including x = -inf: blocked keys contribute exactly nothing. Every nonzero
// result is >= 2^-63.5, so neither this function nor the products p·v of the softmax
// that follow it (for |v| >= 2^-60) ever make subnormal numbers, which x86 multiplies
// can take 100 times longer on. What is dropped is invisible: even 2^31 keys of weight
// 2^-64 sum to 2^-33 of the row maximum's weight 1, below float32's resolution of 2^-24.
// NaN stays NaN (f32x4.pmax(NaN, c) returns its first operand, NaN).
#pragma once

#include "simd/f32x4.h"

namespace sdpa {

struct ExpConstants {
  v128_t log2e, min_z, magic_bias, c5, c4, c3, c2, c1, c0;
};

// Built once per kernel call and passed by reference: V8 may rematerialise vector constants
// inside loops when clang can see their value (a micro-benchmark ran 3.6× slower in the team's
// wasm SIMD measurements), so they are loaded from memory once instead of being spelled as
// splat literals at the point of use.
inline ExpConstants make_exp_constants() {
  constexpr float k2p63 = 0x1p63f;  // 2^63: the polynomial's scale (see above)
  static const float k[9] = {
      1.44269504088896341f,      // log2(e)
      -64.0f,                    // min_z: z at or below it gives +0
      12582912.0f + 64.0f,       // 1.5·2^23 + 64
      k2p63 * 0x1.5bba34p-10f,   // c5·2^63
      k2p63 * 0x1.3cea98p-7f,    // c4·2^63
      k2p63 * 0x1.c6b754p-5f,    // c3·2^63
      k2p63 * 0x1.ebf9bcp-3f,    // c2·2^63
      k2p63 * 0x1.62e42ap-1f,    // c1·2^63
      k2p63,                     // c0·2^63, c0 = 1
  };
  ExpConstants c;
  c.log2e = wasm_v128_load32_splat(&k[0]);
  c.min_z = wasm_v128_load32_splat(&k[1]);
  c.magic_bias = wasm_v128_load32_splat(&k[2]);
  c.c5 = wasm_v128_load32_splat(&k[3]);
  c.c4 = wasm_v128_load32_splat(&k[4]);
  c.c3 = wasm_v128_load32_splat(&k[5]);
  c.c2 = wasm_v128_load32_splat(&k[6]);
  c.c1 = wasm_v128_load32_splat(&k[7]);
  c.c0 = wasm_v128_load32_splat(&k[8]);
  return c;
}

// exp of kN vectors at once, in place: x[i] := exp(x[i]), each lane exactly as the scalar form
// above (the same operations in the same order per lane, so the same bits for any kN). The
// kN computations are written step by step side by side: one exp is a chain of about 12
// dependent operations (5 of them the Horner multiply-adds), and interleaved, each dependent
// step has kN - 1 independent ones next to it for the out-of-order core. exponentiate_tile
// uses kN = 4: whole-kernel prefill 2-4.5% faster than one vector at a time, bitwise the same,
// in alternating A/B runs on an AMD EPYC Zen 4 (both builds; the exp's share of a V8 profile
// of (b) fell from about 11% to 8%); kN = 8 gained no more on the relaxed build (its 3·8 live
// vectors of t, scale and p exceed the registers).
template <int kN>
inline void exp_nonpositive_n(v128_t* x, const ExpConstants& c) {
  v128_t z[kN], n_biased[kN], t[kN], scale[kN], p[kN];
  // z = max(x·log2(e), -64); pmax(a, b) = a < b ? b : a keeps a NaN a.
  for (int i = 0; i < kN; i++) z[i] = wasm_f32x4_pmax(wasm_f32x4_mul(x[i], c.log2e), c.min_z);
  // n_biased holds n + 64 = round(z) + 64 in its low mantissa bits.
  for (int i = 0; i < kN; i++) n_biased[i] = wasm_f32x4_add(z[i], c.magic_bias);
  for (int i = 0; i < kN; i++) t[i] = wasm_f32x4_sub(z[i], wasm_f32x4_sub(n_biased[i], c.magic_bias));
  // 2^(n - 63): n + 64 moved into the exponent field; +0 when n = -64.
  for (int i = 0; i < kN; i++) scale[i] = wasm_i32x4_shl(n_biased[i], 23);
  // Horner: 2^63·2^t = c0' + t(c1' + t(c2' + t(c3' + t(c4' + t·c5')))), c' = c·2^63.
  for (int i = 0; i < kN; i++) p[i] = f32x4_madd(c.c5, t[i], c.c4);
  for (int i = 0; i < kN; i++) p[i] = f32x4_madd(p[i], t[i], c.c3);
  for (int i = 0; i < kN; i++) p[i] = f32x4_madd(p[i], t[i], c.c2);
  for (int i = 0; i < kN; i++) p[i] = f32x4_madd(p[i], t[i], c.c1);
  for (int i = 0; i < kN; i++) p[i] = f32x4_madd(p[i], t[i], c.c0);
  for (int i = 0; i < kN; i++) x[i] = wasm_f32x4_mul(scale[i], p[i]);
}

inline v128_t exp_nonpositive(v128_t x, const ExpConstants& c) {
  exp_nonpositive_n<1>(&x, c);
  return x;
}

}  // namespace sdpa
