// The calling side's handling of a worker call's arguments: taking the caller's typed arrays
// when the call is made (copied, or moved with { transfer: true }), the worker-only options
// (signal, transfer), and writing results into options.out when they come back.
import {
  bufferOf, byteLengthOf, byteOffsetOf, copyOf, detachedOrEmpty, elementBytesOf, isApiTypedArray, isArrayBuffer, lengthOf, viewLike,
  type TypedArray,
} from './typed-arrays.js';
import { carryRecord } from './saved-forward.js';
import type { SdpaBackwardResult, SdpaResult } from './types.js';
import {
  type BackwardPlan, checkOptionNames, describe, GRADIENT_NAMES, readOnce, type Plan, WORKER_OPTION_NAMES, writeOut,
} from './validate.js';

/** What every worker call takes besides the direct API's options. */
export interface WorkerCallOptions {
  /** Cancels the call if it has not started: it rejects with the signal's reason (an AbortError). */
  signal?: AbortSignal | undefined;
  /**
   * Move the input tensors' buffers to the worker instead of copying them (no copy; the
   * caller's arrays are detached, length 0, as soon as the call is made). The query, key and
   * value data of sdpa() (and gradOutput of sdpaBackward() and sdpaVarlenBackward()), the key
   * and value of append(), the query of attend(); `saved`, a mask,
   * keyLengths, keyStarts, sinks, alibiSlopes and causalOffset are always
   * copied. Default false.
   */
  transfer?: boolean | undefined;
}

/**
 * The buffers the calling side made (a Taker's copies) or moved from the caller: the only ones a
 * request may transfer to the worker. A buffer the caller still holds is never transferred.
 */
const takenBuffers = new WeakSet<ArrayBufferLike>();

