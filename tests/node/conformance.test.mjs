// ONNX `Attention` (opset 23/24) conformance: runs every node-level test vector of the ONNX
// project (tests/conformance/onnx-attention/, see its README.md for the format and the exact
// operator semantics) through attn.sdpa() and compares the outputs.
//
// The adapter from ONNX semantics to our API (layouts, KV-cache concatenation, masks, causal
// offsets, fp16 decoding, tolerances) is tests/shared/onnx-cases.mjs, shared with the browser
// tests (tests/browser/), which run the same cases inside Chromium. This file reads the cases
// from disk and states each check with Jest's expect.
//
// Y is checked for every case. qk_matmul_output is checked for mode 3 (softmax probabilities)
// through returnWeights. Modes 0, 1 and 2 return raw, softcapped or biased scores, which this
// package does not expose, so for those cases only Y (and the adapter's present_* concat) is
// checked.
import { readFile } from 'node:fs/promises';
import { createAttention } from 'sdpa-wasm';
import {
  adapt, CASE_COUNT, comparePresent, loadCase, loadIndex, mismatches, onnxOutputDims, TOL,
} from '../shared/onnx-cases.mjs';

const ROOT = new URL('../conformance/onnx-attention/', import.meta.url);
const io = {
  readText: (path) => readFile(new URL(path, ROOT), 'utf8'),
  readBytes: async (path) => new Uint8Array(await readFile(new URL(path, ROOT))),
};
const INDEX = await loadIndex(io);

/** present_* is always 4D [B, H, T, D]; checks our concatenated K/V against it, exactly. */
function checkPresent(name, ours, expected, bshd) {
  const { dims, mismatches: bad } = comparePresent(ours, expected, bshd);
  expect(ours.dims).toEqual(dims);
  expect(`${name}: ${bad} mismatching elements`).toBe(`${name}: 0 mismatching elements`);
}

let attn;
let passed = 0;

beforeAll(async () => {
  attn = await createAttention();
});

afterAll(() => {
  console.log(`ONNX Attention conformance: ${passed}/${INDEX.cases.length} cases passed`);
  attn?.dispose();
});

describe('ONNX Attention conformance (opset 23/24)', () => {
  test('index.json lists 76 cases', () => {
    expect(INDEX.count).toBe(CASE_COUNT);
    expect(INDEX.cases).toHaveLength(76);
  });

  for (const entry of INDEX.cases) {
    test(entry.name, async () => {
      const c = await loadCase(io, entry.dir);
      const { query, key, value, options, packed, mode } = adapt(c);
      const { Y, present_key: presentKey, present_value: presentValue, qk_matmul_output: qk } = c.outputs;
      const tol = TOL[c.inputs.Q.dtype];
      expect(tol).toBeDefined();

      // The adapter's KV-cache concatenation must be exactly ONNX's present_key/present_value.
      if (presentKey) checkPresent('present_key', key, presentKey, packed);
      if (presentValue) checkPresent('present_value', value, presentValue, packed);

      const result = attn.sdpa(query, key, value, options);

      // Y: [B, Hq, Lq, Dv], or for packed inputs [B, Lq, Hq, Dv] read as [B, Lq, Hq*Dv].
      expect(onnxOutputDims(result.output, packed)).toEqual(Y.dims);
      expect(mismatches(result.output.data, Y.data, tol)).toEqual([]);

      if (mode === 3) {
        // Softmax probabilities [B, Hq, Lq, T], fully masked rows zeroed: our returnWeights.
        expect(qk).toBeDefined();
        expect(result.weights.dims).toEqual(qk.dims);
        expect(mismatches(result.weights.data, qk.data, tol)).toEqual([]);
      } else {
        // Modes 0/1/2 (raw, softcapped, biased scores) are not exposed: Y only.
        expect(result.weights).toBeUndefined();
      }
      passed++;
    });
  }

  test('every case passed', () => {
    expect(passed).toBe(INDEX.cases.length);
    expect(passed).toBe(76);
  });
});
