// Problem decoding shared by the fuzz targets that decode an attention Problem (sdpa-fuzz.cc,
// backward-fuzz.cc): shapes within a work budget, lengths and head dims around the tile edges
// of src/tiles.h, the options (scale, softcap, masks, causal offsets, sliding windows, key lengths), tensor
// fills and NaN padding, the poisoning of K/V rows no query row attends, and the invalid
// problems (one field broken) both passes must refuse with the same Status. The bytes are
// consumed in the order sdpa-fuzz.cc always consumed them, so its committed seed corpus
// decodes to the same problems (ALiBi, decode_alibi, and then dropout, decode_dropout, are drawn
// from the bytes left after the values, so that the seeds keep their shapes, options and values;
// what is drawn after them, the field an invalid input breaks and the packing, moves; inputs that
// leave no bytes have neither ALiBi nor dropout).
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention-check.h"
#include "fuzz-values.h"
#include "sdpa.h"
#include "tiles.h"

namespace sdpa_fuzz {

using sdpa::kKeyGroup;
using sdpa::kKeyTile;
using sdpa::kQueryTile;
using sdpa::kValueBlock;
using sdpa::Status;

// What the options of a Problem point to, owned.
struct OptionBuffers {
  std::vector<float> mask_f;
  std::vector<uint8_t> mask_b;
  std::vector<int32_t> offsets, key_lengths, key_starts;
  std::vector<float> sinks;
  std::vector<float> alibi_slopes;
};

// Lengths around the edges of the row tile, the key group and the key tile.
inline int32_t pick_length(FuzzedDataProvider& in) {
  const int32_t lengths[] = {1, 2, 3,
                             kQueryTile - 1, kQueryTile, kQueryTile + 1,
                             2 * kQueryTile - 1, 2 * kQueryTile + 1,
                             kKeyGroup - 1, kKeyGroup, kKeyGroup + 1, 2 * kKeyGroup + 1,
                             kKeyTile - 1, kKeyTile, kKeyTile + 1, 2 * kKeyTile + 1};
  const uint8_t choice = in.ConsumeIntegral<uint8_t>();
  if (choice < 64) return 1 + choice % 20;  // small, any
  return lengths[choice % (sizeof lengths / sizeof lengths[0])];
}

// Head dims around the P·V block widths (kValueBlock, 4-wide vectors, 8 vectors of one row).
inline int32_t pick_dim(FuzzedDataProvider& in) {
  const int32_t dims[] = {1, 2, 3, 4, 5, 7, kValueBlock - 1, kValueBlock, kValueBlock + 1, 2 * kValueBlock + 3,
                          4 * kValueBlock - 1, 4 * kValueBlock, 4 * kValueBlock + 5, 64};
  return dims[in.ConsumeIntegral<uint8_t>() % (sizeof dims / sizeof dims[0])];
}

// The shapes of p: B, Hkv, Hq = Hkv·group, Lq, Lk (from pick_key_length(in)), E, Ev, then
// shrunk (batch, KV heads, group, query rows, head dims, keys, in that order) until the work
// B·Hkv·group·Lq·Lk·(E + Ev) is within `budget`, or `big_budget` for one input in 256 (enough
// work to wake a second thread).
template <typename PickKeyLength>
inline void decode_shapes(FuzzedDataProvider& in, PickKeyLength pick_key_length, double budget, double big_budget,
                          Problem& p) {
  int32_t B = in.ConsumeIntegralInRange<int32_t>(1, 3);
  int32_t Hkv = in.ConsumeIntegralInRange<int32_t>(1, 3);
  int32_t group = in.ConsumeIntegralInRange<int32_t>(1, 2 * kQueryTile + 1);
  int32_t Lq = pick_length(in);
  int32_t Lk = pick_key_length(in);
  int32_t E = pick_dim(in), Ev = pick_dim(in);
  const bool big = in.ConsumeIntegral<uint8_t>() == 0xB1;
  auto work = [&] { return static_cast<double>(B) * Hkv * group * Lq * Lk * (E + Ev); };
  while (work() > (big ? big_budget : budget)) {
    if (B > 1) B--;
    else if (Hkv > 1) Hkv--;
    else if (group > 1) group--;
    else if (Lq > 1) Lq = (Lq + 1) / 2;
    else if (E + Ev > 16) E = (E + 1) / 2, Ev = (Ev + 1) / 2;
    else Lk = (Lk + 1) / 2;
  }
  p.batch = B, p.kv_heads = Hkv, p.q_heads = Hkv * group, p.q_len = Lq, p.kv_len = Lk;
  p.head_dim = E, p.value_dim = Ev;
}

// The layouts of Q [B, Hq, Lq, E], K [B, Hkv, Lk, E], V [B, Hkv, Lk, Ev] and O [B, Hq, Lq, Ev]
// (p's shapes already set), one input byte each in that order (make_layout: zero strides on
// the inputs only), and p's strides set from them.
struct ForwardLayouts {
  Layout q, k, v, o;
};
inline ForwardLayouts decode_layouts(FuzzedDataProvider& in, Problem& p) {
  const int32_t B = p.batch, Hq = p.q_heads, Hkv = p.kv_heads, Lq = p.q_len, Lk = p.kv_len;
  const int32_t E = p.head_dim, Ev = p.value_dim;
  ForwardLayouts t;
  t.q = make_layout(B, Hq, Lq, E, in.ConsumeIntegral<uint8_t>(), true);
  t.k = make_layout(B, Hkv, Lk, E, in.ConsumeIntegral<uint8_t>(), true);
  t.v = make_layout(B, Hkv, Lk, Ev, in.ConsumeIntegral<uint8_t>(), true);
  t.o = make_layout(B, Hq, Lq, Ev, in.ConsumeIntegral<uint8_t>(), false);
  p.q_stride_b = t.q.b, p.q_stride_h = t.q.h, p.q_stride_l = t.q.l;
  p.k_stride_b = t.k.b, p.k_stride_h = t.k.h, p.k_stride_l = t.k.l;
  p.v_stride_b = t.v.b, p.v_stride_h = t.v.h, p.v_stride_l = t.v.l;
  p.o_stride_b = t.o.b, p.o_stride_h = t.o.h, p.o_stride_l = t.o.l;
  return t;
}

FUZZ_NO_COVERAGE inline void fill(std::vector<float>& x, const ValueStyle& s) {
  Rng rng{s.seed};
  for (float& f : x) f = draw_float(rng, s);
}
FUZZ_NO_COVERAGE inline void fill(std::vector<uint16_t>& x, const ValueStyle& s, bool bfloat16 = false) {
  Rng rng{s.seed};
  for (uint16_t& h : x) h = bfloat16 ? draw_bf16(rng, s) : draw_half(rng, s);
}

// Sets the padding of a [B, H, L, D] tensor (elements no index reaches) to `pad`.
template <typename T>
FUZZ_NO_COVERAGE inline void fill_padding(std::vector<T>& x, int64_t B, int64_t H, int64_t L, int64_t D, const Layout& t, T pad) {
  std::vector<bool> used(x.size(), false);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t l = 0; l < L; l++)
        for (int64_t d = 0; d < D; d++) used[static_cast<size_t>(b * t.b + h * t.h + l * t.l + d)] = true;
  for (size_t n = 0; n < x.size(); n++) {
    if (!used[n]) x[n] = pad;
  }
}

