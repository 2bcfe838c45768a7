// Panel 4, speed: the benchmark, sdpa-wasm in the AttentionWorker against plain JavaScript in a
// worker of its own, with the inputs made and compared in a third; the estimate shown before a run.
import { FrameMeter } from '../frame-meter.mjs';
import { demo } from '../demo-state.mjs';
import { attnWorker } from '../instances.mjs';
import { beginLongJob, endLongJob, registerLongJob } from '../long-jobs.mjs';
import { $, byTestId, bytesText, clampOnChange, intValue, yieldToBrowser } from '../page-ui.mjs';

// ── 4. Speed ──────────────────────────────────────────────────────────────────────────────
const bn = {
  b: $('bn-b'), h: $('bn-h'), l: $('bn-l'), e: $('bn-e'), causal: $('bn-causal'), reps: $('bn-reps'),
  js: $('bn-js'), run: $('bn-run'), progress: $('bn-progress'), phase: $('bn-phase'),
  meter: new FrameMeter(byTestId('bn-frame-meter')),
};
const BENCH_CONTROLS = [bn.b, bn.h, bn.l, bn.e, bn.causal, bn.reps, bn.js];
/**
 * Rates assumed by the estimate shown before a run, until a run on this page has measured its
 * own (GFLOP/s of work done, `plan.work`; sdpa-wasm's varies with the cores, plain JavaScript's
 * is about 1 on these shapes).
 */
const TYPICAL_GFLOPS = { wasm: 10, js: 1 };
/** Runs estimated to take longer than this (seconds) are flagged as long before they start. */
const BENCH_LONG_S = 30;

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

/** Ends the benchmark's run early (Stop pressed): not an error, not shown as one. */
class BenchStopped extends Error {
  constructor() {
    super('stopped');
    this.name = 'BenchStopped';
  }
}
let benchStop = false;
/** True while the inputs worker compares the two outputs (every call timed: Stop lets it end). */
let benchComparing = false;
/** The rates of the last completed run on this page (GFLOP/s of `plan.work`, for the estimate), or null. */
let benchRates = null;

/** The plain-JS worker (web/plain-attention-worker.mjs): a promise of it, made by the first comparison, then kept. */
let plainWorker = null;
/** The plain-JS call in flight, { worker, reject }: Stop ends it at once (it can take minutes). */
let plainCall = null;

/** The plain-JS worker once it has loaded (started if need be). */
function plainWorkerReady() {
  plainWorker ??= new Promise((resolve, reject) => {
    const worker = new Worker(new URL('../plain-attention-worker.mjs', import.meta.url), { type: 'module' });
    const onReady = () => {
      worker.removeEventListener('error', onFailure);
      resolve(worker);
    };
    const onFailure = (event) => {
      event.preventDefault();
      worker.terminate();
      plainWorker = null;  // the next benchmark tries again
      reject(new Error(`the plain-JavaScript worker failed to start: ${event.message || 'its script could not be loaded'}`));
    };
    worker.addEventListener('message', onReady, { once: true });  // its 'ready'
    worker.addEventListener('error', onFailure, { once: true });
  });
  return plainWorker;
}

/**
 * plainAttention() in the plain-JS worker: resolves with the output. The tensors' buffers are
 * moved to the worker (the caller's arrays are detached), like sdpa-wasm's `{ transfer: true }`.
 * The benchmark makes one call at a time, so a reply always answers the call made last.
 */
async function plainAttentionInWorker(query, key, value, options) {
  const worker = await plainWorkerReady();
  if (benchStop) throw new BenchStopped();
  return new Promise((resolve, reject) => {
    const done = () => {
      plainCall = null;
      worker.removeEventListener('message', onMessage);
      worker.removeEventListener('error', onError);
    };
    const onMessage = ({ data }) => {
      done();
      if (data.error !== undefined) reject(new Error(`plain JavaScript: ${data.error}`));
      else resolve(data.output);
    };
    const onError = (event) => {
      event.preventDefault();
      done();
      worker.terminate();
      plainWorker = null;
      reject(new Error(`the plain-JavaScript worker failed: ${event.message || 'unknown error'}`));
    };
    worker.addEventListener('message', onMessage);
    worker.addEventListener('error', onError);
    plainCall = { worker, reject: (error) => { done(); reject(error); } };
    worker.postMessage({ query, key, value, options }, [query.data.buffer, key.data.buffer, value.data.buffer]);
  });
}

