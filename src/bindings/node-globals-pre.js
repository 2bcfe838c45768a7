// Prepended (--extern-pre-js) to the threaded build's ES module. Emscripten's Node code
// path expects the CommonJS globals `require`, `__filename` and `__dirname`, which an ES
// module does not have. On Node's main thread, js/loader.ts provides them (from
// import.meta.url) under a registry symbol before it imports this module; in a pthread
// worker, the generated sdpa-mt.worker.js has already put `require` on the global object.
// Browsers skip all of this. No top-level await and no import of node: modules here, so
// bundlers can put this file in a classic worker.
var require, __filename, __dirname;
if (typeof process === 'object' && typeof process.versions === 'object' &&
    typeof process.versions.node === 'string') {
  if (typeof importScripts === 'function') {
    require = globalThis.require;
  } else {
    var sdpaNodeGlobals = globalThis[Symbol.for('sdpa-wasm/node-globals')];
    if (sdpaNodeGlobals === undefined) {
      throw new Error('sdpa-mt.mjs is loaded by sdpa-wasm\'s createAttention(), not imported directly');
    }
    require = sdpaNodeGlobals.require;
    __filename = sdpaNodeGlobals.filename;
    __dirname = sdpaNodeGlobals.dirname;
  }
}
