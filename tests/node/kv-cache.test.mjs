// The KV cache (attn.createKVCache): token-by-token decoding against the float64 reference
// (reference.mjs) on the concatenated history, float16 storage against the reference on
// float16-rounded K/V (the storage rounding is the only error), every sdpa option through
// attend(), thread counts bitwise, wasm memory growing mid-sequence, the ONNX cases with
// past_key/past_value through the cache, read() of what it holds, bad input and misuse, and leaks.
import { readFile } from 'node:fs/promises';
import { createAttention, createAttentionWorker } from 'sdpa-wasm';
// The internal loader (not public API): gives the Emscripten module with HEAPU8 and heapBytesInUse.
import * as loader from '../../dist/loader.js';
// The reorder's copy plan (internal, not public API).
import { reorderSteps, SAVED } from '../../dist/kv-cache.js';
import { bfloat16ToFloat, positions, roundedToHalves, roundToBFloat16, roundToHalf, runCacheCases, storedElementValue, storedValues } from '../shared/kv-cache-cases.mjs';
import { bitsHash } from '../shared/reference-cases.mjs';
import { adapt, halfToFloat, loadCase, loadIndex, mismatches, onnxOutputDims, TOL as ONNX_TOL } from '../shared/onnx-cases.mjs';
import { dropoutRows, logSumExpError, maxRelError, mulberry32, randn, randomTensor, referenceLogSumExp, referenceSdpa } from './reference.mjs';

const TOL = 2e-5;

let attn, attn2;
beforeAll(async () => {
  attn = await createAttention({ threads: 1 });
  attn2 = await createAttention({ threads: 2 });
});
afterAll(() => {
  attn.dispose();
  attn2.dispose();
});

// ---------------------------------------------------------------------------------------------
// Helpers

const size = (dims) => dims.reduce((a, b) => a * b, 1);
const bits = (a) => new Uint32Array(a.buffer, a.byteOffset, a.length);

/** A bhsd tensor [B, H, L, D] as bshd [B, L, H, D] (the same values). */
function toBshd(t) {
  const [B, H, L, D] = t.dims;
  const data = new t.data.constructor(t.data.length);
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      for (let l = 0; l < L; l++) {
        data.set(t.data.subarray(((b * H + h) * L + l) * D, ((b * H + h) * L + l + 1) * D), ((b * L + l) * H + h) * D);
      }
    }
  }
  return { data, dims: [B, L, H, D] };
}


/**
 * Decodes step by step: the cache gets `steps[s]` new positions at a time (appended as given
 * by `appendAs`), and after each append `attend` runs a query of that many rows (seeded).
 * Returns, per step, the output and what the reference must see: the query and the whole
 * history's K/V so far.
 */
function decode(instance, { B = 1, Hq, Hkv, E, Ev = E, steps, dtype = 'float32', seed = 1, options = () => ({}) }) {
  const total = steps.reduce((a, b) => a + b, 0);
  const k = randomTensor([B, Hkv, total, E], seed * 7 + 1), v = randomTensor([B, Hkv, total, Ev], seed * 7 + 2);
  const cache = instance.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: total + 5, dtype });
  const results = [];
  try {
    let length = 0;
    steps.forEach((n, s) => {
      cache.append(positions(k, length, length + n), positions(v, length, length + n));
      length += n;
      expect(cache.length).toBe(length);
      const query = randomTensor([B, Hq, n, E], seed * 1000 + s);
      const opts = options(length, n);
      const got = cache.attend(query, opts);
      results.push({ got, query, length, n, opts });
    });
  } finally {
    cache.dispose();
  }
  return { k, v, results };
}

/**
 * Each step against the reference on the history so far (bottom-right causal unless overridden),
 * on K/V as a cache of `dtype` stores them (`halves`: float16).
 */
function expectMatchesReference({ k, v, results }, { halves = false, dtype = halves ? 'float16' : 'float32', tol = TOL } = {}) {
  k = storedValues(dtype, k), v = storedValues(dtype, v);
  for (const { got, query, length, n, opts } of results) {
    const key = positions(k, 0, length), value = positions(v, 0, length);
    const refOptions = { isCausal: true, causalOffset: length - n, ...opts };
    // Not causal: no offset, unless ALiBi measures its distances from it (attend's default, length − n).
    if (refOptions.isCausal === false && !refOptions.alibiSlopes) delete refOptions.causalOffset;
    const ref = referenceSdpa(query, key, value, refOptions);
    expect(got.output.dims).toEqual(ref.outputDims);
    const error = maxRelError(got.output.data, ref.output);
    if (!(error <= tol)) throw new Error(`step with ${n} new positions at length ${length}: error ${error} > ${tol}`);
    if (opts.returnWeights) {
      expect(got.weights.dims).toEqual(ref.weightsDims);
      expect(maxRelError(got.weights.data, ref.weights)).toBeLessThanOrEqual(tol);
    }
    if (opts.returnLogSumExp) {  // [B, Hq, Lq]; -Infinity for a row with nothing to attend
      expect(got.logSumExp.dims).toEqual(ref.outputDims.slice(0, 3));
      expect(logSumExpError(got.logSumExp.data, referenceLogSumExp(query, key, value, refOptions))).toBeLessThanOrEqual(tol);
    }
  }
}

// A prompt of 37, single tokens, and chunks of 3 to 300 positions, past one 512-key segment:
// the chunk of 25 ends at 517 positions, and the last two tokens attend 518 and 519 (a decode
// splits those into a segment of 512 and one of 6 or 7).
const STEPS = [37, 1, 1, 3, 1, 17, 1, 300, 1, 1, 128, 1, 25, 1, 1];

// ---------------------------------------------------------------------------------------------

