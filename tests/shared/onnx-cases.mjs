// The ONNX `Attention` (opset 23/24) conformance adapter, shared by the Jest suite
// (tests/node/conformance.test.mjs, files read from disk) and the browser tests
// (tests/browser/, files fetched from the test server). Plain ES module: no Node built-ins;
// the caller passes how to read a file.
//
// The adapter from ONNX semantics to our API:
// * 3D packed inputs [B, L, H*D] are our layout 'bshd' with dims [B, L, H, D] (a reshape of
//   the same Float32Array, no copy); the output [B, Lq, Hq, Dv] is read back as [B, Lq, Hq*Dv].
// * past_key/past_value (always 4D [B, Hkv, P, D]) are concatenated in front of K/V along the
//   sequence axis, in the layout of K/V; the causal offset is then P, the past length.
// * nonpad_kv_seqlen (int64 [B]) becomes keyLengths, and under is_causal the per-batch
//   causalOffset nonpad[b] - Lq. Causal without any cache uses offset 0 (top-left).
// * bool masks become Uint8Array, float16 tensors are decoded to Float32Array, and a mask whose
//   last axis is shorter than T is padded on the right with -inf (float) or false (bool).
// * softcap 0 means "off", so the option is omitted; scale maps to the scale option.
//
// Y is checked for every case. qk_matmul_output is checked for mode 3 (softmax probabilities)
// through returnWeights. Modes 0, 1 and 2 return raw, softcapped or biased scores, which this
// package does not expose, so for those cases only Y (and the adapter's present_* concat) is
// checked.

/** |got − expected| <= tol + tol·|expected| per element, by the dtype of Q. */
export const TOL = { float32: 1e-5, float16: 3e-3 };
/** The number of cases in index.json. */
export const CASE_COUNT = 76;

const ITEM_SIZE = { float32: 4, float16: 2, bool: 1, int64: 8 };
const KNOWN_ATTRIBUTES = new Set([
  'is_causal', 'q_num_heads', 'kv_num_heads', 'qk_matmul_output_mode', 'scale', 'softcap',
  'softmax_precision',
]);
const KNOWN_INPUTS = new Set(['Q', 'K', 'V', 'attn_mask', 'past_key', 'past_value', 'nonpad_kv_seqlen']);

const product = (dims) => dims.reduce((a, b) => a * b, 1);

/** IEEE-754 binary16 bit pattern -> number. */
export function halfToFloat(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const mantissa = h & 0x3ff;
  if (exponent === 0) return sign * mantissa * 2 ** -24;
  if (exponent === 0x1f) return mantissa === 0 ? sign * Infinity : NaN;
  return sign * (1 + mantissa / 1024) * 2 ** (exponent - 15);
}

/**
 * Decodes one tensor of case.json from its bytes (a Uint8Array). Floats come back as
 * Float32Array (fp16 decoded), bools as Uint8Array, int64 as an array of numbers.
 */
export function decodeTensor(bytes, entry, where = entry.file) {
  const expected = product(entry.dims) * ITEM_SIZE[entry.dtype];
  if (bytes.byteLength !== expected || bytes.byteLength !== entry.bytes) {
    throw new Error(`${where}: ${bytes.byteLength} bytes, expected ${expected}`);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = product(entry.dims);
  let data;
  switch (entry.dtype) {
    case 'float32':
      data = new Float32Array(n);
      for (let i = 0; i < n; i++) data[i] = view.getFloat32(4 * i, true);
      break;
    case 'float16':
      data = new Float32Array(n);
      for (let i = 0; i < n; i++) data[i] = halfToFloat(view.getUint16(2 * i, true));
      break;
    case 'bool':
      data = Uint8Array.from(bytes);
      break;
    case 'int64':
      data = Array.from({ length: n }, (_, i) => Number(view.getBigInt64(8 * i, true)));
      break;
    default:
      throw new Error(`${where}: unknown dtype ${entry.dtype}`);
  }
  return { data, dims: entry.dims, dtype: entry.dtype };
}

/**
 * Reads index.json. `io` = { readText(path) → Promise<string>, readBytes(path) → Promise<Uint8Array> }
 * with paths relative to tests/conformance/onnx-attention/.
 */
export async function loadIndex(io) {
  return JSON.parse(await io.readText('index.json'));
}

/** Reads one case: { meta, inputs, outputs } with decoded tensors. */
export async function loadCase(io, dir) {
  const meta = JSON.parse(await io.readText(`${dir}/case.json`));
  const read = async (entry) => decodeTensor(await io.readBytes(`${dir}/${entry.file}`), entry, `${dir}/${entry.file}`);
  const readAll = async (entries) => Object.fromEntries(await Promise.all(entries.map(async (e) => [e.name, await read(e)])));
  const [inputs, outputs] = await Promise.all([readAll(meta.inputs), readAll(meta.outputs)]);
  return { meta, inputs, outputs };
}

/**
 * concat(past [B, H, P, D], new) along the sequence axis. `cur` is 4D bhsd [B, H, L, D] or,
 * when `bshd`, [B, L, H, D]; the result has the same layout as `cur` with length P + L.
 */
export function concatPast(past, cur, bshd) {
  const [B, H, P, D] = past.dims;
  const L = bshd ? cur.dims[1] : cur.dims[2];
  if (cur.dims[3] !== D || (bshd ? cur.dims[2] : cur.dims[1]) !== H || cur.dims[0] !== B) {
    throw new Error(`past [${past.dims}] does not match [${cur.dims}]`);
  }
  const T = P + L;
  const data = new Float32Array(B * H * T * D);
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      for (let t = 0; t < T; t++) {
        const dst = bshd ? ((b * T + t) * H + h) * D : ((b * H + h) * T + t) * D;
        const at = t < P
          ? ((b * H + h) * P + t) * D
          : bshd ? ((b * L + t - P) * H + h) * D : ((b * H + h) * L + t - P) * D;
        data.set((t < P ? past : cur).data.subarray(at, at + D), dst);
      }
    }
  }
  return { data, dims: bshd ? [B, T, H, D] : [B, H, T, D] };
}

