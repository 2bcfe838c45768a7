// Slices of a call: the batches [b0, b0 + m) and KV heads [h0, h0 + n) with their query heads
// [h0·G, (h0 + n)·G) (G = Hq/Hkv), a problem of its own, [m, n·G, Lq, E] against [m, n, Lk, E].
// The kernel computes each (batch, KV head) alone, with the same operations in any problem and
// on any number of threads, so running a call slice by slice gives the whole call's bits
// (sdpa()'s forward, strategies.ts runSlices; sdpaBackward's, backward.ts runBackwardSlices).
// The forward also cuts one (batch, KV head) further, into its query heads [h0·G + g0, … + g),
// [1, g, Lq, E] against [1, 1, Lk, E], and a query head into its rows [r0, r0 + r), [1, 1, r, E]
// (causal offset + r0, the dropout mask's row base r0): only where the kernel says that keeps
// the bits (module.queryHeadsKeepBits, module.queryRowsKeepBits: the same path, the same row
// tiles and the same reading order, src/sdpa.h), since a row's bits depend on the rows that
// share its tile (e.g. multi-query attention on one sequence, which has no smaller slice of
// batches and KV heads, or one long head).
// Each tensor's slice is copied into a block of its own, dense in the call's layout: in 'bhsd'
// one run of n·L·D floats per batch, in 'bshd' one run of n·D floats per (batch, position);
// a KV cache's K/V are read in place instead (KVCache.attend, strategies.ts runResident).
// The small per-batch and per-head inputs (causal offsets, key lengths and starts, sinks, ALiBi
// slopes) stay whole in wasm memory, their addresses moved to the slice's first batch and head;
// the mask's elements the slice reads (maskSpan) are copied for it; the dropout mask's batch and
// head count from the slice's first ones, so that the slice draws the whole call's.
import type { HeapViews } from './memory.js';
import type { ProblemDesc } from './wasm/sdpa.mjs';
import { type InputData, layoutStrides, maskElementBytes, type Plan, type Strides } from './validate.js';

/** A slice's shape: `batches` batches from b0, `kvHeads` KV heads from h0 (the last ones of each axis may be fewer). */
export interface SliceShape {
  batches: number;
  kvHeads: number;
  /**
   * Query heads of each KV head's group in a slice: all G = Hq/Hkv when not given; fewer only
   * in slices of one batch and one KV head (the last slice of a group may have fewer still).
   */
  groupHeads?: number;
  /** Query rows of each head in a slice: all Lq when not given; fewer only in slices of one query head (the last slice of a head may have fewer still). */
  rows?: number;
}

/** One slice of a call cut into slices of `shape`. */
export interface Slice {
  b0: number;
  batches: number;
  /** The first KV head, and the first query head (h0·G). */
  h0: number;
  kvHeads: number;
  firstHead: number;
  heads: number;
  /** The query rows [firstRow, firstRow + rows) of each of its heads: [0, Lq) but in slices of one query head's rows. */
  firstRow: number;
  rows: number;
}

/** The slices of `shape`, batch-major: each batch's KV heads (and their groups' query heads, and their rows), then the next batches'. */
export function* slicesOf(p: Plan, shape: SliceShape): Generator<Slice> {
  const group = p.qHeads / p.kvHeads, groupHeads = shape.groupHeads ?? group, headRows = shape.rows ?? p.qLen;
  for (let b0 = 0; b0 < p.batch; b0 += shape.batches) {
    for (let h0 = 0; h0 < p.kvHeads; h0 += shape.kvHeads) {
      const batches = Math.min(shape.batches, p.batch - b0), kvHeads = Math.min(shape.kvHeads, p.kvHeads - h0);
      for (let g0 = 0; g0 < group; g0 += groupHeads) {
        const heads = groupHeads === group ? kvHeads * group : Math.min(groupHeads, group - g0);
        for (let firstRow = 0; firstRow < p.qLen; firstRow += headRows) {
          yield { b0, batches, h0, kvHeads, firstHead: h0 * group + g0, heads, firstRow, rows: Math.min(headRows, p.qLen - firstRow) };
        }
      }
    }
  }
}

