// sdpaVarlen() and sdpaVarlenBackward(): sequences of different lengths packed back to back,
// without padding (FlashAttention's varlen API, `cu_seqlens`), run by the kernel's packed entry
// points (src/sdpa-packed.h). Everything of these two calls is here: their checks (on top of
// validate.ts's tensor and option checks) and how they run.
//   query [Tq, Hq, E], key [Tk, Hkv, E], value [Tk, Hkv, Ev] → output [Tq, Hq, Ev]
//   sequence s: query rows [cuSeqlensQ[s], cuSeqlensQ[s + 1]), keys [cuSeqlensK[s], cuSeqlensK[s + 1])
// The packed problem is one batch in the 'bshd' layout ([1, T, H, D] is [T, H, D]), so the
// kernel's description is sdpa()'s (describeProblem), with one causal offset per sequence and
// the starts beside it. The scratch's size depends on the starts: they are copied into wasm
// memory for the sizing call alone (withTemporaryInt32), then every block the call needs,
// starts included, is requested at once (refused whole, before any is allocated, past the
// instance's limit) and freed on every path (CallMemory).
import { backwardArg, problemAddressesArg, problemArg } from './kernel-args.js';
import { describeBackward, gradientResult, takeGradients } from './backward.js';
import { type ByteRequest, type CallMemory, runFirstThatFits, type Way, withTemporaryInt32 } from './memory.js';
import { check, collectResult, copySmallInputs, describeProblem, outMayShareInput, smallInputBytes } from './strategies.js';
import { isInt32Array, lengthOf } from './typed-arrays.js';
import type { SdpaBackwardResult, SdpaOptions, SdpaResult } from './types.js';
import type { ProblemDesc } from './wasm/sdpa.mjs';
import {
  type BackwardPlan, checkAlibiOffset, checkAlibiSlopes, checkArraysKept, checkHeadDim, checkOptionNames, checkTensor, completeBackwardPlan, describe,
  floatBytes, type InputData, type Operand, planArrays, planOptions, refuseDetached, type SdpaPlan,
} from './validate.js';

export const VARLEN_OPTION_NAMES = [
  'cuSeqlensQ', 'cuSeqlensK', 'scale', 'softcap', 'isCausal', 'causalOffset', 'slidingWindow', 'sinks', 'alibiSlopes',
  'dropoutP', 'dropoutSeed', 'returnLogSumExp', 'out',
] as const;
export const VARLEN_BACKWARD_OPTION_NAMES = [
  'cuSeqlensQ', 'cuSeqlensK', 'scale', 'softcap', 'isCausal', 'causalOffset', 'slidingWindow', 'sinks', 'alibiSlopes',
  'dropoutP', 'dropoutSeed', 'saved', 'out', 'accumulate',
] as const;

/** A checked sdpaVarlen() call: the whole packed problem as one batch, and where each sequence starts. */
export interface VarlenPlan extends SdpaPlan {
  /** S. */
  sequences: number;
  /** [S + 1] each: checked copies. */
  cuSeqlensQ: Int32Array;
  cuSeqlensK: Int32Array;
}

export interface VarlenBackwardPlan extends BackwardPlan {
  forward: VarlenPlan;
}

type VarlenOptions = Record<string, unknown>;

/** A packed tensor: rank 3, [T, H, D], read as [1, T, H, D] in the 'bshd' layout. */
function checkPacked(fn: string, name: string, t: unknown, axes: string): Operand {
  const operand = checkTensor(fn, name, t, 'bshd');
  if (operand.dims.length !== 3) {
    throw new RangeError(`${fn}: ${name}.dims must be ${axes} (rank 3: the packed sequences' rows, heads, ` +
      `head size), got [${operand.dims.join(', ')}] (rank ${operand.dims.length})`);
  }
  return operand;
}

/**
 * options.cuSeqlensQ or cuSeqlensK (`name`): an Int32Array [S + 1] of where each sequence's
 * `rows` start, 0 first, non-decreasing, `total` last; a checked copy of its elements. `sequences`:
 * the S it must have (cuSeqlensK follows cuSeqlensQ), or null.
 */
function checkStarts(fn: string, name: string, given: unknown, total: number, totalName: string, rows: string,
  sequences: number | null): Int32Array {
  const where = `where each sequence's ${rows} start (0, …, ${totalName} = ${total})`;
  const expected = `an Int32Array [S + 1] of ${where}`;
  if (!isInt32Array(given)) {
    throw new TypeError(given === undefined
      ? `${fn}: options.${name} is required: ${expected}`
      : `${fn}: options.${name} must be ${expected}, got ${describe(given)}`);
  }
  const length = lengthOf(given);
  refuseDetached(fn, `options.${name}`, given, length, `it must hold ${where}`);
  if (sequences === null && length < 2) {
    throw new RangeError(`${fn}: options.${name} must have S + 1 >= 2 entries (at least one sequence), got length ${length}`);
  }
  if (sequences !== null && length !== sequences + 1) {
    throw new RangeError(`${fn}: options.${name} must have the length of options.cuSeqlensQ (S + 1 = ${sequences + 1}), ` +
      `got length ${length}`);
  }
  // A copy of the elements themselves: a getter read later cannot change what was checked.
  const starts = new Int32Array(given);
  if (starts[0] !== 0) throw new RangeError(`${fn}: options.${name}[0] must be 0, got ${starts[0]}`);
  for (let s = 0; s + 1 < starts.length; s++) {
    if (starts[s + 1] < starts[s]) {
      throw new RangeError(`${fn}: options.${name} must be non-decreasing: [${s}] = ${starts[s]} and [${s + 1}] = ` +
        `${starts[s + 1]} would give sequence ${s} ${starts[s + 1] - starts[s]} ${rows}`);
    }
  }
  const last = starts[starts.length - 1];
  if (last !== total) {
    throw new RangeError(`${fn}: options.${name}[${starts.length - 1}] must be ${totalName} = ${total}, got ${last}`);
  }
  return starts;
}

