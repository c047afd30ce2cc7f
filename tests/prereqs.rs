//! The libclang detection of `.ci/prereqs.sh` (the function in `.ci/libclang.sh`), run
//! against fake library folders. The decisions mirror clang-sys 1.9's build-time search
//! (bindgen without `runtime`): it links only an unversioned `libclang.so` or
//! `libclang-N.so`, never `libclang-cpp*`, and searches `/usr/lib*/*/*` and friends, or
//! only `$LIBCLANG_PATH` when that is set.

use std::path::Path;
use std::process::Command;

/// Lays out `files` (empty files, paths relative to a fresh root) and returns what
/// `libclang_decision` says about that root, with `libclang_path` as `$LIBCLANG_PATH`.
fn decide(files: &[&str], libclang_path: Option<&str>) -> (String, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    for f in files {
        let p = root.path().join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"").unwrap();
    }
    let script = manifest_dir().join(".ci/libclang.sh");
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(format!(". '{}' && libclang_decision", script.display()))
        .env("LIBCLANG_ROOT", root.path())
        .env_remove("LIBCLANG_PATH");
    if let Some(p) = libclang_path {
        cmd.env("LIBCLANG_PATH", root.path().join(p));
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let said = said.replace(root.path().to_str().unwrap(), "ROOT");
    (said, root)
}

#[test]
fn libclang_cpp_alone_is_not_libclang() {
    // A fresh Debian 12 machine of this project's kind: libclang-cpp14 only.
    let files = ["usr/lib/x86_64-linux-gnu/libclang-cpp.so.14", "usr/lib/llvm-14/lib/libclang-cpp.so.14"];
    assert_eq!(decide(&files, None).0, "install");
    // libclang-cpp14-dev's unversioned link does not count either.
    assert_eq!(decide(&["usr/lib/llvm-14/lib/libclang-cpp.so"], None).0, "install");
}

#[test]
fn a_versioned_soname_alone_cannot_be_linked() {
    // libclang1-14 without libclang-dev: ld cannot link `libclang-14.so.1`.
    assert_eq!(decide(&["usr/lib/x86_64-linux-gnu/libclang-14.so.1"], None).0, "install");
    assert_eq!(decide(&["usr/lib/llvm-14/lib/libclang.so.1"], None).0, "install");
}

#[test]
fn libclang_dev_layouts_are_found() {
    assert_eq!(decide(&["usr/lib/llvm-14/lib/libclang.so"], None).0, "found");
    assert_eq!(decide(&["usr/lib/x86_64-linux-gnu/libclang-14.so"], None).0, "found");
    assert_eq!(decide(&["usr/local/llvm18/lib/libclang.so"], None).0, "found");
}

#[test]
fn nothing_means_install() {
    assert_eq!(decide(&[], None).0, "install");
}

#[test]
fn a_folder_clang_sys_does_not_search_is_exported() {
    assert_eq!(decide(&["opt/llvm/lib/libclang.so"], None).0, "path=ROOT/opt/llvm/lib");
}

#[test]
fn libclang_path_is_the_only_place_searched_when_set() {
    let files = ["usr/lib/llvm-14/lib/libclang.so", "elsewhere/libclang-14.so.1"];
    // Set to a folder without a linkable library: clang-sys looks nowhere else.
    assert_eq!(decide(&files, Some("elsewhere")).0, "badpath");
    assert_eq!(decide(&files, Some("usr/lib/llvm-14/lib")).0, "found");
    assert_eq!(decide(&files, Some("usr/lib/llvm-14/lib/libclang.so")).0, "found");
}

/// Lays out a fake cargo target dir: `(path, executable, hours old)`.
fn fake_target(files: &[(&str, bool, u32)]) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    for (f, exec, _) in files {
        let p = root.path().join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"x").unwrap();
        if *exec {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    // Ages last, so a folder is as old as what was put in it (as cargo's incremental
    // session folders are).
    for (f, _, hours) in files {
        let when = format!("{hours} hours ago");
        let mut p = root.path().join(f);
        while p != root.path() {
            let touched = Command::new("touch").args(["-d", &when]).arg(&p).status().unwrap();
            assert!(touched.success());
            p = p.parent().unwrap().to_path_buf();
        }
    }
    root
}

