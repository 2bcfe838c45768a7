// Backward-pass cases for sdpa-wasm, runnable in Node and in a browser page (plain ES module):
// seeded inputs (web/seeded.mjs, bit-identical in every engine), attn.sdpaBackward() against the
// float64 analytic backward of tests/node/reference.mjs, and a hash of the gradients' exact bits
// so that a browser run can be checked against a Node run bit for bit.
import { maxRelError, referenceSdpaBackward } from '../node/reference.mjs';
import { noiseTensor } from '../../web/seeded.mjs';
import { bitsHash } from './reference-cases.mjs';

/** max |got − ref| / (1 + |ref|) allowed for gradients (issue #13; tests/node/backward.test.mjs). */
export const BACKWARD_TOL = 1e-4;

function problem(seed, qDims, kDims, vDims, goDims) {
  return {
    query: noiseTensor(qDims, seed, 1), key: noiseTensor(kDims, seed, 2), value: noiseTensor(vDims, seed, 3),
    gradOutput: noiseTensor(goDims, seed, 4),
  };
}

/** The cases: { name, make() → { query, key, value, gradOutput, options } }. */
export const BACKWARD_CASES = [
  { name: 'B2 H4 N70 E8, plain', make: () => ({ ...problem(1, [2, 4, 70, 8], [2, 4, 70, 8], [2, 4, 70, 8], [2, 4, 70, 8]), options: {} }) },
  { name: 'GQA Hq6 Hkv2 Lq9 Lk131 E12 Ev7, causal offset 122', make: () => ({
    ...problem(2, [1, 6, 9, 12], [1, 2, 131, 12], [1, 2, 131, 7], [1, 6, 9, 7]), options: { isCausal: true, causalOffset: 122 } }) },
  { name: 'Lq5 Lk40 E16, softcap 4, scale 0.2, float mask', make: () => ({
    ...problem(3, [1, 2, 5, 16], [1, 2, 40, 16], [1, 2, 40, 16], [1, 2, 5, 16]),
    options: { softcap: 4, scale: 0.2, attnMask: { data: Float32Array.from({ length: 40 }, (_, j) => (j % 7 === 0 ? -Infinity : Math.sin(j))), dims: [40] }, returnMaskGrad: true } }) },
  { name: 'a learnable bias [2, 1, 70, 300] (its gradient), GQA Hq4 Hkv2, causal offset 230', make: () => ({
    ...problem(6, [2, 4, 70, 8], [2, 2, 300, 8], [2, 2, 300, 8], [2, 4, 70, 8]),
    options: { isCausal: true, causalOffset: 230, attnMask: noiseTensor([2, 1, 70, 300], 6, 5), returnMaskGrad: true } }) },
  { name: 'bshd B2 Lq3 Lk65 H2, key lengths 65 and 0', make: () => ({
    ...problem(4, [2, 3, 2, 8], [2, 65, 2, 8], [2, 65, 2, 8], [2, 3, 2, 8]), options: { layout: 'bshd', keyLengths: Int32Array.of(65, 0) } }) },
  { name: 'into options.out (longer arrays, one shared by dKey and dValue side by side), float [9, 70] mask', make: () => {
    const p = problem(7, [1, 2, 9, 8], [1, 2, 70, 8], [1, 2, 70, 8], [1, 2, 9, 8]);
    const keyValue = new Float32Array(2 * 1120 + 1).fill(NaN);
    const out = { dQuery: new Float32Array(144 + 3).fill(NaN), dKey: keyValue.subarray(0, 1120), dValue: keyValue.subarray(1121), dAttnMask: new Float32Array(630) };
    return { ...p, options: { attnMask: noiseTensor([9, 70], 7, 5), returnMaskGrad: true, out } };
  } },
  { name: 'N200 E64 causal (several key tiles)', make: () => ({
    ...problem(5, [1, 1, 200, 64], [1, 1, 200, 64], [1, 1, 200, 64], [1, 1, 200, 64]), options: { isCausal: true } }) },
  { name: 'sinks (their gradient dSinks), GQA Hq4 Hkv2, a 32-key window, rows with nothing to attend', make: () => ({
    ...problem(6, [2, 4, 9, 16], [2, 2, 70, 16], [2, 2, 70, 16], [2, 4, 9, 16]),
    options: { sinks: Float32Array.of(1.5, -Infinity, 0, 30), isCausal: true, causalOffset: Int32Array.of(61, -2), slidingWindow: 32 } }) },
  { name: 'ALiBi [B, Hq] (BLOOM slopes, one 0), GQA Hq4 Hkv2, causal offset 61, a float mask and its gradient, sinks', make: () => ({
    ...problem(7, [2, 4, 9, 16], [2, 2, 70, 16], [2, 2, 70, 16], [2, 4, 9, 16]),
    options: { alibiSlopes: Float32Array.of(0.25, 0.0625, 2 ** -6, 0, 0.5, 0.125, 2 ** -5, 2 ** -8), isCausal: true,
      causalOffset: 61, attnMask: noiseTensor([9, 70], 7, 6), returnMaskGrad: true, sinks: Float32Array.of(1, 0, -Infinity, 3) } }) },
  { name: 'ALiBi [Hq] not causal, offset −5, softcap 3, N200 E64 (several key tiles)', make: () => ({
    ...problem(8, [1, 2, 200, 64], [1, 2, 200, 64], [1, 2, 200, 64], [1, 2, 200, 64]),
    options: { alibiSlopes: Float32Array.of(0.1, 0.02), causalOffset: -5, softcap: 3 } }) },
  // Attention dropout: the backward draws the forward's mask again from the seed.
  { name: 'dropout 0.3 (seed 2^32 − 7), GQA Hq4 Hkv2, causal offset 61, a float mask and its gradient, sinks', make: () => ({
    ...problem(9, [2, 4, 9, 16], [2, 2, 70, 16], [2, 2, 70, 16], [2, 4, 9, 16]),
    options: { dropoutP: 0.3, dropoutSeed: 2 ** 32 - 7, isCausal: true, causalOffset: 61, attnMask: noiseTensor([9, 70], 9, 6), returnMaskGrad: true,
      sinks: Float32Array.of(1, 0, -Infinity, 3) } }) },
  { name: 'dropout 0.6, bshd B2 Lq5 Lk130 H2 E32 (several key tiles), key lengths 130 and 17', make: () => ({
    ...problem(10, [2, 5, 2, 32], [2, 130, 2, 32], [2, 130, 2, 32], [2, 5, 2, 32]),
    options: { dropoutP: 0.6, dropoutSeed: 12, layout: 'bshd', keyLengths: Int32Array.of(130, 17) } }) },
];

