// With a lib that declares Float16Array (tsconfig.float16.json): a KV cache's appends take one,
// directly and through the worker; the arrays the package gives back stay what they were.
// Compiled, never run; each `@ts-expect-error` line must be an error.
import {
  Attention, AttentionWorker, KVCache, WorkerKVCache, type Float16ArrayType, type InputTensor, type KVCacheContents, type KVTensor,
} from 'sdpa-wasm';

export function float16TypeChecks(attn: Attention, worker: AttentionWorker, cache: KVCache, workerCache: WorkerKVCache): void {
  // Inputs (query, key, value, gradOutput, a float mask) take Float16Array data; results stay Float32Array.
  const q: InputTensor = { data: new Float16Array(16), dims: [1, 2, 8] };
  const output: Float32Array = attn.sdpa(q, q, q, { attnMask: { data: new Float16Array(4), dims: [2, 2] } }).output.data;
  const dQuery: Float32Array = attn.sdpaBackward(q, q, q, q).dQuery.data;
  void worker.sdpa(q, q, q, { transfer: true }).then((r) => r.output.data satisfies Float32Array);
  void cache.attend(q).output.data;
  void output, dQuery;
  // @ts-expect-error options.sinks stays a Float32Array
  attn.sdpa(q, q, q, { sinks: new Float16Array(2) });

  const halves: Float16ArrayType = new Float16Array(8);
  const key: KVTensor = { data: halves, dims: [1, 1, 1, 8] };
  cache.append(key, { data: new Float16Array(8), dims: [1, 1, 1, 8] });
  void workerCache.append(key, key, { transfer: true });
  const held: KVCacheContents = cache.read(0, 1);
  const stored: Float32Array | Uint16Array = held.key.data;  // read() gives no Float16Array
  void stored;
  // @ts-expect-error a Float64Array is not taken
  cache.append({ data: new Float64Array(8), dims: [1, 1, 1, 8] }, key);
}
