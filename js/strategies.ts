// How one validated problem (a Plan) is run on the wasm kernel. Each way has its own function:
//   runCopied          sdpa(): Q, K, V copied in whole, one forward() (threads split the work)
//   runStreamedDecode  sdpa(), large decodes: K/V copied one key segment of one (batch, KV
//                      head) at a time and computed while the copy is in the core's cache
//   runSlices          sdpa(), a slice of batches and KV heads (with their query heads, slices.ts;
//                      or of one (batch, KV head)'s query heads, or of one query head's rows,
//                      where that keeps the bits)
//                      copied in, computed and copied out at a time: one (batch, KV head) on
//                      one thread for a prefill (each fits in L2), or the largest slices that fit
//                      where the whole copy would pass the memory limits
//   runResident        KVCache.attend(): K/V already in wasm memory (the cache), read in place;
//                      past the memory limits in slices too (runSlices, K/V not copied)
// runSdpa() picks among the first three; every one returns the same bits.
// All of them copy the small inputs (mask, causal offsets, key lengths and starts, sinks, ALiBi slopes) the same way
// (smallInputBytes, copySmallInputs), request every block of wasm memory at once (refused
// before any is allocated if the instance's limit would be passed) and free them on every path
// (CallMemory in try/finally).
import { problemAddressesArg, problemArg } from './kernel-args.js';
import { CallMemory, COPY_PLACEMENT_SLACK, type HeapViews, placeCopy, runFirstThatFits, type MemoryAccount, type Way } from './memory.js';
import { sharesBytes, type TypedArray } from './typed-arrays.js';
import type { ProblemDesc, SdpaModule } from './wasm/sdpa.mjs';
import type { SdpaResult } from './types.js';
import {
  copySlice, denseStrides, keyValuePart, maskSpanBytes, problemOfSlice, queryPart, sliceCandidates, SliceMasks, sliceInputs,
  sliceProblem, slicePurpose, sliceShapes, slicesOf, type Slice, type SliceRules, type SliceShape,
} from './slices.js';
import { floatBytes, type InputData, maskBytes, type Plan } from './validate.js';

const MASK_KIND = { float: 1, bool: 2 } as const;
/** sdpa::KvType (src/sdpa.h): float16Finite = halves holding no Inf/NaN pattern (widened faster). */
export const KV_TYPE = { float32: 0, float16: 1, float16Finite: 2, bfloat16: 3 } as const;

/**
 * Decode problems whose K and V together are at least this large are streamed: copied in one
 * segment of keys of one (batch, KV head) at a time (src/sdpa.h, forward_segment), each
 * computed right after its copy, from the core's own cache, instead of from main memory
 * after the whole copy has evicted it.
 */
const STREAM_MIN_BYTES = 4 * 2 ** 20;
/**
 * Prefill on one thread whose Q, K and V together are at least PREFILL_STREAM_MIN_BYTES (beyond
 * a core's L2 cache) while one (batch, KV head)'s Q rows, K, V and output fit in
 * PREFILL_STREAM_MAX_PAIR_BYTES (within it) runs one (batch, KV head) at a time: copied in,
 * computed, copied out, so the kernel reads what was just copied from the core's cache instead
 * of from main memory after the whole copy. Each (batch, KV head) is independent, so the result
 * is bitwise the same. Measured on shape (b) (B1 H12 N512 E64, 512 KB a pair): 1.1–1.4% faster,
 * causal too; on (c) (N2048, 2 MB a pair) no gain.
 */
const PREFILL_STREAM_MIN_BYTES = 2 * 2 ** 20;
const PREFILL_STREAM_MAX_PAIR_BYTES = 2 ** 20;

/** The modules an Attention instance runs on. */
export interface Engines {
  /** The instance's module: single-threaded, or the threaded build when threads > 1. */
  main: SdpaModule;
  threads: number;
  /** With threads > 1, the single-threaded build too: streamed decodes run on it (its plain memory takes copies faster). */
  single: SdpaModule | null;
  /** The instance's bytes in wasm memory (of either module) and its limit. */
  account: MemoryAccount;
}

const isShared = (buffer: ArrayBufferLike) => Object.prototype.toString.call(buffer) === '[object SharedArrayBuffer]';

