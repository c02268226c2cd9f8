// The clonefleet dashboard page: live overview over server-sent events, the job table and one
// job's detail over the JSON API. Everything shown from the fleet (names, progress, errors,
// results: model text) goes into the page as text nodes, never as HTML.
"use strict";

(() => {
  const TERMINAL = new Set(["completed", "failed", "cancelled"]);
  const MAX_EVENT_ROWS = 1000;
  const DETAIL_POLL_MS = 2000;
  const $ = (id) => document.getElementById(id);
  const state = {
    filters: { status: "", agent: "", batch: "" },
    cursor: "0",
    history: [],
    next: null,
    selected: null,
    selectedStatus: null,
    eventsCursor: "0",
    overview: null,
    connected: false,
    jobsBusy: false,
    jobsAgain: false,
    detailBusy: false,
    detailAgain: false,
    keyed: false, // some job has a dataset row key: the job table shows a key column
  };

  // -- helpers ------------------------------------------------------------------------------
  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function cell(row, text, className) {
    const td = el("td", className, text);
    if (text !== undefined && text !== null) td.title = String(text);
    row.appendChild(td);
    return td;
  }

  const num = (n) => (typeof n === "number" ? n.toLocaleString("en-US") : "–");
  const clock = (ts) => (ts ? new Date(ts * 1000).toLocaleTimeString() : "–");
  const cost = (c) => (typeof c === "number" ? `$${c.toFixed(4)}` : "–");
  // The share of input tokens read from the prompt cache ("–" when none was).
  const cached = (u) =>
    u.cache_read_tokens > 0 && u.input_tokens > 0
      ? `${Math.round((100 * u.cache_read_tokens) / u.input_tokens)}%`
      : "–";

  function elapsed(start, end) {
    if (!start) return "–";
    const s = Math.max(0, (end || Date.now() / 1000) - start);
    if (s < 60) return `${s.toFixed(1)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
    return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  }

  function status(text) {
    return el("span", `status ${String(text).replace(/[^a-z]/g, "")}`, text);
  }

  async function getJSON(url) {
    const resp = await fetch(url, { cache: "no-store", credentials: "same-origin" });
    let body = {};
    try {
      body = await resp.json();
    } catch (err) {
      body = {};
    }
    if (!resp.ok) throw new Error(body.error || `HTTP ${resp.status}`);
    return body;
  }

  function replaceRows(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  // -- banner and header --------------------------------------------------------------------
  function showBanner() {
    let text = "";
    const sched = (state.overview && state.overview.scheduler) || {};
    if (!state.connected) {
      text = "Lost the connection to the dashboard server; reconnecting…";
    } else if (sched.problem) {
      text = `Scheduler unavailable: ${sched.problem} Retrying…`;
    } else if (!sched.ok) {
      text = "Reading the fleet…";
    }
    const banner = $("banner");
    banner.textContent = text;
    banner.hidden = !text;
    const live = $("live");
    live.textContent = state.connected ? "live" : "reconnecting";
    live.className = `live ${state.connected && sched.ok ? "on" : "off"}`;
  }

  function renderUsage(usage, capacity) {
    const tiles = [
      ["jobs", num(usage.jobs)],
      ["running", num(capacity.running)],
      ["queued", num(capacity.queued)],
      ["completed", num(usage.by_status.completed)],
      ["failed", num(usage.by_status.failed)],
      ["input tokens", num(usage.input_tokens)],
      ["output tokens", num(usage.output_tokens)],
      ["total tokens", num(usage.total_tokens)],
      ["cached input", cached(usage)],
      ["cost", cost(usage.cost_usd)],
    ];
    $("usage").replaceChildren(
      ...tiles.map(([label, value]) => {
        const tile = el("div", "tile");
        tile.dataset.tile = label;
        tile.append(el("div", "value", value), el("div", "label", label));
        return tile;
      }),
    );
    const cap = capacity.max_concurrency === null ? "no cap" : `cap ${capacity.max_concurrency}`;
    $("capacity").textContent = `${num(capacity.running)} running, ${num(capacity.queued)} queued (${cap})`;
  }

  // -- rate limits --------------------------------------------------------------------------
  const perMinute = (now, limit) =>
    `${num(Math.round(now || 0))} / ${typeof limit === "number" ? num(Math.round(limit)) : "–"}`;

  function rateRow(r) {
    const row = el("tr");
    row.dataset.scope = r.scope;
    cell(row, r.label, "mono");
    cell(row, perMinute(r.rpm_now, r.rpm_limit));
    cell(row, perMinute(r.tpm_now, r.tpm_limit));
    cell(row, r.source);
    cell(row, num(r.waiting));
    const most = typeof r.max_in_flight === "number" ? ` / ${num(r.max_in_flight)}` : "";
    cell(row, `${num(r.in_flight)}${most}`);
    const refused = cell(row, `${num(r.rate_limited)} (${num(r.rate_limited_last_min)})`);
    if (r.rate_limited_last_min) refused.className = "refusing";
    return row;
  }

  function renderRateLimits(rows) {
    const list = rows || [];
    replaceRows($("rate-limits").tBodies[0], list.map(rateRow));
    $("rate-limits-box").hidden = list.length === 0;
  }

  // -- batches ------------------------------------------------------------------------------
  function progressBar(b) {
    const bar = el("div", "bar");
    for (const kind of ["completed", "failed", "cancelled", "running"]) {
      const part = el("span", kind);
      part.style.width = `${(100 * b.counts[kind]) / Math.max(b.total, 1)}%`;
      bar.appendChild(part);
    }
    return bar;
  }

  function budgetText(b) {
    const budget = b.budget || {};
    const limits = [];
    if (typeof budget.budget_usd === "number") limits.push(cost(budget.budget_usd));
    if (typeof budget.budget_tokens === "number") limits.push(`${num(budget.budget_tokens)} tokens`);
    const spent = cost(b.cost_usd);
    return limits.length ? `${spent} of ${limits.join(" / ")}${budget.passed ? " (passed)" : ""}` : spent;
  }

  function batchRow(b) {
    const row = el("tr");
    const ended = b.counts.completed + b.counts.failed + b.counts.cancelled;
    row.dataset.batch = b.batch_id;
    row.dataset.done = String(ended);
    row.dataset.total = String(b.total);
    if (state.filters.batch === b.batch_id) row.classList.add("selected");
    cell(row, b.batch_id, "mono b-id");
    cell(row, b.agent, "b-agent");
    cell(row, null, "wide").appendChild(progressBar(b));
    cell(row, `${ended}/${b.total}`, "b-done");
    cell(row, num(b.counts.running), "b-running");
    cell(row, num(b.counts.reserved), "b-queued");
    cell(row, num(b.counts.failed), "b-failed");
    cell(row, num(b.counts.cancelled), "b-cancelled");
    cell(row, num(b.usage.total_tokens));
    cell(row, budgetText(b), "b-cost");
    cell(row, elapsed(b.created_at, b.ended_at));
    row.addEventListener("click", () => setFilter("batch", b.batch_id));
    return row;
  }

  function renderBatches(batches) {
    replaceRows($("batches").tBodies[0], batches.map(batchRow));
    $("batches-empty").hidden = batches.length > 0;
  }

  function fillSelect(select, values, label) {
    const current = select.value;
    const options = [el("option", null, "any")];
    options[0].value = "";
    for (const v of values) {
      const opt = el("option", null, label ? label(v) : v);
      opt.value = v;
      options.push(opt);
    }
    if (current && !values.includes(current)) {
      const kept = el("option", null, current);
      kept.value = current;
      options.push(kept);
    }
    select.replaceChildren(...options);
    select.value = current;
  }

  // -- jobs ---------------------------------------------------------------------------------
  function setFilter(name, value) {
    state.filters[name] = value;
    $(`filter-${name}`).value = value;
    state.cursor = "0";
    state.history = [];
    if (state.overview && state.overview.batches) renderBatches(state.overview.batches);
    refreshJobs();
  }

  function jobRow(j) {
    const row = el("tr");
    row.dataset.job = j.job_id;
    row.dataset.status = j.status;
    if (j.job_id === state.selected) row.classList.add("selected");
    cell(row, j.job_id, "mono j-id");
    cell(row, j.display_name, "j-name");
    if (state.keyed) cell(row, j.key ?? "–", "mono j-key");
    cell(row, null, "j-status").appendChild(status(j.status));
    cell(row, j.outcome || "–");
    cell(row, j.model || "–");
    cell(row, num(j.turns));
    cell(row, num(j.usage.total_tokens));
    if (j.error) cell(row, j.error, "wide j-error error-text");
    else cell(row, j.progress || "", "wide j-progress");
    row.addEventListener("click", () => select(j.job_id));
    return row;
  }

  async function refreshJobs() {
    if (state.jobsBusy) {
      state.jobsAgain = true;
      return;
    }
    state.jobsBusy = true;
    try {
      const q = new URLSearchParams({ cursor: state.cursor, limit: "100" });
      for (const [k, v] of Object.entries(state.filters)) if (v) q.set(k, v);
      const page = await getJSON(`/api/jobs?${q}`);
      state.keyed = Boolean(page.keyed);
      $("jobs-key-head").hidden = !state.keyed;
      replaceRows($("jobs").tBodies[0], page.jobs.map(jobRow));
      const first = Number(state.cursor) + (page.jobs.length ? 1 : 0);
      const last = Number(state.cursor) + page.jobs.length;
      $("jobs-count").textContent = `${num(first)}–${num(last)} of ${num(page.total)}`;
      state.next = page.next_cursor;
      $("page-next").disabled = !page.next_cursor;
      $("page-prev").disabled = state.history.length === 0;
    } catch (err) {
      $("jobs-count").textContent = `could not load jobs: ${err.message}`;
    } finally {
      state.jobsBusy = false;
      if (state.jobsAgain) {
        state.jobsAgain = false;
        refreshJobs();
      }
    }
  }

  // -- one job ------------------------------------------------------------------------------
  function select(jobId) {
    state.selected = jobId;
    state.selectedStatus = null;
    state.eventsCursor = "0";
    $("events").tBodies[0].replaceChildren();
    $("detail").hidden = false;
    $("detail-title").textContent = jobId;
    for (const row of $("jobs").tBodies[0].rows) {
      row.classList.toggle("selected", row.dataset.job === jobId);
    }
    refreshDetail();
  }

  function renderFields(job) {
    const u = job.usage || {};
    const fields = [
      ["status", job.status],
      ["key", job.key],
      ["outcome", job.outcome],
      ["stop reason", job.stop_reason],
      ["agent", job.agent],
      ["batch", job.batch_id],
      ["parent", job.parent],
      ["model", job.model],
      ["turns", num(job.turns)],
      ["tokens", `${num(u.input_tokens)} in, ${num(u.output_tokens)} out`],
      [
        "cached",
        u.cache_read_tokens > 0
          ? `${num(u.cache_read_tokens)} read (${cached(u)} of input), ${num(u.cache_write_tokens)} written`
          : null,
      ],
      ["cost", typeof job.cost_usd === "number" ? cost(job.cost_usd) : null],
      ["host", job.host],
      ["restarts", num(job.restarts)],
      ["progress", job.progress && (job.progress.summary || JSON.stringify(job.progress))],
      ["detail", job.detail],
      ["created", clock(job.created_at)],
      ["started", clock(job.started_at)],
      ["ended", clock(job.ended_at)],
    ];
    const out = [];
    for (const [name, value] of fields) {
      if (value === null || value === undefined || value === "") continue;
      const dd = el("dd", null, value);
      dd.dataset.field = name;
      out.push(el("dt", null, name), dd);
    }
    $("detail-fields").replaceChildren(...out);
  }

  function renderTodos(todos) {
    const box = $("detail-todos-box");
    box.hidden = !Array.isArray(todos) || todos.length === 0;
    if (box.hidden) return;
    $("detail-todos").replaceChildren(
      ...todos.slice(0, 200).map((t) => {
        if (t === null || typeof t !== "object") return el("li", null, t);
        const text = t.content || t.text || t.title || JSON.stringify(t);
        return el("li", null, t.status ? `[${t.status}] ${text}` : text);
      }),
    );
  }

  function renderJob(data) {
    const job = data.job;
    state.selectedStatus = job.status;
    $("detail-title").textContent = `${job.display_name || job.job_id} · ${job.job_id}`;
    const error = $("detail-error");
    error.textContent = job.error || "";
    error.hidden = !job.error;
    renderFields(job);
    renderTodos(job.todos);
    $("detail-result-box").hidden = data.result === null || data.result === undefined;
    $("detail-result").textContent = data.result ?? "";
  }

  function eventText(fields) {
    const parts = [];
    for (const [k, v] of Object.entries(fields || {})) {
      if (k === "record") continue; // the run record repeats what the fields above show
      parts.push(`${k}=${typeof v === "string" ? v : JSON.stringify(v)}`);
    }
    const text = parts.join("  ");
    return text.length > 600 ? `${text.slice(0, 600)}…` : text;
  }

  function appendEvents(events) {
    const body = $("events").tBodies[0];
    for (const e of events) {
      const row = el("tr");
      row.dataset.type = e.type;
      cell(row, e.seq, "mono");
      cell(row, clock(e.ts));
      const kind = e.job_id === state.selected ? e.type : `${e.display_name}: ${e.type}`;
      cell(row, kind, "ev-type");
      cell(row, eventText(e.fields), "wide ev-text");
      body.appendChild(row);
    }
    while (body.rows.length > MAX_EVENT_ROWS) body.deleteRow(0);
  }

  async function refreshDetail() {
    if (!state.selected) return;
    if (state.detailBusy) {
      state.detailAgain = true;
      return;
    }
    state.detailBusy = true;
    const jobId = state.selected;
    try {
      const data = await getJSON(`/api/jobs/${encodeURIComponent(jobId)}`);
      if (jobId !== state.selected) return;
      renderJob(data);
      for (let pages = 0; pages < 5; pages += 1) {
        const q = new URLSearchParams({ cursor: state.eventsCursor });
        const page = await getJSON(`/api/jobs/${encodeURIComponent(jobId)}/events?${q}`);
        if (jobId !== state.selected) return;
        appendEvents(page.events);
        state.eventsCursor = page.cursor;
        if (page.events.length === 0) break;
      }
    } catch (err) {
      if (jobId === state.selected) {
        $("detail-error").textContent = `could not load this job: ${err.message}`;
        $("detail-error").hidden = false;
      }
    } finally {
      state.detailBusy = false;
      if (state.detailAgain) {
        state.detailAgain = false;
        refreshDetail();
      }
    }
  }

  // -- live updates -------------------------------------------------------------------------
  function onOverview(data) {
    state.overview = data;
    showBanner();
    if (!data.batches) return; // nothing read yet
    $("updated").textContent = `updated ${clock(data.fetched_at)}`;
    renderUsage(data.usage, data.capacity);
    renderRateLimits(data.rate_limits);
    renderBatches(data.batches);
    fillSelect($("filter-agent"), data.agents);
    fillSelect($("filter-batch"), data.batches.map((b) => b.batch_id), (id) => {
      const b = data.batches.find((x) => x.batch_id === id);
      return `${id} (${b.agent})`;
    });
    refreshJobs();
    refreshDetail();
  }

  function connect() {
    const source = new EventSource("/api/stream");
    let lost = null;
    source.addEventListener("open", () => {
      clearTimeout(lost);
      state.connected = true;
      showBanner();
    });
    source.addEventListener("overview", (e) => onOverview(JSON.parse(e.data)));
    source.addEventListener("error", () => {
      // A stream that ends on schedule reconnects within seconds: say nothing unless it stays
      // down. A refused one (closed) is opened again by hand.
      clearTimeout(lost);
      lost = setTimeout(() => {
        state.connected = false;
        showBanner();
      }, 3000);
      if (source.readyState === EventSource.CLOSED) {
        setTimeout(connect, 5000);
      }
    });
  }

  function init() {
    for (const name of ["status", "agent", "batch"]) {
      $(`filter-${name}`).addEventListener("change", (e) => setFilter(name, e.target.value));
    }
    $("filter-clear").addEventListener("click", () => {
      for (const name of ["status", "agent", "batch"]) state.filters[name] = "";
      for (const name of ["status", "agent", "batch"]) $(`filter-${name}`).value = "";
      setFilter("status", "");
    });
    $("page-next").addEventListener("click", () => {
      if (!state.next) return;
      state.history.push(state.cursor);
      state.cursor = state.next;
      refreshJobs();
    });
    $("page-prev").addEventListener("click", () => {
      state.cursor = state.history.pop() || "0";
      refreshJobs();
    });
    $("detail-close").addEventListener("click", () => {
      state.selected = null;
      $("detail").hidden = true;
      for (const row of $("jobs").tBodies[0].rows) row.classList.remove("selected");
    });
    setInterval(() => {
      // Events of a running job arrive between overview updates: read them now and then.
      if (state.selected && !TERMINAL.has(state.selectedStatus)) refreshDetail();
    }, DETAIL_POLL_MS);
    connect();
  }

  init();
})();
