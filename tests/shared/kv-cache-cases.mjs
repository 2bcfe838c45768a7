// KV-cache decoding cases, runnable in Node and in a browser page: each case fills a cache
// step by step with seeded K/V (web/seeded.mjs, bit-identical in every engine), attends after
// every append, and compares each step with the float64 reference (tests/node/reference.mjs) on
// the whole history so far: float32 as stored, float16 and bfloat16 on the values rounded to
// the cache's format (the storage rounding is the only error). Every result carries a hash of the exact output bits of
// all steps, so a browser run can be checked against a Node run bit for bit; and that read()
// gives back what was appended, as stored. Plain ES module.
import { maxRelError, referenceSdpa } from '../node/reference.mjs';
import { noiseTensor } from '../../web/seeded.mjs';
import { halfToFloat } from './onnx-cases.mjs';
import { bitsHash, REFERENCE_TOL } from './reference-cases.mjs';

/**
 * x rounded to the nearest IEEE float16 value, ties to even, from the format's definition:
 * the spacing of halves near |x| is 2^(e-10) with e = max(floor(log2|x|), -14); from 65520 on
 * (where rounding would reach infinity) the package saturates to ±65504, as documented.
 */
export function roundToHalf(x) {
  if (Number.isNaN(x) || x === 0) return x;
  const a = Math.abs(x);
  if (a >= 65520) return Math.sign(x) * 65504;
  let e = Math.max(Math.floor(Math.log2(a)), -14);
  if (e > -14 && 2 ** e > a) e--;  // log2 rounded up across a power of two
  if (2 ** (e + 1) <= a) e++;
  const ulp = 2 ** (e - 10);
  const m = a / ulp;  // exact: a power-of-two division
  let r = Math.floor(m);
  if (m - r > 0.5 || (m - r === 0.5 && r % 2 === 1)) r++;
  return Math.sign(x) * r * ulp;
}

/**
 * A tensor's values as a float16 cache stores them (each rounded by roundToHalf), filled in a
 * loop: Float32Array.from(data, fn) first collects every value in a JS array, which runs out of
 * heap for a cache of 2^27 values (the benchmark's, bench/decode.mjs).
 */
export function roundedToHalves(t) {
  const data = new Float32Array(t.data.length);
  for (let i = 0; i < data.length; i++) data[i] = roundToHalf(t.data[i]);
  return { data, dims: t.dims };
}

/**
 * x rounded to the nearest bfloat16 value (8 significant bits, float32's exponent range), ties to
 * even, from the format's definition: the spacing near |x| is 2^(e-7) with e = max(floor(log2|x|),
 * -126); finite values from the largest bfloat16 (255·2^120) plus half its spacing (2^119) on
 * saturate to ±255·2^120, as documented; ±Infinity and NaN stay so.
 */
export function roundToBFloat16(x) {
  if (Number.isNaN(x) || x === 0 || !Number.isFinite(x)) return x;
  const a = Math.abs(x);
  const largest = 255 * 2 ** 120;
  if (a >= largest + 2 ** 119) return Math.sign(x) * largest;
  let e = Math.max(Math.floor(Math.log2(a)), -126);
  if (e > -126 && 2 ** e > a) e--;  // log2 rounded up across a power of two
  if (2 ** (e + 1) <= a) e++;
  const ulp = 2 ** (e - 7);
  const m = a / ulp;  // exact: a power-of-two division
  let r = Math.floor(m);
  if (m - r > 0.5 || (m - r === 0.5 && r % 2 === 1)) r++;
  return Math.sign(x) * r * ulp;
}

/** The value of raw bfloat16 bits b, from the format: sign, 8-bit exponent (bias 127), 7-bit mantissa. */
export function bfloat16ToFloat(b) {
  const sign = b & 0x8000 ? -1 : 1, e = (b >> 7) & 0xff, m = b & 0x7f;
  if (e === 0xff) return m === 0 ? sign * Infinity : NaN;
  return e === 0 ? sign * m * 2 ** -133 : sign * (1 + m / 128) * 2 ** (e - 127);
}

/** A tensor's values as a cache of `dtype` stores them: float32 as they are, else rounded to its 16-bit format. */
export function storedValues(dtype, t) {
  if (dtype === 'float32') return t;
  const round = dtype === 'float16' ? roundToHalf : roundToBFloat16;
  const data = new Float32Array(t.data.length);
  for (let i = 0; i < data.length; i++) data[i] = round(t.data[i]);
  return { data, dims: t.dims };
}

/** The value of one raw element a cache of `dtype` gives back from read(). */
export function storedElementValue(dtype, x) {
  return dtype === 'float16' ? halfToFloat(x) : dtype === 'bfloat16' ? bfloat16ToFloat(x) : x;
}

/** Positions [a, b) of a bhsd tensor [B, H, L, D]. */
export function positions(t, a, b) {
  const [B, H, L, D] = t.dims;
  const data = new Float32Array(B * H * (b - a) * D);
  for (let bh = 0; bh < B * H; bh++) data.set(t.data.subarray((bh * L + a) * D, (bh * L + b) * D), bh * (b - a) * D);
  return { data, dims: [B, H, b - a, D] };
}

