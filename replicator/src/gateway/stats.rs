//! Link state and counters of the gateway, shared with the node for `/v1/status` and
//! `/metrics`: per peer ([`PeerLink`], with its [`LagRing`]) and gateway-wide
//! ([`GatewayStats`], including the fenced state of an older incarnation).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use tandem_schemas::Mark;

/// Link state of one peer, as users see it in status and metrics.
#[derive(Clone, Debug, Default)]
pub struct PeerLink {
    /// Outbound: our events to the peer.
    pub out_connected: bool,
    pub out_last_ack_wall_ms: u64,
    pub out_acked_seq: u64,
    pub out_connects: u64,
    pub out_failures: u64,
    pub out_last_error: String,
    /// Batches sent and not yet acknowledged on the current stream.
    pub out_inflight_batches: u64,
    /// Wall-clock ms when the oldest unacknowledged batch was sent (0: none in flight).
    pub out_oldest_unacked_wall_ms: u64,
    /// Snapshots sent whole (their last chunk sent).
    pub snapshots_sent: u64,
    /// Snapshot chunks sent, and their entry bytes (every stream, resumes included).
    pub snapshot_chunks_sent: u64,
    pub snapshot_bytes_sent: u64,
    /// Snapshot chunks the peer acknowledged as durably staged.
    pub snapshot_chunks_acked: u64,
    /// Snapshots resumed after a reconnect (not started over).
    pub snapshots_resumed: u64,
    /// The snapshot being sent: its id (0: none) and the next chunk index.
    pub out_snapshot_id: u64,
    pub out_snapshot_next_chunk: u64,
    /// Times the own log could not be read after some seq (a corrupt or invalid stored
    /// event) and a snapshot was sent in its place.
    pub log_unreadable: u64,
    /// Inbound: the peer's events to us.
    pub in_connected: bool,
    /// Wall-clock ms of the last frame from the peer (any kind).
    pub in_last_contact_wall_ms: u64,
    /// Monotonic ms (since gateway start) of the last frame from the peer.
    pub in_last_contact_mono_ms: u64,
    /// Monotonic ms of the last progress: a batch or snapshot applied, or a ping that
    /// found this side caught up. Handshakes do not count: staleness is judged on this.
    pub in_last_progress_mono_ms: u64,
    /// The epoch of the peer's history, as it last told us.
    pub in_origin_epoch: u64,
    /// The peer's own last seq in `in_origin_epoch`, as it last told us.
    pub in_origin_last_seq: u64,
    pub events_applied: u64,
    /// Batches applied here, each with one synced write (`events_applied` over this is
    /// the events per write).
    pub batches_applied: u64,
    /// Events and snapshot entries of the peer outside its replication scope here:
    /// applied as no-ops (a batch's consume their seqs), nothing written.
    pub events_out_of_scope: u64,
    pub snapshots_installed: u64,
    /// Snapshot chunks staged here, and their entry bytes.
    pub snapshot_chunks_staged: u64,
    pub snapshot_bytes_staged: u64,
    /// Snapshots (or chunks) the log refused.
    pub snapshots_refused: u64,
    /// The snapshot being staged: its id (0: none) and the chunks staged of it.
    pub in_snapshot_id: u64,
    pub in_snapshot_chunks: u64,
    /// Recent lag samples: source commit to durable apply here, ms (bounded ring).
    pub lag_ms_recent: LagRing,
}

impl PeerLink {
    /// Any frame from the peer: it is alive (not necessarily progressing).
    pub fn on_frame(&mut self, wall_ms: u64, mono_ms: u64) {
        self.in_last_contact_wall_ms = wall_ms;
        self.in_last_contact_mono_ms = mono_ms;
    }

