// Tile sizes of the forward kernel: the one place they are defined.
#pragma once

namespace sdpa {

// Query rows processed together: 4 rows × 8 keys (2 vectors) = 8 accumulators in Q·Kᵀ,
// 4 rows × 8 value columns = 8 accumulators in P·V. With the operands that is 11-12 live
// v128 registers, under the 16 that V8 gives wasm on x86 (more spill: PERF-NOTES).
constexpr int kQueryTile = 4;
// Keys per tile of the online softmax (scores of one tile live in scratch, never Lq×Lk).
// Per tile there is fixed work (row maxima, α, the rescale of the output accumulators);
// in alternating A/B runs 128 beat 64 by 1.3% at N = 512 and 4% on decode (B1 H32 Lk4096
// E128), and lost 1.5% on GQA decode (Hq32 Hkv8 Lk8192 E128).
constexpr int kKeyTile = 128;
// Keys per packed group: K is stored [Lk/8][E][8] so two loads at consecutive addresses
// give 8 keys at one dim: one pass of the 4×8 Q·Kᵀ micro-kernel.
constexpr int kKeyGroup = 8;
// Value/output columns per P·V block (two vectors); Ev is padded to a multiple of this.
constexpr int kValueBlock = 8;

// Keys per tile of the backward pass (src/sdpa-backward.h): the dK/dV items' key blocks and
// the dQ pass's key tiles. Per tile it keeps scores, dP and probabilities of 4 rows, and in
// the dK/dV pass the block's K, V (packed) and its dK, dV accumulators: 4·64·(E + Ev) bytes.
constexpr int kBackwardKeyTile = 64;

static_assert(kKeyTile % kKeyGroup == 0, "a key tile is whole key groups");
static_assert(kBackwardKeyTile % kKeyGroup == 0, "a backward key tile is whole key groups");
static_assert(kQueryTile == 4, "the row statistics use one 4-lane vector");

constexpr int round_up(int n, int m) { return (n + m - 1) / m * m; }

}  // namespace sdpa
