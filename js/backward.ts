// sdpaBackward(): the gradients dQ, dK, dV (src/sdpa-backward.h) of a checked BackwardPlan,
// and the float mask's (laid out as the mask, summed over its broadcast axes) when asked for, and
// the sinks' ([Hq], summed over batches and rows) when there are sinks,
// each copied out into options.out's array for it (or added to it: options.accumulate) or a new one.
// Two ways of running it: Q, K, V and dO copied in whole (runBackwardWhole), or a slice of
// batches and KV heads at a time (runBackwardSlices, slices.ts) where the whole copy would pass
// the memory limits; in each, the forward's output O and log-sum-exp are either copied in
// (options.saved) or computed first by forward() on the same problem (the same bits as
// sdpa(..., { returnLogSumExp: true }) gives: its kernel, its thread-count-independent split);
// then backward(). Both give the same bits. Every block is requested at once (refused before
// allocating past the instance's limit) and freed on every path.
import { backwardArg, problemArg } from './kernel-args.js';
import { type CallMemory, runFirstThatFits, type Way } from './memory.js';
import {
  copySlice, denseStrides, keyValuePart, maskSpanBytes, problemOfSlice, queryPart, sliceCandidates, SliceMasks, sliceProblem,
  slicePurpose, sliceShapes, slicesOf, type Slice, type SliceShape,
} from './slices.js';
import { check, copySmallInputs, describeProblem, smallInputBytes } from './strategies.js';
import type { SdpaBackwardResult, Tensor } from './types.js';
import { type BackwardPlan, floatBytes, type GradientName, type InputData, type SdpaPlan, writeOut } from './validate.js';
import type { BackwardDesc, ProblemDesc, SdpaModule } from './wasm/sdpa.mjs';

/**
 * The backward's own operands, addresses 0 until allocated: its keys in the module's order
 * (src/bindings/embind.cc kBackwardFields), which kernel-args.ts reads in one pass.
 */
export function describeBackward(p: SdpaPlan): BackwardDesc {
  return {
    logsumexp: 0, gradOutput: 0, dQuery: 0, dKey: 0, dValue: 0,
    // dO and O share the output's strides; each gradient its input's.
    goStrideB: p.o.b, goStrideH: p.o.h, goStrideL: p.o.l,
    dqStrideB: p.q.b, dqStrideH: p.q.h, dqStrideL: p.q.l,
    dkStrideB: p.k.b, dkStrideH: p.k.h, dkStrideL: p.k.l,
    dvStrideB: p.v.b, dvStrideH: p.v.h, dvStrideL: p.v.l,
    dMask: 0, dSinks: 0, maskGradParts: 0,
  };
}

/**
 * sdpaBackward(): Q, K, V and dO copied in whole (runBackwardWhole), or, where that copy would
 * pass the memory limits (maxMemoryBytes, the module's 2 GiB), a slice of the call at a time,
 * the largest that fits (runBackwardSlices). A slice holds every batch the sinks' gradient or
 * the mask's gradient sums over (the mask broadcasting over batches), and every head the mask's
 * gradient sums over. A call with no such slice smaller than itself (one (batch, KV head); sinks,
 * or a mask broadcasting over batches, with one KV head; a mask broadcasting over heads with one
 * batch, or over both) is refused past the limits, naming the whole copy's blocks.
 */
