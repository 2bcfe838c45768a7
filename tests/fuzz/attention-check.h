// The oracle of the fuzz targets: is one forward() result right, for any problem, however
// adversarial its values?
//
// The values come from reference_forward (src/reference/sdpa-reference.h, double precision,
// the full [Lq, Lk] score matrix). What "right" means depends on the row, i = query row of
// (batch b, head h), and on A, the keys the row may attend (src/sdpa.h: not past
// key_lengths[b], not past the causal limit, not masked out by a bool mask or a -inf float
// mask). With s_j the row's scores computed in double as the contract orders them:
//
//   1. A is empty: output (and weights) are exact zeros. Whatever K/V hold there (NaN in
//      padding, in blocked keys) must not leak.
//   2. Some s_j (j in A) is NaN or +Inf: softmax has no value; the output row is all NaN
//      (PyTorch's answer too), and so are the weights of the keys in A.
//   3. Every s_j is -Inf (scores made -Inf by the data itself): exact zeros too, as the
//      contract says of a row whose every key is -inf, whatever V holds.
//   4. Otherwise the row is an ordinary softmax, and per output column c:
//      - "range-limited" rows, where float32 itself cannot represent the computation
//        (|scale·q_d| or Σ_d |scale·q_d·k_d| near FLT_MAX, a score plus its mask past
//        FLT_MAX), and columns where |A|·max |v_jc| nears FLT_MAX (the sum of P·V may
//        overflow): any non-finite result is allowed (the kernel is float32, like PyTorch's
//        float32 attention), and 0 (every score overflowed to -Inf: nothing attended), but
//        any other finite one must lie in [min, max] of the column's values over A, up to
//        rounding: a softmax is a convex combination of them;
//      - columns with a non-finite V value in A: no check (Inf·0 may be NaN, Inf·tiny Inf);
//      - otherwise the result must be finite, and:
//        * when the scores are well conditioned, i.e. err_s, a bound on the float32 error of
//          the scores that matter (err_j = (E+4)·2^-24·|scale|·Σ_d|q_d·k_d| for the
//          rounding of the dot product, E·max|k|·2^-149 for underflow of scale·q, and terms
//          for softcap and the mask), is at most 1e-3:
//            |got - ref| <= tol·(|ref| + Σ_j p_j|v_jc|) + 4·err_s·max_j |v_jc| + tiny,
//          tol = 1e-4 (the rounding of sums over Lk keys and E dims, exp's few ulps); the
//          second term is the change of a convex combination when its logits move by err_s.
//        * when they are not (logits so large that float rounding of a score can change
//          which key wins), only the convex-combination bound holds.
//      Log-sum-exp (Problem::logsumexp): finite unless range-limited, within the tolerance
//      plus 2·err_s of max_j s_j + log Σ_j exp(s_j - max) (cases 1 and 3: -inf; case 2: NaN).
//      Weights: exact zeros for keys outside A, and in [0, 1] for keys in A (any NaN allowed
//      if the row is range-limited); within (tol + 4·err_s)·w_ref of the reference when well conditioned.
//
// With sinks (Problem::sinks), the head's sink joins each row's softmax as one more logit with a
// zero value row: case 1 and 3's log-sum-exp is the sink itself (-inf without one), case 4's
// maximum and sum include it, and the convex combination's bound includes 0.
//
// With ALiBi (Problem::alibi_slopes), s_j includes -slope·|i + offset - j| (the reference's, in
// double, on the exact distance); it blocks nothing, so A is unchanged. Its magnitude joins the
// range limit, and err_j gets what float32 rounds of it: float(d) and the product (2·2^-24 of
// |alibi|), its sum with a float mask (2^-24 of |mask| + |alibi|) and with the score (2^-24 of
// |alibi|).
//
// With dropout (Problem::dropout_threshold > 0), the reference's output and weights are
// Σ_j p_j·z_ij·v_j and p_j·z_ij, z_ij the factor F = 2^32/(2^32 - threshold) where (b, h, i, j)
// is kept, else 0 (dropout_z below: src/kernels/dropout.h's scalar definition, drawn for the
// bounds; the reference draws it from its own copy). Cases 1 to 3 and the log-sum-exp are
// unchanged (the softmax is the one without dropout: its NaN, its empty rows). In case 4 the
// output is no longer a convex combination: its coefficients p_j·z_j are >= 0 and sum to at
// most F, so the bound that replaces the hull is [F·min(min, 0), F·max(max, 0)] (slack times
// F), the tolerance's Σ_j p_j|v_jc| becomes Σ_j p_j·z_j·|v_jc|, and the terms in err_s, in
// tiny and in the overflow limits scale with F; weights are in [0, F] (exact zeros where
// dropped, as the reference's).
//
// And every output element is written (the buffers are filled with a sentinel NaN first),
// and nothing outside the output's elements (padding between rows, heads, batches).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "fuzz-values.h"
#include "kernels/dropout.h"
#include "math/f16-f32-cvt-wasmsimd.h"
#include "reference/sdpa-reference.h"
#include "sdpa.h"

