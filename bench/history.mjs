// node bench/history.mjs [--hosts] [files...]
//
// The project's targets across the full benchmark runs, recomputed from their JSONs (the table
// "Across the full runs" in the README). Default files: docs/bench-2026-11-29.json (the first
// full run, from before the bench-full-* names) and every docs/bench-full-*.json except
// bench-full-2026-12-02-intel-3.json (its portable prefill ran a regression fixed before the
// next run). Runs are taken in the order of their `date`.
//
// Each row is judged as bench.mjs and decode.mjs judge it today (≥ or ≤ the target on the
// unrounded value); a row counts only the runs that measured it:
//   prefill vs onnxruntime-web   ORT's fastest correct graph ÷ sdpa-wasm's sdpa() call (a new
//                                output array per call, as the peers' calls), shapes[id].peers;
//   % of the peak                sdpa-wasm's fractionOfPeak (its faster call, the one with `out`:
//                                the bench's own definition), the relaxed build's of the FMA peak;
//   relaxed rows                 runs with the relaxed build (from the second run on);
//   causal (e), (f)              sdpa-wasm-not-causal ÷ the causal shape's sdpa(…, { out }) variant;
//   (c) two threads              sdpa-wasm's sdpa() one thread ÷ sdpa-wasm-2t's sdpa();
//   cache rows                   decode.rows, one thread, MHA 4096 (d) and 8192 (f): a decode step
//                                (stepMs: append + attend) against ortBestMs or readMs (of 2 × runs);
//   float16 ÷ float32            stepMs of float32 ÷ float16, 1 thread, MHA and GQA at ≥ 8192 (of 4 × runs);
//   Chromium ÷ Node              browser.rows (prefill and sdpa() decode) and browser.decodeRows
//                                (cache decode), `met` as browser.mjs set it; a run whose browser
//                                section failed did not measure it.
// In brackets: the counts by the definitions used until 2026-12-03 (sdpa-wasm's faster call,
// with `out`, against a peer; attend alone for a cache). The older definitions' ranges are
// printed below the table for every row that has them.
// --hosts: each row's range and count per host (lscpu family/model), and for the cache rows the
// runs with the decode streams (from 2026-12-02 05:00 UTC, code 8afe4d3 on) per host.
import { readdirSync, readFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const DOCS = fileURLToPath(new URL('../docs/', import.meta.url));
const FIRST_FULL_RUN = 'bench-2026-11-29.json';
const LEFT_OUT = ['bench-full-2026-12-02-intel-3.json'];
const DECODE_STREAMS_SINCE = '2026-12-02T05:00:00Z';   // the first run with them: intel-3 (left out), then intel-4
const HOSTS = { '25/17': 'Zen 4', '6/167': 'Intel', '26/2': 'Zen 5' };

const argv = process.argv.slice(2);
const byHost = argv.includes('--hosts');
const given = argv.filter((a) => !a.startsWith('--'));
const files = given.length ? given : [FIRST_FULL_RUN, ...readdirSync(DOCS).filter((f) => /^bench-full-.*\.json$/.test(f) && !LEFT_OUT.includes(f))]
  .map((f) => join(DOCS, f));

const runs = files.map((path) => {
  const json = JSON.parse(readFileSync(path, 'utf8'));
  const host = json.host ? HOSTS[`${json.host.cpuFamily}/${json.host.model}`] ?? `${json.host.cpuFamily}/${json.host.model}` : 'not recorded';
  const section = (s) => (s && !s.failed ? s : null);   // a section that threw is { failed }
  return {
    file: basename(path), date: json.date, host, withStreams: json.date >= DECODE_STREAMS_SINCE,
    shapes: Object.fromEntries(json.shapes.map((s) => [s.id, s])), limits: json.limits,
    decode: section(json.decode), browser: section(json.browser),
  };
}).sort((a, b) => a.date.localeCompare(b.date));

// --- where the quantities live ------------------------------------------------------------------
const ok = (p) => (p?.status === 'ok' ? p : null);   // a peer's entry: its fastest ok variant's numbers
const variant = (p, label) => (p?.variants ?? [p]).find((v) => v?.status === 'ok' && v.variant === label) ?? null;
const ratio = (a, b) => (a != null && b != null ? a / b : null);
const peer = (run, id, name) => run.shapes[id]?.peers[name];
const relaxedRan = (run) => run.limits?.fmaPeakGflops != null && peer(run, 'b', 'sdpa-wasm-relaxed') !== undefined;

/** One value per run: ORT ÷ `name`'s sdpa() call, and (old) ÷ its faster call. */
const vsOrt = (name, id) => (run) => {
  const ort = ok(peer(run, id, 'onnxruntime-web')), mine = peer(run, id, name);
  if (!mine) return [];
  return [{ value: ratio(ort?.medianMs, variant(mine, 'sdpa()')?.medianMs), old: ratio(ort?.medianMs, ok(mine)?.medianMs) }];
};
const ofPeak = (name, id) => (run) => (peer(run, id, name) ? [{ value: ok(peer(run, id, name))?.fractionOfPeak ?? null }] : []);
const causalSpeedup = (id) => (run) => {
  const twin = ok(peer(run, id, 'sdpa-wasm-not-causal')), causal = peer(run, id, 'sdpa-wasm');
  return [{ value: ratio(twin?.medianMs, variant(causal, 'sdpa(…, { out })')?.medianMs), old: ratio(twin?.medianMs, ok(causal)?.medianMs) }];
};
const twoThreadSpeedup = (id) => (run) => {
  const one = peer(run, id, 'sdpa-wasm'), two = peer(run, id, 'sdpa-wasm-2t');
  return [{ value: ratio(variant(one, 'sdpa()')?.medianMs, variant(two, 'sdpa()')?.medianMs), old: ratio(ok(one)?.medianMs, ok(two)?.medianMs) }];
};
const decodeRow = (run, kind, context, dtype) =>
  run.decode.rows.find((r) => r.kind === kind && r.context === context && r.dtype === dtype && r.threads === 1);
const CACHE_SHAPES = [['d', 'MHA', 4096], ['f', 'MHA', 8192]];
/** The decode step (and, old, attend alone) of (d) and (f) against `other` (a function of the row). */
const cacheRatio = (dtype, numerator) => (run) => (!run.decode ? [] : CACHE_SHAPES.map(([id, kind, context]) => {
  const r = decodeRow(run, kind, context, dtype);
  return { case: id, ...(numerator ? { value: ratio(r?.[numerator], r?.stepMs), old: ratio(r?.[numerator], r?.attendMs) }
    : { value: ratio(r?.stepMs, r?.readMs), old: ratio(r?.attendMs, r?.readMs) }) };
}));
const float16Speedup = (run) => (!run.decode ? [] : run.decode.rows
  .filter((r) => r.dtype === 'float16' && r.threads === 1 && r.context >= 8192)
  .map((r16) => {
    const r32 = decodeRow(run, r16.kind, r16.context, 'float32');
    return { case: `${r16.kind} ${r16.context}`, value: ratio(r32?.stepMs, r16.stepMs), old: ratio(r32?.attendMs, r16.attendMs) };
  }));
const chromium = (key) => (run) => (run.browser?.[key] ?? []).map((r) => ({ case: `${r.shape ?? r.label} ${r.isa} ${r.threads ?? 1}t`, value: r.chromiumVsNode, met: r.met }));

// --- the rows -----------------------------------------------------------------------------------
// A row has one part per column of values ("(b), (c)": two); each part gives a run's values.
// unit: '×' (two decimals) or '%' (fractions, as whole percent); atLeast / atMost: the target;
// bracket: print the old definitions' count in brackets, as the README does.
const ROWS = [
  { target: '(b) ≥ 1.55× onnxruntime-web, portable', unit: '×', atLeast: 1.55, bracket: true, parts: [vsOrt('sdpa-wasm', 'b')] },
  { target: '(c) ≥ 1.55× onnxruntime-web, portable', unit: '×', atLeast: 1.55, bracket: true, parts: [vsOrt('sdpa-wasm', 'c')] },
  { target: '(b), (c) ≥ 80% of the mul+add peak, portable', unit: '%', atLeast: 0.8, parts: [ofPeak('sdpa-wasm', 'b'), ofPeak('sdpa-wasm', 'c')] },
  { target: '(b), (c) ≥ 75% of the mul+add peak, portable (the relaxed-SIMD issue\'s)', unit: '%', atLeast: 0.75,
    parts: [ofPeak('sdpa-wasm', 'b'), ofPeak('sdpa-wasm', 'c')] },
  { target: '(b) ≥ 2.2× onnxruntime-web, relaxed', unit: '×', atLeast: 2.2, bracket: true, only: relaxedRan, parts: [vsOrt('sdpa-wasm-relaxed', 'b')] },
  { target: '(c) ≥ 2.2× onnxruntime-web, relaxed', unit: '×', atLeast: 2.2, bracket: true, only: relaxedRan, parts: [vsOrt('sdpa-wasm-relaxed', 'c')] },
  { target: '(b), (c) ≥ 75% of the FMA peak, relaxed', unit: '%', atLeast: 0.75, only: relaxedRan,
    parts: [ofPeak('sdpa-wasm-relaxed', 'b'), ofPeak('sdpa-wasm-relaxed', 'c')] },
  { target: 'decode (d), (g) `sdpa()` ≥ 2× onnxruntime-web', unit: '×', atLeast: 2, bracket: true, parts: [vsOrt('sdpa-wasm', 'd'), vsOrt('sdpa-wasm', 'g')] },
  { target: 'causal (e), (f) ≥ 1.9× faster than not causal', unit: '×', atLeast: 1.9, parts: [causalSpeedup('e'), causalSpeedup('f')] },
  { target: '(c) two threads ≥ 1.7× one thread', unit: '×', atLeast: 1.7, parts: [twoThreadSpeedup('c')] },
  { target: 'cache (d), (f) float32 ≥ 2.5× onnxruntime-web', unit: '×', atLeast: 2.5, bracket: true, cache: true, parts: [cacheRatio('float32', 'ortBestMs')] },
  { target: 'cache (d), (f) float16 ≥ 4.5× onnxruntime-web', unit: '×', atLeast: 4.5, bracket: true, cache: true, parts: [cacheRatio('float16', 'ortBestMs')] },
  { target: 'cache (d), (f) float32 step ≤ 1.25× the read of its bytes', unit: '×', atMost: 1.25, bracket: true, cache: true, parts: [cacheRatio('float32')] },
  { target: 'cache (d), (f) float16 step ≤ 1.25× the read of its bytes', unit: '×', atMost: 1.25, bracket: true, cache: true, parts: [cacheRatio('float16')] },
  { target: 'cache float16 ≥ 1.7× faster than float32 at ≥ 8192 (MHA, GQA)', unit: '×', atLeast: 1.7, bracket: true, cache: true, parts: [float16Speedup] },
  { target: 'Chromium within 10% of Node, each build', unit: '', atMost: 1.1, chromium: true,
    parts: [chromium('rows'), chromium('decodeRows')], partNames: ['prefill and `sdpa()` decode', 'cache decode'] },
];

// --- counting and formatting --------------------------------------------------------------------
const isMet = (row, v, value = v.value) => (v.met !== undefined && value === v.value ? v.met
  : row.atLeast !== undefined ? value >= row.atLeast : value <= row.atMost);
const fmtValue = (unit, x) => (unit === '%' ? (100 * x).toFixed(0) : x.toFixed(2));
const fmtRange = (unit, xs) => {
  if (!xs.length) return 'not measured';
  const lo = fmtValue(unit, Math.min(...xs)), hi = fmtValue(unit, Math.max(...xs));
  return `${lo === hi ? lo : `${lo}–${hi}`}${unit}`;
};

/** A part's measured values over `someRuns`, each with its run. */
function valuesOf(row, part, someRuns) {
  return someRuns.filter((run) => !row.only || row.only(run))
    .flatMap((run) => part(run).map((v) => ({ ...v, run })))
    .filter((v) => v.value !== null && v.value !== undefined && Number.isFinite(v.value));
}

/** { range, met, of, oldRange, oldMet, runs } of one part of a row over `someRuns`. */
function countPart(row, part, someRuns) {
  const vs = valuesOf(row, part, someRuns);
  const olds = vs.filter((v) => v.old !== undefined && v.old !== null);
  return {
    values: vs, range: fmtRange(row.unit, vs.map((v) => v.value)), met: vs.filter((v) => isMet(row, v)).length, of: vs.length,
    runs: new Set(vs.map((v) => v.run)).size,
    oldRange: olds.length ? fmtRange(row.unit, olds.map((v) => v.old)) : null,
    oldMet: olds.length ? olds.filter((v) => isMet(row, v, v.old)).length : null,
  };
}

/** "13, 16 of 23 (13, 16)" from the parts' counts. */
function metText(row, counts) {
  const ofs = [...new Set(counts.map((c) => c.of))];
  const of = ofs.length === 1 ? ` of ${ofs[0]}` : '';
  const text = counts.map((c) => `${c.met}${of ? '' : ` of ${c.of}`}`).join(', ') + of;
  return row.bracket && counts.every((c) => c.oldMet !== null) ? `${text} (${counts.map((c) => c.oldMet).join(', ')})` : text;
}

/** The Chromium row's "met in": prefill runs with every shape met, the cache decode run by run. */
function chromiumMetText(row, someRuns) {
  const [prefill, cache] = row.parts.map((part) => someRuns.map((run) => {
    const vs = part(run);
    return vs.length ? { run, met: vs.filter((v) => v.met).length, of: vs.length } : null;
  }).filter(Boolean));
  const short = prefill.filter((r) => r.met < r.of);
  if (!prefill.length && !cache.length) return 'not measured';
  return `all shapes in ${prefill.length - short.length} of ${prefill.length} runs measured` +
    (short.length ? `; ${short.map((r) => `${r.met} of ${r.of} in ${r.run.file}`).join(', ')}` : '') +
    (cache.length ? `; cache decode ${cache.map((r) => `${r.met} of ${r.of}`).join(', ')}` : '');
}

function tableLine(row, someRuns) {
  const counts = row.parts.map((part) => countPart(row, part, someRuns));
  if (row.chromium) {
    const ranges = counts.map((c, i) => `${c.range} (${row.partNames[i]}${c.runs ? `, ${c.runs} runs` : ''})`).join('; ');
    return { counts, cells: [row.target, ranges, chromiumMetText(row, someRuns)] };
  }
  return { counts, cells: [row.target, counts.map((c) => c.range).join(', '), metText(row, counts)] };
}

// --- output -------------------------------------------------------------------------------------
const hostsOf = (someRuns) => [...new Set(someRuns.map((r) => r.host))];
console.log(`${runs.length} runs, ${runs[0]?.date.slice(0, 10)} to ${runs.at(-1)?.date.slice(0, 10)}: ` +
  hostsOf(runs).map((h) => `${runs.filter((r) => r.host === h).length} ${h}`).join(', '));
for (const run of runs) {
  console.log(`  ${run.date.slice(0, 16)}  ${run.host.padEnd(12)} ${run.file}` +
    `${run.decode ? '' : ', no decode section'}${relaxedRan(run) ? '' : ', no relaxed build'}${run.browser ? '' : ', no browser section'}`);
}
console.log('');
console.log('| target | range over the runs | met in |');
console.log('|---|---|---|');
const lines = ROWS.map((row) => ({ row, ...tableLine(row, runs) }));
for (const { cells } of lines) console.log(`| ${cells.join(' | ')} |`);

console.log('');
console.log('by the definitions used until 2026-12-03 (sdpa-wasm\'s faster call, with `out`; a cache\'s attend alone):');
for (const { row, counts } of lines.filter(({ counts }) => counts.some((c) => c.oldRange))) {
  console.log(`  ${row.target}: ${counts.map((c) => c.oldRange).join(', ')}; met ${metText({}, counts.map((c) => ({ ...c, met: c.oldMet })))}`);
}

if (byHost) {
  console.log('');
  console.log('per host (and, for the cache rows, the runs with the decode streams):');
  for (const { row } of lines) {
    console.log(`  ${row.target}`);
    const groups = hostsOf(runs).map((h) => [h, runs.filter((r) => r.host === h)]);
    if (row.cache) {
      groups.push(['all, decode streams', runs.filter((r) => r.withStreams)],
        ...hostsOf(runs).map((h) => [`${h}, decode streams`, runs.filter((r) => r.host === h && r.withStreams)]));
    }
    for (const [label, someRuns] of groups) {
      const counts = row.parts.map((part) => countPart(row, part, someRuns));
      if (counts.every((c) => !c.of)) continue;
      console.log(`    ${label.padEnd(24)} ${counts.map((c) => c.range).join(', ').padEnd(24)} met ${counts.map((c) => (c.of ? `${c.met} of ${c.of}` : '-')).join(', ')} (${Math.max(...counts.map((c) => c.runs))} runs)`);
    }
  }
}