/**
 * Whether two arrays may share memory: ranges that overlap in one buffer, or any two different
 * SharedArrayBuffer objects, which may be views of the same memory (structuredClone or
 * postMessage of one, a grown shared WebAssembly.Memory) in a way JavaScript cannot see.
 */
export function mayOverlap(a: TypedArray, b: TypedArray): boolean {
  return sharesBytes(a, b) || (a.buffer !== b.buffer && isShared(a.buffer) && isShared(b.buffer));
}

/** Whether options.out may share memory with one of `inputs` (then it is written only after every input was read). */
export function outMayShareInput(p: { out: Float32Array | null }, inputs: TypedArray[]): boolean {
  const out = p.out;
  return out !== null && inputs.some((input) => mayOverlap(input, out));
}

/**
 * The caller's arrays runSlices reads slice by slice, after earlier slices' outputs were written:
 * Q, K and V (`keyValue`: none where read in place) and the mask (the other small inputs are
 * checked copies, copied in whole first).
 */
const readBySlice = (p: Plan, q: InputData, keyValue: InputData[]): TypedArray[] =>
  p.mask === null ? [q, ...keyValue] : [q, ...keyValue, p.mask.data];

/**
 * Whether sdpa() streams this decode (runStreamedDecode): K and V of at least STREAM_MIN_BYTES
 * that the kernel reads in place, in the bhsd layout, no weights or log-sum-exp asked for.
 */
function streamsDecode(engines: Engines, p: Plan, k: InputData, v: InputData): boolean {
  return p.layout === 'bhsd' && p.weightsDims === null && p.lseDims === null &&
    floatBytes(k) + floatBytes(v) >= STREAM_MIN_BYTES &&
    engines.main.readsKeysInPlace(problemArg(engines.main, describeProblem(p)));
}

/** Whether sdpa() streams this prefill one (batch, KV head) at a time on one thread (see PREFILL_STREAM_MIN_BYTES). */
function streamsPrefill(engines: Engines, p: Plan, q: InputData, k: InputData, v: InputData): boolean {
  if (p.layout !== 'bhsd' || p.weightsDims !== null || p.lseDims !== null) return false;
  // One (batch, KV head)'s Q rows, K, V and output. Not streamed when `out` may share memory
  // with an input or the mask (runSlices would then compute into an array of its own and copy
  // it into `out` at the end: no gain).
  const pairBytes = 4 * ((p.qHeads / p.kvHeads) * (p.q.h + p.o.h) + p.k.h + p.v.h);
  return engines.threads === 1 && p.batch * p.kvHeads > 1 &&
    floatBytes(q) + floatBytes(k) + floatBytes(v) >= PREFILL_STREAM_MIN_BYTES && pairBytes <= PREFILL_STREAM_MAX_PAIR_BYTES &&
    !outMayShareInput(p, readBySlice(p, q, [k, v]));
}

/**
 * sdpa(): streamed when a decode or a one-thread prefill gains by it; else Q, K, V copied in
 * whole (runCopied), or, when that copy would pass the memory limits (maxMemoryBytes, the
 * module's 2 GiB), slices of batches and KV heads (then of query heads) as large as fit
 * (runSlices, on all the threads). Every way gives the same bits.
 */
