// createAttentionWorker(): an Attention instance in a dedicated worker, so a page (or a Node
// event loop) never blocks while attention runs. The API mirrors Attention and KVCache with
// promises; results are bitwise those of the direct API (the same code runs in the worker).
//
//   calling side (this file)                     worker (worker-entry.ts)
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
import type { Isa } from './loader.js';
import {
  APPEND_OPTION_NAMES, cacheOperands, checkAppend, checkAppendShapes, checkCacheOptions, checkReorder, checkTruncate, KVCacheShapeInfo,
  type KVCacheShape,
} from './kv-cache.js';
import type {
  AttentionOptions, KVCacheOptions, KVTensor, MemoryInfo, SdpaBackwardOptions, SdpaBackwardResult, SdpaOptions, SdpaResult,
  SdpaResultWith, Tensor,
} from './types.js';
import {
  bufferOf, byteLengthOf, byteOffsetOf, copyOf, detachedOrEmpty, elementBytesOf, isApiTypedArray, isArrayBuffer, lengthOf, viewLike,
  type TypedArray,
} from './typed-arrays.js';
import {
  BACKWARD_OPTION_NAMES, checkAttendQuery, checkAttentionOptions, checkOptionNames, checkOut, describe, OPTION_NAMES, plan,
  planAttend, planBackward, readOnce, type Plan,
} from './validate.js';
import { errorFromWire, READY, transferList, type Op, type Reply, type Request } from './worker-protocol.js';

/** What every worker call takes besides the direct API's options. */
export interface WorkerCallOptions {
  /** Cancels the call if it has not started: it rejects with the signal's reason (an AbortError). */
  signal?: AbortSignal;
  /**
   * Move the input tensors' buffers to the worker instead of copying them (no copy; the
   * caller's arrays are detached, length 0, as soon as the call is made). The query, key and
   * value data of sdpa(), the key and value of append(), the query of attend(); a mask,
   * keyLengths and causalOffset are always copied. Default false.
   */
  transfer?: boolean;
}

export type WorkerSdpaOptions = SdpaOptions & WorkerCallOptions;

const isNode = typeof process !== 'undefined' && typeof process.versions?.node === 'string';

// ─── the worker itself, in Node or a browser ──────────────────────────────────────────────

/** A started worker, whichever kind. `onDeath` fires once if it stops on its own. */
interface WorkerLink {
  post(message: Request[], transfer: ArrayBuffer[]): void;
  onMessage(handler: (message: unknown) => void): void;
  onDeath(handler: (error: Error) => void): void;
  /** Keep the process alive (Node) while calls are pending; not when idle. */
  hold(busy: boolean): void;
  terminate(): Promise<void>;
  readonly raw: unknown;
}

// The worker script, as written in the Node branch: bundlers look for the literal
// `new Worker(new URL('./worker-entry.js', import.meta.url), { type: 'module' })` of the
// browser branch and bundle the worker from it; a second literal URL would make them copy
// the unbundled file as an asset.
const WORKER_SCRIPT = './worker-entry.js';

