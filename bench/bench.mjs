// npm run bench [-- --quick] [-- --json PATH] [-- --shapes a,b,...] [-- --peers sdpa-wasm,tfjs-wasm,...]
//
// Single-threaded forward attention, in one process, side by side:
//   sdpa-wasm (this package), onnxruntime-web (wasm EP, 1 thread, best of three ONNX graphs),
//   tfjs with the wasm backend (1 thread), and a plain-JS float32 loop,
// on the shapes in shapes.mjs, plus this machine's limits (limits.mjs): the wasm SIMD mul+add
// peak and the copy bandwidth inside wasm memory. Results are medians of timed runs after
// warm-up, also given as a fraction of those limits and as sdpa-wasm ÷ peer throughput.
// Every peer's output is checked against a float64 reference before it is timed.
// Output: a table on stdout and JSON (bench/results/latest.json, or --json PATH).
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { openLimits } from './limits.mjs';
import { compare, makeInputs, referenceRows } from './reference.mjs';
import { SHAPES, bytes, describe, flops, isDecode, usefulFlops } from './shapes.mjs';

const argv = process.argv.slice(2);
const arg = (name) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : undefined; };
const quick = argv.includes('--quick');
const jsonPath = arg('--json') ? resolve(arg('--json')) : fileURLToPath(new URL('./results/latest.json', import.meta.url));
const shapeFilter = arg('--shapes')?.split(',');
const peerFilter = arg('--peers')?.split(',');

const settings = quick
  ? { warmSeconds: 0.2, minRuns: 5, minSeconds: 0.2, maxRunSeconds: 3, budgetSeconds: 8 }
  : { warmSeconds: 0.6, minRuns: 10, minSeconds: 2.0, maxRunSeconds: 10, budgetSeconds: 60 };
settings.minWarmups = 2;                   // the check run is the first
settings.maxWarmups = 100;
settings.maxRuns = 200;
settings.tolerance = 1e-3;                 // max abs error vs the float64 reference
const WASM32_BYTES = 2 ** 32;              // a wasm32 memory cannot hold more

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

// ---------------------------------------------------------------------------------------------
console.log(`attention forward, 1 thread: sdpa-wasm vs onnxruntime-web vs tfjs-wasm vs plain JS${quick ? ' (--quick)' : ''}`);
console.log(`${cpuModel}, ${os.cpus().length} vCPUs, load average ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}, ` +
  `Node ${process.versions.node}, V8 ${process.versions.v8}`);
const loadBefore = os.loadavg();

const limitsProbe = await openLimits();
const peakProbe = limitsProbe.peakProbe;
const limitsStart = limitsProbe.measure({ quick });
// The limits are measured again at the end; fractions use the better of the two.
const limits = { ...limitsStart };
const printLimits = (label, limits) => console.log(`${label}: wasm SIMD mul+add peak ${limits.peakGflops.toFixed(1)} GFLOP/s (${limits.peakKernel}); ` +
  `copy ${limits.copyGBs.toFixed(1)} GB/s copied = ${limits.copyTrafficGBs.toFixed(1)} GB/s read+write ` +
  `(${limits.copyBufferBytes >> 20} MiB buffer; memory.copy ${limits.memoryCopyGBs.toFixed(1)}, v128 loop ${limits.simdCopyGBs.toFixed(1)} GB/s copied)`);
printLimits('limits at the start', limitsStart);