/** Stop during a plain-JS call: its worker is ended (the next comparison starts a new one). */
function cutPlainCall() {
  if (plainCall === null) return;
  const { worker, reject } = plainCall;
  worker.terminate();
  plainWorker = null;
  reject(new BenchStopped());
}

/**
 * The benchmark's inputs worker (web/bench-inputs-worker.mjs), started by the first run, then
 * kept: it makes Q, K, V, hands out a fresh copy of them for every call (moved, not copied
 * again) and compares the two outputs, so that none of this runs on the page's thread.
 */
let benchInputs = null;

function benchInputsWorker() {
  if (benchInputs !== null) return benchInputs;
  const worker = new Worker(new URL('../bench-inputs-worker.mjs', import.meta.url), { type: 'module' });
  const pending = new Map();
  let nextId = 0;
  const failAll = (error) => {
    for (const { reject } of pending.values()) reject(error);
    pending.clear();
  };
  worker.addEventListener('message', ({ data }) => {
    const call = pending.get(data.id);
    if (!call) return;
    pending.delete(data.id);
    if (data.error !== undefined) call.reject(new Error(`benchmark inputs: ${data.error}`));
    else call.resolve(data);
  });
  worker.addEventListener('error', (event) => {
    event.preventDefault();
    worker.terminate();
    if (benchInputs === client) benchInputs = null;
    failAll(new Error(`the benchmark's inputs worker failed: ${event.message || 'its script could not be loaded'}`));
  });
  const client = {
    /** Sends { type, ...payload } (moving `transfer`); resolves with the reply. */
    request(type, payload = {}, transfer = []) {
      const id = nextId++;
      return new Promise((resolve, reject) => {
        pending.set(id, { resolve, reject });
        worker.postMessage({ id, type, ...payload }, transfer);
      });
    },
    get busy() { return pending.size > 0; },
    /** Ends the worker now (making a large shape's inputs takes seconds); pending requests reject with `error`. */
    terminate(error) {
      worker.terminate();
      if (benchInputs === client) benchInputs = null;
      failAll(error);
    },
  };
  benchInputs = client;
  return client;
}

/**
 * The run the controls ask for. `flop` is what the page reports GFLOP/s of, 4·B·H·L²·E also for
 * causal (dense-equivalent, as the panel says); `work` is what a call computes, the pairs of
 * query and key rows it attends (L(L+1)/2 a head with causal: both sides skip the rest), which
 * is what its time follows and what the estimate's rates are measured in.
 */
function benchPlan() {
  const B = intValue(bn.b, 1, 8), H = intValue(bn.h, 1, 32), L = intValue(bn.l, 1, 4096), E = intValue(bn.e, 1, 512);
  const reps = intValue(bn.reps, 1, 100), compareJs = bn.js.checked, isCausal = bn.causal.checked;
  const warmup = 3, jsReps = Math.min(reps, 3);
  return {
    B, H, L, E, isCausal, reps, compareJs, warmup, jsReps,
    flop: 4 * B * H * L * L * E, work: 4 * B * H * (isCausal ? (L * (L + 1)) / 2 : L * L) * E, bytes: 4 * B * H * L * E,
    total: warmup + reps + (compareJs ? jsReps : 0),
  };
}

const durationText = (s) => (s < 90 ? `${Math.max(1, Math.round(s))} s` : `${Math.round(s / 60)} min`);

/** Says, before a run, how much work and memory it takes and roughly how long; flags long runs. */
export function showBenchEstimate() {
  const plan = benchPlan();
  const rates = benchRates ?? TYPICAL_GFLOPS;
  const wasmS = (plan.work * (plan.warmup + plan.reps)) / (rates.wasm * 1e9);
  const jsS = plan.compareJs ? (plan.work * plan.jsReps) / (rates.js * 1e9) : 0;
  const seconds = wasmS + jsS;
  const long = seconds > BENCH_LONG_S;
  const el = byTestId('bn-estimate');
  el.textContent =
    `${(plan.flop / 1e9).toFixed(3)} GFLOP per call; Q, K, V and the output take ${bytesText(plan.bytes)} each ` +
    '(the controls cap this at 256 MiB). ' +
    `${plan.warmup + plan.reps} sdpa-wasm call${plan.warmup + plan.reps > 1 ? 's' : ''}` +
    (plan.compareJs ? ` and ${plan.jsReps} plain-JavaScript one${plan.jsReps > 1 ? 's' : ''}` : '') +
    `: about ${durationText(seconds)}` + (plan.compareJs && jsS > 0.5 * seconds ? ` (${durationText(jsS)} of it plain JavaScript)` : '') +
    (benchRates ? ' at the rates the last run here measured.' : ` at a typical ${rates.wasm} GFLOP/s for sdpa-wasm and ${rates.js} for plain JavaScript.`) +
    (long ? ' A long run: Stop ends it after the sdpa-wasm call in flight.' : '');
  el.classList.toggle('warn', long);
  demo.benchEstimate = { flop: plan.flop, work: plan.work, bytes: plan.bytes, seconds, long };
}

