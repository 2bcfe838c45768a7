// Panel 6's model: one attention head trained on a toy retrieval task, with the package's
// sdpa() forward and sdpaBackward() backward, and the projections' gradients chained in plain
// JavaScript. Shared with the browser test, which imports it in Node and retrains the first
// steps to check the page's numbers: the data, weights, losses and gradients use only + − × ÷
// and Math.sqrt (the same bits in every engine), so they match bit for bit; the diagnostics
// (largest weight, ∂L/∂s) use Math.exp, which engines need not round alike.
//
// The task. A sequence of L tokens, each a random embedding x_j ∈ R^d_model (unit-variance
// entries) carrying a random value vector v_j ∈ R^d_v. A query token is a noisy copy of one of
// them, x_q = x_t + σ·noise; the right answer is v_t. The head:
//   q = x_q·W_q,  k_j = x_j·W_k   (W_q, W_k: [d_model, d_k], trained)
//   out = sdpa(q, K, V = the values, { scale })
//   loss = mean over queries and value entries of (out − v_t)²
// Solved, q·k_t stands out and out ≈ v_t (loss → 0); attending uniformly gives out ≈ the mean
// value (loss ≈ 1); attending to one wrong key gives loss ≈ 2.
//
// W_q and W_k start with N(0, 1/d_model)-like entries, so q and k have unit-variance entries
// and the unscaled logit q·k has a spread of about √d_k: the textbook setting of "Attention Is
// All You Need", §3.2.1, where the 1/√d_k factor comes from.
import { seedOf, uniformStream, unitNoise } from './seeded.mjs';

export const TRAIN = {
  dModel: 32,
  seqLen: 16,       // L keys per sequence
  queries: 4,       // queries per sequence
  batch: 8,         // sequences per step
  valueDim: 16,     // d_v
  noise: 0.5,       // σ of the query's noise
  steps: 300,
  lr: 1,            // plain SGD, the same rate for all four runs
  dks: [16, 256],
};

/** The four runs, in the order they are drawn: d_k × scale. */
export const RUNS = TRAIN.dks.flatMap((dk) => [
  { id: `dk${dk}-scaled`, dk, scaled: true, scale: 1 / Math.sqrt(dk), label: `d_k ${dk}, ÷√d_k` },
  { id: `dk${dk}-unscaled`, dk, scaled: false, scale: 1, label: `d_k ${dk}, unscaled` },
]);

/** The initial W_q, W_k of a d_k: the same for the scaled and unscaled runs of that d_k. */
export function initialWeights(dk, seed, cfg = TRAIN) {
  const n = cfg.dModel * dk;
  const std = 1 / Math.sqrt(cfg.dModel);
  const scaleBy = (a) => { for (let i = 0; i < a.length; i++) a[i] *= std; return a; };
  return {
    wq: scaleBy(unitNoise(n, seedOf(seed, 'train-wq', dk))),
    wk: scaleBy(unitNoise(n, seedOf(seed, 'train-wk', dk))),
  };
}

/**
 * Step `step`'s batch: the same for every run. x [B, L, d_model], xq [B, Lq, d_model],
 * values [B, L, d_v], targets [B, Lq] (indices of the copied keys).
 */
export function makeBatch(step, seed, cfg = TRAIN) {
  const { batch: B, seqLen: L, queries: Lq, dModel: D, valueDim: Dv, noise } = cfg;
  const x = unitNoise(B * L * D, seedOf(seed, 'train-x', step));
  const values = unitNoise(B * L * Dv, seedOf(seed, 'train-v', step));
  const jitter = unitNoise(B * Lq * D, seedOf(seed, 'train-noise', step));
  const pick = uniformStream(seedOf(seed, 'train-pick', step));
  const targets = new Int32Array(B * Lq);
  const xq = new Float32Array(B * Lq * D);
  for (let b = 0; b < B; b++) {
    for (let i = 0; i < Lq; i++) {
      const t = Math.floor(pick() * L);
      targets[b * Lq + i] = t;
      const src = (b * L + t) * D, dst = (b * Lq + i) * D;
      for (let m = 0; m < D; m++) xq[dst + m] = x[src + m] + noise * jitter[dst + m];
    }
  }
  return { x, xq, values, targets };
}

/** rows [n, D] · W [D, E] → [n, E] (float32, accumulated in float64). */
function project(rows, n, D, w, E) {
  const out = new Float32Array(n * E);
  const acc = new Float64Array(E);
  for (let r = 0; r < n; r++) {
    acc.fill(0);
    for (let m = 0; m < D; m++) {
      const a = rows[r * D + m];
      const wr = m * E;
      for (let e = 0; e < E; e++) acc[e] += a * w[wr + e];
    }
    out.set(acc, r * E);
  }
  return out;
}

/** rowsᵀ [D, n] · grad [n, E] → [D, E]: a projection's weight gradient. */
function weightGradient(rows, n, D, grad, E) {
  const out = new Float64Array(D * E);
  for (let r = 0; r < n; r++) {
    for (let m = 0; m < D; m++) {
      const a = rows[r * D + m];
      const or = m * E, gr = r * E;
      for (let e = 0; e < E; e++) out[or + e] += a * grad[gr + e];
    }
  }
  return out;
}

const norm = (a) => { let s = 0; for (let i = 0; i < a.length; i++) s += a[i] * a[i]; return Math.sqrt(s); };

/**
 * One run's state: its weights and the measurements of the steps so far. `attn` is anything
 * with sdpa() and sdpaBackward() returning values or promises (an Attention, an AttentionWorker).
 */
