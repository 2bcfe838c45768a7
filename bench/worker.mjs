// node bench/worker.mjs [--quick] [--json PATH] [--threads 1,2] [--hot]
// (also run by bench.mjs, as its last section, unless it is given --no-worker)
//
// What createAttentionWorker() costs per call: the same work run directly on this thread and
// through the worker (a worker_threads Worker holding its own Attention), with the inputs
// copied (the default) or moved ({ transfer: true }), for
//   (a)     sdpa() on shape (a) of shapes.mjs, B1 H12 N128 E64, not causal:
//             direct     attn.sdpa(q, k, v)
//             copy       await worker.sdpa(q, k, v)
//             transfer   await worker.sdpa(q, k, v, { transfer: true })
//   decode  one decode step from a float32 KV cache, GQA B1 Hq32 Hkv8 E128, context 4096,
//           filled once (append of random K/V; the direct cache and the worker's hold the same):
//             direct     cache.attend(q)
//             copy       await wcache.attend(q)
//             transfer   await wcache.attend(q, { transfer: true })
//           and, in the same rounds, a call with no work, the bare round trip:
//             direct     cache.truncate(context)          (length stays context)
//             worker     await wcache.truncate(context)
//           and a baseline without the package's worker API: a plain worker_threads Worker
//           (this file, role 'sdpa-bench-worker-baseline') holding its own Attention and the same
//           cache, that runs cache.attend(q) on a postMessage'd query and posts the output back
//           (transferred) with the attend time it measured inside itself; so the added time
//           splits into the kernel in another thread, the messaging and waking, and the API.
// each on createAttention({ threads: t }) beside createAttentionWorker({ threads: t }), t = 1
// and 2 (`threads` asserted on both). Every call gets fresh input arrays (a transferred array
// is detached by the call): a clone of the inputs is made right before each timed call, outside
// the timed region, for the direct call too, so all three read inputs just written. No `out`:
// the direct call returns a new output array and the worker's reply transfers a new one.
// Each entry's first output is checked against the float64 reference (reference.mjs) and must
// be bitwise the direct call's. Then warm-up, then round-robin rounds (one run of each entry
// per round, the starting entry rotated every round, so drift and load from other processes
// hit all alike); medians reported, worker ÷ direct and worker − direct (the added ms: the
// difference of the medians, and the median of the per-round differences beside it). Before
// every timed decode run (every entry, direct too) the read probe (read-probe.mjs) reads 3× the
// last-level cache, untimed, as decode.mjs does (--hot: no eviction).
// Targets, printed met / NOT met: (a) with transfer ≤ 1.25× the direct time; a decode step
// ≤ 0.2 ms added, copy and transfer (attend alone) and a whole step (append and attend sent
// together); each at every thread count measured.
// Results go into the results JSON under `worker` (standalone: merged into the existing file).
import { readFileSync, statSync } from 'node:fs';
import os from 'node:os';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';
import { createAttention, createAttentionWorker } from 'sdpa-wasm';
import { describeHostCpu, hostCpu } from './host.mjs';
import { DEFAULT_RESULTS_PATH, writeSection } from './results-file.mjs';
import { evictionBytes, openReadProbe } from './read-probe.mjs';
import { checkPassed, compare, makeInputs, referenceRows, RELATIVE_TOLERANCE } from './reference.mjs';
import { SHAPES, describe } from './shapes.mjs';

