// sluice's browser simulation. Every decision is made by sluice's Go code, compiled to
// WebAssembly (sluice.wasm, see web/wasm): this file only reads the form, asks it to run the
// scenario, and draws what comes back. The scenario lives in the address's query string.
"use strict";

(() => {
  const ALGORITHMS = ["fixed-window", "sliding-log", "sliding-window", "token-bucket", "leaky-bucket"];
  const TAKES_BURST = new Set(["token-bucket", "leaky-bucket"]);
  const SHARED_KEYS = ["traffic", "jitter", "draw", "actual", "limit", "period", "burst", "calendar", "time-zone", "start", "instances", "store",
    "balance", "store-latency", "outage", "on-error"];
  // The algorithms that count by the calendar (sim.CalendarAlgorithms): with a calendar, only they run.
  const CALENDAR = new Set(["fixed-window", "sliding-window"]);
  const OWN_KEYS = ["limit", "period", "burst"];
  // The keys whose fields are folded under "More settings": it opens when a scenario uses one.
  const MORE_KEYS = SHARED_KEYS.filter((k) => !["traffic", "limit", "period", "burst"].includes(k));
  // Run.Level and Run.DrainMicros where the shared store was down (scenario.NoLevel).
  const NO_LEVEL = -1;

  // What each algorithm's state plot shows (see scenario.Run.Level).
  const LEVEL = {
    "fixed-window": { title: "Count in the current window", level: "counted", cap: "limit" },
    "sliding-log": { title: "Count in the last period", level: "counted", cap: "limit" },
    "sliding-window": { title: "Weighted count (previous window × overlap + current)", level: "counted", cap: "limit" },
    "token-bucket": { title: "Tokens in the bucket", level: "tokens", cap: "capacity" },
    "leaky-bucket": { title: "Requests in the queue (waiting or draining)", level: "queued", cap: "room (burst + 1)" },
  };

  const DEBOUNCE_MS = 150;
  // Live, the instants (a change, a pause, the end of what was sent) are whole tenths of a
  // second, so that the traffic reads "10/s for 8.1s", never "8.0497s".
  const LIVE_STEP_US = 100000;
  const $ = (id) => document.getElementById(id);

  // wallNow is the real clock, in ms: performance.now(), unless a test put a clock of its own in
  // window.__sluiceNow (a function returning ms).
  const wallNow = () => (typeof window.__sluiceNow === "function" ? window.__sluiceNow() : performance.now());

  const state = {
    result: null, // the last run that succeeded: the JSON of scenario.Result
    t: 0, // the virtual clock, in µs
    playing: false,
    speed: 1,
    shown: -1, // the buckets drawn (and totalled in the table) so far
    framing: false, // an animation frame is asked for
    anchorWall: 0, // the wall clock (ms) when the virtual clock was last set or started…
    anchorT: 0, // …and the virtual clock then (µs): running, t = anchorT + (wall − anchorWall) × speed
    presets: [],
    cards: new Map(), // algorithm → {el, charts, ...}
    debounce: 0,
    group: 1, // the time slices a traffic bar sums (live: several)
    barred: 0, // the time slices the bars and the summary count
    ranAt: "", // the query of the last run asked for, so that an unchanged form does not run again
    changes: [], // the scenario's changes of the limit or the burst ("t=4s,limit=8"), from a live run
    live: null, // in live mode: what has been sent and changed so far (see startLive)
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
      if (v !== "" && !el.disabled) params.set(el.name, v);
    }
    for (const c of state.changes) params.append("change", c);
    return params.toString();
  }

  function fillForm(query) {
    const params = new URLSearchParams(query);
    for (const el of scenarioInputs()) {
      el.value = params.get(el.name) ?? "";
    }
    // A select has no empty choice: an address without the key means the default.
    if (!$("store").value) $("store").value = "shared";
    if (!$("balance").value) $("balance").value = "round-robin";
    if (!$("on-error").value) $("on-error").value = "closed";
    // What the scenario sets of the folded fields is said on the fold (which stays closed, so
    // that the plots stay in the first screen); a card's own numbers open under its plots.
    for (const card of state.cards.values()) {
      if (OWN_KEYS.some((k) => params.get(`${card.alg}.${k}`))) card.el.querySelector(".own").open = true;
    }
    state.changes = params.getAll("change");
    syncCalendar();
    syncOutage();
  }

  // showMoreSet says on the fold of More settings what the scenario sets under it:
  // "More settings: instances 3 · store separate".
  function showMoreSet() {
    const set = MORE_KEYS.map((k) => $(k)).filter((el) => el.value.trim() && !el.disabled && !(el.tagName === "SELECT" && el.selectedIndex === 0))
      .map((el) => `${el.labels[0].textContent.trim().toLowerCase()} ${el.value.trim()}`);
    $("more-set").textContent = set.length ? ": " + set.join(" · ") : "";
    $("more-what").hidden = set.length > 0;
  }

  // syncOutage enables On error only with an outage: without one the store never fails, and
  // the scenario takes no failure mode.
  function syncOutage() {
    $("on-error").disabled = $("outage").value.trim() === "";
  }

  // syncCalendar enables the inputs that the calendar choice leaves meaningful: with a calendar,
  // the time zone and the two window algorithms' limits; without, the period, the burst and every
  // card's numbers. A disabled input keeps its text (for when the choice changes back) but is
  // left out of the scenario.
  function syncCalendar() {
    const calendar = $("calendar").value !== "";
    $("time-zone").disabled = !calendar;
    $("period").disabled = calendar;
    $("burst").disabled = calendar;
    for (const alg of ALGORITHMS) {
      for (const k of OWN_KEYS) {
        const el = $(`${alg}.${k}`);
        if (el) el.disabled = calendar && (!CALENDAR.has(alg) || k !== "limit");
      }
    }
    $("start").placeholder = calendar ? "2026-03-28T00:00:00 in the zone" : "1970-01-01T00:00:00Z";
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
      for (let d = (out || input) && (out || input).closest("details"); d; d = d.parentElement.closest("details")) d.open = true;
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
    showChanges();
    setStatus(`${out.requests.toLocaleString("en")} requests, decided by each algorithm in ${Math.max(1, Math.round(out.ms))} ms.`);
    const end = out.end_us;
    if (restart && !state.live) {
      // The answer first: the whole run at once (the virtual clock makes it instant); Replay
      // plays it from 0, Play live runs the policy on traffic sent as the clock goes.
      setT(end);
      setPlaying(false);
    }
    if (state.t > end) setT(end);
    if (state.t >= end && !state.live) setPlaying(false);
    updatePresets();
    updateCards();
    buildSummary();
    updateCommands();
    $("time").max = String(out.buckets);
    state.shown = -1;
    showMoreSet();
    showMarks();
    showPausedCommand();
    render();
  }

  // showChanges lists the scenario's changes (a live run's) under the policy's fields.
  function showChanges() {
    const cs = state.result.changes || [];
    $("changes").hidden = !cs.length;
    $("clear-changes").hidden = !!state.live;
    $("changes-text").textContent = "Changes while it runs: " + cs.map((c) => c.text.replaceAll(",", " ")).join(" · ");
  }

  function scheduleRun() {
    clearTimeout(state.debounce);
    state.debounce = setTimeout(() => run(), DEBOUNCE_MS);
  }


  // ---- The clock ------------------------------------------------------------------------------

  // setT sets the virtual clock (µs); a running clock goes on from there.
  function setT(t) {
    state.t = t;
    state.anchorT = t;
    state.anchorWall = wallNow();
  }

  function setPlaying(playing) {
    if (playing && !state.playing) setT(state.t);
    // Live, a pause stops the clock at a tenth of a second: the end of what was sent.
    if (!playing && state.live) setT(Math.floor(state.t / LIVE_STEP_US) * LIVE_STEP_US);
    state.playing = playing;
    const end = state.result ? state.result.end_us : 0;
    $("play").textContent = playing ? "Pause" : (state.result && state.t >= end && !state.live ? "Replay" : "Play");
    showPausedCommand();
    if (playing && !state.framing) {
      state.framing = true;
      requestAnimationFrame(frame);
    }
  }

  // frame moves the clock to where the wall clock says it is: the time since it started, times
  // the speed (not a fixed step per frame, so that 3 s of real time are 3 s at 1×, however
  // often frames come).
  function frame() {
    if (!state.playing || !state.result) {
      state.framing = false;
      return;
    }
    const t = state.anchorT + Math.round((wallNow() - state.anchorWall) * 1000 * state.speed);
    const end = state.result.end_us;
    if (state.live) {
      // Live: the clock runs on; near the horizon the run is extended ahead of it.
      state.t = t;
      if (state.t > state.live.until - ahead() / 2) liveRun(horizon());
      render();
      requestAnimationFrame(frame);
      return;
    }
    state.t = Math.min(end, t);
    if (state.t >= end) {
      state.framing = false;
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
    $("clock").textContent = state.live ? duration(Math.floor(state.t / 1000) * 1000) : `${duration(Math.floor(state.t / 1000) * 1000)} / ${duration(r.end_us)}`;
    $("clock").dataset.us = String(state.t);
    const local = $("clock-local");
    local.hidden = !r.start;
    if (r.start) {
      // The clock's time as a person reads it there (Go's, in the calendar's zone or the start's offset).
      const w = (r.windows || []).find((x) => x.start_us <= state.t && state.t < x.end_us);
      local.textContent = globalThis.sluice.instant(Math.floor(state.t / 1000) * 1000) + (w ? ` · ${r.calendar} ${w.label}` : "");
    }
    const slider = $("time");
    slider.value = String(k);
    slider.setAttribute("aria-valuetext", `${duration(k * r.width_us)} of ${duration(r.end_us)}`);
    if (state.live) showLiveTraffic();
    for (const card of state.cards.values()) policyNow(card);
    if (k === state.shown) return;
    state.shown = k;
    // A paused live run ends its traffic at the clock: all of it is before now, in the bars and
    // the summary.
    state.barred = state.live && state.live.cut ? r.buckets : k;
    for (const card of state.cards.values()) drawCard(card, k);
    updateSummary(state.barred);
  }

  // ---- Live mode ------------------------------------------------------------------------------

  // A live run is a scenario like any other: its traffic is what was sent so far (a pattern of
  // rates and bursts), its changes those of the limit and the burst, each at the instant it was
  // made (a whole tenth of a second). It runs to a horizon ahead of the clock, again whenever the
  // clock nears it (the past stays as it was: nothing later changes it). Paused, its traffic ends
  // at the clock, so that the summary is `sluice simulate`'s for that pattern and those changes,
  // number for number, and the command that says so is shown.

  // ahead is how far past the clock a running live run is simulated (µs of virtual time).
  function ahead() {
    return Math.max(10e6, state.speed * 3e6);
  }

  // snap is t (µs) down to a live instant: a whole tenth of a second.
  const snap = (t) => Math.floor(t / LIVE_STEP_US) * LIVE_STEP_US;

  // horizon is where a running live run's traffic is simulated to.
  const horizon = () => snap(state.t + ahead());

  // goDuration writes µs exactly as a Go duration: 12.3s, 0.05s.
  function goDuration(us) {
    const frac = String(us % 1e6).padStart(6, "0").replace(/0+$/, "");
    return Math.floor(us / 1e6) + (frac ? "." + frac : "") + "s";
  }

  // segment is the pattern of a rate sent from `from` to `to` (µs).
  const segment = (rate, from, to) => (rate > 0 ? `${rate}/s for ${goDuration(to - from)}` : `idle ${goDuration(to - from)}`);

  // closeSegment ends the rate sent since live.from at t (µs).
  function closeSegment(t) {
    const L = state.live;
    if (t > L.from) L.segs.push(segment(L.rate, L.from, t));
    L.from = t;
  }

  // liveTraffic is the pattern of what is sent up to until (µs).
  function liveTraffic(until) {
    const L = state.live;
    const segs = L.segs.slice();
    if (until > L.from) segs.push(segment(L.rate, L.from, until));
    return segs.join("; ");
  }

  // showLiveTraffic writes in the traffic field what has been sent up to the clock (not the
  // horizon the run is simulated to): "10/s for 8.1s; 20 at once; 4/s for 2s".
  function showLiveTraffic() {
    const text = liveTraffic(snap(state.t)) || `${state.live.rate}/s`;
    if ($("traffic").value !== text) $("traffic").value = text;
  }

  // liveRun runs the live scenario with its traffic up to until (µs): cut there if it is the
  // clock (paused), else to a horizon. It returns whether the run succeeded.
  function liveRun(until) {
    const L = state.live;
    const params = new URLSearchParams(L.base);
    params.set("traffic", liveTraffic(until));
    for (const c of L.changes) params.append("change", changeText(c));
    const out = simulate(params.toString());
    if (out.errors) {
      apply(out);
      return false;
    }
    L.until = until;
    L.cut = until === state.t && state.t > 0;
    state.ranAt = out.query;
    apply(out);
    showLiveTraffic();
    return true;
  }

  function changeText(c) {
    return `t=${goDuration(c.t)}` + (c.limit ? `,limit=${c.limit}` : "") + (c.burst ? `,burst=${c.burst}` : "");
  }

  // liveAgain runs the live scenario after something was sent or changed: to the clock if paused.
  function liveAgain() {
    return liveRun(state.playing || state.t === 0 ? horizon() : state.t);
  }

  // mark notes what was done live at t (µs), for the plots' numbered marks.
  function mark(t, text) {
    const L = state.live;
    const last = L.marks[L.marks.length - 1];
    if (last && last.t_us === t) last.text += ", " + text;
    else L.marks.push({ t_us: t, text });
  }

  // liveChange takes in the rate, the limit and the burst as they are in their fields: what
  // differs from what runs applies from now on (the clock's tenth of a second).
  function liveChange() {
    const L = state.live;
    const t = snap(state.t);
    clearErrors();
    const rate = $("live-rate").value.trim();
    const limit = $("limit").value.trim();
    const burst = $("burst").value.trim() || "0";
    const bad = [];
    if (!/^\d+(\.\d{1,3})?$/.test(rate)) bad.push({ field: "live-rate", message: "a rate a second, with up to 3 decimals (0.5, 10)" });
    if (!/^[1-9]\d*$/.test(limit)) bad.push({ field: "limit", message: "a whole number > 0" });
    if (!/^\d+$/.test(burst)) bad.push({ field: "burst", message: "a whole number ≥ 0" });
    if (bad.length) {
      showErrors(bad);
      return;
    }
    const kept = JSON.stringify({ segs: L.segs, from: L.from, rate: L.rate, changes: L.changes, limit: L.limit, burst: L.burst, marks: L.marks });
    const c = { t };
    if (limit !== L.limit) c.limit = limit;
    if (burst !== L.burst) c.burst = burst;
    if (c.limit || c.burst) {
      const last = L.changes[L.changes.length - 1];
      if (last && last.t === t) Object.assign(last, c);
      else L.changes.push(c);
    } else if (Number(rate) === L.rate) {
      return;
    }
    if (c.limit) mark(t, `limit ${c.limit}`);
    if (c.burst) mark(t, `burst ${c.burst}`);
    if (Number(rate) !== L.rate) {
      closeSegment(t);
      L.rate = Number(rate);
      mark(t, `traffic ${L.rate}/s`);
    }
    L.limit = limit;
    L.burst = burst;
    // A change the policy cannot take (a burst that takes centuries to drain) is not made.
    if (!liveAgain()) Object.assign(L, JSON.parse(kept));
  }

  // startLive starts a live run of the form's policy and settings, from 0, at the rate in its
  // field, with the clock running.
  function startLive() {
    const rate = $("live-rate").value.trim();
    const base = new URLSearchParams(formQuery());
    base.delete("traffic");
    base.delete("change");
    const inputs = scenarioInputs().filter((el) => el.id !== "limit" && el.id !== "burst" && !el.disabled);
    state.live = { base: base.toString(), rate: /^\d+(\.\d{1,3})?$/.test(rate) ? Number(rate) : 10, segs: [], from: 0, changes: [],
      limit: $("limit").value.trim(), burst: $("burst").value.trim() || "0", until: 0, cut: false, inputs, marks: [],
      traffic: $("traffic").value };
    for (const el of inputs) el.disabled = true;
    $("live-rate").value = String(state.live.rate);
    $("live-bar").hidden = false;
    $("live").setAttribute("aria-pressed", "true");
    $("live").textContent = "Leave live";
    for (const id of ["restart", "end", "time"]) $(id).disabled = true;
    setT(0);
    setPlaying(true);
    liveAgain();
    render();
  }

  // stopLive leaves live mode: what was sent and changed stays, as a scenario to replay.
  function stopLive() {
    const L = state.live;
    // What happened up to now, not the horizon run ahead of it.
    if (state.playing && state.t > 0) {
      setPlaying(false);
      liveRun(state.t);
    }
    state.live = null;
    for (const el of L.inputs) el.disabled = false;
    $("live-bar").hidden = true;
    $("live").setAttribute("aria-pressed", "false");
    $("live").textContent = "Play live";
    for (const id of ["restart", "end", "time"]) $(id).disabled = false;
    fillForm(state.result.query);
    setPlaying(false);
    run({ force: true });
  }

  // showPausedCommand shows, while a live run is paused, the `sluice simulate` command that
  // prints its summary: in the clock's panel, not folded, with a button to copy it.
  function showPausedCommand() {
    const box = $("paused-command");
    const L = state.live;
    const show = !!(L && !state.playing && L.cut && state.result);
    if (show) {
      $("paused-cmd").textContent = state.result.commands.join("\n");
      $("copy-command-status").textContent = "";
    }
    if (box.hidden === !show) return;
    box.hidden = !show;
    if (show) box.scrollIntoView({ block: "nearest" });
  }

  async function copyCommand() {
    const status = $("copy-command-status");
    try {
      await navigator.clipboard.writeText($("paused-cmd").textContent);
      status.textContent = "Copied.";
    } catch {
      // No clipboard (an address that is not https, say): select it for the person to copy.
      getSelection().selectAllChildren($("paused-cmd"));
      status.textContent = "Selected: copy it with the keyboard.";
    }
  }

  // marks are what the plots mark with a numbered line: live, everything done (rate, burst
  // sent, limit, burst); else the scenario's changes.
  function marks() {
    if (state.live) return state.live.marks;
    const cs = (state.result && state.result.changes) || [];
    return cs.map((c) => ({ t_us: c.t_us, text: c.text.replace(/^t=[^,]*,/, "").replaceAll("=", " ").replaceAll(",", ", ") }));
  }

  // showMarks lists the marks under the plots, numbered as on them (the text that the numbers
  // stand for, for screen readers too).
  function showMarks() {
    const ms = marks();
    const list = $("marks-list");
    list.hidden = !ms.length;
    const text = "Marked on the plots: " + ms.map((m, i) => `${i + 1} at ${duration(m.t_us)}: ${m.text}`).join(" · ");
    if (list.textContent !== text) list.textContent = text;
  }

  // ---- Cards and charts -----------------------------------------------------------------------

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  // The x axis's steps, in seconds: round durations, so that its ticks read 6h, 12h, 1d... not 27h46m40s.
  const TIME_STEPS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800,
    3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800, 1209600, 2592000, 7776000, 15552000, 31536000, 315360000, 3153600000];
  const counts = [1, 2, 5, 10, 20, 25, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7, 1e8, 1e9, 1e10, 1e12, 1e14, 1e16];

  // drawWindows marks the calendar windows' starts (local midnights) on a chart: a dashed line at
  // each, and, where there is room, its label ("Sun 2026-03-29, 23h") — so that a 23-hour day shows.
  function drawWindows(u, labels) {
    const r = state.result;
    if (!r || !r.windows || !r.windows.length) return;
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    const px = (us) => u.valToPos(us / 1e6, "x", true);
    const room = r.windows.length > 1 ? px(r.windows[1].start_us) - px(r.windows[0].start_us) : width;
    ctx.save();
    ctx.strokeStyle = cssVar("--muted");
    ctx.fillStyle = cssVar("--muted");
    ctx.lineWidth = Math.max(1, devicePixelRatio);
    ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
    ctx.font = `${10 * devicePixelRatio}px system-ui, sans-serif`;
    ctx.textBaseline = "top";
    for (const w of r.windows) {
      const x = px(w.start_us);
      if (w.start_us > 0 && x <= left + width) {
        ctx.beginPath();
        ctx.moveTo(x, top);
        ctx.lineTo(x, top + height);
        ctx.stroke();
      }
      if (labels) {
        // The long label where it fits, else the short one over its length ("Sun 29", "23h").
        const lx = Math.max(left, x) + 3 * devicePixelRatio;
        const fits = (t) => ctx.measureText(t).width + 6 * devicePixelRatio < room;
        if (lx >= left + width) continue;
        if (fits(w.label)) {
          ctx.fillText(w.label, lx, top + 2 * devicePixelRatio);
        } else if (fits(w.short) && fits(w.length)) {
          ctx.fillText(w.short, lx, top + 2 * devicePixelRatio);
          ctx.fillText(w.length, lx, top + 14 * devicePixelRatio);
        }
      }
    }
    ctx.restore();
  }

  // drawChanges draws a line at each mark (a change, or live what was done) on a chart; on the
  // traffic chart a numbered badge above the plot stands for it (the text is in the list under
  // the plots, and the badge's tooltip), so that no label covers the data.
  function drawChanges(u, badges) {
    const ms = marks();
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    ctx.save();
    ctx.strokeStyle = cssVar("--accent");
    ctx.lineWidth = 2 * devicePixelRatio;
    for (const m of ms) {
      const x = u.valToPos(m.t_us / 1e6, "x", true);
      if (x < left || x > left + width) continue;
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
    }
    ctx.restore();
    if (badges) placeBadges(u, ms);
  }

  // placeBadges puts the marks' numbered badges in the strip above a traffic chart, each over its
  // line, moved right of the one before if they would touch, and on a second row if the first
  // is full.
  function placeBadges(u, ms) {
    const strip = u.root.parentElement.previousElementSibling;
    if (!strip || !strip.classList.contains("marks")) return;
    const plotLeft = u.over.offsetLeft;
    const plotWidth = u.over.clientWidth;
    const badges = [];
    ms.forEach((m, i) => {
      const x = u.valToPos(m.t_us / 1e6, "x");
      if (x < 0 || x > plotWidth) return;
      badges.push({ n: i + 1, x: plotLeft + x, text: `${duration(m.t_us)}: ${m.text}` });
    });
    const key = badges.map((b) => `${b.n}@${Math.round(b.x)}`).join(" ");
    if (strip.dataset.key === key) return;
    strip.dataset.key = key;
    strip.replaceChildren();
    const W = 16; // a badge's width and height, px (style.css: .mark)
    const gap = 2;
    const ends = []; // each row's right end so far
    for (const b of badges) {
      let left = Math.max(0, b.x - W / 2);
      let row = ends.findIndex((end) => left >= end + gap);
      if (row < 0) {
        row = ends.findIndex((end) => end + gap + W <= strip.clientWidth);
        if (row < 0) row = ends.length;
        left = Math.max(left, row < ends.length ? ends[row] + gap : 0);
        if (row === ends.length) ends.push(0);
      }
      ends[row] = left + W;
      const span = document.createElement("span");
      span.className = "mark";
      span.textContent = String(b.n);
      span.title = b.text;
      span.style.left = `${left}px`;
      span.style.top = `${row * (W + gap)}px`;
      strip.append(span);
    }
    strip.style.height = `${ends.length * (W + gap)}px`;
  }

  // xRange is the plots' time axis, in s: the whole run, or live the last stretch up to the clock
  // (a window's worth of periods, at least 20 s), so that the plots slide as the clock runs.
  function xRange() {
    const r = state.result;
    if (!r) return [0, 1];
    if (!state.live) return [0, r.end_us / 1e6];
    const period = Math.max(...r.runs.map((run) => Number(run.policy.period_ms) || 0)) * 1000;
    const span = Math.max(20e6, 6 * period);
    const right = Math.max(state.t, span * 0.9) + span * 0.1;
    return [(right - span) / 1e6, right / 1e6];
  }

  // ySize fits the y axis to its longest label, so that none runs into the plot.
  const ySize = (u, values) => 14 + 7 * Math.max(1, ...(values || []).map((v) => String(v).length));

  // CHART_HEIGHTS are the plots' heights (requests, state, queue delay), px: small multiples, so
  // that all five algorithms' fit in the first screen; smaller on a phone.
  const CHART_HEIGHTS = { traffic: [100, 52], level: [74, 52], delay: [66, 52] };
  const chartHeight = (name) => CHART_HEIGHTS[name][innerWidth < 600 ? 1 : 0];

  // baseOptions are a chart's options: x over xRange, y from 0 to card.ymax[name].
  function baseOptions(card, name) {
    const grid = { stroke: cssVar("--grid"), width: 1 };
    const axis = { stroke: cssVar("--muted"), grid, ticks: { ...grid, size: 4 }, font: "11px system-ui, sans-serif", gap: 3 };
    return {
      width: Math.max(80, card.chartWidth(name)),
      height: chartHeight(name),
      hooks: { draw: [(u) => { drawWindows(u, name === "traffic"); drawChanges(u, name === "traffic"); }] },
      cursor: { sync: { key: "sluice" }, drag: { x: false, y: false } },
      legend: { live: true },
      scales: {
        x: { time: false, range: xRange },
        // Room above the bars for the calendar windows' labels.
        y: { range: () => [0, Math.max(1, card.ymax[name] || 1) * (name === "traffic" && state.result &&
          state.result.windows && state.result.windows.length ? 1.5 : 1.08)] },
      },
      axes: [
        { ...axis, size: 22, values: (u, splits) => splits.map((s) => duration(s * 1e6)), space: 56, incrs: TIME_STEPS },
        { ...axis, size: ySize, space: 18, incrs: counts, values: (u, splits) => splits.map((s) => s.toLocaleString("en")) },
      ],
    };
  }

  // timeSeries is the legend's time: the hovered slice's start, or with none hovered the span
  // shown so far.
  function timeSeries() {
    return { label: "t", value: (u, v) => (v == null ? `0–${duration(Math.floor(state.t / 1000) * 1000)}` : duration(v * 1e6)) };
  }

  // now is the series' value at the clock (a sampled series at its last boundary), shown in a
  // legend when nothing is hovered.
  function atClock(card, key, scale = 1) {
    return (u, v, si, i) => {
      const a = card.raw && card.raw[key];
      const x = i == null ? (a ? a[Math.max(0, state.shown)] : null) : v;
      return x == null || x === NO_LEVEL ? "–" : trim(x / scale);
    };
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
    card.chartWidth = (name) => el.querySelector(`.${name}-chart`).clientWidth;

    const bars = uPlot.paths.bars({ align: 1, size: [1, Infinity, 1] });
    // The hovered bar's count, or with none hovered the total so far.
    const rawValue = (key) => (u, v, si, i) => {
      const a = card.raw && card.raw[key];
      const from = i == null ? 0 : i * state.group;
      if (!a || from >= state.barred) return "–";
      const to = i == null ? state.barred : Math.min(state.barred, from + state.group);
      return a.slice(from, to).reduce((x, y) => x + y, 0).toLocaleString("en");
    };
    card.traffic = new uPlot({
      ...baseOptions(card, "traffic"),
      series: [
        timeSeries(),
        { label: "refused", fill: cssVar("--refused"), stroke: cssVar("--refused"), width: 0, paths: bars, points: { show: false }, value: rawValue("refused") },
        { label: "allowed", fill: cssVar("--allowed"), stroke: cssVar("--allowed"), width: 0, paths: bars, points: { show: false }, value: rawValue("allowed") },
        // Only the leaky bucket delays.
        ...(alg === "leaky-bucket" ? [{ label: "delayed", fill: cssVar("--delayed"), stroke: cssVar("--delayed"), width: 0, paths: bars, points: { show: false },
          value: rawValue("delayed") }] : []),
      ],
    }, alg === "leaky-bucket" ? [[], [], [], []] : [[], [], []], el.querySelector(".traffic-chart"));
    card.charts.push(card.traffic);

    card.level = new uPlot({
      ...baseOptions(card, "level"),
      series: [
        timeSeries(),
        { label: LEVEL[alg].level, stroke: cssVar("--level"), width: 2, fill: cssVar("--level-fill"), points: { show: false }, value: atClock(card, "level") },
        { label: LEVEL[alg].cap, stroke: cssVar("--muted"), width: 1, dash: [4, 4], points: { show: false }, value: atClock(card, "ceiling") },
      ],
    }, [[], [], []], el.querySelector(".level-chart"));
    card.charts.push(card.level);

    if (alg === "leaky-bucket") {
      const delay = baseOptions(card, "delay");
      delay.axes[1].incrs = undefined;
      card.delay = new uPlot({
        ...delay,
        series: [
          timeSeries(),
          { label: "wait now", stroke: cssVar("--delayed"), width: 2, points: { show: false }, value: atClock(card, "drain_us", 1000) },
          { label: "longest wait", stroke: cssVar("--muted"), width: 0, paths: () => null,
            value: (u, v, si, i) => trim((i == null ? Math.max(0, ...(card.maxDelayMs || []).slice(0, state.barred)) : v) || 0),
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
    // Live, a bar is of several time slices, so that steady traffic reads as a rate over the
    // plot's stretch, not as stripes of 1 and 0.
    const [from, to] = xRange();
    state.group = state.live ? [1, 2, 5, 10, 20, 50, 100].find((g) => g * r.width_us * 60 >= (to - from) * 1e6) || 100 : 1;
    const xg = Array.from({ length: Math.ceil(r.buckets / state.group) + 1 }, (_, i) => i * state.group * w);
    const shared = { limit: $("limit").value.trim(), period: $("period").value.trim(), burst: $("burst").value.trim() };
    const ran = new Set(r.runs.map((run) => run.algorithm));
    for (const card of state.cards.values()) {
      // With a calendar, the three algorithms that have none do not run: their cards say so.
      const off = !ran.has(card.alg);
      card.el.classList.toggle("off", off);
      const note = card.el.querySelector(".no-calendar");
      note.hidden = !off;
      note.textContent = off ? `${card.alg} has no calendar: it counts by a period only. With a calendar, ` +
        "fixed-window and sliding-window run, as sluice simulate --compare --calendar does." : "";
      card.el.querySelector(".balance").hidden = off || !r.actual;
      // With several clients, each has its own state: the plot is the first one's.
      card.el.querySelector(".level-title").textContent = LEVEL[card.alg].title + (r.actual ? " (after each settlement)" : "") +
        (r.clients ? ` — client ${r.clients[0]}` : "");
      if (off) {
        card.raw = null;
        card.el.querySelector(".description").textContent = "";
        card.el.querySelector(".policy-now").textContent = "";
        card.el.querySelector(".figures").textContent = "";
      }
    }
    r.runs.forEach((run) => {
      const card = state.cards.get(run.algorithm);
      card.raw = run;
      card.x = x;
      card.xg = xg;
      // policyNow writes the description and the numbers of the policy at the clock.
      for (const key of OWN_KEYS) {
        const input = $(`${run.algorithm}.${key}`);
        if (input) input.placeholder = shared[key] || (key === "burst" ? "0" : "");
      }
      card.ymax.traffic = Math.max(1, ...group(run.offered, r.buckets, xg.length));
      card.ymax.level = Math.max(...run.ceiling, ...run.level);
      card.el.querySelector(".traffic-title").textContent = `Requests per ${duration(r.width_us * state.group)}`;
      if (card.delay) {
        card.delayMs = run.drain_us.map((us) => (us === NO_LEVEL ? null : us / 1000));
        card.maxDelayMs = run.max_delay_us.map((us, i) => (run.delayed[i] ? us / 1000 : null));
        card.ymax.delay = Math.max(1, ...card.delayMs.filter((v) => v != null), ...card.maxDelayMs.filter((v) => v != null));
      }
    });
  }

  // policyNow writes on a card the policy that runs at the clock: its numbers ("limit 9 per 1s ·
  // burst 10") and its description, from the run's policy and, after a change (live, say), the
  // phase it began (scenario.Result.JSON's "phases").
  function policyNow(card) {
    const run = card.raw;
    if (!run) return;
    let p = { ...run.policy, description: run.description };
    for (const ph of run.phases || []) {
      if (ph.t_us <= state.t) p = { ...p, ...ph };
    }
    const per = p.calendar ? `a ${p.calendar} (${p.time_zone})` : duration(Number(p.period_ms) * 1000);
    const text = `limit ${p.limit.toLocaleString("en")} per ${per}` + (TAKES_BURST.has(run.algorithm) ? ` · burst ${p.burst.toLocaleString("en")}` : "");
    const el = card.el.querySelector(".policy-now");
    if (el.textContent !== text) el.textContent = text;
    const d = card.el.querySelector(".description");
    if (d.textContent !== p.description) d.textContent = p.description;
  }

  // reveal returns the first n values of a, then nulls up to length.
  function reveal(a, n, length) {
    const out = new Array(length);
    for (let i = 0; i < length; i++) out[i] = i < n ? a[i] : null;
    return out;
  }

  // group sums the first k values of a by state.group (a bar per so many time slices), then
  // nulls up to length.
  function group(a, k, length) {
    const out = new Array(length).fill(null);
    for (let i = 0; i < k; i++) out[Math.floor(i / state.group)] += a[i];
    return out;
  }

  function drawCard(card, k) {
    const run = card.raw;
    if (!run) return;
    const n = card.x.length; // buckets + 1: the series per bucket have a null at the end
    const bars = (a) => group(a, state.barred, card.xg.length);
    const traffic = [card.xg, bars(run.offered), bars(run.allowed)];
    if (card.delay) traffic.push(bars(run.delayed));
    card.traffic.setData(traffic);
    // A gap where the shared store was down (scenario.NoLevel): there was no state to read.
    card.level.setData([card.x, reveal(run.level, k + 1, n).map((v) => (v === NO_LEVEL ? null : v)), run.ceiling]);
    if (state.result.actual) {
      // The balance the settlements leave: what could still pass now (the token bucket's tokens,
      // else the room under the ceiling); 0 while the client is in debt.
      const level = run.level[k];
      const balance = run.algorithm === "token-bucket" ? level : run.capacity - level;
      card.el.querySelector(".balance").textContent =
        `Balance after settlement at ${duration(k * state.result.width_us)}: ${balance.toLocaleString("en")} of ${run.capacity.toLocaleString("en")}`;
    }
    if (card.delay) {
      card.delay.setData([card.x, reveal(card.delayMs, k + 1, n), reveal(card.maxDelayMs, k, n)]);
    }
  }

  function resizeCharts() {
    for (const card of state.cards.values()) {
      card.charts.forEach((u, i) => {
        const name = ["traffic", "level", "delay"][i];
        const width = Math.max(80, card.chartWidth(name));
        const height = chartHeight(name);
        if (u.width !== width || u.height !== height) u.setSize({ width, height });
      });
    }
  }

  // ---- Summary, commands, presets -------------------------------------------------------------

  const FIELDS = ["offered", "allowed", "percent", "refused", "delayed", "never", "offered_cost", "allowed_cost", "max_delay_ms", "total_delay_ms",
    "settled", "settled_cost", "actual_cost", "fallback.open", "fallback.local", "fallback.closed", "max_latency_ms", "total_latency_ms"];
  const SETTLED_FIELDS = new Set(["settled", "settled_cost", "actual_cost"]);
  const OUTAGE_FIELDS = new Set(["fallback.open", "fallback.local", "fallback.closed"]);
  const LATENCY_FIELDS = new Set(["max_latency_ms", "total_latency_ms"]);

  // field reads a summary's field: "fallback.open" is s.fallback.open (the JSON leaves the
  // object out until a request was decided without the store). undefined if the JSON has none.
  function field(s, f) {
    const [a, b] = f.split(".");
    return b ? (s[a] ? s[a][b] : undefined) : s[a];
  }

  // buildSummary makes a row for each algorithm that ran, in the run's order.
  function buildSummary() {
    const r = state.result;
    const body = $("summary").tBodies[0];
    body.replaceChildren();
    for (const run of r.runs) {
      const tr = document.createElement("tr");
      tr.dataset.algorithm = run.algorithm;
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = run.algorithm;
      tr.append(th);
      for (const f of FIELDS) {
        const td = document.createElement("td");
        if (f === "percent") td.className = "derived";
        else td.dataset.col = f;
        if (SETTLED_FIELDS.has(f)) td.classList.add("settled-col");
        if (OUTAGE_FIELDS.has(f)) td.classList.add("outage-col");
        if (LATENCY_FIELDS.has(f)) td.classList.add("latency-col");
        tr.append(td);
      }
      // What each instance of a fleet let through (not a summary field: data-instances, not data-field).
      const fleet = document.createElement("td");
      fleet.className = "fleet-col";
      tr.append(fleet);
      body.append(tr);
    }
    $("summary").classList.toggle("settled", !!r.actual);
    $("summary").classList.toggle("fleet", !!r.instances);
    $("summary").classList.toggle("outage", !!r.outage);
    $("summary").classList.toggle("latency", !!r.store_latency_us);
    buildClients();
  }

  // buildClients makes, when the traffic names clients, a row per algorithm and client.
  function buildClients() {
    const r = state.result;
    const body = $("clients").tBodies[0];
    body.replaceChildren();
    $("clients-box").hidden = !r.clients;
    $("clients").classList.toggle("fleet", !!r.instances);
    for (const card of state.cards.values()) card.el.querySelector(".clients").hidden = !r.clients;
    if (!r.clients) return;
    for (const run of r.runs) {
      for (const key of r.clients) {
        const tr = document.createElement("tr");
        tr.dataset.algorithm = run.algorithm;
        tr.dataset.client = key;
        for (const text of [run.algorithm, key]) {
          const th = document.createElement("th");
          th.scope = "row";
          th.textContent = text;
          tr.append(th);
        }
        for (const f of ["offered", "allowed", "percent", "refused", "instances"]) {
          const td = document.createElement("td");
          if (f === "percent") td.className = "derived";
          else if (f === "instances") td.className = "fleet-col";
          else td.dataset.field = f;
          tr.append(td);
        }
        body.append(tr);
      }
    }
  }

  // percentAllowed is the derived "allowed %" of a summary or a client's counts.
  function percentAllowed(c) {
    return c.offered ? (100 * c.allowed / c.offered).toFixed(1) + "%" : "–";
  }

  // showInstances writes what each instance let through into a fleet-col cell: "1: 106 · 2: 107"
  // (data-instances "106,107"), "–" with one instance.
  function showInstances(td, counts) {
    td.dataset.instances = counts.join(",");
    td.textContent = counts.length ? counts.map((n, j) => `${j + 1}: ${n}`).join(" · ") : "–";
  }

  // updateClients fills the per-client table and each card's line with the first k buckets'
  // counts: what each client got, in all and per instance.
  function updateClients(k) {
    const r = state.result;
    if (!r.clients) return;
    const all = JSON.parse(globalThis.sluice.clients(k));
    const rows = $("clients").tBodies[0].rows;
    let i = 0;
    r.runs.forEach((run, j) => {
      for (const c of all[j]) {
        for (const td of rows[i].cells) {
          if (td.tagName !== "TD") continue;
          if (td.dataset.field) td.textContent = String(c[td.dataset.field]);
          else if (td.classList.contains("derived")) td.textContent = percentAllowed(c);
          else showInstances(td, c.instances);
        }
        i++;
      }
      const card = state.cards.get(run.algorithm);
      if (card) {
        card.el.querySelector(".clients").textContent = "Let through: " +
          all[j].map((c) => `${c.key} ${c.allowed.toLocaleString("en")} of ${c.offered.toLocaleString("en")}`).join(" · ");
      }
    });
    const table = $("clients");
    table.dataset.complete = String(k === r.buckets);
    table.dataset.query = r.query;
    $("clients-caption").textContent = "Per client: what each one got — each client has its own quota" +
      (r.instances ? "; allowed per instance is what each instance passed to the backend for it" : "");
  }

  function updateSummary(k) {
    const r = state.result;
    // The summaries come from Go (sim.Summary's JSON, as `sluice simulate --format json` writes it);
    // their numbers are written back as JSON wrote them, so the text is the command's. A field the
    // JSON leaves out (the settled totals, before anything was settled) shows as "–".
    const sums = JSON.parse(globalThis.sluice.summaries(k));
    const perInstance = r.instances ? JSON.parse(globalThis.sluice.instances(k)) : [];
    const rows = $("summary").tBodies[0].rows;
    r.runs.forEach((run, i) => {
      const s = sums[i];
      // The card's own line of the summary: what a phone shows first.
      const card = state.cards.get(run.algorithm);
      if (card) {
        const n = (x) => Number(x).toLocaleString("en");
        card.el.querySelector(".figures").textContent = `${n(s.allowed)} of ${n(s.offered)} allowed · ${n(s.refused)} refused` +
          (run.algorithm === "leaky-bucket" ? ` · ${n(s.delayed)} delayed` : "");
      }
      for (const td of rows[i].cells) {
        if (td.tagName !== "TD") continue;
        if (td.classList.contains("fleet-col")) {
          showInstances(td, perInstance[i] || []);
        } else if (td.classList.contains("derived")) {
          td.textContent = percentAllowed(s);
        } else if (field(s, td.dataset.col) !== undefined) {
          td.dataset.field = td.dataset.col;
          td.textContent = String(field(s, td.dataset.col));
        } else {
          delete td.dataset.field;
          td.textContent = "–";
        }
      }
    });
    const table = $("summary");
    const complete = k === r.buckets;
    table.dataset.complete = String(complete);
    table.dataset.query = r.query;
    $("summary-caption").textContent = (complete
      ? `Totals of the whole run: ${r.requests.toLocaleString("en")} requests`
      : `Totals of the requests before ${duration(k * r.width_us)} (the clock's end: ${duration(r.end_us)})`) +
      (r.actual ? `; settled: the approved requests, each charged 1 up front (estimated) and settled at its real cost, ${r.actual} (actual)` : "") +
      (r.instances ? `; ${r.instances} instances${r.balance === "random" ? " (balanced at random, draw " + r.draw + ")" : ""}, ` +
        `${r.store === "separate" ? "each with its own store" : "sharing one store"}: allowed is what all of them passed to the backend` : "") +
      (r.store_latency_us ? `; each call to the store takes ${duration(r.store_latency_us)} (wait: how much later the requests reach the backend)` : "") +
      (r.outage ? `; the store is down from ${duration(r.outage.from_us)} to ${duration(r.outage.to_us)}, the instances failing ${r.outage.on_error} (store down: the requests decided so)` : "");
    updateClients(k);
  }

  function updateCommands() {
    const r = state.result;
    $("commands").textContent = r.commands.map((c) => c + " --format json").join("\n");
    $("trace-note").hidden = !r.commands.some((c) => c.includes("--trace"));
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
      if (state.live) return; // live, a number applies when it is entered (liveChange)
      if (names.has(e.target.name) && e.target.form && e.target.form.id === "scenario") {
        if (e.target.id === "calendar") syncCalendar();
        if (e.target.id === "outage") syncOutage();
        scheduleRun();
      }
    });
    $("scenario").addEventListener("submit", (e) => {
      e.preventDefault();
      if (state.live) liveChange();
      else run();
    });
    // Live, the rate, the limit and the burst apply when entered: Enter, or leaving the field.
    for (const id of ["live-rate", "limit", "burst"]) {
      $(id).addEventListener("change", () => { if (state.live) liveChange(); });
      $(id).addEventListener("keydown", (e) => {
        if (e.key === "Enter" && state.live) {
          e.preventDefault();
          liveChange();
        }
      });
    }
    $("live").addEventListener("click", () => {
      if (!state.result) return;
      if (state.live) stopLive();
      else startLive();
    });
    $("live-send").addEventListener("click", () => {
      const L = state.live;
      if (!L) return;
      const kept = JSON.stringify({ segs: L.segs, from: L.from, marks: L.marks });
      const t = snap(state.t);
      closeSegment(t);
      L.segs.push("20 at once");
      mark(t, "20 at once");
      if (!liveAgain()) Object.assign(L, JSON.parse(kept));
    });
    $("clear-changes").addEventListener("click", () => {
      state.changes = [];
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
    $("new-draw").addEventListener("click", () => {
      $("draw").value = String(Math.floor(Math.random() * 1e9));
      if (!$("jitter").value.trim() || $("jitter").value.trim() === "0") $("jitter").value = "50ms";
      run();
    });

    $("play").addEventListener("click", () => {
      if (!state.result) return;
      if (!state.playing && state.t >= state.result.end_us && !state.live) setT(0);
      setPlaying(!state.playing);
      // Live: paused, the traffic ends at the clock; running, it goes on ahead of it.
      if (state.live) liveAgain();
      render();
    });
    $("step").addEventListener("click", () => {
      if (!state.result) return;
      const next = (buckets() + 1) * state.result.width_us;
      setPlaying(false);
      // Live, a step goes to the next tenth of a second on or after the next time slice.
      setT(state.live ? Math.ceil(next / LIVE_STEP_US) * LIVE_STEP_US : Math.min(state.result.end_us, next));
      if (state.live) liveAgain();
      render();
    });
    $("restart").addEventListener("click", () => {
      if (!state.result) return;
      setT(0);
      setPlaying(true);
      render();
    });
    $("end").addEventListener("click", () => {
      if (!state.result) return;
      setT(state.result.end_us);
      setPlaying(false);
      render();
    });
    $("time").addEventListener("input", (e) => {
      if (!state.result) return;
      setT(Number(e.target.value) * state.result.width_us);
      setPlaying(false);
      render();
    });
    for (const radio of document.querySelectorAll("input[name=speed]")) {
      radio.addEventListener("change", () => {
        setT(state.t); // the clock goes on from here at the new speed
        state.speed = Number(radio.value);
      });
    }
    $("trace-link").addEventListener("click", downloadTrace);
    $("copy-link").addEventListener("click", copyLink);
    $("copy-command").addEventListener("click", copyCommand);

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
    wire();

    // The address's scenario (a bare address: the first preset, as Go's scenario.Parse decides).
    const out = simulate(location.search);
    fillForm(out.errors ? location.search : out.query);
    state.ranAt = formQuery();
    apply(out, { restart: true });
  }

  main();
})();
