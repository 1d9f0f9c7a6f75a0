// The web console in a real Chromium, driven by playwright-core
// (crates/cli/tests/browser.rs runs this against a real `runway serve`).
//
//   RUNWAY_URL      the server, e.g. http://127.0.0.1:PORT
//   ADMIN_TOKEN     an admin token of that server
//   READ_TOKEN      a read-only token of that server
//   CHROMIUM        the browser binary (Debian's /usr/bin/chromium)
//   SCREENSHOTS     where to write console-overview.png and console-jobs.png
//
// The server has pool "ci" (a process provider that starts `runway agent
// --once` after three seconds) and pool "gpu" (registered runners only). Each step says what it checks;
// the first failure ends the run with a non-zero exit and its reason.

"use strict";

const http = require("node:http");
const path = require("node:path");
const fs = require("node:fs");
const { chromium } = require("playwright-core");

const BASE = process.env.RUNWAY_URL;
const ADMIN = process.env.ADMIN_TOKEN;
const READ = process.env.READ_TOKEN;
const LAPTOP = { width: 1366, height: 768 };

function fail(message) {
  throw new Error(message);
}

async function api(method, route, token, body) {
  const response = await fetch(BASE + route, {
    method,
    headers: {
      authorization: `Bearer ${token}`,
      ...(body === undefined ? {} : { "content-type": "application/json" }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch (_) {
    /* not JSON */
  }
  return { status: response.status, json, text };
}

async function must(method, route, token, body, expected) {
  const answer = await api(method, route, token, body);
  if (!expected.includes(answer.status)) {
    fail(`${method} ${route}: ${answer.status} ${answer.text}`);
  }
  return answer.json;
}

/// Polls `check` (an async function returning a truthy value when done)
/// until it holds or `seconds` pass.
async function until(what, seconds, check) {
  const deadline = Date.now() + seconds * 1000;
  let last;
  while (Date.now() < deadline) {
    try {
      last = await check();
      if (last) return last;
    } catch (error) {
      last = error.message;
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  fail(`timed out after ${seconds}s waiting until ${what} (last: ${last})`);
}

async function login(browser, token) {
  const context = await browser.newContext({ viewport: LAPTOP });
  const page = await context.newPage();
  await page.goto(BASE + "/");
  await page.fill("#token", token);
  await Promise.all([page.waitForURL(BASE + "/"), page.click("button[type=submit]")]);
  const cookies = await context.cookies();
  const session = cookies.find((c) => c.name === "runway_session");
  if (!session) fail("no session cookie after login");
  if (!session.httpOnly) fail("the session cookie is not HttpOnly");
  if (session.sameSite !== "Strict") fail(`the session cookie is SameSite=${session.sameSite}`);
  return { context, page };
}

async function step(name, body) {
  process.stdout.write(`- ${name} … `);
  await body();
  process.stdout.write("ok\n");
}

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM,
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  try {
    await run(browser);
  } finally {
    await browser.close();
  }
}

async function run(browser) {
  // Pool "ci" paused: its job waits, and says why.
  await must("POST", "/api/v1/pools/ci/pause", ADMIN, undefined, [200]);
  const job = (
    await must("POST", "/api/v1/jobs", ADMIN, { labels: ["linux"], script: "sleep 60" }, [201])
  ).id;
  for (let i = 0; i < 3; i++) {
    await must("POST", "/api/v1/jobs", ADMIN, { labels: ["gpu"], script: "true" }, [201]);
  }

  const reader = await login(browser, READ);
  await step("a read token sees the pools and no buttons", async () => {
    const page = reader.page;
    if (!(await page.locator("header .who").innerText()).includes("read only")) {
      fail("the header does not say read only");
    }
    if ((await page.locator("main button").count()) !== 0) fail("a read token sees buttons");
    if ((await page.locator("td a", { hasText: "ci" }).count()) === 0) fail("pool ci is missing");
  });

  await step("a queued job's wait reason updates live when a runner boots", async () => {
    const page = reader.page;
    await page.goto(`${BASE}/console/jobs?pool=ci`);
    const waiting = page.locator(`[data-live="job:${job}:waiting"]`);
    const state = page.locator(`[data-live="job:${job}:state"]`);
    if (!(await waiting.innerText()).includes("paused")) {
      fail(`before: the job waits for "${await waiting.innerText()}"`);
    }
    // Nothing reloads the page from here: a marker on window survives
    // only if the cells change in place (Server-Sent Events).
    await page.evaluate(() => (window.__stayed = true));
    await must("POST", "/api/v1/pools/ci/resume", ADMIN, undefined, [200]);
    const seen = await until("the job waits for the runner that boots", 30, async () => {
      const text = await waiting.innerText();
      return /booting|being started/.test(text) ? text : null;
    });
    await until("the job runs on the runner that booted", 60, async () =>
      (await state.innerText()) === "running"
    );
    if (!(await page.evaluate(() => window.__stayed === true))) fail("the page was reloaded");
    process.stdout.write(`(saw "${seen}") `);
  });

  const admin = await login(browser, ADMIN);
  let gpuRunner;
  await step("an admin drains a runner from the runners page", async () => {
    const token = (
      await must("POST", "/api/v1/registration-tokens", ADMIN, { pool: "gpu" }, [201])
    ).token;
    const registered = await fetch(BASE + "/api/v1/runners/register", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token, name: "gpu-runner-1", labels: ["gpu"] }),
    });
    if (registered.status !== 201) fail(`register: ${registered.status}`);
    gpuRunner = (await registered.json()).runner_id;
    const page = admin.page;
    await page.goto(`${BASE}/console/runners`);
    const row = page.locator("tr", { hasText: "gpu-runner-1" });
    await Promise.all([
      page.waitForURL(`${BASE}/console/runners`),
      row.locator("button", { hasText: "Drain" }).click(),
    ]);
    const runner = await must("GET", `/api/v1/runners/${gpuRunner}`, ADMIN, undefined, [200]);
    if (!runner.draining) fail(`runner ${gpuRunner} is not draining: ${JSON.stringify(runner)}`);
    const audit = await must("GET", "/api/v1/audit?limit=5", ADMIN, undefined, [200]);
    if (!audit.entries.some((e) => e.action === "runner.drain" && e.target === `runner ${gpuRunner}`)) {
      fail(`the drain is not in the audit trail: ${JSON.stringify(audit)}`);
    }
  });

  await step("an admin pauses a pool from the overview", async () => {
    const page = admin.page;
    await page.goto(`${BASE}/`);
    const row = page.locator("tr", { has: page.locator("td a", { hasText: /^gpu$/ }) });
    await Promise.all([page.waitForURL(`${BASE}/`), row.locator("button", { hasText: "Pause" }).click()]);
    if ((await row.locator(".tag").innerText()) !== "paused") fail("the row does not say paused");
    const pools = await must("GET", "/api/v1/pools", ADMIN, undefined, [200]);
    if (!pools.pools.find((p) => p.name === "gpu").paused) fail("the API does not say paused");
    const jobs = await must("GET", "/api/v1/jobs?pool=gpu&explain=true", ADMIN, undefined, [200]);
    if (!jobs.jobs.every((j) => j.waiting && j.waiting.code === "pool_paused")) {
      fail(`gpu's jobs do not wait for the pause: ${JSON.stringify(jobs.jobs.map((j) => j.waiting))}`);
    }
  });

  await step("terminating a busy runner asks first", async () => {
    const page = admin.page;
    const busy = await until("a busy runner in pool ci", 30, async () => {
      const list = await must("GET", "/api/v1/runners?pool=ci&state=busy", ADMIN, undefined, [200]);
      return list.runners[0];
    });
    await page.goto(`${BASE}/console/runners`);
    const row = page.locator("tr", { hasText: busy.name });
    let asked = null;
    page.once("dialog", (dialog) => {
      asked = dialog.message();
      dialog.dismiss();
    });
    await row.locator("button", { hasText: "Terminate" }).click();
    await until("the confirmation was asked", 5, async () => asked);
    const still = await must("GET", `/api/v1/runners/${busy.id}`, ADMIN, undefined, [200]);
    if (still.state !== "busy") fail(`dismissed, yet the runner is ${still.state}`);
    page.once("dialog", (dialog) => dialog.accept());
    await Promise.all([page.waitForURL(`${BASE}/console/runners`), row.locator("button", { hasText: "Terminate" }).click()]);
    const cancelled = await must("GET", `/api/v1/jobs/${job}`, ADMIN, undefined, [200]);
    if (cancelled.state !== "cancelled") fail(`the busy runner's job is ${cancelled.state}`);
    // The reader's jobs page, still open, follows the job to its end.
    const state = reader.page.locator(`[data-live="job:${job}:state"]`);
    await until("the reader's page shows the job cancelled", 10, async () =>
      (await state.innerText()) === "cancelled"
    );
    if (!(await reader.page.evaluate(() => window.__stayed === true))) fail("the page was reloaded");
  });

  await step("a forged cross-site POST is refused and changes nothing", async () => {
    // Another origin on the same machine (same site, so the session cookie
    // goes along: the CSRF token and the Origin check must stop it).
    const evil = http.createServer((_, response) => {
      response.setHeader("content-type", "text/html");
      response.end(
        `<form id="f" method="post" action="${BASE}/console/pools/ci/pause">` +
          `<input type="hidden" name="csrf" value="guessed"></form>` +
          `<script>document.getElementById("f").submit()</script>`
      );
    });
    await new Promise((resolve) => evil.listen(0, "127.0.0.1", resolve));
    try {
      const page = await admin.context.newPage();
      const answered = page.waitForResponse((r) => r.url() === `${BASE}/console/pools/ci/pause`);
      await page.goto(`http://127.0.0.1:${evil.address().port}/`);
      const response = await answered;
      if (response.status() !== 403) fail(`the forged POST got ${response.status()}`);
      const pools = await must("GET", "/api/v1/pools", ADMIN, undefined, [200]);
      if (pools.pools.find((p) => p.name === "ci").paused) fail("the forged POST paused ci");
    } finally {
      evil.close();
    }
  });

  await step("logging out ends the session: its cookie, replayed, opens nothing and changes nothing", async () => {
    const leaving = await login(browser, ADMIN);
    const page = leaving.page;
    await page.goto(`${BASE}/console/jobs`);
    const csrf = await page.locator("input[name=csrf]").first().inputValue();
    const [old] = (await leaving.context.cookies()).filter((c) => c.name === "runway_session");
    await Promise.all([page.waitForURL(`${BASE}/`), page.locator("button", { hasText: "Log out" }).click()]);
    if ((await page.locator("#token").count()) !== 1) fail("no login page after logging out");
    // Another browser that stole the cookie and the CSRF token.
    const thief = await browser.newContext({ viewport: LAPTOP });
    await thief.addCookies([old]);
    const stolen = await thief.newPage();
    await stolen.goto(`${BASE}/console/jobs`);
    if ((await stolen.locator("#token").count()) !== 1) fail(`the replayed cookie opened ${stolen.url()}`);
    const answer = await stolen.request.post(`${BASE}/console/pools/ci/pause`, {
      form: { csrf },
      headers: { origin: BASE },
      maxRedirects: 0,
    });
    if (answer.status() !== 303 || answer.headers()["location"] !== "/") {
      fail(`the replayed POST got ${answer.status()} to ${answer.headers()["location"]}`);
    }
    const pools = await must("GET", "/api/v1/pools", ADMIN, undefined, [200]);
    if (pools.pools.find((p) => p.name === "ci").paused) fail("the replayed POST paused ci");
    await thief.close();
    await leaving.context.close();
    // The other sessions go on.
    await admin.page.goto(`${BASE}/console/jobs`);
    if ((await admin.page.locator("#token").count()) !== 0) fail("another session ended too");
  });

  await step("a token replaced in the config and reloaded ends its sessions", async () => {
    const ops = await login(browser, process.env.OPS_TOKEN);
    await ops.page.goto(`${BASE}/console/jobs`);
    if ((await ops.page.locator("#token").count()) !== 0) fail("the ops token did not log in");
    const file = process.env.CONFIG_FILE;
    const config = fs.readFileSync(file, "utf8");
    fs.writeFileSync(file, config.replace(process.env.OPS_TOKEN, "browser-test-ops-token-rotated"));
    await must("POST", "/api/v1/config/reload", ADMIN, undefined, [200]);
    await ops.page.goto(`${BASE}/console/jobs`);
    if ((await ops.page.locator("#token").count()) !== 1) fail(`the replaced token's session still opened ${ops.page.url()}`);
    await ops.context.close();
    await admin.page.goto(`${BASE}/console/jobs`);
    if ((await admin.page.locator("#token").count()) !== 0) fail("the reload ended another token's session");
  });

  await step("an admin's \"End all sessions\" ends every one, its own too", async () => {
    const other = await login(browser, READ);
    const ender = await login(browser, ADMIN);
    ender.page.on("dialog", (dialog) => dialog.accept());
    await Promise.all([
      ender.page.waitForURL(`${BASE}/`),
      ender.page.locator("button", { hasText: "End all sessions" }).click(),
    ]);
    for (const [who, session] of [["the admin's own", ender], ["another browser's", other], ["the first admin's", admin]]) {
      await session.page.goto(`${BASE}/console/jobs`);
      if ((await session.page.locator("#token").count()) !== 1) fail(`${who} session was not ended`);
    }
    await other.context.close();
    await ender.context.close();
    // The steps after this one work as a new admin session.
    const again = await login(browser, ADMIN);
    admin.page = again.page;
    admin.context = again.context;
  });

  await step("a pool page charts its seeded hour, the overview its sparkline", async () => {
    const seeded = Number(process.env.SEEDED_MINUTES);
    // The server's sampler adds a minute or two of its own meanwhile.
    const fits = (points) => points >= seeded && points <= seeded + 3;
    const page = admin.page;
    await page.goto(`${BASE}/`);
    const spark = page.locator('svg.sparkline[aria-label="ci queued, last hour"]');
    const sparkPoints = Number(await spark.getAttribute("data-points"));
    if (!fits(sparkPoints)) fail(`the overview's sparkline has ${sparkPoints} points, seeded ${seeded}`);
    if (!((await spark.boundingBox()) || {}).width) fail("the sparkline is not drawn");
    await Promise.all([page.waitForURL(`${BASE}/console/pools/ci`), page.click('td a[href="/console/pools/ci"]')]);
    const charts = page.locator("svg.chart");
    if ((await charts.count()) !== 4) fail(`the pool page has ${await charts.count()} charts`);
    for (let i = 0; i < 4; i++) {
      const chart = charts.nth(i);
      if ((await chart.getAttribute("data-buckets")) !== "60") fail(`chart ${i} is not an hour of minutes`);
      const box = await chart.boundingBox();
      if (!box || box.width < 300 || box.height < 100) fail(`chart ${i} is not drawn: ${JSON.stringify(box)}`);
    }
    const queued = page.locator('svg.chart path[data-series="queued"]');
    const points = Number(await queued.getAttribute("data-points"));
    if (!fits(points)) fail(`the queued line has ${points} points, seeded ${seeded}`);
    // One "M" then an "L" per further point: a line through every one.
    const d = await queued.getAttribute("d");
    if ((d.match(/[ML]/g) || []).length !== points) fail(`the path draws ${d}`);
    if (!(await page.locator("table.waits").innerText()).includes("the pool was at max_runners")) {
      fail("the wait-reason breakdown is missing");
    }
    await page.click('a[href="/console/pools/ci?range=day"]');
    await page.waitForURL(`${BASE}/console/pools/ci?range=day`);
    if ((await page.locator("svg.chart").first().getAttribute("data-buckets")) !== "288") {
      fail("the day chart is not 288 five-minute buckets");
    }
  });

  await step("a 10,000-deep paused queue keeps its reasons while streaming; Older and Newer walk it", async () => {
    const deep = Number(process.env.DEEP);
    const page = admin.page;
    await page.goto(`${BASE}/console/jobs?pool=deep`);
    const reasons = page.locator('[data-live$=":waiting"]');
    const shown = await reasons.count();
    if (shown !== 50) fail(`the first page shows ${shown} jobs`);
    // Five seconds of the live stream: no reason is blanked or changed.
    await page.waitForTimeout(5000);
    const texts = await reasons.allInnerTexts();
    const wrong = texts.filter((t) => !t.includes("paused"));
    if (wrong.length) fail(`${wrong.length} of the first page's reasons lost the pause: ${JSON.stringify(wrong.slice(0, 3))}`);
    const ids = async () =>
      (await page.locator('[data-live^="job:"][data-live$=":state"]').evaluateAll((cells) =>
        cells.map((c) => Number(c.getAttribute("data-live").split(":")[1]))));
    const walk = async (rel) => {
      const seen = [];
      for (let pages = 0; pages < deep / 50 + 2; pages++) {
        const onPage = await ids();
        for (let i = 1; i < onPage.length; i++) {
          if (onPage[i] >= onPage[i - 1]) fail(`page ${page.url()} is not newest first`);
        }
        seen.push(...onPage);
        const link = page.locator(`a[rel="${rel}"]`);
        if ((await link.count()) === 0) return seen;
        await page.goto(new URL(await link.getAttribute("href"), BASE).href);
      }
      fail(`following ${rel} never ended`);
    };
    const older = await walk("next");
    if (older.length !== deep || new Set(older).size !== deep) {
      fail(`Older walked ${older.length} jobs, ${new Set(older).size} different, of ${deep}`);
    }
    const newer = await walk("prev");
    if (newer.length !== deep || new Set(newer).size !== deep) {
      fail(`Newer walked ${newer.length} jobs, ${new Set(newer).size} different, of ${deep}`);
    }
  });

  await step("screenshots of the console on a laptop screen", async () => {
    const page = admin.page;
    await page.goto(`${BASE}/`);
    await page.screenshot({ path: path.join(process.env.SCREENSHOTS, "console-overview.png") });
    await page.goto(`${BASE}/console/jobs`);
    await page.screenshot({ path: path.join(process.env.SCREENSHOTS, "console-jobs.png") });
    await page.goto(`${BASE}/console/pools/ci`);
    await page.screenshot({ path: path.join(process.env.SCREENSHOTS, "console-pool.png"), fullPage: true });
  });
}

main().then(
  () => process.exit(0),
  (error) => {
    process.stdout.write(`FAILED\n${error.stack || error}\n`);
    process.exit(1);
  }
);
