// The package as users get it: `npm pack`, then the examples install the tarball into
// temporary copies outside the repository (so nothing resolves to the source tree):
//   examples/node/        the quickstart, generate and packed scripts, run with Node;
//   examples/typescript/  a strict TypeScript consumer: compiled against the types, then run;
//   examples/vite/        a Vite app: `vite build`, then the built site in Chromium;
//   examples/webpack/     a webpack app: `webpack --mode production`, then the page in Chromium;
//   examples/plain-html/  a static page with an import map, in Chromium.
import { test, expect } from '@playwright/test';
import { execFile } from 'node:child_process';
import { cp, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { ROOT, nodePackage, screenshotPath, startServer } from './helpers.mjs';

test.describe.configure({ mode: 'serial' });

let work;       // the temporary directory
let tarball;    // its .tgz
let packInfo;   // npm pack --json's record
let maxDefaultThreads;  // createAttention()'s default thread cap (the package's DEFAULT_MAX_THREADS)

/** Runs a command; rejects with its output when it fails. */
function run(command, args, { cwd, timeout = 120_000 } = {}) {
  return new Promise((resolve, reject) => {
    execFile(command, args, { cwd, timeout, maxBuffer: 16 << 20, env: { ...process.env, npm_config_update_notifier: 'false' } },
      (error, stdout, stderr) => {
        if (error) reject(new Error(`${command} ${args.join(' ')} (in ${cwd}) failed: ${error.message}\n${stdout}\n${stderr}`));
        else resolve({ stdout, stderr });
      });
  });
}

const npmInstall = (cwd, ...extra) =>
  run('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error', ...extra], { cwd });

/** Copies an example to the temp directory (without any node_modules or build output). */
async function copyExample(name) {
  const dest = join(work, name);
  await cp(join(ROOT, 'examples', name), dest, {
    recursive: true,
    filter: (src) => !/[\\/](node_modules|dist)([\\/]|$)/.test(src.slice(join(ROOT, 'examples', name).length)),
  });
  return dest;
}

/** Opens an example page, waits for its result, and returns it with the .wasm files fetched. */
async function runExamplePage(page, url) {
  const wasm = [];
  const errors = [];
  page.on('response', (r) => {
    if (r.url().endsWith('.wasm')) wasm.push({ path: new URL(r.url()).pathname, type: r.headers()['content-type'], status: r.status() });
  });
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(url);
  await page.waitForFunction(() => window.__example !== undefined);
  const result = await page.evaluate(() => ({
    ...window.__example, isolated: crossOriginIsolated, cores: navigator.hardwareConcurrency,
  }));
  return { result, wasm, errors };
}

/**
 * What every example page must report, in both server modes: no page error, the direct call
 * matching plain JavaScript, the same call through createAttentionWorker bitwise equal with its
 * inputs transferred, and the thread count the isolation allows, in the page and in the worker.
 */
function expectExampleResult({ result, errors }, isolation) {
  expect(errors).toEqual([]);
  expect(result.error).toBeUndefined();
  expect(result.ok).toBe(true);
  expect(result.maxError).toBeLessThan(1e-5);
  expect(result.worker).toEqual(expect.objectContaining({ ok: true, sameBits: true, detached: true }));
  expect(result.isolated).toBe(isolation);
  expect(result.threads).toBe(isolation && result.cores > 1 ? Math.min(result.cores, maxDefaultThreads) : 1);
  expect(result.worker.threads).toBe(result.threads);
  expect(result.worker.isa).toBe(result.isa);
}

/** Every .wasm the page fetched came from `path` as application/wasm. */
function expectWasmServed(wasm, path) {
  expect(wasm.length).toBeGreaterThan(0);
  for (const w of wasm) {
    expect(w.path).toMatch(path);
    expect(w.type).toBe('application/wasm');
    expect(w.status).toBe(200);
  }
}

test.beforeAll(async () => {
  maxDefaultThreads = (await nodePackage()).DEFAULT_MAX_THREADS;
  work = await mkdtemp(join(tmpdir(), 'sdpa-wasm-pack-'));
  const { stdout } = await run('npm', ['pack', '--json', '--ignore-scripts', '--pack-destination', work], { cwd: ROOT });
  [packInfo] = JSON.parse(stdout.slice(stdout.indexOf('[')));
  tarball = join(work, packInfo.filename);
});

