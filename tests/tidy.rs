//! The rules of docs/ARCHITECTURE.md that a program can check, checked: which crate may
//! depend on what (from `cargo tree`, following normal and build dependencies; who may
//! know rustls directly), that RocksDB's build graph keeps its own opt-level in the one
//! profile, which sources may name RocksDB, quinn and rustls, that every source file opens
//! with a `//!` header, that the docs name only files that exist, that no source file
//! outside a tests/ folder grows past its size limit, and that nothing cites files outside
//! the repository.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    manifest_dir()
}

/// Every file git tracks (plus untracked, not ignored ones), relative to the root.
fn files() -> Vec<String> {
    let out = Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(root())
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|f| root().join(f).is_file())
        .map(str::to_owned)
        .collect()
}

fn rust_sources() -> Vec<String> {
    files().into_iter().filter(|f| f.ends_with(".rs")).collect()
}

/// What each workspace crate depends on: the packages it depends on directly and
/// transitively, through normal and build dependencies (dev-dependencies are not part of
/// what it ships).
struct Deps {
    direct: BTreeSet<String>,
    all: BTreeSet<String>,
}

/// From `cargo tree` (which resolves features per crate; `cargo metadata`'s resolve lists
/// an optional dependency behind a weak feature such as reqwest's `quinn?/ring` as soon
/// as any crate of the workspace builds it).
fn workspace_deps() -> BTreeMap<String, Deps> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline", "--no-deps"])
        .current_dir(root())
        .output()
        .expect("cargo metadata");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut result = BTreeMap::new();
    for package in meta["packages"].as_array().unwrap() {
        let name = package["name"].as_str().unwrap();
        let out = Command::new(&cargo)
            .args(["tree", "-p", name, "-e", "normal,build", "--prefix", "depth", "--format", "{p}"])
            .args(["--target", "all", "--locked", "--offline"])
            .current_dir(root())
            .output()
            .expect("cargo tree");
        assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
        let (mut direct, mut all) = (BTreeSet::new(), BTreeSet::new());
        for line in String::from_utf8(out.stdout).unwrap().lines() {
            let depth_len = line.bytes().take_while(u8::is_ascii_digit).count();
            let depth: usize = line[..depth_len].parse().unwrap_or(0);
            let dep = line[depth_len..].split(' ').next().unwrap_or("").to_owned();
            if depth == 0 || dep.is_empty() {
                continue;
            }
            if depth == 1 {
                direct.insert(dep.clone());
            }
            all.insert(dep);
        }
        result.insert(name.to_owned(), Deps { direct, all });
    }
    result
}

/// The one cargo profile optimizes every dependency (`[profile.dev.package."*"]`), but
/// RocksDB's C++ (15-18 minutes) must never rebuild because of it: every package of
/// librocksdb-sys's build graph (normal and build dependencies: the build script's bindgen,
/// cc...) names its own opt-level, which wins over the glob.
#[test]
fn rocksdb_build_graph_keeps_its_profile() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args(["tree", "-p", "librocksdb-sys", "-e", "normal,build", "--prefix", "none"])
        .args(["--format", "{p}", "--target", "all", "--locked", "--offline"])
        .current_dir(root())
        .output()
        .expect("cargo tree");
    assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
    let graph: BTreeSet<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| line.split(' ').next())
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(graph.contains("bindgen") && graph.contains("lz4-sys"), "{graph:?}");
    let manifest: toml::Table = std::fs::read_to_string(root().join("Cargo.toml")).unwrap().parse().unwrap();
    let packages = &manifest["profile"]["dev"]["package"];
    assert!(packages.get("*").is_some(), "the dev profile no longer optimizes dependencies");
    let loose: Vec<&String> = graph
        .iter()
        .filter(|name| packages.get(name.as_str()).and_then(|p| p.get("opt-level")).is_none())
        .collect();
    assert!(
        loose.is_empty(),
        "these packages of RocksDB's build graph take `[profile.dev.package.\"*\"]`'s \
         opt-level, so a change to it rebuilds RocksDB: give each its own opt-level in the \
         root Cargo.toml: {loose:?}"
    );
}