inline int32_t pick_offset(FuzzedDataProvider& in, int32_t Lq, int32_t Lk) {
  switch (in.ConsumeIntegral<uint8_t>() % 10) {
    case 0: return Lk - Lq;  // the query rows are the last Lq keys (decoding, a KV cache)
    case 1: return 0;
    case 2: return -1;
    case 3: return -Lq;  // the last row sees nothing... (j > i - Lq for every j >= 0)
    case 4: return -Lq - 1;
    case 5: return Lk;  // past the end: nothing blocked
    case 6: return INT32_MIN;
    case 7: return INT32_MAX;
    default: return in.ConsumeIntegralInRange<int32_t>(-Lq - 2, Lk + 2);
  }
}

// A sliding window for a causal problem: none in most, else 1 key, either side of a forward or
// backward key tile, a share of Lk, or wider than any offset reaches.
inline int32_t pick_window(FuzzedDataProvider& in, int32_t Lk) {
  const uint8_t choice = in.ConsumeIntegral<uint8_t>();
  if (choice < 128) return 0;
  switch (choice % 9) {
    case 0: return 1;
    case 1: return 2;
    case 2: return sdpa::kKeyTile - 1;
    case 3: return sdpa::kKeyTile + 1;
    case 4: return sdpa::kBackwardKeyTile;
    case 5: return sdpa::kBackwardKeyTile + 1;
    case 6: return INT32_MAX;
    case 7: return Lk / 2 + 1;
    default: return 1 + choice % (Lk + 2);
  }
}

