// node bench/decode.mjs [--quick] [--json PATH] [--contexts 512,4096] [--kinds MHA,GQA] [--hot] [--no-ort] [--portable]
// (also run by bench.mjs, after its shapes, unless it is given --no-decode)
//
// Decoding with the KV cache (attn.createKVCache): one step = cache.attend() of one query row
// per head (Lq = 1) against `context` stored positions, for
//   MHA B1 H32 E128 and GQA B1 Hq32 Hkv8 E128, contexts 512 … 32768 (--quick: 512 and 4096),
//   float32, float16 and bfloat16 caches, createAttention({ threads: 1 }) and ({ threads: 2 }): the
//   relaxed-SIMD build where the engine runs it (Node 20 with --experimental-wasm-relaxed-simd,
//   as `npm run bench` starts it), else the portable one; --portable forces the portable build.
//   The build used (attn.isa) is in the header and the JSON (`isa`).
// Each cache is filled once to `context` with random K/V; then, in the same round-robin rounds
// (the entries shuffled anew every round):
//   attend   cache.attend(q, { out })                                   (the decode step)
//   step     cache.truncate(context − 1); cache.append(1 token); cache.attend(q, { out })
//   read     a plain wasm SIMD read of the same bytes (read-probe.mjs), on 1 or 2 threads
//   sdpa()   today's call with copies: attn.sdpa(q, kFull, vFull, { isCausal, causalOffset:
//            context − 1, out }) on one thread, the whole history passed as Float32Arrays
//   ORT      onnxruntime-web (wasm, 1 thread): its plain graphs from peers/ort.mjs on the decode
//            shape (MultiHeadAttention, Attention-23, MatMul-Softmax-MatMul) and
//            GroupQueryAttention with past_key/past_value (peers/ort-gqa.mjs)
// Every output is checked against the float64 reference (reference.mjs) before it is timed.
// Before each timed run the read probe reads a buffer 3× the last-level cache on both threads
// (untimed), so every run starts from main memory, as a layer's cache does in a real model
// (--hot: no eviction). Reported: medians, tokens/s (1000 ÷ ms: one layer's attention), GB/s
// of cache read (K + V bytes at that context ÷ time), the step ÷ the read of the same bytes,
// and the project's decode targets, met or NOT met. Results go into the results JSON under
// `decode` (standalone: merged into the existing file).
import { readFileSync, statSync } from 'node:fs';
import os from 'node:os';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createAttention } from 'sdpa-wasm';
import { describeHostCpu, hostCpu } from './host.mjs';
import { DEFAULT_RESULTS_PATH, writeSection } from './results-file.mjs';
import { evictionBytes, openReadProbe } from './read-probe.mjs';
import { storedValues } from '../tests/shared/kv-cache-cases.mjs';  // the tests' float16 and bfloat16 rounding, one rule for both
import { checkPassed, compare, makeInputs, referenceRows, RELATIVE_TOLERANCE } from './reference.mjs';

export const DECODE_SHAPES = [
  { kind: 'MHA', B: 1, Hq: 32, Hkv: 32, E: 128, contexts: [512, 2048, 4096, 8192, 32768] },
  { kind: 'GQA', B: 1, Hq: 32, Hkv: 8, E: 128, contexts: [512, 2048, 8192, 32768] },
];
export const QUICK_CONTEXTS = [512, 4096];
// bfloat16 has no target of the issue's; it is measured beside the two that have.
const DTYPES = ['float32', 'float16', 'bfloat16'];
const TARGET_DTYPES = ['float32', 'float16'];
const ELEMENT_BYTES = { float32: 4, float16: 2, bfloat16: 2 };
const THREADS = [1, 2];
const short = { float32: 'f32', float16: 'f16', bfloat16: 'bf16' };
/**
 * The caches of one (shape, context) share their timed rounds (every dtype, both thread
 * counts) when the dtypes together take at most this much of one module's memory (2 GiB at
 * most); otherwise (MHA at 32768: 1 GiB + 0.5 GiB + 0.5 GiB) they go in groups that fit, in
 * DTYPES order ([f32], [f16, bf16]), each group with rounds of its own and the peers timed again
 * in them, so that one module never holds more than this much cache.
 */
const MODULE_CACHE_BYTES = 2 ** 30;

/** DTYPES in groups of consecutive dtypes whose caches together take at most MODULE_CACHE_BYTES. */
function dtypeGroups(bytesOf) {
  const groups = [];
  for (const d of DTYPES) {
    const last = groups[groups.length - 1];
    if (last && last.reduce((a, x) => a + bytesOf(x), 0) + bytesOf(d) <= MODULE_CACHE_BYTES) last.push(d);
    else groups.push([d]);
  }
  return groups;
}

