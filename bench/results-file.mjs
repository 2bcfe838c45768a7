// The benchmark's results file (bench/results/latest.json, or --json PATH): each section run
// alone merges its results into it under its own key, keeping what the other sections wrote.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** bench/results/latest.json. */
export const DEFAULT_RESULTS_PATH = fileURLToPath(new URL('./results/latest.json', import.meta.url));

/** JSON.stringify's replacer for the results: Infinity and NaN written as strings, not null. */
export const keepNonFinite = (key, value) => (typeof value === 'number' && !Number.isFinite(value) ? String(value) : value);

/**
 * Writes `result` into the results file at `jsonPath` under `key` (an unreadable file starts
 * afresh), and the host's description at the top level if the file has none yet.
 */
export function writeSection(jsonPath, key, result) {
  let json = {};
  if (existsSync(jsonPath)) {
    try { json = JSON.parse(readFileSync(jsonPath, 'utf8')); } catch { json = {}; }
  }
  json[key] = result;
  if (result?.host !== undefined) json.host ??= result.host;
  mkdirSync(dirname(jsonPath), { recursive: true });
  writeFileSync(jsonPath, JSON.stringify(json, keepNonFinite, 2));
  console.log(`results: ${jsonPath} (key "${key}")`);
}

/**
 * A section's own file run as a script (`node bench/<section>.mjs [--quick] [--json PATH] ...`;
 * `moduleUrl` its import.meta.url; nothing when it is imported, as bench.mjs does): `run(has)`
 * (has('--quick') tells a flag) and its results merged into the results file under `key`. A
 * failure is printed and exits with 1.
 */
export async function runStandalone(moduleUrl, key, run) {
  if (!process.argv[1] || resolve(process.argv[1]) !== fileURLToPath(moduleUrl)) return;
  const argv = process.argv.slice(2);
  const given = argv.includes('--json') ? argv[argv.indexOf('--json') + 1] : undefined;
  const jsonPath = given !== undefined ? resolve(given) : DEFAULT_RESULTS_PATH;
  let result;
  try {
    result = await run((flag) => argv.includes(flag));
  } catch (e) {
    console.log(`${key} section FAILED: ${String(e?.message ?? e).replace(/\s+/g, ' ').slice(0, 400)}`);
    process.exit(1);
  }
  writeSection(jsonPath, key, result);
}
