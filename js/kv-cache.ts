// KVCache: keys and values kept in the instance's wasm memory between calls, for decoding one
// token at a time. A step appends the new positions' K/V (a few rows) and attends to all the
// stored ones in place: no copy of the history per step, so a step costs one read of the
// cache. Storage (src/kv-cache.h), allocated once at its full size:
//   keys   [B, Hkv, maxLength, E ]   float32, or 16 bits (half the bytes): IEEE float16 (dtype
//                                     'float16') or bfloat16 (dtype 'bfloat16', float32's range)
//   values [B, Hkv, maxLength, Ev]
// Positions [0, length) are stored; every batch has the same length (ragged batches pass
// keyLengths to attend()).
import { allocateLongLived, type Allocation, CallMemory, freeLongLived, heap, type HeapViews, type MemoryAccount } from './memory.js';
import { widenBFloat16, widenHalves } from './halves.js';
import { KV_TYPE, runResident } from './strategies.js';
import { detachedOrEmpty, isInt32Array, isUint16Array, lengthOf } from './typed-arrays.js';
import type { SdpaModule } from './wasm/sdpa.mjs';
import type { InputTensor, KVAppendOptions, KVCacheContents, KVCacheDType, KVCacheOptions, KVReadOptions, KVTensor, SdpaOptions, SdpaResult, SdpaResultWith } from './types.js';
import {
  checkArraysKept, checkHeadDim, checkLayout, checkOptionNames, checkTensor, describe, detachedMessage, dimsMismatch,
  FactoryGate, planAttend,
  type CacheOperands, type Operand,
} from './validate.js';

export type { KVCacheDType };

const CACHE_OPTION_NAMES = ['batch', 'kvHeads', 'headDim', 'valueDim', 'maxLength', 'dtype'] as const;
/** The options of append(): the tensors' layout. */
export const APPEND_OPTION_NAMES = ['layout'] as const;
/** The options of read(): the tensors' layout, and the element type to read (float32 widens a 16-bit cache's elements). */
export const READ_OPTION_NAMES = ['layout', 'dtype'] as const;
/** Each dtype's bytes per element and its storage's sdpa::KvType (a float16 cache's may be float16Finite at attend). */
const DTYPES: Record<KVCacheDType, { bytes: number; kvType: number }> = {
  float32: { bytes: 4, kvType: KV_TYPE.float32 },
  float16: { bytes: 2, kvType: KV_TYPE.float16 },
  bfloat16: { bytes: 2, kvType: KV_TYPE.bfloat16 },
};
const DTYPE_LIST = "'float32', 'float16' or 'bfloat16'";
/**
 * Appends are copied in through a staging buffer of at most this many bytes (rows at a time),
 * or of one position of every head when that alone is larger; where maxMemoryBytes leaves less
 * room, of half as many rows, a quarter, … down to one position (#stagingCap).
 */
const STAGING_BYTES = 2 ** 20;
/**
 * Appends already in the storage's type and order are copied straight into it, one run of
 * rows per (batch, head), when a run is at least this long; shorter runs (a decode step's one
 * token: 512 bytes per head at E128) go through the staging buffer, one copy per batch and one
 * wasm row copy, instead of a JavaScript call per head (32 heads at E128, float32: the whole append
 * took 35–37 µs, 10 µs staged, with the row copies out of memcpy: src/kv-cache.cc).
 */
const STRAIGHT_MIN_RUN_BYTES = 4096;

/** The cache's sizes, checked: what createKVCache() was given, with defaults filled in. */
export interface KVCacheShape {
  batch: number;
  kvHeads: number;
  headDim: number;
  valueDim: number;
  maxLength: number;
  dtype: KVCacheDType;
}

export function checkCacheOptions(options: unknown): KVCacheShape {
  const fn = 'createKVCache';
  if (options === undefined) throw new TypeError(`${fn}: options { batch, kvHeads, headDim, maxLength } are required`);
  const o = checkOptionNames(fn, options, CACHE_OPTION_NAMES) as Partial<KVCacheOptions>;
  const size = (name: keyof KVCacheOptions, fallback?: number): number => {
    const x = o[name];
    if (x === undefined && fallback !== undefined) return fallback;
    if (typeof x !== 'number') throw new TypeError(`${fn}: options.${name} must be a positive integer, got ${describe(x)}`);
    if (!Number.isInteger(x) || x < 1 || x > 0x7fffffff) {
      throw new RangeError(`${fn}: options.${name} must be a positive integer, got ${x}`);
    }
    return x;
  };
  const batch = size('batch'), kvHeads = size('kvHeads'), headDim = size('headDim');
  const valueDim = size('valueDim', headDim), maxLength = size('maxLength');
  checkHeadDim(fn, 'options.headDim', headDim);
  checkHeadDim(fn, 'options.valueDim', valueDim);
  const dtype = checkDType(fn, o.dtype, 'float32');
  return { batch, kvHeads, headDim, valueDim, maxLength, dtype };
}

