// Random problem generators for the seeded property tests (tests/node/property.test.mjs and
// tests/node/concurrency.test.mjs). Everything here is derived from a mulberry32 stream, so a
// (seed, group, index) triple names one case exactly. The expectations these generators build
// (which keys are blocked, what a float16 cache stores, the error class and the argument an
// error message must name) come from the documented contract (README, js/types.ts), never from
// the kernel. Plain ES module: no Node built-ins.
import { mulberry32, randn } from '../node/reference.mjs';
import { roundToHalf } from './kv-cache-cases.mjs';

export { roundToHalf };

// ─── seeded randomness ────────────────────────────────────────────────────────────────────

/** The seed of one case: FNV-1a over "seed/group/index", so cases do not depend on each other. */
/**
 * The run's seed: SDPA_PROPERTY_SEED (to replay a failure), else one from the time and the
 * process id. Node only (reads process.env).
 */
export function seedFromEnvironment() {
  const text = process.env.SDPA_PROPERTY_SEED;
  if (text === undefined || text === '') return (Date.now() ^ (process.pid << 20)) >>> 0;
  const seed = Number(text);
  if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) {
    throw new Error(`SDPA_PROPERTY_SEED must be an integer in [0, 2^32), got ${JSON.stringify(text)}`);
  }
  return seed;
}

export function caseSeed(seed, group, index) {
  const text = `${seed}/${group}/${index}`;
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

// Read once: under Jest every `Math.…` call in a loop costs about 250 ns.
const { floor } = Math;

/** A seeded random source with the draws the generators need. */
export function makeRng(seed) {
  const u = mulberry32(seed);
  return {
    next: u,
    /** An integer in [lo, hi]. */
    int: (lo, hi) => lo + floor(u() * (hi - lo + 1)),
    pick: (xs) => xs[floor(u() * xs.length)],
    chance: (p) => u() < p,
    u32: () => floor(u() * 4294967296) >>> 0,
  };
}

export const size = (dims) => dims.reduce((a, b) => a * b, 1);

/** A tensor of unit-normal float32 values, seeded from `r`. */
export const normalTensor = (r, dims) => ({ data: randn(size(dims), r.u32()), dims: [...dims] });

// ─── shapes ───────────────────────────────────────────────────────────────────────────────

// Around the kernels' edges (src/tiles.h: kQueryTile, kKeyGroup, kKeyTile and the decode
// segments, kBackwardKeyTile; boolean masks are read 16 keys at a time): their multiples ± 1.
// Most draws are small so hundreds of float64 references stay fast.
const Q_LENGTHS = [1, 1, 2, 3, 4, 5, 7, 8, 9, 13];
const K_LENGTHS_SMALL = [1, 2, 3, 4, 5, 7, 8, 9, 11, 13, 15, 16, 17];
const K_LENGTHS_LARGE = [31, 32, 33, 61, 63, 64, 65, 127, 128, 129, 131, 255, 257, 383, 509, 511, 512, 513, 1023, 1024, 1025];
const HEAD_SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 11, 16, 17, 32];
const HEAD_SIZES_LARGE = [61, 64, 67, 128];

/**
 * [B, H, L, D] laid out as `layout` says ('bshd': [B, L, H, D]), then `rank` trailing axes;
 * rank 2 is [L, D] in either layout (README).
 */
export function layoutDims(layout, B, H, L, D, rank) {
  if (rank === 2) return [L, D];
  const full = layout === 'bshd' ? [B, L, H, D] : [B, H, L, D];
  return full.slice(4 - rank);
}

/**
 * A rank the API accepts for a tensor [B, H, L, D] in `layout`: axes of 1 may be left out
 * (README: rank 3 is [H, L, E] ([L, H, E] in 'bshd'), rank 2 is [L, E]), so rank 3 needs B = 1
 * and rank 2 also H = 1.
 */
export function pickRank(r, layout, B, H, L) {
  const ranks = [4, 4, 4];
  if (B === 1) ranks.push(3, 3);
  if (B === 1 && H === 1) ranks.push(2);
  return r.pick(ranks);
}

/**
 * A random problem size; `maxWork` bounds B·Hq·Lq·Lk·(E + Ev), the reference's work. With
 * `decode`, a decode shape (Lq 1..2) whose K and V are 2 MiB or reach 4 MiB (from 4 MiB, and
 * without weights in 'bhsd', the decode is streamed: js/strategies.ts).
 */
