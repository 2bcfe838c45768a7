// Concurrency (issue #12, "Hardening"): 50 async tasks run at once, each a seeded script of
// awaited steps: sdpa() on any of three direct instances (threads 1, 2, and a second 2) or any
// of three workers (threads 1, 2, default), and append / attend / truncate / reset on a KV cache
// of its own (direct or in a worker). Every step's result (output and weights bits, the cache's
// length) must be bitwise what the same script gives run alone, step by step, on a fresh
// single-threaded instance (README: bitwise the same for any thread count, through a worker
// too); the sequential sdpa results are also checked against the float64 reference. The
// instances are created concurrently too, and threaded instances are created and disposed
// (their thread pools torn down) while others compute. Everything is disposed; a child Node
// process running a smaller concurrent mix must exit by itself.
// The scripts come from a seed: SDPA_PROPERTY_SEED=<seed> reproduces a run
//   SDPA_PROPERTY_SEED=<seed> NODE_OPTIONS=--experimental-vm-modules npx jest tests/node/concurrency.test.mjs
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createAttention, createAttentionWorker } from 'sdpa-wasm';
import { maxRelError, referenceSdpa } from './reference.mjs';
import { bitsHash } from '../shared/reference-cases.mjs';
import { caseSeed, makeRng, seedFromEnvironment, normalTensor, randomOptions, randomShape, referenceOptions, toBshd } from '../shared/property-gen.mjs';

const DIST_INDEX = fileURLToPath(new URL('../../dist/index.js', import.meta.url));
const TOL = 2e-5;
const TASKS = 50;

const SEED = seedFromEnvironment();

/** Where a step runs in the concurrent run. */
const DIRECT_TARGETS = ['direct threads 1', 'direct threads 2', 'direct threads 2 (second instance)'];
const WORKER_TARGETS = ['worker threads 1', 'worker threads 2', 'worker default threads'];

// ─── the scripts ──────────────────────────────────────────────────────────────────────────

/** An sdpa() step: a small random problem (inputs made now, reused by both runs). */
function sdpaStep(r) {
  const shape = randomShape(r, 30_000);
  const { B, Hq, Hkv, Lq, Lk, E, Ev } = shape;
  const { options, causal, offsetOf } = randomOptions(r, { B, Hq, Lq, Lk, outputSize: B * Hq * Lq * Ev });
  delete options.out;  // `out` is exercised below, per run, on a buffer of the run's own
  let query = normalTensor(r, [B, Hq, Lq, E]), key = normalTensor(r, [B, Hkv, Lk, E]), value = normalTensor(r, [B, Hkv, Lk, Ev]);
  if (r.chance(0.3)) {
    options.layout = 'bshd';
    [query, key, value] = [toBshd(query), toBshd(key), toBshd(value)];
  }
  const target = r.pick([...DIRECT_TARGETS, ...WORKER_TARGETS]);
  return {
    kind: 'sdpa', target, query, key, value, options, useOut: r.chance(0.2), transfer: r.chance(0.2),
    refOptions: referenceOptions(options, causal, offsetOf, B),
  };
}

/**
 * A task's script: its cache (shape, where it lives) and 5..9 steps mixing sdpa() calls with
 * append / attend / truncate / reset on that cache. Lengths are tracked so every step is valid.
 */
function taskScript(index) {
  const r = makeRng(caseSeed(SEED, 'concurrency', index));
  const cache = {
    shape: { batch: r.pick([1, 2]), kvHeads: r.pick([1, 2]), headDim: r.pick([4, 8, 16, 32]), maxLength: r.pick([16, 64, 200]), dtype: r.pick(['float32', 'float16']) },
    target: r.pick([...DIRECT_TARGETS, ...WORKER_TARGETS]),
  };
  cache.shape.valueDim = r.chance(0.7) ? cache.shape.headDim : r.pick([4, 8, 12]);
  const { batch: B, kvHeads: Hkv, headDim: E, valueDim: Ev, maxLength } = cache.shape;
  const steps = [];
  let length = 0;
  for (let n = r.int(5, 9); n > 0; n--) {
    const pick = r.next();
    if (pick < 0.4) {
      steps.push(sdpaStep(r));
    } else if (pick < 0.65 && length < maxLength) {
      const Lnew = r.int(1, Math.min(maxLength - length, r.pick([1, 1, 3, 8, 40])));
      steps.push({ kind: 'append', key: normalTensor(r, [B, Hkv, Lnew, E]), value: normalTensor(r, [B, Hkv, Lnew, Ev]), transfer: r.chance(0.2) });
      length += Lnew;
    } else if (pick < 0.9) {
      const Hq = Hkv * r.pick([1, 2, 4]), Lq = r.pick([1, 1, 2, 5]);
      const { options } = randomOptions(r, { B, Hq, Lq, Lk: length, outputSize: B * Hq * Lq * Ev }, { forCache: true });
      delete options.out;
      steps.push({ kind: 'attend', query: normalTensor(r, [B, Hq, Lq, E]), options, useOut: r.chance(0.2) });
    } else if (r.chance(0.7)) {
      const n2 = r.int(0, length);
      steps.push({ kind: 'truncate', n: n2 });
      length = n2;
    } else {
      steps.push({ kind: 'reset' });
      length = 0;
    }
  }
  return { cache, steps };
}

