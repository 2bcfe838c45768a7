// Tile sizes of the forward kernel: the one place they are defined.
#pragma once

namespace sdpa {

// Query rows processed together: 4 rows × 8 keys (2 vectors) = 8 accumulators in Q·Kᵀ,
// 4 rows × 8 value columns = 8 accumulators in P·V. With the operands that is 11-12 live
// v128 registers, under the 16 that V8 gives wasm on x86 (more spill: register tiles of 6×8
// and 8×8 ran 13–35% slower than 4×8 in a micro-kernel, in the team's wasm SIMD measurements).
constexpr int kQueryTile = 4;
// Keys per tile of the online softmax (scores of one tile live in scratch, never Lq×Lk).
// Per tile there is fixed work (row maxima, α, the rescale of the output accumulators), and
// a decode reading K and V from main memory switches between the two streams once per tile:
// all of a tile's K rows are scored before its V rows are read. Every switch costs the
// hardware prefetcher a new ramp: a standalone probe of the decode loop (score K, then P·V
// streaming V, H32 Lk8192 E128 float32) took 1.36× the time of a plain read of the same bytes
// with 128-key tiles, 1.24× with 256 and 1.06× with 512 (1024: the same as 512).
// In alternating A/B runs against 128 (AMD EPYC Zen 4, family 25 model 17), 512 took:
// MHA decode (B1 H32 E128) from the KV cache, float32 0.83–0.85× the time at 8192 keys and
// 0.91–0.94× at 4096, float16 0.81–0.82× at 8192; GQA (Hq32 Hkv8) float32 0.88–0.89×, float16
// 0.95×; prefill
// H12 E64 N = 512 0.96–0.97×, N = 512 causal 0.95×, N = 2048 0.96×, N = 128 0.99× (relaxed
// build: N = 512 0.98×, N = 2048 1.04×). In a noisy phase one run each gave 1.05× for MHA 4096
// and 1.02–1.05× for GQA.
// (Earlier, 128 had beaten 64 by 1.3% at N = 512 and 4% on decode.) At most kSegmentKeys
// (src/sdpa.cc): a decode's segment is whole tiles.
constexpr int kKeyTile = 512;
// Row tiles of a prefill that share each key tile (K and V packed): a block of them takes
// the tile in turn while it is in the core's cache, instead of each row tile streaming all of
// the head's K and V (packed, Lk·(E + Ev8)·4 bytes: 16 MiB at Lk 16384, E 128) through the
// caches. A row tile's own operations and their order are the same either way: the same bits.
// In alternating A/B runs against one row tile at a time (AMD EPYC Zen 5, family 26 model 2,
// 1 MiB L2 per core; medians), with 8: one head of 256 rows on 16384 keys (E 128, causal from
// the end) 0.70–0.93× the time, on two threads (2 heads) 0.70×; 4096 rows on 32768 keys (E 64)
// 0.70×; H12 E64 N 512 and 2048 (K/V in L2 anyway) 1.00–1.01× (two threads 0.97×); 8 MiB of
// K/V (8192 keys, E 128, in L3) 1.02–1.03×. 8 took 0.94–0.96× the time of 4 at 16384 keys
// (E 128) and 32768 (E 64), the same at N 512, 2048 and 8192 keys.
constexpr int kRowTileBlock = 8;
// Keys per packed group: K is stored [Lk/8][E][8] so two loads at consecutive addresses
// give 8 keys at one dim: one pass of the 4×8 Q·Kᵀ micro-kernel.
constexpr int kKeyGroup = 8;
// Value/output columns per P·V block (two vectors); Ev is padded to a multiple of this.
constexpr int kValueBlock = 8;

// Row tiles per KV head up to which forward() reads K/V in place, one segment of keys
// (kSegmentKeys, src/sdpa.cc) at a time for all the rows (each row tile after the first finds the segment in the core's L2),
// instead of packing them once per call as for a prompt: up to 32 query rows per KV head,
// e.g. one token with 14 query heads per KV head, or 8 heads and 4 tokens. In alternating
// A/B runs against 2 (AMD EPYC Zen 4, cold, E64 Hkv2 Lk8192 unless said): 3 or 4 tiles
// 0.52-0.80x the time (float16 0.52-0.56x; E128 Hkv8 Lk4096 0.67-0.73x), 6 tiles 0.71-0.92x,
// 8 tiles 0.81-1.0x, two threads 0.73-0.85x; 16 tiles took 1.02-1.14x (packing wins there).
constexpr int kDecodeMaxRowTiles = 8;

// Keys per tile of the backward pass (src/sdpa-backward.h): the dK/dV items' key blocks and
// the dQ pass's key tiles. Per tile it keeps the scores, dP and probabilities of its rows (4 in
// the dQ pass, 16 in the dK/dV pass), and in the dK/dV pass the block's K, V (packed) and its
// dK, dV accumulators: 2·4·64·(E + Ev) bytes.
constexpr int kBackwardKeyTile = 64;
// The blocks of the float mask's gradient that one work item of the backward writes: up to
// kMaskGradRows query rows × kMaskGradKeys keys of the mask's own elements (an axis the mask
// broadcasts on is whole in every item: its sum stays in one item). Each item packs its keys'
// K and V once per (batch, head) that adds into it and scores them for each of its rows, so the
// packing is 1/kMaskGradRows of the work.
constexpr int kMaskGradRows = 64;
constexpr int kMaskGradKeys = 4 * kBackwardKeyTile;

static_assert(kKeyTile % kKeyGroup == 0, "a key tile is whole key groups");
static_assert(kBackwardKeyTile % kKeyGroup == 0, "a backward key tile is whole key groups");
static_assert(kMaskGradKeys % kBackwardKeyTile == 0, "a mask gradient block is whole backward key tiles");
static_assert(kQueryTile == 4, "the row statistics use one 4-lane vector");

constexpr int round_up(int n, int m) { return (n + m - 1) / m * m; }

}  // namespace sdpa
