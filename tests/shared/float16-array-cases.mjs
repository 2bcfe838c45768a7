// Float16Array appends to a KV cache, in the engines that have Float16Array (Chromium, Firefox,
// WebKit; not Node 20, so these run in pages only: tests/browser/kv-cache.spec.mjs and the
// engine tests). A Float16Array holds IEEE halves: a float16 cache stores them as they are, a
// float32 cache their exact values, a bfloat16 cache those values rounded as float32s of the same
// values are. Each case appends step by step and checks, after every step, attend() against the
// float64 reference on the values as stored, and bit for bit against a twin cache given the same
// values as Float32Array (exact in float16, so the twin stores the same); at the end, read() of
// every step's positions against what that step appended. Plain ES module: runs on an
// Attention or an AttentionWorker (every call awaited).
import { maxRelError, referenceSdpa } from '../node/reference.mjs';
import { noiseTensor } from '../../web/seeded.mjs';
import { halfToFloat } from './onnx-cases.mjs';
import { positions, roundToBFloat16, storedValues } from './kv-cache-cases.mjs';
import { bitsHash, REFERENCE_TOL } from './reference-cases.mjs';

/**
 * { name, shape: { B, Hq, Hkv, E, Ev }, steps, dtype, layout }: append layouts both; rows long
 * enough to be copied straight into a float16 cache (40 positions × E64 × 2 bytes ≥ 4096) and short
 * ones staged; head sizes across the 8-lane conversions' tails and the 64-element blocks of
 * float16 → bfloat16 (E200).
 */
export const FLOAT16_ARRAY_CASES = ['float16', 'float32', 'bfloat16'].flatMap((dtype) => [
  { name: `GQA Hq4 Hkv2 E64, ${dtype} cache, bhsd`, shape: { B: 1, Hq: 4, Hkv: 2, E: 64, Ev: 64 }, steps: [40, 1, 3], dtype, layout: 'bhsd' },
  { name: `B2 GQA Hq4 Hkv2 E200 Ev13, ${dtype} cache, bshd`, shape: { B: 2, Hq: 4, Hkv: 2, E: 200, Ev: 13 },
    steps: [37, 1, 5], dtype, layout: 'bshd' },
]);

/** A bhsd tensor [B, H, L, D] as bshd [B, L, H, D]. */
function toBshd(t) {
  const [B, H, L, D] = t.dims;
  const data = new Float32Array(t.data.length);
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      for (let l = 0; l < L; l++) data.set(t.data.subarray(((b * H + h) * L + l) * D, ((b * H + h) * L + l + 1) * D), ((b * L + l) * H + h) * D);
    }
  }
  return { data, dims: [B, L, H, D] };
}

/** The value a cache of `dtype` holds for a half's value x: x itself, but rounded for bfloat16. */
const heldValue = (dtype, x) => (dtype === 'bfloat16' ? roundToBFloat16(x) : x);

/** How readBack reads a cache of `dtype`: a float16 cache's raw bits, another's float32 values. */
const readOptions = (dtype, layout = 'bhsd') => (dtype === 'float16' ? { layout } : { layout, dtype: 'float32' });

/** Whether read()'s tensor (raw bits for a float16 cache, values otherwise: readOptions) holds exactly what `sent` (a Float16Array) gave. */
function readBack(dtype, got, sent) {
  if (got.data.length !== sent.length) return false;
  if (dtype === 'float16') {
    const bits = new Uint16Array(sent.buffer, sent.byteOffset, sent.length);
    return got.data.every((x, i) => x === bits[i]);
  }
  return got.data.every((x, i) => Object.is(x, heldValue(dtype, sent[i])));
}

/**
 * Runs every case on `attn` (an Attention or an AttentionWorker). `appendOptions` go to every
 * append beside the layout (a worker's `{ transfer: true }`: then each Float16Array must come back
 * detached). Returns [{ name, worstError, twinSame, readOk, detachedOk, ok, hash }].
 */
export async function runFloat16ArrayCases(attn, appendOptions = {}) {
  const results = [];
  for (const [index, { name, shape, steps, dtype, layout }] of FLOAT16_ARRAY_CASES.entries()) {
    const { B, Hq, Hkv, E, Ev } = shape;
    const total = steps.reduce((a, b) => a + b, 0);
    const seed = 900 + index;
    // Values a half holds (so the Float16Arrays are made without rounding), spread over [-12, 12],
    // then as stored by the cache (bfloat16 rounds them again).
    const halves = (t) => storedValues('float16', { data: t.data.map((x) => x * 4), dims: t.dims });
    const k = halves(noiseTensor([B, Hkv, total, E], seed, 1)), v = halves(noiseTensor([B, Hkv, total, Ev], seed, 2));
    const kStored = storedValues(dtype, k), vStored = storedValues(dtype, v);
    const spec = { batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength: total, dtype };
    const cache = await attn.createKVCache(spec), twin = await attn.createKVCache(spec);
    const hashes = [], sent = [];
    let worstError = 0, twinSame = true, detachedOk = true;
    try {
      let length = 0;
      for (const [s, n] of steps.entries()) {
        const inLayout = (t) => (layout === 'bshd' ? toBshd(t) : t);
        const [kStep, vStep] = [inLayout(positions(k, length, length + n)), inLayout(positions(v, length, length + n))];
        const [k16, v16] = [Float16Array.from(kStep.data), Float16Array.from(vStep.data)];
        sent.push([k16.slice(), v16.slice()]);
        await cache.append({ data: k16, dims: kStep.dims }, { data: v16, dims: vStep.dims }, { layout, ...appendOptions });
        if (appendOptions.transfer) detachedOk &&= k16.length === 0 && v16.length === 0;
        await twin.append(kStep, vStep, { layout });
        length += n;
        const query = noiseTensor([B, Hq, n, E], seed, 10 + s);
        const got = await cache.attend(query), twinGot = await twin.attend(query);
        const ref = referenceSdpa(query, positions(kStored, 0, length), positions(vStored, 0, length), { isCausal: true, causalOffset: length - n });
        worstError = Math.max(worstError, got.output.dims.join() === ref.outputDims.join() ? maxRelError(got.output.data, ref.output) : Infinity);
        twinSame &&= bitsHash(got.output.data) === bitsHash(twinGot.output.data);
        hashes.push(bitsHash(got.output.data));
      }
      // read(): each step's positions, in its layout, hold what it sent.
      let readOk = true, at = 0;
      for (const [s, n] of steps.entries()) {
        const held = await cache.read(at, at + n, readOptions(dtype, layout));
        readOk &&= readBack(dtype, held.key, sent[s][0]) && readBack(dtype, held.value, sent[s][1]);
        at += n;
      }
      results.push({ name, worstError, twinSame, readOk, detachedOk, ok: worstError <= REFERENCE_TOL && twinSame && readOk && detachedOk, hash: hashes.join('') });
    } finally {
      await cache.dispose();
      await twin.dispose();
    }
  }
  return results.concat(await everyPattern(attn, appendOptions), await refusals(attn));
}

