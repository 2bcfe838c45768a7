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
//   withTemporaryInt32()  small arrays a call's request is sized from, freed before the request
//   writeFloats()  an input's values as float32 at an address (a long Float16Array as raw halves,
//                  widened there by the module); writeFloatRuns() the same for runs of it, one
//                  after another (a 'bshd' slice's rows); placeCopy() where a streamed copy lands
import { halfBitsOf, isFloat16Array } from './typed-arrays.js';
import type { Float16ArrayType } from './types.js';
import type { InputData } from './validate.js';
import type { SdpaModule } from './wasm/sdpa.mjs';

/** The wasm memory limit of every build (-sMAXIMUM_MEMORY=2GB in CMakeLists.txt). */
export const MAX_WASM_BYTES = 2 ** 31;
/** Room for malloc beside a block: its chunk headers and memory growth by whole 64 KiB pages. */
const MALLOC_SLACK = 2 ** 16;

/** Views of the module's current heap, and the writes of inputs into it (methods: call them on the object). */
export class HeapViews {
  readonly u8: Uint8Array;
  readonly u16: Uint16Array;
  readonly i32: Int32Array;
  readonly f32: Float32Array;
  readonly #module: SdpaModule;

  constructor(module: SdpaModule) {
    this.#module = module;
    this.u8 = module.HEAPU8;
    this.u16 = module.HEAPU16;
    this.i32 = module.HEAP32;
    this.f32 = module.HEAPF32;
  }

