// The `demo` object the tests read (window.__demo): what each panel computed and shows, and
// how far the page has started.

/** What the tests read. `version` counts the computations of each panel. */
export const demo = {
  ready: false,
  error: null,
  threads: null,
  simd: null,
  isa: null,     // 'relaxed-simd' (FMA) or 'simd128': the build in use
  worker: null,  // { threads, simd, isa } of the AttentionWorker the long jobs use
  crossOriginIsolated: globalThis.crossOriginIsolated === true,
  heatmap: null,
  lesson: null,
  masking: null,
  bench: null,
  generation: null,
  training: null,
  version: { heatmap: 0, lesson: 0, masking: 0, bench: 0, generation: 0, training: 0 },
};
window.__demo = demo;
