#include "reference/sdpa-reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace sdpa {
namespace {

// An IEEE binary16 value from its definition (not from the kernel's conversion):
// (-1)^s · m·2^-24 (e = 0), (-1)^s · (1 + m/1024)·2^(e-15) (e in 1..30), ±Inf or NaN (e = 31).
double half_value(uint16_t h) {
  const double sign = (h & 0x8000) != 0 ? -1.0 : 1.0;
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 0x1F) return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1.0 + m / 1024.0, e - 15);
}

// A bfloat16's value from the format's definition: the float32 whose upper 16 bits it is.
double bfloat16_value(uint16_t b) {
  const double sign = (b & 0x8000) != 0 ? -1.0 : 1.0;
  const int e = (b >> 7) & 0xFF, m = b & 0x7F;
  if (e == 0xFF) return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(m, -133);  // subnormal: m·2^-7·2^-126
  return sign * std::ldexp(1.0 + m / 128.0, e - 127);
}

// Element `at` of a key or value tensor of the problem's kv_type.
double kv_element(const Problem& p, const void* base, int64_t at) {
  if (is_half(p.kv_type)) return half_value(static_cast<const uint16_t*>(base)[at]);
  if (p.kv_type == KvType::kBFloat16) return bfloat16_value(static_cast<const uint16_t*>(base)[at]);
  return static_cast<const float*>(base)[at];
}

// Attention dropout's z for (b, h, i, j) from its definition (src/kernels/dropout.h, written
// out again here): 1 without dropout; else 0 where the key's bits are below the threshold, and
// 2^32 / (2^32 - threshold) in double where they are not.
uint32_t murmur3_finalizer(uint32_t x) {
  x = (x ^ (x >> 16)) * 0x85EBCA6Bu;
  x = (x ^ (x >> 13)) * 0xC2B2AE35u;
  return x ^ (x >> 16);
}

double dropout_z(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (p.dropout_threshold == 0) return 1.0;
  uint32_t row = murmur3_finalizer(p.dropout_seed);
  for (const int64_t index : {static_cast<int64_t>(p.dropout_batch_base) + b, static_cast<int64_t>(p.dropout_head_base) + h,
                              static_cast<int64_t>(p.dropout_row_base) + i}) {
    row = murmur3_finalizer(row + static_cast<uint32_t>(index));
  }
  const uint32_t bits = murmur3_finalizer(row ^ (static_cast<uint32_t>(j) * 0x9E3779B9u));
  return bits < p.dropout_threshold ? 0.0 : 4294967296.0 / (4294967296.0 - p.dropout_threshold);
}

