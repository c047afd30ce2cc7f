//! `GET /v1/status`: the node's state as a typed answer: its log, the applied marks per
//! origin, each peer link (outbound and inbound), self-preservation, and counts.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::Serialize;
use tandem_replicator::gateway;

use crate::shared::NodeShared;

/// The answer of `GET /v1/status`.
#[derive(Debug, Serialize)]
pub struct Status {
    pub dc: String,
    pub node: &'static str,
    pub version: &'static str,
    /// `dev` or `release`: the cargo profile of this binary.
    pub build_profile: &'static str,
    pub uptime_ms: u64,
    pub index: u64,
    /// The event log takes writes now. False from a failed write (a full disk, an I/O
    /// error) until a recovery succeeds; `GET /v1/ready` answers 503 meanwhile.
    pub log_writable: bool,
    pub log: LogStatus,
    /// The replication gateway's own state (absent without `[replication]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationStatus>,
    /// This node's DC group: its role, the term, the leader, the applied index and (on
    /// the leader) each member's matched index (absent without `[cluster]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<super::group::GroupStatus>,
    /// Applied high-water mark per origin DC.
    pub applied: BTreeMap<String, MarkStatus>,
    pub peers: BTreeMap<String, PeerStatus>,
    /// DCs retired here (`POST /v1/admin/retire-dc`): their copies are gone and their
    /// frames are refused.
    pub retired: BTreeMap<String, RetiredStatus>,
    pub self_preservation: PreservationStatus,
    /// Instances held, by owner DC.
    pub instances: BTreeMap<String, usize>,
    pub leases: usize,
    pub watch_streams: u64,
    pub disk_writes: u64,
    pub heartbeats: u64,
}

/// One retired DC.
#[derive(Debug, Serialize)]
pub struct RetiredStatus {
    /// Wall-clock ms when it was retired.
    pub retired_at_ms: u64,
}

#[derive(Debug, Serialize)]
pub struct LogStatus {
    pub epoch: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    pub purge_floor: u64,
    /// Writes that failed and made the log unwritable, since the start.
    pub write_failures: u64,
    /// Recoveries that made it writable again (without a restart).
    pub recoveries: u64,
    pub recovery_attempts_failed: u64,
    /// While not writable: the latest error, and for how long.
    pub unwritable_reason: Option<String>,
    pub unwritable_for_ms: Option<u64>,
    /// Reads that met a stored record or own event breaking the schema's rules (skipped;
    /// see docs/deploy.md, "Invalid stored records"), and the latest one.
    pub invalid_records: u64,
    pub invalid_record_last: Option<String>,
}

