// Turns the user's tensors and options into a checked Plan: logical shapes [B, H, L, E],
// element strides, and the flags the wasm kernel needs. Every rejection is a TypeError
// (wrong kind of value) or a RangeError (right kind, wrong value) whose message names the
// argument, what was expected and what was given.
import type { MaskTensor, SdpaOptions, Tensor } from './types.js';

const OPTION_NAMES = new Set([
  'scale', 'softcap', 'attnMask', 'isCausal', 'causalOffset', 'keyLengths',
  'returnWeights', 'out', 'layout',
]);

/** Elements strides of a [B, H, L, D] view; D is contiguous. */
export interface Strides {
  b: number;
  h: number;
  l: number;
}

export interface Plan {
  layout: 'bhsd' | 'bshd';
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
  scale: number;
  softcap: number;
  mask: null | {
    kind: 'float' | 'bool';
    data: Float32Array | Uint8Array;
    strides: [number, number, number, number];  // over [B, Hq, Lq, Lk], 0 = broadcast
  };
  causal: boolean;
  causalOffset: number;
  causalOffsets: Int32Array | null;
  keyLengths: Int32Array | null;
  out: Float32Array | null;
}

const tag = (x: unknown) => Object.prototype.toString.call(x).slice(8, -1);

function describe(x: unknown): string {
  if (x === null) return 'null';
  if (Array.isArray(x)) return `Array(${x.length})`;
  if (ArrayBuffer.isView(x)) return `${tag(x)}(${(x as { length?: number }).length ?? ''})`;
  if (typeof x === 'object') return tag(x) === 'Object' ? 'an object' : tag(x);
  if (typeof x === 'string') return JSON.stringify(x);
  return String(x);
}

// Tag-based checks work across realms (iframes, Jest's vm contexts), unlike instanceof.
const isFloat32Array = (x: unknown): x is Float32Array => tag(x) === 'Float32Array';
const isUint8Array = (x: unknown): x is Uint8Array => tag(x) === 'Uint8Array';
const isInt32Array = (x: unknown): x is Int32Array => tag(x) === 'Int32Array';

function checkDims(name: string, dims: unknown, minRank: number, maxRank: number): number[] {
  if (!Array.isArray(dims)) {
    throw new TypeError(`sdpa: ${name}.dims must be an array of positive integers, got ${describe(dims)}`);
  }
  if (dims.length < minRank || dims.length > maxRank) {
    throw new RangeError(
      `sdpa: ${name}.dims must have rank ${minRank}..${maxRank}, got [${dims.join(', ')}] (rank ${dims.length})`);
  }
  dims.forEach((d, axis) => {
    if (typeof d !== 'number') {
      throw new TypeError(`sdpa: ${name}.dims[${axis}] must be a number, got ${describe(d)} in [${dims.join(', ')}]`);
    }
    if (!Number.isInteger(d) || d < 1 || d > 0x7fffffff) {
      throw new RangeError(
        `sdpa: ${name}.dims[${axis}] must be a positive integer, got ${describe(d)} in [${dims.join(', ')}]`);
    }
  });
  return dims as number[];
}

function checkSize(name: string, dims: number[], length: number): void {
  const size = dims.reduce((a, b) => a * b, 1);
  if (size !== length) {
    throw new RangeError(
      `sdpa: ${name}.data.length must equal the product of ${name}.dims [${dims.join(', ')}] = ${size}, got ${length}`);
  }
}

/** A float tensor of rank 2..4, read as [B, H, L, D] in the given layout. */
function checkTensor(name: string, t: unknown, layout: 'bhsd' | 'bshd') {
  if (t === null || typeof t !== 'object') {
    throw new TypeError(`sdpa: ${name} must be a tensor { data: Float32Array, dims: number[] }, got ${describe(t)}`);
  }
  const { data, dims } = t as Partial<Tensor>;
  if (!isFloat32Array(data)) {
    throw new TypeError(`sdpa: ${name}.data must be a Float32Array, got ${describe(data)}`);
  }
  const d = checkDims(name, dims, 2, 4);
  checkSize(name, d, data.length);
  // Missing leading axes are 1: rank 3 is [H, L, E] ([L, H, E] for bshd), rank 2 is [L, E].
  const full = [...Array(4 - d.length).fill(1), ...d];
  const [B, second, third, D] = full;
  const [H, L] = layout === 'bhsd' ? [second, third] : [third, second];
  const strides: Strides = layout === 'bhsd'
    ? { b: H * L * D, h: L * D, l: D }
    : { b: L * H * D, h: D, l: H * D };
  return { data, dims: d, B, H, L, D, strides };
}

