// The Jest suite's correctness cases, run inside Chromium: the 76 ONNX Attention conformance
// cases (same adapter and tolerances, tests/shared/onnx-cases.mjs) and the float64 reference
// comparisons (tests/shared/reference-cases.mjs over tests/node/reference.mjs), on the cross-origin
// isolated server (threaded build where available) and on the plain one (single thread).
// Also the backward pass (tests/shared/backward-cases.mjs) against the float64 analytic backward,
// and packed variable-length sequences (tests/shared/varlen-cases.mjs, sdpaVarlen and its backward),
// and calls past maxMemoryBytes run in slices (tests/shared/limited-cases.mjs).
// Both builds: relaxed SIMD (Chromium's default) and the portable one (relaxedSimd: false).
// Node runs the same cases in this process on the same build (scripts/test-browser.sh runs
// Playwright with relaxed SIMD on): the browser's output bits must equal Node's.
import { test, expect } from '@playwright/test';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { CASE_COUNT, checkCase, loadCase, loadIndex } from '../shared/onnx-cases.mjs';
import { bitsHash, REFERENCE_CASES, runReferenceCases } from '../shared/reference-cases.mjs';
import { BACKWARD_CASES, runBackwardCases } from '../shared/backward-cases.mjs';
import { runVarlenCases, VARLEN_CASES } from '../shared/varlen-cases.mjs';
import { LIMITED_CASES, runLimitedCases } from '../shared/limited-cases.mjs';
import { FLOAT16_INPUT_CASES } from '../shared/float16-input-cases.mjs';
import { ISOLATED, PLAIN, ROOT, nodePackage } from './helpers.mjs';

const ONNX_DIR = join(ROOT, 'tests', 'conformance', 'onnx-attention');

const ISAS = [['relaxed-simd', true], ['simd128', false]];
const nodeOnnx = {};       // by isa: [{ name, failures, hash }] computed in Node
const nodeReference = {};  // by isa: [{ name, ok, hash, ... }]
const nodeBackward = {};   // by isa: [{ name, errors, ok, hash }]
const nodeVarlen = {};     // by isa: [{ name, errors, ok, hash }]
const nodeLimited = {};    // by isa: [{ name, same, withinLimit, limited, hash }]

test.beforeAll(async () => {
  const { createAttention } = await nodePackage();
  for (const [isa, relaxedSimd] of ISAS) {
    await nodeCases(await createAttention({ threads: 1, relaxedSimd }), isa);
    nodeLimited[isa] = await runLimitedCases(createAttention, { threads: 1, relaxedSimd });
  }
});

async function nodeCases(attn, isa) {
  expect(attn.isa).toBe(isa);
  const io = {
    readText: (path) => readFile(join(ONNX_DIR, path), 'utf8'),
    readBytes: async (path) => new Uint8Array(await readFile(join(ONNX_DIR, path))),
  };
  const index = await loadIndex(io);
  nodeOnnx[isa] = [];
  for (const entry of index.cases) {
    const { failures, output } = checkCase(attn, await loadCase(io, entry.dir));
    nodeOnnx[isa].push({ name: entry.name, failures, hash: bitsHash(output) });
  }
  nodeReference[isa] = await runReferenceCases(attn);
  nodeBackward[isa] = await runBackwardCases(attn);
  nodeVarlen[isa] = await runVarlenCases(attn);
  attn.dispose();
}

