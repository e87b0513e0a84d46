// sluice's regions page: one worldwide limit across regions, each enforcing its allotment from a
// ledger over a link with a latency, on a virtual clock. Every decision and every grant is made by
// sluice's Go code compiled to WebAssembly (regions.wasm, see web/wasm/regions: package
// sim/regions, what `sluice simulate --regions` runs); this file only reads the form, asks it to
// run, and draws what comes back. The scenario lives in the address's query string, whose keys
// are the command line's flags.
"use strict";

(() => {
  // The first scenario: demand of 1.25 times the limit moving 70/20/10 → 10/20/70 at 3m, a
  // latency of 50–150 ms to the ledger, us cut off for three leases, then a ledger flush.
  const DEFAULT = {
    regions: "eu,us,ap",
    traffic: "eu: 70/s for 3m; 10/s for 4m; us: 20/s for 7m; ap: 10/s for 3m; 70/s for 4m",
    algorithm: "fixed-window", limit: "4800", period: "1m",
    "ledger-latency": "50ms-150ms", floor: "0.05", "safe-share": "0.1",
    partition: "us@4m-4m45s", "flush-ledger": "5m30s",
  };
  // The form's fields, by the query's keys (regions.QueryKeys).
  const KEYS = ["regions", "traffic", "algorithm", "limit", "period", "burst", "refresh", "lease", "ledger-latency",
    "ledger-algorithm", "floor", "safe-share", "draw", "partition", "flush-ledger"];
  // Select boxes' first option is the command line's default: the query leaves it out.
  const SELECT_DEFAULTS = { "ledger-algorithm": "fair" };
  const DEBOUNCE_MS = 200;
  const $ = (id) => document.getElementById(id);
  const cssVar = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  const num = (n) => Math.round(n).toLocaleString("en");

  const state = { result: null, ranAt: null, debounce: 0, charts: {} };

  // ---- Loading --------------------------------------------------------------------------------

  async function loadWasm() {
    if (typeof WebAssembly !== "object" || typeof Go !== "function") {
      throw new Error("this browser has no WebAssembly");
    }
    const go = new Go();
    const ready = new Promise((resolve) => { globalThis.sluiceRegionsReady = resolve; });
    const response = await fetch("regions.wasm");
    if (!response.ok) {
      throw new Error(`regions.wasm: HTTP ${response.status}`);
    }
    const module = (response.headers.get("Content-Type") || "").startsWith("application/wasm")
      ? await WebAssembly.instantiateStreaming(response, go.importObject)
      : await WebAssembly.instantiate(await response.arrayBuffer(), go.importObject);
    go.run(module.instance); // returns when the Go program ends, which it never does
    await ready;
  }

  // ---- Formatting -----------------------------------------------------------------------------

  // duration writes ms as Go writes a duration, without zero tails: 250ms, 10s, 3m10s.
  function duration(ms) {
    if (ms === 0) return "0s";
    if (ms < 1000) return ms + "ms";
    const s = ms / 1000, h = Math.floor(s / 3600), m = Math.floor((s - h * 3600) / 60);
    const rest = Number((s - h * 3600 - m * 60).toFixed(3));
    return (h ? h + "h" : "") + (m || (h && rest) ? m + "m" : "") + (rest ? rest + "s" : "");
  }

  function setStatus(text, isError) {
    $("status").textContent = text;
    $("status").classList.toggle("error", !!isError);
  }

  // ---- The form and the address ---------------------------------------------------------------

  function fillForm(params) {
    for (const k of KEYS) {
      const el = $(k);
      const v = params.getAll(k).join(", ");
      el.value = v || (el.tagName === "SELECT" ? SELECT_DEFAULTS[k] || el.options[0].value : "");
    }
  }

  function formQuery() {
    const q = new URLSearchParams();
    for (const k of KEYS) {
      const v = $(k).value.trim();
      if (v && v !== SELECT_DEFAULTS[k]) q.set(k, v);
    }
    return q.toString();
  }

  // command is the scenario as a command line: what a terminal runs for the same numbers.
  function command(query) {
    const quote = (s) => (/^[\w@.,:/+-]+$/.test(s) ? s : "'" + s.replace(/'/g, "'\\''") + "'");
    const parts = ["sluice simulate"];
    for (const [k, v] of new URLSearchParams(query)) {
      const values = k === "partition" || k === "flush-ledger" ? v.split(",").map((s) => s.trim()).filter(Boolean) : [v];
      for (const x of values) parts.push(`--${k} ${quote(x)}`);
    }
    return parts.join(" ");
  }

  function showErrors(errors) {
    for (const el of document.querySelectorAll(".field-error")) {
      el.hidden = true;
      el.textContent = "";
    }
    for (const el of document.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
    for (const e of errors) {
      const field = KEYS.includes(e.field) ? e.field : "";
      const p = $(field + "-error");
      p.textContent = (p.textContent ? p.textContent + " " : "") + (field ? `${$(field).labels[0].textContent}: ` : "") + e.message;
      p.hidden = false;
      if (field) $(field).setAttribute("aria-invalid", "true");
    }
  }

  // run runs the form's scenario if it changed; a scenario with errors shows them by their fields
  // and leaves the last good result on the page.
  function run() {
    const query = formQuery();
    if (query === state.ranAt) return;
    state.ranAt = query;
    const started = performance.now();
    const out = JSON.parse(globalThis.sluiceRegions.run(query));
    if (out.errors) {
      showErrors(out.errors);
      $("summary").dataset.error = "true";
      setStatus(`Not run: ${out.errors.length === 1 ? "an error" : out.errors.length + " errors"} in the form (below)` +
        (state.result ? "; the page shows the last good result." : "."), true);
      return;
    }
    showErrors([]);
    delete $("summary").dataset.error;
    state.result = out;
    history.replaceState(null, "", query ? "?" + query : location.pathname);
    $("command").textContent = command(query);
    const intervals = out.timeline.length / out.regions.length;
    setStatus(`Ran in ${Math.round(performance.now() - started)} ms: ${num(intervals)} refreshes of ${out.regions.length} regions, ` +
      `${out.summary.windows} windows, ${num(out.summary.grants)} grants received, ${num(out.summary.failed_refreshes)} refreshes failed.`);
    render(query);
  }

  function schedule() {
    clearTimeout(state.debounce);
    state.debounce = setTimeout(run, DEBOUNCE_MS);
  }

  // ---- What the result says -------------------------------------------------------------------

  // intervals groups the timeline by refresh interval: [{t, rows: {region: row}}].
  function intervals(r) {
    const out = [];
    for (const row of r.timeline) {
      if (!out.length || out[out.length - 1].t !== row.t_ms) out.push({ t: row.t_ms, rows: {} });
      out[out.length - 1].rows[row.region] = row;
    }
    return out;
  }

  // argBy returns the region whose row has the largest (sign 1) or smallest (-1) value of key.
  function argBy(regions, rows, key, sign) {
    let best = null;
    for (const name of regions) {
      if (best === null || sign * (rows[name][key] - rows[best][key]) > 0) best = name;
    }
    return best;
  }

  // movement finds where the demand moved: the first interval whose busiest region is not the
  // first busy interval's; then the first interval at whose end that region's allotment is the
  // largest.
  function movement(r, ivs) {
    const top = (iv) => argBy(r.regions, iv.rows, "offered", 1);
    const first = ivs.findIndex((iv) => r.regions.some((n) => iv.rows[n].offered > 0));
    if (first < 0) return null;
    const before = top(ivs[first]);
    const at = ivs.findIndex((iv, i) => i > first && iv.rows[top(iv)].offered > iv.rows[before].offered);
    const last = ivs[ivs.length - 1];
    const m = { before, smallestAfter: argBy(r.regions, last.rows, "allotment", -1), largestAtEnd: argBy(r.regions, last.rows, "allotment", 1) };
    if (at < 0) return m;
    m.at = ivs[at].t;
    m.after = top(ivs[at]);
    m.largestBefore = argBy(r.regions, ivs[at - 1].rows, "allotment", 1);
    m.allotmentBefore = ivs[at - 1].rows[m.largestBefore].allotment;
    const conv = ivs.findIndex((iv, i) => i >= at && argBy(r.regions, iv.rows, "allotment", 1) === m.after);
    if (conv >= 0) m.converged = ivs[conv].t + r.ledger.refresh_ms - m.at;
    return m;
  }

  function render(query) {
    const r = state.result;
    const ivs = intervals(r);
    const s = $("summary");
    s.dataset.query = query;
    s.dataset.held = String(r.summary.held);

    const bad = r.windows.filter((w) => !w.held).length;
    $("verdict").textContent = r.summary.held
      ? `Yes: worldwide, no window admitted more than its bound — all ${r.windows.length} of them.`
      : `No: ${bad} of ${r.windows.length} windows admitted more than their bound.`;
    $("verdict").classList.toggle("error", !r.summary.held);
    $("bound").textContent = r.summary.bound.replace(/^bound: /, "");

    const admitted = r.windows.reduce((a, w) => a + w.admitted, 0);
    const offered = r.timeline.reduce((a, row) => a + row.offered, 0);
    const capacity = r.policy.limit * r.windows.length;
    $("used").textContent = `${Math.round((100 * admitted) / capacity)}% of the limit: ${num(admitted)} admitted of ${num(capacity)} ` +
      `(${num(r.policy.limit)} × ${r.windows.length} windows), with demand of ${num(offered)} (${Math.round((100 * offered) / capacity)}% of the limit).`;

    const m = movement(r, ivs);
    for (const k of ["topBefore", "largestBefore", "topAfter", "smallestAfter", "convergedMs"]) delete s.dataset[k];
    let text = "No demand.";
    if (m && m.at === undefined) {
      text = `The demand does not move: ${m.before} has the most throughout, and at the end the largest allotment is ${m.largestAtEnd}'s.`;
      s.dataset.topBefore = m.before;
    } else if (m) {
      Object.assign(s.dataset, { topBefore: m.before, largestBefore: m.largestBefore, topAfter: m.after, smallestAfter: m.smallestAfter });
      text = `Before the move, ${m.before} had the most demand and ${m.largestBefore} the largest allotment (${num(m.allotmentBefore)}). ` +
        `From ${duration(m.at)}, ${m.after} has the most demand; `;
      if (m.converged !== undefined) {
        s.dataset.convergedMs = String(m.converged);
        text += `its allotment is the largest ${duration(m.converged)} later (${Math.round(m.converged / r.ledger.refresh_ms)} refreshes). `;
      } else {
        text += "its allotment never becomes the largest. ";
      }
      text += `At the end, ${m.smallestAfter} has the smallest allotment.`;
    }
    $("converged").textContent = text;
    const events = [...r.partitions.map((p) => `${p.region} cut off from the ledger ${duration(p.from_ms)}–${duration(p.to_ms)}`),
      ...r.flushes_ms.map((f) => `the ledger flushed at ${duration(f)}`)];
    $("events").textContent = events.length ? `Marked: ${events.join("; ")}.` : "No partition, no flush.";
    drawCharts(r, ivs);
  }

  // ---- Charts ---------------------------------------------------------------------------------

  const palette = () => [1, 2, 3, 4, 5, 6].map((i) => cssVar(`--region-${i}`));
  const colorOf = (r, name) => palette()[r.regions.indexOf(name) % 6];

  // marks draws the partitions (a band in the region's colour) and the flushes (a line) behind a
  // chart's series.
  function marks(u) {
    const r = state.result;
    if (!r) return;
    const { ctx, bbox } = u;
    const x = (ms) => u.valToPos(ms / 1000, "x", true);
    ctx.save();
    ctx.font = `${Math.round(11 * devicePixelRatio)}px system-ui, sans-serif`;
    ctx.textBaseline = "top";
    for (const p of r.partitions) {
      const x0 = x(p.from_ms), x1 = x(p.to_ms);
      ctx.globalAlpha = 0.15;
      ctx.fillStyle = colorOf(r, p.region);
      ctx.fillRect(x0, bbox.top, x1 - x0, bbox.height);
      ctx.globalAlpha = 1;
      ctx.fillText(`${p.region} cut off`, x0 + 3, bbox.top + 2);
    }
    ctx.strokeStyle = ctx.fillStyle = cssVar("--muted");
    ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
    ctx.lineWidth = devicePixelRatio;
    for (const f of r.flushes_ms) {
      ctx.beginPath();
      ctx.moveTo(x(f), bbox.top);
      ctx.lineTo(x(f), bbox.top + bbox.height);
      ctx.stroke();
      ctx.fillText("ledger flushed", x(f) + 3, bbox.top + 2 + 14 * devicePixelRatio);
    }
    ctx.restore();
  }

  // The time axis's steps, in seconds: round durations.
  const TICKS = [0.001, 0.01, 0.1, 0.5, 1, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400];

  function chartOptions(el, height, series) {
    return {
      width: Math.max(200, el.clientWidth),
      height,
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: false } },
      axes: [
        { stroke: cssVar("--muted"), grid: { stroke: cssVar("--grid") }, incrs: TICKS, values: (u, vals) => vals.map((v) => duration(Math.round(v * 1000))) },
        { stroke: cssVar("--muted"), grid: { stroke: cssVar("--grid") }, size: 56, values: (u, vals) => vals.map((v) => num(v)) },
      ],
      hooks: { drawClear: [marks] },
      series: [{ label: "t" }, ...series],
    };
  }

  // chart makes the chart in the element of this id, or, when its series are the same, gives it
  // the new data.
  function chart(id, height, series, data) {
    const el = $(id);
    const key = series.map((s) => s.label).join("|");
    let c = state.charts[id];
    if (c && c.key !== key) {
      c.u.destroy();
      c = null;
    }
    if (!c) {
      el.textContent = "";
      c = state.charts[id] = { key, u: new uPlot(chartOptions(el, height, series), data, el) };
    } else {
      c.u.setData(data);
    }
    el.dataset.drawn = String(data[0].length);
  }

  function drawCharts(r, ivs) {
    const I = r.ledger.refresh_ms, P = r.policy.period_ms;
    const phone = innerWidth < 600;
    // An allotment is what a region enforces at the end of its interval; a demand is the requests
    // offered in the interval, per period.
    const x = [0, ...ivs.map((iv) => (iv.t + I) / 1000)];
    const series = [], data = [x];
    const steps = uPlot.paths.stepped({ align: 1 }), before = uPlot.paths.stepped({ align: -1 });
    for (const name of r.regions) {
      const color = colorOf(r, name);
      series.push({ label: `${name} allotment`, stroke: color, width: 2, paths: steps, points: { show: false } });
      series.push({ label: `${name} demand`, stroke: color, width: 1.5, dash: [5, 4], paths: before, points: { show: false } });
      const demand = ivs.map((iv) => (iv.rows[name].offered * P) / I);
      data.push([ivs.length ? r.ledger.floor : 0, ...ivs.map((iv) => iv.rows[name].allotment)]);
      data.push([demand[0] ?? 0, ...demand]);
    }
    chart("allotments", phone ? 220 : 250, series, data);

    const bars = uPlot.paths.bars({ align: 1, size: [0.7, Infinity] });
    const wx = [...r.windows.map((w) => w.t_ms / 1000), r.windows.length * P / 1000];
    const pad = (a) => [...a, a[a.length - 1]];
    chart("windows", phone ? 180 : 200, [
      { label: "admitted worldwide", fill: cssVar("--allowed"), stroke: cssVar("--allowed"), width: 0, paths: bars, points: { show: false } },
      { label: "limit", stroke: cssVar("--fg"), width: 1.5, paths: steps, points: { show: false } },
      { label: "bound", stroke: cssVar("--refused"), width: 1.5, dash: [6, 4], paths: steps, points: { show: false } },
    ], [wx, [...r.windows.map((w) => w.admitted), null], pad(r.windows.map(() => r.policy.limit)), pad(r.windows.map((w) => w.bound))]);
    $("windows").dataset.admitted = r.windows.map((w) => w.admitted).join(",");
  }

  function resize() {
    for (const [id, c] of Object.entries(state.charts)) {
      const w = Math.max(200, $(id).clientWidth);
      if (w !== c.u.width) c.u.setSize({ width: w, height: c.u.height });
    }
  }

  // ---- Start ----------------------------------------------------------------------------------

  async function start() {
    const params = new URLSearchParams(location.search);
    fillForm([...params.keys()].length ? params : new URLSearchParams(DEFAULT));
    $("scenario").addEventListener("input", schedule);
    $("scenario").addEventListener("change", schedule);
    $("scenario").addEventListener("submit", (e) => { e.preventDefault(); run(); });
    $("reset").addEventListener("click", () => { fillForm(new URLSearchParams(DEFAULT)); run(); });
    new ResizeObserver(resize).observe(document.querySelector(".regions-chart"));
    try {
      await loadWasm();
    } catch (err) {
      setStatus(`The simulator did not load: ${err.message}.`, true);
      return;
    }
    run();
  }

  start();
})();
