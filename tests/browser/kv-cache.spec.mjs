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
    expect(result.cases.filter((c) => !c.ok).map((c) => `${c.name}: error ${c.worstError}, read() ${c.readOk}`)).toEqual([]);
    expect(nodeCases.filter((c) => !c.ok).map((c) => `${c.name}: error ${c.worstError}`)).toEqual([]);
    expect(result.cases.map((c) => `${c.name} ${c.hash}`)).toEqual(nodeCases.map((c) => `${c.name} ${c.hash}`));
    if (isolated) expect(result.threads).toBeGreaterThan(1);
    else expect(result.threads).toBe(1);
    console.log(`KV cache in Chromium (${label}, ${result.threads} thread${result.threads > 1 ? 's' : ''}): ` +
      `${result.cases.length} cases, ${result.cases.reduce((a, c) => a + c.steps, 0)} steps, bit-identical to Node`);
  });
}

// Chromium has Float16Array (Node 20 does not): the README's way to append one to a float16
// cache, a Uint16Array over its bytes, stores its halves as they are, so the cache holds what
// appending the same values as float32 (exact in float16, so rounding keeps them) holds.
test('a Float16Array appended through a Uint16Array view of its bytes: the same cache as its values as float32', async ({ page }) => {
  await page.goto(`${PLAIN}/tests/browser/harness.html`);
  const result = await page.evaluate(async () => {
    const { createAttention } = await import('/dist/index.js');
    const attn = await createAttention({ threads: 1 });
    try {
      const [B, H, L, E] = [1, 2, 37, 16];
      let seed = 5;
      const random = () => ((seed = (seed * 1664525 + 1013904223) >>> 0) / 2 ** 32) * 8 - 4;
      const halves = () => Float16Array.from({ length: B * H * L * E }, random);
      const [k16, v16] = [halves(), halves()];
      const query = { data: Float32Array.from({ length: B * 4 * 1 * E }, random), dims: [B, 4, 1, E] };
      const viaView = attn.createKVCache({ batch: B, kvHeads: H, headDim: E, maxLength: L, dtype: 'float16' });
      const viaFloats = attn.createKVCache({ batch: B, kvHeads: H, headDim: E, maxLength: L, dtype: 'float16' });
      const view = (f16) => new Uint16Array(f16.buffer, f16.byteOffset, f16.length);
      viaView.append({ data: view(k16), dims: [B, H, L, E] }, { data: view(v16), dims: [B, H, L, E] });
      viaFloats.append({ data: Float32Array.from(k16), dims: [B, H, L, E] }, { data: Float32Array.from(v16), dims: [B, H, L, E] });
      const a = viaView.attend(query).output.data, b = viaFloats.attend(query).output.data;
      let refused = null;
      try {
        viaView.append({ data: k16.subarray(0, B * H * E), dims: [B, H, 1, E] }, { data: view(v16).subarray(0, B * H * E), dims: [B, H, 1, E] });
      } catch (error) {
        refused = `${error.name}: ${error.message}`;
      }
      return { same: a.length === B * 4 * E && a.every((x, n) => Object.is(x, b[n])), finite: a.every(Number.isFinite), refused, length: viaView.length };
    } finally {
      attn.dispose();
    }
  });
  expect(result.same).toBe(true);
  expect(result.finite).toBe(true);
  // The Float16Array itself is refused by name, and nothing is appended.
  expect(result.refused).toMatch(/^TypeError: .*key\.data must be a Float32Array or a Uint16Array \(raw 16-bit elements\), got Float16Array/);
  expect(result.length).toBe(37);
});
