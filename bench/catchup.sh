#!/usr/bin/env bash
# A new member's catch-up (issue 18, docs/benchmarks.md): a DC of three tandem members
# on loopback holding N persistent instances (100 services), then a fourth node started
# with `[cluster] join = true` and added with `tandem cluster add`, which answers once
# the node was sent the group's state (a Raft snapshot), caught up and was promoted.
# Prints the registration rate, the add's time, the snapshot the new member installed and
# the data dirs' sizes. Every process it starts is stopped when it ends.
#
#   bench/catchup.sh [N]        N instances (default 100000)
#   TANDEM_BIN=path/to/tandem   the binary (default: the debug build of CARGO_TARGET_DIR)
set -euo pipefail
N=${1:-100000}
BIN=${TANDEM_BIN:-${CARGO_TARGET_DIR:-target}/debug/tandem}
DIR=$(mktemp -d /tmp/tandem-catchup.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

free_port() { python3 -c 'import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM if sys.argv[1]=="udp" else socket.SOCK_STREAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' "$1"; }

"$BIN" certs --out "$DIR/certs" --dc dc-a --nodes 4 >/dev/null
declare -a RAFT HTTP
for i in 1 2 3 4; do RAFT[$i]=$(free_port udp); HTTP[$i]=$(free_port tcp); done
entry() { echo "{ id = $1, raft_addr = \"127.0.0.1:${RAFT[$1]}\", http_addr = \"127.0.0.1:${HTTP[$1]}\" }"; }
config() { # id, members..., [join]
    local id=$1 join=$2; shift 2
    local list=""
    for m in "$@"; do list="$list$(entry "$m"), "; done
    cat >"$DIR/n$id.toml" <<EOF
dc = "dc-a"
data_dir = "$DIR/n$id"
http_addr = "127.0.0.1:${HTTP[$id]}"
[limits]
requests_per_second_per_address = 1000000
requests_burst_per_address = 1000000
[cluster]
node_id = $id
members = [$list]
ca_cert = "$DIR/certs/ca.pem"
cert = "$DIR/certs/n$id.dc-a.tandem-node.pem"
key = "$DIR/certs/n$id.dc-a.tandem-node.key"
join = $join
EOF
}
start() {
    RUST_LOG=${RUST_LOG:-info} "$BIN" server --config "$DIR/n$1.toml" >"$DIR/n$1.log" 2>&1 &
    PIDS+=($!)
}
for i in 1 2 3; do config "$i" false 1 2 3; start "$i"; done
config 4 true 1 2 3 4

# The leader, once one serves writes.
LEADER=""
for _ in $(seq 1 100); do
    for i in 1 2 3; do
        if curl -fsS "http://127.0.0.1:${HTTP[$i]}/v1/status" 2>/dev/null | grep -q '"serving_writes":true'; then LEADER=$i; fi
    done
    [ -n "$LEADER" ] && break
    sleep 0.2
done
[ -n "$LEADER" ] || { echo "no leader"; exit 1; }

python3 - "$N" "${HTTP[$LEADER]}" <<'EOF'
import http.client, json, sys, threading, time
n, port = int(sys.argv[1]), int(sys.argv[2])
def work(lo, hi):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for i in range(lo, hi):
        body = json.dumps({"service": f"svc-{i % 100}", "instance_id": f"i-{i}", "address": "10.1.2.3",
                           "port": 8080, "persistent": True, "metadata": {"zone": "z1", "version": "1.4.2"}})
        c.request("POST", "/v1/register", body, {"Content-Type": "application/json"})
        r = c.getresponse(); r.read()
        if r.status != 200: raise SystemExit(f"register {i}: {r.status}")
t = time.time(); k = 8
ts = [threading.Thread(target=work, args=(j * n // k, (j + 1) * n // k)) for j in range(k)]
[x.start() for x in ts]; [x.join() for x in ts]
print(f"registered {n} instances in {time.time() - t:.1f} s ({n / (time.time() - t):.0f}/s)")
EOF

start 4
for _ in $(seq 1 50); do curl -fsS "http://127.0.0.1:${HTTP[4]}/v1/ready" >/dev/null 2>&1 && break; sleep 0.2; done
T0=$(date +%s%N)
"$BIN" cluster add --id 4 --raft-addr "127.0.0.1:${RAFT[4]}" --http-addr "127.0.0.1:${HTTP[4]}" --addr "http://127.0.0.1:${HTTP[$LEADER]}"
T1=$(date +%s%N)
echo "tandem cluster add: $(( (T1 - T0) / 1000000 )) ms for $N instances"
grep -h "replaced by a Raft snapshot" "$DIR/n4.log" | sed 's/\x1b\[[0-9;]*m//g' | tail -1 || true
du -sh "$DIR"/n{1,4}/state | sed 's/^/state dir: /'
curl -fsS "http://127.0.0.1:${HTTP[4]}/v1/services/default/svc-7" | python3 -c 'import json,sys; print("node 4 serves svc-7 with", len(json.load(sys.stdin)["instances"]), "instances")'
