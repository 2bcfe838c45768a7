// Calls past maxMemoryBytes, runnable in Node and in a browser page: each case runs on an
// instance without a limit and on one whose limit is a share of that call's peak (for a KV
// cache's attend, the peak before it, the cache and its append's float32 → float16 staging, and
// a share of the call's own), so that the call runs a slice of batches and KV heads at a time
// (js/slices.ts), or, for one sequence of multi-query attention, a few query heads at a time, or,
// for one long query head, a few of its rows at a time. Both must give the same bits, the limited one within its limit and holding
// nothing after. Every result carries a hash of the bits, so a browser run can be checked
// against a Node run.
// Plain ES module: no Node built-ins.
import { noiseTensor } from '../../web/seeded.mjs';
import { bitsHash } from './reference-cases.mjs';

const B = 3, Hq = 6, Hkv = 3, Lq = 40, Lk = 300, E = 32, Ev = 24;
const tensor = (dims, stream) => noiseTensor(dims, 61, stream);
const inputs = () => ({
  query: tensor([B, Hq, Lq, E], 1), key: tensor([B, Hkv, Lk, E], 2), value: tensor([B, Hkv, Lk, Ev], 3),
  gradOutput: tensor([B, Hq, Lq, Ev], 4),
});
const boolMask = (dims) => ({ data: Uint8Array.from({ length: dims.reduce((a, b) => a * b) }, (_, i) => Number(i % 7 !== 3)), dims });

export const LIMITED_CASES = [
  { name: 'sdpa: per-batch causal offsets, key lengths, a bool mask [B, 1, Lq, Lk], weights and log-sum-exp', backward: false,
    options: { isCausal: true, causalOffset: Int32Array.of(260, 200, -4), keyLengths: Int32Array.of(300, 251, 170),
      attnMask: boolMask([B, 1, Lq, Lk]), returnWeights: true, returnLogSumExp: true } },
  { name: 'sdpa, bshd: sinks, ALiBi [B, Hq], dropout', backward: false, bshd: true,
    options: { sinks: Float32Array.of(0, 1, -1, 2, -Infinity, 0.5), alibiSlopes: Float32Array.from({ length: B * Hq }, (_, i) => 2 ** -(1 + (i % 5))),
      dropoutP: 0.2, dropoutSeed: 9, layout: 'bshd' } },
  // With sinks the backward's slices hold every batch: one KV head of three is its smallest.
  { name: 'sdpaBackward: sinks (slices of every batch), softcap, a sliding window', backward: true, share: 0.6,
    options: { sinks: Float32Array.of(0, 1, -1, 2, -Infinity, 0.5), softcap: 5, isCausal: true, causalOffset: 260, slidingWindow: 90 } },
  // K/V in a float16 cache, read in place; the query's rows, the output, weights and mask in slices.
  { name: 'KVCache.attend (float16): key lengths, a float mask [B, Hq, 1, Lk], weights', cache: 'float16', share: 0.3,
    options: { keyLengths: Int32Array.of(300, 280, 9), attnMask: { data: noiseTensor([B, Hq, 1, Lk], 61, 5).data, dims: [B, Hq, 1, Lk] },
      returnWeights: true } },
  // One sequence, one KV head (B 1, Hkv 1: batch 0's query and KV head 0): no smaller slice of
  // batches or KV heads; its 6 query heads of 40 rows each (whole row tiles of the kernel) run a
  // few at a time.
  { name: 'sdpa, multi-query (B 1, Hkv 1): causal, sinks, weights', backward: false, multiQuery: true, share: 0.6,
    options: { isCausal: true, causalOffset: 260, sinks: Float32Array.of(0, 1, -1, 2, -Infinity, 0.5), returnWeights: true } },
  // One query head of 300 rows (B 1, Hq 1, Hkv 1: batch 0's KV head 0): no smaller slice of
  // batches or heads; its rows run a few at a time (each slice's causal offset, ALiBi distances
  // and dropout rows its own place in the head).
  { name: 'sdpa, one long query head (B 1, Hq 1, Lq 300): causal, ALiBi, dropout, weights', backward: false, oneHead: true, share: 0.5,
    options: { isCausal: true, causalOffset: -7, alibiSlopes: Float32Array.of(0.25), dropoutP: 0.2, dropoutSeed: 5, returnWeights: true } },
];

