// attn.sdpaVarlen() and attn.sdpaVarlenBackward(): packed variable-length sequences against the
// float64 reference (reference.mjs) of the whole packed problem as one batch ([1, T, H, D] in
// the 'bshd' layout) with a block-diagonal boolean mask [Tq, Tk]: row r of sequence s may attend
// key c only when c is one of s's keys and, with isCausal, within s's causal frontier (and
// window) in s's own positions. The oracle never cuts the problem into sequences. Sequence
// lengths at the kernel's tile edges (1, tile − 1, tile, tile + 1, 0, primes), GQA, Ev ≠ E,
// Lq ≠ Lk per sequence, causal offsets (default bottom-right, one for all, one per sequence),
// windows, softcap, sinks; each sequence bitwise equal to sdpa() on it alone; one and two
// threads bitwise; gradients, saved, out, accumulate; bad input; memory freed; the worker. The
// shared cases (tests/shared/varlen-cases.mjs) run here, through the worker and in Chromium.
import { createAttention, createAttentionWorker } from 'sdpa-wasm';
import {
  logSumExpError, maxRelError, randomTensor, referenceLogSumExp, referenceSdpa, referenceSdpaBackward,
} from './reference.mjs';
import {
  packedProblem, runVarlenCases, sequenceOffset, VARLEN_CASES, varlenErrorCases, varlenOracle, varlenSequenceReference,
} from '../shared/varlen-cases.mjs';

const TOL = 2e-5;           // the forward's, as for sdpa()
const GRAD_TOL = 1e-4;      // the backward's
const KEY_TILE = 512;       // kKeyTile (src/tiles.h)
const BACKWARD_TILE = 64;   // kBackwardKeyTile

let attn, attn2;
beforeAll(async () => {
  attn = await createAttention({ threads: 1 });
  attn2 = await createAttention({ threads: 2 });
});
afterAll(() => {
  attn.dispose();
  attn2.dispose();
});

const bitsOf = (a) => new Uint32Array(a.buffer, a.byteOffset, a.length);
const sameBits = (a, b) => {
  if (a.length !== b.length) return false;
  const x = bitsOf(a), y = bitsOf(b);
  return x.every((bits, i) => bits === y[i]);
};

/** Seeded packed tensors for sequences of `qLens` query rows and `kLens` keys (default qLens, Hq 2, Hkv 1, E 8). */
const packed = ({ seed = 1, ...shape }) => packedProblem(seed, shape);

function expectForwardMatches(p, extra = {}) {
  const options = { cuSeqlensQ: p.cuSeqlensQ, cuSeqlensK: p.cuSeqlensK, ...extra, returnLogSumExp: true };
  const got = attn.sdpaVarlen(p.query, p.key, p.value, options);
  expect(got.output.dims).toEqual([p.Tq, p.Hq, p.Ev]);
  expect(got.logSumExp.dims).toEqual([p.Hq, p.Tq]);
  const o = varlenOracle(p, options);
  const ref = referenceSdpa(o.query, o.key, o.value, o.options);
  expect(maxRelError(got.output.data, ref.output)).toBeLessThanOrEqual(TOL);
  expect(logSumExpError(got.logSumExp.data, referenceLogSumExp(o.query, o.key, o.value, o.options)))
    .toBeLessThanOrEqual(TOL);

  const two = attn2.sdpaVarlen(p.query, p.key, p.value, options);
  expect(sameBits(two.output.data, got.output.data)).toBe(true);
  expect(sameBits(two.logSumExp.data, got.logSumExp.data)).toBe(true);

  // Each sequence: the bits of sdpa() on it alone ([L, H, D] in the 'bshd' layout).
  const { cuSeqlensQ: _q, cuSeqlensK: _k, causalOffset, returnLogSumExp: _l, ...score } = options;
  for (let s = 0; s < p.qLens.length; s++) {
    const Lq = p.qLens[s], Lk = p.kLens[s];
    if (Lq === 0 || Lk === 0) continue;
    const rows = (t, from, n) => ({ data: t.data.subarray(from * t.dims[1] * t.dims[2], (from + n) * t.dims[1] * t.dims[2]),
      dims: [n, t.dims[1], t.dims[2]] });
    const alone = attn.sdpa(rows(p.query, p.cuSeqlensQ[s], Lq), rows(p.key, p.cuSeqlensK[s], Lk),
      rows(p.value, p.cuSeqlensK[s], Lk),
      { ...score, layout: 'bshd', ...(score.isCausal ? { causalOffset: sequenceOffset(p, causalOffset, s) } : {}) });
    const mine = got.output.data.subarray(p.cuSeqlensQ[s] * p.Hq * p.Ev, (p.cuSeqlensQ[s] + Lq) * p.Hq * p.Ev);
    expect(sameBits(alone.output.data, mine)).toBe(true);
  }
  return got;
}

