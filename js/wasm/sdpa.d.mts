// Types of the Emscripten-generated factory (dist/wasm/sdpa.mjs). Emscripten 3.1.6 cannot
// emit these (no --emit-tsd), so they are written by hand from src/bindings/embind.cc.

/**
 * Mirrors ProblemDesc in src/bindings/embind.cc: addresses are byte offsets in the heap. The
 * module reads it from its argument block (js/kernel-args.ts writes it there): the functions
 * below take the block's address.
 */
export interface ProblemDesc {
  batch: number; qHeads: number; kvHeads: number; qLen: number; kvLen: number;
  headDim: number; valueDim: number;
  /** sdpa::KvType: 0 float32, 1 float16 (key/value hold IEEE halves), 2 float16 without Inf/NaN, 3 bfloat16. */
  kvType: number;
  query: number; key: number; value: number; output: number; weights: number;
  mask: number; causalOffsets: number; keyLengths: number;
  /** [B, Hq, Lq] each row's log-sum-exp, written by forward() (0: not wanted). */
  logsumexp: number;
  /** sdpa::Problem::key_starts: [B] first valid keys, 0 for none. */
  keyStarts: number;
  /** sdpa::Problem::sinks: [Hq] sink logits, 0 for none. */
  sinks: number;
  /** sdpa::Problem::alibi_slopes: [Hq] or [B, Hq] ALiBi slopes, 0 for none. */
  alibiSlopes: number;
  /** sdpa::Problem::alibi_stride_b: 0 for [Hq] slopes, Hq for [B, Hq]. */
  alibiStrideB: number;
  /** sdpa::Problem::dropout_threshold: 0 for no dropout, else the uint32 below which a probability is dropped. */
  dropoutThreshold: number;
  /** sdpa::Problem::dropout_seed: a uint32. */
  dropoutSeed: number;
  /** sdpa::Problem::dropout_batch_base: the problem's batch 0 in the dropout mask's batches. */
  dropoutBatchBase: number;
  /** sdpa::Problem::dropout_head_base: the problem's query head 0 in the dropout mask's heads. */
  dropoutHeadBase: number;
  /** sdpa::Problem::dropout_row_base: the problem's query row 0 in the dropout mask's rows. */
  dropoutRowBase: number;
  qStrideB: number; qStrideH: number; qStrideL: number;
  kStrideB: number; kStrideH: number; kStrideL: number;
  vStrideB: number; vStrideH: number; vStrideL: number;
  oStrideB: number; oStrideH: number; oStrideL: number;
  maskKind: number; maskStrideB: number; maskStrideH: number; maskStrideQ: number; maskStrideK: number;
  scale: number; softcap: number; causal: boolean; causalOffset: number;
  /** sdpa::Problem::sliding_window: 0 for none, else W >= 1 (causal). */
  slidingWindow: number;
  /** K/V come from main memory (a KV cache's storage): read them in memory order. */
  readKvInOrder: boolean;
}

/** Mirrors BackwardDesc in src/bindings/embind.cc: the backward pass's own operands (an argument block too). */
export interface BackwardDesc {
  logsumexp: number; gradOutput: number; dQuery: number; dKey: number; dValue: number;
  goStrideB: number; goStrideH: number; goStrideL: number;
  dqStrideB: number; dqStrideH: number; dqStrideL: number;
  dkStrideB: number; dkStrideH: number; dkStrideL: number;
  dvStrideB: number; dvStrideH: number; dvStrideL: number;
  /** The float mask's gradient, laid out as the mask: 0 for none. */
  dMask: number;
  /** The sinks' gradient [Hq]: 0 for none. */
  dSinks: number;
  /** Parts of each mask-gradient block's sum: 0 for the kernel's choice (a slice passes the whole call's, maskGradParts). */
  maskGradParts: number;
}

/** One argument block of the module: where it is and each field's byte offset in it. */
export interface ArgumentBlock {
  address: number;
  fields: { name: string; offset: number; isFloat: boolean }[];
}

