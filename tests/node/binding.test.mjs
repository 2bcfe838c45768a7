// The wasm binding's plumbing that no result checks by itself:
// - the argument blocks (src/bindings/embind.cc, js/kernel-args.ts): the module's list of
//   ProblemDesc and BackwardDesc fields against what the TypeScript layer writes;
// - where copies into wasm memory are placed (js/memory.ts, placeCopy): always inside the
//   block, 2 KiB from the source modulo 4 KiB, and a streamed decode gives the same bits
//   whatever its inputs' offsets in their buffers.
import { afterAll, beforeAll, describe, expect, test } from '@jest/globals';
import { createAttention } from 'sdpa-wasm';
import * as loader from '../../dist/loader.js';
import { argumentFieldNames, problemArg } from '../../dist/kernel-args.js';
import { COPY_PLACEMENT_SLACK, placeCopy } from '../../dist/memory.js';
import { describeProblem } from '../../dist/strategies.js';
import { describeBackward } from '../../dist/backward.js';
import { plan } from '../../dist/validate.js';
import { maxRelError, randomTensor, referenceSdpa } from './reference.mjs';

// A zero tensor of `dims`.
const t = (dims) => ({ data: new Float32Array(dims.reduce((a, b) => a * b, 1)), dims });

describe('argument blocks', () => {
  let handle;
  beforeAll(async () => {
    handle = await loader.acquireModule(1);
  });
  afterAll(() => handle.release());

  test('each block lists every field once, as 4-byte words that tile the block', () => {
    const layout = handle.module.argumentLayout();
    for (const block of [layout.problem, layout.backward]) {
      const names = block.fields.map((f) => f.name);
      expect(new Set(names).size).toBe(names.length);
      const offsets = block.fields.map((f) => f.offset).sort((a, b) => a - b);
      expect(offsets).toEqual(offsets.map((_, i) => 4 * i));
      expect(block.address % 4).toBe(0);
    }
    // The two blocks do not overlap.
    const end = (b) => b.address + 4 * b.fields.length;
    expect(end(layout.problem) <= layout.backward.address || end(layout.backward) <= layout.problem.address).toBe(true);
  });

  test('the TypeScript problem and backward descriptions have exactly the fields the module reads, in its order (the fast path)', () => {
    const p = plan(t([1, 2, 3, 8]), t([1, 2, 5, 8]), t([1, 2, 5, 4]), { isCausal: true });
    const names = argumentFieldNames(handle.module);
    expect(Object.keys(describeProblem(p))).toEqual(names.problem);
    expect(Object.keys(describeBackward(p))).toEqual(names.backward);
  });

  test('a field left unset is an internal error, not a silent zero', () => {
    const desc = describeProblem(plan(t([1, 1, 1, 4]), t([1, 1, 2, 4]), t([1, 1, 2, 4]), {}));
    delete desc.softcap;
    expect(() => problemArg(handle.module, desc)).toThrow(/internal error: ProblemDesc\.softcap is not set/);
  });

  test('the written words are the values, floats and integers alike', () => {
    const desc = describeProblem(plan(t([1, 2, 3, 8]), t([1, 2, 5, 8]), t([1, 2, 5, 4]),
      { scale: 0.3, softcap: 7.5, isCausal: true, causalOffset: -2 }));
    desc.query = 2 ** 31 + 16;  // beyond int32: the same 32 bits as a uint32
    const address = problemArg(handle.module, desc);
    const { problem } = handle.module.argumentLayout();
    const word = (name) => (address + problem.fields.find((f) => f.name === name).offset) >>> 2;
    expect(handle.module.HEAPF32[word('scale')]).toBe(Math.fround(0.3));
    expect(handle.module.HEAPF32[word('softcap')]).toBe(7.5);
    expect(handle.module.HEAP32[word('causal')]).toBe(1);
    expect(handle.module.HEAP32[word('causalOffset')]).toBe(-2);
    expect(handle.module.HEAP32[word('headDim')]).toBe(8);
    expect(handle.module.HEAP32[word('valueDim')]).toBe(4);
    expect(handle.module.HEAP32[word('query')] >>> 0).toBe(2 ** 31 + 16);
  });

  test('the same words whatever the order of the description\'s keys (the fast path reads them in the module\'s order)', () => {
    const desc = describeProblem(plan(t([2, 4, 3, 8]), t([2, 2, 5, 8]), t([2, 2, 5, 4]),
      { scale: 0.7, softcap: 3, isCausal: true, causalOffset: 4 }));
    const { problem } = handle.module.argumentLayout();
    const words = (d) => {
      const address = problemArg(handle.module, d);
      return Array.from(handle.module.HEAP32.subarray(address >>> 2, (address >>> 2) + problem.fields.length));
    };
    const inOrder = words(desc);
    const reversed = Object.fromEntries(Object.entries(desc).reverse());
    const extraKey = { ...desc, notAField: 123 };
    for (const other of [reversed, extraKey]) {
      words({ ...desc, scale: 9, headDim: 99 });  // something else in the block first
      expect(words(other)).toEqual(inOrder);
    }
  });
});

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
