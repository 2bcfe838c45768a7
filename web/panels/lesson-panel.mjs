// Panel 2, why √d_k: attention with and without the 1/√d_k factor across head sizes (the
// small maps, the chart of the logits' spread and the table of row statistics).
import { randomQKV } from '../seeded.mjs';
import { drawChart, drawHeatmap, drawLegend } from '../heatmap.mjs';
import { demo } from '../demo-state.mjs';
import { attn } from '../instances.mjs';
import { $, availableWidth, clampOnChange, errorText, intValue, showPanelError } from '../page-ui.mjs';

// ── 2. Why √d_k ───────────────────────────────────────────────────────────────────────────
const DKS = [16, 32, 64, 128, 256, 512];
const ls = { seqLen: $('ls-seqlen'), seed: $('ls-seed') };

/** Mean over rows of the entropy, the largest weight and Σ p(1 − p). */
function rowStats(w, L) {
  let entropy = 0, largest = 0, gradient = 0;
  for (let i = 0; i < L; i++) {
    let h = 0, m = 0, g = 0;
    for (let j = 0; j < L; j++) {
      const p = w[i * L + j];
      if (p > 0) h -= p * Math.log(p);
      if (p > m) m = p;
      g += p * (1 - p);
    }
    entropy += h;
    largest += m;
    gradient += g;
  }
  return { entropy: entropy / L, largest: largest / L, gradient: gradient / L };
}

/** Standard deviation of all raw dot products q_i·k_j (float64). */
function logitStd(q, k, L, E) {
  let sum = 0, sum2 = 0;
  for (let i = 0; i < L; i++) {
    for (let j = 0; j < L; j++) {
      let dot = 0;
      for (let d = 0; d < E; d++) dot += q[i * E + d] * k[j * E + d];
      sum += dot;
      sum2 += dot * dot;
    }
  }
  const n = L * L, mean = sum / n;
  return Math.sqrt(Math.max(0, sum2 / n - mean * mean));
}

export function computeLesson() {
  const L = intValue(ls.seqLen, 2, 64), seed = intValue(ls.seed, 0, 4294967295);
  // An error from sdpa-wasm is shown in the panel (and the old numbers taken away), not thrown
  // out of the input listener.
  try {
    const rows = DKS.map((dk) => {
      const { query, key, value } = randomQKV({ seqLen: L, dk, heads: 1, seed });
      const scaled = attn.sdpa(query, key, value, { returnWeights: true }).weights.data;
      const unscaled = attn.sdpa(query, key, value, { returnWeights: true, scale: 1 }).weights.data;
      const std = logitStd(query.data, key.data, L, dk);
      return { dk, sqrtDk: Math.sqrt(dk), std, scaledStd: std / Math.sqrt(dk), scaled: rowStats(scaled, L), unscaled: rowStats(unscaled, L), weightsScaled: scaled, weightsUnscaled: unscaled };
    });
    demo.lesson = { L, seed, maxEntropy: Math.log(L), rows, error: null };
  } catch (error) {
    demo.lesson = { L, seed, maxEntropy: Math.log(L), rows: [], error: errorText(error) };
  }
  renderLesson();
  demo.version.lesson++;
}

export function renderLesson() {
  const { L, rows, maxEntropy, error } = demo.lesson;
  showPanelError('lesson-error', error);
  $('ls-chart').hidden = error !== null;
  if (error !== null) {
    $('ls-maps').replaceChildren();
    $('ls-rows').replaceChildren();
    return;
  }
  $('ls-size').textContent = `${L} queries × ${L} keys`;
  const maps = $('ls-maps');
  const cell = Math.max(2, Math.min(4, Math.floor(112 / L)));
  maps.replaceChildren(...rows.map((r) => {
    const card = document.createElement('div');
    card.className = 'minimap';
    card.dataset.dk = String(r.dk);
    const head = document.createElement('b');
    head.textContent = `d_k = ${r.dk}`;
    const a = document.createElement('canvas');
    const b = document.createElement('canvas');
    drawHeatmap(a, r.weightsScaled, L, L, { compact: true, maxCell: cell, minCell: cell, title: '÷ √d_k' });
    drawHeatmap(b, r.weightsUnscaled, L, L, { compact: true, maxCell: cell, minCell: cell, title: 'unscaled' });
    const lbl = document.createElement('span');
    lbl.className = 'lbl';
    lbl.textContent = `max p ${r.scaled.largest.toFixed(2)} → ${r.unscaled.largest.toFixed(2)}`;
    card.append(head, a, b, lbl);
    return card;
  }));
  drawLegend($('ls-legend'), { width: 300, vmax: 1, label: 'attention weight (both rows of maps, 0 … 1)', showBlocked: false });
  drawChart($('ls-chart'), [
    { label: 'unscaled', colour: '#b4232f', dots: true, points: rows.map((r) => [r.dk, r.std]) },
    { label: '÷ √d_k', colour: '#1d7a46', dots: true, points: rows.map((r) => [r.dk, r.scaledStd]) },
    { label: '√d_k', colour: '#1f2430', dashed: true, points: rows.map((r) => [r.dk, r.sqrtDk]) },
  ], { width: Math.min(360, availableWidth($('ls-chart'))), height: 210, xLabel: 'd_k (log scale)', yLabel: 'std of logits', xTicks: DKS });
  $('ls-hmax').textContent = `Means over the ${L} rows. Entropy in nats: a uniform row has ln ${L} = ${maxEntropy.toFixed(2)}, ` +
    'a one-hot row 0. Σ p(1−p) is the trace of the softmax Jacobian: the size of the gradient that flows back through the softmax.';
  const f = (x, digits = 3) => x.toFixed(digits);
  $('ls-rows').replaceChildren(...rows.map((r) => {
    const tr = document.createElement('tr');
    tr.dataset.dk = String(r.dk);
    const cells = [
      ['dk', String(r.dk), false, 'th'],
      ['sqrt', f(r.sqrtDk, 2)],
      ['std', f(r.std, 2)],
      ['entropy-scaled', f(r.scaled.entropy)],
      ['entropy-unscaled', f(r.unscaled.entropy), r.unscaled.entropy < 0.15 * maxEntropy],
      ['largest-scaled', f(r.scaled.largest)],
      ['largest-unscaled', f(r.unscaled.largest), r.unscaled.largest > 0.85],
      ['gradient-scaled', f(r.scaled.gradient)],
      ['gradient-unscaled', f(r.unscaled.gradient), r.unscaled.gradient < 0.2],
    ];
    for (const [key, text, saturated, tag = 'td'] of cells) {
      const td = document.createElement(tag);
      td.textContent = text;
      td.dataset.testid = `ls-${key}-${r.dk}`;
      if (saturated) td.className = 'sat';
      tr.append(td);
    }
    return tr;
  }));
}

/** Sets up the panel's controls (once sdpa-wasm has started). */
export function setupLessonPanel() {
  for (const el of [ls.seqLen, ls.seed]) el.addEventListener('input', computeLesson);
  clampOnChange(ls.seqLen, 2, 64);
  clampOnChange(ls.seed, 0, 4294967295);
}
