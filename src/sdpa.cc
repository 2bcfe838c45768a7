// Validation and dispatch of the forward pass (src/sdpa.h).
#include "sdpa.h"

#include <algorithm>
#include <cmath>

#include "kernels/sdpa-kernels.h"
#include "parallel/thread-pool.h"
#include "tiles.h"

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

size_t scratch_floats(const Problem& p, int32_t threads) {
  return sdpa_f32_fwd_4x32__wasmsimd_scratch(p) * static_cast<size_t>(threads);
}

namespace {

// The parallel split: items are (block of query rows, batch, KV head). One block per
// (batch, KV head) on one thread; with more threads, enough blocks for about 4 items per
// thread (so uneven causal blocks balance out), but never blocks under kMinBlockRows rows
// (each item packs its K/V head once, which must stay small next to its compute).
constexpr int32_t kMinBlockRows = 16;
constexpr int32_t kItemsPerThread = 4;

struct ForwardWork {
  const Problem* p;
  float* scratch;
  size_t scratch_per_thread;
  int32_t blocks;      // query-row blocks per (batch, KV head)
  int32_t block_rows;  // a multiple of kQueryTile
};

void forward_item(void* context, int32_t item, int32_t thread) {
  const ForwardWork& w = *static_cast<const ForwardWork*>(context);
  const Problem& p = *w.p;
  const int32_t pairs = p.batch * p.kv_heads;
  // Last blocks first: under a causal mask they attend the most keys, and handing out the
  // longest items first keeps the threads' finishing times close.
  const int32_t block = w.blocks - 1 - item / pairs;
  const int32_t pair = item % pairs;
  const int32_t q_begin = block * w.block_rows;
  const int32_t q_end = std::min(p.q_len, q_begin + w.block_rows);
  sdpa_f32_fwd_ukernel_4x32__wasmsimd(p, pair / p.kv_heads, pair % p.kv_heads, q_begin, q_end,
                                      w.scratch + static_cast<size_t>(thread) * w.scratch_per_thread);
}

}  // namespace

Status forward(const Problem& p, float* scratch, size_t scratch_size, ThreadPool* pool) {
  const Status status = validate(p);
  if (status != Status::kOk) return status;
  const int32_t threads = pool != nullptr ? pool->threads() : 1;
  if (scratch == nullptr || scratch_size < scratch_floats(p, threads)) return Status::kBadScratch;

  const int32_t pairs = p.batch * p.kv_heads;
  int32_t blocks = 1;
  if (threads > 1) {
    const int32_t wanted = (kItemsPerThread * threads + pairs - 1) / pairs;
    blocks = std::max(1, std::min(wanted, p.q_len / kMinBlockRows));
  }
  const int32_t block_rows = round_up((p.q_len + blocks - 1) / blocks, kQueryTile);
  ForwardWork work{&p, scratch, sdpa_f32_fwd_4x32__wasmsimd_scratch(p), 0, block_rows};
  work.blocks = (p.q_len + block_rows - 1) / block_rows;
  const int32_t items = work.blocks * pairs;
  if (pool != nullptr) {
    pool->run(items, forward_item, &work);
  } else {
    for (int32_t item = 0; item < items; item++) forward_item(&work, item, 0);
  }
  return Status::kOk;
}

}  // namespace sdpa
