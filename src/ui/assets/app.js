// tandem console: plain JavaScript, no build step, no third-party code. Every value from
// the registry is put into the page as text (textContent), never as HTML.
'use strict';

const S = {
  token: sessionStorage.getItem('tandem-token') || '',
  dc: '',
  page: null,
  history: {}, // peer DC -> [{t, events, ms}] for the lag chart (the last 10 minutes)
  streaming: false,
};
const HISTORY_MS = 10 * 60 * 1000;
const $ = (sel) => document.querySelector(sel);

// h('tag', {attr: v, onclick: f}, child...) with text children as text nodes.
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// Replaces el's children with kids, lists flattened, nulls dropped.
function put(el, ...kids) {
  el.replaceChildren(...kids.flat(2).filter((k) => k !== null && k !== undefined && k !== false));
}

function svgEl(tag, attrs) {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  return el;
}

function headers(extra) {
  const hs = Object.assign({}, extra || {});
  if (S.token) hs['Authorization'] = 'Bearer ' + S.token;
  return hs;
}

async function api(path, opts) {
  const o = Object.assign({}, opts || {});
  o.headers = headers(o.headers);
  const r = await fetch(path, o);
  if (r.status === 401) {
    askToken();
    throw Object.assign(new Error('this node needs a token'), { status: 401 });
  }
  if (!r.ok) {
    let msg = 'HTTP ' + r.status;
    try {
      const b = await r.json();
      if (b && b.error) msg = b.error.message;
    } catch (_) { /* not JSON */ }
    throw Object.assign(new Error(msg), { status: r.status });
  }
  const type = r.headers.get('content-type') || '';
  return type.includes('json') ? r.json() : r.text();
}

function askToken() {
  const f = $('#token-form');
  if (f.hidden) {
    f.hidden = false;
    $('#token').focus();
  }
}

function setLive(on) {
  const el = $('[data-testid=live]');
  el.textContent = on ? 'live' : 'offline';
  el.classList.toggle('on', on);
  el.classList.toggle('offline', !on);
}

// The page's one event stream (fetch, so that the token goes in a header).
async function stream() {
  if (S.streaming) return;
  S.streaming = true;
  try {
    const r = await fetch('/v1/ui/events', { headers: headers() });
    if (r.status === 401) askToken();
    if (!r.ok || !r.body) throw new Error('HTTP ' + r.status);
    setLive(true);
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let at;
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const chunk = buf.slice(0, at);
        buf = buf.slice(at + 2);
        const data = chunk.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5)).join('');
        if (data) onEvent(JSON.parse(data));
      }
    }
  } catch (_) {
    /* reconnect below */
  }
  setLive(false);
  S.streaming = false;
  setTimeout(stream, 2000);
}

function onEvent(ev) {
  // The replication page samples the status itself; every other page keeps the chart's
  // history going.
  if (!S.page || S.page.title !== 'replication') recordStatus();
  if (S.page && S.page.refresh) S.page.refresh(ev).catch(showError);
}

function showError(e) {
  const el = $('#page-error');
  if (el) el.textContent = e && e.status === 403 ? 'This token may not read this: ' + e.message : String(e.message || e);
}

// Link states and lag, sampled on every event for the chart.
async function recordStatus() {
  let st;
  try {
    st = await api('/v1/status');
  } catch (_) {
    return null;
  }
  S.dc = st.dc;
  $('#dc').textContent = st.dc + (st.node ? ' · ' + st.node : '');
  const now = Date.now();
  for (const [peer, p] of Object.entries(st.peers || {})) {
    const inb = p.inbound || {};
    const hist = (S.history[peer] = S.history[peer] || []);
    hist.push({ t: now, events: inb.lag_events || 0, ms: inb.lag_ms_p99 || 0 });
    while (hist.length && hist[0].t < now - HISTORY_MS) hist.shift();
  }
  S.status = st;
  return st;
}

function healthCell(v) {
  return h('span', { class: v }, v);
}

// --- Services -------------------------------------------------------------------------