export function runBackward(memory: CallMemory, threads: number, bp: BackwardPlan, q: InputData, k: InputData,
  v: InputData): SdpaBackwardResult {
  const p = bp.forward;
  const whole = planBackwardWhole(memory.module, threads, bp, q, k, v);
  // The whole copy, then the largest slices that fit, else whichever way needs the least (whose
  // refusal names that): smaller slices may need more scratch than larger ones (with fewer pairs
  // than threads, the backward splits each pair's keys and rows). The whole copy is tried first
  // outside the generator, which would cost a small call a few µs (see runSdpa).
  const copied = () => runBackwardWhole(memory, threads, bp, q, k, v, whole);
  if (memory.fits(whole.request)) return copied();
  return runFirstThatFits((function* ways(): Generator<Way<SdpaBackwardResult>> {
    yield { memory, request: whole.request, run: copied };
    const mask = bp.maskGrad ? p.mask : null;
    const everyBatch = p.sinks !== null || mask?.strides[0] === 0, everyHead = mask?.strides[1] === 0;
    // The whole call's split of each mask-gradient block's sum, given to every slice (whose blocks
    // are fewer, but each the same sum: every batch and head it sums over is in the slice).
    const maskGradParts = bp.maskGrad ? memory.module.maskGradParts(problemArg(memory.module, whole.desc),
      backwardArg(memory.module, whole.grad)) : 0;
    for (const shape of sliceCandidates(p, { everyBatch, everyHead })) {
      const slices = planBackwardSlices(memory.module, threads, bp, shape, maskGradParts);
      yield { memory, request: slices.request, run: () => runBackwardSlices(memory, threads, bp, q, k, v, slices) };
    }
  })());
}

/** runBackwardWhole's blocks. */
function planBackwardWhole(module: SdpaModule, threads: number, bp: BackwardPlan, q: InputData, k: InputData,
  v: InputData) {
  const p = bp.forward;
  const desc = describeProblem(p);
  const grad = describeBackward(p);
  // backward_scratch_floats counts the mask gradient's scratch when dMask is not 0: any
  // address stands in for it until the allocation.
  const maskSize = p.mask?.size ?? 0;
  if (bp.maskGrad) grad.dMask = 1;
  // The forward (when O and lse are not saved) and the backward run one after the other:
  // one scratch block serves both.
  const backwardFloats = module.backwardScratchFloats(problemArg(module, desc), backwardArg(module, grad), threads);
  const forwardFloats = bp.saved === null ? module.scratchFloats(problemArg(module, desc), threads) : 0;
  const request = {
    query: floatBytes(q), key: floatBytes(k), value: floatBytes(v), gradOutput: floatBytes(bp.gradOutput),
    output: p.outputSize * 4, logSumExp: p.lseSize * 4,
    dQuery: q.length * 4, dKey: k.length * 4, dValue: v.length * 4,
    dMask: bp.maskGrad ? maskSize * 4 : 0, dSinks: p.sinks !== null ? p.qHeads * 4 : 0,
    scratch: Math.max(backwardFloats, forwardFloats) * 4, ...smallInputBytes(p),
  };
  return { desc, grad, maskSize, backwardFloats, forwardFloats, request };
}

/**
 * Q, K, V and dO copied in whole, with the forward's output O and log-sum-exp either copied in
 * (options.saved) or computed first by forward() on the same problem; then backward().
 */
function runBackwardWhole(memory: CallMemory, threads: number, bp: BackwardPlan, q: InputData, k: InputData,
  v: InputData, whole: ReturnType<typeof planBackwardWhole>): SdpaBackwardResult {
  const p = bp.forward;
  const module = memory.module;
  try {
    const { desc, grad, maskSize, backwardFloats, forwardFloats } = whole;
    const at = memory.allocate(whole.request);
    Object.assign(desc, { query: at.query, key: at.key, value: at.value, output: at.output, logsumexp: at.logSumExp });
    Object.assign(grad, {
      logsumexp: at.logSumExp, gradOutput: at.gradOutput, dQuery: at.dQuery, dKey: at.dKey, dValue: at.dValue,
      dMask: bp.maskGrad ? at.dMask : 0, dSinks: p.sinks !== null ? at.dSinks : 0,
    });
    // Heap views only after the last allocation.
    const views = memory.heap;
    views.writeFloats(at.query, q);
    views.writeFloats(at.key, k);
    views.writeFloats(at.value, v);
    views.writeFloats(at.gradOutput, bp.gradOutput);
    const { f32 } = views;
    copySmallInputs(memory, p, desc, at);
    if (bp.saved !== null) {
      f32.set(bp.saved.output, at.output >>> 2);
      f32.set(bp.saved.logSumExp, at.logSumExp >>> 2);
    } else {
      check(module, p, module.forward(problemArg(module, desc), at.scratch, forwardFloats, threads));
    }
    check(module, p, module.backward(problemArg(module, desc), backwardArg(module, grad), at.scratch, backwardFloats,
      threads));
    return takeGradients(memory, bp, at, { query: q.length, key: k.length, value: v.length, mask: maskSize });
  } finally {
    memory.free();
  }
}

