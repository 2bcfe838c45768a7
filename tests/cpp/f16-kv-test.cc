// The float16 KV cache (and the kernel's and copy_rows' bfloat16 storage, section 4), natively:
//   1. the half <-> float conversions (src/math/f16-f32-cvt-wasmsimd.h) against definitions
//      written here from the IEEE 754 binary16 format, independently of the header;
//   2. the kernel reading float16 K/V (Problem::kv_type = kFloat16) in the cache's storage
//      layout (src/kv-cache.h) against the double-precision reference, which decodes the
//      halves itself, and against the float32 kernel on the widened halves (bitwise);
//   3. copy_rows (src/kv-cache.h), the row copies and conversions of cache appends.
// Shapes come from the tile sizes in src/tiles.h, as in sdpa-forward-test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kv-cache.h"
#include "math/bf16-f32-cvt-wasmsimd.h"
#include "math/f16-f32-cvt-wasmsimd.h"
#include "parallel/thread-pool.h"
#include "reference/sdpa-reference.h"
#include "sdpa.h"
#include "tiles.h"

#include "attention-test-case.h"

namespace sdpa {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr uint16_t kHalfNaN = 0x7E00;      // the quiet NaN written into padding
constexpr uint16_t kHalfMax = 0x7BFF;      // 65504, the largest finite half
constexpr uint16_t kHalfNegInf = 0xFC00;
constexpr uint16_t kBFloat16NaN = 0x7FC0;
constexpr uint16_t kBFloat16NegInf = 0xFF80;
constexpr int kFiniteHalves = 2 * 31744;   // 63488: e < 31, either sign (with ±0)

using test::bits_of;
using test::float_of;

// Bitwise equality of two float vectors (NaN included); memcmp is not called on empty ones
// (their data() may be null, which UBSan reports).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

bool is_nan_half(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0; }

// A 16-bit K/V element of `type` (kFloat16 or kBFloat16): NaN, -Inf, its float32 value.
uint16_t nan_element(KvType type) { return type == KvType::kBFloat16 ? kBFloat16NaN : kHalfNaN; }
uint16_t neg_inf_element(KvType type) { return type == KvType::kBFloat16 ? kBFloat16NegInf : kHalfNegInf; }
float widened(KvType type, uint16_t e) { return type == KvType::kBFloat16 ? bf16_to_f32(e) : f16_to_f32(e); }

// The value of a half straight from the format (sign s, exponent e, mantissa m), with
// std::ldexp: nothing shared with the header's bit manipulations.
//   e = 0: m·2^-24;  e in 1..30: (1024 + m)·2^(e-25);  e = 31: Inf (m = 0) or NaN.
double half_value(uint16_t h) {
  const double sign = (h & 0x8000) != 0 ? -1.0 : 1.0;
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 31) return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::nan("");
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), -24);
  return sign * std::ldexp(static_cast<double>(1024 + m), e - 25);
}

// The float32 bits a widening must produce for h: the value above, converted to float
// (exact: 11 significant bits, exponents well inside float's range); for NaN, the sign,
// an all-ones exponent and the payload m moved to the top of float's mantissa.
uint32_t expected_widened_bits(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 31 && m != 0) return (static_cast<uint32_t>(h & 0x8000) << 16) | 0x7F800000u | (uint32_t(m) << 13);
  return bits_of(static_cast<float>(half_value(h)));
}

// ---------------------------------------------------------------------------------------
// 1a. Widening: all 65536 half patterns, scalar and SIMD, bitwise.
// ---------------------------------------------------------------------------------------

TEST(F16Widening, ScalarEqualsTheDefinitionForEveryPattern) {
  for (uint32_t i = 0; i < 65536; i++) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = f16_to_f32(h);
    ASSERT_EQ(bits_of(f), expected_widened_bits(h)) << std::hex << "half 0x" << i;
    if (is_nan_half(h)) {  // spelled out: NaN, same sign, payload kept
      ASSERT_TRUE(std::isnan(f)) << std::hex << "half 0x" << i;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << "half 0x" << i;
      ASSERT_EQ((bits_of(f) >> 13) & 0x3FF, h & 0x3FFu) << std::hex << "half 0x" << i;
    }
  }
  // A few landmarks, by value.
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(f16_to_f32(kHalfMax), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);   // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03FF), 1023 * 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x0400), 0x1p-14f);   // smallest normal
  EXPECT_EQ(f16_to_f32(0x7C00), kInf);
  EXPECT_EQ(f16_to_f32(0xFC00), -kInf);
  EXPECT_EQ(bits_of(f16_to_f32(0x8000)), 0x80000000u);  // -0 stays -0
}

TEST(F16Widening, SimdEqualsScalarForEveryPatternInEveryLaneAndAtUnalignedAddresses) {
  // f16x4_load_as_f32 reads 8 bytes at any 2-byte alignment. The patterns 0..65535 are laid
  // out in order starting `misalign` halves past a 16-byte boundary (0, 2, 4, 6 bytes: only 0
  // is 8-byte aligned), and read 4 at a time starting at pattern `phase`, so every pattern
  // passes through every lane at every alignment.
  struct alignas(16) Buffer { uint16_t h[65536 + 8]; };
  const auto buffer = std::make_unique<Buffer>();
  std::vector<uint32_t> expected(65536);
  for (uint32_t i = 0; i < 65536; i++) expected[i] = expected_widened_bits(static_cast<uint16_t>(i));
  const F16Constants c = make_f16_constants();
  for (int misalign = 0; misalign < 4; misalign++) {
    uint16_t* const patterns = buffer->h + misalign;
    ASSERT_EQ(reinterpret_cast<uintptr_t>(patterns) % 8, uintptr_t(2 * misalign));
    for (uint32_t i = 0; i < 65536; i++) patterns[i] = static_cast<uint16_t>(i);
    for (uint32_t phase = 0; phase < 4; phase++) {
      for (uint32_t i = phase; i + 4 <= 65536; i += 4) {
        alignas(16) float out[4];
        wasm_v128_store(out, f16x4_load_as_f32(patterns + i, c));
        for (uint32_t lane = 0; lane < 4; lane++) {
          const uint32_t h = i + lane;
          ASSERT_EQ(bits_of(out[lane]), expected[h])
              << std::hex << "half 0x" << h << std::dec << " lane " << lane << " misalign " << misalign;
          ASSERT_EQ(bits_of(out[lane]), bits_of(f16_to_f32(static_cast<uint16_t>(h))));
        }
      }
    }
  }
}

TEST(F16Widening, InPlaceWideningOfTheUpperHalfGivesEveryPatternsBitsAndTouchesNothingElse) {
  // f16_widen_in_place(block, count): halves in bytes [2·count, 4·count) of the block become
  // its count floats. Counts around the 4-lane steps (odd ones put the halves 2 bytes past a
  // 4-byte boundary) and all 65536 patterns at once, rotated so each count sees other patterns;
  // blocks at each 4-byte offset from a 16-byte boundary; a guard float on each side.
  constexpr uint32_t kGuard = 0x7FC0DEADu;
  for (const int64_t count : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{7},
                              int64_t{8}, int64_t{9}, int64_t{12}, int64_t{13}, int64_t{31}, int64_t{65536},
                              int64_t{65536 + 3}}) {
    for (int offset = 0; offset < 4; offset++) {
      std::vector<float> storage(static_cast<size_t>(count) + 8);
      float* const block = storage.data() + 4 + offset - (reinterpret_cast<uintptr_t>(storage.data()) % 16) / 4;
      ASSERT_GE(block, storage.data() + 1);
      ASSERT_LE(block + count + 1, storage.data() + storage.size());
      std::vector<uint16_t> halves(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; i++) halves[i] = static_cast<uint16_t>(i * 7 + count + 31 * offset);
      if (count >= 65536) {  // 7 is odd: i·7 runs through every residue modulo 2^16, Inf and NaN included
        ASSERT_EQ(std::set<uint16_t>(halves.begin(), halves.end()).size(), 65536u);
      }
      if (count > 0) std::memcpy(reinterpret_cast<unsigned char*>(block) + 2 * count, halves.data(), 2 * halves.size());
      std::memcpy(block - 1, &kGuard, 4);
      std::memcpy(block + count, &kGuard, 4);
      f16_widen_in_place(block, count);
      for (int64_t i = 0; i < count; i++) {
        ASSERT_EQ(bits_of(block[i]), expected_widened_bits(halves[i]))
            << std::hex << "half 0x" << halves[i] << std::dec << " at " << i << " of " << count << ", offset " << offset;
      }
      uint32_t before, after;
      std::memcpy(&before, block - 1, 4);
      std::memcpy(&after, block + count, 4);
      EXPECT_EQ(before, kGuard) << count;
      EXPECT_EQ(after, kGuard) << count;
    }
  }
}

// Every half pattern but Inf and NaN (e < 31), through `load` (four halves → four floats) at
// each of the 4 phases of alignment, every lane's bits against expected_bits(half).
template <typename Load, typename Expected>
void expect_every_finite_pattern_in_every_lane(Load load, Expected expected_bits) {
  std::vector<uint16_t> finite;
  for (uint32_t i = 0; i < 65536; i++) {
    if ((i & 0x7C00) != 0x7C00) finite.push_back(static_cast<uint16_t>(i));
  }
  ASSERT_EQ(finite.size(), 65536u - 2048u);
  const F16Constants c = make_f16_constants();
  for (uint32_t phase = 0; phase < 4; phase++) {
    for (size_t i = phase; i + 4 <= finite.size(); i += 4) {
      alignas(16) float out[4];
      wasm_v128_store(out, load(finite.data() + i, c));
      for (uint32_t lane = 0; lane < 4; lane++) {
        ASSERT_EQ(bits_of(out[lane]), expected_bits(finite[i + lane])) << std::hex << "half 0x" << finite[i + lane];
      }
    }
  }
}

TEST(F16Widening, FiniteWideningEqualsScalarForEveryPatternButInfAndNaN) {
  // f16x4_load_finite_as_f32 (the kernel's kFloat16Finite packing path) skips the e = 31
  // fix-up: it must equal the exact widening on every other pattern, in every lane.
  expect_every_finite_pattern_in_every_lane(f16x4_load_finite_as_f32, expected_widened_bits);
}

TEST(F16Widening, ScaledWideningIsTheValueTimes2ToTheMinus112ForEveryPatternButInfAndNaN) {
  // f16x4_load_finite_as_f32_times_2_minus_112 (the kFloat16Finite decode path, which
  // multiplies q and p by 2^112 instead) must give value·2^-112 exactly: a float for every
  // finite half (at least 2^-136 in magnitude, above float's 2^-149), ±0 keeping its sign.
  expect_every_finite_pattern_in_every_lane(f16x4_load_finite_as_f32_times_2_minus_112, [](uint16_t h) {
    const double scaled = std::ldexp(half_value(h), -112);
    EXPECT_EQ(static_cast<double>(static_cast<float>(scaled)), scaled) << "not a float: half 0x" << std::hex << h;
    return bits_of(static_cast<float>(scaled));
  });
}

