// The backward pass of scaled dot-product attention: the gradients of a loss L with respect
// to Q, K and V, given dO = ∂L/∂output and what the forward pass saved (its output O and
// each row's log-sum-exp, src/sdpa.h Problem::logsumexp).
//
// Shapes: Q, dQ [B, Hq, Lq, E]; K, dK [B, Hkv, Lk, E]; V, dV [B, Hkv, Lk, Ev];
// O, dO [B, Hq, Lq, Ev]; lse [B, Hq, Lq]. K and V are float32 (not the cache's halves).
//
// For one query row i of head h (KV head h / (Hq / Hkv)), with the forward's score pipeline
// (src/sdpa.h): r_j = scale·(q_i·k_j); s_j = softcap·tanh(r_j / softcap) (or r_j); s_j += mask;
// s_j = -inf where key j is blocked; and p_j = exp(s_j - lse_i) = softmax_j(s):
//   dv_j  += p_j · dO_i                              (summed over every row that attends j)
//   dp_j   = dO_i · v_j
//   D_i    = Σ_j p_j·dp_j = dO_i · O_i               (O_i = Σ_j p_j v_j)
//   ds_j   = p_j · (dp_j - D_i)                      softmax's Jacobian: diag(p) - p·pᵀ
//   dr_j   = ds_j · (1 - tanh²(r_j / softcap))       (softcap > 0), else ds_j
//   dq_i  += scale · Σ_j dr_j · k_j
//   dk_j  += scale · dr_j · q_i                      (summed over rows, and over the query
//                                                     heads sharing the KV head)
// p_j is rebuilt from the saved lse where float32 makes that precise enough; for a row with
// |lse| > kExactLseLimit, or whose scores' terms are large (|scale|·‖q‖₂·max ‖k‖₂ >
// kExactScoreTerms: huge logits, large q and k nearly orthogonal), from the row's own maximum
// score m and log Σ exp(s_j - m), recomputed (src/kernels/sdpa-bwd-kernels.h, RowStats, where
// both limits are defined).
// With a sink (src/sdpa.h, Problem::sinks) the saved lse includes it, so p_j = exp(s_j - lse_i)
// needs nothing more; the sink is one more logit whose value row is zero (dp_sink = 0), so
//   d_sinks[h] += p_sink·(0 - D_i) = -exp(sink_h - lse_i)·D_i   (summed over b and i; when
//                                                   d_sinks is given)
// A float mask, added after the softcap, gets ds_j itself (when d_mask is given):
//   dmask[b, h, i, j] += ds_j                        (summed over the axes it broadcasts on)
// A bool mask gets none. A blocked key has p_j = 0 exactly and is skipped, not multiplied
// by 0 (NaN in padding cannot leak); a row with nothing to attend (lse = -inf) contributes
// nothing and gets dq_i = 0; a key no row attends gets dk_j = dv_j = 0; a blocked (b, h, i, j)
// (mask -inf, causal, sliding window, key length or start, an empty row) adds 0 to dmask.
//
// Work (FlashAttention-2's loop orders, without atomics), after the rows' statistics: with
// one thread, or enough (batch, KV head) pairs for every thread, one fused item per pair runs
// its key blocks in order, computing the scores and probabilities of each tile once for dK,
// dV and dQ; else dK and dV by (batch, KV head, block of kBackwardKeyTile keys), each item
// looping over every query row of the KV group, and dQ by (batch, KV head, block of query
// rows), each looping over the keys, both recomputing the scores and probabilities tile by
// tile from Q, K and lse. O(N) memory, never Lq×Lk. Every gradient element is summed in one
// item, in the same fixed order either way: bitwise identical results for any number of
// threads. The mask's gradient, when asked for, is a pass of its own after those, by blocks of
// the mask's own elements (its non-broadcast axes): each item recomputes p and ds of every
// (b, h, i, j) that adds into its elements, in a fixed order, and writes them (a mask of few
// blocks has each block's sum split into parts of fixed size, added in order after). It costs
// about what the dQ pass costs (Q·Kᵀ and dO·Vᵀ once more); its scratch is O(kMaskGradKeys·
// (E + Ev)) per thread and, when split, the partial sums of fewer than 32 blocks.
#pragma once

