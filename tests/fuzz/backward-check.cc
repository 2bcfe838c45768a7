// The oracle of the backward fuzz target: see backward-check.h.
#include "backward-check.h"

#include "attention-check.h"
#include "kernels/sdpa-bwd-kernels.h"

namespace sdpa_fuzz {

namespace {

// Written exactly where a [n0, n1, n2, n3] tensor's elements are (strides s0 .. s3; an axis
// of stride 0 is broadcast: its elements are one).
void check_written(const Problem& p, const std::vector<float>& x, int64_t n0, int64_t n1, int64_t n2, int64_t n3,
                   int64_t s0, int64_t s1, int64_t s2, int64_t s3, const char* name) {
  std::vector<bool> is_element(x.size(), false);
  for (int64_t a = 0; a < n0; a++)
    for (int64_t b = 0; b < n1; b++)
      for (int64_t c = 0; c < n2; c++)
        for (int64_t d = 0; d < n3; d++) is_element[static_cast<size_t>(a * s0 + b * s1 + c * s2 + d * s3)] = true;
  for (size_t at = 0; at < x.size(); at++) {
    FUZZ_CHECK(p, is_sentinel(x[at]) != is_element[at], "%s element %zu %s", name, at,
               is_element[at] ? "not written" : "written, but it is padding");
  }
}

bool all_finite(const float* x, int64_t n) {
  for (int64_t k = 0; k < n; k++) {
    if (!std::isfinite(x[k])) return false;
  }
  return true;
}

}  // namespace

void check_backward(const sdpa::BackwardProblem& bp, const std::vector<float>& dq, const std::vector<float>& dk,
                    const std::vector<float>& dv, const std::vector<float>& dm, const std::vector<float>& ds) {
  const Problem& p = bp.forward;
  const int64_t B = p.batch, Hq = p.q_heads, Hkv = p.kv_heads, Lq = p.q_len, Lk = p.kv_len, E = p.head_dim,
                Ev = p.value_dim;
  const int64_t group = Hq / Hkv;
  check_written(p, dq, B, Hq, Lq, E, bp.dq_stride_b, bp.dq_stride_h, bp.dq_stride_l, 1, "d_query");
  check_written(p, dk, B, Hkv, Lk, E, bp.dk_stride_b, bp.dk_stride_h, bp.dk_stride_l, 1, "d_key");
  check_written(p, dv, B, Hkv, Lk, Ev, bp.dv_stride_b, bp.dv_stride_h, bp.dv_stride_l, 1, "d_value");
  const bool mask_grad = bp.d_mask != nullptr;
  if (mask_grad) {
    FUZZ_CHECK(p, bp.d_mask == dm.data(), "check_backward: d_mask is not the given buffer");
    check_written(p, dm, B, Hq, Lq, Lk, p.mask_stride_b, p.mask_stride_h, p.mask_stride_q, p.mask_stride_k, "d_mask");
  }
  const bool sink_grad = bp.d_sinks != nullptr;
  if (sink_grad) {
    FUZZ_CHECK(p, bp.d_sinks == ds.data() && ds.size() == static_cast<size_t>(Hq), "check_backward: d_sinks is not the given buffer");
    for (size_t h = 0; h < ds.size(); h++) FUZZ_CHECK(p, !is_sentinel(ds[h]), "d_sinks element %zu not written", h);
  }

  const sdpa::ReferenceGradients ref = sdpa::reference_backward(bp);
  // The softmax p (the weights without dropout) and its lse; with dropout, z (dropout_z) and its
  // factor F multiply the bounds' magnitudes (backward-check.h).
  std::vector<double> weights, ref_lse;
  Problem softmax_only = p;
  softmax_only.dropout_threshold = 0;
  sdpa::reference_forward(softmax_only, &weights, &ref_lse);
  const bool dropout = p.dropout_threshold != 0;
  const double F = dropout ? dropout_factor_exact(p) : 1.0;
  const float* key = static_cast<const float*>(p.key);
  const float* value = static_cast<const float*>(p.value);
  const double abs_scale = std::fabs(static_cast<double>(p.scale));
  const double tol = kTolerance;

  // Per key (dense [B, Hkv, Lk]): rows attending it, whether all are clean, and the bounds.
  const size_t keys_total = static_cast<size_t>(B * Hkv * Lk);
  std::vector<int64_t> attending(keys_total, 0);
  std::vector<bool> key_clean(keys_total, true);
  std::vector<double> dk_bound(keys_total * static_cast<size_t>(E), 0.0), dv_bound(keys_total * static_cast<size_t>(Ev), 0.0);
  std::vector<double> key_tiny_factor(keys_total, 0.0);

  // Case 4, per (b, KV head) and column: whether every row attending a key sums its p to one,
  // Σ_i dO_ic over those rows, and the bound.
  const size_t pairs_total = static_cast<size_t>(B * Hkv);
  std::vector<bool> pair_sums(pairs_total, true);
  std::vector<double> go_sum(pairs_total * static_cast<size_t>(Ev), 0.0), go_abs_sum(pairs_total * static_cast<size_t>(Ev), 0.0),
      go_sum_bound(pairs_total * static_cast<size_t>(Ev), 0.0);

  // Case 5, per element of the mask: the (row, key) terms mapping to it, whether all their
  // rows are clean, the sum of the terms' bounds, Σ p·2G (for the float sum's rounding) and
  // the largest tiny.
  const size_t mask_total = mask_grad ? dm.size() : 0;
  std::vector<int64_t> dm_terms(mask_total, 0);
  std::vector<bool> dm_clean(mask_total, true);
  std::vector<double> dm_bound(mask_total, 0.0), dm_magnitude(mask_total, 0.0), dm_tiny(mask_total, 0.0);

  // Case 6, per head: whether every row with keys is clean, the sum of the terms' bounds and
  // of their magnitudes p_sink·G.
  std::vector<bool> sink_clean(static_cast<size_t>(Hq), true);
  std::vector<double> sink_bound(static_cast<size_t>(Hq), 0.0), sink_magnitude(static_cast<size_t>(Hq), 0.0);

  std::vector<int64_t> keys;
  std::vector<double> score, score_error, cap_error;
  std::vector<double> v_abs_max(static_cast<size_t>(Ev)), dq_bound(static_cast<size_t>(E));
  const double n_all = static_cast<double>(Lk + group * Lq + E + Ev);
  // The reference's gradients, this check's bounds and |got - want| are double sums of at
  // most n_all terms: each is off by at most n_all·2^-53 times the sum of its terms'
  // magnitudes; as a fraction of each term's bound below, 4·n_all·2^-53 covers all three.
  // Negligible beside the float errors, but not beside a flushed term's exact bound (p·|dO|
  // = 1e10, a 1e-6 double rounding, next to a float term of 1e-3 allowed 1e-7:
  // checker-cases.cc).
  const double double_rounding = 4 * n_all * 0x1p-53;
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < Hq; h++) {
      const int64_t kvh = h / group;
      for (int64_t i = 0; i < Lq; i++) {
        const float* q = p.query + b * p.q_stride_b + h * p.q_stride_h + i * p.q_stride_l;
        const float* go = bp.grad_output + b * bp.go_stride_b + h * bp.go_stride_h + i * bp.go_stride_l;
        const float* got_dq = bp.d_query + b * bp.dq_stride_b + h * bp.dq_stride_h + i * bp.dq_stride_l;
        const double* want_dq = ref.d_query.data() + ((b * Hq + h) * Lq + i) * E;
        const double* prob = weights.data() + ((b * Hq + h) * Lq + i) * Lk;
        // The head's sink (-inf: none) and its probability in this row, exp(sink - lse).
        const double sink = p.sinks != nullptr ? p.sinks[h] : -kInf;
        const double p_sink = sink == -kInf ? 0.0 : std::exp(sink - ref_lse[static_cast<size_t>((b * Hq + h) * Lq + i)]);
        keys.clear(), score.clear(), score_error.clear(), cap_error.clear();
        for (int64_t j = 0; j < Lk; j++) {
          if (attendable(p, b, h, i, j)) keys.push_back(j);
        }
        if (keys.empty()) {  // case 1
          for (int64_t d = 0; d < E; d++) {
            FUZZ_CHECK(p, got_dq[d] == 0.0f, "row (b%lld h%lld i%lld) attends no key: d_query[%lld] = %a, not 0",
                       (long long)b, (long long)h, (long long)i, (long long)d, got_dq[d]);
          }
          continue;
        }

        // Case 2: is the row clean?
        bool clean = all_finite(q, E) && all_finite(go, Ev);
        double q_abs_max = 0.0;
        for (int64_t d = 0; d < E; d++) {
          q_abs_max = std::max(q_abs_max, std::fabs(static_cast<double>(q[d])));
          if (!(abs_scale * std::fabs(q[d]) < kFloatMax / 2)) clean = false;
        }
        std::fill(v_abs_max.begin(), v_abs_max.end(), 0.0);
        double k_abs_max_row = 0.0;
        for (int64_t j : keys) {
          const float* k = key + b * p.k_stride_b + kvh * p.k_stride_h + j * p.k_stride_l;
          const float* v = value + b * p.v_stride_b + kvh * p.v_stride_h + j * p.v_stride_l;
          if (!all_finite(k, E) || !all_finite(v, Ev)) clean = false;
          double dot = 0.0, abs_dot = 0.0, k_abs_max = 0.0;
          for (int64_t d = 0; d < E; d++) {
            dot += static_cast<double>(q[d]) * k[d];
            abs_dot += std::fabs(static_cast<double>(q[d]) * k[d]);
            k_abs_max = std::max(k_abs_max, std::fabs(static_cast<double>(k[d])));
          }
          k_abs_max_row = std::max(k_abs_max_row, k_abs_max);
          for (int64_t c = 0; c < Ev; c++) v_abs_max[c] = std::max(v_abs_max[c], std::fabs(static_cast<double>(v[c])));
          const double bound = abs_scale * abs_dot;
          double s = p.scale * dot, magnitude = bound;
          // Relative rounding, scale·q rounded to the subnormal grid (times |k|), and the E
          // products and E sums rounded to it (at most 2^-150 each: absolute, whatever |k|;
          // divided by a softcap of 2^-149 that is O(1), and the row is ill-conditioned).
          const double error_r = (E + 4) * kEps * bound + E * k_abs_max * 0x1p-149 + E * 0x1p-149;
          double error = error_r, cap = 0.0;
          if (p.softcap > 0.0f) {
            s = p.softcap * std::tanh(s / p.softcap);
            magnitude = std::min(bound, static_cast<double>(p.softcap));
            error += 4 * kEps * p.softcap;
            cap = error_r / p.softcap;
          }
          if (p.mask_kind == MaskKind::kFloat) {
            const double m = static_cast<const float*>(p.mask)[mask_at(p, b, h, i, j)];
            s += m;
            magnitude += std::fabs(m);
            error += 2 * kEps * std::fabs(m);
            if (p.alibi_slopes != nullptr) error += kEps * std::fabs(m);  // bias = mask + alibi, rounded
          }
          if (p.alibi_slopes != nullptr) {  // ALiBi (attention-check.h): float(d), the product, the sums
            const double a = alibi_at(p, b, h, i, j);
            s += a;
            magnitude += std::fabs(a);
            error += 4 * kEps * std::fabs(a);
          }
          if (!(bound < kFloatMax / 4) || !(magnitude < kFloatMax * 0.999) || !std::isfinite(s)) clean = false;
          score.push_back(s);
          score_error.push_back(error);
          cap_error.push_back(cap);
        }
        const bool finite_row = clean;  // finite operands and scores, in range (case 4)
        double err_s = 0.0, err_cap = 0.0, max_score = -kInf, max_lower = -kInf;
        if (clean) {
          for (size_t n = 0; n < keys.size(); n++) {
            max_score = std::max(max_score, score[n]);
            max_lower = std::max(max_lower, score[n] - score_error[n]);
          }
          for (size_t n = 0; n < keys.size(); n++) {
            if (score[n] + score_error[n] >= max_lower - 120) {
              err_s = std::max(err_s, score_error[n]);
              err_cap = std::max(err_cap, cap_error[n]);
            }
          }
          if (!(err_s <= kWellConditioned) || !(err_cap <= kWellConditioned)) clean = false;
        }
        double G = 0.0;
        for (int64_t c = 0; c < Ev; c++) {
          G += std::fabs(static_cast<double>(go[c])) * v_abs_max[c];
          // The forward's O_c may overflow (a sum of |A| values near FLT_MAX), and D = dO·O
          // with it, even where dO_c = 0 (Inf·0).
          if (!(static_cast<double>(keys.size()) * F * v_abs_max[c] < kFloatMax / 16)) clean = false;
        }
        // With dropout dp_j = z_j·(dO·v_j) and D = dO·O are within F·G, dV's terms p·z·dO within F·|dO|.
        const double GF = F * G;
        // Far from overflow: dp, D (≤ G), ds·k, ds·q before and after the scale.
        double go_abs_max = 0.0;  // dV sums p·dO over the rows
        for (int64_t c = 0; c < Ev; c++) go_abs_max = std::max(go_abs_max, std::fabs(static_cast<double>(go[c])));
        const double big = std::max({GF, F * go_abs_max, 2 * GF * k_abs_max_row, 2 * GF * q_abs_max,
                                     2 * GF * abs_scale * std::max(k_abs_max_row, q_abs_max)});
        if (!(big * static_cast<double>(Lk + group * Lq) < kFloatMax / 16)) clean = false;

        // The size of the row's lse, whose float32 ulp is a relative error of every p_j: its
        // largest score, or its sink when that is larger.
        const double lse_size = std::max(max_score, sink);
        // Case 4: does this row's p sum to one (1 - p_sink with a sink) in the kernel, and within what?
        const size_t pair = static_cast<size_t>(b * Hkv + kvh);
        const float lse = bp.logsumexp[(b * Hq + h) * Lq + i];
        const bool recomputed = sdpa::sdpa_f32_bwd_row_stats_recomputed(bp, static_cast<int32_t>(b), static_cast<int32_t>(h),
                                                                       static_cast<int32_t>(i), lse);
        // With a sink the keys' share, 1 - p_sink, depends on the scores: the row must be well
        // conditioned (clean) even when recomputed, and its error is then relative to that share
        // (a score moved by err_s moves p_sink by at most 2·err_s·p_sink·(1 - p_sink)); a
        // recomputed sum adds its roundings (the keys', and M, exp and L's few).
        const bool has_sink = sink != -kInf;
        // (Not with dropout: Σ_j p_j·z_j is not 1, and depends on the scores.)
        if (!dropout && finite_row && (clean || (recomputed && !has_sink))) {
          const double computed = 2 * tol + 4 * err_s + 16 * kEps * (1 + std::fabs(lse_size));
          const double summed = static_cast<double>(keys.size() + 16) * 4 * kEps;
          const double row_error = has_sink ? computed + (recomputed ? summed : 0.0) : recomputed ? summed : computed;
          for (int64_t c = 0; c < Ev; c++) {
            go_sum[pair * Ev + c] += go[c] * (1.0 - p_sink);
            go_abs_sum[pair * Ev + c] += std::fabs(static_cast<double>(go[c]));
            go_sum_bound[pair * Ev + c] += std::fabs(static_cast<double>(go[c])) *
                                           (row_error * (1.0 - p_sink) + static_cast<double>(group * Lq + 2) * 2 * kEps);
          }
        } else {
          pair_sums[pair] = false;
        }

        if (!clean) {
          sink_clean[static_cast<size_t>(h)] = false;
          for (int64_t j : keys) key_clean[static_cast<size_t>((b * Hkv + kvh) * Lk + j)] = false;
          for (int64_t j : keys) attending[static_cast<size_t>((b * Hkv + kvh) * Lk + j)]++;
          for (int64_t j : keys) {
            if (!mask_grad) break;
            const size_t m = static_cast<size_t>(mask_at(p, b, h, i, j));
            dm_terms[m]++;
            dm_clean[m] = false;
          }
          continue;
        }

        const double rel = 2 * tol + 4 * err_s + 16 * kEps * (1 + std::fabs(lse_size));
        const double f = 2 * rel + 2 * tol + 4 * err_s + 2 * err_cap + static_cast<double>(E + Ev + Lk) * kEps;
        // D = dO·O takes the forward's float32 O, whose elements below 2^-126 sit on the
        // subnormal grid: each may be off by up to (Lk + 4)·2^-149 absolutely (each product,
        // sum, rescale and the final 1/l rounding there), whatever G. A large dO multiplies that
        // (a V column of subnormals under dO_c = 1e30: an error of the order of G itself), and
        // every ds = p·(dp - D)·(1 - t²) of the row carries it, times |k| in dQ and |q| in dK.
        double d_abs_error = 0.0;
        for (int64_t c = 0; c < Ev; c++) d_abs_error += std::fabs(static_cast<double>(go[c])) * static_cast<double>(Lk + 4) * 0x1p-149 * F;
        const double tiny = 64 * n_all * 0x1p-149 * std::max(1.0, abs_scale) *
                            std::max(1.0, GF) * std::max({1.0, k_abs_max_row, q_abs_max});
        // Case 6: this row's term of d_sinks, -p_sink·D: p_sink within rel, D within the
        // forward's O error times |dO| (f covers both), its subnormal error, and tiny.
        sink_bound[static_cast<size_t>(h)] += p_sink * (f * GF + 2 * d_abs_error) + tiny;
        sink_magnitude[static_cast<size_t>(h)] += p_sink * GF;
        std::fill(dq_bound.begin(), dq_bound.end(), 0.0);
        for (int64_t j : keys) {
          const size_t key_at = static_cast<size_t>((b * Hkv + kvh) * Lk + j);
          attending[key_at]++;
          key_tiny_factor[key_at] = std::max(key_tiny_factor[key_at], tiny);
          const double pj = prob[j], zj = dropout_z(p, b, h, i, j);
          const float* k = key + b * p.k_stride_b + kvh * p.k_stride_h + j * p.k_stride_l;
          // The kernel's exp flushes p < 2^-63.5 to 0 (src/math/f32-vexp-nonpositive-rr1-p5-
          // wasmsimd.h): such a term (bounded by |scale|·p·2G·|k|, p·|dO|) may be dropped.
          const bool flushable = pj < 0x1p-62;
          const double fk = (flushable ? 2.0 : f) + 2 * double_rounding,  // |dp - D| ≤ 2G
                       fv = (flushable ? 1.0 : rel + static_cast<double>(group * Lq) * 2 * kEps) + double_rounding;
          for (int64_t d = 0; d < E; d++) {
            dq_bound[d] += abs_scale * pj * std::fabs(static_cast<double>(k[d])) * (fk * GF + 2 * d_abs_error);
            dk_bound[key_at * E + d] += abs_scale * pj * std::fabs(static_cast<double>(q[d])) * (fk * GF + 2 * d_abs_error);
          }
          for (int64_t c = 0; c < Ev; c++) dv_bound[key_at * Ev + c] += fv * pj * zj * std::fabs(static_cast<double>(go[c]));
          if (mask_grad) {  // case 5: ds_ij itself
            const size_t m = static_cast<size_t>(mask_at(p, b, h, i, j));
            dm_terms[m]++;
            dm_bound[m] += pj * (fk * GF + 2 * d_abs_error);
            dm_magnitude[m] += pj * 2 * GF;
            dm_tiny[m] = std::max(dm_tiny[m], tiny);
          }
        }
        for (int64_t d = 0; d < E; d++) {
          const double g = got_dq[d], allowed = dq_bound[d] + tiny;
          FUZZ_CHECK(p, std::isfinite(g) && std::fabs(g - want_dq[d]) <= allowed,
                     "row (b%lld h%lld i%lld): d_query[%lld] = %.9g, reference %.9g, |diff| %.3g > allowed %.3g "
                     "(err_s %.3g, G %.3g)",
                     (long long)b, (long long)h, (long long)i, (long long)d, g, want_dq[d], std::fabs(g - want_dq[d]),
                     allowed, err_s, G);
        }
      }
    }
  }

  for (int64_t b = 0; b < B; b++) {
    for (int64_t kvh = 0; kvh < Hkv; kvh++) {
      for (int64_t j = 0; j < Lk; j++) {
        const size_t key_at = static_cast<size_t>((b * Hkv + kvh) * Lk + j);
        const float* got_dk = bp.d_key + b * bp.dk_stride_b + kvh * bp.dk_stride_h + j * bp.dk_stride_l;
        const float* got_dv = bp.d_value + b * bp.dv_stride_b + kvh * bp.dv_stride_h + j * bp.dv_stride_l;
        if (attending[key_at] == 0) {  // case 1
          for (int64_t d = 0; d < E; d++) {
            FUZZ_CHECK(p, got_dk[d] == 0.0f, "key (b%lld kvh%lld j%lld) attended by no row: d_key[%lld] = %a, not 0",
                       (long long)b, (long long)kvh, (long long)j, (long long)d, got_dk[d]);
          }
          for (int64_t c = 0; c < Ev; c++) {
            FUZZ_CHECK(p, got_dv[c] == 0.0f, "key (b%lld kvh%lld j%lld) attended by no row: d_value[%lld] = %a, not 0",
                       (long long)b, (long long)kvh, (long long)j, (long long)c, got_dv[c]);
          }
          continue;
        }
        if (!key_clean[key_at]) continue;
        const double tiny = key_tiny_factor[key_at] * static_cast<double>(attending[key_at]);
        for (int64_t d = 0; d < E; d++) {
          const double g = got_dk[d], want = ref.d_key[key_at * E + d], allowed = dk_bound[key_at * E + d] + tiny;
          FUZZ_CHECK(p, std::isfinite(g) && std::fabs(g - want) <= allowed,
                     "key (b%lld kvh%lld j%lld): d_key[%lld] = %.9g, reference %.9g, |diff| %.3g > allowed %.3g",
                     (long long)b, (long long)kvh, (long long)j, (long long)d, g, want, std::fabs(g - want), allowed);
        }
        for (int64_t c = 0; c < Ev; c++) {
          const double g = got_dv[c], want = ref.d_value[key_at * Ev + c], allowed = dv_bound[key_at * Ev + c] + tiny;
          FUZZ_CHECK(p, std::isfinite(g) && std::fabs(g - want) <= allowed,
                     "key (b%lld kvh%lld j%lld): d_value[%lld] = %.9g, reference %.9g, |diff| %.3g > allowed %.3g",
                     (long long)b, (long long)kvh, (long long)j, (long long)c, g, want, std::fabs(g - want), allowed);
        }
      }
    }
  }

  // Case 5: the float mask's gradient.
  for (size_t m = 0; m < mask_total; m++) {
    if (is_sentinel(dm[m])) continue;  // padding: check_written found every element written
    const int64_t n = dm_terms[m];
    if (n == 0) {
      FUZZ_CHECK(p, dm[m] == 0.0f, "d_mask[%zu] = %a: no row attends a key mapping to it, not 0", m, dm[m]);
      continue;
    }
    // Not checked: a term of a row that is not clean, or terms so large that the float sum
    // (every partial sum within Σ p·2G) may overflow where each row's did not.
    if (!dm_clean[m] || !(dm_magnitude[m] < kFloatMax / 16)) continue;
    const double g = dm[m], want = ref.d_mask[m];
    // The float sum's rounding also covers the reference's double sum of the n terms.
    const double allowed = dm_bound[m] + static_cast<double>(n) * 2 * kEps * dm_magnitude[m] +
                           static_cast<double>(n) * dm_tiny[m];
    FUZZ_CHECK(p, std::isfinite(g) && std::fabs(g - want) <= allowed,
               "d_mask[%zu] (%lld terms) = %.9g, reference %.9g, |diff| %.3g > allowed %.3g", m, (long long)n, g, want,
               std::fabs(g - want), allowed);
  }

  // Case 6: the sinks' gradient, per head whose every row with keys is clean. Rows with nothing
  // to attend add exactly nothing (their O is zero, their D 0) to both.
  for (int64_t h = 0; sink_grad && h < Hq; h++) {
    if (!sink_clean[static_cast<size_t>(h)] || !(sink_magnitude[static_cast<size_t>(h)] < kFloatMax / 16)) continue;
    const double g = ds[static_cast<size_t>(h)], want = ref.d_sinks[static_cast<size_t>(h)];
    // The float32 result's rounding, and the double sums' (B·Lq terms).
    const double allowed = sink_bound[static_cast<size_t>(h)] + 2 * kEps * sink_magnitude[static_cast<size_t>(h)] +
                           double_rounding * sink_magnitude[static_cast<size_t>(h)] + 64 * 0x1p-149;
    FUZZ_CHECK(p, std::isfinite(g) && std::fabs(g - want) <= allowed,
               "d_sinks[%lld] = %.9g, reference %.9g, |diff| %.3g > allowed %.3g", (long long)h, g, want, std::fabs(g - want),
               allowed);
  }

  // Case 4: Σ_j dV_jc = Σ_i dO_ic over the rows that attend a key.
  for (int64_t b = 0; b < B; b++) {
    for (int64_t kvh = 0; kvh < Hkv; kvh++) {
      const size_t pair = static_cast<size_t>(b * Hkv + kvh);
      if (!pair_sums[pair]) continue;
      for (int64_t c = 0; c < Ev; c++) {
        // Far from overflow: every partial sum of dV (and their sum here) is within Σ_i |dO_ic|.
        if (!(go_abs_sum[pair * Ev + c] < kFloatMax / 16)) continue;
        double got = 0.0;
        for (int64_t j = 0; j < Lk; j++) got += bp.d_value[b * bp.dv_stride_b + kvh * bp.dv_stride_h + j * bp.dv_stride_l + c];
        const double want = go_sum[pair * Ev + c];
        const double allowed = go_sum_bound[pair * Ev + c] + 64 * static_cast<double>(Lk + group * Lq) * 0x1p-149;
        FUZZ_CHECK(p, std::isfinite(got) && std::fabs(got - want) <= allowed,
                   "(b%lld kvh%lld): sum over keys of d_value[%lld] = %.9g, but the rows' probabilities sum to one: "
                   "sum of their d_output %.9g, |diff| %.3g > allowed %.3g",
                   (long long)b, (long long)kvh, (long long)c, got, want, std::fabs(got - want), allowed);
      }
    }
  }
}

}  // namespace sdpa_fuzz