/// Epochs and fencing (docs/replication.md, "Epochs").
#[derive(Debug, Serialize)]
pub struct ReplicationStatus {
    /// True when a peer showed that this process is an older incarnation of its DC (its
    /// replacement runs on another data dir): it ships nothing to any peer any more.
    pub fenced: bool,
    /// Why, as the first peer said it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fenced_reason: Option<String>,
    /// New epochs this process took (its history went back, or its new data dir learned of
    /// a newer epoch of its DC).
    pub new_epochs: u64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct MarkStatus {
    pub epoch: u64,
    pub seq: u64,
}

impl From<tandem_schemas::Mark> for MarkStatus {
    fn from(m: tandem_schemas::Mark) -> Self {
        MarkStatus { epoch: m.epoch, seq: m.seq }
    }
}

/// Self-preservation: expiry pauses per namespace (see `health/preservation.rs`).
#[derive(Debug, Serialize)]
pub struct PreservationStatus {
    /// Expiry is paused in at least one namespace.
    pub active: bool,
    /// Sums over the namespaces, as of the last lease check.
    pub renewals_last_window: f64,
    pub expected_last_window: f64,
    /// Pauses ended by `self_preservation_max_pause_ms` since the start.
    pub pauses_capped: u64,
    /// Namespaces that hold leases.
    pub namespaces: BTreeMap<String, NamespacePreservationStatus>,
}

#[derive(Debug, Serialize)]
pub struct NamespacePreservationStatus {
    pub active: bool,
    /// Renewal credit in the window (a renewal earns at most 1 per suspect time).
    pub renewals: f64,
    /// Renewals expected in the window: one per suspect time of each counted lease.
    pub expected: f64,
    /// Since when expiry is paused, on the node's monotonic clock (ms).
    pub paused_since_ms: Option<u64>,
    pub paused_for_ms: Option<u64>,
    pub leases: usize,
    /// Leases in the expectation: renewed since registration, not parked.
    pub counted: usize,
}

/// One peer DC: our stream to it and its stream to us.
#[derive(Debug, Serialize)]
pub struct PeerStatus {
    pub outbound: OutboundStatus,
    pub inbound: InboundStatus,
}

#[derive(Debug, Serialize)]
pub struct OutboundStatus {
    /// `down`, `up`, or `stalled`: connected, but the oldest batch waits for its ack longer
    /// than a tenth of the stale threshold (at least 2 s).
    pub state: &'static str,
    pub inflight_batches: u64,
    pub acked_seq: u64,
    pub last_ack_ms_ago: Option<u64>,
    pub connects: u64,
    pub failures: u64,
    pub last_error: String,
    pub snapshots_sent: u64,
    /// Snapshots sent because the own log held an entry that could not be read or broke
    /// the schema's rules (see docs/deploy.md, "Invalid stored records").
    pub log_unreadable: u64,
    /// Snapshot streaming to the peer (docs/replication.md).
    pub snapshot: OutboundSnapshotStatus,
}

/// Snapshot chunks sent to a peer: totals, and the snapshot in progress.
#[derive(Debug, Serialize)]
pub struct OutboundSnapshotStatus {
    pub chunks_sent: u64,
    pub bytes_sent: u64,
    pub chunks_acked: u64,
    /// Snapshots resumed after a reconnect rather than started over.
    pub resumed: u64,
    /// The snapshot being sent (hex id) and the next chunk; `None` when none is.
    pub in_progress: Option<SnapshotProgress>,
}

/// A snapshot transfer in progress.
#[derive(Debug, Serialize)]
pub struct SnapshotProgress {
    pub snapshot_id: String,
    pub chunks: u64,
}

/// Snapshot chunks staged from a peer: totals, and the snapshot being staged.
#[derive(Debug, Serialize)]
pub struct InboundSnapshotStatus {
    pub chunks_staged: u64,
    pub bytes_staged: u64,
    pub refused: u64,
    /// The snapshot being staged (hex id) and the chunks staged so far.
    pub in_progress: Option<SnapshotProgress>,
}

#[derive(Debug, Serialize)]
pub struct InboundStatus {
    /// `up` or `down`.
    pub state: &'static str,
    /// Since the last frame of any kind (handshakes included).
    pub last_contact_ms_ago: Option<u64>,
    /// Since the last progress: a batch or snapshot applied, or a ping that found this
    /// side caught up. `stale` turns on when this passes `stale_after_ms`.
    pub last_progress_ms_ago: Option<u64>,
    pub applied: Option<MarkStatus>,
    /// The epoch of the peer's history and its last seq in that epoch, as it last said.
    pub origin_epoch: u64,
    pub origin_last_seq: u64,
    /// The peer's events not yet applied here, within that epoch.
    pub lag_events: u64,
    pub lag_ms_p50: Option<u64>,
    pub lag_ms_p99: Option<u64>,
    pub events_applied: u64,
    /// Batches applied here, each with one synced write.
    pub batches_applied: u64,
    /// Events and snapshot entries outside the peer's replication scope here, applied as
    /// no-ops.
    pub events_out_of_scope: u64,
    /// The peer's replication scope: the namespaces it may replicate here (`None`: all).
    pub namespaces: Option<Vec<String>>,
    pub snapshots_installed: u64,
    pub snapshot: InboundSnapshotStatus,
    pub stale: bool,
}

impl NodeShared {
    fn peer_status(&self) -> BTreeMap<String, PeerStatus> {
        let mut out = BTreeMap::new();
        let Some(stats) = &self.gateway_stats else { return out };
        let now_mono = self.gateway_clock.elapsed().as_millis() as u64;
        let now_wall = gateway::wall_ms();
        let marks = self.live.read().remote.clone();
        let cfg = self.registry.config();
        let stale_after = cfg.replication.as_ref().map_or(30_000, |r| r.stale_after_ms);
        // The flag reads answer with (a leader of a group also counts what it applied
        // before it led), taken before the counters are locked: the rule reads them too.
        let names: Vec<String> = stats.peers.lock().keys().cloned().collect();
        let stale: BTreeMap<String, bool> =
            names.into_iter().map(|dc| (dc.clone(), self.registry.origin_stale(&dc))).collect();
        for (dc, p) in stats.peers.lock().iter() {
            let applied = marks.get(dc).copied();
            let silent_ms = now_mono.saturating_sub(p.in_last_contact_mono_ms);
            let outbound = OutboundStatus {
                state: match (p.out_connected, p.out_oldest_unacked_wall_ms) {
                    (false, _) => "down",
                    (true, 0) => "up",
                    (true, t) if now_wall.saturating_sub(t) > (stale_after / 10).max(2_000) => "stalled",
                    (true, _) => "up",
                },
                inflight_batches: p.out_inflight_batches,
                acked_seq: p.out_acked_seq,
                last_ack_ms_ago: (p.out_last_ack_wall_ms > 0)
                    .then(|| now_wall.saturating_sub(p.out_last_ack_wall_ms)),
                connects: p.out_connects,
                failures: p.out_failures,
                last_error: p.out_last_error.clone(),
                snapshots_sent: p.snapshots_sent,
                log_unreadable: p.log_unreadable,
                snapshot: OutboundSnapshotStatus {
                    chunks_sent: p.snapshot_chunks_sent,
                    bytes_sent: p.snapshot_bytes_sent,
                    chunks_acked: p.snapshot_chunks_acked,
                    resumed: p.snapshots_resumed,
                    in_progress: (p.out_snapshot_id != 0).then(|| SnapshotProgress {
                        snapshot_id: format!("{:016x}", p.out_snapshot_id),
                        chunks: p.out_snapshot_next_chunk,
                    }),
                },
            };
            let inbound = InboundStatus {
                state: if p.in_connected { "up" } else { "down" },
                last_contact_ms_ago: (p.in_last_contact_wall_ms > 0).then_some(silent_ms),
                applied: applied.map(MarkStatus::from),
                last_progress_ms_ago: (p.in_last_progress_mono_ms > 0)
                    .then(|| now_mono.saturating_sub(p.in_last_progress_mono_ms)),
                origin_epoch: p.in_origin_epoch,
                origin_last_seq: p.in_origin_last_seq,
                lag_events: p.lag_events(applied),
                lag_ms_p50: p.lag_ms_recent.quantile(0.5),
                lag_ms_p99: p.lag_ms_recent.quantile(0.99),
                events_applied: p.events_applied,
                batches_applied: p.batches_applied,
                events_out_of_scope: p.events_out_of_scope,
                namespaces: cfg
                    .replication
                    .as_ref()
                    .and_then(|r| r.peers.iter().find(|x| x.dc == *dc))
                    .and_then(|x| x.namespaces.clone()),
                snapshots_installed: p.snapshots_installed,
                snapshot: InboundSnapshotStatus {
                    chunks_staged: p.snapshot_chunks_staged,
                    bytes_staged: p.snapshot_bytes_staged,
                    refused: p.snapshots_refused,
                    in_progress: (p.in_snapshot_id != 0).then(|| SnapshotProgress {
                        snapshot_id: format!("{:016x}", p.in_snapshot_id),
                        chunks: p.in_snapshot_chunks,
                    }),
                },
                stale: stale.get(dc).copied().unwrap_or_else(|| p.stale(now_mono, stale_after)),
            };
            out.insert(dc.clone(), PeerStatus { outbound, inbound });
        }
        out
    }

