// The oracle of the backward fuzz target: are one backward() call's d_query, d_key and
// d_value right, for any problem, however adversarial its values?
//
// The values come from reference_backward (src/reference/sdpa-reference.h: double precision,
// derived from the definition, not from the forward's saved O and lse). Per query row i
// (batch b, head h), with A_i the keys it may attend (attendable(), attention-check.h):
//
//   1. A_i empty: its dQ row is exact zeros. A key no row attends (past key_lengths, past
//      every causal limit, masked for every row, or all its rows attend nothing) has exact-zero
//      dK and dV rows, whatever K/V/Q/dO hold, NaN padding and poisoned rows included.
//   2. A row is "clean" when float32 can compute its gradients and they are well conditioned:
//      its q, dO, and the k, v of every key in A_i are finite, every score is finite and in
//      float32 range (the forward checker's range limits; scores with their ALiBi bias, as that
//      checker has them), the scores' float32 error bound
//      err_s (attention-check.h's, over the keys that matter) is <= 1e-3, with softcap c > 0
//      also err_r / c <= 1e-3 (err_r: the error bound of the score before the cap, which moves
//      tanh's derivative 1 - t²), and the magnitudes below stay far from FLT_MAX (also
//      |A_i|·max_j |v_jc| for every column: the forward's O may overflow there, and with it
//      D_i = dO_i·O_i, even where dO_ic = 0). A key is
//      clean when every row attending it is clean. Unclean rows and keys (a NaN or Inf they
//      attend, huge logits) are not checked: their gradients may be NaN or inaccurate. Every
//      gradient element that is not connected to one is clean, so a NaN or Inf that leaks
//      (into other rows, other heads, other keys, from padding or blocked positions) fails.
//   3. Clean elements must be finite and within an error bound derived from float32 rounding
//      and the forward's own tolerance (the backward reads the forward's O and lse):
//        G_i   = Σ_c |dO_ic|·max_{j∈A_i} |v_jc|     bounds |dp_j| and |D_i| = |dO_i·O_i|
//        rel_i = 2·tol + 4·err_s + 16·2^-24·(1 + max_j |s_j|)   relative error of p_j
//                (tol = 1e-4: the forward's; the lse it saved is within tol of the reference)
//        f_i   = 2·rel_i + 2·tol + 4·err_s + 2·err_r/c + (E + Ev + Lk)·2^-24
//                relative error of ds_j = p_j·(dp_j - D_i)·(1 - t²), against p_j·G_i
//        dQ_id: |got - ref| <= f_i·|scale|·G_i·Σ_j p_ij·|k_jd| + tiny
//        dK_jd: |got - ref| <= Σ_i f_i·|scale|·p_ij·G_i·|q_id| + tiny
//        dV_jc: |got - ref| <= Σ_i (rel_i + 2·rows·2^-24)·p_ij·|dO_ic| + tiny   (rows: (Hq/Hkv)·Lq)
//      (tiny: subnormal rounding, 64·n·2^-149 scaled by the factors applied after it).
//      A term with p_ij < 2^-62 counts with its whole magnitude (2·|scale|·p_ij·G_i·|k_jd| or
//      |q_id|, p_ij·|dO_ic|) instead: the kernel's exp flushes p < 2^-63.5 to exactly 0
//      (src/math/f32-vexp-nonpositive-rr1-p5-wasmsimd.h), so the term may be missing.
//      These are bounds in terms of magnitudes, not of |ref|: a gradient is a difference
//      (dp_j - D_i) and may be much smaller than its terms.
//
//   4. Probabilities that sum to one, however large the scores: dV_j = Σ_i p_ij·dO_i, so for
//      each (batch, KV head) and column c, Σ_j dV_jc = Σ_i dO_ic over the rows i that attend
//      a key, when each such row's p sums to 1 in the kernel. That holds, with no conditioning
//      needed, for a row whose q, dO and attended k are finite with finite scores in range, and
//      which is clean (its p within rel_i of the reference's) or has its maximum and sum
//      recomputed by the kernel (sdpa_f32_bwd_row_stats_recomputed, src/kernels/sdpa-bwd-
//      kernels.h: |lse| or the size of its scores' terms past a limit), so Σ_j p_ij = 1 within
//      (|A_i| + 8)·4·2^-24. A (batch, KV head) with
//      any other row attending something is not checked, nor a column with Σ_i |dO_ic| near
//      FLT_MAX (the sums overflow). Bound: Σ_i |dO_ic|·(that row's
//      error + (rows + 2)·2·2^-24) + tiny. It catches what the conditioning of case 2 lets
//      through: tied scores at -1e9 rebuilt from a float32 lse that has lost log Σ.
//
//   5. The float mask's gradient (when bp.d_mask is given): element m of the mask gets
//      Σ ds_ij over the (b, h, i, j) that map to it (mask_at) and that row i attends.
//      An element no attending (row, key) maps to is exactly zero. One that a row that is not
//      clean maps to is not checked, nor one whose terms' magnitudes Σ p_ij·2·G_i come near
//      FLT_MAX (its float sum may overflow). Else, with each term's bound as for dK without the
//      |scale|·|q| factor (ds's own error: p_ij·(f_i·G_i + 2·D's subnormal error), or
//      p_ij·2·G_i whole when p_ij < 2^-62) and the float32 sum of its n terms
//      (n·2·2^-24·Σ p_ij·2·G_i):
//        |got - ref| <= Σ terms' bounds + sum rounding + n·tiny
//      (ds, not dr: the mask is added after the softcap; the f_i of case 3 still carries the
//      softcap's err_r/c, so the bound is a little looser than it needs to be there).
//
//   6. With sinks (Problem::sinks) and d_sinks: the forward's lse includes each row's sink, and
//      the reference's p_j sum to 1 - p_sink, p_sink = exp(sink - lse) (case 4 then sums
//      Σ_i (1 - p_sink,i)·dO_ic over rows that are clean, recomputed or not: the keys' share
//      depends on the scores, within row_error·(1 - p_sink)). d_sinks[h] = -Σ_{b,i} p_sink·D_i
//      is checked for a head whose every row with keys is clean, each term within
//      p_sink·(f_i·G_i + 2·D's subnormal error) + tiny (p_sink carries the lse's error, as every p
//      does; D = dO·O the forward's O error times |dO|), plus the float32 result's rounding. A row
//      with nothing to attend adds nothing (its O is zero), whatever its dO holds.
//
//   7. With dropout (attention-check.h: z_ij = F or 0 from src/kernels/dropout.h's scalar
//      definition, F = 2^32/(2^32 - threshold)), p_ij above is still the softmax (the reference's
//      weights without dropout), and the reference differentiates output = Σ_j p_j·z_j·v_j:
//      dp_j = z_j·(dO·v_j) and D = dO·O are within F·G, so every G above becomes F·G (in ds's
//      bounds, in tiny, in the limits of case 2), D's subnormal error and |O|'s overflow limit
//      scale with F, and dV's terms are p_ij·z_ij·|dO_ic|. Case 4 is not checked (Σ_j p_j·z_j is
//      not 1, and depends on the scores).
//
// And every gradient element is written (the buffers hold a sentinel NaN before the call),
// and nothing else (the padding of the output tensors and of the mask).
#pragma once

#include <vector>

#include "sdpa-backward.h"

namespace sdpa_fuzz {

// Checks bp.d_query/d_key/d_value, which point into dq/dk/dv (the whole buffers), bp.d_mask,
// if given, which points to dm (the whole buffer, as large as the mask's), and bp.d_sinks, if
// given, which points to ds ([Hq]).
void check_backward(const sdpa::BackwardProblem& bp, const std::vector<float>& dq, const std::vector<float>& dk,
                    const std::vector<float>& dv, const std::vector<float>& dm = {}, const std::vector<float>& ds = {});

}  // namespace sdpa_fuzz
