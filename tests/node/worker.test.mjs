// createAttentionWorker() in Node (a worker_threads Worker): the same results as the direct API
// bit for bit (sdpa over the shared reference cases, copied and transferred; the KV cache step
// by step), the same errors (class and message) for every bad input of the direct API's tests,
// calls resolving in the order they were made, abort of a queued call, a worker that dies or is
// terminated rejecting every pending and later call, a Node process that exits by itself, and
// typed arrays carrying properties of their own read by their contents as the direct API reads them.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createAttention, createAttentionWorker } from 'sdpa-wasm';
import { CACHE_CASES, runCacheCases } from '../shared/kv-cache-cases.mjs';
import { CACHE_ERROR_CASES, CACHE_OPTIONS, createCacheErrorCases, STORED, k as cacheK, q as cacheQ, v as cacheV } from '../shared/kv-cache-error-cases.mjs';
import { bitsHash, REFERENCE_CASES, runReferenceCases } from '../shared/reference-cases.mjs';
import { sdpaErrorCases } from '../shared/sdpa-error-cases.mjs';
import { noiseTensor } from '../../web/seeded.mjs';
import { maxRelError, referenceSdpa, referenceSdpaBackward } from './reference.mjs';
import { Channel, PREPARE_AFTER_ANSWERS } from '../../dist/worker-channel.js';
import { READY } from '../../dist/worker-protocol.js';

const DIST_INDEX = fileURLToPath(new URL('../../dist/index.js', import.meta.url));
const RAW_WORKER = Symbol.for('sdpa-wasm.worker');

let attn;    // the direct API, one thread
let worker;  // one thread in its worker
beforeAll(async () => {
  attn = await createAttention({ threads: 1 });
  worker = await createAttentionWorker({ threads: 1 });
});
afterAll(async () => {
  attn.dispose();
  await worker.dispose();
});

const hashOf = (result) => bitsHash(result.output.data) + (result.weights ? bitsHash(result.weights.data) : '') +
  (result.logSumExp ? `lse ${result.logSumExp.dims} ${bitsHash(result.logSumExp.data)}` : '');
/** The error a call throws or rejects with (undefined if none). */
async function errorOf(call) {
  try {
    await call();
  } catch (error) {
    return error;
  }
  return undefined;
}
/** A deep copy of a case's inputs (a transferred call detaches them). */
const cloneCase = ({ query, key, value, options }) => structuredClone({ query, key, value, options });
/** A problem that takes tens of milliseconds: [1, 8, 1024, 64] self-attention. */
const longProblem = () => {
  const t = noiseTensor([1, 8, 1024, 64], 5, 1);
  return { query: t, key: noiseTensor([1, 8, 1024, 64], 5, 2), value: noiseTensor([1, 8, 1024, 64], 5, 3) };
};

