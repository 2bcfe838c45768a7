// Problem decoding shared by the fuzz targets that decode an attention Problem (sdpa-fuzz.cc,
// backward-fuzz.cc): lengths and head dims around the tile edges of src/tiles.h, the options
// (scale, softcap, masks, causal offsets, key lengths), tensor fills and NaN padding, and the
// poisoning of K/V rows no query row attends. The bytes are consumed in the order sdpa-fuzz.cc
// always consumed them, so its committed seed corpus decodes to the same problems.
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

// What the options of a Problem point to, owned.
struct OptionBuffers {
  std::vector<float> mask_f;
  std::vector<uint8_t> mask_b;
  std::vector<int32_t> offsets, key_lengths;
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

FUZZ_NO_COVERAGE inline void fill(std::vector<float>& x, const ValueStyle& s) {
  Rng rng{s.seed};
  for (float& f : x) f = draw_float(rng, s);
}
FUZZ_NO_COVERAGE inline void fill(std::vector<uint16_t>& x, const ValueStyle& s) {
  Rng rng{s.seed};
  for (uint16_t& h : x) h = draw_half(rng, s);
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

// How many query rows of batch b, in the query heads of KV head kvh, may attend key j.
FUZZ_NO_COVERAGE inline int64_t attended_by(const Problem& p, int64_t b, int64_t kvh, int64_t j) {
  const int64_t group = p.q_heads / p.kv_heads;
  int64_t rows = 0;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; h++)
    for (int64_t i = 0; i < p.q_len; i++) rows += attendable(p, b, h, i, j);
  return rows;
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
// broadcast, any axis order, padded strides), causal with one offset or one per batch,
// key_lengths (including 0).
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
  }
  if (in.ConsumeBool()) {
    for (int32_t b = 0; b < B; b++) {
      const uint8_t choice = in.ConsumeIntegral<uint8_t>();
      buf.key_lengths.push_back(choice < 32 ? 0 : choice < 96 ? Lk : choice < 128 ? Lk - 1 : choice % (Lk + 1));
    }
    p.key_lengths = buf.key_lengths.data();
  }
}

}  // namespace sdpa_fuzz
