// node bench/window.mjs [--quick] [--json PATH] [--hot] [--portable]
// (also run by bench.mjs, after the decode section, unless it is given --no-window)
//
// What a sliding window costs when decoding from a KV cache that holds the whole context: one
// decode step (Lq = 1) of GQA B1 Hq32 Hkv8 E128 at context 32768 (--quick: 8192), float32 and
// float16 caches, one thread, windows W = 1024 and 4096. In the same round-robin rounds (the
// entries shuffled anew every round):
//   window        cache.attend(q, { slidingWindow: W, out })    the whole context stored
//   mask          cache.attend(q, { attnMask: band, out })      the same window as a Uint8Array
//                                                               [context] mask (1 on the last W)
//   window cache  small.attend(q, { out })                      a cache holding only the last W
//                                                               positions: what a window costs at best
//   whole         cache.attend(q, { out })                      no window: every stored position
// All of a (dtype, W) row compute the same thing, the query against the last W positions: each
// entry's first output is checked against one float64 reference of that (for float16, on the
// positions rounded to halves). Before every timed run the read probe (read-probe.mjs) reads 3×
// the last-level cache (untimed), as decode.mjs does, so every run starts from main memory
// (--hot: no eviction). Reported: medians, and window ÷ window cache, mask ÷ window cache,
// whole ÷ window. The project's expectation, printed met / NOT met: a window over the whole
// context within 1.15× of a cache holding only the window (the segments before the window are
// not read; what is left is the check of each and the merge of the segments).
// Results go into the results JSON under `window` (standalone: merged into the existing file).
import os from 'node:os';
import { createAttention } from 'sdpa-wasm';
import { describeHostCpu, hostCpu } from './host.mjs';
import { runStandalone } from './results-file.mjs';
import { evictionBytes, openReadProbe } from './read-probe.mjs';
import { positions, roundedToHalves } from '../tests/shared/kv-cache-cases.mjs';
import { checkPassed, compare, makeInputs, referenceRows, RELATIVE_TOLERANCE } from './reference.mjs';
import { median, timeRoundRobin } from './round-robin.mjs';

export const WINDOW_SHAPE = { kind: 'GQA', B: 1, Hq: 32, Hkv: 8, E: 128, context: 32768, quickContext: 8192 };
export const WINDOWS = [1024, 4096];
const DTYPES = ['float32', 'float16'];
/** A window over the whole context ÷ a cache holding only the window, at most. */
export const WINDOW_TARGET = 1.15;

const fmtMs = (ms) => (ms >= 10 ? ms.toFixed(2) : ms.toFixed(3));

/**
 * Runs the window section and returns its results (the `window` key of the results JSON).
 * options: quick, hot (no eviction), portable (the portable build), log.
 */
