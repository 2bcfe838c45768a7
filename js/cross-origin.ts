// Workers from a package served from another origin (a CDN, or an import map pointing at
// another host). A browser starts a Worker only from a script of the page's own origin (or a
// blob: URL the page made), so a worker script elsewhere is started through a one-line script
// made here, on this origin, that loads it:
//   module worker (createAttentionWorker):      import("<url>"), a failure rethrown uncaught
//   classic worker (the threaded build's pool): importScripts("<url>");
// The module loader imports dynamically: WebKit (WebKitGTK 2.50, as Safari's engine) fails a
// static `import "<url>"` of another origin in a blob: module worker on a cross-origin isolated
// page (an error event with no message), where `import()` of the same URL loads
// (tests/engines/webkit.test.mjs). Rethrown from a task, a failed import is an uncaught error,
// so the page's Worker still gets its error event (with the reason). The worker posts READY
// once its module has run, and the calling side sends nothing before that, so no message can
// arrive before the worker listens.
// The loaded script keeps its own URL (its import.meta.url, its relative imports), so the glue
// and the .wasm files are still found next to it. The other origin must allow the loads: CORS
// headers (module scripts are always fetched with CORS), and on a cross-origin isolated page
// Cross-Origin-Resource-Policy: cross-origin (or CORS). A page's Content-Security-Policy must
// allow that origin in script-src (the modules), connect-src (the .wasm fetch) and worker-src,
// with blob: there too (the loaders and the scripts they load are worker scripts): README,
// "Bundlers and plain pages". From the page's own origin, and in Node, nothing changes: the
// worker starts from the script's URL itself.

/** Whether a worker can start from `url` as it is: same origin as this realm, or not a browser. */
export function startsAsIs(url: URL): boolean {
  const here = (globalThis as { location?: { origin?: string } }).location?.origin;
  // Node has no location; a blob: or data: URL is the realm's own.
  return typeof here !== 'string' || url.protocol === 'blob:' || url.protocol === 'data:' || url.origin === here;
}

/** The loaders made so far, by kind and URL: one blob each, kept for the realm's life (a few bytes). */
const loaders = new Map<string, string>();

/**
 * A blob: URL of this origin whose script loads the worker script at `url`: an ES module for a
 * module worker, a classic script for a classic one. The URL string is the only thing in it,
 * written as a JSON string literal.
 */
export function loaderScriptUrl(url: URL, kind: 'module' | 'classic'): string {
  const key = `${kind} ${url.href}`;
  let loader = loaders.get(key);
  if (loader === undefined) {
    const href = JSON.stringify(url.href);
    const source = kind === 'module'
      ? `import(${href}).catch((error) => setTimeout(() => { throw error; }));\n`
      : `importScripts(${href});\n`;
    loader = URL.createObjectURL(new Blob([source], { type: 'text/javascript' }));
    loaders.set(key, loader);
  }
  return loader;
}