const PEER_MODULES = [
  ['sdpa-wasm', './peers/sdpa-wasm.mjs'],
  ['onnxruntime-web', './peers/ort.mjs'],
  ['tfjs-wasm', './peers/tfjs.mjs'],
  ['plain-js', './peers/plain-js.mjs'],
];
const peers = [];
for (const [name, path] of PEER_MODULES) {
  if (peerFilter && !peerFilter.includes(name)) continue;
  try {
    const peer = await (await import(path)).createPeer({ quick });
    peers.push(peer);
    console.log(`peer ${peer.name}: ${peer.version} ${JSON.stringify(peer.config)}`);
  } catch (e) {
    peers.push({ name, failed: errText(e) });
    console.log(`peer ${name}: FAILED TO LOAD: ${errText(e)}`);
  }
}
console.log(`check: max abs error vs a float64 reference <= ${settings.tolerance} before timing; ` +
  `warm-up: the check run, then runs until >= ${settings.warmSeconds} s (at least ${settings.minWarmups} in all; just the check run when it took > 1 s); ` +
  `timing: rounds of one run per (peer, graph), median of >= ${settings.minRuns} runs and >= ${settings.minSeconds} s; ` +
  `a (peer, graph, shape) is skipped when it would take > ${settings.maxRunSeconds} s a run or > ${settings.budgetSeconds} s in all` +
  peers.filter((p) => p.maxRunSeconds || p.budgetSeconds).map((p) => `; ${p.name}: > ${p.maxRunSeconds ?? settings.maxRunSeconds} s a run` +
    (p.budgetSeconds ? ` or > ${p.budgetSeconds} s in all` : '') + (p.minRunsFloor ? ` (down to ${p.minRunsFloor} timed runs before skipping)` : '')).join(''));
if (quick) console.log(`--quick: shapes ${shapes.map((s) => s.id).join(', ')} only (not the N2048 and N32768 ones), fewer runs, plain-js only where a run takes < 0.3 s`);

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
    let t0 = performance.now();
    let output = await runner.run();
    const firstMs = performance.now() - t0;
    if (runner.toBhsd) output = runner.toBhsd(output);
    r.check = compare(s, ref, output);
    r.firstRunMs = firstMs;
    console.log(`  [${s.id}] ${peer.name} / ${variant.label}: first run ${fmtDur(firstMs)}, ` +
      `max abs err ${r.check.maxAbsErr.toExponential(2)} over ${r.check.rowsChecked} rows (max |ref| ${r.check.maxAbsRef.toExponential(2)}) ` +
      `${r.check.maxAbsErr <= settings.tolerance ? 'ok' : 'WRONG'}`);
    if (!(r.check.maxAbsErr <= settings.tolerance)) {
      return out({ ...r, status: 'wrong', reason: `check failed: max abs error ${r.check.maxAbsErr.toExponential(2)} > ${settings.tolerance}` });
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
    t0 = performance.now();
    while (firstMs < 1000 && (warmups < settings.minWarmups || (warmups < settings.maxWarmups && performance.now() - t0 < settings.warmSeconds * 1000))) {
      await runner.run();
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
async function timeRounds(entries, s) {
  const times = entries.map(() => []);
  const start = performance.now();
  let rounds = 0;
  const target = (e) => e.result.runsTarget ?? settings.minRuns;
  while (entries.some((e, i) => e.runner && times[i].length < target(e)) ||
         (performance.now() - start < settings.minSeconds * 1000 && rounds < settings.maxRuns)) {
    for (let i = 0; i < entries.length; i++) {
      if (!entries[i].runner) continue;
      if (entries[i].result.runsTarget && times[i].length >= entries[i].result.runsTarget) continue;
      const t0 = performance.now();
      try {
        await entries[i].runner.run();
      } catch (e) {
        entries[i].result = { ...entries[i].result, status: 'failed', reason: `run failed while timing: ${errText(e)}` };
        entries[i].runner = null;
        continue;
      }
      times[i].push(performance.now() - t0);
    }
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
      gflops: flops(s) / ms / 1e6, usefulGflops: usefulFlops(s) / ms / 1e6, gbs: bytes(s) / ms / 1e6,
    };
  }
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
    peakProbeGflops: peakProbe(), peers: {},
  };
  console.log('');
  console.log(`(${s.id}) ${s.name}: ${describe(s)}: checking and warming up`);
  const prepared = [];
  for (const peer of peers) {
    if (peer.failed) { entry.peers[peer.name] = { status: 'failed', reason: `peer failed to load: ${peer.failed}` }; continue; }
    for (const variant of peer.variants(s)) {
      const p = { peer, ...(await prepareVariant(peer, variant, s, inputs, ref)) };
      if (!p.runner) console.log(`  [${s.id}] ${peer.name} / ${variant.label}: ${p.result.reason.startsWith(p.result.status) ? '' : `${p.result.status}: `}${p.result.reason}`);
      prepared.push(p);
    }
  }
  await timeRounds(prepared, s);
  for (const peer of peers) {
    if (peer.failed) continue;
    const variants = prepared.filter((p) => p.peer === peer).map((p) => p.result);
    const ok = variants.filter((v) => v.status === 'ok').sort((a, b) => a.medianMs - b.medianMs);
    const best = ok[0] ?? variants.find((v) => v.status === 'skipped' && v.singleRunMs) ?? variants[0];
    entry.peers[peer.name] = { ...best, variants: variants.length > 1 ? variants : undefined };
  }
  const mine = entry.peers['sdpa-wasm'];
  if (mine?.status === 'ok') {
    entry.ratios = {};
    for (const [name, p] of Object.entries(entry.peers)) {
      if (name !== 'sdpa-wasm' && p.status === 'ok') entry.ratios[name] = p.medianMs / mine.medianMs;
    }
  }
  entry.elapsedSeconds = (performance.now() - tShape) / 1000;
  results.push(entry);
}
const totalSeconds = (performance.now() - t0All) / 1000;

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
for (const e of results) {
  for (const p of Object.values(e.peers)) {
    for (const r of [p, ...(p.variants ?? [])]) {
      if (r.status !== 'ok') continue;
      r.fractionOfPeak = r.usefulGflops / limits.peakGflops;
      r.fractionOfCopy = r.gbs / limits.copyTrafficGBs;
    }
  }
  const mine = e.peers['sdpa-wasm'];
  if (e.ratios && mine?.status === 'ok') {
    e.ratios.peak = mine.fractionOfPeak;
    e.ratios.copy = mine.fractionOfCopy;
  }
}
console.log('');
console.log(`%peak = unmasked FLOP/s ÷ the ${limits.peakGflops.toFixed(1)} GFLOP/s wasm SIMD mul+add peak (GFLOP/s counts 4·B·Hq·Lq·Lk·E even when causal); ` +
  `GB/s = (Q + K + V + output bytes) ÷ time, %copy = GB/s ÷ the ${limits.copyTrafficGBs.toFixed(1)} GB/s read+write traffic of a wasm memory copy; ` +
  `sdpa÷peer = peer median ÷ sdpa-wasm median (> 1: sdpa-wasm faster)`);
