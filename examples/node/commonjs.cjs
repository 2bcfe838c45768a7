// From CommonJS: the package is ES modules, and Node 20.19+ / 22.12+ load them with require()
// (no flag; the package has no top-level await). On older Node, `await import('sdpa-wasm')`.
//   node examples/node/commonjs.cjs
const { createAttention, createAttentionWorker } = require('sdpa-wasm');

// Causal self-attention: B=1, 2 heads, 64 tokens, head size 32.
const [B, H, L, E] = [1, 2, 64, 32];
let seed = 11;
const random = () => ((seed = (seed * 1664525 + 1013904223) >>> 0) / 2 ** 32) * 2 - 1;
const tensor = () => ({ data: Float32Array.from({ length: B * H * L * E }, random), dims: [B, H, L, E] });
const [query, key, value] = [tensor(), tensor(), tensor()];

async function main() {
  const attn = await createAttention({ threads: 1 });
  const { output } = attn.sdpa(query, key, value, { isCausal: true });
  console.log(`require('sdpa-wasm'): output dims [${output.dims.join(', ')}], isa ${attn.isa}`);
  // Row 0 of a causal mask sees key 0 only: its output is value row 0.
  const firstRow = [...output.data.subarray(0, E)].every((x, c) => x === value.data[c]);
  console.log(`output row 0 = value row 0 (causal): ${firstRow}`);
  attn.dispose();

  // The worker too (its script is an ES module found next to the package's index.js).
  const worker = await createAttentionWorker({ threads: 1 });
  const fromWorker = (await worker.sdpa(query, key, value, { isCausal: true })).output.data;
  console.log(`worker: ${fromWorker.every((x, i) => Object.is(x, output.data[i])) ? 'bitwise equal' : 'DIFFERENT'}`);
  await worker.dispose();
}

main().catch((error) => {
  console.error(error);
  process.exitCode = 1;
});
