/**
 * Float16Array (IEEE binary16 elements: Chrome/Edge 135+, Firefox 129+, Safari 18.2+; not Node
 * 20) where TypeScript's lib declares it (ESNext.Float16, or ESNext), else `never`: the package's types name
 * it without needing that lib.
 */
export type Float16ArrayType = typeof globalThis extends { Float16Array: { prototype: infer T } } ? T : never;

/** A dense row-major tensor: the same shape as an onnxruntime-web Tensor's `data`/`dims`. */
export interface Tensor {
  data: Float32Array;
  dims: readonly number[];
}

/**
 * A tensor the calls take as input (query, key, value, gradOutput): `Float32Array` data, or
 * `Float16Array` data where the engine has one (an onnxruntime-web float16 tensor's), whose values
 * are widened exactly as they are copied in: the same results, bit for bit, as
 * `Float32Array.from(data)`. Results are always `Float32Array`.
 */
export interface InputTensor {
  data: Float32Array | Float16ArrayType;
  dims: readonly number[];
}

/**
 * An attention mask, broadcast NumPy-style (right-aligned) to `[B, Hq, Lq, Lk]`.
 * - `Float32Array` (or `Float16Array`, widened exactly): added to the scores after scaling and
 *   softcap; may hold `-Infinity`.
 * - `Uint8Array`: boolean, `1` = may attend, `0` = blocked.
 */
export interface MaskTensor {
  data: Float32Array | Uint8Array | Float16ArrayType;
  dims: readonly number[];
}

/**
 * sdpa()'s options (and KVCache.attend()'s). Here and in every options object of the package an
 * option whose value is `undefined` counts as not given (also under `exactOptionalPropertyTypes`).
 */
export interface SdpaOptions {
  /** Multiplies Q·Kᵀ. A finite number within float32's range; default `1/sqrt(E)`. */
  scale?: number | undefined;
  /** > 0 (and within float32's range): scores become `softcap·tanh(s/softcap)`, after scaling and before any mask. */
  softcap?: number | undefined;
  /** Additive (float) or boolean (uint8) mask, broadcast to `[B, Hq, Lq, Lk]`. */
  attnMask?: MaskTensor | undefined;
  /** Query row `i` may attend key `j` only if `j <= i + causalOffset`. Combines with a mask. */
  isCausal?: boolean | undefined;
  /**
   * Integer, or an `Int32Array` with one offset per batch; default 0 (PyTorch's top-left
   * alignment). `Lk - Lq` is the bottom-right alignment of a KV cache. Requires `isCausal` or
   * `alibiSlopes` (whose distances it moves too).
   */
  causalOffset?: number | Int32Array | undefined;
  /**
   * Sliding-window attention (Mistral, Gemma, FlashAttention's `window_size = (W - 1, 0)`): an
   * integer `W` in `[1, 2^30]`; query row `i` attends only keys `i + causalOffset - W < j <= i + causalOffset`,
   * the `W` keys ending at its causal diagonal. Requires `isCausal`. Keys before a row's window
   * are skipped, never read into the arithmetic.
   */
  slidingWindow?: number | undefined;
  /** One valid key count per batch, in `[0, Lk]`: keys `j >= keyLengths[b]` are padding, never read. */
  keyLengths?: Int32Array | undefined;
  /**
   * One first valid key per batch, in `[0, Lk]`: keys `j < keyStarts[b]` are padding (a
   * left-padded batch), never read, whatever they hold. Combines with `keyLengths`.
   */
  keyStarts?: Int32Array | undefined;
  /**
   * Attention sinks (gpt-oss): one sink logit per query head, a `Float32Array` of length `Hq`,
   * each finite or `-Infinity` (no sink for that head). Every softmax row of head `h` gets one
   * more logit, `sinks[h]`, taken as it is (not scaled, capped or masked), whose value row is
   * zero: the keys' weights then sum to less than 1, and the output is Σ_j p_j·v_j with those
   * weights. A row with nothing to attend still gives exact zeros (its log-sum-exp is `sinks[h]`).
   */
  sinks?: Float32Array | undefined;
  /**
   * ALiBi (BLOOM, MPT, Falcon-RW, Baichuan-13B; FlashAttention's `alibi_slopes`): one slope per
   * query head (`[Hq]`) or per batch and query head (`[B, Hq]`), each in `[0, 2^64]`. Key `j`
   * of query row `i` gets the bias `-slope·|i + causalOffset - j|`, added with the mask after the
   * softcap, computed in the kernel: no `[Lq, Lk]` bias is ever stored.
   */
  alibiSlopes?: Float32Array | undefined;
  /**
   * Attention dropout (PyTorch's `dropout_p`), for training: after the softmax each probability
   * is dropped (0) with probability `dropoutP`, or kept and multiplied by `1/(1 - dropoutP)`. A
   * number in `[0, 1)` (rounded to a multiple of 2^-32); 0, the default, is none. Needs
   * `dropoutSeed`: the mask is a function of the seed and `(b, h, i, j)` alone (`i` the row's
   * index in this call's query), so the same seed gives the same mask on any thread count, and
   * `sdpaBackward` given the same two options draws it again; give every call (each layer,
   * each step) its own seed. `weights` are the dropped ones (the output is `weights · V`);
   * `logSumExp` is the softmax's own.
   */
  dropoutP?: number | undefined;
  /**
   * The dropout mask's seed: an integer in `[0, 2^32)`, a new one per call. Required when
   * `dropoutP` rounds to a step above 0 (`dropoutP >= 2^-33`); without dropout checked but not used.
   */
  dropoutSeed?: number | undefined;
  /** Also return the softmax probabilities `[..., Hq, Lq, Lk]` (zeros on fully masked rows; with `dropoutP`, after dropout). */
  returnWeights?: boolean | undefined;
  /**
   * Also return `logSumExp` `[..., Hq, Lq]`: each row's log Σ_j exp(s_j) (`-Infinity` for a
   * fully masked row), what sdpaBackward's `saved` takes with the output.
   */
  returnLogSumExp?: boolean | undefined;
  /** Write the output into this buffer (at least as long as the output) instead of a new one. */
  out?: Float32Array | undefined;
  /**
   * `'bhsd'` (default): tensors are `[B, H, L, E]`. `'bshd'`: tensors are `[B, L, H, E]`
   * (the output too: `[B, Lq, Hq, Ev]`); no transposes needed by the caller.
   */
  layout?: 'bhsd' | 'bshd' | undefined;
}