// An 8-half load (load8(p, c, &first, &second)) against the 4-lane form: lane l of first, then
// of second, must have the bits f16x4_load_finite_as_f32_times_2_minus_112 gives the half at
// p + half_of_lane(l), for all 65536 patterns (Inf and NaN included: both forms leave them to
// the caller), every pattern through each of the 8 positions, at every 2-byte alignment; and
// for every finite half, the bits of value·2^-112 (the oracle of the 4-lane form too). The
// patterns lie in memory in the order i·order (odd order: a permutation), so that with order
// != 1 each half has varied neighbours.
template <typename Load8, typename HalfOfLane>
void expect_eight_halves_match_the_four_half_load(Load8 load8, HalfOfLane half_of_lane, uint32_t order) {
  struct alignas(16) Buffer { uint16_t h[65536 + 16]; };
  const auto buffer = std::make_unique<Buffer>();
  const F16Constants c = make_f16_constants();
  for (int misalign = 0; misalign < 8; misalign++) {
    uint16_t* const patterns = buffer->h + misalign;
    for (uint32_t i = 0; i < 65536; i++) patterns[i] = static_cast<uint16_t>(i * order);
    for (uint32_t phase = 0; phase < 8; phase++) {
      for (uint32_t i = phase; i + 8 <= 65536; i += 8) {
        v128_t first, second;
        load8(patterns + i, c, &first, &second);
        alignas(16) uint32_t got[8];
        wasm_v128_store(got, first), wasm_v128_store(got + 4, second);
        for (int lane = 0; lane < 8; lane++) {
          const int half = half_of_lane(lane);
          const uint16_t h = patterns[i + half];
          alignas(16) uint32_t want[4];
          wasm_v128_store(want, f16x4_load_finite_as_f32_times_2_minus_112(patterns + i + half, c));
          ASSERT_EQ(got[lane], want[0]) << std::hex << "half 0x" << h << std::dec << " position " << half
                                        << " misalign " << misalign;
          if ((h & 0x7C00) != 0x7C00) {
            const float scaled = static_cast<float>(std::ldexp(half_value(h), -112));
            ASSERT_EQ(got[lane], bits_of(scaled)) << std::hex << "half 0x" << h;
          }
        }
      }
    }
  }
}

TEST(F16Widening, EightHalvesAtOnceGiveTheBitsOfTwoFourHalfLoadsForEveryPattern) {
  // f16x8_load_finite_as_f32_times_2_minus_112 (GQA's P·V, pv_block) builds the same integer
  // function of each half in 16-bit lanes: halves 0..3, then 4..7.
  expect_eight_halves_match_the_four_half_load(f16x8_load_finite_as_f32_times_2_minus_112,
                                               [](int lane) { return lane; }, 1);
}

TEST(F16Widening, EvenAndOddHalvesGiveTheBitsOfTheFourHalfLoadForEveryPatternAndNeighbour) {
  // f16x8_load_finite_even_odd_as_f32_times_2_minus_112 (the float16 MHA decode's loops): halves
  // 0, 2, 4, 6, then 1, 3, 5, 7. Each 32-bit lane of its load holds two halves, and neither may
  // leak into the other: so the patterns in a permuted order (each beside varied neighbours).
  expect_eight_halves_match_the_four_half_load(f16x8_load_finite_even_odd_as_f32_times_2_minus_112,
                                               [](int lane) { return lane < 4 ? 2 * lane : 2 * (lane - 4) + 1; },
                                               40503u);
}

// ---------------------------------------------------------------------------------------
// 1b. Narrowing: f32_to_f16 against a nearest-half search.
// ---------------------------------------------------------------------------------------

// The rounding of the header's contract, by search instead of bit manipulation: every finite
// half decoded to double and sorted; x goes to the nearest by value, a tie to the one whose
// mantissa is even (bit 0 of the half clear; consecutive halves alternate). |x| > 65504
// (so also from 65520 on, where IEEE rounding would give Inf, and ±Inf) saturates to
// ±65504. A result of zero keeps x's sign. NaN is not handled here (see expect_narrows).
class NearestHalf {
 public:
  NearestHalf() {
    for (uint32_t i = 0; i < 65536; i++) {
      const uint16_t h = static_cast<uint16_t>(i);
      if (((h >> 10) & 0x1F) != 31) halves_.push_back({half_value(h), h});
    }
    std::sort(halves_.begin(), halves_.end());
  }
  size_t finite_count() const { return halves_.size(); }

  uint16_t operator()(float x) const {
    const double d = x;
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    if (std::abs(d) > 65504.0) return sign | kHalfMax;
    const auto hi = std::lower_bound(halves_.begin(), halves_.end(), std::make_pair(d, uint16_t{0}),
                                     [](const Entry& a, const Entry& b) { return a.first < b.first; });
    const Entry* chosen = &*hi;
    if (hi->first != d) {
      const Entry& lo = *(hi - 1);  // exists: d > -65504, the smallest entry
      const double below = d - lo.first, above = hi->first - d;
      if (below < above || (below == above && (lo.second & 1) == 0)) chosen = &lo;
    }
    if (chosen->first == 0.0) return sign;
    return chosen->second;
  }

 private:
  using Entry = std::pair<double, uint16_t>;
  std::vector<Entry> halves_;
};

const NearestHalf& nearest_half() {
  static const NearestHalf oracle;
  return oracle;
}

// f32_to_f16(x) is what the oracle says; for NaN, a quiet NaN half with x's sign.
::testing::AssertionResult narrows_correctly(float x) {
  const uint16_t got = f32_to_f16(x);
  if (std::isnan(x)) {
    const bool ok = is_nan_half(got) && (got & 0x0200) != 0 && ((got & 0x8000) != 0) == std::signbit(x);
    if (ok) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << std::hex << "NaN 0x" << bits_of(x) << " -> 0x" << got
                                         << ", want a quiet NaN half with the same sign";
  }
  const uint16_t want = nearest_half()(x);
  if (got == want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << std::hexfloat << x << std::hex << " (bits 0x" << bits_of(x)
                                       << ") -> 0x" << got << ", want 0x" << want;
}

TEST(F16Narrowing, TheOracleCoversEveryFiniteHalf) {
  EXPECT_EQ(nearest_half().finite_count(), size_t(kFiniteHalves));
}

TEST(F16Narrowing, EveryHalfRoundTripsAndSpecialValuesSaturate) {
  for (uint32_t i = 0; i < 65536; i++) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = f16_to_f32(h);
    if (is_nan_half(h)) {
      ASSERT_TRUE(narrows_correctly(f));
    } else if ((h & 0x7FFF) == 0x7C00) {  // ±Inf saturates to ±65504
      ASSERT_EQ(f32_to_f16(f), (h & 0x8000) | kHalfMax) << std::hex << "half 0x" << i;
    } else {                              // every finite half, ±0 included, comes back
      ASSERT_EQ(f32_to_f16(f), h) << std::hex << "half 0x" << i;
      ASSERT_TRUE(narrows_correctly(f));
    }
  }
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(kInf), kHalfMax);
  EXPECT_EQ(f32_to_f16(-kInf), 0x8000 | kHalfMax);
  EXPECT_EQ(f32_to_f16(1e30f), kHalfMax);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::max()), 0x8000 | kHalfMax);
  EXPECT_TRUE(narrows_correctly(kNaN));
  EXPECT_TRUE(narrows_correctly(-kNaN));
  EXPECT_TRUE(narrows_correctly(float_of(0x7F800001u)));  // signalling NaN: made quiet
  EXPECT_TRUE(narrows_correctly(float_of(0xFFBFFFFFu)));
}

TEST(F16Narrowing, MidpointsTieToEvenAndTheirNeighboursRoundToTheNearer) {
  // Between consecutive non-negative halves a < b (patterns h, h + 1) the midpoint has 12
  // significant bits, so it is a float exactly; it must go to the even pattern. The floats
  // just below and above it go to a and b. Then the same with the signs flipped. The last
  // gap, 65504 .. 65536 (the first non-finite pattern's value), has the midpoint 65520: it
  // and everything above saturate, everything below it rounds down to 65504.
  for (uint32_t h = 0; h < kHalfMax + 1u; h++) {
    const double a = half_value(static_cast<uint16_t>(h));
    const double b = h < kHalfMax ? half_value(static_cast<uint16_t>(h + 1)) : 65536.0;
    const double mid = (a + b) / 2;
    const float m = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(m), mid) << "midpoint above half " << h;
    const uint16_t lower = static_cast<uint16_t>(h);
    const uint16_t upper = h < kHalfMax ? static_cast<uint16_t>(h + 1) : kHalfMax;
    const uint16_t even = h < kHalfMax ? ((h & 1) == 0 ? lower : upper) : kHalfMax;
    const float below = std::nextafter(m, 0.0f), above = std::nextafter(m, kInf);
    for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const float s = sign != 0 ? -1.0f : 1.0f;
      ASSERT_EQ(f32_to_f16(s * m), sign | even) << std::hexfloat << "midpoint " << s * m;
      ASSERT_EQ(f32_to_f16(s * below), sign | lower) << std::hexfloat << "below midpoint " << s * below;
      ASSERT_EQ(f32_to_f16(s * above), sign | upper) << std::hexfloat << "above midpoint " << s * above;
      ASSERT_TRUE(narrows_correctly(s * m));
      ASSERT_TRUE(narrows_correctly(s * below));
      ASSERT_TRUE(narrows_correctly(s * above));
    }
  }
  EXPECT_EQ(f32_to_f16(65519.99f), kHalfMax);
  EXPECT_EQ(f32_to_f16(65520.0f), kHalfMax);
  EXPECT_EQ(f32_to_f16(2049.0f), 0x6800);   // 2048 | 2050: tie to 2048 (even)
  EXPECT_EQ(f32_to_f16(2051.0f), 0x6802);   // 2050 | 2052: tie to 2052 (even)
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // 0 | 2^-24: tie to 0
  EXPECT_EQ(f32_to_f16(-0x1p-25f), 0x8000);
  EXPECT_EQ(f32_to_f16(0x3p-25f), 0x0002);  // 2^-24 | 2^-23: tie to 2^-23
}

TEST(F16Narrowing, SubnormalRangeAndTinyValues) {
  // Every multiple of 2^-30 up to just past the smallest normal half (2^-14): 64 points per
  // subnormal step, including each quarter, half and three quarters of a step.
  for (uint32_t n = 0; n <= (1u << 16) + 64; n++) {
    const float x = std::ldexp(static_cast<float>(n), -30);
    ASSERT_TRUE(narrows_correctly(x));
    ASSERT_TRUE(narrows_correctly(-x));
  }
  // Random floats with magnitudes from 2^-40 to 2^-13, and float32 subnormals (to ±0).
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> mantissa(0, (1u << 23) - 1), exponent(127 - 40, 127 - 13);
  for (int n = 0; n < 100000; n++) {
    const uint32_t sign = (rng() & 1) << 31;
    ASSERT_TRUE(narrows_correctly(float_of(sign | (exponent(rng) << 23) | mantissa(rng))));
    ASSERT_TRUE(narrows_correctly(float_of(sign | mantissa(rng))));
  }
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-14f, 0.0f)), 0x0400);  // rounds up to the smallest normal
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);
}

TEST(F16Narrowing, MillionRandomFloatsOverWideExponentRanges) {
  // Exponents from 2^-40 (to zero) to 2^24 (saturation), both signs, every mantissa bit;
  // one draw in eight is a raw 32-bit pattern (NaN, Inf, anything).
  std::mt19937 rng(2024);
  std::uniform_int_distribution<uint32_t> mantissa(0, (1u << 23) - 1), exponent(127 - 40, 127 + 24);
  for (int n = 0; n < 1000000; n++) {
    const uint32_t raw = rng();
    const uint32_t bits = (n & 7) == 0 ? raw : (raw & 0x80000000u) | (exponent(rng) << 23) | mantissa(rng);
    ASSERT_TRUE(narrows_correctly(float_of(bits))) << "draw " << n;
  }
}

// f32x4_to_f16_bits (the SIMD narrowing of appends) on every value of `xs`, four lanes at a
// time, rotated so that each value goes through every lane: the same bits as f32_to_f16 in
// the low 16 bits of its lane, zeros above. Returns the number of values checked.
size_t expect_simd_narrowing_matches_scalar(const std::vector<float>& xs) {
  const F32ToF16Constants c = make_f32_to_f16_constants();
  size_t mismatches = 0;
  for (size_t i = 0; i < xs.size(); i++) {
    const size_t lane = i % 4;  // xs[i] in lane i % 4; its neighbours in the others
    float in[4];
    for (size_t l = 0; l < 4; l++) in[l] = xs[(i + l + xs.size() - lane) % xs.size()];
    uint32_t out[4];
    wasm_v128_store(out, f32x4_to_f16_bits(wasm_v128_load(in), c));
    const uint32_t want = f32_to_f16(xs[i]);
    if (out[lane] != want && mismatches++ < 10) {
      ADD_FAILURE() << std::hexfloat << xs[i] << std::hex << " (bits 0x" << bits_of(xs[i]) << ") in lane " << lane
                    << ": SIMD 0x" << out[lane] << ", scalar 0x" << want;
    }
  }
  EXPECT_EQ(mismatches, 0u);
  return xs.size();
}