describe('sdpaVarlen against the float64 reference of the block-diagonal problem', () => {
  test.each([
    ['tile edges', { qLens: [1, 3, KEY_TILE - 1, 0, KEY_TILE, 5, KEY_TILE + 1, 17] }],
    ['GQA, Ev != E, primes', { Hq: 4, Hkv: 2, E: 16, Ev: 24, qLens: [31, 1, 2, 97], seed: 2 }],
    ['Lq != Lk, sequences without rows or keys', { Hq: 3, Hkv: 1, E: 5, Ev: 7, qLens: [1, 7, 0, 4, 13],
      kLens: [29, 0, 3, KEY_TILE + 3, 13], seed: 3 }],
    ['one sequence', { Hq: 2, Hkv: 2, qLens: [37], seed: 4 }],
  ])('%s', (_, shape) => {
    const p = packed(shape);
    expectForwardMatches(p);
    expectForwardMatches(p, { scale: 0.3, softcap: 4 });
  });

  test('causal: bottom-right per sequence by default, one offset for all, one per sequence; windows', () => {
    const p = packed({ Hq: 4, Hkv: 2, qLens: [3, 1, 8, 2, 9], kLens: [10, 50, 8, 0, 9], seed: 5 });
    expectForwardMatches(p, { isCausal: true });
    expectForwardMatches(p, { isCausal: true, causalOffset: 0 });
    expectForwardMatches(p, { isCausal: true, causalOffset: Int32Array.of(7, 49, -2, 0, 100) });
    expectForwardMatches(p, { isCausal: true, slidingWindow: 4 });
    expectForwardMatches(p, { isCausal: true, causalOffset: 2, slidingWindow: 3, softcap: 5 });
  });

  test('bottom-right is sdpa()\'s offset Lk − Lq for each sequence, and where Lq = Lk the same as 0', () => {
    const p = packed({ Hq: 2, qLens: [5, 9, 1], seed: 6 });
    const byDefault = attn.sdpaVarlen(p.query, p.key, p.value, { cuSeqlensQ: p.cuSeqlensQ, isCausal: true });
    const topLeft = attn.sdpaVarlen(p.query, p.key, p.value, { cuSeqlensQ: p.cuSeqlensQ, isCausal: true, causalOffset: 0 });
    expect(sameBits(byDefault.output.data, topLeft.output.data)).toBe(true);
  });

  test('sinks, with rows that have no keys: zeros, and the sink as their log-sum-exp', () => {
    const sinks = Float32Array.of(-Infinity, 0, 2.5, 30);
    const p = packed({ Hq: 4, Hkv: 1, qLens: [6, 3, 21, 1], kLens: [6, 0, 0, 1], seed: 7 });
    const got = expectForwardMatches(p, { isCausal: true, sinks });
    for (let r = p.cuSeqlensQ[1]; r < p.cuSeqlensQ[3]; r++) {
      for (let h = 0; h < p.Hq; h++) {
        expect(Array.from(got.output.data.subarray((r * p.Hq + h) * p.Ev, (r * p.Hq + h + 1) * p.Ev))).toEqual(new Array(p.Ev).fill(0));
        expect(got.logSumExp.data[h * p.Tq + r]).toBe(sinks[h]);
      }
    }
  });

  test('long sequences beside short ones (split over the threads by the kernel), GQA', () => {
    expectForwardMatches(packed({ Hq: 4, Hkv: 2, E: 16, qLens: [3, 700, 1, 650, 2], seed: 8 }), { isCausal: true });
  });

  test('a large batch on one thread runs in chunks of sequences (js/varlen.ts): the bits of the whole copy and of sdpa() per sequence', () => {
    // 2.3 MB of Q, K, V: chunked on one thread. Two sequences longer than a chunk alone, empty
    // ones (a chunk may end with them), one with rows but no keys, one with keys but no rows.
    const short = Array.from({ length: 40 }, (_, s) => 7 + ((s * 13) % 23));
    const qLens = [600, 0, 5, ...short, 900, 0, 0], kLens = [600, 3, 0, ...short, 900, 0, 0];
    const p = packed({ Hq: 4, Hkv: 2, E: 32, qLens, kLens, seed: 40 });
    const options = { cuSeqlensQ: p.cuSeqlensQ, cuSeqlensK: p.cuSeqlensK, isCausal: true, returnLogSumExp: true,
      sinks: Float32Array.of(0, -Infinity, 1, 2) };
    const one = attn.sdpaVarlen(p.query, p.key, p.value, options);
    const two = attn2.sdpaVarlen(p.query, p.key, p.value, options);
    expect(sameBits(one.output.data, two.output.data)).toBe(true);
    expect(sameBits(one.logSumExp.data, two.logSumExp.data)).toBe(true);
    const out = new Float32Array(p.Tq * p.Hq * p.Ev + 3).fill(NaN);
    const into = attn.sdpaVarlen(p.query, p.key, p.value, { ...options, out });
    expect(into.output.data.buffer).toBe(out.buffer);
    expect(sameBits(into.output.data, two.output.data)).toBe(true);
    expect(out.subarray(p.Tq * p.Hq * p.Ev).every(Number.isNaN)).toBe(true);
    for (const s of [0, 2, 10, 43]) {
      const rows = (t, from, n) => ({ data: t.data.subarray(from * t.dims[1] * t.dims[2], (from + n) * t.dims[1] * t.dims[2]),
        dims: [n, t.dims[1], t.dims[2]] });
      const at = p.cuSeqlensQ[s] * p.Hq * p.Ev, n = p.qLens[s] * p.Hq * p.Ev;
      if (p.kLens[s] === 0) {  // rows with nothing to attend: zeros, the sink as lse
        expect(Array.from(one.output.data.subarray(at, at + n)).every((x) => Object.is(x, 0))).toBe(true);
        expect(one.logSumExp.data[2 * p.Tq + p.cuSeqlensQ[s]]).toBe(1);
        continue;
      }
      const alone = attn.sdpa(rows(p.query, p.cuSeqlensQ[s], p.qLens[s]), rows(p.key, p.cuSeqlensK[s], p.kLens[s]),
        rows(p.value, p.cuSeqlensK[s], p.kLens[s]), { layout: 'bshd', isCausal: true, sinks: options.sinks });
      expect(sameBits(alone.output.data, one.output.data.subarray(at, at + n))).toBe(true);
    }
  });

  test('NaN in keys a row may not attend (causal, another sequence) never reaches it', () => {
    const p = packed({ Hq: 2, Hkv: 1, qLens: [4, 3], kLens: [5, 2], seed: 9 });
    p.key.data.fill(NaN, 4 * p.E, 5 * p.E);    // sequence 0's key 4: beyond every row's frontier at offset 0
    p.value.data.fill(NaN, 4 * p.Ev, 5 * p.Ev);
    const { output } = attn.sdpaVarlen(p.query, p.key, p.value,
      { cuSeqlensQ: p.cuSeqlensQ, cuSeqlensK: p.cuSeqlensK, isCausal: true, causalOffset: 0 });
    expect(output.data.some(Number.isNaN)).toBe(false);
  });

  test('out: written into the caller\'s array', () => {
    const p = packed({ qLens: [3, 4], seed: 10 });
    const out = new Float32Array(p.Tq * p.Hq * p.Ev + 5).fill(7);
    const got = attn.sdpaVarlen(p.query, p.key, p.value, { cuSeqlensQ: p.cuSeqlensQ, out });
    const fresh = attn.sdpaVarlen(p.query, p.key, p.value, { cuSeqlensQ: p.cuSeqlensQ });
    expect(got.output.data.buffer).toBe(out.buffer);
    expect(sameBits(got.output.data, fresh.output.data)).toBe(true);
    expect(Array.from(out.subarray(p.Tq * p.Hq * p.Ev))).toEqual([7, 7, 7, 7, 7]);
  });
});

