// The browser cases in Firefox (Gecko, SpiderMonkey): Debian's firefox-esr, driven through
// WebDriver BiDi by puppeteer-core (Playwright drives only a Firefox build of its own, and its
// BiDi mode needs commands Firefox ESR lacks). What runs: engine-tests.mjs; Firefox runs relaxed
// SIMD, so both builds run. Also Firefox with relaxed SIMD turned off, where feature detection
// must pick the portable build. scripts/test-browser.sh runs this file
// (node --experimental-wasm-relaxed-simd tests/engines/firefox.test.mjs).
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { launchFirefox, TIMEOUT } from './browsers.mjs';
import { assertAllPass, engineTests, hashes } from './engine-tests.mjs';
import { runAllCases } from './page-cases.mjs';

const shared = engineTests({ launch: () => launchFirefox(), relaxed: true });

describe('Firefox with relaxed SIMD turned off (javascript.options.wasm_relaxed_simd)', () => {
  it('feature detection picks the portable build, whose bits equal Node\'s', { timeout: TIMEOUT }, async () => {
    const firefox = await launchFirefox({ prefs: { 'javascript.options.wasm_relaxed_simd': false } });
    try {
      const page = await firefox.open(`${shared.servers.isolated.url}/tests/browser/harness.html`);
      const result = await page.run(runAllCases, true);  // relaxedSimd: true asks for the relaxed build
      assert.equal(result.isa, 'simd128');
      assert.ok(result.threads > 1);
      assertAllPass(result, 'Firefox without relaxed SIMD');
      assert.deepEqual(hashes(result), hashes(shared.node.simd128));
      assert.deepEqual(page.errors, []);
    } finally {
      await firefox.close();
    }
  });
});
