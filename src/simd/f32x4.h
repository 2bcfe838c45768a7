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
