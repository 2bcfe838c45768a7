// The bfloat16 <-> float32 conversions (src/math/bf16-f32-cvt-wasmsimd.h) against definitions
// written here from the format, independently of the header:
//   1. widening: all 65536 patterns, scalar and every SIMD form (4 at a time, 8 in order, 8 as
//      even and odd), in every lane and at every 2-byte alignment;
//   2. narrowing: f32_to_bf16 against a nearest-value search in double (ties to the even
//      pattern, saturation past the largest finite bfloat16, Inf and NaN), and the SIMD form
//      against the scalar one in every lane.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "math/bf16-f32-cvt-wasmsimd.h"

#include "attention-test-case.h"

namespace sdpa {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

using test::bits_of;
using test::float_of;

bool is_nan_bf16(uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0; }

// A bfloat16's value from its fields (sign s, 8-bit exponent e biased by 127, 7-bit mantissa m),
// with std::ldexp: e = 0: m·2^-133; e in 1..254: (128 + m)·2^(e-134); e = 255: Inf or NaN.
double bf16_value(uint16_t b) {
  const double sign = (b & 0x8000) != 0 ? -1.0 : 1.0;
  const int e = (b >> 7) & 0xFF, m = b & 0x7F;
  if (e == 255) return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::nan("");
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), -133);
  return sign * std::ldexp(static_cast<double>(128 + m), e - 134);
}

// ---------------------------------------------------------------------------------------
// 1. Widening.
// ---------------------------------------------------------------------------------------

TEST(BF16Widening, ScalarEqualsTheDefinitionForEveryPattern) {
  for (uint32_t i = 0; i < 65536; i++) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = bf16_to_f32(b);
    if (is_nan_bf16(b)) {
      // NaN: sign, all-ones exponent and the payload kept in float32's top mantissa bits.
      ASSERT_EQ(bits_of(f), i << 16) << std::hex << i;
    } else {
      ASSERT_EQ(static_cast<double>(f), bf16_value(b)) << std::hex << i;
      ASSERT_EQ(std::signbit(f), (b & 0x8000) != 0) << std::hex << i;  // -0 stays -0
    }
  }
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(bf16_to_f32(0x7F7F), 0x1.FEp127f);  // the largest finite
  EXPECT_EQ(bf16_to_f32(0x0001), 0x1p-133f);    // the smallest subnormal
  EXPECT_EQ(bf16_to_f32(0x7F80), kInf);
  EXPECT_EQ(bf16_to_f32(0xFF80), -kInf);
}

// The 65536 patterns laid out in memory in the order i·order (odd: a permutation, so each
// pattern has varied neighbours), read at each of 8 offsets (every 2-byte alignment of a
// 16-byte load) by `load` into `lanes` floats, each lane's bits against the scalar widening.
template <typename Load>
void expect_every_pattern_in_every_lane(int lanes, Load load, uint32_t order) {
  std::vector<uint16_t> mem(65536 + 16);
  for (uint32_t i = 0; i < mem.size(); i++) mem[i] = static_cast<uint16_t>(i * order);
  for (int offset = 0; offset < 8; offset++) {
    for (uint32_t at = static_cast<uint32_t>(offset); at + 8 <= 65536 + static_cast<uint32_t>(offset); at += lanes) {
      float out[8];
      int index[8];  // which element each output lane holds, relative to `at`
      load(&mem[at], out, index);
      for (int l = 0; l < lanes; l++) {
        const uint16_t b = mem[at + static_cast<uint32_t>(index[l])];
        ASSERT_EQ(bits_of(out[l]), bits_of(bf16_to_f32(b)))
            << std::hex << "pattern 0x" << b << std::dec << " lane " << l << " offset " << offset;
      }
    }
  }
}

TEST(BF16Widening, EverySimdFormGivesTheScalarBitsForEveryPatternLaneAndAlignment) {
  for (uint32_t order : {1u, 40503u}) {
    expect_every_pattern_in_every_lane(4, [](const uint16_t* p, float* out, int* index) {
      wasm_v128_store(out, bf16x4_load_as_f32(p));
      for (int l = 0; l < 4; l++) index[l] = l;
    }, order);
    expect_every_pattern_in_every_lane(8, [](const uint16_t* p, float* out, int* index) {
      v128_t first, second;
      bf16x8_load_as_f32(p, &first, &second);
      wasm_v128_store(out, first), wasm_v128_store(out + 4, second);
      for (int l = 0; l < 8; l++) index[l] = l;
    }, order);
    expect_every_pattern_in_every_lane(8, [](const uint16_t* p, float* out, int* index) {
      v128_t even, odd;
      bf16x8_load_even_odd_as_f32(p, wasm_i32x4_splat(static_cast<int32_t>(0xFFFF0000u)), &even, &odd);
      wasm_v128_store(out, even), wasm_v128_store(out + 4, odd);
      const int order_of_lanes[8] = {0, 2, 4, 6, 1, 3, 5, 7};
      for (int l = 0; l < 8; l++) index[l] = order_of_lanes[l];
    }, order);
  }
}

// ---------------------------------------------------------------------------------------
// 2. Narrowing.
// ---------------------------------------------------------------------------------------

