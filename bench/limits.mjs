// This machine's limits for one thread of wasm SIMD, measured by a tiny module whose binary is
// assembled right here (no toolchain, no files):
//   peak(n, a, b):  12 independent f32x4 chains acc_i = acc_i·a + b, n iterations → 96 flops
//                   per iteration (12 chains × 4 lanes × (mul + add)). a, b come in as
//                   parameters so V8 cannot treat them as constants; 12 accumulators + 2
//                   operands fit V8's 16 xmm registers, so nothing spills.
//   copy(dst, src, n, reps):      memory.copy of n bytes, reps times (bulk memory).
//   copySimd(dst, src, n, reps):  a v128.load/v128.store loop, 64 bytes per iteration.
// openScoreTileProbe() times the prefill's 4×8 score micro-kernel alone (mul+add or
// relaxed_madd, in a module of its own), for the ceiling it puts on a prefill call.
// The binary layout follows the WebAssembly core spec (sections, LEB128 integers); the
// same text as a .wat is in the comment above each function for reading.
//
// openCoreProbe(threads) runs the same peak kernel on `threads` worker_threads at once, to
// see how many cores this (shared) machine gives the benchmark at that moment: the summed
// GFLOP/s ÷ the one-thread peak ≈ usable cores (2.0 on an idle 2-vCPU machine).
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';

const u32 = (x) => { const out = []; do { let b = x & 0x7f; x >>>= 7; if (x) b |= 0x80; out.push(b); } while (x); return out; };
const s32 = (x) => {
  const out = [];
  for (;;) {
    const b = x & 0x7f; x >>= 7;
    if ((x === 0 && !(b & 0x40)) || (x === -1 && (b & 0x40))) { out.push(b); return out; }
    out.push(b | 0x80);
  }
};
const vec = (items) => [...u32(items.length), ...items.flat()];
const section = (id, bytes) => [id, ...u32(bytes.length), ...bytes];
const str = (s) => vec([...Buffer.from(s, 'utf8')].map((b) => [b]));

const I32 = 0x7f, F32 = 0x7d, V128 = 0x7b;
const op = {
  block: 0x02, loop: 0x03, end: 0x0b, br_if: 0x0d, void: 0x40,
  get: 0x20, set: 0x21, tee: 0x22, i32const: 0x41, i32add: 0x6a, i32sub: 0x6b, i32ltu: 0x49,
  f32add: 0x92,
};
const simd = (code, ...imm) => [0xfd, ...u32(code), ...imm];
const v128load = (offset) => simd(0x00, 4, ...u32(offset));   // align 2^4
const v128store = (offset) => simd(0x0b, 4, ...u32(offset));
const f32x4splat = simd(0x13), f32x4extract0 = simd(0x1f, 0), f32x4add = simd(0xe4), f32x4mul = simd(0xe6);
const memoryCopy = [0xfc, ...u32(10), 0, 0];
const f32x4relaxedMadd = simd(0x105);  // relaxed SIMD: a·b + c, fused where the CPU has FMA
/** A module's bytes: the magic number and version, then the given sections in order. */
const moduleBytes = (...sections) => new Uint8Array([0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, ...sections.flat()]);
/** The binary writer's pieces, for other hand-assembled modules (read-probe.mjs). */
export const wasmAsm = { u32, s32, vec, section, str, I32, F32, V128, op, simd, v128load, moduleBytes };

const CHAINS = 12;

