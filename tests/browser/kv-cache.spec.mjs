// The KV cache inside Chromium: step-by-step decoding (tests/shared/kv-cache-cases.mjs) against
// the float64 reference, float32 and float16, with the wasm memory growing mid-sequence, on the
// cross-origin isolated server (the threaded build, whose memory is a SharedArrayBuffer) and on
// the plain one (single thread). Node runs the same cases: the browser's bits must equal Node's.
import { test, expect } from '@playwright/test';
import { CACHE_CASES, runCacheCases } from '../shared/kv-cache-cases.mjs';
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
    expect(result.cases.filter((c) => !c.ok).map((c) => `${c.name}: error ${c.worstError}`)).toEqual([]);
    expect(nodeCases.filter((c) => !c.ok).map((c) => `${c.name}: error ${c.worstError}`)).toEqual([]);
    expect(result.cases.map((c) => `${c.name} ${c.hash}`)).toEqual(nodeCases.map((c) => `${c.name} ${c.hash}`));
    if (isolated) expect(result.threads).toBeGreaterThan(1);
    else expect(result.threads).toBe(1);
    console.log(`KV cache in Chromium (${label}, ${result.threads} thread${result.threads > 1 ? 's' : ''}): ` +
      `${result.cases.length} cases, ${result.cases.reduce((a, c) => a + c.steps, 0)} steps, bit-identical to Node`);
  });
}
