// npm run bench [-- --quick] [-- --json path]
// Single-threaded forward attention at the shapes in shapes.mjs: warm-up, then the median
// of timed runs, in ms and GFLOP/s. Results go to stdout and a JSON file.
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createAttention } from 'sdpa-wasm';
import { SHAPES, flops } from './shapes.mjs';

const quick = process.argv.includes('--quick');
const jsonArg = process.argv.indexOf('--json');
const jsonPath = jsonArg > 0
  ? resolve(process.argv[jsonArg + 1])
  : fileURLToPath(new URL('./results/latest.json', import.meta.url));
const warmups = quick ? 2 : 5;
const minRuns = quick ? 5 : 15;
const minSeconds = quick ? 0.3 : 1.5;

function randomTensor(dims, seed) {
  let x = seed >>> 0;
  const n = dims.reduce((a, b) => a * b, 1);
  const data = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    x = (x * 1664525 + 1013904223) >>> 0;  // LCG: enough for benchmark data
    data[i] = x / 2 ** 32 - 0.5;
  }
  return { data, dims };
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

const attn = await createAttention();
const rows = [];
for (const shape of SHAPES) {
  const q = randomTensor([shape.B, shape.H, shape.Lq, shape.E], 1);
  const k = randomTensor([shape.B, shape.H, shape.Lk, shape.E], 2);
  const v = randomTensor([shape.B, shape.H, shape.Lk, shape.E], 3);
  const out = new Float32Array(shape.B * shape.H * shape.Lq * shape.E);
  const options = { isCausal: shape.causal, out };
  for (let i = 0; i < warmups; i++) attn.sdpa(q, k, v, options);  // V8 tiers up the wasm first
  const times = [];
  const start = performance.now();
  while (times.length < minRuns || performance.now() - start < minSeconds * 1000) {
    const t0 = performance.now();
    attn.sdpa(q, k, v, options);
    times.push(performance.now() - t0);
  }
  const ms = median(times);
  rows.push({ shape: shape.name, ...shape, runs: times.length, medianMs: ms, gflops: flops(shape) / ms / 1e6 });
}
attn.dispose();

console.log(`sdpa-wasm forward, 1 thread, median of >= ${minRuns} runs after ${warmups} warm-ups`);
console.log(`${os.cpus()[0]?.model ?? 'unknown CPU'}, Node ${process.versions.node}, V8 ${process.versions.v8}`);
console.log('shape             B   H     Lq     Lk    E   median ms   GFLOP/s');
for (const r of rows) {
  console.log(
    `${r.shape.padEnd(16)} ${String(r.B).padStart(2)} ${String(r.H).padStart(3)} ${String(r.Lq).padStart(6)} ` +
    `${String(r.Lk).padStart(6)} ${String(r.E).padStart(4)} ${r.medianMs.toFixed(3).padStart(11)} ${r.gflops.toFixed(1).padStart(9)}`);
}
const causal = rows.find((r) => r.causal && r.Lq === 512);
const full = rows.find((r) => !r.causal && r.Lq === 512);
if (causal && full) console.log(`causal N512 time / non-causal N512 time: ${(causal.medianMs / full.medianMs).toFixed(2)}`);

mkdirSync(dirname(jsonPath), { recursive: true });
writeFileSync(jsonPath, JSON.stringify({
  date: new Date().toISOString(), node: process.versions.node, v8: process.versions.v8,
  cpu: os.cpus()[0]?.model, threads: 1, quick, rows,
}, null, 2));
console.log(`results: ${jsonPath}`);
