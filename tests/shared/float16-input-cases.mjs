// Float16Array inputs (query, key, value, gradOutput, a float mask), in the engines that have
// Float16Array (Chromium, Firefox, WebKit; not Node 20: these run in pages only). A call given
// Float16Array data must give, bit for bit, the results of the same call given the same values
// as Float32Array (which the other suites check against the float64 reference; here too for
// the small forward cases), on every way a call runs: whole, a decode streamed segment by
// segment, a prefill streamed (batch, KV head) by (batch, KV head), slices past maxMemoryBytes,
// packed sequences whole and in chunks, a KV cache's attend, the backward (with `saved` from a
// Float16Array forward, given Float32Array inputs). Each case makes its Float16Arrays anew for
// every call (a worker call with { transfer: true } detaches them). Plain ES module: runs on
// instances made by `make(options)`, createAttention's or createAttentionWorker's (every call
// awaited).
import { maxRelError, referenceSdpa } from '../node/reference.mjs';
import { noiseTensor } from '../../web/seeded.mjs';
import { storedValues } from './kv-cache-cases.mjs';
import { bitsHash, REFERENCE_TOL } from './reference-cases.mjs';
import { WIDEN_IN_WASM_MIN_ELEMENTS as W } from '../../dist/memory.js';

/** Values a half holds exactly (so a Float16Array of them is made without rounding): seeded noise times `scale`, rounded to halves. */
function halfValues(dims, seed, stream, scale = 1) {
  const t = noiseTensor(dims, seed, stream);
  return storedValues('float16', { data: t.data.map((x) => x * scale), dims: t.dims });
}

/** A float mask of `dims` whose every 5th element is -Infinity and the rest small biases (values a half holds). */
function halfMask(dims, seed) {
  const t = halfValues(dims, seed, 9, 0.5);
  for (let i = 0; i < t.data.length; i += 5) t.data[i] = -Infinity;
  return t;
}

const asHalves = (t) => ({ data: Float16Array.from(t.data), dims: t.dims });
const asFloats = (t) => ({ data: Float32Array.from(t.data), dims: t.dims });
/** As asHalves, but a view starting at element `offset` of a larger Float16Array (an odd one: 2 bytes past a float32's alignment). */
const asHalvesAt = (offset) => (t) => {
  const whole = new Float16Array(offset + t.data.length + 1);
  whole.set(t.data, offset);
  return { data: whole.subarray(offset, offset + t.data.length), dims: t.dims };
};

/** The bits of every Float32Array among a result's tensors (output, weights, logSumExp, gradients), in a fixed order. */
function resultHash(result) {
  return Object.keys(result).sort().map((name) => (result[name]?.data instanceof Float32Array ? `${name}:${bitsHash(result[name].data)}` : ''))
    .join(' ');
}

/**
 * Each case: { name, values(seed) (the inputs' values, halves' own), call(instance, tensors,
 * extra, filled), and optionally: instance (options for make()), floatParts (the inputs given as
 * Float16Array; default all), halfOffset (the Float16Arrays are views from this element of larger
 * ones), reference(values) (the float64 reference's output, for the Float32Array run), peakBelow
 * (bytes: the call's peak on its instance must stay below it, which the whole copy's would not:
 * the streamed or chunked way ran), share (the calls run on an instance limited to the memory
 * held when `filled()` is called (0 if never) plus this share of the rest of the Float32Array
 * call's peak on an instance of its own: they run in slices) }. `extra` goes into every call's
 * options (a worker's transfer).
 */
