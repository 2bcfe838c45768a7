// The bad-input cases of createKVCache() and of the cache's methods, shared by the direct API's
// tests (tests/node/kv-cache-errors.test.mjs) and the worker's (tests/node/worker.test.mjs,
// which expects the same class and message). Each case: [description, call, error class,
// patterns the message must match]; a call returns what the method returns (a promise for the
// worker).
import { randomTensor } from '../node/reference.mjs';

// The cache the cases start from: B 2, Hkv 2, E 8, Ev 6, 10 positions stored of 16.
export const B = 2, Hkv = 2, Hq = 4, E = 8, Ev = 6, MAX = 16;
const t = (data, dims) => ({ data, dims });
/** `array` with its buffer detached (transferred away), as after a worker call with { transfer: true }. */
const detached = (array) => {
  structuredClone(array.buffer, { transfer: [array.buffer] });
  return array;
};
export const k = (L = 3, seed = 1) => randomTensor([B, Hkv, L, E], seed);
export const v = (L = 3, seed = 2) => randomTensor([B, Hkv, L, Ev], seed);
export const q = (Lq = 2, H = Hq, D = E) => randomTensor([B, H, Lq, D], 3);
export const CACHE_OPTIONS = { batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: MAX };
/** Positions the cases' cache holds before each case. */
export const STORED = 10;

/** createKVCache(options) cases, calling `api.createKVCache`. */
export const createCacheErrorCases = (api) => [
  ['no options', () => api.createKVCache(), TypeError, [/createKVCache/, /required/]],
  ['options a number', () => api.createKVCache(3), TypeError, [/createKVCache: options must be an object/, /got 3/]],
  ['unknown option', () => api.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 4, heads: 2 }), TypeError,
    [/unknown option "heads"/, /kvHeads/]],
  ['batch missing', () => api.createKVCache({ kvHeads: 1, headDim: 4, maxLength: 4 }), TypeError, [/options\.batch/, /undefined/]],
  ['batch 0', () => api.createKVCache({ batch: 0, kvHeads: 1, headDim: 4, maxLength: 4 }), RangeError, [/options\.batch/, /got 0/]],
  ['headDim 1.5', () => api.createKVCache({ batch: 1, kvHeads: 1, headDim: 1.5, maxLength: 4 }), RangeError, [/options\.headDim/, /1\.5/]],
  ['maxLength a string', () => api.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: '4' }), TypeError,
    [/options\.maxLength/, /"4"/]],
  ['valueDim -1', () => api.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, valueDim: -1, maxLength: 4 }), RangeError,
    [/options\.valueDim/, /-1/]],
  ['dtype int8', () => api.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 4, dtype: 'int8' }), RangeError,
    [/options\.dtype/, /'float32', 'float16' or 'bfloat16'/, /"int8"/]],
  ['dtype Float16 (a case off)', () => api.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 4, dtype: 'Float16' }), RangeError,
    [/options\.dtype must be 'float32', 'float16' or 'bfloat16', got "Float16"$/]],
  ['dtype an inherited name', () => api.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 4, dtype: 'toString' }), RangeError,
    [/options\.dtype must be 'float32', 'float16' or 'bfloat16', got "toString"$/]],
  ['dtype null', () => api.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 4, dtype: null }), TypeError,
    [/options\.dtype must be 'float32', 'float16' or 'bfloat16', got null$/]],
  ['dtype a number', () => api.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 4, dtype: 16 }), TypeError,
    [/options\.dtype must be 'float32', 'float16' or 'bfloat16', got 16$/]],
  // 32 heads × 128 dims × 2 (K and V) × 4 bytes × 2^20 positions = 32 GiB.
  ['more than wasm memory holds', () => api.createKVCache({ batch: 1, kvHeads: 32, headDim: 128, maxLength: 2 ** 20 }), RangeError,
    [/createKVCache/, new RegExp(`needs ${32 * 128 * 2 * 4 * 2 ** 20} bytes`), /2 GiB/, /2147483648/]],
  // 2 GiB − 64 bytes: under the limit, but not beside what is in use.
  ['2 GiB − 64 when some is in use', () => api.createKVCache({ batch: 1, kvHeads: 1, headDim: 1, maxLength: 2 ** 28 - 8 }), RangeError,
    [/createKVCache/, /bytes/, /in use/]],
];