export async function runWindowBench({ quick = false, hot = false, portable = false, log = console.log } = {}) {
  const settings = quick ? { warmRuns: 3, minRuns: 7, minSeconds: 0.3 } : { warmRuns: 5, minRuns: 21, minSeconds: 2 };
  const sh = WINDOW_SHAPE, context = quick ? sh.quickContext : sh.context;
  const host = hostCpu();
  const attn = await createAttention({ threads: 1, ...(portable ? { relaxedSimd: false } : {}) });
  const probe = hot ? null : await openReadProbe({ evictBytes: evictionBytes(host) });
  const caches = [];
  try {
    log('');
    log(`sliding window from a KV cache: one decode step of ${sh.kind} B${sh.B} Hq${sh.Hq} Hkv${sh.Hkv} E${sh.E} at context ${context}, ` +
      `windows ${WINDOWS.join(' and ')}, float32 and float16, 1 thread (${attn.isa} build)`);
    log(`host: ${describeHostCpu(host)}, ${os.cpus().length} vCPUs, load average ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}, Node ${process.versions.node}; ` +
      (probe ? `before every timed run ${(probe.evictBytes / 2 ** 20).toFixed(0)} MiB of other memory read (untimed)` : '--hot: no eviction') +
      `; medians of >= ${settings.minRuns} runs and >= ${settings.minSeconds} s, round-robin`);
    const s = { B: sh.B, H: sh.Hq, Hkv: sh.Hkv, Lq: 1, Lk: context, E: sh.E, causal: false };
    const inputs = makeInputs(s);
    const entries = [];
    for (const dtype of DTYPES) {
      const k = dtype === 'float16' ? roundedToHalves(inputs.k) : inputs.k, v = dtype === 'float16' ? roundedToHalves(inputs.v) : inputs.v;
      const whole = attn.createKVCache({ batch: sh.B, kvHeads: sh.Hkv, headDim: sh.E, maxLength: context, dtype });
      caches.push(whole);
      whole.append(inputs.k, inputs.v);
      const out = () => new Float32Array(sh.B * sh.Hq * sh.E);
      entries.push({ dtype, W: null, role: 'whole', run: ((o) => () => whole.attend(inputs.q, { out: o }).output.data)(out()) });
      for (const W of WINDOWS) {
        const small = attn.createKVCache({ batch: sh.B, kvHeads: sh.Hkv, headDim: sh.E, maxLength: W, dtype });
        caches.push(small);
        small.append(positions(inputs.k, context - W, context), positions(inputs.v, context - W, context));
        const band = new Uint8Array(context).fill(1, context - W);
        // The query against the last W positions (as stored): what every entry of the row computes.
        const ref = referenceRows({ ...s, Lk: W }, { q: inputs.q, k: positions(k, context - W, context), v: positions(v, context - W, context) });
        entries.push(
          { dtype, W, role: 'window', ref, run: ((o) => () => whole.attend(inputs.q, { slidingWindow: W, out: o }).output.data)(out()) },
          { dtype, W, role: 'mask', ref, run: ((o) => () => whole.attend(inputs.q, { attnMask: { data: band, dims: [context] }, out: o }).output.data)(out()) },
          { dtype, W, role: 'window cache', ref, run: ((o) => () => small.attend(inputs.q, { out: o }).output.data)(out()) },
        );
      }
    }
    for (const e of entries) {
      if (!e.ref) continue;
      e.check = compare({ ...s, Lk: e.W }, e.ref, e.run());
      if (!checkPassed(e.check)) throw new Error(`${e.role} ${e.dtype} W ${e.W}: WRONG (max abs error ${e.check.maxAbsErr} > ${RELATIVE_TOLERANCE} × ${e.check.maxAbsRef})`);
    }
    const seconds = timeRoundRobin(entries, settings, () => probe?.evict());
    const rows = [];
    for (const dtype of DTYPES) {
      const whole = median(entries.find((e) => e.dtype === dtype && e.role === 'whole').times);
      for (const W of WINDOWS) {
        const ms = (role) => median(entries.find((e) => e.dtype === dtype && e.W === W && e.role === role).times);
        const row = { dtype, W, windowMs: ms('window'), maskMs: ms('mask'), windowCacheMs: ms('window cache'), wholeMs: whole };
        row.windowVsWindowCache = row.windowMs / row.windowCacheMs;
        row.maskVsWindowCache = row.maskMs / row.windowCacheMs;
        row.wholeVsWindow = whole / row.windowMs;
        row.met = row.windowVsWindowCache <= WINDOW_TARGET;
        rows.push(row);
        log(`  ${dtype.padEnd(7)} W ${String(W).padStart(4)}: window ${fmtMs(row.windowMs)} ms, mask ${fmtMs(row.maskMs)} ms, ` +
          `window cache ${fmtMs(row.windowCacheMs)} ms, whole ${context} ${fmtMs(whole)} ms; window ÷ window cache ${row.windowVsWindowCache.toFixed(2)}× ` +
          `(≤ ${WINDOW_TARGET}×: ${row.met ? 'met' : 'NOT met'}), mask ÷ window cache ${row.maskVsWindowCache.toFixed(2)}×, whole ÷ window ${row.wholeVsWindow.toFixed(1)}×`);
      }
    }
    return {
      date: new Date().toISOString(), host, isa: attn.isa, quick, hot, context, shape: { ...sh }, windows: WINDOWS,
      target: WINDOW_TARGET, runs: Math.min(...entries.map((e) => e.times.length)), seconds, rows,
    };
  } finally {
    for (const c of caches) { try { c.dispose(); } catch { /* ignore */ } }
    attn.dispose();
    await probe?.close();
  }
}

// --- standalone ----------------------------------------------------------------------------------
await runStandalone(import.meta.url, 'window', (has) => runWindowBench({ quick: has('--quick'), hot: has('--hot'), portable: has('--portable') }));