TEST(F16Narrowing, SimdEqualsScalarOnEveryHalfMidpointAndNeighbour) {
  // Every pattern's value (NaN and Inf included), and for every gap between consecutive
  // non-negative halves its midpoint and the floats just below and above it, both signs.
  std::vector<float> xs;
  for (uint32_t i = 0; i < 65536; i++) xs.push_back(f16_to_f32(static_cast<uint16_t>(i)));
  for (uint32_t h = 0; h < kHalfMax + 1u; h++) {
    const double a = half_value(static_cast<uint16_t>(h));
    const double b = h < kHalfMax ? half_value(static_cast<uint16_t>(h + 1)) : 65536.0;
    const float m = static_cast<float>((a + b) / 2);
    for (float s : {1.0f, -1.0f}) {
      xs.push_back(s * m);
      xs.push_back(s * std::nextafter(m, 0.0f));
      xs.push_back(s * std::nextafter(m, kInf));
    }
  }
  EXPECT_EQ(expect_simd_narrowing_matches_scalar(xs), 65536u + 6u * (kHalfMax + 1u));
}

TEST(F16Narrowing, SimdEqualsScalarAroundEveryRoundingBoundaryAndOnRandomBits) {
  // Every sign, exponent and top-10 mantissa pattern (2^19 of them) with the 13 bits that
  // rounding drops at the edges of their range (0, 1, just under and over half, all ones);
  // the subnormal range in steps of 2^-30; and a million raw 32-bit patterns.
  std::vector<float> xs;
  for (uint32_t top = 0; top < (1u << 19); top++) {
    for (uint32_t low : {0x0u, 0x1u, 0xFFFu, 0x1000u, 0x1001u, 0x1FFFu}) xs.push_back(float_of(top << 13 | low));
  }
  for (uint32_t n = 0; n <= (1u << 16) + 64; n++) {
    xs.push_back(std::ldexp(static_cast<float>(n), -30));
    xs.push_back(-std::ldexp(static_cast<float>(n), -30));
  }
  std::mt19937 rng(77);
  for (int n = 0; n < 1000000; n++) xs.push_back(float_of(rng()));
  EXPECT_EQ(expect_simd_narrowing_matches_scalar(xs), 6u * (1u << 19) + 2u * ((1u << 16) + 65) + 1000000u);
}

// ---------------------------------------------------------------------------------------
// 2. The kernel on float16 K/V in the cache's storage layout.
// ---------------------------------------------------------------------------------------

// One float16 problem. K/V live in cache storage (src/kv-cache.h): keys [B, Hkv, max_len, E],
// values [B, Hkv, max_len, Ev] with max_len = Lk + extra_len, of which the problem uses the
// first Lk positions (kv_len = Lk). Query and output are dense [B, H, L, D].
struct F16Case {
  KvType type = KvType::kFloat16;    // kFloat16 or kBFloat16 (section 4)
  int B = 1, Hq = 1, Hkv = 1, Lq = 1, Lk = 1, E = 4, Ev = 4;
  int extra_len = 37;                // max_len - Lk: stored positions the problem must not read
  bool causal = false;
  std::vector<int32_t> offsets;      // one = for every batch; B = per batch
  int32_t window = 0;                // sliding window (with causal); 0 = none
  std::vector<int32_t> key_lengths;  // empty = none
  std::vector<int32_t> key_starts;   // empty = none
  std::vector<float> sinks;          // [Hq]; empty = none
  std::vector<float> alibi_slopes;   // [Hq] (stride 0) or [B, Hq] (stride Hq); empty = none
  bool float_mask = false;           // a float mask [B, 1, Lq, Lk] (broadcast over heads)
  double mask_block_fraction = 0.2;  // share of its entries that are -inf
  float softcap = 0.0f;
  bool weights = true;
  uint32_t seed = 1;

  std::string describe() const {
    std::ostringstream s;
 s << (type == KvType::kBFloat16 ? "bfloat16 " : "") << "B" << B << " Hq" << Hq << " Hkv" << Hkv << " Lq" << Lq << " Lk" << Lk << " E" << E << " Ev" << Ev
      << " max_len" << Lk + extra_len << (causal ? " causal" : "") << (window > 0 ? " window" + std::to_string(window) : "")
      << (key_lengths.empty() ? "" : " key_lengths") << (key_starts.empty() ? "" : " key_starts")
      << (sinks.empty() ? "" : " sinks") << (alibi_slopes.empty() ? "" : " alibi")
      << (float_mask ? " mask" : "") << " softcap" << softcap << (weights ? " weights" : "") << " seed" << seed;
    return s.str();
  }
};

struct F16Harness {
  F16Case c;
  int max_len;
  std::vector<float> q, mask, out, weights;
  std::vector<uint16_t> k, v;  // halves, cache storage
  std::vector<int32_t> offsets, key_lengths, key_starts;
  std::vector<float> sinks, alibi_slopes;
  Problem p;