for (const [label, base, isolated] of [['cross-origin isolated', ISOLATED, true], ['not isolated', PLAIN, false]]) for (const [isa, relaxedSimd] of ISAS) {
  test.describe(`in Chromium, ${label}, ${isa}`, () => {
    test.beforeEach(async ({ page }) => {
      await page.goto(`${base}/tests/browser/harness.html`);
      expect(await page.evaluate(() => crossOriginIsolated)).toBe(isolated);
    });

    test('the 76 ONNX Attention conformance cases pass, bit-identical to Node', async ({ page }) => {
      const result = await page.evaluate(async (relaxedSimd) => {
        const { createAttention } = await import('/dist/index.js');
        const onnx = await import('/tests/shared/onnx-cases.mjs');
        const { bitsHash } = await import('/tests/shared/reference-cases.mjs');
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
        const index = await onnx.loadIndex(io);
        const attn = await createAttention({ relaxedSimd });
        // Fetch every case at once, then run them one by one.
        const loaded = await Promise.all(index.cases.map((entry) => onnx.loadCase(io, entry.dir).catch((error) => error)));
        const cases = [];
        for (const [k, entry] of index.cases.entries()) {
          try {
            if (loaded[k] instanceof Error) throw loaded[k];
            const { failures, output } = onnx.checkCase(attn, loaded[k]);
            cases.push({ name: entry.name, failures, hash: output ? bitsHash(output) : null });
          } catch (error) {
            cases.push({ name: entry.name, failures: [`threw ${error}`], hash: null });
          }
        }
        const { threads, isa } = attn;
        attn.dispose();
        return { count: index.count, cases, threads, isa };
      }, relaxedSimd);
      expect(result.isa).toBe(isa);  // Chromium runs relaxed SIMD; relaxedSimd: false forces the portable build
      expect(result.count).toBe(CASE_COUNT);
      expect(result.cases).toHaveLength(76);
      const failed = result.cases.filter((c) => c.failures.length > 0).map((c) => `${c.name}: ${c.failures.join('; ')}`);
      expect(failed).toEqual([]);
      expect(nodeOnnx[isa].filter((c) => c.failures.length > 0)).toEqual([]);
      expect(result.cases.map((c) => `${c.name} ${c.hash}`)).toEqual(nodeOnnx[isa].map((c) => `${c.name} ${c.hash}`));
      if (!isolated) expect(result.threads).toBe(1);
      console.log(`ONNX conformance in Chromium (${label}, ${isa}, ${result.threads} thread${result.threads > 1 ? 's' : ''}): ` +
        `${result.cases.length - failed.length}/${result.cases.length} passed, outputs bit-identical to Node`);
    });

    test('the float64 reference comparisons pass, bit-identical to Node', async ({ page }) => {
      const result = await page.evaluate(async (relaxedSimd) => {
        const { createAttention } = await import('/dist/index.js');
        const { runReferenceCases } = await import('/tests/shared/reference-cases.mjs');
        const attn = await createAttention({ relaxedSimd });
        const cases = await runReferenceCases(attn);
        const { threads, isa } = attn;
        attn.dispose();
        return { cases, threads, isa };
      }, relaxedSimd);
      expect(result.isa).toBe(isa);
      expect(result.cases).toHaveLength(REFERENCE_CASES.length);
      expect(result.cases.length).toBeGreaterThanOrEqual(19);
      const failed = result.cases.filter((c) => !c.ok)
        .map((c) => `${c.name}: output error ${c.outputError}, weights error ${c.weightsError}, zeros exact ${c.zerosExact}`);
      expect(failed).toEqual([]);
      expect(nodeReference[isa].filter((c) => !c.ok)).toEqual([]);
      // Cases with fully masked rows are in the set, and those rows are exact zeros.
      expect(result.cases.filter((c) => c.zeroOutputs > 0).length).toBeGreaterThanOrEqual(3);
      expect(result.cases.map((c) => `${c.name} ${c.hash}`)).toEqual(nodeReference[isa].map((c) => `${c.name} ${c.hash}`));
    });

    test('sdpaBackward matches the float64 analytic backward, bit-identical to Node', async ({ page }) => {
      const result = await page.evaluate(async (relaxedSimd) => {
        const { createAttention } = await import('/dist/index.js');
        const { runBackwardCases } = await import('/tests/shared/backward-cases.mjs');
        const attn = await createAttention({ relaxedSimd });
        const cases = await runBackwardCases(attn);
        const { threads, isa } = attn;
        attn.dispose();
        return { cases, threads, isa };
      }, relaxedSimd);
      expect(result.isa).toBe(isa);
      expect(result.cases).toHaveLength(BACKWARD_CASES.length);
      expect(result.cases.filter((c) => !c.ok).map((c) => `${c.name}: ${JSON.stringify(c.errors)}`)).toEqual([]);
      expect(nodeBackward[isa].filter((c) => !c.ok)).toEqual([]);
      expect(result.cases.map((c) => `${c.name} ${c.hash}`)).toEqual(nodeBackward[isa].map((c) => `${c.name} ${c.hash}`));
    });

    test('past maxMemoryBytes, sdpa, sdpaBackward and KVCache.attend run in slices: the unlimited calls\' bits, within the limit, bit-identical to Node', async ({ page }) => {
      const result = await page.evaluate(async (relaxedSimd) => {
        const { createAttention } = await import('/dist/index.js');
        const { runLimitedCases } = await import('/tests/shared/limited-cases.mjs');
        const cases = await runLimitedCases(createAttention, { relaxedSimd });
        const attn = await createAttention({ relaxedSimd });
        const { isa, threads } = attn;
        attn.dispose();
        return { cases, isa, threads };
      }, relaxedSimd);
      expect(result.isa).toBe(isa);
      expect(result.cases).toHaveLength(LIMITED_CASES.length);
      const wrong = (cases) => cases.filter((c) => !(c.same && c.withinLimit && c.limited)).map((c) => `${c.name}: ${JSON.stringify(c)}`);
      expect(wrong(result.cases)).toEqual([]);
      expect(wrong(nodeLimited[isa])).toEqual([]);
      expect(result.cases.map((c) => `${c.name} ${c.hash}`)).toEqual(nodeLimited[isa].map((c) => `${c.name} ${c.hash}`));
      if (!isolated) expect(result.threads).toBe(1);
    });

    test('sdpaVarlen and its backward match the float64 reference, bit-identical to Node', async ({ page }) => {
      const result = await page.evaluate(async (relaxedSimd) => {
        const { createAttention } = await import('/dist/index.js');
        const { runVarlenCases } = await import('/tests/shared/varlen-cases.mjs');
        const attn = await createAttention({ relaxedSimd });
        const cases = await runVarlenCases(attn);
        const { isa } = attn;
        attn.dispose();
        return { cases, isa };
      }, relaxedSimd);
      expect(result.isa).toBe(isa);
      expect(result.cases).toHaveLength(VARLEN_CASES.length);
      expect(result.cases.filter((c) => !c.ok).map((c) => `${c.name}: ${JSON.stringify(c.errors)}`)).toEqual([]);
      expect(nodeVarlen[isa].filter((c) => !c.ok)).toEqual([]);
      expect(result.cases.map((c) => `${c.name} ${c.hash}`)).toEqual(nodeVarlen[isa].map((c) => `${c.name} ${c.hash}`));
    });
  });
}

