// Writes into the KV cache's storage (the TypeScript KVCache owns the memory and its length;
// attention reads the storage in place through a Problem whose key/value point into it).
//
// Storage of a cache with B batches, Hkv heads, room for max_len positions:
//   keys   [B, Hkv, max_len, E ]   elements of the cache's KvType (float32, IEEE halves or bfloat16)
//   values [B, Hkv, max_len, Ev]
// so position j of (b, h) is element ((b·Hkv + h)·max_len + j)·E: a Problem over the first
// `length` positions has k_stride_b = Hkv·max_len·E, k_stride_h = max_len·E, k_stride_l = E
// (likewise for values) and kv_len = length. Appending never moves what is stored.
#pragma once

#include <cstdint>

#include "sdpa.h"

namespace sdpa {

// A [B, H, L, D] block of rows with element strides (D contiguous).
struct RowBlock {
  void* data = nullptr;  // float or uint16_t (halves, bfloat16), per `type`
  KvType type = KvType::kFloat32;
  int64_t stride_b = 0, stride_h = 0, stride_l = 0;
};

// dst[b, h, l, 0..D) = src[b, h, l, 0..D) for every b < B, h < H, l < L, converting as the
// types say: float32 -> float16 rounds to nearest even and saturates beyond ±65504
// (f32_to_f16, src/math/f16-f32-cvt-wasmsimd.h); float32 -> bfloat16 rounds to nearest even and
// saturates finite values past the largest bfloat16 (f32_to_bf16, src/math/bf16-f32-cvt-wasmsimd.h);
// 16-bit -> float32 is exact; float16 <-> bfloat16 widen exactly, then round as float32 does into
// the other format; same formats copy the bits. kBadShape if a size is < 0 or D < 1,
// kNullPointer for a missing pointer, kBadStride for a negative stride, kBadKvType for an unknown
// type; nothing written then.
Status copy_rows(const RowBlock& dst, const RowBlock& src, int32_t batch, int32_t heads, int32_t rows,
                 int32_t dim);

// Whether any of `runs` runs of `run_length` halves, the first at `first` and each
// `run_stride` halves after the one before, holds an exponent-31 pattern (Inf or NaN): after
// an append, the new positions of every (batch, head) of a float16 cache's keys or values
// (run_stride = max_len·D, run_length = Lnew·D). Halves between the runs are not read.
bool halves_have_inf_nan(const uint16_t* first, int64_t run_stride, int32_t runs, int64_t run_length);

}  // namespace sdpa
