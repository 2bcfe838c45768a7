// One include for 128-bit wasm SIMD: the real intrinsics under Emscripten, SIMDe's
// portable emulation of the same intrinsics in native builds (tests, sanitizers, fuzzers).
// Only intrinsics that SIMDe 0.7.4 provides may be used (no *_const_splat, no u32x4 helpers).
#pragma once

#if defined(__wasm_simd128__)
#include <wasm_simd128.h>
#else
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/wasm/simd128.h>
#endif

// a·b + c. In the relaxed-SIMD builds (-mrelaxed-simd, CMakeLists.txt) one f32x4.relaxed_madd,
// which an engine with FMA runs as one fused multiply-add (rounded once) and one without as a
// multiply and an add (rounded twice): the last bits may differ between engines and CPUs, never
// between thread counts on one. Elsewhere (the portable builds, native tests) a multiply and an
// add, rounded twice.
static inline v128_t f32x4_madd(v128_t a, v128_t b, v128_t c) {
#if defined(__wasm_relaxed_simd__)
  return wasm_f32x4_relaxed_madd(a, b, c);
#else
  return wasm_f32x4_add(c, wasm_f32x4_mul(a, b));
#endif
}
