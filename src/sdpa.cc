// Validation and dispatch of the forward pass (src/sdpa.h).
#include "sdpa.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/sdpa-kernels.h"
#include "parallel/thread-pool.h"
#include "parallel/work-split.h"
#include "tiles.h"

namespace sdpa {

const char* status_name(Status status) {
  switch (status) {
    case Status::kOk: return "ok";
    case Status::kBadShape: return "bad shape";
    case Status::kNullPointer: return "null pointer";
    case Status::kBadScale: return "scale is not finite";
    case Status::kBadSoftcap: return "softcap is negative or not finite";
    case Status::kBadKeyLength: return "key length or key start outside [0, Lk]";
    case Status::kBadStride: return "negative stride";
    case Status::kBadScratch: return "scratch missing or too small";
    case Status::kBadKvType: return "unknown key/value element type";
    case Status::kBadMaskKind: return "unknown mask kind";
    case Status::kBadSegment: return "not a single (batch, KV head) decode, or no such segment";
    case Status::kBadWindow: return "sliding window negative, or without causal";
    case Status::kBadSink: return "sink is NaN or +inf";
    case Status::kBadAlibi: return "ALiBi slope is NaN, negative or above 2^64";
    case Status::kBadDropout: return "dropout batch, head or row base negative, or base + batches (heads, rows) - 1 past INT32_MAX";
    case Status::kBadPacking: return "packed sequences: bad starts, or an option packing does not take";
    case Status::kBadMaskGrad: return "mask gradient asked for a mask that is not float";
  }
  return "unknown status";
}

namespace {
bool fits_32_bit_indices(const Problem& p);
}  // namespace

bool alibi_slopes_valid(const Problem& p, int32_t rows) {
  if (p.alibi_slopes == nullptr) return true;
  if (p.alibi_stride_b == 0) rows = 1;
  for (int64_t n = 0; n < static_cast<int64_t>(rows) * p.q_heads; n++) {
    const float slope = p.alibi_slopes[n / p.q_heads * p.alibi_stride_b + n % p.q_heads];
    if (!(slope >= 0.0f && slope <= kMaxAlibiSlope)) return false;
  }
  return true;
}

Status validate(const Problem& p) {
  if (p.batch < 1 || p.q_heads < 1 || p.kv_heads < 1 || p.q_len < 1 || p.kv_len < 1 ||
      p.head_dim < 1 || p.value_dim < 1 || p.q_heads % p.kv_heads != 0 || !fits_32_bit_indices(p)) {
    return Status::kBadShape;
  }
  if (p.query == nullptr || p.key == nullptr || p.value == nullptr || p.output == nullptr ||
      (p.mask_kind != MaskKind::kNone && p.mask == nullptr)) {
    return Status::kNullPointer;
  }
  const int64_t strides[] = {p.q_stride_b, p.q_stride_h, p.q_stride_l, p.k_stride_b,
                             p.k_stride_h, p.k_stride_l, p.v_stride_b, p.v_stride_h,
                             p.v_stride_l, p.o_stride_b, p.o_stride_h, p.o_stride_l,
                             p.mask_stride_b, p.mask_stride_h, p.mask_stride_q, p.mask_stride_k,
                             p.alibi_stride_b};
  for (int64_t stride : strides) {
    if (stride < 0) return Status::kBadStride;
  }
  if (!is_known(p.kv_type)) return Status::kBadKvType;
  if (p.mask_kind != MaskKind::kNone && p.mask_kind != MaskKind::kFloat && p.mask_kind != MaskKind::kBool) {
    return Status::kBadMaskKind;
  }
  if (!std::isfinite(p.scale)) return Status::kBadScale;
  if (!(p.softcap >= 0.0f) || !std::isfinite(p.softcap)) return Status::kBadSoftcap;
  if (p.sliding_window < 0 || (p.sliding_window > 0 && !p.causal)) return Status::kBadWindow;
  for (int32_t h = 0; p.sinks != nullptr && h < p.q_heads; h++) {
    if (std::isnan(p.sinks[h]) || p.sinks[h] == std::numeric_limits<float>::infinity()) return Status::kBadSink;
  }
  if (!alibi_slopes_valid(p, p.batch)) return Status::kBadAlibi;
  // The call's batch, head and row indices base + b, base + h and base + i are int32
  // (src/kernels/dropout.h, dropout_row).
  if (p.dropout_batch_base < 0 || p.dropout_batch_base > INT32_MAX - (p.batch - 1) || p.dropout_head_base < 0 ||
      p.dropout_head_base > INT32_MAX - (p.q_heads - 1) || p.dropout_row_base < 0 ||
      p.dropout_row_base > INT32_MAX - (p.q_len - 1)) {
    return Status::kBadDropout;
  }
  for (const int32_t* bounds : {p.key_lengths, p.key_starts}) {  // per-batch key indices in [0, Lk]
    for (int32_t b = 0; bounds != nullptr && b < p.batch; b++) {
      if (bounds[b] < 0 || bounds[b] > p.kv_len) return Status::kBadKeyLength;
    }
  }
  return Status::kOk;
}

namespace {

// How forward() splits the work. Items are calls of the kernel (src/kernels/sdpa-kernels.h).
//   Prefill (many query rows per KV head): items are (block of flat rows, batch, KV head);
//   each packs its K/V head once. One block per (batch, KV head) on one thread; with more
//   threads, enough blocks for about kItemsPerThread items per thread (uneven causal blocks
//   balance out), never under kMinBlockRows rows (packing must stay small next to compute).
//   Where that gives a pair several blocks and there are no more pairs than threads (one KV
//   head of a long prompt, a slice of one: js/slices.ts), a pass of its own packs each pair
//   once, split by keys over the threads, into a buffer every block of the pair reads: no
//   more memory than each thread packing for itself. The packed bytes are the same either way.
//   Decode (at most kDecodeMaxRowTiles row tiles per KV head, src/tiles.h: e.g. Lq = 1 with
//   up to 32 query heads per KV head): K/V are read in place, once, and the keys are split
//   into segments of kSegmentKeys (split-K) whose partial (m, l, o) are merged afterwards,
//   every row tile of a segment computed while its keys are in cache. The segments
//   depend on Lk only, never on the thread count, so results are bitwise identical for any
//   number of threads. Weights, which need each row's final (m, l), are a third pass over the
//   same segments after the merge (the output has the same bits with or without them).
constexpr int32_t kMinBlockRows = 16;
constexpr int32_t kItemsPerThread = 4;
constexpr int32_t kSegmentKeys = 512;
static_assert(kSegmentKeys % kKeyTile == 0, "segments start on a key tile");

// Sizes within kMaxCount and kMaxHeadDim (sdpa.h).
bool fits_32_bit_indices(const Problem& p) {
  const int64_t segments = (static_cast<int64_t>(p.kv_len) + kSegmentKeys - 1) / kSegmentKeys;
  return p.q_len <= kMaxCount && p.kv_len <= kMaxCount && p.head_dim <= kMaxHeadDim &&
         p.value_dim <= kMaxHeadDim && static_cast<int64_t>(p.batch) * p.q_heads <= kMaxCount &&
         static_cast<int64_t>(p.q_heads / p.kv_heads) * p.q_len <= kMaxCount &&
         static_cast<int64_t>(p.batch) * p.kv_heads * segments <= kMaxCount;
}

struct WorkPlan {
  int32_t pairs;         // B·Hkv
  int32_t rows;          // flat rows per pair: (Hq / Hkv)·Lq
  bool in_place;         // decode: read K/V in place
  int32_t segments;      // key segments per pair (> 1: split-K)
  int32_t blocks;        // row blocks per pair (prefill)
  int32_t block_rows;    // a multiple of kQueryTile
  bool shares_packing;   // prefill: each pair packed once for its blocks (a pass before them)
  int32_t pack_chunks;   // with shares_packing: items packing one pair, each a range of keys
  uint64_t per_thread;      // kernel scratch per thread
  uint64_t pair_packed;     // with shares_packing: floats of one pair's packed K/V (+ 4 to align)
  uint64_t partial_floats;  // per (pair, segment): the row tiles' partial state
  bool split_weights;       // split-K with weights: the merge keeps each row's (m, l)
};

WorkPlan plan_work(const Problem& p, int32_t threads) {
  WorkPlan w{};
  w.pairs = p.batch * p.kv_heads;
  w.rows = p.q_heads / p.kv_heads * p.q_len;
  const int32_t row_tiles = (w.rows + kQueryTile - 1) / kQueryTile;
  w.in_place = row_tiles <= kDecodeMaxRowTiles;
  w.segments = w.in_place ? (p.kv_len + kSegmentKeys - 1) / kSegmentKeys : 1;
  w.blocks = 1;
  if (w.segments == 1 && threads > 1) {
    const int32_t wanted = (kItemsPerThread * threads + w.pairs - 1) / w.pairs;
    w.blocks = std::max(1, std::min(wanted, w.rows / kMinBlockRows));
  }
  w.block_rows = round_up((w.rows + w.blocks - 1) / w.blocks, kQueryTile);
  w.blocks = (w.rows + w.block_rows - 1) / w.block_rows;
  w.shares_packing = !w.in_place && w.blocks > 1 && w.pairs <= threads;
  w.pack_chunks = w.shares_packing ? threads / w.pairs : 0;
  w.per_thread = sdpa_f32_fwd_4x512__wasmsimd_scratch(p, w.in_place         ? KvReading::kInPlace
                                                         : w.shares_packing ? KvReading::kPackedElsewhere
                                                                            : KvReading::kPacksIntoScratch);
  w.pair_packed = w.shares_packing ? sdpa_f32_fwd_4x512__wasmsimd_packed_floats(p) + 4 : 0;
  w.partial_floats = static_cast<uint64_t>(row_tiles) * sdpa_f32_fwd_4x512__wasmsimd_partial_floats(p);
  w.split_weights = w.segments > 1 && p.weights != nullptr;
  return w;
}

uint64_t partials_total(const WorkPlan& w) {
  return w.segments > 1 ? static_cast<uint64_t>(w.pairs) * w.segments * w.partial_floats : 0;
}

// Floats of the rows' final (m, l) that split-K weights need: [pairs][rows][2], far less
// than the partials. Reserved for any split-K, weights or not: scratch_floats() must not
// depend on the pointers (callers size the scratch before the addresses are known).
uint64_t row_stats_total(const WorkPlan& w) {
  return w.segments > 1 ? static_cast<uint64_t>(w.pairs) * w.rows * 2 : 0;
}

uint64_t shared_packing_total(const WorkPlan& w) { return static_cast<uint64_t>(w.pairs) * w.pair_packed; }

// The kernel call for one split-K segment of a pair's keys, all of its rows; `partials` is
// the pair's [segments][partial_floats] (null for the weights pass). (b, kv_head) are set by
// the caller.
KernelWork segment_work(const Problem& p, const WorkPlan& w, int32_t segment, float* partials) {
  KernelWork kw;
  kw.row_begin = 0, kw.row_end = w.rows;
  kw.key_begin = segment * kSegmentKeys;
  kw.key_end = std::min(p.kv_len, kw.key_begin + kSegmentKeys);
  kw.partials = partials == nullptr ? nullptr : partials + static_cast<size_t>(segment) * w.partial_floats;
  return kw;
}

struct ForwardWork {
  const Problem* p;
  WorkPlan plan;
  float* scratch;    // [threads][per_thread]
  float* partials;   // [pairs][segments][partial_floats]
  float* row_stats;  // [pairs][rows][2]: (m, l) of each row, with split_weights
  float* packed;     // [pairs][pair_packed]: each pair's K/V, with shares_packing
};

// Pair `pair`'s packed K/V in fw.packed, on a 16-byte boundary.
float* pair_packed(const ForwardWork& fw, int32_t pair) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(fw.packed + static_cast<size_t>(pair) * fw.plan.pair_packed);
  return reinterpret_cast<float*>((at + 15) & ~uintptr_t{15});
}

// With shares_packing: chunk item % pack_chunks of pair item / pack_chunks's keys, the keys
// any of the pair's rows attends split in whole key groups.
void pack_item(void* context, int32_t item, int32_t /*thread*/) {
  const ForwardWork& fw = *static_cast<const ForwardWork*>(context);
  const Problem& p = *fw.p;
  const int32_t pair = item / fw.plan.pack_chunks, chunk = item % fw.plan.pack_chunks;
  const int32_t b = pair / p.kv_heads;
  const int32_t keys = sdpa_f32_fwd_4x512__wasmsimd_packed_keys(p, b, 0, fw.plan.rows);
  const int32_t chunk_keys = round_up((keys + fw.plan.pack_chunks - 1) / fw.plan.pack_chunks, kKeyGroup);
  const int64_t begin = static_cast<int64_t>(chunk) * chunk_keys;
  const int32_t end = static_cast<int32_t>(std::min<int64_t>(keys, begin + chunk_keys));
  if (begin >= end) return;
  sdpa_f32_fwd_pack_4x512__wasmsimd(p, b, pair % p.kv_heads, static_cast<int32_t>(begin), end, pair_packed(fw, pair));
}

void forward_item(void* context, int32_t item, int32_t thread) {
  const ForwardWork& fw = *static_cast<const ForwardWork*>(context);
  const Problem& p = *fw.p;
  const WorkPlan& w = fw.plan;
  KernelWork kw;
  int32_t pair;
  if (w.segments > 1) {
    pair = item / w.segments;
    float* pair_partials = fw.partials + static_cast<size_t>(pair) * w.segments * w.partial_floats;
    kw = segment_work(p, w, item % w.segments, pair_partials);
  } else {
    // Last blocks first: under a causal mask they attend the most keys, and handing out the
    // longest items first keeps the threads' finishing times close.
    const int32_t block = w.blocks - 1 - item / w.pairs;
    pair = item % w.pairs;
    kw.row_begin = block * w.block_rows;
    kw.row_end = std::min(w.rows, kw.row_begin + w.block_rows);
    kw.key_begin = 0, kw.key_end = p.kv_len;
    kw.pack = !w.in_place;
    if (w.shares_packing) kw.packed = pair_packed(fw, pair);
  }
  kw.b = pair / p.kv_heads, kw.kv_head = pair % p.kv_heads;
  sdpa_f32_fwd_ukernel_4x512__wasmsimd(p, kw, fw.scratch + static_cast<size_t>(thread) * w.per_thread);
}

float* pair_row_stats(const ForwardWork& fw, int32_t pair) {
  return fw.row_stats == nullptr ? nullptr : fw.row_stats + static_cast<size_t>(pair) * fw.plan.rows * 2;
}

void merge_item(void* context, int32_t pair, int32_t /*thread*/) {
  const ForwardWork& fw = *static_cast<const ForwardWork*>(context);
  const Problem& p = *fw.p;
  sdpa_f32_fwd_merge_partials(p, pair / p.kv_heads, pair % p.kv_heads, fw.plan.rows, fw.plan.segments,
                              fw.partials + static_cast<size_t>(pair) * fw.plan.segments * fw.plan.partial_floats,
                              pair_row_stats(fw, pair));
}

// Split-K weights: the weights of one segment's keys for all of the pair's rows.
void weights_item(void* context, int32_t item, int32_t thread) {
  const ForwardWork& fw = *static_cast<const ForwardWork*>(context);
  const Problem& p = *fw.p;
  const WorkPlan& w = fw.plan;
  const int32_t pair = item / w.segments;
  KernelWork kw = segment_work(p, w, item % w.segments, nullptr);
  kw.b = pair / p.kv_heads, kw.kv_head = pair % p.kv_heads;
  sdpa_f32_fwd_weights_4x512__wasmsimd(p, kw, pair_row_stats(fw, pair),
                                       fw.scratch + static_cast<size_t>(thread) * w.per_thread);
}

// Split-K with weights: one item per pair runs the pair's segments, their merge, then its
// weights, on one thread, so that the weights pass rescores keys the segments have just brought
// into cache. Over all pairs, three passes (segments, merges, weights) re-read the keys from
// main memory: 1.06–1.08× the time of a decode step with weights (MHA 4096 E128) on one
// thread and 1.13× on two (float32 cache), in A/B runs on the AMD EPYC Zen 5 host (family 26,
// model 2); a pool run per pair over its segments took 1.18× on two threads (two waits per
// pair). Parallel over pairs, as the unsplit decode with weights was.
void pair_with_weights_item(void* context, int32_t pair, int32_t thread) {
  const ForwardWork& fw = *static_cast<const ForwardWork*>(context);
  const int32_t segments = fw.plan.segments;
  for (int32_t segment = 0; segment < segments; segment++) forward_item(context, pair * segments + segment, thread);
  merge_item(context, pair, thread);
  for (int32_t segment = 0; segment < segments; segment++) weights_item(context, pair * segments + segment, thread);
}

}  // namespace

