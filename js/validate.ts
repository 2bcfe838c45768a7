// Turns the user's tensors and options into a checked Plan: logical shapes [B, H, L, E],
// element strides, and the flags the wasm kernel needs. Every rejection is a TypeError
// (wrong kind of value) or a RangeError (right kind, wrong value) whose message starts with
// the function called (`sdpa`, `KVCache.attend`, ...) and names the argument, what was
// expected and what was given.
//   plan()        sdpa(query, key, value, options): every tensor from the caller
//   planAttend()  KVCache.attend(query, options): K/V are the cache's stored positions
// Both end in planOptions(), so an option means the same everywhere.
import { MAX_WASM_BYTES } from './memory.js';
import {
  detachedOrEmpty, halfBitsOf, isFloat16Array, isFloat32Array, isInt32Array, isUint16Array, isUint8Array, lengthOf, ownView, sharesBytes, viewTag, type TypedArray,
} from './typed-arrays.js';
import type { AttentionOptions, Float16ArrayType, MaskTensor, SdpaOptions } from './types.js';

/**
 * An input's float data as the checks took it: a Float32Array, or a Float16Array (where the
 * engine has one) whose values the copies into wasm memory widen (typed array set() converts).
 */
export type InputData = Float32Array | Float16ArrayType;

/**
 * The bytes an input's values take in wasm memory, as float32: its length·4, never its
 * byteLength (a Float16Array's is half that). What every block an input is copied into is sized by.
 */
export const floatBytes = (data: InputData): number => data.length * 4;

/** The bytes of one mask element in wasm memory: a float32 (from a Float32Array or a Float16Array), or a byte (boolean). */
export const maskElementBytes = (kind: 'float' | 'bool'): number => (kind === 'float' ? 4 : 1);

/** The bytes a whole mask takes in wasm memory; 0 for none. */
export const maskBytes = (mask: Plan['mask']): number => (mask === null ? 0 : mask.data.length * maskElementBytes(mask.kind));

export const OPTION_NAMES = [
  'scale', 'softcap', 'attnMask', 'isCausal', 'causalOffset', 'slidingWindow', 'keyLengths', 'keyStarts', 'sinks',
  'alibiSlopes', 'dropoutP', 'dropoutSeed', 'returnWeights', 'returnLogSumExp', 'out', 'layout',
] as const;
/** sdpaBackward's options: the score pipeline's, `saved`, `returnMaskGrad`, and its own `out` and `accumulate`. */
export const BACKWARD_OPTION_NAMES = [
  'scale', 'softcap', 'attnMask', 'isCausal', 'causalOffset', 'slidingWindow', 'keyLengths', 'keyStarts', 'sinks',
  'alibiSlopes', 'dropoutP', 'dropoutSeed', 'layout', 'saved',
  'returnMaskGrad', 'out', 'accumulate',
] as const;
/** sdpaBackward's results, in the order they are written (and the names options.out takes). */
export const GRADIENT_NAMES = ['dQuery', 'dKey', 'dValue', 'dAttnMask', 'dSinks'] as const;
export type GradientName = typeof GRADIENT_NAMES[number];

/** Elements strides of a [B, H, L, D] view; D is contiguous. */
export interface Strides {
  b: number;
  h: number;
  l: number;
}

export interface Plan {
  layout: 'bhsd' | 'bshd';
  /** The rejecting function's name, for messages of later checks (memory). */
  fn: string;
  batch: number;
  qHeads: number;
  kvHeads: number;
  qLen: number;
  kvLen: number;
  headDim: number;
  valueDim: number;
  q: Strides;
  k: Strides;
  v: Strides;
  o: Strides;
  outputDims: number[];
  outputSize: number;
  weightsDims: number[] | null;
  weightsSize: number;
  /** returnLogSumExp: [..., Hq, Lq] (the query's leading axes), dense. */
  lseDims: number[] | null;
  lseSize: number;
  scale: number;
  softcap: number;
  mask: null | {
    kind: 'float' | 'bool';
    data: InputData | Uint8Array;
    /** The elements its dims need (data.length when checked). */
    size: number;
    /** Its dims as given (1 to 4 of them, right-aligned against [B, Hq, Lq, Lk]). */
    dims: number[];
    strides: [number, number, number, number];  // over [B, Hq, Lq, Lk], 0 = broadcast
  };
  causal: boolean;
  causalOffset: number;
  causalOffsets: Int32Array | null;
  /** 0: none; else W in [1, 2^30] (causal): row i attends keys j > i + offset - W. */
  slidingWindow: number;
  keyLengths: Int32Array | null;
  /** Per-batch first valid keys (left padding), or null for 0. */
  keyStarts: Int32Array | null;
  /** Per-query-head sink logits [Hq] (finite, or -Infinity for none), or null for none. */
  sinks: Float32Array | null;
  /**
   * ALiBi slopes, [Hq] (every batch) or [B, Hq], each in [0, 2^64], or null for none: key j of
   * row i gets the bias -slope·|i + causalOffset - j| (src/kernels/alibi.h).
   */
  alibiSlopes: Float32Array | null;
  /** Elements between two batches' slopes: 0 for [Hq], Hq for [B, Hq]. */
  alibiStrideB: number;
  /**
   * Attention dropout (src/kernels/dropout.h): 0 for none, else the uint32 below which a
   * probability's bits drop it (round(dropoutP·2^32)); and the mask's seed (0 without dropout).
   */
  dropoutThreshold: number;
  dropoutSeed: number;
  /** The output's part of options.out: a view of exactly outputSize floats (ownView), or null. */
  out: Float32Array | null;
  /**
   * What a call with options.out returns (null without): the caller's array when it is exactly
   * the output, else `out` (its start, the same memory).
   */
  outResult: Float32Array | null;
  /** query.data as the checks read it (once): what the call computes with. */
  queryData: InputData;
}

/** A checked sdpa() call: the plan, with key.data and value.data as the checks read them. */
export interface SdpaPlan extends Plan {
  keyData: InputData;
  valueData: InputData;
}

/** float32's largest finite value and least positive (subnormal) one. */
const FLOAT32_MAX = 3.4028234663852886e38;
const FLOAT32_MIN_POSITIVE = 1.401298464324817e-45;

const tag = (x: unknown) => Object.prototype.toString.call(x).slice(8, -1);

export function describe(x: unknown): string {
  if (x === null) return 'null';
  if (Array.isArray(x)) return `Array(${x.length})`;
  if (ArrayBuffer.isView(x)) {  // a typed array's own type and length (from its internal slots)
    const name = viewTag(x);
    return name === undefined ? tag(x) : `${name}(${lengthOf(x)})`;
  }
  if (typeof x === 'object') return tag(x) === 'Object' ? 'an object' : tag(x);
  if (typeof x === 'string') return JSON.stringify(x);
  if (typeof x === 'bigint') return `${x}n (a BigInt)`;
  return String(x);
}


/**
 * Whether `t` cannot be a tensor: not an object, or a typed array itself where { data, dims }
 * was wanted (tensorGot() then says how to pass it, as a user who passed `q.data` for `q` needs).
 */
function notATensor(t: unknown): boolean {
  return t === null || typeof t !== 'object' || ArrayBuffer.isView(t);
}

