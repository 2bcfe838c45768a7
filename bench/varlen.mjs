// node bench/varlen.mjs [--quick] [--json PATH] [--portable]
// (also run by bench.mjs, after the sliding-window section, unless it is given --no-varlen)
//
// What packing sequences of different lengths (attn.sdpaVarlen) saves against the ways there
// were before it, for two batches whose lengths are drawn once from a fixed seed:
//   encoder   32 sentences of 16–256 tokens, H12 E64, not causal (a sentence-embedding model
//             over a page's paragraphs: MiniLM's and BERT-base's heads)
//   short     256 search queries or chat lines of 4–48 tokens, the same heads
//   prefill   8 prompts of 64–1024 tokens, GQA Hq32 Hkv8 E128, causal (a decoder's prompts)
// each on one and two threads, in the same round-robin rounds (entries shuffled every round):
//   varlen        attn.sdpaVarlen(packed [T, H, E], { cuSeqlensQ })
//   padded        attn.sdpa on the batch padded to the longest sequence [S, Lmax, H, E]
//                 ('bshd'), keyLengths for its keys: what a batch without packing computes
//                 (every padded query row too); the padding itself, made once, is not timed
//   one by one    attn.sdpa on each sequence in turn (subarrays of the packed tensors, 'bshd')
// Every entry's output is checked first: varlen and one by one bitwise equal, and the first and
// the longest sequences of varlen and padded against the float64 reference within
// RELATIVE_TOLERANCE. The backward too (training on packed sequences), each with its forward's
// saved output and log-sum-exp:
//   varlen backward      attn.sdpaVarlenBackward (one thread: in chunks of sequences, as varlen)
//   one by one backward  attn.sdpaBackward on each sequence in turn
// checked bitwise equal first. Reported: medians, and the ratios padded ÷ varlen and one by one ÷ varlen,
// beside the work ratio (the padded batch's multiply-adds ÷ the packed ones': its padding query
// rows attend their sequence's keys; its padding keys are skipped, keyLengths). The project's
// expectation, printed met / NOT met: varlen at least as fast as one by one (≥ 0.95×: it is that
// loop, in C++, with short sequences side by side on the threads), forward and backward, and
// padded ÷ varlen at least 0.9 × the work ratio (packing saves what padding adds).
// Results go into the results JSON under `varlen` (standalone: merged into the existing file).
import os from 'node:os';
import { createAttention } from 'sdpa-wasm';
import { describeHostCpu, hostCpu } from './host.mjs';
import { runStandalone } from './results-file.mjs';
import { checkPassed, compare, randomTensor, referenceRows, RELATIVE_TOLERANCE } from './reference.mjs';
import { median, timeRoundRobin } from './round-robin.mjs';

export const VARLEN_BATCHES = [
  { name: 'encoder', sequences: 32, minLength: 16, maxLength: 256, Hq: 12, Hkv: 12, E: 64, causal: false, seed: 7 },
  { name: 'short', sequences: 256, minLength: 4, maxLength: 48, Hq: 12, Hkv: 12, E: 64, causal: false, seed: 5 },
  { name: 'prefill', sequences: 8, minLength: 64, maxLength: 1024, Hq: 32, Hkv: 8, E: 128, causal: true, seed: 11 },
];
/** varlen ÷ one by one, at most; padded ÷ varlen at least this share of the work ratio. */
export const VARLEN_TARGETS = { vsOneByOne: 1 / 0.95, shareOfWorkRatio: 0.9 };

const fmtMs = (ms) => (ms >= 10 ? ms.toFixed(2) : ms.toFixed(3));
const bitsOf = (a) => new Uint32Array(a.buffer, a.byteOffset, a.length);
const sameBits = (a, b) => a.length === b.length && bitsOf(a).every((x, i) => x === bitsOf(b)[i]);

/** Lengths drawn once from the batch's seed (an LCG), uniform in [minLength, maxLength]. */
function lengthsOf(batch) {
  let x = batch.seed >>> 0;
  return Array.from({ length: batch.sequences }, () => {
    x = (x * 1664525 + 1013904223) >>> 0;
    return batch.minLength + Math.floor((x / 2 ** 32) * (batch.maxLength - batch.minLength + 1));
  });
}

