// Fuzz target: sdpa::forward() (and the streamed split-K path, forward_segment() and
// merge_segments()) on problems decoded from the fuzz input, checked against the
// double-precision reference by tests/fuzz/attention-check.h.
//
// The input decides everything src/sdpa.h lets a caller decide:
//   shapes   B, Hkv, Hq = Hkv·group (GQA), Lq, Lk, E, Ev, drawn around the tile edges of
//            src/tiles.h (1, tile - 1, tile, tile + 1 for kQueryTile, kKeyGroup, kKeyTile,
//            kValueBlock) and past segment_keys() (the split-K segments of decoding);
//   layouts  query/key/value/output as [B, H, L, D] or [B, L, H, D], each stride padded by a
//            few elements (the padding holds NaN), and zero strides on an input axis;
//   options  scale, softcap (including subnormal and huge ones), a float or bool mask with
//            any broadcast (zero strides) and any axis order, causal with one offset or one
//            per batch (negative, past the end, INT32_MIN/MAX), key_lengths (including 0),
//            sinks (none, ordinary, ±1e30, ±FLT_MAX), ALiBi slopes shared or per batch (0,
//            ALiBi's geometric ones, [0, 1], 2^-20, rarely up to kMaxAlibiSlope; a problem that is
//            not causal gets an offset for ALiBi's diagonal; decoded from the bytes left after the
//            values: problem-decoding.h, decode_alibi), attention dropout (threshold 0 in about
//            half, small, q·2^32, about 2^31, near 2^32 - 1 or any; any seed; batch, head and
//            row bases 0, small or the largest taken; after ALiBi: decode_dropout),
//            weights, logsumexp, kv_type float32/float16/float16-finite/bfloat16, read_kv_in_order,
//            a pool of 1 or 2 threads;
//   values   per tensor, ordinary numbers of a chosen magnitude mixed with NaN, ±Inf, ±1e30,
//            ±FLT_MAX, subnormals, -0 (16-bit K/V: the format's edge patterns), plus single
//            elements the input sets; and, deliberately, NaN/Inf in every K/V row no query row
//            may attend (past key_lengths, past every causal limit, masked for every row).
// Every buffer is allocated at its exact size (fuzz-values.h): AddressSanitizer sees any
// access past a tensor, a scratch buffer or a segment's copy of K/V. One input in 32 probes
// the largest sizes validate() accepts (planning only; UBSan watches the size arithmetic).
//
// Besides the reference comparison, results that the contract says are bitwise identical
// are compared bitwise: any thread count, kFloat16Finite against kFloat16 on data without
// Inf/NaN halves, the output with weights against without, and the split-K path against
// forward(); and packed sequences (tests/fuzz/packed-check.h: forward_packed() over one sequence
// per batch of drawn lengths, each sequence bitwise forward() on it alone). One input in eight is turned into an invalid problem (one field broken: a size,
// a pointer, a stride, the scale, ...), which must return the Status validate() documents and
// write nothing (a dropout batch, head or row base negative, or past INT32_MAX - (B - 1), among them).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "attention-check.h"
#include "fuzz-values.h"
#include "packed-check.h"
#include "problem-decoding.h"
#include "parallel/thread-pool.h"
#include "sdpa.h"
#include "tiles.h"

