// sdpa-wasm from TypeScript (strict): a forward pass with its weights and log-sum-exp, the
// backward pass from what the forward saved, a KV cache, and the same call in a worker.
//   npm install && npm run build && npm start
import { createAttention, createAttentionWorker, type Tensor } from 'sdpa-wasm';

// Causal self-attention: B=1, 4 heads, 64 tokens, head size 32.
const [B, H, L, E] = [1, 4, 64, 32];
let seed = 7;
const random = () => ((seed = (seed * 1664525 + 1013904223) >>> 0) / 2 ** 32) * 2 - 1;
const tensor = (dims: number[]): Tensor => ({
  data: Float32Array.from({ length: dims.reduce((a, b) => a * b, 1) }, random), dims,
});
const [query, key, value] = [tensor([B, H, L, E]), tensor([B, H, L, E]), tensor([B, H, L, E])];
const maxDifference = (a: Float32Array, b: Float32Array) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - (b[i] ?? NaN))), 0);

using attn = await createAttention({ threads: 1 });

// returnWeights and returnLogSumExp set to true: the types make `weights` and `logSumExp`
// present (no `!` needed).
const forward = attn.sdpa(query, key, value, { isCausal: true, returnWeights: true, returnLogSumExp: true });
const row = (i: number) => forward.weights.data.subarray(i * L, (i + 1) * L);  // head 0
console.log(`output dims [${forward.output.dims.join(', ')}], logSumExp dims [${forward.logSumExp.dims.join(', ')}]`);
console.log(`weights row 5 sums to ${row(5).reduce((a, b) => a + b, 0).toFixed(6)}, keys after 5 get ${row(5)[6]}`);

// The gradients of sum(output · gradOutput), from the forward's saved output and log-sum-exp.
const gradOutput = tensor([B, H, L, E]);
const grads = attn.sdpaBackward(query, key, value, gradOutput, {
  isCausal: true, saved: { output: forward.output, logSumExp: forward.logSumExp },
});
const recomputed = attn.sdpaBackward(query, key, value, gradOutput, { isCausal: true });
console.log(`dKey dims [${grads.dKey.dims.join(', ')}]; from saved vs recomputed: max difference ` +
  `${maxDifference(grads.dQuery.data, recomputed.dQuery.data)}`);

// A KV cache: append the keys and values, attend with the last query row of each head
// (causal, bottom-right aligned by default: it sees all L positions).
{
  using cache = attn.createKVCache({ batch: B, kvHeads: H, headDim: E, maxLength: L, dtype: 'float32' });
  cache.append(key, value);
  const last = new Float32Array(H * E);
  for (let h = 0; h < H; h++) last.set(query.data.subarray((h * L + L - 1) * E, (h * L + L) * E), h * E);
  const step = cache.attend({ data: last, dims: [B, H, 1, E] });
  const expected = new Float32Array(H * E);
  for (let h = 0; h < H; h++) expected.set(forward.output.data.subarray((h * L + L - 1) * E, (h * L + L) * E), h * E);
  console.log(`KV cache: length ${cache.length}, ${cache.byteLength} bytes; last row vs sdpa: max difference ` +
    `${maxDifference(step.output.data, expected) < 1e-5 ? '< 1e-5' : maxDifference(step.output.data, expected)}`);
}

// The same forward in a worker: bitwise the direct call's.
{
  await using worker = await createAttentionWorker({ threads: 1 });
  const viaWorker = await worker.sdpa(query, key, value, { isCausal: true, returnWeights: true });
  const same = viaWorker.output.data.every((x, i) => Object.is(x, forward.output.data[i])) &&
    viaWorker.weights.data.every((x, i) => Object.is(x, forward.weights.data[i]));
  console.log(`worker: ${same ? 'bitwise equal' : 'DIFFERENT'} to the direct call`);
}
