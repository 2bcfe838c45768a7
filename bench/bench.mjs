// npm run bench [-- --quick] [-- --json PATH] [-- --shapes a,b,...] [-- --peers sdpa-wasm,tfjs-wasm,...] [-- --no-decode] [-- --no-window] [-- --no-alibi] [-- --no-dropout] [-- --no-varlen] [-- --no-worker] [-- --no-browser] [-- --no-engines] [-- --no-float16-inputs] [-- --no-backward]
//
// Single-threaded forward attention, in one process, side by side:
//   sdpa-wasm (this package), onnxruntime-web (wasm EP, 1 thread, best of three ONNX graphs),
//   tfjs with the wasm backend (1 thread), and a plain-JS float32 loop,
// on the shapes in shapes.mjs, plus this machine's limits (limits.mjs): the wasm SIMD mul+add
// peak (and the relaxed_madd one), the copy bandwidth inside wasm memory, and the rate of the
// prefill's score micro-kernel alone, which gives each prefill target against onnxruntime-web
// its ceiling on this host (the ratio if the whole call ran at that rate). Results are medians of timed runs after
// warm-up, also given as a fraction of those limits and as sdpa-wasm ÷ peer throughput. The
// peak that a shape's runs are divided by is the median of peak probes taken in its own
// timed rounds (one a round, between the runs): medians against medians, of the same minutes.
// The best peak of the whole run is reported beside it.
// Every peer's output is checked against a float64 reference before it is timed.
// In the same run, on the shapes marked `twoThreads` in shapes.mjs, two more peers:
//   sdpa-wasm-2t        createAttention({ threads: 2 }) in this process (attn.threads === 2),
//   onnxruntime-web-2t  ort.env.wasm.numThreads = 2 in a child process (remote.mjs): ORT
//                       fixes its thread count at its first session, once per process,
// timed in the same rounds as the others, and reported as speed-ups over their one-thread
// runs and as sdpa-wasm-2t ÷ onnxruntime-web-2t, with the CPU time ÷ wall time of their runs
// (≈ 2 when both threads work) and the cores this shared machine left free around them.
// Then the decode section (decode.mjs, also runnable alone; --no-decode skips it): the KV cache's
// attend() per step against a plain wasm read of the same bytes, sdpa() with copies and
// onnxruntime-web, float32/float16 caches, 1 and 2 threads; under `decode` in the JSON.
// Then the sliding-window section (window.mjs, also runnable alone; --no-window skips it): a
// decode step with slidingWindow over a 32768-position cache against a cache holding only the
// window (and the window as a mask, and no window); under `window`.
// Then the ALiBi section (alibi.mjs, also runnable alone; --no-alibi skips it): prefill and a
// cache's decode step with alibiSlopes against none, and prefill against the same biases as a
// float mask; under `alibi`.
// Then the dropout section (dropout.mjs, also runnable alone; --no-dropout skips it): forward and
// backward with dropoutP against none; under `dropout`.
// Then the packed sequences section (varlen.mjs, also runnable alone; --no-varlen skips it):
// sdpaVarlen against a padded batch and one sdpa() per sequence, 1 and 2 threads; under `varlen`.
// Then the worker section (worker.mjs, also runnable alone; --no-worker skips it): what
// createAttentionWorker() adds per call, inputs copied or transferred, against the direct call,
// on shape (a) and on one decode step from a float32 cache, 1 and 2 threads; under `worker`.
// Then the backward section (backward.mjs, also runnable alone; --no-backward skips it):
// sdpaBackward's GFLOP/s against the forward's and tfjs-wasm's, (h) in O(N) memory; under
// `backward`. Then the browser section (browser.mjs; --no-browser skips it): Chromium against
// Node; then the other engines (engines.mjs; --no-engines skips it): Firefox and WebKit against
// Node, under `engines`; last Float16Array inputs in the three browsers (float16-inputs.mjs;
// --no-float16-inputs skips it): sdpa() given Float16Array against Float32Array, under `float16Inputs`.
// Output: tables on stdout and JSON (bench/results/latest.json, or --json PATH).
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { runDecode } from './decode.mjs';
import { describeHostCpu, hostCpu } from './host.mjs';
import { openCoreProbe, openFmaPeak, openLimits, openScoreTileProbe } from './limits.mjs';
import { createRemotePeer } from './peers/remote.mjs';
import { checkPassed, compare, makeInputs, referenceRows, relativeError, RELATIVE_TOLERANCE } from './reference.mjs';
import { SHAPES, bytes, describe, flops, isDecode, usefulFlops } from './shapes.mjs';
import { runBrowserBench } from './browser.mjs';
import { runEnginesBench } from './engines.mjs';
import { runFloat16InputsBench } from './float16-inputs.mjs';
import { runWorkerBench } from './worker.mjs';
import { runWindowBench } from './window.mjs';
import { runAlibiBench } from './alibi.mjs';
import { runDropoutBench } from './dropout.mjs';
import { runVarlenBench } from './varlen.mjs';
import { runBackwardBenchInChild } from './backward.mjs';

const argv = process.argv.slice(2);
const arg = (name) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : undefined; };
const quick = argv.includes('--quick');
const jsonPath = arg('--json') ? resolve(arg('--json')) : fileURLToPath(new URL('./results/latest.json', import.meta.url));
const shapeFilter = arg('--shapes')?.split(',');
const peerFilter = arg('--peers')?.split(',');
const withDecode = !argv.includes('--no-decode');
const withWorker = !argv.includes('--no-worker');
const withWindow = !argv.includes('--no-window');
const withAlibi = !argv.includes('--no-alibi');
const withDropout = !argv.includes('--no-dropout');
const withVarlen = !argv.includes('--no-varlen');
const withBackward = !argv.includes('--no-backward');
const withBrowser = !argv.includes('--no-browser');
const withEngines = !argv.includes('--no-engines');
const withFloat16Inputs = !argv.includes('--no-float16-inputs');

const settings = quick
  ? { warmSeconds: 0.2, minRuns: 5, minSeconds: 0.2, maxRunSeconds: 3, budgetSeconds: 8 }
  : { warmSeconds: 0.6, minRuns: 10, minSeconds: 2.0, maxRunSeconds: 10, budgetSeconds: 60 };
settings.minWarmups = 2;                   // the check run is the first
settings.maxWarmups = 100;
settings.maxRuns = 200;
const WASM32_BYTES = 2 ** 32;              // a wasm32 memory cannot hold more
settings.coreProbeMs = quick ? 100 : 150;  // a window of the two-worker peak probe (two per probe)
// The project's two-thread targets (README): on shape (c), sdpa-wasm on two threads >= 1.7x
// its own one-thread speed and >= 1.4x faster than onnxruntime-web on two threads.
const TWO_THREAD_TARGETS = { shape: 'c', speedup: 1.7, vsOrt: 1.4 };
// The one-thread targets: on (b) and (c) >= 1.55x onnxruntime-web and >= 80% of the SIMD peak
// (the core's issue), >= 75% of it (the relaxed-SIMD issue's target for the portable build);
// causal (e), (f) >= 1.9x faster than the non-causal run at the same N ((b), (c)); decode (d),
// (g) >= 2x onnxruntime-web.
const ONE_THREAD_TARGETS = {
  vsOrt: { b: 1.55, c: 1.55, d: 2, g: 2 },
  peak: { b: [0.8, 0.75], c: [0.8, 0.75] },
  causalSpeedup: { e: ['b', 1.9], f: ['c', 1.9] },
  // The relaxed-SIMD build (FMA), where this Node runs it: against onnxruntime-web and the FMA peak.
  relaxedVsOrt: { b: 2.2, c: 2.2 },
  relaxedPeak: { b: 0.75, c: 0.75 },
};

