// node bench/backward.mjs [--quick] [--json PATH] [--shapes b,c,e,h]
// (also run by bench.mjs after its other sections, unless it is given --no-backward)
//
// The backward pass (attn.sdpaBackward, issue #13) on shapes (b), (c), causal (e) of
// shapes.mjs, one and two threads, each build this Node runs (portable; relaxed SIMD with the
// flag), beside:
//   forward      attn.sdpa() on the same instance, in the same rounds: the backward's
//                GFLOP/s is counted as 2.5× the forward's FLOPs (as FlashAttention does), so
//                backward ÷ forward GFLOP/s = 2.5·t_forward / t_backward
//   tfjs-wasm    TensorFlow.js's wasm backend (1 thread): the gradient of the per-head
//                matMul/softmax/matMul forward (the form bench/peers/tfjs.mjs times) for the
//                same dO, with the ops its autodiff runs (openTfjs): [N, N] matrices materialised
//   scale 32     the same backward with every row's maximum and log-sum recomputed first (the
//                path of unscaled heads and huge logits: RowStats, src/kernels/sdpa-bwd-kernels.h)
//   bias         (one thread) the backward with a float [N, N] attnMask shared by the heads (a
//                learnable bias), without and with its gradient (returnMaskGrad): what the
//                mask gradient's own pass costs
// and (h) N = 32768 causal: sdpa-wasm's backward once, with the instance's peak wasm memory
// (attn.memory().peakBytes: O(N), against the 4·N² = 4 GiB one score matrix needs), and
// tfjs-wasm's attempt (it cannot hold the matrix in a wasm32 heap).
// The backward uses `saved` (the forward's output and log-sum-exp), as a training step would.
// Every first result is checked before timing: each instance's and tfjs's dQ, dK, dV on the
// first and the last head against float64 gradients (referenceHeadGradients), max abs error
// <= GRAD_RELATIVE_TOLERANCE × max |ref| for each; and each build's two-thread gradients bitwise
// its one-thread ones. A wrong entry is timed but its targets are NOT met. Medians of timed rounds
// (each round runs every entry once) after warm-up. Targets, printed met / NOT met, one thread,
// shapes b, c, e: backward ≥ 50% of the forward's GFLOP/s, ≥ 2× tfjs-wasm's; (h) completes in O(N) memory.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { spawn } from 'node:child_process';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { createAttention } from 'sdpa-wasm';
import { describeHostCpu, hostCpu } from './host.mjs';
import { DEFAULT_RESULTS_PATH, writeSection } from './results-file.mjs';
import { makeInputs, randomTensor, referenceHeadGradients } from './reference.mjs';
import { SHAPES, describe, flops } from './shapes.mjs';

export const BACKWARD_TARGETS = { vsForward: 0.5, vsTfjs: 2, shapes: ['b', 'c', 'e'] };
const RECOMPUTED_SCALE = 32;
// The gradients' check: max abs error ≤ this × max |ref| on each of dQ, dK, dV of the heads
// checked. float32 gradients here are within 2e-6 of it; a kernel that drops a term (D_i, the
// scale, a key) is off by percents.
const GRAD_RELATIVE_TOLERANCE = 1e-4;
const BIG_SHAPE = 'h';

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const fmt = (x, d = 1) => (x === null || x === undefined || !Number.isFinite(x) ? '-' : x.toFixed(d));

/**
 * tfjs-wasm, 1 thread, per head: the gradients of o = softmax(q·scale·kᵀ [+ mask])·v for dO,
 * with the ops TensorFlow.js's autodiff would run (tfjs-core's BatchMatMul and Softmax gradient
 * functions): P recomputed, dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P∘dP − P∘rowsum(P∘dP),
 * dQ = dS·K·scale, dK = dSᵀ·Q·scale. Spelled out because tfjs-core's Node bundle registers no
 * gradient functions (the tfjs umbrella package does, and is not a dependency here). Transposes
 * are explicit tf.transpose + matMul, tfjs-wasm's fast form (bench/peers/tfjs.mjs). Like
 * sdpa-wasm's backward, it recomputes P from Q and K: the [N, N] P, dP and dS are materialised.
 */