/** The distinct slice shapes of a call cut into `shape` (up to four: the last batches and heads, or query heads or rows, may be fewer). */
export function sliceShapes(p: Plan, shape: SliceShape): SliceShape[] {
  const group = p.qHeads / p.kvHeads;
  if (shape.rows !== undefined && shape.rows < p.qLen) {
    return [...new Set([shape.rows, p.qLen % shape.rows || shape.rows])]
      .map((rows) => ({ batches: 1, kvHeads: 1, groupHeads: 1, rows }));
  }
  if (shape.groupHeads !== undefined && shape.groupHeads < group) {
    return [...new Set([shape.groupHeads, group % shape.groupHeads || shape.groupHeads])]
      .map((groupHeads) => ({ batches: 1, kvHeads: 1, groupHeads }));
  }
  const batches = new Set([shape.batches, p.batch % shape.batches || shape.batches]);
  const kvHeads = new Set([shape.kvHeads, p.kvHeads % shape.kvHeads || shape.kvHeads]);
  return [...batches].flatMap((m) => [...kvHeads].map((n) => ({ batches: m, kvHeads: n })));
}

/** n halved, quartered… down to 1: ceil(n/2), ceil(n/4)…, each smaller than the one before (none for n = 1). */
function halvings(n: number): number[] {
  const sizes: number[] = [];
  for (let parts = 2; n > 1; parts *= 2) {
    const size = Math.ceil(n / parts);
    if (sizes.length === 0 || size < sizes[sizes.length - 1]) sizes.push(size);
    if (size === 1) break;
  }
  return sizes;
}

/** Which slices of one (batch, KV head) give the whole call's bits: the module's rules for the whole call's problem (src/sdpa.h). */
export interface SliceRules {
  /** Whether query heads [first, first + count) of a KV head's group, run alone, do (queryHeadsKeepBits). */
  queryHeadsKeepBits(first: number, count: number): boolean;
  /** The least count of rows >= atLeast (below Lq) whose slices of every query head (the last fewer), each run alone, do; 0 for none (leastQueryRows). */
  leastQueryRows(atLeast: number): number;
}

/**
 * Slice shapes from the largest to the smallest, for a call whose whole copy does not fit: all
 * KV heads of half the batches, of a quarter… of one batch, then half its KV heads… one KV head of
 * one batch; then, given `keepsBits` (the forward), about half its query heads… as few as keep
 * the bits (each halving rounded up to the next count whose every slice keeps them), then about
 * half the rows of one query head… as few as keep the bits (rounded up the same way). With
 * `everyBatch` (sdpaBackward with sinks, or a mask's gradient whose mask broadcasts over batches:
 * one sum over every batch, src/sdpa-backward.cc) every slice holds all batches instead: half the
 * KV heads… one; with `everyHead` (a mask's gradient whose mask broadcasts over heads) all heads:
 * half the batches… one; with both, no slice.
 */
export function sliceCandidates(p: Plan, { everyBatch = false, everyHead = false, keepsBits }:
  { everyBatch?: boolean; everyHead?: boolean; keepsBits?: SliceRules }): SliceShape[] {
  const byHeads = (batches: number) => halvings(p.kvHeads).map((kvHeads) => ({ batches, kvHeads }));
  const byBatches = halvings(p.batch).map((batches) => ({ batches, kvHeads: p.kvHeads }));
  if (everyBatch) return everyHead ? [] : byHeads(p.batch);
  if (everyHead) return byBatches;
  if (keepsBits === undefined) return [...byBatches, ...byHeads(1)];
  const group = p.qHeads / p.kvHeads;
  const everySliceKeeps = (count: number) => {
    for (let first = 0; first < group; first += count) {
      if (!keepsBits.queryHeadsKeepBits(first, Math.min(count, group - first))) return false;
    }
    return true;
  };
  const byQueryHeads = leastCounts(group, (atLeast) => {
    let count = atLeast;
    while (count < group && !everySliceKeeps(count)) count++;
    return count;
  }).map((groupHeads) => ({ batches: 1, kvHeads: 1, groupHeads }));
  const byRows = leastCounts(p.qLen, (atLeast) => keepsBits.leastQueryRows(atLeast) || p.qLen)
    .map((rows) => ({ batches: 1, kvHeads: 1, groupHeads: 1, rows }));
  return [...byBatches, ...byHeads(1), ...byQueryHeads, ...byRows];
}

