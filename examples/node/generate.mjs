// Token-by-token generation with a KV cache: a toy decoder (random weights) whose attention runs
// in sdpa-wasm's KVCache, printed with its tokens/s and the cache's memory.
//   node examples/node/generate.mjs [--context N] [--tokens N] [--dtype float32|float16|bfloat16] [--threads N] [--window W] [--sinks] [--alibi]
//
// The model: 2 layers, d_model 512, 8 query heads sharing 2 key/value heads (grouped-query
// attention), head size 64, a vocabulary of 1024. Each layer keeps the keys and values of every
// position seen so far in a KVCache, which lives in wasm memory: a step appends one position and
// attends to all of them in place (no copy of the history). The projections are plain JavaScript
// matrix-vector products; no positional encoding and no MLP (a real model would rotate q and k
// with RoPE before the append, and add a feed-forward block: neither touches the cache).
// --window W makes the even layers local, as Gemma alternates them: each row attends only the W
// positions ending at its own (attend's slidingWindow), the odd layers the whole history.
// --sinks gives every layer learned attention sinks as gpt-oss has them (attend's sinks: one
// logit per query head that joins each row's softmax, with a zero value row); gpt-oss also
// alternates 128-position windows with the whole history: --window 128 --sinks.
// --alibi gives the model its positions the way BLOOM and MPT do instead of by rotating q and k:
// every layer attends with ALiBi, head h's slope 2^(-8(h+1)/8) (attend's alibiSlopes; attend's
// default offset puts each new row at its own position, so the distances are the tokens').
import { parseArgs } from 'node:util';
import { createAttention } from 'sdpa-wasm';

const OPTIONS = {
  context: { type: 'string', default: '1024' },  // cache length when generation starts
  tokens: { type: 'string', default: '32' },     // tokens to generate
  dtype: { type: 'string', default: 'float32' }, // how the cache stores K/V: float32, float16 or bfloat16
  threads: { type: 'string' },                   // default: the package's choice
  window: { type: 'string' },                    // sliding window of the even layers; default none
  sinks: { type: 'boolean', default: false },    // learned attention sinks (gpt-oss) in every layer
  alibi: { type: 'boolean', default: false },    // ALiBi positions (BLOOM, MPT) in every layer
};
const VOCAB = 1024, D_MODEL = 512, LAYERS = 2, HQ = 8, HKV = 2, E = 64, PROMPT = 37;
/** Exits with the usage line and what was wrong (status 2). */
function usage(problem) {
  console.error(`generate.mjs: ${problem}\nusage: node generate.mjs [--context N] [--tokens N] [--dtype float32|float16|bfloat16] [--threads N] [--window W] [--sinks] [--alibi]`);
  process.exit(2);
}
/** The parsed arguments, or the usage line for an unknown option or one given a value it does not take. */
const args = (() => {
  try {
    return parseArgs({ options: OPTIONS }).values;
  } catch (error) {
    return usage(error.message);
  }
})();
/** --name's value as an integer >= min, or the usage line. */
function integerArg(name, min) {
  const value = Number(args[name]);
  if (args[name].trim() === '' || !Number.isInteger(value) || value < min) usage(`--${name} must be an integer >= ${min}, got ${JSON.stringify(args[name])}`);
  return value;
}
const context = integerArg('context', PROMPT), tokens = integerArg('tokens', 1);
const threads = args.threads === undefined ? undefined : integerArg('threads', 1);
const window = args.window === undefined ? undefined : integerArg('window', 1);
/** BLOOM's ALiBi slopes for HQ heads (a power of two): 2^(-8(h+1)/HQ). */
const ALIBI_SLOPES = Float32Array.from({ length: HQ }, (_, h) => 2 ** (-8 * (h + 1) / HQ));
/**
 * attend's options of layer l: a local layer's window (the even ones, with --window), its sinks
 * (--sinks), ALiBi's slopes (--alibi).
 */
const attendOptions = (l) => ({
  layout: 'bshd',
  ...(window !== undefined && l % 2 === 0 ? { slidingWindow: window } : {}),
  ...(layers[l].sinks !== undefined ? { sinks: layers[l].sinks } : {}),
  ...(args.alibi ? { alibiSlopes: ALIBI_SLOPES } : {}),
});
const dtype = args.dtype;
if (!['float32', 'float16', 'bfloat16'].includes(dtype)) usage(`--dtype must be float32, float16 or bfloat16, got ${JSON.stringify(dtype)}`);

