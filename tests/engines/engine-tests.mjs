// The tests each engine runs (firefox.test.mjs, webkit.test.mjs), under node:test: the
// browser cases of tests/shared in an engine other than Chromium's, against Node's results.
//
// On the cross-origin isolated server and on the plain one, with relaxedSimd true and false:
//   - the 76 ONNX Attention conformance cases, the float64 reference cases (fully masked rows
//     exact zeros), sdpaBackward, sdpaVarlen and its backward, calls past maxMemoryBytes run in
//     slices, and the KV cache's step-by-step decoding (float32 and float16): every case within
//     its tolerance (the cases Jest and Playwright run);
//   - the build feature detection picks (relaxed SIMD where the engine runs it, else the portable
//     one) and threads exactly where the page can have them (cross-origin isolated and with
//     SharedArrayBuffer);
//   - the portable build's bits equal Node's (wasm SIMD128 arithmetic is deterministic, so two
//     engines must agree); a relaxed build's bits are the same on one thread and on several (the
//     package's promise on one engine); whether they also equal V8's is printed, not asserted
//     (an engine may fuse relaxed_madd or not);
//   - bad input: the sdpa, sdpaVarlen, createKVCache and cache error cases throw the class and
//     message Node's do, and the instance keeps working;
//   - createAttentionWorker bit for bit the direct API; the package imported from another origin
//     (every package file the page fetched from it); the demo page starting without an error.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { CASE_COUNT } from '../shared/onnx-cases.mjs';
import { REFERENCE_CASES } from '../shared/reference-cases.mjs';
import { BACKWARD_CASES } from '../shared/backward-cases.mjs';
import { VARLEN_CASES } from '../shared/varlen-cases.mjs';
import { LIMITED_CASES } from '../shared/limited-cases.mjs';
import { CACHE_CASES } from '../shared/kv-cache-cases.mjs';
import { ROOT, startServer } from '../browser/helpers.mjs';
import { TIMEOUT } from './browsers.mjs';
import { FLOAT16_ARRAY_CASES } from '../shared/float16-array-cases.mjs';
import { FLOAT16_INPUT_CASES } from '../shared/float16-input-cases.mjs';
import { demoState, errorOutcomes, runAllCases, runFloat16ArrayPage, runWorkerCases } from './page-cases.mjs';

/** How many cases each set has. */
export const SETS = {
  onnx: CASE_COUNT, reference: REFERENCE_CASES.length, backward: BACKWARD_CASES.length,
  varlen: VARLEN_CASES.length, limited: LIMITED_CASES.length, cache: CACHE_CASES.length,
};

const ONNX_DIR = join(ROOT, 'tests', 'conformance', 'onnx-attention');
/** page-cases.mjs's `env` in Node. */
export const nodeEnv = {
  load: (path) => import(new URL(`../..${path}`, import.meta.url).href),
  io: {
    readText: (path) => readFile(join(ONNX_DIR, path), 'utf8'),
    readBytes: async (path) => new Uint8Array(await readFile(join(ONNX_DIR, path))),
  },
};

/** Every case of every set within its tolerance, and as many as the set has. */
export function assertAllPass(result, where) {
  for (const [set, count] of Object.entries(SETS)) {
    const cases = result.sets[set];
    assert.equal(cases.length, count, `${where}: ${set} ran ${cases.length} cases, expected ${count}`);
    assert.deepEqual(cases.filter((c) => !c.ok).map((c) => `${c.name}: ${c.detail}`), [], `${where}: ${set} cases failed`);
  }
}

/** Each set's cases as `name hash` lines, for comparing bits. */
export const hashes = (result) => Object.fromEntries(Object.keys(SETS).map((set) => [set, result.sets[set].map((c) => `${c.name} ${c.hash}`)]));

/**
 * Registers the tests for one engine. `launch()` starts its browser (browsers.mjs); `relaxed`
 * says whether the engine runs relaxed SIMD (so that feature detection must pick that build).
 * Returns `shared`, whose `node` (Node's results by isa, one thread) and `servers` the engine's
 * own extra tests may use once `before` has run.
 */