// (func $peak (param $n i32) (param $a f32) (param $b f32) (result f32)
//   (local $va v128) (local $vb v128) (local $acc0 v128) ... (local $acc11 v128)
//   va = splat(a); vb = splat(b); acc_i = splat(b)
//   (loop  acc_i = f32x4.add(f32x4.mul(acc_i, va), vb) for i in 0..11
//          n = n - 1; br_if 0 (n))
//   return sum_i lane0(acc_i))
function peakBody(fused = false) {
  const [n, a, b, va, vb, acc0] = [0, 1, 2, 3, 4, 5];
  const code = [
    op.get, a, ...f32x4splat, op.set, va,
    op.get, b, ...f32x4splat, op.set, vb,
  ];
  for (let i = 0; i < CHAINS; i++) code.push(op.get, b, ...f32x4splat, op.set, acc0 + i);
  code.push(op.loop, op.void);
  for (let i = 0; i < CHAINS; i++) {
    if (fused) code.push(op.get, acc0 + i, op.get, va, op.get, vb, ...f32x4relaxedMadd, op.set, acc0 + i);
    else code.push(op.get, acc0 + i, op.get, va, ...f32x4mul, op.get, vb, ...f32x4add, op.set, acc0 + i);
  }
  code.push(op.get, n, op.i32const, ...s32(1), op.i32sub, op.tee, n, op.br_if, 0, op.end);
  code.push(op.get, acc0, ...f32x4extract0);
  for (let i = 1; i < CHAINS; i++) code.push(op.get, acc0 + i, ...f32x4extract0, op.f32add);
  code.push(op.end);
  return [...vec([[...u32(2 + CHAINS), V128]]), ...code];
}

// (func $copy (param $dst i32) (param $src i32) (param $n i32) (param $reps i32)
//   (loop (memory.copy dst src n) reps = reps - 1; br_if 0 (reps)))
function copyBody() {
  const [dst, src, n, reps] = [0, 1, 2, 3];
  return [...vec([]),
    op.loop, op.void,
    op.get, dst, op.get, src, op.get, n, ...memoryCopy,
    op.get, reps, op.i32const, ...s32(1), op.i32sub, op.tee, reps, op.br_if, 0,
    op.end, op.end];
}

// (func $copySimd (param $dst i32) (param $src i32) (param $n i32) (param $reps i32) (local $i i32)
//   (loop $rep  i = 0
//     (loop $body  store(dst+i+{0,16,32,48}, load(src+i+{0,16,32,48})); i += 64; br_if $body (i < n))
//     reps = reps - 1; br_if $rep (reps)))
function copySimdBody() {
  const [dst, src, n, reps, i] = [0, 1, 2, 3, 4];
  const code = [op.loop, op.void, op.i32const, 0, op.set, i, op.loop, op.void];
  for (let k = 0; k < 4; k++) {
    code.push(op.get, dst, op.get, i, op.i32add, op.get, src, op.get, i, op.i32add,
      ...v128load(16 * k), ...v128store(16 * k));
  }
  code.push(op.get, i, op.i32const, ...s32(64), op.i32add, op.tee, i, op.get, n, op.i32ltu, op.br_if, 0, op.end);
  code.push(op.get, reps, op.i32const, ...s32(1), op.i32sub, op.tee, reps, op.br_if, 0, op.end, op.end);
  return [...vec([[1, I32]]), ...code];
}

/** The module's bytes: memory of `pages` 64 KiB pages, exports peak, copy, copySimd, memory. */
export function limitsModuleBytes(pages) {
  const types = section(1, vec([
    [0x60, ...vec([[I32], [F32], [F32]]), ...vec([[F32]])],            // peak
    [0x60, ...vec([[I32], [I32], [I32], [I32]]), ...vec([])],          // copy, copySimd
  ]));
  const funcs = section(3, vec([[0], [1], [1]]));
  const memory = section(5, vec([[0x00, ...u32(pages)]]));             // min pages, no max
  const exports = section(7, vec([
    [...str('peak'), 0x00, 0], [...str('copy'), 0x00, 1], [...str('copySimd'), 0x00, 2],
    [...str('memory'), 0x02, 0],
  ]));
  const bodies = [peakBody(), copyBody(), copySimdBody()].map((b) => [...u32(b.length), ...b]);
  const code = section(10, vec(bodies));
  return moduleBytes(types, funcs, memory, exports, code);
}

/**
 * The FMA peak: the same 12 chains as peak, each step one f32x4.relaxed_madd (acc·a + b) instead
 * of a mul and an add. Null where the engine does not run relaxed SIMD (Node 20 without
 * --experimental-wasm-relaxed-simd). Returns { sample() } like peakSample: GFLOP/s of ≈ 30 ms.
 */