for (const e of results) printShape(e);

// ---------------------------------------------------------------------------------------------
function printShape(e) {
  const decode = isDecode(e);
  console.log('');
  console.log(`(${e.id}) ${e.name}: ${e.description}; ${(e.flops / 1e9).toFixed(3)} GFLOP` +
    (e.causal ? ` (${(e.usefulFlops / 1e9).toFixed(3)} unmasked)` : '') + `, ${(e.bytes / 2 ** 20).toFixed(1)} MiB moved; ` +
    `checked ${e.reference.rowsChecked === e.reference.rowsTotal ? 'all' : `${e.reference.rowsChecked} of ${e.reference.rowsTotal}`} output rows; ` +
    `SIMD peak probe before it: ${e.peakProbeGflops.toFixed(1)} GFLOP/s`);
  console.log(`  ${'peer'.padEnd(16)}${'graph / variant'.padEnd(36)}${'max abs err'.padStart(12)}${'runs'.padStart(6)}` +
    `${'median ms'.padStart(11)}${'GFLOP/s'.padStart(9)}${'%peak'.padStart(7)}${'GB/s'.padStart(7)}${'%copy'.padStart(7)}${'sdpa÷peer'.padStart(11)}`);
  for (const [name, p] of Object.entries(e.peers)) {
    const err = p.check ? p.check.maxAbsErr.toExponential(1) : '';
    const label = (p.variant ?? '').slice(0, 35);
    if (p.status === 'ok') {
      const ratio = name === 'sdpa-wasm' ? '1.00' : e.ratios?.[name] ? `${e.ratios[name].toFixed(2)}×` : '';
      console.log(`  ${name.padEnd(16)}${label.padEnd(36)}${err.padStart(12)}${String(p.runs).padStart(6)}` +
        `${fmtMs(p.medianMs).padStart(11)}${p.gflops.toFixed(2).padStart(9)}${(100 * p.fractionOfPeak).toFixed(0).concat('%').padStart(7)}` +
        `${(decode ? p.gbs.toFixed(1) : '-').padStart(7)}${(decode ? `${(100 * p.fractionOfCopy).toFixed(0)}%` : '-').padStart(7)}${ratio.padStart(11)}`);
    } else {
      console.log(`  ${name.padEnd(16)}${label.padEnd(36)}${err.padStart(12)}  ${p.status}: ${(p.reason ?? p.note ?? '').replace(/^(skipped|failed): /, '')}`);
    }
    for (const v of p.variants ?? []) {
      if (v === p || v.variant === p.variant) continue;
      const what = v.status === 'ok' ? `${fmtMs(v.medianMs)} ms (${v.runs} runs, max abs err ${v.check.maxAbsErr.toExponential(1)})` : `${v.status}: ${v.reason ?? v.note ?? ''}`;
      console.log(`  ${''.padEnd(16)}  also ${v.variant}: ${what}`);
    }
    if (p.note) console.log(`  ${''.padEnd(16)}  note: ${p.note}`);
    if (p.memoryNote) console.log(`  ${''.padEnd(16)}  note: ${p.memoryNote}`);
    if (p.fewerRuns) console.log(`  ${''.padEnd(16)}  note: ${p.fewerRuns}`);
  }
}