export function randomShape(r, maxWork = 200_000, { decode = false } = {}) {
  if (decode) {
    const Hkv = r.pick([1, 2]);
    const E = r.pick([64, 128]);
    return { B: 1, Hq: Hkv * r.pick([1, 2, 4]), Hkv, Lq: r.pick([1, 1, 2]), Lk: Math.floor(r.pick([4100, 8192, 8200, 9001]) / Hkv / (E / 64)), E, Ev: E };
  }
  for (;;) {
    const B = r.pick([1, 1, 1, 2, 3]);
    const Hkv = r.pick([1, 1, 2, 3]);
    const Hq = Hkv * r.pick([1, 1, 2, 3, 4]);
    const Lq = r.chance(0.1) ? r.pick([16, 17, 31]) : r.pick(Q_LENGTHS);
    const Lk = r.chance(0.3) ? r.pick(K_LENGTHS_LARGE) : r.pick(K_LENGTHS_SMALL);
    const E = r.chance(0.1) ? r.pick(HEAD_SIZES_LARGE) : r.pick(HEAD_SIZES);
    const Ev = r.chance(0.6) ? E : r.chance(0.1) ? r.pick(HEAD_SIZES_LARGE) : r.pick(HEAD_SIZES);
    if (B * Hq * Lq * Lk * (E + Ev) <= maxWork) return { B, Hq, Hkv, Lq, Lk, E, Ev };
  }
}

/** What fills a buffer around a view: a value that would show if it were read. */
const GARBAGE = new Map([[Float32Array, NaN], [Uint16Array, 0x7e00], [Uint8Array, 7], [Int32Array, 0x7fffffff]]);

/**
 * Sometimes (20%) the same values as a view into the middle of a larger buffer whose other
 * elements are garbage (NaN, NaN halves, out-of-range integers): nothing outside a view may be read.
 */
export function maybeOffsetView(r, data) {
  if (!r.chance(0.2)) return data;
  const before = r.int(1, 9), after = r.int(0, 9);
  const Type = data.constructor;
  const whole = new Type(before + data.length + after).fill(GARBAGE.get(Type) ?? 0);
  whole.set(data, before);
  return whole.subarray(before, before + data.length);
}

/** [B, H, L, D] (bhsd) → [B, L, H, D] (bshd). */
export function toBshd(t) {
  const [B, H, L, D] = t.dims;
  const data = new Float32Array(t.data.length);
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      for (let l = 0; l < L; l++) {
        const from = ((b * H + h) * L + l) * D, to = ((b * L + l) * H + h) * D;
        for (let d = 0; d < D; d++) data[to + d] = t.data[from + d];
      }
    }
  }
  return { data, dims: [B, L, H, D] };
}

// ─── masks and the blocked-key predicate ──────────────────────────────────────────────────

/** Strides of mask dims broadcast (right-aligned) to [B, Hq, Lq, Lk]; 0 = broadcast axis. */
export function broadcastStrides(dims) {
  const strides = [0, 0, 0, 0];
  let stride = 1;
  for (let axis = 3; axis >= 0; axis--) {
    const m = axis - (4 - dims.length);
    const s = m >= 0 ? dims[m] : 1;
    strides[axis] = s === 1 ? 0 : stride;
    stride *= s;
  }
  return strides;
}

/**
 * A random mask broadcastable to [B, Hq, Lq, Lk]: each axis full or 1, any rank from the
 * smallest that keeps the full axes up to 4. Float masks mix −∞ (blocked) and finite biases;
 * bool masks 0 (blocked) and 1.
 */
export function randomMask(r, [B, Hq, Lq, Lk]) {
  const full = [B, Hq, Lq, Lk].map((n) => (n > 1 && r.chance(0.5) ? n : 1));
  const first = full.findIndex((n) => n !== 1);
  const rank = r.int(first === -1 ? 1 : 4 - first, 4);
  const dims = full.slice(4 - rank);
  const n = size(dims);
  if (r.chance(0.5)) {
    const blocked = r.pick([0, 0.1, 0.5, 0.9, 1]);
    const spread = r.pick([0.5, 2, 5]);
    const data = new Float32Array(n);
    for (let i = 0; i < n; i++) data[i] = r.chance(blocked) ? -Infinity : (r.next() - 0.5) * 2 * spread;
    return { data, dims };
  }
  const open = r.pick([0, 0.3, 0.7, 0.9, 1]);
  return { data: Uint8Array.from({ length: n }, () => (r.chance(open) ? 1 : 0)), dims };
}