/** What a value given for a tensor was, for a notATensor() message (a typed array: how to pass it). */
function tensorGot(t: unknown): string {
  return viewTag(t) !== undefined ? `${describe(t)}, a bare array: pass it as { data, dims }` : describe(t);
}

/** The options every call through createAttentionWorker takes besides the direct API's (worker-args.ts). */
export const WORKER_OPTION_NAMES: readonly string[] = ['signal', 'transfer'];

/** sdpa() and sdpaBackward() share the score options; the others are each one's own: said so. */
function belongsElsewhere(fn: string, name: string): string {
  const of = (names: readonly string[]) => names.includes(name);
  if (of(WORKER_OPTION_NAMES)) return " (an option of a createAttentionWorker() worker's calls only)";
  if (fn === 'sdpa' && of(BACKWARD_OPTION_NAMES)) return ' (an option of sdpaBackward only)';
  if (fn === 'sdpaBackward' && of(OPTION_NAMES)) return ' (an option of sdpa only)';
  if (fn === 'sdpaVarlen' || fn === 'sdpaVarlenBackward') {
    if (['attnMask', 'keyLengths', 'keyStarts', 'returnWeights', 'returnMaskGrad', 'layout'].includes(name)) {
      return ' (packed sequences take no attnMask, keyLengths, keyStarts, returnWeights, returnMaskGrad or layout: ' +
        'each sequence is its own block of rows and keys, [T, H, D])';
    }
    if (fn === 'sdpaVarlen' && of(BACKWARD_OPTION_NAMES)) return ' (an option of sdpaVarlenBackward only)';
    if (fn === 'sdpaVarlenBackward' && of(OPTION_NAMES)) return ' (an option of sdpaVarlen only)';
  }
  return '';
}

/**
 * An options argument: undefined is {}; anything but a plain object, or an unknown name, is a
 * TypeError. An option whose value is undefined is not given, known or not (so `{ ...forward,
 * returnLogSumExp: undefined }` passes a forward's options on to its backward).
 */
export function checkOptionNames(fn: string, options: unknown, known: readonly string[]): Record<string, unknown> {
  if (options === undefined) return {};
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw new TypeError(`${fn}: options must be an object, got ${describe(options)}`);
  }
  for (const name of Object.keys(options)) {
    if (!known.includes(name) && (options as Record<string, unknown>)[name] !== undefined) {
      throw new TypeError(`${fn}: unknown option "${name}"${belongsElsewhere(fn, name)}; known options: ${known.join(', ')}`);
    }
  }
  // A copy, each option read once: a getter runs before any check, never between a check
  // and the use of what it checked.
  const copy: Record<string, unknown> = {};
  for (const name of known) {
    const x = (options as Record<string, unknown>)[name];
    if (x !== undefined) copy[name] = x;
  }
  return copy;
}

/**
 * A tensor's dims, checked, as a copy read once (each element and the length exactly one
 * time, so a getter cannot pass the checks with one value and be used with another; a hole in a
 * sparse array reads as undefined and is rejected).
 */
/**
 * An array's elements as the checks read them: its length once, then each element once, by
 * index (no iterator, so an own Symbol.iterator or a getter changes nothing between a read and
 * its use). The worker takes a tensor's dims this way too.
 */
export function readOnce(array: readonly unknown[]): unknown[] {
  const length = array.length;
  const copy: unknown[] = [];
  for (let at = 0; at < length; at++) copy.push(array[at]);
  return copy;
}

function checkDims(fn: string, name: string, dims: unknown, minRank: number, maxRank: number): number[] {
  if (!Array.isArray(dims)) {
    throw new TypeError(`${fn}: ${name}.dims must be an array of positive integers, got ${describe(dims)}`);
  }
  const copy = readOnce(dims);
  const rank = copy.length;
  const shown = () => `[${copy.map((d) => (typeof d === 'number' ? String(d) : describe(d))).join(', ')}]`;
  if (rank < minRank || rank > maxRank) {
    throw new RangeError(`${fn}: ${name}.dims must have rank ${minRank}..${maxRank}, got ${shown()} (rank ${rank})`);
  }
  copy.forEach((d, axis) => {
    if (typeof d !== 'number') {
      throw new TypeError(`${fn}: ${name}.dims[${axis}] must be a number, got ${describe(d)} in ${shown()}`);
    }
    if (!Number.isInteger(d) || d < 1 || d > 0x7fffffff) {
      throw new RangeError(`${fn}: ${name}.dims[${axis}] must be a positive integer, got ${describe(d)} in ${shown()}`);
    }
  });
  return copy as number[];
}

/**
 * A RangeError for a typed array option (`name`) that is detached or over an empty buffer, where
 * `length` elements (its checked length, 0 then) would otherwise be blamed: a getter read after
 * the option may have detached it. `needs` says what it must hold.
 */
export function refuseDetached(fn: string, name: string, view: ArrayBufferView, length: number, needs: string): void {
  if (length === 0 && detachedOrEmpty(view)) throw new RangeError(detachedMessage(fn, name, needs));
}

/** The message for a typed array read where its buffer has been detached. */
export function detachedMessage(fn: string, name: string, needs: string): string {
  return `${fn}: ${name} has no elements: its ArrayBuffer is detached (transferred, e.g. to a worker with ` +
    `{ transfer: true }) or empty; ${needs}`;
}

function checkSize(fn: string, name: string, dims: number[], data: ArrayBufferView & { length: number }): void {
  const size = dims.reduce((a, b) => a * b, 1);
  const length = lengthOf(data);
  if (length === 0 && size > 0 && detachedOrEmpty(data)) {
    throw new RangeError(detachedMessage(fn, `${name}.data`, `dims [${dims.join(', ')}] need ${size} elements`));
  }
  if (size !== length) {
    throw new RangeError(
      `${fn}: ${name}.data.length must equal the product of ${name}.dims [${dims.join(', ')}] = ${size}, got ${length}`);
  }
}

/** Element strides of a [B, H, L, D] tensor stored in `layout`. */
export function layoutStrides(layout: 'bhsd' | 'bshd', H: number, L: number, D: number): Strides {
  return layout === 'bhsd' ? { b: H * L * D, h: L * D, l: D } : { b: L * H * D, h: D, l: H * D };
}

/** A checked tensor of rank 2..4 read as [B, H, L, D] in its layout. */
export interface Operand<T extends InputData | Uint16Array = InputData> {
  data: T;
  /**
   * A KV cache append's: `data` (a Uint16Array) is a Float16Array's bits, IEEE halves whatever
   * the cache's dtype; a Uint16Array given as such holds raw elements of the cache's own dtype.
   */
  ieeeHalves?: true;
  dims: number[];
  B: number;
  H: number;
  L: number;
  D: number;
  strides: Strides;
}

/**
 * What checkTensor takes as a tensor's data: 'input' (query, key, value, gradOutput) a
 * Float32Array or a Float16Array (kept as it is: the copies into wasm memory widen its values);
 * 'float32' (a forward's saved output) a Float32Array only; 'cache' (a KV cache's appends) also a
 * Uint16Array of raw 16-bit elements, and a Float16Array's bits come back as a Uint16Array marked
 * ieeeHalves.
 */