describe('results: bitwise the direct API', () => {
  test('threads and simd are reported as on Attention', () => {
    expect(worker.threads).toBe(1);
    expect(worker.simd).toBe(true);
  });

  test('every shared reference case (masks, causal offsets, keyLengths, GQA, weights, both layouts, streamed decode)', async () => {
    const direct = await runReferenceCases(attn);
    const through = await runReferenceCases(worker);
    expect(through.filter((c) => !c.ok).map((c) => c.name)).toEqual([]);
    expect(through.map((c) => `${c.name} ${c.hash}`)).toEqual(direct.map((c) => `${c.name} ${c.hash}`));
  });

  test('an option set to undefined is not given, as on the direct API: the same bits; a misspelt one with a value is the direct API\'s TypeError', async () => {
    const { query, key, value, options } = REFERENCE_CASES[5].make();
    const expected = hashOf(attn.sdpa(query, key, value, options));
    expect(hashOf(await worker.sdpa(query, key, value, { ...options, isCasual: undefined, returnMaskGrad: undefined }))).toBe(expected);
    const direct = await errorOf(() => attn.sdpa(query, key, value, { ...options, isCasual: false }));
    const error = await errorOf(() => worker.sdpa(query, key, value, { ...options, isCasual: false }));
    expect([error?.constructor, error?.message]).toEqual([TypeError, direct.message]);
    expect(direct.message).toMatch(/^sdpa: unknown option "isCasual"/);
  });

  test('with { transfer: true }: the same bits, and the caller\'s arrays are detached', async () => {
    for (const { name, make } of REFERENCE_CASES) {
      const problem = make();
      const expected = hashOf(attn.sdpa(problem.query, problem.key, problem.value, problem.options));
      const moved = cloneCase(problem);
      const got = await worker.sdpa(moved.query, moved.key, moved.value, { ...moved.options, transfer: true });
      expect(`${name} ${hashOf(got)}`).toBe(`${name} ${expected}`);
      expect(moved.query.data.length).toBe(0);
      expect(moved.key.data.length).toBe(0);
      expect(moved.value.data.length).toBe(0);
      // A mask and the per-batch arrays are copied, not moved.
      if (moved.options.attnMask) expect(moved.options.attnMask.data.length).toBe(problem.options.attnMask.data.length);
      if (moved.options.keyLengths) expect(moved.options.keyLengths.length).toBe(problem.options.keyLengths.length);
    }
  });

  test('transfer: key and value viewing one buffer move together; a SharedArrayBuffer is copied', async () => {
    const [B, H, L, E] = [1, 2, 9, 8];
    const n = B * H * L * E;
    const q = noiseTensor([B, H, L, E], 9, 1);
    const both = new Float32Array(2 * n);
    both.set(noiseTensor([B, H, L, E], 9, 2).data);
    both.set(noiseTensor([B, H, L, E], 9, 3).data, n);
    const key = { data: both.subarray(0, n), dims: [B, H, L, E] }, value = { data: both.subarray(n), dims: [B, H, L, E] };
    const expected = hashOf(attn.sdpa(q, key, value));
    const got = await worker.sdpa({ data: q.data.slice(), dims: q.dims }, key, value, { transfer: true });
    expect(hashOf(got)).toBe(expected);
    expect(both.length).toBe(0);

    const shared = new Float32Array(new SharedArrayBuffer(n * 4));
    shared.set(q.data);
    const sharedQuery = { data: shared, dims: q.dims };
    const key2 = noiseTensor([B, H, L, E], 9, 2), value2 = noiseTensor([B, H, L, E], 9, 3);
    const fromShared = await worker.sdpa(sharedQuery, key2, value2, { transfer: true });
    expect(hashOf(fromShared)).toBe(hashOf(attn.sdpa(q, noiseTensor([B, H, L, E], 9, 2), noiseTensor([B, H, L, E], 9, 3))));
    expect(shared.length).toBe(n);
  });

  test('transfer: a buffer that cannot be detached (a WebAssembly.Memory\'s, Node\'s Buffer pool) is copied, the caller\'s arrays left as they are', async () => {
    const [B, H, L, E] = [1, 2, 9, 8];
    const n = B * H * L * E;
    const q = noiseTensor([B, H, L, E], 11, 1), k = noiseTensor([B, H, L, E], 11, 2), v = noiseTensor([B, H, L, E], 11, 3);
    const expected = hashOf(attn.sdpa(q, k, v, { isCausal: true }));
    // The query inside another module's wasm memory (64 KiB), the key in Node's Buffer pool.
    const memory = new WebAssembly.Memory({ initial: 1 });
    const inWasm = new Float32Array(memory.buffer, 4096, n);
    inWasm.set(q.data);
    const pooled = Buffer.allocUnsafe(4 * n);
    expect(pooled.buffer.byteLength).toBe(Buffer.poolSize);  // really the pool's
    const inPool = new Float32Array(pooled.buffer, pooled.byteOffset, n);
    inPool.set(k.data);
    // What reaches the worker: only the views' elements (not a copy of the whole 64 KiB memory
    // or 8 KiB pool, which is what moving them would send where they cannot be detached).
    const raw = worker[RAW_WORKER];
    const sent = [];
    const post = raw.postMessage;
    raw.postMessage = function (message, transfer) {
      for (const { op, args } of message) if (op === 'sdpa') sent.push([args.query.data.buffer.byteLength, args.key.data.buffer.byteLength]);
      return post.call(this, message, transfer);
    };
    try {
      for (let call = 0; call < 2; call++) {  // the second time without trying to move them
        const got = await worker.sdpa({ data: inWasm, dims: q.dims }, { data: inPool, dims: k.dims }, { data: v.data.slice(), dims: v.dims },
          { isCausal: true, transfer: true });
        expect(hashOf(got)).toBe(expected);
        expect(memory.buffer.byteLength).toBe(65536);
        expect(bitsHash(inWasm)).toBe(bitsHash(q.data));
        expect(bitsHash(inPool)).toBe(bitsHash(k.data));
      }
    } finally {
      raw.postMessage = post;
    }
    expect(sent).toEqual([[4 * n, 4 * n], [4 * n, 4 * n]]);
  });

  test('options are read as the direct API reads them: inherited, non-enumerable and getter options count', async () => {
    const { query, key, value } = REFERENCE_CASES[2].make();
    const inherited = Object.create({ isCausal: true, scale: 0.25 });
    const hidden = Object.defineProperty({}, 'isCausal', { value: true, enumerable: false });
    class Options { get isCausal() { return true; } }
    const causal = hashOf(attn.sdpa(query, key, value, { isCausal: true, scale: 0.25 }));
    expect(hashOf(attn.sdpa(query, key, value, inherited))).toBe(causal);
    expect(hashOf(await worker.sdpa(query, key, value, inherited))).toBe(causal);
    for (const options of [hidden, new Options()]) {
      const direct = hashOf(attn.sdpa(query, key, value, options));
      expect(hashOf(await worker.sdpa(query, key, value, options))).toBe(direct);
      expect(direct).not.toBe(hashOf(attn.sdpa(query, key, value)));
    }
    // With the worker-only options beside them, and in the backward pass.
    const withSignal = Object.assign(Object.create({ isCausal: true, scale: 0.25 }), { signal: new AbortController().signal, transfer: false });
    expect(hashOf(await worker.sdpa(query, key, value, withSignal))).toBe(causal);
    const grad = noiseTensor(attn.sdpa(query, key, value).output.dims, 11, 4);
    const backward = (r) => bitsHash(r.dQuery.data) + bitsHash(r.dKey.data) + bitsHash(r.dValue.data);
    expect(backward(await worker.sdpaBackward(query, key, value, grad, Object.create({ isCausal: true }))))
      .toBe(backward(attn.sdpaBackward(query, key, value, grad, { isCausal: true })));
    // An unknown name inherited is not read (as the direct API), an own one is refused.
    expect(hashOf(await worker.sdpa(query, key, value, Object.create({ causal: true })))).toBe(hashOf(attn.sdpa(query, key, value)));
    expect((await errorOf(() => worker.sdpa(query, key, value, { causal: true })))?.message)
      .toBe((await errorOf(() => attn.sdpa(query, key, value, { causal: true })))?.message);
  });

  test('arrays are taken after every getter of the call has run, as the direct API reads them: changed, detached or shrunk by a later option\'s getter, the same result or error', async () => {
    const { query, key, value } = REFERENCE_CASES[2].make();  // B 1, Hq 2, Lq 33, Lk 65
    const same = async (makeOptions, makeQuery = () => query) => {
      const run = (api) => errorOf(() => api.sdpa(makeQuery(), key, value, makeOptions())).then(async (error) =>
        (error ? `${error.name}: ${error.message}` : hashOf(await api.sdpa(makeQuery(), key, value, makeOptions()))));
      const direct = await run(attn), viaWorker = await run(worker);
      expect(viaWorker).toBe(direct);
      return direct;
    };
    // An earlier option's array changed by a later option's getter: the changed values are used.
    const offsets = () => { const c = Int32Array.of(5); return { isCausal: true, causalOffset: c, get returnWeights() { c[0] = 40; return false; } }; };
    expect(await same(offsets)).toBe(hashOf(attn.sdpa(query, key, value, { isCausal: true, causalOffset: 40 })));
    const slopes = () => { const a = Float32Array.of(0.5, 0.25); return { alibiSlopes: a, get returnWeights() { a[0] = NaN; return false; } }; };
    expect(await same(slopes)).toMatch(/^RangeError: sdpa: options\.alibiSlopes\[0\] must be a number in \[0, 2\^64\]/);
    const detached = () => {
      const sinks = new Float32Array(2);
      return { sinks, get returnLogSumExp() { structuredClone(sinks.buffer, { transfer: [sinks.buffer] }); return false; } };
    };
    expect(await same(detached)).toMatch(/^RangeError: sdpa: options\.sinks/);
    // The query's data changed by an option's getter (the tensors are taken first).
    let data;
    const changedQuery = () => ({ data: (data = query.data.slice()), dims: query.dims });
    expect(await same(() => ({ get scale() { data[0] = 7; return undefined; } }), changedQuery))
      .toBe(hashOf(attn.sdpa({ data: Float32Array.from(query.data, (x, n) => (n === 0 ? 7 : x)), dims: query.dims }, key, value)));
  });

  test('a call cancelled before it is made (signal already aborted) leaves the caller\'s arrays with transfer: true', async () => {
    const { query, key, value } = REFERENCE_CASES[1].make();
    const error = await errorOf(() => worker.sdpa(query, key, value, { transfer: true, signal: AbortSignal.abort() }));
    expect(error?.name).toBe('AbortError');
    expect([query.data.length, key.data.length, value.data.length]).toEqual([
      REFERENCE_CASES[1].make().query.data.length, REFERENCE_CASES[1].make().key.data.length, REFERENCE_CASES[1].make().value.data.length]);
    expect(hashOf(await worker.sdpa(query, key, value))).toBe(hashOf(attn.sdpa(query, key, value)));
  });

  test('inputs are taken when the call is made: changing them afterwards does not reach a queued call', async () => {
    const { query, key, value } = longProblem();
    const small = REFERENCE_CASES[2].make();
    const expected = hashOf(attn.sdpa(small.query, small.key, small.value, small.options));
    const first = worker.sdpa(query, key, value);
    const second = worker.sdpa(small.query, small.key, small.value, small.options);
    small.query.data.fill(NaN);
    small.key.dims[2] = 1;
    expect(hashOf(await second)).toBe(expected);
    await first;
  });

  test('out: the output lands in the caller\'s buffer (the buffer itself, or a prefix of a longer one)', async () => {
    const { query, key, value, options } = REFERENCE_CASES[5].make();
    const expected = attn.sdpa(query, key, value, options);
    const size = expected.output.data.length;
    const exact = new Float32Array(size);
    const got = await worker.sdpa(query, key, value, { ...options, out: exact });
    expect(got.output.data).toBe(exact);
    expect(bitsHash(exact)).toBe(bitsHash(expected.output.data));
    const longer = new Float32Array(size + 7).fill(-1);
    const prefix = await worker.sdpa(query, key, value, { ...options, out: longer, transfer: true });
    expect(prefix.output.data.buffer).toBe(longer.buffer);
    expect(prefix.output.data.length).toBe(size);
    expect(bitsHash(longer.subarray(0, size))).toBe(bitsHash(expected.output.data));
    expect(Array.from(longer.subarray(size))).toEqual(Array(7).fill(-1));
  });

  test('returnLogSumExp: the log-sum-exp comes back with the output, bitwise the direct call\'s', async () => {
    const query = noiseTensor([2, 4, 5, 8], 33, 1), key = noiseTensor([2, 2, 9, 8], 33, 2), value = noiseTensor([2, 2, 9, 6], 33, 3);
    for (const options of [{ returnLogSumExp: true }, { returnLogSumExp: true, returnWeights: true, isCausal: true, causalOffset: -2 }]) {
      const through = await worker.sdpa(query, key, value, options);
      expect(through.logSumExp.dims).toEqual([2, 4, 5]);
      expect(hashOf(through)).toBe(hashOf(attn.sdpa(query, key, value, options)));
    }
  });

  test('a worker on two threads gives the same bits', async () => {
    const two = await createAttentionWorker({ threads: 2 });
    try {
      expect(two.threads).toBe(2);
      const direct = await runReferenceCases(attn);
      const through = await runReferenceCases(two);
      expect(through.map((c) => c.hash)).toEqual(direct.map((c) => c.hash));
    } finally {
      await two.dispose();
    }
  });
});

