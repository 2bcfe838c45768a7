// The promise of packed variable-length sequences (src/sdpa-packed.h), checked on the problems
// the sdpa fuzz target decodes: each sequence's rows are the bits forward() gives that sequence
// alone (whose results the target checks against the reference), a sequence without keys gives
// its rows exact zeros and its sink (or -inf) as log-sum-exp, and any thread count gives the
// same bits.
//
// The packed problem takes the decoded problem's heads, head sizes, score options (scale,
// softcap, causal with one offset or one per batch, window, sinks, ALiBi slopes: shared [Hq],
// or per batch [B, Hq], which are per sequence [S, Hq] here, dropout: sequence s draws the mask
// of batch dropout_batch_base + s, which its problem alone gets as its own base) and values: one sequence per
// batch b, with the first Lq_b query rows and the first Lk_b keys of batch b, Lq_b in [0, Lq]
// and Lk_b in [0, Lk] drawn from the input (0 included: sequences without rows or keys), copied
// into packed [T, H, D] tensors of exactly their size (AddressSanitizer sees any read past one).
// Float32 K/V only (packing does not take halves). One input in eight of these also breaks the
// starts (decreasing, or a wrong total), which must be kBadPacking with nothing written, or, with
// per-sequence slopes, one slope of a sequence after the first (validate() reads only the whole
// problem's batch 0), which must be kBadAlibi with nothing written.
//
// check_packed_backward (the backward fuzz target): the same packing of Q, K, V and dO;
// forward_packed() gives O and lse, backward_packed() the gradients, and each sequence's dQ, dK,
// dV are bitwise backward()'s for it alone (after forward() on it alone), a sequence without
// keys gets dQ zeros and one without rows dK, dV zeros; d_sinks is the sum, in double and in
// order, of the sequences' own; 2 threads the same bits.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attention-check.h"
#include "fuzz-values.h"
#include "parallel/thread-pool.h"
#include "sdpa-backward.h"
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

// One sequence per batch b: the first Lq_b query rows and Lk_b keys, drawn from the input.
struct Packing {
  std::vector<int32_t> q_starts{0}, k_starts{0};
  int32_t Tq = 0, Tk = 0;
};

inline Packing draw_packing(FuzzedDataProvider& in, const Problem& p) {
  Packing pk;
  for (int32_t s = 0; s < p.batch; s++) {
    pk.q_starts.push_back(pk.q_starts.back() + in.ConsumeIntegralInRange<int32_t>(0, p.q_len));
    pk.k_starts.push_back(pk.k_starts.back() + in.ConsumeIntegralInRange<int32_t>(0, p.kv_len));
  }
  pk.Tq = pk.q_starts.back(), pk.Tk = pk.k_starts.back();
  return pk;
}

// The packed problem over packed [T, H, D] tensors (addresses set by the caller), p's options.
inline sdpa::PackedProblem packed_problem(const Problem& p, const Packing& pk) {
  sdpa::PackedProblem pp;
  Problem& w = pp.whole;
  const int32_t Hq = p.q_heads, Hkv = p.kv_heads, E = p.head_dim, Ev = p.value_dim;
  w.batch = 1, w.q_heads = Hq, w.kv_heads = Hkv, w.q_len = pk.Tq, w.kv_len = pk.Tk, w.head_dim = E, w.value_dim = Ev;
  w.q_stride_h = E, w.q_stride_l = static_cast<int64_t>(Hq) * E;
  w.k_stride_h = E, w.k_stride_l = static_cast<int64_t>(Hkv) * E;
  w.v_stride_h = Ev, w.v_stride_l = static_cast<int64_t>(Hkv) * Ev;
  w.o_stride_h = Ev, w.o_stride_l = static_cast<int64_t>(Hq) * Ev;
  w.scale = p.scale, w.softcap = p.softcap, w.causal = p.causal, w.sliding_window = p.sliding_window;
  w.causal_offset = p.causal_offset, w.causal_offsets = p.causal_offsets, w.sinks = p.sinks;  // [B] = [S]
  w.alibi_slopes = p.alibi_slopes, w.alibi_stride_b = p.alibi_stride_b;  // [B, Hq] = [S, Hq], or [Hq]
  w.dropout_threshold = p.dropout_threshold, w.dropout_seed = p.dropout_seed;
  w.dropout_batch_base = p.dropout_batch_base;  // sequence s: base + s, batch s's of p
  pp.sequences = p.batch, pp.q_starts = pk.q_starts.data(), pp.k_starts = pk.k_starts.data();
  return pp;
}

