// Charts of the status page and of `loco report`: thin helpers over uPlot (window.uPlot).
"use strict";
window.locoCharts = (function () {
  const palette = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f",
                   "#a16207", "#4338ca", "#0f766e", "#b91c1c"];
  const color = (i) => palette[i % palette.length];

  function formatBytes(n) {
    if (n == null || !isFinite(n)) return "";
    const units = ["B", "kB", "MB", "GB", "TB"];
    let i = 0;
    while (Math.abs(n) >= 1000 && i < units.length - 1) { n /= 1000; i++; }
    return (i === 0 ? n.toFixed(0) : n.toPrecision(3)) + " " + units[i];
  }

  function widthOf(el) { return Math.max(320, el.clientWidth || 600); }

  // A line chart of series that share no x values: `tables` holds one [xs, ys] per series, and
  // `series` their {label, color, width, dash}. Returns the uPlot instance.
  // xLog: a logarithmic x axis; stepped: lines drawn as steps (counts that change at an instant).
  function lines(el, {xLabel, yLabel, series, tables, xValues, height, xLog, stepped}) {
    const data = tables.length ? uPlot.join(tables) : [[]];
    const paths = stepped ? uPlot.paths.stepped({align: 1}) : undefined;
    const opts = {
      width: widthOf(el), height: height || 300,
      scales: {x: xLog ? {time: false, distr: 3} : {time: false}},
      axes: [{label: xLabel, values: xValues}, {label: yLabel}],
      series: [{label: xLabel, value: xValues ? (u, v) => (v == null ? "–" : xValues(u, [v])[0]) : undefined}].concat(
        // A sparse curve (a few evaluations) shows its points, or a single one would not show at all.
        series.map((s, i) => ({label: s.label, stroke: s.color || color(i), width: s.width || 1.5, dash: s.dash,
                               spanGaps: true, points: {show: tables[i][0].length <= 40, size: 7, fill: s.color || color(i)},
                               paths}))),
    };
    el.textContent = "";
    const chart = new uPlot(opts, data, el);
    chart.locoTables = tables;
    return chart;
  }

  // A bar chart of one series: xs and ys.
  function bars(el, {xLabel, yLabel, label, xs, ys, yValues, height}) {
    const opts = {
      width: widthOf(el), height: height || 300,
      // Whole rounds on x, each bar whole; bytes from zero on y.
      scales: {x: {time: false, range: (u, min, max) => [min - 0.5, max + 0.5]},
               y: {range: (u, min, max) => [0, max > 0 ? max * 1.05 : 1]}},
      axes: [{label: xLabel, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000]},
             {label: yLabel, values: yValues, size: 70}],
      series: [{label: xLabel}, {label, fill: "#93c5fd", stroke: "#2563eb", paths: uPlot.paths.bars({size: [0.8, 40]}),
                                 points: {show: false}}],
    };
    el.textContent = "";
    return new uPlot(opts, [xs, ys], el);
  }

  // How many finite y values a chart holds (what the tests check, and a person sees).
  function points(chart) {
    let n = 0;
    for (let s = 1; s < chart.data.length; s++) for (const v of chart.data[s]) if (v != null && isFinite(v)) n++;
    return n;
  }

  return {palette, color, formatBytes, lines, bars, points, widthOf};
})();
