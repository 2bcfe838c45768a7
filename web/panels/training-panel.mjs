// Panel 6, training: four heads (d_k 16 and 256, with and without 1/√d_k) trained in the
// AttentionWorker, with the loss and gradient charts, the table and the summary of the run.
import { FrameMeter } from '../frame-meter.mjs';
import { TRAIN, training } from '../training.mjs';
import { drawLogChart, trailingMean } from '../training-chart.mjs';
import { demo } from '../demo-state.mjs';
import { attnWorker } from '../instances.mjs';
import { beginLongJob, endLongJob, registerLongJob } from '../long-jobs.mjs';
import { $, availableWidth, byTestId, clampOnChange, intValue } from '../page-ui.mjs';

// ── 6. Training: why 1/√d_k matters ───────────────────────────────────────────────────────
const tr = {
  steps: $('tr-steps'), lr: $('tr-lr'), seed: $('tr-seed'), start: $('tr-start'), progress: $('tr-progress'),
  phase: $('tr-phase'), lossChart: $('tr-loss-chart'), gradChart: $('tr-grad-chart'),
  meter: new FrameMeter(byTestId('tr-frame-meter')),
};
const TRAIN_COLOURS = {
  'dk16-scaled': '#1d7a46', 'dk16-unscaled': '#b4232f', 'dk256-scaled': '#1d7a46', 'dk256-unscaled': '#b4232f',
};
/** d_k = 16 dashed, 256 solid; ÷√d_k green, unscaled red. */
const trainSeries = (what) => (demo.training?.runs ?? []).map((r) => ({
  label: r.label, colour: TRAIN_COLOURS[r.id], dashed: r.dk === 16, values: trailingMean(r[what], 10),
}));
/** Redraws between steps at most this often. */
const TRAIN_DRAW_MS = 50;
const TRAIN_LOSS_BELOW = 0.1;
/** The table's and summary's early and late averages: over the first and last steps of a run (all of a shorter one). */
const TRAIN_FIRST_STEPS = 30, TRAIN_LAST_STEPS = 20;
let trainStop = false;

const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
const expText = (x) => (Number.isFinite(x) ? x.toExponential(2) : String(x));
const stepsText = (n) => `${n} step${n === 1 ? '' : 's'}`;

/** The numbers of one run that the table and the tests read. */
function trainingStats(r) {
  const n = r.losses.length;
  const tail = Math.min(TRAIN_LAST_STEPS, n), head = Math.min(TRAIN_FIRST_STEPS, n);
  const below = r.losses.findIndex((x) => x < TRAIN_LOSS_BELOW);
  return {
    firstLoss: r.losses[0], finalLoss: mean(r.losses.slice(n - tail)),
    earlyScoreGrad: mean(r.scoreGradNorms.slice(0, head)), finalScoreGrad: mean(r.scoreGradNorms.slice(n - tail)),
    earlyWeightGrad: mean(r.gradNorms.slice(0, head)),
    firstMax: r.maxWeights[0], finalMax: mean(r.maxWeights.slice(n - tail)), finalTarget: mean(r.targetWeights.slice(n - tail)),
    firstBelow: below < 0 ? null : below + 1,
    firstSteps: head, lastSteps: tail,
  };
}

export function renderTraining() {
  const t = demo.training;
  if (!t) return;
  $('tr-charts').hidden = false;
  // Side by side when the panel has room for two, else one above the other.
  const room = availableWidth(tr.lossChart);
  const width = room >= 640 ? Math.min(440, Math.floor((room - 30) / 2)) : Math.min(440, room);
  for (const canvas of [tr.lossChart, tr.gradChart]) canvas.parentElement.style.width = `${width}px`;
  drawLogChart(tr.lossChart, trainSeries('losses'), { width, steps: t.params.steps, yLabel: 'loss' });
  drawLogChart(tr.gradChart, trainSeries('scoreGradNorms'), { width, steps: t.params.steps, yLabel: '‖∂L/∂s‖' });
  // The columns' step counts: the four heads take their steps together, so one run's say it.
  const steps = t.runs[0]?.losses.length ?? 0;
  if (steps > 0) {
    for (const el of document.querySelectorAll('[data-testid="tr-table"] [data-steps]')) {
      el.textContent = stepsText(Math.min(el.dataset.steps === 'first' ? TRAIN_FIRST_STEPS : TRAIN_LAST_STEPS, steps));
    }
  }
  $('tr-rows').replaceChildren(...t.runs.filter((r) => r.losses.length).map((r) => {
    const s = trainingStats(r);
    const row = document.createElement('tr');
    row.dataset.run = r.id;
    const name = document.createElement('th');
    name.textContent = r.label;
    name.style.color = TRAIN_COLOURS[r.id];
    row.append(name);
    const cells = [
      ['final-loss', s.finalLoss.toFixed(4)],
      ['early-grad', expText(s.earlyScoreGrad)], ['final-grad', expText(s.finalScoreGrad)],
      ['early-wgrad', expText(s.earlyWeightGrad)],
      ['first-max', s.firstMax.toFixed(2)],
      ['below', s.firstBelow === null ? 'not reached' : String(s.firstBelow)],
    ];
    for (const [key, text] of cells) {
      const td = document.createElement('td');
      td.textContent = text;
      td.dataset.testid = `tr-${r.id}-${key}`;
      row.append(td);
    }
    return row;
  }));
}