describe('token-by-token decoding equals attention over the whole history', () => {
  test.each([
    ['MHA H8, E 64', { Hq: 8, Hkv: 8, E: 64 }],
    ['GQA Hq32 Hkv8, E 128', { Hq: 32, Hkv: 8, E: 128 }],
    ['GQA Hq32 Hkv8, E 64, Ev 96', { Hq: 32, Hkv: 8, E: 64, Ev: 96 }],
    ['MQA Hq6 Hkv1, E 128, Ev 40, B 2, with weights', { B: 2, Hq: 6, Hkv: 1, E: 128, Ev: 40, options: () => ({ returnWeights: true }) }],
  ])('%s: float32 cache within 2e-5 of the reference, and of sdpa() on the concatenated K/V', (_, shape) => {
    const run = decode(attn, { ...shape, steps: STEPS, seed: 3 });
    expectMatchesReference(run);
    // The same steps through sdpa() with the history copied in: the same problem, so within
    // the tolerance of each other (both are within it of the exact result).
    for (const { got, query, length, n } of run.results.slice(0, 6)) {
      const direct = attn.sdpa(query, positions(run.k, 0, length), positions(run.v, 0, length),
        { isCausal: true, causalOffset: length - n });
      expect(maxRelError(got.output.data, Float64Array.from(direct.output.data))).toBeLessThanOrEqual(TOL);
    }
  });

  test.each([
    ['float32', 1], ['float32', 7], ['float32', 300], ['float16', 64], ['float16', 513], ['bfloat16', 64],
  ])('%s cache, slidingWindow %p (GQA Hq8 Hkv2): each step within the tolerance of the reference; one and two threads bitwise', (dtype, W) => {
    const shape = { Hq: 8, Hkv: 2, E: 64, Ev: 40, steps: STEPS, dtype, seed: 11, options: () => ({ slidingWindow: W, returnWeights: true }) };
    const one = decode(attn, shape), two = decode(attn2, shape);
    expectMatchesReference(one, { dtype });
    one.results.forEach(({ got, length, n }, s) => {
      expect(Array.from(bits(two.results[s].got.output.data))).toEqual(Array.from(bits(got.output.data)));
      // Each row's weights before its window (the positions up to length - n + i - W) are exact zeros.
      const weights = got.weights.data;
      for (let i = 0; i < n; i++) {
        const first = Math.max(length - n + i - W + 1, 0);
        expect(weights.subarray(i * length, i * length + first).every((x) => Object.is(x, 0))).toBe(true);
      }
    });
  });

  test.each([
    ['float32', 8, 2], ['float16', 8, 2], ['float16', 4, 4], ['bfloat16', 4, 4],
  ])("%s cache, sinks (gpt-oss: GQA or MHA, %p query heads on %p KV heads), alone and with a 128-position window: each step within the tolerance of the reference, weights and logSumExp too; one and two threads bitwise", (dtype, Hq, Hkv) => {
    const sinks = Float32Array.from({ length: Hq }, (_, h) => [1.5, -Infinity, 0, 40][h % 4]);
    for (const window of [undefined, 128]) {
      const shape = {
        Hq, Hkv, E: 64, Ev: 40, steps: STEPS, dtype, seed: 12,
        options: () => ({ sinks, returnWeights: true, returnLogSumExp: true, ...(window ? { slidingWindow: window } : {}) }),
      };
      const one = decode(attn, shape), two = decode(attn2, shape);
      expectMatchesReference(one, { dtype });
      one.results.forEach(({ got }, s) => {
        expect(Array.from(bits(two.results[s].got.output.data))).toEqual(Array.from(bits(got.output.data)));
      });
    }
    // Nothing stored: every row attends nothing, zeros, and its log-sum-exp is its head's sink.
    const empty = attn.createKVCache({ batch: 2, kvHeads: Hkv, headDim: 64, maxLength: 8, dtype });
    try {
      const got = empty.attend(randomTensor([2, Hq, 3, 64], 13), { sinks, returnLogSumExp: true });
      expect(got.output.data.every((x) => Object.is(x, 0))).toBe(true);
      expect(Array.from(got.logSumExp.data)).toEqual(Array.from({ length: 2 * Hq * 3 }, (_, row) => sinks[Math.floor(row / 3) % Hq]));
    } finally {
      empty.dispose();
    }
  });

  test.each([
    ['float32', 8, 8], ['float16', 8, 8], ['float32', 8, 2], ['float16', 8, 2], ['bfloat16', 8, 8],
  ])("%s cache, ALiBi (BLOOM's slopes; %p query heads on %p KV heads), causal and not (distances from length − Lq): each step within the tolerance of the reference, weights and logSumExp too; one and two threads bitwise", (dtype, Hq, Hkv) => {
    const slopes = Float32Array.from({ length: Hq }, (_, h) => 2 ** (-8 * (h + 1) / Hq));
    for (const extra of [{}, { isCausal: false }, { slidingWindow: 64, sinks: Float32Array.from({ length: Hq }, (_, h) => h - 3) }]) {
      const shape = {
        Hq, Hkv, E: 64, Ev: 40, steps: STEPS, dtype, seed: 14,
        options: () => ({ alibiSlopes: slopes, returnWeights: true, returnLogSumExp: true, ...extra }),
      };
      const one = decode(attn, shape), two = decode(attn2, shape);
      expectMatchesReference(one, { dtype });
      one.results.forEach(({ got }, s) => {
        expect(Array.from(bits(two.results[s].got.output.data))).toEqual(Array.from(bits(got.output.data)));
      });
    }
  });

  test.each([
    ['float32', 8, 8], ['float16', 8, 8], ['float32', 8, 2], ['float16', 8, 2],
  ])("%s cache, dropout (%p query heads on %p KV heads), decode steps and chunks: the reference (float16: on the rounded halves), sdpa() over the concatenated history with the same options, the same dropped weights; one and two threads bitwise", (dtype, Hq, Hkv) => {
    const B = 2, E = 64, Ev = 40;
    // Past one 512-key segment (decode splits 513 and more keys); after each append the last
    // min(n, 5) new positions attend (attend's default offset: length − Lq).
    const steps = [37, 300, 176, 1, 6];
    const total = steps.reduce((a, b) => a + b, 0);
    const k = randomTensor([B, Hkv, total, E], 15), v = randomTensor([B, Hkv, total, Ev], 16);
    const halves = dtype === 'float16';
    const kStored = halves ? roundedToHalves(k) : k, vStored = halves ? roundedToHalves(v) : v;
    const sinks = Float32Array.from({ length: Hq }, (_, h) => [1.5, -Infinity, 0, 3][h % 4]);
    for (const extra of [{}, { slidingWindow: 64, sinks, attnMask: null }, { isCausal: false, dropoutP: 0.8 }]) {
      const caches = [attn, attn2].map((instance) => instance.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: total, dtype }));
      try {
        let length = 0;
        for (const [s, n] of steps.entries()) {
          for (const cache of caches) cache.append(positions(k, length, length + n), positions(v, length, length + n));
          length += n;
          const Lq = Math.min(n, 5);
          const query = randomTensor([B, Hq, Lq, E], 100 + s);
          // A seed of its own at every step, some above 2^31; a float mask [Lq, length] unless null.
          const { attnMask: maskGiven, ...rest } = extra;
          const options = {
            dropoutP: 0.3, dropoutSeed: (length * 0x9E3779B1) >>> 0, returnWeights: true, returnLogSumExp: true,
            ...(maskGiven === null ? {} : { attnMask: { data: randn(Lq * length, 200 + s), dims: [Lq, length] } }), ...rest,
          };
          const [got, two] = caches.map((cache) => cache.attend(query, options));
          const sameBits = (a, b) => {
            const x = bits(a), y = bits(b);
            return x.length === y.length && x.every((word, i) => word === y[i]);
          };
          expect(sameBits(two.output.data, got.output.data)).toBe(true);
          expect(sameBits(two.weights.data, got.weights.data)).toBe(true);
          // attend's defaults spelled out: bottom-right causal (none with isCausal: false).
          const full = { isCausal: true, causalOffset: length - Lq, ...options };
          if (full.isCausal === false) delete full.causalOffset;
          const key = positions(kStored, 0, length), value = positions(vStored, 0, length);
          const ref = referenceSdpa(query, key, value, full);
          expect(maxRelError(got.output.data, ref.output)).toBeLessThanOrEqual(TOL);
          expect(maxRelError(got.weights.data, ref.weights)).toBeLessThanOrEqual(TOL);
          // The log-sum-exp is the softmax's own: the bits of the same attend without dropout.
          const { dropoutP: _p, dropoutSeed: _s, ...none } = options;
          expect(sameBits(caches[0].attend(query, none).logSumExp.data, got.logSumExp.data)).toBe(true);
          // sdpa() over the history as stored, with the same options: the same result and mask.
          const { returnLogSumExp: _l, ...fullNoLse } = full;
          const direct = attn.sdpa(query, key, value, fullNoLse);
          expect(maxRelError(got.output.data, Float64Array.from(direct.output.data))).toBeLessThanOrEqual(TOL);
          expect(maxRelError(got.weights.data, Float64Array.from(direct.weights.data))).toBeLessThanOrEqual(TOL);
          let otherMask = 0, drops = 0;
          got.weights.data.forEach((x, n) => {
            if ((x === 0) !== (direct.weights.data[n] === 0)) otherMask++;
            if (x === 0) drops++;
          });
          expect(otherMask).toBe(0);
          expect(drops).toBeGreaterThan(0);
        }
      } finally {
        for (const cache of caches) cache.dispose();
      }
    }
  });

  test('float16 cache, a dropout factor of 2^17 on a kept key holding nearly all of its row: finite, the reference (once Inf)', () => {
    // The kernel reads a float16 cache as value·2^-112 and carries the probabilities times
    // 2^112 where that stays finite; p·z near 2^17 did not (fixed in the kernel). Key 1234 of
    // each head is 8·q (p near 1); the seed is the first from 1 keeping it in some head.
    const B = 1, H = 8, L = 2048, E = 64, dominant = 1234;
    const dropoutP = 1 - 2 ** -17;  // threshold 2^32 - 2^15: z = 2^17
    const query = randomTensor([B, H, 1, E], 31);
    const key = randomTensor([B, H, L, E], 32), value = randomTensor([B, H, L, E], 33);
    for (let h = 0; h < H; h++) {
      for (let e = 0; e < E; e++) key.data[(h * L + dominant) * E + e] = 8 * query.data[h * E + e];
    }
    const keptIn = (seed) => {
      const rows = dropoutRows({ dropoutP, dropoutSeed: seed });
      return Array.from({ length: H }, (_, h) => rows(0, h, 0)(dominant) > 0);
    };
    let dropoutSeed = 1;
    while (!keptIn(dropoutSeed).some(Boolean)) dropoutSeed++;
    const options = { dropoutP, dropoutSeed, returnWeights: true };
    const ref = referenceSdpa(query, roundedToHalves(key), roundedToHalves(value), { ...options, isCausal: true, causalOffset: L - 1 });
    const results = [];
    for (const instance of [attn, attn2]) {
      const cache = instance.createKVCache({ batch: B, kvHeads: H, headDim: E, maxLength: L, dtype: 'float16' });
      try {
        cache.append(key, value);
        results.push(cache.attend(query, options));
      } finally {
        cache.dispose();
      }
    }
    const [got, two] = results;
    expect(got.output.data.every(Number.isFinite)).toBe(true);
    expect(maxRelError(got.output.data, ref.output)).toBeLessThanOrEqual(TOL);
    expect(maxRelError(got.weights.data, ref.weights)).toBeLessThanOrEqual(TOL);
    keptIn(dropoutSeed).forEach((kept, h) => {
      if (kept) expect(got.weights.data[h * L + dominant]).toBeGreaterThan(0.99 * 2 ** 17);
    });
    expect(Array.from(bits(two.output.data))).toEqual(Array.from(bits(got.output.data)));
  });

  test('one and two threads give bitwise the same outputs, float32 and float16, GQA and MHA, with weights or not', () => {
    // GQA (4 query rows per tile) and MHA (one row per tile: the float16 tiles read in 8
    // streams, float32 in 2), each past 512 keys (split-K segments) and, for the single tokens
    // after the long chunk, 4e6 multiply-adds (the pool's threshold), with key counts that are
    // not a multiple of any stream count.
    // (The first differing element, -1 for none: toEqual over millions of elements is slow.)
    const firstDifference = (a, b) => {
      const x = bits(a), y = bits(b);
      if (x.length !== y.length) return `lengths ${x.length} and ${y.length}`;
      for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return i;
      return -1;
    };
    for (const heads of [{ Hq: 32, Hkv: 8 }, { Hq: 16, Hkv: 16 }]) {
      for (const dtype of ['float32', 'float16']) {
        const shape = { ...heads, E: 128, steps: [37, 1, 3, 1000, 1, 1], dtype, seed: 5 };
        const one = decode(attn, shape), two = decode(attn2, shape);
        one.results.forEach((r, s) => expect(firstDifference(two.results[s].got.output.data, r.got.output.data)).toBe(-1));
        // With weights (written after the key segments are merged): the same output bits, and
        // the same weights on one and two threads.
        const weighted = { ...shape, options: () => ({ returnWeights: true }) };
        const oneWeighted = decode(attn, weighted), twoWeighted = decode(attn2, weighted);
        oneWeighted.results.forEach((r, s) => {
          expect(firstDifference(r.got.output.data, one.results[s].got.output.data)).toBe(-1);
          expect(firstDifference(twoWeighted.results[s].got.weights.data, r.got.weights.data)).toBe(-1);
        });
      }
    }
  });

  test('isCausal defaults to true with causalOffset = length − Lq; both can be overridden', () => {
    const shape = { Hq: 4, Hkv: 2, E: 16, steps: [37, 5, 1] };
    // Not causal: every new row sees all positions, its own future ones too.
    expectMatchesReference(decode(attn, { ...shape, options: () => ({ isCausal: false }) }));
    // Another offset (one position less visible), and per-batch offsets.
    expectMatchesReference(decode(attn, { ...shape, options: (length, n) => ({ isCausal: true, causalOffset: length - n - 1 }) }));
    expectMatchesReference(decode(attn, {
      ...shape, B: 2, options: (length, n) => ({ causalOffset: Int32Array.from([length - n, 2 - n]) }),
    }));
  });

  test('every sdpa option through attend: masks, softcap, scale, weights, log-sum-exp, out, layout bshd', () => {
    const B = 2, Hq = 8, Hkv = 2, E = 32, Ev = 24;
    const shape = { B, Hq, Hkv, E, Ev, steps: [37, 1, 4, 129] };
    const masks = [
      (length, n) => ({ data: randn(B * Hq * n * length, length), dims: [B, Hq, n, length] }),
      (length) => ({ data: Uint8Array.from({ length }, (_, j) => (j % 3 === 1 ? 0 : 1)), dims: [length] }),
      (length, n) => ({ data: Float32Array.from({ length: B * n * length }, (_, i) => (i % 5 === 0 ? -Infinity : 0.5)), dims: [B, 1, n, length] }),
    ];
    for (const mask of masks) {
      expectMatchesReference(decode(attn, { ...shape, options: (length, n) => ({ attnMask: mask(length, n), returnWeights: true }) }));
    }
    expectMatchesReference(decode(attn, { ...shape, options: () => ({ softcap: 2.5, scale: 0.3 }) }));
    // The log-sum-exp, with weights or not, a row fully masked (-Infinity) among them; and the
    // output has the bits of the call without it.
    const blockFirstRow = (length, n) => ({ data: Uint8Array.from({ length: n * length }, (_, i) => (i < length ? 0 : 1)), dims: [n, length] });
    for (const returnWeights of [false, true]) {
      const withLse = decode(attn, { ...shape, options: (length, n) => ({ attnMask: blockFirstRow(length, n), returnLogSumExp: true, returnWeights }) });
      expectMatchesReference(withLse);
      const without = decode(attn, { ...shape, options: (length, n) => ({ attnMask: blockFirstRow(length, n) }) });
      withLse.results.forEach((r, s) => expect(bits(r.got.output.data)).toEqual(bits(without.results[s].got.output.data)));
    }

    // out: the output lands in the caller's buffer (a view of its start when larger).
    const cache = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: 64 });
    try {
      const k = randomTensor([B, Hkv, 40, E], 1), v = randomTensor([B, Hkv, 40, Ev], 2);
      cache.append(k, v);
      const query = randomTensor([B, Hq, 3, E], 3);
      const out = new Float32Array(B * Hq * 3 * Ev + 10).fill(7);
      const got = cache.attend(query, { out });
      expect(got.output.data.buffer).toBe(out.buffer);
      expect(Array.from(out.subarray(B * Hq * 3 * Ev))).toEqual(new Array(10).fill(7));
      const ref = referenceSdpa(query, k, v, { isCausal: true, causalOffset: 37 });
      expect(maxRelError(got.output.data, ref.output)).toBeLessThanOrEqual(TOL);

      // bshd: append [B, Lnew, Hkv, E] and attend [B, Lq, Hq, E] → [B, Lq, Hq, Ev].
      const bshd = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: 64 });
      try {
        bshd.append(toBshd(positions(k, 0, 25)), toBshd(positions(v, 0, 25)), { layout: 'bshd' });
        bshd.append(positions(k, 25, 40), positions(v, 25, 40));  // layouts may alternate
        const got2 = bshd.attend(toBshd(query), { layout: 'bshd' });
        expect(got2.output.dims).toEqual([B, 3, Hq, Ev]);
        expect(got2.output.data).toEqual(toBshd({ data: got.output.data, dims: [B, Hq, 3, Ev] }).data);
      } finally {
        bshd.dispose();
      }
    } finally {
      cache.dispose();
    }
  });

  test('ragged batches: keyLengths, NaN in the padded positions never reaches the output', () => {
    const B = 3, Hq = 4, Hkv = 2, E = 64, L = 700;
    const k = randomTensor([B, Hkv, L, E], 11), v = randomTensor([B, Hkv, L, E], 12);
    const keyLengths = Int32Array.from([700, 513, 3]);
    for (let b = 0; b < B; b++) {
      for (let h = 0; h < Hkv; h++) {
        const row = (b * Hkv + h) * L;
        k.data.fill(NaN, (row + keyLengths[b]) * E, (row + L) * E);
        v.data.fill(NaN, (row + keyLengths[b]) * E, (row + L) * E);
      }
    }
    for (const dtype of ['float32', 'float16', 'bfloat16']) {
      const cache = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, maxLength: L, dtype });
      try {
        cache.append(positions(k, 0, 300), positions(v, 0, 300));
        cache.append(positions(k, 300, L), positions(v, 300, L));
        const query = randomTensor([B, Hq, 1, E], 13);
        const options = { keyLengths, causalOffset: Int32Array.from(keyLengths, (n) => n - 1) };
        const got = cache.attend(query, options);
        const ref = referenceSdpa(query, storedValues(dtype, k), storedValues(dtype, v), { isCausal: true, ...options });
        expect(maxRelError(got.output.data, ref.output)).toBeLessThanOrEqual(TOL);
      } finally {
        cache.dispose();
      }
    }
  });

  // Prompts of different lengths in one batch, padded to the longest as Hugging Face pads them
  // (left) or at their ends (right). Every append advances every batch, so after the prompt the
  // padding sits between real positions, where keyLengths cannot describe it: a boolean key mask
  // [B, 1, 1, length], 0 over each batch's padding, rebuilt each step (README, KV cache). Each
  // sequence must then equal its own history alone (no padding) under the default causal
  // alignment; padding K/V hold NaN, which must not reach any output.
  // Left padding alone (before every real position) is also what keyStarts says, with no mask.
  test.each([['left', 'a key mask rebuilt each step'], ['right', 'a key mask rebuilt each step'], ['left', 'keyStarts (no mask)']])(
    'prompts of different lengths, %s-padded, %s: each sequence equals its own history alone', (side, how) => {
    const B = 3, Hq = 4, Hkv = 2, E = 64, promptLengths = [37, 20, 5], P = 37, steps = [1, 1, 3, 1];
    const total = P + steps.reduce((a, b) => a + b, 0);
    const padOf = (b) => (side === 'left' ? [0, P - promptLengths[b]] : [promptLengths[b], P]);  // [from, to) in the cache
    // Each sequence's own keys and values, prompt then generated positions: [1, Hkv, own length, E].
    const own = promptLengths.map((n, b) => ({
      k: randomTensor([1, Hkv, n + total - P, E], 100 + b), v: randomTensor([1, Hkv, n + total - P, E], 200 + b),
    }));
    // Batch b's rows [a, c) of its own positions, placed at cache positions [at, at + c - a) of t.
    const place = (t, b, src, a, c, at) => {
      const L = t.dims[2], srcL = src.dims[2];
      for (let h = 0; h < Hkv; h++) {
        t.data.set(src.data.subarray((h * srcL + a) * E, (h * srcL + c) * E), ((b * Hkv + h) * L + at) * E);
      }
    };
    const batchTensor = (L, fill) => ({ data: new Float32Array(B * Hkv * L * E).fill(fill), dims: [B, Hkv, L, E] });
    const keyMask = (length) => {
      const mask = new Uint8Array(B * length).fill(1);
      for (let b = 0; b < B; b++) mask.fill(0, b * length + padOf(b)[0], b * length + padOf(b)[1]);
      return { data: mask, dims: [B, 1, 1, length] };
    };
    for (const dtype of ['float32', 'float16', 'bfloat16']) {
      const ref = own.map(({ k, v }) => ({ k: storedValues(dtype, k), v: storedValues(dtype, v) }));
      const cache = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, maxLength: total, dtype });
      try {
        // The prompt: each batch's real positions around its padding (NaN).
        const pk = batchTensor(P, NaN), pv = batchTensor(P, NaN);
        for (let b = 0; b < B; b++) {
          const at = side === 'left' ? P - promptLengths[b] : 0;
          place(pk, b, own[b].k, 0, promptLengths[b], at);
          place(pv, b, own[b].v, 0, promptLengths[b], at);
        }
        cache.append(pk, pv);
        // After each append: a query for the n newest positions, against each sequence alone.
        const attendAndCheck = (n, generated) => {
          const length = cache.length, isPrompt = length === P;
          const query = randomTensor([B, Hq, n, E], 300 + length);
          const got = cache.attend(query, how.startsWith('keyStarts')
            ? { keyStarts: Int32Array.from(promptLengths, (n) => P - n) } : { attnMask: keyMask(length) });
          expect(got.output.data.every((x) => !Number.isNaN(x))).toBe(true);
          const ofBatch = (t, b) => ({ data: t.data.slice(b * Hq * n * E, (b + 1) * Hq * n * E), dims: [1, Hq, n, E] });
          for (let b = 0; b < B; b++) {
            // The query rows that are sequence b's real positions, [first, last), and its own length.
            const [first, last] = !isPrompt ? [0, n] : side === 'left' ? [P - promptLengths[b], P] : [0, promptLengths[b]];
            const ownLength = promptLengths[b] + generated;
            const alone = referenceSdpa(positions(ofBatch(query, b), first, last), positions(ref[b].k, 0, ownLength),
              positions(ref[b].v, 0, ownLength), { isCausal: true, causalOffset: ownLength - (last - first) });
            const error = maxRelError(positions(ofBatch(got.output, b), first, last).data, alone.output);
            if (!(error <= TOL)) throw new Error(`${dtype}, batch ${b}, at length ${length}: error ${error} > ${TOL}`);
            // Left padding: the padding's own query rows attend to nothing (exact zeros).
            if (isPrompt && side === 'left') expect(positions(ofBatch(got.output, b), 0, first).data.every((x) => Object.is(x, 0))).toBe(true);
          }
        };
        attendAndCheck(P, 0);
        let generated = 0;
        for (const n of steps) {
          const nk = batchTensor(n, 0), nv = batchTensor(n, 0);
          for (let b = 0; b < B; b++) {
            const from = promptLengths[b] + generated;
            place(nk, b, own[b].k, from, from + n, 0);
            place(nv, b, own[b].v, from, from + n, 0);
          }
          cache.append(nk, nv);
          generated += n;
          attendAndCheck(n, generated);
        }
      } finally {
        cache.dispose();
      }
    }
  });

  test('truncate rewinds: a rejected draft, then other positions appended, equal the new history', () => {
    const Hq = 8, Hkv = 2, E = 64;
    const k = randomTensor([1, Hkv, 400, E], 21), v = randomTensor([1, Hkv, 400, E], 22);
    const draftK = randomTensor([1, Hkv, 5, E], 23), draftV = randomTensor([1, Hkv, 5, E], 24);
    for (const dtype of ['float32', 'float16', 'bfloat16']) {
      const cache = attn.createKVCache({ batch: 1, kvHeads: Hkv, headDim: E, maxLength: 400, dtype });
      try {
        cache.append(positions(k, 0, 300), positions(v, 0, 300));
        cache.append(draftK, draftV);  // a draft of 5, verified, then rejected after 2
        cache.attend(randomTensor([1, Hq, 5, E], 25));
        cache.truncate(302);
        expect(cache.length).toBe(302);
        cache.truncate(300);
        cache.append(positions(k, 300, 400), positions(v, 300, 400));
        expect(cache.length).toBe(400);
        const query = randomTensor([1, Hq, 1, E], 26);
        const got = cache.attend(query);
        const ref = referenceSdpa(query, storedValues(dtype, k), storedValues(dtype, v), { isCausal: true, causalOffset: 399 });
        expect(maxRelError(got.output.data, ref.output)).toBeLessThanOrEqual(TOL);
        cache.reset();
        expect(cache.length).toBe(0);
        // Nothing stored: every row is empty, exact zeros (weights: [.., Lq, 0]).
        const empty = cache.attend(query, { returnWeights: true });
        expect(Array.from(empty.output.data).every((x) => Object.is(x, 0))).toBe(true);
        expect(empty.weights.dims).toEqual([1, Hq, 1, 0]);
        // truncate(-0) is truncate(0): the length reads 0, not -0.
        cache.append(draftK, draftV);
        cache.truncate(-0);
        expect(Object.is(cache.length, 0)).toBe(true);
      } finally {
        cache.dispose();
      }
    }
  });

  test('the wasm memory grows mid-sequence (another large cache): the stored positions are intact', async () => {
    const handle = await loader.acquireModule(1);
    try {
      const Hq = 8, Hkv = 4, E = 64;
      const k = randomTensor([1, Hkv, 600, E], 31), v = randomTensor([1, Hkv, 600, E], 32);
      const cache = attn.createKVCache({ batch: 1, kvHeads: Hkv, headDim: E, maxLength: 600 });
      try {
        cache.append(positions(k, 0, 300), positions(v, 0, 300));
        const heapBefore = handle.module.HEAPU8.length;
        // More than the whole current heap: the memory must grow (and its buffer is replaced).
        const big = attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 256, maxLength: Math.ceil(heapBefore / 2048) + 1 });
        try {
          expect(handle.module.HEAPU8.length).toBeGreaterThan(heapBefore);
          big.append(randomTensor([1, 1, 100, 256], 33), randomTensor([1, 1, 100, 256], 34));
          cache.append(positions(k, 300, 600), positions(v, 300, 600));
          const query = randomTensor([1, Hq, 1, E], 35);
          const ref = referenceSdpa(query, k, v, { isCausal: true, causalOffset: 599 });
          expect(maxRelError(cache.attend(query).output.data, ref.output)).toBeLessThanOrEqual(TOL);
        } finally {
          big.dispose();
        }
      } finally {
        cache.dispose();
      }
    } finally {
      handle.release();
    }
  });
});