export interface SdpaResult {
  /** `[..., Hq, Lq, Ev]` (or `[..., Lq, Hq, Ev]` with `layout: 'bshd'`), the query's rank. */
  output: Tensor;
  /** `[..., Hq, Lq, Lk]`, present when `returnWeights` was set. */
  weights?: Tensor;
  /** `[..., Hq, Lq]` (dense, whatever the layout), present when `returnLogSumExp` was set. */
  logSumExp?: Tensor;
}

/**
 * The result of a call that set `returnWeights` and/or `returnLogSumExp` to `true`: those
 * members are then always present (the types of sdpa() and attend() pick it from the options).
 */
export type SdpaResultWith<Requested extends 'weights' | 'logSumExp'> = SdpaResult & { [Name in Requested]-?: Tensor };

/** sdpaBackward's options: sdpa's score options (the same values as the forward call's), and `saved`. */
export interface SdpaBackwardOptions extends Omit<SdpaOptions, 'returnWeights' | 'returnLogSumExp' | 'out'> {
  /** Not a backward option: only `undefined`, so that `{ ...forwardOptions, returnWeights: undefined }` passes a forward's options on. */
  returnWeights?: undefined;
  /** Not a backward option: only `undefined`, so that `{ ...forwardOptions, returnLogSumExp: undefined }` passes a forward's options on. */
  returnLogSumExp?: undefined;
  /**
   * The forward call's `output` and `logSumExp` (sdpa(..., { returnLogSumExp: true }) with the
   * same inputs and options): used instead of recomputing the forward. When `logSumExp.data` is
   * the array that sdpa() returned (directly or through a worker), the call is checked against
   * that forward: other options or shapes, or inputs or results changed since, are a RangeError
   * naming the first difference. A copy of it is not checked.
   */
  saved?: { output: Tensor; logSumExp: Tensor } | undefined;
  /**
   * Also return `dAttnMask`, the gradient of an additive (Float32Array or Float16Array) `attnMask`: its dims,
   * summed over the axes it broadcasts on; 0 where a key is blocked (-Infinity, causal, key
   * length). One more pass over the scores (Q·Kᵀ and dO·Vᵀ again: 1.4-1.6× the backward's
   * time, measured). Default false; true without a float mask is a TypeError.
   */
  returnMaskGrad?: boolean | undefined;
  /**
   * Arrays to write gradients into instead of new ones: any of `dQuery`, `dKey`, `dValue`,
   * `dAttnMask`, each a Float32Array at least as long as its gradient (its first elements are
   * written, the rest left as they are). The result's `data` is then that array (or, when it is
   * longer, a view of its start). They may be (or overlap) the inputs, not each other.
   */
  out?: SdpaBackwardOut | undefined;
  /**
   * Add each gradient to what its `out` array holds instead of writing over it (a bias shared
   * by several layers, micro-batches): `out[n] += gradient[n]` in float32. Needs `out`;
   * gradients without an array there come in new ones as usual. Default false.
   */
  accumulate?: boolean | undefined;
}