  explicit F16Harness(const F16Case& cs) : c(cs), max_len(cs.Lk + cs.extra_len) {
    std::mt19937 rng(c.seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    q.resize(size_t(c.B) * c.Hq * c.Lq * c.E);
    for (float& x : q) x = normal(rng);
    // K/V: normal values rounded to halves, with one element in 64 a random subnormal half
    // (exercises the widening's e = 0 case inside the kernel). bfloat16: normal values rounded
    // to bfloat16 that a half holds exactly too (8 significant bits, |x| >= 2^-14 or 0), so
    // that to_float16() can give a float16 problem on the same values (section 4).
    auto half = [&] {
      if (c.type == KvType::kBFloat16) {
        for (;;) {
          const uint16_t b = f32_to_bf16(normal(rng));
          const float x = bf16_to_f32(b);
          if (x == 0.0f || std::fabs(x) >= 0x1p-14f) return b;
        }
      }
      const uint16_t h = f32_to_f16(normal(rng));
      if (rng() % 64 == 0) return static_cast<uint16_t>((h & 0x8000) | (1 + rng() % 1023));
      return h;
    };
    k.resize(size_t(c.B) * c.Hkv * max_len * c.E);
    v.resize(size_t(c.B) * c.Hkv * max_len * c.Ev);
    for (uint16_t& x : k) x = half();
    for (uint16_t& x : v) x = half();
    if (!c.key_lengths.empty()) {
      key_lengths = c.key_lengths;
      p.key_lengths = key_lengths.data();
    }
    if (!c.key_starts.empty()) {
      key_starts = c.key_starts;
      p.key_starts = key_starts.data();
    }
    if (!c.sinks.empty()) {
      sinks = c.sinks;
      p.sinks = sinks.data();
    }
    if (!c.alibi_slopes.empty()) {
      alibi_slopes = c.alibi_slopes;
      p.alibi_slopes = alibi_slopes.data();
      p.alibi_stride_b = int(alibi_slopes.size()) == c.Hq ? 0 : c.Hq;
    }
    // Positions no row may attend: past the batch's key length, past the causal frontier of
    // the last query row, before the batch's first key or the window of the first row, and [Lk, max_len) of the storage,
    // hold NaN (-Inf on every 4th key). Any read that reaches the arithmetic shows up as NaN
    // in the output.
    for (int b = 0; b < c.B; b++) {
      int valid = key_lengths.empty() ? c.Lk : key_lengths[size_t(b)];
      int first = key_starts.empty() ? 0 : key_starts[size_t(b)];
      if (c.causal) {
        const int64_t offset = c.offsets.size() > 1 ? c.offsets[size_t(b)] : c.offsets.at(0);
        if (c.window > 0) first = std::max(first, int(std::clamp<int64_t>(offset + 1 - c.window, 0, valid)));  // row 0 sees j > offset - W
        valid = int(std::clamp<int64_t>(c.Lq + offset, 0, valid));  // last row sees j <= Lq - 1 + offset
      }
      for (int h = 0; h < c.Hkv; h++)
        for (int j = 0; j < max_len; j++) {
          if (j >= first && j < valid) continue;
          const uint16_t pad = j % 4 == 3 ? neg_inf_element(c.type) : nan_element(c.type);
          for (int d = 0; d < c.E; d++) key_at(b, h, j, d) = pad;
          for (int d = 0; d < c.Ev; d++) value_at(b, h, j, d) = pad;
        }
    }
    out.assign(size_t(c.B) * c.Hq * c.Lq * c.Ev, kNaN);  // NaN: every element must be written
    if (c.weights) weights.assign(size_t(c.B) * c.Hq * c.Lq * c.Lk, kNaN);

    p.batch = c.B, p.q_heads = c.Hq, p.kv_heads = c.Hkv, p.q_len = c.Lq, p.kv_len = c.Lk;
    p.head_dim = c.E, p.value_dim = c.Ev;
    p.query = q.data();
    p.q_stride_b = int64_t(c.Hq) * c.Lq * c.E, p.q_stride_h = int64_t(c.Lq) * c.E, p.q_stride_l = c.E;
    p.kv_type = c.type;
    p.key = k.data();
    p.k_stride_b = int64_t(c.Hkv) * max_len * c.E, p.k_stride_h = int64_t(max_len) * c.E, p.k_stride_l = c.E;
    p.value = v.data();
    p.v_stride_b = int64_t(c.Hkv) * max_len * c.Ev, p.v_stride_h = int64_t(max_len) * c.Ev, p.v_stride_l = c.Ev;
    p.output = out.data();
    p.o_stride_b = int64_t(c.Hq) * c.Lq * c.Ev, p.o_stride_h = int64_t(c.Lq) * c.Ev, p.o_stride_l = c.Ev;
    p.weights = c.weights ? weights.data() : nullptr;
    p.scale = 1.0f / std::sqrt(float(c.E));
    p.softcap = c.softcap;
    if (c.float_mask) {
      mask.resize(size_t(c.B) * c.Lq * c.Lk);
      for (float& m : mask) m = u(rng) < c.mask_block_fraction ? -kInf : normal(rng);
      p.mask_kind = MaskKind::kFloat;
      p.mask = mask.data();
      p.mask_stride_b = int64_t(c.Lq) * c.Lk, p.mask_stride_h = 0, p.mask_stride_q = c.Lk, p.mask_stride_k = 1;
    }
    p.causal = c.causal;
    p.sliding_window = c.window;
    if (c.offsets.size() == 1) p.causal_offset = c.offsets[0];
    if (c.offsets.size() > 1) {
      offsets = c.offsets;
      p.causal_offsets = offsets.data();
    }
  }

  uint16_t& key_at(int b, int h, int j, int d) {
    return k[size_t(((int64_t(b) * c.Hkv + h) * max_len + j) * c.E + d)];
  }
  uint16_t& value_at(int b, int h, int j, int d) {
    return v[size_t(((int64_t(b) * c.Hkv + h) * max_len + j) * c.Ev + d)];
  }

  Status run(ThreadPool* pool = nullptr) {
    const int threads = pool != nullptr ? pool->threads() : 1;
    std::vector<float> scratch(scratch_floats(p, threads));
    return forward(p, scratch.data(), scratch.size(), pool);
  }

  // The metric of sdpa-forward-test.cc: |got - ref| <= tol·(1 + |ref|) for the output,
  // |got - ref| <= tol for the weights. The reference decodes the halves itself.
  void expect_matches_reference(double tol = 2e-5) const {
    std::vector<double> ref_w;
    const std::vector<double> ref = reference_forward(p, c.weights ? &ref_w : nullptr);
    for (size_t n = 0; n < ref.size(); n++) {
      const double err = std::abs(out[n] - ref[n]) / (1.0 + std::abs(ref[n]));
      ASSERT_TRUE(std::isfinite(out[n]) && err <= tol)
          << c.describe() << "\n output[" << n << "] got " << out[n] << " ref " << ref[n];
    }
    for (size_t n = 0; n < ref_w.size(); n++) {
      const double err = std::abs(weights[n] - ref_w[n]);
      ASSERT_TRUE(std::isfinite(weights[n]) && err <= tol)
          << c.describe() << "\n weights[" << n << "] got " << weights[n] << " ref " << ref_w[n];
    }
  }
};

// Runs h's problem on float32 copies of its halves, in the same storage layout (the float32
// instantiation of the same path), against the reference; h.p points at the halves again after.
void expect_float32_copies_match_reference(F16Harness& h, const std::string& what) {
  std::vector<float> k32(h.k.size()), v32(h.v.size());
  const auto widen = [&](uint16_t e) { return widened(h.c.type, e); };
  std::transform(h.k.begin(), h.k.end(), k32.begin(), widen);
  std::transform(h.v.begin(), h.v.end(), v32.begin(), widen);
  std::fill(h.out.begin(), h.out.end(), kNaN);
  const Problem halves = h.p;
  h.p.kv_type = KvType::kFloat32, h.p.key = k32.data(), h.p.value = v32.data();
  ASSERT_EQ(h.run(), Status::kOk) << what;
  h.expect_matches_reference();
  h.p = halves;
}

// Runs the case against the reference. A decode (K/V read in place) also runs with
// read_kv_in_order (the KV cache's reading order: keys one at a time in memory order, V rows
// streamed by P·V for one row per KV head, else touched as their keys are scored), against the
// reference too, and on float32 copies of the halves as well.
void check(const F16Case& c, bool expect_in_place) {
  F16Harness h(c);
  ASSERT_EQ(reads_keys_in_place(h.p), expect_in_place) << c.describe();
  ASSERT_EQ(h.run(), Status::kOk) << c.describe();
  h.expect_matches_reference();
  if (!expect_in_place) return;
  F16Harness in_order(c);
  in_order.p.read_kv_in_order = true;
  ASSERT_EQ(in_order.run(), Status::kOk) << c.describe() << " in order";
  in_order.expect_matches_reference();
  // Float32 K/V in the same storage layout, in order: the float32 instantiation of that path.
  expect_float32_copies_match_reference(in_order, c.describe() + " in order, float32");
}

const int kKeyLengths[] = {1, 7, kKeyTile - 1, kKeyTile, kKeyTile + 1, 2 * kKeyTile + 1, 1100};
const int kHeadDims[] = {1, 3, 4, kValueBlock, 64, 67, 128};

// Decode: Lq = 1 with GQA (8 query heads on 2 KV heads: one row tile per KV head) and MHA;
// K/V are read in place (widened as loaded), and without weights Lk > 512 is split
// into segments. Each key length with two (E, Ev) pairs and every option that blocks keys.
TEST(F16Kernel, DecodeReadsHalvesInPlaceAroundTileEdges) {
  uint32_t seed = 1;
  int pair = 0;
  for (int lk : kKeyLengths)
    for (auto heads : {std::pair<int, int>{8, 2}, {3, 3}}) {
      F16Case c;
      c.B = 2, c.Hq = heads.first, c.Hkv = heads.second, c.Lq = 1, c.Lk = lk;
      c.E = kHeadDims[pair % 7], c.Ev = kHeadDims[(pair * 3 + 2) % 7], pair++;
      c.seed = seed++;
      check(c, true);
      c.weights = false;  // split-K segments from 513 keys on
      check(c, true);
      c.causal = true, c.offsets = {lk - 1 - lk / 3, lk - 1}, c.key_lengths = {lk, (lk + 1) / 2};
      check(c, true);
      c.weights = true, c.float_mask = true, c.softcap = 3.0f;
      check(c, true);
    }
}

// A decode read in order whose mask blocks keys inside the attended range: those keys' K and
// V rows are NaN, which must not reach the output (blocked keys are skipped, not multiplied
// by 0). MHA (one row per KV head: P·V key after key, pv_row_in_order) and GQA (two, three
// and four rows: column blocks), each scored in its own number of streams (kDecodeStreams:
// key counts not a multiple of it leave keys scored one at a time), float16 and float32
// storage, E and Ev with and without a scalar tail, key counts around the tile edges, with
// and without split-K segments.
TEST(F16Kernel, DecodeInOrderSkipsMaskedKeysWithNaNRows) {
  uint32_t seed = 300;
  const std::pair<int, int> dims[] = {{67, 35}, {128, 128}, {3, 5}, {64, 67}};
  int pair = 0;
  for (int lk : kKeyLengths)
    for (auto heads : {std::pair<int, int>{3, 3}, {8, 2}, {4, 2}, {6, 2}}) {
      for (bool weights : {false, true}) {
        F16Case c;
        c.B = 2, c.Hq = heads.first, c.Hkv = heads.second, c.Lq = 1, c.Lk = lk;
        c.E = dims[pair % 4].first, c.Ev = dims[pair % 4].second, pair++;
        c.float_mask = true, c.mask_block_fraction = 0.3, c.weights = weights, c.seed = seed++;
        F16Harness h(c);
        h.p.read_kv_in_order = true;
        int blocked = 0;
        for (int b = 0; b < c.B; b++) {
          for (int j = 0; j < lk; j++) {
            if (h.mask[size_t(b) * lk + j] != -kInf) continue;  // a key the mask blocks:
            blocked++;
            for (int kv_head = 0; kv_head < c.Hkv; kv_head++) {
              for (int d = 0; d < c.E; d++) h.key_at(b, kv_head, j, d) = nan_element(c.type);
              for (int d = 0; d < c.Ev; d++) h.value_at(b, kv_head, j, d) = nan_element(c.type);
            }
          }
        }
        ASSERT_TRUE(reads_keys_in_place(h.p)) << c.describe();
        ASSERT_EQ(h.run(), Status::kOk) << c.describe();
        h.expect_matches_reference();
        // Float32 copies of the same storage: the float32 instantiation of the path.
        expect_float32_copies_match_reference(h, c.describe() + " float32");
        if (lk >= 7) {
          EXPECT_GT(blocked, 0) << c.describe();  // the case blocks some key
        }
      }
    }
}

// Prefill: 37 query rows per head, 2 query heads per KV head: many row tiles, K packed
// (widened while packing) and V copied widened.
TEST(F16Kernel, PrefillPacksWidenedHalvesAroundTileEdges) {
  uint32_t seed = 100;
  int pair = 3;
  for (int lk : kKeyLengths) {
    F16Case c;
    c.B = 2, c.Hq = 2, c.Hkv = 1, c.Lq = 37, c.Lk = lk;
    c.E = kHeadDims[pair % 7], c.Ev = kHeadDims[(pair * 5 + 1) % 7], pair++;
    c.seed = seed++;
    check(c, false);
    c.causal = true, c.offsets = {lk - 37, 5}, c.key_lengths = {lk, lk / 3};
    check(c, false);
    c.float_mask = true, c.softcap = 2.5f, c.weights = false;
    check(c, false);
  }
}

// Every (E, Ev) pair of kHeadDims, Ev == E and Ev != E, on both paths.
TEST(F16Kernel, EveryHeadDimPairOnBothPaths) {
  uint32_t seed = 200;
  for (int e : kHeadDims)
    for (int ev : kHeadDims) {
      F16Case d;  // decode
      d.Hq = 8, d.Hkv = 2, d.Lq = 1, d.Lk = kKeyTile + 1, d.E = e, d.Ev = ev, d.seed = seed++;
      check(d, true);
      F16Case f;  // prefill: more row tiles than a decode reads in place
      f.Hq = 2, f.Hkv = 1, f.Lq = kDecodeMaxRowTiles * kQueryTile / 2 + 1, f.Lk = kKeyTile + 1;
      f.E = e, f.Ev = ev, f.seed = seed++;
      f.causal = true, f.offsets = {kKeyTile + 1 - f.Lq};
      check(f, false);
    }
}

// Key lengths from 0 to Lk with NaN/-Inf halves in the padded positions, the causal
// frontier before and past them, a float mask with -inf entries, softcap and weights, all
// together: no padded half may reach the output or the weights.
TEST(F16Kernel, PaddingHalvesNeverLeakThroughKeyLengthsCausalMaskAndSoftcap) {
  uint32_t seed = 300;
  for (int lq : {1, 2, 37})
    for (int lk : {kKeyTile + 1, 4 * kKeyTile + 1}) {
      F16Case c;
      c.B = 4, c.Hq = 4, c.Hkv = 2, c.Lq = lq, c.Lk = lk, c.E = 67, c.Ev = 8, c.seed = seed++;
      c.key_lengths = {lk, 0, lk / 2, 1};
      c.causal = true, c.offsets = {lk - lq, 3, lk, -2};
      c.float_mask = true, c.mask_block_fraction = 0.3, c.softcap = 4.0f;
      const bool in_place = 2 * lq <= kDecodeMaxRowTiles * kQueryTile;
      check(c, in_place);
      c.weights = false;
      check(c, in_place);
    }
}

// Splits over threads regroup whole rows (and decode's segments do not depend on the thread
// count), so 2 and 3 threads must reproduce the single-threaded bits. The problems are above
// the size under which forward() stays on the calling thread.
TEST(F16Kernel, ThreadsGiveBitwiseIdenticalResults) {
  const F16Case cases[] = {
      [] { F16Case c; c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = 100, c.Lk = 200, c.E = 32, c.Ev = 35;
           c.causal = true, c.offsets = {100}, c.key_lengths = {200, 130}; return c; }(),
      [] { F16Case c; c.B = 2, c.Hq = 8, c.Hkv = 2, c.Lq = 1, c.Lk = 4100, c.E = 64, c.Ev = 64;
           c.weights = false, c.key_lengths = {4100, 2000}; return c; }(),
      [] { F16Case c; c.Hq = 8, c.Hkv = 2, c.Lq = 1, c.Lk = 2100, c.E = 128, c.Ev = 128;
           c.float_mask = true, c.softcap = 3.0f; return c; }(),  // weights: after the segments' merge
  };
  for (const F16Case& c : cases) {
    F16Harness single(c);
    ASSERT_EQ(single.run(), Status::kOk);
    single.expect_matches_reference();
    for (int threads : {2, 3}) {
      ThreadPool pool(threads);
      F16Harness h(c);
      for (int repeat = 0; repeat < 2; repeat++) {  // the pool is reused across calls
        ASSERT_EQ(h.run(&pool), Status::kOk);
        EXPECT_TRUE(same_bits(single.out, h.out)) << c.describe() << " threads " << threads;
        EXPECT_TRUE(same_bits(single.weights, h.weights)) << c.describe() << " threads " << threads;
      }
    }
  }
}

// The kernel widens exactly and then does float32 arithmetic only, so a float16 problem is
// the float32 problem on f16_to_f32 of its halves (same storage layout, NaN padding
// included), bit for bit: prefill (V copied widened, where float32 with Ev % 8 == 0 reads it
// in place) and decode (in place, with and without segments).
TEST(F16Kernel, EqualsTheFloat32KernelOnTheWidenedHalvesBitwise) {
  F16Case cases[4];
  cases[0].B = 2, cases[0].Hq = 4, cases[0].Hkv = 2, cases[0].Lq = 37, cases[0].Lk = 300;
  cases[0].E = 64, cases[0].Ev = 64, cases[0].causal = true, cases[0].offsets = {263};
  cases[1] = cases[0], cases[1].E = 67, cases[1].Ev = 3, cases[1].float_mask = true, cases[1].softcap = 2.0f;
  cases[2].B = 2, cases[2].Hq = 8, cases[2].Hkv = 2, cases[2].Lq = 1, cases[2].Lk = 1100;
  cases[2].E = 67, cases[2].Ev = 64, cases[2].weights = false, cases[2].key_lengths = {1100, 700};
  cases[3] = cases[2], cases[3].Ev = 13, cases[3].weights = true, cases[3].float_mask = true;
  uint32_t seed = 400;
  for (F16Case& c : cases) {
    c.seed = seed++;
    F16Harness h(c);
    ASSERT_EQ(h.run(), Status::kOk);
    std::vector<float> k32(h.k.size()), v32(h.v.size());
    const auto widen = [&](uint16_t e) { return widened(c.type, e); };
    std::transform(h.k.begin(), h.k.end(), k32.begin(), widen);
    std::transform(h.v.begin(), h.v.end(), v32.begin(), widen);
    std::vector<float> out32(h.out.size(), kNaN), weights32(h.weights.size(), kNaN);
    Problem p = h.p;
    p.kv_type = KvType::kFloat32, p.key = k32.data(), p.value = v32.data();
    p.output = out32.data(), p.weights = c.weights ? weights32.data() : nullptr;
    std::vector<float> scratch(scratch_floats(p));
    ASSERT_EQ(forward(p, scratch.data(), scratch.size()), Status::kOk);
    EXPECT_TRUE(same_bits(out32, h.out)) << c.describe();
    EXPECT_TRUE(same_bits(weights32, h.weights)) << c.describe();
    h.expect_matches_reference();
  }
}

TEST(F16Kernel, FiniteHalvesGiveTheSameBitsAsTheExactWidening) {
  // kFloat16Finite promises no Inf/NaN among the halves the problem reads (the harness's
  // NaN/-Inf halves sit only in positions no row may attend, never read): decode and prefill,
  // with padding, masks and weights, bitwise equal to kFloat16.
  F16Case cases[3];
  cases[0].B = 2, cases[0].Hq = 8, cases[0].Hkv = 2, cases[0].Lq = 1, cases[0].Lk = 1100;
  cases[0].E = 128, cases[0].Ev = 67, cases[0].key_lengths = {1100, 513}, cases[0].weights = false;
  cases[1] = cases[0], cases[1].weights = true, cases[1].float_mask = true, cases[1].causal = true, cases[1].offsets = {1099};
  cases[2].B = 1, cases[2].Hq = 4, cases[2].Hkv = 2, cases[2].Lq = 37, cases[2].Lk = 300, cases[2].E = 64;
  cases[2].Ev = 64, cases[2].causal = true, cases[2].offsets = {263}, cases[2].softcap = 3.0f;
  uint32_t seed = 500;
  for (F16Case& c : cases) {
    c.seed = seed++;
    F16Harness exact(c), finite(c);
    finite.p.kv_type = KvType::kFloat16Finite;
    ASSERT_EQ(exact.run(), Status::kOk);
    ASSERT_EQ(finite.run(), Status::kOk);
    EXPECT_TRUE(same_bits(finite.out, exact.out)) << c.describe();
    EXPECT_TRUE(same_bits(finite.weights, exact.weights)) << c.describe();
    finite.expect_matches_reference();
  }
}

// h's output against the reference on the rows whose softmax is one-hot in float32 as surely
// as in double (h: no mask, no causal limit, no softcap): the best score leads the next by more
// than 37 (every other weight under 2^-53 in double) plus twice the error bound of a float32
// score, (E + 2)·2^-24·|scale|·Σ_d |q_d·k_d| (q·scale rounded, then E products and sums). Such a
// row's output is the best key's value row in both. Returns the number of rows checked.
int expect_clear_winners_match_reference(const F16Harness& h) {
  const F16Case& c = h.c;
  const std::vector<double> ref = reference_forward(h.p, nullptr);
  int checked = 0;
  for (int b = 0; b < c.B; b++)
    for (int hq = 0; hq < c.Hq; hq++)
      for (int i = 0; i < c.Lq; i++) {
        const int kvh = hq / (c.Hq / c.Hkv);
        const int valid = h.key_lengths.empty() ? c.Lk : h.key_lengths[size_t(b)];
        const float* q = h.q.data() + ((size_t(b) * c.Hq + hq) * c.Lq + i) * c.E;
        double best = -kInf, second = -kInf, terms = 0.0;
        for (int j = 0; j < valid; j++) {
          double s = 0.0, t = 0.0;
          for (int d = 0; d < c.E; d++) {
            const double x = double(h.p.scale) * q[d] * f16_to_f32(h.k[size_t(((int64_t(b) * c.Hkv + kvh) * h.max_len + j) * c.E + d)]);
            s += x, t += std::abs(x);
          }
          terms = std::max(terms, t);
          if (s > best) second = best, best = s;
          else if (s > second) second = s;
        }
        if (!(best - second > 37.0 + 2.0 * (c.E + 2) * std::ldexp(terms, -24))) continue;
        checked++;
        for (int e = 0; e < c.Ev; e++) {
          const size_t n = ((size_t(b) * c.Hq + hq) * c.Lq + i) * c.Ev + e;
          EXPECT_LE(std::abs(h.out[n] - ref[n]) / (1.0 + std::abs(ref[n])), 2e-5)
              << c.describe() << " row (" << b << ", " << hq << ", " << i << ") col " << e;
        }
      }
  return checked;
}

TEST(F16Kernel, FiniteHalvesGiveTheSameBitsAsTheExactWideningForExtremeValuesAndQueries) {
  // A decode of kFloat16Finite halves reads them times 2^-112 and multiplies q and p by 2^112
  // instead, while every |scale·q| < 2^16 (beyond, (scale·q)·2^112 would overflow, and the
  // kernel widens exactly instead). Either way the bits must be kFloat16's: here with K/V
  // holding ±65504, subnormal halves and -0, and query elements just under 2^16, at 2^16 and
  // past it (scores up to 2^39: the softmax's max subtraction keeps them finite), both reading
  // orders, MHA and GQA, one and two query rows per head (each read in place: at most
  // kDecodeMaxRowTiles row tiles per KV head), E and Ev with a scalar tail, with and without
  // weights and segments.
  const float just_under = std::nextafter(65536.0f, 0.0f);
  const float queries[] = {0.0f, just_under, -just_under, 65536.0f, -65536.0f, 131072.0f};
  uint32_t seed = 600;
  int rows = 0, rows_checked = 0;
  for (float extreme_q : queries)
    for (auto heads : {std::pair<int, int>{8, 2}, {3, 3}})
      for (int lq : {1, 2})  // rows per KV head: 4 or 8 with GQA (one or two row tiles), 1 or 2 with MHA
        for (bool in_order : {false, true})
          for (bool weights : {false, true}) {
            F16Case c;
            c.B = 2, c.Hq = heads.first, c.Hkv = heads.second, c.Lq = lq, c.Lk = kKeyTile + 3;
            c.E = 67, c.Ev = 35, c.weights = weights, c.key_lengths = {c.Lk, 300}, c.seed = seed++;
            F16Harness exact(c);
            ASSERT_TRUE(reads_keys_in_place(exact.p)) << c.describe();
            std::mt19937 rng(c.seed);
            const uint16_t extremes[] = {kHalfMax, 0xFBFF /* -65504 */, 0x8000 /* -0 */, 0x0001, 0x83FF, 0x0400};
            for (std::vector<uint16_t>* kv : {&exact.k, &exact.v}) {
              for (uint16_t& h : *kv) {
                if (!is_nan_half(h) && h != kHalfNegInf && rng() % 16 == 0) h = extremes[rng() % 6];
              }
            }
            if (extreme_q != 0.0f) {  // 0: the harness's normal queries only
              for (size_t n = 0; n < exact.q.size(); n += 5) exact.q[n] = n % 2 == 0 ? extreme_q : -extreme_q;
            }
            exact.p.scale = 1.0f;  // scale·q is q
            exact.p.read_kv_in_order = in_order;
            F16Harness finite(c);
            finite.q = exact.q, finite.k = exact.k, finite.v = exact.v;
            finite.p = exact.p;
            finite.p.query = finite.q.data(), finite.p.key = finite.k.data(), finite.p.value = finite.v.data();
            finite.p.output = finite.out.data(), finite.p.weights = weights ? finite.weights.data() : nullptr;
            finite.p.key_lengths = finite.key_lengths.data();
            finite.p.kv_type = KvType::kFloat16Finite;
            ASSERT_EQ(exact.run(), Status::kOk);
            ASSERT_EQ(finite.run(), Status::kOk);
            EXPECT_TRUE(same_bits(finite.out, exact.out)) << c.describe() << " q " << extreme_q << " in order " << in_order;
            EXPECT_TRUE(same_bits(finite.weights, exact.weights)) << c.describe() << " q " << extreme_q;
            // Scores stay inside float (|q·k| < 2^17·65504·67): a NaN here would make equal bits vacuous.
            for (float o : finite.out) ASSERT_TRUE(std::isfinite(o)) << c.describe() << " q " << extreme_q;
            rows += c.B * c.Hq * c.Lq;
            rows_checked += expect_clear_winners_match_reference(exact);
          }
  // Most rows have a clear winner at these magnitudes (1,258 of 1,584 here; the others may
  // differ from the reference as float32 must: their best scores are closer than it resolves).
  EXPECT_GE(rows_checked, rows * 3 / 4) << rows_checked << " of " << rows;
}

// The streamed decode (sdpa.h: forward_segment, merge_segments) over float16 K/V: each segment's
// halves copied alone into a buffer of exactly its size (ASan catches a read outside it),
// kFloat16 and kFloat16Finite, MHA past a whole group of 4 tiles: the bits of forward(). Read
// in order, forward() takes each stream's keys from the group's 4 tiles (interleaved), which a
// segment copied alone cannot: forward_segment refuses such a problem.
TEST(F16Kernel, StreamedSegmentsOfHalvesMatchForwardBitwise) {
  uint32_t seed = 800;
  for (int lk : {2048, 2053, 4100})
    for (KvType type : {KvType::kFloat16, KvType::kFloat16Finite}) {
      F16Case c;
      c.Lk = lk, c.E = 64, c.Ev = 64, c.weights = false, c.seed = seed++;
      F16Harness h(c);
      h.p.kv_type = type;
      ASSERT_TRUE(reads_keys_in_place(h.p)) << c.describe();
      ASSERT_EQ(h.run(), Status::kOk);
      h.expect_matches_reference();
      EXPECT_TRUE(same_bits(test::run_streamed(h.p, h.k, h.v, h.out.size()), h.out)) << c.describe() << " type " << int(type);
      Problem in_order = h.p;
      in_order.read_kv_in_order = true;
      std::vector<float> partials(segment_partials_floats(in_order)), scratch(segment_scratch_floats(in_order));
      for (int s = 0; s < segment_count(in_order); s++) {
        EXPECT_EQ(forward_segment(in_order, s, partials.data(), scratch.data(), scratch.size()), Status::kBadSegment);
      }
      EXPECT_EQ(merge_segments(in_order, partials.data()), Status::kBadSegment);
    }
}

// MHA decode of kFloat16Finite halves with E or Ev of 64 or 128: over a tile of 512 to 515 keys
// the 4 streams of scoring (and of P·V, when no key of the tile is masked), 128 keys each, are
// then a compile-time spacing apart (with_constant_spacing), one pointer stepped. The same
// bits as kFloat16's general loops, and the reference: key counts where the spacing holds
// (512, 515, the whole tiles of 1024 and 1100, or without weights their split-K segments of
// 512) and where it does not (519 and 520: 129 and 130 keys a stream; the last 76 keys of
// 1100), masked keys (P·V's open keys fewer than a tile) and none, E and Ev apart.
TEST(F16Kernel, DecodeWithConstantStreamSpacingGivesTheBitsOfTheGeneralLoops) {
  const std::pair<int, int> dims[] = {{128, 128}, {64, 64}, {128, 64}, {64, 35}, {67, 128}};
  uint32_t seed = 700;
  for (int lk : {kKeyTile, kKeyTile + 3, kKeyTile + 7, kKeyTile + 8, 2 * kKeyTile, 1100})
    for (auto [e, ev] : dims)
      for (bool masked : {false, true}) {  // masked: with weights; else none, split-K from 513 keys
        F16Case c;
        c.B = 1, c.Hq = 2, c.Hkv = 2, c.Lq = 1, c.Lk = lk, c.E = e, c.Ev = ev;
        c.float_mask = masked, c.mask_block_fraction = 0.05, c.weights = masked, c.seed = seed++;
        F16Harness exact(c);
        exact.p.read_kv_in_order = true;
        F16Harness finite(c);
        finite.p.read_kv_in_order = true;
        finite.p.kv_type = KvType::kFloat16Finite;
        ASSERT_TRUE(reads_keys_in_place(finite.p)) << c.describe();
        ASSERT_EQ(exact.run(), Status::kOk) << c.describe();
        ASSERT_EQ(finite.run(), Status::kOk) << c.describe();
        finite.expect_matches_reference();
        EXPECT_TRUE(same_bits(finite.out, exact.out)) << c.describe();
        EXPECT_TRUE(same_bits(finite.weights, exact.weights)) << c.describe();
      }
}

// MHA decode of halves in memory order: split-K segments whose whole group of
// kInterleavedTiles tiles (2048 keys) the row attends are read interleaved, each stream
// running through a quarter of the group (interleaved_first_key in the kernel). The reference
// within 2e-5; kFloat16 and kFloat16Finite bitwise equal (one thread and two: the next test); at
// contexts with whole groups and a partial one, with E and Ev of 64 or 128 (constant stream spacings),
// other multiples of 4 (the general loops) and not (never interleaved), a batch whose key
// length ends inside a group, a causal frontier inside a group, softcap. And the path is
// taken: the same problem with an all-zero float mask, which keeps every group in key order,
// gives other bits (the tiles hold other keys, so their maxima and sums round differently).
// A sliding window or a batch's first key inside the first group: the groups after it are read interleaved; sinks
// join after their merge.
TEST(F16Kernel, DecodeReadsWholeOpenGroupsOfTilesInterleaved) {
  const std::pair<int, int> dims[] = {{128, 128}, {64, 64}, {128, 64}, {68, 36}, {67, 35}};
  uint32_t seed = 900;
  for (int lk : {2048, 2 * 2048 + 515})
    for (auto [e, ev] : dims)
      for (int variant = 0; variant < 6; variant++) {
        if (variant >= 3 && variant <= 4 && lk < 4096) continue;  // one group, cut by the window: nothing interleaved
        F16Case c;
        c.B = 2, c.Hq = 2, c.Hkv = 2, c.Lq = 1, c.Lk = lk, c.E = e, c.Ev = ev, c.weights = false, c.seed = seed++;
        if (variant == 1) c.key_lengths = {lk, lk > 4096 ? 2048 + 700 : 1500};  // batch 1: a group cut
        if (variant == 2) c.causal = true, c.offsets = {lk - 1, lk - 1400}, c.softcap = 5.0f;
        if (variant == 3) c.causal = true, c.offsets = {lk - 1, lk - 200}, c.window = lk - 700;
        if (variant == 4) c.key_starts = {700, 2100};  // left padding: the groups after it interleaved
        if (variant == 5) c.sinks = {2.0f, 25.0f};  // joined after the interleaved segments' merge
        F16Harness exact(c);
        exact.p.read_kv_in_order = true;
        F16Harness finite(c);
        finite.p.read_kv_in_order = true;
        finite.p.kv_type = KvType::kFloat16Finite;
        ASSERT_EQ(exact.run(), Status::kOk) << c.describe();
        ASSERT_EQ(finite.run(), Status::kOk) << c.describe();
        finite.expect_matches_reference();
        EXPECT_TRUE(same_bits(finite.out, exact.out)) << c.describe();
        // With weights (for two of the dims, to keep the test short): the segments are still
        // read interleaved and the output keeps its bits; the weights pass scores the keys in
        // key order, and the weights match the reference.
        if ((e == 128 && ev == 128) || (e == 68 && ev == 36)) {
          F16Case weighted_case = c;
          weighted_case.weights = true;
          F16Harness weighted(weighted_case);
          weighted.p.read_kv_in_order = true;
          weighted.p.kv_type = KvType::kFloat16Finite;
          ASSERT_EQ(weighted.run(), Status::kOk) << c.describe();
          weighted.expect_matches_reference();
          EXPECT_TRUE(same_bits(finite.out, weighted.out)) << c.describe() << ": with weights";
        }
        if (e % 4 == 0 && ev % 4 == 0) {
          F16Harness in_key_order(c);
          in_key_order.p.read_kv_in_order = true;
          in_key_order.p.kv_type = KvType::kFloat16Finite;
          in_key_order.mask.assign(size_t(c.B) * c.Lq * c.Lk, 0.0f);
          in_key_order.p.mask_kind = MaskKind::kFloat;
          in_key_order.p.mask = in_key_order.mask.data();
          in_key_order.p.mask_stride_b = int64_t(c.Lq) * c.Lk, in_key_order.p.mask_stride_q = c.Lk;
          in_key_order.p.mask_stride_k = 1;
          ASSERT_EQ(in_key_order.run(), Status::kOk) << c.describe();
          in_key_order.expect_matches_reference();
          EXPECT_FALSE(same_bits(finite.out, in_key_order.out)) << c.describe() << ": not read interleaved";
        }
      }
}

// The interleaved reading on threads: one and two threads bitwise equal, with and without
// weights, at sizes above the one under which forward() stays on the calling thread (4e6
// multiply-adds, src/sdpa.cc; the test above stays under it to keep the reference cheap).
TEST(F16Kernel, DecodeReadInterleavedIsTheSameOnTwoThreads) {
  uint32_t seed = 950;
  for (int lk : {2048, 2 * 2048 + 515})
    for (int variant = 0; variant < 3; variant++)
      for (bool weights : {false, true}) {
        if (weights && variant != 2) continue;  // weights: once per context, with everything that blocks
        F16Case c;
        c.B = 2, c.Hq = 4, c.Hkv = 4, c.Lq = 1, c.Lk = lk, c.E = 128, c.Ev = 128, c.weights = weights, c.seed = seed++;
        if (variant == 1) c.key_lengths = {lk, lk > 4096 ? 2048 + 700 : 1500};
        if (variant == 2) c.causal = true, c.offsets = {lk - 1, lk - 1400}, c.softcap = 5.0f;
        ASSERT_GT(double(c.B) * c.Hq * c.Lq * c.Lk * (c.E + c.Ev), 4e6);
        F16Harness single(c), two_threads(c);
        for (F16Harness* h : {&single, &two_threads}) {
          h->p.read_kv_in_order = true;
          h->p.kv_type = KvType::kFloat16Finite;
        }
        ASSERT_EQ(single.run(), Status::kOk) << c.describe();
        ThreadPool pool(2);
        ASSERT_EQ(two_threads.run(&pool), Status::kOk) << c.describe();
        EXPECT_TRUE(same_bits(single.out, two_threads.out)) << c.describe();
        EXPECT_TRUE(same_bits(single.weights, two_threads.weights)) << c.describe();
      }
}

// ALiBi on float16 K/V: the biases join the scores as they do on float32, so a float16 problem is
// still the float32 problem on the halves' values; read in place in memory order (a KV cache's
// decode step: one query row per KV head, whose groups of tiles are then read in key order, not
// interleaved, the biases needing the keys in order; and GQA), packed (prefill), split-K, against
// the reference on the halves' values; kFloat16Finite the bits of kFloat16; two threads the bits of
// one; float32 copies of the halves against the reference too.
TEST(F16Kernel, AlibiOnHalvesInPlaceInOrderAndPacked) {
  uint32_t seed = 1500;
  for (int lk : {7, 513, 2048 + 515})
    for (auto heads : {std::pair<int, int>{4, 4}, {8, 2}})
      for (int variant = 0; variant < 2; variant++) {
        F16Case c;
        c.B = 2, c.Hq = heads.first, c.Hkv = heads.second, c.Lq = 1, c.Lk = lk;
        c.E = c.Ev = c.Hq == c.Hkv ? 32 : 64;  // (GQA: two threads' worth of work at 2563 keys)
        c.weights = false, c.seed = seed++;
        c.causal = true, c.offsets = {lk - 1, lk - 1 - lk / 3};
        c.alibi_slopes = test::per_batch_slopes(c.B, c.Hq);
        if (variant == 1) {
          if (lk > 2048) continue;  // (time: 513 keys are two segments already)
          c.causal = false, c.offsets = {lk - 1}, c.alibi_slopes = test::geometric_slopes(c.Hq, 0.1f);
          c.float_mask = true, c.softcap = 5.0f, c.key_lengths = {lk, (lk + 1) / 2}, c.weights = lk < 1000;
        }
        check(c, true);
        F16Harness exact(c), finite(c);
        exact.p.read_kv_in_order = finite.p.read_kv_in_order = true;
        finite.p.kv_type = KvType::kFloat16Finite;
        ASSERT_EQ(exact.run(), Status::kOk) << c.describe();
        ASSERT_EQ(finite.run(), Status::kOk) << c.describe();
        EXPECT_TRUE(same_bits(finite.out, exact.out)) << c.describe();
        if (lk > 2048 && c.Hq == 8 && variant == 0) {  // above the size under which forward() stays on one thread
          ThreadPool pool(2);
          F16Harness two(c);
          two.p.read_kv_in_order = true, two.p.kv_type = KvType::kFloat16Finite;
          ASSERT_EQ(two.run(&pool), Status::kOk) << c.describe();
          EXPECT_TRUE(same_bits(finite.out, two.out)) << c.describe() << ": 2 threads";
        }
      }
  for (int lk : {7, 1100}) {  // prefill: K/V widened into the packed copies
    F16Case c;
    c.B = 2, c.Hq = 2, c.Hkv = 1, c.Lq = 37, c.Lk = lk, c.E = 16, c.Ev = 24, c.seed = seed++;
    c.causal = true, c.offsets = {lk - 37, 5}, c.alibi_slopes = test::per_batch_slopes(c.B, c.Hq);
    check(c, false);
  }
}

TEST(F16Kernel, ValidateRejectsAnUnknownKvType) {
  F16Case c;
  F16Harness h(c);
  h.p.kv_type = static_cast<KvType>(4);
  EXPECT_EQ(h.run(), Status::kBadKvType);
  EXPECT_TRUE(std::isnan(h.out[0]));  // nothing written
}

// ---------------------------------------------------------------------------------------
// 3. copy_rows: appends into cache storage.
// ---------------------------------------------------------------------------------------

// A cache append: a [B, L, H, D] block (the bshd layout of the caller's new keys) copied to
// positions [pos, pos + L) of a [B, H, max_len, D] storage. Elements are bytes-typed
// vectors so one helper serves float and half.
struct Append {
  int B = 2, H = 3, L = 5, D = 7, max_len = 16, pos = 4;

