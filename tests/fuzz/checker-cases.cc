// The fuzz oracles' own regression tests: problems, written out by hand, on which an oracle
// once rejected a correct result (its bound missed an error source, and a CI fuzzing run
// failed). Each case runs the kernel and the oracle as the fuzz target does; a failure aborts
// with the oracle's report. scripts/fuzz.sh runs this before fuzzing.
//
// Why not seed inputs in tests/fuzz/corpus/: these were found once, in a CI run whose input
// was not kept, and are rare (none in 250,000 local executions); written out here, each
// case is exactly the situation the bound has to cover, and stays so when the decoding of
// fuzz inputs changes.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backward-check.h"
#include "sdpa-backward.h"
#include "sdpa.h"

namespace {

// Dense [1, 1, L, D] tensors, one thread: forward() for O and lse, then backward(), then the
// backward oracle.
void check_dense_backward(const std::vector<float>& query, const std::vector<float>& key, const std::vector<float>& value,
                          const std::vector<float>& grad_output, int32_t Lq, int32_t Lk, int32_t E, int32_t Ev) {
  std::vector<float> output(static_cast<size_t>(Lq) * Ev), logsumexp(static_cast<size_t>(Lq));
  sdpa::Problem p;
  p.batch = 1, p.q_heads = 1, p.kv_heads = 1, p.q_len = Lq, p.kv_len = Lk, p.head_dim = E, p.value_dim = Ev;
  p.query = query.data(), p.q_stride_b = p.q_stride_h = int64_t{Lq} * E, p.q_stride_l = E;
  p.key = key.data(), p.k_stride_b = p.k_stride_h = int64_t{Lk} * E, p.k_stride_l = E;
  p.value = value.data(), p.v_stride_b = p.v_stride_h = int64_t{Lk} * Ev, p.v_stride_l = Ev;
  p.output = output.data(), p.o_stride_b = p.o_stride_h = int64_t{Lq} * Ev, p.o_stride_l = Ev;
  p.scale = 1.0f;
  p.logsumexp = logsumexp.data();
  std::vector<float> scratch(static_cast<size_t>(sdpa::scratch_floats(p)));
  if (sdpa::forward(p, scratch.data(), scratch.size()) != sdpa::Status::kOk) {
    std::fprintf(stderr, "checker-cases: forward() failed\n");
    std::abort();
  }

  std::vector<float> dq(static_cast<size_t>(Lq) * E), dk(static_cast<size_t>(Lk) * E), dv(static_cast<size_t>(Lk) * Ev);
  sdpa::BackwardProblem bp;
  bp.forward = p;
  bp.logsumexp = logsumexp.data();
  bp.grad_output = grad_output.data(), bp.go_stride_b = bp.go_stride_h = int64_t{Lq} * Ev, bp.go_stride_l = Ev;
  bp.d_query = dq.data(), bp.dq_stride_b = bp.dq_stride_h = int64_t{Lq} * E, bp.dq_stride_l = E;
  bp.d_key = dk.data(), bp.dk_stride_b = bp.dk_stride_h = int64_t{Lk} * E, bp.dk_stride_l = E;
  bp.d_value = dv.data(), bp.dv_stride_b = bp.dv_stride_h = int64_t{Lk} * Ev, bp.dv_stride_l = Ev;
  std::vector<float> backward_scratch(static_cast<size_t>(sdpa::backward_scratch_floats(bp)));
  if (sdpa::backward(bp, backward_scratch.data(), backward_scratch.size()) != sdpa::Status::kOk) {
    std::fprintf(stderr, "checker-cases: backward() failed\n");
    std::abort();
  }
  sdpa_fuzz::check_backward(bp, dq, dk, dv);
}

// dV of a key whose probability the kernel's exp flushes to 0 in two rows with a huge dO
// (p ≈ 3e-20, |dO| ≈ 3e29: exact terms of ≈ 1e10, allowed in full) and not in the row
// between them (p = 1/2, dO ≈ -2e-3: allowed ≈ 2e-7). The reference's double sum rounds at
// 1e10's grid (≈ 1e-6), more than the small term's allowance: the bound must carry the
// double rounding. (A CI run: "d_value[3] = -0.000845, reference 2.63e+10, |diff| 2.63e+10 >
// allowed 2.63e+10"; the oracle before the fix rejected variant 17 here.)
void flushed_huge_terms_beside_a_small_one() {
  const int32_t Lq = 3, Lk = 2, E = 4, Ev = 1;
  for (int variant = 0; variant < 64; variant++) {
    // Scores: rows 0 and 2 (0, ≈ -45): key 1 flushed; row 1 (0, 0).
    const std::vector<float> query = {1, 0, 0, 0, 0, 0, 0, 0, 1.01f, 0, 0, 0};
    const std::vector<float> key = {0, 0, 0, 0, -45.0f - variant * 0.0137f, 0, 0, 0};
    const std::vector<float> value = {1.0f, 0.37f};
    const std::vector<float> grad_output = {3e29f * (1 + variant * 0.0131f), -0.0017f * (1 + variant * 0.071f),
                                            2.1e29f * (1 + variant * 0.0093f)};
    check_dense_backward(query, key, value, grad_output, Lq, Lk, E, Ev);
  }
}

}  // namespace

int main() {
  flushed_huge_terms_beside_a_small_one();
  std::printf("fuzz: the oracles accept their regression cases (checker-cases)\n");
  return 0;
}
