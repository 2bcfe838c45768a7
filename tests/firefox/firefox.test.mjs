// The browser cases in Firefox: Gecko and SpiderMonkey, a second engine beside the Chromium
// (Blink and V8) of tests/browser. Playwright drives only its own patched Firefox, a download
// (and its WebDriver BiDi mode needs commands Firefox ESR lacks), so this file drives Debian's
// firefox-esr (scripts/setup-firefox.sh installs it) through WebDriver BiDi with puppeteer-core,
// under Node's own test runner (node:test). scripts/test-browser.sh runs it after Playwright.
//
// On the cross-origin isolated server (the threaded build, SharedArrayBuffer memory) and on the
// plain one (one thread), for both builds (relaxed SIMD, which Firefox runs, and the portable one,
// relaxedSimd: false):
//   - the 76 ONNX Attention conformance cases, the float64 reference cases (fully masked rows
//     exact zeros), sdpaBackward, sdpaVarlen and its backward, calls past maxMemoryBytes run in
//     slices, and the KV cache's step-by-step decoding (float32 and float16): every case within
//     its tolerance (tests/shared/*-cases.mjs, the same cases Jest and Playwright run);
//   - the portable build's bits equal Node's (wasm SIMD128 arithmetic is deterministic, so two
//     engines must agree); the relaxed build's bits equal across thread counts in Firefox (the
//     package's promise: one engine, any thread count); whether they also equal V8's is printed
//     (an engine may fuse relaxed_madd or not, so that is not promised);
//   - bad input: the sdpa, sdpaVarlen, createKVCache and cache error cases throw the error class
//     and message Node's do, and the instance keeps working.
// Then createAttentionWorker (a module worker, with nested pthread workers on the isolated page)
// bit for bit the direct API; the package imported from another origin (direct API and worker,
// every package file from that origin); Firefox with relaxed SIMD turned off (the pref
// javascript.options.wasm_relaxed_simd), where feature detection must pick the portable build;
// and the demo page starting with no error.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import puppeteer from 'puppeteer-core';
import { CASE_COUNT, checkCase, loadCase, loadIndex } from '../shared/onnx-cases.mjs';
import { bitsHash, REFERENCE_CASES, runReferenceCases } from '../shared/reference-cases.mjs';
import { BACKWARD_CASES, runBackwardCases } from '../shared/backward-cases.mjs';
import { runVarlenCases, VARLEN_CASES } from '../shared/varlen-cases.mjs';
import { LIMITED_CASES, runLimitedCases } from '../shared/limited-cases.mjs';
import { CACHE_CASES, runCacheCases } from '../shared/kv-cache-cases.mjs';
import { errorOutcomes } from './error-outcomes.mjs';
import { nodePackage, ROOT, startServer } from '../browser/helpers.mjs';

const FIREFOX = process.env.FIREFOX_PATH ?? '/usr/bin/firefox-esr';
const ONNX_DIR = join(ROOT, 'tests', 'conformance', 'onnx-attention');
const ISAS = [['relaxed-simd', true], ['simd128', false]];
const TIMEOUT = 600_000;  // per test; a hung page fails it rather than the whole run

/** What each case set gives in one environment: [{ name, ok, hash }] per set. */
const SETS = {
  onnx: CASE_COUNT, reference: REFERENCE_CASES.length, backward: BACKWARD_CASES.length,
  varlen: VARLEN_CASES.length, limited: LIMITED_CASES.length, cache: CACHE_CASES.length,
};

