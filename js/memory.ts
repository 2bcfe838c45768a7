// The one place that allocates in wasm memory, reads its views, and counts what each Attention
// instance holds there.
//
// With -sALLOW_MEMORY_GROWTH, any allocation may replace the heap's buffer and leave every
// typed array made over the old one empty (length 0); Embind calls that allocate (a class's
// constructor) may grow it too. So a view is never kept: `heap(module)`
// makes fresh ones from the module's current buffer, to be taken after the last allocation of
// a step and dropped before the next.
//   MemoryAccount  one instance's bytes in use, its peak and its limit (maxMemoryBytes)
//   CallMemory     the allocations of one call, all requested at once (refused before any is
//                  made if they would pass a limit) and all freed by free() (try/finally)
//   allocateLongLived()  one block that outlives a call (a KV cache's storage), freed by its owner
import type { SdpaModule } from './wasm/sdpa.mjs';

/** The wasm memory limit of every build (-sMAXIMUM_MEMORY=2GB in CMakeLists.txt). */
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

/** Named block sizes in bytes, e.g. { query: 4096, key: 8192 }: one request. */
export type ByteRequest = Record<string, number>;

function total(request: ByteRequest): number {
  return Object.values(request).reduce((a, b) => a + b, 0);
}

function itemised(request: ByteRequest): string {
  const parts = Object.entries(request).filter(([, bytes]) => bytes > 0);
  return parts.length > 1 ? ` (${parts.map(([what, bytes]) => `${what} ${bytes} bytes`).join(' + ')})` : '';
}

/**
 * What one Attention instance holds in wasm memory: its KV caches' storage and the blocks of
 * the call running now. `limitBytes` is AttentionOptions.maxMemoryBytes (default: the build's
 * limit, MAX_WASM_BYTES); requests that would pass it are refused before anything is allocated.
 */
export class MemoryAccount {
  readonly limitBytes: number;
  #inUse = 0;
  #peak = 0;

  constructor(limitBytes: number = MAX_WASM_BYTES) {
    this.limitBytes = limitBytes;
  }

  get bytesInUse(): number {
    return this.#inUse;
  }

  get peakBytes(): number {
    return this.#peak;
  }

  /**
   * Throws a RangeError naming `fn`, the bytes `request` needs (itemised) and the limit it
   * would pass: this instance's limit, or the module's memory (shared by the instances on one
   * build) with what is allocated there already. Allocates nothing.
   */
  check(module: SdpaModule, fn: string, request: ByteRequest): void {
    const bytes = total(request);
    if (this.#inUse + bytes > this.limitBytes) {
      const limit = this.limitBytes === MAX_WASM_BYTES ? '2 GiB, the wasm memory limit' : 'maxMemoryBytes';
      throw new RangeError(
        `${fn}: needs ${bytes} bytes of wasm memory${itemised(request)}, more than is left of this instance's ` +
        `limit of ${this.limitBytes} bytes (${limit}), of which ${this.#inUse} are in use`);
    }
    const moduleInUse = module.heapBytesInUse();
    if (moduleInUse + bytes > MAX_WASM_BYTES) {
      throw new RangeError(
        `${fn}: needs ${bytes} bytes of wasm memory${itemised(request)}, more than is left: the module's memory ` +
        `is limited to 2 GiB (${MAX_WASM_BYTES} bytes), of which ${moduleInUse} are in use`);
    }
  }

  add(bytes: number): void {
    this.#inUse += bytes;
    if (this.#inUse > this.#peak) this.#peak = this.#inUse;
  }

  remove(bytes: number): void {
    this.#inUse -= bytes;
  }
}

/**
 * The blocks of `request` (bytes 0: address 0), each 16-byte aligned as malloc returns, or a
 * RangeError: from account.check() before anything is allocated, or, should malloc still fail
 * (a fragmented heap), after freeing what this request had allocated.
 */
function allocateAll<R extends ByteRequest>(module: SdpaModule, account: MemoryAccount, fn: string,
  request: R): { [K in keyof R]: number } {
  account.check(module, fn, request);
  const addresses = {} as { [K in keyof R]: number };
  const made: number[] = [];
  for (const what of Object.keys(request) as (keyof R & string)[]) {
    const bytes = request[what];
    const address = bytes === 0 ? 0 : module._malloc(bytes);
    if (bytes !== 0 && address === 0) {
      for (const a of made) module._free(a);
      throw new RangeError(
        `${fn}: cannot allocate ${bytes} bytes of wasm memory for ${what}: the module's memory is limited to ` +
        `2 GiB (${MAX_WASM_BYTES} bytes), of which ${module.heapBytesInUse()} are in use`);
    }
    if (address !== 0) made.push(address);
    addresses[what] = address;
  }
  account.add(total(request));
  return addresses;
}

/** Long-lived blocks (a KV cache's storage), counted in `account` until freeLongLived(). */
export const allocateLongLived = allocateAll;

export function freeLongLived(module: SdpaModule, account: MemoryAccount, addresses: number[], bytes: number): void {
  for (const address of addresses) if (address !== 0) module._free(address);
  account.remove(bytes);
}

/**
 * Bytes to add to a block that receives copies at placeCopy()'s addresses.
 *
 * A copy from a JavaScript array into wasm memory (TypedArray.set) ran 2.5 times slower when the
 * destination's address was 0 to about 16 bytes past the source's, modulo 4 KiB (a streamed
 * decode's sdpa(), AMD EPYC Zen 4): the core takes the copy's loads for reloads of its own
 * recent stores ("4K aliasing"). Where a block landed was luck, and changed with anything that
 * moved the heap's blocks. JavaScript does not tell an array's address, only its byteOffset in
 * its buffer, and large buffers start at or a few bytes past a 4 KiB page boundary. So each copy
 * goes 2 KiB from the source's byteOffset modulo 4 KiB: far from that window whatever the
 * buffer's offset in its page, below 2 KiB.
 */
export const COPY_PLACEMENT_SLACK = 4096;

/** Where in `block` (COPY_PLACEMENT_SLACK bytes more than the data) to copy `source` to. */
export function placeCopy(block: number, source: ArrayBufferView): number {
  return block + ((source.byteOffset + 2048 - block) & 4095);
}

/** The allocations of one call; free() releases them all, whatever happened in between. */
export class CallMemory {
  readonly #module: SdpaModule;
  readonly #account: MemoryAccount;
  readonly #fn: string;
  readonly #addresses: number[] = [];
  #bytes = 0;

  constructor(module: SdpaModule, account: MemoryAccount, fn: string) {
    this.#module = module;
    this.#account = account;
    this.#fn = fn;
  }

  /**
   * Every block the call needs, in one request: refused with a RangeError (bytes needed, the
   * limit) before any is allocated if they would not fit.
   */
  allocate<R extends ByteRequest>(request: R): { [K in keyof R]: number } {
    const addresses = allocateAll(this.#module, this.#account, this.#fn, request);
    for (const address of Object.values(addresses)) if (address !== 0) this.#addresses.push(address);
    this.#bytes += total(request);
    return addresses;
  }

  get module(): SdpaModule {
    return this.#module;
  }

  /** Fresh views: take them after the last allocation of a step. */
  get heap(): HeapViews {
    return heap(this.#module);
  }

  free(): void {
    for (const address of this.#addresses) this.#module._free(address);
    this.#addresses.length = 0;
    this.#account.remove(this.#bytes);
    this.#bytes = 0;
  }
}