/** For each halving of `whole` (query heads of a group, or rows of a head), the least count from it up that keeps the bits (`least`: `whole` for none), below `whole`; decreasing. */
function leastCounts(whole: number, least: (atLeast: number) => number): number[] {
  const counts: number[] = [];
  for (const half of halvings(whole)) {
    const count = least(half);
    if (count < whole && (counts.length === 0 || count < counts[counts.length - 1])) counts.push(count);
  }
  return counts;
}

/**
 * Copies heads [h0, h0 + heads) of batches [b0, b0 + batches) of `data` (strides `s` in
 * `layout`, L rows of D floats per head), their rows [firstRow, firstRow + rows) (all L when not
 * given; fewer only for one head), into (`'in'`, by heap.writeFloatRuns), or out of (`'out'`, from
 * wasm memory into data, a Float32Array), the dense slice at byte `address` of `heap`.
 */
export function copySlice(heap: HeapViews, address: number, data: InputData, s: Strides, layout: Plan['layout'],
  c: TensorPart, L: number, D: number, direction: 'in' | 'out'): void {
  const firstRow = c.firstRow ?? 0, rows = c.rows ?? L;
  if (rows < L && c.heads > 1) throw new Error('sdpa-wasm: internal error: a slice of rows must have one head');
  // 'bhsd': one run of heads·rows·D floats per batch (rows < L only with one head, whose rows are consecutive).
  const runs = layout === 'bhsd' ? 1 : rows, runFloats = layout === 'bhsd' ? c.heads * rows * D : c.heads * D;
  // Run n: batch b0 + n / runs, row firstRow + n % runs; in the slice, n·runFloats floats from its start.
  const runStart = (n: number) => (c.b0 + Math.floor(n / runs)) * s.b + c.h0 * s.h + (firstRow + (n % runs)) * s.l;
  if (direction === 'in') {
    heap.writeFloatRuns(address, data, c.batches * runs, runFloats, runStart);
  } else {
    const at = address >>> 2;
    for (let n = 0; n < c.batches * runs; n++) data.set(heap.f32.subarray(at + n * runFloats, at + (n + 1) * runFloats), runStart(n));
  }
}

/** A part of a tensor copySlice() copies: heads [h0, h0 + heads) of batches [b0, b0 + batches), rows [firstRow, firstRow + rows) of each (all when not given). */
export interface TensorPart {
  b0: number;
  batches: number;
  h0: number;
  heads: number;
  firstRow?: number;
  rows?: number;
}

/** Slice c's part of the query-shaped tensors (Q, output, weights, log-sum-exp, their gradients): its query heads, their rows. */
export const queryPart = (c: Slice): TensorPart =>
  ({ b0: c.b0, batches: c.batches, h0: c.firstHead, heads: c.heads, firstRow: c.firstRow, rows: c.rows });

/** Slice c's part of K and V (and their gradients): its KV heads, all their keys. */
export const keyValuePart = (c: Slice): TensorPart => ({ b0: c.b0, batches: c.batches, h0: c.h0, heads: c.kvHeads });

/** Strides of the dense [B, Hq, Lq, D] arrays (weights with D = Lk, log-sum-exp with D = 1), as copySlice takes them. */
export const denseStrides = (p: Plan, D: number): Strides => layoutStrides('bhsd', p.qHeads, p.qLen, D);

