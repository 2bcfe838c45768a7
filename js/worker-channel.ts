// The calling side's link to the attention worker: starting it (a worker_threads Worker in
// Node, a module Web Worker in a browser) and the queue of calls, sent to it in batches. What
// each call sends is prepared by worker.ts, with the inputs taken by worker-args.ts.
import { loaderScriptUrl, startsAsIs } from './cross-origin.js';
import { isTaken } from './worker-args.js';
import { errorFromWire, READY, transferList, type Op, type Reply, type Request } from './worker-protocol.js';

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

// The worker script, as written in the Node branch and for the origin check: bundlers look
// for the literal `new Worker(new URL('./worker-entry.js', import.meta.url), { type: 'module' })`
// of the browser branch and bundle the worker from it; a second literal URL would make them
// copy the unbundled file as an asset. (In a bundle this URL may name no file, but its origin
// is the bundle's, which is all the check reads; the loader path is for the unbundled package
// served from elsewhere.)
const WORKER_SCRIPT = './worker-entry.js';

export async function startWorker(): Promise<WorkerLink> {
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
        // A message that cannot be read: the worker is declared dead, and ended (its memory freed),
        // so that it cannot answer after that; its 'exit' then finds the channel dead already.
        worker.on('messageerror', (error: Error) => {
          handler(new Error(`sdpa-wasm: a message from the attention worker could not be read: ${error.message}`));
          void worker.terminate();
        });
        worker.on('exit', (code: number) => handler(new Error(reason !== null
          ? `sdpa-wasm: the attention worker failed: ${reason.message}`
          : `sdpa-wasm: the attention worker stopped (exit code ${code})`)));
      },
      hold: (busy) => (busy ? worker.ref() : worker.unref()),
      terminate: async () => { await worker.terminate(); },
      raw: worker,
    };
  }
  // From another origin (the package on a CDN) through a loader script of this one (cross-origin.ts).
  const entry = new URL(/* webpackIgnore: true */ WORKER_SCRIPT, import.meta.url);
  const worker = startsAsIs(entry)
    ? new Worker(new URL('./worker-entry.js', import.meta.url), { type: 'module' })
    : new Worker(loaderScriptUrl(entry, 'module'), { type: 'module' });
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
      worker.addEventListener('messageerror', () => {
        worker.terminate();
        handler(new Error('sdpa-wasm: a message from the attention worker could not be read'));
      });
    },
    hold: () => {},
    terminate: async () => worker.terminate(),
    raw: worker,
  };
}

// ─── the queue of calls ───────────────────────────────────────────────────────────────────

/**
 * Thrown by a call's prepare() whose checks failed against state that the calls sent before it
 * in the same batch may not leave (a cache's length, should the worker refuse an append): the
 * call, and those after it, wait for the batch's answers and are prepared again then.
 */