// Sequence s alone: a problem of batch 1 with dense [1, H, L, D] tensors (the caller's), the
// packed problem's options and the sequence's own causal offset, ALiBi slopes and dropout batch
// (the packed base + s).
inline Problem alone_problem(const Problem& whole, const Problem& p, int32_t s, int32_t Lq, int32_t Lk) {
  Problem one = whole;
  const int32_t Hq = p.q_heads, Hkv = p.kv_heads, E = p.head_dim, Ev = p.value_dim;
  one.q_len = Lq, one.kv_len = Lk;
  one.q_stride_b = static_cast<int64_t>(Hq) * Lq * E, one.q_stride_h = static_cast<int64_t>(Lq) * E, one.q_stride_l = E;
  one.k_stride_b = static_cast<int64_t>(Hkv) * Lk * E, one.k_stride_h = static_cast<int64_t>(Lk) * E, one.k_stride_l = E;
  one.v_stride_b = static_cast<int64_t>(Hkv) * Lk * Ev, one.v_stride_h = static_cast<int64_t>(Lk) * Ev, one.v_stride_l = Ev;
  one.o_stride_b = static_cast<int64_t>(Hq) * Lq * Ev, one.o_stride_h = static_cast<int64_t>(Lq) * Ev, one.o_stride_l = Ev;
  one.causal_offsets = nullptr;
  one.causal_offset = p.causal_offsets != nullptr ? p.causal_offsets[s] : p.causal_offset;
  if (p.alibi_slopes != nullptr) one.alibi_slopes = p.alibi_slopes + s * p.alibi_stride_b;
  one.alibi_stride_b = 0;
  one.dropout_batch_base = whole.dropout_batch_base + s;
  one.logsumexp = nullptr;
  return one;
}

// Rows [first, first + rows) of a packed [T, H, D] tensor, dense [H, rows, D]; and back.
FUZZ_NO_COVERAGE inline std::vector<float> unpack(const std::vector<float>& x, int32_t first, int32_t rows, int32_t H, int32_t D) {
  std::vector<float> out(static_cast<size_t>(H) * rows * D);
  for (int32_t i = 0; i < rows; i++)
    for (int32_t h = 0; h < H; h++)
      std::memcpy(&out[(static_cast<size_t>(h) * rows + i) * D], &x[(static_cast<size_t>(first + i) * H + h) * D], 4u * D);
  return out;
}

}  // namespace packed_detail

