//! tandem: a service registry for two (or more) data centers.
//!
//! Code map (see docs/ARCHITECTURE.md):
//! - [`store`]: the RocksDB event log and the group-committing sequencer (the only module
//!   that knows RocksDB).
//! - [`registry`]: the in-memory view, leases, discovery, the write path.
//! - [`health`]: the pure lease/health state machine, self-preservation, flap damping.
//! - [`failover`]: the pure failover-to-remote policy.
//! - [`http`]: the client-facing JSON API; [`node`]: wiring and lifecycle.
//!
//! The HTTP contract types, the HTTP client and the SDK live in the `tandem-client` crate
//! (`client/`), which does not depend on this one nor on RocksDB.

pub mod cli;
pub mod config;
pub mod error;
pub mod failover;
pub mod health;
pub mod http;
pub mod node;
pub mod registry;
pub mod store;
