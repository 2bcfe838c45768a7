// Reference-comparison cases for sdpa-wasm, runnable in Node and in a browser page: each case
// builds seeded inputs (web/seeded.mjs, bit-identical in every engine), runs attn.sdpa() and
// compares with the float64 reference of tests/node/reference.mjs. Every result also carries a
// hash of the exact output bits, so a browser run can be checked against a Node run bit for bit.
// Plain ES module: no Node built-ins.
import { maxRelError, referenceSdpa } from '../node/reference.mjs';
import { noiseTensor, seedOf, uniformStream } from '../../web/seeded.mjs';

/** max |got − ref| / (1 + |ref|) allowed (the Jest API suite uses the same bound). */
export const REFERENCE_TOL = 2e-5;

const tensor = (dims, seed, stream) => noiseTensor(dims, seed, stream);

/** A float mask of dims with about `blocked` of its entries −∞ and the rest small biases. */
function floatMask(dims, seed, blocked) {
  const next = uniformStream(seedOf(seed, 'mask'));
  const n = dims.reduce((a, b) => a * b, 1);
  const data = new Float32Array(n);
  for (let i = 0; i < n; i++) data[i] = next() < blocked ? -Infinity : (next() - 0.5) * 2;
  return { data, dims };
}

function boolMask(dims, seed, open) {
  const next = uniformStream(seedOf(seed, 'bool'));
  const n = dims.reduce((a, b) => a * b, 1);
  return { data: Uint8Array.from({ length: n }, () => (next() < open ? 1 : 0)), dims };
}

/** Writes NaN into keys/values at positions >= length (bhsd [B, H, L, D]): never to be read. */
function poisonPadding(t, lengths) {
  const [B, H, L, D] = t.dims;
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      for (let l = lengths[b]; l < L; l++) t.data.fill(NaN, ((b * H + h) * L + l) * D, ((b * H + h) * L + l + 1) * D);
    }
  }
  return t;
}

function qkv(seed, qDims, kDims, vDims) {
  return { query: tensor(qDims, seed, 1), key: tensor(kDims, seed, 2), value: tensor(vDims, seed, 3) };
}