export const PREPARE_AFTER_ANSWERS: unique symbol = Symbol('sdpa-wasm: prepare after the answers');

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
  /** Rejected while waiting (its signal aborted): never sent. */
  cancelled: boolean;
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
export class Channel {
  readonly #link: WorkerLink;
  #queue: Call[] = [];
  /**
   * The last batch's calls, in the order the worker answers them: [0, #answered) answered,
   * the rest in flight. (An index, not shift(): shift() of a long array moves its elements,
   * and a batch of 200,000 calls took 17 s to settle.)
   */
  #inFlight: Call[] = [];
  #answered = 0;
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
      const call: Call = { op, prepare, finish, settled, resolve: resolve as (value: unknown) => void, reject, signal, id: 0, cancelled: false };
      if (signal !== undefined) this.#watch(call, signal);
      this.#queue.push(call);
      this.#link.hold(true);
      this.#schedulePump();
    });
  }

  /** #pump() from a microtask (once however often asked): the calls made in this synchronous stretch go together. */
  #schedulePump(): void {
    if (this.#pumpScheduled) return;
    this.#pumpScheduled = true;
    queueMicrotask(() => {
      this.#pumpScheduled = false;
      this.#pump();
    });
  }

  /** Ends the worker now: pending calls reject with `error`. */
  async terminate(error: Error): Promise<void> {
    this.#die(error);
    // Held until it has stopped: Node settles an unreferenced worker's terminate() only if
    // something else keeps the event loop running (terminated with a call just made, whose
    // batch was still to be sent, `await worker.terminate()` was left unsettled and the
    // process exited with it).
    this.#link.hold(true);
    await this.#link.terminate();
  }

  get raw(): unknown {
    return this.#link.raw;
  }

  #unanswered(): number {
    return this.#inFlight.length - this.#answered;
  }

  /** The calls in flight, taken off: they will get no answer. */
  #takeInFlight(): Call[] {
    const calls = this.#inFlight.slice(this.#answered);
    this.#inFlight = [];
    this.#answered = 0;
    return calls;
  }

  #busy(): boolean {
    return this.#unanswered() > 0 || this.#queue.length > 0;
  }

  /**
   * Sends the waiting calls as one batch, if the worker is ready and has answered the last one.
   * A call's prepare() may run the caller's code (a getter read for an error's message), which
   * may end the worker or abort a call of this batch: each call is looked at again before it
   * is prepared.
   */
  #pump(): void {
    if (this.#ready && this.#dead === null && this.#unanswered() === 0) {
      this.#inFlight = [];
      this.#answered = 0;
      const batch: Request[] = [];
      const arrays: unknown[] = [];
      const waiting = this.#queue.splice(0);
      for (let n = 0; n < waiting.length; n++) {
        const call = waiting[n];
        if (call.cancelled) continue;  // aborted meanwhile: already rejected
        if (this.#dead !== null) {  // ended meanwhile: the calls before it failed with it
          this.#unwatch(call);
          call.reject(this.#dead);
          continue;
        }
        let args: Record<string, unknown>;
        try {
          args = call.prepare();
        } catch (error) {
          if (error === PREPARE_AFTER_ANSWERS && batch.length > 0 && this.#dead === null) {
            // Still waiting (and cancellable), ahead of any call made meanwhile (concat, not a
            // spread into unshift: any number of calls).
            this.#queue = waiting.slice(n).filter((c) => !c.cancelled).concat(this.#queue);
            break;
          }
          this.#unwatch(call);
          if (error !== PREPARE_AFTER_ANSWERS) call.reject(error);
          else call.reject(this.#dead ?? new Error('sdpa-wasm: internal error: a call waited for the answers of a batch that had none'));
          continue;
        }
        this.#unwatch(call);  // sent: no longer cancellable
        if (call.cancelled || this.#dead !== null) {  // its own prepare() aborted it or ended the worker: not sent
          this.#fail(call, this.#dead);  // (rejected already if aborted: only its settled() runs)
          continue;
        }
        call.id = this.#nextId++;
        batch.push({ id: call.id, op: call.op, args });
        arrays.push(...typedArrays(args));
        this.#inFlight.push(call);
      }
      if (batch.length > 0 && this.#dead === null) {
        try {
          // Only buffers a Taker made (copies) or moved: never one the caller still holds.
          this.#link.post(batch, transferList(arrays).filter((buffer) => isTaken(buffer)));
        } catch (error) {  // not cloneable: the checks let something odd through
          for (const call of this.#takeInFlight()) this.#fail(call, error);
          // No answer will come to send the calls left waiting (deferred ones): send them now.
          if (this.#queue.length > 0) this.#schedulePump();
        }
      }
    }
    // (Once dead, the worker is held only while terminate() stops it.)
    if (this.#dead === null) this.#link.hold(this.#busy());
  }

  #receive(message: unknown): void {
    if (message === READY) {
      this.#ready = true;
      this.#pump();
      return;
    }
    const reply = message as Reply;
    const call = this.#inFlight[this.#answered];
    if (call === undefined) return;
    if (reply.id !== call.id) {  // the worker answers in order: anything else is a broken worker
      this.#die(new Error(`sdpa-wasm: the attention worker answered request ${String(reply.id)} where ${call.id} was due`));
      return;
    }
    this.#answered++;
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
    if (this.#unanswered() === 0) this.#pump();
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
          waiting.cancelled = true;  // (a batch being prepared skips it)
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
    this.#watched.delete(call.signal);
    try {
      call.signal.removeEventListener('abort', watch.listener);
    } catch {
      // A polyfilled signal's own code threw: its listener stays, and finds no call to reject.
    }
  }

  #die(error: Error): void {
    if (this.#dead !== null) return;
    this.#dead = error;
    for (const call of this.#takeInFlight()) this.#fail(call, error);
    for (const call of this.#queue.splice(0)) {  // never sent
      this.#unwatch(call);
      call.reject(error);
    }
    this.#link.hold(false);
  }
}

/** What an aborted signal's calls reject with: its reason, or an AbortError where it has none (a polyfill's). */
export function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException('The operation was aborted', 'AbortError');
}

/** Every typed array in a message's args (tensors, options, and options' tensors: saved.output.data). */
function typedArrays(args: Record<string, unknown>): unknown[] {
  const found: unknown[] = [];
  const visit = (x: unknown, depth: number) => {
    if (ArrayBuffer.isView(x)) found.push(x);
    else if (depth > 0 && x !== null && typeof x === 'object' && !Array.isArray(x)) {
      for (const value of Object.values(x)) visit(value, depth - 1);
    }
  };
  visit(args, 4);
  return found;
}