export const WORKER_SDPA_SHAPE = SHAPES.find((s) => s.id === 'a');
export const WORKER_DECODE_SHAPE = { kind: 'GQA', B: 1, Hq: 32, Hkv: 8, E: 128, context: 4096, dtype: 'float32' };
export const WORKER_THREADS = [1, 2];
// The project's targets for the worker (the issue).
export const WORKER_TARGETS = {
  sdpaTransfer: { shape: 'a', vsDirect: 1.25 },   // (a), { transfer: true }: worker ≤ 1.25× direct
  decodeAddedMs: 0.2,                             // decode step, copy and transfer: worker − direct ≤ 0.2 ms
};

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const fmtMs = (ms) => (ms === null || ms === undefined ? '-' : ms >= 100 ? ms.toFixed(1) : ms >= 10 ? ms.toFixed(2) : ms.toFixed(3));
const fmtX = (x) => (x === null || x === undefined ? '-' : `${x.toFixed(2)}×`);
const fmtAdd = (ms) => (ms === null || ms === undefined ? '-' : `${ms >= 0 ? '+' : ''}${ms.toFixed(3)}`);
const errText = (e) => String(e?.message ?? e).replace(/\s+/g, ' ').slice(0, 400);
const fmtLoad = (l) => l.map((x) => x.toFixed(2)).join(' ');
const ownCpuMs = () => { const c = process.cpuUsage(); return (c.user + c.system) / 1000; };
/** Busy CPU time of the whole machine so far (all processes, all vCPUs, from /proc/stat), ms. */
const machineBusyMs = () => os.cpus().reduce((a, c) => a + c.times.user + c.times.nice + c.times.sys + c.times.irq, 0);
const clone = (t) => ({ data: t.data.slice(), dims: [...t.dims] });
/** The last position of a [B, H, L, D] tensor, as [B, H, 1, D]. */
function lastPosition(t) {
  const [B, H, L, D] = t.dims;
  const data = new Float32Array(B * H * D);
  for (let bh = 0; bh < B * H; bh++) data.set(t.data.subarray((bh * L + L - 1) * D, (bh * L + L) * D), bh * D);
  return { data, dims: [B, H, 1, D] };
}
const sameBits = (a, b) => {
  if (a.length !== b.length) return false;
  const x = new Uint32Array(a.buffer, a.byteOffset, a.length), y = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return false;
  return true;
};


/**
 * Runs the worker section and returns its results (the `worker` key of the results JSON).
 * options: quick, threads (override, e.g. [1]), hot (no eviction before decode runs), log.
 */
export async function runWorkerBench(options = {}) {
  const held = { attn: [], workers: [], plain: [], probe: null };   // released whatever happens
  try {
    return await workerSection(options, held);
  } finally {
    for (const a of held.attn) { try { a.dispose(); } catch { /* ignore */ } }
    for (const w of held.workers) { try { await w.dispose(); } catch { /* ignore */ } }
    for (const w of held.plain) { try { await w.terminate(); } catch { /* ignore */ } }
    await held.probe?.close();
  }
}