describe('sdpaVarlenBackward against the float64 reference', () => {
  function expectGradientsMatch(p, extra = {}) {
    const options = { cuSeqlensQ: p.cuSeqlensQ, cuSeqlensK: p.cuSeqlensK, ...extra };
    const got = attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options);
    const o = varlenOracle(p, options);
    const ref = referenceSdpaBackward(o.query, o.key, o.value, o.gradOutput, o.options);
    expect(got.dQuery.dims).toEqual(p.query.dims);
    expect(got.dKey.dims).toEqual(p.key.dims);
    expect(got.dValue.dims).toEqual(p.value.dims);
    expect(maxRelError(got.dQuery.data, ref.dQuery)).toBeLessThanOrEqual(GRAD_TOL);
    expect(maxRelError(got.dKey.data, ref.dKey)).toBeLessThanOrEqual(GRAD_TOL);
    expect(maxRelError(got.dValue.data, ref.dValue)).toBeLessThanOrEqual(GRAD_TOL);
    if (extra.sinks) expect(maxRelError(got.dSinks.data, ref.dSinks)).toBeLessThanOrEqual(GRAD_TOL);
    else expect(got.dSinks).toBeUndefined();

    const two = attn2.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options);
    for (const name of ['dQuery', 'dKey', 'dValue', ...(extra.sinks ? ['dSinks'] : [])]) {
      expect(sameBits(two[name].data, got[name].data)).toBe(true);
    }
    // With saved (sdpaVarlen's output and logSumExp): the same bits as recomputing the forward.
    const forward = attn.sdpaVarlen(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    const saved = attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, { ...options, saved: forward });
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(saved[name].data, got[name].data)).toBe(true);
    return got;
  }

  test.each([
    ['tile edges', { qLens: [1, 3, BACKWARD_TILE - 1, 0, BACKWARD_TILE, 5, BACKWARD_TILE + 1, 17] }, {}],
    ['GQA, Ev != E, causal', { Hq: 4, Hkv: 2, E: 16, Ev: 24, qLens: [31, 1, 2, 97], seed: 2 }, { isCausal: true }],
    ['Lq != Lk, empty sequences, window, softcap, sinks', { Hq: 3, Hkv: 1, E: 5, Ev: 7, qLens: [1, 7, 0, 4, 13],
      kLens: [29, 0, 3, 70, 13], seed: 3 }, { isCausal: true, slidingWindow: 9, softcap: 4,
      sinks: Float32Array.of(-Infinity, 0, 2.5) }],
    ['long beside short', { Hq: 4, Hkv: 2, E: 16, qLens: [3, 700, 1, 650], seed: 4 }, { isCausal: true,
      sinks: Float32Array.of(1, -1, 0, 30) }],
  ])('%s', (_, shape, options) => {
    expectGradientsMatch(packed(shape), options);
  });

  test('keys of a sequence without rows, and rows of one without keys, get zero gradients', () => {
    const p = packed({ Hq: 2, qLens: [0, 3, 2], kLens: [4, 0, 2], seed: 11 });
    const got = expectGradientsMatch(p);
    expect(Array.from(got.dKey.data.subarray(0, 4 * p.Hkv * p.E)).every((x) => Object.is(x, 0))).toBe(true);
    expect(Array.from(got.dQuery.data.subarray(0, 3 * p.Hq * p.E)).every((x) => Object.is(x, 0))).toBe(true);
  });

  test('out and accumulate', () => {
    const p = packed({ Hq: 2, qLens: [3, 5], seed: 12 });
    const options = { cuSeqlensQ: p.cuSeqlensQ, sinks: Float32Array.of(0.5, -1) };
    const fresh = attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options);
    const dKey = new Float32Array(p.key.data.length).fill(1), dSinks = new Float32Array(2).fill(1);
    const got = attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput,
      { ...options, out: { dKey, dSinks }, accumulate: true });
    expect(got.dKey.data).toBe(dKey);
    expect(Array.from(dKey)).toEqual(Array.from(fresh.dKey.data, (x) => Math.fround(x + 1)));
    expect(Array.from(dSinks)).toEqual(Array.from(fresh.dSinks.data, (x) => Math.fround(x + 1)));
  });

  test('saved from another call is refused, naming the difference', () => {
    const p = packed({ Hq: 2, qLens: [3, 5], seed: 13 });
    const forward = attn.sdpaVarlen(p.query, p.key, p.value, { cuSeqlensQ: p.cuSeqlensQ, returnLogSumExp: true });
    expect(() => attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput,
      { cuSeqlensQ: Int32Array.of(0, 4, 8), saved: forward }))
      .toThrow(/sdpaVarlenBackward: options\.saved is not this call's forward: cuSeqlensQ holds other values than in the sdpaVarlen\(\) call/);
    expect(() => attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput,
      { cuSeqlensQ: p.cuSeqlensQ, isCausal: true, saved: forward }))
      .toThrow(/isCausal differs from the sdpaVarlen\(\) call that returned options\.saved: false there, true here/);
    // sdpa()'s saved is not sdpaVarlen's, nor the other way round.
    const asBatch = { ...p.query, dims: [1, p.Tq, 2, p.E] };
    const dense = attn.sdpa(asBatch, { ...p.key, dims: [1, p.Tk, 1, p.E] }, { ...p.value, dims: [1, p.Tk, 1, p.Ev] },
      { layout: 'bshd', returnLogSumExp: true });
    expect(() => attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput,
      { cuSeqlensQ: Int32Array.of(0, p.Tq), saved: { output: { ...dense.output, dims: [p.Tq, 2, p.Ev] }, logSumExp: { ...dense.logSumExp, dims: [2, p.Tq] } } }))
      .toThrow(/the forward call differs from the sdpa\(\) call that returned options\.saved: sdpa\(\) there, sdpaVarlen\(\) here/);
  });
});

