// node bench/dropout.mjs [--quick] [--json PATH] [--portable]
// (also run by bench.mjs, after the ALiBi section, unless it is given --no-dropout)
//
// What attention dropout (options.dropoutP with dropoutSeed) costs, one thread, in the same
// round-robin rounds (entries shuffled anew every round):
//   forward   B1 H8 N1024 E64 (--quick: N512), causal and not, each call with `out`:
//               none      sdpa(q, k, v, { isCausal, out })
//               dropout   sdpa(q, k, v, { isCausal, dropoutP: 0.1, dropoutSeed, out })
//   backward  the same shapes: sdpaBackward(q, k, v, dO, { isCausal, saved }) without and with
//             the same dropout (its saved forward made with it)
// Checks first, against the float64 reference of the contract (tests/node/reference.mjs, which
// draws the mask from its own definition): a sample of the dropout forward's rows, and the
// gradients of a smaller problem (H2 N160) with dropout. Reported: medians and dropout ÷ none.
// The project's expectation, printed met / NOT met: dropout within 1.25× of none, forward and
// backward (drawing the mask is a hash of 5 integer operations per probability, beside the
// 2·(E + Ev) multiply-adds that make and use it).
// Results go into the results JSON under `dropout` (standalone: merged into the existing file).
import os from 'node:os';
import { createAttention } from 'sdpa-wasm';
import { describeHostCpu, hostCpu } from './host.mjs';
import { runStandalone } from './results-file.mjs';
import { makeInputs } from './reference.mjs';
import { checkEntries, median, timeRoundRobin } from './round-robin.mjs';
import { maxRelError, referenceProblem, referenceSdpaBackward } from '../tests/node/reference.mjs';

export const DROPOUT_SHAPE = { B: 1, H: 8, N: 1024, quickN: 512, E: 64 };
export const DROPOUT_P = 0.1;
/** dropout ÷ none, at most. */
export const DROPOUT_TARGET = 1.25;
const CHECK_TOLERANCE = 1e-4;
const SEED = 20261204;

const fmtMs = (ms) => (ms >= 10 ? ms.toFixed(2) : ms.toFixed(3));

/** Max relative error of `rows` ([b, h, i]) of `output` [B, H, Lq, Ev] against the float64 reference. */
function checkRows(query, key, value, options, output, rows) {
  const ref = referenceProblem(query, key, value, options);
  const [H, Lq, Ev] = [query.dims[1], query.dims[2], value.dims[3]];
  let worst = 0;
  for (const [b, h, i] of rows) {
    const at = ((b * H + h) * Lq + i) * Ev;
    worst = Math.max(worst, maxRelError(output.subarray(at, at + Ev), ref.row(b, h, i).out));
  }
  return worst;
}

/** The worst relative error of the three gradients of a small problem with dropout, against the reference. */
function checkBackward(attn, causal) {
  const s = makeInputs({ B: 1, H: 2, Hkv: 2, Lq: 160, Lk: 160, E: 64 });
  const options = { isCausal: causal, dropoutP: DROPOUT_P, dropoutSeed: SEED };
  const gradOutput = makeInputs({ B: 1, H: 2, Hkv: 2, Lq: 160, Lk: 1, E: 64 }).q;
  const got = attn.sdpaBackward(s.q, s.k, s.v, gradOutput, options);
  const ref = referenceSdpaBackward(s.q, s.k, s.v, gradOutput, options);
  return Math.max(maxRelError(got.dQuery.data, ref.dQuery), maxRelError(got.dKey.data, ref.dKey),
    maxRelError(got.dValue.data, ref.dValue));
}

/**
 * Runs the dropout section and returns its results (the `dropout` key of the results JSON).
 * options: quick, portable (the portable build), log.
 */
