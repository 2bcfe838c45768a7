// Plain float64 reference of sdpa-wasm's contract (src/sdpa.h, js/types.ts), written from the
// specification, not from the kernel: one query row at a time, every score materialised.
//
//   s_ij = scale · (q_i · k_j)                      (scale defaults to 1/sqrt(E))
//   s_ij = softcap · tanh(s_ij / softcap)           (softcap > 0)
//   s_ij = s_ij + mask[b, h, i, j]                  (float mask, NEG_INF blocks)
//   s_ij = s_ij - slope[b, h] · |i + causalOffset[b] - j|   (alibiSlopes [Hq] or [B, Hq]; the
//                                                    offset counts with or without isCausal)
//   key j is blocked for row i when a bool mask is 0, when j >= keyLengths[b] or j < keyStarts[b], or (isCausal)
//   when j > i + causalOffset[b], or (isCausal, slidingWindow W) when j <= i + causalOffset[b] - W
//   out_i = Σ_j softmax_j(s_i) · v_j; a row with every key blocked is exact zeros.
//   sinks[h] (gpt-oss): one more logit in every softmax row of head h, whose value row is zero
//   (it joins the maximum and the sum only); a row with every key blocked is still exact zeros.
//   dropoutP, dropoutSeed: out_i = Σ_j softmax_j(s_i)·z_ij·v_j and the weights are
//   softmax_j(s_i)·z_ij, where z_ij = 2^32/(2^32 - t) if bits(b, h, i, j) >= t, else 0, with
//   t = min(round(dropoutP·2^32), 2^32 - 1), and, in uint32 arithmetic (MurmurHash3's finaliser
//   mix): bits = mix(mix(mix(mix(mix(seed) + b) + h) + i) ^ j·0x9E3779B9). b counts from the
//   reference-only option dropoutBatchBase (default 0), for a packed sequence checked alone.
//
// Blocked keys are never read from K or V (nor their scores computed), so NaN written
// there cannot reach the result.

// Globals are looked up once: under Jest's vm contexts every global access (Math, Infinity,
// typed array constructors) is slow, which matters in these hot loops.
const { abs, cos, exp, floor, imul, log, sin, sqrt, tanh, PI } = Math;
const NEG_INF = -Infinity;
const F32 = Float32Array, F64 = Float64Array, U8 = Uint8Array;
const isNaNNumber = Number.isNaN;

/** MurmurHash3's 32-bit finaliser, as a uint32. */
function mix32(x) {
  x = imul(x ^ (x >>> 16), 0x85EBCA6B);
  x = imul(x ^ (x >>> 13), 0xC2B2AE35);
  return (x ^ (x >>> 16)) >>> 0;
}

/**
 * Dropout's z(b, h, i, j) for the API's options, from the definition above: null without
 * dropout (dropoutP absent or rounding to 0), else a function of (b, h, i) giving the row's
 * z(j).
 */
export function dropoutRows(options) {
  const p = options.dropoutP ?? 0;
  const threshold = Math.min(Math.round(p * 2 ** 32), 2 ** 32 - 1);
  if (threshold === 0) return null;
  const factor = 2 ** 32 / (2 ** 32 - threshold);
  const seedMix = mix32(options.dropoutSeed >>> 0);
  const base = options.dropoutBatchBase ?? 0;
  return (b, h, i) => {
    const row = mix32((mix32((mix32((seedMix + base + b) >>> 0) + h) >>> 0) + i) >>> 0);
    return (j) => (mix32((row ^ imul(j, 0x9E3779B9)) >>> 0) >= threshold ? factor : 0);
  };
}

/** A tensor of rank 2..4 seen as [B, H, L, D] in the given layout: sizes and strides. */
function view(t, layout) {
  const d = t.dims;
  // Rank 2 is [L, D] in either layout (for bshd the missing H sits between L and D).
  const full = d.length === 2 && layout === 'bshd' ? [1, d[0], 1, d[1]] : [...new Array(4 - d.length).fill(1), ...d];
  const [B, second, third, D] = full;
  const H = layout === 'bshd' ? third : second;
  const L = layout === 'bshd' ? second : third;
  const strides = layout === 'bshd'
    ? { b: L * H * D, h: D, l: H * D }
    : { b: H * L * D, h: L * D, l: D };
  return { data: t.data, B, H, L, D, ...strides, at: (b, h, l) => b * strides.b + h * strides.h + l * strides.l };
}