async function startWorker(): Promise<WorkerLink> {
  if (isNode) {
    const name = 'node:worker_threads';
    const { Worker } = await import(/* @vite-ignore */ /* webpackIgnore: true */ name);
    // The process's Node flags, but not --input-type (for `node -e` code; a worker is a file).
    // A worker refuses per-process flags (V8's, e.g. --experimental-wasm-relaxed-simd) given
    // explicitly; those apply to the whole process anyway, so it then starts with none.
    const url = new URL(/* webpackIgnore: true */ WORKER_SCRIPT, import.meta.url);
    let worker;
    try {
      worker = new Worker(url, { execArgv: process.execArgv.filter((flag) => !flag.startsWith('--input-type')) });
    } catch (error) {
      if ((error as { code?: string }).code !== 'ERR_WORKER_INVALID_EXEC_ARGV') throw error;
      worker = new Worker(url, { execArgv: [] });
    }
    return {
      post: (message, transfer) => worker.postMessage(message, transfer),
      onMessage: (handler) => worker.on('message', handler),
      onDeath: (handler) => {
        let reason: Error | null = null;
        worker.on('error', (error: Error) => { reason = error; });
        worker.on('messageerror', (error: Error) => handler(new Error(`sdpa-wasm: a message from the attention worker could not be read: ${error.message}`)));
        worker.on('exit', (code: number) => handler(new Error(reason !== null
          ? `sdpa-wasm: the attention worker failed: ${reason.message}`
          : `sdpa-wasm: the attention worker stopped (exit code ${code})`)));
      },
      hold: (busy) => (busy ? worker.ref() : worker.unref()),
      terminate: async () => { await worker.terminate(); },
      raw: worker,
    };
  }
  const worker = new Worker(new URL('./worker-entry.js', import.meta.url), { type: 'module' });
  return {
    post: (message, transfer) => worker.postMessage(message, transfer),
    onMessage: (handler) => worker.addEventListener('message', (event) => handler(event.data)),
    onDeath: (handler) => {
      // A browser reports an uncaught error (or a script that failed to load) but not an end:
      // the worker is terminated here so that it cannot answer after being declared dead.
      worker.addEventListener('error', (event) => {
        event.preventDefault();
        worker.terminate();
        handler(new Error(`sdpa-wasm: the attention worker failed: ${event.message || 'its script could not be loaded or threw'}`));
      });
      worker.addEventListener('messageerror', () => handler(new Error('sdpa-wasm: a message from the attention worker could not be read')));
    },
    hold: () => {},
    terminate: async () => worker.terminate(),
    raw: worker,
  };
}

// ─── the queue of calls ───────────────────────────────────────────────────────────────────

interface Call {
  op: Op;
  /** At its turn: the checks against the state the calls before it leave, then the args to send. Throws to reject. */
  prepare(): Record<string, unknown>;
  /** The worker's value → what the promise resolves to. */
  finish(value: unknown): unknown;
  /** After a sent call has settled, whichever way. */
  settled?: () => void;
  resolve(value: unknown): void;
  reject(error: unknown): void;
  signal: AbortSignal | undefined;
  /** The request's id, once sent: its reply carries it. */
  id: number;
}

/** The queued calls that share one AbortSignal, and the one listener on it. */
interface SignalWatch {
  calls: Set<Call>;
  listener: () => void;
}

/**
 * Calls to one worker, in the order they were made. The calls waiting when the worker is free
 * are sent together, as one message (a batch): those made in one synchronous stretch of the
 * caller's code, or while the previous batch ran. So `cache.append(k, v); await cache.attend(q)`
 * costs one round trip, and a call can be cancelled until its batch is sent.
 */
class Channel {
  readonly #link: WorkerLink;
  readonly #queue: Call[] = [];
  /** Sent, not yet answered, in the order the worker answers them. */
  readonly #inFlight: Call[] = [];
  /**
   * The queued calls by AbortSignal: one listener per signal however many calls share it (a
   * page's Stop button may cover every call; a listener per call would pile up on the signal).
   */
  readonly #watched = new Map<AbortSignal, SignalWatch>();
  #nextId = 1;
  #ready = false;
  #pumpScheduled = false;
  /** Set once the worker is gone: every pending and later call rejects with it. */
  #dead: Error | null = null;

  constructor(link: WorkerLink) {
    this.#link = link;
    link.onMessage((message) => this.#receive(message));
    link.onDeath((error) => this.#die(error));
  }

  get dead(): Error | null {
    return this.#dead;
  }

  call<T>(op: Op, prepare: () => Record<string, unknown>, finish: (value: unknown) => T,
    signal?: AbortSignal, settled?: () => void): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      if (this.#dead !== null) return reject(this.#dead);
      if (signal?.aborted) return reject(abortReason(signal));
      const call: Call = { op, prepare, finish, settled, resolve: resolve as (value: unknown) => void, reject, signal, id: 0 };
      if (signal !== undefined) this.#watch(call, signal);
      this.#queue.push(call);
      this.#link.hold(true);
      // Sent from a microtask, so the calls made in this synchronous stretch go together.
      if (!this.#pumpScheduled) {
        this.#pumpScheduled = true;
        queueMicrotask(() => {
          this.#pumpScheduled = false;
          this.#pump();
        });
      }
    });
  }