export function runSdpa(engines: Engines, p: Plan, q: InputData, k: InputData, v: InputData): SdpaResult {
  // The first way that fits, in this order; else the one that needs the least, whose refusal
  // names that (a smaller slice may need more scratch than a larger one, or the whole copy).
  // Written out, not as one generator of ways: a small call's own cost is a few µs, and a
  // generator on its path cost it 30–45% (AMD EPYC Zen 5, a 20 µs call).
  const tried: Way<SdpaResult>[] = [];
  const fits = (way: Way<SdpaResult>) => way.memory.fits(way.request) || (tried.push(way), false);
  // The streamed ways where they gain (a streamed decode copies Q, the output and the mask whole).
  if (streamsDecode(engines, p, k, v)) {
    const memory = new CallMemory(engines.single ?? engines.main, engines.account, p.fn);
    const streamed = planStreamedDecode(memory.module, p, q);
    const way = { memory, request: streamed.request, run: () => runStreamedDecode(memory, p, q, k, v, streamed) };
    if (fits(way)) return way.run();
  }
  const memory = new CallMemory(engines.main, engines.account, p.fn);
  if (streamsPrefill(engines, p, q, k, v)) {
    const pairs = planSlices(memory.module, 1, p, { batches: 1, kvHeads: 1 });
    const way = { memory, request: pairs.request, run: () => runSlices(memory, 1, p, q, copiedSlices(p, k, v), pairs) };
    if (fits(way)) return way.run();
  }
  // The whole copy, then the largest slices (sliceCandidates).
  const desc = describeProblem(p);
  const whole = planWhole(memory.module, engines.threads, p, desc, floatBytes(q), { key: floatBytes(k), value: floatBytes(v) });
  if (memory.fits(whole.request)) return runCopied(memory, engines.threads, p, desc, whole, q, k, v);
  tried.push({ memory, request: whole.request, run: () => {
    // The slices' planning below rewrote the module's ProblemDesc block, which runWhole then
    // only updates with the addresses (problemAddressesArg): written again first.
    problemArg(memory.module, desc);
    return runCopied(memory, engines.threads, p, desc, whole, q, k, v);
  } });
  return runFirstThatFits((function* ways(): Generator<Way<SdpaResult>> {
    yield* tried;
    for (const shape of sliceCandidates(p, { keepsBits: sliceRules(memory.module, p, desc) })) {
      const slices = planSlices(memory.module, engines.threads, p, shape);
      yield { memory, request: slices.request, run: () => runSlices(memory, engines.threads, p, q, copiedSlices(p, k, v), slices) };
    }
  })());
}

/**
 * The module's queryHeadsKeepBits and leastQueryRows for the whole call's problem `desc`
 * (slices.ts), for sliceCandidates() to ask before any slice is planned: each call writes its
 * description into the module's ProblemDesc block first. (Before any allocation: the small
 * inputs are not in wasm memory yet, so the kernel sees none of their arrays. That can only
 * refuse more slices, e.g. where ALiBi would have kept a float16 cache's one-row slice from
 * reading its keys interleaved, except for the per-batch causal offsets, which a slice of rows
 * takes as a number, its batch's + its first row: there each batch's offset is asked about as
 * the problem's one offset, and a count of rows must suit every batch.)
 */
function sliceRules(module: SdpaModule, p: Plan, desc: ProblemDesc): SliceRules {
  const offsets = p.causalOffsets === null ? [desc.causalOffset] : [...new Set(p.causalOffsets)];
  const leastFor = (offset: number, atLeast: number) =>
    module.leastQueryRows(problemArg(module, { ...desc, causalOffsets: 0, causalOffset: offset }), atLeast);
  return {
    queryHeadsKeepBits: (first, count) => module.queryHeadsKeepBits(problemArg(module, desc), first, count),
    leastQueryRows(atLeast) {
      // The least count from atLeast up that every batch's offset takes (0: none).
      let rows = atLeast;
      for (let raised = true; raised;) {
        raised = false;
        for (const offset of offsets) {
          const least = leastFor(offset, rows);
          if (least === 0) return 0;
          if (least > rows) {
            rows = least;
            raised = true;
          }
        }
      }
      return rows;
    },
  };
}

/** The kernel's view of a validated problem (float32 K/V); addresses are filled in once allocated. */
export function describeProblem(p: Plan): ProblemDesc {
  return {
    batch: p.batch, qHeads: p.qHeads, kvHeads: p.kvHeads, qLen: p.qLen, kvLen: p.kvLen,
    headDim: p.headDim, valueDim: p.valueDim, kvType: KV_TYPE.float32,
    query: 0, key: 0, value: 0, output: 0, weights: 0, mask: 0, causalOffsets: 0, keyLengths: 0, logsumexp: 0, keyStarts: 0,
    sinks: 0, alibiSlopes: 0, alibiStrideB: p.alibiStrideB,
    dropoutThreshold: p.dropoutThreshold, dropoutSeed: p.dropoutSeed, dropoutBatchBase: 0, dropoutHeadBase: 0, dropoutRowBase: 0,
    qStrideB: p.q.b, qStrideH: p.q.h, qStrideL: p.q.l,
    kStrideB: p.k.b, kStrideH: p.k.h, kStrideL: p.k.l,
    vStrideB: p.v.b, vStrideH: p.v.h, vStrideL: p.v.l,
    oStrideB: p.o.b, oStrideH: p.o.h, oStrideL: p.o.l,
    maskKind: p.mask === null ? 0 : MASK_KIND[p.mask.kind],
    maskStrideB: p.mask?.strides[0] ?? 0, maskStrideH: p.mask?.strides[1] ?? 0,
    maskStrideQ: p.mask?.strides[2] ?? 0, maskStrideK: p.mask?.strides[3] ?? 0,
    scale: p.scale, softcap: p.softcap, causal: p.causal, causalOffset: p.causalOffset,
    slidingWindow: p.slidingWindow, readKvInOrder: false,
  };
}

