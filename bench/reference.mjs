// Benchmark inputs and the float64 reference every peer's output is checked against.
// The reference computes whole output rows in float64; on large shapes it computes a sample
// of rows (every head, first and last query rows included) so checking stays cheap.

export function randomTensor(dims, seed) {
  let x = seed >>> 0;
  const n = dims.reduce((a, b) => a * b, 1);
  const data = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    x = (x * 1664525 + 1013904223) >>> 0;  // LCG: enough for benchmark data
    data[i] = x / 2 ** 32 - 0.5;
  }
  return { data, dims };
}

/** Q [B, Hq, Lq, E], K and V [B, Hkv, Lk, E] for a shape from shapes.mjs. */
export function makeInputs(s) {
  return {
    q: randomTensor([s.B, s.H, s.Lq, s.E], 1),
    k: randomTensor([s.B, s.Hkv, s.Lk, s.E], 2),
    v: randomTensor([s.B, s.Hkv, s.Lk, s.E], 3),
  };
}

/** Output rows (b, h, i) to check: all of them when cheap, else a spread-out sample. */
function pickRows(s, flopBudget) {
  const total = s.B * s.H * s.Lq;
  const maxRows = Math.max(16, Math.floor(flopBudget / (4 * s.Lk * s.E)));
  const rows = [];
  if (total <= maxRows) {
    for (let b = 0; b < s.B; b++) for (let h = 0; h < s.H; h++) for (let i = 0; i < s.Lq; i++) rows.push([b, h, i]);
    return rows;
  }
  const seen = new Set();
  const add = (b, h, i) => { const key = (b * s.H + h) * s.Lq + i; if (!seen.has(key)) { seen.add(key); rows.push([b, h, i]); } };
  for (let b = 0; b < s.B; b++) for (let h = 0; h < s.H; h++) { add(b, h, 0); add(b, h, s.Lq - 1); }
  for (let r = 0; rows.length < maxRows && r < 4 * maxRows; r++) {
    add(r % s.B, (r * 5) % s.H, Math.floor(((r * 2654435761) >>> 0) / 2 ** 32 * s.Lq));
  }
  return rows;
}

/**
 * float64 attention rows: { rows: [[b, h, i]...], out: Float64Array(rows.length * E) }.
 * scale = 1/sqrt(E); causal: row i sees keys j <= i.
 */
export function referenceRows(s, { q, k, v }, flopBudget = 3e8) {
  const rows = pickRows(s, flopBudget);
  const { E, Lq, Lk } = s;
  const group = s.H / s.Hkv;
  const scale = 1 / Math.sqrt(E);
  const out = new Float64Array(rows.length * E);
  const p = new Float64Array(Lk);
  rows.forEach(([b, h, i], r) => {
    const qo = ((b * s.H + h) * Lq + i) * E;
    const kvh = b * s.Hkv + Math.floor(h / group);
    const n = s.causal ? Math.min(i + 1, Lk) : Lk;
    let max = -Infinity;
    for (let j = 0; j < n; j++) {
      const ko = (kvh * Lk + j) * E;
      let dot = 0;
      for (let e = 0; e < E; e++) dot += q.data[qo + e] * k.data[ko + e];
      p[j] = dot * scale;
      if (p[j] > max) max = p[j];
    }
    let sum = 0;
    for (let j = 0; j < n; j++) { p[j] = Math.exp(p[j] - max); sum += p[j]; }
    const o = r * E;
    for (let j = 0; j < n; j++) {
      const w = p[j] / sum, vo = (kvh * Lk + j) * E;
      for (let e = 0; e < E; e++) out[o + e] += w * v.data[vo + e];
    }
  });
  return { rows, out };
}

/** Max abs error of a [B, Hq, Lq, E] output against the reference rows (NaN counts as Infinity). */
export function compare(s, ref, output) {
  const { E, Lq } = s;
  if (!output || output.length !== s.B * s.H * Lq * E) {
    return { maxAbsErr: Infinity, maxAbsRef: 0, rowsChecked: 0, error: `output length ${output?.length} != ${s.B * s.H * Lq * E}` };
  }
  let maxAbsErr = 0, maxAbsRef = 0;
  ref.rows.forEach(([b, h, i], r) => {
    const o = ((b * s.H + h) * Lq + i) * E;
    for (let e = 0; e < E; e++) {
      const want = ref.out[r * E + e];
      const err = Math.abs(output[o + e] - want);
      maxAbsErr = Math.max(maxAbsErr, Number.isNaN(err) ? Infinity : err);
      maxAbsRef = Math.max(maxAbsRef, Math.abs(want));
    }
  });
  return { maxAbsErr, maxAbsRef, rowsChecked: ref.rows.length, rowsTotal: s.B * s.H * Lq };
}

