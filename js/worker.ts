// createAttentionWorker(): an Attention instance in a dedicated worker, so a page (or a Node
// event loop) never blocks while attention runs. The API mirrors Attention and KVCache with
// promises; results are bitwise those of the direct API (the same code runs in the worker).
//
//   calling side                                 worker (worker-entry.ts)
//   ─────────────────────────                    ─────────────────────────
//   call: take the inputs (copy, or move with    holds Attention + its KV caches
//         { transfer: true }), queue the call
//   send: check each waiting call with the       runs each request of the batch in order,
//         direct API's checks, send them as      answers each as it is done (output
//         one batch                              buffers transferred)
//   reply: settle; after the batch's last, send the calls that have been waiting
//
// So:
//   - calls run in the order they were made, and a call's checks see the cache as the calls
//     before it will leave it, so its errors are the direct API's;
//   - a call not yet sent is still here: its AbortSignal removes it from the queue;
//   - calls made in one synchronous stretch travel together (append + attend: one round trip).
// Inputs are taken when the call is made (copied or moved), so later changes to the caller's
// arrays do not reach a queued call.
//
// The calling side's files: this one, the public classes (each call's checks and what it
// sends); worker-args.ts, taking the inputs and the worker-only options; worker-channel.ts,
// starting the worker and the queue of calls.
import type { Isa } from './loader.js';
import {
  APPEND_OPTION_NAMES, cacheOperands, changedByGetter, checkAppend, checkAppendShapes, checkCacheOptions, checkRead, checkReadDType, checkRemove,
  checkReorder, checkTruncate, READ_OPTION_NAMES,
  KVCacheShapeInfo,
  type KVCacheShape,
} from './kv-cache.js';
import type {
  AttentionWorkerOptions, KVAppendOptions, KVCacheContents, KVCacheOptions, KVReadOptions, KVTensor, MemoryInfo, SdpaBackwardOptions, SdpaBackwardResult, SdpaBackwardResultWithMaskGrad, SdpaBackwardResultWithSinkGrad, SdpaOptions, SdpaResult,
  SdpaResultWith, SdpaVarlenBackwardOptions, SdpaVarlenBackwardResult, SdpaVarlenOptions, SdpaVarlenResult,
  SdpaVarlenResultWithLogSumExp, InputTensor, Tensor,
} from './types.js';
import { planVarlen, planVarlenBackward, VARLEN_BACKWARD_OPTION_NAMES, VARLEN_OPTION_NAMES } from './varlen.js';
import {
  BACKWARD_OPTION_NAMES, type BackwardPlan, checkAttendQuery, checkAttentionOptions, checkLayout, checkOptionNames, checkOut, FactoryGate, OPTION_NAMES, plan,
  planAttend, planBackward, type Plan,
} from './validate.js';
import { recalled, remember, type ForwardRecord } from './saved-forward.js';
import {
  deliver, deliverGradients, optionValues, outOf, outsOf, sendable, signalOnly, Taker, workerCallOptions, type WorkerCallOptions,
} from './worker-args.js';
import { abortReason, Channel, PREPARE_AFTER_ANSWERS, startWorker } from './worker-channel.js';
import type { Op } from './worker-protocol.js';

export type { WorkerCallOptions } from './worker-args.js';

export type WorkerSdpaOptions = SdpaOptions & WorkerCallOptions;

const rejectNow = (error: unknown) => Promise.reject(error);

/** Runs `body`, turning a synchronous throw into a rejected promise (every method is async). */
function settle<T>(body: () => Promise<T>): Promise<T> {
  try {
    return body();
  } catch (error) {
    return rejectNow(error);
  }
}

/** What the worker's Attention instance reports. */
interface WorkerInfo {
  threads: number;
  simd: true;
  isa: Isa;
}

// ─── the public classes ───────────────────────────────────────────────────────────────────

const WORKER_GATE = new FactoryGate('AttentionWorker', 'await createAttentionWorker(options?)');

