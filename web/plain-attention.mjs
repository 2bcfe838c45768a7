// The plain-JavaScript attention the benchmark panel compares against, and the two "wrong"
// softmaxes of the masking panel. Written the straightforward way (Float32Array, one query
// row at a time, the whole score row materialised): what one would write without a library.

/**
 * softmax(Q·Kᵀ·scale)·V for q, k, v of dims [B, H, L, E] (same heads), optionally causal
 * (top-left: row i sees keys 0..i). Returns the output as a Float32Array [B, H, Lq, Ev].
 */
export function plainAttention(query, key, value, { isCausal = false, scale } = {}) {
  const [B, H, Lq, E] = query.dims;
  const Lk = key.dims[2], Ev = value.dims[3];
  const s = scale ?? 1 / Math.sqrt(E);
  const q = query.data, k = key.data, v = value.data;
  const out = new Float32Array(B * H * Lq * Ev);
  const scores = new Float32Array(Lk);
  for (let bh = 0; bh < B * H; bh++) {
    const qBase = bh * Lq * E, kBase = bh * Lk * E, vBase = bh * Lk * Ev, oBase = bh * Lq * Ev;
    for (let i = 0; i < Lq; i++) {
      const last = isCausal ? Math.min(i, Lk - 1) : Lk - 1;
      const qi = qBase + i * E;
      let max = -Infinity;
      for (let j = 0; j <= last; j++) {
        const kj = kBase + j * E;
        let dot = 0;
        for (let d = 0; d < E; d++) dot += q[qi + d] * k[kj + d];
        scores[j] = dot * s;
        if (scores[j] > max) max = scores[j];
      }
      let sum = 0;
      for (let j = 0; j <= last; j++) {
        scores[j] = Math.exp(scores[j] - max);
        sum += scores[j];
      }
      const oi = oBase + i * Ev;
      for (let j = 0; j <= last; j++) {
        const p = scores[j] / sum;
        const vj = vBase + j * Ev;
        for (let c = 0; c < Ev; c++) out[oi + c] += p * v[vj + c];
      }
    }
  }
  return out;
}

/** The textbook softmax of one row: exp(x − max) / Σ. A row of only −∞ gives NaN (0/0). */
export function naiveSoftmax(row) {
  let max = -Infinity;
  for (const x of row) if (x > max) max = x;
  const e = row.map((x) => Math.exp(x - max));  // −∞ − (−∞) = NaN
  const sum = e.reduce((a, b) => a + b, 0);
  return e.map((x) => x / sum);
}

/** weights [L, L] · values [L, Ev] (one head) in float64, for the masking panel's wrong output. */
export function weightsTimesValues(weights, values, L, Ev) {
  const out = new Float64Array(L * Ev);
  for (let i = 0; i < L; i++) {
    for (let j = 0; j < L; j++) {
      const p = weights[i * L + j];
      if (p === 0) continue;
      for (let c = 0; c < Ev; c++) out[i * Ev + c] += p * values[j * Ev + c];
    }
  }
  return out;
}