/** The packed tensors, the padded batch and the per-sequence views of one batch. */
function inputsOf(batch) {
  const lengths = lengthsOf(batch);
  const { Hq, Hkv, E } = batch;
  const T = lengths.reduce((a, b) => a + b, 0), Lmax = Math.max(...lengths), S = lengths.length;
  const starts = Int32Array.from([0, ...lengths.map(((sum) => (n) => (sum += n))(0))]);
  const q = randomTensor([T, Hq, E], 1), k = randomTensor([T, Hkv, E], 2), v = randomTensor([T, Hkv, E], 3);
  // [S, Lmax, H, E] ('bshd'): sequence s's rows first, zeros after them.
  const pad = (t, H) => {
    const data = new Float32Array(S * Lmax * H * E);
    for (let s = 0; s < S; s++) data.set(t.data.subarray(starts[s] * H * E, starts[s + 1] * H * E), s * Lmax * H * E);
    return { data, dims: [S, Lmax, H, E] };
  };
  const rows = (t, H, s) => ({ data: t.data.subarray(starts[s] * H * E, starts[s + 1] * H * E), dims: [lengths[s], H, E] });
  return {
    lengths, T, Lmax, S, starts, q, k, v,
    padded: { q: pad(q, Hq), k: pad(k, Hkv), v: pad(v, Hkv), keyLengths: Int32Array.from(lengths) },
    sequence: (s) => ({ q: rows(q, Hq, s), k: rows(k, Hkv, s), v: rows(v, Hkv, s) }),
  };
}

/** Sequence s's rows of an output laid out [S, Lmax, Hq, E] (padded) or packed [T, Hq, E]. */
const paddedRows = (out, x, s, Hq, E) => out.subarray(s * x.Lmax * Hq * E, (s * x.Lmax + x.lengths[s]) * Hq * E);
const packedRows = (out, x, s, Hq, E) => out.subarray(x.starts[s] * Hq * E, x.starts[s + 1] * Hq * E);

/** Checks a batch's three entries against each other and two sequences against the float64 reference. */
function check(batch, x, outputs) {
  const { Hq, Hkv, E } = batch;
  const { varlen, padded, oneByOne } = outputs;
  if (!sameBits(varlen, oneByOne)) throw new Error(`${batch.name}: sdpaVarlen differs from sdpa() one sequence at a time`);
  const longest = x.lengths.indexOf(x.Lmax);
  for (const s of [0, longest]) {
    const L = x.lengths[s];
    // [L, H, E] → [1, H, L, E] for the reference.
    const toBhsd = (rows, H) => {
      const data = new Float32Array(H * L * E);
      for (let i = 0; i < L; i++) for (let h = 0; h < H; h++) data.set(rows.subarray((i * H + h) * E, (i * H + h + 1) * E), (h * L + i) * E);
      return { data, dims: [1, H, L, E] };
    };
    const seq = x.sequence(s);
    const shape = { B: 1, H: Hq, Hkv, Lq: L, Lk: L, E, causal: batch.causal };
    const ref = referenceRows(shape, { q: toBhsd(seq.q.data, Hq), k: toBhsd(seq.k.data, Hkv), v: toBhsd(seq.v.data, Hkv) });
    for (const [what, rows] of [['varlen', packedRows(varlen, x, s, Hq, E)], ['padded', paddedRows(padded, x, s, Hq, E)]]) {
      const result = compare(shape, ref, toBhsd(rows, Hq).data);
      if (!checkPassed(result)) {
        throw new Error(`${batch.name} ${what}, sequence ${s}: WRONG (max abs error ${result.maxAbsErr} > ${RELATIVE_TOLERANCE} × ${result.maxAbsRef})`);
      }
    }
  }
}

/**
 * Runs the varlen section and returns its results (the `varlen` key of the results JSON).
 * options: quick, portable (the portable build), log.
 */
