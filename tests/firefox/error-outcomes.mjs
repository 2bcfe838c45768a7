// Every bad-input case of the shared error lists (tests/shared/sdpa-error-cases.mjs,
// kv-cache-error-cases.mjs, varlen-cases.mjs), run on one single-threaded instance: what each
// call threw. Self-contained (its source is sent into a browser page): `load` imports a module by
// its path from the repository's root.
//
// Returns { outcomes: [[description, class, message, matches]], stillWorks }: `matches` says the
// error is an instance of the case's class and its message matches the case's patterns;
// `stillWorks` that a valid call afterwards gives a finite output and the cache keeps its length.
export async function errorOutcomes(load) {
  const { createAttention } = await load('/dist/index.js');
  const { sdpaErrorCases } = await load('/tests/shared/sdpa-error-cases.mjs');
  const cacheCases = await load('/tests/shared/kv-cache-error-cases.mjs');
  const { varlenErrorCases } = await load('/tests/shared/varlen-cases.mjs');
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
