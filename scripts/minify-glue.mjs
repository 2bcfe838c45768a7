// Minifies the JS glue of a relaxed-SIMD build in place, as emcc's -O2 link does the portable
// builds': Emscripten's own acorn-optimizer.js with the passes emcc runs there, JSDCE (unused
// top-level functions and variables dropped) and minifyWhitespace.
//   node scripts/minify-glue.mjs EMSCRIPTEN_ROOT FILE.mjs
// The relaxed builds are linked at -O1 (CMakeLists.txt says why), where emcc leaves the glue
// as written: 112–121 kB instead of 50–84 kB.
//
// The optimizer runs on the module's body, what -sMODULARIZE wraps in
//   var createSdpaModule = (() => { …; return (function(createSdpaModule) {
//     createSdpaModule = createSdpaModule || {};  BODY  return createSdpaModule.ready }); })();
// (the wrapper, the --extern-pre-js before it and the `export default` after are kept as they
// are), with `import.meta` replaced by an identifier while it runs, as emcc does: the
// optimizer's printer (terser 3.14) cannot print it. It needs NODE_PATH=/usr/share/nodejs, as
// every emcc call here does (scripts/build.sh), to find acorn.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [emscriptenRoot, file] = process.argv.slice(2);
if (!emscriptenRoot || !file) throw new Error('usage: node scripts/minify-glue.mjs EMSCRIPTEN_ROOT FILE.mjs');

const BODY_START = 'createSdpaModule = createSdpaModule || {};\n';
const BODY_END = '\n  return createSdpaModule.ready\n}';
const IMPORT_META = 'import.meta';
const PLACEHOLDER = 'SDPA$IMPORT$META';

const text = readFileSync(file, 'utf8');
const begin = text.indexOf(BODY_START), end = text.lastIndexOf(BODY_END);
if (begin < 0 || end < begin) throw new Error(`${file}: not an emcc -sMODULARIZE module (no body between its wrapper lines)`);
const body = text.slice(begin + BODY_START.length, end);
if (body.includes(PLACEHOLDER)) throw new Error(`${file}: already holds ${PLACEHOLDER}`);

const dir = mkdtempSync(join(tmpdir(), 'sdpa-minify-'));
try {
  const input = join(dir, 'body.js');
  writeFileSync(input, body.replaceAll(IMPORT_META, PLACEHOLDER));
  const minified = execFileSync(process.execPath,
    [join(emscriptenRoot, 'tools', 'acorn-optimizer.js'), input, 'JSDCE', 'minifyWhitespace'],
    { encoding: 'utf8', maxBuffer: 64 * 2 ** 20, env: { ...process.env, NODE_PATH: process.env.NODE_PATH ?? '/usr/share/nodejs' } });
  if (minified.trim() === '') throw new Error(`${file}: the optimizer printed nothing`);
  const out = `${text.slice(0, begin + BODY_START.length)}\n${minified.replaceAll(PLACEHOLDER, IMPORT_META)}${text.slice(end)}`;
  writeFileSync(file, out);
  process.stderr.write(`minify-glue: ${file}: ${text.length} → ${out.length} bytes\n`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
