// Panel 1, attention weights: the heatmap of one head's weights, its controls, and the readout of
// the hovered (or keyboard-selected) cell and its output row.
import { formatValue, heatmapInputs, tokenize, TOY_HEAD_KINDS } from '../seeded.mjs';
import { drawHeatmap, drawLegend } from '../heatmap.mjs';
import { demo } from '../demo-state.mjs';
import { attn } from '../instances.mjs';
import { $, availableWidth, byTestId, clampOnChange, errorText, intValue, showPanelError } from '../page-ui.mjs';

// ── 1. Attention weights ──────────────────────────────────────────────────────────────────
const hm = {
  source: $('hm-source'), text: $('hm-text'), seqLen: $('hm-seqlen'), dk: $('hm-dk'),
  heads: $('hm-heads'), head: $('hm-head'), causal: $('hm-causal'), window: $('hm-window'), padding: $('hm-padding'),
  softcap: $('hm-softcap'), sink: $('hm-sink'), alibi: $('hm-alibi'), seed: $('hm-seed'), vscale: $('hm-vscale'), canvas: $('hm-canvas'),
  legend: $('hm-legend'),
};
let hmState = null;
let hover = { i: 0, j: 0 };
/**
 * Whether the canvas had the keyboard focus when its map was cleared (hiding it drops the focus
 * to the page), and no element has taken the focus since.
 */
let canvasFocusLost = false;

const FLOAT32_MAX = 3.4028234663852886e38, FLOAT32_MIN_POSITIVE = 1.401298464324817e-45;

/**
 * The softcap field: empty or 0 is off; otherwise it must be > 0 and stay finite and > 0 in
 * float32, the kernel's type (1e-300 would be 0 there, which means off, and 1e308 Infinity), so
 * that the page never shows a map computed with another value than the field's. Returns
 * { softcap, error }.
 */
function readSoftcap() {
  const text = hm.softcap.value.trim();
  const x = Number(text);
  if (text === '' || x === 0) return { softcap: 0, error: null };
  if (!(x > 0)) return { softcap: 0, error: `Logit softcap must be > 0 (0 turns it off), got ${text}.` };
  const asFloat32 = Math.fround(x);
  if (!(asFloat32 > 0) || !Number.isFinite(asFloat32)) {
    return {
      softcap: 0,
      error: `Logit softcap ${text} is outside float32's range (${FLOAT32_MIN_POSITIVE} to ${FLOAT32_MAX}), ` +
        'the type sdpa-wasm computes in; 0 turns it off.',
    };
  }
  return { softcap: x, error: null };
}

/**
 * The attention-sink field: empty is off (null); otherwise a logit that stays finite in float32
 * (the kernel's type). Returns { sink, error }.
 */
function readSink() {
  const text = hm.sink.value.trim();
  if (text === '') return { sink: null, error: null };
  const x = Number(text);
  if (!Number.isFinite(x) || !Number.isFinite(Math.fround(x))) {
    return { sink: null, error: `Attention sink must be a finite number within float32's range (|x| <= ${FLOAT32_MAX}); empty turns it off, got ${text}.` };
  }
  return { sink: x, error: null };
}

/** ALiBi slopes for `heads` heads: 2^(-8(h+1)/heads), BLOOM's when heads is a power of two. */
export function alibiSlopes(heads) {
  return Float32Array.from({ length: heads }, (_, h) => 2 ** (-8 * (h + 1) / heads));
}

/** A field's error (or null) said beside it, in the element with test id `noteId`. */
function showFieldError(field, noteId, error) {
  const note = byTestId(noteId);
  note.hidden = error === null;
  note.textContent = error ?? '';
  field.setAttribute('aria-invalid', String(error !== null));
}

