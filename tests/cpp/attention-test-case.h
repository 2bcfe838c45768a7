// The test problem shared by the forward and backward GoogleTest suites
// (sdpa-forward-test.cc, sdpa-backward-test.cc): a Case described by shapes and options,
// and the pieces of a harness that turn it into a Problem: the dimensions, the strides of
// either layout, scale and softcap, and the mask, causal offsets, key lengths and starts, sinks,
// ALiBi slopes. Also the
// streamed decode of a problem (run_streamed), float32 or float16 (f16-kv-test.cc).
// A case's data come from one stream seeded by the case (CaseRandom), drawn in a fixed order:
// Q, K, V (draw_qkv), whatever else the harness draws, then the mask (set_options).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sdpa.h"

namespace sdpa::test {

// One test problem, described by shapes and options; a harness turns it into data.
struct AttentionCase {
  int B = 1, Hq = 1, Hkv = 1, Lq = 1, Lk = 1, E = 4, Ev = 4;
  bool bshd = false;                 // tensors laid out [B, L, H, E]
  MaskKind mask_kind = MaskKind::kNone;
  std::vector<int> mask_dims;        // right-aligned against [B, Hq, Lq, Lk]
  double mask_block_fraction = 0.0;  // share of mask entries that block (-inf or 0)
  bool causal = false;
  std::vector<int32_t> offsets;      // one = for every batch; B = per batch
  int32_t window = 0;                // sliding window (with causal); 0 = none
  std::vector<int32_t> key_lengths;  // empty = none
  std::vector<int32_t> key_starts;   // empty = none
  std::vector<float> sinks;          // [Hq] sink logits; empty = none
  // ALiBi slopes: [Hq] for every batch (alibi_stride_b 0), or [B, Hq] (stride Hq, B > 1); empty =
  // none. The offsets above place each row's diagonal, causal or not.
  std::vector<float> alibi_slopes;
  float softcap = 0.0f;
  float scale = NAN;                 // NAN = 1/sqrt(E)
  float input_scale = 1.0f;          // multiplies Q (large logits)
  uint32_t seed = 1;

  std::string describe() const {
    std::ostringstream s;
    s << "B" << B << " Hq" << Hq << " Hkv" << Hkv << " Lq" << Lq << " Lk" << Lk << " E" << E
      << " Ev" << Ev << (bshd ? " bshd" : "") << " mask" << static_cast<int>(mask_kind)
      << (key_starts.empty() ? "" : " key_starts") << (sinks.empty() ? "" : " sinks")
      << (alibi_slopes.empty() ? "" : int(alibi_slopes.size()) == Hq ? " alibi[Hq]" : " alibi[B,Hq]")
      << (offsets.empty() ? "" : " offset" + std::to_string(offsets[0]) + (offsets.size() > 1 ? ",…" : "")) << (causal ? " causal" : "") << (window > 0 ? " window" + std::to_string(window) : "") << " softcap" << softcap << " seed" << seed;
    return s.str();
  }
};

// |got - ref| / (1 + |ref|), infinite for a got that is not finite: the gradients' error measure
// (sdpa-backward-test.cc, sdpa-packed-test.cc).
inline double relative_error(float got, double ref) {
  return std::isfinite(got) ? std::abs(got - ref) / (1.0 + std::abs(ref)) : std::numeric_limits<double>::infinity();
}

// max |got - ref| / max |ref| over a tensor (got in ref's dense order): the error of long sums
// against their size, where the per-element measure says little of elements near zero and of
// sums that cancel.
inline double normwise_error(const std::vector<float>& got, const std::vector<double>& ref) {
  double err = 0.0, size = 0.0;
  for (size_t n = 0; n < ref.size(); n++) {
    err = std::max(err, std::isfinite(got[n]) ? std::abs(got[n] - ref[n]) : std::numeric_limits<double>::infinity());
    size = std::max(size, std::abs(ref[n]));
  }
  return err / size;
}

// +0 exactly (not -0): what the kernels write for rows and keys with nothing to attend. For
// EXPECT_PRED1, which prints the value that fails.
inline bool is_plus_zero(float x) { return x == 0.0f && !std::signbit(x); }

// A float's bits, and the float of given bits.
inline uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}
inline float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// The seeded stream a case's data are drawn from.
struct CaseRandom {
  std::mt19937 rng;
  std::normal_distribution<float> normal{0.0f, 1.0f};

  explicit CaseRandom(uint32_t seed) : rng(seed) {}