/** Batch 0 of a [B, H, L, D] tensor, its first `heads` heads: [1, heads, L, D]. */
const firstHeads = ({ data, dims: [, , l, d] }, heads) => ({ data: data.subarray(0, heads * l * d), dims: [1, heads, l, d] });

/** KVCache.attend on a cache of `dtype` made on `attn` and filled with key, value; `filled()` is called before the attend. */
function attendFromCache(attn, dtype, { query, key, value }, options, filled) {
  const cache = attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: Lk, dtype });
  cache.append(key, value);
  filled();
  return cache.attend(query, options);
}

/** [B, H, L, D] as [B, L, H, D]. */
function toBshd({ data, dims: [b, h, l, d] }) {
  const out = new Float32Array(data.length);
  for (let i = 0; i < b * h * l; i++) {
    const bb = Math.floor(i / (h * l)), hh = Math.floor(i / l) % h, ll = i % l;
    out.set(data.subarray(i * d, (i + 1) * d), ((bb * l + ll) * h + hh) * d);
  }
  return { data: out, dims: [b, l, h, d] };
}

/**
 * Runs every case with `createAttention` (the package's), `options` for each instance (e.g.
 * { relaxedSimd }). Returns [{ name, same, withinLimit, limited, hash }]: same, that the limited call's
 * results have the unlimited call's bits; withinLimit, that its peak stayed within the limit
 * and nothing is held after; limited, that the limit was below the unlimited call's peak.
 */
export async function runLimitedCases(createAttention, options = {}, cases = LIMITED_CASES) {
  const results = [];
  for (const c of cases) {
    let { query, key, value, gradOutput } = inputs();
    if (c.bshd) [query, key, value, gradOutput] = [query, key, value, gradOutput].map(toBshd);
    if (c.multiQuery) [query, key, value] = [firstHeads(query, Hq), firstHeads(key, 1), firstHeads(value, 1)];
    if (c.oneHead) [query, key, value] = [tensor([1, 1, 300, E], 6), firstHeads(key, 1), firstHeads(value, 1)];
    // `before`: the peak before the call (a cache and its append's staging; 0 without).
    let before = 0;
    const call = (attn, filled) => {
      if (c.cache) return attendFromCache(attn, c.cache, { query, key, value }, c.options, filled);
      return c.backward ? attn.sdpaBackward(query, key, value, gradOutput, c.options) : attn.sdpa(query, key, value, c.options);
    };
    const arraysOf = (result) => Object.keys(result).sort().map((name) => result[name].data);
    const unlimited = await createAttention(options);
    const expected = arraysOf(call(unlimited, () => { before = unlimited.memory().peakBytes; }));
    const peak = unlimited.memory().peakBytes;
    unlimited.dispose();
    const limit = before + Math.floor((peak - before) * (c.share ?? 0.35));
    const attn = await createAttention({ ...options, maxMemoryBytes: limit });
    let held = 0;
    const got = arraysOf(call(attn, () => { held = attn.memory().bytesInUse; }));
    const { peakBytes } = attn.memory();
    const bytesInUse = attn.memory().bytesInUse - held;
    attn.dispose();
    const bits = (data) => new Uint32Array(data.buffer, data.byteOffset, data.length);
    const same = got.length === expected.length && got.every((data, i) => {
      const x = bits(data), y = bits(expected[i]);
      return x.length === y.length && x.every((word, j) => word === y[j]);
    });
    results.push({ name: c.name, same, withinLimit: peakBytes <= limit && bytesInUse === 0, limited: limit < peak,
      hash: got.map(bitsHash).join(' ') });
  }
  return results;
}
