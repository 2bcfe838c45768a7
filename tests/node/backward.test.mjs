// attn.sdpaBackward() (issue #13): the gradients dQ, dK, dV against the float64 analytic
// backward (reference.mjs, referenceSdpaBackward: written from softmax's Jacobian), and that
// reference and the kernel against central finite differences of the float64 forward; over
// tile edges, GQA, Lq ≠ Lk, Ev ≠ E, masks of every broadcast shape (and a float mask's gradient,
// options.returnMaskGrad, summed over its broadcast axes),
// causal offsets, key lengths with NaN padding, softcap, scale, both layouts and ranks.
// Also: sdpa(..., { returnLogSumExp }) against the reference; `saved` and recomputed paths
// bitwise equal; one and two threads bitwise; through createAttentionWorker bitwise the direct
// call, with the same errors; fully masked rows and unattended keys exact zeros; gradients
// written into options.out's arrays; bad input; memory freed.
import { createAttention, createAttentionWorker } from 'sdpa-wasm';
import {
  logSumExpError, maxRelError, mulberry32, normwiseError, randomTensor, referenceLogSumExp, referenceSdpa,
  referenceSdpaBackward,
} from './reference.mjs';
import { contentsOf, widenedContentsOf } from '../../dist/saved-forward.js';

const TOL = 1e-4;  // max |got - ref| / (1 + |ref|), as the issue asks
const KEY_TILE = 64;  // kBackwardKeyTile (src/tiles.h)
const QUERY_TILE = 4;

let attn, attn2;
beforeAll(async () => {
  attn = await createAttention({ threads: 1 });
  attn2 = await createAttention({ threads: 2 });
});
afterAll(() => {
  attn.dispose();
  attn2.dispose();
});

const t = (data, dims) => ({ data, dims });
const bitsOf = (a) => new Uint32Array(a.buffer, a.byteOffset, a.length);
const sameBits = (a, b) => {
  if (a.length !== b.length) return false;
  const x = bitsOf(a), y = bitsOf(b);
  return x.every((bits, i) => bits === y[i]);
};

/** A problem [B, H, L, E] (or bshd) with random Q, K, V, dO and the given options. */
function problem({ B = 1, Hq = 1, Hkv = 1, Lq, Lk, E = 8, Ev = E, layout = 'bhsd', seed = 1 }) {
  const dims = (H, L, D) => (layout === 'bshd' ? [B, L, H, D] : [B, H, L, D]);
  return {
    query: randomTensor(dims(Hq, Lq, E), seed),
    key: randomTensor(dims(Hkv, Lk, E), seed + 1),
    value: randomTensor(dims(Hkv, Lk, Ev), seed + 2),
    gradOutput: randomTensor(dims(Hq, Lq, Ev), seed + 3),
  };
}

function expectGradientsMatch(instance, p, options = {}) {
  const got = instance.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
  const ref = referenceSdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
  expect(got.dQuery.dims).toEqual(p.query.dims);
  expect(got.dKey.dims).toEqual(p.key.dims);
  expect(got.dValue.dims).toEqual(p.value.dims);
  expect(maxRelError(got.dQuery.data, ref.dQuery)).toBeLessThanOrEqual(TOL);
  expect(maxRelError(got.dKey.data, ref.dKey)).toBeLessThanOrEqual(TOL);
  expect(maxRelError(got.dValue.data, ref.dValue)).toBeLessThanOrEqual(TOL);
  if (options.returnMaskGrad) {
    expect(got.dAttnMask.dims).toEqual(options.attnMask.dims);
    expect(got.dAttnMask.data.length).toBe(ref.dAttnMask.length);
    expect(maxRelError(got.dAttnMask.data, ref.dAttnMask)).toBeLessThanOrEqual(TOL);
  } else {
    expect(got.dAttnMask).toBeUndefined();
  }
  if (options.sinks) {
    expect(got.dSinks.dims).toEqual([options.sinks.length]);
    expect(maxRelError(got.dSinks.data, ref.dSinks)).toBeLessThanOrEqual(TOL);
  } else {
    expect(got.dSinks).toBeUndefined();
  }
  return got;
}

/** A float mask of `dims` with entries uniform in [-1, 1), -Infinity with probability `blocked`. */
function floatMask(dims, seed, blocked = 0) {
  const random = mulberry32(seed);
  const n = dims.reduce((a, b) => a * b, 1);
  return t(Float32Array.from({ length: n }, () => (random() < blocked ? -Infinity : random() * 2 - 1)), dims);
}

describe('sdpaBackward against the float64 analytic backward', () => {
  const edges = [1, 7, 8, 9, KEY_TILE - 1, KEY_TILE, KEY_TILE + 1, 2 * KEY_TILE + 3];
  test.each(edges.flatMap((Lk) => [1, QUERY_TILE - 1, QUERY_TILE, QUERY_TILE + 1, 13].map((Lq) => [Lq, Lk])))(
    'tile edges: Lq %p, Lk %p', (Lq, Lk) => {
      expectGradientsMatch(attn, problem({ Lq, Lk, seed: Lq * 1000 + Lk }));
    });

  test.each([[1, 1], [3, 5], [4, 4], [17, 6], [64, 64], [5, 13]])('E %p, Ev %p', (E, Ev) => {
    expectGradientsMatch(attn, problem({ Lq: 6, Lk: 20, E, Ev, seed: E * 7 + Ev }));
  });

  test.each([[4, 2], [6, 1], [3, 3]])('GQA Hq %p, Hkv %p: dK/dV summed over the group, both layouts', (Hq, Hkv) => {
    for (const layout of ['bhsd', 'bshd']) {
      expectGradientsMatch(attn, problem({ B: 2, Hq, Hkv, Lq: 5, Lk: 70, E: 12, Ev: 7, layout, seed: Hq * 10 + Hkv }), { layout });
    }
  });

  test('ranks 3 and 2', () => {
    const r3 = { query: randomTensor([2, 5, 8], 1), key: randomTensor([2, 9, 8], 2), value: randomTensor([2, 9, 6], 3), gradOutput: randomTensor([2, 5, 6], 4) };
    expectGradientsMatch(attn, r3);
    const r2 = { query: randomTensor([5, 8], 1), key: randomTensor([9, 8], 2), value: randomTensor([9, 6], 3), gradOutput: randomTensor([5, 6], 4) };
    expectGradientsMatch(attn, r2);
  });

  const B = 2, Hq = 3, Lq = 5, Lk = 70;
  const maskShapes = [[Lk], [Lq, Lk], [Hq, 1, Lk], [B, Hq, Lq, Lk], [B, 1, 1, Lk], [1, Hq, Lq, 1]];
  test.each(maskShapes.flatMap((dims) => [['float', dims], ['bool', dims]]))('%s mask of dims %j', (kind, dims) => {
    const random = mulberry32(dims.length * 31 + (kind === 'bool' ? 1 : 0));
    const n = dims.reduce((a, b) => a * b, 1);
    const data = kind === 'bool'
      ? Uint8Array.from({ length: n }, () => (random() < 0.3 ? 0 : 1))
      : Float32Array.from({ length: n }, () => (random() < 0.3 ? -Infinity : random() * 2 - 1));
    expectGradientsMatch(attn, problem({ B, Hq, Lq, Lk, E: 8, Ev: 6, seed: n }), { attnMask: t(data, dims) });
  });

  test.each([[0], [-3], [65], [Int32Array.of(2, 70)], [Int32Array.of(-10, 0)]])('causal, offset %p; with key lengths and NaN padding', (causalOffset) => {
    const p = problem({ B: 2, Hq: 2, Lq: 9, Lk: 71, seed: 3 });
    expectGradientsMatch(attn, p, { isCausal: true, causalOffset });
    // K, V [2, 1, 71, 8]: NaN in batch 0's keys 64..70 and in all of batch 1's (key length 0).
    const keyLengths = Int32Array.of(64, 0);
    for (const tensor of [p.key, p.value]) tensor.data.fill(NaN, 64 * 8);
    const got = expectGradientsMatch(attn, p, { isCausal: true, causalOffset, keyLengths });
    for (const g of [got.dQuery, got.dKey, got.dValue]) expect(g.data.every(Number.isFinite)).toBe(true);
  });

  test.each([[1], [3], [64], [65], [200]])('sliding window %p: GQA, per-batch offsets, key lengths, a float mask and its gradient; NaN before every window; 1 and 2 threads bitwise', (slidingWindow) => {
    const Lq = 13, Lk = 150;
    const p = problem({ B: 2, Hq: 4, Hkv: 2, Lq, Lk, E: 8, Ev: 6, seed: 80 + slidingWindow });
    const causalOffset = Int32Array.of(Lk - Lq, 70);
    const options = { isCausal: true, causalOffset, slidingWindow };
    const got = expectGradientsMatch(attn, p, options);
    expectGradientsMatch(attn, p, { ...options, keyLengths: Int32Array.of(Lk, 60), attnMask: floatMask([2, 1, Lq, Lk], 81, 0.2), returnMaskGrad: true });
    // NaN in the keys batch 0's first row does not reach (before key Lk - Lq - W + 1): every
    // gradient finite, those keys' dK and dV exact zeros.
    const first = Math.max(Lk - Lq - slidingWindow + 1, 0);
    for (let h = 0; h < 2; h++) {
      p.key.data.fill(NaN, h * Lk * 8, (h * Lk + first) * 8);
      p.value.data.fill(NaN, h * Lk * 6, (h * Lk + first) * 6);
    }
    const poisoned = expectGradientsMatch(attn, p, options);
    for (const g of [poisoned.dQuery, poisoned.dKey, poisoned.dValue]) expect(g.data.every(Number.isFinite)).toBe(true);
    for (let h = 0; h < 2; h++) {
      expect(poisoned.dKey.data.subarray(h * Lk * 8, (h * Lk + first) * 8).every((x) => Object.is(x, 0))).toBe(true);
      expect(poisoned.dValue.data.subarray(h * Lk * 6, (h * Lk + first) * 6).every((x) => Object.is(x, 0))).toBe(true);
    }
    const two = attn2.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(two[name].data, poisoned[name].data)).toBe(true);
    // The keys before the windows held other values: the gradients of the keys in them are the same.
    expect(sameBits(got.dQuery.data, poisoned.dQuery.data)).toBe(true);
  });

  test('keyStarts (left padding) with NaN in the padding: exact-zero dKey/dValue there; with keyLengths, a window and a mask', () => {
    const Lq = 9, Lk = 140;
    const p = problem({ B: 3, Hq: 4, Hkv: 2, Lq, Lk, E: 8, Ev: 6, seed: 90 });
    const keyStarts = Int32Array.of(0, 65, Lk);
    for (let bh = 0; bh < 6; bh++) {
      const start = keyStarts[Math.floor(bh / 2)];
      p.key.data.fill(NaN, bh * Lk * 8, (bh * Lk + start) * 8);
      p.value.data.fill(NaN, bh * Lk * 6, (bh * Lk + start) * 6);
    }
    for (const options of [
      { keyStarts },
      { keyStarts, keyLengths: Int32Array.of(100, 130, Lk), isCausal: true, causalOffset: Lk - Lq, slidingWindow: 50 },
      { keyStarts, attnMask: floatMask([3, 1, Lq, Lk], 91, 0.2), returnMaskGrad: true },
    ]) {
      const got = expectGradientsMatch(attn, p, options);
      for (const g of [got.dQuery, got.dKey, got.dValue]) expect(g.data.every(Number.isFinite)).toBe(true);
      for (let bh = 0; bh < 6; bh++) {
        const start = keyStarts[Math.floor(bh / 2)];
        expect(got.dKey.data.subarray(bh * Lk * 8, (bh * Lk + start) * 8).every((x) => Object.is(x, 0))).toBe(true);
        expect(got.dValue.data.subarray(bh * Lk * 6, (bh * Lk + start) * 6).every((x) => Object.is(x, 0))).toBe(true);
      }
      const two = attn2.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
      for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(two[name].data, got[name].data)).toBe(true);
    }
  });

  test('sinks: dSinks [Hq] (summed over batches and rows) with every other gradient; MHA and GQA, empty rows, windows, a float mask and its gradient, bshd; out and accumulate; 1 and 2 threads bitwise', () => {
    const sinks = Float32Array.of(-Infinity, 0, 2.5, 30);  // none, about the scores, far above them
    for (const [Hkv, Lq, Lk] of [[4, 1, 70], [2, 9, 140], [1, 37, 65]]) {
      const p = problem({ B: 2, Hq: 4, Hkv, Lq, Lk, E: 8, Ev: 6, seed: 95 + Lk });
      for (const options of [
        { sinks },
        { sinks, isCausal: true, causalOffset: Int32Array.of(Lk - Lq, -2), slidingWindow: 40 },
        { sinks, attnMask: floatMask([2, 1, Lq, Lk], 96, 0.2), returnMaskGrad: true, keyLengths: Int32Array.of(Lk, 0) },
      ]) {
        const got = expectGradientsMatch(attn, p, options);
        expect(got.dSinks.data[0]).toBe(0);  // no sink: nothing to differentiate
        const two = attn2.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
        for (const name of ['dQuery', 'dKey', 'dValue', 'dSinks']) expect(sameBits(two[name].data, got[name].data)).toBe(true);
        // Into the caller's array, and added to what it holds.
        const into = new Float32Array(5).fill(7);
        const written = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out: { dSinks: into } });
        expect(written.dSinks.data.buffer).toBe(into.buffer);
        expect(sameBits(into.subarray(0, 4), got.dSinks.data)).toBe(true);
        expect(into[4]).toBe(7);
        attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out: { dSinks: into }, accumulate: true });
        got.dSinks.data.forEach((g, h) => expect(into[h]).toBe(Math.fround(g + g)));
      }
      const bshd = problem({ B: 2, Hq: 4, Hkv, Lq, Lk, E: 8, Ev: 6, layout: 'bshd', seed: 97 });
      expectGradientsMatch(attn, bshd, { sinks, layout: 'bshd', isCausal: true });
    }
  });

  test.each([[0, 1], [1, 1], [20, 1], [1, 8], [0, 8]])('softcap %p, input scale %p, scale 0.3', (softcap, inputScale) => {
    const p = problem({ Lq: 7, Lk: 66, E: 16, Ev: 5, seed: softcap * 10 + inputScale });
    p.query.data.forEach((x, i) => { p.query.data[i] = x * inputScale; });
    expectGradientsMatch(attn, p, { softcap: softcap || undefined, scale: 0.3 });
  });
});

