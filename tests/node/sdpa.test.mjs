// Correctness of attn.sdpa() against the float64 reference (reference.mjs), which is written
// from the contract alone. Error metric: max |got - ref| / (1 + |ref|) <= 2e-5, on the output
// and, with returnWeights, on the weights.
import { createAttention } from 'sdpa-wasm';
import {
  logSumExpError, maxRelError, mulberry32, normwiseError, randn, randomTensor, referenceLogSumExp, referenceProblem,
  referenceSdpa,
} from './reference.mjs';
import { roundedToHalves } from '../shared/kv-cache-cases.mjs';

const TOL = 2e-5;

let attn;
beforeAll(async () => {
  attn = await createAttention();
});
afterAll(() => attn.dispose());

// ---------------------------------------------------------------------------------------------
// Helpers

const tag = (x) => Object.prototype.toString.call(x);
const size = (dims) => dims.reduce((a, b) => a * b, 1);
const bitsOf = (a) => new Uint32Array(a.buffer, a.byteOffset, a.length);

/** Index of the first element whose bits differ, -1 if a and b are bitwise identical. */
function firstBitDifference(a, b) {
  if (a.length !== b.length) return -2;
  const x = bitsOf(a), y = bitsOf(b);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return i;
  return -1;
}

function expectBitwiseEqual(a, b) {
  expect(firstBitDifference(a, b)).toBe(-1);
}

/**
 * Two float32 results of the same mathematical problem posed differently (other layout,
 * rank, head expansion, ...): the kernel may take other code paths, so they need not be
 * bitwise equal, but both are within TOL of the exact result, so of each other.
 */
function expectSameResult(a, b) {
  expect(a.length).toBe(b.length);
  expect(maxRelError(a, Float64Array.from(b))).toBeLessThanOrEqual(TOL);
}

const rawBytes = (a) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength).slice();

/** Runs the API and the reference on the same problem and compares them. */
function check(query, key, value, options = {}, tol = TOL) {
  const got = attn.sdpa(query, key, value, options);
  const ref = referenceSdpa(query, key, value, options);
  expect(got.output.dims).toEqual(ref.outputDims);
  expect(tag(got.output.data)).toBe('[object Float32Array]');
  expect(got.output.data.length).toBe(ref.output.length);
  expect(maxRelError(got.output.data, ref.output)).toBeLessThanOrEqual(tol);
  if (options.returnWeights) {
    expect(got.weights.dims).toEqual(ref.weightsDims);
    expect(tag(got.weights.data)).toBe('[object Float32Array]');
    expect(maxRelError(got.weights.data, ref.weights)).toBeLessThanOrEqual(tol);
  } else {
    expect(got.weights).toBeUndefined();
  }
  return { got, ref };
}

/** q [B,Hq,Lq,E], k [B,Hkv,Lk,E], v [B,Hkv,Lk,Ev] (bhsd), seeded from `seed`. */
function problem({ B = 1, Hq = 1, Hkv = Hq, Lq, Lk, E, Ev = E }, seed) {
  return {
    q: randomTensor([B, Hq, Lq, E], seed * 3 + 1),
    k: randomTensor([B, Hkv, Lk, E], seed * 3 + 2),
    v: randomTensor([B, Hkv, Lk, Ev], seed * 3 + 3),
  };
}

/** Float mask: normal values ×2, a fraction `pInf` of them -Infinity. */
function floatMask(dims, seed, pInf = 0.2) {
  const data = randn(size(dims), seed);
  const u = mulberry32(seed ^ 0x5bd1e995);
  for (let i = 0; i < data.length; i++) data[i] = u() < pInf ? -Infinity : 2 * data[i];
  return { data, dims };
}

/** Bool mask: 1 (attend) with probability pOne. */
function boolMask(dims, seed, pOne = 0.7) {
  const data = new Uint8Array(size(dims));
  const u = mulberry32(seed);
  for (let i = 0; i < data.length; i++) data[i] = u() < pOne ? 1 : 0;
  return { data, dims };
}

/** [B, X, Y, D] → [B, Y, X, D] (bhsd ↔ bshd) for a rank-4 tensor. */
function swap12(t) {
  const [B, X, Y, D] = t.dims;
  const data = new Float32Array(t.data.length);
  for (let b = 0; b < B; b++) {
    for (let x = 0; x < X; x++) {
      for (let y = 0; y < Y; y++) {
        const src = ((b * X + x) * Y + y) * D, dst = ((b * Y + y) * X + x) * D;
        data.set(t.data.subarray(src, src + D), dst);
      }
    }
  }
  return { data, dims: [B, Y, X, D] };
}

/** Rows (b, h, i) of a [B, Hq, Lq, W] bhsd array, as subarray views. */
function rowOf(data, dims4, b, h, i) {
  const [, H, L, W] = dims4;
  const at = ((b * H + h) * L + i) * W;
  return data.subarray(at, at + W);
}

const isExactZero = (x) => Object.is(x, 0);
const allExactZeros = (a) => a.every(isExactZero);
const allFinite = (a) => a.every(Number.isFinite);

// ---------------------------------------------------------------------------------------------

// The kernel's tiles (src/tiles.h): 4 query rows × 512 keys, keys scored in groups of 8,
// 8 value columns; decode splits keys into 512-key segments (src/sdpa.cc).
describe('tile edges (4 query rows × 512 keys in groups of 8, 8 value columns)', () => {
  const LENS = [1, 3, 4, 5, 7, 8, 9, 13, 63, 64, 65, 97, 128, 257, 511, 512, 513, 1031];
  test.each(LENS)(`Lq = %i against every Lk in {${LENS}}`, (Lq) => {
    for (const Lk of LENS) {
      const { q, k, v } = problem({ Hq: 2, Hkv: 1, Lq, Lk, E: 5, Ev: 9 }, Lq * 1000 + Lk);
      check(q, k, v);
      check(q, k, v, { returnWeights: true });
      check(q, k, v, { isCausal: true, causalOffset: Lk - Lq, returnWeights: true });
    }
  });
});

describe('sums over many key tiles', () => {
  test('262144 keys, uniform weights (scale 0), values about 0.7: each key tile of P·V is summed apart, prefill (36 flat rows of one KV head) and decode', () => {
    // The output is about 0.7 times the keys summed so far; adding each key's p·v straight to it
    // lost a bit per doubling: 9.7e-6 of the output's size here on the prefill path. Summed a tile
    // at a time (src/kernels/f32-sdpa-fwd-4x512-wasmsimd.cc, pv_block): 5.7e-7, as the decode's
    // 512-key segments, merged afterwards, had been all along.
    const Lk = 262144;
    const key = randomTensor([1, 1, Lk, 4], 8101);
    const value = randomTensor([1, 1, Lk, 3], 8102);
    for (let i = 0; i < value.data.length; i++) value.data[i] = 0.7 + 0.05 * value.data[i];
    for (const Lq of [4, 1]) {
      const query = randomTensor([1, 9, Lq, 4], 8103);
      const got = attn.sdpa(query, key, value, { scale: 0 }).output.data;
      expect(normwiseError(got, referenceSdpa(query, key, value, { scale: 0 }).output)).toBeLessThanOrEqual(2e-6);
    }
  });
});

describe('head sizes', () => {
  const DIMS = [1, 3, 4, 7, 8, 9, 64, 256];
  test.each(DIMS)('E = %i against every Ev in {1,3,4,7,8,9,64,256}', (E) => {
    for (const Ev of DIMS) {
      const { q, k, v } = problem({ Hq: 2, Lq: 6, Lk: 37, E, Ev }, E * 1000 + Ev);
      check(q, k, v, { returnWeights: true });
    }
  });

  test('Lq != Lk, E != Ev, both directions', () => {
    for (const [Lq, Lk, E, Ev] of [[7, 45, 16, 24], [45, 7, 24, 16], [1, 200, 9, 3], [200, 1, 3, 9]]) {
      const { q, k, v } = problem({ B: 2, Hq: 2, Lq, Lk, E, Ev }, Lq + Lk);
      check(q, k, v, { returnWeights: true });
      check(q, k, v, { isCausal: true });
    }
  });
});

describe('grouped-query and multi-query attention', () => {
  test.each([[8, 2], [6, 1], [6, 3], [4, 4]])('Hq = %i, Hkv = %i', (Hq, Hkv) => {
    const B = 2, Lq = 7, Lk = 35, E = 12, Ev = 10;
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, Hq * 10 + Hkv);
    const { got } = check(q, k, v, { returnWeights: true });
    check(q, k, v, { isCausal: true, causalOffset: Lk - Lq });

    // Independent check of the head mapping: the same problem with K and V repeated so that
    // query head h has its own copy of KV head floor(h / (Hq / Hkv)).
    const expand = (t, D) => {
      const data = new Float32Array(B * Hq * Lk * D);
      for (let b = 0; b < B; b++) {
        for (let h = 0; h < Hq; h++) {
          const src = ((b * Hkv + Math.floor(h / (Hq / Hkv))) * Lk) * D;
          data.set(t.data.subarray(src, src + Lk * D), ((b * Hq + h) * Lk) * D);
        }
      }
      return { data, dims: [B, Hq, Lk, D] };
    };
    const full = attn.sdpa(q, expand(k, E), expand(v, Ev), { returnWeights: true });
    expectSameResult(got.output.data, full.output.data);
    expectSameResult(got.weights.data, full.weights.data);
  });
});

describe('batches', () => {
  test('B = 3: every batch equals the same problem run alone', () => {
    const B = 3, Hq = 4, Hkv = 2, Lq = 11, Lk = 29, E = 8, Ev = 5;
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 77);
    const { got } = check(q, k, v, { returnWeights: true });
    check(q, k, v, { isCausal: true, keyLengths: new Int32Array([29, 17, 3]) });
    const slice = (t, b) => {
      const n = t.data.length / B;
      return { data: t.data.slice(b * n, (b + 1) * n), dims: [1, ...t.dims.slice(1)] };
    };
    for (let b = 0; b < B; b++) {
      const one = attn.sdpa(slice(q, b), slice(k, b), slice(v, b), { returnWeights: true });
      const n = one.output.data.length, w = one.weights.data.length;
      expectSameResult(got.output.data.subarray(b * n, (b + 1) * n), one.output.data);
      expectSameResult(got.weights.data.subarray(b * w, (b + 1) * w), one.weights.data);
    }
  });
});

describe('ranks 2 and 3 (the output keeps the query rank)', () => {
  test('rank 2: [L, E]', () => {
    const Lq = 9, Lk = 34, E = 7, Ev = 3;
    const { q, k, v } = problem({ Lq, Lk, E, Ev }, 5);
    const q2 = { data: q.data, dims: [Lq, E] }, k2 = { data: k.data, dims: [Lk, E] };
    const v2 = { data: v.data, dims: [Lk, Ev] };
    const { got } = check(q2, k2, v2, { returnWeights: true, isCausal: true, causalOffset: 3 });
    expect(got.output.dims).toEqual([Lq, Ev]);
    expect(got.weights.dims).toEqual([Lq, Lk]);
    const four = attn.sdpa(q, k, v, { returnWeights: true, isCausal: true, causalOffset: 3 });
    expectSameResult(got.output.data, four.output.data);
    expectSameResult(got.weights.data, four.weights.data);
  });

  test("rank 2 is [L, E] with layout 'bshd' too (one head: the same problem as 'bhsd')", () => {
    const Lq = 5, Lk = 13, E = 4, Ev = 6;
    const { q, k, v } = problem({ Lq, Lk, E, Ev }, 15);
    const two = (t, L, D) => ({ data: t.data, dims: [L, D] });
    const { got } = check(two(q, Lq, E), two(k, Lk, E), two(v, Lk, Ev), { layout: 'bshd', isCausal: true, causalOffset: 2 });
    expect(got.output.dims).toEqual([Lq, Ev]);
    const bhsd = attn.sdpa(two(q, Lq, E), two(k, Lk, E), two(v, Lk, Ev), { isCausal: true, causalOffset: 2 });
    expectSameResult(got.output.data, bhsd.output.data);
  });

  test('rank 3: [H, L, E], with GQA and a mask', () => {
    const Hq = 4, Hkv = 2, Lq = 6, Lk = 40, E = 9, Ev = 12;
    const { q, k, v } = problem({ Hq, Hkv, Lq, Lk, E, Ev }, 6);
    const drop = (t) => ({ data: t.data, dims: t.dims.slice(1) });
    const mask = floatMask([Lq, Lk], 61);
    const { got } = check(drop(q), drop(k), drop(v), { returnWeights: true, attnMask: mask });
    expect(got.output.dims).toEqual([Hq, Lq, Ev]);
    expect(got.weights.dims).toEqual([Hq, Lq, Lk]);
    const four = attn.sdpa(q, k, v, { returnWeights: true, attnMask: mask });
    expectSameResult(got.output.data, four.output.data);
    expectSameResult(got.weights.data, four.weights.data);
  });

  test('mixed ranks: query rank 3, key rank 4, value rank 3', () => {
    const Hq = 4, Hkv = 2, Lq = 5, Lk = 33, E = 4, Ev = 6;
    const { q, k, v } = problem({ Hq, Hkv, Lq, Lk, E, Ev }, 7);
    const q3 = { data: q.data, dims: [Hq, Lq, E] }, v3 = { data: v.data, dims: [Hkv, Lk, Ev] };
    const { got } = check(q3, k, v3, { returnWeights: true });
    expect(got.output.dims).toEqual([Hq, Lq, Ev]);
    expect(got.weights.dims).toEqual([Hq, Lq, Lk]);
  });
});