/** Strides of a mask broadcast (right-aligned, NumPy rules) to [B, Hq, Lq, Lk]. */
function maskStrides(dims, target) {
  const strides = [0, 0, 0, 0];
  let stride = 1;
  for (let axis = 3; axis >= 0; axis--) {
    const m = axis - (4 - dims.length);
    const size = m >= 0 ? dims[m] : 1;
    if (size !== 1 && size !== target[axis]) {
      throw new Error(`reference: mask dims [${dims}] do not broadcast to [${target}]`);
    }
    strides[axis] = size === 1 ? 0 : stride;
    stride *= size;
  }
  return strides;
}

/**
 * Prepares a problem once; `row(b, h, i)` then computes one query row in float64.
 * Returns the problem's sizes, the API's output/weights dims and the row function.
 */
export function referenceProblem(query, key, value, options = {}) {
  const layout = options.layout ?? 'bhsd';
  const q = view(query, layout), k = view(key, layout), v = view(value, layout);
  const B = q.B, Hq = q.H, Hkv = k.H, Lq = q.L, Lk = k.L, E = q.D, Ev = v.D;
  if (k.B !== B || v.B !== B || k.D !== E || v.H !== Hkv || v.L !== Lk || Hq % Hkv !== 0) {
    throw new Error('reference: inconsistent shapes');
  }
  const group = Hq / Hkv;
  const scale = options.scale ?? 1 / sqrt(E);
  const softcap = options.softcap ?? 0;
  const mask = options.attnMask;
  const mStrides = mask ? maskStrides(mask.dims, [B, Hq, Lq, Lk]) : null;
  const boolMask = mask ? Object.prototype.toString.call(mask.data) === '[object Uint8Array]' : false;
  const causal = options.isCausal === true;
  const offsetOf = (b) => {
    const o = options.causalOffset;
    if (o === undefined) return 0;
    return typeof o === 'number' ? o : o[b];
  };
  const validKeys = (b) => (options.keyLengths ? options.keyLengths[b] : Lk);
  const window = causal ? options.slidingWindow ?? 0 : 0;
  const sinkOf = (h) => (options.sinks ? options.sinks[h] : NEG_INF);
  const slopes = options.alibiSlopes;
  const slopeOf = (b, h) => (slopes ? slopes[slopes.length === Hq ? h : b * Hq + h] : 0);
  const dropoutRow = dropoutRows(options);

  /**
   * One row: { out: Float64Array(Ev), weights: Float64Array(Lk) (the softmax, before dropout),
   * dropped: the weights after dropout (weights itself without dropout), z: each key's dropout
   * factor or 0 (null without dropout), lse: log Σ_j exp(s_j) (-Infinity if empty) }.
   */
  function row(b, h, i) {
    const kh = floor(h / group);
    const qi = q.at(b, h, i);
    const limitValid = validKeys(b);
    const offset = offsetOf(b);
    const slope = slopeOf(b, h);
    const s = new F64(Lk).fill(NEG_INF);
    const allowed = new U8(Lk);
    for (let j = 0; j < Lk; j++) {
      if (j >= limitValid) continue;
      if (options.keyStarts && j < options.keyStarts[b]) continue;
      if (causal && j > i + offset) continue;
      if (window > 0 && j <= i + offset - window) continue;
      let bias = 0;
      if (mask) {
        const mv = mask.data[b * mStrides[0] + h * mStrides[1] + i * mStrides[2] + j * mStrides[3]];
        if (boolMask) {
          if (mv === 0) continue;
        } else {
          if (mv === NEG_INF) continue;
          bias = mv;
        }
      }
      const kj = k.at(b, kh, j);
      let dot = 0;
      for (let d = 0; d < E; d++) dot += q.data[qi + d] * k.data[kj + d];
      let score = scale * dot;
      if (softcap > 0) score = softcap * tanh(score / softcap);
      s[j] = score + bias - slope * abs(i + offset - j);
      allowed[j] = 1;
    }
    const sink = sinkOf(h);
    let max = sink;
    for (let j = 0; j < Lk; j++) if (allowed[j] && s[j] > max) max = s[j];
    const out = new F64(Ev);
    const weights = new F64(Lk);
    let z = null, dropped = weights;
    if (dropoutRow !== null) {
      const zOf = dropoutRow(b, h, i);
      z = F64.from({ length: Lk }, (_, j) => zOf(j));
      dropped = new F64(Lk);
    }
    if (max === NEG_INF) return { out, weights, dropped, z, lse: NEG_INF, sinkWeight: 0 };  // every key blocked, no sink: exact zeros
    let sum = sink === NEG_INF ? 0 : exp(sink - max);
    for (let j = 0; j < Lk; j++) {
      if (!allowed[j]) continue;
      weights[j] = exp(s[j] - max);
      sum += weights[j];
    }
    for (let j = 0; j < Lk; j++) {
      if (!allowed[j]) continue;
      weights[j] /= sum;
      if (z !== null) dropped[j] = weights[j] * z[j];
      const vj = v.at(b, kh, j);
      for (let c = 0; c < Ev; c++) out[c] += dropped[j] * v.data[vj + c];
    }
    // The sink's own probability (0 without one), for the sinks' gradient.
    return { out, weights, dropped, z, lse: max + log(sum), sinkWeight: sink === NEG_INF ? 0 : exp(sink - max) / sum };
  }

  const outputDims = [...query.dims.slice(0, -1), Ev];
  const leading = query.dims.length === 4 ? [B, Hq] : query.dims.length === 3 ? [Hq] : [];
  const weightsDims = [...leading, Lq, Lk];
  // Element offset of output row (b, h, i) in the API's output layout.
  const outputOffset = (b, h, i) => (layout === 'bshd'
    ? ((b * Lq + i) * Hq + h) * Ev
    : ((b * Hq + h) * Lq + i) * Ev);
  const weightsOffset = (b, h, i) => ((b * Hq + h) * Lq + i) * Lk;
  // Element of the mask (broadcast) at (b, h, i, j), or -1 without a float mask.
  const floatMaskOffset = (b, h, i, j) => (mask && !boolMask
    ? b * mStrides[0] + h * mStrides[1] + i * mStrides[2] + j * mStrides[3] : -1);
  return { B, Hq, Hkv, Lq, Lk, E, Ev, layout, outputDims, weightsDims, outputOffset, weightsOffset, row, q, k, v, scale, softcap, group, floatMaskOffset };
}

