// Seeded inputs for the demo page, shared with the browser tests (which import this file in
// Node to recompute what the page shows). Everything here uses only integer operations, + − ×
// and Math.sqrt (correctly rounded), so a seed gives bit-identical Float32Arrays in every
// JavaScript engine: the page and Node see exactly the same Q, K and V.

// Math.imul read once: inside Jest's test environment every `Math.…` call in a loop costs about
// 250 ns (a few ns in a page or in plain Node), and the tests draw millions of these numbers.
const imul = Math.imul;

/** A 32-bit avalanche hash of an unsigned 32-bit integer. */
export function mix32(x) {
  x = imul(x ^ (x >>> 16), 0x7feb352d);
  x = imul(x ^ (x >>> 15), 0x846ca68b);
  return (x ^ (x >>> 16)) >>> 0;
}

/** Combines several integers (or strings) into one 32-bit seed. */
export function seedOf(...parts) {
  let h = 0x2545f491;
  for (const part of parts) {
    if (typeof part === 'string') {
      for (let i = 0; i < part.length; i++) h = mix32(h ^ imul(part.charCodeAt(i) + 1, 0x9e3779b1));
      h = mix32(h ^ 0xa5a5a5a5);
    } else {
      h = mix32(h ^ mix32((part >>> 0) + 0x632be5ab));
    }
  }
  return h;
}

/** A counter-based stream of uniform numbers in [0, 1) with 32 bits of resolution. */
export function uniformStream(seed) {
  const key = mix32(seed >>> 0);
  let counter = 0;
  return () => mix32((key + imul(counter++, 0x9e3779b9)) >>> 0) / 4294967296;
}

const SQRT3 = Math.sqrt(3);

/**
 * n values with mean 0 and variance 1, close to normal: the sum of four uniforms, centred and
 * scaled (Irwin–Hall), so only + − × are involved and every engine gives the same bits.
 */
export function unitNoise(n, seed) {
  const next = uniformStream(seed);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = (next() + next() + next() + next() - 2) * SQRT3;
  return out;
}

const product = (dims) => dims.reduce((a, b) => a * b, 1);

/** A [dims] tensor of unit noise. `stream` separates Q, K and V drawn from one seed. */
export function noiseTensor(dims, seed, stream = 0) {
  return { data: unitNoise(product(dims), seedOf(seed, stream)), dims: [...dims] };
}

/** Random Q, K, V of shape [1, heads, seqLen, dk] from one seed (streams 1, 2, 3). */
export function randomQKV({ seqLen, dk, heads, seed }) {
  const dims = [1, heads, seqLen, dk];
  return { query: noiseTensor(dims, seed, 1), key: noiseTensor(dims, seed, 2), value: noiseTensor(dims, seed, 3) };
}

/** Splits a short text into word and punctuation tokens (at most maxTokens). */
export function tokenize(text, maxTokens = 64) {
  return (String(text).match(/[\p{L}\p{N}'’]+|[^\s\p{L}\p{N}]/gu) ?? []).slice(0, maxTokens);
}

/**
 * The toy embedding of the text mode: every token (lower-cased) has a fixed random vector per
 * head, and every position one too. Each head mixes the two differently, so the heads show
 * recognisable patterns:
 *   head 0, 3, 6 …: "same word"      q_i = e(w_i),           k_j = e(w_j)
 *   head 1, 4, 7 …: "previous token" q_i = p(i),             k_j = p(j + 1)
 *   head 2, 5, …:   both             q_i = (e(w_i) + p(i))/√2, k_j = (e(w_j) + p(j + 1))/√2
 * and v_j = e(w_j) (so an output row is a blend of the attended tokens' vectors).
 */
export const TOY_HEAD_KINDS = ['same word', 'previous token', 'same word + previous token'];

export function textQKV({ text, dk, heads, seed }) {
  const tokens = tokenize(text);
  const L = tokens.length;
  const dims = [1, heads, L, dk];
  const n = product(dims);
  const query = new Float32Array(n), key = new Float32Array(n), value = new Float32Array(n);
  const word = new Map();
  const wordVector = (w, h) => {
    const id = `${h}:${w.toLowerCase()}`;
    if (!word.has(id)) word.set(id, unitNoise(dk, seedOf(seed, 'word', w.toLowerCase(), h)));
    return word.get(id);
  };
  const positionVector = (i, h) => unitNoise(dk, seedOf(seed, 'position', i, h));
  const half = Math.SQRT1_2;
  for (let h = 0; h < heads; h++) {
    const kind = h % 3;
    for (let i = 0; i < L; i++) {
      const e = wordVector(tokens[i], h);
      const pq = positionVector(i, h), pk = positionVector(i + 1, h);
      const at = (h * L + i) * dk;
      for (let d = 0; d < dk; d++) {
        if (kind === 0) {
          query[at + d] = e[d];
          key[at + d] = e[d];
        } else if (kind === 1) {
          query[at + d] = pq[d];
          key[at + d] = pk[d];
        } else {
          query[at + d] = (e[d] + pq[d]) * half;
          key[at + d] = (e[d] + pk[d]) * half;
        }
        value[at + d] = e[d];
      }
    }
  }
  return { query: { data: query, dims }, key: { data: key, dims }, value: { data: value, dims: [...dims] }, tokens };
}

/** The heatmap panel's inputs: random or from the text, as the page's controls say. */
export function heatmapInputs(params) {
  if (params.source === 'text') return textQKV(params);
  return { ...randomQKV(params), tokens: null };
}

/** How the page prints a number from sdpa-wasm's output (the tests compare this text). */
export function formatValue(x) {
  if (Number.isNaN(x)) return 'NaN';
  const s = x.toFixed(4);
  return s === '-0.0000' ? '0.0000' : s;
}