function servicesPage() {
  let ns = sessionStorage.getItem('tandem-ns') || 'default';
  const nsSel = h('select', { 'data-testid': 'filter-namespace', 'aria-label': 'namespace' });
  const nameIn = h('input', { 'data-testid': 'filter-name', placeholder: 'filter by name', 'aria-label': 'name' });
  const body = h('div', { class: 'scroll' });
  let last = null;
  const draw = () => {
    if (!last) return;
    const want = nameIn.value.trim().toLowerCase();
    const dcs = last.dcs;
    const rows = last.services
      .filter((s) => !want || s.service.toLowerCase().includes(want))
      .map((s) => {
        const key = last.namespace + '/' + s.service;
        return h('tr', { class: 'link', 'data-service': key, onclick: () => (location.hash = '#/service/' + key) },
          h('td', { class: 'wrap' }, h('a', { href: '#/service/' + key }, s.service)),
          dcs.map((dc) => {
            const c = s.dcs[dc];
            const text = c ? c.healthy + '/' + c.total : '–';
            const cls = !c ? 'muted' : c.healthy === 0 ? 'unhealthy' : c.healthy < c.total ? 'suspect' : 'healthy';
            return h('td', { 'data-dc': dc, class: cls }, text, c && c.stale ? [' ', h('span', { class: 'badge stale' }, 'stale')] : null);
          }));
      });
    put(body, h('table', { 'data-testid': 'services-table' },
      h('thead', {}, h('tr', {}, h('th', {}, 'service'), dcs.map((dc) => h('th', {}, dc + (dc === last.dc ? ' (here)' : ''))))),
      h('tbody', {}, rows.length ? rows : h('tr', {}, h('td', { colspan: dcs.length + 1, class: 'muted' }, 'No services.')))));
  };
  nameIn.addEventListener('input', draw);
  nsSel.addEventListener('change', () => {
    ns = nsSel.value;
    sessionStorage.setItem('tandem-ns', ns);
    page.refresh().catch(showError);
  });
  const page = {
    title: 'services',
    mount(main) {
      main.replaceChildren(h('h1', {}, 'Services'), h('div', { class: 'filters' }, nsSel, nameIn),
        h('p', { id: 'page-error', class: 'err' }), body,
        h('p', { class: 'muted' }, 'Healthy / total instances per owner DC, as this node holds them; updated live.'));
    },
    async refresh() {
      last = await api('/v1/ui/services?namespace=' + encodeURIComponent(ns));
      S.dc = last.dc;
      const names = Array.from(new Set([ns, ...last.namespaces])).sort();
      if (nsSel.options.length !== names.length) {
        nsSel.replaceChildren(...names.map((n) => h('option', { value: n }, n)));
      }
      nsSel.value = ns;
      draw();
    },
  };
  return page;
}

// --- One service ----------------------------------------------------------------------

