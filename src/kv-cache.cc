// Row copies into the KV cache (src/kv-cache.h).
#include "kv-cache.h"

#include <algorithm>
#include <cstring>

#include "math/bf16-f32-cvt-wasmsimd.h"
#include "math/f16-f32-cvt-wasmsimd.h"
#include "simd/copy-bytes.h"

namespace sdpa {
namespace {

// float32 -> float16, 8 then 4 lanes at a time (f32x4_to_f16_bits: the same halves as
// f32_to_f16, which does the last dim % 4).
void narrow_row(uint16_t* to, const float* from, int32_t dim, const F32ToF16Constants& c) {
  int32_t d = 0;
  for (; d + 8 <= dim; d += 8) {
    const v128_t low = f32x4_to_f16_bits(wasm_v128_load(from + d), c);
    const v128_t high = f32x4_to_f16_bits(wasm_v128_load(from + d + 4), c);
    wasm_v128_store(to + d, wasm_u16x8_narrow_i32x4(low, high));
  }
  if (d + 4 <= dim) {
    const v128_t bits = f32x4_to_f16_bits(wasm_v128_load(from + d), c);
    wasm_v128_store64_lane(to + d, wasm_u16x8_narrow_i32x4(bits, bits), 0);
    d += 4;
  }
  for (; d < dim; d++) to[d] = f32_to_f16(from[d]);
}

// float16 -> float32, exact, 4 lanes at a time (f16x4_load_as_f32), f16_to_f32 for the rest.
void widen_row(float* to, const uint16_t* from, int32_t dim, const F16Constants& c) {
  int32_t d = 0;
  for (; d + 4 <= dim; d += 4) wasm_v128_store(to + d, f16x4_load_as_f32(from + d, c));
  for (; d < dim; d++) to[d] = f16_to_f32(from[d]);
}

// float32 -> bfloat16, 8 at a time (f32x8_store_as_bf16: the same as f32_to_bf16, which does
// the last dim % 8).
void narrow_row_to_bf16(uint16_t* to, const float* from, int32_t dim, const F32ToBF16Constants& c) {
  int32_t d = 0;
  for (; d + 8 <= dim; d += 8) f32x8_store_as_bf16(to + d, from + d, c);
  for (; d < dim; d++) to[d] = f32_to_bf16(from[d]);
}

// bfloat16 -> float32, exact.
void widen_bf16_row(float* to, const uint16_t* from, int32_t dim) {
  int32_t d = 0;
  for (; d + 4 <= dim; d += 4) wasm_v128_store(to + d, bf16x4_load_as_f32(from + d));
  for (; d < dim; d++) to[d] = bf16_to_f32(from[d]);
}

// The conversions' constants, made once per copy_rows call.
struct RowConverters {
  F32ToF16Constants narrow = make_f32_to_f16_constants();
  F16Constants widen = make_f16_constants();
  F32ToBF16Constants narrow_bf16 = make_f32_to_bf16_constants();
};

// The element kinds copy_row tells apart: the two kinds of halves are one format.
enum class Format { kFloat32, kHalf, kBFloat16 };
Format format_of(KvType type) {
  return is_half(type) ? Format::kHalf : type == KvType::kBFloat16 ? Format::kBFloat16 : Format::kFloat32;
}

// A row of 16-bit elements of `from` as float32 (exact).
void widen_16_bit_row(float* to, const uint16_t* from, Format from_format, int32_t dim, const RowConverters& c) {
  if (from_format == Format::kHalf) {
    widen_row(to, from, dim, c.widen);
  } else {
    widen_bf16_row(to, from, dim);
  }
}

// A row of floats as 16-bit elements of `to_format` (rounded to nearest even, saturating).
void narrow_16_bit_row(uint16_t* to, Format to_format, const float* from, int32_t dim, const RowConverters& c) {
  if (to_format == Format::kHalf) {
    narrow_row(to, from, dim, c.narrow);
  } else {
    narrow_row_to_bf16(to, from, dim, c.narrow_bf16);
  }
}

// One row of `dim` elements. Halves and bfloat16 convert into each other through float32, a
// block of kBlock at a time: the widening is exact, so the one rounding is the narrowing's (as
// if the value had been given as a float32).
void copy_row(void* dst, KvType dst_type, const void* src, KvType src_type, int32_t dim, const RowConverters& c) {
  const Format to = format_of(dst_type), from = format_of(src_type);
  if (to == from) {
    copy_bytes(dst, src, static_cast<size_t>(dim) * (to == Format::kFloat32 ? 4 : 2));
  } else if (from == Format::kFloat32) {
    narrow_16_bit_row(static_cast<uint16_t*>(dst), to, static_cast<const float*>(src), dim, c);
  } else if (to == Format::kFloat32) {
    widen_16_bit_row(static_cast<float*>(dst), static_cast<const uint16_t*>(src), from, dim, c);
  } else {
    constexpr int32_t kBlock = 64;
    alignas(16) float widened[kBlock];
    for (int32_t d0 = 0; d0 < dim; d0 += kBlock) {
      const int32_t n = std::min(kBlock, dim - d0);
      widen_16_bit_row(widened, static_cast<const uint16_t*>(src) + d0, from, n, c);
      narrow_16_bit_row(static_cast<uint16_t*>(dst) + d0, to, widened, n, c);
    }
  }
}

int64_t element_bytes(KvType type) { return is_16_bit(type) ? 2 : 4; }

}  // namespace

Status copy_rows(const RowBlock& dst, const RowBlock& src, int32_t batch, int32_t heads, int32_t rows,
                 int32_t dim) {
  if (batch < 0 || heads < 0 || rows < 0 || dim < 1) return Status::kBadShape;
  if (dst.data == nullptr || src.data == nullptr) return Status::kNullPointer;
  if (!is_known(dst.type) || !is_known(src.type)) return Status::kBadKvType;
  const int64_t strides[] = {dst.stride_b, dst.stride_h, dst.stride_l, src.stride_b, src.stride_h, src.stride_l};
  for (int64_t stride : strides) {
    if (stride < 0) return Status::kBadStride;
  }
  char* const dst_base = static_cast<char*>(dst.data);
  const char* const src_base = static_cast<const char*>(src.data);
  const int64_t dst_bytes = element_bytes(dst.type), src_bytes = element_bytes(src.type);
  const RowConverters converters;
  for (int32_t b = 0; b < batch; b++) {
    for (int32_t h = 0; h < heads; h++) {
      for (int32_t l = 0; l < rows; l++) {
        const int64_t to = b * dst.stride_b + h * dst.stride_h + l * dst.stride_l;
        const int64_t from = b * src.stride_b + h * src.stride_h + l * src.stride_l;
        copy_row(dst_base + to * dst_bytes, dst.type, src_base + from * src_bytes, src.type, dim, converters);
      }
    }
  }
  return Status::kOk;
}

bool halves_have_inf_nan(const uint16_t* first, int64_t run_stride, int32_t runs, int64_t run_length) {
  // A half h has exponent 31 exactly when (h & 0x7C00) == 0x7C00; eight at a time, the lanes'
  // answers ORed together and tested once per run.
  const v128_t exponent = wasm_i16x8_splat(0x7C00);
  for (int32_t r = 0; r < runs; r++) {
    const uint16_t* run = first + r * run_stride;
    v128_t any = wasm_i16x8_splat(0);
    int64_t i = 0;
    for (; i + 8 <= run_length; i += 8) {
      any = wasm_v128_or(any, wasm_i16x8_eq(wasm_v128_and(wasm_v128_load(run + i), exponent), exponent));
    }
    if (wasm_v128_any_true(any)) return true;
    for (; i < run_length; i++) {
      if ((run[i] & 0x7C00u) == 0x7C00u) return true;
    }
  }
  return false;
}

}  // namespace sdpa
