// Forward kernels. Each processes one (batch, KV head): all the query heads that share
// that KV head (GQA), every query row, all keys. See src/sdpa.h for the problem's contract.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sdpa.h"

namespace sdpa {

// Floats of scratch one call needs (same for every (batch, KV head) of the problem).
size_t sdpa_f32_fwd_4x32__wasmsimd_scratch(const Problem& p);

// Preconditions (asserted): validate(p) == kOk; 0 <= b < B; 0 <= kv_head < Hkv;
// scratch holds sdpa_f32_fwd_4x32__wasmsimd_scratch(p) floats (any 4-byte alignment).
void sdpa_f32_fwd_ukernel_4x32__wasmsimd(const Problem& p, int32_t b, int32_t kv_head,
                                         float* scratch);

}  // namespace sdpa
