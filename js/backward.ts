// sdpaBackward(): the gradients dQ, dK, dV (src/sdpa-backward.h) of a checked BackwardPlan,
// and the float mask's (laid out as the mask, summed over its broadcast axes) when asked for, and
// the sinks' ([Hq], summed over batches and rows) when there are sinks,
// each copied out into options.out's array for it (or added to it: options.accumulate) or a new one.
// One way of running it: Q, K, V and dO copied in, with the forward's output O and
// log-sum-exp either copied in (options.saved) or computed first by forward() on the same
// problem (the same bits as sdpa(..., { returnLogSumExp: true }) gives: its kernel, its
// thread-count-independent split); then backward(). Every block is requested at once
// (refused before allocating past the instance's limit) and freed on every path.
import { backwardArg, problemArg } from './kernel-args.js';
import { CallMemory } from './memory.js';
import { check, copySmallInputs, describeProblem, smallInputBytes } from './strategies.js';
import type { SdpaBackwardResult, Tensor } from './types.js';
import { type BackwardPlan, type GradientName, type SdpaPlan, writeOut } from './validate.js';
import type { BackwardDesc } from './wasm/sdpa.mjs';

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
    dMask: 0, dSinks: 0,
  };
}

export function runBackward(memory: CallMemory, threads: number, bp: BackwardPlan, q: Float32Array, k: Float32Array,
  v: Float32Array): SdpaBackwardResult {
  const p = bp.forward;
  const module = memory.module;
  try {
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
    const scratchFloats = Math.max(backwardFloats, forwardFloats);
    const at = memory.allocate({
      query: q.byteLength, key: k.byteLength, value: v.byteLength, gradOutput: bp.gradOutput.byteLength,
      output: p.outputSize * 4, logSumExp: p.lseSize * 4,
      dQuery: q.length * 4, dKey: k.length * 4, dValue: v.length * 4,
      dMask: bp.maskGrad ? maskSize * 4 : 0, dSinks: p.sinks !== null ? p.qHeads * 4 : 0,
      scratch: scratchFloats * 4, ...smallInputBytes(p),
    });
    Object.assign(desc, { query: at.query, key: at.key, value: at.value, output: at.output, logsumexp: at.logSumExp });
    Object.assign(grad, {
      logsumexp: at.logSumExp, gradOutput: at.gradOutput, dQuery: at.dQuery, dKey: at.dKey, dValue: at.dValue,
      dMask: bp.maskGrad ? at.dMask : 0, dSinks: p.sinks !== null ? at.dSinks : 0,
    });
    // Heap views only after the last allocation.
    const { f32 } = memory.heap;
    f32.set(q, at.query >>> 2);
    f32.set(k, at.key >>> 2);
    f32.set(v, at.value >>> 2);
    f32.set(bp.gradOutput, at.gradOutput >>> 2);
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
