// The demo page: six panels, each computed live with sdpa-wasm.
// Tests read what the page shows from elements with data-testid attributes and from
// window.__demo (the raw Float32Arrays behind every number on screen).
//
// Where things run: the three quick panels call an Attention on the page's thread (a call takes
// well under a frame). The three long jobs, the benchmark, the generation and the training,
// would freeze the page there, so their sdpa-wasm calls go to an AttentionWorker (and the
// benchmark's plain-JS side, and the making and copying of its inputs, to workers of their
// own); while they run, a FrameMeter below their progress bars shows that the page keeps
// drawing. They share the AttentionWorker, so one runs at a time.
// Errors: a quick panel shows any error (from sdpa-wasm or a control's value) in its own error
// line; a long job in its phase text. None escapes as an uncaught error.
//
// Each panel is a module of its own in panels/; what they share is in page-ui.mjs (DOM helpers),
// demo-state.mjs (window.__demo), instances.mjs (the Attention and the AttentionWorker) and
// long-jobs.mjs (one long job at a time). This entry point starts sdpa-wasm and wires the panels.
import { demo } from './demo-state.mjs';
import { awaitAttentionWorker, startAttention } from './instances.mjs';
import { enableLongJobs, setupLongJobs } from './long-jobs.mjs';
import { byTestId } from './page-ui.mjs';
import { computeHeatmap, renderHeatmap, setupHeatmapPanel } from './panels/heatmap-panel.mjs';
import { computeLesson, renderLesson, setupLessonPanel } from './panels/lesson-panel.mjs';
import { computeMasking, renderMasking, setupMaskingPanel } from './panels/masking-panel.mjs';
import { setupBenchPanel, showBenchEstimate } from './panels/bench-panel.mjs';
import { renderGenerationChart, setupGenerationPanel } from './panels/generation-panel.mjs';
import { renderTraining, setupTrainingPanel } from './panels/training-panel.mjs';

for (const form of document.querySelectorAll('form')) form.addEventListener('submit', (e) => e.preventDefault());

// The panels' controls are set up once the page's Attention exists (the worker loads meanwhile).
await startAttention();
setupHeatmapPanel();
setupLessonPanel();
setupMaskingPanel();
setupLongJobs();
setupBenchPanel();
setupGenerationPanel();
setupTrainingPanel();

// ── start ─────────────────────────────────────────────────────────────────────────────────
computeHeatmap();
computeLesson();
computeMasking();

let resizeTimer = 0;
window.addEventListener('resize', () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => { renderHeatmap(); renderLesson(); renderMasking(); if (demo.generation) renderGenerationChart(); if (demo.training) renderTraining(); }, 100);
});

await awaitAttentionWorker();
// The long jobs' buttons start disabled in index.html: they need the worker.
enableLongJobs();
showBenchEstimate();

const status = byTestId('status');
status.textContent = 'Ready.';
status.className = 'status ok';
demo.ready = true;
document.documentElement.dataset.ready = 'true';