/**
 * present_* is always 4D [B, H, T, D]; compares our concatenated K/V with it exactly.
 * Returns { dims: the dims ours should have, mismatches: the count of unequal elements }.
 */
export function comparePresent(ours, expected, bshd) {
  const [B, H, T, D] = expected.dims;
  let mismatches = 0;
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      for (let t = 0; t < T; t++) {
        for (let d = 0; d < D; d++) {
          const got = ours.data[bshd ? ((b * T + t) * H + h) * D + d : ((b * H + h) * T + t) * D + d];
          if (!Object.is(got, expected.data[((b * H + h) * T + t) * D + d])) mismatches++;
        }
      }
    }
  }
  return { dims: bshd ? [B, T, H, D] : [B, H, T, D], mismatches };
}

/** Pads the mask's last axis on the right to T with -inf (float) or false (bool). */
export function padMaskLastAxis(mask, T) {
  const dims = mask.dims;
  const last = dims[dims.length - 1];
  if (last === T) return { data: mask.data, dims };
  if (last > T) throw new Error(`attn_mask last axis ${last} > T = ${T}`);
  const rows = mask.data.length / last;
  const isBool = mask.data instanceof Uint8Array || mask.dtype === 'bool';
  const data = isBool ? new Uint8Array(rows * T) : new Float32Array(rows * T).fill(-Infinity);
  for (let r = 0; r < rows; r++) data.set(mask.data.subarray(r * last, (r + 1) * last), r * T);
  return { data, dims: [...dims.slice(0, -1), T] };
}

/** ONNX Attention inputs and attributes -> sdpa(query, key, value, options) arguments. */
export function adapt({ meta, inputs }) {
  const attrs = meta.attributes;
  for (const name of Object.keys(attrs)) {
    if (!KNOWN_ATTRIBUTES.has(name)) throw new Error(`unhandled attribute ${name}`);
  }
  for (const name of Object.keys(inputs)) {
    if (!KNOWN_INPUTS.has(name)) throw new Error(`unhandled input ${name}`);
  }
  // Our kernel computes the softmax in float32; 1 (float32) is the only precision in the set.
  if (attrs.softmax_precision !== undefined && attrs.softmax_precision !== 1) {
    throw new Error(`unsupported softmax_precision ${attrs.softmax_precision}`);
  }
  const { Q, K, V } = inputs;
  const packed = Q.dims.length === 3;
  let query, key, value, layout;
  if (packed) {
    // [B, L, H*D] -> [B, L, H, D]: the same buffer, read with layout 'bshd'.
    const Hq = attrs.q_num_heads, Hkv = attrs.kv_num_heads;
    const split = (t, H) => ({ data: t.data, dims: [t.dims[0], t.dims[1], H, t.dims[2] / H] });
    query = split(Q, Hq);
    key = split(K, Hkv);
    value = split(V, Hkv);
    layout = 'bshd';
  } else {
    query = { data: Q.data, dims: Q.dims };
    key = { data: K.data, dims: K.dims };
    value = { data: V.data, dims: V.dims };
    layout = 'bhsd';
  }
  const B = query.dims[0];
  const Lq = packed ? query.dims[1] : query.dims[2];

  let P = 0;
  if (inputs.past_key || inputs.past_value) {
    P = inputs.past_key.dims[2];
    key = concatPast(inputs.past_key, key, packed);
    value = concatPast(inputs.past_value, value, packed);
  }
  const T = packed ? key.dims[1] : key.dims[2];

  const options = { layout };
  if (attrs.scale !== undefined) options.scale = attrs.scale;
  if (attrs.softcap !== undefined && attrs.softcap !== 0) options.softcap = attrs.softcap;
  if (inputs.attn_mask) options.attnMask = padMaskLastAxis(inputs.attn_mask, T);
  const nonpad = inputs.nonpad_kv_seqlen;
  if (nonpad) {
    if (nonpad.dims.length !== 1 || nonpad.dims[0] !== B) throw new Error(`nonpad_kv_seqlen [${nonpad.dims}]`);
    options.keyLengths = Int32Array.from(nonpad.data);
  }
  if (attrs.is_causal) {
    options.isCausal = true;
    if (inputs.past_key) options.causalOffset = P;
    else if (nonpad) options.causalOffset = Int32Array.from(nonpad.data, (n) => n - Lq);
    else options.causalOffset = 0;
  }
  const mode = attrs.qk_matmul_output_mode ?? 0;
  if (mode === 3) options.returnWeights = true;
  return { query, key, value, options, packed, mode };
}