const shapes = SHAPES.filter((s) => (shapeFilter ? shapeFilter.includes(s.id) || shapeFilter.includes(s.name) : !quick || s.quick));

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const fmtMs = (ms) => (ms >= 1000 ? ms.toFixed(0) : ms >= 100 ? ms.toFixed(1) : ms >= 10 ? ms.toFixed(2) : ms.toFixed(3));
const fmtDur = (ms) => (ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${fmtMs(ms)} ms`);
const fmtSec = (ms) => `${(ms / 1000).toFixed(1)} s`;
const errText = (e) => String(e?.message ?? e).replace(/\s+/g, ' ').slice(0, 300);
const cpuModel = os.cpus()[0]?.model ?? 'unknown CPU';
const fmtLoad = (l) => l.map((x) => x.toFixed(2)).join(' ');
const fmtX = (x) => (x === null || x === undefined ? '-' : `${x.toFixed(2)}×`);
const fmtCpu = (x) => (x === null || x === undefined ? '-' : x.toFixed(2));
const ownCpuMs = () => { const c = process.cpuUsage(); return (c.user + c.system) / 1000; };
/** Busy CPU time of the whole machine so far (all processes, all vCPUs, from /proc/stat), ms. */
const machineBusyMs = () => os.cpus().reduce((a, c) => a + c.times.user + c.times.nice + c.times.sys + c.times.irq, 0);

// ---------------------------------------------------------------------------------------------
const twoThreadShapes = shapes.filter((s) => s.twoThreads);
console.log(`attention forward, 1 thread: sdpa-wasm vs onnxruntime-web vs tfjs-wasm vs plain JS${quick ? ' (--quick)' : ''}` +
  (twoThreadShapes.length ? `; 2 threads: sdpa-wasm vs onnxruntime-web on ${twoThreadShapes.map((s) => `(${s.id})`).join(', ')}` : ''));
console.log(`${cpuModel}, ${os.cpus().length} vCPUs (available parallelism ${os.availableParallelism()}), load average ${fmtLoad(os.loadavg())}, ` +
  `Node ${process.versions.node}, V8 ${process.versions.v8}`);
console.log(`host: ${describeHostCpu()}`);
const loadBefore = os.loadavg();

const limitsProbe = await openLimits();
const limitsStart = limitsProbe.measure({ quick });
// The FMA peak (relaxed_madd chains), where this Node runs relaxed SIMD: the relaxed build's
// limit. Its rows' "% of peak" use the round's mul+add peak sample × (FMA peak ÷ mul+add peak).
const fmaProbe = await openFmaPeak();
const fmaBest = () => (fmaProbe ? Math.max(...Array.from({ length: quick ? 3 : 7 }, () => fmaProbe.sample())) : null);
const fmaStart = fmaBest();
console.log(fmaProbe ? `relaxed SIMD FMA peak ${fmaStart.toFixed(1)} GFLOP/s (${fmaProbe.kernel}), ` +
  `${(fmaStart / limitsStart.peakGflops).toFixed(2)}× the mul+add peak` : 'relaxed SIMD: not run by this Node (no FMA peak, no sdpa-wasm-relaxed)');
// The prefill's score micro-kernel alone (limits.mjs), both forms: the rate a whole prefill call
// could at best reach, so a ratio to a peer has a ceiling on this host (printed with the targets).
const tileProbes = { mulAdd: await openScoreTileProbe(), fma: fmaProbe ? await openScoreTileProbe({ fused: true }) : null };
const tileBest = () => Object.fromEntries(Object.entries(tileProbes).map(([form, probe]) =>
  [form, probe ? Math.max(...Array.from({ length: quick ? 3 : 7 }, () => probe.sample())) : null]));
const printTile = (label, t) => console.log(`${label}: ${tileProbes.mulAdd.kernel}: ${t.mulAdd.toFixed(1)} GFLOP/s` +
  (t.fma ? `; relaxed_madd ${t.fma.toFixed(1)} GFLOP/s` : ''));
const tileStart = tileBest();
printTile('score micro-kernel', tileStart);
// The limits are measured again at the end; fractions use the better of the two.
const limits = { ...limitsStart };
const printLimits = (label, limits) => console.log(`${label}: wasm SIMD mul+add peak ${limits.peakGflops.toFixed(1)} GFLOP/s (${limits.peakKernel}); ` +
  `copy ${limits.copyGBs.toFixed(1)} GB/s copied = ${limits.copyTrafficGBs.toFixed(1)} GB/s read+write ` +
  `(${limits.copyBufferBytes >> 20} MiB buffer; memory.copy ${limits.memoryCopyGBs.toFixed(1)}, v128 loop ${limits.simdCopyGBs.toFixed(1)} GB/s copied)`);
printLimits('limits at the start', limitsStart);

// How many cores the machine gives us right now: the peak kernel on two worker threads at once,
// the better of two windows after a 20 ms pause (this process's own clean-up, e.g. V8 freeing
// the last shape's arrays, is not what it is meant to see; other processes' load lasts).
let coreProbe = null;
const usableCores = async () => {
  if (!coreProbe) return null;
  await new Promise((resolve) => setTimeout(resolve, 20));
  const windows = [];
  for (let w = 0; w < 2; w++) windows.push(await coreProbe.probe(settings.coreProbeMs, limits.peakGflops));
  const best = windows.reduce((a, b) => (b.cores > a.cores ? b : a));
  return { cores: best.cores, gflops: best.gflops, windows: windows.map((r) => r.cores), loadavg: os.loadavg() };
};
const fmtCores = (c) => (c ? c.cores.toFixed(2) : '?');
let coresStart = null;
if (twoThreadShapes.length) {
  try {
    coreProbe = await openCoreProbe(2);
    coresStart = await usableCores();
    console.log(`usable cores at the start: ${fmtCores(coresStart)} (the peak kernel on 2 worker threads at once: ` +
      `${coresStart.gflops.map((g) => g.toFixed(1)).join(' + ')} GFLOP/s ÷ the one-thread peak)`);
  } catch (e) {
    console.log(`usable-cores probe FAILED: ${errText(e)}`);
  }
}

// `twoThreads`: timed only on the shapes marked so. `remote`: runs in a child process.
const PEER_MODULES = [
  { name: 'sdpa-wasm', path: './peers/sdpa-wasm.mjs' },
  { name: 'onnxruntime-web', path: './peers/ort.mjs' },
  { name: 'tfjs-wasm', path: './peers/tfjs.mjs' },
  { name: 'plain-js', path: './peers/plain-js.mjs' },
  { name: 'sdpa-wasm-not-causal', path: './peers/sdpa-wasm.mjs', options: { notCausal: true } },
  { name: 'sdpa-wasm-relaxed', path: './peers/sdpa-wasm.mjs', options: { relaxed: true } },
  { name: 'sdpa-wasm-2t', path: './peers/sdpa-wasm.mjs', options: { threads: 2 }, twoThreads: true },
  { name: 'onnxruntime-web-2t', path: './peers/ort.mjs', options: { threads: 2 }, twoThreads: true, remote: true },
];
const peers = [];
for (const m of PEER_MODULES) {
  if (peerFilter && !peerFilter.includes(m.name)) continue;
  if (m.twoThreads && !twoThreadShapes.length) continue;
  try {
    const options = { quick, ...m.options };
    const peer = m.remote ? await createRemotePeer(new URL(m.path, import.meta.url).href, options) : await (await import(m.path)).createPeer(options);
    if (peer.name !== m.name) {
      await peer.dispose?.();
      throw new Error(`expected the peer ${m.name}, got ${peer.name}`);
    }
    peer.twoThreads = !!m.twoThreads;
    peer.threads ??= 1;
    peers.push(peer);
    console.log(`peer ${peer.name}: ${peer.version} ${JSON.stringify(peer.config)}${peer.remote ? ` (child process ${peer.remote.pid})` : ''}` +
      (peer.build ? `; build ${Object.entries(peer.build).map(([f, t]) => `${f} ${t}`).join(', ')}` : ''));
  } catch (e) {
    peers.push({ name: m.name, twoThreads: !!m.twoThreads, failed: errText(e) });
    console.log(`peer ${m.name}: FAILED TO LOAD: ${errText(e)}`);
  }
}
const remotePeers = peers.filter((p) => p.remote && !p.failed);
console.log(`check: max abs error vs a float64 reference <= ${RELATIVE_TOLERANCE} × its largest |value| before timing; ` +
  `warm-up: the check run, then runs until >= ${settings.warmSeconds} s (at least ${settings.minWarmups} in all; just the check run when it took > 1 s); ` +
  `timing: rounds of one run per (peer, graph), median of >= ${settings.minRuns} runs and >= ${settings.minSeconds} s; ` +
  `a (peer, graph, shape) is skipped when it would take > ${settings.maxRunSeconds} s a run or > ${settings.budgetSeconds} s in all` +
  peers.filter((p) => p.maxRunSeconds || p.budgetSeconds).map((p) => `; ${p.name}: > ${p.maxRunSeconds ?? settings.maxRunSeconds} s a run` +
    (p.budgetSeconds ? ` or > ${p.budgetSeconds} s in all` : '') + (p.minRunsFloor ? ` (down to ${p.minRunsFloor} timed runs before skipping)` : '')).join(''));
if (quick) console.log(`--quick: shapes ${shapes.map((s) => s.id).join(', ')} only (not the N2048 and N32768 ones), fewer runs, plain-js only where a run takes < 0.3 s`);
if (twoThreadShapes.length) {
  console.log(`two threads on ${twoThreadShapes.map((s) => `(${s.id})`).join(', ')}: sdpa-wasm-2t and onnxruntime-web-2t join the same rounds; ` +
    `each run's CPU time ÷ wall time is recorded (process.cpuUsage(), all threads of the process), and the usable cores ` +
    `(peak kernel on 2 workers, the better of two ${settings.coreProbeMs} ms windows) are probed right before and after the timed rounds`);
}