describe("layout 'bshd'", () => {
  const B = 2, Hq = 4, Hkv = 2, Lq = 9, Lk = 37, E = 6, Ev = 11;
  const cases = [
    ['no options', () => ({})],
    ['causal bottom-right + weights', () => ({ isCausal: true, causalOffset: Lk - Lq, returnWeights: true })],
    ['float mask [B,1,Lq,Lk] + weights', () => ({ attnMask: floatMask([B, 1, Lq, Lk], 81), returnWeights: true })],
    ['bool mask [Hq,Lq,Lk] + softcap', () => ({ attnMask: boolMask([Hq, Lq, Lk], 82), softcap: 2 })],
    ['keyLengths + per-batch causal', () => ({
      keyLengths: new Int32Array([20, 37]), isCausal: true, causalOffset: new Int32Array([30, -2]), returnWeights: true,
    })],
  ];
  test.each(cases)('rank 4, %s: matches the reference and bhsd on transposed inputs', (_, makeOptions) => {
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 8);  // bhsd
    const qs = swap12(q), ks = swap12(k), vs = swap12(v);           // bshd
    const options = makeOptions();
    const { got } = check(qs, ks, vs, { ...options, layout: 'bshd' });
    expect(got.output.dims).toEqual([B, Lq, Hq, Ev]);
    const bhsd = attn.sdpa(q, k, v, options);
    expect(bhsd.output.dims).toEqual([B, Hq, Lq, Ev]);
    expectSameResult(swap12(got.output).data, bhsd.output.data);
    if (options.returnWeights) {
      expect(got.weights.dims).toEqual([B, Hq, Lq, Lk]);
      expectSameResult(got.weights.data, bhsd.weights.data);
    }
  });

  test('rank 3 [L, H, E]', () => {
    const { q, k, v } = problem({ Hq, Hkv, Lq, Lk, E, Ev }, 9);
    const toBshd3 = (t) => {
      const s = swap12(t);
      return { data: s.data, dims: s.dims.slice(1) };
    };
    const options = { returnWeights: true, isCausal: true };
    const { got } = check(toBshd3(q), toBshd3(k), toBshd3(v), { ...options, layout: 'bshd' });
    expect(got.output.dims).toEqual([Lq, Hq, Ev]);
    expect(got.weights.dims).toEqual([Hq, Lq, Lk]);
    const bhsd = attn.sdpa(q, k, v, options);
    expectSameResult(swap12({ data: got.output.data, dims: [1, Lq, Hq, Ev] }).data, bhsd.output.data);
    expectSameResult(got.weights.data, bhsd.weights.data);
  });

  test("explicit layout 'bhsd' is the default", () => {
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 10);
    const a = attn.sdpa(q, k, v, { layout: 'bhsd' });
    const b = attn.sdpa(q, k, v);
    expectBitwiseEqual(a.output.data, b.output.data);
  });
});

describe('masks of every broadcast shape', () => {
  const B = 2, Hq = 4, Hkv = 2, Lq = 9, Lk = 37, E = 8, Ev = 8;
  const SHAPES = [
    [Lk], [Lq, Lk], [1, Lk], [Hq, Lq, Lk], [B, 1, 1, Lk], [1, Hq, Lq, Lk], [B, Hq, Lq, Lk], [1],
    [Lq, 1], [B, 1, Lq, 1], [1, 1, 1, 1], [B, Hq, 1, Lk],
  ];
  const cases = [];
  for (const dims of SHAPES) for (const kind of ['float', 'bool']) cases.push([kind, dims]);
  test.each(cases)('%s mask [%j]', (kind, dims) => {
    const seed = 100 + cases.findIndex((c) => c[0] === kind && c[1] === dims);
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, seed);
    const mask = kind === 'float' ? floatMask(dims, seed) : boolMask(dims, seed);
    check(q, k, v, { attnMask: mask, returnWeights: true });
    check(q, k, v, { attnMask: mask, scale: 0.5 });
  });

  test('[1] masks: finite float value shifts nothing, -Infinity / 0 block everything', () => {
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 120);
    const plain = attn.sdpa(q, k, v).output.data;
    const shifted = check(q, k, v, { attnMask: { data: new Float32Array([5]), dims: [1] } }).got.output.data;
    expect(maxRelError(shifted, Float64Array.from(plain))).toBeLessThanOrEqual(TOL);
    const keep = check(q, k, v, { attnMask: { data: new Uint8Array([1]), dims: [1] } }).got.output.data;
    expectSameResult(keep, plain);
    for (const mask of [{ data: new Float32Array([-Infinity]), dims: [1] }, { data: new Uint8Array([0]), dims: [1] }]) {
      const r = attn.sdpa(q, k, v, { attnMask: mask, returnWeights: true });
      expect(allExactZeros(r.output.data)).toBe(true);
      expect(allExactZeros(r.weights.data)).toBe(true);
    }
  });

  test('bool mask values other than 0 and 1 mean "attend"', () => {
    const { q, k, v } = problem({ Lq: 5, Lk: 40, E: 4 }, 121);
    const mask = boolMask([5, 40], 122);
    const other = { data: mask.data.map((x, i) => (x ? 1 + (i % 255) : 0)), dims: mask.dims };
    const a = attn.sdpa(q, k, v, { attnMask: mask }).output.data;
    const b = check(q, k, v, { attnMask: other }).got.output.data;
    expectSameResult(a, b);
  });
});

describe('mask combined with isCausal', () => {
  const B = 3, Hq = 2, Hkv = 1, Lq = 10, Lk = 45, E = 7, Ev = 9;
  const offsets = [0, Lk - Lq, -3, new Int32Array([0, -4, Lk - Lq])];
  test.each(offsets.map((o) => [o]))('causalOffset %p with float and bool masks', (causalOffset) => {
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 130);
    for (const attnMask of [floatMask([Lq, Lk], 131), boolMask([B, 1, Lq, Lk], 132), floatMask([B, Hq, 1, Lk], 133)]) {
      check(q, k, v, { attnMask, isCausal: true, causalOffset, returnWeights: true });
    }
  });
});

describe('causal offsets', () => {
  const SIZES = [[13, 40], [40, 13], [33, 33], [5, 100]];
  const offsetsFor = (Lq, Lk) => [undefined, 0, Lk - Lq, -1, -6, Lq - 1, -Lq, -Lq - 5, 1e9, -1e9, 2 ** 31 - 1, -(2 ** 31), 2 ** 40];
  test.each(SIZES)('Lq = %i, Lk = %i', (Lq, Lk) => {
    const B = 2, Hq = 2, E = 6, Ev = 5;
    const { q, k, v } = problem({ B, Hq, Lq, Lk, E, Ev }, Lq * 7 + Lk);
    for (const offset of offsetsFor(Lq, Lk)) {
      const options = { isCausal: true, returnWeights: true };
      if (offset !== undefined) options.causalOffset = offset;
      const { got } = check(q, k, v, options);
      expect(allFinite(got.output.data)).toBe(true);
      // Rows with i + offset < 0 see no key: exact zeros (+0, not NaN, not -0).
      const off = offset ?? 0;
      for (let b = 0; b < B; b++) {
        for (let h = 0; h < Hq; h++) {
          for (let i = 0; i < Lq; i++) {
            const empty = i + off < 0;
            const out = rowOf(got.output.data, [B, Hq, Lq, Ev], b, h, i);
            const w = rowOf(got.weights.data, [B, Hq, Lq, Lk], b, h, i);
            if (empty) {
              expect(allExactZeros(out)).toBe(true);
              expect(allExactZeros(w)).toBe(true);
            } else {
              // Keys after the causal frontier have exactly zero weight.
              expect(allExactZeros(w.subarray(Math.min(Lk, i + off + 1)))).toBe(true);
            }
          }
        }
      }
    }
  });

  test('without causalOffset, isCausal: false and isCausal omitted agree', () => {
    const { q, k, v } = problem({ Lq: 9, Lk: 20, E: 4 }, 140);
    expectBitwiseEqual(attn.sdpa(q, k, v, { isCausal: false }).output.data, attn.sdpa(q, k, v).output.data);
  });

  test('per-batch Int32Array offsets', () => {
    const B = 5, Hq = 4, Hkv = 2, Lq = 9, Lk = 50, E = 8, Ev = 8;
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 141);
    for (const offsets of [
      [0, -3, Lk - Lq, 2147483647, -2147483648],
      [-Lq, 7, -1, Lk, 33],
    ]) {
      const causalOffset = new Int32Array(offsets);
      const { got } = check(q, k, v, { isCausal: true, causalOffset, returnWeights: true });
      // Each batch equals the same problem with that batch's scalar offset.
      for (let b = 0; b < B; b++) {
        const scalar = attn.sdpa(q, k, v, { isCausal: true, causalOffset: offsets[b] }).output.data;
        const n = Hq * Lq * Ev;
        expectSameResult(got.output.data.subarray(b * n, (b + 1) * n), scalar.subarray(b * n, (b + 1) * n));
      }
    }
  });
});

describe('sliding window', () => {
  /** Row (b, h, i)'s keys: the window's first key and one past the causal frontier, within [0, Lk]. */
  const windowOf = (i, offset, W, Lk) => [Math.min(Math.max(i + offset - W + 1, 0), Lk), Math.min(Math.max(i + offset + 1, 0), Lk)];

  test.each([1, 5, 13])('tile edges: Lq = %i against Lk and W either side of 512 keys and 8 keys; weights outside the window exactly 0', (Lq) => {
    const B = 1, Hq = 2, E = 8, Ev = 9;
    for (const Lk of [1, 7, 511, 513, 1031]) {
      const { q, k, v } = problem({ B, Hq, Lq, Lk, E, Ev }, Lq * 31 + Lk);
      for (const W of [1, 2, 8, 9, 511, 512, 513, 2000]) {
        const offset = Lk - Lq;
        const { got } = check(q, k, v, { isCausal: true, causalOffset: offset, slidingWindow: W, returnWeights: true });
        for (let h = 0; h < Hq; h++) {
          for (let i = 0; i < Lq; i++) {
            const [first, end] = windowOf(i, offset, W, Lk);
            const w = rowOf(got.weights.data, [B, Hq, Lq, Lk], 0, h, i);
            expect(allExactZeros(w.subarray(0, first))).toBe(true);
            expect(allExactZeros(w.subarray(end))).toBe(true);
            if (first >= end) expect(allExactZeros(rowOf(got.output.data, [B, Hq, Lq, Ev], 0, h, i))).toBe(true);
          }
        }
      }
    }
  });

  test('offsets far outside [-Lq, Lk], per batch and scalar, with windows of 1 key to 2^30', () => {
    const B = 3, Hq = 2, Lq = 6, Lk = 40, E = 5, Ev = 4;
    const { q, k, v } = problem({ B, Hq, Lq, Lk, E, Ev }, 150);
    for (const W of [1, 5, 39, 41, 2 ** 30]) {
      for (const offset of [-Lq, -Lq - 1, Lk, Lk + W - 2, Lk + W - 1, Lk + W, 1e9, -1e9, 2 ** 40, 2 ** 31 - 1, -(2 ** 31)]) {
        check(q, k, v, { isCausal: true, causalOffset: offset, slidingWindow: W, returnWeights: true });
      }
      const offsets = new Int32Array([2 ** 31 - 1, Lk + W - 1 - Lq, 10]);
      const { got } = check(q, k, v, { isCausal: true, causalOffset: offsets, slidingWindow: W });
      for (let b = 0; b < B; b++) {  // each batch as the same problem with its scalar offset
        const scalar = attn.sdpa(q, k, v, { isCausal: true, causalOffset: offsets[b], slidingWindow: W }).output.data;
        const n = Hq * Lq * Ev;
        expectSameResult(got.output.data.subarray(b * n, (b + 1) * n), scalar.subarray(b * n, (b + 1) * n));
      }
    }
  });

  test('with GQA, float and bool masks, keyLengths, softcap and bshd', () => {
    const B = 2, Hq = 6, Hkv = 2, Lq = 9, Lk = 700, E = 12, Ev = 7;
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 151);
    const base = { isCausal: true, causalOffset: new Int32Array([Lk - Lq, 300]), slidingWindow: 200, returnWeights: true };
    check(q, k, v, base);
    check(q, k, v, { ...base, attnMask: floatMask([B, 1, Lq, Lk], 152), softcap: 3 });
    check(q, k, v, { ...base, attnMask: boolMask([Lk], 153), keyLengths: new Int32Array([Lk, 250]) });
    const bshd = { ...base, layout: 'bshd' };
    check(swap12(q), swap12(k), swap12(v), bshd);
  });

  test('decode (one query row per head, keys split into 512-key segments) and threads give the same bits', async () => {
    const two = await createAttention({ threads: 2 });
    try {
      for (const [Hq, Hkv] of [[4, 4], [8, 2]]) {
        const Lk = 5000, { q, k, v } = problem({ B: 2, Hq, Hkv, Lq: 1, Lk, E: 64 }, 154 + Hq);
        for (const W of [1, 100, 513, 1500, 4999]) {
          const options = { isCausal: true, causalOffset: Lk - 1, slidingWindow: W };
          const { got } = check(q, k, v, options);
          expectBitwiseEqual(two.sdpa(q, k, v, options).output.data, got.output.data);
        }
      }
    } finally {
      two.dispose();
    }
  });

  test('NaN in the keys before every row\'s window never reaches the output', () => {
    for (const [Lq, Lk] of [[1, 2000], [7, 60], [20, 1300]]) {
      const E = 8, Ev = 8, W = 17, offset = Lk - Lq;
      const { q, k, v } = problem({ Lq, Lk, E, Ev }, 160 + Lq);
      const first = offset - W + 1;  // row 0's first key
      k.data.fill(NaN, 0, first * E);
      v.data.fill(NaN, 0, first * Ev);
      const { got } = check(q, k, v, { isCausal: true, causalOffset: offset, slidingWindow: W });
      expect(allFinite(got.output.data)).toBe(true);
    }
  });

  test("a bidirectional local window (ModernBERT's ±64) as the README writes it: causalOffset = right, slidingWindow = left + right + 1", () => {
    const L = 300, left = 64, right = 64, B = 2, H = 3, E = 16;
    const { q, k, v } = problem({ B, Hq: H, Lq: L, Lk: L, E }, 175);
    const band = new Uint8Array(L * L);
    for (let i = 0; i < L; i++) for (let j = Math.max(0, i - left); j <= Math.min(L - 1, i + right); j++) band[i * L + j] = 1;
    const keyLengths = new Int32Array([L, 200]);  // a padded batch: its last keys never attended
    const { got } = check(q, k, v, { isCausal: true, causalOffset: right, slidingWindow: left + right + 1, keyLengths, returnWeights: true });
    const ref = referenceSdpa(q, k, v, { attnMask: { data: band, dims: [L, L] }, keyLengths, returnWeights: true });
    expect(maxRelError(got.output.data, ref.output)).toBeLessThanOrEqual(TOL);
    expect(maxRelError(got.weights.data, ref.weights)).toBeLessThanOrEqual(TOL);
  });

  test('the same result as the window written as a bool mask; a window past every key changes no bit', () => {
    const Lq = 37, Lk = 1100, W = 300, offset = Lk - Lq;
    const { q, k, v } = problem({ Hq: 2, Lq, Lk, E: 16 }, 170);
    const band = new Uint8Array(Lq * Lk);
    for (let i = 0; i < Lq; i++) for (let j = i + offset - W + 1; j <= i + offset; j++) band[i * Lk + j] = 1;
    const windowed = attn.sdpa(q, k, v, { isCausal: true, causalOffset: offset, slidingWindow: W }).output.data;
    expectSameResult(windowed, attn.sdpa(q, k, v, { isCausal: true, causalOffset: offset, attnMask: { data: band, dims: [Lq, Lk] } }).output.data);
    const causal = attn.sdpa(q, k, v, { isCausal: true, causalOffset: offset }).output.data;
    expectBitwiseEqual(attn.sdpa(q, k, v, { isCausal: true, causalOffset: offset, slidingWindow: Lk }).output.data, causal);
    expectBitwiseEqual(attn.sdpa(q, k, v, { isCausal: true, causalOffset: offset, slidingWindow: 2 ** 30 }).output.data, causal);
  });
});

