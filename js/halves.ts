// IEEE binary16 ("half") values as float32, exactly: every half is a float32 value. A table of
// all 65536 patterns, made from the format's definition the first time it is needed (256 KiB):
//   exponent e = 0         (-1)^s · m · 2^-24            (zero and the subnormals)
//   exponent e in 1..30    (-1)^s · (1 + m/1024) · 2^(e-15)
//   exponent e = 31        ±Infinity (m = 0), NaN (m ≠ 0)
// Float16Array would do this where the engine has it (not Node 20). A second table holds each
// half's float32 bits (NaN payloads kept): saved-forward.ts hashes a Float16Array's values by it.

let table: Float32Array | null = null;

function halfValues(): Float32Array {
  if (table !== null) return table;
  table = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const sign = h & 0x8000 ? -1 : 1;
    const e = (h >> 10) & 0x1f, m = h & 0x3ff;
    table[h] = e === 0 ? sign * m * 2 ** -24
      : e === 31 ? (m === 0 ? sign * Infinity : NaN)
      : sign * (1 + m / 1024) * 2 ** (e - 15);
  }
  return table;
}

let bitsTable: Int32Array | null = null;

/**
 * The float32 bit pattern of each of the 65536 halves (256 KiB, made the first time it is
 * needed): the bits of halfValues(), and for a NaN the bits the module's widening gives
 * (f16_widen_in_place: sign kept, exponent all ones, the 10 payload bits at the top of float32's
 * 23) rather than a canonical NaN.
 */
export function float32BitsOfHalves(): Int32Array {
  if (bitsTable !== null) return bitsTable;
  const bits = new Int32Array(halfValues().slice().buffer);
  for (let h = 0; h < 65536; h++) {
    if ((h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0) bits[h] = ((h & 0x8000) << 16) | 0x7f800000 | ((h & 0x3ff) << 13);
  }
  bitsTable = bits;
  return bits;
}

/** The float32 values of `halves` (raw IEEE binary16 patterns), in a new array. */
export function widenHalves(halves: Uint16Array): Float32Array {
  const values = halfValues();
  const out = new Float32Array(halves.length);
  for (let i = 0; i < halves.length; i++) out[i] = values[halves[i]];
  return out;
}

/**
 * The float32 values of `elements` (raw bfloat16 patterns: the upper 16 bits of a float32), in
 * a new array: exact for every pattern, NaN payloads' top bits kept.
 */
export function widenBFloat16(elements: Uint16Array): Float32Array {
  const bits = new Uint32Array(elements.length);
  for (let i = 0; i < elements.length; i++) bits[i] = elements[i] << 16;
  return new Float32Array(bits.buffer);
}
