// Attention sinks (gpt-oss; Problem::sinks): one more logit in every softmax row of query head
// h, sink[h], whose value row is zero. The sink takes a share of each row's probability and adds
// nothing to the output, so a row's weights sum to less than one (to nearly zero when the sink
// dominates). It is not scaled, capped or masked.
//   p_j   = exp(s_j - M) / L          over the row's attended keys j
//   M     = max(m, sink),  L = Σ_j exp(s_j - M) + exp(sink - M)
// The online softmax ends a row with m = max_j s_j (-inf when it attended nothing),
// l = Σ_j exp(s_j - m) and o = Σ_j exp(s_j - m)·v_j; the sink then joins once, at the end:
//   α = exp(m - M) <= 1,  L = l·α + exp(sink - M),  output = o·(α / L),  lse = M + log L
// - sink = -inf is no sink: returned unchanged (M = m, α = 1, L = l), the bits of no sinks.
// - m = -inf with l = 0 (every key blocked): α = 0, L = exp(0) = 1, lse = sink. The caller keeps
//   the row's output at exact zeros (it tests the l it had, before the sink).
// - l NaN (a NaN score): L is NaN, as the row is without a sink.
// One place for the forward's two ends (attend_row_tile, the split-K merge) and the backward's
// recomputed row statistics.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "sdpa.h"

namespace sdpa {

struct SinkedRow {
  float max;           // M
  float sum;           // L
  float output_scale;  // α: o·α / L is the output row
};

// validate() has checked that a sink is finite or -inf.
inline SinkedRow add_sink(float m, float l, float sink) {
  if (sink == -std::numeric_limits<float>::infinity()) return {m, l, 1.0f};  // no sink
  const float max = std::max(m, sink);   // m = -inf: the sink, finite
  const float alpha = std::exp(m - max);  // <= 1; 0 for m = -inf
  return {max, l * alpha + std::exp(sink - max), alpha};
}

// A row's log-sum-exp, M + log L, from add_sink's result and the l it was given: -inf when
// L == 0 (no key and no sink), and the sink itself, bit for bit, when l == 0 (M + log 1 would
// turn a sink of -0 into +0).
inline float sinked_logsumexp(const SinkedRow& row, float l) {
  if (row.sum == 0.0f) return -std::numeric_limits<float>::infinity();
  return l == 0.0f ? row.max : row.max + std::log(row.sum);
}

// The sink of query head h, or -inf (none) when the problem has no sinks.
inline float sink_of(const Problem& p, int32_t h) {
  return p.sinks != nullptr ? p.sinks[h] : -std::numeric_limits<float>::infinity();
}

}  // namespace sdpa