  /** Ends the worker now: pending calls reject with `error`. */
  async terminate(error: Error): Promise<void> {
    this.#die(error);
    await this.#link.terminate();
  }

  get raw(): unknown {
    return this.#link.raw;
  }

  #busy(): boolean {
    return this.#inFlight.length > 0 || this.#queue.length > 0;
  }

  /** Sends the waiting calls as one batch, if the worker is ready and has answered the last one. */
  #pump(): void {
    if (this.#ready && this.#dead === null && this.#inFlight.length === 0) {
      const batch: Request[] = [];
      const arrays: unknown[] = [];
      for (const call of this.#queue.splice(0)) {
        let args: Record<string, unknown>;
        try {
          args = call.prepare();
        } catch (error) {
          this.#unwatch(call);
          call.reject(error);
          continue;
        }
        this.#unwatch(call);  // sent: no longer cancellable
        call.id = this.#nextId++;
        batch.push({ id: call.id, op: call.op, args });
        arrays.push(...typedArrays(args));
        this.#inFlight.push(call);
      }
      if (batch.length > 0) {
        try {
          // Only buffers a Taker made (copies) or moved: never one the caller still holds.
          this.#link.post(batch, transferList(arrays).filter((buffer) => takenBuffers.has(buffer)));
        } catch (error) {  // not cloneable: the checks let something odd through
          for (const call of this.#inFlight.splice(0)) this.#fail(call, error);
        }
      }
    }
    this.#link.hold(this.#busy());
  }

  #receive(message: unknown): void {
    if (message === READY) {
      this.#ready = true;
      this.#pump();
      return;
    }
    const reply = message as Reply;
    const call = this.#inFlight.shift();
    if (call === undefined) return;
    if (reply.id !== call.id) {  // the worker answers in order: anything else is a broken worker
      this.#inFlight.unshift(call);
      this.#die(new Error(`sdpa-wasm: the attention worker answered request ${String(reply.id)} where ${call.id} was due`));
      return;
    }
    if (reply.ok) {
      try {
        call.resolve(call.finish(reply.value));
      } catch (error) {
        call.reject(error);
      }
    } else {
      call.reject(errorFromWire(reply.error));
    }
    call.settled?.();
    if (this.#inFlight.length === 0) this.#pump();
  }

  /** A sent call that will get no answer. */
  #fail(call: Call, error: unknown): void {
    call.reject(error);
    call.settled?.();
  }

  /** Notes a queued call under its signal: aborting the signal takes it (and the others waiting on it) off the queue. */
  #watch(call: Call, signal: AbortSignal): void {
    let watch = this.#watched.get(signal);
    if (watch === undefined) {
      const calls = new Set<Call>();
      const listener = () => {
        for (const waiting of [...calls]) {
          const at = this.#queue.indexOf(waiting);
          if (at >= 0) this.#queue.splice(at, 1);
          this.#unwatch(waiting);
          waiting.reject(abortReason(signal));
        }
        this.#link.hold(this.#busy());
      };
      watch = { calls, listener };
      this.#watched.set(signal, watch);
      signal.addEventListener('abort', listener, { once: true });
    }
    watch.calls.add(call);
  }

  /** The call leaves the queue (sent, rejected or aborted): no longer cancellable. */
  #unwatch(call: Call): void {
    if (call.signal === undefined) return;
    const watch = this.#watched.get(call.signal);
    if (watch === undefined || !watch.calls.delete(call) || watch.calls.size > 0) return;
    call.signal.removeEventListener('abort', watch.listener);
    this.#watched.delete(call.signal);
  }

  #die(error: Error): void {
    if (this.#dead !== null) return;
    this.#dead = error;
    for (const call of this.#inFlight.splice(0)) this.#fail(call, error);
    for (const call of this.#queue.splice(0)) {  // never sent
      this.#unwatch(call);
      call.reject(error);
    }
    this.#link.hold(false);
  }
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException('The operation was aborted', 'AbortError');
}