describe('keyStarts (left padding)', () => {
  test('starts 0, 1, 7, 8, 511, 512, 513, Lk, with NaN written into the left padding of K and V; with keyLengths, causal, a window and masks', () => {
    const B = 8, Hq = 4, Hkv = 2, Lq = 5, Lk = 1031, E = 8, Ev = 9;
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 180);
    const keyStarts = new Int32Array([0, 1, 7, 8, 511, 512, 513, Lk]);
    for (let bh = 0; bh < B * Hkv; bh++) {
      const start = keyStarts[Math.floor(bh / Hkv)];
      k.data.fill(NaN, bh * Lk * E, (bh * Lk + start) * E);
      v.data.fill(NaN, bh * Lk * Ev, (bh * Lk + start) * Ev);
    }
    const variants = [
      { keyStarts },
      { keyStarts, keyLengths: new Int32Array([Lk, 900, 8, 8, 600, 513, 1000, Lk]), returnWeights: true },
      { keyStarts, isCausal: true, causalOffset: Lk - Lq, slidingWindow: 300 },
      { keyStarts, attnMask: boolMask([B, 1, 1, Lk], 181), softcap: 5 },
      { keyStarts, attnMask: floatMask([Lq, Lk], 182), layout: 'bhsd', returnWeights: true },
    ];
    for (const options of variants) {
      const { got } = check(q, k, v, options);
      expect(allFinite(got.output.data)).toBe(true);
      // The batch whose every key is padding: exact zeros.
      expect(allExactZeros(got.output.data.subarray(7 * Hq * Lq * Ev))).toBe(true);
    }
  });

  test('decode: keys split into 512-key segments, the segments before the start skipped; one and two threads bitwise; as a key mask', async () => {
    const two = await createAttention({ threads: 2 });
    try {
      const B = 3, Hq = 8, Hkv = 2, Lk = 5000, E = 64;
      const { q, k, v } = problem({ B, Hq, Hkv, Lq: 1, Lk, E }, 183);
      const keyStarts = new Int32Array([1500, 0, 4999]);
      const options = { keyStarts, isCausal: true, causalOffset: Lk - 1 };
      const { got } = check(q, k, v, options);
      expectBitwiseEqual(two.sdpa(q, k, v, options).output.data, got.output.data);
      const mask = new Uint8Array(B * Lk);
      keyStarts.forEach((start, b) => mask.fill(1, b * Lk + start, (b + 1) * Lk));
      expectSameResult(attn.sdpa(q, k, v, { isCausal: true, causalOffset: Lk - 1, attnMask: { data: mask, dims: [B, 1, 1, Lk] } }).output.data,
        got.output.data);
    } finally {
      two.dispose();
    }
  });
});

describe('sinks (gpt-oss)', () => {
  /** Hq sink logits cycling through none (-Infinity), 0, 2.5, -3 and 30 (above every score). */
  const cyclingSinks = (Hq) => Float32Array.from({ length: Hq }, (_, h) => [-Infinity, 0, 2.5, -3, 30][h % 5]);

  test('tile edges, MHA and GQA, prefill and decode (512-key segments): output, weights and logSumExp against the reference', () => {
    let seed = 400;
    for (const [Hq, Hkv] of [[5, 5], [5, 1]]) {
      for (const Lq of [1, 5]) {
        for (const Lk of [1, 13, 511, 513, 1100]) {
          const { q, k, v } = problem({ B: 2, Hq, Hkv, Lq, Lk, E: 8, Ev: 12 }, seed++);
          const sinks = cyclingSinks(Hq);
          for (const options of [
            { sinks, returnWeights: true, returnLogSumExp: true },
            { sinks, isCausal: true, causalOffset: new Int32Array([Lk - Lq, -2]), returnWeights: true, returnLogSumExp: true },
            { sinks, attnMask: floatMask([Lq, Lk], seed), softcap: 5, isCausal: true, causalOffset: Lk - Lq, slidingWindow: 9 },
          ]) {
            const { got, ref } = check(q, k, v, options);
            if (!options.returnLogSumExp) continue;
            expect(logSumExpError(got.logSumExp.data, referenceLogSumExp(q, k, v, options))).toBeLessThanOrEqual(TOL);
            // Each row's weights sum to 1 - exp(sink - lse): the sink's share (0 without one).
            for (let row = 0; row < 2 * Hq * Lq; row++) {
              const h = Math.floor(row / Lq) % Hq;
              let sum = 0;
              for (let j = 0; j < Lk; j++) sum += ref.weights[row * Lk + j];
              const lse = got.logSumExp.data[row];
              const sinkShare = sinks[h] === -Infinity || lse === -Infinity ? 0 : Math.exp(sinks[h] - lse);
              const attends = ref.weights.subarray(row * Lk, (row + 1) * Lk).some((w) => w > 0);
              expect(Math.abs(sum - (attends ? 1 - sinkShare : 0))).toBeLessThanOrEqual(1e-5);
            }
          }
        }
      }
    }
  });

  test('a row with nothing to attend: exact zeros in output and weights, logSumExp the sink itself (-Infinity without one)', () => {
    const Hq = 5, Lq = 3, Lk = 700;
    const { q, k, v } = problem({ B: 2, Hq, Lq, Lk, E: 8 }, 410);
    const sinks = cyclingSinks(Hq);
    for (const extra of [{}, { isCausal: true, causalOffset: -Lq }]) {
      const got = attn.sdpa(q, k, v, { sinks, keyLengths: new Int32Array([Lk, 0]), returnWeights: true, returnLogSumExp: true, ...extra });
      const emptyBatch = extra.isCausal ? [0, 1] : [1];
      for (const b of emptyBatch) {
        for (let h = 0; h < Hq; h++) {
          for (let i = 0; i < Lq; i++) {
            expect(allExactZeros(rowOf(got.output.data, [2, Hq, Lq, 8], b, h, i))).toBe(true);
            expect(allExactZeros(rowOf(got.weights.data, [2, Hq, Lq, Lk], b, h, i))).toBe(true);
            expect(got.logSumExp.data[(b * Hq + h) * Lq + i]).toBe(sinks[h]);
          }
        }
      }
    }
  });

  test('sinks of -Infinity are the bits of no sinks; a sink past every score leaves exact zeros where exp underflows', () => {
    const { q, k, v } = problem({ B: 1, Hq: 3, Lq: 6, Lk: 600, E: 16 }, 420);
    const none = attn.sdpa(q, k, v, { returnWeights: true, isCausal: true });
    const minusInf = attn.sdpa(q, k, v, { returnWeights: true, isCausal: true, sinks: new Float32Array(3).fill(-Infinity) });
    expectBitwiseEqual(minusInf.output.data, none.output.data);
    expectBitwiseEqual(minusInf.weights.data, none.weights.data);
    // A sink of 3e38 takes all the probability: every weight +0, every output element zero (of
    // the sign of the tiny value it underflowed from).
    const huge = check(q, k, v, { returnWeights: true, sinks: new Float32Array([3e38, 3e38, 3e38]) }).got;
    expect(huge.output.data.every((x) => x === 0)).toBe(true);
    expect(allExactZeros(huge.weights.data)).toBe(true);
  });

  test("a gpt-oss layer's shapes (GQA 8:1, a 128-key window, bshd): prefill and decode, one and two threads bitwise", async () => {
    const two = await createAttention({ threads: 2 });
    try {
      const B = 1, Hq = 16, Hkv = 2, E = 64, Lk = 1500;
      const sinks = Float32Array.from(randn(Hq, 430), (x) => 2 * x);
      for (const Lq of [1, 200]) {
        const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E }, 431 + Lq);
        const [qs, ks, vs] = [swap12(q), swap12(k), swap12(v)];
        for (const window of [undefined, 128]) {
          const options = { sinks, isCausal: true, causalOffset: Lk - Lq, layout: 'bshd', ...(window ? { slidingWindow: window } : {}) };
          const { got } = check(qs, ks, vs, options);
          expectBitwiseEqual(two.sdpa(qs, ks, vs, options).output.data, got.output.data);
        }
      }
    } finally {
      two.dispose();
    }
  });
});

