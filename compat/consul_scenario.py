"""py-consul 1.8.0 or python-consul 1.1.0 (whichever `consul` module PYTHONPATH holds)
against tandem's Consul-compatible API: dc-a at TANDEM_A, dc-b at TANDEM_B (host:port),
every node of dc-a in TANDEM_A_ALL. Each step asserts what a user of the library sees."""

import os
import threading
import time

for _k in [k for k in os.environ if k.startswith("CONSUL_")]:
    del os.environ[_k]  # CONSUL_HTTP_ADDR would override the address given to the client

import consul  # noqa: E402
from steps import STEP_WAIT_S, StepFailed, addr, all_addrs, check, host_port, poll, run  # noqa: E402

VERSION = getattr(consul, "__version__", "unknown")
# python-consul's last release is 1.1.0; py-consul (its maintained fork) is 1.x past that.
LEGACY = VERSION == "1.1.0"
PREFIX = "pythonconsul" if LEGACY else "pyconsul"
NAME = f"{PREFIX}-web"
ID1, ID2 = f"{NAME}-1", f"{NAME}-2"
CHECK1 = f"service:{ID1}"
TTL = "4s"

A, B = addr("TANDEM_A"), addr("TANDEM_B")
A_ALL = all_addrs("TANDEM_A_ALL", A)


def client(address):
    host, port = host_port(address)
    return consul.Consul(host=host, port=port)


ca, cb = client(A), client(B)
# The last X-Consul-Index seen per (node, dc asked): it never goes back.
last_index = {}
state = {}


def health(c, address, name=NAME, **kw):
    """health.service entries, recording the index (which must never go back)."""
    index, entries = c.health.service(name, **kw)
    check(index is not None and int(index) > 0, f"X-Consul-Index must be a positive integer, got {index!r}")
    key = (address, kw.get("dc"))
    if "index" not in kw:
        prev = last_index.get(key, 0)
        check(int(index) >= prev, f"X-Consul-Index went back at {key}: {prev} then {index}")
        last_index[key] = int(index)
    check(isinstance(entries, list), f"health.service answered {entries!r}, not a list")
    return int(index), entries


def ids(entries):
    return sorted(e["Service"]["ID"] for e in entries)


def status(entry):
    """The entry's aggregate status: its worst check (how Consul's passing filter reads it)."""
    statuses = [c["Status"] for c in entry.get("Checks") or []]
    for s in ("critical", "warning"):
        if s in statuses:
            return s
    return "passing"


def entry_of(entries, sid):
    found = [e for e in entries if e["Service"]["ID"] == sid]
    check(found, f"{sid} not in {ids(entries)}")
    return found[0]


def keep_passing():
    check(ca.agent.check.ttl_pass(CHECK1) is True, f"ttl_pass({CHECK1}) did not answer 200")


def passing_ids(c=ca, address=A, **kw):
    return ids(health(c, address, passing=True, **kw)[1])


def agent_self_names_the_dc():
    for address in A_ALL:
        dc = client(address).agent.self()["Config"]["Datacenter"]
        check(dc == "dc-a", f"agent.self() at {address}: Config.Datacenter {dc!r}, want 'dc-a'")
    dc = cb.agent.self()["Config"]["Datacenter"]
    check(dc == "dc-b", f"agent.self() at dc-b: Config.Datacenter {dc!r}")


def status_leader_is_set():
    leader = ca.status.leader()
    check(isinstance(leader, str) and leader, f"status.leader() answered {leader!r}")


def catalog_datacenters_lists_both():
    dcs = ca.catalog.datacenters()
    check("dc-a" in dcs and "dc-b" in dcs, f"catalog.datacenters() answered {dcs!r}")


def register_with_a_ttl_check():
    kw = {} if LEGACY else {"meta": {"team": "core"}}
    ok = ca.agent.service.register(
        NAME, service_id=ID1, address="127.0.0.1", port=8081, tags=["v1"], check=consul.Check.ttl(TTL), **kw
    )
    check(ok is True, f"agent.service.register answered {ok!r}")


