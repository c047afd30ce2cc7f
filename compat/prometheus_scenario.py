"""Prometheus (Debian's `prometheus` on PATH) discovering targets through tandem's HTTP-SD
endpoint at dc-b (TANDEM_B) for an instance registered at dc-a (TANDEM_A) with tandem's own
API. Prometheus runs as a child process on a free loopback port and is always stopped."""

import os
import shutil
import socket
import subprocess
import tempfile
import urllib.parse

from steps import StepFailed, addr, check, http, poll, run

A, B = addr("TANDEM_A"), addr("TANDEM_B")
SVC = "promsd-web"
TARGET_PORT = 9391
WANT = {
    "__address__": f"127.0.0.1:{TARGET_PORT}",
    "__meta_tandem_service": SVC,
    "__meta_tandem_dc": "dc-a",
    "__meta_tandem_zone": "z1",
    "__meta_tandem_health": "healthy",
    "__meta_tandem_tags": ",t1,",
    "__meta_tandem_metadata_team": "core",
    # A metadata key that is no valid label name is sanitized (one bad name fails the refresh).
    "__meta_tandem_metadata_build_id": "42",
    "__meta_tandem_namespace": "default",
}
WORK = tempfile.mkdtemp(prefix="promsd-")
state = {}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def targets():
    status, _, body = http("GET", f"http://127.0.0.1:{state['port']}/api/v1/targets")
    check(status == 200 and body.get("status") == "success", f"/api/v1/targets: {status} {body}")
    active = body["data"].get("activeTargets") or []
    return [t for t in active if t.get("discoveredLabels", {}).get("__meta_tandem_service") == SVC]


def log_tail():
    try:
        with open(os.path.join(WORK, "prometheus.log"), encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-15:])
    except OSError:
        return ""


def sd_endpoint_answers_json():
    status, headers, body = http("GET", f"http://{B}/v1/sd/prometheus")
    check(status == 200, f"GET /v1/sd/prometheus at dc-b: {status} {body}")
    ctype = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
    check(ctype == "application/json", f"Content-Type {headers.get('Content-Type')!r}: Prometheus refuses it")
    check(isinstance(body, list), f"the answer is not a JSON array of target groups: {body!r}")


def register_at_dc_a():
    body = {
        "service": SVC, "address": "127.0.0.1", "port": TARGET_PORT, "zone": "z1", "tags": ["t1"],
        "metadata": {"team": "core", "build-id": "42"}, "persistent": True,
    }
    status, _, answer = http("POST", f"http://{A}/v1/register", body)
    check(status in (200, 201) and answer.get("instance_id"), f"POST /v1/register: {status} {answer}")
    state["instance_id"] = answer["instance_id"]


def start_prometheus():
    port = state["port"] = free_port()
    config = os.path.join(WORK, "prometheus.yml")
    with open(config, "w", encoding="utf-8") as f:
        f.write(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: tandem\n    http_sd_configs:\n"
            f"      - url: http://{B}/v1/sd/prometheus\n        refresh_interval: 1s\n"
        )
    log = open(os.path.join(WORK, "prometheus.log"), "w", encoding="utf-8")  # noqa: SIM115: the child's
    state["proc"] = subprocess.Popen(
        [
            "prometheus", f"--config.file={config}", f"--storage.tsdb.path={os.path.join(WORK, 'data')}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
        ],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )

    def probe():
        check(state["proc"].poll() is None, f"prometheus exited: {log_tail()}")
        status, _, _ = http("GET", f"http://127.0.0.1:{port}/-/ready", timeout=2)
        check(status == 200, f"/-/ready answered {status}")

    poll("prometheus is ready", probe)


def prometheus_discovers_the_target():
    def probe():
        found = targets()
        check(found, f"no target with __meta_tandem_service={SVC} yet; prometheus log: {log_tail()}")
        return found[0]["discoveredLabels"]

    # The SD refresh (1 s), Prometheus's own 5 s batching of discovery updates, replication.
    labels = poll("the target appears at dc-b's prometheus", probe, timeout=25)
    wrong = {k: (labels.get(k), v) for k, v in WANT.items() if labels.get(k) != v}
    check(not wrong, f"labels (got, want): {wrong}; all: {labels}")


def deregistered_target_goes():
    # An instance id holds '#' (service#host:port#uuid): percent-encoded in the path.
    url = f"http://{A}/v1/instances/default/{SVC}/{urllib.parse.quote(state['instance_id'], safe='')}"
    status, _, body = http("DELETE", url)
    check(status in (200, 204), f"DELETE {url}: {status} {body}")
    poll("the target leaves prometheus", lambda: check(not targets(), "still listed"), timeout=25)


def main():
    try:
        run(
            f"prometheus http_sd at dc-b {B} (registered at dc-a {A})",
            [
                sd_endpoint_answers_json,
                register_at_dc_a,
                start_prometheus,
                prometheus_discovers_the_target,
                deregistered_target_goes,
            ],
        )
    except StepFailed as e:
        raise SystemExit(f"FAILED: {e}") from e
    finally:
        proc = state.get("proc")
        if proc is not None:
            proc.kill()
            proc.wait(timeout=10)
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
