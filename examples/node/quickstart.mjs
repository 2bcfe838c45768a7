// The main job of `npm start`: causal attention in Node with sdpa-wasm (its output and weights
// printed), then the speed of the same shape without the mask.
//   node examples/node/quickstart.mjs
import { createAttention } from 'sdpa-wasm';

// A small causal self-attention: B=1, 8 heads, 512 tokens, head size 64.
const [B, H, L, E] = [1, 8, 512, 64];
let seed = 42;
const random = () => ((seed = (seed * 1664525 + 1013904223) >>> 0) / 2 ** 32) * 2 - 1;
const tensor = () => ({ data: Float32Array.from({ length: B * H * L * E }, random), dims: [B, H, L, E] });
const [query, key, value] = [tensor(), tensor(), tensor()];

const attn = await createAttention();
const { output, weights } = attn.sdpa(query, key, value, { isCausal: true, returnWeights: true });

console.log(`output dims [${output.dims.join(', ')}]`);
console.log(`output[0, 0, 0, 0:4] = ${[...output.data.subarray(0, 4)].map((x) => x.toFixed(5)).join(' ')}`);
const row = (h, i) => weights.data.subarray(((0 * H + h) * L + i) * L, ((0 * H + h) * L + i + 1) * L);
console.log(`weights[0, 0, 2, 0:4] = ${[...row(0, 2).subarray(0, 4)].map((x) => x.toFixed(5)).join(' ')}` +
  ' (row 2 of a causal mask sees keys 0..2 only)');
console.log(`sum of weights row 100 = ${row(0, 100).reduce((a, b) => a + b, 0).toFixed(6)}`);

// Speed: the first calls let V8 tier the wasm up; then the median of 10 runs.
const out = new Float32Array(output.data.length);
for (let i = 0; i < 3; i++) attn.sdpa(query, key, value, { out });
const times = [];
for (let i = 0; i < 10; i++) {
  const t0 = performance.now();
  attn.sdpa(query, key, value, { out });
  times.push(performance.now() - t0);
}
times.sort((a, b) => a - b);
const ms = (times[4] + times[5]) / 2;
const gflop = (4 * B * H * L * L * E) / 1e9;
console.log(`non-causal [${B}, ${H}, ${L}, ${E}]: ${ms.toFixed(2)} ms median, ${(gflop / (ms / 1000)).toFixed(1)} GFLOP/s ` +
  `(${attn.threads} thread${attn.threads === 1 ? '' : 's'}, SIMD ${attn.simd ? 'on' : 'off'})`);
attn.dispose();
