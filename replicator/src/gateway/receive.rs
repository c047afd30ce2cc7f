//! The accepting side of the gateway: the accept loop (admission of a source before any
//! TLS work, peer identity from the certificate, one receive session per origin at a time) and the receive session, which runs a
//! [`Receiver`] and applies the origin's batches, snapshots and snapshot chunks durably.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use tandem_schemas::{encode, Frame};
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::admission::{Admission, Screened};
use super::transport::STREAM_OPEN_TIMEOUT;
use super::{
    close_refused, now_ms, read_frame, tls, wall_ms, write_frame, GatewayConfig, GatewayStats, ReplicaStore,
    CHUNKED_SNAPSHOTS_SINCE, SNAPSHOT_LOG_EVERY_MS,
};
use crate::log::{ApplyReport, ChunkOutcome, EventLog, LogError};
use crate::protocol::{Receiver, ReceiverAction};
use crate::sampled::LogSampler;

/// Application close code: a newer connection of the same DC replaced this one.
pub const CLOSE_REPLACED: u32 = 3;
/// Application close code: the connection opened no stream within [`STREAM_OPEN_TIMEOUT`].
pub const CLOSE_NO_STREAM: u32 = 4;

pub(super) async fn accept_loop<S: ReplicaStore>(
    endpoint: quinn::Endpoint,
    cfg: Arc<GatewayConfig>,
    store: S,
    stats: Arc<GatewayStats>,
    started: tokio::time::Instant,
    mut shut: watch::Receiver<bool>,
) {
    // Connection tasks live in this set: when the accept loop ends (or is aborted), every
    // connection task is aborted with it, so no task outlives the gateway's socket.
    let mut conns = tokio::task::JoinSet::new();
    let sessions: Arc<Mutex<BTreeMap<String, Arc<OriginSessions>>>> = Default::default();
    // One connection per peer DC: the newest, which closes the one before it.
    let current: Arc<Mutex<BTreeMap<String, quinn::Connection>>> = Default::default();
    let samplers: Arc<Samplers> = Default::default();
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => i,
            _ = shut.changed() => return,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let Some(incoming) = incoming else { return };
        let Some(handshake) = admit(incoming, &cfg.peers.admission(), &stats, &samplers) else { continue };
        let cfg = cfg.clone();
        let store = store.clone();
        let stats = stats.clone();
        let samplers = samplers.clone();
        let sessions = sessions.clone();
        let current = current.clone();
        conns.spawn(async move {
            let (incoming, running) = handshake;
            let handshake = incoming.await;
            drop(running);
            let conn = match handshake {
                Ok(c) => c,
                Err(e) => {
                    stats.refused_connections.fetch_add(1, Ordering::Relaxed);
                    if let Some(held_back) = samplers.handshake.admit() {
                        warn!(error = %e, held_back, "refused replication connection: TLS handshake failed (sampled: one line per 10 s)");
                    }
                    return;
                }
            };
            let peer_dc = match tls::peer_dc(&conn) {
                Ok(dc) if store.retired(&dc) => {
                    let n = stats.refused_retired.fetch_add(1, Ordering::Relaxed) + 1;
                    // Sampled: a retired DC keeps redialing; log its 1st, 2nd, 4th, 8th... try.
                    if n.is_power_of_two() {
                        warn!(peer = %dc, refused = n, "refused replication connection from a retired DC");
                    }
                    conn.close(2u32.into(), b"retired here");
                    return;
                }
                Ok(dc) if cfg.peers.dcs().contains(&dc) && dc != cfg.local_dc => dc,
                Ok(dc) => {
                    stats.refused_connections.fetch_add(1, Ordering::Relaxed);
                    if let Some(held_back) = samplers.identity.admit() {
                        warn!(peer = %dc, held_back, "refused replication connection from a DC that is not a configured peer (sampled: one line per 10 s)");
                    }
                    conn.close(1u32.into(), b"not a configured peer");
                    return;
                }
                Err(e) => {
                    stats.refused_connections.fetch_add(1, Ordering::Relaxed);
                    if let Some(held_back) = samplers.identity.admit() {
                        warn!(error = %e, held_back, "refused replication connection without a usable identity (sampled: one line per 10 s)");
                    }
                    conn.close(1u32.into(), b"no identity");
                    return;
                }
            };
            if let Some(older) = current.lock().insert(peer_dc.clone(), conn.clone()) {
                stats.connections_replaced.fetch_add(1, Ordering::Relaxed);
                older.close(CLOSE_REPLACED.into(), b"replaced by a newer connection of the same DC");
            }
            let origin = sessions.lock().entry(peer_dc.clone()).or_default().clone();
            let res = receive_session(&conn, &cfg, &peer_dc, &store, &stats, started, origin).await;
            {
                let mut cur = current.lock();
                if cur.get(&peer_dc).is_some_and(|c| c.stable_id() == conn.stable_id()) {
                    cur.remove(&peer_dc);
                }
            }
            if let Err(e) = res {
                debug!(peer = %peer_dc, error = %e, "replication stream from peer ended");
            }
        });
    }
}

