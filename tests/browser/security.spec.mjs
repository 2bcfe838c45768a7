// What the package does not do, checked in Chromium (issue #12's README "Robustness" claims):
//   - it never evaluates data as code: every build, direct and through createAttentionWorker,
//     runs on a page (and in workers) whose Content-Security-Policy allows no eval — only
//     'self' scripts and WebAssembly compilation ('wasm-unsafe-eval'); a string evaluated as
//     code (eval, new Function) would be blocked and reported as a violation;
//   - it never touches the network beyond loading its own files: every request the page and
//     its workers make is recorded, and after the page itself they are all the package's own
//     files under /dist/ on the page's origin.
import { test, expect } from '@playwright/test';
import { ISOLATED, PLAIN } from './helpers.mjs';

const CSP = "default-src 'self'; img-src 'self' data:; script-src 'self' 'wasm-unsafe-eval'; worker-src 'self'; object-src 'none'; base-uri 'none'";

for (const [label, base, isolated] of [['cross-origin isolated', ISOLATED, true], ['not isolated', PLAIN, false]]) {
  test(`under a no-eval CSP (${label}): every build and the worker run; only the package's own files are requested`, async ({ page, context }) => {
    // The CSP header on every response (the page, the package's scripts, the workers' scripts).
    await context.route('**/*', async (route) => {
      const response = await route.fetch();
      await route.fulfill({ response, headers: { ...response.headers(), 'content-security-policy': CSP } });
    });
    const requests = [];
    context.on('request', (request) => requests.push(request.url()));
    const errors = [];
    page.on('pageerror', (error) => errors.push(`pageerror: ${error.message}`));
    page.on('console', (message) => { if (message.type() === 'error') errors.push(`console: ${message.text()}`); });

    await page.goto(`${base}/tests/browser/harness.html`);
    expect(await page.evaluate(() => crossOriginIsolated)).toBe(isolated);
    await page.evaluate(() => {
      window.__violations = [];
      document.addEventListener('securitypolicyviolation', (e) => window.__violations.push(`${e.violatedDirective}: ${e.blockedURI}`));
    });
    // The CSP is in force: a string evaluated as code (a string timer) is blocked and reported.
    // (Code run by page.evaluate itself is exempt from CSP in Chromium; the package's modules,
    // imported below, are not.)
    expect(await page.evaluate(async () => {
      setTimeout('window.__evaluated = true');
      await new Promise((resolve) => setTimeout(resolve, 50));
      const seen = [window.__evaluated === true, [...window.__violations]];
      window.__violations.length = 0;
      return seen;
    })).toEqual([false, ['script-src: eval']]);
    expect(errors).toEqual([expect.stringMatching(/^console: Evaluating a string as JavaScript violates the following Content Security Policy/)]);
    errors.length = 0;
    const pageUrl = requests.length;

    const result = await page.evaluate(async () => {
      const { createAttention, createAttentionWorker } = await import('/dist/index.js');
      const tensor = (dims, seed) => {
        const n = dims.reduce((a, b) => a * b, 1);
        const data = new Float32Array(n);
        for (let i = 0; i < n; i++) data[i] = Math.sin(seed * 7.1 + i * 0.37);
        return { data, dims };
      };
      const q = tensor([1, 4, 9, 16], 1), k = tensor([1, 2, 33, 16], 2), v = tensor([1, 2, 33, 8], 3);
      const runs = [];
      for (const relaxedSimd of [true, false]) {
        for (const threads of [1, 2]) {
          const attn = await createAttention({ threads, relaxedSimd });
          const { output } = attn.sdpa(q, k, v, { isCausal: true, causalOffset: 24 });
          const cache = attn.createKVCache({ batch: 1, kvHeads: 2, headDim: 16, valueDim: 8, maxLength: 64, dtype: 'float16' });
          cache.append(k, v);
          const attended = cache.attend(q).output;
          runs.push({ isa: attn.isa, threads: attn.threads, finite: [...output.data, ...attended.data].every(Number.isFinite) });
          attn.dispose();
        }
      }
      const worker = await createAttentionWorker({ threads: 2 });
      const viaWorker = await worker.sdpa(q, k, v);
      runs.push({ isa: `worker ${worker.isa}`, threads: worker.threads, finite: [...viaWorker.output.data].every(Number.isFinite) });
      await worker.dispose();
      return runs;
    });

    expect(errors).toEqual([]);
    expect(await page.evaluate(() => window.__violations)).toEqual([]);
    expect(result.every((run) => run.finite)).toBe(true);
    expect(result.map((run) => run.isa)).toEqual(['relaxed-simd', 'relaxed-simd', 'simd128', 'simd128', 'worker relaxed-simd']);
    // Threads only where SharedArrayBuffer is allowed.
    expect(result.map((run) => run.threads)).toEqual(isolated ? [1, 2, 1, 2, 2] : [1, 1, 1, 1, 1]);

    const origin = new URL(base).origin;
    const made = requests.slice(pageUrl);
    expect(made.length).toBeGreaterThan(0);
    const foreign = made.filter((url) => !url.startsWith(`${origin}/dist/`));
    expect(foreign).toEqual([]);
    // Each build's .wasm was fetched (the page loads one build per kind of instance).
    for (const build of ['sdpa.wasm', 'sdpa-relaxed.wasm']) expect(made.some((url) => url.endsWith(`/dist/wasm/${build}`))).toBe(true);
    // Workers' requests are recorded too: the AttentionWorker's script and its own wasm.
    expect(made.some((url) => url.endsWith('/dist/worker-entry.js'))).toBe(true);
    if (isolated) expect(made.some((url) => url.endsWith('/dist/wasm/sdpa-mt-relaxed.worker.js'))).toBe(true);
  });
}
