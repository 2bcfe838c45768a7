// Workers from a package served from another origin (a CDN, or an import map pointing at
// another host). A browser starts a Worker only from a script of the page's own origin (or a
// blob: URL the page made), so a worker script elsewhere is started through a one-line script
// made here, on this origin, that loads it:
//   module worker (createAttentionWorker):      import "<url>";
//   classic worker (the threaded build's pool): importScripts("<url>");
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
    const source = kind === 'module' ? `import ${JSON.stringify(url.href)};\n` : `importScripts(${JSON.stringify(url.href)});\n`;
    loader = URL.createObjectURL(new Blob([source], { type: 'text/javascript' }));
    loaders.set(key, loader);
  }
  return loader;
}