describe('long sums: dK and dV over many query rows, dQ over many keys', () => {
  // dK and dV sum a term per query row of the KV group, dQ one per key. Added one by one to sums
  // that grow (values about 0.7, dO about 0.5), the terms lost a bit per doubling; the kernel
  // sums 512 rows and one 64-key tile apart, then adds the sums. Measured (max error ÷ max
  // gradient, both builds): before, after.
  const around = (tensor, centre) => {
    for (let i = 0; i < tensor.data.length; i++) tensor.data[i] = centre + 0.05 * tensor.data[i];
    return tensor;
  };
  test('262144 rows (2 query heads of 131072) on 64 equal keys: p = 1/64 whatever the query', () => {
    // dV 9.3e-6, 1.8e-8 (2.9e-7 before the blocks' sums were compensated); dK 1.2e-5, 9.5e-7
    const p = problem({ Hq: 2, Hkv: 1, Lq: 131072, Lk: KEY_TILE, E: 4, Ev: 3, seed: 8201 });
    for (let j = 1; j < KEY_TILE; j++) p.key.data.copyWithin(j * 4, 0, 4);
    around(p.value, 0.7), around(p.gradOutput, 0.5);
    const got = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput);
    const ref = referenceSdpaBackward(p.query, p.key, p.value, p.gradOutput);
    expect(normwiseError(got.dValue.data, ref.dValue)).toBeLessThanOrEqual(2e-6);
    expect(normwiseError(got.dKey.data, ref.dKey)).toBeLessThanOrEqual(4e-6);
  });
  test('262144 keys under 36 flat rows (9 query heads of 4), values leaning on the keys (so that dQ sums terms of one sign)', () => {
    // dQ 9.5e-5, 2.7e-6; dK 1.9e-5, 7e-7 (it sums 36 rows, but of ds made from the forward's output)
    const p = problem({ Hq: 9, Hkv: 1, Lq: 4, Lk: 262144, E: 4, Ev: 3, seed: 8202 });
    around(p.value, 0.7), around(p.gradOutput, 0.5);
    for (let j = 0; j < 262144; j++) for (let c = 0; c < 3; c++) p.value.data[j * 3 + c] += 0.3 * p.key.data[j * 4];
    const got = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput);
    const ref = referenceSdpaBackward(p.query, p.key, p.value, p.gradOutput);
    expect(normwiseError(got.dQuery.data, ref.dQuery)).toBeLessThanOrEqual(1e-5);
    expect(normwiseError(got.dKey.data, ref.dKey)).toBeLessThanOrEqual(4e-6);
    expect(normwiseError(got.dValue.data, ref.dValue)).toBeLessThanOrEqual(2e-6);
  });
  // Equal blocks round alike, and added one after another their roundings add up; the blocks'
  // sums (dK/dV) and a mask gradient's terms are added with Kahan's compensation.
  /** Every (batch, head) of p a copy of the first, every batch's K and V a copy of the first's. */
  const copies = (p) => {
    const copy = (t, n) => { for (let at = n; at < t.data.length; at += n) t.data.copyWithin(at, 0, n); };
    const [B, , Lq, E] = p.query.dims, [, , Lk] = p.key.dims, Ev = p.value.dims[3];
    // The values lean on the keys' first dimension: ds = p·(dp - D) is then not mostly the
    // rounding of dp - D.
    for (let j = 0; j < Lk; j++) for (let c = 0; c < Ev; c++) p.value.data[j * Ev + c] += 0.3 * p.key.data[j * E];
    copy(p.query, Lq * E), copy(p.gradOutput, Lq * Ev);
    if (B > 1) copy(p.key, p.key.data.length / B), copy(p.value, p.value.data.length / B);
  };
  test('1024 copies of one query head of 256 rows on one KV head (512 equal 512-row blocks)', () => {
    // dV 5.3e-6 of its size with the blocks added plainly, 2.7e-4 with the rows added one by one
    const p = problem({ Hq: 1024, Hkv: 1, Lq: 256, Lk: 16, E: 4, Ev: 3, seed: 8203 });
    around(p.value, 0.7), around(p.gradOutput, 0.5), copies(p);
    const got = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput);
    const ref = referenceSdpaBackward(p.query, p.key, p.value, p.gradOutput);
    expect(normwiseError(got.dValue.data, ref.dValue)).toBeLessThanOrEqual(2e-6);
    expect(normwiseError(got.dKey.data, ref.dKey)).toBeLessThanOrEqual(2e-6);
  });
  test('a [8, 16] float mask shared by 16384 copies of one (batch, head): its gradient', () => {
    // 1.25e-5 of its size with the terms added plainly
    const p = problem({ B: 128, Hq: 128, Hkv: 1, Lq: 8, Lk: 16, E: 4, Ev: 3, seed: 8204 });
    around(p.value, 0.7), around(p.gradOutput, 0.5), copies(p);
    const options = { attnMask: randomTensor([8, 16], 8205), returnMaskGrad: true };
    const got = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    const ref = referenceSdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    expect(normwiseError(got.dAttnMask.data, ref.dAttnMask)).toBeLessThanOrEqual(2e-6);
  });
});

describe('attention dropout (dropoutP, dropoutSeed): the gradients of output = Σ_j p_j·z_j·v_j, the mask drawn again', () => {
  const dropout = (p, seed) => ({ dropoutP: p, dropoutSeed: seed });
  const edges = [1, 7, KEY_TILE - 1, KEY_TILE, KEY_TILE + 1, 2 * KEY_TILE + 3];
  test.each(edges.flatMap((Lk) => [1, QUERY_TILE, QUERY_TILE + 1, 13].map((Lq) => [Lq, Lk])))(
    'tile edges: Lq %p, Lk %p (GQA, B 2, Ev ≠ E), causal and not; 1 and 2 threads bitwise; saved the same bits', (Lq, Lk) => {
      const p = problem({ B: 2, Hq: 4, Hkv: 2, Lq, Lk, E: 8, Ev: 6, seed: 300 + Lq * 1000 + Lk });
      for (const options of [dropout(0.3, Lq * 1000 + Lk), { ...dropout(0.75, 2 ** 32 - Lk), isCausal: true, causalOffset: Lk - Lq }]) {
        const got = expectGradientsMatch(attn, p, options);
        const two = attn2.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
        const forward = attn.sdpa(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
        const saved = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, saved: forward });
        for (const name of ['dQuery', 'dKey', 'dValue']) {
          expect(sameBits(two[name].data, got[name].data)).toBe(true);
          expect(sameBits(saved[name].data, got[name].data)).toBe(true);
        }
      }
    });

  test('with a float mask and its gradient, bool masks, sinks (dSinks), keyLengths and keyStarts, windows, ALiBi, softcap, bshd; 1 and 2 threads bitwise', () => {
    const sinks = Float32Array.of(-Infinity, 0, 2.5, 30);
    for (const [Hkv, Lq, Lk] of [[4, 1, 70], [2, 9, 140], [1, 37, 65]]) {
      const p = problem({ B: 2, Hq: 4, Hkv, Lq, Lk, E: 8, Ev: 6, seed: 320 + Lk });
      for (const options of [
        { ...dropout(0.2, 1), attnMask: floatMask([2, 1, Lq, Lk], 321, 0.2), returnMaskGrad: true },
        { ...dropout(0.5, 2), attnMask: floatMask([Lq, Lk], 322, 0.1), returnMaskGrad: true, sinks, softcap: 4 },
        { ...dropout(0.4, 3), attnMask: t(Uint8Array.from({ length: Lk }, (_, j) => Number(j % 5 !== 2)), [Lk]), sinks },
        { ...dropout(0.6, 4), isCausal: true, causalOffset: Int32Array.of(Lk - Lq, -2), slidingWindow: 40, sinks },
        { ...dropout(0.1, 5), keyLengths: Int32Array.of(Lk, 0), keyStarts: Int32Array.of(3, 0), scale: 0.4 },
        { ...dropout(0.9, 6), alibiSlopes: Float32Array.of(0.5, 0.25, 0, 0.125), isCausal: true, causalOffset: Lk - Lq, sinks },
      ]) {
        const got = expectGradientsMatch(attn, p, options);
        const two = attn2.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
        for (const name of Object.keys(got)) expect(sameBits(two[name].data, got[name].data)).toBe(true);
      }
      const bshd = problem({ B: 2, Hq: 4, Hkv, Lq, Lk, E: 8, Ev: 6, layout: 'bshd', seed: 323 });
      expectGradientsMatch(attn, bshd, { ...dropout(0.3, 7), sinks, layout: 'bshd', isCausal: true });
    }
  });

  test('above the pool threshold (split over the threads): 1 and 2 threads, saved and recomputed, the same bits, within the tolerance', () => {
    const p = problem({ B: 2, Hq: 4, Hkv: 2, Lq: 200, Lk: 300, E: 32, Ev: 16, seed: 330 });
    const options = { ...dropout(0.35, 2 ** 31 + 5), isCausal: true, causalOffset: 100, attnMask: floatMask([200, 300], 331, 0.05), returnMaskGrad: true,
      sinks: Float32Array.of(0, 1, -Infinity, 2) };
    const got = expectGradientsMatch(attn, p, options);
    const { returnMaskGrad: _m, ...forwardOptions } = options;
    const forward = attn2.sdpa(p.query, p.key, p.value, { ...forwardOptions, returnLogSumExp: true });
    for (const other of [attn2.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options),
      attn2.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, saved: forward })]) {
      for (const name of Object.keys(got)) expect(sameBits(other[name].data, got[name].data)).toBe(true);
    }
  });

  test('dropoutP 0 (any seed) is no dropout: the bits of the call without; another seed gives other gradients', () => {
    const p = problem({ B: 2, Hq: 4, Hkv: 2, Lq: 9, Lk: 70, seed: 340 });
    const base = { isCausal: true, causalOffset: 61, sinks: Float32Array.of(0, 1, -Infinity, 2) };
    const none = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, base);
    const zero = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...base, ...dropout(0, 99) });
    for (const name of Object.keys(none)) expect(sameBits(zero[name].data, none[name].data)).toBe(true);
    const a = expectGradientsMatch(attn, p, { ...base, ...dropout(0.5, 1) });
    const b = expectGradientsMatch(attn, p, { ...base, ...dropout(0.5, 2) });
    expect(sameBits(a.dValue.data, b.dValue.data)).toBe(false);
    // p = 1 − 2^-33 (threshold 2^32 − 1): every weight dropped, the output 0, so is every gradient.
    const all = expectGradientsMatch(attn, p, { ...base, ...dropout(1 - 2 ** -33, 3) });
    for (const name of Object.keys(all)) expect([name, all[name].data.every((x) => x === 0)]).toEqual([name, true]);
  });

  test('dValue from the forward\'s weights: dV_j = Σ_i weights_ij·dO_i with the dropped weights sdpa() returns', () => {
    const p = problem({ B: 1, Hq: 2, Hkv: 1, Lq: 13, Lk: 70, E: 8, Ev: 6, seed: 350 });
    const options = { ...dropout(0.4, 351), isCausal: true, causalOffset: 57 };
    const { weights } = attn.sdpa(p.query, p.key, p.value, { ...options, returnWeights: true });
    const got = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    const want = new Float64Array(70 * 6);
    for (let h = 0; h < 2; h++) {
      for (let i = 0; i < 13; i++) {
        for (let j = 0; j < 70; j++) {
          const w = weights.data[(h * 13 + i) * 70 + j];
          for (let c = 0; c < 6; c++) want[j * 6 + c] += w * p.gradOutput.data[(h * 13 + i) * 6 + c];
        }
      }
    }
    expect(maxRelError(got.dValue.data, want)).toBeLessThanOrEqual(TOL);
  });
});

