// Fuzz target: a KV cache (src/kv-cache.h) driven through a sequence of operations, as the
// TypeScript KVCache (js/kv-cache.ts) drives it:
//   append    n positions of K [B, Hkv, n, E] and V [B, Hkv, n, Ev] (or laid out [B, n, H, D]),
//             float32 or 16-bit source data (float16, or for a bfloat16 cache bfloat16 or
//             float16), copied into the storage after the `length` stored positions with
//             copy_rows(); a float16 cache narrows float32 values, rounding to nearest even and
//             saturating beyond ±65504 (Inf too), NaN kept; a bfloat16 cache rounds float32 and
//             float16 values to nearest even, saturating finite values past the largest
//             bfloat16, Inf and NaN kept;
//   truncate  to n <= length positions (the storage keeps the old rows: stale data that
//             attention must not read);
//   attend    a query [B, Hq, Lq, E] (Hq = Hkv·group) to the stored positions, read in place:
//             kv_len = length, K/V strides of the storage layout, causal with offset
//             length - Lq by default (the last Lq positions are the query's own), the cache's
//             kv_type: for float16 kFloat16Finite when no Inf/NaN half may be stored (as the
//             TypeScript layer decides), read_kv_in_order; sometimes weights, logsumexp, key_lengths (and key_starts), a sliding window,
//             sinks; in one attend of two ALiBi and dropout (from bytes derived from the
//             query's seed, not read from the input, so that the corpus keeps its meaning);
//   a broken copy (negative size, zero dim, null pointer, unknown type, negative stride),
//             which must return its Status and write nothing.
// After every operation the whole storage is compared with a model of what it should hold,
// element by element (the conversions written independently here, with the compiler's
// _Float16 and __bf16), so a stray write anywhere is found; every attention result is checked against
// the double reference by tests/fuzz/attention-check.h, and the kFloat16Finite result
// against kFloat16's, bitwise. The storage is allocated at its exact size and starts out as
// NaN ("never written"), so reads past `length` or past the storage show up.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attention-check.h"
#include "fuzz-values.h"
#include "kv-cache.h"
#include "problem-decoding.h"
#include "parallel/thread-pool.h"
#include "sdpa.h"
#include "tiles.h"

namespace sdpa_fuzz {
namespace {

using sdpa::KvType;
using sdpa::RowBlock;
using sdpa::Status;

constexpr uint16_t kHalfMaxFinite = 0x7BFF;  // 65504

// float32 -> float16 as src/kv-cache.h specifies it, from the compiler's IEEE conversion
// (round to nearest even) plus the saturation: |f| >= 65520 (and Inf) becomes ±65504, the
// values the IEEE conversion would round to infinity.
FUZZ_NO_COVERAGE uint16_t narrow(float f) {
  if (std::isnan(f)) return std::signbit(f) ? 0xFE00 : 0x7E00;  // compared as "a NaN of this sign"
  if (std::fabs(f) >= 65520.0f) return static_cast<uint16_t>((std::signbit(f) ? 0x8000 : 0) | kHalfMaxFinite);
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

FUZZ_NO_COVERAGE float widen(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, sizeof h);
  return static_cast<float>(h);
}

// One element of the storage against the model: bitwise, except that a NaN model element
// matches any NaN of the same sign (payload bits are not specified).
FUZZ_NO_COVERAGE bool matches(uint16_t got, uint16_t want) {
  if ((want & 0x7C00) == 0x7C00 && (want & 0x3FF) != 0) {
    return (got & 0x7C00) == 0x7C00 && (got & 0x3FF) != 0 && (got & 0x8000) == (want & 0x8000);
  }
  return got == want;
}
FUZZ_NO_COVERAGE bool matches_bf16(uint16_t got, uint16_t want) {
  if (bf16_is_nan(want)) return bf16_is_nan(got) && (got & 0x8000) == (want & 0x8000);
  return got == want;
}
FUZZ_NO_COVERAGE bool matches(float got, float want) {
  if (std::isnan(want)) return std::isnan(got) && std::signbit(got) == std::signbit(want);
  return float_bits(got) == float_bits(want);
}

sdpa::ThreadPool* two_threads() {
  static sdpa::ThreadPool pool(2);
  return &pool;
}

// The cache: storage as src/kv-cache.h lays it out, and the model of its contents.
template <typename T>
struct Storage {
  std::vector<T> keys, values, model_keys, model_values;
};

struct Cache {
  int32_t B = 1, Hkv = 1, max_len = 1, E = 1, Ev = 1;
  KvType type = KvType::kFloat32;
  Storage<float> f32;
  Storage<uint16_t> f16;
  int32_t length = 0;
  bool maybe_inf_nan = false;  // some stored half may be Inf/NaN (then kFloat16, not kFloat16Finite)