// ---------------------------------------------------------------------------------------------
// Throughput history per (peer, variant), to estimate run times on larger shapes.
const history = new Map();
function estimateMs(peer, label, s) {
  const past = history.get(`${peer.name}/${label}`) ?? [];
  const similar = past.filter((h) => isDecode(h.shape) === isDecode(s) && h.shape.causal === s.causal);
  const base = (similar.length ? similar : past.filter((h) => isDecode(h.shape) === isDecode(s))).at(-1) ?? past.at(-1);
  if (!base) return peer.priorGflops ? { ms: flops(s) / (peer.priorGflops * 1e6), from: 'no measurement yet, a prior', gflops: peer.priorGflops } : null;
  return { ms: flops(s) / base.flopsPerMs, from: base.shape.name, gflops: base.flopsPerMs / 1e6 };
}

// One run: wall time and CPU time (of the whole process: every thread of it). A remote runner
// (remote.mjs) times itself in its child process; `wantOutput` false lets it skip sending the
// output back.
async function timedRun(runner, wantOutput) {
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  const output = await runner.run(wantOutput);
  const ms = performance.now() - t0;
  const c = process.cpuUsage(c0);
  if (runner.selfTimed) return { output, ms: runner.lastMs, cpuMs: runner.lastCpuMs };
  return { output, ms, cpuMs: (c.user + c.system) / 1000 };
}

// Phase 1 for one (peer, variant, shape): decide whether to run it, set it up, run it once and
// check the output, warm it up. Returns { result } when it is out (with the reason), else
// { result, runner } ready for the timed rounds.
async function prepareVariant(peer, variant, s, inputs, ref) {
  const r = { variant: variant.label, note: variant.note };
  if (variant.unsupported) return { result: { ...r, status: 'unsupported', reason: variant.unsupported } };
  const maxRunMs = 1000 * (peer.maxRunSeconds ?? settings.maxRunSeconds);
  const budgetMs = 1000 * (peer.budgetSeconds ?? settings.budgetSeconds);
  const willNotFit = (variant.memoryBytes ?? 0) >= WASM32_BYTES;
  const est = estimateMs(peer, variant.label, s);
  if (est && !willNotFit && (est.ms > maxRunMs || est.ms * (settings.minRuns + 1) > budgetMs)) {
    return { result: { ...r, status: 'skipped', estimatedMs: est.ms,
      reason: `skipped: would take ≈ ${fmtSec(est.ms)} a run, > ${est.ms > maxRunMs ? `${maxRunMs / 1000} s a run` : `${budgetMs / 1000} s for ${settings.minRuns + 1} runs`} ` +
        `(estimated from ${est.from} at ${est.gflops.toFixed(2)} GFLOP/s)` } };
  }
  if (willNotFit) r.memoryNote = `its [Lq, Lk]-sized intermediates need ${(variant.memoryBytes / 2 ** 30).toFixed(1)} GiB, a wasm32 memory holds at most 4 GiB: tried once to record what happens`;

  let runner;
  try {
    const t0 = performance.now();
    runner = await variant.prepare(inputs, s);
    r.setupMs = performance.now() - t0;
  } catch (e) {
    return { result: { ...r, status: 'failed', reason: `setup failed: ${errText(e)}` } };
  }
  const out = async (result) => {
    try { await runner.dispose?.(); } catch { /* after a failed run the peer may be broken: what failed is the result */ }
    return { result };
  };
  const tRun = performance.now();
  try {
    let { output, ms: firstMs } = await timedRun(runner, true);
    if (runner.toBhsd) output = runner.toBhsd(output);
    r.check = compare(s, ref, output);
    r.firstRunMs = firstMs;
    console.log(`  [${s.id}] ${peer.name} / ${variant.label}: first run ${fmtDur(firstMs)}, ` +
      `max abs err ${r.check.maxAbsErr.toExponential(2)} over ${r.check.rowsChecked} rows (max |ref| ${r.check.maxAbsRef.toExponential(2)}) ` +
      `= ${relativeError(r.check).toExponential(1)} of it ${checkPassed(r.check) ? 'ok' : 'WRONG'}`);
    if (!checkPassed(r.check)) {
      return out({ ...r, status: 'wrong', reason: `check failed: max abs error ${r.check.maxAbsErr.toExponential(2)} > ${RELATIVE_TOLERANCE} × max |ref| ${r.check.maxAbsRef.toExponential(2)}` });
    }
    recordRate(peer, variant.label, s, firstMs);
    // The package under test (minRunsFloor set) keeps being timed with fewer runs rather than skipped.
    const fitRuns = Math.floor(budgetMs / firstMs);
    if (peer.minRunsFloor && firstMs <= maxRunMs && fitRuns < settings.minRuns && fitRuns >= peer.minRunsFloor) {
      r.runsTarget = fitRuns;
      r.fewerRuns = `only ${fitRuns} timed runs: one run took ${fmtSec(firstMs)} and ${settings.minRuns} would exceed ${budgetMs / 1000} s`;
    } else if (firstMs > maxRunMs || firstMs * settings.minRuns > budgetMs) {
      return out({ ...r, status: 'skipped', singleRunMs: firstMs,
        reason: `skipped: one run took ${fmtSec(firstMs)}; ${settings.minRuns} runs would take > ${fmtSec(firstMs * settings.minRuns)} ` +
          `(limit ${firstMs > maxRunMs ? `${maxRunMs / 1000} s a run` : `${budgetMs / 1000} s`})` });
    }
    // Warm-up: V8 compiles wasm with its baseline tier first and swaps in optimised code in
    // the background, so warm up by time as well as by count.
    let warmups = 1;
    const t0 = performance.now();
    while (firstMs < 1000 && (warmups < settings.minWarmups || (warmups < settings.maxWarmups && performance.now() - t0 < settings.warmSeconds * 1000))) {
      await runner.run(false);
      warmups++;
    }
    r.warmups = warmups;
    return { result: r, runner };
  } catch (e) {
    return out({ ...r, status: 'failed', failedAfterMs: performance.now() - tRun, reason: `run failed: ${errText(e)}` });
  }
}

