// The browsers the engine tests drive, behind one small interface:
//   const browser = await launchFirefox() or launchWebKit();
//   const page = await browser.open(url);   // a page at url
//   await page.run(fn, ...args);             // fn(env, ...args) in the page (page-cases.mjs); past
//                                            // PAGE_CALL_LIMIT it throws, saying where the page was
//                                            // and the errors it reported
//   page.errors                              // uncaught errors the page reported (Firefox)
//   await page.close(); await browser.close();
// Firefox: Debian's firefox-esr through WebDriver BiDi (puppeteer-core). WebKit: WebKitGTK's
// MiniBrowser through WebKitWebDriver (classic WebDriver over HTTP), on a virtual X display
// (Xvfb) that this module starts, since WebKitGTK draws with GTK even when nobody looks, with
// SharedArrayBuffer on for cross-origin isolated pages, as in Safari.
import { spawn } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { createServer } from 'node:net';
import puppeteer from 'puppeteer-core';

export const TIMEOUT = 600_000;  // a test; a hung page fails its test, not the run
/**
 * A call into a page that has not answered by then throws, with the step the page's functions
 * last reported (globalThis.__pageProgress, set by page-cases.mjs) where the browser can still be
 * asked (Firefox; classic WebDriver runs one command at a time). The slowest call takes about 20 s.
 */
export const PAGE_CALL_LIMIT = 300_000;

/**
 * `call()`'s result, or past PAGE_CALL_LIMIT an Error naming `what`, the page's last step and the
 * errors it reported meanwhile (`errors`, page.errors: e.g. a nested worker's failure; null where
 * the driver reports none).
 */
async function guarded(what, call, progress, errors = null) {
  const late = Symbol('late');
  let timer;
  const limit = new Promise((resolve) => { timer = setTimeout(() => resolve(late), PAGE_CALL_LIMIT); });
  try {
    const outcome = await Promise.race([call(), limit]);
    if (outcome !== late) return outcome;
  } finally {
    clearTimeout(timer);
  }
  const where = await Promise.race([progress(), new Promise((resolve) => setTimeout(() => resolve('(no answer)'), 10_000))]).catch(String);
  const reported = errors === null ? '' : errors.length > 0 ? `; the page reported: ${errors.join(' | ')}` : '; the page reported no error';
  throw new Error(`${what}: no answer from the page in ${PAGE_CALL_LIMIT / 1000} s; its last step: ${where}${reported}`);
}

export const FIREFOX = process.env.FIREFOX_PATH ?? '/usr/bin/firefox-esr';
export const WEBKIT_DRIVER = process.env.WEBKIT_DRIVER_PATH ?? '/usr/bin/WebKitWebDriver';
export const MINIBROWSER = process.env.WEBKIT_MINIBROWSER_PATH ??
  readdirSync('/usr/lib').map((dir) => `/usr/lib/${dir}/webkit2gtk-4.1/MiniBrowser`).find(existsSync) ??
  '/usr/lib/x86_64-linux-gnu/webkit2gtk-4.1/MiniBrowser';

// In the page: builds `env` (page-cases.mjs) and calls the function whose source is `source`.
async function inPage(source, args) {
  const root = '/tests/conformance/onnx-attention/';
  const get = async (path) => {
    const response = await fetch(root + path);
    if (!response.ok) throw new Error(`GET ${root}${path}: ${response.status}`);
    return response;
  };
  const env = {
    load: (path) => import(path),
    io: {
      readText: async (path) => (await get(path)).text(),
      readBytes: async (path) => new Uint8Array(await (await get(path)).arrayBuffer()),
    },
  };
  // eslint-disable-next-line no-new-func
  const fn = new Function(`return (${source})`)();
  return fn(env, ...args);
}

/** Firefox ESR; `prefs` are about:config preferences for this run. */
export async function launchFirefox({ prefs } = {}) {
  if (!existsSync(FIREFOX)) throw new Error(`${FIREFOX} is missing: bash scripts/setup-firefox.sh installs firefox-esr`);
  const browser = await puppeteer.launch({
    browser: 'firefox', executablePath: FIREFOX, headless: true, protocolTimeout: TIMEOUT,
    ...(prefs ? { extraPrefsFirefox: prefs } : {}),
  });
  return {
    name: 'Firefox',
    version: await browser.version(),
    async open(url) {
      const page = await browser.newPage();
      const errors = [];
      page.on('pageerror', (error) => errors.push(`pageerror: ${error.message}`));
      page.on('console', (message) => { if (message.type() === 'error') errors.push(`console: ${message.text()}`); });
      await page.goto(url);
      const progress = () => page.evaluate(() => String(globalThis.__pageProgress ?? '(none reported)'));
      return {
        errors,
        run: (fn, ...args) => guarded(fn.name || 'a page function', () => page.evaluate(inPage, fn.toString(), args), progress, errors),
        close: () => page.close(),
      };
    },
    close: () => browser.close(),
  };
}