/** The backward operands of a slice problem (sliceProblem): its gradients dense like its inputs. */
function sliceBackward(slice: ProblemDesc): BackwardDesc {
  return {
    logsumexp: 0, gradOutput: 0, dQuery: 0, dKey: 0, dValue: 0,
    goStrideB: slice.oStrideB, goStrideH: slice.oStrideH, goStrideL: slice.oStrideL,
    dqStrideB: slice.qStrideB, dqStrideH: slice.qStrideH, dqStrideL: slice.qStrideL,
    dkStrideB: slice.kStrideB, dkStrideH: slice.kStrideH, dkStrideL: slice.kStrideL,
    dvStrideB: slice.vStrideB, dvStrideH: slice.vStrideH, dvStrideL: slice.vStrideL,
    dMask: 0, dSinks: 0, maskGradParts: 0,
  };
}

/**
 * runBackwardSlices' blocks for slices of `shape`: each slice tensor and gradient, its mask (and
 * the mask's gradient, over the same span, its sums split into `maskGradParts`), the scratch,
 * the other small inputs whole.
 */
function planBackwardSlices(module: SdpaModule, threads: number, bp: BackwardPlan, shape: SliceShape,
  maskGradParts: number) {
  const p = bp.forward;
  const desc = describeProblem(p);
  const sliceDesc = sliceProblem(p, desc, shape);
  const heads = sliceDesc.qHeads, rows = shape.batches * heads * p.qLen, keys = shape.batches * shape.kvHeads * p.kvLen;
  const sliceGrad = (slice: ProblemDesc) => ({ ...sliceBackward(slice), dMask: bp.maskGrad ? 1 : 0, maskGradParts });
  const scratch = (s: SliceShape) => {
    const slice = sliceProblem(p, desc, s);
    const backward = module.backwardScratchFloats(problemArg(module, slice), backwardArg(module, sliceGrad(slice)), threads);
    return { backward, forward: bp.saved === null ? module.scratchFloats(problemArg(module, slice), threads) : 0 };
  };
  const needs = sliceShapes(p, shape).map(scratch);
  const backwardFloats = Math.max(...needs.map((n) => n.backward)), forwardFloats = Math.max(...needs.map((n) => n.forward));
  const request = {
    query: 4 * rows * p.headDim, key: 4 * keys * p.headDim, value: 4 * keys * p.valueDim,
    gradOutput: 4 * rows * p.valueDim, output: 4 * rows * p.valueDim, logSumExp: 4 * rows,
    dQuery: 4 * rows * p.headDim, dKey: 4 * keys * p.headDim, dValue: 4 * keys * p.valueDim,
    dSinks: p.sinks !== null ? 4 * heads : 0, dMask: bp.maskGrad ? maskSpanBytes(p, shape.batches, heads) : 0,
    scratch: 4 * Math.max(backwardFloats, forwardFloats), ...smallInputBytes(p), attnMask: maskSpanBytes(p, shape.batches, heads),
  };
  return { shape, desc, sliceDesc, backwardFloats, forwardFloats, maskGradParts, request };
}

/**
 * sdpaBackward() a slice (slices.ts) at a time: its Q, K, V, dO (and saved O and log-sum-exp)
 * copied in, the forward (unless saved) and the backward computed on `threads` threads, its
 * gradients copied out into arrays of the call's shapes, which go into options.out (written or
 * added to) at the end, when every input has been read. With sinks every slice holds every
 * batch, so that each head's sink gradient is the whole call's one sum; with the mask's
 * gradient, every batch and head the mask broadcasts over, and the whole call's parts
 * (maskGradParts), so that each of its elements is the whole call's sum.
 */