describe('attention dropout through the worker: bitwise the direct calls', () => {
  const dropout = { dropoutP: 0.4, dropoutSeed: 2 ** 32 - 2 };
  const query = noiseTensor([2, 4, 5, 8], 40, 1), key = noiseTensor([2, 2, 70, 8], 40, 2), value = noiseTensor([2, 2, 70, 6], 40, 3);
  const gradOutput = noiseTensor([2, 4, 5, 6], 40, 4);

  test('sdpa: output, weights and lse (prefill, and a decode of 4 MiB of K/V), copied and transferred; the reference; another seed another result', async () => {
    for (const options of [
      { ...dropout, returnWeights: true, returnLogSumExp: true },
      { ...dropout, isCausal: true, causalOffset: 65, sinks: Float32Array.of(0, 1, -Infinity, 2), attnMask: noiseTensor([5, 70], 41, 1), returnWeights: true },
    ]) {
      const direct = attn.sdpa(query, key, value, options);
      const through = await worker.sdpa(query, key, value, options);
      expect(hashOf(through)).toBe(hashOf(direct));
      expect(maxRelError(through.output.data, referenceSdpa(query, key, value, options).output)).toBeLessThanOrEqual(2e-5);
      expect(through.weights.data.some((w) => w === 0)).toBe(true);
      const copy = cloneCase({ query, key, value, options });
      const moved = await worker.sdpa(copy.query, copy.key, copy.value, { ...copy.options, transfer: true });
      expect(copy.query.data.length).toBe(0);  // moved to the worker
      expect(hashOf(moved)).toBe(hashOf(direct));
      const other = await worker.sdpa(query, key, value, { ...options, dropoutSeed: 5 });
      expect(bitsHash(other.output.data)).not.toBe(bitsHash(direct.output.data));
    }
    const dq = noiseTensor([2, 8, 1, 64], 42, 1), dk = noiseTensor([2, 2, 4200, 64], 42, 2), dv = noiseTensor([2, 2, 4200, 64], 42, 3);
    const options = { ...dropout, keyLengths: Int32Array.of(3000, 4200) };
    expect(hashOf(await worker.sdpa(dq, dk, dv, options))).toBe(hashOf(attn.sdpa(dq, dk, dv, options)));
  });

  test('sdpaBackward: recomputed, and saved from the worker\'s forward; a forward with another seed refused with the direct API\'s message', async () => {
    const options = { ...dropout, isCausal: true, causalOffset: 65, sinks: Float32Array.of(0, 1, -Infinity, 2), attnMask: noiseTensor([5, 70], 43, 1),
      returnMaskGrad: true };
    const direct = attn.sdpaBackward(query, key, value, gradOutput, options);
    const ref = referenceSdpaBackward(query, key, value, gradOutput, options);
    const gradHash = (g) => ['dQuery', 'dKey', 'dValue', 'dAttnMask', 'dSinks'].map((name) => bitsHash(g[name].data)).join(' ');
    for (const name of ['dQuery', 'dKey', 'dValue', 'dAttnMask', 'dSinks']) expect(maxRelError(direct[name].data, ref[name])).toBeLessThanOrEqual(1e-4);
    expect(gradHash(await worker.sdpaBackward(query, key, value, gradOutput, options))).toBe(gradHash(direct));
    const { returnMaskGrad: _m, ...forwardOptions } = options;
    const forward = await worker.sdpa(query, key, value, { ...forwardOptions, returnLogSumExp: true });
    expect(gradHash(await worker.sdpaBackward(query, key, value, gradOutput, { ...options, saved: forward }))).toBe(gradHash(direct));
    const otherForward = await worker.sdpa(query, key, value, { ...forwardOptions, dropoutSeed: 1, returnLogSumExp: true });
    const expected = await errorOf(() => attn.sdpaBackward(query, key, value, gradOutput, { ...options,
      saved: attn.sdpa(query, key, value, { ...forwardOptions, dropoutSeed: 1, returnLogSumExp: true }) }));
    const error = await errorOf(() => worker.sdpaBackward(query, key, value, gradOutput, { ...options, saved: otherForward }));
    expect(error?.constructor).toBe(RangeError);
    expect(error.message).toBe(expected.message);
    expect(error.message).toMatch(/dropout differs from the sdpa\(\) call that returned options\.saved/);
  });

  test('KVCache.attend (float32, float16 and bfloat16) and sdpaVarlen / sdpaVarlenBackward', async () => {
    for (const dtype of ['float32', 'float16', 'bfloat16']) {
      const shape = { batch: 2, kvHeads: 2, headDim: 8, valueDim: 6, maxLength: 80, dtype };
      const local = attn.createKVCache(shape), remote = await worker.createKVCache(shape);
      try {
        local.append(key, value);
        await remote.append(key, value);
        const options = { ...dropout, returnWeights: true, returnLogSumExp: true };
        expect(hashOf(await remote.attend(query, options))).toBe(hashOf(local.attend(query, options)));
        if (dtype !== 'float32') {  // raw 16-bit elements of the cache's dtype, stored as they are
          const raw = (n, d) => ({ data: Uint16Array.from({ length: 2 * 2 * n * d }, (_, i) => 0x3c00 + ((i * 37) % 301)), dims: [2, 2, n, d] });
          local.append(raw(2, 8), raw(2, 6));
          await remote.append(raw(2, 8), raw(2, 6));
          const [held, heldRemote] = [local.read(), await remote.read()];
          expect(heldRemote.key.data).toEqual(held.key.data);
          expect(Array.from(held.key.data.subarray(-8))).toEqual(Array.from(raw(2, 8).data.subarray(-8)));
          expect(hashOf(await remote.attend(query, options))).toBe(hashOf(local.attend(query, options)));
        }
      } finally {
        local.dispose();
        await remote.dispose();
      }
    }
    const pq = noiseTensor([9, 2, 8], 44, 1), pk = noiseTensor([9, 1, 8], 44, 2), pv = noiseTensor([9, 1, 8], 44, 3);
    const options = { ...dropout, cuSeqlensQ: Int32Array.of(0, 4, 9), isCausal: true, returnLogSumExp: true };
    expect(hashOf(await worker.sdpaVarlen(pq, pk, pv, options))).toBe(hashOf(attn.sdpaVarlen(pq, pk, pv, options)));
    const { returnLogSumExp: _l, ...backwardOptions } = options;
    const direct = attn.sdpaVarlenBackward(pq, pk, pv, pq, backwardOptions);
    const through = await worker.sdpaVarlenBackward(pq, pk, pv, pq, backwardOptions);
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(bitsHash(through[name].data)).toBe(bitsHash(direct[name].data));
  });
});

describe('the KV cache through the worker', () => {
  test('the shared cache cases step by step: within 2e-5 of the reference and bitwise the direct cache', async () => {
    const direct = await runCacheCases(attn);
    const through = await runCacheCases(worker);
    expect(through).toHaveLength(CACHE_CASES.length);
    expect(through.filter((c) => !c.ok).map((c) => `${c.name}: ${c.worstError}`)).toEqual([]);
    expect(through.map((c) => c.hash)).toEqual(direct.map((c) => c.hash));
  });

  test('every member: append (float32, raw halves, bshd, transfer), attend options, length, truncate, reorder, reset, dispose', async () => {
    const shape = { batch: 2, kvHeads: 2, headDim: 16, valueDim: 8, maxLength: 40, dtype: 'float16' };
    const direct = attn.createKVCache(shape);
    const remote = await worker.createKVCache(shape);
    try {
      expect([remote.batch, remote.kvHeads, remote.headDim, remote.valueDim, remote.maxLength, remote.dtype, remote.byteLength])
        .toEqual([direct.batch, direct.kvHeads, direct.headDim, direct.valueDim, direct.maxLength, direct.dtype, direct.byteLength]);
      const key = noiseTensor([2, 2, 12, 16], 31, 1), value = noiseTensor([2, 2, 12, 8], 31, 2);
      direct.append(key, value);
      await remote.append(structuredClone(key), structuredClone(value), { transfer: true });
      expect(remote.length).toBe(12);
      // Raw halves, and the [B, L, H, E] layout.
      const halves = { data: Uint16Array.from({ length: 2 * 2 * 3 * 16 }, (_, i) => 0x3c00 + (i % 97)), dims: [2, 2, 3, 16] };
      const bshdValue = noiseTensor([2, 3, 2, 8], 31, 3);
      direct.append(halves, { data: Uint16Array.from(bshdValue.data, () => 0x3800), dims: [2, 2, 3, 8] });
      await remote.append(halves, { data: Uint16Array.from(bshdValue.data, () => 0x3800), dims: [2, 2, 3, 8] });
      direct.append(noiseTensor([2, 3, 2, 16], 31, 4), bshdValue, { layout: 'bshd' });
      await remote.append(noiseTensor([2, 3, 2, 16], 31, 4), bshdValue, { layout: 'bshd' });
      expect(remote.length).toBe(18);
      const query = noiseTensor([2, 6, 3, 16], 31, 5);
      const variants = [
        {},
        { returnWeights: true },
        { isCausal: false, attnMask: { data: Uint8Array.from({ length: 18 }, (_, j) => (j % 3 ? 1 : 0)), dims: [18] } },
        { keyLengths: Int32Array.of(18, 7), returnWeights: true },
        { causalOffset: Int32Array.of(4, -1), softcap: 3, scale: 0.7 },
        { returnLogSumExp: true },
        { keyLengths: Int32Array.of(18, 0), returnLogSumExp: true, returnWeights: true },  // batch 1: lse -Infinity
      ];
      for (const options of variants) {
        expect(hashOf(await remote.attend(query, options))).toBe(hashOf(direct.attend(query, options)));
      }
      const bshdQuery = noiseTensor([2, 3, 6, 16], 31, 6);
      expect(hashOf(await remote.attend(bshdQuery, { layout: 'bshd' }))).toBe(hashOf(direct.attend(bshdQuery, { layout: 'bshd' })));
      await remote.truncate(9);
      direct.truncate(9);
      expect(remote.length).toBe(9);
      expect(hashOf(await remote.attend(query))).toBe(hashOf(direct.attend(query)));
      // Beams swapped; the array changed after the call does not reach it.
      const beams = Int32Array.of(1, 0);
      const reordered = remote.reorder(beams);
      beams[0] = 0;
      await reordered;
      direct.reorder(Int32Array.of(1, 0));
      expect(remote.length).toBe(9);
      expect(hashOf(await remote.attend(query))).toBe(hashOf(direct.attend(query)));
      await remote.reset();
      direct.reset();
      expect(remote.length).toBe(0);
      const empty = await remote.attend(query);
      expect(empty.output.data.every((x) => Object.is(x, 0))).toBe(true);
      expect(hashOf(empty)).toBe(hashOf(direct.attend(query)));
    } finally {
      direct.dispose();
      await remote.dispose();
    }
    expect(remote.disposed).toBe(true);
    const error = await errorOf(() => remote.attend(cacheQ()));
    expect(error?.constructor).toBe(Error);
    expect(error.message).toBe('KVCache.attend: this KVCache has been disposed');
    await remote.dispose();  // twice is harmless
  });
});

