// sdpa-wasm in Firefox and WebKit against the same calls in Node, as browser.mjs measures
// Chromium: how fast the package runs in the other engines users have (Gecko/SpiderMonkey,
// WebKit/JavaScriptCore, Safari's). The browsers are those of the engine tests
// (tests/engines/browsers.mjs): Debian's Firefox ESR, and WebKitGTK's MiniBrowser on a virtual
// display with SharedArrayBuffer on for isolated pages, as Safari has it.
//   - prefill: shapes (b), (c), (e) and (d) of shapes.mjs, one thread, each build the engine
//     gives (Firefox runs relaxed SIMD, WebKit does not: there the portable build only);
//   - decode: one token attending to browser.mjs's caches (MHA 4096, GQA 8192, float32 and
//     float16), one and two threads.
// Everything on a cross-origin isolated page (its timer: 20 µs in Firefox, where a plain page's
// is 1 ms), the same seeded inputs on both sides. Each row: one checked run (the page's output
// bitwise Node's for the same build: wasm SIMD128 is deterministic, and the relaxed builds
// matched too in Firefox 153), warm-up, then Node and the page timed round by round
// (browser.mjs's `alternate`), medians. Reported, no target: page ms ÷ Node ms.
//   node $(bash scripts/node-relaxed-simd.sh) bench/engines.mjs [--quick] [--json PATH]
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createAttention } from 'sdpa-wasm';
import { launchFirefox, launchWebKit } from '../tests/engines/browsers.mjs';
import { ROOT, startServer } from '../tests/browser/helpers.mjs';
import { bitsHash } from '../tests/shared/reference-cases.mjs';
import { alternate, BUILDS, DECODE_CASES, decodeInputs, inputs, SHAPE_IDS, timed } from './browser.mjs';
import { describeHostCpu, hostCpu } from './host.mjs';
import { DEFAULT_RESULTS_PATH, writeSection } from './results-file.mjs';
import { describe, SHAPES } from './shapes.mjs';

const ENGINES = [['Firefox', launchFirefox], ['WebKit', launchWebKit]];
const THREAD_COUNTS = [1, 2];

// --- in the page (each function's source is sent there: self-contained; env: browsers.mjs) ---

/** One instance per (build asked for, threads); returns [key, isa, threads] of each. */
async function pageSetUp(env, builds, threadCounts) {
  const { createAttention } = await env.load('/dist/index.js');
  const { noiseTensor } = await env.load('/web/seeded.mjs');
  const { bitsHash } = await env.load('/tests/shared/reference-cases.mjs');
  if (!crossOriginIsolated) throw new Error('the benchmark page is not cross-origin isolated');
  const attn = {};
  for (const [isa, relaxedSimd] of builds) {
    for (const threads of threadCounts) attn[`${isa} ${threads}`] = await createAttention({ threads, relaxedSimd });
  }
  window.__engineBench = { attn, noiseTensor, bitsHash };
  return Object.entries(attn).map(([key, a]) => [key, a.isa, a.threads]);
}

/** The shape's seeded inputs (as browser.mjs's `inputs`); one call; returns its output's hash. */
async function pageSetShape(env, s, key) {
  const b = window.__engineBench;
  b.inputs = { q: b.noiseTensor([s.B, s.H, s.Lq, s.E], 7, 1), k: b.noiseTensor([s.B, s.Hkv, s.Lk, s.E], 7, 2), v: b.noiseTensor([s.B, s.Hkv, s.Lk, s.E], 7, 3) };
  b.out = new Float32Array(b.inputs.q.data.length);
  b.causal = s.causal;
  b.attn[key].sdpa(b.inputs.q, b.inputs.k, b.inputs.v, { isCausal: b.causal, out: b.out });
  return b.bitsHash(b.out);
}

async function pageRunShape(env, key) {
  const b = window.__engineBench;
  const t0 = performance.now();
  b.attn[key].sdpa(b.inputs.q, b.inputs.k, b.inputs.v, { isCausal: b.causal, out: b.out });
  return performance.now() - t0;
}

