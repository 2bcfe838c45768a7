// Runs one causal attention with sdpa-wasm and with a plain-JavaScript loop, and compares.
const [H, L, E] = [4, 64, 32];

function inputs() {
  let s = 12345;
  const next = () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32) * 2 - 1;
  const t = () => ({ data: Float32Array.from({ length: H * L * E }, next), dims: [1, H, L, E] });
  return { query: t(), key: t(), value: t() };
}

function plain({ query, key, value }) {
  const out = new Float64Array(H * L * E);
  for (let h = 0; h < H; h++) {
    for (let i = 0; i < L; i++) {
      const s = [];
      for (let j = 0; j <= i; j++) {
        let dot = 0;
        for (let d = 0; d < E; d++) dot += query.data[(h * L + i) * E + d] * key.data[(h * L + j) * E + d];
        s.push(dot / Math.sqrt(E));
      }
      const m = Math.max(...s);
      const p = s.map((x) => Math.exp(x - m));
      const z = p.reduce((a, b) => a + b, 0);
      for (let j = 0; j <= i; j++) {
        for (let d = 0; d < E; d++) out[(h * L + i) * E + d] += (p[j] / z) * value.data[(h * L + j) * E + d];
      }
    }
  }
  return out;
}

export function check(attn) {
  const x = inputs();
  const t0 = performance.now();
  const { output } = attn.sdpa(x.query, x.key, x.value, { isCausal: true });
  const ms = performance.now() - t0;
  const expected = plain(x);
  let maxError = 0;
  for (let k = 0; k < expected.length; k++) maxError = Math.max(maxError, Math.abs(output.data[k] - expected[k]));
  const ok = output.dims.join() === [1, H, L, E].join() && maxError < 1e-5;
  const text = [
    `output dims        [${output.dims.join(', ')}]`,
    `output[0,0,5,0:4]  ${Array.from(output.data.subarray(5 * E, 5 * E + 4), (v) => v.toFixed(5)).join('  ')}`,
    `max |difference|   ${maxError.toExponential(2)} against plain JavaScript`,
    `threads            ${attn.threads}, ${attn.isa === 'relaxed-simd' ? 'relaxed SIMD (FMA)' : 'SIMD128'}, ${ms.toFixed(2)} ms`,
  ].join('\n');
  return { ok, maxError, output: Array.from(output.data.subarray(0, 8)), text };
}

/**
 * The same attention through createAttentionWorker(): in the package's worker (found by the
 * bundler or the browser through `new URL(..., import.meta.url)`), the page stays free while it
 * runs, and the output is bitwise the direct call's.
 */
export async function checkWorker(worker, attn) {
  const direct = attn.sdpa(...Object.values(inputs()), { isCausal: true }).output.data;
  const x = inputs();
  const { output } = await worker.sdpa(x.query, x.key, x.value, { isCausal: true, transfer: true });
  const sameBits = output.data.length === direct.length && output.data.every((v, i) => Object.is(v, direct[i]));
  const detached = x.query.data.length === 0;  // transferred, not copied
  const text = `worker             ${worker.threads} thread${worker.threads > 1 ? 's' : ''}, output ${sameBits ? 'bitwise equal to' : 'DIFFERENT from'} the direct call`;
  return { ok: sameBits && detached, sameBits, detached, threads: worker.threads, isa: worker.isa, text };
}
