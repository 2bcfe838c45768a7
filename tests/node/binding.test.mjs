// The wasm binding's plumbing that no result checks by itself:
// - where copies into wasm memory are placed (js/memory.ts, placeCopy): always inside the
//   block, 2 KiB from the source modulo 4 KiB, and a streamed decode gives the same bits
//   whatever its inputs' offsets in their buffers.
import { afterAll, beforeAll, describe, expect, test } from '@jest/globals';
import { createAttention } from 'sdpa-wasm';
import { COPY_PLACEMENT_SLACK, placeCopy } from '../../dist/memory.js';
import { maxRelError, randomTensor, referenceSdpa } from './reference.mjs';

describe('copies placed away from their source modulo 4 KiB', () => {
  test('placeCopy stays in the block, 4-byte aligned, 2 KiB from the source modulo 4 KiB', () => {
    const buffer = new ArrayBuffer(3 * 4096);
    for (const block of [0, 16, 8, 2048, 4080, 65536 + 944, 2 ** 31 - 4096]) {
      for (let offset = 0; offset < 2 * 4096; offset += 4 * 7) {
        const source = new Float32Array(buffer, offset, 4);
        const at = placeCopy(block, source);
        expect(at).toBeGreaterThanOrEqual(block);
        expect(at).toBeLessThanOrEqual(block + COPY_PLACEMENT_SLACK - 4);
        expect(at % 4).toBe(0);
        expect((((at - offset) % 4096) + 4096) % 4096).toBe(2048);
      }
    }
  });

  let attn;
  beforeAll(async () => {
    attn = await createAttention({ threads: 1 });
  });
  afterAll(() => attn.dispose());

  test('a streamed decode gives the same bits whatever the offsets of K and V in their buffers', () => {
    // 4.5 MiB of K and V: streamed (js/strategies.ts, STREAM_MIN_BYTES), one copy per segment.
    const B = 1, Hq = 4, Hkv = 2, Lq = 1, Lk = 2304, E = 128, Ev = 128;
    const q = randomTensor([B, Hq, Lq, E], 301), k = randomTensor([B, Hkv, Lk, E], 302);
    const v = randomTensor([B, Hkv, Lk, Ev], 303);
    expect((k.data.byteLength + v.data.byteLength) / 2 ** 20).toBeGreaterThanOrEqual(4);
    const first = attn.sdpa(q, k, v).output.data;
    const ref = referenceSdpa(q, k, v, {});
    expect(maxRelError(first, ref.output)).toBeLessThanOrEqual(2e-5);
    for (const [keyOffset, valueOffset] of [[4, 8], [2044, 2048], [4092, 12], [16, 4080], [1000, 3000]]) {
      const at = (t, byteOffset) => {
        const data = new Float32Array(new ArrayBuffer(byteOffset + t.data.byteLength), byteOffset, t.data.length);
        data.set(t.data);
        return { data, dims: t.dims };
      };
      const got = attn.sdpa(q, at(k, keyOffset), at(v, valueOffset)).output.data;
      expect(Buffer.from(got.buffer, got.byteOffset, got.byteLength)
        .equals(Buffer.from(first.buffer, first.byteOffset, first.byteLength))).toBe(true);
    }
  });
});