export async function openFmaPeak() {
  const types = section(1, vec([[0x60, ...vec([[I32], [F32], [F32]]), ...vec([[F32]])]]));
  const funcs = section(3, vec([[0]]));
  const exports = section(7, vec([[...str('peak'), 0x00, 0]]));
  const body = peakBody(true);
  const code = section(10, vec([[...u32(body.length), ...body]]));
  const bytes = moduleBytes(types, funcs, exports, code);
  if (!WebAssembly.validate(bytes)) return null;
  const { instance } = await WebAssembly.instantiate(bytes);
  const { peak } = instance.exports;
  const iters = calibratePeak(peak, 30);
  return {
    kernel: `${CHAINS} independent f32x4 chains acc = relaxed_madd(acc, a, b), ${FLOPS_PER_ITERATION} flops per loop iteration`,
    sample: () => {
      const t0 = performance.now();
      const sum = peak(iters, 0.9999, 1e-4);
      const s = (performance.now() - t0) / 1e3;
      if (!Number.isFinite(sum)) throw new Error('limits: the FMA peak kernel produced a non-finite value');
      return iters * FLOPS_PER_ITERATION / s / 1e9;
    },
  };
}

// The prefill's score micro-kernel on its own, for the bound it puts on a whole call
// (src/kernels/f32-tile-ops-wasmsimd.h, score_4x8_packed: 4 query rows × 8 keys, 8 accumulators;
// per dim 2 loads of K and 4 broadcasts of Q), over the K of one 512-key tile at E = 64 (128 KiB:
// from the core's L2, as in the kernel), storing its 8 accumulators after each group of 8 keys:
// (func $tile (param $q i32) (param $k i32) (param $out i32) (param $dims i32) (param $groups i32)
//             (param $reps i32) (result f32)
//   (loop $rep  qend = q + 16·dims; kp = k; g = groups
//     (loop $group  acc_0..7 = 0; qp = q
//       (loop $dim  k0 = load(kp); k1 = load(kp + 16)
//         for r in 0..3: b = load32_splat(qp + 4r); acc_2r += b·k0; acc_2r+1 += b·k1
//         kp += 32; qp += 16; br_if $dim (qp != qend))
//       store(out + 16i, acc_i); g -= 1; br_if $group (g))
//     reps -= 1; br_if $rep (reps))
//   lane 0 of acc_0)
// fused: each += is one f32x4.relaxed_madd (the relaxed build's form), else a mul and an add.
const TILE = { dims: 64, keys: 512, rows: 4, keysPerGroup: 8 };
function tileBody(fused) {
  const [q, k, out, dims, groups, reps, qp, kp, qend, g, k0, k1, b, acc0] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13];
  const load32splat = (offset) => simd(0x09, 2, ...u32(offset));
  const zero = [0xfd, ...u32(0x0c), ...new Array(16).fill(0)];  // v128.const 0
  const i32ne = 0x47, i32mul = 0x6c;
  const code = [op.loop, op.void,
    op.get, q, op.get, dims, op.i32const, ...s32(16), i32mul, op.i32add, op.set, qend,
    op.get, k, op.set, kp, op.get, groups, op.set, g,
    op.loop, op.void];
  for (let i = 0; i < 8; i++) code.push(...zero, op.set, acc0 + i);
  code.push(op.get, q, op.set, qp, op.loop, op.void,
    op.get, kp, ...v128load(0), op.set, k0, op.get, kp, ...v128load(16), op.set, k1);
  for (let r = 0; r < 4; r++) {
    code.push(op.get, qp, ...load32splat(4 * r), op.set, b);
    for (let c = 0; c < 2; c++) {
      const acc = acc0 + 2 * r + c;
      if (fused) code.push(op.get, b, op.get, k0 + c, op.get, acc, ...f32x4relaxedMadd, op.set, acc);
      else code.push(op.get, acc, op.get, b, op.get, k0 + c, ...f32x4mul, ...f32x4add, op.set, acc);
    }
  }
  code.push(op.get, kp, op.i32const, ...s32(32), op.i32add, op.set, kp,
    op.get, qp, op.i32const, ...s32(16), op.i32add, op.tee, qp, op.get, qend, i32ne, op.br_if, 0, op.end);
  for (let i = 0; i < 8; i++) code.push(op.get, out, op.get, acc0 + i, ...v128store(16 * i));
  code.push(op.get, g, op.i32const, ...s32(1), op.i32sub, op.tee, g, op.br_if, 0, op.end);
  code.push(op.get, reps, op.i32const, ...s32(1), op.i32sub, op.tee, reps, op.br_if, 0, op.end);
  code.push(op.get, acc0, ...f32x4extract0, op.end);
  return [...vec([[4, I32], [3 + 8, V128]]), ...code];
}

