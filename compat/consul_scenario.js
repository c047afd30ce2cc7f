// npm `consul` 2.0.1 (promise API) against tandem's Consul-compatible API: dc-a at
// TANDEM_A, dc-b at TANDEM_B (host:port). NODE_PATH holds the installed node_modules.
'use strict';

const events = require('events');
const Consul = require('consul');
const { STEP_WAIT_MS, addr, check, hostPort, poll, run, sleep } = require('./steps');

const NAME = 'npmconsul-web';
const ID1 = `${NAME}-1`;
const ID2 = `${NAME}-2`;
const CHECK1 = `service:${ID1}`;
const CHECK2 = `service:${ID2}`;
const TTL = '4s';

const A = addr('TANDEM_A');
const B = addr('TANDEM_B');
const client = (address) => new Consul(hostPort(address));
const ca = client(A);
const cb = client(B);
const lastIndex = new Map();

// health.service entries through the library, with the response for its X-Consul-Index
// (a positive integer that never goes back for the same node and dc).
async function health(c, address, opts = {}) {
  const ctx = new events.EventEmitter();
  ctx.includeResponse = true;
  const [res, entries] = await c.health.service({ service: NAME, ...opts, ctx });
  const raw = res.headers['x-consul-index'];
  check(/^[0-9]+$/.test(raw || '') && BigInt(raw) > 0n, `X-Consul-Index ${raw}`);
  const key = `${address} ${opts.dc || ''}`;
  const prev = lastIndex.get(key) || 0n;
  check(BigInt(raw) >= prev, `X-Consul-Index went back at ${key}: ${prev} then ${raw}`);
  lastIndex.set(key, BigInt(raw));
  check(Array.isArray(entries), `health.service answered ${JSON.stringify(entries)}: not an array (Content-Type?)`);
  return entries;
}

const ids = (entries) => entries.map((e) => e.Service.ID).sort();

function status(entry) {
  const s = (entry.Checks || []).map((c) => c.Status);
  return s.includes('critical') ? 'critical' : s.includes('warning') ? 'warning' : 'passing';
}

function entryOf(entries, id) {
  const e = entries.find((x) => x.Service.ID === id);
  check(e, `${id} not in ${JSON.stringify(ids(entries))}`);
  return e;
}

const keepPassing = () => ca.agent.check.pass(CHECK1);
const passingIds = async (c = ca, address = A, opts = {}) => ids(await health(c, address, { passing: true, ...opts }));

async function agent_self_names_the_dc() {
  const a = await ca.agent.self();
  check(a.Config.Datacenter === 'dc-a', `agent.self() Config.Datacenter ${a.Config.Datacenter}`);
  const b = await cb.agent.self();
  check(b.Config.Datacenter === 'dc-b', `dc-b agent.self() Config.Datacenter ${b.Config.Datacenter}`);
}

async function status_leader_is_set() {
  const leader = await ca.status.leader();
  check(typeof leader === 'string' && leader.length > 0, `status.leader() answered ${JSON.stringify(leader)}`);
}

async function catalog_datacenters_lists_both() {
  const dcs = await ca.catalog.datacenters();
  check(Array.isArray(dcs) && dcs.includes('dc-a') && dcs.includes('dc-b'), `datacenters ${JSON.stringify(dcs)}`);
}

async function register_with_a_ttl_check() {
  await ca.agent.service.register({
    name: NAME, id: ID1, address: '127.0.0.1', port: 8091, tags: ['v1'], meta: { team: 'core' }, check: { ttl: TTL },
  });
}

async function a_ttl_check_starts_critical() {
  const entry = await poll('listed, critical', async () => {
    const e = entryOf(await health(ca, A), ID1);
    check(status(e) === 'critical', `status ${status(e)}`);
    check(!(await passingIds()).includes(ID1), 'listed with passing while critical');
    return e;
  });
  const s = entry.Service;
  check(s.Service === NAME && s.Port === 8091 && s.Address === '127.0.0.1', `Service ${JSON.stringify(s)}`);
  check((s.Tags || []).includes('v1') && (s.Meta || {}).team === 'core', `Tags/Meta ${JSON.stringify(s)}`);
}

async function check_pass_makes_it_discoverable() {
  await keepPassing();
  await poll('listed with passing', async () => check((await passingIds()).includes(ID1), 'not passing'));
}

async function agent_and_catalog_list_it() {
  const services = await ca.agent.services();
  check(services[ID1] && services[ID1].Service === NAME, `agent.services() ${JSON.stringify(Object.keys(services))}`);
  const catalog = await ca.catalog.services();
  check(Array.isArray(catalog[NAME]) && catalog[NAME].includes('v1'), `catalog.services() ${JSON.stringify(catalog[NAME])}`);
  const nodes = await ca.catalog.service.nodes(NAME);
  const n = nodes.find((x) => x.ServiceID === ID1);
  check(n && n.ServicePort === 8091 && n.Datacenter === 'dc-a', `catalog.service.nodes ${JSON.stringify(nodes)}`);
}