  RowBlock source(void* data, KvType type) const {  // [B, L, H, D]
    RowBlock r;
    r.data = data, r.type = type;
    r.stride_b = int64_t(L) * H * D, r.stride_h = D, r.stride_l = int64_t(H) * D;
    return r;
  }
  RowBlock destination(void* storage, KvType type) const {  // [B, H, max_len, D] from pos
    RowBlock r;
    r.data = static_cast<char*>(storage) + size_t(pos) * D * (is_16_bit(type) ? 2 : 4);
    r.type = type;
    r.stride_b = int64_t(H) * max_len * D, r.stride_h = int64_t(max_len) * D, r.stride_l = D;
    return r;
  }
  size_t source_elements() const { return size_t(B) * L * H * D; }
  size_t storage_elements() const { return size_t(B) * H * max_len * D; }
  size_t source_index(int b, int h, int l, int d) const { return ((size_t(b) * L + l) * H + h) * D + d; }
  size_t storage_index(int b, int h, int j, int d) const { return ((size_t(b) * H + h) * max_len + j) * D + d; }

  // Calls expect(source element, storage element) for every written element, and checks
  // that every other storage element still equals `untouched`.
  template <typename Dst, typename Src, typename Expect>
  void check(const std::vector<Dst>& storage, const std::vector<Src>& src, Dst untouched, Expect expect) const {
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++)
        for (int j = 0; j < max_len; j++)
          for (int d = 0; d < D; d++) {
            const Dst& got = storage[storage_index(b, h, j, d)];
            if (j >= pos && j < pos + L) {
              expect(src[source_index(b, h, j - pos, d)], got);
            } else {
              ASSERT_EQ(0, std::memcmp(&got, &untouched, sizeof(Dst)))
                  << "storage [" << b << "," << h << "," << j << "," << d << "] written";
            }
          }
  }
};

