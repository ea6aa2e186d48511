// Drives the coordinator's status page in headless Chromium (Debian's, through playwright-core) as a
// person would: the workers and a loss curve appear; a worker killed with SIGKILL is marked dead.
// Usage: node status_page.mjs URL OUT_DIR [--kill]. Writes OUT_DIR/result.json and screenshots;
// exits non-zero (with the reason on stderr) when the page does not show what it must.
import {chromium} from "playwright-core";
import {writeFileSync} from "node:fs";
import {join} from "node:path";
import {launchOptions, waitFor} from "./browser.mjs";

const [url, out, ...flags] = process.argv.slice(2);
const kill = flags.includes("--kill");
const workers = Number((flags.find((f) => f.startsWith("--workers=")) || "--workers=1").split("=")[1]);
const result = {url};
const browser = await chromium.launch(launchOptions());
try {
  const page = await browser.newPage({viewport: {width: 1400, height: 1100}});
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
  await page.goto(url);
  // Every worker training, and a loss curve with points.
  await waitFor(page, (n) => {
    const rows = document.querySelectorAll("#workers tbody tr");
    const chart = window.locoStatus && window.locoStatus.charts.loss;
    return rows.length >= n && chart && window.locoCharts.points(chart) >= 2 &&
           [...rows].every((r) => r.dataset.state === "training" || r.dataset.state === "syncing");
  }, workers, 90000, "every worker training and a loss curve on the page");
  result.rows = await page.$$eval("#workers tbody tr", (rows) => rows.map((r) => ({rank: Number(r.dataset.rank),
    pid: Number(r.dataset.pid), state: r.dataset.state, cells: [...r.cells].map((c) => c.textContent)})));
  result.loss_points = await page.evaluate(() => window.locoCharts.points(window.locoStatus.charts.loss));
  result.loss_series = await page.evaluate(() => window.locoStatus.charts.loss.series.slice(1).map((s) => s.label));
  result.timeline = await page.$$eval("#timeline li", (items) => items.map((li) => li.textContent));
  await page.screenshot({path: join(out, "status-page.png"), fullPage: true});
  if (kill) {
    const victim = result.rows.find((r) => r.rank === 1) || result.rows[0];
    result.killed = victim.pid;
    const start = Date.now();
    process.kill(victim.pid, "SIGKILL");
    await waitFor(page, (pid) => {
      const row = document.querySelector(`#workers tbody tr[data-pid="${pid}"]`);
      return row && (row.dataset.state === "dead" || row.dataset.state === "replaced");
    }, victim.pid, 30000, `worker pid ${victim.pid} marked dead`);
    result.dead_after_s = (Date.now() - start) / 1000;
    result.after_kill = await page.$$eval("#workers tbody tr", (rows) => rows.map((r) => ({pid: Number(r.dataset.pid),
      state: r.dataset.state})));
    result.failures = await page.$$eval("#timeline li.failure", (items) => items.map((li) => li.textContent));
    await page.screenshot({path: join(out, "status-page-after-kill.png"), fullPage: true});
  }
  result.errors = errors;
} finally {
  writeFileSync(join(out, "result.json"), JSON.stringify(result, null, 1));
  await browser.close();
}