describe('typed arrays carrying properties of their own, and transfers a check rejects', () => {
  /** A typed array's real length and its buffer's real byte length (TypedArray.prototype's and ArrayBuffer.prototype's getters). */
  const realLength = (view) => Object.getOwnPropertyDescriptor(Object.getPrototypeOf(Int8Array.prototype), 'length').get.call(view);
  const realBuffer = (view) => Object.getOwnPropertyDescriptor(Object.getPrototypeOf(Int8Array.prototype), 'buffer').get.call(view);
  const realBytes = (view) => Object.getOwnPropertyDescriptor(ArrayBuffer.prototype, 'byteLength').get.call(realBuffer(view));
  /**
   * `t` with its data a copy carrying own length, byteOffset, buffer (`decoy`'s), slice,
   * constructor and set, and dims with an own iterator: none of them must be read.
   */
  const tampered = (t, decoy) => {
    const data = t.data.slice();
    Object.defineProperty(data, 'length', { value: 0 });
    Object.defineProperty(data, 'byteOffset', { value: 4 });
    Object.defineProperty(data, 'buffer', { value: decoy.buffer });
    Object.defineProperty(data, 'slice', { value: () => new Float32Array(realLength(data)).fill(7) });
    Object.defineProperty(data, 'constructor', { value: Float64Array });
    Object.defineProperty(data, 'set', { value: () => { throw new Error('a method of the caller\'s object was called'); } });
    const dims = [...t.dims];
    dims[Symbol.iterator] = function* () { yield 1; yield* t.dims; };
    return { data, dims };
  };

  test('inputs are taken by their contents, copied or moved; no buffer the caller keeps is transferred', async () => {
    const { query, key, value } = REFERENCE_CASES[2].make();
    const keyLengths = Int32Array.of(3, 1);
    const options = { ...REFERENCE_CASES[2].make().options };
    const expected = hashOf(attn.sdpa(query, key, value, options));
    for (const transfer of [false, true]) {
      const decoy = new Float32Array(64);
      const taken = [query, key, value].map((t) => tampered(t, decoy));
      const got = await worker.sdpa(...taken, { ...options, transfer });
      expect(hashOf(got)).toBe(expected);
      expect(realBytes(decoy)).toBe(256);  // an own `buffer` property moves nothing
      // Copied: the caller's buffers stay (an own length of 0 once let the buffer itself be sent);
      // moved: detached.
      expect(taken.map((t) => realLength(t.data))).toEqual(transfer ? [0, 0, 0] : [query, key, value].map((t) => t.data.length));
    }
    // keyLengths (always copied) with an own length of 0: the caller's array stays.
    const cacheShape = { batch: 2, kvHeads: 1, headDim: 4, maxLength: 8 };
    const cache = await worker.createKVCache(cacheShape);
    try {
      await cache.append(noiseTensor([2, 1, 5, 4], 41, 1), noiseTensor([2, 1, 5, 4], 41, 2));
      Object.defineProperty(keyLengths, 'length', { value: 0 });
      await cache.attend(noiseTensor([2, 1, 1, 4], 41, 3), { keyLengths });
      expect(realLength(keyLengths)).toBe(2);
      expect(Array.from(keyLengths.subarray(0, 2))).toEqual([3, 1]);
    } finally {
      await cache.dispose();
    }
  });

  test('out carrying properties of its own still receives the output through the call\'s own view', async () => {
    const { query, key, value, options } = REFERENCE_CASES[5].make();
    const expected = attn.sdpa(query, key, value, options).output.data;
    const size = expected.length;
    const outs = {
      'a set() that does nothing': (out) => Object.defineProperty(out, 'set', { value: () => {} }),
      'an own length': (out) => Object.defineProperty(out, 'length', { value: 3 }),
      'a length getter that throws': (out) => Object.defineProperty(out, 'length', { get: () => { throw new Error('read'); } }),
      'a subarray() returning junk': (out) => Object.defineProperty(out, 'subarray', { value: () => Float32Array.of(42) }),
      'Object.prototype as its prototype': (out) => Object.setPrototypeOf(out, Object.prototype),
    };
    for (const [name, tamper] of Object.entries(outs)) {
      const out = tamper(new Float32Array(size));
      const got = await worker.sdpa(query, key, value, { ...options, out });
      expect([name, got.output.data === out]).toEqual([name, true]);
      expect([name, bitsHash(new Float32Array(realBuffer(out), 0, size))]).toEqual([name, bitsHash(expected)]);
    }
    // A longer out: its first `size` floats, returned as a view of them.
    const longer = Object.defineProperty(new Float32Array(size + 3).fill(-1), 'subarray', { value: () => Float32Array.of(42) });
    const got = await worker.sdpa(query, key, value, { ...options, out: longer });
    expect(got.output.data.buffer).toBe(longer.buffer);
    expect(realLength(got.output.data)).toBe(size);
    expect(bitsHash(got.output.data)).toBe(bitsHash(expected));
  });

  test('out detached while the call runs: a RangeError naming options.out; the worker keeps working', async () => {
    const { query, key, value } = longProblem();
    const out = new Float32Array(query.data.length);
    const running = worker.sdpa(query, key, value, { out });
    await null;  // sent
    structuredClone(out.buffer, { transfer: [out.buffer] });
    const error = await errorOf(() => running);
    expect(error?.constructor).toBe(RangeError);
    expect(error.message).toBe('sdpa: options.out\'s buffer was detached while the call ran; the output [1, 8, 1024, 64] ' +
      '(524288 floats) could not be written into it');
    const small = REFERENCE_CASES[1].make();
    expect(hashOf(await worker.sdpa(small.query, small.key, small.value))).toBe(hashOf(attn.sdpa(small.query, small.key, small.value)));
  });

  test('with { transfer: true }, a call its checks reject moves nothing (the direct API\'s error)', async () => {
    const make = () => REFERENCE_CASES[2].make();
    /** [description, worker call, direct call, the tensors whose arrays must stay] */
    // Each case: its options beyond { transfer: true } (which the direct call does not take).
    const cases = [
      ['an unknown option', (api, t, extra) => api.sdpa(t.query, t.key, t.value, { bogus: 1, ...extra })],
      ['an unknown option beside one set to undefined', (api, t, extra) => api.sdpa(t.query, t.key, t.value, { unset: undefined, bogus: null, ...extra })],
      ['dims that do not match the data', (api, t, extra) => api.sdpa({ data: t.query.data, dims: [9, 9] }, t.key, t.value, extra)],
      ['out too small', (api, t, extra) => api.sdpa(t.query, t.key, t.value, { out: new Float32Array(2), ...extra })],
      ['keyLengths past Lk', (api, t, extra) => api.sdpa(t.query, t.key, t.value, { keyLengths: Int32Array.of(99), ...extra })],
      ['sdpaBackward: gradOutput of the wrong shape', (api, t, extra) => api.sdpaBackward(t.query, t.key, t.value, noiseTensor([1, 1, 2, 2], 3, 4), extra)],
    ];
    for (const [name, call] of cases) {
      const direct = await errorOf(() => call(attn, make(), {}));
      const t = make();
      const lengths = [t.query.data.length, t.key.data.length, t.value.data.length];
      const error = await errorOf(() => call(worker, t, { transfer: true }));
      expect([name, error?.constructor, error?.message]).toEqual([name, direct.constructor, direct.message]);
      expect([name, t.query.data.length, t.key.data.length, t.value.data.length]).toEqual([name, ...lengths]);
    }
    // out over the query's buffer, which transfer would move: refused before anything moves.
    const t = make();
    const shared = new Float32Array(2 * t.query.data.length);  // the query, then room for the output [1, 2, 33, 64]
    shared.set(t.query.data);
    const query = { data: shared.subarray(0, t.query.data.length), dims: t.query.dims };
    const error = await errorOf(() => worker.sdpa(query, t.key, t.value, { out: shared.subarray(t.query.data.length), transfer: true }));
    expect(error?.constructor).toBe(RangeError);
    expect(error.message).toMatch(/^sdpa: options\.out shares its ArrayBuffer with an input that \{ transfer: true \} moves to the worker/);
    expect([shared.length, t.key.data.length]).toEqual([2 * t.query.data.length, make().key.data.length]);

    // The cache: shape checks and Lnew > maxLength before moving; a check on the length at the
    // call's turn after (the arrays have moved then, as documented).
    const direct = attn.createKVCache({ ...CACHE_OPTIONS });
    const cache = await worker.createKVCache({ ...CACHE_OPTIONS });
    try {
      direct.append(cacheK(STORED), cacheV(STORED));
      await cache.append(cacheK(STORED), cacheV(STORED));
      const cacheCases = [
        ['append: a key of the wrong head size', (c, extra) => c.append(noiseTensor([2, 2, 3, 5], 3, 5), cacheV(3), extra)],
        ['append: more positions than maxLength', (c, extra) => c.append(cacheK(17), cacheV(17), extra)],
        ['attend: a query of the wrong head size', (c, extra) => c.attend(cacheQ(1, 4, 5), extra)],
        ['attend: out too small', (c, extra) => c.attend(cacheQ(1), { out: new Float32Array(1), ...extra })],
      ];
      for (const [name, call] of cacheCases) {
        const expected = await errorOf(() => call(direct, {}));
        const arrays = [];
        const spy = { append: (k, v, o) => { arrays.push(k.data, v.data); return cache.append(k, v, o); },
          attend: (q, o) => { arrays.push(q.data); return cache.attend(q, o); } };
        const error = await errorOf(() => call(spy, { transfer: true }));
        expect([name, error?.constructor, error?.message]).toEqual([name, expected.constructor, expected.message]);
        expect([name, arrays.every((a) => a.length > 0)]).toEqual([name, true]);
      }
      // 7 more positions fit maxLength 16 but not the 10 stored: checked at the call's turn, moved.
      const key = cacheK(7), value = cacheV(7);
      const expected = await errorOf(() => direct.append(cacheK(7), cacheV(7)));
      const error = await errorOf(() => cache.append(key, value, { transfer: true }));
      expect(error?.message).toBe(expected.message);
      expect([key.data.length, value.data.length, cache.length]).toEqual([0, 0, STORED]);
    } finally {
      direct.dispose();
      await cache.dispose();
    }
  });

  test('a disposed cache reads length 0, also with calls in flight and after its worker was terminated (then saying so)', async () => {
    const a = await createAttentionWorker({ threads: 1 });
    const cache = await a.createKVCache({ ...CACHE_OPTIONS });
    await cache.append(cacheK(3), cacheV(3));
    const appending = cache.append(cacheK(2), cacheV(2));
    const disposing = cache.dispose();
    expect(cache.length).toBe(0);
    await appending;
    await disposing;
    expect(cache.length).toBe(0);

    const other = await a.createKVCache({ ...CACHE_OPTIONS });
    await other.append(cacheK(4), cacheV(4));
    await a.terminate();
    expect([other.disposed, other.length]).toEqual([true, 0]);
    expect((await errorOf(() => other.attend(cacheQ())))?.message)
      .toBe('KVCache.attend: this KVCache has been disposed: its AttentionWorker was terminated');
  });

  test('calls sharing one AbortSignal put one listener on it, removed once none waits', async () => {
    const { getEventListeners } = await import('node:events');
    const warnings = [];
    const onWarning = (warning) => warnings.push(warning.name);
    process.on('warning', onWarning);
    try {
      const stop = new AbortController();
      const { query, key, value } = longProblem();
      const small = REFERENCE_CASES[1].make();
      const running = worker.sdpa(query, key, value, { signal: stop.signal });
      await null;  // sent: the next ones wait
      const waiting = Array.from({ length: 12 }, () => worker.sdpa(small.query, small.key, small.value, { signal: stop.signal }));
      expect(getEventListeners(stop.signal, 'abort')).toHaveLength(1);
      const errors = Promise.all(waiting.map((p) => errorOf(() => p)));
      stop.abort();
      expect((await errors).map((e) => e?.name)).toEqual(Array(12).fill('AbortError'));
      await running;
      expect(getEventListeners(stop.signal, 'abort')).toHaveLength(0);
      // Calls that were sent leave no listener behind either.
      const keep = new AbortController();
      await Promise.all(Array.from({ length: 12 }, () => worker.sdpa(small.query, small.key, small.value, { signal: keep.signal })));
      expect(getEventListeners(keep.signal, 'abort')).toHaveLength(0);
      await new Promise((resolve) => setImmediate(resolve));
      expect(warnings).toEqual([]);
    } finally {
      process.off('warning', onWarning);
    }
  });
});

