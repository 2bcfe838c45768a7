// Memory you can see and bound (issue #12): attn.memory(), createAttention({ maxMemoryBytes }),
// refusals before anything is allocated (RangeError: bytes needed, the limit) that leave the
// instance and its caches working, no leaks over 10,000 mixed calls (direct, packed, cache and worker;
// valid and failing), and inputs that are unusual in memory: SharedArrayBuffer-backed, detached
// (transferred) buffers, and `out` aliasing an input.
import { createAttention, createAttentionWorker } from 'sdpa-wasm';
// The internal loader (not public API): gives the Emscripten module an instance runs on.
import * as loader from '../../dist/loader.js';
import { maxRelError, mulberry32, randomTensor, referenceSdpa } from './reference.mjs';

const TOL = 2e-5;
const GIB2 = 2 ** 31;
const t = (data, dims) => ({ data, dims });
const bitsOf = (a) => new Uint32Array(a.buffer, a.byteOffset, a.length);
/** Same length and bits; on a difference, reports the first one (toEqual on arrays of 10^6 numbers takes seconds). */
function expectBitwiseEqual(a, b) {
  const got = bitsOf(a), expected = bitsOf(b);
  let first = -1;
  for (let i = 0; i < Math.min(got.length, expected.length) && first < 0; i++) if (got[i] !== expected[i]) first = i;
  const at = (bits) => (first < 0 ? null : bits[first]);
  expect({ length: got.length, firstDifference: first, bits: at(got) })
    .toEqual({ length: expected.length, firstDifference: -1, bits: at(expected) });
}

/** The error fn throws (undefined if none); async calls are awaited. */
async function errorOf(fn) {
  try {
    await fn();
  } catch (error) {
    return error;
  }
  return undefined;
}

function expectError(error, Cls, patterns) {
  expect(error).toBeInstanceOf(Cls);
  expect(error.constructor).toBe(Cls);
  for (const pattern of patterns) expect(error.message).toMatch(pattern);
}

/** A small problem [B, H, L, E] (GQA, Ev ≠ E) and its float64 reference output. */
function smallProblem(seed, { B = 2, Hq = 4, Hkv = 2, Lq = 5, Lk = 9, E = 8, Ev = 6 } = {}) {
  return {
    query: randomTensor([B, Hq, Lq, E], seed),
    key: randomTensor([B, Hkv, Lk, E], seed + 1),
    value: randomTensor([B, Hkv, Lk, Ev], seed + 2),
  };
}

function expectMatchesReference(attn, { query, key, value }, options = {}) {
  const got = attn.sdpa(query, key, value, options).output.data;
  expect(maxRelError(got, referenceSdpa(query, key, value, options).output)).toBeLessThanOrEqual(TOL);
}

describe('attn.memory()', () => {
  test.each([1, 2])('threads %p: reports bytes in use, peak, capacity and the default limit', async (threads) => {
    const attn = await createAttention({ threads });
    try {
      const created = attn.memory();
      expect(Object.keys(created).sort()).toEqual(['bytesInUse', 'capacityBytes', 'limitBytes', 'moduleBytesInUse', 'peakBytes']);
      expect(created.bytesInUse).toBe(0);
      expect(created.peakBytes).toBe(0);
      expect(created.limitBytes).toBe(GIB2);
      expect(created.capacityBytes).toBeGreaterThanOrEqual(created.moduleBytesInUse);
      // The module's heap figure after a first call big enough to use every thread (the
      // runtime and a pool thread's first job may set up state once).
      expectMatchesReference(attn, smallProblem(2, { Lq: 64, Lk: 300 }));
      const fresh = attn.memory();

      // A call's blocks count while it runs (the peak), and are freed when it returns.
      const p = smallProblem(1, { Lq: 64, Lk: 300 });
      attn.sdpa(p.query, p.key, p.value, { returnWeights: true });
      const afterCall = attn.memory();
      expect(afterCall.bytesInUse).toBe(0);
      const inputsAndOutputs = 4 * (p.query.data.length + p.key.data.length + p.value.data.length +
        2 * 4 * 64 * 6 + 2 * 4 * 64 * 300);
      expect(afterCall.peakBytes).toBeGreaterThanOrEqual(inputsAndOutputs);
      expect(afterCall.moduleBytesInUse).toBe(fresh.moduleBytesInUse);

      // A cache's storage counts until it is disposed.
      const cache = attn.createKVCache({ batch: 2, kvHeads: 2, headDim: 8, valueDim: 6, maxLength: 1000, dtype: 'float16' });
      expect(cache.byteLength).toBe(2 * 2 * 1000 * (8 + 6) * 2);
      expect(attn.memory().bytesInUse).toBe(cache.byteLength);
      expect(attn.memory().moduleBytesInUse).toBeGreaterThanOrEqual(fresh.moduleBytesInUse + cache.byteLength);
      cache.dispose();
      expect(attn.memory().bytesInUse).toBe(0);
      expect(attn.memory().moduleBytesInUse).toBe(fresh.moduleBytesInUse);
    } finally {
      attn.dispose();
    }
    expect(() => attn.memory()).toThrow(/memory: this Attention instance has been disposed/);
  });

  test('instances count their own bytes; the module figures are shared', async () => {
    const a = await createAttention({ threads: 1 });
    const b = await createAttention({ threads: 1 });
    try {
      const cache = a.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 256 });
      expect(a.memory().bytesInUse).toBe(cache.byteLength);
      expect(b.memory().bytesInUse).toBe(0);
      expect(b.memory().moduleBytesInUse).toBe(a.memory().moduleBytesInUse);
    } finally {
      a.dispose();
      b.dispose();
    }
  });
});

