// Float16Array inputs in the engines that have Float16Array (Chromium, Firefox, WebKit; not
// Node 20): what a call given Float16Array data costs beside the same call given the same
// values as Float32Array. A typed array's set() from a Float16Array widens element by element,
// so the package copies a long one in as raw halves and widens it in wasm memory
// (js/memory.ts, writeFloats). Per engine, on a cross-origin isolated page (finer timers), one
// thread, the build the engine picks:
//   - the engine's own copies: set() of 16 Mi elements into a Float32Array from a Float32Array
//     and from a Float16Array (what the element-wise widening costs there);
//   - sdpa() on shapes (d) (a decode: K/V 64 MiB as float32, streamed segment by segment) and (b)
//     (a prefill), given Float32Array and Float16Array inputs holding the same values (halves),
//     timed alternately round by round after warm-up, medians; both outputs must be bitwise
//     equal; beside them, the element-wise set() of the same Float16Array inputs into a
//     Float32Array (what the call's copies took before they were made in wasm).
// Reported, no target: the Float16Array call ÷ the Float32Array call.
//   node bench/float16-inputs.mjs [--quick] [--json PATH]
import { chromium } from '@playwright/test';
import { ROOT, startServer } from '../tests/browser/helpers.mjs';
import { launchFirefox, launchWebKit } from '../tests/engines/browsers.mjs';
import { eachEngine } from './engines.mjs';
import { describeHostCpu, hostCpu } from './host.mjs';
import { runStandalone } from './results-file.mjs';
import { describe, SHAPES } from './shapes.mjs';

export const FLOAT16_SHAPE_IDS = ['d', 'b'];
/** Elements of the engine's own copy probe. */
const COPY_ELEMENTS = 16 * 2 ** 20;

/** Chromium (Debian's, through Playwright) behind the interface of tests/engines/browsers.mjs: open(url), run(fn, ...args). */
async function launchChromium() {
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM_PATH ?? '/usr/bin/chromium' });
  return {
    name: 'Chromium',
    version: `chromium/${browser.version()}`,
    async open(url) {
      const page = await browser.newPage();
      await page.goto(url);
      return {
        run: (fn, ...args) => page.evaluate(([source, given]) => {
          const env = { load: (path) => import(path) };
          // eslint-disable-next-line no-new-func
          return new Function(`return (${source})`)()(env, ...given);
        }, [fn.toString(), args]),
        close: () => page.close(),
      };
    },
    close: () => browser.close(),
  };
}

const ENGINES = [['Chromium', launchChromium], ['Firefox', launchFirefox], ['WebKit', launchWebKit]];

// --- in the page (its source is sent there: self-contained; env: tests/engines/browsers.mjs) ---

async function pageFloat16Bench(env, shapes, settings, copyElements) {
  const { createAttention } = await env.load('/dist/index.js');
  const { noiseTensor } = await env.load('/web/seeded.mjs');
  const { bitsHash } = await env.load('/tests/shared/reference-cases.mjs');
  if (!crossOriginIsolated) throw new Error('the benchmark page is not cross-origin isolated');
  if (typeof Float16Array !== 'function') throw new Error('this engine has no Float16Array');
  const median = (xs) => {
    const s = [...xs].sort((a, b) => a - b);
    return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
  };
  const timed = (f) => {
    const t0 = performance.now();
    f();
    return performance.now() - t0;
  };
  /** Medians of the functions in `runs` (name → f), timed in turn round by round after warm-up. */
  const alternate = (runs) => {
    const names = Object.keys(runs), times = Object.fromEntries(names.map((n) => [n, []]));
    for (let w = 0; w < settings.warmups; w++) for (const n of names) runs[n]();
    const start = performance.now();
    while (times[names[0]].length < settings.minRuns || performance.now() - start < settings.minSeconds * 1000) {
      for (const n of names) times[n].push(timed(runs[n]));
      if (times[names[0]].length >= 200) break;
    }
    return { runs: times[names[0]].length, ...Object.fromEntries(names.map((n) => [n, median(times[n])])) };
  };

  // The engine's own copies.
  const floats = new Float32Array(copyElements);
  for (let i = 0; i < copyElements; i++) floats[i] = ((Math.imul(i, 0x9E3779B1) >>> 0) / 2 ** 32 - 0.5) * 8;
  const halves = new Float16Array(floats);
  const into = new Float32Array(copyElements);
  const copy = alternate({ float32Ms: () => into.set(floats), float16Ms: () => into.set(halves) });

  const attn = await createAttention({ threads: 1 });
  const rows = [];
  try {
    for (const s of shapes) {
      const halvesOf = (dims, stream) => new Float16Array(noiseTensor(dims, 7, stream).data);
      const h = { q: halvesOf([s.B, s.H, s.Lq, s.E], 1), k: halvesOf([s.B, s.Hkv, s.Lk, s.E], 2), v: halvesOf([s.B, s.Hkv, s.Lk, s.E], 3) };
      const f = { q: new Float32Array(h.q), k: new Float32Array(h.k), v: new Float32Array(h.v) };
      const dims = { q: [s.B, s.H, s.Lq, s.E], k: [s.B, s.Hkv, s.Lk, s.E], v: [s.B, s.Hkv, s.Lk, s.E] };
      const outs = { float32: new Float32Array(h.q.length), float16: new Float32Array(h.q.length) };
      const call = (data, out) => attn.sdpa({ data: data.q, dims: dims.q }, { data: data.k, dims: dims.k },
        { data: data.v, dims: dims.v }, { isCausal: s.causal, out });
      call(f, outs.float32);
      call(h, outs.float16);
      const sameBits = bitsHash(outs.float32) === bitsHash(outs.float16);
      const scratch = new Float32Array(Math.max(h.q.length, h.k.length, h.v.length));
      const timing = alternate({
        float32Ms: () => call(f, outs.float32),
        float16Ms: () => call(h, outs.float16),
        elementwiseSetMs: () => { scratch.set(h.q); scratch.set(h.k); scratch.set(h.v); },
      });
      rows.push({ shape: s.id, sameBits, elements: h.q.length + h.k.length + h.v.length, ...timing });
    }
  } finally {
    attn.dispose();
  }
  return { isa: attn.isa, copy, rows };
}

