// Loads the wasm modules, in Node and in browsers.
//   - sdpa.wasm: single-threaded; loaded once per JS realm and shared by every instance.
//   - sdpa-mt.wasm: pthreads over a shared memory, for threads > 1. Loaded once per thread
//     count (its pool of Web Workers / worker_threads is sized at load time) and released
//     when the last instance using it is disposed.
// The files are located with `new URL(..., import.meta.url)` so that bundlers (Vite,
// webpack, Rollup) see and copy them. Under Node, Emscripten's loader would try fetch() on
// a file path, so the bytes are read from disk and handed over as wasmBinary.
import createSdpaModule, { type ModuleOverrides, type SdpaModule } from './wasm/sdpa.mjs';

const singleThreadWasm = new URL('./wasm/sdpa.wasm', import.meta.url);
const multiThreadWasm = new URL('./wasm/sdpa-mt.wasm', import.meta.url);

// The smallest module that uses a v128 instruction: (func (result v128) v128.const 0).
const SIMD_PROBE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 22, 1, 20, 0, 253, 12,
  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 11,
]);

const isNode = typeof process !== 'undefined' && typeof process.versions?.node === 'string';

/** Whether this environment can run the threaded build (shared memory between workers). */
export function threadsAvailable(): boolean {
  if (typeof SharedArrayBuffer !== 'function') return false;
  return isNode || (globalThis as { crossOriginIsolated?: boolean }).crossOriginIsolated === true;
}

/** Logical processors: os.availableParallelism() in Node, navigator.hardwareConcurrency elsewhere. */
export async function hardwareThreads(): Promise<number> {
  if (isNode) {
    const osName = 'node:os';
    const os = await import(/* @vite-ignore */ /* webpackIgnore: true */ osName);
    return typeof os.availableParallelism === 'function' ? os.availableParallelism() : os.cpus().length;
  }
  return (globalThis as { navigator?: { hardwareConcurrency?: number } }).navigator?.hardwareConcurrency ?? 1;
}

async function readNodeFile(url: URL): Promise<Uint8Array> {
  const fsName = 'node:fs/promises';
  const { readFile } = await import(/* @vite-ignore */ /* webpackIgnore: true */ fsName);
  return readFile(url);
}

// The CommonJS globals Emscripten's Node code expects, for src/bindings/node-globals-pre.js
// (the threaded glue must not await or import node: modules itself: bundlers put it in a
// classic worker).
async function provideNodeGlobals(): Promise<void> {
  const key = Symbol.for('sdpa-wasm/node-globals');
  const registry = globalThis as unknown as Record<symbol, unknown>;
  if (registry[key] !== undefined) return;
  const [moduleName, urlName, pathName] = ['node:module', 'node:url', 'node:path'];
  const { createRequire } = await import(/* @vite-ignore */ /* webpackIgnore: true */ moduleName);
  const { fileURLToPath } = await import(/* @vite-ignore */ /* webpackIgnore: true */ urlName);
  const { dirname } = await import(/* @vite-ignore */ /* webpackIgnore: true */ pathName);
  const glue = new URL('./wasm/sdpa-mt.mjs', import.meta.url);
  const filename = fileURLToPath(glue);
  registry[key] = { require: createRequire(glue), filename, dirname: dirname(filename) };
}

function checkSimd(): void {
  if (typeof WebAssembly !== 'object' || !WebAssembly.validate(SIMD_PROBE)) {
    throw new Error(
      'sdpa-wasm needs WebAssembly with 128-bit SIMD (Chrome/Edge 91+, Firefox 89+, Safari 16.4+, Node 16.4+); ' +
      'this environment does not support it');
  }
}

/** A loaded module and the number of threads its pool supports. */
export interface ModuleHandle {
  module: SdpaModule;
  threads: number;
  release(): void;
}

let singleThread: Promise<SdpaModule> | null = null;
const multiThread = new Map<number, { loading: Promise<SdpaModule>; users: number }>();

function retryable(load: () => Promise<SdpaModule>, forget: () => void): Promise<SdpaModule> {
  return load().catch((error: unknown) => {
    forget();  // a failed load (e.g. a network error) may be retried
    throw error;
  });
}

async function loadSingleThread(): Promise<SdpaModule> {
  const overrides: ModuleOverrides = isNode && singleThreadWasm.protocol === 'file:'
    ? { wasmBinary: await readNodeFile(singleThreadWasm) }
    : { locateFile: () => singleThreadWasm.href };
  return createSdpaModule(overrides);
}

async function loadMultiThread(threads: number): Promise<SdpaModule> {
  if (isNode) await provideNodeGlobals();
  // Imported lazily: the threaded glue is only fetched where it is used.
  const { default: create } = await import('./wasm/sdpa-mt.mjs');
  const overrides: ModuleOverrides & { sdpaWorkers: number } = { sdpaWorkers: threads - 1 };
  if (isNode && multiThreadWasm.protocol === 'file:') overrides.wasmBinary = await readNodeFile(multiThreadWasm);
  const module = await create(overrides);
  // Idle workers must not keep a Node process alive (dispose() terminates them anyway).
  if (isNode) for (const worker of module.PThread?.unusedWorkers ?? []) (worker as { unref?(): void }).unref?.();
  return module;
}

export async function acquireModule(threads: number): Promise<ModuleHandle> {
  checkSimd();
  if (threads <= 1) {
    singleThread ??= retryable(loadSingleThread, () => { singleThread = null; });
    return { module: await singleThread, threads: 1, release: () => {} };
  }
  let entry = multiThread.get(threads);
  if (entry === undefined) {
    entry = { loading: retryable(() => loadMultiThread(threads), () => multiThread.delete(threads)), users: 0 };
    multiThread.set(threads, entry);
  }
  entry.users++;
  const current = entry;
  let module: SdpaModule;
  try {
    module = await current.loading;
  } catch (error) {
    current.users--;
    throw error;
  }
  let released = false;
  return {
    module,
    threads,
    release: () => {
      if (released) return;
      released = true;
      if (--current.users === 0 && multiThread.get(threads) === current) {
        multiThread.delete(threads);
        module.PThread?.terminateAllThreads();  // lets Node exit; the module is not reused
      }
    },
  };
}