function readHeatmapParams() {
  const source = hm.source.value === 'text' ? 'text' : 'random';
  const heads = intValue(hm.heads, 1, 8);
  const { softcap, error: softcapError } = readSoftcap();
  const { sink, error: sinkError } = readSink();
  return {
    source,
    text: hm.text.value,
    seqLen: intValue(hm.seqLen, 1, 128),
    dk: intValue(hm.dk, 1, 512),
    heads,
    head: Math.min(intValue(hm.head, 0, 7), heads - 1),
    causal: hm.causal.checked,
    // A sliding window ends at each row's causal diagonal: only with causal (0 = off).
    window: hm.causal.checked ? intValue(hm.window, 0, 128) : 0,
    padding: intValue(hm.padding, 0, 128),
    softcap,
    softcapError,
    // The sink logit of every head (gpt-oss), or null for none.
    sink,
    sinkError,
    // ALiBi with slopes 2^(-8(h+1)/H) (BLOOM's for a power of two heads).
    alibi: hm.alibi.checked,
    seed: intValue(hm.seed, 0, 4294967295),
    vscale: hm.vscale.value,
  };
}

function syncHeadOptions(heads, head) {
  if (hm.head.options.length !== heads) {
    hm.head.replaceChildren(...Array.from({ length: heads }, (_, h) => new Option(String(h), String(h))));
  }
  hm.head.value = String(head);
}

export function computeHeatmap() {
  const p = readHeatmapParams();
  document.querySelector('.text-only').hidden = p.source !== 'text';
  hm.seqLen.disabled = p.source === 'text';
  hm.window.disabled = !p.causal;
  // An out-of-range softcap or sink is said next to its field (and in the panel's error line below).
  showFieldError(hm.softcap, 'softcap-error', p.softcapError);
  showFieldError(hm.sink, 'sink-error', p.sinkError);

  let inputs = null, L = 0, padding = 0, result = null, ms = 0, error = null;
  // Whatever goes wrong (a control's value, or an error from sdpa-wasm) is shown in the panel:
  // never an uncaught error in an input listener, with the previous map left on screen.
  try {
    inputs = heatmapInputs(p);
    L = inputs.query.dims[2];
    // In text mode the (disabled) length field shows the text's length; a text without tokens
    // leaves it at its last value, which stays valid (min 1) for going back to random inputs.
    if (p.source === 'text' && L > 0) hm.seqLen.value = String(L);
    padding = Math.min(p.padding, L);
    hm.padding.max = String(L);
    syncHeadOptions(p.heads, p.head);
    if (p.softcapError !== null) throw new RangeError(p.softcapError);
    if (p.sinkError !== null) throw new RangeError(p.sinkError);

    const options = { returnWeights: true };
    if (p.causal) options.isCausal = true;
    if (p.window > 0) options.slidingWindow = p.window;
    if (padding > 0) options.keyLengths = Int32Array.of(L - padding);
    if (p.softcap > 0) options.softcap = p.softcap;
    if (p.sink !== null) options.sinks = new Float32Array(p.heads).fill(p.sink);
    if (p.alibi) options.alibiSlopes = alibiSlopes(p.heads);
    if (L > 0) {
      // The very first call also wakes the thread pool and lets V8 compile: not what to time.
      if (demo.version.heatmap === 0) attn.sdpa(inputs.query, inputs.key, inputs.value, options);
      const t0 = performance.now();
      result = attn.sdpa(inputs.query, inputs.key, inputs.value, options);
      ms = performance.now() - t0;
    }
  } catch (e) {
    error = errorText(e);
    result = null;
  }
  // In text mode: how many tokens the text has (the map shows the first 64 of them).
  const textTokens = p.source === 'text' ? tokenize(p.text, Infinity).length : null;
  hmState = { params: { ...p, padding }, L, inputs, result, ms, keyLength: L - padding, error, textTokens };
  hover = { i: Math.min(hover.i, Math.max(L - 1, 0)), j: Math.min(hover.j, Math.max(L - 1, 0)) };
  demo.heatmap = {
    params: hmState.params,
    L,
    tokens: inputs?.tokens ?? null,
    textTokens,
    output: result?.output.data ?? null,
    outputDims: result?.output.dims ?? null,
    weights: result?.weights.data ?? null,
    weightsDims: result?.weights.dims ?? null,
    ms,
    error,
    geometry: null,
    hover: null,
  };
  renderHeatmap();
  demo.version.heatmap++;
}

