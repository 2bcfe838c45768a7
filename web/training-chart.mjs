// Panel 6's charts: lines against the training step on a logarithmic y axis, redrawn as the
// steps come (the whole chart each time: at most a few thousand points).

import { DASH, GRID, MUTED, SMALL_FONT, drawAxisLabels, drawSeriesKey, prepare } from './heatmap.mjs';

/** The trailing mean over `window` values of each point (the first points over fewer). */
export function trailingMean(values, window) {
  const out = new Array(values.length);
  let sum = 0;
  for (let i = 0; i < values.length; i++) {
    sum += values[i];
    if (i >= window) sum -= values[i - window];
    out[i] = sum / Math.min(i + 1, window);
  }
  return out;
}

const decadeLabel = (e) => (e >= 0 && e <= 2 ? String(10 ** e) : e < 0 && e >= -2 ? (10 ** e).toFixed(-e) : `1e${e}`);

/**
 * series: [{ label, colour, dashed, values }] (values[k] is step k + 1's); the y axis spans
 * whole decades around every finite positive value. Returns the decades drawn.
 */
export function drawLogChart(canvas, series, { width = 440, height = 230, steps = 300, xLabel = 'step', yLabel = '' } = {}) {
  const ctx = prepare(canvas, width, height);
  const left = 52, right = 10, top = 30, bottom = 34;
  let lo = Infinity, hi = -Infinity;
  for (const s of series) for (const v of s.values) if (v > 0 && Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  if (!Number.isFinite(lo)) { lo = 0.01; hi = 1; }
  const eLo = Math.floor(Math.log10(lo)), eHi = Math.max(eLo + 1, Math.ceil(Math.log10(hi)));
  const px = (step) => left + (step / steps) * (width - left - right);
  const py = (v) => top + (1 - (Math.log10(v) - eLo) / (eHi - eLo)) * (height - top - bottom);
  ctx.font = SMALL_FONT;
  ctx.lineWidth = 1;
  ctx.strokeStyle = GRID;
  ctx.fillStyle = MUTED;
  ctx.textAlign = 'right';
  ctx.textBaseline = 'middle';
  for (let e = eLo; e <= eHi; e++) {
    const y = Math.round(py(10 ** e)) + 0.5;
    ctx.beginPath();
    ctx.moveTo(left, y);
    ctx.lineTo(width - right, y);
    ctx.stroke();
    ctx.fillText(decadeLabel(e), left - 5, y);
  }
  const xTicks = [0, Math.round(steps / 3), Math.round((2 * steps) / 3), steps];
  drawAxisLabels(ctx, { left, right, top, bottom, width, height }, { xTicks, px, xLabel, yLabel, xLabelFromBottom: 16 });
  // The lines, clipped to the plot.
  ctx.save();
  ctx.beginPath();
  ctx.rect(left, top - 2, width - left - right, height - top - bottom + 4);
  ctx.clip();
  for (const s of series) {
    ctx.strokeStyle = s.colour;
    ctx.lineWidth = 1.8;
    ctx.setLineDash(s.dashed ? DASH : []);
    ctx.beginPath();
    let pen = false;
    s.values.forEach((v, k) => {
      if (!(v > 0) || !Number.isFinite(v)) { pen = false; return; }
      const x = px(k + 1), y = py(v);
      if (pen) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      pen = true;
    });
    ctx.stroke();
  }
  ctx.restore();
  ctx.setLineDash([]);
  // Legend above the plot, wrapping if needed.
  drawSeriesKey(ctx, series, { left, y: 8, right: width - right });
  return { eLo, eHi };
}
