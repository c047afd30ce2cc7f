#!/usr/bin/env bash
# Runs every test of the workspace: unit and property tests, the event-log conformance
# suite, the deterministic replication simulation, real-process kill -9 and two-DC tests,
# and the short chaos drills. Installs what the build needs when it is missing.
set -euo pipefail
cd "$(dirname "$0")"
. ./.ci/prereqs.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tandem-target}"
. ./.ci/target-space.sh
target_make_room "$CARGO_TARGET_DIR"
prereqs_first_build_notice
# tests/tidy.rs reads `cargo tree --target all --offline`: every platform's crates must be here.
cargo fetch --locked
cargo test --locked --workspace --no-fail-fast "$@"