/**
 * The cases: { name, shape: { B, Hq, Hkv, E, Ev }, steps (positions appended per step), dtype,
 * grow (bytes of another cache allocated after the second step, so the memory grows
 * mid-sequence), queryRows (optional: after each step only the last min(n, queryRows) of the n
 * new positions attend, which keeps the reference cheap for long appends), slidingWindow (optional:
 * attend's option, each row attending the W positions ending at its own), sinks (optional: attend's
 * option, a Float32Array of Hq), alibiSlopes (optional: attend's option, [Hq]), dropout (optional:
 * attend's dropoutP and dropoutSeed, the seed plus the step's index at each step) }.
 */
export const CACHE_CASES = [
  { name: 'MHA H4 E64, float32', shape: { B: 1, Hq: 4, Hkv: 4, E: 64, Ev: 64 }, steps: [37, 1, 1, 3, 129, 1, 400, 1], dtype: 'float32' },
  { name: 'GQA Hq8 Hkv2 E128 Ev96, float16', shape: { B: 1, Hq: 8, Hkv: 2, E: 128, Ev: 96 }, steps: [37, 1, 5, 600, 1], dtype: 'float16' },
  { name: 'B2 GQA Hq6 Hkv3 E32, float32, memory grows mid-sequence', shape: { B: 2, Hq: 6, Hkv: 3, E: 32, Ev: 32 },
    steps: [20, 1, 300, 1, 1], dtype: 'float32', grow: 64 * 2 ** 20 },
  { name: 'B2 MQA Hq4 Hkv1 E16, float16, memory grows mid-sequence', shape: { B: 2, Hq: 4, Hkv: 1, E: 16, Ev: 8 },
    steps: [9, 1, 1, 50, 1], dtype: 'float16', grow: 64 * 2 ** 20 },
  // Decode steps past 2048 positions: the kernel reads a whole group of 4 key tiles in interleaved
  // streams (src/kernels/f32-sdpa-fwd-4x512-wasmsimd.cc, interleaved_first_key).
  { name: 'MHA H2 E16, float16, decode steps past a whole group of 2048 positions', shape: { B: 1, Hq: 2, Hkv: 2, E: 16, Ev: 16 },
    steps: [2049, 1, 2], dtype: 'float16', queryRows: 1 },
  { name: 'B2 MHA H1 E32 Ev8, float16, decode steps past a whole group of 2048 positions', shape: { B: 2, Hq: 1, Hkv: 1, E: 32, Ev: 8 },
    steps: [2100, 1], dtype: 'float16', queryRows: 1 },
  // A sliding window (Mistral, Gemma): chunks longer and shorter than the window.
  { name: 'GQA Hq4 Hkv2 E32, float32, sliding window of 64', shape: { B: 1, Hq: 4, Hkv: 2, E: 32, Ev: 32 },
    steps: [37, 1, 100, 1, 1], dtype: 'float32', slidingWindow: 64 },
  { name: 'MHA H2 E16, float16, sliding window of 1500 past 2048 positions', shape: { B: 1, Hq: 2, Hkv: 2, E: 16, Ev: 16 },
    steps: [2049, 1, 2], dtype: 'float16', queryRows: 1, slidingWindow: 1500 },
  // gpt-oss: learned sinks per query head with a 128-position window, past one 512-key segment.
  { name: 'GQA Hq4 Hkv2 E64, float16, sinks and a window of 128', shape: { B: 1, Hq: 4, Hkv: 2, E: 64, Ev: 64 },
    steps: [37, 1, 600, 1], dtype: 'float16', slidingWindow: 128, sinks: Float32Array.of(1.5, -Infinity, 0, 30) },
  // BLOOM/MPT: ALiBi's biases from each row's own position, past one 512-key segment.
  { name: 'GQA Hq8 Hkv2 E64, float16 and ALiBi (BLOOM slopes)', shape: { B: 1, Hq: 8, Hkv: 2, E: 64, Ev: 64 },
    steps: [37, 1, 600, 1], dtype: 'float16', alibiSlopes: Float32Array.from({ length: 8 }, (_, h) => 2 ** -(h + 1)) },
  { name: 'B2 MHA H4 E32, float32 and ALiBi', shape: { B: 2, Hq: 4, Hkv: 4, E: 32, Ev: 32 },
    steps: [20, 1, 3, 520, 1], dtype: 'float32', alibiSlopes: Float32Array.of(0.5, 0.25, 0.125, 0) },
  // Attention dropout (training through the cache): each step's mask from its own seed, past one
  // 512-key segment; float16 single-query-head decode (not read in interleaved streams with dropout).
  { name: 'GQA Hq8 Hkv2 E64, float16, dropout 0.25 and a window of 128', shape: { B: 1, Hq: 8, Hkv: 2, E: 64, Ev: 64 },
    steps: [37, 1, 600, 1], dtype: 'float16', slidingWindow: 128, dropout: { dropoutP: 0.25, dropoutSeed: 2 ** 32 - 9 } },
  { name: 'B2 MHA H2 E16, float16, decode steps past 2048 positions, dropout 0.5', shape: { B: 2, Hq: 2, Hkv: 2, E: 16, Ev: 16 },
    steps: [2049, 1, 2], dtype: 'float16', queryRows: 1, dropout: { dropoutP: 0.5, dropoutSeed: 11 } },
  // bfloat16 (8 significant bits, float32's range): GQA prefill and decode, MQA with the memory
  // growing, MHA read in interleaved groups past 2048 positions, sinks with a window.
  { name: 'GQA Hq8 Hkv2 E128 Ev96, bfloat16', shape: { B: 1, Hq: 8, Hkv: 2, E: 128, Ev: 96 }, steps: [37, 1, 5, 600, 1], dtype: 'bfloat16' },
  { name: 'B2 MQA Hq4 Hkv1 E16, bfloat16, memory grows mid-sequence', shape: { B: 2, Hq: 4, Hkv: 1, E: 16, Ev: 8 },
    steps: [9, 1, 1, 50, 1], dtype: 'bfloat16', grow: 64 * 2 ** 20 },
  { name: 'MHA H2 E64, bfloat16, decode steps past a whole group of 2048 positions', shape: { B: 1, Hq: 2, Hkv: 2, E: 64, Ev: 64 },
    steps: [2049, 1, 2], dtype: 'bfloat16', queryRows: 1 },
  { name: 'GQA Hq4 Hkv2 E64, bfloat16, sinks and a window of 128', shape: { B: 1, Hq: 4, Hkv: 2, E: 64, Ev: 64 },
    steps: [37, 1, 600, 1], dtype: 'bfloat16', slidingWindow: 128, sinks: Float32Array.of(1.5, -Infinity, 0, 30) },
  { name: 'B2 MHA H4 E32, float32, dropout 0.1 and sinks', shape: { B: 2, Hq: 4, Hkv: 4, E: 32, Ev: 32 },
    steps: [20, 1, 3, 520, 1], dtype: 'float32', sinks: Float32Array.of(0, 1, -Infinity, 2), dropout: { dropoutP: 0.1, dropoutSeed: 3 } },
];