/** Whether a request may transfer `buffer`: one a Taker made or moved. */
export const isTaken = (buffer: ArrayBufferLike): boolean => takenBuffers.has(buffer);

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
export class Taker {
  readonly #toMove: { holder: Record<string, unknown>; view: TypedArray; buffer: ArrayBuffer; offset: number; length: number }[] = [];
  // Typed arrays to copy, each into holder[key], by done(): after every getter of the call's
  // arguments has run, as the direct API reads their elements (a getter of a later option that
  // changes, detaches or shrinks an earlier array then has the same effect on both).
  readonly #toCopy: { holder: Record<string, unknown>; key: string; view: unknown }[] = [];
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
    carryRecord(x, taken);  // a saved logSumExp's record (saved-forward.ts) goes with its copy
    return taken;
  }

  /** holder[key] = x now, and its copy (copy()) from done() on. */
  #copyLater(holder: Record<string, unknown>, key: string, x: unknown): void {
    holder[key] = x;
    if (isApiTypedArray(x)) this.#toCopy.push({ holder, key, view: x });
  }

  /** A tensor-like object: a new { data, dims } with its data taken, its dims copied; anything else as it is (for the checks' messages). */
  tensor(t: unknown, move: boolean): unknown {
    if (t === null || typeof t !== 'object' || ArrayBuffer.isView(t)) return t;  // (a bare typed array: the checks refuse it)
    const { data, dims } = t as { data?: unknown; dims?: unknown };
    const buffer = isApiTypedArray(data) ? bufferOf(data) : null;
    const movable = move && this.transfer && isArrayBuffer(buffer) && byteLengthOf(buffer) > 0;
    const taken: Record<string, unknown> = { data, dims: Array.isArray(dims) ? readOnce(dims) : dims };
    if (!movable) this.#copyLater(taken, 'data', data);
    if (movable) {  // data replaced by done()
      const view = data as TypedArray;
      this.#toMove.push({ holder: taken, view, buffer: buffer as ArrayBuffer, offset: byteOffsetOf(view), length: lengthOf(view) });
    }
    return taken;
  }

  /**
   * The options optionValues() read, taken: masks and per-batch arrays copied, `out` kept
   * (results land in it), `saved`'s tensors taken. What those hold (a mask's data and dims,
   * saved's, out's gradients) is read here, after the call's tensors, as the direct API's
   * checks read them after its tensors.
   */
  options(values: unknown): unknown {
    if (values === null || typeof values !== 'object' || Array.isArray(values)) return values;
    const copy: Record<string, unknown> = {};
    for (const [name, value] of Object.entries(values)) {
      if (name === 'attnMask') copy[name] = this.tensor(value, false);
      else if (name === 'saved') copy[name] = this.saved(value);
      else if (name === 'out') copy[name] = this.outs(value);
      else this.#copyLater(copy, name, value);  // (another name's null stays null, for the checks to reject)
    }
    return copy;
  }

  /**
   * options.out, whose arrays are kept (results land in them): sdpa's array as it is;
   * sdpaBackward's object of them read once (each gradient's name by property access, as the
   * direct API reads it), its other own names kept, unread, for the checks to reject.
   */
  outs(out: unknown): unknown {
    if (describe(out) !== 'an object') return out;
    const copy: Record<string, unknown> = {};
    for (const name of Object.keys(out as object)) copy[name] = undefined;
    for (const name of GRADIENT_NAMES) {
      const array = (out as Record<string, unknown>)[name];
      if (array !== undefined) copy[name] = array;
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
   * no `out` array (outsOf) may be a view of a buffer about to move (the result could not land
   * in it). The checks that depend on a cache's length at the call's turn run then, after the move.
   */
  movesChecked(fn: string, outs: [name: string, out: unknown][], check: () => void): void {
    if (this.#toMove.length === 0) return;
    check();
    for (const [name, out] of outs) {
      if (!isApiTypedArray(out)) continue;
      const shared = this.#toMove.find(({ buffer }) => buffer === bufferOf(out));
      if (shared !== undefined) {
        throw new RangeError(`${fn}: ${name} shares its ArrayBuffer with an input that { transfer: true } moves to the ` +
          'worker, so the result could not be written into it; give it a buffer of its own, or leave transfer off. Nothing was moved');
      }
    }
  }

  /**
   * Copies the arrays noted to copy (their elements as they are now, after every getter of the
   * call's arguments), then moves the noted buffers (each once) and points the taken tensors at
   * the moved ones; those whose buffer cannot move are copied. Nothing moves for a call already cancelled (`signal`
   * aborted): it will not run, and the caller keeps its arrays.
   */
  done(signal: AbortSignal | undefined): void {
    // First the copies (an array to copy may share its buffer with one about to move).
    for (const { holder, key, view } of this.#toCopy) holder[key] = this.copy(view);
    this.#toCopy.length = 0;
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

/**
 * The worker-only options (signal, transfer), checked. The others are the direct API's: taken
 * by Taker.options() (without these two) and checked by the direct API's own checks.
 */
export function workerCallOptions(fn: string, options: unknown): { signal?: AbortSignal; transfer: boolean } {
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

/**
 * A call's options read as the direct API reads them (checkOptionNames), before its tensors:
 * each of the call's `known` names read once, by property access (so inherited and
 * non-enumerable ones count), and any other own name whose value is not undefined kept as null
 * (its value not copied), for the checks to reject; without the worker-only `signal` and
 * `transfer`. A plain object of them (anything else as it is, for the checks' messages), for
 * Taker.options() to take after the tensors: so a getter of an option that changes a tensor
 * (or one of a tensor that changes an option) has the effect it has on the direct call.
 */
export function optionValues(options: unknown, known: readonly string[]): unknown {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) return options;
  const values: Record<string, unknown> = {};
  for (const name of Object.keys(options)) {
    if (known.includes(name) || WORKER_OPTION_NAMES.includes(name)) continue;
    if ((options as Record<string, unknown>)[name] !== undefined) values[name] = null;
  }
  for (const name of known) {
    const value = (options as Record<string, unknown>)[name];
    if (value !== undefined) values[name] = value;
  }
  return values;
}

/** The options of a call that takes no direct-API options: only `signal`. */
export function signalOnly(fn: string, options: unknown): { signal?: AbortSignal } {
  checkOptionNames(fn, options, ['signal']);
  return workerCallOptions(fn, options);
}

/** AbortSignal.prototype's `aborted` getter, where the engine has AbortSignal: it throws for anything else. */
const abortedGetter = typeof AbortSignal === 'undefined' ? undefined
  : Object.getOwnPropertyDescriptor(AbortSignal.prototype, 'aborted')?.get;

/**
 * An AbortSignal: the engine's own (by its internal slot, whatever properties the object
 * carries), or an object with what the queue uses of one (a polyfill's): a boolean `aborted`,
 * addEventListener and removeEventListener. (Without removeEventListener a call's end threw
 * inside the queue's microtask: the batch left unsent, the process ended in Node.)
 */
function isAbortSignal(x: unknown): x is AbortSignal {
  if (x === null || typeof x !== 'object') return false;
  if (abortedGetter !== undefined) {
    try {
      abortedGetter.call(x);
      return true;
    } catch {
      // not the engine's: a polyfill's, perhaps
    }
  }
  const s = x as AbortSignal;
  return typeof s.aborted === 'boolean' && typeof s.addEventListener === 'function' && typeof s.removeEventListener === 'function';
}

/**
 * The result from the worker, with the output written into options.out when one was given, as
 * the direct API does: through the call's own view of it (Plan.out) and returned as Plan.outResult.
 */
export function deliver(value: unknown, p: Plan): SdpaResult {
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

/**
 * sdpaBackward's result from the worker, each gradient written into options.out's array for it
 * as the direct API does (BackwardPlan.out). Every array is checked before any is written.
 */
export function deliverGradients(value: unknown, p: BackwardPlan, fn = 'sdpaBackward'): SdpaBackwardResult {
  const result = value as SdpaBackwardResult;
  const targets = GRADIENT_NAMES.flatMap((name) => {
    const target = p.out[name];
    const tensor = result[name];
    return target === undefined || tensor === undefined ? [] : [{ name, target, tensor }];
  });
  for (const { name, target, tensor } of targets) {
    const size = lengthOf(tensor.data);
    if (lengthOf(target.view) < size) {
      const how = detachedOrEmpty(target.view) ? 'was detached' : 'shrank (a resizable buffer)';
      throw new RangeError(`${fn}: options.out.${name}'s buffer ${how} while the call ran; the gradient ` +
        `${name} [${tensor.dims.join(', ')}] (${size} floats) could not be written into it, nor were the others`);
    }
  }
  for (const { name, tensor, target } of targets) result[name] = { data: writeOut(target, tensor.data, p.accumulate), dims: tensor.dims };
  return result;
}

/** options.out of the taken options. */
export const outOf = (options: unknown): unknown =>
  options !== null && typeof options === 'object' ? (options as { out?: unknown }).out : undefined;

/** The `out` arrays of the taken options (kept as the caller gave them), with their names, for movesChecked. */
export function outsOf(options: unknown): [name: string, out: unknown][] {
  const out = outOf(options);
  if (out === null || typeof out !== 'object') return [];
  if (ArrayBuffer.isView(out)) return [['options.out', out]];
  return GRADIENT_NAMES.map((name) => [`options.out.${name}`, (out as Record<string, unknown>)[name]]);
}

/**
 * The options to send: what the checks accepted, without `out` and sdpaBackward's `accumulate`
 * (results come back in new buffers, written or added into out's arrays on this side).
 */
export function sendable(options: unknown): unknown {
  if (options === null || typeof options !== 'object') return options;
  const { out: _out, accumulate: _accumulate, ...rest } = options as Record<string, unknown>;
  return rest;
}