  // 16-bit storage (f16 holds it): float16 or bfloat16.
  bool sixteen_bit() const { return sdpa::is_16_bit(type); }
  bool bfloat16() const { return type == KvType::kBFloat16; }
  int64_t stride_b(int32_t dim) const { return static_cast<int64_t>(Hkv) * max_len * dim; }
  int64_t stride_h(int32_t dim) const { return static_cast<int64_t>(max_len) * dim; }
  void* key_data() { return sixteen_bit() ? static_cast<void*>(f16.keys.data()) : f32.keys.data(); }
  void* value_data() { return sixteen_bit() ? static_cast<void*>(f16.values.data()) : f32.values.data(); }
  // The destination of an append at position `at`.
  RowBlock destination(bool keys, int64_t at) {
    const int32_t dim = keys ? E : Ev;
    RowBlock r;
    r.type = type;
    r.stride_b = stride_b(dim), r.stride_h = stride_h(dim), r.stride_l = dim;
    const size_t bytes = sixteen_bit() ? 2 : 4;
    r.data = static_cast<char*>(keys ? key_data() : value_data()) + static_cast<size_t>(at * dim) * bytes;
    return r;
  }
};

[[noreturn]] void fail_cache(const Cache& c, const char* what, size_t at) {
  std::fprintf(stderr, "\n==== fuzz check failed: %s (element %zu) in a cache B%d Hkv%d max_len%d E%d Ev%d type %d length %d\n",
               what, at, c.B, c.Hkv, c.max_len, c.E, c.Ev, static_cast<int>(c.type), c.length);
  std::abort();
}

template <typename T>
FUZZ_NO_COVERAGE void compare_storage(const Cache& c, const std::vector<T>& got, const std::vector<T>& want,
                                      const char* which, const char* after) {
  for (size_t n = 0; n < got.size(); n++) {
    bool same;
    if constexpr (std::is_same_v<T, uint16_t>) {
      same = c.bfloat16() ? matches_bf16(got[n], want[n]) : matches(got[n], want[n]);
    } else {
      same = matches(got[n], want[n]);
    }
    if (!same) {
      char what[128];
      std::snprintf(what, sizeof what, "%s storage differs from its model after %s", which, after);
      fail_cache(c, what, n);
    }
  }
}

void check_storage(const Cache& c, const char* after) {
  if (c.sixteen_bit()) {
    compare_storage(c, c.f16.keys, c.f16.model_keys, "key", after);
    compare_storage(c, c.f16.values, c.f16.model_values, "value", after);
  } else {
    compare_storage(c, c.f32.keys, c.f32.model_keys, "key", after);
    compare_storage(c, c.f32.values, c.f32.model_values, "value", after);
  }
}

// What an append of n rows from `src` (source_f or source_h) must store at the end of the
// cache; and whether it stored an Inf/NaN half.
FUZZ_NO_COVERAGE void model_append(Cache& c, bool keys, const RowBlock& src, int32_t n, int32_t dim,
                                   const std::vector<float>& source_f, const std::vector<uint16_t>& source_h) {
  const bool source_half = sdpa::is_16_bit(src.type);
  for (int64_t b = 0; b < c.B; b++)
    for (int64_t h = 0; h < c.Hkv; h++)
      for (int64_t l = 0; l < n; l++)
        for (int64_t d = 0; d < dim; d++) {
          const size_t from = static_cast<size_t>(b * src.stride_b + h * src.stride_h + l * src.stride_l + d);
          const size_t to = static_cast<size_t>(b * c.stride_b(dim) + h * c.stride_h(dim) + (c.length + l) * dim + d);
          if (c.bfloat16()) {
            // Raw bfloat16 stored as it is; IEEE halves (a Float16Array) rounded from their value.
            const uint16_t stored = !source_half ? narrow_bf16(source_f[from])
                                    : src.type == KvType::kBFloat16 ? source_h[from]
                                                                    : narrow_bf16(widen(source_h[from]));
            (keys ? c.f16.model_keys : c.f16.model_values)[to] = stored;
          } else if (c.sixteen_bit()) {
            const uint16_t stored = source_half ? source_h[from] : narrow(source_f[from]);
            (keys ? c.f16.model_keys : c.f16.model_values)[to] = stored;
            if (half_is_inf_or_nan(stored)) c.maybe_inf_nan = true;
          } else {
            (keys ? c.f32.model_keys : c.f32.model_values)[to] = source_half ? widen(source_h[from]) : source_f[from];
          }
        }
}

FUZZ_NO_COVERAGE void draw_source(Rng& rng, const ValueStyle& style, bool bfloat16, std::vector<float>& f,
                                  std::vector<uint16_t>& h) {
  for (float& x : f) x = draw_float(rng, style);
  for (uint16_t& x : h) x = bfloat16 ? draw_bf16(rng, style) : draw_half(rng, style);
}

// Appends n positions of K and V from freshly drawn source data.
void append(FuzzedDataProvider& in, Cache& c) {
  const int32_t n = in.ConsumeIntegralInRange<int32_t>(0, c.max_len - c.length);
  const bool source_half = in.ConsumeBool();
  const bool bshd = in.ConsumeBool();
  const ValueStyle style = ValueStyle::from(in);
  Rng rng{style.seed};
  for (int which = 0; which < 2; which++) {
    const bool keys = which == 0;
    const int32_t dim = keys ? c.E : c.Ev;
    // Source [B, H, n, D] or [B, n, H, D], dense.
    RowBlock src;
    // 16-bit data is of the cache's own format (as the TypeScript layer passes a Uint16Array);
    // into a float32 cache, halves (a Float16Array's); into a bfloat16 cache, halves for half of
    // the seeds (the style's, so the committed corpus keeps its meaning): they convert.
    const bool halves_into_bf16 = source_half && c.bfloat16() && (style.seed & 2) != 0;
    src.type = !source_half ? KvType::kFloat32 : c.bfloat16() && !halves_into_bf16 ? KvType::kBFloat16 : KvType::kFloat16;
    if (bshd) {
      src.stride_h = dim, src.stride_l = static_cast<int64_t>(c.Hkv) * dim;
    } else {
      src.stride_l = dim, src.stride_h = static_cast<int64_t>(n) * dim;
    }
    src.stride_b = static_cast<int64_t>(c.Hkv) * n * dim;
    const size_t count = static_cast<size_t>(c.B) * c.Hkv * n * dim;
    std::vector<float> source_f(source_half ? 0 : count);
    std::vector<uint16_t> source_h(source_half ? count : 0);
    draw_source(rng, style, src.type == KvType::kBFloat16, source_f, source_h);
    // copy_rows needs a non-null source even for zero rows: one element past nothing.
    float dummy_f = 0.0f;
    src.data = source_half ? static_cast<void*>(count ? source_h.data() : nullptr)
                           : static_cast<void*>(count ? source_f.data() : nullptr);
    if (src.data == nullptr) src.data = &dummy_f;
    const Status status = sdpa::copy_rows(c.destination(keys, c.length), src, c.B, c.Hkv, n, dim);
    if (status != Status::kOk) fail_cache(c, sdpa::status_name(status), 0);

    model_append(c, keys, src, n, dim, source_f, source_h);
  }
  c.length += n;
  check_storage(c, "append");
}

// A copy_rows call with one thing wrong: its Status, and the storage untouched.
void broken_copy(FuzzedDataProvider& in, Cache& c) {
  float source[8] = {};
  RowBlock src;
  src.data = source, src.type = KvType::kFloat32, src.stride_b = 8, src.stride_h = 8, src.stride_l = 4;
  RowBlock dst = c.destination(true, 0);
  int32_t batch = 1, heads = 1, rows = 1, dim = std::min(c.E, 4);
  Status expected;
  switch (in.ConsumeIntegral<uint8_t>() % 8) {
    case 0: rows = -1, expected = Status::kBadShape; break;
    case 1: dim = 0, expected = Status::kBadShape; break;
    case 2: batch = -3, expected = Status::kBadShape; break;
    case 3: dst.data = nullptr, expected = Status::kNullPointer; break;
    case 4: src.data = nullptr, expected = Status::kNullPointer; break;
    case 5: dst.type = static_cast<KvType>(7), expected = Status::kBadKvType; break;
    case 6: src.stride_l = -4, expected = Status::kBadStride; break;
    default: dst.stride_h = -1, expected = Status::kBadStride; break;
  }
  const Status status = sdpa::copy_rows(dst, src, batch, heads, rows, dim);
  if (status != expected) fail_cache(c, "a broken copy_rows() call did not return its Status", 0);
  check_storage(c, "a broken copy");
}

void attend(FuzzedDataProvider& in, Cache& c) {
  int32_t group = in.ConsumeIntegralInRange<int32_t>(1, 2 * sdpa::kQueryTile + 1);
  int32_t Lq = in.ConsumeIntegralInRange<int32_t>(1, sdpa::kQueryTile + 2);
  if (in.ConsumeIntegral<uint8_t>() >= 240) Lq = std::max(1, c.length);  // a prefill of everything stored
  // A work budget that keeps an execution in the milliseconds (the reference is O(Lq·Lk)).
  auto work = [&] { return static_cast<double>(c.B) * c.Hkv * group * Lq * std::max(1, c.length) * (c.E + c.Ev); };
  while (work() > 3e5) {
    if (group > 1) group--;
    else Lq = (Lq + 1) / 2;
    if (Lq == 1 && group == 1) break;
  }
  const int32_t Hq = c.Hkv * group;
  const Layout q = make_layout(c.B, Hq, Lq, c.E, in.ConsumeIntegral<uint8_t>() & 1, false);
  const Layout o = make_layout(c.B, Hq, Lq, c.Ev, in.ConsumeIntegral<uint8_t>() & 1, false);
  std::vector<float> query(q.size), output(o.size, sentinel()), weights;
  const ValueStyle query_style = ValueStyle::from(in);
  {
    Rng rng{query_style.seed};
    for (float& f : query) f = draw_float(rng, query_style);
  }

  Problem p;
  p.batch = c.B, p.q_heads = Hq, p.kv_heads = c.Hkv, p.q_len = Lq, p.kv_len = c.length;
  p.head_dim = c.E, p.value_dim = c.Ev;
  p.query = query.data(), p.q_stride_b = q.b, p.q_stride_h = q.h, p.q_stride_l = q.l;
  p.output = output.data(), p.o_stride_b = o.b, p.o_stride_h = o.h, p.o_stride_l = o.l;
  p.kv_type = !c.sixteen_bit() || c.bfloat16() ? c.type : c.maybe_inf_nan ? KvType::kFloat16 : KvType::kFloat16Finite;
  p.key = c.key_data(), p.k_stride_b = c.stride_b(c.E), p.k_stride_h = c.stride_h(c.E), p.k_stride_l = c.E;
  p.value = c.value_data(), p.v_stride_b = c.stride_b(c.Ev), p.v_stride_h = c.stride_h(c.Ev), p.v_stride_l = c.Ev;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.E));
  p.causal = true;
  p.causal_offset = c.length - Lq;
  const uint8_t options = in.ConsumeIntegral<uint8_t>();
  if (options & 1) p.causal = false;
  if (options & 2) p.causal_offset = in.ConsumeIntegralInRange<int32_t>(-Lq - 1, c.length + 1);
  if ((options & 128) && p.causal) p.sliding_window = pick_window(in, c.length);
  std::vector<int32_t> key_lengths;
  std::vector<int32_t> key_starts;
  if (options & 4) {
    for (int32_t b = 0; b < c.B; b++) key_lengths.push_back(in.ConsumeIntegralInRange<int32_t>(0, std::max(0, c.length)));
    p.key_lengths = key_lengths.data();
    if (in.ConsumeBool()) {  // and left padding
      for (int32_t b = 0; b < c.B; b++) key_starts.push_back(in.ConsumeIntegralInRange<int32_t>(0, std::max(0, c.length)));
      p.key_starts = key_starts.data();
    }
  }
  OptionBuffers option_buffers;  // gpt-oss's sinks, drawn as the sdpa target draws them
  decode_sinks(in, p, option_buffers);
  {
    // ALiBi and dropout in one attend of two, drawn as the sdpa target draws them
    // (decode_alibi, decode_dropout), from bytes derived from the query's value seed rather
    // than read from the input: these options came later, and reading more input here would
    // make the committed corpus decode to other operations.
    Rng rng{query_style.seed ^ 0xA11B1D20ull};
    if (rng.below(2) == 0) {
      uint8_t bytes[32];
      for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(rng.next());
      FuzzedDataProvider derived(bytes, sizeof bytes);
      decode_alibi(derived, p, option_buffers);
      decode_dropout(derived, p);
    }
  }
  if (options & 8) {
    weights.assign(static_cast<size_t>(c.B) * Hq * Lq * std::max(c.length, 0), sentinel());
    p.weights = weights.data();
  }
  std::vector<float> logsumexp;
  if (options & 64) {
    logsumexp.assign(static_cast<size_t>(c.B) * Hq * Lq, sentinel());
    p.logsumexp = logsumexp.data();
  }
  p.read_kv_in_order = (options & 16) == 0;
  sdpa::ThreadPool* pool = (options & 32) ? two_threads() : nullptr;

