// A page whose package comes from `from` (another origin) while the attention worker's script
// there cannot be loaded: what createAttentionWorker does (it must reject, not wait forever), and
// whether the direct API still works. Shared by tests/browser/loading.spec.mjs (Chromium) and
// tests/engines (Firefox, WebKit). Plain ES module, run in the page.
export async function workerLoadFailure(from) {
  const { createAttention, createAttentionWorker } = await import(`${from}/dist/index.js`);
  const worker = await Promise.race([
    createAttentionWorker().then(() => ({ started: true }), (error) => ({ name: error.constructor.name, message: error.message })),
    new Promise((resolve) => setTimeout(() => resolve({ hung: true }), 20_000)),
  ]);
  const attn = await createAttention();
  const x = { data: new Float32Array(16).fill(1), dims: [1, 1, 4, 4] };
  const directWorks = attn.sdpa(x, x, x).output.data.every((value) => value === 1);
  attn.dispose();
  return { worker, directWorks };
}
