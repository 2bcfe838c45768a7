// The bad-input cases of sdpa(), shared by the direct API's tests (tests/node/errors.test.mjs)
// and the worker's (tests/node/worker.test.mjs, which expects the same class and message).
// Each case: [description, call, error class, patterns the message must match]; `call` calls
// api.sdpa() and returns what it returns (a promise for the worker).
import { randomTensor } from '../node/reference.mjs';

// A valid problem the cases start from: B = 2, Hq = 4, Hkv = 2, Lq = 5, Lk = 7, E = 3, Ev = 6.
export const B = 2, Hq = 4, Hkv = 2, Lq = 5, Lk = 7, E = 3, Ev = 6;
export const q = () => randomTensor([B, Hq, Lq, E], 1);
export const k = () => randomTensor([B, Hkv, Lk, E], 2);
export const v = () => randomTensor([B, Hkv, Lk, Ev], 3);
const t = (data, dims) => ({ data, dims });
const esc = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
export const has = (s) => new RegExp(esc(s));

/** The cases, calling `api.sdpa(query, key, value, options)`. */
export function sdpaErrorCases(api) {
  // [description, call, error class, patterns the message must match]
  return [
    // Missing tensors and wrong kinds of data.
    ['query missing', () => api.sdpa(undefined, k(), v()), TypeError, [/query/, /got undefined/]],
    ['key null', () => api.sdpa(q(), null, v()), TypeError, [/key must be a tensor/, /got null/]],
    ['value missing (two arguments)', () => api.sdpa(q(), k()), TypeError, [/value must be a tensor/, /got undefined/]],
    ['query a number', () => api.sdpa(5, k(), v()), TypeError, [/query must be a tensor/, /got 5/]],
    ['key a bare Float32Array (its .data)', () => api.sdpa(q(), k().data, v()), TypeError,
      [/key must be a tensor/, has(`got Float32Array(${k().data.length}), a bare array: pass it as { data, dims }`)]],
    ['query.data a plain array', () => api.sdpa(t(Array.from(q().data), [B, Hq, Lq, E]), k(), v()), TypeError,
      [/query\.data/, /Float32Array/, has(`Array(${B * Hq * Lq * E})`)]],
    ['key.data a Float64Array', () => api.sdpa(q(), t(Float64Array.from(k().data), [B, Hkv, Lk, E]), v()), TypeError,
      [/key\.data/, /must be a Float32Array/, has(`Float64Array(${B * Hkv * Lk * E})`)]],
    ['value.data missing', () => api.sdpa(q(), k(), { dims: [B, Hkv, Lk, Ev] }), TypeError, [/value\.data/, /got undefined/]],

    // dims.
    ['query.dims a string', () => api.sdpa(t(q().data, '2,4,5,3'), k(), v()), TypeError, [/query\.dims/, /array/, /"2,4,5,3"/]],
    ['key.dims missing', () => api.sdpa(q(), t(k().data, undefined), v()), TypeError, [/key\.dims/, /got undefined/]],
    ['key.dims a typed array', () => api.sdpa(q(), t(k().data, new Int32Array([B, Hkv, Lk, E])), v()), TypeError,
      [/key\.dims/, /Int32Array/]],
    ['key.dims with a 0', () => api.sdpa(q(), t(new Float32Array(0), [B, 0, Lk, E]), v()), RangeError,
      [/key\.dims\[1\]/, /positive integer/, /got 0/, has(`[${B}, 0, ${Lk}, ${E}]`)]],
    ['value.dims negative', () => api.sdpa(q(), k(), t(v().data, [B, Hkv, -Lk, -Ev])), RangeError,
      [/value\.dims\[2\]/, /positive integer/, has(`got ${-Lk}`)]],
    ['query.dims non-integer', () => api.sdpa(t(q().data, [B, Hq, Lq, 2.5]), k(), v()), RangeError,
      [/query\.dims\[3\]/, /got 2\.5/]],
    ['query.dims with a hole (a sparse array)', () => api.sdpa(t(q().data, [B, , Lq, E]), k(), v()), TypeError,
      [/query\.dims\[1\] must be a number/, /got undefined/, has(`[${B}, undefined, ${Lq}, ${E}]`)]],
    ['query.dims NaN', () => api.sdpa(t(q().data, [NaN, Hq, Lq, E]), k(), v()), RangeError, [/query\.dims\[0\]/, /got NaN/]],
    ['query.data length != product of dims', () => api.sdpa(t(q().data.subarray(1), [B, Hq, Lq, E]), k(), v()), RangeError,
      [/query\.data\.length/, has(`= ${B * Hq * Lq * E}`), has(`got ${B * Hq * Lq * E - 1}`)]],
    ['value.data longer than dims', () => api.sdpa(q(), k(), t(new Float32Array(B * Hkv * Lk * Ev + 6), [B, Hkv, Lk, Ev])), RangeError,
      [/value\.data\.length/, has(`${B * Hkv * Lk * Ev}`), has(`got ${B * Hkv * Lk * Ev + 6}`)]],
    ['query rank 1', () => api.sdpa(t(new Float32Array(3), [3]), k(), v()), RangeError, [/query\.dims/, /rank 2\.\.4/, /rank 1/]],
    ['key rank 5', () => api.sdpa(q(), t(k().data, [1, B, Hkv, Lk, E]), v()), RangeError, [/key\.dims/, /rank 2\.\.4/, /rank 5/]],
    ['value rank 0', () => api.sdpa(q(), k(), t(new Float32Array(1), [])), RangeError, [/value\.dims/, /rank 0/]],

    // Shapes that do not fit together.
    ['E of key != E of query', () => api.sdpa(q(), randomTensor([B, Hkv, Lk, E + 1], 4), v()), RangeError,
      [/key\.dims/, /head size E/, has(`= ${E}`), has(`got ${E + 1}`)]],
    ['Lk of value != Lk of key', () => api.sdpa(q(), k(), randomTensor([B, Hkv, Lk + 2, Ev], 5)), RangeError,
      [/value\.dims/, /Lk/, has(`= ${Lk}`), has(`got ${Lk + 2}`)]],
    ['B of key != B of query', () => api.sdpa(q(), randomTensor([B + 1, Hkv, Lk, E], 6), randomTensor([B + 1, Hkv, Lk, Ev], 7)), RangeError,
      [/key\.dims/, /batch B/, has(`= ${B}`), has(`got ${B + 1}`)]],
    ['B of value != B of query', () => api.sdpa(q(), k(), randomTensor([1, Hkv, Lk, Ev], 7)), RangeError,
      [/value\.dims/, /batch B/, has(`= ${B}`), /got 1/]],
    ['Hkv of value != Hkv of key', () => api.sdpa(q(), k(), randomTensor([B, 1, Lk, Ev], 8)), RangeError,
      [/value\.dims/, /Hkv/, has(`= ${Hkv}`), /got 1/]],
    ['Hq % Hkv != 0', () => api.sdpa(q(), randomTensor([B, 3, Lk, E], 9), randomTensor([B, 3, Lk, Ev], 10)), RangeError,
      [/Hq = 4/, /Hkv = 3/, /multiple/]],
    ["bshd: a bhsd key read as [B, L, H, E]", () => api.sdpa(randomTensor([B, Lq, Hq, E], 11), randomTensor([B, Hkv, Lk, E], 12),
      randomTensor([B, Lk, Hkv, Ev], 13), { layout: 'bshd' }), RangeError, [/value\.dims/, /\[B, L, H, E\]/]],

    // attnMask.
    ['mask not broadcastable (Lk)', () => api.sdpa(q(), k(), v(), { attnMask: t(new Float32Array(Lk + 1), [Lk + 1]) }), RangeError,
      [/options\.attnMask\.dims/, has(`[${Lk + 1}]`), has(`[${B}, ${Hq}, ${Lq}, ${Lk}]`), /axis Lk/, has(`got ${Lk + 1}`)]],
    ['mask not broadcastable (Hkv heads instead of Hq)', () => api.sdpa(q(), k(), v(), { attnMask: t(new Uint8Array(Hkv * Lq * Lk), [Hkv, Lq, Lk]) }), RangeError,
      [/options\.attnMask\.dims/, /axis Hq/, has(`must be 1 or ${Hq}`), has(`got ${Hkv}`)]],
    ['mask not broadcastable (B)', () => api.sdpa(q(), k(), v(), { attnMask: t(new Float32Array(3 * Lk), [3, 1, 1, Lk]) }), RangeError,
      [/options\.attnMask\.dims/, /axis B/, /got 3/]],
    ['mask rank 5', () => api.sdpa(q(), k(), v(), { attnMask: t(new Float32Array(Lk), [1, 1, 1, 1, Lk]) }), RangeError,
      [/options\.attnMask\.dims/, /rank 5/]],
    ['mask data length != dims', () => api.sdpa(q(), k(), v(), { attnMask: t(new Float32Array(Lk - 1), [Lk]) }), RangeError,
      [/options\.attnMask\.data\.length/, has(`= ${Lk}`), has(`got ${Lk - 1}`)]],
    ['mask Int8Array', () => api.sdpa(q(), k(), v(), { attnMask: t(new Int8Array(Lk), [Lk]) }), TypeError,
      [/options\.attnMask\.data/, /Float32Array/, /Uint8Array/, has(`Int8Array(${Lk})`)]],
    ['mask plain array', () => api.sdpa(q(), k(), v(), { attnMask: t(new Array(Lk).fill(0), [Lk]) }), TypeError,
      [/options\.attnMask\.data/, has(`Array(${Lk})`)]],
    ['mask Float64Array', () => api.sdpa(q(), k(), v(), { attnMask: t(new Float64Array(Lk), [Lk]) }), TypeError,
      [/options\.attnMask\.data/, has(`Float64Array(${Lk})`)]],
    ['mask Uint8ClampedArray', () => api.sdpa(q(), k(), v(), { attnMask: t(new Uint8ClampedArray(Lk), [Lk]) }), TypeError,
      [/options\.attnMask\.data/, has(`Uint8ClampedArray(${Lk})`)]],
    ['mask null', () => api.sdpa(q(), k(), v(), { attnMask: null }), TypeError, [/options\.attnMask/, /got null/]],
    ['mask a bare typed array', () => api.sdpa(q(), k(), v(), { attnMask: new Float32Array(Lk) }), TypeError,
      [/options\.attnMask must be a tensor/, has(`got Float32Array(${Lk}), a bare array: pass it as { data, dims }`)]],

    // keyLengths.
    ['keyLengths of wrong length', () => api.sdpa(q(), k(), v(), { keyLengths: new Int32Array([Lk, Lk, Lk]) }), RangeError,
      [/options\.keyLengths/, has(`length B = ${B}`), /got 3/]],
    ['keyLengths a plain array', () => api.sdpa(q(), k(), v(), { keyLengths: [Lk, Lk] }), TypeError,
      [/options\.keyLengths/, /Int32Array/, /Array\(2\)/]],
    ['keyLengths a Uint32Array', () => api.sdpa(q(), k(), v(), { keyLengths: new Uint32Array([Lk, Lk]) }), TypeError,
      [/options\.keyLengths/, /Uint32Array\(2\)/]],
    ['keyLengths value -1', () => api.sdpa(q(), k(), v(), { keyLengths: new Int32Array([Lk, -1]) }), RangeError,
      [/options\.keyLengths\[1\]/, has(`[0, Lk = ${Lk}]`), /got -1/]],
    ['keyLengths value Lk + 1', () => api.sdpa(q(), k(), v(), { keyLengths: new Int32Array([Lk + 1, 0]) }), RangeError,
      [/options\.keyLengths\[0\]/, has(`Lk = ${Lk}`), has(`got ${Lk + 1}`)]],
    // keyStarts: as keyLengths.
    ['keyStarts of wrong length', () => api.sdpa(q(), k(), v(), { keyStarts: new Int32Array([0]) }), RangeError,
      [/options\.keyStarts must have length/, has(`length B = ${B}`), /got 1$/]],
    ['keyStarts a plain array', () => api.sdpa(q(), k(), v(), { keyStarts: [0, 0] }), TypeError,
      [/options\.keyStarts must be an Int32Array/, /Array\(2\)/]],
    ['keyStarts value -1', () => api.sdpa(q(), k(), v(), { keyStarts: new Int32Array([0, -1]) }), RangeError,
      [/options\.keyStarts\[1\]/, has(`[0, Lk = ${Lk}]`), /got -1$/]],
    ['keyStarts value Lk + 1', () => api.sdpa(q(), k(), v(), { keyStarts: new Int32Array([Lk + 1, 0]) }), RangeError,
      [/options\.keyStarts\[0\]/, has(`got ${Lk + 1}`)]],

    // sinks: a Float32Array of Hq logits, each finite or -Infinity.
    ['sinks of wrong length', () => api.sdpa(q(), k(), v(), { sinks: new Float32Array(Hkv) }), RangeError,
      [/options\.sinks must have length/, has(`length Hq = ${Hq}`), has(`got ${Hkv}`)]],
    ['sinks a plain array', () => api.sdpa(q(), k(), v(), { sinks: [0, 0, 0, 0] }), TypeError,
      [/options\.sinks must be a Float32Array/, has(`length Hq = ${Hq}`), /Array\(4\)/]],
    ['sinks a Float64Array', () => api.sdpa(q(), k(), v(), { sinks: new Float64Array(Hq) }), TypeError,
      [/options\.sinks must be a Float32Array/, /Float64Array\(4\)/]],
    ['sinks holding NaN', () => api.sdpa(q(), k(), v(), { sinks: Float32Array.of(0, 1, NaN, 2) }), RangeError,
      [/options\.sinks\[2\] must be a finite number, or -Infinity for no sink/, /got NaN$/]],
    ['sinks holding +Infinity', () => api.sdpa(q(), k(), v(), { sinks: Float32Array.of(Infinity, 1, 0, 2) }), RangeError,
      [/options\.sinks\[0\]/, /got Infinity$/]],
    // alibiSlopes: a Float32Array of Hq or B·Hq slopes, each in [0, 2^64].
    ['alibiSlopes of wrong length', () => api.sdpa(q(), k(), v(), { alibiSlopes: new Float32Array(Hq + 1) }), RangeError,
      [/^sdpa: options\.alibiSlopes must have length /, has(`Hq = ${Hq} or B·Hq = ${B * Hq}`), has(`got ${Hq + 1}`)]],
    ['alibiSlopes a plain array', () => api.sdpa(q(), k(), v(), { alibiSlopes: [0.5, 0.25, 0.125, 0.0625] }), TypeError,
      [/options\.alibiSlopes must be a Float32Array/, has(`length Hq = ${Hq} or B·Hq = ${B * Hq}`), /one ALiBi slope per query head/, /Array\(4\)/]],
    ['alibiSlopes a Float64Array', () => api.sdpa(q(), k(), v(), { alibiSlopes: new Float64Array(Hq) }), TypeError,
      [/options\.alibiSlopes must be a Float32Array/, /Float64Array\(4\)/]],
    ['alibiSlopes negative', () => api.sdpa(q(), k(), v(), { alibiSlopes: Float32Array.of(0.5, -0.25, 0, 1) }), RangeError,
      [/^sdpa: options\.alibiSlopes\[1\] must be a number in \[0, 2\^64\]/, /-slope·\|i \+ causalOffset - j\|/, /got -0\.25$/]],
    ['alibiSlopes holding NaN in the second batch\'s row', () => api.sdpa(q(), k(), v(), {
      alibiSlopes: Float32Array.of(0.5, 0.25, 0, 1, 0.5, 0.25, NaN, 1) }), RangeError, [/options\.alibiSlopes\[6\]/, /got NaN$/]],
    ['alibiSlopes holding Infinity', () => api.sdpa(q(), k(), v(), { alibiSlopes: Float32Array.of(Infinity, 1, 0, 2) }), RangeError,
      [/options\.alibiSlopes\[0\]/, /got Infinity$/]],
    ['alibiSlopes above 2^64', () => api.sdpa(q(), k(), v(), { alibiSlopes: Float32Array.of(2 ** 65, 1, 0, 2) }), RangeError,
      [/options\.alibiSlopes\[0\]/, has(`got ${2 ** 65}`)]],
    ['causalOffset beyond int32 with alibiSlopes', () => api.sdpa(q(), k(), v(), { alibiSlopes: new Float32Array(Hq), causalOffset: 2 ** 31 }), RangeError,
      [/^sdpa: options\.causalOffset must be an integer in \[-2\^31, 2\^31 - 1\] with options\.alibiSlopes/, has(`got ${2 ** 31}`)]],

    // causalOffset / isCausal.
    ['causalOffset without isCausal', () => api.sdpa(q(), k(), v(), { causalOffset: 2 }), TypeError,
      [/^sdpa: options\.causalOffset is only meaningful with options\.isCausal: true or options\.alibiSlopes, got options\.isCausal undefined \(default false\)$/]],
    ['causalOffset with isCausal false', () => api.sdpa(q(), k(), v(), { isCausal: false, causalOffset: 2 }), TypeError,
      [/options\.causalOffset is only meaningful/, /got options\.isCausal false$/]],
    ['causalOffset Int32Array of wrong length', () => api.sdpa(q(), k(), v(), { isCausal: true, causalOffset: new Int32Array(B + 1) }), RangeError,
      [/options\.causalOffset/, has(`length B = ${B}`), has(`got length ${B + 1}`)]],
    ['causalOffset 1.5', () => api.sdpa(q(), k(), v(), { isCausal: true, causalOffset: 1.5 }), RangeError,
      [/options\.causalOffset/, /integer/, /got 1\.5/]],
    ['causalOffset NaN', () => api.sdpa(q(), k(), v(), { isCausal: true, causalOffset: NaN }), RangeError,
      [/options\.causalOffset/, /got NaN/]],
    ['causalOffset Infinity', () => api.sdpa(q(), k(), v(), { isCausal: true, causalOffset: Infinity }), RangeError,
      [/options\.causalOffset/, /got Infinity/]],
    // slidingWindow: a positive integer up to 2^30, with isCausal.
    ['slidingWindow without isCausal', () => api.sdpa(q(), k(), v(), { slidingWindow: 3 }), TypeError,
      [/^sdpa: options\.slidingWindow is only meaningful with options\.isCausal: true .*got options\.isCausal undefined \(default false\)$/]],
    ['slidingWindow 0', () => api.sdpa(q(), k(), v(), { isCausal: true, slidingWindow: 0 }), RangeError,
      [/options\.slidingWindow must be an integer in \[1, 2\^30\]/, /omit it for no window/, /got 0$/]],
    ['slidingWindow -2', () => api.sdpa(q(), k(), v(), { isCausal: true, slidingWindow: -2 }), RangeError,
      [/options\.slidingWindow/, /got -2$/]],
    ['slidingWindow 2.5', () => api.sdpa(q(), k(), v(), { isCausal: true, slidingWindow: 2.5 }), RangeError,
      [/options\.slidingWindow/, /got 2\.5$/]],
    ['slidingWindow Infinity', () => api.sdpa(q(), k(), v(), { isCausal: true, slidingWindow: Infinity }), RangeError,
      [/options\.slidingWindow/, /got Infinity$/]],
    ['slidingWindow 2^30 + 1', () => api.sdpa(q(), k(), v(), { isCausal: true, slidingWindow: 2 ** 30 + 1 }), RangeError,
      [/options\.slidingWindow/, /got 1073741825$/]],
    ['slidingWindow a string', () => api.sdpa(q(), k(), v(), { isCausal: true, slidingWindow: '4' }), TypeError,
      [/options\.slidingWindow must be an integer/, /"4"/]],
    ['causalOffset a string', () => api.sdpa(q(), k(), v(), { isCausal: true, causalOffset: '1' }), TypeError,
      [/options\.causalOffset/, /"1"/]],
    ['causalOffset a plain array', () => api.sdpa(q(), k(), v(), { isCausal: true, causalOffset: [0, 0] }), TypeError,
      [/options\.causalOffset/, /Int32Array/, /Array\(2\)/]],
    ['causalOffset without isCausal', () => api.sdpa(q(), k(), v(), { causalOffset: 2 }), TypeError,
      [/options\.causalOffset/, /isCausal/]],
    ['causalOffset with isCausal: false', () => api.sdpa(q(), k(), v(), { isCausal: false, causalOffset: 0 }), TypeError,
      [/options\.causalOffset/, /isCausal/]],
    ['isCausal a number', () => api.sdpa(q(), k(), v(), { isCausal: 1 }), TypeError, [/options\.isCausal/, /boolean/, /got 1/]],
    ['returnWeights a string', () => api.sdpa(q(), k(), v(), { returnWeights: 'yes' }), TypeError,
      [/options\.returnWeights/, /boolean/, /"yes"/]],

    // scale and softcap.
    ['scale NaN', () => api.sdpa(q(), k(), v(), { scale: NaN }), RangeError, [/options\.scale/, /finite/, /got NaN/]],
    ['scale Infinity', () => api.sdpa(q(), k(), v(), { scale: Infinity }), RangeError, [/options\.scale/, /got Infinity/]],
    ['scale -Infinity', () => api.sdpa(q(), k(), v(), { scale: -Infinity }), RangeError, [/options\.scale/, /got -Infinity/]],
    ['scale a string', () => api.sdpa(q(), k(), v(), { scale: '0.5' }), TypeError, [/options\.scale/, /number/, /"0\.5"/]],
    ['scale null', () => api.sdpa(q(), k(), v(), { scale: null }), TypeError, [/options\.scale/, /got null/]],
    ['softcap 0', () => api.sdpa(q(), k(), v(), { softcap: 0 }), RangeError, [/options\.softcap/, /> 0/, /got 0/]],
    ['softcap negative', () => api.sdpa(q(), k(), v(), { softcap: -2 }), RangeError, [/options\.softcap/, /got -2/]],
    ['softcap NaN', () => api.sdpa(q(), k(), v(), { softcap: NaN }), RangeError, [/options\.softcap/, /got NaN/]],
    ['softcap Infinity', () => api.sdpa(q(), k(), v(), { softcap: Infinity }), RangeError, [/options\.softcap/, /got Infinity/]],
    // Finite in JavaScript, not in float32 (the kernel's type): Infinity there, or a softcap of 0 ("off").
    ['scale beyond float32', () => api.sdpa(q(), k(), v(), { scale: 1e39 }), RangeError,
      [/options\.scale/, /float32's range/, /got 1e\+39/]],
    ['softcap beyond float32', () => api.sdpa(q(), k(), v(), { softcap: 1e39 }), RangeError,
      [/options\.softcap/, /float32's range/, /got 1e\+39/]],
    ['softcap below float32\'s least positive number', () => api.sdpa(q(), k(), v(), { softcap: 1e-46 }), RangeError,
      [/options\.softcap/, /float32's range/, /1\.401298464324817e-45/, /got 1e-46/]],
    ['softcap a string', () => api.sdpa(q(), k(), v(), { softcap: '5' }), TypeError, [/options\.softcap/, /"5"/]],

    // out.
    ['out too small', () => api.sdpa(q(), k(), v(), { out: new Float32Array(B * Hq * Lq * Ev - 1) }), RangeError,
      [/options\.out/, /too small/, has(`[${B}, ${Hq}, ${Lq}, ${Ev}]`), has(`${B * Hq * Lq * Ev} floats`), has(`got ${B * Hq * Lq * Ev - 1}`)]],
    ['out a Float64Array', () => api.sdpa(q(), k(), v(), { out: new Float64Array(B * Hq * Lq * Ev) }), TypeError,
      [/options\.out/, /Float32Array/, has(`Float64Array(${B * Hq * Lq * Ev})`)]],
    ['out a plain array', () => api.sdpa(q(), k(), v(), { out: [] }), TypeError, [/options\.out/, /Array\(0\)/]],
    ['out an ArrayBuffer', () => api.sdpa(q(), k(), v(), { out: new ArrayBuffer(1024) }), TypeError, [/options\.out/, /ArrayBuffer/]],

    // Options themselves.
    ['unknown option iscausal (typo)', () => api.sdpa(q(), k(), v(), { iscausal: true }), TypeError,
      [/unknown option "iscausal"/, /isCausal/]],
    ['unknown option mask', () => api.sdpa(q(), k(), v(), { mask: t(new Float32Array(Lk), [Lk]) }), TypeError,
      [/unknown option "mask"/, /attnMask/]],
    ['options null', () => api.sdpa(q(), k(), v(), null), TypeError, [/options must be an object/, /got null/]],
    ['options a number', () => api.sdpa(q(), k(), v(), 3), TypeError, [/options must be an object/, /got 3/]],
    ['options a string', () => api.sdpa(q(), k(), v(), 'causal'), TypeError, [/options must be an object/, /"causal"/]],
    ['options an array', () => api.sdpa(q(), k(), v(), [true]), TypeError, [/options must be an object/, /Array\(1\)/]],
    ['layout invalid', () => api.sdpa(q(), k(), v(), { layout: 'nchw' }), RangeError,
      [/options\.layout/, /'bhsd' or 'bshd'/, /"nchw"/]],
    ['layout upper case', () => api.sdpa(q(), k(), v(), { layout: 'BSHD' }), RangeError, [/options\.layout/, /"BSHD"/]],
    // Not a string at all: the wrong kind of value, a TypeError.
    ['layout a number', () => api.sdpa(q(), k(), v(), { layout: 3 }), TypeError, [/options\.layout must be 'bhsd' or 'bshd', got 3$/]],
    ['layout null', () => api.sdpa(q(), k(), v(), { layout: null }), TypeError, [/options\.layout/, /got null$/]],
    ['scale a BigInt', () => api.sdpa(q(), k(), v(), { scale: 1n }), TypeError, [/options\.scale must be a number, got 1n \(a BigInt\)/]],
  ];
}