function recordRate(peer, label, s, ms) {
  const key = `${peer.name}/${label}`;
  history.set(key, [...(history.get(key) ?? []), { shape: s, flopsPerMs: flops(s) / ms }]);
}

// Phase 2, for all the prepared (peer, variant) of a shape together: timed rounds in which
// each runs once, so that load from other processes on this shared machine hits them alike.
// Each round ends with one sample of the SIMD peak (returned): the limit of these same rounds.
async function timeRounds(entries, s) {
  const peakSamples = [];
  const times = entries.map(() => []);
  const cpuTimes = entries.map(() => []);
  const start = performance.now();
  let rounds = 0;
  const target = (e) => e.result.runsTarget ?? settings.minRuns;
  while (entries.some((e, i) => e.runner && times[i].length < target(e)) ||
         (performance.now() - start < settings.minSeconds * 1000 && rounds < settings.maxRuns)) {
    if (!entries.some((e) => e.runner)) break;
    for (let i = 0; i < entries.length; i++) {
      if (!entries[i].runner) continue;
      if (entries[i].result.runsTarget && times[i].length >= entries[i].result.runsTarget) continue;
      let run;
      try {
        run = await timedRun(entries[i].runner, false);
      } catch (e) {
        entries[i].result = { ...entries[i].result, status: 'failed', reason: `run failed while timing: ${errText(e)}` };
        entries[i].runner = null;
        continue;
      }
      times[i].push(run.ms);
      cpuTimes[i].push(run.cpuMs);
      if (entries[i].peer.settleMs) await new Promise((resolve) => setTimeout(resolve, entries[i].peer.settleMs));
    }
    peakSamples.push(limitsProbe.peakSample());
    rounds++;
  }
  for (let i = 0; i < entries.length; i++) {
    const { runner, result: r } = entries[i];
    if (!runner) continue;
    try { await runner.dispose?.(); } catch { /* timing is done */ }
    const ms = median(times[i]);
    recordRate(entries[i].peer, r.variant, s, ms);
    entries[i].result = {
      ...r, status: 'ok', runs: times[i].length, medianMs: ms, minMs: Math.min(...times[i]), maxMs: Math.max(...times[i]),
      // The not-causal twin of a causal shape does all the work: its useful FLOPs are all FLOPs.
      gflops: flops(s) / ms / 1e6, usefulGflops: (entries[i].peer.causalTwin ? flops(s) : usefulFlops(s)) / ms / 1e6, gbs: bytes(s) / ms / 1e6,
      // CPU time ÷ wall time over the timed runs: ≈ the number of threads that worked.
      totalMs: times[i].reduce((a, b) => a + b, 0), totalCpuMs: cpuTimes[i].reduce((a, b) => a + b, 0),
    };
    entries[i].result.cpuPerWall = entries[i].result.totalCpuMs / entries[i].result.totalMs;
  }
  return peakSamples;
}

// ---------------------------------------------------------------------------------------------
const results = [];
const t0All = performance.now();
for (const s of shapes) {
  const tShape = performance.now();
  const inputs = makeInputs(s);
  let t0 = performance.now();
  const ref = referenceRows(s, inputs);
  const refMs = performance.now() - t0;
  const entry = {
    id: s.id, ...s, description: describe(s), flops: flops(s), usefulFlops: usefulFlops(s), bytes: bytes(s),
    reference: { rowsChecked: ref.rows.length, rowsTotal: s.B * s.H * s.Lq, ms: refMs },
    peers: {},
  };
  console.log('');
  console.log(`(${s.id}) ${s.name}: ${describe(s)}: checking and warming up`);
  const shapePeers = peers.filter((p) => (!p.twoThreads || s.twoThreads) && (!p.causalTwin || s.causal));
  const prepared = [];
  const failed = new Map();   // peer → result, for a peer that failed to load or to list its variants
  for (const peer of shapePeers) {
    if (peer.failed) { failed.set(peer, { status: 'failed', threads: peer.twoThreads ? 2 : 1, reason: `peer failed to load: ${peer.failed}` }); continue; }
    let variants;
    try {
      variants = await peer.variants(s);
    } catch (e) {
      failed.set(peer, { status: 'failed', threads: peer.threads, reason: `no variants: ${errText(e)}` });
      console.log(`  [${s.id}] ${peer.name}: failed: ${failed.get(peer).reason}`);
      continue;
    }
    for (const variant of variants) {
      const checkRef = variant.checkShape ? referenceRows(variant.checkShape, inputs) : ref;
      const p = { peer, ...(await prepareVariant(peer, variant, s, inputs, checkRef)) };
      if (!p.runner) console.log(`  [${s.id}] ${peer.name} / ${variant.label}: ${p.result.reason.startsWith(p.result.status) ? '' : `${p.result.status}: `}${p.result.reason}`);
      prepared.push(p);
    }
  }
  // The machine around the timed rounds: load average, usable cores (two-thread shapes), and
  // the CPU other processes used meanwhile = the machine's busy time (/proc/stat) - this
  // process's - the child processes'.
  const twoThreaded = prepared.some((p) => p.runner && p.peer.twoThreads);
  const machine = { loadavgBefore: os.loadavg() };
  if (twoThreaded) machine.coresBefore = await usableCores();
  const childCpu = async () => (await Promise.all(remotePeers.map((p) => p.cpuMs().catch(() => 0)))).reduce((a, b) => a + b, 0);
  const busy0 = machineBusyMs(), own0 = ownCpuMs(), child0 = await childCpu(), wall0 = performance.now();
  const peakSamples = await timeRounds(prepared, s);
  entry.roundPeak = peakSamples.length ? { gflops: median(peakSamples), samples: peakSamples } : null;  // null: nothing ran
  const wallMs = performance.now() - wall0;
  const childMs = (await childCpu()) - child0;
  const othersMs = (machineBusyMs() - busy0) - (ownCpuMs() - own0) - childMs;
  machine.timedSeconds = wallMs / 1000;
  machine.otherProcessesCores = othersMs / wallMs;   // /proc/stat counts in 10 ms ticks: ± a little
  // CPU the child processes used outside their timed runs (e.g. ORT's pool threads spinning
  // after a run, which would take a core from the next peer), in cores over the rounds.
  const childRunMs = prepared.filter((p) => p.peer.remote && p.result.status === 'ok').reduce((a, p) => a + p.result.totalCpuMs, 0);
  if (remotePeers.length) machine.childIdleCores = (childMs - childRunMs) / wallMs;
  if (twoThreaded) machine.coresAfter = await usableCores();
  machine.loadavgAfter = os.loadavg();
  entry.machine = machine;
  for (const peer of shapePeers) {
    if (failed.has(peer)) { entry.peers[peer.name] = failed.get(peer); continue; }
    const variants = prepared.filter((p) => p.peer === peer).map((p) => p.result);
    const ok = variants.filter((v) => v.status === 'ok').sort((a, b) => a.medianMs - b.medianMs);
    const best = ok[0] ?? variants.find((v) => v.status === 'skipped' && v.singleRunMs) ?? variants[0];
    entry.peers[peer.name] = { ...best, threads: peer.threads, variants: variants.length > 1 ? variants : undefined };
  }
  // One thread: every peer against sdpa-wasm, with the same kind of call as the peers' (a new
  // output array per call: ORT's session.run and tfjs allocate theirs), sdpa() (allocatingCall);
  // the sdpa-wasm builds against each other with the same call too. The `{ out }` variant's
  // ratios, reported beside them, are entry.ratiosWithOut.
  const mine = allocatingCall(entry.peers['sdpa-wasm']);
  const mineWithOut = withOutCall(entry.peers['sdpa-wasm']);
  if (mine) {
    entry.ratios = {};
    entry.ratiosWithOut = {};
    for (const [name, p] of Object.entries(entry.peers)) {
      if (name === 'sdpa-wasm' || p.threads !== 1 || p.status !== 'ok') continue;
      const theirs = name.startsWith('sdpa-wasm') ? allocatingCall(p) ?? p : p;
      entry.ratios[name] = theirs.medianMs / mine.medianMs;
      if (mineWithOut) entry.ratiosWithOut[name] = p.medianMs / mineWithOut.medianMs;
    }
  }
  if (s.twoThreads) entry.twoThreads = twoThreadSummary(entry);
  entry.elapsedSeconds = (performance.now() - tShape) / 1000;
  results.push(entry);
}
const totalSeconds = (performance.now() - t0All) / 1000;
const coresEnd = await usableCores();
await coreProbe?.close();