describe('ALiBi (alibiSlopes)', () => {
  /** BLOOM's slopes for Hq heads (a power of two): 2^(−8(h+1)/Hq). */
  const bloomSlopes = (Hq) => Float32Array.from({ length: Hq }, (_, h) => 2 ** (-8 * (h + 1) / Hq));
  /**
   * ALiBi written as a float mask [B or 1, Hq, Lq, Lk] of float32 biases −slope·|i + offset − j|
   * (each the float32 rounding of an exact product, as the kernel's), plus `extra` (a float
   * mask [Lq, Lk]) when given, added in float32 as the kernel adds them.
   */
  function alibiAsMask(slopes, { B, Hq, Lq, Lk }, offsetOf, extra) {
    const perBatch = slopes.length !== Hq;
    const rows = perBatch ? B : 1;
    const data = new Float32Array(rows * Hq * Lq * Lk);
    for (let b = 0; b < rows; b++) {
      for (let h = 0; h < Hq; h++) {
        const slope = slopes[perBatch ? b * Hq + h : h];
        for (let i = 0; i < Lq; i++) {
          for (let j = 0; j < Lk; j++) {
            const bias = Math.fround(-(slope * Math.abs(i + offsetOf(b) - j)));
            data[((b * Hq + h) * Lq + i) * Lk + j] = extra ? Math.fround(extra.data[i * Lk + j] + bias) : bias;
          }
        }
      }
    }
    return { data, dims: [rows, Hq, Lq, Lk] };
  }

  test('tile edges, MHA and GQA, prefill and decode (512-key segments), causal and not, offsets, masks, windows, softcap, sinks: against the reference', () => {
    let seed = 700;
    for (const [Hq, Hkv] of [[4, 4], [4, 1]]) {
      for (const Lq of [1, 5]) {
        for (const Lk of [1, 13, 511, 513, 1100]) {
          const B = 2;
          const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E: 8, Ev: 12 }, seed++);
          // Slopes small enough for float32 biases to stay close to the float64 reference's.
          const slopes = Float32Array.from({ length: Hq }, (_, h) => 4 * 2 ** -h / Lk);
          const perBatch = Float32Array.from({ length: B * Hq }, (_, n) => (n % 3) / Lk);
          for (const options of [
            { alibiSlopes: slopes, returnWeights: true, returnLogSumExp: true },
            { alibiSlopes: perBatch, causalOffset: Int32Array.of(Lk - Lq, 3), returnWeights: true, returnLogSumExp: true },
            { alibiSlopes: slopes, isCausal: true, causalOffset: Lk - Lq, returnWeights: true, returnLogSumExp: true },
            { alibiSlopes: perBatch, attnMask: floatMask([Lq, Lk], seed), softcap: 5, isCausal: true, causalOffset: Lk - Lq, slidingWindow: 9,
              sinks: Float32Array.from({ length: Hq }, (_, h) => [-Infinity, 0, 2.5, 30][h]), returnLogSumExp: true },
            { alibiSlopes: slopes, attnMask: boolMask([B, 1, Lq, Lk], seed), keyLengths: Int32Array.of(Lk, Math.min(Lk, 7)),
              keyStarts: Int32Array.of(0, Math.min(2, Lk)), returnWeights: true },
          ]) {
            check(q, k, v, options);
            if (options.returnLogSumExp) {
              const got = attn.sdpa(q, k, v, options);
              expect(logSumExpError(got.logSumExp.data, referenceLogSumExp(q, k, v, options))).toBeLessThanOrEqual(TOL);
            }
          }
        }
      }
    }
  });

  test('the same bits as the biases written as a float mask (alone, and added to another mask), prefill (copied whole or one (batch, KV head) at a time) and decode, bshd, two threads', async () => {
    const two = await createAttention({ threads: 2 });
    try {
      for (const [shape, seed] of [
        [{ B: 2, Hq: 8, Hkv: 2, Lq: 70, Lk: 600, E: 32 }, 720],
        [{ B: 2, Hq: 8, Hkv: 2, Lq: 1, Lk: 1500, E: 64 }, 721],
        // 6 MiB of Q/K/V on one thread: computed one (batch, KV head) at a time (the streamed
        // prefill), each pair's slopes and offset moved to it.
        [{ B: 2, Hq: 4, Hkv: 4, Lq: 512, Lk: 512, E: 128 }, 722],
      ]) {
        const { q, k, v } = problem(shape, seed);
        const { B, Hq, Lq, Lk } = shape;
        const perBatch = Float32Array.from({ length: B * Hq }, (_, n) => bloomSlopes(Hq)[n % Hq] * (1 + (n >= Hq)));
        const extra = floatMask([Lq, Lk], seed, 0.1);
        for (const [alibi, offsets, causal] of [
          [bloomSlopes(Hq), [Lk - Lq, Lk - Lq], true],
          [perBatch, [4, -9], false],
        ]) {
          const causalOffset = Int32Array.from(offsets);
          const base = { isCausal: causal, causalOffset, returnWeights: true, returnLogSumExp: true };
          for (const withExtra of [false, true]) {
            const viaAlibi = attn.sdpa(q, k, v, { ...base, alibiSlopes: alibi, ...(withExtra ? { attnMask: extra } : {}) });
            // Without isCausal the mask's call takes no offset: the biases hold it.
            const { causalOffset: _, ...maskBase } = causal ? { causalOffset: null } : base;
            const viaMask = attn.sdpa(q, k, v, {
              ...(causal ? base : maskBase), attnMask: alibiAsMask(alibi, shape, (b) => offsets[b], withExtra ? extra : null),
            });
            expectBitwiseEqual(viaAlibi.output.data, viaMask.output.data);
            expectBitwiseEqual(viaAlibi.weights.data, viaMask.weights.data);
            expectBitwiseEqual(viaAlibi.logSumExp.data, viaMask.logSumExp.data);
            const options = { ...base, alibiSlopes: alibi, ...(withExtra ? { attnMask: extra } : {}) };
            expectBitwiseEqual(two.sdpa(q, k, v, options).output.data, viaAlibi.output.data);
            const bshd = attn.sdpa(swap12(q), swap12(k), swap12(v), { ...options, layout: 'bshd' });
            expectBitwiseEqual(swap12(bshd.output).data, viaAlibi.output.data);
          }
        }
      }
    } finally {
      two.dispose();
    }
  });

  test('the offset moves the distances without isCausal; slopes of 0 are attention without ALiBi', () => {
    const shape = { B: 1, Hq: 2, Lq: 6, Lk: 40, E: 16 };
    const { q, k, v } = problem(shape, 730);
    const slopes = Float32Array.of(0.75, 0.1);
    for (const causalOffset of [0, 34, -3, 50]) check(q, k, v, { alibiSlopes: slopes, causalOffset, returnWeights: true });
    // Not the same as the default offset 0: the biases moved.
    const moved = attn.sdpa(q, k, v, { alibiSlopes: slopes, causalOffset: 34 }).output.data;
    expect(firstBitDifference(moved, attn.sdpa(q, k, v, { alibiSlopes: slopes }).output.data)).toBeGreaterThanOrEqual(0);
    for (const options of [{}, { isCausal: true }, { attnMask: floatMask([6, 40], 731) }]) {
      const zero = attn.sdpa(q, k, v, { ...options, alibiSlopes: new Float32Array(2), returnWeights: true });
      const none = attn.sdpa(q, k, v, { ...options, returnWeights: true });
      expectBitwiseEqual(zero.output.data, none.output.data);
      expectBitwiseEqual(zero.weights.data, none.weights.data);
    }
  });

  test('a large slope attends the diagonal key alone; offsets in int32 are taken as given (not clamped)', () => {
    const { q, k, v } = problem({ B: 1, Hq: 1, Lq: 3, Lk: 50, E: 8 }, 740);
    // Slope 1000: every key but the row's diagonal one (distance 0) is 1000 or more below it.
    const got = attn.sdpa(q, k, v, { alibiSlopes: Float32Array.of(1000), causalOffset: 20, returnWeights: true, returnLogSumExp: true });
    for (let i = 0; i < 3; i++) {
      const row = got.weights.data.subarray(i * 50, (i + 1) * 50);
      row.forEach((w, j) => expect(w).toBe(j === i + 20 ? 1 : 0));
      expect(Array.from(got.output.data.subarray(i * 8, (i + 1) * 8))).toEqual(Array.from(v.data.subarray((i + 20) * 8, (i + 21) * 8)));
    }
    // An offset far past every key: each row's log-sum-exp carries its own distance (not that of
    // an offset clamped to Lk, which would give the same output and a different lse).
    const slope = 2 ** -20, offset = 2 ** 30;
    const far = check(q, k, v, { alibiSlopes: Float32Array.of(slope), causalOffset: offset, returnLogSumExp: true }, 1e-4).got;
    expect(logSumExpError(far.logSumExp.data, referenceLogSumExp(q, k, v, { alibiSlopes: Float32Array.of(slope), causalOffset: offset })))
      .toBeLessThanOrEqual(1e-5);
    expect(far.logSumExp.data[0]).toBeLessThan(-1000);  // ≈ −2^30·2^-20 = −1024
  });
});

