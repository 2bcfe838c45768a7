// What the engine tests run, in Node (this process) or in a page: each function is
// self-contained, since its source is sent into the page (browsers.mjs, `page.run`). The first
// argument, `env`, gives `load(path)`, which imports a module by its path from the repository's
// root (or a full URL), and `io`, which reads the ONNX conformance files. Each reports its
// steps in globalThis.__pageProgress, which the tests read when a page stops answering.

/**
 * The correctness cases of tests/shared on one instance (and runLimitedCases' own): the 76 ONNX
 * cases, the float64 reference cases, sdpaBackward, sdpaVarlen, the KV cache's decoding and calls
 * past maxMemoryBytes. Returns { isa, threads, sets: { onnx: [{ name, ok, hash, detail }], … } }.
 */
export async function runAllCases(env, relaxedSimd, threads) {
  const { createAttention } = await env.load('/dist/index.js');
  const onnx = await env.load('/tests/shared/onnx-cases.mjs');
  const { bitsHash, runReferenceCases } = await env.load('/tests/shared/reference-cases.mjs');
  const { runBackwardCases } = await env.load('/tests/shared/backward-cases.mjs');
  const { runVarlenCases } = await env.load('/tests/shared/varlen-cases.mjs');
  const { runLimitedCases } = await env.load('/tests/shared/limited-cases.mjs');
  const { runCacheCases } = await env.load('/tests/shared/kv-cache-cases.mjs');
  const options = { relaxedSimd, ...(threads === undefined ? {} : { threads }) };
  globalThis.__pageProgress = 'runAllCases: createAttention';
  const attn = await createAttention(options);
  const sets = {};
  try {
    globalThis.__pageProgress = 'runAllCases: the ONNX cases';
    const index = await onnx.loadIndex(env.io);
    sets.onnx = [];
    for (const entry of index.cases) {
      try {
        const { failures, output } = onnx.checkCase(attn, await onnx.loadCase(env.io, entry.dir));
        sets.onnx.push({ name: entry.name, ok: failures.length === 0, hash: output ? bitsHash(output) : null, detail: failures.join('; ') });
      } catch (error) {
        sets.onnx.push({ name: entry.name, ok: false, hash: null, detail: `threw ${error}` });
      }
    }
    const keep = (cases) => cases.map((c) => ({ name: c.name, ok: c.ok, hash: c.hash, detail: JSON.stringify(c) }));
    globalThis.__pageProgress = 'runAllCases: the reference cases';
    sets.reference = keep(await runReferenceCases(attn));
    globalThis.__pageProgress = 'runAllCases: the backward cases';
    sets.backward = keep(await runBackwardCases(attn));
    globalThis.__pageProgress = 'runAllCases: the varlen cases';
    sets.varlen = keep(await runVarlenCases(attn));
    globalThis.__pageProgress = 'runAllCases: the KV-cache cases';
    sets.cache = keep(await runCacheCases(attn));
    globalThis.__pageProgress = 'runAllCases: the past-the-limit cases';
    sets.limited = (await runLimitedCases(createAttention, options)).map((c) => ({
      name: c.name, ok: c.same && c.withinLimit && c.limited, hash: c.hash, detail: JSON.stringify(c),
    }));
    return { isa: attn.isa, threads: attn.threads, sets };
  } finally {
    attn.dispose();
  }
}

/**
 * The reference and KV-cache cases through createAttentionWorker, then through the direct API
 * of the same build, the package imported from `from` (an origin, or '' for the page's own).
 * Returns { threads, isa, directThreads, failed, worker, direct, resources }: `worker` and
 * `direct` the cases' hashes, `resources` the package files the page fetched (resource timing).
 */
export async function runWorkerCases(env, from) {
  const { createAttention, createAttentionWorker } = await env.load(`${from}/dist/index.js`);
  const { runReferenceCases } = await env.load('/tests/shared/reference-cases.mjs');
  const { runCacheCases } = await env.load('/tests/shared/kv-cache-cases.mjs');
  const run = async (instance, what) => {
    globalThis.__pageProgress = `runWorkerCases: ${what}, the reference cases`;
    const reference = await runReferenceCases(instance);
    globalThis.__pageProgress = `runWorkerCases: ${what}, the KV-cache cases`;
    return [...reference, ...await runCacheCases(instance)];
  };
  globalThis.__pageProgress = 'runWorkerCases: createAttentionWorker';
  const worker = await createAttentionWorker();
  let viaWorker;
  try {
    viaWorker = { cases: await run(worker, 'the worker'), threads: worker.threads, isa: worker.isa };
  } finally {
    globalThis.__pageProgress = 'runWorkerCases: the worker\'s dispose()';
    await worker.dispose();
  }
  globalThis.__pageProgress = 'runWorkerCases: createAttention';
  const attn = await createAttention();
  try {
    const direct = await run(attn, 'the direct API');
    return {
      threads: viaWorker.threads, isa: viaWorker.isa, directThreads: attn.threads,
      failed: [...viaWorker.cases, ...direct].filter((c) => !c.ok).map((c) => c.name),
      worker: viaWorker.cases.map((c) => `${c.name} ${c.hash}`), direct: direct.map((c) => `${c.name} ${c.hash}`),
      resources: performance.getEntriesByType('resource').map((entry) => entry.name).filter((name) => new URL(name).pathname.startsWith('/dist/')),
    };
  } finally {
    attn.dispose();
  }
}