describe('createAttention({ maxMemoryBytes })', () => {
  test.each([
    ['a string', '1MB', TypeError, [/createAttention: options\.maxMemoryBytes must be a number, got "1MB"/]],
    ['0', 0, RangeError, [/options\.maxMemoryBytes must be an integer in \[1, 2147483648\]/, /got 0$/]],
    ['negative', -5, RangeError, [/options\.maxMemoryBytes/, /got -5$/]],
    ['fractional', 1.5, RangeError, [/options\.maxMemoryBytes/, /got 1\.5$/]],
    ['NaN', NaN, RangeError, [/options\.maxMemoryBytes/, /got NaN$/]],
    ['past the wasm limit', GIB2 + 1, RangeError, [/options\.maxMemoryBytes/, /2 GiB/, /got 2147483649$/]],
  ])('rejects %s', async (_, maxMemoryBytes, Cls, patterns) => {
    expectError(await errorOf(() => createAttention({ maxMemoryBytes })), Cls, patterns);
    expectError(await errorOf(() => createAttentionWorker({ maxMemoryBytes })), Cls,
      patterns.map((re) => new RegExp(re.source.replace('createAttention', 'createAttentionWorker'))));
  });

  const LIMIT = 128 * 1024;

  test.each([1, 2])('threads %p: calls and caches past the limit are refused before allocating; the instance keeps working', async (threads) => {
    const attn = await createAttention({ threads, maxMemoryBytes: LIMIT });
    try {
      expect(attn.memory().limitBytes).toBe(LIMIT);
      const small = smallProblem(3);
      // Warm up (a call big enough to use every thread: a pool thread's first job may set up
      // state once), then take the module's figure.
      expectMatchesReference(attn, smallProblem(4, { Lq: 64, Lk: 64 }));
      expectMatchesReference(attn, small);
      const { moduleBytesInUse } = attn.memory();

      // 256 × 64 floats of K and of V alone are 128 KiB: even a slice of Q's rows (the least
      // that keeps the bits: 44 of 256) does not fit.
      const big = smallProblem(5, { B: 1, Hq: 1, Hkv: 1, Lq: 256, Lk: 256, E: 64, Ev: 64 });
      const error = await errorOf(() => attn.sdpa(big.query, big.key, big.value));
      expectError(error, RangeError, [
        /^sdpa: needs \d+ bytes of wasm memory to run 44 query rows of one query head at a time/,
        /\(query 11264 bytes \+ key 65536 bytes \+ value 65536 bytes/,
        new RegExp(`limit of ${LIMIT} bytes \\(maxMemoryBytes\\), of which 0 are in use`)]);
      expect(attn.memory().bytesInUse).toBe(0);
      expect(attn.memory().moduleBytesInUse).toBe(moduleBytesInUse);
      expectMatchesReference(attn, small);

      // A cache that fits, then one that does not fit beside it.
      const cache = attn.createKVCache({ batch: 1, kvHeads: 2, headDim: 8, maxLength: 1024, dtype: 'float16' });
      expect(cache.byteLength).toBe(65536);
      expect(attn.memory().bytesInUse).toBe(65536);
      expectError(await errorOf(() => attn.createKVCache({ batch: 1, kvHeads: 2, headDim: 8, maxLength: 1100, dtype: 'float16' })),
        RangeError, [/^createKVCache: needs 70400 bytes of wasm memory \(keys 35200 bytes \+ values 35200 bytes\)/,
          /of which 65536 are in use/]);
      expect(attn.memory().bytesInUse).toBe(65536);
      const other = attn.createKVCache({ batch: 1, kvHeads: 2, headDim: 8, maxLength: 64 });  // 8 KiB
      expect(attn.memory().bytesInUse).toBe(73728);

      // With the caches holding 72 KiB, calls needing more than the rest fail; the cache is unchanged.
      cache.append(randomTensor([1, 2, 10, 8], 7), randomTensor([1, 2, 10, 8], 8));
      const q = randomTensor([1, 4, 2, 8], 9);
      const before = cache.attend(q).output.data;
      // (Its least: one (batch, KV head), half the query. 1201 rows a head: a slice of one query
      // head, or of its rows, would split the kernel's row tiles of 4 flat rows (head g's start
      // at g·1201), so it would not give the bits of the whole call; 1200 rows would run a few
      // rows at a time.)
      expectError(await errorOf(() => cache.attend(randomTensor([1, 4, 1201, 8], 10))), RangeError,
        [/^KVCache\.attend: needs \d+ bytes of wasm memory to run one \(batch, KV head\) at a time \(query 76864 bytes \+ output 76864 bytes/,
          /of which 73728 are in use/]);
      // Float32 rows into a float16 cache are staged (converted in wasm memory): 1000 rows × 2
      // heads × 8 dims × 4 bytes = 64,000 bytes, past the limit beside 72 KiB: staged 512 at a
      // time instead (a 32 KiB buffer, the 1 MiB halved until it fits; their bits:
      // tests/node/kv-cache.test.mjs).
      cache.append(randomTensor([1, 1000, 2, 8], 11), randomTensor([1, 1000, 2, 8], 12), { layout: 'bshd' });
      expect(cache.length).toBe(1010);
      expect(attn.memory().peakBytes).toBeLessThanOrEqual(LIMIT);
      cache.truncate(10);
      // With 32 bytes left beside the caches, not even one position (64 bytes) can be staged:
      // refused, nothing appended.
      const filler = attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 1791 });  // 57,312 bytes
      expectError(await errorOf(() => cache.append(randomTensor([1, 1000, 2, 8], 11), randomTensor([1, 1000, 2, 8], 12), { layout: 'bshd' })),
        RangeError, [/^KVCache\.append: needs 64 bytes of wasm memory/, /of which 131040 are in use/]);
      expect(cache.length).toBe(10);
      filler.dispose();
      expectBitwiseEqual(cache.attend(q).output.data, before);
      other.dispose();
      cache.dispose();
      expect(attn.memory().bytesInUse).toBe(0);
      expect(attn.memory().peakBytes).toBeLessThanOrEqual(LIMIT);
      expect(attn.memory().moduleBytesInUse).toBe(moduleBytesInUse);
      expectMatchesReference(attn, small);
    } finally {
      attn.dispose();
    }
  });

  test('the default limit refuses what cannot fit in 2 GiB with the same kind of message', async () => {
    const attn = await createAttention({ threads: 1 });
    try {
      // 36 rows of one head against 15,000,000 keys: 2.16 GB of weights. (A longer query would
      // run a few rows at a time; 36 rows have no smaller slice that keeps the bits: every slice
      // would be at most 32 rows, which the kernel computes on another path.)
      const Lq = 36, Lk = 15e6;
      const one = (L) => ({ data: new Float32Array(L).fill(0.5), dims: [1, 1, L, 1] });
      expectError(await errorOf(() => attn.sdpa(one(Lq), one(Lk), one(Lk), { returnWeights: true })), RangeError,
        [/^sdpa: needs \d+ bytes/, new RegExp(`weights ${Lq * Lk * 4} bytes`), /limit of 2147483648 bytes \(2 GiB/]);
      expect(attn.memory().bytesInUse).toBe(0);
      expectMatchesReference(attn, smallProblem(4));
    } finally {
      attn.dispose();
    }
  });

  test('another instance\'s cache counts against the module\'s 2 GiB: refused before allocating, both keep working', async () => {
    // Two instances on one build share its wasm memory. `b` is far from its own (default)
    // limit, but its cache cannot fit beside `a`'s in the module's 2 GiB.
    const a = await createAttention({ threads: 1 });
    const b = await createAttention({ threads: 1 });
    try {
      const shape = { batch: 1, kvHeads: 8, headDim: 128, dtype: 'float32' };  // 8 KiB a position
      const held = a.createKVCache({ ...shape, maxLength: 160 * 1024 });       // 1.25 GiB
      const { moduleBytesInUse } = b.memory();
      expect(moduleBytesInUse).toBeGreaterThanOrEqual(held.byteLength);
      expectError(await errorOf(() => b.createKVCache({ ...shape, maxLength: 128 * 1024 })), RangeError, [
        /^createKVCache: needs 1073741824 bytes of wasm memory \(keys 536870912 bytes \+ values 536870912 bytes\)/,
        /more than is left: the module's memory is limited to 2 GiB \(2147483648 bytes\), of which \d+ are in use$/]);
      expect(b.memory().bytesInUse).toBe(0);
      expect(b.memory().moduleBytesInUse).toBe(moduleBytesInUse);
      expectMatchesReference(b, smallProblem(6));
      // The cache that holds the memory works, and freeing it makes room.
      const key = randomTensor([1, 8, 3, 128], 7), value = randomTensor([1, 8, 3, 128], 8);
      held.append(key, value);
      const query = randomTensor([1, 8, 1, 128], 9);
      const got = held.attend(query).output.data;
      expect(maxRelError(got, referenceSdpa(query, key, value).output)).toBeLessThanOrEqual(TOL);
      held.dispose();
      b.createKVCache({ ...shape, maxLength: 128 * 1024 }).dispose();
    } finally {
      a.dispose();
      b.dispose();
    }
  });

  test('with the module\'s 2 GiB all but full, packed sequences (150,000 of one row) are refused or run: the kernel allocates nothing beyond the request', async () => {
    // The packed kernel ordered its sequences in two std::vectors (20 bytes a sequence), which no
    // request counted: with the memory all but full a call was admitted and the kernel's
    // operator new aborted the module (RuntimeError: Aborted(), its blocks leaked). The order is
    // now in the call's scratch. A cache that fills the memory, as large as fits (to 64 KiB):
    // what it leaves (a few MB, as malloc's blocks fall) holds this call's request, where the old
    // kernel aborted; it runs now.
    const attn = await createAttention({ threads: 1 });
    const start = attn.memory().moduleBytesInUse;
    const shape = { batch: 1, kvHeads: 1, headDim: 1 };  // 8 bytes a position
    const fits = (maxLength) => { try { attn.createKVCache({ ...shape, maxLength }).dispose(); return true; } catch { return false; } };
    let lo = 1, hi = 2 ** 28;  // 2 GiB: too large
    while (hi - lo > 8192) {
      const mid = Math.floor((lo + hi) / 2);
      if (fits(mid)) lo = mid; else hi = mid;
    }
    const filler = attn.createKVCache({ ...shape, maxLength: lo });
    try {
      const S = 150000;
      const q = randomTensor([S, 1, 1], 1), k = randomTensor([S, 1, 1], 2), v = randomTensor([S, 1, 1], 3);
      const cuSeqlensQ = Int32Array.from({ length: S + 1 }, (_, i) => i);
      let outcome;
      try {
        const { output } = attn.sdpaVarlen(q, k, v, { cuSeqlensQ });
        // One key a sequence: each row's output is its value.
        outcome = { ran: true, valuesOut: output.data.every((x, i) => x === v.data[i]) };
      } catch (error) {
        outcome = { error: error.constructor.name, message: error.message };
      }
      expect(outcome).toEqual(expect.objectContaining(outcome.ran ? { valuesOut: true } : {
        error: 'RangeError', message: expect.stringMatching(/^sdpaVarlen: (needs|cannot allocate) \d+ bytes of wasm memory/),
      }));
      expect(attn.memory().bytesInUse).toBe(filler.byteLength);
    } finally {
      filler.dispose();
    }
    expect(attn.memory().bytesInUse).toBe(0);
    expect(attn.memory().moduleBytesInUse).toBe(start);
    expectMatchesReference(attn, smallProblem(11));
    attn.dispose();
  });

  test('near the module\'s 2 GiB, a request is asked of malloc before it counts as fitting (static data, stack and fragmentation count too)', async () => {
    // MemoryAccount against a stand-in module whose memory is grown to 2 GiB: the sum of the
    // bytes in use and the request fits, but malloc decides. (A real instance reached this in a
    // review: a call within 4 MB of what the sum left threw "cannot allocate" instead of running
    // in slices, which CallMemory.fits() chooses when refusal() says so.)
    const { MemoryAccount } = await import('../../dist/memory.js');
    const calls = [];
    const module = (mallocResult) => ({
      HEAPU8: { length: GIB2 - 4096 }, heapBytesInUse: () => GIB2 - 2 ** 20,
      _malloc: (bytes) => { calls.push(['malloc', bytes]); return mallocResult; },
      _free: (address) => calls.push(['free', address]),
    });
    const account = new MemoryAccount();
    const request = { query: 100000, scratch: 1000 };  // 101,000 bytes: within the sum's 1 MiB
    expect(account.refusal(module(0), 'sdpa', request, 101000, ' to run one (batch, KV head) at a time')).toBe(
      'sdpa: needs 101000 bytes of wasm memory to run one (batch, KV head) at a time (query 100000 bytes + scratch 1000 bytes), ' +
      `more than is left: the module's memory is limited to 2 GiB (${GIB2} bytes), of which ${GIB2 - 2 ** 20} are in use (no free block of that size)`);
    // allocateAll's block: each part padded to 64 bytes, and 56 bytes to reach the first boundary.
    expect(calls).toEqual([['malloc', 100032 + 1024 + 56]]);
    calls.length = 0;
    expect(account.refusal(module(4096), 'sdpa', request, 101000)).toBeNull();
    expect(calls).toEqual([['malloc', 101112], ['free', 4096]]);
    // Past the sum, refused without asking; far from 2 GiB, fits without asking.
    calls.length = 0;
    expect(account.refusal(module(4096), 'sdpa', { query: 2 ** 20 + 1 }, 2 ** 20 + 1)).toMatch(/of which \d+ are in use$/);
    expect(account.refusal({ ...module(4096), HEAPU8: { length: 2 ** 24 } }, 'sdpa', request, 101000)).toBeNull();
    expect(calls).toEqual([]);
    expect(account.bytesInUse).toBe(0);
  });

  test('through a worker: the limit holds there, refusals are the same RangeError, worker.memory() reports it', async () => {
    const worker = await createAttentionWorker({ threads: 1, maxMemoryBytes: LIMIT });
    const attn = await createAttention({ threads: 1, maxMemoryBytes: LIMIT });
    try {
      const fresh = await worker.memory();
      expect(fresh.limitBytes).toBe(LIMIT);
      expect(fresh.bytesInUse).toBe(0);
      const big = smallProblem(5, { B: 1, Hq: 1, Hkv: 1, Lq: 128, Lk: 128, E: 64, Ev: 64 });
      const direct = await errorOf(() => attn.sdpa(big.query, big.key, big.value));
      const viaWorker = await errorOf(() => worker.sdpa(big.query, big.key, big.value));
      expectError(viaWorker, RangeError, [/^sdpa: needs \d+ bytes/]);
      expect(viaWorker.message).toBe(direct.message);
      const cache = await worker.createKVCache({ batch: 1, kvHeads: 1, headDim: 8, maxLength: 256 });
      expect((await worker.memory()).bytesInUse).toBe(cache.byteLength);
      await cache.dispose();
      const small = smallProblem(6);
      const result = await worker.sdpa(small.query, small.key, small.value);
      expectBitwiseEqual(result.output.data, attn.sdpa(small.query, small.key, small.value).output.data);
      expect((await worker.memory()).bytesInUse).toBe(0);
    } finally {
      attn.dispose();
      await worker.dispose();
    }
  });
});

describe('sdpa() past maxMemoryBytes runs a slice of batches and KV heads at a time: the bits of the whole copy', () => {
  // B·Hkv = 15 (batch, KV head) pairs, GQA (2 query heads per KV head), Lq ≠ Lk, Ev ≠ E. Where
  // the whole copy would pass the limit, sdpa() runs slices of 2 batches (the third alone), or
  // 5, 3, 2 or 1 KV heads of one batch (3 and 2 leave a smaller last slice): the largest that
  // fit, each on all the threads.
  const B = 3, Hq = 10, Hkv = 5, Lq = 37, Lk = 600, E = 32, Ev = 24;
  const query = randomTensor([B, Hq, Lq, E], 401), key = randomTensor([B, Hkv, Lk, E], 402);
  const value = randomTensor([B, Hkv, Lk, Ev], 403);
  // Keys past keyLengths hold NaN: a slice must not read them either.
  const keyLengths = new Int32Array([600, 531, 588]), keyStarts = new Int32Array([0, 7, 1]);
  for (let h = 0; h < Hkv; h++) key.data.fill(NaN, ((Hkv + h) * Lk + 531) * E, (Hkv + h + 1) * Lk * E);
  const random = mulberry32(404);
  const floatMask = (dims) => ({ data: Float32Array.from({ length: dims.reduce((a, b) => a * b) }, () => (random() < 0.2 ? -Infinity : random() * 4 - 2)), dims });
  const boolMask = (dims) => ({ data: Uint8Array.from({ length: dims.reduce((a, b) => a * b) }, () => Number(random() < 0.7)), dims });
  const slopes = (n) => Float32Array.from({ length: n }, (_, i) => 2 ** -(1 + (i % Hq)));
  const cases = {
    'key lengths and starts, per-batch causal offsets, a sliding window, a float mask [B, 1, Lq, Lk]': {
      keyLengths, keyStarts, isCausal: true, causalOffset: new Int32Array([563, 490, -5]), slidingWindow: 200, attnMask: floatMask([B, 1, Lq, Lk]),
    },
    'a bool mask [1, Hq, Lq, Lk], softcap, sinks, ALiBi [B, Hq]': {
      keyLengths, attnMask: boolMask([1, Hq, Lq, Lk]), softcap: 3, sinks: Float32Array.from({ length: Hq }, (_, h) => h - 4),
      alibiSlopes: slopes(B * Hq),
    },
    'a float mask [Lk], dropout, the weights and the log-sum-exp': {
      keyLengths, attnMask: floatMask([Lk]), dropoutP: 0.3, dropoutSeed: 77, returnWeights: true, returnLogSumExp: true,
    },
    'a bool mask [B, Hq, 1, Lk], causal ALiBi [Hq], a scale': {
      keyLengths, attnMask: boolMask([B, Hq, 1, Lk]), isCausal: true, alibiSlopes: slopes(Hq), scale: 0.7,
    },
  };
  // bshd: the same tensors with their H and L axes swapped.
  const swap = ({ data, dims: [b, h, l, d] }) => {
    const out = new Float32Array(data.length);
    for (let i = 0; i < b * h * l; i++) {
      const bb = Math.floor(i / (h * l)), hh = Math.floor(i / l) % h, ll = i % l;
      out.set(data.subarray(i * d, (i + 1) * d), ((bb * l + ll) * h + hh) * d);
    }
    return { data: out, dims: [b, l, h, d] };
  };
  const inputs = { bhsd: [query, key, value], bshd: [query, key, value].map(swap) };
  const bshd = { layout: 'bshd' };
  /**
   * The call on a fresh instance without a limit, and the memory it took: two threads, where
   * Q, K and V are copied in whole (one thread streams a large prefill one (batch, KV head) at a
   * time, runSlices too).
   */
  const unlimited = async (q, k, v, options) => {
    const attn = await createAttention({ threads: 2 });
    try {
      return { result: attn.sdpa(q, k, v, options), peak: attn.memory().peakBytes };
    } finally {
      attn.dispose();
    }
  };

  test.each(Object.keys(cases).flatMap((name) => [[name, 'bhsd'], [name, 'bshd']]))('%s (%s): threads 1 and 2, four limits, bitwise the whole copy; within the reference', async (name, layout) => {
    const options = layout === 'bshd' ? { ...cases[name], ...bshd } : cases[name];
    const [q, k, v] = inputs[layout];
    const { result: expected, peak: wholePeak } = await unlimited(q, k, v, options);
    const ref = referenceSdpa(q, k, v, options);
    expect(maxRelError(expected.output.data, ref.output)).toBeLessThanOrEqual(TOL);
    if (options.returnWeights) expect(maxRelError(expected.weights.data, ref.weights)).toBeLessThanOrEqual(TOL);
    for (const threads of [1, 2]) {
      for (const share of [0.8, 0.5, 0.3, 0.2]) {
        const limit = Math.floor(wholePeak * share);
        const attn = await createAttention({ threads, maxMemoryBytes: limit });
        try {
          const got = attn.sdpa(q, k, v, options);
          expectBitwiseEqual(got.output.data, expected.output.data);
          expect(got.output.dims).toEqual(expected.output.dims);
          if (options.returnWeights) expectBitwiseEqual(got.weights.data, expected.weights.data);
          if (options.returnLogSumExp) expectBitwiseEqual(got.logSumExp.data, expected.logSumExp.data);
          expect(attn.memory().peakBytes).toBeLessThanOrEqual(limit);
          expect(attn.memory().bytesInUse).toBe(0);
          // The same instance, unlimited by this call, keeps working.
          expectMatchesReference(attn, smallProblem(410));
        } finally {
          attn.dispose();
        }
      }
    }
  });

  test('into out, and into an out that is an input or overlaps the mask (then written after every slice was read)', async () => {
    const limit = 1024 * 1024;
    const attn = await createAttention({ threads: 2, maxMemoryBytes: limit });
    try {
      const L = 420;  // Q, K and V of 2.15 MB: on one thread, a prefill streamed a (batch, KV head) at a time
      const square = { q: randomTensor([B, Hq, L, E], 405), k: randomTensor([B, Hkv, L, E], 406), v: randomTensor([B, Hkv, L, E], 407) };
      const options = { isCausal: true, attnMask: floatMask([B, 1, 1, L]) };
      const { result, peak } = await unlimited(square.q, square.k, square.v, options);
      const expected = result.output.data;
      expect(peak).toBeGreaterThan(2 * limit);
      const out = new Float32Array(expected.length);
      expect(attn.sdpa(square.q, square.k, square.v, { ...options, out }).output.data).toBe(out);
      expectBitwiseEqual(out, expected);
      const inPlace = { data: square.q.data.slice(), dims: square.q.dims };
      expect(attn.sdpa(inPlace, square.k, square.v, { ...options, out: inPlace.data }).output.data).toBe(inPlace.data);
      expectBitwiseEqual(inPlace.data, expected);
      // out in the same buffer as a bool mask [B, Hq, L, L] (read slice by slice), its first half
      // over the mask's last bytes (the last batch's, which the first slices' outputs would
      // overwrite before the last slices read them): on this limited instance (slices), and on an unlimited
      // one-thread instance (whose large prefill streams one (batch, KV head) at a time, runSlices too).
      const maskDims = [B, Hq, L, L], maskSize = B * Hq * L * L;
      const mask = boolMask(maskDims);
      const withMask = (await unlimited(square.q, square.k, square.v, { attnMask: mask })).result.output.data;
      const single = await createAttention({ threads: 1 });
      try {
        for (const instance of [attn, single]) {
          const outBytes = expected.length * 4;
          const buffer = new ArrayBuffer(maskSize + outBytes / 2);
          const overlapping = { data: new Uint8Array(buffer, 0, maskSize), dims: maskDims };
          overlapping.data.set(mask.data);
          const out = new Float32Array(buffer, maskSize - outBytes / 2, expected.length);
          instance.sdpa(square.q, square.k, square.v, { attnMask: overlapping, out });
          expectBitwiseEqual(out, withMask);
        }
      } finally {
        single.dispose();
      }
      expect(attn.memory().peakBytes).toBeLessThanOrEqual(limit);
    } finally {
      attn.dispose();
    }
  });

  test('a large decode (K + V >= 4 MiB, streamed where it fits) whose streamed way passes the limit (its whole mask) runs in slices: the same bits', async () => {
    const Bd = 2, H = 16, Lkd = 8192, Ed = 8;
    const q1 = randomTensor([Bd, H, 1, Ed], 411), k = randomTensor([Bd, H, Lkd, Ed], 412), v = randomTensor([Bd, H, Lkd, Ed], 413);
    const options = { attnMask: floatMask([Bd, H, 1, Lkd]) };  // 1 MiB, copied whole by the streamed decode
    const { result: expected } = await unlimited(q1, k, v, options);
    const limit = 768 * 1024;
    for (const threads of [1, 2]) {
      const attn = await createAttention({ threads, maxMemoryBytes: limit });
      try {
        expectBitwiseEqual(attn.sdpa(q1, k, v, options).output.data, expected.output.data);
        expect(attn.memory().peakBytes).toBeLessThanOrEqual(limit);
        expect(attn.memory().bytesInUse).toBe(0);
      } finally {
        attn.dispose();
      }
    }
  });

  test('a decode (Lq = 1) with its weights, and through a worker', async () => {
    const q1 = randomTensor([B, Hq, 1, E], 408);
    const options = { keyLengths, returnWeights: true };
    const { result: expected, peak } = await unlimited(q1, key, value, options);
    const limit = 256 * 1024;
    expect(peak).toBeGreaterThan(2 * limit);
    const attn = await createAttention({ threads: 2, maxMemoryBytes: limit });
    const worker = await createAttentionWorker({ threads: 1, maxMemoryBytes: limit });
    try {
      for (const got of [attn.sdpa(q1, key, value, options), await worker.sdpa(q1, key, value, options)]) {
        expectBitwiseEqual(got.output.data, expected.output.data);
        expectBitwiseEqual(got.weights.data, expected.weights.data);
      }
      expect(attn.memory().peakBytes).toBeLessThanOrEqual(limit);
      expect((await worker.memory()).peakBytes).toBeLessThanOrEqual(limit);
    } finally {
      attn.dispose();
      await worker.dispose();
    }
  });

  test('a refusal names the least any way of running the call needs: a limit of that many bytes runs it, one byte less is refused (1 to 3 threads)', async () => {
    // Few (batch, KV head) pairs for the threads: a smaller slice may need more scratch than a
    // larger one, or than the whole copy (the backward then splits each pair's keys and rows).
    const p = smallProblem(420, { B: 4, Hq: 5, Hkv: 5, Lq: 1, Lk: 1, E: 2, Ev: 20 });
    const gradOutput = randomTensor([4, 5, 1, 20], 424);
    // And a decode of K and V of 4 MiB: streamed (one segment of keys at a time) where that fits.
    const decode = { query: randomTensor([1, 1, 1, 8], 425), key: randomTensor([1, 1, 65536, 8], 426), value: randomTensor([1, 1, 65536, 8], 427) };
    const calls = {
      sdpa: (attn) => attn.sdpa(p.query, p.key, p.value),
      sdpaBackward: (attn) => attn.sdpaBackward(p.query, p.key, p.value, gradOutput),
      'sdpa (a decode)': (attn) => attn.sdpa(decode.query, decode.key, decode.value),
    };
    for (const threads of [1, 2, 3]) {
      for (const [name, call] of Object.entries(calls)) {
        const needs = async (limit) => {
          const attn = await createAttention({ threads, maxMemoryBytes: limit });
          try {
            const error = await errorOf(() => call(attn));
            expect(attn.memory().bytesInUse).toBe(0);
            if (error === undefined) return null;
            expectError(error, RangeError, [new RegExp(`^${name.split(' ')[0]}: needs \\d+ bytes of wasm memory`)]);
            return Number(/needs (\d+) bytes/.exec(error.message)[1]);
          } finally {
            attn.dispose();
          }
        };
        const least = await needs(64);
        expect([threads, name, await needs(least)]).toEqual([threads, name, null]);
        expect([threads, name, await needs(least - 1)]).toEqual([threads, name, least]);
      }
    }
  });

  // KVCache.attend(): the cache's storage stays where it is; the query, output, weights and
  // log-sum-exp (and the mask) go through wasm memory a slice at a time when all at once would
  // pass the limit beside the cache.
  /** A cache on `attn` holding key, value (appended 4 positions at a time: a float16 cache stages each append, 7,680 bytes). */
  const filledCache = (attn, dtype) => {
    const cache = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: Lk, dtype });
    const rows = (t, from, to) => {
      const [b, h, , d] = t.dims, data = new Float32Array(b * h * (to - from) * d);
      for (let i = 0; i < b * h; i++) data.set(t.data.subarray((i * Lk + from) * d, (i * Lk + to) * d), i * (to - from) * d);
      return { data, dims: [b, h, to - from, d] };
    };
    for (let at = 0; at < Lk; at += 4) cache.append(rows(key, at, at + 4), rows(value, at, at + 4));
    return cache;
  };
  /**
   * cache.attend(q, options) on a fresh instance with `threads` and `maxMemoryBytes` set to the
   * cache's bytes + `callLimit`: `{ got }`, or the error it threw.
   */
  const attendLimited = async (dtype, threads, callLimit, q, options) => {
    const bytesPerElement = dtype === 'float32' ? 4 : 2;
    const cacheBytes = B * Hkv * Lk * (E + Ev) * bytesPerElement;
    const attn = await createAttention({ threads, maxMemoryBytes: cacheBytes + callLimit });
    try {
      const cache = filledCache(attn, dtype);
      expect(cache.byteLength).toBe(cacheBytes);
      let result;
      try {
        result = { got: cache.attend(q, options) };
      } catch (error) {
        result = error;
      }
      expect(attn.memory().bytesInUse).toBe(cacheBytes);
      expect(attn.memory().peakBytes).toBeLessThanOrEqual(cacheBytes + callLimit);
      return result;
    } finally {
      attn.dispose();
    }
  };

  // bfloat16 on the first case: its reading is float16's (the same 16-bit paths, src/sdpa.h).
  test.each([...Object.keys(cases).flatMap((name) => [[name, 'float32'], [name, 'float16']]), [Object.keys(cases)[0], 'bfloat16']])('KVCache.attend past the limit beside its cache, %s (%s cache): threads 1 and 2, bitwise the unlimited call, down to the least that runs it', async (name, dtype) => {
    // The float16 cache's query and output in the bshd layout: both layouts through slices.
    const layout = dtype === 'float16' ? 'bshd' : 'bhsd';
    const options = layout === 'bshd' ? { ...cases[name], ...bshd } : cases[name];
    const q = layout === 'bshd' ? inputs.bshd[0] : query;
    const unlimitedAttn = await createAttention({ threads: 2 });
    let expected, callBytes;
    try {
      const cache = filledCache(unlimitedAttn, dtype);
      expected = cache.attend(q, options);
      callBytes = unlimitedAttn.memory().peakBytes - cache.byteLength;
    } finally {
      unlimitedAttn.dispose();
    }
    if (dtype === 'float32') {
      // The cache holds K/V as they are: the float64 reference on them, with the cache's default causal alignment.
      const ref = referenceSdpa(q, inputs[layout][1], inputs[layout][2], { isCausal: true, causalOffset: Lk - Lq, ...options });
      expect(maxRelError(expected.output.data, ref.output)).toBeLessThanOrEqual(TOL);
    }
    for (const threads of [1, 2]) {
      // The least any way of running the call needs, from a refusal at 8 KiB.
      const refused = await attendLimited(dtype, threads, 8192, q, options);
      expectError(refused, RangeError, [/^KVCache\.attend: needs \d+ bytes of wasm memory to run one \(batch, KV head\) at a time \(query /]);
      const least = Number(/needs (\d+) bytes/.exec(refused.message)[1]);
      expect(least).toBeLessThan(callBytes);
      for (const callLimit of [Math.floor(callBytes * 0.6), least]) {
        const { got } = await attendLimited(dtype, threads, callLimit, q, options);
        expectBitwiseEqual(got.output.data, expected.output.data);
        expect(got.output.dims).toEqual(expected.output.dims);
        if (options.returnWeights) expectBitwiseEqual(got.weights.data, expected.weights.data);
        if (options.returnLogSumExp) expectBitwiseEqual(got.logSumExp.data, expected.logSumExp.data);
      }
      expect((await attendLimited(dtype, threads, least - 1, q, options)).message).toBe(refused.message.replace(
        /limit of (\d+) bytes/, (_, n) => `limit of ${Number(n) + least - 1 - 8192} bytes`));
    }
  });

  test('KVCache.attend past the limit: into out, into the query\'s own array, and through a worker', async () => {
    const options = { returnWeights: true };
    const unlimitedAttn = await createAttention({ threads: 1 });
    let expected;
    try {
      expected = filledCache(unlimitedAttn, 'float16').attend(query, options);
    } finally {
      unlimitedAttn.dispose();
    }
    const cacheBytes = B * Hkv * Lk * (E + Ev) * 2;
    const limit = cacheBytes + 512 * 1024;  // the weights alone are 2.7 MB
    const attn = await createAttention({ threads: 2, maxMemoryBytes: limit });
    const worker = await createAttentionWorker({ threads: 1, maxMemoryBytes: limit });
    try {
      const cache = filledCache(attn, 'float16');
      const out = new Float32Array(expected.output.data.length);
      expect(cache.attend(query, { ...options, out }).output.data).toBe(out);
      expectBitwiseEqual(out, expected.output.data);
      // Ev < E: the output fills the start of the query's array, written after every slice's rows were read.
      const inPlace = { data: query.data.slice(), dims: query.dims };
      const got = cache.attend(inPlace, { ...options, out: inPlace.data.subarray(0, out.length) });
      expectBitwiseEqual(got.output.data, expected.output.data);
      expectBitwiseEqual(got.weights.data, expected.weights.data);
      const workerCache = await worker.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: Lk, dtype: 'float16' });
      for (let at = 0; at < Lk; at += 4) {
        const part = cache.read(at, at + 4);  // raw halves
        await workerCache.append(part.key, part.value);
      }
      const viaWorker = await workerCache.attend(query, options);
      expectBitwiseEqual(viaWorker.output.data, expected.output.data);
      expectBitwiseEqual(viaWorker.weights.data, expected.weights.data);
      expect(attn.memory().peakBytes).toBeLessThanOrEqual(limit);
      expect(attn.memory().bytesInUse).toBe(cacheBytes);
      expect((await worker.memory()).peakBytes).toBeLessThanOrEqual(limit);
    } finally {
      attn.dispose();
      await worker.dispose();
    }
  });

  test('refused when even one (batch, KV head) does not fit, naming its blocks; nothing held, the instance keeps working', async () => {
    const limit = 20 * 1024;
    const attn = await createAttention({ threads: 1, maxMemoryBytes: limit });
    try {
      const error = await errorOf(() => attn.sdpa(query, key, value, { returnWeights: true }));
      expectError(error, RangeError, [
        new RegExp(`^sdpa: needs \\d+ bytes of wasm memory to run one \\(batch, KV head\\) at a time \\(query ${2 * Lq * E * 4} bytes \\+ ` +
          `key ${Lk * E * 4} bytes \\+ value ${Lk * Ev * 4} bytes \\+ output ${2 * Lq * Ev * 4} bytes \\+ weights ${2 * Lq * Lk * 4} bytes`),
        new RegExp(`more than is left of this instance's limit of ${limit} bytes \\(maxMemoryBytes\\), of which 0 are in use$`)]);
      expect(attn.memory().bytesInUse).toBe(0);
      expect(attn.memory().peakBytes).toBe(0);
      expectMatchesReference(attn, smallProblem(409));
    } finally {
      attn.dispose();
    }
  });
});

