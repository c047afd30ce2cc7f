#!/usr/bin/env bash
# Installs the peers tandem-bench compares against, when they are available:
# - etcd 3.4 from Debian (etcd-server, etcd-client);
# - r-nacos from crates.io (cargo install rnacos, release build into ~/.cache/rnacos-install).
# A peer that cannot be installed is reported and skipped; tandem-bench then says
# "not installed" for it and goes on. Nothing is started here.
set -uo pipefail

if command -v etcd >/dev/null; then
  echo "etcd: already installed: $(etcd --version | head -1)"
elif command -v apt-get >/dev/null; then
  apt-get update -qq || true
  if apt-cache policy etcd-server 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server etcd-client \
      && echo "etcd: installed $(etcd --version | head -1)" \
      || echo "etcd: apt-get install failed; skipped"
    # The package may start a system service on port 2379; the bench starts its own on
    # free loopback ports, so a running service only costs CPU: stop it if it runs.
    if command -v systemctl >/dev/null && systemctl is-active --quiet etcd 2>/dev/null; then
      systemctl stop etcd || true
    fi
  else
    echo "etcd: no etcd-server package in the apt sources; skipped"
  fi
else
  echo "etcd: no apt-get on this machine; skipped"
fi

RNACOS_ROOT="$HOME/.cache/rnacos-install"
if [ -x "$RNACOS_ROOT/bin/rnacos" ] || command -v rnacos >/dev/null; then
  echo "r-nacos: already installed"
else
  echo "r-nacos: cargo install rnacos (release build: about 11 minutes on 2 cores doing little else, 25-40 beside other builds)"
  if timeout 3600 nice -n 10 cargo install --locked rnacos --root "$RNACOS_ROOT"; then
    echo "r-nacos: installed in $RNACOS_ROOT/bin"
  else
    echo "r-nacos: cargo install failed or took over an hour; skipped"
  fi
fi