/** A peer's ok variant `label` (its variants, or itself when it has one), or null. */
function okVariant(p, label) {
  return (p?.variants ?? [p]).find((v) => v?.status === 'ok' && v.variant === label) ?? null;
}
/** sdpa-wasm's sdpa() call (a new output array per call, as the peers' calls), or null. */
function allocatingCall(p) { return okVariant(p, 'sdpa()'); }
/** sdpa-wasm's sdpa(…, { out }) call, or null. */
function withOutCall(p) { return okVariant(p, 'sdpa(…, { out })'); }

// Two threads against one, for a shape: each peer's 2-thread median against its own
// 1-thread median (for onnxruntime-web: fastest correct graph against fastest correct graph,
// and graph by graph), and sdpa-wasm-2t against onnxruntime-web-2t.
function twoThreadSummary(e) {
  const ok = (p) => (p?.status === 'ok' ? p : null);
  // sdpa-wasm's one- and two-thread times from the same call, sdpa() (as the peers').
  const [s1, s2] = ['sdpa-wasm', 'sdpa-wasm-2t'].map((n) => allocatingCall(e.peers[n]));
  const [o1, o2] = ['onnxruntime-web', 'onnxruntime-web-2t'].map((n) => ok(e.peers[n]));
  const t = {
    sdpa1tMs: s1?.medianMs ?? null, sdpa2tMs: s2?.medianMs ?? null,
    sdpaSpeedup: s1 && s2 ? s1.medianMs / s2.medianMs : null,
    ort1tMs: o1?.medianMs ?? null, ort2tMs: o2?.medianMs ?? null,
    ort1tGraph: o1?.variant ?? null, ort2tGraph: o2?.variant ?? null,
    ortSpeedup: o1 && o2 ? o1.medianMs / o2.medianMs : null,
    ortGraphSpeedups: {},
    sdpa2tVsOrt2t: s2 && o2 ? o2.medianMs / s2.medianMs : null,   // > 1: sdpa-wasm-2t faster
    cpuPerWall: { sdpa1t: s1?.cpuPerWall ?? null, sdpa2t: s2?.cpuPerWall ?? null, ort1t: o1?.cpuPerWall ?? null, ort2t: o2?.cpuPerWall ?? null },
    status: { sdpa2t: e.peers['sdpa-wasm-2t']?.status ?? 'not run', ort2t: e.peers['onnxruntime-web-2t']?.status ?? 'not run' },
  };
  const graphs = (p) => (p?.variants ?? (p ? [p] : [])).filter((v) => v.status === 'ok');
  for (const v2 of graphs(o2)) {
    const v1 = graphs(o1).find((v) => v.variant === v2.variant);
    if (v1) t.ortGraphSpeedups[v2.variant] = v1.medianMs / v2.medianMs;
  }
  if (e.id === TWO_THREAD_TARGETS.shape) {
    t.targets = {
      speedup: { target: TWO_THREAD_TARGETS.speedup, value: t.sdpaSpeedup, met: t.sdpaSpeedup === null ? null : t.sdpaSpeedup >= TWO_THREAD_TARGETS.speedup },
      vsOrt2t: { target: TWO_THREAD_TARGETS.vsOrt, value: t.sdpa2tVsOrt2t, met: t.sdpa2tVsOrt2t === null ? null : t.sdpa2tVsOrt2t >= TWO_THREAD_TARGETS.vsOrt },
    };
  }
  return t;
}

