// Shared by the browser tests: paths, the two test servers, the Node-side package, page helpers.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));
export const DIST_INDEX = join(ROOT, 'dist', 'index.js');
export const SCREENSHOTS = join(ROOT, 'test-results', 'screenshots');
/** The cross-origin isolated server (COOP/COEP) and the plain one, started by playwright.config.mjs. */
export const ISOLATED = `http://127.0.0.1:${process.env.SDPA_TEST_PORT}`;
export const PLAIN = `http://127.0.0.1:${process.env.SDPA_TEST_PORT_PLAIN}`;

export const screenshotPath = (name) => join(SCREENSHOTS, name);

/** The built package, imported in the test process (Node), as users import it. */
export async function nodePackage() {
  return import(pathToFileURL(DIST_INDEX).href);
}

/**
 * Opens the demo page and waits until every panel has been computed. Returns the list of
 * page errors and console errors seen (tests assert it stays empty).
 */
export async function openDemo(page, base = ISOLATED, path = '/web/') {
  const errors = [];
  page.on('pageerror', (error) => errors.push(`pageerror: ${error.message}`));
  page.on('console', (message) => { if (message.type() === 'error') errors.push(`console: ${message.text()}`); });
  await page.goto(`${base}${path}`);
  await page.waitForFunction(() => window.__demo?.ready === true || window.__demo?.error != null);
  const error = await page.evaluate(() => window.__demo.error);
  if (error) throw new Error(`the demo page failed to start: ${error}`);
  return errors;
}

/** Runs `action` (which changes a control) and waits until panel `name` has been recomputed. */
export async function recompute(page, name, action) {
  const before = await page.evaluate((n) => window.__demo.version[n], name);
  await action();
  await page.waitForFunction(([n, v]) => window.__demo.version[n] > v, [name, before]);
}

/** Float32Array (or array of numbers) → plain array, for comparing with what the page returns. */
export const plainArray = (a) => Array.from(a);

/** The indices where two number arrays differ (Object.is), at most `limit` of them. */
export function bitDifferences(got, expected, limit = 5) {
  const out = [];
  if (got.length !== expected.length) return [`length ${got.length} vs ${expected.length}`];
  for (let i = 0; i < got.length && out.length < limit; i++) {
    if (!Object.is(got[i], expected[i])) out.push(`[${i}] ${got[i]} vs ${expected[i]}`);
  }
  return out;
}

/**
 * Starts scripts/serve.mjs on a free port for `root` (isolation on unless told otherwise; `cdn`:
 * readable and embeddable from any origin, as a CDN serves; `csp`: a Content-Security-Policy on
 * every response).
 * Returns { url, stop() }.
 */
export function startServer(root, { isolation = true, cdn = false, csp = null } = {}) {
  const args = [join(ROOT, 'scripts', 'serve.mjs'), '--root', root, '--port', '0'];
  if (!isolation) args.push('--no-isolation');
  if (cdn) args.push('--cdn');
  if (csp !== null) args.push('--csp', csp);
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => { child.kill(); reject(new Error(`serve.mjs did not start: ${out}`)); }, 10_000);
    child.stdout.on('data', (chunk) => {
      out += chunk;
      const m = /at (http:\/\/\S+?)\/? /.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve({
          url: m[1],
          stop: () => new Promise((done) => { child.once('exit', done); child.kill('SIGTERM'); }),
        });
      }
    });
    child.stderr.on('data', (chunk) => { out += chunk; });
    child.on('exit', (code) => { clearTimeout(timer); reject(new Error(`serve.mjs exited (${code}): ${out}`)); });
  });
}
