#!/usr/bin/env bash
# Installs what the web console's browser test drives: Debian's chromium (skipped when a
# `chromium` is on PATH) and npm puppeteer-core, pinned, into the compat cache folder
# (TANDEM_COMPAT_CACHE, default ~/.cache/tandem-compat). puppeteer-core downloads no browser.
# Prints the paths the test uses; exits non-zero saying what failed.
set -euo pipefail

# Its revisions.ts names Chrome 156, Debian's chromium here.
PUPPETEER_CORE=25.16.0

CACHE="${TANDEM_COMPAT_CACHE:-$HOME/.cache/tandem-compat}"
mkdir -p "$CACHE"

SETUP_NAME="browser setup"
# shellcheck source=compat/lib.sh
. "$(dirname "$0")/lib.sh"

command -v node >/dev/null || fail "node is not on PATH"
command -v npm >/dev/null || fail "npm is not on PATH"

apt_bin chromium chromium

npm_pkg puppeteer-core "$PUPPETEER_CORE"
dir="$CACHE/npm/puppeteer-core-$PUPPETEER_CORE"

# Both must actually run: chromium prints its version, node loads puppeteer-core.
# (Debian's launcher may print a shell warning before the version: the last line is kept.)
version=$(timeout 30 chromium --version 2>&1 | tail -n 1) || true
[[ "$version" == Chromium\ * ]] || fail "chromium --version printed: $version"
NODE_PATH="$dir/node_modules" timeout 30 node -e "require('puppeteer-core')" 2>&1 ||
    fail "node $(node --version) cannot load puppeteer-core@$PUPPETEER_CORE"

echo "browser test ready:"
echo "  chromium       $(command -v chromium) ($version)"
echo "  puppeteer-core $dir/node_modules (node $(node --version))"
# For tests/console.rs.
echo "NODE_PATH=$dir/node_modules"