describe("the float mask's gradient (options.returnMaskGrad)", () => {
  // The kernel's items are blocks of 64 rows × 256 keys of the mask (kMaskGradRows,
  // kMaskGradKeys in src/tiles.h): Lq and Lk cross a block edge.
  const B = 2, Hq = 4, Hkv = 2, Lq = 69, Lk = 301;
  const full = [B, Hq, Lq, Lk];
  const shapes = Array.from({ length: 16 }, (_, bits) => full.map((size, axis) => ((bits >> (3 - axis)) & 1 ? size : 1)));
  test.each(shapes.map((dims, n) => [dims, n]))('4-d mask of dims %j: summed over its broadcast axes; 1 and 2 threads bitwise', (dims, n) => {
    const p = problem({ B, Hq, Hkv, Lq, Lk, E: 8, Ev: 5, seed: 70 + n, layout: n % 3 === 0 ? 'bshd' : 'bhsd' });
    const options = {
      attnMask: floatMask(dims, n, 0.1), returnMaskGrad: true, layout: n % 3 === 0 ? 'bshd' : 'bhsd',
      isCausal: n % 2 === 0, causalOffset: n % 2 === 0 ? Int32Array.of(Lk - Lq, 20) : undefined, softcap: n % 4 === 1 ? 4 : undefined,
      keyLengths: n % 5 === 2 ? Int32Array.of(Lk, 100) : undefined,
    };
    const one = expectGradientsMatch(attn, p, options);
    const two = attn2.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    for (const name of ['dQuery', 'dKey', 'dValue', 'dAttnMask']) expect(sameBits(two[name].data, one[name].data)).toBe(true);
  });

  test.each([[[Lk]], [[Lq, Lk]], [[Hq, 1, Lk]], [[Lq, 1]]])('ranks below 4, dims %j: the gradient has the mask\'s own dims', (dims) => {
    const p = problem({ B, Hq, Hkv, Lq, Lk, E: 8, Ev: 5, seed: 90 + dims.length });
    expectGradientsMatch(attn, p, { attnMask: floatMask(dims, dims.length, 0.1), returnMaskGrad: true });
  });

  test('exact zeros where nothing attends: -Infinity entries, past the causal frontier or a key length, empty rows', () => {
    const p = problem({ B: 2, Hq: 2, Hkv: 1, Lq: 6, Lk: 20, seed: 95 });
    const mask = floatMask([2, 2, 6, 20], 95, 0.2);
    const causalOffset = Int32Array.of(-3, 5), keyLengths = Int32Array.of(20, 7);
    const { dAttnMask } = expectGradientsMatch(attn, p, { attnMask: mask, returnMaskGrad: true, isCausal: true, causalOffset, keyLengths });
    let zeros = 0, nonzeros = 0;
    for (let n = 0; n < mask.data.length; n++) {
      const j = n % 20, i = Math.floor(n / 20) % 6, b = Math.floor(n / 240);
      const open = j < Math.min(Math.max(i + causalOffset[b] + 1, 0), keyLengths[b]) && mask.data[n] !== -Infinity;
      if (open) {
        nonzeros += dAttnMask.data[n] !== 0 ? 1 : 0;
      } else {
        expect(Object.is(dAttnMask.data[n], 0)).toBe(true);
        zeros++;
      }
    }
    expect(zeros).toBeGreaterThan(mask.data.length / 2);
    expect(nonzeros).toBeGreaterThan(0);
  });

  test('saved and recomputed forward give the same bits; the worker too (the gradient transferred back)', async () => {
    const p = problem({ B: 2, Hq: 4, Hkv: 2, Lq: 9, Lk: 70, E: 8, Ev: 6, seed: 96 });
    const options = { attnMask: floatMask([4, 9, 70], 96, 0.1), isCausal: true, causalOffset: 61, softcap: 5 };
    const recomputed = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, returnMaskGrad: true });
    const forward = attn.sdpa(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    const saved = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput,
      { ...options, returnMaskGrad: true, saved: { output: forward.output, logSumExp: forward.logSumExp } });
    const worker = await createAttentionWorker({ threads: 1 });
    try {
      const viaWorker = await worker.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, returnMaskGrad: true });
      for (const result of [saved, viaWorker]) {
        expect(result.dAttnMask.dims).toEqual([4, 9, 70]);
        for (const name of ['dQuery', 'dKey', 'dValue', 'dAttnMask']) expect(sameBits(result[name].data, recomputed[name].data)).toBe(true);
      }
      const error = await worker.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { returnMaskGrad: true }).then(() => undefined, (e) => e);
      expect(error.constructor).toBe(TypeError);
      expect(error.message).toMatch(/^sdpaBackward: options\.returnMaskGrad needs an additive options\.attnMask/);
    } finally {
      worker.dispose();
    }
    // Without returnMaskGrad the other gradients have the same bits: the pass only adds.
    const without = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(without[name].data, recomputed[name].data)).toBe(true);
    expect(without.dAttnMask).toBeUndefined();
    expect(attn.memory().bytesInUse).toBe(0);
  });

  test('a learnable bias: plain gradient descent on the mask alone lowers a loss', () => {
    // Fit a [Lq, Lk] bias so that the output approaches a target: L = ½‖O - T‖², dO = O - T.
    const p = problem({ Hq: 2, Lq: 5, Lk: 9, E: 4, Ev: 3, seed: 97 });
    const target = randomTensor([1, 2, 5, 3], 98);
    const bias = t(new Float32Array(5 * 9), [5, 9]);
    const lossAndGrad = () => {
      const { output } = attn.sdpa(p.query, p.key, p.value, { attnMask: bias });
      const go = output.data.map((o, n) => o - target.data[n]);
      const loss = go.reduce((sum, d) => sum + 0.5 * d * d, 0);
      return { loss, go: t(go, output.dims) };
    };
    const first = lossAndGrad().loss;
    let last = first;
    for (let step = 0; step < 40; step++) {
      const { loss, go } = lossAndGrad();
      expect(loss).toBeLessThanOrEqual(last + 1e-6);
      last = loss;
      const { dAttnMask } = attn.sdpaBackward(p.query, p.key, p.value, go, { attnMask: bias, returnMaskGrad: true });
      for (let n = 0; n < bias.data.length; n++) bias.data[n] -= 0.5 * dAttnMask.data[n];
    }
    expect(lossAndGrad().loss).toBeLessThan(0.8 * first);
  });
});

