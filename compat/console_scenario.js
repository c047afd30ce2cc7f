// Drives the web console of a two-DC tandem (dc-a at TANDEM_A, dc-b at TANDEM_B) in
// headless Chromium through puppeteer-core (NODE_PATH). The page is loaded once from dc-b
// and never reloaded: live updates, a partition seen as stale, its heal, every page at
// mobile width, and no script or style from anywhere but the node. Screenshots go to SHOTS.
// Faults come from the parent over stdio: it prints `CONTROL partition` (or `heal`) and
// reads a line `ok` on stdin once the fault is in place.
'use strict';

const fs = require('fs');
const path = require('path');
const readline = require('readline');
const puppeteer = require('puppeteer-core');
const { STEP_WAIT_MS, addr, check, poll, run, sleep } = require('./steps');

const A = addr('TANDEM_A');
const B = addr('TANDEM_B');
const ORIGIN = `http://${B}`;
const SHOTS = process.env.SHOTS || path.join(process.cwd(), 'console-shots');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SERVICE = 'default/console-web';
const ROW = `tr[data-service="${SERVICE}"]`;
const PEER = '[data-peer="dc-a"]';
const MOBILE_WIDTH = 375;
const MOBILE_PAGES = [
  ['services', '#/services', ROW],
  ['service', `#/service/${SERVICE}`, 'table[data-testid=instances] tr[data-instance]'],
  ['replication', '#/replication', `${PEER} [data-field=link]`],
  ['drills', '#/drills', '[data-testid=drills]'],
];

let browser;
let page;
let instanceId;
// Checks that do not stop the run; any of them fails it at the end.
const problems = [];
const pageErrors = [];
const foreign = [];
// Each page load: its label and how many event streams it opened.
const loads = [];

// Lines from the parent, in order; `nextLine` waits for one.
const lines = [];
let waiter = null;
let stdinClosed = false;
const rl = readline.createInterface({ input: process.stdin });
rl.on('line', (l) => {
  lines.push(l.trim());
  if (waiter) waiter();
});
rl.on('close', () => {
  stdinClosed = true;
  if (waiter) waiter();
});

async function nextLine(timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (lines.length === 0) {
    check(!stdinClosed, 'stdin closed: no parent answers CONTROL lines');
    const left = deadline - Date.now();
    check(left > 0, `no answer on stdin within ${timeoutMs / 1000} s`);
    await new Promise((resolve) => {
      waiter = resolve;
      setTimeout(resolve, left);
    });
    waiter = null;
  }
  return lines.shift();
}

// Asks the parent for a fault and waits for its `ok`.
async function control(word) {
  console.log(`CONTROL ${word}`);
  const answer = await nextLine(STEP_WAIT_MS);
  check(answer === 'ok', `the parent answered ${JSON.stringify(answer)} to CONTROL ${word}`);
}

const since = (t) => `${((Date.now() - t) / 1000).toFixed(1)} s`;
const quote = (s) => `"${String(s).replace(/["\\]/g, '\\$&')}"`;

// The trimmed text of the first element matching `sel`; fails when there is none.
async function text(sel) {
  const t = await page.$eval(sel, (e) => e.textContent.trim()).catch(() => null);
  check(t !== null, `no element ${sel}`);
  return t;
}

async function waitText(sel, want, timeoutMs = STEP_WAIT_MS) {
  return poll(`${sel} reads ${JSON.stringify(want)}`, async () => {
    const t = await text(sel);
    check(want instanceof RegExp ? want.test(t) : t === want, `it reads ${JSON.stringify(t)}`);
    return t;
  }, timeoutMs);
}

async function waitFor(sel, timeoutMs = STEP_WAIT_MS) {
  return poll(`${sel} exists`, async () => check(await page.$(sel), `no element ${sel}`), timeoutMs);
}

async function go(hash) {
  await page.evaluate((h) => {
    window.location.hash = h;
  }, hash);
}