/** The cases: { name, make() → { query, key, value, options } }. */
export const REFERENCE_CASES = [
  { name: 'rank 2 [L, E]: Lq 5, Lk 7, E 8, Ev 3', make: () => ({ ...qkv(1, [5, 8], [7, 8], [7, 3]), options: {} }) },
  { name: 'one tile exactly: Lq 4, Lk 32, E 16', make: () => ({ ...qkv(2, [1, 1, 4, 16], [1, 1, 32, 16], [1, 1, 32, 16]), options: {} }) },
  { name: 'past the tile edges: Lq 33, Lk 65, E 64', make: () => ({ ...qkv(3, [1, 2, 33, 64], [1, 2, 65, 64], [1, 2, 65, 64]), options: { returnWeights: true } }) },
  { name: 'E 1 and Ev 1', make: () => ({ ...qkv(4, [1, 1, 6, 1], [1, 1, 9, 1], [1, 1, 9, 1]), options: { returnWeights: true } }) },
  { name: 'causal top-left: L 37, E 32', make: () => ({ ...qkv(5, [1, 2, 37, 32], [1, 2, 37, 32], [1, 2, 37, 32]), options: { isCausal: true, returnWeights: true } }) },
  { name: 'causal bottom-right (KV cache): Lq 5, Lk 40', make: () => ({ ...qkv(6, [1, 2, 5, 16], [1, 2, 40, 16], [1, 2, 40, 16]), options: { isCausal: true, causalOffset: 35, returnWeights: true } }) },
  { name: 'causal offset −2: the first rows are empty', make: () => ({ ...qkv(7, [1, 1, 6, 8], [1, 1, 6, 8], [1, 1, 6, 8]), options: { isCausal: true, causalOffset: -2, returnWeights: true } }) },
  { name: 'per-batch causal offsets (Int32Array), B 3', make: () => ({ ...qkv(8, [3, 2, 7, 16], [3, 2, 12, 16], [3, 2, 12, 16]), options: { isCausal: true, causalOffset: Int32Array.of(0, 5, -1), returnWeights: true } }) },
  { name: 'grouped-query: Hq 6, Hkv 2', make: () => ({ ...qkv(9, [2, 6, 10, 32], [2, 2, 14, 32], [2, 2, 14, 32]), options: { returnWeights: true } }) },
  { name: 'multi-query: Hq 4, Hkv 1, Ev 24 ≠ E 40', make: () => ({ ...qkv(10, [1, 4, 9, 40], [1, 1, 33, 40], [1, 1, 33, 24]), options: {} }) },
  { name: 'float mask [Lq, Lk] with −∞ and finite biases', make: () => ({ ...qkv(11, [2, 3, 8, 16], [2, 3, 36, 16], [2, 3, 36, 16]), options: { attnMask: floatMask([8, 36], 11, 0.3), returnWeights: true } }) },
  { name: 'float mask [1, Hq, Lq, Lk] + causal', make: () => ({ ...qkv(12, [1, 4, 12, 16], [1, 4, 12, 16], [1, 4, 12, 16]), options: { attnMask: floatMask([1, 4, 12, 12], 12, 0.2), isCausal: true, returnWeights: true } }) },
  { name: 'bool mask [B, 1, 1, Lk] (key padding)', make: () => ({ ...qkv(13, [2, 2, 5, 8], [2, 2, 70, 8], [2, 2, 70, 8]), options: { attnMask: boolMask([2, 1, 1, 70], 13, 0.6), returnWeights: true } }) },
  { name: 'bool mask with a fully blocked row', make: () => {
    const m = boolMask([4, 6], 14, 0.7);
    m.data.fill(0, 2 * 6, 3 * 6);  // row 2 attends nothing
    return { ...qkv(14, [1, 1, 4, 8], [1, 1, 6, 8], [1, 1, 6, 8]), options: { attnMask: m, returnWeights: true } };
  } },
  { name: 'keyLengths with NaN in the padding', make: () => {
    const lengths = Int32Array.of(3, 17);
    const t = qkv(15, [2, 2, 6, 16], [2, 2, 20, 16], [2, 2, 20, 16]);
    return { query: t.query, key: poisonPadding(t.key, lengths), value: poisonPadding(t.value, lengths), options: { keyLengths: lengths, returnWeights: true } };
  } },
  { name: 'keyLengths 0: every row exact zeros', make: () => ({ ...qkv(16, [1, 2, 3, 8], [1, 2, 5, 8], [1, 2, 5, 8]), options: { keyLengths: Int32Array.of(0), returnWeights: true } }) },
  { name: 'softcap 5 with scale 0.5', make: () => ({ ...qkv(17, [1, 2, 9, 32], [1, 2, 40, 32], [1, 2, 40, 32]), options: { softcap: 5, scale: 0.5, returnWeights: true } }) },
  { name: "layout 'bshd', GQA, causal", make: () => ({ ...qkv(18, [2, 9, 4, 24], [2, 11, 2, 24], [2, 11, 2, 24]), options: { layout: 'bshd', isCausal: true, causalOffset: 2, returnWeights: true } }) },
  { name: 'long rows: Lq 20, Lk 300, E 128, causal bottom-right', make: () => ({ ...qkv(19, [1, 2, 20, 128], [1, 2, 300, 128], [1, 2, 300, 128]), options: { isCausal: true, causalOffset: 280 } }) },
  { name: 'sinks (gpt-oss): GQA Hq 4 Hkv 2, a head without one, a 16-key window, empty rows', make: () => ({
    ...qkv(21, [2, 4, 9, 16], [2, 2, 40, 16], [2, 2, 40, 16]),
    options: { sinks: Float32Array.of(1.5, -Infinity, 0, 30), isCausal: true, causalOffset: Int32Array.of(31, -2), slidingWindow: 16, returnWeights: true },
  }) },
  // ALiBi: BLOOM's slopes 2^(−8(h+1)/Hq); per batch [B, Hq]; with masks, offsets and decode.
  { name: 'ALiBi (BLOOM slopes), causal: Hq 8, L 37, E 32', make: () => ({
    ...qkv(22, [1, 8, 37, 32], [1, 8, 37, 32], [1, 8, 37, 32]),
    options: { alibiSlopes: Float32Array.from({ length: 8 }, (_, h) => 2 ** (-(h + 1))), isCausal: true, returnWeights: true },
  }) },
  { name: 'ALiBi [B, Hq] not causal, offset 3, float mask, GQA Hq 4 Hkv 2, Lk 530', make: () => ({
    ...qkv(23, [2, 4, 9, 16], [2, 2, 530, 16], [2, 2, 530, 16]),
    options: { alibiSlopes: Float32Array.of(0.5, 0.25, 0, 0.125, 0.03, 0.3, 1, 2 ** -10), causalOffset: 3,
      attnMask: floatMask([9, 530], 23, 0.2), returnWeights: true },
  }) },
  { name: 'ALiBi decode: Hq 8 Hkv 2, Lq 1, Lk 1100, causal bottom-right, per-batch offsets, window 700', make: () => ({
    ...qkv(24, [2, 8, 1, 64], [2, 2, 1100, 64], [2, 2, 1100, 64]),
    options: { alibiSlopes: Float32Array.from({ length: 8 }, (_, h) => 2 ** (-(h + 1) / 2)), isCausal: true,
      causalOffset: Int32Array.of(1099, 800), slidingWindow: 700, returnWeights: true },
  }) },
  // K and V of 4.3 MB in a decode shape: copied in and computed one 512-key segment at a time,
  // on the single-threaded build even for a threaded instance (js/index.ts).
  { name: 'streamed decode: Hq 8, Hkv 2, Lk 4200, keyLengths with NaN in the padding', make: () => {
    const lengths = Int32Array.of(3000, 4200);
    const t = qkv(20, [2, 8, 1, 64], [2, 2, 4200, 64], [2, 2, 4200, 64]);
    return { query: t.query, key: poisonPadding(t.key, lengths), value: poisonPadding(t.value, lengths), options: { keyLengths: lengths } };
  } },
  { name: 'streamed decode with ALiBi [B, Hq]: Hq 8, Hkv 2, Lk 4200, causal bottom-right', make: () => ({
    ...qkv(25, [2, 8, 1, 64], [2, 2, 4200, 64], [2, 2, 4200, 64]),
    options: { alibiSlopes: Float32Array.from({ length: 16 }, (_, n) => 2 ** -(n % 9)), isCausal: true, causalOffset: 4199 },
  }) },
];

