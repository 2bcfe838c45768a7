// Attention dropout (PyTorch's dropout_p, FlashAttention's dropout_p), as every kernel and the
// contract (src/sdpa.h) apply it. After the softmax, the probability p_ij of query row i and key
// j is dropped (0) or kept and multiplied by `factor`, so that its expected value stays p_ij:
//   output_i = Σ_j p_ij·z_ij·v_j,  z_ij = factor if kept, else 0
// The softmax itself (its maximum, its sum, the log-sum-exp) is the one without dropout.
// Whether (b, h, i, j) is kept is a pure function of the seed and those four indices (the
// call's: a part computed alone adds its place, dropout_batch_base, dropout_head_base and
// dropout_row_base, to b, h and i), never of the tile, the order or the thread count, so the
// backward draws the same mask again and every split of the work gives the same bits. i is the
// row's index in the call's query, not a position in a longer sequence: calls with the same seed
// draw the same masks (a new seed per call, as PyTorch draws new numbers per call). All
// arithmetic is on uint32, mod 2^32:
//   mix(x)  = MurmurHash3's finaliser: x ^= x >> 16; x *= 0x85EBCA6B; x ^= x >> 13;
//             x *= 0xC2B2AE35; x ^= x >> 16  (a bijection of uint32)
//   row     = mix(mix(mix(mix(seed) + b) + h) + i)
//   bits(j) = mix(row ^ (j·0x9E3779B9))  (an odd step: distinct j give distinct bits in a row;
//             XOR, not +: with +, two rows whose states differ by d·0x9E3779B9 would have the
//             same mask shifted by d keys)
//   kept    = bits(j) >= threshold      (probability 1 - threshold/2^32)
//   factor  = 2^32 / (2^32 - threshold), rounded to float once (dropout_factor)
// threshold = 0 is no dropout: every kernel then skips all of this (the bits of a problem
// without dropout). The JS layer takes a probability q in [0, 1) and passes
// threshold = min(round(q·2^32), 2^32 - 1).
#pragma once

#include <cstdint>

#include "sdpa.h"
#include "simd/f32x4.h"

namespace sdpa {

inline uint32_t dropout_mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return x;
}

constexpr uint32_t kDropoutKeyStep = 0x9E3779B9u;

// The key-independent part of row i of (b, h): bits(j) = dropout_mix(row ^ j·kDropoutKeyStep).
// validate() keeps base + b, base + h and base + i within int32.
inline uint32_t dropout_row(const Problem& p, int32_t b, int32_t h, int32_t i) {
  uint32_t x = dropout_mix(p.dropout_seed);
  x = dropout_mix(x + static_cast<uint32_t>(p.dropout_batch_base + b));
  x = dropout_mix(x + static_cast<uint32_t>(p.dropout_head_base + h));
  return dropout_mix(x + static_cast<uint32_t>(p.dropout_row_base + i));
}

inline bool dropout_kept(const Problem& p, uint32_t row, int64_t j) {
  return dropout_mix(row ^ (static_cast<uint32_t>(j) * kDropoutKeyStep)) >= p.dropout_threshold;
}

// What a kept probability is multiplied by: 1 / (1 - threshold/2^32), in double, rounded once.
inline float dropout_factor(const Problem& p) {
  return static_cast<float>(4294967296.0 / (4294967296.0 - static_cast<double>(p.dropout_threshold)));
}

// Each lane times c, mod 2^32. wasm's i32x4.mul wraps; SIMDe's emulation of it in the native
// builds multiplies signed int32 lanes (an overflow there is undefined, and UBSan aborts the
// sanitized tests on it), so those multiply the lanes as uint32: the same bits.
inline v128_t dropout_mul_lanes(v128_t x, uint32_t c) {
#if defined(__wasm_simd128__)
  return wasm_i32x4_mul(x, wasm_i32x4_splat(static_cast<int32_t>(c)));
#else
  alignas(16) uint32_t lanes[4];
  wasm_v128_store(lanes, x);
  for (uint32_t& lane : lanes) lane *= c;
  return wasm_v128_load(lanes);
#endif
}

// Four lanes of bits(j0 + c) .. bits(j0 + c + 3) at once: the scalar mix on i32x4 (the shifts
// logical, the products mod 2^32, as uint32 multiplication is).
inline v128_t dropout_mix4(v128_t x) {
  x = wasm_v128_xor(x, wasm_u32x4_shr(x, 16));
  x = dropout_mul_lanes(x, 0x85EBCA6Bu);
  x = wasm_v128_xor(x, wasm_u32x4_shr(x, 13));
  x = dropout_mul_lanes(x, 0xC2B2AE35u);
  return wasm_v128_xor(x, wasm_u32x4_shr(x, 16));
}

// probs[c] := probs[c]·z(j0 + c) for c in [0, cols) (cols a multiple of 4) of row `row`:
// factor where kept, else +0 (and NaN where kept stays NaN).
inline void apply_dropout_row(const Problem& p, uint32_t row, int64_t j0, int32_t cols, float factor, float* probs) {
  const v128_t step4 = wasm_i32x4_splat(static_cast<int32_t>(4u * kDropoutKeyStep));
  const v128_t threshold = wasm_i32x4_splat(static_cast<int32_t>(p.dropout_threshold));
  const v128_t scale = wasm_f32x4_splat(factor);
  const v128_t row_bits = wasm_i32x4_splat(static_cast<int32_t>(row));
  const uint32_t first = static_cast<uint32_t>(j0) * kDropoutKeyStep;  // j·step, for j = j0 + c + lane
  v128_t keys = wasm_i32x4_make(static_cast<int32_t>(first), static_cast<int32_t>(first + kDropoutKeyStep),
                                static_cast<int32_t>(first + 2 * kDropoutKeyStep),
                                static_cast<int32_t>(first + 3 * kDropoutKeyStep));
  for (int32_t c = 0; c < cols; c += 4, keys = wasm_i32x4_add(keys, step4)) {
    const v128_t kept = wasm_u32x4_ge(dropout_mix4(wasm_v128_xor(row_bits, keys)), threshold);
    wasm_v128_store(probs + c, wasm_v128_and(wasm_f32x4_mul(wasm_v128_load(probs + c), scale), kept));
  }
}

}  // namespace sdpa