/// One log sampler per kind of refusal, so each kind shows up in the log.
#[derive(Debug, Default)]
struct Samplers {
    source: LogSampler,
    busy: LogSampler,
    handshake: LogSampler,
    identity: LogSampler,
}

/// A running handshake, counted in `handshakes_in_flight` until dropped.
struct Running(Arc<GatewayStats>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.handshakes_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The admission rules of [`Admission`] applied to one incoming connection, before any
/// TLS work: a source not admitted is dropped unanswered; an unvalidated source gets a
/// Retry; beyond `handshakes_max` running handshakes the connection is refused. `None`
/// when the connection goes no further.
fn admit(
    incoming: quinn::Incoming,
    admission: &Admission,
    stats: &Arc<GatewayStats>,
    samplers: &Samplers,
) -> Option<(quinn::Incoming, Running)> {
    let source = incoming.remote_address();
    let incoming = match admission.screen(incoming, stats.handshakes_in_flight.load(Ordering::Relaxed)) {
        Screened::Admitted(incoming) => incoming,
        Screened::Dropped => {
            stats.refused_source.fetch_add(1, Ordering::Relaxed);
            if let Some(held_back) = samplers.source.admit() {
                warn!(%source, held_back, "dropped a replication handshake from a source not in accept_from (sampled: one line per 10 s)");
            }
            return None;
        }
        Screened::Retried => {
            stats.retries_sent.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Screened::Busy => {
            stats.refused_handshakes_busy.fetch_add(1, Ordering::Relaxed);
            if let Some(held_back) = samplers.busy.admit() {
                warn!(%source, limit = admission.handshakes_max, held_back, "refused a replication handshake: handshakes_max are running (sampled: one line per 10 s)");
            }
            return None;
        }
    };
    stats.handshakes_in_flight.fetch_add(1, Ordering::Relaxed);
    let guard = Running(stats.clone());
    Some((incoming, guard))
}

/// The sampled log line of events outside a peer's replication scope: at most one per
/// [`SNAPSHOT_LOG_EVERY_MS`] per session, with the count since the previous line.
#[derive(Debug, Default)]
struct ScopeLog {
    last: Option<tokio::time::Instant>,
    unlogged: u64,
}

impl ScopeLog {
    fn note(&mut self, peer_dc: &str, report: &ApplyReport) {
        if report.out_of_scope == 0 {
            return;
        }
        self.unlogged += report.out_of_scope as u64;
        if self.last.is_some_and(|t| (t.elapsed().as_millis() as u64) < SNAPSHOT_LOG_EVERY_MS) {
            return;
        }
        self.last = Some(tokio::time::Instant::now());
        // The namespace is the peer's string: the log formatter escapes it.
        let namespace = report.out_of_scope_namespace.as_deref().unwrap_or("");
        info!(
            peer = %peer_dc,
            namespace,
            skipped = self.unlogged,
            "applied events of a peer outside its replication scope as no-ops (sampled)"
        );
        self.unlogged = 0;
    }
}

/// Serializes the receive sessions of one origin.
#[derive(Debug)]
struct OriginSessions {
    /// Bumped by every new session; an older session that sees it change stops.
    gen: watch::Sender<u64>,
    /// Held by the running session.
    turn: tokio::sync::Mutex<()>,
}

impl Default for OriginSessions {
    fn default() -> Self {
        OriginSessions { gen: watch::channel(0).0, turn: tokio::sync::Mutex::new(()) }
    }
}

async fn receive_session<S: ReplicaStore>(
    conn: &quinn::Connection,
    cfg: &GatewayConfig,
    peer_dc: &str,
    store: &S,
    stats: &GatewayStats,
    started: tokio::time::Instant,
    origin: Arc<OriginSessions>,
) -> Result<(), String> {
    let (mut send, mut recv) = match tokio::time::timeout(STREAM_OPEN_TIMEOUT, conn.accept_bi()).await {
        Ok(s) => s.map_err(|e| e.to_string())?,
        Err(_) => {
            stats.connections_idle_closed.fetch_add(1, Ordering::Relaxed);
            conn.close(CLOSE_NO_STREAM.into(), b"no stream opened in time");
            return Err("no stream opened in time".into());
        }
    };
    // One receive session per origin at a time: a newer connection of the origin ends the
    // older one (it may be a half-open connection of a dead incarnation) and waits until
    // it has stopped, so the mark it reports in its HelloAck cannot be moved under it.
    let my_gen = {
        let mut g = 0;
        origin.gen.send_modify(|v| {
            *v += 1;
            g = *v;
        });
        g
    };
    let mut superseded = origin.gen.subscribe();
    let _turn = origin.turn.lock().await;
    if *superseded.borrow_and_update() != my_gen {
        return Err("superseded by a newer connection of the same origin".into());
    }
    let origin_dc = peer_dc.to_owned();
    let staged = store
        .with_log(Box::new(move |log: &dyn EventLog| log.staged_snapshot(&origin_dc)))
        .await
        .and_then(|r| r)
        .map_err(|e| e.to_string())?;
    // Chunked snapshots are schema 2: a schema 1 Hello turns them off (below).
    let mut receiver = Receiver::chunked(&cfg.local_dc, peer_dc, staged);
    let mut last_snapshot_log: Option<tokio::time::Instant> = None;
    let mut scope_log = ScopeLog::default();
    // Answers go out in the version of the Hello (until it came: the configured one).
    let mut v = cfg.schema_version_write;
    let mut whole_snapshots = false;
    stats.with_peer(peer_dc, |p| p.in_connected = true);
    info!(peer = %peer_dc, "replication stream from peer open");
    let res = async {
        loop {
            let frame = tokio::select! {
                f = read_frame(&mut recv, whole_snapshots, stats) => f,
                _ = superseded.changed() => {
                    return Err("superseded by a newer connection of the same origin".into());
                }
            };
            if *superseded.borrow() != my_gen {
                return Err("superseded by a newer connection of the same origin".into());
            }
            let frame = match frame {
                Ok(Some((f, version))) => {
                    if matches!(f, Frame::Hello { .. }) {
                        v = version;
                        if v < CHUNKED_SNAPSHOTS_SINCE {
                            // Only a schema-1 peer may send a whole snapshot in one frame.
                            whole_snapshots = true;
                            receiver.whole_snapshots_only();
                        }
                    }
                    f
                }
                Ok(None) => return Ok(()),
                Err(e) => {
                    stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
                    let _ = write_frame(&mut send, &e.to_frame(), v).await;
                    close_refused(conn, &mut send, &e).await;
                    return Err(e.message);
                }
            };
            stats.frames_received.fetch_add(1, Ordering::Relaxed);
            let mono = now_ms(started);
            stats.with_peer(peer_dc, |p| p.on_frame(wall_ms(), mono));
            // A batch is handled without the mark: it costs one trip to the log, its apply.
            let (mark, mark_id) = if Receiver::needs_mark(&frame) {
                store.mark_of(peer_dc.to_owned()).await.map_err(|e| e.to_string())?
            } else {
                (None, None)
            };
            let actions = match receiver.handle_frame(mark, mark_id, frame) {
                Ok(a) => a,
                Err(e) => {
                    stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
                    if e.code == tandem_schemas::RefuseCode::Fenced {
                        warn!(peer = %peer_dc, error = %e, "refusing an older incarnation of the peer");
                    }
                    let _ = write_frame(&mut send, &e.to_frame(), v).await;
                    close_refused(conn, &mut send, &e).await;
                    return Err(e.message);
                }
            };
            for action in actions {
                let ack = match action {
                    ReceiverAction::Send(f) => Some(Ok(f)),
                    ReceiverAction::Apply { batch_id, events } => {
                        let times: Vec<u64> = events.iter().map(|e| e.commit_time_ms).collect();
                        let report = store
                            .apply_remote(peer_dc.to_owned(), events)
                            .await
                            .map_err(|e| e.to_string())?;
                        let now = wall_ms();
                        scope_log.note(peer_dc, &report);
                        stats.with_peer(peer_dc, |p| {
                            p.events_applied += report.applied as u64;
                            p.batches_applied += 1;
                            p.events_out_of_scope += report.out_of_scope as u64;
                            let consumed =
                                report.applied + report.superseded + report.duplicates + report.out_of_scope;
                            for t in times.iter().take(consumed) {
                                p.lag_ms_recent.push(now.saturating_sub(*t));
                            }
                            if let Some(m) = report.mark {
                                p.on_origin_position(m.epoch, m.seq);
                            }
                            p.on_progress(now_ms(started));
                        });
                        Some(receiver.applied(batch_id, &report))
                    }
                    ReceiverAction::Install { batch_id, snapshot } => {
                        let report = match store.install_snapshot(peer_dc.to_owned(), snapshot).await {
                            Ok(r) => r,
                            // A refused snapshot changed nothing; tell the sender why.
                            Err(LogError::Refused(r)) => {
                                ApplyReport { refusal: Some(r), ..Default::default() }
                            }
                            Err(e) => return Err(e.to_string()),
                        };
                        scope_log.note(peer_dc, &report);
                        stats.with_peer(peer_dc, |p| {
                            p.snapshots_installed += 1;
                            p.events_out_of_scope += report.out_of_scope as u64;
                            if report.refusal.is_none() {
                                p.on_progress(now_ms(started));
                            } else {
                                p.snapshots_refused += 1;
                            }
                        });
                        Some(receiver.applied(batch_id, &report))
                    }
                    ReceiverAction::StageChunk { batch_id, chunk } => {
                        let (snapshot_id, index, mark) = (chunk.snapshot_id, chunk.index, chunk.mark);
                        let bytes = (encode(&chunk.instances).len() + encode(&chunk.tombstones).len()) as u64;
                        let sampled = last_snapshot_log
                            .is_none_or(|t| t.elapsed().as_millis() as u64 >= SNAPSHOT_LOG_EVERY_MS);
                        if index == 0 && sampled {
                            last_snapshot_log = Some(tokio::time::Instant::now());
                            info!(peer = %peer_dc, snapshot_id, epoch = mark.epoch, seq = mark.seq, "receiving a snapshot from peer in chunks");
                        }
                        let outcome = match store.stage_snapshot_chunk(peer_dc.to_owned(), chunk).await {
                            Ok(o) => o,
                            Err(LogError::Refused(r)) => {
                                if sampled {
                                    last_snapshot_log = Some(tokio::time::Instant::now());
                                    info!(peer = %peer_dc, snapshot_id, index, reason = %r, "refused a snapshot chunk from peer");
                                }
                                stats.with_peer(peer_dc, |p| p.snapshots_refused += 1);
                                ChunkOutcome::Installed(ApplyReport { refusal: Some(r), ..Default::default() })
                            }
                            Err(e) => return Err(e.to_string()),
                        };
                        match outcome {
                            ChunkOutcome::Staged(staged) => {
                                stats.with_peer(peer_dc, |p| {
                                    p.snapshot_chunks_staged += 1;
                                    p.snapshot_bytes_staged += bytes;
                                    p.in_snapshot_id = staged.snapshot_id;
                                    p.in_snapshot_chunks = staged.chunks;
                                    p.on_progress(now_ms(started));
                                });
                                Some(Ok(receiver.chunk_staged(batch_id, snapshot_id, index)))
                            }
                            ChunkOutcome::Installed(report) => {
                                if report.refusal.is_none() {
                                    info!(peer = %peer_dc, snapshot_id, chunks = index + 1, epoch = mark.epoch, seq = mark.seq, "installed a snapshot from peer");
                                    scope_log.note(peer_dc, &report);
                                    stats.with_peer(peer_dc, |p| {
                                        p.snapshots_installed += 1;
                                        p.events_out_of_scope += report.out_of_scope as u64;
                                        p.snapshot_chunks_staged += 1;
                                        p.snapshot_bytes_staged += bytes;
                                        p.in_snapshot_id = 0;
                                        p.in_snapshot_chunks = 0;
                                        p.on_origin_position(mark.epoch, mark.seq);
                                        p.on_progress(now_ms(started));
                                    });
                                }
                                Some(receiver.applied(batch_id, &report))
                            }
                        }
                    }
                    ReceiverAction::PurgeTombstones { upto_seq } => {
                        store
                            .purge_remote_tombstones(peer_dc.to_owned(), upto_seq)
                            .await
                            .map_err(|e| e.to_string())?;
                        None
                    }
                    ReceiverAction::Contact { epoch, last_seq, caught_up, .. } => {
                        stats.with_peer(peer_dc, |p| {
                            p.on_origin_position(epoch, last_seq);
                            if caught_up {
                                p.on_progress(now_ms(started));
                            }
                        });
                        None
                    }
                };
                match ack {
                    None => {}
                    Some(Ok(f)) => {
                        write_frame(&mut send, &f, v).await.map_err(|e| e.message)?;
                        stats.frames_sent.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(Err(e)) => {
                        stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
                        warn!(peer = %peer_dc, error = %e, "refusing replication stream");
                        let _ = write_frame(&mut send, &e.to_frame(), v).await;
                        close_refused(conn, &mut send, &e).await;
                        return Err(e.message);
                    }
                }
            }
            let _ = send.flush().await;
        }
    }
    .await;
    // Still holding the turn, so a newer session's "up" is never overwritten.
    stats.with_peer(peer_dc, |p| p.in_connected = false);
    res
}
