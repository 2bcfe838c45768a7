// node bench/alibi.mjs [--quick] [--json PATH] [--portable]
// (also run by bench.mjs, after the sliding-window section, unless it is given --no-alibi)
//
// What ALiBi (options.alibiSlopes) costs, one thread, in the same round-robin rounds (entries
// shuffled anew every round), each call with `out`:
//   prefill   B1 H8 N1024 E64 (--quick: N512), causal and not:
//               none    sdpa(q, k, v, { isCausal, out })
//               alibi   sdpa(q, k, v, { isCausal, alibiSlopes, out })       BLOOM's slopes 2^(−(h+1))
//               mask    sdpa(q, k, v, { isCausal, attnMask, out })          the same biases as a float
//                                                                           mask [H, N, N]: the way
//                                                                           without alibiSlopes
//   decode    one step from a KV cache, GQA B1 Hq32 Hkv8 E128, 8192 positions (--quick: 2048),
//             float32 and float16: none and alibi (BLOOM's slopes 2^(−8(h+1)/32))
// Checks first: prefill alibi bitwise the mask form (the same biases, the same additions), and
// a sample of rows of every alibi entry against the float64 reference of the contract
// (tests/node/reference.mjs; a float16 cache on its halves' values). Reported: medians, alibi ÷
// none, mask ÷ alibi. The project's expectation, printed met / NOT met: alibi within 1.15× of
// none (its biases are made where a masked tile's are, without reading a mask).
// Results go into the results JSON under `alibi` (standalone: merged into the existing file).
import os from 'node:os';
import { createAttention } from 'sdpa-wasm';
import { describeHostCpu, hostCpu } from './host.mjs';
import { runStandalone } from './results-file.mjs';
import { makeInputs } from './reference.mjs';
import { checkEntries, median, timeRoundRobin } from './round-robin.mjs';
import { maxRelError, referenceProblem } from '../tests/node/reference.mjs';
import { roundedToHalves } from '../tests/shared/kv-cache-cases.mjs';

export const ALIBI_PREFILL = { B: 1, H: 8, N: 1024, quickN: 512, E: 64 };
export const ALIBI_DECODE = { B: 1, Hq: 32, Hkv: 8, E: 128, context: 8192, quickContext: 2048 };
/** alibi ÷ none, at most. */
export const ALIBI_TARGET = 1.15;
const CHECK_TOLERANCE = 1e-4;

const fmtMs = (ms) => (ms >= 10 ? ms.toFixed(2) : ms.toFixed(3));
const bloomSlopes = (H) => Float32Array.from({ length: H }, (_, h) => 2 ** (-8 * (h + 1) / H));
const sameBits = (a, b) => a.length === b.length &&
  new Uint32Array(a.buffer, a.byteOffset, a.length).every((x, n) => x === new Uint32Array(b.buffer, b.byteOffset, b.length)[n]);

/** The float mask [H, Lq, Lk] of ALiBi's biases (float32, as the kernel makes them), diagonal i + offset. */
function alibiMask(slopes, Lq, Lk, offset) {
  const H = slopes.length, data = new Float32Array(H * Lq * Lk);
  for (let h = 0; h < H; h++) {
    for (let i = 0; i < Lq; i++) {
      for (let j = 0; j < Lk; j++) data[(h * Lq + i) * Lk + j] = -(slopes[h] * Math.abs(i + offset - j));
    }
  }
  return { data, dims: [H, Lq, Lk] };
}

/** Max relative error of `rows` ([b, h, i]) of `output` [B, H, Lq, E] against the float64 reference. */
function checkRows(query, key, value, options, output, rows) {
  const ref = referenceProblem(query, key, value, options);
  const [, H, Lq, Ev] = [query.dims[0], query.dims[1], query.dims[2], value.dims[3]];
  let worst = 0;
  for (const [b, h, i] of rows) {
    const at = ((b * H + h) * Lq + i) * Ev;
    worst = Math.max(worst, maxRelError(output.subarray(at, at + Ev), ref.row(b, h, i).out));
  }
  return worst;
}

/**
 * Runs the ALiBi section and returns its results (the `alibi` key of the results JSON).
 * options: quick, portable (the portable build), log.
 */
