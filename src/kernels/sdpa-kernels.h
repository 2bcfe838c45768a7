// Forward kernels. Each call processes one (batch, KV head) and query rows
// [q_begin, q_end) of all the query heads that share that KV head (GQA), over all keys. See src/sdpa.h for the problem's contract.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sdpa.h"

namespace sdpa {

// Floats of scratch one call needs (same for every (batch, KV head) of the problem).
size_t sdpa_f32_fwd_4x32__wasmsimd_scratch(const Problem& p);

// Preconditions (asserted): validate(p) == kOk; 0 <= b < B; 0 <= kv_head < Hkv;
// 0 <= q_begin < q_end <= Lq; scratch holds sdpa_f32_fwd_4x32__wasmsimd_scratch(p) floats
// (any 4-byte alignment) and is used by this call alone.
void sdpa_f32_fwd_ukernel_4x32__wasmsimd(const Problem& p, int32_t b, int32_t kv_head,
                                         int32_t q_begin, int32_t q_end, float* scratch);

}  // namespace sdpa