// Read once: under Jest every `Math.…` call in a loop costs about 250 ns.
const imul = Math.imul;

/** FNV-1a over the bits of a Float32Array, as 8 hex digits: equal iff (almost surely) bit-identical. */
export function bitsHash(f32) {
  const u32 = new Uint32Array(f32.buffer, f32.byteOffset, f32.length);
  let h = 0x811c9dc5;
  for (let i = 0; i < u32.length; i++) {
    let x = u32[i];
    for (let k = 0; k < 4; k++) {
      h = imul(h ^ (x & 0xff), 0x01000193);
      x >>>= 8;
    }
  }
  return (h >>> 0).toString(16).padStart(8, '0');
}

/**
 * Runs every case on `attn`: an Attention, or an AttentionWorker (whose sdpa returns a promise;
 * each call is awaited). Returns [{ name, outputError, weightsError, zerosExact, ok, hash }] where the errors are
 * maxRelError against the float64 reference (weightsError null when weights were not asked for),
 * zerosExact that every output the reference makes exactly 0 is exactly 0, ok that all of this
 * holds (errors within REFERENCE_TOL, NaN counts as Infinity), and hash covers output and weights.
 */
export async function runReferenceCases(attn, cases = REFERENCE_CASES) {
  const results = [];
  for (const { name, make } of cases) {
    const { query, key, value, options } = make();
    const got = await attn.sdpa(query, key, value, options);
    const ref = referenceSdpa(query, key, value, options);
    const outputError = maxRelError(got.output.data, ref.output);
    const weightsError = options.returnWeights ? maxRelError(got.weights.data, ref.weights) : null;
    const dimsOk = got.output.dims.join() === ref.outputDims.join() &&
      (!options.returnWeights || got.weights.dims.join() === ref.weightsDims.join());
    // Where the reference is exactly 0 (rows with nothing to attend), so must sdpa-wasm be: +0,
    // not -0.
    let zeroRows = 0, zerosExact = true;
    for (let i = 0; i < ref.output.length; i++) {
      if (ref.output[i] === 0) {
        zeroRows++;
        if (!Object.is(got.output.data[i], 0)) zerosExact = false;
      }
    }
    const ok = dimsOk && zerosExact && outputError <= REFERENCE_TOL &&
      (weightsError === null || weightsError <= REFERENCE_TOL);
    const hash = bitsHash(got.output.data) + (got.weights ? bitsHash(got.weights.data) : '');
    results.push({ name, outputError, weightsError, dimsOk, zerosExact, zeroOutputs: zeroRows, ok, hash });
  }
  return results;
}