/**
 * The mask elements a slice of `batches` batches, `heads` query heads and `rows` rows of each
 * (default Lq) reads, from its first (batch, head, row)'s: each (batch, head)'s rows and keys, the
 * mask's strides apart (0 where it broadcasts).
 */
export function maskSpan(p: Plan, batches: number, heads: number, rows = p.qLen): number {
  if (p.mask === null) return 0;
  const [sb, sh, sq, sk] = p.mask.strides;
  return (batches - 1) * sb + (heads - 1) * sh + (rows - 1) * sq + (p.kvLen - 1) * sk + 1;
}

/** Bytes of maskSpan() elements (the mask's whole block when the slice is the whole call). */
export function maskSpanBytes(p: Plan, batches: number, heads: number, rows = p.qLen): number {
  return p.mask === null ? 0 : maskSpan(p, batches, heads, rows) * maskElementBytes(p.mask.kind);
}

/**
 * Each slice's mask elements, copied into one block of maskSpanBytes() (at `address`): a copy
 * starts at the mask's element at the slice's first batch and head, and is skipped when the
 * block holds it already (slices that the mask broadcasts over read the same elements).
 */
export class SliceMasks {
  readonly #p: Plan;
  readonly #address: number;
  #copiedFrom = -1;

  constructor(p: Plan, address: number) {
    this.#p = p;
    this.#address = address;
  }

