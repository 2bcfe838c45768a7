// Packed variable-length sequences (attn.sdpaVarlen, attn.sdpaVarlenBackward), runnable in Node
// and in a browser page (plain ES module): seeded inputs (web/seeded.mjs, bit-identical in every
// engine) against the float64 reference (tests/node/reference.mjs) of the whole packed problem as
// one batch with a block-diagonal boolean mask (varlenOracle), and a hash of the results' exact
// bits so that a browser run can be checked against a Node run bit for bit.
import {
  logSumExpError, maxRelError, randomTensor, referenceLogSumExp, referenceSdpa, referenceSdpaBackward,
} from '../node/reference.mjs';
import { noiseTensor } from '../../web/seeded.mjs';
import { bitsHash } from './reference-cases.mjs';

/** Forward and backward tolerances: sdpa()'s and sdpaBackward()'s (max |got − ref| / (1 + |ref|)). */
export const VARLEN_TOL = 2e-5;
export const VARLEN_GRAD_TOL = 1e-4;

/** [0, n0, n0 + n1, …]: the starts of sequences of these lengths. */
export const startsOf = (lengths) => Int32Array.from([0, ...lengths.map(((sum) => (n) => (sum += n))(0))]);

/** Sequence s's causal offset as sdpaVarlen takes `causalOffset` (undefined: bottom-right, Lk_s − Lq_s). */
export function sequenceOffset(p, causalOffset, s) {
  if (causalOffset === undefined) return p.kLens[s] - p.qLens[s];
  return typeof causalOffset === 'number' ? causalOffset : causalOffset[s];
}

/**
 * The float64 oracle's problem for sdpaVarlen's `options` over the packed tensors of `p`
 * ({ query, key, value, gradOutput?, qLens, kLens, Tq, Tk, cuSeqlensQ, cuSeqlensK }): the tensors
 * as one batch [1, T, H, D] in the 'bshd' layout, and in place of the packing a boolean mask
 * [Tq, Tk] that opens key c to row r only when both are of sequence s and, with isCausal, c is
 * within s's causal frontier (and window) counted in s's own positions (the offset `causalOffset`
 * gives, else Lk_s − Lq_s); with alibiSlopes a float64 mask [Hq, Tq, Tk] holding each open key's
 * ALiBi bias in s's own positions instead. It never cuts the problem into sequences.
 */
export function varlenOracle(p, options) {
  const {
    cuSeqlensQ: _q, cuSeqlensK: _k, isCausal, causalOffset, slidingWindow: W = 0, alibiSlopes, returnLogSumExp: _l, out: _o,
    ...score
  } = options;
  const as4 = (t) => (t === undefined ? undefined : { data: t.data, dims: [1, ...t.dims] });
  const tensors = { query: as4(p.query), key: as4(p.key), value: as4(p.value), gradOutput: as4(p.gradOutput) };
  const open = (s, i, j) => {
    const offset = sequenceOffset(p, causalOffset, s);
    return !isCausal || (j <= i + offset && (W === 0 || j > i + offset - W));
  };
  if (alibiSlopes !== undefined) {
    // ALiBi in each sequence's own positions: a float64 mask [Hq, Tq, Tk] of -Infinity (closed)
    // or -slope[s, h]·|i + offset_s − j| (slopes [Hq] for every sequence, or [S, Hq]).
    const Hq = p.Hq, mask = new Float64Array(Hq * p.Tq * p.Tk).fill(-Infinity);
    for (let s = 0; s < p.qLens.length; s++) {
      const offset = sequenceOffset(p, causalOffset, s);
      for (let h = 0; h < Hq; h++) {
        const slope = alibiSlopes[alibiSlopes.length === Hq ? h : s * Hq + h];
        for (let i = 0; i < p.qLens[s]; i++) {
          for (let j = 0; j < p.kLens[s]; j++) {
            if (!open(s, i, j)) continue;
            mask[(h * p.Tq + p.cuSeqlensQ[s] + i) * p.Tk + p.cuSeqlensK[s] + j] = -slope * Math.abs(i + offset - j);
          }
        }
      }
    }
    return { ...tensors, options: { ...score, layout: 'bshd', attnMask: { data: mask, dims: [Hq, p.Tq, p.Tk] } } };
  }
  const mask = new Uint8Array(p.Tq * p.Tk);
  for (let s = 0; s < p.qLens.length; s++) {
    for (let i = 0; i < p.qLens[s]; i++) {
      for (let j = 0; j < p.kLens[s]; j++) mask[(p.cuSeqlensQ[s] + i) * p.Tk + p.cuSeqlensK[s] + j] = open(s, i, j) ? 1 : 0;
    }
  }
  return { ...tensors, options: { ...score, layout: 'bshd', attnMask: { data: mask, dims: [p.Tq, p.Tk] } } };
}

