// The operator page: polls ../v1/stats every second and shows it. No framework, no state but the
// last answer.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const fmt = (x) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));
  const when = (t) => (t ? new Date(t).toLocaleTimeString() : "—");

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function render(st) {
    $("config").textContent = st.config;
    const store = $("store");
    store.replaceChildren();
    const items = [
      ["store", st.store.type],
      ["reachable", st.store.reachable ? "yes" : "no: " + (st.store.error || "")],
      ["breaker", st.store.breaker_open ? "open (failure mode decides)" : "closed"],
      ["on error", st.store.on_error],
      ["store errors (503)", String(st.store.errors)],
      ["fallback decisions", String(st.store.fallbacks)],
      ["uptime", Math.floor(st.uptime_s) + " s"],
    ];
    for (const [k, v] of items) {
      const div = document.createElement("div");
      const dt = document.createElement("dt");
      const dd = document.createElement("dd");
      dt.textContent = k;
      dd.textContent = v;
      if ((k === "reachable" && !st.store.reachable) || (k === "breaker" && st.store.breaker_open)) dd.className = "badge limited";
      div.append(dt, dd);
      store.appendChild(div);
    }
    $("rates-note").textContent = "rates per second over the last " + st.rate_s + " s; totals since the start";

    const limited = st.clients.filter((c) => c.limited);
    const ul = $("limited");
    ul.replaceChildren();
    if (limited.length === 0) {
      const li = document.createElement("li");
      li.className = "muted";
      li.textContent = "nobody";
      ul.appendChild(li);
    }
    for (const c of limited) {
      const li = document.createElement("li");
      li.dataset.client = c.client;
      li.textContent = c.client + ": " + fmt(c.refused_per_s) + " refused/s, " + c.early_retries +
        " early retries; last refused " + when(c.last_refused) + ", told to wait until " + when(c.retry_after_ends);
      ul.appendChild(li);
    }

    const tbody = $("clients").tBodies[0];
    tbody.replaceChildren();
    if (st.clients.length === 0) {
      const tr = tbody.insertRow();
      const td = cell(tr, "no requests yet", "muted");
      td.colSpan = 11;
    }
    for (const c of st.clients) {
      const tr = tbody.insertRow();
      tr.dataset.client = c.client;
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = c.client;
      tr.appendChild(th);
      const badge = document.createElement("span");
      badge.className = "badge " + (c.limited ? "limited" : "ok");
      badge.textContent = c.limited ? "limited" : "ok";
      cell(tr, "").appendChild(badge);
      cell(tr, fmt(c.allowed_per_s), "n");
      cell(tr, fmt(c.refused_per_s), "n");
      cell(tr, fmt(c.delayed_per_s), "n");
      cell(tr, String(c.allowed), "n");
      cell(tr, String(c.refused), "n");
      cell(tr, String(c.delayed), "n");
      cell(tr, String(c.early_retries), "n");
      cell(tr, String(c.abandoned), "n");
      cell(tr, when(c.retry_after_ends));
    }
    document.body.dataset.updated = st.time;
  }

  async function poll() {
    try {
      const r = await fetch("../v1/stats", { cache: "no-store" });
      if (!r.ok) throw new Error("GET /v1/stats: " + r.status);
      render(await r.json());
      $("error").hidden = true;
    } catch (e) {
      $("error").textContent = "cannot read the gateway's stats (" + e.message + "); retrying";
      $("error").hidden = false;
    }
    setTimeout(poll, 1000);
  }
  poll();
})();
