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
// only as precise as two things, each a relative error of every p_j:
//   - the float32 lse = m + log(l), off by up to ulp(lse)/2: 2^-21 at |lse| = 16, and at
//     |lse| ≥ 2^24·log(l) log(l) vanishes altogether (a row of Lk tied scores at -1e9, a fully
//     masked row of a finite -1e9 mask, gets p_j = 1 instead of 1/Lk);
//   - the scores recomputed here, which may differ from the forward's (q·k summed in another
//     order) by a few ulps of the size of their terms, |scale|·Σ_d |q_d·k_d| <= |scale|·‖q‖₂·‖k‖₂
//     (Cauchy–Schwarz): large q and k nearly orthogonal give small scores with large errors.
// So a row with a finite lse and |lse| > kExactLseLimit, or |scale|·‖q_i‖₂·max_{j < its key
// limit} ‖k_j‖₂ > kExactScoreTerms, gets its statistics recomputed from this pass's own scores:
// shift = m = max_j s_j and log_sum = log(Σ_j exp(s_j - m)), so s_j - shift is exact for the
// maximum and p sums to 1 whatever the size of the scores (and the forward's lse is not used).
// Below both limits the two errors stay under about 2^-21 + 64·2^-24·(a few) ≈ 1e-5.
struct RowStats {
  float* delta;
  float* shift;
  float* log_sum;
};
constexpr float kExactLseLimit = 16.0f;
constexpr double kExactScoreTerms = 64.0;

// Whether row i of (b, h) gets its RowStats recomputed (as above), for `lse`, the forward's.
// Also the fuzz oracle's way to know which rows' probabilities sum to one.
bool sdpa_f32_bwd_row_stats_recomputed(const BackwardProblem& p, int32_t b, int32_t h, int32_t i, float lse);

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

// One block of the float mask's gradient d_mask (BackwardProblem): its elements (b, h, i, j)
// with i in [row_begin, row_end) and j in [key_begin, key_end) (key_begin a multiple of
// kBackwardKeyTile). On an axis the mask broadcasts on (stride 0) the block's index is 0 and
// its range the whole axis: b = 0 with a zero mask_stride_b, all batches summed; likewise h;
// rows [0, Lq) with a zero mask_stride_q, summed into the block's one row; keys [0, Lk) with a
// zero mask_stride_k, summed into its one key.
// The terms come from row tiles, listed in the order (b, h, tile): the summed batches and heads
// (or the block's own b, h), ceil((row_end - row_begin) / 4) tiles of the block's rows each. A
// call sums the tiles [tile_begin, tile_end) of that list (all of them, or one part of a split
// sum) into `out`: the block's element (i - row_begin, j - key_begin) at
// out + (i - row_begin)·out_q + (j - key_begin)·out_k, with out_q = 0 (out_k = 0) where the
// mask has no Lq (Lk) axis.
struct MaskGradBlock {
  int32_t b, h, row_begin, row_end, key_begin, key_end;
  int64_t tile_begin, tile_end;
  float* out;
  int64_t out_q, out_k;
};
uint64_t sdpa_f32_bwd_dmask_4x64__wasmsimd_scratch(const BackwardProblem& p);

// Writes every element of the block's `out`: the sum of ds over the terms of its tiles, added
// in the order of the list, then kMaskGradKeys keys, row tile, key tile, row, key (a fixed
// order of the block and its tiles alone).
void sdpa_f32_bwd_dmask_ukernel_4x64__wasmsimd(const BackwardProblem& p, const MaskGradBlock& block,
                                               const RowStats& stats, float* scratch);

// dQ of the flat rows [row_begin, row_end) of (b, kv_head).
void sdpa_f32_bwd_dq_ukernel_4x64__wasmsimd(const BackwardProblem& p, int32_t b, int32_t kv_head,
                                            int32_t row_begin, int32_t row_end, const RowStats& stats,
                                            float* scratch);

}  // namespace sdpa