export function engineTests({ launch, relaxed }) {
  const shared = { node: {}, servers: {}, browser: null };
  const ISAS = [['relaxed-simd', true], ['simd128', false]];

  before(async () => {
    assert.ok(existsSync(join(ROOT, 'dist', 'index.js')), 'dist/ is not built: run npm run build first');
    const [isolated, plain, cdn] = await Promise.all([
      startServer(ROOT), startServer(ROOT, { isolation: false }), startServer(ROOT, { isolation: false, cdn: true }),
    ]);
    shared.servers = { isolated, plain, cdn };
    shared.browser = await launch();
    for (const [isa, relaxedSimd] of ISAS) {
      shared.node[isa] = await runAllCases(nodeEnv, relaxedSimd, 1);
      assert.equal(shared.node[isa].isa, isa, 'Node runs these tests with --experimental-wasm-relaxed-simd (scripts/test-browser.sh)');
      assertAllPass(shared.node[isa], `Node, ${isa}`);
    }
  });

  after(async () => {
    await shared.browser?.close();
    await Promise.all(Object.values(shared.servers).map((server) => server.stop()));
  });

  /** Opens the test harness on the isolated or the plain server; checks which it is. */
  async function harness(isolated) {
    const page = await shared.browser.open(`${(isolated ? shared.servers.isolated : shared.servers.plain).url}/tests/browser/harness.html`);
    const where = await page.run(async () => ({ isolated: crossOriginIsolated, sharedMemory: typeof SharedArrayBuffer === 'function' }));
    assert.equal(where.isolated, isolated);
    // Every engine here gives an isolated page SharedArrayBuffer (WebKitGTK through the option
    // browsers.mjs sets, as Safari does by default), so threads are possible exactly there.
    if (isolated) assert.equal(where.sharedMemory, true, 'SharedArrayBuffer on the isolated page');
    return page;
  }

  describe('the correctness cases', () => {
    const results = {};  // `${relaxedSimd} ${isolated}` → runAllCases in the page
    for (const [, relaxedSimd] of ISAS) {
      const isa = relaxed && relaxedSimd ? 'relaxed-simd' : 'simd128';
      for (const isolated of [true, false]) {
        const label = `relaxedSimd: ${relaxedSimd}, ${isolated ? 'cross-origin isolated' : 'not isolated'}`;
        it(`${label}: the ${isa} build; the ONNX, reference, backward, varlen, sliced and KV-cache cases pass`, { timeout: TIMEOUT }, async () => {
          const page = await harness(isolated);
          try {
            const result = await page.run(runAllCases, relaxedSimd);
            results[`${relaxedSimd} ${isolated}`] = result;
            assert.equal(result.isa, isa);
            if (isolated) assert.ok(result.threads > 1, `threads on the isolated page: got ${result.threads}`);
            else assert.equal(result.threads, 1);
            assertAllPass(result, `${shared.browser.name}, ${label}`);
            assert.deepEqual(page.errors, []);
            const same = JSON.stringify(hashes(result)) === JSON.stringify(hashes(shared.node[isa]));
            console.log(`${shared.browser.version}, ${label}: ${result.isa}, ${result.threads} thread(s), ` +
              `${Object.values(result.sets).reduce((n, cases) => n + cases.length, 0)} cases passed; bits ${same ? 'equal to' : 'differ from'} Node's (V8's)`);
          } finally {
            await page.close();
          }
        });
      }
    }

    it('the portable build\'s bits equal Node\'s (SIMD128 is deterministic), on every page', () => {
      const portable = Object.values(results).filter((result) => result.isa === 'simd128');
      assert.equal(portable.length, relaxed ? 2 : 4, 'every portable run finished');
      for (const result of portable) assert.deepEqual(hashes(result), hashes(shared.node.simd128));
    });

    it('each build\'s bits are the same on one thread and on several', () => {
      for (const relaxedSimd of [true, false]) {
        const [isolated, plain] = [results[`${relaxedSimd} true`], results[`${relaxedSimd} false`]];
        assert.ok(isolated && plain, 'both pages\' runs finished');
        assert.deepEqual(hashes(isolated), hashes(plain));
      }
    });
  });

  describe('bad input', () => {
    it('every error case throws the class and message Node\'s does, and the instance keeps working', { timeout: TIMEOUT }, async () => {
      const expected = await errorOutcomes(nodeEnv);
      assert.ok(expected.outcomes.length >= 100, `${expected.outcomes.length} error cases`);
      assert.deepEqual(expected.outcomes.filter(([, , , matches]) => !matches), [], 'Node: each case\'s class and message');
      assert.equal(expected.stillWorks, true);
      const page = await harness(false);
      try {
        const got = await page.run(errorOutcomes);
        assert.deepEqual(got.outcomes, expected.outcomes);
        assert.equal(got.stillWorks, true);
        assert.deepEqual(page.errors, []);
        console.log(`${shared.browser.version}: ${got.outcomes.length} bad-input cases, each Node's class and message`);
      } finally {
        await page.close();
      }
    });
  });

  describe('Float16Array', () => {
    it('appends to float16, float32 and bfloat16 caches store what they should, inputs give the bits of Float32Array ones; the worker (copied, moved) gives the direct API\'s bits', { timeout: TIMEOUT }, async () => {
      const page = await harness(false);
      try {
        const result = await page.run(runFloat16ArrayPage);
        assert.equal(result.hasFloat16Array, true, `${shared.browser.version} has Float16Array`);
        for (const run of ['direct', 'worker', 'moved']) {
          // + every pattern (3 dtypes), 3 refusals and the call after them; + saved from a Float16Array forward
          assert.equal(result[run].length, FLOAT16_ARRAY_CASES.length + 7 + FLOAT16_INPUT_CASES.length + 1, `${run}: every case ran`);
          assert.deepEqual(result[run].filter((c) => !c.ok).map((c) => `${c.name}: ${c.detail}`), [], `${run}: cases failed`);
          assert.deepEqual(result[run].map((c) => `${c.name} ${c.hash}`), result.direct.map((c) => `${c.name} ${c.hash}`));
        }
        assert.deepEqual(page.errors, []);
        console.log(`${shared.browser.version}: ${result.direct.length} Float16Array cases (appends and inputs), direct and through the worker (copied and moved), the same bits`);
      } finally {
        await page.close();
      }
    });
  });

  describe('createAttentionWorker, loading, the demo', () => {
    for (const isolated of [true, false]) {
      for (const fromCdn of [false, true]) {
        const label = `${isolated ? 'cross-origin isolated' : 'not isolated'}, the package from ${fromCdn ? 'another origin' : 'the page\'s'}`;
        it(`${label}: the worker gives the direct API's bits`, { timeout: TIMEOUT }, async () => {
          const page = await harness(isolated);
          try {
            const from = fromCdn ? shared.servers.cdn.url : '';
            const result = await page.run(runWorkerCases, from);
            assert.deepEqual(result.failed, []);
            assert.equal(result.isa, relaxed ? 'relaxed-simd' : 'simd128');
            if (isolated) assert.ok(result.threads > 1 && result.directThreads > 1, `threads ${result.threads}, ${result.directThreads}`);
            else assert.deepEqual([result.threads, result.directThreads], [1, 1]);
            assert.deepEqual(result.worker, result.direct);
            assert.deepEqual(page.errors, []);
            // The package's files the page fetched (the modules, the direct API's .wasm) came from `from`.
            const origin = new URL(from || shared.servers[isolated ? 'isolated' : 'plain'].url).origin;
            assert.ok(result.resources.some((url) => url.endsWith('.wasm')), `a .wasm among ${result.resources}`);
            assert.deepEqual(result.resources.filter((url) => new URL(url).origin !== origin), []);
          } finally {
            await page.close();
          }
        });
      }
    }

    // The worker from another origin starts through a loader script that imports it (js/cross-origin.ts);
    // a worker script that cannot be loaded must reject the call, naming why, not leave it waiting.
    it('from another origin, a worker script that cannot be loaded: createAttentionWorker rejects (no hang); the direct API works', { timeout: TIMEOUT }, async () => {
      const root = mkdtempSync(join(tmpdir(), 'sdpa-engines-'));
      cpSync(join(ROOT, 'dist'), join(root, 'dist'), { recursive: true });
      rmSync(join(root, 'dist', 'worker-entry.js'));
      const broken = await startServer(root, { isolation: false, cdn: true });
      const page = await harness(true);
      try {
        const outcome = await page.run(async (env, from) => {
          const { workerLoadFailure } = await env.load('/tests/shared/worker-load-failure.mjs');
          return workerLoadFailure(from);
        }, broken.url);
        assert.equal(outcome.worker.name, 'Error', JSON.stringify(outcome));
        assert.match(outcome.worker.message, /^sdpa-wasm: the attention worker failed: \S/);
        assert.equal(outcome.directWorks, true);
        console.log(`${shared.browser.version}: ${outcome.worker.message}`);
      } finally {
        await page.close();
        await broken.stop();
        rmSync(root, { recursive: true, force: true });
      }
    });

    // A pool worker imports the glue itself, where a failure fired no 'error' at the Worker and the
    // load waited forever (scripts/patch-pool-worker.mjs makes it one). The package from another
    // origin whose pool workers cannot import its glue (the page's own import of it goes through):
    // the load rejects, naming the pool.
    it('from another origin, a pool worker that cannot import the glue: createAttention rejects naming it (no hang)', { timeout: TIMEOUT }, async () => {
      const root = mkdtempSync(join(tmpdir(), 'sdpa-engines-'));
      cpSync(join(ROOT, 'dist'), join(root, 'dist'), { recursive: true });
      for (const build of ['sdpa-mt', 'sdpa-mt-relaxed']) {
        const file = join(root, 'dist', 'wasm', `${build}.worker.js`);
        const text = readFileSync(file, 'utf8');
        assert.equal(text.split('import(e.data.urlOrBlob)').length, 2, `${file}: one import of the glue`);
        writeFileSync(file, text.replace('import(e.data.urlOrBlob)', 'import(e.data.urlOrBlob+"-missing")'));
      }
      const broken = await startServer(root, { isolation: false, cdn: true });
      const page = await harness(true);
      try {
        const outcome = await page.run(async (env, from) => {
          const { createAttention } = await import(`${from}/dist/index.js`);
          return Promise.race([
            createAttention({ threads: 2 }).then((attn) => ({ loaded: attn.threads }), (error) => ({ name: error.constructor.name, message: error.message })),
            new Promise((resolve) => setTimeout(() => resolve({ hung: true }), 30_000)),
          ]);
        }, broken.url);
        assert.equal(outcome.name, 'Error', JSON.stringify(outcome));
        assert.match(outcome.message, /^sdpa-wasm: could not load its WebAssembly build from \S+\.wasm: Error: a worker of its thread pool failed: \S/);
        console.log(`${shared.browser.version}: ${outcome.message}`);
      } finally {
        await page.close();
        await broken.stop();
        rmSync(root, { recursive: true, force: true });
      }
    });

    it('the demo page starts with no error', { timeout: TIMEOUT }, async () => {
      const page = await shared.browser.open(`${shared.servers.isolated.url}/web/`);
      try {
        const state = await page.run(demoState, 120_000);
        assert.equal(state.error, null);
        assert.equal(state.ready, true);
        assert.ok(state.version.heatmap > 0, `the heatmap was computed: ${JSON.stringify(state.version)}`);
        assert.deepEqual(page.errors, []);
      } finally {
        await page.close();
      }
    });
  });

  return shared;
}