function checkMask(mask: unknown, target: [number, number, number, number]): Plan['mask'] {
  if (mask === null || typeof mask !== 'object') {
    throw new TypeError(`sdpa: options.attnMask must be a tensor { data: Float32Array | Uint8Array, dims }, got ${describe(mask)}`);
  }
  const { data, dims } = mask as Partial<MaskTensor>;
  let kind: 'float' | 'bool';
  if (isFloat32Array(data)) kind = 'float';
  else if (isUint8Array(data)) kind = 'bool';
  else {
    throw new TypeError(
      `sdpa: options.attnMask.data must be a Float32Array (additive) or Uint8Array (boolean), got ${describe(data)}`);
  }
  const d = checkDims('options.attnMask', dims, 1, 4);
  checkSize('options.attnMask', d, data.length);
  const names = ['B', 'Hq', 'Lq', 'Lk'];
  const strides: [number, number, number, number] = [0, 0, 0, 0];
  let stride = 1;
  for (let axis = 3; axis >= 0; axis--) {
    const m = axis - (4 - d.length);
    const size = m >= 0 ? d[m] : 1;
    if (size !== 1 && size !== target[axis]) {
      throw new RangeError(
        `sdpa: options.attnMask.dims [${d.join(', ')}] cannot broadcast to [B, Hq, Lq, Lk] = [${target.join(', ')}]: ` +
        `axis ${names[axis]} must be 1 or ${target[axis]}, got ${size}`);
    }
    strides[axis] = size === 1 ? 0 : stride;
    stride *= size;
  }
  return { kind, data, strides };
}

function checkBoolean(name: string, x: unknown): boolean {
  if (x === undefined) return false;
  if (typeof x !== 'boolean') throw new TypeError(`sdpa: ${name} must be a boolean, got ${describe(x)}`);
  return x;
}