function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** Starts Xvfb on a free display: { display, stop() }. */
function startXvfb() {
  const child = spawn('Xvfb', ['-displayfd', '3', '-screen', '0', '1280x1024x24', '-nolisten', 'tcp'],
    { stdio: ['ignore', 'ignore', 'pipe', 'pipe'] });
  return new Promise((resolve, reject) => {
    let out = '', err = '';
    const timer = setTimeout(() => { child.kill(); reject(new Error(`Xvfb did not start: ${err}`)); }, 20_000);
    child.stderr.on('data', (chunk) => { err += chunk; });
    child.stdio[3].on('data', (chunk) => {
      out += chunk;
      if (out.includes('\n')) {
        clearTimeout(timer);
        resolve({ display: `:${out.trim()}`, stop: () => new Promise((done) => { child.once('exit', done); child.kill(); }) });
      }
    });
    child.on('error', (error) => { clearTimeout(timer); reject(error); });
    child.on('exit', (code) => { clearTimeout(timer); reject(new Error(`Xvfb exited (${code}): ${err}`)); });
  });
}

/**
 * WebKitGTK's MiniBrowser, one window (each open() navigates it). `env`: more environment for
 * the browser's processes (e.g. JavaScriptCore's JSC_* options).
 */
export async function launchWebKit({ env: extraEnv = {} } = {}) {
  for (const path of [WEBKIT_DRIVER, MINIBROWSER]) {
    if (!existsSync(path)) throw new Error(`${path} is missing: bash scripts/setup-webkit.sh installs webkit2gtk-driver and Xvfb`);
  }
  const xvfb = await startXvfb();
  const port = await freePort();
  // Safari gives a cross-origin isolated page SharedArrayBuffer (so threads); WebKitGTK only with
  // this JavaScriptCore option, which its web processes read from the environment.
  const env = { ...process.env, DISPLAY: xvfb.display, JSC_useSharedArrayBuffer: '1', ...extraEnv };
  const driver = spawn(WEBKIT_DRIVER, [`--port=${port}`], { stdio: ['ignore', 'ignore', 'pipe'], env });
  let driverLog = '';
  driver.stderr.on('data', (chunk) => { driverLog = (driverLog + chunk).slice(-4000); });
  const call = async (method, path, body) => {
    const response = await fetch(`http://127.0.0.1:${port}${path}`, {
      method, headers: { 'content-type': 'application/json' }, ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      signal: AbortSignal.timeout(TIMEOUT),
    });
    const json = await response.json();
    if (!response.ok) throw new Error(`WebDriver ${method} ${path}: ${JSON.stringify(json.value ?? json)} ${driverLog}`);
    return json.value;
  };
  try {
    for (let tries = 0; ; tries++) {
      try {
        if ((await call('GET', '/status')).ready) break;
      } catch (error) {
        if (tries > 100) throw error;
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const session = await call('POST', '/session', {
      capabilities: { alwaysMatch: { 'webkitgtk:browserOptions': { binary: MINIBROWSER, args: ['--automation'] } } },
    });
    const id = session.sessionId;
    await call('POST', `/session/${id}/timeouts`, { script: TIMEOUT, pageLoad: 60_000 });
    return {
      name: 'WebKit',
      version: `${session.capabilities.browserName} ${session.capabilities.browserVersion}`,
      async open(url) {
        await call('POST', `/session/${id}/url`, { url });
        return {
          errors: [],  // classic WebDriver reports no page errors; failures come back through run()
          async run(fn, ...args) {
            const result = await guarded(fn.name || 'a page function', () => call('POST', `/session/${id}/execute/async`, {
              script: `const done = arguments[arguments.length - 1];
                (${inPage})(arguments[0], arguments[1]).then((value) => done({ value }), (error) => done({ error: String(error) + (error && error.stack ? '\\n' + error.stack : '') }));`,
              args: [fn.toString(), args],
            }), async () => 'not available (WebDriver runs one command at a time)');
            if ('error' in result) throw new Error(`in the page: ${result.error}`);
            return result.value;
          },
          close: async () => {},
        };
      },
      async close() {
        await call('DELETE', `/session/${id}`).catch(() => {});
        driver.kill();
        await xvfb.stop();
      },
    };
  } catch (error) {
    driver.kill();
    await xvfb.stop();
    throw error;
  }
}