/**
 * Each sequence's causal offset: options.causalOffset (an integer for all, or an Int32Array of
 * one per sequence) or Lk_s − Lq_s (bottom-right), clamped as planOptions() clamps sdpa()'s
 * (beyond [-Lq_s, Lk_s + W - 1] an offset acts as those bounds); null without isCausal. With
 * ALiBi (`alibi`), whose distances are measured from it, causal or not, and not clamped: then an
 * integer in int32's range.
 */
function causalOffsets(fn: string, given: unknown, causal: boolean, alibi: boolean, isCausal: unknown, window: number,
  cuQ: Int32Array, cuK: Int32Array): Int32Array | null {
  const S = cuQ.length - 1;
  // Sequence s's offset before the clamp: the number given, the array's entry, or bottom-right.
  let offsetOf = (s: number) => (cuK[s + 1] - cuK[s]) - (cuQ[s + 1] - cuQ[s]);
  if (given !== undefined) {
    if (!causal && !alibi) {
      const shown = isCausal === undefined ? 'undefined (default false)' : describe(isCausal);
      throw new TypeError(`${fn}: options.causalOffset is only meaningful with options.isCausal: true or ` +
        `options.alibiSlopes, got options.isCausal ${shown}`);
    }
    if (typeof given === 'number') {
      if (!Number.isInteger(given)) throw new RangeError(`${fn}: options.causalOffset must be an integer, got ${given}`);
      if (alibi) checkAlibiOffset(fn, given);
      offsetOf = () => given;  // any integer (clamped below before it is an int32)
    } else if (isInt32Array(given)) {
      const length = lengthOf(given);
      refuseDetached(fn, 'options.causalOffset', given, length, `it must hold one offset per sequence (S = ${S})`);
      if (length !== S) {
        throw new RangeError(`${fn}: options.causalOffset must have one offset per sequence (length S = ${S}), got length ${length}`);
      }
      const offsets = new Int32Array(given);  // a copy: a getter read later cannot change it
      offsetOf = (s) => offsets[s];
    } else {
      throw new TypeError(`${fn}: options.causalOffset must be an integer or an Int32Array of one offset per sequence ` +
        `(length S = ${S}), got ${describe(given)}`);
    }
  }
  if (alibi) return Int32Array.from({ length: S }, (_, s) => offsetOf(s));
  if (!causal) return null;
  return Int32Array.from({ length: S }, (_, s) => clampOffset(offsetOf(s), cuQ, cuK, s, window));
}

function clampOffset(x: number, cuQ: Int32Array, cuK: Int32Array, s: number, window: number): number {
  const Lq = cuQ[s + 1] - cuQ[s], Lk = cuK[s + 1] - cuK[s];
  return Math.min(Math.max(x, -Lq), Lk + Math.max(window - 1, 0));
}

