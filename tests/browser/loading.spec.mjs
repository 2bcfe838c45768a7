// Where the package is loaded from, checked in Chromium:
//   - from another origin, as a page that imports it from a CDN does (a third server, serving
//     the repository with the headers a CDN sends: Access-Control-Allow-Origin: * and
//     Cross-Origin-Resource-Policy: cross-origin). A browser starts no Worker from another
//     origin's script, so createAttentionWorker and the threaded build's pool start theirs
//     through loader scripts of the page's origin (js/cross-origin.ts). On the cross-origin
//     isolated page the direct API runs the threaded build and so does the worker (nested
//     workers); on the plain page, one thread. Every result is checked against the float64
//     reference (tests/shared/reference-cases.mjs), and the package's files must all come
//     from the CDN's origin;
//   - a build whose .wasm cannot be fetched: createAttention rejects with an Error naming the
//     file, not Emscripten's bare "Aborted(...)".
import { test, expect } from '@playwright/test';
import { ISOLATED, PLAIN, ROOT, startServer } from './helpers.mjs';

let cdn;
test.beforeAll(async () => {
  cdn = await startServer(ROOT, { isolation: false, cdn: true });
});
test.afterAll(async () => {
  await cdn?.stop();
});

for (const [label, base, isolated] of [['cross-origin isolated', ISOLATED, true], ['not isolated', PLAIN, false]]) {
  test(`imported from another origin (${label}): the direct API and createAttentionWorker run and match the reference`, async ({ page, context }) => {
    const packageRequests = [];
    context.on('request', (request) => {
      const url = new URL(request.url());
      if (url.pathname.startsWith('/dist/')) packageRequests.push(url);
    });
    const errors = [];
    page.on('pageerror', (error) => errors.push(`pageerror: ${error.message}`));

    await page.goto(`${base}/tests/browser/harness.html`);
    expect(await page.evaluate(() => crossOriginIsolated)).toBe(isolated);
    const result = await page.evaluate(async (from) => {
      const { createAttention, createAttentionWorker } = await import(`${from}/dist/index.js`);
      const { runReferenceCases } = await import('/tests/shared/reference-cases.mjs');
      const summary = (cases) => cases.filter((c) => !c.ok).map((c) => c.name);
      const attn = await createAttention({ threads: 2 });
      const direct = { threads: attn.threads, failed: summary(await runReferenceCases(attn)) };
      attn.dispose();
      const worker = await createAttentionWorker({ threads: 2 });
      const viaWorker = { threads: worker.threads, failed: summary(await runReferenceCases(worker)) };
      await worker.dispose();
      return { direct, viaWorker };
    }, cdn.url);

    const threads = isolated ? 2 : 1;
    expect(result).toEqual({ direct: { threads, failed: [] }, viaWorker: { threads, failed: [] } });
    expect(errors).toEqual([]);
    // Every file of the package came from the CDN: the modules, a .wasm, and the workers' scripts.
    const cdnOrigin = new URL(cdn.url).origin;
    expect(packageRequests.filter((url) => url.origin !== cdnOrigin).map(String)).toEqual([]);
    const files = new Set(packageRequests.map((url) => url.pathname));
    expect(files).toContain('/dist/worker-entry.js');
    if (isolated) expect(files).toContain('/dist/wasm/sdpa-mt-relaxed.worker.js');
    expect([...files].some((path) => path.endsWith('.wasm'))).toBe(true);
  });
}

test('a build whose .wasm cannot be fetched: createAttention rejects with an Error naming the file; the next call retries', async ({ page, context }) => {
  let blocked = true;
  await context.route('**/dist/wasm/sdpa-relaxed.wasm', (route) => (blocked ? route.abort() : route.continue()));
  await page.goto(`${PLAIN}/tests/browser/harness.html`);
  const failure = await page.evaluate(async () => {
    const { createAttention } = await import('/dist/index.js');
    return createAttention().then(() => null, (error) => ({ name: error.constructor.name, message: error.message }));
  });
  expect(failure).toEqual({
    name: 'Error',
    message: expect.stringMatching(/^sdpa-wasm: could not load its WebAssembly build from http:\/\/127\.0\.0\.1:\d+\/dist\/wasm\/sdpa-relaxed\.wasm: \w+/),
  });
  blocked = false;
  const works = await page.evaluate(async () => {
    const { createAttention } = await import('/dist/index.js');
    const attn = await createAttention();
    const x = { data: new Float32Array(16).fill(1), dims: [1, 1, 4, 4] };
    const ok = attn.sdpa(x, x, x).output.data.every((v) => v === 1);
    attn.dispose();
    return ok;
  });
  expect(works).toBe(true);
});