export function check(module: SdpaModule, p: Plan, status: number): void {
  if (status !== 0) {
    // plan() checks everything the kernel checks; reaching this is a bug in sdpa-wasm.
    throw new Error(`${p.fn}: internal error: the kernel rejected a validated problem (${module.statusName(status)})`);
  }
}

/** Bytes of the mask, causal offsets, key lengths and starts, sinks, ALiBi slopes (0 for those not given): part of a request. */
export function smallInputBytes(p: Plan) {
  return {
    attnMask: maskBytes(p.mask),
    causalOffset: p.causalOffsets?.byteLength ?? 0,
    keyLengths: p.keyLengths?.byteLength ?? 0,
    keyStarts: p.keyStarts?.byteLength ?? 0,
    sinks: p.sinks?.byteLength ?? 0,
    alibiSlopes: p.alibiSlopes?.byteLength ?? 0,
  };
}

/**
 * Sets their addresses in `desc` and copies them in: after the last allocation (heap views).
 * With `wholeMask` false the mask's block is left to the caller (runSlices copies each slice's part).
 */
export function copySmallInputs(memory: CallMemory, p: Plan, desc: ProblemDesc,
  at: { attnMask: number; causalOffset: number; keyLengths: number; keyStarts: number; sinks: number; alibiSlopes: number },
  wholeMask = true): void {
  desc.mask = at.attnMask;
  desc.causalOffsets = at.causalOffset;
  desc.keyLengths = at.keyLengths;
  desc.keyStarts = at.keyStarts;
  desc.sinks = at.sinks;
  desc.alibiSlopes = at.alibiSlopes;
  const views = memory.heap;
  const { f32, i32, u8 } = views;
  if (p.mask !== null && wholeMask) {
    if (p.mask.kind === 'float') views.writeFloats(desc.mask, p.mask.data as InputData);
    else u8.set(p.mask.data, desc.mask);
  }
  if (p.causalOffsets !== null) i32.set(p.causalOffsets, desc.causalOffsets >>> 2);
  if (p.keyLengths !== null) i32.set(p.keyLengths, desc.keyLengths >>> 2);
  if (p.keyStarts !== null) i32.set(p.keyStarts, desc.keyStarts >>> 2);
  if (p.sinks !== null) f32.set(p.sinks, desc.sinks >>> 2);
  if (p.alibiSlopes !== null) f32.set(p.alibiSlopes, desc.alibiSlopes >>> 2);
}

/** The output (into `out` or a new array) and the weights, copied out of wasm memory. */
export function collectResult(memory: CallMemory, p: Plan, desc: ProblemDesc): SdpaResult {
  const { f32 } = memory.heap;
  const at = desc.output >>> 2;
  let output: Float32Array;
  if (p.out !== null) {
    p.out.set(f32.subarray(at, at + p.outputSize));
    output = p.outResult as Float32Array;
  } else {
    output = f32.slice(at, at + p.outputSize);
  }
  const result: SdpaResult = { output: { data: output, dims: p.outputDims } };
  if (p.weightsDims !== null) {
    const w = desc.weights >>> 2;
    result.weights = { data: f32.slice(w, w + p.weightsSize), dims: p.weightsDims };
  }
  if (p.lseDims !== null) {
    const at = desc.logsumexp >>> 2;
    result.logSumExp = { data: f32.slice(at, at + p.lseSize), dims: p.lseDims };
  }
  return result;
}