async function openTfjs() {
  const tf = await import('@tensorflow/tfjs-core');
  const tfwasm = await import('@tensorflow/tfjs-backend-wasm');
  const require = createRequire(import.meta.url);
  const dist = dirname(require.resolve('@tensorflow/tfjs-backend-wasm/dist/tfjs-backend-wasm-simd.wasm'));
  tfwasm.setWasmPaths(`${dist}/`);
  tf.env().set('WASM_HAS_MULTITHREAD_SUPPORT', false);
  tfwasm.setThreadsCount(1);
  if (!(await tf.setBackend('wasm'))) throw new Error('tfjs: the wasm backend did not initialise');
  await tf.ready();
  return {
    version: `tfjs-core ${tf.version_core}, tfjs-backend-wasm ${tfwasm.version_wasm}`,
    /** dQ, dK, dV as Float32Arrays [B·H, N, E] for the shape's inputs and dO. */
    grads(s, { q, k, v }, dO) {
      const n = s.Lq * s.E;
      const scale = 1 / Math.sqrt(s.E);
      const out = { dQuery: new Float32Array(q.data.length), dKey: new Float32Array(k.data.length), dValue: new Float32Array(v.data.length) };
      // A [Lq, Lk] float32 mask of 4 GiB or more cannot exist in a wasm32 heap (building it took
      // tfjs minutes before failing, bench/peers/tfjs.mjs): then the first [Lq, Lk] matMul runs
      // without it, and its failure is what gets recorded.
      const maskFits = 4 * s.Lq * s.Lk < 2 ** 32;
      const mask = s.causal && maskFits ? tf.tidy(() => {
        const i = tf.reshape(tf.range(0, s.Lq, 1, 'int32'), [s.Lq, 1]);
        const j = tf.reshape(tf.range(0, s.Lk, 1, 'int32'), [1, s.Lk]);
        return tf.where(tf.lessEqual(j, i), tf.scalar(0), tf.scalar(-Infinity));
      }) : null;
      try {
        for (let h = 0; h < s.B * s.H; h++) {
          const slice = (x) => x.subarray(h * n, (h + 1) * n);
          tf.tidy(() => {
            const qh = tf.tensor2d(slice(q.data), [s.Lq, s.E]);
            const kh = tf.tensor2d(slice(k.data), [s.Lk, s.E]);
            const vh = tf.tensor2d(slice(v.data), [s.Lk, s.E]);
            const dy = tf.tensor2d(slice(dO), [s.Lq, s.E]);
            let scores = tf.matMul(tf.mul(qh, scale), tf.transpose(kh));
            if (s.causal) {
              if (!mask) throw new Error(`no [${s.Lq}, ${s.Lk}] causal mask: it needs >= 4 GiB`);
              scores = tf.add(scores, mask);
            }
            const p = tf.softmax(scores);
            const dv = tf.matMul(tf.transpose(p), dy);
            const pdp = tf.mul(p, tf.matMul(dy, tf.transpose(vh)));
            const ds = tf.sub(pdp, tf.mul(p, tf.sum(pdp, 1, true)));
            const dq = tf.mul(tf.matMul(ds, kh), scale);
            const dk = tf.mul(tf.matMul(tf.transpose(ds), qh), scale);
            out.dQuery.set(dq.dataSync(), h * n);
            out.dKey.set(dk.dataSync(), h * n);
            out.dValue.set(dv.dataSync(), h * n);
          });
        }
      } finally {
        mask?.dispose();
      }
      return out;
    },
  };
}

/**
 * dQ, dK, dV ([B·H, L, E] each) against the float64 gradients of the heads in `refs` (head index
 * → referenceHeadGradients): the worst of the three errors as a fraction of each one's max |ref|.
 */
function gradientError(s, g, refs) {
  let worst = 0;
  for (const [head, ref] of refs) {
    for (const [name, L] of [['dQuery', s.Lq], ['dKey', s.Lk], ['dValue', s.Lk]]) {
      const got = g[name].subarray(head * L * s.E, (head + 1) * L * s.E), want = ref[name];
      let err = 0, max = 0;
      for (let i = 0; i < want.length; i++) {
        const d = Math.abs(got[i] - want[i]);
        err = Number.isNaN(d) ? Infinity : Math.max(err, d);
        max = Math.max(max, Math.abs(want[i]));
      }
      worst = Math.max(worst, max > 0 ? err / max : err > 0 ? Infinity : 0);
    }
  }
  return worst;
}