namespace sdpa_fuzz {

using sdpa::MaskKind;
using sdpa::Problem;

inline std::string describe(const Problem& p) {
  char text[1024];
  std::snprintf(text, sizeof text,
                "B%d Hq%d Hkv%d Lq%d Lk%d E%d Ev%d kv_type=%d scale=%a softcap=%a mask=%d "
                "mask_strides=[%lld,%lld,%lld,%lld] causal=%d offset=%s%d window=%d key_lengths=%s key_starts=%s sinks=%s alibi=%s "
                "dropout=(threshold %u, seed %u, batch base %d, head base %d, row base %d) weights=%d "
                "in_order=%d q_strides=[%lld,%lld,%lld] k=[%lld,%lld,%lld] v=[%lld,%lld,%lld] o=[%lld,%lld,%lld]",
                p.batch, p.q_heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim, p.value_dim,
                static_cast<int>(p.kv_type), p.scale, p.softcap, static_cast<int>(p.mask_kind),
                static_cast<long long>(p.mask_stride_b), static_cast<long long>(p.mask_stride_h),
                static_cast<long long>(p.mask_stride_q), static_cast<long long>(p.mask_stride_k), p.causal,
                p.causal_offsets != nullptr ? "per-batch, first " : "", p.causal_offsets != nullptr ? p.causal_offsets[0] : p.causal_offset,
                p.sliding_window,
                p.key_lengths != nullptr ? "per-batch" : "none", p.key_starts != nullptr ? "per-batch" : "none", p.sinks != nullptr ? "per-head" : "none",
                p.alibi_slopes == nullptr ? "none" : p.alibi_stride_b != 0 ? "per-batch" : "per-head", p.dropout_threshold,
                p.dropout_seed, p.dropout_batch_base, p.dropout_head_base, p.dropout_row_base, p.weights != nullptr, p.read_kv_in_order,
                static_cast<long long>(p.q_stride_b), static_cast<long long>(p.q_stride_h), static_cast<long long>(p.q_stride_l),
                static_cast<long long>(p.k_stride_b), static_cast<long long>(p.k_stride_h), static_cast<long long>(p.k_stride_l),
                static_cast<long long>(p.v_stride_b), static_cast<long long>(p.v_stride_h), static_cast<long long>(p.v_stride_l),
                static_cast<long long>(p.o_stride_b), static_cast<long long>(p.o_stride_h), static_cast<long long>(p.o_stride_l));
  return text;
}

// Reports a failed check and aborts: libFuzzer saves the input as a crash artifact.
[[noreturn]] inline void fail(const Problem& p, const char* format, ...) {
  std::fprintf(stderr, "\n==== fuzz check failed: ");
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fprintf(stderr, "\n     problem: %s\n", describe(p).c_str());
  std::abort();
}

#define FUZZ_CHECK(p, condition, ...)    \
  do {                                   \
    if (!(condition)) fail(p, __VA_ARGS__); \
  } while (0)

// Key or value element `at` (an element index) as a double.
FUZZ_NO_COVERAGE inline double kv_element(const Problem& p, const void* base, int64_t at) {
  if (sdpa::is_half(p.kv_type)) return sdpa::f16_to_f32(static_cast<const uint16_t*>(base)[at]);
  if (p.kv_type == sdpa::KvType::kBFloat16) {  // the float32 whose upper 16 bits it is
    const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(base)[at]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  return static_cast<const float*>(base)[at];
}

// ALiBi's bias of row (b, h, i) and key j, -(slope·|i + offset - j|) in double (0 without ALiBi).
FUZZ_NO_COVERAGE inline double alibi_at(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (p.alibi_slopes == nullptr) return 0.0;
  const int64_t offset = p.causal_offsets != nullptr ? p.causal_offsets[b] : p.causal_offset;
  return -static_cast<double>(p.alibi_slopes[b * p.alibi_stride_b + h]) * std::fabs(static_cast<double>(i + offset - j));
}

// Attention dropout's factor F = 2^32 / (2^32 - threshold) in double (the reference's; the kernel
// multiplies by it rounded to float), 1 without dropout.
FUZZ_NO_COVERAGE inline double dropout_factor_exact(const Problem& p) {
  return 4294967296.0 / (4294967296.0 - static_cast<double>(p.dropout_threshold));
}

// z of (b, h, i, j): 1 without dropout, else F where kept and 0 where dropped, by the scalar
// definition of src/kernels/dropout.h (dropout_row, dropout_kept).
FUZZ_NO_COVERAGE inline double dropout_z(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (p.dropout_threshold == 0) return 1.0;
  const uint32_t row = sdpa::dropout_row(p, static_cast<int32_t>(b), static_cast<int32_t>(h), static_cast<int32_t>(i));
  return sdpa::dropout_kept(p, row, j) ? dropout_factor_exact(p) : 0.0;
}

FUZZ_NO_COVERAGE inline int64_t mask_at(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  return b * p.mask_stride_b + h * p.mask_stride_h + i * p.mask_stride_q + j * p.mask_stride_k;
}

// Whether row (b, h, i) may attend key j: the blocking rules of src/sdpa.h, written again.
FUZZ_NO_COVERAGE inline bool attendable(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t valid_keys = p.key_lengths != nullptr ? p.key_lengths[b] : p.kv_len;
  if (j >= valid_keys) return false;
  if (p.key_starts != nullptr && j < p.key_starts[b]) return false;
  const int64_t offset = p.causal_offsets != nullptr ? p.causal_offsets[b] : p.causal_offset;
  if (p.causal && j > i + offset) return false;
  if (p.sliding_window > 0 && j <= i + offset - p.sliding_window) return false;
  if (p.mask_kind == MaskKind::kBool && static_cast<const uint8_t*>(p.mask)[mask_at(p, b, h, i, j)] == 0) return false;
  if (p.mask_kind == MaskKind::kFloat && static_cast<const float*>(p.mask)[mask_at(p, b, h, i, j)] == -kInf) return false;
  return true;
}

constexpr double kTolerance = 1e-4;
constexpr double kWellConditioned = 1e-3;  // largest score error bound still compared to the reference
constexpr double kEps = 0x1p-24;           // float32 unit roundoff
constexpr double kFloatMax = FLT_MAX;

// Checks p.output (inside `output`, the whole buffer p.output points into), p.weights
// (inside `weights`, or null) and p.logsumexp (inside `logsumexp`, or null) as described at
// the top. In attention-check.cc, which is
// compiled without the fuzzer's coverage instrumentation: the oracle's branches are not what
// the fuzzer should explore, and instrumented they took most of the time.
void check_result(const Problem& p, const std::vector<float>& output, const std::vector<float>* weights,
                  const std::vector<float>* logsumexp);

}  // namespace sdpa_fuzz