    /// GET /v1/status.
    pub fn status(&self) -> Status {
        let reg = &self.registry;
        let (own, floor, remote, retired) = {
            let l = self.live.read();
            (l.own, l.floor, l.remote.clone(), l.retired.clone())
        };
        let (figures, pauses_capped) = reg.preservation();
        let now_ms = reg.now_ms();
        let round = |v: f64| (v * 100.0).round() / 100.0;
        let health = self.committer.log_health();
        Status {
            dc: reg.dc.to_string(),
            node: "node-1",
            version: env!("CARGO_PKG_VERSION"),
            build_profile: crate::BUILD_PROFILE,
            uptime_ms: self.started.elapsed().as_millis() as u64,
            index: reg.view().index(),
            cluster: self.group.as_ref().map(|g| g.status()),
            log_writable: health.writable,
            log: LogStatus {
                epoch: own.epoch,
                first_seq: floor + 1,
                last_seq: own.seq,
                purge_floor: floor,
                write_failures: health.write_failures,
                recoveries: health.recoveries,
                recovery_attempts_failed: health.recovery_attempts_failed,
                unwritable_reason: health.reason,
                unwritable_for_ms: health.unwritable_for_ms,
                invalid_records: self.invalid_records.count(),
                invalid_record_last: self.invalid_records.last(),
            },
            replication: self.gateway_stats.as_ref().map(|g| {
                let reason = g.fenced.lock().clone();
                ReplicationStatus {
                    fenced: reason.is_some(),
                    fenced_reason: reason,
                    new_epochs: g.new_epochs.load(Ordering::Relaxed),
                }
            }),
            applied: remote.into_iter().map(|(dc, m)| (dc, m.into())).collect(),
            peers: self.peer_status(),
            retired: retired
                .into_iter()
                .map(|(dc, retired_at_ms)| (dc, RetiredStatus { retired_at_ms }))
                .collect(),
            self_preservation: PreservationStatus {
                active: figures.iter().any(|f| f.active),
                renewals_last_window: round(figures.iter().map(|f| f.renewals).sum()),
                expected_last_window: round(figures.iter().map(|f| f.expected).sum()),
                pauses_capped,
                namespaces: figures
                    .into_iter()
                    .map(|f| {
                        let status = NamespacePreservationStatus {
                            active: f.active,
                            renewals: round(f.renewals),
                            expected: round(f.expected),
                            paused_since_ms: f.paused_since_ms,
                            paused_for_ms: f.paused_since_ms.map(|s| now_ms.saturating_sub(s)),
                            leases: f.leases,
                            counted: f.counted,
                        };
                        (f.namespace.to_string(), status)
                    })
                    .collect(),
            },
            instances: reg.counts_by_owner(),
            leases: reg.lease_count(),
            watch_streams: self.http.streams.open.load(Ordering::Relaxed),
            disk_writes: self.committer.stats().fsyncs,
            heartbeats: reg.counters.heartbeats.load(Ordering::Relaxed),
        }
    }