function runBackwardSlices(memory: CallMemory, threads: number, bp: BackwardPlan, q: InputData, k: InputData,
  v: InputData, plan: ReturnType<typeof planBackwardSlices>): SdpaBackwardResult {
  const p = bp.forward;
  const module = memory.module;
  try {
    const { shape, desc, sliceDesc, backwardFloats, forwardFloats, maskGradParts, request } = plan;
    const at = memory.allocate(request, slicePurpose(p, shape));
    copySmallInputs(memory, p, desc, at, false);
    Object.assign(sliceDesc, { query: at.query, key: at.key, value: at.value, output: at.output, logsumexp: at.logSumExp });
    const masks = new SliceMasks(p, at.attnMask);
    const gradients = {
      dQuery: new Float32Array(q.length), dKey: new Float32Array(k.length), dValue: new Float32Array(v.length),
      dSinks: p.sinks !== null ? new Float32Array(p.qHeads) : undefined,
      dMask: bp.maskGrad && p.mask !== null ? new Float32Array(p.mask.size) : undefined,
    };
    for (const c of slicesOf(p, shape)) {
      const slice = problemOfSlice(p, desc, sliceDesc, shape, c);
      const grad = Object.assign(sliceBackward(slice), {
        logsumexp: at.logSumExp, gradOutput: at.gradOutput, dQuery: at.dQuery, dKey: at.dKey, dValue: at.dValue,
        dSinks: p.sinks !== null ? at.dSinks : 0, dMask: bp.maskGrad ? at.dMask : 0, maskGradParts,
      });
      const rows = queryPart(c), kv = keyValuePart(c);
      // Fresh views every time: a view is never kept across a call into the module.
      const before = memory.heap;
      copySlice(before, at.query, q, p.q, p.layout, rows, p.qLen, p.headDim, 'in');
      copySlice(before, at.key, k, p.k, p.layout, kv, p.kvLen, p.headDim, 'in');
      copySlice(before, at.value, v, p.v, p.layout, kv, p.kvLen, p.valueDim, 'in');
      copySlice(before, at.gradOutput, bp.gradOutput, p.o, p.layout, rows, p.qLen, p.valueDim, 'in');
      slice.mask = masks.place(before, c);
      if (bp.saved !== null) {
        copySlice(before, at.output, bp.saved.output, p.o, p.layout, rows, p.qLen, p.valueDim, 'in');
        copySlice(before, at.logSumExp, bp.saved.logSumExp, denseStrides(p, 1), 'bhsd', rows, p.qLen, 1, 'in');
      } else {
        check(module, p, module.forward(problemArg(module, slice), at.scratch, forwardFloats, threads));
      }
      check(module, p, module.backward(problemArg(module, slice), backwardArg(module, grad), at.scratch, backwardFloats,
        threads));
      const after = memory.heap;
      copySlice(after, at.dQuery, gradients.dQuery, p.q, p.layout, rows, p.qLen, p.headDim, 'out');
      copySlice(after, at.dKey, gradients.dKey, p.k, p.layout, kv, p.kvLen, p.headDim, 'out');
      copySlice(after, at.dValue, gradients.dValue, p.v, p.layout, kv, p.kvLen, p.valueDim, 'out');
      if (gradients.dSinks !== undefined) {
        gradients.dSinks.set(after.f32.subarray(at.dSinks >>> 2, (at.dSinks >>> 2) + c.heads), c.firstHead);
      }
      if (gradients.dMask !== undefined) copyMaskGradient(after.f32, at.dMask, gradients.dMask, p, c);
    }
    return gradientResult(bp, gradients, true);
  } finally {
    memory.free();
  }
}