/** Every typed array in a message's args (one level of tensors and options). */
function typedArrays(args: Record<string, unknown>): unknown[] {
  const found: unknown[] = [];
  const visit = (x: unknown, depth: number) => {
    if (ArrayBuffer.isView(x)) found.push(x);
    else if (depth > 0 && x !== null && typeof x === 'object' && !Array.isArray(x)) {
      for (const value of Object.values(x)) visit(value, depth - 1);
    }
  };
  visit(args, 3);
  return found;
}

// ─── taking the inputs when a call is made ────────────────────────────────────────────────

/**
 * The buffers the calling side made (a Taker's copies) or moved from the caller: the only ones a
 * request may transfer to the worker. A buffer the caller still holds is never transferred.
 */
const takenBuffers = new WeakSet<ArrayBufferLike>();

/**
 * Takes the caller's typed arrays when a call is made: copies (only the view's elements), or
 * with `transfer`, moves their buffers (zero copy; the caller's arrays are then detached).
 * Two arrays over one buffer stay over one moved buffer. A buffer that cannot move is copied
 * (only the views' elements), the caller's arrays left as they are: a SharedArrayBuffer, and
 * one that cannot be detached (a WebAssembly.Memory's, Node's Buffer pool). Moving detaches
 * every view of a buffer at once, so views to move are only noted by tensor() (with their
 * buffer, offset and length, unreadable once detached) and moved together by done(), after the
 * call's checks that do not depend on the calls before it (movesChecked).
 * A typed array is read through its internal slots (typed-arrays.ts): its type, length, buffer
 * and offset, never a property the caller's object carries, as the direct API's checks read it.
 */
class Taker {
  readonly #toMove: { holder: Record<string, unknown>; view: TypedArray; buffer: ArrayBuffer; offset: number; length: number }[] = [];
  constructor(readonly transfer: boolean) {}

  /**
   * A copy of a typed array's elements. An empty one is kept as it is: no empty array passes
   * the checks (every size is >= 1), so it is never sent, and the checks then see what the
   * direct API sees (a detached buffer, or an empty view of a live one: different messages).
   */
  copy(x: unknown): unknown {
    if (!isApiTypedArray(x) || lengthOf(x) === 0) return x;
    const taken = copyOf(x);
    takenBuffers.add(bufferOf(taken));
    return taken;
  }

  /** A tensor-like object: a new { data, dims } with its data taken, its dims copied; anything else as it is (for the checks' messages). */
  tensor(t: unknown, move: boolean): unknown {
    if (t === null || typeof t !== 'object') return t;
    const { data, dims } = t as { data?: unknown; dims?: unknown };
    const buffer = isApiTypedArray(data) ? bufferOf(data) : null;
    const movable = move && this.transfer && isArrayBuffer(buffer) && byteLengthOf(buffer) > 0;
    const taken: Record<string, unknown> = { data: movable ? data : this.copy(data), dims: Array.isArray(dims) ? readOnce(dims) : dims };
    if (movable) {  // data replaced by done()
      const view = data as TypedArray;
      this.#toMove.push({ holder: taken, view, buffer: buffer as ArrayBuffer, offset: byteOffsetOf(view), length: lengthOf(view) });
    }
    return taken;
  }

  /**
   * Options as the direct API reads them (checkOptionNames): each of the call's `known` names
   * read once, by property access (so inherited and non-enumerable ones count), and any other
   * own name kept, unread, for the checks to reject; without the worker-only `signal` and
   * `transfer`. Masks and per-batch arrays copied; `out` kept (results land in it).
   */
  options(options: unknown, known: readonly string[]): unknown {
    if (options === null || typeof options !== 'object' || Array.isArray(options)) return options;
    const copy: Record<string, unknown> = {};
    for (const name of Object.keys(options)) {
      if (!known.includes(name) && !WORKER_OPTION_NAMES.includes(name)) copy[name] = undefined;
    }
    for (const name of known) {
      const value = (options as Record<string, unknown>)[name];
      if (value === undefined) continue;
      copy[name] = name === 'attnMask' ? this.tensor(value, false)
        : name === 'saved' ? this.saved(value)
        : name === 'out' ? value : this.copy(value);
    }
    return copy;
  }