describe('attention dropout: sequence s draws the mask of batch s in its own positions (i, j)', () => {
  const rows = (t, from, n) => ({ data: t.data.subarray(from * t.dims[1] * t.dims[2], (from + n) * t.dims[1] * t.dims[2]),
    dims: [n, t.dims[1], t.dims[2]] });

  /** Forward with dropout against the per-sequence reference; lse the bits of no dropout; 2 threads bitwise; sdpa() as batch s. */
  function expectDropoutForward(p, extra) {
    const options = { cuSeqlensQ: p.cuSeqlensQ, cuSeqlensK: p.cuSeqlensK, ...extra, returnLogSumExp: true };
    const got = attn.sdpaVarlen(p.query, p.key, p.value, options);
    const ref = varlenSequenceReference(p, options);
    expect(maxRelError(got.output.data, ref.output)).toBeLessThanOrEqual(TOL);
    expect(logSumExpError(got.logSumExp.data, ref.logSumExp)).toBeLessThanOrEqual(TOL);
    const { dropoutP: _p, dropoutSeed: _s, ...none } = options;
    expect(sameBits(attn.sdpaVarlen(p.query, p.key, p.value, none).logSumExp.data, got.logSumExp.data)).toBe(true);
    const two = attn2.sdpaVarlen(p.query, p.key, p.value, options);
    expect(sameBits(two.output.data, got.output.data)).toBe(true);
    expect(sameBits(two.logSumExp.data, got.logSumExp.data)).toBe(true);
    // Sequence s: the bits of batch s of sdpa() on s + 1 copies of it (its dropout mask is batch s's).
    const { cuSeqlensQ: _q, cuSeqlensK: _k, causalOffset, returnLogSumExp: _l, alibiSlopes, ...score } = options;
    for (let s = 0; s < Math.min(p.qLens.length, 4); s++) {
      const Lq = p.qLens[s], Lk = p.kLens[s];
      if (Lq === 0 || Lk === 0) continue;
      const copies = (t, from, n) => {
        const one = rows(t, from, n).data;
        const data = new Float32Array(one.length * (s + 1));
        for (let b = 0; b <= s; b++) data.set(one, b * one.length);
        return { data, dims: [s + 1, n, t.dims[1], t.dims[2]] };
      };
      const offset = sequenceOffset(p, causalOffset, s);
      const slopes = alibiSlopes === undefined ? {}
        : { alibiSlopes: alibiSlopes.length === p.Hq ? alibiSlopes : alibiSlopes.subarray(s * p.Hq, (s + 1) * p.Hq) };
      const batched = attn.sdpa(copies(p.query, p.cuSeqlensQ[s], Lq), copies(p.key, p.cuSeqlensK[s], Lk), copies(p.value, p.cuSeqlensK[s], Lk),
        { ...score, ...slopes, layout: 'bshd', ...(score.isCausal || alibiSlopes ? { causalOffset: offset } : {}) });
      const n = Lq * p.Hq * p.Ev;
      const mine = got.output.data.subarray(p.cuSeqlensQ[s] * p.Hq * p.Ev, p.cuSeqlensQ[s] * p.Hq * p.Ev + n);
      expect(sameBits(batched.output.data.subarray(s * n, (s + 1) * n), mine)).toBe(true);
    }
    return got;
  }

  /** Backward with dropout against the per-sequence reference; 2 threads and saved bitwise. */
  function expectDropoutGradients(p, extra) {
    const options = { cuSeqlensQ: p.cuSeqlensQ, cuSeqlensK: p.cuSeqlensK, ...extra };
    const got = attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options);
    const ref = varlenSequenceReference(p, options, { gradients: true });
    for (const name of ['dQuery', 'dKey', 'dValue', ...(extra.sinks ? ['dSinks'] : [])]) {
      expect([name, maxRelError(got[name].data, ref[name]) <= GRAD_TOL]).toEqual([name, true]);
    }
    const two = attn2.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options);
    const forward = attn2.sdpaVarlen(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    const saved = attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, { ...options, saved: forward });
    for (const name of Object.keys(got)) {
      expect(sameBits(two[name].data, got[name].data)).toBe(true);
      expect(sameBits(saved[name].data, got[name].data)).toBe(true);
    }
    return got;
  }

  const sinks = Float32Array.of(-Infinity, 0, 2.5, 30);
  test.each([
    ['tile edges', { qLens: [1, 3, KEY_TILE - 1, 0, KEY_TILE, 5, KEY_TILE + 1, 17] }, { dropoutP: 0.3, dropoutSeed: 1 }],
    ['GQA, Ev != E, causal, primes', { Hq: 4, Hkv: 2, E: 16, Ev: 24, qLens: [31, 1, 2, 97], seed: 2 }, { dropoutP: 0.5, dropoutSeed: 2 ** 32 - 1, isCausal: true }],
    ['Lq != Lk, sequences without rows or keys, offsets per sequence, a window, sinks', { Hq: 4, Hkv: 1, E: 5, Ev: 7, qLens: [1, 7, 0, 4, 13],
      kLens: [29, 0, 3, KEY_TILE + 3, 13], seed: 3 }, { dropoutP: 0.2, dropoutSeed: 3, isCausal: true, causalOffset: Int32Array.of(28, 0, 0, 600, -2),
      slidingWindow: 9, sinks, softcap: 4 }],
    ['ALiBi [S, Hq] not causal, scale', { Hq: 2, Hkv: 1, qLens: [5, 9, 1, 40], kLens: [7, 9, 60, 40], seed: 4 },
      { dropoutP: 0.9, dropoutSeed: 4, alibiSlopes: Float32Array.of(0.5, 0, 0.25, 0.125, 0.01, 1, 0.1, 0.2), scale: 0.4 }],
  ])('sdpaVarlen, %s: the per-sequence reference, lse of no dropout, 2 threads, sequence s as sdpa()\'s batch s', (_, shape, options) => {
    const got = expectDropoutForward(packed(shape), options);
    expect(got.output.data.every(Number.isFinite)).toBe(true);
  });

  test.each([
    ['tile edges', { qLens: [1, 3, BACKWARD_TILE - 1, 0, BACKWARD_TILE, 5, BACKWARD_TILE + 1, 17] }, { dropoutP: 0.3, dropoutSeed: 5 }],
    ['GQA, Ev != E, causal', { Hq: 4, Hkv: 2, E: 16, Ev: 24, qLens: [31, 1, 2, 97], seed: 2 }, { dropoutP: 0.6, dropoutSeed: 2 ** 31, isCausal: true }],
    ['Lq != Lk, empty sequences, window, softcap, sinks, ALiBi', { Hq: 4, Hkv: 1, E: 5, Ev: 7, qLens: [1, 7, 0, 4, 13],
      kLens: [29, 0, 3, 70, 13], seed: 3 }, { dropoutP: 0.25, dropoutSeed: 6, isCausal: true, slidingWindow: 9, softcap: 4, sinks,
      alibiSlopes: Float32Array.of(0.5, 0.25, 0, 0.125) }],
    ['long beside short', { Hq: 4, Hkv: 2, E: 16, qLens: [3, 700, 1, 650], seed: 4 }, { dropoutP: 0.1, dropoutSeed: 7, isCausal: true, sinks }],
  ])('sdpaVarlenBackward, %s: the per-sequence reference; 2 threads and saved bitwise', (_, shape, options) => {
    expectDropoutGradients(packed(shape), options);
  });

  test('a large batch on one thread runs in chunks of sequences (each chunk placed in the batches by its first sequence): the bits of the whole copy on two threads, the per-sequence reference', () => {
    const short = Array.from({ length: 40 }, (_, s) => 7 + ((s * 13) % 23));
    const qLens = [600, 0, 5, ...short, 900, 0, 0], kLens = [600, 3, 0, ...short, 900, 0, 0];
    const p = packed({ Hq: 4, Hkv: 2, E: 32, qLens, kLens, seed: 41 });
    // js/varlen.ts: chunked from 2 MiB of Q, K, V on one thread, chunks of at most 1 MiB (the
    // 900-row sequence, 1.4 MB, is one alone): several chunks, most starting past sequence 0.
    expect(p.query.data.byteLength + p.key.data.byteLength + p.value.data.byteLength).toBeGreaterThanOrEqual(2 * 2 ** 20);
    const options = { cuSeqlensQ: p.cuSeqlensQ, cuSeqlensK: p.cuSeqlensK, isCausal: true, returnLogSumExp: true,
      sinks: Float32Array.of(0, -Infinity, 1, 2), dropoutP: 0.4, dropoutSeed: 77 };
    const one = attn.sdpaVarlen(p.query, p.key, p.value, options);
    const two = attn2.sdpaVarlen(p.query, p.key, p.value, options);
    expect(sameBits(one.output.data, two.output.data)).toBe(true);
    expect(sameBits(one.logSumExp.data, two.logSumExp.data)).toBe(true);
    const { dropoutP: _p, dropoutSeed: _s, ...none } = options;
    expect(sameBits(attn.sdpaVarlen(p.query, p.key, p.value, none).logSumExp.data, one.logSumExp.data)).toBe(true);
    // Against the reference, sequence by sequence (the 900-row one too: the last chunk's).
    const picked = [0, 2, 3, 10, 21, 42, 43, 44];
    const sub = { ...p, qLens: p.qLens.map((n, s) => (picked.includes(s) ? n : 0)) };
    const ref = varlenSequenceReference(sub, options);
    for (const s of picked) {
      const at = p.cuSeqlensQ[s] * p.Hq * p.Ev, n = p.qLens[s] * p.Hq * p.Ev;
      expect([s, maxRelError(one.output.data.subarray(at, at + n), ref.output.subarray(at, at + n)) <= TOL]).toEqual([s, true]);
    }
    // Into `out` (chunked too): the same bits.
    const out = new Float32Array(p.Tq * p.Hq * p.Ev);
    attn.sdpaVarlen(p.query, p.key, p.value, { ...options, out });
    expect(sameBits(out, one.output.data)).toBe(true);
  });

  test('a large backward on one thread runs in chunks of sequences: the bits of the whole copy on two threads (dSinks too), with saved or not, into out and accumulated; the per-sequence reference; in chunks on two threads too within a memory limit the whole copy exceeds', async () => {
    const short = Array.from({ length: 40 }, (_, s) => 7 + ((s * 13) % 23));
    const qLens = [600, 0, 5, ...short, 900, 0, 0], kLens = [600, 3, 0, ...short, 900, 0, 0];
    const p = packed({ Hq: 4, Hkv: 2, E: 32, qLens, kLens, seed: 43 });
    // js/varlen.ts: chunked from 2 MiB of Q, K, V and dO on one thread, chunks of at most 1 MiB
    // of the blocks copied per chunk (Q, dQ, O, dO rows; K, V, dK, dV rows): the 600- and the
    // 900-row sequences alone, the short ones several to a chunk.
    const inputBytes = p.query.data.byteLength + p.key.data.byteLength + p.value.data.byteLength + p.gradOutput.data.byteLength;
    expect(inputBytes).toBeGreaterThanOrEqual(2 * 2 ** 20);
    const S = qLens.length;
    const options = { cuSeqlensQ: p.cuSeqlensQ, cuSeqlensK: p.cuSeqlensK, isCausal: true,
      causalOffset: Int32Array.from(qLens, (n, s) => (s % 3 === 0 ? kLens[s] - n : 2 - s % 5)),
      sinks: Float32Array.of(0, -Infinity, 1, 2), dropoutP: 0.3, dropoutSeed: 78,
      alibiSlopes: Float32Array.from({ length: S * p.Hq }, (_, n) => (n % 5) / 8) };
    const one = attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options);
    const two = attn2.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options);
    const names = ['dQuery', 'dKey', 'dValue', 'dSinks'];
    for (const name of names) expect([name, sameBits(one[name].data, two[name].data)]).toEqual([name, true]);
    // With saved (the two-thread forward's): the same bits.
    const forward = attn2.sdpaVarlen(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    const saved = attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, { ...options, saved: forward });
    for (const name of names) expect([name, sameBits(saved[name].data, two[name].data)]).toEqual([name, true]);
    // Against the reference, sequence by sequence (the long ones, each a chunk of its own, too).
    const picked = [0, 2, 3, 10, 21, 42, 43, 44];
    const sub = { ...p, qLens: p.qLens.map((n, s) => (picked.includes(s) ? n : 0)),
      kLens: p.kLens.map((n, s) => (picked.includes(s) ? n : 0)) };
    const ref = varlenSequenceReference(sub, options, { gradients: true });
    for (const s of picked) {
      const rowsOf = (data, starts, lens, width) => data.subarray(starts[s] * width, (starts[s] + lens[s]) * width);
      const q = p.Hq * p.E, k = p.Hkv * p.E, v = p.Hkv * p.Ev;
      for (const [name, starts, lens, width] of [['dQuery', p.cuSeqlensQ, p.qLens, q], ['dKey', p.cuSeqlensK, p.kLens, k],
        ['dValue', p.cuSeqlensK, p.kLens, v]]) {
        const error = maxRelError(rowsOf(one[name].data, starts, lens, width), rowsOf(ref[name], starts, lens, width));
        expect([s, name, error <= GRAD_TOL]).toEqual([s, name, true]);
      }
    }
    // Into out, and added to it: every gradient's bits (out given for some, new arrays for the others).
    const dQuery = new Float32Array(p.query.data.length).fill(NaN), dSinks = new Float32Array(p.Hq).fill(1);
    const into = attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out: { dQuery } });
    expect(into.dQuery.data).toBe(dQuery);
    expect(sameBits(dQuery, two.dQuery.data)).toBe(true);
    attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, { ...options, out: { dSinks }, accumulate: true });
    expect(Array.from(dSinks)).toEqual(Array.from(two.dSinks.data, (x) => Math.fround(x + 1)));
    expect(attn.memory().bytesInUse).toBe(0);
    // A limit the whole copy exceeds and the chunks fit: on two threads, the call then runs in
    // chunks too (js/varlen.ts, CallMemory.fits), the forward and the backward, the same bits.
    const limit = 4 * 2 ** 20;
    expect(attn2.memory().peakBytes).toBeGreaterThan(limit);  // the whole copies above
    const [small1, small2] = await Promise.all([1, 2].map((threads) => createAttention({ threads, maxMemoryBytes: limit })));
    try {
      for (const small of [small1, small2]) {
        const fits = small.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options);
        for (const name of names) expect([small.threads, name, sameBits(fits[name].data, two[name].data)]).toEqual([small.threads, name, true]);
        const forwardFits = small.sdpaVarlen(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
        expect(sameBits(forwardFits.output.data, forward.output.data)).toBe(true);
        expect(sameBits(forwardFits.logSumExp.data, forward.logSumExp.data)).toBe(true);
        // out sharing the query's memory: the chunks' rows go to an array of their own, copied
        // into out at the end (later chunks still read the query).
        const query = { data: p.query.data.slice(), dims: p.query.dims };
        const aliased = small.sdpaVarlen(query, p.key, p.value, { ...options, out: query.data });
        expect(aliased.output.data).toBe(query.data);
        expect(sameBits(query.data, forward.output.data)).toBe(true);
        expect(small.memory().bytesInUse).toBe(0);
        expect(small.memory().peakBytes).toBeLessThanOrEqual(limit);
      }
      // A limit below even one chunk's blocks: refused, naming them; nothing held afterwards.
      const tiny = await createAttention({ threads: 2, maxMemoryBytes: 2 ** 16 });
      try {
        expect(() => tiny.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options))
          .toThrow(/^sdpaVarlenBackward: needs \d+ bytes of wasm memory to run a chunk of sequences at a time \(cuSeqlensQ \d+ bytes .*dSinksBySequence \d+ bytes .*\), more than is left of this instance's limit of 65536 bytes/);
        expect(tiny.memory().bytesInUse).toBe(0);
      } finally {
        tiny.dispose();
      }
    } finally {
      small1.dispose();
      small2.dispose();
    }
  });

  test('under a limit that 1 MiB chunks pass, chunks get smaller (halves, down to a sequence each): the bits of the whole copy, forward and backward, one and two threads', async () => {
    // 256 short sequences (4 to 48 tokens), 3.3 MB of Q, K, V and dO: 1 MiB chunks alone pass both
    // limits below, so the chunks are halved until they fit.
    const lens = Array.from({ length: 256 }, (_, s) => 4 + ((s * 37) % 45));
    const T = lens.reduce((x, y) => x + y, 0), Hq = 8, Hkv = 4, E = 32;
    const starts = Int32Array.from({ length: 257 }, (_, s) => lens.slice(0, s).reduce((x, y) => x + y, 0));
    const p = { query: randomTensor([T, Hq, E], 47), key: randomTensor([T, Hkv, E], 48), value: randomTensor([T, Hkv, E], 49),
      gradOutput: randomTensor([T, Hq, E], 50) };
    const options = { cuSeqlensQ: starts, cuSeqlensK: starts, isCausal: true, sinks: Float32Array.from({ length: Hq }, (_, h) => h / 4) };
    const forward = attn2.sdpaVarlen(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    const backward = attn2.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options);
    // 624 KiB: the least (a 48-token sequence's chunk) needs 575 KiB on two threads, 64 KiB of
    // it the backward's dK/dV block sums and their compensation ([64][E + Ev] twice a thread).
    for (const limit of [900 * 1024, 624 * 1024]) {
      for (const threads of [1, 2]) {
        const small = await createAttention({ threads, maxMemoryBytes: limit });
        try {
          const got = small.sdpaVarlen(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
          expect(sameBits(got.output.data, forward.output.data)).toBe(true);
          expect(sameBits(got.logSumExp.data, forward.logSumExp.data)).toBe(true);
          const grads = small.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options);
          for (const name of ['dQuery', 'dKey', 'dValue', 'dSinks']) {
            expect([limit, threads, name, sameBits(grads[name].data, backward[name].data)]).toEqual([limit, threads, name, true]);
          }
          expect(small.memory().peakBytes).toBeLessThanOrEqual(limit);
          expect(small.memory().bytesInUse).toBe(0);
        } finally {
          small.dispose();
        }
      }
    }
  });

  test('saved from a forward with another seed, another p or no dropout: a RangeError naming dropout', () => {
    const p = packed({ Hq: 2, qLens: [3, 5], seed: 42 });
    const options = { cuSeqlensQ: p.cuSeqlensQ, dropoutP: 0.5, dropoutSeed: 1 };
    const forward = attn.sdpaVarlen(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    for (const [other, pattern] of [
      [{ ...options, dropoutSeed: 2 }, /dropoutSeed 1 there, dropoutP 2147483648\/2\^32 \(round\(dropoutP·2\^32\)\), dropoutSeed 2 here/],
      [{ ...options, dropoutP: 0.25 }, /dropoutP 2147483648\/2\^32 .*dropoutSeed 1 there, dropoutP 1073741824\/2\^32 .*dropoutSeed 1 here/],
      [{ cuSeqlensQ: p.cuSeqlensQ }, /dropoutSeed 1 there, none here/],
    ]) {
      let error;
      try {
        attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, { ...other, saved: forward });
      } catch (e) {
        error = e;
      }
      expect(error?.constructor).toBe(RangeError);
      expect(error.message).toMatch(/^sdpaVarlenBackward: options\.saved is not this call's forward: dropout differs from the sdpaVarlen\(\) call that returned options\.saved: /);
      expect(error.message).toMatch(pattern);
    }
    expect(attn.memory().bytesInUse).toBe(0);
    const right = attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, { ...options, saved: forward });
    const recomputed = attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options);
    for (const name of ['dQuery', 'dKey', 'dValue']) expect(sameBits(right[name].data, recomputed[name].data)).toBe(true);
  });
});

