// Whether sdpaBackward's options.saved comes from the forward it stands for.
//
// The backward reads `saved` (the output and log-sum-exp of sdpa(..., { returnLogSumExp: true }))
// instead of recomputing that forward. From another call (other options, other inputs, or the
// same arrays changed since) they give gradients that are wrong, with nothing to show it. So
// sdpa() records what made each logSumExp array it returns: the problem (shapes, layout and
// every score option) and a 32-bit hash of each array's contents, its results' included. An
// sdpaBackward given that array checks its own call against the record and refuses the first
// difference with a RangeError. A logSumExp array that sdpa() did not return (a copy, a slice,
// one read back from storage) has no record and is not checked.
//
// The worker carries records across: its results and the `saved` it is sent are copies, so the
// worker sends a forward's record with the result, the calling side keeps it for the array it
// returns, and sends it back with a backward call that passes that array.
import { bufferOf, byteOffsetOf, elementBytesOf, type TypedArray } from './typed-arrays.js';
import type { Plan } from './validate.js';

/** One fact of a forward call: its name in messages, its value, and whether it is an array's contents (a hash). */
export type RecordEntry = readonly [what: string, value: string, contents: boolean];
/** What made one sdpa() call's results: its problem and its arrays' contents, in a fixed order. */
export type ForwardRecord = readonly RecordEntry[];

/** logSumExp arrays → the record of the call that returned them (or of the one whose copy they are). */
const records = new WeakMap<TypedArray, ForwardRecord>();

export const remember = (logSumExp: TypedArray, record: ForwardRecord): void => void records.set(logSumExp, record);
export const recalled = (array: unknown): ForwardRecord | undefined => records.get(array as TypedArray);

/** The record of a copy is the original's (Taker.copy: the worker's calling side). */
export function carryRecord(from: TypedArray, to: TypedArray): void {
  const record = records.get(from);
  if (record !== undefined) records.set(to, record);
}

const FNV_PRIME = 0x01000193;

/**
 * A 32-bit hash of the first `count` elements of a typed array, with the count: equal contents,
 * equal hashes; other contents, another hash but with a chance of 2^-32. FNV-1a over 32-bit
 * words in four interleaved lanes (word n in lane n % 4: four multiply chains at once, about
 * 4x one chain's speed), then the byte tail, then the lanes folded together. Hashed for every
 * sdpa() with returnLogSumExp and sdpaBackward with saved: its inputs and results, O(N) beside
 * the kernel's O(N²).
 */
function contentsOf(view: TypedArray, count: number): string {
  const bytes = count * elementBytesOf(view);
  const offset = byteOffsetOf(view);
  const words = offset % 4 === 0 ? new Int32Array(bufferOf(view), offset, bytes >>> 2) : new Int32Array(0);
  let h0 = 0x811c9dc5, h1 = 0x050c5d1f, h2 = 0x2b3f6e7a, h3 = 0x6a09e667;
  let n = 0;
  for (; n + 4 <= words.length; n += 4) {
    h0 = Math.imul(h0 ^ words[n], FNV_PRIME);
    h1 = Math.imul(h1 ^ words[n + 1], FNV_PRIME);
    h2 = Math.imul(h2 ^ words[n + 2], FNV_PRIME);
    h3 = Math.imul(h3 ^ words[n + 3], FNV_PRIME);
  }
  for (; n < words.length; n++) h0 = Math.imul(h0 ^ words[n], FNV_PRIME);
  const tail = new Uint8Array(bufferOf(view), offset, bytes);  // a byte mask's tail, or all of an unaligned view
  for (let b = n * 4; b < bytes; b++) h1 = Math.imul(h1 ^ tail[b], FNV_PRIME);
  const hash = Math.imul(Math.imul(Math.imul(h0 ^ h1, FNV_PRIME) ^ h2, FNV_PRIME) ^ h3, FNV_PRIME);
  return `${count} elements, hash ${(hash >>> 0).toString(16).padStart(8, '0')}`;
}

const perBatch = (x: Int32Array | null) => (x === null ? 'none' : `[${Array.from(x).join(', ')}]`);

/**
 * The record of a checked forward call (an sdpa() plan, or the forward of an sdpaBackward
 * plan) with its inputs as the call reads them and its output and log-sum-exp.
 */
export function recordOf(p: Plan, key: Float32Array, value: Float32Array, output: Float32Array, logSumExp: Float32Array): ForwardRecord {
  const kv = p.batch * p.kvHeads * p.kvLen;
  const mask = p.mask === null ? 'none'
    : `${p.mask.kind}, strides over [B, Hq, Lq, Lk] [${p.mask.strides.join(', ')}], ${contentsOf(p.mask.data, p.mask.size)}`;
  return [
    ['the shapes', `B ${p.batch}, Hq ${p.qHeads}, Hkv ${p.kvHeads}, Lq ${p.qLen}, Lk ${p.kvLen}, E ${p.headDim}, Ev ${p.valueDim}`, false],
    ['layout', `'${p.layout}'`, false],
    ['scale', String(p.scale), false],
    ['softcap', String(p.softcap), false],
    ['isCausal', String(p.causal), false],
    ['causalOffset', p.causal ? (p.causalOffsets !== null ? perBatch(p.causalOffsets) : String(p.causalOffset)) : 'none', false],
    ['keyLengths', perBatch(p.keyLengths), false],
    ['attnMask', mask, false],
    ['query.data', contentsOf(p.queryData, p.batch * p.qHeads * p.qLen * p.headDim), true],
    ['key.data', contentsOf(key, kv * p.headDim), true],
    ['value.data', contentsOf(value, kv * p.valueDim), true],
    ['options.saved.output.data', contentsOf(output, p.outputSize), true],
    ['options.saved.logSumExp.data', contentsOf(logSumExp, p.lseSize), true],
  ];
}

/**
 * sdpaBackward's check of `saved` against the record of the sdpa() call that returned its
 * logSumExp: a RangeError naming the first difference.
 */
export function checkSaved(fn: string, recorded: ForwardRecord, current: ForwardRecord): void {
  for (let n = 0; n < recorded.length; n++) {
    const [what, was, contents] = recorded[n];
    const now = current[n][1];
    if (was === now) continue;
    const difference = contents
      ? `${what} holds other values than in the sdpa() call that returned options.saved (${was}; now ${now}): changed since, or another array`
      : `${what} differs from the sdpa() call that returned options.saved: ${was} there, ${now} here`;
    throw new RangeError(`${fn}: options.saved is not this call's forward: ${difference}. ` +
      'saved must be the output and logSumExp of sdpa() with the same inputs and options, unchanged since ' +
      '(or leave saved out: the forward is then recomputed)');
  }
}
