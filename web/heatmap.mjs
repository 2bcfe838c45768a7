// Canvas drawing for the demo: attention-weight heatmaps with labelled axes, a colour-scale
// legend, and a small line chart. Sizes are in CSS pixels; canvases are scaled by
// devicePixelRatio so they stay sharp.

// A sequential warm colour ramp: 0 is near white, 1 is deep plum. Blocked (masked or padding)
// cells are drawn in a cool grey so they cannot be mistaken for a small weight.
const RAMP = [
  [0.0, [252, 250, 246]],
  [0.2, [252, 224, 178]],
  [0.45, [245, 160, 92]],
  [0.7, [211, 78, 74]],
  [0.88, [139, 33, 84]],
  [1.0, [72, 18, 76]],
];
export const BLOCKED_COLOUR = 'rgb(214, 220, 230)';
export const GRID = '#d5d9e0';
export const DASH = [5, 4];  // dashed chart lines
export const INK = '#1f2430';
export const MUTED = '#5b6474';
const FONT = '12px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
export const SMALL_FONT = '11px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';

/** t in [0, 1] → [r, g, b]. */
export function colour(t) {
  if (!(t > 0)) t = 0;
  if (t > 1) t = 1;
  for (let k = 1; k < RAMP.length; k++) {
    const [t1, c1] = RAMP[k];
    if (t <= t1) {
      const [t0, c0] = RAMP[k - 1];
      const f = (t - t0) / (t1 - t0);
      return [0, 1, 2].map((c) => Math.round(c0[c] + f * (c1[c] - c0[c])));
    }
  }
  return RAMP[RAMP.length - 1][1];
}

/** Sizes the canvas for CSS size w×h and returns its 2D context in CSS pixel units. */
export function prepare(canvas, w, h) {
  const ratio = Math.max(1, Math.min(3, globalThis.devicePixelRatio || 1));
  canvas.width = Math.round(w * ratio);
  canvas.height = Math.round(h * ratio);
  canvas.style.width = `${w}px`;
  canvas.style.height = `${h}px`;
  const ctx = canvas.getContext('2d');
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return ctx;
}

function niceStep(count, pixelsPerCell, minGap) {
  for (const step of [1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 256]) {
    if (step * pixelsPerCell >= minGap) return step;
  }
  return count;
}

/**
 * Draws a rows×cols heatmap of `values` (row-major) scaled to [0, vmax].
 * options: width (CSS px available), maxCell, blocked(i, j) → bool, rowLabels, colLabels,
 * xTitle, yTitle, highlightRow, compact (no axes), title.
 * Returns the geometry { left, top, cell, rows, cols } for hit-testing.
 */