// The direct API for test.each, which builds its cases before beforeAll has run.
const attn0 = () => ({
  sdpaVarlen: (...args) => attn.sdpaVarlen(...args),
  sdpaVarlenBackward: (...args) => attn.sdpaVarlenBackward(...args),
});

describe('sdpaVarlen: bad input is a TypeError or RangeError naming the argument; the instance keeps working', () => {
  const p = packed({ Hq: 2, Hkv: 1, qLens: [3, 4], kLens: [2, 5], seed: 20 });
  const ok = { cuSeqlensQ: p.cuSeqlensQ, cuSeqlensK: p.cuSeqlensK };
  test.each(varlenErrorCases(attn0()))('%s', (_, call, Kind, message) => {
    expect(call).toThrow(Kind);
    expect(call).toThrow(message);
  });

  test('an option\'s array detached by a later option\'s getter: said so, not blamed on its length', () => {
    const detach = (array) => structuredClone(array.buffer, { transfer: [array.buffer] });
    const cuSeqlensQ = p.cuSeqlensQ.slice();
    const options = { cuSeqlensQ, get cuSeqlensK() { detach(cuSeqlensQ); return p.cuSeqlensK; } };
    expect(() => attn.sdpaVarlen(p.query, p.key, p.value, options))
      .toThrow(/sdpaVarlen: options\.cuSeqlensQ has no elements: its ArrayBuffer is detached .*; it must hold where each sequence's query rows start \(0, …, Tq = 7\)/);
    const causalOffset = Int32Array.of(0, 1);
    const offsets = { ...ok, isCausal: true, causalOffset, get sinks() { detach(causalOffset); return undefined; } };
    expect(() => attn.sdpaVarlen(p.query, p.key, p.value, offsets))
      .toThrow(/options\.causalOffset has no elements: its ArrayBuffer is detached .*; it must hold one offset per sequence \(S = 2\)/);
  });

  test('the saved messages name sdpaVarlen', () => {
    expect(() => attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, { ...ok, saved: 5 }))
      .toThrow(/sdpaVarlenBackward: options\.saved must be \{ output, logSumExp \} from sdpaVarlen\(\.\.\., \{ returnLogSumExp: true \}\), got 5/);
    const withoutLse = attn.sdpaVarlen(p.query, p.key, p.value, ok);
    expect(() => attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, { ...ok, saved: withoutLse }))
      .toThrow(/options\.saved\.logSumExp must be a tensor \{ data: Float32Array, dims \} \(the logSumExp of sdpaVarlen\(\.\.\., \{ returnLogSumExp: true \}\)\), got undefined/);
  });

  test('the backward\'s own errors', () => {
    expect(() => attn.sdpaVarlenBackward(p.query, p.key, p.value, randomTensor([7, 2, 9], 1), ok))
      .toThrow(/sdpaVarlenBackward: gradOutput\.dims must equal the output's dims \[7, 2, 8\], got \[7, 2, 9\]/);
    expect(() => attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, { ...ok, returnLogSumExp: true }))
      .toThrow(/unknown option "returnLogSumExp" \(an option of sdpaVarlen only\)/);
    expect(() => attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, { ...ok, accumulate: true }))
      .toThrow(/options\.accumulate adds the gradients into options\.out's arrays; it needs options\.out/);
  });

  test('nothing is left allocated, after calls that worked and calls that threw', () => {
    const before = attn.memory();
    for (let n = 0; n < 200; n++) {
      attn.sdpaVarlen(p.query, p.key, p.value, { ...ok, isCausal: true, returnLogSumExp: n % 2 === 0 });
      attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, ok);
      expect(() => attn.sdpaVarlen(p.query, p.key, p.value, { ...ok, cuSeqlensK: Int32Array.of(0, 1, 6) })).toThrow(RangeError);
    }
    const after = attn.memory();
    expect(after.bytesInUse).toBe(0);
    expect(after.moduleBytesInUse).toBe(before.moduleBytesInUse);
  });

  test('a call whose smallest chunk (one sequence) is beyond maxMemoryBytes is refused (every block of that chunk named, starts and scratch included) before anything is allocated, and the instance keeps working', async () => {
    const big = packed({ Hq: 2, Hkv: 1, qLens: Array(100).fill(3), seed: 21 });
    for (const limit of [500, 4096]) {
      const small = await createAttention({ threads: 1, maxMemoryBytes: limit });
      try {
        for (const call of [
          () => small.sdpaVarlen(big.query, big.key, big.value, { cuSeqlensQ: big.cuSeqlensQ }),
          () => small.sdpaVarlenBackward(big.query, big.key, big.value, big.gradOutput, { cuSeqlensQ: big.cuSeqlensQ }),
        ]) {
          expect(call).toThrow(RangeError);
          expect(call).toThrow(new RegExp('^sdpaVarlen(Backward)?: needs \\d+ bytes of wasm memory to run a chunk of sequences at a time ' +
            `\\(cuSeqlensQ 8 bytes \\+ cuSeqlensK 8 bytes \\+ query 192 bytes .*scratch \\d+ bytes\\), ` +
            `more than is left of this instance's limit of ${limit} bytes \\(maxMemoryBytes\\), of which 0 are in use$`));
        }
        expect(small.memory().bytesInUse).toBe(0);
        expect(small.memory().peakBytes).toBe(0);  // nothing was allocated in the instance's account
      } finally {
        small.dispose();
      }
    }
    expect(attn.sdpaVarlen(p.query, p.key, p.value, ok).output.dims).toEqual([7, 2, 8]);
  });
});