async function shot(name) {
  await page.screenshot({ path: path.join(SHOTS, name), fullPage: true });
  console.log(`screenshot ${path.join(SHOTS, name)}`);
}

// The page was loaded once: the marker set after the first load is still there.
async function notReloaded() {
  check(await page.evaluate(() => window.__consoleTestMarker === 1), 'the page was reloaded');
}

const instanceRow = () => `table[data-testid=instances] tr[data-instance=${quote(`dc-a/${instanceId}`)}]`;

async function launch() {
  fs.mkdirSync(SHOTS, { recursive: true });
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--no-default-browser-check'],
    timeout: STEP_WAIT_MS,
    protocolTimeout: STEP_WAIT_MS,
  });
  // Chromium runs in its own process group: the parent kills it too, should this process
  // die before closing it.
  console.log(`BROWSER ${browser.process().pid} ${await browser.version()}`);
}

// A new tab at `viewport` that records its requests, event streams and errors, loaded
// from dc-b's /ui/ (+ hash). Marked, so that a reload shows.
async function openPage(label, viewport, hash = '') {
  if (page) await page.close().catch(() => {});
  page = await browser.newPage();
  page.setDefaultTimeout(STEP_WAIT_MS);
  await page.setViewport(viewport);
  const opened = { label, streams: 0 };
  loads.push(opened);
  page.on('request', (r) => {
    const u = new URL(r.url());
    if (u.protocol === 'data:' || u.protocol === 'blob:') return;
    if (u.origin !== ORIGIN) foreign.push(`${r.resourceType()} ${r.url()}`);
  });
  page.on('response', (r) => {
    if ((r.headers()['content-type'] || '').startsWith('text/event-stream')) opened.streams += 1;
    if (r.status() >= 400) console.log(`page got ${r.status()} for ${r.request().method()} ${r.url()}`);
  });
  page.on('pageerror', (e) => {
    pageErrors.push(String(e && e.message));
    console.log(`page error: ${e && e.message}`);
  });
  page.on('console', (m) => {
    if (m.type() === 'error') console.log(`page console.error: ${m.text()}`);
  });
  const res = await page.goto(`${ORIGIN}/ui/${hash}`, { waitUntil: 'load', timeout: STEP_WAIT_MS });
  check(res && res.status() === 200, `GET /ui/ answered ${res && res.status()}`);
  await page.evaluate(() => {
    window.__consoleTestMarker = 1;
  });
}

async function services_page_is_live() {
  await openPage('desktop', { width: 1280, height: 800 });
  await waitFor('table[data-testid=services-table]');
  const ns = await page.$eval('[data-testid=filter-namespace]', (e) => e.value ?? e.textContent).catch(() => null);
  check(ns !== null, 'no namespace filter [data-testid=filter-namespace]');
  check(ns.trim() === 'default', `the namespace filter reads ${JSON.stringify(ns)}, not default`);
  check(await page.$('[data-testid=filter-name]'), 'no name filter [data-testid=filter-name]');
  await waitText('[data-testid=live]', 'live');
}

async function registration_at_dc_a_appears_at_dc_b() {
  const res = await fetch(`http://${A}/v1/register`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      service: 'console-web',
      address: '10.0.0.7',
      port: 8080,
      persistent: true,
      zone: 'z1',
      metadata: { team: 'core' },
    }),
    signal: AbortSignal.timeout(STEP_WAIT_MS),
  });
  const body = await res.text();
  check(res.ok, `POST /v1/register at dc-a answered ${res.status}: ${body}`);
  instanceId = JSON.parse(body).instance_id;
  check(instanceId, `the register answer has no instance_id: ${body}`);
  console.log(`registered dc-a/${instanceId}`);
  await waitText(`${ROW} td[data-dc="dc-a"]`, '1/1');
  const own = await text(`${ROW} td[data-dc="dc-b"]`).catch((e) => `(${e.message})`);
  if (own !== '–') problems.push(`dc-b's cell of ${SERVICE} reads ${JSON.stringify(own)}, not "–"`);
  await notReloaded();
}