async function runBenchmark() {
  if (demo.bench?.running) {
    // Stop: between two calls; a plain-JS call in flight, or the making of the inputs, is cut
    // short (their workers are ended); an sdpa-wasm call in flight ends first (well under the
    // plain-JS one's time; its worker is shared with the other panels).
    benchStop = true;
    bn.run.textContent = 'Stopping…';
    bn.phase.textContent = 'stopping: the sdpa-wasm call in flight ends first';
    cutPlainCall();
    // The making and copying of inputs is cut short; the comparison of outputs already timed
    // is not (the run then reports what it measured).
    if (benchInputs?.busy && !benchComparing) benchInputs.terminate(new BenchStopped());
    return;
  }
  if (!beginLongJob('bench')) return;
  const { B, H, L, E, isCausal, reps, compareJs, warmup, jsReps, flop, work, total } = benchPlan();
  benchStop = false;
  let done = 0;
  const trail = [];
  const step = async (phase) => {
    if (benchStop) throw new BenchStopped();
    bn.progress.value = done / total;
    trail.push(done / total);
    bn.phase.textContent = `${phase} (${done}/${total})`;
    await yieldToBrowser();
    if (benchStop) throw new BenchStopped();
  };
  for (const el of BENCH_CONTROLS) el.disabled = true;
  bn.run.textContent = 'Stop';
  for (const id of ['bn-wasm-ms', 'bn-wasm-gflops', 'bn-js-ms', 'bn-js-gflops']) byTestId(id).textContent = '…';
  byTestId('bn-summary').textContent = '';
  bn.progress.value = 0;
  // Both sides run in workers, and are measured alike: each time is that of one call from the
  // page to its worker and back. The inputs of a call are fresh copies, made in the inputs
  // worker before the clock starts and moved to the page, then to the worker (transferred, not
  // copied again), and the output comes back moved too, so the time is the computation plus two
  // message hops. The page's thread only passes buffers along: at the largest shape, making and
  // copying 3 × 256 MiB on it would freeze the page for seconds.
  const frames = bn.meter.start();
  const shape = { B, H, L, E, isCausal };
  const times = [], jsTimes = [];
  demo.bench = { running: true, shape, times, jsTimes, frames, inputsMadeIn: 'inputs worker' };
  const inputs = benchInputsWorker();
  try {
    bn.phase.textContent = `making the random inputs in a worker (3 × ${bytesText(4 * B * H * L * E)})`;
    await inputs.request('make', { dims: [B, H, L, E], seed: 2024 });
    const freshInputs = async () => (await inputs.request('copy')).tensors;
    const options = { isCausal, transfer: true };
    let wasmOut;
    // Loads while sdpa-wasm runs; a failure to load is reported when it is awaited.
    if (compareJs) plainWorkerReady().catch(() => {});
    for (let r = 0; r < warmup; r++) {
      await step('warming up sdpa-wasm (in the worker)');
      await attnWorker.sdpa(...await freshInputs(), options);
      done++;
    }
    for (let r = 0; r < reps; r++) {
      await step('timing sdpa-wasm (in the worker)');
      const tensors = await freshInputs();
      const t0 = performance.now();
      wasmOut = (await attnWorker.sdpa(...tensors, options)).output.data;
      times.push(performance.now() - t0);
      done++;
    }
    const ms = median(times);
    const result = {
      shape, reps, ms, gflops: flop / (ms * 1e6), threads: attnWorker.threads, simd: attnWorker.simd,
      times, sdpaRanIn: 'AttentionWorker', plainJsRanIn: compareJs ? 'plain-JS worker' : null, inputsMadeIn: 'inputs worker',
    };
    if (compareJs) {
      let jsOut;
      for (let r = 0; r < jsReps; r++) {
        await step('timing plain JavaScript (in its worker)');
        await plainWorkerReady();  // loading the worker is not timed
        const tensors = await freshInputs();
        const t0 = performance.now();
        jsOut = await plainAttentionInWorker(...tensors, { isCausal });
        jsTimes.push(performance.now() - t0);
        done++;
      }
      bn.phase.textContent = 'comparing the two outputs (in a worker)';
      // The outputs are moved to the inputs worker, which compares them.
      benchComparing = true;
      let maxDifference;
      try {
        ({ maxDifference } = await inputs.request('compare', { a: wasmOut, b: jsOut }, [wasmOut.buffer, jsOut.buffer]));
      } finally {
        benchComparing = false;
      }
      result.jsMs = median(jsTimes);
      result.jsGflops = flop / (result.jsMs * 1e6);
      result.jsTimes = jsTimes;
      result.maxDifference = maxDifference;
      result.speedup = result.jsMs / ms;
    }
    bn.progress.value = 1;
    trail.push(1);
    result.progress = trail;
    bn.phase.textContent = `done: ${reps} timed run${reps > 1 ? 's' : ''} after ${warmup} warm-up runs`;
    byTestId('bn-wasm-ms').textContent = ms.toFixed(2);
    byTestId('bn-wasm-gflops').textContent = result.gflops.toFixed(2);
    byTestId('bn-threads').textContent = String(attnWorker.threads);
    byTestId('bn-simd').textContent = attnWorker.isa === 'relaxed-simd' ? '128-bit, relaxed (FMA)' : '128-bit';
    byTestId('bn-js-ms').textContent = compareJs ? result.jsMs.toFixed(2) : 'not run';
    byTestId('bn-js-gflops').textContent = compareJs ? result.jsGflops.toFixed(2) : '–';
    byTestId('bn-summary').textContent =
      `[B, H, L, E] = [${B}, ${H}, ${L}, ${E}]${isCausal ? ', causal' : ''}: ${(flop / 1e9).toFixed(3)} GFLOP per call. ` +
      (compareJs
        ? `sdpa-wasm is ${result.speedup.toFixed(1)}× faster than plain JavaScript; the two outputs differ by at most ${result.maxDifference.toExponential(1)}.`
        : '');
    benchRates = { wasm: work / (ms * 1e6), js: compareJs ? work / (result.jsMs * 1e6) : (benchRates ?? TYPICAL_GFLOPS).js };
    demo.bench = { running: false, ...result, frames };
  } catch (error) {
    for (const id of ['bn-wasm-ms', 'bn-wasm-gflops', 'bn-js-ms', 'bn-js-gflops']) byTestId(id).textContent = '–';
    if (error instanceof BenchStopped) {
      bn.phase.textContent = `stopped after ${done} of ${total} calls`;
      byTestId('bn-summary').textContent = 'Stopped: nothing reported (the median of part of the runs is not the measurement asked for).';
      demo.bench = { running: false, stopped: true, shape, times, jsTimes, callsDone: done, frames };
    } else {
      bn.phase.textContent = `failed: ${error.message}`;
      demo.bench = { running: false, error: String(error.message), shape, frames };
    }
  } finally {
    bn.meter.stop();  // final figures into `frames`, before the tests see the new version
    // The inputs' memory (up to 3 × 256 MiB) is freed until the next run.
    if (benchInputs !== null) benchInputs.request('clear').catch(() => {});
    for (const el of BENCH_CONTROLS) el.disabled = false;
    bn.run.textContent = 'Run benchmark';
    endLongJob('bench');
    showBenchEstimate();
    demo.version.bench++;
  }
}

/** Sets up the panel's controls (once sdpa-wasm has started). */
export function setupBenchPanel() {
  registerLongJob('bench', { button: bn.run, note: 'bn-busy', name: 'the benchmark (panel 4)', onPress: runBenchmark });
  for (const el of BENCH_CONTROLS) {
    el.addEventListener('input', showBenchEstimate);
    el.addEventListener('change', showBenchEstimate);
  }
  clampOnChange(bn.b, 1, 8);
  clampOnChange(bn.h, 1, 32);
  clampOnChange(bn.reps, 1, 100);
}