describe('remove(start, end): positions dropped, the later ones moved down', () => {
  /** The positions `held` (indices into t's L axis) of a bhsd tensor t, in that order. */
  function gather(t, held) {
    const [B, H, L, D] = t.dims;
    const data = new Float32Array(B * H * held.length * D);
    for (let bh = 0; bh < B * H; bh++) {
      held.forEach((from, to) => data.set(t.data.subarray((bh * L + from) * D, (bh * L + from + 1) * D), (bh * held.length + to) * D));
    }
    return { data, dims: [B, H, held.length, D] };
  }

  // A sequence of appends, removes and attends, against a model of which source positions the
  // cache holds (`held`): a prompt, a sliding window of W kept by remove(0, ·) before each token,
  // a kept prefix of 4 (attention sinks) with the range after it removed, a chunk of 3, a
  // removal of the end (as truncate), and a no-op. Each attend equals the reference over the
  // held positions with the default bottom-right alignment; one and two threads are bitwise
  // equal.
  test.each([['float32'], ['float16']])('%s: a sliding window, attention sinks, then appends go on; equal to the reference over what is held', (dtype) => {
    const B = 2, Hq = 8, Hkv = 2, E = 64, Ev = 48, W = 40, total = 200;
    const k = randomTensor([B, Hkv, total, E], 61), v = randomTensor([B, Hkv, total, Ev], 62);
    const ref = dtype === 'float16' ? { k: roundedToHalves(k), v: roundedToHalves(v) } : { k, v };
    const outputs = [];
    for (const instance of [attn, attn2]) {
      const cache = instance.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: 64, dtype });
      const out = [];
      try {
        let next = 0, held = [];
        const append = (n) => {
          cache.append(positions(k, next, next + n), positions(v, next, next + n));
          for (let i = 0; i < n; i++) held.push(next + i);
          next += n;
        };
        const remove = (start, end) => {
          cache.remove(start, end);
          held = [...held.slice(0, start), ...held.slice(end)];
          expect(cache.length).toBe(held.length);
        };
        const attend = (n, seed) => {
          const query = randomTensor([B, Hq, n, E], seed);
          const got = cache.attend(query, { returnWeights: true });
          const want = referenceSdpa(query, gather(ref.k, held), gather(ref.v, held), { isCausal: true, causalOffset: held.length - n, returnWeights: true });
          const error = Math.max(maxRelError(got.output.data, want.output), maxRelError(got.weights.data, want.weights));
          if (!(error <= TOL)) throw new Error(`${dtype}: attend of ${n} rows holding [${held.join(',')}]: error ${error} > ${TOL}`);
          out.push(got.output.data);
        };
        append(37);
        attend(37, 1);
        for (let step = 0; step < 30; step++) {  // a sliding window of W positions
          if (held.length + 1 > W) remove(0, held.length + 1 - W);
          append(1);
          expect(cache.length).toBeLessThanOrEqual(W);
          attend(1, 100 + step);
        }
        remove(4, 24);  // keep the first 4 (sinks), drop the next 20
        append(3);
        attend(3, 200);
        remove(held.length - 2, held.length);  // the end: as truncate
        remove(5, 5);                            // nothing
        attend(2, 201);
        remove(0, held.length);                  // everything: an empty cache gives zeros
        expect(cache.attend(randomTensor([B, Hq, 1, E], 202)).output.data.every((x) => Object.is(x, 0))).toBe(true);
        append(5);
        attend(5, 203);
      } finally {
        cache.dispose();
      }
      outputs.push(out);
    }
    expect(outputs[1].map((o) => bitsHash(o))).toEqual(outputs[0].map((o) => bitsHash(o)));
  });

  // The README's recipe for a sliding window of W over chunks of Lnew rows with a cache of room
  // 2W: only when the next chunk would not fit, keep the newest W - 1 positions; the
  // slidingWindow option (or a band mask) keeps each row to its own window. Against the
  // reference over the whole history with the window as a mask (what a cache holding
  // everything computes).
  test('a sliding window kept by remove() over chunks of 3 rows, room 2W: equal to windowed attention over the whole history', () => {
    const B = 1, Hq = 4, Hkv = 2, E = 32, W = 8, Lnew = 3, chunks = 12, total = Lnew * chunks;
    const k = randomTensor([B, Hkv, total, E], 81), v = randomTensor([B, Hkv, total, E], 82);
    // A mask [rows, keys]: row i (history position firstRow + i) may attend key j (history
    // position firstKey + j) when it is within the row's window: row - W < key <= row.
    const band = (rows, firstRow, firstKey, keys) => {
      const mask = new Uint8Array(rows * keys);
      for (let i = 0; i < rows; i++) {
        for (let j = 0; j < keys; j++) {
          const row = firstRow + i, key = firstKey + j;
          mask[i * keys + j] = key <= row && key > row - W ? 1 : 0;
        }
      }
      return { data: mask, dims: [rows, keys] };
    };
    const cache = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, maxLength: 2 * W });
    try {
      let removed = 0;  // positions removed from the front so far: cache position 0 is history position `removed`
      for (let c = 0; c < chunks; c++) {
        const from = c * Lnew;
        if (cache.length + Lnew > cache.maxLength) {
          const drop = cache.length - (W - 1);
          cache.remove(0, drop);
          removed += drop;
        }
        cache.append(positions(k, from, from + Lnew), positions(v, from, from + Lnew));
        const query = randomTensor([B, Hq, Lnew, E], 900 + c);
        const got = cache.attend(query, { attnMask: band(Lnew, from, removed, cache.length) });
        const windowed = cache.attend(query, { slidingWindow: W });
        const whole = referenceSdpa(query, positions(k, 0, from + Lnew), positions(v, 0, from + Lnew),
          { attnMask: band(Lnew, from, 0, from + Lnew) });
        expect(maxRelError(got.output.data, whole.output)).toBeLessThanOrEqual(TOL);
        expect(maxRelError(windowed.output.data, whole.output)).toBeLessThanOrEqual(TOL);
      }
      expect(removed).toBeGreaterThan(0);
    } finally {
      cache.dispose();
    }
  });

  test('the worker: the same lengths and bits as the direct cache', async () => {
    const B = 1, Hq = 4, Hkv = 2, E = 32;
    const k = randomTensor([B, Hkv, 30, E], 71), v = randomTensor([B, Hkv, 30, E], 72), query = randomTensor([B, Hq, 1, E], 73);
    const worker = await createAttentionWorker({ threads: 1 });
    try {
      const direct = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, maxLength: 30 });
      const remote = await worker.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, maxLength: 30 });
      try {
        for (const c of [direct, remote]) {
          await c.append(k, v);
          await c.remove(3, 17);
        }
        expect([direct.length, remote.length]).toEqual([16, 16]);
        const [a, b] = [direct.attend(query), await remote.attend(query)];
        expect(bitsHash(b.output.data)).toBe(bitsHash(a.output.data));
        await expect(remote.remove(0, 17)).rejects.toThrow(new RangeError('KVCache.remove: end must be an integer in [start = 0, length = 16], got 17'));
        expect(remote.length).toBe(16);
      } finally {
        direct.dispose();
        await remote.dispose();
      }
    } finally {
      await worker.dispose();
    }
  });
});