// The KV-cache issue's decode targets. (d) = MHA context 4096 (the main bench's shape d),
// (f) = MHA context 8192. Each is judged on a decode step as an application runs it: the new
// token's K/V appended, then attend (the `step` entries: truncate + append 1 + attend). Until
// 2026-12-03 they were judged on attend alone; the JSONs keep both (attendMs, stepMs).
export const DECODE_TARGETS = {
  shapes: { d: { kind: 'MHA', context: 4096 }, f: { kind: 'MHA', context: 8192 } },
  vsRead: 1.25,                                 // (d), (f), 1 thread: step ≤ 1.25× the read of its bytes
  vsOrt: { float32: 2.5, float16: 4.5 },        // (d), (f), 1 thread: ORT's best decode graph ÷ step
  float16: { minContext: 8192, speedup: 1.7 },  // 1 thread, every shape: f32 step ÷ f16 step
  twoThreads: { context: 8192, speedup: 1.6, vsRead: 1.25 },  // 1t step ÷ 2t step ≥ 1.6, or ≤ 1.25× the 2-thread read
};

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const fmtMs = (ms) => (ms === null || ms === undefined ? '-' : ms >= 100 ? ms.toFixed(1) : ms >= 10 ? ms.toFixed(2) : ms.toFixed(3));
const fmtX = (x) => (x === null || x === undefined ? '-' : `${x.toFixed(2)}×`);
const fmtMiB = (b) => (b / 2 ** 20).toFixed(b >= 2 ** 30 ? 0 : 1);
const errText = (e) => String(e?.message ?? e).replace(/\s+/g, ' ').slice(0, 400);
const fmtLoad = (l) => l.map((x) => x.toFixed(2)).join(' ');
const ownCpuMs = () => { const c = process.cpuUsage(); return (c.user + c.system) / 1000; };
/** Busy CPU time of the whole machine so far (all processes, all vCPUs, from /proc/stat), ms. */
const machineBusyMs = () => os.cpus().reduce((a, c) => a + c.times.user + c.times.nice + c.times.sys + c.times.irq, 0);
const cacheBytes = (sh, context, dtype) => sh.B * sh.Hkv * context * 2 * sh.E * ELEMENT_BYTES[dtype];   // K + V, Ev = E


/**
 * Runs the decode section and returns its results (the `decode` key of the results JSON).
 * options: quick, contexts (override), kinds ('MHA', 'GQA'), hot (no eviction), ort (false:
 * no onnxruntime-web), portable (true: the portable build even where relaxed SIMD runs), log
 * (a console.log-like function).
 */
export async function runDecode(options = {}) {
  const held = { attn: {}, probe: null };   // released whatever happens
  try {
    return await decodeSection(options, held);
  } finally {
    for (const a of Object.values(held.attn)) { try { a.dispose(); } catch { /* ignore */ } }
    await held.probe?.close();
  }
}

