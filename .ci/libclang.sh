# Sourced by .ci/prereqs.sh and by tests/prereqs.rs: decides whether the build can find
# libclang the way clang-sys 1.9 (bindgen's libclang loader, used by librocksdb-sys) does.
#
# This build links libclang at build time (bindgen without its `runtime` feature). clang-sys
# then searches, in this order: $LIBCLANG_PATH alone when it is set; `llvm-config --prefix`'s
# bin/, lib/ and lib64/; then the folders below. In each folder it accepts only `libclang.so`
# or `libclang-*.so` (unversioned: `ld` cannot link `libclang.so.1`), never a name with
# `-cpp.` in it (libclang-cpp is LLVM's C++ library, not libclang). See clang-sys's
# build/common.rs (DIRECTORIES_LINUX, search_directory) and build/dynamic.rs.
#
# Every path is taken below $LIBCLANG_ROOT (default: empty, the real /), so a test can lay
# out fake library folders.

# clang-sys's DIRECTORIES_LINUX, in its order.
libclang_search_globs() {
  local r="${LIBCLANG_ROOT:-}"
  printf '%s\n' "$r"/usr/local/llvm*/lib* "$r"/usr/local/lib*/*/* "$r"/usr/local/lib*/* \
    "$r"/usr/local/lib* "$r"/usr/lib*/*/* "$r"/usr/lib*/* "$r"/usr/lib*
}

# Prints the linkable libclang in folder $1, if any.
libclang_in_dir() {
  local f
  [ -d "$1" ] || return 1
  for f in "$1"/libclang.so "$1"/libclang-*.so; do
    case "${f##*/}" in *-cpp.*) continue ;; esac
    [ -e "$f" ] && { printf '%s\n' "$f"; return 0; }
  done
  return 1
}

# Prints the libclang clang-sys would link, or fails. Honors LIBCLANG_PATH as clang-sys does
# (a folder, or a file in a folder).
libclang_found() {
  local d
  if [ -n "${LIBCLANG_PATH:-}" ]; then
    if [ -f "$LIBCLANG_PATH" ]; then
      libclang_in_dir "$(dirname "$LIBCLANG_PATH")" >/dev/null && { printf '%s\n' "$LIBCLANG_PATH"; return 0; }
      return 1
    fi
    libclang_in_dir "$LIBCLANG_PATH"
    return
  fi
  if [ -z "${LIBCLANG_ROOT:-}" ] && command -v llvm-config >/dev/null 2>&1; then
    local p
    p=$(llvm-config --prefix 2>/dev/null) || p=
    for d in "$p/bin" "$p/lib" "$p/lib64"; do
      [ -n "$p" ] && libclang_in_dir "$d" && return 0
    done
  fi
  while IFS= read -r d; do
    libclang_in_dir "$d" && return 0
  done < <(libclang_search_globs)
  return 1
}

# Folders clang-sys does not search where an LLVM install may still have put libclang. When
# one holds it, the caller exports LIBCLANG_PATH to that folder.
libclang_elsewhere() {
  local r="${LIBCLANG_ROOT:-}" d
  for d in "$r"/opt/llvm*/lib "$r"/opt/*/lib "$r"/opt/*/lib64 "$r"/usr/lib/llvm-*/lib64; do
    libclang_in_dir "$d" >/dev/null && { printf '%s\n' "$d"; return 0; }
  done
  return 1
}

# One word for the whole decision: `found` (clang-sys finds it), `path=DIR` (export
# LIBCLANG_PATH=DIR), `badpath` (LIBCLANG_PATH is set and holds no linkable libclang, so
# clang-sys looks nowhere else), or `install` (none anywhere: install libclang-dev).
libclang_decision() {
  local d
  if libclang_found >/dev/null; then
    echo found
  elif [ -n "${LIBCLANG_PATH:-}" ]; then
    echo badpath
  elif d=$(libclang_elsewhere); then
    echo "path=$d"
  else
    echo install
  fi
}