// ── Seeded random numbers and weights ──────────────────────────────────────────────────────
let seed = 1;
const random = () => ((seed = (seed * 1664525 + 1013904223) >>> 0) / 2 ** 32) * 2 - 1;  // [-1, 1)
/** n uniform values with variance `variance`. */
const noise = (n, variance = 1) => {
  const a = Math.sqrt(3 * variance);
  return Float32Array.from({ length: n }, () => random() * a);
};
/** A weight matrix [outDim, inDim] with variance 1/inDim, so outputs keep unit scale. */
const matrix = (outDim, inDim) => noise(outDim * inDim, 1 / inDim);

const embedding = noise(VOCAB * D_MODEL);                 // [vocab, d_model]
const layers = Array.from({ length: LAYERS }, () => ({
  wq: matrix(HQ * E, D_MODEL), wk: matrix(HKV * E, D_MODEL), wv: matrix(HKV * E, D_MODEL), wo: matrix(D_MODEL, HQ * E),
  // Learned sink logits, one per query head (--sinks): about the size of the scores.
  sinks: args.sinks ? noise(HQ, 3) : undefined,
}));
const unembedding = matrix(VOCAB, D_MODEL);               // d_model → logits
const prompt = Array.from({ length: PROMPT }, () => Math.floor((random() + 1) / 2 * VOCAB));

// ── Plain-JS building blocks ───────────────────────────────────────────────────────────────
/** y[rows, outDim] = x[rows, inDim] · Wᵀ (W stored [outDim, inDim]). */
function linear(x, rows, inDim, w, outDim) {
  const y = new Float32Array(rows * outDim);
  for (let r = 0; r < rows; r++) {
    for (let o = 0; o < outDim; o++) {
      let s = 0;
      for (let i = 0; i < inDim; i++) s += x[r * inDim + i] * w[o * inDim + i];
      y[r * outDim + o] = s;
    }
  }
  return y;
}
/** Each row divided by its root mean square. */
function rmsnorm(x, rows, dim) {
  const y = new Float32Array(rows * dim);
  for (let r = 0; r < rows; r++) {
    let ss = 0;
    for (let i = 0; i < dim; i++) ss += x[r * dim + i] ** 2;
    const inv = 1 / Math.sqrt(ss / dim + 1e-6);
    for (let i = 0; i < dim; i++) y[r * dim + i] = x[r * dim + i] * inv;
  }
  return y;
}
/** A token drawn from softmax(logits / temperature). */
function sample(logits, temperature = 0.5) {
  const max = Math.max(...logits);
  const p = Array.from(logits, (x) => Math.exp((x - max) / temperature));
  let target = (random() + 1) / 2 * p.reduce((a, b) => a + b, 0);
  for (let i = 0; i < p.length; i++) if ((target -= p[i]) < 0) return i;
  return p.length - 1;
}

// ── The caches: one per layer ──────────────────────────────────────────────────────────────
const attn = await createAttention(threads === undefined ? {} : { threads });
const maxLength = context + tokens;
const caches = layers.map(() => attn.createKVCache({ batch: 1, kvHeads: HKV, headDim: E, valueDim: E, maxLength, dtype }));

// ── One forward pass: L new tokens (the whole prompt at once, or one token per step) ───────
let attentionMs = 0;  // time spent in the caches: append + attend
function forward(tokenIds) {
  const L = tokenIds.length;
  const x = new Float32Array(L * D_MODEL);
  tokenIds.forEach((t, i) => x.set(embedding.subarray(t * D_MODEL, (t + 1) * D_MODEL), i * D_MODEL));
  layers.forEach(({ wq, wk, wv, wo }, l) => {
    const h = rmsnorm(x, L, D_MODEL);
    // Rows of [L, heads · E] are [B = 1, L, heads, E]: the 'bshd' layout, no transposes needed.
    const q = linear(h, L, D_MODEL, wq, HQ * E);
    const k = linear(h, L, D_MODEL, wk, HKV * E);
    const v = linear(h, L, D_MODEL, wv, HKV * E);
    const t0 = performance.now();
    caches[l].append({ data: k, dims: [1, L, HKV, E] }, { data: v, dims: [1, L, HKV, E] }, { layout: 'bshd' });
    // isCausal defaults to true, aligned bottom-right: new row i sees every stored position up to
    // its own (a local layer: the `window` positions ending at it).
    const a = caches[l].attend({ data: q, dims: [1, L, HQ, E] }, attendOptions(l)).output.data;
    attentionMs += performance.now() - t0;
    const o = linear(a, L, HQ * E, wo, D_MODEL);
    for (let i = 0; i < x.length; i++) x[i] += o[i];  // residual
  });
  return linear(rmsnorm(x.subarray((L - 1) * D_MODEL), 1, D_MODEL), 1, D_MODEL, unembedding, VOCAB);
}