export async function runDropoutBench({ quick = false, portable = false, log = console.log } = {}) {
  const settings = quick ? { warmRuns: 2, minRuns: 5, minSeconds: 0.3 } : { warmRuns: 3, minRuns: 15, minSeconds: 2 };
  const host = hostCpu();
  const attn = await createAttention({ threads: 1, ...(portable ? { relaxedSimd: false } : {}) });
  try {
    const sh = DROPOUT_SHAPE, N = quick ? sh.quickN : sh.N;
    log('');
    log(`Dropout (dropoutP ${DROPOUT_P}): forward and backward B${sh.B} H${sh.H} N${N} E${sh.E}, causal and not, ` +
      `1 thread (${attn.isa} build)`);
    log(`host: ${describeHostCpu(host)}, ${os.cpus().length} vCPUs, load average ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}, ` +
      `Node ${process.versions.node}; medians of >= ${settings.minRuns} runs and >= ${settings.minSeconds} s, round-robin`);
    const p = makeInputs({ B: sh.B, H: sh.H, Hkv: sh.H, Lq: N, Lk: N, E: sh.E });
    const gradOutput = makeInputs({ B: sh.B, H: sh.H, Hkv: sh.H, Lq: N, Lk: 1, E: sh.E }).q;
    const entries = [];
    for (const causal of [false, true]) {
      const variant = causal ? 'causal' : 'not causal';
      const dropout = { dropoutP: DROPOUT_P, dropoutSeed: SEED };
      for (const [role, extra] of [['none', {}], ['dropout', dropout]]) {
        const options = { isCausal: causal, ...extra };
        const out = new Float32Array(sh.B * sh.H * N * sh.E);
        entries.push({
          group: 'forward', variant, role, run: () => attn.sdpa(p.q, p.k, p.v, { ...options, out }).output.data,
          check: role === 'dropout' ? (o) => checkRows(p.q, p.k, p.v, options, o,
            Array.from({ length: sh.H }, (_, h) => [[0, h, 0], [0, h, N >> 1], [0, h, N - 1]]).flat()) : undefined,
        });
        const forward = attn.sdpa(p.q, p.k, p.v, { ...options, returnLogSumExp: true });
        const saved = { output: forward.output, logSumExp: forward.logSumExp };
        entries.push({
          group: 'backward', variant, role, run: () => attn.sdpaBackward(p.q, p.k, p.v, gradOutput, { ...options, saved }).dQuery.data,
          check: role === 'dropout' ? () => checkBackward(attn, causal) : undefined,
        });
      }
    }

    checkEntries(entries, CHECK_TOLERANCE);
    const seconds = timeRoundRobin(entries, settings);
    const rows = [];
    for (const group of ['forward', 'backward']) {
      for (const variant of ['not causal', 'causal']) {
        const find = (role) => entries.find((e) => e.group === group && e.variant === variant && e.role === role);
        const none = median(find('none').times), dropout = median(find('dropout').times);
        const row = { group, variant, noneMs: none, dropoutMs: dropout, dropoutVsNone: dropout / none, checkError: find('dropout').error };
        row.met = row.dropoutVsNone <= DROPOUT_TARGET;
        rows.push(row);
        log(`  ${group.padEnd(8)} ${variant.padEnd(10)}: none ${fmtMs(none)} ms, dropout ${fmtMs(dropout)} ms; ` +
          `dropout ÷ none ${row.dropoutVsNone.toFixed(3)}× (≤ ${DROPOUT_TARGET}×: ${row.met ? 'met' : 'NOT met'})`);
      }
    }
    return {
      date: new Date().toISOString(), host, isa: attn.isa, quick, shape: { ...sh, N }, dropoutP: DROPOUT_P,
      target: DROPOUT_TARGET, runs: Math.min(...entries.map((e) => e.times.length)), seconds, rows,
    };
  } finally {
    attn.dispose();
  }
}

// --- standalone ----------------------------------------------------------------------------------
await runStandalone(import.meta.url, 'dropout', (has) => runDropoutBench({ quick: has('--quick'), portable: has('--portable') }));
