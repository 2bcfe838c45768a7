// A webpack app with no webpack configuration at all: `webpack --mode production` bundles
// src/index.js into dist/, emits the package's .wasm files (found with
// `new URL('./wasm/…', import.meta.url)`) and bundles its worker (found with
// `new Worker(new URL('./worker-entry.js', import.meta.url), { type: 'module' })`).
import { createAttention, createAttentionWorker } from 'sdpa-wasm';
import { check, checkWorker } from './check.js';

const status = document.getElementById('status');
try {
  const attn = await createAttention();
  const report = check(attn);
  const worker = await createAttentionWorker();
  const fromWorker = await checkWorker(worker, attn);
  await worker.dispose();
  document.getElementById('result').textContent = `${report.text}\n${fromWorker.text}`;
  const ok = report.ok && fromWorker.ok;
  status.textContent = ok ? 'Correct: sdpa-wasm matches the plain-JavaScript result.' : 'Mismatch!';
  status.className = ok ? 'ok' : 'bad';
  window.__example = { ...report, ok, threads: attn.threads, simd: attn.simd, isa: attn.isa, worker: fromWorker };
  attn.dispose();
} catch (error) {
  status.textContent = `sdpa-wasm failed: ${error.message}`;
  status.className = 'bad';
  window.__example = { ok: false, error: String(error.message) };
}