function servicePage(ns, svc) {
  const box = h('div');
  const path = '/v1/services/' + encodeURIComponent(ns) + '/' + encodeURIComponent(svc);
  const setStatus = async (inst, status) => {
    const url = '/v1/instances/' + encodeURIComponent(ns) + '/' + encodeURIComponent(svc) + '/' + encodeURIComponent(inst.instance_id) + '/status';
    try {
      await api(url, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ status }) });
      await page.refresh();
    } catch (e) {
      showError(e);
    }
  };
  const page = {
    title: 'service',
    mount(main) {
      main.replaceChildren(h('p', {}, h('a', { href: '#/services' }, '← services')),
        h('h1', {}, ns + ' / ' + svc), h('p', { id: 'page-error', class: 'err' }), box);
    },
    async refresh() {
      const [all, policy] = await Promise.all([api(path + '?dc=all'), api(path + '?explain=true')]);
      if (!S.dc) await recordStatus();
      const why = {};
      for (const l of policy.explain || []) why[l.owner_dc + '/' + l.instance_id] = (l.included ? 'in: ' : 'out: ') + l.reason;
      const f = policy.failover || {};
      const failover = h('div', { class: 'card', 'data-testid': 'failover' }, h('dl', {},
        h('dt', {}, 'failover active'), h('dd', { 'data-field': 'active', class: f.active ? 'warning' : 'healthy' }, String(!!f.active)),
        h('dt', {}, 'reason'), h('dd', { 'data-field': 'reason' }, f.reason || ''),
        h('dt', {}, 'mode'), h('dd', {}, f.mode || ''),
        h('dt', {}, 'local healthy'), h('dd', {}, (f.local_healthy ?? 0) + ' of ' + (f.local_total ?? 0)),
        h('dt', {}, 'DCs offered'), h('dd', { 'data-field': 'dcs' }, (f.dcs || []).join(', ') || 'none'),
        h('dt', {}, 'protect threshold'), h('dd', {}, policy.protected ? 'reached: unhealthy instances are included' : 'not reached')));
      const byDc = {};
      for (const i of all.instances) (byDc[i.owner_dc] = byDc[i.owner_dc] || []).push(i);
      const actions = (i) => {
        if (i.owner_dc !== S.dc) return '';
        const to = ['draining', 'out_of_service', 'up'].filter((s) => s !== i.status);
        return h('div', { class: 'actions' }, to.map((s) =>
          h('button', { 'data-action': s, onclick: () => setStatus(i, s) }, s === 'up' ? 'back up' : s.replace('_', ' '))));
      };
      const row = (i) => h('tr', { 'data-instance': i.owner_dc + '/' + i.instance_id },
        h('td', { class: 'wrap id' }, i.instance_id),
        h('td', { class: 'wrap' }, i.address + ':' + i.port),
        h('td', { 'data-field': 'health' }, healthCell(i.health)),
        h('td', { 'data-field': 'status', class: i.status }, i.status),
        h('td', { 'data-field': 'stale' }, i.stale ? h('span', { class: 'badge stale' }, 'stale') : ''),
        h('td', { 'data-field': 'weight' }, i.weight),
        h('td', { 'data-field': 'zone' }, i.zone || ''),
        h('td', { 'data-field': 'metadata', class: 'wrap' }, Object.entries(i.metadata || {}).map(([k, v]) => k + '=' + v).join(', ')),
        h('td', { 'data-field': 'explain', class: 'wrap' }, why[i.owner_dc + '/' + i.instance_id] || 'out: not offered by the policy'),
        h('td', {}, actions(i)));
      const cols = ['instance', 'address', 'health', 'status', 'stale', 'weight', 'zone', 'metadata', 'in the answer?', ''];
      const sections = Object.keys(byDc).sort().map((dc) => h('section', {},
        h('h2', {}, 'Owned by ' + dc + (dc === S.dc ? ' (here)' : '')),
        h('div', { class: 'scroll' }, h('table', { 'data-testid': 'instances' },
          h('thead', {}, h('tr', {}, cols.map((c) => h('th', {}, c)))),
          h('tbody', {}, byDc[dc].map(row))))));
      put(box, failover, sections.length ? sections : h('p', { class: 'muted' }, 'No instances in any DC.'));
    },
  };
  return page;
}

// --- Replication ----------------------------------------------------------------------