inline void check_packed(FuzzedDataProvider& in, const Problem& p, sdpa::ThreadPool* two_threads) {
  using packed_detail::unpack;
  if (p.kv_type != sdpa::KvType::kFloat32) return;
  const int32_t S = p.batch, Hq = p.q_heads, Hkv = p.kv_heads, E = p.head_dim, Ev = p.value_dim;
  const packed_detail::Packing pk = packed_detail::draw_packing(in, p);
  const std::vector<int32_t>& q_starts = pk.q_starts;
  const std::vector<int32_t>& k_starts = pk.k_starts;
  std::vector<float> q, k, v;
  for (int32_t s = 0; s < S; s++) {
    const int32_t Lq = q_starts[s + 1] - q_starts[s], Lk = k_starts[s + 1] - k_starts[s];
    packed_detail::gather(q, p.query, p.q_stride_b, p.q_stride_h, p.q_stride_l, s, Lq, Hq, E);
    packed_detail::gather(k, static_cast<const float*>(p.key), p.k_stride_b, p.k_stride_h, p.k_stride_l, s, Lk, Hkv, E);
    packed_detail::gather(v, static_cast<const float*>(p.value), p.v_stride_b, p.v_stride_h, p.v_stride_l, s, Lk, Hkv, Ev);
  }
  // A tensor with no rows still needs an address (the kernel checks pointers, never reads it).
  float none = 0.0f;
  auto at = [&none](std::vector<float>& x) { return x.empty() ? &none : x.data(); };
  std::vector<float> out(static_cast<size_t>(pk.Tq) * Hq * Ev, sentinel()), lse(static_cast<size_t>(Hq) * pk.Tq, sentinel());
  sdpa::PackedProblem pp = packed_detail::packed_problem(p, pk);
  pp.whole.query = at(q), pp.whole.key = at(k), pp.whole.value = at(v), pp.whole.output = at(out), pp.whole.logsumexp = at(lse);

  const uint8_t mode = in.ConsumeIntegral<uint8_t>();
  if (mode >= 224 && (mode & 4) && p.alibi_slopes != nullptr && p.alibi_stride_b != 0 && S > 1) {
    // A bad slope of sequence 1.. (per-sequence slopes): kBadAlibi, nothing written.
    std::vector<float> slopes(p.alibi_slopes, p.alibi_slopes + static_cast<size_t>(S) * Hq);
    const float bad[] = {kNaN, -1.0f, kInf, 0x1p70f};
    slopes[static_cast<size_t>(1 + mode % (S - 1)) * Hq + (mode >> 3) % Hq] = bad[(mode >> 3) % 4];
    sdpa::PackedProblem broken = pp;
    broken.whole.alibi_slopes = slopes.data();
    std::vector<float> scratch(1 << 12);
    const Status status = sdpa::forward_packed(broken, scratch.data(), scratch.size());
    FUZZ_CHECK(p, status == Status::kBadAlibi, "forward_packed() with a bad slope of a later sequence returned %s",
               sdpa::status_name(status));
    for (float f : out) FUZZ_CHECK(p, is_sentinel(f), "forward_packed() with a bad slope wrote its output");
    for (float f : lse) FUZZ_CHECK(p, is_sentinel(f), "forward_packed() with a bad slope wrote its logsumexp");
    return;
  }
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
    const int32_t q0 = q_starts[s], k0 = k_starts[s];
    const int32_t Lq = q_starts[s + 1] - q0, Lk = k_starts[s + 1] - k0;
    if (Lq == 0) continue;
    std::vector<float> alone_out(static_cast<size_t>(Hq) * Lq * Ev, sentinel()), alone_lse(static_cast<size_t>(Hq) * Lq);
    if (Lk == 0) {  // nothing to attend: zeros, the sink (or -inf) as lse
      std::fill(alone_out.begin(), alone_out.end(), 0.0f);
      for (int32_t h = 0; h < Hq; h++) {
        std::fill_n(alone_lse.begin() + static_cast<int64_t>(h) * Lq, Lq,
                    p.sinks != nullptr ? p.sinks[h] : -std::numeric_limits<float>::infinity());
      }
    } else {
      Problem one = packed_detail::alone_problem(pp.whole, p, s, Lq, Lk);
      std::vector<float> oq = unpack(q, q0, Lq, Hq, E), ok = unpack(k, k0, Lk, Hkv, E), ov = unpack(v, k0, Lk, Hkv, Ev);
      one.query = oq.data(), one.key = ok.data(), one.value = ov.data(), one.output = alone_out.data();
      one.logsumexp = alone_lse.data();
      std::vector<float> one_scratch(static_cast<size_t>(sdpa::scratch_floats(one, 1)));
      status = sdpa::forward(one, one_scratch.data(), one_scratch.size());
      FUZZ_CHECK(p, status == Status::kOk, "forward() of sequence %d alone returned %s", s, sdpa::status_name(status));
    }
    const std::vector<float> packed_rows = unpack(out, q0, Lq, Hq, Ev);
    for (size_t n = 0; n < packed_rows.size(); n++) {
      FUZZ_CHECK(p, same_float(packed_rows[n], alone_out[n]), "packed sequence %d output %zu: %a, alone %a", s, n,
                 packed_rows[n], alone_out[n]);
    }
    for (int32_t h = 0; h < Hq; h++) {
      for (int32_t i = 0; i < Lq; i++) {
        const float packed_lse = lse[static_cast<size_t>(h) * pk.Tq + q0 + i];
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

// The backward over the same packing (see the top). `go` is dO with p's output strides replaced
// by its own (go_stride_*): the backward fuzz target's.
inline void check_packed_backward(FuzzedDataProvider& in, const Problem& p, const float* grad_output, int64_t go_b,
                                  int64_t go_h, int64_t go_l, sdpa::ThreadPool* two_threads) {
  using packed_detail::unpack;
  const int32_t S = p.batch, Hq = p.q_heads, Hkv = p.kv_heads, E = p.head_dim, Ev = p.value_dim;
  const packed_detail::Packing pk = packed_detail::draw_packing(in, p);
  std::vector<float> q, k, v, go;
  for (int32_t s = 0; s < S; s++) {
    const int32_t Lq = pk.q_starts[s + 1] - pk.q_starts[s], Lk = pk.k_starts[s + 1] - pk.k_starts[s];
    packed_detail::gather(q, p.query, p.q_stride_b, p.q_stride_h, p.q_stride_l, s, Lq, Hq, E);
    packed_detail::gather(k, static_cast<const float*>(p.key), p.k_stride_b, p.k_stride_h, p.k_stride_l, s, Lk, Hkv, E);
    packed_detail::gather(v, static_cast<const float*>(p.value), p.v_stride_b, p.v_stride_h, p.v_stride_l, s, Lk, Hkv, Ev);
    packed_detail::gather(go, grad_output, go_b, go_h, go_l, s, Lq, Hq, Ev);
  }
  float none = 0.0f;
  auto at = [&none](std::vector<float>& x) { return x.empty() ? &none : x.data(); };
  std::vector<float> out(static_cast<size_t>(pk.Tq) * Hq * Ev), lse(static_cast<size_t>(Hq) * pk.Tq);
  sdpa::PackedProblem pp = packed_detail::packed_problem(p, pk);
  pp.whole.query = at(q), pp.whole.key = at(k), pp.whole.value = at(v), pp.whole.output = at(out), pp.whole.logsumexp = at(lse);
  {
    std::vector<float> scratch(static_cast<size_t>(sdpa::packed_scratch_floats(pp, 1)));
    const Status status = sdpa::forward_packed(pp, scratch.data(), scratch.size());
    FUZZ_CHECK(p, status == Status::kOk, "forward_packed() returned %s", sdpa::status_name(status));
  }
  sdpa::PackedBackwardProblem pb;
  pb.whole.forward = pp.whole;
  pb.whole.forward.logsumexp = nullptr;
  pb.whole.logsumexp = at(lse);
  pb.whole.grad_output = at(go);
  pb.whole.go_stride_h = Ev, pb.whole.go_stride_l = static_cast<int64_t>(Hq) * Ev;
  pb.whole.dq_stride_h = E, pb.whole.dq_stride_l = static_cast<int64_t>(Hq) * E;
  pb.whole.dk_stride_h = E, pb.whole.dk_stride_l = static_cast<int64_t>(Hkv) * E;
  pb.whole.dv_stride_h = Ev, pb.whole.dv_stride_l = static_cast<int64_t>(Hkv) * Ev;
  pb.sequences = S, pb.q_starts = pk.q_starts.data(), pb.k_starts = pk.k_starts.data();
  struct Grads {
    std::vector<float> dq, dk, dv, ds;
  };
  auto run = [&](sdpa::ThreadPool* pool) {
    Grads g;
    g.dq.assign(q.size(), sentinel()), g.dk.assign(k.size(), sentinel()), g.dv.assign(v.size(), sentinel());
    sdpa::PackedBackwardProblem b = pb;
    b.whole.d_query = at(g.dq), b.whole.d_key = at(g.dk), b.whole.d_value = at(g.dv);
    if (p.sinks != nullptr) {
      g.ds.assign(static_cast<size_t>(Hq), sentinel());
      b.whole.d_sinks = g.ds.data();
    }
    std::vector<float> scratch(static_cast<size_t>(sdpa::packed_backward_scratch_floats(b, pool != nullptr ? pool->threads() : 1)));
    const Status status = sdpa::backward_packed(b, scratch.data(), scratch.size(), pool);
    FUZZ_CHECK(p, status == Status::kOk, "backward_packed() returned %s on a valid problem", sdpa::status_name(status));
    return g;
  };
  const Grads one = run(nullptr);

  // Each sequence against forward() and backward() on it alone.
  std::vector<double> sink_sum(static_cast<size_t>(Hq), 0.0);
  for (int32_t s = 0; s < S; s++) {
    const int32_t q0 = pk.q_starts[s], k0 = pk.k_starts[s];
    const int32_t Lq = pk.q_starts[s + 1] - q0, Lk = pk.k_starts[s + 1] - k0;
    std::vector<float> dq_alone(static_cast<size_t>(Hq) * Lq * E, 0.0f), dk_alone(static_cast<size_t>(Hkv) * Lk * E, 0.0f),
        dv_alone(static_cast<size_t>(Hkv) * Lk * Ev, 0.0f), ds_alone(static_cast<size_t>(Hq), 0.0f);
    if (Lq > 0 && Lk > 0) {
      Problem one_p = packed_detail::alone_problem(pp.whole, p, s, Lq, Lk);
      std::vector<float> oq = unpack(q, q0, Lq, Hq, E), ok = unpack(k, k0, Lk, Hkv, E), ov = unpack(v, k0, Lk, Hkv, Ev);
      std::vector<float> ogo = unpack(go, q0, Lq, Hq, Ev), oo(static_cast<size_t>(Hq) * Lq * Ev), olse(static_cast<size_t>(Hq) * Lq);
      one_p.query = oq.data(), one_p.key = ok.data(), one_p.value = ov.data(), one_p.output = oo.data();
      one_p.logsumexp = olse.data();
      std::vector<float> fs(static_cast<size_t>(sdpa::scratch_floats(one_p, 1)));
      Status status = sdpa::forward(one_p, fs.data(), fs.size());
      FUZZ_CHECK(p, status == Status::kOk, "forward() of sequence %d alone returned %s", s, sdpa::status_name(status));
      sdpa::BackwardProblem ob;
      ob.forward = one_p;
      ob.logsumexp = olse.data(), ob.grad_output = ogo.data();
      ob.go_stride_b = one_p.o_stride_b, ob.go_stride_h = one_p.o_stride_h, ob.go_stride_l = one_p.o_stride_l;
      ob.dq_stride_b = one_p.q_stride_b, ob.dq_stride_h = one_p.q_stride_h, ob.dq_stride_l = one_p.q_stride_l;
      ob.dk_stride_b = one_p.k_stride_b, ob.dk_stride_h = one_p.k_stride_h, ob.dk_stride_l = one_p.k_stride_l;
      ob.dv_stride_b = one_p.v_stride_b, ob.dv_stride_h = one_p.v_stride_h, ob.dv_stride_l = one_p.v_stride_l;
      ob.d_query = dq_alone.data(), ob.d_key = dk_alone.data(), ob.d_value = dv_alone.data();
      if (p.sinks != nullptr) ob.d_sinks = ds_alone.data();
      std::vector<float> bs(static_cast<size_t>(sdpa::backward_scratch_floats(ob, 1)));
      status = sdpa::backward(ob, bs.data(), bs.size());
      FUZZ_CHECK(p, status == Status::kOk, "backward() of sequence %d alone returned %s", s, sdpa::status_name(status));
    }
    for (int32_t h = 0; h < Hq; h++) sink_sum[static_cast<size_t>(h)] += ds_alone[static_cast<size_t>(h)];
    const std::vector<float> dq = unpack(one.dq, q0, Lq, Hq, E), dk = unpack(one.dk, k0, Lk, Hkv, E),
                             dv = unpack(one.dv, k0, Lk, Hkv, Ev);
    for (size_t n = 0; n < dq.size(); n++) FUZZ_CHECK(p, same_float(dq[n], dq_alone[n]), "packed sequence %d d_query %zu: %a, alone %a", s, n, dq[n], dq_alone[n]);
    for (size_t n = 0; n < dk.size(); n++) FUZZ_CHECK(p, same_float(dk[n], dk_alone[n]), "packed sequence %d d_key %zu: %a, alone %a", s, n, dk[n], dk_alone[n]);
    for (size_t n = 0; n < dv.size(); n++) FUZZ_CHECK(p, same_float(dv[n], dv_alone[n]), "packed sequence %d d_value %zu: %a, alone %a", s, n, dv[n], dv_alone[n]);
  }
  for (size_t h = 0; h < one.ds.size(); h++) {
    const float want = static_cast<float>(sink_sum[h]);
    FUZZ_CHECK(p, same_float(one.ds[h], want), "packed d_sinks[%zu]: %a, the sequences' sum %a", h, one.ds[h], want);
  }
  const Grads two = run(two_threads);
  for (size_t n = 0; n < one.dq.size(); n++) FUZZ_CHECK(p, same_float(one.dq[n], two.dq[n]), "packed d_query %zu: 2 threads differ", n);
  for (size_t n = 0; n < one.dk.size(); n++) FUZZ_CHECK(p, same_float(one.dk[n], two.dk[n]), "packed d_key %zu: 2 threads differ", n);
  for (size_t n = 0; n < one.dv.size(); n++) FUZZ_CHECK(p, same_float(one.dv[n], two.dv[n]), "packed d_value %zu: 2 threads differ", n);
  for (size_t n = 0; n < one.ds.size(); n++) FUZZ_CHECK(p, same_float(one.ds[n], two.ds[n]), "packed d_sinks %zu: 2 threads differ", n);
}

}  // namespace sdpa_fuzz
