// Bad input: every rejection is a TypeError (wrong kind of value) or a RangeError (right
// kind, wrong value) whose message names the argument and shows what was expected and what
// was given; the instance stays usable after every error. Also: dispose, allocation failure
// and leaks of wasm memory.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createAttention } from 'sdpa-wasm';
// The internal loader (not public API): gives the Emscripten module with HEAPU8, _malloc, _free.
import * as loader from '../../dist/loader.js';
import { maxRelError, randomTensor, referenceSdpa } from './reference.mjs';
import { B, E, Ev, has, Hkv, Hq, k, Lk, Lq, q, sdpaErrorCases, v } from '../shared/sdpa-error-cases.mjs';

let attn;
beforeAll(async () => {
  attn = await createAttention();
});
afterAll(() => attn.dispose());

/** The wasm module an instance with `threads` threads runs on, and how to let go of it. */
async function moduleFor(threads) {
  if (typeof loader.acquireModule === 'function') {
    const handle = await loader.acquireModule(threads);
    return { module: handle.module, release: handle.release };
  }
  return { module: await loader.loadModule(), release: () => {} };
}

// A valid problem the error cases start from (tests/shared/sdpa-error-cases.mjs).
const t = (data, dims) => ({ data, dims });

/** The instance still computes a correct small result (checked against the reference). */
function expectStillWorks(instance = attn) {
  const query = q(), key = k(), value = v();
  const options = { isCausal: true, causalOffset: 1, returnWeights: true, keyLengths: new Int32Array([7, 4]) };
  const got = instance.sdpa(query, key, value, options);
  const ref = referenceSdpa(query, key, value, options);
  expect(got.output.dims).toEqual([B, Hq, Lq, Ev]);
  expect(maxRelError(got.output.data, ref.output)).toBeLessThanOrEqual(2e-5);
  expect(maxRelError(got.weights.data, ref.weights)).toBeLessThanOrEqual(2e-5);
}

/** fn() throws an instance of Cls whose message matches every pattern; then the instance works. */
function expectError(fn, Cls, patterns) {
  let error;
  try {
    fn();
  } catch (e) {
    error = e;
  }
  expect(error).toBeInstanceOf(Cls);
  // TypeError and RangeError are distinct: a RangeError must not be reported as TypeError.
  expect(error.constructor).toBe(Cls);
  for (const pattern of patterns) expect(error.message).toMatch(pattern);
  expectStillWorks();
}


const CASES = sdpaErrorCases({ sdpa: (...args) => attn.sdpa(...args) });

describe('sdpa() rejects bad input with a typed, descriptive error and stays usable', () => {
  test('the starting problem is valid', () => {
    expectStillWorks();
  });
  test.each(CASES)('%s', (_, fn, Cls, patterns) => {
    expectError(fn, Cls, patterns);
  });
});