/** runWhole's blocks: Q, K and V (`keyValueBytes`: 0 when resident), the outputs, the scratch and the small inputs. */
function planWhole(module: SdpaModule, threads: number, p: Plan, desc: ProblemDesc, queryBytes: number,
  keyValueBytes: { key: number; value: number }) {
  const scratchFloats = module.scratchFloats(problemArg(module, desc), threads);
  const request = {
    query: queryBytes, ...keyValueBytes, output: p.outputSize * 4, weights: p.weightsSize * 4,
    logSumExp: p.lseSize * 4, scratch: scratchFloats * 4, ...smallInputBytes(p),
  };
  return { scratchFloats, request };
}

/**
 * forward() on a problem whose K/V are placed by `placeKeyValue` (given the addresses of the
 * request's key and value blocks, zero-sized when K/V are resident): allocates everything at
 * once, copies Q and the small inputs in, runs, copies the results out. Shared by runCopied
 * and runResident.
 */
function runWhole(memory: CallMemory, threads: number, p: Plan, desc: ProblemDesc, whole: ReturnType<typeof planWhole>,
  q: InputData, placeKeyValue: (at: { key: number; value: number }) => void): SdpaResult {
  const module = memory.module;
  const { scratchFloats } = whole;
  const at = memory.allocate(whole.request);
  desc.query = at.query;
  desc.output = at.output;
  desc.weights = at.weights;
  desc.logsumexp = at.logSumExp;
  // Heap views are read only after the last allocation: growing memory detaches them.
  memory.heap.writeFloats(desc.query, q);
  copySmallInputs(memory, p, desc, at);
  placeKeyValue(at);
  check(module, p, module.forward(problemAddressesArg(module, desc), at.scratch, scratchFloats, threads));
  return collectResult(memory, p, desc);
}

/** Q, K, V copied in whole; one forward() call (split over the threads). */
function runCopied(memory: CallMemory, threads: number, p: Plan, desc: ProblemDesc, whole: ReturnType<typeof planWhole>,
  q: InputData, k: InputData, v: InputData): SdpaResult {
  try {
    return runWhole(memory, threads, p, desc, whole, q, (at) => {
      desc.key = at.key;
      desc.value = at.value;
      const views = memory.heap;
      views.writeFloats(desc.key, k);
      views.writeFloats(desc.value, v);
    });
  } finally {
    memory.free();
  }
}

/** Where a resident K/V (a KV cache's storage) is: byte addresses, element type. */
export interface ResidentKeyValue {
  key: number;
  value: number;
  kvType: number;
}

/**
 * K/V read in place from wasm memory (plan.k / plan.v give their strides); Q copied in whole,
 * or, when that would pass the memory limits (a long prompt's Q, output or weights beside a
 * large cache), a slice of batches and KV heads (then of query heads) at a time as large as
 * fits (runSlices).
 */
export function runResident(memory: CallMemory, threads: number, p: Plan, q: InputData,
  kv: ResidentKeyValue): SdpaResult {
  const desc = residentProblem(p, kv);
  const whole = planWhole(memory.module, threads, p, desc, floatBytes(q), { key: 0, value: 0 });
  if (memory.fits(whole.request)) return runResidentWhole(memory, threads, p, desc, whole, q);
  return runFirstThatFits((function* ways(): Generator<Way<SdpaResult>> {
    // The slices' planning rewrote the module's ProblemDesc block (see runSdpa): written again first.
    yield {
      memory, request: whole.request,
      run: () => (problemArg(memory.module, desc), runResidentWhole(memory, threads, p, desc, whole, q)),
    };
    for (const shape of sliceCandidates(p, { keepsBits: sliceRules(memory.module, p, desc) })) {
      const slices = planSlices(memory.module, threads, p, shape, kv);
      yield { memory, request: slices.request, run: () => runSlices(memory, threads, p, q, residentSlices(p, kv), slices) };
    }
  })());
}

/** The kernel's view of a problem whose K/V are resident, at kv's addresses (a slice moves them). */
function residentProblem(p: Plan, kv: ResidentKeyValue): ProblemDesc {
  const desc = describeProblem(p);
  desc.key = kv.key;
  desc.value = kv.value;
  desc.kvType = kv.kvType;
  // Read once per step from main memory, not from a copy still in the core's cache.
  desc.readKvInOrder = true;
  return desc;
}

