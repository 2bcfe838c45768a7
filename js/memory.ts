// The one place that allocates in wasm memory and reads its views.
//
// With -sALLOW_MEMORY_GROWTH, any allocation may replace the heap's buffer and leave every
// typed array made over the old one empty (length 0); Embind calls that convert a value object
// (a ProblemDesc) allocate too. So a view is never kept: `heap(module)`
// makes fresh ones from the module's current buffer, to be taken after the last allocation of
// a step and dropped before the next.
//   CallMemory   the allocations of one call, all freed by free() (callers use try/finally)
//   allocate()   one long-lived block (a KV cache's storage), freed by its owner
import type { SdpaModule } from './wasm/sdpa.mjs';

/** The wasm memory limit (-sMAXIMUM_MEMORY=2GB in CMakeLists.txt). */
export const MAX_WASM_BYTES = 2 ** 31;

/** Views of the module's current heap. */
export interface HeapViews {
  u8: Uint8Array;
  u16: Uint16Array;
  i32: Int32Array;
  f32: Float32Array;
}

export function heap(module: SdpaModule): HeapViews {
  return { u8: module.HEAPU8, u16: module.HEAPU16, i32: module.HEAP32, f32: module.HEAPF32 };
}

/**
 * `bytes` of wasm memory (16-byte aligned, as malloc returns), or a RangeError naming `fn`,
 * `what` it was for, the bytes and the limit. Sizes at or above the 2 GiB limit are refused
 * before calling malloc, which takes a 32-bit size that could wrap around to a small one.
 */
export function allocate(module: SdpaModule, bytes: number, fn: string, what: string): number {
  const address = bytes >= MAX_WASM_BYTES ? 0 : module._malloc(bytes);
  if (address === 0) {
    throw new RangeError(
      `${fn}: cannot allocate ${bytes} bytes of wasm memory for ${what}: the module's memory is limited to ` +
      `2 GiB (${MAX_WASM_BYTES} bytes), of which ${module.heapBytesInUse()} are in use`);
  }
  return address;
}

/** The allocations of one call; free() releases them all, whatever happened in between. */
export class CallMemory {
  readonly #module: SdpaModule;
  readonly #fn: string;
  readonly #addresses: number[] = [];

  constructor(module: SdpaModule, fn: string) {
    this.#module = module;
    this.#fn = fn;
  }

  /** A block of `bytes` (0 for none: returns address 0). */
  alloc(bytes: number, what: string): number {
    if (bytes === 0) return 0;
    const address = allocate(this.#module, bytes, this.#fn, what);
    this.#addresses.push(address);
    return address;
  }

  /** Fresh views: take them after the last alloc() of a step. */
  get heap(): HeapViews {
    return heap(this.#module);
  }

  free(): void {
    for (const address of this.#addresses) this.#module._free(address);
    this.#addresses.length = 0;
  }
}
