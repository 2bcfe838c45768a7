// The timing of the bench's side sections (window.mjs, varlen.mjs, alibi.mjs, dropout.mjs): every entry run
// in the same rounds, in a new shuffled order every round, so that a slow phase of the shared
// machine falls on all of them alike; then medians.

/** The median of `xs` (the mean of the middle two for an even count). */
export const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

/**
 * Times `entries` ({ run(), … }): settings.warmRuns untimed runs of each, then rounds until every
 * entry has settings.minRuns times and settings.minSeconds have passed. Each entry gets `times`
 * (ms). `before(e)` runs before every timed run, untimed (e.g. evicting the caches). Returns the
 * seconds the rounds took.
 */
export function timeRoundRobin(entries, settings, before = () => {}) {
  const timed = (e) => {
    before(e);
    const t0 = performance.now();
    e.run();
    return performance.now() - t0;
  };
  for (const e of entries) {
    for (let i = 0; i < settings.warmRuns; i++) timed(e);
    e.times = [];
  }
  const start = performance.now();
  for (let round = 0; entries.some((e) => e.times.length < settings.minRuns) || performance.now() - start < settings.minSeconds * 1000; round++) {
    const order = entries.map((e, i) => [((i + 1) * 2654435761 * (round + 1)) >>> 0, e]).sort((a, b) => a[0] - b[0]);
    for (const [, e] of order) e.times.push(timed(e));
  }
  return (performance.now() - start) / 1000;
}

/**
 * Runs each entry's `check(output)` once, before timing, into `e.error` (a relative error); a
 * result past `tolerance` throws, naming the entry's group, variant and role.
 */
export function checkEntries(entries, tolerance) {
  for (const e of entries) {
    if (!e.check) continue;
    e.error = e.check(e.run());
    if (!(e.error <= tolerance)) throw new Error(`${e.group} ${e.variant} ${e.role}: WRONG (relative error ${e.error} > ${tolerance})`);
  }
}