describe('read(start, end): a copy of the stored positions, as append() takes them', () => {
  const B = 2, Hkv = 3, E = 8, Ev = 5, L = 37;
  const k = randomTensor([B, Hkv, L, E], 130), v = randomTensor([B, Hkv, L, Ev], 131);
  const sameBits = (a, b) => a.length === b.length && a.every((x, i) => Object.is(x, b[i]));
  /** A cache holding k, v, appended in chunks of 1, 5 and the rest. */
  function filled(instance, dtype, maxLength = L + 3) {
    const cache = instance.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength, dtype });
    for (const [a, b] of [[0, 1], [1, 6], [6, L]]) cache.append(positions(k, a, b), positions(v, a, b));
    return cache;
  }

  test.each([['float32'], ['float16'], ['bfloat16']])('%s: every range, both layouts, the stored bits (16-bit: the elements append stored)', (dtype) => {
    const cache = filled(attn, dtype);
    try {
      // What the cache holds, as floats: float32 as given, 16-bit rounded to nearest even.
      const stored = (t) => storedValues(dtype, t);
      const asFloats = (t) => ({ data: dtype === 'float32' ? t.data : Float32Array.from(t.data, (x) => storedElementValue(dtype, x)), dims: t.dims });
      for (const [a, b] of [[0, L], [0, 1], [36, 37], [5, 29], [17, 17], [0, 0]]) {
        const bhsd = a === 0 && b === L ? cache.read() : cache.read(a, b);
        expect(bhsd.key.data.constructor).toBe(dtype === 'float32' ? Float32Array : Uint16Array);
        expect([bhsd.key.dims, bhsd.value.dims]).toEqual([[B, Hkv, b - a, E], [B, Hkv, b - a, Ev]]);
        expect(sameBits(asFloats(bhsd.key).data, positions(stored(k), a, b).data)).toBe(true);
        expect(sameBits(asFloats(bhsd.value).data, positions(stored(v), a, b).data)).toBe(true);
        const bshd = cache.read(a, b, { layout: 'bshd' });
        expect([bshd.key.dims, bshd.value.dims]).toEqual([[B, b - a, Hkv, E], [B, b - a, Hkv, Ev]]);
        expect(sameBits(bshd.key.data, toBshd(bhsd.key).data)).toBe(true);
        expect(sameBits(bshd.value.data, toBshd(bhsd.value).data)).toBe(true);
      }
      expect(cache.read(undefined, 4).key.dims).toEqual([B, Hkv, 4, E]);
      expect(cache.read(30).key.dims).toEqual([B, Hkv, 7, E]);
      expect(cache.length).toBe(L);
    } finally {
      cache.dispose();
    }
  });

  test.each([['float32'], ['float16'], ['bfloat16']])('%s: restored into another cache (a saved prompt, a forked conversation), attend gives the same bits', (dtype) => {
    const source = filled(attn, dtype);
    const copy = attn2.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: 64, dtype });
    try {
      const { key, value } = source.read(0, 30, { layout: 'bshd' });
      copy.append(key, value, { layout: 'bshd' });
      source.truncate(30);
      const query = randomTensor([B, 6, 2, E], 132);
      expect(bits(copy.attend(query).output.data)).toEqual(bits(source.attend(query).output.data));
      // Both go on: the fork appends its own positions, the source others.
      copy.append(positions(k, 30, 31), positions(v, 30, 31));
      expect(sameBits(copy.read(30).key.data, source.read(0, 1).key.data)).toBe(false);
      expect(sameBits(copy.read(0, 30).key.data, source.read().key.data)).toBe(true);
    } finally {
      source.dispose();
      copy.dispose();
    }
  });

  test('after remove, reorder and truncate, and after the wasm memory grew: what the cache holds', () => {
    const cache = filled(attn, 'float32');
    try {
      cache.remove(3, 10);  // held: 0..2, 10..36
      cache.reorder(Int32Array.of(1, 1));
      cache.truncate(20);
      const held = [0, 1, 2, ...Array.from({ length: 17 }, (_, i) => 10 + i)];
      const capacity = attn.memory().capacityBytes;
      // More than the memory's capacity: it grows (the heap views made before are stale).
      const big = attn.createKVCache({ batch: 1, kvHeads: 8, headDim: 128, maxLength: Math.ceil(capacity / 4096) + 1 });
      try {
        expect(attn.memory().capacityBytes).toBeGreaterThan(capacity);
        const { key } = cache.read();
        const [, , , D] = k.dims;
        for (let b = 0; b < B; b++) {
          for (let h = 0; h < Hkv; h++) {
            held.forEach((from, to) => {
              const want = k.data.subarray(((1 * Hkv + h) * L + from) * D, ((1 * Hkv + h) * L + from + 1) * D);  // batch 1's rows
              const got = key.data.subarray(((b * Hkv + h) * 20 + to) * D, ((b * Hkv + h) * 20 + to + 1) * D);
              expect(sameBits(got, want)).toBe(true);
            });
          }
        }
      } finally {
        big.dispose();
      }
    } finally {
      cache.dispose();
    }
  });

  test("{ dtype: 'float32' } widens a float16 cache's halves exactly: every one of the 65536 patterns, both layouts; a float32 cache has no halves to give", () => {
    // Every half pattern stored raw (append takes Uint16Array halves as they are), [1, 2, 128, 256].
    const all = { data: Uint16Array.from({ length: 65536 }, (_, h) => h), dims: [1, 2, 128, 256] };
    const cache = attn.createKVCache({ batch: 1, kvHeads: 2, headDim: 256, maxLength: 128, dtype: 'float16' });
    const f32 = filled(attn, 'float32');
    try {
      cache.append(all, all);
      for (const layout of ['bhsd', 'bshd']) {
        const halves = cache.read(0, 128, { layout }), widened = cache.read(0, 128, { layout, dtype: 'float32' });
        expect(cache.read(0, 128, { layout, dtype: 'float16' }).key.data).toEqual(halves.key.data);
        for (const plane of ['key', 'value']) {
          expect(widened[plane].data.constructor).toBe(Float32Array);
          expect(widened[plane].dims).toEqual(halves[plane].dims);
          // The definition (tests/shared/onnx-cases.mjs, halfToFloat), element by element.
          const wrong = Array.from(halves[plane].data).findIndex((h, i) => !Object.is(widened[plane].data[i], halfToFloat(h)));
          expect(wrong).toBe(-1);
        }
      }
      expect(cache.read(5, 5, { dtype: 'float32' }).key.dims).toEqual([1, 2, 0, 256]);
      // A float32 cache: float32 as it is (the same bits); no halves.
      expect(sameBits(f32.read(0, L, { dtype: 'float32' }).key.data, f32.read().key.data)).toBe(true);
      expect(() => f32.read(0, 1, { dtype: 'float16' })).toThrow(new RangeError(
        "KVCache.read: options.dtype 'float16' needs a float16 cache; this one stores float32 (read it as 'float32')"));
    } finally {
      cache.dispose();
      f32.dispose();
    }
  });

  test('bad input: a typed error naming the argument, the cache unchanged; a disposed cache throws', () => {
    const cache = filled(attn, 'float16');
    try {
      const before = cache.read().key.data;
      for (const [args, Cls, message] of [
        [[-1], RangeError, 'KVCache.read: start must be an integer in [0, length = 37], got -1'],
        [[0, 38], RangeError, 'KVCache.read: end must be an integer in [start = 0, length = 37], got 38'],
        [[5, 4], RangeError, 'KVCache.read: end must be an integer in [start = 5, length = 37], got 4'],
        [[1.5], RangeError, 'KVCache.read: start must be an integer in [0, length = 37], got 1.5'],
        [['1'], TypeError, 'KVCache.read: start must be an integer, got "1"'],
        [[0, null], TypeError, 'KVCache.read: end must be an integer, got null'],
        [[0, 5, { layout: 'bsdh' }], RangeError, "KVCache.read: options.layout must be 'bhsd' or 'bshd', got \"bsdh\""],
        [[0, 5, { type: 'float32' }], TypeError, 'KVCache.read: unknown option "type"; known options: layout, dtype'],
        [[0, 5, { dtype: 'int8' }], RangeError, "KVCache.read: options.dtype must be 'float32', 'float16' or 'bfloat16', got \"int8\""],
        [[0, 5, { dtype: 'bfloat16' }], RangeError, "KVCache.read: options.dtype 'bfloat16' needs a bfloat16 cache; this one stores float16 (read it as 'float16' or 'float32')"],
        [[0, 5, { dtype: 32 }], TypeError, "KVCache.read: options.dtype must be 'float32', 'float16' or 'bfloat16', got 32"],
      ]) {
        expect(() => cache.read(...args)).toThrow(new Cls(message));
      }
      expect(cache.length).toBe(L);
      expect(sameBits(cache.read().key.data, before)).toBe(true);
    } finally {
      cache.dispose();
    }
    expect(() => cache.read()).toThrow(new Error('KVCache.read: this KVCache has been disposed'));
    expect(attn.memory().bytesInUse).toBe(0);
  });

  test('the worker: the same bits, at the call\'s turn (after the calls made before it), and the same errors', async () => {
    const worker = await createAttentionWorker({ threads: 1 });
    try {
      const direct = filled(attn, 'float16');
      const remote = await worker.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: L + 3, dtype: 'float16' });
      try {
        // Made without awaiting: the read sees the appends before it and not the truncate after.
        remote.append(positions(k, 0, 1), positions(v, 0, 1));
        remote.append(positions(k, 1, L), positions(v, 1, L));
        const reading = remote.read(2, 30, { layout: 'bshd' });
        const truncated = remote.truncate(4);
        const got = await reading;
        await truncated;
        const want = direct.read(2, 30, { layout: 'bshd' });
        expect([got.key.dims, got.value.dims]).toEqual([want.key.dims, want.value.dims]);
        expect(Object.prototype.toString.call(got.key.data)).toBe('[object Uint16Array]');  // (made in another realm than Jest's)
        expect([sameBits(got.key.data, want.key.data), sameBits(got.value.data, want.value.data)]).toEqual([true, true]);
        expect(remote.length).toBe(4);
        // Widened in the worker: the same values.
        const widened = await remote.read(0, 4, { dtype: 'float32' });
        expect(Object.prototype.toString.call(widened.value.data)).toBe('[object Float32Array]');
        expect(sameBits(Array.from(widened.value.data), Array.from(direct.read(0, 4, { dtype: 'float32' }).value.data))).toBe(true);
        for (const args of [[0, 5], [-1], [0, 5, { foo: 1 }], [0, 1, { dtype: 'half' }], [0, 1, { dtype: null }]]) {
          const error = await remote.read(...args).then(() => undefined, (e) => e);
          let expected;
          try {
            direct.truncate(4);
            direct.read(...args);
          } catch (e) {
            expected = e;
          }
          expect([error?.constructor, error?.message]).toEqual([expected.constructor, expected.message]);
        }
        await expect(remote.read(0, 1, { transfer: true })).rejects.toThrow(TypeError);
        // A getter of the options that disposes the cache: the direct API's error.
        const disposing = (c) => ({ get layout() { c.dispose(); return 'bhsd'; } });
        const gone = attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 2 });
        expect(() => gone.read(0, 0, disposing(gone))).toThrow(new Error('KVCache.read: this KVCache has been disposed'));
        const goneRemote = await worker.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 2 });
        await expect(goneRemote.read(0, 0, disposing(goneRemote))).rejects.toThrow(new Error('KVCache.read: this KVCache has been disposed'));
      } finally {
        direct.dispose();
        await remote.dispose();
      }
    } finally {
      await worker.dispose();
    }
  });
});