describe('options.out: gradients written (or with accumulate, added) into the caller\'s arrays', () => {
  const names = ['dQuery', 'dKey', 'dValue', 'dAttnMask'];
  // GQA, bshd, Ev ≠ E, a float [Hq, 1, Lk] mask with its gradient: every result has its own size.
  const p = problem({ B: 2, Hq: 4, Hkv: 2, Lq: 9, Lk: 70, E: 8, Ev: 6, layout: 'bshd', seed: 110 });
  const options = { layout: 'bshd', attnMask: floatMask([4, 1, 70], 110, 0.1), returnMaskGrad: true, isCausal: true, causalOffset: 61 };
  const sizes = { dQuery: 2 * 9 * 4 * 8, dKey: 2 * 70 * 2 * 8, dValue: 2 * 70 * 2 * 6, dAttnMask: 4 * 70 };
  let fresh;
  beforeAll(() => {
    fresh = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
  });

  test.each([[1], [2]])('each gradient into its array: exactly sized arrays are returned, longer ones as a view of their start, the rest untouched (threads %p)', (threads) => {
    const instance = threads === 1 ? attn : attn2;
    for (const extra of [0, 5]) {
      const out = Object.fromEntries(names.map((name) => [name, new Float32Array(sizes[name] + extra).fill(NaN)]));
      const got = instance.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out });
      for (const name of names) {
        expect(got[name].dims).toEqual(fresh[name].dims);
        if (extra === 0) expect(got[name].data).toBe(out[name]);
        expect(got[name].data.buffer).toBe(out[name].buffer);
        expect([name, got[name].data.byteOffset, got[name].data.length]).toEqual([name, 0, sizes[name]]);
        expect(sameBits(got[name].data, fresh[name].data)).toBe(true);
        expect(out[name].subarray(sizes[name]).every(Number.isNaN)).toBe(true);
      }
    }
    expect(instance.memory().bytesInUse).toBe(0);
  });

  test('some gradients into arrays, the others in new ones; one buffer holding all four side by side, or a SharedArrayBuffer', () => {
    const dKey = new Float32Array(sizes.dKey);
    const some = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out: { dKey } });
    expect(some.dKey.data).toBe(dKey);
    for (const name of names) expect(sameBits(some[name].data, fresh[name].data)).toBe(true);
    for (const name of ['dQuery', 'dValue', 'dAttnMask']) expect(some[name].data.buffer).not.toBe(dKey.buffer);
    for (const Buffer of [ArrayBuffer, SharedArrayBuffer]) {
      const total = names.reduce((sum, name) => sum + sizes[name], 0);
      const memory = new Float32Array(new Buffer(4 * (total + 3)));  // 3 floats between neighbours
      let at = 0;
      const out = {};
      for (const name of names) {
        out[name] = memory.subarray(at, at + sizes[name]);
        at += sizes[name] + 1;
      }
      const got = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out });
      for (const name of names) {
        expect(got[name].data).toBe(out[name]);
        expect(sameBits(got[name].data, fresh[name].data)).toBe(true);
      }
      // The float after each array (between it and the next) is not written.
      const gaps = [sizes.dQuery, sizes.dQuery + 1 + sizes.dKey, sizes.dQuery + 1 + sizes.dKey + 1 + sizes.dValue];
      expect(gaps.map((n) => memory[n])).toEqual([0, 0, 0]);
    }
  });

  test('an out over an input (in place): the inputs are read before any gradient is written', () => {
    // dQuery over query.data, dKey over key.data, dValue over value.data, dAttnMask over the mask.
    const copy = structuredClone({ ...p, attnMask: options.attnMask });
    const got = attn.sdpaBackward(copy.query, copy.key, copy.value, copy.gradOutput, {
      ...options, attnMask: copy.attnMask,
      out: { dQuery: copy.query.data, dKey: copy.key.data, dValue: copy.value.data, dAttnMask: copy.attnMask.data },
    });
    expect(got.dQuery.data).toBe(copy.query.data);
    for (const name of names) expect(sameBits(got[name].data, fresh[name].data)).toBe(true);
    // With saved: dQuery over gradOutput (E = Ev here) and dKey over the saved output's buffer.
    const square = problem({ Hq: 2, Lq: 7, Lk: 66, E: 8, seed: 111 });
    const plain = attn.sdpaBackward(square.query, square.key, square.value, square.gradOutput);
    const forward = attn.sdpa(square.query, square.key, square.value, { returnLogSumExp: true });
    const outputCopy = new Float32Array(Math.max(forward.output.data.length, square.key.data.length));
    outputCopy.set(forward.output.data);
    const inPlace = attn.sdpaBackward(square.query, square.key, square.value, square.gradOutput, {
      saved: { output: t(outputCopy.subarray(0, forward.output.data.length), forward.output.dims), logSumExp: forward.logSumExp },
      out: { dQuery: square.gradOutput.data, dKey: outputCopy },
    });
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(inPlace[name].data, plain[name].data)).toBe(true);
    expect(inPlace.dQuery.data).toBe(square.gradOutput.data);
  });

  test.each([
    ['not an object', 3, TypeError, /^sdpaBackward: options\.out must be an object of Float32Arrays with any of the names dQuery, dKey, dValue, dAttnMask, dSinks, got 3$/],
    ['a bare Float32Array', new Float32Array(4), TypeError, /, got Float32Array\(4\): sdpaBackward has several results, so name the one it is for, e\.g\. \{ dQuery: array \}$/],
    ['an unknown name', { dQ: new Float32Array(576) }, TypeError, /^sdpaBackward: options\.out\.dQ is not a result of sdpaBackward; options\.out takes dQuery, dKey, dValue, dAttnMask, dSinks$/],
    ['a Float64Array', { dValue: new Float64Array(1680) }, TypeError, /^sdpaBackward: options\.out\.dValue must be a Float32Array, got Float64Array\(1680\)$/],
    ['too small', { dKey: new Float32Array(2239) }, RangeError, /^sdpaBackward: options\.out\.dKey is too small: the gradient dKey \[2, 70, 2, 8\] needs 2240 floats, got 2239$/],
    ['detached', { dQuery: (() => { const a = new Float32Array(576); structuredClone(a.buffer, { transfer: [a.buffer] }); return a; })() }, RangeError,
      /^sdpaBackward: options\.out\.dQuery has no elements: its ArrayBuffer is detached .*; the gradient dQuery \[2, 9, 4, 8\] needs 576 floats$/],
    ['one array for two gradients', (() => { const a = new Float32Array(2240); return { dKey: a, dValue: a }; })(), RangeError,
      /^sdpaBackward: options\.out\.dKey and options\.out\.dValue share memory \(the same buffer, overlapping elements\): one gradient would overwrite the other/],
    ['a Map', new Map([['dQuery', new Float32Array(576)]]), TypeError, /^sdpaBackward: options\.out must be an object of Float32Arrays .*, got Map$/],
    ['an ArrayBuffer', new ArrayBuffer(2304), TypeError, /^sdpaBackward: options\.out must be an object of Float32Arrays .*, got ArrayBuffer$/],
    ['an object of another kind (its own toStringTag)', { [Symbol.toStringTag]: 'Gradients', dQuery: new Float32Array(576) }, TypeError,
      /^sdpaBackward: options\.out must be an object of Float32Arrays .*, got Gradients$/],
    ['two overlapping views', (() => { const a = new Float32Array(1000); return { dQuery: a.subarray(0, 576), dAttnMask: a.subarray(575) }; })(), RangeError,
      /^sdpaBackward: options\.out\.dQuery and options\.out\.dAttnMask share memory/],
  ])('%s: a typed error, nothing written, the instance keeps working', (_, out, Cls, pattern) => {
    const arrays = (out !== null && typeof out === 'object' && !ArrayBuffer.isView(out) ? Object.values(out) : [])
      .filter((array) => array.length > 0);  // (not the detached one)
    for (const array of arrays) array.fill(-7);
    let error;
    try {
      attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out });
    } catch (e) {
      error = e;
    }
    expect(error?.constructor).toBe(Cls);
    expect(error.message).toMatch(pattern);
    for (const array of arrays) expect(array.every((x) => x === -7)).toBe(true);
    expect(attn.memory().bytesInUse).toBe(0);
    const again = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    for (const name of names) expect(sameBits(again[name].data, fresh[name].data)).toBe(true);
  });

  test('accumulate: each gradient added to what its array holds (the float32 sum), the others new; a bias shared by two layers', () => {
    const prior = Object.fromEntries(names.map((name, i) => [name, randomTensor([sizes[name] + 2], 120 + i).data]));
    const out = Object.fromEntries(names.map((name) => [name, prior[name].slice()]));
    const got = attn2.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out, accumulate: true });
    for (const name of names) {
      expect(got[name].data.buffer).toBe(out[name].buffer);
      const sum = Float32Array.from(fresh[name].data, (g, n) => prior[name][n] + g);  // rounded once, to float32
      expect([name, sameBits(got[name].data, sum)]).toEqual([name, true]);
      expect([...out[name].subarray(sizes[name])]).toEqual([...prior[name].subarray(sizes[name])]);
    }
    // T5 shares one relative position bias between its layers: its gradient is the sum of each
    // layer's, accumulated in one array; dQuery, dKey and dValue (no out for them) are new arrays.
    const bias = options.attnMask;
    const layer2 = problem({ B: 2, Hq: 4, Hkv: 2, Lq: 9, Lk: 70, E: 8, Ev: 6, layout: 'bshd', seed: 121 });
    const second = attn.sdpaBackward(layer2.query, layer2.key, layer2.value, layer2.gradOutput, options);
    const dBias = new Float32Array(sizes.dAttnMask);
    for (const layer of [p, layer2]) {
      const g = attn.sdpaBackward(layer.query, layer.key, layer.value, layer.gradOutput, { ...options, attnMask: bias, out: { dAttnMask: dBias }, accumulate: true });
      expect(g.dAttnMask.data).toBe(dBias);
      expect(sameBits(g.dQuery.data, (layer === p ? fresh : second).dQuery.data)).toBe(true);
    }
    expect(sameBits(dBias, Float32Array.from(fresh.dAttnMask.data, (g, n) => g + second.dAttnMask.data[n]))).toBe(true);
    expect(attn.memory().bytesInUse).toBe(0);
  });

  test.each([
    ['accumulate not a boolean', { accumulate: 1, out: {} }, TypeError, /^sdpaBackward: options\.accumulate must be a boolean, got 1$/],
    ['accumulate without out', { accumulate: true }, TypeError, /^sdpaBackward: options\.accumulate adds the gradients into options\.out's arrays; it needs options\.out$/],
    ['accumulate, out too small', { accumulate: true, out: { dValue: new Float32Array(1679) } }, RangeError, /^sdpaBackward: options\.out\.dValue is too small/],
  ])('%s: a typed error, nothing added', (_, extra, Cls, pattern) => {
    const arrays = Object.values(extra.out ?? {}).map((array) => array.fill(3));
    expect(() => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, ...extra })).toThrow(Cls);
    expect(() => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, ...extra })).toThrow(pattern);
    for (const array of arrays) expect(array.every((x) => x === 3)).toBe(true);
    expect(attn.memory().bytesInUse).toBe(0);
  });

  test('an out array detached or shrunk by a later getter (out.dAttnMask\'s): a RangeError naming it, nothing written; the worker too', async () => {
    const make = (breakIt) => {
      const dQuery = new Float32Array(sizes.dQuery).fill(-7);
      const dKey = new Float32Array(sizes.dKey).fill(-7);
      const resizable = new Float32Array(new ArrayBuffer(4 * sizes.dValue, { maxByteLength: 4 * sizes.dValue }));
      const dAttnMask = new Float32Array(sizes.dAttnMask).fill(-7);
      const out = { dQuery, dKey, dValue: resizable };
      Object.defineProperty(out, 'dAttnMask', { enumerable: true, get: () => { breakIt({ dQuery, resizable }); return dAttnMask; } });
      return { out, untouched: [dQuery, dKey, dAttnMask] };
    };
    // [what the getter does, the direct API's message, the worker's (it reads `out` when the call
    // is made, and checks the arrays as they are then)]
    const cases = [
      [({ dQuery }) => structuredClone(dQuery.buffer, { transfer: [dQuery.buffer] }),
        /^sdpaBackward: options\.out\.dQuery's buffer was detached while the call read its arguments \(by a getter\); nothing was done$/,
        /^sdpaBackward: options\.out\.dQuery has no elements: its ArrayBuffer is detached/],
      [({ resizable }) => resizable.buffer.resize(4),
        /^sdpaBackward: options\.out\.dValue shrank below the 1680 elements checked while the call read its arguments/,
        /^sdpaBackward: options\.out\.dValue is too small: the gradient dValue \[2, 70, 2, 6\] needs 1680 floats, got 1$/],
    ];
    const worker = await createAttentionWorker({ threads: 1 });
    try {
      for (const [breakIt, direct, viaWorker] of cases) {
        for (const [api, pattern] of [[attn, direct], [attn2, direct], [worker, viaWorker]]) {
          const { out, untouched } = make(breakIt);
          const error = await (async () => api.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out }))().then(() => undefined, (e) => e);
          expect(error?.constructor).toBe(RangeError);
          expect(error.message).toMatch(pattern);
          for (const array of untouched) expect(array.length === 0 || array.every((x) => x === -7)).toBe(true);
        }
      }
    } finally {
      worker.dispose();
    }
    expect(attn.memory().bytesInUse).toBe(0);
    const again = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    for (const name of names) expect(sameBits(again[name].data, fresh[name].data)).toBe(true);
  });

  test('out.dAttnMask without returnMaskGrad: a TypeError', () => {
    const { returnMaskGrad: _, ...withoutGrad } = options;
    expect(() => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...withoutGrad, out: { dAttnMask: new Float32Array(280) } }))
      .toThrow(new TypeError('sdpaBackward: options.out.dAttnMask is only written with options.returnMaskGrad: true (and a float attnMask)'));
  });

  test('out.dSinks without sinks: a TypeError; too short: a RangeError', () => {
    expect(() => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out: { dSinks: new Float32Array(4) } }))
      .toThrow(new TypeError('sdpaBackward: options.out.dSinks is only written with options.sinks (the sinks\' gradient)'));
    const Hq = p.query.dims[1];
    expect(() => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput,
      { ...options, sinks: new Float32Array(Hq), out: { dSinks: new Float32Array(Hq - 1) } })).toThrow(RangeError);
  });

  test('through the worker: the same bits into the same arrays, and the same errors', async () => {
    const worker = await createAttentionWorker({ threads: 1 });
    try {
      const out = Object.fromEntries(names.map((name) => [name, new Float32Array(sizes[name] + 2).fill(NaN)]));
      const got = await worker.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out });
      for (const name of names) {
        expect(got[name].data.buffer).toBe(out[name].buffer);
        expect(sameBits(got[name].data, fresh[name].data)).toBe(true);
        expect(out[name].subarray(sizes[name]).every(Number.isNaN)).toBe(true);
      }
      const exact = new Float32Array(sizes.dValue);
      expect((await worker.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out: { dValue: exact } })).dValue.data).toBe(exact);
      // accumulate: added on this side when the gradients come back, the direct call's bits.
      const prior = randomTensor([sizes.dKey], 122).data;
      const [summedHere, summedThere] = [prior.slice(), prior.slice()];
      attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out: { dKey: summedHere }, accumulate: true });
      expect((await worker.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out: { dKey: summedThere }, accumulate: true })).dKey.data)
        .toBe(summedThere);
      expect(sameBits(summedThere, summedHere)).toBe(true);
      expect(sameBits(summedHere, prior)).toBe(false);
      const bad = { dKey: new Float32Array(10) };
      const direct = (() => {
        try {
          attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out: bad });
        } catch (e) {
          return e;
        }
      })();
      const remote = await worker.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out: bad }).then(() => undefined, (e) => e);
      expect([remote?.constructor, remote?.message]).toEqual([RangeError, direct.message]);

      // An out sharing a buffer with an input that { transfer: true } would move: refused, nothing moved.
      const inputs = structuredClone(p);
      const shared = new Float32Array(inputs.query.data.length + sizes.dQuery);
      shared.set(inputs.query.data);
      const query = t(shared.subarray(0, inputs.query.data.length), inputs.query.dims);
      const refused = await worker.sdpaBackward(query, inputs.key, inputs.value, inputs.gradOutput,
        { ...options, transfer: true, out: { dQuery: shared.subarray(inputs.query.data.length) } }).then(() => undefined, (e) => e);
      expect(refused?.constructor).toBe(RangeError);
      expect(refused.message).toMatch(/^sdpaBackward: options\.out\.dQuery shares its ArrayBuffer with an input that \{ transfer: true \} moves to the worker/);
      expect([query.data.length, inputs.key.data.length]).toEqual([inputs.query.data.length, sizes.dKey]);

      // An out detached while the call runs: a RangeError naming it, no gradient written (the
      // others are checked first), and the worker keeps working.
      const dQuery = new Float32Array(sizes.dQuery).fill(-7), dKey = new Float32Array(sizes.dKey);
      const running = worker.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out: { dQuery, dKey } });
      await null;  // sent
      structuredClone(dKey.buffer, { transfer: [dKey.buffer] });
      const lost = await running.then(() => undefined, (e) => e);
      expect(lost?.constructor).toBe(RangeError);
      expect(lost.message).toBe("sdpaBackward: options.out.dKey's buffer was detached while the call ran; the gradient dKey " +
        '[2, 70, 2, 8] (2240 floats) could not be written into it, nor were the others');
      expect(dQuery.every((x) => x === -7)).toBe(true);
      const after = await worker.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
      for (const name of names) expect(sameBits(after[name].data, fresh[name].data)).toBe(true);
    } finally {
      worker.dispose();
    }
  });
});

