#!/usr/bin/env node
// A small static file server for the demo page and the browser tests (no dependencies).
//
//   node scripts/serve.mjs [--port 8080] [--host 127.0.0.1] [--root DIR] [--no-isolation] [--cdn] [--csp POLICY]
//
// Serves DIR (default: the repository root, so /web/, /dist/ and /tests/ are all reachable)
// with the headers that make a page cross-origin isolated, which browsers require before they
// hand out SharedArrayBuffer (and so before a threaded WebAssembly build can run):
//   Cross-Origin-Opener-Policy: same-origin
//   Cross-Origin-Embedder-Policy: require-corp
//   Cross-Origin-Resource-Policy: same-origin
// --no-isolation leaves those three headers out (the page is then not cross-origin isolated),
// to check the single-thread path. --port 0 picks a free port. "/" redirects to /web/ when
// the root has a web/ folder. Prints the URL once it listens.
// --cdn serves as a CDN does, for pages of other origins: every response readable from any
// origin (Access-Control-Allow-Origin: *) and embeddable by cross-origin isolated pages
// (Cross-Origin-Resource-Policy: cross-origin), to check the package loaded from elsewhere.
// --csp POLICY sends Content-Security-Policy: POLICY with every response.
import { createServer } from 'node:http';
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { extname, join, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const MIME = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.cjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json; charset=utf-8',
  '.map': 'application/json; charset=utf-8',
  '.wasm': 'application/wasm',
  '.bin': 'application/octet-stream',
  '.png': 'image/png',
  '.jpg': 'image/jpeg',
  '.svg': 'image/svg+xml',
  '.ico': 'image/x-icon',
  '.txt': 'text/plain; charset=utf-8',
  '.md': 'text/markdown; charset=utf-8',
  '.ts': 'text/plain; charset=utf-8',
};

function usage(message) {
  if (message) console.error(`serve: ${message}`);
  console.error('usage: node scripts/serve.mjs [--port N] [--host H] [--root DIR] [--no-isolation] [--cdn] [--csp POLICY]');
  process.exit(2);
}

function parseArgs(argv) {
  const opts = {
    port: Number(process.env.PORT ?? 8080),
    host: '127.0.0.1',
    root: fileURLToPath(new URL('..', import.meta.url)),
    isolation: true,
    cdn: false,
    csp: null,
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const [name, inline] = arg.startsWith('--') && arg.includes('=') ? arg.split(/=(.*)/s, 2) : [arg, undefined];
    const value = () => {
      const v = inline ?? argv[++i];
      if (v === undefined) usage(`${name} needs a value`);
      return v;
    };
    switch (name) {
      case '--port': case '-p': opts.port = Number(value()); break;
      case '--host': opts.host = value(); break;
      case '--root': opts.root = resolve(value()); break;
      case '--no-isolation': opts.isolation = false; break;
      case '--cdn': opts.cdn = true; break;
      case '--csp': opts.csp = value(); break;
      case '--help': case '-h': usage(); break;
      default: usage(`unknown argument ${arg}`);
    }
  }
  if (!Number.isInteger(opts.port) || opts.port < 0 || opts.port > 65535) usage(`bad port ${opts.port}`);
  return opts;
}

const opts = parseArgs(process.argv.slice(2));
const root = resolve(opts.root);

function headers(extra) {
  const h = { 'Cache-Control': 'no-store', 'X-Content-Type-Options': 'nosniff', ...extra };
  if (opts.isolation) {
    h['Cross-Origin-Opener-Policy'] = 'same-origin';
    h['Cross-Origin-Embedder-Policy'] = 'require-corp';
    h['Cross-Origin-Resource-Policy'] = 'same-origin';
  }
  if (opts.cdn) {
    h['Access-Control-Allow-Origin'] = '*';
    h['Cross-Origin-Resource-Policy'] = 'cross-origin';
  }
  if (opts.csp !== null) h['Content-Security-Policy'] = opts.csp;
  return h;
}

function send(res, status, text, extra = {}) {
  res.writeHead(status, headers({ 'Content-Type': 'text/plain; charset=utf-8', ...extra }));
  res.end(text);
}

async function handle(req, res) {
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    send(res, 405, 'method not allowed\n', { Allow: 'GET, HEAD' });
    return;
  }
  let pathname;
  try {
    pathname = decodeURIComponent(new URL(req.url, 'http://localhost').pathname);
  } catch {
    send(res, 400, 'bad request\n');
    return;
  }
  if (pathname.includes('\0')) {
    send(res, 400, 'bad request\n');
    return;
  }
  if (pathname === '/') {
    const web = await stat(join(root, 'web', 'index.html')).catch(() => null);
    if (web?.isFile()) {
      res.writeHead(302, headers({ Location: '/web/' }));
      res.end();
      return;
    }
  }
  let file = resolve(root, `.${pathname}`);
  if (file !== root && !file.startsWith(root + sep)) {
    send(res, 403, 'forbidden\n');
    return;
  }
  let info = await stat(file).catch(() => null);
  if (info?.isDirectory()) {
    if (!pathname.endsWith('/')) {
      res.writeHead(301, headers({ Location: `${pathname}/` }));
      res.end();
      return;
    }
    file = join(file, 'index.html');
    info = await stat(file).catch(() => null);
  }
  if (!info?.isFile()) {
    send(res, 404, `not found: ${pathname}\n`);
    return;
  }
  res.writeHead(200, headers({
    'Content-Type': MIME[extname(file).toLowerCase()] ?? 'application/octet-stream',
    'Content-Length': info.size,
  }));
  if (req.method === 'HEAD') {
    res.end();
    return;
  }
  createReadStream(file).on('error', () => res.destroy()).pipe(res);
}

const server = createServer((req, res) => {
  handle(req, res).catch((error) => {
    if (!res.headersSent) send(res, 500, `${error}\n`);
    else res.destroy();
  });
});

server.on('error', (error) => {
  console.error(error.code === 'EADDRINUSE'
    ? `serve: port ${opts.port} is already in use; pick another with --port N (or --port 0 for any free port)`
    : `serve: ${error.message}`);
  process.exit(1);
});

server.listen(opts.port, opts.host, () => {
  const { port } = server.address();
  const host = opts.host.includes(':') ? `[${opts.host}]` : opts.host;
  const base = `http://${host}:${port}`;
  stat(join(root, 'web', 'index.html')).then((s) => s.isFile(), () => false).then((hasDemo) => {
    console.log(`Open ${base}${hasDemo ? '/web/' : '/'}   (Ctrl+C to stop)`);
  });
  console.log(`Serving ${root} at ${base}/ ` +
    (opts.isolation ? '(cross-origin isolated: COOP/COEP/CORP headers set)' : '(no isolation headers)'));
});

for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => {
    server.close(() => process.exit(0));
    server.closeAllConnections();
  });
}