// The header's contract by search: x (finite) goes to the finite bfloat16 nearest by value,
// a tie to the one whose pattern is even; |x| past the largest finite bfloat16 by half its ulp
// or more (where IEEE rounding would give Inf) saturates to ±0x7F7F; ±Inf stays ±Inf; a zero
// result keeps x's sign; NaN gives a quiet NaN with x's sign. The two candidates are found
// from the value alone (the magnitude's floor and ceiling in bfloat16 steps, via frexp), not
// from the float's bits.
uint16_t nearest_bf16(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return 0;  // not used (see expect_narrows)
  if (std::isinf(x)) return static_cast<uint16_t>(sign | 0x7F80);
  const double a = std::fabs(static_cast<double>(x));
  if (a >= bf16_value(0x7F7F) + std::ldexp(1.0, 127 - 8)) return static_cast<uint16_t>(sign | 0x7F7F);
  if (a == 0.0) return sign;
  // The bfloat16 step at a: 2^(exponent - 8) for normals (8 significant bits), 2^-133 below 2^-126.
  int exponent;
  std::frexp(a, &exponent);  // a = f·2^exponent, f in [0.5, 1)
  const double step = std::ldexp(1.0, std::max(exponent - 8, -133));
  const double below = std::floor(a / step) * step, above = below + step;
  auto pattern = [&](double v) {
    // The pattern of a finite non-negative bfloat16 value v (v is one, by construction).
    const uint16_t b = static_cast<uint16_t>(bits_of(static_cast<float>(v)) >> 16);
    EXPECT_EQ(bf16_value(b), v);
    return b;
  };
  const uint16_t lo = pattern(below);
  if (a - below < above - a) return static_cast<uint16_t>(sign | lo);
  if (a - below > above - a) return static_cast<uint16_t>(sign | pattern(above));
  return static_cast<uint16_t>(sign | ((lo & 1) == 0 ? lo : pattern(above)));
}

void expect_narrows(float x) {
  const uint16_t got = f32_to_bf16(x);
  if (std::isnan(x)) {
    ASSERT_TRUE(is_nan_bf16(got) && (got & 0x0040) != 0) << std::hex << bits_of(x) << " -> " << got;
    ASSERT_EQ((got & 0x8000) != 0, std::signbit(x));
    return;
  }
  ASSERT_EQ(got, nearest_bf16(x)) << x << " (bits 0x" << std::hex << bits_of(x) << ")";
}

// Floats around every rounding boundary: each finite bfloat16 b, the midpoint to the next
// (a tie), and one float ulp either side of b and of the midpoint; every float exponent, both
// signs, subnormals and the saturation edge included; plus NaN, Inf and a million random bits.
std::vector<float> boundary_floats() {
  std::vector<float> xs;
  for (uint32_t i = 0; i < 65536; i++) {
    const uint16_t b = static_cast<uint16_t>(i);
    if ((b & 0x7F80) == 0x7F80) continue;  // Inf, NaN: below
    const uint32_t bits = i << 16;
    for (uint32_t delta : {0u, 1u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) xs.push_back(float_of(bits + delta));
  }
  const float special[] = {kInf, -kInf, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                           float_of(0x7F800001u), float_of(0xFFC12345u), std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(), float_of(0x7F7F8000u), float_of(0x7F7F7FFFu),
                           std::numeric_limits<float>::denorm_min(), -0.0f, 0.0f};
  xs.insert(xs.end(), std::begin(special), std::end(special));
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; i++) xs.push_back(float_of(static_cast<uint32_t>(rng())));
  return xs;
}

TEST(BF16Narrowing, ScalarRoundsToTheNearestTiesToEvenAndSaturates) {
  for (float x : boundary_floats()) expect_narrows(x);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(float_of(0x3F808000u)), 0x3F80);  // tie, 0x3F80 even: down
  EXPECT_EQ(f32_to_bf16(float_of(0x3F818000u)), 0x3F82);  // tie, 0x3F81 odd: up
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F7F);   // saturates, not Inf
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::max()), 0xFF7F);
  EXPECT_EQ(f32_to_bf16(float_of(0x7F7F7FFFu)), 0x7F7F);  // just under the midpoint: rounds down
  EXPECT_EQ(f32_to_bf16(kInf), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-kInf), 0xFF80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(float_of(0x7F800001u)), 0x7FC0);  // signalling NaN made quiet
}

TEST(BF16Narrowing, SimdEqualsScalarInEveryLane) {
  const std::vector<float> xs = boundary_floats();
  const F32ToBF16Constants c = make_f32_to_bf16_constants();
  for (size_t i = 0; i + 8 <= xs.size(); i += 3) {  // overlapping windows: each value in several lanes
    uint16_t got[8];
    f32x8_store_as_bf16(got, &xs[i], c);
    for (int l = 0; l < 8; l++) {
      ASSERT_EQ(got[l], f32_to_bf16(xs[i + static_cast<size_t>(l)]))
          << std::hex << "float bits 0x" << bits_of(xs[i + static_cast<size_t>(l)]) << std::dec << " lane " << l;
    }
  }
}

TEST(BF16Narrowing, EveryBFloat16RoundTrips) {
  for (uint32_t i = 0; i < 65536; i++) {
    const uint16_t b = static_cast<uint16_t>(i);
    if (is_nan_bf16(b)) continue;
    ASSERT_EQ(f32_to_bf16(bf16_to_f32(b)), b) << std::hex << i;
  }
}

}  // namespace
}  // namespace sdpa