// How many query rows of batch b, in the query heads of KV head kvh, may attend key j.
FUZZ_NO_COVERAGE inline int64_t attended_by(const Problem& p, int64_t b, int64_t kvh, int64_t j) {
  const int64_t group = p.q_heads / p.kv_heads;
  int64_t rows = 0;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; h++)
    for (int64_t i = 0; i < p.q_len; i++) rows += attendable(p, b, h, i, j);
  return rows;
}

// Marks in attended_k, attended_v (one flag per element of the K [B, Hkv, Lk, E] and
// V [B, Hkv, Lk, Ev] buffers, laid out as k and v) the elements of the key rows some query row
// attends; with `only_fully_attended`, only of the rows every query row of the KV head's group
// attends. Padding stays unmarked; with zero strides, one element marked by any row is marked.
inline void mark_attended(const Problem& p, const Layout& k, const Layout& v, bool only_fully_attended,
                          std::vector<bool>& attended_k, std::vector<bool>& attended_v) {
  const int64_t all_rows = static_cast<int64_t>(p.q_heads / p.kv_heads) * p.q_len;
  for (int64_t b = 0; b < p.batch; b++)
    for (int64_t kvh = 0; kvh < p.kv_heads; kvh++)
      for (int64_t j = 0; j < p.kv_len; j++) {
        const int64_t rows = attended_by(p, b, kvh, j);
        if (rows == 0 || (only_fully_attended && rows < all_rows)) continue;
        for (int64_t d = 0; d < p.head_dim; d++) attended_k[static_cast<size_t>(b * k.b + kvh * k.h + j * k.l + d)] = true;
        for (int64_t c = 0; c < p.value_dim; c++) attended_v[static_cast<size_t>(b * v.b + kvh * v.h + j * v.l + c)] = true;
      }
}

// Elements of rows no query row attends get `poison_value` (when `poison`); with
// `finite_halves`, attended halves holding Inf/NaN become the largest finite half.
template <typename T>
FUZZ_NO_COVERAGE inline void treat(std::vector<T>& x, const std::vector<bool>& attended, bool poison, T poison_value,
                            bool finite_halves) {
  for (size_t n = 0; n < x.size(); n++) {
    if (!attended[n]) {
      if (poison) x[n] = poison_value;
    } else if constexpr (sizeof(T) == 2) {
      if (finite_halves && half_is_inf_or_nan(x[n])) x[n] = static_cast<T>((x[n] & 0x8000) | 0x7BFF);
    }
  }
}

