// Panel 3, masking right and wrong: a causal-and-padding mask applied before the softmax
// (sdpa-wasm) against after it, and the textbook softmax on a fully masked row.
import { formatValue, randomQKV } from '../seeded.mjs';
import { drawHeatmap } from '../heatmap.mjs';
import { naiveSoftmax, weightsTimesValues } from '../plain-attention.mjs';
import { demo } from '../demo-state.mjs';
import { attn } from '../instances.mjs';
import { $, availableWidth, clampOnChange, errorText, intValue, showPanelError } from '../page-ui.mjs';

// ── 3. Masking right and wrong ────────────────────────────────────────────────────────────
const MASK_L = 8, MASK_E = 16;
const mk = { padding: $('mk-padding'), seed: $('mk-seed') };

export function computeMasking() {
  const pad = intValue(mk.padding, 1, 3), seed = intValue(mk.seed, 0, 4294967295);
  // An error from sdpa-wasm is shown in the panel (and the old pictures taken away), not thrown
  // out of the input listener.
  try {
    computeMaskingWith(pad, seed);
  } catch (error) {
    demo.masking = { pad, seed, error: errorText(error) };
  }
  renderMasking();
  demo.version.masking++;
}

function computeMaskingWith(pad, seed) {
  const L = MASK_L, E = MASK_E, valid = L - pad;
  const { query, key, value } = randomQKV({ seqLen: L, dk: E, heads: 1, seed });
  // Causal, and padding tokens at the end: they are neither attended nor attend anything.
  const allowed = (i, j) => j <= i && j < valid && i < valid;
  const mask = new Float32Array(L * L);
  for (let i = 0; i < L; i++) for (let j = 0; j < L; j++) mask[i * L + j] = allowed(i, j) ? 0 : -Infinity;

  const right = attn.sdpa(query, key, value, { attnMask: { data: mask, dims: [L, L] }, returnWeights: true });
  const unmasked = attn.sdpa(query, key, value, { returnWeights: true });
  const wrongWeights = unmasked.weights.data.map((p, at) => (allowed(Math.floor(at / L), at % L) ? p : 0));
  const wrongOutput = weightsTimesValues(wrongWeights, value.data, L, E);
  const rowSums = (w) => Array.from({ length: L }, (_, i) => w.subarray(i * L, (i + 1) * L).reduce((a, b) => a + b, 0));

  // The textbook softmax on the padding query row (every logit −∞).
  const padRow = L - 1;
  const scale = 1 / Math.sqrt(E);
  const logits = Array.from({ length: L }, (_, j) => {
    let dot = 0;
    for (let d = 0; d < E; d++) dot += query.data[padRow * E + d] * key.data[j * E + d];
    return dot * scale + mask[padRow * L + j];
  });
  const naiveWeights = naiveSoftmax(logits);
  const naiveOutput = Array.from({ length: E }, (_, c) => naiveWeights.reduce((acc, p, j) => acc + p * value.data[j * E + c], 0));

  let shrink = 0;
  for (let i = 0; i < valid; i++) {
    for (let c = 0; c < E; c++) shrink = Math.max(shrink, Math.abs(right.output.data[i * E + c] - wrongOutput[i * E + c]));
  }
  demo.masking = {
    L, E, pad, seed, valid, padRow,
    rightWeights: right.weights.data, rightOutput: right.output.data, rightRowSums: rowSums(right.weights.data),
    wrongWeights, wrongOutput, wrongRowSums: rowSums(wrongWeights),
    naiveWeights, naiveOutput, maxOutputDifference: shrink, error: null,
  };
}

export function renderMasking() {
  const m = demo.masking;
  showPanelError('mask-error', m.error);
  for (const id of ['mk-right', 'mk-wrong']) $(id).hidden = m.error !== null;
  if (m.error !== null) {
    for (const id of ['mk-right-sums', 'mk-wrong-sums', 'mk-padded-sdpa', 'mk-padded-weights', 'mk-padded-naive']) $(id).textContent = '–';
    $('mk-summary').textContent = '';
    return;
  }
  const { L, valid } = m;
  const blocked = (i, j) => !(j <= i && j < valid && i < valid);
  const width = Math.min(availableWidth($('mk-right')), 340);
  // Rows with keys to attend should sum to 1; the padding rows have none and sum to 0.
  const notes = (sums) => sums.map((s, i) => ({ text: s.toFixed(3), warn: i < valid && Math.abs(s - 1) > 1e-3 }));
  drawHeatmap($('mk-right'), m.rightWeights, L, L, { width, maxCell: 30, blocked, vmax: 1, rowNotes: notes(m.rightRowSums), xTitle: 'key j', yTitle: 'query i' });
  drawHeatmap($('mk-wrong'), m.wrongWeights, L, L, { width, maxCell: 30, blocked, vmax: 1, rowNotes: notes(m.wrongRowSums), xTitle: 'key j', yTitle: 'query i' });
  $('mk-right-sums').textContent = m.rightRowSums.map((s) => s.toFixed(3)).join(' ');
  $('mk-wrong-sums').textContent = m.wrongRowSums.map((s) => s.toFixed(3)).join(' ');
  const show = (values, n = 6) => Array.from(values).slice(0, n).map(formatValue).join('  ') + '  …';
  $('mk-caption').textContent = `Query row ${m.padRow} is padding: every key is blocked for it`;
  $('mk-padded-sdpa').textContent = show(m.rightOutput.subarray(m.padRow * m.E, (m.padRow + 1) * m.E));
  $('mk-padded-weights').textContent = show(m.rightWeights.subarray(m.padRow * L, (m.padRow + 1) * L));
  $('mk-padded-naive').textContent = show(m.naiveOutput);
  const kept = m.wrongRowSums.slice(0, valid);
  $('mk-summary').textContent =
    `Masked after the softmax, rows 0–${valid - 1} keep only ${Math.min(...kept).toFixed(3)}–${Math.max(...kept).toFixed(3)} ` +
    `of their probability instead of 1, and their outputs move by up to ${m.maxOutputDifference.toFixed(3)}.`;
}

/** Sets up the panel's controls (once sdpa-wasm has started). */
export function setupMaskingPanel() {
  for (const el of [mk.padding, mk.seed]) el.addEventListener(el.tagName === 'SELECT' ? 'change' : 'input', computeMasking);
  clampOnChange(mk.seed, 0, 4294967295);
}