describe('errors: the same class and message as the direct API', () => {
  /**
   * A shared case through the worker and directly: the same class (the case's) and message. A
   * message that counts memory in use differs between instances: it must match the case's
   * patterns instead.
   */
  async function expectSameError([, throughWorker, Cls, patterns], [, direct]) {
    const expected = await errorOf(direct);
    const error = await errorOf(throughWorker);
    expect(error?.constructor).toBe(Cls);
    expect(error.constructor).toBe(expected.constructor);
    if (/in use/.test(expected.message)) for (const pattern of patterns) expect(error.message).toMatch(pattern);
    else expect(error.message).toBe(expected.message);
  }

  const viaWorker = sdpaErrorCases({ sdpa: (...args) => worker.sdpa(...args) });
  const viaDirect = sdpaErrorCases({ sdpa: (...args) => attn.sdpa(...args) });
  test.each(viaWorker.map((c, i) => [c[0], i]))('sdpa: %s', (_, i) => expectSameError(viaWorker[i], viaDirect[i]));

  const createViaWorker = createCacheErrorCases({ createKVCache: (...args) => worker.createKVCache(...args) });
  const createViaDirect = createCacheErrorCases({ createKVCache: (...args) => attn.createKVCache(...args) });
  test.each(createViaWorker.map((c, i) => [c[0], i]))('createKVCache: %s',
    (_, i) => expectSameError(createViaWorker[i], createViaDirect[i]));

  test.each(CACHE_ERROR_CASES.map((c) => [c[0], c]))('cache %s (every dtype); the cache is unchanged', async (name, [, call, Cls]) => {
    for (const dtype of ['float32', 'float16', 'bfloat16']) {
      if (dtype !== 'float32' && /halves into a float32/.test(name)) continue;
      const direct = attn.createKVCache({ ...CACHE_OPTIONS, dtype });
      const remote = await worker.createKVCache({ ...CACHE_OPTIONS, dtype });
      try {
        direct.append(cacheK(STORED, 4), cacheV(STORED, 5));
        await remote.append(cacheK(STORED, 4), cacheV(STORED, 5));
        const before = hashOf(await remote.attend(cacheQ()));
        const expected = await errorOf(() => call(direct));
        const error = await errorOf(() => call(remote));
        expect(error?.constructor).toBe(Cls);
        expect(error.constructor).toBe(expected.constructor);
        expect(error.message).toBe(expected.message);
        expect(remote.length).toBe(STORED);
        expect(hashOf(await remote.attend(cacheQ()))).toBe(before);
      } finally {
        direct.dispose();
        await remote.dispose();
      }
    }
  });

  test('createAttentionWorker rejects the options createAttention rejects, naming itself', async () => {
    for (const options of [{ threads: 0 }, { threads: 1.5 }, { threads: '2' }, { thread: 2 }, null, 4]) {
      const expected = await errorOf(() => createAttention(options));
      const error = await errorOf(() => createAttentionWorker(options));
      expect(error?.constructor).toBe(expected.constructor);
      // (An unknown option's message also lists the worker's own option, signal.)
      expect(error.message).toBe(expected.message.replace('createAttention:', 'createAttentionWorker:')
        .replace('known options: threads, relaxedSimd, maxMemoryBytes', 'known options: threads, relaxedSimd, maxMemoryBytes, signal'));
    }
  });

  test('the worker-only options are checked: signal, transfer', async () => {
    const { query, key, value } = REFERENCE_CASES[1].make();
    let error = await errorOf(() => worker.sdpa(query, key, value, { signal: {} }));
    expect(error?.constructor).toBe(TypeError);
    expect(error.message).toBe('sdpa: options.signal must be an AbortSignal, got an object');
    error = await errorOf(() => worker.sdpa(query, key, value, { transfer: 'yes' }));
    expect(error?.constructor).toBe(TypeError);
    expect(error.message).toBe('sdpa: options.transfer must be a boolean, got "yes"');
    const cache = await worker.createKVCache({ ...CACHE_OPTIONS });
    error = await errorOf(() => cache.truncate(0, { layout: 'bshd' }));
    expect(error?.constructor).toBe(TypeError);
    expect(error.message).toMatch(/KVCache\.truncate: unknown option "layout"; known options: signal/);
    await cache.dispose();
    // And the worker still works.
    expect(hashOf(await worker.sdpa(query, key, value))).toBe(hashOf(attn.sdpa(query, key, value)));
  });
});