/**
 * Float16Array data: appends to caches of every dtype (tests/shared/float16-array-cases.mjs) and
 * inputs to every call (float16-input-cases.mjs), on the direct API (one thread) and through the
 * worker, copied and moved ({ transfer: true }). Returns { hasFloat16Array, direct, worker,
 * moved }: each run's cases as { name, ok, hash, detail }.
 */
export async function runFloat16ArrayPage(env) {
  if (typeof Float16Array !== 'function') return { hasFloat16Array: false };
  const { createAttention, createAttentionWorker } = await env.load('/dist/index.js');
  const { runFloat16ArrayCases } = await env.load('/tests/shared/float16-array-cases.mjs');
  const { runFloat16InputCases } = await env.load('/tests/shared/float16-input-cases.mjs');
  const keep = (cases) => cases.map((c) => ({ name: c.name, ok: c.ok, hash: c.hash, detail: JSON.stringify(c) }));
  const run = async (make, what, extra) => {
    globalThis.__pageProgress = `runFloat16ArrayPage: ${what}, appends`;
    const instance = await make({ threads: 1 });
    let appends;
    try {
      appends = await runFloat16ArrayCases(instance, extra);
    } finally {
      await instance.dispose();
    }
    globalThis.__pageProgress = `runFloat16ArrayPage: ${what}, inputs`;
    return keep([...appends, ...await runFloat16InputCases((o) => make({ threads: 1, ...o }), extra)]);
  };
  return {
    hasFloat16Array: true,
    direct: await run((o) => createAttention(o), 'the direct API', {}),
    worker: await run((o) => createAttentionWorker(o), 'the worker', {}),
    moved: await run((o) => createAttentionWorker(o), 'the worker, moved', { transfer: true }),
  };
}

/**
 * Every bad-input case of the shared error lists (tests/shared/sdpa-error-cases.mjs,
 * kv-cache-error-cases.mjs, varlen-cases.mjs) on one single-threaded instance: what each call
 * threw. Returns { outcomes: [[description, class, message, matches]], stillWorks }: `matches`
 * says the error is an instance of the case's class and its message matches the case's patterns;
 * `stillWorks` that a valid call afterwards gives the right output.
 */
export async function errorOutcomes(env) {
  const { createAttention } = await env.load('/dist/index.js');
  const { sdpaErrorCases } = await env.load('/tests/shared/sdpa-error-cases.mjs');
  const cacheCases = await env.load('/tests/shared/kv-cache-error-cases.mjs');
  const { varlenErrorCases } = await env.load('/tests/shared/varlen-cases.mjs');
  const attn = await createAttention({ threads: 1 });
  const outcomes = [];
  const record = (description, call, Kind, patterns) => {
    let thrown = null;
    try {
      call();
    } catch (error) {
      thrown = error;
    }
    const list = Array.isArray(patterns) ? patterns : [patterns];
    const matches = thrown instanceof Kind && list.every((pattern) => pattern.test(thrown.message));
    outcomes.push([description, thrown?.constructor?.name ?? 'nothing thrown', String(thrown?.message), matches]);
  };
  try {
    for (const [description, call, Kind, patterns] of sdpaErrorCases(attn)) record(`sdpa: ${description}`, call, Kind, patterns);
    for (const [description, call, Kind, patterns] of varlenErrorCases(attn)) record(`sdpaVarlen: ${description}`, call, Kind, patterns);
    for (const [description, call, Kind, patterns] of cacheCases.createCacheErrorCases(attn)) {
      record(`createKVCache: ${description}`, call, Kind, patterns);
    }
    for (const dtype of ['float32', 'float16']) {
      const cache = attn.createKVCache({ ...cacheCases.CACHE_OPTIONS, dtype });
      try {
        cache.append(cacheCases.k(cacheCases.STORED, 4), cacheCases.v(cacheCases.STORED, 5));
        for (const [description, call, Kind, patterns] of cacheCases.CACHE_ERROR_CASES) {
          if (dtype === 'float16' && /halves into a float32/.test(description)) continue;
          record(`${dtype} cache: ${description}`, () => call(cache), Kind, patterns);
        }
        if (cache.length !== cacheCases.STORED) outcomes.push([`${dtype} cache length after the errors`, 'changed', String(cache.length), false]);
      } finally {
        cache.dispose();
      }
    }
    const x = { data: new Float32Array(2 * 3 * 4).fill(0.5), dims: [1, 2, 3, 4] };
    const { output } = attn.sdpa(x, x, x, { isCausal: true });
    return { outcomes, stillWorks: output.data.length === 24 && output.data.every((value) => value === 0.5) };
  } finally {
    attn.dispose();
  }
}

/** Waits (up to `ms`) for the demo page to report ready; returns its error (or null) and panel versions. */
export async function demoState(env, ms) {
  const start = Date.now();
  while (!(window.__demo?.ready === true || window.__demo?.error != null) && Date.now() - start < ms) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return { ready: window.__demo?.ready === true, error: window.__demo?.error ?? null, version: { ...window.__demo?.version } };
}
