// The KV cache inside Chromium: step-by-step decoding (tests/shared/kv-cache-cases.mjs) against
// the float64 reference, float32 and float16, with the wasm memory growing mid-sequence, on the
// cross-origin isolated server (the threaded build, whose memory is a SharedArrayBuffer) and on
// the plain one (single thread). Node runs the same cases: the browser's bits must equal Node's.
import { test, expect } from '@playwright/test';
import { CACHE_CASES, runCacheCases } from '../shared/kv-cache-cases.mjs';
import { FLOAT16_ARRAY_CASES } from '../shared/float16-array-cases.mjs';
import { ISOLATED, PLAIN, nodePackage } from './helpers.mjs';

let nodeCases;

test.beforeAll(async () => {
  const { createAttention } = await nodePackage();
  const attn = await createAttention({ threads: 1 });
  try {
    nodeCases = await runCacheCases(attn);
  } finally {
    attn.dispose();
  }
});

for (const [label, base, isolated] of [['cross-origin isolated', ISOLATED, true], ['not isolated', PLAIN, false]]) {
  test(`KV cache decoding in Chromium, ${label}: within 2e-5 of the reference, bit-identical to Node`, async ({ page }) => {
    await page.goto(`${base}/tests/browser/harness.html`);
    expect(await page.evaluate(() => crossOriginIsolated)).toBe(isolated);
    const result = await page.evaluate(async () => {
      const { createAttention } = await import('/dist/index.js');
      const { runCacheCases } = await import('/tests/shared/kv-cache-cases.mjs');
      const attn = await createAttention();
      try {
        return { cases: await runCacheCases(attn), threads: attn.threads };
      } finally {
        attn.dispose();
      }
    });
    expect(result.cases).toHaveLength(CACHE_CASES.length);
    expect(result.cases.filter((c) => !c.ok).map((c) => `${c.name}: error ${c.worstError}, read() ${c.readOk}`)).toEqual([]);
    expect(nodeCases.filter((c) => !c.ok).map((c) => `${c.name}: error ${c.worstError}`)).toEqual([]);
    expect(result.cases.map((c) => `${c.name} ${c.hash}`)).toEqual(nodeCases.map((c) => `${c.name} ${c.hash}`));
    if (isolated) expect(result.threads).toBeGreaterThan(1);
    else expect(result.threads).toBe(1);
    console.log(`KV cache in Chromium (${label}, ${result.threads} thread${result.threads > 1 ? 's' : ''}): ` +
      `${result.cases.length} cases, ${result.cases.reduce((a, c) => a + c.steps, 0)} steps, bit-identical to Node`);
  });
}

// Chromium has Float16Array (Node 20 does not): appends of Float16Array to caches of every
// dtype (tests/shared/float16-array-cases.mjs), on one thread and on several, and through the
// worker, copied and moved ({ transfer: true }): the same bits everywhere.
test('Float16Array appends to float16, float32 and bfloat16 caches: direct on both pages and through the worker, the same bits', async ({ page }) => {
  const runs = {};
  for (const [label, base] of [['isolated', ISOLATED], ['plain', PLAIN]]) {
    await page.goto(`${base}/tests/browser/harness.html`);
    runs[label] = await page.evaluate(async () => {
      const { createAttention, createAttentionWorker } = await import('/dist/index.js');
      const { runFloat16ArrayCases } = await import('/tests/shared/float16-array-cases.mjs');
      const attn = await createAttention();
      const worker = await createAttentionWorker();
      try {
        return {
          threads: attn.threads,
          direct: await runFloat16ArrayCases(attn),
          worker: await runFloat16ArrayCases(worker),
          moved: await runFloat16ArrayCases(worker, { transfer: true }),
        };
      } finally {
        attn.dispose();
        await worker.dispose();
      }
    });
  }
  expect(runs.isolated.threads).toBeGreaterThan(1);
  expect(runs.plain.threads).toBe(1);
  const failed = (cases) => cases.filter((c) => !c.ok).map((c) => JSON.stringify(c));
  const bits = (cases) => cases.map((c) => `${c.name} ${c.hash}`);
  for (const run of Object.values(runs)) {
    for (const cases of [run.direct, run.worker, run.moved]) {
      expect(cases.length).toBe(FLOAT16_ARRAY_CASES.length + 7);  // + every pattern (3 dtypes), 3 refusals, the call after them
      expect(failed(cases)).toEqual([]);
      expect(bits(cases)).toEqual(bits(runs.plain.direct));
    }
  }
  console.log(`Float16Array appends in Chromium: ${runs.plain.direct.length} cases, direct (1 and ${runs.isolated.threads} threads) ` +
    'and through the worker (copied and moved), the same bits');
});