/** The tensors and options of either call; `o` has been through checkOptionNames. */
function planPacked(fn: string, query: unknown, key: unknown, value: unknown, o: VarlenOptions) {
  const q = checkPacked(fn, 'query', query, '[Tq, Hq, E]');
  const k = checkPacked(fn, 'key', key, '[Tk, Hkv, E]');
  const v = checkPacked(fn, 'value', value, '[Tk, Hkv, Ev]');
  const shown = (t: Operand) => `[${t.dims.join(', ')}]`;
  if (k.D !== q.D) throw new RangeError(`${fn}: key.dims ${shown(k)} ([Tk, Hkv, E]) must have the query's head size E = ${q.D}, got ${k.D}`);
  if (v.H !== k.H) throw new RangeError(`${fn}: value.dims ${shown(v)} ([Tk, Hkv, Ev]) must have the key's heads Hkv = ${k.H}, got ${v.H}`);
  if (v.L !== k.L) throw new RangeError(`${fn}: value.dims ${shown(v)} ([Tk, Hkv, Ev]) must have the key's rows Tk = ${k.L}, got ${v.L}`);
  if (q.H % k.H !== 0) {
    throw new RangeError(`${fn}: query heads Hq = ${q.H} must be a multiple of key/value heads Hkv = ${k.H} (grouped-query attention)`);
  }
  checkHeadDim(fn, "the head size E (query.dims' last axis)", q.D);
  checkHeadDim(fn, "the value size Ev (value.dims' last axis)", v.D);
  const cuQ = checkStarts(fn, 'cuSeqlensQ', o.cuSeqlensQ, q.L, 'Tq', 'query rows', null);
  const S = cuQ.length - 1;
  if (o.cuSeqlensK === undefined && k.L !== q.L) {
    throw new RangeError(`${fn}: options.cuSeqlensK is needed: the key's rows Tk = ${k.L} differ from the query's ` +
      `Tq = ${q.L}, so each sequence's keys cannot be its query rows (the default)`);
  }
  const cuK = o.cuSeqlensK === undefined ? cuQ : checkStarts(fn, 'cuSeqlensK', o.cuSeqlensK, k.L, 'Tk', 'keys', S);
  // The score options as sdpa() takes them; the causal offsets are per sequence (below).
  const scoreOptions: SdpaOptions = { ...o };
  delete (scoreOptions as VarlenOptions).cuSeqlensQ;
  delete (scoreOptions as VarlenOptions).cuSeqlensK;
  delete scoreOptions.causalOffset;
  delete scoreOptions.alibiSlopes;  // [Hq] or [S, Hq]: per sequence, below
  const whole = planOptions(fn, 'bshd', q, { kvHeads: k.H, kvLen: k.L, valueDim: v.D, k: k.strides, v: v.strides },
    scoreOptions, { causal: false, causalOffset: 0 });
  const alibi = checkAlibiSlopes(fn, o.alibiSlopes, q.H, { count: S, name: 'sequence', symbol: 'S' });
  const plan: VarlenPlan = {
    ...whole,
    causalOffset: 0,
    causalOffsets: causalOffsets(fn, o.causalOffset, whole.causal, alibi.slopes !== null, o.isCausal, whole.slidingWindow,
      cuQ, cuK),
    alibiSlopes: alibi.slopes, alibiStrideB: alibi.strideB,
    keyData: k.data, valueData: v.data,
    sequences: S, cuSeqlensQ: cuQ, cuSeqlensK: cuK,
  };
  return { plan, q, k, v };
}

/** sdpaVarlen(query, key, value, options). */
export function planVarlen(query: unknown, key: unknown, value: unknown, options: unknown): VarlenPlan {
  const fn = 'sdpaVarlen';
  const { plan } = planPacked(fn, query, key, value, checkOptionNames(fn, options, VARLEN_OPTION_NAMES));
  checkArraysKept(fn, planArrays(plan));
  return plan;
}

/** sdpaVarlenBackward(query, key, value, gradOutput, options). */
export function planVarlenBackward(query: unknown, key: unknown, value: unknown, gradOutput: unknown,
  options: unknown): VarlenBackwardPlan {
  const fn = 'sdpaVarlenBackward';
  const { saved, out, accumulate, ...forwardOptions } = checkOptionNames(fn, options, VARLEN_BACKWARD_OPTION_NAMES);
  const { plan, q, k, v } = planPacked(fn, query, key, value, { ...forwardOptions, returnLogSumExp: true });
  return { ...completeBackwardPlan(fn, plan, q, k, v, gradOutput, { saved, out, accumulate }, 'sdpaVarlen'), forward: plan };
}

/** The sequences' starts, copied into their blocks of the call's request (after its last allocation). */
function copyStarts(memory: CallMemory, p: VarlenPlan, at: { cuSeqlensQ: number; cuSeqlensK: number }): void {
  const { i32 } = memory.heap;
  i32.set(p.cuSeqlensQ, at.cuSeqlensQ >>> 2);
  i32.set(p.cuSeqlensK, at.cuSeqlensK >>> 2);
}

/** The starts' blocks of a request. */
const startsBytes = (p: VarlenPlan) => ({ cuSeqlensQ: p.cuSeqlensQ.byteLength, cuSeqlensK: p.cuSeqlensK.byteLength });

/**
 * One-thread packed problems whose Q, K and V together are at least STREAM_MIN_BYTES (beyond a
 * core's L2 cache) run in chunks of whole sequences (runChunked), as sdpa()'s one-thread prefill
 * is streamed (strategies.ts): each chunk's rows and keys are copied in, computed while they are
 * in the core's cache, and copied out. A chunk is one sequence or more, its Q, K, V and output
 * together at most CHUNK_MAX_BYTES unless one sequence alone is larger. Each sequence is computed
 * alone either way (src/sdpa-packed.h), so the result is bitwise the same. Measured
 * (bench/varlen.mjs, AMD EPYC Zen 5, one thread), time of the whole copy ÷ chunked: the encoder
 * batch (32 sequences of 27–253 tokens, H12 E64) 1.15×, the short one (256 of 4–48) 1.45×. On two
 * threads and more the copy stays whole (runWhole): chunked there, the short batch took 1.25× the
 * time (a pool run per chunk), the encoder one 0.95×; but where the whole copy would pass the
 * memory limits (maxMemoryBytes, the module's 2 GiB) and chunks take less, it runs in chunks on
 * any thread count (CallMemory.fits), each chunk on all the threads.
 */
const STREAM_MIN_BYTES = 2 * 2 ** 20;
const CHUNK_MAX_BYTES = 2 ** 20;

/** Whether a call on `threads` threads with these inputs runs in chunks whether or not it fits whole. */
const chunkedAnyway = (threads: number, inputs: InputData[]) =>
  threads === 1 && inputs.reduce((sum, x) => sum + floatBytes(x), 0) >= STREAM_MIN_BYTES;

