// A plain-JavaScript float32 attention: one query row at a time, scores in a Float32Array,
// a max-subtracted softmax, then the weighted sum of value rows. No SIMD, no blocking.
// It is the baseline the wasm implementations are measured against, and only runs where
// a run takes a few seconds at most (bench.mjs estimates the time from a smaller shape).

export function plainAttention(s, q, k, v) {
  const { B, H, Hkv, Lq, Lk, E } = s;
  const group = H / Hkv;
  const scale = Math.fround(1 / Math.sqrt(E));
  const out = new Float32Array(B * H * Lq * E);
  const scores = new Float32Array(Lk);
  const acc = new Float32Array(E);
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      const kvBase = (b * Hkv + Math.floor(h / group)) * Lk * E;
      for (let i = 0; i < Lq; i++) {
        const qo = ((b * H + h) * Lq + i) * E;
        const n = s.causal ? Math.min(i + 1, Lk) : Lk;
        let max = -Infinity;
        for (let j = 0; j < n; j++) {
          const ko = kvBase + j * E;
          let dot = 0;
          for (let e = 0; e < E; e++) dot += q[qo + e] * k[ko + e];
          const x = (scores[j] = dot * scale);
          if (x > max) max = x;
        }
        let sum = 0;
        for (let j = 0; j < n; j++) sum += (scores[j] = Math.exp(scores[j] - max));
        acc.fill(0);
        for (let j = 0; j < n; j++) {
          const w = scores[j], vo = kvBase + j * E;
          for (let e = 0; e < E; e++) acc[e] += w * v[vo + e];
        }
        const inv = 1 / sum;
        for (let e = 0; e < E; e++) out[qo + e] = acc[e] * inv;
      }
    }
  }
  return out;
}

export async function createPeer({ quick = false } = {}) {
  return {
    name: 'plain-js',
    version: `Node ${process.versions.node}`,
    config: { precision: 'float32 storage' },
    maxRunSeconds: quick ? 0.3 : 3,   // "only where a run takes less than a few seconds"
    priorGflops: 2,                    // run-time guess before any measurement (≈ 1–2 here)
    variants: (s) => [{
      label: 'row loop',
      prepare: async ({ q, k, v }) => ({ run: () => plainAttention(s, q.data, k.data, v.data) }),
    }],
    dispose: () => {},
  };
}