/** Each row's log Σ_j exp(s_j), [..., Hq, Lq] dense (-Infinity for a row with nothing to attend). */
export function referenceLogSumExp(query, key, value, options = {}) {
  const p = referenceProblem(query, key, value, options);
  const lse = new F64(p.B * p.Hq * p.Lq);
  for (let b = 0; b < p.B; b++) {
    for (let h = 0; h < p.Hq; h++) {
      for (let i = 0; i < p.Lq; i++) lse[(b * p.Hq + h) * p.Lq + i] = p.row(b, h, i).lse;
    }
  }
  return lse;
}

/**
 * The analytic backward in float64, from the definition (softmax's Jacobian diag(p) - p·pᵀ):
 * for the loss L with ∂L/∂output = gradOutput (the output's dims and layout),
 *   dp_j = z_j·(dO_i·v_j) (z_j = 1 without dropout),  D_i = Σ_j p_j·dp_j,  ds_j = p_j·(dp_j - D_i),
 *   dr_j = ds_j·(1 - tanh²(r_j/softcap)) with r_j = scale·q_i·k_j (softcap > 0), else ds_j,
 *   dq_i += scale·dr_j·k_j,  dk_j += scale·dr_j·q_i,  dv_j += p_j·z_j·dO_i
 *   dmask[b, h, i, j] += ds_j   (a float mask, added after the softcap; summed where it broadcasts)
 *   dsinks[h] += p_sink·(0 - D_i)   (the sink's value row is zero: its dp is 0)
 * over the keys each row attends (p_j > 0). Returns Float64Arrays dQuery, dKey, dValue laid
 * out as query, key, value, dAttnMask laid out as the mask (null without a float mask), and
 * dSinks [Hq] (null without sinks).
 */
export function referenceSdpaBackward(query, key, value, gradOutput, options = {}) {
  const p = referenceProblem(query, key, value, options);
  const { q, k, v, B, Hq, Lq, Lk, E, Ev, scale, softcap, group, floatMaskOffset } = p;
  const go = view(gradOutput, p.layout);
  const dQuery = new F64(query.data.length), dKey = new F64(key.data.length), dValue = new F64(value.data.length);
  const dAttnMask = floatMaskOffset(0, 0, 0, 0) < 0 ? null : new F64(options.attnMask.data.length);
  const dSinks = options.sinks ? new F64(Hq) : null;
  const dp = new F64(Lk);
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < Hq; h++) {
      const kh = floor(h / group);
      for (let i = 0; i < Lq; i++) {
        const { weights, dropped, z, sinkWeight } = p.row(b, h, i);
        const qi = q.at(b, h, i), gi = go.at(b, h, i);
        let delta = 0;
        for (let j = 0; j < Lk; j++) {
          dp[j] = 0;
          if (weights[j] === 0) continue;
          const vj = v.at(b, kh, j);
          for (let c = 0; c < Ev; c++) dp[j] += go.data[gi + c] * v.data[vj + c];
          if (z !== null) dp[j] *= z[j];  // the output is Σ_j p_j·z_j·v_j
          delta += weights[j] * dp[j];
        }
        if (dSinks && sinkWeight !== 0) dSinks[h] -= sinkWeight * delta;
        for (let j = 0; j < Lk; j++) {
          if (weights[j] === 0) continue;
          const kj = k.at(b, kh, j), vj = v.at(b, kh, j);
          let dr = weights[j] * (dp[j] - delta);
          if (dAttnMask) dAttnMask[floatMaskOffset(b, h, i, j)] += dr;
          if (softcap > 0) {
            let dot = 0;
            for (let d = 0; d < E; d++) dot += q.data[qi + d] * k.data[kj + d];
            const t = tanh(scale * dot / softcap);
            dr *= 1 - t * t;
          }
          for (let d = 0; d < E; d++) {
            dQuery[qi + d] += scale * dr * k.data[kj + d];
            dKey[kj + d] += scale * dr * q.data[qi + d];
          }
          for (let c = 0; c < Ev; c++) dValue[vj + c] += dropped[j] * go.data[gi + c];
        }
      }
    }
  }
  return { dQuery, dKey, dValue, dAttnMask, dSinks };
}

