// The benchmark shapes: one place for them, shared by bench.mjs and anything that reports.
// GFLOP/s counts 4·B·Hq·Lq·Lk·E (two matmuls, E = Ev), whether or not causal skips work.
export const SHAPES = [
  { name: 'N128', B: 1, H: 12, Lq: 128, Lk: 128, E: 64, causal: false },
  { name: 'N512', B: 1, H: 12, Lq: 512, Lk: 512, E: 64, causal: false },
  { name: 'N2048', B: 1, H: 12, Lq: 2048, Lk: 2048, E: 64, causal: false },
  { name: 'N512 causal', B: 1, H: 12, Lq: 512, Lk: 512, E: 64, causal: true },
];

export const flops = (s) => 4 * s.B * s.H * s.Lq * s.Lk * s.E;
