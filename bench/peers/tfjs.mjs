// TensorFlow.js with the wasm backend (XNNPACK inside), one thread, per head:
//   S = matMul(q_h · scale, transpose(k_h)); [S += causal mask]; P = softmax(S); o_h = matMul(P, v_h)
// and o_h read back into the output array. A timed run starts from the Float32Array inputs
// (creating the tensors copies them into the backend's wasm heap, as sdpa-wasm and
// onnxruntime-web do on every call) and ends with the output in a Float32Array.
// The causal mask (0 / -Infinity, [Lq, Lk]) is a tensor built once before timing.
//
// Per-head 2-D matMuls with an explicit transpose were chosen after a probe on this machine:
// batched 3-D matMul and matMul(..., transposeB = true) take tfjs-wasm's slow path (≈ 2–4
// GFLOP/s at N = 512…2048, against ≈ 20 for this form). tfjs-wasm's matMul packs its second
// operand (XNNPACK "weights") on every call with a new tensor, so for decode (Lq = 1) a second
// form is tried as well, scoresᵀ = matMul(k_h, transpose(q_h · scale)), which packs the tiny
// q instead of K (≈ 3.5× faster there in the same probe); the faster form is reported.
// GQA: the G query heads of one KV head are contiguous, so they form one [G·Lq, E] matrix.
import { dirname } from 'node:path';
import { createRequire } from 'node:module';
import * as tf from '@tensorflow/tfjs-core';
import * as tfwasm from '@tensorflow/tfjs-backend-wasm';

// One KV head: q [rows, E], k and v [Lk, E] → [rows, E]. The first error is the one thrown:
// once a wasm heap is broken, tidy's clean-up fails as well and would hide it.
function oneHead(s, rows, qData, kData, vData, scale, mask, keysFirst) {
  let firstError = null;
  const step = (what, f) => {
    try { return f(); } catch (e) { throw (firstError ??= new Error(`${what}: ${e?.message ?? e}`)); }
  };
  let result;
  try {
    // The result leaves through a variable: tidy() walks whatever the callback returns, which
    // for a large Float32Array costs milliseconds.
    tf.tidy(() => {
      const qh = tf.tensor2d(qData, [rows, s.E]);
      const kh = tf.tensor2d(kData, [s.Lk, s.E]);
      const vh = tf.tensor2d(vData, [s.Lk, s.E]);
      let scores = step(`matMul to the [${rows}, ${s.Lk}] scores`, () => (keysFirst
        ? tf.transpose(tf.matMul(kh, tf.transpose(tf.mul(qh, scale))))
        : tf.matMul(tf.mul(qh, scale), tf.transpose(kh))));
      if (s.causal) {
        if (!mask) throw (firstError = new Error(`no [${s.Lq}, ${s.Lk}] causal mask: it needs >= 4 GiB`));
        scores = tf.add(scores, mask);
      }
      result = step('softmax and matMul with V', () => tf.matMul(tf.softmax(scores), vh).dataSync());
    });
  } catch (e) {
    throw firstError ?? e;
  }
  return result;
}

export async function createPeer() {
  const require = createRequire(import.meta.url);
  const dist = dirname(require.resolve('@tensorflow/tfjs-backend-wasm/dist/tfjs-backend-wasm-simd.wasm'));
  tfwasm.setWasmPaths(`${dist}/`);               // the package's own dist folder on disk
  tf.env().set('WASM_HAS_MULTITHREAD_SUPPORT', false);
  tfwasm.setThreadsCount(1);
  if (!(await tf.setBackend('wasm'))) throw new Error('tfjs: the wasm backend did not initialise');
  await tf.ready();

  return {
    name: 'tfjs-wasm',
    version: `tfjs-core ${tf.version_core}, tfjs-backend-wasm ${tfwasm.version_wasm}`,
    config: {
      backend: tf.getBackend(), simd: tf.env().getBool('WASM_HAS_SIMD_SUPPORT'),
      multithread: tf.env().getBool('WASM_HAS_MULTITHREAD_SUPPORT'), threads: tfwasm.getThreadsCount(),
      wasmPaths: `${dist}/`,
    },
    variants: (s) => {
      const G = s.H / s.Hkv;
      const forms = [{ label: 'per-head matMul/softmax/matMul', keysFirst: false }];
      if (s.Lq === 1) forms.push({ label: 'per-head, scores as K·qᵀ', keysFirst: true });
      return forms.map(({ label, keysFirst }) => ({
        label,
        memoryBytes: 4 * G * s.Lq * s.Lk * (s.causal ? 3 : 2),   // scores, softmax (and the mask)
        unsupported: s.causal && G > 1 && s.Lq > 1 ? 'causal GQA with Lq > 1 not built' : undefined,
        prepare: async ({ q, k, v }) => {
          const rows = G * s.Lq, qn = rows * s.E, kn = s.Lk * s.E;
          let mask = null;
          // A [Lq, Lk] float32 mask of 4 GiB or more cannot exist in a wasm32 heap; building it
          // anyway took tfjs minutes before failing, so then the run goes straight to the first
          // [Lq, Lk] matMul, whose failure is what gets recorded.
          const maskFits = 4 * s.Lq * s.Lk < 2 ** 32;
          if (s.causal && maskFits) {
            try {
              mask = tf.tidy(() => {
                const i = tf.reshape(tf.range(0, s.Lq, 1, 'int32'), [s.Lq, 1]);
                const j = tf.reshape(tf.range(0, s.Lk, 1, 'int32'), [1, s.Lk]);
                return tf.where(tf.lessEqual(j, i), tf.scalar(0), tf.scalar(-Infinity));
              });
            } catch (e) {
              throw new Error(`building the [${s.Lq}, ${s.Lk}] causal mask tensor: ${e?.message ?? e}`);
            }
          }
          const scale = tf.scalar(1 / Math.sqrt(s.E));
          return {
            run: () => {
              const out = new Float32Array(q.data.length);
              for (let h = 0; h < s.B * s.Hkv; h++) {
                const qh = q.data.subarray(h * qn, (h + 1) * qn);
                const kh = k.data.subarray(h * kn, (h + 1) * kn), vh = v.data.subarray(h * kn, (h + 1) * kn);
                out.set(oneHead(s, rows, qh, kh, vh, scale, mask, keysFirst), h * qn);
              }
              return out;
            },
            dispose: () => { mask?.dispose(); scale.dispose(); },
          };
        },
      }));
    },
    dispose: () => {},
  };
}