#[test]
fn crates_depend_only_on_what_the_architecture_allows() {
    let crates = workspace_deps();
    assert!(crates.contains_key("tandem") && crates.contains_key("tandem-replicator"));
    // (crate, packages it must not reach, why) — docs/ARCHITECTURE.md, "Invariants".
    let rules: &[(&str, &[&str], &str)] = &[
        (
            "tandem-schemas",
            &["tokio", "quinn", "rustls", "rocksdb", "librocksdb-sys", "axum", "hyper", "reqwest"],
            "schemas does no I/O and depends on no runtime, storage or network crate",
        ),
        ("tandem-replicator", &["rocksdb", "librocksdb-sys", "axum"], "replicator never depends on RocksDB"),
        (
            "tandem-chaos",
            &["tandem", "rocksdb", "librocksdb-sys", "quinn", "tandem-replicator"],
            "chaos never links the registry, RocksDB or QUIC",
        ),
        (
            "tandem-client",
            &["tandem", "rocksdb", "librocksdb-sys", "quinn", "axum", "tandem-replicator"],
            "the client crate builds in seconds: no RocksDB, QUIC or server framework",
        ),
    ];
    let mut broken = vec![];
    for (krate, banned, why) in rules {
        let Some(deps) = crates.get(*krate) else { continue };
        for b in *banned {
            if deps.all.contains(*b) {
                broken.push(format!("{krate} depends on {b}: {why}"));
            }
        }
    }
    // Who may know TLS (docs/ARCHITECTURE.md, "Who knows rustls"): quinn directly only
    // replicator (and bench, for its floors); rustls directly replicator (QUIC), the root
    // crate (the HTTPS listener) and bench; tokio-rustls only the root crate. The client
    // crate reaches rustls only through reqwest. Only the root crate (in src/store) and
    // bench depend on RocksDB.
    let direct_allowed: [(&str, &[&str]); 3] = [
        ("quinn", &["tandem-replicator", "tandem-bench"]),
        ("rustls", &["tandem-replicator", "tandem", "tandem-bench"]),
        ("tokio-rustls", &["tandem"]),
    ];
    for (krate, deps) in &crates {
        for (b, allowed) in direct_allowed {
            if !allowed.contains(&krate.as_str()) && deps.direct.contains(b) {
                broken.push(format!("{krate} depends on {b} directly: only {allowed:?} may"));
            }
        }
        if !["tandem", "tandem-bench"].contains(&krate.as_str()) && deps.direct.contains("rocksdb") {
            broken.push(format!("{krate} depends on rocksdb directly: only the root crate's src/store may"));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The node's HTTPS listener: the only file of the root crate that names rustls.
const HTTPS_LISTENER: &str = "src/http/tls.rs";

#[test]
fn only_their_owners_name_rocksdb_quinn_and_rustls() {
    let mut broken = vec![];
    for f in rust_sources() {
        let text = std::fs::read_to_string(root().join(&f)).unwrap();
        let in_tests = f.starts_with("tests/") || f.contains("/tests/");
        if f.starts_with("src/") && !f.starts_with("src/store") && text.contains("rocksdb::") {
            broken.push(format!("{f} names rocksdb: only src/store/ knows RocksDB"));
        }
        let quic_ok = f.starts_with("replicator/") || f.starts_with("bench/") || in_tests;
        if !quic_ok && text.contains("quinn::") {
            broken.push(format!("{f} names quinn: only replicator/ knows it"));
        }
        // The node's HTTPS listener is the one file outside replicator/ that names rustls.
        let tls_ok = quic_ok || f == HTTPS_LISTENER;
        if !tls_ok && (text.contains("rustls::") || text.contains("tokio_rustls")) {
            broken.push(format!("{f} names rustls: only replicator/ and {HTTPS_LISTENER} know it"));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn every_source_file_opens_with_its_header() {
    let missing: Vec<String> = rust_sources()
        .into_iter()
        .filter(|f| {
            let text = std::fs::read_to_string(root().join(f)).unwrap();
            !text.trim_start().starts_with("//!")
        })
        .collect();
    assert!(missing.is_empty(), "source files without a `//!` header saying what they hold: {missing:?}");
}

/// The longest a source file outside a tests/ folder may be, counting its inline tests.
const MAX_SOURCE_LINES: usize = 800;
/// Files still over the limit, each with the line count it may not grow past. Shrink this
/// list; never add to it.
const OVER_LIMIT: &[(&str, usize)] = &[];

#[test]
fn no_source_file_outgrows_its_job() {
    let mut broken = vec![];
    for f in rust_sources() {
        if f.starts_with("tests/") || f.contains("/tests/") {
            continue;
        }
        let lines = std::fs::read_to_string(root().join(&f)).unwrap().lines().count();
        let limit = OVER_LIMIT.iter().find(|(p, _)| *p == f).map_or(MAX_SOURCE_LINES, |(_, n)| *n);
        if lines > limit {
            broken.push(format!("{f}: {lines} lines (limit {limit}): split it by job"));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// Paths a doc names in backticks or links that start at the repository's root.
fn named_paths(doc: &str, text: &str) -> Vec<String> {
    let tops: BTreeSet<String> =
        files().iter().map(|f| f.split('/').next().unwrap().to_owned()).filter(|t| !t.is_empty()).collect();
    let mut found = vec![];
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 1 && !part.contains(' ') {
            found.push(part.to_owned());
        }
    }
    for link in text.split("](").skip(1) {
        if let Some(end) = link.find(')') {
            let target = &link[..end];
            if !target.contains("://") && !target.starts_with('#') && !target.starts_with("mailto:") {
                // A link is relative to the doc's folder.
                let base = Path::new(doc).parent().unwrap();
                let joined = base.join(target.split('#').next().unwrap());
                found.push(joined.to_string_lossy().into_owned());
            }
        }
    }
    found
        .into_iter()
        .map(|p| p.trim_start_matches("./").to_owned())
        .filter(|p| {
            let first = p.split('/').next().unwrap_or("");
            (p.contains('/') || p.contains('.')) && tops.contains(first) && !first.is_empty()
        })
        .collect()
}

fn exists(path: &str) -> bool {
    let path = path.split(':').next().unwrap().trim_end_matches(['.', ',']);
    if path.contains('*') {
        // A glob names a folder and a pattern: the folder must exist.
        let dir = &path[..path.rfind('/').unwrap_or(0)];
        return root().join(dir).is_dir();
    }
    root().join(path).exists()
}

#[test]
fn docs_name_only_files_that_exist() {
    let docs: Vec<String> = files().into_iter().filter(|f| f.ends_with(".md")).collect();
    assert!(docs.iter().any(|d| d == "docs/ARCHITECTURE.md"));
    let mut broken = vec![];
    for doc in docs {
        let text = std::fs::read_to_string(root().join(&doc)).unwrap();
        for path in named_paths(&doc, &text) {
            if !exists(&path) {
                broken.push(format!("{doc} names {path}, which does not exist"));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn nothing_cites_files_outside_the_repository() {
    let mut broken = vec![];
    for f in files() {
        if !(f.ends_with(".rs") || f.ends_with(".md") || f.ends_with(".toml") || f.ends_with(".sh")) {
            continue;
        }
        let text = std::fs::read_to_string(root().join(&f)).unwrap_or_default();
        // Spelled in pieces, so this file does not cite them itself.
        let needles = [
            concat!("PRODUCT", ".md"),
            concat!("STYLE", ".md"),
            concat!("shared", "/brief"),
            concat!("shared", "/seeds"),
        ];
        for needle in needles {
            if text.contains(needle) {
                broken.push(format!("{f} cites {needle}, which is not in the repository"));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The package's directory, read when the test runs (cargo sets it) rather than when it
/// was compiled: a test binary reused from another checkout's build (one shared target
/// dir) reads this checkout's files.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
