// The instruction set: createAttention() picks the relaxed-SIMD build (f32x4.relaxed_madd) where
// the engine runs it, else the portable SIMD128 build; { relaxedSimd: false } forces the portable
// one. scripts/test-js.sh runs the whole Jest suite once per build (SDPA_TEST_ISA says which
// this run must have picked). Both builds are within the suite's tolerance of the float64
// reference; they may differ from each other in the last bits (a fused multiply-add rounds once),
// and each is bitwise the same on one and two threads.
import { readFileSync } from 'node:fs';
import { createAttention, createAttentionWorker } from 'sdpa-wasm';
import { bitsHash, REFERENCE_CASES, REFERENCE_TOL, runReferenceCases } from '../shared/reference-cases.mjs';

// (func (result v128) (f32x4.relaxed_madd (v128.const 0) (v128.const 0) (v128.const 0)))
const RELAXED_PROBE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 61, 1, 59, 0,
  ...[0, 1, 2].flatMap(() => [253, 12, ...Array(16).fill(0)]), 253, 133, 2, 11,
]);
const engineRunsRelaxed = WebAssembly.validate(RELAXED_PROBE);
const expectedIsa = engineRunsRelaxed ? 'relaxed-simd' : 'simd128';

test('this run picked the build scripts/test-js.sh asked for (or, run by hand, the one Node\'s flags give)', () => {
  // Without SDPA_TEST_ISA: relaxed SIMD where Node runs it, 22 on or 20 with the flag (a
  // probe that failed to validate would quietly leave the relaxed build untested).
  const flags = [...process.execArgv, ...(process.env.NODE_OPTIONS ?? '').split(/\s+/)];
  const byFlags = flags.includes('--experimental-wasm-relaxed-simd') || Number(process.versions.node.split('.')[0]) >= 22
    ? 'relaxed-simd' : 'simd128';
  expect(expectedIsa).toBe(process.env.SDPA_TEST_ISA ?? byFlags);
});

test('createAttention picks the relaxed build where the engine runs it; relaxedSimd: false the portable one', async () => {
  for (const threads of [1, 2]) {
    const chosen = await createAttention({ threads });
    const portable = await createAttention({ threads, relaxedSimd: false });
    const asked = await createAttention({ threads, relaxedSimd: true });
    try {
      expect(chosen.isa).toBe(expectedIsa);
      expect(asked.isa).toBe(expectedIsa);  // true asks for it where available, never fails without it
      expect(portable.isa).toBe('simd128');
      expect([chosen.simd, portable.simd]).toEqual([true, true]);
    } finally {
      chosen.dispose();
      portable.dispose();
      asked.dispose();
    }
  }
});

test('the shipped builds carry no function names: a page downloads code, not a "name" section', async () => {
  // The relaxed builds are linked without Binaryen, which strips the names from the portable
  // ones; scripts/strip-wasm-names.mjs drops them after the link (44-53 kB each). The engine's
  // own parser reads the sections. Relaxed builds compile only where the engine runs them.
  const builds = ['sdpa', 'sdpa-mt', ...(engineRunsRelaxed ? ['sdpa-relaxed', 'sdpa-mt-relaxed'] : [])];
  const sections = {};
  for (const build of builds) {
    const module = await WebAssembly.compile(readFileSync(new URL(`../../dist/wasm/${build}.wasm`, import.meta.url)));
    expect(WebAssembly.Module.exports(module).length).toBeGreaterThan(0);  // compiled a real build
    sections[build] = WebAssembly.Module.customSections(module, 'name').length;
  }
  expect(sections).toEqual(Object.fromEntries(builds.map((build) => [build, 0])));
});