/** sdpaBackward's options.out: where each gradient named is written. */
export interface SdpaBackwardOut {
  dQuery?: Float32Array | undefined;
  dKey?: Float32Array | undefined;
  dValue?: Float32Array | undefined;
  /** Only with `returnMaskGrad: true`: the mask's size. */
  dAttnMask?: Float32Array | undefined;
  /** Only with `sinks`: `Hq` floats. */
  dSinks?: Float32Array | undefined;
}

/** Gradients of a loss with respect to the inputs: each with its input's dims and layout. */
export interface SdpaBackwardResult {
  dQuery: Tensor;
  dKey: Tensor;
  dValue: Tensor;
  /** With options.returnMaskGrad: the float attnMask's gradient, with the mask's dims. */
  dAttnMask?: Tensor;
  /** With options.sinks: the sinks' gradient `[Hq]`, summed over batches and query rows. */
  dSinks?: Tensor;
}

/** The result of sdpaBackward() with `returnMaskGrad: true`: `dAttnMask` is then always present. */
export type SdpaBackwardResultWithMaskGrad = SdpaBackwardResult & { dAttnMask: Tensor };

/** The result of sdpaBackward() with `sinks`: `dSinks` is then always present. */
export type SdpaBackwardResultWithSinkGrad = SdpaBackwardResult & { dSinks: Tensor };

/**
 * sdpaVarlen's options: where each packed sequence starts (FlashAttention's `cu_seqlens`), and the
 * score options, which apply to every sequence alike.
 */
export interface SdpaVarlenOptions {
  /**
   * `[S + 1]`: sequence `s` has the query rows `cuSeqlensQ[s]` to `cuSeqlensQ[s + 1] - 1`;
   * `cuSeqlensQ[0] = 0`, non-decreasing (a sequence may have no rows), `cuSeqlensQ[S] = Tq`.
   */
  cuSeqlensQ: Int32Array;
  /** `[S + 1]`: sequence `s`'s keys (and values), as `cuSeqlensQ` over `Tk`; default `cuSeqlensQ` (self-attention). */
  cuSeqlensK?: Int32Array | undefined;
  /** Multiplies Q·Kᵀ; default `1/sqrt(E)`. */
  scale?: number | undefined;
  /** > 0: scores become `softcap·tanh(s/softcap)`. */
  softcap?: number | undefined;
  /** Row `i` of a sequence attends that sequence's keys `j <= i + causalOffset` (its own positions). */
  isCausal?: boolean | undefined;
  /**
   * Integer for every sequence, or an `Int32Array` of one per sequence (length `S`); default
   * `Lk_s - Lq_s`, each sequence's bottom-right alignment (FlashAttention's varlen; the same as
   * 0 where `Lq_s = Lk_s`). Requires `isCausal` or `alibiSlopes`.
   */
  causalOffset?: number | Int32Array | undefined;
  /** Each row attends the `W` keys of its sequence ending at its causal diagonal. Requires `isCausal`. */
  slidingWindow?: number | undefined;
  /** One sink logit per query head (`[Hq]`, finite or `-Infinity`), as for sdpa(). */
  sinks?: Float32Array | undefined;
  /**
   * ALiBi slopes, `[Hq]` for every sequence or `[S, Hq]`, as for sdpa(): row `i` and key `j` of a
   * sequence (its own positions) get `-slope·|i + causalOffset - j|`.
   */
  alibiSlopes?: Float32Array | undefined;
  /**
   * Attention dropout, as for sdpa(): each sequence draws the mask of batch `s` (its index) in
   * its own positions `(i, j)`. Needs `dropoutSeed`.
   */
  dropoutP?: number | undefined;
  /** The dropout mask's seed: an integer in `[0, 2^32)`, as for sdpa(). */
  dropoutSeed?: number | undefined;
  /** Also return `logSumExp` `[Hq, Tq]` (`-Infinity`, or the sink, for a row without keys). */
  returnLogSumExp?: boolean | undefined;
  /** Write the output `[Tq, Hq, Ev]` into this buffer instead of a new one. */
  out?: Float32Array | undefined;
}