// Floats for appends: random normals plus the values the conversion treats specially.
std::vector<float> append_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& e : x) e = normal(rng) * 100.0f;
  const float special[] = {0.0f, -0.0f, kInf, -kInf, kNaN, -kNaN, 65504.0f, 65519.0f, 65520.0f, -1e9f,
                           1e-8f, -0x1p-25f, 0x3p-25f, 2049.0f, std::numeric_limits<float>::denorm_min()};
  for (size_t i = 0; i < std::size(special) && i < n; i++) x[i * 7 % n] = special[i];
  return x;
}

TEST(CopyRows, Float32ToFloat32CopiesBits) {
  const Append a;
  std::vector<float> src = append_floats(a.source_elements(), 1);
  std::vector<float> storage(a.storage_elements(), -7.0f);
  ASSERT_EQ(copy_rows(a.destination(storage.data(), KvType::kFloat32), a.source(src.data(), KvType::kFloat32),
                      a.B, a.H, a.L, a.D),
            Status::kOk);
  a.check(storage, src, -7.0f, [](float s, float d) { ASSERT_EQ(bits_of(s), bits_of(d)); });
}

// Row widths around the SIMD conversions' 8 and 4 lanes (copy_rows narrows 8 floats, then 4,
// then one at a time): every path and every tail length.
constexpr int kRowWidths[] = {1, 3, 4, 5, 7, 8, 9, 12, 13, 16, 131};