/** runResident's whole way: Q, the outputs and the small inputs copied in whole (no closure: on every step's path). */
function runResidentWhole(memory: CallMemory, threads: number, p: Plan, desc: ProblemDesc, whole: ReturnType<typeof planWhole>,
  q: InputData): SdpaResult {
  try {
    return runWhole(memory, threads, p, desc, whole, q, placeNothing);
  } finally {
    memory.free();
  }
}

const placeNothing = () => {};

/** The problem of one (batch, KV head): [1, Hq/Hkv, Lq, E] against [1, 1, Lk, E]. */
function pairProblem(p: Plan, desc: ProblemDesc): ProblemDesc {
  return { ...desc, batch: 1, qHeads: p.qHeads / p.kvHeads, kvHeads: 1, kStrideB: 0, kStrideH: 0, vStrideB: 0, vStrideH: 0 };
}

/** runStreamedDecode's blocks: Q, one segment of K and of V, the output, the scratch and partials, the small inputs. */
function planStreamedDecode(module: SdpaModule, p: Plan, q: InputData) {
  const desc = describeProblem(p);
  const pairDesc = pairProblem(p, desc);
  const segmentKeys = module.segmentKeys();
  const pairArg = problemArg(module, pairDesc);
  const scratchFloats = module.segmentScratchFloats(pairArg);
  const request = {
    query: floatBytes(q),
    // Each segment's copy is placed in its block by placeCopy(), away from its source modulo 4 KiB.
    key: Math.min(segmentKeys, p.kvLen) * p.headDim * 4 + COPY_PLACEMENT_SLACK,
    value: Math.min(segmentKeys, p.kvLen) * p.valueDim * 4 + COPY_PLACEMENT_SLACK,
    output: p.outputSize * 4,
    scratch: scratchFloats * 4,
    partials: module.segmentPartialsFloats(pairArg) * 4,
    ...smallInputBytes(p),
  };
  return { desc, pairDesc, segmentKeys, scratchFloats, request };
}

/**
 * A decode (reads K/V in place) streamed one segment of keys of one (batch, KV head) at a
 * time: each segment is copied into a segment-sized buffer and computed at once, while it is
 * in the core's cache; the segments' partial softmax states are merged per (batch, KV head).
 * Runs on one thread (the copies in between are serial).
 */
export function runStreamedDecode(memory: CallMemory, p: Plan, q: InputData, k: InputData,
  v: InputData, plan: ReturnType<typeof planStreamedDecode>): SdpaResult {
  try {
    const module = memory.module;
    const { desc, pairDesc, segmentKeys, scratchFloats } = plan;
    const at = memory.allocate(plan.request);
    // The pair's description, written once (after the allocation): nothing below writes the block again.
    const pairArg = problemArg(module, pairDesc);
    const { scratch, partials } = at;
    desc.query = at.query;
    desc.output = at.output;
    const group = p.qHeads / p.kvHeads;
    const segments = module.segmentCount(pairArg);
    const pairKeyFloats = p.kvLen * p.headDim, pairValueFloats = p.kvLen * p.valueDim;
    // Embind allocates the C++ object: views after it.
    const streamer = new module.SegmentStream(pairArg);
    try {
      const views = memory.heap;  // the loop below allocates nothing (plain-number calls)
      views.writeFloats(desc.query, q);
      copySmallInputs(memory, p, desc, at);
      for (let pair = 0; pair < p.batch * p.kvHeads; pair++) {
        const b = Math.floor(pair / p.kvHeads), firstHead = (pair % p.kvHeads) * group;
        const pairAt = sliceInputs(p, desc, b, firstHead);
        streamer.setPair(
          desc.query + 4 * (b * p.q.b + firstHead * p.q.h),
          desc.output + 4 * (b * p.o.b + firstHead * p.o.h),
          pairAt.mask, pairAt.causalOffsets, pairAt.keyLengths, pairAt.keyStarts, pairAt.sinks, pairAt.alibiSlopes,
          pairAt.dropoutBatchBase, pairAt.dropoutHeadBase);
        const keyRows = pair * pairKeyFloats, valueRows = pair * pairValueFloats;
        for (let segment = 0; segment < segments; segment++) {
          const begin = segment * segmentKeys, end = Math.min(p.kvLen, begin + segmentKeys);
          const keys = k.subarray(keyRows + begin * p.headDim, keyRows + end * p.headDim);
          const values = v.subarray(valueRows + begin * p.valueDim, valueRows + end * p.valueDim);
          const keyAt = placeCopy(at.key, keys), valueAt = placeCopy(at.value, values);
          views.writeFloats(keyAt, keys);
          views.writeFloats(valueAt, values);
          check(module, p, streamer.forward(segment, keyAt, valueAt, partials, scratch, scratchFloats));
        }
        check(module, p, streamer.merge(partials));
      }
    } finally {
      streamer.delete();
    }
    return collectResult(memory, p, desc);
  } finally {
    memory.free();
  }
}

