// The test oracle: attention written as plainly as possible, in double precision, with
// the full [Lq, Lk] score matrix. Not the product path; never used by the package.
#pragma once

#include <vector>

#include "sdpa-backward.h"
#include "sdpa.h"

namespace sdpa {

// Reads the problem's inputs (p.output and p.weights are ignored) and returns
//   output  [B, Hq, Lq, Ev] dense, and, when `weights` is non-null, weights [B, Hq, Lq, Lk]
//   (with dropout, the dropped ones the output is made of, as the kernel returns them),
//   and, when `logsumexp` is non-null, each row's lse [B, Hq, Lq] (reference_logsumexp).
std::vector<double> reference_forward(const Problem& p, std::vector<double>* weights,
                                      std::vector<double>* logsumexp = nullptr);

// Each row's log Σ_j exp(s_j) over the keys it attends, plus its head's sink's exp(sink) when
// the problem has sinks; -inf for a row with neither: [B, Hq, Lq].
std::vector<double> reference_logsumexp(const Problem& p);

// The gradients of the backward problem's forward (its inputs and dO; not the forward's saved
// O and lse, which the kernel uses: the reference derives everything from the definition),
// dense: d_query [B, Hq, Lq, E], d_key [B, Hkv, Lk, E], d_value [B, Hkv, Lk, Ev]; and for a
// float mask d_mask, laid out as the mask (element (b, h, i, j) at the mask's offset, summed
// over its broadcast axes), mask_elements(p) long (empty without a float mask); with sinks,
// d_sinks [Hq] (empty without).
struct ReferenceGradients {
  std::vector<double> d_query, d_key, d_value, d_mask, d_sinks;
};
ReferenceGradients reference_backward(const BackwardProblem& p);

// 1 + the largest offset of the mask's elements: (B - 1)·mask_stride_b + ... + (Lk - 1)·mask_stride_k + 1.
int64_t mask_elements(const Problem& p);

}  // namespace sdpa
