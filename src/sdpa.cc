// Validation and dispatch of the forward pass (src/sdpa.h).
#include "sdpa.h"

#include <cmath>

#include "kernels/sdpa-kernels.h"

namespace sdpa {

const char* status_name(Status status) {
  switch (status) {
    case Status::kOk: return "ok";
    case Status::kBadShape: return "bad shape";
    case Status::kNullPointer: return "null pointer";
    case Status::kBadScale: return "scale is not finite";
    case Status::kBadSoftcap: return "softcap is negative or not finite";
    case Status::kBadKeyLength: return "key length outside [0, Lk]";
    case Status::kBadStride: return "negative stride";
    case Status::kBadScratch: return "scratch missing or too small";
  }
  return "unknown status";
}

Status validate(const Problem& p) {
  if (p.batch < 1 || p.q_heads < 1 || p.kv_heads < 1 || p.q_len < 1 || p.kv_len < 1 ||
      p.head_dim < 1 || p.value_dim < 1 || p.q_heads % p.kv_heads != 0) {
    return Status::kBadShape;
  }
  if (p.query == nullptr || p.key == nullptr || p.value == nullptr || p.output == nullptr ||
      (p.mask_kind != MaskKind::kNone && p.mask == nullptr)) {
    return Status::kNullPointer;
  }
  const int64_t strides[] = {p.q_stride_b, p.q_stride_h, p.q_stride_l, p.k_stride_b,
                             p.k_stride_h, p.k_stride_l, p.v_stride_b, p.v_stride_h,
                             p.v_stride_l, p.o_stride_b, p.o_stride_h, p.o_stride_l,
                             p.mask_stride_b, p.mask_stride_h, p.mask_stride_q, p.mask_stride_k};
  for (int64_t stride : strides) {
    if (stride < 0) return Status::kBadStride;
  }
  if (!std::isfinite(p.scale)) return Status::kBadScale;
  if (!(p.softcap >= 0.0f) || !std::isfinite(p.softcap)) return Status::kBadSoftcap;
  if (p.key_lengths != nullptr) {
    for (int32_t b = 0; b < p.batch; b++) {
      if (p.key_lengths[b] < 0 || p.key_lengths[b] > p.kv_len) return Status::kBadKeyLength;
    }
  }
  return Status::kOk;
}

size_t scratch_floats(const Problem& p) { return sdpa_f32_fwd_4x32__wasmsimd_scratch(p); }

Status forward(const Problem& p, float* scratch, size_t scratch_size) {
  const Status status = validate(p);
  if (status != Status::kOk) return status;
  if (scratch == nullptr || scratch_size < scratch_floats(p)) return Status::kBadScratch;
  for (int32_t b = 0; b < p.batch; b++) {
    for (int32_t kv_head = 0; kv_head < p.kv_heads; kv_head++) {
      sdpa_f32_fwd_ukernel_4x32__wasmsimd(p, b, kv_head, 0, p.q_len, scratch);
    }
  }
  return Status::kOk;
}

}  // namespace sdpa
