// Attention (the direct API) and createAttention(). Re-exported by index.ts; imported alone by
// the worker (worker-entry.ts), whose bundle must not contain createAttentionWorker.
import { checkCacheOptions, KVCache } from './kv-cache.js';
import { acquireModule, defaultIsa, hardwareThreads, threadsAvailable, type Isa, type ModuleHandle } from './loader.js';
import { runBackward } from './backward.js';
import { CallMemory, MemoryAccount } from './memory.js';
import { checkSaved, inputsRecord, remember, resultsRecord } from './saved-forward.js';
import { runSdpa } from './strategies.js';
import { planVarlen, planVarlenBackward, runVarlen, runVarlenBackward } from './varlen.js';
import type {
  AttentionOptions, KVCacheOptions, MemoryInfo, SdpaBackwardOptions, SdpaBackwardResult, SdpaBackwardResultWithMaskGrad, SdpaBackwardResultWithSinkGrad, SdpaOptions, SdpaResult, SdpaResultWith,
  SdpaVarlenBackwardOptions, SdpaVarlenBackwardResult, SdpaVarlenOptions, SdpaVarlenResult, SdpaVarlenResultWithLogSumExp, InputTensor, Tensor,
} from './types.js';
import { checkAttentionOptions, DEFAULT_MAX_THREADS, FactoryGate, plan, planBackward, type SdpaPlan } from './validate.js';

/**
 * A forward call (`run`, of plan `p`) whose log-sum-exp, when returned, is remembered with what
 * made it (saved-forward.ts): what a backward call checks options.saved against. The inputs'
 * part is taken before the call runs (out may be one of them).
 */
function recorded(p: SdpaPlan, run: () => SdpaResult): SdpaResult {
  const inputs = p.lseDims !== null ? inputsRecord(p, p.keyData, p.valueData) : null;
  const result = run();
  if (inputs !== null && result.logSumExp !== undefined) {
    remember(result.logSumExp.data, [...inputs, ...resultsRecord(p, result.output.data, result.logSumExp.data)]);
  }
  return result;
}

const ATTENTION_GATE = new FactoryGate('Attention', 'await createAttention(options?)');

export class Attention {
  /** Threads the kernel runs on: > 1 means the threaded build (pthreads in Web Workers). */
  readonly threads: number;
  /** Whether the 128-bit SIMD kernel is in use (always: the package requires wasm SIMD). */
  readonly simd = true;
  /**
   * The build's instruction set: 'relaxed-simd' (fused multiply-adds, where the engine runs
   * them) or 'simd128' (portable). See AttentionOptions.relaxedSimd.
   */
  readonly isa: Isa;
  #handle: ModuleHandle | null;
  // With threads > 1, also the single-threaded build, for streamed decoding: that runs on
  // one thread anyway, and copies into its plain (unshared) memory are faster than into the
  // threaded build's SharedArrayBuffer (measured 1.4–1.7× slower there).
  #streamHandle: ModuleHandle | null;
  readonly #caches = new Set<KVCache>();
  readonly #account: MemoryAccount;

  /** @internal Use createAttention(). */
  static create(handle: ModuleHandle, streamHandle: ModuleHandle | null, maxMemoryBytes?: number): Attention {
    return ATTENTION_GATE.make(() => new Attention(handle, streamHandle, maxMemoryBytes));
  }

  private constructor(handle: ModuleHandle, streamHandle: ModuleHandle | null, maxMemoryBytes?: number) {
    ATTENTION_GATE.check();
    this.#handle = handle;
    this.#streamHandle = streamHandle;
    this.#account = new MemoryAccount(maxMemoryBytes);
    this.threads = handle.threads;
    this.isa = handle.isa;
  }

  #live(fn: string): ModuleHandle {
    if (this.#handle === null) throw new Error(`${fn}: this Attention instance has been disposed`);
    return this.#handle;
  }