/// Runs `call` (a function of `.ci/target-space.sh`) with `ROOT` standing for the target dir.
fn target_space(root: &Path, call: &str, env: &[(&str, &str)]) -> std::process::Output {
    let script = manifest_dir().join(".ci/target-space.sh");
    let call = call.replace("ROOT", &format!("'{}'", root.display()));
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(format!("set -euo pipefail; . '{}' && {call}", script.display()));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

const TARGET_LAYOUT: &[(&str, bool, u32)] = &[
    ("debug/deps/sdk-00000000000000aa", true, 72),
    ("debug/deps/sdk-00000000000000aa.d", false, 72),
    ("debug/deps/sdk-00000000000000bb", true, 1),
    ("debug/deps/sdk-00000000000000bb.d", false, 1),
    ("debug/deps/libtandem-00000000000000cc.rlib", false, 72),
    ("debug/deps/libtandem-00000000000000cc.rmeta", false, 72),
    ("debug/deps/tandem-00000000000000cc.d", false, 72),
    ("debug/deps/libtandem-00000000000000dd.rlib", false, 1),
    ("debug/deps/tandem-00000000000000dd.d", false, 1),
    ("debug/deps/tandem-00000000000000cc.x1.rcgu.o", false, 72),
    ("debug/incremental/tandem-0abc/s-old/dep-graph.bin", false, 72),
    ("debug/incremental/tandem-1abc/s-new/dep-graph.bin", false, 1),
    ("debug/examples/ex-00000000000000ee", true, 72),
    // Third-party crates and RocksDB's C++ are never touched, however old.
    ("debug/deps/libserde-00000000000000ff.rlib", false, 72),
    ("debug/deps/serde-00000000000000ff.d", false, 72),
    ("debug/deps/libserde_derive-0000000000000011.so", true, 72),
    ("debug/deps/serde_derive-0000000000000011.d", false, 72),
    ("debug/build/librocksdb-sys-22/out/librocksdb.a", false, 72),
    ("debug/build/librocksdb-sys-22/build-script-build", true, 72),
    ("release/deps/tandem_bench-0000000000000033", true, 72),
];

fn remaining(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for (f, _, _) in TARGET_LAYOUT {
        if root.join(f).exists() {
            out.push((*f).to_owned());
        }
    }
    out
}

const THIRD_PARTY: [&str; 6] = [
    "debug/deps/libserde-00000000000000ff.rlib",
    "debug/deps/serde-00000000000000ff.d",
    "debug/deps/libserde_derive-0000000000000011.so",
    "debug/deps/serde_derive-0000000000000011.d",
    "debug/build/librocksdb-sys-22/out/librocksdb.a",
    "debug/build/librocksdb-sys-22/build-script-build",
];

#[test]
fn the_target_dir_loses_old_tandem_artifacts_and_keeps_third_party_ones() {
    let root = fake_target(TARGET_LAYOUT);
    let out = target_space(root.path(), "target_prune_older_than ROOT $((24 * 60))", &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut expected = vec![
        "debug/deps/sdk-00000000000000bb",
        "debug/deps/sdk-00000000000000bb.d",
        "debug/deps/libtandem-00000000000000dd.rlib",
        "debug/deps/tandem-00000000000000dd.d",
        "debug/incremental/tandem-1abc/s-new/dep-graph.bin",
    ];
    expected.extend(THIRD_PARTY);
    let mut left = remaining(root.path());
    left.sort();
    expected.sort();
    assert_eq!(left, expected);
    assert!(!root.path().join("debug/incremental/tandem-0abc").exists());

    // Age 0 takes every tandem artifact, still none of the others.
    let out = target_space(root.path(), "target_prune_older_than ROOT 0", &[]);
    assert!(out.status.success());
    let mut left = remaining(root.path());
    left.sort();
    let mut third: Vec<&str> = THIRD_PARTY.to_vec();
    third.sort();
    assert_eq!(left, third);
}

#[test]
fn low_space_takes_young_artifacts_too_and_too_little_stops_with_a_message() {
    let root = fake_target(TARGET_LAYOUT);
    // "Low" is any amount of free space here.
    let low = [("TANDEM_TARGET_LOW_GB", "100000000"), ("TANDEM_TARGET_MIN_GB", "0")];
    let out = target_space(root.path(), "target_make_room ROOT", &low);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("removed"));
    assert_eq!(remaining(root.path()).len(), THIRD_PARTY.len());

    let root = fake_target(TARGET_LAYOUT);
    let out = target_space(
        root.path(),
        "target_make_room ROOT",
        &[("TANDEM_TARGET_LOW_GB", "0"), ("TANDEM_TARGET_MIN_GB", "100000000")],
    );
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("GB free for") && said.contains("free some disk"), "{said}");
    // With enough space only the old ones went.
    assert!(root.path().join("debug/deps/sdk-00000000000000bb").exists());
    assert!(!root.path().join("debug/deps/sdk-00000000000000aa").exists());
}

/// The package's directory, read when the test runs (cargo sets it) rather than when it
/// was compiled: a test binary reused from another checkout's build (one shared target
/// dir) reads this checkout's files.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
