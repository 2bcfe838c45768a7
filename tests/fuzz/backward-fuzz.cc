// Fuzz target: sdpa::backward() (src/sdpa-backward.h) on problems decoded from the fuzz
// input: forward() with Problem::logsumexp gives O and lse, then backward() the gradients,
// checked against the double-precision reference_backward by tests/fuzz/backward-check.h
// (read it for the policy: which rows and keys are checked, with what bound, and where NaN
// is allowed).
//
// The input decides:
//   shapes   B, Hkv, Hq = Hkv·group (GQA), Lq, Lk, E, Ev around the tile edges of src/tiles.h
//            (problem-decoding.h's lengths, plus kBackwardKeyTile - 1, kBackwardKeyTile,
//            kBackwardKeyTile + 1, 2·kBackwardKeyTile + 1 keys);
//   layouts  Q, K, V, O, dO, dQ, dK, dV as [B, H, L, D] or [B, L, H, D], strides padded (the
//            padding holds NaN), zero strides on an input axis;
//   options  everything problem-decoding.h decodes (scale, softcap including subnormal and
//            huge ones, float/bool masks with broadcasts, causal with one or per-batch
//            offsets including negative and INT32_MIN/MAX, key_lengths including 0), sinks
//            (with their gradient, d_sinks), ALiBi slopes and attention dropout (problem-decoding.h,
//            decode_alibi then decode_dropout: from the bytes left after the values);
//   values   mostly (3 inputs in 4) moderate ordinary values with no special ones: gradients
//            of huge logits are ill-conditioned and the checker can only skip them; else
//            fuzz-values.h's styles (NaN, ±Inf, ±1e30, FLT_MAX, subnormals, -0, tiny/huge
//            magnitudes), plus single elements of Q, K, V or dO the input sets. K/V rows no
//            query row attends get NaN/Inf/FLT_MAX (must not leak into any gradient), and in
//            one mode so do rows some query rows attend: the gradients of the rows attending
//            them (and of every key those rows attend) may then be NaN, nothing else may.
// Every buffer is allocated at its exact size, and every output filled with a sentinel NaN.
//
// With a float mask, half the inputs also ask for the mask's gradient (d_mask, as large as
// the mask's buffer, its padding a sentinel too); a quarter of those split each of its blocks'
// sums into a count of parts the input picks (BackwardProblem::mask_grad_parts, 1 to 40, as a
// caller running a call in slices passes the whole call's).
// backward() runs on 1, 2 and 3 threads (B·Hkv ≤ 9 pairs: the fused per-pair kernel on one
// thread, the dK/dV + dQ split on 2 and 3 threads unless pairs ≥ 4·threads): the results must
// be bitwise equal (NaN payloads aside). One input in eight is made invalid (a null pointer,
// a negative stride, a non-float32 kv_type, too little or no scratch, a bad shape, scale,
// softcap, key length, sink or ALiBi slope, dropout batch base, a d_mask without a float mask, a d_sinks without sinks): backward() and validate_backward()
// must return the exact Status and write nothing. One valid input in four also checks the
// packed sequences' backward (tests/fuzz/packed-check.h: each sequence bitwise backward() on it alone).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention-check.h"
#include "backward-check.h"
#include "fuzz-values.h"
#include "packed-check.h"
#include "parallel/thread-pool.h"
#include "problem-decoding.h"
#include "sdpa-backward.h"
#include "sdpa.h"
#include "tiles.h"