TEST(CopyRows, Float32ToFloat16RoundsLikeF32ToF16) {
  for (int D : kRowWidths) {
    Append a;
    a.D = D;
    std::vector<float> src = append_floats(a.source_elements(), 2 + D);
    std::vector<uint16_t> storage(a.storage_elements(), 0xABCD);
    ASSERT_EQ(copy_rows(a.destination(storage.data(), KvType::kFloat16), a.source(src.data(), KvType::kFloat32),
                        a.B, a.H, a.L, a.D),
              Status::kOk);
    a.check(storage, src, uint16_t{0xABCD}, [D](float s, uint16_t d) {
      ASSERT_EQ(d, f32_to_f16(s)) << s << " (D = " << D << ")";
      ASSERT_TRUE(narrows_correctly(s));
    });
  }
}

// Raw 16-bit elements of `type` (every kind of pattern) copied into a cache of that type bit for
// bit, and into a float32 cache widened exactly: halves to expected_widened_bits, bfloat16 to
// the float whose upper 16 bits they are.
void copies_and_widens_exactly(const Append& a, KvType type) {
  std::mt19937 rng(3 + a.D + (type == KvType::kBFloat16 ? 40 : 0));
  std::vector<uint16_t> src(a.source_elements());
  for (uint16_t& h : src) h = static_cast<uint16_t>(rng());  // any pattern: NaN, Inf, subnormal
  if (type == KvType::kFloat16) src[0] = kHalfNaN, src[1] = 0xFE01, src[2] = 0x8000, src[3] = 0x0001, src[4] = 0xFC00;
  const auto widened_bits = [type](uint16_t s) {
    return type == KvType::kBFloat16 ? uint32_t(s) << 16 : expected_widened_bits(s);
  };

  std::vector<uint16_t> storage16(a.storage_elements(), 0xABCD);
  ASSERT_EQ(copy_rows(a.destination(storage16.data(), type), a.source(src.data(), type), a.B, a.H, a.L, a.D),
            Status::kOk);
  a.check(storage16, src, uint16_t{0xABCD}, [](uint16_t s, uint16_t d) { ASSERT_EQ(s, d); });

  std::vector<float> storage32(a.storage_elements(), -7.0f);
  ASSERT_EQ(copy_rows(a.destination(storage32.data(), KvType::kFloat32), a.source(src.data(), type),
                      a.B, a.H, a.L, a.D),
            Status::kOk);
  a.check(storage32, src, -7.0f, [&](uint16_t s, float d) {
    ASSERT_EQ(bits_of(d), widened_bits(s)) << std::hex << "element 0x" << s;
  });
}

TEST(CopyRows, Float16ToFloat16CopiesBitsAndFloat16ToFloat32IsExact) {
  for (int D : kRowWidths) {
    Append a;
    a.D = D;
    copies_and_widens_exactly(a, KvType::kFloat16);
  }
}

TEST(HalvesHaveInfNaN, FindsEveryExponent31PatternAtEveryPlaceAndNothingElse) {
  // Three runs of 19 halves, 32 apart: the SIMD part (8 at a time) and the scalar tail both.
  // Between the runs, NaN halves that must not be read as part of a run.
  constexpr int64_t kStride = 32, kLength = 19;
  constexpr int32_t kRuns = 3;
  std::vector<uint16_t> storage(kRuns * kStride, kHalfNaN);
  auto fill_runs = [&](uint16_t h) {
    for (int32_t r = 0; r < kRuns; r++) std::fill_n(storage.begin() + r * kStride, kLength, h);
  };
  // Every finite pattern (±0, subnormals, ±65504 included) fills the runs: not found.
  for (uint32_t i = 0; i < 65536; i++) {
    const uint16_t h = static_cast<uint16_t>(i);
    if ((h & 0x7C00) == 0x7C00) continue;
    fill_runs(h);
    ASSERT_FALSE(halves_have_inf_nan(storage.data(), kStride, kRuns, kLength)) << std::hex << "half 0x" << h;
  }
  // Every exponent-31 pattern (±Inf, every NaN), alone among finite halves, at every place of
  // every run: found.
  for (uint32_t i = 0; i < 65536; i++) {
    const uint16_t h = static_cast<uint16_t>(i);
    if ((h & 0x7C00) != 0x7C00) continue;
    for (int32_t r = 0; r < kRuns; r++) {
      for (int64_t j = 0; j < kLength; j++) {
        fill_runs(0x3C00);  // 1.0
        storage[r * kStride + j] = h;
        ASSERT_TRUE(halves_have_inf_nan(storage.data(), kStride, kRuns, kLength))
            << std::hex << "half 0x" << h << std::dec << " at run " << r << ", place " << j;
      }
    }
  }
  // No runs, or empty ones: nothing found.
  fill_runs(0x7C00);
  EXPECT_FALSE(halves_have_inf_nan(storage.data(), kStride, 0, kLength));
  EXPECT_FALSE(halves_have_inf_nan(storage.data(), kStride, kRuns, 0));
}

TEST(CopyRows, ZeroSizesWriteNothing) {
  const Append a;
  std::vector<float> src = append_floats(a.source_elements(), 4);
  std::vector<uint16_t> storage(a.storage_elements(), 0xABCD);
  const RowBlock dst = a.destination(storage.data(), KvType::kFloat16), from = a.source(src.data(), KvType::kFloat32);
  EXPECT_EQ(copy_rows(dst, from, 0, a.H, a.L, a.D), Status::kOk);
  EXPECT_EQ(copy_rows(dst, from, a.B, 0, a.L, a.D), Status::kOk);
  EXPECT_EQ(copy_rows(dst, from, a.B, a.H, 0, a.D), Status::kOk);
  EXPECT_EQ(storage, std::vector<uint16_t>(a.storage_elements(), 0xABCD));
}

TEST(CopyRows, ErrorsWriteNothing) {
  const Append a;
  std::vector<float> src = append_floats(a.source_elements(), 5);
  std::vector<uint16_t> storage(a.storage_elements(), 0xABCD);
  const RowBlock dst = a.destination(storage.data(), KvType::kFloat16), from = a.source(src.data(), KvType::kFloat32);
  auto untouched = [&] { return storage == std::vector<uint16_t>(a.storage_elements(), 0xABCD); };

  EXPECT_EQ(copy_rows(dst, from, -1, a.H, a.L, a.D), Status::kBadShape);
  EXPECT_EQ(copy_rows(dst, from, a.B, -1, a.L, a.D), Status::kBadShape);
  EXPECT_EQ(copy_rows(dst, from, a.B, a.H, -1, a.D), Status::kBadShape);
  EXPECT_EQ(copy_rows(dst, from, a.B, a.H, a.L, 0), Status::kBadShape);
  EXPECT_EQ(copy_rows(dst, from, a.B, a.H, a.L, -3), Status::kBadShape);
  EXPECT_TRUE(untouched());

  RowBlock null_dst = dst, null_src = from;
  null_dst.data = nullptr, null_src.data = nullptr;
  EXPECT_EQ(copy_rows(null_dst, from, a.B, a.H, a.L, a.D), Status::kNullPointer);
  EXPECT_EQ(copy_rows(dst, null_src, a.B, a.H, a.L, a.D), Status::kNullPointer);
  EXPECT_TRUE(untouched());

  for (int which = 0; which < 6; which++) {  // each of the six strides negative in turn
    RowBlock d = dst, s = from;
    int64_t* strides[6] = {&d.stride_b, &d.stride_h, &d.stride_l, &s.stride_b, &s.stride_h, &s.stride_l};
    *strides[which] = -1;
    EXPECT_EQ(copy_rows(d, s, a.B, a.H, a.L, a.D), Status::kBadStride) << "stride " << which;
  }
  EXPECT_TRUE(untouched());

  RowBlock bad_dst = dst, bad_src = from;
  bad_dst.type = static_cast<KvType>(4), bad_src.type = static_cast<KvType>(-1);
  EXPECT_EQ(copy_rows(bad_dst, from, a.B, a.H, a.L, a.D), Status::kBadKvType);
  EXPECT_EQ(copy_rows(dst, bad_src, a.B, a.H, a.L, a.D), Status::kBadKvType);
  EXPECT_TRUE(untouched());
}

// ---------------------------------------------------------------------------------------
// 4. bfloat16 storage (KvType::kBFloat16): the kernel and copy_rows. The conversions
//    themselves are checked in bf16-cvt-test.cc.
// ---------------------------------------------------------------------------------------

// The float16 problem on the same values as `bf` (a bfloat16 harness, whose K/V values a half
// holds exactly, see F16Harness): the same query, mask and padding (NaN as kHalfNaN, -Inf as
// kHalfNegInf), K/V converted exactly. kFloat16Finite: the widening of the float16 cache's
// usual reader (the padding is never read).
void copy_as_float16(const F16Harness& bf, F16Harness* hf) {
  ASSERT_EQ(bf.k.size(), hf->k.size());
  std::copy(bf.q.begin(), bf.q.end(), hf->q.begin());
  std::copy(bf.mask.begin(), bf.mask.end(), hf->mask.begin());
  const auto convert = [](uint16_t b) {
    if (b == kBFloat16NaN) return kHalfNaN;
    if (b == kBFloat16NegInf) return kHalfNegInf;
    const uint16_t h = f32_to_f16(bf16_to_f32(b));
    EXPECT_EQ(bits_of(f16_to_f32(h)), bits_of(bf16_to_f32(b))) << std::hex << "bfloat16 0x" << b;
    return h;
  };
  std::transform(bf.k.begin(), bf.k.end(), hf->k.begin(), convert);
  std::transform(bf.v.begin(), bf.v.end(), hf->v.begin(), convert);
  hf->p.kv_type = KvType::kFloat16Finite;
  hf->p.read_kv_in_order = bf.p.read_kv_in_order;
}