async function workerSection({ quick = false, threads = null, hot = false, log = console.log } = {}, held) {
  const settings = quick
    ? { warmSeconds: 0.1, minWarmups: 3, minRuns: 11, minSeconds: 0.3, maxRuns: 100 }
    : { warmSeconds: 0.5, minWarmups: 5, minRuns: 41, minSeconds: 3, maxRuns: 400 };
  settings.evict = !hot;
  const threadCounts = threads ?? WORKER_THREADS;
  const t0All = performance.now();
  const host = hostCpu();
  const loadBefore = os.loadavg();
  const sa = WORKER_SDPA_SHAPE, dk = WORKER_DECODE_SHAPE;
  const sDecode = { B: dk.B, H: dk.Hq, Hkv: dk.Hkv, Lq: 1, Lk: dk.context, E: dk.E, causal: false };   // Lq = 1: causal (bottom-right) = no mask
  const decodeName = `decode ${dk.kind} B${dk.B} Hq${dk.Hq} Hkv${dk.Hkv} E${dk.E} ctx ${dk.context} ${dk.dtype}`;
  const cacheBytes = dk.B * dk.Hkv * dk.context * 2 * dk.E * 4;

  log('');
  log(`worker overhead${quick ? ' (--quick)' : ''}: createAttentionWorker() (a worker_threads Worker) against the direct call on this thread, ` +
    `inputs copied or moved ({ transfer: true }); (a) ${describe(sa)}: sdpa(); ${decodeName} (${(cacheBytes / 2 ** 20).toFixed(0)} MiB): ` +
    `cache.attend(q), a call with no work (truncate to the same length) for the bare round trip, and a plain worker_threads Worker running the same attend ` +
    `(baseline, no package worker API); threads ${threadCounts.join(' and ')}`);
  log(`host: ${describeHostCpu(host)}, ${os.cpus().length} vCPUs, load average ${fmtLoad(loadBefore)}, Node ${process.versions.node}, V8 ${process.versions.v8}`);

  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));
  const build = Object.fromEntries(['index.js', 'worker.js', 'worker-entry.js', 'wasm/sdpa.wasm', 'wasm/sdpa-mt.wasm'].map((f) => {
    try { return [`dist/${f}`, statSync(new URL(`../dist/${f}`, import.meta.url)).mtime.toISOString()]; } catch { return [`dist/${f}`, null]; }
  }));
  const probe = settings.evict ? (held.probe = await openReadProbe({ evictBytes: evictionBytes(host) })) : null;
  log(`sdpa-wasm ${pkg.version} (build ${Object.entries(build).map(([f, t]) => `${f} ${t}`).join(', ')}); ` +
    `fresh input arrays for every call (cloned before the timed region, for the direct call too); no \`out\` (a new output array per call, direct and worker); ` +
    (probe ? `decode: before every timed run ${(probe.evictBytes / 2 ** 20).toFixed(0)} MiB of other memory read on both threads (untimed)` : 'decode: --hot, no eviction'));
  log(`check: max abs error vs the float64 reference <= ${RELATIVE_TOLERANCE} × its largest |value|, and the worker's output bitwise the direct call's; ` +
    `warm-up >= ${settings.warmSeconds} s and ${settings.minWarmups} runs; timing: round-robin rounds (starting entry rotated), ` +
    `median of >= ${settings.minRuns} runs and >= ${settings.minSeconds} s (at most ${settings.maxRuns} rounds)`);

  const inputsA = makeInputs(sa);
  const refA = referenceRows(sa, inputsA);
  const inputsD = makeInputs(sDecode);
  const refD = referenceRows(sDecode, inputsD);

  // One run: inputs prepared (untimed), then the call, timed to its result (awaited for the worker).
  const call = async (e) => {
    const args = e.fresh ? e.fresh() : null;
    if (e.evict && probe) probe.evict();
    const c0 = ownCpuMs();
    const t0 = performance.now();
    let out = e.run(args);
    if (out && typeof out.then === 'function') out = await out;
    const ms = performance.now() - t0;
    return { out, ms, cpuMs: ownCpuMs() - c0 };
  };

  async function prepare(e, s, ref, direct) {
    const r = { name: e.name, role: e.role, mode: e.mode, threads: e.threads };
    try {
      const { out, ms } = await call(e);
      r.firstRunMs = ms;
      if (e.check) {
        r.check = compare(s, ref, out);
        r.bitwiseDirect = direct === undefined ? null : sameBits(out, direct);
        if (!checkPassed(r.check)) return { e, r: { ...r, status: 'wrong', reason: `check failed: max abs error ${r.check.maxAbsErr.toExponential(2)} > ${RELATIVE_TOLERANCE} × max |ref| ${r.check.maxAbsRef.toExponential(2)}` } };
        if (r.bitwiseDirect === false) return { e, r: { ...r, status: 'wrong', reason: 'the output is not bitwise the direct call\'s' }, out };
      }
      let warmups = 1;
      const t0 = performance.now();
      while (warmups < settings.minWarmups || performance.now() - t0 < settings.warmSeconds * 1000) {
        await call(e);
        warmups++;
      }
      r.warmups = warmups;
      return { e, r, out, live: true };
    } catch (err) {
      return { e, r: { ...r, status: 'failed', reason: `run failed: ${errText(err)}` } };
    }
  }

  async function timeRounds(prepared) {
    const live = prepared.filter((p) => p.live);
    const times = new Map(live.map((p) => [p, []]));
    const cpu = new Map(live.map((p) => [p, 0]));
    const start = performance.now();
    let rounds = 0;
    while (live.some((p) => p.live) && rounds < settings.maxRuns &&
      (rounds < settings.minRuns || performance.now() - start < settings.minSeconds * 1000)) {
      for (let i = 0; i < live.length; i++) {
        const p = live[(i + rounds) % live.length];
        if (!p.live) continue;
        try {
          const run = await call(p.e);
          times.get(p).push(run.ms);
          if (p.e.inside) (p.inside ??= []).push(p.e.inside());
          cpu.set(p, cpu.get(p) + run.cpuMs);
        } catch (err) {
          p.r = { ...p.r, status: 'failed', reason: `run failed while timing: ${errText(err)}` };
          p.live = false;
        }
      }
      rounds++;
    }
    for (const p of live) {
      if (!p.live) continue;
      const ts = times.get(p);
      p.r = { ...p.r, status: 'ok', runs: ts.length, medianMs: median(ts), minMs: Math.min(...ts), maxMs: Math.max(...ts),
        cpuPerWall: cpu.get(p) / ts.reduce((a, b) => a + b, 0) };
      if (p.inside) p.r.insideMs = median(p.inside);
      p.times = ts;
    }
    return { rounds, seconds: (performance.now() - start) / 1000 };
  }

  // A group: its entries checked and warmed up, then timed in the same rounds.
  const groups = [];
  async function runGroup(meta, s, ref, entries, pairs) {
    const tGroup = performance.now();
    const group = { ...meta, loadavgBefore: os.loadavg() };
    const prepared = [];
    let direct;
    for (const e of entries) {
      const p = await prepare(e, s, ref, e.role === 'direct' ? undefined : direct);
      if (e.role === 'direct' && e.check) direct = p.out;
      if (p.r.status) log(`  ${e.name}: ${p.r.status.toUpperCase()}: ${p.r.reason}`);
      prepared.push(p);
    }
    const busy0 = machineBusyMs(), own0 = ownCpuMs(), wall0 = performance.now();
    const timing = await timeRounds(prepared);
    group.otherProcessesCores = Math.max(0, ((machineBusyMs() - busy0) - (ownCpuMs() - own0)) / (performance.now() - wall0));
    group.rounds = timing.rounds;
    group.timedSeconds = timing.seconds;
    group.loadavgAfter = os.loadavg();
    group.entries = prepared.map((p) => p.r);
    // worker vs direct: ratio of medians, difference of medians, median of the per-round differences.
    group.comparisons = pairs.map(([w, d]) => {
      const pw = prepared.find((p) => p.e.name === w), pd = prepared.find((p) => p.e.name === d);
      const ok = pw?.r.status === 'ok' && pd?.r.status === 'ok';
      const bad = [pw, pd].find((p) => p?.r.status !== 'ok');
      return {
        worker: w, direct: d, mode: pw?.e.mode ?? null, threads: meta.threads,
        status: ok ? 'ok' : bad?.r.status ?? 'missing', reason: ok ? null : `${bad?.r.name ?? 'an entry'}: ${bad?.r.reason ?? 'not run'}`,
        workerMs: ok ? pw.r.medianMs : null, directMs: ok ? pd.r.medianMs : null,
        ratio: ok ? pw.r.medianMs / pd.r.medianMs : null,
        addedMs: ok ? pw.r.medianMs - pd.r.medianMs : null,
        addedMsPaired: ok ? median(pw.times.map((t, i) => t - pd.times[i])) : null,
        insideMs: ok ? pw.r.insideMs ?? null : null,
      };
    });
    group.seconds = (performance.now() - tGroup) / 1000;
    groups.push(group);
    log(`  ${meta.case} ${meta.threads}t: ${timing.rounds} rounds in ${timing.seconds.toFixed(1)} s (${group.seconds.toFixed(1)} s with set-up); ` +
      `other processes used ${group.otherProcessesCores.toFixed(2)} cores meanwhile; load average ${fmtLoad(group.loadavgAfter)}`);
    for (const r of group.entries.filter((x) => x.status === 'ok')) {
      log(`    ${r.name.padEnd(58)} ${fmtMs(r.medianMs).padStart(8)} ms  (${r.runs} runs, ${fmtMs(r.minMs)}–${fmtMs(r.maxMs)}` +
        `${r.check ? `, max abs err ${r.check.maxAbsErr.toExponential(1)}` : ''}${r.bitwiseDirect ? ', bitwise = direct' : ''}, CPU/wall ${r.cpuPerWall.toFixed(2)}` +
        `${r.insideMs !== undefined ? `; attend inside the worker ${fmtMs(r.insideMs)} ms, median` : ''})`);
    }
    return group;
  }

  for (const t of threadCounts) {
    const attn = await createAttention({ threads: t });
    held.attn.push(attn);
    if (attn.threads !== t) throw new Error(`sdpa-wasm: asked for ${t} threads, got attn.threads = ${attn.threads}`);
    const worker = await createAttentionWorker({ threads: t });
    held.workers.push(worker);
    if (worker.threads !== t) throw new Error(`sdpa-wasm: asked for ${t} threads, got worker.threads = ${worker.threads}`);

    // (a): sdpa() with fresh q, k, v per call.
    const freshA = () => [clone(inputsA.q), clone(inputsA.k), clone(inputsA.v)];
    log('');
    log(`(a) ${describe(sa)}, ${t} thread${t > 1 ? 's' : ''}:`);
    await runGroup({ case: '(a)', shape: describe(sa), threads: t }, sa, refA, [
      { name: `direct attn.sdpa(q, k, v) ${t}t`, role: 'direct', mode: 'direct', threads: t, check: true, fresh: freshA,
        run: ([q, k, v]) => attn.sdpa(q, k, v).output.data },
      { name: `worker.sdpa(q, k, v) copy ${t}t`, role: 'worker', mode: 'copy', threads: t, check: true, fresh: freshA,
        run: ([q, k, v]) => worker.sdpa(q, k, v).then((r) => r.output.data) },
      { name: `worker.sdpa(q, k, v, { transfer: true }) ${t}t`, role: 'worker', mode: 'transfer', threads: t, check: true, fresh: freshA,
        run: ([q, k, v]) => worker.sdpa(q, k, v, { transfer: true }).then((r) => r.output.data) },
    ], [[`worker.sdpa(q, k, v) copy ${t}t`, `direct attn.sdpa(q, k, v) ${t}t`],
      [`worker.sdpa(q, k, v, { transfer: true }) ${t}t`, `direct attn.sdpa(q, k, v) ${t}t`]]);

    // Decode: the same float32 cache, filled once, here and in the worker.
    log('');
    log(`${decodeName}, ${t} thread${t > 1 ? 's' : ''}:`);
    const cacheOptions = { batch: dk.B, kvHeads: dk.Hkv, headDim: dk.E, valueDim: dk.E, maxLength: dk.context, dtype: dk.dtype };
    const cache = attn.createKVCache(cacheOptions);
    const wcache = await worker.createKVCache(cacheOptions);
    try {
      cache.append(inputsD.k, inputsD.v);
      await wcache.append(inputsD.k, inputsD.v);
      if (cache.length !== dk.context || wcache.length !== dk.context) throw new Error(`cache lengths ${cache.length} / ${wcache.length}, expected ${dk.context}`);
      const plain = await startBaseline({ threads: t, cacheOptions, shape: sDecode });
      held.plain.push(plain);
      if (probe) probe.evict();
      const freshQ = () => clone(inputsD.q);
      const newK = lastPosition(inputsD.k), newV = lastPosition(inputsD.v);
      const freshStep = () => [clone(inputsD.q), clone(newK), clone(newV)];
      await runGroup({ case: 'decode', shape: decodeName, cacheBytes, threads: t }, sDecode, refD, [
        { name: `direct cache.attend(q) ${t}t`, role: 'direct', mode: 'direct', threads: t, check: true, evict: true, fresh: freshQ,
          run: (q) => cache.attend(q).output.data },
        { name: `worker wcache.attend(q) copy ${t}t`, role: 'worker', mode: 'copy', threads: t, check: true, evict: true, fresh: freshQ,
          run: (q) => wcache.attend(q).then((r) => r.output.data) },
        { name: `worker wcache.attend(q, { transfer: true }) ${t}t`, role: 'worker', mode: 'transfer', threads: t, check: true, evict: true, fresh: freshQ,
          run: (q) => wcache.attend(q, { transfer: true }).then((r) => r.output.data) },
        { name: `baseline: plain worker_threads Worker, attend + postMessage ${t}t`, role: 'worker', mode: 'plain', threads: t, check: true, evict: true, fresh: freshQ,
          run: (q) => plain.attend(q), inside: () => plain.lastInsideMs },
        // A whole decode step: the new position's K/V appended, then attended to. Each run first
        // rewinds one position, so the cache (and the result) stays the same from run to run.
        { name: `direct step: truncate, append, attend ${t}t`, role: 'direct', mode: 'step', threads: t, check: true, evict: true, fresh: freshStep,
          run: ([q, k, v]) => {
            cache.truncate(dk.context - 1);
            cache.append(k, v);
            return cache.attend(q).output.data;
          } },
        { name: `worker step: truncate, append, attend (one message) ${t}t`, role: 'worker', mode: 'step', threads: t, check: true, evict: true, fresh: freshStep,
          run: async ([q, k, v]) => {
            const rewound = wcache.truncate(dk.context - 1);
            const appended = wcache.append(k, v);
            const { output } = await wcache.attend(q);
            await Promise.all([rewound, appended]);
            return output.data;
          } },
        { name: `direct cache.truncate(${dk.context}) (no work) ${t}t`, role: 'direct', mode: 'no-op', threads: t, check: false,
          run: () => cache.truncate(dk.context) },
        { name: `worker wcache.truncate(${dk.context}) (round trip) ${t}t`, role: 'worker', mode: 'no-op', threads: t, check: false,
          run: () => wcache.truncate(dk.context) },
      ], [[`worker wcache.attend(q) copy ${t}t`, `direct cache.attend(q) ${t}t`],
        [`worker wcache.attend(q, { transfer: true }) ${t}t`, `direct cache.attend(q) ${t}t`],
        [`baseline: plain worker_threads Worker, attend + postMessage ${t}t`, `direct cache.attend(q) ${t}t`],
        [`worker step: truncate, append, attend (one message) ${t}t`, `direct step: truncate, append, attend ${t}t`],
        [`worker wcache.truncate(${dk.context}) (round trip) ${t}t`, `direct cache.truncate(${dk.context}) (no work) ${t}t`]]);
    } finally {
      cache.dispose();
      await wcache.dispose();
      for (const w of held.plain.splice(0)) await w.terminate();
    }
    attn.dispose();
    held.attn.splice(held.attn.indexOf(attn), 1);
    await worker.dispose();
    held.workers.splice(held.workers.indexOf(worker), 1);
  }

  // --- summary, targets --------------------------------------------------------------------------
  const rows = groups.flatMap((g) => g.comparisons.map((c) => ({ case: g.case, shape: g.shape, ...c, rounds: g.rounds, otherProcessesCores: g.otherProcessesCores })));
  log('');
  log(`worker summary (host ${describeHostCpu(host)}): medians, ms; ×direct = worker ÷ direct; added = worker − direct (difference of the medians; ` +
    `paired = median of the per-round differences); no-op = truncate to the same length, the bare round trip; ` +
    `plain = the baseline, a plain worker_threads Worker running cache.attend(q) (in worker = its attend time measured inside it); others = cores other processes used during the rounds`);
  log(`  ${'case'.padEnd(8)}${'mode'.padEnd(10)}${'thr'.padStart(4)}${'direct ms'.padStart(11)}${'worker ms'.padStart(11)}${'×direct'.padStart(9)}` +
    `${'added ms'.padStart(10)}${'paired'.padStart(9)}${'in worker'.padStart(11)}${'rounds'.padStart(8)}${'others'.padStart(8)}`);
  for (const r of rows) {
    if (r.status !== 'ok') { log(`  ${r.case.padEnd(8)}${String(r.mode).padEnd(10)}${String(r.threads).padStart(4)}  ${r.status} (below)`); continue; }
    log(`  ${r.case.padEnd(8)}${String(r.mode).padEnd(10)}${String(r.threads).padStart(4)}${fmtMs(r.directMs).padStart(11)}${fmtMs(r.workerMs).padStart(11)}` +
      `${fmtX(r.ratio).padStart(9)}${fmtAdd(r.addedMs).padStart(10)}${fmtAdd(r.addedMsPaired).padStart(9)}${(r.insideMs != null ? fmtMs(r.insideMs) : '').padStart(11)}${String(r.rounds).padStart(8)}${r.otherProcessesCores.toFixed(2).padStart(8)}`);
  }
  const targets = [];
  for (const t of threadCounts) {
    const a = rows.find((r) => r.case === '(a)' && r.mode === 'transfer' && r.threads === t);
    targets.push({
      what: `(a) worker.sdpa({ transfer: true }) ≤ ${WORKER_TARGETS.sdpaTransfer.vsDirect}× direct, ${t} thread${t > 1 ? 's' : ''}`,
      value: a?.ratio ?? null, met: a?.ratio == null ? null : a.ratio <= WORKER_TARGETS.sdpaTransfer.vsDirect,
      detail: a?.ratio == null ? (a ? `${a.status}: ${a.reason}` : 'not in this run') : `${fmtMs(a.workerMs)} ÷ ${fmtMs(a.directMs)} ms = ${fmtX(a.ratio)} (added ${fmtAdd(a.addedMs)} ms)`,
    });
    const calls = { copy: 'wcache.attend(q)', transfer: 'wcache.attend(q, { transfer: true })', step: 'truncate + append + attend, one message' };
    for (const mode of ['copy', 'transfer', 'step']) {
      const d = rows.find((r) => r.case === 'decode' && r.mode === mode && r.threads === t);
      targets.push({
        what: `decode step ${calls[mode]} ≤ ${WORKER_TARGETS.decodeAddedMs} ms added, ${t} thread${t > 1 ? 's' : ''}`,
        value: d?.addedMs ?? null, met: d?.addedMs == null ? null : d.addedMs <= WORKER_TARGETS.decodeAddedMs,
        detail: d?.addedMs == null ? (d ? `${d.status}: ${d.reason}` : 'not in this run') : `${fmtMs(d.workerMs)} − ${fmtMs(d.directMs)} ms = ${fmtAdd(d.addedMs)} ms (paired ${fmtAdd(d.addedMsPaired)}; ${fmtX(d.ratio)})`,
      });
    }
  }
  log('');
  log('worker targets (medians of the same rounds):');
  for (const t of targets) log(`  ${t.met === null ? 'not measured' : t.met ? 'met    ' : 'NOT met'}  ${t.what}: ${t.detail}`);
  const failed = groups.flatMap((g) => g.entries.filter((e) => e.status !== 'ok'));
  for (const e of failed) log(`  not timed: ${e.name}: ${e.status}: ${e.reason}`);
  const loadAfter = os.loadavg();
  const totalSeconds = (performance.now() - t0All) / 1000;
  log(`worker section: ${totalSeconds.toFixed(0)} s; load average ${fmtLoad(loadBefore)} → ${fmtLoad(loadAfter)}`);
  return {
    date: new Date().toISOString(), node: process.versions.node, v8: process.versions.v8,
    host, cpu: os.cpus()[0]?.model ?? null, vcpus: os.cpus().length,
    sdpaWasm: pkg.version, build, quick, settings, threads: threadCounts,
    loadavgBefore: loadBefore, loadavgAfter: loadAfter, totalSeconds,
    evictBytes: probe ? probe.evictBytes : 0,
    shapes: { sdpa: { ...sa, describe: describe(sa) }, decode: { ...dk, cacheBytes } },
    targetsSpec: WORKER_TARGETS, targets, rows, groups,
  };
}