// The options of p (its shapes already set): scale, softcap, a float or bool mask (any
// broadcast, any axis order, padded strides), causal with one offset or one per batch and a
// sliding window or none, key_lengths (including 0), key_starts (including Lk).
inline void decode_options(FuzzedDataProvider& in, Problem& p, OptionBuffers& buf) {
  const int32_t B = p.batch, Hq = p.q_heads, Lq = p.q_len, Lk = p.kv_len, E = p.head_dim;
  {
    const float scales[] = {1.0f / std::sqrt(static_cast<float>(E)), 1.0f, 0.0f, -0.0f, -1.0f, 0.125f,
                            1e-30f, 1e30f, FLT_MAX, 0x1p-149f, -3.0f};
    const uint8_t choice = in.ConsumeIntegral<uint8_t>();
    p.scale = choice < 128 ? scales[0] : scales[choice % (sizeof scales / sizeof scales[0])];
    const float softcaps[] = {0.0f, -0.0f, 1.0f, 30.0f, 0.5f, 1e-30f, 0x1p-149f, FLT_MAX, 1e30f, 50.0f};
    const uint8_t cap = in.ConsumeIntegral<uint8_t>();
    p.softcap = cap < 160 ? 0.0f : softcaps[cap % (sizeof softcaps / sizeof softcaps[0])];
  }
  const uint8_t mask_byte = in.ConsumeIntegral<uint8_t>();
  p.mask_kind = static_cast<MaskKind>(mask_byte % 3);
  int64_t mask_dims[4] = {B, Hq, Lq, Lk};
  if (p.mask_kind != MaskKind::kNone) {
    // Axes the mask has (else stride 0: broadcast), and the order of its axes in memory.
    const uint8_t present = in.ConsumeIntegral<uint8_t>();
    const uint8_t order = in.ConsumeIntegral<uint8_t>();
    const uint8_t pad = in.ConsumeIntegral<uint8_t>();
    int axes[4] = {0, 1, 2, 3};
    for (int n = 3; n > 0; n--) std::swap(axes[n], axes[(order >> (2 * (3 - n))) % (n + 1)]);
    int64_t stride = 1;
    int64_t mask_strides[4] = {0, 0, 0, 0};
    size_t mask_size = 1;
    for (int n = 3; n >= 0; n--) {  // axes[3] innermost
      const int axis = axes[n];
      if ((present >> axis & 1) == 0 || mask_dims[axis] == 1) continue;
      mask_strides[axis] = stride;
      mask_size += static_cast<size_t>((mask_dims[axis] - 1) * stride);
      stride = stride * mask_dims[axis] + ((pad >> (2 * n)) & 3);
    }
    p.mask_stride_b = mask_strides[0], p.mask_stride_h = mask_strides[1];
    p.mask_stride_q = mask_strides[2], p.mask_stride_k = mask_strides[3];
    const ValueStyle style = ValueStyle::from(in);
    const uint32_t block_rate = in.ConsumeIntegral<uint8_t>();  // of 256: entries that block
    Rng rng{style.seed ^ 0x5EED};
    if (p.mask_kind == MaskKind::kFloat) {
      buf.mask_f.resize(mask_size);
      for (float& m : buf.mask_f) m = rng.below(256) < block_rate ? -kInf : draw_float(rng, style);
      p.mask = buf.mask_f.data();
    } else {
      buf.mask_b.resize(mask_size);
      for (uint8_t& m : buf.mask_b) m = rng.below(256) < block_rate ? 0 : static_cast<uint8_t>(1 + rng.below(255));
      p.mask = buf.mask_b.data();
    }
  }
  p.causal = in.ConsumeBool();
  if (p.causal) {
    if (in.ConsumeBool()) {
      for (int32_t b = 0; b < B; b++) buf.offsets.push_back(pick_offset(in, Lq, Lk));
      p.causal_offsets = buf.offsets.data();
    } else {
      p.causal_offset = pick_offset(in, Lq, Lk);
    }
    p.sliding_window = pick_window(in, Lk);
  }
  if (in.ConsumeBool()) {
    for (int32_t b = 0; b < B; b++) {
      const uint8_t choice = in.ConsumeIntegral<uint8_t>();
      buf.key_lengths.push_back(choice < 32 ? 0 : choice < 96 ? Lk : choice < 128 ? Lk - 1 : choice % (Lk + 1));
    }
    p.key_lengths = buf.key_lengths.data();
  }
  if (in.ConsumeBool()) {  // left padding: keys before key_starts[b]
    for (int32_t b = 0; b < B; b++) {
      const uint8_t choice = in.ConsumeIntegral<uint8_t>();
      buf.key_starts.push_back(choice < 64 ? 0 : choice < 96 ? Lk : choice < 128 ? 1 : choice % (Lk + 1));
    }
    p.key_starts = buf.key_starts.data();
  }
}