function chart(peers) {
  const W = 600, H = 120, P = 6;
  const svg = svgEl('svg', { 'data-testid': 'lag-chart', class: 'chart', viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img', 'aria-label': 'lag (ms, p99) over the last minutes' });
  const now = Date.now();
  let max = 10;
  for (const p of peers) for (const s of S.history[p] || []) max = Math.max(max, s.ms);
  const colors = ['#2451b7', '#b42318', '#117a43', '#a15c00'];
  peers.forEach((p, k) => {
    const pts = (S.history[p] || []).map((s) => {
      const x = P + (W - 2 * P) * (1 - (now - s.t) / HISTORY_MS);
      const y = H - P - (H - 2 * P) * (s.ms / max);
      return x.toFixed(1) + ',' + y.toFixed(1);
    });
    if (pts.length) svg.append(svgEl('polyline', { points: pts.join(' '), fill: 'none', stroke: colors[k % colors.length], 'stroke-width': 2 }));
  });
  return [h('p', { class: 'muted' }, 'Lag p99 over the last 10 minutes; top of the chart: ' + max + ' ms.'), svg];
}

function replicationPage() {
  const box = h('div');
  return {
    title: 'replication',
    mount(main) {
      main.replaceChildren(h('h1', {}, 'Replication'), h('p', { id: 'page-error', class: 'err' }), box);
    },
    async refresh() {
      const st = await recordStatus();
      if (!st) throw new Error('this token may not read the node status');
      const peers = Object.keys(st.peers || {}).sort();
      const cards = peers.map((peer) => {
        const p = st.peers[peer];
        const inb = p.inbound || {}, out = p.outbound || {};
        const link = inb.state === 'up' && out.state === 'up' ? 'up' : inb.state !== 'up' ? inb.state || 'down' : out.state || 'down';
        const applied = inb.applied ? inb.applied.seq + ' (epoch ' + inb.applied.epoch + ')' : '–';
        return h('div', { class: 'card', 'data-peer': peer }, h('h2', {}, peer), h('dl', {},
          h('dt', {}, 'link'), h('dd', { 'data-field': 'link', class: link }, link),
          h('dt', {}, 'in / out'), h('dd', {}, (inb.state || '–') + ' / ' + (out.state || '–')),
          h('dt', {}, 'applied mark'), h('dd', {}, applied),
          h('dt', {}, 'their last seq'), h('dd', {}, inb.origin_last_seq ?? '–'),
          h('dt', {}, 'lag (events)'), h('dd', { 'data-field': 'lag-events' }, inb.lag_events ?? '–'),
          h('dt', {}, 'lag p50 / p99 (ms)'), h('dd', { 'data-field': 'lag-ms' }, (inb.lag_ms_p50 ?? '–') + ' / ' + (inb.lag_ms_p99 ?? '–')),
          h('dt', {}, 'their epoch'), h('dd', { 'data-field': 'epoch' }, inb.origin_epoch ?? '–'),
          h('dt', {}, 'their copies'), h('dd', { 'data-field': 'stale', class: inb.stale ? 'warning' : 'fresh' }, inb.stale ? 'stale' : 'fresh'),
          h('dt', {}, 'snapshots in / out'), h('dd', {}, (inb.snapshots_installed ?? 0) + ' / ' + (out.snapshots_sent ?? 0)),
          h('dt', {}, 'acked by them'), h('dd', {}, out.acked_seq ?? '–'),
          h('dt', {}, 'last error'), h('dd', {}, (out.state !== 'up' && out.last_error) || '–')));
      });
      const sp = st.self_preservation || {};
      const pres = h('div', { class: 'card', 'data-testid': 'preservation' }, h('h2', {}, 'Protection'), h('dl', {},
        h('dt', {}, 'self-preservation'), h('dd', { class: sp.active ? 'warning' : 'healthy' }, sp.active ? 'active: expiry paused' : 'inactive'),
        h('dt', {}, 'namespaces paused'), h('dd', {}, Object.entries(sp.namespaces || {}).filter(([, v]) => v && v.active).map(([k]) => k).join(', ') || 'none'),
        h('dt', {}, 'own epoch'), h('dd', {}, st.log ? st.log.epoch : '–'),
        h('dt', {}, 'fenced'), h('dd', {}, String(!!(st.replication && st.replication.fenced))),
        h('dt', {}, 'stale origins'), h('dd', {}, peers.filter((p) => st.peers[p].inbound && st.peers[p].inbound.stale).join(', ') || 'none')));
      put(box, h('div', { class: 'cards' }, cards, pres), h('h2', {}, 'Lag'), chart(peers),
        h('p', { class: 'muted' }, peers.map((p, k) => p + ': ' + ['blue', 'red', 'green', 'brown'][k % 4]).join(' · ')));
    },
  };
}

// --- Drills ---------------------------------------------------------------------------

function drillsPage() {
  const box = h('div', { 'data-testid': 'drills' });
  return {
    title: 'drills',
    mount(main) {
      main.replaceChildren(h('h1', {}, 'Drills'), h('p', { id: 'page-error', class: 'err' }), box);
    },
    async refresh(ev) {
      if (ev && ev.kind === 'tick' && box.childElementCount) return;
      const d = await api('/v1/ui/drills');
      if (!d.dir) {
        put(box, h('p', { class: 'muted' }, 'No drills folder is configured: set [ui] drills_dir to the --out folder of a tandem chaos run (tandem dev --drills DIR).'));
        return;
      }
      put(box, h('p', { class: 'muted' }, 'Runs in ' + d.dir),
        h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, ['run', 'drill', 'seed', 'mode', 'result', 'time'].map((c) => h('th', {}, c)))),
          h('tbody', {}, d.runs.length ? d.runs.map((r) => h('tr', { class: 'link', onclick: () => (location.hash = '#/drill/' + r.run) },
            h('td', {}, h('a', { href: '#/drill/' + r.run }, r.run)), h('td', {}, r.drill ?? ''), h('td', {}, r.seed ?? ''),
            h('td', {}, r.mode ?? ''), h('td', { class: r.result }, r.result ?? ''), h('td', {}, r.elapsed_ms ? (r.elapsed_ms / 1000).toFixed(1) + ' s' : '')))
            : h('tr', {}, h('td', { colspan: 6, class: 'muted' }, 'No report.json found there.'))))));
    },
  };
}