/**
 * blocked(b, h, i, j): whether key j is blocked for query row i of head h in batch b under
 * `options` (Lk keys), from the documented rules: keyLengths, keyStarts, isCausal/causalOffset/slidingWindow (`causal`
 * and `offsetOf` given explicitly, since KVCache.attend has other defaults), a bool mask's 0,
 * a float mask's −∞.
 */
export function blockedPredicate(options, Lk, causal, offsetOf) {
  const mask = options.attnMask;
  const strides = mask ? broadcastStrides(mask.dims) : null;
  const isBool = mask ? Object.prototype.toString.call(mask.data) === '[object Uint8Array]' : false;
  return (b, h, i, j) => {
    if (options.keyLengths && j >= options.keyLengths[b]) return true;
    if (options.keyStarts && j < options.keyStarts[b]) return true;
    if (causal && j > i + offsetOf(b)) return true;
    if (causal && options.slidingWindow !== undefined && j <= i + offsetOf(b) - options.slidingWindow) return true;
    if (mask) {
      const m = mask.data[b * strides[0] + h * strides[1] + i * strides[2] + j * strides[3]];
      if (isBool ? m === 0 : m === -Infinity) return true;
    }
    return false;
  };
}

// ─── sdpa options ─────────────────────────────────────────────────────────────────────────

/** A causal offset drawn around the interesting range [−Lq, Lk], beyond it too. */
const randomOffset = (r, Lq, Lk) => r.int(-Lq - 2, Lk + 2);

/**
 * Random valid options for a problem [B, Hq, Lq, Lk] with output size `outputSize`.
 * `forCache`: KVCache.attend, where isCausal defaults to true (offset Lk − Lq) and may be left
 * out while causalOffset is given. Returns { options, causal, offsetOf } where causal/offsetOf
 * are what the options mean (for the blocked-key predicate and the reference).
 */
export function randomOptions(r, { B, Hq, Lq, Lk, outputSize }, { forCache = false } = {}) {
  const options = {};
  if (r.chance(0.4)) options.scale = r.pick([0, 0.05, 0.3, 1, 1.7, -0.5, -1]) * (r.chance(0.5) ? 1 : r.next() + 0.5);
  if (r.chance(0.2)) options.softcap = r.pick([0.5, 1, 3, 30]);
  if (r.chance(0.35)) options.attnMask = randomMask(r, [B, Hq, Lq, Lk]);
  let causal = false, offset = forCache ? Lk - Lq : 0;
  let offsets = null;
  const causalDraw = r.next();
  if (forCache) {
    // Left out: causal, bottom-right. Or turned off, or on with another offset (with or
    // without isCausal: true spelled out).
    causal = true;
    if (causalDraw < 0.25) options.isCausal = false, causal = false;
    else if (causalDraw < 0.4) options.isCausal = true;
  } else if (causalDraw < 0.4) {
    options.isCausal = true;
    causal = true;
  }
  if (causal && r.chance(forCache ? 0.35 : 0.6)) {
    if (r.chance(0.5)) {
      offset = randomOffset(r, Lq, Lk);
      options.causalOffset = offset;
    } else {
      offsets = Int32Array.from({ length: B }, () => randomOffset(r, Lq, Lk));
      options.causalOffset = Int32Array.from(offsets);
    }
  }
  if (causal && r.chance(0.3)) {
    // Windows of 1 key, either side of a key group (8), a backward key tile (64) and a forward
    // one (512), within the keys, and wide enough to block nothing (or almost).
    options.slidingWindow = r.pick([1, 2, 7, 8, 9, 63, 64, 65, 511, 512, 513, r.int(1, Lk + Lq + 2), Lk + Lq + 3, 2 ** 30]);
  }
  if (r.chance(0.3)) {
    options.keyLengths = Int32Array.from({ length: B }, () => (r.chance(0.2) ? 0 : r.chance(0.3) ? Lk : r.int(0, Lk)));
  }
  if (options.attnMask) options.attnMask.data = maybeOffsetView(r, options.attnMask.data);
  if (ArrayBuffer.isView(options.causalOffset)) options.causalOffset = maybeOffsetView(r, options.causalOffset);
  if (r.chance(0.15)) {  // left padding
    options.keyStarts = Int32Array.from({ length: B }, () => (r.chance(0.4) ? 0 : r.chance(0.15) ? Lk : r.int(0, Lk)));
  }
  if (r.chance(0.2)) {  // gpt-oss's sinks: none for some heads, about the scores, far above and below them
    options.sinks = Float32Array.from({ length: Hq }, () => r.pick([-Infinity, 0, 30, -30, 1e30, r.next() * 6 - 3]));
  }
  let alibi = false;
  if (r.chance(0.2)) {
    // ALiBi slopes, [Hq] or [B, Hq]: 0 for some heads, the rest small enough that every bias
    // stays within ±40 (a float32 bias of magnitude M is off by up to M·2^-24 where the float64
    // reference is exact: within the tolerance only for moderate M).
    alibi = true;
    const most = 40 / (Lk + Lq + 4);
    options.alibiSlopes = Float32Array.from({ length: r.chance(0.5) ? Hq : B * Hq },
      () => r.pick([0, most, most * r.next(), most * 2 ** -r.int(1, 8)]));
    if (!causal && r.chance(0.5)) {  // the diagonal ALiBi measures from, without isCausal
      offset = r.int(-2, 2) + (forCache ? Lk - Lq : 0);
      options.causalOffset = offset;
    }
  }
  if (options.keyLengths) options.keyLengths = maybeOffsetView(r, options.keyLengths);
  if (options.keyStarts) options.keyStarts = maybeOffsetView(r, options.keyStarts);
  if (options.sinks) options.sinks = maybeOffsetView(r, options.sinks);
  if (options.alibiSlopes) options.alibiSlopes = maybeOffsetView(r, options.alibiSlopes);
  if (r.chance(0.4)) options.returnWeights = true;
  if (r.chance(0.2)) options.out = maybeOffsetView(r, new Float32Array(outputSize + r.pick([0, 0, 3])).fill(NaN));
  if (r.chance(0.2)) {
    // Attention dropout: a seed anywhere in [0, 2^32); p about the middle and near both ends,
    // 0 (no dropout, the seed ignored) and 2^-33 (the least p that drops: threshold 1).
    options.dropoutP = r.pick([0.1, 0.5, 0.9, 0.999, r.next(), 0, 2 ** -33]);
    options.dropoutSeed = r.u32();
  }
  const offsetOf = (b) => (offsets ? offsets[b] : offset);
  return { options, causal, alibi, offsetOf };
}