// ── 1. Stand-in history: random K/V up to `context` (minus the prompt) ──────────────────────
const filler = context - PROMPT;
for (let done = 0; done < filler; done += 1024) {
  const n = Math.min(1024, filler - done);
  for (const cache of caches) cache.append({ data: noise(n * HKV * E), dims: [1, n, HKV, E] }, { data: noise(n * HKV * E), dims: [1, n, HKV, E] }, { layout: 'bshd' });
}

// ── 2. Prefill: the prompt in one call (Lq = 37 against the cache) ──────────────────────────
let t0 = performance.now();
let logits = forward(prompt);
const prefillMs = performance.now() - t0;  // the first call: includes compiling

// Warm-up: a few steps let V8 compile the decode path to optimised code; truncate() rewinds them.
for (let s = 0; s < Math.min(3, tokens); s++) forward([prompt.at(-1)]);
for (const cache of caches) cache.truncate(context);

// ── 3. Decode: one token at a time ─────────────────────────────────────────────────────────
const generated = [];
attentionMs = 0;
t0 = performance.now();
for (let step = 0; step < tokens; step++) {
  const next = sample(logits);
  generated.push(next);
  logits = forward([next]);  // appends its K/V, attends to context + step + 1 positions
}
const decodeMs = performance.now() - t0;

// ── Report ─────────────────────────────────────────────────────────────────────────────────
const mb = (bytes) => `${(bytes / 2 ** 20).toFixed(2)} MiB`;
const perLayer = caches[0].byteLength;
const tps = (ms) => (tokens / (ms / 1000)).toFixed(1);
console.log(`toy decoder: ${LAYERS} layers, d_model ${D_MODEL}, ${HQ} query heads sharing ${HKV} KV heads, head size ${E}, ` +
  `vocabulary ${VOCAB} (random weights)`);
console.log(`sdpa-wasm: ${attn.threads} thread${attn.threads === 1 ? '' : 's'}, KV cache dtype ${dtype}` +
  (window === undefined ? '' : `; layers ${layers.map((_, l) => (l % 2 === 0 ? `${l} local (slidingWindow ${window})` : `${l} global`)).join(', ')}`) +
  (args.sinks ? `; learned sinks in every layer (layer 0's: ${Array.from(layers[0].sinks, (x) => x.toFixed(2)).join(' ')})` : '') +
  (args.alibi ? `; ALiBi in every layer (slopes 2^-1 … 2^-8)` : ''));
console.log(filler > 0
  ? `context: ${context} positions: ${filler} of random K/V (standing in for earlier text, so that every step ` +
    `attends to a long history), then the ${PROMPT}-token prompt`
  : `context: the ${PROMPT}-token prompt (ask for --context N to fill the cache with random K/V up to N first)`);
console.log(`prefill: the prompt in one forward pass (attend with Lq = ${PROMPT}): ${prefillMs.toFixed(1)} ms ` +
  '(the first call: includes V8 compiling the code)');
console.log(`prompt:    ${prompt.join(' ')}`);
console.log(`generated: ${generated.join(' ')}`);
console.log(`tokens/s: ${tps(decodeMs)} for the whole step (${(decodeMs / tokens).toFixed(2)} ms/token); ` +
  `attention alone (append + attend, ${LAYERS} layers) ${tps(attentionMs)} (${(attentionMs / tokens).toFixed(2)} ms/token, ` +
  `${(100 * attentionMs / decodeMs).toFixed(0)}% of the step; the rest is the JS projections)`);
console.log(`cache: length ${caches[0].length} of maxLength ${maxLength}, ${LAYERS} × ${perLayer} bytes = ${mb(LAYERS * perLayer)} ` +
  `of wasm memory (per layer [1, ${HKV}, ${maxLength}, ${E}] keys + values, ${dtype === 'float32' ? 4 : 2} bytes each)`);

for (const cache of caches) cache.dispose();
attn.dispose();