/**
 * The blocks of slices of `shape` (slices.ts): each slice tensor, the slice's mask, the scratch,
 * the other small inputs whole; no K/V blocks where they are `resident` (read in place).
 */
function planSlices(module: SdpaModule, threads: number, p: Plan, shape: SliceShape, resident: ResidentKeyValue | null = null) {
  const inPlace = resident !== null;
  const desc = inPlace ? residentProblem(p, resident) : describeProblem(p);
  const sliceDesc = sliceProblem(p, desc, shape, inPlace);
  const heads = sliceDesc.qHeads, rows = shape.batches * heads * sliceDesc.qLen;
  const scratchFloats = Math.max(...sliceShapes(p, shape).map((s) =>
    module.scratchFloats(problemArg(module, sliceProblem(p, desc, s, inPlace)), threads)));
  const keyValueRows = inPlace ? 0 : shape.batches * shape.kvHeads * p.kvLen;
  const request = {
    query: 4 * rows * p.headDim, key: 4 * keyValueRows * p.headDim, value: 4 * keyValueRows * p.valueDim,
    output: 4 * rows * p.valueDim, weights: p.weightsDims !== null ? 4 * rows * p.kvLen : 0,
    logSumExp: p.lseDims !== null ? 4 * rows : 0,
    scratch: 4 * scratchFloats, ...smallInputBytes(p), attnMask: maskSpanBytes(p, shape.batches, heads, sliceDesc.qLen),
  };
  return { shape, desc, sliceDesc, inPlace, scratchFloats, request };
}

/** Where runSlices gets each slice's K/V from. */
interface SliceKeyValue {
  /** The caller's K/V arrays, read slice by slice (none when K/V are read in place). */
  callerArrays: InputData[];
  /** Sets `slice`'s key and value addresses for slice c, copying them in first if they are copied (into the request's blocks `at`). */
  place(slice: ProblemDesc, c: Slice, heap: HeapViews, at: { key: number; value: number }): void;
}

/**
 * Each slice's K/V copied from the caller's arrays into the slice's blocks; not again for the
 * next slice of the same batches and KV heads (query heads of one KV head: the kernel never
 * writes its inputs).
 */
function copiedSlices(p: Plan, k: InputData, v: InputData): SliceKeyValue {
  // The first (batch, KV head) of the slice whose K/V the blocks hold: in slices of one shape it
  // names their batches and KV heads.
  let held = -1;
  return {
    callerArrays: [k, v],
    place(slice, c, heap, at) {
      const these = c.b0 * p.kvHeads + c.h0;
      if (these !== held) {
        const kv = keyValuePart(c);
        copySlice(heap, at.key, k, p.k, p.layout, kv, p.kvLen, p.headDim, 'in');
        copySlice(heap, at.value, v, p.v, p.layout, kv, p.kvLen, p.valueDim, 'in');
        held = these;
      }
      slice.key = at.key;
      slice.value = at.value;
    },
  };
}

/** Each slice's K/V read in place: its first (batch, KV head)'s rows in the resident storage (strides p.k, p.v). */
function residentSlices(p: Plan, kv: ResidentKeyValue): SliceKeyValue {
  const elementBytes = kv.kvType === KV_TYPE.float32 ? 4 : 2;
  return {
    callerArrays: [],
    place(slice, c) {
      slice.key = kv.key + elementBytes * (c.b0 * p.k.b + c.h0 * p.k.h);
      slice.value = kv.value + elementBytes * (c.b0 * p.v.b + c.h0 * p.v.h);
    },
  };
}