/**
 * Chunk sizes (Chunk bytes at most, chunksOf) from CHUNK_MAX_BYTES down, for a chunked call
 * whose chunks would not fit within the memory limits: halves of it down to 16 KiB, then 0 (a
 * sequence a chunk). Any size gives the same bits.
 */
const CHUNK_BYTES_TRIED = [...Array.from({ length: 7 }, (_, i) => CHUNK_MAX_BYTES / 2 ** i), 0];

/** A packed call's whole copy: its blocks, its run, and its run after the chunks were planned. */
interface WholeWay<R> {
  request: ByteRequest;
  run: () => R;
  /** The chunks' planning rewrote the module's argument block, which `run` may expect to hold its description. */
  runAfterChunksPlanned: () => R;
}

/**
 * A packed call (forward or backward): in chunks on one thread when its `inputs` are large;
 * else whole where that fits; else the first chunk size (CHUNK_BYTES_TRIED, `chunking(threads)`
 * plans each) whose blocks fit, or, where none does, whichever way needs the least, the whole
 * copy included (its allocation then refuses, naming its blocks). Chunks give the whole copy's bits.
 */
function runPacked<R>(memory: CallMemory, threads: number, inputs: InputData[],
  chunking: (threads: number) => (chunkBytes: number) => Way<R>, planWholeWay: () => WholeWay<R>): R {
  const chunkings = (t: number) => (function* ways() {
    for (const chunkBytes of CHUNK_BYTES_TRIED) yield chunking(t)(chunkBytes);
  })();
  if (chunkedAnyway(threads, inputs)) return runFirstThatFits(chunkings(1));
  const whole = planWholeWay();
  if (memory.fits(whole.request)) return whole.run();
  return runFirstThatFits((function* ways() {
    yield* chunkings(threads);
    yield { memory, request: whole.request, run: whole.runAfterChunksPlanned };
  })());
}

/** sdpaVarlen(): chunked on one thread when large, or when the whole copy would not fit; else whole. */
export function runVarlen(memory: CallMemory, threads: number, p: VarlenPlan): SdpaResult {
  return runPacked(memory, threads, [p.queryData, p.keyData, p.valueData], (t) => (bytes) => {
    const plan = planChunked(memory, t, p, bytes);
    return { memory, request: plan.request, run: () => runChunked(memory, t, p, plan) };
  }, () => {
    const whole = planWhole(memory, threads, p);
    const run = () => runWhole(memory, threads, p, whole);
    // runWhole only updates the block's addresses (problemAddressesArg): written whole again first.
    return { request: whole.request, run, runAfterChunksPlanned: () => (problemArg(memory.module, whole.desc), run()) };
  });
}

/** A run of whole sequences [first, end) and their rows [q0, q1) and keys [k0, k1). */
interface Chunk {
  first: number;
  end: number;
  q0: number;
  q1: number;
  k0: number;
  k1: number;
}

/**
 * Consecutive sequences, each chunk's bytes within `maxBytes` or one sequence: `rowBytes`
 * per query row and `keyBytes` per key of the blocks the call copies in and out per chunk.
 */
function chunksOf(p: VarlenPlan, rowBytes: number, keyBytes: number, maxBytes: number): Chunk[] {
  const { cuSeqlensQ: cuQ, cuSeqlensK: cuK } = p;
  const chunks: Chunk[] = [];
  let first = 0;
  for (let end = 1; end <= p.sequences; end++) {
    const bytes = (rows: number, keys: number) => rows * rowBytes + keys * keyBytes;
    const next = end < p.sequences ? bytes(cuQ[end + 1] - cuQ[first], cuK[end + 1] - cuK[first]) : Infinity;
    if (next > maxBytes) {  // sequence `end` would not fit: close the chunk here
      chunks.push({ first, end, q0: cuQ[first], q1: cuQ[end], k0: cuK[first], k1: cuK[end] });
      first = end;
    }
  }
  return chunks;
}

/** Row and key element counts of one packed row of each tensor. */
const rowElements = (p: VarlenPlan) => ({
  q: p.qHeads * p.headDim, o: p.qHeads * p.valueDim, k: p.kvHeads * p.headDim, v: p.kvHeads * p.valueDim,
});

/** The most sequences, rows and keys of any chunk (the sizes of the chunk blocks). */
function largestChunk(chunks: Chunk[]) {
  const most = (f: (c: Chunk) => number) => chunks.reduce((m, c) => Math.max(m, f(c)), 0);
  return { sequences: most((c) => c.end - c.first), rows: most((c) => c.q1 - c.q0), keys: most((c) => c.k1 - c.k0) };
}

/**
 * Chunk c's starts, from 0 (its rows and keys are copied to the start of their blocks), into
 * wasm memory at `q` and `k`; desc's lengths become the chunk's.
 */
function placeChunkStarts(memory: CallMemory, p: VarlenPlan, c: Chunk, q: number, k: number, desc: ProblemDesc): void {
  const { i32 } = memory.heap;
  for (let s = c.first; s <= c.end; s++) {
    i32[(q >>> 2) + s - c.first] = p.cuSeqlensQ[s] - c.q0;
    i32[(k >>> 2) + s - c.first] = p.cuSeqlensK[s] - c.k0;
  }
  desc.qLen = c.q1 - c.q0;
  desc.kvLen = c.k1 - c.k0;
}

