// sdpa-wasm: scaled dot-product attention in WebAssembly SIMD.
//
//   const attn = await createAttention();
//   const { output } = attn.sdpa(query, key, value, { isCausal: true });
//   attn.dispose();
//
// query [B, Hq, Lq, E], key [B, Hkv, Lk, E], value [B, Hkv, Lk, Ev] → output [B, Hq, Lq, Ev]
// (rank 3 and 2 drop leading axes of 1; layout 'bshd' swaps H and L). Hq % Hkv == 0.
import { acquireModule, hardwareThreads, threadsAvailable, type ModuleHandle } from './loader.js';
import type { ProblemDesc, SdpaModule } from './wasm/sdpa.mjs';
import type { AttentionOptions, SdpaOptions, SdpaResult, Tensor } from './types.js';
import { plan, type Plan } from './validate.js';

export type { AttentionOptions, MaskTensor, SdpaOptions, SdpaResult, Tensor } from './types.js';

const MASK_KIND = { float: 1, bool: 2 } as const;
/** The wasm memory limit (-sMAXIMUM_MEMORY=2GB in CMakeLists.txt). */
const MAX_WASM_BYTES = 2 ** 31;
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

export class Attention {
  /** Threads the kernel runs on: > 1 means the threaded build (pthreads in Web Workers). */
  readonly threads: number;
  /** Whether the 128-bit SIMD kernel is in use (always: the package requires wasm SIMD). */
  readonly simd = true;
  #handle: ModuleHandle | null;
  // With threads > 1, also the single-threaded build, for streamed decoding: that runs on
  // one thread anyway, and copies into its plain (unshared) memory are faster than into the
  // threaded build's SharedArrayBuffer (measured 1.4–1.7× slower there).
  #streamHandle: ModuleHandle | null;

  /** @internal Use createAttention(). */
  constructor(handle: ModuleHandle, streamHandle: ModuleHandle | null = null) {
    this.#handle = handle;
    this.#streamHandle = streamHandle;
    this.threads = handle.threads;
  }