  // x = n standard normal values times s.
  void fill(std::vector<float>& x, size_t n, float s) {
    x.resize(n);
    for (float& e : x) e = normal(rng) * s;
  }
};

// Dense Q [B, Hq, Lq, E] (times input_scale), K [B, Hkv, Lk, E], V [B, Hkv, Lk, Ev], drawn in
// that order. (Dense in either layout: the sizes are the same.)
inline void draw_qkv(const AttentionCase& c, CaseRandom& random, std::vector<float>& q, std::vector<float>& k,
                     std::vector<float>& v) {
  random.fill(q, size_t(c.B) * c.Hq * c.Lq * c.E, c.input_scale);
  random.fill(k, size_t(c.B) * c.Hkv * c.Lk * c.E, 1.0f);
  random.fill(v, size_t(c.B) * c.Hkv * c.Lk * c.Ev, 1.0f);
}

// The strides of a dense tensor with H heads, L rows and D columns per row, laid out
// [B, L, H, D] (bshd) or [B, H, L, D].
inline void set_strides(bool bshd, int H, int L, int D, int64_t* sb, int64_t* sh, int64_t* sl) {
  if (bshd) {  // [B, L, H, D]
    *sb = int64_t(L) * H * D, *sl = int64_t(H) * D, *sh = D;
  } else {     // [B, H, L, D]
    *sb = int64_t(H) * L * D, *sh = int64_t(L) * D, *sl = D;
  }
}

// p's dimensions, the strides of Q [B, Hq, Lq, E], K [B, Hkv, Lk, E], V [B, Hkv, Lk, Ev] and
// O [B, Hq, Lq, Ev] in the case's layout, its scale and softcap. (Not the pointers.)
inline void set_shapes(const AttentionCase& c, Problem& p) {
  p.batch = c.B, p.q_heads = c.Hq, p.kv_heads = c.Hkv, p.q_len = c.Lq, p.kv_len = c.Lk;
  p.head_dim = c.E, p.value_dim = c.Ev;
  set_strides(c.bshd, c.Hq, c.Lq, c.E, &p.q_stride_b, &p.q_stride_h, &p.q_stride_l);
  set_strides(c.bshd, c.Hkv, c.Lk, c.E, &p.k_stride_b, &p.k_stride_h, &p.k_stride_l);
  set_strides(c.bshd, c.Hkv, c.Lk, c.Ev, &p.v_stride_b, &p.v_stride_h, &p.v_stride_l);
  set_strides(c.bshd, c.Hq, c.Lq, c.Ev, &p.o_stride_b, &p.o_stride_h, &p.o_stride_l);
  p.scale = std::isnan(c.scale) ? 1.0f / std::sqrt(float(c.E)) : c.scale;
  p.softcap = c.softcap;
}

// What a Problem's options point to, owned by the harness (which derives from it, so tests
// edit h.mask_f / h.mask_b in place).
struct OptionArrays {
  std::vector<float> mask_f;
  std::vector<uint8_t> mask_b;
  std::vector<int32_t> offsets, key_lengths, key_starts;
  std::vector<float> sinks;
  std::vector<float> alibi_slopes;
};

// p's mask (dense over the case's mask_dims, stride 0 on each broadcast axis; entries drawn
// from `random`: blocking with probability mask_block_fraction, else a normal value or 1),
// causal offset(s), key lengths and starts, sinks and ALiBi slopes, pointing into `arrays`.
inline void set_options(const AttentionCase& c, CaseRandom& random, OptionArrays& arrays, Problem& p) {
  std::mt19937& rng = random.rng;
  std::normal_distribution<float>& normal = random.normal;
  p.mask_kind = c.mask_kind;
  if (c.mask_kind != MaskKind::kNone) {
    const int full[4] = {c.B, c.Hq, c.Lq, c.Lk};
    int dims[4] = {1, 1, 1, 1};
    const int rank = int(c.mask_dims.size());
    for (int a = 0; a < rank; a++) dims[4 - rank + a] = c.mask_dims[a];
    int64_t strides[4], n = 1;
    for (int a = 3; a >= 0; a--) {
      strides[a] = dims[a] == 1 && full[a] != 1 ? 0 : n;
      n *= dims[a];
    }
    p.mask_stride_b = strides[0], p.mask_stride_h = strides[1];
    p.mask_stride_q = strides[2], p.mask_stride_k = strides[3];
    std::uniform_real_distribution<double> u(0.0, 1.0);
    if (c.mask_kind == MaskKind::kFloat) {
      arrays.mask_f.resize(size_t(n));
      for (float& m : arrays.mask_f) {
        m = u(rng) < c.mask_block_fraction ? -std::numeric_limits<float>::infinity() : normal(rng);
      }
      p.mask = arrays.mask_f.data();
    } else {
      arrays.mask_b.resize(size_t(n));
      for (uint8_t& m : arrays.mask_b) m = u(rng) < c.mask_block_fraction ? 0 : 1;
      p.mask = arrays.mask_b.data();
    }
  }
  p.causal = c.causal;
  p.sliding_window = c.window;
  if (c.offsets.size() == 1) p.causal_offset = c.offsets[0];
  if (c.offsets.size() > 1) {
    arrays.offsets = c.offsets;
    p.causal_offsets = arrays.offsets.data();
  }
  if (!c.key_lengths.empty()) {
    arrays.key_lengths = c.key_lengths;
    p.key_lengths = arrays.key_lengths.data();
  }
  if (!c.key_starts.empty()) {
    arrays.key_starts = c.key_starts;
    p.key_starts = arrays.key_starts.data();
  }
  if (!c.sinks.empty()) {
    arrays.sinks = c.sinks;
    p.sinks = arrays.sinks.data();
  }
  if (!c.alibi_slopes.empty()) {
    arrays.alibi_slopes = c.alibi_slopes;
    p.alibi_slopes = arrays.alibi_slopes.data();
    p.alibi_stride_b = int(c.alibi_slopes.size()) == c.Hq ? 0 : c.Hq;
  }
}

