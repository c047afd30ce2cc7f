"""Step runner, bounded polling and a plain HTTP helper shared by the Python compatibility
scenarios (standard library only). A scenario is a list of functions run in order; the
first failure prints the step's name and the reason, and the process exits with 1."""

import json
import os
import sys
import time
import traceback
import urllib.error
import urllib.request

# The longest any one wait of a step may take.
STEP_WAIT_S = 20.0


class StepFailed(Exception):
    """A step saw something other than what a user of the client expects."""


def check(cond, msg):
    if not cond:
        raise StepFailed(msg)


def poll(what, probe, timeout=STEP_WAIT_S, interval=0.25):
    """Calls probe() until it returns without raising; its value is returned. After
    `timeout` seconds the last reason (a StepFailed or any error) fails the step."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return probe()
        except Exception as e:  # noqa: BLE001: any error is retried until the deadline
            last = e if isinstance(e, StepFailed) else f"{type(e).__name__}: {e}"
        if time.monotonic() > deadline:
            raise StepFailed(f"not within {timeout:.0f} s: {what} (last: {last})")
        time.sleep(interval)


def addr(var):
    """host:port of a DC from the environment (TANDEM_A, TANDEM_B)."""
    value = os.environ.get(var, "").strip()
    if not value:
        print(f"{var} is not set (host:port of a tandem node's HTTP API)", file=sys.stderr)
        sys.exit(2)
    return value.replace("http://", "").rstrip("/")


def all_addrs(var, first):
    """Every node of a DC (TANDEM_A_ALL, TANDEM_B_ALL), or just `first`."""
    value = os.environ.get(var, "").strip()
    return [a.strip().replace("http://", "").rstrip("/") for a in value.split(",") if a.strip()] or [first]


def host_port(address):
    host, _, port = address.rpartition(":")
    return host, int(port)


def http(method, url, body=None, timeout=10.0):
    """(status, headers, decoded JSON or text) of one request; a JSON body is sent as JSON."""
    data, headers = None, {}
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, hdrs, raw = resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, e.headers, e.read()
    text = raw.decode("utf-8", "replace")
    try:
        return status, hdrs, json.loads(text)
    except ValueError:
        return status, hdrs, text


def run(title, steps):
    """Runs the steps in order, one line each; exits 1 at the first failure."""
    started = time.monotonic()
    print(f"{title}: {len(steps)} steps", flush=True)
    for fn in steps:
        name = fn.__name__
        t0 = time.monotonic()
        try:
            fn()
        except StepFailed as e:
            print(f"FAILED step {name}: {e}", flush=True)
            sys.exit(1)
        except Exception as e:  # noqa: BLE001: an unexpected error fails the step too
            traceback.print_exc()
            print(f"FAILED step {name}: {type(e).__name__}: {e}", flush=True)
            sys.exit(1)
        print(f"ok   {name} ({time.monotonic() - t0:.1f} s)", flush=True)
    print(f"PASSED {title}: {len(steps)} steps in {time.monotonic() - started:.1f} s", flush=True)
