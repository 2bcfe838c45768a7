// The generation panel's toy decoder: a small transformer with random (seeded) weights whose
// attention runs in sdpa-wasm's KVCache, one cache per layer. Shared with the browser tests,
// which import it in Node to recompute the tokens the page generates.
//
// The caches come from an Attention (the tests: every cache call answers at once) or from an
// AttentionWorker (the page: the caches live in the worker, every call answers with a promise).
// Every cache call is awaited, so one code path drives both, with the same calls in the same
// order and the same bits.
//
// The projections are plain JavaScript (float64 sums of float32 products: the same bits in
// every engine, like seeded.mjs), on the calling thread; the next token is sampled with Math.exp
// (V8's fdlibm port in Node and Chromium).
//
// One step, per layer:  h = rmsnorm(x);  q, k, v = Wq·h, Wk·h, Wv·h;  cache.append(k, v);
//                       x = x + Wo·cache.attend(q)
// then logits = Wout·rmsnorm(x). No positional encoding and no MLP: a real model would rotate
// q and k (RoPE) before the append and add a feed-forward block; neither touches the cache.
import { seedOf, uniformStream, unitNoise } from './seeded.mjs';

export const TOY = Object.freeze({
  vocab: 1024,
  dModel: 512,     // = qHeads · headDim
  layers: 2,
  qHeads: 8,       // query heads ...
  kvHeads: 2,      // ... sharing 2 key/value heads (GQA: 4 query heads per KV head)
  headDim: 64,
  promptLength: 37,
  temperature: 0.5,
});

/** Positions of random K/V appended per call of fill() (and per seed block). */
export const FILL_BLOCK = 256;
/** Decode steps run, then rewound with cache.truncate(), before the timed ones. */
export const WARMUP_STEPS = 3;