/**
 * A result array of `size` floats in JavaScript memory, or a RangeError naming it (`what`) where
 * the engine cannot make one (a length past its typed arrays' limit, or no memory left).
 */
function resultArray(p: Plan, what: string, size: number, dims: number[]): Float32Array {
  try {
    return new Float32Array(size);
  } catch (error) {
    if (!(error instanceof RangeError)) throw error;
    throw new RangeError(`${p.fn}: ${what} [${dims.join(', ')}] would need ${4 * size} bytes, which this JavaScript engine ` +
      `could not allocate (${error.message})`);
  }
}

/**
 * sdpa() a slice (slices.ts) at a time, each copied in, computed on `threads` threads and
 * copied out: wasm memory holds one slice's tensors. The one-thread streamed prefill (one
 * (batch, KV head) a slice: each computed from the core's cache, see PREFILL_STREAM_MIN_BYTES),
 * the fallback of calls whose whole copy would not fit, and KVCache.attend()'s (its K/V
 * read in place, `keyValue` residentSlices).
 */
function runSlices(memory: CallMemory, threads: number, p: Plan, q: InputData, keyValue: SliceKeyValue,
  plan: ReturnType<typeof planSlices>): SdpaResult {
  try {
    const module = memory.module;
    const { shape, desc, sliceDesc, inPlace, scratchFloats, request } = plan;
    // The results' arrays first (slices may hold results larger than wasm memory: weights
    // computed a few rows at a time), so that the engine refusing one is an error before
    // anything is allocated or computed. Into `out` straight, unless it may share memory with
    // an input or the mask: a slice's output would be written before later slices' inputs are
    // read, so then into an array of its own, copied into out at the end.
    const outShared = outMayShareInput(p, readBySlice(p, q, keyValue.callerArrays));
    const output = p.out !== null && !outShared ? p.out : resultArray(p, 'the output', p.outputSize, p.outputDims);
    const weights = p.weightsDims !== null ? resultArray(p, 'options.returnWeights: the weights', p.weightsSize, p.weightsDims) : null;
    const lse = p.lseDims !== null ? resultArray(p, 'options.returnLogSumExp: the log-sum-exp', p.lseSize, p.lseDims) : null;
    const at = memory.allocate(request, slicePurpose(p, shape));
    copySmallInputs(memory, p, desc, at, false);
    Object.assign(sliceDesc, { query: at.query, output: at.output, weights: at.weights, logsumexp: at.logSumExp });
    const masks = new SliceMasks(p, at.attnMask);
    for (const c of slicesOf(p, shape)) {
      const slice = problemOfSlice(p, desc, sliceDesc, shape, c, inPlace);
      const queryRows = queryPart(c);  // its query heads' rows (all Lq, or a few of one head)
      // Fresh views every time: a view is never kept across a call into the module
      // (js/memory.ts), whatever that call allocates.
      const before = memory.heap;
      copySlice(before, at.query, q, p.q, p.layout, queryRows, p.qLen, p.headDim, 'in');
      keyValue.place(slice, c, before, at);
      slice.mask = masks.place(before, c);
      check(module, p, module.forward(problemArg(module, slice), at.scratch, scratchFloats, threads));
      const after = memory.heap;
      copySlice(after, at.output, output, p.o, p.layout, queryRows, p.qLen, p.valueDim, 'out');
      if (weights !== null) {
        copySlice(after, at.weights, weights, denseStrides(p, p.kvLen), 'bhsd', queryRows, p.qLen, p.kvLen, 'out');
      }
      if (lse !== null) copySlice(after, at.logSumExp, lse, denseStrides(p, 1), 'bhsd', queryRows, p.qLen, 1, 'out');
    }
    if (outShared) (p.out as Float32Array).set(output);
    const result: SdpaResult = { output: { data: p.outResult ?? output, dims: p.outputDims } };
    if (weights !== null) result.weights = { data: weights, dims: p.weightsDims as number[] };
    if (lse !== null) result.logSumExp = { data: lse, dims: p.lseDims as number[] };
    return result;
  } finally {
    memory.free();
  }
}