// Sink logits for Hq heads, cycling through: none (-inf), 0, 2.5 (about a score's size), -3,
// and 30 (above every score: it takes nearly all of each row's probability).
inline std::vector<float> cycling_sinks(int Hq) {
  const float values[] = {-std::numeric_limits<float>::infinity(), 0.0f, 2.5f, -3.0f, 30.0f};
  std::vector<float> sinks(static_cast<size_t>(Hq));
  for (int h = 0; h < Hq; h++) sinks[size_t(h)] = values[h % 5];
  return sinks;
}

// ALiBi's slopes for Hq heads (Press et al.): 2^(-8·(h + 1) / Hq), from 2^(-8/Hq) down to 2^-8,
// times `factor`.
inline std::vector<float> geometric_slopes(int Hq, float factor = 1.0f) {
  std::vector<float> slopes(static_cast<size_t>(Hq));
  for (int h = 0; h < Hq; h++) slopes[size_t(h)] = factor * std::exp2(-8.0f * float(h + 1) / float(Hq));
  return slopes;
}

// Per-batch slopes [B, Hq]: batch b's row is geometric_slopes(Hq) times 1 + b/2, and one slope of
// every batch but the first is 0 (a head without ALiBi).
inline std::vector<float> per_batch_slopes(int B, int Hq) {
  std::vector<float> slopes;
  for (int b = 0; b < B; b++) {
    std::vector<float> row = geometric_slopes(Hq, 1.0f + 0.5f * float(b));
    if (b > 0) row[size_t(b % Hq)] = 0.0f;
    slopes.insert(slopes.end(), row.begin(), row.end());
  }
  return slopes;
}

// p (one (batch, KV head), on the decode path) run as the streamed decode of sdpa.h: each
// segment's keys alone copied from k and v (Elem: float or uint16_t halves, rows with p's
// strides, batch 0 and KV head 0) into buffers of exactly their size (ASan catches a read
// outside them), forward_segment() on each, then merge_segments(). Returns the output.
template <typename Elem>
std::vector<float> run_streamed(Problem p, const std::vector<Elem>& k, const std::vector<Elem>& v, size_t output_size) {
  std::vector<float> out(output_size, std::numeric_limits<float>::quiet_NaN());
  p.output = out.data();
  std::vector<float> partials(segment_partials_floats(p), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> scratch(segment_scratch_floats(p));
  for (int s = 0; s < segment_count(p); s++) {
    const int begin = s * segment_keys(), end = std::min(p.kv_len, begin + segment_keys());
    const std::vector<Elem> keys(k.begin() + begin * p.k_stride_l, k.begin() + (end - 1) * p.k_stride_l + p.head_dim);
    const std::vector<Elem> values(v.begin() + begin * p.v_stride_l, v.begin() + (end - 1) * p.v_stride_l + p.value_dim);
    p.key = keys.data(), p.value = values.data();
    EXPECT_EQ(forward_segment(p, s, partials.data(), scratch.data(), scratch.size()), Status::kOk);
  }
  EXPECT_EQ(merge_segments(p, partials.data()), Status::kOk);
  return out;
}

}  // namespace sdpa::test