  const uint64_t need = sdpa::scratch_floats(p, pool != nullptr ? pool->threads() : 1);
  std::vector<float> scratch(static_cast<size_t>(need));
  const Status status = sdpa::forward(p, scratch.data(), need, pool);
  if (c.length == 0) {  // the TypeScript layer answers zeros itself; the kernel refuses Lk = 0
    FUZZ_CHECK(p, status == Status::kBadShape, "forward() with nothing stored returned %s", sdpa::status_name(status));
    for (float f : output) FUZZ_CHECK(p, is_sentinel(f), "forward() with nothing stored wrote its output");
    return;
  }
  FUZZ_CHECK(p, status == Status::kOk, "forward() on a cache returned %s", sdpa::status_name(status));
  check_result(p, output, p.weights != nullptr ? &weights : nullptr, p.logsumexp != nullptr ? &logsumexp : nullptr);
  check_storage(c, "attend");  // inputs are never written

  if (p.kv_type == KvType::kFloat16Finite) {  // the same bits as the general half path
    std::vector<float> general_output(o.size, sentinel());
    Problem general = p;
    general.kv_type = KvType::kFloat16;
    general.output = general_output.data();
    std::vector<float> general_weights(weights.size(), sentinel()), general_lse(logsumexp.size(), sentinel());
    if (p.weights != nullptr) general.weights = general_weights.data();
    if (p.logsumexp != nullptr) general.logsumexp = general_lse.data();
    FUZZ_CHECK(p, sdpa::forward(general, scratch.data(), need, pool) == Status::kOk, "kFloat16 forward() failed");
    for (size_t n = 0; n < output.size(); n++) {
      FUZZ_CHECK(p, same_float(output[n], general_output[n]), "kFloat16Finite differs from kFloat16 at %zu: %a vs %a", n,
                 output[n], general_output[n]);
    }
    for (size_t n = 0; n < weights.size(); n++) {
      FUZZ_CHECK(p, same_float(weights[n], general_weights[n]), "weights: kFloat16Finite differs from kFloat16 at %zu", n);
    }
    for (size_t n = 0; n < logsumexp.size(); n++) {
      FUZZ_CHECK(p, same_float(logsumexp[n], general_lse[n]), "logsumexp: kFloat16Finite differs from kFloat16 at %zu", n);
    }
  }
}