  /** writeFloats() into this module's memory: an input's values as float32 at a byte address. */
  writeFloats(address: number, data: InputData): void {
    writeFloats(this.#module, address, data);
  }

  /** writeFloatRuns() into this module's memory: runs of an input's values, one after another from a byte address. */
  writeFloatRuns(address: number, data: InputData, runs: number, runLength: number, runStart: (run: number) => number): void {
    writeFloatRuns(this.#module, address, data, runs, runLength, runStart);
  }
}

export const heap = (module: SdpaModule): HeapViews => new HeapViews(module);

/** Named block sizes in bytes, e.g. { query: 4096, key: 8192 }: one request. */
export type ByteRequest = Record<string, number>;

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
   * Throws a RangeError naming `fn`, the `bytes` that `request` adds up to (itemised) and the
   * limit it would pass: this instance's limit, or the module's memory (shared by the instances
   * on one build) with what is allocated there already. Keeps nothing allocated (near the
   * module's 2 GiB it asks malloc for the block and gives it back, which may grow the memory:
   * take heap views after it).
   */
  check(module: SdpaModule, fn: string, request: ByteRequest, bytes: number, purpose = ''): void {
    const refusal = this.refusal(module, fn, request, bytes, purpose);
    if (refusal !== null) throw new RangeError(refusal);
  }

  /**
   * check()'s message, or null where check() would pass. `purpose` follows "needs N bytes of
   * wasm memory" (e.g. " to run one (batch, KV head) at a time"): for a call's smaller way of running.
   */
  refusal(module: SdpaModule, fn: string, request: ByteRequest, bytes: number, purpose = ''): string | null {
    if (this.#inUse + bytes > this.limitBytes) {
      const limit = this.limitBytes === MAX_WASM_BYTES ? '2 GiB, the wasm memory limit' : 'maxMemoryBytes';
      return `${fn}: needs ${bytes} bytes of wasm memory${purpose}${itemised(request)}, more than is left of this instance's ` +
        `limit of ${this.limitBytes} bytes (${limit}), of which ${this.#inUse} are in use`;
    }
    // The module has at most its memory's size in use: with room for the block beside all of it
    // (and MALLOC_SLACK for malloc's headers and its growth in 64 KiB pages) there is nothing
    // to ask (the call into the module cost a small call 2% of its time).
    if (module.HEAPU8.length + allocationSpan(request) + MALLOC_SLACK <= MAX_WASM_BYTES) return null;
    const moduleInUse = module.heapBytesInUse();
    const refused = `${fn}: needs ${bytes} bytes of wasm memory${purpose}${itemised(request)}, more than is left: the module's memory ` +
      `is limited to 2 GiB (${MAX_WASM_BYTES} bytes), of which ${moduleInUse} are in use`;
    if (moduleInUse + bytes > MAX_WASM_BYTES) return refused;
    // Near the ceiling the sum is not enough: the module's static data and stack (about 5 MB)
    // and malloc's own bookkeeping and fragmentation count too. So the block allocateAll() would
    // ask for is asked for here, and given back: where malloc cannot give it, this is a refusal
    // (and a call with a smaller way of running, CallMemory.fits(), takes that way).
    const trial = module._malloc(allocationSpan(request));
    if (trial === 0) return `${refused} (no free block of that size)`;
    module._free(trial);
    return null;
  }

  add(bytes: number): void {
    this.#inUse += bytes;
    if (this.#inUse > this.#peak) this.#peak = this.#inUse;
  }

  remove(bytes: number): void {
    this.#inUse -= bytes;
  }
}

/** The parts of a request (bytes 0: address 0) and the one allocation that holds them. */
export interface Allocation<R extends ByteRequest> {
  /** The block to free (0 when every part is empty); the parts start at its first 64-byte boundary. */
  block: number;
  /** The request's bytes, as counted in its MemoryAccount (without the parts' padding). */
  bytes: number;
  addresses: { [K in keyof R]: number };
}

/**
 * Where parts start: malloc's blocks are only 8-byte aligned (Emscripten 3.1.6's dlmalloc), and
 * a 16-byte SIMD load from an address 8 bytes off crosses a cache line once in four.
 */
const PART_ALIGNMENT = 64;

/** A part's bytes rounded up to PART_ALIGNMENT, so that the next part starts aligned too. */
function paddedBytes(bytes: number): number {
  return Math.ceil(bytes / PART_ALIGNMENT) * PART_ALIGNMENT;
}

/** The bytes `request` adds up to, as counted in a MemoryAccount (a loop: no array on each call's path). */
function requestBytes(request: ByteRequest): number {
  let bytes = 0;
  for (const what in request) bytes += request[what];
  return bytes;
}

/**
 * The bytes of the one malloc block allocateAll() asks for `request`: its parts, each padded to
 * PART_ALIGNMENT, and up to PART_ALIGNMENT - 8 bytes to reach the first boundary (malloc's
 * blocks are 8-byte aligned); 0 when every part is empty.
 */
function allocationSpan(request: ByteRequest): number {
  let span = 0;
  for (const what in request) span += paddedBytes(request[what]);
  return span === 0 ? 0 : span + PART_ALIGNMENT - 8;
}

/**
 * The parts of `request` in one block of wasm memory, in the request's order, each starting
 * on a 64-byte boundary; or a RangeError, from account.check() before anything is allocated,
 * or should malloc still fail (a fragmented heap). One malloc, not one per part: a small call's
 * own cost is mostly such bookkeeping.
 */
function allocateAll<R extends ByteRequest>(module: SdpaModule, account: MemoryAccount, fn: string,
  request: R, purpose = ''): Allocation<R> {
  const bytes = requestBytes(request);
  account.check(module, fn, request, bytes, purpose);
  // Below 2^32 bytes: check() holds `bytes` to 2 GiB at most.
  const span = allocationSpan(request);
  const block = span === 0 ? 0 : module._malloc(span);
  if (span !== 0 && block === 0) {
    throw new RangeError(
      `${fn}: cannot allocate ${bytes} bytes of wasm memory${purpose}${itemised(request)}: the module's memory is limited to ` +
      `2 GiB (${MAX_WASM_BYTES} bytes), of which ${module.heapBytesInUse()} are in use`);
  }
  const addresses = {} as { [K in keyof R]: number };
  let offset = (PART_ALIGNMENT - block % PART_ALIGNMENT) % PART_ALIGNMENT;
  for (const what in request) {
    addresses[what] = request[what] === 0 ? 0 : block + offset;
    offset += paddedBytes(request[what]);
  }
  account.add(bytes);
  return { block, bytes, addresses };
}

/**
 * Runs `use` with copies of small Int32Arrays in wasm memory (their addresses, in order), freed
 * when it returns or throws: for a call whose request is sized from them by the module
 * (sdpaVarlen's scratch follows each sequence's length) before the call makes it. Not counted in
 * any MemoryAccount: they are freed before that request, which holds them again and is checked
 * whole against the limit, so a refusal names every block the call needs.
 */
export function withTemporaryInt32<T>(module: SdpaModule, fn: string, arrays: Int32Array[], use: (addresses: number[]) => T): T {
  const bytes = arrays.reduce((sum, a) => sum + a.byteLength, 0);
  // Past the module's memory it cannot fit, and malloc's size is 32-bit (2^32 bytes would wrap to 0).
  const block = bytes > MAX_WASM_BYTES ? 0 : module._malloc(Math.max(bytes, 4));
  if (block === 0) {
    throw new RangeError(`${fn}: cannot allocate ${bytes} bytes of wasm memory: the module's memory is limited to ` +
      `2 GiB (${MAX_WASM_BYTES} bytes), of which ${module.heapBytesInUse()} are in use`);
  }
  try {
    const { i32 } = heap(module);  // malloc may have grown the memory
    const addresses: number[] = [];
    let at = block;
    for (const a of arrays) {
      i32.set(a, at >>> 2);
      addresses.push(at);
      at += a.byteLength;
    }
    return use(addresses);
  } finally {
    module._free(block);
  }
}

/** Long-lived parts (a KV cache's storage), counted in `account` until freeLongLived(). */
export const allocateLongLived = allocateAll;

export function freeLongLived(module: SdpaModule, account: MemoryAccount, allocation: { block: number; bytes: number }): void {
  if (allocation.block !== 0) module._free(allocation.block);
  account.remove(allocation.bytes);
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

/**
 * A Float16Array of at least this many elements is written into wasm memory as raw halves and
 * widened there (writeFloats, writeFloatRuns); a shorter one by set(). The two took the same time
 * at 32 to 64 elements in Chromium, 64 to 128 in Firefox and WebKit (the call into the module
 * against set()'s per-element cost; docs/performance-log.md, 2026-12-06); at 256 the raw copy
 * took half the time or less.
 */
export const WIDEN_IN_WASM_MIN_ELEMENTS = 128;

/** Whether writeFloats writes `count` elements of `data` as raw halves into the upper half of their block (then widens them there). */
const widensInWasm = (data: InputData, count: number): boolean => count >= WIDEN_IN_WASM_MIN_ELEMENTS && isFloat16Array(data);

/**
 * Writes `data`'s values as float32 at byte `address` (a multiple of 4) of wasm memory, `data.length`
 * floats. A Float32Array is copied. A typed array's set() from a Float16Array widens element by
 * element, several times the time of a float32 copy (4-8x in Chromium, Firefox and WebKit:
 * bench/float16-inputs.mjs, the README's numbers); so a long one is copied as raw
 * halves (a plain copy of its bytes) into the upper half of the block and widened in place by the
 * module (src/math/f16-f32-cvt-wasmsimd.h, f16_widen_in_place): exactly, the floats set() writes
 * (a NaN keeps its payload there, where set() writes a NaN of the engine's choosing). Allocates
 * nothing (heap views stay valid).
 */
export function writeFloats(module: SdpaModule, address: number, data: InputData): void {
  if (widensInWasm(data, data.length)) {
    module.HEAPU16.set(halfBitsOf(data as Float16ArrayType), (address + 2 * data.length) >>> 1);
    module.widenHalvesInPlace(address, data.length);
  } else {
    module.HEAPF32.set(data, address >>> 2);
  }
}

/**
 * writeFloats of `runs` runs of `runLength` elements of `data` (run r from element runStart(r)),
 * one after another from byte `address`: a dense block of runs·runLength floats (a slice of a
 * 'bshd' tensor, one run per position). A Float16Array's runs, however short each is, are
 * gathered as raw halves into the upper half of the block and widened there at once.
 */
export function writeFloatRuns(module: SdpaModule, address: number, data: InputData, runs: number, runLength: number,
  runStart: (run: number) => number): void {
  const count = runs * runLength;
  if (widensInWasm(data, count)) {
    const halves = halfBitsOf(data as Float16ArrayType), to = module.HEAPU16, at = (address + 2 * count) >>> 1;
    for (let r = 0; r < runs; r++) to.set(halves.subarray(runStart(r), runStart(r) + runLength), at + r * runLength);
    module.widenHalvesInPlace(address, count);
  } else {
    const to = module.HEAPF32, at = address >>> 2;
    for (let r = 0; r < runs; r++) to.set(data.subarray(runStart(r), runStart(r) + runLength), at + r * runLength);
  }
}

/**
 * Where in `block` (COPY_PLACEMENT_SLACK bytes more than the data, at a multiple of 4) to write
 * `source` to with writeFloats: a multiple of 4 too, so that the bytes copied from `source` (its
 * floats at the address, or its raw halves in the upper half of the block) land 2 KiB from it
 * modulo 4 KiB. A Float16Array's byteOffset may be 2 past a multiple of 4 (an odd element of its
 * buffer), so the distance is rounded down to 4 bytes (the copy's elements land where the
 * address says).
 */
export function placeCopy(block: number, source: InputData): number {
  const copiedTo = widensInWasm(source, source.length) ? 2 * source.length : 0;  // bytes from the address
  return block + ((source.byteOffset + 2048 - copiedTo - block) & 4092);
}

/** The allocations of one call; free() releases them all, whatever happened in between. */
export class CallMemory {
  readonly #module: SdpaModule;
  readonly #account: MemoryAccount;
  readonly #fn: string;
  readonly #blocks: number[] = [];
  #blockCount = 0;
  #bytes = 0;

  constructor(module: SdpaModule, account: MemoryAccount, fn: string) {
    this.#module = module;
    this.#account = account;
    this.#fn = fn;
  }

  /**
   * Every block the call needs, in one request: refused with a RangeError (bytes needed, the
   * limit) before any is allocated if they would not fit. `purpose`: see MemoryAccount.refusal.
   */
  allocate<R extends ByteRequest>(request: R, purpose = ''): { [K in keyof R]: number } {
    const { block, bytes, addresses } = allocateAll(this.#module, this.#account, this.#fn, request, purpose);
    if (block !== 0) this.#blocks[this.#blockCount++] = block;
    this.#bytes += bytes;
    return addresses;
  }

  /**
   * Whether allocate(request) would pass the limits (this instance's, the module's memory's),
   * keeping nothing allocated (see MemoryAccount.refusal: near the module's 2 GiB a trial block,
   * which may grow the memory): for a call with ways to run in less memory (runFirstThatFits).
   */
  fits(request: ByteRequest): boolean {
    return this.#account.refusal(this.#module, this.#fn, request, requestBytes(request)) === null;
  }

  get module(): SdpaModule {
    return this.#module;
  }

  /** Fresh views: take them after the last allocation of a step. */
  get heap(): HeapViews {
    return heap(this.#module);
  }

  free(): void {
    // Counted, not popped or cleared: changing an array's length cost a small call 2%.
    for (let i = 0; i < this.#blockCount; i++) this.#module._free(this.#blocks[i]);
    this.#blockCount = 0;
    this.#account.remove(this.#bytes);
    this.#bytes = 0;
  }
}

/** One way of running a call: its blocks (requested from `memory`) and the run, which makes that request. */
export interface Way<R> {
  memory: CallMemory;
  request: ByteRequest;
  run: () => R;
}

/**
 * Runs the first of `ways` (a call's ways of running, from the one it prefers, made as they are
 * needed) whose request fits (CallMemory.fits), else the one whose request is the least: its
 * allocation then refuses, naming the least the call needs (a smaller part may need more scratch
 * than a larger one).
 */
export function runFirstThatFits<R>(ways: Iterable<Way<R>>): R {
  let least: Way<R> | undefined, leastBytes = Infinity;
  for (const way of ways) {
    if (way.memory.fits(way.request)) return way.run();
    const bytes = requestBytes(way.request);
    if (bytes < leastBytes) [least, leastBytes] = [way, bytes];
  }
  if (least === undefined) throw new Error('sdpa-wasm: internal error: no way to run the call was planned');
  return least.run();
}