export function plan(query: unknown, key: unknown, value: unknown, options: unknown): Plan {
  if (options === undefined) options = {};
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw new TypeError(`sdpa: options must be an object, got ${describe(options)}`);
  }
  const opts = options as Record<string, unknown>;
  for (const name of Object.keys(opts)) {
    if (!OPTION_NAMES.has(name)) {
      throw new TypeError(`sdpa: unknown option "${name}"; known options: ${[...OPTION_NAMES].join(', ')}`);
    }
  }
  const o = opts as SdpaOptions;

  const layout = o.layout === undefined ? 'bhsd' : o.layout;
  if (layout !== 'bhsd' && layout !== 'bshd') {
    throw new RangeError(`sdpa: options.layout must be 'bhsd' or 'bshd', got ${describe(layout)}`);
  }
  const q = checkTensor('query', query, layout);
  const k = checkTensor('key', key, layout);
  const v = checkTensor('value', value, layout);

  const axisName = layout === 'bhsd' ? '[B, H, L, E]' : '[B, L, H, E]';
  const mismatch = (what: string, expected: number, got: number, t: { dims: number[] }, name: string) =>
    new RangeError(
      `sdpa: ${name}.dims [${t.dims.join(', ')}] (${axisName}) must have ${what} = ${expected}, got ${got}`);
  if (k.B !== q.B) throw mismatch("query's batch B", q.B, k.B, k, 'key');
  if (v.B !== q.B) throw mismatch("query's batch B", q.B, v.B, v, 'value');
  if (k.D !== q.D) throw mismatch("query's head size E", q.D, k.D, k, 'key');
  if (v.H !== k.H) throw mismatch("key's head count Hkv", k.H, v.H, v, 'value');
  if (v.L !== k.L) throw mismatch("key's length Lk", k.L, v.L, v, 'value');
  if (q.H % k.H !== 0) {
    throw new RangeError(
      `sdpa: query heads Hq = ${q.H} must be a multiple of key/value heads Hkv = ${k.H} (grouped-query attention)`);
  }

  const B = q.B, Hq = q.H, Hkv = k.H, Lq = q.L, Lk = k.L, E = q.D, Ev = v.D;

  let scale = 1 / Math.sqrt(E);
  if (o.scale !== undefined) {
    if (typeof o.scale !== 'number') throw new TypeError(`sdpa: options.scale must be a number, got ${describe(o.scale)}`);
    if (!Number.isFinite(o.scale)) throw new RangeError(`sdpa: options.scale must be a finite number, got ${o.scale}`);
    scale = o.scale;
  }
  let softcap = 0;
  if (o.softcap !== undefined) {
    if (typeof o.softcap !== 'number') throw new TypeError(`sdpa: options.softcap must be a number, got ${describe(o.softcap)}`);
    if (!(o.softcap > 0) || !Number.isFinite(o.softcap)) {
      throw new RangeError(`sdpa: options.softcap must be a finite number > 0 (omit it to turn softcap off), got ${o.softcap}`);
    }
    softcap = o.softcap;
  }

  const mask = o.attnMask === undefined ? null : checkMask(o.attnMask, [B, Hq, Lq, Lk]);

  const causal = checkBoolean('options.isCausal', o.isCausal);
  let causalOffset = 0;
  let causalOffsets: Int32Array | null = null;
  if (o.causalOffset !== undefined) {
    if (!causal) throw new TypeError('sdpa: options.causalOffset is only meaningful with options.isCausal: true');
    // Offsets beyond [-Lq, Lk] act exactly like those bounds (nothing / everything visible),
    // so they are clamped to keep the kernel in 32-bit integers.
    const clamp = (x: number) => Math.min(Math.max(x, -Lq), Lk);
    if (typeof o.causalOffset === 'number') {
      if (!Number.isInteger(o.causalOffset)) {
        throw new RangeError(`sdpa: options.causalOffset must be an integer, got ${o.causalOffset}`);
      }
      causalOffset = clamp(o.causalOffset);
    } else if (isInt32Array(o.causalOffset)) {
      if (o.causalOffset.length !== B) {
        throw new RangeError(`sdpa: options.causalOffset must have one offset per batch (length B = ${B}), got length ${o.causalOffset.length}`);
      }
      causalOffsets = Int32Array.from(o.causalOffset, clamp);
    } else {
      throw new TypeError(`sdpa: options.causalOffset must be an integer or an Int32Array of length B = ${B}, got ${describe(o.causalOffset)}`);
    }
  }

  let keyLengths: Int32Array | null = null;
  if (o.keyLengths !== undefined) {
    if (!isInt32Array(o.keyLengths)) {
      throw new TypeError(`sdpa: options.keyLengths must be an Int32Array of length B = ${B}, got ${describe(o.keyLengths)}`);
    }
    if (o.keyLengths.length !== B) {
      throw new RangeError(`sdpa: options.keyLengths must have length B = ${B}, got ${o.keyLengths.length}`);
    }
    o.keyLengths.forEach((n, b) => {
      if (n < 0 || n > Lk) throw new RangeError(`sdpa: options.keyLengths[${b}] must be in [0, Lk = ${Lk}], got ${n}`);
    });
    keyLengths = o.keyLengths;
  }

  const returnWeights = checkBoolean('options.returnWeights', o.returnWeights);

  // The output keeps the query's rank; its last axis is Ev.
  const outputDims = [...q.dims.slice(0, -1), Ev];
  const outputSize = B * Hq * Lq * Ev;
  let out: Float32Array | null = null;
  if (o.out !== undefined) {
    if (!isFloat32Array(o.out)) throw new TypeError(`sdpa: options.out must be a Float32Array, got ${describe(o.out)}`);
    if (o.out.length < outputSize) {
      throw new RangeError(`sdpa: options.out is too small: the output [${outputDims.join(', ')}] needs ${outputSize} floats, got ${o.out.length}`);
    }
    out = o.out;
  }
  const outStrides: Strides = layout === 'bhsd'
    ? { b: Hq * Lq * Ev, h: Lq * Ev, l: Ev }
    : { b: Lq * Hq * Ev, h: Ev, l: Hq * Ev };
  // Weights are always [..., Hq, Lq, Lk] with the query's leading axes.
  const leading = q.dims.length === 4 ? [B, Hq] : q.dims.length === 3 ? [Hq] : [];
  const weightsDims = returnWeights ? [...leading, Lq, Lk] : null;

  return {
    layout, batch: B, qHeads: Hq, kvHeads: Hkv, qLen: Lq, kvLen: Lk, headDim: E, valueDim: Ev,
    q: q.strides, k: k.strides, v: v.strides, o: outStrides,
    outputDims, outputSize,
    weightsDims, weightsSize: returnWeights ? B * Hq * Lq * Lk : 0,
    scale, softcap, mask, causal, causalOffset, causalOffsets, keyLengths, out,
  };
}