// --- the baseline: a plain worker_threads Worker, no package worker API ------------------------------
// It builds its own Attention ({ threads }) and the same cache (the same seeded K/V from
// makeInputs), then answers { q } with the output (transferred) and the attend time it measured.
const BASELINE_ROLE = 'sdpa-bench-worker-baseline';

async function startBaseline({ threads, cacheOptions, shape }) {
  const worker = new Worker(new URL(import.meta.url), { workerData: { role: BASELINE_ROLE, threads, cacheOptions, shape } });
  await new Promise((resolve, reject) => {
    worker.once('message', (m) => (m === 'ready' ? resolve() : reject(new Error(`baseline worker: ${m?.error ?? m}`))));
    worker.once('error', reject);
  });
  const handle = {
    lastInsideMs: null,
    attend(q) {
      return new Promise((resolve, reject) => {
        worker.once('message', (m) => {
          if (m.error) return reject(new Error(m.error));
          handle.lastInsideMs = m.ms;
          resolve(m.out);
        });
        worker.postMessage({ q });
      });
    },
    terminate: () => worker.terminate(),
  };
  return handle;
}

if (!isMainThread && workerData?.role === BASELINE_ROLE) {
  try {
    const { threads, cacheOptions, shape } = workerData;
    const attn = await createAttention({ threads });
    if (attn.threads !== threads) throw new Error(`asked for ${threads} threads, got ${attn.threads}`);
    const inputs = makeInputs(shape);
    const cache = attn.createKVCache(cacheOptions);
    cache.append(inputs.k, inputs.v);
    parentPort.on('message', ({ q }) => {
      try {
        const t0 = performance.now();
        const out = cache.attend(q).output.data;
        const ms = performance.now() - t0;
        parentPort.postMessage({ out, ms }, [out.buffer]);
      } catch (e) {
        parentPort.postMessage({ error: errText(e) });
      }
    });
    parentPort.postMessage('ready');
  } catch (e) {
    parentPort.postMessage({ error: errText(e) });
  }
}

// --- standalone ----------------------------------------------------------------------------------
if (isMainThread && process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const argv = process.argv.slice(2);
  const arg = (name) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : undefined; };
  const jsonPath = arg('--json') ? resolve(arg('--json')) : DEFAULT_RESULTS_PATH;
  const worker = await runWorkerBench({
    quick: argv.includes('--quick'),
    threads: arg('--threads')?.split(',').map(Number) ?? null,
    hot: argv.includes('--hot'),
  });
  writeSection(jsonPath, 'worker', worker);  // keeping what bench.mjs and decode.mjs wrote there
}