describe('append near maxMemoryBytes: fewer positions staged at a time, down to one', () => {
  // A float16 cache [1, 4, 1024, 64] (1 MiB of storage) given float32 positions in 'bshd': they
  // go through the staging buffer, 1 KiB a position (512 KiB for 512 positions, with room).
  const Hkv = 4, E = 64, maxLength = 1024, positionBytes = Hkv * E * 4;
  const storageBytes = 2 * Hkv * maxLength * E * 2;
  const k = randomTensor([1, Hkv, 515, E], 140), v = randomTensor([1, Hkv, 515, E], 141);
  const shape = { batch: 1, kvHeads: Hkv, headDim: E, maxLength, dtype: 'float16' };
  const sameElements = (a, b) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
  const appendBshd = (cache, from, to) => cache.append(toBshd(positions(k, from, to)), toBshd(positions(v, from, to)), { layout: 'bshd' });

  test.each([
    [512, 100 * 1024], [512, positionBytes], [512, 3 * positionBytes - 1], [3, 2 * positionBytes],
  ])('%p positions, %p bytes left beside the storage: the bits of a cache with room, the peak within the limit', async (count, room) => {
    const limited = await createAttention({ threads: 1, maxMemoryBytes: storageBytes + room });
    const cache = limited.createKVCache(shape), roomy = attn.createKVCache(shape);
    try {
      expect(limited.memory().bytesInUse).toBe(storageBytes);
      for (const c of [cache, roomy]) {
        appendBshd(c, 0, count);
        appendBshd(c, count, count + 3);
      }
      expect(cache.length).toBe(count + 3);
      expect(limited.memory().peakBytes).toBeLessThanOrEqual(storageBytes + room);
      const [got, want] = [cache.read(), roomy.read()];  // the stored halves (Uint16Array)
      expect(sameElements(got.key.data, want.key.data)).toBe(true);
      expect(sameElements(got.value.data, want.value.data)).toBe(true);
      expect(limited.memory().bytesInUse).toBe(storageBytes);
    } finally {
      cache.dispose();
      roomy.dispose();
      limited.dispose();
    }
  });

  test('not even one position fits: a RangeError naming its bytes, nothing appended, the cache goes on', async () => {
    const limited = await createAttention({ threads: 1, maxMemoryBytes: storageBytes + positionBytes - 1 });
    const cache = limited.createKVCache(shape);
    try {
      expect(() => appendBshd(cache, 0, 512)).toThrow(new RegExp(`^KVCache\\.append: needs ${positionBytes} bytes of wasm memory, more than is left`));
      expect(cache.length).toBe(0);
      expect(limited.memory().bytesInUse).toBe(storageBytes);
      // Halves in the storage's order, runs of 4 KiB or more (40 positions of 128 bytes): copied
      // straight in, no staging.
      const roomy = attn.createKVCache(shape);
      try {
        appendBshd(roomy, 0, 40);
        const { key, value } = roomy.read();
        cache.append(key, value);
        expect(cache.length).toBe(40);
        expect(sameElements(cache.read().key.data, key.data)).toBe(true);
      } finally {
        roomy.dispose();
      }
    } finally {
      cache.dispose();
      limited.dispose();
    }
  });
});

