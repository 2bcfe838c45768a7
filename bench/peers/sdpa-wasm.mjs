// sdpa-wasm itself, through its public API (the built package in dist/).
// createPeer({ threads: 1 }) is the single-threaded build ('sdpa-wasm'); threads: 2 is the
// threaded build with a pool of one worker besides the calling thread ('sdpa-wasm-2t').
// Both are the portable SIMD128 build (relaxedSimd: false, whatever the engine runs);
// createPeer({ relaxed: true }) ('sdpa-wasm-relaxed') is the relaxed-SIMD build (FMA), where
// this Node runs it (Node 20: --experimental-wasm-relaxed-simd, which npm run bench passes).
// createPeer({ notCausal: true }) ('sdpa-wasm-not-causal') runs only on causal shapes, the same
// call without the causal mask: timed in the same rounds, it gives the causal speed-up without
// comparing runs from different minutes. Its output is checked against the non-causal reference.
import { readFileSync, statSync } from 'node:fs';
import { createAttention } from 'sdpa-wasm';

export async function createPeer({ threads = 1, notCausal = false, relaxed = false } = {}) {
  const attn = await createAttention({ threads, relaxedSimd: relaxed });
  if (attn.threads !== threads) {
    attn.dispose();
    throw new Error(`sdpa-wasm: asked for ${threads} threads, got attn.threads = ${attn.threads}`);
  }
  if (relaxed && attn.isa !== 'relaxed-simd') {
    attn.dispose();
    throw new Error('this Node does not run relaxed SIMD (Node 20: run it with --experimental-wasm-relaxed-simd)');
  }
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8'));
  // When the build in dist/ was made (the working tree may change between runs).
  const wasm = `${threads === 1 ? 'sdpa' : 'sdpa-mt'}${relaxed ? '-relaxed' : ''}.wasm`;
  const mtime = (f) => { try { return statSync(new URL(`../../dist/${f}`, import.meta.url)).mtime.toISOString(); } catch { return null; } };
  return {
    name: (threads === 1 ? 'sdpa-wasm' : `sdpa-wasm-${threads}t`) + (relaxed ? '-relaxed' : '') + (notCausal ? '-not-causal' : ''),
    version: pkg.version,
    threads: attn.threads,
    config: { threads: attn.threads, simd: attn.simd, isa: attn.isa },
    build: { 'dist/index.js': mtime('index.js'), [`dist/wasm/${wasm}`]: mtime(`wasm/${wasm}`) },
    // The package under test is always measured, also where a run takes several seconds; its
    // not-causal twin is a yardstick, with the peers' limits (skipped where a run is long).
    ...(notCausal ? {} : { maxRunSeconds: 30, budgetSeconds: 150, minRunsFloor: 3 }),
    causalTwin: notCausal,
    variants: (s) => (notCausal ? [{
      label: 'sdpa(…, { out }), not causal',
      note: 'the same call without the causal mask, timed in the same rounds: its sdpa÷peer is the causal speed-up',
      checkShape: { ...s, causal: false },
      prepare: async ({ q, k, v }) => {
        const out = new Float32Array(q.data.length);
        return { run: () => attn.sdpa(q, k, v, { isCausal: false, out }).output.data };
      },
    }] : [{
      label: 'sdpa()',
      // Inputs in their natural [B, H, L, E] layout; a fresh output array per call, like the peers.
      prepare: async ({ q, k, v }) => ({
        run: () => attn.sdpa(q, k, v, { isCausal: s.causal }).output.data,
      }),
    }, {
      label: 'sdpa(…, { out })',
      // The same call writing into one caller-owned output array, as an inference loop would:
      // no fresh array per call (on this VM a fresh multi-MB array costs ~12 µs per 4 KiB page
      // in page faults when first written, e.g. ~5 ms for shape b's 1.5 MB output).
      prepare: async ({ q, k, v }) => {
        const out = new Float32Array(q.data.length);  // Ev = E in every benchmark shape
        return { run: () => attn.sdpa(q, k, v, { isCausal: s.causal, out }).output.data };
      },
    }]),
    dispose: () => attn.dispose(),
  };
}