describe('attention dropout (dropoutP, dropoutSeed)', () => {
  // After the softmax, probability (b, h, i, j) is dropped (0) or kept and multiplied by
  // 2^32/(2^32 − t), t = min(round(dropoutP·2^32), 2^32 − 1), kept iff bits(b, h, i, j) >= t
  // (js/types.ts, src/kernels/dropout.h). The weights returned are the dropped ones; the
  // log-sum-exp is the softmax's own.
  const dropout = (p, seed) => ({ dropoutP: p, dropoutSeed: seed });
  const thresholdOf = (p) => Math.min(Math.round(p * 2 ** 32), 2 ** 32 - 1);
  const factorOf = (p) => 2 ** 32 / (2 ** 32 - thresholdOf(p));

  // The mask's bits from the definition, in BigInt arithmetic mod 2^32 (written apart from
  // reference.mjs's Math.imul version): MurmurHash3's finaliser, chained over seed, b, h, i,
  // then XOR with the key's j·0x9E3779B9.
  const M32 = (1n << 32n) - 1n;
  const fmix = (x) => {
    x ^= x >> 16n;
    x = (x * 0x85EBCA6Bn) & M32;
    x ^= x >> 13n;
    x = (x * 0xC2B2AE35n) & M32;
    return x ^ (x >> 16n);
  };
  const bitsOfKey = (seed, b, h, i, j) => {
    let x = fmix(BigInt(seed));
    for (const n of [b, h, i]) x = fmix((x + BigInt(n)) & M32);
    return Number(fmix(x ^ ((BigInt(j) * 0x9E3779B9n) & M32)));
  };

  /** lse against the reference, and bitwise the lse of the same call without dropout. */
  function expectLogSumExp(got, q, k, v, options) {
    expect(logSumExpError(got.logSumExp.data, referenceLogSumExp(q, k, v, options))).toBeLessThanOrEqual(TOL);
    const { dropoutP: _p, dropoutSeed: _s, ...none } = options;
    expectBitwiseEqual(got.logSumExp.data, attn.sdpa(q, k, v, { ...none, returnLogSumExp: true }).logSumExp.data);
  }

  test('tile edges (Lq 1, 4, 5, 37 × Lk 1, 7, 8, 9, 511, 512, 513, 1031), GQA, B 2, Ev ≠ E, causal and not: output, weights and logSumExp against the reference', () => {
    let seed = 900;
    for (const Lq of [1, 4, 5, 37]) {
      for (const Lk of [1, 7, 8, 9, 511, 512, 513, 1031]) {
        const { q, k, v } = problem({ B: 2, Hq: 4, Hkv: 2, Lq, Lk, E: 5, Ev: 9 }, seed++);
        for (const options of [
          { ...dropout(0.3, seed), returnWeights: true, returnLogSumExp: true },
          { ...dropout(0.7, 2 ** 32 - seed), isCausal: true, causalOffset: Lk - Lq, returnWeights: true, returnLogSumExp: true },
        ]) {
          const { got } = check(q, k, v, options);
          expectLogSumExp(got, q, k, v, options);
        }
        // Without weights or lse (the output alone): the bits of the call with them.
        const options = { ...dropout(0.3, seed) };
        expectBitwiseEqual(check(q, k, v, options).got.output.data, attn.sdpa(q, k, v, { ...options, returnWeights: true }).output.data);
      }
    }
  });

  test('with every other option: float and bool masks of broadcast shapes, keyLengths and keyStarts, causal offsets per batch, sliding window, sinks, ALiBi, softcap, scale, Lq ≠ Lk, bshd', () => {
    const B = 2, Hq = 4, Hkv = 2, E = 16, Ev = 8;
    let seed = 950;
    for (const [Lq, Lk] of [[5, 600], [37, 70], [70, 37]]) {
      const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, seed++);
      const sinks = Float32Array.from({ length: Hq }, (_, h) => [-Infinity, 0, 2.5, -3][h]);
      const slopes = Float32Array.from({ length: B * Hq }, (_, n) => (n % 3) / Lk);
      const all = { returnWeights: true, returnLogSumExp: true };
      for (const options of [
        { ...dropout(0.25, 1), attnMask: floatMask([Lq, Lk], seed), ...all },
        { ...dropout(0.25, 2), attnMask: boolMask([B, 1, Lq, Lk], seed), ...all },
        { ...dropout(0.5, 3), attnMask: floatMask([B, Hq, 1, Lk], seed), softcap: 3, scale: 0.6, ...all },
        { ...dropout(0.5, 4), attnMask: boolMask([Hq, Lq, 1], seed, 0.8), ...all },
        { ...dropout(0.1, 5), keyLengths: Int32Array.of(Lk, Math.min(Lk, 9)), keyStarts: Int32Array.of(Math.min(3, Lk), 0), ...all },
        { ...dropout(0.4, 6), isCausal: true, causalOffset: Int32Array.of(Lk - Lq, -2), ...all },
        { ...dropout(0.4, 7), isCausal: true, causalOffset: Lk - Lq, slidingWindow: 9, sinks, ...all },
        { ...dropout(0.9, 8), alibiSlopes: slopes, causalOffset: Lk - Lq, sinks, ...all },
        { ...dropout(0.2, 9), alibiSlopes: slopes.subarray(0, Hq), isCausal: true, attnMask: floatMask([Lq, Lk], seed + 1), softcap: 5, ...all },
      ]) {
        const { got } = check(q, k, v, options);
        expectLogSumExp(got, q, k, v, options);
        // The same problem in the 'bshd' layout: the same mask (its indices are the problem's,
        // not the memory's), against the reference in that layout.
        const [qs, ks, vs] = [swap12(q), swap12(k), swap12(v)];
        const bshd = check(qs, ks, vs, { ...options, layout: 'bshd' }).got;
        expectBitwiseEqual(bshd.weights.data, got.weights.data);
        expectSameResult(swap12(bshd.output).data, got.output.data);
      }
    }
  });

  test('decode: Lq 1 against 4200 and 9000 keys (K + V of 4 MiB and more: streamed one key segment of one (batch, KV head) at a time, each drawing the mask of the whole call), Lq 3 against 1500 (GQA rows packed in a tile): the reference, one and two threads, bhsd and bshd, bitwise', async () => {
    const two = await createAttention({ threads: 2 });
    try {
      for (const [shape, seed] of [
        [{ B: 2, Hq: 8, Hkv: 2, Lq: 1, Lk: 4200, E: 64, Ev: 48 }, 970],
        [{ B: 1, Hq: 4, Hkv: 4, Lq: 1, Lk: 9000, E: 64, Ev: 64 }, 971],
        [{ B: 2, Hq: 8, Hkv: 1, Lq: 3, Lk: 1500, E: 32, Ev: 32 }, 972],
      ]) {
        const { q, k, v } = problem(shape, seed);
        const { B, Hq, Lq, Lk } = shape;
        if (Lq === 1) expect((k.data.byteLength + v.data.byteLength) / 2 ** 20).toBeGreaterThanOrEqual(4);
        for (const options of [
          dropout(0.3, seed),
          { ...dropout(0.6, 2 ** 31 + seed), keyLengths: Int32Array.from({ length: B }, (_, b) => Lk - 700 * b), isCausal: true,
            causalOffset: Int32Array.from({ length: B }, (_, b) => Lk - Lq - 1000 * b), slidingWindow: 1300 },
          { ...dropout(0.1, 3), keyStarts: Int32Array.from({ length: B }, (_, b) => 511 + b), attnMask: floatMask([1, Hq, Lq, Lk], seed),
            sinks: Float32Array.from({ length: Hq }, (_, h) => h - 3), softcap: 4 },
        ]) {
          const { got } = check(q, k, v, options);
          expect(allFinite(got.output.data)).toBe(true);
          expectBitwiseEqual(two.sdpa(q, k, v, options).output.data, got.output.data);
          const bshd = attn.sdpa(swap12(q), swap12(k), swap12(v), { ...options, layout: 'bshd' });
          expectBitwiseEqual(swap12(bshd.output).data, got.output.data);
          // The weights (written after the segments are merged): the same output bits. (The log-sum-exp
          // only for the smallest K/V: returnLogSumExp hashes the inputs for `saved`, slow under Jest.)
          const small = k.data.length < 2 ** 20;
          const weighted = check(q, k, v, { ...options, returnWeights: true, ...(small ? { returnLogSumExp: true } : {}) }).got;
          expectBitwiseEqual(weighted.output.data, got.output.data);
          if (small) expectLogSumExp(weighted, q, k, v, options);
        }
      }
    } finally {
      two.dispose();
    }
  });

  test('threads 1, 2 and 3 give bitwise the same outputs and weights (above the pool threshold, and the one-thread streamed prefill size), all matching the reference', async () => {
    const instances = await Promise.all([1, 2, 3].map((threads) => createAttention({ threads })));
    try {
      const cases = [
        [{ B: 2, Hq: 1, Lq: 300, Lk: 300, E: 16, Ev: 8 }, { isCausal: true, returnWeights: true }],
        [{ B: 2, Hq: 6, Hkv: 2, Lq: 70, Lk: 450, E: 9, Ev: 5 }, { attnMask: floatMask([70, 450], 980), keyLengths: new Int32Array([450, 300]) }],
        [{ B: 3, Hq: 2, Hkv: 1, Lq: 129, Lk: 257, E: 32, Ev: 32 }, { isCausal: true, causalOffset: new Int32Array([-5, 128, 0]), softcap: 6, returnLogSumExp: true }],
        // 2 MiB of Q, K, V on one thread, a pair within 1 MiB: streamed one (batch, KV head) at a time, each drawing the mask of the whole call.
        [{ B: 2, Hq: 4, Hkv: 2, Lq: 700, Lk: 700, E: 64, Ev: 48 }, { isCausal: true, sinks: Float32Array.of(1, -1, 0, 2) }],
      ];
      for (const [n, [dims, options]] of cases.entries()) {
        const { q, k, v } = problem(dims, 981 + n);
        const withDropout = { ...options, ...dropout(0.35, 981 + n) };
        const results = instances.map((instance) => instance.sdpa(q, k, v, withDropout));
        const ref = referenceSdpa(q, k, v, withDropout);
        expect(maxRelError(results[0].output.data, ref.output)).toBeLessThanOrEqual(TOL);
        if (options.returnWeights) expect(maxRelError(results[0].weights.data, ref.weights)).toBeLessThanOrEqual(TOL);
        for (const r of results.slice(1)) {
          expectBitwiseEqual(r.output.data, results[0].output.data);
          if (options.returnWeights) expectBitwiseEqual(r.weights.data, results[0].weights.data);
          if (options.returnLogSumExp) expectBitwiseEqual(r.logSumExp.data, results[0].logSumExp.data);
        }
      }
    } finally {
      for (const instance of instances) instance.dispose();
    }
  });

  test('dropoutP 0 (any seed, or none), -0, and a p that rounds to 0 (below 2^-33) are no dropout: the bits of the call without; the seed is then not needed', () => {
    const { q, k, v } = problem({ B: 2, Hq: 4, Hkv: 2, Lq: 9, Lk: 600, E: 16 }, 990);
    for (const base of [{}, { isCausal: true, attnMask: floatMask([9, 600], 991), sinks: Float32Array.of(0, 1, -Infinity, 2) }]) {
      const all = { ...base, returnWeights: true, returnLogSumExp: true };
      const none = attn.sdpa(q, k, v, all);
      for (const extra of [{ dropoutP: 0 }, dropout(0, 12345), dropout(0, 2 ** 32 - 1), { dropoutP: -0 }, { dropoutSeed: 7 },
        { dropoutP: 2 ** -34 }, dropout(1e-12, 3)]) {
        const got = attn.sdpa(q, k, v, { ...all, ...extra });
        expectBitwiseEqual(got.output.data, none.output.data);
        expectBitwiseEqual(got.weights.data, none.weights.data);
        expectBitwiseEqual(got.logSumExp.data, none.logSumExp.data);
      }
      // The smallest p that does not round to 0: threshold 1, a mask (and the seed) needed.
      expect(() => attn.sdpa(q, k, v, { ...all, dropoutP: 2 ** -33 })).toThrow(TypeError);
      const smallest = check(q, k, v, { ...all, ...dropout(2 ** -33, 5) }).got;
      expectBitwiseEqual(smallest.logSumExp.data, none.logSumExp.data);
    }
  });

  test('the mask is the documented hash of (seed, b, h, i, j): a weight is 0 exactly where bits < t, else the softmax times 2^32/(2^32 − t); kept at bits = t', () => {
    const B = 2, Hq = 3, Hkv = 1, Lq = 5, Lk = 70;
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E: 8, Ev: 4 }, 1000);
    const softmax = attn.sdpa(q, k, v, { returnWeights: true }).weights.data;
    expect(softmax.every((w) => w > 0)).toBe(true);  // no weight underflows: each 0 below is a drop
    const expectMask = (p, seed) => {
      const got = attn.sdpa(q, k, v, { ...dropout(p, seed), returnWeights: true }).weights.data;
      const t = thresholdOf(p), factor = factorOf(p);
      let kept = 0, wrong = 0, off = 0;
      for (let b = 0; b < B; b++) {
        for (let h = 0; h < Hq; h++) {
          for (let i = 0; i < Lq; i++) {
            for (let j = 0; j < Lk; j++) {
              const n = ((b * Hq + h) * Lq + i) * Lk + j;
              if (bitsOfKey(seed, b, h, i, j) >= t) {
                kept++;
                const want = softmax[n] * factor;
                if (!(Math.abs(got[n] - want) <= 1e-6 * want)) off++;
              } else if (!Object.is(got[n], 0)) {
                wrong++;
              }
            }
          }
        }
      }
      expect([p, seed, wrong, off]).toEqual([p, seed, 0, 0]);
      return { got, kept };
    };
    for (const seed of [0, 1, 12345, 2 ** 31, 2 ** 32 - 1]) {
      for (const p of [2 ** -33, 0.05, 0.5, 0.9, 1 - 2 ** -33]) expectMask(p, seed);
    }
    // p = 1 − 2^-33: t = 2^32 − 1, a key kept only where its bits are all ones; the rows where
    // every key is dropped are exact zeros.
    const { got, kept } = expectMask(1 - 2 ** -33, 77);
    expect(kept).toBe(0);
    expect(allExactZeros(got)).toBe(true);
    expect(allExactZeros(attn.sdpa(q, k, v, dropout(1 - 2 ** -33, 77)).output.data)).toBe(true);
    // The boundary: with t equal to a key's bits it is kept, with t one more dropped.
    const X = bitsOfKey(9, 1, 2, 3, 45);
    const n = ((1 * Hq + 2) * Lq + 3) * Lk + 45;
    const at = (p) => attn.sdpa(q, k, v, { ...dropout(p, 9), returnWeights: true }).weights.data[n];
    expect(at(X / 2 ** 32)).toBeGreaterThan(softmax[n]);
    expect(Object.is(at((X + 1) / 2 ** 32), 0)).toBe(true);
  });

  test('kept fraction ≈ 1 − p (within 5σ), masks differ between seeds, heads, batches and rows; the output is the returned weights times V', () => {
    const B = 2, Hq = 4, Lq = 64, Lk = 512, E = 8, Ev = 6;
    const { q, k, v } = problem({ B, Hq, Lq, Lk, E, Ev }, 1010);
    const softmax = attn.sdpa(q, k, v, { returnWeights: true }).weights.data;
    const n = softmax.length;
    expect(softmax.every((w) => w > 0)).toBe(true);
    for (const p of [0.1, 0.5, 0.9]) {
      const masks = [11, 12].map((seed) => attn.sdpa(q, k, v, { ...dropout(p, seed), returnWeights: true }));
      for (const { weights } of masks) {
        const kept = weights.data.reduce((count, w) => count + (w > 0 ? 1 : 0), 0);
        const sigma = Math.sqrt(n * p * (1 - p));
        expect(Math.abs(kept - n * (1 - p))).toBeLessThanOrEqual(5 * sigma);
      }
      // Another seed: another mask (about 2p(1 − p)·n keys differ).
      let differ = 0;
      for (let m = 0; m < n; m++) if ((masks[0].weights.data[m] > 0) !== (masks[1].weights.data[m] > 0)) differ++;
      expect(Math.abs(differ - 2 * p * (1 - p) * n)).toBeLessThanOrEqual(5 * Math.sqrt(n));
      // Every row its own mask: no two (b, h, i) rows of 512 keys the same.
      const rows = new Set();
      for (let r = 0; r < B * Hq * Lq; r++) {
        rows.add(Array.from(masks[0].weights.data.subarray(r * Lk, (r + 1) * Lk), (w) => (w > 0 ? 1 : 0)).join(''));
      }
      expect(rows.size).toBe(B * Hq * Lq);
      // output row = Σ_j weights_j · v_j, in float64 from the returned (float32) weights.
      const { output, weights } = masks[0];
      let worst = 0;
      for (let r = 0; r < B * Hq * Lq; r++) {
        const b = Math.floor(r / (Hq * Lq)), h = Math.floor(r / Lq) % Hq;
        for (let c = 0; c < Ev; c++) {
          let sum = 0;
          for (let j = 0; j < Lk; j++) sum += weights.data[r * Lk + j] * v.data[((b * Hq + h) * Lk + j) * Ev + c];
          worst = Math.max(worst, Math.abs(output.data[r * Ev + c] - sum) / (1 + Math.abs(sum)));
        }
      }
      expect(worst).toBeLessThanOrEqual(TOL);
      // The same call again: the same bits (the mask is a function of the seed alone).
      expectBitwiseEqual(attn.sdpa(q, k, v, { ...dropout(p, 11), returnWeights: true }).weights.data, masks[0].weights.data);
    }
  });

  test('the mean over many seeds approaches the output without dropout (the expectation of each weight is the softmax)', () => {
    const { q, k, v } = problem({ B: 1, Hq: 2, Lq: 4, Lk: 16, E: 8, Ev: 8 }, 1020);
    const plain = attn.sdpa(q, k, v).output.data;
    const N = 3000, p = 0.5;
    const sum = new Float64Array(plain.length), squares = new Float64Array(plain.length);
    for (let seed = 0; seed < N; seed++) {
      const out = attn.sdpa(q, k, v, dropout(p, seed * 7919 + 1)).output.data;
      for (let n = 0; n < out.length; n++) {
        sum[n] += out[n];
        squares[n] += out[n] * out[n];
      }
    }
    for (let n = 0; n < plain.length; n++) {
      const mean = sum[n] / N, sd = Math.sqrt(Math.max(squares[n] / N - mean * mean, 0));
      expect(sd).toBeGreaterThan(0);  // dropout did change the outputs
      expect(Math.abs(mean - plain[n])).toBeLessThanOrEqual(5 * sd / Math.sqrt(N) + 1e-6);
    }
  });
});

describe('keyLengths', () => {
  test('lengths 0, 1, 32, 33, Lk with NaN written into the padded keys of K and V', () => {
    const B = 5, Hq = 4, Hkv = 2, Lq = 7, Lk = 70, E = 10, Ev = 6;
    const lengths = [0, 1, 32, 33, Lk];
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 150);
    for (let b = 0; b < B; b++) {
      for (let h = 0; h < Hkv; h++) {
        for (let j = lengths[b]; j < Lk; j++) {
          k.data.fill(NaN, ((b * Hkv + h) * Lk + j) * E, ((b * Hkv + h) * Lk + j + 1) * E);
          v.data.fill(NaN, ((b * Hkv + h) * Lk + j) * Ev, ((b * Hkv + h) * Lk + j + 1) * Ev);
        }
      }
    }
    const keyLengths = new Int32Array(lengths);
    for (const extra of [{}, { isCausal: true }, { isCausal: true, causalOffset: Lk - Lq }, { attnMask: floatMask([Lq, Lk], 151) }, { softcap: 3 }]) {
      const { got } = check(q, k, v, { keyLengths, returnWeights: true, ...extra });
      expect(allFinite(got.output.data)).toBe(true);
      expect(allFinite(got.weights.data)).toBe(true);
      for (let h = 0; h < Hq; h++) {
        for (let i = 0; i < Lq; i++) {
          // keyLengths 0: nothing to attend, exact zeros.
          expect(allExactZeros(rowOf(got.output.data, [B, Hq, Lq, Ev], 0, h, i))).toBe(true);
          for (let b = 0; b < B; b++) {
            const w = rowOf(got.weights.data, [B, Hq, Lq, Lk], b, h, i);
            expect(allExactZeros(w.subarray(lengths[b]))).toBe(true);
          }
        }
      }
    }
  });

  test("keyLengths with layout 'bshd' and NaN padding", () => {
    const B = 3, Hq = 2, Hkv = 2, Lq = 5, Lk = 41, E = 5, Ev = 7;
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 152);
    const ks = swap12(k), vs = swap12(v);  // [B, Lk, Hkv, D]
    const lengths = [41, 0, 13];
    for (let b = 0; b < B; b++) {
      ks.data.fill(NaN, (b * Lk + lengths[b]) * Hkv * E, (b + 1) * Lk * Hkv * E);
      vs.data.fill(NaN, (b * Lk + lengths[b]) * Hkv * Ev, (b + 1) * Lk * Hkv * Ev);
    }
    const { got } = check(swap12(q), ks, vs, { layout: 'bshd', keyLengths: new Int32Array(lengths), returnWeights: true });
    expect(allFinite(got.output.data)).toBe(true);
  });

  test('keyLengths equal to Lk is the same as no keyLengths', () => {
    const { q, k, v } = problem({ B: 2, Lq: 6, Lk: 33, E: 4 }, 153);
    const a = attn.sdpa(q, k, v, { keyLengths: new Int32Array([33, 33]) }).output.data;
    expectSameResult(a, attn.sdpa(q, k, v).output.data);
  });
});

describe('NaN in keys no row may attend never reaches the output', () => {
  test('keys past the causal frontier of the last row', () => {
    const Lq = 6, Lk = 45, E = 8, Ev = 8;
    const { q, k, v } = problem({ Hq: 2, Lq, Lk, E, Ev }, 160);
    for (let h = 0; h < 2; h++) {
      k.data.fill(NaN, (h * Lk + Lq) * E, (h + 1) * Lk * E);
      v.data.fill(NaN, (h * Lk + Lq) * Ev, (h + 1) * Lk * Ev);
    }
    const { got } = check(q, k, v, { isCausal: true, returnWeights: true });
    expect(allFinite(got.output.data)).toBe(true);
  });

  test('keys blocked for every row by a bool mask or a -Infinity float mask', () => {
    const Lq = 9, Lk = 40, E = 4, Ev = 5;
    const { q, k, v } = problem({ Lq, Lk, E, Ev }, 161);
    const blocked = [0, 3, 31, 32, 39];
    const bool = { data: new Uint8Array(Lk).fill(1), dims: [Lk] };
    const float = { data: new Float32Array(Lk), dims: [1, 1, 1, Lk] };
    for (const j of blocked) {
      k.data.fill(NaN, j * E, (j + 1) * E);
      v.data.fill(NaN, j * Ev, (j + 1) * Ev);
      bool.data[j] = 0;
      float.data[j] = -Infinity;
    }
    for (const attnMask of [bool, float]) {
      const { got } = check(q, k, v, { attnMask, returnWeights: true });
      expect(allFinite(got.output.data)).toBe(true);
      expect(allFinite(got.weights.data)).toBe(true);
    }
  });
});

