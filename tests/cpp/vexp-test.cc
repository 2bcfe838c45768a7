// exp_nonpositive against double-precision std::exp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "math/f32-vexp-nonpositive-rr2-p6-wasmsimd.h"

namespace sdpa {
namespace {

float exp_lane0(float x) {
  const ExpConstants c = make_exp_constants();
  return wasm_f32x4_extract_lane(exp_nonpositive(wasm_f32x4_splat(x), c), 0);
}

TEST(ExpNonpositive, RelativeErrorOverTheWholeRange) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-87.0f, 0.0f);
  double worst = 0.0;
  for (int n = 0; n < 200000; n++) {
    const float x = n < 1000 ? -static_cast<float>(n) * 0.087f : dist(rng);
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(exp_lane0(x) - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7) << "worst relative error";
}

TEST(ExpNonpositive, SpecialValues) {
  EXPECT_EQ(exp_lane0(0.0f), 1.0f);
  EXPECT_EQ(exp_lane0(-0.0f), 1.0f);
  // Blocked keys: exactly +0, never NaN.
  const float zero_at[] = {-std::numeric_limits<float>::infinity(), -1e30f, -1e4f, -88.0f, -100.0f};
  for (float x : zero_at) {
    const float y = exp_lane0(x);
    EXPECT_EQ(y, 0.0f) << "x = " << x;
    EXPECT_FALSE(std::signbit(y)) << "x = " << x;
  }
  EXPECT_TRUE(std::isnan(exp_lane0(std::numeric_limits<float>::quiet_NaN())));
  // Just above the flush cutoff: still the right (tiny, possibly subnormal) value.
  const float x = -87.3f;
  EXPECT_NEAR(exp_lane0(x), std::exp(static_cast<double>(x)), 1e-6 * std::exp(static_cast<double>(x)));
}

TEST(ExpNonpositive, LanesAreIndependent) {
  const ExpConstants c = make_exp_constants();
  alignas(16) float in[4] = {0.0f, -1.0f, -std::numeric_limits<float>::infinity(), -10.0f};
  alignas(16) float out[4];
  wasm_v128_store(out, exp_nonpositive(wasm_v128_load(in), c));
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_NEAR(out[1], std::exp(-1.0), 1e-7);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_NEAR(out[3], std::exp(-10.0), 1e-7 * std::exp(-10.0));
}

}  // namespace
}  // namespace sdpa
