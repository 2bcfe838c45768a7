// A plain SIMD read of N bytes of wasm memory, on one thread or two: the yardstick for a decode
// step, which must read the whole KV cache once (decode.mjs compares each step with a read of
// the same number of bytes, measured in the same rounds).
//
// The module is assembled right here (no toolchain), with limits.mjs's binary writer:
//   (import "env" "memory" (memory 1 32768 shared))
//   (func $read (param $p i32) (param $n i32) (result i32) (local $end i32) (local $a0..$a7 v128)
//     end = p + n
//     (loop  a_j = i32x4.add(a_j, v128.load offset=16j (p)) for j in 0..7;   ;; 128 bytes
//            p += 128; br_if 0 (p < end))
//     return the lane sum of a0 + ... + a7)                                 ;; so nothing is dead
// Eight independent accumulators, so the adds never wait on each other: the loop is limited by
// the loads. n must be a positive multiple of 128 (every cache size here is).
//
// Two shared WebAssembly.Memory objects, each with its instance of the module on both threads:
// the data (from 64 KiB on, grown and touched, every page written, by ensure(bytes) before it
// is timed; up to 2 GiB less 64 KiB, so a 1 GiB cache's bytes fit whatever the eviction area)
// and the eviction area (evictBytes, from 64 KiB on, written once).
//   read1(n): the main thread reads the first n bytes of the data.
//   read2(n): the main thread reads the first half while a worker_thread (its own instances of
//             the module on the same memories, parked in Atomics.wait between calls) reads the
//             second; returns when both are done. The wake-up of the worker is part of the time,
//             as it is for the threaded sdpa-wasm build's pool (also parked on a futex).
//   evict():  read2 of the eviction area (3× the last-level cache, at least 96 MiB): afterwards
//             neither core's L2 nor the shared L3 holds anything read before. decode.mjs calls
//             it (untimed) before every timed run, so each starts from main memory, like a layer's
//             KV cache in a real model, read one token ago and evicted by the other layers since.
import { Worker, isMainThread, workerData } from 'node:worker_threads';
import { wasmAsm } from './limits.mjs';
import { l3Bytes } from './host.mjs';

const { u32, s32, vec, section, str, I32, V128, op, simd, v128load, moduleBytes } = wasmAsm;
const i32x4add = simd(0xae);
const i32x4extract = (lane) => simd(0x1b, lane);
const MAX_PAGES = 32768;           // 2 GiB
const BASE = 65536;                // the data (and the eviction area) start after the first page
const STEP = 128;                  // bytes a loop iteration reads
const ACCS = STEP / 16;

export function readProbeModuleBytes() {
  const types = section(1, vec([[0x60, ...vec([[I32], [I32]]), ...vec([[I32]])]]));
  const imports = section(2, vec([[...str('env'), ...str('memory'), 0x02, 0x03, ...u32(1), ...u32(MAX_PAGES)]]));
  const funcs = section(3, vec([[0]]));
  const exports = section(7, vec([[...str('read'), 0x00, 0]]));
  const [p, n, end, acc0] = [0, 1, 2, 3];
  const code = [op.get, p, op.get, n, op.i32add, op.set, end, op.loop, op.void];
  for (let j = 0; j < ACCS; j++) code.push(op.get, acc0 + j, op.get, p, ...v128load(16 * j), ...i32x4add, op.set, acc0 + j);
  code.push(op.get, p, op.i32const, ...s32(STEP), op.i32add, op.tee, p, op.get, end, op.i32ltu, op.br_if, 0, op.end);
  code.push(op.get, acc0);
  for (let j = 1; j < ACCS; j++) code.push(op.get, acc0 + j, ...i32x4add);
  code.push(op.set, acc0, op.get, acc0, ...i32x4extract(0));
  for (let lane = 1; lane < 4; lane++) code.push(op.get, acc0, ...i32x4extract(lane), op.i32add);
  code.push(op.end);
  const body = [...vec([[1, I32], [ACCS, V128]]), ...code];
  const codeSection = section(10, vec([[...u32(body.length), ...body]]));
  return moduleBytes(types, imports, funcs, exports, codeSection);
}

// The module's read function on each of the given memories (one instance per memory).
const instantiateReaders = (bytes, memories) =>
  Promise.all(memories.map(async (memory) => (await WebAssembly.instantiate(bytes, { env: { memory } })).instance.exports.read));

// ctrl (Int32Array on a SharedArrayBuffer): the main thread bumps GEN to start the worker on
// [PTR, PTR + LEN) of memory AREA (DATA_AREA or EVICT_AREA); the worker stores its sum in SUM
// and the generation it finished in DONE.
const GEN = 0, DONE = 1, PTR = 2, LEN = 3, SUM = 4, QUIT = 5, AREA = 6;
const DATA_AREA = 0, EVICT_AREA = 1;

