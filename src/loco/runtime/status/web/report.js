// `loco report --html`: the runs' table and their curves overlaid, from the data inlined in the page.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const C = window.locoCharts;
  const charts = {};
  window.locoReport = {charts, ready: false};

  const fixed = (v, digits) => (v == null || !isFinite(v) ? "–" : Number(v).toFixed(digits));
  const percent = (v) => (v == null || !isFinite(v) ? "–" : `${(100 * v).toFixed(1)}%`);
  const seconds = (v) => (v == null ? "–" : v >= 120 ? `${(v / 60).toFixed(1)} min` : `${v.toFixed(1)} s`);

  function table() {
    const columns = [
      ["run", (r) => r.name + (r.finished ? "" : " (unfinished)")], ["algorithm", (r) => r.algorithm],
      ["workers", (r) => r.workers], ["steps/worker", (r) => r.steps], ["tokens (all)", (r) => r.tokens],
      ["val_loss", (r) => fixed(r.val_loss, 4)], ["sent/worker", (r) => C.formatBytes(r.bytes_sent) || "–"],
      ["compute util.", (r) => percent(r.compute_utilization)], ["end to end", (r) => percent(r.end_to_end_utilization)],
      ["wall", (r) => seconds(r.wall_s)]];
    const head = document.querySelector("#runs thead").insertRow();
    for (const [name] of columns) {
      const th = document.createElement("th");
      th.textContent = name;
      head.appendChild(th);
    }
    const body = document.querySelector("#runs tbody");
    for (const r of data.reports) {
      const row = body.insertRow();
      for (const [, value] of columns) row.insertCell().textContent = value(r);
    }
  }

  // One chart of every run's curve `key`, x and y taken from columns of its points.
  function overlay(id, key, x, y, options) {
    const series = [], tables = [];
    data.curves.forEach((c, i) => {
      const points = c[key].filter((p) => p[x] != null && p[y] != null && (!options.xLog || p[x] > 0));
      if (!points.length) return;
      series.push({label: c.label, color: C.color(i), width: 2});
      tables.push([points.map((p) => p[x]), points.map((p) => (options.scale ? options.scale * p[y] : p[y]))]);
    });
    const el = document.getElementById(id);
    if (!tables.length) {
      el.innerHTML = '<p class="empty">no run has this curve</p>';
      return;
    }
    charts[id] = C.lines(el, Object.assign({series, tables}, options));
  }

  table();
  overlay("loss-tokens", "val", 1, 4, {xLabel: "tokens (all workers)", yLabel: "validation loss (nats)"});
  overlay("loss-bytes", "val", 2, 4, {xLabel: "bytes sent (all workers)", yLabel: "validation loss (nats)", xLog: true,
                                      xValues: (u, v) => v.map(C.formatBytes)});
  overlay("loss-wall", "val", 3, 4, {xLabel: "seconds since the start", yLabel: "validation loss (nats)"});
  overlay("train-loss", "train", 0, 2, {xLabel: "step", yLabel: "training loss (nats)"});
  overlay("utilization", "utilization", 0, 1, {xLabel: "seconds since the start", yLabel: "utilization (%)", scale: 100});
  overlay("membership", "membership", 0, 1, {xLabel: "seconds since the start", yLabel: "workers", stepped: true});
  window.locoReport.ready = true;
})();