describe('reorder (beam search): batch b takes the rows batch indices[b] held', () => {
  /** t [B, H, L, D] with its batches taken in the order of indices (index_select on B). */
  const gather = (t, indices) => {
    const block = t.data.length / t.dims[0];
    const data = new Float32Array(t.data.length);
    indices.forEach((s, b) => data.set(t.data.subarray(s * block, (s + 1) * block), b * block));
    return { data, dims: t.dims };
  };

  test('the copy plan moves every batch to its place, for every index vector of B = 1 to 5', () => {
    // A simulation of the steps on labels: slot b holds the label of the batch whose rows it
    // has, SAVED (-1) is the saved copy. Each step copies from → to; nothing else moves.
    for (let B = 1; B <= 5; B++) {
      for (let n = 0; n < B ** B; n++) {
        const indices = Int32Array.from({ length: B }, (_, b) => Math.floor(n / B ** b) % B);
        const slots = Array.from({ length: B }, (_, b) => b);
        let saved = null;
        const steps = reorderSteps(indices);
        for (const [from, to] of steps) {
          const label = from === SAVED ? saved : slots[from];
          expect(label).not.toBeNull();
          if (to === SAVED) saved = label;
          else slots[to] = label;
        }
        expect(slots).toEqual(Array.from(indices));
        // Each batch that changes is written once; a batch that keeps its rows is not touched.
        const writes = steps.filter(([, to]) => to !== SAVED).map(([, to]) => to);
        expect(writes.sort()).toEqual([...indices.keys()].filter((b) => indices[b] !== b).sort());
      }
    }
  });

  test('float32 and float16, one and two threads: the same bits as a cache filled in the new order; appends and truncate go on', () => {
    const B = 4, Hq = 4, Hkv = 2, E = 16, Ev = 12, L = 23;
    const k = randomTensor([B, Hkv, L + 2, E], 41), v = randomTensor([B, Hkv, L + 2, Ev], 42);
    const query = randomTensor([B, Hq, 3, E], 43), step = randomTensor([B, Hq, 1, E], 44);
    const orders = [[0, 1, 2, 3], [1, 0, 2, 3], [1, 2, 3, 0], [2, 2, 2, 2], [3, 0, 0, 1], [1, 0, 3, 2], [0, 0, 1, 1], [3, 2, 1, 0]];
    for (const instance of [attn, attn2]) {
      for (const dtype of ['float32', 'float16']) {
        for (const order of orders) {
          const indices = Int32Array.from(order);
          const options = { batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: L + 2, dtype };
          const reordered = instance.createKVCache(options), filled = instance.createKVCache(options);
          try {
            reordered.append(positions(k, 0, L), positions(v, 0, L));
            reordered.reorder(indices);
            expect(reordered.length).toBe(L);
            filled.append(positions(gather(k, order), 0, L), positions(gather(v, order), 0, L));
            const got = reordered.attend(query).output.data;
            expect(bits(got)).toEqual(bits(filled.attend(query).output.data));
            const halves = dtype === 'float16';
            const ref = referenceSdpa(query, positions(gather(halves ? roundedToHalves(k) : k, order), 0, L),
              positions(gather(halves ? roundedToHalves(v) : v, order), 0, L), { isCausal: true, causalOffset: L - 3 });
            expect(maxRelError(got, ref.output)).toBeLessThanOrEqual(TOL);
            // The next token of every beam, then a rewind: the rows moved are whole and in place.
            for (const c of [reordered, filled]) c.append(positions(k, L, L + 2), positions(v, L, L + 2));
            expect(bits(reordered.attend(step).output.data)).toEqual(bits(filled.attend(step).output.data));
            for (const c of [reordered, filled]) c.truncate(L - 5);
            expect(bits(reordered.attend(step).output.data)).toEqual(bits(filled.attend(step).output.data));
          } finally {
            reordered.dispose();
            filled.dispose();
          }
        }
      }
    }
  });

  test('an empty cache: a valid reorder changes nothing', () => {
    const cache = attn.createKVCache({ batch: 2, kvHeads: 1, headDim: 4, maxLength: 4 });
    try {
      cache.reorder(new Int32Array([1, 1]));
      expect(cache.length).toBe(0);
    } finally {
      cache.dispose();
    }
  });

  test('the saved copy is refused by maxMemoryBytes before anything moves; a reorder without a cycle needs none', async () => {
    const B = 2, E = 64, L = 2000;
    const k = randomTensor([B, 1, L, E], 51), v = randomTensor([B, 1, L, E], 52), query = randomTensor([B, 1, 1, E], 53);
    const options = { batch: B, kvHeads: 1, headDim: E, maxLength: L };
    // Room for the cache and a decode step's blocks, not for one head's rows of a batch (512 KB).
    const bytes = B * L * 2 * E * 4;
    const small = await createAttention({ threads: 1, maxMemoryBytes: bytes + 256 * 1024 });
    try {
      const cache = small.createKVCache(options);
      cache.append(k, v);
      const before = cache.attend(query).output.data;
      let error;
      try {
        cache.reorder(new Int32Array([1, 0]));
      } catch (e) {
        error = e;
      }
      expect(error?.constructor).toBe(RangeError);
      expect(error.message).toMatch(/KVCache\.reorder/);
      expect(error.message).toMatch(/maxMemoryBytes/);
      expect(cache.length).toBe(L);
      expect(bits(cache.attend(query).output.data)).toEqual(bits(before));
      cache.reorder(new Int32Array([1, 1]));  // no cycle: copied in place
      const ref = referenceSdpa(query, gather(k, [1, 1]), gather(v, [1, 1]), { isCausal: true, causalOffset: L - 1 });
      expect(maxRelError(cache.attend(query).output.data, ref.output)).toBeLessThanOrEqual(TOL);
    } finally {
      small.dispose();
    }
  });
});

