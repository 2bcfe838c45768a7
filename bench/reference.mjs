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