test('the relaxed builds\' glue is minified as the portable builds\' is: within 1.15× of its size, in as few lines', () => {
  // emcc minifies the glue from -O2 on; the relaxed builds are linked at -O1, and
  // scripts/minify-glue.mjs runs emcc's optimiser on their glue after the link (unminified, it
  // was 2.4× and 1.3× the portable builds': 121 and 112 kB).
  const glue = (build) => readFileSync(new URL(`../../dist/wasm/${build}.mjs`, import.meta.url), 'utf8');
  for (const [relaxed, portable] of [['sdpa-relaxed', 'sdpa'], ['sdpa-mt-relaxed', 'sdpa-mt']]) {
    const [r, p] = [glue(relaxed), glue(portable)];
    expect(r.length).toBeLessThanOrEqual(1.15 * p.length);
    expect(r.split('\n').length).toBeLessThanOrEqual(p.split('\n').length + 5);
    // The bundler-friendly way to its .wasm survives (new URL(…, import.meta.url)).
    expect(r).toContain(`new URL("${relaxed}.wasm",import.meta.url)`);
  }
});

/** Each reference case's output (and weights) bits, hashed. */
function hashes(attn) {
  return REFERENCE_CASES.map(({ make }) => {
    const { query, key, value, options } = make();
    const { output, weights } = attn.sdpa(query, key, value, options);
    return bitsHash(output.data) + (weights ? bitsHash(weights.data) : '');
  }).join(' ');
}

test('both builds pass the reference cases; each is bitwise the same on one and two threads', async () => {
  for (const relaxedSimd of [true, false]) {
    const one = await createAttention({ threads: 1, relaxedSimd });
    const two = await createAttention({ threads: 2, relaxedSimd });
    try {
      const cases = await runReferenceCases(one);
      expect(cases.filter((c) => !c.ok).map((c) => `${one.isa} ${c.name}: ${c.outputError}`)).toEqual([]);
      expect(cases.every((c) => c.outputError <= REFERENCE_TOL)).toBe(true);
      expect(hashes(two)).toBe(cases.map((c) => c.hash).join(' '));
    } finally {
      one.dispose();
      two.dispose();
    }
  }
});

test('where relaxed SIMD runs, the two builds agree to within a few float32 roundings', async () => {
  if (!engineRunsRelaxed) {
    // Nothing to compare: this engine has only the portable build. The assertion documents it.
    expect(expectedIsa).toBe('simd128');
    return;
  }
  const relaxed = await createAttention({ threads: 1 });
  const portable = await createAttention({ threads: 1, relaxedSimd: false });
  try {
    let worst = 0, differing = 0, total = 0;
    for (const { make } of REFERENCE_CASES) {
      const { query, key, value, options } = make();
      const a = relaxed.sdpa(query, key, value, options).output.data;
      const b = portable.sdpa(query, key, value, options).output.data;
      for (let i = 0; i < a.length; i++) {
        total++;
        if (!Object.is(a[i], b[i])) differing++;
        worst = Math.max(worst, Math.abs(a[i] - b[i]) / (1 + Math.abs(b[i])));
      }
    }
    expect(worst).toBeLessThan(2e-6);
    // Fused multiply-adds do change some bits (else the relaxed build would not be in use).
    expect(differing).toBeGreaterThan(0);
    console.log(`relaxed vs portable: ${differing} of ${total} outputs differ in their last bits, at most ${worst.toExponential(2)} relative`);
  } finally {
    relaxed.dispose();
    portable.dispose();
  }
});

test('the worker takes relaxedSimd and reports its isa', async () => {
  const chosen = await createAttentionWorker({ threads: 1 });
  const portable = await createAttentionWorker({ threads: 1, relaxedSimd: false });
  try {
    expect(chosen.isa).toBe(expectedIsa);
    expect(portable.isa).toBe('simd128');
  } finally {
    await chosen.dispose();
    await portable.dispose();
  }
});

test('relaxedSimd must be a boolean', async () => {
  for (const [create, fn] of [[createAttention, 'createAttention'], [createAttentionWorker, 'createAttentionWorker']]) {
    let error;
    try {
      await create({ relaxedSimd: 'yes' });
    } catch (e) {
      error = e;
    }
    expect(error?.constructor).toBe(TypeError);
    expect(error.message).toBe(`${fn}: options.relaxedSimd must be a boolean, got "yes"`);
  }
});