/**
 * Runs every case on `attn` (an Attention, or an AttentionWorker: awaited). Returns
 * [{ name, errors: { dQuery, dKey, dValue, dAttnMask?, dSinks? }, ok, hash }].
 */
export async function runBackwardCases(attn, cases = BACKWARD_CASES) {
  const results = [];
  for (const { name, make } of cases) {
    const { query, key, value, gradOutput, options } = make();
    const { out, ...refOptions } = options;
    const ref = referenceSdpaBackward(query, key, value, gradOutput, refOptions);
    const got = await attn.sdpaBackward(query, key, value, gradOutput, options);
    const errors = {
      dQuery: maxRelError(got.dQuery.data, ref.dQuery),
      dKey: maxRelError(got.dKey.data, ref.dKey),
      dValue: maxRelError(got.dValue.data, ref.dValue),
    };
    // options.out: each result is the start of its array (NaN, not ok, otherwise), the rest unwritten.
    for (const [name, array] of Object.entries(out ?? {})) {
      const written = got[name].data.buffer === array.buffer && got[name].data.byteOffset === array.byteOffset &&
        array.subarray(got[name].data.length).every(Number.isNaN);
      if (!written) errors[`${name} in options.out`] = NaN;
    }
    let hash = bitsHash(got.dQuery.data) + bitsHash(got.dKey.data) + bitsHash(got.dValue.data);
    if (options.returnMaskGrad) {
      // NaN (not ok) when the gradient is missing or has other dims than the mask.
      const dims = got.dAttnMask?.dims ?? [];
      errors.dAttnMask = dims.join() === options.attnMask.dims.join() ? maxRelError(got.dAttnMask.data, ref.dAttnMask) : NaN;
      hash += got.dAttnMask !== undefined ? bitsHash(got.dAttnMask.data) : 'none';
    }
    if (options.sinks) {  // NaN (not ok) when dSinks is missing or not [Hq]
      const dims = got.dSinks?.dims ?? [];
      errors.dSinks = dims.join() === String(options.sinks.length) ? maxRelError(got.dSinks.data, ref.dSinks) : NaN;
      hash += got.dSinks !== undefined ? bitsHash(got.dSinks.data) : 'none';
    }
    const ok = Object.values(errors).every((e) => e <= BACKWARD_TOL);
    results.push({ name, errors, ok, hash });
  }
  return results;
}