/** An options.dtype of `fn`: 'float32', 'float16' or 'bfloat16', `otherwise` when left out. */
function checkDType(fn: string, given: unknown, otherwise: KVCacheDType): KVCacheDType {
  if (given === undefined) return otherwise;
  if (typeof given !== 'string') throw new TypeError(`${fn}: options.dtype must be ${DTYPE_LIST}, got ${describe(given)}`);
  if (!Object.hasOwn(DTYPES, given)) {
    throw new RangeError(`${fn}: options.dtype must be ${DTYPE_LIST}, got ${describe(given)}`);
  }
  return given as KVCacheDType;
}

/** Bytes of storage: keys and values. */
export function cacheBytes(s: KVCacheShape): { keys: number; values: number } {
  const rows = s.batch * s.kvHeads * s.maxLength * DTYPES[s.dtype].bytes;
  return { keys: rows * s.headDim, values: rows * s.valueDim };
}

/**
 * The checks of KVCache.append(key, value, options) against a cache of `shape` holding
 * `length` positions: the tensors, their sizes, room for Lnew more. Pure (no wasm), so the
 * worker API runs the same checks on the calling side.
 */
export function checkAppend(shape: KVCacheShape, length: number, key: unknown, value: unknown, options: unknown):
  { k: Operand<Float32Array | Uint16Array>; v: Operand<Float32Array | Uint16Array>; layout: 'bhsd' | 'bshd' } {
  const fn = 'KVCache.append';
  const { k, v, layout } = checkAppendShapes(shape, key, value, options);
  if (length + k.L > shape.maxLength) {
    throw new RangeError(`${fn}: appending ${k.L} positions to the ${length} stored would pass maxLength = ` +
      `${shape.maxLength}; nothing was appended`);
  }
  // After every getter of the arguments: the arrays still hold the elements their dims need.
  checkArraysKept(fn, [['key.data', k.data, k.B * k.H * k.L * k.D], ['value.data', v.data, v.B * v.H * v.L * v.D]]);
  return { k, v, layout };
}

/**
 * The checks of KVCache.append(key, value, options) that hold whatever the cache's length: the
 * option names, the layout, the tensors against the cache's shape and dtype. checkAppend runs them
 * first; a worker's call runs them before it moves the tensors' buffers.
 */
export function checkAppendShapes(shape: KVCacheShape, key: unknown, value: unknown, options: unknown):
  { k: Operand<Float32Array | Uint16Array>; v: Operand<Float32Array | Uint16Array>; layout: 'bhsd' | 'bshd' } {
  const fn = 'KVCache.append';
  const o = checkOptionNames(fn, options, APPEND_OPTION_NAMES);
  const layout = checkLayout(fn, o.layout);
  const k = checkTensor(fn, 'key', key, layout, 'cache');
  const v = checkTensor(fn, 'value', value, layout, 'cache');
  for (const [name, t] of [['key', k], ['value', v]] as const) {
    if (shape.dtype === 'float32' && isUint16Array(t.data) && !t.ieeeHalves) {
      throw new TypeError(`${fn}: ${name}.data must be a Float32Array or a Float16Array for a float32 cache (raw 16-bit elements in a ` +
        `Uint16Array only for dtype 'float16' or 'bfloat16'), got ${describe(t.data)}`);
    }
    if (t.B !== shape.batch) throw dimsMismatch(fn, layout, name, t, "the cache's batch B", shape.batch, t.B);
    if (t.H !== shape.kvHeads) throw dimsMismatch(fn, layout, name, t, "the cache's heads Hkv", shape.kvHeads, t.H);
  }
  if (k.D !== shape.headDim) throw dimsMismatch(fn, layout, 'key', k, "the cache's head size E", shape.headDim, k.D);
  if (v.D !== shape.valueDim) throw dimsMismatch(fn, layout, 'value', v, "the cache's value size Ev", shape.valueDim, v.D);
  if (v.L !== k.L) throw dimsMismatch(fn, layout, 'value', v, "key's new positions Lnew", k.L, v.L);
  return { k, v, layout };
}

/** The error of a call whose arguments' getters changed the cache (KVCache's and WorkerKVCache's). */
export const changedByGetter = (fn: string): Error =>
  new Error(`${fn}: the cache was changed while this call read its arguments (by a getter); nothing was done`);

