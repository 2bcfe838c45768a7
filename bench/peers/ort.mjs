// onnxruntime-web, wasm execution provider, one thread (or `threads`, see createPeer). Each
// shape gets three in-memory ONNX
// graphs (built by onnx-model.mjs) and bench.mjs reports the fastest that is correct:
//   'MultiHeadAttention' com.microsoft contrib op: query [B, Lq, Hq·E] (its required layout,
//       transposed before timing), key/value [B, H, Lk, E] (accepted as is); `unidirectional`
//       for causal. It has no GQA: key/value are repeated to Hq heads before timing.
//   'Attention (opset 23)': the standard op, [B, H, L, E] inputs as is, GQA and `is_causal`
//       built in.
//   'MatMul-Softmax-MatMul': Mul(Q, scale) → MatMul(·, Transpose(K)) → [Where(causal mask)] →
//       Softmax → MatMul(·, V). The causal mask is computed in the graph from two index
//       vectors (constant, so ORT can fold it when creating the session). GQA: Q is viewed as
//       [B, Hkv, G·Lq, E] (the G query heads of a KV head are contiguous), no K/V copies.
// Session creation is not timed; a timed run is `await session.run(feeds)` and reading the
// output (ORT copies inputs into its heap and the output out of it on every run).
import * as ort from 'onnxruntime-web';
import { DataType, floatAttr, initializer, model, node, tensorInfo } from './onnx-model.mjs';

const F = DataType.FLOAT;

function mhaModel(s) {
  const D = s.H * s.E;
  const attrs = { num_heads: s.H, scale: floatAttr(1 / Math.sqrt(s.E)) };
  if (s.causal) attrs.unidirectional = 1;
  return model({
    nodes: [node('MultiHeadAttention', ['Q', 'K', 'V'], ['Y'], attrs, 'com.microsoft')],
    inputs: [tensorInfo('Q', [s.B, s.Lq, D]), tensorInfo('K', [s.B, s.H, s.Lk, s.E]), tensorInfo('V', [s.B, s.H, s.Lk, s.E])],
    outputs: [tensorInfo('Y', [s.B, s.Lq, D])],
    opsets: { '': 21, 'com.microsoft': 1 },
  });
}

function attention23Model(s) {
  return model({
    nodes: [node('Attention', ['Q', 'K', 'V'], ['Y'], { is_causal: s.causal ? 1 : 0, scale: floatAttr(1 / Math.sqrt(s.E)) })],
    inputs: [tensorInfo('Q', [s.B, s.H, s.Lq, s.E]), tensorInfo('K', [s.B, s.Hkv, s.Lk, s.E]), tensorInfo('V', [s.B, s.Hkv, s.Lk, s.E])],
    outputs: [tensorInfo('Y', [s.B, s.H, s.Lq, s.E])],
    opsets: { '': 23 },
    irVersion: 11,
  });
}

function matmulModel(s) {
  const G = s.H / s.Hkv;
  const qDims = [s.B, s.Hkv, G * s.Lq, s.E];
  const nodes = [
    node('Mul', ['Q', 'scale'], ['Qs']),
    node('Transpose', ['K'], ['Kt'], { perm: [0, 1, 3, 2] }),
    node('MatMul', ['Qs', 'Kt'], ['S']),
  ];
  const initializers = [initializer('scale', Float32Array.of(1 / Math.sqrt(s.E)), [], F)];
  let scores = 'S';
  if (s.causal) {
    // allowed[i][j] = j <= i, from index vectors [Lq, 1] and [1, Lk].
    initializers.push(
      initializer('rows', Int32Array.from({ length: s.Lq }, (_, i) => i), [s.Lq, 1], DataType.INT32),
      initializer('cols', Int32Array.from({ length: s.Lk }, (_, j) => j), [1, s.Lk], DataType.INT32),
      initializer('neg_inf', Float32Array.of(-Infinity), [], F));
    nodes.push(node('LessOrEqual', ['cols', 'rows'], ['allowed']), node('Where', ['allowed', 'S', 'neg_inf'], ['Sm']));
    scores = 'Sm';
  }
  nodes.push(node('Softmax', [scores], ['P'], { axis: -1 }), node('MatMul', ['P', 'V'], ['Y']));
  return model({
    nodes, initializers,
    inputs: [tensorInfo('Q', qDims), tensorInfo('K', [s.B, s.Hkv, s.Lk, s.E]), tensorInfo('V', [s.B, s.Hkv, s.Lk, s.E])],
    outputs: [tensorInfo('Y', qDims)],
    opsets: { '': 21 },
  });
}