/** Whether two gradient results have the same bits. */
function sameGradientBits(a, b) {
  return ['dQuery', 'dKey', 'dValue'].every((name) => {
    const x = new Uint32Array(a[name].buffer, a[name].byteOffset, a[name].length);
    const y = new Uint32Array(b[name].buffer, b[name].byteOffset, b[name].length);
    return x.length === y.length && x.every((bits, i) => bits === y[i]);
  });
}

/**
 * The section in a Node process of its own (the same flags), for bench.mjs: tfjs-wasm keeps one
 * wasm module per process, and after the shapes section's (h) attempt (a trap in its wasm while
 * it allocates the [32768, 32768] scores) every later tfjs call in that process failed with
 * "memory access out of bounds". Output goes to this process's stdout; the result is read back
 * from a temporary JSON file.
 */
export async function runBackwardBenchInChild({ quick = false } = {}) {
  const dir = mkdtempSync(join(os.tmpdir(), 'sdpa-backward-'));
  const jsonPath = join(dir, 'backward.json');
  try {
    const args = [...process.execArgv, fileURLToPath(import.meta.url), '--json', jsonPath, ...(quick ? ['--quick'] : [])];
    const code = await new Promise((done, fail) => {
      const child = spawn(process.execPath, args, { stdio: ['ignore', 'inherit', 'inherit'] });
      child.on('error', fail);
      child.on('exit', (exitCode, signal) => done(signal ?? exitCode));
    });
    if (code !== 0) throw new Error(`bench/backward.mjs exited with ${code}`);
    return JSON.parse(readFileSync(jsonPath, 'utf8')).backward;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

export async function runBackwardBench({ quick = false, shapeIds = null, log = console.log } = {}) {
  const held = [];
  try {
    return await section({ quick, shapeIds, log }, held);
  } finally {
    for (const a of held) { try { a.dispose(); } catch { /* ignore */ } }
  }
}

async function section({ quick, shapeIds, log }, held) {
  const settings = quick ? { warmups: 1, rounds: 3 } : { warmups: 2, rounds: 7 };
  const ids = shapeIds ?? (quick ? ['b', 'e'] : ['b', 'c', 'e', BIG_SHAPE]);
  const host = hostCpu();
  const loadBefore = os.loadavg();
  const t0 = performance.now();
  log('');
  log(`backward (attn.sdpaBackward with saved output and log-sum-exp)${quick ? ' (--quick)' : ''}: GFLOP/s counted as 2.5× the forward's ` +
    `4·B·H·N²·E, beside the forward on the same instance and tfjs-wasm's gradient of matMul/softmax/matMul (1 thread); ` +
    `medians of ${settings.rounds} rounds after ${settings.warmups} warm-up; host ${describeHostCpu(host)}`);
  let tfjs = null;
  try {
    tfjs = await openTfjs();
  } catch (e) {
    log(`  tfjs-wasm unavailable: ${e?.message ?? e}`);
  }

  // Each build this Node runs: the portable one, and the relaxed-SIMD one where it runs it.
  const instances = [];
  for (const relaxedSimd of [false, true]) {
    for (const threads of [1, 2]) {
      const attn = await createAttention({ threads, relaxedSimd });
      held.push(attn);
      const label = `${attn.isa} ${attn.threads}t`;
      if (instances.some((x) => x.label === label)) continue;
      instances.push({ label, attn });
    }
  }

  const results = [];
  for (const id of ids.filter((x) => x !== BIG_SHAPE)) {
    const s = SHAPES.find((x) => x.id === id);
    // The gradients' reference and tfjs's per-head graph take one KV head per query head.
    if (s.Hkv !== s.H) throw new Error(`bench/backward.mjs: shape (${id}) is grouped-query (Hq ${s.H}, Hkv ${s.Hkv}); the backward section takes MHA shapes`);
    const inputs = makeInputs(s);
    const dO = randomTensor([s.B, s.H, s.Lq, s.E], 77).data;   // dO [B, H, Lq, E]
    const gradOutput = { data: dO, dims: [s.B, s.H, s.Lq, s.E] };
    const options = s.causal ? { isCausal: true } : {};
    const F = flops(s);
    const entry = { id, name: s.name, shape: describe(s), flops: F, peers: {} };

    // Check first: every instance's gradients and tfjs's against float64 ones on the first and
    // the last head, and each build's two-thread bits against its one-thread ones.
    const tRef = performance.now();
    const refs = new Map([0, s.B * s.H - 1].map((head) =>
      [head, referenceHeadGradients(s, inputs, dO, Math.floor(head / s.H), head % s.H)]));
    log(`  (${id}) float64 gradients of heads ${[...refs.keys()].join(' and ')} in ${((performance.now() - tRef) / 1000).toFixed(1)} s`);
    let tfjsGrads = null, tfjsError = null;
    if (tfjs) {
      try {
        tfjsGrads = tfjs.grads(s, inputs, dO);
        tfjsError = gradientError(s, tfjsGrads, refs);
      } catch (e) {
        log(`  (${id}) tfjs-wasm failed: ${String(e?.message ?? e).slice(0, 200)}`);
      }
    }
    const tfjsOk = tfjsError !== null && tfjsError <= GRAD_RELATIVE_TOLERANCE;
    if (tfjsError !== null && !tfjsOk) log(`  (${id}) tfjs-wasm: WRONG: gradients ${tfjsError.toExponential(1)} of max |ref| off (> ${GRAD_RELATIVE_TOLERANCE}): not compared`);
    const oneThread = new Map();  // isa → its one-thread gradients
    const runs = [];
    // The same backward with scale RECOMPUTED_SCALE: every row then has its maximum and log-sum
    // recomputed before the gradients (|scale|·‖q‖₂·max ‖k‖₂ > 64 whenever ‖q‖₂, ‖k_0‖₂ ≥ 1.5:
    // rows of E = 64 uniform in [-0.5, 0.5) have norms of 2.31 ± 0.1), the path of unscaled
    // heads and huge logits.
    const recomputedOptions = { ...options, scale: RECOMPUTED_SCALE };
    // The learnable bias: [N, N], small values (the scores stay near the plain problem's).
    const bias = { data: randomTensor([s.Lq, s.Lk], 79).data.map((x) => 0.1 * x), dims: [s.Lq, s.Lk] };
    for (const { label, attn } of instances) {
      const forward = attn.sdpa(inputs.q, inputs.k, inputs.v, { ...options, returnLogSumExp: true });
      const saved = { output: forward.output, logSumExp: forward.logSumExp };
      const g = attn.sdpaBackward(inputs.q, inputs.k, inputs.v, gradOutput, { ...options, saved });
      const grads = { dQuery: g.dQuery.data, dKey: g.dKey.data, dValue: g.dValue.data };
      const error = gradientError(s, grads, refs);
      if (attn.threads === 1) oneThread.set(attn.isa, grads);
      const bitsAsOneThread = attn.threads === 1 || !oneThread.has(attn.isa) ? null : sameGradientBits(grads, oneThread.get(attn.isa));
      const wrong = !(error <= GRAD_RELATIVE_TOLERANCE) ? `gradients ${error.toExponential(1)} of max |ref| off (> ${GRAD_RELATIVE_TOLERANCE})`
        : bitsAsOneThread === false ? 'gradients not bitwise the one-thread ones' : null;
      if (wrong) log(`  (${id}) ${label}: WRONG: ${wrong}`);
      const forward4 = attn.sdpa(inputs.q, inputs.k, inputs.v, { ...recomputedOptions, returnLogSumExp: true });
      const saved4 = { output: forward4.output, logSumExp: forward4.logSumExp };
      const run = {
        label, error, wrong, bitsAsOneThread,
        forward: () => attn.sdpa(inputs.q, inputs.k, inputs.v, options),
        backward: () => attn.sdpaBackward(inputs.q, inputs.k, inputs.v, gradOutput, { ...options, saved }),
        recomputed: () => attn.sdpaBackward(inputs.q, inputs.k, inputs.v, gradOutput, { ...recomputedOptions, saved: saved4 }),
        times: { forward: [], backward: [], recomputed: [] },
      };
      if (attn.threads === 1) {
        const biasedOptions = { ...options, attnMask: bias };
        const forwardB = attn.sdpa(inputs.q, inputs.k, inputs.v, { ...biasedOptions, returnLogSumExp: true });
        const savedB = { output: forwardB.output, logSumExp: forwardB.logSumExp };
        run.biased = () => attn.sdpaBackward(inputs.q, inputs.k, inputs.v, gradOutput, { ...biasedOptions, saved: savedB });
        run.biasGrad = () => attn.sdpaBackward(inputs.q, inputs.k, inputs.v, gradOutput, { ...biasedOptions, saved: savedB, returnMaskGrad: true });
        Object.assign(run.times, { biased: [], biasGrad: [] });
      }
      runs.push(run);
    }
    const tfjsRun = tfjsOk ? { times: [], run: () => tfjs.grads(s, inputs, dO) } : null;

    for (let w = 0; w < settings.warmups; w++) {
      for (const r of runs) {
        for (const kind of Object.keys(r.times)) r[kind]();
      }
      if (tfjsRun && w === 0) tfjsRun.run();
    }
    for (let round = 0; round < settings.rounds; round++) {
      for (const r of runs) {
        for (const kind of Object.keys(r.times)) {
          const start = performance.now();
          r[kind]();
          r.times[kind].push(performance.now() - start);
        }
      }
      if (tfjsRun && (round < 3 || !quick)) {
        const start = performance.now();
        tfjsRun.run();
        tfjsRun.times.push(performance.now() - start);
      }
    }
    const tfjsMs = tfjsRun ? median(tfjsRun.times) : null;
    entry.tfjs = tfjsRun ? { medianMs: tfjsMs, gflops: 2.5 * F / (tfjsMs * 1e6), version: tfjs.version, errorVsFloat64: tfjsError }
      : tfjsError !== null ? { wrong: true, errorVsFloat64: tfjsError, version: tfjs.version } : null;
    for (const r of runs) {
      const fwdMs = median(r.times.forward), bwdMs = median(r.times.backward), recomputedMs = median(r.times.recomputed);
      const biasedMs = r.biased ? median(r.times.biased) : null, biasGradMs = r.biased ? median(r.times.biasGrad) : null;
      entry.peers[r.label] = {
        forwardMs: fwdMs, backwardMs: bwdMs,
        forwardGflops: F / (fwdMs * 1e6), backwardGflops: 2.5 * F / (bwdMs * 1e6),
        vsForward: 2.5 * fwdMs / bwdMs, vsTfjs: tfjsMs ? tfjsMs / bwdMs : null, errorVsFloat64: r.error,
        bitsAsOneThread: r.bitsAsOneThread, wrong: r.wrong,
        recomputedMs, recomputedVsBackward: recomputedMs / bwdMs,
        biasedMs, biasGradMs, biasGradVsBiased: r.biased ? biasGradMs / biasedMs : null,
      };
    }
    results.push(entry);
    log(`  (${id}) ${s.name} ${entry.shape}: tfjs-wasm ${fmt(tfjsMs, 0)} ms (${fmt(entry.tfjs?.gflops)} GFLOP/s` +
      `${tfjsError === null ? '' : `; error vs float64 ${tfjsError.toExponential(1)} of max |ref|`})`);
    for (const [label, p] of Object.entries(entry.peers)) {
      log(`    ${label.padEnd(16)} forward ${fmt(p.forwardMs)} ms ${fmt(p.forwardGflops)} GFLOP/s; backward ${fmt(p.backwardMs)} ms ` +
        `${fmt(p.backwardGflops)} GFLOP/s = ${fmt(100 * p.vsForward, 0)}% of the forward's, ${fmt(p.vsTfjs, 2)}× tfjs-wasm` +
        `; error vs float64 ${p.errorVsFloat64.toExponential(1)} of max |ref|${p.bitsAsOneThread ? ', bitwise the one-thread gradients' : ''}` +
        `${p.wrong ? ` (WRONG: ${p.wrong})` : ''}` +
        `; scale ${RECOMPUTED_SCALE} (every row's statistics recomputed) ${fmt(p.recomputedMs)} ms = ${fmt(p.recomputedVsBackward, 2)}× the time` +
        (p.biasedMs === null ? '' : `; with an [N, N] float bias ${fmt(p.biasedMs)} ms, and its gradient ${fmt(p.biasGradMs)} ms = ` +
          `${fmt(p.biasGradVsBiased, 2)}× the time`));
    }
  }

  // (h) N = 32768 causal: once, one thread, memory measured.
  let big = null;
  if (ids.includes(BIG_SHAPE)) {
    const s = SHAPES.find((x) => x.id === BIG_SHAPE);
    const attn = await createAttention({ threads: 1 });
    held.push(attn);
    const inputs = makeInputs(s);
    const gradOutput = randomTensor([s.B, s.H, s.Lq, s.E], 78);
    const t = performance.now();
    const g = attn.sdpaBackward(inputs.q, inputs.k, inputs.v, gradOutput, { isCausal: true });
    const ms = performance.now() - t;
    const finite = [g.dQuery.data, g.dKey.data, g.dValue.data].every((a) => a.every(Number.isFinite));
    const { peakBytes } = attn.memory();
    const inputBytes = 4 * s.Lq * s.E * 8;   // Q, K, V, dO, O, dQ, dK, dV
    big = { id: s.id, shape: describe(s), ms, peakBytes, inputBytes, scoreMatrixBytes: 4 * s.Lq * s.Lk, finite };
    let tfjsError = null;
    if (tfjs) {
      try {
        tfjs.grads({ ...s }, inputs, gradOutput.data);
        tfjsError = 'completed';
      } catch (e) {
        tfjsError = String(e?.message ?? e).slice(0, 200);
      }
    }
    big.tfjs = tfjsError;
    log(`  (${s.id}) ${describe(s)}: sdpa-wasm backward (recomputing the forward) ${fmt(ms / 1000, 1)} s, peak wasm memory ` +
      `${(peakBytes / 2 ** 20).toFixed(1)} MiB (the 8 tensors of [N, E]: ${(inputBytes / 2 ** 20).toFixed(1)} MiB; one [N, N] score matrix ` +
      `would be ${(big.scoreMatrixBytes / 2 ** 30).toFixed(0)} GiB), gradients ${finite ? 'finite' : 'NOT finite'}; tfjs-wasm: ${tfjsError ?? 'not run'}`);
  }

  // Targets: one thread, each build.
  const targets = [];
  for (const e of results.filter((x) => BACKWARD_TARGETS.shapes.includes(x.id))) {
    for (const [label, p] of Object.entries(e.peers).filter(([l]) => l.endsWith(' 1t'))) {
      targets.push({ shape: e.id, build: label, wrong: p.wrong, vsForward: p.vsForward, vsForwardMet: !p.wrong && p.vsForward >= BACKWARD_TARGETS.vsForward,
        vsTfjs: p.vsTfjs, vsTfjsMet: !p.wrong && p.vsTfjs !== null && p.vsTfjs >= BACKWARD_TARGETS.vsTfjs });
    }
  }
  for (const t of targets) {
    log(`  target (${t.shape}) ${t.build}: ≥ ${100 * BACKWARD_TARGETS.vsForward}% of the forward's GFLOP/s: ${fmt(100 * t.vsForward, 0)}% ` +
      `${t.vsForwardMet ? 'met' : 'NOT met'}; ≥ ${BACKWARD_TARGETS.vsTfjs}× tfjs-wasm: ${fmt(t.vsTfjs, 2)}× ${t.vsTfjsMet ? 'met' : 'NOT met'}` +
      `${t.wrong ? ` (its gradients are WRONG: ${t.wrong})` : ''}`);
  }
  // O(N): the peak is within twice the eight [N, E] tensors (their copies in wasm memory plus
  // O(N·E) scratch), where one [N, N] matrix alone would be N/(8·E)·(N·E·4) bytes.
  if (big) {
    big.oN = big.finite && big.peakBytes <= 2 * big.inputBytes;
    log(`  target (h): completes in O(N) memory (peak ≤ 2× the eight [N, E] tensors): ${big.oN ? 'met' : 'NOT met'}`);
  }
  const seconds = (performance.now() - t0) / 1000;
  log(`  load average before ${loadBefore.map((x) => x.toFixed(2)).join(' ')}, after ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}; ${seconds.toFixed(0)} s`);
  return { host, settings: { ...settings, gradRelativeTolerance: GRAD_RELATIVE_TOLERANCE }, targets: BACKWARD_TARGETS, shapes: results, big, targetResults: targets, seconds, tfjs: tfjs?.version ?? null };
}

// Standalone: node bench/backward.mjs [--quick] [--json PATH] [--shapes b,e]
if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const argv = process.argv.slice(2);
  const arg = (name) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : undefined; };
  const jsonPath = arg('--json') ? resolve(arg('--json')) : DEFAULT_RESULTS_PATH;
  const result = await runBackwardBench({ quick: argv.includes('--quick'), shapeIds: arg('--shapes')?.split(',') ?? null });
  writeSection(jsonPath, 'backward', result);
}