describe('through createAttentionWorker: bitwise the direct call, with the same errors', () => {
  let worker;
  beforeAll(async () => {
    worker = await createAttentionWorker({ threads: 1 });
  });
  afterAll(() => worker.dispose());

  test('forward and backward, saved carried across, moved with transfer', async () => {
    const p = packed({ Hq: 4, Hkv: 2, qLens: [3, 0, 40, 1], kLens: [5, 2, 40, 0], seed: 30 });
    const options = { cuSeqlensQ: p.cuSeqlensQ, cuSeqlensK: p.cuSeqlensK, isCausal: true, sinks: Float32Array.of(0, 1, -Infinity, 2) };
    const direct = attn.sdpaVarlen(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    const viaWorker = await worker.sdpaVarlen(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    expect(sameBits(viaWorker.output.data, direct.output.data)).toBe(true);
    expect(sameBits(viaWorker.logSumExp.data, direct.logSumExp.data)).toBe(true);
    const grads = attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options);
    const workerGrads = await worker.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, { ...options, saved: viaWorker });
    for (const name of ['dQuery', 'dKey', 'dValue', 'dSinks']) expect(sameBits(workerGrads[name].data, grads[name].data)).toBe(true);
    // The worker's saved is checked against the call that returned it, as the direct API's.
    await expect(worker.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, { ...options, isCausal: false, saved: viaWorker }))
      .rejects.toThrow(/sdpaVarlenBackward: options\.saved is not this call's forward: isCausal differs/);
    const copies = [p.query, p.key, p.value].map((t) => ({ data: t.data.slice(), dims: t.dims }));
    const moved = await worker.sdpaVarlen(...copies, { ...options, transfer: true });
    expect(copies[0].data.length).toBe(0);
    expect(sameBits(moved.output.data, direct.output.data)).toBe(true);
  });

  test('the shared cases: within the tolerances, bitwise the direct call', async () => {
    const direct = await runVarlenCases(attn);
    const viaWorker = await runVarlenCases(worker);
    expect(direct).toHaveLength(VARLEN_CASES.length);
    expect(direct.filter((c) => !c.ok).map((c) => `${c.name}: ${JSON.stringify(c.errors)}`)).toEqual([]);
    expect(viaWorker.map((c) => `${c.name} ${c.hash}`)).toEqual(direct.map((c) => `${c.name} ${c.hash}`));
  });

  test('every bad-input case of the direct API: the same class and message, as a rejection', async () => {
    const direct = varlenErrorCases(attn0());
    const viaWorker = varlenErrorCases(worker);
    expect(viaWorker).toHaveLength(direct.length);
    for (let n = 0; n < direct.length; n++) {
      let thrown;
      try { direct[n][1](); } catch (error) { thrown = error; }
      expect(thrown).toBeInstanceOf(direct[n][2]);
      const rejected = await viaWorker[n][1]().then(() => null, (error) => error);
      expect([direct[n][0], rejected?.constructor]).toEqual([direct[n][0], thrown.constructor]);
      expect(rejected.message).toBe(thrown.message);
    }
  });

  test('errors are the direct API\'s, as rejections', async () => {
    const p = packed({ qLens: [3, 4], seed: 31 });
    const bad = { cuSeqlensQ: Int32Array.of(0, 5, 3, 7) };
    let direct;
    try { attn.sdpaVarlen(p.query, p.key, p.value, bad); } catch (error) { direct = error; }
    await expect(worker.sdpaVarlen(p.query, p.key, p.value, bad)).rejects.toThrow(RangeError);
    await expect(worker.sdpaVarlen(p.query, p.key, p.value, bad)).rejects.toThrow(direct.message);
    expect((await worker.sdpaVarlen(p.query, p.key, p.value, { cuSeqlensQ: p.cuSeqlensQ })).output.dims).toEqual([7, 2, 8]);
  });
});