/** Cases on a cache holding STORED positions: `call(cache)`. */
export const CACHE_ERROR_CASES = [
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
    [/key\.data must be a Float32Array or a Float16Array for a float32 cache/, /only for dtype 'float16' or 'bfloat16'/, /Uint16Array/]],
  ['append: data length', (c) => c.append(t(new Float32Array(5), [B, Hkv, 1, E]), v(1)), RangeError, [/key\.data\.length/, /got 5/]],
  ['append: missing value', (c) => c.append(k(1)), TypeError, [/value must be a tensor/, /undefined/]],
  ['append: key a bare Float32Array (its .data)', (c) => c.append(k(1).data, v(1)), TypeError,
    [/key must be a tensor/, /, a bare array: pass it as \{ data, dims \}/]],
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
    [/^KVCache\.attend: options\.causalOffset is only meaningful with options\.isCausal: true or options\.alibiSlopes, got options\.isCausal false$/]],
  ['attend: out too small', (c) => c.attend(q(1), { out: new Float32Array(3) }), RangeError, [/options\.out is too small/, /needs 48/]],
  ['attend: softcap 0', (c) => c.attend(q(1), { softcap: 0 }), RangeError, [/KVCache\.attend: options\.softcap must be a number > 0/, /got 0$/]],
  ['attend: unknown option', (c) => c.attend(q(1), { causal: true }), TypeError, [/unknown option "causal"/]],
  ['attend: dropoutP 1', (c) => c.attend(q(1), { dropoutP: 1, dropoutSeed: 1 }), RangeError,
    [/^KVCache\.attend: options\.dropoutP must be a number in \[0, 1\)/, /got 1$/]],
  ['attend: dropoutP without dropoutSeed', (c) => c.attend(q(1), { dropoutP: 0.5 }), TypeError,
    [/^KVCache\.attend: options\.dropoutSeed is required with options\.dropoutP > 0/, /got undefined$/]],
  ['attend: dropoutSeed 2^32', (c) => c.attend(q(1), { dropoutP: 0.5, dropoutSeed: 2 ** 32 }), RangeError,
    [/^KVCache\.attend: options\.dropoutSeed must be an integer in \[0, 2\^32\), got 4294967296$/]],
  ['attend: dropoutSeed a string', (c) => c.attend(q(1), { dropoutP: 0.5, dropoutSeed: '3' }), TypeError,
    [/^KVCache\.attend: options\.dropoutSeed must be an integer in \[0, 2\^32\), got "3"$/]],
  // truncate
  ['truncate: beyond length', (c) => c.truncate(11), RangeError, [/KVCache\.truncate/, /\[0, length = 10\]/, /got 11/]],
  ['truncate: negative', (c) => c.truncate(-1), RangeError, [/^KVCache\.truncate: n must be an integer in \[0, length = 10\], got -1$/]],
  ['truncate: fractional', (c) => c.truncate(2.5), RangeError, [/^KVCache\.truncate: n must be an integer in \[0, length = 10\], got 2\.5$/]],
  ['truncate: a string', (c) => c.truncate('3'), TypeError, [/must be an integer/, /"3"/]],
  // remove
  ['remove: end beyond length', (c) => c.remove(2, 11), RangeError, [/^KVCache\.remove: end must be an integer in \[start = 2, length = 10\], got 11$/]],
  ['remove: end before start', (c) => c.remove(5, 4), RangeError, [/^KVCache\.remove: end must be an integer in \[start = 5, length = 10\], got 4$/]],
  ['remove: negative start', (c) => c.remove(-1, 3), RangeError, [/^KVCache\.remove: start must be an integer in \[0, length = 10\], got -1$/]],
  ['remove: start beyond length', (c) => c.remove(11, 11), RangeError, [/^KVCache\.remove: start must be an integer in \[0, length = 10\], got 11$/]],
  ['remove: fractional end', (c) => c.remove(0, 2.5), RangeError, [/KVCache\.remove: end must be an integer/, /got 2\.5$/]],
  ['remove: NaN start', (c) => c.remove(NaN, 2), RangeError, [/KVCache\.remove: start must be an integer/, /got NaN$/]],
  ['remove: end missing', (c) => c.remove(0), TypeError, [/^KVCache\.remove: end must be an integer, got undefined$/]],
  ['remove: start a string', (c) => c.remove('0', 2), TypeError, [/^KVCache\.remove: start must be an integer, got "0"$/]],
  // reorder
  ['reorder: a plain array', (c) => c.reorder([1, 0]), TypeError, [/KVCache\.reorder/, /indices must be an Int32Array of length B = 2/, /Array/]],
  ['reorder: missing indices', (c) => c.reorder(), TypeError, [/indices must be an Int32Array/, /undefined/]],
  ['reorder: length', (c) => c.reorder(new Int32Array([1, 0, 0])), RangeError, [/indices must have length B = 2, got 3/]],
  ['reorder: an index past the batches', (c) => c.reorder(new Int32Array([0, 2])), RangeError, [/indices\[1\] must be a batch index in \[0, 2\), got 2/]],
  ['reorder: detached indices', (c) => c.reorder(detached(new Int32Array([1, 0]))), RangeError,
    [/KVCache\.reorder: indices has no elements/, /detached/, /length B = 2/]],
  ['reorder: a negative index', (c) => c.reorder(new Int32Array([-1, 0])), RangeError, [/indices\[0\]/, /got -1/]],
];