/** A decode case's cache (as browser.mjs's `decodeInputs`) on instance `key`; one step; its hash. */
async function pageSetCache(env, c, key) {
  const b = window.__engineBench;
  b.cache?.dispose();
  b.cache = null;
  const k = b.noiseTensor([c.B, c.Hkv, c.context, c.E], c.seed, 1), v = b.noiseTensor([c.B, c.Hkv, c.context, c.E], c.seed, 2);
  b.query = b.noiseTensor([c.B, c.Hq, 1, c.E], c.seed, 3);
  b.cache = b.attn[key].createKVCache({ batch: c.B, kvHeads: c.Hkv, headDim: c.E, maxLength: c.context, dtype: c.dtype });
  b.cache.append(k, v);
  b.out = new Float32Array(b.query.data.length);
  b.cache.attend(b.query, { out: b.out });
  return b.bitsHash(b.out);
}

async function pageStep() {
  const b = window.__engineBench;
  const t0 = performance.now();
  b.cache.attend(b.query, { out: b.out });
  return performance.now() - t0;
}

async function pageTearDown() {
  const b = window.__engineBench;
  b.cache?.dispose();
  for (const a of Object.values(b.attn)) a.dispose();
}

// --- in Node ---------------------------------------------------------------------------------

export async function runEnginesBench({ quick = false, log = console.log } = {}) {
  const settings = quick ? { warmups: 2, minRuns: 5, minSeconds: 1 } : { warmups: 3, minRuns: 15, minSeconds: 4 };
  const host = hostCpu();
  const shapes = SHAPE_IDS.map((id) => SHAPES.find((s) => s.id === id));
  log('');
  log(`other engines vs Node: sdpa-wasm in Firefox and WebKit (a cross-origin isolated page) and in Node, the same calls; ` +
    `shapes ${shapes.map((s) => `(${s.id}) ${describe(s)}`).join(', ')} on one thread; decode from a KV cache on one and two threads`);
  log(`host: ${describeHostCpu(host)}, Node ${process.versions.node}`);
  const node = {};
  for (const [isa, relaxedSimd] of BUILDS) {
    for (const threads of THREAD_COUNTS) {
      const a = await createAttention({ threads, relaxedSimd });
      if (a.isa !== isa || a.threads !== threads) throw new Error(`Node gave ${a.isa} on ${a.threads} threads for ${isa} on ${threads}: run it with relaxed SIMD on (scripts/node-relaxed-simd.sh)`);
      node[`${isa} ${threads}`] = a;
    }
  }
  const server = await startServer(ROOT);
  try {
    const engines = await eachEngine(ENGINES, log, async (name, browser) => {
      log(`${name}: ${browser.version}`);
      const page = await browser.open(`${server.url}/tests/browser/harness.html`);
      // The builds this engine gives: relaxed SIMD only where it runs it (else both keys give simd128).
      const instances = await page.run(pageSetUp, BUILDS, THREAD_COUNTS);
      const given = new Map(instances.map(([key, isa, threads]) => [key, { isa, threads }]));
      const builds = BUILDS.filter(([isa]) => given.get(`${isa} 1`).isa === isa);
      for (const [isa] of builds) {
        for (const threads of THREAD_COUNTS) {
          const got = given.get(`${isa} ${threads}`);
          if (got.isa !== isa || got.threads !== threads) throw new Error(`${name} gave ${got.isa} on ${got.threads} threads for ${isa} on ${threads}`);
        }
      }
      const rows = [];
      for (const s of shapes) {
        const x = inputs(s);
        const out = new Float32Array(x.q.data.length);
        for (const [isa] of builds) {
          const key = `${isa} 1`;
          const pageHash = await page.run(pageSetShape, s, key);
          node[key].sdpa(x.q, x.k, x.v, { isCausal: s.causal, out });
          const sameBits = pageHash === bitsHash(out);
          const timing = await alternate(() => timed(() => node[key].sdpa(x.q, x.k, x.v, { isCausal: s.causal, out })),
            () => page.run(pageRunShape, key), settings);
          const row = { kind: 'prefill', label: `(${s.id}) ${describe(s)}`, shape: s.id, isa, threads: 1, sameBits,
            ...timing, pageVsNode: timing.pageMs / timing.nodeMs };
          rows.push(row);
          log(`  ${name.padEnd(7)} ${row.label.padEnd(34)} ${isa.padEnd(13)} 1t  Node ${row.nodeMs.toFixed(2).padStart(8)} ms  ` +
            `${name} ${row.pageMs.toFixed(2).padStart(8)} ms  ÷ Node ${row.pageVsNode.toFixed(2)}×  (${row.runs} runs each${sameBits ? ', outputs bitwise equal' : ', OUTPUTS DIFFER'})`);
        }
      }
      for (const c of DECODE_CASES) {
        const x = decodeInputs(c);
        for (const [isa] of builds) {
          for (const threads of THREAD_COUNTS) {
            const key = `${isa} ${threads}`;
            const cache = node[key].createKVCache({ batch: c.B, kvHeads: c.Hkv, headDim: c.E, maxLength: c.context, dtype: c.dtype });
            try {
              cache.append(x.k, x.v);
              const out = new Float32Array(x.q.data.length);
              const pageHash = await page.run(pageSetCache, c, key);
              cache.attend(x.q, { out });
              const sameBits = pageHash === bitsHash(out);
              const timing = await alternate(() => timed(() => cache.attend(x.q, { out })), () => page.run(pageStep), settings);
              const row = { kind: 'decode', label: `${c.kind} ${c.context} ${c.dtype}`, isa, threads, cacheBytes: cache.byteLength, sameBits,
                ...timing, pageVsNode: timing.pageMs / timing.nodeMs };
              rows.push(row);
              log(`  ${name.padEnd(7)} decode ${row.label.padEnd(27)} ${isa.padEnd(13)} ${threads}t  Node ${row.nodeMs.toFixed(2).padStart(8)} ms  ` +
                `${name} ${row.pageMs.toFixed(2).padStart(8)} ms  ÷ Node ${row.pageVsNode.toFixed(2)}×  (${row.runs} runs each${sameBits ? ', outputs bitwise equal' : ', OUTPUTS DIFFER'})`);
            } finally {
              cache.dispose();
            }
          }
        }
      }
      await page.run(pageTearDown);
      await page.close();
      return { engine: name, version: browser.version, builds: builds.map(([isa]) => isa), rows };
    });
    return { date: new Date().toISOString(), host, node: process.versions.node, quick, settings, engines };
  } finally {
    for (const a of Object.values(node)) a.dispose();
    await server.stop();
  }
}

/**
 * `body(name, browser)` for each [name, launch] of `engines` in turn, its result the engine's
 * entry; a failure is logged and recorded as { engine, failed } (the other engines still run);
 * each browser is closed whatever happened.
 */
export async function eachEngine(engines, log, body) {
  const entries = [];
  for (const [name, launch] of engines) {
    let browser = null;
    try {
      browser = await launch();
      entries.push(await body(name, browser));
    } catch (error) {
      log(`  ${name} FAILED: ${error.message}`);
      entries.push({ engine: name, failed: String(error.message) });
    } finally {
      await browser?.close();
    }
  }
  return entries;
}

// --- standalone ------------------------------------------------------------------------------
if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const argv = process.argv.slice(2);
  const i = argv.indexOf('--json');
  const jsonPath = i >= 0 ? resolve(argv[i + 1]) : DEFAULT_RESULTS_PATH;
  const result = await runEnginesBench({ quick: argv.includes('--quick') });
  writeSection(jsonPath, 'engines', result);  // keeping what the other sections wrote there
}