/** Every element within tol + tol*|expected|; returns a readable list of the first misses. */
export function mismatches(got, expected, tol) {
  const out = [];
  let count = 0;
  let worst = 0;
  for (let i = 0; i < expected.length; i++) {
    const e = expected[i], g = got[i];
    const err = Math.abs(g - e);
    const ok = Object.is(g, e) || err <= tol + tol * Math.abs(e);
    if (!ok) {
      count++;
      worst = Math.max(worst, Number.isNaN(err) ? Infinity : err);
      if (out.length < 8) out.push(`[${i}] got ${g}, expected ${e}`);
    }
  }
  if (got.length !== expected.length) out.push(`length ${got.length}, expected ${expected.length}`);
  if (count > 0) out.push(`${count} of ${expected.length} elements off, worst |diff| ${worst}`);
  return out;
}

/** Y's dims as ONNX states them: packed outputs [B, Lq, Hq, Dv] read as [B, Lq, Hq*Dv]. */
export function onnxOutputDims(output, packed) {
  const d = output.dims;
  return packed ? [d[0], d[1], d[2] * d[3]] : [...d];
}

const sameDims = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

/**
 * Runs one loaded case through attn.sdpa() and checks everything the Jest suite checks.
 * Returns a list of failure messages (empty when the case passes) and the output.
 */
export function checkCase(attn, loaded) {
  const failures = [];
  const { query, key, value, options, packed, mode } = adapt(loaded);
  const { Y, present_key: presentKey, present_value: presentValue, qk_matmul_output: qk } = loaded.outputs;
  const tol = TOL[loaded.inputs.Q.dtype];
  if (tol === undefined) return { failures: [`no tolerance for dtype ${loaded.inputs.Q.dtype}`], output: null };
  for (const [name, ours, expected] of [['present_key', key, presentKey], ['present_value', value, presentValue]]) {
    if (!expected) continue;
    const c = comparePresent(ours, expected, packed);
    if (!sameDims(ours.dims, c.dims)) failures.push(`${name}: dims [${ours.dims}], expected [${c.dims}]`);
    if (c.mismatches !== 0) failures.push(`${name}: ${c.mismatches} mismatching elements`);
  }
  const result = attn.sdpa(query, key, value, options);
  const dims = onnxOutputDims(result.output, packed);
  if (!sameDims(dims, Y.dims)) failures.push(`Y: dims [${dims}], expected [${Y.dims}]`);
  for (const m of mismatches(result.output.data, Y.data, tol)) failures.push(`Y: ${m}`);
  if (mode === 3) {
    if (!qk) failures.push('qk_matmul_output: missing from the case');
    else if (!result.weights) failures.push('weights: not returned');
    else {
      if (!sameDims(result.weights.dims, qk.dims)) failures.push(`weights: dims [${result.weights.dims}], expected [${qk.dims}]`);
      for (const m of mismatches(result.weights.data, qk.data, tol)) failures.push(`weights: ${m}`);
    }
  } else if (result.weights !== undefined) {
    failures.push('weights: returned although not asked for');
  }
  return { failures, output: result.output.data };
}