describe("masks read 16 keys at a time: where a tile's first blocked key falls", () => {
  // The bias of a mask contiguous along keys is built 16 (boolean) or 4 (float) keys at a
  // time, and the query heads of a GQA group share their row. The first blocked key of a tile
  // decides which keys P·V may multiply without looking: keys blocked for every row hold NaN
  // here, so a wrong first key would put NaN in the output.
  test.each([0, 1, 3, 4, 7, 15])('first blocked key %i into a chunk; GQA, causal rows ending apart, tiles 0-2', (o) => {
    const Lq = 3, Lk = 1100, E = 8, Ev = 6;
    const { q, k, v } = problem({ Hq: 8, Hkv: 2, Lq, Lk, E, Ev }, 190 + o);
    const blocked = [o, 16 + o + 1, 100 + o, 511, 512 + o, 527, 1024 + o, 1099];
    const bool = { data: new Uint8Array(Lk).fill(1), dims: [Lk] };
    const float = { data: Float32Array.from({ length: Lk }, (_, j) => (j % 5) * 0.3), dims: [1, 1, 1, Lk] };
    for (const j of blocked) {
      for (let h = 0; h < 2; h++) {
        k.data.fill(NaN, (h * Lk + j) * E, (h * Lk + j + 1) * E);
        v.data.fill(NaN, (h * Lk + j) * Ev, (h * Lk + j + 1) * Ev);
      }
      bool.data[j] = 0;
      float.data[j] = -Infinity;
    }
    for (const attnMask of [bool, float]) {
      for (const options of [{ attnMask }, { attnMask, isCausal: true, causalOffset: Lk - Lq - 20 }]) {
        const { got } = check(q, k, v, { ...options, returnWeights: true });
        expect(allFinite(got.output.data)).toBe(true);
        // One query row per KV head, from a cache: the decode path.
        const cache = attn.createKVCache({ batch: 1, kvHeads: 2, headDim: E, valueDim: Ev, maxLength: Lk });
        try {
          cache.append(k, v);
          const one = { data: q.data.subarray(0, 8 * E).slice(), dims: [1, 8, 1, E] };
          const r = cache.attend(one, { ...options, isCausal: options.isCausal ?? false });
          const ref = referenceSdpa(one, k, v, { ...options, isCausal: options.isCausal ?? false });
          expect(maxRelError(r.output.data, ref.output)).toBeLessThanOrEqual(TOL);
          expect(allFinite(r.output.data)).toBe(true);
        } finally {
          cache.dispose();
        }
      }
    }
  });
});

describe('softcap and scale', () => {
  test.each([0.5, 5, 30, 1e6])('softcap %p', (softcap) => {
    const { q, k, v } = problem({ B: 2, Hq: 2, Lq: 9, Lk: 37, E: 16, Ev: 8 }, 170);
    check(q, k, v, { softcap, scale: 1, returnWeights: true });
    check(q, k, v, { softcap, attnMask: floatMask([9, 37], 171), isCausal: true, causalOffset: 28 });
  });

  test('softcap applies after scale and before the mask', () => {
    // With scale s and cap c, a score x becomes c·tanh(s·x/c) + mask: for a large score the
    // capped value is at most c, so a bias of +c·4 on one key makes it dominate.
    const Lq = 3, Lk = 8, E = 2;
    const q = { data: new Float32Array([10, 0, 0, 10, 5, 5]), dims: [Lq, E] };
    const k = randomTensor([Lk, E], 172);
    const v = randomTensor([Lk, 4], 173);
    const mask = { data: new Float32Array(Lk), dims: [Lk] };
    mask.data[5] = 8;
    check(q, k, v, { scale: 3, softcap: 2, attnMask: mask, returnWeights: true });
  });

  test.each([-0.7, 0, 3, 1e-3, -40])('scale %p', (scale) => {
    const { q, k, v } = problem({ Hq: 3, Hkv: 1, Lq: 8, Lk: 35, E: 12, Ev: 4 }, 174);
    const { got } = check(q, k, v, { scale, returnWeights: true });
    if (scale === 0) {
      // Every score is 0: uniform weights, output = mean of V rows.
      for (const w of got.weights.data) expect(Math.abs(w - 1 / 35)).toBeLessThanOrEqual(1e-6);
    }
  });
});

describe('fully masked rows', () => {
  const B = 2, Hq = 2, Lq = 9, Lk = 100, E = 8, Ev = 12;
  const EMPTY = [0, 5, 8];  // row 5 shares its 4-row tile with rows 4, 6, 7
  test.each(['bool', 'float'])('%s mask: exact zeros in output and weights, others normal', (kind) => {
    const { q, k, v } = problem({ B, Hq, Lq, Lk, E, Ev }, 180);
    const mask = kind === 'bool' ? boolMask([Lq, Lk], 181, 0.3) : floatMask([Lq, Lk], 181, 0.7);
    for (const i of EMPTY) mask.data.fill(kind === 'bool' ? 0 : -Infinity, i * Lk, (i + 1) * Lk);
    // Also one row that may only attend a single key, in the last tile.
    mask.data.fill(kind === 'bool' ? 0 : -Infinity, 2 * Lk, 3 * Lk);
    mask.data[2 * Lk + 99] = kind === 'bool' ? 1 : 0;
    const { got } = check(q, k, v, { attnMask: mask, returnWeights: true });
    for (let b = 0; b < B; b++) {
      for (let h = 0; h < Hq; h++) {
        for (let i = 0; i < Lq; i++) {
          const out = rowOf(got.output.data, [B, Hq, Lq, Ev], b, h, i);
          const w = rowOf(got.weights.data, [B, Hq, Lq, Lk], b, h, i);
          if (EMPTY.includes(i)) {
            expect(allExactZeros(out)).toBe(true);
            expect(allExactZeros(w)).toBe(true);
          } else {
            expect(allFinite(out)).toBe(true);
          }
          if (i === 2) {
            expect(w[99]).toBe(1);
            expectBitwiseEqual(out, v.data.subarray(((b * Hq + h) * Lk + 99) * Ev, ((b * Hq + h) * Lk + 100) * Ev));
          }
        }
      }
    }
  });
});

describe('returnWeights', () => {
  test('rows sum to 1 (empty rows to 0), dims [..., Hq, Lq, Lk]', () => {
    const B = 2, Hq = 6, Hkv = 3, Lq = 21, Lk = 77, E = 16, Ev = 3;
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 190);
    const { got } = check(q, k, v, {
      returnWeights: true, isCausal: true, causalOffset: -2, attnMask: boolMask([B, 1, Lq, Lk], 191, 0.8),
    });
    expect(got.weights.dims).toEqual([B, Hq, Lq, Lk]);
    let outOfRange = 0, badSums = 0, rowsSummingTo1 = 0;
    for (let r = 0; r < B * Hq * Lq; r++) {
      const w = got.weights.data.subarray(r * Lk, (r + 1) * Lk);
      let sum = 0;
      for (const x of w) {
        if (!(x >= 0 && x <= 1)) outOfRange++;
        sum += x;
      }
      if (r % Lq < 2) {
        if (sum !== 0) badSums++;  // causalOffset -2: rows 0 and 1 see nothing
      } else if (sum !== 0) {
        if (Math.abs(sum - 1) > 1e-5) badSums++;
        else rowsSummingTo1++;
      }
    }
    expect(outOfRange).toBe(0);
    expect(badSums).toBe(0);
    expect(rowsSummingTo1).toBeGreaterThan(B * Hq * (Lq - 2) * 0.9);
  });

  test('returnWeights: false returns no weights and the same output', () => {
    const { q, k, v } = problem({ Lq: 5, Lk: 9, E: 4 }, 192);
    const a = attn.sdpa(q, k, v, { returnWeights: false });
    const b = attn.sdpa(q, k, v, { returnWeights: true });
    expect(a.weights).toBeUndefined();
    expectSameResult(a.output.data, b.output.data);
  });
});

describe('out option', () => {
  const dims = { B: 2, Hq: 2, Lq: 7, Lk: 19, E: 5, Ev: 6 };
  const n = 2 * 2 * 7 * 6;

  test('an exactly sized buffer is filled and returned', () => {
    const { q, k, v } = problem(dims, 200);
    const expected = attn.sdpa(q, k, v).output.data;
    const out = new Float32Array(n).fill(NaN);
    const r = attn.sdpa(q, k, v, { out, returnWeights: true });
    expect(r.output.data).toBe(out);
    expect(r.output.dims).toEqual([2, 2, 7, 6]);
    expectBitwiseEqual(out, expected);
    check(q, k, v, { out: new Float32Array(n), isCausal: true });
  });

  test('a larger buffer: the output is a view of its start, the rest is untouched', () => {
    const { q, k, v } = problem(dims, 201);
    const expected = attn.sdpa(q, k, v).output.data;
    const out = new Float32Array(n + 13).fill(42);
    const r = attn.sdpa(q, k, v, { out });
    expect(r.output.data.buffer).toBe(out.buffer);
    expect(r.output.data.byteOffset).toBe(0);
    expect(r.output.data.length).toBe(n);
    expectBitwiseEqual(out.subarray(0, n), expected);
    expect(Array.from(out.subarray(n))).toEqual(new Array(13).fill(42));
  });

  test('a subarray of a larger buffer (non-zero byteOffset)', () => {
    const { q, k, v } = problem(dims, 202);
    const expected = attn.sdpa(q, k, v).output.data;
    const backing = new Float32Array(n + 10).fill(7);
    const out = backing.subarray(5, 5 + n);
    const r = attn.sdpa(q, k, v, { out });
    expect(r.output.data).toBe(out);
    expectBitwiseEqual(out, expected);
    expect(Array.from(backing.subarray(0, 5))).toEqual([7, 7, 7, 7, 7]);
    expect(Array.from(backing.subarray(5 + n))).toEqual([7, 7, 7, 7, 7]);
  });
});

describe('inputs and determinism', () => {
  test('inputs and options are never modified', () => {
    const B = 2, Hq = 4, Hkv = 2, Lq = 9, Lk = 40, E = 8, Ev = 8;
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 210);
    k.data[3] = NaN;  // NaN in an attended key: the output may be NaN, K must stay as it was
    const qs = swap12(q), ks = swap12(k), vs = swap12(v);  // the bshd copies
    const floatM = floatMask([B, 1, Lq, Lk], 211);
    const boolM = boolMask([Lq, Lk], 212);
    const keyLengths = new Int32Array([40, 21]);
    const causalOffset = new Int32Array([-5, 2 ** 31 - 1]);  // clamped internally, not in place
    const arrays = () => [q, k, v, qs, ks, vs, floatM, boolM].map((t) => t.data).concat([keyLengths, causalOffset]);
    const dimsOf = () => JSON.stringify([q, k, v, qs, ks, vs, floatM, boolM].map((t) => t.dims));
    const snapshot = arrays().map(rawBytes);
    const dimsBefore = dimsOf();
    for (const attnMask of [floatM, boolM]) {
      const options = { attnMask, keyLengths, isCausal: true, causalOffset, returnWeights: true, softcap: 4 };
      const optionsBefore = { ...options };
      attn.sdpa(q, k, v, options);
      attn.sdpa(qs, ks, vs, { ...options, layout: 'bshd' });
      expect(options).toEqual(optionsBefore);
    }
    arrays().map(rawBytes).forEach((bytes, i) => expect(bytes).toEqual(snapshot[i]));
    expect(dimsOf()).toBe(dimsBefore);
  });

  test('repeated calls give bitwise-identical outputs and weights', () => {
    const { q, k, v } = problem({ B: 2, Hq: 4, Hkv: 1, Lq: 33, Lk: 97, E: 24, Ev: 16 }, 220);
    const options = { attnMask: floatMask([33, 97], 221), isCausal: true, causalOffset: 64, returnWeights: true, softcap: 7 };
    const first = attn.sdpa(q, k, v, options);
    const other = problem({ B: 1, Hq: 2, Lq: 100, Lk: 300, E: 24, Ev: 16 }, 222);
    attn.sdpa(other.q, other.k, other.v, { returnWeights: true });  // different problem in between
    for (let rep = 0; rep < 3; rep++) {
      const again = attn.sdpa(q, k, v, options);
      expectBitwiseEqual(again.output.data, first.output.data);
      expectBitwiseEqual(again.weights.data, first.weights.data);
    }
    // A second instance (same module) agrees too.
    return createAttention().then((second) => {
      const r = second.sdpa(q, k, v, options);
      expectBitwiseEqual(r.output.data, first.output.data);
      second.dispose();
    });
  });
});