export type TensorData = 'input' | 'float32' | 'cache';
const DATA_KINDS: Record<TensorData, { type: string; message: string }> = {
  input: { type: 'Float32Array | Float16Array', message: 'a Float32Array or a Float16Array' },
  float32: { type: 'Float32Array', message: 'a Float32Array' },
  cache: { type: 'Float32Array | Float16Array | Uint16Array', message: 'a Float32Array, a Float16Array or a Uint16Array (raw 16-bit elements)' },
};

/** A tensor of rank 2..4, read as [B, H, L, D] in the given layout, its data as `accepts` says (TensorData). */
export function checkTensor(fn: string, name: string, t: unknown, layout: 'bhsd' | 'bshd', accepts: 'cache'): Operand<Float32Array | Uint16Array>;
export function checkTensor(fn: string, name: string, t: unknown, layout: 'bhsd' | 'bshd', accepts: 'float32'): Operand<Float32Array>;
export function checkTensor(fn: string, name: string, t: unknown, layout: 'bhsd' | 'bshd', accepts?: 'input'): Operand;
export function checkTensor(fn: string, name: string, t: unknown, layout: 'bhsd' | 'bshd', accepts: TensorData = 'input') {
  const kind = DATA_KINDS[accepts];
  if (notATensor(t)) {
    throw new TypeError(`${fn}: ${name} must be a tensor { data: ${kind.type}, dims: number[] }, got ${tensorGot(t)}`);
  }
  const { data, dims } = t as { data?: unknown; dims?: unknown };
  const taken = isFloat32Array(data) || (accepts !== 'float32' && isFloat16Array(data)) || (accepts === 'cache' && isUint16Array(data));
  if (!taken) throw new TypeError(`${fn}: ${name}.data must be ${kind.message}, got ${describe(data)}`);
  const d = checkDims(fn, name, dims, 2, 4);
  checkSize(fn, name, d, data as ArrayBufferView & { length: number });
  const halfBits = accepts === 'cache' && isFloat16Array(data);
  const own = halfBits ? halfBitsOf(data) : ownView(data as TypedArray);
  // Missing axes are 1: rank 3 is [H, L, E] ([L, H, E] for bshd), rank 2 is [L, E] in either
  // layout (one head: for bshd the missing H sits between L and E).
  const full = d.length === 2 && layout === 'bshd' ? [1, d[0], 1, d[1]] : [...Array(4 - d.length).fill(1), ...d];
  const [B, second, third, D] = full;
  const [H, L] = layout === 'bhsd' ? [second, third] : [third, second];
  const operand = { data: own, dims: d, B, H, L, D, strides: layoutStrides(layout, H, L, D) };
  return halfBits ? { ...operand, ieeeHalves: true } : operand;
}

/** The largest head size E and value size Ev the kernel takes (sdpa::kMaxHeadDim, src/sdpa.h). */
export const MAX_HEAD_DIM = 2 ** 20;

/** A head size E or value size Ev (`what` names it) within the kernel's MAX_HEAD_DIM. */
export function checkHeadDim(fn: string, what: string, d: number): void {
  if (d > MAX_HEAD_DIM) {
    throw new RangeError(`${fn}: ${what} must be at most ${MAX_HEAD_DIM} (2^20, the kernel's limit), got ${d}`);
  }
}

export function checkLayout(fn: string, layout: unknown): 'bhsd' | 'bshd' {
  if (layout === undefined) return 'bhsd';
  if (typeof layout !== 'string') {
    throw new TypeError(`${fn}: options.layout must be 'bhsd' or 'bshd', got ${describe(layout)}`);
  }
  if (layout !== 'bhsd' && layout !== 'bshd') {
    throw new RangeError(`${fn}: options.layout must be 'bhsd' or 'bshd', got ${describe(layout)}`);
  }
  return layout;
}

/** A RangeError for a tensor whose `what` (an axis, named) is not the `expected` value. */
export function dimsMismatch(fn: string, layout: 'bhsd' | 'bshd', name: string, t: { dims: number[] }, what: string,
  expected: number, got: number): RangeError {
  const axisName = layout === 'bhsd' ? '[B, H, L, E]' : '[B, L, H, E]';
  return new RangeError(`${fn}: ${name}.dims [${t.dims.join(', ')}] (${axisName}) must have ${what} = ${expected}, got ${got}`);
}

function checkMask(fn: string, mask: unknown, target: [number, number, number, number]): Plan['mask'] {
  if (notATensor(mask)) {
    throw new TypeError(`${fn}: options.attnMask must be a tensor { data: Float32Array | Float16Array | Uint8Array, dims }, got ${tensorGot(mask)}`);
  }
  const { data, dims } = mask as Partial<MaskTensor>;
  let kind: 'float' | 'bool';
  if (isFloat32Array(data) || isFloat16Array(data)) kind = 'float';  // a Float16Array's values widened as copied in
  else if (isUint8Array(data)) kind = 'bool';
  else {
    throw new TypeError(
      `${fn}: options.attnMask.data must be a Float32Array or Float16Array (additive) or Uint8Array (boolean), got ${describe(data)}`);
  }
  const d = checkDims(fn, 'options.attnMask', dims, 1, 4);
  checkSize(fn, 'options.attnMask', d, data);
  const names = ['B', 'Hq', 'Lq', 'Lk'];
  const strides: [number, number, number, number] = [0, 0, 0, 0];
  let stride = 1;
  for (let axis = 3; axis >= 0; axis--) {
    const m = axis - (4 - d.length);
    const size = m >= 0 ? d[m] : 1;
    if (size !== 1 && size !== target[axis]) {
      throw new RangeError(
        `${fn}: options.attnMask.dims [${d.join(', ')}] cannot broadcast to [B, Hq, Lq, Lk] = [${target.join(', ')}]: ` +
        `axis ${names[axis]} must be 1 or ${target[axis]}, got ${size}`);
    }
    strides[axis] = size === 1 ? 0 : stride;
    stride *= size;
  }
  return { kind, data: ownView(data), size: lengthOf(data), dims: d, strides };
}

function checkBoolean(fn: string, name: string, x: unknown, fallback: boolean): boolean {
  if (x === undefined) return fallback;
  if (typeof x !== 'boolean') throw new TypeError(`${fn}: ${name} must be a boolean, got ${describe(x)}`);
  return x;
}

/** sdpa(query, key, value, options). */
export function plan(query: unknown, key: unknown, value: unknown, options: unknown): SdpaPlan {
  const fn = 'sdpa';
  const p = planTensors(fn, query, key, value, checkOptionNames(fn, options, OPTION_NAMES) as SdpaOptions).plan;
  checkArraysKept(fn, planArrays(p));
  return p;
}

/** A typed array a call's checks accepted, its name in messages, and the elements it must still have. */
type CheckedArray = [name: string, view: ArrayBufferView & { length: number }, needs: number];