/** The options as the float64 reference takes them (causal spelled out). */
export function referenceOptions(options, causal, offsetOf, B) {
  const { out, ...rest } = options;
  return {
    ...rest,
    isCausal: causal,
    causalOffset: causal || options.alibiSlopes ? Int32Array.from({ length: B }, (_, b) => offsetOf(b)) : undefined,
  };
}

/** A short text naming a case's options (typed arrays shown in full when short). */
export function describeOptions(options) {
  const parts = [];
  for (const [name, value] of Object.entries(options)) {
    if (value === undefined) continue;
    if (name === 'attnMask') {
      const kind = Object.prototype.toString.call(value.data).slice(8, -1);
      parts.push(`attnMask ${kind}[${value.dims}]${value.data?.byteOffset > 0 ? ' (offset view)' : ''}`);
    } else if (name === 'out') {
      parts.push(`out Float32Array(${value.length})${value.byteOffset > 0 ? ' (offset view)' : ''}`);
    } else if (ArrayBuffer.isView(value)) {
      parts.push(`${name} [${Array.from(value).slice(0, 8)}${value.length > 8 ? ',…' : ''}]${value.byteOffset > 0 ? ' (offset view)' : ''}`);
    } else {
      parts.push(`${name} ${typeof value === 'string' ? `'${value}'` : value}`);
    }
  }
  return `{ ${parts.join(', ')} }`;
}

// ─── float16 ──────────────────────────────────────────────────────────────────────────────

/** The value of IEEE float16 bits, from the format's definition. */
export function halfToFloat(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  if (exponent === 0) return sign * mantissa * 2 ** -24;
  if (exponent === 31) return mantissa ? NaN : sign * Infinity;
  return sign * (1 + mantissa / 1024) * 2 ** (exponent - 15);
}

/** n random finite float16 bit patterns of magnitude below 8 (subnormals included). */
export function randomHalves(r, n) {
  return Uint16Array.from({ length: n }, () => {
    const exponent = r.chance(0.05) ? 0 : r.int(8, 17);
    return (r.chance(0.5) ? 0x8000 : 0) | (exponent << 10) | r.int(0, 1023);
  });
}