/** The checks of KVCache.truncate(n) on a cache holding `length` positions. */
export function checkTruncate(length: number, n: unknown): asserts n is number {
  const fn = 'KVCache.truncate';
  if (typeof n !== 'number') throw new TypeError(`${fn}: n must be an integer, got ${describe(n)}`);
  if (!Number.isInteger(n) || n < 0 || n > length) {
    throw new RangeError(`${fn}: n must be an integer in [0, length = ${length}], got ${n}`);
  }
}

/**
 * The checks of KVCache.remove(start, end) on a cache holding `length` positions: integers with
 * 0 <= start <= end <= length. Returns the number of positions removed.
 */
export function checkRemove(length: number, start: unknown, end: unknown): number {
  return checkPositions('KVCache.remove', length, start, end);
}

/**
 * The checks of KVCache.read(start, end) on a cache holding `length` positions: as remove()'s,
 * start 0 and end `length` when left out. Returns [start, end].
 */
export function checkRead(length: number, start: unknown, end: unknown): [number, number] {
  const s = start === undefined ? 0 : start;
  const e = end === undefined ? length : end;
  checkPositions('KVCache.read', length, s, e);
  return [s as number, e as number];
}

/**
 * read()'s options.dtype on a cache of `dtype`: what the copy holds, the cache's own type when
 * left out; 'float32' from a 16-bit cache widens its elements (exactly). A cache gives no other
 * 16-bit type than its own (float32 and bfloat16 would have to be rounded).
 */
export function checkReadDType(dtype: KVCacheDType, given: unknown): KVCacheDType {
  const fn = 'KVCache.read';
  const wanted = checkDType(fn, given, dtype);
  if (wanted !== 'float32' && wanted !== dtype) {
    const choices = dtype === 'float32' ? "'float32'" : `'${dtype}' or 'float32'`;
    throw new RangeError(`${fn}: options.dtype '${wanted}' needs a ${wanted} cache; this one stores ${dtype} (read it as ${choices})`);
  }
  return wanted;
}

/** Positions [start, end) of `length` stored ones: integers, 0 <= start <= end <= length. Returns end - start. */
function checkPositions(fn: string, length: number, start: unknown, end: unknown): number {
  for (const [name, x] of [['start', start], ['end', end]] as const) {
    if (typeof x !== 'number') throw new TypeError(`${fn}: ${name} must be an integer, got ${describe(x)}`);
  }
  const [s, e] = [start as number, end as number];
  if (!Number.isInteger(s) || s < 0 || s > length) {
    throw new RangeError(`${fn}: start must be an integer in [0, length = ${length}], got ${s}`);
  }
  if (!Number.isInteger(e) || e < s || e > length) {
    throw new RangeError(`${fn}: end must be an integer in [start = ${s}, length = ${length}], got ${e}`);
  }
  return e - s;
}

/**
 * The checks of KVCache.reorder(indices) on a cache of `batch` batches: an Int32Array of
 * length B whose entries are batch indices in [0, B). Returns a copy (taken before any work).
 */
export function checkReorder(batch: number, indices: unknown): Int32Array {
  const fn = 'KVCache.reorder';
  if (!isInt32Array(indices)) {
    throw new TypeError(`${fn}: indices must be an Int32Array of length B = ${batch} (e.g. Int32Array.from(beams)), ` +
      `got ${describe(indices)}`);
  }
  if (lengthOf(indices) === 0 && detachedOrEmpty(indices)) {
    throw new RangeError(detachedMessage(fn, 'indices', `it must have length B = ${batch}`));
  }
  const idx = new Int32Array(indices);  // the typed array's elements, read once (no iterator)
  if (idx.length !== batch) throw new RangeError(`${fn}: indices must have length B = ${batch}, got ${idx.length}`);
  idx.forEach((i, b) => {
    if (i < 0 || i >= batch) throw new RangeError(`${fn}: indices[${b}] must be a batch index in [0, ${batch}), got ${i}`);
  });
  return idx;
}

/** A reorder step's end that is not a batch's rows but the one saved copy (reorderSteps). */
export const SAVED = -1;

/**
 * The copies that make batch d hold what batch indices[d] held, for every d at once, as
 * steps [from, to] (batch indices, or SAVED): a parallel assignment. A batch is overwritten
 * only once no pending step still reads it; where only cycles are left (each batch of a cycle
 * read by the next), one batch is saved first and its reader reads the copy, which frees the
 * cycle. Every batch outside a cycle is written before its cycle's saved copy is read, so one
 * saved copy at a time suffices. Batches that keep their rows (indices[d] = d) are not copied.
 */