export async function runVarlenBench({ quick = false, portable = false, log = console.log } = {}) {
  const settings = quick ? { warmRuns: 2, minRuns: 5, minSeconds: 0.3 } : { warmRuns: 3, minRuns: 15, minSeconds: 2 };
  const host = hostCpu();
  const instances = [];
  try {
    for (const threads of [1, 2]) instances.push(await createAttention({ threads, ...(portable ? { relaxedSimd: false } : {}) }));
    log('');
    log(`packed variable-length sequences (sdpaVarlen) against a padded batch and one sdpa() per sequence, 1 and 2 threads (${instances[0].isa} build)`);
    log(`host: ${describeHostCpu(host)}, ${os.cpus().length} vCPUs, load average ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}, Node ${process.versions.node}; ` +
      `medians of >= ${settings.minRuns} runs and >= ${settings.minSeconds} s, round-robin`);
    const entries = [];
    const batches = VARLEN_BATCHES.map((batch) => {
      const x = inputsOf(batch);
      // Keys a row attends, summed over the rows: packed, each sequence's own rows; padded, also
      // the Lmax − L padding rows (a padding row attends the sequence's L keys, keyLengths
      // skipping the padding keys; causal, top-left: row i < L attends i + 1 keys).
      const attended = (L) => (batch.causal ? (L * (L + 1)) / 2 : L * L);
      const work = x.lengths.reduce((a, L) => a + attended(L), 0);
      const paddedWork = x.lengths.reduce((a, L) => a + attended(L) + (x.Lmax - L) * L, 0);
      const info = { ...batch, lengths: x.lengths, T: x.T, Lmax: x.Lmax, workRatio: paddedWork / work };
      log(`  ${batch.name}: ${batch.sequences} sequences of ${Math.min(...x.lengths)}–${x.Lmax} tokens (${x.T} in all), ` +
        `Hq${batch.Hq} Hkv${batch.Hkv} E${batch.E}${batch.causal ? ', causal' : ''}; padding multiplies the multiply-adds by ${info.workRatio.toFixed(2)}`);
      for (const attn of instances) {
        const threads = attn.threads;
        const options = batch.causal ? { isCausal: true } : {};
        const varlenOut = new Float32Array(x.T * batch.Hq * batch.E);
        const paddedOut = new Float32Array(x.S * x.Lmax * batch.Hq * batch.E);
        const oneOut = new Float32Array(x.T * batch.Hq * batch.E);
        const run = {
          varlen: () => attn.sdpaVarlen(x.q, x.k, x.v, { cuSeqlensQ: x.starts, ...options, out: varlenOut }),
          padded: () => attn.sdpa(x.padded.q, x.padded.k, x.padded.v,
            { layout: 'bshd', keyLengths: x.padded.keyLengths, ...options, out: paddedOut }),
          'one by one': () => {
            for (let s = 0; s < x.S; s++) {
              const seq = x.sequence(s);
              attn.sdpa(seq.q, seq.k, seq.v, { layout: 'bshd', ...options, out: packedRows(oneOut, x, s, batch.Hq, batch.E) });
            }
          },
        };
        // The backward (training on packed sequences): sdpaVarlenBackward with its forward's
        // saved output and log-sum-exp, against sdpaBackward on each sequence in turn with its
        // own (the forwards made once, not timed).
        const gradOutput = { data: randomTensor([x.T, batch.Hq, batch.E], 4).data, dims: [x.T, batch.Hq, batch.E] };
        const varlenSaved = attn.sdpaVarlen(x.q, x.k, x.v, { cuSeqlensQ: x.starts, ...options, returnLogSumExp: true });
        const sequenceSaved = Array.from({ length: x.S }, (_, s) => {
          const seq = x.sequence(s);
          return attn.sdpa(seq.q, seq.k, seq.v, { layout: 'bshd', ...options, returnLogSumExp: true });
        });
        const gradOf = (s) => ({ data: packedRows(gradOutput.data, x, s, batch.Hq, batch.E), dims: [x.lengths[s], batch.Hq, batch.E] });
        const dVarlen = { dQuery: new Float32Array(x.T * batch.Hq * batch.E), dKey: new Float32Array(x.T * batch.Hkv * batch.E),
          dValue: new Float32Array(x.T * batch.Hkv * batch.E) };
        const dOne = { dQuery: new Float32Array(x.T * batch.Hq * batch.E), dKey: new Float32Array(x.T * batch.Hkv * batch.E),
          dValue: new Float32Array(x.T * batch.Hkv * batch.E) };
        run['varlen backward'] = () => attn.sdpaVarlenBackward(x.q, x.k, x.v, gradOutput,
          { cuSeqlensQ: x.starts, ...options, saved: varlenSaved, out: dVarlen });
        run['one by one backward'] = () => {
          for (let s = 0; s < x.S; s++) {
            const seq = x.sequence(s);
            attn.sdpaBackward(seq.q, seq.k, seq.v, gradOf(s), { layout: 'bshd', ...options, saved: sequenceSaved[s], out: {
              dQuery: packedRows(dOne.dQuery, x, s, batch.Hq, batch.E), dKey: packedRows(dOne.dKey, x, s, batch.Hkv, batch.E),
              dValue: packedRows(dOne.dValue, x, s, batch.Hkv, batch.E) } });
          }
        };
        for (const role of Object.keys(run)) run[role]();
        check(batch, x, { varlen: varlenOut, padded: paddedOut, oneByOne: oneOut });
        for (const name of ['dQuery', 'dKey', 'dValue']) {  // each sequence's gradients are sdpaBackward()'s for it alone
          if (!sameBits(dVarlen[name], dOne[name])) throw new Error(`${batch.name}: sdpaVarlenBackward's ${name} differs from sdpaBackward() one sequence at a time`);
        }
        for (const [role, fn] of Object.entries(run)) entries.push({ batch: batch.name, threads, role, run: fn, times: [] });
      }
      return info;
    });
    const seconds = timeRoundRobin(entries, settings);
    const rows = [];
    for (const batch of batches) {
      for (const threads of [1, 2]) {
        const ms = (role) => median(entries.find((e) => e.batch === batch.name && e.threads === threads && e.role === role).times);
        const row = { batch: batch.name, threads, varlenMs: ms('varlen'), paddedMs: ms('padded'), oneByOneMs: ms('one by one'), workRatio: batch.workRatio,
          backwardMs: ms('varlen backward'), oneByOneBackwardMs: ms('one by one backward') };
        row.paddedVsVarlen = row.paddedMs / row.varlenMs;
        row.oneByOneVsVarlen = row.oneByOneMs / row.varlenMs;
        row.oneByOneVsVarlenBackward = row.oneByOneBackwardMs / row.backwardMs;
        row.met = row.varlenMs <= VARLEN_TARGETS.vsOneByOne * row.oneByOneMs &&
          row.paddedVsVarlen >= VARLEN_TARGETS.shareOfWorkRatio * batch.workRatio &&
          row.backwardMs <= VARLEN_TARGETS.vsOneByOne * row.oneByOneBackwardMs;
        rows.push(row);
        log(`  ${batch.name.padEnd(7)} ${threads} thread${threads > 1 ? 's' : ' '}: varlen ${fmtMs(row.varlenMs)} ms, padded ${fmtMs(row.paddedMs)} ms, ` +
          `one by one ${fmtMs(row.oneByOneMs)} ms; padded ÷ varlen ${row.paddedVsVarlen.toFixed(2)}× (work ratio ${batch.workRatio.toFixed(2)}), ` +
          `one by one ÷ varlen ${row.oneByOneVsVarlen.toFixed(2)}×; backward: varlen ${fmtMs(row.backwardMs)} ms, ` +
          `one by one ${fmtMs(row.oneByOneBackwardMs)} ms (÷ varlen ${row.oneByOneVsVarlenBackward.toFixed(2)}×) (${row.met ? 'met' : 'NOT met'})`);
      }
    }
    return {
      date: new Date().toISOString(), host, isa: instances[0].isa, quick, batches, targets: VARLEN_TARGETS,
      runs: Math.min(...entries.map((e) => e.times.length)), seconds, rows,
    };
  } finally {
    for (const attn of instances) attn.dispose();
  }
}

// --- standalone ----------------------------------------------------------------------------------
await runStandalone(import.meta.url, 'varlen', (has) => runVarlenBench({ quick: has('--quick'), portable: has('--portable') }));
