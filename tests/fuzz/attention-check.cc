// The oracle of the fuzz targets: see attention-check.h.
#include "attention-check.h"

namespace sdpa_fuzz {

void check_result(const Problem& p, const std::vector<float>& output, const std::vector<float>* weights,
                  const std::vector<float>* logsumexp) {
  std::vector<double> ref_weights;
  const std::vector<double> ref = sdpa::reference_forward(p, weights != nullptr ? &ref_weights : nullptr);
  const int64_t B = p.batch, Hq = p.q_heads, Lq = p.q_len, Lk = p.kv_len, E = p.head_dim, Ev = p.value_dim;
  const int64_t group = Hq / p.kv_heads;
  // Dropout (attention-check.h): coefficients p_j·z_j >= 0 summing to at most F.
  const bool dropout = p.dropout_threshold != 0;
  const double F = dropout ? dropout_factor_exact(p) : 1.0;

  // Written exactly where the output's elements are.
  std::vector<bool> is_element(output.size(), false);
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < Hq; h++) {
      for (int64_t i = 0; i < Lq; i++) {
        const int64_t row = b * p.o_stride_b + h * p.o_stride_h + i * p.o_stride_l;
        for (int64_t c = 0; c < Ev; c++) is_element[static_cast<size_t>(row + c)] = true;
      }
    }
  }
  for (size_t at = 0; at < output.size(); at++) {
    FUZZ_CHECK(p, is_sentinel(output[at]) != is_element[at], "output element %zu %s", at,
               is_element[at] ? "not written" : "written, but it is padding");
  }
  if (weights != nullptr) {
    for (size_t at = 0; at < weights->size(); at++) {
      FUZZ_CHECK(p, !is_sentinel((*weights)[at]), "weights element %zu not written", at);
    }
  }
  if (logsumexp != nullptr) {
    for (size_t at = 0; at < logsumexp->size(); at++) {
      FUZZ_CHECK(p, !is_sentinel((*logsumexp)[at]), "logsumexp element %zu not written", at);
    }
  }

  std::vector<int64_t> keys;                // A
  std::vector<double> score, score_error;   // s_j and err_j for j in A
  std::vector<double> prob;                 // the reference softmax over A
  std::vector<double> col_min(Ev), col_max(Ev), col_abs_max(Ev), col_abs_sum(Ev);
  std::vector<bool> col_finite(Ev);
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < Hq; h++) {
      const int64_t kvh = h / group;
      for (int64_t i = 0; i < Lq; i++) {
        const float* q = p.query + b * p.q_stride_b + h * p.q_stride_h + i * p.q_stride_l;
        const float* got = p.output + b * p.o_stride_b + h * p.o_stride_h + i * p.o_stride_l;
        const double* want = ref.data() + ((b * Hq + h) * Lq + i) * Ev;
        const int64_t weights_row = ((b * Hq + h) * Lq + i) * Lk;
        const float* lse = p.logsumexp != nullptr ? p.logsumexp + (b * Hq + h) * Lq + i : nullptr;
        // The head's sink (-inf: none): one more logit of the softmax whose value row is zero.
        const float sink = p.sinks != nullptr ? p.sinks[h] : -kInf;
        keys.clear(), score.clear(), score_error.clear();
        for (int64_t j = 0; j < Lk; j++) {
          if (attendable(p, b, h, i, j)) keys.push_back(j);
        }
        // Weights of keys outside A are exact zeros, unless the row's softmax itself is NaN.
        auto check_blocked_weights = [&](bool nan_allowed) {
          if (weights == nullptr) return;
          size_t next = 0;
          for (int64_t j = 0; j < Lk; j++) {
            if (next < keys.size() && keys[next] == j) {
              next++;
              continue;
            }
            const float w = p.weights[weights_row + j];
            FUZZ_CHECK(p, w == 0.0f || (nan_allowed && std::isnan(w)),
                       "row (b%lld h%lld i%lld): weight of blocked key %lld is %a, not 0", (long long)b, (long long)h,
                       (long long)i, (long long)j, w);
          }
        };

        if (keys.empty()) {  // case 1
          for (int64_t c = 0; c < Ev; c++) {
            FUZZ_CHECK(p, got[c] == 0.0f, "row (b%lld h%lld i%lld) attends no key: output[%lld] = %a, not 0",
                       (long long)b, (long long)h, (long long)i, (long long)c, got[c]);
          }
          check_blocked_weights(false);
          FUZZ_CHECK(p, lse == nullptr || *lse == sink, "row (b%lld h%lld i%lld) attends no key: logsumexp %a, not its sink %a",
                     (long long)b, (long long)h, (long long)i, lse != nullptr ? *lse : 0.0f, sink);
          continue;
        }

        // Scores in double, their float32 error bounds, and whether float32 can hold them.
        bool range_limited = false;
        for (int64_t d = 0; d < E; d++) {
          if (!(std::fabs(static_cast<double>(p.scale) * q[d]) < kFloatMax / 2)) range_limited = true;
        }
        bool poisoned = false, any_finite = false;
        for (int64_t j : keys) {
          const int64_t k_row = b * p.k_stride_b + kvh * p.k_stride_h + j * p.k_stride_l;
          double dot = 0.0, abs_dot = 0.0, k_abs_max = 0.0;
          for (int64_t d = 0; d < E; d++) {
            const double k = kv_element(p, p.key, k_row + d);
            dot += q[d] * k;
            abs_dot += std::fabs(q[d] * k);
            k_abs_max = std::max(k_abs_max, std::fabs(k));
          }
          const double bound = std::fabs(static_cast<double>(p.scale)) * abs_dot;  // |s| before softcap
          double s = p.scale * dot;
          double magnitude = bound;
          double error = (E + 4) * kEps * bound + E * k_abs_max * 0x1p-149;
          if (p.softcap > 0.0f) {
            s = p.softcap * std::tanh(s / p.softcap);
            magnitude = std::min(bound, static_cast<double>(p.softcap));
            error += 4 * kEps * p.softcap;
          }
          if (p.mask_kind == MaskKind::kFloat) {
            const double m = static_cast<const float*>(p.mask)[mask_at(p, b, h, i, j)];
            s += m;
            magnitude += std::fabs(m);
            error += 2 * kEps * std::fabs(m);
            if (p.alibi_slopes != nullptr) error += kEps * std::fabs(m);  // bias = mask + alibi, rounded
          }
          if (p.alibi_slopes != nullptr) {
            const double a = alibi_at(p, b, h, i, j);
            s += a;
            magnitude += std::fabs(a);
            error += 4 * kEps * std::fabs(a);
          }
          if (!(bound < kFloatMax / 4) || !(magnitude < kFloatMax * 0.999)) range_limited = true;
          if (std::isnan(s) || s == kInf) poisoned = true;
          if (std::isfinite(s)) any_finite = true;
          score.push_back(s);
          score_error.push_back(error);
        }

        if (poisoned) {  // case 2
          for (int64_t c = 0; c < Ev; c++) {
            FUZZ_CHECK(p, std::isnan(got[c]), "row (b%lld h%lld i%lld) has a NaN or +Inf score: output[%lld] = %a, not NaN",
                       (long long)b, (long long)h, (long long)i, (long long)c, got[c]);
          }
          if (weights != nullptr) {
            for (int64_t j : keys) {
              FUZZ_CHECK(p, std::isnan(p.weights[weights_row + j]), "row (b%lld h%lld i%lld) has a NaN score: weight %lld = %a",
                         (long long)b, (long long)h, (long long)i, (long long)j, p.weights[weights_row + j]);
            }
          }
          FUZZ_CHECK(p, lse == nullptr || std::isnan(*lse), "row (b%lld h%lld i%lld) has a NaN score: logsumexp %a, not NaN",
                     (long long)b, (long long)h, (long long)i, lse != nullptr ? *lse : 0.0f);
          continue;
        }

        // Per column: range over A, finiteness.
        for (int64_t c = 0; c < Ev; c++) {
          col_min[c] = kInf, col_max[c] = -kInf, col_abs_max[c] = 0.0, col_abs_sum[c] = 0.0, col_finite[c] = true;
        }
        for (int64_t j : keys) {
          const int64_t v_row = b * p.v_stride_b + kvh * p.v_stride_h + j * p.v_stride_l;
          for (int64_t c = 0; c < Ev; c++) {
            const double v = kv_element(p, p.value, v_row + c);
            if (!std::isfinite(v)) col_finite[c] = false;
            col_min[c] = std::min(col_min[c], v);
            col_max[c] = std::max(col_max[c], v);
            col_abs_max[c] = std::max(col_abs_max[c], std::fabs(v));
          }
        }
        const double count = static_cast<double>(keys.size());
        const double tiny = 64 * (count + E) * 0x1p-149;

        if (!any_finite) {  // case 3: every score -Inf
          for (int64_t c = 0; c < Ev; c++) {
            FUZZ_CHECK(p, got[c] == 0.0f || range_limited,
                       "row (b%lld h%lld i%lld): every score is -Inf, output[%lld] = %a, not 0", (long long)b, (long long)h,
                       (long long)i, (long long)c, got[c]);
          }
          if (weights != nullptr) {
            for (int64_t j = 0; j < Lk; j++) {
              const float w = p.weights[weights_row + j];
              FUZZ_CHECK(p, w == 0.0f || (range_limited && std::isnan(w)), "row (b%lld h%lld i%lld): every score is -Inf, weight %lld = %a",
                         (long long)b, (long long)h, (long long)i, (long long)j, w);
            }
          }
          FUZZ_CHECK(p, lse == nullptr || *lse == sink || range_limited,
                     "row (b%lld h%lld i%lld): every score is -Inf, logsumexp %a, not its sink %a", (long long)b, (long long)h,
                     (long long)i, lse != nullptr ? *lse : 0.0f, sink);
          continue;
        }

        // Case 4. The reference softmax (for Σ p_j|v_jc|), and err_s over the keys that
        // matter: those whose score may come within 120 of the float maximum (exp(-120) is
        // 1e-52, below anything a tolerance sees).
        double max_score = -kInf, max_lower = -kInf;
        for (size_t n = 0; n < keys.size(); n++) {
          max_score = std::max(max_score, score[n]);
          max_lower = std::max(max_lower, score[n] - score_error[n]);
        }
        // The sink joins the softmax's maximum and sum (exactly: it is not computed), and makes
        // the output a combination of the values with weights summing to less than 1: within
        // the hull of the values and 0.
        max_score = std::max(max_score, static_cast<double>(sink));
        double err_s = 0.0, sum = sink == -kInf ? 0.0 : std::exp(sink - max_score);
        prob.assign(keys.size(), 0.0);
        for (size_t n = 0; n < keys.size(); n++) {
          if (score[n] + score_error[n] >= max_lower - 120) err_s = std::max(err_s, score_error[n]);
          prob[n] = std::exp(score[n] - max_score);
          sum += prob[n];
        }
        if (sink != -kInf) {
          for (int64_t c = 0; c < Ev; c++) col_min[c] = std::min(col_min[c], 0.0), col_max[c] = std::max(col_max[c], 0.0);
        }
        for (size_t n = 0; n < keys.size(); n++) {
          prob[n] /= sum;
          const double kept = prob[n] * dropout_z(p, b, h, i, keys[n]);  // p_j·z_j
          const int64_t v_row = b * p.v_stride_b + kvh * p.v_stride_h + keys[n] * p.v_stride_l;
          for (int64_t c = 0; c < Ev; c++) {
            if (kept != 0.0) col_abs_sum[c] += kept * std::fabs(kv_element(p, p.value, v_row + c));
          }
        }
        const bool well_conditioned = !range_limited && err_s <= kWellConditioned;
        if (lse != nullptr && !range_limited) {
          // log Σ_j exp(s_j) = max + log Σ_j exp(s_j - max); float32 rounds max and the log.
          const double want_lse = max_score + std::log(sum);
          FUZZ_CHECK(p, std::isfinite(*lse), "row (b%lld h%lld i%lld): logsumexp %a not finite, reference %.9g",
                     (long long)b, (long long)h, (long long)i, *lse, want_lse);
          const double allowed = well_conditioned ? kTolerance * (1 + std::fabs(want_lse)) + 2 * err_s
                                                  : 2 * err_s + 1e-4 * (1 + std::fabs(want_lse)) + std::log(count);
          FUZZ_CHECK(p, std::fabs(*lse - want_lse) <= allowed,
                     "row (b%lld h%lld i%lld): logsumexp %.9g, reference %.9g, |diff| %.3g > allowed %.3g", (long long)b,
                     (long long)h, (long long)i, *lse, want_lse, std::fabs(*lse - want_lse), allowed);
        }

        for (int64_t c = 0; c < Ev; c++) {
          if (!col_finite[c]) continue;
          const bool column_range_limited = range_limited || !(count * F * col_abs_max[c] < kFloatMax / 4);
          const double g = got[c];
          // Float32 overflow may also have made every score -Inf: the row then attends nothing.
          if (column_range_limited && (!std::isfinite(g) || g == 0.0)) continue;
          FUZZ_CHECK(p, std::isfinite(g), "row (b%lld h%lld i%lld): output[%lld] = %a is not finite, reference %a",
                     (long long)b, (long long)h, (long long)i, (long long)c, g, want[c]);
          if (well_conditioned && !column_range_limited) {
            const double allowed = kTolerance * (std::fabs(want[c]) + col_abs_sum[c]) + 4 * err_s * F * col_abs_max[c] +
                                   1e-40 * count * F * col_abs_max[c] + F * tiny;
            FUZZ_CHECK(p, std::fabs(g - want[c]) <= allowed,
                       "row (b%lld h%lld i%lld): output[%lld] = %.9g, reference %.9g, |diff| %.3g > allowed %.3g (err_s %.3g)",
                       (long long)b, (long long)h, (long long)i, (long long)c, g, want[c], std::fabs(g - want[c]), allowed,
                       err_s);
          } else {
            const double slack = F * ((count + 16) * 0x1p-22 * col_abs_max[c] + tiny);
            // With dropout, within [F·min(min, 0), F·max(max, 0)] (attention-check.h).
            const double lo = dropout ? F * std::min(col_min[c], 0.0) : col_min[c];
            const double hi = dropout ? F * std::max(col_max[c], 0.0) : col_max[c];
            FUZZ_CHECK(p, g >= lo - slack && g <= hi + slack,
                       "row (b%lld h%lld i%lld): output[%lld] = %.9g outside [%.9g, %.9g], the values it averages "
                       "(reference %.9g, err_s %.3g)",
                       (long long)b, (long long)h, (long long)i, (long long)c, g, lo, hi, want[c], err_s);
          }
        }

        if (weights == nullptr) continue;
        // Float32 overflow (an Inf maximum, an Inf - Inf) may make every weight of the row NaN.
        check_blocked_weights(range_limited);
        for (size_t n = 0; n < keys.size(); n++) {
          const int64_t j = keys[n];
          const double w = p.weights[weights_row + j];
          if (range_limited && !std::isfinite(w)) continue;
          FUZZ_CHECK(p, w >= 0.0 && w <= F * (1.0 + 1e-6), "row (b%lld h%lld i%lld): weight %lld = %a outside [0, %g]",
                     (long long)b, (long long)h, (long long)i, (long long)j, w, F);
          if (dropout && dropout_z(p, b, h, i, j) == 0.0) {  // dropped: exactly 0, however conditioned
            FUZZ_CHECK(p, w == 0.0, "row (b%lld h%lld i%lld): weight %lld = %a of a dropped key, not 0", (long long)b,
                       (long long)h, (long long)i, (long long)j, w);
            continue;
          }
          if (!well_conditioned) continue;
          const double w_ref = ref_weights[static_cast<size_t>(weights_row + j)];
          // The absolute term: a p the kernel's exp flushes to 0 (below 2^-63.5, about 7.6e-20),
          // times the dropout factor for a kept key (w_ref = p·F).
          const double allowed = (kTolerance + 4 * err_s) * w_ref + F * 1e-18;
          FUZZ_CHECK(p, std::fabs(w - w_ref) <= allowed,
                     "row (b%lld h%lld i%lld): weight %lld = %.9g, reference %.9g, |diff| %.3g > allowed %.3g",
                     (long long)b, (long long)h, (long long)i, (long long)j, w, w_ref, std::fabs(w - w_ref), allowed);
        }
      }
    }
  }
}

}  // namespace sdpa_fuzz