#include <cstdint>

#include "sdpa.h"

namespace sdpa {

struct BackwardProblem {
  // The forward problem: shapes, query/key/value and their strides, every option. Its
  // `output` is the forward's output O (read only here); kv_type must be kFloat32; weights,
  // logsumexp and read_kv_in_order are not used.
  Problem forward;
  const float* logsumexp = nullptr;  // [B, Hq, Lq] dense: the forward's Problem::logsumexp
  const float* grad_output = nullptr;  // dO [B, Hq, Lq, Ev]
  int64_t go_stride_b = 0, go_stride_h = 0, go_stride_l = 0;
  float* d_query = nullptr;  // [B, Hq, Lq, E]
  int64_t dq_stride_b = 0, dq_stride_h = 0, dq_stride_l = 0;
  float* d_key = nullptr;  // [B, Hkv, Lk, E]
  int64_t dk_stride_b = 0, dk_stride_h = 0, dk_stride_l = 0;
  float* d_value = nullptr;  // [B, Hkv, Lk, Ev]
  int64_t dv_stride_b = 0, dv_stride_h = 0, dv_stride_l = 0;
  // The float mask's gradient, or null for none. It has the mask's layout: element
  // (b, h, i, j) at b·mask_stride_b + h·mask_stride_h + i·mask_stride_q + j·mask_stride_k, so an
  // axis the mask broadcasts on (stride 0) is summed over. Distinct elements of the mask's own
  // axes must not overlap (dense masks do not). Every element is written.
  float* d_mask = nullptr;
  // Into how many parts backward() splits the sum of each block of d_mask (see the work above):
  // 0 for its own choice from the shapes (backward_mask_grad_parts), else this many (capped at
  // the block's row tiles). A call computed in slices of batches or heads, each slice holding every
  // batch and head the mask broadcasts on, gives each slice the whole call's parts: each d_mask
  // element is then the same sum, in the same order, as in the whole call.
  int32_t mask_grad_parts = 0;
  // The sinks' gradient [Hq], or null for none; needs forward.sinks. Summed in double over
  // (b, i) in order, after the rows' statistics: the same bits for any number of threads.
  float* d_sinks = nullptr;
};

// validate(forward), then: float32 K/V (else kBadKvType), the backward's pointers
// (kNullPointer) and strides (kBadStride), a d_mask only for a float mask and mask_grad_parts >= 0
// (kBadMaskGrad), d_sinks only with sinks (kNullPointer).
Status validate_backward(const BackwardProblem& p);

// The parts backward() splits each d_mask block's sum into (1: not split): mask_grad_parts when
// set, else its choice from the shapes alone (enough items for 4 threads), the same for any
// number of threads. 1 without d_mask.
int32_t backward_mask_grad_parts(const BackwardProblem& p);

// Floats of scratch that backward() needs on `threads` threads: the rows' RowStats (3 floats
// each: D_i and the two that rebuild p), and per thread the largest need of the kernels used:
// the fused kernel holds every row of a pair and its dQ, O((Hq/Hkv)·Lq·(E + Ev)); the dQ pass
// packs one head's K and V, O(Lk·(E + Ev)); the row statistics keep max ‖k_j‖₂, O(Lk); the
// mask gradient packs kMaskGradKeys keys at a time.
uint64_t backward_scratch_floats(const BackwardProblem& p, int32_t threads = 1);

// Writes d_query, d_key and d_value (every element), and d_mask if given. `scratch` holds at least
// backward_scratch_floats(p, threads) floats, threads = pool ? pool->threads() : 1.
Status backward(const BackwardProblem& p, float* scratch, uint64_t scratch_size, ThreadPool* pool = nullptr);

}  // namespace sdpa
