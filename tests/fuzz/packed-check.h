// The promise of packed variable-length sequences (src/sdpa-packed.h), checked on the problems
// the sdpa fuzz target decodes: each sequence's rows are the bits forward() gives that sequence
// alone (whose results the target checks against the reference), a sequence without keys gives
// its rows exact zeros and its sink (or -inf) as log-sum-exp, and any thread count gives the
// same bits.
//
// The packed problem takes the decoded problem's heads, head sizes, score options (scale,
// softcap, causal with one offset or one per batch, window, sinks) and values: one sequence per
// batch b, with the first Lq_b query rows and the first Lk_b keys of batch b, Lq_b in [0, Lq]
// and Lk_b in [0, Lk] drawn from the input (0 included: sequences without rows or keys), copied
// into packed [T, H, D] tensors of exactly their size (AddressSanitizer sees any read past one).
// Float32 K/V only (packing does not take halves). One input in eight of these also breaks the
// starts (decreasing, or a wrong total), which must be kBadPacking with nothing written.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attention-check.h"
#include "fuzz-values.h"
#include "parallel/thread-pool.h"
#include "sdpa-packed.h"
#include "sdpa.h"

namespace sdpa_fuzz {

using sdpa::Status;

namespace packed_detail {

// Rows [0, rows) of (batch b, every head) of a strided tensor, packed [rows, H, D].
FUZZ_NO_COVERAGE inline void gather(std::vector<float>& dst, const float* src, int64_t sb, int64_t sh, int64_t sl, int32_t b,
                                    int32_t rows, int32_t H, int32_t D) {
  for (int32_t i = 0; i < rows; i++)
    for (int32_t h = 0; h < H; h++)
      for (int32_t d = 0; d < D; d++) dst.push_back(src[b * sb + h * sh + i * sl + d]);
}

}  // namespace packed_detail

inline void check_packed(FuzzedDataProvider& in, const Problem& p, sdpa::ThreadPool* two_threads) {
  if (p.kv_type != sdpa::KvType::kFloat32) return;
  const int32_t S = p.batch, Hq = p.q_heads, Hkv = p.kv_heads, E = p.head_dim, Ev = p.value_dim;
  std::vector<int32_t> q_starts{0}, k_starts{0};
  for (int32_t s = 0; s < S; s++) {
    q_starts.push_back(q_starts.back() + in.ConsumeIntegralInRange<int32_t>(0, p.q_len));
    k_starts.push_back(k_starts.back() + in.ConsumeIntegralInRange<int32_t>(0, p.kv_len));
  }
  const int32_t Tq = q_starts.back(), Tk = k_starts.back();
  std::vector<float> q, k, v;
  const float* key = static_cast<const float*>(p.key);
  const float* value = static_cast<const float*>(p.value);
  for (int32_t s = 0; s < S; s++) {
    packed_detail::gather(q, p.query, p.q_stride_b, p.q_stride_h, p.q_stride_l, s, q_starts[s + 1] - q_starts[s], Hq, E);
    packed_detail::gather(k, key, p.k_stride_b, p.k_stride_h, p.k_stride_l, s, k_starts[s + 1] - k_starts[s], Hkv, E);
    packed_detail::gather(v, value, p.v_stride_b, p.v_stride_h, p.v_stride_l, s, k_starts[s + 1] - k_starts[s], Hkv, Ev);
  }
  // A tensor with no rows still needs an address (the kernel checks pointers, never reads it).
  float none = 0.0f;
  auto at = [&none](std::vector<float>& x) { return x.empty() ? &none : x.data(); };
  std::vector<float> out(static_cast<size_t>(Tq) * Hq * Ev, sentinel()), lse(static_cast<size_t>(Hq) * Tq, sentinel());

  sdpa::PackedProblem pp;
  Problem& w = pp.whole;
  w.batch = 1, w.q_heads = Hq, w.kv_heads = Hkv, w.q_len = Tq, w.kv_len = Tk, w.head_dim = E, w.value_dim = Ev;
  w.query = at(q), w.key = at(k), w.value = at(v), w.output = at(out), w.logsumexp = at(lse);
  w.q_stride_h = E, w.q_stride_l = static_cast<int64_t>(Hq) * E;
  w.k_stride_h = E, w.k_stride_l = static_cast<int64_t>(Hkv) * E;
  w.v_stride_h = Ev, w.v_stride_l = static_cast<int64_t>(Hkv) * Ev;
  w.o_stride_h = Ev, w.o_stride_l = static_cast<int64_t>(Hq) * Ev;
  w.scale = p.scale, w.softcap = p.softcap, w.causal = p.causal, w.sliding_window = p.sliding_window;
  w.causal_offset = p.causal_offset, w.causal_offsets = p.causal_offsets, w.sinks = p.sinks;  // [B] = [S]
  pp.sequences = S, pp.q_starts = q_starts.data(), pp.k_starts = k_starts.data();

  const uint8_t mode = in.ConsumeIntegral<uint8_t>();
  if (mode >= 224) {  // broken starts: kBadPacking, nothing written
    std::vector<int32_t> bad = mode & 1 ? q_starts : k_starts;
    if (mode & 2) bad.back() += 1;                      // not ending at Tq (Tk)
    else if (S > 1) bad[1] = bad[2] + 1;                // decreasing
    else bad[0] = 1;                                    // not starting at 0
    sdpa::PackedProblem broken = pp;
    (mode & 1 ? broken.q_starts : broken.k_starts) = bad.data();
    std::vector<float> scratch(1 << 12);
    const Status status = sdpa::forward_packed(broken, scratch.data(), scratch.size());
    FUZZ_CHECK(p, status == Status::kBadPacking, "forward_packed() with broken starts returned %s",
               sdpa::status_name(status));
    for (float f : out) FUZZ_CHECK(p, is_sentinel(f), "forward_packed() with broken starts wrote its output");
    return;
  }

  std::vector<float> scratch(static_cast<size_t>(sdpa::packed_scratch_floats(pp, 1)));
  Status status = sdpa::forward_packed(pp, scratch.data(), scratch.size());
  FUZZ_CHECK(p, status == Status::kOk, "forward_packed() returned %s on a valid problem", sdpa::status_name(status));

  // Each sequence against forward() on it alone, dense [1, H, L, D].
  for (int32_t s = 0; s < S; s++) {
    const int32_t Lq = q_starts[s + 1] - q_starts[s], Lk = k_starts[s + 1] - k_starts[s];
    if (Lq == 0) continue;
    std::vector<float> alone_out(static_cast<size_t>(Hq) * Lq * Ev, sentinel()), alone_lse(static_cast<size_t>(Hq) * Lq);
    if (Lk == 0) {  // nothing to attend: zeros, the sink (or -inf) as lse
      std::fill(alone_out.begin(), alone_out.end(), 0.0f);
      for (int32_t h = 0; h < Hq; h++) {
        std::fill_n(alone_lse.begin() + static_cast<int64_t>(h) * Lq, Lq,
                    p.sinks != nullptr ? p.sinks[h] : -std::numeric_limits<float>::infinity());
      }
    } else {
      Problem one = w;
      one.q_len = Lq, one.kv_len = Lk;
      std::vector<float> oq(static_cast<size_t>(Hq) * Lq * E), ok(static_cast<size_t>(Hkv) * Lk * E),
          ov(static_cast<size_t>(Hkv) * Lk * Ev);
      for (int32_t i = 0; i < Lq; i++)
        for (int32_t h = 0; h < Hq; h++)
          std::memcpy(&oq[(static_cast<size_t>(h) * Lq + i) * E], &q[(static_cast<size_t>(q_starts[s] + i) * Hq + h) * E], 4u * E);
      for (int32_t j = 0; j < Lk; j++)
        for (int32_t h = 0; h < Hkv; h++) {
          std::memcpy(&ok[(static_cast<size_t>(h) * Lk + j) * E], &k[(static_cast<size_t>(k_starts[s] + j) * Hkv + h) * E], 4u * E);
          std::memcpy(&ov[(static_cast<size_t>(h) * Lk + j) * Ev], &v[(static_cast<size_t>(k_starts[s] + j) * Hkv + h) * Ev], 4u * Ev);
        }
      one.query = oq.data(), one.key = ok.data(), one.value = ov.data(), one.output = alone_out.data();
      one.logsumexp = alone_lse.data();
      one.q_stride_b = static_cast<int64_t>(Hq) * Lq * E, one.q_stride_h = static_cast<int64_t>(Lq) * E, one.q_stride_l = E;
      one.k_stride_b = static_cast<int64_t>(Hkv) * Lk * E, one.k_stride_h = static_cast<int64_t>(Lk) * E, one.k_stride_l = E;
      one.v_stride_b = static_cast<int64_t>(Hkv) * Lk * Ev, one.v_stride_h = static_cast<int64_t>(Lk) * Ev, one.v_stride_l = Ev;
      one.o_stride_b = static_cast<int64_t>(Hq) * Lq * Ev, one.o_stride_h = static_cast<int64_t>(Lq) * Ev, one.o_stride_l = Ev;
      one.causal_offsets = nullptr;
      one.causal_offset = p.causal_offsets != nullptr ? p.causal_offsets[s] : p.causal_offset;
      std::vector<float> one_scratch(static_cast<size_t>(sdpa::scratch_floats(one, 1)));
      status = sdpa::forward(one, one_scratch.data(), one_scratch.size());
      FUZZ_CHECK(p, status == Status::kOk, "forward() of sequence %d alone returned %s", s, sdpa::status_name(status));
    }
    for (int32_t i = 0; i < Lq; i++) {
      for (int32_t h = 0; h < Hq; h++) {
        for (int32_t c = 0; c < Ev; c++) {
          const float packed = out[(static_cast<size_t>(q_starts[s] + i) * Hq + h) * Ev + c];
          const float alone = alone_out[(static_cast<size_t>(h) * Lq + i) * Ev + c];
          FUZZ_CHECK(p, same_float(packed, alone), "packed sequence %d row %d head %d col %d: %a, alone %a", s, i, h, c,
                     packed, alone);
        }
        const float packed_lse = lse[static_cast<size_t>(h) * Tq + q_starts[s] + i];
        const float alone_lse_v = alone_lse[static_cast<size_t>(h) * Lq + i];
        FUZZ_CHECK(p, same_float(packed_lse, alone_lse_v), "packed sequence %d row %d head %d lse: %a, alone %a", s, i, h,
                   packed_lse, alone_lse_v);
      }
    }
  }

  if (mode & 1) {  // two threads: the same bits
    std::vector<float> out2(out.size(), sentinel()), lse2(lse.size(), sentinel());
    sdpa::PackedProblem pp2 = pp;
    pp2.whole.output = at(out2), pp2.whole.logsumexp = at(lse2);
    std::vector<float> scratch2(static_cast<size_t>(sdpa::packed_scratch_floats(pp2, two_threads->threads())));
    status = sdpa::forward_packed(pp2, scratch2.data(), scratch2.size(), two_threads);
    FUZZ_CHECK(p, status == Status::kOk, "forward_packed() on 2 threads returned %s", sdpa::status_name(status));
    for (size_t n = 0; n < out.size(); n++) FUZZ_CHECK(p, same_float(out[n], out2[n]), "packed output %zu: 2 threads differ", n);
    for (size_t n = 0; n < lse.size(); n++) FUZZ_CHECK(p, same_float(lse[n], lse2[n]), "packed lse %zu: 2 threads differ", n);
  }
}

}  // namespace sdpa_fuzz