export function reorderSteps(indices: Int32Array): Array<[number, number]> {
  const from = Array.from(indices);       // from[d]: where batch d's new rows are, SAVED once saved
  const pending = new Set<number>();
  const readers = new Array<number>(indices.length).fill(0);  // pending steps reading each batch
  indices.forEach((s, d) => {
    if (s !== d) pending.add(d), readers[s]++;
  });
  const steps: Array<[number, number]> = [];
  while (pending.size > 0) {
    let d = -1;
    for (const x of pending) if (readers[x] === 0) { d = x; break; }
    if (d < 0) {  // only cycles: save one of them, its one reader reads the copy
      d = pending.values().next().value as number;
      const reader = [...pending].find((x) => from[x] === d) as number;
      steps.push([d, SAVED]);
      from[reader] = SAVED;
      readers[d] = 0;
    }
    steps.push([from[d], d]);
    if (from[d] !== SAVED) readers[from[d]]--;
    pending.delete(d);
  }
  return steps;
}

/** The `length` stored positions of a cache of `shape`, as attend()'s K/V (element strides). */
export function cacheOperands(shape: KVCacheShape, length: number): CacheOperands {
  const E = shape.headDim, Ev = shape.valueDim, rows = shape.maxLength;
  return {
    batch: shape.batch, kvHeads: shape.kvHeads, length, headDim: E, valueDim: Ev,
    k: { b: shape.kvHeads * rows * E, h: rows * E, l: E },
    v: { b: shape.kvHeads * rows * Ev, h: rows * Ev, l: Ev },
  };
}

/**
 * The shape every KV cache object reports: KVCache here, WorkerKVCache in an AttentionWorker
 * (js/worker.ts). One place for these members and for the storage's size.
 */
export abstract class KVCacheShapeInfo {
  readonly batch: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly valueDim: number;
  readonly maxLength: number;
  readonly dtype: KVCacheDType;
  /** Bytes of wasm memory the storage takes (keys and values), allocated at creation. */
  readonly byteLength: number;

  protected constructor(shape: KVCacheShape) {
    if (new.target === KVCacheShapeInfo) {
      throw new TypeError('KVCacheShapeInfo: the base of KVCache and WorkerKVCache; use attn.createKVCache() or worker.createKVCache() to make a cache');
    }
    this.batch = shape.batch;
    this.kvHeads = shape.kvHeads;
    this.headDim = shape.headDim;
    this.valueDim = shape.valueDim;
    this.maxLength = shape.maxLength;
    this.dtype = shape.dtype;
    const bytes = cacheBytes(shape);
    this.byteLength = bytes.keys + bytes.values;
  }
}

const KV_CACHE_GATE = new FactoryGate('KVCache', 'attn.createKVCache(options)');

export class KVCache extends KVCacheShapeInfo {
  #module: SdpaModule | null;
  readonly #account: MemoryAccount;
  readonly #threads: number;
  // The one allocation holding keys and values, freed by dispose().
  readonly #storage: Allocation<{ keys: number; values: number }>;
  #length = 0;
  // Whether a float16 cache may hold an Inf or NaN half (exponent 31) among its positions:
  // until then the kernel widens with the cheaper conversion (KvType kFloat16Finite).
  #maybeInfNaN = false;
  // Counts the changes of the stored positions (append, truncate, reorder, reset, dispose). A
  // call reads its arguments first, and their getters run user code, which may use this very
  // cache: the call then checks nothing changed meanwhile (#unchangedSince).
  #version = 0;
  readonly #onDispose: (cache: KVCache) => void;

  /** @internal Use attn.createKVCache(). */
  static create(module: SdpaModule, account: MemoryAccount, threads: number, shape: KVCacheShape,
    onDispose: (cache: KVCache) => void): KVCache {
    return KV_CACHE_GATE.make(() => new KVCache(module, account, threads, shape, onDispose));
  }

  private constructor(module: SdpaModule, account: MemoryAccount, threads: number, shape: KVCacheShape,
    onDispose: (cache: KVCache) => void) {
    KV_CACHE_GATE.check();
    super(shape);
    const bytes = cacheBytes(shape);
    // Refused before allocating when it would pass the instance's limit or not fit beside
    // what is in use.
    this.#storage = allocateLongLived(module, account, 'createKVCache', { keys: bytes.keys, values: bytes.values });
    this.#module = module;
    this.#account = account;
    this.#threads = threads;
    this.#onDispose = onDispose;
  }

  /** Positions stored, the same for every batch: [0, maxLength]. */
  get length(): number {
    return this.#length;
  }

  /** Whether dispose() has been called (by the cache or its Attention instance). */
  get disposed(): boolean {
    return this.#module === null;
  }