/** The arrays of a plan (inputs, mask, out) with the elements each must keep. */
export function planArrays(p: Plan | SdpaPlan): CheckedArray[] {
  const kv = p.batch * p.kvHeads * p.kvLen;
  const arrays: CheckedArray[] = [['query.data', p.queryData, p.batch * p.qHeads * p.qLen * p.headDim]];
  if ('keyData' in p) arrays.push(['key.data', p.keyData, kv * p.headDim], ['value.data', p.valueData, kv * p.valueDim]);
  if (p.mask !== null) arrays.push(['options.attnMask.data', p.mask.data, p.mask.size]);
  if (p.out !== null) arrays.push(['options.out', p.out, p.outputSize]);
  return arrays;
}

/**
 * Once every argument has been read: the arrays the checks accepted still hold what was
 * checked. A getter read after an array (a later tensor's dims, a mask's, gradOutput's) may
 * have detached its buffer, or shrunk a resizable one; the kernel must never read fewer
 * elements than were checked.
 */
export function checkArraysKept(fn: string, arrays: CheckedArray[]): void {
  for (const [name, view, needs] of arrays) {
    const length = lengthOf(view);
    if (length >= needs) continue;
    if (length === 0 && detachedOrEmpty(view)) {
      throw new RangeError(`${fn}: ${name}'s buffer was detached while the call read its arguments (by a getter); nothing was done`);
    }
    throw new RangeError(`${fn}: ${name} shrank below the ${needs} elements checked while the call read its arguments ` +
      '(a resizable buffer resized by a getter); nothing was done');
  }
}

/** A checked sdpaBackward() call: the forward's plan and the backward's own operands. */
export interface BackwardPlan {
  /** The forward's problem (with its log-sum-exp). */
  forward: SdpaPlan;
  gradOutput: InputData;
  /** options.saved, checked: the forward's output and log-sum-exp. */
  saved: {
    output: Float32Array;
    logSumExp: Float32Array;
    /** The caller's logSumExp.data itself (its record, saved-forward.ts, is keyed by it). */
    given: Float32Array;
  } | null;
  queryDims: number[];
  keyDims: number[];
  valueDims: number[];
  /** options.returnMaskGrad: the float mask's gradient is asked for (forward.mask is float). */
  maskGrad: boolean;
  /** options.out: where each gradient given one is written (the others come in new arrays). */
  out: Partial<Record<GradientName, OutTarget>>;
  /** options.accumulate: gradients are added to what out's arrays hold, not written over it. */
  accumulate: boolean;
}

/**
 * sdpaBackward's options.out: { dQuery?, dKey?, dValue?, dAttnMask?, dSinks? }, a Float32Array of at least
 * its gradient's size for each result to be written into the caller's memory. A record of names
 * (describe() says 'an object': a Map, an ArrayBuffer, an array or any other kind of object is
 * refused, not read as "no out"). Each name is read once, by property access; no two arrays may
 * share bytes where they are written (one would overwrite the other). Arrays over different
 * SharedArrayBuffer objects count as different memory (a clone of one is not told apart).
 */
function checkBackwardOut(fn: string, given: unknown, results: Record<GradientName, { dims: readonly number[]; size: number } | null>):
  BackwardPlan['out'] {
  if (given === undefined) return {};
  const names = GRADIENT_NAMES.join(', ');
  const kind = describe(given);
  if (kind !== 'an object') {
    const bare = viewTag(given) !== undefined ? ': sdpaBackward has several results, so name the one it is for, e.g. { dQuery: array }' : '';
    throw new TypeError(`${fn}: options.out must be an object of Float32Arrays with any of the names ${names}, got ${kind}${bare}`);
  }
  for (const name of Object.keys(given as object)) {
    if (!(GRADIENT_NAMES as readonly string[]).includes(name)) {
      throw new TypeError(`${fn}: options.out.${name} is not a result of sdpaBackward; options.out takes ${names}`);
    }
  }
  const out: BackwardPlan['out'] = {};
  const written: [GradientName, Float32Array][] = [];
  for (const name of GRADIENT_NAMES) {
    const array = (given as Record<string, unknown>)[name];
    if (array === undefined) continue;
    const result = results[name];
    if (result === null) {
      throw new TypeError(name === 'dSinks'
        ? `${fn}: options.out.dSinks is only written with options.sinks (the sinks' gradient)`
        : `${fn}: options.out.dAttnMask is only written with options.returnMaskGrad: true (and a float attnMask)`);
    }
    const target = checkOutArray(fn, `options.out.${name}`, `the gradient ${name}`, array, result.dims, result.size);
    const shared = written.find(([, view]) => sharesBytes(view, target.view));
    if (shared !== undefined) {
      throw new RangeError(`${fn}: options.out.${shared[0]} and options.out.${name} share memory (the same buffer, ` +
        'overlapping elements): one gradient would overwrite the other; give each its own elements');
    }
    written.push([name, target.view]);
    out[name] = target;
  }
  return out;
}

/** A gradient's dims and size: its input's. */
const gradientOf = (t: Operand) => ({ dims: t.dims, size: t.B * t.H * t.L * t.D });