describe('order and abort', () => {
  test('30 calls made at once resolve in the order they were made, each with its own result', async () => {
    const problems = Array.from({ length: 30 }, (_, i) => REFERENCE_CASES[i % REFERENCE_CASES.length].make());
    const expected = problems.map((p) => hashOf(attn.sdpa(p.query, p.key, p.value, p.options)));
    const settledOrder = [];
    const results = await Promise.all(problems.map((p, i) =>
      worker.sdpa(p.query, p.key, p.value, p.options).then((r) => {
        settledOrder.push(i);
        return hashOf(r);
      })));
    expect(settledOrder).toEqual(problems.map((_, i) => i));
    expect(results).toEqual(expected);
  });

  test('cache calls made at once run in order: append, attend, truncate, attend', async () => {
    const cache = await worker.createKVCache({ ...CACHE_OPTIONS });
    const direct = attn.createKVCache({ ...CACHE_OPTIONS });
    try {
      const q1 = cacheQ(), q2 = cacheQ(1);
      const calls = [cache.append(cacheK(6, 7), cacheV(6, 8)), cache.attend(q1), cache.truncate(2), cache.attend(q2)];
      const [, first, , second] = await Promise.all(calls);
      direct.append(cacheK(6, 7), cacheV(6, 8));
      expect(hashOf(first)).toBe(hashOf(direct.attend(q1)));
      direct.truncate(2);
      expect(hashOf(second)).toBe(hashOf(direct.attend(q2)));
      expect(cache.length).toBe(2);
    } finally {
      direct.dispose();
      await cache.dispose();
    }
  });

  test('calls made together travel as one message; each call\'s checks see the calls before it', async () => {
    const raw = worker[RAW_WORKER];
    const post = raw.postMessage;
    const batches = [];
    raw.postMessage = function (message, transfer) {
      batches.push(message.map((request) => request.op));
      return post.call(this, message, transfer);
    };
    const cache = await worker.createKVCache({ ...CACHE_OPTIONS });
    const direct = attn.createKVCache({ ...CACHE_OPTIONS });
    try {
      batches.length = 0;
      // append 6, append 11 (past maxLength 16 once the first is in: refused, nothing sent),
      // attend, truncate 2, append 11 (fits now), attend: the direct API's outcomes. The second
      // append fails its checks while the first is in the same message: it (and the calls
      // after it) wait for that answer (the worker might have refused the first) and are
      // checked again then: two messages.
      const calls = [
        cache.append(cacheK(6, 7), cacheV(6, 8)), cache.append(cacheK(11, 9), cacheV(11, 9)), cache.attend(cacheQ()),
        cache.truncate(2), cache.append(cacheK(11, 9), cacheV(11, 9)), cache.attend(cacheQ(1)),
      ];
      const outcomes = await Promise.allSettled(calls);
      expect(batches).toEqual([['append'], ['attend', 'truncate', 'append', 'attend']]);
      direct.append(cacheK(6, 7), cacheV(6, 8));
      const refused = await errorOf(() => direct.append(cacheK(11, 9), cacheV(11, 9)));
      expect(outcomes[1].status).toBe('rejected');
      expect(outcomes[1].reason.constructor).toBe(RangeError);
      expect(outcomes[1].reason.message).toBe(refused.message);
      expect(hashOf(outcomes[2].value)).toBe(hashOf(direct.attend(cacheQ())));
      direct.truncate(2);
      direct.append(cacheK(11, 9), cacheV(11, 9));
      expect(hashOf(outcomes[5].value)).toBe(hashOf(direct.attend(cacheQ(1))));
      expect(cache.length).toBe(13);
      // A decode step, append + attend, is one round trip.
      batches.length = 0;
      cache.truncate(12);
      const appended = cache.append(cacheK(1, 10), cacheV(1, 10));
      await cache.attend(cacheQ(1));
      await appended;
      expect(batches).toEqual([['truncate', 'append', 'attend']]);
    } finally {
      raw.postMessage = post;
      direct.dispose();
      await cache.dispose();
    }
  });

  test('an AbortSignal cancels a queued call (AbortError); a call already running completes; later calls work', async () => {
    const { query, key, value } = longProblem();
    const small = REFERENCE_CASES[1].make();
    const expected = hashOf(attn.sdpa(small.query, small.key, small.value));
    const running = new AbortController(), queued = new AbortController();
    const first = worker.sdpa(query, key, value, { signal: running.signal });
    await null;  // first is sent (calls are sent from a microtask)
    const second = worker.sdpa(small.query, small.key, small.value, { signal: queued.signal });
    const third = worker.sdpa(small.query, small.key, small.value);
    const secondError = errorOf(() => second);
    running.abort();  // first has been sent: it runs to the end
    queued.abort();
    const error = await secondError;
    expect(error?.name).toBe('AbortError');
    expect(error).toBeInstanceOf(DOMException);
    expect((await first).output.dims).toEqual([1, 8, 1024, 64]);
    expect(hashOf(await third)).toBe(expected);

    // Already aborted: rejects at once with the signal's reason.
    const reason = new Error('not wanted');
    const error2 = await errorOf(() => worker.sdpa(small.query, small.key, small.value, { signal: AbortSignal.abort(reason) }));
    expect(error2).toBe(reason);
    // Cache calls take a signal too.
    const cache = await worker.createKVCache({ ...CACHE_OPTIONS });
    const aborted = AbortSignal.abort();
    expect((await errorOf(() => cache.append(cacheK(1), cacheV(1), { signal: aborted })))?.name).toBe('AbortError');
    expect((await errorOf(() => cache.truncate(0, { signal: aborted })))?.name).toBe('AbortError');
    expect(cache.length).toBe(0);
    await cache.dispose();
  });
});

