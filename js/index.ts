// sdpa-wasm: scaled dot-product attention in WebAssembly SIMD.
//
//   const attn = await createAttention();
//   const { output } = attn.sdpa(query, key, value, { isCausal: true });
//   attn.dispose();
//
// query [B, Hq, Lq, E], key [B, Hkv, Lk, E], value [B, Hkv, Lk, Ev] → output [B, Hq, Lq, Ev]
// (rank 3 and 2 drop leading axes of 1; layout 'bshd' swaps H and L). Hq % Hkv == 0.
// Sequences of different lengths packed back to back, without padding (FlashAttention's varlen):
//   attn.sdpaVarlen(query [Tq, Hq, E], key [Tk, Hkv, E], value [Tk, Hkv, Ev], { cuSeqlensQ, isCausal: true })
//
// Off the calling thread, with promises (a Web Worker, or worker_threads in Node):
//   const worker = await createAttentionWorker();
//   const { output } = await worker.sdpa(query, key, value, { isCausal: true, transfer: true });
//   await worker.dispose();
// The public classes are disposable (Symbol.dispose, Symbol.asyncDispose): their types need
// this library whatever the user's `lib` setting.
/// <reference lib="esnext.disposable" preserve="true" />
export { Attention, createAttention, DEFAULT_MAX_THREADS, MAX_THREADS } from './attention.js';
export { KVCache, KVCacheShapeInfo, type KVCacheDType, type KVCacheShape } from './kv-cache.js';
export {
  AttentionWorker, createAttentionWorker, WorkerKVCache, type WorkerCallOptions, type WorkerSdpaOptions,
} from './worker.js';
export type { Isa } from './loader.js';
export type {
  AttentionOptions, AttentionWorkerOptions, Float16ArrayType, InputTensor, KVAppendOptions, KVCacheContents, KVCacheOptions, KVReadOptions, KVTensor, MaskTensor, MemoryInfo, SdpaBackwardOptions, SdpaBackwardOut, SdpaBackwardResult,
  SdpaBackwardResultWithMaskGrad, SdpaBackwardResultWithSinkGrad, SdpaOptions, SdpaResult, SdpaResultWith,
  SdpaVarlenBackwardOptions, SdpaVarlenBackwardResult, SdpaVarlenOptions, SdpaVarlenResult, SdpaVarlenResultWithLogSumExp, Tensor,
} from './types.js';