// Helpers of the tests past maxMemoryBytes that cut one (batch, KV head) further.
/** `call` on a fresh instance without a limit: its result and the peak memory it took. */
const unlimitedCall = async (threads, call) => {
  const attn = await createAttention({ threads });
  try {
    return { expected: call(attn), peak: attn.memory().peakBytes };
  } finally {
    attn.dispose();
  }
};
/**
 * A call for an instance: a cache of `dtype` filled with k, v ([1, 1, L, D] each) `chunk`
 * positions an append (a float16 cache stages each append in wasm memory: small ones leave the
 * limit to the attend), then its attend of `query`.
 */
const attendOnCache = (k, v, dtype, chunk, query, options) => (attn) => {
  const [, , length, headDim] = k.dims, valueDim = v.dims[3];
  const cache = attn.createKVCache({ batch: 1, kvHeads: 1, headDim, valueDim, maxLength: length, dtype });
  for (let at = 0; at < length; at += chunk) {
    cache.append({ data: k.data.subarray(at * headDim, (at + chunk) * headDim), dims: [1, 1, chunk, headDim] },
      { data: v.data.subarray(at * valueDim, (at + chunk) * valueDim), dims: [1, 1, chunk, valueDim] });
  }
  return cache.attend(query, options);
};
const expectSameResult = (got, expected) => {
  expectBitwiseEqual(got.output.data, expected.output.data);
  expect(got.output.dims).toEqual(expected.output.dims);
  for (const name of ['weights', 'logSumExp']) if (expected[name]) expectBitwiseEqual(got[name].data, expected[name].data);
};
/** `call` on a fresh instance (threads, maxMemoryBytes `limit`): its result or error; nothing held after beyond `held` bytes, the peak within the limit. */
const runLimited = async (threads, limit, call, held = 0) => {
  const attn = await createAttention({ threads, maxMemoryBytes: limit });
  try {
    const outcome = call(attn);
    expect(attn.memory().bytesInUse).toBe(held);
    expect(attn.memory().peakBytes).toBeLessThanOrEqual(limit);
    return outcome;
  } finally {
    attn.dispose();
  }
};
/**
 * The least that runs `call` (named by its refusal under `floor` bytes, a limit at which it
 * must be refused): the refusal names the least slice (`purpose`, a pattern: what it runs at a
 * time); that many bytes run it, and a limit half-way to the whole call's peak, bitwise
 * `expected`; one byte less is the same refusal.
 */