bool reads_keys_in_place(const Problem& p) { return plan_work(p, 1).in_place; }

bool query_heads_keep_bits(const Problem& p, int32_t first, int32_t count) {
  const int32_t group = p.q_heads / p.kv_heads;
  if (first < 0 || count < 1 || first > group - count) return false;
  Problem slice = p;
  slice.batch = 1, slice.q_heads = count, slice.kv_heads = 1;
  if (plan_work(slice, 1).in_place != plan_work(p, 1).in_place ||
      sdpa_f32_fwd_4x512__wasmsimd_reads_interleaved(slice) != sdpa_f32_fwd_4x512__wasmsimd_reads_interleaved(p)) {
    return false;
  }
  // Flat rows [first·Lq, (first + count)·Lq) of the group's (64-bit: up to kMaxCount each).
  const int64_t begin = static_cast<int64_t>(first) * p.q_len, end = begin + static_cast<int64_t>(count) * p.q_len;
  return begin % kQueryTile == 0 && (end % kQueryTile == 0 || first + count == group);
}

namespace {

// What query_rows_keep_bits() asks of p whatever the row count: slices of any count keep the
// tiles only if each query head starts on a tile's first row (head g at flat row g·Lq: Lq a
// multiple of kQueryTile, unless the group is one head), and each slice's offset, the batch's
// + r for r up to Lq - 1, is an int32.
bool rows_may_slice(const Problem& p) {
  if (p.q_heads / p.kv_heads > 1 && p.q_len % kQueryTile != 0) return false;
  for (int32_t b = 0; b < (p.causal_offsets != nullptr ? p.batch : 1); b++) {
    const int32_t offset = p.causal_offsets != nullptr ? p.causal_offsets[b] : p.causal_offset;
    if (static_cast<int64_t>(offset) + (p.q_len - 1) > INT32_MAX) return false;
  }
  return true;
}

// The rest, for slices of `rows` rows (a multiple of kQueryTile, below Lq), given rows_may_slice(p):
// slice k of head g starts at flat row g·Lq + k·rows, a tile's first row, and ends at the next
// slice's start or at the head's end, the next head's start or the group's end: the tiles are
// kept. The slices have `rows` rows, the last of each head Lq mod rows: each must take p's path
// and read its keys in p's order.
bool row_slices_take_the_path(const Problem& p, int32_t rows) {
  const bool in_place = plan_work(p, 1).in_place, interleaved = sdpa_f32_fwd_4x512__wasmsimd_reads_interleaved(p);
  for (const int32_t slice_rows : {rows, p.q_len % rows}) {
    if (slice_rows == 0) continue;
    Problem slice = p;
    slice.batch = 1, slice.q_heads = 1, slice.kv_heads = 1, slice.q_len = slice_rows;
    if (plan_work(slice, 1).in_place != in_place || sdpa_f32_fwd_4x512__wasmsimd_reads_interleaved(slice) != interleaved) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool query_rows_keep_bits(const Problem& p, int32_t rows) {
  return rows >= 1 && rows < p.q_len && rows % kQueryTile == 0 && rows_may_slice(p) && row_slices_take_the_path(p, rows);
}

int32_t least_query_rows(const Problem& p, int32_t at_least) {
  if (!rows_may_slice(p)) return 0;
  // The multiples of kQueryTile from at_least up. Few in a row are refused: on the packed path
  // each slice needs more than kDecodeMaxRowTiles tiles, the last too, and while r grows by a
  // tile the last slice's Lq mod r rows fall by a tile per slice before it, so they stay in
  // (0, kDecodeMaxRowTiles] tiles for at most kDecodeMaxRowTiles + 1 steps at a time.
  const int64_t first = (std::max<int64_t>(at_least, 1) + kQueryTile - 1) / kQueryTile * kQueryTile;
  for (int64_t rows = first; rows < p.q_len; rows += kQueryTile) {
    if (row_slices_take_the_path(p, static_cast<int32_t>(rows))) return static_cast<int32_t>(rows);
  }
  return 0;
}

uint64_t scratch_floats(const Problem& p, int32_t threads) {
  const WorkPlan w = plan_work(p, threads);
  return w.per_thread * static_cast<uint64_t>(threads) + partials_total(w) + row_stats_total(w) +
         shared_packing_total(w);
}

Status forward(const Problem& p, float* scratch, uint64_t scratch_size, ThreadPool* pool) {
  const Status status = validate(p);
  if (status != Status::kOk) return status;
  const int32_t threads = pool != nullptr ? pool->threads() : 1;
  if (scratch == nullptr || scratch_size < scratch_floats(p, threads)) return Status::kBadScratch;

  ForwardWork fw{&p, plan_work(p, threads), scratch, nullptr, nullptr, nullptr};
  fw.partials = scratch + fw.plan.per_thread * static_cast<size_t>(threads);
  if (fw.plan.split_weights) fw.row_stats = fw.partials + partials_total(fw.plan);
  if (fw.plan.shares_packing) fw.packed = fw.partials + partials_total(fw.plan) + row_stats_total(fw.plan);
  const int32_t items = fw.plan.pairs * (fw.plan.segments > 1 ? fw.plan.segments : fw.plan.blocks);
  const double multiply_adds = static_cast<double>(p.batch) * p.q_heads * p.q_len * p.kv_len *
                              (p.head_dim + p.value_dim);
  if (multiply_adds < kMinParallelMultiplyAdds) pool = nullptr;
  if (fw.plan.split_weights) {
    run_tasks(pool, fw.plan.pairs, pair_with_weights_item, &fw);
    return Status::kOk;
  }
  if (fw.plan.shares_packing) run_tasks(pool, fw.plan.pairs * fw.plan.pack_chunks, pack_item, &fw);
  run_tasks(pool, items, forward_item, &fw);
  if (fw.plan.segments > 1) run_tasks(pool, fw.plan.pairs, merge_item, &fw);
  return Status::kOk;
}

int32_t segment_keys() { return kSegmentKeys; }

int32_t segment_count(const Problem& p) { return (p.kv_len + kSegmentKeys - 1) / kSegmentKeys; }

uint64_t segment_scratch_floats(const Problem& p) {
  return sdpa_f32_fwd_4x512__wasmsimd_scratch(p, KvReading::kInPlace);
}

uint64_t segment_partials_floats(const Problem& p) {
  return static_cast<uint64_t>(segment_count(p)) * plan_work(p, 1).partial_floats;
}

namespace {

Status check_segmentable(const Problem& p) {
  const Status status = validate(p);
  if (status != Status::kOk) return status;
  if (p.batch != 1 || p.kv_heads != 1 || p.weights != nullptr || !plan_work(p, 1).in_place ||
      (is_16_bit(p.kv_type) && p.read_kv_in_order)) {
    return Status::kBadSegment;
  }
  return Status::kOk;
}

}  // namespace

Status forward_segment(const Problem& p, int32_t segment, float* partials, float* scratch,
                       uint64_t scratch_size) {
  const Status status = check_segmentable(p);
  if (status != Status::kOk) return status;
  if (segment < 0 || segment >= segment_count(p) || partials == nullptr) return Status::kBadSegment;
  if (scratch == nullptr || scratch_size < segment_scratch_floats(p)) return Status::kBadScratch;
  // The same kernel call as forward_item's for this segment, with K/V starting at its keys.
  KernelWork kw = segment_work(p, plan_work(p, 1), segment, partials);
  kw.stored_from = kw.key_begin;
  kw.stored_alone = true;
  sdpa_f32_fwd_ukernel_4x512__wasmsimd(p, kw, scratch);
  return Status::kOk;
}

Status merge_segments(const Problem& p, const float* partials) {
  const Status status = check_segmentable(p);
  if (status != Status::kOk) return status;
  if (partials == nullptr) return Status::kBadSegment;
  sdpa_f32_fwd_merge_partials(p, 0, 0, plan_work(p, 1).rows, segment_count(p), partials);
  return Status::kOk;
}

}  // namespace sdpa