export async function runAlibiBench({ quick = false, portable = false, log = console.log } = {}) {
  const settings = quick ? { warmRuns: 2, minRuns: 5, minSeconds: 0.3 } : { warmRuns: 3, minRuns: 15, minSeconds: 2 };
  const host = hostCpu();
  const attn = await createAttention({ threads: 1, ...(portable ? { relaxedSimd: false } : {}) });
  const caches = [];
  try {
    const pf = ALIBI_PREFILL, N = quick ? pf.quickN : pf.N;
    const dc = ALIBI_DECODE, context = quick ? dc.quickContext : dc.context;
    log('');
    log(`ALiBi (alibiSlopes): prefill B${pf.B} H${pf.H} N${N} E${pf.E} causal and not, and one decode step from a cache ` +
      `GQA B${dc.B} Hq${dc.Hq} Hkv${dc.Hkv} E${dc.E} at ${context} positions, float32 and float16, 1 thread (${attn.isa} build)`);
    log(`host: ${describeHostCpu(host)}, ${os.cpus().length} vCPUs, load average ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}, ` +
      `Node ${process.versions.node}; medians of >= ${settings.minRuns} runs and >= ${settings.minSeconds} s, round-robin`);
    const entries = [];

    // Prefill: none, alibi, and the same biases as a float mask [H, N, N].
    const p = makeInputs({ B: pf.B, H: pf.H, Hkv: pf.H, Lq: N, Lk: N, E: pf.E });
    const prefillSlopes = Float32Array.from({ length: pf.H }, (_, h) => 2 ** -(h + 1));
    const mask = alibiMask(prefillSlopes, N, N, 0);
    for (const causal of [false, true]) {
      const out = () => new Float32Array(pf.B * pf.H * N * pf.E);
      const call = (extra) => ((o) => () => attn.sdpa(p.q, p.k, p.v, { isCausal: causal, ...extra, out: o }).output.data)(out());
      const alibiOptions = { isCausal: causal, alibiSlopes: prefillSlopes };
      entries.push(
        { group: 'prefill', variant: causal ? 'causal' : 'not causal', role: 'none', run: call({}) },
        { group: 'prefill', variant: causal ? 'causal' : 'not causal', role: 'alibi', run: call({ alibiSlopes: prefillSlopes }),
          check: (o) => {
            const viaMask = attn.sdpa(p.q, p.k, p.v, { isCausal: causal, attnMask: mask }).output.data;
            if (!sameBits(o, viaMask)) throw new Error(`prefill ${causal ? 'causal' : 'not causal'}: ALiBi differs from its float mask`);
            const rows = Array.from({ length: pf.H }, (_, h) => [[0, h, 0], [0, h, N >> 1], [0, h, N - 1]]).flat();
            return checkRows(p.q, p.k, p.v, alibiOptions, o, rows);
          } },
        { group: 'prefill', variant: causal ? 'causal' : 'not causal', role: 'mask', run: call({ attnMask: mask }) },
      );
    }

    // Decode: one step from a cache of `context` positions, none and alibi.
    const d = makeInputs({ B: dc.B, H: dc.Hq, Hkv: dc.Hkv, Lq: 1, Lk: context, E: dc.E });
    const decodeSlopes = bloomSlopes(dc.Hq);
    for (const dtype of ['float32', 'float16']) {
      const cache = attn.createKVCache({ batch: dc.B, kvHeads: dc.Hkv, headDim: dc.E, maxLength: context, dtype });
      caches.push(cache);
      cache.append(d.k, d.v);
      const out = () => new Float32Array(dc.B * dc.Hq * dc.E);
      const [k, v] = dtype === 'float16' ? [roundedToHalves(d.k), roundedToHalves(d.v)] : [d.k, d.v];
      const stepOptions = { alibiSlopes: decodeSlopes, isCausal: true, causalOffset: context - 1 };
      entries.push(
        { group: 'decode', variant: dtype, role: 'none', run: ((o) => () => cache.attend(d.q, { out: o }).output.data)(out()) },
        { group: 'decode', variant: dtype, role: 'alibi',
          run: ((o) => () => cache.attend(d.q, { alibiSlopes: decodeSlopes, out: o }).output.data)(out()),
          check: (o) => checkRows(d.q, k, v, stepOptions, o, Array.from({ length: dc.Hq }, (_, h) => [0, h, 0])) },
      );
    }

    checkEntries(entries, CHECK_TOLERANCE);
    const seconds = timeRoundRobin(entries, settings);
    const rows = [];
    for (const [group, variant] of [['prefill', 'not causal'], ['prefill', 'causal'], ['decode', 'float32'], ['decode', 'float16']]) {
      const find = (role) => entries.find((e) => e.group === group && e.variant === variant && e.role === role);
      const none = median(find('none').times), alibi = median(find('alibi').times);
      const maskEntry = find('mask');
      const row = { group, variant, noneMs: none, alibiMs: alibi, alibiVsNone: alibi / none, checkError: find('alibi').error };
      if (maskEntry) row.maskMs = median(maskEntry.times), row.maskVsAlibi = row.maskMs / alibi;
      row.met = row.alibiVsNone <= ALIBI_TARGET;
      rows.push(row);
      log(`  ${group} ${variant.padEnd(10)}: none ${fmtMs(none)} ms, alibi ${fmtMs(alibi)} ms` +
        (maskEntry ? `, as a float mask [H, N, N] ${fmtMs(row.maskMs)} ms (mask ÷ alibi ${row.maskVsAlibi.toFixed(2)}×)` : '') +
        `; alibi ÷ none ${row.alibiVsNone.toFixed(3)}× (≤ ${ALIBI_TARGET}×: ${row.met ? 'met' : 'NOT met'})`);
    }
    return {
      date: new Date().toISOString(), host, isa: attn.isa, quick, prefill: { ...pf, N }, decode: { ...dc, context },
      target: ALIBI_TARGET, runs: Math.min(...entries.map((e) => e.times.length)), seconds, rows,
    };
  } finally {
    for (const c of caches) { try { c.dispose(); } catch { /* ignore */ } }
    attn.dispose();
  }
}

// --- standalone ----------------------------------------------------------------------------------
await runStandalone(import.meta.url, 'alibi', (has) => runAlibiBench({ quick: has('--quick'), portable: has('--portable') }));
