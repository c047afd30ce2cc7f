# Sourced by run.sh and test.sh: makes sure the toolchain and the C libraries the build
# needs are present, installing them when they are not.
need_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "tandem: installing the Rust toolchain with rustup" >&2
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >&2
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi

# RocksDB's Rust bindings are generated with bindgen, which needs libclang; its C++ needs
# a compiler.
have_libclang() {
  ls /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1
}
if ! have_libclang || ! command -v c++ >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "tandem: installing libclang-dev and a C++ compiler (for RocksDB)" >&2
    need_root apt-get update -qq >&2 || true
    need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libclang-dev clang g++ >&2
  else
    echo "tandem: please install libclang (LLVM) and a C++ compiler; RocksDB needs them" >&2
    exit 1
  fi
fi
