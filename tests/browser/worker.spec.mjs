// createAttentionWorker() in Chromium: the package's module worker (with nested pthread workers
// when the page is cross-origin isolated) gives Node's direct-API results bit for bit, and a
// page keeps drawing frames while a ≈ 2-second attention job runs in the worker, where the same
// job on the main thread stalls them (so the measurement can fail).
import { test, expect } from '@playwright/test';
import { CACHE_CASES, runCacheCases } from '../shared/kv-cache-cases.mjs';
import { REFERENCE_CASES, runReferenceCases } from '../shared/reference-cases.mjs';
import { ISOLATED, PLAIN, nodePackage } from './helpers.mjs';

let nodeReference, nodeCache;

test.beforeAll(async () => {
  const { createAttention } = await nodePackage();
  const attn = await createAttention({ threads: 1 });
  try {
    nodeReference = await runReferenceCases(attn);
    nodeCache = await runCacheCases(attn);
  } finally {
    attn.dispose();
  }
});

const MODES = [['cross-origin isolated', ISOLATED, true], ['not isolated', PLAIN, false]];

for (const [label, base, isolated] of MODES) {
  test(`worker in Chromium, ${label}: reference and KV-cache cases bit-identical to Node's direct API`, async ({ page }) => {
    const errors = [];
    page.on('pageerror', (error) => errors.push(error.message));
    await page.goto(`${base}/tests/browser/harness.html`);
    expect(await page.evaluate(() => crossOriginIsolated)).toBe(isolated);
    const result = await page.evaluate(async () => {
      const { createAttentionWorker } = await import('/dist/index.js');
      const { runReferenceCases } = await import('/tests/shared/reference-cases.mjs');
      const { runCacheCases } = await import('/tests/shared/kv-cache-cases.mjs');
      const worker = await createAttentionWorker();
      try {
        return { reference: await runReferenceCases(worker), cache: await runCacheCases(worker), threads: worker.threads };
      } finally {
        await worker.dispose();
      }
    });
    expect(errors).toEqual([]);
    expect(result.reference).toHaveLength(REFERENCE_CASES.length);
    expect(result.cache).toHaveLength(CACHE_CASES.length);
    expect(result.reference.filter((c) => !c.ok).map((c) => c.name)).toEqual([]);
    expect(result.cache.filter((c) => !c.ok).map((c) => c.name)).toEqual([]);
    expect(result.reference.map((c) => `${c.name} ${c.hash}`)).toEqual(nodeReference.map((c) => `${c.name} ${c.hash}`));
    expect(result.cache.map((c) => `${c.name} ${c.hash}`)).toEqual(nodeCache.map((c) => `${c.name} ${c.hash}`));
    // The worker runs the threaded build where the page is isolated (nested pthread workers).
    if (isolated) expect(result.threads).toBeGreaterThan(1);
    else expect(result.threads).toBe(1);
  });
}

/**
 * In the page: runs `job` while requestAnimationFrame counts frames. Returns the job's duration,
 * the frames drawn during it, their rate and the longest gap between two frames (ms).
 */
async function framesDuring(page, which, heads) {
  return page.evaluate(async ([which, heads]) => {
    const { createAttention, createAttentionWorker } = await import('/dist/index.js');
    const { noiseTensor } = await import('/web/seeded.mjs');
    const dims = [1, heads, 2048, 64];
    const q = noiseTensor(dims, 1, 1), k = noiseTensor(dims, 1, 2), v = noiseTensor(dims, 1, 3);
    // One thread: on this 2-core machine a job on every core would take the page's own thread's
    // core too (the CPU, not the worker, would then cost frames); pages should leave it one.
    const api = which === 'worker' ? await createAttentionWorker({ threads: 1 }) : await createAttention({ threads: 1 });
    // Warm up (compilation), outside the measurement.
    await api.sdpa(noiseTensor([1, 1, 64, 64], 2, 1), noiseTensor([1, 1, 64, 64], 2, 2), noiseTensor([1, 1, 64, 64], 2, 3));
    const stamps = [];
    let drawing = true;
    const frame = (t) => {
      stamps.push(t);
      if (drawing) requestAnimationFrame(frame);
    };
    requestAnimationFrame(frame);
    await new Promise((resolve) => setTimeout(resolve, 250));  // frames are flowing
    const start = performance.now();
    const { output } = await api.sdpa(q, k, v);
    const end = performance.now();
    // Let the frame that was due when the job ended be drawn.
    await new Promise((resolve) => setTimeout(resolve, 50));
    drawing = false;
    await api.dispose();
    const during = stamps.filter((t) => t >= start && t <= end);
    const edges = [start, ...during, end];
    let longestGap = 0;
    for (let i = 1; i < edges.length; i++) longestGap = Math.max(longestGap, edges[i] - edges[i - 1]);
    return {
      ms: end - start, frames: during.length, fps: during.length / ((end - start) / 1000), longestGap,
      finite: output.data.every(Number.isFinite),
    };
  }, [which, heads]);
}