test.afterAll(async () => {
  if (work) await rm(work, { recursive: true, force: true });
});

test('npm pack: the tarball holds the built JS, types, wasm, README and LICENSE only', async () => {
  const files = packInfo.files.map((f) => f.path).sort();
  const allowed = [
    /^package\.json$/, /^README\.md$/, /^LICENSE$/,
    /^dist\/[\w.-]+\.(js|d\.ts)$/,                       // the API and its types
    /^dist\/wasm\/[\w.-]+\.(mjs|d\.mts|wasm)$/,           // Emscripten glue, its types, the modules
    /^dist\/wasm\/[\w.-]+\.worker\.js$/,                  // the threaded build's worker script
    /^dist\/wasm\/package\.json$/,                        // marks that worker CommonJS
  ];
  expect(files.filter((f) => !allowed.some((r) => r.test(f)))).toEqual([]);
  const builds = ['sdpa', 'sdpa-mt', 'sdpa-relaxed', 'sdpa-mt-relaxed'].flatMap((b) => [`dist/wasm/${b}.mjs`, `dist/wasm/${b}.wasm`]);
  for (const needed of ['dist/index.js', 'dist/index.d.ts', 'dist/loader.js', 'dist/worker-entry.js', ...builds, 'README.md', 'LICENSE']) {
    expect(files).toContain(needed);
  }
  // Every run-time file of the built package is in it.
  const dist = (await readdir(join(ROOT, 'dist'), { recursive: true })).map((f) => `dist/${f}`);
  const runtime = dist.filter((f) => /\.(js|mjs|wasm)$/.test(f));
  expect(runtime.filter((f) => !files.includes(f))).toEqual([]);
  const summary = `npm pack: ${packInfo.filename}, ${files.length} files, ${packInfo.size} bytes packed, ` +
    `${packInfo.unpackedSize} bytes unpacked`;
  console.log(`${summary}\n  ${files.join('\n  ')}`);
  test.info().annotations.push({ type: 'tarball', description: summary });
  await writeFile(join(ROOT, 'test-results', 'npm-pack.json'), JSON.stringify(packInfo, null, 2));
  expect(packInfo.size).toBeLessThan(1 << 20);
});