// ─── running a script ─────────────────────────────────────────────────────────────────────

/** Output and weights bits of a result, as text. */
const resultBits = (result) => `${result.output.dims} ${bitsHash(result.output.data)}${result.weights ? ` w ${bitsHash(result.weights.data)}` : ''}`;

/** Whether an API object is an AttentionWorker (whose calls may move their inputs: { transfer: true }). */
const isWorker = (api) => typeof api.terminate === 'function';

/** Lets other tasks run: a microtask, a macrotask or a timer, at random (seeded). */
function yieldSomehow(r) {
  const how = r.int(0, 2);
  if (how === 0) return Promise.resolve();
  if (how === 1) return new Promise((resolve) => setImmediate(resolve));
  return new Promise((resolve) => setTimeout(resolve, 0));
}

/**
 * Runs a task's script; `apis[target]` is the Attention or AttentionWorker a target names.
 * Returns one text per step: the result's bits, or the cache's length after the step.
 */
async function runScript(script, apis, r, inFlight) {
  const results = [];
  const cache = await apis[script.cache.target].createKVCache(script.cache.shape);
  try {
    for (const step of script.steps) {
      await yieldSomehow(r);
      inFlight.now++;
      inFlight.max = Math.max(inFlight.max, inFlight.now);
      try {
        if (step.kind === 'sdpa') {
          const api = apis[step.target];
          const out = step.useOut ? new Float32Array(step.query.data.length / step.query.dims.at(-1) * step.value.dims.at(-1)) : undefined;
          const inputs = step.transfer ? structuredClone([step.query, step.key, step.value]) : [step.query, step.key, step.value];
          const options = { ...step.options, ...(out ? { out } : {}), ...(step.transfer && isWorker(api) ? { transfer: true } : {}) };
          const result = await api.sdpa(...inputs, options);
          if (out) expect(result.output.data.buffer).toBe(out.buffer);
          results.push(`sdpa ${resultBits(result)}`);
        } else if (step.kind === 'append') {
          const move = step.transfer && isWorker(apis[script.cache.target]);
          const [key, value] = move ? structuredClone([step.key, step.value]) : [step.key, step.value];
          await cache.append(key, value, move ? { transfer: true } : undefined);
          results.push(`append → ${cache.length}`);
        } else if (step.kind === 'attend') {
          const size = step.query.data.length / step.query.dims[3] * script.cache.shape.valueDim;
          const out = step.useOut ? new Float32Array(size) : undefined;
          const result = await cache.attend(step.query, out ? { ...step.options, out } : step.options);
          results.push(`attend ${resultBits(result)}`);
        } else if (step.kind === 'truncate') {
          await cache.truncate(step.n);
          results.push(`truncate → ${cache.length}`);
        } else {
          await cache.reset();
          results.push(`reset → ${cache.length}`);
        }
      } finally {
        inFlight.now--;
      }
    }
  } finally {
    await cache.dispose();
  }
  return results;
}

// ─── the tests ────────────────────────────────────────────────────────────────────────────