/** No map to show (no tokens, or an error): the canvas, legend and readout are emptied, not left showing the last map. */
function clearHeatmapFigure() {
  if (document.activeElement === hm.canvas) canvasFocusLost = true;
  hm.canvas.hidden = true;
  hm.legend.hidden = true;
  $('hm-cell').textContent = '–';
  $('hm-row-label').textContent = 'output row';
  $('hm-output').textContent = '–';
  if (demo.heatmap) {
    demo.heatmap.geometry = null;
    demo.heatmap.hover = null;
  }
}

export function renderHeatmap() {
  const { params: p, L, inputs, result, error, textTokens } = hmState;
  const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;
  const kind = p.source === 'text'
    ? `Toy embedding, head ${p.head}: “${TOY_HEAD_KINDS[p.head % 3]}” pattern; ${plural(L, 'token')}` +
      (textTokens > L ? ` (the first ${L} tokens shown, of the text's ${textTokens}).` : '.')
    : `Random unit-variance Q, K, V (seed ${p.seed}); [1, ${p.heads}, ${L}, ${p.dk}] each.`;
  byTestId('head-kind').textContent = kind;
  showPanelError('heatmap-error', error);
  if (result === null) {
    byTestId('heatmap-summary').textContent = error === null ? 'The text has no tokens.' : '';
    clearHeatmapFigure();
    return;
  }
  hm.canvas.hidden = false;
  hm.legend.hidden = false;
  // A map is back: the focus returns to it if it left only because the canvas was hidden (no
  // element has taken it since, and none has it now).
  if (canvasFocusLost && (document.activeElement === null || document.activeElement === document.body)) {
    hm.canvas.focus({ preventScroll: true });
  }
  canvasFocusLost = false;
  const w = result.weights.data.subarray(p.head * L * L, (p.head + 1) * L * L);
  let wmax = 0;
  for (const x of w) if (x > wmax) wmax = x;
  const vmax = p.vscale === 'one' || wmax === 0 ? 1 : wmax;
  const keyLength = hmState.keyLength;
  // The keys row i may not attend (padding, causal, window): greyed out on the map.
  const blocked = (i, j) => j >= keyLength || (p.causal && j > i) || (p.window > 0 && j <= i - p.window);
  const labels = inputs.tokens;
  const geometry = drawHeatmap(hm.canvas, w, L, L, {
    width: Math.min(availableWidth(hm.canvas), 640),
    maxCell: labels ? 34 : 30,
    blocked,
    rowLabels: labels,
    colLabels: labels,
    highlightRow: hover.i,
    highlightCell: hover.j,
    vmax,
  });
  demo.heatmap.geometry = geometry;
  drawLegend(hm.legend, { width: Math.min(availableWidth(hm.legend), 420), vmax, label: `attention weight (head ${p.head})` });

  // Summary: how exactly rows sum to 1 (with a sink: the range of what the keys keep), and how
  // many rows have nothing to attend: every key blocked (a row whose weights are all zero because
  // a large sink took them, below exp's smallest result, has keys: it is not masked).
  const masked = Array.from({ length: L }, (_, i) => { for (let j = 0; j < L; j++) if (!blocked(i, j)) return false; return true; });
  let worst = 0, empty = 0, least = Infinity, most = 0;
  for (let r = 0; r < p.heads * L; r++) {
    let s = 0;
    for (let j = 0; j < L; j++) s += result.weights.data[r * L + j];
    if (masked[r % L]) {
      empty++;
    } else {
      worst = Math.max(worst, Math.abs(s - 1));
      least = Math.min(least, s), most = Math.max(most, s);
    }
  }
  demo.heatmap.maxRowSumError = worst;
  demo.heatmap.emptyRows = empty;
  const sums = p.sink === null ? `Rows sum to 1 within ${worst.toExponential(1)}; `
    : `With the sink, rows' weights sum to ${least.toFixed(3)}–${most.toFixed(3)} (the sink takes the rest); `;
  const summary = byTestId('heatmap-summary');
  summary.replaceChildren();
  summary.append(
    empty < p.heads * L ? sums : 'Nothing to attend: ',
    Object.assign(document.createElement('b'), { textContent: String(empty) }),
    ` of ${p.heads * L} rows fully masked (exact zeros, not NaN); `,
    `sdpa took ${hmState.ms.toFixed(2)} ms for ${p.heads} head${p.heads > 1 ? 's' : ''}.`,
  );
  summary.querySelector('b').dataset.testid = 'heatmap-empty-rows';
  showHover();
}

