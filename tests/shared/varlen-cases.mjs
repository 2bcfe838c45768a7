// Packed variable-length sequences (attn.sdpaVarlen, attn.sdpaVarlenBackward), runnable in Node
// and in a browser page (plain ES module): seeded inputs (web/seeded.mjs, bit-identical in every
// engine) against the float64 reference (tests/node/reference.mjs) of the whole packed problem as
// one batch with a block-diagonal boolean mask (varlenOracle), and a hash of the results' exact
// bits so that a browser run can be checked against a Node run bit for bit.
import { logSumExpError, maxRelError, referenceLogSumExp, referenceSdpa, referenceSdpaBackward } from '../node/reference.mjs';
import { noiseTensor } from '../../web/seeded.mjs';
import { bitsHash } from './reference-cases.mjs';

/** Forward and backward tolerances: sdpa()'s and sdpaBackward()'s (max |got − ref| / (1 + |ref|)). */
export const VARLEN_TOL = 2e-5;
export const VARLEN_GRAD_TOL = 1e-4;

/** [0, n0, n0 + n1, …]: the starts of sequences of these lengths. */
export const startsOf = (lengths) => Int32Array.from([0, ...lengths.map(((sum) => (n) => (sum += n))(0))]);

/**
 * The float64 oracle's problem for sdpaVarlen's `options` over the packed tensors of `p`
 * ({ query, key, value, gradOutput?, qLens, kLens, Tq, Tk, cuSeqlensQ, cuSeqlensK }): the tensors
 * as one batch [1, T, H, D] in the 'bshd' layout, and in place of the packing a boolean mask
 * [Tq, Tk] that opens key c to row r only when both are of sequence s and, with isCausal, c is
 * within s's causal frontier (and window) counted in s's own positions (the offset `causalOffset`
 * gives, else Lk_s − Lq_s). It never cuts the problem into sequences.
 */
export function varlenOracle(p, options) {
  const { cuSeqlensQ: _q, cuSeqlensK: _k, isCausal, causalOffset, slidingWindow: W = 0, returnLogSumExp: _l, out: _o, ...score } = options;
  const mask = new Uint8Array(p.Tq * p.Tk);
  for (let s = 0; s < p.qLens.length; s++) {
    const offset = causalOffset === undefined ? p.kLens[s] - p.qLens[s]
      : typeof causalOffset === 'number' ? causalOffset : causalOffset[s];
    for (let i = 0; i < p.qLens[s]; i++) {
      for (let j = 0; j < p.kLens[s]; j++) {
        const open = !isCausal || (j <= i + offset && (W === 0 || j > i + offset - W));
        mask[(p.cuSeqlensQ[s] + i) * p.Tk + p.cuSeqlensK[s] + j] = open ? 1 : 0;
      }
    }
  }
  const as4 = (t) => (t === undefined ? undefined : { data: t.data, dims: [1, ...t.dims] });
  return {
    query: as4(p.query), key: as4(p.key), value: as4(p.value), gradOutput: as4(p.gradOutput),
    options: { ...score, layout: 'bshd', attnMask: { data: mask, dims: [p.Tq, p.Tk] } },
  };
}

/** Seeded packed tensors for sequences of `qLens` query rows and `kLens` keys. */
function packedProblem(seed, { Hq, Hkv, E, Ev = E, qLens, kLens = qLens }) {
  const Tq = qLens.reduce((a, b) => a + b, 0), Tk = kLens.reduce((a, b) => a + b, 0);
  return {
    qLens, kLens, Tq, Tk, cuSeqlensQ: startsOf(qLens), cuSeqlensK: startsOf(kLens),
    query: noiseTensor([Tq, Hq, E], seed, 1), key: noiseTensor([Tk, Hkv, E], seed, 2),
    value: noiseTensor([Tk, Hkv, Ev], seed, 3), gradOutput: noiseTensor([Tq, Hq, Ev], seed, 4),
  };
}

/** The cases: { name, make() → { p, options } } (options without the starts, which p holds). */
export const VARLEN_CASES = [
  { name: 'MHA H2 E8, sequences 1, 3, 511, 0, 512, 513, 17', make: () => ({
    p: packedProblem(1, { Hq: 2, Hkv: 2, E: 8, qLens: [1, 3, 511, 0, 512, 513, 17] }), options: {} }) },
  { name: 'GQA Hq4 Hkv2 E16 Ev24, causal (bottom-right), Lq ≠ Lk, a sequence without keys', make: () => ({
    p: packedProblem(2, { Hq: 4, Hkv: 2, E: 16, Ev: 24, qLens: [5, 31, 1, 2], kLens: [9, 31, 0, 70] }),
    options: { isCausal: true } }) },
  { name: 'per-sequence offsets, a 6-key window, softcap 4, sinks', make: () => ({
    p: packedProblem(3, { Hq: 3, Hkv: 1, E: 8, qLens: [7, 0, 12, 4], kLens: [9, 3, 12, 30] }),
    options: { isCausal: true, causalOffset: Int32Array.of(2, 0, 0, 29), slidingWindow: 6, softcap: 4,
      sinks: Float32Array.of(-Infinity, 0.5, 30) } }) },
];

/**
 * Runs every case on `attn` (an Attention, or an AttentionWorker: awaited): the forward with
 * its log-sum-exp, and the backward. Returns [{ name, errors: { output, logSumExp, dQuery, dKey,
 * dValue, dSinks? }, ok, hash }].
 */
export async function runVarlenCases(attn, cases = VARLEN_CASES) {
  const results = [];
  for (const { name, make } of cases) {
    const { p, options: given } = make();
    const options = { cuSeqlensQ: p.cuSeqlensQ, cuSeqlensK: p.cuSeqlensK, ...given };
    const o = varlenOracle(p, options);
    const forward = await attn.sdpaVarlen(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    const grads = await attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options);
    const ref = referenceSdpa(o.query, o.key, o.value, o.options);
    const refGrads = referenceSdpaBackward(o.query, o.key, o.value, o.gradOutput, o.options);
    const errors = {
      output: maxRelError(forward.output.data, ref.output),
      logSumExp: logSumExpError(forward.logSumExp.data, referenceLogSumExp(o.query, o.key, o.value, o.options)),
      dQuery: maxRelError(grads.dQuery.data, refGrads.dQuery),
      dKey: maxRelError(grads.dKey.data, refGrads.dKey),
      dValue: maxRelError(grads.dValue.data, refGrads.dValue),
    };
    let hash = bitsHash(forward.output.data) + bitsHash(forward.logSumExp.data) + bitsHash(grads.dQuery.data) +
      bitsHash(grads.dKey.data) + bitsHash(grads.dValue.data);
    if (options.sinks) {
      errors.dSinks = grads.dSinks === undefined ? NaN : maxRelError(grads.dSinks.data, refGrads.dSinks);
      hash += grads.dSinks === undefined ? 'none' : bitsHash(grads.dSinks.data);
    }
    const ok = errors.output <= VARLEN_TOL && errors.logSumExp <= VARLEN_TOL &&
      [errors.dQuery, errors.dKey, errors.dValue, errors.dSinks ?? 0].every((e) => e <= VARLEN_GRAD_TOL);
    results.push({ name, errors, ok, hash });
  }
  return results;
}
