// Row copies into the KV cache (src/kv-cache.h).
#include "kv-cache.h"

#include <cstring>

#include "math/f16-f32-cvt-wasmsimd.h"

namespace sdpa {
namespace {

bool known(KvType type) { return type == KvType::kFloat32 || is_half(type); }

// One row of `dim` elements.
void copy_row(void* dst, KvType dst_type, const void* src, KvType src_type, int32_t dim) {
  if (is_half(dst_type) == is_half(src_type)) {
    std::memcpy(dst, src, static_cast<size_t>(dim) * (is_half(dst_type) ? 2 : 4));
  } else if (is_half(dst_type)) {
    const float* from = static_cast<const float*>(src);
    uint16_t* to = static_cast<uint16_t*>(dst);
    for (int32_t d = 0; d < dim; d++) to[d] = f32_to_f16(from[d]);
  } else {
    const uint16_t* from = static_cast<const uint16_t*>(src);
    float* to = static_cast<float*>(dst);
    for (int32_t d = 0; d < dim; d++) to[d] = f16_to_f32(from[d]);
  }
}

int64_t element_bytes(KvType type) { return is_half(type) ? 2 : 4; }

}  // namespace

Status copy_rows(const RowBlock& dst, const RowBlock& src, int32_t batch, int32_t heads, int32_t rows,
                 int32_t dim) {
  if (batch < 0 || heads < 0 || rows < 0 || dim < 1) return Status::kBadShape;
  if (dst.data == nullptr || src.data == nullptr) return Status::kNullPointer;
  if (!known(dst.type) || !known(src.type)) return Status::kBadKvType;
  const int64_t strides[] = {dst.stride_b, dst.stride_h, dst.stride_l, src.stride_b, src.stride_h, src.stride_l};
  for (int64_t stride : strides) {
    if (stride < 0) return Status::kBadStride;
  }
  char* const dst_base = static_cast<char*>(dst.data);
  const char* const src_base = static_cast<const char*>(src.data);
  const int64_t dst_bytes = element_bytes(dst.type), src_bytes = element_bytes(src.type);
  for (int32_t b = 0; b < batch; b++) {
    for (int32_t h = 0; h < heads; h++) {
      for (int32_t l = 0; l < rows; l++) {
        const int64_t to = b * dst.stride_b + h * dst.stride_h + l * dst.stride_l;
        const int64_t from = b * src.stride_b + h * src.stride_h + l * src.stride_l;
        copy_row(dst_base + to * dst_bytes, dst.type, src_base + from * src_bytes, src.type, dim);
      }
    }
  }
  return Status::kOk;
}

}  // namespace sdpa