/**
 * The most scratch any chunk needs: `floats(qStarts, kStarts, sequences)` (a sizing call of the
 * module) with each chunk's starts placed in temporary wasm memory.
 */
function largestChunkScratch(memory: CallMemory, p: VarlenPlan, chunks: Chunk[], desc: ProblemDesc,
  floats: (qStarts: number, kStarts: number, sequences: number) => number): number {
  const startsOfChunk = new Int32Array(largestChunk(chunks).sequences + 1);
  return withTemporaryInt32(memory.module, p.fn, [startsOfChunk, startsOfChunk], ([q, k]) => {
    let most = 0;
    for (const c of chunks) {
      placeChunkStarts(memory, p, c, q, k, desc);
      most = Math.max(most, floats(q, k, c.end - c.first));
    }
    return most;
  });
}

/**
 * desc's per-sequence inputs from chunk c's first sequence on: the causal offsets and ALiBi
 * rows (`whole`: their addresses for sequence 0, from copySmallInputs, 0 for none), and the
 * dropout batch base (its sequences draw their own masks).
 */
function pointAtChunk(desc: ProblemDesc, p: VarlenPlan, c: Chunk, whole: { offsets: number; slopes: number }): void {
  if (whole.offsets !== 0) desc.causalOffsets = whole.offsets + 4 * c.first;
  if (whole.slopes !== 0) desc.alibiSlopes = whole.slopes + 4 * c.first * p.alibiStrideB;  // [S, Hq]: the chunk's rows
  desc.dropoutBatchBase = c.first;
}

/** Copies packed rows [from, to) of `data` (`row` elements each) to `address` in wasm memory. */
function copyRowsIn(memory: CallMemory, data: InputData, row: number, from: number, to: number, address: number): void {
  memory.heap.writeFloats(address, data.subarray(from * row, to * row));
}

/** Copies `rows` packed rows (`row` elements each) from `address` in wasm memory into `into` from row `at`. */
function copyRowsOut(memory: CallMemory, address: number, row: number, rows: number, into: Float32Array, at: number): void {
  into.set(memory.heap.f32.subarray(address >>> 2, (address >>> 2) + rows * row), at * row);
}

/** A chunk's log-sum-exp [Hq, rows] and the columns [q0, q1) of the call's [Hq, Tq]: `toChunk` copies in, else out. */
function copyLogSumExp(memory: CallMemory, p: VarlenPlan, c: Chunk, address: number, whole: Float32Array,
  toChunk: boolean): void {
  const rows = c.q1 - c.q0;
  const heap = memory.heap.f32;
  for (let h = 0; h < p.qHeads; h++) {
    const at = (address >>> 2) + h * rows;
    if (toChunk) {
      heap.set(whole.subarray(h * p.qLen + c.q0, h * p.qLen + c.q1), at);
    } else {
      whole.set(heap.subarray(at, at + rows), h * p.qLen + c.q0);
    }
  }
}

/** runChunked's chunks of at most `chunkBytes` (or a sequence) and their blocks. */
function planChunked(memory: CallMemory, threads: number, p: VarlenPlan, chunkBytes: number) {
  const module = memory.module;
  const n = rowElements(p);
  const chunks = chunksOf(p, 4 * (n.q + n.o), 4 * (n.k + n.v), chunkBytes);  // per chunk: Q and output rows, K and V rows
  const largest = largestChunk(chunks);
  const desc = describeProblem(p);
  const scratchFloats = largestChunkScratch(memory, p, chunks, desc,
    (q, k, sequences) => module.packedScratchFloats(problemArg(module, desc), sequences, q, k, threads));
  const startsBytes = 4 * (largest.sequences + 1);
  const request = {
    cuSeqlensQ: startsBytes, cuSeqlensK: startsBytes,
    query: 4 * largest.rows * n.q, key: 4 * largest.keys * n.k, value: 4 * largest.keys * n.v,
    output: 4 * largest.rows * n.o, logSumExp: p.lseDims !== null ? 4 * p.qHeads * largest.rows : 0,
    scratch: 4 * scratchFloats, ...smallInputBytes(p),
  };
  return { n, chunks, desc, scratchFloats, request };
}