describe('finite differences of the float64 forward', () => {
  // L(θ) = Σ dO ∘ sdpa(θ) in float64 (referenceSdpa reads Float64Array data as well); the
  // central difference (L(θ + h) - L(θ - h)) / 2h for every element of Q, K and V.
  const loss = (p, options) => {
    const { output } = referenceSdpa(p.query, p.key, p.value, options);
    let sum = 0;
    for (let n = 0; n < output.length; n++) sum += output[n] * p.gradOutput.data[n];
    return sum;
  };
  const cases = [
    ['plain', {}, {}],
    ['GQA, causal offset 1, float mask, softcap 2, scale 0.7', { B: 1, Hq: 2, Hkv: 1 },
      { isCausal: true, causalOffset: 1, softcap: 2, scale: 0.7, attnMask: t(Float32Array.of(0, -1, 0.5, -Infinity, 0.25), [5]) }],
    ['key lengths, bool mask, bshd', { B: 2, Hq: 2, Hkv: 2, layout: 'bshd' },
      { keyLengths: Int32Array.of(4, 2), attnMask: t(Uint8Array.of(1, 0, 1, 1, 1), [5]), layout: 'bshd' }],
    // The mask does not depend on the inputs: the loss stays differentiable through the kept keys.
    ['dropout 0.4, GQA, causal offset 1, float mask, sinks', { B: 2, Hq: 2, Hkv: 1 },
      { dropoutP: 0.4, dropoutSeed: 9, isCausal: true, causalOffset: 1, attnMask: t(Float32Array.of(0, -1, 0.5, -Infinity, 0.25), [5]), sinks: Float32Array.of(0.5, -1) }],
    ['dropout 0.7, softcap 2', { B: 1, Hq: 2, Hkv: 2 }, { dropoutP: 0.7, dropoutSeed: 2 ** 32 - 1, softcap: 2 }],
  ];
  test.each(cases)('%s', (_, shape, options) => {
    const p = problem({ Lq: 3, Lk: 5, E: 3, Ev: 2, seed: 5, ...shape });
    const floatMask = options.attnMask?.data instanceof Float32Array;
    const got = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, returnMaskGrad: floatMask });
    const ref = referenceSdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    const h = 1e-6;
    const inputs = [['query', got.dQuery.data, ref.dQuery], ['key', got.dKey.data, ref.dKey], ['value', got.dValue.data, ref.dValue]];
    if (floatMask) inputs.push(['attnMask', got.dAttnMask.data, ref.dAttnMask]);
    for (const [name, grad, refGrad] of inputs) {
      const tensor = name === 'attnMask' ? options.attnMask : p[name];
      const x = Float64Array.from(tensor.data);
      const [q64, options64] = name === 'attnMask'
        ? [p, { ...options, attnMask: t(x, tensor.dims) }] : [{ ...p, [name]: t(x, tensor.dims) }, options];
      for (let n = 0; n < x.length; n++) {
        if (x[n] === -Infinity) {  // a blocked key: no neighbourhood to difference in
          expect(Object.is(grad[n], 0) && refGrad[n] === 0).toBe(true);
          continue;
        }
        const saved = x[n];
        x[n] = saved + h;
        const up = loss(q64, options64);
        x[n] = saved - h;
        const down = loss(q64, options64);
        x[n] = saved;
        const fd = (up - down) / (2 * h);
        expect(Math.abs(refGrad[n] - fd)).toBeLessThanOrEqual(1e-6 * (1 + Math.abs(fd)));
        expect(Math.abs(grad[n] - fd)).toBeLessThanOrEqual(TOL * (1 + Math.abs(fd)));
      }
    }
  });
});

describe('sdpa(..., { returnLogSumExp: true })', () => {
  test.each([
    ['prefill, causal with an empty batch', { B: 2, Hq: 4, Hkv: 2, Lq: 9, Lk: 70 }, (Lq, Lk) => ({ isCausal: true, causalOffset: Int32Array.of(Lk - Lq, -Lq) })],
    ['decode (split-K segments)', { B: 2, Hq: 4, Hkv: 2, Lq: 1, Lk: 1500 }, () => ({})],
    ['bshd with a mask', { B: 1, Hq: 3, Hkv: 1, Lq: 5, Lk: 40, layout: 'bshd' }, () => ({ layout: 'bshd', attnMask: t(new Uint8Array(40).fill(1).fill(0, 0, 3), [40]) })],
  ])('%s', (_, shape, makeOptions) => {
    const p = problem({ ...shape, seed: 8 });
    const options = makeOptions(shape.Lq, shape.Lk);
    const result = attn.sdpa(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    expect(result.logSumExp.dims).toEqual([shape.B, shape.Hq, shape.Lq]);
    expect(logSumExpError(result.logSumExp.data, referenceLogSumExp(p.query, p.key, p.value, options))).toBeLessThanOrEqual(1e-5);
    // The output is the same bits as without the log-sum-exp.
    expect(sameBits(result.output.data, attn.sdpa(p.query, p.key, p.value, options).output.data)).toBe(true);
  });
});

describe('paths and threads give the same bits', () => {
  const p = problem({ B: 2, Hq: 4, Hkv: 2, Lq: 37, Lk: 150, E: 16, Ev: 12, seed: 21 });
  const options = { isCausal: true, causalOffset: 100, attnMask: t(Float32Array.from({ length: 150 }, (_, j) => (j % 11 === 0 ? -Infinity : Math.sin(j))), [150]) };

  test('saved { output, logSumExp } and recomputed', () => {
    const forward = attn.sdpa(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    const recomputed = expectGradientsMatch(attn, p, options);
    const saved = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput,
      { ...options, saved: { output: forward.output, logSumExp: forward.logSumExp } });
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(saved[name].data, recomputed[name].data)).toBe(true);
  });

  test('one and two threads', () => {
    expect(attn2.threads).toBe(2);
    const one = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    const two = attn2.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(two[name].data, one[name].data)).toBe(true);
  });
});

describe('scores far from zero: p rebuilt from the row\'s own maximum, not from a coarse float32 lse', () => {
  // A float32 lse = m + log(l) loses log(l) once |m| ≥ 2^24·log(l): rebuilt as exp(s - lse),
  // each of a row's tied scores at -1e9 would get p = 1 instead of 1/Lk (gradients Lk times
  // too large). Rows whose q is 0 score exactly their float mask's value: tied, uniform p.
  test.each([-1e2, -1e4, -1e9, -3.4e38])('rows of tied scores at %p (a finite mask over the row), saved and not, 1 and 2 threads', (bias) => {
    const Hq = 2, Lq = 6, Lk = 70, E = 16;
    const p = problem({ Hq, Lq, Lk, E, Ev: 8, seed: 50 });
    const mask = new Float32Array(Hq * Lq);  // [Hq, Lq, 1]: one value per row
    for (let row = 0; row < Hq * Lq; row++) {
      if (row % 2 === 0) p.query.data.fill(0, row * E, (row + 1) * E);
      mask[row] = row % 2 === 0 ? bias : 0.5;
    }
    const options = { attnMask: t(mask, [Hq, Lq, 1]) };
    const got = expectGradientsMatch(attn, p, options);
    const fwd = attn.sdpa(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    const saved = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, saved: fwd });
    const two = attn2.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    for (const name of ['dQuery', 'dKey', 'dValue']) {
      expect(sameBits(saved[name].data, got[name].data)).toBe(true);
      expect(sameBits(two[name].data, got[name].data)).toBe(true);
    }
  });

  // Large q and k nearly orthogonal: small scores (lse ≈ 4) made of large terms, whose float32
  // errors differ between the forward's order of summation and the backward's. dV = Σ_rows p·dO,
  // so Σ_j dV_j = dO when the row's p sums to one: true of the recomputed statistics whatever the
  // conditioning (with p rebuilt from the forward's lse, the sum was off by 27% at size 300).
  test.each([30, 100, 300])('large q and k nearly orthogonal (size %p): the probabilities the backward uses sum to one', (size) => {
    const E = 64, Lk = 64;
    const p = problem({ Lq: 1, Lk, E, Ev: 8, seed: size });
    const q = p.query.data;
    q.forEach((v, i) => { q[i] = v * size; });
    const qq = q.reduce((a, v) => a + v * v, 0);
    for (let j = 0; j < Lk; j++) {  // k_j := size·(k_j − (k_j·q / q·q)·q), in float64, then rounded
      const k = p.key.data.subarray(j * E, (j + 1) * E);
      const kq = k.reduce((a, v, d) => a + v * q[d], 0);
      const projected = Array.from(k, (v, d) => v - (kq / qq) * q[d]);
      projected.forEach((v, d) => { k[d] = v * size; });
    }
    const { dValue } = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput);
    for (let c = 0; c < 8; c++) {
      let sum = 0;
      for (let j = 0; j < Lk; j++) sum += dValue.data[j * 8 + c];
      expect(Math.abs(sum - p.gradOutput.data[c])).toBeLessThanOrEqual(1e-5 * Math.abs(p.gradOutput.data[c]) + 1e-7);
    }
  });

  // Scores of ~1e4 .. 1e8: the backward's scores may differ from the forward's by an ulp of
  // |s|, which exp(s - lse) would turn into p = e^-8 for a one-hot row's key. dV = Σ_rows p·dO
  // depends on p alone and is checked; dQ and dK (p·(dp - D) times k or q of size 1e2 .. 1e4,
  // D cancelling dp) are ill-conditioned there: float32 scores already differ from float64
  // ones by more than their tolerance allows (the relaxed build's fused multiply-adds by other
  // amounts than the portable build's).
  test.each([1e2, 1e3, 1e4])('huge logits (q and k times %p): nearly one-hot rows, Lk past a key tile', (size) => {
    for (const E of [16, 64]) {
      const p = problem({ Hq: 2, Lq: 9, Lk: 131, E, Ev: 8, seed: size + E });
      for (const x of [p.query.data, p.key.data]) x.forEach((v, i) => { x[i] = v * size; });
      const got = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { scale: 1 });
      const ref = referenceSdpaBackward(p.query, p.key, p.value, p.gradOutput, { scale: 1 });
      expect(maxRelError(got.dValue.data, ref.dValue)).toBeLessThanOrEqual(TOL);
    }
  });
});

