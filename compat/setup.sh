#!/usr/bin/env bash
# Installs the third-party clients the compatibility scenarios drive, pinned, into a cache
# folder (TANDEM_COMPAT_CACHE, default ~/.cache/tandem-compat): py-consul and python-consul
# (each in its own pip --target dir: both are the module `consul`), nacos-sdk-python, the
# npm packages consul and nacos-naming, and Debian's prometheus. Skips what is there at its
# version. Prints the paths the scenarios use; exits non-zero saying what failed.
set -euo pipefail

CACHE="${TANDEM_COMPAT_CACHE:-$HOME/.cache/tandem-compat}"
mkdir -p "$CACHE"

fail() {
    echo "compat setup: $*" >&2
    exit 1
}

command -v python3 >/dev/null || fail "python3 is not on PATH"
command -v node >/dev/null || fail "node is not on PATH"
command -v npm >/dev/null || fail "npm is not on PATH"

# pip_pkg NAME VERSION: into $CACHE/py/NAME-VERSION, marked done by a .installed file.
pip_pkg() {
    local name=$1 version=$2 dir="$CACHE/py/$1-$2"
    if [ -f "$dir/.installed" ]; then
        echo "have $name==$version in $dir"
        return
    fi
    rm -rf "$dir"
    mkdir -p "$dir"
    echo "installing $name==$version into $dir"
    if ! python3 -m pip install --target "$dir" --no-input --disable-pip-version-check \
        --quiet "$name==$version" >"$dir.log" 2>&1; then
        cat "$dir.log" >&2
        fail "pip could not install $name==$version (log above)"
    fi
    touch "$dir/.installed"
}

# npm_pkg NAME VERSION: into $CACHE/npm/NAME-VERSION/node_modules.
npm_pkg() {
    local name=$1 version=$2 dir="$CACHE/npm/$1-$2"
    if [ -f "$dir/.installed" ]; then
        echo "have $name@$version in $dir"
        return
    fi
    rm -rf "$dir"
    mkdir -p "$dir"
    echo "installing $name@$version into $dir"
    if ! npm install --prefix "$dir" --no-audit --no-fund --save-exact --loglevel=error \
        "$name@$version" >"$dir.log" 2>&1; then
        cat "$dir.log" >&2
        fail "npm could not install $name@$version (log above)"
    fi
    touch "$dir/.installed"
}

pip_pkg py-consul 1.8.0
pip_pkg python-consul 1.1.0
pip_pkg nacos-sdk-python 2.0.11
npm_pkg consul 2.0.1
npm_pkg nacos-naming 2.6.3

if command -v prometheus >/dev/null; then
    echo "have prometheus at $(command -v prometheus)"
else
    command -v apt-get >/dev/null || fail "prometheus is missing and there is no apt-get to install it"
    echo "installing Debian's prometheus"
    log="$CACHE/apt-prometheus.log"
    # policy-rc.d 101: the package's postinst may not start a service; we run our own.
    policy=/usr/sbin/policy-rc.d
    made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
    fi
    ok=1
    {
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            --no-install-recommends prometheus
    } >"$log" 2>&1 || ok=0
    [ "$made_policy" = 1 ] && rm -f "$policy"
    if [ "$ok" = 0 ] && ! command -v prometheus >/dev/null; then
        tail -n 30 "$log" >&2
        fail "apt-get could not install prometheus (log: $log)"
    fi
    command -v prometheus >/dev/null || fail "prometheus was installed but is not on PATH"
    echo "installed $(command -v prometheus)"
fi

echo "compat clients ready in $CACHE:"
echo "  py-consul        $CACHE/py/py-consul-1.8.0"
echo "  python-consul    $CACHE/py/python-consul-1.1.0"
echo "  nacos-sdk-python $CACHE/py/nacos-sdk-python-2.0.11"
echo "  npm consul       $CACHE/npm/consul-2.0.1/node_modules"
echo "  npm nacos-naming $CACHE/npm/nacos-naming-2.6.3/node_modules"
echo "  prometheus       $(command -v prometheus) ($(prometheus --version 2>&1 | head -n 1))"