export class HeadRun {
  constructor(run, seed, cfg = TRAIN) {
    Object.assign(this, { ...run, cfg, seed });
    const w = initialWeights(run.dk, seed, cfg);
    this.wq = w.wq;
    this.wk = w.wk;
    this.losses = [];       // per step, before the update
    this.gradNorms = [];    // ‖(∂L/∂W_q, ∂L/∂W_k)‖ per step
    this.scoreGradNorms = [];  // ‖∂L/∂s‖ per step, s the softmax's input
    this.maxWeights = [];   // the mean largest attention weight per step (how peaked the rows are)
    this.targetWeights = [];  // the mean weight on the right key per step
  }

  /**
   * The forward and backward passes of one batch, without the update:
   * { loss, dWq, dWk, gradNorm, meanMax, meanTarget }.
   */
  async gradients(attn, batch) {
    const { batch: B, seqLen: L, queries: Lq, dModel: D, valueDim: Dv } = this.cfg;
    const E = this.dk;
    const q = { data: project(batch.xq, B * Lq, D, this.wq, E), dims: [B, 1, Lq, E] };
    const k = { data: project(batch.x, B * L, D, this.wk, E), dims: [B, 1, L, E] };
    const v = { data: batch.values, dims: [B, 1, L, Dv] };
    const options = { scale: this.scale };
    const forward = await attn.sdpa(q, k, v, { ...options, returnLogSumExp: true });
    const out = forward.output.data;
    // loss = mean (out − v_t)², and ∂loss/∂out.
    const n = B * Lq * Dv;
    const gradOut = new Float32Array(n);
    let loss = 0;
    for (let b = 0; b < B; b++) {
      for (let i = 0; i < Lq; i++) {
        const t = batch.targets[b * Lq + i];
        const o = (b * Lq + i) * Dv, tv = (b * L + t) * Dv;
        for (let d = 0; d < Dv; d++) {
          const diff = out[o + d] - batch.values[tv + d];
          loss += diff * diff;
          gradOut[o + d] = (2 * diff) / n;
        }
      }
    }
    loss /= n;
    // How peaked the rows are, and the weight on the right key: from the saved log-sum-exp,
    // p_tj = exp(scale·q·k_j − lse) (cheap in JS at these sizes).
    const lse = forward.logSumExp.data;
    // Also ∂loss/∂s for the softmax's input s = scale·q·k: dS_ij = p_ij (dP_ij − Σ_j' p_ij' dP_ij')
    // with dP_ij = ∂loss/∂out_i · v_j, the gradient that comes back through the softmax.
    let meanMax = 0, meanTarget = 0, scoreGrad2 = 0;
    const p = new Float64Array(L), dP = new Float64Array(L);
    for (let b = 0; b < B; b++) {
      for (let i = 0; i < Lq; i++) {
        const r = b * Lq + i;
        let best = -Infinity, target = 0, mean = 0;
        for (let j = 0; j < L; j++) {
          let s = 0;
          for (let e = 0; e < E; e++) s += q.data[r * E + e] * k.data[(b * L + j) * E + e];
          p[j] = Math.exp(this.scale * s - lse[r]);
          let g = 0;
          for (let d = 0; d < Dv; d++) g += gradOut[r * Dv + d] * batch.values[(b * L + j) * Dv + d];
          dP[j] = g;
          mean += p[j] * g;
          if (p[j] > best) best = p[j];
          if (j === batch.targets[r]) target = p[j];
        }
        for (let j = 0; j < L; j++) scoreGrad2 += (p[j] * (dP[j] - mean)) ** 2;
        meanMax += best;
        meanTarget += target;
      }
    }
    const back = await attn.sdpaBackward(q, k, v, { data: gradOut, dims: forward.output.dims },
      { ...options, saved: { output: forward.output, logSumExp: forward.logSumExp } });
    const dWq = weightGradient(batch.xq, B * Lq, D, back.dQuery.data, E);
    const dWk = weightGradient(batch.x, B * L, D, back.dKey.data, E);
    const gradNorm = Math.sqrt(norm(dWq) ** 2 + norm(dWk) ** 2);
    return { loss, dWq, dWk, gradNorm, scoreGradNorm: Math.sqrt(scoreGrad2), meanMax: meanMax / (B * Lq), meanTarget: meanTarget / (B * Lq), output: out };
  }

  /** One SGD step on `batch`: records the loss and gradient norm, updates W_q, W_k. */
  async step(attn, batch) {
    const g = await this.gradients(attn, batch);
    const lr = this.cfg.lr;
    for (let i = 0; i < this.wq.length; i++) {
      this.wq[i] -= lr * g.dWq[i];
      this.wk[i] -= lr * g.dWk[i];
    }
    this.losses.push(g.loss);
    this.gradNorms.push(g.gradNorm);
    this.scoreGradNorms.push(g.scoreGradNorm);
    this.maxWeights.push(g.meanMax);
    this.targetWeights.push(g.meanTarget);
    return g;
  }
}

/** The four runs trained side by side, one step of each at a time: yields after each step. */
export async function* training(attn, { seed = 1, steps = TRAIN.steps, cfg = TRAIN } = {}) {
  const runs = RUNS.map((r) => new HeadRun(r, seed, cfg));
  for (let step = 0; step < steps; step++) {
    const batch = makeBatch(step, seed, cfg);
    // Started together: through a worker, the four forward calls travel as one message, and
    // then the four backward calls.
    await Promise.all(runs.map((run) => run.step(attn, batch)));
    yield { step: step + 1, runs };
  }
}
