// Loads the wasm modules, in Node and in browsers. Four builds of one source (CMakeLists.txt):
//                        portable SIMD128          relaxed SIMD (FMA: f32x4.relaxed_madd)
//   single-threaded      sdpa.wasm                 sdpa-relaxed.wasm
//   threaded (pthreads)  sdpa-mt.wasm              sdpa-mt-relaxed.wasm
// The instruction set (`Isa`) is chosen per instance: relaxed where the engine validates it
// (Chrome/Edge 114+, Node 22+, Node 20 with --experimental-wasm-relaxed-simd) unless the caller
// asks for the portable one. A single-threaded build is loaded once per JS realm and shared by
// every instance; a threaded one once per thread count (its pool of Web Workers /
// worker_threads is sized at load time), released when the last instance using it is disposed.
// The files are located with `new URL(..., import.meta.url)` so that bundlers (Vite,
// webpack, Rollup) see and copy them. Under Node, Emscripten's loader would call fetch on
// a file path, so the bytes are read from disk and handed over as wasmBinary.
import { loaderScriptUrl, startsAsIs } from './cross-origin.js';
import type { ModuleOverrides, SdpaModule } from './wasm/sdpa.mjs';

/** The SIMD instruction set of a build. */
export type Isa = 'relaxed-simd' | 'simd128';

type Factory = (overrides: ModuleOverrides) => Promise<SdpaModule>;

/** Each build's .wasm and its Emscripten glue (imported only when that build is used). */
const BUILDS: Record<Isa, Record<'single' | 'threaded', { wasm: URL; glue: () => Promise<{ default: Factory }> }>> = {
  simd128: {
    single: { wasm: new URL('./wasm/sdpa.wasm', import.meta.url), glue: () => import('./wasm/sdpa.mjs') },
    threaded: { wasm: new URL('./wasm/sdpa-mt.wasm', import.meta.url), glue: () => import('./wasm/sdpa-mt.mjs') },
  },
  'relaxed-simd': {
    single: { wasm: new URL('./wasm/sdpa-relaxed.wasm', import.meta.url), glue: () => import('./wasm/sdpa-relaxed.mjs') },
    threaded: { wasm: new URL('./wasm/sdpa-mt-relaxed.wasm', import.meta.url), glue: () => import('./wasm/sdpa-mt-relaxed.mjs') },
  },
};

// The smallest module that uses a v128 instruction: (func (result v128) v128.const 0).
const SIMD_PROBE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 22, 1, 20, 0, 253, 12,
  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 11,
]);

// The smallest module that uses relaxed SIMD: (func (result v128) (f32x4.relaxed_madd
// (v128.const 0) (v128.const 0) (v128.const 0))); relaxed_madd is 0xfd 261 (LEB128 0x85 0x02).
const RELAXED_SIMD_PROBE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 61, 1, 59, 0,
  253, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
  253, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
  253, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
  253, 133, 2, 11,
]);

/** Whether this engine runs relaxed SIMD (f32x4.relaxed_madd). */
export function relaxedSimdAvailable(): boolean {
  return typeof WebAssembly === 'object' && WebAssembly.validate(RELAXED_SIMD_PROBE);
}

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

const THREADED_GLUE = './wasm/sdpa-mt.mjs';

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
  // Not a literal `new URL('…', import.meta.url)`: bundlers would copy the glue as an unused asset.
  const glue = new URL(/* webpackIgnore: true */ THREADED_GLUE, import.meta.url);
  const filename = fileURLToPath(glue);
  registry[key] = { require: createRequire(glue), filename, dirname: dirname(filename) };
}

function checkSimd(): void {
  if (typeof WebAssembly !== 'object' || !WebAssembly.validate(SIMD_PROBE)) {
    throw new Error(
      'sdpa-wasm needs WebAssembly with 128-bit SIMD (Chrome/Edge 91+, Firefox 89+, Safari 16.4+, Node 20+); ' +
      'this environment does not support it');
  }
}

/** A loaded module, its instruction set and the number of threads its pool supports. */
export interface ModuleHandle {
  module: SdpaModule;
  threads: number;
  isa: Isa;
  release(): void;
}

const singleThread = new Map<Isa, Promise<SdpaModule>>();
const multiThread = new Map<string, { loading: Promise<SdpaModule>; users: number }>();

function retryable(load: () => Promise<SdpaModule>, forget: () => void): Promise<SdpaModule> {
  return load().catch((error: unknown) => {
    forget();  // a failed load (e.g. a network error) may be retried
    throw error;
  });
}

/**
 * The build's module, from its glue's factory. A failure names the build's file: Emscripten's
 * own message (e.g. "Aborted(both async and sync fetching of the wasm failed)") does not.
 */
async function instantiate(create: Factory, overrides: ModuleOverrides, wasm: URL): Promise<SdpaModule> {
  try {
    const loading = create(overrides);
    const poolFailed = poolFailure(overrides);
    return await (poolFailed === null ? loading : Promise.race([loading, poolFailed]));
  } catch (error) {
    // The pool's workers, made as the factory ran, would keep running (and a Node process alive).
    (overrides as Pick<SdpaModule, 'PThread'>).PThread?.terminateAllThreads();
    throw loadError(wasm, error);
  }
}

