// Panel 5, generating with a KV cache: the toy decoder's caches in the AttentionWorker, float32
// against float16 (and bfloat16), with the table and the tokens/s chart updated while it runs.
import { drawChart } from '../heatmap.mjs';
import { generation, promptTokens, TOY, ToyDecoder, toyWeights } from '../decoder.mjs';
import { FrameMeter } from '../frame-meter.mjs';
import { demo } from '../demo-state.mjs';
import { attnWorker } from '../instances.mjs';
import { beginLongJob, endLongJob, registerLongJob } from '../long-jobs.mjs';
import { $, availableWidth, byTestId, bytesText, clampOnChange, intValue, yieldToBrowser } from '../page-ui.mjs';

// ── 5. Generating with a KV cache ─────────────────────────────────────────────────────────
const gn = {
  context: $('gn-context'), dtype: $('gn-dtype'), tokens: $('gn-tokens'), seed: $('gn-seed'), start: $('gn-start'),
  progress: $('gn-progress'), phase: $('gn-phase'), chart: $('gn-chart'),
  meter: new FrameMeter(byTestId('gn-frame-meter')),
};
const GEN_DTYPES = ['float32', 'float16', 'bfloat16'];
/** The select's choices of several dtypes: 'both' (the default) and 'all'; any other value is one dtype. */
const GEN_DTYPE_SETS = { both: ['float32', 'float16'], all: GEN_DTYPES };
const GEN_COLOURS = { float32: '#8b2154', float16: '#1d7a46', bfloat16: '#2a5db0' };
/**
 * Decode steps between two redraws of the table and chart (or 40 ms, if sooner). The page's
 * thread is free during every cache call anyway (they run in the worker); the redraws are
 * spaced so that they do not cost the steps much of their time.
 */
const GEN_CHUNK_STEPS = 8, GEN_CHUNK_MS = 40;
let genWeights = null;  // the toy model's weights, made once per seed
let genStop = false;

/** The cache's bytes as the table shows them: exact, and in KiB or MiB below. */
function showCacheBytes(cell, n) {
  const sub = Object.assign(document.createElement('span'), { className: 'sub', textContent: bytesText(n) });
  cell.replaceChildren(`${n.toLocaleString('en-US')} bytes`, sub);
}
/** Token ids as the page shows them: the first 48, then "… (n in all)". */
const tokenText = (ids) => (ids.length > 48 ? `${ids.slice(0, 48).join(' ')} … (${ids.length} in all)` : ids.join(' '));

function renderGenerationRow(run) {
  const cell = (what) => byTestId(`gn-${run.dtype}-${what}`);
  showCacheBytes(cell('bytes'), run.byteLength);
  cell('length').textContent = `${run.length} / ${run.maxLength}`;
  const timed = run.stepMs.length > 0;
  // "…" while the run may still fill them in; once it has ended (stopped or failed before its
  // first token), "–".
  const pending = run.ended ? '–' : '…';
  cell('tps').textContent = timed ? run.tokensPerSecond.toFixed(1) : pending;
  cell('attn-tps').textContent = timed ? run.attentionTokensPerSecond.toFixed(1) : pending;
  cell('ms').textContent = timed ? run.msPerToken.toFixed(2) : pending;
  cell('share').textContent = timed ? `${Math.round(100 * run.attentionShare)}%` : pending;
  cell('tokens').textContent = run.tokens.length ? tokenText(run.tokens) : run.ended ? 'none (stopped)' : '…';
}

/** The dtypes' rows that no run filled in (stopped or failed before they started): "not run", as in single-dtype mode. */
function markGenerationNotRun(dtypes) {
  for (const d of dtypes) {
    if (demo.generation.runs[d]) continue;
    for (const what of ['bytes', 'length', 'tps', 'attn-tps', 'ms', 'share', 'tokens']) {
      byTestId(`gn-${d}-${what}`).textContent = what === 'tokens' ? 'not run' : '–';
    }
  }
}

export function renderGenerationChart() {
  const g = demo.generation;
  const series = GEN_DTYPES.filter((d) => g.runs[d]?.chart.length)
    .map((d) => ({ label: `${d}`, colour: GEN_COLOURS[d], points: g.runs[d].chart }));
  gn.chart.hidden = $('gn-chart-caption').hidden = series.length === 0;
  if (series.length === 0) return;
  drawChart(gn.chart, series, {
    width: Math.min(availableWidth(gn.chart), 620), height: 200, top: 28, logX: false, xMin: 0, xMax: g.params.tokens,
    xLabel: 'tokens generated', yLabel: 'tokens/s', xTicks: [0, Math.round(g.params.tokens / 2), g.params.tokens],
  });
}