const loadAfter = os.loadavg();
console.log('');
console.log(`summary: median ms (sdpa-wasm throughput ÷ peer throughput); sdpa-wasm as a fraction of the limit ` +
  `(prefill: unmasked FLOP/s ÷ ${limits.peakGflops.toFixed(1)} GFLOP/s peak; decode: GB/s ÷ ${limits.copyTrafficGBs.toFixed(1)} GB/s copy traffic)`);
const names = peers.map((p) => p.name);
console.log(`  ${'shape'.padEnd(20)}${names.map((n) => n.padStart(n === 'sdpa-wasm' ? 11 : 22)).join('')}${'of limit'.padStart(10)}`);
for (const e of results) {
  const cells = names.map((n) => {
    const p = e.peers[n];
    if (n === 'sdpa-wasm') return (p?.status === 'ok' ? fmtMs(p.medianMs) : p?.status ?? '').padStart(11);
    if (p?.status === 'ok') return `${fmtMs(p.medianMs)} (${e.ratios ? `${e.ratios[n].toFixed(2)}×` : '?'})`.padStart(22);
    return (p?.status === 'skipped' && p.singleRunMs ? `${fmtMs(p.singleRunMs)} (1 run)` : p?.status ?? '').padStart(22);
  });
  const mine = e.peers['sdpa-wasm'];
  const limit = mine?.status === 'ok' ? `${(100 * (isDecode(e) ? mine.fractionOfCopy : mine.fractionOfPeak)).toFixed(0)}% ${isDecode(e) ? 'copy' : 'peak'}` : '';
  console.log(`  ${`(${e.id}) ${e.name}`.padEnd(20)}${cells.join('')}${limit.padStart(10)}`);
}
console.log(`load average before ${loadBefore.map((x) => x.toFixed(2)).join(' ')}, after ${loadAfter.map((x) => x.toFixed(2)).join(' ')}; ` +
  `shapes took ${totalSeconds.toFixed(0)} s`);

for (const peer of peers) { try { peer.dispose?.(); } catch { /* ignore */ } }

// `rows` keeps the earlier format (sdpa-wasm only) for anything that reads it.
const rows = results.filter((e) => e.peers['sdpa-wasm']?.status === 'ok').map((e) => {
  const p = e.peers['sdpa-wasm'];
  return { shape: e.name, name: e.name, B: e.B, H: e.H, Hkv: e.Hkv, Lq: e.Lq, Lk: e.Lk, E: e.E, causal: e.causal, runs: p.runs, medianMs: p.medianMs, gflops: p.gflops };
});
mkdirSync(dirname(jsonPath), { recursive: true });
writeFileSync(jsonPath, JSON.stringify({
  date: new Date().toISOString(), node: process.versions.node, v8: process.versions.v8,
  cpu: cpuModel, vcpus: os.cpus().length, loadavgBefore: loadBefore, loadavgAfter: loadAfter,
  threads: 1, quick, settings, totalSeconds, limits,
  peers: peers.map((p) => ({ name: p.name, version: p.version, config: p.config, failed: p.failed })),
  shapes: results, rows,
}, (k, v) => (typeof v === 'number' && !Number.isFinite(v) ? String(v) : v), 2));
console.log(`results: ${jsonPath}`);
