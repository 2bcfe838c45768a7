// KV cache misuse and bad input: every rejection is a TypeError or RangeError (a plain Error
// for a disposed cache, like a disposed instance) whose message names the function, the
// argument, what was expected and what was given; the cache is unchanged after any error
// (its length, and bitwise its attention output); nothing leaks (heap bytes in use).
import { createAttention } from 'sdpa-wasm';
// The internal loader (not public API): gives the Emscripten module with heapBytesInUse.
import * as loader from '../../dist/loader.js';
import { maxRelError, randomTensor, referenceSdpa } from './reference.mjs';
import {
  B, CACHE_ERROR_CASES, CACHE_OPTIONS, createCacheErrorCases, E, Ev, Hkv, Hq, k, MAX, q, STORED, v,
} from '../shared/kv-cache-error-cases.mjs';

let attn;
beforeAll(async () => {
  attn = await createAttention({ threads: 1 });
});
afterAll(() => attn.dispose());

const t = (data, dims) => ({ data, dims });

// The cache the cases start from (tests/shared/kv-cache-error-cases.mjs): B 2, Hkv 2, E 8,
// Ev 6, STORED = 10 positions of MAX = 16.
function freshCache(dtype = 'float32') {
  const cache = attn.createKVCache({ ...CACHE_OPTIONS, dtype });
  cache.append(k(STORED, 4), v(STORED, 5));
  return cache;
}

/** fn(cache) throws an instance of exactly Cls matching every pattern; the cache is unchanged. */
function expectRejected(cache, fn, Cls, patterns) {
  const length = cache.length;
  const before = cache.attend(q()).output.data;
  let error;
  try {
    fn(cache);
  } catch (e) {
    error = e;
  }
  expect(error).toBeInstanceOf(Cls);
  expect(error.constructor).toBe(Cls);
  for (const pattern of patterns) expect(error.message).toMatch(pattern);
  expect(cache.length).toBe(length);
  expect(cache.attend(q()).output.data).toEqual(before);
}

const CREATE_CASES = createCacheErrorCases({ createKVCache: (...args) => attn.createKVCache(...args) });

describe('createKVCache rejects bad options before allocating', () => {
  test.each(CREATE_CASES)('%s', (_, fn, Cls, patterns) => {
    let error;
    try {
      fn();
    } catch (e) {
      error = e;
    }
    expect(error?.constructor).toBe(Cls);
    for (const pattern of patterns) expect(error.message).toMatch(pattern);
    // Nothing allocated, and the instance still makes caches that attend right.
    expect(attn.memory().bytesInUse).toBe(0);
    const cache = freshCache();
    try {
      const ref = referenceSdpa(q(), k(STORED, 4), v(STORED, 5), { isCausal: true, causalOffset: STORED - 2 });
      expect(maxRelError(cache.attend(q()).output.data, ref.output)).toBeLessThanOrEqual(2e-5);
    } finally {
      cache.dispose();
    }
    expect(attn.memory().bytesInUse).toBe(0);
  });
});

const CACHE_CASES = CACHE_ERROR_CASES;

describe('cache methods reject bad input with typed errors and leave the cache unchanged', () => {
  test.each(CACHE_CASES)('%s', (_, fn, Cls, patterns) => {
    for (const dtype of ['float32', 'float16', 'bfloat16']) {
      if (dtype !== 'float32' && /halves into a float32/.test(_)) continue;
      const cache = freshCache(dtype);
      try {
        expectRejected(cache, fn, Cls, patterns);
      } finally {
        cache.dispose();
      }
    }
  });

  test('the starting cache is right', () => {
    const cache = freshCache();
    try {
      const key = k(10, 4), value = v(10, 5), query = q();
      const ref = referenceSdpa(query, key, value, { isCausal: true, causalOffset: 8 });
      expect(maxRelError(cache.attend(query).output.data, ref.output)).toBeLessThanOrEqual(2e-5);
    } finally {
      cache.dispose();
    }
  });
});

describe('disposal', () => {
  test('a disposed cache throws on every use; disposing twice is harmless; Symbol.dispose', () => {
    const cache = freshCache();
    cache.dispose();
    cache.dispose();
    expect(cache.disposed).toBe(true);
    for (const use of [(c) => c.append(k(1), v(1)), (c) => c.attend(q()), (c) => c.truncate(0), (c) => c.reset(),
      (c) => c.reorder(new Int32Array([1, 0]))]) {
      expect(() => use(cache)).toThrow(/KVCache\.\w+: this KVCache has been disposed/);
    }
    const scoped = freshCache();
    scoped[Symbol.dispose]();
    expect(scoped.disposed).toBe(true);
  });

  test('disposing the instance disposes its caches and frees their memory', async () => {
    const other = await createAttention({ threads: 1 });
    const handle = await loader.acquireModule(1);
    try {
      const before = handle.module.heapBytesInUse();
      const a = other.createKVCache({ batch: 1, kvHeads: 2, headDim: 64, maxLength: 1000 });
      const b = other.createKVCache({ batch: 1, kvHeads: 2, headDim: 64, maxLength: 1000, dtype: 'float16' });
      b.dispose();
      expect(handle.module.heapBytesInUse()).toBeGreaterThanOrEqual(before + a.byteLength);
      other.dispose();
      expect(a.disposed).toBe(true);
      expect(handle.module.heapBytesInUse()).toBe(before);
      expect(() => other.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 4 })).toThrow(/disposed/);
    } finally {
      handle.release();
    }
  });
});

