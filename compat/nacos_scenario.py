"""nacos-sdk-python 2.0.11 (its HTTP v1 `nacos.NacosClient`) against tandem's
Nacos-compatible API at dc-a (TANDEM_A), and the replicated copies read at dc-b (TANDEM_B)
through tandem's own API."""

import importlib.metadata
import tempfile

import nacos
from steps import StepFailed, addr, check, http, poll, run

A, B = addr("TANDEM_A"), addr("TANDEM_B")
SVC = "nacospy-svc"
IP = "127.0.0.1"
PORT, G1_PORT = 9101, 9102
META = {"team": "core", "v": "1"}
LOGS = tempfile.mkdtemp(prefix="nacospy-logs-")
client = nacos.NacosClient(A, namespace="public", logDir=LOGS)


# Instances the client beats for, with their group and weight (as a user's beat loop would).
BEATING = {PORT: ("DEFAULT_GROUP", 2.0)}


def beat():
    for port, (group, weight) in BEATING.items():
        client.send_heartbeat(SVC, IP, port, cluster_name="c1", weight=weight, metadata=META, group_name=group)


def host_of(answer, port):
    hosts = [h for h in answer.get("hosts") or [] if h.get("ip") == IP and int(h.get("port", 0)) == port]
    check(hosts, f"no {IP}:{port} in hosts {answer.get('hosts')}")
    return hosts[0]


def register_an_ephemeral_instance():
    ok = client.add_naming_instance(SVC, IP, PORT, cluster_name="c1", weight=2.0, metadata=META, ephemeral=True)
    check(ok is True, "add_naming_instance: the server did not answer `ok`")


def heartbeat_is_answered():
    answer = client.send_heartbeat(SVC, IP, PORT, cluster_name="c1", weight=2.0, metadata=META)
    check(isinstance(answer, dict), f"send_heartbeat answered {answer!r}, not a JSON object")
    interval = answer.get("clientBeatInterval")
    check(isinstance(interval, (int, float)) and interval > 0, f"clientBeatInterval {interval!r} in {answer}")
    check(answer.get("code", 10200) == 10200, f"code {answer.get('code')!r} for a known instance in {answer}")


def list_sees_it_as_registered():
    def probe():
        beat()
        answer = client.list_naming_instance(SVC, healthy_only=True)
        check(answer.get("name") == f"DEFAULT_GROUP@@{SVC}", f"name {answer.get('name')!r}")
        return host_of(answer, PORT)

    h = poll("listed healthy", probe)
    check(float(h.get("weight")) == 2.0, f"weight {h.get('weight')!r}")
    check(h.get("metadata") == META, f"metadata {h.get('metadata')!r}")
    check(h.get("healthy") is True and h.get("enabled") is True, f"healthy/enabled in {h}")
    check(h.get("clusterName") == "c1", f"clusterName {h.get('clusterName')!r}")
    check(h.get("ephemeral") is True, f"ephemeral {h.get('ephemeral')!r}")
    check(h.get("instanceId"), f"no instanceId in {h}")


def instance_detail():
    d = client.get_naming_instance(SVC, IP, PORT, cluster_name="c1")
    check(d.get("ip") == IP and int(d.get("port", 0)) == PORT, f"detail {d}")
    check((d.get("metadata") or {}).get("team") == "core", f"detail metadata {d.get('metadata')!r}")


def modify_changes_weight_and_metadata():
    meta = {"team": "core", "v": "2"}
    ok = client.modify_naming_instance(SVC, IP, PORT, cluster_name="c1", weight=3.0, metadata=meta)
    check(ok is True, "modify_naming_instance: the server did not answer `ok`")

    def probe():
        beat()
        h = host_of(client.list_naming_instance(SVC, healthy_only=True), PORT)
        check(float(h.get("weight")) == 3.0 and h.get("metadata") == meta, f"host {h}")

    META.update(meta)
    BEATING[PORT] = ("DEFAULT_GROUP", 3.0)
    poll("the list shows the new weight and metadata", probe)


def a_named_group_round_trips():
    ok = client.add_naming_instance(SVC, IP, G1_PORT, cluster_name="c1", metadata=META, group_name="g1")
    check(ok is True, "add_naming_instance in group g1: the server did not answer `ok`")
    BEATING[G1_PORT] = ("g1", 1.0)

    def probe():
        answer = client.list_naming_instance(SVC, group_name="g1")
        check(answer.get("name") == f"g1@@{SVC}", f"name {answer.get('name')!r}")
        host_of(answer, G1_PORT)
        ports = [int(h["port"]) for h in answer.get("hosts") or []]
        check(PORT not in ports, f"group g1 lists the DEFAULT_GROUP instance: {ports}")

    poll("group g1 lists its instance", probe)
    ports = [int(h["port"]) for h in client.list_naming_instance(SVC).get("hosts") or []]
    check(G1_PORT not in ports, f"DEFAULT_GROUP lists the g1 instance: {ports}")


def dc_b_holds_the_copies():
    for name, port in ((SVC, PORT), (f"g1::{SVC}", G1_PORT)):

        def probe(name=name, port=port):
            beat()
            status, _, body = http("GET", f"http://{B}/v1/services/default/{name}?dc=all")
            check(status == 200, f"GET {name} at dc-b: {status} {body}")
            mine = [i for i in body.get("instances") or [] if i.get("address") == IP and i.get("port") == port]
            check(mine, f"dc-b has no {IP}:{port} for {name}: {body.get('instances')}")
            check(mine[0].get("owner_dc") == "dc-a", f"owner_dc {mine[0].get('owner_dc')!r}")
            check((mine[0].get("metadata") or {}).get("team") == "core", f"metadata {mine[0].get('metadata')}")

        poll(f"dc-b holds {name}", probe)


def remove_takes_it_out():
    BEATING.clear()
    for port, group in ((PORT, "DEFAULT_GROUP"), (G1_PORT, "g1")):
        ok = client.remove_naming_instance(SVC, IP, port, cluster_name="c1", group_name=group)
        check(ok is True, f"remove_naming_instance {port} in {group}: the server did not answer `ok`")
    hosts = client.list_naming_instance(SVC).get("hosts") or []
    check(not [h for h in hosts if int(h.get("port", 0)) == PORT], f"still listed: {hosts}")

    def probe():
        status, _, body = http("GET", f"http://{B}/v1/services/default/{SVC}?dc=all")
        left = [i for i in (body.get("instances") or []) if i.get("port") == PORT] if status == 200 else []
        check(status in (200, 404) and not left, f"dc-b still has it: {status} {body}")

    poll("dc-b loses the copy", probe)


if __name__ == "__main__":
    try:
        run(
            f"nacos-sdk-python {importlib.metadata.version('nacos-sdk-python')} (NacosClient) against dc-a {A}, dc-b {B}",
            [
                register_an_ephemeral_instance,
                heartbeat_is_answered,
                list_sees_it_as_registered,
                instance_detail,
                modify_changes_weight_and_metadata,
                a_named_group_round_trips,
                dc_b_holds_the_copies,
                remove_takes_it_out,
            ],
        )
    except StepFailed as e:
        raise SystemExit(f"FAILED: {e}") from e
