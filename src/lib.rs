//! tandem: a service registry for two (or more) data centers.
//!
//! Code map (see docs/ARCHITECTURE.md):
//! - [`store`]: the RocksDB event log and the group-committing sequencer (the only module
//!   that knows RocksDB).
//! - [`registry`]: the in-memory view, leases, discovery, the write path.
//! - [`clock`]: time as an input ([`clock::Clock`]): the system clock, or a manual one.
//! - [`health`]: the pure lease/health state machine, self-preservation, flap damping.
//! - [`leases`]: the lease lifecycle of a registry: which registration a lease belongs to.
//! - [`failover`]: the pure failover-to-remote policy.
//! - [`http`]: the client-facing JSON API; [`node`]: wiring and lifecycle.
//! - [`client`]: a small HTTP client used by the CLI, tests and the SDK.

pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod error;
pub mod failover;
pub mod health;
pub mod http;
pub mod leases;
pub mod node;
pub mod registry;
pub mod sdk;
pub mod store;
