// KV cache misuse and bad input: every rejection is a TypeError or RangeError (a plain Error
// for a disposed cache, like a disposed instance) whose message names the function, the
// argument, what was expected and what was given; the cache is unchanged after any error
// (its length, and bitwise its attention output); nothing leaks (heap bytes in use).
import { createAttention } from 'sdpa-wasm';
// The internal loader (not public API): gives the Emscripten module with heapBytesInUse.
import * as loader from '../../dist/loader.js';
import { maxRelError, randomTensor, referenceSdpa } from './reference.mjs';

let attn;
beforeAll(async () => {
  attn = await createAttention({ threads: 1 });
});
afterAll(() => attn.dispose());

// The cache the cases start from: B 2, Hkv 2, E 8, Ev 6, 10 positions stored of 16.
const B = 2, Hkv = 2, Hq = 4, E = 8, Ev = 6, MAX = 16;
const t = (data, dims) => ({ data, dims });
const k = (L = 3, seed = 1) => randomTensor([B, Hkv, L, E], seed);
const v = (L = 3, seed = 2) => randomTensor([B, Hkv, L, Ev], seed);
const q = (Lq = 2, H = Hq, D = E) => randomTensor([B, H, Lq, D], 3);

function freshCache(dtype = 'float32') {
  const cache = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: MAX, dtype });
  cache.append(k(10, 4), v(10, 5));
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

const CREATE_CASES = [
  ['no options', () => attn.createKVCache(), TypeError, [/createKVCache/, /required/]],
  ['options a number', () => attn.createKVCache(3), TypeError, [/createKVCache: options must be an object/, /got 3/]],
  ['unknown option', () => attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 4, heads: 2 }), TypeError,
    [/unknown option "heads"/, /kvHeads/]],
  ['batch missing', () => attn.createKVCache({ kvHeads: 1, headDim: 4, maxLength: 4 }), TypeError, [/options\.batch/, /undefined/]],
  ['batch 0', () => attn.createKVCache({ batch: 0, kvHeads: 1, headDim: 4, maxLength: 4 }), RangeError, [/options\.batch/, /got 0/]],
  ['headDim 1.5', () => attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 1.5, maxLength: 4 }), RangeError, [/options\.headDim/, /1\.5/]],
  ['maxLength a string', () => attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: '4' }), TypeError,
    [/options\.maxLength/, /"4"/]],
  ['valueDim -1', () => attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, valueDim: -1, maxLength: 4 }), RangeError,
    [/options\.valueDim/, /-1/]],
  ['dtype bfloat16', () => attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 4, dtype: 'bfloat16' }), RangeError,
    [/options\.dtype/, /'float32' or 'float16'/, /"bfloat16"/]],
  // 32 heads × 128 dims × 2 (K and V) × 4 bytes × 2^20 positions = 32 GiB.
  ['more than wasm memory holds', () => attn.createKVCache({ batch: 1, kvHeads: 32, headDim: 128, maxLength: 2 ** 20 }), RangeError,
    [/createKVCache/, new RegExp(`needs ${32 * 128 * 2 * 4 * 2 ** 20} bytes`), /2 GiB/, /2147483648/]],
  // 2 GiB − 64 bytes: under the limit, but not beside what is in use.
  ['2 GiB − 64 when some is in use', () => attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 1, maxLength: 2 ** 28 - 8 }), RangeError,
    [/createKVCache/, /bytes/, /in use/]],
];

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
  });
});