  /** sdpaBackward's options.saved: { output, logSumExp } with their data copied. */
  saved(saved: unknown): unknown {
    if (saved === null || typeof saved !== 'object') return saved;
    const { output, logSumExp } = saved as { output?: unknown; logSumExp?: unknown };
    return { output: this.tensor(output, false), logSumExp: this.tensor(logSumExp, false) };
  }

  /**
   * Before done(): `check` runs the call's checks that hold whatever the calls before it do
   * (the direct API's, on the taken arguments), so that a call they reject moves nothing; and
   * `out`, if given, must not be a view of a buffer about to move (the output could not land in
   * it). The checks that depend on a cache's length at the call's turn run then, after the move.
   */
  movesChecked(fn: string, out: unknown, check: () => void): void {
    if (this.#toMove.length === 0) return;
    check();
    if (!isApiTypedArray(out)) return;
    const shared = this.#toMove.find(({ buffer }) => buffer === bufferOf(out));
    if (shared !== undefined) {
      throw new RangeError(`${fn}: options.out shares its ArrayBuffer with an input that { transfer: true } moves to the ` +
        'worker, so the output could not be written into it; give out a buffer of its own, or leave transfer off. Nothing was moved');
    }
  }

  /**
   * Moves the noted buffers (each once) and points the taken tensors at the moved ones; those
   * whose buffer cannot move are copied. Nothing moves for a call already cancelled (`signal`
   * aborted): it will not run, and the caller keeps its arrays.
   */
  done(signal: AbortSignal | undefined): void {
    const moved = new Map<ArrayBuffer, ArrayBuffer | null>();  // null: cannot move
    for (const { buffer } of this.#toMove) {
      if (!moved.has(buffer)) moved.set(buffer, signal?.aborted ? null : moveBuffer(buffer));
    }
    for (const { holder, view, buffer, offset, length } of this.#toMove) {
      const to = moved.get(buffer);
      // A view no longer within its buffer (a getter shrank a resizable one) or detached
      // meanwhile: kept as it is, for the checks' message.
      const fits = to != null && offset + length * elementBytesOf(view) <= byteLengthOf(to);
      holder.data = to == null ? this.copy(view) : fits ? viewLike(view, to, offset, length) : view;
    }
  }
}

/** Buffers found not to detach when moved: copied from then on without trying (a wasm memory's stays one object until it grows). */
const cannotDetach = new WeakSet<ArrayBuffer>();

/**
 * `buffer`'s contents in a new ArrayBuffer, `buffer` detached (zero copy); or null, `buffer`
 * untouched, if it cannot be detached: a browser's structuredClone throws for those, Node's
 * copies all of them (then discarded: one wasted copy per such buffer, remembered).
 */
function moveBuffer(buffer: ArrayBuffer): ArrayBuffer | null {
  if (cannotDetach.has(buffer) || byteLengthOf(buffer) === 0) return null;  // (0: detached meanwhile, by a getter)
  try {
    const clone = structuredClone(buffer, { transfer: [buffer] });
    if (byteLengthOf(buffer) === 0) {  // detached: moved (no empty buffer is taken to move)
      takenBuffers.add(clone);
      return clone;
    }
  } catch {
    // DataCloneError: not transferable
  }
  cannotDetach.add(buffer);
  return null;
}

/** The options every worker call takes besides the direct API's. */
const WORKER_OPTION_NAMES: readonly string[] = ['signal', 'transfer'];

/**
 * The worker-only options (signal, transfer), checked. The others are the direct API's: taken
 * by Taker.options() (without these two) and checked by the direct API's own checks.
 */
function workerCallOptions(fn: string, options: unknown): { signal?: AbortSignal; transfer: boolean } {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) return { transfer: false };
  const { signal, transfer } = options as WorkerCallOptions;
  if (signal !== undefined && !isAbortSignal(signal)) {
    throw new TypeError(`${fn}: options.signal must be an AbortSignal, got ${describe(signal)}`);
  }
  if (transfer !== undefined && typeof transfer !== 'boolean') {
    throw new TypeError(`${fn}: options.transfer must be a boolean, got ${describe(transfer)}`);
  }
  return { signal, transfer: transfer ?? false };
}

