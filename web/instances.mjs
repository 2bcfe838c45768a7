// The page's two sdpa-wasm instances: the Attention the quick panels call on the page's thread
// and the AttentionWorker the long jobs share. main.mjs starts them (startAttention, then
// awaitAttentionWorker); the panels read them through the live bindings `attn` and `attnWorker`.
import { createAttention, createAttentionWorker } from 'sdpa-wasm';
import { demo } from './demo-state.mjs';
import { byTestId } from './page-ui.mjs';

/** Reports on the page (and to the tests) that `what` could not start, and stops the script. */
function failedToStart(what, error) {
  demo.error = String(error?.message ?? error);
  const status = byTestId('status');
  status.textContent = `Could not start ${what}: ${demo.error}`;
  status.className = 'status error';
  throw error;
}

/** The Attention the quick panels call on the page's thread (set by startAttention). */
export let attn;
let workerStarting;
/** The AttentionWorker the long jobs share: benchmark, generation, training (set once it has started). */
export let attnWorker = null;

/** Makes the page's Attention (shown in the environment pills) and starts loading the long jobs' worker. */
export async function startAttention() {
  try {
    // The package's default: the threaded build on as many cores as it likes (up to its
    // DEFAULT_MAX_THREADS) when the page is cross-origin isolated, one thread otherwise.
    attn = await createAttention();
    demo.threads = attn.threads;
    demo.simd = attn.simd;
    demo.isa = attn.isa;
    byTestId('env-threads').textContent = String(attn.threads);
    byTestId('env-simd').textContent = attn.simd ? 'on' : 'off';
    byTestId('env-isa').textContent = attn.isa === 'relaxed-simd' ? 'relaxed (FMA)' : '128-bit';
    byTestId('env-isolated').textContent = demo.crossOriginIsolated ? 'yes' : 'no';
    // The long jobs' worker, on one thread fewer than the page's instance where it has more than
    // one: the page's thread keeps a core (README, "Off the main thread"), so a long job on
    // every other core does not take its frames. It loads while the quick panels are
    // computed (main.mjs), and is awaited before the page reports ready.
    workerStarting = createAttentionWorker({ threads: Math.max(1, attn.threads - 1) });
  } catch (error) {
    failedToStart('sdpa-wasm', error);
  }
}

/** Waits for the long jobs' worker (started by startAttention) and shows its threads. */
export async function awaitAttentionWorker() {
  try {
    attnWorker = await workerStarting;
    demo.worker = { threads: attnWorker.threads, simd: attnWorker.simd, isa: attnWorker.isa };
    byTestId('env-worker-threads').textContent = String(attnWorker.threads);
  } catch (error) {
    failedToStart('the sdpa-wasm worker', error);
  }
}