// --- in Node ---------------------------------------------------------------------------------

export async function runFloat16InputsBench({ quick = false, log = console.log } = {}) {
  const settings = quick ? { warmups: 2, minRuns: 5, minSeconds: 1 } : { warmups: 3, minRuns: 15, minSeconds: 4 };
  const host = hostCpu();
  const shapes = FLOAT16_SHAPE_IDS.map((id) => SHAPES.find((s) => s.id === id));
  log('');
  log(`Float16Array inputs in the browsers: sdpa() given Float16Array against the same values as Float32Array, one thread; ` +
    `shapes ${shapes.map((s) => `(${s.id}) ${describe(s)}`).join(', ')}; and each engine's set() of ${COPY_ELEMENTS / 2 ** 20} Mi elements`);
  log(`host: ${describeHostCpu(host)}`);
  const server = await startServer(ROOT);
  try {
    const engines = await eachEngine(ENGINES, log, async (name, browser) => {
      const page = await browser.open(`${server.url}/tests/browser/harness.html`);
      const result = await page.run(pageFloat16Bench, shapes, settings, COPY_ELEMENTS);
      await page.close();
      const { copy } = result;
      log(`  ${name} (${browser.version}, ${result.isa}): set() of ${COPY_ELEMENTS / 2 ** 20} Mi elements into a Float32Array ` +
        `from a Float32Array ${copy.float32Ms.toFixed(2)} ms, from a Float16Array ${copy.float16Ms.toFixed(2)} ms ` +
        `(${(copy.float16Ms / copy.float32Ms).toFixed(1)}×)`);
      const rows = result.rows.map((r) => ({ ...r, label: `(${r.shape}) ${describe(shapes.find((s) => s.id === r.shape))}`, float16VsFloat32: r.float16Ms / r.float32Ms }));
      for (const r of rows) {
        log(`    ${r.label.padEnd(28)} Float32Array ${r.float32Ms.toFixed(2).padStart(7)} ms  Float16Array ${r.float16Ms.toFixed(2).padStart(7)} ms  ` +
          `(${r.float16VsFloat32.toFixed(2)}×)  the element-wise set() of its Float16Array inputs ${r.elementwiseSetMs.toFixed(2)} ms  ` +
          `(${r.runs} runs each${r.sameBits ? ', outputs bitwise equal' : ', OUTPUTS DIFFER'})`);
      }
      return { engine: name, version: browser.version, isa: result.isa, copy, rows };
    });
    return { date: new Date().toISOString(), host, quick, settings, copyElements: COPY_ELEMENTS, engines };
  } finally {
    await server.stop();
  }
}

await runStandalone(import.meta.url, 'float16Inputs', (has) => runFloat16InputsBench({ quick: has('--quick') }));
