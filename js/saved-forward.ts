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
import { float32BitsOfHalves } from './halves.js';
import { bufferOf, byteOffsetOf, elementBytesOf, halfBitsOf, isFloat16Array, type TypedArray } from './typed-arrays.js';
import type { BackwardPlan, InputData, Plan } from './validate.js';
import type { VarlenPlan } from './varlen.js';

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

// MurmurHash3's (x86, 32-bit) word mixing: multiplies, rotations and an addition, so a change
// in any bit of a word reaches every bit of the hash (plain xor-multiply hashing, FNV, lets a
// word's high bits reach only the hash's high bits: two sign flips cancel).
// Math.imul is read once, here: inside Jest's test environment (its own global object), a
// `Math.imul` call in the loop took about 150 ns (2M words: 330 ms, against 19 ms through this
// constant and 2 ms in plain Node), which made every sdpa() with returnLogSumExp in a Jest test
// cost about a second per 2M floats hashed.
const imul = Math.imul;
const C1 = 0xcc9e2d51, C2 = 0x1b873593;
const rotl = (x: number, r: number) => (x << r) | (x >>> (32 - r));
const mixWord = (h: number, word: number) =>
  (imul(rotl(h ^ imul(rotl(imul(word, C1), 15), C2), 13), 5) + 0xe6546b64) | 0;
