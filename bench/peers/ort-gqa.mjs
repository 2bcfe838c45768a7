// onnxruntime-web's decode step the way transformers.js runs a decoder model: the com.microsoft
// GroupQueryAttention contrib op with past_key / past_value inputs and present_key /
// present_value outputs. One run = one new token: query [B, 1, Hq·E], the new token's key and
// value [B, 1, Hkv·E], the `context − 1` earlier positions as past [B, Hkv, context − 1, E];
// it attends to all `context` positions (causal, the new token last) and returns the
// present K/V [B, Hkv, context, E] (the next step's past) besides the output. In the wasm
// backend every run copies the past into ORT's heap, concatenates it with the new token into
// the present, and copies the present back out to JS: that is what a decode step costs there.
// (Past and present can share one buffer only where the runtime binds them to the same memory,
// which onnxruntime-web's wasm backend does not do.)
//
// Uses the onnxruntime-web module instance of peers/ort.mjs (create that peer first: it sets
// numThreads, read once per process).
import * as ort from 'onnxruntime-web';
import { DataType, floatAttr, model, node, tensorInfo } from './onnx-model.mjs';

export function gqaDecodeModel(s) {
  const past = s.Lk - 1;
  return model({
    nodes: [node('GroupQueryAttention', ['Q', 'K', 'V', 'past_key', 'past_value', 'seqlens_k', 'total_sequence_length'],
      ['Y', 'present_key', 'present_value'],
      { num_heads: s.H, kv_num_heads: s.Hkv, scale: floatAttr(1 / Math.sqrt(s.E)) }, 'com.microsoft')],
    inputs: [
      tensorInfo('Q', [s.B, 1, s.H * s.E]), tensorInfo('K', [s.B, 1, s.Hkv * s.E]), tensorInfo('V', [s.B, 1, s.Hkv * s.E]),
      tensorInfo('past_key', [s.B, s.Hkv, past, s.E]), tensorInfo('past_value', [s.B, s.Hkv, past, s.E]),
      tensorInfo('seqlens_k', [s.B], DataType.INT32), tensorInfo('total_sequence_length', [], DataType.INT32),
    ],
    // The present's length is left symbolic: ORT's shape inference assumes a shared past/present
    // buffer (present as long as past) and would reject `context`.
    outputs: [tensorInfo('Y', [s.B, 1, s.H * s.E]), tensorInfo('present_key', [s.B, s.Hkv, 'total', s.E]),
      tensorInfo('present_value', [s.B, s.Hkv, 'total', s.E])],
    opsets: { '': 21, 'com.microsoft': 1 },
  });
}

/** Positions [from, from + n) of [B, H, L, E] as [B, H, n, E] (for n = 1 that is also [B, 1, H·E]). */
function positions(x, B, H, L, E, from, n) {
  const out = new Float32Array(B * H * n * E);
  for (let bh = 0; bh < B * H; bh++) out.set(x.subarray((bh * L + from) * E, (bh * L + from + n) * E), bh * n * E);
  return out;
}

/**
 * The variant for bench/decode.mjs: { label, note, prepare(inputs, s) → { run, dispose } },
 * s = { B, H (= Hq), Hkv, Lq: 1, Lk: context, E }; inputs { q, k, v } hold all `context`
 * positions (the last is the new token's). The output of run() is [B, Hq, 1, E]'s data.
 */
export function gqaDecodeVariant() {
  return {
    label: 'GroupQueryAttention + past (com.microsoft)',
    note: 'past_key/past_value [B, Hkv, context-1, E] in, the new token\'s K/V, present_key/present_value [B, Hkv, context, E] out ' +
      '(copied back to JS every run, as the next step\'s past)',
    prepare: async ({ q, k, v }, s) => {
      const past = s.Lk - 1;
      const session = await ort.InferenceSession.create(gqaDecodeModel(s), {
        executionProviders: ['wasm'], graphOptimizationLevel: 'all',
        logSeverityLevel: 3,   // not the warning that the present is longer than the past (see above)
      });
      const t = (data, dims, type = 'float32') => new ort.Tensor(type, data, dims);
      const last = (x) => positions(x.data, s.B, s.Hkv, s.Lk, s.E, past, 1);
      const feeds = {
        Q: t(q.data, [s.B, 1, s.H * s.E]),   // [B, Hq, 1, E] is [B, 1, Hq·E] when Lq = 1
        K: t(last(k), [s.B, 1, s.Hkv * s.E]),
        V: t(last(v), [s.B, 1, s.Hkv * s.E]),
        past_key: t(positions(k.data, s.B, s.Hkv, s.Lk, s.E, 0, past), [s.B, s.Hkv, past, s.E]),
        past_value: t(positions(v.data, s.B, s.Hkv, s.Lk, s.E, 0, past), [s.B, s.Hkv, past, s.E]),
        seqlens_k: t(new Int32Array(s.B).fill(s.Lk - 1), [s.B], 'int32'),   // total length − 1
        total_sequence_length: t(Int32Array.of(s.Lk), [], 'int32'),
      };
      return {
        run: async () => {
          const r = await session.run(feeds);
          if (r.present_key.dims[2] !== s.Lk) throw new Error(`present_key has ${r.present_key.dims[2]} positions, expected ${s.Lk}`);
          return r.Y.data;
        },
        dispose: () => session.release(),
      };
    },
  };
}