// Sinks [Hq] (Problem::sinks), one in two problems: per head none (-inf), 0, an ordinary logit
// (±0..8), one far above or below any score (±1e30), ±FLT_MAX, or the smallest subnormal.
// Separate from decode_options: the backward fuzzer's oracle does not take sinks.
inline void decode_sinks(FuzzedDataProvider& in, Problem& p, OptionBuffers& buf) {
  if (!in.ConsumeBool()) return;
  const float special[] = {-kInf, 0.0f, 1e30f, -1e30f, FLT_MAX, -FLT_MAX, 0x1p-149f};
  for (int32_t h = 0; h < p.q_heads; h++) {
    const uint8_t choice = in.ConsumeIntegral<uint8_t>();
    buf.sinks.push_back(choice < 128 ? (choice - 64) / 8.0f : special[choice % 7]);
  }
  p.sinks = buf.sinks.data();
}

// ALiBi slopes (Problem::alibi_slopes), one in two problems that still have input bytes: shared
// [Hq] (stride 0) or per batch [B, Hq] (stride Hq), drawn from a seed: ALiBi's own geometric
// slopes 2^(-8·(h + 1)/Hq) with one in eight 0, or each slope 0 (one in four), 2^-k (k in
// 0..12), one in [0, 1], or rarely 2^-20 (moderate biases at distances past 2^24, where float(d)
// rounds), -0, the smallest subnormal, 16, 2^20 or kMaxAlibiSlope (biases far past any score,
// which never block a key). ALiBi's diagonal is the causal offset, used whether or not the
// problem is causal: one that is not gets an offset (pick_offset, one or one per batch) here.
inline void decode_alibi(FuzzedDataProvider& in, Problem& p, OptionBuffers& buf) {
  if (!in.ConsumeBool()) return;
  const bool per_batch = in.ConsumeBool();
  const uint8_t kind = in.ConsumeIntegral<uint8_t>();
  Rng rng{in.ConsumeIntegral<uint32_t>() ^ 0xA11B1ull};
  const float rare[] = {0x1p-20f, -0.0f, 0x1p-149f, 16.0f, 0x1p20f, sdpa::kMaxAlibiSlope};
  const int32_t rows = per_batch ? p.batch : 1;
  for (int32_t n = 0; n < rows * p.q_heads; n++) {
    const int32_t h = n % p.q_heads;
    const uint32_t choice = rng.below(256);
    float slope;
    if (kind < 96) {
      slope = choice < 32 ? 0.0f : std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(p.q_heads));
    } else if (choice < 64) {
      slope = 0.0f;
    } else if (choice < 144) {
      slope = std::ldexp(1.0f, -static_cast<int>(choice % 13));
    } else if (choice < 240) {
      slope = static_cast<float>(choice - 144) / 96.0f;
    } else {
      slope = rare[choice % (sizeof rare / sizeof rare[0])];
    }
    buf.alibi_slopes.push_back(slope);
  }
  p.alibi_slopes = buf.alibi_slopes.data();
  p.alibi_stride_b = per_batch ? p.q_heads : 0;
  if (!p.causal) {
    if (in.ConsumeBool()) {
      for (int32_t b = 0; b < p.batch; b++) buf.offsets.push_back(pick_offset(in, p.q_len, p.kv_len));
      p.causal_offsets = buf.offsets.data();
    } else {
      p.causal_offset = pick_offset(in, p.q_len, p.kv_len);
    }
  }
}

