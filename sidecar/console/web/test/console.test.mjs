// The operator console in a real browser (Debian's Chromium, driven by playwright-core)
// against a real daemon: sign in, the pages, the terminal, files, release, and the
// refusals. Screenshots of each page go to $CONSOLE_SCREENSHOTS (default
// test-results/), for a person to look at; they are not committed.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { startDaemon } from "./daemon.mjs";

const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const shots = process.env.CONSOLE_SCREENSHOTS ?? "test-results";
const CSRF = "X-Sidecar-Console";

let d, browser, context, page, origin, leaseA, leaseB;
const problems = []; // CSP violations and page errors
const foreign = []; // requests that left the daemon

before(async () => {
  mkdirSync(shots, { recursive: true });
  d = await startDaemon();
  origin = new URL(d.url).origin;
  leaseA = JSON.parse((await d.api("POST", "/v1/leases", { session_id: "console-a", labels: { team: "blue" } })).body);
  leaseB = JSON.parse((await d.api("POST", "/v1/leases", { session_id: "console-b" })).body);
  assert.equal((await d.api("PUT", `/v1/leases/${leaseA.id}/files/report.txt`, "the report\n")).status, 201);
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    // Playwright gives the browser a fresh profile of its own (--user-data-dir).
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
      "--disable-sync", "--no-first-run", "--disable-quic"],
  });
  // The daemon's certificate is self-signed for this run.
  context = await browser.newContext({ ignoreHTTPSErrors: true, acceptDownloads: true, viewport: { width: 1280, height: 900 } });
  page = await context.newPage();
  page.on("console", (m) => { if (/Content.Security.Policy|Refused to/i.test(m.text())) problems.push(m.text()); });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("request", (r) => {
    const u = r.url();
    if (!u.startsWith(origin + "/") && !u.startsWith(origin.replace("https:", "wss:") + "/") && !u.startsWith("blob:") && !u.startsWith("data:")) foreign.push(u);
  });
});

after(async () => {
  await browser?.close();
  await d?.stop();
});

const shot = (name) => page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });

// screenText is what the terminal shows now.
const screenText = () => page.locator("#xterm .xterm-rows").innerText();

// waitScreen waits until the terminal's screen matches re, and returns the match.
async function waitScreen(re) {
  let m = null;
  await page.waitForFunction(() => true); // the page is alive
  const deadline = Date.now() + 20_000;
  while (!(m = re.exec(await screenText()))) {
    if (Date.now() > deadline) throw new Error(`the terminal never showed ${re}; it shows:\n${await screenText()}`);
    await page.waitForTimeout(50);
  }
  return m;
}

async function run(command) {
  await page.locator("#xterm .xterm-helper-textarea").focus();
  await page.keyboard.type(command);
  await page.keyboard.press("Enter");
}