def a_ttl_check_starts_critical():
    def probe():
        entry = entry_of(health(ca, A)[1], ID1)
        check(status(entry) == "critical", f"status {status(entry)} (checks {entry.get('Checks')})")
        check(ID1 not in passing_ids(), "listed with passing=True while critical")
        return entry

    entry = poll("the new instance is listed, critical", probe)
    svc = entry["Service"]
    check(svc["Service"] == NAME and svc["Port"] == 8081 and svc["Address"] == "127.0.0.1", f"Service {svc}")
    check("v1" in (svc.get("Tags") or []), f"Tags {svc.get('Tags')}")
    if not LEGACY:
        check((svc.get("Meta") or {}).get("team") == "core", f"Meta {svc.get('Meta')}")
    checks = [c for c in entry["Checks"] if c.get("ServiceID") == ID1]
    check(any(c["CheckID"] == CHECK1 for c in checks), f"no check {CHECK1} in {entry['Checks']}")


def ttl_pass_makes_it_discoverable():
    keep_passing()
    poll("listed with passing=True", lambda: check(ID1 in passing_ids(), "not passing yet"))


def agent_services_lists_it():
    services = ca.agent.services()
    check(ID1 in services, f"agent.services() keys {sorted(services)}")
    check(services[ID1]["Service"] == NAME and services[ID1]["Port"] == 8081, f"{services[ID1]}")


def catalog_lists_it():
    _, services = ca.catalog.services()
    check(NAME in services and "v1" in services[NAME], f"catalog.services(): {services.get(NAME)!r}")
    _, nodes = ca.catalog.service(NAME)
    mine = [n for n in nodes if n["ServiceID"] == ID1]
    check(mine, f"catalog.service({NAME}) ids {[n.get('ServiceID') for n in nodes]}")
    n = mine[0]
    check(n["ServiceName"] == NAME and n["ServicePort"] == 8081, f"catalog entry {n}")
    check(n.get("Datacenter") == "dc-a", f"catalog entry Datacenter {n.get('Datacenter')!r}")


def every_node_of_dc_a_sees_it():
    for address in A_ALL:
        c = client(address)

        def probe(c=c, address=address):
            keep_passing()
            check(ID1 in passing_ids(c, address), f"not passing at {address}")

        poll(f"passing at {address}", probe)


def blocking_query_wakes_on_a_registration():
    keep_passing()  # its TTL does not lapse during the watch
    index0, _ = health(ca, A)
    watcher = client(A)
    seen = []

    def watch():
        index, deadline = index0, time.monotonic() + 12
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            try:
                new, entries = watcher.health.service(NAME, index=str(index), wait="5s")
            except Exception as e:  # noqa: BLE001: reported by the main thread
                seen.append(("error", t0, time.monotonic(), e))
                return
            seen.append(("answer", t0, time.monotonic(), (int(new), ids(entries))))
            if ID2 in ids(entries):
                return
            index = int(new)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    time.sleep(0.7)
    registered_at = time.monotonic()
    deregister_after = {"ttl": TTL, "DeregisterCriticalServiceAfter": "10m"}
    ok = ca.agent.service.register(NAME, service_id=ID2, address="127.0.0.1", port=8082, check=deregister_after)
    check(ok is True, f"registering {ID2} answered {ok!r}")
    thread.join(15)
    check(seen and seen[-1][0] == "answer", f"the blocking call failed or hung: {seen}")
    prev = index0
    for _, t0, t1, (index, got) in seen:
        check(index >= prev, f"X-Consul-Index went back in the watch: {prev} then {index}")
        if t1 < registered_at and t1 - t0 < 4.5:
            check(index > prev, f"answered at once with the same index {index}: the call did not block")
        prev = index
    _, _, t1, (index, got) = seen[-1]
    check(ID2 in got, f"the watch never saw {ID2}: {seen}")
    check(index > index0, f"index {index} not greater than {index0}")
    check(t1 - registered_at < 4.0, f"the watch saw the registration {t1 - registered_at:.1f} s after it")


def warn_and_fail_change_passing():
    keep_passing()
    poll("passing", lambda: check(ID1 in passing_ids(), "not passing"))
    for call, want in ((ca.agent.check.ttl_warn, "warning"), (ca.agent.check.ttl_fail, "critical")):

        def probe(call=call, want=want):
            check(call(CHECK1) is True, f"{call.__name__} did not answer 200")
            got = status(entry_of(health(ca, A)[1], ID1))
            check(got == want, f"status {got}, want {want}")
            check(ID1 not in passing_ids(), f"still listed with passing=True while {want}")

        poll(f"{want} after {call.__name__}", probe)
    keep_passing()
    poll("passing again", lambda: check(ID1 in passing_ids(), "not passing"))