const B = 2, Hq = 4, Hkv = 2;
/** Starts of 11 packed sequences of 1024 rows: 100 rows each, the last 24 (chunks of a few sequences). */
const ELEVEN_SEQUENCES = Int32Array.from({ length: 12 }, (_, i) => Math.min(1024, 100 * i));
export const FLOAT16_INPUT_CASES = [
  {
    name: 'sdpa whole: causal, a float mask [Lq, Lk] as Float16Array, weights and log-sum-exp',
    values: (seed) => ({ q: halfValues([B, Hq, 37, 40], seed, 1), k: halfValues([B, Hkv, 45, 40], seed, 2),
      v: halfValues([B, Hkv, 45, 24], seed, 3), mask: halfMask([37, 45], seed) }),
    call: (attn, t, extra) => attn.sdpa(t.q, t.k, t.v, { isCausal: true, causalOffset: 8, attnMask: t.mask, returnWeights: true, returnLogSumExp: true, ...extra }),
    reference: (t) => referenceSdpa(t.q, t.k, t.v, { isCausal: true, causalOffset: 8, attnMask: t.mask }).output,
  },
  {
    name: 'sdpa whole, bshd: GQA, Ev ≠ E',
    values: (seed) => ({ q: halfValues([B, 29, Hq, 16], seed, 1), k: halfValues([B, 31, Hkv, 16], seed, 2), v: halfValues([B, 31, Hkv, 8], seed, 3) }),
    call: (attn, t, extra) => attn.sdpa(t.q, t.k, t.v, { layout: 'bshd', ...extra }),
    reference: (t) => referenceSdpa(t.q, t.k, t.v, { layout: 'bshd' }).output,
  },
  {
    // A Float16Array of W elements or more is copied in as raw halves and widened in wasm memory,
    // a shorter one by set() (js/memory.ts, writeFloats): Q of W - 1 elements, V of W, K of 4W - 4.
    name: `sdpa whole: Float16Arrays beside the length from which they are widened in wasm memory (${W - 1} and ${W} elements)`,
    values: (seed) => ({ q: halfValues([1, 1, 1, W - 1], seed, 1), k: halfValues([1, 1, 4, W - 1], seed, 2),
      v: halfValues([1, 1, 4, W / 4], seed, 3, 4) }),
    call: (attn, t, extra) => attn.sdpa(t.q, t.k, t.v, { scale: 1 / 64, ...extra }),
    reference: (t) => referenceSdpa(t.q, t.k, t.v, { scale: 1 / 64 }).output,
  },
  {
    // K and V of 4 MiB as float32 (2 MiB as halves): streamed, sized by their float32 bytes.
    name: 'sdpa decode streamed segment by segment: K/V [1, 2, 4096, 64]',
    values: (seed) => ({ q: halfValues([1, 4, 1, 64], seed, 1), k: halfValues([1, Hkv, 4096, 64], seed, 2), v: halfValues([1, Hkv, 4096, 64], seed, 3) }),
    call: (attn, t, extra) => attn.sdpa(t.q, t.k, t.v, { ...extra }),
    peakBelow: 2 ** 20,  // the whole copy's K/V alone: 4 MiB
  },
  {
    // The Float16Arrays are views from an odd element of their buffers, and Lk·Ev is odd: most
    // segments start 2 bytes past a float32's alignment in their buffers.
    name: 'sdpa decode streamed: K/V [1, 2, 4133, 64 | 63], Float16Arrays at odd element offsets',
    halfOffset: 1,
    values: (seed) => ({ q: halfValues([1, 4, 1, 64], seed, 1), k: halfValues([1, Hkv, 4133, 64], seed, 2), v: halfValues([1, Hkv, 4133, 63], seed, 3) }),
    call: (attn, t, extra) => attn.sdpa(t.q, t.k, t.v, { ...extra }),
    peakBelow: 2 ** 20,
  },
  {
    // One thread, Q/K/V of 2 MiB as float32: streamed one (batch, KV head) at a time.
    name: 'sdpa prefill streamed (batch, KV head) by (batch, KV head), one thread: [2, 4, 512, 64], causal',
    instance: { threads: 1 },
    values: (seed) => ({ q: halfValues([B, Hq, 512, 64], seed, 1), k: halfValues([B, Hkv, 512, 64], seed, 2), v: halfValues([B, Hkv, 512, 64], seed, 3) }),
    call: (attn, t, extra) => attn.sdpa(t.q, t.k, t.v, { isCausal: true, ...extra }),
    peakBelow: 2 * 2 ** 20,  // the whole copy's Q, K, V and output: 3 MiB
  },
  {
    // maxMemoryBytes below the whole call's peak: slices of batches, each copying its part of the
    // Float16Array inputs and of the mask (widened) into wasm memory.
    name: 'sdpa past maxMemoryBytes, in slices: a float mask [B, 1, Lq, Lk] as Float16Array, weights',
    instance: { maxMemoryBytes: 3 * 2 ** 20 },
    values: (seed) => ({ q: halfValues([4, Hq, 200, 32], seed, 1), k: halfValues([4, Hkv, 300, 32], seed, 2),
      v: halfValues([4, Hkv, 300, 32], seed, 3), mask: halfMask([4, 1, 200, 300], seed) }),
    call: (attn, t, extra) => attn.sdpa(t.q, t.k, t.v, { attnMask: t.mask, returnWeights: true, ...extra }),
  },
  {
    // 'bshd' past maxMemoryBytes: a slice's rows are runs of heads·D elements (64 of Q, 32 of K,
    // 48 of V: each shorter than W), gathered as raw halves into the slice's block and widened
    // there at once (js/memory.ts, writeFloatRuns).
    name: 'sdpa past maxMemoryBytes, in slices, bshd: causal, each slice\'s Float16Array rows gathered',
    share: 0.5,
    values: (seed) => ({ q: halfValues([4, 200, Hq, 16], seed, 1), k: halfValues([4, 300, Hkv, 16], seed, 2),
      v: halfValues([4, 300, Hkv, 24], seed, 3) }),
    call: (attn, t, extra) => attn.sdpa(t.q, t.k, t.v, { layout: 'bshd', isCausal: true, causalOffset: 100, ...extra }),
    reference: (t) => referenceSdpa(t.q, t.k, t.v, { layout: 'bshd', isCausal: true, causalOffset: 100 }).output,
  },
  {
    name: 'KVCache.attend: a Float16Array query and mask [B, Hq, Lq, length]',
    values: (seed) => ({ q: halfValues([B, Hq, 3, 32], seed, 1), k: halfValues([B, Hkv, 70, 32], seed, 2),
      v: halfValues([B, Hkv, 70, 16], seed, 3), mask: halfMask([B, Hq, 3, 70], seed) }),
    call: async (attn, t, extra) => {
      const cache = await attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: 32, valueDim: 16, maxLength: 70 });
      try {
        await cache.append(asFloats(t.k), asFloats(t.v));
        return await cache.attend(t.q, { attnMask: t.mask, returnLogSumExp: true, ...extra });
      } finally {
        await cache.dispose();
      }
    },
    floatParts: ['q', 'mask'],
  },
  {
    // A float32 cache of 300 positions on an instance limited to it and half the attend's own
    // peak: the query, output, weights and mask in slices of batches.
    name: 'KVCache.attend past maxMemoryBytes, in slices: a Float16Array query and mask [B, Hq, Lq, length], weights',
    share: 0.5,
    values: (seed) => ({ q: halfValues([3, 6, 40, 32], seed, 1), k: halfValues([3, 3, 300, 32], seed, 2),
      v: halfValues([3, 3, 300, 24], seed, 3), mask: halfMask([3, 6, 40, 300], seed) }),
    call: async (attn, t, extra, filled) => {
      const cache = await attn.createKVCache({ batch: 3, kvHeads: 3, headDim: 32, valueDim: 24, maxLength: 300 });
      try {
        await cache.append(asFloats(t.k), asFloats(t.v));
        await filled?.();
        return await cache.attend(t.q, { attnMask: t.mask, returnWeights: true, ...extra });
      } finally {
        await cache.dispose();
      }
    },
    floatParts: ['q', 'mask'],
  },
  {
    name: 'sdpaVarlen: three packed sequences, causal',
    values: (seed) => ({ q: halfValues([60, Hq, 32], seed, 1), k: halfValues([70, Hkv, 32], seed, 2), v: halfValues([70, Hkv, 32], seed, 3) }),
    call: (attn, t, extra) => attn.sdpaVarlen(t.q, t.k, t.v, {
      cuSeqlensQ: Int32Array.of(0, 7, 40, 60), cuSeqlensK: Int32Array.of(0, 17, 50, 70), isCausal: true, returnLogSumExp: true, ...extra }),
  },
  {
    // One thread, 2 MiB of inputs as float32: run in chunks of sequences.
    name: 'sdpaVarlen in chunks, one thread: 2048 packed rows [2048, 4, 64]',
    instance: { threads: 1 },
    values: (seed) => ({ q: halfValues([2048, Hq, 64], seed, 1), k: halfValues([2048, Hkv, 64], seed, 2), v: halfValues([2048, Hkv, 64], seed, 3) }),
    call: (attn, t, extra) => attn.sdpaVarlen(t.q, t.k, t.v, {
      cuSeqlensQ: Int32Array.of(0, 300, 1100, 2048), cuSeqlensK: Int32Array.of(0, 300, 1100, 2048), isCausal: true, ...extra }),
    peakBelow: 4 * 2 ** 20,  // the whole copy's inputs and output: 6 MiB
  },
  {
    name: 'sdpaVarlenBackward in chunks, one thread: 1024 packed rows [1024, 4, 64] in 11 sequences, and gradOutput',
    instance: { threads: 1 },
    values: (seed) => ({ q: halfValues([1024, Hq, 64], seed, 1), k: halfValues([1024, Hkv, 64], seed, 2), v: halfValues([1024, Hkv, 64], seed, 3),
      go: halfValues([1024, Hq, 64], seed, 4) }),
    call: (attn, t, extra) => attn.sdpaVarlenBackward(t.q, t.k, t.v, t.go, {
      cuSeqlensQ: ELEVEN_SEQUENCES, cuSeqlensK: ELEVEN_SEQUENCES, isCausal: true, ...extra }),
    peakBelow: 4 * 2 ** 20,  // the whole copy's inputs, output and gradients: 6 MiB
  },
  {
    name: 'sdpaBackward: gradOutput too, a float mask as Float16Array and its gradient',
    values: (seed) => ({ q: halfValues([B, Hq, 21, 16], seed, 1), k: halfValues([B, Hkv, 33, 16], seed, 2), v: halfValues([B, Hkv, 33, 8], seed, 3),
      go: halfValues([B, Hq, 21, 8], seed, 4), mask: halfMask([Hq, 21, 33], seed) }),
    call: (attn, t, extra) => attn.sdpaBackward(t.q, t.k, t.v, t.go, { attnMask: t.mask, returnMaskGrad: true, isCausal: true, causalOffset: 12, ...extra }),
  },
  {
    // The backward on an instance limited to 0.6 of its Float32Array twin's peak: slices of batches.
    name: 'sdpaBackward past maxMemoryBytes, in slices: Float16Array inputs and gradOutput, a sliding window',
    share: 0.6,
    values: (seed) => ({ q: halfValues([3, 6, 40, 32], seed, 1), k: halfValues([3, 3, 300, 32], seed, 2), v: halfValues([3, 3, 300, 24], seed, 3),
      go: halfValues([3, 6, 40, 24], seed, 4) }),
    call: (attn, t, extra) => attn.sdpaBackward(t.q, t.k, t.v, t.go, { isCausal: true, causalOffset: 260, slidingWindow: 90, ...extra }),
  },
  {
    name: 'sdpaVarlenBackward: two packed sequences',
    values: (seed) => ({ q: halfValues([30, Hq, 16], seed, 1), k: halfValues([40, Hkv, 16], seed, 2), v: halfValues([40, Hkv, 16], seed, 3),
      go: halfValues([30, Hq, 16], seed, 4) }),
    call: (attn, t, extra) => attn.sdpaVarlenBackward(t.q, t.k, t.v, t.go, {
      cuSeqlensQ: Int32Array.of(0, 11, 30), cuSeqlensK: Int32Array.of(0, 25, 40), ...extra }),
  },
];