  /**
   * softmax(query·keyᵀ·scale + mask)·value. Inputs are never modified; the same inputs give
   * bitwise-identical outputs. Throws TypeError/RangeError on bad input (the instance stays
   * usable).
   */
  sdpa(query: InputTensor, key: InputTensor, value: InputTensor, options: SdpaOptions & { returnWeights: true; returnLogSumExp: true }): SdpaResultWith<'weights' | 'logSumExp'>;
  sdpa(query: InputTensor, key: InputTensor, value: InputTensor, options: SdpaOptions & { returnWeights: true }): SdpaResultWith<'weights'>;
  sdpa(query: InputTensor, key: InputTensor, value: InputTensor, options: SdpaOptions & { returnLogSumExp: true }): SdpaResultWith<'logSumExp'>;
  sdpa(query: InputTensor, key: InputTensor, value: InputTensor, options?: SdpaOptions): SdpaResult;
  sdpa(query: InputTensor, key: InputTensor, value: InputTensor, options?: SdpaOptions): SdpaResult {
    this.#live('sdpa');
    const p = plan(query, key, value, options);
    const handle = this.#live('sdpa');  // again: the arguments' getters may have disposed it
    const engines = {
      main: handle.module, threads: handle.threads, single: this.#streamHandle?.module ?? null, account: this.#account,
    };
    return recorded(p, () => runSdpa(engines, p, p.queryData, p.keyData, p.valueData));  // the arrays the checks read
  }