// The cases, run in Node (in this process) or in a page (this function's source is sent to the
// page): `io` reads the conformance files, `load` imports a module by its path from the
// repository's root. Returns { isa, threads, sets: { onnx: [{ name, ok, hash, detail }], ... } }.
async function runAllCases(load, io, relaxedSimd, threads) {
  const { createAttention } = await load('/dist/index.js');
  const onnx = await load('/tests/shared/onnx-cases.mjs');
  const { bitsHash, runReferenceCases } = await load('/tests/shared/reference-cases.mjs');
  const { runBackwardCases } = await load('/tests/shared/backward-cases.mjs');
  const { runVarlenCases } = await load('/tests/shared/varlen-cases.mjs');
  const { runLimitedCases } = await load('/tests/shared/limited-cases.mjs');
  const { runCacheCases } = await load('/tests/shared/kv-cache-cases.mjs');
  const options = { relaxedSimd, ...(threads === undefined ? {} : { threads }) };
  const attn = await createAttention(options);
  const sets = {};
  try {
    const index = await onnx.loadIndex(io);
    sets.onnx = [];
    for (const entry of index.cases) {
      try {
        const { failures, output } = onnx.checkCase(attn, await onnx.loadCase(io, entry.dir));
        sets.onnx.push({ name: entry.name, ok: failures.length === 0, hash: output ? bitsHash(output) : null, detail: failures.join('; ') });
      } catch (error) {
        sets.onnx.push({ name: entry.name, ok: false, hash: null, detail: `threw ${error}` });
      }
    }
    const keep = (cases) => cases.map((c) => ({ name: c.name, ok: c.ok, hash: c.hash, detail: JSON.stringify(c) }));
    sets.reference = keep(await runReferenceCases(attn));
    sets.backward = keep(await runBackwardCases(attn));
    sets.varlen = keep(await runVarlenCases(attn));
    sets.cache = keep(await runCacheCases(attn));
    sets.limited = (await runLimitedCases(createAttention, options)).map((c) => ({
      name: c.name, ok: c.same && c.withinLimit && c.limited, hash: c.hash, detail: JSON.stringify(c),
    }));
    return { isa: attn.isa, threads: attn.threads, sets };
  } finally {
    attn.dispose();
  }
}

// In a page: the same cases through createAttentionWorker, and through the direct API of the
// same build for comparison. Returns { threads, isa, worker: hashes, direct: hashes, failed }.
async function runWorkerCases(from) {
  const { createAttention, createAttentionWorker } = await import(`${from}/dist/index.js`);
  const { runReferenceCases } = await import('/tests/shared/reference-cases.mjs');
  const { runCacheCases } = await import('/tests/shared/kv-cache-cases.mjs');
  const run = async (instance) => [...await runReferenceCases(instance), ...await runCacheCases(instance)];
  const worker = await createAttentionWorker();
  let viaWorker;
  try {
    viaWorker = { cases: await run(worker), threads: worker.threads, isa: worker.isa };
  } finally {
    await worker.dispose();
  }
  const attn = await createAttention();
  try {
    const direct = await run(attn);
    return {
      threads: viaWorker.threads, isa: viaWorker.isa, directThreads: attn.threads,
      failed: [...viaWorker.cases, ...direct].filter((c) => !c.ok).map((c) => c.name),
      worker: viaWorker.cases.map((c) => `${c.name} ${c.hash}`), direct: direct.map((c) => `${c.name} ${c.hash}`),
    };
  } finally {
    attn.dispose();
  }
}

const nodeIo = {
  readText: (path) => readFile(join(ONNX_DIR, path), 'utf8'),
  readBytes: async (path) => new Uint8Array(await readFile(join(ONNX_DIR, path))),
};
const nodeLoad = (path) => import(new URL(`../..${path}`, import.meta.url).href);

/** The cases in a page at `base`, as runAllCases returns them. */
async function pageCases(page, relaxedSimd) {
  return page.evaluate(async (source, relaxedSimd) => {
    const root = '/tests/conformance/onnx-attention/';
    const get = async (path) => {
      const response = await fetch(root + path);
      if (!response.ok) throw new Error(`GET ${root}${path}: ${response.status}`);
      return response;
    };
    const io = {
      readText: async (path) => (await get(path)).text(),
      readBytes: async (path) => new Uint8Array(await (await get(path)).arrayBuffer()),
    };
    // eslint-disable-next-line no-new-func
    const run = new Function(`return (${source})`)();
    return run((path) => import(path), io, relaxedSimd);
  }, runAllCases.toString(), relaxedSimd);
}

/** Every case of every set within its tolerance, and as many as the set has. */
function assertAllPass(result, where) {
  for (const [set, count] of Object.entries(SETS)) {
    const cases = result.sets[set];
    assert.equal(cases.length, count, `${where}: ${set} ran ${cases.length} cases, expected ${count}`);
    assert.deepEqual(cases.filter((c) => !c.ok).map((c) => `${c.name}: ${c.detail}`), [], `${where}: ${set} cases failed`);
  }
}

const hashes = (result) => Object.fromEntries(Object.keys(SETS).map((set) => [set, result.sets[set].map((c) => `${c.name} ${c.hash}`)]));