describe('the calling side\'s checks and queue: the direct API\'s outcomes in corner cases', () => {
  const bits = (t) => Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength).toString('hex');

  test('calls made before dispose() are checked against the length they leave (not the 0 a disposed cache reads)', async () => {
    for (const end of ['cache', 'worker']) {
      const a = await createAttentionWorker({ threads: 1 });
      const direct = attn.createKVCache({ ...CACHE_OPTIONS });
      const cache = await a.createKVCache({ ...CACHE_OPTIONS });
      try {
        for (const c of [direct, cache]) await c.append(cacheK(5, 40), cacheV(5, 41));
        const read = cache.read(0, 3), truncated = cache.truncate(4), attended = cache.attend(cacheQ(1), { attnMask: { data: new Uint8Array(4).fill(1), dims: [4] } });
        const disposing = end === 'cache' ? cache.dispose() : a.dispose();
        expect(cache.length).toBe(0);
        const [r] = await Promise.all([read, truncated]);
        expect(bits(r.key)).toBe(bits(direct.read(0, 3).key));
        direct.truncate(4);
        expect(hashOf(await attended)).toBe(hashOf(direct.attend(cacheQ(1), { attnMask: { data: new Uint8Array(4).fill(1), dims: [4] } })));
        await disposing;
        expect(cache.length).toBe(0);
      } finally {
        direct.dispose();
        await a.dispose();
      }
    }
  });

  test('an append the worker refuses (memory) leaves the calls sent with it checked against the length it did not reach: the direct API\'s outcomes', async () => {
    // A cache of 768 bytes; its appends of 8 float32 positions are staged (32 bytes, one position
    // at a time, at the least). With 12 bytes left both appends are refused as the direct ones
    // are; with a second cache disposed between them, the second append fits.
    const shape = { batch: 1, kvHeads: 1, headDim: 8, maxLength: 12 };
    const kv = () => [noiseTensor([1, 1, 8, 8], 42, 1), noiseTensor([1, 1, 8, 8], 42, 2)];
    const outcome = (p) => p.then(() => 'appended', (e) => `${e.name}: ${e.message}`);
    for (const [limit, between] of [[780, false], [1550, true]]) {
      const direct = await createAttention({ threads: 1, maxMemoryBytes: limit });
      const other = between ? direct.createKVCache(shape) : null, cache = direct.createKVCache(shape);
      const expected = [await outcome(errorOf(() => cache.append(...kv())).then((e) => { if (e) throw e; }))];
      other?.dispose();
      expected.push(await outcome(errorOf(() => cache.append(...kv())).then((e) => { if (e) throw e; })), cache.length);
      direct.dispose();
      const a = await createAttentionWorker({ threads: 1, maxMemoryBytes: limit });
      try {
        const wOther = between ? await a.createKVCache(shape) : null, wCache = await a.createKVCache(shape);
        const first = outcome(wCache.append(...kv()));  // one batch: first, (dispose), second
        const disposed = wOther?.dispose();
        const second = outcome(wCache.append(...kv()));
        await disposed;
        expect([await first, await second, wCache.length]).toEqual(expected);
      } finally {
        await a.dispose();
      }
      expect(expected[0]).toMatch(/^RangeError: KVCache\.append: needs 32 bytes of wasm memory/);
      expect(expected[1]).toBe(between ? 'appended' : expected[0]);
    }
  });

  test('options are read before the tensors, as the direct API reads them: a getter of one changing the other, the same bits', async () => {
    const { query, key, value } = REFERENCE_CASES[2].make();
    const other = noiseTensor(query.dims, 43, 1);
    // An option's getter replacing the query's data (read after it), and the query's data getter
    // changing an option (read before it: no effect).
    const cases = [
      () => { const q = { ...query }; return [q, { get isCausal() { q.data = other.data; return true; } }]; },
      () => { const o = { isCausal: false }; return [{ get data() { o.isCausal = true; return query.data; }, dims: query.dims }, o]; },
    ];
    for (const make of cases) {
      const direct = hashOf(attn.sdpa(...(([q, o]) => [q, key, value, o])(make())));
      expect(hashOf(await worker.sdpa(...(([q, o]) => [q, key, value, o])(make())))).toBe(direct);
    }
  });

  test('a getter that changes the cache while append, attend or read reads its arguments: the direct API\'s Error, nothing done', async () => {
    const calls = {
      append: (c, o) => c.append(cacheK(1, 44), cacheV(1, 45), o),
      attend: (c, o) => c.attend(cacheQ(1), o),
      read: (c, o) => c.read(undefined, undefined, o),
    };
    const changed = (op) => `Error: KVCache.${op}: the cache was changed while this call read its arguments (by a getter); nothing was done`;
    /**
     * `call` on a direct cache and a worker's, each holding 5 positions, with an options getter
     * that runs `change` on that cache; then `check([direct's error, the worker's], direct, cache)`.
     */
    const withChangingGetter = async (call, change, check) => {
      const direct = attn.createKVCache({ ...CACHE_OPTIONS });
      const cache = await worker.createKVCache({ ...CACHE_OPTIONS });
      try {
        const messages = [];
        for (const c of [direct, cache]) {
          await c.append(cacheK(5, 40), cacheV(5, 41));
          const error = await errorOf(() => call(c, { get layout() { change(c); return undefined; } }));
          messages.push(error === undefined ? undefined : `${error.constructor.name}: ${error.message}`);
        }
        await check(messages, direct, cache);
        expect(bits((await cache.read()).key)).toBe(bits(direct.read().key));  // (after the getter's call)
        expect(cache.length).toBe(direct.length);
      } finally {
        direct.dispose();
        await cache.dispose();
      }
    };
    for (const [op, call] of Object.entries(calls)) {
      for (const change of [(c) => c.truncate(2), (c) => c.append(cacheK(1, 46), cacheV(1, 47)), (c) => c.reset()]) {
        await withChangingGetter(call, change, ([direct, viaWorker]) => {
          expect(viaWorker).toBe(direct);
          expect(direct).toBe(changed(op));
        });
      }
      // Calls that turn out to change nothing (removing no position, the same order): the
      // direct call goes on; the worker's counts them when they are made (their outcome unknown
      // then), as the README says: the Error, and the cache as the direct one.
      for (const change of [(c) => c.remove(2, 2), (c) => c.reorder(Int32Array.of(0, 1))]) {
        await withChangingGetter(call, change, ([direct, viaWorker], directCache) => {
          expect(direct).toBeUndefined();
          expect(viaWorker).toBe(changed(op));
          if (op === 'append') directCache.truncate(5);  // (the direct append went on)
        });
      }
    }
  });

  // The queue itself (js/worker-channel.ts), on a link that stands for the worker: answers every
  // request (or fails to post the first batch), so that these run without one.
  /** A Channel over a fake worker; `failFirstPost`: its first batch cannot be posted (a DataCloneError). */
  function fakeChannel({ failFirstPost = false } = {}) {
    let receive, posts = 0;
    const sent = [];
    const link = {
      post(batch) {
        if (++posts === 1 && failFirstPost) throw new DOMException('could not be cloned', 'DataCloneError');
        for (const request of batch) sent.push(request.op);
        setTimeout(() => { for (const request of batch) receive({ id: request.id, ok: true, value: request.op }); });
      },
      onMessage: (handler) => { receive = handler; }, onDeath() {}, hold() {}, async terminate() {}, raw: null,
    };
    const channel = new Channel(link);
    receive(READY);
    // A cache's call as WorkerKVCache makes it: checks that fail while the cache has unanswered calls wait for their answers.
    let unanswered = 0;
    const cacheCall = (op, passes) => channel.call(op, () => {
      if (!passes()) throw unanswered > 0 ? PREPARE_AFTER_ANSWERS : new RangeError(`${op}: refused`);
      unanswered++;
      return {};
    }, (value) => value, undefined, () => { unanswered--; });
    return { channel, cacheCall, posts: () => posts, sent: () => sent };
  }
  const outcomeOf = (p) => p.then((value) => `ok ${value}`, (e) => `${e.name}: ${e.message}`);

  test('the queue: calls waiting for a batch\'s answers keep their order, also 200,000 of them; then a refusal is final', async () => {
    const { channel, cacheCall } = fakeChannel();
    let appended = false;
    const first = outcomeOf(cacheCall('append', () => true));
    const refused = outcomeOf(cacheCall('truncate', () => { const ok = appended; appended = true; return ok && false; }));
    const many = Array.from({ length: 200_000 }, (_, n) => outcomeOf(channel.call(`read ${n}`, () => ({}), (v) => v)));
    expect(await first).toBe('ok append');
    expect(await refused).toBe('RangeError: truncate: refused');
    const outcomes = await Promise.all(many);
    expect(outcomes[0]).toBe('ok read 0');
    expect(outcomes.every((o, n) => o === `ok read ${n}`)).toBe(true);
  });

  test('the queue: a prepare() that ends the worker or aborts its own call: nothing more sent, every call settles', async () => {
    const settledIn = (promises) => {
      let timer;
      const timeout = new Promise((resolve) => { timer = setTimeout(() => resolve('pending after 5 s'), 5_000); });
      return Promise.race([Promise.all(promises.map(outcomeOf)), timeout]).finally(() => clearTimeout(timer));
    };
    // Ended by a prepare() that passes, and by one that asks to wait for the batch's answers.
    for (const waits of [false, true]) {
      const { channel, posts } = fakeChannel();
      const ending = () => {
        void channel.terminate(new Error('ended'));
        if (waits) throw PREPARE_AFTER_ANSWERS;
        return {};
      };
      const call = (prepare) => channel.call('op', prepare, (v) => v);
      expect(await settledIn([call(() => ({})), call(ending), call(() => ({}))])).toEqual(['Error: ended', 'Error: ended', 'Error: ended']);
      expect(posts()).toBe(0);
    }
    // Its own signal aborted by its prepare(): rejected, and not sent.
    const { channel, posts, sent } = fakeChannel();
    const stop = new AbortController();
    const aborted = channel.call('append', () => { stop.abort(); return {}; }, (v) => v, stop.signal);
    expect(await settledIn([channel.call('read', () => ({}), (v) => v), aborted])).toEqual(['ok read', 'AbortError: This operation was aborted']);
    expect([posts(), sent()]).toEqual([1, ['read']]);
  });

  test('the queue: calls left waiting when a batch cannot be posted are sent (not stranded)', async () => {
    const { cacheCall, posts } = fakeChannel({ failFirstPost: true });
    const first = outcomeOf(cacheCall('append', () => true));
    const deferred = outcomeOf(cacheCall('truncate', () => false));
    const after = outcomeOf(cacheCall('read', () => true));
    let timer;
    const timeout = new Promise((resolve) => { timer = setTimeout(() => resolve('pending after 5 s'), 5_000); });
    expect(await Promise.race([Promise.all([first, deferred, after]), timeout]))
      .toEqual(['DataCloneError: could not be cloned', 'RangeError: truncate: refused', 'ok read']);
    clearTimeout(timer);
    expect(posts()).toBe(2);
  });

  test('options.signal: an object with addEventListener but no removeEventListener is refused; a polyfill\'s with both works', async () => {
    const { query, key, value } = REFERENCE_CASES[1].make();
    const error = await errorOf(() => worker.sdpa(query, key, value, { signal: { aborted: false, addEventListener() {} } }));
    expect(`${error?.constructor.name}: ${error?.message}`).toBe('TypeError: sdpa: options.signal must be an AbortSignal, got an object');
    const listeners = new Set();
    const polyfill = { aborted: false, addEventListener: (_, f) => listeners.add(f), removeEventListener: (_, f) => listeners.delete(f) };
    const done = worker.sdpa(query, key, value, { signal: polyfill });
    expect(listeners.size).toBe(1);
    expect(hashOf(await done)).toBe(hashOf(attn.sdpa(query, key, value)));
    expect(listeners.size).toBe(0);
  });

  test('caller code run while a batch is prepared (a getter read for a message) that terminates the worker or aborts a later call: every call settles, the aborted one not run', async () => {
    const { query, key, value } = REFERENCE_CASES[1].make();
    const outcome = (p) => p.then(() => 'fulfilled', (e) => e.name);
    const a = await createAttentionWorker({ threads: 1 });
    const ending = { get [Symbol.toStringTag]() { void a.terminate(); return 'Odd'; } };
    const settled = Promise.all([
      outcome(a.sdpa(query, key, value)), outcome(a.sdpa(query, key, value, { keyLengths: ending })), outcome(a.sdpa(query, key, value)),
    ]);
    let timer;
    const timeout = new Promise((resolve) => { timer = setTimeout(() => resolve('pending after 10 s'), 10_000); });
    expect(await Promise.race([settled, timeout])).toEqual(['Error', 'TypeError', 'Error']);
    clearTimeout(timer);
    await a.terminate();

    const cache = await worker.createKVCache({ ...CACHE_OPTIONS });
    const stop = new AbortController();
    const aborting = { get [Symbol.toStringTag]() { stop.abort(); return 'Odd'; } };
    const first = outcome(worker.sdpa(query, key, value, { keyLengths: aborting }));
    const append = outcome(cache.append(cacheK(3), cacheV(3), { signal: stop.signal }));
    expect([await first, await append]).toEqual(['TypeError', 'AbortError']);
    expect(cache.length).toBe(0);
    expect((await cache.read()).key.dims[2]).toBe(0);
    await cache.dispose();
  });
});