/**
 * Runs every case on instances from `make` (createAttention or createAttentionWorker, given the
 * case's instance options); `extra` goes into every call's options. Returns
 * [{ name, ok, same, worstError, hash }], then the `saved` case.
 */
export async function runFloat16InputCases(make, extra = {}) {
  const results = [];
  for (const [index, c] of FLOAT16_INPUT_CASES.entries()) {
    const values = c.values(1000 + index);
    const inForm = (form) => Object.fromEntries(Object.entries(values).map(([name, t]) =>
      [name, (c.floatParts ?? Object.keys(values)).includes(name) ? form(t) : asFloats(t)]));
    const limit = c.share === undefined ? undefined : await limitFor(make, c, inForm(asFloats), extra);
    const attn = await make({ ...c.instance, ...(limit === undefined ? {} : { maxMemoryBytes: limit }) });
    try {
      const fromHalves = await c.call(attn, inForm(c.halfOffset === undefined ? asHalves : asHalvesAt(c.halfOffset)), extra);
      const { peakBytes } = await attn.memory();
      const fromFloats = await c.call(attn, inForm(asFloats), extra);
      const hash = resultHash(fromHalves);
      const same = hash === resultHash(fromFloats) && hash.trim() !== '';
      const worstError = c.reference === undefined ? 0 : maxRelError(fromFloats.output.data, c.reference(values));
      // The way the case names ran: below the whole copy's peak, or within the limit.
      const pathOk = peakBytes < (c.peakBelow ?? Infinity) && peakBytes <= (limit ?? Infinity);
      results.push({ name: c.name, same, worstError, peakBytes, limit, pathOk, ok: same && worstError <= REFERENCE_TOL && pathOk, hash });
    } finally {
      await attn.dispose();
    }
  }
  results.push(await savedFromHalves(make, extra));
  return results;
}