test('fully masked rows get exact-zero dQ; keys no row attends get exact-zero dK and dV', () => {
  const p = problem({ Hq: 2, Lq: 6, Lk: 20, seed: 30 });
  const { dQuery, dKey, dValue } = expectGradientsMatch(attn, p, { isCausal: true, causalOffset: -3 });
  for (let h = 0; h < 2; h++) {
    for (let i = 0; i < 3; i++) expect(Array.from(dQuery.data.subarray((h * 6 + i) * 8, (h * 6 + i + 1) * 8))).toEqual(new Array(8).fill(0));
  }
  expect(Array.from(dKey.data.subarray(3 * 8))).toEqual(new Array(17 * 8).fill(0));
  expect(Array.from(dValue.data.subarray(3 * 8))).toEqual(new Array(17 * 8).fill(0));
});

describe('bad input: TypeError or RangeError naming the argument; the instance keeps working', () => {
  const p = problem({ B: 1, Hq: 2, Hkv: 1, Lq: 3, Lk: 5, E: 4, Ev: 6, seed: 40 });
  const forward = () => attn.sdpa(p.query, p.key, p.value, { returnLogSumExp: true });
  test.each([
    ['gradOutput missing', () => attn.sdpaBackward(p.query, p.key, p.value), TypeError, /^sdpaBackward: gradOutput must be a tensor .*, got undefined$/],
    ['gradOutput of the wrong dims', () => attn.sdpaBackward(p.query, p.key, p.value, randomTensor([1, 2, 3, 4], 1)), RangeError,
      /sdpaBackward: gradOutput\.dims must equal the output's dims \[1, 2, 3, 6\], got \[1, 2, 3, 4\]/],
    ['gradOutput a Float64Array', () => attn.sdpaBackward(p.query, p.key, p.value, t(new Float64Array(36), [1, 2, 3, 6])), TypeError,
      /sdpaBackward: gradOutput\.data must be a Float32Array or a Float16Array, got Float64Array/],
    ['returnWeights (not a backward option)', () => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { returnWeights: true }), TypeError,
      /^sdpaBackward: unknown option "returnWeights" \(an option of sdpa only\); known options: /],
    ['saved not an object', () => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { saved: 3 }), TypeError, /^sdpaBackward: options\.saved must be \{ output, logSumExp \}.*, got 3$/],
    ['saved.output of the wrong dims', () => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { saved: { output: randomTensor([1, 2, 3, 5], 1), logSumExp: forward().logSumExp } }),
      RangeError, /options\.saved\.output\.dims must equal the output's dims \[1, 2, 3, 6\], got \[1, 2, 3, 5\]$/],
    ['saved.logSumExp of the wrong dims', () => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { saved: { output: forward().output, logSumExp: randomTensor([1, 2, 4], 1) } }),
      RangeError, /options\.saved\.logSumExp must have dims \[1, 2, 3\] and 6 elements, got dims \[1, 2, 4\] and 8 elements/],
    ['saved.logSumExp missing', () => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { saved: { output: forward().output } }),
      TypeError, /^sdpaBackward: options\.saved\.logSumExp must be a tensor .*, got undefined$/],
    ['saved.logSumExp a bare Float32Array', () => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { saved: { output: forward().output, logSumExp: forward().logSumExp.data } }),
      TypeError, /^sdpaBackward: options\.saved\.logSumExp must be a tensor .*, got Float32Array\(6\), a bare array: pass it as \{ data, dims \}$/],
    ['a bad scale', () => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { scale: NaN }), RangeError, /^sdpaBackward: options\.scale must be a finite number.*, got NaN$/],
    ['dropoutP 1', () => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { dropoutP: 1, dropoutSeed: 1 }), RangeError,
      /^sdpaBackward: options\.dropoutP must be a number in \[0, 1\) .*, got 1$/],
    ['dropoutP without dropoutSeed', () => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { dropoutP: 0.5 }), TypeError,
      /^sdpaBackward: options\.dropoutSeed is required with options\.dropoutP > 0 .*, got undefined$/],
    ['dropoutSeed 2^32', () => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { dropoutP: 0.5, dropoutSeed: 2 ** 32 }), RangeError,
      /^sdpaBackward: options\.dropoutSeed must be an integer in \[0, 2\^32\), got 4294967296$/],
    ['returnLogSumExp not a boolean', () => attn.sdpa(p.query, p.key, p.value, { returnLogSumExp: 1 }), TypeError, /^sdpa: options\.returnLogSumExp must be a boolean, got 1$/],
    ['returnMaskGrad not a boolean', () => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { returnMaskGrad: 'yes' }), TypeError,
      /^sdpaBackward: options\.returnMaskGrad must be a boolean, got "yes"$/],
    ['returnMaskGrad without a mask', () => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { returnMaskGrad: true }), TypeError,
      /^sdpaBackward: options\.returnMaskGrad needs an additive options\.attnMask \(Float32Array or Float16Array data\); got no attnMask$/],
    ['returnMaskGrad with a bool mask', () => attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput,
      { returnMaskGrad: true, attnMask: t(Uint8Array.of(1, 0, 1, 1, 1), [5]) }), TypeError,
    /^sdpaBackward: options\.returnMaskGrad needs an additive options\.attnMask \(Float32Array or Float16Array data\); got a boolean one \(Uint8Array data\), which has no gradient$/],
    ['sdpa does not take returnMaskGrad', () => attn.sdpa(p.query, p.key, p.value, { returnMaskGrad: true }), TypeError, /^sdpa: unknown option "returnMaskGrad" \(an option of sdpaBackward only\); known options: /],
  ])('%s', (_, call, Cls, pattern) => {
    let error;
    try {
      call();
    } catch (e) {
      error = e;
    }
    expect(error?.constructor).toBe(Cls);
    expect(error.message).toMatch(pattern);
    expectGradientsMatch(attn, p);
    expect(attn.memory().bytesInUse).toBe(0);
  });

  test('past maxMemoryBytes: refused before allocating, RangeError naming sdpaBackward', async () => {
    const small = await createAttention({ threads: 1, maxMemoryBytes: 32768 });
    try {
      const big = problem({ Lq: 256, Lk: 256, E: 8, seed: 50 });  // 8 KiB for each of Q, K, V, dO, O, dQ, dK, dV
      expect(() => small.sdpaBackward(big.query, big.key, big.value, big.gradOutput)).toThrow(/^sdpaBackward: needs \d+ bytes of wasm memory/);
      expect(small.memory().bytesInUse).toBe(0);
      expectGradientsMatch(small, problem({ Lq: 2, Lk: 3, E: 4, seed: 51 }));
    } finally {
      small.dispose();
    }
  });
});

describe('sdpaBackward past maxMemoryBytes runs a slice of batches and KV heads at a time: the bits of the whole copy', () => {
  // B·Hkv = 15 (batch, KV head) pairs, GQA, Lq ≠ Lk, Ev ≠ E. Where the whole copy would pass the
  // limit, sdpaBackward runs slices of 2 batches (the third alone), or 5, 3, 2 or 1 KV heads of
  // one batch; with sinks every slice holds all three batches (3, 2 or 1 KV heads of each),
  // since each head's sink gradient is one sum over every batch and row. The mask's gradient
  // sums over the axes the mask broadcasts on: a slice holds every batch (a mask [1, Hq, ·, ·])
  // or every head (a mask [B, 1, ·, ·]) it sums over, and splits each of its blocks' sums into
  // the whole call's parts.
  const B = 3, Hq = 10, Hkv = 5, Lq = 29, Lk = 150, E = 16, Ev = 12;
  const keyLengths = new Int32Array([150, 131, 97]);
  const cases = {
    'key lengths, per-batch causal offsets, a float mask [B, 1, Lq, Lk], softcap': {
      keyLengths, isCausal: true, causalOffset: new Int32Array([121, 90, -3]), attnMask: floatMask([B, 1, Lq, Lk], 501, 0.1), softcap: 4,
    },
    'sinks, ALiBi [B, Hq], dropout, a bool mask [1, Hq, Lq, Lk]': {
      keyLengths, sinks: Float32Array.from({ length: Hq }, (_, h) => h / 2 - 2), alibiSlopes: Float32Array.from({ length: B * Hq }, (_, i) => 2 ** -(1 + (i % 7))),
      dropoutP: 0.25, dropoutSeed: 5, attnMask: t(Uint8Array.from({ length: Hq * Lq * Lk }, (_, i) => Number(i % 5 !== 2)), [1, Hq, Lq, Lk]),
    },
    'keyStarts, a sliding window, a scale': {
      keyStarts: new Int32Array([3, 0, 11]), isCausal: true, causalOffset: 120, slidingWindow: 40, scale: 0.4,
    },
    'the gradient of a float mask [B, Hq, Lq, Lk] (slices of batches and KV heads), causal': {
      isCausal: true, causalOffset: 121, attnMask: floatMask([B, Hq, Lq, Lk], 502, 0.1), returnMaskGrad: true,
    },
    'the gradient of a float mask [1, Hq, 1, Lk] (summed over batches and rows: KV heads of every batch), sinks, key lengths': {
      keyLengths, sinks: Float32Array.from({ length: Hq }, (_, h) => 1 - h / 3), attnMask: floatMask([1, Hq, 1, Lk], 503, 0.1), returnMaskGrad: true,
    },
    'the gradient of a float mask [B, 1, Lq, 1] (summed over heads and keys: batches of every head), dropout': {
      dropoutP: 0.2, dropoutSeed: 7, attnMask: floatMask([B, 1, Lq, 1], 504), returnMaskGrad: true,
    },
  };
  /** Shares of the whole call's peak to run under: down to about its smallest slice's. */
  const sharesOf = (options) => {
    if (options.returnMaskGrad && options.attnMask.dims[1] === 1) return [0.8, 0.5];  // one batch: a third
    return options.sinks || (options.returnMaskGrad && options.attnMask.dims[0] === 1) ? [0.8, 0.5, 0.3] : [0.8, 0.5, 0.3, 0.2];
  };
  /** The call on a fresh instance without a limit (two threads: the whole copy), and the memory it took. */
  const unlimited = async (p, options) => {
    const instance = await createAttention({ threads: 2 });
    try {
      return { result: instance.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options), peak: instance.memory().peakBytes };
    } finally {
      instance.dispose();
    }
  };
  const expectSameGradients = (got, expected) => {
    for (const name of ['dQuery', 'dKey', 'dValue', 'dSinks', 'dAttnMask']) {
      expect(got[name] === undefined).toBe(expected[name] === undefined);
      if (expected[name] !== undefined) {
        expect(got[name].dims).toEqual(expected[name].dims);
        expect(sameBits(got[name].data, expected[name].data)).toBe(true);
      }
    }
  };

  test.each(Object.keys(cases).flatMap((name) => ['bhsd', 'bshd'].map((layout) => [name, layout])))('%s (%s): threads 1 and 2, saved or not, three or four limits; within the reference', async (name, layout) => {
    const p = problem({ B, Hq, Hkv, Lq, Lk, E, Ev, layout, seed: 510 });
    const options = layout === 'bshd' ? { ...cases[name], layout } : cases[name];
    const { returnMaskGrad: _maskGrad, ...forwardOptions } = options;
    const forward = attn.sdpa(p.query, p.key, p.value, { ...forwardOptions, returnLogSumExp: true });
    const saved = { output: forward.output, logSumExp: forward.logSumExp };
    const { result: expected, peak } = await unlimited(p, options);
    const ref = referenceSdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    for (const grad of ['dQuery', 'dKey', 'dValue', 'dSinks', 'dAttnMask']) {
      if (expected[grad]) expect(maxRelError(expected[grad].data, ref[grad])).toBeLessThanOrEqual(TOL);
    }
    expect(expected.dAttnMask === undefined).toBe(!options.returnMaskGrad);
    for (const threads of [1, 2]) {
      for (const share of sharesOf(options)) {
        const limit = Math.floor(peak * share);
        const small = await createAttention({ threads, maxMemoryBytes: limit });
        try {
          expectSameGradients(small.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options), expected);
          expectSameGradients(small.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, saved }), expected);
          expect(small.memory().peakBytes).toBeLessThanOrEqual(limit);
          expect(small.memory().bytesInUse).toBe(0);
        } finally {
          small.dispose();
        }
      }
    }
  });

  test('into out and accumulated, with out arrays that are the inputs', async () => {
    const p = problem({ B, Hq, Hkv: Hq, Lq, Lk: Lq, E, Ev: E, seed: 520 });
    const options = { isCausal: true, sinks: Float32Array.from({ length: Hq }, () => 0.5) };
    const { result: expected, peak } = await unlimited(p, options);
    const small = await createAttention({ threads: 2, maxMemoryBytes: Math.floor(peak / 3) });
    try {
      // Written into the inputs' own arrays (each read before any is written).
      const copy = (x) => t(x.data.slice(), x.dims);
      const q = copy(p.query), k = copy(p.key), v = copy(p.value);
      const written = small.sdpaBackward(q, k, v, p.gradOutput, { ...options, out: { dQuery: q.data, dKey: k.data, dValue: v.data } });
      expect(written.dQuery.data).toBe(q.data);
      expectSameGradients(written, expected);
      // Added to what out holds.
      const base = randomTensor([B, Hq, Lq, E], 521).data;
      const dQuery = base.slice();
      small.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out: { dQuery }, accumulate: true });
      expect(sameBits(dQuery, base.map((x, i) => x + expected.dQuery.data[i]))).toBe(true);
      expect(small.memory().peakBytes).toBeLessThanOrEqual(Math.floor(peak / 3));
    } finally {
      small.dispose();
    }
  });

  test('the gradient of a mask [Lq, Lk] (summed over batches and heads), and sinks with one KV head, are refused past the limit (whole copy named); one (batch, KV head) that does not fit is named', async () => {
    const small = await createAttention({ threads: 1, maxMemoryBytes: 64 * 1024 });
    try {
      const p = problem({ B, Hq, Hkv, Lq, Lk, E, Ev, seed: 530 });
      const attnMask = floatMask([Lq, Lk], 531);
      expect(() => small.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { attnMask, returnMaskGrad: true }))
        .toThrow(/^sdpaBackward: needs \d+ bytes of wasm memory \(query \d+ bytes .*dMask \d+ bytes/);
      const mqa = problem({ B, Hq: 2, Hkv: 1, Lq, Lk: 300, E, Ev, seed: 532 });
      expect(() => small.sdpaBackward(mqa.query, mqa.key, mqa.value, mqa.gradOutput, { sinks: new Float32Array([0, 1]) }))
        .toThrow(/^sdpaBackward: needs \d+ bytes of wasm memory \(query \d+ bytes .*dSinks 8 bytes/);
      const big = problem({ B: 2, Hq: 2, Hkv: 2, Lq: 200, Lk: 200, E: 32, seed: 533 });
      expect(() => small.sdpaBackward(big.query, big.key, big.value, big.gradOutput))
        .toThrow(new RegExp('^sdpaBackward: needs \\d+ bytes of wasm memory to run one \\(batch, KV head\\) at a time ' +
          `\\(query ${200 * 32 * 4} bytes \\+ key ${200 * 32 * 4} bytes .*more than is left of this instance's limit of 65536 bytes`));
      expect(small.memory().bytesInUse).toBe(0);
      expect(small.memory().peakBytes).toBe(0);
      expectGradientsMatch(small, problem({ Lq: 2, Lk: 3, E: 4, seed: 534 }));
    } finally {
      small.dispose();
    }
  });
});