describe('createAttention() options', () => {
  test.each([
    [{ threads: 0 }, RangeError, [/options\.threads/, /integer/, /got 0/]],
    [{ threads: 1.5 }, RangeError, [/options\.threads/, /got 1\.5/]],
    [{ threads: -2 }, RangeError, [/options\.threads/, /got -2/]],
    [{ threads: NaN }, RangeError, [/options\.threads/, /got NaN/]],
    [{ threads: '2' }, TypeError, [/options\.threads must be a number/, /got "2"/]],
    [null, TypeError, [/createAttention: options must be an object/, /got null/]],
    [4, TypeError, [/createAttention: options must be an object/, /got 4/]],
  ])('createAttention(%p) rejects', async (options, Cls, patterns) => {
    let error;
    try {
      await createAttention(options);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(Cls);
    expect(error.constructor).toBe(Cls);
    for (const pattern of patterns) expect(error.message).toMatch(pattern);
    expectStillWorks();
  });

  test('valid thread counts give a working instance reporting the threads it uses', async () => {
    for (const options of [undefined, {}, { threads: 1 }, { threads: 2 }]) {
      const instance = await createAttention(options);
      expect(Number.isInteger(instance.threads)).toBe(true);
      expect(instance.threads).toBeGreaterThanOrEqual(1);
      expect(instance.threads).toBeLessThanOrEqual(options?.threads ?? Infinity);
      expectStillWorks(instance);
      instance.dispose();
    }
  });
});

describe('dispose', () => {
  test('after dispose() sdpa throws; disposing twice is harmless; other instances keep working', async () => {
    const instance = await createAttention();
    expectStillWorks(instance);
    instance.dispose();
    expect(() => instance.sdpa(q(), k(), v())).toThrow(/disposed/);
    expect(() => instance.dispose()).not.toThrow();
    expect(() => instance.sdpa(q(), k(), v())).toThrow(/disposed/);
    expectStillWorks(attn);  // the shared module is not released by one instance
  });

  test('Symbol.dispose exists and disposes', async () => {
    const instance = await createAttention();
    expect(typeof Symbol.dispose).toBe('symbol');
    expect(typeof instance[Symbol.dispose]).toBe('function');
    expectStillWorks(instance);
    instance[Symbol.dispose]();
    expect(() => instance.sdpa(q(), k(), v())).toThrow(/disposed/);
    expect(() => instance[Symbol.dispose]()).not.toThrow();
    expect(() => instance.dispose()).not.toThrow();
    expectStillWorks(attn);
  });
});

describe('arguments read through getters (user code running inside a call)', () => {
  test('each option and each dims element is read once: a getter cannot pass the checks and change afterwards', () => {
    const reads = { scale: 0, lq: 0 };
    const dims = [B, Hq, Lq, E];
    Object.defineProperty(dims, 2, { get: () => (reads.lq++ === 0 ? Lq : 100000), enumerable: true });
    const options = { get scale() { return reads.scale++ === 0 ? 0.5 : NaN; } };
    const query = q();
    const got = attn.sdpa(t(query.data, dims), k(), v(), options);
    expect(reads).toEqual({ scale: 1, lq: 1 });
    expect(got.output.dims).toEqual([B, Hq, Lq, Ev]);
    expect(maxRelError(got.output.data, referenceSdpa(query, k(), v(), { scale: 0.5 }).output)).toBeLessThanOrEqual(2e-5);
  });

  test('each tensor\'s data is read once: the array the checks accepted is the one computed with', () => {
    for (const which of [0, 1, 2]) {
      const inputs = [q(), k(), v()];
      const checked = inputs[which];
      let reads = 0;
      const other = new Float32Array(checked.data.length * 10).fill(1e30);
      const tricky = { get data() { return reads++ === 0 ? checked.data : other; }, dims: checked.dims };
      const args = inputs.map((x, i) => (i === which ? tricky : x));
      const got = attn.sdpa(...args, { isCausal: true });
      expect(reads).toBe(1);
      expect(Array.from(got.output.data)).toEqual(Array.from(attn.sdpa(...inputs, { isCausal: true }).output.data));
    }
    const cache = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: Lk });
    cache.append(k(), v());
    const query = q();
    let reads = 0;
    const step = cache.attend({ get data() { return reads++ === 0 ? query.data : new Float32Array(query.data.length * 4); }, dims: query.dims });
    expect(reads).toBe(1);
    expect(Array.from(step.output.data)).toEqual(Array.from(cache.attend(query).output.data));
    cache.dispose();
  });

  test('an array the checks accepted, detached or shrunk by a getter read after it: a RangeError naming it, nothing runs', () => {
    const detach = (x) => void structuredClone(x.buffer, { transfer: [x.buffer] });
    // sdpa: key's dims getter detaches query.data.
    const query = q();
    expectError(() => attn.sdpa(query, later(k(), () => detach(query.data)), v()), RangeError,
      [/^sdpa: query\.data's buffer was detached while the call read its arguments \(by a getter\); nothing was done$/]);
    // A resizable buffer shrunk: value.data's, by the mask's dims getter.
    const value = v();
    const resizable = new ArrayBuffer(value.data.byteLength, { maxByteLength: value.data.byteLength });
    const tracking = new Float32Array(resizable);
    tracking.set(value.data);
    const mask = later({ data: new Uint8Array(Lk).fill(1), dims: [Lk] }, () => resizable.resize(8));
    expectError(() => attn.sdpa(q(), k(), { data: tracking, dims: value.dims }, { attnMask: mask }), RangeError,
      [has(`sdpa: value.data shrank below the ${value.data.length} elements checked while the call read its arguments`)]);
    // attend: the mask's dims getter detaches query.data.
    const cache = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: Lk });
    cache.append(k(), v());
    const query2 = q();
    expectError(() => cache.attend(query2, { attnMask: later({ data: new Uint8Array(Lk).fill(1), dims: [Lk] }, () => detach(query2.data)) }),
      RangeError, [/^KVCache\.attend: query\.data's buffer was detached/]);
    expect(cache.length).toBe(Lk);
    cache.dispose();
    // sdpaBackward: gradOutput's dims getter detaches key.data; saved.output's detaches gradOutput.data.
    const key = k();
    expectError(() => attn.sdpaBackward(q(), key, v(), later(randomTensor([B, Hq, Lq, Ev], 9), () => detach(key.data))), RangeError,
      [/^sdpaBackward: key\.data's buffer was detached/]);
    const forward = attn.sdpa(q(), k(), v(), { returnLogSumExp: true });
    const grad = randomTensor([B, Hq, Lq, Ev], 9);
    const saved = { output: later(forward.output, () => detach(grad.data)), logSumExp: forward.logSumExp };
    expectError(() => attn.sdpaBackward(q(), k(), v(), grad, { saved }), RangeError, [/^sdpaBackward: gradOutput\.data's buffer was detached/]);
  });

  test('KVCache.append: an array detached or shrunk by a getter read after its checks is a RangeError; the cache is unchanged', () => {
    const detach = (x) => void structuredClone(x.buffer, { transfer: [x.buffer] });
    const cache = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: 2 * Lk });
    try {
      cache.append(k(), v());
      const before = cache.attend(q()).output.data;
      const key = k();
      expectError(() => cache.append(key, later(v(), () => detach(key.data))), RangeError,
        [/^KVCache\.append: key\.data's buffer was detached while the call read its arguments \(by a getter\); nothing was done$/]);
      // The value's dims getter shrinks the resizable buffer of the key's data, checked before.
      const key2 = k();
      const resizable = new ArrayBuffer(key2.data.byteLength, { maxByteLength: key2.data.byteLength });
      const tracking = new Float32Array(resizable);
      tracking.set(key2.data);
      expectError(() => cache.append({ data: tracking, dims: key2.dims }, later(v(), () => resizable.resize(8))), RangeError,
        [has(`KVCache.append: key.data shrank below the ${key2.data.length} elements checked while the call read its arguments`)]);
      expect(cache.length).toBe(Lk);
      expect(Array.from(cache.attend(q()).output.data)).toEqual(Array.from(before));
    } finally {
      cache.dispose();
    }
    expectStillWorks();
  });

  test('arrays carrying properties of their own (length, byteLength, buffer, an iterator) are read by their contents', () => {
    const plain = { query: q(), key: k(), value: v() };
    const options = { isCausal: true, causalOffset: new Int32Array([1, 2]), keyLengths: new Int32Array([7, 4]) };
    const expected = attn.sdpa(plain.query, plain.key, plain.value, options).output.data;
    // Own length and byteLength that understate the data: the call still copies and computes
    // with every element (the allocations are sized by the contents, not by the properties).
    const tamper = (t) => {
      const data = t.data.slice();
      Object.defineProperty(data, 'length', { value: 1 });
      Object.defineProperty(data, 'byteLength', { value: 4 });
      Object.defineProperty(data, 'byteOffset', { value: 1 << 20 });
      Object.defineProperty(data, 'set', { value: () => { throw new Error('a method of the caller\'s object was called'); } });
      return { data, dims: t.dims };
    };
    const offsets = new Int32Array([1, 2]);
    offsets[Symbol.iterator] = function* () { yield 9; };  // Int32Array.from would read [9]
    const got = attn.sdpa(tamper(plain.query), tamper(plain.key), tamper(plain.value),
      { ...options, causalOffset: offsets, out: tamper({ data: new Float32Array(expected.length) }).data });
    expect(Array.from(got.output.data)).toEqual(Array.from(expected));
    // A length property cannot stand in for the elements: keyLengths of 1 element for B = 2.
    const short = new Int32Array([7]);
    Object.defineProperty(short, 'length', { value: B });
    expectError(() => attn.sdpa(plain.query, plain.key, plain.value, { keyLengths: short }), RangeError,
      [/^sdpa: options\.keyLengths must have length B = 2, got 1$/]);
    // Nor a Symbol.toStringTag: a Float64Array stays a Float64Array.
    const disguised = Float64Array.from(plain.query.data);
    Object.defineProperty(disguised, Symbol.toStringTag, { value: 'Float32Array' });
    expectError(() => attn.sdpa({ data: disguised, dims: plain.query.dims }, plain.key, plain.value), TypeError,
      [/^sdpa: query\.data must be a Float32Array or a Float16Array, got Float64Array/]);
    expectStillWorks();
  });

  test('head sizes past the kernel\'s 2^20: a RangeError naming them (sdpa, sdpaBackward, createKVCache); 2^20 itself works', () => {
    const big = 2 ** 20;
    const one = (D, seed) => randomTensor([1, 1, 1, D], seed);
    expectError(() => attn.sdpa(one(big + 1, 1), one(big + 1, 2), one(4, 3)), RangeError,
      [/^sdpa: the head size E \(query\.dims' last axis\) must be at most 1048576 \(2\^20, the kernel's limit\), got 1048577$/]);
    expectError(() => attn.sdpa(one(4, 1), one(4, 2), one(big + 1, 3)), RangeError,
      [/^sdpa: the value size Ev \(value\.dims' last axis\) must be at most 1048576/, /got 1048577$/]);
    expectError(() => attn.sdpaBackward(one(big + 1, 1), one(big + 1, 2), one(4, 3), one(4, 4)), RangeError,
      [/^sdpaBackward: the head size E/, /got 1048577$/]);
    expectError(() => attn.createKVCache({ batch: 1, kvHeads: 1, headDim: big + 1, maxLength: 1 }), RangeError,
      [/^createKVCache: options\.headDim must be at most 1048576/, /got 1048577$/]);
    expectError(() => attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, valueDim: big + 1, maxLength: 1 }), RangeError,
      [/^createKVCache: options\.valueDim must be at most 1048576/, /got 1048577$/]);
    // E = 2^20, one key: the output is that key's value row.
    const query = one(big, 5), key = one(big, 6), value = one(3, 7);
    const got = attn.sdpa(query, key, value).output.data;
    expect(maxRelError(got, referenceSdpa(query, key, value).output)).toBeLessThanOrEqual(2e-5);
    expect(attn.memory().bytesInUse).toBe(0);
    expectStillWorks();
  });

  test('sdpaBackward: keyLengths are copied when checked (a later getter cannot change them); saved.logSumExp read once', () => {
    const keyLengths = new Int32Array([5, 3]);
    const expected = attn.sdpaBackward(q(), k(), v(), randomTensor([B, Hq, Lq, Ev], 9), { keyLengths });
    const grad = later(randomTensor([B, Hq, Lq, Ev], 9), () => keyLengths.fill(1 << 30));
    const got = attn.sdpaBackward(q(), k(), v(), grad, { keyLengths });
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(Array.from(got[name].data)).toEqual(Array.from(expected[name].data));
    expectStillWorks();

    const forward = attn.sdpa(q(), k(), v(), { returnLogSumExp: true });
    let reads = 0;
    const lse = forward.logSumExp;
    const logSumExp = { get data() { reads++; return lse.data; }, get dims() { reads++; return lse.dims; } };
    attn.sdpaBackward(q(), k(), v(), randomTensor([B, Hq, Lq, Ev], 9), { saved: { output: forward.output, logSumExp } });
    expect(reads).toBe(2);
  });

  test.each([1, 2])('a getter disposing the instance (%i threads): sdpa, sdpaBackward and createKVCache throw, nothing runs', async (threads) => {
    for (const call of [
      (instance, options) => instance.sdpa(q(), k(), v(), options),
      (instance, options) => instance.sdpaBackward(q(), k(), v(), randomTensor([B, Hq, Lq, Ev], 9), options),
    ]) {
      const instance = await createAttention({ threads });
      const options = { get scale() { instance.dispose(); return 0.5; } };
      expect(() => call(instance, options)).toThrow(/has been disposed/);
    }
    const instance = await createAttention({ threads });
    const options = { batch: 1, kvHeads: 1, headDim: 4, get maxLength() { instance.dispose(); return 8; } };
    expect(() => instance.createKVCache(options)).toThrow(/createKVCache: this Attention instance has been disposed/);
    expectStillWorks();
  });
});

/** `tensor` with a dims getter that runs `action` first. */
const later = (tensor, action) => ({ data: tensor.data, get dims() { action(); return tensor.dims; } });

// 2.16 GB of weights: more than the 2 GiB the wasm memory may grow to, but less than 4 GiB.
// 36 rows of one head against 15,000,000 keys: a longer query would run a few rows at a time
// (the weights then only need to fit in JavaScript), but 36 rows have no smaller slice that
// keeps the bits (every slice would be at most 32 rows, which the kernel computes on another path).
const HUGE = { Lq: 36, Lk: 15e6 };
const hugeInputs = (() => {
  let inputs = null;
  return () => {
    const one = (L) => ({ data: new Float32Array(L).fill(0.25), dims: [1, 1, L, 1] });
    inputs ??= [one(HUGE.Lq), one(HUGE.Lk), one(HUGE.Lk)];
    return inputs;
  };
})();
const hugeWeightsCall = () => attn.sdpa(...hugeInputs(), { returnWeights: true });

test.each(['signal', 'transfer'])('the worker-only option %s on the direct API is a TypeError saying whose option it is', (name) => {
  expectError(() => attn.sdpa(q(), k(), v(), { [name]: name === 'signal' ? new AbortController().signal : true }), TypeError,
    [new RegExp(`^sdpa: unknown option "${name}" \\(an option of a createAttentionWorker\\(\\) worker's calls only\\); known options: scale, `)]);
  expectStillWorks();
});

test('an option whose value is undefined is not given, known or not (a forward\'s options passed on to its backward); with a value, an unknown name is still a TypeError', async () => {
  const bits = (a) => Array.from(new Uint32Array(a.buffer, a.byteOffset, a.length));
  const forwardOptions = { isCausal: true, causalOffset: 1, returnLogSumExp: true };
  const forward = attn.sdpa(q(), k(), v(), forwardOptions);
  const withUndefined = attn.sdpa(q(), k(), v(), { ...forwardOptions, isCasual: undefined, signal: undefined, returnMaskGrad: undefined });
  expect(bits(withUndefined.output.data)).toEqual(bits(forward.output.data));
  const gradOutput = randomTensor(forward.output.dims, 5);
  const saved = { output: forward.output, logSumExp: forward.logSumExp };
  const expected = attn.sdpaBackward(q(), k(), v(), gradOutput, { isCausal: true, causalOffset: 1, saved });
  const passedOn = attn.sdpaBackward(q(), k(), v(), gradOutput, { ...forwardOptions, returnLogSumExp: undefined, saved });
  for (const name of ['dQuery', 'dKey', 'dValue']) expect(bits(passedOn[name].data)).toEqual(bits(expected[name].data));
  const instance = await createAttention({ threads: 1, bogus: undefined });
  instance.dispose();
  expectError(() => attn.sdpa(q(), k(), v(), { isCasual: true }), TypeError, [/^sdpa: unknown option "isCasual"; known options: /]);
  expectError(() => attn.sdpaBackward(q(), k(), v(), gradOutput, { ...forwardOptions, saved }), TypeError,
    [/^sdpaBackward: unknown option "returnLogSumExp" \(an option of sdpa only\)/]);
  await expect(createAttention({ bogus: 0 })).rejects.toThrow(/^createAttention: unknown option "bogus"/);
});

describe('allocation failure', () => {
  test('returnWeights needing 2.16 GB of wasm memory is a RangeError about memory; the instance keeps working', () => {
    expectError(hugeWeightsCall, RangeError, [/memory/, has(`${HUGE.Lq * HUGE.Lk * 4} bytes`), /weights/]);
    expectStillWorks();
  });

  test('weights past what JavaScript can hold (computed in slices of rows) are a RangeError naming them, before anything is computed', () => {
    // 131072 rows against 65536 keys: 2^33 weights, past a typed array's length in V8. The rows
    // would run a few at a time within wasm memory; the result cannot be made.
    const one = (L) => ({ data: new Float32Array(L).fill(0.5), dims: [1, 1, L, 1] });
    const before = attn.memory();
    expectError(() => attn.sdpa(one(131072), one(65536), one(65536), { returnWeights: true }), RangeError,
      [/^sdpa: options\.returnWeights: the weights \[1, 1, 131072, 65536\] would need 34359738368 bytes, which this JavaScript engine could not allocate \(/]);
    expect(attn.memory().bytesInUse).toBe(0);
    expect(attn.memory().peakBytes).toBe(before.peakBytes);
    expectStillWorks();
  });
});

describe('no leaks of wasm memory', () => {
  test('200 medium calls and 50 calls failing after allocation leave the heap as it was', async () => {
    const { module, release } = await moduleFor(attn.threads);
    try {
      // This is the module the API uses: a call needing more memory than the heap has grows it.
      const heapBefore = module.HEAPU8.length;
      const L = Math.ceil(heapBefore / 4 / 64 / 2);  // K and V together: the whole current heap
      const big = (D, seed) => randomTensor([1, 1, L, D], seed);
      attn.sdpa(big(64, 30), big(64, 31), big(64, 32), { isCausal: true, causalOffset: -L + 3 });
      expect(module.HEAPU8.length).toBeGreaterThan(heapBefore);

      // A medium problem: about 1 MB of inputs (Q, K, V 256 KB each, a 64 KB mask), and 1 MB
      // of weights every other call.
      const mq = randomTensor([1, 4, 256, 64], 40), mk = randomTensor([1, 4, 256, 64], 41);
      const mv = randomTensor([1, 4, 256, 64], 42);
      const mask = { data: new Uint8Array(256 * 256).fill(1), dims: [256, 256] };
      const medium = (rep) => attn.sdpa(mq, mk, mv, rep % 2 === 0
        ? { scale: 0.01 }
        : { attnMask: mask, returnWeights: true, keyLengths: new Int32Array([250]) });
      for (let rep = 0; rep < 4; rep++) medium(rep);  // warm up
      expect(hugeWeightsCall).toThrow(RangeError);

      const heapAfterWarmUp = module.HEAPU8.length, inUseAfterWarmUp = module.heapBytesInUse();
      const probe = module._malloc(16);
      expect(probe).not.toBe(0);
      module._free(probe);

      const first = medium(0).output.data.slice();
      for (let rep = 0; rep < 200; rep++) medium(rep);
      for (let rep = 0; rep < 50; rep++) expect(hugeWeightsCall).toThrow(RangeError);
      // Also errors thrown before any allocation.
      for (let rep = 0; rep < 20; rep++) expect(() => attn.sdpa(mq, mk, mv, { softcap: -1 })).toThrow(RangeError);

      expect(module.HEAPU8.length).toBe(heapAfterWarmUp);
      expect(module.heapBytesInUse()).toBe(inUseAfterWarmUp);
      const probeAgain = module._malloc(16);
      expect(probeAgain).toBe(probe);
      module._free(probeAgain);
      // And the results did not change.
      const again = medium(0).output.data;
      expect(new Uint32Array(again.buffer, again.byteOffset, again.length)).toEqual(new Uint32Array(first.buffer));
      expectStillWorks();
    } finally {
      release();
    }
  });
});

describe('no leaks with attention dropout', () => {
  test('sdpa (prefill, a decode of 4 MiB of K/V, weights), sdpaBackward (saved and not), KVCache.attend and sdpaVarlen with dropout, and calls refused for their dropout options, leave nothing allocated', () => {
    const query = q(), key = k(), value = v();
    const dropout = { dropoutP: 0.3, dropoutSeed: 2 ** 32 - 1 };
    const dq = randomTensor([2, 8, 1, 64], 60), dk = randomTensor([2, 2, 4200, 64], 61), dv = randomTensor([2, 2, 4200, 64], 62);
    const go = randomTensor([B, Hq, Lq, Ev], 63);
    const packedQ = randomTensor([9, 2, 8], 64), packedK = randomTensor([9, 1, 8], 65), packedV = randomTensor([9, 1, 8], 66);
    const cache = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: 16 });
    try {
      cache.append(key, value);
      const calls = () => {
        attn.sdpa(query, key, value, { ...dropout, isCausal: true, returnWeights: true, returnLogSumExp: true });
        attn.sdpa(dq, dk, dv, { ...dropout, keyLengths: Int32Array.of(3000, 4200) });
        const forward = attn.sdpa(query, key, value, { ...dropout, returnLogSumExp: true });
        attn.sdpaBackward(query, key, value, go, dropout);
        attn.sdpaBackward(query, key, value, go, { ...dropout, saved: forward });
        expect(() => attn.sdpaBackward(query, key, value, go, { ...dropout, dropoutSeed: 1, saved: forward })).toThrow(/dropout differs/);
        cache.attend(query, { ...dropout, returnWeights: true });
        attn.sdpaVarlen(packedQ, packedK, packedV, { ...dropout, cuSeqlensQ: Int32Array.of(0, 4, 9), isCausal: true });
        attn.sdpaVarlenBackward(packedQ, packedK, packedV, packedQ, { ...dropout, cuSeqlensQ: Int32Array.of(0, 4, 9) });
        expect(() => attn.sdpa(query, key, value, { dropoutP: 0.5 })).toThrow(TypeError);
        expect(() => attn.sdpa(dq, dk, dv, { dropoutP: 1, dropoutSeed: 1 })).toThrow(RangeError);
        expect(() => attn.sdpaBackward(query, key, value, go, { dropoutP: 0.5, dropoutSeed: -1 })).toThrow(RangeError);
        expect(() => cache.attend(query, { dropoutP: 0.5, dropoutSeed: 'x' })).toThrow(TypeError);
      };
      calls();  // warm up
      const before = attn.memory();
      for (let rep = 0; rep < 10; rep++) calls();
      const after = attn.memory();
      expect(after.bytesInUse).toBe(before.bytesInUse);  // the cache's storage alone
      expect(after.moduleBytesInUse).toBe(before.moduleBytesInUse);
      expect(after.capacityBytes).toBe(before.capacityBytes);
    } finally {
      cache.dispose();
    }
    expect(attn.memory().bytesInUse).toBe(0);
    expectStillWorks();
  });
});

describe('no leaks in streamed decoding', () => {
  test('streamed decodes, from a one-thread and a two-thread instance, leave the one-thread heap as it was', async () => {
    // Decodes with K and V of 4 MiB or more are streamed segment by segment on the
    // single-threaded build, also for an instance with threads > 1 (js/index.ts).
    const { module, release } = await moduleFor(1);
    const instances = await Promise.all([createAttention({ threads: 1 }), createAttention({ threads: 2 })]);
    try {
      const q = randomTensor([2, 8, 1, 64], 50), k = randomTensor([2, 2, 4200, 64], 51);
      const v = randomTensor([2, 2, 4200, 64], 52);
      const options = { keyLengths: new Int32Array([3000, 4200]) };
      for (const instance of instances) instance.sdpa(q, k, v, options);  // warm up
      const heapBefore = module.HEAPU8.length, inUseBefore = module.heapBytesInUse();
      const first = instances[0].sdpa(q, k, v, options).output.data.slice();
      for (let rep = 0; rep < 20; rep++) {
        for (const instance of instances) {
          const got = instance.sdpa(q, k, v, options).output.data;
          expect(new Uint32Array(got.buffer, got.byteOffset, got.length)).toEqual(new Uint32Array(first.buffer));
        }
      }
      expect(module.HEAPU8.length).toBe(heapBefore);
      expect(module.heapBytesInUse()).toBe(inUseBefore);
    } finally {
      for (const instance of instances) instance.dispose();
      release();
    }
  });
});

describe('no leaks in streamed prefill', () => {
  test('prefill streamed one (batch, KV head) at a time leaves the heap as it was, also after an error', async () => {
    // One thread, bhsd, Q + K + V >= 2 MiB, 920 KB a (batch, KV head): streamed per pair (js/index.ts).
    const { module, release } = await moduleFor(1);
    const instance = await createAttention({ threads: 1 });
    try {
      const q = randomTensor([2, 4, 600, 64], 60), k = randomTensor([2, 2, 600, 64], 61);
      const v = randomTensor([2, 2, 600, 64], 62);
      const out = new Float32Array(2 * 4 * 600 * 64);
      const options = { isCausal: true, keyLengths: new Int32Array([600, 450]) };
      instance.sdpa(q, k, v, options);  // warm up
      const heapBefore = module.HEAPU8.length, inUseBefore = module.heapBytesInUse();
      const first = instance.sdpa(q, k, v, options).output.data.slice();
      for (let rep = 0; rep < 10; rep++) {
        const got = instance.sdpa(q, k, v, rep % 2 ? options : { ...options, out }).output.data;
        expect(new Uint32Array(got.buffer, got.byteOffset, got.length)).toEqual(new Uint32Array(first.buffer));
        expect(() => instance.sdpa(q, k, v, { ...options, scale: NaN })).toThrow(RangeError);
      }
      expect(module.HEAPU8.length).toBe(heapBefore);
      expect(module.heapBytesInUse()).toBe(inUseBefore);
    } finally {
      instance.dispose();
      release();
    }
  });
});

describe('allocation sizes of 4 GiB and more', () => {
  // B·Hq·Lq·Lk·4 bytes of weights >= 2^32: far over the 2 GiB limit, so this must be the same
  // RangeError as above (and the instance must keep working), not a smaller allocation from a
  // size truncated to 32 bits followed by out-of-bounds writes. Run in a child process
  // (alloc-probe.mjs): a trap in a worker thread would otherwise end the whole Jest run.
  const probe = (threads, Lq, Lk) => {
    const script = fileURLToPath(new URL('./alloc-probe.mjs', import.meta.url));
    const env = { ...process.env };
    delete env.NODE_OPTIONS;
    // A correct run takes well under a second; the timeout only bounds a hang.
    const child = spawnSync(process.execPath, [script, String(threads), String(Lq), String(Lk), '1'], {
      encoding: 'utf8', timeout: 10000, env,
    });
    const line = (child.stdout ?? '').trim().split('\n').pop();
    let result = null;
    try {
      result = JSON.parse(line);
    } catch {
      // no result: the child crashed or hung; the test reports its stderr
    }
    return { status: child.status, signal: child.signal, result, stderr: (child.stderr ?? '').slice(0, 400) };
  };

  // 64 rows of one head (no slice of them keeps the bits: every slice would be at most 32 rows,
  // the kernel's other path) against 2^24 keys: exactly 2^32 bytes of weights, 0 if truncated.
  test.each([
    [1, 64, 2 ** 24], [1, 64, 2 ** 24 + 8192], ['default', 64, 2 ** 24 + 8192],
  ])('threads %p: returnWeights with Lq = %i, Lk = %i (E = 1) is a RangeError about memory', (threads, Lq, Lk) => {
    const outcome = probe(threads, Lq, Lk);
    const exit = outcome.status === 0
      ? 'exited normally'
      : `status ${outcome.status}, signal ${outcome.signal} (hung or crashed), stderr: ${outcome.stderr}`;
    expect(exit).toBe('exited normally');
    expect(outcome.result).toMatchObject({
      error: { name: 'RangeError', message: expect.stringMatching(/memory/) },
      stillWorks: true,
    });
    expect(outcome.result.error.message).toMatch(/weights/);
  });
});

describe('a typed-array option detached by a later option\'s getter is said to be detached, not blamed on its length', () => {
  const detach = (array) => structuredClone(array.buffer, { transfer: [array.buffer] });
  test.each([
    ['causalOffset', () => ({ isCausal: true, causalOffset: Int32Array.of(1, 2) }), /options\.causalOffset has no elements: its ArrayBuffer is detached .*; it must hold one offset per batch \(B = 2\)/],
    ['keyLengths', () => ({ keyLengths: Int32Array.of(7, 4) }), /options\.keyLengths has no elements: its ArrayBuffer is detached .*; it must hold one key index per batch \(B = 2\)/],
    ['keyStarts', () => ({ keyStarts: Int32Array.of(0, 1) }), /options\.keyStarts has no elements: its ArrayBuffer is detached .*; it must hold one key index per batch \(B = 2\)/],
    ['sinks', () => ({ sinks: Float32Array.of(0, 1, 2, 3) }), /options\.sinks has no elements: its ArrayBuffer is detached .*; it must hold one sink logit per query head \(Hq = 4\)/],
  ])('%s', (name, make, message) => {
    const options = make();
    const array = options[name];
    // `layout` is read after every other option (validate.ts, OPTION_NAMES).
    Object.defineProperty(options, 'layout', { enumerable: true, get() { detach(array); return undefined; } });
    expectError(() => attn.sdpa(q(), k(), v(), options), RangeError, [message]);
  });
});

describe('the public classes are made by their factories: `new` from JavaScript is a TypeError naming the factory', () => {
  test.each([
    ['Attention', /^Attention: use await createAttention\(options\?\) to make one \(its constructor is internal\)$/],
    ['KVCache', /^KVCache: use attn\.createKVCache\(options\) to make one/],
    ['AttentionWorker', /^AttentionWorker: use await createAttentionWorker\(options\?\) to make one/],
    ['WorkerKVCache', /^WorkerKVCache: use await worker\.createKVCache\(options\) to make one/],
    ['KVCacheShapeInfo', /^KVCacheShapeInfo: the base of KVCache and WorkerKVCache; use attn\.createKVCache\(\) or worker\.createKVCache\(\)/],
  ])('new %s()', async (name, message) => {
    const api = await import('sdpa-wasm');
    // (Without the gate: "Cannot read properties of undefined (reading 'threads')" and the like.)
    expectError(() => new api[name](), TypeError, [message]);
    expectError(() => new api[name]({ batch: 1, kvHeads: 1, headDim: 1, valueDim: 1, maxLength: 1, dtype: 'float32' }), TypeError, [message]);
  });

  test('the factories still make them, and the instance keeps working', async () => {
    const other = await createAttention({ threads: 1 });
    try {
      const cache = other.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 8 });
      expect(cache).toBeInstanceOf((await import('sdpa-wasm')).KVCache);
      cache.dispose();
    } finally {
      other.dispose();
    }
  });
});