describe('a cache used by a getter of its own call\'s arguments', () => {
  test('disposed meanwhile: append, attend and read throw, and write or read nothing (another cache got its memory)', () => {
    for (const call of [
      (c, options) => c.append(k(1, 30), v(1, 31), options),
      (c, options) => c.attend(q(), options),
      (c, options) => c.read(0, 2, options),
    ]) {
      const cache = freshCache();
      let other;
      const options = {
        get layout() {
          cache.dispose();
          other = freshCache();  // may take the freed storage
          return 'bhsd';
        },
      };
      const expected = freshCache();
      try {
        expect(() => call(cache, options)).toThrow(/KVCache\.\w+: this KVCache has been disposed/);
        expect(other.length).toBe(STORED);
        expect(other.attend(q()).output.data).toEqual(expected.attend(q()).output.data);
      } finally {
        other.dispose();
        expected.dispose();
      }
    }
  });

  test('changed meanwhile (appended, truncated): the call throws and does nothing more; the change stays', () => {
    const cache = freshCache();
    try {
      // A getter appending MAX - STORED positions: the outer append, checked against the
      // length before, would pass maxLength.
      const fill = { get layout() { cache.append(k(MAX - STORED, 32), v(MAX - STORED, 33)); return 'bhsd'; } };
      expect(() => cache.append(k(3, 34), v(3, 35), fill)).toThrow(/KVCache\.append: the cache was changed while this call read its arguments/);
      expect(cache.length).toBe(MAX);
      const rewind = { get layout() { cache.truncate(4); return 'bhsd'; } };
      expect(() => cache.attend(q(), rewind)).toThrow(/KVCache\.attend: the cache was changed/);
      expect(cache.length).toBe(4);
      expect(cache.attend(q()).output.dims).toEqual([B, Hq, 2, Ev]);
      // read() too (all positions: 4 when called, 2 once its options were read).
      const shorten = { get dtype() { cache.truncate(2); return undefined; } };
      expect(() => cache.read(undefined, undefined, shorten)).toThrow(/^KVCache\.read: the cache was changed while this call read its arguments \(by a getter\); nothing was done$/);
      expect(cache.length).toBe(2);
      expect(cache.read().key.dims).toEqual([B, Hkv, 2, E]);
    } finally {
      cache.dispose();
    }
  });

  test('the instance disposed by a getter during attend (2 threads): an error, not a hang', async () => {
    const instance = await createAttention({ threads: 2 });
    const cache = instance.createKVCache(CACHE_OPTIONS);
    cache.append(k(STORED, 4), v(STORED, 5));
    const options = { get scale() { instance.dispose(); return 0.5; } };
    expect(() => cache.attend(q(), options)).toThrow(/KVCache\.attend: this KVCache has been disposed/);
    expect(cache.disposed).toBe(true);
  });
});

describe('no leaks', () => {
  test.each([1, 2])('threads %p: 1,400 mixed calls (valid and failing) leave the heap bytes in use as they were', async (threads) => {
    const instance = await createAttention({ threads });
    const handle = await loader.acquireModule(threads);
    try {
      const mixed = (i) => {
        const dtype = i % 2 ? 'float16' : 'float32';
        const cache = instance.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: 40, dtype });
        try {
          cache.append(k(5, i), v(5, i));
          cache.attend(q(), { returnWeights: i % 3 === 0 });
          expect(() => cache.append(k(40), v(40))).toThrow(RangeError);
          if (i % 4 === 0) cache.append(randomTensor([B, 1, Hkv, E], i), randomTensor([B, 1, Hkv, Ev], i), { layout: 'bshd' });
          else cache.append(k(1, i), v(1, i));
          expect(() => cache.attend(q(1, 3))).toThrow(RangeError);
          cache.reorder(new Int32Array(i % 3 ? [1, 0] : [1, 1]));  // a swap takes a saved copy
          expect(() => cache.reorder(new Int32Array([0, 2]))).toThrow(RangeError);
          cache.truncate(3);
          cache.attend(q(1), { attnMask: t(new Uint8Array(3).fill(1), [3]) });
          expect(() => cache.truncate(4)).toThrow(RangeError);
          cache.reset();
          cache.attend(q(1));
        } finally {
          if (i % 5 !== 0) cache.dispose();
          else cache[Symbol.dispose]();
        }
      };
      for (let i = 0; i < 4; i++) mixed(i);  // warm up
      const inUse = handle.module.heapBytesInUse();
      for (let i = 0; i < 100; i++) mixed(i);  // 14 calls each: 1,400
      expect(() => instance.createKVCache({ batch: 1, kvHeads: 32, headDim: 128, maxLength: 2 ** 20 })).toThrow(RangeError);
      expect(handle.module.heapBytesInUse()).toBe(inUse);
    } finally {
      handle.release();
      instance.dispose();
    }
  });
});