/**
 * The float64 reference of sdpaVarlen's `options` computed one sequence at a time, for attention
 * dropout, whose mask a sequence draws as batch s in its own positions (i, j) (js/types.ts): the
 * block-diagonal oracle above cannot pose that as one batch. Sequence s is referenceSdpa() on
 * its rows and keys alone ([L, H, D] in the 'bshd' layout) with its causal offset (the one
 * given, else Lk_s − Lq_s), its row of [S, Hq] ALiBi slopes and dropoutBatchBase s. Returns
 * { output [Tq, Hq, Ev], logSumExp [Hq, Tq] } and, with `gradients`, { dQuery, dKey, dValue,
 * dSinks } (referenceSdpaBackward per sequence, dSinks summed), all Float64Arrays laid out as
 * the API's results; rows without keys are zeros (their lse the sink, or -Infinity), keys
 * without rows get zero gradients.
 */
export function varlenSequenceReference(p, options, { gradients = false } = {}) {
  const {
    cuSeqlensQ: _q, cuSeqlensK: _k, isCausal, causalOffset, slidingWindow, alibiSlopes, returnLogSumExp: _l, out: _o,
    saved: _s, accumulate: _a, ...score
  } = options;
  const { Hq, Hkv, E, Ev, Tq } = p;
  const rows = (t, from, n) => {
    const width = t.dims[1] * t.dims[2];
    return { data: t.data.subarray(from * width, (from + n) * width), dims: [n, t.dims[1], t.dims[2]] };
  };
  const output = new Float64Array(Tq * Hq * Ev), logSumExp = new Float64Array(Hq * Tq);
  const grads = gradients ? {
    dQuery: new Float64Array(Tq * Hq * E), dKey: new Float64Array(p.Tk * Hkv * E), dValue: new Float64Array(p.Tk * Hkv * Ev),
    dSinks: score.sinks ? new Float64Array(Hq) : null,
  } : null;
  for (let s = 0; s < p.qLens.length; s++) {
    const Lq = p.qLens[s], Lk = p.kLens[s], q0 = p.cuSeqlensQ[s], k0 = p.cuSeqlensK[s];
    if (Lq === 0) continue;
    if (Lk === 0) {  // nothing to attend: zeros, the sink as lse
      for (let h = 0; h < Hq; h++) logSumExp.fill(score.sinks ? score.sinks[h] : -Infinity, h * Tq + q0, h * Tq + q0 + Lq);
      continue;
    }
    const offset = sequenceOffset(p, causalOffset, s);
    const o = {
      ...score, layout: 'bshd', dropoutBatchBase: s,
      ...(isCausal ? { isCausal: true, causalOffset: offset, ...(slidingWindow ? { slidingWindow } : {}) } : {}),
      ...(alibiSlopes ? { alibiSlopes: alibiSlopes.length === Hq ? alibiSlopes : alibiSlopes.subarray(s * Hq, (s + 1) * Hq), causalOffset: offset } : {}),
    };
    const query = rows(p.query, q0, Lq), key = rows(p.key, k0, Lk), value = rows(p.value, k0, Lk);
    output.set(referenceSdpa(query, key, value, o).output, q0 * Hq * Ev);
    const lse = referenceLogSumExp(query, key, value, o);  // [1, Hq, Lq]
    for (let h = 0; h < Hq; h++) logSumExp.set(lse.subarray(h * Lq, (h + 1) * Lq), h * Tq + q0);
    if (grads) {
      const g = referenceSdpaBackward(query, key, value, rows(p.gradOutput, q0, Lq), o);
      grads.dQuery.set(g.dQuery, q0 * Hq * E);
      grads.dKey.set(g.dKey, k0 * Hkv * E);
      grads.dValue.set(g.dValue, k0 * Hkv * Ev);
      if (grads.dSinks) g.dSinks.forEach((x, h) => { grads.dSinks[h] += x; });
    }
  }
  return { output, logSumExp, ...(grads ?? {}) };
}