/** Raw bfloat16 patterns of moderate values (|x| in [2^-7, 2^3), or a subnormal now and then). */
export function randomBFloat16s(r, n) {
  return Uint16Array.from({ length: n }, () => {
    const exponent = r.chance(0.05) ? 0 : r.int(120, 129);
    return (r.chance(0.5) ? 0x8000 : 0) | (exponent << 7) | r.int(0, 127);
  });
}

// ─── invalid calls: one mutation of a valid call ──────────────────────────────────────────
// A mutation is { desc, Cls, names }: the error class the README's rule gives (TypeError for a
// wrong kind of value, RangeError for a wrong value) and strings the message must contain (the
// function, then the argument). Tensor mutations also carry `tensor` (the replacement); option
// mutations carry `options` (the replacement options argument).

const escape = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
/** A RegExp matching the literal string s. */
export const literal = (s) => new RegExp(escape(s));

/**
 * One random mutation of the tensor `t` ({ data, dims }) passed as argument `name` of `fn`.
 * `halves`: a Uint16Array is a valid kind of data there (a float16 or bfloat16 cache's append).
 */
export function mutateTensor(r, fn, name, t, { halves = false } = {}) {
  const dims = [...t.dims];
  const n = t.data.length;
  const axis = r.int(0, dims.length - 1);
  const at = (replacement) => dims.map((d, i) => (i === axis ? replacement : d));
  const kinds = [
    () => {
      const bad = r.pick([[n], [...new Array(5 - dims.length).fill(1), ...dims], [1, ...new Array(5 - dims.length).fill(1), ...dims], []]);
      return { desc: `${name}.dims of rank ${bad.length}: [${bad}]`, tensor: { data: t.data, dims: bad }, Cls: RangeError, names: [`${name}.dims`, 'rank'] };
    },
    () => {
      const bad = r.pick([dims[axis] + 0.5, 0, -dims[axis], NaN, Infinity, -1]);
      return { desc: `${name}.dims[${axis}] = ${bad}`, tensor: { data: t.data, dims: at(bad) }, Cls: RangeError, names: [`${name}.dims[${axis}]`] };
    },
    () => {
      const bad = r.pick([String(dims[axis]), null, undefined, true]);
      return { desc: `${name}.dims[${axis}] = ${JSON.stringify(bad)}`, tensor: { data: t.data, dims: at(bad) }, Cls: TypeError, names: [`${name}.dims[${axis}]`] };
    },
    () => {
      const bad = r.pick([undefined, dims.join(','), Int32Array.from(dims), { length: dims.length }, null]);
      return { desc: `${name}.dims not an array (${Object.prototype.toString.call(bad)})`, tensor: { data: t.data, dims: bad }, Cls: TypeError, names: [`${name}.dims`] };
    },
    () => {
      const choices = [
        ['Float64Array', () => Float64Array.from(t.data)], ['plain array', () => Array.from(t.data)],
        ['Int32Array', () => new Int32Array(n)], ['ArrayBuffer', () => new ArrayBuffer(n * 4)],
        ['undefined', () => undefined], ['Float32Array wrapped in a DataView', () => new DataView(new ArrayBuffer(n * 4))],
      ];
      if (!halves) choices.push(['Uint16Array', () => new Uint16Array(n)]);
      const [kind, make] = r.pick(choices);
      return { desc: `${name}.data a ${kind}`, tensor: { data: make(), dims }, Cls: TypeError, names: [`${name}.data`] };
    },
    () => {
      const delta = r.pick([-1, 1, 5, -n]);
      const data = delta < 0 ? t.data.subarray(-delta) : (() => { const d = new Float32Array(n + delta); d.set(t.data); return d; })();
      // (An empty array gets its own message: "<name>.data has no elements".)
      return { desc: `${name}.data.length ${n + delta} ≠ ${n}`, tensor: { data, dims }, Cls: RangeError, names: [`${name}.data`] };
    },
    () => {
      const bad = r.pick([null, undefined, 5, 'tensor', true]);
      return { desc: `${name} = ${JSON.stringify(bad)}`, tensor: bad, Cls: TypeError, names: [`${name}`] };
    },
  ];
  const m = r.pick(kinds)();
  m.names = [`${fn}:`, ...m.names];
  return m;
}