// [B, H, L, E] ↔ [B, L, H·E]
function bhleToBlhe(x, B, H, L, E) {
  const out = new Float32Array(x.length);
  for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) for (let l = 0; l < L; l++) {
    out.set(x.subarray(((b * H + h) * L + l) * E, ((b * H + h) * L + l + 1) * E), ((b * L + l) * H + h) * E);
  }
  return out;
}
function blheToBhle(x, B, H, L, E) {
  const out = new Float32Array(x.length);
  for (let b = 0; b < B; b++) for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
    out.set(x.subarray(((b * L + l) * H + h) * E, ((b * L + l) * H + h + 1) * E), ((b * H + h) * L + l) * E);
  }
  return out;
}
// [B, Hkv, L, E] → [B, Hkv·G, L, E], each KV head repeated for its G query heads.
function repeatHeads(x, B, Hkv, G, L, E) {
  if (G === 1) return x;
  const n = L * E, out = new Float32Array(x.length * G);
  for (let bh = 0; bh < B * Hkv; bh++) for (let g = 0; g < G; g++) out.set(x.subarray(bh * n, (bh + 1) * n), (bh * G + g) * n);
  return out;
}

// ort.env.wasm.numThreads is read once per process, when the first session initialises the
// wasm module (its global intra-op thread pool is created then); setting it afterwards is
// silently ignored (checked: 1 then 2 in one process stays at one thread's speed and
// CPU time). So one process gets one thread count: bench.mjs runs the two-thread peer in a
// child process (remote.mjs).
let processThreads = null;

export async function createPeer({ threads = 1 } = {}) {
  if (processThreads !== null && processThreads !== threads) {
    throw new Error(`onnxruntime-web: this process already uses numThreads = ${processThreads}; ` +
      `numThreads = ${threads} needs another process`);
  }
  processThreads = threads;
  ort.env.wasm.numThreads = threads;
  ort.env.wasm.proxy = false;
  ort.env.logLevel = 'error';
  const sessionOptions = { executionProviders: ['wasm'], graphOptimizationLevel: 'all' };

  const variant = (label, build, feedsFor, extra = {}) => ({
    label,
    ...extra,
    prepare: async (inputs, s) => {
      const session = await ort.InferenceSession.create(build(s), sessionOptions);
      const feeds = feedsFor(inputs, s);
      return {
        run: async () => (await session.run(feeds)).Y.data,
        toBhsd: extra.toBhsd ? (out) => extra.toBhsd(out, s) : undefined,
        dispose: () => session.release(),
      };
    },
  });
  const t = (data, dims) => new ort.Tensor('float32', data, dims);

  return {
    name: threads === 1 ? 'onnxruntime-web' : `onnxruntime-web-${threads}t`,
    version: ort.env.versions.web,
    threads,
    config: { executionProvider: 'wasm', numThreads: ort.env.wasm.numThreads, graphOptimizationLevel: 'all' },
    variants: (s) => {
      const G = s.H / s.Hkv;
      const probs = 4 * s.B * s.H * s.Lq * s.Lk;   // bytes of a materialised [B, H, Lq, Lk]
      return [
        variant('MultiHeadAttention (com.microsoft)', mhaModel,
          ({ q, k, v }) => ({
            Q: t(bhleToBlhe(q.data, s.B, s.H, s.Lq, s.E), [s.B, s.Lq, s.H * s.E]),
            K: t(repeatHeads(k.data, s.B, s.Hkv, G, s.Lk, s.E), [s.B, s.H, s.Lk, s.E]),
            V: t(repeatHeads(v.data, s.B, s.Hkv, G, s.Lk, s.E), [s.B, s.H, s.Lk, s.E]),
          }),
          {
            toBhsd: (out) => blheToBhle(out, s.B, s.H, s.Lq, s.E),
            memoryBytes: probs,
            note: `query given as [B, Lq, Hq·E] (transposed before timing)${G > 1 ? `; K/V repeated ×${G} to ${s.H} heads before timing (no GQA in this op)` : ''}`,
          }),
        variant('Attention (opset 23)', attention23Model,
          ({ q, k, v }) => ({ Q: t(q.data, q.dims), K: t(k.data, k.dims), V: t(v.data, v.dims) }),
          { memoryBytes: probs }),
        variant('MatMul-Softmax-MatMul', matmulModel,
          ({ q, k, v }) => ({ Q: t(q.data, [s.B, s.Hkv, G * s.Lq, s.E]), K: t(k.data, k.dims), V: t(v.data, v.dims) }),
          {
            memoryBytes: 2 * probs,
            unsupported: s.causal && G > 1 && s.Lq > 1 ? 'causal GQA with Lq > 1 not built for this graph' : undefined,
            note: s.causal ? 'causal mask folded into a [Lq, Lk] bool constant' : undefined,
          }),
      ];
    },
    dispose: () => {},
  };
}