/** "x.x× higher" / "x.x× lower" for `x` against `y`, or `same` within 5%. */
function comparedText(x, y, higher, lower, same) {
  if (x >= 1.05 * y) return `${(x / y).toFixed(1)}× ${higher}`;
  if (x <= y / 1.05) return `${(y / x).toFixed(1)}× ${lower}`;
  return same;
}

// The summary says what this run's numbers show: the story the panel tells (the unscaled heads
// worse) holds at the default learning rate, but not at every rate and seed a reader may choose.
function trainingSummary(runs, params) {
  const by = Object.fromEntries(runs.map((r) => [r.id, trainingStats(r)]));
  const a = by['dk256-scaled'], b = by['dk256-unscaled'], c = by['dk16-scaled'], d = by['dk16-unscaled'];
  const reached = (s) => (s.firstBelow === null ? `never got below ${TRAIN_LOSS_BELOW}` : `first got below ${TRAIN_LOSS_BELOW} at step ${s.firstBelow}`);
  const dk256 = `at d_k = 256 the head with 1/√d_k ends at a loss of ${a.finalLoss.toFixed(4)} (${reached(a)}), the unscaled ` +
    `one at ${b.finalLoss.toFixed(4)} (${comparedText(b.finalLoss, a.finalLoss, 'higher', 'lower', 'about the same')}; it ${reached(b)}). ` +
    `Over the first ${stepsText(a.firstSteps)} the gradient through the unscaled softmax was ` +
    `${comparedText(b.earlyScoreGrad, a.earlyScoreGrad, 'larger', 'smaller', 'about as large')} (‖∂L/∂s‖ ${expText(b.earlyScoreGrad)} against ` +
    `${expText(a.earlyScoreGrad)}), with its rows' largest weight at ${b.firstMax.toFixed(2)} on average from step 1.`;
  // Stuck: one-hot rows on wrong keys, a loss well above the scaled head's, and less gradient.
  const stuck = d.finalMax > 0.9 && d.finalTarget < 0.9 && d.finalLoss > 1.5 * c.finalLoss && d.finalScoreGrad < c.finalScoreGrad;
  const dk16 = `At d_k = 16: ${c.finalLoss.toFixed(4)} with the factor, ${d.finalLoss.toFixed(4)} without; over the last ` +
    `${stepsText(d.lastSteps)} the unscaled head's rows had a largest weight of ${d.finalMax.toFixed(2)} and put ${d.finalTarget.toFixed(2)} on the ` +
    `right key on average, and its ‖∂L/∂s‖ was ${expText(d.finalScoreGrad)} against ${expText(c.finalScoreGrad)} with the factor` +
    (stuck ? ': one-hot rows stuck on wrong keys with little gradient to move them off.' : '.');
  return `After ${params.steps} steps at learning rate ${params.lr}: ${dk256} ${dk16}`;
}