/**
 * One random mutation of the options of a call of `fn` on a problem [B, Hq, Lq, Lk] whose
 * output has `outputSize` floats, starting from the valid `options`. `forCache`: KVCache.attend,
 * where causalOffset is refused only with isCausal: false (isCausal defaults to true).
 */
export function mutateOptions(r, fn, { B, Hq, Lq, Lk, outputSize }, options, { forCache = false } = {}) {
  const target = [B, Hq, Lq, Lk];
  const axisNames = ['B', 'Hq', 'Lq', 'Lk'];
  const needsCausal = (name) => name === 'causalOffset' || name === 'slidingWindow';
  const withOption = (name, value) => ({ ...options, ...(needsCausal(name) ? { isCausal: true } : {}), [name]: value });
  const show = (x) => (typeof x === 'bigint' ? `${x}n` : ArrayBuffer.isView(x) ? `${Object.prototype.toString.call(x).slice(8, -1)}(${x.length})` : typeof x === 'string' ? JSON.stringify(x) : String(x));
  const option = (name, value, Cls, names = [`options.${name}`]) =>
    ({ desc: `options.${name} = ${show(value)}`, options: withOption(name, value), Cls, names });
  const kinds = [
    () => option('scale', r.pick([NaN, Infinity, -Infinity]), RangeError),
    () => option('scale', r.pick(['0.5', null, true, 1n, {}]), TypeError),
    () => option('softcap', r.pick([0, -0, -1, -Infinity, NaN, Infinity]), RangeError),
    () => option('softcap', r.pick(['3', null, false, 2n]), TypeError),
    () => option('isCausal', r.pick([1, 0, 'true', null]), TypeError),
    () => option('returnWeights', r.pick([1, 'yes', null]), TypeError),
    () => option('layout', r.pick(['BSHD', 'nchw', '', 'bhsd ', 'bsdh']), RangeError),
    () => {
      // A mask axis that is neither 1 nor the target's size.
      const axis = r.int(0, 3);
      const bad = target[axis] + (target[axis] === 0 ? 2 : 1);
      const dims = target.map((n, i) => (i === axis ? bad : r.chance(0.5) && n > 0 ? n : 1));
      const data = r.chance(0.5) ? new Float32Array(size(dims)) : new Uint8Array(size(dims)).fill(1);
      return { desc: `options.attnMask.dims [${dims}] (axis ${axisNames[axis]} ${bad}) for [${target}]`, options: withOption('attnMask', { data, dims }),
        Cls: RangeError, names: ['options.attnMask.dims', `axis ${axisNames[axis]}`] };
    },
    () => {
      const dims = r.pick([[1, 1, 1, 1, 1], [], [0], [1, -1]]);
      return { desc: `options.attnMask.dims [${dims}]`, options: withOption('attnMask', { data: new Float32Array(Math.max(0, size(dims))), dims }),
        Cls: RangeError, names: ['options.attnMask.dims'] };
    },
    () => {
      const dims = [Math.max(1, Lk)];
      const data = new Float32Array(dims[0] + r.pick([1, 2]));
      return { desc: `options.attnMask.data.length ${data.length} for dims [${dims}]`, options: withOption('attnMask', { data, dims }),
        Cls: RangeError, names: ['options.attnMask.data.length'] };
    },
    () => {
      const n = Math.max(1, Lk);
      const [kind, data] = r.pick([['Float64Array', new Float64Array(n)], ['Int8Array', new Int8Array(n)],
        ['Uint8ClampedArray', new Uint8ClampedArray(n)], ['plain array', new Array(n).fill(0)], ['Int32Array', new Int32Array(n)],
        ['Uint16Array', new Uint16Array(n)]]);
      return { desc: `options.attnMask.data a ${kind}`, options: withOption('attnMask', { data, dims: [n] }), Cls: TypeError, names: ['options.attnMask.data'] };
    },
    () => option('attnMask', r.pick([null, 5, 'mask', true]), TypeError),
    () => option('causalOffset', r.pick([0.5, -1.5, NaN, Infinity, -Infinity]), RangeError),
    () => option('causalOffset', new Int32Array(r.pick([B + 1, B - 1, 0].filter((n) => n >= 0 && n !== B))), RangeError),
    () => option('causalOffset', r.pick([new Array(B).fill(0), new Float32Array(B), new Uint32Array(B), '0', null, 1n]), TypeError),
    () => {
      // causalOffset where causal attention is off.
      // (Without ALiBi, whose distances the offset also moves: it is taken there.)
      const { alibiSlopes: _a, ...noAlibi } = options;
      const off = forCache ? { ...noAlibi, isCausal: false, causalOffset: r.int(-2, 2) }
        : { ...noAlibi, isCausal: r.pick([false, undefined]), causalOffset: r.int(-2, 2) };
      if (off.isCausal === undefined) delete off.isCausal;
      return { desc: `options.causalOffset without causal attention (isCausal ${off.isCausal})`, options: off, Cls: TypeError,
        names: ['options.causalOffset', 'isCausal'] };
    },
    () => option('slidingWindow', r.pick([0, -1, 1.5, NaN, Infinity, -Infinity, 2 ** 30 + 1, 2 ** 53]), RangeError),
    () => option('slidingWindow', r.pick(['8', null, true, 8n, [8], new Int32Array(1)]), TypeError),
    () => {
      // slidingWindow where causal attention is off (its window ends at the causal diagonal).
      const { causalOffset: _, ...rest } = options;
      const off = forCache ? { ...rest, isCausal: false, slidingWindow: r.int(1, 9) }
        : { ...rest, isCausal: r.pick([false, undefined]), slidingWindow: r.int(1, 9) };
      if (off.isCausal === undefined) delete off.isCausal;
      return { desc: `options.slidingWindow without causal attention (isCausal ${off.isCausal})`, options: off, Cls: TypeError,
        names: ['options.slidingWindow', 'isCausal'] };
    },
    () => {
      const b = r.int(0, B - 1);
      const lengths = new Int32Array(B).fill(Lk);
      lengths[b] = r.pick([-1, Lk + 1, 2 ** 31 - 1, -(2 ** 31)]);
      return { desc: `options.keyLengths [${lengths}] (Lk ${Lk})`, options: withOption('keyLengths', lengths), Cls: RangeError, names: [`options.keyLengths[${b}]`] };
    },
    () => option('keyLengths', new Int32Array(r.pick([B + 1, B - 1, 0].filter((n) => n >= 0 && n !== B))), RangeError),
    () => {
      const b = r.int(0, B - 1);
      const starts = new Int32Array(B);
      starts[b] = r.pick([-1, Lk + 1, 2 ** 31 - 1, -(2 ** 31)]);
      return { desc: `options.keyStarts [${starts}] (Lk ${Lk})`, options: withOption('keyStarts', starts), Cls: RangeError, names: [`options.keyStarts[${b}]`] };
    },
    () => option('keyStarts', new Int32Array(r.pick([B + 1, B - 1, 0].filter((n) => n >= 0 && n !== B))), RangeError),
    () => option('keyStarts', r.pick([new Array(B).fill(0), new Float32Array(B), new Uint32Array(B), 0, null]), TypeError),
    () => option('keyLengths', r.pick([new Array(B).fill(0), new Float32Array(B), new Uint32Array(B), new BigInt64Array(B), 3, null]), TypeError),
    () => {
      const h = r.int(0, Hq - 1);
      const sinks = new Float32Array(Hq);
      sinks[h] = r.pick([NaN, Infinity]);
      return { desc: `options.sinks [${Array.from(sinks)}]`, options: withOption('sinks', sinks), Cls: RangeError, names: [`options.sinks[${h}]`] };
    },
    () => option('sinks', new Float32Array(r.pick([Hq + 1, Hq - 1, 0].filter((n) => n >= 0 && n !== Hq))), RangeError),
    () => option('sinks', r.pick([new Array(Hq).fill(0), new Float64Array(Hq), new Int32Array(Hq), 0, null]), TypeError),
    () => {
      const n = r.int(0, Hq - 1);
      const slopes = new Float32Array(Hq).fill(0.125);
      slopes[n] = r.pick([NaN, Infinity, -1, -1e-30, 2 ** 65]);
      return { desc: `options.alibiSlopes [${Array.from(slopes)}]`, options: withOption('alibiSlopes', slopes), Cls: RangeError,
        names: [`options.alibiSlopes[${n}]`] };
    },
    () => option('alibiSlopes', new Float32Array(r.pick([Hq + 1, Hq - 1, 0, B * Hq + 1].filter((n) => n >= 0 && n !== Hq && n !== B * Hq))),
      RangeError),
    () => option('alibiSlopes', r.pick([new Array(Hq).fill(0), new Float64Array(Hq), new Int32Array(Hq), 0.5, null]), TypeError),
    () => option('dropoutP', r.pick([NaN, -0.1, 1, 1.5, Infinity, -Infinity]), RangeError),
    () => option('dropoutP', r.pick(['0.1', null, true, 1n, {}]), TypeError),
    () => {
      // dropoutP > 0 without a seed.
      const { dropoutSeed: _, ...rest } = options;
      const p = r.pick([0.1, 0.5, 0.999, 2 ** -33]);
      return { desc: `options.dropoutP ${p} without dropoutSeed`, options: { ...rest, dropoutP: p }, Cls: TypeError, names: ['options.dropoutSeed', 'required'] };
    },
    () => {
      const seed = r.pick([-1, 2 ** 32, 1.5, NaN, Infinity, -(2 ** 31)]);
      return { desc: `options.dropoutSeed = ${seed} (dropoutP 0.5)`, options: { ...options, dropoutP: 0.5, dropoutSeed: seed }, Cls: RangeError,
        names: ['options.dropoutSeed', `got ${seed}`] };
    },
    () => option('dropoutSeed', r.pick(['1', null, true, 1n]), TypeError),
    () => option('out', new Float32Array(r.pick([outputSize - 1, 0, outputSize >> 1].filter((n) => n >= 0 && n < outputSize))), RangeError),
    () => option('out', r.pick([new Float64Array(outputSize), new Array(outputSize).fill(0), new ArrayBuffer(outputSize * 4),
      new Uint8Array(outputSize * 4), new Int32Array(outputSize), null]), TypeError),
    () => {
      const name = r.pick(['mask', 'causal', 'iscausal', 'scaling', 'softCap', 'key_lengths', 'weights', 'outBuffer', 'dropout', 'enableGqa']);
      return { desc: `unknown option "${name}"`, options: { ...options, [name]: r.pick([true, 1, {}]) }, Cls: TypeError, names: [`unknown option "${name}"`] };
    },
    () => {
      const bad = r.pick([null, 7, 'causal', [], true]);
      return { desc: `options = ${JSON.stringify(bad)}`, options: bad, Cls: TypeError, names: ['options must be an object'] };
    },
  ];
  const m = r.pick(kinds)();
  m.names = [`${fn}:`, ...m.names];
  return m;
}

