// Backward kernels. See src/sdpa-backward.h for the problem's contract and the math.
#pragma once

#include <cstdint>

#include "sdpa-backward.h"

namespace sdpa {

// D_i = dO_i · O_i for every query row of batch b, head h: delta[i], i < Lq.
void sdpa_f32_bwd_delta(const BackwardProblem& p, int32_t b, int32_t h, float* delta);

// Floats of scratch one call of each kernel needs (any 4-byte alignment).
uint64_t sdpa_f32_bwd_dkdv_4x64__wasmsimd_scratch(const BackwardProblem& p);
uint64_t sdpa_f32_bwd_dq_4x64__wasmsimd_scratch(const BackwardProblem& p);
uint64_t sdpa_f32_bwd_fused_4x64__wasmsimd_scratch(const BackwardProblem& p);

// dK and dV of keys [key_begin, min(Lk, key_begin + kBackwardKeyTile)) of (b, kv_head), from
// every query row of the KV group. `delta` is [B, Hq, Lq] (sdpa_f32_bwd_delta's).
void sdpa_f32_bwd_dkdv_ukernel_4x64__wasmsimd(const BackwardProblem& p, int32_t b, int32_t kv_head,
                                              int32_t key_begin, const float* delta, float* scratch);

// dK, dV and dQ of all of (b, kv_head) in one pass over its key blocks (each block as the dK/dV
// kernel does it, each row's dQ summed over the blocks in order in O(group·Lq·E) scratch): the
// same bits as the two kernels, with Q·Kᵀ and dO·Vᵀ computed once instead of twice.
void sdpa_f32_bwd_fused_ukernel_4x64__wasmsimd(const BackwardProblem& p, int32_t b, int32_t kv_head,
                                               const float* delta, float* scratch);

// dQ of the flat rows [row_begin, row_end) of (b, kv_head): f = (h - kv_head·group)·Lq + i.
void sdpa_f32_bwd_dq_ukernel_4x64__wasmsimd(const BackwardProblem& p, int32_t b, int32_t kv_head,
                                            int32_t row_begin, int32_t row_end, const float* delta,
                                            float* scratch);

}  // namespace sdpa