  /**
   * The gradients of a loss L with respect to query, key and value, given
   * `gradOutput` = ∂L/∂output ([..., Hq, Lq, Ev], the output's dims): `{ dQuery, dKey, dValue }`
   * with the inputs' dims. `options` are the forward call's score options (scale, softcap,
   * attnMask, isCausal, causalOffset, slidingWindow, keyLengths, keyStarts, sinks, alibiSlopes, layout),
   * `returnMaskGrad: true` for `dAttnMask` as well (a float mask's gradient, with its dims, summed
   * where it broadcasts), `dSinks` [Hq] whenever `sinks` are given, and
   * optionally `saved: { output, logSumExp }` from sdpa(..., { returnLogSumExp: true }), else
   * the forward is recomputed here (the same bits either way); a `saved` whose logSumExp array
   * sdpa() returned is checked against that call (saved-forward.ts). Fully masked rows and keys no
   * row attends get exact zeros. Bitwise the same for any thread count.
   */
  sdpaBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options: SdpaBackwardOptions & { returnMaskGrad: true; sinks: Float32Array }): SdpaBackwardResultWithMaskGrad & SdpaBackwardResultWithSinkGrad;
  sdpaBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options: SdpaBackwardOptions & { returnMaskGrad: true }): SdpaBackwardResultWithMaskGrad;
  sdpaBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options: SdpaBackwardOptions & { sinks: Float32Array }): SdpaBackwardResultWithSinkGrad;
  sdpaBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor, options?: SdpaBackwardOptions): SdpaBackwardResult;
  sdpaBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options?: SdpaBackwardOptions): SdpaBackwardResult {
    this.#live('sdpaBackward');
    const bp = planBackward(query, key, value, gradOutput, options);
    checkSaved('sdpaBackward', bp);  // saved against the sdpa() call that returned it, if one did
    const handle = this.#live('sdpaBackward');  // again: the arguments' getters may have disposed it
    return runBackward(new CallMemory(handle.module, this.#account, 'sdpaBackward'), handle.threads, bp,
      bp.forward.queryData, bp.forward.keyData, bp.forward.valueData);
  }

  /**
   * Sequences of different lengths packed back to back, without padding (FlashAttention's
   * varlen API): `query` `[Tq, Hq, E]`, `key` `[Tk, Hkv, E]`, `value` `[Tk, Hkv, Ev]` →
   * `output` `[Tq, Hq, Ev]`, where sequence `s` is the query rows `cuSeqlensQ[s]` to
   * `cuSeqlensQ[s + 1] - 1` attending only its own keys (`cuSeqlensK`, default `cuSeqlensQ`).
   * Each sequence's rows are what sdpa() gives that sequence alone (its own causal offset,
   * default bottom-right, `Lk_s − Lq_s`); the work is Σ Lq_s·Lk_s, not the padded batch's.
   * `logSumExp` is `[Hq, Tq]`. Bitwise the same for any thread count.
   */
  sdpaVarlen(query: InputTensor, key: InputTensor, value: InputTensor, options: SdpaVarlenOptions & { returnLogSumExp: true }): SdpaVarlenResultWithLogSumExp;
  sdpaVarlen(query: InputTensor, key: InputTensor, value: InputTensor, options: SdpaVarlenOptions): SdpaVarlenResult;
  sdpaVarlen(query: InputTensor, key: InputTensor, value: InputTensor, options: SdpaVarlenOptions): SdpaVarlenResult {
    this.#live('sdpaVarlen');
    const p = planVarlen(query, key, value, options);
    const handle = this.#live('sdpaVarlen');  // again: the arguments' getters may have disposed it
    return recorded(p, () => runVarlen(new CallMemory(handle.module, this.#account, 'sdpaVarlen'), handle.threads, p));
  }

  /**
   * The gradients of sdpaVarlen(): `{ dQuery, dKey, dValue }` packed as the inputs (and `dSinks`
   * `[Hq]` with sinks, summed over every sequence), given `gradOutput` `[Tq, Hq, Ev]`. `options`
   * are the forward's (cuSeqlensQ, cuSeqlensK and the score options), `saved` (sdpaVarlen's
   * output and logSumExp, checked as sdpaBackward checks it), `out`, `accumulate`. Each
   * sequence's gradients are sdpaBackward()'s for it alone. Bitwise the same for any thread count.
   */
  sdpaVarlenBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options: SdpaVarlenBackwardOptions & { sinks: Float32Array }): SdpaVarlenBackwardResult & { dSinks: Tensor };
  sdpaVarlenBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options: SdpaVarlenBackwardOptions): SdpaVarlenBackwardResult;
  sdpaVarlenBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options: SdpaVarlenBackwardOptions): SdpaVarlenBackwardResult {
    this.#live('sdpaVarlenBackward');
    const bp = planVarlenBackward(query, key, value, gradOutput, options);
    checkSaved('sdpaVarlenBackward', bp);  // saved against the sdpaVarlen() call that returned it, if one did
    const handle = this.#live('sdpaVarlenBackward');  // again: the arguments' getters may have disposed it
    return runVarlenBackward(new CallMemory(handle.module, this.#account, 'sdpaVarlenBackward'), handle.threads, bp);
  }

  /**
   * A KV cache in this instance's wasm memory, for decoding token by token: storage for
   * `maxLength` positions of `[B, Hkv, ·, E]` keys and `[B, Hkv, ·, Ev]` values, float32 or
   * float16, allocated now (a RangeError saying the bytes needed and the limit if it cannot
   * fit). `cache.append(key, value)` stores new positions; `cache.attend(query, options)` is
   * sdpa() against the stored ones, read in place (causal, bottom-right aligned, by default).
   * Disposing the instance disposes its caches.
   */
  createKVCache(options: KVCacheOptions): KVCache {
    this.#live('createKVCache');
    const shape = checkCacheOptions(options);
    const handle = this.#live('createKVCache');  // again: the options' getters may have disposed it
    const cache = KVCache.create(handle.module, this.#account, handle.threads, shape, (c) => this.#caches.delete(c));
    this.#caches.add(cache);
    return cache;
  }

  /**
   * What the instance holds in wasm memory now, its peak, the memory's size and the limit
   * (AttentionOptions.maxMemoryBytes). After every call returns, bytesInUse is the storage of
   * its live KV caches: a call's blocks are freed whether it succeeds or throws.
   */
  memory(): MemoryInfo {
    const handle = this.#live('memory');
    const modules = [handle.module, ...(this.#streamHandle === null ? [] : [this.#streamHandle.module])];
    return {
      bytesInUse: this.#account.bytesInUse,
      peakBytes: this.#account.peakBytes,
      capacityBytes: modules.reduce((sum, m) => sum + m.HEAPU8.buffer.byteLength, 0),
      limitBytes: this.#account.limitBytes,
      moduleBytesInUse: modules.reduce((sum, m) => sum + m.heapBytesInUse(), 0),
    };
  }

  /**
   * Releases the instance and disposes its KV caches; sdpa() then throws. The last instance of
   * a thread count to be disposed terminates that pool's workers (so Node can exit). Calling it
   * twice is harmless.
   */
  dispose(): void {
    for (const cache of [...this.#caches]) cache.dispose();
    this.#handle?.release();
    this.#streamHandle?.release();
    this.#handle = null;
    this.#streamHandle = null;
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

export { DEFAULT_MAX_THREADS, MAX_THREADS } from './validate.js';

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
  const { threads, relaxedSimd, maxMemoryBytes } = checkAttentionOptions('createAttention', options);
  const isa: Isa = relaxedSimd === false ? 'simd128' : defaultIsa();
  const wanted = threads ?? Math.min(await hardwareThreads(), DEFAULT_MAX_THREADS);
  const handle = await acquireModule(threadsAvailable() ? wanted : 1, isa);
  if (handle.threads === 1) return Attention.create(handle, null, maxMemoryBytes);
  try {
    // The same instruction set: results stay bitwise the same for any thread count.
    return Attention.create(handle, await acquireModule(1, isa), maxMemoryBytes);
  } catch (error) {
    handle.release();
    throw error;
  }
}
