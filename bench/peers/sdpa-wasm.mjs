// sdpa-wasm itself, through its public API (the built package in dist/).
import { readFileSync } from 'node:fs';
import { createAttention } from 'sdpa-wasm';

export async function createPeer() {
  const attn = await createAttention({ threads: 1 });   // the single-threaded build
  if (attn.threads !== 1) throw new Error(`sdpa-wasm: asked for 1 thread, got ${attn.threads}`);
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8'));
  return {
    name: 'sdpa-wasm',
    version: pkg.version,
    config: { threads: attn.threads, simd: attn.simd },
    // The package under test is always measured, also where a run takes several seconds.
    maxRunSeconds: 30,
    budgetSeconds: 150,
    minRunsFloor: 3,
    variants: (s) => [{
      label: 'sdpa()',
      // Inputs in their natural [B, H, L, E] layout; a fresh output array per call, like the peers.
      prepare: async ({ q, k, v }) => ({
        run: () => attn.sdpa(q, k, v, { isCausal: s.causal }).output.data,
      }),
    }],
    dispose: () => attn.dispose(),
  };
}