/** y[rows, outDim] = x[rows, inDim] · Wᵀ, with W stored [outDim, inDim]. */
function linear(x, rows, inDim, w, outDim) {
  const y = new Float32Array(rows * outDim);
  for (let r = 0; r < rows; r++) {
    const xr = r * inDim;
    for (let o = 0; o < outDim; o++) {
      const wo = o * inDim;
      let s = 0;
      for (let i = 0; i < inDim; i++) s += x[xr + i] * w[wo + i];
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
    for (let i = 0; i < dim; i++) ss += x[r * dim + i] * x[r * dim + i];
    const inv = 1 / Math.sqrt(ss / dim + 1e-6);
    for (let i = 0; i < dim; i++) y[r * dim + i] = x[r * dim + i] * inv;
  }
  return y;
}

/** A [outDim, inDim] matrix with variance 1/inDim (outputs keep unit scale). */
const matrix = (outDim, inDim, seed, ...name) => {
  const w = unitNoise(outDim * inDim, seedOf(seed, ...name));
  const s = 1 / Math.sqrt(inDim);
  for (let i = 0; i < w.length; i++) w[i] *= s;
  return w;
};

/** The toy model's weights from one seed. */
export function toyWeights(seed) {
  const { vocab, dModel, layers, qHeads, kvHeads, headDim } = TOY;
  return {
    seed,
    embedding: unitNoise(vocab * dModel, seedOf(seed, 'embedding')),  // [vocab, dModel]
    layers: Array.from({ length: layers }, (_, l) => ({
      wq: matrix(qHeads * headDim, dModel, seed, 'wq', l),
      wk: matrix(kvHeads * headDim, dModel, seed, 'wk', l),
      wv: matrix(kvHeads * headDim, dModel, seed, 'wv', l),
      wo: matrix(dModel, qHeads * headDim, seed, 'wo', l),
    })),
    output: matrix(vocab, dModel, seed, 'output'),                       // [vocab, dModel]
  };
}

/** The prompt: TOY.promptLength seeded token ids. */
export function promptTokens(seed) {
  const next = uniformStream(seedOf(seed, 'prompt'));
  return Array.from({ length: TOY.promptLength }, () => Math.floor(next() * TOY.vocab));
}

/** Samples a token from softmax(logits / temperature) with a uniform u in [0, 1). */
export function sampleToken(logits, temperature, u) {
  let max = -Infinity;
  for (const x of logits) if (x > max) max = x;
  const p = new Float64Array(logits.length);
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += (p[i] = Math.exp((logits[i] - max) / temperature));
  let target = u * sum;
  for (let i = 0; i < p.length; i++) if ((target -= p[i]) < 0) return i;
  return p.length - 1;
}

export class ToyDecoder {
  /**
   * One KV cache per layer, maxLength positions each, made by `attention`: an Attention (the
   * caches are in its wasm memory) or an AttentionWorker (they are in the worker's).
   */
  static async create(attention, weights, { dtype, maxLength }) {
    const caches = [];
    try {
      for (let l = 0; l < TOY.layers; l++) {
        caches.push(await attention.createKVCache({
          batch: 1, kvHeads: TOY.kvHeads, headDim: TOY.headDim, valueDim: TOY.headDim, maxLength, dtype,
        }));
      }
    } catch (error) {
      await Promise.all(caches.map((cache) => cache.dispose()));
      throw error;
    }
    return new ToyDecoder(weights, caches);
  }

  /** Use ToyDecoder.create(), which makes the caches. */
  constructor(weights, caches) {
    this.weights = weights;
    this.caches = caches;
    this.lastAttention = null;  // the last layer's attend() output of the last forward()
  }

  /** Positions stored (the same in every layer; exact once the cache calls made have settled). */
  get length() { return this.caches[0].length; }
  get maxLength() { return this.caches[0].maxLength; }
  get dtype() { return this.caches[0].dtype; }
  /** Bytes of wasm memory the caches take, all layers. */
  get byteLength() { return this.caches.reduce((sum, c) => sum + c.byteLength, 0); }

  /**
   * Appends `count` positions of random unit-variance K/V to every layer: stands in for a long
   * earlier context. Position p's values depend only on the seed and p, however it is split.
   */
  async fill(count, seed) {
    const { kvHeads, headDim } = TOY;
    const row = kvHeads * headDim;
    for (let left = count; left > 0;) {
      const at = this.length, block = Math.floor(at / FILL_BLOCK), offset = at % FILL_BLOCK;
      const n = Math.min(left, FILL_BLOCK - offset);
      for (const [l, cache] of this.caches.entries()) {
        const part = (what) => ({
          data: unitNoise((offset + n) * row, seedOf(seed, 'fill', what, l, block)).subarray(offset * row),
          dims: [1, n, kvHeads, headDim],
        });
        await cache.append(part('k'), part('v'), { layout: 'bshd' });
      }
      left -= n;
    }
  }

  /**
   * Runs `tokens` (the prompt at once, or one token) through the model, appending their K/V.
   * Returns the last position's logits and the milliseconds spent in the caches (append + attend;
   * with an AttentionWorker, that includes the round trips to the worker).
   */
  async forward(tokens) {
    const { dModel, qHeads, kvHeads, headDim, vocab } = TOY;
    const L = tokens.length;
    const x = new Float32Array(L * dModel);
    tokens.forEach((t, i) => x.set(this.weights.embedding.subarray(t * dModel, (t + 1) * dModel), i * dModel));
    let attentionMs = 0;
    for (const [l, cache] of this.caches.entries()) {
      const { wq, wk, wv, wo } = this.weights.layers[l];
      const h = rmsnorm(x, L, dModel);
      // Rows of [L, heads · headDim] are [B = 1, L, H, E] in the 'bshd' layout: no transposes.
      const q = linear(h, L, dModel, wq, qHeads * headDim);
      const k = linear(h, L, dModel, wk, kvHeads * headDim);
      const v = linear(h, L, dModel, wv, kvHeads * headDim);
      const t0 = performance.now();
      // Not awaited before attend(): through an AttentionWorker the two calls then travel as one
      // message (one round trip per layer); they still run in order. On a direct cache both are
      // synchronous anyway. Awaited together, so that if both reject (a worker terminated
      // mid-step) neither rejection goes unhandled.
      const appended = cache.append({ data: k, dims: [1, L, kvHeads, headDim] }, { data: v, dims: [1, L, kvHeads, headDim] }, { layout: 'bshd' });
      // Causal by default, aligned bottom-right: query row i sees the stored positions up to its own.
      const attended = cache.attend({ data: q, dims: [1, L, qHeads, headDim] }, { layout: 'bshd' });
      const a = (await Promise.all([appended, attended]))[1].output.data;
      attentionMs += performance.now() - t0;
      const o = linear(a, L, qHeads * headDim, wo, dModel);
      for (let i = 0; i < x.length; i++) x[i] += o[i];
      if (l === this.caches.length - 1) this.lastAttention = a.slice((L - 1) * qHeads * headDim);
    }
    const last = rmsnorm(x.subarray((L - 1) * dModel), 1, dModel);
    return { logits: linear(last, 1, dModel, this.weights.output, vocab), attentionMs };
  }

  async truncate(n) { for (const cache of this.caches) await cache.truncate(n); }

  async dispose() { for (const cache of this.caches) await cache.dispose(); }
}

/**
 * One run, as a sequence of events (an async generator, so the page can update between them
 * and Node can run them straight through, with the same results):
 *   { phase: 'fill', length }                 after each FILL_BLOCK of random K/V
 *   { phase: 'prefill', ms, attentionMs }     the prompt in one forward() (Lq = promptLength)
 *   { phase: 'warmup' }                       WARMUP_STEPS steps, then truncated away
 *   { phase: 'decode', step, token, ms, attentionMs }   every generated token
 * `context` is the cache's length when decoding starts: random positions, then the prompt.
 */
export async function* generation(decoder, { context, tokens, seed }) {
  const prompt = promptTokens(seed);
  const fillCount = Math.max(0, context - prompt.length);
  while (decoder.length < fillCount) {
    await decoder.fill(Math.min(FILL_BLOCK, fillCount - decoder.length), seed);
    yield { phase: 'fill', length: decoder.length };
  }
  let t0 = performance.now();
  let { logits, attentionMs } = await decoder.forward(prompt);
  yield { phase: 'prefill', ms: performance.now() - t0, attentionMs };

  // Let V8 compile the decode path to optimised code, then rewind: the cache is as it was.
  const saved = decoder.length;
  const warmup = Math.min(WARMUP_STEPS, decoder.maxLength - saved);
  for (let s = 0; s < warmup; s++) await decoder.forward([prompt[prompt.length - 1]]);
  await decoder.truncate(saved);
  yield { phase: 'warmup', steps: warmup };

  const uniform = uniformStream(seedOf(seed, 'sample'));
  let token = sampleToken(logits, TOY.temperature, uniform());
  for (let step = 0; step < tokens; step++) {
    // The token just chosen goes in; the next one comes out.
    const input = token;
    t0 = performance.now();
    ({ logits, attentionMs } = await decoder.forward([input]));
    token = sampleToken(logits, TOY.temperature, uniform());
    yield { phase: 'decode', step, token: input, ms: performance.now() - t0, attentionMs };
  }
}