/** Recomputes the run's rates from its step times. */
function updateRates(run) {
  const ms = run.stepMs.reduce((a, b) => a + b, 0), attnMs = run.attentionMs.reduce((a, b) => a + b, 0);
  const n = run.stepMs.length;
  Object.assign(run, {
    tokensPerSecond: n / (ms / 1000), attentionTokensPerSecond: n / (attnMs / 1000), msPerToken: ms / n,
    attentionShare: attnMs / ms,
  });
}

/** One dtype: fill, prefill, decode in the worker's caches, redrawing every few steps so the numbers update live. */
async function runGeneration(dtype, params, progressBase, progressSpan) {
  const { context, tokens, seed } = params;
  const decoder = await ToyDecoder.create(attnWorker, genWeights, { dtype, maxLength: context + tokens });
  const run = {
    dtype, context, maxLength: decoder.maxLength, byteLength: decoder.byteLength, length: 0,
    prompt: promptTokens(seed), tokens: [], stepMs: [], attentionMs: [], prefillMs: null, chart: [],
    lastAttention: null, done: false, stopped: false, ended: false,
  };
  demo.generation.runs[dtype] = run;
  const fillCount = Math.max(0, context - TOY.promptLength);
  const setProgress = (fraction, text) => {
    gn.progress.value = progressBase + progressSpan * fraction;
    gn.phase.textContent = `${dtype}: ${text}`;
  };
  try {
    let chunkStart = performance.now(), chunkSteps = 0, chunkMs = 0;
    for await (const event of generation(decoder, params)) {
      run.length = decoder.length;
      if (event.phase === 'fill') {
        setProgress(0.1 * (event.length / fillCount), `filling the cache with random K/V (${event.length} / ${fillCount})`);
      } else if (event.phase === 'prefill') {
        run.prefillMs = event.ms;
        setProgress(0.1, `prefill: the ${TOY.promptLength}-token prompt in one call (${event.ms.toFixed(1)} ms)`);
      } else if (event.phase === 'decode') {
        run.tokens.push(event.token);
        run.stepMs.push(event.ms);
        run.attentionMs.push(event.attentionMs);
        chunkSteps++;
        chunkMs += event.ms;
      }
      const now = performance.now();
      if (event.phase === 'decode' ? chunkSteps >= GEN_CHUNK_STEPS || now - chunkStart >= GEN_CHUNK_MS || run.tokens.length === tokens
        : now - chunkStart >= GEN_CHUNK_MS) {
        if (chunkSteps > 0) {
          updateRates(run);
          run.chart.push([run.tokens.length, chunkSteps / (chunkMs / 1000)]);
          setProgress(0.1 + 0.9 * (run.tokens.length / tokens), `decoding, token ${run.tokens.length} of ${tokens} ` +
            `(attending to ${run.length} positions)`);
        }
        renderGenerationRow(run);
        renderGenerationChart();
        demo.generation.updates++;
        chunkStart = performance.now();
        chunkSteps = 0;
        chunkMs = 0;
        if (genStop) {
          run.stopped = true;
          break;
        }
      }
    }
    run.length = decoder.length;
    run.lastAttention = decoder.lastAttention;
    run.done = !run.stopped;
    if (run.stepMs.length) updateRates(run);
    renderGenerationRow(run);
    renderGenerationChart();
    return run;
  } finally {
    run.ended = true;
    renderGenerationRow(run);
    await decoder.dispose();  // frees the worker's wasm memory; the numbers stay on the page
  }
}

