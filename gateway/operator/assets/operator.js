// The operator page: reads ../v1/history (the last hour, for the charts), then polls ../v1/stats
// every second and shows it. No framework, no state but the last answer and the charts' points.
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

  // rowHead adds the row's name, its header cell.
  function rowHead(tr, text) {
    const th = document.createElement("th");
    th.scope = "row";
    th.textContent = text;
    tr.appendChild(th);
  }

  // alarm adds a count that should be 0, flagged when it is not.
  function alarm(tr, n) {
    const span = document.createElement("span");
    span.textContent = String(n);
    if (n > 0) span.className = "badge limited";
    cell(tr, "", "n").appendChild(span);
  }

  // The instance registry (every Redis store): how many instances of this one's fleet (its name:
  // store.fleet) share the Redis, and so, with on_error: local, which share of each policy this
  // one decides on alone while Redis is down.
  function renderFleet(f) {
    $("fleet").hidden = !f;
    if (!f) return;
    $("fleet-name").textContent = f.name ? " of fleet " + f.name : "";
    const share = f.fallback_share === 0 ? "" : f.instances > 0 && Math.abs(f.fallback_share * f.instances - 1) < 1e-9 ? "1/" + f.instances :
      f.instances === 0 && f.fallback_share === 1 ? "1 (no heartbeat has reached Redis yet)" : String(f.fallback_share);
    $("fleet-summary").textContent = f.instances + " live; this instance, " + f.self + (share ? ", decides on " + share +
      " of each policy while Redis is down" : ", has no local fallback (it decides nothing alone while Redis is down)") + (f.error ? "; last heartbeat failed: " + f.error : "") +
      (f.seen_at ? "; counted at " + when(f.seen_at) : "");
    const tbody = $("fleet-members").tBodies[0];
    tbody.replaceChildren();
    for (const m of f.members) {
      const tr = tbody.insertRow();
      tr.dataset.instance = m.id;
      rowHead(tr, m.id + (m.id === f.self ? " (this one)" : ""));
      cell(tr, when(m.last_seen));
    }
  }

  // Throttling by load (load_shedding), this instance's: the adaptive limit on the requests in
  // flight to the upstream, against the latency that sets it, and what each priority got.
  function renderShedding(s) {
    $("shedding").hidden = !s;
    if (!s) return;
    const state = s.limit >= s.max_limit ? "its maximum" :
      "lowered from " + s.max_limit + ": the upstream answers slower than its baseline";
    const latency = s.latency_ms > 0 ? "upstream latency " + s.latency_ms.toFixed(1) + " ms, baseline " + s.baseline_ms.toFixed(1) + " ms" :
      "no upstream latency measured yet";
    $("shedding-summary").textContent = s.in_flight + " in flight of a limit of " + s.limit + " (" + state +
      "; at least " + s.min_limit + "); " + latency;
    const tbody = $("shedding-priorities").tBodies[0];
    tbody.replaceChildren();
    for (const p of ["high", "normal", "low"]) {
      const tr = tbody.insertRow();
      tr.dataset.priority = p;
      rowHead(tr, p);
      cell(tr, s.shares[p] + "%", "n");
      cell(tr, String(s.admitted[p]), "n");
      alarm(tr, s.shed[p]);
    }
  }

  // The global policies (GET /v1/stats "regions"): per policy, this region as this instance
  // enforces it, then every other region as the ledger had it at the last refresh.
  function regionState(p) {
    if (p.safe_share) return ["on its safe share: the lease ran out without a refresh" + (p.error ? " (" + p.error + ")" : ""), "badge limited"];
    if (p.floor) return ["on the floor: no grant yet", "badge"];
    if (p.learning) return ["the ledger is learning: no new quota yet", "badge"];
    return ["lease" + (p.refresher ? ", refreshes for the region" : ""), "badge ok"];
  }

  function renderRegions(r) {
    $("regions").hidden = !r;
    if (!r) return;
    $("regions-name").textContent = ": this is " + r.region;
    const box = $("regions-policies");
    box.replaceChildren();
    for (const p of r.policies) {
      const h = document.createElement("h3");
      h.textContent = p.policy + ": " + p.limit + " worldwide";
      const note = document.createElement("p");
      note.className = "muted";
      note.dataset.policy = p.policy;
      const short = p.worldwide_want > p.limit;
      note.textContent = p.worldwide_want > 0 ? "the regions want " + p.worldwide_want + " together" +
        (short ? ": the limit cannot meet it, some regions are refused" : "") : "the worldwide demand is not read yet";
      if (short) note.className = "";
      const wrap = document.createElement("div");
      wrap.className = "scroll";
      const table = document.createElement("table");
      table.dataset.policy = p.policy;
      table.className = "regions";
      table.createCaption().textContent = "Allotments of " + p.policy;
      table.caption.className = "visually-hidden";
      const head = table.createTHead().insertRow();
      for (const [t, n] of [["region", false], ["demand", true], ["allotment", true], ["use", true], ["lease ends", false], ["state", false]]) {
        const th = document.createElement("th");
        th.scope = "col";
        th.textContent = t;
        if (n) th.className = "n";
        head.appendChild(th);
      }
      const tbody = table.createTBody();
      const row = (name, want, allotment, used, lease, state, cls) => {
        const tr = tbody.insertRow();
        tr.dataset.region = name;
        rowHead(tr, name);
        cell(tr, String(want), "n");
        cell(tr, String(allotment), "n");
        cell(tr, String(used), "n");
        cell(tr, lease ? when(lease) : "none");
        const span = document.createElement("span");
        span.textContent = state;
        span.className = cls;
        cell(tr, "").appendChild(span);
        return tr;
      };
      const [state, cls] = regionState(p);
      const here = row(r.region + " (here)", p.want, p.allotment, p.used, p.lease_expires, state, cls);
      here.dataset.region = r.region;
      here.dataset.safe = String(p.safe_share);
      for (const x of p.ledger || []) {
        if (x.region === r.region) continue;
        row(x.region, x.want, x.allotment, x.used, x.lease_expires,
          x.live ? "lease (ledger)" : "lease ended: counted until its use ends, then its floor", x.live ? "badge" : "badge limited");
      }
      wrap.appendChild(table);
      box.append(h, note, wrap);
    }
  }

  // Envoy's Rate Limit Quota Service (GET /v1/stats "rlqs"): this instance's streams, then each
  // bucket (the busiest first) with its Envoys: those of this instance as it assigned them, and
  // those of other instances as the bucket's ledger has them.
  const RLQS_BUCKETS = 20, RLQS_ENVOYS = 50; // shown: the busiest buckets, and Envoys of each
  const period = (s) => (s % 3600 === 0 ? s / 3600 + " h" : s % 60 === 0 ? s / 60 + " min" : s + " s");
  const idText = (id) => "{" + Object.keys(id).sort().map((k) => k + ": " + id[k]).join(", ") + "}";

  function table(cls, caption, cols) {
    const t = document.createElement("table");
    t.className = cls;
    t.createCaption().textContent = caption;
    t.caption.className = "visually-hidden";
    const head = t.createTHead().insertRow();
    for (const [text, n] of cols) {
      const th = document.createElement("th");
      th.scope = "col";
      th.textContent = text;
      if (n) th.className = "n";
      head.appendChild(th);
    }
    t.createTBody();
    return t;
  }

  function renderRLQS(q) {
    $("rlqs").hidden = !q;
    if (!q) return;
    const err = q.last_ledger_error;
    const summary = $("rlqs-summary");
    summary.textContent = q.clients.length + " stream" + (q.clients.length === 1 ? "" : "s") + ", " + q.buckets.length + " bucket" +
      (q.buckets.length === 1 ? "" : "s") + "; " + q.reports + " reports, " + q.assignments + " assignments, " + q.refused_buckets +
      " buckets refused, " + q.ledger_errors + " ledger errors since the start" +
      (err ? "; last ledger error " + when(err.at) + " (rule " + err.rule + "): " + err.error : "") +
      "; assignments live " + q.assignment_ttl_s + " s, Envoys report every " + q.report_interval_s + " s";
    summary.className = err ? "bad" : "muted";
    summary.dataset.ledgerErrors = String(q.ledger_errors);

    const streams = $("rlqs-streams").tBodies[0];
    streams.replaceChildren();
    if (q.clients.length === 0) cell(streams.insertRow(), "no Envoy connected", "muted").colSpan = 7;
    for (const c of q.clients) {
      const tr = streams.insertRow();
      tr.dataset.stream = c.id;
      rowHead(tr, c.id);
      cell(tr, c.peer);
      cell(tr, c.domain || "—");
      cell(tr, when(c.since));
      cell(tr, when(c.last_report));
      cell(tr, String(c.reports), "n");
      cell(tr, String(c.buckets), "n");
    }

    const ledgers = new Map((q.ledgers || []).map((l) => [l.ledger, l]));
    const rules = new Map((q.rules || []).map((r) => [r.name, r]));
    const buckets = [...q.buckets].sort((a, b) => b.want - a.want || (a.ledger || a.rule).localeCompare(b.ledger || b.rule));
    $("rlqs-buckets-note").textContent = buckets.length === 0 ? "no bucket reported yet" :
      (buckets.length > RLQS_BUCKETS ? "the " + RLQS_BUCKETS + " of " + buckets.length + " with the most demand; " : "") +
      "a value a wildcard matched is shown as the start of its SHA-256" +
      (q.ledgers_omitted ? "; " + q.ledgers_omitted + " buckets' ledgers not read (only the busiest " + q.ledgers.length + " are)" : "");
    const box = $("rlqs-buckets");
    box.replaceChildren();
    for (const b of buckets.slice(0, RLQS_BUCKETS)) {
      const l = b.ledger ? ledgers.get(b.ledger) : null;
      const head = document.createElement("p");
      head.className = "bucket";
      head.dataset.rule = b.rule;
      const name = document.createElement("strong");
      name.textContent = b.rule + " ";
      const id = document.createElement("span");
      id.className = "id";
      id.textContent = idText(b.id);
      const what = document.createElement("span");
      const rule = rules.get(b.rule);
      const fleetWant = l && !l.error ? l.want : null;
      const over = b.limit > 0 && (fleetWant ?? b.want) > b.limit;
      what.textContent = b.blanket ? ": blanket " + b.blanket + " (" + (b.blanket === "allow" ? "ALLOW_ALL" : "DENY_ALL") + ")" :
        ": limit " + b.limit + " per " + period(b.period_s) + (rule && rule.burst !== rule.limit ? ", burst " + rule.burst : "") +
        "; demand " + b.want + " here, assigned " + b.assigned +
        (l ? (l.error ? "; the ledger: " + l.error : "; all instances' Envoys want " + l.want + ", hold " + l.outstanding + (l.learning ? " (the ledger is learning: no new quota yet)" : "")) : "") + " ";
      if (l && l.error) head.dataset.ledgerError = l.error;
      head.append(name, id, what);
      if (over) {
        const flag = document.createElement("span");
        flag.className = "badge limited";
        flag.textContent = "over the limit: the Envoys refuse part of their requests";
        head.append(flag);
      }
      const wrap = document.createElement("div");
      wrap.className = "scroll";
      const t = table("rlqs-bucket", "Envoys of bucket " + b.rule + " " + idText(b.id), [["Envoy"], ["instance"], ["demand", true], ["allotment", true],
        ["share", true], ["assigned", true], ["strategy"], ["expires"], ["allowed", true], ["denied", true]]);
      t.dataset.rule = b.rule;
      t.dataset.ledger = b.ledger || "";
      const tbody = t.tBodies[0];
      const others = l && !l.error ? l.envoys.filter((e) => !e.here) : [];
      const shown = Math.max(0, RLQS_ENVOYS - b.envoys.length);
      for (const e of b.envoys.slice(0, RLQS_ENVOYS)) {
        const tr = tbody.insertRow();
        tr.dataset.envoy = e.client;
        tr.dataset.here = "true";
        rowHead(tr, e.client);
        cell(tr, "this one");
        cell(tr, String(e.want), "n");
        cell(tr, b.blanket ? "—" : String(e.allotment), "n");
        cell(tr, b.blanket ? "—" : String(e.share), "n");
        cell(tr, e.strategy === "token_bucket" ? e.assigned + " (" + e.max_tokens + " tokens)" : "—", "n");
        const s = document.createElement("span");
        s.textContent = e.strategy.replace("_", " ") + (e.learning ? ", learning" : "") + (e.ledger_errors ? ", " + e.ledger_errors + " ledger errors" : "");
        s.className = "badge " + (e.strategy === "deny_all" || e.ledger_errors ? "limited" : e.strategy === "none" ? "" : "ok");
        cell(tr, "").appendChild(s);
        cell(tr, when(e.expires));
        cell(tr, String(e.allowed), "n");
        alarm(tr, e.denied);
      }
      for (const e of others.slice(0, shown)) {
        const tr = tbody.insertRow();
        tr.dataset.envoy = e.client;
        tr.dataset.here = "false";
        rowHead(tr, e.client);
        cell(tr, "another (ledger)");
        cell(tr, String(e.want), "n");
        cell(tr, String(e.allotment), "n");
        cell(tr, "—", "n");
        cell(tr, "—", "n");
        const s = document.createElement("span");
        s.textContent = e.live ? "lease" : "lease ended";
        s.className = "badge" + (e.live ? "" : " limited");
        cell(tr, "").appendChild(s);
        cell(tr, when(e.expires));
        cell(tr, String(e.allowed), "n");
        alarm(tr, e.denied);
      }
      const more = Math.max(0, b.envoys.length - RLQS_ENVOYS) + others.length - Math.min(others.length, shown);
      if (more > 0) cell(tbody.insertRow(), more + " more Envoys", "muted").colSpan = 10;
      wrap.appendChild(t);
      box.append(head, wrap);
    }
  }

  // The diagnosis (GET /v1/stats "diagnosis"): findings with what to do, and their evidence.
  function rows(id, list, key, cells) {
    list = list || [];
    const tbody = $(id).tBodies[0];
    tbody.replaceChildren();
    if (list.length === 0) {
      const td = cell(tbody.insertRow(), "none", "muted");
      td.colSpan = $(id).tHead.rows[0].cells.length;
    }
    for (const x of list) {
      const tr = tbody.insertRow();
      tr.dataset.key = key(x);
      rowHead(tr, key(x));
      for (const [text, cls] of cells(x)) cell(tr, text, cls);
    }
  }

  // Each instance's share of a client's approvals (diagnosis.shares, a Redis store): a row per
  // client and policy, a column per live instance, then the total and what one shared counter
  // allows in a window (the total over it is flagged).
  function renderShares(sh) {
    const table = $("diag-shares");
    const head = table.tHead.rows[0];
    const ids = sh ? (sh.clients[0] || { instances: [] }).instances.map((x) => x.id) : [];
    head.replaceChildren();
    for (const [text, cls] of [["client"], ["policy"], ...ids.map((id) => [id, "n"]), ["total", "n"], ["allowed per window", "n"]]) {
      const th = document.createElement("th");
      th.scope = "col";
      th.textContent = text;
      if (cls) th.className = cls;
      if (ids.includes(text)) th.dataset.instance = text;
      head.appendChild(th);
    }
    $("diag-shares-note").textContent = !sh ? "with a Redis store: what each live instance approved in the policy's latest window, from the instance registry" :
      sh.instances + " live instance" + (sh.instances === 1 ? "" : "s") + (sh.listed < sh.instances ? " (" + sh.listed + " listed)" : "") +
      "; each one's approvals in the policy's latest window, as of its last heartbeat, and its share of the total" +
      (sh.dropped > 0 ? "; " + sh.dropped + " counts over the cap of " + sh.max_counts_per_instance + " per instance not shown" : "");
    rows("diag-shares", sh ? sh.clients : [], (x) => x.client, (x) => [[x.policy],
      ...x.instances.map((in_) => [in_.approved + " (" + in_.share_pct.toFixed(1) + "%)", "n"]),
      [String(x.total), "n total" + (x.allowed > 0 && x.total > x.allowed ? " over" : "")], [String(x.allowed || "—"), "n"]]);
    for (const tr of table.tBodies[0].rows) {
      const c = (sh ? sh.clients : []).find((x) => x.client === tr.dataset.key && x.policy === tr.cells[1]?.textContent);
      if (c) tr.dataset.policy = c.policy;
    }
  }

  function renderDiagnosis(d) {
    if (!d) return;
    $("diag-note").textContent = "the usual mistakes found in the traffic, each with what to do; addresses and keys over the last " +
      d.window_s + "–" + 2 * d.window_s + " s, in " + d.counters + " counters (a count is at most its ± over the truth, ± at most 1/" + d.counters_per_shard + " of the total)";
    const ul = $("findings");
    ul.replaceChildren();
    if (d.findings.length === 0) {
      const li = document.createElement("li");
      li.className = "muted";
      li.textContent = "nothing found";
      ul.appendChild(li);
    }
    for (const f of d.findings) {
      const li = document.createElement("li");
      li.dataset.kind = f.kind;
      li.dataset.subject = f.subject;
      const b = document.createElement("strong");
      b.textContent = f.kind.replaceAll("_", " ") + ": ";
      const what = document.createElement("span");
      what.textContent = f.summary + ". ";
      const todo = document.createElement("span");
      todo.className = "todo";
      todo.textContent = "What to do: " + f.do + ".";
      li.append(b, what, todo);
      ul.appendChild(li);
    }
    const refusedOf = (h) => {
      const m = new Map((h.by_refusals || []).map((x) => [x.key, x.count]));
      return (x) => String(m.get(x.key) ?? 0);
    };
    const ra = refusedOf(d.addresses), rk = refusedOf(d.unknown_api_keys);
    rows("diag-addresses", d.addresses.by_requests, (x) => x.key, (x) => [[String(x.count), "n"], [String(x.error), "n"], [ra(x), "n"]]);
    rows("diag-keys", d.unknown_api_keys.by_requests, (x) => x.key, (x) => [[String(x.count), "n"], [String(x.error), "n"], [rk(x), "n"]]);
    rows("diag-shared", d.shared_addresses, (x) => x.address, (x) => [[x.clients.join(", ") + (x.more ? ", …" : ""), "list"], [x.refused.join(", ") || "—", "list"]]);
    rows("diag-low", d.limit_too_low, (x) => x.client, (x) => [[x.policy], [x.limit + " / " + x.period, "n"], [String(x.refused), "n"],
      [String(x.p95_demand), "n"], [String(x.suggested_limit), "n suggested"]]);
    renderShares(d.shares);
    const ms = (x) => (x >= 100 ? x.toFixed(0) : x.toFixed(1));
    rows("diag-retries", d.early_retriers, (x) => x.key, (x) => [[String(x.early_retries), "n"], [ms(x.mean_retry_after_refusal_ms), "n"],
      [ms(x.mean_retry_after_given_ms), "n"]]);
  }

  // Micro-dollars as dollars, exactly: $0.001234 (integer arithmetic, no float rounding).
  const usd = (m) => "$" + Math.floor(m / 1e6) + "." + String(m % 1e6).padStart(6, "0");

  // LLM usage (each client's "llm"): a row per client and model, shown once any client has one.
  function renderLLM(clients) {
    const used = clients.filter((c) => c.llm && c.llm.length > 0);
    $("llm").hidden = used.length === 0;
    const tbody = $("llm-usage").tBodies[0];
    tbody.replaceChildren();
    for (const c of used) for (const m of c.llm) {
      const tr = tbody.insertRow();
      tr.dataset.client = c.client;
      tr.dataset.model = m.model;
      rowHead(tr, c.client);
      cell(tr, m.model);
      cell(tr, String(m.requests), "n");
      cell(tr, m.input + " (" + m.cached_input + ")", "n");
      cell(tr, String(m.output), "n");
      cell(tr, String(m.reserved), "n");
      cell(tr, usd(m.micro_usd), "n");
      cell(tr, String(m.no_usage), "n");
      alarm(tr, m.failed);
    }
  }

  // Needs (GET /v1/clients/{name}/needs): each client's use per window of each policy beside
  // its limit, and its flags, for the clients /v1/stats lists; fetched every 10 s, not every poll.
  const NEEDS_EVERY = 10000;
  let needsAt = -Infinity, needsBusy = false;
  const perWindow = (w) => "/" + ({ "1s": "s", "1m": "min", "1h": "h", "24h": "day" }[w] || w);
  const needsURL = (client) => "../v1/clients/" + encodeURIComponent(client) + "/needs";

  async function loadNeeds(clients) {
    if (needsBusy || performance.now() - needsAt < NEEDS_EVERY) return;
    needsBusy = true;
    try {
      const all = [];
      for (const c of clients) {
        const r = await fetch(needsURL(c.client), { cache: "no-store" });
        if (!r.ok) continue; // no longer kept (the least recently active beyond the bound)
        const rep = await r.json();
        for (const p of rep.policies) all.push({ client: rep.client, ...p });
      }
      renderNeeds(all);
      needsAt = performance.now();
    } finally {
      needsBusy = false;
    }
  }

  const needsNote = $("needs-note").textContent;

  function renderNeeds(list) {
    $("needs-note").textContent = needsNote;
    const tbody = $("needs-table").tBodies[0];
    tbody.replaceChildren();
    if (list.length === 0) {
      const td = cell(tbody.insertRow(), "no requests yet", "muted");
      td.colSpan = 9;
    }
    const select = $("whatif-target");
    const chosen = select.value;
    select.replaceChildren();
    for (const p of list) {
      const tr = tbody.insertRow();
      tr.dataset.client = p.client;
      tr.dataset.policy = p.policy;
      tr.dataset.flags = p.flags.map((f) => f.kind).join(" ");
      rowHead(tr, p.client);
      const per = perWindow(p.window);
      cell(tr, p.policy + (p.dry_run ? " (dry run)" : ""));
      cell(tr, p.limit + per, "n");
      cell(tr, p.recorded ? p.peak + per : "—", "n");
      cell(tr, p.recorded ? p.p99 + per : "—", "n");
      cell(tr, p.recorded ? p.p50 + per : "—", "n");
      cell(tr, String(p.windows), "n");
      alarm(tr, p.refused);
      const flags = cell(tr, p.aggregate ? "many keys: no flags" : "", "flags" + (p.aggregate ? " muted" : ""));
      for (const f of p.flags) {
        const b = document.createElement("span");
        b.className = "badge " + (f.kind === "too_low" ? "limited" : "far");
        b.dataset.kind = f.kind;
        b.textContent = f.kind.replace("_", " ") + ": " + f.detail;
        flags.appendChild(b);
      }
      if (p.recorded && !p.aggregate) {
        const o = document.createElement("option");
        o.value = JSON.stringify([p.client, p.policy]);
        o.textContent = p.client + " · " + p.policy + " (" + p.limit + per + ")";
        select.appendChild(o);
      }
    }
    if ([...select.options].some((o) => o.value === chosen)) select.value = chosen;
  }

  // The what-if: the chosen client's last day replayed under the limit (and period) typed.
  $("whatif").addEventListener("submit", async (e) => {
    e.preventDefault();
    const out = $("whatif-result");
    out.className = "";
    delete out.dataset.wouldRefuse;
    if (!$("whatif-target").value) {
      out.className = "failed";
      out.textContent = "no client's use is kept yet";
      return;
    }
    const [client, policy] = JSON.parse($("whatif-target").value);
    const q = new URLSearchParams({ policy, limit: $("whatif-limit").value });
    if ($("whatif-period").value.trim()) q.set("period", $("whatif-period").value.trim());
    out.textContent = "replaying…";
    try {
      const r = await fetch(needsURL(client) + "?" + q, { cache: "no-store" });
      const body = await r.json();
      if (!r.ok) {
        out.className = "failed";
        out.textContent = body.detail || "GET " + r.status;
        return;
      }
      const was = body.current, would = body.proposed;
      out.dataset.wouldRefuse = String(body.would_refuse);
      out.dataset.refusedAsRecorded = String(body.refused_as_recorded);
      out.textContent = client + " · " + policy + ": at " + would.limit + perWindow(would.window) + " (" + would.algorithm + "), " +
        body.would_refuse + " of its " + body.offered + " requests of the last day would have been refused; at " +
        was.limit + perWindow(was.window) + ", " + body.refused_as_recorded + " were" +
        (body.not_replayed > 0 ? " (" + body.not_replayed + " earlier requests not replayed)" : "");
    } catch (err) {
      out.className = "failed";
      out.textContent = "cannot replay (" + err.message + ")";
    }
  });

  // settlementsLost is every settlement given up, whatever the reason (/v1/stats splits them).
  function settlementsLost(s) {
    return s.lost_deadline + s.lost_full + s.lost_shutdown + s.lost_refused;
  }

  // The clients API's records as this instance runs them: which wins when the file and the API
  // name one client (the API's), and those that cannot run.
  function registryItems(r) {
    const out = [["clients", r.from_api + " from the API, " + r.from_file + " from the file"]];
    if (r.shadowed && r.shadowed.length) out.push(["file clients replaced by the API", r.shadowed.join(", ")]);
    const dropped = Object.entries(r.dropped || {});
    if (dropped.length) out.push(["API clients not running", dropped.map(([n, why]) => n + " (" + why + ")").join("; ")]);
    out.push(["clients read", r.error ? "failed: " + r.error : when(r.synced_at) + " (version " + r.version + ")"]);
    return out;
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
      ["store errors", String(st.store.errors)],
      ["refused 503 (store down)", String(st.store.unavailable)],
      ["fallback decisions", String(st.store.fallbacks)],
      ["settlements pending", String(st.store.settlements.pending)],
      ["settlements lost", String(settlementsLost(st.store.settlements))],
      ["uptime", Math.floor(st.uptime_s) + " s"],
    ];
    if (st.registry) items.push(...registryItems(st.registry));
    for (const [k, v] of items) {
      const div = document.createElement("div");
      const dt = document.createElement("dt");
      const dd = document.createElement("dd");
      dt.textContent = k;
      dd.textContent = v;
      if ((k === "reachable" && !st.store.reachable) || (k === "breaker" && st.store.breaker_open) ||
        (k === "settlements lost" && v !== "0") || k === "API clients not running" ||
        (k === "clients read" && v.startsWith("failed"))) dd.className = "badge limited";
      div.dataset.item = k;
      div.append(dt, dd);
      store.appendChild(div);
    }
    renderFleet(st.fleet);
    renderShedding(st.load_shedding);
    renderRegions(st.regions);
    renderRLQS(st.rlqs);
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
      rowHead(tr, c.client);
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
    renderLLM(st.clients);
    renderDiagnosis(st.diagnosis); // last: the sections above do not wait on it
    document.body.dataset.updated = st.time;
  }

  // The charts: the last hour. This instance's opens with the server's history (GET /v1/history:
  // one point per 10 s slot, the slot's counts per second, at its end), then adds a point per poll
  // (the rates over the last 10 s). Series: all clients' allowed, refused and delayed per second,
  // then the refused per second of the clients limited in that time (at most 5). The fleet's chart
  // (a Redis store: every instance's counts summed) shows the fleet's slots, read again every 10 s.
  const SPAN = 3600; // s of points kept
  let span = SPAN; // s on the x axis: the last hour, or the last 2 minutes (#chart-span)
  const loadedAt = Date.now() / 1000;
  const history = []; // {t, allowed, refused, delayed, byClient: {name: refused/s}}, oldest first
  const clock = (s) => new Date(s * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  const clockSec = (s) => new Date(s * 1000).toLocaleTimeString();
  const AXIS_FONT = "14px system-ui, sans-serif"; // the page's small size (operator.css --small), on a canvas
  const palette = ["#b42318", "#7a2e98", "#c4320a", "#3e4784", "#9f1ab1"];
  const charts = {}; // by element id: {plot, key}
  let historyPoints = 0;
  document.body.dataset.loaded = String(loadedAt);

  // fromSlots turns a history's slots into points (per second, at each slot's end).
  function fromSlots(slots, res) {
    return slots.map((s) => {
      const byClient = {};
      for (const c of s.top_refused || []) byClient[c.client] = c.refused / res;
      return { t: Date.parse(s.t) / 1000 + res, allowed: s.allowed / res, refused: s.refused / res, delayed: s.delayed / res, byClient, instances: s.instances || 0 };
    });
  }

  // named picks the clients with a series of their own: those limited now first, then those
  // refused in the points, the most refused first; at most one per colour.
  function named(points, limitedNow) {
    const out = limitedNow.slice(0, palette.length);
    const sums = {};
    for (const p of points) for (const name in p.byClient) sums[name] = (sums[name] || 0) + p.byClient[name];
    for (const name of Object.keys(sums).sort((a, b) => sums[b] - sums[a] || a.localeCompare(b))) {
      if (out.length < palette.length && !out.includes(name) && sums[name] > 0) out.push(name);
    }
    return out;
  }

  function plot(id, points, clients) {
    if (typeof uPlot === "undefined") return; // the page still works without its charts
    const el = $(id);
    el.dataset.points = String(points.length);
    el.dataset.first = points.length ? String(points[0].t) : "";
    el.dataset.last = points.length ? String(points[points.length - 1].t) : "";
    // What of it came from before the page opened (the server's history): points, and their refusals.
    const before = points.filter((p) => p.t < loadedAt);
    el.dataset.pointsBeforeLoad = String(before.length);
    el.dataset.refusedBeforeLoad = String(before.reduce((n, p) => n + p.refused, 0));
    const data = [points.map((h) => h.t), points.map((h) => h.allowed), points.map((h) => h.refused), points.map((h) => h.delayed)];
    for (const c of clients) data.push(points.map((h) => (c in h.byClient ? h.byClient[c] : null)));
    const key = clients.join("\u0000");
    const width = Math.max(280, el.clientWidth);
    let c = charts[id];
    if (!c || c.key !== key) {
      if (c) c.plot.destroy();
      c = charts[id] = { key };
      c.plot = new uPlot({
        width, height: 220,
        padding: [null, 40, null, null], // room for the last time's label, centred on the right edge
        // Always the span chosen, however few points there are yet; from 0, and a quiet
        // gateway's zeros on a scale of 1, not of 100.
        scales: { x: { time: true, range: (u, min, max) => [max - span, max] }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
        // One line of time per tick, far enough apart not to touch (uPlot's own adds a second
        // line of date and hour, which ran into the next tick's).
        axes: [{ font: AXIS_FONT, space: 90, values: (u, ticks) => ticks.map((t) => clock(t)) },
          { label: "requests/s", font: AXIS_FONT, labelFont: "bold " + AXIS_FONT }],
        series: [
          { label: "time", value: (u, t) => (t == null ? "—" : clockSec(t)) },
          // (uPlot's points show only where they are sparse: a lone slot is a dot, not nothing.)
          { label: "allowed", stroke: "#1a7f37", width: 2 },
          { label: "refused", stroke: "#b42318", width: 2 },
          { label: "delayed", stroke: "#bc4c00", width: 2 },
          ...clients.map((name, i) => ({ label: name + " refused", stroke: palette[i], width: 1, dash: [4, 3] })),
        ],
      }, data, el);
    } else {
      if (c.plot.width !== width) c.plot.setSize({ width, height: 220 });
      c.plot.setData(data);
    }
    // Not hovered, the legend says the latest figures (not "--"); after a new chart's first
    // drawing, which uPlot does once this task is done.
    // (data-span: the x axis's span, in s, as drawn.)
    const latest = () => {
      if (c.plot.cursor.left < 0) c.plot.setLegend({ idx: points.length - 1 });
      el.dataset.span = String(c.plot.scales.x.max - c.plot.scales.x.min);
    };
    latest();
    queueMicrotask(latest);
  }

  $("chart-span").addEventListener("change", (e) => {
    span = Number(e.target.value);
    for (const id in charts) {
      const c = charts[id];
      c.plot.setData(c.plot.data); // (the x range again)
      $(id).dataset.span = String(c.plot.scales.x.max - c.plot.scales.x.min);
      $(id).setAttribute("aria-label", $(id).getAttribute("aria-label").replace(/over the last .*/, "over " + e.target.selectedOptions[0].text));
    }
  });

  // trim drops the points older than the hour before the latest.
  function trim(points) {
    while (points.length && points[0].t < points[points.length - 1].t - SPAN) points.shift();
  }

  function drawChart(st) {
    const h = { t: Date.parse(st.time) / 1000, allowed: 0, refused: 0, delayed: 0, byClient: {} };
    for (const c of st.clients) {
      h.allowed += c.allowed_per_s;
      h.refused += c.refused_per_s;
      h.delayed += c.delayed_per_s;
      h.byClient[c.client] = c.refused_per_s;
    }
    if (history.length && h.t <= history[history.length - 1].t) return; // (within the history's last slot)
    history.push(h);
    trim(history);
    document.body.dataset.points = String(history.length);
    plot("chart", history, named(history, st.clients.filter((c) => c.limited).map((c) => c.client)));
  }

  // The fleet's history: its chart, shown when the store keeps one (a Redis store).
  function drawFleet(rep) {
    const show = Array.isArray(rep.fleet);
    $("fleet-rates").hidden = !show;
    if (!show) return;
    const points = fromSlots(rep.fleet, rep.resolution_s);
    const most = points.reduce((n, p) => Math.max(n, p.instances), 0);
    $("fleet-rates-note").textContent = "every instance of the fleet together, per 10 s slot, from the store; " +
      (points.length ? "up to " + most + " instance" + (most === 1 ? "" : "s") + " in a slot" : "no slot yet");
    $("fleet-chart").dataset.instances = String(most);
    plot("fleet-chart", points, named(points, []));
  }

  async function loadHistory() {
    const r = await fetch("../v1/history", { cache: "no-store" });
    if (!r.ok) throw new Error("GET /v1/history: " + r.status);
    return r.json();
  }

  function historyNote(rep) {
    $("history-note").textContent = rep.fleet_error ? "the fleet's history cannot be read (" + rep.fleet_error + ")" :
      rep.fleet ? "" : "the memory store: this instance is the whole fleet";
  }

  // First the hour before the page opened, then the polls.
  async function start() {
    try {
      const rep = await loadHistory();
      const points = fromSlots(rep.instance, rep.resolution_s);
      history.push(...points);
      trim(history);
      historyPoints = points.length;
      drawFleet(rep);
      historyNote(rep);
    } catch (e) {
      $("history-note").textContent = "cannot read the gateway's history (" + e.message + "): the chart starts now";
    }
    $("chart").dataset.historyPoints = String(historyPoints);
    poll();
    setInterval(async () => {
      try {
        const rep = await loadHistory();
        drawFleet(rep);
        historyNote(rep);
      } catch (e) { /* the next read may answer */ }
    }, 10000);
  }

  async function poll() {
    try {
      const r = await fetch("../v1/stats", { cache: "no-store" });
      if (!r.ok) throw new Error("GET /v1/stats: " + r.status);
      const st = await r.json();
      render(st);
      drawChart(st);
      loadNeeds(st.clients).catch((e) => {
        $("needs-note").textContent = "cannot read the clients' needs (" + e.message + "); retrying";
      });
      $("error").hidden = true;
    } catch (e) {
      $("error").textContent = "cannot read the gateway's stats (" + e.message + "); retrying";
      $("error").hidden = false;
    }
    setTimeout(poll, 1000);
  }
  start();
})();
