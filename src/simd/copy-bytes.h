// Copies inside wasm memory without Emscripten's memcpy, which hands copies of 512 bytes or
// more to JavaScript (emscripten_memcpy_big): a call out of wasm for every row copied. Rows of
// a few hundred bytes are copied often, so these go 16 bytes at a time in wasm: a KV cache
// append's rows (a decode step's append of 32 heads spent half its time in those calls) and a
// decode segment's partial output rows (an MHA float32 step at 4096 keys took 1.1–1.15× the
// time with them); the backward pass's dO rows in and dK/dV rows out (E128 backward, N512 H8,
// took 1.09–1.14× the time with them; E64 rows are under 512 bytes).
#pragma once

#include <cstddef>
#include <cstring>

#include "simd/f32x4.h"

namespace sdpa {

// `bytes` bytes from src to dst (not overlapping), 16 at a time, the last 0..15 by memcpy.
inline void copy_bytes(void* dst, const void* src, size_t bytes) {
  char* to = static_cast<char*>(dst);
  const char* from = static_cast<const char*>(src);
  size_t i = 0;
  for (; i + 16 <= bytes; i += 16) wasm_v128_store(to + i, wasm_v128_load(from + i));
  if (i < bytes) std::memcpy(to + i, from + i, bytes - i);
}

}  // namespace sdpa
