// Inputs for the fuzz targets: values drawn from a mix of ordinary numbers and the ones that
// break careless float code, and buffers allocated at their exact size.
//
// A fuzz input is a few hundred bytes, a problem holds thousands of elements: the input
// chooses, per tensor, a seed and a style (the magnitude of the ordinary numbers and how
// often a special value replaces one), and a pseudo-random generator fills the tensor from
// them. Specific elements can then be overridden from the input's remaining bytes, so
// libFuzzer can still place a NaN at one chosen position.
//
// Buffers are std::vector constructed at the size a tensor's strides reach, no more: the
// heap block ends where the tensor ends, so AddressSanitizer reports any read or write past
// it. Elements the strides skip (padding) are filled with a quiet NaN, which must never
// reach a result.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "math/f16-f32-cvt-wasmsimd.h"

// Helpers of the oracle and of the input decoding: their loops and branches are not what the
// fuzzer should explore (its coverage feedback is for the kernel), and instrumented they
// dominated the run time.
#define FUZZ_NO_COVERAGE __attribute__((no_sanitize("coverage")))

namespace sdpa_fuzz {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Float values that have broken attention kernels: NaN, infinities, magnitudes whose
// products overflow, the largest float, subnormals (the smallest, the largest), -0, and the
// edges of the float16 range (65504 is the largest half; from 65520 on a float rounds to
// the half infinity, which the cache's conversion saturates to 65504).
inline constexpr float kSpecialFloats[] = {
    kNaN,     kInf,     -kInf,    1e30f,    -1e30f,   FLT_MAX,         -FLT_MAX,
    FLT_MIN,  0x1p-149f, -0x1p-149f, 0x1.fffffcp-127f, -0.0f, 0.0f,   1.0f,
    -1.0f,    65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e5f,   -1e-30f,
};

// Half patterns: +Inf, a quiet NaN, a NaN with a payload, the largest finite, the smallest
// subnormal, -0, the largest subnormal, the smallest normal, -Inf, the most negative finite.
inline constexpr uint16_t kSpecialHalves[] = {0x7C00, 0x7E00, 0x7C01, 0x7BFF, 0x0001, 0x8000, 0x03FF,
                                              0x0400, 0xFC00, 0xFBFF, 0x8001, 0x3C00, 0x0000};

inline bool half_is_inf_or_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00; }

// splitmix64: small, fast, and every seed gives a different stream.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint32_t below(uint32_t n) { return static_cast<uint32_t>(next() % n); }
  // Uniform in [-1, 1).
  float symmetric() { return static_cast<float>(static_cast<int64_t>(next() >> 40) - (1 << 23)) * 0x1p-23f; }
};

// How one tensor's values are drawn.
struct ValueStyle {
  uint64_t seed = 0;
  int exponent = 0;          // ordinary values are uniform in [-2^exponent, 2^exponent)
  uint32_t special_rate = 0; // out of 256: how often a special value is drawn instead
  bool small_integers = false;  // ordinary values are integers in [-3, 3]: exact dot products

  static ValueStyle from(FuzzedDataProvider& in) {
    ValueStyle s;
    s.seed = in.ConsumeIntegral<uint32_t>();
    // Mostly moderate magnitudes; sometimes huge or tiny ones (overflowing or subnormal
    // products, logits far apart).
    const uint8_t magnitude = in.ConsumeIntegral<uint8_t>();
    s.exponent = magnitude < 192 ? static_cast<int>(magnitude % 7) - 3
                                 : static_cast<int>(magnitude % 64) * 4 - 126;  // [-126, 126]
    const uint8_t special = in.ConsumeIntegral<uint8_t>();
    s.special_rate = special < 160 ? 0 : special < 224 ? 4 : special - 200;  // 0, 4/256, up to 55/256
    s.small_integers = (magnitude & 0x40) != 0 && magnitude < 192;
    return s;
  }
};

FUZZ_NO_COVERAGE inline float draw_float(Rng& rng, const ValueStyle& s) {
  if (s.special_rate != 0 && rng.below(256) < s.special_rate) {
    return kSpecialFloats[rng.below(sizeof kSpecialFloats / sizeof kSpecialFloats[0])];
  }
  if (s.small_integers) return static_cast<float>(static_cast<int>(rng.below(7)) - 3);
  return std::ldexp(rng.symmetric(), s.exponent);
}

// A float16 element: a special pattern, or an ordinary value rounded to half.
FUZZ_NO_COVERAGE inline uint16_t draw_half(Rng& rng, const ValueStyle& s) {
  if (s.special_rate != 0 && rng.below(256) < s.special_rate) {
    return kSpecialHalves[rng.below(sizeof kSpecialHalves / sizeof kSpecialHalves[0])];
  }
  return sdpa::f32_to_f16(draw_float(rng, ValueStyle{s.seed, s.exponent, 0, s.small_integers}));
}

