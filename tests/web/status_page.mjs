// Drives the status page in headless Chromium (Debian's, through playwright-core) as a person
// would. A coordinator run: every worker training and a loss curve appear; with --kill, a worker
// killed with SIGKILL is marked dead. A DiPaCo launch (--dipaco): its workers, task queue and
// module versions appear.
// Usage: node status_page.mjs URL OUT_DIR [--workers=N] [--kill] [--dipaco]. Writes
// OUT_DIR/result.json and screenshots; exits non-zero (the reason on stderr) when the page does not
// show what it must.
import {chromium} from "playwright-core";
import {writeFileSync} from "node:fs";
import {join} from "node:path";
import {launchOptions, openPage, waitFor} from "./browser.mjs";

const [url, out, ...flags] = process.argv.slice(2);
const kill = flags.includes("--kill");
const dipaco = flags.includes("--dipaco");
const workers = Number((flags.find((f) => f.startsWith("--workers=")) || "--workers=1").split("=")[1]);
const result = {url};

const rowsOf = (page) => page.$$eval("#workers tbody tr", (rows) => rows.map((r) => ({rank: Number(r.dataset.rank),
  pid: Number(r.dataset.pid), state: r.dataset.state, cells: [...r.cells].map((c) => c.textContent)})));

async function coordinatorRun(page) {
  await waitFor(page, (n) => {
    const rows = document.querySelectorAll("#workers tbody tr");
    const chart = window.locoStatus && window.locoStatus.charts.loss;
    return rows.length >= n && chart && window.locoCharts.points(chart) >= 2 &&
           [...rows].every((r) => r.dataset.state === "training" || r.dataset.state === "syncing");
  }, workers, 90000, "every worker training and a loss curve on the page");
  result.rows = await rowsOf(page);
  result.loss_points = await page.evaluate(() => window.locoCharts.points(window.locoStatus.charts.loss));
  result.loss_series = await page.evaluate(() => window.locoStatus.charts.loss.series.slice(1).map((s) => s.label));
  result.timeline = await page.$$eval("#timeline li", (items) => items.map((li) => li.textContent));
  await page.screenshot({path: join(out, "status-page.png"), fullPage: true});
  if (!kill) return;
  const victim = result.rows.find((r) => r.rank === 1) || result.rows[0];
  result.killed = victim.pid;
  const start = Date.now();
  process.kill(victim.pid, "SIGKILL");
  await waitFor(page, (pid) => {
    const row = document.querySelector(`#workers tbody tr[data-pid="${pid}"]`);
    return row && (row.dataset.state === "dead" || row.dataset.state === "replaced");
  }, victim.pid, 30000, `worker pid ${victim.pid} marked dead`);
  result.dead_after_s = (Date.now() - start) / 1000;
  result.after_kill = (await rowsOf(page)).map((r) => ({pid: r.pid, state: r.state}));
  result.failures = await page.$$eval("#timeline li.failure", (items) => items.map((li) => li.textContent));
  await page.screenshot({path: join(out, "status-page-after-kill.png"), fullPage: true});
}

async function dipacoRun(page) {
  await waitFor(page, (n) => {
    const rows = document.querySelectorAll("#workers tbody tr");
    const modules = [...document.querySelectorAll("#modules tbody tr")];
    const chart = window.locoStatus && window.locoStatus.charts.loss;
    return rows.length >= n && !document.getElementById("tasks-section").hidden && modules.length > 0 &&
           modules.some((m) => !m.cells[1].textContent.startsWith("0 ")) && chart && window.locoCharts.points(chart) >= 2;
  }, workers, 120000, "a DiPaCo run's workers, task queue, modules past version 0 and a loss curve");
  result.rows = await rowsOf(page);
  result.tasks = await page.textContent("#tasks");
  result.modules = await page.$$eval("#modules tbody tr", (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)));
  await page.screenshot({path: join(out, "status-page.png"), fullPage: true});
}

const browser = await chromium.launch(launchOptions());
try {
  const errors = [];
  const page = await openPage(browser, errors);
  await page.goto(url);
  await (dipaco ? dipacoRun(page) : coordinatorRun(page));
  result.errors = errors;
} finally {
  writeFileSync(join(out, "result.json"), JSON.stringify(result, null, 1));
  await browser.close();
}