const checkDownToTheLeast = async (threads, floor, peak, held, call, expected, purpose, fn) => {
  const refused = await runLimited(threads, floor, (attn) => errorOfSync(() => call(attn)), held);
  expectError(refused, RangeError, [new RegExp(`^${fn}: needs \\d+ bytes of wasm memory to run ${purpose} at a time \\(query `)]);
  const needed = held + Number(/needs (\d+) bytes/.exec(refused.message)[1]);
  expect(needed).toBeLessThan(peak);
  for (const limit of [needed, Math.floor((needed + peak) / 2)]) {
    expectSameResult(await runLimited(threads, limit, (attn) => call(attn), held), expected);
  }
  const below = await runLimited(threads, needed - 1, (attn) => errorOfSync(() => call(attn)), held);
  expect(below.message).toBe(refused.message.replace(/limit of (\d+) bytes/, `limit of ${needed - 1} bytes`));
};


describe('one batch and one KV head (multi-query attention) past maxMemoryBytes: a few query heads at a time where that keeps the bits', () => {
  // Hq 8 query heads on one KV head, B 1: no slice of batches or KV heads is smaller than the
  // call. sdpa() and KVCache.attend() then run a few of its query heads at a time, but only
  // slices that take the kernel's path and keep its row tiles of 4 flat rows (head-major: head
  // g's rows are g·Lq… g·Lq + Lq - 1; src/sdpa.h, query_heads_keep_bits): a row's bits depend
  // on the rows sharing its tile. So the least slice is one head for a prompt of 36 rows (any
  // count of heads keeps the tiles, and 36 rows take the packed path as the whole's 288 do), two
  // heads for 18 rows (one head's 18 rows would split a tile and take the decode path) and four
  // heads for a decode (one row a head: 8 rows, two tiles, read in place).
  const Hq = 8, Lk = 700, E = 16, Ev = 12;
  const key = randomTensor([1, 1, Lk, E], 501), value = randomTensor([1, 1, Lk, Ev], 502);
  // NaN in the keys past keyLengths: no slice may read them.
  key.data.fill(NaN, 690 * E);
  const random = mulberry32(503);
  const floatMask = (dims) => ({ data: Float32Array.from({ length: dims.reduce((a, b) => a * b) }, () => (random() < 0.2 ? -Infinity : random() * 4 - 2)), dims });
  const boolMask = (dims) => ({ data: Uint8Array.from({ length: dims.reduce((a, b) => a * b) }, () => Number(random() < 0.7)), dims });
  const shapes = [{ Lq: 36, least: 'one query head' }, { Lq: 18, least: '2 query heads' }, { Lq: 1, least: '4 query heads' }];
  const optionSets = {
    'causal with an offset, a window, key starts and lengths, a float mask [1, Hq, Lq, Lk], sinks, weights, log-sum-exp': (Lq) => ({
      isCausal: true, causalOffset: Lk - Lq - 13, slidingWindow: 300, keyStarts: new Int32Array([5]), keyLengths: new Int32Array([690]),
      attnMask: floatMask([1, Hq, Lq, Lk]), sinks: Float32Array.from({ length: Hq }, (_, h) => h - 3), returnWeights: true, returnLogSumExp: true,
    }),
    'a bool mask [Lq, Lk], softcap, ALiBi [Hq], dropout, weights': (Lq) => ({
      keyLengths: new Int32Array([690]), attnMask: boolMask([Lq, Lk]), softcap: 4, alibiSlopes: Float32Array.from({ length: Hq }, (_, h) => 2 ** -(h + 1)),
      dropoutP: 0.25, dropoutSeed: 9, returnWeights: true,
    }),
  };
  test.each(Object.keys(optionSets).flatMap((name) => shapes.map(({ Lq, least }) => [name, Lq, least])))('sdpa(), %s, Lq %i: least %s; threads 1 and 2 bitwise the whole call', async (name, Lq, least) => {
    const query = randomTensor([1, Hq, Lq, E], 504 + Lq), options = optionSets[name](Lq);
    const { expected, peak } = await unlimitedCall(2, (attn) => attn.sdpa(query, key, value, options));
    const ref = referenceSdpa(query, key, value, options);
    expect(maxRelError(expected.output.data, ref.output)).toBeLessThanOrEqual(TOL);
    expect(maxRelError(expected.weights.data, ref.weights)).toBeLessThanOrEqual(TOL);
    for (const threads of [1, 2]) {
      await checkDownToTheLeast(threads, 64, peak, 0, (attn) => attn.sdpa(query, key, value, options), expected, `${least} of one \\(batch, KV head\\)`, 'sdpa');
    }
  });

  test.each(Object.keys(optionSets).flatMap((name) => shapes.flatMap(({ Lq, least }) => ['float32', 'float16'].map((dtype) => [name, Lq, dtype, least]))))('KVCache.attend, %s, Lq %i, %s cache: least %s; threads 1 and 2 bitwise the whole call', async (name, Lq, dtype, least) => {
    const query = randomTensor([1, Hq, Lq, E], 504 + Lq), options = optionSets[name](Lq);
    const cacheBytes = Lk * (E + Ev) * (dtype === 'float32' ? 4 : 2);
    const attendOn = attendOnCache(key, value, dtype, 4, query, options);
    const { expected, peak } = await unlimitedCall(2, attendOn);
    for (const threads of [1, 2]) {
      await checkDownToTheLeast(threads, cacheBytes + 2048, peak, cacheBytes, attendOn, expected, `${least} of one \\(batch, KV head\\)`,
        'KVCache\\.attend');
    }
  });

  test('a decode of 5 query heads from a float16 or bfloat16 cache: a head alone would be read in another order, so it runs whole; float32 runs 4 + 1', async () => {
    // The last head of a 4 + 1 split is one row per KV head, which the kernel reads from a 16-bit
    // cache in interleaved groups of 4 key tiles (2048 keys): other sums than in the whole call's
    // tile of one row among five. A float32 cache reads it in order either way.
    const heads = 5, positions = 4500, dims = 16;
    const k = randomTensor([1, 1, positions, dims], 511), v = randomTensor([1, 1, positions, dims], 512);
    const query = randomTensor([1, heads, 1, dims], 513), options = { returnWeights: true };
    for (const dtype of ['float16', 'bfloat16', 'float32']) {
      const cacheBytes = positions * 2 * dims * (dtype === 'float32' ? 4 : 2);
      const attendOn = attendOnCache(k, v, dtype, 50, query, options);
      for (const threads of [1, 2]) {
        // The whole call's peak on this many threads (two threads' scratch is larger).
        const { expected, peak } = await unlimitedCall(threads, attendOn);
        if (dtype === 'float32') {
          await checkDownToTheLeast(threads, cacheBytes + 8192, peak, cacheBytes, attendOn, expected, '4 query heads of one \\(batch, KV head\\)',
            'KVCache\\.attend');
        } else {
          const refused = await runLimited(threads, peak - 1, (attn) => errorOfSync(() => attendOn(attn)), cacheBytes);
          expectError(refused, RangeError, [/^KVCache\.attend: needs \d+ bytes of wasm memory \(query /]);
          expectSameResult(await runLimited(threads, peak, attendOn, cacheBytes), expected);
        }
      }
    }
  });
});

describe('one query head past maxMemoryBytes: a few of its rows at a time where that keeps the bits', () => {
  // A query head whose rows, output and weights pass the limit (a long prompt, weights asked
  // for) runs a few of its rows at a time, after every smaller slice of batches, KV heads and
  // query heads: the slice of rows [r0, r0 + r) is a problem of its own whose causal offset is
  // the batch's + r0 and whose dropout mask counts rows from r0 (src/sdpa.h,
  // query_rows_keep_bits). Only row counts that keep the kernel's row tiles of 4 (a multiple of
  // 4, and Lq too when a KV head has several query heads) and its path (more than 32 rows per
  // slice, the last too, as the whole call's packed path) keep the bits: 300 rows give slices
  // of 152, 76 and at least 44 (300 = 6·44 + 36; 40 would leave 20), two heads of 100 rows at
  // least 52 (one head each first).
  const Lk = 400, E = 16, Ev = 12;
  const shapes = [
    { B: 2, Hq: 1, Lq: 300, least: '44 query rows' },
    { B: 1, Hq: 2, Lq: 100, least: '52 query rows' },
  ];
  const random = mulberry32(601);
  const floatMask = (dims) => ({ data: Float32Array.from({ length: dims.reduce((a, b) => a * b) }, () => (random() < 0.2 ? -Infinity : random() * 4 - 2)), dims });
  const boolMask = (dims) => ({ data: Uint8Array.from({ length: dims.reduce((a, b) => a * b) }, () => Number(random() < 0.7)), dims });
  const optionSets = {
    'causal with per-batch offsets, a window, key starts and lengths, a float mask [B, Hq, Lq, Lk], sinks, weights, log-sum-exp': ({ B, Hq, Lq }) => ({
      isCausal: true, causalOffset: Int32Array.from({ length: B }, (_, b) => (b === 0 ? Lk - Lq - 13 : 5)), slidingWindow: 150,
      keyStarts: Int32Array.from({ length: B }, (_, b) => 3 + b), keyLengths: Int32Array.from({ length: B }, () => 390),
      attnMask: floatMask([B, Hq, Lq, Lk]), sinks: Float32Array.from({ length: Hq }, (_, h) => h - 1), returnWeights: true, returnLogSumExp: true,
    }),
    'bshd, a bool mask [Lq, Lk], softcap, ALiBi [Hq] from an offset, dropout, weights': ({ Hq, Lq }) => ({
      layout: 'bshd', keyLengths: undefined, attnMask: boolMask([Lq, Lk]), softcap: 4, causalOffset: 50,
      alibiSlopes: Float32Array.from({ length: Hq }, (_, h) => 2 ** -(h + 2)), dropoutP: 0.25, dropoutSeed: 11, returnWeights: true,
    }),
    'a float mask [B, 1, 1, Lk] (no row axis), causal from the default offset, log-sum-exp': ({ B }) => ({
      isCausal: true, attnMask: floatMask([B, 1, 1, Lk]), returnLogSumExp: true,
    }),
  };
  const inputsOf = ({ B, Hq, Lq }, layout, seed) => {
    const dims = (H, L, D) => (layout === 'bshd' ? [B, L, H, D] : [B, H, L, D]);
    const key = randomTensor(dims(1, Lk, E), seed + 1), value = randomTensor(dims(1, Lk, Ev), seed + 2);
    return { query: randomTensor(dims(Hq, Lq, E), seed), key, value };
  };
  const withoutUndefined = (options) => Object.fromEntries(Object.entries(options).filter(([, x]) => x !== undefined));
  const cases = Object.keys(optionSets).flatMap((name) => shapes.map((shape) => [name, shape.B, shape.Hq, shape.Lq, shape.least, shape]));

  test.each(cases)('sdpa(), %s, B %i Hq %i Lq %i: least %s; threads 1 and 2 bitwise the whole call', async (name, B, Hq, Lq, least, shape) => {
    const options = withoutUndefined(optionSets[name](shape));
    const { query, key, value } = inputsOf(shape, options.layout, 610 + Lq);
    // NaN in the keys past keyLengths: no slice may read them.
    if (options.keyLengths) {
      for (let b = 0; b < B; b++) key.data.fill(NaN, (b * Lk + 390) * E, (b + 1) * Lk * E);
    }
    const { expected, peak } = await unlimitedCall(2, (attn) => attn.sdpa(query, key, value, options));
    const ref = referenceSdpa(query, key, value, options);
    expect(maxRelError(expected.output.data, ref.output)).toBeLessThanOrEqual(TOL);
    if (expected.weights) expect(maxRelError(expected.weights.data, ref.weights)).toBeLessThanOrEqual(TOL);
    for (const threads of [1, 2]) {
      await checkDownToTheLeast(threads, 64, peak, 0, (attn) => attn.sdpa(query, key, value, options), expected,
        `${least} of one query head`, 'sdpa');
    }
  });

  test('ALiBi measures from offsets as given: a batch whose offset + Lq − 1 would pass 2^31 − 1 keeps its head\'s rows whole', async () => {
    // A slice of rows takes its batch's offset + its first row as one int32: with ALiBi (whose
    // offsets are not clamped) that may not exist. Per-batch offsets: each batch's is asked about.
    const shape = { B: 2, Hq: 1, Lq: 300 }, options = { alibiSlopes: Float32Array.of(2 ** -20), returnLogSumExp: true };
    const { query, key, value } = inputsOf(shape, 'bhsd', 640);
    for (const [first, sliced] of [[2 ** 31 - 1 - 299, true], [2 ** 31 - 1 - 298, false]]) {
      const call = (attn) => attn.sdpa(query, key, value, { ...options, causalOffset: Int32Array.of(5, first) });
      const { expected, peak } = await unlimitedCall(1, call);
      const refused = await runLimited(1, 64, (attn) => errorOfSync(() => call(attn)));
      expect(refused.message).toMatch(sliced ? / to run 44 query rows of one query head at a time/ : / to run one \(batch, KV head\) at a time/);
      const least = Number(/needs (\d+) bytes/.exec(refused.message)[1]);
      expectSameResult(await runLimited(1, least, call), expected);
      expect(least < peak).toBe(true);
    }
  });

  test.each(cases.filter(([, B]) => B === 1).flatMap((c) => ['float32', 'float16'].map((dtype) => [...c.slice(0, 5), dtype, c[5]])))('KVCache.attend, %s, B %i Hq %i Lq %i: least %s; %s cache, threads 1 and 2 bitwise the whole call', async (name, B, Hq, Lq, least, dtype, shape) => {
    // attend's query in the option's layout; the cache holds [1, 1, Lk, ·] (bhsd: one KV head).
    const options = withoutUndefined(optionSets[name](shape));
    const { query } = inputsOf(shape, options.layout, 620 + Lq);
    const { key, value } = inputsOf(shape, 'bhsd', 620 + Lq);
    const cacheBytes = Lk * (E + Ev) * (dtype === 'float32' ? 4 : 2);
    const attendOn = attendOnCache(key, value, dtype, 8, query, options);
    const { expected, peak } = await unlimitedCall(2, attendOn);
    for (const threads of [1, 2]) {
      await checkDownToTheLeast(threads, cacheBytes + 2048, peak, cacheBytes, attendOn, expected, `${least} of one query head`,
        'KVCache\\.attend');
    }
  });
});

describe('no leaks: 10,000 mixed calls return bytesInUse and the module heap to where they were', () => {
  test('direct, cache, backward and worker calls, valid and failing, weights on and off', async () => {
    const attn = await createAttention({ threads: 1, maxMemoryBytes: 1 << 20 });
    const worker = await createAttentionWorker({ threads: 1 });
    const random = mulberry32(20261130);
    const int = (lo, hi) => lo + Math.floor(random() * (hi - lo + 1));
    const counts = { valid: 0, failed: 0 };
    const note = async (call) => {
      try {
        await call();
        counts.valid++;
      } catch (error) {
        if (!(error instanceof TypeError || error instanceof RangeError)) throw error;
        counts.failed++;
      }
    };
    const q = (Lq, seed) => randomTensor([1, 4, Lq, 8], seed);
    const big = randomTensor([1, 1, 300, 512], 1);  // Q, K, V of 600 KiB each
    const caches = [];

    // Each round: a few direct sdpa and sdpaBackward calls, cache operations on a random live
    // cache, and (every 10th round) a batch of worker calls. About 16 calls a round.
    const round = async (i) => {
      const p = smallProblem(i, { Lq: int(1, 6), Lk: int(1, 20) });
      await note(() => attn.sdpa(p.query, p.key, p.value, { returnWeights: i % 2 === 0, isCausal: i % 3 === 0 }));
      await note(() => attn.sdpa(p.query, p.key, p.value, { scale: 'x' }));  // TypeError
      await note(() => attn.sdpa(p.query, p.key, p.value, { attnMask: t(new Float32Array(5), [5]) }));  // RangeError
      // Past the 1 MiB limit: refused before allocating.
      await note(() => attn.sdpa(big, big, big));
      // Gradients: computed, from the forward's saved output and lse, and refused (bad dO dims,
      // a bad scale, past the limit).
      const go = randomTensor([...p.query.dims.slice(0, 3), p.value.dims[3]], i + 3);
      const isCausal = i % 4 === 1;
      await note(() => attn.sdpaBackward(p.query, p.key, p.value, go, { isCausal }));
      // The float mask's gradient: computed, and refused for a bool mask.
      const Lk = p.key.dims[2];
      await note(() => attn.sdpaBackward(p.query, p.key, p.value, go, { isCausal, attnMask: t(new Float32Array(Lk), [Lk]), returnMaskGrad: true }));
      await note(() => attn.sdpaBackward(p.query, p.key, p.value, go, { attnMask: t(new Uint8Array(Lk).fill(1), [Lk]), returnMaskGrad: true }));
      await note(() => {
        const f = attn.sdpa(p.query, p.key, p.value, { isCausal, returnLogSumExp: true });
        return attn.sdpaBackward(p.query, p.key, p.value, go, { isCausal, saved: { output: f.output, logSumExp: f.logSumExp } });
      });
      // Into the caller's arrays (or added to them), and refused: two gradients into one array.
      const dKey = new Float32Array(p.key.data.length);
      await note(() => attn.sdpaBackward(p.query, p.key, p.value, go, { isCausal, out: { dKey, dQuery: new Float32Array(p.query.data.length) }, accumulate: i % 2 === 0 }));
      await note(() => attn.sdpaBackward(p.query, p.key, p.value, go, { out: { dKey, dValue: dKey } }));  // RangeError
      await note(() => attn.sdpaBackward(p.query, p.key, p.value, p.query));  // RangeError: dO has E, not Ev, columns
      await note(() => attn.sdpaBackward(p.query, p.key, p.value, go, { scale: NaN }));  // RangeError
      // Sinks (dSinks with the gradients), and refused: a NaN sink.
      const sinks = Float32Array.of(0.5, -Infinity, 2, -1);
      await note(() => attn.sdpaBackward(p.query, p.key, p.value, go, { isCausal, sinks, out: i % 2 === 0 ? { dSinks: new Float32Array(4) } : undefined }));
      await note(() => attn.sdpa(p.query, p.key, p.value, { sinks: Float32Array.of(0, NaN, 0, 0) }));  // RangeError
      await note(() => attn.sdpaBackward(big, big, big, big));
      // Packed sequences: the forward (with lse) and backward, and refused: decreasing starts,
      // past the limit (the starts are allocated first, then the rest is refused).
      const packed = (T, H, seed) => randomTensor([T, H, 8], seed);
      const cuSeqlensQ = Int32Array.of(0, 2, 2, 5), Tq = 5;
      await note(() => attn.sdpaVarlen(packed(Tq, 4, i), packed(Tq, 2, i + 1), packed(Tq, 2, i + 2), { cuSeqlensQ, isCausal, returnLogSumExp: i % 2 === 0 }));
      await note(() => attn.sdpaVarlenBackward(packed(Tq, 4, i), packed(Tq, 2, i + 1), packed(Tq, 2, i + 2), packed(Tq, 4, i + 3), { cuSeqlensQ, sinks }));
      await note(() => attn.sdpaVarlen(packed(Tq, 4, i), packed(Tq, 2, i), packed(Tq, 2, i), { cuSeqlensQ: Int32Array.of(0, 3, 2, 5) }));  // RangeError
      await note(() => attn.sdpaVarlen(packed(300, 1, i), packed(300, 1, i), { data: big.data, dims: [300, 1, 512] }, { cuSeqlensQ: Int32Array.of(0, 300) }));  // RangeError: E 8, Ev 512 (past the limit)
      if (caches.length < 3 || int(0, 9) === 0) {
        await note(() => caches.push(attn.createKVCache({ batch: 1, kvHeads: 2, headDim: 8, maxLength: 32, dtype: i % 2 ? 'float16' : 'float32' })));
      }
      const cache = caches[int(0, caches.length - 1)];
      const n = int(1, 6);
      await note(() => cache.append(randomTensor([1, 2, n, 8], i), randomTensor([1, 2, n, 8], i + 1), i % 4 === 0 ? { layout: 'bshd' } : undefined));
      await note(() => cache.attend(q(int(1, 3), i), { returnWeights: i % 5 === 0, ...(i % 3 === 0 ? { sinks: Float32Array.of(1, 0, -2, 3) } : {}) }));
      await note(() => cache.truncate(int(0, cache.length + 1)));  // may fail: past the length
      await note(() => cache.remove(int(0, 2), int(1, cache.length + 1)));  // may fail: end before start or past the length
      if (int(0, 4) === 0) {
        const gone = caches.splice(int(0, caches.length - 1), 1)[0];
        gone.dispose();
        expect(() => gone.attend(q(1, i))).toThrow(/disposed/);
      }
      if (i % 10 === 0) {
        await note(() => worker.sdpa(p.query, p.key, p.value, { returnWeights: true }));
        await note(() => worker.sdpaBackward(p.query, p.key, p.value, go));
        await note(() => worker.sdpaBackward(p.query, p.key, p.value, p.query));  // RangeError
        await note(() => worker.sdpa(p.query, p.key, p.value, { layout: 'nope' }));
        await note(() => worker.sdpaVarlen(packed(Tq, 4, i), packed(Tq, 2, i + 1), packed(Tq, 2, i + 2), { cuSeqlensQ }));
        await note(() => worker.sdpaVarlen(packed(Tq, 4, i), packed(Tq, 2, i + 1), packed(Tq, 2, i + 2), { cuSeqlensQ: Int32Array.of(1, 5) }));  // RangeError
        const wc = await worker.createKVCache({ batch: 1, kvHeads: 2, headDim: 8, maxLength: 8 });
        await note(() => wc.append(randomTensor([1, 2, 9, 8], i), randomTensor([1, 2, 9, 8], i)));  // past maxLength
        await note(() => wc.append(randomTensor([1, 2, 3, 8], i), randomTensor([1, 2, 3, 8], i)));
        await note(() => wc.attend(q(1, i)));
        await note(() => wc.dispose());
      }
    };

    try {
      // Warm up (first calls may grow the heap or set up the runtime's own state).
      for (let i = 0; i < 5; i++) await round(i);
      for (const cache of caches.splice(0)) cache.dispose();
      const start = attn.memory();
      const workerStart = await worker.memory();
      expect(start.bytesInUse).toBe(0);

      const CALLS = 10000;
      let i = 5;
      while (counts.valid + counts.failed < CALLS) await round(i++);
      for (const cache of caches.splice(0)) cache.dispose();

      const end = attn.memory();
      expect(end.bytesInUse).toBe(start.bytesInUse);
      expect(end.moduleBytesInUse).toBe(start.moduleBytesInUse);
      expect(end.peakBytes).toBeLessThanOrEqual(end.limitBytes);
      const workerEnd = await worker.memory();
      expect(workerEnd.bytesInUse).toBe(workerStart.bytesInUse);
      expect(workerEnd.moduleBytesInUse).toBe(workerStart.moduleBytesInUse);
      // Both kinds were made in numbers, and the instance still computes right.
      expect(counts.valid).toBeGreaterThan(3000);
      expect(counts.failed).toBeGreaterThan(3000);
      expectMatchesReference(attn, smallProblem(99));
    } finally {
      for (const cache of caches) cache.dispose();
      attn.dispose();
      await worker.dispose();
    }
  }, 120000);
});

describe('sizes past 32 bits (arrays of 2 to 4 GiB, allocated but never written: no memory is used)', () => {
  test('a decode of more than 2^29 keys (streamed from the caller\'s arrays, never copied) is a RangeError naming the limit; the instance keeps working', async () => {
    const attn = await createAttention({ threads: 1 });
    try {
      const n = 2 ** 29 + 1;
      const query = { data: new Float32Array(1), dims: [1, 1, 1, 1] };
      const keys = { data: new Float32Array(n), dims: [1, 1, n, 1] };
      const error = errorOfSync(() => attn.sdpa(query, keys, keys));
      expect(error?.constructor).toBe(RangeError);
      expect(error.message).toBe('sdpa: at most 536870912 (2^29) keys (Lk) in a call, the kernel\'s counters being 32-bit, got 536870913');
      const few = { data: Float32Array.of(1, 2, 3), dims: [1, 1, 3, 1] };
      expect(Array.from(attn.sdpa(query, few, few).output.data)).toEqual([2]);  // softmax of 0s: the mean
      expect(attn.memory().bytesInUse).toBe(0);
    } finally {
      attn.dispose();
    }
  });

  test('slices of a mask whose whole strides pass int32 (a [2, 2, 32768, 32768] boolean mask: 2^31 a batch) run, with the whole call\'s bits', async () => {
    // The mask's elements are stood in for (its strides and size are a real 4 GiB mask's; the
    // spans a slice copies are read from a small all-ones array), so that nothing of 4 GiB is
    // made; under a limit of 64 MiB the call runs in slices of one batch and one KV head, whose
    // mask strides (the whole's) the block must hold.
    const [{ plan }, { runSdpa }, { MemoryAccount }] = await Promise.all([
      import('../../dist/validate.js'), import('../../dist/strategies.js'), import('../../dist/memory.js')]);
    const { module, release } = await loader.acquireModule(1);
    try {
      const L = 64;
      const tensor = (seed) => randomTensor([2, 2, L, 1], seed);
      const query = tensor(1), key = tensor(2), value = tensor(3);
      const mask = { data: new Uint8Array(2 * 2 * L * L).fill(1), dims: [2, 2, L, L] };
      const engines = () => ({ main: module, threads: 1, single: null, account: new MemoryAccount(2 ** 26) });
      const whole = plan(query, key, value, { attnMask: mask });
      const expected = runSdpa(engines(), whole, whole.queryData, whole.keyData, whole.valueData).output.data;
      for (const plane of [2 ** 29, 2 ** 30]) {  // a batch stride of 2^30 (fits int32) and 2^31
        const p = plan(query, key, value, { attnMask: mask });
        const standIn = { length: 4 * plane, subarray: (from, to) => new Uint8Array(to - from).fill(1) };
        p.mask = { ...p.mask, data: standIn, size: 4 * plane, strides: [2 * plane, plane, L, 1] };
        const got = runSdpa(engines(), p, p.queryData, p.keyData, p.valueData).output.data;
        expectBitwiseEqual(got, expected);
      }
    } finally {
      release();
    }
  });

  test('the saved-forward hash of a 4 GiB array (2^32 bytes) reads all of it: its last element changes the hash', async () => {
    const { contentsOf } = await import('../../dist/saved-forward.js');
    const data = new Float32Array(2 ** 30);
    const before = contentsOf(data, data.length);
    data[data.length - 1] = 1;
    expect(contentsOf(data, data.length)).not.toBe(before);
    expect(before).toMatch(/^1073741824 elements, hash [0-9a-f]{8}$/);
  }, 120_000);

  test('temporary blocks of 2^32 bytes or more (malloc\'s size is 32-bit) are refused like any block past 2 GiB', async () => {
    const { withTemporaryInt32 } = await import('../../dist/memory.js');
    const { module, release } = await loader.acquireModule(1);
    try {
      const half = { byteLength: 2 ** 31 };  // two Int32Arrays of 2 GiB, stood in for (never read: refused first)
      let used = false;
      const error = errorOfSync(() => withTemporaryInt32(module, 'sdpaVarlen', [half, half], () => { used = true; }));
      expect(error?.constructor).toBe(RangeError);
      expect(error.message).toMatch(/^sdpaVarlen: cannot allocate 4294967296 bytes of wasm memory: the module's memory is limited to 2 GiB/);
      expect(used).toBe(false);
    } finally {
      release();
    }
  });
});

describe('where blocks land in wasm memory', () => {
  test('every block a call hands the kernel starts on a 64-byte boundary, though malloc gives 8', async () => {
    const { module, release } = await loader.acquireModule(1);
    const attn = await createAttention({ threads: 1 });
    const fields = module.argumentLayout().problem.fields;
    const offsetOf = (name) => fields.find((f) => f.name === name).offset;
    const addressFields = ['query', 'key', 'value', 'output', 'weights', 'mask', 'keyLengths', 'logsumexp'];
    const seen = [];
    const forward = module.forward;
    // The calls this instance makes into its module (the instance uses this very module).
    module.forward = (arg, scratch, scratchFloats, threads) => {
      const i32 = module.HEAP32;
      for (const name of addressFields) seen.push([name, i32[(arg + offsetOf(name)) >>> 2]]);
      seen.push(['scratch', scratch]);
      return forward(arg, scratch, scratchFloats, threads);
    };
    try {
      // Odd sizes, so that the blocks before them end anywhere.
      for (let i = 1; i <= 6; i++) {
        const p = smallProblem(20 + i, { B: 1, Hq: 2, Hkv: 1, Lq: 2 * i + 1, Lk: 3 * i + 2, E: 5 + i, Ev: 3 + i });
        const mask = { data: new Uint8Array(p.query.dims[2] * p.key.dims[2]).fill(1), dims: [p.query.dims[2], p.key.dims[2]] };
        expectMatchesReference(attn, p, { attnMask: mask, keyLengths: new Int32Array([3 * i + 1]) });
        attn.sdpa(p.query, p.key, p.value, { returnWeights: true });
        const cache = attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 5 + i, valueDim: 3 + i, maxLength: 7 * i });
        cache.append(p.key, p.value);
        cache.attend(p.query);
        cache.dispose();
      }
      const used = seen.filter(([, address]) => address !== 0);
      expect(used.length).toBeGreaterThan(6 * 3 * 4);
      expect(used.filter(([, address]) => address % 64 !== 0)).toEqual([]);
      // What malloc itself returns: 8-byte aligned blocks, half of them 8 bytes off 16.
      const blocks = [];
      for (let n = 1; n < 400; n += 7) blocks.push(module._malloc(n));
      for (const block of blocks) module._free(block);
      expect(blocks.every((block) => block % 8 === 0)).toBe(true);
      expect(blocks.some((block) => block % 16 === 8)).toBe(true);
    } finally {
      module.forward = forward;
      attn.dispose();
      release();
    }
  });
});

