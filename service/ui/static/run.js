// The run page's chart: per-layer L2 norms over steps (log scale) from /ui/api/run-stats,
// with the steps that had NaN or Inf drawn as red lines. Drag across the chart to zoom:
// a downsampled run is fetched again for the selected steps, in more detail.
"use strict";

(function () {
  const box = document.getElementById("run-chart");
  if (!box) return;
  const note = document.getElementById("run-chart-note");
  const list = document.getElementById("nonfinite");
  const baseUrl = box.dataset.statsUrl;
  const palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2",
                   "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31"];
  // steps are whole numbers: axis ticks 1, 2, 5, 10, 20, 50, ... apart
  const stepIncrements = [];
  for (let power = 1; power <= 1e15; power *= 10) stepIncrements.push(power, 2 * power, 5 * power);
  let plot = null;
  let current = null;

  function chartData(stats) {
    const positive = (v) => (v !== null && v > 0 ? v : null);
    return [stats.steps, ...stats.l2_norm.map((series) => series.map(positive))];
  }

  function markNonfinite(u) {
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    let marked = 0;
    ctx.save();
    ctx.strokeStyle = "rgba(198, 40, 40, 0.85)";
    ctx.fillStyle = "rgba(198, 40, 40, 0.95)";
    ctx.lineWidth = Math.max(2, devicePixelRatio * 2);
    ctx.font = `${Math.round(11 * devicePixelRatio)}px system-ui, sans-serif`;
    for (const bad of current.nonfinite) {
      const x = u.valToPos(bad.step, "x", true);
      if (x < left - 1 || x > left + width + 1) continue;
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
      ctx.fillText(bad.nan_count ? "NaN" : "Inf", x + 3 * devicePixelRatio, top + 12 * devicePixelRatio);
      marked += 1;
    }
    ctx.restore();
    box.dataset.markedSteps = String(marked);
  }

  function describe(stats) {
    const points = stats.steps.length;
    const isRange = stats.step_min !== null || stats.step_max !== null;
    note.textContent = isRange
      ? `${stats.snapshots} snapshots from step ${stats.step_min} to ${stats.step_max}` +
        (stats.bucket_size > 1 ? ` as ${points} points` : "") +
        "; double-click the chart to see the whole run again."
      : stats.bucket_size > 1
      ? `${stats.snapshots} snapshots shown as ${points} points (largest norm of each ` +
        `${stats.bucket_size} consecutive); drag across the chart to see a range in more detail.`
      : `${stats.snapshots} snapshots.` + (points > 1 ? " Drag across the chart to zoom; double-click to zoom out." : "");
    list.replaceChildren();
    if (stats.nonfinite_total) {
      const heading = document.createElement("p");
      heading.className = "bad-text";
      heading.textContent = `${stats.nonfinite_total} snapshot(s) with NaN or Inf:`;
      const items = document.createElement("ul");
      for (const bad of stats.nonfinite) {
        const item = document.createElement("li");
        const link = document.createElement("a");
        link.href = `snapshots/${encodeURIComponent(bad.id)}`;
        link.textContent = `step ${bad.step}`;
        item.append(link, ` — NaN ${bad.nan_count}, Inf ${bad.inf_count} in ${bad.layers.join(", ")}`);
        items.append(item);
      }
      list.append(heading, items);
    }
  }

  function options(stats) {
    return {
      width: Math.max(320, box.clientWidth),
      height: 360,
      scales: { x: { time: false }, y: { distr: 3 } },
      axes: [{ label: "step", incrs: stepIncrements }, { label: "L2 norm", size: 70 }],
      series: [
        { label: "step" },
        ...stats.layers.map((name, i) => ({
          label: name,
          stroke: palette[i % palette.length],
          width: 1.5,
          spanGaps: false,
          points: { show: stats.steps.length <= 60 },
        })),
      ],
      cursor: { drag: { x: true, y: false } },
      hooks: {
        draw: [markNonfinite],
        setSelect: [zoomed],
      },
    };
  }

  async function load(query) {
    const url = baseUrl + (query ? `&${query}` : "");
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) {
      const body = await response.json().catch(() => ({ detail: response.statusText }));
      throw new Error(`${response.status}: ${body.detail}`);
    }
    return response.json();
  }

  function zoomed(u) {
    if (u.select.width < 4 || current.bucket_size === 1) return;
    const low = Math.floor(u.posToVal(u.select.left, "x"));
    const high = Math.ceil(u.posToVal(u.select.left + u.select.width, "x"));
    load(`step_min=${Math.max(0, low)}&step_max=${Math.max(0, high)}`).then(show).catch(failed);
  }

  function show(stats) {
    current = stats;
    describe(stats);
    if (plot) plot.destroy();
    box.replaceChildren();
    if (!stats.steps.length) {
      box.textContent = "This run has no snapshots.";
      box.dataset.markedSteps = "0";
      return;
    }
    plot = new uPlot(options(stats), chartData(stats), box);
    box.dataset.series = String(stats.layers.length);
    box.dataset.ready = "true";
  }

  // uPlot's own double-click zooms out to the data it holds; after a zoom that fetched a
  // range, the whole run is fetched again
  box.addEventListener("dblclick", () => {
    if (current && (current.step_min !== null || current.step_max !== null)) {
      load("").then(show).catch(failed);
    }
  });

  function failed(error) {
    box.textContent = `The chart could not be loaded: ${error.message}`;
    box.dataset.failed = "true";
  }

  load("").then(show).catch(failed);

  window.addEventListener("resize", () => {
    if (plot) plot.setSize({ width: Math.max(320, box.clientWidth), height: 360 });
  });
})();
