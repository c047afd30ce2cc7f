//! Cross-DC replication for tandem.
//!
//! - [`epoch`]: ordered origin epochs (generation and tiebreak), pure functions.
//! - [`merge`]: the merge rules as pure functions (no I/O, no clock).
//! - [`log`]: the event-log contract, its in-memory model and the conformance suite.
//! - [`scope`]: the replication scope of a peer DC (the namespaces it may replicate here).
//! - [`purge`]: the purge rule (how far a DC may purge its own log), a pure function.
//! - [`protocol`]: the sans-IO sender and receiver state machines of the replication stream.
//! - [`sampled`]: sampled logging (one line per period) for floods of refusals.
//! - [`tls`]: certificates, mutual TLS and peer identity for the QUIC gateway.
//! - [`gateway`]: the thin QUIC driver that runs the protocol over quinn.
//! - [`member`]: the member link between the nodes of one DC's Raft group (QUIC, mutual
//!   TLS with node certificates, opaque request and answer bytes).
//!
//! Architecture invariant: only this crate knows quinn and rustls; it never depends on
//! RocksDB (the root crate provides the durable [`log::EventLog`]).

pub mod epoch;
pub mod gateway;
pub mod log;
pub mod member;
pub mod merge;
pub mod protocol;
pub mod purge;
pub mod sampled;
pub mod scope;
pub mod tls;
