// Small line charts on <canvas>: time on x, one or more series on y, gaps for nulls.
// No library: the dashboard ships without a CDN or a front-end build.
"use strict";

const Charts = (() => {
  const COLORS = ["#2f6fde", "#9aa4b2", "#16a34a", "#d97706", "#9333ea", "#dc2626"];

  function fmt(v) {
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (a >= 100) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1);
    return v.toFixed(a >= 1 ? 2 : 3);
  }

  function clock(ms) {
    const d = new Date(ms);
    return d.toTimeString().slice(0, 8);
  }

  // series: [{label, points: [[ts_ms, value|null], ...], dash?}]
  function draw(canvas, series, opts = {}) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || 300, h = canvas.clientHeight || 170;
    if (canvas.width !== Math.round(w * dpr)) canvas.width = Math.round(w * dpr);
    if (canvas.height !== Math.round(h * dpr)) canvas.height = Math.round(h * dpr);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    const legend = layoutLegend(ctx, series, 44, w - 10);
    const pad = { l: 44, r: 10, t: 10 + 14 * legend.lines, b: 20 };
    let xmin = Infinity, xmax = -Infinity, ymin = Infinity, ymax = -Infinity, drawn = 0;
    for (const s of series) for (const [x, y] of s.points) {
      if (y === null || y === undefined || !isFinite(y)) continue;
      xmin = Math.min(xmin, x); xmax = Math.max(xmax, x);
      ymin = Math.min(ymin, y); ymax = Math.max(ymax, y); drawn++;
    }
    canvas.dataset.points = String(drawn);
    canvas.dataset.legendFits = String(legend.fits);
    if (!drawn) {
      ctx.fillStyle = "#98a2b3"; ctx.fillText("waiting for data…", pad.l, h / 2);
      return;
    }
    if (opts.min !== undefined) ymin = Math.min(ymin, opts.min);
    if (opts.max !== undefined) ymax = Math.max(ymax, opts.max);
    if (ymax - ymin < 1e-9) { ymax += Math.abs(ymax) * 0.1 || 1; ymin -= Math.abs(ymin) * 0.1 || 0; }
    const span = ymax - ymin; ymax += span * 0.08; if (ymin !== 0 || opts.min === undefined) ymin -= span * 0.08;
    if (xmax - xmin < 1000) xmin = xmax - 1000;
    const X = (x) => pad.l + (x - xmin) / (xmax - xmin) * (w - pad.l - pad.r);
    const Y = (y) => pad.t + (1 - (y - ymin) / (ymax - ymin)) * (h - pad.t - pad.b);
    ctx.strokeStyle = "#eceff3"; ctx.fillStyle = "#667085"; ctx.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const v = ymin + (ymax - ymin) * i / 4, y = Y(v);
      ctx.beginPath(); ctx.moveTo(pad.l, y); ctx.lineTo(w - pad.r, y); ctx.stroke();
      ctx.fillText(fmt(v), 4, y + 4);
    }
    ctx.fillText(clock(xmin), pad.l, h - 5);
    const right = clock(xmax); ctx.fillText(right, w - pad.r - ctx.measureText(right).width, h - 5);
    series.forEach((s, i) => {
      ctx.strokeStyle = s.color || COLORS[i % COLORS.length]; ctx.lineWidth = 1.8;
      ctx.setLineDash(s.dash ? [5, 4] : []);
      ctx.beginPath(); let open = false;
      for (const [x, y] of s.points) {
        if (y === null || y === undefined || !isFinite(y)) { open = false; continue; }
        if (open) ctx.lineTo(X(x), Y(y)); else { ctx.moveTo(X(x), Y(y)); open = true; }
      }
      ctx.stroke();
    });
    ctx.setLineDash([]);
    legend.items.forEach(({ s, i, x, line }) => {
      const y = 7 + 14 * line;
      ctx.fillStyle = s.color || COLORS[i % COLORS.length]; ctx.fillRect(x, y, 10, 3);
      ctx.fillStyle = "#344054"; ctx.fillText(s.label, x + 14, y + 5);
    });
  }

  // Legend entries left to right, wrapping to a new line (the plot moves down) rather
  // than running past the canvas's right edge; fits is false only when one label alone
  // is wider than the canvas.
  function layoutLegend(ctx, series, left, right) {
    const items = []; let x = left, line = 0, fits = true;
    series.forEach((s, i) => {
      const width = 14 + ctx.measureText(s.label).width;
      if (x > left && x + width > right) { line++; x = left; }
      if (x + width > right) fits = false;
      items.push({ s, i, x, line });
      x += width + 10;
    });
    return { items, lines: series.length ? line + 1 : 0, fits };
  }

  return { draw, fmt, COLORS };
})();