async function service_page_fails_over_to_dc_a() {
  await page.click(`${ROW}`);
  const want = `#/service/${SERVICE}`;
  const moved = await poll('the row click opens the service page', async () => {
    const h = await page.evaluate(() => window.location.hash);
    check(h === want, `the hash is ${h}`);
  }, 5000).then(() => true, () => false);
  if (!moved) {
    problems.push(`clicking ${ROW} did not open ${want}`);
    await go(want);
  }
  const row = instanceRow();
  await waitFor(row);
  await waitText(`${row} [data-field=health]`, 'healthy');
  await waitText(`${row} [data-field=stale]`, /^(|fresh)$/);
  await waitText('[data-testid=failover] [data-field=active]', 'true');
  await waitText('[data-testid=failover] [data-field=reason]', /\S/);
  const explains = await page.$$eval('table[data-testid=instances] tr[data-instance]', (rows) =>
    rows.map((r) => {
      const e = r.querySelector('[data-field=explain]');
      return [r.dataset.instance, e ? e.textContent.trim() : null];
    }));
  check(explains.length > 0, 'no instance rows');
  for (const [id, e] of explains) check(e, `row ${id} has no (or an empty) [data-field=explain]`);
  const fields = await page.$eval(row, (r) => Object.fromEntries(
    [...r.querySelectorAll('[data-field]')].map((e) => [e.dataset.field, e.textContent.trim()])));
  console.log(`instance row: ${JSON.stringify(fields)}`);
  if (fields.zone !== 'z1') problems.push(`the zone cell reads ${JSON.stringify(fields.zone)}, not z1`);
  if (!/team/.test(fields.metadata || '')) problems.push(`the metadata cell does not show team: ${fields.metadata}`);
  if (fields.status !== 'up') problems.push(`the status cell reads ${JSON.stringify(fields.status)}, not up`);
  // The instance is dc-a's: dc-b's page offers no status buttons for it.
  if (await page.$(`${row} button[data-action]`)) problems.push('a dc-a row at dc-b has status buttons');
  await notReloaded();
  await shot('service.png');
}

async function replication_link_is_up() {
  await go('#/replication');
  await waitText(`${PEER} [data-field=link]`, 'up');
  await waitFor('svg[data-testid=lag-chart]');
  for (const f of ['lag-events', 'lag-ms', 'epoch', 'stale']) {
    if (!(await page.$(`${PEER} [data-field=${f}]`))) problems.push(`${PEER} has no [data-field=${f}]`);
  }
  if (!(await page.$('[data-testid=preservation]'))) problems.push('no [data-testid=preservation] on #/replication');
  await shot('replication.png');
}

let partitionedAt = 0;

async function partition_takes_the_link_down() {
  await control('partition');
  partitionedAt = Date.now();
  const link = await waitText(`${PEER} [data-field=link]`, /^(?!up$).+/);
  console.log(`link reads ${JSON.stringify(link)} ${since(partitionedAt)} after the partition`);
}

async function partition_marks_the_instance_stale() {
  await go(`#/service/${SERVICE}`);
  await waitText(`${instanceRow()} [data-field=stale]`, 'stale');
  console.log(`stale ${since(partitionedAt)} after the partition`);
  await waitText('[data-testid=live]', 'live');
  await notReloaded();
  await shot('partitioned.png');
}

async function heal_clears_the_stale_badge() {
  await control('heal');
  const t0 = Date.now();
  await waitText(`${instanceRow()} [data-field=stale]`, /^(|fresh)$/);
  console.log(`fresh ${since(t0)} after the heal`);
}

async function heal_brings_the_link_up() {
  await go('#/replication');
  await waitText(`${PEER} [data-field=link]`, 'up');
}