namespace sdpa_fuzz {
namespace {

using sdpa::BackwardProblem;
using sdpa::KvType;
using sdpa::Status;
using sdpa::kBackwardKeyTile;

// Key counts: pick_length(), and the edges of the backward's key blocks.
int32_t pick_backward_key_length(FuzzedDataProvider& in) {
  const uint8_t choice = in.ConsumeIntegral<uint8_t>();
  if (choice >= 192) {
    const int32_t lengths[] = {kBackwardKeyTile - 1, kBackwardKeyTile, kBackwardKeyTile + 1, 2 * kBackwardKeyTile + 1};
    return lengths[choice % 4];
  }
  return pick_length(in);
}

// The thread pools, made once. 0: no pool (one thread, the fused kernel).
sdpa::ThreadPool* pool(int threads) {
  static sdpa::ThreadPool two(2), three(3);
  return threads <= 1 ? nullptr : threads == 2 ? &two : &three;
}

struct Buffers : OptionBuffers {
  std::vector<float> query, key, value, output, logsumexp, grad_output;
};

struct Gradients {
  std::vector<float> dq, dk, dv, dm, ds;  // dm: empty without d_mask; ds: [Hq] with sinks, else empty
};

// backward() with exactly the scratch it asks for (misaligned by 0-3 floats), on fresh
// sentinel-filled outputs.
Gradients run_backward(BackwardProblem bp, const Gradients& sizes, int threads, uint32_t misalign) {
  Gradients g;
  g.dq.assign(sizes.dq.size(), sentinel());
  g.dk.assign(sizes.dk.size(), sentinel());
  g.dv.assign(sizes.dv.size(), sentinel());
  g.dm.assign(sizes.dm.size(), sentinel());
  g.ds.assign(sizes.ds.size(), sentinel());
  bp.d_query = g.dq.data(), bp.d_key = g.dk.data(), bp.d_value = g.dv.data();
  bp.d_mask = g.dm.empty() ? nullptr : g.dm.data();
  bp.d_sinks = g.ds.empty() ? nullptr : g.ds.data();
  sdpa::ThreadPool* tp = pool(threads);
  const uint64_t need = sdpa::backward_scratch_floats(bp, tp != nullptr ? tp->threads() : 1);
  std::vector<float> scratch(static_cast<size_t>(need) + misalign);
  const Status status = sdpa::backward(bp, scratch.data() + misalign, need, tp);
  FUZZ_CHECK(bp.forward, status == Status::kOk, "backward() returned %s on a valid problem (%d threads)",
             sdpa::status_name(status), threads);
  return g;
}

FUZZ_NO_COVERAGE void check_same(const Problem& p, const std::vector<float>& a, const std::vector<float>& b,
                                 const char* what, int threads) {
  for (size_t n = 0; n < a.size(); n++) {
    // (is_sentinel: any NaN equals any NaN, but an element left unwritten is not a NaN result.)
    FUZZ_CHECK(p, same_float(a[n], b[n]) && is_sentinel(a[n]) == is_sentinel(b[n]),
               "%s: element %zu differs on %d threads: %a vs %a on 1", what, n, threads, a[n], b[n]);
  }
}

// One field of a valid backward problem broken, and the Status it must give.
// spare_d_mask: a sentinel-filled buffer for a d_mask (or d_sinks) that must not be written.
Status corrupt(FuzzedDataProvider& in, BackwardProblem& bp, Buffers& buf, uint64_t& scratch_size, float*& scratch,
               float* spare_d_mask) {
  Problem& p = bp.forward;
  const uint8_t which = in.ConsumeIntegral<uint8_t>() % 22;
  const uint8_t detail = in.ConsumeIntegral<uint8_t>();
  switch (which) {
    case 0: bp.logsumexp = nullptr; return Status::kNullPointer;
    case 1: bp.grad_output = nullptr; return Status::kNullPointer;
    case 2: bp.d_query = nullptr; return Status::kNullPointer;
    case 3: bp.d_key = nullptr; return Status::kNullPointer;
    case 4: bp.d_value = nullptr; return Status::kNullPointer;
    case 5: {
      switch (detail % 4) {
        case 0: p.query = nullptr; break;
        case 1: p.key = nullptr; break;
        case 2: p.value = nullptr; break;
        default: p.output = nullptr; break;
      }
      return Status::kNullPointer;
    }
    case 6: {
      int64_t* strides[] = {&bp.go_stride_b, &bp.go_stride_h, &bp.go_stride_l, &bp.dq_stride_b,
                            &bp.dq_stride_h, &bp.dq_stride_l, &bp.dk_stride_b, &bp.dk_stride_h,
                            &bp.dk_stride_l, &bp.dv_stride_b, &bp.dv_stride_h, &bp.dv_stride_l};
      return break_stride(strides[detail % 12], detail);
    }
    case 7: {
      int64_t* strides[] = {&p.q_stride_b, &p.q_stride_h, &p.q_stride_l, &p.k_stride_b, &p.k_stride_h, &p.k_stride_l,
                            &p.v_stride_b, &p.v_stride_h, &p.v_stride_l, &p.o_stride_b, &p.o_stride_h, &p.o_stride_l};
      return break_stride(strides[detail % 12], detail);
    }
    case 8: {  // valid for forward(), not for backward()
      const KvType sixteen_bit[] = {KvType::kFloat16, KvType::kFloat16Finite, KvType::kBFloat16};
      p.kv_type = sixteen_bit[detail % 3];
      return Status::kBadKvType;
    }
    case 9: return break_kv_type(p, detail);
    case 10: scratch = nullptr; return Status::kBadScratch;
    case 11: {
      int32_t* dims[] = {&p.batch, &p.q_heads, &p.kv_heads, &p.q_len, &p.kv_len, &p.head_dim, &p.value_dim};
      *dims[detail % 7] = detail & 0x80 ? 0 : detail & 0x40 ? -1 : INT32_MIN;
      return Status::kBadShape;
    }
    case 12: return break_scale(p, detail);
    case 13: return break_softcap(p, detail);
    case 14: return break_key_length(p, buf, detail);
    case 17: return break_window(p, detail);
    case 18: return break_sink(p, buf, detail);
    case 20: return break_alibi(p, buf, detail);
    case 21: return break_dropout(p, detail);
    case 19: {  // a sinks' gradient of a problem without sinks
      p.sinks = nullptr;
      bp.d_sinks = spare_d_mask;
      return Status::kNullPointer;
    }
    case 15: {  // a mask gradient of a problem with no float mask: none, or a bool one
      if (p.mask_kind == MaskKind::kFloat) p.mask_kind = detail % 2 == 0 ? MaskKind::kNone : MaskKind::kBool;
      if (p.mask_kind == MaskKind::kBool && buf.mask_b.size() < buf.mask_f.size()) {
        buf.mask_b.assign(buf.mask_f.size(), 1);  // the float mask's layout, as bytes
        p.mask = buf.mask_b.data();
      }
      bp.d_mask = spare_d_mask;
      return Status::kBadMaskGrad;
    }
    default:
      scratch_size -= 1;
      return Status::kBadScratch;
  }
}

void run(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Problem p;
  Buffers buf;

  // Shapes, within a work budget: backward() runs three times, plus forward() and the
  // double references.
  decode_shapes(in, pick_backward_key_length, 1e5, 2e6, p);
  const int32_t B = p.batch, Hkv = p.kv_heads, Lq = p.q_len, Lk = p.kv_len, E = p.head_dim, Ev = p.value_dim;
  p.kv_type = KvType::kFloat32;
  const int32_t Hq = p.q_heads;

  const auto [q, k, v, o] = decode_layouts(in, p);
  const Layout go = make_layout(B, Hq, Lq, Ev, in.ConsumeIntegral<uint8_t>(), true);
  const Layout dq = make_layout(B, Hq, Lq, E, in.ConsumeIntegral<uint8_t>(), false);
  const Layout dk = make_layout(B, Hkv, Lk, E, in.ConsumeIntegral<uint8_t>(), false);
  const Layout dv = make_layout(B, Hkv, Lk, Ev, in.ConsumeIntegral<uint8_t>(), false);

  decode_options(in, p, buf);
  decode_sinks(in, p, buf);

  const uint32_t misalign = in.ConsumeIntegralInRange<uint32_t>(0, 3);
  const uint8_t poison_choice = in.ConsumeIntegral<uint8_t>();
  const uint8_t invalid = in.ConsumeIntegral<uint8_t>();
  const bool tame = in.ConsumeIntegral<uint8_t>() < 192;

  // Values.
  auto style = [&] {
    ValueStyle s = ValueStyle::from(in);
    if (tame) s.exponent = std::clamp(s.exponent, -2, 1), s.special_rate = 0;
    return s;
  };
  buf.query.resize(q.size), buf.key.resize(k.size), buf.value.resize(v.size), buf.grad_output.resize(go.size);
  fill(buf.query, style());
  fill(buf.key, style());
  fill(buf.value, style());
  fill(buf.grad_output, style());
  // Single elements set by the input: (tensor, index, special value), up to 7.
  for (int n = in.ConsumeIntegral<uint8_t>() % 8; n > 0 && in.remaining_bytes() >= 4; n--) {
    const uint8_t tensor = in.ConsumeIntegral<uint8_t>() % 4;
    const uint16_t index = in.ConsumeIntegral<uint16_t>();
    const float f = kSpecialFloats[in.ConsumeIntegral<uint8_t>() % (sizeof kSpecialFloats / sizeof kSpecialFloats[0])];
    std::vector<float>& x = tensor == 0 ? buf.query : tensor == 1 ? buf.key : tensor == 2 ? buf.value : buf.grad_output;
    x[index % x.size()] = f;
  }
  decode_alibi(in, p, buf);  // from the bytes left (problem-decoding.h)
  decode_dropout(in, p);     // and then dropout
  fill_padding(buf.query, B, Hq, Lq, E, q, kNaN);
  fill_padding(buf.key, B, Hkv, Lk, E, k, kNaN);
  fill_padding(buf.value, B, Hkv, Lk, Ev, v, kNaN);
  fill_padding(buf.grad_output, B, Hq, Lq, Ev, go, kNaN);
  // K/V rows no query row attends: NaN/Inf (must not leak); in one mode also the rows only
  // some query rows attend (those rows' gradients may be NaN, no other).
  {
    const float poison_values[] = {kNaN, kInf, -kInf, FLT_MAX};
    const bool poison = poison_choice >= 64;
    const bool poison_partly_attended = poison && (poison_choice & 0x10) != 0;
    std::vector<bool> attended_k(k.size, false), attended_v(v.size, false);
    mark_attended(p, k, v, poison_partly_attended, attended_k, attended_v);
    const float pv = poison_values[poison_choice % 4];
    treat(buf.key, attended_k, poison, pv, false), treat(buf.value, attended_v, poison, pv, false);
  }
  p.query = buf.query.data(), p.key = buf.key.data(), p.value = buf.value.data();

  // The forward pass: O (its padding keeps the sentinel, a NaN) and lse.
  buf.output.assign(o.size, sentinel());
  buf.logsumexp.assign(static_cast<size_t>(B) * Hq * Lq, sentinel());
  p.output = buf.output.data(), p.logsumexp = buf.logsumexp.data();
  FUZZ_CHECK(p, sdpa::validate(p) == Status::kOk, "the fuzzer made an invalid problem: %s",
             sdpa::status_name(sdpa::validate(p)));
  {
    std::vector<float> scratch(static_cast<size_t>(sdpa::scratch_floats(p, 1)));
    const Status status = sdpa::forward(p, scratch.data(), scratch.size(), nullptr);
    FUZZ_CHECK(p, status == Status::kOk, "forward() returned %s", sdpa::status_name(status));
  }

  BackwardProblem bp;
  bp.forward = p;
  bp.logsumexp = buf.logsumexp.data();
  bp.grad_output = buf.grad_output.data();
  bp.go_stride_b = go.b, bp.go_stride_h = go.h, bp.go_stride_l = go.l;
  bp.dq_stride_b = dq.b, bp.dq_stride_h = dq.h, bp.dq_stride_l = dq.l;
  bp.dk_stride_b = dk.b, bp.dk_stride_h = dk.h, bp.dk_stride_l = dk.l;
  bp.dv_stride_b = dv.b, bp.dv_stride_h = dv.h, bp.dv_stride_l = dv.l;
  Gradients sizes;
  sizes.dq.resize(dq.size), sizes.dk.resize(dk.size), sizes.dv.resize(dv.size);
  if (p.mask_kind == MaskKind::kFloat && (invalid & 1) == 0) sizes.dm.resize(buf.mask_f.size());
  if (p.sinks != nullptr) sizes.ds.resize(static_cast<size_t>(Hq));

  if (invalid >= 224) {  // one input in eight: a broken problem
    Gradients g;
    g.dq.assign(dq.size, sentinel()), g.dk.assign(dk.size, sentinel()), g.dv.assign(dv.size, sentinel());
    g.dm.assign(std::max<size_t>(1, buf.mask_f.size()), sentinel());
    bp.d_query = g.dq.data(), bp.d_key = g.dk.data(), bp.d_value = g.dv.data();
    uint64_t scratch_size = sdpa::backward_scratch_floats(bp, 1);
    std::vector<float> scratch_buffer(static_cast<size_t>(scratch_size) + 1);
    float* scratch = scratch_buffer.data();
    BackwardProblem bad = bp;
    const Status expected = corrupt(in, bad, buf, scratch_size, scratch, g.dm.data());
    const Status status = sdpa::backward(bad, scratch, scratch_size, nullptr);
    FUZZ_CHECK(bad.forward, status == expected, "backward() on a broken problem returned %s, not %s",
               sdpa::status_name(status), sdpa::status_name(expected));
    if (expected != Status::kBadScratch) {
      const Status vs = sdpa::validate_backward(bad);
      FUZZ_CHECK(bad.forward, vs == expected, "validate_backward() returned %s, not %s", sdpa::status_name(vs),
                 sdpa::status_name(expected));
    }
    for (float f : g.dq) FUZZ_CHECK(bad.forward, is_sentinel(f), "a broken problem wrote d_query");
    for (float f : g.dk) FUZZ_CHECK(bad.forward, is_sentinel(f), "a broken problem wrote d_key");
    for (float f : g.dv) FUZZ_CHECK(bad.forward, is_sentinel(f), "a broken problem wrote d_value");
    for (float f : g.dm) FUZZ_CHECK(bad.forward, is_sentinel(f), "a broken problem wrote d_mask");
    return;
  }

  if (!sizes.dm.empty()) {
    const uint8_t parts = in.ConsumeIntegral<uint8_t>();
    if (parts < 64) bp.mask_grad_parts = 1 + parts % 40;
  }
  const Gradients one = run_backward(bp, sizes, 1, misalign);
  for (int threads : {2, 3}) {
    const Gradients other = run_backward(bp, sizes, threads, (misalign + threads) % 4);
    check_same(p, other.dq, one.dq, "d_query", threads);
    check_same(p, other.dk, one.dk, "d_key", threads);
    check_same(p, other.dv, one.dv, "d_value", threads);
    check_same(p, other.dm, one.dm, "d_mask", threads);
    check_same(p, other.ds, one.ds, "d_sinks", threads);
  }
  bp.d_query = const_cast<float*>(one.dq.data());
  bp.d_key = const_cast<float*>(one.dk.data());
  bp.d_value = const_cast<float*>(one.dv.data());
  bp.d_mask = one.dm.empty() ? nullptr : const_cast<float*>(one.dm.data());
  bp.d_sinks = one.ds.empty() ? nullptr : const_cast<float*>(one.ds.data());
  check_backward(bp, one.dq, one.dk, one.dv, one.dm, one.ds);
  if (in.ConsumeIntegral<uint8_t>() >= 192) {  // one input in four: the packed sequences' backward
    check_packed_backward(in, p, buf.grad_output.data(), go.b, go.h, go.l, pool(2));
  }
}

}  // namespace
}  // namespace sdpa_fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sdpa_fuzz::run(data, size);
  return 0;
}