/**
 * Seeded packed tensors (and dO) for sequences of `qLens` query rows and `kLens` keys (default
 * qLens), with the starts sdpaVarlen takes for them.
 */
export function packedProblem(seed, { Hq = 2, Hkv = 1, E = 8, Ev = E, qLens, kLens = qLens }) {
  const Tq = qLens.reduce((a, b) => a + b, 0), Tk = kLens.reduce((a, b) => a + b, 0);
  return {
    Hq, Hkv, E, Ev, qLens, kLens, Tq, Tk, cuSeqlensQ: startsOf(qLens), cuSeqlensK: startsOf(kLens),
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
  { name: 'ALiBi slopes per sequence [S, Hq], causal, GQA Hq4 Hkv2, Lq ≠ Lk, empty sequences', make: () => ({
    p: packedProblem(5, { Hq: 4, Hkv: 2, E: 16, qLens: [5, 0, 37, 1, 3], kLens: [9, 3, 37, 70, 0] }),
    options: { isCausal: true, alibiSlopes: Float32Array.from({ length: 20 }, (_, n) => 2 ** -(1 + (n % 8))) } }) },
  { name: 'ALiBi slopes [Hq] (one 0) not causal, per-sequence offsets, sinks, softcap 6', make: () => ({
    p: packedProblem(6, { Hq: 3, Hkv: 1, E: 8, Ev: 12, qLens: [7, 12, 4], kLens: [9, 12, 30] }),
    options: { alibiSlopes: Float32Array.of(0.5, 0, 0.0625), causalOffset: Int32Array.of(2, 0, -3), softcap: 6,
      sinks: Float32Array.of(1, -Infinity, 0.25) } }) },
  // Dropout: sequence s draws the mask of batch s in its own positions (varlenSequenceReference).
  { name: 'dropout 0.3, GQA Hq4 Hkv2, causal, a 9-key window, sinks, sequences 1, 64, 0, 65, 3 (Lq ≠ Lk)', make: () => ({
    p: packedProblem(7, { Hq: 4, Hkv: 2, E: 16, Ev: 8, qLens: [1, 64, 0, 65, 3], kLens: [9, 64, 5, 70, 0] }),
    options: { dropoutP: 0.3, dropoutSeed: 2 ** 32 - 3, isCausal: true, slidingWindow: 9, sinks: Float32Array.of(0, -Infinity, 1, 2) } }) },
  { name: 'dropout 0.7, ALiBi [S, Hq] not causal, MHA H2 E8, sequences 511, 2, 513', make: () => ({
    p: packedProblem(8, { Hq: 2, Hkv: 2, E: 8, qLens: [511, 2, 513] }),
    options: { dropoutP: 0.7, dropoutSeed: 4, alibiSlopes: Float32Array.of(0.01, 0, 0.1, 0.5, 0.002, 0.03) } }) },
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
    const forward = await attn.sdpaVarlen(p.query, p.key, p.value, { ...options, returnLogSumExp: true });
    const grads = await attn.sdpaVarlenBackward(p.query, p.key, p.value, p.gradOutput, options);
    let ref, refGrads, refLse;
    if (options.dropoutP) {  // the mask of batch s for sequence s: the reference one sequence at a time
      ref = refGrads = varlenSequenceReference(p, options, { gradients: true });
      refLse = ref.logSumExp;
    } else {
      const o = varlenOracle(p, options);
      ref = referenceSdpa(o.query, o.key, o.value, o.options);
      refGrads = referenceSdpaBackward(o.query, o.key, o.value, o.gradOutput, o.options);
      refLse = referenceLogSumExp(o.query, o.key, o.value, o.options);
    }
    const errors = {
      output: maxRelError(forward.output.data, ref.output),
      logSumExp: logSumExpError(forward.logSumExp.data, refLse),
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

/**
 * The bad-input cases of sdpaVarlen and sdpaVarlenBackward, on `api` (an Attention, or an
 * AttentionWorker whose calls return promises): [description, call, error class, message
 * pattern]. A valid problem they start from: S = 2 sequences of 3 and 4 query rows, 2 and 5
 * keys; Hq 2, Hkv 1, E = Ev = 8.
 */
export function varlenErrorCases(api) {
  const query = randomTensor([7, 2, 8], 20), key = randomTensor([7, 1, 8], 21), value = randomTensor([7, 1, 8], 22);
  const gradOutput = randomTensor([7, 2, 8], 23);
  const ok = { cuSeqlensQ: Int32Array.of(0, 3, 7), cuSeqlensK: Int32Array.of(0, 2, 7) };
  const call = (options) => () => api.sdpaVarlen(query, key, value, options);
  const tensors = (q, k, v) => () => api.sdpaVarlen(q, k, v, ok);
  const backward = (go, options) => () => api.sdpaVarlenBackward(query, key, value, go, options);
  return [
    ['cuSeqlensQ missing', call({}), TypeError, /sdpaVarlen: options\.cuSeqlensQ is required: an Int32Array \[S \+ 1\]/],
    ['options missing', () => api.sdpaVarlen(query, key, value), TypeError, /sdpaVarlen: options\.cuSeqlensQ is required/],
    ['cuSeqlensQ an Array', call({ cuSeqlensQ: [0, 3, 7] }), TypeError, /options\.cuSeqlensQ must be an Int32Array \[S \+ 1\].*got Array\(3\)/],
    ['cuSeqlensQ a Uint32Array', call({ cuSeqlensQ: Uint32Array.of(0, 3, 7) }), TypeError, /got Uint32Array\(3\)/],
    ['cuSeqlensQ too short', call({ cuSeqlensQ: Int32Array.of(0) }), RangeError, /options\.cuSeqlensQ must have S \+ 1 >= 2 entries.*got length 1/],
    ['cuSeqlensQ not from 0', call({ ...ok, cuSeqlensQ: Int32Array.of(1, 3, 7) }), RangeError, /options\.cuSeqlensQ\[0\] must be 0, got 1/],
    ['cuSeqlensQ decreasing', call({ ...ok, cuSeqlensQ: Int32Array.of(0, 5, 3, 7), cuSeqlensK: Int32Array.of(0, 2, 4, 7) }), RangeError,
      /options\.cuSeqlensQ must be non-decreasing: \[1\] = 5 and \[2\] = 3 would give sequence 1 -2 query rows/],
    ['cuSeqlensQ not ending at Tq', call({ ...ok, cuSeqlensQ: Int32Array.of(0, 3, 6) }), RangeError, /options\.cuSeqlensQ\[2\] must be Tq = 7, got 6/],
    ['cuSeqlensK of another S', call({ ...ok, cuSeqlensK: Int32Array.of(0, 7) }), RangeError,
      /options\.cuSeqlensK must have the length of options\.cuSeqlensQ \(S \+ 1 = 3\), got length 2/],
    ['cuSeqlensK not ending at Tk', call({ ...ok, cuSeqlensK: Int32Array.of(0, 2, 6) }), RangeError, /options\.cuSeqlensK\[2\] must be Tk = 7, got 6/],
    ['cuSeqlensK decreasing', call({ ...ok, cuSeqlensK: Int32Array.of(0, 8, 7) }), RangeError,
      /options\.cuSeqlensK must be non-decreasing: \[1\] = 8 and \[2\] = 7 would give sequence 1 -1 keys/],
    ['causalOffset without isCausal', call({ ...ok, causalOffset: 1 }), TypeError, /options\.causalOffset is only meaningful with options\.isCausal: true/],
    ['causalOffset of another length', call({ ...ok, isCausal: true, causalOffset: Int32Array.of(1) }), RangeError,
      /options\.causalOffset must have one offset per sequence \(length S = 2\), got length 1/],
    ['alibiSlopes of another length', call({ ...ok, alibiSlopes: new Float32Array(3) }), RangeError,
      /^sdpaVarlen: options\.alibiSlopes must have length Hq = 2 or S·Hq = 4, got 3$/],
    ['alibiSlopes negative in sequence 1\'s row', call({ ...ok, alibiSlopes: Float32Array.of(0.5, 0, 1, -1) }), RangeError,
      /options\.alibiSlopes\[3\] must be a number in \[0, 2\^64\].*got -1$/],
    ['causalOffset beyond int32 with alibiSlopes', call({ ...ok, alibiSlopes: Float32Array.of(0.5, 1), causalOffset: -(2 ** 31) - 1 }),
      RangeError, /options\.causalOffset must be an integer in \[-2\^31, 2\^31 - 1\] with options\.alibiSlopes .*got -2147483649$/],
    ['causalOffset not an integer', call({ ...ok, isCausal: true, causalOffset: 1.5 }), RangeError, /options\.causalOffset must be an integer, got 1\.5/],
    ['causalOffset a string', call({ ...ok, isCausal: true, causalOffset: '1' }), TypeError,
      /options\.causalOffset must be an integer or an Int32Array of one offset per sequence \(length S = 2\), got "1"/],
    ['slidingWindow without isCausal', call({ ...ok, slidingWindow: 4 }), TypeError, /options\.slidingWindow is only meaningful with options\.isCausal: true/],
    ['an attnMask', call({ ...ok, attnMask: { data: new Uint8Array(49), dims: [7, 7] } }), TypeError,
      /unknown option "attnMask" \(packed sequences take no attnMask, keyLengths, keyStarts/],
    ['keyLengths', call({ ...ok, keyLengths: Int32Array.of(2, 5) }), TypeError, /unknown option "keyLengths" \(packed sequences/],
    ['returnWeights', call({ ...ok, returnWeights: true }), TypeError, /unknown option "returnWeights" \(packed sequences/],
    ['layout', call({ ...ok, layout: 'bshd' }), TypeError, /unknown option "layout" \(packed sequences/],
    ['saved (the backward\'s)', call({ ...ok, saved: {} }), TypeError, /unknown option "saved" \(an option of sdpaVarlenBackward only\)/],
    ['a sink that is NaN', call({ ...ok, sinks: Float32Array.of(0, NaN) }), RangeError, /options\.sinks\[1\] must be a finite number/],
    ['sinks of another length', call({ ...ok, sinks: Float32Array.of(0) }), RangeError, /options\.sinks must have length Hq = 2, got 1/],
    ['scale Infinity', call({ ...ok, scale: Infinity }), RangeError, /options\.scale must be a finite number/],
    ['out too small', call({ ...ok, out: new Float32Array(10) }), RangeError, /options\.out is too small: the output \[7, 2, 8\] needs 112 floats, got 10/],
    ['a rank-4 query', tensors({ ...query, dims: [1, 7, 2, 8] }, key, value), RangeError,
      /sdpaVarlen: query\.dims must be \[Tq, Hq, E\] \(rank 3.*got \[1, 7, 2, 8\] \(rank 4\)/],
    ['a rank-2 key', tensors(query, { ...key, dims: [7, 8] }, value), RangeError, /key\.dims must be \[Tk, Hkv, E\] \(rank 3/],
    ['key of another head size', tensors(query, randomTensor([7, 1, 4], 1), value), RangeError,
      /key\.dims \[7, 1, 4\] \(\[Tk, Hkv, E\]\) must have the query's head size E = 8, got 4/],
    ['value of other rows', tensors(query, key, randomTensor([6, 1, 8], 1)), RangeError,
      /value\.dims \[6, 1, 8\] \(\[Tk, Hkv, Ev\]\) must have the key's rows Tk = 7, got 6/],
    ['value of other heads', tensors(query, key, randomTensor([7, 2, 8], 1)), RangeError,
      /value\.dims \[7, 2, 8\] \(\[Tk, Hkv, Ev\]\) must have the key's heads Hkv = 1, got 2/],
    ['heads not a multiple', () => api.sdpaVarlen(randomTensor([7, 3, 8], 1), randomTensor([7, 2, 8], 2), randomTensor([7, 2, 8], 3), ok),
      RangeError, /query heads Hq = 3 must be a multiple of key\/value heads Hkv = 2/],
    ['a bare Float32Array', tensors(query.data, key, value), TypeError, /query must be a tensor.*a bare array/],
    ['Tk ≠ Tq without cuSeqlensK', () => api.sdpaVarlen(query, randomTensor([9, 1, 8], 1), randomTensor([9, 1, 8], 2),
      { cuSeqlensQ: ok.cuSeqlensQ }), RangeError, /options\.cuSeqlensK is needed: the key's rows Tk = 9 differ from the query's Tq = 7/],
    ['backward: gradOutput of other dims', backward(randomTensor([7, 2, 9], 1), ok), RangeError,
      /sdpaVarlenBackward: gradOutput\.dims must equal the output's dims \[7, 2, 8\], got \[7, 2, 9\]/],
    ['backward: returnLogSumExp', backward(gradOutput, { ...ok, returnLogSumExp: true }), TypeError,
      /unknown option "returnLogSumExp" \(an option of sdpaVarlen only\)/],
    ['backward: accumulate without out', backward(gradOutput, { ...ok, accumulate: true }), TypeError,
      /options\.accumulate adds the gradients into options\.out's arrays; it needs options\.out/],
    ['backward: out.dSinks without sinks', backward(gradOutput, { ...ok, out: { dSinks: new Float32Array(2) } }), TypeError,
      /options\.out\.dSinks is only written with options\.sinks/],
    ['backward: saved of other dims', backward(gradOutput, { ...ok, saved: { output: randomTensor([7, 2, 8], 1), logSumExp: randomTensor([7, 2], 2) } }),
      RangeError, /options\.saved\.logSumExp must have dims \[2, 7\] and 14 elements, got dims \[7, 2\]/],
    ['backward: cuSeqlensQ missing', backward(gradOutput, {}), TypeError, /sdpaVarlenBackward: options\.cuSeqlensQ is required/],
    ['dropoutP 1', call({ ...ok, dropoutP: 1, dropoutSeed: 0 }), RangeError,
      /^sdpaVarlen: options\.dropoutP must be a number in \[0, 1\) \(the probability of dropping each attention weight\), got 1$/],
    ['dropoutP a string', call({ ...ok, dropoutP: '0.1', dropoutSeed: 0 }), TypeError, /^sdpaVarlen: options\.dropoutP must be a number, got "0\.1"$/],
    ['dropoutP without dropoutSeed', call({ ...ok, dropoutP: 0.1 }), TypeError,
      /^sdpaVarlen: options\.dropoutSeed is required with options\.dropoutP > 0 \(an integer in \[0, 2\^32\); .*\), got undefined$/],
    ['dropoutSeed 1.5', call({ ...ok, dropoutP: 0.1, dropoutSeed: 1.5 }), RangeError, /^sdpaVarlen: options\.dropoutSeed must be an integer in \[0, 2\^32\), got 1\.5$/],
    ['backward: dropoutSeed -1', backward(gradOutput, { ...ok, dropoutP: 0.1, dropoutSeed: -1 }), RangeError,
      /^sdpaVarlenBackward: options\.dropoutSeed must be an integer in \[0, 2\^32\), got -1$/],
    ['backward: dropoutP without dropoutSeed', backward(gradOutput, { ...ok, dropoutP: 0.5 }), TypeError,
      /^sdpaVarlenBackward: options\.dropoutSeed is required with options\.dropoutP > 0/],
  ];
}
