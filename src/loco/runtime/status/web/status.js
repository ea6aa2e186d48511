// The coordinator's status page: polls GET v1/status every second and draws the run.
"use strict";
(function () {
  const key = new URLSearchParams(location.search).get("key");
  const api = (path) => (key ? `${path}?key=${encodeURIComponent(key)}` : path);
  const $ = (id) => document.getElementById(id);
  const C = window.locoCharts;
  const charts = {loss: null, lossSignature: "", bytes: null, bytesRounds: -1};
  window.locoStatus = {updates: 0, charts, last: null};

  const fixed = (v, digits) => (v == null || !isFinite(v) ? "–" : Number(v).toFixed(digits));
  const clock = (t) => new Date(t * 1000).toLocaleTimeString([], {hour12: false});
  const ago = (s) => (s == null ? "never" : s < 1 ? "now" : `${s.toFixed(0)} s ago`);

  function cell(row, text, className) {
    const td = row.insertCell();
    td.textContent = text;
    if (className) td.className = className;
    return td;
  }

  function renderHeader(s) {
    const run = s.run;
    $("run-dir").textContent = run.run_dir || "";
    const parts = [`${run.algorithm || ""}`, `phase ${run.phase}`, `epoch ${run.epoch}`];
    if (run.elastic) {
      parts.push(`${run.elastic.rounds_completed} rounds completed`);
    } else if (s.rounds.length) {
      parts.push(`round ${s.rounds[s.rounds.length - 1][0]}`);  // the latest any worker reported
    }
    parts.push(`${s.workers.length} process(es) of ${run.workers} worker(s)`);
    if (run.run_id) parts.push(`run ${run.run_id}`);
    if (run.stopping) parts.push(`stopping: ${run.reason}`);
    $("run-line").textContent = parts.join(" · ");
  }

  function renderWorkers(s) {
    const body = $("workers").tBodies[0];
    body.textContent = "";
    for (const w of s.workers) {
      const row = body.insertRow();
      row.dataset.rank = w.rank;
      row.dataset.state = w.state;
      row.dataset.pid = w.pid;
      cell(row, w.member != null ? `${w.rank} (member ${w.member})` : `${w.rank}`);
      cell(row, w.host);
      cell(row, `${w.pid}`);
      const state = cell(row, "");
      const badge = document.createElement("span");
      badge.className = `state state-${w.state}`;
      badge.textContent = w.state + (w.exit_status != null && w.exit_status !== 0 ? ` (exit ${w.exit_status})` : "");
      state.appendChild(badge);
      cell(row, `${w.step}${s.run.steps ? " / " + s.run.steps : ""}`);
      cell(row, fixed(w.tokens_per_s, 0));
      cell(row, fixed(w.loss, 4));
      cell(row, w.utilization == null ? "–" : `${(100 * w.utilization).toFixed(1)}%`);
      cell(row, C.formatBytes(w.bytes_sent) || "–");
      cell(row, ago(w.last_report_s));
    }
  }

  function renderLoss(s) {
    const series = [], tables = [];
    s.loss.forEach((curve) => {
      if (curve.points.length === 0) return;
      const w = s.workers[curve.worker];
      series.push({label: `worker ${curve.rank} (pid ${w.pid})`, color: C.color(curve.worker)});
      tables.push([curve.points.map((p) => p[1]), curve.points.map((p) => p[3])]);
    });
    if (s.val.length) {
      series.push({label: "validation (global)", color: "#111827", width: 2.5});
      tables.push([s.val.map((p) => p[1]), s.val.map((p) => p[3])]);
    }
    const el = $("loss-chart");
    if (!tables.length) {
      el.innerHTML = '<p class="empty">no loss reported yet</p>';
      charts.loss = null;
      return;
    }
    const signature = series.map((x) => x.label).join("|");
    if (charts.loss && charts.lossSignature === signature) {
      charts.loss.setData(uPlot.join(tables));
      charts.loss.locoTables = tables;
    } else {
      charts.loss = C.lines(el, {xLabel: "step", yLabel: "loss (nats)", series, tables});
      charts.lossSignature = signature;
    }
  }

  function renderBytes(s) {
    const el = $("bytes-chart");
    if (!s.rounds.length) {
      el.innerHTML = '<p class="empty">no synchronization yet</p>';
      charts.bytes = null;
      return;
    }
    const xs = s.rounds.map((r) => r[0]), ys = s.rounds.map((r) => r[2]);
    if (charts.bytes) {
      charts.bytes.setData([xs, ys]);
    } else {
      charts.bytes = C.bars(el, {xLabel: "round", yLabel: "bytes", label: "bytes sent", xs, ys,
                                 yValues: (u, v) => v.map(C.formatBytes)});
    }
  }

  // The task queue: an elastic run's (counts), or a DiPaCo run's (counts, who holds what, and each
  // module's version).
  function renderTasks(s) {
    const elastic = s.run.elastic && s.run.elastic.tasks, dipaco = s.run.dipaco;
    $("tasks-section").hidden = !elastic && !dipaco;
    $("modules-section").hidden = !dipaco;
    const leased = $("leased");
    leased.textContent = "";
    if (elastic) {
      $("tasks").textContent = `open ${elastic.open} · leased ${elastic.leased} · issued ${elastic.issued} · ` +
                               `reissued ${elastic.reissued} · done ${elastic.done}`;
    }
    if (!dipaco) return;
    const t = dipaco.tasks;
    $("tasks").textContent = `open ${t.open} · leased ${t.leased} · waiting ${t.waiting} · done ${t.done} · ` +
                             `cancelled ${t.cancelled} · issued again ${dipaco.reissued}`;
    for (const task of dipaco.leased) {
      const li = document.createElement("li");
      li.textContent = `${task.task}: ${task.holder}`;
      leased.appendChild(li);
    }
    const body = $("modules").tBodies[0];
    body.textContent = "";
    for (const m of dipaco.modules) {
      const row = body.insertRow();
      row.dataset.module = m.module;
      row.insertCell().textContent = m.module;
      row.insertCell().textContent = m.version == null ? "–" : `${m.version} of ${m.of}`;
    }
  }

  function renderTimeline(s) {
    const list = $("timeline");
    list.textContent = "";
    // Newest first. Workers' events carry the time they happened and arrive within a second, so
    // the list is ordered by time, not by arrival.
    for (const e of s.events.slice().sort((a, b) => b.time - a.time)) {
      const li = document.createElement("li");
      li.textContent = `${clock(e.time)}  ${e.who}: ${e.text}`;
      if (e.failure) li.className = "failure";
      list.appendChild(li);
    }
  }

  function render(s) {
    renderHeader(s);
    renderWorkers(s);
    renderLoss(s);
    renderBytes(s);
    renderTasks(s);
    renderTimeline(s);
  }

  async function poll() {
    try {
      const response = await fetch(api("v1/status"), {cache: "no-store"});
      if (!response.ok) throw new Error(`HTTP ${response.status}: ${(await response.text()).slice(0, 300)}`);
      const s = await response.json();
      render(s);
      window.locoStatus.last = s;
      window.locoStatus.updates++;
      document.body.dataset.updates = window.locoStatus.updates;
      $("connection").textContent = `updated ${clock(s.time)}`;
      $("connection").className = "connection";
    } catch (e) {
      $("connection").textContent = `the coordinator does not answer (${e.message}); the last state stays on the page`;
      $("connection").className = "connection lost";
    }
    setTimeout(poll, 1000);
  }

  window.addEventListener("resize", () => {
    for (const chart of [charts.loss, charts.bytes]) {
      if (chart) chart.setSize({width: C.widthOf(chart.root.parentNode), height: 300});
    }
  });
  poll();
})();
