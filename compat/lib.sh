# Install helpers shared by compat/setup.sh and compat/browser-setup.sh (sourced, not run).
# The caller sets SETUP_NAME (for messages) and CACHE (the cache folder).

fail() {
    echo "$SETUP_NAME: $*" >&2
    exit 1
}

# npm_pkg NAME VERSION: into $CACHE/npm/NAME-VERSION/node_modules, marked done by a
# .installed file.
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

# apt_bin BIN PACKAGE: installs Debian's PACKAGE unless BIN is on PATH. Services the
# package would start are not started (policy-rc.d 101): the tests run their own.
apt_bin() {
    local bin=$1 pkg=$2 log="$CACHE/apt-$2.log" policy=/usr/sbin/policy-rc.d made_policy=0 ok=1
    if command -v "$bin" >/dev/null; then
        echo "have $bin at $(command -v "$bin")"
        return
    fi
    command -v apt-get >/dev/null || fail "$bin is missing and there is no apt-get to install it"
    echo "installing Debian's $pkg"
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
    fi
    {
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            --no-install-recommends "$pkg"
    } >"$log" 2>&1 || ok=0
    if [ "$made_policy" = 1 ]; then rm -f "$policy"; fi
    if [ "$ok" = 0 ] && ! command -v "$bin" >/dev/null; then
        tail -n 30 "$log" >&2
        fail "apt-get could not install $pkg (log: $log)"
    fi
    command -v "$bin" >/dev/null || fail "$pkg was installed but $bin is not on PATH"
    echo "installed $(command -v "$bin")"
}