describe('decode shapes: few query rows per KV head, long keys', () => {
  // Lq of 1-4 with up to 16 query heads per KV head, Lk around multiples of 512 keys: the
  // shapes of a KV-cache decode step (in this package a separate code path that reads K/V in
  // place and splits long key ranges into segments merged afterwards), up to 32 query rows
  // per KV head (8 row tiles), and 36 (packed like a prompt) for the edge.
  const SHAPES = [
    // [Hq, Hkv, Lq]
    [1, 1, 1], [4, 1, 1], [8, 1, 1], [8, 2, 1], [4, 1, 2], [2, 1, 3], [3, 3, 2], [8, 1, 2],
    [14, 1, 1], [28, 2, 1], [16, 1, 2], [8, 1, 4], [12, 1, 3], [4, 1, 9],
  ];
  const LKS = [1, 33, 511, 512, 513, 1100, 2049];
  test.each(SHAPES)('Hq = %i, Hkv = %i, Lq = %i, Lk in {1,33,511,512,513,1100,2049}', (Hq, Hkv, Lq) => {
    const B = 2, E = 12, Ev = 10;
    for (const Lk of LKS) {
      const seed = Hq * 100000 + Hkv * 10000 + Lq * 1000 + Lk;
      const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, seed);
      const plain = check(q, k, v);
      const weighted = check(q, k, v, { returnWeights: true });
      // The weights are written after the key segments are merged: the output keeps its bits
      // (the call with weights runs forward() on copies, the one without streams segments).
      expectBitwiseEqual(weighted.got.output.data, plain.got.output.data);
      check(q, k, v, { isCausal: true, causalOffset: Lk - Lq });
      // Only the first keys visible: later key segments attend nothing.
      check(q, k, v, { isCausal: true, causalOffset: Math.min(40, Lk) - Lq });
      check(q, k, v, { keyLengths: new Int32Array([Lk, Math.floor(Lk / 3)]) });
      check(q, k, v, { attnMask: floatMask([1, Hq, 1, Lk], seed + 1), softcap: 3 });
      const masked = { attnMask: boolMask([B, Hq, Lq, Lk], seed + 2, 0.5), scale: 0.9 };
      const maskedPlain = check(q, k, v, masked);
      expectBitwiseEqual(check(q, k, v, { ...masked, returnWeights: true }).got.output.data, maskedPlain.got.output.data);
    }
  });

  test('NaN past keyLengths, read in place with both layouts; lengths 0, 1, 512, 513, 1500', () => {
    const B = 5, Hq = 8, Hkv = 2, Lq = 1, Lk = 1500, E = 16, Ev = 16;
    const lengths = [0, 1, 512, 513, 1500];
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 280);
    for (let b = 0; b < B; b++) {
      for (let h = 0; h < Hkv; h++) {
        k.data.fill(NaN, ((b * Hkv + h) * Lk + lengths[b]) * E, ((b * Hkv + h) + 1) * Lk * E);
        v.data.fill(NaN, ((b * Hkv + h) * Lk + lengths[b]) * Ev, ((b * Hkv + h) + 1) * Lk * Ev);
      }
    }
    const keyLengths = new Int32Array(lengths);
    for (const extra of [{}, { returnWeights: true }, { isCausal: true, causalOffset: new Int32Array([0, 0, 600, 511, 1499]) }]) {
      const { got } = check(q, k, v, { keyLengths, ...extra });
      expect(allFinite(got.output.data)).toBe(true);
      expect(allExactZeros(got.output.data.subarray(0, Hq * Lq * Ev))).toBe(true);  // keyLengths[0] = 0
      const bshd = check(swap12(q), swap12(k), swap12(v), { keyLengths, layout: 'bshd', ...extra });
      expect(allFinite(bshd.got.output.data)).toBe(true);
    }
  });

  test('sliding windows over many key segments: the segments outside skipped, NaN outside never read', async () => {
    // A decode's 512-key segments that the mask blocks for every row are skipped before
    // anything is prepared (work_attends_any_key in the kernel). Windows at the start, inside
    // one segment, across a segment edge, exactly one segment, at the end; a boolean mask
    // broadcast over the heads (scanned once for a GQA group) and a float mask per head
    // (finite inside, -inf outside; narrower for some heads, and for others the 200 keys after
    // the window, which may lie in segments the group's earlier heads do not attend); NaN in K
    // and V outside every head's window. sdpa() on one and two threads (bitwise) and the attend
    // of a float32 and of a float16 KV cache (against the reference on K/V rounded to halves:
    // the storage's rounding is its only error).
    const B = 2, Hq = 8, Hkv = 2, Lq = 1, Lk = 2600, E = 16, Ev = 12;
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 290);
    const kHalves = roundedToHalves(k), vHalves = roundedToHalves(v);  // what a float16 cache holds
    const [one, two] = await Promise.all([createAttention({ threads: 1 }), createAttention({ threads: 2 })]);
    try {
      for (const [start, width] of [[0, 100], [700, 300], [1000, 100], [1536, 512], [2100, 500], [2599, 1]]) {
        const end = start + width, unionEnd = Math.min(Lk, end + 200);
        const kw = { data: k.data.slice(), dims: k.dims }, vw = { data: v.data.slice(), dims: v.dims };
        for (let bh = 0; bh < B * Hkv; bh++) {
          for (const [t, D] of [[kw, E], [vw, Ev]]) {
            t.data.fill(NaN, bh * Lk * D, (bh * Lk + start) * D);
            t.data.fill(NaN, (bh * Lk + unionEnd) * D, (bh + 1) * Lk * D);
          }
        }
        const kwHalves = roundedToHalves(kw), vwHalves = roundedToHalves(vw);
        const bool = { data: new Uint8Array(Lk).fill(1, start, end), dims: [Lk] };
        const float = floatMask([1, Hq, 1, Lk], 291 + start, 0);
        for (let h = 0; h < Hq; h++) {
          // Heads 0, 3, 6: the window; 1, 4, 7: its second half; 2, 5: the keys after it.
          const [from, to] = [[start, end], [start + Math.floor(width / 2), end], [end, unionEnd]][h % 3];
          float.data.fill(-Infinity, h * Lk, h * Lk + from);
          float.data.fill(-Infinity, h * Lk + to, (h + 1) * Lk);
        }
        for (const attnMask of [bool, float]) {
          const { got } = check(q, kw, vw, { attnMask });
          expect(allFinite(got.output.data)).toBe(true);
          const single = one.sdpa(q, kw, vw, { attnMask }).output.data;
          expectBitwiseEqual(two.sdpa(q, kw, vw, { attnMask }).output.data, single);
          // Float16 also without the NaN: a cache of finite halves is widened the cheaper way
          // (KvType kFloat16Finite), one holding NaN the exact way.
          const caches = [['float32', kw, vw, kw, vw], ['float16', kw, vw, kwHalves, vwHalves], ['float16', k, v, kHalves, vHalves]];
          for (const [dtype, keys, values, storedKeys, storedValues] of caches) {
            const cache = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: Lk, dtype });
            try {
              cache.append(keys, values);
              const fromCache = cache.attend(q, { attnMask, isCausal: false }).output.data;
              const ref = referenceSdpa(q, storedKeys, storedValues, { attnMask }).output;
              expect(maxRelError(fromCache, ref)).toBeLessThanOrEqual(TOL);
            } finally {
              cache.dispose();
            }
          }
        }
      }
    } finally {
      one.dispose();
      two.dispose();
    }
  });

  test('windows starting inside a key tile: the keys before them not scored, NaN there never read', () => {
    // A mask whose allowed keys start inside a 512-key tile for every row of a row tile: the
    // kernel works on the tile from that column (rounded down to 8 keys) on. Starts at tile
    // offsets 1, 7, 8, 9, 255, 504, 511 (and rows of one tile starting at different offsets),
    // for a prompt (K/V packed, 40 rows) and a decode (read in place, 4 rows).
    const B = 1, Hkv = 1, Lk = 1600, E = 8, Ev = 8;
    for (const [Hq, Lq] of [[1, 40], [4, 1]]) {
      for (const offset of [1, 7, 8, 9, 255, 504, 511]) {
        const start = 512 + offset, width = 300;
        const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 292 + offset);
        const rows = Hq * Lq;
        const mask = { data: new Uint8Array(rows * Lk), dims: [1, Hq, Lq, Lk] };
        let first = Lk, last = 0;
        for (let f = 0; f < rows; f++) {
          const from = Math.min(Lk - 1, start + (f % 4) * (f % 3));  // some rows start later
          mask.data.fill(1, f * Lk + from, f * Lk + Math.min(Lk, from + width));
          first = Math.min(first, from), last = Math.max(last, Math.min(Lk, from + width));
        }
        k.data.fill(NaN, 0, first * E), v.data.fill(NaN, 0, first * Ev);
        k.data.fill(NaN, last * E), v.data.fill(NaN, last * Ev);
        const { got } = check(q, k, v, { attnMask: mask });
        expect(allFinite(got.output.data)).toBe(true);
        check(q, k, v, { attnMask: mask, softcap: 2 });
      }
    }
  });

  test('rows fully masked in some key segments only, and in all of them', () => {
    const B = 1, Hq = 4, Hkv = 1, Lq = 1, Lk = 1600, E = 8, Ev = 8;
    const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 281);
    const mask = { data: new Uint8Array(Hq * Lk), dims: [1, Hq, 1, Lk] };
    mask.data[0 * Lk + 1599] = 1;                     // head 0: only the last key
    mask.data.fill(1, 1 * Lk + 500, 1 * Lk + 530);   // head 1: keys 500..529, across a 512 boundary
    // head 2: nothing at all
    mask.data[3 * Lk + 0] = 1;                        // head 3: only the first key
    const { got } = check(q, k, v, { attnMask: mask, returnWeights: true });
    const noWeights = check(q, k, v, { attnMask: mask }).got;
    expect(allExactZeros(rowOf(got.output.data, [1, Hq, 1, Ev], 0, 2, 0))).toBe(true);
    expect(allExactZeros(rowOf(noWeights.output.data, [1, Hq, 1, Ev], 0, 2, 0))).toBe(true);
    expect(allFinite(noWeights.output.data)).toBe(true);
    expectBitwiseEqual(rowOf(noWeights.output.data, [1, Hq, 1, Ev], 0, 0, 0), v.data.subarray(1599 * Ev, 1600 * Ev));
    expectBitwiseEqual(rowOf(noWeights.output.data, [1, Hq, 1, Ev], 0, 3, 0), v.data.subarray(0, Ev));
  });
});

describe('decode streamed one segment of one (batch, KV head) at a time', () => {
  // K and V of at least 4 MiB in a decode shape are copied into wasm memory and computed one
  // segment of keys of one (batch, KV head) at a time (js/index.ts, STREAM_MIN_BYTES;
  // src/sdpa.h, forward_segment): every pointer (query, output, mask, per-batch offsets and
  // key lengths) is moved to the pair's rows, K/V to the segment's keys. 'bshd' inputs take
  // the whole-copy path, so the two layouts must agree bit for bit. Lk = 4200 ends in a
  // partial segment; for b = 0 the last segments lie wholly past the key length.
  const B = 2, Hq = 8, Hkv = 2, Lq = 1, Lk = 4200, E = 64, Ev = 48;
  const { q, k, v } = problem({ B, Hq, Hkv, Lq, Lk, E, Ev }, 290);
  const lengths = [3000, 4200];
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < Hkv; h++) {
      k.data.fill(NaN, ((b * Hkv + h) * Lk + lengths[b]) * E, ((b * Hkv + h) + 1) * Lk * E);
      v.data.fill(NaN, ((b * Hkv + h) * Lk + lengths[b]) * Ev, ((b * Hkv + h) + 1) * Lk * Ev);
    }
  }
  expect((k.data.byteLength + v.data.byteLength) / 2 ** 20).toBeGreaterThanOrEqual(4);
  const keyLengths = new Int32Array(lengths);
  const cases = {
    'key lengths (NaN past them)': { keyLengths },
    'float mask [B, 1, 1, Lk] and softcap': { keyLengths, attnMask: floatMask([B, 1, 1, Lk], 291), softcap: 4 },
    'bool mask [1, Hq, 1, Lk]': { keyLengths, attnMask: boolMask([1, Hq, 1, Lk], 292, 0.6) },
    'bool mask [B, Hq, Lq, Lk]': { keyLengths, attnMask: boolMask([B, Hq, Lq, Lk], 293, 0.4) },
    'per-batch causal offsets, one row empty': { keyLengths, isCausal: true, causalOffset: new Int32Array([-1, 2000]) },
    'sliding window starting inside a segment, segments before it skipped': {
      keyLengths, isCausal: true, causalOffset: new Int32Array([2999, 4199]), slidingWindow: 1300,
    },
    'keyStarts (left padding) inside and on a segment edge': { keyLengths, keyStarts: new Int32Array([700, 1024]) },
    'sinks, each pair with its own heads\' (one row empty)': {
      keyLengths, isCausal: true, causalOffset: new Int32Array([-1, 4199]), sinks: Float32Array.from({ length: Hq }, (_, h) => h - 3),
    },
  };
  test.each(Object.keys(cases))('%s: matches the reference and the unstreamed bshd layout bitwise', (name) => {
    const options = cases[name];
    const { got } = check(q, k, v, options);
    expect(allFinite(got.output.data)).toBe(true);
    const bshd = attn.sdpa(swap12(q), swap12(k), swap12(v), { ...options, layout: 'bshd' });
    expectBitwiseEqual(swap12({ data: bshd.output.data, dims: bshd.output.dims }).data, got.output.data);
  });
  test('an empty row in the stream is exact zeros', () => {
    const { got } = check(q, k, v, cases['per-batch causal offsets, one row empty']);
    for (let h = 0; h < Hq; h++) expect(allExactZeros(rowOf(got.output.data, [B, Hq, Lq, Ev], 0, h, 0))).toBe(true);
  });
  test('a single (batch, KV head) streams too, and matches the reference and the bshd layout bitwise', () => {
    const one = problem({ B: 1, Hq: 4, Hkv: 1, Lq: 1, Lk: 9000, E: 64, Ev: 64 }, 294);
    expect((one.k.data.byteLength + one.v.data.byteLength) / 2 ** 20).toBeGreaterThanOrEqual(4);
    const options = { attnMask: floatMask([1, 4, 1, 9000], 295) };
    const { got } = check(one.q, one.k, one.v, options);
    const bshd = attn.sdpa(swap12(one.q), swap12(one.k), swap12(one.v), { ...options, layout: 'bshd' });
    expectBitwiseEqual(swap12({ data: bshd.output.data, dims: bshd.output.dims }).data, got.output.data);
  });
});