/**
 * Slice c's elements of the mask's gradient, from its block at byte `address` of `f32` (laid out
 * as the slice's mask span, from c's first batch and head: SliceMasks) into `dMask`, the whole
 * mask's: the mask's own (batch, head) planes that c holds, each [Lq, Lk] of the mask's own axes,
 * contiguous (the mask is dense over its own axes). On an axis the mask broadcasts over, c holds
 * every batch or head, and its one plane is the whole sum.
 */
function copyMaskGradient(f32: Float32Array, address: number, dMask: Float32Array, p: SdpaPlan, c: Slice): void {
  const [sb, sh, sq, sk] = (p.mask as NonNullable<SdpaPlan['mask']>).strides;
  const plane = (p.qLen - 1) * sq + (p.kvLen - 1) * sk + 1;
  const from = c.b0 * sb + c.firstHead * sh;
  for (let b = c.b0; b < (sb === 0 ? c.b0 + 1 : c.b0 + c.batches); b++) {
    for (let h = c.firstHead; h < (sh === 0 ? c.firstHead + 1 : c.firstHead + c.heads); h++) {
      const at = b * sb + h * sh, own = (address >>> 2) + at - from;
      dMask.set(f32.subarray(own, own + plane), at);
    }
  }
}

/** The gradients as computed, in wasm memory (takeGradients) or in arrays of their own (the chunked varlen backward). */
export interface ComputedGradients {
  dQuery: Float32Array;
  dKey: Float32Array;
  dValue: Float32Array;
  dMask?: Float32Array;
  dSinks?: Float32Array;
}

/**
 * The gradients computed at `at` (addresses in wasm memory), each into options.out's array for
 * it (written, or added to with accumulate; every input was copied in before, so out may be
 * one) or a new array. `sizes` are the inputs' elements (and the mask's).
 */
export function takeGradients(memory: CallMemory, bp: BackwardPlan,
  at: { dQuery: number; dKey: number; dValue: number; dMask: number; dSinks: number },
  sizes: { query: number; key: number; value: number; mask: number }): SdpaBackwardResult {
  const p = bp.forward;
  const heap = memory.heap.f32;  // fresh views, as everywhere after a call
  const view = (address: number, length: number) => heap.subarray(address >>> 2, (address >>> 2) + length);
  return gradientResult(bp, {
    dQuery: view(at.dQuery, sizes.query), dKey: view(at.dKey, sizes.key), dValue: view(at.dValue, sizes.value),
    dMask: bp.maskGrad && p.mask !== null ? view(at.dMask, sizes.mask) : undefined,
    dSinks: p.sinks !== null ? view(at.dSinks, p.qHeads) : undefined,
  }, false);
}

/**
 * The result of `computed`: each gradient into options.out's array for it (written, or added
 * to with accumulate; every input was read before) or, without one, a copy (`owned` false: views
 * of wasm memory) or the array itself (`owned` true). A gradient computed straight into its out
 * array (`computed` holds that array's view) is left as it is.
 */
export function gradientResult(bp: BackwardPlan, computed: ComputedGradients, owned: boolean): SdpaBackwardResult {
  const p = bp.forward;
  const take = (name: GradientName, values: Float32Array, dims: number[]): Tensor => {
    const target = bp.out[name];
    if (target !== undefined && target.view === values) return { data: target.result, dims };
    if (target !== undefined) return { data: writeOut(target, values, bp.accumulate), dims };
    return { data: owned ? values : values.slice(), dims };
  };
  const result: SdpaBackwardResult = {
    dQuery: take('dQuery', computed.dQuery, bp.queryDims),
    dKey: take('dKey', computed.dKey, bp.keyDims),
    dValue: take('dValue', computed.dValue, bp.valueDims),
  };
  if (computed.dMask !== undefined && p.mask !== null) result.dAttnMask = take('dAttnMask', computed.dMask, [...p.mask.dims]);
  if (computed.dSinks !== undefined) result.dSinks = take('dSinks', computed.dSinks, [p.qHeads]);
  return result;
}
