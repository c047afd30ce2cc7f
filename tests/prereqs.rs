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
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/libclang.sh");
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
