#!/usr/bin/env bash
# Runs tandem's benchmarks in one go (about 3.5 minutes with both peers, 2.5 without) and writes the
# tables to bench/results/latest.md. Extra arguments go to tandem-bench, for example:
#   bench/run.sh --secs 3            # shorter steps
#   bench/run.sh --leases 100000     # M2's lease count
# Peers (etcd, r-nacos) are measured when installed: run bench/peers.sh first.
# Builds with the dev profile only (see docs/benchmarks.md for why).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tandem-target}"
mkdir -p bench/results
cargo build --locked -p tandem-bench
exec timeout 900 "$CARGO_TARGET_DIR/debug/tandem-bench" all --markdown bench/results/latest.md "$@"
