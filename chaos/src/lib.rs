//! Fault injection, workloads and invariant checking for tandem's chaos drills.
//!
//! Code map:
//! - [`relay`]: a user-space UDP fault relay (partition, loss, delay, duplication, reordering).
//! - [`checker`]: the invariant checker; pure, fed with operations and observations.
//! - [`workload`]: the seeded schedule of client operations (pure).
//! - [`plan`]: the drills and their seeded fault plans (pure).
//! - [`ledger`]: the fault ledger: which faults a plan's steps start and end, what the
//!   checker must hear about them, and the fault windows (pure).
//! - [`api`]: a bounded HTTP client of tandem's API that classifies outcomes for the checker.
//! - [`cluster`]: the two DCs a drill runs against (child processes behind relays, network
//!   namespaces, or a user's deployment) and the faults inflicted on them.
//! - [`drills`]: running a drill end to end, and `tandem chaos`'s command line.
//! - [`report`]: the table, the JSON report and the timeline SVG.
//! - [`ports`]: free loopback ports for the servers a drill or a test starts.
//!
//! Architecture invariant: this crate never links the `tandem` crate, RocksDB or QUIC; it
//! drives `tandem` binaries through their CLI and HTTP API only.

pub mod api;
pub mod checker;
pub mod cluster;
pub mod drills;
pub mod ledger;
pub mod plan;
pub mod ports;
pub mod relay;
pub mod report;
pub mod workload;
