// Sentences of different lengths through one attention layer, packed back to back with no
// padding (attn.sdpaVarlen), then mean-pooled into one vector per sentence: what a sentence-
// embedding model (MiniLM: 6 heads of 64 over 384 dims) does with a page's paragraphs. Random
// token vectors stand in for the model's; the lengths are drawn from a fixed seed.
//   node examples/node/packed.mjs [--sentences N] [--threads T]
import { parseArgs } from 'node:util';
import { createAttention } from 'sdpa-wasm';

const usage = 'usage: node packed.mjs [--sentences N (default 64)] [--threads T]';
let values;
try {
  ({ values } = parseArgs({ options: { sentences: { type: 'string' }, threads: { type: 'string' } } }));
} catch (error) {
  console.error(`packed.mjs: ${error.message}\n${usage}`);
  process.exit(2);
}
const integer = (name, fallback) => {
  const given = values[name];
  if (given === undefined) return fallback;
  const n = Number(given);
  if (!/^\d+$/.test(given) || n < 1) {
    console.error(`packed.mjs: --${name} must be an integer >= 1, got ${JSON.stringify(given)}\n${usage}`);
    process.exit(2);
  }
  return n;
};
const S = integer('sentences', 64), threads = integer('threads', undefined);
const [H, E] = [6, 64];

let seed = 7;
const random = () => ((seed = (seed * 1664525 + 1013904223) >>> 0) / 2 ** 32);
const lengths = Array.from({ length: S }, () => 8 + Math.floor(random() * 121));  // 8 to 128 tokens
const T = lengths.reduce((a, b) => a + b, 0), Lmax = Math.max(...lengths);
// Where each sentence starts in the packed rows: [0, L0, L0 + L1, ..., T].
const cuSeqlensQ = Int32Array.from([0, ...lengths.map(((sum) => (n) => (sum += n))(0))]);
const packed = () => ({ data: Float32Array.from({ length: T * H * E }, () => random() * 2 - 1), dims: [T, H, E] });
const [query, key, value] = [packed(), packed(), packed()];

const attn = await createAttention(threads === undefined ? {} : { threads });
const { output } = attn.sdpaVarlen(query, key, value, { cuSeqlensQ });  // [T, H, E]

// Mean over each sentence's tokens: one H·E vector per sentence.
const embedding = (s) => {
  const v = new Float64Array(H * E);
  for (let r = cuSeqlensQ[s]; r < cuSeqlensQ[s + 1]; r++) for (let c = 0; c < H * E; c++) v[c] += output.data[r * H * E + c];
  return v.map((x) => x / lengths[s]);
};
console.log(`packed: ${S} sentences of ${Math.min(...lengths)}-${Lmax} tokens, ${T} in all: query [${query.dims.join(', ')}] -> output [${output.dims.join(', ')}]`);
console.log(`embedding[0][0:4] = ${[...embedding(0).subarray(0, 4)].map((x) => x.toFixed(5)).join(' ')}`);
console.log(`embedding[${S - 1}][0:4] = ${[...embedding(S - 1).subarray(0, 4)].map((x) => x.toFixed(5)).join(' ')}`);

// The same sentences padded to the longest ([S, Lmax, H, E], 'bshd'), keyLengths for the keys.
const pad = (t) => {
  const data = new Float32Array(S * Lmax * H * E);
  for (let s = 0; s < S; s++) data.set(t.data.subarray(cuSeqlensQ[s] * H * E, cuSeqlensQ[s + 1] * H * E), s * Lmax * H * E);
  return { data, dims: [S, Lmax, H, E] };
};
const padded = [pad(query), pad(key), pad(value)];
const keyLengths = Int32Array.from(lengths);
const paddedOut = attn.sdpa(...padded, { layout: 'bshd', keyLengths }).output;
let worst = 0;
for (let s = 0; s < S; s++) {
  for (let n = 0; n < lengths[s] * H * E; n++) {
    worst = Math.max(worst, Math.abs(output.data[cuSeqlensQ[s] * H * E + n] - paddedOut.data[s * Lmax * H * E + n]));
  }
}
console.log(`padded to ${Lmax} tokens with keyLengths: the sentences' rows differ from packed by at most ${worst.toExponential(1)}`);
// The same attention two ways: the rows agree to float32 rounding (the values here are of order 1).
if (!(worst <= 1e-5)) {
  console.error(`packed.mjs: packed and padded rows differ by ${worst}, more than 1e-5`);
  process.exitCode = 1;
}

// Speed: medians of 9 runs after 2 of warm-up.
const median = (run) => {
  for (let i = 0; i < 2; i++) run();
  const times = [];
  for (let i = 0; i < 9; i++) {
    const t0 = performance.now();
    run();
    times.push(performance.now() - t0);
  }
  return times.sort((a, b) => a - b)[4];
};
// Both into arrays of their own (a new output array per call would time its allocation too).
const out = new Float32Array(T * H * E), paddedInto = new Float32Array(S * Lmax * H * E);
const msPacked = median(() => attn.sdpaVarlen(query, key, value, { cuSeqlensQ, out }));
const msPadded = median(() => attn.sdpa(...padded, { layout: 'bshd', keyLengths, out: paddedInto }));
const work = lengths.reduce((a, L) => a + L * L, 0), paddedWork = lengths.reduce((a, L) => a + Lmax * L, 0);
console.log(`time: packed ${msPacked.toFixed(2)} ms, padded ${msPadded.toFixed(2)} ms (${(msPadded / msPacked).toFixed(2)}x; ` +
  `padding adds ${((paddedWork / work - 1) * 100).toFixed(0)}% multiply-adds), ${attn.threads} thread${attn.threads === 1 ? '' : 's'}`);
attn.dispose();