  /** Copies slice c's mask elements (unless held already); their address (0 without a mask). */
  place(heap: HeapViews, c: Slice): number {
    const mask = this.#p.mask;
    if (mask === null) return 0;
    const from = c.b0 * mask.strides[0] + c.firstHead * mask.strides[1] + c.firstRow * mask.strides[2];
    if (from !== this.#copiedFrom) {
      const span = mask.data.subarray(from, from + maskSpan(this.#p, c.batches, c.heads, c.rows));
      if (mask.kind === 'float') heap.writeFloats(this.#address, span as InputData);
      else heap.u8.set(span, this.#address);
      this.#copiedFrom = from;
    }
    return this.#address;
  }
}

/**
 * The slice problem of `shape` cut from `desc` (the whole call's): its counts and dense strides,
 * or with `keyValueInPlace` (a KV cache's storage, read where it is) K/V keep `desc`'s strides.
 * Its addresses (tensors, and sliceInputs()'s) are set per slice.
 */
export function sliceProblem(p: Plan, desc: ProblemDesc, shape: SliceShape, keyValueInPlace = false): ProblemDesc {
  const heads = shape.kvHeads * (shape.groupHeads ?? p.qHeads / p.kvHeads), rows = shape.rows ?? p.qLen;
  const q = layoutStrides(p.layout, heads, rows, p.headDim), o = layoutStrides(p.layout, heads, rows, p.valueDim);
  const slice = {
    ...desc, batch: shape.batches, qHeads: heads, kvHeads: shape.kvHeads, qLen: rows,
    qStrideB: q.b, qStrideH: q.h, qStrideL: q.l, oStrideB: o.b, oStrideH: o.h, oStrideL: o.l,
    // The mask keeps the whole call's strides (a slice's copy of it is a span of the whole), but
    // along an axis the slice has one of the stride is never used: 0, since the whole's may not
    // fit the block's int32 (a [2, 2, 32768, 32768] boolean mask's batch stride is 2^31, where
    // its slices of one batch fit).
    maskStrideB: shape.batches === 1 ? 0 : desc.maskStrideB,
    maskStrideH: heads === 1 ? 0 : desc.maskStrideH,
  };
  if (keyValueInPlace) return slice;
  const k = layoutStrides(p.layout, shape.kvHeads, p.kvLen, p.headDim), v = layoutStrides(p.layout, shape.kvHeads, p.kvLen, p.valueDim);
  return { ...slice, kStrideB: k.b, kStrideH: k.h, kStrideL: k.l, vStrideB: v.b, vStrideH: v.h, vStrideL: v.l };
}

/**
 * The problem of slice c: `sliceDesc` (made by sliceProblem for `shape`) or, for a smaller last
 * slice, one of its own; its small inputs' fields set (sliceInputs), its tensors' addresses as
 * sliceDesc's.
 */
export function problemOfSlice(p: Plan, desc: ProblemDesc, sliceDesc: ProblemDesc, shape: SliceShape, c: Slice,
  keyValueInPlace = false): ProblemDesc {
  const sameShape = c.batches === shape.batches && c.kvHeads === shape.kvHeads && c.heads === sliceDesc.qHeads &&
    c.rows === sliceDesc.qLen;
  const slice = sameShape ? sliceDesc
    : sliceProblem(p, sliceDesc, { ...c, groupHeads: c.heads / c.kvHeads }, keyValueInPlace);
  Object.assign(slice, sliceInputs(p, desc, c.b0, c.firstHead));
  return c.rows === p.qLen ? slice : Object.assign(slice, rowSliceInputs(p, c));
}

/**
 * A slice's fields for its small inputs, whole in wasm memory at `desc`'s addresses: moved to
 * its first batch b0 and query head firstHead (their strides stay), and the dropout mask's batch
 * and head bases. The mask's address moves the same way (a caller with the slice's own copy of
 * the mask sets it after).
 */
export function sliceInputs(p: Plan, desc: ProblemDesc, b0: number, firstHead: number) {
  return {
    mask: p.mask === null ? 0 : desc.mask + maskElementBytes(p.mask.kind) * (b0 * p.mask.strides[0] + firstHead * p.mask.strides[1]),
    causalOffsets: p.causalOffsets === null ? 0 : desc.causalOffsets + 4 * b0,
    keyLengths: p.keyLengths === null ? 0 : desc.keyLengths + 4 * b0,
    keyStarts: p.keyStarts === null ? 0 : desc.keyStarts + 4 * b0,
    sinks: p.sinks === null ? 0 : desc.sinks + 4 * firstHead,
    alibiSlopes: p.alibiSlopes === null ? 0 : desc.alibiSlopes + 4 * (b0 * p.alibiStrideB + firstHead),
    dropoutBatchBase: b0,
    dropoutHeadBase: firstHead,
  };
}

/**
 * A slice of one query head's rows [firstRow, firstRow + rows) (one batch): its row 0 is the
 * call's row firstRow, so its causal offset (one number: the batch's) is firstRow more, which
 * keeps each row's causal frontier, window and ALiBi distances, and its dropout mask's rows count
 * from firstRow (src/sdpa.h, query_rows_keep_bits). The mask's address is the caller's (SliceMasks).
 */
function rowSliceInputs(p: Plan, c: Slice) {
  return {
    causalOffsets: 0,
    causalOffset: (p.causalOffsets === null ? p.causalOffset : p.causalOffsets[c.b0]) + c.firstRow,
    dropoutRowBase: c.firstRow,
  };
}

/** The purpose a refusal of slices of `shape` names (MemoryAccount.refusal). */
export function slicePurpose(p: Plan, shape: SliceShape): string {
  if (shape.rows !== undefined && shape.rows < p.qLen) {
    return ` to run ${shape.rows === 1 ? 'one query row' : `${shape.rows} query rows`} of one query head at a time`;
  }
  const groupHeads = shape.groupHeads ?? p.qHeads / p.kvHeads;
  if (groupHeads < p.qHeads / p.kvHeads) {
    return ` to run ${groupHeads === 1 ? 'one query head' : `${groupHeads} query heads`} of one (batch, KV head) at a time`;
  }
  if (shape.kvHeads === 1 && shape.batches === 1) return ' to run one (batch, KV head) at a time';
  const batches = shape.batches === 1 ? 'one batch' : `${shape.batches} batches`;
  if (shape.kvHeads === p.kvHeads) return ` to run ${batches} at a time`;
  const heads = shape.kvHeads === 1 ? 'one KV head' : `${shape.kvHeads} KV heads`;
  return ` to run ${heads} of ${shape.batches === p.batch && p.batch > 1 ? 'every batch' : batches} at a time`;
}
