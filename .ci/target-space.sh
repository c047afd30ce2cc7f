# Sourced by test.sh (and so by .ci/run) and by tests/prereqs.rs: keeps the one shared cargo
# target dir from filling the disk.
#
# Every clean clone rebuilds tandem's own crates and test binaries (cargo fingerprints by
# mtime), so their old copies in the target dir are garbage; third-party crates and RocksDB's
# C++ (a quarter of an hour to rebuild) are kept. Without this the dir grew by tens of GB a
# day of builds, and a CI run failed with "No space left on device".
#
# Limits (environment, whole numbers):
#   TANDEM_TARGET_KEEP_HOURS  tandem's own artifacts younger than this are kept (default 24)
#   TANDEM_TARGET_LOW_GB      below this many free GB, every one of them goes (default 20)
#   TANDEM_TARGET_MIN_GB      below this many free GB after that, stop with a message (default 8)

# Free GB (rounded down) on the filesystem that holds $1.
target_free_gb() {
  local kb
  kb=$(df -Pk "$1" | awk 'NR == 2 { print $4 }')
  echo $(( kb / 1024 / 1024 ))
}

# Removes tandem's own build artifacts under target dir $1 that are older than $2 minutes
# (0: all of them): incremental caches, test and binary executables, the workspace crates'
# libraries, and object files a crashed build left. Prints how many paths it removed.
target_prune_older_than() {
  local dir="$1" minutes="$2" age=() n=0 p
  [ "$minutes" -gt 0 ] && age=(-mmin "+$minutes")
  local profile
  for profile in "$dir"/debug "$dir"/release; do
    [ -d "$profile" ] || continue
    while IFS= read -r -d '' p; do
      rm -rf -- "$p" && n=$((n + 1))
    done < <(
      { [ -d "$profile/incremental" ] &&
          find "$profile/incremental" -mindepth 1 -maxdepth 1 "${age[@]}" -print0
        for sub in deps examples; do
          [ -d "$profile/$sub" ] || continue
          # Executables without a dot in the name: test binaries, bins, examples.
          find "$profile/$sub" -maxdepth 1 -type f -perm -u+x ! -name '*.*' "${age[@]}" -print0
          find "$profile/$sub" -maxdepth 1 -type f \
            \( -name 'libtandem*.rlib' -o -name 'libtandem*.rmeta' \) "${age[@]}" -print0
          # Leftovers of a build that died before linking (never younger than an hour,
          # so a build running right now keeps its own).
          find "$profile/$sub" -maxdepth 1 -type f \( -name '*.rcgu.o' -o -name '*.rcgu.bc' \) \
            -mmin +60 -print0
        done
      } 2>/dev/null
    )
    # Dep-info files whose artifact is gone (third-party crates keep theirs).
    for sub in deps examples; do
      [ -d "$profile/$sub" ] || continue
      local -A have=()
      local f
      for f in "$profile/$sub"/*; do have["${f##*/}"]=1; done
      for f in "${!have[@]}"; do
        [[ "$f" == *.d ]] || continue
        local stem="${f%.d}"
        [ -n "${have[$stem]:-}" ] || [ -n "${have[lib$stem.rlib]:-}" ] ||
          [ -n "${have[lib$stem.rmeta]:-}" ] || [ -n "${have[lib$stem.so]:-}" ] ||
          [ -n "${have[lib$stem.a]:-}" ] ||
          { rm -f -- "$profile/$sub/$f" && n=$((n + 1)); }
      done
      unset have
    done
  done
  echo "$n"
}

# The policy: old artifacts go always; all of tandem's own go when space is low; stop when
# even that leaves too little.
target_make_room() {
  local dir="$1" keep="${TANDEM_TARGET_KEEP_HOURS:-24}" low="${TANDEM_TARGET_LOW_GB:-20}"
  local min="${TANDEM_TARGET_MIN_GB:-8}" removed free
  [ -d "$dir" ] || return 0
  removed=$(target_prune_older_than "$dir" $((keep * 60)))
  free=$(target_free_gb "$dir")
  if [ "$free" -lt "$low" ]; then
    removed=$((removed + $(target_prune_older_than "$dir" 0)))
    free=$(target_free_gb "$dir")
  fi
  [ "$removed" -gt 0 ] &&
    echo "tandem: removed $removed old build artifacts from $dir ($free GB free)" >&2
  if [ "$free" -lt "$min" ]; then
    echo "tandem: only $free GB free for $dir, and a build needs about $min GB: free some disk (or delete $dir, which costs a 15-18 minute rebuild of RocksDB) and run this again" >&2
    return 1
  fi
}