void run(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Cache c;
  c.B = in.ConsumeIntegralInRange<int32_t>(1, 2);
  c.Hkv = in.ConsumeIntegralInRange<int32_t>(1, 2);
  {
    const int32_t lengths[] = {1, 2, sdpa::kKeyGroup + 1, sdpa::kKeyTile - 1, sdpa::kKeyTile + 1, 2 * sdpa::kKeyTile + 3};
    c.max_len = lengths[in.ConsumeIntegral<uint8_t>() % (sizeof lengths / sizeof lengths[0])];
    const int32_t dims[] = {1, 3, 4, 5, sdpa::kValueBlock, sdpa::kValueBlock + 1, 4 * sdpa::kValueBlock + 1};
    c.E = dims[in.ConsumeIntegral<uint8_t>() % (sizeof dims / sizeof dims[0])];
    c.Ev = dims[in.ConsumeIntegral<uint8_t>() % (sizeof dims / sizeof dims[0])];
  }
  c.type = in.ConsumeBool() ? KvType::kFloat16 : KvType::kFloat32;
  // Which 16-bit format: from the sizes drawn above rather than from another input byte (which
  // would make the committed corpus decode to other operations), so half of the size
  // combinations are bfloat16 caches.
  if (c.sixteen_bit() && (c.B + 3 * c.Hkv + 5 * c.max_len + 7 * c.E + 11 * c.Ev) % 2 == 1) c.type = KvType::kBFloat16;
  const size_t key_elements = static_cast<size_t>(c.B) * c.Hkv * c.max_len * c.E;
  const size_t value_elements = static_cast<size_t>(c.B) * c.Hkv * c.max_len * c.Ev;
  if (c.sixteen_bit()) {  // never written: NaN (one with a payload)
    const uint16_t never = c.bfloat16() ? 0x7F81 : 0x7C01;
    c.f16.keys.assign(key_elements, never), c.f16.values.assign(value_elements, never);
    c.f16.model_keys = c.f16.keys, c.f16.model_values = c.f16.values;
  } else {
    c.f32.keys.assign(key_elements, kNaN), c.f32.values.assign(value_elements, kNaN);
    c.f32.model_keys = c.f32.keys, c.f32.model_values = c.f32.values;
  }

  for (int op = 0; op < 12 && in.remaining_bytes() > 0; op++) {
    switch (in.ConsumeIntegral<uint8_t>() % 8) {
      case 0: case 1: case 2: append(in, c); break;
      case 3:
        c.length = in.ConsumeIntegralInRange<int32_t>(0, c.length);
        if (c.length == 0) c.maybe_inf_nan = false;  // as KVCache.truncate(0) does
        break;
      case 4: broken_copy(in, c); break;
      default: attend(in, c); break;
    }
  }
}

}  // namespace
}  // namespace sdpa_fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sdpa_fuzz::run(data, size);
  return 0;
}