function finalMix(h: number): number {
  h = imul(h ^ (h >>> 16), 0x85ebca6b);
  h = imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/** The four lanes' starting values. */
const LANE_SEEDS: readonly [number, number, number, number] = [0x9747b28c, 0x3c6ef372, 0xa54ff53a, 0x510e527f];

/** The hash's last steps: `tail` (0-3 bytes as a word) into lane 1, the lanes and the byte count folded and finalised. */
function described(count: number, bytes: number, h0: number, h1: number, h2: number, h3: number, tail: number): string {
  h1 = mixWord(h1, tail);
  const hash = finalMix(mixWord(mixWord(mixWord(mixWord(finalMix(h0), finalMix(h1)), finalMix(h2)), finalMix(h3)), bytes));
  return `${count} elements, hash ${hash.toString(16).padStart(8, '0')}`;
}

/**
 * A 32-bit hash of the first `count` elements of a typed array, with the count: equal contents,
 * equal hashes (whatever the view's offset); other contents, another hash but with a chance of
 * about 2^-32. MurmurHash3's mixing over 32-bit words in four interleaved lanes (word n in lane
 * n % 4: four dependency chains at once), the last 0-3 bytes as one more word, then the lanes
 * and the byte count folded and finalised. Hashed for every sdpa() with returnLogSumExp and
 * sdpaBackward with saved: their inputs and results, O(N) beside the kernel's O(N²).
 */
export function contentsOf(view: TypedArray, count: number): string {
  const bytes = count * elementBytesOf(view);
  const offset = byteOffsetOf(view);
  // A byte mask may start anywhere: hashed from an aligned copy, so that its words are the same.
  const aligned = offset % 4 === 0 ? new Uint8Array(bufferOf(view), offset, bytes) : new Uint8Array(bufferOf(view), offset, bytes).slice();
  // (Counts by division, not by bitwise operators: an array of 4 GiB has 2^32 bytes.)
  const words = new Int32Array(aligned.buffer, aligned.byteOffset, Math.floor(bytes / 4));
  let [h0, h1, h2, h3] = LANE_SEEDS;
  const laned = words.length - (words.length % 4);  // the words the four lanes take; the rest go to lane 0
  // Each loop has its own index: in Chromium 156 one index shared by both loops (the second
  // continuing where the first stopped) made the first loop 5-10× slower (a page probe, 8 Mi
  // words: 70-240 ms against 8-16 ms).
  for (let n = 0; n < laned; n += 4) {
    h0 = mixWord(h0, words[n]);
    h1 = mixWord(h1, words[n + 1]);
    h2 = mixWord(h2, words[n + 2]);
    h3 = mixWord(h3, words[n + 3]);
  }
  for (let n = laned; n < words.length; n++) h0 = mixWord(h0, words[n]);
  let tail = 0;
  for (let b = bytes - 1; b >= words.length * 4; b--) tail = (tail << 8) | aligned[b];
  return described(count, bytes, h0, h1, h2, h3, tail);
}

/**
 * contentsOf() of the float32 values of the first `count` of `halves` (raw IEEE halves), without
 * making them: each word is looked up from its half (float32BitsOfHalves), so a Float16Array is
 * hashed as the Float32Array of its widened values would be, in one pass and no memory of 4
 * bytes an element (a 64 MiB copy for a 16 Mi-element input), where widening it first was a
 * second pass of the engine's element-by-element conversion.
 */
export function widenedContentsOf(halves: Uint16Array, count: number): string {
  const bits = float32BitsOfHalves();
  let [h0, h1, h2, h3] = LANE_SEEDS;
  const laned = count - (count % 4);  // as in contentsOf (an index per loop; 2^31 halves and more too)
  for (let n = 0; n < laned; n += 4) {
    h0 = mixWord(h0, bits[halves[n]]);
    h1 = mixWord(h1, bits[halves[n + 1]]);
    h2 = mixWord(h2, bits[halves[n + 2]]);
    h3 = mixWord(h3, bits[halves[n + 3]]);
  }
  for (let n = laned; n < count; n++) h0 = mixWord(h0, bits[halves[n]]);
  return described(count, 4 * count, h0, h1, h2, h3, 0);  // 4 bytes a value: no tail
}

/**
 * contentsOf an input's first `count` values as float32 (a Float16Array's widened, as the call
 * copies them in): the same values hash alike whichever of the two arrays held them, so a
 * backward given Float32Array inputs matches a forward given the same values as Float16Array.
 */
function valuesOf(data: InputData | Uint8Array, count: number): string {
  return isFloat16Array(data) ? widenedContentsOf(halfBitsOf(data), count) : contentsOf(data, count);
}

/** Per-batch values as the kernel uses them: `values` if given, else `fill` for every batch. */
const perBatch = (values: Int32Array | null, B: number, fill: number) =>
  `[${(values === null ? new Array<number>(B).fill(fill) : Array.from(values)).join(', ')}]`;

/**
 * The inputs' part of a forward call's record (an sdpa() plan, or the forward of an
 * sdpaBackward plan), with its arrays as the call reads them: taken before the call runs, as
 * `out` may be one of them. Options as the kernel uses them (scale and softcap in float32,
 * per-batch offsets and key lengths spelt out), so that equivalent ways of writing them agree.
 */
export function inputsRecord(p: Plan | VarlenPlan, key: InputData, value: InputData): RecordEntry[] {
  const kv = p.batch * p.kvHeads * p.kvLen;
  const mask = p.mask === null ? 'none'
    : `${p.mask.kind}, strides over [B, Hq, Lq, Lk] [${p.mask.strides.join(', ')}], ${valuesOf(p.mask.data, p.mask.size)}`;
  // Packed sequences (sdpaVarlen): one batch of Tq rows and Tk keys, cut where the starts say.
  const packed = 'cuSeqlensQ' in p;
  return [
    ['the forward call', packed ? 'sdpaVarlen()' : 'sdpa()', false],
    ['cuSeqlensQ', packed ? contentsOf(p.cuSeqlensQ, p.cuSeqlensQ.length) : 'none', packed],
    ['cuSeqlensK', packed ? contentsOf(p.cuSeqlensK, p.cuSeqlensK.length) : 'none', packed],
    ['the shapes', `B ${p.batch}, Hq ${p.qHeads}, Hkv ${p.kvHeads}, Lq ${p.qLen}, Lk ${p.kvLen}, E ${p.headDim}, Ev ${p.valueDim}`, false],
    ['layout', `'${p.layout}'`, false],
    ['scale (in float32)', String(Math.fround(p.scale)), false],
    ['softcap (in float32)', String(Math.fround(p.softcap)), false],
    ['isCausal', String(p.causal), false],
    // Before the offset, which counts without isCausal only with ALiBi: a call with slopes and
    // one without differ first in these. Slopes that are all 0 are no ALiBi (the same bits).
    ['alibiSlopes', alibiRecord(p), false],
    ['causalOffset', p.causal || hasAlibi(p) ? perBatch(p.causalOffsets, p.batch, p.causalOffset) : 'none', false],
    ['slidingWindow', p.slidingWindow === 0 ? 'none' : String(p.slidingWindow), false],
    ['keyLengths', perBatch(p.keyLengths, p.batch, p.kvLen), false],
    ['keyStarts', perBatch(p.keyStarts, p.batch, 0), false],
    // Sinks that are all -Infinity are no sinks (the same bits).
    ['sinks', p.sinks === null || p.sinks.every((x) => x === -Infinity) ? 'none' : `[${Array.from(p.sinks).join(', ')}]`, false],
    ['dropout', p.dropoutThreshold === 0 ? 'none'
      : `dropoutP ${p.dropoutThreshold}/2^32 (round(dropoutP·2^32)), dropoutSeed ${p.dropoutSeed}`, false],
    ['attnMask', mask, false],
    ['query.data', valuesOf(p.queryData, p.batch * p.qHeads * p.qLen * p.headDim), true],
    ['key.data', valuesOf(key, kv * p.headDim), true],
    ['value.data', valuesOf(value, kv * p.valueDim), true],
  ];
}

/** Whether the call has ALiBi slopes, not all 0 (all 0 give the bits of none). */
const hasAlibi = (p: Plan | VarlenPlan) => p.alibiSlopes !== null && p.alibiSlopes.some((x) => x !== 0);

/** ALiBi slopes spelt out per batch (or sequence), so that [Hq] and the same row repeated [B, Hq] agree. */
function alibiRecord(p: Plan | VarlenPlan): string {
  const slopes = p.alibiSlopes;
  if (slopes === null || !hasAlibi(p)) return 'none';
  const rows = p.alibiStrideB === 0 ? 1 : slopes.length / p.qHeads;
  const perRow = Array.from({ length: rows }, (_, b) => `[${Array.from(slopes.subarray(b * p.qHeads, (b + 1) * p.qHeads)).join(', ')}]`);
  return rows === 1 ? perRow[0] : perRow.every((r) => r === perRow[0]) ? perRow[0] : `[${perRow.join(', ')}]`;
}

/** The results' part of a forward call's record: its output and log-sum-exp. */
export function resultsRecord(p: Plan, output: Float32Array, logSumExp: Float32Array): RecordEntry[] {
  return [
    ['options.saved.output.data', contentsOf(output, p.outputSize), true],
    ['options.saved.logSumExp.data', contentsOf(logSumExp, p.lseSize), true],
  ];
}

/**
 * sdpaBackward's check of `saved` against the record of the sdpa() call that returned its
 * logSumExp (none for a logSumExp sdpa() did not return): a RangeError naming the first difference.
 */
export function checkSaved(fn: string, bp: BackwardPlan): void {
  const { forward: f, saved } = bp;
  const recorded = saved === null ? undefined : records.get(saved.given);
  if (saved === null || recorded === undefined) return;
  const current = [...inputsRecord(f, f.keyData, f.valueData), ...resultsRecord(f, saved.output, saved.logSumExp)];
  const forward = recorded[0][1];  // 'sdpa()' or 'sdpaVarlen()': the call that returned saved
  const wanted = current[0][1];     // the forward of this backward call
  for (let n = 0; n < recorded.length; n++) {
    const [what, was, contents] = recorded[n];
    const now = current[n][1];
    if (was === now) continue;
    const difference = contents
      ? `${what} holds other values than in the ${forward} call that returned options.saved (${was}; now ${now}): changed since, or another array`
      : `${what} differs from the ${forward} call that returned options.saved: ${was} there, ${now} here`;
    throw new RangeError(`${fn}: options.saved is not this call's forward: ${difference}. ` +
      `saved must be the output and logSumExp of ${wanted} with the same inputs and options, unchanged since ` +
      '(or leave saved out: the forward is then recomputed)');
  }
}
