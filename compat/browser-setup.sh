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

fail() {
    echo "browser setup: $*" >&2
    exit 1
}

command -v node >/dev/null || fail "node is not on PATH"
command -v npm >/dev/null || fail "npm is not on PATH"

if command -v chromium >/dev/null; then
    echo "have chromium at $(command -v chromium)"
else
    command -v apt-get >/dev/null || fail "chromium is missing and there is no apt-get to install it"
    echo "installing Debian's chromium"
    log="$CACHE/apt-chromium.log"
    ok=1
    {
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            --no-install-recommends chromium
    } >"$log" 2>&1 || ok=0
    if [ "$ok" = 0 ] && ! command -v chromium >/dev/null; then
        tail -n 30 "$log" >&2
        fail "apt-get could not install chromium (log: $log)"
    fi
    command -v chromium >/dev/null || fail "chromium was installed but is not on PATH"
    echo "installed $(command -v chromium)"
fi

# Into $CACHE/npm/puppeteer-core-VERSION/node_modules, marked done by a .installed file.
dir="$CACHE/npm/puppeteer-core-$PUPPETEER_CORE"
if [ -f "$dir/.installed" ]; then
    echo "have puppeteer-core@$PUPPETEER_CORE in $dir"
else
    rm -rf "$dir"
    mkdir -p "$dir"
    echo "installing puppeteer-core@$PUPPETEER_CORE into $dir"
    if ! npm install --prefix "$dir" --no-audit --no-fund --save-exact --loglevel=error \
        "puppeteer-core@$PUPPETEER_CORE" >"$dir.log" 2>&1; then
        cat "$dir.log" >&2
        fail "npm could not install puppeteer-core@$PUPPETEER_CORE (log above)"
    fi
    touch "$dir/.installed"
fi

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
