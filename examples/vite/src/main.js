import { createAttention } from 'sdpa-wasm';
import { check } from './check.js';

const status = document.getElementById('status');
try {
  const attn = await createAttention();
  const report = check(attn);
  document.getElementById('result').textContent = report.text;
  status.textContent = report.ok ? 'Correct: sdpa-wasm matches the plain-JavaScript result.' : 'Mismatch!';
  status.className = report.ok ? 'ok' : 'bad';
  window.__example = { ...report, threads: attn.threads, simd: attn.simd };
  attn.dispose();
} catch (error) {
  status.textContent = `sdpa-wasm failed: ${error.message}`;
  status.className = 'bad';
  window.__example = { ok: false, error: String(error.message) };
}