def a_lapsed_ttl_is_critical():
    keep_passing()
    lapsed_after = time.monotonic()

    def probe():
        got = status(entry_of(health(ca, A)[1], ID1))
        check(got == "critical", f"status {got} {time.monotonic() - lapsed_after:.1f} s after the last pass")
        check(ID1 not in passing_ids(), "still listed with passing=True")

    poll("critical once the TTL lapsed", probe)
    check(time.monotonic() - lapsed_after >= 3.0, "critical before its TTL ran out")


def dc_b_sees_dc_a_copies():
    def probe():
        keep_passing()
        entries = health(cb, B, dc="dc-a")[1]
        entry = entry_of(entries, ID1)
        check(entry["Service"]["Port"] == 8081, f"Service {entry['Service']}")
        check(entry["Node"].get("Datacenter") == "dc-a", f"Node {entry['Node']}")
        return entries

    poll("dc-b answers dc='dc-a' with the instance", probe)
    local = health(cb, B)[1]
    check(local == [], f"dc-b's own health.service({NAME}) lists {ids(local)}")


def maintenance_takes_it_out():
    def probe_out():
        keep_passing()
        check(ID1 not in passing_ids(), "still passing in maintenance")
        check(ID1 in ids(health(ca, A)[1]), "no longer listed at all")

    check(ca.agent.service.maintenance(ID1, "true", "compat") is True, "maintenance on did not answer 200")
    poll("out of passing in maintenance", probe_out)

    def probe_back():
        keep_passing()
        check(ID1 in passing_ids(), "not passing after maintenance off")

    check(ca.agent.service.maintenance(ID1, "false") is True, "maintenance off did not answer 200")
    poll("passing after maintenance", probe_back)


def prepared_query_fails_over_to_dc_a():
    answer = cb.query.create(NAME, name=f"{PREFIX}-q", datacenters=["dc-a"])
    check(isinstance(answer, dict) and answer.get("ID"), f"query.create answered {answer!r} (None: a 404)")
    qid = state["query"] = answer["ID"]

    def probe():
        keep_passing()
        res = cb.query.execute(qid)
        check(res.get("Datacenter") == "dc-a", f"Datacenter {res.get('Datacenter')!r}")
        check(int(res.get("Failovers", 0)) >= 1, f"Failovers {res.get('Failovers')!r}")
        check(res.get("Service") == NAME, f"Service {res.get('Service')!r}")
        nodes = [n["Service"]["ID"] for n in res.get("Nodes") or []]
        check(ID1 in nodes, f"Nodes {nodes}")

    poll("query.execute at dc-b answers from dc-a", probe)
    got = cb.query.get(qid)
    check(isinstance(got, list) and got and got[0]["ID"] == qid, f"query.get answered {got!r}")
    check(cb.query.delete(qid) is True, "query.delete did not answer 200")
    listed = [q["ID"] for q in cb.query.list() or []]
    check(qid not in listed, f"query.list() still has {qid}")


def deregister_removes_it_everywhere():
    for sid in (ID1, ID2):
        check(ca.agent.service.deregister(sid) is True, f"deregister({sid}) did not answer 200")
    gone = ids(health(ca, A)[1])
    check(ID1 not in gone and ID2 not in gone, f"dc-a still lists {gone}")
    check(ID1 not in ca.agent.services(), "agent.services() still lists it")

    def probe():
        left = ids(health(cb, B, dc="dc-a")[1])
        check(ID1 not in left, f"dc-b still lists {left} for dc-a")

    poll("dc-b's view of dc-a loses it", probe, timeout=STEP_WAIT_S)


if __name__ == "__main__":
    try:
        run(
            f"{PREFIX} {VERSION} against dc-a {A}, dc-b {B}",
            [
                agent_self_names_the_dc,
                status_leader_is_set,
                catalog_datacenters_lists_both,
                register_with_a_ttl_check,
                a_ttl_check_starts_critical,
                ttl_pass_makes_it_discoverable,
                agent_services_lists_it,
                catalog_lists_it,
                every_node_of_dc_a_sees_it,
                blocking_query_wakes_on_a_registration,
                warn_and_fail_change_passing,
                a_lapsed_ttl_is_critical,
                dc_b_sees_dc_a_copies,
                maintenance_takes_it_out,
                prepared_query_fails_over_to_dc_a,
                deregister_removes_it_everywhere,
            ],
        )
    except StepFailed as e:  # raised outside a step (none expected)
        raise SystemExit(f"FAILED: {e}") from e