function sameDims(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

/** sdpaBackward(query, key, value, gradOutput, options). */
export function planBackward(query: unknown, key: unknown, value: unknown, gradOutput: unknown,
  options: unknown): BackwardPlan {
  const fn = 'sdpaBackward';
  const o = checkOptionNames(fn, options, BACKWARD_OPTION_NAMES) as Omit<SdpaOptions, 'out'> &
    { saved?: unknown; returnMaskGrad?: unknown; out?: unknown; accumulate?: unknown };
  const { saved, returnMaskGrad, out, accumulate, ...forwardOptions } = o;
  const { plan: forward, q, k, v } = planTensors(fn, query, key, value, { ...forwardOptions, returnLogSumExp: true });
  return completeBackwardPlan(fn, forward, q, k, v, gradOutput, { saved, returnMaskGrad, out, accumulate });
}

/**
 * The backward's own operands of a checked forward plan (made with returnLogSumExp): gradOutput,
 * options.saved, returnMaskGrad, out and accumulate. sdpaBackward and sdpaVarlenBackward (js/varlen.ts).
 */
export function completeBackwardPlan(fn: string, forward: SdpaPlan, q: Operand, k: Operand, v: Operand, gradOutput: unknown,
  o: { saved?: unknown; returnMaskGrad?: unknown; out?: unknown; accumulate?: unknown },
  forwardCall: 'sdpa' | 'sdpaVarlen' = 'sdpa'): BackwardPlan {
  const savedFrom = `${forwardCall}(..., { returnLogSumExp: true })`;
  const { saved: savedOption, returnMaskGrad, out: outOption, accumulate: accumulateOption } = o;
  const maskGrad = checkBoolean(fn, 'options.returnMaskGrad', returnMaskGrad, false);
  const accumulate = checkBoolean(fn, 'options.accumulate', accumulateOption, false);
  if (accumulate && outOption === undefined) {
    throw new TypeError(`${fn}: options.accumulate adds the gradients into options.out's arrays; it needs options.out`);
  }
  if (maskGrad && forward.mask?.kind !== 'float') {
    throw new TypeError(`${fn}: options.returnMaskGrad needs an additive options.attnMask (Float32Array or Float16Array data); got ` +
      (forward.mask === null ? 'no attnMask' : 'a boolean one (Uint8Array data), which has no gradient'));
  }
  const arrays = planArrays(forward);
  const go = checkTensor(fn, 'gradOutput', gradOutput, forward.layout);
  if (!sameDims(go.dims, forward.outputDims)) {
    throw new RangeError(
      `${fn}: gradOutput.dims must equal the output's dims [${forward.outputDims.join(', ')}], got [${go.dims.join(', ')}]`);
  }
  let saved: BackwardPlan['saved'] = null;
  if (savedOption !== undefined) {
    if (savedOption === null || typeof savedOption !== 'object') {
      throw new TypeError(`${fn}: options.saved must be { output, logSumExp } from ${savedFrom}, got ${describe(savedOption)}`);
    }
    const { output, logSumExp } = savedOption as { output?: unknown; logSumExp?: unknown };
    const out = checkTensor(fn, 'options.saved.output', output, forward.layout, 'float32');
    if (!sameDims(out.dims, forward.outputDims)) {
      throw new RangeError(
        `${fn}: options.saved.output.dims must equal the output's dims [${forward.outputDims.join(', ')}], got [${out.dims.join(', ')}]`);
    }
    if (notATensor(logSumExp)) {
      throw new TypeError(`${fn}: options.saved.logSumExp must be a tensor { data: Float32Array, dims } (the logSumExp of ${savedFrom}), got ${tensorGot(logSumExp)}`);
    }
    // Each read once (a getter cannot pass the checks with one value and be used with another).
    const { data: lseData, dims: lseDimsGiven } = logSumExp as { data?: unknown; dims?: unknown };
    if (!isFloat32Array(lseData)) {
      throw new TypeError(`${fn}: options.saved.logSumExp must be a tensor { data: Float32Array, dims } (the logSumExp of ${savedFrom}), got ${describe(logSumExp)}`);
    }
    const lseDims = forward.lseDims as number[];
    const given = Array.isArray(lseDimsGiven) ? Array.from(lseDimsGiven) : null;
    if (given === null || !sameDims(given, lseDims) || lengthOf(lseData) !== forward.lseSize) {
      throw new RangeError(
        `${fn}: options.saved.logSumExp must have dims [${lseDims.join(', ')}] and ${forward.lseSize} elements, ` +
        `got dims ${given !== null ? `[${given.join(', ')}]` : describe(lseDimsGiven)} and ${lengthOf(lseData)} elements`);
    }
    saved = { output: out.data, logSumExp: ownView(lseData), given: lseData };
    arrays.push(['options.saved.output.data', out.data, forward.outputSize], ['options.saved.logSumExp.data', saved.logSumExp, forward.lseSize]);
  }
  arrays.push(['gradOutput.data', go.data, forward.outputSize]);
  const mask = forward.mask;
  const out = checkBackwardOut(fn, outOption, {
    dQuery: gradientOf(q), dKey: gradientOf(k), dValue: gradientOf(v),
    dAttnMask: maskGrad && mask !== null ? { dims: mask.dims, size: mask.size } : null,
    dSinks: forward.sinks !== null ? { dims: [forward.qHeads], size: forward.qHeads } : null,
  });
  for (const [name, target] of Object.entries(out)) arrays.push([`options.out.${name}`, target.view, target.size]);
  checkArraysKept(fn, arrays);
  return { forward, gradOutput: go.data, saved, queryDims: q.dims, keyDims: k.dims, valueDims: v.dims, maskGrad, out, accumulate };
}

function planTensors(fn: string, query: unknown, key: unknown, value: unknown, o: SdpaOptions) {
  const layout = checkLayout(fn, o.layout);
  const q = checkTensor(fn, 'query', query, layout);
  const k = checkTensor(fn, 'key', key, layout);
  const v = checkTensor(fn, 'value', value, layout);

  const mismatch = (name: string, t: Operand, what: string, expected: number, got: number) =>
    dimsMismatch(fn, layout, name, t, what, expected, got);
  if (k.B !== q.B) throw mismatch('key', k, "query's batch B", q.B, k.B);
  if (v.B !== q.B) throw mismatch('value', v, "query's batch B", q.B, v.B);
  if (k.D !== q.D) throw mismatch('key', k, "query's head size E", q.D, k.D);
  if (v.H !== k.H) throw mismatch('value', v, "key's head count Hkv", k.H, v.H);
  if (v.L !== k.L) throw mismatch('value', v, "key's length Lk", k.L, v.L);
  if (q.H % k.H !== 0) {
    throw new RangeError(
      `${fn}: query heads Hq = ${q.H} must be a multiple of key/value heads Hkv = ${k.H} (grouped-query attention)`);
  }
  checkHeadDim(fn, "the head size E (query.dims' last axis)", q.D);
  checkHeadDim(fn, "the value size Ev (value.dims' last axis)", v.D);
  checkCounts(fn, q.L, k.L);
  const plan: SdpaPlan = {
    ...planOptions(fn, layout, q, { kvHeads: k.H, kvLen: k.L, valueDim: v.D, k: k.strides, v: v.strides },
      o, { causal: false, causalOffset: 0 }),
    keyData: k.data, valueData: v.data,
  };
  return { plan, q, k, v };
}

/** The stored positions of a KV cache, as the K/V of an attention problem. */
export interface CacheOperands {
  batch: number;
  kvHeads: number;
  length: number;
  headDim: number;
  valueDim: number;
  k: Strides;
  v: Strides;
}

/**
 * KVCache.attend(query, options): K/V are the cache's `length` positions. isCausal defaults
 * to true with causalOffset = length − Lq (the new tokens' bottom-right alignment).
 */
export function planAttend(query: unknown, cache: CacheOperands, options: unknown): Plan {
  const fn = 'KVCache.attend';
  const { o, layout, q } = checkAttendQuery(query, cache, options);
  checkCounts(fn, q.L, cache.length);
  const p = planOptions(fn, layout, q,
    { kvHeads: cache.kvHeads, kvLen: cache.length, valueDim: cache.valueDim, k: cache.k, v: cache.v },
    o, { causal: true, causalOffset: cache.length - q.L });
  checkArraysKept(fn, planArrays(p));
  return p;
}

/**
 * The checks of KVCache.attend(query, options) that hold whatever the cache's length: the option
 * names, the layout, the query against the cache's B, Hkv and E. planAttend runs them first; a
 * worker's call runs them (and checkOut) before it moves the query's buffer.
 */
export function checkAttendQuery(query: unknown, cache: Pick<CacheOperands, 'batch' | 'kvHeads' | 'headDim' | 'valueDim'>,
  options: unknown): { o: SdpaOptions; layout: 'bhsd' | 'bshd'; q: Operand } {
  const fn = 'KVCache.attend';
  const o = checkOptionNames(fn, options, OPTION_NAMES) as SdpaOptions;
  const layout = checkLayout(fn, o.layout);
  const q = checkTensor(fn, 'query', query, layout);
  if (q.B !== cache.batch) throw dimsMismatch(fn, layout, 'query', q, "the cache's batch B", cache.batch, q.B);
  if (q.D !== cache.headDim) throw dimsMismatch(fn, layout, 'query', q, "the cache's head size E", cache.headDim, q.D);
  if (q.H % cache.kvHeads !== 0) {
    throw new RangeError(
      `${fn}: query heads Hq = ${q.H} must be a multiple of the cache's heads Hkv = ${cache.kvHeads} (grouped-query attention)`);
  }
  return { o, layout, q };
}

/**
 * Where a result of `size` floats is written: the call's own view of the array's first `size`
 * floats, and what the call returns (the caller's array when it is exactly the result, else
 * that view).
 */
export interface OutTarget {
  view: Float32Array;
  result: Float32Array;
  /** The result's floats (the view's length when it was made). */
  size: number;
}

/**
 * A result written into its OutTarget, or with `accumulate` added to what it holds (each sum
 * rounded to float32 once: the float32 sum); returns what the call returns.
 */
export function writeOut(target: OutTarget, values: Float32Array, accumulate: boolean): Float32Array {
  const { view } = target;
  if (!accumulate) {
    view.set(values);
  } else {
    for (let n = 0; n < values.length; n++) view[n] += values[n];
  }
  return target.result;
}

/** An `out` array (`name` in messages) for `what`, a result of `dims`: a Float32Array of at least its size. */
function checkOutArray(fn: string, name: string, what: string, given: unknown, dims: readonly number[],
  size: number): OutTarget {
  if (!isFloat32Array(given)) throw new TypeError(`${fn}: ${name} must be a Float32Array, got ${describe(given)}`);
  const length = lengthOf(given);
  if (length < size) {
    if (length === 0 && detachedOrEmpty(given)) {
      throw new RangeError(detachedMessage(fn, name, `${what} [${dims.join(', ')}] needs ${size} floats`));
    }
    throw new RangeError(`${fn}: ${name} is too small: ${what} [${dims.join(', ')}] needs ${size} floats, got ${length}`);
  }
  const view = ownView(given, size);
  return { view, result: length === size ? given : view, size };
}

/**
 * options.out for the output of query `q` and value size Ev ([..., Lq, Ev], the query's rank).
 * Nulls without out.
 */
export function checkOut(fn: string, given: unknown, q: Operand, Ev: number): Pick<Plan, 'outputDims' | 'outputSize' | 'out' | 'outResult'> {
  const outputDims = [...q.dims.slice(0, -1), Ev];
  const outputSize = q.B * q.H * q.L * Ev;
  if (given === undefined) return { outputDims, outputSize, out: null, outResult: null };
  const { view, result } = checkOutArray(fn, 'options.out', 'the output', given, outputDims, outputSize);
  return { outputDims, outputSize, out: view, outResult: result };
}

interface KeyValueShape {
  kvHeads: number;
  kvLen: number;
  valueDim: number;
  k: Strides;
  v: Strides;
}

export function planOptions(fn: string, layout: 'bhsd' | 'bshd', q: Operand, kv: KeyValueShape, o: SdpaOptions,
  defaults: { causal: boolean; causalOffset: number }): Plan {
  const B = q.B, Hq = q.H, Hkv = kv.kvHeads, Lq = q.L, Lk = kv.kvLen, E = q.D, Ev = kv.valueDim;

  let scale = 1 / Math.sqrt(E);
  if (o.scale !== undefined) {
    if (typeof o.scale !== 'number') throw new TypeError(`${fn}: options.scale must be a number, got ${describe(o.scale)}`);
    // The kernel computes in float32: a finite number beyond its range would be Infinity there.
    if (!Number.isFinite(Math.fround(o.scale))) {
      throw new RangeError(`${fn}: options.scale must be a finite number within float32's range ` +
        `(|scale| <= ${FLOAT32_MAX}), got ${o.scale}`);
    }
    scale = o.scale;
  }
  let softcap = 0;
  if (o.softcap !== undefined) {
    if (typeof o.softcap !== 'number') throw new TypeError(`${fn}: options.softcap must be a number, got ${describe(o.softcap)}`);
    // In float32 (the kernel's type) too: a softcap below float32's least positive number
    // would be 0 there, which means "off", and one beyond its range Infinity.
    const asFloat32 = Math.fround(o.softcap);
    if (!(asFloat32 > 0) || !Number.isFinite(asFloat32)) {
      throw new RangeError(`${fn}: options.softcap must be a number > 0 within float32's range ` +
        `(${FLOAT32_MIN_POSITIVE} to ${FLOAT32_MAX}; omit it to turn softcap off), got ${o.softcap}`);
    }
    softcap = o.softcap;
  }

  const mask = o.attnMask === undefined ? null : checkMask(fn, o.attnMask, [B, Hq, Lq, Lk]);

  const causal = checkBoolean(fn, 'options.isCausal', o.isCausal, defaults.causal);
  const alibi = checkAlibiSlopes(fn, o.alibiSlopes, Hq, { count: B, name: 'batch', symbol: 'B' });
  // The diagonal i + offset: the causal frontier, and where ALiBi's distances are measured from
  // (with or without isCausal).
  const diagonal = causal || alibi.slopes !== null;
  let causalOffset = diagonal ? defaults.causalOffset : 0;
  let causalOffsets: Int32Array | null = null;
  if (o.causalOffset !== undefined) {
    if (!diagonal) {
      const given = o.isCausal === undefined ? `undefined (default ${defaults.causal})` : describe(o.isCausal);
      throw new TypeError(`${fn}: options.causalOffset is only meaningful with options.isCausal: true or ` +
        `options.alibiSlopes, got options.isCausal ${given}`);
    }
    if (typeof o.causalOffset === 'number') {
      if (!Number.isInteger(o.causalOffset)) {
        throw new RangeError(`${fn}: options.causalOffset must be an integer, got ${o.causalOffset}`);
      }
      if (alibi.slopes !== null) checkAlibiOffset(fn, o.causalOffset);
      causalOffset = o.causalOffset;
    } else if (isInt32Array(o.causalOffset)) {
      const length = lengthOf(o.causalOffset);
      refuseDetached(fn, 'options.causalOffset', o.causalOffset, length, `it must hold one offset per batch (B = ${B})`);
      if (length !== B) {
        throw new RangeError(`${fn}: options.causalOffset must have one offset per batch (length B = ${B}), got length ${length}`);
      }
      // A copy of the elements themselves: new Int32Array(view) reads no property or iterator of
      // the object.
      causalOffsets = new Int32Array(o.causalOffset);
    } else {
      throw new TypeError(`${fn}: options.causalOffset must be an integer or an Int32Array of length B = ${B}, got ${describe(o.causalOffset)}`);
    }
  }
  const slidingWindow = checkSlidingWindow(fn, o, causal, defaults.causal);
  // Offsets beyond [-Lq, Lk] act exactly like those bounds (nothing / everything visible), and
  // with a window W beyond [-Lq, Lk + W - 1] (the window starts past every key), so they are
  // clamped to keep the kernel in 32-bit integers. Not with ALiBi, whose biases (and so each
  // row's log-sum-exp) depend on the offset itself: it is then an int32 as given.
  const clamp = (x: number) => Math.min(Math.max(x, -Lq), Lk + Math.max(slidingWindow - 1, 0));
  if (alibi.slopes === null) {
    causalOffset = causal ? clamp(causalOffset) : 0;
    if (causalOffsets !== null) causalOffsets = causalOffsets.map(clamp);
  }

  const keyLengths = checkKeyBounds(fn, 'keyLengths', o.keyLengths, B, Lk);
  const keyStarts = checkKeyBounds(fn, 'keyStarts', o.keyStarts, B, Lk);
  const sinks = checkSinks(fn, o.sinks, Hq);
  const dropout = checkDropout(fn, o);

  const returnWeights = checkBoolean(fn, 'options.returnWeights', o.returnWeights, false);
  const returnLogSumExp = checkBoolean(fn, 'options.returnLogSumExp', o.returnLogSumExp, false);

  // The output keeps the query's rank; its last axis is Ev.
  const { outputDims, outputSize, out, outResult } = checkOut(fn, o.out, q, Ev);
  // Weights are always [..., Hq, Lq, Lk] with the query's leading axes.
  const leading = q.dims.length === 4 ? [B, Hq] : q.dims.length === 3 ? [Hq] : [];
  const weightsDims = returnWeights ? [...leading, Lq, Lk] : null;
  const lseDims = returnLogSumExp ? [...leading, Lq] : null;

  return {
    layout, fn, batch: B, qHeads: Hq, kvHeads: Hkv, qLen: Lq, kvLen: Lk, headDim: E, valueDim: Ev,
    q: q.strides, k: kv.k, v: kv.v, o: layoutStrides(layout, Hq, Lq, Ev),
    outputDims, outputSize,
    weightsDims, weightsSize: returnWeights ? B * Hq * Lq * Lk : 0,
    lseDims, lseSize: returnLogSumExp ? B * Hq * Lq : 0,
    scale, softcap, mask, causal, causalOffset, causalOffsets, slidingWindow, keyLengths, keyStarts, sinks,
    alibiSlopes: alibi.slopes, alibiStrideB: alibi.strideB, ...dropout, out, outResult,
    queryData: q.data,
  };
}

/**
 * options.keyLengths or options.keyStarts (`name`): an Int32Array of one key index per batch,
 * each in [0, Lk]; a checked copy of its elements, or null when not given. The copy holds the
 * elements themselves: a getter read later (sdpaBackward's gradOutput, saved) cannot change it,
 * nor a property or iterator of the object stand in.
 */
function checkKeyBounds(fn: string, name: 'keyLengths' | 'keyStarts', given: unknown, B: number, Lk: number): Int32Array | null {
  if (given === undefined) return null;
  if (!isInt32Array(given)) {
    throw new TypeError(`${fn}: options.${name} must be an Int32Array of length B = ${B}, got ${describe(given)}`);
  }
  const length = lengthOf(given);
  refuseDetached(fn, `options.${name}`, given, length, `it must hold one key index per batch (B = ${B})`);
  if (length !== B) throw new RangeError(`${fn}: options.${name} must have length B = ${B}, got ${length}`);
  const bounds = new Int32Array(given);
  bounds.forEach((n, b) => {
    if (n < 0 || n > Lk) throw new RangeError(`${fn}: options.${name}[${b}] must be in [0, Lk = ${Lk}], got ${n}`);
  });
  return bounds;
}

/**
 * options.sinks: a Float32Array of one sink logit per query head (gpt-oss), each finite or
 * -Infinity (that head has none); a checked copy of its elements, or null when not given.
 */
function checkSinks(fn: string, given: unknown, Hq: number): Float32Array | null {
  if (given === undefined) return null;
  if (!isFloat32Array(given)) {
    throw new TypeError(`${fn}: options.sinks must be a Float32Array of length Hq = ${Hq} (one sink logit per query head), ` +
      `got ${describe(given)}`);
  }
  const length = lengthOf(given);
  refuseDetached(fn, 'options.sinks', given, length, `it must hold one sink logit per query head (Hq = ${Hq})`);
  if (length !== Hq) throw new RangeError(`${fn}: options.sinks must have length Hq = ${Hq}, got ${length}`);
  const sinks = new Float32Array(given);
  sinks.forEach((x, h) => {
    if (Number.isNaN(x) || x === Infinity) {
      throw new RangeError(`${fn}: options.sinks[${h}] must be a finite number, or -Infinity for no sink, got ${x}`);
    }
  });
  return sinks;
}

const INT32_MIN = -(2 ** 31), INT32_MAX = 2 ** 31 - 1;

/** An integer options.causalOffset with ALiBi, which takes it as given (not clamped): within int32. */
export function checkAlibiOffset(fn: string, offset: number): void {
  if (offset < INT32_MIN || offset > INT32_MAX) {
    throw new RangeError(`${fn}: options.causalOffset must be an integer in [-2^31, 2^31 - 1] with ` +
      `options.alibiSlopes (ALiBi's distances are measured from it), got ${offset}`);
  }
}
/** The largest ALiBi slope taken (src/sdpa.h, kMaxAlibiSlope): every bias -slope·distance stays finite. */
const MAX_ALIBI_SLOPE = 2 ** 64;

/**
 * options.alibiSlopes: a Float32Array of one ALiBi slope per query head ([Hq], every batch) or
 * per batch and query head ([B, Hq]; sdpaVarlen: per sequence, `rows` { count: S, name:
 * 'sequence', symbol: 'S' }), each in [0, 2^64]; a checked copy of its elements and the stride
 * between two batches' (sequences') slopes (0 or Hq), or null when not given.
 */
export function checkAlibiSlopes(fn: string, given: unknown, Hq: number,
  rows: { count: number; name: string; symbol: string }): { slopes: Float32Array | null; strideB: number } {
  if (given === undefined) return { slopes: null, strideB: 0 };
  const B = rows.count;
  const lengths = B === 1 ? `Hq = ${Hq}` : `Hq = ${Hq} or ${rows.symbol}·Hq = ${B * Hq}`;
  if (!isFloat32Array(given)) {
    throw new TypeError(`${fn}: options.alibiSlopes must be a Float32Array of length ${lengths} (one ALiBi slope per ` +
      `query head${B === 1 ? '' : `, or per ${rows.name} and query head`}), got ${describe(given)}`);
  }
  const length = lengthOf(given);
  refuseDetached(fn, 'options.alibiSlopes', given, length, `it must hold one ALiBi slope per query head (length ${lengths})`);
  if (length !== Hq && length !== B * Hq) {
    throw new RangeError(`${fn}: options.alibiSlopes must have length ${lengths}, got ${length}`);
  }
  const slopes = new Float32Array(given);
  slopes.forEach((x, n) => {
    if (!(x >= 0 && x <= MAX_ALIBI_SLOPE)) {
      throw new RangeError(`${fn}: options.alibiSlopes[${n}] must be a number in [0, 2^64] (the bias is ` +
        `-slope·|i + causalOffset - j|), got ${x}`);
    }
  });
  return { slopes, strideB: length === Hq ? 0 : Hq };
}

/**
 * options.dropoutP, a number in [0, 1), and options.dropoutSeed, an integer in [0, 2^32) that
 * dropoutP > 0 needs: the kernel's threshold, round(dropoutP·2^32) (at most 2^32 - 1; 0 is no
 * dropout), and the seed (0 without dropout, whatever was given, so that it changes nothing).
 */
export function checkDropout(fn: string, o: { dropoutP?: unknown; dropoutSeed?: unknown }):
  { dropoutThreshold: number; dropoutSeed: number } {
  const { dropoutP, dropoutSeed } = o;
  let threshold = 0;
  if (dropoutP !== undefined) {
    if (typeof dropoutP !== 'number') throw new TypeError(`${fn}: options.dropoutP must be a number, got ${describe(dropoutP)}`);
    if (!(dropoutP >= 0 && dropoutP < 1)) {
      throw new RangeError(`${fn}: options.dropoutP must be a number in [0, 1) (the probability of dropping each ` +
        `attention weight), got ${dropoutP}`);
    }
    threshold = Math.min(Math.round(dropoutP * 2 ** 32), 2 ** 32 - 1);
  }
  let seed = 0;
  if (dropoutSeed !== undefined) {
    if (typeof dropoutSeed !== 'number') {
      throw new TypeError(`${fn}: options.dropoutSeed must be an integer in [0, 2^32), got ${describe(dropoutSeed)}`);
    }
    if (!Number.isInteger(dropoutSeed) || dropoutSeed < 0 || dropoutSeed >= 2 ** 32) {
      throw new RangeError(`${fn}: options.dropoutSeed must be an integer in [0, 2^32), got ${dropoutSeed}`);
    }
    seed = dropoutSeed;
  } else if (threshold !== 0) {
    throw new TypeError(`${fn}: options.dropoutSeed is required with options.dropoutP > 0 (an integer in [0, 2^32); ` +
      `the backward draws the same mask from it), got undefined`);
  }
  return { dropoutThreshold: threshold, dropoutSeed: threshold === 0 ? 0 : seed };
}

/**
 * The most query rows (Lq) and keys (Lk) a call may have: 2^29, the kernel's kMaxCount (src/sdpa.h),
 * within which its 32-bit counters (a count rounded up to a tile, stepped past its end) cannot
 * overflow. Inputs in wasm memory stay below it anyway (2 GiB); a decode's keys and values read
 * where they are (streamed from the caller's arrays) need the check.
 */
const MAX_COUNT = 2 ** 29;

/**
 * Lq and Lk within MAX_COUNT, else a RangeError (sdpa, sdpaBackward, KVCache.attend: packed
 * sequences run a chunk of whole sequences at a time, each within wasm memory).
 */
function checkCounts(fn: string, Lq: number, Lk: number): void {
  for (const [count, what] of [[Lq, 'query rows (Lq)'], [Lk, 'keys (Lk)']] as const) {
    if (count > MAX_COUNT) {
      throw new RangeError(`${fn}: at most ${MAX_COUNT} (2^29) ${what} in a call, the kernel's counters being 32-bit, got ${count}`);
    }
  }
}

/** The widest sliding window taken: 2^30, twice the most keys a problem can have (MAX_COUNT). */
const MAX_SLIDING_WINDOW = 2 * MAX_COUNT;

/**
 * options.slidingWindow: an integer W in [1, MAX_SLIDING_WINDOW] with isCausal (each query row
 * attends the W keys ending at its causal diagonal), or 0 when not given.
 */
function checkSlidingWindow(fn: string, o: SdpaOptions, causal: boolean, defaultCausal: boolean): number {
  const given = o.slidingWindow;
  if (given === undefined) return 0;
  if (!causal) {
    const isCausal = o.isCausal === undefined ? `undefined (default ${defaultCausal})` : describe(o.isCausal);
    throw new TypeError(`${fn}: options.slidingWindow is only meaningful with options.isCausal: true ` +
      `(the window ends at each row's causal diagonal), got options.isCausal ${isCausal}`);
  }
  if (typeof given !== 'number') {
    throw new TypeError(`${fn}: options.slidingWindow must be an integer in [1, 2^30], got ${describe(given)}`);
  }
  if (!Number.isInteger(given) || given < 1 || given > MAX_SLIDING_WINDOW) {
    throw new RangeError(`${fn}: options.slidingWindow must be an integer in [1, 2^30] (the keys each query row may ` +
      `attend, ending at its causal diagonal; omit it for no window), got ${given}`);
  }
  return given;
}

/** The most threads createAttention() uses unless asked for more. */
export const DEFAULT_MAX_THREADS = 4;
/** The most threads createAttention() accepts. */
export const MAX_THREADS = 64;

/**
 * The gate of a public class that only its factory makes (createAttention(), attn.createKVCache(),
 * …): the factory constructs through make(), and the constructor calls check() first, which
 * throws a TypeError naming the factory when called any other way (`new Attention()` from
 * JavaScript, whose arguments would otherwise be read as undefined: "Cannot read properties of
 * undefined").
 */
export class FactoryGate {
  #open = false;

  constructor(readonly className: string, readonly factory: string) {}

  make<T>(construct: () => T): T {
    this.#open = true;
    try {
      return construct();
    } finally {
      this.#open = false;
    }
  }

  check(): void {
    if (!this.#open) throw new TypeError(`${this.className}: use ${this.factory} to make one (its constructor is internal)`);
  }
}

const ATTENTION_OPTION_NAMES = ['threads', 'relaxedSimd', 'maxMemoryBytes'] as const;

/**
 * The checks of createAttention(options) (and createAttentionWorker's, which also takes
 * `alsoKnown`: its `signal`, checked by the caller), messages naming `fn`. The values of
 * createAttention's options, read by property access (inherited ones count).
 */
export function checkAttentionOptions(fn: string, options: unknown, alsoKnown: readonly string[] = []): AttentionOptions {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw new TypeError(`${fn}: options must be an object, got ${String(options)}`);
  }
  const known: readonly string[] = [...ATTENTION_OPTION_NAMES, ...alsoKnown];
  for (const name of Object.keys(options)) {
    if (!known.includes(name) && (options as Record<string, unknown>)[name] !== undefined) {
      throw new TypeError(`${fn}: unknown option "${name}"; known options: ${known.join(', ')}`);
    }
  }
  const { threads, relaxedSimd, maxMemoryBytes } = options as AttentionOptions;
  if (threads !== undefined) {
    if (typeof threads !== 'number') {
      throw new TypeError(`${fn}: options.threads must be a number, got ${describe(threads)}`);
    }
    if (!Number.isInteger(threads) || threads < 1 || threads > MAX_THREADS) {
      throw new RangeError(`${fn}: options.threads must be an integer in [1, ${MAX_THREADS}], got ${threads}`);
    }
  }
  if (relaxedSimd !== undefined && typeof relaxedSimd !== 'boolean') {
    throw new TypeError(`${fn}: options.relaxedSimd must be a boolean, got ${describe(relaxedSimd)}`);
  }
  if (maxMemoryBytes !== undefined) {
    if (typeof maxMemoryBytes !== 'number') {
      throw new TypeError(`${fn}: options.maxMemoryBytes must be a number, got ${describe(maxMemoryBytes)}`);
    }
    if (!Number.isInteger(maxMemoryBytes) || maxMemoryBytes < 1 || maxMemoryBytes > MAX_WASM_BYTES) {
      throw new RangeError(
        `${fn}: options.maxMemoryBytes must be an integer in [1, ${MAX_WASM_BYTES}] (the wasm memory limit, 2 GiB), ` +
        `got ${maxMemoryBytes}`);
    }
  }
  return { threads, relaxedSimd, maxMemoryBytes };
}
