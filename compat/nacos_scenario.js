// npm `nacos-naming` 2.6.3 (NacosNamingClient, HTTP v1 with its own beat loop and list
// polling) against tandem's Nacos-compatible API at dc-a (TANDEM_A). NODE_PATH holds the
// installed node_modules.
'use strict';

const { NacosNamingClient } = require('nacos-naming');
const { addr, check, poll, run, sleep } = require('./steps');

const A = addr('TANDEM_A');
const SVC = 'nacosjs-svc';
const IP = '127.0.0.1';
const P1 = 9201;
const P2 = 9202;
// The client's own beats (its first one about 10 s after it starts) must keep an ephemeral
// instance healthy: checked once this long after the registration.
const BEATS_KEEP_IT_MS = 16000;

// The client logs every request at info: only warnings and errors are shown.
const logger = { ...console, info() {}, debug() {} };
const client = new NacosNamingClient({ logger, serverList: A, namespace: 'public' });
const received = [];
const listener = (hosts) => received.push((hosts || []).map((h) => h.port));
let registeredAt = 0;

const direct = () => client.getAllInstances(SVC, 'DEFAULT_GROUP', '', false);
const ports = (hosts) => hosts.map((h) => h.port).sort();

async function ready() {
  await client.ready();
}

async function register_an_instance() {
  await client.registerInstance(SVC, { ip: IP, port: P1, weight: 2, metadata: { team: 'core' }, clusterName: 'DEFAULT' });
  registeredAt = Date.now();
}

async function get_all_instances_sees_it() {
  const host = await poll('getAllInstances lists it', async () => {
    const h = (await direct()).find((x) => x.ip === IP && x.port === P1);
    check(h, `hosts ${JSON.stringify(await direct())}`);
    return h;
  });
  check(host.weight === 2 && host.healthy === true && host.enabled === true, `host ${JSON.stringify(host)}`);
  check(host.metadata && host.metadata.team === 'core', `metadata ${JSON.stringify(host.metadata)}`);
  check(host.instanceId, `no instanceId in ${JSON.stringify(host)}`);
  // The cached path (subscribe=true) keys the answer by its `name` and `clusters`.
  const cached = await client.getAllInstances(SVC);
  check(ports(cached).includes(P1), `getAllInstances (cached) ${JSON.stringify(cached)}: name/clusters not echoed?`);
}

async function select_instances_healthy() {
  const hosts = await client.selectInstances(SVC, 'DEFAULT_GROUP', '', true, false);
  check(ports(hosts).includes(P1), `selectInstances(healthy) ${JSON.stringify(hosts)}`);
}

async function service_list_names_it() {
  // What the client's proxy sends for a service listing (GET /nacos/v1/ns/service/list).
  const list = await client._serverProxy.getServiceList(1, 100, 'DEFAULT_GROUP');
  check(list.count >= 1 && (list.data || []).includes(SVC), `service list ${JSON.stringify(list)}`);
}

async function subscribe_sees_a_second_instance() {
  client.subscribe({ serviceName: SVC }, listener);
  await poll('the first push to the listener', async () => check(received.length > 0, 'nothing yet'));
  check(received[0].includes(P1), `first hosts ${JSON.stringify(received[0])}`);
  await client.registerInstance(SVC, { ip: IP, port: P2, metadata: { team: 'core' }, clusterName: 'DEFAULT' });
  await poll(`the listener sees ${P2}`, async () => {
    check(received.some((r) => r.includes(P2)), `seen so far ${JSON.stringify(received)}`);
  });
}

async function beats_keep_it_healthy() {
  await sleep(Math.max(0, registeredAt + BEATS_KEEP_IT_MS - Date.now()));
  const hosts = await client.selectInstances(SVC, 'DEFAULT_GROUP', '', true, false);
  check(ports(hosts).includes(P1), `not healthy ${BEATS_KEEP_IT_MS / 1000} s after registering: ${JSON.stringify(hosts)}`);
}

async function deregister_removes_them() {
  await client.deregisterInstance(SVC, { ip: IP, port: P1, clusterName: 'DEFAULT' });
  await poll(`${P1} leaves the list`, async () => {
    const hosts = await direct();
    check(!ports(hosts).includes(P1) && ports(hosts).includes(P2), `hosts ${JSON.stringify(ports(hosts))}`);
  });
  await client.deregisterInstance(SVC, { ip: IP, port: P2, clusterName: 'DEFAULT' });
  // The client keeps its last non-empty list: the emptiness is read from its raw answer.
  await poll('the list is empty', async () => {
    const raw = JSON.parse(await client._serverProxy.queryList(`DEFAULT_GROUP@@${SVC}`, '', 0, false));
    check(Array.isArray(raw.hosts) && raw.hosts.length === 0, `hosts ${JSON.stringify(raw.hosts)}`);
  });
}

async function unsubscribe_and_close() {
  client.unSubscribe({ serviceName: SVC }, listener);
  await client.close();
}

async function cleanup() {
  for (const port of [P1, P2]) {
    await client.deregisterInstance(SVC, { ip: IP, port, clusterName: 'DEFAULT' }).catch(() => {});
  }
}

run(`nacos-naming 2.6.3 against dc-a ${A}`, [
  ready,
  register_an_instance,
  get_all_instances_sees_it,
  select_instances_healthy,
  service_list_names_it,
  subscribe_sees_a_second_instance,
  beats_keep_it_healthy,
  deregister_removes_them,
  unsubscribe_and_close,
], cleanup);
