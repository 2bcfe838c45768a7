// Validation and dispatch of the backward pass (src/sdpa-backward.h).
#include "sdpa-backward.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/sdpa-bwd-kernels.h"
#include "parallel/thread-pool.h"
#include "tiles.h"

namespace sdpa {

Status validate_backward(const BackwardProblem& p) {
  const Status status = validate(p.forward);
  if (status != Status::kOk) return status;
  if (p.forward.kv_type != KvType::kFloat32) return Status::kBadKvType;
  if (p.logsumexp == nullptr || p.grad_output == nullptr || p.d_query == nullptr || p.d_key == nullptr ||
      p.d_value == nullptr) {
    return Status::kNullPointer;
  }
  const int64_t strides[] = {p.go_stride_b, p.go_stride_h, p.go_stride_l, p.dq_stride_b, p.dq_stride_h, p.dq_stride_l,
                             p.dk_stride_b, p.dk_stride_h, p.dk_stride_l, p.dv_stride_b, p.dv_stride_h, p.dv_stride_l};
  for (int64_t stride : strides) {
    if (stride < 0) return Status::kBadStride;
  }
  if ((p.d_mask != nullptr && p.forward.mask_kind != MaskKind::kFloat) || p.mask_grad_parts < 0) return Status::kBadMaskGrad;
  if (p.d_sinks != nullptr && p.forward.sinks == nullptr) return Status::kNullPointer;
  return Status::kOk;
}

namespace {

// The work, in parallel loops (every item's result is the same whatever the thread):
//   1. RowStats (D_i = dO_i·O_i, and the shift and log_sum that rebuild p, recomputed for rows
//      whose lse is too coarse): items (batch, KV head, block of flat query rows)
//   then, with enough (batch, KV head) pairs to keep every thread busy (or one thread):
//   2. dK, dV and dQ: items (batch, KV head), the fused kernel (scores computed once)
//   else (few pairs, more threads: e.g. one long head):
//   2. dK, dV: items (batch, KV head, key block of kBackwardKeyTile keys)
//   3. dQ: items (batch, KV head, block of flat query rows); the blocks only split the rows
//      (each row's sum over keys is in one item), so their count may follow the threads.
// and then, with d_mask:
//   4. the mask's gradient: blocks of the mask's own elements (its batch, head, block of
//      kMaskGradRows rows, block of kMaskGradKeys keys), each axis the mask broadcasts on whole
//      in every block. A mask of fewer than kMaskGradItems blocks has each block's terms split
//      into parts (runs of its row tiles, at least kMaskGradPartTiles each), summed into
//      partials [blocks, parts, block's elements] in scratch, then
//   5. the partials added in part order into d_mask, by blocks.
//   The blocks and parts follow from the shapes alone (or the parts from mask_grad_parts): the
//   same sums for any number of threads.
// Both ways run the same operations on every gradient element in the same order (the fused
// kernel is the dK/dV kernel's key blocks plus the dQ kernel's per-tile sums): the same bits.
// Scratch: RowStats' delta, shift and log_sum [B, Hq, Lq] each, the mask gradient's partials
// (when split), then per thread the scratch of the kernels used.
// The forward's split policy (src/sdpa.cc: kMinBlockRows, kItemsPerThread), with values of its
// own: each pass is tuned by itself.
constexpr int32_t kMinRowBlock = 16;
constexpr int32_t kItemsPerThread = 4;
// The mask gradient's split: enough items for 4 threads' kItemsPerThread, in parts of at least
// 16 rows (one part's packing of K and V is then 1/16 of its work or less).
constexpr int64_t kMaskGradItems = 4 * kItemsPerThread;
constexpr int64_t kMaskGradPartTiles = 16 / kQueryTile;

// The row tiles whose terms add into a mask gradient block of `rows` rows: ceil(rows / 4) per
// (batch, head) it sums over (its own only, on an axis the mask has).
int64_t mask_grad_tiles(const Problem& p, int64_t rows) {
  return (p.mask_stride_b == 0 ? p.batch : 1) * static_cast<int64_t>(p.mask_stride_h == 0 ? p.q_heads : 1) *
         ((rows + kQueryTile - 1) / kQueryTile);
}

struct BackwardPlan {
  int32_t pairs;        // B·Hkv
  int32_t rows;         // flat rows per pair: (Hq / Hkv)·Lq
  int32_t key_blocks;   // per pair
  bool fused;           // step 2 by pairs with the fused kernel, else steps 2 and 3
  int32_t row_blocks;   // per pair
  int32_t block_rows;   // a multiple of kQueryTile
  // The mask gradient's items, per axis of [B, Hq, Lq, Lk]: 1 where the mask broadcasts (or no
  // d_mask), else the axis's size (B, Hq) or its blocks (Lq, Lk).
  int32_t mask_grad_blocks[4];
  int32_t mask_grad_parts;           // parts of each block's sum: 1, or partials in scratch
  int64_t mask_grad_block_keys;      // a partial's keys: min(Lk, kMaskGradKeys), or 1 (no Lk axis)
  uint64_t mask_grad_block_floats;   // a partial's floats: [rows or 1][mask_grad_block_keys]
  uint64_t mask_grad_partial_floats;  // blocks · parts · block floats when parts > 1, else 0
  uint64_t stats_floats;  // each of RowStats' three arrays
  uint64_t per_thread;
};

BackwardPlan plan_backward(const BackwardProblem& bp, int32_t threads) {
  const Problem& p = bp.forward;
  BackwardPlan w{};
  w.pairs = p.batch * p.kv_heads;
  w.rows = p.q_heads / p.kv_heads * p.q_len;
  w.key_blocks = (p.kv_len + kBackwardKeyTile - 1) / kBackwardKeyTile;
  w.row_blocks = 1;
  if (threads > 1) {
    const int32_t wanted = (kItemsPerThread * threads + w.pairs - 1) / w.pairs;
    w.row_blocks = std::max(1, std::min(wanted, w.rows / kMinRowBlock));
  }
  w.block_rows = round_up((w.rows + w.row_blocks - 1) / w.row_blocks, kQueryTile);
  w.row_blocks = (w.rows + w.block_rows - 1) / w.block_rows;
  w.fused = threads == 1 || w.pairs >= kItemsPerThread * threads;
  const bool mask_grad = bp.d_mask != nullptr;
  w.mask_grad_blocks[0] = mask_grad && p.mask_stride_b != 0 ? p.batch : 1;
  w.mask_grad_blocks[1] = mask_grad && p.mask_stride_h != 0 ? p.q_heads : 1;
  w.mask_grad_blocks[2] = mask_grad && p.mask_stride_q != 0 ? (p.q_len + kMaskGradRows - 1) / kMaskGradRows : 1;
  w.mask_grad_blocks[3] = mask_grad && p.mask_stride_k != 0 ? (p.kv_len + kMaskGradKeys - 1) / kMaskGradKeys : 1;
  const int64_t blocks = static_cast<int64_t>(w.mask_grad_blocks[0]) * w.mask_grad_blocks[1] * w.mask_grad_blocks[2] *
                         w.mask_grad_blocks[3];
  const int64_t block_rows = p.mask_stride_q != 0 ? std::min(p.q_len, kMaskGradRows) : p.q_len;  // the first block's
  const int64_t block_tiles = mask_grad_tiles(p, block_rows);
  w.mask_grad_parts = 1;
  if (mask_grad && bp.mask_grad_parts > 0) {  // the caller's (a slice's: the whole call's parts)
    w.mask_grad_parts = static_cast<int32_t>(std::min<int64_t>(bp.mask_grad_parts, std::max<int64_t>(1, block_tiles)));
  } else if (mask_grad && blocks < kMaskGradItems) {
    w.mask_grad_parts = static_cast<int32_t>(
        std::max<int64_t>(1, std::min((kMaskGradItems + blocks - 1) / blocks, block_tiles / kMaskGradPartTiles)));
  }
  w.mask_grad_block_keys = p.mask_stride_k != 0 ? std::min(p.kv_len, kMaskGradKeys) : 1;
  w.mask_grad_block_floats = static_cast<uint64_t>(p.mask_stride_q != 0 ? block_rows : 1) * w.mask_grad_block_keys;
  w.mask_grad_partial_floats =
      w.mask_grad_parts > 1 ? (static_cast<uint64_t>(blocks) * w.mask_grad_parts * w.mask_grad_block_floats + 3) / 4 * 4 : 0;
  w.stats_floats = (static_cast<uint64_t>(p.batch) * p.q_heads * p.q_len + 3) / 4 * 4;
  w.per_thread = std::max(sdpa_f32_bwd_row_stats_4x64__wasmsimd_scratch(bp),
                          w.fused ? sdpa_f32_bwd_fused_4x64__wasmsimd_scratch(bp)
                                  : std::max(sdpa_f32_bwd_dkdv_4x64__wasmsimd_scratch(bp),
                                             sdpa_f32_bwd_dq_4x64__wasmsimd_scratch(bp)));
  if (mask_grad) w.per_thread = std::max(w.per_thread, sdpa_f32_bwd_dmask_4x64__wasmsimd_scratch(bp));
  return w;
}

struct BackwardWork {
  const BackwardProblem* p;
  BackwardPlan plan;
  RowStats stats;   // [B, Hq, Lq] each
  float* mask_grad_partials;  // [blocks][parts][block floats], when parts > 1
  float* scratch;  // [threads][per_thread]
};

// Flat rows [row_begin, row_end) of a pair: block `item / pairs` of pair `item % pairs`, the
// last blocks first (under a causal mask they attend the most keys).
struct RowBlock {
  int32_t b, kv_head, row_begin, row_end;
};
RowBlock row_block(const BackwardWork& w, int32_t item) {
  const int32_t kv_heads = w.p->forward.kv_heads;
  const int32_t block = w.plan.row_blocks - 1 - item / w.plan.pairs, pair = item % w.plan.pairs;
  const int32_t row_begin = block * w.plan.block_rows;
  return {pair / kv_heads, pair % kv_heads, row_begin, std::min(w.plan.rows, row_begin + w.plan.block_rows)};
}

void row_stats_item(void* context, int32_t item, int32_t thread) {
  const BackwardWork& w = *static_cast<const BackwardWork*>(context);
  const RowBlock rb = row_block(w, item);
  sdpa_f32_bwd_row_stats_4x64__wasmsimd(*w.p, rb.b, rb.kv_head, rb.row_begin, rb.row_end, w.stats,
                                        w.scratch + static_cast<size_t>(thread) * w.plan.per_thread);
}

void dkdv_item(void* context, int32_t item, int32_t thread) {
  const BackwardWork& w = *static_cast<const BackwardWork*>(context);
  const Problem& p = w.p->forward;
  const int32_t pair = item / w.plan.key_blocks, block = item % w.plan.key_blocks;
  sdpa_f32_bwd_dkdv_ukernel_4x64__wasmsimd(*w.p, pair / p.kv_heads, pair % p.kv_heads, block * kBackwardKeyTile,
                                           w.stats, w.scratch + static_cast<size_t>(thread) * w.plan.per_thread);
}

void fused_item(void* context, int32_t pair, int32_t thread) {
  const BackwardWork& w = *static_cast<const BackwardWork*>(context);
  const Problem& p = w.p->forward;
  sdpa_f32_bwd_fused_ukernel_4x64__wasmsimd(*w.p, pair / p.kv_heads, pair % p.kv_heads, w.stats,
                                            w.scratch + static_cast<size_t>(thread) * w.plan.per_thread);
}

void dq_item(void* context, int32_t item, int32_t thread) {
  const BackwardWork& w = *static_cast<const BackwardWork*>(context);
  const RowBlock rb = row_block(w, item);
  sdpa_f32_bwd_dq_ukernel_4x64__wasmsimd(*w.p, rb.b, rb.kv_head, rb.row_begin, rb.row_end, w.stats,
                                         w.scratch + static_cast<size_t>(thread) * w.plan.per_thread);
}

// Block = ((b·blocks_h + h)·blocks_q + row block)·blocks_k + key block, over the plan's
// mask_grad_blocks (an axis of one block is whole: index 0, its full range), all its row tiles
// summed into d_mask; mask_grad_item points a part elsewhere.
MaskGradBlock mask_grad_block(const BackwardWork& w, int32_t index) {
  const Problem& p = w.p->forward;
  const int32_t* blocks = w.plan.mask_grad_blocks;
  const int32_t key_block = index % blocks[3], row_block = index / blocks[3] % blocks[2];
  const int32_t h = index / (blocks[3] * blocks[2]) % blocks[1], b = index / (blocks[3] * blocks[2] * blocks[1]);
  const int64_t sq = p.mask_stride_q, sk = p.mask_stride_k;
  MaskGradBlock block;
  block.b = b;
  block.h = h;
  block.row_begin = sq != 0 ? row_block * kMaskGradRows : 0;
  block.row_end = sq != 0 ? std::min(p.q_len, block.row_begin + kMaskGradRows) : p.q_len;
  block.key_begin = sk != 0 ? key_block * kMaskGradKeys : 0;
  block.key_end = sk != 0 ? std::min(p.kv_len, block.key_begin + kMaskGradKeys) : p.kv_len;
  block.tile_begin = 0;
  block.tile_end = mask_grad_tiles(p, block.row_end - block.row_begin);
  block.out = w.p->d_mask + b * p.mask_stride_b + h * p.mask_stride_h + block.row_begin * sq + block.key_begin * sk;
  block.out_q = sq, block.out_k = sk;
  return block;
}

// Where part `part` of block `index` is summed: its partial, dense [rows or 1][block keys].
float* mask_grad_partial(const BackwardWork& w, int32_t index, int32_t part) {
  return w.mask_grad_partials + (static_cast<size_t>(index) * w.plan.mask_grad_parts + part) * w.plan.mask_grad_block_floats;
}

// Item = block · parts + part: the block's whole sum into d_mask (one part), or the part's run
// of its row tiles into its partial.
void mask_grad_item(void* context, int32_t item, int32_t thread) {
  const BackwardWork& w = *static_cast<const BackwardWork*>(context);
  const Problem& p = w.p->forward;
  const int32_t parts = w.plan.mask_grad_parts, index = item / parts, part = item % parts;
  MaskGradBlock block = mask_grad_block(w, index);
  if (parts > 1) {
    const int64_t tiles = block.tile_end, per_part = (tiles + parts - 1) / parts;
    block.tile_begin = std::min(tiles, part * per_part);
    block.tile_end = std::min(tiles, block.tile_begin + per_part);
    block.out = mask_grad_partial(w, index, part);
    block.out_q = p.mask_stride_q != 0 ? w.plan.mask_grad_block_keys : 0;
    block.out_k = p.mask_stride_k != 0 ? 1 : 0;
  }
  sdpa_f32_bwd_dmask_ukernel_4x64__wasmsimd(*w.p, block, w.stats,
                                            w.scratch + static_cast<size_t>(thread) * w.plan.per_thread);
}

// Block `index`'s elements of d_mask: its parts' partials added in part order.
void mask_grad_sum_item(void* context, int32_t index, int32_t /*thread*/) {
  const BackwardWork& w = *static_cast<const BackwardWork*>(context);
  const Problem& p = w.p->forward;
  const MaskGradBlock block = mask_grad_block(w, index);
  const int32_t rows = p.mask_stride_q != 0 ? block.row_end - block.row_begin : 1;
  const int32_t keys = p.mask_stride_k != 0 ? block.key_end - block.key_begin : 1;
  for (int32_t i = 0; i < rows; i++) {
    for (int32_t j = 0; j < keys; j++) {
      const int64_t at = i * w.plan.mask_grad_block_keys + j;
      float sum = mask_grad_partial(w, index, 0)[at];
      for (int32_t part = 1; part < w.plan.mask_grad_parts; part++) sum += mask_grad_partial(w, index, part)[at];
      block.out[i * block.out_q + j * block.out_k] = sum;
    }
  }
}

// d_sinks[h] = -Σ_{b,i} p_sink·D_i (src/sdpa-backward.h), p_sink = exp((sink_h - shift_i) - log_sum_i)
// rebuilt from the RowStats as every p_j is (min 0: p <= 1). A head without a sink (-inf) gets
// 0; a row where p_sink is 0 (flushed by a far larger maximum) or that has nothing at all
// (shift = -inf) adds nothing, not 0·D (D is NaN when dO is); nor does a row whose output O_i
// is all zeros (every row with nothing to attend, whose p_sink is 1): its D = Σ_j p_j·dp_j is 0,
// though dO_i·O_i is NaN where dO_i holds NaN or Inf, which must not reach d_sinks from a row
// that attends nothing.
// B·Lq terms per head, summed in double in (b, i) order on one thread: O(B·Hq·Lq), next to the
// O(B·Hq·Lq·Lk·E) of the rest.
void sink_gradient(const BackwardProblem& bp, const RowStats& stats) {
  const Problem& p = bp.forward;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int32_t h = 0; h < p.q_heads; h++) {
    double sum = 0.0;
    for (int32_t b = 0; b < p.batch && p.sinks[h] != kNegInf; b++) {
      for (int32_t i = 0; i < p.q_len; i++) {
        const int64_t row = (static_cast<int64_t>(b) * p.q_heads + h) * p.q_len + i;
        if (stats.shift[row] == kNegInf) continue;
        const float* o = p.output + b * p.o_stride_b + h * p.o_stride_h + static_cast<int64_t>(i) * p.o_stride_l;
        if (std::all_of(o, o + p.value_dim, [](float x) { return x == 0.0f; })) continue;
        const double x = (static_cast<double>(p.sinks[h]) - stats.shift[row]) - stats.log_sum[row];
        const double p_sink = std::exp(std::min(x, 0.0));  // NaN stays NaN
        if (p_sink != 0.0) sum -= p_sink * stats.delta[row];
      }
    }
    bp.d_sinks[h] = static_cast<float>(sum);
  }
}

}  // namespace

