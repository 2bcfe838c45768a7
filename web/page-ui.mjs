// Helpers shared by the demo page's panels: element lookups, reading and clamping number fields,
// a panel's error line, the width a figure may take, yielding to the browser, and byte counts as text.

export const $ = (id) => document.getElementById(id);
export const byTestId = (id) => document.querySelector(`[data-testid="${id}"]`);

export const intValue = (el, lo, hi) => {
  const v = Math.round(Number(el.value));
  const clamped = Number.isNaN(v) ? lo : Math.min(hi, Math.max(lo, v));  // ±Infinity: hi or lo
  return clamped;
};
/**
 * Makes a number field show the value the page computes with: on 'change' (the field left, or
 * Enter), not on every 'input', so that typing "12" is not turned into "10" at its "1".
 */
export function clampOnChange(el, lo, hi) {
  el.addEventListener('change', () => {
    const v = String(intValue(el, lo, typeof hi === 'function' ? hi() : hi));
    if (el.value !== v) el.value = v;
  });
}
/** An error's text as a panel shows it. */
export const errorText = (error) => String(error?.message ?? error);
/** Shows `text` in a panel's error line (data-testid `id`), or hides the line when text is null. */
export function showPanelError(id, text) {
  const el = byTestId(id);
  el.hidden = text === null;
  el.textContent = text === null ? '' : `Not computed: ${text}`;
}
export const availableWidth = (el) => Math.max(220, Math.min(el.closest('.panel').clientWidth - 46, 900));

export const yieldToBrowser = () => new Promise((resolve) => {
  if (document.visibilityState === 'visible') requestAnimationFrame(() => setTimeout(resolve, 0));
  else setTimeout(resolve, 0);
});
export const bytesText = (n) => (n >= 2 ** 20 ? `${(n / 2 ** 20).toFixed(2)} MiB` : `${(n / 1024).toFixed(1)} KiB`);