/** sdpaVarlen() chunk by chunk (see STREAM_MIN_BYTES), each chunk on `threads` threads; the same bits as runWhole. */
function runChunked(memory: CallMemory, threads: number, p: VarlenPlan, plan: ReturnType<typeof planChunked>): SdpaResult {
  const module = memory.module;
  try {
    const { n, chunks, desc, scratchFloats } = plan;
    const at = memory.allocate(plan.request, ' to run a chunk of sequences at a time');
    Object.assign(desc, { query: at.query, key: at.key, value: at.value, output: at.output, logsumexp: at.logSumExp });
    copySmallInputs(memory, p, desc, at);  // the sinks, and every sequence's causal offset
    const whole = { offsets: desc.causalOffsets, slopes: desc.alibiSlopes };
    // Into `out` straight, unless it shares memory with an input: a chunk's output rows would be
    // written before later chunks' rows are read, so then into an array of its own, copied into
    // out at the end.
    const outShared = outMayShareInput(p, [p.queryData, p.keyData, p.valueData]);
    const output = p.out !== null && !outShared ? p.out : new Float32Array(p.outputSize);
    const lse = p.lseDims !== null ? new Float32Array(p.lseSize) : null;
    for (const c of chunks) {
      placeChunkStarts(memory, p, c, at.cuSeqlensQ, at.cuSeqlensK, desc);
      pointAtChunk(desc, p, c, whole);
      copyRowsIn(memory, p.queryData, n.q, c.q0, c.q1, at.query);
      copyRowsIn(memory, p.keyData, n.k, c.k0, c.k1, at.key);
      copyRowsIn(memory, p.valueData, n.v, c.k0, c.k1, at.value);
      check(module, p, module.forwardPacked(problemArg(module, desc), c.end - c.first, at.cuSeqlensQ, at.cuSeqlensK,
        at.scratch, scratchFloats, threads));
      copyRowsOut(memory, at.output, n.o, c.q1 - c.q0, output, c.q0);
      if (lse !== null) copyLogSumExp(memory, p, c, at.logSumExp, lse, false);
    }
    if (outShared) (p.out as Float32Array).set(output);
    const result: SdpaResult = { output: { data: p.outResult ?? output, dims: p.outputDims } };
    if (lse !== null) result.logSumExp = { data: lse, dims: p.lseDims as number[] };
    return result;
  } finally {
    memory.free();
  }
}

/** runWhole's blocks, sized by the module from the starts (copied in for that call alone). */
function planWhole(memory: CallMemory, threads: number, p: VarlenPlan) {
  const module = memory.module;
  const desc = describeProblem(p);
  const scratchFloats = withTemporaryInt32(module, p.fn, [p.cuSeqlensQ, p.cuSeqlensK],
    ([q, k]) => module.packedScratchFloats(problemArg(module, desc), p.sequences, q, k, threads));
  const request = {
    ...startsBytes(p), query: floatBytes(p.queryData), key: floatBytes(p.keyData), value: floatBytes(p.valueData),
    output: p.outputSize * 4, logSumExp: p.lseSize * 4, scratch: scratchFloats * 4, ...smallInputBytes(p),
  };
  return { desc, scratchFloats, request };
}

/** sdpaVarlen(): Q, K, V copied in whole, forward_packed(), the output (and lse [Hq, Tq]) copied out. */
function runWhole(memory: CallMemory, threads: number, p: VarlenPlan, plan: ReturnType<typeof planWhole>): SdpaResult {
  const module = memory.module;
  try {
    const { desc, scratchFloats } = plan;
    const at = memory.allocate(plan.request);
    Object.assign(desc, { query: at.query, key: at.key, value: at.value, output: at.output, logsumexp: at.logSumExp });
    const views = memory.heap;  // after the last allocation
    views.writeFloats(at.query, p.queryData);
    views.writeFloats(at.key, p.keyData);
    views.writeFloats(at.value, p.valueData);
    copyStarts(memory, p, at);
    copySmallInputs(memory, p, desc, at);
    check(module, p, module.forwardPacked(problemAddressesArg(module, desc), p.sequences, at.cuSeqlensQ, at.cuSeqlensK,
      at.scratch, scratchFloats, threads));
    return collectResult(memory, p, desc);
  } finally {
    memory.free();
  }
}

/**
 * sdpaVarlenBackward(): chunked on one thread when its inputs (Q, K, V, dO) are large, or when the
 * whole copy would not fit, as sdpaVarlen() is (runVarlen); else whole. Both give the bits of the
 * other.
 */
export function runVarlenBackward(memory: CallMemory, threads: number, bp: VarlenBackwardPlan): SdpaBackwardResult {
  const p = bp.forward;
  return runPacked(memory, threads, [p.queryData, p.keyData, p.valueData, bp.gradOutput], (t) => (bytes) => {
    const plan = planBackwardChunked(memory, t, bp, bytes);
    return { memory, request: plan.request, run: () => runBackwardChunked(memory, t, bp, plan) };
  }, () => {
    const whole = planBackwardWhole(memory, threads, bp);
    // runBackwardWhole writes its descriptions whole.
    const run = () => runBackwardWhole(memory, threads, bp, whole);
    return { request: whole.request, run, runAfterChunksPlanned: run };
  });
}