let browser, isolatedServer, plainServer, cdnServer;
const node = {};  // by isa: Node's results on one thread

async function openHarness(base, { isolated } = {}) {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (error) => errors.push(`pageerror: ${error.message}`));
  await page.goto(`${base}/tests/browser/harness.html`);
  if (isolated !== undefined) assert.equal(await page.evaluate(() => crossOriginIsolated), isolated);
  return { page, errors };
}

before(async () => {
  assert.ok(existsSync(join(ROOT, 'dist', 'index.js')), 'dist/ is not built: run npm run build first');
  assert.ok(existsSync(FIREFOX), `${FIREFOX} is missing: bash scripts/setup-firefox.sh installs firefox-esr`);
  [isolatedServer, plainServer, cdnServer] = await Promise.all([
    startServer(ROOT), startServer(ROOT, { isolation: false }), startServer(ROOT, { isolation: false, cdn: true }),
  ]);
  browser = await puppeteer.launch({ browser: 'firefox', executablePath: FIREFOX, headless: true, protocolTimeout: TIMEOUT });
  for (const [isa, relaxedSimd] of ISAS) {
    node[isa] = await runAllCases(nodeLoad, nodeIo, relaxedSimd, 1);
    assert.equal(node[isa].isa, isa, 'Node runs this file with --experimental-wasm-relaxed-simd (scripts/test-browser.sh)');
    assertAllPass(node[isa], `Node, ${isa}`);
  }
});

after(async () => {
  await browser?.close();
  await Promise.all([isolatedServer, plainServer, cdnServer].map((server) => server?.stop()));
});

describe('Firefox: the correctness cases on both builds', () => {
  const firefox = {};  // `${isa} ${isolated}` → results
  for (const [isa, relaxedSimd] of ISAS) {
    for (const isolated of [true, false]) {
      const label = `${isa}, ${isolated ? 'cross-origin isolated' : 'not isolated'}`;
      it(`${label}: the ONNX, reference, backward, varlen, sliced and KV-cache cases pass`, { timeout: TIMEOUT }, async () => {
        const { page, errors } = await openHarness(isolated ? isolatedServer.url : plainServer.url, { isolated });
        try {
          const result = await pageCases(page, relaxedSimd);
          firefox[`${isa} ${isolated}`] = result;
          assert.equal(result.isa, isa);
          if (isolated) assert.ok(result.threads > 1, `the isolated page runs the threaded build, got ${result.threads} thread(s)`);
          else assert.equal(result.threads, 1);
          assertAllPass(result, `Firefox, ${label}`);
          assert.deepEqual(errors, []);
          const same = JSON.stringify(hashes(result)) === JSON.stringify(hashes(node[isa]));
          console.log(`${await browser.version()}, ${label}, ${result.threads} thread(s): ` +
            `${Object.values(result.sets).reduce((n, cases) => n + cases.length, 0)} cases passed; ` +
            `bits ${same ? 'equal to' : 'differ from'} Node's (V8's)`);
        } finally {
          await page.close();
        }
      });
    }
  }

  it('the portable build\'s bits equal Node\'s (SIMD128 is deterministic), on one thread and on several', () => {
    for (const isolated of [true, false]) {
      const result = firefox[`simd128 ${isolated}`];
      assert.ok(result, 'the portable build\'s cases ran');
      assert.deepEqual(hashes(result), hashes(node.simd128));
    }
  });

  it('the relaxed build\'s bits are the same on one thread and on several', () => {
    const [many, one] = [firefox['relaxed-simd true'], firefox['relaxed-simd false']];
    assert.ok(many && one, 'the relaxed build\'s cases ran');
    assert.deepEqual(hashes(many), hashes(one));
  });
});

describe('Firefox: bad input', () => {
  it('every error case throws the class and message Node\'s does, and the instance keeps working', { timeout: TIMEOUT }, async () => {
    const expected = await errorOutcomes(nodeLoad);
    const { page, errors } = await openHarness(plainServer.url);
    try {
      const got = await page.evaluate(async (source) => {
        // eslint-disable-next-line no-new-func
        const outcomes = new Function(`return (${source})`)();
        return outcomes((path) => import(path));
      }, errorOutcomes.toString());
      assert.ok(expected.outcomes.length >= 100, `${expected.outcomes.length} error cases`);
      assert.deepEqual(expected.outcomes.filter(([, , , matches]) => !matches), [], 'Node: each case\'s class and message');
      assert.equal(expected.stillWorks, true);
      assert.deepEqual(got.outcomes, expected.outcomes);
      assert.equal(got.stillWorks, true);
      assert.deepEqual(errors, []);
      console.log(`${await browser.version()}: ${got.outcomes.length} bad-input cases, each Node's class and message`);
    } finally {
      await page.close();
    }
  });
});

