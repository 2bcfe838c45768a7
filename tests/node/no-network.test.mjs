// The package never touches the network and never evaluates data as code (the README's
// "Robustness" section), in Node:
//   - every build and the worker load and compute with fetch replaced by a function that fails
//     the test (Node reads the .wasm files from disk);
//   - the shipped JavaScript (dist/, the Emscripten glue included) contains no eval, no Function
//     constructor, no WebSocket, sendBeacon or node:http/https/net; its only fetch() calls are
//     the glue's fetch of its own .wasm file, its only XMLHttpRequests the glue's file readers.
// The browser side (a no-eval Content-Security-Policy; every request recorded) is
// tests/browser/security.spec.mjs.
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createAttention, createAttentionWorker } from 'sdpa-wasm';
import { randomTensor } from './reference.mjs';

const DIST = fileURLToPath(new URL('../../dist/', import.meta.url));

async function scripts(dir) {
  const found = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) found.push(...await scripts(path));
    else if (/\.(m?js)$/.test(entry.name)) found.push(path);
  }
  return found;
}

test('every build and the worker run with fetch disabled', async () => {
  const realFetch = globalThis.fetch;
  const fetched = [];
  globalThis.fetch = (url) => {
    fetched.push(String(url));
    return Promise.reject(new Error('network access'));
  };
  try {
    const q = randomTensor([1, 2, 3, 8], 1), k = randomTensor([1, 2, 5, 8], 2), v = randomTensor([1, 2, 5, 8], 3);
    for (const relaxedSimd of [true, false]) {
      for (const threads of [1, 2]) {
        const attn = await createAttention({ threads, relaxedSimd });
        expect(attn.sdpa(q, k, v).output.data.every(Number.isFinite)).toBe(true);
        attn.dispose();
      }
    }
    const worker = await createAttentionWorker({ threads: 1 });
    expect((await worker.sdpa(q, k, v)).output.data.every(Number.isFinite)).toBe(true);
    await worker.dispose();
  } finally {
    globalThis.fetch = realFetch;
  }
  expect(fetched).toEqual([]);
});

test('the shipped JavaScript has no eval, no Function constructor and no network API but the glue\'s own .wasm fetch', async () => {
  const files = await scripts(DIST);
  expect(files.length).toBeGreaterThan(10);
  const forbidden = [
    [/(^|[^\w.$])eval\s*\(/, 'eval('],
    [/new\s+Function\s*\(/, 'new Function('],
    [/(^|[^\w.$])Function\s*\(\s*['"`]/, 'Function(string)'],
    [/WebSocket/, 'WebSocket'],
    [/sendBeacon/, 'sendBeacon'],
    [/['"](node:)?(http|https|net|tls|dgram)['"]/, 'a Node network module'],
  ];
  const findings = [];
  for (const file of files) {
    const text = await readFile(file, 'utf8');
    for (const [pattern, what] of forbidden) if (pattern.test(text)) findings.push(`${file}: ${what}`);
    for (const call of text.match(/fetch\s*\([^)]*\)/g) ?? []) {
      if (!/^fetch\s*\(\s*wasmBinaryFile\s*,/.test(call)) findings.push(`${file}: ${call}`);
    }
    // The Emscripten glue's synchronous file readers (read_, readBinary: GET of a URL it was
    // given, its own .wasm, where fetch is unavailable) are the only XMLHttpRequest use.
    for (const use of text.match(/XMLHttpRequest[\s\S]{0,60}/g) ?? []) {
      if (!/^XMLHttpRequest(\(\))?;?\s*xhr\.open\(\s*["']GET["']\s*,\s*url\s*,/.test(use)) findings.push(`${file}: ${use}`);
    }
  }
  expect(findings).toEqual([]);
});