int32_t backward_mask_grad_parts(const BackwardProblem& p) { return plan_backward(p, 1).mask_grad_parts; }

uint64_t backward_scratch_floats(const BackwardProblem& p, int32_t threads) {
  const BackwardPlan w = plan_backward(p, threads);
  return 3 * w.stats_floats + w.mask_grad_partial_floats + w.per_thread * static_cast<uint64_t>(threads);
}

Status backward(const BackwardProblem& p, float* scratch, uint64_t scratch_size, ThreadPool* pool) {
  const Status status = validate_backward(p);
  if (status != Status::kOk) return status;
  const int32_t threads = pool != nullptr ? pool->threads() : 1;
  if (scratch == nullptr || scratch_size < backward_scratch_floats(p, threads)) return Status::kBadScratch;
  BackwardWork w{&p, plan_backward(p, threads), {}, nullptr, nullptr};
  w.stats = {scratch, scratch + w.plan.stats_floats, scratch + 2 * w.plan.stats_floats};
  w.mask_grad_partials = scratch + 3 * w.plan.stats_floats;
  w.scratch = w.mask_grad_partials + w.plan.mask_grad_partial_floats;
  run_tasks(pool, w.plan.pairs * w.plan.row_blocks, row_stats_item, &w);
  if (p.d_sinks != nullptr) sink_gradient(p, w.stats);
  if (w.plan.fused) {
    run_tasks(pool, w.plan.pairs, fused_item, &w);
  } else {
    run_tasks(pool, w.plan.pairs * w.plan.key_blocks, dkdv_item, &w);
    run_tasks(pool, w.plan.pairs * w.plan.row_blocks, dq_item, &w);
  }
  if (p.d_mask != nullptr) {
    const int32_t* blocks = w.plan.mask_grad_blocks;
    const int32_t block_count = blocks[0] * blocks[1] * blocks[2] * blocks[3];
    run_tasks(pool, block_count * w.plan.mask_grad_parts, mask_grad_item, &w);
    if (w.plan.mask_grad_parts > 1) run_tasks(pool, block_count, mask_grad_sum_item, &w);
  }
  return Status::kOk;
}

}  // namespace sdpa
