// The benchmark shapes: one place for them, shared by bench.mjs, the peers and anything that
// reports. Tensors are [B, H, L, E] (query: Hq heads, key/value: Hkv heads, Hq % Hkv == 0).
// `H` is the query head count (Hq). `quick: true` marks the shapes `--quick` runs.
// `twoThreads: true` marks the shapes on which sdpa-wasm and onnxruntime-web are also timed on
// two threads (bench.mjs; with --quick, those that are also `quick`).
//
// GFLOP/s counts 4·B·Hq·Lq·Lk·E (two matmuls, E = Ev), whether or not causal skips work
// (`flops`). `usefulFlops` counts only the query/key pairs a causal mask leaves (top-left
// aligned: row i sees keys 0..i), which is what "fraction of the SIMD peak" is measured on.
// `bytes` is the memory a single pass must move: Q, K, V read once, the output written once;
// it is what decode (Lq = 1) is limited by.
export const SHAPES = [
  { id: 'a', name: 'N128', B: 1, H: 12, Hkv: 12, Lq: 128, Lk: 128, E: 64, causal: false, quick: true },
  { id: 'b', name: 'N512', B: 1, H: 12, Hkv: 12, Lq: 512, Lk: 512, E: 64, causal: false, quick: true, twoThreads: true },
  { id: 'c', name: 'N2048', B: 1, H: 12, Hkv: 12, Lq: 2048, Lk: 2048, E: 64, causal: false, quick: false, twoThreads: true },
  { id: 'd', name: 'decode Lk4096', B: 1, H: 32, Hkv: 32, Lq: 1, Lk: 4096, E: 128, causal: false, quick: true, twoThreads: true },
  { id: 'e', name: 'N512 causal', B: 1, H: 12, Hkv: 12, Lq: 512, Lk: 512, E: 64, causal: true, quick: true },
  { id: 'f', name: 'N2048 causal', B: 1, H: 12, Hkv: 12, Lq: 2048, Lk: 2048, E: 64, causal: true, quick: false, twoThreads: true },
  { id: 'g', name: 'GQA decode Lk8192', B: 1, H: 32, Hkv: 8, Lq: 1, Lk: 8192, E: 128, causal: false, quick: true, twoThreads: true },
  { id: 'h', name: 'N32768 causal', B: 1, H: 1, Hkv: 1, Lq: 32768, Lk: 32768, E: 64, causal: true, quick: false },
];

export const flops = (s) => 4 * s.B * s.H * s.Lq * s.Lk * s.E;

/** Key count summed over query rows: Lq·Lk, or Σ min(i + 1, Lk) when causal. */
export const attendedPairs = (s) => {
  if (!s.causal) return s.Lq * s.Lk;
  const full = Math.min(s.Lq, s.Lk);                       // rows 0..full-1 see i + 1 keys
  return full * (full + 1) / 2 + Math.max(0, s.Lq - s.Lk) * s.Lk;
};

export const usefulFlops = (s) => 4 * s.B * s.H * attendedPairs(s) * s.E;

export const bytes = (s) => 4 * s.B * s.E * (2 * s.H * s.Lq + 2 * (s.Hkv ?? s.H) * s.Lk);

export const isDecode = (s) => s.Lq === 1;

/** `B1 H12 N512 E64`, `B1 Hq32 Hkv8 Lq1 Lk8192 E128`, … */
export const describe = (s) => {
  const heads = s.Hkv !== s.H ? `Hq${s.H} Hkv${s.Hkv}` : `H${s.H}`;
  const lens = s.Lq === s.Lk ? `N${s.Lq}` : `Lq${s.Lq} Lk${s.Lk}`;
  return `B${s.B} ${heads} ${lens} E${s.E}${s.causal ? ' causal' : ''}`;
};