describe('the shared cache cases (also run in Chromium)', () => {
  test('one and two threads: within 2e-5 of the reference, memory growing mid-sequence, the same bits; read() gives back what was stored', async () => {
    const one = await runCacheCases(attn), two = await runCacheCases(attn2);
    expect(one.filter((c) => !c.ok).map((c) => `${c.name}: ${c.worstError}, read() ${c.readOk}`)).toEqual([]);
    expect(two.filter((c) => !c.ok).map((c) => `${c.name}: ${c.worstError}, read() ${c.readOk}`)).toEqual([]);
    expect(two.map((c) => c.hash)).toEqual(one.map((c) => c.hash));
  });
});

describe('float16 cache', () => {
  test.each([
    ['GQA Hq32 Hkv8, E 128', { Hq: 32, Hkv: 8, E: 128 }],
    ['MHA H4, E 64, Ev 72, with weights', { Hq: 4, Hkv: 4, E: 64, Ev: 72, options: () => ({ returnWeights: true }) }],
  ])('%s: within 2e-5 of the reference on float16-rounded K/V (the rounding is the only error)', (_, shape) => {
    expectMatchesReference(decode(attn, { ...shape, steps: STEPS, dtype: 'float16', seed: 9 }), { halves: true });
  });

  test('the reference rounding itself: nearest even, subnormals, saturation', () => {
    expect(roundToHalf(1 + 2 ** -11)).toBe(1);             // a tie: to even (1.0)
    expect(roundToHalf(1 + 3 * 2 ** -11)).toBe(1 + 2 ** -9);  // a tie: to even (mantissa 2)
    expect(roundToHalf(2 ** -24)).toBe(2 ** -24);          // the smallest subnormal
    expect(roundToHalf(2 ** -25)).toBe(0);                 // half of it: a tie, to even (0)
    expect(roundToHalf(3 * 2 ** -26)).toBe(2 ** -24);
    expect(roundToHalf(65519)).toBe(65504);
    expect(roundToHalf(-65520)).toBe(-65504);
    expect(roundToHalf(0.1)).toBe(halfToFloat(0x2e66));
  });

  test('raw IEEE halves (Uint16Array) are stored as they are; float32 and halves mix', () => {
    const Hkv = 2, E = 16, L = 40;
    const u = mulberry32(41);
    // Random finite halves of every exponent (not 31: Inf/NaN), subnormals and ±0 included.
    const randomHalves = (n) => Uint16Array.from({ length: n }, () => {
      const h = Math.floor(u() * 0x10000);
      return (h & 0x7c00) === 0x7c00 ? h & 0x83ff : h;
    });
    const kh = { data: randomHalves(Hkv * L * E), dims: [1, Hkv, L, E] };
    const vh = { data: randomHalves(Hkv * L * E), dims: [1, Hkv, L, E] };
    const decoded = (t) => ({ data: Float32Array.from(t.data, halfToFloat), dims: t.dims });
    const cache = attn.createKVCache({ batch: 1, kvHeads: Hkv, headDim: E, maxLength: 2 * L, dtype: 'float16' });
    try {
      cache.append(kh, vh);
      const k2 = randomTensor([1, Hkv, L, E], 42), v2 = randomTensor([1, Hkv, L, E], 43);
      cache.append(k2, v2);
      // Small scale: the random halves reach ±65504, and the logits stay moderate.
      const query = randomTensor([1, 4, 1, E], 44);
      const options = { isCausal: false, scale: 1e-5, returnWeights: true };
      const got = cache.attend(query, options);
      const keys = { data: new Float32Array([...decoded(kh).data.subarray(0, L * E), ...roundedToHalves(k2).data.subarray(0, L * E),
        ...decoded(kh).data.subarray(L * E), ...roundedToHalves(k2).data.subarray(L * E)]), dims: [1, Hkv, 2 * L, E] };
      const values = { data: new Float32Array([...decoded(vh).data.subarray(0, L * E), ...roundedToHalves(v2).data.subarray(0, L * E),
        ...decoded(vh).data.subarray(L * E), ...roundedToHalves(v2).data.subarray(L * E)]), dims: [1, Hkv, 2 * L, E] };
      const ref = referenceSdpa(query, keys, values, options);
      // The values reach 65504, and so do the output's rounding errors: compared on the values'
      // own scale, |got − ref| / (65504 + |ref|) (both divided by 65504).
      const onValueScale = (x) => Float64Array.from(x, (y) => y / 65504);
      expect(maxRelError(onValueScale(got.output.data), onValueScale(ref.output))).toBeLessThanOrEqual(TOL);
      expect(maxRelError(got.weights.data, ref.weights)).toBeLessThanOrEqual(TOL);
    } finally {
      cache.dispose();
    }
  });

  test('beyond ±65504 and ±Infinity saturate to ±65504: no NaN in the scores', () => {
    const E = 8;
    const big = [1e6, -1e6, Infinity, -Infinity, 65519, 65520, -70000, 3e38];
    const k = { data: Float32Array.from({ length: 2 * E }, (_, i) => big[i % big.length] * (i < E ? 1 : -1)), dims: [1, 1, 2, E] };
    const v = { data: Float32Array.from({ length: 2 * E }, (_, i) => big[(i + 3) % big.length]), dims: [1, 1, 2, E] };
    const cache = attn.createKVCache({ batch: 1, kvHeads: 1, headDim: E, maxLength: 2, dtype: 'float16' });
    try {
      cache.append(k, v);
      const query = { data: Float32Array.from({ length: E }, (_, i) => (i % 2 ? 1e-6 : -2e-6)), dims: [1, 1, 1, E] };
      const got = cache.attend(query, { isCausal: false, returnWeights: true });
      expect(got.output.data.every(Number.isFinite)).toBe(true);
      expect(got.weights.data.every(Number.isFinite)).toBe(true);
      const ref = referenceSdpa(query, roundedToHalves(k), roundedToHalves(v), { isCausal: false, returnWeights: true });
      expect(Array.from(roundedToHalves(k).data).every((x) => Math.abs(x) <= 65504)).toBe(true);
      expect(maxRelError(got.output.data, ref.output)).toBeLessThanOrEqual(TOL);
      expect(maxRelError(got.weights.data, ref.weights)).toBeLessThanOrEqual(TOL);
    } finally {
      cache.dispose();
    }
  });

  test('NaN appended is stored as NaN: attended, it gives NaN like a float32 cache; padding keeps it out', () => {
    const E = 4;
    const k = { data: new Float32Array([1, 2, 3, 4, NaN, 0, 0, 0]), dims: [1, 1, 2, E] };
    const v = { data: new Float32Array([1, 1, 1, 1, 5, 5, 5, 5]), dims: [1, 1, 2, E] };
    const query = { data: new Float32Array([0.1, 0.2, 0.3, 0.4]), dims: [1, 1, 1, E] };
    for (const dtype of ['float32', 'float16']) {
      const cache = attn.createKVCache({ batch: 1, kvHeads: 1, headDim: E, maxLength: 2, dtype });
      try {
        cache.append(k, v);
        expect(Array.from(cache.attend(query).output.data).every(Number.isNaN)).toBe(true);
        const padded = cache.attend(query, { keyLengths: new Int32Array([1]) }).output.data;
        expect(Array.from(padded)).toEqual([1, 1, 1, 1]);
      } finally {
        cache.dispose();
      }
    }
  });

  test('raw Inf halves are widened to Inf (the cache then takes the exact widening)', () => {
    const E = 4;
    const k = { data: new Uint16Array(2 * E).fill(0x3c00), dims: [1, 1, 2, E] };       // 1.0
    const v = { data: Uint16Array.from([0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x7c00, 0xfc00, 0x4000, 0x0000]), dims: [1, 1, 2, E] };
    const query = { data: new Float32Array(E).fill(0.5), dims: [1, 1, 1, E] };
    const cache = attn.createKVCache({ batch: 1, kvHeads: 1, headDim: E, maxLength: 4, dtype: 'float16' });
    try {
      cache.append({ data: k.data.subarray(0, E), dims: [1, 1, 1, E] }, { data: v.data.subarray(0, E), dims: [1, 1, 1, E] });
      expect(Array.from(cache.attend(query).output.data)).toEqual([1, 1, 1, 1]);
      cache.append({ data: k.data.subarray(E), dims: [1, 1, 1, E] }, { data: v.data.subarray(E), dims: [1, 1, 1, E] });
      // Equal scores: weights 1/2 each; Inf and -Inf propagate, 1/2·1 + 1/2·2 and 1/2·1 + 0.
      expect(Array.from(cache.attend(query).output.data)).toEqual([Infinity, -Infinity, 1.5, 0.5]);
      cache.reset();
      cache.append({ data: k.data.subarray(0, E), dims: [1, 1, 1, E] }, { data: v.data.subarray(0, E), dims: [1, 1, 1, E] });
      expect(Array.from(cache.attend(query).output.data)).toEqual([1, 1, 1, 1]);
    } finally {
      cache.dispose();
    }
  });

  test('half the bytes of a float32 cache', () => {
    const options = { batch: 2, kvHeads: 3, headDim: 64, valueDim: 40, maxLength: 100 };
    const f32 = attn.createKVCache(options), f16 = attn.createKVCache({ ...options, dtype: 'float16' });
    try {
      expect(f32.byteLength).toBe(2 * 3 * 100 * (64 + 40) * 4);
      expect(f16.byteLength).toBe(f32.byteLength / 2);
      expect([f32.dtype, f16.dtype, f16.maxLength, f16.length]).toEqual(['float32', 'float16', 100, 0]);
    } finally {
      f32.dispose();
      f16.dispose();
    }
  });
});