  // Where the keys and values start (every use is behind #live(): never after dispose()).
  get #keys(): number {
    return this.#storage.addresses.keys;
  }

  get #values(): number {
    return this.#storage.addresses.values;
  }

  /** The keys' and the values' storage, each with the bytes of one position's row (E or Ev elements). */
  #planes(): { storage: number; rowBytes: number }[] {
    const eb = DTYPES[this.dtype].bytes;
    return [{ storage: this.#keys, rowBytes: this.headDim * eb }, { storage: this.#values, rowBytes: this.valueDim * eb }];
  }

  #live(fn: string): SdpaModule {
    if (this.#module === null) throw new Error(`${fn}: this KVCache has been disposed`);
    return this.#module;
  }

  /** #live(), and that the cache is as it was at `version`: after reading a call's arguments. */
  #unchangedSince(fn: string, version: number): SdpaModule {
    const module = this.#live(fn);
    if (this.#version !== version) throw changedByGetter(fn);
    return module;
  }

  /**
   * Stores the K/V of `Lnew` new positions after the `length` stored ones, for every batch:
   * `key` [B, Hkv, Lnew, E], `value` [B, Hkv, Lnew, Ev] (or [B, Lnew, Hkv, ·] with
   * `{ layout: 'bshd' }`), as Float32Array, as Float16Array (where the engine has one), or for a
   * 16-bit cache also Uint16Array of raw elements of its dtype (IEEE halves, bfloat16: stored as
   * they are). Float32 into a float16 cache rounds to nearest even; beyond ±65504 (and
   * ±Infinity) saturates to ±65504. Float32 into a bfloat16 cache rounds to nearest even; finite
   * values past ±3.3895e38 (the largest bfloat16) saturate to it; ±Infinity and NaN stay so. A
   * Float16Array's halves are stored as they are in a float16 cache, exactly in a float32 one,
   * and into a bfloat16 one round as the same values given as float32. Past maxLength:
   * RangeError, nothing appended. After any error the cache is unchanged.
   */
  append(key: KVTensor, value: KVTensor, options?: KVAppendOptions): void {
    const fn = 'KVCache.append';
    this.#live(fn);
    const version = this.#version;
    const { k, v, layout } = checkAppend(this, this.#length, key, value, options);
    const module = this.#unchangedSince(fn, version);
    const memory = new CallMemory(module, this.#account, fn);
    try {
      // One staging buffer serves both writes (requested before either, so a refusal leaves
      // the cache unchanged).
      const cap = this.#stagingCap(memory, k, v, layout);
      const { staging } = memory.allocate({ staging: this.#stagingBytes(k, v, layout, cap) });
      this.#write(module, memory, staging, cap, k, layout, this.#keys, this.headDim);
      this.#write(module, memory, staging, cap, v, layout, this.#values, this.valueDim);
    } finally {
      memory.free();
    }
    if (this.dtype === 'float16' && !this.#maybeInfNaN) {
      // What was stored decides: a NaN float became a NaN half (±Inf and overflow saturate to
      // ±65504), a raw half with exponent 31 stayed one. Scanned in wasm, SIMD, in the storage.
      this.#maybeInfNaN = this.#storedInfNaN(module, this.#keys, this.headDim, k.L) ||
        this.#storedInfNaN(module, this.#values, this.valueDim, k.L);
    }
    this.#length += k.L;
    this.#version++;
  }

  /** Whether positions [length, length + count) of a float16 storage hold an Inf or NaN half. */
  #storedInfNaN(module: SdpaModule, storage: number, dim: number, count: number): boolean {
    const first = storage + this.#length * dim * 2;
    return module.halvesHaveInfNaN(first, this.maxLength * dim, this.batch * this.kvHeads, count * dim);
  }

  // Rows [B, H, L, D] of `t` into the storage at positions [length, length + L). Already in
  // the storage's element type and [B, H, L, D] order, with runs of STRAIGHT_MIN_RUN_BYTES or
  // more: copied straight in, one run of rows per (batch, head). Otherwise through a staging
  // buffer of at most STAGING_BYTES (or one position), a run of rows of one batch at a time,
  // and the wasm side reorders and converts to 16 bits (copy_rows, src/kv-cache.h).
  #copiesStraight(t: Operand<Float32Array | Uint16Array>, layout: 'bhsd' | 'bshd'): boolean {
    return layout === 'bhsd' && this.#sourceType(t) === DTYPES[this.dtype].kvType &&
      t.L * t.D * t.data.BYTES_PER_ELEMENT >= STRAIGHT_MIN_RUN_BYTES;
  }

  /**
   * The sdpa::KvType of an append's data: a Float16Array's bits are halves; a Uint16Array holds
   * raw elements of the cache's own 16-bit dtype.
   */
  #sourceType(t: Operand<Float32Array | Uint16Array>): number {
    if (t.ieeeHalves) return KV_TYPE.float16;
    return isUint16Array(t.data) ? DTYPES[this.dtype].kvType : KV_TYPE.float32;
  }

  /** Rows of one batch staged at a time in at most `cap` bytes: at least one. */
  #stagingRows(t: Operand<Float32Array | Uint16Array>, cap: number): number {
    return Math.max(1, Math.min(t.L, Math.floor(cap / (t.H * t.D * t.data.BYTES_PER_ELEMENT))));
  }

  /** The staging bytes the writes of `k` and `v` need with rows staged in at most `cap` bytes (0: both copied straight in). */
  #stagingBytes(k: Operand<Float32Array | Uint16Array>, v: Operand<Float32Array | Uint16Array>, layout: 'bhsd' | 'bshd',
    cap: number): number {
    const bytes = (t: Operand<Float32Array | Uint16Array>) =>
      (this.#copiesStraight(t, layout) ? 0 : this.#stagingRows(t, cap) * t.H * t.D * t.data.BYTES_PER_ELEMENT);
    return Math.max(bytes(k), bytes(v));
  }

  /**
   * The staging buffer's byte cap: STAGING_BYTES where that fits the memory limit, else the
   * largest of its halvings that fits, else (where not even one position fits) the one
   * position's, whose request then throws the RangeError. A long append near maxMemoryBytes
   * runs in smaller chunks rather than being refused where one position at a time would fit.
   */
  #stagingCap(memory: CallMemory, k: Operand<Float32Array | Uint16Array>, v: Operand<Float32Array | Uint16Array>,
    layout: 'bhsd' | 'bshd'): number {
    const least = this.#stagingBytes(k, v, layout, 0);  // one position of each
    let cap = STAGING_BYTES;
    let bytes = this.#stagingBytes(k, v, layout, cap);
    while (bytes > least && !memory.fits({ staging: bytes })) {
      while (this.#stagingBytes(k, v, layout, cap) === bytes) cap /= 2;  // to the next smaller request
      bytes = this.#stagingBytes(k, v, layout, cap);
    }
    return cap;
  }

  #write(module: SdpaModule, memory: CallMemory, staging: number, cap: number, t: Operand<Float32Array | Uint16Array>,
    layout: 'bhsd' | 'bshd', storage: number, dim: number): void {
    const srcType = this.#sourceType(t);
    const srcBytes = t.data.BYTES_PER_ELEMENT;
    const dstBytes = DTYPES[this.dtype].bytes;
    const H = t.H, L = t.L, D = dim;
    const storageType = DTYPES[this.dtype].kvType;
    if (this.#copiesStraight(t, layout)) {
      const view = (isUint16Array(t.data) ? memory.heap.u16 : memory.heap.f32) as unknown as
        { set(a: ArrayLike<number>, at: number): void };
      for (let b = 0; b < this.batch; b++) {
        for (let h = 0; h < H; h++) {
          const from = b * t.strides.b + h * t.strides.h;
          const to = storage / dstBytes + ((b * this.kvHeads + h) * this.maxLength + this.#length) * D;
          view.set(t.data.subarray(from, from + L * D), to);
        }
      }
      return;
    }
    const rowsPerChunk = this.#stagingRows(t, cap);
    const heap = memory.heap;  // no allocation below
    // Typed as the source (the data's own type was checked above).
    const view = (isUint16Array(t.data) ? heap.u16 : heap.f32) as unknown as { set(a: ArrayLike<number>, at: number): void };
    const stagingAt = staging / srcBytes;
    for (let b = 0; b < this.batch; b++) {
      for (let l0 = 0; l0 < L; l0 += rowsPerChunk) {
        const n = Math.min(rowsPerChunk, L - l0);
        let stagedH: number, stagedL: number;
        if (layout === 'bshd') {  // [B, L, H, D]: a run of rows of one batch is contiguous
          const from = b * t.strides.b + l0 * t.strides.l;
          view.set(t.data.subarray(from, from + n * H * D), stagingAt);
          stagedH = D, stagedL = H * D;
        } else {
          if (n === L) {  // every row: the batch's [H, L, D] block is contiguous, one copy
            const from = b * t.strides.b;
            view.set(t.data.subarray(from, from + H * L * D), stagingAt);
          } else {
            for (let h = 0; h < H; h++) {
              const from = b * t.strides.b + h * t.strides.h + l0 * t.strides.l;
              view.set(t.data.subarray(from, from + n * D), stagingAt + h * n * D);
            }
          }
          stagedH = n * D, stagedL = D;
        }
        const dst = storage + ((b * this.kvHeads * this.maxLength) + this.#length + l0) * D * dstBytes;
        const status = module.copyRows(dst, storageType, 0, this.maxLength * D, D,
          staging, srcType, 0, stagedH, stagedL, 1, H, n, D);
        if (status !== 0) throw new Error(`KVCache.append: internal error: copy_rows failed (${module.statusName(status)})`);
      }
    }
  }

  /**
   * Attention of `query` [B, Hq, Lq, E] (Hq a multiple of Hkv; or [B, Lq, Hq, E] with layout
   * 'bshd') to the `length` stored positions, reading them in place. Takes every sdpa()
   * option, with K/V = the stored positions (Lk = length); `isCausal` defaults to true with
   * `causalOffset` = length − Lq (the last Lq positions are the query's own), both
   * overridable. With nothing stored every row is empty: exact zeros. Where the call's blocks
   * (query, output, weights, log-sum-exp, mask, scratch) would pass the memory limit beside the
   * caches, a slice of batches and KV heads at a time, then of one KV head's query heads or of
   * one query head's rows where that keeps the bits (the same bits).
   */
  attend(query: InputTensor, options: SdpaOptions & { returnWeights: true; returnLogSumExp: true }): SdpaResultWith<'weights' | 'logSumExp'>;
  attend(query: InputTensor, options: SdpaOptions & { returnWeights: true }): SdpaResultWith<'weights'>;
  attend(query: InputTensor, options: SdpaOptions & { returnLogSumExp: true }): SdpaResultWith<'logSumExp'>;
  attend(query: InputTensor, options?: SdpaOptions): SdpaResult;
  attend(query: InputTensor, options?: SdpaOptions): SdpaResult {
    const fn = 'KVCache.attend';
    this.#live(fn);
    const version = this.#version;
    const p = planAttend(query, cacheOperands(this, this.#length), options);
    const module = this.#unchangedSince(fn, version);
    if (p.kvLen === 0) {
      const output = p.out !== null ? p.out.fill(0) : new Float32Array(p.outputSize);
      const result: SdpaResult = { output: { data: p.outResult ?? output, dims: p.outputDims } };
      if (p.weightsDims !== null) result.weights = { data: new Float32Array(0), dims: p.weightsDims };
      if (p.lseDims !== null) {
        // [B, Hq, Lq]: every row attends nothing, so its log-sum-exp is its head's sink (-Infinity without).
        const lse = new Float32Array(p.lseSize).fill(-Infinity);
        const sinks = p.sinks;
        if (sinks !== null) lse.forEach((_, row) => { lse[row] = sinks[Math.floor(row / p.qLen) % p.qHeads]; });
        result.logSumExp = { data: lse, dims: p.lseDims };
      }
      return result;
    }
    const kvType = this.dtype !== 'float16' ? DTYPES[this.dtype].kvType : this.#maybeInfNaN ? KV_TYPE.float16 : KV_TYPE.float16Finite;
    return runResident(new CallMemory(module, this.#account, 'KVCache.attend'), this.#threads, p, p.queryData,
      { key: this.#keys, value: this.#values, kvType });
  }

  /** Keeps the first `n` positions (0 <= n <= length): e.g. rewinds a rejected draft. */
  truncate(n: number): void {
    this.#live('KVCache.truncate');
    checkTruncate(this.#length, n);
    this.#length = n === 0 ? 0 : n;  // -0, which passes the checks, as 0
    this.#version++;
    if (n === 0) this.#maybeInfNaN = false;
  }

  /**
   * Removes positions [start, end) of every batch (0 <= start <= end <= length): the positions
   * after them move down by end - start, in order, and `length` shrinks by as much. Drops the
   * oldest positions of a sliding-window layer (remove(0, n)), or those after a kept prefix
   * (remove(keep, keep + n)). The rows move inside wasm memory; no memory is allocated.
   */
  remove(start: number, end: number): void {
    const module = this.#live('KVCache.remove');
    const removed = checkRemove(this.#length, start, end);
    if (removed === 0) return;
    const u8 = heap(module).u8;
    this.#planes().forEach(({ storage, rowBytes }) => {
      // Each (batch, head)'s positions: storage [B, Hkv, maxLength, D].
      for (let bh = 0; bh < this.batch * this.kvHeads; bh++) {
        const first = storage + bh * this.maxLength * rowBytes;
        u8.copyWithin(first + start * rowBytes, first + end * rowBytes, first + this.#length * rowBytes);
      }
    });
    this.#length -= removed;
    this.#version++;
    if (this.#length === 0) this.#maybeInfNaN = false;
  }

  /**
   * Reorders the batches (beam search): afterwards batch b holds the `length` positions that
   * batch indices[b] held (indices: Int32Array of length B, entries in [0, B); repeats copy a
   * batch to several, a batch no entry names is dropped), as `index_select` on the batch
   * dimension. Rows are moved inside wasm memory, head by head, with one head's rows of one
   * batch as the only extra memory (a RangeError before anything moves if that does not fit).
   */
  reorder(indices: Int32Array): void {
    const fn = 'KVCache.reorder';
    const module = this.#live(fn);
    const idx = checkReorder(this.batch, indices);
    const steps = reorderSteps(idx);
    if (steps.length === 0 || this.#length === 0) return;
    this.#version++;
    const planes = this.#planes();
    const saves = steps.some(([, to]) => to === SAVED);
    const memory = new CallMemory(module, this.#account, fn);
    try {
      const { saved } = memory.allocate({ saved: saves ? this.#length * Math.max(...planes.map((p) => p.rowBytes)) : 0 });
      const u8 = memory.heap.u8;  // no allocation below
      planes.forEach(({ storage, rowBytes }) => {
        const bytes = this.#length * rowBytes;
        for (let h = 0; h < this.kvHeads; h++) {
          // Head h's first position of batch b: storage [B, Hkv, maxLength, D].
          const at = (b: number) => (b === SAVED ? saved : storage + ((b * this.kvHeads + h) * this.maxLength) * rowBytes);
          for (const [from, to] of steps) u8.copyWithin(at(to), at(from), at(from) + bytes);
        }
      });
    } finally {
      memory.free();
    }
  }

  /**
   * A copy of positions [start, end) of every batch (default: all `length` of them), as append()
   * takes them: key [B, Hkv, n, E] and value [B, Hkv, n, Ev] (or [B, n, Hkv, ·] with
   * { layout: 'bshd' }), n = end - start; Float32Array for a float32 cache, the stored raw 16-bit
   * elements (Uint16Array) for a float16 or bfloat16 one. Appended to a cache of the same dtype
   * they store the same bits: a saved prompt restored, a conversation forked into another cache.
   * { dtype: 'float32' } reads a 16-bit cache's elements widened to their exact float32 values
   * (NaN as NaN).
   */
  read(start: number | undefined, end: number | undefined, options: KVReadOptions & { dtype: 'float32' }): KVCacheContents<Float32Array>;
  read(start?: number, end?: number, options?: KVReadOptions): KVCacheContents;
  read(start?: number, end?: number, options?: KVReadOptions): KVCacheContents {
    const fn = 'KVCache.read';
    this.#live(fn);
    const version = this.#version;
    const o = checkOptionNames(fn, options, READ_OPTION_NAMES);
    const layout = checkLayout(fn, o.layout);
    const dtype = checkReadDType(this.dtype, o.dtype);
    const module = this.#unchangedSince(fn, version);  // the options' getters may have disposed or changed it
    const [s, e] = checkRead(this.#length, start, end);
    const views = heap(module);
    const [key, value] = this.#planes().map(({ storage }, plane) => {
      const copy = this.#copyOut(views, storage, plane === 0 ? this.headDim : this.valueDim, s, e, layout);
      if (dtype === this.dtype) return copy;
      const widen = this.dtype === 'float16' ? widenHalves : widenBFloat16;
      return { data: widen(copy.data as Uint16Array), dims: copy.dims };
    });
    return { key, value };
  }

  /** Positions [start, end) of one storage [B, Hkv, maxLength, D] copied into a new tensor in `layout`. */
  #copyOut(views: HeapViews, storage: number, D: number, start: number, end: number, layout: 'bhsd' | 'bshd'):
    KVCacheContents['key'] {
    const B = this.batch, H = this.kvHeads, n = end - start;
    const sixteenBit = this.dtype !== 'float32';
    const source: Float32Array | Uint16Array = sixteenBit ? views.u16 : views.f32;
    const data: Float32Array | Uint16Array = sixteenBit ? new Uint16Array(B * H * n * D) : new Float32Array(B * H * n * D);
    const first = storage / DTYPES[this.dtype].bytes;
    for (let b = 0; b < B; b++) {
      for (let h = 0; h < H; h++) {
        const from = first + ((b * H + h) * this.maxLength + start) * D;
        if (layout === 'bhsd') {
          data.set(source.subarray(from, from + n * D), (b * H + h) * n * D);
        } else {
          for (let i = 0; i < n; i++) data.set(source.subarray(from + i * D, from + (i + 1) * D), ((b * n + i) * H + h) * D);
        }
      }
    }
    return { data, dims: layout === 'bhsd' ? [B, H, n, D] : [B, n, H, D] };
  }

  /** Forgets every position (length 0); the storage stays allocated. */
  reset(): void {
    this.#live('KVCache.reset');
    this.#length = 0;
    this.#version++;
    this.#maybeInfNaN = false;
  }

  /** Frees the storage; the cache then throws on use. Calling it twice is harmless. */
  dispose(): void {
    const module = this.#module;
    if (module === null) return;
    this.#module = null;
    this.#version++;
    freeLongLived(module, this.#account, this.#storage);
    this.#length = 0;
    this.#onDispose(this);
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}