/**
 * The maxMemoryBytes of case `c`: what its instance holds when the call's `filled` is called (its
 * cache; 0 if never), plus c.share of the rest of the peak of the call with `tensors` on an
 * instance of its own.
 */
async function limitFor(make, c, tensors, extra) {
  const probe = await make(c.instance ?? {});
  try {
    let held = 0;
    await c.call(probe, tensors, extra, async () => { held = (await probe.memory()).bytesInUse; });
    const { peakBytes } = await probe.memory();
    return Math.floor(held + c.share * (peakBytes - held));
  } finally {
    await probe.dispose();
  }
}

/**
 * A forward given Float16Array inputs (returnLogSumExp), its backward given the same values as
 * Float32Array with `saved`: accepted (the record compares values, not element types), and the
 * gradients those of the backward that recomputes the forward. Given the key as a Float16Array
 * with one half changed (the record hashes halves without widening them): refused, naming key.data.
 */
async function savedFromHalves(make, extra) {
  const values = { q: halfValues([1, 2, 19, 16], 77, 1), k: halfValues([1, 2, 23, 16], 77, 2), v: halfValues([1, 2, 23, 16], 77, 3),
    go: halfValues([1, 2, 19, 16], 77, 4) };
  const attn = await make({});
  try {
    const forward = await attn.sdpa(asHalves(values.q), asHalves(values.k), asHalves(values.v), { isCausal: true, returnLogSumExp: true, ...extra });
    const args = () => [asFloats(values.q), asFloats(values.k), asFloats(values.v), asFloats(values.go)];
    let viaSaved = null, error = null;
    try {
      viaSaved = await attn.sdpaBackward(...args(), { isCausal: true, saved: { output: forward.output, logSumExp: forward.logSumExp }, ...extra });
    } catch (e) {
      error = `${e.name}: ${e.message}`;
    }
    const recomputed = await attn.sdpaBackward(...args(), { isCausal: true, ...extra });
    const hash = viaSaved === null ? '' : resultHash(viaSaved);
    const same = viaSaved !== null && hash === resultHash(recomputed);
    const changedKey = asHalves(values.k);
    changedKey.data[301] = -changedKey.data[301];
    let refusal = null;
    try {
      await attn.sdpaBackward(asHalves(values.q), changedKey, asHalves(values.v), asHalves(values.go),
        { isCausal: true, saved: { output: forward.output, logSumExp: forward.logSumExp }, ...extra });
    } catch (e) {
      refusal = `${e.name}: ${e.message}`;
    }
    const refused = /^RangeError: sdpaBackward: options\.saved is not this call's forward: key\.data holds other values/.test(refusal ?? '');
    return { name: 'sdpaBackward with saved from a Float16Array forward, given Float32Array inputs; refused given a changed Float16Array key',
      same, error, refusal, ok: same && refused, hash };
  } finally {
    await attn.dispose();
  }
}
