// The "the page is not frozen" indicator shown below a long job's progress bar: a spinner and
// the frames per second the page drew while the job ran.
//
// The spinner is turned from requestAnimationFrame, on the page's own thread, on purpose: a
// CSS animation of a transform runs on the compositor and keeps spinning while the page's
// thread is blocked, so it would prove nothing. Here the spinner stops, and the frame count
// stalls, whenever the page cannot draw; the longest gap between two frames is kept too.

/** How often the fps text is rewritten while the job runs (the spinner moves every frame). */
const TEXT_EVERY_MS = 250;
/** One turn of the spinner per second. */
const DEGREES_PER_MS = 0.36;
/**
 * A run shorter than this in which the page drew fewer than two frames (a job stopped as it
 * started) says nothing about the page's frame rate; a longer one without frames was a freeze.
 */
const SHORTEST_COUNTED_MS = 100;

export class FrameMeter {
  #element;
  #spinner;
  #text;
  #request = 0;
  #stats = null;
  #startedAt = 0;
  #lastFrameAt = 0;
  #textAt = 0;

  /** `element` holds a `.spinner` and a `.fps` element (see index.html). */
  constructor(element) {
    this.#element = element;
    this.#spinner = element.querySelector('.spinner');
    this.#text = element.querySelector('.fps');
  }

  /**
   * Starts counting frames. Returns the stats object, updated in place on every frame (so a
   * caller can expose it live): { running, frames, ms, fps, longestGapMs }.
   */
  start() {
    this.stop();
    this.#startedAt = this.#lastFrameAt = this.#textAt = performance.now();
    this.#stats = { running: true, frames: 0, ms: 0, fps: 0, longestGapMs: 0 };
    this.#element.hidden = false;
    this.#element.classList.add('running');
    this.#text.textContent = 'page drawing…';
    this.#request = requestAnimationFrame(this.#onFrame);
    return this.#stats;
  }

  /** Stops counting and leaves the job's figures on screen. Returns the final stats (null if never started). */
  stop() {
    const stats = this.#stats;
    if (stats === null || !stats.running) return stats;
    cancelAnimationFrame(this.#request);
    // A job that ends in the middle of a long stall: that stall counts as a gap too.
    this.#measure(performance.now(), false);
    stats.running = false;
    this.#element.classList.remove('running');
    this.#text.textContent = stats.frames < 2 && stats.ms < SHORTEST_COUNTED_MS
      ? `the run took ${stats.ms.toFixed(0)} ms: too short to count the page's frames`
      : `the page drew ${stats.fps.toFixed(0)} frames/s during the run (longest gap between frames ${stats.longestGapMs.toFixed(0)} ms)`;
    return stats;
  }

  #onFrame = (timestamp) => {
    // The frame's timestamp can precede start(); performance.now() is never earlier.
    const now = Math.max(timestamp, performance.now());
    this.#measure(now, true);
    this.#spinner.style.transform = `rotate(${((now - this.#startedAt) * DEGREES_PER_MS) % 360}deg)`;
    if (now - this.#textAt >= TEXT_EVERY_MS) {
      this.#textAt = now;
      this.#text.textContent = `page drawing ${this.#stats.fps.toFixed(0)} frames/s`;
    }
    this.#request = requestAnimationFrame(this.#onFrame);
  };

  #measure(now, isFrame) {
    const stats = this.#stats;
    if (isFrame) stats.frames++;
    stats.longestGapMs = Math.max(stats.longestGapMs, now - this.#lastFrameAt);
    if (isFrame) this.#lastFrameAt = now;
    stats.ms = now - this.#startedAt;
    stats.fps = stats.ms > 0 ? stats.frames / (stats.ms / 1000) : 0;
  }
}
