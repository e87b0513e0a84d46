// sluice's browser simulation. Every decision is made by sluice's Go code, compiled to
// WebAssembly (sluice.wasm, see web/wasm): this file only reads the form, asks it to run the
// scenario, and draws what comes back. The scenario lives in the address's query string.
"use strict";

(() => {
  const ALGORITHMS = ["fixed-window", "sliding-log", "sliding-window", "token-bucket", "leaky-bucket"];
  const TAKES_BURST = new Set(["token-bucket", "leaky-bucket"]);
  const SHARED_KEYS = ["traffic", "jitter", "seed", "limit", "period", "burst"];
  const OWN_KEYS = ["limit", "period", "burst"];

  // What each algorithm's state plot shows (see scenario.Run.Level).
  const LEVEL = {
    "fixed-window": { title: "Count in the current window", level: "counted", cap: "limit" },
    "sliding-log": { title: "Count in the last period", level: "counted", cap: "limit" },
    "sliding-window": { title: "Weighted count (previous window × overlap + current)", level: "counted", cap: "limit" },
    "token-bucket": { title: "Tokens in the bucket", level: "tokens", cap: "capacity" },
    "leaky-bucket": { title: "Requests in the queue (waiting or draining)", level: "queued", cap: "room (burst + 1)" },
  };

  const DEBOUNCE_MS = 150;
  const $ = (id) => document.getElementById(id);

  const state = {
    result: null, // the last run that succeeded: the JSON of scenario.Result
    t: 0, // the virtual clock, in µs
    playing: false,
    speed: 1,
    shown: -1, // the buckets drawn (and totalled in the table) so far
    lastFrame: 0, // the animation frame's timestamp, ms; 0 when the clock is stopped
    presets: [],
    cards: new Map(), // algorithm → {el, charts, ...}
    debounce: 0,
    ranAt: "", // the query of the last run asked for, so that an unchanged form does not run again
  };

  // ---- Loading --------------------------------------------------------------------------------

  async function loadWasm() {
    if (typeof WebAssembly !== "object" || typeof Go !== "function") {
      throw new Error("this browser has no WebAssembly");
    }
    const go = new Go();
    const ready = new Promise((resolve) => { globalThis.sluiceReady = resolve; });
    let response;
    try {
      response = await fetch("sluice.wasm");
    } catch (err) {
      if (location.protocol === "file:") {
        throw new Error("a page opened from a file cannot load WebAssembly: serve the folder over HTTP " +
          "(sluice web, or python3 -m http.server in it)");
      }
      throw err;
    }
    if (!response.ok) {
      throw new Error(`sluice.wasm: HTTP ${response.status}`);
    }
    let module;
    if ((response.headers.get("Content-Type") || "").startsWith("application/wasm")) {
      module = await WebAssembly.instantiateStreaming(response, go.importObject);
    } else {
      // A static host that does not know .wasm: compile from the bytes instead of streaming.
      module = await WebAssembly.instantiate(await response.arrayBuffer(), go.importObject);
    }
    go.run(module.instance); // returns when the Go program ends, which it never does
    await ready;
  }

  // ---- Formatting -----------------------------------------------------------------------------

  // trim writes x with at most 3 decimals and no trailing zeros.
  function trim(x) {
    return String(Number(x.toFixed(3)));
  }

  // duration writes µs as Go writes a duration, without zero tails: 250ms, 6.825s, 1m30s, 2h.
  function duration(us) {
    us = Math.round(us);
    if (us === 0) return "0s";
    if (us < 1000) return us + "µs";
    if (us < 1e6) return trim(us / 1000) + "ms";
    const s = us / 1e6;
    if (s < 60) return trim(s) + "s";
    const h = Math.floor(s / 3600);
    const m = Math.floor((s - h * 3600) / 60);
    const rest = s - h * 3600 - m * 60;
    return (h ? h + "h" : "") + (m || (h && rest) ? m + "m" : "") + (rest >= 0.0005 ? trim(rest) + "s" : "");
  }

  function setStatus(text, isError) {
    const el = $("status");
    el.textContent = text;
    el.classList.toggle("error", !!isError);
  }

  // ---- The form and the address ---------------------------------------------------------------

  function scenarioInputs() {
    const inputs = SHARED_KEYS.map((k) => $(k));
    for (const alg of ALGORITHMS) {
      for (const k of OWN_KEYS) {
        const el = $(`${alg}.${k}`);
        if (el) inputs.push(el);
      }
    }
    return inputs;
  }

  // formQuery writes the form as a query string: the inputs that have a value.
  function formQuery() {
    const params = new URLSearchParams();
    for (const el of scenarioInputs()) {
      const v = el.value.trim();
      if (v !== "") params.set(el.name, v);
    }
    return params.toString();
  }

  function fillForm(query) {
    const params = new URLSearchParams(query);
    for (const el of scenarioInputs()) {
      el.value = params.get(el.name) ?? "";
    }
  }

  function clearErrors() {
    for (const el of document.querySelectorAll("[aria-invalid=true]")) el.removeAttribute("aria-invalid");
    for (const el of document.querySelectorAll(".field-error")) {
      el.hidden = true;
      el.textContent = "";
    }
  }

  // showErrors shows each error ({field, message}) at its field, and returns the message of the
  // first one that has no field (about the address as a whole), if any.
  function showErrors(errors) {
    let general = "";
    for (const { field, message } of errors) {
      const input = field ? $(field) : null;
      const out = field ? $(`${field}-error`) : null;
      if (out) {
        out.textContent = field ? `${labelOf(input, field)}: ${message}` : message;
        out.hidden = false;
      } else {
        general = general || message;
      }
      if (input) input.setAttribute("aria-invalid", "true");
    }
    return general;
  }

  function labelOf(input, field) {
    const label = input && input.labels && input.labels[0];
    const text = label ? label.textContent.trim() : field;
    const alg = field.includes(".") ? field.split(".")[0] + " " : "";
    return alg + text.toLowerCase();
  }

  // ---- Running --------------------------------------------------------------------------------

  // simulate runs the scenario of a query string: the JSON of a scenario.Result, or {errors}.
  function simulate(query) {
    const started = performance.now();
    const out = JSON.parse(globalThis.sluice.run(query));
    out.ms = performance.now() - started;
    return out;
  }

  // run asks the simulator for the form's scenario (unless the form is what ran last).
  function run({ restart = false, force = false } = {}) {
    clearTimeout(state.debounce);
    const query = formQuery();
    if (!force && query === state.ranAt) return;
    state.ranAt = query;
    apply(simulate(query), { restart });
  }

  // apply takes in a run. On success it redraws and keeps the clock where it was (or restarts
  // it); on errors it marks the fields and keeps showing the last run that succeeded.
  function apply(out, { restart = false } = {}) {
    clearErrors();
    if (out.errors) {
      const general = showErrors(out.errors);
      setStatus(general || (state.result
        ? "Some inputs need fixing (marked below); the plots show the last scenario that ran."
        : "Some inputs need fixing (marked below)."), true);
      return;
    }
    state.result = out;
    history.replaceState(null, "", "?" + out.query);
    setStatus(`${out.requests.toLocaleString("en")} requests, decided by each algorithm in ${Math.max(1, Math.round(out.ms))} ms.`);
    const end = out.end_us;
    if (restart) {
      // Reduced motion: show the whole run at once, and let the buttons replay it.
      state.t = reducedMotion() ? end : 0;
      setPlaying(!reducedMotion());
    }
    state.t = Math.min(state.t, end);
    if (state.t >= end) setPlaying(false);
    updatePresets();
    updateCards();
    updateCommands();
    $("time").max = String(out.buckets);
    state.shown = -1;
    render();
  }

  function scheduleRun() {
    clearTimeout(state.debounce);
    state.debounce = setTimeout(() => run(), DEBOUNCE_MS);
  }

  function reducedMotion() {
    return window.matchMedia && window.matchMedia("(prefers-reduced-motion: reduce)").matches;
  }

  // ---- The clock ------------------------------------------------------------------------------

  function setPlaying(playing) {
    state.playing = playing;
    const end = state.result ? state.result.end_us : 0;
    $("play").textContent = playing ? "Pause" : (state.result && state.t >= end ? "Replay" : "Play");
    if (playing && !state.lastFrame) {
      state.lastFrame = performance.now();
      requestAnimationFrame(frame);
    }
  }

  function frame(now) {
    if (!state.playing || !state.result) {
      state.lastFrame = 0;
      return;
    }
    // At most a quarter second per frame, so a tab coming back from the background does not jump.
    const dt = Math.max(0, Math.min(now - state.lastFrame, 250));
    state.lastFrame = now;
    const end = state.result.end_us;
    state.t = Math.min(end, state.t + dt * 1000 * state.speed);
    if (state.t >= end) {
      state.lastFrame = 0;
      setPlaying(false);
      render();
      return;
    }
    render();
    requestAnimationFrame(frame);
  }

  // buckets returns how many buckets the clock has passed: those drawn.
  function buckets() {
    const r = state.result;
    return Math.min(r.buckets, Math.floor(state.t / r.width_us));
  }

  function render() {
    const r = state.result;
    if (!r) return;
    const k = buckets();
    $("clock").textContent = `${duration(Math.floor(state.t / 1000) * 1000)} / ${duration(r.end_us)}`;
    const slider = $("time");
    slider.value = String(k);
    slider.setAttribute("aria-valuetext", `${duration(k * r.width_us)} of ${duration(r.end_us)}`);
    if (k === state.shown) return;
    state.shown = k;
    for (const card of state.cards.values()) drawCard(card, k);
    updateSummary(k);
  }

  // ---- Cards and charts -----------------------------------------------------------------------

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  const counts = [1, 2, 5, 10, 20, 25, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7, 1e8, 1e9, 1e10, 1e12, 1e14, 1e16];

  // baseOptions are a chart's options: x from 0 to the clock's end, y from 0 to card.ymax[name].
  function baseOptions(card, name, height, yLabel) {
    const grid = { stroke: cssVar("--grid"), width: 1 };
    const axis = { stroke: cssVar("--muted"), grid, ticks: grid, font: "11px system-ui, sans-serif" };
    return {
      width: Math.max(200, card.chartWidth()),
      height,
      cursor: { sync: { key: "sluice" }, drag: { x: false, y: false } },
      legend: { live: true },
      scales: {
        x: { time: false, range: () => [0, state.result ? state.result.end_us / 1e6 : 1] },
        y: { range: () => [0, Math.max(1, card.ymax[name] || 1) * 1.08] },
      },
      axes: [
        { ...axis, values: (u, splits) => splits.map((s) => duration(s * 1e6)), space: 60 },
        { ...axis, size: 44, space: 18, label: yLabel, labelSize: 14, labelFont: "11px system-ui, sans-serif", incrs: counts,
          values: (u, splits) => splits.map((s) => s.toLocaleString("en")) },
      ],
    };
  }

  function timeSeries() {
    return { label: "t", value: (u, v) => (v == null ? "–" : duration(v * 1e6)) };
  }

  function makeCard(alg) {
    const el = $("card-template").content.firstElementChild.cloneNode(true);
    el.id = `card-${alg}`;
    el.setAttribute("aria-labelledby", `card-${alg}-h`);
    const h = el.querySelector("h3");
    h.id = `card-${alg}-h`;
    h.textContent = alg;
    for (const input of el.querySelectorAll("input[data-key]")) {
      const key = input.dataset.key;
      const field = input.closest(".field");
      if (key === "burst" && !TAKES_BURST.has(alg)) {
        field.remove();
        continue;
      }
      input.id = input.name = `${alg}.${key}`;
      field.querySelector("label").htmlFor = input.id;
      input.setAttribute("aria-describedby", `${alg}.${key}-error`);
    }
    for (const p of el.querySelectorAll("[data-error]")) {
      p.id = `${alg}.${p.dataset.error}-error`;
    }
    if (!TAKES_BURST.has(alg)) el.querySelector("[data-error=burst]").remove();
    if (alg !== "leaky-bucket") el.querySelector(".delay-only").remove();
    el.querySelector(".level-title").textContent = LEVEL[alg].title;
    $("cards").append(el);

    const card = { alg, el, raw: null, charts: [], ymax: {} };
    card.chartWidth = () => el.querySelector(".chart").clientWidth;

    const bars = uPlot.paths.bars({ align: 1, size: [1, Infinity, 1] });
    const rawValue = (key) => (u, v, si, i) => {
      const a = card.raw && card.raw[key];
      return i == null || !a || i >= state.shown || a[i] == null ? "–" : a[i].toLocaleString("en");
    };
    card.traffic = new uPlot({
      ...baseOptions(card, "traffic", 150, "requests"),
      series: [
        timeSeries(),
        { label: "refused", fill: cssVar("--refused"), stroke: cssVar("--refused"), width: 0, paths: bars, points: { show: false }, value: rawValue("refused") },
        { label: "allowed", fill: cssVar("--allowed"), stroke: cssVar("--allowed"), width: 0, paths: bars, points: { show: false }, value: rawValue("allowed") },
        { label: "delayed", fill: cssVar("--delayed"), stroke: cssVar("--delayed"), width: 0, paths: bars, points: { show: false }, value: rawValue("delayed") },
      ],
    }, [[], [], [], []], el.querySelector(".traffic-chart"));
    card.charts.push(card.traffic);

    card.level = new uPlot({
      ...baseOptions(card, "level", 140, LEVEL[alg].level),
      series: [
        timeSeries(),
        { label: LEVEL[alg].level, stroke: cssVar("--level"), width: 2, fill: cssVar("--level-fill"), points: { show: false } },
        { label: LEVEL[alg].cap, stroke: cssVar("--muted"), width: 1, dash: [4, 4], points: { show: false } },
      ],
    }, [[], [], []], el.querySelector(".level-chart"));
    card.charts.push(card.level);

    if (alg === "leaky-bucket") {
      const delay = baseOptions(card, "delay", 140, "ms");
      delay.axes[1].incrs = undefined;
      card.delay = new uPlot({
        ...delay,
        series: [
          timeSeries(),
          { label: "a request now would wait", stroke: cssVar("--delayed"), width: 2, points: { show: false } },
          { label: "longest wait of a request let in", stroke: cssVar("--muted"), width: 0, paths: () => null,
            points: { show: true, size: 3, space: 0, fill: cssVar("--muted"), stroke: cssVar("--muted") } },
        ],
      }, [[], [], []], el.querySelector(".delay-chart"));
      card.charts.push(card.delay);
    }
    state.cards.set(alg, card);
  }

  // updateCards takes in a new run: the full series of each card, and the y range they need.
  function updateCards() {
    const r = state.result;
    const w = r.width_us / 1e6;
    const x = Array.from({ length: r.buckets + 1 }, (_, i) => i * w);
    const shared = { limit: $("limit").value.trim(), period: $("period").value.trim(), burst: $("burst").value.trim() };
    r.runs.forEach((run) => {
      const card = state.cards.get(run.algorithm);
      card.raw = run;
      card.x = x;
      card.el.querySelector(".description").textContent = run.description;
      for (const key of OWN_KEYS) {
        const input = $(`${run.algorithm}.${key}`);
        if (input) input.placeholder = shared[key] || (key === "burst" ? "0" : "");
      }
      card.ymax.traffic = Math.max(1, ...run.offered);
      card.ymax.level = Math.max(run.capacity, ...run.level);
      if (card.delay) {
        card.delayMs = run.drain_us.map((us) => us / 1000);
        card.maxDelayMs = run.max_delay_us.map((us, i) => (run.delayed[i] ? us / 1000 : null));
        card.ymax.delay = Math.max(1, ...card.delayMs, ...card.maxDelayMs.filter((v) => v != null));
      }
    });
  }

  // reveal returns the first n values of a, then nulls up to length.
  function reveal(a, n, length) {
    const out = new Array(length);
    for (let i = 0; i < length; i++) out[i] = i < n ? a[i] : null;
    return out;
  }

  function drawCard(card, k) {
    const run = card.raw;
    if (!run) return;
    const n = card.x.length; // buckets + 1: the series per bucket have a null at the end
    card.traffic.setData([card.x, reveal(run.offered, k, n), reveal(run.allowed, k, n), reveal(run.delayed, k, n)]);
    card.level.setData([card.x, reveal(run.level, k + 1, n), card.x.map(() => run.capacity)]);
    if (card.delay) {
      card.delay.setData([card.x, reveal(card.delayMs, k + 1, n), reveal(card.maxDelayMs, k, n)]);
    }
  }

  function resizeCharts() {
    for (const card of state.cards.values()) {
      const width = Math.max(200, card.chartWidth());
      for (const u of card.charts) {
        if (u.width !== width) u.setSize({ width, height: u.height });
      }
    }
  }

  // ---- Summary, commands, presets -------------------------------------------------------------

  const FIELDS = ["offered", "allowed", "percent", "refused", "delayed", "never", "offered_cost", "allowed_cost", "max_delay_ms", "total_delay_ms"];

  function buildSummary() {
    const body = $("summary").tBodies[0];
    for (const alg of ALGORITHMS) {
      const tr = document.createElement("tr");
      tr.dataset.algorithm = alg;
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = alg;
      tr.append(th);
      for (const f of FIELDS) {
        const td = document.createElement("td");
        if (f === "percent") td.className = "derived";
        else td.dataset.field = f;
        tr.append(td);
      }
      body.append(tr);
    }
  }

  function updateSummary(k) {
    const r = state.result;
    // The summaries come from Go (sim.Summary's JSON, as `sluice simulate --format json` writes it);
    // their numbers are written back as JSON wrote them, so the text is the command's.
    const sums = JSON.parse(globalThis.sluice.summaries(k));
    const rows = $("summary").tBodies[0].rows;
    r.runs.forEach((run, i) => {
      const s = sums[i];
      for (const td of rows[i].cells) {
        if (td.tagName !== "TD") continue;
        if (td.classList.contains("derived")) {
          td.textContent = s.offered ? (100 * s.allowed / s.offered).toFixed(1) + "%" : "–";
        } else {
          td.textContent = String(s[td.dataset.field]);
        }
      }
    });
    const table = $("summary");
    const complete = k === r.buckets;
    table.dataset.complete = String(complete);
    table.dataset.query = r.query;
    $("summary-caption").textContent = complete
      ? `Totals of the whole run: ${r.requests.toLocaleString("en")} requests`
      : `Totals of the requests before ${duration(k * r.width_us)} (the clock's end: ${duration(r.end_us)})`;
  }

  function updateCommands() {
    const r = state.result;
    $("commands").textContent = r.commands.map((c) => c + " --format json").join("\n");
    $("trace-note").hidden = !r.query.includes("jitter=");
  }

  function downloadTrace(event) {
    event.preventDefault();
    const blob = new Blob([globalThis.sluice.trace()], { type: "text/csv" });
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = "trace.csv";
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  }

  function buildPresets() {
    state.presets = JSON.parse(globalThis.sluice.presets());
    const box = $("presets");
    for (const p of state.presets) {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = p.title;
      b.dataset.preset = p.name;
      b.setAttribute("aria-pressed", "false");
      b.addEventListener("click", () => {
        fillForm(p.query);
        run({ restart: true, force: true });
      });
      box.append(b);
    }
  }

  function updatePresets() {
    let current = null;
    for (const b of $("presets").children) {
      const p = state.presets.find((x) => x.name === b.dataset.preset);
      const on = p.query === state.result.query;
      b.setAttribute("aria-pressed", String(on));
      if (on) current = p;
    }
    $("preset-description").textContent = current ? current.description : "";
  }

  function generate() {
    const params = new URLSearchParams();
    for (const el of $("generator").querySelectorAll("input")) params.set(el.name, el.value.trim());
    for (const el of $("generator").querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
    for (const el of $("generator").querySelectorAll(".field-error")) el.hidden = true;
    const out = JSON.parse(globalThis.sluice.generate(params.toString()));
    if (out.errors) {
      for (const e of out.errors) {
        const input = document.querySelector(`#generator [name="${CSS.escape(e.field)}"]`);
        const p = $(`gen-${e.field}-error`);
        p.textContent = (input ? input.labels[0].textContent + ": " : "") + e.message;
        p.hidden = false;
        if (input) input.setAttribute("aria-invalid", "true");
      }
      return;
    }
    $("traffic").value = out.pattern;
    run({ restart: true });
  }

  async function copyLink() {
    const status = $("copy-status");
    try {
      await navigator.clipboard.writeText(location.href);
      status.textContent = "Copied.";
    } catch {
      status.textContent = "Copy the address bar's link: it holds the scenario.";
    }
  }

  // ---- Wiring ---------------------------------------------------------------------------------

  function wire() {
    const names = new Set(scenarioInputs().map((el) => el.name));
    document.addEventListener("input", (e) => {
      if (names.has(e.target.name) && e.target.form && e.target.form.id === "scenario") scheduleRun();
    });
    $("scenario").addEventListener("submit", (e) => {
      e.preventDefault();
      run();
    });
    // Enter in a card's field submits the scenario form it belongs to; in the generator it writes.
    $("generator").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && e.target.tagName === "INPUT") {
        e.preventDefault();
        generate();
      }
    });
    $("generate").addEventListener("click", generate);
    $("new-seed").addEventListener("click", () => {
      $("seed").value = String(Math.floor(Math.random() * 1e9));
      if (!$("jitter").value.trim() || $("jitter").value.trim() === "0") $("jitter").value = "50ms";
      run();
    });

    $("play").addEventListener("click", () => {
      if (!state.result) return;
      if (!state.playing && state.t >= state.result.end_us) state.t = 0;
      setPlaying(!state.playing);
      render();
    });
    $("step").addEventListener("click", () => {
      if (!state.result) return;
      state.t = Math.min(state.result.end_us, (buckets() + 1) * state.result.width_us);
      setPlaying(false);
      render();
    });
    $("restart").addEventListener("click", () => {
      if (!state.result) return;
      state.t = 0;
      setPlaying(true);
      render();
    });
    $("end").addEventListener("click", () => {
      if (!state.result) return;
      state.t = state.result.end_us;
      setPlaying(false);
      render();
    });
    $("time").addEventListener("input", (e) => {
      if (!state.result) return;
      state.t = Number(e.target.value) * state.result.width_us;
      setPlaying(false);
      render();
    });
    for (const radio of document.querySelectorAll("input[name=speed]")) {
      radio.addEventListener("change", () => { state.speed = Number(radio.value); });
    }
    $("trace-link").addEventListener("click", downloadTrace);
    $("copy-link").addEventListener("click", copyLink);

    let pending = false;
    new ResizeObserver(() => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => { pending = false; resizeCharts(); });
    }).observe($("cards"));
  }

  async function main() {
    try {
      await loadWasm();
    } catch (err) {
      setStatus(`The simulator could not start: ${err.message}.`, true);
      return;
    }
    buildPresets();
    ALGORITHMS.forEach(makeCard);
    buildSummary();
    wire();

    // The address's scenario (a bare address: the first preset, as Go's scenario.Parse decides).
    const out = simulate(location.search);
    fillForm(out.errors ? location.search : out.query);
    state.ranAt = formQuery();
    apply(out, { restart: true });
  }

  main();
})();