const limitsEnd = limitsProbe.measure({ quick });
printLimits('limits at the end', limitsEnd);
limits.peakGflops = Math.max(limitsStart.peakGflops, limitsEnd.peakGflops);
limits.copyGBs = Math.max(limitsStart.copyGBs, limitsEnd.copyGBs);
limits.copyTrafficGBs = 2 * limits.copyGBs;
limits.memoryCopyGBs = Math.max(limitsStart.memoryCopyGBs, limitsEnd.memoryCopyGBs);
limits.simdCopyGBs = Math.max(limitsStart.simdCopyGBs, limitsEnd.simdCopyGBs);
limits.peakRuns = [...limitsStart.peakRuns, ...limitsEnd.peakRuns];
limits.start = limitsStart;
limits.end = limitsEnd;
const fmaEnd = fmaBest();
limits.fmaPeakGflops = fmaProbe ? Math.max(fmaStart, fmaEnd) : null;
limits.fmaKernel = fmaProbe?.kernel ?? null;
// FMA peak ÷ mul+add peak: scales a round's mul+add sample to that round's FMA peak.
const fmaRatio = fmaProbe ? limits.fmaPeakGflops / limits.peakGflops : null;
if (fmaProbe) console.log(`relaxed SIMD FMA peak at the end ${fmaEnd.toFixed(1)} GFLOP/s; best ${limits.fmaPeakGflops.toFixed(1)}`);
const tileEnd = tileBest();
printTile('score micro-kernel at the end', tileEnd);
limits.scoreTileKernel = tileProbes.mulAdd.kernel;
limits.scoreTileGflops = Math.max(tileStart.mulAdd, tileEnd.mulAdd);
limits.fmaScoreTileGflops = tileProbes.fma ? Math.max(tileStart.fma, tileEnd.fma) : null;
for (const e of results) {
  for (const [name, p] of Object.entries(e.peers)) {
    // The relaxed build against the FMA peak, the others against the mul+add peak.
    const fma = name.includes('relaxed') && fmaRatio ? fmaRatio : 1;
    for (const r of [p, ...(p.variants ?? [])]) {
      if (r.status !== 'ok') continue;
      // Two-thread rows against two cores' worth of the one-thread peak; the copy limit is the
      // one-thread copy for all rows (two threads may exceed it).
      r.fractionOfPeak = r.usefulGflops / (e.roundPeak.gflops * fma * (p.threads ?? 1));  // some peer ran, so roundPeak is set
      r.fractionOfBestPeak = r.usefulGflops / (limits.peakGflops * fma * (p.threads ?? 1));
      r.fractionOfCopy = r.gbs / limits.copyTrafficGBs;
    }
  }
  const mine = e.peers['sdpa-wasm'];
  if (e.ratios && mine?.status === 'ok') {
    e.ratios.peak = mine.fractionOfPeak;
    e.ratios.bestPeak = mine.fractionOfBestPeak;
    e.ratios.copy = mine.fractionOfCopy;
  }
}
console.log('');
console.log(`%peak = unmasked FLOP/s ÷ the wasm SIMD mul+add peak: the median of the peak probes taken in the shape's own timed rounds, one a round ` +
  `(%best: ÷ the best peak of the whole run, ${limits.peakGflops.toFixed(1)} GFLOP/s); GFLOP/s counts 4·B·Hq·Lq·Lk·E even when causal; ` +
  `-2t rows: ÷ twice the peak; GB/s = (Q + K + V + output bytes) ÷ time, %copy = GB/s ÷ the ${limits.copyTrafficGBs.toFixed(1)} GB/s ` +
  `read+write traffic of a one-thread wasm memory copy; sdpa÷peer = peer median ÷ the median of sdpa-wasm's sdpa() call ` +
  `(a new output array per call, as the peers' calls; > 1: sdpa-wasm faster; -2t rows: onnxruntime-web-2t median ÷ sdpa-wasm-2t's sdpa() median)`);
for (const e of results) printShape(e);

// ---------------------------------------------------------------------------------------------

function printShape(e) {
  const decode = isDecode(e);
  console.log('');
  console.log(`(${e.id}) ${e.name}: ${e.description}; ${(e.flops / 1e9).toFixed(3)} GFLOP` +
    (e.causal ? ` (${(e.usefulFlops / 1e9).toFixed(3)} unmasked)` : '') + `, ${(e.bytes / 2 ** 20).toFixed(1)} MiB moved; ` +
    `checked ${e.reference.rowsChecked === e.reference.rowsTotal ? 'all' : `${e.reference.rowsChecked} of ${e.reference.rowsTotal}`} output rows; ` +
    (e.roundPeak ? `SIMD peak in its timed rounds: median ${e.roundPeak.gflops.toFixed(1)} GFLOP/s of ${e.roundPeak.samples.length} probes ` +
      `(${Math.min(...e.roundPeak.samples).toFixed(1)}–${Math.max(...e.roundPeak.samples).toFixed(1)})` : 'no timed rounds'));
  console.log(`  ${'peer'.padEnd(22)}${'graph / variant'.padEnd(36)}${'max abs err'.padStart(12)}${'runs'.padStart(6)}` +
    `${'median ms'.padStart(11)}${'GFLOP/s'.padStart(9)}${'%peak'.padStart(7)}${'%best'.padStart(7)}${'GB/s'.padStart(7)}${'%copy'.padStart(7)}${'sdpa÷peer'.padStart(11)}${'CPU/wall'.padStart(10)}`);
  for (const [name, p] of Object.entries(e.peers)) {
    const err = p.check ? p.check.maxAbsErr.toExponential(1) : '';
    const label = (p.variant ?? '').slice(0, 35);
    if (p.status === 'ok') {
      let ratio = name === 'sdpa-wasm' || name === 'sdpa-wasm-2t' ? '1.00' : e.ratios?.[name] ? `${e.ratios[name].toFixed(2)}×` : '';
      if (name === 'onnxruntime-web-2t') ratio = fmtX(e.twoThreads?.sdpa2tVsOrt2t);
      console.log(`  ${name.padEnd(22)}${label.padEnd(36)}${err.padStart(12)}${String(p.runs).padStart(6)}` +
        `${fmtMs(p.medianMs).padStart(11)}${p.gflops.toFixed(2).padStart(9)}${(100 * p.fractionOfPeak).toFixed(0).concat('%').padStart(7)}` +
        `${(100 * p.fractionOfBestPeak).toFixed(0).concat('%').padStart(7)}` +
        `${(decode ? p.gbs.toFixed(1) : '-').padStart(7)}${(decode ? `${(100 * p.fractionOfCopy).toFixed(0)}%` : '-').padStart(7)}${ratio.padStart(11)}` +
        `${fmtCpu(p.cpuPerWall).padStart(10)}`);
    } else {
      console.log(`  ${name.padEnd(22)}${label.padEnd(36)}${err.padStart(12)}  ${p.status}: ${(p.reason ?? p.note ?? '').replace(/^(skipped|failed): /, '')}`);
    }
    for (const v of p.variants ?? []) {
      if (v === p || v.variant === p.variant) continue;
      const what = v.status === 'ok' ? `${fmtMs(v.medianMs)} ms (${v.runs} runs, max abs err ${v.check.maxAbsErr.toExponential(1)})` : `${v.status}: ${v.reason ?? v.note ?? ''}`;
      console.log(`  ${''.padEnd(22)}  also ${v.variant}: ${what}`);
    }
    if (p.note) console.log(`  ${''.padEnd(22)}  note: ${p.note}`);
    if (p.memoryNote) console.log(`  ${''.padEnd(22)}  note: ${p.memoryNote}`);
    if (p.fewerRuns) console.log(`  ${''.padEnd(22)}  note: ${p.fewerRuns}`);
  }
  const t = e.twoThreads;
  if (t) {
    const graphs = Object.entries(t.ortGraphSpeedups).map(([g, x]) => `${g} ${fmtX(x)}`).join(', ');
    console.log(`  two threads: sdpa-wasm-2t ${fmtX(t.sdpaSpeedup)} sdpa-wasm's speed; onnxruntime-web-2t ${fmtX(t.ortSpeedup)} onnxruntime-web's ` +
      `(fastest graph vs fastest graph${graphs ? `; graph by graph: ${graphs}` : ''}); sdpa-wasm-2t ÷ onnxruntime-web-2t ${fmtX(t.sdpa2tVsOrt2t)}`);
  }
  const m = e.machine;
  if (m) {
    console.log(`  machine during the ${m.timedSeconds.toFixed(1)} s of timed rounds: other processes used ${Math.max(0, m.otherProcessesCores).toFixed(2)} cores` +
      (m.childIdleCores !== undefined ? ` (the child process, between its runs, ${Math.max(0, m.childIdleCores).toFixed(2)})` : '') + '; ' +
      (m.coresBefore || m.coresAfter ? `usable cores (2-worker peak probe) ${fmtCores(m.coresBefore)} before, ${fmtCores(m.coresAfter)} after; ` : '') +
      `load average ${fmtLoad(m.loadavgBefore)} → ${fmtLoad(m.loadavgAfter)}`);
  }
}