export interface SdpaModule {
  HEAPU8: Uint8Array;
  HEAPU16: Uint16Array;
  HEAP32: Int32Array;
  HEAPF32: Float32Array;
  _malloc(bytes: number): number;
  _free(address: number): void;
  /** The argument blocks' addresses and field offsets (js/kernel-args.ts). */
  argumentLayout(): { problem: ArgumentBlock; backward: ArgumentBlock };
  // Below, `desc` and `grad` are the addresses of the ProblemDesc and BackwardDesc blocks,
  // written right before the call.
  /** Floats of scratch forward() needs on `threads` threads. */
  scratchFloats(desc: number, threads: number): number;
  /** Status 0 = ok. threads > 1 only in the threaded build (sdpa-mt). */
  forward(desc: number, scratch: number, scratchFloats: number, threads: number): number;
  /** Floats of scratch backward() needs on `threads` threads. */
  backwardScratchFloats(desc: number, grad: number, threads: number): number;
  /** dQ, dK, dV (and dMask, dSinks if given) of `desc` (its output = the forward's O): a status (0 = ok). */
  backward(desc: number, grad: number, scratch: number, scratchFloats: number, threads: number): number;
  /** The parts backward() splits each mask-gradient block's sum into (src/sdpa-backward.h backward_mask_grad_parts). */
  maskGradParts(desc: number, grad: number): number;
  // Packed sequences (src/sdpa-packed.h): `desc` is the whole packed problem (batch 1, qLen Tq,
  // kvLen Tk), qStarts and kStarts the addresses of [S + 1] int32 each.
  /** Floats of scratch forward_packed() needs on `threads` threads (reads the starts). */
  packedScratchFloats(desc: number, sequences: number, qStarts: number, kStarts: number, threads: number): number;
  /** Every sequence's output rows (and lse [Hq, Tq]): a status (0 = ok). */
  forwardPacked(desc: number, sequences: number, qStarts: number, kStarts: number, scratch: number,
    scratchFloats: number, threads: number): number;
  /** Floats of scratch backward_packed() needs on `threads` threads. */
  packedBackwardScratchFloats(desc: number, grad: number, sequences: number, qStarts: number, kStarts: number,
    threads: number): number;
  /** dQ, dK, dV (and dSinks; each sequence's [S, Hq] at dSinksBySequence unless 0) of every sequence: a status (0 = ok). */
  backwardPacked(desc: number, grad: number, sequences: number, qStarts: number, kStarts: number,
    dSinksBySequence: number, scratch: number, scratchFloats: number, threads: number): number;
  /** Whether forward() reads K/V in place (the decode path: no packing). */
  readsKeysInPlace(desc: number): boolean;
  /** Whether forward() of query heads [first, first + count) of one KV head's group, alone, gives their rows the whole call's bits (src/sdpa.h). */
  queryHeadsKeepBits(desc: number, first: number, count: number): boolean;
  /** The least row count >= atLeast (< Lq) whose slices of every query head, each alone, give their rows the whole call's bits, or 0 (src/sdpa.h least_query_rows). */
  leastQueryRows(desc: number, atLeast: number): number;
  /** Streamed decoding (src/sdpa.h): keys per segment, the same for every problem. */
  segmentKeys(): number;
  /** Segments of a single-(batch, KV head) decode problem: ceil(Lk / segmentKeys()). */
  segmentCount(desc: number): number;
  /** Floats of scratch one SegmentStream.forward() call (C++ forward_segment) needs. */
  segmentScratchFloats(desc: number): number;
  /** Floats of partial state for all segments together. */
  segmentPartialsFloats(desc: number): number;
  /** A streamed decode of `desc`, one (batch, KV head); owns C++ memory: call delete(). */
  SegmentStream: new (desc: number) => SegmentStream;
  /**
   * Rows [B, H, L, D] from `src` to `dst` (byte addresses; strides in elements; types are
   * sdpa::KvType values), converting between float32, float16 and bfloat16 (src/kv-cache.h). Status 0 = ok.
   */
  copyRows(dst: number, dstType: number, dstB: number, dstH: number, dstL: number, src: number, srcType: number,
    srcB: number, srcH: number, srcL: number, batch: number, heads: number, rows: number, dim: number): number;
  /**
   * Whether any of `runs` runs of `runLength` halves (the first at byte address `first`, each
   * `runStride` halves after the one before) holds an Inf or NaN pattern (src/kv-cache.h).
   */
  halvesHaveInfNaN(first: number, runStride: number, runs: number, runLength: number): boolean;
  /**
   * Widens the `count` halves stored at byte address `block + 2·count` into `count` floats at
   * `block` (the upper half of the block, in place; exact), for a Float16Array copied in as raw halves.
   */
  widenHalvesInPlace(block: number, count: number): void;
  statusName(status: number): string;
  /** Bytes of the heap in malloc'd blocks (for leak tests). */
  heapBytesInUse(): number;
  /** Threaded build only: Emscripten's worker pool. */
  PThread?: { unusedWorkers: unknown[]; terminateAllThreads(): void };
}

/** Mirrors SegmentStream in src/bindings/embind.cc. Statuses: 0 = ok. */
export interface SegmentStream {
  /**
   * Moves to another (batch, KV head): its rows of Q, output, mask, offsets, key lengths and starts, its query heads' sinks and ALiBi slopes,
   * and its batch and first query head in the dropout mask.
   */
  setPair(query: number, output: number, mask: number, causalOffsets: number, keyLengths: number, keyStarts: number,
    sinks: number, alibiSlopes: number, dropoutBatchBase: number, dropoutHeadBase: number): void;
  /** One segment, its keys alone at `key` and `value`; writes its part of `partials`. */
  forward(segment: number, key: number, value: number, partials: number, scratch: number, scratchFloats: number): number;
  /** The output rows of the (batch, KV head) from every segment's partials. */
  merge(partials: number): number;
  delete(): void;
}

export interface ModuleOverrides {
  wasmBinary?: ArrayBuffer | Uint8Array;
  locateFile?: (path: string, prefix: string) => string;
  /** The threaded builds: the glue's URL, which each pool worker imports (default: next to its worker script). */
  mainScriptUrlOrBlob?: string;
}

export default function createSdpaModule(overrides?: ModuleOverrides): Promise<SdpaModule>;
