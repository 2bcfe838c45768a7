// Vite needs no plugin for sdpa-wasm: the package locates its .wasm files with
// `new URL('./wasm/…', import.meta.url)`, which `vite build` copies into dist/assets/.
const isolation = {
  // Cross-origin isolation, so the browser allows SharedArrayBuffer and sdpa-wasm can use
  // its threaded build. Without these headers it runs on one thread.
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Embedder-Policy': 'require-corp',
};

export default {
  // The dev server's dependency pre-bundling would move the package's JavaScript away from its
  // .wasm files; serving it as it is keeps `new URL(..., import.meta.url)` pointing at them.
  optimizeDeps: { exclude: ['sdpa-wasm'] },
  server: { headers: isolation },
  preview: { headers: isolation },
};