describe('inputs in unusual memory', () => {
  let attn;
  beforeAll(async () => {
    attn = await createAttention({ threads: 1 });
  });
  afterAll(() => attn.dispose());

  /** The same tensor with its data in a SharedArrayBuffer. */
  const shared = ({ data, dims }) => {
    const copy = new data.constructor(new SharedArrayBuffer(data.byteLength));
    copy.set(data);
    return t(copy, dims);
  };

  test('SharedArrayBuffer-backed inputs, mask and out give the same bits as plain ones', () => {
    const p = smallProblem(11);
    const mask = t(new Uint8Array(5 * 9).map((_, i) => (i % 4 === 0 ? 0 : 1)), [5, 9]);
    const plain = attn.sdpa(p.query, p.key, p.value, { attnMask: mask, returnWeights: true });
    const out = new Float32Array(new SharedArrayBuffer(4 * plain.output.data.length));
    const got = attn.sdpa(shared(p.query), shared(p.key), shared(p.value), { attnMask: shared(mask), returnWeights: true, out });
    expect(got.output.data).toBe(out);
    expectBitwiseEqual(out, plain.output.data);
    expectBitwiseEqual(got.weights.data, plain.weights.data);

    const cache = attn.createKVCache({ batch: 2, kvHeads: 2, headDim: 8, valueDim: 6, maxLength: 16 });
    const twin = attn.createKVCache({ batch: 2, kvHeads: 2, headDim: 8, valueDim: 6, maxLength: 16 });
    try {
      cache.append(shared(p.key), shared(p.value));
      twin.append(p.key, p.value);
      expectBitwiseEqual(cache.attend(shared(p.query)).output.data, twin.attend(p.query).output.data);
    } finally {
      cache.dispose();
      twin.dispose();
    }
  });

  test('detached (transferred) buffers are a RangeError naming the argument; the instance keeps working', () => {
    const detach = ({ data, dims }) => {
      const copy = data.slice();
      structuredClone(copy.buffer, { transfer: [copy.buffer] });
      expect(copy.length).toBe(0);
      return t(copy, dims);
    };
    const p = smallProblem(12);
    const needs = (name) => new RegExp(`^sdpa: ${name} has no elements: its ArrayBuffer is detached \\(transferred`);
    expectError(errorOfSync(() => attn.sdpa(detach(p.query), p.key, p.value)), RangeError,
      [needs('query\\.data'), /dims \[2, 4, 5, 8\] need 320 elements/]);
    expectError(errorOfSync(() => attn.sdpa(p.query, detach(p.key), p.value)), RangeError, [needs('key\\.data')]);
    expectError(errorOfSync(() => attn.sdpa(p.query, p.key, detach(p.value))), RangeError, [needs('value\\.data')]);
    const mask = t(new Float32Array(9), [9]);
    expectError(errorOfSync(() => attn.sdpa(p.query, p.key, p.value, { attnMask: detach(mask) })), RangeError,
      [needs('options\\.attnMask\\.data')]);
    const out = detach(t(new Float32Array(2 * 4 * 5 * 6), [1])).data;
    expectError(errorOfSync(() => attn.sdpa(p.query, p.key, p.value, { out })), RangeError,
      [needs('options\\.out'), /needs 240 floats/]);
    const cache = attn.createKVCache({ batch: 2, kvHeads: 2, headDim: 8, valueDim: 6, maxLength: 16 });
    try {
      expectError(errorOfSync(() => cache.append(detach(p.key), p.value)), RangeError,
        [/^KVCache\.append: key\.data has no elements: its ArrayBuffer is detached/]);
      expect(cache.length).toBe(0);
    } finally {
      cache.dispose();
    }
    expectMatchesReference(attn, p);
  });

  test('`out` aliasing an input: the result is computed from the inputs as they were (all strategies)', async () => {
    // Ev = E and the output's dims equal the query's: out may be the query's own array.
    const cases = [
      ['copied', { B: 2, Hq: 4, Hkv: 2, Lq: 5, Lk: 11, E: 8, Ev: 8 }],
      // K + V >= 4 MiB with Lq = 1: the streamed decode.
      ['streamed decode', { B: 1, Hq: 4, Hkv: 2, Lq: 1, Lk: 4096, E: 64, Ev: 64 }],
      // One-thread prefill of >= 2 MiB (here 2.25 MiB) in pairs of <= 1 MiB: streamed unless out
      // overlaps an input.
      ['prefill that would stream', { B: 1, Hq: 6, Hkv: 6, Lq: 512, Lk: 512, E: 64, Ev: 64 }],
    ];
    for (const [, dims] of cases) {
      const p = smallProblem(13, dims);
      const expected = attn.sdpa(p.query, p.key, p.value).output.data;
      const ref = referenceSdpa(p.query, p.key, p.value).output;
      const query = t(p.query.data.slice(), p.query.dims);
      const got = attn.sdpa(query, p.key, p.value, { out: query.data });
      expect(got.output.data).toBe(query.data);
      expectBitwiseEqual(query.data, expected);
      expect(maxRelError(query.data, ref)).toBeLessThanOrEqual(TOL);
      // out over the value's array: a view of its start (every case's V is at least as long).
      const value = t(p.value.data.slice(), p.value.dims);
      expect(value.data.length).toBeGreaterThanOrEqual(expected.length);
      const viewOfValue = value.data.subarray(0, expected.length);
      attn.sdpa(p.query, p.key, value, { out: viewOfValue });
      expectBitwiseEqual(viewOfValue, expected);
    }
    // out over the query's memory through another SharedArrayBuffer object (structuredClone of
    // a SharedArrayBuffer shares its memory; JavaScript cannot see that the two overlap): one
    // head further on, so that a pair's output written early would overwrite the next pair's query.
    {
      const p = smallProblem(17, cases[2][1]);
      const expected = attn.sdpa(p.query, p.key, p.value).output.data;
      const sab = new SharedArrayBuffer(p.query.data.byteLength + 512 * 64 * 4);
      const query = t(new Float32Array(sab, 0, p.query.data.length), p.query.dims);
      query.data.set(p.query.data);
      const out = new Float32Array(structuredClone(sab), 512 * 64 * 4, expected.length);
      expect(out.buffer).not.toBe(query.data.buffer);
      attn.sdpa(query, p.key, p.value, { out });
      expectBitwiseEqual(out, expected);
    }
    // cache.attend with out = the query's array.
    const cache = attn.createKVCache({ batch: 1, kvHeads: 2, headDim: 8, maxLength: 32 });
    try {
      cache.append(randomTensor([1, 2, 12, 8], 14), randomTensor([1, 2, 12, 8], 15));
      const query = randomTensor([1, 4, 3, 8], 16);
      const expected = cache.attend(query).output.data;
      const got = cache.attend(query, { out: query.data });
      expect(got.output.data).toBe(query.data);
      expectBitwiseEqual(query.data, expected);
    } finally {
      cache.dispose();
    }
  });
});

/** The error a synchronous call throws (undefined if none). */
function errorOfSync(fn) {
  try {
    fn();
  } catch (error) {
    return error;
  }
  return undefined;
}