describe('the worker\'s end', () => {
  test('a worker terminated from outside rejects the running, the queued and every later call', async () => {
    const doomed = await createAttentionWorker({ threads: 1 });
    const cache = await doomed.createKVCache({ ...CACHE_OPTIONS });
    const { query, key, value } = longProblem();
    const pending = [doomed.sdpa(query, key, value), doomed.sdpa(query, key, value), cache.append(cacheK(1), cacheV(1))];
    const errors = Promise.all(pending.map((p) => errorOf(() => p)));
    await doomed[RAW_WORKER].terminate();  // as a crash or an out-of-memory kill would
    for (const error of await errors) {
      expect(error?.constructor).toBe(Error);
      expect(error.message).toMatch(/the attention worker stopped \(exit code 1\)/);
    }
    const later = await errorOf(() => doomed.sdpa(query, key, value));
    expect(later?.message).toMatch(/the attention worker stopped/);
    expect((await errorOf(() => cache.attend(cacheQ())))?.message).toMatch(/the attention worker stopped/);
    expect([cache.disposed, cache.length]).toEqual([true, 0]);  // its storage went with the worker
    await doomed.dispose();  // harmless after death
  });

  test('a message the page cannot read declares the worker dead and ends it: its calls reject, its thread exits', async () => {
    const unreadable = await createAttentionWorker({ threads: 1 });
    const cache = await unreadable.createKVCache({ ...CACHE_OPTIONS });
    const { query, key, value } = longProblem();
    const pending = errorOf(() => unreadable.sdpa(query, key, value));
    const raw = unreadable[RAW_WORKER];
    const exited = new Promise((resolve) => raw.once('exit', () => resolve('exited')));
    raw.emit('messageerror', new Error('the data could not be deserialized'));  // as Node reports one
    const error = await pending;
    expect(error?.constructor).toBe(Error);
    expect(error.message).toBe('sdpa-wasm: a message from the attention worker could not be read: the data could not be deserialized');
    expect((await errorOf(() => unreadable.sdpa(query, key, value)))?.message).toBe(error.message);
    expect([cache.disposed, cache.length]).toEqual([true, 0]);
    // Ended, not left running with its memory (and able to answer after being declared dead).
    const timeout = new Promise((resolve) => { setTimeout(resolve, 10_000, 'still running').unref(); });
    expect(await Promise.race([exited, timeout])).toBe('exited');
    await unreadable.dispose();  // harmless after death
  });

  test('terminate() stops a running call at once; dispose() lets the calls made finish, then rejects later ones', async () => {
    const a = await createAttentionWorker({ threads: 1 });
    const { query, key, value } = longProblem();
    const running = errorOf(() => a.sdpa(query, key, value));
    await a.terminate();
    expect((await running)?.message).toBe('sdpa-wasm: the attention worker was terminated');

    const b = await createAttentionWorker({ threads: 1 });
    const cache = await b.createKVCache({ ...CACHE_OPTIONS });
    const made = b.sdpa(query, key, value);
    const disposing = b.dispose();
    expect(b.dispose()).toBe(disposing);
    expect(cache.disposed).toBe(true);
    expect((await made).output.dims).toEqual([1, 8, 1024, 64]);
    await disposing;
    const error = await errorOf(() => b.sdpa(query, key, value));
    expect(error?.message).toBe('sdpa: this AttentionWorker has been disposed');
    expect((await errorOf(() => cache.attend(cacheQ())))?.message).toBe('KVCache.attend: this KVCache has been disposed');
    expect(typeof b[Symbol.asyncDispose]).toBe('function');
  });

  test('terminate() after dispose() still stops at once: the calls dispose() was letting finish reject; later calls say terminated', async () => {
    const a = await createAttentionWorker({ threads: 1 });
    const { query, key, value } = longProblem();
    const pending = [a.sdpa(query, key, value), a.sdpa(query, key, value), a.sdpa(query, key, value)].map((p) => errorOf(() => p));
    const disposing = a.dispose();
    await a.terminate();
    for (const error of await Promise.all(pending)) expect(error?.message).toBe('sdpa-wasm: the attention worker was terminated');
    await disposing;
    expect((await errorOf(() => a.sdpa(query, key, value)))?.message).toBe('sdpa: this AttentionWorker has been terminated');
  });

  test('a cache whose createKVCache() was waiting when dispose() was called is disposed with the others', async () => {
    const a = await createAttentionWorker({ threads: 1 });
    const { query, key, value } = longProblem();
    const running = a.sdpa(query, key, value);
    const creating = a.createKVCache({ ...CACHE_OPTIONS });
    const disposing = a.dispose();
    const cache = await creating;
    expect(cache.disposed).toBe(true);
    expect((await errorOf(() => cache.append(cacheK(1), cacheV(1))))?.message).toBe('KVCache.append: this KVCache has been disposed');
    await running;
    await disposing;
  });

  test('a getter that disposes the cache during append/attend: the direct API\'s error, and nothing moved', async () => {
    /** The call `op` on `cache` with a tensor whose dims getter runs `dispose`; and that tensor's data. */
    const callWith = (cache, op, dispose, options) => {
      const t = op === 'append' ? cacheK(1) : cacheQ(1);
      const tensor = { data: t.data, get dims() { dispose(); return t.dims; } };
      const call = op === 'append' ? () => cache.append(tensor, cacheV(1), options) : () => cache.attend(tensor, options);
      return { call, data: t.data };
    };
    for (const op of ['append', 'attend']) {
      const direct = attn.createKVCache({ ...CACHE_OPTIONS });
      const expected = await errorOf(callWith(direct, op, () => direct.dispose()).call);
      expect(expected?.message).toBe(`KVCache.${op}: this KVCache has been disposed`);
      const cache = await worker.createKVCache({ ...CACHE_OPTIONS });
      const viaWorker = callWith(cache, op, () => void cache.dispose(), { transfer: true });
      const error = await errorOf(viaWorker.call);
      expect(error?.constructor).toBe(expected.constructor);
      expect(error?.message).toBe(expected.message);
      expect(viaWorker.data.length).toBeGreaterThan(0);  // not moved
    }
  });

  test.each([
    ['after dispose()', 'await worker.dispose();', ''],
    ['idle and never disposed (an idle worker does not hold the process)', '', ''],
    // Terminated while a call just made waits to be sent: terminate()'s promise still settles
    // (it once did not, the worker no longer holding the process while it stopped: exit code 13).
    ['after terminate() with a call pending, both promises settled',
      'const pending = worker.sdpa(t, t, t).catch((e) => e.message); await worker.terminate(); console.log(await pending);',
      'sdpa-wasm: the attention worker was terminated'],
  ])('Node exits by itself %s', async (_, ending, printed) => {
    const result = await runChild(`
      const worker = await createAttentionWorker({ threads: 2 });
      const t = { data: new Float32Array(2 * 16 * 8).fill(0.5), dims: [2, 16, 8] };
      const cache = await worker.createKVCache({ batch: 1, kvHeads: 2, headDim: 8, maxLength: 32 });
      await cache.append(t, t);
      const { output } = await cache.attend(t);
      console.log('done', output.dims.join('x'), worker.threads);
      ${ending}
    `);
    expect(result).toEqual({ code: 0, stderr: '', stdout: ['done 2x16x8 2', printed].filter(Boolean).join('\n') });
  });
});

/**
 * What a new Node process running `body` (an ES module, createAttentionWorker imported) printed,
 * and how it ended: its exit code, or 'hung' (killed past 20 s).
 */
async function runChild(body) {
  const script = `import { createAttentionWorker } from ${JSON.stringify(DIST_INDEX)};\n${body}`;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '', stderr = '';
  child.stdout.on('data', (d) => { stdout += d; });
  child.stderr.on('data', (d) => { stderr += d; });
  const code = await new Promise((resolve) => {
    const timer = setTimeout(() => { child.kill('SIGKILL'); resolve('hung'); }, 20_000);
    child.on('exit', (c) => { clearTimeout(timer); resolve(c); });
  });
  return { code, stderr, stdout: stdout.trim() };
}

describe('createAttentionWorker({ signal }): a start that can be stopped', () => {

  test('aborted while it starts: rejects with the signal\'s reason, and the worker and its pool end (Node exits by itself)', async () => {
    // Aborted at each point of the start: before the call (nothing starts), with the call (the
    // worker's script not yet imported), once the worker runs and loads its module (a few ms on).
    const result = await runChild(`
      const outcomes = [];
      for (const when of ['before', 'with the call', 'after 5 ms', 'after 40 ms']) {
        const controller = new AbortController();
        const reason = new Error('stopped: ' + when);
        if (when === 'before') controller.abort(reason);
        const starting = createAttentionWorker({ threads: 2, signal: controller.signal });
        if (when === 'with the call') controller.abort(reason);
        if (when.startsWith('after')) setTimeout(() => controller.abort(reason), Number(when.split(' ')[1]));
        outcomes.push(await starting.then((w) => (w.terminate(), 'started'), (error) => error === reason ? 'the reason' : String(error)));
      }
      // A reason-less abort (AbortController.abort()): the signal's own AbortError.
      const controller = new AbortController();
      const starting = createAttentionWorker({ signal: controller.signal });
      controller.abort();
      outcomes.push(await starting.then(() => 'started', (error) => error.name));
      console.log(outcomes.join(', '));
    `);
    // (A start takes 100 ms or more: a worker thread, the glue, the wasm compiled, the pool's workers; at 40 ms either may be.)
    expect(result).toEqual({ code: 0, stderr: '', stdout: expect.stringMatching(/^the reason, the reason, the reason, (the reason|started), AbortError$/) });
  });

  test('a signal not aborted: the worker starts and works; aborting it afterwards changes nothing', async () => {
    const controller = new AbortController();
    const a = await createAttentionWorker({ threads: 1, signal: controller.signal });
    try {
      controller.abort();
      const { query, key, value } = REFERENCE_CASES[0].make();
      const direct = await createAttention({ threads: 1 });
      try {
        expect(bitsHash((await a.sdpa(query, key, value)).output.data)).toBe(bitsHash(direct.sdpa(query, key, value).output.data));
      } finally {
        direct.dispose();
      }
    } finally {
      await a.dispose();
    }
  });

  test('a signal that is not an AbortSignal is a TypeError naming it; other options are checked as createAttention checks them', async () => {
    expect(await errorOf(() => createAttentionWorker({ signal: 'soon' }))).toEqual(
      new TypeError('createAttentionWorker: options.signal must be an AbortSignal, got "soon"'));
    const error = await errorOf(() => createAttentionWorker({ signal: new AbortController().signal, transfer: true }));
    expect(error).toEqual(new TypeError('createAttentionWorker: unknown option "transfer"; known options: threads, relaxedSimd, maxMemoryBytes, signal'));
    // Options are read as createAttention reads them: an inherited one counts.
    const inherited = await createAttentionWorker(Object.create({ threads: 1, signal: new AbortController().signal }));
    try {
      expect(inherited.threads).toBe(1);
    } finally {
      await inherited.dispose();
    }
  });
});