    /// GET /v1/status as answered: on a follower of a group, the parts only the leader
    /// knows ([`LEADER_SECTIONS`]: its gateway's peer links and state, its lease checks'
    /// self-preservation) are the leader's, asked at the read, and `from_leader` says so.
    /// A follower that cannot ask shows no peer links and self-preservation `active`
    /// (it cannot tell that any lease expires), with the reason.
    pub async fn status_answer(&self) -> serde_json::Value {
        let mut own = serde_json::to_value(self.status()).unwrap_or_default();
        let Some(group) = &self.group else { return own };
        let said = match group.leader_status().await {
            Ok(None) => return own,
            Ok(Some((leader, json))) => serde_json::from_slice::<serde_json::Value>(&json)
                .map(|v| (leader, v))
                .map_err(|e| format!("node {leader}: unreadable status: {e}")),
            Err(e) => Err(e),
        };
        let from = match said {
            Ok((leader, theirs)) => {
                for key in LEADER_SECTIONS {
                    match theirs.get(key) {
                        Some(v) => own[key] = v.clone(),
                        None => {
                            own.as_object_mut().map(|o| o.remove(key));
                        }
                    }
                }
                serde_json::json!({ "leader": leader, "sections": LEADER_SECTIONS })
            }
            Err(error) => {
                own["peers"] = serde_json::json!({});
                own.as_object_mut().map(|o| o.remove("replication"));
                own["self_preservation"]["active"] = serde_json::Value::Bool(true);
                serde_json::json!({ "leader": group.leader(), "sections": [], "error": error })
            }
        };
        own["from_leader"] = from;
        own
    }
}

/// The parts of a follower's `/v1/status` that are the leader's.
pub const LEADER_SECTIONS: [&str; 3] = ["peers", "replication", "self_preservation"];