  /**
   * softmax(query·keyᵀ·scale + mask)·value. Inputs are never modified; the same inputs give
   * bitwise-identical outputs. Throws TypeError/RangeError on bad input (the instance stays
   * usable).
   */
  sdpa(query: Tensor, key: Tensor, value: Tensor, options?: SdpaOptions): SdpaResult {
    const handle = this.#handle;
    if (handle === null) throw new Error('sdpa: this Attention instance has been disposed');
    const p = plan(query, key, value, options);
    return run(handle.module, handle.threads, this.#streamHandle?.module ?? null, p, query.data, key.data, value.data);
  }

  /**
   * Releases the instance; sdpa() then throws. The last instance of a thread count to be
   * disposed terminates that pool's workers (so Node can exit). Calling it twice is harmless.
   */
  dispose(): void {
    this.#handle?.release();
    this.#streamHandle?.release();
    this.#handle = null;
    this.#streamHandle = null;
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** The most threads createAttention() uses unless asked for more. */
export const DEFAULT_MAX_THREADS = 4;
/** The most threads createAttention() accepts. */
export const MAX_THREADS = 64;

/**
 * Loads the wasm module (once per page or process, and per thread count for the threaded
 * build) and returns an attention instance.
 *
 * `threads` defaults to the number of logical processors (os.availableParallelism() in Node,
 * navigator.hardwareConcurrency in browsers), at most DEFAULT_MAX_THREADS. More than one
 * thread needs SharedArrayBuffer: always there in Node; in browsers only on cross-origin
 * isolated pages (served with COOP: same-origin and COEP: require-corp). Elsewhere the
 * single-threaded build is used and `attn.threads` is 1.
 */
export async function createAttention(options: AttentionOptions = {}): Promise<Attention> {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw new TypeError(`createAttention: options must be an object, got ${String(options)}`);
  }
  for (const name of Object.keys(options)) {
    if (name !== 'threads') throw new TypeError(`createAttention: unknown option "${name}"; known options: threads`);
  }
  const { threads } = options;
  if (threads !== undefined) {
    if (typeof threads !== 'number') {
      throw new TypeError(`createAttention: options.threads must be a number, got ${String(threads)}`);
    }
    if (!Number.isInteger(threads) || threads < 1 || threads > MAX_THREADS) {
      throw new RangeError(`createAttention: options.threads must be an integer in [1, ${MAX_THREADS}], got ${threads}`);
    }
  }
  const wanted = threads ?? Math.min(await hardwareThreads(), DEFAULT_MAX_THREADS);
  const handle = await acquireModule(threadsAvailable() ? wanted : 1);
  if (handle.threads === 1) return new Attention(handle);
  try {
    return new Attention(handle, await acquireModule(1));
  } catch (error) {
    handle.release();
    throw error;
  }
}

// The kernel's view of a validated problem; the addresses are filled in once allocated.
function describeProblem(p: Plan): ProblemDesc {
  return {
    batch: p.batch, qHeads: p.qHeads, kvHeads: p.kvHeads, qLen: p.qLen, kvLen: p.kvLen,
    headDim: p.headDim, valueDim: p.valueDim,
    query: 0, key: 0, value: 0, output: 0, weights: 0, mask: 0, causalOffsets: 0, keyLengths: 0,
    qStrideB: p.q.b, qStrideH: p.q.h, qStrideL: p.q.l,
    kStrideB: p.k.b, kStrideH: p.k.h, kStrideL: p.k.l,
    vStrideB: p.v.b, vStrideH: p.v.h, vStrideL: p.v.l,
    oStrideB: p.o.b, oStrideH: p.o.h, oStrideL: p.o.l,
    maskKind: p.mask === null ? 0 : MASK_KIND[p.mask.kind],
    maskStrideB: p.mask?.strides[0] ?? 0, maskStrideH: p.mask?.strides[1] ?? 0,
    maskStrideQ: p.mask?.strides[2] ?? 0, maskStrideK: p.mask?.strides[3] ?? 0,
    scale: p.scale, softcap: p.softcap, causal: p.causal, causalOffset: p.causalOffset,
  };
}

function overlaps(a: Float32Array, b: Float32Array): boolean {
  return a.buffer === b.buffer && a.byteOffset < b.byteOffset + b.byteLength && b.byteOffset < a.byteOffset + a.byteLength;
}

// Copies the inputs into wasm memory, runs the kernel, copies the results out, and frees
// every allocation whatever happens. A streamed decode runs on `streamModule` if given.
function run(mainModule: SdpaModule, threads: number, streamModule: SdpaModule | null, p: Plan,
  q: Float32Array, k: Float32Array, v: Float32Array): SdpaResult {
  const desc = describeProblem(p);
  const stream = p.layout === 'bhsd' && p.weightsDims === null &&
    k.byteLength + v.byteLength >= STREAM_MIN_BYTES && mainModule.readsKeysInPlace(desc);
  const module = stream && streamModule !== null ? streamModule : mainModule;
  const pairs = p.batch * p.kvHeads;
  // One (batch, KV head)'s Q rows, K, V and output. Not streamed when `out` shares memory
  // with an input: a pair's output would overwrite inputs of pairs not yet copied in (the
  // whole copy-in comes first otherwise).
  const pairBytes = 4 * ((p.qHeads / p.kvHeads) * (p.q.h + p.o.h) + p.k.h + p.v.h);
  const streamPrefill = !stream && threads === 1 && p.layout === 'bhsd' && p.weightsDims === null && pairs > 1 &&
    q.byteLength + k.byteLength + v.byteLength >= PREFILL_STREAM_MIN_BYTES && pairBytes <= PREFILL_STREAM_MAX_PAIR_BYTES &&
    (p.out === null || ![q, k, v].some((input) => overlaps(input, p.out as Float32Array)));
  const allocations: number[] = [];
  const alloc = (bytes: number, what: string): number => {
    // _malloc takes a 32-bit size: anything at or above the 2 GiB memory limit is refused
    // here, before it could wrap around to a small allocation.
    const address = bytes === 0 || bytes >= MAX_WASM_BYTES ? 0 : module._malloc(bytes);
    if (bytes !== 0 && address === 0) {
      throw new RangeError(
        `sdpa: cannot allocate ${bytes} bytes of wasm memory for ${what} (the module's memory is limited to 2 GiB)`);
    }
    if (address !== 0) allocations.push(address);
    return address;
  };
  try {
    // Streaming: the kernel sees one (batch, KV head) at a time, [1, Hq/Hkv, Lq, E] against
    // [1, 1, Lk, E], with every pointer below moved to that pair's rows (and for decode, its
    // keys one segment at a time). It runs on this thread alone: the copies in between are
    // serial. A streamed prefill holds one pair's Q, K, V and output in wasm memory at a time.
    const group = p.qHeads / p.kvHeads;
    const pairDesc: ProblemDesc = stream || streamPrefill
      ? { ...desc, batch: 1, qHeads: group, kvHeads: 1, kStrideB: 0, kStrideH: 0, vStrideB: 0, vStrideH: 0 }
      : desc;
    const segmentKeys = stream ? module.segmentKeys() : 0;
    const scratchFloats = stream ? module.segmentScratchFloats(pairDesc) : module.scratchFloats(pairDesc, threads);
    const scratch = alloc(scratchFloats * 4, 'scratch');
    const partials = stream ? alloc(module.segmentPartialsFloats(pairDesc) * 4, 'scratch') : 0;
    const pairQueryFloats = group * p.q.h, pairOutputFloats = group * p.o.h;
    desc.query = alloc(streamPrefill ? pairQueryFloats * 4 : q.byteLength, 'query');
    const keyFloats = stream ? Math.min(segmentKeys, p.kvLen) * p.headDim : streamPrefill ? p.k.h : k.length;
    const valueFloats = stream ? Math.min(segmentKeys, p.kvLen) * p.valueDim : streamPrefill ? p.v.h : v.length;
    desc.key = alloc(keyFloats * 4, 'key');
    desc.value = alloc(valueFloats * 4, 'value');
    desc.output = alloc((streamPrefill ? pairOutputFloats : p.outputSize) * 4, 'the output');
    desc.weights = alloc(p.weightsSize * 4, 'the weights');
    if (p.mask !== null) desc.mask = alloc(p.mask.data.byteLength, 'options.attnMask');
    if (p.causalOffsets !== null) desc.causalOffsets = alloc(p.causalOffsets.byteLength, 'options.causalOffset');
    if (p.keyLengths !== null) desc.keyLengths = alloc(p.keyLengths.byteLength, 'options.keyLengths');

    // Heap views are read only after the last allocation: growing memory detaches them.
    const f32 = module.HEAPF32, i32 = module.HEAP32, u8 = module.HEAPU8;
    if (!streamPrefill) f32.set(q, desc.query >>> 2);
    if (p.mask !== null) {
      if (p.mask.kind === 'float') f32.set(p.mask.data, desc.mask >>> 2);
      else u8.set(p.mask.data, desc.mask);
    }
    if (p.causalOffsets !== null) i32.set(p.causalOffsets, desc.causalOffsets >>> 2);
    if (p.keyLengths !== null) i32.set(p.keyLengths, desc.keyLengths >>> 2);

    const check = (status: number) => {
      if (status !== 0) {
        // plan() checks everything the kernel checks; reaching this is a bug in sdpa-wasm.
        throw new Error(`sdpa: internal error: the kernel rejected a validated problem (${module.statusName(status)})`);
      }
    };
    // The mask, causal offsets and key lengths stay whole in wasm memory; for one (batch, KV
    // head) their addresses move to its batch and first query head (the strides stay).
    const maskElementBytes = p.mask?.kind === 'float' ? 4 : 1;
    const pairMask = (b: number, firstHead: number) =>
      p.mask === null ? 0 : desc.mask + maskElementBytes * (b * p.mask.strides[0] + firstHead * p.mask.strides[1]);
    const pairCausalOffsets = (b: number) => (p.causalOffsets === null ? 0 : desc.causalOffsets + 4 * b);
    const pairKeyLengths = (b: number) => (p.keyLengths === null ? 0 : desc.keyLengths + 4 * b);
    let streamedOutput: Float32Array | null = null;
    if (streamPrefill) {
      streamedOutput = p.out !== null ? p.out : new Float32Array(p.outputSize);
      Object.assign(pairDesc, { query: desc.query, key: desc.key, value: desc.value, output: desc.output });
      for (let pair = 0; pair < pairs; pair++) {
        const b = Math.floor(pair / p.kvHeads), kvHead = pair % p.kvHeads, firstHead = kvHead * group;
        const qAt = b * p.q.b + firstHead * p.q.h, kAt = b * p.k.b + kvHead * p.k.h, vAt = b * p.v.b + kvHead * p.v.h;
        const heap = module.HEAPF32;
        heap.set(q.subarray(qAt, qAt + pairQueryFloats), desc.query >>> 2);
        heap.set(k.subarray(kAt, kAt + p.k.h), desc.key >>> 2);
        heap.set(v.subarray(vAt, vAt + p.v.h), desc.value >>> 2);
        pairDesc.mask = pairMask(b, firstHead);
        pairDesc.causalOffsets = pairCausalOffsets(b);
        pairDesc.keyLengths = pairKeyLengths(b);
        check(module.forward(pairDesc, scratch, scratchFloats, threads));
        streamedOutput.set(heap.subarray(desc.output >>> 2, (desc.output >>> 2) + pairOutputFloats), b * p.o.b + firstHead * p.o.h);
      }
    } else if (!stream) {
      f32.set(k, desc.key >>> 2);
      f32.set(v, desc.value >>> 2);
      check(module.forward(desc, scratch, scratchFloats, threads));
    } else {
      const segments = module.segmentCount(pairDesc);
      const pairKeyFloats = p.kvLen * p.headDim, pairValueFloats = p.kvLen * p.valueDim;
      const streamer = new module.SegmentStream(pairDesc);
      try {
        for (let pair = 0; pair < pairs; pair++) {
          const b = Math.floor(pair / p.kvHeads), firstHead = (pair % p.kvHeads) * group;
          streamer.setPair(
            desc.query + 4 * (b * p.q.b + firstHead * p.q.h),
            desc.output + 4 * (b * p.o.b + firstHead * p.o.h),
            pairMask(b, firstHead), pairCausalOffsets(b), pairKeyLengths(b));
          const keyRows = pair * pairKeyFloats, valueRows = pair * pairValueFloats;
          for (let segment = 0; segment < segments; segment++) {
            const begin = segment * segmentKeys, end = Math.min(p.kvLen, begin + segmentKeys);
            f32.set(k.subarray(keyRows + begin * p.headDim, keyRows + end * p.headDim), desc.key >>> 2);
            f32.set(v.subarray(valueRows + begin * p.valueDim, valueRows + end * p.valueDim), desc.value >>> 2);
            check(streamer.forward(segment, desc.key, desc.value, partials, scratch, scratchFloats));
          }
          check(streamer.merge(partials));
        }
      } finally {
        streamer.delete();
      }
    }

    const heap = module.HEAPF32;
    let output: Float32Array;
    if (streamedOutput !== null) {
      output = streamedOutput.length === p.outputSize ? streamedOutput : streamedOutput.subarray(0, p.outputSize);
    } else if (p.out !== null) {
      p.out.set(heap.subarray(desc.output >>> 2, (desc.output >>> 2) + p.outputSize));
      output = p.out.length === p.outputSize ? p.out : p.out.subarray(0, p.outputSize);
    } else {
      output = heap.slice(desc.output >>> 2, (desc.output >>> 2) + p.outputSize);
    }
    const result: SdpaResult = { output: { data: output, dims: p.outputDims } };
    if (p.weightsDims !== null) {
      const w = heap.slice(desc.weights >>> 2, (desc.weights >>> 2) + p.weightsSize);
      result.weights = { data: w, dims: p.weightsDims };
    }
    return result;
  } finally {
    for (const address of allocations) module._free(address);
  }
}