async function services_and_drills_pages() {
  await go('#/services');
  await waitText(`${ROW} td[data-dc="dc-a"]`, '1/1');
  await shot('services.png');
  await go('#/drills');
  await waitFor('[data-testid=drills]');
  await poll('the drills list is filled in', async () => check(await text('[data-testid=drills]'), 'it is empty'));
  await shot('drills.png');
}

async function mobile_width_has_no_sideways_scroll() {
  // A new load: changing isMobile/hasTouch makes puppeteer reload a page anyway.
  await openPage('mobile', { width: MOBILE_WIDTH, height: 740, isMobile: true, hasTouch: true }, '#/services');
  for (const [name, hash, sel] of MOBILE_PAGES) {
    await go(hash);
    await waitFor(sel);
    await sleep(300);
    const m = await page.evaluate((width) => {
      // Elements past the viewport's width (a page wider than it is zoomed out on a phone:
      // innerWidth grows).
      const wide = [...document.querySelectorAll('body *')]
        .filter((e) => e.getBoundingClientRect().right > width + 0.5 && e.getBoundingClientRect().width > 0)
        .slice(-5)
        .map((e) => `${e.tagName.toLowerCase()}${e.dataset.testid ? `[data-testid=${e.dataset.testid}]` : ''}` +
          `${e.className && typeof e.className === 'string' ? `.${e.className.trim().split(/\s+/).join('.')}` : ''}` +
          ` (${Math.round(e.getBoundingClientRect().width)} px wide)`);
      return { scroll: document.documentElement.scrollWidth, inner: window.innerWidth, wide };
    }, MOBILE_WIDTH);
    const ok = m.scroll <= m.inner && m.inner <= MOBILE_WIDTH;
    console.log(`${name} at ${MOBILE_WIDTH} px: scrollWidth ${m.scroll}, innerWidth ${m.inner}${ok ? '' : `; too wide: ${m.wide.join(', ')}`}`);
    if (!ok) problems.push(`${hash} scrolls sideways at ${MOBILE_WIDTH} px (scrollWidth ${m.scroll}, innerWidth ${m.inner})`);
    await shot(`mobile-${name}.png`);
  }
  await notReloaded();
}

async function only_the_node_was_contacted() {
  check(foreign.length === 0, `the page requested other origins than ${ORIGIN}: ${foreign.join(', ')}`);
  for (const l of loads) {
    console.log(`${l.label} load: ${l.streams} event stream(s)`);
    if (l.streams !== 1) problems.push(`the ${l.label} load opened ${l.streams} event streams, not 1`);
  }
}

async function no_other_problems() {
  if (pageErrors.length) problems.push(`uncaught errors in the page: ${pageErrors.join(' | ')}`);
  await closeBrowser();
  check(problems.length === 0, `\n  - ${problems.join('\n  - ')}`);
}

async function closeBrowser() {
  if (!browser) return;
  const b = browser;
  browser = undefined;
  await Promise.race([b.close(), sleep(5000)]).catch(() => {});
  const proc = b.process();
  if (proc && proc.exitCode === null) {
    try {
      process.kill(-proc.pid, 'SIGKILL');
    } catch (_) {
      // already gone
    }
  }
}

run('console (web UI, puppeteer-core)', [
  launch,
  services_page_is_live,
  registration_at_dc_a_appears_at_dc_b,
  service_page_fails_over_to_dc_a,
  replication_link_is_up,
  partition_takes_the_link_down,
  partition_marks_the_instance_stale,
  heal_clears_the_stale_badge,
  heal_brings_the_link_up,
  services_and_drills_pages,
  mobile_width_has_no_sideways_scroll,
  only_the_node_was_contacted,
  no_other_problems,
], async () => {
  if (page) await shot('failure.png').catch(() => {});
  if (problems.length) console.log(`also: ${problems.join('; ')}`);
  await closeBrowser();
});
