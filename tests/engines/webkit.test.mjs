// The browser cases in WebKit (WebCore, JavaScriptCore: Safari's engine): WebKitGTK's
// MiniBrowser, driven by WebKitGTK's WebDriver on a virtual X display (browsers.mjs). What runs:
// engine-tests.mjs. WebKit has no relaxed SIMD, as Safari has none, so feature detection must
// pick the portable build even when relaxedSimd asks for the other. WebKitGTK gives a cross-origin
// isolated page SharedArrayBuffer only with a JavaScriptCore option, which browsers.mjs sets, as
// Safari gives it by default: so the threaded build runs in JavaScriptCore too. WebKit reports
// 4 logical processors on a 2-vCPU machine (its navigator.hardwareConcurrency rounds), so the
// isolated page runs 4 threads. Also JavaScriptCore with its relaxed SIMD turned on (an option,
// off in Safari today): the day it ships, the relaxed build must run there. scripts/test-browser.sh
// runs this file (node --experimental-wasm-relaxed-simd tests/engines/webkit.test.mjs).
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { launchWebKit, TIMEOUT } from './browsers.mjs';
import { assertAllPass, engineTests, hashes } from './engine-tests.mjs';
import { runAllCases } from './page-cases.mjs';

const shared = engineTests({ launch: () => launchWebKit(), relaxed: false });

describe('WebKit with relaxed SIMD turned on (JSC_useWasmRelaxedSIMD)', () => {
  it('feature detection picks the relaxed build; every case passes, the same bits on one thread and on two', { timeout: TIMEOUT }, async () => {
    const webkit = await launchWebKit({ env: { JSC_useWasmRelaxedSIMD: '1' } });
    try {
      const runs = [];
      for (const threads of [1, 2]) {
        const page = await webkit.open(`${shared.servers.isolated.url}/tests/browser/harness.html`);
        const result = await page.run(runAllCases, true, threads);
        assert.equal(result.isa, 'relaxed-simd');
        assert.equal(result.threads, threads);
        assertAllPass(result, `WebKit with relaxed SIMD, ${threads} thread(s)`);
        runs.push(result);
      }
      assert.deepEqual(hashes(runs[1]), hashes(runs[0]));
      const sameAsV8 = JSON.stringify(hashes(runs[0])) === JSON.stringify(hashes(shared.node['relaxed-simd']));
      console.log(`${webkit.version} with relaxed SIMD: the relaxed build's bits ${sameAsV8 ? 'equal' : 'differ from'} V8's`);
    } finally {
      await webkit.close();
    }
  });
});