// Chromium has Float16Array (Node 20 does not): inputs given as Float16Array give the bits of the
// same values as Float32Array on every way a call runs (tests/shared/float16-input-cases.mjs),
// directly on one thread and on several, and through the worker, copied and moved.
test('Float16Array inputs: the bits of the same values as Float32Array, whole, streamed, sliced, packed, cached, backward; direct and worker', async ({ page }) => {
  // 17 cases, each on three instances (direct, worker copied, worker moved), on two pages: about
  // 35 s alone, past the default 60 s beside the other Playwright worker on a loaded machine.
  test.setTimeout(180_000);
  const runs = {};
  for (const [label, base] of [['isolated', ISOLATED], ['plain', PLAIN]]) {
    await page.goto(`${base}/tests/browser/harness.html`);
    runs[label] = await page.evaluate(async () => {
      const { createAttention, createAttentionWorker } = await import('/dist/index.js');
      const { runFloat16InputCases } = await import('/tests/shared/float16-input-cases.mjs');
      const probe = await createAttention();
      const threads = probe.threads;
      probe.dispose();
      return {
        threads,
        direct: await runFloat16InputCases((o) => createAttention(o)),
        worker: await runFloat16InputCases((o) => createAttentionWorker(o)),
        moved: await runFloat16InputCases((o) => createAttentionWorker(o), { transfer: true }),
      };
    });
  }
  expect(runs.isolated.threads).toBeGreaterThan(1);
  expect(runs.plain.threads).toBe(1);
  for (const run of Object.values(runs)) {
    for (const cases of [run.direct, run.worker, run.moved]) {
      expect(cases.length).toBe(FLOAT16_INPUT_CASES.length + 1);  // + saved from a Float16Array forward
      expect(cases.filter((c) => !c.ok).map((c) => JSON.stringify(c))).toEqual([]);
      expect(cases.map((c) => `${c.name} ${c.hash}`)).toEqual(runs.plain.direct.map((c) => `${c.name} ${c.hash}`));
    }
  }
  console.log(`Float16Array inputs in Chromium: ${runs.plain.direct.length} cases, direct (1 and ${runs.isolated.threads} threads) ` +
    'and through the worker (copied and moved), the bits of Float32Array inputs');
});

// Where a streamed decode copies each segment (js/memory.ts, placeCopy): the bytes copied from
// the source land 2 KiB from it modulo 4 KiB (against 4K aliasing), as tests/node/binding.test.mjs
// checks for Float32Array sources; a long Float16Array's bytes are its raw halves, copied into
// the upper half of the block (writeFloats), a short one's the floats set() writes at the address.
test('placeCopy: the bytes copied from a Float16Array land 2 KiB from it modulo 4 KiB, inside the block', async ({ page }) => {
  await page.goto(`${ISOLATED}/tests/browser/harness.html`);
  const failures = await page.evaluate(async () => {
    const { COPY_PLACEMENT_SLACK, placeCopy, WIDEN_IN_WASM_MIN_ELEMENTS: W } = await import('/dist/memory.js');
    const found = [];
    const buffer = new ArrayBuffer(4 * W + 3 * 4096);
    for (const length of [1, W - 1, W, W + 1, 2 * W + 3]) {
      for (let offset = 0; offset < 2 * 4096; offset += 2 * 7) {
        const source = new Float16Array(buffer, offset, length);
        const copiedTo = length >= W ? 2 * length : 0;  // where the copied bytes start, from the address
        for (const block of [0, 16, 8, 2048, 4080, 65536 + 944, 2 ** 31 - 4 * length - 4096]) {
          const at = placeCopy(block, source);
          const distance = (((at + copiedTo - offset) % 4096) + 4096) % 4096;
          // Where the source and the copied bytes are 2 bytes apart modulo 4 (an odd element, or an
          // odd length's halves), they land 2046 away: the address stays a float's.
          const rounding = (((offset - copiedTo) % 4) + 4) % 4;
          if (at < block || at > block + COPY_PLACEMENT_SLACK - 4 || at % 4 !== 0 || distance !== 2048 - rounding) {
            found.push({ length, offset, block, at, distance });
          }
        }
      }
    }
    return { count: found.length, first: found.slice(0, 5) };
  });
  expect(failures).toEqual({ count: 0, first: [] });
});