/** runBackwardChunked's chunks of at most `chunkBytes` (or a sequence) and their blocks. */
function planBackwardChunked(memory: CallMemory, threads: number, bp: VarlenBackwardPlan, chunkBytes: number) {
  const p = bp.forward;
  const module = memory.module;
  const n = rowElements(p);
  // Per chunk: Q, dQ, O and dO rows; K, V, dK and dV rows.
  const chunks = chunksOf(p, 8 * (n.q + n.o), 8 * (n.k + n.v), chunkBytes);
  const largest = largestChunk(chunks);
  const desc = describeProblem(p);
  const grad = describeBackward(p);
  const backwardFloats = largestChunkScratch(memory, p, chunks, desc, (q, k, sequences) =>
    module.packedBackwardScratchFloats(problemArg(module, desc), backwardArg(module, grad), sequences, q, k, threads));
  const forwardFloats = bp.saved !== null ? 0 : largestChunkScratch(memory, p, chunks, desc,
    (q, k, sequences) => module.packedScratchFloats(problemArg(module, desc), sequences, q, k, threads));
  const scratchFloats = Math.max(backwardFloats, forwardFloats);  // one after the other: one block serves both
  const startsBytes = 4 * (largest.sequences + 1);
  const sinks = p.sinks !== null;
  const request = {
    cuSeqlensQ: startsBytes, cuSeqlensK: startsBytes,
    query: 4 * largest.rows * n.q, key: 4 * largest.keys * n.k, value: 4 * largest.keys * n.v,
    gradOutput: 4 * largest.rows * n.o, output: 4 * largest.rows * n.o, logSumExp: 4 * p.qHeads * largest.rows,
    dQuery: 4 * largest.rows * n.q, dKey: 4 * largest.keys * n.k, dValue: 4 * largest.keys * n.v,
    dSinks: sinks ? 4 * p.qHeads : 0, dSinksBySequence: sinks ? 4 * largest.sequences * p.qHeads : 0,
    scratch: 4 * scratchFloats, ...smallInputBytes(p),
  };
  return { n, chunks, desc, grad, backwardFloats, forwardFloats, request };
}

/**
 * sdpaVarlenBackward() chunk by chunk, each chunk on `threads` threads: per chunk its Q, K, V, dO copied in, O and
 * lse copied in (options.saved) or computed by forward_packed() on the chunk (each sequence
 * alone: the bits of the whole call's), backward_packed(), its dQ, dK, dV rows copied out.
 * Each sequence's dSinks is kept (d_sinks_by_sequence) and they are added as backward_packed()
 * adds them (src/sdpa-packed.h: in double, in sequence order, rounded once), so dSinks too has
 * the whole call's bits. A gradient goes straight into its out array where that is written (not
 * added to) and shares no memory with an input (later chunks still read the inputs), else into
 * an array of its own, written or added to out at the end (gradientResult). Measured on the
 * bench's batches (AMD EPYC Zen 5, docs/performance-log.md): the whole copy's time, with the
 * memory of the largest chunk instead of the batch's.
 */
function runBackwardChunked(memory: CallMemory, threads: number, bp: VarlenBackwardPlan,
  plan: ReturnType<typeof planBackwardChunked>): SdpaBackwardResult {
  const p = bp.forward;
  const module = memory.module;
  try {
    const { n, chunks, desc, grad, backwardFloats, forwardFloats } = plan;
    const sinks = p.sinks !== null;
    const at = memory.allocate(plan.request, ' to run a chunk of sequences at a time');
    Object.assign(desc, { query: at.query, key: at.key, value: at.value, output: at.output, logsumexp: at.logSumExp });
    Object.assign(grad, {
      logsumexp: at.logSumExp, gradOutput: at.gradOutput, dQuery: at.dQuery, dKey: at.dKey, dValue: at.dValue,
      dSinks: sinks ? at.dSinks : 0,
    });
    copySmallInputs(memory, p, desc, at);
    const whole = { offsets: desc.causalOffsets, slopes: desc.alibiSlopes };
    // Each gradient straight into its out array when it is written (not added to) and shares no
    // memory with an input (a later chunk still reads them), else into an array of its own: a
    // new array's first writes cost page faults (fresh memory), which an out array reused
    // from step to step does not.
    const inputs = [p.queryData, p.keyData, p.valueData, bp.gradOutput, ...(bp.saved !== null ? [bp.saved.output, bp.saved.logSumExp] : [])];
    const destination = (name: 'dQuery' | 'dKey' | 'dValue', length: number) => {
      const target = bp.out[name];
      const direct = target !== undefined && !bp.accumulate && !outMayShareInput({ out: target.view }, inputs);
      return direct ? target.view : new Float32Array(length);
    };
    const dQuery = destination('dQuery', p.queryData.length), dKey = destination('dKey', p.keyData.length);
    const dValue = destination('dValue', p.valueData.length);
    const sinksBySequence = sinks ? new Float32Array(p.sequences * p.qHeads) : null;  // [S, Hq]
    for (const c of chunks) {
      const sequences = c.end - c.first, rows = c.q1 - c.q0, keys = c.k1 - c.k0;
      placeChunkStarts(memory, p, c, at.cuSeqlensQ, at.cuSeqlensK, desc);
      pointAtChunk(desc, p, c, whole);
      copyRowsIn(memory, p.queryData, n.q, c.q0, c.q1, at.query);
      copyRowsIn(memory, p.keyData, n.k, c.k0, c.k1, at.key);
      copyRowsIn(memory, p.valueData, n.v, c.k0, c.k1, at.value);
      copyRowsIn(memory, bp.gradOutput, n.o, c.q0, c.q1, at.gradOutput);
      if (bp.saved !== null) {
        copyRowsIn(memory, bp.saved.output, n.o, c.q0, c.q1, at.output);
        copyLogSumExp(memory, p, c, at.logSumExp, bp.saved.logSumExp, true);
      } else {
        check(module, p, module.forwardPacked(problemArg(module, desc), sequences, at.cuSeqlensQ, at.cuSeqlensK,
          at.scratch, forwardFloats, threads));
      }
      check(module, p, module.backwardPacked(problemArg(module, desc), backwardArg(module, grad), sequences,
        at.cuSeqlensQ, at.cuSeqlensK, sinks ? at.dSinksBySequence : 0, at.scratch, backwardFloats, threads));
      copyRowsOut(memory, at.dQuery, n.q, rows, dQuery, c.q0);
      copyRowsOut(memory, at.dKey, n.k, keys, dKey, c.k0);
      copyRowsOut(memory, at.dValue, n.v, keys, dValue, c.k0);
      if (sinksBySequence !== null) copyRowsOut(memory, at.dSinksBySequence, p.qHeads, sequences, sinksBySequence, c.first);
    }
    let dSinks: Float32Array | undefined;
    if (sinksBySequence !== null) {  // as backward_packed() adds them
      dSinks = new Float32Array(p.qHeads);
      for (let h = 0; h < p.qHeads; h++) {
        let sum = 0;  // a double, as there
        for (let s = 0; s < p.sequences; s++) sum += sinksBySequence[s * p.qHeads + h];
        dSinks[h] = sum;  // rounded to float once
      }
    }
    return gradientResult(bp, { dQuery, dKey, dValue, dSinks }, true);
  } finally {
    memory.free();
  }
}