export class AttentionWorker {
  /** Threads the kernel runs on inside the worker (> 1: the threaded build, nested workers). */
  readonly threads: number;
  /** Whether the 128-bit SIMD kernel is in use (always). */
  readonly simd: true;
  /** The worker's build: 'relaxed-simd' or 'simd128', as Attention.isa. */
  readonly isa: Isa;
  readonly #channel: Channel;
  readonly #caches = new Set<WorkerKVCache>();
  #nextCache = 1;
  #disposing: Promise<void> | null = null;
  /** How it ended, for the messages of later calls. */
  #ended: 'disposed' | 'terminated' | null = null;

  /** @internal Use createAttentionWorker(). */
  static create(channel: Channel, info: WorkerInfo): AttentionWorker {
    return WORKER_GATE.make(() => new AttentionWorker(channel, info));
  }

  private constructor(channel: Channel, info: WorkerInfo) {
    WORKER_GATE.check();
    this.#channel = channel;
    this.threads = info.threads;
    this.simd = info.simd;
    this.isa = info.isa;
  }

  /** @internal For tests: the underlying Worker (a worker_threads Worker in Node). */
  get [Symbol.for('sdpa-wasm.worker')](): unknown {
    return this.#channel.raw;
  }

  #check(fn: string): void {
    if (this.#ended !== null) throw new Error(`${fn}: this AttentionWorker has been ${this.#ended}`);
    if (this.#channel.dead !== null) throw this.#channel.dead;
  }

  /**
   * Attention.sdpa() in the worker: the same result (bitwise) and the same errors (as
   * rejections). Inputs are copied when called, or moved with `{ transfer: true }`; `out`
   * receives the output when the call completes; `{ signal }` cancels it while it waits.
   */
  sdpa(query: InputTensor, key: InputTensor, value: InputTensor,
    options: WorkerSdpaOptions & { returnWeights: true; returnLogSumExp: true }): Promise<SdpaResultWith<'weights' | 'logSumExp'>>;
  sdpa(query: InputTensor, key: InputTensor, value: InputTensor, options: WorkerSdpaOptions & { returnWeights: true }): Promise<SdpaResultWith<'weights'>>;
  sdpa(query: InputTensor, key: InputTensor, value: InputTensor, options: WorkerSdpaOptions & { returnLogSumExp: true }): Promise<SdpaResultWith<'logSumExp'>>;
  sdpa(query: InputTensor, key: InputTensor, value: InputTensor, options?: WorkerSdpaOptions): Promise<SdpaResult>;
  sdpa(query: InputTensor, key: InputTensor, value: InputTensor, options?: WorkerSdpaOptions): Promise<SdpaResult> {
    return this.#forward('sdpa', OPTION_NAMES, plan, query, key, value, options);
  }

  /**
   * A forward call (sdpa, sdpaVarlen) in the worker: the tensors taken (copied or moved), the
   * options as the direct API reads them, `check` (the direct API's checks) run before anything
   * moves and again when the call is sent; the result written into `out`, and its log-sum-exp's
   * record kept for a backward call's check of options.saved (saved-forward.ts).
   */
  #forward(fn: 'sdpa' | 'sdpaVarlen', names: readonly string[], check: (q: unknown, k: unknown, v: unknown, o: unknown) => Plan,
    query: unknown, key: unknown, value: unknown, options: unknown): Promise<SdpaResult> {
    return settle(() => {
      this.#check(fn);
      const { signal, transfer } = workerCallOptions(fn, options);
      const take = new Taker(transfer);
      const values = optionValues(options, names);  // read first, as the direct API reads them
      const q = take.tensor(query, true), k = take.tensor(key, true), v = take.tensor(value, true);
      const o = take.options(values);
      this.#check(fn);  // again: the arguments' getters may have disposed it (then nothing moves)
      take.movesChecked(fn, outsOf(o), () => check(q, k, v, o));
      take.done(signal);
      let checked: Plan;
      return this.#channel.call(fn, () => {
        checked = check(q, k, v, o);
        return { query: q, key: k, value: v, options: sendable(o) };
      }, (reply) => {
        const { result, record } = reply as { result: SdpaResult; record: ForwardRecord | undefined };
        const delivered = deliver(result, checked);
        if (record !== undefined && delivered.logSumExp !== undefined) remember(delivered.logSumExp.data, record);
        return delivered;
      }, signal);
    });
  }

  /**
   * Attention.sdpaBackward() in the worker: the same gradients (bitwise) and errors. Query,
   * key, value and gradOutput are copied, or moved with `{ transfer: true }`; `saved` is copied
   * (and checked against the sdpa() call that returned it, as by the direct API).
   */
  sdpaBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options: SdpaBackwardOptions & WorkerCallOptions & { returnMaskGrad: true; sinks: Float32Array }):
    Promise<SdpaBackwardResultWithMaskGrad & SdpaBackwardResultWithSinkGrad>;
  sdpaBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options: SdpaBackwardOptions & WorkerCallOptions & { returnMaskGrad: true }): Promise<SdpaBackwardResultWithMaskGrad>;
  sdpaBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options: SdpaBackwardOptions & WorkerCallOptions & { sinks: Float32Array }): Promise<SdpaBackwardResultWithSinkGrad>;
  sdpaBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options?: SdpaBackwardOptions & WorkerCallOptions): Promise<SdpaBackwardResult>;
  sdpaBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options?: SdpaBackwardOptions & WorkerCallOptions): Promise<SdpaBackwardResult> {
    return this.#backward('sdpaBackward', BACKWARD_OPTION_NAMES, planBackward, query, key, value, gradOutput, options);
  }

  /**
   * A backward call (sdpaBackward, sdpaVarlenBackward) in the worker: as #forward, with dO, and
   * the record of the forward call whose log-sum-exp options.saved holds sent along (Taker.copy
   * kept it for the copy), so that the worker checks saved as the direct API does.
   */
  #backward(fn: 'sdpaBackward' | 'sdpaVarlenBackward', names: readonly string[],
    check: (q: unknown, k: unknown, v: unknown, go: unknown, o: unknown) => BackwardPlan,
    query: unknown, key: unknown, value: unknown, gradOutput: unknown, options: unknown): Promise<SdpaBackwardResult> {
    return settle(() => {
      this.#check(fn);
      const { signal, transfer } = workerCallOptions(fn, options);
      const take = new Taker(transfer);
      const values = optionValues(options, names);  // read first, as the direct API reads them
      const q = take.tensor(query, true), k = take.tensor(key, true), v = take.tensor(value, true);
      const go = take.tensor(gradOutput, true);
      const o = take.options(values);
      this.#check(fn);  // again: the arguments' getters may have disposed it (then nothing moves)
      take.movesChecked(fn, outsOf(o), () => check(q, k, v, go, o));
      take.done(signal);
      let checked: BackwardPlan;
      return this.#channel.call(fn, () => {
        checked = check(q, k, v, go, o);
        const { saved } = checked;
        return {
          query: q, key: k, value: v, gradOutput: go, options: sendable(o),
          record: saved === null ? undefined : recalled(saved.given),
        };
      }, (result) => deliverGradients(result, checked, fn), signal);
    });
  }

  /**
   * Attention.sdpaVarlen() in the worker: the same result (bitwise) and errors. Query, key and
   * value are copied, or moved with `{ transfer: true }`; the starts (and sinks, offsets) copied.
   */
  sdpaVarlen(query: InputTensor, key: InputTensor, value: InputTensor,
    options: SdpaVarlenOptions & WorkerCallOptions & { returnLogSumExp: true }): Promise<SdpaVarlenResultWithLogSumExp>;
  sdpaVarlen(query: InputTensor, key: InputTensor, value: InputTensor, options: SdpaVarlenOptions & WorkerCallOptions): Promise<SdpaVarlenResult>;
  sdpaVarlen(query: InputTensor, key: InputTensor, value: InputTensor, options: SdpaVarlenOptions & WorkerCallOptions): Promise<SdpaVarlenResult> {
    return this.#forward('sdpaVarlen', VARLEN_OPTION_NAMES, planVarlen, query, key, value, options);
  }

  /**
   * Attention.sdpaVarlenBackward() in the worker: the same gradients (bitwise) and errors; the
   * tensors copied or moved as sdpaBackward's, `saved` copied (and checked as by the direct API).
   */
  sdpaVarlenBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options: SdpaVarlenBackwardOptions & WorkerCallOptions & { sinks: Float32Array }): Promise<SdpaVarlenBackwardResult & { dSinks: Tensor }>;
  sdpaVarlenBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options: SdpaVarlenBackwardOptions & WorkerCallOptions): Promise<SdpaVarlenBackwardResult>;
  sdpaVarlenBackward(query: InputTensor, key: InputTensor, value: InputTensor, gradOutput: InputTensor,
    options: SdpaVarlenBackwardOptions & WorkerCallOptions): Promise<SdpaVarlenBackwardResult> {
    return this.#backward('sdpaVarlenBackward', VARLEN_BACKWARD_OPTION_NAMES, planVarlenBackward, query, key, value,
      gradOutput, options);
  }

  /** Attention.createKVCache() in the worker: the storage is in the worker's wasm memory. */
  createKVCache(options: KVCacheOptions, callOptions?: Pick<WorkerCallOptions, 'signal'>): Promise<WorkerKVCache> {
    return settle(() => {
      this.#check('createKVCache');
      const shape = checkCacheOptions(options);
      const { signal } = signalOnly('createKVCache', callOptions);
      const id = this.#nextCache++;
      return this.#channel.call('createKVCache', () => ({ cache: id, options: { ...shape } }), () => {
        const cache = WorkerKVCache.create(this.#channel, id, shape, (c) => this.#caches.delete(c));
        // Created while dispose() waited for the calls made before it: disposed with the others.
        if (this.#ended !== null) cache.markDisposed(this.#ended);
        else this.#caches.add(cache);
        return cache;
      }, signal);
    });
  }

  /** Attention.memory() of the worker's instance, after the calls already made. */
  memory(callOptions?: Pick<WorkerCallOptions, 'signal'>): Promise<MemoryInfo> {
    return settle(() => {
      this.#check('memory');
      const { signal } = signalOnly('memory', callOptions);
      return this.#channel.call('memory', () => ({}), (value) => value as MemoryInfo, signal);
    });
  }

  /**
   * Ends the worker after the calls already made (and disposes its caches); later calls
   * reject. Resolves once the worker has stopped (a Node process can then exit). Calling it
   * again returns the same promise.
   */
  dispose(): Promise<void> {
    if (this.#disposing !== null) return this.#disposing;
    this.#ended = 'disposed';
    for (const cache of this.#caches) cache.markDisposed('disposed');
    this.#caches.clear();
    const ended = new Error('sdpa-wasm: this AttentionWorker has been disposed');
    this.#disposing = this.#channel.call('dispose', () => ({}), () => undefined)
      .catch(() => undefined)  // a dead worker has nothing left to dispose
      .then(() => this.#channel.terminate(ended));
    return this.#disposing;
  }

  /**
   * Stops the worker now, even in the middle of a call: pending calls reject. For a job that
   * must not finish; dispose() lets the calls already made complete.
   */
  terminate(): Promise<void> {
    this.#ended = 'terminated';
    for (const cache of this.#caches) cache.markDisposed('terminated');
    this.#caches.clear();
    // Also after dispose(): the calls it was letting complete reject now.
    const stopped = this.#channel.terminate(new Error('sdpa-wasm: the attention worker was terminated'));
    this.#disposing ??= stopped;
    return stopped;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.dispose();
  }
}

/** A KVCache living in an AttentionWorker: the same members, with promises. */
const WORKER_CACHE_GATE = new FactoryGate('WorkerKVCache', 'await worker.createKVCache(options)');

export class WorkerKVCache extends KVCacheShapeInfo {
  readonly #shape: KVCacheShape;
  readonly #channel: Channel;
  readonly #id: number;
  /** As of the last answered call (also once disposed: the calls made before still run). */
  #length = 0;
  /** As the calls sent or being prepared will leave it, if they succeed: what the next call's checks see. */
  #expected = 0;
  /** Calls sent and not yet answered. */
  #unanswered = 0;
  /**
   * Counts the calls made that change the cache (append, truncate, remove, reorder, reset,
   * dispose), when made: a call whose arguments' getters made one throws, as KVCache's does.
   * Each counts, whatever it finds at its turn (refused, or nothing to remove or reorder),
   * which is not known when it is made.
   */
  #version = 0;
  /** Why calls are refused: disposed (its own dispose() or its worker's), or its worker terminated. */
  #ended: string | null = null;
  readonly #onDispose: (cache: WorkerKVCache) => void;

  /** @internal Use worker.createKVCache(). */
  static create(channel: Channel, id: number, shape: KVCacheShape, onDispose: (cache: WorkerKVCache) => void): WorkerKVCache {
    return WORKER_CACHE_GATE.make(() => new WorkerKVCache(channel, id, shape, onDispose));
  }

  private constructor(channel: Channel, id: number, shape: KVCacheShape, onDispose: (cache: WorkerKVCache) => void) {
    WORKER_CACHE_GATE.check();
    super(shape);
    this.#shape = shape;
    this.#channel = channel;
    this.#id = id;
    this.#onDispose = onDispose;
  }

  /** Positions stored, as of the last completed call (exact once the calls made have settled); 0 once disposed or its worker has stopped. */
  get length(): number {
    return this.disposed ? 0 : this.#length;
  }

  /** Disposed (its own dispose() or its worker's), or its worker ended (terminated, or stopped on its own: the storage is gone). */
  get disposed(): boolean {
    return this.#ended !== null || this.#channel.dead !== null;
  }

  /**
   * @internal The worker was disposed or terminated: length 0, as a disposed KVCache. Calls
   * made before still run (after dispose()) and are checked against the length they leave:
   * #length and #expected go on.
   */
  markDisposed(how: 'disposed' | 'terminated'): void {
    this.#ended ??= how === 'disposed' ? 'has been disposed' : 'has been disposed: its AttentionWorker was terminated';
  }

  #check(fn: string): void {
    if (this.#ended !== null) throw new Error(`${fn}: this KVCache ${this.#ended}`);
    if (this.#channel.dead !== null) throw this.#channel.dead;
  }

  /** #check(), and that no call changing the cache was made since `version`: after reading a call's arguments. */
  #unchangedSince(fn: string, version: number): void {
    this.#check(fn);
    if (this.#version !== version) throw changedByGetter(fn);
  }

  // A call whose checks (in `prepare`) see the cache as the calls before it will leave it:
  // #expected, which `prepare` advances. Calls sent together are checked before any has run,
  // and the worker may refuse one that passed (it cannot allocate): then the calls after it
  // saw a length the cache will not have. So a call that fails its checks while calls of this
  // cache are unanswered (sent in the same batch) is checked again once they are answered
  // (PREPARE_AFTER_ANSWERS), against the length they left; one that passed is checked by the
  // worker's own checks (the same ones). #expected follows #length again once every sent call
  // is answered.
  #call<T>(op: Op, prepare: () => Record<string, unknown>, finish: (value: unknown) => T, signal?: AbortSignal): Promise<T> {
    return this.#channel.call(op, () => {
      let args: Record<string, unknown>;
      try {
        args = { cache: this.#id, ...prepare() };
      } catch (error) {
        if (this.#unanswered > 0) throw PREPARE_AFTER_ANSWERS;
        throw error;
      }
      this.#unanswered++;
      return args;
    }, finish, signal, () => {
      if (--this.#unanswered === 0) this.#expected = this.#length;
    });
  }

  #lengthFrom = (value: unknown) => {
    this.#length = (value as { length: number }).length;
  };

  /** KVCache.append() in the worker. `{ transfer: true }` moves key's and value's buffers. */
  append(key: KVTensor, value: KVTensor, options?: KVAppendOptions & WorkerCallOptions): Promise<void> {
    return settle(() => {
      const fn = 'KVCache.append';
      this.#check(fn);
      const version = this.#version;
      const { signal, transfer } = workerCallOptions(fn, options);
      const take = new Taker(transfer);
      const values = optionValues(options, APPEND_OPTION_NAMES);  // read first, as the direct API reads them
      const k = take.tensor(key, true), v = take.tensor(value, true), o = take.options(values);
      this.#unchangedSince(fn, version);  // the arguments' getters may have disposed or changed it (then nothing moves)
      take.movesChecked(fn, [], () => {
        // More positions than maxLength fail whatever the calls before leave: the direct API's message, with today's length.
        if (checkAppendShapes(this.#shape, k, v, o).k.L > this.maxLength) checkAppend(this.#shape, this.#expected, k, v, o);
      });
      take.done(signal);
      this.#version++;
      return this.#call('append', () => {
        this.#expected += checkAppend(this.#shape, this.#expected, k, v, o).k.L;
        return { key: k, value: v, options: o };
      }, this.#lengthFrom, signal);
    });
  }

  /** KVCache.attend() in the worker: causal, bottom-right aligned, by default. */
  attend(query: InputTensor, options: WorkerSdpaOptions & { returnWeights: true; returnLogSumExp: true }): Promise<SdpaResultWith<'weights' | 'logSumExp'>>;
  attend(query: InputTensor, options: WorkerSdpaOptions & { returnWeights: true }): Promise<SdpaResultWith<'weights'>>;
  attend(query: InputTensor, options: WorkerSdpaOptions & { returnLogSumExp: true }): Promise<SdpaResultWith<'logSumExp'>>;
  attend(query: InputTensor, options?: WorkerSdpaOptions): Promise<SdpaResult>;
  attend(query: InputTensor, options?: WorkerSdpaOptions): Promise<SdpaResult> {
    return settle(() => {
      const fn = 'KVCache.attend';
      this.#check(fn);
      const version = this.#version;
      const { signal, transfer } = workerCallOptions(fn, options);
      const take = new Taker(transfer);
      const values = optionValues(options, OPTION_NAMES);  // read first, as the direct API reads them
      const q = take.tensor(query, true), o = take.options(values);
      this.#unchangedSince(fn, version);  // the arguments' getters may have disposed or changed it (then nothing moves)
      take.movesChecked(fn, outsOf(o), () => {
        const { q: query } = checkAttendQuery(q, this.#shape, o);
        checkOut(fn, outOf(o), query, this.#shape.valueDim);
      });
      take.done(signal);
      let checked: Plan;
      return this.#call('attend', () => {
        checked = planAttend(q, cacheOperands(this.#shape, this.#expected), o);
        return { query: q, options: sendable(o) };
      }, (result) => deliver(result, checked), signal);
    });
  }

  /** KVCache.truncate(n) in the worker: keeps the first n positions. */
  truncate(n: number, options?: Pick<WorkerCallOptions, 'signal'>): Promise<void> {
    return settle(() => {
      const fn = 'KVCache.truncate';
      this.#check(fn);
      const { signal } = signalOnly(fn, options);
      this.#version++;
      return this.#call('truncate', () => {
        checkTruncate(this.#expected, n);
        this.#expected = n;
        return { n };
      }, this.#lengthFrom, signal);
    });
  }

  /** KVCache.remove(start, end) in the worker: positions [start, end) removed, the later ones moved down. */
  remove(start: number, end: number, options?: Pick<WorkerCallOptions, 'signal'>): Promise<void> {
    return settle(() => {
      const fn = 'KVCache.remove';
      this.#check(fn);
      const { signal } = signalOnly(fn, options);
      this.#version++;
      return this.#call('remove', () => {
        this.#expected -= checkRemove(this.#expected, start, end);
        return { start, end };
      }, this.#lengthFrom, signal);
    });
  }

  /**
   * KVCache.read(start, end, { layout, dtype }) in the worker: a copy of positions [start, end) (default
   * all), as the cache holds them when the call's turn comes (after the calls made before it).
   */
  read(start: number | undefined, end: number | undefined, options: KVReadOptions & { dtype: 'float32' } & Pick<WorkerCallOptions, 'signal'>):
    Promise<KVCacheContents<Float32Array>>;
  read(start?: number, end?: number, options?: KVReadOptions & Pick<WorkerCallOptions, 'signal'>): Promise<KVCacheContents>;
  read(start?: number, end?: number, options?: KVReadOptions & Pick<WorkerCallOptions, 'signal'>): Promise<KVCacheContents> {
    return settle(() => {
      const fn = 'KVCache.read';
      this.#check(fn);
      const version = this.#version;
      const { signal, transfer } = workerCallOptions(fn, options);
      if (transfer) throw new TypeError(`${fn}: options.transfer does not apply: read() sends no arrays (its results are moved back)`);
      // The direct API's checks and messages, on the options without the worker's own.
      const o = checkOptionNames(fn, optionValues(options, READ_OPTION_NAMES), READ_OPTION_NAMES);
      const layout = checkLayout(fn, o.layout);
      const dtype = checkReadDType(this.dtype, o.dtype);
      this.#unchangedSince(fn, version);  // the options' getters may have disposed or changed it
      return this.#call('read', () => {
        checkRead(this.#expected, start, end);
        return { start, end, options: { layout, dtype } };
      }, (value) => value as KVCacheContents, signal);
    });
  }

  /** KVCache.reorder(indices) in the worker: batch b then holds what batch indices[b] held. */
  reorder(indices: Int32Array, options?: Pick<WorkerCallOptions, 'signal'>): Promise<void> {
    return settle(() => {
      const fn = 'KVCache.reorder';
      this.#check(fn);
      const { signal } = signalOnly(fn, options);
      // Checked and copied now: changing the array afterwards does not reach the call.
      const taken = checkReorder(this.batch, indices);
      this.#version++;
      return this.#call('reorder', () => ({ indices: taken }), this.#lengthFrom, signal);
    });
  }

  /** KVCache.reset() in the worker: length 0, the storage stays. */
  reset(options?: Pick<WorkerCallOptions, 'signal'>): Promise<void> {
    return settle(() => {
      const fn = 'KVCache.reset';
      this.#check(fn);
      const { signal } = signalOnly(fn, options);
      this.#version++;
      return this.#call('reset', () => {
        this.#expected = 0;
        return {};
      }, this.#lengthFrom, signal);
    });
  }

  /** Frees the storage in the worker (after the calls already made); later calls reject. Harmless twice. */
  dispose(): Promise<void> {
    if (this.#ended !== null) return Promise.resolve();
    this.#version++;
    this.markDisposed('disposed');
    this.#onDispose(this);
    if (this.#channel.dead !== null) return Promise.resolve();
    return this.#channel.call('disposeCache', () => ({ cache: this.#id }), () => undefined)
      .catch(() => undefined);  // a dead worker has freed everything
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.dispose();
  }
}

/**
 * An Attention instance in a dedicated worker (a module Web Worker in browsers, a
 * worker_threads Worker in Node), so attention never blocks the calling thread. Takes
 * createAttention()'s options, and `signal` (AttentionWorkerOptions), which stops the start; in
 * a browser the worker uses the threaded build where the page is cross-origin isolated. Rejects
 * (and stops the worker) if the worker cannot start.
 */
export async function createAttentionWorker(options: AttentionWorkerOptions = {}): Promise<AttentionWorker> {
  const fn = 'createAttentionWorker';
  // createAttention's options, checked as it checks them, and `signal`: the start's.
  const checked = checkAttentionOptions(fn, options, ['signal']);
  const { signal } = workerCallOptions(fn, { signal: (options as AttentionWorkerOptions).signal });
  if (signal?.aborted) throw abortReason(signal);  // nothing started
  const channel = new Channel(await startWorker());
  // Aborted while it starts: the worker ends (its pool's workers with it), the call rejects with the reason.
  let aborted = false;
  const abort = () => {
    aborted = true;
    void channel.terminate(new Error('sdpa-wasm: the attention worker\'s start was aborted'));
  };
  signal?.addEventListener('abort', abort, { once: true });
  try {
    if (signal?.aborted) abort();  // (while the worker's script was being imported, in Node)
    // The options as the caller gave them, without undefined entries (the worker's check of
    // them then sees what createAttention would).
    const init = Object.fromEntries(Object.entries(checked).filter(([, value]) => value !== undefined));
    const info = await channel.call('init', () => ({ options: init }), (value) => value as WorkerInfo);
    return AttentionWorker.create(channel, info);
  } catch (error) {
    // Whether the abort ended the start, decided now: a start that failed of itself, with the
    // signal aborted while the worker stops, rejects with its own error.
    const byAbort = aborted;
    await channel.terminate(error instanceof Error ? error : new Error(String(error)));
    throw byAbort && signal !== undefined ? abortReason(signal) : error;
  } finally {
    signal?.removeEventListener('abort', abort);
  }
}
