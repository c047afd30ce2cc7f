#!/usr/bin/env bash
# Runs tandem: a complete two-DC sandbox (dc-a and dc-b) on loopback with embedded
# defaults. Installs what the build needs when it is missing. Extra arguments go to
# `tandem dev` (see `./run.sh --help`).
set -euo pipefail
cd "$(dirname "$0")"
. ./.ci/prereqs.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tandem-target}"
. ./.ci/target-space.sh
target_make_room "$CARGO_TARGET_DIR"
prereqs_first_build_notice
exec cargo run --locked --bin tandem -- dev "$@"