describe('Firefox: createAttentionWorker and loading', () => {
  for (const isolated of [true, false]) {
    it(`${isolated ? 'cross-origin isolated' : 'not isolated'}: the worker gives the direct API's bits`, { timeout: TIMEOUT }, async () => {
      const { page, errors } = await openHarness(isolated ? isolatedServer.url : plainServer.url, { isolated });
      try {
        const result = await page.evaluate(runWorkerCases, '');
        assert.deepEqual(result.failed, []);
        assert.equal(result.isa, 'relaxed-simd');
        if (isolated) assert.ok(result.threads > 1 && result.directThreads > 1, `threads ${result.threads}, ${result.directThreads}`);
        else assert.equal(result.threads, 1);
        assert.deepEqual(result.worker, result.direct);
        assert.deepEqual(errors, []);
      } finally {
        await page.close();
      }
    });
  }

  for (const isolated of [true, false]) {
    it(`imported from another origin (${isolated ? 'cross-origin isolated' : 'not isolated'}): direct API and worker, every package file from that origin`, { timeout: TIMEOUT }, async () => {
      const { page, errors } = await openHarness(isolated ? isolatedServer.url : plainServer.url, { isolated });
      const requests = [];
      page.on('request', (request) => {
        const url = new URL(request.url());
        if (url.pathname.startsWith('/dist/')) requests.push(url);
      });
      try {
        const result = await page.evaluate(runWorkerCases, cdnServer.url);
        assert.deepEqual(result.failed, []);
        if (isolated) assert.ok(result.threads > 1, `threads ${result.threads}`);
        assert.deepEqual(result.worker, result.direct);
        assert.deepEqual(errors, []);
        const cdnOrigin = new URL(cdnServer.url).origin;
        assert.ok(requests.length > 0, 'the page\'s requests were seen');
        assert.deepEqual(requests.filter((url) => url.origin !== cdnOrigin).map(String), []);
        assert.ok(requests.some((url) => url.pathname.endsWith('.wasm')), 'a .wasm came from the other origin');
      } finally {
        await page.close();
      }
    });
  }

  it('the demo page starts with no error', { timeout: TIMEOUT }, async () => {
    const page = await browser.newPage();
    const errors = [];
    page.on('pageerror', (error) => errors.push(`pageerror: ${error.message}`));
    page.on('console', (message) => { if (message.type() === 'error') errors.push(`console: ${message.text()}`); });
    try {
      await page.goto(`${isolatedServer.url}/web/`);
      await page.waitForFunction(() => window.__demo?.ready === true || window.__demo?.error != null, { timeout: 120_000 });
      const state = await page.evaluate(() => ({ error: window.__demo.error ?? null, version: { ...window.__demo.version } }));
      assert.equal(state.error, null);
      assert.ok(state.version.heatmap > 0, `the heatmap was computed: ${JSON.stringify(state.version)}`);
      assert.deepEqual(errors, []);
    } finally {
      await page.close();
    }
  });
});

describe('Firefox with relaxed SIMD turned off', () => {
  it('feature detection picks the portable build, whose bits equal Node\'s', { timeout: TIMEOUT }, async () => {
    const plainFirefox = await puppeteer.launch({
      browser: 'firefox', executablePath: FIREFOX, headless: true, protocolTimeout: TIMEOUT,
      extraPrefsFirefox: { 'javascript.options.wasm_relaxed_simd': false },
    });
    try {
      const page = await plainFirefox.newPage();
      await page.goto(`${isolatedServer.url}/tests/browser/harness.html`);
      const result = await pageCases(page, true);  // relaxedSimd: true asks for the relaxed build
      assert.equal(result.isa, 'simd128');
      assert.ok(result.threads > 1);
      assertAllPass(result, 'Firefox without relaxed SIMD');
      assert.deepEqual(hashes(result), hashes(node.simd128));
    } finally {
      await plainFirefox.close();
    }
  });
});
