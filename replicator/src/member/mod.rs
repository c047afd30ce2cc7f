//! The member link: requests between the nodes of one DC's Raft group, over QUIC with
//! mutual TLS (docs/cluster.md, "Transport between members").
//!
//! Each request is one bidirectional stream: the caller writes the request's bytes and
//! finishes its side, the callee's [`Handler`] answers with bytes, written back the same
//! way. The link knows nothing of what the bytes mean (the root crate encodes openraft's
//! RPCs in them), so this crate stays free of Raft, and the root crate free of quinn.
//!
//! Identity: a node's certificate names one node, `n<id>.<dc>.tandem-node`
//! ([`NodeName`](crate::tls::NodeName)). The link starts only with a node's certificate and speaks only its own
//! ALPN ([`ALPN`]); the dialer accepts only the node it dialed, the listener only a
//! configured member of its own DC. A DC's certificate is refused on both sides (it names
//! no node), and a node's certificate is refused by the DC replication link (it names no
//! DC).
//!
//! Limits, each counted in [`MemberStats`]:
//! - a request or an answer is at most [`FRAME_BYTES_MAX`] bytes (one replication frame and
//!   room for the RPC around it): a longer request is refused before anything is sent
//!   ([`CallError::TooLarge`]); a longer incoming one resets the stream unread past the
//!   limit;
//! - at most [`STREAMS_MAX`] requests in flight per connection and direction (QUIC stream
//!   credit: a caller past it waits);
//! - handshakes: the replication listener's admission ([`Admission`]: source addresses,
//!   address validation, concurrent handshakes);
//! - every call has a deadline (the caller's), dial included.

mod link;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

pub use link::MemberLink;

use crate::gateway::Admission;

/// ALPN of the member link: its protocol and major version. Never the replication link's.
pub const ALPN: &[u8] = b"tandem-member/1";

/// Largest request or answer on the member link: one replication frame
/// (`tandem_schemas::FRAME_BYTES_MAX`, the largest Raft entry) and 64 KiB for the RPC
/// around it.
pub const FRAME_BYTES_MAX: usize = tandem_schemas::FRAME_BYTES_MAX + 64 * 1024;

/// Requests in flight on one connection, per direction (QUIC bidirectional streams).
pub const STREAMS_MAX: u32 = 16;

/// Receive window of one stream: one whole frame, so a request never waits for the
/// application to read half of it.
pub const STREAM_WINDOW_BYTES: u32 = FRAME_BYTES_MAX as u32;

/// Receive window of one connection: what one peer can make a node buffer.
pub const CONNECTION_WINDOW_BYTES: u32 = 4 * FRAME_BYTES_MAX as u32;

/// How long a dial may take when the caller's deadline is longer.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(3);

/// Answers the requests of the other members.
pub trait Handler: Send + Sync + 'static {
    /// The answer to `request` from member `from` (authenticated: a configured member of
    /// the own DC). Errors are the handler's to encode in the answer.
    fn handle(&self, from: u64, request: Vec<u8>) -> impl Future<Output = Vec<u8>> + Send;
}

/// Settings of one node's member link.
#[derive(Clone, Debug)]
pub struct MemberConfig {
    /// Where the link listens (UDP).
    pub listen: SocketAddr,
    /// Every member of the own DC's group (the own node may be among them), by id.
    pub members: Vec<(u64, SocketAddr)>,
    /// The node's secret for QUIC stateless resets (as the replication link's).
    pub reset_secret: [u8; 32],
    /// Which sources may start a handshake (`peers` here means the members' addresses, as
    /// [`MemberLink::set_members`] changes them).
    pub admission: Admission,
}

/// Why a call to a member failed. Nothing is known of whether the callee acted on it,
/// except for [`CallError::UnknownMember`] and [`CallError::TooLarge`] (nothing was sent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("node {node} is not a member of this DC's group")]
    UnknownMember { node: u64 },
    #[error("a request of {bytes} bytes is over the member link's limit of {max}")]
    TooLarge { bytes: usize, max: usize },
    #[error("cannot reach node {node} at {addr}: {reason}")]
    Unreachable { node: u64, addr: SocketAddr, reason: String },
    #[error("the request to node {node} failed: {reason}")]
    Failed { node: u64, reason: String },
    #[error("node {node} did not answer within {timeout:?}")]
    Timeout { node: u64, timeout: Duration },
}

/// Counters of one node's member link (since it started).
#[derive(Debug, Default)]
pub struct MemberStats {
    /// Calls made, and those that failed (any [`CallError`]).
    pub calls: AtomicU64,
    pub calls_failed: AtomicU64,
    /// Connections dialed (each a full handshake).
    pub dials: AtomicU64,
    /// Requests answered for other members.
    pub served: AtomicU64,
    /// Incoming requests or answers over [`FRAME_BYTES_MAX`] (the stream was reset).
    pub frames_refused: AtomicU64,
    /// Incoming connections refused: handshake failed, or a peer that is not a configured
    /// member of the own DC.
    pub refused_connections: AtomicU64,
    /// Incoming connections dropped by the admission (source, handshakes in flight).
    pub refused_admission: AtomicU64,
    /// Handshakes running now.
    pub handshakes_in_flight: AtomicU64,
}