describe('prefill streamed one (batch, KV head) at a time', () => {
  // On one thread, bhsd prefill with Q, K and V of at least 2 MiB together and at most 1 MiB
  // of Q, K, V and output per (batch, KV head) (as here: 940 KB) is copied in,
  // computed and copied out one (batch, KV head) at a time (js/strategies.ts,
  // PREFILL_STREAM_MIN_BYTES), every pointer moved to the pair's rows; 'bshd' inputs and
  // instances with threads > 1 take the whole-copy path, so all must agree bit for bit.
  const B = 2, Hq = 4, Hkv = 2, L = 700, E = 64, Ev = 48;
  const { q, k, v } = problem({ B, Hq, Hkv, Lq: L, Lk: L, E, Ev }, 300);
  const lengths = [520, 700];
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < Hkv; h++) {
      k.data.fill(NaN, ((b * Hkv + h) * L + lengths[b]) * E, ((b * Hkv + h) + 1) * L * E);
      v.data.fill(NaN, ((b * Hkv + h) * L + lengths[b]) * Ev, ((b * Hkv + h) + 1) * L * Ev);
    }
  }
  expect((q.data.byteLength + k.data.byteLength + v.data.byteLength) / 2 ** 20).toBeGreaterThanOrEqual(2);
  const keyLengths = new Int32Array(lengths);
  const cases = {
    'key lengths (NaN past them)': { keyLengths },
    'float mask [B, 1, 1, Lk] and softcap': { keyLengths, attnMask: floatMask([B, 1, 1, L], 301), softcap: 4 },
    'bool mask [1, Hq, Lq, Lk]': { keyLengths, attnMask: boolMask([1, Hq, L, L], 302, 0.6) },
    'per-batch causal offsets, some rows empty': { keyLengths, isCausal: true, causalOffset: new Int32Array([-3, 100]) },
    'sliding window, per-batch offsets': { keyLengths, isCausal: true, causalOffset: new Int32Array([0, 100]), slidingWindow: 70 },
    'keyStarts (left padding)': { keyLengths, keyStarts: new Int32Array([5, 30]) },
    'sinks, each pair with its own heads\'': { keyLengths, isCausal: true, sinks: Float32Array.from({ length: Hq }, (_, h) => 2 * h - 3) },
  };
  let single, two;
  beforeAll(async () => {
    [single, two] = await Promise.all([createAttention({ threads: 1 }), createAttention({ threads: 2 })]);
  });
  afterAll(() => { single.dispose(); two.dispose(); });

  test.each(Object.keys(cases))('%s: matches the reference, the bshd layout and two threads bitwise', (name) => {
    const options = cases[name];
    const got = single.sdpa(q, k, v, options).output.data;
    expect(maxRelError(got, referenceSdpa(q, k, v, options).output)).toBeLessThanOrEqual(TOL);
    const bshd = single.sdpa(swap12(q), swap12(k), swap12(v), { ...options, layout: 'bshd' });
    expectBitwiseEqual(swap12({ data: bshd.output.data, dims: bshd.output.dims }).data, got);
    expect(two.threads).toBe(2);
    expectBitwiseEqual(two.sdpa(q, k, v, options).output.data, got);
  });
  test('rows with no key left are exact zeros', () => {
    const got = single.sdpa(q, k, v, cases['per-batch causal offsets, some rows empty']).output.data;
    for (let h = 0; h < Hq; h++) {
      for (let i = 0; i < 3; i++) expect(allExactZeros(rowOf(got, [B, Hq, L, Ev], 0, h, i))).toBe(true);
    }
  });
  test('an out array that is also an input (in place) gives the same result', () => {
    const square = problem({ B, Hq: 4, Hkv: 4, Lq: L, Lk: L, E, Ev: E }, 303);
    const expected = single.sdpa(square.q, square.k, square.v).output.data;
    for (const input of ['q', 'k', 'v']) {
      const t = { data: square[input].data.slice(), dims: square[input].dims };
      const args = { ...square, [input]: t };
      const got = single.sdpa(args.q, args.k, args.v, { out: t.data }).output.data;
      expect(got).toBe(t.data);
      expectBitwiseEqual(got, expected);
    }
  });
});

describe('thread counts', () => {
  test('threads 1, 2 and 3 give bitwise-identical results, all matching the reference', async () => {
    const instances = await Promise.all([1, 2, 3].map((threads) => createAttention({ threads })));
    try {
      // All but the tiny fourth case are above the 4e6 multiply-adds (B·Hq·Lq·Lk·(E + Ev))
      // under which a call stays on the calling thread (src/sdpa.cc), so the pool does the work.
      const cases = [
        [{ B: 2, Hq: 1, Lq: 300, Lk: 300, E: 16, Ev: 8 }, { isCausal: true, returnWeights: true }],
        [{ B: 2, Hq: 6, Hkv: 2, Lq: 70, Lk: 450, E: 9, Ev: 5 }, { attnMask: floatMask([70, 450], 271), keyLengths: new Int32Array([450, 300]) }],
        [{ B: 3, Hq: 2, Hkv: 1, Lq: 129, Lk: 257, E: 32, Ev: 32 }, { isCausal: true, causalOffset: new Int32Array([-5, 128, 0]), softcap: 6 }],
        [{ B: 1, Hq: 1, Lq: 3, Lk: 64, E: 4, Ev: 4 }, {}],
        [{ B: 2, Hq: 8, Hkv: 1, Lq: 1, Lk: 2100, E: 64, Ev: 64 }, { keyLengths: new Int32Array([2100, 700]) }],
        [{ B: 2, Hq: 8, Hkv: 1, Lq: 1, Lk: 2100, E: 64, Ev: 64 }, { keyLengths: new Int32Array([2100, 700]), returnWeights: true }],
        [{ B: 1, Hq: 16, Hkv: 2, Lq: 2, Lk: 1500, E: 64, Ev: 64 }, { isCausal: true, causalOffset: 1000 }],
      ];
      for (const [d] of cases.filter((_, i) => i !== 3)) {
        expect(d.B * d.Hq * d.Lq * d.Lk * (d.E + d.Ev)).toBeGreaterThan(4e6);
      }
      for (const [dims, options] of cases) {
        const { q, k, v } = problem(dims, 270 + dims.Lq);
        const results = instances.map((instance) => instance.sdpa(q, k, v, options));
        const ref = referenceSdpa(q, k, v, options);
        expect(maxRelError(results[0].output.data, ref.output)).toBeLessThanOrEqual(TOL);
        for (const r of results.slice(1)) {
          expectBitwiseEqual(r.output.data, results[0].output.data);
          if (options.returnWeights) expectBitwiseEqual(r.weights.data, results[0].weights.data);
        }
      }
    } finally {
      for (const instance of instances) instance.dispose();
    }
  });
});

describe('huge logits', () => {
  // Tolerance for logits of magnitude |s| >> 1. The kernel forms each score in float32: q is
  // rounded after scaling, every product q_d·k_d and every partial sum of the dot product is
  // rounded, and so is s - max. Each rounding of a value of magnitude at most
  // A = scale·Σ_d |q_d·k_d| (the largest any product, partial sum or score can be) errs by
  // at most A·2⁻²⁴; these errors have random signs, so the exponent s_j - max of a key is off
  // by a few such units: we take δ = A·2⁻²³ per exponent (what float32 can resolve at that
  // magnitude). The float64 reference has no such error. Perturbing every exponent by at most
  // δ changes each softmax weight p_j by a factor within e^{±2δ}, hence the output
  // Σ_j p_j·v_j by at most about 2δ·max_j|v_j| (absolute, so also in our relative metric).
  // The tolerance is that plus the usual 2e-5. Near-tied keys (below) make the softmax spread
  // over several keys, so these errors are really exercised rather than hidden by a one-hot
  // softmax.
  function logitTolerance(problemRef, q, k, v, b, h, i) {
    const { Hq, Hkv, Lq, Lk, E, Ev } = problemRef;
    const scale = 1 / Math.sqrt(E);
    const kh = Math.floor(h / (Hq / Hkv));
    let A = 0, vmax = 0;
    for (let j = 0; j < Lk; j++) {
      let sum = 0;
      for (let d = 0; d < E; d++) {
        sum += Math.abs(q.data[((b * Hq + h) * Lq + i) * E + d] * k.data[((b * Hkv + kh) * Lk + j) * E + d]);
      }
      A = Math.max(A, scale * sum);
      for (let c = 0; c < Ev; c++) vmax = Math.max(vmax, Math.abs(v.data[((b * Hkv + kh) * Lk + j) * Ev + c]));
    }
    return { tol: TOL + 2 * A * 2 ** -23 * vmax, A };
  }

  test.each([[1e4, 16], [1e4, 64], [1e6, 16], [1e5, 4]])('Q × %p, near-tied keys, E = %i', (factor, E) => {
    const B = 1, Hq = 2, Hkv = 1, Lq = 9, Lk = 45;
    const q = randomTensor([B, Hq, Lq, E], 230);
    for (let i = 0; i < q.data.length; i++) q.data[i] *= factor;
    // Keys = one shared direction + a perturbation of relative size ~3/factor: the scores
    // are ~factor in magnitude but differ by O(1) between keys.
    const common = randn(E, 231), noise = randn(B * Hkv * Lk * E, 232);
    const k = { data: new Float32Array(B * Hkv * Lk * E), dims: [B, Hkv, Lk, E] };
    for (let x = 0; x < k.data.length; x++) k.data[x] = common[x % E] + (3 * noise[x]) / factor;
    const v = randomTensor([B, Hkv, Lk, E], 233);
    for (const options of [{ returnWeights: true }, { isCausal: true, causalOffset: 20, attnMask: floatMask([Lq, Lk], 234, 0.1) }]) {
      const got = attn.sdpa(q, k, v, options);
      expect(allFinite(got.output.data)).toBe(true);
      if (got.weights) expect(allFinite(got.weights.data)).toBe(true);
      const p = referenceProblem(q, k, v, options);
      let spread = 0;
      for (let h = 0; h < Hq; h++) {
        for (let i = 0; i < Lq; i++) {
          const ref = p.row(0, h, i);
          const { tol, A } = logitTolerance(p, q, k, v, 0, h, i);
          expect(A).toBeGreaterThanOrEqual(factor / 10);  // the logits really are huge
          expect(maxRelError(rowOf(got.output.data, [B, Hq, Lq, E], 0, h, i), ref.out)).toBeLessThanOrEqual(tol);
          spread = Math.max(spread, 1 - Math.max(...ref.weights));
        }
      }
      expect(spread).toBeGreaterThan(0.1);  // not a one-hot softmax
      if (got.weights) expectOutputIsItsWeightsTimesV(got, v, Hq, Lq, Lk, E);
    }
  });

  // At |s| ~ 1e6 float32 cannot resolve the near-tied keys' O(1) score differences (the
  // tolerance above exceeds 1): the weights themselves are not checked against the reference
  // there, but they must still be a distribution (≥ 0, summing to 1) and the output must be
  // that distribution's average of V: Σ_j w_j·v_j in float64 from the returned weights.
  function expectOutputIsItsWeightsTimesV(got, v, Hq, Lq, Lk, Ev) {
    for (let h = 0; h < Hq; h++) {  // one KV head
      for (let i = 0; i < Lq; i++) {
        const w = rowOf(got.weights.data, [1, Hq, Lq, Lk], 0, h, i);
        let sum = 0;
        const avg = new Float64Array(Ev);
        for (let j = 0; j < Lk; j++) {
          expect(w[j]).toBeGreaterThanOrEqual(0);
          sum += w[j];
          for (let c = 0; c < Ev; c++) avg[c] += w[j] * v.data[j * Ev + c];
        }
        expect(Math.abs(sum - 1)).toBeLessThanOrEqual(TOL);
        expect(maxRelError(rowOf(got.output.data, [1, Hq, Lq, Ev], 0, h, i), avg)).toBeLessThanOrEqual(TOL);
      }
    }
  }

  test.each([1e4, 1e30])('Q × %p, random keys (one-hot softmax): no NaN/Infinity, exact argmax', (factor) => {
    const Lq = 8, Lk = 70, E = 16;
    const { q, k, v } = problem({ Hq: 2, Lq, Lk, E }, 240);
    for (let i = 0; i < q.data.length; i++) q.data[i] *= factor;
    const options = { returnWeights: true, attnMask: boolMask([Lq, Lk], 241, 0.9) };
    const got = attn.sdpa(q, k, v, options);
    expect(allFinite(got.output.data)).toBe(true);
    expect(allFinite(got.weights.data)).toBe(true);
    const p = referenceProblem(q, k, v, options);
    for (let h = 0; h < 2; h++) {
      for (let i = 0; i < Lq; i++) {
        const ref = p.row(0, h, i);
        const { tol } = logitTolerance(p, q, k, v, 0, h, i);
        expect(maxRelError(rowOf(got.output.data, [1, 2, Lq, E], 0, h, i), ref.out)).toBeLessThanOrEqual(tol);
        // The gap between the two best scores is far above float32 resolution here, so the
        // softmax is one-hot in float32 as well as in float64: 2e-5 must hold.
        expect(maxRelError(rowOf(got.output.data, [1, 2, Lq, E], 0, h, i), ref.out)).toBeLessThanOrEqual(TOL);
        expect(maxRelError(rowOf(got.weights.data, [1, 2, Lq, Lk], 0, h, i), ref.weights)).toBeLessThanOrEqual(TOL);
      }
    }
  });
});

describe('long keys and sequences', () => {
  test.each([[256, 5], [64, 8]])('E = %i, Lk = 4096, %i query rows: within 2e-5', (E, Lq) => {
    const { q, k, v } = problem({ Lq, Lk: 4096, E }, 250 + E);
    check(q, k, v, { returnWeights: true });
    check(q, k, v, { isCausal: true, causalOffset: 4096 - Lq });
  });

  test('B = 1, H = 1, N = 32768, E = 16, causal: completes, sampled rows match', () => {
    const N = 32768, E = 16;
    const { q, k, v } = problem({ Lq: N, Lk: N, E }, 260);
    const got = attn.sdpa(q, k, v, { isCausal: true });
    expect(got.output.dims).toEqual([1, 1, N, E]);
    expect(allFinite(got.output.data)).toBe(true);
    const p = referenceProblem(q, k, v, { isCausal: true });
    for (const i of [0, 1, 2, 3, 31, 32, 4097, 16383, 16384, 20001, 32764, 32766, 32767]) {
      const ref = p.row(0, 0, i).out;
      expect(maxRelError(got.output.data.subarray(i * E, (i + 1) * E), ref)).toBeLessThanOrEqual(TOL);
    }
    // Row 0 attends key 0 only: its output is exactly v_0.
    expectBitwiseEqual(got.output.data.subarray(0, E), v.data.subarray(0, E));
  });
});