/**
 * The eviction area for a host (hostCpu()): 3× its last-level cache, at least 96 MiB, so that
 * reading it leaves none of a cache's bytes in any level.
 */
export function evictionBytes(host) {
  return Math.max(96 * 2 ** 20, 3 * (l3Bytes(host) ?? 0));
}

/**
 * Opens the probe: the module on the main thread and in one worker, on two shared memories
 * (the data and the eviction area).
 * Returns { ensure(bytes), read1(bytes), read2(bytes), capacity(), close() }.
 */
export async function openReadProbe({ evictBytes = 96 * 2 ** 20 } = {}) {
  const EVICT = Math.ceil(evictBytes / 65536) * 65536;
  if (BASE + EVICT > MAX_PAGES * 65536) throw new RangeError(`read probe: an eviction area of ${EVICT} bytes does not fit in 2 GiB`);
  const DATA = BASE;
  const bytes = readProbeModuleBytes();
  const memory = new WebAssembly.Memory({ initial: 1, maximum: MAX_PAGES, shared: true });
  const pages = (BASE + EVICT) / 65536;
  const evictMemory = new WebAssembly.Memory({ initial: pages, maximum: pages, shared: true });
  const [read, readEvict] = await instantiateReaders(bytes, [memory, evictMemory]);
  const ctrl = new Int32Array(new SharedArrayBuffer(64));
  const worker = new Worker(new URL(import.meta.url), { workerData: { role: 'sdpa-bench-read-probe', bytes, memory, evictMemory, ctrl } });
  worker.unref();
  await new Promise((resolve, reject) => { worker.once('message', resolve); worker.once('error', reject); });
  let capacity = 0;
  new Uint8Array(evictMemory.buffer, BASE, EVICT).fill(0x5a);

  const both = (area, at, n) => {
    const half = (n / 2) - ((n / 2) % STEP);
    ctrl[AREA] = area;
    ctrl[PTR] = at + half;
    ctrl[LEN] = n - half;
    const gen = Atomics.add(ctrl, GEN, 1) + 1;
    Atomics.notify(ctrl, GEN);
    const mine = (area === EVICT_AREA ? readEvict : read)(at, half);
    let done;
    while ((done = Atomics.load(ctrl, DONE)) !== gen) Atomics.wait(ctrl, DONE, done);
    return (mine + ctrl[SUM]) | 0;
  };
  const check = (n) => {
    if (!(n > 0 && n % (2 * STEP) === 0)) throw new RangeError(`read probe: ${n} bytes is not a positive multiple of ${2 * STEP}`);
    if (n > capacity) throw new RangeError(`read probe: ${n} bytes > the ${capacity} made ready (call ensure first)`);
  };
  return {
    maxBytes: MAX_PAGES * 65536 - DATA,
    evictBytes: EVICT,
    capacity: () => capacity,
    /** Grows the memory to hold `n` bytes of data and writes every new page (not timed). */
    ensure(n) {
      if (n <= capacity) return;
      const need = Math.ceil((DATA + n) / 65536);
      const have = memory.buffer.byteLength / 65536;
      if (need > MAX_PAGES) throw new RangeError(`read probe: ${n} bytes do not fit in its ${MAX_PAGES * 64 / 1024 / 1024} GiB memory`);
      if (need > have) memory.grow(need - have);
      new Uint8Array(memory.buffer, DATA + capacity, n - capacity).fill(0x3c);
      capacity = n;
    },
    read1(n) {
      check(n);
      return read(DATA, n);
    },
    read2(n) {
      check(n);
      return both(DATA_AREA, DATA, n);
    },
    evict: () => both(EVICT_AREA, BASE, EVICT),
    close() {
      return new Promise((resolve) => {
        worker.once('exit', resolve);
        worker.ref();   // an unref'd worker's exit would not keep the process alive to see it
        Atomics.store(ctrl, QUIT, 1);
        Atomics.add(ctrl, GEN, 1);
        Atomics.notify(ctrl, GEN);
      });
    },
  };
}

// The worker side: its own instances on the two shared memories, parked in Atomics.wait
// between reads.
if (!isMainThread && workerData?.role === 'sdpa-bench-read-probe') {
  const { bytes, memory, evictMemory, ctrl } = workerData;
  const [read, readEvict] = await instantiateReaders(bytes, [memory, evictMemory]);
  const { parentPort } = await import('node:worker_threads');
  parentPort.postMessage('ready');
  let seen = 0;
  for (;;) {
    Atomics.wait(ctrl, GEN, seen);
    const gen = Atomics.load(ctrl, GEN);
    if (gen === seen) continue;
    seen = gen;
    if (Atomics.load(ctrl, QUIT)) break;
    ctrl[SUM] = (ctrl[AREA] === EVICT_AREA ? readEvict : read)(ctrl[PTR], ctrl[LEN]);
    Atomics.store(ctrl, DONE, gen);
    Atomics.notify(ctrl, DONE);
  }
  parentPort.close();
}