export interface SdpaVarlenResult {
  /** `[Tq, Hq, Ev]`. */
  output: Tensor;
  /** `[Hq, Tq]`, present when `returnLogSumExp` was set. */
  logSumExp?: Tensor;
}

/** sdpaVarlen's result with `returnLogSumExp: true`. */
export type SdpaVarlenResultWithLogSumExp = SdpaVarlenResult & { logSumExp: Tensor };

/** sdpaVarlenBackward's options: sdpaVarlen's (the same values as the forward call's), `saved`, `out`, `accumulate`. */
export interface SdpaVarlenBackwardOptions extends Omit<SdpaVarlenOptions, 'returnLogSumExp' | 'out'> {
  /** Not a backward option: only `undefined`, so that `{ ...forwardOptions, returnLogSumExp: undefined }` passes a forward's options on. */
  returnLogSumExp?: undefined;
  /** sdpaVarlen(..., { returnLogSumExp: true })'s `output` and `logSumExp`, as sdpaBackward's `saved`. */
  saved?: { output: Tensor; logSumExp: Tensor } | undefined;
  /** As sdpaBackward's `out`: `dQuery`, `dKey`, `dValue`, and `dSinks` with sinks. */
  out?: Omit<SdpaBackwardOut, 'dAttnMask'> | undefined;
  /** Add each gradient to its `out` array. Needs `out`. */
  accumulate?: boolean | undefined;
}

/** sdpaVarlenBackward's gradients: `[Tq, Hq, E]`, `[Tk, Hkv, E]`, `[Tk, Hkv, Ev]`, and `dSinks` `[Hq]` with sinks. */
export type SdpaVarlenBackwardResult = Omit<SdpaBackwardResult, 'dAttnMask'>;

export interface AttentionOptions {
  /**
   * Threads to run on, an integer in [1, 64]; default: the logical processors, at most 4.
   * More than 1 needs SharedArrayBuffer (Node; cross-origin isolated pages), else the
   * single-threaded build is used. `attn.threads` reports what was chosen.
   */
  threads?: number | undefined;
  /**
   * Use the relaxed-SIMD build (fused multiply-add) where the engine runs it (Chrome/Edge 114+,
   * Node 22+; not Safari): default true. `false` forces the portable SIMD128 build. Results of
   * the two may differ in the last bits; `attn.isa` reports which one runs.
   */
  relaxedSimd?: boolean | undefined;
  /**
   * The most bytes of wasm memory this instance may hold at once: its KV caches' storage plus
   * what the call running now needs (inputs, outputs, scratch). A call whose whole copy would
   * pass it (or the module's 2 GiB) first runs in parts that fit, with the same bits: sdpa(),
   * sdpaBackward() and KVCache.attend() a slice of batches and KV heads at a time (sdpa() and
   * attend() also of one KV head's query heads, then of one query head's rows, where the kernel
   * says that keeps the bits; sdpaBackward's slices hold every batch and head
   * that sinks or a mask's gradient sum over), sdpaVarlen() and sdpaVarlenBackward() a chunk of sequences at a time. A
   * call whose smallest part, or a cache, would pass it is refused with a RangeError (bytes
   * needed, the limit) before anything is allocated.
   * An integer in [1, 2^31]; default 2^31 (2 GiB), the wasm memory limit of every build.
   */
  maxMemoryBytes?: number | undefined;
}