/** One random mutation of valid createKVCache() options: { desc, options, Cls, names }. */
export function mutateCacheOptions(r, options) {
  const kinds = [
    () => {
      const name = r.pick(['batch', 'kvHeads', 'headDim', 'valueDim', 'maxLength']);
      const bad = r.pick([0, -1, 1.5, NaN, Infinity, 2 ** 31]);
      return { desc: `options.${name} = ${bad}`, options: { ...options, [name]: bad }, Cls: RangeError, names: [`options.${name}`] };
    },
    () => {
      const name = r.pick(['batch', 'kvHeads', 'headDim', 'valueDim', 'maxLength']);
      const bad = r.pick(['2', null, true, 2n, [2]]);
      return { desc: `options.${name} = ${typeof bad === 'bigint' ? '2n' : JSON.stringify(bad)}`, options: { ...options, [name]: bad }, Cls: TypeError, names: [`options.${name}`] };
    },
    () => {
      const name = r.pick(['batch', 'kvHeads', 'headDim', 'maxLength']);
      const { [name]: _, ...rest } = options;
      return { desc: `options.${name} missing`, options: rest, Cls: TypeError, names: [`options.${name}`] };
    },
    () => {
      const bad = r.pick(['int8', 'float64', 'FLOAT16', 'bf16', 'half', '']);
      return { desc: `options.dtype = '${bad}'`, options: { ...options, dtype: bad }, Cls: RangeError, names: ['options.dtype'] };
    },
    () => {
      const bad = r.pick([null, 16, true]);
      return { desc: `options.dtype = ${bad}`, options: { ...options, dtype: bad }, Cls: TypeError, names: ['options.dtype', `got ${bad}`] };
    },
    () => {
      const name = r.pick(['heads', 'length', 'type', 'layout', 'valueDims']);
      return { desc: `unknown option "${name}"`, options: { ...options, [name]: 1 }, Cls: TypeError, names: [`unknown option "${name}"`] };
    },
    () => {
      const bad = r.pick([null, 5, 'float16', [], undefined]);
      return { desc: `options = ${JSON.stringify(bad)}`, options: bad, Cls: TypeError, names: ['options'] };
    },
  ];
  const m = r.pick(kinds)();
  m.names = ['createKVCache:', ...m.names];
  return m;
}
