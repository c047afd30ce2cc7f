# Sourced by run.sh, test.sh and .ci/run: makes sure the toolchain and the C libraries the
# build needs are present, installing them when it can, and otherwise stops with one line
# that says what to install.
prereqs_fail() { echo "tandem: $*" >&2; exit 1; }

# Runs a command as root: directly, or through sudo when that works without a password.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo -n "$@"
  else
    return 126
  fi
}

can_apt() {
  command -v apt-get >/dev/null 2>&1 || return 1
  [ "$(id -u)" -eq 0 ] || { command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; }
}

apt_install() {
  echo "tandem: installing $* (apt-get)" >&2
  as_root apt-get update -qq >&2 || true
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2 ||
    prereqs_fail "apt-get install $* failed; install them by hand and run this again"
}

# --- Rust 1.85 or newer -----------------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  prereqs_fail "cargo not found: install Rust 1.85 or newer with rustup (https://rustup.rs; Debian's rustc is too old), then run this again"
fi
rust_minor=$(rustc --version 2>/dev/null | sed -nE 's/^rustc 1\.([0-9]+).*/\1/p')
if [ -z "$rust_minor" ] || [ "$rust_minor" -lt 85 ]; then
  prereqs_fail "$(rustc --version 2>/dev/null || echo 'rustc: not found') is too old: tandem needs Rust 1.85 or newer (rustup update stable)"
fi

# --- libclang (bindgen, for RocksDB's bindings) and a C++ compiler (RocksDB itself) -------
. "$(dirname "${BASH_SOURCE[0]}")/libclang.sh"
missing=()
case "$(libclang_decision)" in
  found) ;;
  path=*) export LIBCLANG_PATH="$(libclang_decision | cut -d= -f2-)" ;;
  badpath) prereqs_fail "LIBCLANG_PATH=$LIBCLANG_PATH holds no libclang.so or libclang-N.so; fix it or unset it" ;;
  install) missing+=(libclang-dev clang) ;;
esac
command -v c++ >/dev/null 2>&1 || missing+=(g++)
if [ "${#missing[@]}" -gt 0 ]; then
  if can_apt; then
    apt_install "${missing[@]}"
  else
    prereqs_fail "the build needs ${missing[*]} (libclang and a C++ compiler, for RocksDB): install them (Debian: apt-get install ${missing[*]}) and run this again"
  fi
  [ "$(libclang_decision)" = found ] ||
    prereqs_fail "libclang-dev is installed but no libclang.so or libclang-N.so is where the build looks; set LIBCLANG_PATH to the folder that has it"
fi
unset missing rust_minor

# The first build compiles RocksDB's C++ (a quarter of an hour on two cores): say so before
# cargo goes quiet in it.
prereqs_first_build_notice() {
  local target="${CARGO_TARGET_DIR:-$HOME/.cache/tandem-target}"
  if ! ls "$target"/debug/build/librocksdb-sys-*/out/librocksdb.a >/dev/null 2>&1; then
    echo "tandem: first build: compiling RocksDB from source takes about 15-18 minutes on two cores (later builds take seconds to a minute)" >&2
  fi
}