test('Node: examples/node/quickstart.mjs, generate.mjs, packed.mjs, worker.mjs and commonjs.cjs run from the installed tarball', async () => {
  const app = join(work, 'node-app');
  await cp(join(ROOT, 'examples', 'node'), app, { recursive: true });
  await writeFile(join(app, 'package.json'), JSON.stringify({ name: 'sdpa-wasm-example-node', private: true, type: 'module' }, null, 2));
  await npmInstall(app, tarball);
  const { stdout: resolved } = await run(process.execPath, ['--input-type=module', '-e', "console.log(import.meta.resolve('sdpa-wasm'))"], { cwd: app });
  expect(resolved.trim()).toBe(pathToFileURL(join(app, 'node_modules', 'sdpa-wasm', 'dist', 'index.js')).href);
  // Each of the four builds' .wasm is exported by name (for tools that copy or preload it).
  const builds = ['sdpa', 'sdpa-mt', 'sdpa-relaxed', 'sdpa-mt-relaxed'];
  const { stdout: wasmPaths } = await run(process.execPath, ['--input-type=module', '-e',
    `for (const b of ${JSON.stringify(builds)}) console.log(import.meta.resolve('sdpa-wasm/' + b + '.wasm'))`], { cwd: app });
  expect(wasmPaths.trim().split('\n')).toEqual(builds.map((b) => pathToFileURL(join(app, 'node_modules', 'sdpa-wasm', 'dist', 'wasm', `${b}.wasm`)).href));

  const fromTarball = await run(process.execPath, ['quickstart.mjs'], { cwd: app, timeout: 60_000 });
  const fromRepo = await run(process.execPath, ['examples/node/quickstart.mjs'], { cwd: ROOT, timeout: 60_000 });
  const lines = fromTarball.stdout.trim().split('\n');
  expect(lines[0]).toBe('output dims [1, 8, 512, 64]');
  expect(lines).toContain('sum of weights row 100 = 1.000000');
  expect(fromTarball.stdout).toMatch(/GFLOP\/s/);
  // The same numbers as the source tree's build (everything but the timing line).
  const numbers = (s) => s.trim().split('\n').filter((l) => !/GFLOP\/s/.test(l));
  expect(numbers(fromTarball.stdout)).toEqual(numbers(fromRepo.stdout));
  console.log(`Node example from the tarball:\n  ${lines.join('\n  ')}`);

  // generate.mjs: token-by-token decoding with the KV cache, the same tokens as from the source tree.
  const args = ['--context', '300', '--tokens', '6', '--dtype', 'float16', '--window', '128', '--sinks', '--alibi'];
  const gen = await run(process.execPath, ['generate.mjs', ...args], { cwd: app, timeout: 60_000 });
  const genRepo = await run(process.execPath, ['examples/node/generate.mjs', ...args], { cwd: ROOT, timeout: 60_000 });
  const line = (out, start) => out.split('\n').find((l) => l.startsWith(start));
  expect(line(gen.stdout, 'generated:').trim().split(/\s+/)).toHaveLength(1 + 6);
  expect(line(gen.stdout, 'generated:')).toBe(line(genRepo.stdout, 'generated:'));
  expect(line(gen.stdout, 'tokens/s:')).toMatch(/^tokens\/s: \d+\.\d for the whole step/);
  // 2 layers, each [1, 2, 306, 64] keys + values in float16.
  expect(line(gen.stdout, 'cache:')).toContain(`length 306 of maxLength 306, 2 × ${2 * 306 * 128 * 2} bytes`);
  // Bad arguments: the usage line and why, exit status 2 (never a silent substitute).
  for (const [bad, why] of [[['--context', '1.5'], '--context must be an integer >= 37'], [['--tokens', '0'], '--tokens must be an integer >= 1'],
    [['--threads', 'abc'], '--threads must be an integer >= 1'], [['--dtype', 'bf16'], '--dtype must be float32, float16 or bfloat16'],
    [['--window', '0'], '--window must be an integer >= 1']]) {
    const refused = await run(process.execPath, ['generate.mjs', ...bad], { cwd: app }).then(() => null, (error) => error.message);
    expect(refused).toContain(`generate.mjs: ${why}, got`);
    expect(refused).toContain('usage: node generate.mjs');
  }
  const unknown = await run(process.execPath, ['generate.mjs', '--sinks=yes'], { cwd: app }).then(() => null, (error) => error.message);
  expect(unknown).toContain("generate.mjs: Option '--sinks' does not take an argument");
  expect(unknown).toContain('usage: node generate.mjs');

  // packed.mjs: sentences of different lengths packed without padding (sdpaVarlen), the same
  // embeddings as from the source tree, and rows equal to a padded batch's within float rounding.
  const packedRun = await run(process.execPath, ['packed.mjs', '--sentences', '24', '--threads', '1'], { cwd: app, timeout: 60_000 });
  const packedRepo = await run(process.execPath, ['examples/node/packed.mjs', '--sentences', '24', '--threads', '1'], { cwd: ROOT, timeout: 60_000 });
  const untimed = (s) => s.trim().split('\n').filter((l) => !l.startsWith('time:'));
  expect(untimed(packedRun.stdout)).toEqual(untimed(packedRepo.stdout));
  expect(packedRun.stdout).toMatch(/^packed: 24 sentences of \d+-\d+ tokens, (\d+) in all: query \[\1, 6, 64\] -> output \[\1, 6, 64\]$/m);
  const differ = Number(line(packedRun.stdout, 'padded to').match(/at most (\S+)$/)[1]);
  expect(differ).toBeLessThan(1e-5);
  expect(line(packedRun.stdout, 'time:')).toMatch(/^time: packed \d+\.\d+ ms, padded \d+\.\d+ ms/);
  const packedRefused = await run(process.execPath, ['packed.mjs', '--sentences', '0'], { cwd: app }).then(() => null, (error) => error.message);
  expect(packedRefused).toContain('packed.mjs: --sentences must be an integer >= 1, got "0"');
  expect(packedRefused).toContain('usage: node packed.mjs');

  // worker.mjs: the package's worker script found through new URL(..., import.meta.url) in the
  // installed package, a transferred call, the same bits as the direct call, then Node exits.
  const viaWorker = await run(process.execPath, ['worker.mjs'], { cwd: app, timeout: 60_000 });
  expect(viaWorker.stdout).toMatch(/^worker: output dims \[1, 16, 2048, 64\], \d+ ms, threads 1; the copies' query\.data\.length is now 0 \(transferred\)$/m);
  expect(viaWorker.stdout).toMatch(/timer fired \d+ times meanwhile \(not blocked\)/);
  expect(viaWorker.stdout).toContain('direct call on the main thread: bitwise equal');

  // commonjs.cjs: require('sdpa-wasm') from CommonJS (Node's require of ES modules), the direct
  // API and the worker.
  const viaRequire = await run(process.execPath, ['commonjs.cjs'], { cwd: app, timeout: 60_000 });
  expect(viaRequire.stdout.trim().split('\n')).toEqual([
    expect.stringMatching(/^require\('sdpa-wasm'\): output dims \[1, 2, 64, 32\], isa (simd128|relaxed-simd)$/),
    'output row 0 = value row 0 (causal): true',
    'worker: bitwise equal',
  ]);
});

test('TypeScript: examples/typescript compiles (strict; nodenext and bundler resolution; no Node or disposable lib; a Float16Array lib) against the tarball\'s types, and runs', async () => {
  const app = await copyExample('typescript');
  await npmInstall(app, tarball);
  const tsc = join(app, 'node_modules', '.bin', 'tsc');
  // src/type-checks.ts: what the types must refuse (@ts-expect-error lines: unused ones fail).
  await run(tsc, ['-p', 'tsconfig.json'], { cwd: app });
  await run(tsc, ['-p', 'tsconfig.bundler.json'], { cwd: app });
  // float16/type-checks.ts: with a lib that declares Float16Array, appends take one.
  await run(tsc, ['-p', 'tsconfig.float16.json'], { cwd: app });
  const { stdout } = await run(process.execPath, ['dist/main.js'], { cwd: app, timeout: 60_000 });
  const lines = stdout.trim().split('\n');
  expect(lines).toEqual([
    'output dims [1, 4, 64, 32], logSumExp dims [1, 4, 64]',
    'weights row 5 sums to 1.000000, keys after 5 get 0',
    'dKey dims [1, 4, 64, 32]; from saved vs recomputed: max difference 0',
    'KV cache: length 64, 65536 bytes; last row vs sdpa: max difference < 1e-5',
    'worker: bitwise equal to the direct call',
  ]);
  console.log(`TypeScript example from the tarball:\n  ${lines.join('\n  ')}`);
});

test('Vite: examples/vite builds with vite build, emits the .wasm as an asset, and runs in Chromium', async ({ page }) => {
  const app = await copyExample('vite');
  await npmInstall(app, tarball);
  const installed = JSON.parse(await readFile(join(app, 'node_modules', 'sdpa-wasm', 'package.json'), 'utf8'));
  expect(installed.version).toBe(packInfo.version);
  const build = await run(join(app, 'node_modules', '.bin', 'vite'), ['build'], { cwd: app });
  expect(build.stdout).toContain('built in');

  const assets = await readdir(join(app, 'dist', 'assets'));
  // The worker behind createAttentionWorker is bundled as a worker script of its own.
  expect(assets.some((f) => /^worker-entry-[\w-]+\.js$/.test(f))).toBe(true);
  // No unbundled copy of a build's glue: it is imported (bundled into chunks), never located by URL.
  expect(assets.filter((f) => f.endsWith('.mjs'))).toEqual([]);
  const wasmAssets = assets.filter((f) => f.endsWith('.wasm'));
  expect(wasmAssets.some((f) => /^sdpa-[\w-]+\.wasm$/.test(f) && !f.startsWith('sdpa-mt'))).toBe(true);
  // The bundle points at the emitted file with new URL(…, import.meta.url).
  const js = (await Promise.all(assets.filter((f) => f.endsWith('.js')).map((f) => readFile(join(app, 'dist', 'assets', f), 'utf8')))).join('\n');
  for (const f of wasmAssets) {
    expect(js, `${f} referenced by the bundle`).toMatch(new RegExp(`new URL\\([^)]*${f.replace(/[.-]/g, '\\$&')}[^)]*import\\.meta\\.url`));
  }

  for (const isolation of [true, false]) {
    const server = await startServer(join(app, 'dist'), { isolation });
    try {
      const shown = await runExamplePage(page, `${server.url}/`);
      expectExampleResult(shown, isolation);
      expectWasmServed(shown.wasm, /^\/assets\/sdpa(-mt)?-[\w-]+\.wasm$/);
      await expect(page.getByTestId('status')).toHaveText('Correct: sdpa-wasm matches the plain-JavaScript result.');
      if (isolation) await page.screenshot({ path: screenshotPath('09-example-vite.png') });
    } finally {
      await server.stop();
    }
  }
});

test('webpack: examples/webpack builds with no webpack configuration and runs in Chromium (direct and worker)', async ({ page }) => {
  const app = await copyExample('webpack');
  await npmInstall(app, tarball);
  const build = await run(join(app, 'node_modules', '.bin', 'webpack'), ['--mode', 'production', '--no-color'], { cwd: app });
  const log = build.stdout + build.stderr;
  expect(log).toMatch(/compiled (successfully|with \d+ warnings?)/);
  expect(log).not.toMatch(/ERROR/);
  const emitted = await readdir(join(app, 'dist'));
  expect(emitted.filter((f) => f.endsWith('.wasm')).length).toBeGreaterThanOrEqual(2);  // sdpa.wasm and sdpa-mt.wasm
  for (const isolation of [true, false]) {
    const server = await startServer(app, { isolation });
    try {
      const shown = await runExamplePage(page, `${server.url}/index.html`);
      expectExampleResult(shown, isolation);
      expectWasmServed(shown.wasm, /^\/dist\/[\w-]+\.wasm$/);
      await expect(page.getByTestId('status')).toHaveText('Correct: sdpa-wasm matches the plain-JavaScript result.');
      if (isolation) await page.screenshot({ path: screenshotPath('12-example-webpack.png') });
    } finally {
      await server.stop();
    }
  }
});

test('plain HTML: examples/plain-html runs the installed package in Chromium with an import map', async ({ page }) => {
  const app = await copyExample('plain-html');
  await npmInstall(app, tarball);
  for (const isolation of [true, false]) {
    const server = await startServer(app, { isolation });
    try {
      const shown = await runExamplePage(page, `${server.url}/index.html`);
      const { result, wasm } = shown;
      expectExampleResult(shown, isolation);
      // A threaded instance also loads the single-threaded build, which it streams decodes on
      // (js/attention.ts); without isolation only that one is loaded. The page and the worker
      // each load what they use.
      // Chromium runs relaxed SIMD: the relaxed builds.
      expect(result.isa).toBe('relaxed-simd');
      const dir = '/node_modules/sdpa-wasm/dist/wasm/';
      expect([...new Set(wasm.map((w) => w.path))].sort()).toEqual(
        isolation && result.cores > 1 ? [`${dir}sdpa-mt-relaxed.wasm`, `${dir}sdpa-relaxed.wasm`] : [`${dir}sdpa-relaxed.wasm`]);
      expectWasmServed(wasm, /^\/node_modules\/sdpa-wasm\/dist\/wasm\/sdpa(-mt)?(-relaxed)?\.wasm$/);
      await expect(page.getByTestId('status')).toHaveText('Correct: sdpa-wasm matches the plain-JavaScript result.');
      if (isolation) await page.screenshot({ path: screenshotPath('10-example-plain-html.png') });
    } finally {
      await server.stop();
    }
  }
});