/** The options of a call that takes no direct-API options: only `signal`. */
function signalOnly(fn: string, options: unknown): { signal?: AbortSignal } {
  checkOptionNames(fn, options, ['signal']);
  return workerCallOptions(fn, options);
}

function isAbortSignal(x: unknown): x is AbortSignal {
  return x !== null && typeof x === 'object' && typeof (x as AbortSignal).aborted === 'boolean' &&
    typeof (x as AbortSignal).addEventListener === 'function';
}

/**
 * The result from the worker, with the output written into options.out when one was given, as
 * the direct API does: through the call's own view of it (Plan.out) and returned as Plan.outResult.
 */
function deliver(value: unknown, p: Plan): SdpaResult {
  const result = value as SdpaResult;
  if (p.out === null) return result;
  if (lengthOf(p.out) < p.outputSize) {
    const how = detachedOrEmpty(p.out) ? 'was detached' : 'shrank (a resizable buffer)';
    throw new RangeError(`${p.fn}: options.out's buffer ${how} while the call ran; the output ` +
      `[${p.outputDims.join(', ')}] (${p.outputSize} floats) could not be written into it`);
  }
  p.out.set(result.output.data);
  result.output = { data: p.outResult!, dims: result.output.dims };
  return result;
}

/** options.out of the taken options (kept as the caller gave it), for movesChecked. */
const outOf = (options: unknown): unknown =>
  options !== null && typeof options === 'object' ? (options as { out?: unknown }).out : undefined;

/** The options to send: what the checks accepted, without `out` (results come back in a new buffer). */
function sendable(options: unknown): unknown {
  if (options === null || typeof options !== 'object') return options;
  const { out: _out, ...rest } = options as Record<string, unknown>;
  return rest;
}

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
  simd: boolean;
  isa: Isa;
}

// ─── the public classes ───────────────────────────────────────────────────────────────────

export class AttentionWorker {
  /** Threads the kernel runs on inside the worker (> 1: the threaded build, nested workers). */
  readonly threads: number;
  /** Whether the 128-bit SIMD kernel is in use (always). */
  readonly simd: boolean;
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
    return new AttentionWorker(channel, info);
  }

  private constructor(channel: Channel, info: WorkerInfo) {
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
  sdpa(query: Tensor, key: Tensor, value: Tensor,
    options: WorkerSdpaOptions & { returnWeights: true; returnLogSumExp: true }): Promise<SdpaResultWith<'weights' | 'logSumExp'>>;
  sdpa(query: Tensor, key: Tensor, value: Tensor, options: WorkerSdpaOptions & { returnWeights: true }): Promise<SdpaResultWith<'weights'>>;
  sdpa(query: Tensor, key: Tensor, value: Tensor, options: WorkerSdpaOptions & { returnLogSumExp: true }): Promise<SdpaResultWith<'logSumExp'>>;
  sdpa(query: Tensor, key: Tensor, value: Tensor, options?: WorkerSdpaOptions): Promise<SdpaResult>;
  sdpa(query: Tensor, key: Tensor, value: Tensor, options?: WorkerSdpaOptions): Promise<SdpaResult> {
    return settle(() => {
      this.#check('sdpa');
      const { signal, transfer } = workerCallOptions('sdpa', options);
      const take = new Taker(transfer);
      const q = take.tensor(query, true), k = take.tensor(key, true), v = take.tensor(value, true);
      const o = take.options(options, OPTION_NAMES);
      this.#check('sdpa');  // again: the arguments' getters may have disposed it (then nothing moves)
      take.movesChecked('sdpa', outOf(o), () => plan(q, k, v, o));
      take.done(signal);
      let checked: Plan;
      return this.#channel.call('sdpa', () => {
        checked = plan(q, k, v, o);
        return { query: q, key: k, value: v, options: sendable(o) };
      }, (result) => deliver(result, checked), signal);
    });
  }

  /**
   * Attention.sdpaBackward() in the worker: the same gradients (bitwise) and errors. Query,
   * key, value and gradOutput are copied, or moved with `{ transfer: true }`; `saved` is copied.
   */
  sdpaBackward(query: Tensor, key: Tensor, value: Tensor, gradOutput: Tensor,
    options?: SdpaBackwardOptions & WorkerCallOptions): Promise<SdpaBackwardResult> {
    return settle(() => {
      this.#check('sdpaBackward');
      const { signal, transfer } = workerCallOptions('sdpaBackward', options);
      const take = new Taker(transfer);
      const q = take.tensor(query, true), k = take.tensor(key, true), v = take.tensor(value, true);
      const go = take.tensor(gradOutput, true);
      const o = take.options(options, BACKWARD_OPTION_NAMES);
      this.#check('sdpaBackward');  // again: the arguments' getters may have disposed it (then nothing moves)
      take.movesChecked('sdpaBackward', undefined, () => planBackward(q, k, v, go, o));
      take.done(signal);
      return this.#channel.call('sdpaBackward', () => {
        planBackward(q, k, v, go, o);
        return { query: q, key: k, value: v, gradOutput: go, options: o };
      }, (result) => result as SdpaBackwardResult, signal);
    });
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
export class WorkerKVCache extends KVCacheShapeInfo {
  readonly #shape: KVCacheShape;
  readonly #channel: Channel;
  readonly #id: number;
  /** As of the last answered call. */
  #length = 0;
  /** As the calls sent or being prepared will leave it, if they succeed: what the next call's checks see. */
  #expected = 0;
  /** Calls sent and not yet answered. */
  #unanswered = 0;
  /** Why calls are refused: disposed (its own dispose() or its worker's), or its worker terminated. */
  #ended: string | null = null;
  readonly #onDispose: (cache: WorkerKVCache) => void;