// reference_forward, with the weights before dropout (`dropped_weights` false: the softmax, what
// the backward needs) or after it (true: what the kernel returns).
std::vector<double> forward_rows(const Problem& p, std::vector<double>* weights, std::vector<double>* logsumexp,
                                 bool dropped_weights) {
  const int64_t B = p.batch, Hq = p.q_heads, Hkv = p.kv_heads, Lq = p.q_len, Lk = p.kv_len,
                E = p.head_dim, Ev = p.value_dim;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> out(static_cast<size_t>(B * Hq * Lq * Ev), 0.0);
  if (weights != nullptr) weights->assign(static_cast<size_t>(B * Hq * Lq * Lk), 0.0);
  if (logsumexp != nullptr) logsumexp->assign(static_cast<size_t>(B * Hq * Lq), neg_inf);

  std::vector<double> logits(static_cast<size_t>(Lk));
  std::vector<bool> blocked(static_cast<size_t>(Lk));
  for (int64_t b = 0; b < B; b++) {
    const int64_t valid_keys = p.key_lengths != nullptr ? p.key_lengths[b] : Lk;
    const int64_t offset = p.causal_offsets != nullptr ? p.causal_offsets[b] : p.causal_offset;
    for (int64_t h = 0; h < Hq; h++) {
      const int64_t kvh = h / (Hq / Hkv);
      for (int64_t i = 0; i < Lq; i++) {
        const float* q = p.query + b * p.q_stride_b + h * p.q_stride_h + i * p.q_stride_l;
        // 1. logits: scale·q·k, then softcap, then the mask and ALiBi; blocked keys are -inf.
        for (int64_t j = 0; j < Lk; j++) {
          const int64_t m = b * p.mask_stride_b + h * p.mask_stride_h + i * p.mask_stride_q +
                            j * p.mask_stride_k;
          const int64_t first_key = p.key_starts != nullptr ? p.key_starts[b] : 0;
          bool is_blocked = j >= valid_keys || j < first_key || (p.causal && j > i + offset) ||
                            (p.sliding_window > 0 && j <= i + offset - p.sliding_window);
          if (p.mask_kind == MaskKind::kBool) {
            is_blocked = is_blocked || static_cast<const uint8_t*>(p.mask)[m] == 0;
          }
          if (p.mask_kind == MaskKind::kFloat &&
              static_cast<const float*>(p.mask)[m] == -std::numeric_limits<float>::infinity()) {
            is_blocked = true;
          }
          blocked[j] = is_blocked;
          if (is_blocked) {
            logits[j] = neg_inf;
            continue;
          }
          const int64_t k = b * p.k_stride_b + kvh * p.k_stride_h + j * p.k_stride_l;
          double dot = 0.0;
          for (int64_t d = 0; d < E; d++) dot += static_cast<double>(q[d]) * kv_element(p, p.key, k + d);
          double s = static_cast<double>(p.scale) * dot;
          if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
          if (p.mask_kind == MaskKind::kFloat) s += static_cast<const float*>(p.mask)[m];
          if (p.alibi_slopes != nullptr) {  // ALiBi: -slope·|i + offset - j|, in double
            s -= static_cast<double>(p.alibi_slopes[b * p.alibi_stride_b + h]) * std::fabs(static_cast<double>(i + offset - j));
          }
          logits[j] = s;
        }
        // 2. softmax with the maximum subtracted, over the keys and the head's sink (one more
        // logit, whose value row is zero: it adds to the sum only); an all-blocked row stays
        // all zero.
        const double sink = p.sinks != nullptr ? p.sinks[h] : neg_inf;
        double max_logit = sink;
        for (int64_t j = 0; j < Lk; j++) max_logit = std::max(max_logit, logits[j]);
        if (max_logit == neg_inf) continue;
        double sum = sink == neg_inf ? 0.0 : std::exp(sink - max_logit);
        for (int64_t j = 0; j < Lk; j++) {
          logits[j] = blocked[j] ? 0.0 : std::exp(logits[j] - max_logit);
          sum += logits[j];
        }
        if (logsumexp != nullptr) (*logsumexp)[static_cast<size_t>((b * Hq + h) * Lq + i)] = max_logit + std::log(sum);
        // 3. output row = Σ_j p_j·z_j·v_j over the keys that are not blocked (z_j = 1 without
        // dropout, else the key's dropout factor or 0).
        double* o = out.data() + ((b * Hq + h) * Lq + i) * Ev;
        for (int64_t j = 0; j < Lk; j++) {
          if (blocked[j]) continue;
          const double prob = logits[j] / sum, kept = prob * dropout_z(p, b, h, i, j);
          if (weights != nullptr) (*weights)[static_cast<size_t>(((b * Hq + h) * Lq + i) * Lk + j)] = dropped_weights ? kept : prob;
          const int64_t v = b * p.v_stride_b + kvh * p.v_stride_h + j * p.v_stride_l;
          for (int64_t c = 0; c < Ev; c++) o[c] += kept * kv_element(p, p.value, v + c);
        }
      }
    }
  }
  return out;
}

}  // namespace

std::vector<double> reference_forward(const Problem& p, std::vector<double>* weights, std::vector<double>* logsumexp) {
  return forward_rows(p, weights, logsumexp, true);
}

std::vector<double> reference_logsumexp(const Problem& p) {
  std::vector<double> lse;
  reference_forward(p, nullptr, &lse);
  return lse;
}

int64_t mask_elements(const Problem& p) {
  return (p.batch - 1) * p.mask_stride_b + (p.q_heads - 1) * p.mask_stride_h +
         static_cast<int64_t>(p.q_len - 1) * p.mask_stride_q + static_cast<int64_t>(p.kv_len - 1) * p.mask_stride_k + 1;
}

