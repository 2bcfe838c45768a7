// The messages between an AttentionWorker (the calling side, js/worker.ts) and its worker
// (js/worker-entry.ts). The calling side sends the calls waiting in its queue as one batch, and
// the next batch only after the worker has answered every request of this one, so the worker
// never holds a queue and a call that has not been sent can still be cancelled.
//
//   worker → caller   READY                                once it listens
//   caller → worker   [{ id, op, args }, ...]              a batch of Requests (typed arrays transferred)
//   worker → caller   { id, ok: true, value }              one reply per request, in order
//                     { id, ok: false, error: { name, message } }      (output buffers transferred)
//
// Errors cross as name + message and are rebuilt as the same class on the calling side.
import { bufferOf, byteLengthOf, isArrayBuffer, viewTag } from './typed-arrays.js';

/** What the worker can do; each op's args and value are documented where it is handled. */
export type Op =
  | 'init' | 'sdpa' | 'sdpaBackward' | 'sdpaVarlen' | 'sdpaVarlenBackward' | 'createKVCache' | 'append' | 'attend' | 'truncate' | 'remove' | 'read' | 'reorder' | 'reset' | 'disposeCache' | 'memory'
  | 'dispose';

export interface Request {
  id: number;
  op: Op;
  args: Record<string, unknown>;
}

export interface WireError {
  name: string;
  message: string;
}

export type Reply =
  | { id: number; ok: true; value: unknown }
  | { id: number; ok: false; error: WireError };

/** The worker's first message: it is listening. */
export const READY = 'sdpa-wasm:worker-ready';

export function errorToWire(error: unknown): WireError {
  if (error instanceof Error) return { name: error.name, message: error.message };
  return { name: 'Error', message: String(error) };
}

/** The same class as in the worker for the classes the API throws; Error otherwise. */
export function errorFromWire({ name, message }: WireError): Error {
  const Class = name === 'TypeError' ? TypeError : name === 'RangeError' ? RangeError : Error;
  const error = new Class(message);
  if (Class === Error && name !== 'Error') error.name = name;
  return error;
}

/** The distinct ArrayBuffers (not SharedArrayBuffers, not detached or empty ones) under the typed arrays in `views`. */
export function transferList(views: Iterable<unknown>): ArrayBuffer[] {
  const buffers = new Set<ArrayBuffer>();
  for (const view of views) {
    if (viewTag(view) === undefined) continue;
    const buffer = bufferOf(view as ArrayBufferView);
    if (isArrayBuffer(buffer) && byteLengthOf(buffer) > 0) buffers.add(buffer);
  }
  return [...buffers];
}