const CACHE_CASES = [
  // append
  ['append: key heads', (c) => c.append(randomTensor([B, 3, 1, E], 1), v(1)), RangeError, [/KVCache\.append/, /key\.dims/, /Hkv = 2, got 3/]],
  ['append: key E', (c) => c.append(randomTensor([B, Hkv, 1, 7], 1), v(1)), RangeError, [/key\.dims/, /head size E = 8, got 7/]],
  ['append: value Ev', (c) => c.append(k(1), randomTensor([B, Hkv, 1, 8], 1)), RangeError, [/value\.dims/, /Ev = 6, got 8/]],
  ['append: batch', (c) => c.append(randomTensor([1, Hkv, 1, E], 1), v(1)), RangeError, [/key\.dims/, /batch B = 2, got 1/]],
  ['append: key and value lengths differ', (c) => c.append(k(2), v(3)), RangeError, [/value\.dims/, /Lnew = 2, got 3/]],
  ['append: past maxLength', (c) => c.append(k(7), v(7)), RangeError, [/appending 7 positions/, /10 stored/, /maxLength = 16/, /nothing was appended/]],
  ['append: Float64Array', (c) => c.append(t(new Float64Array(B * Hkv * E), [B, Hkv, 1, E]), v(1)), TypeError,
    [/key\.data must be a Float32Array/, /Float64Array/]],
  ['append: halves into a float32 cache', (c) => c.append(t(new Uint16Array(B * Hkv * E), [B, Hkv, 1, E]), v(1)), TypeError,
    [/key\.data must be a Float32Array for a float32 cache/, /Uint16Array/]],
  ['append: data length', (c) => c.append(t(new Float32Array(5), [B, Hkv, 1, E]), v(1)), RangeError, [/key\.data\.length/, /got 5/]],
  ['append: missing value', (c) => c.append(k(1)), TypeError, [/value must be a tensor/, /undefined/]],
  ['append: unknown option', (c) => c.append(k(1), v(1), { causal: true }), TypeError, [/unknown option "causal"/, /layout/]],
  ['append: bad layout', (c) => c.append(k(1), v(1), { layout: 'nhwc' }), RangeError, [/options\.layout/, /"nhwc"/]],
  ['append: bshd dims read as [B, L, H, E]', (c) => c.append(k(1), v(1), { layout: 'bshd' }), RangeError, [/\[B, L, H, E\]/, /Hkv = 2, got 1/]],
  // attend
  ['attend: query E', (c) => c.attend(q(1, Hq, 5)), RangeError, [/KVCache\.attend/, /query\.dims/, /head size E = 8, got 5/]],
  ['attend: Hq not a multiple of Hkv', (c) => c.attend(q(1, 3)), RangeError, [/Hq = 3/, /cache's heads Hkv = 2/]],
  ['attend: batch', (c) => c.attend(randomTensor([3, Hq, 1, E], 1)), RangeError, [/batch B = 2, got 3/]],
  ['attend: mask not broadcastable to the stored length', (c) => c.attend(q(1), { attnMask: t(new Float32Array(9), [9]) }), RangeError,
    [/attnMask/, /Lk\] = \[2, 4, 1, 10\]/, /got 9/]],
  ['attend: keyLengths beyond the stored length', (c) => c.attend(q(1), { keyLengths: new Int32Array([10, 11]) }), RangeError,
    [/keyLengths\[1\]/, /\[0, Lk = 10\]/, /got 11/]],
  ['attend: causalOffset without isCausal', (c) => c.attend(q(1), { isCausal: false, causalOffset: 3 }), TypeError,
    [/causalOffset is only meaningful/]],
  ['attend: out too small', (c) => c.attend(q(1), { out: new Float32Array(3) }), RangeError, [/options\.out is too small/, /needs 48/]],
  ['attend: softcap 0', (c) => c.attend(q(1), { softcap: 0 }), RangeError, [/softcap/]],
  ['attend: unknown option', (c) => c.attend(q(1), { causal: true }), TypeError, [/unknown option "causal"/]],
  // truncate
  ['truncate: beyond length', (c) => c.truncate(11), RangeError, [/KVCache\.truncate/, /\[0, length = 10\]/, /got 11/]],
  ['truncate: negative', (c) => c.truncate(-1), RangeError, [/got -1/]],
  ['truncate: fractional', (c) => c.truncate(2.5), RangeError, [/got 2\.5/]],
  ['truncate: a string', (c) => c.truncate('3'), TypeError, [/must be an integer/, /"3"/]],
];

describe('cache methods reject bad input with typed errors and leave the cache unchanged', () => {
  test.each(CACHE_CASES)('%s', (_, fn, Cls, patterns) => {
    for (const dtype of ['float32', 'float16']) {
      if (dtype === 'float16' && /halves into a float32/.test(_)) continue;
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
    for (const use of [(c) => c.append(k(1), v(1)), (c) => c.attend(q()), (c) => c.truncate(0), (c) => c.reset()]) {
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

describe('no leaks', () => {
  test.each([1, 2])('threads %p: 1,000 mixed calls (valid and failing) leave the heap bytes in use as they were', async (threads) => {
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
      for (let i = 0; i < 100; i++) mixed(i);  // 12 calls each: 1,200
      expect(() => instance.createKVCache({ batch: 1, kvHeads: 32, headDim: 128, maxLength: 2 ** 20 })).toThrow(RangeError);
      expect(handle.module.heapBytesInUse()).toBe(inUse);
    } finally {
      handle.release();
      instance.dispose();
    }
  });
});