for (const [label, base] of MODES) {
  test(`a ≈ 2 s job in the worker leaves the page drawing ≥ 30 frames/s; on the main thread it stalls them (${label})`, async ({ page }) => {
    await page.goto(`${base}/tests/browser/harness.html`);
    // Size the job to about 2 seconds on this machine: time 8 heads, scale the head count (aiming
    // a little over 2 s: fixed costs make the probe's time per head an overestimate), and once
    // more from the sized job if the machine's pace changed (it is shared).
    const probe = await framesDuring(page, 'worker', 8);
    const size = (h, ms) => Math.max(8, Math.min(160, Math.round((h * 2400) / ms)));
    let heads = size(8, probe.ms);
    let inWorker = await framesDuring(page, 'worker', heads);
    if (inWorker.ms < 1200) {
      heads = size(heads, inWorker.ms);
      inWorker = await framesDuring(page, 'worker', heads);
    }
    const onMain = await framesDuring(page, 'main', heads);
    console.log(`${label}: ${heads} heads × 2048² × 64; worker ${inWorker.ms.toFixed(0)} ms, ${inWorker.frames} frames ` +
      `(${inWorker.fps.toFixed(1)}/s, longest gap ${inWorker.longestGap.toFixed(0)} ms); main thread ${onMain.ms.toFixed(0)} ms, ` +
      `${onMain.frames} frames (longest gap ${onMain.longestGap.toFixed(0)} ms)`);
    expect(inWorker.finite && onMain.finite).toBe(true);
    expect(inWorker.ms).toBeGreaterThan(1000);
    expect(inWorker.fps).toBeGreaterThanOrEqual(30);
    // On the main thread nothing is drawn while the call runs: the gap spans nearly all of it.
    expect(onMain.longestGap).toBeGreaterThan(0.9 * onMain.ms);
  });
}

test('a worker whose script cannot load rejects createAttentionWorker with a clear Error (nothing hangs)', async ({ page, context }) => {
  await context.route('**/dist/worker-entry.js', (route) => route.abort());
  await page.goto(`${PLAIN}/tests/browser/harness.html`);
  const outcome = await page.evaluate(async () => {
    const { createAttentionWorker, createAttention } = await import('/dist/index.js');
    const timeout = new Promise((resolve) => setTimeout(() => resolve({ hung: true }), 10_000));
    const started = createAttentionWorker().then(() => ({ started: true }), (error) => ({ name: error.constructor.name, message: error.message }));
    const result = await Promise.race([started, timeout]);
    // The page's own instance is unaffected.
    const attn = await createAttention();
    const x = { data: new Float32Array(16).fill(1), dims: [1, 1, 4, 4] };
    result.directStillWorks = attn.sdpa(x, x, x).output.data.every((v) => v === 1);
    attn.dispose();
    return result;
  });
  expect(outcome).toEqual({
    name: 'Error', message: expect.stringMatching(/^sdpa-wasm: the attention worker failed: /), directStillWorks: true,
  });
});

test('a message the page cannot read (messageerror) declares the worker dead and ends it', async ({ page }) => {
  await page.goto(`${PLAIN}/tests/browser/harness.html`);
  const outcome = await page.evaluate(async () => {
    const { createAttentionWorker } = await import('/dist/index.js');
    const worker = await createAttentionWorker();
    const cache = await worker.createKVCache({ batch: 1, kvHeads: 1, headDim: 4, maxLength: 8 });
    const raw = worker[Symbol.for('sdpa-wasm.worker')];
    let terminated = 0;
    const terminate = raw.terminate.bind(raw);
    raw.terminate = () => { terminated++; terminate(); };
    const x = { data: new Float32Array(16).fill(1), dims: [1, 1, 4, 4] };
    const pending = worker.sdpa(x, x, x).then(() => 'answered', (error) => `${error.constructor.name}: ${error.message}`);
    raw.dispatchEvent(new MessageEvent('messageerror'));  // as the browser fires one
    const result = { pending: await pending, terminated, cache: [cache.disposed, cache.length] };
    result.later = await worker.sdpa(x, x, x).then(() => 'answered', (error) => error.message);
    await worker.dispose();  // harmless after death
    return result;
  });
  const message = 'sdpa-wasm: a message from the attention worker could not be read';
  expect(outcome).toEqual({ pending: `Error: ${message}`, terminated: 1, cache: [true, 0], later: message });
});

// A start whose files do not arrive (a stalled network) waits as long as the browser does; a
// signal bounds it: the worker (and its pool's workers) end, the call rejects with the signal's
// reason, and a later start works. Here the glue of the threaded build, which the worker imports,
// never arrives.
test('createAttentionWorker({ signal }): a start that stalls is stopped by the signal; a later start works', async ({ page, context }) => {
  let stalled = 0;
  let stalling = true;
  await context.route('**/dist/wasm/sdpa-mt-relaxed.mjs', (route) => {
    if (!stalling) return route.continue();
    stalled++;  // never answered
    return undefined;
  });
  await page.goto(`${ISOLATED}/tests/browser/harness.html`);
  const stopped = await page.evaluate(async () => {
    const { createAttentionWorker } = await import('/dist/index.js');
    const started = performance.now();
    return createAttentionWorker({ threads: 2, signal: AbortSignal.timeout(1500) }).then(
      () => ({ started: true }),
      (error) => ({ name: error.name, afterMs: Math.round(performance.now() - started) }));
  });
  expect(stalled).toBe(1);
  expect(stopped).toEqual({ name: 'TimeoutError', afterMs: expect.any(Number) });
  expect(stopped.afterMs).toBeGreaterThanOrEqual(1400);
  stalling = false;
  const later = await page.evaluate(async () => {
    const { createAttentionWorker } = await import('/dist/index.js');
    const worker = await createAttentionWorker({ threads: 2, signal: AbortSignal.timeout(60_000) });
    try {
      const t = { data: new Float32Array(2 * 16 * 8).fill(0.5), dims: [2, 16, 8] };
      const { output } = await worker.sdpa(t, t, t);
      return { threads: worker.threads, first: output.data[0] };
    } finally {
      await worker.dispose();
    }
  });
  expect(later).toEqual({ threads: 2, first: 0.5 });
});