// Every kernel path reads 16-bit elements through the same code (the element type decides the
// loops: even-odd dims, streams, interleaved groups, constant spacings), and both readers widen
// exactly, so on values both formats hold a bfloat16 problem must give the float16 problem's
// bits, output and weights, and the reference within 2e-5: decode MHA (read in order: key
// order, split-K segments, interleaved groups of tiles at 2048 + 515 keys, constant stream
// spacings at E 64 and 128) and GQA, prefill (packed), key lengths around tile edges, causal
// offsets, a sliding window, left padding, masks, softcap, sinks, ALiBi, Ev != E and E % 4 != 0;
// the large ones on two threads as well, bitwise the one-thread bits.
TEST(BF16Kernel, GivesTheBitsOfFloat16OnValuesBothHoldOnEveryPath) {
  std::vector<F16Case> cases;
  uint32_t seed = 2000;
  for (int lk : kKeyLengths)
    for (auto heads : {std::pair<int, int>{3, 3}, {8, 2}})
      for (int variant = 0; variant < 3; variant++) {
        F16Case c;
        c.type = KvType::kBFloat16, c.B = 2, c.Hq = heads.first, c.Hkv = heads.second, c.Lq = 1, c.Lk = lk;
        c.E = kHeadDims[cases.size() % 7], c.Ev = kHeadDims[(cases.size() * 3 + 2) % 7], c.seed = seed++;
        c.weights = variant == 2;
        if (variant >= 1) c.causal = true, c.offsets = {lk - 1 - lk / 3, lk - 1}, c.key_lengths = {lk, (lk + 1) / 2};
        if (variant == 2) c.float_mask = true, c.softcap = 3.0f;
        cases.push_back(c);
      }
  for (auto [e, ev] : {std::pair<int, int>{128, 128}, {64, 64}, {128, 64}, {68, 36}})
    for (int variant = 0; variant < 5; variant++) {  // MHA decode over whole groups of tiles
      F16Case c;
      c.type = KvType::kBFloat16, c.B = 2, c.Hq = 2, c.Hkv = 2, c.Lq = 1, c.Lk = 2 * 2048 + 515, c.E = e, c.Ev = ev;
      c.weights = variant == 4, c.seed = seed++;
      if (variant == 1) c.key_lengths = {c.Lk, 2048 + 700};
      if (variant == 2) c.causal = true, c.offsets = {c.Lk - 1, c.Lk - 1400}, c.window = c.Lk - 700, c.softcap = 5.0f;
      if (variant == 3) c.key_starts = {700, 2100}, c.sinks = {2.0f, 25.0f};
      if (variant == 4) c.causal = true, c.offsets = {c.Lk - 1}, c.alibi_slopes = test::geometric_slopes(c.Hq, 0.01f);
      cases.push_back(c);
    }
  for (int lk : {7, kKeyTile + 1, 1100}) {  // prefill: packed, widened
    F16Case c;
    c.type = KvType::kBFloat16, c.B = 2, c.Hq = 2, c.Hkv = 1, c.Lq = 37, c.Lk = lk, c.E = 67, c.Ev = 24, c.seed = seed++;
    c.causal = true, c.offsets = {lk - 37, 5}, c.key_lengths = {lk, lk / 3}, c.float_mask = true;
    cases.push_back(c);
  }
  for (const F16Case& c : cases) {
    for (bool in_order : {false, true}) {
      if (!in_order && c.Lk > 2048 && c.Lq == 1) continue;  // (time) the whole groups: the cache's reading order alone
      F16Harness bf(c);
      F16Case half_case = c;
      half_case.type = KvType::kFloat16;
      F16Harness hf(half_case);
      bf.p.read_kv_in_order = in_order && c.Lq == 1;
      copy_as_float16(bf, &hf);
      ASSERT_EQ(bf.run(), Status::kOk) << c.describe();
      ASSERT_EQ(hf.run(), Status::kOk) << c.describe();
      bf.expect_matches_reference();
      EXPECT_TRUE(same_bits(bf.out, hf.out)) << c.describe() << (in_order ? " in order" : "");
      EXPECT_TRUE(same_bits(bf.weights, hf.weights)) << c.describe() << (in_order ? " in order" : "");
      if (double(c.B) * c.Hq * c.Lq * c.Lk * (c.E + c.Ev) > 4e6) {  // above forward()'s one-thread size
        ThreadPool pool(2);
        F16Harness two(c);
        two.p.read_kv_in_order = bf.p.read_kv_in_order;
        ASSERT_EQ(two.run(&pool), Status::kOk) << c.describe();
        EXPECT_TRUE(same_bits(bf.out, two.out)) << c.describe() << ": 2 threads";
        EXPECT_TRUE(same_bits(bf.weights, two.weights)) << c.describe() << ": 2 threads";
      }
    }
  }
}

// bfloat16 has float32's range: K values around 2^100 and V values around 2^90 (far past a
// half's 65504), with the query scaled by 2^-100. Every product q·k is then the same real
// number as in the ordinary problem, and every P·V term 2^90 times its own (powers of two: no
// rounding changes, nothing overflows or underflows), so the output must be exactly 2^90 times
// the ordinary problem's, which is checked against the reference: decode (MHA in order, read
// interleaved; GQA) and prefill (packed).
TEST(BF16Kernel, ValuesFarPastTheHalfRangeGiveTheScaledBitsOfOrdinaryOnes) {
  uint32_t seed = 2100;
  for (auto [hq, hkv, lq] : {std::tuple<int, int, int>{2, 2, 1}, {8, 2, 1}, {2, 1, 37}}) {
    F16Case c;
    c.type = KvType::kBFloat16, c.B = 2, c.Hq = hq, c.Hkv = hkv, c.Lq = lq, c.Lk = 2048 + 515, c.E = 128, c.Ev = 64;
    c.weights = false, c.key_lengths = {c.Lk, 1500}, c.seed = seed++;
    F16Harness h(c);
    h.p.read_kv_in_order = lq == 1;
    ASSERT_EQ(h.run(), Status::kOk) << c.describe();
    h.expect_matches_reference();
    const std::vector<float> ordinary = h.out;
    for (float& x : h.q) x *= 0x1p-100f;
    const auto times = [](float factor) {
      return [factor](uint16_t b) {
        const uint16_t scaled = f32_to_bf16(bf16_to_f32(b) * factor);  // NaN, -Inf stay so
        if (b != kBFloat16NaN) {
          EXPECT_EQ(bf16_to_f32(scaled), bf16_to_f32(b) * factor);  // exact
        }
        return scaled;
      };
    };
    std::transform(h.k.begin(), h.k.end(), h.k.begin(), times(0x1p100f));
    std::transform(h.v.begin(), h.v.end(), h.v.begin(), times(0x1p90f));
    ASSERT_EQ(h.run(), Status::kOk) << c.describe();
    std::vector<float> expected(ordinary.size());
    std::transform(ordinary.begin(), ordinary.end(), expected.begin(), [](float x) { return x * 0x1p90f; });
    EXPECT_TRUE(same_bits(h.out, expected)) << c.describe();
    EXPECT_GT(std::fabs(h.out[0]), 1e20f) << c.describe();
  }
}

// Floats into bfloat16 storage round as f32_to_bf16 (every row width: 8 lanes, then one at a
// time); raw bfloat16 (any pattern) copies bit for bit, and widens exactly into float32 storage.
TEST(CopyRows, Float32ToBFloat16RoundsLikeF32ToBF16AndBFloat16CopiesAndWidensExactly) {
  for (int D : kRowWidths) {
    Append a;
    a.D = D;
    std::vector<float> src = append_floats(a.source_elements(), 20 + D);
    src[0] = 3.4e38f, src[1 % src.size()] = -std::numeric_limits<float>::max();  // saturate
    std::vector<uint16_t> storage(a.storage_elements(), 0xABCD);
    ASSERT_EQ(copy_rows(a.destination(storage.data(), KvType::kBFloat16), a.source(src.data(), KvType::kFloat32),
                        a.B, a.H, a.L, a.D),
              Status::kOk);
    a.check(storage, src, uint16_t{0xABCD}, [D](float s, uint16_t d) {
      ASSERT_EQ(d, f32_to_bf16(s)) << s << " (D = " << D << ")";
    });

    copies_and_widens_exactly(a, KvType::kBFloat16);
  }
}

// Halves into bfloat16 storage (a Float16Array appended to a bfloat16 cache) and bfloat16 into
// halves: each element's exact value (expected_widened_bits for a half, the upper 16 bits of a
// float for a bfloat16), rounded as a float32 of that value is (f32_to_bf16, f32_to_f16). Every
// pattern, in one row (every lane of the 64-element blocks and 8-lane steps), and random
// patterns at every row width (the blocks' tails).
TEST(CopyRows, HalvesAndBFloat16ConvertIntoEachOtherAsTheirFloat32ValuesRound) {
  const auto value_of = [](KvType type, uint16_t s) {
    return float_of(type == KvType::kFloat16 ? expected_widened_bits(s) : uint32_t(s) << 16);
  };
  const auto rounded = [](KvType type, float x) { return type == KvType::kFloat16 ? f32_to_f16(x) : f32_to_bf16(x); };
  for (const KvType from : {KvType::kFloat16, KvType::kBFloat16}) {
    const KvType to = from == KvType::kFloat16 ? KvType::kBFloat16 : KvType::kFloat16;
    Append every;
    every.B = every.H = every.L = 1, every.D = 65536, every.max_len = 3, every.pos = 1;
    std::vector<uint16_t> patterns(65536);
    for (uint32_t i = 0; i < 65536; i++) patterns[i] = static_cast<uint16_t>(i);
    std::vector<Append> appends{every};
    std::vector<int> widths(std::begin(kRowWidths), std::end(kRowWidths));
    widths.push_back(77);  // a whole 64-element block, then 13: its SIMD steps and a scalar tail
    for (int D : widths) {
      Append a;
      a.D = D;
      appends.push_back(a);
    }
    for (const Append& a : appends) {
      std::vector<uint16_t> src = patterns;
      if (a.D != 65536) {
        std::mt19937 rng(60 + a.D);
        src.resize(a.source_elements());
        for (uint16_t& e : src) e = static_cast<uint16_t>(rng());
      }
      std::vector<uint16_t> storage(a.storage_elements(), 0xABCD);
      ASSERT_EQ(copy_rows(a.destination(storage.data(), to), a.source(src.data(), from), a.B, a.H, a.L, a.D),
                Status::kOk);
      a.check(storage, src, uint16_t{0xABCD}, [&](uint16_t s, uint16_t d) {
        ASSERT_EQ(d, rounded(to, value_of(from, s))) << std::hex << "element 0x" << s << std::dec << " (D = " << a.D << ")";
      });
    }
  }
  // Spot checks of the composition: 1/3 as a half (0x3555 = 0.333251953125) is 0x3EAB in
  // bfloat16 (0.333984375, the nearer of it and 0.33203125); a half's 65504 is 65536 in
  // bfloat16 (0x4780: 65504 lies between 65280 and 65536, nearer the latter); bfloat16's 1e10
  // (0x5015) saturates to the half 65504 (0x7BFF), and so does its Inf (0x7F80), as a float32's.
  std::vector<uint16_t> halves{0x3555, 0x7BFF}, bf16{0x5015, 0x7F80};
  Append one;
  one.B = one.H = one.L = 1, one.D = 2, one.max_len = 1, one.pos = 0;
  std::vector<uint16_t> out(2);
  ASSERT_EQ(copy_rows(one.destination(out.data(), KvType::kBFloat16), one.source(halves.data(), KvType::kFloat16), 1, 1, 1, 2), Status::kOk);
  EXPECT_EQ(out, (std::vector<uint16_t>{0x3EAB, 0x4780}));
  ASSERT_EQ(copy_rows(one.destination(out.data(), KvType::kFloat16), one.source(bf16.data(), KvType::kBFloat16), 1, 1, 1, 2), Status::kOk);
  EXPECT_EQ(out, (std::vector<uint16_t>{0x7BFF, 0x7BFF}));
}

}  // namespace
}  // namespace sdpa