const loadAfter = os.loadavg();
console.log('');
console.log(`summary, one thread: median ms (sdpa-wasm throughput ÷ peer throughput; sdpa-wasm: its sdpa() call, a new output array per call ` +
  `as the peers', the ratios' basis; with \`out\` in the shape's table); sdpa-wasm as a fraction of the limit ` +
  `(prefill: unmasked FLOP/s ÷ the median peak of the shape's rounds, and ÷ the run's best peak ${limits.peakGflops.toFixed(1)} GFLOP/s; ` +
  `decode: GB/s ÷ ${limits.copyTrafficGBs.toFixed(1)} GB/s copy traffic)`);
const names = peers.filter((p) => !p.twoThreads && !p.causalTwin).map((p) => p.name);
console.log(`  ${'shape'.padEnd(20)}${names.map((n) => n.padStart(n === 'sdpa-wasm' ? 11 : 22)).join('')}${'of limit'.padStart(10)}${'of best'.padStart(10)}`);
for (const e of results) {
  const cells = names.map((n) => {
    const p = e.peers[n];
    if (n === 'sdpa-wasm') return (p?.status === 'ok' ? fmtMs((allocatingCall(p) ?? p).medianMs) : p?.status ?? '').padStart(11);
    if (p?.status === 'ok') return `${fmtMs(p.medianMs)} (${e.ratios ? `${e.ratios[n].toFixed(2)}×` : '?'})`.padStart(22);
    return (p?.status === 'skipped' && p.singleRunMs ? `${fmtMs(p.singleRunMs)} (1 run)` : p?.status ?? '').padStart(22);
  });
  const mine = e.peers['sdpa-wasm'];
  const limit = mine?.status === 'ok' ? `${(100 * (isDecode(e) ? mine.fractionOfCopy : mine.fractionOfPeak)).toFixed(0)}% ${isDecode(e) ? 'copy' : 'peak'}` : '';
  const best = mine?.status === 'ok' && !isDecode(e) ? `${(100 * mine.fractionOfBestPeak).toFixed(0)}% best` : '';
  console.log(`  ${`(${e.id}) ${e.name}`.padEnd(20)}${cells.join('')}${limit.padStart(10)}${best.padStart(10)}`);
}

const oneThreadTargets = [];
{
  const byId = Object.fromEntries(results.map((e) => [e.id, e]));
  const ok = (e, name) => (e?.peers[name]?.status === 'ok' ? e.peers[name] : null);
  const check = (what, value, target, ceiling = null) =>
    oneThreadTargets.push({ what, value, target, met: value === null ? null : value >= target, ...(ceiling ? { ceiling } : {}) });
  // A prefill's ratio to onnxruntime-web if the whole call (both matmuls, nothing else: no softmax,
  // no copies) ran at the score micro-kernel's rate (tileGflops) in this run: its ceiling on this host.
  const ceiling = (e, tileGflops) => {
    const o = ok(e, 'onnxruntime-web');
    return o && tileGflops && !isDecode(e) ? o.medianMs / (e.flops / (tileGflops * 1e6)) : null;
  };
  for (const [id, target] of Object.entries(ONE_THREAD_TARGETS.vsOrt)) {
    if (byId[id]) check(`(${id}) ÷ onnxruntime-web`, byId[id].ratios?.['onnxruntime-web'] ?? null, target, ceiling(byId[id], limits.scoreTileGflops));
  }
  for (const [id, targets] of Object.entries(ONE_THREAD_TARGETS.peak)) {
    for (const target of targets) {
      if (byId[id]) check(`(${id}) of the peak`, ok(byId[id], 'sdpa-wasm')?.fractionOfPeak ?? null, target);
    }
  }
  // The relaxed-SIMD build (issue: relaxed builds), where this Node runs relaxed SIMD (the FMA
  // peak probe ran): its target lines are printed, "not measured" if the build failed to load or
  // run. Where the engine has no relaxed SIMD (Node 20 without the flag) there are none.
  const engineRunsRelaxed = limits.fmaPeakGflops !== null;
  for (const [id, target] of Object.entries(ONE_THREAD_TARGETS.relaxedVsOrt)) {
    const e = byId[id], r = allocatingCall(e?.peers['sdpa-wasm-relaxed']), o = ok(e, 'onnxruntime-web');
    if (e && engineRunsRelaxed) {
      check(`(${id}) relaxed build ÷ onnxruntime-web`, r && o ? o.medianMs / r.medianMs : null, target, ceiling(e, limits.fmaScoreTileGflops));
    }
  }
  for (const [id, target] of Object.entries(ONE_THREAD_TARGETS.relaxedPeak)) {
    const e = byId[id];
    if (e && engineRunsRelaxed) check(`(${id}) relaxed build of the FMA peak`, ok(e, 'sdpa-wasm-relaxed')?.fractionOfPeak ?? null, target);
  }
  // The causal speed-up from the same rounds: the not-causal twin (sdpa-wasm-not-causal on the
  // causal shape, an sdpa(…, { out }) call) against the causal shape's own sdpa(…, { out })
  // variant, the same call (not the faster of its two variants, which would bias the causal
  // time down); the ratio of the two shapes' medians, measured minutes apart, only when the
  // twin is missing.
  for (const [id, [base, target]] of Object.entries(ONE_THREAD_TARGETS.causalSpeedup)) {
    const twin = ok(byId[id], 'sdpa-wasm-not-causal');
    const causalOut = (byId[id]?.peers['sdpa-wasm']?.variants ?? [byId[id]?.peers['sdpa-wasm']])
      .find((v) => v?.status === 'ok' && v.variant === 'sdpa(…, { out })');
    if (twin && causalOut) {
      check(`(${id}) faster than not causal, same rounds`, twin.medianMs / causalOut.medianMs, target);
    } else if (byId[id] && byId[base]) {
      const c = ok(byId[id], 'sdpa-wasm'), n = ok(byId[base], 'sdpa-wasm');
      check(`(${id}) faster than (${base})`, c && n ? n.medianMs / c.medianMs : null, target);
    }
  }
  if (oneThreadTargets.length) {
    const fmt = (t) => (t.what.endsWith('peak') ? `${(100 * t.value).toFixed(0)}% (>= ${100 * t.target}%)` : `${fmtX(t.value)} (>= ${t.target}×)`);
    const bound = (t) => (t.ceiling ? ` (ceiling ${fmtX(t.ceiling)}${t.ceiling < t.target ? ': out of reach on this host' : ''})` : '');
    console.log(`  targets, one thread (host ${describeHostCpu()}): ${oneThreadTargets.map((t) => `${t.what} ${t.value === null ? 'not measured' : `${fmt(t)} ${t.met ? 'met' : 'NOT met'}`}${bound(t)}`).join('; ')}`);
    if (oneThreadTargets.some((t) => t.ceiling)) {
      console.log(`  ceiling: the ratio if the whole call ran at the score micro-kernel's rate in this run (mul+add ` +
        `${limits.scoreTileGflops.toFixed(1)}${limits.fmaScoreTileGflops ? `, relaxed_madd ${limits.fmaScoreTileGflops.toFixed(1)}` : ''} GFLOP/s: ` +
        `both matmuls at that rate, no softmax, no copies)`);
    }
  }
}