/** runBackwardWhole's blocks, sized by the module from the starts (copied in for that call alone). */
function planBackwardWhole(memory: CallMemory, threads: number, bp: VarlenBackwardPlan) {
  const p = bp.forward;
  const module = memory.module;
  const desc = describeProblem(p);
  const grad = describeBackward(p);
  const [backwardFloats, forwardFloats] = withTemporaryInt32(module, p.fn, [p.cuSeqlensQ, p.cuSeqlensK], ([qs, ks]) => [
    module.packedBackwardScratchFloats(problemArg(module, desc), backwardArg(module, grad), p.sequences, qs, ks, threads),
    bp.saved === null ? module.packedScratchFloats(problemArg(module, desc), p.sequences, qs, ks, threads) : 0,
  ]);
  const scratchFloats = Math.max(backwardFloats, forwardFloats);  // one after the other: one block serves both
  const q = p.queryData, k = p.keyData, v = p.valueData;
  const request = {
    ...startsBytes(p), query: floatBytes(q), key: floatBytes(k), value: floatBytes(v), gradOutput: floatBytes(bp.gradOutput),
    output: p.outputSize * 4, logSumExp: p.lseSize * 4,
    dQuery: floatBytes(q), dKey: floatBytes(k), dValue: floatBytes(v), dSinks: p.sinks !== null ? p.qHeads * 4 : 0,
    scratch: scratchFloats * 4, ...smallInputBytes(p),
  };
  return { desc, grad, backwardFloats, forwardFloats, request };
}

/**
 * sdpaVarlenBackward(), whole: as runBackward (backward.ts), with the packed entry points: Q, K,
 * V, dO copied in, O and lse copied in (options.saved) or computed by forward_packed() first
 * (the same bits as sdpaVarlen(..., { returnLogSumExp: true })), then backward_packed().
 */
function runBackwardWhole(memory: CallMemory, threads: number, bp: VarlenBackwardPlan,
  plan: ReturnType<typeof planBackwardWhole>): SdpaBackwardResult {
  const p = bp.forward;
  const module = memory.module;
  try {
    const { desc, grad, backwardFloats, forwardFloats } = plan;
    const q = p.queryData, k = p.keyData, v = p.valueData;
    const at = memory.allocate(plan.request);
    Object.assign(desc, { query: at.query, key: at.key, value: at.value, output: at.output, logsumexp: at.logSumExp });
    Object.assign(grad, {
      logsumexp: at.logSumExp, gradOutput: at.gradOutput, dQuery: at.dQuery, dKey: at.dKey, dValue: at.dValue,
      dSinks: p.sinks !== null ? at.dSinks : 0,
    });
    const views = memory.heap;  // after the last allocation
    views.writeFloats(at.query, q);
    views.writeFloats(at.key, k);
    views.writeFloats(at.value, v);
    views.writeFloats(at.gradOutput, bp.gradOutput);
    const { f32 } = views;
    copyStarts(memory, p, at);
    copySmallInputs(memory, p, desc, at);
    if (bp.saved !== null) {
      f32.set(bp.saved.output, at.output >>> 2);
      f32.set(bp.saved.logSumExp, at.logSumExp >>> 2);
    } else {
      check(module, p, module.forwardPacked(problemArg(module, desc), p.sequences, at.cuSeqlensQ, at.cuSeqlensK, at.scratch,
        forwardFloats, threads));
    }
    check(module, p, module.backwardPacked(problemArg(module, desc), backwardArg(module, grad), p.sequences,
      at.cuSeqlensQ, at.cuSeqlensK, 0, at.scratch, backwardFloats, threads));
    return takeGradients(memory, bp, { ...at, dMask: 0 }, { query: q.length, key: k.length, value: v.length, mask: 0 });
  } finally {
    memory.free();
  }
}
