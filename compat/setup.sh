#!/usr/bin/env bash
# Installs the third-party clients the compatibility scenarios drive, pinned, into a cache
# folder (TANDEM_COMPAT_CACHE, default ~/.cache/tandem-compat): py-consul and python-consul
# (each in its own pip --target dir: both are the module `consul`), nacos-sdk-python, the
# npm packages consul and nacos-naming, and Debian's prometheus. Skips what is there at its
# version. Prints the paths the scenarios use; exits non-zero saying what failed.
set -euo pipefail

CACHE="${TANDEM_COMPAT_CACHE:-$HOME/.cache/tandem-compat}"
mkdir -p "$CACHE"

SETUP_NAME="compat setup"
# shellcheck source=compat/lib.sh
. "$(dirname "$0")/lib.sh"

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

pip_pkg py-consul 1.8.0
pip_pkg python-consul 1.1.0
pip_pkg nacos-sdk-python 2.0.11
npm_pkg consul 2.0.1
npm_pkg nacos-naming 2.6.3

apt_bin prometheus prometheus

echo "compat clients ready in $CACHE:"
echo "  py-consul        $CACHE/py/py-consul-1.8.0"
echo "  python-consul    $CACHE/py/python-consul-1.1.0"
echo "  nacos-sdk-python $CACHE/py/nacos-sdk-python-2.0.11"
echo "  npm consul       $CACHE/npm/consul-2.0.1/node_modules"
echo "  npm nacos-naming $CACHE/npm/nacos-naming-2.6.3/node_modules"
echo "  prometheus       $(command -v prometheus) ($(prometheus --version 2>&1 | head -n 1))"
