// With a lib that declares Float16Array (tsconfig.float16.json): a KV cache's appends take one,
// directly and through the worker; the arrays the package gives back stay what they were.
// Compiled, never run; each `@ts-expect-error` line must be an error.
import { KVCache, WorkerKVCache, type Float16ArrayType, type KVCacheContents, type KVTensor } from 'sdpa-wasm';

export function float16TypeChecks(cache: KVCache, workerCache: WorkerKVCache): void {
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