// bfloat16 patterns: +Inf, -Inf, a quiet NaN, a NaN with a payload, the largest finite and the
// most negative, the smallest subnormal, -0, the largest subnormal, the smallest normal, 1, 0.
inline constexpr uint16_t kSpecialBFloat16s[] = {0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0x7F7F, 0xFF7F, 0x0001, 0x8000,
                                                 0x007F, 0x0080, 0x3F80, 0x0000};

// float32 -> bfloat16 as src/kv-cache.h specifies it, from the value (not the bits): f = m·2^e
// with m in [0.5, 1) has 8 significant bits kept, m·2^8 rounded to an integer by nearbyint (to
// nearest, ties to even, the default rounding mode), or f·2^133 rounded for the subnormal
// bfloat16s (steps of 2^-133); a finite result of 2^128 or more (infinity in float) saturates to
// the largest bfloat16 of its sign; Inf stays Inf; NaN is "a NaN of this sign" (matches_bf16).
FUZZ_NO_COVERAGE inline uint16_t narrow_bf16(float f) {
  if (std::isnan(f)) return std::signbit(f) ? 0xFFC0 : 0x7FC0;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isinf(f)) return static_cast<uint16_t>(sign | 0x7F80);
  int e = 0;
  std::frexp(static_cast<double>(f), &e);
  const double rounded = e - 8 >= -133 ? std::ldexp(std::nearbyint(std::ldexp(static_cast<double>(f), 8 - e)), e - 8)
                                       : std::ldexp(std::nearbyint(std::ldexp(static_cast<double>(f), 133)), -133);
  if (std::fabs(rounded) >= 0x1p128) return static_cast<uint16_t>(sign | 0x7F7F);
  const float value = static_cast<float>(rounded);  // exact: 8 significant bits
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return static_cast<uint16_t>((bits >> 16) | sign);  // | sign: a zero keeps f's sign
}

FUZZ_NO_COVERAGE inline bool bf16_is_nan(uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0; }

// A bfloat16 drawn as draw_half draws halves: a special pattern (Inf, NaNs, the largest, the
// smallest subnormal, -0, one) or an ordinary value rounded.
FUZZ_NO_COVERAGE inline uint16_t draw_bf16(Rng& rng, const ValueStyle& s) {
  if (s.special_rate != 0 && rng.below(256) < s.special_rate) {
    return kSpecialBFloat16s[rng.below(sizeof kSpecialBFloat16s / sizeof kSpecialBFloat16s[0])];
  }
  return narrow_bf16(draw_float(rng, ValueStyle{s.seed, s.exponent, 0, s.small_integers}));
}

// The first element past the last one a [n0, n1, n2, n3] tensor with these strides reaches,
// inner dimension n3 contiguous; 0 for an empty tensor.
inline size_t extent(int64_t n0, int64_t n1, int64_t n2, int64_t n3, int64_t s0, int64_t s1, int64_t s2) {
  if (n0 < 1 || n1 < 1 || n2 < 1 || n3 < 1) return 0;
  return static_cast<size_t>((n0 - 1) * s0 + (n1 - 1) * s1 + (n2 - 1) * s2 + n3);
}

// Strides of a [B, H, L, D] tensor from one byte: bit 0 the layout ([B, H, L, D] or
// [B, L, H, D]), bits 1-6 padding added to each stride, bit 7 (inputs only) one zero stride.
struct Layout {
  int64_t b = 0, h = 0, l = 0;
  size_t size = 0;
};
inline Layout make_layout(int64_t B, int64_t H, int64_t L, int64_t D, uint8_t byte, bool input) {
  const int64_t pad_l = (byte >> 1) & 3, pad_h = (byte >> 3) & 3, pad_b = (byte >> 5) & 3;
  Layout t;
  if ((byte & 1) == 0) {
    t.l = D + pad_l, t.h = L * t.l + pad_h, t.b = H * t.h + pad_b;
  } else {
    t.h = D + pad_h, t.l = H * t.h + pad_l, t.b = L * t.l + pad_b;
  }
  if (input && (byte & 0x80) != 0) {
    int64_t* axis[] = {&t.b, &t.h, &t.l};
    *axis[pad_b % 3] = 0;  // every batch / head / position reads the same elements
  }
  t.size = extent(B, H, L, D, t.b, t.h, t.l);
  return t;
}

// Floats in the output and weights before the call: a NaN no computation produces (its
// payload has low bits set, which no widened half and no default NaN has), so "still the
// sentinel" means "not written".
inline float sentinel() {
  const uint32_t bits = 0x7FA5A5A5u;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline bool is_sentinel(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits == 0x7FA5A5A5u;
}
inline uint32_t float_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}
// Bitwise equality, except that any NaN equals any NaN (payloads are not part of a contract).
inline bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || float_bits(a) == float_bits(b);
}

}  // namespace sdpa_fuzz