// Attention dropout (Problem::dropout_threshold, dropout_seed, dropout_batch_base, _head_base and
// _row_base), drawn after ALiBi from the bytes left (none when none are left): in about half the
// problems none (threshold 0, whatever the seed: the bits of no dropout); else a threshold that
// is small (1 to 2^16: almost nothing dropped, the factor 1.0f), round(q·2^32) for q in
// 0.1 .. 0.9, about 2^31, near 2^32 - 1 (almost everything dropped, factors up to 2^32) or any;
// any seed; the bases 0 mostly, else (from the same byte) a batch base small or the largest
// validate() takes, INT32_MAX - (B - 1), or a head base small or the largest taken,
// INT32_MAX - (Hq - 1), or a row base small or the largest taken, INT32_MAX - (Lq - 1). (A packed
// check's sequences then draw batch base + s each: packed-check.h.)
inline void decode_dropout(FuzzedDataProvider& in, Problem& p) {
  const uint8_t kind = in.ConsumeIntegral<uint8_t>();
  const uint32_t value = in.ConsumeIntegral<uint32_t>();
  p.dropout_seed = in.ConsumeIntegral<uint32_t>();
  const uint8_t base = in.ConsumeIntegral<uint8_t>();
  if (kind < 112) return;  // threshold 0
  switch (kind % 5) {
    case 0: p.dropout_threshold = 1 + value % 65536; break;
    case 1: p.dropout_threshold = static_cast<uint32_t>(std::lround((1 + value % 9) * 0.1 * 4294967296.0)); break;
    case 2: p.dropout_threshold = 0x80000000u - 32768u + value % 65536; break;
    case 3: p.dropout_threshold = 0xFFFFFFFFu - value % 65536; break;
    default: p.dropout_threshold = value == 0 ? 1 : value; break;
  }
  if (base >= 192) p.dropout_batch_base = base >= 248 ? INT32_MAX - (p.batch - 1) : base % 16;
  if (base >= 160 && base < 192) p.dropout_head_base = base >= 184 ? INT32_MAX - (p.q_heads - 1) : base % 16;
  if (base >= 128 && base < 160) p.dropout_row_base = base >= 152 ? INT32_MAX - (p.q_len - 1) : base % 16;
}

// Invalid problems: one field of a valid Problem broken, `detail` (an input byte) picking the
// bad value. Each returns the Status validate() and validate_backward() give for it: the
// fields below are checked the same way by both.

// A stride negative: -1, or INT64_MIN (whose negation overflows).
inline Status break_stride(int64_t* stride, uint8_t detail) {
  *stride = detail & 0x80 ? INT64_MIN : -1;
  return Status::kBadStride;
}

// A kv_type that is no KvType at all.
inline Status break_kv_type(Problem& p, uint8_t detail) {
  p.kv_type = static_cast<sdpa::KvType>(detail % 2 == 0 ? 4 : -1);  // 0..3 are KvTypes
  return Status::kBadKvType;
}

// A scale that is not finite.
inline Status break_scale(Problem& p, uint8_t detail) {
  const float bad[] = {kNaN, kInf, -kInf};
  p.scale = bad[detail % 3];
  return Status::kBadScale;
}

// A softcap that is negative (-0 is "no softcap", valid), NaN or infinite.
inline Status break_softcap(Problem& p, uint8_t detail) {
  const float bad[] = {-1.0f, kNaN, kInf, -FLT_MIN, -kInf};
  p.softcap = bad[detail % 5];
  return Status::kBadSoftcap;
}

// A sliding window that is negative, or one without causal.
inline Status break_window(Problem& p, uint8_t detail) {
  if (detail & 0x80) {
    p.sliding_window = detail & 0x40 ? INT32_MIN : -1;
  } else {
    p.causal = false, p.sliding_window = 1 + detail;
  }
  return Status::kBadWindow;
}