  /** @internal Use worker.createKVCache(). */
  static create(channel: Channel, id: number, shape: KVCacheShape, onDispose: (cache: WorkerKVCache) => void): WorkerKVCache {
    return new WorkerKVCache(channel, id, shape, onDispose);
  }

  private constructor(channel: Channel, id: number, shape: KVCacheShape, onDispose: (cache: WorkerKVCache) => void) {
    super(shape);
    this.#shape = shape;
    this.#channel = channel;
    this.#id = id;
    this.#onDispose = onDispose;
  }

  /** Positions stored, as of the last completed call (exact once the calls made have settled). */
  get length(): number {
    return this.#length;
  }

  get disposed(): boolean {
    return this.#ended !== null;
  }

  /** @internal The worker was disposed or terminated: length 0, as a disposed KVCache. */
  markDisposed(how: 'disposed' | 'terminated'): void {
    this.#ended ??= how === 'disposed' ? 'has been disposed' : 'has been disposed: its AttentionWorker was terminated';
    this.#length = this.#expected = 0;
  }

  #check(fn: string): void {
    if (this.#ended !== null) throw new Error(`${fn}: this KVCache ${this.#ended}`);
    if (this.#channel.dead !== null) throw this.#channel.dead;
  }

  // A call whose checks (in `prepare`) see the cache as the calls before it will leave it:
  // #expected, which `prepare` advances. Calls sent together are checked before any has run;
  // if the worker then refuses one that passed (it cannot allocate), the checks of the calls
  // sent with it saw a length the cache does not have, and the worker's own checks (the same
  // ones) decide: #expected follows #length again once every sent call is answered.
  #call<T>(op: Op, prepare: () => Record<string, unknown>, finish: (value: unknown) => T, signal?: AbortSignal): Promise<T> {
    return this.#channel.call(op, () => {
      const args = { cache: this.#id, ...prepare() };
      this.#unanswered++;
      return args;
    }, finish, signal, () => {
      if (--this.#unanswered === 0) this.#expected = this.#length;
    });
  }

  #lengthFrom = (value: unknown) => {
    if (this.#ended === null) this.#length = (value as { length: number }).length;  // (a disposed cache stays at 0)
  };

