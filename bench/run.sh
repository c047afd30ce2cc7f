#!/usr/bin/env bash
# Runs tandem's benchmarks in one go at the sizes of issue 6's targets (100k leases, 10k
# services x 10, 10k watchers, a 60 s partition; about 15 minutes with both peers) and writes
# the tables to bench/results/latest.md. Extra arguments go to tandem-bench, for example:
#   bench/run.sh --secs 3 --leases 10000 --services 1000 --watchers 2000 --partition-secs 15   # quick
# Peers (etcd, r-nacos) are measured when installed: run bench/peers.sh first.
# Builds with the dev profile only (see docs/benchmarks.md for why).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tandem-target}"
mkdir -p bench/results
cargo build --locked -p tandem-bench
exec timeout 2400 "$CARGO_TARGET_DIR/debug/tandem-bench" all --markdown bench/results/latest.md "$@"