function drillPage(run) {
  const box = h('div', { 'data-testid': 'drill' });
  let loaded = false;
  return {
    title: 'drills',
    mount(main) {
      main.replaceChildren(h('p', {}, h('a', { href: '#/drills' }, '← drills')), h('h1', {}, 'Drill run ' + run),
        h('p', { id: 'page-error', class: 'err' }), box);
    },
    async refresh() {
      if (loaded) return;
      loaded = true;
      const base = '/v1/ui/drills/' + encodeURIComponent(run) + '/';
      const r = await api(base + 'report.json');
      const inv = (r.invariants || []).map((i) => h('tr', {}, h('td', {}, i.name), h('td', { class: i.passed ? 'pass' : 'fail' }, i.passed ? 'pass' : 'FAIL'),
        h('td', {}, i.checks ?? ''), h('td', {}, i.violations_total ?? 0), h('td', { class: 'wrap' }, h('div', { class: 'clip' }, i.detail || ''))));
      const exp = (r.expectations || []).map((e) => h('tr', {}, h('td', {}, e.name), h('td', { class: e.passed ? 'pass' : 'fail' }, e.passed ? 'pass' : 'FAIL'),
        h('td', { class: 'wrap' }, h('div', { class: 'clip' }, e.detail || ''))));
      let img = null;
      try {
        const resp = await fetch(base + 'timeline.svg', { headers: headers() });
        if (resp.ok) img = h('img', { class: 'timeline', alt: 'timeline of the run', src: URL.createObjectURL(await resp.blob()) });
      } catch (_) { /* no timeline */ }
      put(box, h('p', {}, r.drill + ' · seed ' + r.seed + ' · ' + r.mode + ' · ', h('strong', { class: r.result }, r.result)),
        h('h2', {}, 'Invariants'), h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, ['invariant', 'result', 'checks', 'violations', 'detail'].map((c) => h('th', {}, c)))), h('tbody', {}, inv))),
        exp.length ? [h('h2', {}, 'Expectations'), h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, ['expectation', 'result', 'detail'].map((c) => h('th', {}, c)))), h('tbody', {}, exp)))] : null,
        img ? [h('h2', {}, 'Timeline'), img] : null);
    },
  };
}

// --- Router ---------------------------------------------------------------------------

function route() {
  const parts = (location.hash || '#/services').slice(2).split('/').map(decodeURIComponent);
  switch (parts[0]) {
    case 'service': return servicePage(parts[1] || 'default', parts.slice(2).join('/'));
    case 'replication': return replicationPage();
    case 'drills': return drillsPage();
    case 'drill': return drillPage(parts.slice(1).join('/'));
    default: return servicesPage();
  }
}

function render() {
  S.page = route();
  for (const a of document.querySelectorAll('[data-nav]')) a.classList.toggle('on', a.dataset.nav === S.page.title);
  S.page.mount($('#main'));
  S.page.refresh().catch(showError);
}

$('#token-form').addEventListener('submit', (e) => {
  e.preventDefault();
  S.token = $('#token').value.trim();
  sessionStorage.setItem('tandem-token', S.token);
  $('#token-form').hidden = true;
  render();
});
window.addEventListener('hashchange', render);
recordStatus();
render();
stream();