describe('options.saved is checked against the sdpa() call that returned it: a RangeError naming the first difference', () => {
  const p = problem({ B: 2, Hq: 4, Hkv: 2, Lq: 9, Lk: 70, E: 8, Ev: 6, seed: 70 });
  const mask = (j0) => ({ data: Uint8Array.from({ length: 70 }, (_, j) => Number(j % 7 !== j0)), dims: [70] });
  const options = { isCausal: true, causalOffset: 61, softcap: 5, scale: 0.3, keyLengths: new Int32Array([70, 64]), attnMask: mask(3) };
  const { causalOffset: _offset, ...notCausal } = { ...options, isCausal: false };
  const { attnMask: _mask, ...noMask } = options;
  const forward = () => attn.sdpa(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
  const backward = (instance, saved, q = p.query, k = p.key, v = p.value, o = options) =>
    instance.sdpaBackward(q, k, v, p.gradOutput, { ...o, saved });
  const longer = (t) => randomTensor([...t.dims.slice(0, 2), 71, t.dims[3]], 9);
  const changed = (t) => {  // a copy of the tensor with one element changed (a parameter update)
    const data = t.data.slice();
    data[data.length >> 1] += 0.25;
    return { data, dims: t.dims };
  };
  const there = 'differs from the sdpa\\(\\) call that returned options\\.saved: ';
  const cases = [
    ['isCausal', (f) => backward(attn, f, p.query, p.key, p.value, notCausal), `isCausal ${there}true there, false here`],
    ['causalOffset', (f) => backward(attn, f, p.query, p.key, p.value, { ...options, causalOffset: 60 }), `causalOffset ${there}\\[61, 61\\] there, \\[60, 60\\] here`],
    ['slidingWindow', (f) => backward(attn, f, p.query, p.key, p.value, { ...options, slidingWindow: 30 }), `slidingWindow ${there}none there, 30 here`],
    ['keyStarts', (f) => backward(attn, f, p.query, p.key, p.value, { ...options, keyStarts: new Int32Array([0, 3]) }),
      `keyStarts ${there}\\[0, 0\\] there, \\[0, 3\\] here`],
    ['sinks', (f) => backward(attn, f, p.query, p.key, p.value, { ...options, sinks: Float32Array.of(0, 1, -Infinity, 2) }),
      `sinks ${there}none there, \\[0, 1, -Infinity, 2\\] here`],
    ['alibiSlopes', (f) => backward(attn, f, p.query, p.key, p.value, { ...options, alibiSlopes: Float32Array.of(0.5, 0.25, 0, 1) }),
      `alibiSlopes ${there}none there, \\[0\\.5, 0\\.25, 0, 1\\] here`],
    ['dropout', (f) => backward(attn, f, p.query, p.key, p.value, { ...options, dropoutP: 0.5, dropoutSeed: 7 }),
      `dropout ${there}none there, dropoutP 2147483648/2\\^32 .*dropoutSeed 7 here`],
    ['scale', (f) => backward(attn, f, p.query, p.key, p.value, { ...options, scale: 0.25 }), `scale \\(in float32\\) ${there}0\\.30000001192092896 there, 0\\.25 here`],
    ['softcap', (f) => backward(attn, f, p.query, p.key, p.value, { ...options, softcap: 6 }), `softcap \\(in float32\\) ${there}5 there, 6 here`],
    ['keyLengths', (f) => backward(attn, f, p.query, p.key, p.value, { ...options, keyLengths: new Int32Array([70, 63]) }),
      `keyLengths ${there}\\[70, 64\\] there, \\[70, 63\\] here`],
    ['attnMask left out', (f) => backward(attn, f, p.query, p.key, p.value, noMask), `attnMask ${there}bool, .* there, none here`],
    ['another attnMask', (f) => backward(attn, f, p.query, p.key, p.value, { ...options, attnMask: mask(4) }), `attnMask ${there}bool, strides .*hash`],
    ['keys of another length', (f) => backward(attn, f, p.query, longer(p.key), longer(p.value), noMask),
      `the shapes ${there}B 2, Hq 4, Hkv 2, Lq 9, Lk 70, E 8, Ev 6 there, B 2, Hq 4, Hkv 2, Lq 9, Lk 71, E 8, Ev 6 here`],
    ['query changed since', (f) => backward(attn, f, changed(p.query)), 'query\\.data holds other values than in the sdpa\\(\\) call that returned options\\.saved \\(576 elements'],
    ['key changed since', (f) => backward(attn, f, p.query, changed(p.key)), 'key\\.data holds other values'],
    ['value changed since', (f) => backward(attn, f, p.query, p.key, changed(p.value)), 'value\\.data holds other values'],
    ['two elements of query negated since (sign bits: a hash must mix them)', (f) => {
      const data = p.query.data.slice();
      data[3] = -data[3];
      data[200] = -data[200];
      return backward(attn, f, { data, dims: p.query.dims });
    }, 'query\\.data holds other values'],
    ['output changed since', (f) => backward(attn, { output: changed(f.output), logSumExp: f.logSumExp }), 'options\\.saved\\.output\\.data holds other values'],
    ['logSumExp changed since', (f) => {
      f.logSumExp.data[3] += 1;
      return backward(attn, f);
    }, 'options\\.saved\\.logSumExp\\.data holds other values'],
    ['output of another call', (f) => backward(attn, { output: attn.sdpa(changed(p.query), p.key, p.value, options).output, logSumExp: f.logSumExp }),
      'options\\.saved\\.output\\.data holds other values'],
  ];
  test.each(cases)('%s', (_, call, pattern) => {
    const recomputed = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    let error;
    try {
      call(forward());
    } catch (e) {
      error = e;
    }
    expect(error?.constructor).toBe(RangeError);
    expect(error.message).toMatch(new RegExp(`^sdpaBackward: options\\.saved is not this call's forward: ${pattern}`));
    expect(error.message).toMatch(/saved must be the output and logSumExp of sdpa\(\) with the same inputs and options, unchanged since/);
    expect(attn.memory().bytesInUse).toBe(0);
    // The instance keeps working: the right saved gives the recomputed gradients' bits.
    const right = backward(attn, forward());
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(right[name].data, recomputed[name].data)).toBe(true);
  });

  // A Float16Array input (browsers; Node 20 has none) is hashed from its raw halves, each
  // looked up as its float32 bits, not widened into a copy first: its hash must be the one its
  // float32 values have in a Float32Array. The widening here is written from the format.
  test("a Float16Array's halves hash as the Float32Array of their values: every pattern, every lane, views at any offset", () => {
    const widenedBits = (h) => {
      const sign = h >>> 15, e = (h >>> 10) & 31, m = h & 1023;
      if (e === 31) return (sign << 31) | 0x7f800000 | (m << 13);  // ±Infinity; NaN with its payload, as the module widens it
      const value = (sign ? -1 : 1) * (e === 0 ? m * 2 ** -24 : (1 + m / 1024) * 2 ** (e - 15));
      return new Int32Array(Float32Array.of(value).buffer)[0];
    };
    const halves = Uint16Array.from({ length: 65536 + 7 }, (_, n) => (n < 65536 ? n : 0x3c00 + 37 * n) & 0xffff);
    const floats = new Float32Array(Int32Array.from(halves, widenedBits).buffer);
    for (const count of [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 65535, 65536, 65543]) {
      expect(widenedContentsOf(halves, count)).toBe(contentsOf(floats, count));
    }
    for (const offset of [1, 2, 3, 31744]) {  // 31744: from +Infinity on, Infinity and NaN first
      expect(widenedContentsOf(halves.subarray(offset), 4099)).toBe(contentsOf(floats.subarray(offset), 4099));
    }
    // One half changed (its sign), in each lane and the last word: another hash.
    const whole = widenedContentsOf(halves, 65543);
    for (const n of [0, 1, 2, 3, 40000, 65542]) {
      const changed = halves.slice();
      changed[n] ^= 0x8000;
      expect(widenedContentsOf(changed, 65543)).not.toBe(whole);
    }
  });

  test('equivalent forms of the options are accepted: the values the kernel uses are compared', () => {
    const recomputed = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    const { keyLengths: _lengths, ...allKeys } = options;
    const pairs = [
      // [the forward's options, the backward's]
      [options, { ...options, causalOffset: new Int32Array([61, 61]), scale: Math.fround(0.3) }],
      [{ ...allKeys, scale: undefined }, { ...allKeys, keyLengths: new Int32Array([70, 70]), scale: Math.fround(1 / Math.sqrt(8)) }],
      // The mask at an odd byte offset in the forward, an aligned copy in the backward.
      [{ ...options, attnMask: { data: new Uint8Array([7, ...options.attnMask.data]).subarray(1), dims: [70] } }, options],
    ];
    for (const [forwardOptions, backwardOptions] of pairs) {
      const f = attn.sdpa(p.query, p.key, p.value, { ...forwardOptions, returnLogSumExp: true });
      const got = backward(attn, f, p.query, p.key, p.value, backwardOptions);
      const want = forwardOptions === pairs[1][0] ? attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, backwardOptions) : recomputed;
      for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(got[name].data, want[name].data)).toBe(true);
    }
  });

  test('ALiBi slopes [Hq] and the same row for every batch [B, Hq] are the same slopes; other slopes are refused', () => {
    const shared = Float32Array.of(0.5, 0.25, 0, 0.125);
    const repeated = Float32Array.from({ length: 8 }, (_, n) => shared[n % 4]);
    const f = attn.sdpa(p.query, p.key, p.value, { ...options, alibiSlopes: shared, returnLogSumExp: true });
    const got = backward(attn, f, p.query, p.key, p.value, { ...options, alibiSlopes: repeated });
    const want = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, alibiSlopes: shared });
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(got[name].data, want[name].data)).toBe(true);
    // Slopes in one call and none in the other: the message names alibiSlopes (not the offset
    // they bring along); slopes of 0 are none (the same bits).
    expect(() => backward(attn, f, p.query, p.key, p.value, options))
      .toThrow(/alibiSlopes differs from the sdpa\(\) call that returned options\.saved: \[0\.5, 0\.25, 0, 0\.125\] there, none here/);
    const plain = attn.sdpa(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    const zeros = backward(attn, plain, p.query, p.key, p.value, { ...options, alibiSlopes: new Float32Array(4) });
    const none = backward(attn, plain);
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(zeros[name].data, none[name].data)).toBe(true);
    const other = Float32Array.from(repeated, (x, n) => (n === 5 ? 0.3 : x));
    expect(() => backward(attn, f, p.query, p.key, p.value, { ...options, alibiSlopes: other }))
      .toThrow(/alibiSlopes differs from the sdpa\(\) call that returned options\.saved: \[0\.5, 0\.25, 0, 0\.125\] there, \[\[0\.5, 0\.25, 0, 0\.125\], \[0\.5, 0\.30000001192092896, 0, 0\.125\]\] here/);
  });

  test('`out` over an input: the record has the inputs as the forward read them', () => {
    const square = problem({ B: 2, Hq: 4, Hkv: 2, Lq: 9, Lk: 70, E: 8, Ev: 8, seed: 71 });  // Ev = E: out can be query's array
    const original = { data: square.query.data.slice(), dims: square.query.dims };
    const f = attn.sdpa(square.query, square.key, square.value, { ...options, returnLogSumExp: true, out: square.query.data });
    expect(sameBits(f.output.data, square.query.data)).toBe(true);  // the output is now in query's array
    const go = randomTensor(square.query.dims, 72);
    const call = (query) => attn.sdpaBackward(query, square.key, square.value, go, { ...options, saved: f });
    expect(() => call(square.query)).toThrow(/^sdpaBackward: options\.saved is not this call's forward: query\.data holds other values/);
    const got = call(original), want = attn.sdpaBackward(original, square.key, square.value, go, options);
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(got[name].data, want[name].data)).toBe(true);
  });

  test('a copy of the logSumExp (no record) is not checked: the right values give the recomputed bits', () => {
    const f = forward();
    const copy = { output: { data: f.output.data.slice(), dims: f.output.dims }, logSumExp: { data: f.logSumExp.data.slice(), dims: f.logSumExp.dims } };
    const got = backward(attn, copy), recomputed = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(got[name].data, recomputed[name].data)).toBe(true);
  });

  test('sinks that are all -Infinity are no sinks: saved from a forward without them is accepted, and the other way round', () => {
    const none = forward();
    const minusInf = Float32Array.of(-Infinity, -Infinity, -Infinity, -Infinity);
    const withSinks = backward(attn, none, p.query, p.key, p.value, { ...options, sinks: minusInf });
    const plain = backward(attn, none);
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(withSinks[name].data, plain[name].data)).toBe(true);
    expect(Array.from(withSinks.dSinks.data)).toEqual([0, 0, 0, 0]);
    const f = attn.sdpa(p.query, p.key, p.value, { ...options, sinks: minusInf, returnLogSumExp: true });
    const back = backward(attn, f);
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(back[name].data, plain[name].data)).toBe(true);
  });

  test('dropout: saved from a forward with another seed, another p or none is refused, naming dropout; the same dropout (p in the same 2^-32 step) is accepted', () => {
    const withDropout = { ...options, dropoutP: 0.25, dropoutSeed: 5 };
    const f = attn.sdpa(p.query, p.key, p.value, { ...withDropout, returnLogSumExp: true });
    const recomputed = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, withDropout);
    const refused = (o, saved, pattern) => {
      let error;
      try {
        backward(attn, saved, p.query, p.key, p.value, o);
      } catch (e) {
        error = e;
      }
      expect(error?.constructor).toBe(RangeError);
      expect(error.message).toMatch(new RegExp(`^sdpaBackward: options\\.saved is not this call's forward: dropout ${there}${pattern}`));
      expect(attn.memory().bytesInUse).toBe(0);
    };
    refused({ ...withDropout, dropoutSeed: 6 }, f, 'dropoutP 1073741824/2\\^32 \\(round\\(dropoutP·2\\^32\\)\\), dropoutSeed 5 there, dropoutP 1073741824/2\\^32 \\(round\\(dropoutP·2\\^32\\)\\), dropoutSeed 6 here');
    refused({ ...withDropout, dropoutP: 0.5 }, f, 'dropoutP 1073741824/2\\^32 .*dropoutSeed 5 there, dropoutP 2147483648/2\\^32 .*dropoutSeed 5 here');
    refused(options, f, 'dropoutP 1073741824/2\\^32 .*dropoutSeed 5 there, none here');
    refused(withDropout, forward(), 'none there, dropoutP 1073741824/2\\^32 .*dropoutSeed 5 here');
    // dropoutP 0 with a seed is no dropout: a forward without it is its saved.
    const plain = backward(attn, forward(), p.query, p.key, p.value, { ...options, dropoutP: 0, dropoutSeed: 3 });
    const none = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(plain[name].data, none[name].data)).toBe(true);
    // The same threshold: p within half a 2^-32 step of 0.25 is the same dropout.
    const got = backward(attn, f, p.query, p.key, p.value, { ...withDropout, dropoutP: 0.25 + 2 ** -34 });
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(got[name].data, recomputed[name].data)).toBe(true);
    expect(sameBits(backward(attn, f, p.query, p.key, p.value, withDropout).dKey.data, recomputed.dKey.data)).toBe(true);
  });

  test('through the worker: saved from its forward or from a direct one is checked there, with the direct API message', async () => {
    const worker = await createAttentionWorker({ threads: 1 });
    try {
      const fromWorker = await worker.sdpa(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
      for (const [what, f] of [['worker forward', fromWorker], ['direct forward', forward()]]) {
        const direct = (() => {
          try {
            backward(attn, forward(), p.query, p.key, p.value, { ...options, softcap: 6 });
          } catch (e) {
            return e;
          }
        })();
        const got = await backward(worker, f, p.query, p.key, p.value, { ...options, softcap: 6 }).then(() => undefined, (e) => e);
        expect([what, got?.constructor]).toEqual([what, RangeError]);
        expect(got.message).toBe(direct.message);
        const changedQuery = await backward(worker, f, changed(p.query)).then(() => undefined, (e) => e);
        expect(changedQuery?.message).toMatch(/^sdpaBackward: options\.saved is not this call's forward: query\.data holds other values/);
        const right = await backward(worker, f);
        const recomputed = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
        for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(right[name].data, recomputed[name].data)).toBe(true);
      }
    } finally {
      await worker.dispose();
    }
  });
});

