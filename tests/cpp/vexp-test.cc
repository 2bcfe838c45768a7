// exp_nonpositive against double-precision std::exp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "math/f32-vexp-nonpositive-rr1-p5-wasmsimd.h"

namespace sdpa {
namespace {

float exp_lane0(float x) {
  const ExpConstants c = make_exp_constants();
  return wasm_f32x4_extract_lane(exp_nonpositive(wasm_f32x4_splat(x), c), 0);
}

// The header's error budget: the polynomial's 1.6e-7 (plus rounding slack), and 1.5·|x|·2^-24
// from rounding x·log2(e) to float (the product, 2^-24 relative, and the constant, 2^-25).
double allowed_relative_error(float x) { return 2.0e-7 + 1.5 * std::abs(static_cast<double>(x)) * 0x1p-24; }

TEST(ExpNonpositive, AccurateDownToTheFlushThreshold) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-43.9f, 0.0f);
  double worst_excess = 0.0, worst_absolute = 0.0;
  for (int n = 0; n < 200000; n++) {
    // Every multiple of 1/64 first (both sides of each rounding boundary of n), then random.
    const float x = n < 64 * 44 ? -static_cast<float>(n) / 64.0f : dist(rng);
    if (x < -43.9f) continue;
    const double ref = std::exp(static_cast<double>(x));
    const double err = std::abs(exp_lane0(x) - ref);
    worst_excess = std::max(worst_excess, err / ref / allowed_relative_error(x));
    worst_absolute = std::max(worst_absolute, err);
  }
  EXPECT_LE(worst_excess, 1.0) << "relative error over budget, by this factor";
  // What the softmax sees: errors next to the row maximum's weight of 1.
  EXPECT_LT(worst_absolute, 2.0e-7);
}

TEST(ExpNonpositive, SpecialValues) {
  EXPECT_EQ(exp_lane0(0.0f), 1.0f);
  EXPECT_EQ(exp_lane0(-0.0f), 1.0f);
  // Blocked keys and everything below 2^-63.5: exactly +0, never NaN.
  const float zero_at[] = {-std::numeric_limits<float>::infinity(), -1e30f, -1e4f, -100.0f, -88.0f, -44.1f};
  for (float x : zero_at) {
    const float y = exp_lane0(x);
    EXPECT_EQ(y, 0.0f) << "x = " << x;
    EXPECT_FALSE(std::signbit(y)) << "x = " << x;
  }
  EXPECT_TRUE(std::isnan(exp_lane0(std::numeric_limits<float>::quiet_NaN())));
}

TEST(ExpNonpositive, NeverSubnormalEitherZeroOrAbove2ToTheMinus64) {
  // Around the threshold, where z = x·log2(e) crosses -63.5 (x = -44.015), float by float.
  for (float x = -44.0f; x > -44.03f; x = std::nextafter(x, -100.0f)) {
    const float y = exp_lane0(x);
    ASSERT_TRUE(y == 0.0f || y >= 0x1p-64f) << "x = " << x << ", y = " << y;
    if (y != 0.0f) {
      const double ref = std::exp(static_cast<double>(x));
      ASSERT_LE(std::abs(y - ref) / ref, allowed_relative_error(x)) << "x = " << x;
    }
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-200.0f, 0.0f);
  for (int n = 0; n < 20000; n++) {
    const float x = dist(rng);
    const float y = exp_lane0(x);
    ASSERT_TRUE(y == 0.0f || y >= 0x1p-64f) << "x = " << x << ", y = " << y;
    // The threshold is where the header says: x·log2(e) <= -63.5 flushes, above keeps.
    const double z = static_cast<double>(x) * 1.4426950408889634;
    if (z <= -63.51) {
      EXPECT_EQ(y, 0.0f) << "x = " << x;
    }
    if (z >= -63.49) {
      EXPECT_GT(y, 0.0f) << "x = " << x;
    }
  }
}

TEST(ExpNonpositive, LanesAreIndependent) {
  const ExpConstants c = make_exp_constants();
  alignas(16) float in[4] = {0.0f, -1.0f, -std::numeric_limits<float>::infinity(), -10.0f};
  alignas(16) float out[4];
  wasm_v128_store(out, exp_nonpositive(wasm_v128_load(in), c));
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_NEAR(out[1], std::exp(-1.0), allowed_relative_error(-1.0f) * std::exp(-1.0));
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_NEAR(out[3], std::exp(-10.0), allowed_relative_error(-10.0f) * std::exp(-10.0));
}

// exp_nonpositive_n<kN> (the softmax's four-at-a-time form) must give every lane the bits of
// exp_nonpositive: over the accurate range, the flush edge, -inf, NaN and 0.
template <int kN>
void expect_same_bits_as_one_vector_at_a_time() {
  const ExpConstants c = make_exp_constants();
  std::mt19937 rng(11 + kN);
  std::uniform_real_distribution<float> dist(-50.0f, 0.0f);
  const float specials[] = {0.0f, -0.0f, -43.9f, -44.0f, -44.1f, -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), -1e-30f, -88.0f};
  for (int n = 0; n < 20000; n++) {
    alignas(16) float in[4 * kN];
    for (int i = 0; i < 4 * kN; i++) in[i] = (n * 4 * kN + i) % 37 == 0 ? specials[(n + i) % 9] : dist(rng);
    v128_t x[kN];
    for (int i = 0; i < kN; i++) x[i] = wasm_v128_load(in + 4 * i);
    exp_nonpositive_n<kN>(x, c);
    for (int i = 0; i < kN; i++) {
      alignas(16) float together[4], alone[4];
      wasm_v128_store(together, x[i]);
      wasm_v128_store(alone, exp_nonpositive(wasm_v128_load(in + 4 * i), c));
      ASSERT_EQ(std::memcmp(together, alone, sizeof together), 0) << "kN " << kN << " inputs " << in[4 * i];
    }
  }
}

TEST(ExpNonpositive, SeveralVectorsAtOnceGiveTheBitsOfOneAtATime) {
  expect_same_bits_as_one_vector_at_a_time<2>();
  expect_same_bits_as_one_vector_at_a_time<4>();
  expect_same_bits_as_one_vector_at_a_time<8>();
}

}  // namespace
}  // namespace sdpa