async function watch_sees_a_second_instance() {
  await keepPassing();
  const seen = [];
  const errors = [];
  const watch = ca.watch({ method: ca.health.service, options: { service: NAME, passing: true, wait: '5s' } });
  watch.on('change', (data) => seen.push(ids(data)));
  watch.on('error', (err) => errors.push(err.message));
  try {
    await poll('the watch\'s first answer', async () => check(seen.length > 0, `no change yet; errors ${errors}`));
    check(seen[0].includes(ID1), `first answer ${JSON.stringify(seen[0])}`);
    await ca.agent.service.register({
      name: NAME, id: ID2, address: '127.0.0.1', port: 8092,
      checks: [{ ttl: TTL, deregistercriticalserviceafter: '10m' }],
    });
    await ca.agent.check.pass(CHECK2);
    await keepPassing();
    await poll(`the watch sees ${ID2}`, async () => {
      check(errors.length === 0, `watch errors: ${errors.join('; ')}`);
      check(seen.some((s) => s.includes(ID2)), `changes so far ${JSON.stringify(seen)}`);
    });
  } finally {
    watch.end();
  }
}

async function warn_and_fail_change_passing() {
  for (const [call, want] of [['warn', 'warning'], ['fail', 'critical']]) {
    await poll(`${want} after ${call}`, async () => {
      await ca.agent.check[call](CHECK1);
      const got = status(entryOf(await health(ca, A), ID1));
      check(got === want, `status ${got}, want ${want}`);
      check(!(await passingIds()).includes(ID1), `listed with passing while ${want}`);
    });
  }
  await keepPassing();
  await poll('passing again', async () => check((await passingIds()).includes(ID1), 'not passing'));
}

async function a_lapsed_ttl_is_critical() {
  await keepPassing();
  const from = Date.now();
  await poll('critical once the TTL lapsed', async () => {
    const got = status(entryOf(await health(ca, A), ID1));
    check(got === 'critical', `status ${got} ${(Date.now() - from) / 1000} s after the last pass`);
    check(!(await passingIds()).includes(ID1), 'still listed with passing');
  });
  check(Date.now() - from >= 3000, 'critical before its TTL ran out');
}

async function dc_b_sees_dc_a_copies() {
  await poll('dc-b answers dc=dc-a with the instance', async () => {
    const e = entryOf(await health(cb, B, { dc: 'dc-a' }), ID1);
    check(e.Node.Datacenter === 'dc-a', `Node ${JSON.stringify(e.Node)}`);
  });
  const local = await health(cb, B);
  check(local.length === 0, `dc-b's own answer lists ${JSON.stringify(ids(local))}`);
}

async function maintenance_takes_it_out() {
  await ca.agent.service.maintenance({ id: ID1, enable: true, reason: 'compat' });
  await poll('out of passing in maintenance', async () => {
    await keepPassing();
    check(!(await passingIds()).includes(ID1), 'still passing in maintenance');
  });
  await ca.agent.service.maintenance({ id: ID1, enable: false });
  await poll('passing after maintenance', async () => {
    await keepPassing();
    check((await passingIds()).includes(ID1), 'not passing after maintenance off');
  });
}

async function prepared_query_fails_over_to_dc_a() {
  const created = await cb.query.create({
    name: 'npmconsul-q', service: { service: NAME, failover: { nearestn: 1, datacenters: ['dc-a'] } },
  });
  check(created && created.ID, `query.create answered ${JSON.stringify(created)}`);
  await poll('query.execute at dc-b answers from dc-a', async () => {
    await keepPassing();
    const res = await cb.query.execute(created.ID);
    check(res.Datacenter === 'dc-a' && res.Failovers >= 1, `Datacenter ${res.Datacenter} Failovers ${res.Failovers}`);
    check((res.Nodes || []).some((n) => n.Service.ID === ID1), `Nodes ${JSON.stringify(res.Nodes)}`);
  });
  const got = await cb.query.get(created.ID);
  check(got && got.ID === created.ID, `query.get answered ${JSON.stringify(got)}`);
  await cb.query.destroy(created.ID);
  const listed = (await cb.query.list()) || [];
  check(!listed.some((q) => q.ID === created.ID), 'query.list() still has it');
}

async function deregister_removes_it_everywhere() {
  await ca.agent.service.deregister(ID1);
  await ca.agent.service.deregister(ID2);
  const left = ids(await health(ca, A));
  check(!left.includes(ID1) && !left.includes(ID2), `dc-a still lists ${left}`);
  await poll('dc-b\'s view of dc-a loses it', async () => {
    const b = ids(await health(cb, B, { dc: 'dc-a' }));
    check(!b.includes(ID1), `dc-b still lists ${b}`);
  }, STEP_WAIT_MS);
}

async function cleanup() {
  for (const id of [ID1, ID2]) await ca.agent.service.deregister(id).catch(() => {});
  ca.destroy();
  cb.destroy();
  await sleep(0);
}

run(`npm consul 2.0.1 against dc-a ${A}, dc-b ${B}`, [
  agent_self_names_the_dc,
  status_leader_is_set,
  catalog_datacenters_lists_both,
  register_with_a_ttl_check,
  a_ttl_check_starts_critical,
  check_pass_makes_it_discoverable,
  agent_and_catalog_list_it,
  watch_sees_a_second_instance,
  warn_and_fail_change_passing,
  a_lapsed_ttl_is_critical,
  dc_b_sees_dc_a_copies,
  maintenance_takes_it_out,
  prepared_query_fails_over_to_dc_a,
  deregister_removes_it_everywhere,
], cleanup);