/**
 * The tolerance of every forward check: the max abs error over the rows checked must be at most
 * RELATIVE_TOLERANCE × the largest |reference| value among them. The outputs are averages of V
 * rows (uniform in [-0.5, 0.5)), so they are small (max |ref| 1e-2 .. 3e-2) and a fixed absolute
 * bound would let wrong kernels through: uniform weights (Q·K ignored), scale 1/E for 1/√E, or the
 * last 4 keys dropped all stay within 2.5e-3 on shapes (c), (d), (g). Those are 3–10% of max |ref|;
 * float32 kernels here are within 1e-5 of it.
 */
export const RELATIVE_TOLERANCE = 1e-4;

/** Whether a check (from compare) passed: RELATIVE_TOLERANCE × max |ref|, NaN failing. */
export function checkPassed(check) {
  return check.maxAbsErr <= RELATIVE_TOLERANCE * check.maxAbsRef;
}

/** A check's error as a fraction of max |ref|, for messages. */
export function relativeError(check) {
  return check.maxAbsRef > 0 ? check.maxAbsErr / check.maxAbsRef : Infinity;
}

/**
 * The float64 gradients of head (b, h) of o = softmax(q·kᵀ/√E [causal])·v for dO, as
 * sdpaBackward computes them: P_ij, D_i = Σ_c dO_ic·O_ic, dS_ij = P_ij·(dO_i·v_j − D_i),
 * dQ_i = Σ_j dS_ij·k_j / √E, dK_j = Σ_i dS_ij·q_i / √E, dV_j = Σ_i P_ij·dO_i.
 * Returns { dQuery [Lq·E], dKey [Lk·E], dValue [Lk·E] } for that head; MHA only (Hq = Hkv:
 * with grouped heads a key's dK, dV sum over its group's heads).
 */
export function referenceHeadGradients(s, { q, k, v }, dO, b, h) {
  const { Lq, Lk, E } = s;
  if (s.Hkv !== s.H) throw new Error('referenceHeadGradients: MHA shapes only (Hq = Hkv)');
  const scale = 1 / Math.sqrt(E);
  const qo = (b * s.H + h) * Lq * E, ko = (b * s.Hkv + h) * Lk * E;
  const P = new Float64Array(Lq * Lk);
  const dQuery = new Float64Array(Lq * E), dKey = new Float64Array(Lk * E), dValue = new Float64Array(Lk * E);
  for (let i = 0; i < Lq; i++) {
    const n = s.causal ? Math.min(i + 1, Lk) : Lk;
    const p = P.subarray(i * Lk, i * Lk + n);
    let max = -Infinity;
    for (let j = 0; j < n; j++) {
      let dot = 0;
      for (let e = 0; e < E; e++) dot += q.data[qo + i * E + e] * k.data[ko + j * E + e];
      p[j] = dot * scale;
      max = Math.max(max, p[j]);
    }
    let sum = 0;
    for (let j = 0; j < n; j++) { p[j] = Math.exp(p[j] - max); sum += p[j]; }
    for (let j = 0; j < n; j++) p[j] /= sum;
    // D_i = dO_i · O_i with O_i = Σ_j P_ij v_j, = Σ_j P_ij (dO_i · v_j); dS_ij = P_ij (dO_i · v_j − D_i).
    const dp = new Float64Array(n);
    let D = 0;
    for (let j = 0; j < n; j++) {
      let dot = 0;
      for (let e = 0; e < E; e++) dot += dO[qo + i * E + e] * v.data[ko + j * E + e];
      dp[j] = dot;
      D += p[j] * dot;
    }
    for (let j = 0; j < n; j++) {
      const ds = p[j] * (dp[j] - D) * scale;
      for (let e = 0; e < E; e++) {
        dQuery[i * E + e] += ds * k.data[ko + j * E + e];
        dKey[j * E + e] += ds * q.data[qo + i * E + e];
        dValue[j * E + e] += p[j] * dO[qo + i * E + e];
      }
    }
  }
  return { dQuery, dKey, dValue };
}
