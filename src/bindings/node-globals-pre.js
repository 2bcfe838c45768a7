// Prepended (--extern-pre-js) to the threaded build's ES module. Emscripten's Node code
// path expects the CommonJS globals `require`, `__filename` and `__dirname`, which an ES
// module does not have: define them from import.meta.url on Node's main thread. In a
// pthread worker, the generated sdpa-mt.worker.js has already put `require` on the global
// object. Browsers skip all of this (the module names are hidden from bundlers).
var require, __filename, __dirname;
if (typeof process === 'object' && typeof process.versions === 'object' &&
    typeof process.versions.node === 'string') {
  if (typeof importScripts === 'function') {
    require = globalThis.require;
  } else {
    const [nodeModule, nodeUrl, nodePath] = ['node:module', 'node:url', 'node:path'];
    require = (await import(/* @vite-ignore */ nodeModule)).createRequire(import.meta.url);
    __filename = (await import(/* @vite-ignore */ nodeUrl)).fileURLToPath(import.meta.url);
    __dirname = (await import(/* @vite-ignore */ nodePath)).dirname(__filename);
  }
}