/**
 * The score micro-kernel's rate (GFLOP/s on one thread), mul+add (fused = false) or
 * f32x4.relaxed_madd (fused = true; null where the engine does not run relaxed SIMD). Returns
 * { kernel, sample() }, sample() timing ≈ 30 ms. A prefill call does this work and as much again
 * in P·V (the same register tile), plus the softmax and the copies: a call can at best run at
 * this rate, which bounds its ratio to a peer on this host (bench.mjs prints that ceiling).
 */
export async function openScoreTileProbe({ fused = false } = {}) {
  const types = section(1, vec([[0x60, ...vec([[I32], [I32], [I32], [I32], [I32], [I32]]), ...vec([[F32]])]]));
  const funcs = section(3, vec([[0]]));
  const memory = section(5, vec([[0x00, ...u32(4)]]));
  const exports = section(7, vec([[...str('tile'), 0x00, 0], [...str('memory'), 0x02, 0]]));
  const body = tileBody(fused);
  const code = section(10, vec([[...u32(body.length), ...body]]));
  const bytes = moduleBytes(types, funcs, memory, exports, code);
  if (!WebAssembly.validate(bytes)) return null;
  const { instance } = await WebAssembly.instantiate(bytes);
  const { tile } = instance.exports;
  const f32 = new Float32Array(instance.exports.memory.buffer);
  const groups = TILE.keys / TILE.keysPerGroup;
  const q = 0, k = 4096, out = k + TILE.keys * TILE.dims * 4;  // q [64][4] and out in the first 4 KiB
  f32.fill(0.01);
  const flopsPerRep = 2 * TILE.rows * TILE.keys * TILE.dims;
  const run = (reps) => {
    const t0 = performance.now();
    const x = tile(q, k, out, TILE.dims, groups, reps);
    const ms = performance.now() - t0;
    if (!Number.isFinite(x)) throw new Error('limits: the score tile kernel produced a non-finite value');
    return ms;
  };
  run(20);
  let reps = 20;
  for (let ms = run(reps); ms < 10; ms = run(reps)) reps *= 4;
  reps = Math.ceil(reps * 30 / run(reps));
  return {
    kernel: `the prefill's 4×8 score tile (${fused ? 'relaxed_madd' : 'mul+add'}) over a 512-key K tile, E = ${TILE.dims}`,
    sample: () => reps * flopsPerRep / run(reps) / 1e6,
  };
}

/**
 * Instantiates the module once. measure() gives the wasm SIMD mul+add peak (GFLOP/s) and the
 * copy bandwidth (GB/s) on one thread, each the best of several timings (noise from other
 * processes only ever slows a loop down). peakSample() is one ≈ 30 ms peak measurement: the
 * benchmark takes one in every timed round of a shape, so that the shape's runs are compared
 * with the peak of the same minutes (this machine has slow phases that slow every loop).
 */
const FLOPS_PER_ITERATION = CHAINS * 8;

/** Iterations of peak() that take ≈ `targetMs`, after letting V8 tier the loop up. */
function calibratePeak(peak, targetMs) {
  peak(1e6, 0.9999, 1e-4);
  let iters = 2e6;
  for (;;) {
    const t0 = performance.now(); peak(iters, 0.9999, 1e-4); const ms = performance.now() - t0;
    if (ms > 10) return Math.ceil(iters * targetMs / ms);
    iters *= 4;
  }
}