namespace sdpa_fuzz {
namespace {

using sdpa::KvType;
using sdpa::Status;

// Key counts: pick_length() (problem-decoding.h), and the split-K segment edges of decoding.
int32_t pick_key_length(FuzzedDataProvider& in) {
  const uint8_t choice = in.ConsumeIntegral<uint8_t>();
  const int32_t segment = sdpa::segment_keys();
  if (choice >= 232) {
    const int32_t lengths[] = {segment - 1, segment, segment + 1, 2 * segment + kKeyTile + 1};
    return lengths[choice % 4];
  }
  return pick_length(in);
}

// The thread pools, made once: creating threads per input would dominate the run time.
sdpa::ThreadPool* pool(int threads) {
  static sdpa::ThreadPool one(1), two(2);
  return threads == 0 ? nullptr : threads == 1 ? &one : &two;
}

// Everything a problem points to, owned, each at its exact size.
struct Buffers : OptionBuffers {
  std::vector<float> query, output, weights, logsumexp;
  std::vector<float> key_f, value_f;
  std::vector<uint16_t> key_h, value_h;
};

// One field of a valid problem broken, and the Status validate() gives for it.
Status corrupt(FuzzedDataProvider& in, Problem& p, Buffers& buf, uint64_t& scratch_size, float*& scratch) {
  const uint8_t which = in.ConsumeIntegral<uint8_t>() % 25;
  const uint8_t detail = in.ConsumeIntegral<uint8_t>();
  int32_t* dims[] = {&p.batch, &p.q_heads, &p.kv_heads, &p.q_len, &p.kv_len, &p.head_dim, &p.value_dim};
  int64_t* strides[] = {&p.q_stride_b, &p.q_stride_h, &p.q_stride_l, &p.k_stride_b,
                        &p.k_stride_h, &p.k_stride_l, &p.v_stride_b, &p.v_stride_h,
                        &p.v_stride_l, &p.o_stride_b, &p.o_stride_h, &p.o_stride_l,
                        &p.mask_stride_b, &p.mask_stride_h, &p.mask_stride_q, &p.mask_stride_k};
  switch (which) {
    case 0: case 1: case 2: case 3: case 4: case 5: case 6:
      *dims[which] = detail % 2 == 0 ? 0 : detail % 4 == 1 ? -1 : INT32_MIN;
      return Status::kBadShape;
    case 7:
      p.kv_heads = p.q_heads + 1;  // Hq % Hkv = Hq != 0
      return Status::kBadShape;
    case 8: p.query = nullptr; return Status::kNullPointer;
    case 9: p.key = nullptr; return Status::kNullPointer;
    case 10: p.value = nullptr; return Status::kNullPointer;
    case 11: p.output = nullptr; return Status::kNullPointer;
    case 12:
      p.mask_kind = detail % 2 == 0 ? MaskKind::kFloat : MaskKind::kBool;
      p.mask = nullptr;
      return Status::kNullPointer;
    case 13: return break_stride(strides[detail % 16], detail);
    case 14: return break_kv_type(p, detail);
    case 15: return break_scale(p, detail);
    case 16: return break_softcap(p, detail);
    case 17: return break_key_length(p, buf, detail);
    case 21: return break_window(p, detail);
    case 22: return break_sink(p, buf, detail);
    case 23: return break_alibi(p, buf, detail);
    case 24: return break_dropout(p, detail);
    case 18:
      scratch = nullptr;
      return Status::kBadScratch;
    case 19: {  // sizes past the kernel's 32-bit counts (sdpa::kMaxCount, kMaxHeadDim)
      constexpr int32_t kTooMany = sdpa::kMaxCount + 1;
      switch (detail % 5) {
        case 0: p.q_len = kTooMany; break;
        case 1: p.kv_len = kTooMany; break;
        case 2: p.head_dim = sdpa::kMaxHeadDim + 1; break;
        case 3: p.batch = kTooMany; break;
        default: p.kv_heads = 1, p.q_heads = sdpa::kMaxCount / p.q_len + 1; break;  // (Hq/Hkv)·Lq
      }
      return Status::kBadShape;
    }
    default:
      scratch_size -= 1;
      return Status::kBadScratch;
  }
}

// The largest sizes validate() accepts, every stride 0 (so the few elements allocated are
// all there is): validate(), and the planning functions, whose size arithmetic UBSan watches
// for overflow. (Not forward(): a billion rows would take hours.)
void probe_largest_sizes(Problem p, uint8_t choice) {
  constexpr int32_t kMax = sdpa::kMaxCount;
  p.q_stride_b = p.q_stride_h = p.q_stride_l = 0;
  p.k_stride_b = p.k_stride_h = p.k_stride_l = 0;
  p.v_stride_b = p.v_stride_h = p.v_stride_l = 0;
  p.o_stride_b = p.o_stride_h = p.o_stride_l = 0;
  p.mask_stride_b = p.mask_stride_h = p.mask_stride_q = p.mask_stride_k = 0;
  p.weights = nullptr, p.logsumexp = nullptr, p.key_lengths = nullptr, p.key_starts = nullptr, p.sinks = nullptr;
  // B, Hq and Lq go up to kMaxCount: with bases 0, base + B - 1, base + Hq - 1 and base + Lq - 1
  // stay int32s.
  p.alibi_slopes = nullptr, p.dropout_batch_base = 0, p.dropout_head_base = 0, p.dropout_row_base = 0;
  p.batch = p.q_heads = p.kv_heads = p.q_len = p.kv_len = 1;
  switch (choice % 4) {
    case 0: p.q_len = kMax; break;                                        // one head's rows
    case 1: p.kv_len = kMax, p.batch = kMax / sdpa::segment_count(p); break;  // keys, segments
    case 2: p.q_heads = kMax, p.kv_heads = choice & 4 ? kMax : 1; break;  // heads (GQA or not)
    default: p.head_dim = p.value_dim = sdpa::kMaxHeadDim, p.kv_len = kMax - 1; break;
  }
  FUZZ_CHECK(p, sdpa::validate(p) == Status::kOk, "validate() refused sizes at its limits: %s",
             sdpa::status_name(sdpa::validate(p)));
  for (int32_t threads : {1, 2, 64}) (void)sdpa::scratch_floats(p, threads);
  if (sdpa::reads_keys_in_place(p)) {
    (void)sdpa::segment_count(p), (void)sdpa::segment_scratch_floats(p), (void)sdpa::segment_partials_floats(p);
  }
}


// forward() with exactly the scratch it asks for, on a fresh copy of the output (and weights)
// buffers filled with the sentinel.
struct Result {
  std::vector<float> output, weights, logsumexp;
};
Result run_forward(Problem p, const Buffers& buf, int threads, uint32_t scratch_misalign) {
  Result r;
  r.output.assign(buf.output.size(), sentinel());
  p.output = r.output.data();
  if (p.weights != nullptr) {
    r.weights.assign(buf.weights.size(), sentinel());
    p.weights = r.weights.data();
  }
  if (p.logsumexp != nullptr) {
    r.logsumexp.assign(buf.logsumexp.size(), sentinel());
    p.logsumexp = r.logsumexp.data();
  }
  sdpa::ThreadPool* tp = pool(threads);
  const uint64_t need = sdpa::scratch_floats(p, tp != nullptr ? tp->threads() : 1);
  // The kernel aligns the scratch itself: start it 0-3 floats past a 16-byte boundary.
  std::vector<float> scratch(static_cast<size_t>(need) + scratch_misalign);
  const Status status = sdpa::forward(p, scratch.data() + scratch_misalign, need, tp);
  FUZZ_CHECK(p, status == Status::kOk, "forward() returned %s on a valid problem", sdpa::status_name(status));
  return r;
}

FUZZ_NO_COVERAGE void check_same(const Problem& p, const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  for (size_t n = 0; n < a.size(); n++) {
    FUZZ_CHECK(p, same_float(a[n], b[n]), "%s: element %zu differs: %a vs %a", what, n, a[n], b[n]);
  }
}

// The streamed decode of src/sdpa.h: each segment's keys copied into buffers of exactly the
// segment's size, forward_segment() on them, merge_segments(): bitwise forward()'s output.
void check_segments(const Problem& p_in, const Buffers& buf, const std::vector<float>& expected) {
  Problem p = p_in;
  std::vector<float> output(buf.output.size(), sentinel()), logsumexp(buf.logsumexp.size(), sentinel());
  p.output = output.data();
  if (p.logsumexp != nullptr) p.logsumexp = logsumexp.data();
  const int32_t segments = sdpa::segment_count(p);
  std::vector<float> partials(static_cast<size_t>(sdpa::segment_partials_floats(p)));
  std::vector<float> scratch(static_cast<size_t>(sdpa::segment_scratch_floats(p)));
  const size_t elem = sdpa::is_16_bit(p.kv_type) ? 2 : 4;
  for (int32_t s = 0; s < segments; s++) {
    const int64_t first = static_cast<int64_t>(s) * sdpa::segment_keys();
    const int64_t n = std::min<int64_t>(p.kv_len - first, sdpa::segment_keys());
    const size_t k_size = static_cast<size_t>((n - 1) * p.k_stride_l + p.head_dim) * elem;
    const size_t v_size = static_cast<size_t>((n - 1) * p.v_stride_l + p.value_dim) * elem;
    const char* k_src = static_cast<const char*>(p_in.key) + static_cast<size_t>(first * p.k_stride_l) * elem;
    const char* v_src = static_cast<const char*>(p_in.value) + static_cast<size_t>(first * p.v_stride_l) * elem;
    std::unique_ptr<char[]> k(new char[k_size]), v(new char[v_size]);
    std::memcpy(k.get(), k_src, k_size);
    std::memcpy(v.get(), v_src, v_size);
    p.key = k.get(), p.value = v.get();
    const Status status = sdpa::forward_segment(p, s, partials.data(), scratch.data(), scratch.size());
    FUZZ_CHECK(p, status == Status::kOk, "forward_segment(%d) returned %s", s, sdpa::status_name(status));
  }
  for (int32_t s : {-1, segments}) {  // no such segment
    const Status status = sdpa::forward_segment(p, s, partials.data(), scratch.data(), scratch.size());
    FUZZ_CHECK(p, status == Status::kBadSegment, "forward_segment(%d) of %d returned %s", s, segments,
               sdpa::status_name(status));
  }
  if (!scratch.empty()) {
    const Status status = sdpa::forward_segment(p, 0, partials.data(), scratch.data(), scratch.size() - 1);
    FUZZ_CHECK(p, status == Status::kBadScratch, "forward_segment() with too little scratch returned %s",
               sdpa::status_name(status));
  }
  const Status status = sdpa::merge_segments(p, partials.data());
  FUZZ_CHECK(p, status == Status::kOk, "merge_segments returned %s", sdpa::status_name(status));
  check_same(p, output, expected, "split-K path against forward()");
  check_same(p, logsumexp, buf.logsumexp, "logsumexp, split-K path against forward()");
}

void run(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Problem p;
  Buffers buf;

  // Shapes, within a work budget that keeps an execution in the milliseconds.
  decode_shapes(in, pick_key_length, 2e5, 6e6, p);
  const int32_t B = p.batch, Hkv = p.kv_heads, Lq = p.q_len, Lk = p.kv_len, E = p.head_dim, Ev = p.value_dim;
  const int32_t Hq = p.q_heads;

  const uint8_t kv_type = in.ConsumeIntegral<uint8_t>() % 3;
  p.kv_type = static_cast<KvType>(kv_type);
  // A 16-bit problem is bfloat16 for half of the shapes: chosen from the shape drawn above, not
  // from another input byte (which would make the committed corpus decode to other problems).
  if (kv_type != 0 && (B + 3 * Hq + 5 * Hkv + 7 * Lq + 11 * Lk + 13 * E + 17 * Ev) % 2 == 1) p.kv_type = KvType::kBFloat16;
  const bool half = sdpa::is_16_bit(p.kv_type);  // 16-bit K/V (key_h, value_h): halves or bfloat16
  const bool bf16 = p.kv_type == KvType::kBFloat16;

  const auto [q, k, v, o] = decode_layouts(in, p);

  decode_options(in, p, buf);
  decode_sinks(in, p, buf);
  const bool want_weights = in.ConsumeBool();
  p.read_kv_in_order = in.ConsumeBool();
  const int threads = in.ConsumeIntegralInRange<int>(0, 2);
  const uint32_t misalign = in.ConsumeIntegralInRange<uint32_t>(0, 3);
  const uint8_t extra_checks = in.ConsumeIntegral<uint8_t>();
  const uint8_t poison_choice = in.ConsumeIntegral<uint8_t>();
  const uint8_t invalid = in.ConsumeIntegral<uint8_t>();

  // Values.
  buf.query.resize(q.size);
  fill(buf.query, ValueStyle::from(in));
  p.query = buf.query.data();
  const ValueStyle k_style = ValueStyle::from(in), v_style = ValueStyle::from(in);
  if (half) {
    buf.key_h.resize(k.size), buf.value_h.resize(v.size);
    fill(buf.key_h, k_style, bf16), fill(buf.value_h, v_style, bf16);
    p.key = buf.key_h.data(), p.value = buf.value_h.data();
  } else {
    buf.key_f.resize(k.size), buf.value_f.resize(v.size);
    fill(buf.key_f, k_style), fill(buf.value_f, v_style);
    p.key = buf.key_f.data(), p.value = buf.value_f.data();
  }
  // Single elements set by the input: (tensor, index, special value), up to 7.
  for (int n = in.ConsumeIntegral<uint8_t>() % 8; n > 0 && in.remaining_bytes() >= 4; n--) {
    const uint8_t tensor = in.ConsumeIntegral<uint8_t>() % 3;
    const uint16_t index = in.ConsumeIntegral<uint16_t>();
    const uint8_t special = in.ConsumeIntegral<uint8_t>();
    const float f = kSpecialFloats[special % (sizeof kSpecialFloats / sizeof kSpecialFloats[0])];
    const uint16_t h = bf16 ? kSpecialBFloat16s[special % (sizeof kSpecialBFloat16s / sizeof kSpecialBFloat16s[0])]
                            : kSpecialHalves[special % (sizeof kSpecialHalves / sizeof kSpecialHalves[0])];
    if (tensor == 0) buf.query[index % buf.query.size()] = f;
    else if (half) (tensor == 1 ? buf.key_h[index % buf.key_h.size()] : buf.value_h[index % buf.value_h.size()]) = h;
    else (tensor == 1 ? buf.key_f[index % buf.key_f.size()] : buf.value_f[index % buf.value_f.size()]) = f;
  }
  decode_alibi(in, p, buf);  // from the bytes left (problem-decoding.h)
  decode_dropout(in, p);     // and then dropout
  // Padding: NaN.
  fill_padding(buf.query, B, Hq, Lq, E, q, kNaN);
  if (half) {
    const uint16_t nan = bf16 ? 0x7FC0 : 0x7E00;
    fill_padding<uint16_t>(buf.key_h, B, Hkv, Lk, E, k, nan);
    fill_padding<uint16_t>(buf.value_h, B, Hkv, Lk, Ev, v, nan);
  } else {
    fill_padding(buf.key_f, B, Hkv, Lk, E, k, kNaN);
    fill_padding(buf.value_f, B, Hkv, Lk, Ev, v, kNaN);
  }
  // K/V rows no query row attends get NaN/Inf (they must not leak), and in one mode so do
  // the rows that some query rows attend and others do not (a causal diagonal, a mask): the
  // rows that attend them get NaN, the others must not. With kFloat16Finite, the rows some
  // query row attends must hold no Inf/NaN pattern (the caller's promise). With zero strides
  // one K/V row may be both: the attended use wins, unless it is poisoned on purpose.
  {
    const float poison_f[] = {kNaN, kInf, -kInf, FLT_MAX};
    const uint16_t poison_h[] = {0x7E00, 0x7C00, 0xFC00, 0x7C01};
    const uint16_t poison_bf16[] = {0x7FC0, 0x7F80, 0xFF80, 0x7F81};
    const bool poison = poison_choice >= 64;
    // (Not with kFloat16Finite: an attended row must not hold Inf/NaN halves there.)
    const bool poison_partly_attended =
        poison && (poison_choice & 0x10) != 0 && p.kv_type != KvType::kFloat16Finite;
    std::vector<bool> attended_k(k.size, false), attended_v(v.size, false);
    mark_attended(p, k, v, poison_partly_attended, attended_k, attended_v);
    if (half) {
      const uint16_t pv = (bf16 ? poison_bf16 : poison_h)[poison_choice % 4];
      const bool finite = p.kv_type == KvType::kFloat16Finite;
      treat(buf.key_h, attended_k, poison, pv, finite), treat(buf.value_h, attended_v, poison, pv, finite);
    } else {
      const float pv = poison_f[poison_choice % 4];
      treat(buf.key_f, attended_k, poison, pv, false), treat(buf.value_f, attended_v, poison, pv, false);
    }
  }

  buf.output.assign(o.size, sentinel());
  p.output = buf.output.data();
  if (want_weights) {
    buf.weights.assign(static_cast<size_t>(B) * Hq * Lq * Lk, sentinel());
    p.weights = buf.weights.data();
  }
  if (extra_checks & 8) {  // each row's log-sum-exp (what the backward pass reads)
    buf.logsumexp.assign(static_cast<size_t>(B) * Hq * Lq, sentinel());
    p.logsumexp = buf.logsumexp.data();
  }

  if (invalid >= 216 && invalid < 224) {  // one input in 32: sizes at the limits, planning only
    probe_largest_sizes(p, invalid);
    return;
  }
  if (invalid >= 224) {  // one input in eight: a broken problem
    std::vector<float> scratch_buffer(static_cast<size_t>(sdpa::scratch_floats(p, 1)) + 1);
    float* scratch = scratch_buffer.data();
    uint64_t scratch_size = sdpa::scratch_floats(p, 1);
    Problem bad = p;
    const Status expected = corrupt(in, bad, buf, scratch_size, scratch);
    const Status status = sdpa::forward(bad, scratch, scratch_size, nullptr);
    FUZZ_CHECK(bad, status == expected, "forward() on a broken problem returned %s, not %s", sdpa::status_name(status),
               sdpa::status_name(expected));
    if (expected != Status::kBadScratch) {
      const Status v = sdpa::validate(bad);
      FUZZ_CHECK(bad, v == expected, "validate() returned %s, not %s", sdpa::status_name(v), sdpa::status_name(expected));
      const Status seg = sdpa::forward_segment(bad, 0, scratch_buffer.data(), scratch_buffer.data(), 0);
      FUZZ_CHECK(bad, seg == expected, "forward_segment() on a broken problem returned %s, not %s",
                 sdpa::status_name(seg), sdpa::status_name(expected));
      const Status merge = sdpa::merge_segments(bad, scratch_buffer.data());
      FUZZ_CHECK(bad, merge == expected, "merge_segments() on a broken problem returned %s, not %s",
                 sdpa::status_name(merge), sdpa::status_name(expected));
    }
    for (float f : buf.output) FUZZ_CHECK(bad, is_sentinel(f), "a broken problem wrote its output");
    for (float f : buf.weights) FUZZ_CHECK(bad, is_sentinel(f), "a broken problem wrote its weights");
    for (float f : buf.logsumexp) FUZZ_CHECK(bad, is_sentinel(f), "a broken problem wrote its logsumexp");
    return;
  }

  FUZZ_CHECK(p, sdpa::validate(p) == Status::kOk, "the fuzzer made an invalid problem: %s",
             sdpa::status_name(sdpa::validate(p)));
  Result r = run_forward(p, buf, threads, misalign);
  buf.output = r.output, buf.weights = r.weights, buf.logsumexp = r.logsumexp;
  p.output = buf.output.data();
  if (p.weights != nullptr) p.weights = buf.weights.data();
  if (p.logsumexp != nullptr) p.logsumexp = buf.logsumexp.data();
  check_result(p, buf.output, p.weights != nullptr ? &buf.weights : nullptr,
               p.logsumexp != nullptr ? &buf.logsumexp : nullptr);

  // Bitwise promises.
  if (extra_checks & 1) {  // any thread count
    const Result other = run_forward(p, buf, threads == 2 ? 0 : 2, 0);
    check_same(p, other.output, buf.output, "2 threads against 1");
    check_same(p, other.weights, buf.weights, "weights, 2 threads against 1");
    check_same(p, other.logsumexp, buf.logsumexp, "logsumexp, 2 threads against 1");
  }
  if ((extra_checks & 2) && p.kv_type == KvType::kFloat16Finite) {
    Problem general = p;
    general.kv_type = KvType::kFloat16;
    const Result other = run_forward(general, buf, threads, 0);
    check_same(p, other.output, buf.output, "kFloat16 against kFloat16Finite");
    check_same(p, other.weights, buf.weights, "weights, kFloat16 against kFloat16Finite");
    check_same(p, other.logsumexp, buf.logsumexp, "logsumexp, kFloat16 against kFloat16Finite");
  }
  if ((extra_checks & 16) && p.weights != nullptr) {  // weights or not: the same output bits
    Problem without_weights = p;
    without_weights.weights = nullptr;
    const Result other = run_forward(without_weights, buf, threads, 0);
    check_same(p, other.output, buf.output, "output without weights against with");
    check_same(p, other.logsumexp, buf.logsumexp, "logsumexp without weights against with");
  }
  // What the streamed calls take (sdpa.h): one (batch, KV head) on the decode path, not float16
  // read in order.
  const bool one_pair_decode = p.batch == 1 && p.kv_heads == 1 && sdpa::reads_keys_in_place(p) &&
                               !(sdpa::is_16_bit(p.kv_type) && p.read_kv_in_order);
  if (one_pair_decode) {
    // The streamed calls write no weights; forward()'s output has the same bits either way.
    Problem streamed = p;
    streamed.weights = nullptr;
    check_segments(streamed, buf, buf.output);
  }
  if (extra_checks & 32) check_packed(in, p, pool(2));
  if ((extra_checks & 4) && (!one_pair_decode || p.weights != nullptr)) {
    // Not a single (batch, KV head) decode without weights (or float16 read in order): the
    // split-K calls refuse it.
    std::vector<float> partials(16), scratch(16);
    const Status seg = sdpa::forward_segment(p, 0, partials.data(), scratch.data(), scratch.size());
    FUZZ_CHECK(p, seg == Status::kBadSegment, "forward_segment() took a problem it does not take: %s",
               sdpa::status_name(seg));
    FUZZ_CHECK(p, sdpa::merge_segments(p, partials.data()) == Status::kBadSegment, "merge_segments() took it");
  }
}

}  // namespace
}  // namespace sdpa_fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sdpa_fuzz::run(data, size);
  return 0;
}
