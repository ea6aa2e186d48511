// What the browser tests share: how Chromium is started, and waiting for a condition on a page.
import {existsSync} from "node:fs";

// Debian's chromium (scripts/setup.sh installs it), or $LOCO_CHROMIUM. Headless, with a fresh
// profile (playwright makes a temporary one), and nothing that would reach the internet (no
// updates, sync or background networking).
export function launchOptions() {
  const executablePath = process.env.LOCO_CHROMIUM || "/usr/bin/chromium";
  if (!existsSync(executablePath)) throw new Error(`no browser at ${executablePath}`);
  return {
    executablePath, headless: true, timeout: 60000,
    args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
  };
}

// A new page whose script errors and console errors are collected into `errors`.
export async function openPage(browser, errors, viewport = {width: 1400, height: 1100}) {
  const page = await browser.newPage({viewport});
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
  return page;
}

// Polls `condition(arg)` in the page every 100 ms until it holds; throws naming `what` after `ms`.
export async function waitFor(page, condition, arg, ms, what) {
  try {
    await page.waitForFunction(condition, arg, {timeout: ms, polling: 100});
  } catch (e) {
    throw new Error(`the page did not show ${what} within ${ms / 1000} s`);
  }
}