describe(`concurrency, seed ${SEED} (SDPA_PROPERTY_SEED=${SEED} reproduces)`, () => {
  const scripts = Array.from({ length: TASKS }, (_, i) => taskScript(i));
  let sequential;

  test(`${TASKS} task scripts run alone, step by step, on a fresh single-threaded instance (sdpa checked against the reference)`, async () => {
    const fresh = await createAttention({ threads: 1 });
    try {
      const apis = Object.fromEntries([...DIRECT_TARGETS, ...WORKER_TARGETS].map((t) => [t, fresh]));
      sequential = [];
      for (const [i, script] of scripts.entries()) {
        sequential.push(await runScript(script, apis, makeRng(caseSeed(SEED, 'sequential-yields', i)), { now: 0, max: 0 }));
        for (const step of script.steps) {
          if (step.kind !== 'sdpa') continue;
          const got = fresh.sdpa(step.query, step.key, step.value, step.options);
          const ref = referenceSdpa(step.query, step.key, step.value, step.refOptions);
          const error = maxRelError(got.output.data, ref.output);
          if (!(error <= TOL)) throw new Error(`seed ${SEED}, task ${i}: sdpa ${JSON.stringify(step.query.dims)} off the reference by ${error}`);
        }
      }
      expect(sequential.flat().length).toBe(scripts.reduce((n, s) => n + s.steps.length, 0));
    } finally {
      fresh.dispose();
    }
  }, 60_000);

  test(`the same ${TASKS} scripts at once over 3 instances and 3 workers (created concurrently): bitwise the sequential results`, async () => {
    expect(sequential).toHaveLength(TASKS);
    const created = await Promise.all([
      createAttention({ threads: 1 }), createAttention({ threads: 2 }), createAttention({ threads: 2 }),
      createAttentionWorker({ threads: 1 }), createAttentionWorker({ threads: 2 }), createAttentionWorker(),
    ]);
    const apis = Object.fromEntries([...DIRECT_TARGETS, ...WORKER_TARGETS].map((t, i) => [t, created[i]]));
    try {
      expect(created.map((a) => a.threads).slice(0, 5)).toEqual([1, 2, 2, 1, 2]);
      const inFlight = { now: 0, max: 0 };
      const concurrent = await Promise.all(scripts.map((script, i) => runScript(script, apis, makeRng(caseSeed(SEED, 'concurrent-yields', i)), inFlight)));
      // The tasks did overlap: many steps were awaiting at the same moment.
      expect(inFlight.max).toBeGreaterThanOrEqual(10);
      const differences = [];
      concurrent.forEach((results, i) => results.forEach((got, s) => {
        if (got !== sequential[i][s]) differences.push(`task ${i} step ${s} (${scripts[i].steps[s].kind} on ${scripts[i].steps[s].target ?? scripts[i].cache.target}): ${got} ≠ ${sequential[i][s]}`);
      }));
      if (differences.length > 0) throw new Error(`seed ${SEED}: ${differences.length} steps differ from the sequential run:\n${differences.slice(0, 10).join('\n')}`);
      expect(concurrent).toEqual(sequential);
    } finally {
      for (const a of created.slice(0, 3)) a.dispose();
      await Promise.all(created.slice(3).map((w) => w.dispose()));
    }
  }, 60_000);

  test('threaded instances (2 and 3 threads) created and disposed while others compute: every result bitwise a single-threaded instance\'s', async () => {
    const r = makeRng(caseSeed(SEED, 'churn', 0));
    const problems = Array.from({ length: 6 }, () => sdpaStep(r));
    const single = await createAttention({ threads: 1 });
    let expected;
    try {
      expected = problems.map((p) => resultBits(single.sdpa(p.query, p.key, p.value, p.options)));
    } finally {
      single.dispose();
    }
    const got = await Promise.all(Array.from({ length: 24 }, async (_, i) => {
      await new Promise((resolve) => setTimeout(resolve, (i * 7) % 13));
      const instance = await createAttention({ threads: 2 + (i % 2) });
      try {
        const bits = [];
        for (const p of problems) {
          bits.push(resultBits(instance.sdpa(p.query, p.key, p.value, p.options)));
          await yieldSomehow(r);
        }
        return bits;
      } finally {
        instance.dispose();  // the last one of a thread count terminates that pool
      }
    }));
    for (const bits of got) expect(bits).toEqual(expected);
  }, 60_000);

  test('a Node process running a concurrent mix (2 instances, 2 workers, caches) exits by itself once everything is disposed', async () => {
    const script = `
      import { createAttention, createAttentionWorker } from ${JSON.stringify(DIST_INDEX)};
      const t = (dims, x) => ({ data: new Float32Array(dims.reduce((a, b) => a * b, 1)).map((_, i) => Math.sin(i * x)), dims });
      const [a1, a2, w1, w2] = await Promise.all([createAttention({ threads: 1 }), createAttention({ threads: 2 }),
        createAttentionWorker({ threads: 1 }), createAttentionWorker({ threads: 2 })]);
      const apis = [a1, a2, w1, w2];
      const hashes = await Promise.all(Array.from({ length: 20 }, async (_, i) => {
        const api = apis[i % 4];
        const cache = await api.createKVCache({ batch: 1, kvHeads: 2, headDim: 8, maxLength: 32, dtype: i % 3 ? 'float32' : 'float16' });
        await cache.append(t([1, 2, 5, 8], 0.1 + i), t([1, 2, 5, 8], 0.2 + i));
        await new Promise((r) => setTimeout(r, i % 3));
        const a = await cache.attend(t([1, 4, 2, 8], 0.3 + i));
        const s = await api.sdpa(t([1, 4, 3, 8], 0.4 + i), t([1, 2, 9, 8], 0.5 + i), t([1, 2, 9, 8], 0.6 + i), { isCausal: true });
        await cache.dispose();
        return a.output.data[0] + s.output.data[0];
      }));
      a1.dispose(); a2.dispose();
      await Promise.all([w1.dispose(), w2.dispose()]);
      console.log('done', hashes.length, hashes.every(Number.isFinite));
    `;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '', stderr = '';
    child.stdout.on('data', (d) => { stdout += d; });
    child.stderr.on('data', (d) => { stderr += d; });
    const code = await new Promise((resolve) => {
      const timer = setTimeout(() => { child.kill('SIGKILL'); resolve('hung: still running after 30 s'); }, 30_000);
      child.on('exit', (c) => { clearTimeout(timer); resolve(c); });
    });
    expect({ code, stderr }).toEqual({ code: 0, stderr: '' });
    expect(stdout.trim()).toBe('done 20 true');
  }, 40_000);
});