export function drawHeatmap(canvas, values, rows, cols, options = {}) {
  const {
    width = 480, maxCell = 28, minCell = 1, blocked = null, rowLabels = null, colLabels = null,
    xTitle = 'key position j', yTitle = 'query position i', highlightRow = -1, highlightCell = -1, compact = false,
    vmax = 1, title = null, rowNotes = null, rowNotesTitle = 'Σ row',
  } = options;
  const labelled = !compact;
  const tokenLabels = labelled && (rowLabels !== null || colLabels !== null);
  const left = labelled ? (tokenLabels ? 74 : 46) : 0;
  const top = labelled ? (tokenLabels ? 66 : 40) : title ? 16 : 0;
  const right = rowNotes ? 54 : labelled ? 8 : 0;
  const bottom = labelled ? 6 : 0;
  let cell = Math.floor((width - left - right) / cols);
  cell = Math.max(minCell, Math.min(maxCell, cell));
  const w = left + cell * cols + right;
  const h = top + cell * rows + bottom;
  const ctx = prepare(canvas, w, h);

  const image = ctx.createImageData(cols, rows);
  for (let i = 0; i < rows; i++) {
    for (let j = 0; j < cols; j++) {
      const at = 4 * (i * cols + j);
      let rgb;
      if (blocked && blocked(i, j)) rgb = [214, 220, 230];
      else {
        const x = values[i * cols + j];
        rgb = Number.isNaN(x) ? [40, 40, 40] : colour(vmax > 0 ? x / vmax : 0);
      }
      image.data[at] = rgb[0];
      image.data[at + 1] = rgb[1];
      image.data[at + 2] = rgb[2];
      image.data[at + 3] = 255;
    }
  }
  // Upscale without smoothing: every cell a crisp square.
  const scratch = document.createElement('canvas');
  scratch.width = cols;
  scratch.height = rows;
  scratch.getContext('2d').putImageData(image, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(scratch, left, top, cell * cols, cell * rows);

  if (cell >= 10) {  // thin white grid lines between large cells
    ctx.strokeStyle = 'rgba(255,255,255,0.7)';
    ctx.lineWidth = 1;
    ctx.beginPath();
    for (let j = 1; j < cols; j++) { ctx.moveTo(left + j * cell + 0.5, top); ctx.lineTo(left + j * cell + 0.5, top + rows * cell); }
    for (let i = 1; i < rows; i++) { ctx.moveTo(left, top + i * cell + 0.5); ctx.lineTo(left + cols * cell, top + i * cell + 0.5); }
    ctx.stroke();
  }
  if (highlightRow >= 0 && highlightRow < rows) {
    ctx.strokeStyle = INK;
    ctx.lineWidth = 2;
    ctx.strokeRect(left + 1, top + highlightRow * cell + 1, cols * cell - 2, Math.max(cell - 2, 1));
    if (highlightCell >= 0 && highlightCell < cols && cell >= 6) {
      ctx.lineWidth = 3;
      ctx.strokeRect(left + highlightCell * cell, top + highlightRow * cell, cell, cell);
    }
  }
  ctx.strokeStyle = '#c9ced8';
  ctx.lineWidth = 1;
  ctx.strokeRect(left - 0.5, top - 0.5, cols * cell + 1, rows * cell + 1);

  if (rowNotes) {
    ctx.font = SMALL_FONT;
    ctx.textAlign = 'left';
    ctx.textBaseline = 'middle';
    ctx.fillStyle = INK;
    ctx.fillText(rowNotesTitle, left + cols * cell + 8, top - 10);
    for (let i = 0; i < rows; i++) {
      const note = typeof rowNotes[i] === 'string' ? { text: rowNotes[i] } : rowNotes[i];
      ctx.fillStyle = note.warn ? '#b4232f' : MUTED;
      ctx.fillText(note.text, left + cols * cell + 8, top + i * cell + cell / 2);
    }
  }
  if (title) {
    ctx.fillStyle = INK;
    ctx.font = SMALL_FONT;
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    ctx.fillText(title, left + (cols * cell) / 2, 1);
  }
  if (labelled) {
    ctx.fillStyle = MUTED;
    ctx.font = SMALL_FONT;
    // Column ticks (keys), on top.
    if (colLabels) {
      const step = niceStep(cols, cell, 13);
      ctx.save();
      for (let j = 0; j < cols; j += step) {
        ctx.save();
        ctx.translate(left + j * cell + cell / 2 + 4, top - 4);
        ctx.rotate(-Math.PI / 3);
        ctx.textAlign = 'left';
        ctx.textBaseline = 'middle';
        ctx.fillText(clip(colLabels[j], 9), 0, 0);
        ctx.restore();
      }
      ctx.restore();
    } else {
      const step = niceStep(cols, cell, 26);
      ctx.textAlign = 'center';
      ctx.textBaseline = 'bottom';
      for (let j = 0; j < cols; j += step) ctx.fillText(String(j), left + j * cell + cell / 2, top - 3);
    }
    // Row ticks (queries), on the left.
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    const rowStep = niceStep(rows, cell, rowLabels ? 13 : 16);
    for (let i = 0; i < rows; i += rowStep) {
      const label = rowLabels ? clip(rowLabels[i], 10) : String(i);
      ctx.fillText(label, left - 5, top + i * cell + cell / 2);
    }
    // Axis titles.
    ctx.fillStyle = INK;
    ctx.font = FONT;
    ctx.textAlign = 'left';
    ctx.textBaseline = 'top';
    ctx.fillText(`${xTitle} →`, left, 2);
    ctx.save();
    ctx.translate(12, top + 2);
    ctx.rotate(Math.PI / 2);
    ctx.textBaseline = 'middle';
    ctx.fillText(`${yTitle} →`, 0, 0);
    ctx.restore();
  }
  return { left, top, cell, rows, cols, width: w, height: h };
}

function clip(text, n) {
  const s = String(text ?? '');
  return s.length > n ? `${s.slice(0, n - 1)}…` : s;
}

/** A horizontal colour bar from 0 to vmax with ticks, and a "blocked" swatch. */
export function drawLegend(canvas, { width = 300, vmax = 1, label = 'attention weight', showBlocked = true } = {}) {
  const barW = Math.max(120, Math.min(width - (showBlocked ? 120 : 10), 260));
  const h = 44;
  const ctx = prepare(canvas, barW + (showBlocked ? 120 : 10), h);
  const x0 = 4, y0 = 16, barH = 10;
  for (let x = 0; x < barW; x++) {
    const [r, g, b] = colour(x / (barW - 1));
    ctx.fillStyle = `rgb(${r},${g},${b})`;
    ctx.fillRect(x0 + x, y0, 1, barH);
  }
  ctx.strokeStyle = '#c9ced8';
  ctx.strokeRect(x0 - 0.5, y0 - 0.5, barW + 1, barH + 1);
  ctx.fillStyle = INK;
  ctx.font = SMALL_FONT;
  ctx.textBaseline = 'bottom';
  ctx.textAlign = 'left';
  ctx.fillText(label, x0, y0 - 3);
  ctx.fillStyle = MUTED;
  ctx.textBaseline = 'top';
  for (const f of [0, 0.25, 0.5, 0.75, 1]) {
    const x = x0 + f * (barW - 1);
    ctx.fillRect(Math.round(x), y0 + barH, 1, 3);
    ctx.textAlign = f === 0 ? 'left' : f === 1 ? 'right' : 'center';
    ctx.fillText(tick(f * vmax), x, y0 + barH + 4);
  }
  if (showBlocked) {
    const sx = x0 + barW + 18;
    ctx.fillStyle = BLOCKED_COLOUR;
    ctx.fillRect(sx, y0, 14, barH);
    ctx.strokeRect(sx - 0.5, y0 - 0.5, 15, barH + 1);
    ctx.fillStyle = MUTED;
    ctx.textAlign = 'left';
    ctx.textBaseline = 'middle';
    ctx.fillText('blocked', sx + 20, y0 + barH / 2);
  }
}

function tick(x) {
  if (x === 0) return '0';
  if (x >= 0.1) return x.toFixed(2).replace(/0$/, '');
  return x.toPrecision(2);
}

/**
 * A chart's x tick labels under the plot, the x axis title under them (its baseline
 * xLabelFromBottom pixels above the canvas's bottom edge) and the y axis title turned along the
 * left edge. box: the plot's margins and the canvas size; px maps an x value to pixels.
 */
export function drawAxisLabels(ctx, { left, right, top, bottom, width, height }, { xTicks, px, xLabel, yLabel, xLabelFromBottom }) {
  ctx.textAlign = 'center';
  ctx.textBaseline = 'top';
  for (const x of xTicks) ctx.fillText(String(x), px(x), height - bottom + 4);
  ctx.fillStyle = INK;
  ctx.fillText(xLabel, left + (width - left - right) / 2, height - xLabelFromBottom);
  ctx.save();
  ctx.translate(11, top + (height - top - bottom) / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textBaseline = 'middle';
  ctx.fillText(yLabel, 0, 0);
  ctx.restore();
}

/**
 * A small line chart: series = [{ label, colour, points: [[x, y], ...], dashed }], log2 x axis
 * (linear with logX: false; xMin/xMax widen the x range beyond the points; a `top` margin over 20
 * puts the legend above the plot). Returns nothing; purely visual (the numbers are in the table next to it).
 */
export function drawChart(canvas, series, { width = 360, height = 200, xLabel = '', yLabel = '', xTicks = [], logX = true, xMin, xMax, top = 12 } = {}) {
  const ctx = prepare(canvas, width, height);
  const right = 10, bottom = 34;
  const fx = logX ? Math.log2 : (x) => x;
  const xs = series.flatMap((s) => s.points.map((p) => fx(p[0])));
  if (xMin !== undefined) xs.push(fx(xMin));
  if (xMax !== undefined) xs.push(fx(xMax));
  const ys = series.flatMap((s) => s.points.map((p) => p[1]));
  const xmin = Math.min(...xs), xmax = Math.max(...xs);
  const ymax = Math.max(...ys) * 1.08;
  // Room on the left for the y tick labels and the axis title beside them.
  ctx.font = SMALL_FONT;
  const left = Math.max(40, 26 + ctx.measureText(String(Math.round(ymax))).width);
  const px = (x) => left + ((fx(x) - xmin) / (xmax - xmin || 1)) * (width - left - right);
  const py = (y) => top + (1 - y / (ymax || 1)) * (height - top - bottom);
  ctx.strokeStyle = GRID;
  ctx.fillStyle = MUTED;
  ctx.font = SMALL_FONT;
  ctx.lineWidth = 1;
  // y grid
  const yStep = niceY(ymax);
  ctx.textAlign = 'right';
  ctx.textBaseline = 'middle';
  for (let y = 0; y <= ymax; y += yStep) {
    ctx.beginPath();
    ctx.moveTo(left, Math.round(py(y)) + 0.5);
    ctx.lineTo(width - right, Math.round(py(y)) + 0.5);
    ctx.stroke();
    ctx.fillText(String(Math.round(y * 10) / 10), left - 5, py(y));
  }
  drawAxisLabels(ctx, { left, right, top, bottom, width, height }, { xTicks, px, xLabel, yLabel, xLabelFromBottom: 14 });
  for (const s of series) {
    ctx.strokeStyle = s.colour;
    ctx.fillStyle = s.colour;
    ctx.lineWidth = 2;
    ctx.setLineDash(s.dashed ? DASH : []);
    ctx.beginPath();
    s.points.forEach(([x, y], k) => (k === 0 ? ctx.moveTo(px(x), py(y)) : ctx.lineTo(px(x), py(y))));
    ctx.stroke();
    ctx.setLineDash([]);
    if (s.dots) for (const [x, y] of s.points) { ctx.beginPath(); ctx.arc(px(x), py(y), 3.5, 0, 2 * Math.PI); ctx.fill(); }
  }
  // legend: inside the plot, or above it when `top` leaves room
  drawSeriesKey(ctx, series, { left: left + 6, y: top > 20 ? 8 : top + 6, right: width - right });
}

/**
 * The key of a chart's lines: per series a short stroke in its colour (dashed when it is) and
 * its label, left to right from (left, y), wrapping to a new line 14 px lower past x = right.
 */
export function drawSeriesKey(ctx, series, { left, y, right }) {
  ctx.font = SMALL_FONT;
  ctx.textAlign = 'left';
  ctx.textBaseline = 'middle';
  let lx = left, ly = y;
  for (const s of series) {
    const w = 30 + ctx.measureText(s.label).width;
    if (lx + w > right && lx > left) { lx = left; ly += 14; }
    ctx.strokeStyle = s.colour;
    ctx.lineWidth = 2;
    ctx.setLineDash(s.dashed ? DASH : []);
    ctx.beginPath();
    ctx.moveTo(lx, ly);
    ctx.lineTo(lx + 18, ly);
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.fillStyle = INK;
    ctx.fillText(s.label, lx + 22, ly);
    lx += w;
  }
}

function niceY(max) {
  for (const step of [0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]) if (max / step <= 6) return step;
  return 2000;
}