/**
 * Every one of the 65,536 half patterns (±0, subnormals, ±65504, ±Infinity, every NaN) appended
 * as a Float16Array into a cache of each dtype, read back: a float16 cache gives the bits, a
 * float32 one the values (NaN as NaN), a bfloat16 one the values rounded (Infinity stays, NaN
 * stays NaN).
 */
async function everyPattern(attn, appendOptions) {
  const results = [];
  for (const dtype of ['float16', 'float32', 'bfloat16']) {
    const dims = [1, 2, 512, 64];
    const bits = Uint16Array.from({ length: 65536 }, (_, i) => (i * 40503) & 0xffff);  // every pattern once (40503 is odd)
    const values = new Float16Array(bits.buffer);
    const cache = await attn.createKVCache({ batch: 1, kvHeads: 2, headDim: 64, maxLength: 512, dtype });
    try {
      await cache.append({ data: values.slice(), dims }, { data: values.slice(), dims }, appendOptions);
      const held = await cache.read(0, 512, readOptions(dtype));
      const asFloats = dtype === 'float16' ? await cache.read(0, 512, { dtype: 'float32' }) : held;
      const floatsOk = asFloats.key.data.every((x, i) => Object.is(x, heldValue(dtype, halfToFloat(bits[i]))));
      const readOk = readBack(dtype, held.key, values) && readBack(dtype, held.value, values) && floatsOk;
      results.push({ name: `every half pattern into a ${dtype} cache`, readOk, ok: readOk, hash: '' });
    } finally {
      await cache.dispose();
    }
  }
  return results;
}

/**
 * What stays refused: a Float16Array whose length is not its dims' (RangeError naming
 * key.data.length), and one where only Float32Array is taken (options.sinks, a forward's saved
 * output: TypeError naming it and Float16Array); the cache unchanged, the instance working.
 */
async function refusals(attn) {
  const cache = await attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 8, maxLength: 4, dtype: 'float16' });
  const outcome = async (call) => {
    try {
      await call();
      return 'no error';
    } catch (error) {
      return `${error.name}: ${error.message}`;
    }
  };
  try {
    const f16 = (n) => new Float16Array(n).fill(0.5);
    const f32 = (n) => new Float32Array(n).fill(0.5);
    const t = (data) => ({ data, dims: [1, 2, 8] });
    const cases = [
      ['a Float16Array of the wrong length', () => cache.append({ data: f16(7), dims: [1, 1, 1, 8] }, { data: f16(8), dims: [1, 1, 1, 8] }),
        /^RangeError: KVCache\.append: key\.data\.length must equal the product of key\.dims \[1, 1, 1, 8\] = 8, got 7$/],
      ['options.sinks as a Float16Array', () => attn.sdpa(t(f16(16)), t(f32(16)), t(f32(16)), { sinks: f16(1) }),
        /^TypeError: sdpa: options\.sinks must be a Float32Array of length Hq = 1 \(one sink logit per query head\), got Float16Array\(1\)$/],
      ['a saved output as a Float16Array', () => attn.sdpaBackward(t(f32(16)), t(f32(16)), t(f32(16)), t(f32(16)),
        { saved: { output: t(f16(16)), logSumExp: { data: f32(2), dims: [1, 2] } } }),
      /^TypeError: sdpaBackward: options\.saved\.output\.data must be a Float32Array, got Float16Array\(16\)$/],
    ];
    const results = [];
    for (const [name, call, expected] of cases) {
      const got = await outcome(call);
      results.push({ name: `refused: ${name}`, got, ok: expected.test(got) && (await cache.length) === 0, hash: '' });
    }
    // Still working: a Float16Array append of the right length.
    await cache.append({ data: f16(8), dims: [1, 1, 1, 8] }, { data: f16(8), dims: [1, 1, 1, 8] });
    const { output } = await cache.attend({ data: new Float32Array(8).fill(1), dims: [1, 1, 1, 8] });
    results.push({ name: 'after the refusals, an append and attend', ok: (await cache.length) === 1 && output.data.every((x) => x === 0.5), hash: '' });
    return results;
  } finally {
    await cache.dispose();
  }
}
