// Loads the wasm module once per JS realm, in Node and in browsers.
// The .wasm is located with `new URL(..., import.meta.url)` so that bundlers (Vite,
// webpack, Rollup) see and copy it. Under Node, Emscripten's loader would try fetch() on a
// file path, so the bytes are read from disk and handed over as wasmBinary.
import createSdpaModule, { type SdpaModule } from './wasm/sdpa.mjs';

const wasmUrl = new URL('./wasm/sdpa.wasm', import.meta.url);

let loading: Promise<SdpaModule> | null = null;

// The smallest module that uses a v128 instruction: (func (result v128) v128.const 0).
const SIMD_PROBE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 22, 1, 20, 0, 253, 12,
  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 11,
]);

const isNode = typeof process !== 'undefined' && typeof process.versions?.node === 'string';

async function load(): Promise<SdpaModule> {
  if (typeof WebAssembly !== 'object' || !WebAssembly.validate(SIMD_PROBE)) {
    throw new Error(
      'sdpa-wasm needs WebAssembly with 128-bit SIMD (Chrome/Edge 91+, Firefox 89+, Safari 16.4+, Node 16.4+); ' +
      'this environment does not support it');
  }
  if (isNode && wasmUrl.protocol === 'file:') {
    const { readFile } = await import(/* @vite-ignore */ 'node:fs/promises');
    const wasmBinary = await readFile(wasmUrl);
    return createSdpaModule({ wasmBinary });
  }
  return createSdpaModule({ locateFile: () => wasmUrl.href });
}

export function loadModule(): Promise<SdpaModule> {
  if (loading === null) {
    loading = load().catch((error: unknown) => {
      loading = null;  // a failed load (e.g. a network error) may be retried
      throw error;
    });
  }
  return loading;
}