const twoThreadResults = results.filter((e) => e.twoThreads);
if (twoThreadResults.length) {
  console.log('');
  console.log(`summary, two threads: median ms; ×1t = the peer's one-thread median ÷ its two-thread median; ` +
    `sdpa÷ort 2t = onnxruntime-web-2t median ÷ sdpa-wasm-2t median (> 1: sdpa-wasm faster); CPU/wall of the 2t runs (sdpa / ort); ` +
    `usable cores before / after the timed rounds; cores other processes used during them`);
  console.log(`  ${'shape'.padEnd(20)}${'sdpa 1t'.padStart(9)}${'sdpa 2t'.padStart(9)}${'×1t'.padStart(7)}` +
    `${'ort 1t'.padStart(9)}${'ort 2t'.padStart(9)}${'×1t'.padStart(7)}${'sdpa÷ort 2t'.padStart(13)}${'CPU/wall'.padStart(11)}${'cores'.padStart(11)}${'others'.padStart(8)}`);
  for (const e of twoThreadResults) {
    const t = e.twoThreads, m = e.machine ?? {};
    const ms = (x, status) => (x === null ? (status ?? '-') : fmtMs(x));
    console.log(`  ${`(${e.id}) ${e.name}`.padEnd(20)}${ms(t.sdpa1tMs).padStart(9)}${ms(t.sdpa2tMs, t.status.sdpa2t).padStart(9)}${fmtX(t.sdpaSpeedup).padStart(7)}` +
      `${ms(t.ort1tMs).padStart(9)}${ms(t.ort2tMs, t.status.ort2t).padStart(9)}${fmtX(t.ortSpeedup).padStart(7)}${fmtX(t.sdpa2tVsOrt2t).padStart(13)}` +
      `${`${fmtCpu(t.cpuPerWall.sdpa2t)}/${fmtCpu(t.cpuPerWall.ort2t)}`.padStart(11)}${`${fmtCores(m.coresBefore)}/${fmtCores(m.coresAfter)}`.padStart(11)}` +
      `${Math.max(0, m.otherProcessesCores ?? NaN).toFixed(2).padStart(8)}`);
  }
  const target = twoThreadResults.find((e) => e.twoThreads.targets);
  if (target) {
    const { speedup, vsOrt2t } = target.twoThreads.targets;
    const verdict = (t) => (t.met === null ? 'not measured' : `${fmtX(t.value)} ${t.met ? 'met' : 'NOT met'}`);
    console.log(`  targets on (${target.id}) ${target.name}: sdpa-wasm-2t >= ${speedup.target}× its one-thread speed: ${verdict(speedup)}; ` +
      `>= ${vsOrt2t.target}× onnxruntime-web-2t: ${verdict(vsOrt2t)}`);
  } else {
    console.log(`  targets on (${TWO_THREAD_TARGETS.shape}): not measured in this run`);
  }
}
console.log(`load average before ${fmtLoad(loadBefore)}, after ${fmtLoad(loadAfter)}; ` +
  (coresStart || coresEnd ? `usable cores at the start ${fmtCores(coresStart)}, at the end ${fmtCores(coresEnd)}; ` : '') +
  `shapes took ${totalSeconds.toFixed(0)} s`);

for (const peer of peers) { try { await peer.dispose?.(); } catch { /* ignore */ } }

/**
 * A section after the shapes, when `enabled`: its results, or { failed } when it threw (the run
 * goes on with the next section); null when not run.
 */
async function section(enabled, name, run) {
  if (!enabled) return null;
  try {
    return await run();
  } catch (e) {
    const failed = { failed: errText(e) };
    console.log(`${name} section FAILED: ${failed.failed}`);
    return failed;
  }
}

// The decode section, after the shapes (its own instances, caches and onnxruntime-web sessions).
const decode = await section(withDecode, 'decode', () => runDecode({ quick }));
// The sliding-window section (window.mjs): a window over a long cache against a cache of the window.
const slidingWindow = await section(withWindow, 'window', () => runWindowBench({ quick }));
// The ALiBi section (alibi.mjs): alibiSlopes against no ALiBi and against its biases as a float mask.
const alibi = await section(withAlibi, 'alibi', () => runAlibiBench({ quick }));
// The dropout section (dropout.mjs): dropoutP against none, forward and backward.
const dropout = await section(withDropout, 'dropout', () => runDropoutBench({ quick }));
// The packed sequences section (varlen.mjs): sdpaVarlen against a padded batch and one sdpa() per sequence.
const varlen = await section(withVarlen, 'varlen', () => runVarlenBench({ quick }));
// The worker section (its own instances and workers).
const worker = await section(withWorker, 'worker', () => runWorkerBench({ quick }));
// The backward section (backward.mjs): sdpaBackward against the forward and tfjs-wasm, in a
// process of its own (tfjs-wasm does not recover in this one from the (h) shape's failure).
const backward = await section(withBackward, 'backward', () => runBackwardBenchInChild({ quick }));
// The browser section: the same calls in Chromium and in this Node, both builds.
const browser = await section(withBrowser, 'browser', () => runBrowserBench({ quick }));
// The other engines: the same calls in Firefox and WebKit and in this Node.
const engines = await section(withEngines, 'engines', () => runEnginesBench({ quick }));
// Float16Array inputs in Chromium, Firefox and WebKit (Node 20 has no Float16Array).
const float16Inputs = await section(withFloat16Inputs, 'float16Inputs', () => runFloat16InputsBench({ quick }));

// `rows` keeps the earlier format (sdpa-wasm only) for anything that reads it.
const rows = results.filter((e) => e.peers['sdpa-wasm']?.status === 'ok').map((e) => {
  const p = e.peers['sdpa-wasm'];
  return { shape: e.name, name: e.name, B: e.B, H: e.H, Hkv: e.Hkv, Lq: e.Lq, Lk: e.Lk, E: e.E, causal: e.causal, runs: p.runs, medianMs: p.medianMs, gflops: p.gflops };
});
mkdirSync(dirname(jsonPath), { recursive: true });
writeFileSync(jsonPath, JSON.stringify({
  date: new Date().toISOString(), node: process.versions.node, v8: process.versions.v8,
  cpu: cpuModel, host: hostCpu(), vcpus: os.cpus().length, availableParallelism: os.availableParallelism(),
  loadavgBefore: loadBefore, loadavgAfter: loadAfter, usableCoresStart: coresStart, usableCoresEnd: coresEnd,
  // `threads` is that of the main comparison (and of `rows`); the two-thread peers are listed
  // with their threads in `peers`, and each two-thread shape has a `twoThreads` summary.
  threads: 1, oneThreadTargets, twoThreadShapes: twoThreadResults.map((e) => e.id), twoThreadTargets: TWO_THREAD_TARGETS,
  quick, settings, totalSeconds, limits,
  peers: peers.map((p) => ({ name: p.name, version: p.version, threads: p.threads, config: p.config, build: p.build, remote: p.remote, failed: p.failed })),
  shapes: results, rows, decode, window: slidingWindow, alibi, dropout, varlen, worker, backward, browser, engines, float16Inputs,
}, (k, v) => (typeof v === 'number' && !Number.isFinite(v) ? String(v) : v), 2));
console.log(`results: ${jsonPath}`);
