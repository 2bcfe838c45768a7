// Which keys a query row may attend, as the kernels compute it (src/sdpa.h's score pipeline):
// row i of batch b attends keys start(i) <= j < limit(i), where
//   limit(i) = key_lengths[b] (or Lk), and with causal min(that, i + offset + 1)
//   start(i) = key_starts[b] (or 0), and with a sliding window W max(that, i + offset + 1 - W)
// both clamped into [0, Lk]; a row with start(i) >= limit(i) attends nothing. The mask, if any,
// blocks more keys inside [start, limit). One place for the forward and backward kernels.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>

#include "sdpa.h"

namespace sdpa {

// Keys this batch may attend, the causal frontier and the sliding window: row i may attend
// keys start(i) <= j < limit(i).
struct RowLimits {
  int32_t valid_keys;  // key_lengths[b], or Lk
  int32_t first_key;   // key_starts[b], or 0
  bool causal;
  int64_t offset;
  int64_t window;      // 0: none (else causal)
  int32_t operator()(int32_t i) const {
    if (!causal) return valid_keys;
    return static_cast<int32_t>(std::clamp<int64_t>(i + offset + 1, 0, valid_keys));
  }
  // The batch's first key, or the first key in the window, i + offset - W + 1 (keys
  // j > i + offset - W), whichever is later.
  int32_t start(int32_t i) const {
    if (window == 0) return first_key;
    return static_cast<int32_t>(std::clamp<int64_t>(i + offset + 1 - window, first_key, std::max(first_key, valid_keys)));
  }
};

inline RowLimits row_limits(const Problem& p, int32_t b) {
  const int32_t valid_keys = p.key_lengths != nullptr ? p.key_lengths[b] : p.kv_len;
  assert(valid_keys >= 0 && valid_keys <= p.kv_len);
  assert(p.sliding_window == 0 || p.causal);
  const int32_t first_key = p.key_starts != nullptr ? p.key_starts[b] : 0;
  assert(first_key >= 0 && first_key <= p.kv_len);
  return {valid_keys, first_key, p.causal, p.causal_offsets != nullptr ? p.causal_offsets[b] : p.causal_offset,
          p.sliding_window};
}

}  // namespace sdpa
