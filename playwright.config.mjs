// Playwright: the demo page, the in-browser correctness cases and the packaging tests, in the
// system's Chromium (/usr/bin/chromium: no browser download). Run with
//   npx playwright test            (or bash scripts/test-browser.sh, which npm test calls)
// Two static servers (scripts/serve.mjs) serve the repository root: one with the COOP/COEP
// headers (cross-origin isolated, threads allowed), one without. Their ports are picked here,
// once, in the runner process; the workers inherit them through the environment.
import { defineConfig } from '@playwright/test';
import { createServer } from 'node:net';

function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

process.env.SDPA_TEST_PORT ??= String(await freePort());
process.env.SDPA_TEST_PORT_PLAIN ??= String(await freePort());
const isolated = `http://127.0.0.1:${process.env.SDPA_TEST_PORT}`;
const plain = `http://127.0.0.1:${process.env.SDPA_TEST_PORT_PLAIN}`;

export default defineConfig({
  testDir: 'tests/browser',
  outputDir: 'test-results/playwright',
  globalSetup: './tests/browser/global-setup.mjs',
  timeout: 60_000,
  expect: { timeout: 15_000 },
  fullyParallel: false,
  workers: 2,
  forbidOnly: !!process.env.CI,
  retries: 0,
  reporter: [['list'], ['json', { outputFile: 'test-results/playwright/results.json' }]],
  use: {
    browserName: 'chromium',
    baseURL: isolated,
    viewport: { width: 1100, height: 900 },
    launchOptions: {
      executablePath: process.env.CHROMIUM_PATH ?? '/usr/bin/chromium',
      args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
        '--disable-sync', '--no-first-run', '--disable-quic'],
    },
    trace: 'off',
    screenshot: 'only-on-failure',
  },
  webServer: [
    {
      command: `node scripts/serve.mjs --port ${process.env.SDPA_TEST_PORT}`,
      url: `${isolated}/web/`,
      reuseExistingServer: false,
      stdout: 'ignore',
      stderr: 'pipe',
      timeout: 20_000,
    },
    {
      command: `node scripts/serve.mjs --no-isolation --port ${process.env.SDPA_TEST_PORT_PLAIN}`,
      url: `${plain}/web/`,
      reuseExistingServer: false,
      stdout: 'ignore',
      stderr: 'pipe',
      timeout: 20_000,
    },
  ],
});