export async function openLimits() {
  const copyBytes = 128 << 20;                  // well beyond the last-level cache
  const pages = (2 * copyBytes) / 65536 + 1;
  const { instance } = await WebAssembly.instantiate(limitsModuleBytes(pages));
  const { peak, copy, copySimd } = instance.exports;
  const flopsPerIteration = FLOPS_PER_ITERATION;
  const iters = calibratePeak(peak, 30);        // ≈ 30 ms per call
  const peakOnce = (calls) => {
    const t0 = performance.now();
    let sum = 0;
    for (let c = 0; c < calls; c++) sum += peak(iters, 0.9999, 1e-4);
    const s = (performance.now() - t0) / 1e3;
    if (!Number.isFinite(sum)) throw new Error('limits: the peak kernel produced a non-finite value');
    return calls * iters * flopsPerIteration / s / 1e9;
  };

  const src = 65536, dst = src + copyBytes;     // touch every page before timing
  new Uint8Array(instance.exports.memory.buffer, src, copyBytes).fill(1);
  copy(dst, src, copyBytes, 1); copySimd(dst, src, copyBytes, 1);

  return {
    peakSample: () => peakOnce(1),
    measure: ({ quick = false } = {}) => {
      const reps = quick ? 3 : 7;
      const peakRuns = [], bulkRuns = [], simdRuns = [];
      for (let r = 0; r < reps; r++) peakRuns.push(peakOnce(5));
      for (let r = 0; r < reps; r++) {
        let t0 = performance.now(); copy(dst, src, copyBytes, 2);
        bulkRuns.push(2 * copyBytes / ((performance.now() - t0) / 1e3) / 1e9);
        t0 = performance.now(); copySimd(dst, src, copyBytes, 2);
        simdRuns.push(2 * copyBytes / ((performance.now() - t0) / 1e3) / 1e9);
      }
      const best = (xs) => Math.max(...xs);
      const copyGBs = Math.max(best(bulkRuns), best(simdRuns));
      return {
        peakGflops: best(peakRuns),
        peakRuns,
        peakKernel: `${CHAINS} independent f32x4 chains acc = acc*a + b, ${flopsPerIteration} flops per loop iteration`,
        copyBufferBytes: copyBytes,
        copyGBs,                                 // bytes copied per second (each read once, written once)
        copyTrafficGBs: 2 * copyGBs,             // read + write traffic
        memoryCopyGBs: best(bulkRuns),
        simdCopyGBs: best(simdRuns),
        runs: reps,
      };
    },
  };
}

/**
 * `threads` worker_threads, each with its own instance of the peak kernel, calibrated once.
 * probe(ms) starts them together; each runs peak() for ≈ ms and reports its GFLOP/s.
 * Returns { gflops: [per worker], total, cores: total ÷ onePeak } where onePeak is the
 * one-thread peak to compare with (the main thread's measurement). close() ends the workers.
 */
export async function openCoreProbe(threads = 2) {
  const workers = [];
  try {
    for (let t = 0; t < threads; t++) {
      const w = new Worker(new URL(import.meta.url), { workerData: { role: 'sdpa-bench-core-probe' } });
      w.unref();
      workers.push(w);
    }
    await Promise.all(workers.map((w) => new Promise((resolve, reject) => {
      w.once('message', resolve);
      w.once('error', reject);
    })));
  } catch (e) {
    for (const w of workers) w.terminate();
    throw e;
  }
  return {
    threads,
    probe: async (ms, onePeak) => {
      const gflops = await Promise.all(workers.map((w) => new Promise((resolve) => {
        w.once('message', resolve);
        w.postMessage(ms);
      })));
      const total = gflops.reduce((a, b) => a + b, 0);
      return { gflops, total, cores: total / onePeak };
    },
    close: () => Promise.all(workers.map((w) => w.terminate())),
  };
}

// The worker side of openCoreProbe().
if (!isMainThread && workerData?.role === 'sdpa-bench-core-probe') {
  const { instance } = await WebAssembly.instantiate(limitsModuleBytes(1));
  const { peak } = instance.exports;
  const iters = calibratePeak(peak, 10);        // ≈ 10 ms per call
  parentPort.on('message', (ms) => {
    let calls = 0, sum = 0;
    const t0 = performance.now();
    do { sum += peak(iters, 0.9999, 1e-4); calls++; } while (performance.now() - t0 < ms);
    const s = (performance.now() - t0) / 1e3;
    parentPort.postMessage(Number.isFinite(sum) ? calls * iters * FLOPS_PER_ITERATION / s / 1e9 : NaN);
  });
  parentPort.postMessage('ready');
}
