// A threaded build that cannot start: createAttention() rejects naming the build and why, rather
// than waiting forever or ending the process, and leaves nothing running (the process ends
// without dispose()). Each case runs in a Node process of its own (this run's wasm flags, so the
// same build) over a copy of dist/ with one thing broken in both threaded builds:
//   - a pool worker's wasm instance fails: Emscripten's worker script went on as if loaded, and
//     the first call then waited for that thread forever;
//   - a pool worker cannot import the glue: an error of the worker thread;
//   both now errors of the worker that the loader turns into the load's rejection
//   (scripts/patch-pool-worker.mjs; the glue's own handler rethrew such an error on the main
//   thread, ending the process; in a browser the import's was silent: loading.spec.mjs);
//   - the .wasm is not one: the pool's workers, made before, are terminated (they kept the
//     process alive).
import { spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const DIST = fileURLToPath(new URL('../../dist', import.meta.url));
const THREADED = ['sdpa-mt', 'sdpa-mt-relaxed'];
const WASM_FLAGS = process.execArgv.filter((flag) => flag.includes('wasm'));
// Loads and starts in about a second; a load that waits for its pool is still waiting then.
const CHILD_LIMIT_MS = 60_000;

const LOAD = `
import { createAttention } from './dist/index.js';
try {
  const attn = await createAttention({ threads: 2 });
  console.log(JSON.stringify({ loaded: attn.isa }));
  attn.dispose();
} catch (error) {
  console.log(JSON.stringify({ name: error.constructor.name, message: error.message }));
}
`;

/**
 * How a new process running createAttention({ threads: 2 }) over dist/, with `breakIt(dir)` done
 * to its copy, ended: its exit status (null and a signal: killed at CHILD_LIMIT_MS), what the call
 * gave (the one JSON line it printed, or null) and its stderr.
 */
function loadBroken(breakIt) {
  const root = mkdtempSync(join(tmpdir(), 'sdpa-loading-'));
  try {
    cpSync(DIST, join(root, 'dist'), { recursive: true });
    writeFileSync(join(root, 'package.json'), '{ "type": "module" }\n');
    writeFileSync(join(root, 'load.mjs'), LOAD);
    breakIt(join(root, 'dist', 'wasm'));
    const child = spawnSync(process.execPath, [...WASM_FLAGS, 'load.mjs'], { cwd: root, encoding: 'utf8', timeout: CHILD_LIMIT_MS });
    const lines = child.stdout.trim().split('\n').filter((line) => line.startsWith('{'));
    return { status: child.status, signal: child.signal, outcome: lines.length === 1 ? JSON.parse(lines[0]) : null, stderr: child.stderr };
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

/** Replaces the one `from` in `file` (a threaded build's file) by `to`. */
function replaceOnce(file, from, to) {
  const text = readFileSync(file, 'utf8');
  expect(text.split(from).length - 1).toBe(1);
  writeFileSync(file, text.replace(from, to));
}

/** The outcome of a load that rejected, naming the build and then `why`, in a process that ended by itself. */
const rejected = (why) => ({
  status: 0, signal: null, stderr: expect.any(String),
  outcome: {
    name: 'Error',
    message: expect.stringMatching(new RegExp(
      `^sdpa-wasm: could not load its WebAssembly build from file://.*/dist/wasm/sdpa-mt(-relaxed)?\\.wasm: ${why}`)),
  },
});

test('a pool worker that cannot import the glue: the load rejects naming it, and the process ends by itself', () => {
  const result = loadBroken((wasm) => {
    for (const build of THREADED) replaceOnce(join(wasm, `${build}.worker.js`), `import("./${build}.mjs")`, 'import("./no-such-glue.mjs")');
  });
  expect(result).toEqual(rejected('Error: a worker of its thread pool failed: .*no-such-glue\\.mjs'));
});

test('a pool worker whose wasm instance fails: the load rejects naming why, rather than the first call waiting for it', () => {
  const result = loadBroken((wasm) => {
    for (const build of THREADED) {
      replaceOnce(join(wasm, `${build}.worker.js`), 'new WebAssembly.Instance(Module["wasmModule"],info)',
        '(()=>{throw new Error("no instance, for this test")})()');
    }
  });
  expect(result).toEqual(rejected('Error: a worker of its thread pool failed: no instance, for this test'));
});

test('a threaded .wasm that is not one: the load rejects naming the build, and the pool\'s workers do not keep the process alive', () => {
  const result = loadBroken((wasm) => {
    for (const build of THREADED) writeFileSync(join(wasm, `${build}.wasm`), readFileSync(join(wasm, `${build}.wasm`)).subarray(0, 100));
  });
  expect(result).toEqual(rejected('\\S'));
});

test('the copies load as they are (the cases above break only what they say)', () => {
  const result = loadBroken(() => {});
  expect(result).toEqual({ status: 0, signal: null, stderr: '', outcome: { loaded: expect.stringMatching(/^(simd128|relaxed-simd)$/) } });
});