/** createAttentionWorker's options: createAttention's, and a signal for the start. */
export interface AttentionWorkerOptions extends AttentionOptions {
  /**
   * Stops the worker's start: aborted before it is ready (its module and thread pool loaded),
   * the worker and its pool's workers are ended and the call rejects with the signal's reason;
   * e.g. `AbortSignal.timeout(30_000)` bounds a start whose files do not arrive. Not looked at
   * once the worker has started (each call takes a signal of its own).
   */
  signal?: AbortSignal | undefined;
}

/** attn.memory(): what an Attention instance holds in wasm memory, in bytes. */
export interface MemoryInfo {
  /** Held now by this instance: its KV caches' storage (and a call's blocks while it runs). */
  bytesInUse: number;
  /** The most bytesInUse has been since the instance was created. */
  peakBytes: number;
  /**
   * The size of the wasm memory the instance runs on (grown on demand, never shrunk; shared
   * with other instances of the same build in this page or process).
   */
  capacityBytes: number;
  /** maxMemoryBytes: bytesInUse never passes it. */
  limitBytes: number;
  /**
   * Bytes allocated in that wasm memory by every user of it (all instances on the same build,
   * and the runtime's own): what a leak would show in.
   */
  moduleBytesInUse: number;
}

/**
 * Keys or values to append to a KV cache: `[B, Hkv, Lnew, E]` (or `[B, Lnew, Hkv, E]` with
 * `layout: 'bshd'`). `data` is a `Float32Array`, or a `Float16Array` (where the engine has one;
 * typed where TypeScript's lib declares it: ESNext.Float16, or ESNext), for any cache; a float16 or
 * bfloat16 cache also takes a `Uint16Array` of raw elements of its dtype (IEEE half bits;
 * bfloat16 bits, the upper 16 of a float32).
 */
export interface KVTensor {
  data: Float32Array | Uint16Array | Float16ArrayType;
  dims: readonly number[];
}

/**
 * What KVCache.read() returns: the stored keys and values of a range of positions, as
 * append() takes them (Float32Array data for a float32 cache, raw 16-bit elements for a float16
 * or bfloat16 one).
 */
export interface KVCacheContents<Data extends Float32Array | Uint16Array = Float32Array | Uint16Array> {
  key: KVTensor & { data: Data };
  value: KVTensor & { data: Data };
}

/** A KV cache's element type (KVCacheOptions.dtype). */
export type KVCacheDType = 'float32' | 'float16' | 'bfloat16';

/** KVCache.append()'s options. */
export interface KVAppendOptions {
  /** `'bhsd'` (default): `[B, Hkv, Lnew, E]`; `'bshd'`: `[B, Lnew, Hkv, E]`. */
  layout?: 'bhsd' | 'bshd' | undefined;
}

/** KVCache.read()'s options. */
export interface KVReadOptions {
  /** `'bhsd'` (default): `[B, Hkv, n, E]`; `'bshd'`: `[B, n, Hkv, E]`. */
  layout?: 'bhsd' | 'bshd' | undefined;
  /**
   * The elements' type: the cache's own (default: Float32Array for float32, the raw 16-bit
   * elements as a Uint16Array for float16 and bfloat16), or `'float32'`, their exact float32
   * values (a Float32Array, whatever the cache's dtype).
   */
  dtype?: KVCacheDType | undefined;
}

export interface KVCacheOptions {
  /** B: sequences decoded together. */
  batch: number;
  /** Hkv: key/value heads. */
  kvHeads: number;
  /** E: the size of a key (and query) head. */
  headDim: number;
  /** Ev: the size of a value head; default headDim. */
  valueDim?: number | undefined;
  /** Positions the cache can hold; its storage is allocated once for all of them. */
  maxLength: number;
  /**
   * `'float32'` (default), `'float16'` or `'bfloat16'`: the 16-bit ones take half the memory
   * and half the bytes read per step; values are rounded to nearest even. float16 keeps 11
   * significant bits, and beyond ±65504 saturates to ±65504; bfloat16 keeps 8, with float32's
   * range (finite values saturate at ±3.3895e38), and is widened with fewer instructions.
   */
  dtype?: KVCacheDType | undefined;
}
