//! tandem: a service registry for two (or more) data centers.
//!
//! Code map (see docs/ARCHITECTURE.md):
//! - [`store`]: the RocksDB event log and the group-committing sequencer (the only module
//!   that knows RocksDB).
//! - [`registry`]: the in-memory view, leases, discovery, the write path.
//! - [`cluster`]: the per-DC Raft group's types (issue 17; its log is `store::RaftLogStore`;
//!   the node does not run it yet).
//! - [`clock`]: time as an input ([`clock::Clock`]): the system clock, or a manual one.
//! - [`health`]: the pure lease/health state machine, self-preservation, flap damping.
//! - [`leases`]: the lease lifecycle of a registry: which registration a lease belongs to.
//! - [`failover`]: the pure failover-to-remote policy.
//! - [`heap`]: freed heap handed back to the OS after bursts of connections; [`hashed`]:
//!   hash tables that double without hashing a key again (the lease table's, the owners').
//! - [`http`]: the client-facing JSON API; [`node`]: wiring and lifecycle, status and
//!   metrics; [`shared`]: what the HTTP handlers and the node's tasks share.
//!
//! The HTTP contract types, the HTTP client and the SDK live in the `tandem-client` crate
//! (`client/`), which does not depend on this one nor on RocksDB.

/// The cargo profile this binary was built with: `release` is the one to deploy
/// (`cargo install --locked --path .`); `dev` is what `./run.sh` and the tests build (every
/// crate optimized, RocksDB's C++ at -O3: docs/benchmarks.md, "Why the figures come from a
/// dev-profile build").
pub const BUILD_PROFILE: &str = if IS_RELEASE { "release" } else { "dev" };

/// Whether this is a release build (`TANDEM_BUILD_PROFILE`, set by build.rs from cargo's
/// `PROFILE`).
const IS_RELEASE: bool = matches!(env!("TANDEM_BUILD_PROFILE").as_bytes(), b"release");

/// How many tasks a worker of a node's runtime runs between its looks for new I/O events
/// and due timers while tasks keep it busy (tokio's `event_interval`; its default is 61).
/// Under load each look is a system call that finds a few more requests ready; looking
/// less often takes them in larger sets. Ten A/B pairs of the register step (release,
/// 61 against 200): M1's p99 at half of saturation lower in 9, median 5.07 to 4.03 ms;
/// 8 made it worse in 5 of 5 (docs/benchmarks.md, issue 21's twenty-fourth round). A
/// worker with nothing queued looks at once, so an idle node answers as before.
pub const RUNTIME_EVENT_INTERVAL: u32 = 200;

/// The builder of the runtime a node runs on: multi-threaded, with I/O and time, and
/// [`RUNTIME_EVENT_INTERVAL`]. `tandem` and the benchmarks' nodes use it.
pub fn node_runtime() -> tokio::runtime::Builder {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.enable_all().event_interval(RUNTIME_EVENT_INTERVAL);
    b
}

/// `tandem --version`: the version and the build profile.
pub const VERSION: &str = if IS_RELEASE {
    concat!(env!("CARGO_PKG_VERSION"), " (release build)")
} else {
    concat!(
        env!("CARGO_PKG_VERSION"),
        " (dev build; deploy the release build: cargo install --locked --path .)"
    )
};

pub mod acl;
pub mod audit;
pub mod backup;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod compat;
pub mod config;
pub mod error;
pub mod failover;
pub mod hashed;
pub mod health;
pub mod heap;
pub mod http;
pub mod leases;
pub mod log_fields;
pub mod node;
pub mod registry;
pub mod shared;
pub mod store;
pub mod ui;