function showHover() {
  const { params: p, L, inputs, result } = hmState;
  if (result === null) return;
  const { i, j } = hover;
  const Ev = result.output.dims[3];
  const tok = (k) => (inputs.tokens ? ` “${inputs.tokens[k]}”` : '');
  const weight = result.weights.data[(p.head * L + i) * L + j];
  const row = result.output.data.subarray((p.head * L + i) * Ev, (p.head * L + i + 1) * Ev);
  const shown = Math.min(Ev, 8);
  const values = Array.from(row.subarray(0, shown), formatValue);
  $('hm-cell').textContent = `query ${i}${tok(i)} → key ${j}${tok(j)}: weight ${formatValue(weight)}`;
  $('hm-row-label').textContent = `output row ${i}, head ${p.head}` +
    (shown < Ev ? ` (first ${shown} of ${Ev} values):` : ` (${Ev} values):`);
  $('hm-output').textContent = values.join('  ') + (shown < Ev ? '  …' : '');
  demo.heatmap.hover = { i, j, head: p.head, weight, shown, values };
}

function pointerToCell(event) {
  const g = demo.heatmap?.geometry;
  if (!g) return null;
  const rect = hm.canvas.getBoundingClientRect();
  const scale = rect.width / g.width;  // the canvas may be shrunk by max-width: 100%
  const x = (event.clientX - rect.left) / scale - g.left;
  const y = (event.clientY - rect.top) / scale - g.top;
  const i = Math.floor(y / g.cell), j = Math.floor(x / g.cell);
  if (i < 0 || j < 0 || i >= g.rows || j >= g.cols) return null;
  return { i, j };
}

/** Sets up the panel's controls (once sdpa-wasm has started). */
export function setupHeatmapPanel() {
  document.addEventListener('focusin', (event) => {
    if (event.target !== hm.canvas) canvasFocusLost = false;
  });

  for (const type of ['pointermove', 'pointerdown']) {
    hm.canvas.addEventListener(type, (event) => {
      const cell = pointerToCell(event);
      if (!cell || (cell.i === hover.i && cell.j === hover.j && demo.heatmap.hover)) return;
      hover = cell;
      renderHeatmap();
    });
  }

  // The keyboard's way to the readout: the canvas takes the focus (tabindex=0), and the arrow keys
  // move the highlighted cell as the pointer does (Home and End: first and last key of the row).
  hm.canvas.addEventListener('keydown', (event) => {
    if (!hmState?.result || event.altKey || event.ctrlKey || event.metaKey) return;
    const last = hmState.L - 1;
    let { i, j } = hover;
    switch (event.key) {
      case 'ArrowUp': i--; break;
      case 'ArrowDown': i++; break;
      case 'ArrowLeft': j--; break;
      case 'ArrowRight': j++; break;
      case 'Home': j = 0; break;
      case 'End': j = last; break;
      default: return;
    }
    event.preventDefault();  // no page scrolling while moving over the map
    hover = { i: Math.min(Math.max(i, 0), last), j: Math.min(Math.max(j, 0), last) };
    renderHeatmap();
  });

  for (const el of [hm.source, hm.text, hm.seqLen, hm.dk, hm.heads, hm.head, hm.causal, hm.window, hm.padding, hm.softcap, hm.sink, hm.alibi, hm.seed, hm.vscale]) {
    el.addEventListener(el.tagName === 'SELECT' || el.type === 'checkbox' ? 'change' : 'input', computeHeatmap);
  }
  clampOnChange(hm.seqLen, 1, 128);
  clampOnChange(hm.seed, 0, 4294967295);
  clampOnChange(hm.padding, 0, () => hmState?.L ?? 128);  // at most the current length
  clampOnChange(hm.window, 0, 128);
}
