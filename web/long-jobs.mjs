// One long job at a time: the benchmark, the generation and the training claim the shared
// AttentionWorker here, and the other two's start buttons wait, with a note, until it is free.
import { demo } from './demo-state.mjs';
import { attnWorker } from './instances.mjs';
import { byTestId } from './page-ui.mjs';

// ── One long job at a time ────────────────────────────────────────────────────────────────
// The benchmark, the generation and the training share the one AttentionWorker (and the
// machine's cores): two at once would slow each other down, and the page would report the
// slowed rates as measurements. So while one runs, the other two's start buttons are disabled,
// with a note saying why.
/** The long jobs by name, { button, note, name }: each panel registers its own (registerLongJob). */
const LONG_JOBS = {};

/** No long job running: set once at start-up, before the panels register theirs. */
export function setupLongJobs() {
  demo.longJob = null;
}

/**
 * Makes `job` one of the long jobs: `button` starts it (disabled while another one runs) and,
 * while it runs, stops it, calling `onPress()` each time it is pressed; `note` is the data-testid
 * of its panel's waiting note, `name` what the other panels' notes call it.
 */
export function registerLongJob(job, { button, note, name, onPress }) {
  LONG_JOBS[job] = { button, note, name };
  // A double-click is one press: its second click (event.detail 2, and 3 for a triple) would stop
  // at once the job the first one started. (Keyboard presses and scripts' click() have detail 0.)
  button.addEventListener('click', (event) => {
    if (event.detail <= 1) onPress();
  });
}

/** Claims the worker for `job`; false if another long job holds it. */
export function beginLongJob(job) {
  if (demo.longJob !== null) return false;
  demo.longJob = job;
  for (const [other, j] of Object.entries(LONG_JOBS)) {
    if (other === job) continue;
    j.button.disabled = true;
    const note = byTestId(j.note);
    note.textContent = `Waiting: ${LONG_JOBS[job].name} is running. One long job at a time: they share one ` +
      'AttentionWorker, and two at once would slow each other\'s timings down.';
    note.hidden = false;
  }
  return true;
}

export function endLongJob(job) {
  if (demo.longJob !== job) return;
  demo.longJob = null;
  for (const [other, j] of Object.entries(LONG_JOBS)) {
    if (other === job) continue;
    j.button.disabled = attnWorker === null;
    byTestId(j.note).hidden = true;
  }
}

/** Enables the long jobs' start buttons (disabled in index.html until the worker has started). */
export function enableLongJobs() {
  for (const j of Object.values(LONG_JOBS)) j.button.disabled = false;
}