describe('through createAttentionWorker', () => {
  let worker;
  beforeAll(async () => {
    worker = await createAttentionWorker({ threads: 1 });
  });
  afterAll(() => worker.dispose());

  test('the same gradients bit for bit (copied, transferred, saved), and the same errors', async () => {
    const p = problem({ B: 2, Hq: 4, Hkv: 2, Lq: 9, Lk: 70, E: 8, Ev: 6, seed: 60 });
    const options = { isCausal: true, causalOffset: 61, softcap: 5 };
    const direct = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    const copied = await worker.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    const forward = attn.sdpa(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    const saved = await worker.sdpaBackward(p.query, p.key, p.value, p.gradOutput,
      { ...options, saved: { output: forward.output, logSumExp: forward.logSumExp } });
    const inputs = structuredClone(p);
    const moved = await worker.sdpaBackward(inputs.query, inputs.key, inputs.value, inputs.gradOutput, { ...options, transfer: true });
    expect(inputs.query.data.length).toBe(0);  // detached
    for (const result of [copied, saved, moved]) {
      for (const name of ['dQuery', 'dKey', 'dValue']) {
        expect(result[name].dims).toEqual(direct[name].dims);
        expect(sameBits(result[name].data, direct[name].data)).toBe(true);
      }
    }
    const call = (g) => g.sdpaBackward(p.query, p.key, p.value, randomTensor([2, 4, 9, 5], 1), options);
    let directError;
    try {
      call(attn);
    } catch (e) {
      directError = e;
    }
    const workerError = await call(worker).then(() => undefined, (e) => e);
    expect(workerError.constructor).toBe(RangeError);
    expect(workerError.message).toBe(directError.message);
  });

  test('sinks: dSinks with the other gradients bit for bit, into out and accumulated; a bad sink the same error', async () => {
    const p = problem({ B: 2, Hq: 4, Hkv: 2, Lq: 9, Lk: 70, E: 8, Ev: 6, seed: 61 });
    const options = { isCausal: true, causalOffset: Int32Array.of(61, -3), sinks: Float32Array.of(1, -Infinity, 0, 25) };
    const direct = attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    const viaWorker = await worker.sdpaBackward(p.query, p.key, p.value, p.gradOutput, options);
    for (const name of ['dQuery', 'dKey', 'dValue', 'dSinks']) {
      expect(viaWorker[name].dims).toEqual(direct[name].dims);
      expect(sameBits(viaWorker[name].data, direct[name].data)).toBe(true);
    }
    const into = new Float32Array(4).fill(1);
    const added = await worker.sdpaBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out: { dSinks: into }, accumulate: true });
    expect(added.dSinks.data).toBe(into);
    direct.dSinks.data.forEach((g, h) => expect(into[h]).toBe(Math.fround(1 + g)));
    const bad = { ...options, sinks: Float32Array.of(0, NaN, 0, 0) };
    let directError;
    try {
      attn.sdpaBackward(p.query, p.key, p.value, p.gradOutput, bad);
    } catch (e) {
      directError = e;
    }
    const workerError = await worker.sdpaBackward(p.query, p.key, p.value, p.gradOutput, bad).then(() => undefined, (e) => e);
    expect(workerError.constructor).toBe(RangeError);
    expect(workerError.message).toBe(directError.message);
  });
});