async function startTraining() {
  if (demo.training?.running) {
    trainStop = true;
    tr.start.textContent = 'Stopping…';
    return;
  }
  if (!beginLongJob('training')) return;
  const lr = Number(tr.lr.value);
  const params = {
    steps: intValue(tr.steps, 10, 2000),
    lr: [0.1, 0.3, 1, 3].includes(lr) ? lr : TRAIN.lr,
    seed: intValue(tr.seed, 0, 4294967295),
  };
  trainStop = false;
  const frames = tr.meter.start();
  demo.training = {
    running: true, params, config: { ...TRAIN, steps: params.steps, lr: params.lr }, runs: [], step: 0, updates: 0,
    ranIn: 'AttentionWorker', threads: attnWorker.threads, ms: 0, msPerStep: 0, frames,
  };
  for (const el of [tr.steps, tr.lr, tr.seed]) el.disabled = true;
  tr.start.textContent = 'Stop';
  byTestId('tr-summary').textContent = '';
  // The last run's table and charts go: until this run's first steps are drawn they would show
  // as if they were its own.
  $('tr-rows').replaceChildren();
  $('tr-charts').hidden = true;
  tr.progress.value = 0;
  tr.phase.textContent = 'starting…';
  const t0 = performance.now();
  try {
    let drawnAt = performance.now();
    for await (const { step, runs } of training(attnWorker, { seed: params.seed, steps: params.steps, cfg: demo.training.config })) {
      demo.training.runs = runs;
      demo.training.step = step;
      const now = performance.now();
      if (now - drawnAt >= TRAIN_DRAW_MS || step === params.steps) {
        tr.progress.value = step / params.steps;
        tr.phase.textContent = `step ${step} of ${params.steps} (4 heads, ${((now - t0) / step).toFixed(1)} ms per step)`;
        renderTraining();
        demo.training.updates++;
        drawnAt = performance.now();
        if (trainStop) break;
      }
    }
    const ms = performance.now() - t0;
    Object.assign(demo.training, { ms, msPerStep: ms / demo.training.step, stopped: trainStop });
    demo.training.stats = Object.fromEntries(demo.training.runs.map((r) => [r.id, trainingStats(r)]));
    renderTraining();
    tr.phase.textContent = trainStop
      ? `stopped at step ${demo.training.step}`
      : `done: ${params.steps} steps of the 4 heads in ${(ms / 1000).toFixed(1)} s (${(ms / params.steps).toFixed(1)} ms per step, ` +
        `2 worker calls per head and step)`;
    if (!trainStop) byTestId('tr-summary').textContent = trainingSummary(demo.training.runs, params);
  } catch (error) {
    tr.phase.textContent = `failed: ${error.message}`;
    demo.training.error = String(error.message);
  } finally {
    tr.meter.stop();
    endLongJob('training');
    demo.training.running = false;
    for (const el of [tr.steps, tr.lr, tr.seed]) el.disabled = false;
    tr.start.textContent = 'Train';
    demo.version.training++;
  }
}

/** Describes the training set-up and sets up the panel's controls (once sdpa-wasm has started). */
export function setupTrainingPanel() {
  byTestId('tr-model').textContent =
    `Each step: ${TRAIN.batch} sequences of ${TRAIN.seqLen} tokens, ${TRAIN.queries} queries each (query noise σ = ${TRAIN.noise}), ` +
    `fresh random data every step (the same for the four heads); one sdpa and one sdpaBackward call per head ` +
    `([B, H, L, d_k] = [${TRAIN.batch}, 1, ${TRAIN.seqLen}, d_k]). Plain SGD, the same learning rate for all four. ` +
    'Unscaled, the logits start with a spread of about √d_k (16 at d_k = 256): the rows are nearly one-hot from the first ' +
    'step. ‖∂L/∂W‖ is the norm of the gradient of (W_q, W_k): without the factor the chain rule multiplies ∂L/∂s by ' +
    'q or k rather than q/√d_k or k/√d_k, which at these sizes more than makes up for the saturated softmax, so the ' +
    'weights get large steps in directions that hardly change a one-hot row. The outcome depends on the learning rate ' +
    '(measured with seed 1, 300 steps, the relaxed-SIMD build, final losses of the d_k = 256 heads with and without the ' +
    'factor): 0.041 and 0.019 at rate 0.1, where the unscaled head is ahead (its larger weight gradients act as larger ' +
    'steps); 0.013 and 0.013 at 0.3; 0.0052 and 0.15 at 1; 0.0024 and 1.8 (stuck) at 3. The best of these rates gives ' +
    '0.0024 with the factor, 0.013 without. The unscaled heads\' paths are chaotic: the portable build\'s other last bits ' +
    'take them elsewhere (0.13 instead of 0.15 at rate 1), where the scaled heads end the same on both.';
  registerLongJob('training', { button: tr.start, note: 'tr-busy', name: 'the training (panel 6)', onPress: startTraining });
  clampOnChange(tr.steps, 10, 2000);
  clampOnChange(tr.seed, 0, 4294967295);
}
