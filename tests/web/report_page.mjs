// Opens a `loco report --html` file in headless Chromium from disk, with the network cut off (the
// report must be self-contained), and says what its charts hold.
// Usage: node report_page.mjs REPORT.html OUT_DIR. Writes OUT_DIR/result.json and report.png.
import {chromium} from "playwright-core";
import {writeFileSync} from "node:fs";
import {join, resolve} from "node:path";
import {pathToFileURL} from "node:url";
import {launchOptions, openPage, waitFor} from "./browser.mjs";

const [file, out] = process.argv.slice(2);
const result = {file, requests: []};
const browser = await chromium.launch(launchOptions());
try {
  const errors = [];
  const page = await openPage(browser, errors, {width: 1400, height: 1000});
  // Anything but the file itself would be a request beyond it: recorded, and refused.
  await page.route("**/*", (route) => {
    const url = route.request().url();
    if (url.startsWith("file:")) return route.continue();
    result.requests.push(url);
    return route.abort();
  });
  await page.goto(pathToFileURL(resolve(file)).href);
  await waitFor(page, () => window.locoReport && window.locoReport.ready, null, 30000, "the report's charts drawn");
  result.charts = await page.evaluate(() => Object.fromEntries(Object.entries(window.locoReport.charts).map(([id, chart]) =>
    [id, {points: window.locoCharts.points(chart), series: chart.series.slice(1).map((s) => s.label)}])));
  result.rows = await page.$$eval("#runs tbody tr", (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)));
  result.errors = errors;
  await page.screenshot({path: join(out, "report.png"), fullPage: true});
} finally {
  writeFileSync(join(out, "result.json"), JSON.stringify(result, null, 1));
  await browser.close();
}
