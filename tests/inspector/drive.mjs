// Drives the inspector page in Debian's Chromium (playwright-core, which
// brings no browser of its own). Started by the Rust integration test
// `inspector::inspector_page_in_chromium` with one JSON argument:
// { base, token, chromium, main_id, hostile_id, recall_id, screenshot,
// live_body }.
// Exits non-zero on the first failed check; prints what the page showed as
// JSON on its last line, for the Rust test to compare with the report.
import { chromium } from "playwright-core";

const args = JSON.parse(process.argv[2]);
const base = args.base.replace(/\/$/, "");
const checks = [];
function check(ok, what) {
  if (!ok) throw new Error("check failed: " + what);
  checks.push(what);
}

const browser = await chromium.launch({
  executablePath: args.chromium,
  headless: true,
  chromiumSandbox: false,
  args: [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
let failed = null;
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, deviceScaleFactor: 1 });
  const page = await context.newPage();
  const problems = [];
  let phase = "no-token";
  page.on("console", (m) => {
    if (m.type() === "error" || m.type() === "warning") problems.push({ phase, text: m.text() });
  });
  page.on("pageerror", (e) => problems.push({ phase, text: "page error: " + e.message }));
  page.on("dialog", async (d) => {
    problems.push({ phase, text: "dialog: " + d.message() });
    await d.dismiss();
  });

  // Without the token: the page loads, its data does not.
  await page.goto(base + "/inspector");
  await page.waitForSelector("#notice:not([hidden])");
  check((await page.textContent("#notice")).includes("bearer token"), "the page asks for the token");
  check((await page.locator("#request-rows tr").count()) === 0, "no data without the token");
  const unauthorized = await page.evaluate(() => fetch("/inspector/api/requests").then((r) => r.status));
  check(unauthorized === 401, "the API answers 401 without the token");

  // With it: the list shows the requests, newest first.
  phase = "token";
  await page.fill("#token", args.token);
  await page.click("#auth button[type=submit]");
  await page.waitForSelector(`#request-rows tr[data-id="${args.main_id}"]`);
  const listed = await page.$$eval("#request-rows tr", (rows) => rows.map((r) => r.dataset.id));
  check(listed.length >= 3, "the list shows every request");
  check(listed[0] === args.hostile_id, "newest first");
  check(listed.includes(args.main_id), "the list shows the request");

  // The hostile request: its markup shows as text and runs nothing.
  await page.click(`#request-rows tr[data-id="${args.hostile_id}"]`);
  await page.waitForSelector("#conversation .row[data-index]");
  const hostile = await page.evaluate(() => ({
    pwned: typeof window.__pwned,
    images: document.querySelectorAll("#conversation img, #detail img").length,
    scripts: document.querySelectorAll("script").length,
    bold: document.querySelectorAll("#conversation b").length,
    text: document.getElementById("conversation").textContent,
  }));
  check(hostile.pwned === "undefined", "window.__pwned stays undefined");
  check(hostile.images === 0 && hostile.bold === 0, "no element made from a message");
  check(hostile.scripts === 1, "only the inspector's own script");
  check(hostile.text.includes("<script>window.__pwned=1</script>"), "the script tag shows as text");
  check(hostile.text.includes('<img src=x onerror="window.__pwned=1">'), "the img tag shows as text");

  // The main request, side by side, against the JSON report.
  await page.click(`#request-rows tr[data-id="${args.main_id}"]`);
  await page.waitForFunction(
    (id) => document.getElementById("detail-title").textContent.includes(id) && document.querySelectorAll("#conversation .row").length > 0,
    args.main_id,
  );
  const readRows = () =>
    page.$$eval("#conversation .row", (rows) =>
      rows.map((r) => ({
        index: r.dataset.index ?? null,
        fate: r.dataset.fate,
        mark: r.dataset.mark,
        recall_id: r.dataset.recallId ?? null,
        recalled: r.dataset.recalled === "true",
        badge: r.querySelector(".mark .badge").textContent,
        forwarded: !r.querySelector(".forwarded .absent"),
        reason: r.querySelector(".mark").textContent,
      })),
    );
  const rows = await readRows();
  const report = await (await fetch(`${base}/v1/compaction-reports/${args.main_id}`)).json();
  check(rows.length === report.messages.length, "one row per message of the report");
  report.messages.forEach((line, i) => {
    const row = rows[i];
    check(row.index === String(line.index), `row ${i} is message ${line.index}`);
    check(row.fate === line.fate, `message ${line.index}: fate ${line.fate}`);
    check(row.badge === row.mark, `message ${line.index}: its badge says its mark`);
    const removed = line.fate === "dropped";
    check(
      removed ? ["dropped", "deduplicated"].includes(row.mark) && !row.forwarded : row.forwarded,
      `message ${line.index}: ${line.fate} shows as ${row.mark}`,
    );
    if (line.fate === "trimmed") check(row.mark === "trimmed", `message ${line.index}: trimmed`);
  });
  check(rows.some((r) => r.mark === "dropped") && rows.some((r) => r.mark === "trimmed"), "dropped and trimmed messages are marked");
  const folds = await page.locator("#conversation details.fold").count();
  check(folds > 0, "long texts fold");
  // Billed usage and the estimated saving, once known, in the list and the view.
  const usage = await page.textContent(`#request-rows tr[data-id="${args.main_id}"]`);
  check(usage.includes("4,610 in") && usage.includes("74% cached") && usage.includes("96 out"), "billed usage in the list: " + usage);
  check(usage.includes("+1,150 tok"), "the estimated saving in the list: " + usage);
  const facts = await page.textContent("#detail-facts");
  check(facts.includes("in 1,210") && facts.includes("cache 3,400 read, 0 written") && facts.includes("out 96"), "billed usage in the view: " + facts);
  // The recall request: its marker messages and the messages the model
  // recalled, row for row as the JSON report has them.
  await page.click(`#request-rows tr[data-id="${args.recall_id}"]`);
  await page.waitForFunction(
    (id) => document.getElementById("detail-title").textContent.includes(id) && document.querySelectorAll("#conversation .row").length > 0,
    args.recall_id,
  );
  const recallRows = await readRows();
  const recallReport = await (await fetch(`${base}/v1/compaction-reports/${args.recall_id}`)).json();
  check(recallRows.length === recallReport.messages.length, "recall: one row per line of the report");
  recallReport.messages.forEach((line, i) => {
    const row = recallRows[i];
    const what = `recall row ${i} (${line.stage || "-"} ${line.recall_id || ""})`;
    check(row.fate === line.fate && row.badge === row.mark, what + ": fate and badge");
    check(row.recall_id === (line.recall_id ?? null), what + ": its recall id");
    if (line.stage === "marker") {
      check(row.mark === "marker" && row.index === null && row.forwarded, what + ": a marker row, forwarded");
      check(row.reason.includes("marker " + line.recall_id), what + ": the marker's id shows");
    } else {
      check(row.index === String(line.index), what + ": message " + line.index);
      check((row.mark === "recalled") === (line.recalled === true), what + ": recalled exactly when the report says");
    }
    check(row.recalled === (line.recalled === true), what + ": its recalled flag");
    if (line.recalled) check(row.reason.includes("recalled by the model"), what + ": says it was recalled");
  });
  check(recallRows.some((r) => r.mark === "marker") && recallRows.some((r) => r.mark === "recalled"), "markers and recalled messages are marked");
  const legend = await page.textContent("#legend");
  check(legend.includes("marker") && legend.includes("recalled"), "the legend counts markers and recalled messages: " + legend);

  // The screenshot: the list, and the recall request's conversation where
  // it was cut: dropped messages the model recalled, their marker.
  await page.$eval("#conversation .row[data-mark=marker]", (r) => {
    let first = r;
    for (let k = 0; k < 2 && first.previousElementSibling; k++) first = first.previousElementSibling;
    first.scrollIntoView({ block: "start" });
  });
  await page.screenshot({ path: args.screenshot });

  // Filters.
  await page.selectOption("#f-tenant", "acme");
  await page.waitForFunction(() => document.querySelectorAll("#request-rows tr").length === 1);
  check((await page.textContent("#request-rows tr td:nth-child(3)")) === "acme", "the tenant filter");
  await page.selectOption("#f-tenant", "");
  await page.selectOption("#f-status", "unchanged");
  await page.waitForFunction(() => Array.from(document.querySelectorAll("#request-rows tr")).every((r) => r.textContent.includes("unchanged")));
  check((await page.locator("#request-rows tr").count()) === 1, "the status filter");
  await page.selectOption("#f-status", "");
  await page.waitForFunction((n) => document.querySelectorAll("#request-rows tr").length === n, listed.length);

  // Live: a new request appears without a reload.
  await page.check("#live");
  const sent = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(args.live_body),
  });
  check(sent.ok, "the live request went through");
  await page.waitForFunction((n) => document.querySelectorAll("#request-rows tr").length === n + 1, listed.length, { timeout: 8000 });
  check(true, "live polling shows the new request");

  check((await page.evaluate(() => typeof window.__pwned)) === "undefined", "nothing ran, to the end");
  // The only console errors allowed: the refused loads before the token.
  const unexpected = problems.filter((p) => !(p.phase === "no-token" && /401/.test(p.text)));
  check(unexpected.length === 0, "no dialog, console error or page error: " + JSON.stringify(unexpected));
  console.log(JSON.stringify({ checks: checks.length, listed: listed.length, main_rows: rows, recall_rows: recallRows }));
} catch (e) {
  failed = e;
} finally {
  await browser.close();
}
if (failed) {
  console.error(failed.stack || String(failed));
  console.error("passed before it: " + checks.join("; "));
  process.exit(1);
}