    /// The peer said where its history is (`epoch`, `last_seq`). The seq is kept per
    /// epoch: a new epoch starts the count again instead of keeping an older, larger seq.
    pub fn on_origin_position(&mut self, epoch: u64, last_seq: u64) {
        if epoch != self.in_origin_epoch {
            self.in_origin_epoch = epoch;
            self.in_origin_last_seq = last_seq;
        } else {
            self.in_origin_last_seq = self.in_origin_last_seq.max(last_seq);
        }
    }

    /// A batch or snapshot was applied, or a ping found this side caught up.
    pub fn on_progress(&mut self, mono_ms: u64) {
        self.in_last_progress_mono_ms = mono_ms;
    }

    /// The peer's copies are stale: nothing progressed for longer than `stale_after_ms`,
    /// whatever handshakes happened meanwhile.
    pub fn stale(&self, now_mono_ms: u64, stale_after_ms: u64) -> bool {
        now_mono_ms.saturating_sub(self.in_last_progress_mono_ms) > stale_after_ms
    }

    /// The peer's events not yet applied here, within the epoch it last told us.
    pub fn lag_events(&self, applied: Option<Mark>) -> u64 {
        let applied_seq = applied.filter(|m| m.epoch == self.in_origin_epoch).map_or(0, |m| m.seq);
        self.in_origin_last_seq.saturating_sub(applied_seq)
    }
}

/// A bounded ring of recent lag samples.
#[derive(Clone, Debug, Default)]
pub struct LagRing {
    samples: Vec<u64>,
    next: usize,
}

const LAG_SAMPLES_MAX: usize = 4096;

impl LagRing {
    pub fn push(&mut self, v: u64) {
        if self.samples.len() < LAG_SAMPLES_MAX {
            self.samples.push(v);
        } else {
            self.samples[self.next] = v;
            self.next = (self.next + 1) % LAG_SAMPLES_MAX;
        }
    }
    /// The q-quantile (0..=1) of the recent samples.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.samples.is_empty() {
            return None;
        }
        let mut s = self.samples.clone();
        s.sort_unstable();
        let idx = ((s.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        s.get(idx).copied()
    }
    pub fn len(&self) -> usize {
        self.samples.len()
    }
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// Counters and per-peer state shared with the node for status and metrics.
#[derive(Debug, Default)]
pub struct GatewayStats {
    pub peers: Mutex<BTreeMap<String, PeerLink>>,
    /// Connections refused after their handshake began: the TLS handshake failed, or the
    /// certificate named no configured peer.
    pub refused_connections: AtomicU64,
    /// Incoming connections dropped unanswered: their source address is not admitted
    /// (`[replication] accept_from`).
    pub refused_source: AtomicU64,
    /// Incoming connections refused because `handshakes_max` handshakes were running.
    pub refused_handshakes_busy: AtomicU64,
    /// Retry packets sent to sources that had not yet validated their address.
    pub retries_sent: AtomicU64,
    /// Handshakes running now.
    pub handshakes_in_flight: AtomicU64,
    /// Connections refused because their DC is retired here.
    pub refused_retired: AtomicU64,
    pub protocol_errors: AtomicU64,
    /// Peer connections closed because a newer one of the same DC arrived.
    pub connections_replaced: AtomicU64,
    /// Peer connections closed because they opened no stream in time.
    pub connections_idle_closed: AtomicU64,
    /// Frames refused because their declared length exceeded the limit of their type.
    pub frames_too_large: AtomicU64,
    pub frames_sent: AtomicU64,
    pub frames_received: AtomicU64,
    /// New epochs this process took (history went back, or a new data dir learned of a
    /// newer epoch of its DC).
    pub new_epochs: AtomicU64,
    /// Set when a peer showed that this process is an older incarnation of its DC: it no
    /// longer ships to any peer. Why, as the first peer said it.
    pub fenced: Mutex<Option<String>>,
}

impl GatewayStats {
    pub(super) fn with_peer<R>(&self, dc: &str, f: impl FnOnce(&mut PeerLink) -> R) -> R {
        let mut g = self.peers.lock();
        f(g.entry(dc.to_owned()).or_default())
    }
}