describe('bfloat16 cache', () => {
  test.each([
    ['GQA Hq32 Hkv8, E 128', { Hq: 32, Hkv: 8, E: 128 }],
    ['MHA H4, E 64, Ev 72, B 2, with weights', { B: 2, Hq: 4, Hkv: 4, E: 64, Ev: 72, options: () => ({ returnWeights: true }) }],
  ])('%s: within 2e-5 of the reference on bfloat16-rounded K/V, one and two threads bitwise', (_, shape) => {
    const one = decode(attn, { ...shape, steps: STEPS, dtype: 'bfloat16', seed: 19 });
    expectMatchesReference(one, { dtype: 'bfloat16' });
    const two = decode(attn2, { ...shape, steps: STEPS, dtype: 'bfloat16', seed: 19 });
    one.results.forEach(({ got }, s) => expect(bits(two.results[s].got.output.data)).toEqual(bits(got.output.data)));
  });

  test('the reference rounding itself: nearest even, subnormals, saturation, against the format', () => {
    expect(roundToBFloat16(1 + 2 ** -8)).toBe(1);                // a tie: to even (1.0)
    expect(roundToBFloat16(1 + 3 * 2 ** -8)).toBe(1 + 2 ** -6);  // a tie: to even (mantissa 2)
    expect(roundToBFloat16(1 + 2 ** -8 + 2 ** -20)).toBe(1 + 2 ** -7);  // past the tie: up
    expect(roundToBFloat16(2 ** -133)).toBe(2 ** -133);          // the smallest subnormal
    expect(roundToBFloat16(2 ** -134)).toBe(0);                  // half of it: a tie, to even (0)
    expect(roundToBFloat16(3.4e38)).toBe(255 * 2 ** 120);        // saturates, not Infinity
    expect(roundToBFloat16(-Infinity)).toBe(-Infinity);
    expect(roundToBFloat16(0.1)).toBe(bfloat16ToFloat(0x3dcd));
    expect(roundToBFloat16(65520)).toBe(65536);                  // past a half's range: kept
    expect(bfloat16ToFloat(0x7f7f)).toBe(255 * 2 ** 120);
    expect(bfloat16ToFloat(0x0001)).toBe(2 ** -133);
    expect(bfloat16ToFloat(0xc000)).toBe(-2);
  });

  test('appends round to nearest even as the reference does, past the half range too; finite past the largest saturate; Infinity and NaN stay so', () => {
    const E = 8;
    const u = mulberry32(57);
    // Values of every magnitude float32 holds, ties and their neighbours, and the edges.
    const values = [];
    for (let i = 0; i < 4000; i++) values.push((u() - 0.5) * 2 ** Math.floor(u() * 250 - 125));
    const tie = 1 + 2 ** -8, top = 255 * 2 ** 120;
    values.push(tie, -tie, Math.fround(tie + 2 ** -23), 3.4028234663852886e38, -3.4028234663852886e38, top, top + 2 ** 118,
      Infinity, -Infinity, NaN, 0, -0, 2 ** -149, 65520, -1e30, 1e-40);
    while (values.length % E !== 0) values.push(1);
    const data = Float32Array.from(values);
    const L = data.length / E;
    const cache = attn.createKVCache({ batch: 1, kvHeads: 1, headDim: E, maxLength: L, dtype: 'bfloat16' });
    try {
      cache.append({ data, dims: [1, 1, L, E] }, { data, dims: [1, 1, L, E] });
      const held = cache.read(0, L, { dtype: 'float32' }).key.data;
      const wrong = Array.from(data).findIndex((x, i) => !Object.is(held[i], roundToBFloat16(x)));
      expect(wrong).toBe(-1);
      expect(held.filter((x) => Number.isNaN(x)).length).toBe(1);
      expect(held.includes(Infinity) && held.includes(-Infinity)).toBe(true);
      expect(Math.max(...Array.from(held).filter(Number.isFinite))).toBe(top);
    } finally {
      cache.dispose();
    }
  });

  test("raw bfloat16 (Uint16Array) is stored as it is, read() gives it back; { dtype: 'float32' } widens every one of the 65536 patterns exactly", () => {
    const all = { data: Uint16Array.from({ length: 65536 }, (_, b) => b), dims: [1, 2, 128, 256] };
    const cache = attn.createKVCache({ batch: 1, kvHeads: 2, headDim: 256, maxLength: 128, dtype: 'bfloat16' });
    try {
      cache.append(all, all);
      for (const layout of ['bhsd', 'bshd']) {
        const raw = cache.read(0, 128, { layout }), widened = cache.read(0, 128, { layout, dtype: 'float32' });
        expect(cache.read(0, 128, { layout, dtype: 'bfloat16' }).key.data).toEqual(raw.key.data);
        for (const plane of ['key', 'value']) {
          expect(raw[plane].data.constructor).toBe(Uint16Array);
          if (layout === 'bhsd') expect(raw[plane].data).toEqual(all.data);
          expect(widened[plane].data.constructor).toBe(Float32Array);
          const wrong = Array.from(raw[plane].data).findIndex((b, i) => !Object.is(widened[plane].data[i], bfloat16ToFloat(b)));
          expect(wrong).toBe(-1);
        }
      }
      expect(() => cache.read(0, 1, { dtype: 'float16' })).toThrow(new RangeError(
        "KVCache.read: options.dtype 'float16' needs a float16 cache; this one stores bfloat16 (read it as 'bfloat16' or 'float32')"));
    } finally {
      cache.dispose();
    }
  });

  test('keys and values far past the half range (around 2^100 and 2^90) attend as the reference on their bfloat16 values', () => {
    const B = 1, Hq = 8, Hkv = 2, E = 64, L = 700;
    const scaled = (t, factor) => ({ data: t.data.map((x) => x * factor), dims: t.dims });
    const k = scaled(randomTensor([B, Hkv, L, E], 61), 2 ** 100), v = scaled(randomTensor([B, Hkv, L, E], 62), 2 ** 90);
    const cache = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, maxLength: L, dtype: 'bfloat16' });
    try {
      cache.append(positions(k, 0, 600), positions(v, 0, 600));
      cache.append(positions(k, 600, L), positions(v, 600, L));
      for (const Lq of [1, 5]) {
        const query = scaled(randomTensor([B, Hq, Lq, E], 63 + Lq), 2 ** -100);
        const got = cache.attend(query);
        const ref = referenceSdpa(query, storedValues('bfloat16', k), storedValues('bfloat16', v), { isCausal: true, causalOffset: L - Lq });
        expect(got.output.data.every(Number.isFinite)).toBe(true);
        // Relative to the largest |output| (the outputs are ~2^90).
        const largest = ref.output.reduce((m, x) => Math.max(m, Math.abs(x)), 0);
        const error = got.output.data.reduce((m, x, i) => Math.max(m, Math.abs(x - ref.output[i])), 0) / largest;
        expect(largest).toBeGreaterThan(2 ** 80);
        expect(error).toBeLessThanOrEqual(TOL);
      }
    } finally {
      cache.dispose();
    }
  });
});

// ---------------------------------------------------------------------------------------------

const ROOT = new URL('../conformance/onnx-attention/', import.meta.url);
const io = {
  readText: (path) => readFile(new URL(path, ROOT), 'utf8'),
  readBytes: async (path) => new Uint8Array(await readFile(new URL(path, ROOT))),
};
const INDEX = await loadIndex(io);
const PAST_CASES = INDEX.cases.filter((c) => c.name.includes('with_past'));

describe('ONNX Attention cases with past_key/past_value, through the cache', () => {
  test('there are such cases', () => {
    expect(PAST_CASES.length).toBeGreaterThanOrEqual(10);
  });

  test.each(PAST_CASES.map((c) => [c.name, c]))('%s', async (_, entry) => {
    const c = await loadCase(io, entry.dir);
    const { query, options, packed } = adapt(c);
    const { Q, K, V, past_key: pastKey, past_value: pastValue } = c.inputs;
    const attrs = c.meta.attributes;
    // The new K/V as the adapter reads them: 3D packed [B, L, H*D] is bshd [B, L, H, D].
    const split = (t, H) => (packed ? { data: t.data, dims: [t.dims[0], t.dims[1], H, t.dims[2] / H] } : t);
    const key = split(K, attrs.kv_num_heads), value = split(V, attrs.kv_num_heads);
    const [B, Hkv, P, E] = pastKey.dims;
    const Ev = pastValue.dims[3];
    const Lnew = packed ? key.dims[1] : key.dims[2];
    // A float16 case's values are halves: a float16 cache holds them exactly.
    const dtype = Q.dtype === 'float16' ? 'float16' : 'float32';
    const cache = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: P + Lnew + 3, dtype });
    try {
      cache.append(pastKey, pastValue);
      cache.append(key, value, { layout: options.layout });
      expect(cache.length).toBe(P + Lnew);
      // attend() is causal by default; the ONNX case says whether it is.
      const result = cache.attend(query, { ...options, isCausal: options.isCausal ?? false });
      const { Y, qk_matmul_output: qk } = c.outputs;
      expect(onnxOutputDims(result.output, packed)).toEqual(Y.dims);
      expect(mismatches(result.output.data, Y.data, ONNX_TOL[Q.dtype])).toEqual([]);
      if (options.returnWeights) expect(mismatches(result.weights.data, qk.data, ONNX_TOL[Q.dtype])).toEqual([]);
    } finally {
      cache.dispose();
    }
  });
});