// One head's sink NaN or +inf (sinks made, all 0, if p had none).
inline Status break_sink(Problem& p, OptionBuffers& buf, uint8_t detail) {
  if (buf.sinks.empty()) buf.sinks.assign(static_cast<size_t>(p.q_heads), 0.0f);
  buf.sinks[detail % buf.sinks.size()] = detail & 0x80 ? kNaN : kInf;
  p.sinks = buf.sinks.data();
  return Status::kBadSink;
}

// One ALiBi slope NaN, negative, ±inf or past kMaxAlibiSlope, in any batch's row (slopes made,
// all 0.5, shared or per batch, if p had none): kBadAlibi; or alibi_stride_b negative: kBadStride.
inline Status break_alibi(Problem& p, OptionBuffers& buf, uint8_t detail) {
  if (buf.alibi_slopes.empty()) {
    const bool per_batch = detail & 1;
    buf.alibi_slopes.assign(static_cast<size_t>(per_batch ? p.batch : 1) * p.q_heads, 0.5f);
    p.alibi_stride_b = per_batch ? p.q_heads : 0;
  }
  p.alibi_slopes = buf.alibi_slopes.data();
  if ((detail & 0xE0) == 0xE0) {
    p.alibi_stride_b = detail & 0x10 ? INT64_MIN : -1;
    return Status::kBadStride;
  }
  const float bad[] = {kNaN, -0.5f, kInf, 0x1p65f, -kInf, -0x1p-149f, std::nextafter(sdpa::kMaxAlibiSlope, kInf)};
  buf.alibi_slopes[(detail >> 1) % buf.alibi_slopes.size()] = bad[detail % 7];
  return Status::kBadAlibi;
}

// A dropout_batch_base that is negative (-1 .. -64, or INT32_MIN), or, with B > 1, one past the
// largest validate() takes (base + B - 1 would pass INT32_MAX); or a dropout_head_base negative or,
// with Hq > 1, one past the largest taken (base + Hq - 1); or a dropout_row_base negative or, with
// Lq > 1, one past the largest taken (base + Lq - 1); with or without dropout.
inline Status break_dropout(Problem& p, uint8_t detail) {
  if ((detail & 0x18) == 0x18) {  // the head base: negative, or base + Hq - 1 past INT32_MAX
    p.dropout_head_base = p.q_heads > 1 && (detail & 0x04) ? INT32_MAX - (p.q_heads - 2) : -1 - (detail % 4);
  } else if ((detail & 0x18) == 0x10) {  // the row base: negative, or base + Lq - 1 past INT32_MAX
    p.dropout_row_base = p.q_len > 1 && (detail & 0x04) ? INT32_MAX - (p.q_len - 2) : -1 - (detail % 4);
  } else if ((detail & 0xC0) == 0xC0 && p.batch > 1) {
    p.dropout_batch_base = INT32_MAX - (p.batch - 2);
  } else {
    p.dropout_batch_base = detail & 0x80 ? INT32_MIN : -1 - (detail % 64);
  }
  if (detail & 0x20) p.dropout_threshold = 0;
  return Status::kBadDropout;
}

// One batch's key length or key start -1 or kv_len + 1 (key_lengths or key_starts made, all
// kv_len or 0, if p had none).
inline Status break_key_length(Problem& p, OptionBuffers& buf, uint8_t detail) {
  std::vector<int32_t>& bounds = detail & 0x40 ? buf.key_starts : buf.key_lengths;
  if (bounds.empty()) bounds.assign(static_cast<size_t>(p.batch), detail & 0x40 ? 0 : p.kv_len);
  bounds[detail % bounds.size()] = detail & 0x80 ? -1 : p.kv_len + 1;
  (detail & 0x40 ? p.key_starts : p.key_lengths) = bounds.data();
  return Status::kBadKeyLength;
}

}  // namespace sdpa_fuzz