test("the console in a browser: sign-in, leases, terminal, files, release", { timeout: 150_000 }, async () => {
  // No cookie: the sign-in page.
  await page.goto(`${origin}/ui/`);
  await page.waitForSelector("#signin");
  assert.match(page.url(), /#\/signin$/);
  await shot("1-sign-in");

  await page.fill("#token", "not-the-token-but-long-enough-to-be-checked");
  await page.click("#signin button[type=submit]");
  await page.waitForSelector("#signin-error:has-text('refused')");

  await page.fill("#token", d.token);
  await page.click("#signin button[type=submit]");
  await page.waitForSelector(`#leases tr[data-lease="${leaseA.id}"]`);
  await page.waitForSelector(`#leases tr[data-lease="${leaseB.id}"]`);
  await page.waitForSelector("#daemon table.kv");
  assert.match(await page.locator("#daemon").innerText(), /isolation/);
  assert.match(await page.locator("#cert").innerText(), /^expires \d{4}-\d\d-\d\d, in \d+d/);
  await shot("2-daemon-and-leases");

  // The session: an HttpOnly, Secure, SameSite=Strict cookie; the token nowhere.
  const cookies = await context.cookies();
  assert.equal(cookies.length, 1, JSON.stringify(cookies));
  const [ck] = cookies;
  assert.equal(ck.name, "__Host-sidecar-console");
  assert.ok(ck.httpOnly && ck.secure && ck.sameSite === "Strict", JSON.stringify(ck));
  assert.notEqual(ck.value, d.token);
  const seen = await page.evaluate(() => ({
    url: location.href, html: document.documentElement.outerHTML, cookie: document.cookie,
    local: JSON.stringify({ ...localStorage }), session: JSON.stringify({ ...sessionStorage }),
  }));
  for (const [where, text] of Object.entries(seen)) assert.ok(!text.includes(d.token), `the token is in the page's ${where}`);
  assert.equal(seen.local, "{}");
  assert.equal(seen.session, "{}");
  assert.equal(seen.cookie, "", "the session cookie is readable by script");

  // The filter.
  await page.fill("#filter", "team=blue");
  await page.waitForSelector(`#leases tr[data-lease="${leaseB.id}"]`, { state: "detached" });
  await page.fill("#filter", "");

  // One lease: its summary, files, download, upload.
  const usage = page.waitForResponse((r) => r.url().endsWith(`/v1/leases/${leaseA.id}/usage`));
  await page.click(`#leases tr[data-lease="${leaseA.id}"] a.lease-link`);
  await page.waitForSelector("#summary table.kv");
  assert.equal((await usage).status(), 200);
  // The network row: the lease's policy as the API states it, and its traffic.
  const leaseInfo = JSON.parse((await d.api("GET", `/v1/leases/${leaseA.id}`)).body);
  const summary = await page.locator("#summary").innerText();
  assert.match(summary, new RegExp(`network\\s+${leaseInfo.network.egress}`));
  assert.ok(!summary.includes("[object"), summary);
  assert.match(summary, new RegExp(`image\\s+${leaseInfo.image}`));
  assert.match(summary, leaseInfo.network_stats ? /traffic\s+[\d.]+ \S+ sent, [\d.]+ \S+ received; connections \d+ allowed/ : /traffic\s+— \(host network\)/);
  const hist = JSON.parse((await d.api("GET", `/v1/leases/${leaseA.id}/usage`)).body);
  assert.equal(hist.interval_seconds, 10);
  await page.waitForSelector("#charts figure.chart");
  await page.waitForSelector('#files tr[data-file="report.txt"]');
  const [download] = await Promise.all([page.waitForEvent("download"), page.click('#files a.file[data-name="report.txt"]')]);
  assert.equal(download.suggestedFilename(), "report.txt");
  assert.equal(readFileSync(await download.path(), "utf8"), "the report\n");
  await page.setInputFiles("#upload", { name: "uploaded.txt", mimeType: "text/plain", buffer: Buffer.from("from the browser\n") });
  await page.waitForSelector('#files tr[data-file="uploaded.txt"]');
  const got = await d.api("GET", `/v1/leases/${leaseA.id}/files/uploaded.txt`);
  assert.equal(got.body, "from the browser\n");

  // A background process: its output followed, then killed; a leftover killed.
  const bg = JSON.parse((await d.api("POST", `/v1/leases/${leaseA.id}/processes`, { argv: ["sh", "-c", "for i in 1 2 3; do echo line-$i; done; exec sleep 600"] })).body);
  assert.equal((await d.api("POST", `/v1/leases/${leaseA.id}/exec`, { argv: ["sh", "-c", "sleep 601 >/dev/null 2>&1 &"] })).status, 200);
  await page.click(`#processes tr[data-pid="${bg.pid}"] button.follow`);
  await page.waitForSelector("#output:has-text('line-3')");
  await page.click(`#processes tr[data-pid="${bg.pid}"] button.danger`);
  await page.click("dialog.confirm button.danger");
  await page.waitForSelector("#output:has-text('[ended: signal KILL]')");
  const leftover = page.locator("#processes tr[data-leftover]");
  await leftover.waitFor();
  const lpid = await leftover.getAttribute("data-leftover");
  await leftover.locator("button.danger").click();
  await page.click("dialog.confirm button.danger");
  await page.waitForSelector(`#processes tr[data-leftover="${lpid}"]`, { state: "detached" });
  assert.equal(JSON.parse((await d.api("GET", `/v1/leases/${leaseA.id}`)).body).leftover_count, 0);

  // The terminal: a command's output read back from the screen, and a resize.
  await page.click("#open-terminal");
  await page.waitForSelector(".term-status:has-text('connected')");
  await run("echo hi; echo sum-$((40+2))");
  await waitScreen(/^sum-42\s*$/m);
  await run("stty size; echo size-done");
  const [, rows1, cols1] = await waitScreen(/^(\d+) (\d+)\s*\n\s*size-done/m);
  await page.setViewportSize({ width: 900, height: 900 });
  await run("clear; stty size; echo size2-done");
  const [, rows2, cols2] = await waitScreen(/^(\d+) (\d+)\s*\n\s*size2-done/m);
  assert.equal(rows2, rows1);
  assert.ok(Number(cols2) < Number(cols1), `columns ${cols1} → ${cols2} after a narrower window`);
  await shot("3-lease-and-terminal");
  // The terminal's shell is one of the lease's processes, shown with its kill button.
  await page.waitForSelector("#processes tr[data-pid] td:has-text('tty')");

  // The refusals, from the signed-in page itself: a state-changing request without the
  // console's header is refused, and nothing is created.
  const csrf = await page.evaluate(async () => {
    const r = await fetch("/v1/leases", { method: "POST", headers: { "Content-Type": "application/json" }, body: '{"session_id":"csrf"}' });
    return { status: r.status, body: await r.text() };
  });
  assert.equal(csrf.status, 403, csrf.body);
  // A cross-site request with the cookie (what another site's page would send) is refused.
  const cross = await d.api("GET", "/v1/leases", undefined, { Cookie: `${ck.name}=${ck.value}`, Origin: "https://evil.example" });
  assert.equal(cross.status, 403, cross.body);
  const crossPost = await d.api("POST", "/v1/leases", '{"session_id":"cross"}', { Cookie: `${ck.name}=${ck.value}`, Origin: "https://evil.example", [CSRF]: "1", "Content-Type": "application/json" });
  assert.equal(crossPost.status, 403, crossPost.body);
  const list = JSON.parse((await d.api("GET", "/v1/leases")).body).leases.map((l) => l.session_id).sort();
  assert.deepEqual(list, ["console-a", "console-b"]);

  // Release the other lease, with a confirmation, and see it go.
  await page.goto(`${origin}/ui/#/lease/${leaseB.id}`);
  await page.waitForSelector("#summary table.kv");
  await page.click("#release");
  await page.waitForSelector("dialog.confirm[open]");
  await shot("4-release-confirmation");
  await page.click("dialog.confirm button.danger");
  await page.waitForSelector(`#leases tr[data-lease="${leaseA.id}"]`);
  await page.waitForSelector(`#leases tr[data-lease="${leaseB.id}"]`, { state: "detached" });
  assert.equal((await d.api("GET", `/v1/leases/${leaseB.id}`)).status, 404);
  await shot("5-after-release");

  // The usage charts, once the daemon has two samples of the lease (one every 10 s).
  const deadline = Date.now() + 30_000;
  while (JSON.parse((await d.api("GET", `/v1/leases/${leaseA.id}/usage`)).body).samples.length < 2) {
    if (Date.now() > deadline) throw new Error("the daemon took no two usage samples of the lease in 30 s");
    await new Promise((r) => setTimeout(r, 200));
  }
  await page.goto(`${origin}/ui/#/lease/${leaseA.id}`);
  await page.waitForSelector("#charts figure.chart");
  const captions = await page.locator("#charts figcaption").allInnerTexts();
  assert.equal(captions.length, 4);
  assert.ok(captions.every((c) => !c.includes("collecting")), captions.join(" | "));
  await shot("6-usage-charts");

  // Sign out: the session ends in the daemon, and the page goes back to sign-in.
  await page.click("#signout");
  await page.waitForSelector("#signin");
  const after = await d.api("GET", "/v1/leases", undefined, { Cookie: `${ck.name}=${ck.value}` });
  assert.equal(after.status, 401);

  assert.deepEqual(problems, [], "CSP violations or page errors");
  assert.deepEqual(foreign, [], "requests to anything but the daemon");
});
