// The worker behind createAttentionWorker(): a module Web Worker in browsers, a worker_threads
// Worker in Node. It owns one Attention instance and its KV caches and runs what the calling
// side (js/worker.ts) sends, a batch at a time, its requests in order (protocol:
// js/worker-protocol.ts). The calling side has already checked every argument with the direct
// API's own checks; the direct API checks again here, so a message that slipped through still
// gets its exact error.
import { createAttention, type Attention } from './attention.js';
import type { KVCache } from './kv-cache.js';
import { recalled, remember, type ForwardRecord } from './saved-forward.js';
import type { SdpaBackwardResult, SdpaResult } from './types.js';
import { errorToWire, READY, transferList, type Reply, type Request } from './worker-protocol.js';

interface Port {
  post(message: unknown, transfer?: ArrayBuffer[]): void;
  listen(handler: (batch: Request[]) => void): void;
}

const isNode = typeof process !== 'undefined' && typeof process.versions?.node === 'string';

async function openPort(): Promise<Port> {
  if (isNode) {
    const name = 'node:worker_threads';
    const { parentPort } = await import(/* @vite-ignore */ /* webpackIgnore: true */ name);
    if (parentPort === null) throw new Error('sdpa-wasm: worker-entry.js must run in a worker (createAttentionWorker starts it)');
    return {
      post: (message, transfer) => parentPort.postMessage(message, transfer),
      listen: (handler) => parentPort.on('message', handler),
    };
  }
  const scope = globalThis as unknown as {
    postMessage(message: unknown, transfer?: Transferable[]): void;
    addEventListener(type: 'message', listener: (event: MessageEvent<Request[]>) => void): void;
  };
  return {
    post: (message, transfer) => scope.postMessage(message, transfer ?? []),
    listen: (handler) => scope.addEventListener('message', (event) => handler(event.data)),
  };
}

let attention: Attention | null = null;
const caches = new Map<number, KVCache>();

function live(): Attention {
  if (attention === null) throw new Error('sdpa-wasm worker: no Attention instance (init failed or disposed)');
  return attention;
}

function cache(id: unknown): KVCache {
  const found = caches.get(id as number);
  if (found === undefined) throw new Error(`sdpa-wasm worker: no KV cache #${String(id)}`);
  return found;
}

/** A result and the buffers to transfer back with it (the output arrays are the worker's own). */
const withBuffers = (result: SdpaResult) =>
  ({ value: result, transfer: transferList([result.output.data, result.weights?.data, result.logSumExp?.data]) });

type Handled = { value: unknown; transfer?: ArrayBuffer[] };

/**
 * The record of the forward call that returned options.saved's logSumExp, sent back by the
 * calling side: kept for this copy of it, which the backward call then checks like the direct API.
 */
function keepSavedRecord(a: Record<string, unknown>): void {
  const savedLogSumExp = (a.options as { saved?: { logSumExp?: { data?: Float32Array } } } | undefined)?.saved?.logSumExp?.data;
  if (a.record !== undefined && savedLogSumExp !== undefined) remember(savedLogSumExp, a.record as ForwardRecord);
}

// Each op: its args → its value. Only init awaits.
async function handle({ op, args: a }: Request): Promise<Handled> {
  switch (op) {
    case 'init': {  // { options } → { threads, simd, isa }
      attention ??= await createAttention(a.options as object);
      return { value: { threads: attention.threads, simd: attention.simd, isa: attention.isa } };
    }
    case 'sdpa':
    case 'sdpaVarlen': {  // { query, key, value, options } → { result: SdpaResult, record: ForwardRecord | undefined }
      const attention = live();
      const result: SdpaResult = op === 'sdpa'
        ? attention.sdpa(a.query as never, a.key as never, a.value as never, a.options as never)
        : attention.sdpaVarlen(a.query as never, a.key as never, a.value as never, a.options as never);
      const { transfer } = withBuffers(result);
      // The record of a result with logSumExp (saved-forward.ts), for the calling side to keep.
      return { value: { result, record: recalled(result.logSumExp?.data) }, transfer };
    }
    case 'sdpaBackward':
    case 'sdpaVarlenBackward': {  // { query, key, value, gradOutput, options, record } → SdpaBackwardResult
      keepSavedRecord(a);
      const attention = live();
      const g: SdpaBackwardResult = op === 'sdpaBackward'
        ? attention.sdpaBackward(a.query as never, a.key as never, a.value as never, a.gradOutput as never, a.options as never)
        : attention.sdpaVarlenBackward(a.query as never, a.key as never, a.value as never, a.gradOutput as never, a.options as never);
      return { value: g, transfer: transferList([g.dQuery.data, g.dKey.data, g.dValue.data, g.dAttnMask?.data, g.dSinks?.data]) };
    }
    case 'createKVCache': {  // { cache: id, options } → null
      caches.set(a.cache as number, live().createKVCache(a.options as never));
      return { value: null };
    }
    case 'append': {  // { cache, key, value, options } → { length }
      const target = cache(a.cache);
      target.append(a.key as never, a.value as never, a.options as never);
      return { value: { length: target.length } };
    }
    case 'attend':  // { cache, query, options } → SdpaResult
      return withBuffers(cache(a.cache).attend(a.query as never, a.options as never));
    case 'truncate': {  // { cache, n } → { length }
      const target = cache(a.cache);
      target.truncate(a.n as number);
      return { value: { length: target.length } };
    }
    case 'remove': {  // { cache, start, end } → { length }
      const target = cache(a.cache);
      target.remove(a.start as number, a.end as number);
      return { value: { length: target.length } };
    }
    case 'read': {  // { cache, start, end, options } → KVCacheContents
      const contents = cache(a.cache).read(a.start as number | undefined, a.end as number | undefined, a.options as never);
      return { value: contents, transfer: transferList([contents.key.data, contents.value.data]) };
    }
    case 'reorder': {  // { cache, indices } → { length }
      const target = cache(a.cache);
      target.reorder(a.indices as Int32Array);
      return { value: { length: target.length } };
    }
    case 'reset':  // { cache } → { length: 0 }
      cache(a.cache).reset();
      return { value: { length: 0 } };
    case 'disposeCache':  // { cache } → null
      caches.get(a.cache as number)?.dispose();
      caches.delete(a.cache as number);
      return { value: null };
    case 'memory':  // {} → MemoryInfo
      return { value: live().memory() };
    case 'dispose':  // {} → null; the calling side then ends the worker
      attention?.dispose();
      attention = null;
      caches.clear();
      return { value: null };
    default:
      throw new Error(`sdpa-wasm worker: unknown op ${String(op)}`);
  }
}

// No top-level await: bundlers build workers as classic scripts by default (Vite: iife).
openPort().then((port) => {
  let previous: Promise<void> = Promise.resolve();
  port.listen((batch) => {
    // A batch at a time, each request answered as soon as it is done; chaining keeps the order
    // even if a batch ever came before the last was answered.
    for (const request of batch) {
      previous = previous.then(async () => {
        let reply: Reply, transfer: ArrayBuffer[] | undefined;
        try {
          const handled = await handle(request);
          reply = { id: request.id, ok: true, value: handled.value };
          transfer = handled.transfer;
        } catch (error) {
          reply = { id: request.id, ok: false, error: errorToWire(error) };
        }
        port.post(reply, transfer);
      });
    }
  });
  port.post(READY);
});
