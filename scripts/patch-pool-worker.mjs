// Makes a threaded build's pool workers report a failed start, which Emscripten 3.1.6's glue
// lets pass in silence, so that js/loader.ts (poolFailure) rejects the load naming it instead
// of waiting for the worker forever (or, in Node, the process ending):
//   node scripts/patch-pool-worker.mjs BUILD.worker.js BUILD.mjs
// - BUILD.worker.js, on its 'load' message, imports the glue and runs its factory in a promise
//   chain with no catch: a glue that cannot be fetched or a factory that throws is an unhandled
//   rejection inside the worker, which fires no 'error' at the Worker object, and the worker
//   never posts 'loaded' (so the module's ready promise never settles). The chain gets a catch
//   that rethrows from a task: an uncaught error, which does fire 'error' at the Worker object
//   (a browser's, and a worker_threads one in Node).
// - BUILD.mjs, in a pool worker, instantiates the wasm through the worker script's
//   instantiateWasm; where that throws, the glue prints it and goes on as if loaded (the first
//   call would then wait for that thread forever). It rethrows, into the chain above. (The page's
//   own load never passes an instantiateWasm to the threaded build: js/loader.ts.)
// - BUILD.mjs, on the main thread, handles a pool worker's 'error' by printing it and throwing
//   it again: in Node (its worker_threads 'error' listener calls that handler) an uncaught
//   exception that ended the process. Before the worker has loaded, it only prints it: the
//   loader's own listener rejects the load (poolFailure); after, a running thread's error is
//   thrown as before.
// Each text is the one emcc 3.1.6 writes (minified; the relaxed builds' glue after
// scripts/minify-glue.mjs): one that is not found exactly once fails the build.
import { readFileSync, writeFileSync } from 'node:fs';

const [workerScript, glue] = process.argv.slice(2);
if (!workerScript || !glue) throw new Error('usage: node scripts/patch-pool-worker.mjs BUILD.worker.js BUILD.mjs');

const WORKER_LOADED = '.then(function(instance){Module=instance})';
const WORKER_REPORTS = `${WORKER_LOADED}.catch(function(error){setTimeout(function(){throw error})})`;
const GLUE_GOES_ON = 'catch(e){err("Module.instantiateWasm callback failed with error: "+e);return false}';
const GLUE_RETHROWS = 'catch(e){err("Module.instantiateWasm callback failed with error: "+e);throw e}';
const GLUE_THROWS_WORKER_ERRORS = 'err(message+" "+e.filename+":"+e.lineno+": "+e.message);throw e}';
const GLUE_THROWS_LOADED_WORKERS_ERRORS = 'err(message+" "+e.filename+":"+e.lineno+": "+e.message);if(worker.loaded)throw e}';

/** `file` with its one `from` replaced by `to` (a file already patched, holding `to`, is left as it is). */
function patch(file, from, to) {
  const text = readFileSync(file, 'utf8');
  const count = (s) => text.split(s).length - 1;
  if (count(to) === 1) return;
  if (count(from) !== 1) {
    throw new Error(`${file}: expected one ${JSON.stringify(from)}, found ${count(from)} (not emcc 3.1.6's output?)`);
  }
  writeFileSync(file, text.replace(from, to));
}

patch(workerScript, WORKER_LOADED, WORKER_REPORTS);
patch(glue, GLUE_GOES_ON, GLUE_RETHROWS);
patch(glue, GLUE_THROWS_WORKER_ERRORS, GLUE_THROWS_LOADED_WORKERS_ERRORS);