  /** KVCache.append() in the worker. `{ transfer: true }` moves key's and value's buffers. */
  append(key: KVTensor, value: KVTensor, options?: { layout?: 'bhsd' | 'bshd' } & WorkerCallOptions): Promise<void> {
    return settle(() => {
      const fn = 'KVCache.append';
      this.#check(fn);
      const { signal, transfer } = workerCallOptions(fn, options);
      const take = new Taker(transfer);
      const k = take.tensor(key, true), v = take.tensor(value, true), o = take.options(options, APPEND_OPTION_NAMES);
      this.#check(fn);  // again: the arguments' getters may have disposed it (then nothing moves)
      take.movesChecked(fn, undefined, () => {
        // More positions than maxLength fail whatever the calls before leave: the direct API's message, with today's length.
        if (checkAppendShapes(this.#shape, k, v, o).k.L > this.maxLength) checkAppend(this.#shape, this.#expected, k, v, o);
      });
      take.done(signal);
      return this.#call('append', () => {
        this.#expected += checkAppend(this.#shape, this.#expected, k, v, o).k.L;
        return { key: k, value: v, options: o };
      }, this.#lengthFrom, signal);
    });
  }

  /** KVCache.attend() in the worker: causal, bottom-right aligned, by default. */
  attend(query: Tensor, options: WorkerSdpaOptions & { returnWeights: true; returnLogSumExp: true }): Promise<SdpaResultWith<'weights' | 'logSumExp'>>;
  attend(query: Tensor, options: WorkerSdpaOptions & { returnWeights: true }): Promise<SdpaResultWith<'weights'>>;
  attend(query: Tensor, options: WorkerSdpaOptions & { returnLogSumExp: true }): Promise<SdpaResultWith<'logSumExp'>>;
  attend(query: Tensor, options?: WorkerSdpaOptions): Promise<SdpaResult>;
  attend(query: Tensor, options?: WorkerSdpaOptions): Promise<SdpaResult> {
    return settle(() => {
      const fn = 'KVCache.attend';
      this.#check(fn);
      const { signal, transfer } = workerCallOptions(fn, options);
      const take = new Taker(transfer);
      const q = take.tensor(query, true), o = take.options(options, OPTION_NAMES);
      this.#check(fn);  // again: the arguments' getters may have disposed it (then nothing moves)
      take.movesChecked(fn, outOf(o), () => {
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
      return this.#call('truncate', () => {
        checkTruncate(this.#expected, n);
        this.#expected = n;
        return { n };
      }, this.#lengthFrom, signal);
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
      return this.#call('reorder', () => ({ indices: taken }), this.#lengthFrom, signal);
    });
  }

  /** KVCache.reset() in the worker: length 0, the storage stays. */
  reset(options?: Pick<WorkerCallOptions, 'signal'>): Promise<void> {
    return settle(() => {
      const fn = 'KVCache.reset';
      this.#check(fn);
      const { signal } = signalOnly(fn, options);
      return this.#call('reset', () => {
        this.#expected = 0;
        return {};
      }, this.#lengthFrom, signal);
    });
  }

  /** Frees the storage in the worker (after the calls already made); later calls reject. Harmless twice. */
  dispose(): Promise<void> {
    if (this.#ended !== null) return Promise.resolve();
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
 * createAttention()'s options; in a browser the worker uses the threaded build where the page
 * is cross-origin isolated. Rejects (and stops the worker) if the worker cannot start.
 */
export async function createAttentionWorker(options: AttentionOptions = {}): Promise<AttentionWorker> {
  const checked = checkAttentionOptions('createAttentionWorker', options);
  const channel = new Channel(await startWorker());
  try {
    // The options as the caller gave them, without undefined entries (the worker's check of
    // them then sees what createAttention would).
    const init = Object.fromEntries(Object.entries(checked).filter(([, value]) => value !== undefined));
    const info = await channel.call('init', () => ({ options: init }), (value) => value as WorkerInfo);
    return AttentionWorker.create(channel, info);
  } catch (error) {
    await channel.terminate(error instanceof Error ? error : new Error(String(error)));
    throw error;
  }
}