async function decodeSection({ quick = false, contexts = null, kinds = null, hot = false, ort = true, portable = false, log = console.log } = {}, held) {
  const settings = quick
    ? { warmSeconds: 0.1, minWarmups: 2, minRuns: 5, minSeconds: 0.25, maxRuns: 60, maxRunSeconds: 5, budgetSeconds: 10 }
    : { warmSeconds: 0.3, minWarmups: 3, minRuns: 11, minSeconds: 1.5, maxRuns: 200, maxRunSeconds: 10, budgetSeconds: 60 };
  settings.evict = !hot;
  const t0All = performance.now();
  const host = hostCpu();
  const loadBefore = os.loadavg();
  const shapes = DECODE_SHAPES
    .filter((sh) => !kinds || kinds.map((k) => k.toUpperCase()).includes(sh.kind))
    .map((sh) => ({ ...sh, contexts: contexts ?? (quick ? QUICK_CONTEXTS : sh.contexts) }));

  log('');
  log(`decode with the KV cache${quick ? ' (--quick)' : ''}: one step = cache.attend(q [B, Hq, 1, E], { out }) against \`context\` stored positions; ` +
    shapes.map((sh) => `${sh.kind} B${sh.B} Hq${sh.Hq} Hkv${sh.Hkv} E${sh.E} at ${sh.contexts.join(', ')}`).join('; '));
  log(`host: ${describeHostCpu(host)}, ${os.cpus().length} vCPUs, load average ${fmtLoad(loadBefore)}, Node ${process.versions.node}, V8 ${process.versions.v8}`);

  // --- the instances, the read probe, onnxruntime-web ------------------------------------------
  const attn = held.attn;
  for (const t of THREADS) {
    attn[t] = await createAttention({ threads: t, ...(portable ? { relaxedSimd: false } : {}) });
    if (attn[t].threads !== t) throw new Error(`sdpa-wasm: asked for ${t} threads, got attn.threads = ${attn[t].threads}`);
  }
  const isa = attn[THREADS[0]].isa;
  const callOverhead = measureCallOverhead(attn[1], quick, log);
  const wasmFiles = isa === 'relaxed-simd' ? ['wasm/sdpa-relaxed.wasm', 'wasm/sdpa-mt-relaxed.wasm'] : ['wasm/sdpa.wasm', 'wasm/sdpa-mt.wasm'];
  const probe = held.probe = await openReadProbe({ evictBytes: evictionBytes(host) });
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));
  // When the build in dist/ was made (the working tree may change between runs).
  const build = Object.fromEntries(['index.js', 'kv-cache.js', ...wasmFiles].map((f) => {
    try { return [`dist/${f}`, statSync(new URL(`../dist/${f}`, import.meta.url)).mtime.toISOString()]; } catch { return [`dist/${f}`, null]; }
  }));
  let ortPeer = null, gqaVariant = null, ortFailed = null;
  if (ort) {
    try {
      ortPeer = await (await import('./peers/ort.mjs')).createPeer({ threads: 1 });
      gqaVariant = (await import('./peers/ort-gqa.mjs')).gqaDecodeVariant();
    } catch (e) {
      ortFailed = errText(e);
      log(`onnxruntime-web: FAILED TO LOAD: ${ortFailed}`);
    }
  }
  log(`sdpa-wasm ${pkg.version} (${isa} build, threads 1 and 2; build ${Object.entries(build).map(([f, t]) => `${f} ${t}`).join(', ')}); read probe: v128.load + i32x4.add over the same bytes, 1 thread and 2 (main + 1 worker); ` +
    (settings.evict ? `before every timed run, ${fmtMiB(probe.evictBytes)} MiB of other memory read on both threads (untimed), so each run starts from main memory` : '--hot: no eviction between runs') +
    (ortPeer ? `; onnxruntime-web ${ortPeer.version} (wasm, 1 thread)` : ''));
  log(`check: max abs error vs the float64 reference <= ${RELATIVE_TOLERANCE} × its largest |value| (for a 16-bit cache, the reference of its K/V rounded to its format); warm-up >= ${settings.warmSeconds} s and ${settings.minWarmups} runs; ` +
    `timing: round-robin rounds (a new shuffled order every round), median of >= ${settings.minRuns} runs and >= ${settings.minSeconds} s per (shape, context); ` +
    `an entry is skipped when a run takes > ${settings.maxRunSeconds} s or ${settings.minRuns} runs > ${settings.budgetSeconds} s`);

  // --- one entry: prepare, check, warm up ------------------------------------------------------
  // One run: wall time, and CPU time of the whole process (all its threads: ≈ 2× the wall
  // time when both threads of a 2t entry work).
  const call = (runner) => {
    const c0 = ownCpuMs();
    const t0 = performance.now();
    const out = runner.run();
    const done = (o) => ({ out: o, ms: performance.now() - t0, cpuMs: ownCpuMs() - c0 });
    if (out && typeof out.then === 'function') return out.then(done);
    return done(out);
  };
  async function prepareEntry(e, s, ref) {
    const r = { name: e.name, role: e.role, dtype: e.dtype ?? null, threads: e.threads, label: e.label ?? null, note: e.note };
    if (e.unavailable) return { ...e, result: { ...r, status: e.unavailable.status, reason: e.unavailable.reason } };
    let runner;
    try {
      runner = await e.prepare();
    } catch (err) {
      return { ...e, result: { ...r, status: 'failed', reason: `set-up failed: ${errText(err)}` } };
    }
    const out = async (result) => { try { await runner.dispose?.(); } catch { /* the result says what failed */ } return { ...e, result }; };
    try {
      if (settings.evict) probe.evict();
      let { out: output, ms } = await call(runner);
      r.firstRunMs = ms;
      if (e.check) {
        if (runner.toBhsd) output = runner.toBhsd(output);
        r.check = compare(s, ref, output);
        if (!checkPassed(r.check)) {
          const reason = `check failed: max abs error ${r.check.maxAbsErr.toExponential(2)} > ${RELATIVE_TOLERANCE} × max |ref| ${r.check.maxAbsRef.toExponential(2)}`;
          log(`  ${e.name}: WRONG: ${reason}`);
          return out({ ...r, status: 'wrong', reason });
        }
      }
      // A first run pays for growing memory (ORT's heap, page faults on fresh arrays): when it is
      // too slow, a second run decides.
      const tooSlow = (x) => x > settings.maxRunSeconds * 1000 || x * settings.minRuns > settings.budgetSeconds * 1000;
      if (tooSlow(ms) && ms < 3 * settings.maxRunSeconds * 1000) {
        if (settings.evict) probe.evict();
        ms = (await call(runner)).ms;
        r.secondRunMs = ms;
      }
      if (tooSlow(ms)) {
        return out({ ...r, status: 'skipped', singleRunMs: ms, reason: `one run took ${(ms / 1000).toFixed(1)} s` +
          `${r.secondRunMs !== undefined ? ` (the second; the first ${(r.firstRunMs / 1000).toFixed(1)} s)` : ''}, ${settings.minRuns} would take > ${settings.budgetSeconds} s` });
      }
      let warmups = 1;
      const t0 = performance.now();
      while (warmups < settings.minWarmups || performance.now() - t0 < settings.warmSeconds * 1000) {
        if (settings.evict) probe.evict();
        await call(runner);
        warmups++;
      }
      r.warmups = warmups;
      return { ...e, runner, result: r };
    } catch (err) {
      return out({ ...r, status: 'failed', reason: `run failed: ${errText(err)}` });
    }
  }

  // --- the rounds --------------------------------------------------------------------------------
  // The entries in the order of round `round`: a Fisher–Yates shuffle driven by an LCG seeded
  // with the round, so a run is repeatable.
  function shuffled(entries, round) {
    const order = entries.slice();
    let x = (round * 2654435761 + 1) >>> 0;
    for (let i = order.length - 1; i > 0; i--) {
      x = (x * 1664525 + 1013904223) >>> 0;
      const j = Math.floor((x / 2 ** 32) * (i + 1));
      [order[i], order[j]] = [order[j], order[i]];
    }
    return order;
  }
  async function timeRounds(entries) {
    const live = entries.filter((e) => e.runner);
    const times = new Map(live.map((e) => [e, []]));
    const cpu = new Map(live.map((e) => [e, 0]));
    const start = performance.now();
    let rounds = 0;
    while (live.some((e) => e.runner) && rounds < settings.maxRuns &&
      (live.some((e) => e.runner && times.get(e).length < settings.minRuns) || performance.now() - start < settings.minSeconds * 1000)) {
      // A new order every round: on a host whose last-level cache keeps part of a cache
      // through the eviction (an Intel Xeon, 480 MiB of L3), an entry run right after another
      // on the same cache took 0.7–0.8× the time it took when run first; shuffled, each entry
      // follows each other one alike.
      for (const e of shuffled(live, rounds)) {
        if (!e.runner) continue;
        if (settings.evict) probe.evict();
        try {
          const run = await call(e.runner);
          times.get(e).push(run.ms);
          cpu.set(e, cpu.get(e) + run.cpuMs);
        } catch (err) {
          e.result = { ...e.result, status: 'failed', reason: `run failed while timing: ${errText(err)}` };
          try { await e.runner.dispose?.(); } catch { /* failed already */ }
          e.runner = null;
        }
      }
      rounds++;
    }
    for (const e of live) {
      if (!e.runner) continue;
      try { await e.runner.dispose?.(); } catch { /* timing is done */ }
      e.runner = null;
      const ts = times.get(e);
      const totalMs = ts.reduce((a, b) => a + b, 0);
      e.result = { ...e.result, status: 'ok', runs: ts.length, medianMs: median(ts), minMs: Math.min(...ts), maxMs: Math.max(...ts),
        cpuPerWall: cpu.get(e) / totalMs };
    }
    return { rounds, seconds: (performance.now() - start) / 1000 };
  }

  // --- the (shape, context) groups ---------------------------------------------------------------
  const ortBestOf = (g) => {
    const ok = g.entries.filter((e) => e.role === 'ort' && e.status === 'ok').sort((a, b) => a.medianMs - b.medianMs);
    return ok[0] ?? null;
  };
  const groups = [];
  const rows = [];
  for (const sh of shapes) {
    for (const context of sh.contexts) {
      const s = { B: sh.B, H: sh.Hq, Hkv: sh.Hkv, Lq: 1, Lk: context, E: sh.E, causal: false };   // Lq = 1: causal (bottom-right) = no mask
      const split = dtypeGroups((d) => cacheBytes(sh, context, d));
      log('');
      log(`${sh.kind} B${sh.B} Hq${sh.Hq} Hkv${sh.Hkv} E${sh.E}, context ${context}: caches ${DTYPES.map((d) => `${short[d]} ${fmtMiB(cacheBytes(sh, context, d))} MiB`).join(', ')}` +
        (split.length > 1 ? ` (together > ${MODULE_CACHE_BYTES / 2 ** 30} GiB of one module's 2 GiB: ${split.map((g) => g.map((d) => short[d]).join(' + ')).join(', then ')}, each with its own rounds and the peers timed again)` : ''));
      let t0 = performance.now();
      let inputs = makeInputs(s);
      const ref = referenceRows(s, inputs);
      // A 16-bit cache is checked against the reference of what it stores: K and V rounded to its format.
      const refOf = { float32: ref };
      for (const d of DTYPES.filter((x) => x !== 'float32')) {
        refOf[d] = referenceRows(s, { q: inputs.q, k: storedValues(d, inputs.k), v: storedValues(d, inputs.v) });
      }
      log(`  inputs and float64 reference (${ref.rows.length} rows, and of K/V rounded to each 16-bit format) in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
      // One token's K/V: the last stored position, appended again by the `step` entries.
      const lastPos = (x) => {
        const out = new Float32Array(sh.B * sh.Hkv * sh.E);
        for (let bh = 0; bh < sh.B * sh.Hkv; bh++) out.set(x.data.subarray((bh * context + context - 1) * sh.E, (bh * context + context) * sh.E), bh * sh.E);
        return { data: out, dims: [sh.B, sh.Hkv, 1, sh.E] };
      };
      const k1 = lastPos(inputs.k), v1 = lastPos(inputs.v);

      for (const dtypes of split) {
        const tGroup = performance.now();
        const group = { kind: sh.kind, B: sh.B, Hq: sh.Hq, Hkv: sh.Hkv, E: sh.E, context, dtypes, loadavgBefore: os.loadavg(), caches: [], entries: [] };
        const entries = [];
        const caches = [];
        for (const dtype of dtypes) {
          const bytes = cacheBytes(sh, context, dtype);
          try { probe.ensure(bytes); } catch (err) { log(`  ${errText(err)}`); }
          for (const threads of THREADS) {
            const tag = `${short[dtype]} ${threads}t`;
            let cache = null, unavailable = null;
            t0 = performance.now();
            try {
              cache = attn[threads].createKVCache({ batch: sh.B, kvHeads: sh.Hkv, headDim: sh.E, valueDim: sh.E, maxLength: context, dtype });
              cache.append(inputs.k, inputs.v);
              caches.push(cache);
              group.caches.push({ dtype, threads, byteLength: cache.byteLength, fillMs: performance.now() - t0 });
            } catch (err) {
              cache?.dispose();
              cache = null;
              const fits = !(err instanceof RangeError);
              unavailable = { status: fits ? 'failed' : 'does not fit', reason: `createKVCache/append (${fmtMiB(bytes)} MiB): ${errText(err)}` };
              group.caches.push({ dtype, threads, bytes, status: unavailable.status, reason: unavailable.reason });
              log(`  cache ${tag}: ${unavailable.status.toUpperCase()}: ${unavailable.reason}`);
            }
            const attendOut = new Float32Array(sh.B * sh.Hq * sh.E), stepOut = new Float32Array(sh.B * sh.Hq * sh.E);
            entries.push({
              name: `attend ${tag}`, role: 'attend', dtype, threads, check: true, unavailable,
              prepare: async () => ({ run: () => cache.attend(inputs.q, { out: attendOut }).output.data }),
            }, {
              name: `append+attend ${tag}`, role: 'step', dtype, threads, check: true, unavailable,
              prepare: async () => ({
                run: () => {
                  cache.truncate(context - 1);
                  cache.append(k1, v1);
                  return cache.attend(inputs.q, { out: stepOut }).output.data;
                },
              }),
            });
            const readUnavailable = bytes > probe.capacity() ? { status: 'does not fit', reason: `read probe: ${fmtMiB(bytes)} MiB > its memory` } : null;
            entries.push({
              name: `read ${short[dtype]} ${threads}t`, role: 'read', dtype, threads, check: false, unavailable: readUnavailable,
              prepare: async () => ({ run: threads === 1 ? () => probe.read1(bytes) : () => probe.read2(bytes) }),
            });
          }
        }
        // The peers: one thread, float32 history.
        const copiesOut = new Float32Array(sh.B * sh.Hq * sh.E);
        entries.push({
          name: 'sdpa() with copies 1t', role: 'sdpa-copies', threads: 1, check: true,
          label: 'attn.sdpa(q, kFull, vFull, { isCausal: true, causalOffset: context-1, out })',
          prepare: async () => ({ run: () => attn[1].sdpa(inputs.q, inputs.k, inputs.v, { isCausal: true, causalOffset: context - 1, out: copiesOut }).output.data }),
        });
        if (ort) {
          const variants = ortPeer ? [...ortPeer.variants(s), gqaVariant] : [{ label: 'all graphs' }];
          for (const v of variants) {
            entries.push({
              name: `ORT ${v.label}`, role: 'ort', threads: 1, check: true, label: v.label, note: v.note,
              unavailable: ortFailed ? { status: 'failed', reason: `onnxruntime-web failed to load: ${ortFailed}` }
                : v.unsupported ? { status: 'unsupported', reason: v.unsupported } : null,
              prepare: () => v.prepare(inputs, s),
            });
          }
        }
        // Set-up, check and warm-up of each, then the rounds.
        const prepared = [];
        for (const e of entries) {
          const p = await prepareEntry(e, s, refOf[e.dtype] ?? ref);
          if (!p.runner && p.result.status !== 'does not fit') log(`  ${e.name}: ${p.result.status.toUpperCase()}: ${p.result.reason}`);
          prepared.push(p);
        }
        // The CPU other processes used during the rounds: the machine's busy time (/proc/stat)
        // minus this process's, in cores (this machine is shared).
        const busy0 = machineBusyMs(), own0 = ownCpuMs(), wall0 = performance.now();
        const timing = await timeRounds(prepared);
        group.otherProcessesCores = Math.max(0, ((machineBusyMs() - busy0) - (ownCpuMs() - own0)) / (performance.now() - wall0));
        for (const c of caches) c.dispose();
        group.rounds = timing.rounds;
        group.timedSeconds = timing.seconds;
        group.entries = prepared.map((p) => p.result);
        group.loadavgAfter = os.loadavg();
        group.seconds = (performance.now() - tGroup) / 1000;
        group.maxRssBytes = process.resourceUsage().maxRSS * 1024;
        groups.push(group);
        rows.push(...groupRows(sh, context, group));
        log(`  ${dtypes.map((d) => short[d]).join(' + ')}: ${timing.rounds} rounds in ${timing.seconds.toFixed(1)} s (${group.seconds.toFixed(1)} s with set-up); ` +
          `other processes used ${group.otherProcessesCores.toFixed(2)} cores meanwhile; load average ${fmtLoad(group.loadavgAfter)}; peak RSS of the process ${(group.maxRssBytes / 2 ** 30).toFixed(2)} GiB`);
        for (const r of group.entries.filter((x) => x.status === 'ok')) {
          log(`    ${r.name.padEnd(52)} ${fmtMs(r.medianMs).padStart(9)} ms  (${r.runs} runs, ${fmtMs(r.minMs)}–${fmtMs(r.maxMs)}` +
            `${r.check ? `, max abs err ${r.check.maxAbsErr.toExponential(1)}` : ''}, CPU/wall ${r.cpuPerWall.toFixed(2)})`);
        }
      }
      inputs = null;
    }
  }

  // --- derived figures, tables, targets ----------------------------------------------------------
  function groupRows(sh, context, g) {
    const find = (role, dtype, threads) => g.entries.find((e) => e.role === role && (dtype === undefined || e.dtype === dtype) && (threads === undefined || e.threads === threads));
    const okMs = (e) => (e?.status === 'ok' ? e.medianMs : null);
    const copies = find('sdpa-copies');
    const ortBest = ortBestOf(g);
    const ortPlain = g.entries.filter((e) => e.role === 'ort' && e.status === 'ok' && !e.label.startsWith('GroupQuery')).sort((a, b) => a.medianMs - b.medianMs)[0] ?? null;
    const ortGqa = g.entries.find((e) => e.role === 'ort' && e.label?.startsWith('GroupQuery')) ?? null;
    const out = [];
    for (const dtype of g.dtypes) {
      for (const threads of THREADS) {
        const attend = find('attend', dtype, threads), step = find('step', dtype, threads), read = find('read', dtype, threads);
        const ms = okMs(attend), bytes = cacheBytes(sh, context, dtype);
        const ratio = (a, b) => (a !== null && b !== null ? a / b : null);
        const row = {
          kind: sh.kind, B: sh.B, Hq: sh.Hq, Hkv: sh.Hkv, E: sh.E, context, dtype, threads, cacheBytes: bytes,
          status: attend.status, reason: attend.reason,
          attendMs: ms, stepMs: okMs(step), readMs: okMs(read),
          runs: attend.runs ?? null, check: attend.check ?? null,
          cpuPerWall: attend.cpuPerWall ?? null, readCpuPerWall: read?.cpuPerWall ?? null, otherProcessesCores: g.otherProcessesCores,
          tokensPerSecond: ms !== null ? 1000 / ms : null,
          gbs: ms !== null ? bytes / ms / 1e6 : null,
          readGbs: okMs(read) !== null ? bytes / okMs(read) / 1e6 : null,
          vsRead: ratio(ms, okMs(read)),              // ≤ 1.25: the target
          stepVsRead: ratio(okMs(step), okMs(read)),
          sdpaCopiesMs: okMs(copies), ortBestMs: ortBest?.medianMs ?? null, ortBestGraph: ortBest?.label ?? null,
          ortPlainMs: ortPlain?.medianMs ?? null, ortPlainGraph: ortPlain?.label ?? null, ortGqaMs: okMs(ortGqa),
          // Peers run on one thread: their ratios are given for the one-thread rows.
          vsSdpaCopies: threads === 1 ? ratio(okMs(copies), ms) : null,
          vsOrtBest: threads === 1 ? ratio(ortBest?.medianMs ?? null, ms) : null,
          vsOrtGqa: threads === 1 ? ratio(okMs(ortGqa), ms) : null,
          speedupOver1t: threads > 1 ? ratio(okMs(find('attend', dtype, 1)), ms) : null,
          // The same for the step (append + attend): what the targets are judged on.
          stepVsOrtBest: threads === 1 ? ratio(ortBest?.medianMs ?? null, okMs(step)) : null,
          stepSpeedupOver1t: threads > 1 ? ratio(okMs(find('step', dtype, 1)), okMs(step)) : null,
          rounds: g.rounds,
          sameRoundsAsOtherDtype: g.dtypes.includes('float32') && g.dtypes.length > 1,
        };
        out.push(row);
      }
    }
    return out;
  }

  log('');
  log(`decode summary (host ${describeHostCpu(host)}): attend = cache.attend() ms, median; tok/s = 1000 ÷ attend ms (one layer's attention); ` +
    `GB/s = K+V bytes at that context ÷ attend time; read = the plain wasm SIMD read of the same bytes on as many threads, same rounds; ` +
    `÷read = attend ÷ read (1.00 = as fast as reading the cache); step = truncate + append 1 token + attend; 2t×1t = 1-thread attend ÷ 2-thread attend; ` +
    `copies÷ = sdpa() with copies (1 thread) ÷ attend; ORT÷ = onnxruntime-web's fastest correct decode graph (1 thread, incl. GQA+past) ÷ attend; ` +
    `CPU/wall = process CPU time ÷ wall time over the attend runs (≈ 2 when two threads work); others = cores other processes used during the rounds`);
  const head = `  ${'shape'.padEnd(6)}${'context'.padStart(8)}${'dtype'.padStart(7)}${'thr'.padStart(4)}${'cache MiB'.padStart(11)}${'attend ms'.padStart(11)}` +
    `${'tok/s'.padStart(8)}${'GB/s'.padStart(7)}${'read ms'.padStart(10)}${'÷read'.padStart(7)}${'step ms'.padStart(10)}${'÷read'.padStart(7)}` +
    `${'2t×1t'.padStart(7)}${'copies÷'.padStart(9)}${'ORT÷'.padStart(8)}${'CPU/wall'.padStart(10)}${'others'.padStart(8)}`;
  log(head);
  for (const r of rows) {
    const cells = `  ${r.kind.padEnd(6)}${String(r.context).padStart(8)}${short[r.dtype].padStart(7)}${String(r.threads).padStart(4)}${fmtMiB(r.cacheBytes).padStart(11)}`;
    if (r.attendMs === null) { log(`${cells}  ${r.status}${r.reason ? ' (below)' : ''}`); continue; }
    log(`${cells}${fmtMs(r.attendMs).padStart(11)}${r.tokensPerSecond.toFixed(0).padStart(8)}${r.gbs.toFixed(1).padStart(7)}` +
      `${fmtMs(r.readMs).padStart(10)}${fmtX(r.vsRead).padStart(7)}${fmtMs(r.stepMs).padStart(10)}${fmtX(r.stepVsRead).padStart(7)}` +
      `${(r.threads > 1 ? fmtX(r.speedupOver1t) : '').padStart(7)}${(r.threads === 1 ? fmtX(r.vsSdpaCopies) : '').padStart(9)}${(r.threads === 1 ? fmtX(r.vsOrtBest) : '').padStart(8)}` +
      `${r.cpuPerWall.toFixed(2).padStart(10)}${r.otherProcessesCores.toFixed(2).padStart(8)}`);
  }
  for (const r of rows.filter(secondThreadIdle)) {
    log(`  note: ${r.kind} ${r.context} ${short[r.dtype]}, ${r.threads} threads: ${secondThreadIdleNote(r)}`);
  }
  log('');
  log('decode peers, one thread, float32 history (median ms; the fastest ORT graph marked *):');
  const ortLabels = [...new Set(groups.flatMap((g) => g.entries.filter((e) => e.role === 'ort').map((e) => e.label)))];
  const abbreviate = (l) => l.replace(' (com.microsoft)', '').replace('MultiHeadAttention', 'MHA').replace('Attention (opset 23)', 'Attention-23')
    .replace('MatMul-Softmax-MatMul', 'MatMul-Softmax').replace('GroupQueryAttention + past', 'GQA+past');
  log(`  ${'shape'.padEnd(6)}${'context'.padStart(8)}${'caches'.padStart(10)}${'sdpa() copies'.padStart(15)}${ortLabels.map((l) => `ORT ${abbreviate(l)}`.padStart(20)).join('')}`);
  for (const g of groups) {
    const best = ortBestOf(g);
    const cell = (e) => (e?.status === 'ok' ? `${fmtMs(e.medianMs)}${e === best ? '*' : ''}` : e?.status ?? '-');
    log(`  ${g.kind.padEnd(6)}${String(g.context).padStart(8)}${g.dtypes.map((d) => short[d]).join('+').padStart(10)}` +
      `${cell(g.entries.find((e) => e.role === 'sdpa-copies')).padStart(15)}${ortLabels.map((l) => cell(g.entries.find((e) => e.label === l && e.role === 'ort')).padStart(20)).join('')}`);
  }
  // What was not timed, one line per (shape, context, reason).
  const failures = new Map();
  for (const g of groups) {
    for (const e of g.entries.filter((x) => x.status !== 'ok')) {
      const key = `${g.kind} ${g.context}: ${e.status}: ${String(e.reason).replace(/\d+/g, '#')}`;
      if (!failures.has(key)) failures.set(key, { g, e, names: new Set() });
      failures.get(key).names.add(e.name);
    }
  }
  for (const { g, e, names } of failures.values()) log(`  not timed: ${g.kind} ${g.context} ${[...names].join(', ')}: ${e.status}: ${e.reason}`);

  const targets = evaluateTargets(rows);
  log('');
  log(`decode targets (host ${describeHostCpu(host)}; d = MHA context 4096, f = MHA context 8192; decode steps, append + attend, medians of the same rounds unless noted):`);
  for (const t of targets) log(`  ${t.met === null ? 'not measured' : t.met ? 'met    ' : 'NOT met'}  ${t.what}: ${t.detail}`);
  const bf16Rows = rows.filter((r) => r.dtype === 'bfloat16' && r.threads === 1 && r.stepMs !== null);
  if (bf16Rows.length > 0) {
    log('bfloat16 cache (no target of its own; in the same rounds as float16, and as float32 where noted above), decode steps, 1 thread:');
    for (const r of bf16Rows) {
      const of = (d) => rows.find((x) => x.kind === r.kind && x.context === r.context && x.dtype === d && x.threads === 1);
      const ratio = (x) => (x?.stepMs ? x.stepMs / r.stepMs : null);
      log(`  ${r.kind} ${r.context}: ${fmtMs(r.stepMs)} ms, ${fmtX(r.stepVsRead)} the read of its bytes; ` +
        `float32's step ${fmtX(ratio(of('float32')))} and float16's ${fmtX(ratio(of('float16')))} its time`);
    }
  }

  const loadAfter = os.loadavg();
  const totalSeconds = (performance.now() - t0All) / 1000;
  log(`decode section: ${totalSeconds.toFixed(0)} s; load average ${fmtLoad(loadBefore)} → ${fmtLoad(loadAfter)}; peak RSS ${(process.resourceUsage().maxRSS / 2 ** 20).toFixed(2)} GiB`);
  return {
    date: new Date().toISOString(), node: process.versions.node, v8: process.versions.v8,
    host, cpu: os.cpus()[0]?.model ?? null, vcpus: os.cpus().length,
    sdpaWasm: pkg.version, isa, build, onnxruntimeWeb: ortPeer?.version ?? null, ortFailed,
    quick, settings, loadavgBefore: loadBefore, loadavgAfter: loadAfter, totalSeconds,
    readProbe: { kernel: 'v128.load + i32x4.add, 8 accumulators, 128 bytes per iteration; 2 threads: main + 1 worker on one shared memory, halves', evictBytes: settings.evict ? probe.evictBytes : 0 },
    shapes: shapes.map(({ kind, B, Hq, Hkv, E, contexts: cs }) => ({ kind, B, Hq, Hkv, E, contexts: cs })),
    targetsSpec: DECODE_TARGETS, targets, rows, groups, callOverhead,
  };
}

/**
 * What a call costs beyond its arithmetic: a cache of 1 KV head and 16 positions (E128,
 * float32, one thread, caches in L1), where the kernel's own work is well under a microsecond:
 * cache.attend(); a decode step (truncate + append 1 token + attend); sdpa() of the same problem
 * with its copies. Outputs checked against the float64 reference first; medians of rounds of
 * 1000 calls (µs per call).
 */
function measureCallOverhead(attn, quick, log) {
  const s = { B: 1, H: 1, Hkv: 1, Lq: 1, Lk: 16, E: 128 };
  const inputs = makeInputs(s);
  const ref = referenceRows(s, inputs);
  const last = (x) => ({ data: x.data.slice((s.Lk - 1) * s.E), dims: [1, 1, 1, s.E] });
  const k1 = last(inputs.k), v1 = last(inputs.v);
  const cache = attn.createKVCache({ batch: 1, kvHeads: 1, headDim: s.E, maxLength: s.Lk });
  try {
    cache.append(inputs.k, inputs.v);
    const out = new Float32Array(s.E);
    const calls = {
      attend: () => cache.attend(inputs.q, { out }),
      step: () => { cache.truncate(s.Lk - 1); cache.append(k1, v1); cache.attend(inputs.q, { out }); },
      sdpa: () => attn.sdpa(inputs.q, inputs.k, inputs.v, { out }),
    };
    for (const [name, call] of Object.entries(calls)) {
      out.fill(NaN);
      call();
      const c = compare(s, ref, out);
      if (!checkPassed(c)) throw new Error(`call overhead: ${name} is wrong (max abs error ${c.maxAbsErr}, max |ref| ${c.maxAbsRef})`);
    }
    const rounds = quick ? 5 : 15, perRound = 1000;
    const times = Object.fromEntries(Object.keys(calls).map((name) => [name, []]));
    for (const call of Object.values(calls)) for (let i = 0; i < perRound; i++) call();  // warm-up
    for (let round = 0; round < rounds; round++) {
      for (const [name, call] of Object.entries(calls)) {
        const t0 = performance.now();
        for (let i = 0; i < perRound; i++) call();
        times[name].push((performance.now() - t0) / perRound * 1000);
      }
    }
    const us = Object.fromEntries(Object.entries(times).map(([name, t]) => [name, median(t)]));
    log(`call overhead (1 KV head, 16 positions, E128, float32, 1 thread; the kernel's work is under 1 µs; median µs per call over ` +
      `${rounds} rounds of ${perRound}): attend ${us.attend.toFixed(1)}, step (truncate + append 1 + attend) ${us.step.toFixed(1)}, ` +
      `sdpa() with copies ${us.sdpa.toFixed(1)}`);
    return { shape: s, rounds, callsPerRound: perRound, attendUs: us.attend, stepUs: us.step, sdpaUs: us.sdpa };
  } finally {
    cache.dispose();
  }
}

// A two-thread row whose process used less CPU time than this per unit of wall time had its
// second thread mostly idle: the host gave it no second core in those rounds (the other vCPU
// busy or descheduled), or a call was too short to be worth waking it. Either way its time
// says little about how the kernel splits the keys.
const SECOND_THREAD_MIN_CPU_PER_WALL = 1.3;

function secondThreadIdle(r) {
  return r.threads > 1 && r.attendMs !== null && r.cpuPerWall < SECOND_THREAD_MIN_CPU_PER_WALL;
}

function secondThreadIdleNote(r) {
  return `CPU time ÷ wall time ${r.cpuPerWall.toFixed(2)} (< ${SECOND_THREAD_MIN_CPU_PER_WALL}): the second thread hardly ran in ` +
    `these rounds (the host's other vCPU busy or descheduled, or too little work per call to wake it), so this row does not measure the split`;
}

function evaluateTargets(rows) {
  const T = DECODE_TARGETS;
  const row = (kind, context, dtype, threads) => rows.find((r) => r.kind === kind && r.context === context && r.dtype === dtype && r.threads === threads);
  const out = [];
  const add = (what, value, met, detail) => out.push({ what, value, met, detail });
  for (const [id, { kind, context }] of Object.entries(T.shapes)) {
    if (!rows.some((r) => r.kind === kind && r.context === context)) {
      add(`(${id}) ${kind} ${context}, 1 thread, both dtypes: ≤ ${T.vsRead}× the read, ≥ ${T.vsOrt.float32}× / ${T.vsOrt.float16}× onnxruntime-web`, null, null, 'not in this run');
      continue;
    }
    for (const dtype of TARGET_DTYPES) {
      const r = row(kind, context, dtype, 1);
      const label = `(${id}) ${kind} ${context} ${dtype} cache, 1 thread`;
      if (!r || r.stepMs === null) {
        add(`${label}: a step ≤ ${T.vsRead}× the read of its bytes`, null, null, r ? `${r.status}: ${r.reason}` : 'not in this run');
        add(`${label}: a step ≥ ${T.vsOrt[dtype]}× onnxruntime-web`, null, null, r ? r.status : 'not in this run');
        continue;
      }
      add(`${label}: a step ≤ ${T.vsRead}× the read of its bytes`, r.stepVsRead, r.stepVsRead === null ? null : r.stepVsRead <= T.vsRead,
        `step ${fmtMs(r.stepMs)} ms ÷ read ${fmtMs(r.readMs)} ms = ${fmtX(r.stepVsRead)} (attend alone ${fmtX(r.vsRead)})`);
      add(`${label}: a step ≥ ${T.vsOrt[dtype]}× onnxruntime-web`, r.stepVsOrtBest, r.stepVsOrtBest === null ? null : r.stepVsOrtBest >= T.vsOrt[dtype],
        r.stepVsOrtBest === null ? 'onnxruntime-web not measured'
          : `ORT ${fmtMs(r.ortBestMs)} ms (${r.ortBestGraph}) ÷ step ${fmtMs(r.stepMs)} ms = ${fmtX(r.stepVsOrtBest)} (attend alone ${fmtX(r.vsOrtBest)})`);
    }
  }
  for (const r16 of rows.filter((r) => r.dtype === 'float16' && r.threads === 1 && r.context >= T.float16.minContext)) {
    const r32 = row(r16.kind, r16.context, 'float32', 1);
    const x = r32?.stepMs && r16.stepMs ? r32.stepMs / r16.stepMs : null;
    add(`${r16.kind} ${r16.context} float16 ≥ ${T.float16.speedup}× faster than float32, 1 thread (steps)`, x, x === null ? null : x >= T.float16.speedup,
      x === null ? 'not measured' : `${fmtMs(r32.stepMs)} ÷ ${fmtMs(r16.stepMs)} ms = ${fmtX(x)}${r16.sameRoundsAsOtherDtype ? '' : ' (rounds of their own: one dtype at a time at this size)'}`);
  }
  for (const r2 of rows.filter((r) => r.threads === 2 && r.context === T.twoThreads.context && TARGET_DTYPES.includes(r.dtype))) {
    const label = `${r2.kind} ${r2.context} ${r2.dtype}, 2 threads: a step ≥ ${T.twoThreads.speedup}× 1 thread's or ≤ ${T.twoThreads.vsRead}× the 2-thread read`;
    if (r2.stepMs === null) { add(label, null, null, `${r2.status}: ${r2.reason}`); continue; }
    const a = r2.stepSpeedupOver1t, b = r2.stepVsRead;
    const met = a === null && b === null ? null : (a !== null && a >= T.twoThreads.speedup) || (b !== null && b <= T.twoThreads.vsRead);
    add(label, { speedup: a, vsRead: b }, met, `${fmtX(a)} one thread's speed (${a !== null && a >= T.twoThreads.speedup ? 'met' : 'not met'}); ` +
      `step ${fmtMs(r2.stepMs)} ms ÷ 2-thread read ${fmtMs(r2.readMs)} ms = ${fmtX(b)} (${b !== null && b <= T.twoThreads.vsRead ? 'met' : 'not met'})` +
      (secondThreadIdle(r2) ? `; ${secondThreadIdleNote(r2)}` : ''));
  }
  return out;
}

// --- standalone ----------------------------------------------------------------------------------
if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const argv = process.argv.slice(2);
  const arg = (name) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : undefined; };
  const jsonPath = arg('--json') ? resolve(arg('--json')) : DEFAULT_RESULTS_PATH;
  const decode = await runDecode({
    quick: argv.includes('--quick'),
    contexts: arg('--contexts')?.split(',').map(Number) ?? null,
    kinds: arg('--kinds')?.split(',') ?? null,
    hot: argv.includes('--hot'),
    ort: !argv.includes('--no-ort'),
    portable: argv.includes('--portable'),
  });
  writeSection(jsonPath, 'decode', decode);  // keeping what bench.mjs wrote there
}
