// What the package's types accept and refuse, checked by compiling (never run): each
// `@ts-expect-error` line must be an error, or tsc fails with "Unused '@ts-expect-error'".
import {
  Attention, AttentionWorker, KVCache, WorkerKVCache, type KVCacheContents, type SdpaBackwardOut, type SdpaOptions, type SdpaResult, type Tensor,
} from 'sdpa-wasm';

export function typeChecks(attn: Attention, worker: AttentionWorker, cache: KVCache, q: Tensor, k: Tensor, v: Tensor): void {
  // Results: `weights` / `logSumExp` present exactly when requested with a literal `true`.
  const plain: SdpaResult = attn.sdpa(q, k, v, { isCausal: true });
  // @ts-expect-error weights may be absent when not requested
  plain.weights.data;
  const withWeights: Float32Array = attn.sdpa(q, k, v, { returnWeights: true }).weights.data;
  const withLse: Float32Array = attn.sdpa(q, k, v, { returnLogSumExp: true }).logSumExp.data;
  const both = attn.sdpa(q, k, v, { returnWeights: true, returnLogSumExp: true, layout: 'bshd' });
  const fromCache: Float32Array = cache.attend(q, { returnWeights: true }).weights.data;
  // A cache's stored positions, as append() takes them (KVCacheContents).
  const held: KVCacheContents = cache.read(0, cache.length, { layout: 'bshd' });
  const widened: KVCacheContents = cache.read(0, cache.length, { dtype: 'float32' });
  const raw: KVCacheContents = cache.read(0, 1, { dtype: 'bfloat16' });
  // @ts-expect-error dtype is 'float32', 'float16' or 'bfloat16'
  cache.read(0, 1, { dtype: 'int8' });
  cache.append(held.key, held.value, { layout: 'bshd' });
  const options: SdpaOptions = { returnWeights: true };
  // @ts-expect-error a non-literal SdpaOptions may not have asked for weights
  attn.sdpa(q, k, v, options).weights.data;
  void worker.sdpa(q, k, v, { returnWeights: true, transfer: true }).then((r) => r.weights.data);
  void worker.sdpa(q, k, v, { returnLogSumExp: true }).then((r) => r.logSumExp.dims);
  attn.sdpaBackward(q, k, v, q, { saved: { output: both.output, logSumExp: both.logSumExp } });
  // `dAttnMask` present exactly when requested with a literal `true`.
  const bias: Tensor = { data: new Float32Array(4), dims: [4] };
  const dBias: Float32Array = attn.sdpaBackward(q, k, v, q, { attnMask: bias, returnMaskGrad: true }).dAttnMask.data;
  void worker.sdpaBackward(q, k, v, q, { attnMask: bias, returnMaskGrad: true }).then((g) => g.dAttnMask.dims);
  // @ts-expect-error dAttnMask may be absent when not requested
  attn.sdpaBackward(q, k, v, q, { attnMask: bias }).dAttnMask.data;
  // `dSinks` present whenever sinks are given (with or without the mask's gradient).
  const sinks = Float32Array.of(0.5, -Infinity);
  const dSinks: Float32Array = attn.sdpaBackward(q, k, v, q, { sinks }).dSinks.data;
  const both2 = attn.sdpaBackward(q, k, v, q, { sinks, attnMask: bias, returnMaskGrad: true });
  void [both2.dSinks.dims, both2.dAttnMask.dims];
  void worker.sdpaBackward(q, k, v, q, { sinks }).then((g) => g.dSinks.data);
  // @ts-expect-error dSinks may be absent without sinks
  attn.sdpaBackward(q, k, v, q, { isCausal: true }).dSinks.data;
  cache.attend(q, { sinks, slidingWindow: 128 });
  // @ts-expect-error sinks is a Float32Array
  attn.sdpa(q, k, v, { sinks: [0.5, 1] });
  // ALiBi slopes: [Hq] or [B, Hq], with or without isCausal (then causalOffset moves the distances).
  const alibiSlopes = Float32Array.of(0.5, 0.25);
  attn.sdpa(q, k, v, { alibiSlopes, causalOffset: 3 });
  cache.attend(q, { alibiSlopes });
  attn.sdpaBackward(q, k, v, q, { alibiSlopes, isCausal: true });
  // @ts-expect-error alibiSlopes is a Float32Array
  attn.sdpa(q, k, v, { alibiSlopes: [0.5, 0.25] });
  // Dropout for training: a probability and a seed, the same two for the backward.
  const dropout = { dropoutP: 0.1, dropoutSeed: 42 };
  attn.sdpa(q, k, v, { ...dropout, isCausal: true });
  attn.sdpaBackward(q, k, v, q, { ...dropout, isCausal: true });
  void worker.sdpaVarlen(q, k, v, { cuSeqlensQ: Int32Array.of(0, 8), ...dropout });
  // @ts-expect-error dropoutSeed is a number
  attn.sdpa(q, k, v, { dropoutP: 0.1, dropoutSeed: 42n });
  // Gradients into the caller's arrays (SdpaBackwardOut), directly and through the worker.
  const into: SdpaBackwardOut = { dQuery: new Float32Array(8), dAttnMask: new Float32Array(4), dSinks: new Float32Array(2) };
  attn.sdpaBackward(q, k, v, q, { attnMask: bias, returnMaskGrad: true, out: into, accumulate: true });
  void worker.sdpaBackward(q, k, v, q, { out: { dKey: new Float32Array(8) } });

  // Packed sequences: logSumExp present with a literal `true`, dSinks with sinks; cuSeqlensQ required.
  const cuSeqlensQ = Int32Array.of(0, 3, 8);
  const packedLse: Float32Array = attn.sdpaVarlen(q, k, v, { cuSeqlensQ, isCausal: true, returnLogSumExp: true }).logSumExp.data;
  // @ts-expect-error logSumExp may be absent when not requested
  attn.sdpaVarlen(q, k, v, { cuSeqlensQ }).logSumExp.data;
  attn.sdpaVarlen(q, k, v, { cuSeqlensQ, alibiSlopes: Float32Array.of(0.5, 0.25, 0.5, 0.125), causalOffset: Int32Array.of(0, 2) });
  // @ts-expect-error cuSeqlensQ is required
  attn.sdpaVarlen(q, k, v, { isCausal: true });
  // @ts-expect-error packed sequences take no mask
  attn.sdpaVarlen(q, k, v, { cuSeqlensQ, attnMask: bias });
  const packedSinks: Float32Array = attn.sdpaVarlenBackward(q, k, v, q, { cuSeqlensQ, sinks }).dSinks.data;
  // @ts-expect-error dSinks may be absent without sinks
  attn.sdpaVarlenBackward(q, k, v, q, { cuSeqlensQ }).dSinks.data;
  void worker.sdpaVarlen(q, k, v, { cuSeqlensQ, cuSeqlensK: cuSeqlensQ, returnLogSumExp: true, transfer: true })
    .then((r) => worker.sdpaVarlenBackward(q, k, v, q, { cuSeqlensQ, saved: r, out: { dQuery: new Float32Array(8) } }));
  void [packedLse, packedSinks];

  // Options the runtime refuses.
  // @ts-expect-error unknown option name
  attn.sdpa(q, k, v, { causal: true });
  // @ts-expect-error layout is 'bhsd' or 'bshd'
  attn.sdpa(q, k, v, { layout: 'bsdh' });
  // A sliding window is a number of keys (a window attends from the cache and sdpa alike).
  cache.attend(q, { slidingWindow: 4096, keyStarts: Int32Array.of(3) });
  attn.sdpaBackward(q, k, v, q, { isCausal: true, slidingWindow: 512 });
  // @ts-expect-error keyStarts is an Int32Array, as keyLengths
  attn.sdpa(q, k, v, { keyStarts: [3] });
  // @ts-expect-error slidingWindow is a number, not a (left, right) pair
  attn.sdpa(q, k, v, { isCausal: true, slidingWindow: [511, 0] });
  // @ts-expect-error keyLengths is an Int32Array
  attn.sdpa(q, k, v, { keyLengths: [3] });
  // @ts-expect-error Float64Array data
  attn.sdpa({ data: new Float64Array(8), dims: [8] }, k, v);
  // @ts-expect-error transfer is the worker's option only
  attn.sdpa(q, k, v, { transfer: true });
  // @ts-expect-error returnWeights does not apply to the backward pass
  attn.sdpaBackward(q, k, v, q, { returnWeights: true });
  // @ts-expect-error the backward's out names the gradient each array is for
  attn.sdpaBackward(q, k, v, q, { out: new Float32Array(8) });
  attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 8, maxLength: 4, dtype: 'bfloat16' }).dispose();
  // @ts-expect-error dtype is 'float32', 'float16' or 'bfloat16'
  attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 8, maxLength: 4, dtype: 'int8' });
  // @ts-expect-error reorder takes an Int32Array
  cache.reorder([0]);
  // @ts-expect-error read's options take a layout and a dtype
  cache.read(0, 1, { type: 'float32' });
  // @ts-expect-error length is read-only
  cache.length = 0;

  // An option given as `undefined` counts as not given (with exactOptionalPropertyTypes too, as
  // here): a forward's options go on to the backward with its forward-only ones undefined.
  const forwardOptions = { isCausal: true, returnLogSumExp: true } as const;
  const forward = attn.sdpa(q, k, v, forwardOptions);
  attn.sdpaBackward(q, k, v, q, { ...forwardOptions, returnLogSumExp: undefined, saved: { output: forward.output, logSumExp: forward.logSumExp } });
  void worker.sdpaBackward(q, k, v, q, { ...forwardOptions, returnLogSumExp: undefined, signal: undefined });
  void worker.sdpa(q, k, v, { scale: undefined, signal: undefined, transfer: undefined });
  attn.sdpaVarlenBackward(q, k, v, q, { cuSeqlensQ, isCausal: true, returnLogSumExp: undefined, out: undefined });
  attn.createKVCache({ batch: 1, kvHeads: 1, headDim: 8, maxLength: 4, valueDim: undefined, dtype: undefined }).dispose();
  cache.append(held.key, held.value, { layout: undefined });
  // read() with dtype 'float32' gives Float32Array data whatever the cache's dtype; without it,
  // a 16-bit cache's raw elements (Uint16Array) may come.
  const widenedData: Float32Array = cache.read(0, 1, { dtype: 'float32' }).key.data;
  void worker.createKVCache({ batch: 1, kvHeads: 1, headDim: 8, maxLength: 4, dtype: 'float16' })
    .then((c) => c.read(undefined, undefined, { dtype: 'float32', signal: undefined }))
    .then((r) => { const values: Float32Array = r.value.data; return values; });
  // @ts-expect-error the cache's own elements: Float32Array or Uint16Array
  const unwidened: Float32Array = cache.read(0, 1).key.data;
  const workerSimd: true = worker.simd;
  void [widenedData, unwidened, workerSimd];

  // Instances come from the factories only (the constructors would throw).
  // @ts-expect-error private constructor: use createAttention()
  new Attention();
  // @ts-expect-error private constructor: use attn.createKVCache()
  new KVCache();
  // @ts-expect-error private constructor: use createAttentionWorker()
  new AttentionWorker();
  // @ts-expect-error private constructor: use worker.createKVCache()
  new WorkerKVCache();

  // Disposable without the user's lib naming Symbol.dispose (the package's types bring it).
  const dispose: () => void = attn[Symbol.dispose];
  const disposeAsync: () => Promise<void> = worker[Symbol.asyncDispose];
  void [withWeights, withLse, fromCache, dBias, dSinks, dispose, disposeAsync];
}