/**
 * softmax(Q·Kᵀ·scale + mask)·V in float64 with the API's options. Returns
 * { output, weights, outputDims, weightsDims }: output and weights are Float64Arrays laid out
 * as the API returns them (output in the query's layout, weights [..., Hq, Lq, Lk]).
 */
export function referenceSdpa(query, key, value, options = {}) {
  const p = referenceProblem(query, key, value, options);
  const output = new F64(p.B * p.Hq * p.Lq * p.Ev);
  const weights = new F64(p.B * p.Hq * p.Lq * p.Lk);
  for (let b = 0; b < p.B; b++) {
    for (let h = 0; h < p.Hq; h++) {
      for (let i = 0; i < p.Lq; i++) {
        const r = p.row(b, h, i);
        output.set(r.out, p.outputOffset(b, h, i));
        weights.set(r.dropped, p.weightsOffset(b, h, i));
      }
    }
  }
  return { output, weights, outputDims: p.outputDims, weightsDims: p.weightsDims };
}

/** mulberry32: a small seeded 32-bit PRNG, uniform in [0, 1). */
export function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = imul(t ^ (t >>> 15), t | 1);
    t ^= t + imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A Float32Array of n unit-normal values (Box-Muller over mulberry32), reproducible per seed. */
export function randn(n, seed) {
  const uniform = mulberry32(seed);
  const out = new F32(n);
  for (let i = 0; i < n; i += 2) {
    const u1 = 1 - uniform();  // in (0, 1]: log(u1) is finite
    const u2 = uniform();
    const r = sqrt(-2 * log(u1));
    out[i] = r * cos(2 * PI * u2);
    if (i + 1 < n) out[i + 1] = r * sin(2 * PI * u2);
  }
  return out;
}

/** A random unit-normal tensor of the given dims. */
export function randomTensor(dims, seed) {
  return { data: randn(dims.reduce((a, b) => a * b, 1), seed), dims: [...dims] };
}

/**
 * maxRelError for log-sum-exps: a row with nothing to attend must be -Infinity exactly (0 error
 * where both are, Infinity where only one is).
 */
export function logSumExpError(got, ref) {
  if (got.length !== ref.length) return Infinity;
  let worst = 0;
  for (let i = 0; i < ref.length; i++) {
    const e = ref[i] === -Infinity || got[i] === -Infinity
      ? (got[i] === ref[i] ? 0 : Infinity)
      : abs(got[i] - ref[i]) / (1 + abs(ref[i]));
    if (!(e <= worst)) worst = isNaNNumber(e) ? Infinity : e;
  }
  return worst;
}

/**
 * max_i |got_i - ref_i| / max_i |ref_i|: the error of long sums against their size, where the
 * per-element measure says little of elements near zero; Infinity if lengths differ or anything
 * is NaN.
 */
export function normwiseError(got, ref) {
  if (got.length !== ref.length) return Infinity;
  let worst = 0, size = 0;
  for (let i = 0; i < ref.length; i++) {
    const e = abs(got[i] - ref[i]);
    if (!(e <= worst)) worst = isNaNNumber(e) ? Infinity : e;
    size = Math.max(size, abs(ref[i]));
  }
  return worst / size;
}

/** max_i |got_i - ref_i| / (1 + |ref_i|); Infinity if lengths differ or anything is NaN. */
export function maxRelError(got, ref) {
  if (got.length !== ref.length) return Infinity;
  let worst = 0;
  for (let i = 0; i < ref.length; i++) {
    const e = abs(got[i] - ref[i]) / (1 + abs(ref[i]));
    if (!(e <= worst)) worst = isNaNNumber(e) ? Infinity : e;
  }
  return worst;
}