/** The error of a build that could not be loaded: it names the build's file, then why. */
function loadError(wasm: URL, error: unknown): Error {
  const reason = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  return new Error(`sdpa-wasm: could not load its WebAssembly build from ${wasm.href}: ${reason}`, { cause: error });
}

/** A build's bytes from disk (Node), or loadError(). */
async function readBuild(wasm: URL): Promise<Uint8Array> {
  try {
    return await readNodeFile(wasm);
  } catch (error) {
    throw loadError(wasm, error);
  }
}

/**
 * A promise that rejects when a worker of the threaded build's pool reports an error while the
 * module loads (its script could not be fetched or was blocked, e.g. by a Content-Security-Policy
 * or the page's Cross-Origin-Embedder-Policy; the glue it imports could not be, or its wasm
 * instance failed; or it threw): Emscripten's loader would wait for that worker forever, or in
 * Node end the process with the error (scripts/patch-pool-worker.mjs makes the glue report the
 * first two, and leave a worker's error before it has loaded to this promise). Null where there
 * is no pool to watch (a single-threaded build). `module` is the object given to the glue's
 * factory, which the glue fills in as it loads: the pool's workers are made while the factory
 * runs. In Node they are worker_threads Workers (events by `once`, with the error itself); in a
 * browser, Workers (an ErrorEvent).
 */
function poolFailure(module: ModuleOverrides): Promise<never> | null {
  const workers = (module as Pick<SdpaModule, 'PThread'>).PThread?.unusedWorkers ?? [];
  if (workers.length === 0) return null;
  const failed = new Promise<never>((_, reject) => {
    const fail = (why: string | undefined) =>
      reject(new Error(`a worker of its thread pool failed: ${why || 'its script could not be loaded or threw'}`));
    for (const worker of workers) {
      if (isNode) (worker as NodeWorker).once('error', (error) => fail(error instanceof Error ? error.message : String(error)));
      else (worker as Worker).addEventListener('error', (event) => fail(event.message), { once: true });
    }
  });
  failed.catch(() => {});  // once the module has loaded, a later worker error is not this promise's to report
  return failed;
}

/** What poolFailure uses of a worker_threads Worker. */
interface NodeWorker {
  once(event: 'error', listener: (error: unknown) => void): void;
}

async function loadSingleThread(isa: Isa): Promise<SdpaModule> {
  const { wasm, glue } = BUILDS[isa].single;
  const overrides: ModuleOverrides = isNode && wasm.protocol === 'file:'
    ? { wasmBinary: await readBuild(wasm) }
    : { locateFile: () => wasm.href };
  const { default: create } = await glue();
  return instantiate(create, overrides, wasm);
}

async function loadMultiThread(isa: Isa, threads: number): Promise<SdpaModule> {
  if (isNode) await provideNodeGlobals();
  const { wasm, glue } = BUILDS[isa].threaded;
  const { default: create } = await glue();
  const overrides: ModuleOverrides & { sdpaWorkers: number } = { sdpaWorkers: threads - 1 };
  if (isNode && wasm.protocol === 'file:') overrides.wasmBinary = await readBuild(wasm);
  if (!startsAsIs(wasm)) {
    // The package served from another origin: the pool's workers start through a loader
    // script of this origin (cross-origin.ts), which loads the build's worker script, which
    // imports the glue from mainScriptUrlOrBlob; the .wasm is fetched from where it is.
    overrides.locateFile = (path) => (path.endsWith('.worker.js')
      ? loaderScriptUrl(new URL(path, wasm), 'classic') : new URL(path, wasm).href);
    overrides.mainScriptUrlOrBlob = new URL(wasm.pathname.replace(/\.wasm$/, '.mjs'), wasm).href;
  }
  const module = await instantiate(create, overrides, wasm);
  // Idle workers must not keep a Node process alive (dispose() terminates them anyway).
  if (isNode) for (const worker of module.PThread?.unusedWorkers ?? []) (worker as { unref?(): void }).unref?.();
  return module;
}

/** The instruction set createAttention() uses unless told otherwise: relaxed SIMD where it runs. */
export function defaultIsa(): Isa {
  return relaxedSimdAvailable() ? 'relaxed-simd' : 'simd128';
}

export async function acquireModule(threads: number, isa: Isa = defaultIsa()): Promise<ModuleHandle> {
  checkSimd();
  if (isa === 'relaxed-simd' && !relaxedSimdAvailable()) throw new Error('sdpa-wasm: this engine does not run relaxed SIMD');
  if (threads <= 1) {
    let loading = singleThread.get(isa);
    if (loading === undefined) {
      loading = retryable(() => loadSingleThread(isa), () => singleThread.delete(isa));
      singleThread.set(isa, loading);
    }
    return { module: await loading, threads: 1, isa, release: () => {} };
  }
  const key = `${isa} ${threads}`;
  let entry = multiThread.get(key);
  if (entry === undefined) {
    entry = { loading: retryable(() => loadMultiThread(isa, threads), () => multiThread.delete(key)), users: 0 };
    multiThread.set(key, entry);
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
    isa,
    release: () => {
      if (released) return;
      released = true;
      if (--current.users === 0 && multiThread.get(key) === current) {
        multiThread.delete(key);
        module.PThread?.terminateAllThreads();  // lets Node exit; the module is not reused
      }
    },
  };
}