async function startGeneration() {
  if (demo.generation?.running) {
    genStop = true;
    gn.start.textContent = 'Stopping…';
    return;
  }
  if (!beginLongJob('generation')) return;
  const params = {
    context: intValue(gn.context, TOY.promptLength, 8192),
    tokens: intValue(gn.tokens, 1, 2048),
    seed: intValue(gn.seed, 0, 4294967295),
    dtype: GEN_DTYPES.includes(gn.dtype.value) || Object.hasOwn(GEN_DTYPE_SETS, gn.dtype.value) ? gn.dtype.value : 'both',
  };
  const dtypes = GEN_DTYPE_SETS[params.dtype] ?? [params.dtype];
  genStop = false;
  const frames = gn.meter.start();
  demo.generation = { running: true, params, runs: {}, updates: 0, threads: attnWorker.threads, cachesIn: 'AttentionWorker', frames };
  for (const el of [gn.context, gn.dtype, gn.tokens, gn.seed]) el.disabled = true;
  gn.start.textContent = 'Stop';
  for (const d of GEN_DTYPES) {
    for (const what of ['bytes', 'length', 'tps', 'attn-tps', 'ms', 'share', 'tokens']) {
      byTestId(`gn-${d}-${what}`).textContent = dtypes.includes(d) ? '…' : (what === 'tokens' ? 'not run' : '–');
    }
  }
  byTestId('gn-summary').textContent = '';
  gn.progress.value = 0;
  renderGenerationChart();
  try {
    if (genWeights?.seed !== params.seed) {
      // Made on the page's thread (a fraction of a second, once per seed): the text is drawn first.
      gn.phase.textContent = 'making the random weights…';
      await yieldToBrowser();
      genWeights = toyWeights(params.seed);
    }
    byTestId('gn-prompt').textContent = promptTokens(params.seed).join(' ');
    for (const [k, d] of dtypes.entries()) {
      const run = await runGeneration(d, params, k / dtypes.length, 1 / dtypes.length);
      if (run.stopped) break;
    }
    const runs = demo.generation.runs;
    const finished = dtypes.filter((d) => runs[d]?.stepMs.length);
    gn.progress.value = genStop ? gn.progress.value : 1;
    gn.phase.textContent = genStop
      ? 'stopped'
      : `done: ${params.tokens} token${params.tokens > 1 ? 's' : ''} after a context of ${params.context} ` +
        `(${attnWorker.threads} thread${attnWorker.threads > 1 ? 's' : ''} in the worker)`;
    byTestId('gn-summary').textContent = generationSummary(runs, finished);
  } catch (error) {
    gn.phase.textContent = `failed: ${error.message}`;
    demo.generation.error = String(error.message);
  } finally {
    markGenerationNotRun(dtypes);
    gn.meter.stop();  // final figures into demo.generation.frames, before the tests see the new version
    endLongJob('generation');
    demo.generation.running = false;
    for (const el of [gn.context, gn.dtype, gn.tokens, gn.seed]) el.disabled = false;
    gn.start.textContent = 'Start';
    demo.version.generation++;
  }
}

function generationSummary(runs, finished) {
  if (finished.length < 2) {
    const r = runs[finished[0]];
    return r ? `${r.dtype}: ${r.tokensPerSecond.toFixed(1)} tokens/s, ${bytesText(r.byteLength)} of cache.` : '';
  }
  // Each 16-bit run against float32 (or, without a float32 run, bfloat16 against float16).
  const base = finished.includes('float32') ? 'float32' : finished[0];
  const a = runs[base];
  return finished.filter((d) => d !== base).map((d) => {
    const b = runs[d];
    const n = Math.min(a.tokens.length, b.tokens.length);
    let same = 0;
    while (same < n && a.tokens[same] === b.tokens[same]) same++;
    const speed = b.tokensPerSecond / a.tokensPerSecond, attnSpeed = b.attentionTokensPerSecond / a.attentionTokensPerSecond;
    return `${d} takes ${(b.byteLength / a.byteLength).toFixed(2)}× the memory of ${base} and runs at ` +
      `${speed.toFixed(2)}× its tokens/s (attention alone: ${attnSpeed.toFixed(2)}×). ` +
      (same === n ? `Both generated the same ${n} tokens.` : `Their tokens agree up to token ${same}, where ${d}'s rounding tipped the sampling.`);
  }).join(' ');
}

/** Describes the toy model and sets up the panel's controls (once sdpa-wasm has started). */
export function setupGenerationPanel() {
  byTestId('gn-model').textContent =
    `Toy decoder: ${TOY.layers} layers, d_model ${TOY.dModel}, ${TOY.qHeads} query heads sharing ${TOY.kvHeads} KV heads ` +
    `(GQA), head size ${TOY.headDim}, vocabulary ${TOY.vocab}, random weights; one KVCache per layer. The caches live in ` +
    `an AttentionWorker (createAttentionWorker), so attention runs off the page's thread; the projections and the ` +
    `sampling are plain JavaScript on the page's thread, between the calls to the worker. "Attention alone" times the ` +
    `caches' append + attend as the page sees them, the round trips to the worker included (${TOY.layers} per token: each layer's append and attend travel as one message). ` +
    `Tokens are sampled at temperature ${TOY.temperature}.`;
  registerLongJob('generation', { button: gn.start, note: 'gn-busy', name: 'the generation (panel 5)', onPress: startGeneration });
  clampOnChange(gn.tokens, 1, 2048);
  clampOnChange(gn.seed, 0, 4294967295);
}