/**
 * Runs every case on `attn`: an Attention, or an AttentionWorker (its methods return promises;
 * every call is awaited). Returns [{ name, worstError, ok, hash, steps }].
 */
export async function runCacheCases(attn, cases = CACHE_CASES) {
  const results = [];
  for (const [index, { name, shape, steps, dtype, grow, queryRows, slidingWindow, sinks, alibiSlopes, dropout }] of cases.entries()) {
    const { B, Hq, Hkv, E, Ev } = shape;
    const total = steps.reduce((a, b) => a + b, 0);
    const seed = 700 + index;
    const k = noiseTensor([B, Hkv, total, E], seed, 1), v = noiseTensor([B, Hkv, total, Ev], seed, 2);
    // What the reference reads: the values as stored (rounded to halves once, not every step).
    const kStored = storedValues(dtype, k), vStored = storedValues(dtype, v);
    const cache = await attn.createKVCache({ batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: total, dtype });
    let other = null;
    const hashes = [];
    let worstError = 0;
    let readOk = false;
    try {
      let length = 0;
      for (const [s, n] of steps.entries()) {
        await cache.append(positions(k, length, length + n), positions(v, length, length + n));
        length += n;
        if (grow && s === 1) {
          other = await attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 256, maxLength: grow / 2048 });
        }
        const rows = Math.min(n, queryRows ?? n);  // the last `rows` new positions attend
        const query = noiseTensor([B, Hq, rows, E], seed, 10 + s);
        const options = {
          ...(slidingWindow === undefined ? {} : { slidingWindow }), ...(sinks === undefined ? {} : { sinks }),
          ...(alibiSlopes === undefined ? {} : { alibiSlopes }),
          ...(dropout === undefined ? {} : { dropoutP: dropout.dropoutP, dropoutSeed: (dropout.dropoutSeed + s) >>> 0 }),
        };
        const got = await cache.attend(query, Object.keys(options).length === 0 ? undefined : options);
        const key = positions(kStored, 0, length), value = positions(vStored, 0, length);
        const ref = referenceSdpa(query, key, value, { isCausal: true, causalOffset: length - rows, ...options });
        // Output dims other than the reference's count as an error that fails the case.
        const dimsOk = got.output.dims.join() === ref.outputDims.join();
        worstError = Math.max(worstError, dimsOk ? maxRelError(got.output.data, ref.output) : Infinity);
        hashes.push(bitsHash(got.output.data));
      }
      // read(): what the cache holds is what was appended, as stored (float16: the rounded halves).
      const held = await cache.read();
      const asStored = (t, want) => t.dims.join() === want.dims.join() &&
        Array.prototype.every.call(t.data, (x, i) => Object.is(storedElementValue(dtype, x), want.data[i]));
      readOk = asStored(held.key, kStored) && asStored(held.value, vStored);
    } finally {
      await other?.dispose();
      await cache.dispose();
    }
    results.push({ name, worstError, readOk, ok: worstError <= REFERENCE_TOL && readOk, hash: hashes.join(''), steps: steps.length });
  }
  return results;
}
