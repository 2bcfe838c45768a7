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

// A page's Content-Security-Policy for a package on a CDN: the CDN in script-src (the modules),
// connect-src (the .wasm fetch) and worker-src with blob: (the loader scripts, and what they
// load, are worker scripts), as the README says. Without blob:, the workers cannot start: both
// calls reject, naming what failed, and neither hangs.
test('imported from another origin under a Content-Security-Policy: runs with the README\'s policy; without blob: it rejects (no hang)', async ({ page }) => {
  const cdnOrigin = new URL(cdn.url).origin;
  const run = async (policy) => {
    // The page's server sends the policy (a response Playwright fulfilled itself would lose the
    // page's loopback address, and Chromium would then refuse its requests to the CDN).
    const server = await startServer(ROOT, { csp: policy });
    try {
      await page.goto(`${server.url}/tests/browser/harness.html`);
      return await page.evaluate(async (from) => {
        const { createAttention, createAttentionWorker } = await import(`${from}/dist/index.js`);
        const { runReferenceCases } = await import('/tests/shared/reference-cases.mjs');
        const settle = (promise) => Promise.race([promise.then((value) => ({ value }), (error) => ({ error: error.message })),
          new Promise((resolve) => setTimeout(() => resolve({ hung: true }), 20_000))]);
        const failures = async (instance) => (await runReferenceCases(instance)).filter((c) => !c.ok).length;
        const direct = await settle(createAttention({ threads: 2 }).then(async (attn) => {
          const failed = await failures(attn);
          attn.dispose();
          return failed;
        }));
        const viaWorker = await settle(createAttentionWorker({ threads: 2 }).then(async (worker) => {
          const failed = await failures(worker);
          await worker.dispose();
          return failed;
        }));
        return { direct, viaWorker };
      }, cdn.url);
    } finally {
      await server.stop();
    }
  };
  const base = `default-src 'self'; script-src 'self' ${cdnOrigin} 'wasm-unsafe-eval'; connect-src 'self' ${cdnOrigin}`;
  expect(await run(`${base}; worker-src 'self' ${cdnOrigin} blob:`)).toEqual({ direct: { value: 0 }, viaWorker: { value: 0 } });
  expect(await run(`${base}; worker-src 'self' ${cdnOrigin}`)).toEqual({
    direct: { error: expect.stringMatching(/^sdpa-wasm: could not load its WebAssembly build from .*sdpa-mt-relaxed\.wasm: .*a worker of its thread pool failed/) },
    viaWorker: { error: expect.stringMatching(/^sdpa-wasm: the attention worker failed: /) },
  });
});

test('the threaded build\'s worker script cannot be fetched: createAttention rejects naming the build (no hang)', async ({ page, context }) => {
  await context.route('**/dist/wasm/sdpa-mt-relaxed.worker.js', (route) => route.abort());
  await page.goto(`${ISOLATED}/tests/browser/harness.html`);
  const outcome = await page.evaluate(async () => {
    const { createAttention } = await import('/dist/index.js');
    return Promise.race([
      createAttention({ threads: 2 }).then(() => ({ loaded: true }), (error) => ({ name: error.constructor.name, message: error.message })),
      new Promise((resolve) => setTimeout(() => resolve({ hung: true }), 20_000)),
    ]);
  });
  expect(outcome).toEqual({
    name: 'Error',
    message: expect.stringMatching(/^sdpa-wasm: could not load its WebAssembly build from http:\/\/127\.0\.0\.1:\d+\/dist\/wasm\/sdpa-mt-relaxed\.wasm: Error: a worker of its thread pool failed: /),
  });
});

// A pool worker imports the glue itself (Emscripten's worker script, on its 'load' message), in a
// promise chain whose rejection fired no 'error' at the Worker: the load waited for that worker
// forever. scripts/patch-pool-worker.mjs makes it one; the load rejects naming it. Only the pool
// worker's request fails: the glue's first one (the page's own import, or the attention worker's)
// goes through. The direct API and the worker, each on a page of its own.
test('a pool worker cannot import the glue: createAttention and createAttentionWorker reject naming it (no hang)', async ({ page, context }) => {
  let requests = 0;
  await context.route('**/dist/wasm/sdpa-mt-relaxed.mjs', (route) => (requests++ === 0 ? route.continue() : route.abort()));
  const load = async (how) => {
    requests = 0;
    await page.goto(`${ISOLATED}/tests/browser/harness.html`);
    const outcome = await page.evaluate(async (how) => {
      const { createAttention, createAttentionWorker } = await import('/dist/index.js');
      const loading = how === 'direct' ? createAttention({ threads: 2 }) : createAttentionWorker({ threads: 2 });
      return Promise.race([
        loading.then(() => ({ loaded: true }), (error) => ({ name: error.constructor.name, message: error.message })),
        new Promise((resolve) => setTimeout(() => resolve({ hung: true }), 20_000)),
      ]);
    }, how);
    return { requests, outcome };
  };
  // The worker's createAttention() fails as the direct one does, and its error comes back as it is.
  const failed = {
    requests: 2,
    outcome: {
      name: 'Error',
      message: expect.stringMatching(new RegExp('^sdpa-wasm: could not load its WebAssembly build from http://127\\.0\\.0\\.1:\\d+/dist/wasm/' +
        'sdpa-mt-relaxed\\.wasm: Error: a worker of its thread pool failed: .*sdpa-mt-relaxed\\.mjs')),
    },
  };
  expect(await load('direct')).toEqual(failed);
  expect(await load('worker')).toEqual(failed);
});

// From another origin the worker starts through a loader that imports its script (js/cross-origin.ts):
// a script that cannot be fetched rejects the call with the reason, and the direct API still works.
test('from another origin, the attention worker\'s script cannot be fetched: createAttentionWorker rejects (no hang)', async ({ page, context }) => {
  await context.route(`${cdn.url}/dist/worker-entry.js`, (route) => route.abort());
  await page.goto(`${ISOLATED}/tests/browser/harness.html`);
  const outcome = await page.evaluate(async (from) => {
    const { workerLoadFailure } = await import('/tests/shared/worker-load-failure.mjs');
    return workerLoadFailure(from);
  }, cdn.url);
  expect(outcome).toEqual({
    worker: { name: 'Error', message: expect.stringMatching(/^sdpa-wasm: the attention worker failed: .*worker-entry\.js/) },
    directWorks: true,
  });
});

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
