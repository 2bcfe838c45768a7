// Backward kernels. See src/sdpa-backward.h for the problem's contract and the math.
#pragma once

#include <cstdint>

#include "sdpa-backward.h"

namespace sdpa {

// What every gradient kernel needs per query row, [B, Hq, Lq] dense each, made first by
// sdpa_f32_bwd_row_stats_4x64__wasmsimd:
//   delta     D_i = dO_i · O_i
//   shift, log_sum: the kernels rebuild p_j = exp((s_j - shift_i) - log_sum_i); shift = -inf
//             marks a row with nothing to attend.
// From the forward's lse: shift = lse, log_sum = 0, so p_j = exp(s_j - lse) as saved. That is
// only as precise as the float32 lse: lse = m + log(l) carries an error up to ulp(lse)/2, and
// the scores recomputed here may differ from the forward's by a few ulps of |s|, both relative
// errors of every p_j. Past |lse| = 2^4 that error would pass 1e-6, and at |lse| ≥ 2^24·log(l)
// log(l) vanishes altogether (a row of Lk tied scores at -1e9, a fully masked row of a finite
// -1e9 mask, gets p_j = 1 instead of 1/Lk). A row with a finite |lse| > kExactLseLimit therefore gets
// its statistics recomputed from this pass's own scores: shift = m = max_j s_j and
// log_sum = log(Σ_j exp(s_j - m)), so s_j - shift is exact for the maximum and p sums to 1
// whatever the size of the scores.
struct RowStats {
  float* delta;
  float* shift;
  float* log_sum;
};
constexpr float kExactLseLimit = 16.0f;

// Floats of scratch one call of each kernel needs (any 4-byte alignment).
uint64_t sdpa_f32_bwd_row_stats_4x64__wasmsimd_scratch(const BackwardProblem& p);
uint64_t sdpa_f32_bwd_dkdv_4x64__wasmsimd_scratch(const BackwardProblem& p);
uint64_t sdpa_f32_bwd_dq_4x64__wasmsimd_scratch(const BackwardProblem& p);
uint64_t sdpa_f32_bwd_fused_4x64__wasmsimd_scratch(const BackwardProblem& p);

// RowStats of the flat rows [row_begin, row_end) of (b, kv_head): f = (h - kv_head·group)·Lq + i.
void sdpa_f32_bwd_row_stats_4x64__wasmsimd(const BackwardProblem& p, int32_t b, int32_t kv_head, int32_t row_begin,
                                           int32_t row_end, const RowStats& stats, float* scratch);

// dK and dV of keys [key_begin, min(Lk, key_begin + kBackwardKeyTile)) of (b, kv_head), from
// every query row of the KV group.
void sdpa_f32_bwd_dkdv_ukernel_4x64__wasmsimd(const BackwardProblem& p, int32_t b, int32_t kv_head,
                                              int32_t key_begin, const RowStats& stats, float* scratch);

// dK, dV and dQ of all of (b, kv_head) in one pass over its key blocks (each block as the dK/dV
// kernel does it, each row's dQ summed over the blocks in order in O(group·Lq·E) scratch): the
// same bits as the two kernels, with Q·Kᵀ and dO·Vᵀ computed once instead of twice.
void sdpa_f32_bwd_fused_ukernel_4x64__wasmsimd(const BackwardProblem& p, int32_t b, int32_t kv_head,
                                               const RowStats& stats, float* scratch);

// dQ of the flat rows [row_begin, row_end) of (b, kv_head).
void sdpa_f32_bwd_dq_ukernel_4x64__wasmsimd(const BackwardProblem& p, int32_t b, int32_t kv_head,
                                            int32_t row_begin, int32_t row_end, const RowStats& stats,
                                            float* scratch);

}  // namespace sdpa