ReferenceGradients reference_backward(const BackwardProblem& bp) {
  const Problem& p = bp.forward;
  const int64_t B = p.batch, Hq = p.q_heads, Hkv = p.kv_heads, Lq = p.q_len, Lk = p.kv_len,
                E = p.head_dim, Ev = p.value_dim;
  std::vector<double> weights, lse;
  forward_rows(p, &weights, &lse, false);  // softmax probabilities (before dropout), 0 for blocked keys and empty rows
  ReferenceGradients g;
  if (p.sinks != nullptr) g.d_sinks.assign(static_cast<size_t>(Hq), 0.0);
  g.d_query.assign(static_cast<size_t>(B * Hq * Lq * E), 0.0);
  g.d_key.assign(static_cast<size_t>(B * Hkv * Lk * E), 0.0);
  g.d_value.assign(static_cast<size_t>(B * Hkv * Lk * Ev), 0.0);
  if (p.mask_kind == MaskKind::kFloat) g.d_mask.assign(static_cast<size_t>(mask_elements(p)), 0.0);
  std::vector<double> dp(static_cast<size_t>(Lk)), z(static_cast<size_t>(Lk));
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < Hq; h++) {
      const int64_t kvh = h / (Hq / Hkv);
      for (int64_t i = 0; i < Lq; i++) {
        const double* prob = weights.data() + ((b * Hq + h) * Lq + i) * Lk;
        const float* q = p.query + b * p.q_stride_b + h * p.q_stride_h + i * p.q_stride_l;
        const float* go = bp.grad_output + b * bp.go_stride_b + h * bp.go_stride_h + i * bp.go_stride_l;
        // dp_j = z_j·(dO·v_j), the gradient at p_j of output = Σ_j p_j·z_j·v_j (z_j = 1
        // without dropout), and D = Σ_j p_j·dp_j over the keys the row attends (p_j > 0).
        double delta = 0.0;
        for (int64_t j = 0; j < Lk; j++) {
          dp[j] = 0.0;
          z[j] = dropout_z(p, b, h, i, j);
          if (prob[j] == 0.0) continue;
          const float* v = static_cast<const float*>(p.value) + b * p.v_stride_b + kvh * p.v_stride_h + j * p.v_stride_l;
          for (int64_t c = 0; c < Ev; c++) dp[j] += static_cast<double>(go[c]) * v[c];
          dp[j] *= z[j];
          delta += prob[j] * dp[j];
        }
        // The sink's value row is zero: its dp is 0, so ∂L/∂sink = p_sink·(0 - D).
        if (!g.d_sinks.empty() && p.sinks[h] != -std::numeric_limits<float>::infinity()) {
          g.d_sinks[static_cast<size_t>(h)] -= std::exp(p.sinks[h] - lse[static_cast<size_t>((b * Hq + h) * Lq + i)]) * delta;
        }
        for (int64_t j = 0; j < Lk; j++) {
          if (prob[j] == 0.0) continue;
          const float* k = static_cast<const float*>(p.key) + b * p.k_stride_b + kvh * p.k_stride_h + j * p.k_stride_l;
          double dr = prob[j] * (dp[j] - delta);  // ∂L/∂s_j
          if (!g.d_mask.empty()) {  // s_j = capped score + mask: ∂s_j/∂mask = 1
            g.d_mask[static_cast<size_t>(b * p.mask_stride_b + h * p.mask_stride_h + i * p.mask_stride_q +
                                         j * p.mask_stride_k)] += dr;
          }
          if (p.softcap > 0.0f) {  // s = c·tanh(r/c): ∂s/∂r = 1 - tanh²(r/c)
            double dot = 0.0;
            for (int64_t d = 0; d < E; d++) dot += static_cast<double>(q[d]) * k[d];
            const double t = std::tanh(static_cast<double>(p.scale) * dot / p.softcap);
            dr *= 1.0 - t * t;
          }
          double* dq = g.d_query.data() + ((b * Hq + h) * Lq + i) * E;
          double* dk = g.d_key.data() + ((b * Hkv + kvh) * Lk + j) * E;
          double* dv = g.d_value.data() + ((b * Hkv + kvh) * Lk + j) * Ev;
          for (int64_t d = 0; d < E; d++) {
            dq[d] += p.scale * dr * k[d];
            dk[d] += p.scale * dr * q[d];
          }
          for (int64_t c = 0; c < Ev; c++) dv[c] += prob[j] * z[j] * go[c];
        }
      }
    }
  }
  return g;
}

}  // namespace sdpa
