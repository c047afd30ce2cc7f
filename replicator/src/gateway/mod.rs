//! The QUIC replication gateway: a thin driver that runs [`protocol`](crate::protocol)
//! over quinn with mutual TLS.
//!
//! For every configured peer the gateway dials out and ships its own origin's events (one
//! [`Sender`] per connection); it accepts the peers' connections and applies their events
//! (one [`Receiver`](crate::protocol::Receiver) per connection). The peer's DC name is read from its certificate and
//! must be a configured peer, else the connection is refused and counted.
//!
//! Every frame on a stream is a big-endian u32 length followed by a postcard
//! [`Envelope`](tandem_schemas::Envelope). Lengths are bounded before anything is read.

mod admission;
mod dial;
#[cfg(test)]
mod dial_tests;
mod receive;
mod stats;
mod transport;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use tandem_schemas::{
    decode_frame_versioned, encode_frame_as, frame_bytes_max_for, ChangeEvent, Frame, Mark, Snapshot,
    SnapshotChunk, FRAME_BYTES_MAX, FRAME_HEAD_BYTES, SNAPSHOT_FRAME_BYTES_MAX,
};
use tokio::sync::watch;
use tracing::{debug, info, warn};
use uuid::Uuid;

use crate::log::{ApplyReport, ChunkOutcome, EventLog, LogError, SharedReader};
use crate::protocol::{Sender, SenderEvent, StreamError, StreamTuning};
use crate::tls::{self, ReloadableTls};

pub use admission::{Admission, PeerBook, Screened, SourceRule, HANDSHAKES_MAX_DEFAULT};
use dial::{closed_with_a_word, dial};
pub use dial::{DIAL_ATTEMPTS_MAX, REDIAL_MS};
pub use receive::{CLOSE_NO_STREAM, CLOSE_REPLACED};
pub use stats::{GatewayStats, LagRing, PeerLink};
pub use transport::{TransportTuning, RECEIVE_WINDOW_BYTES, STREAMS_BIDI_MAX, STREAM_OPEN_TIMEOUT};

/// ALPN: the protocol and its major version. A peer speaking another one fails the TLS
/// handshake before any frame is exchanged.
pub const ALPN: &[u8] = b"tandem-repl/1";

/// The durable store the gateway ships from and applies into.
///
/// The root crate implements it on its RocksDB committer so that every apply is one
/// atomic, synced write that also updates the node's in-memory view.
/// A read of the log, run wherever the store keeps it.
pub type LogRead<R> = Box<dyn FnOnce(&dyn EventLog) -> R + Send>;

pub trait ReplicaStore: Clone + Send + Sync + 'static {
    /// Runs `f` with read access to the log (used for reading own events and snapshots).
    fn with_log<R: Send + 'static>(&self, f: LogRead<R>) -> impl Future<Output = Result<R, LogError>> + Send;
    fn apply_remote(
        &self,
        channel_dc: String,
        events: Vec<ChangeEvent>,
    ) -> impl Future<Output = Result<ApplyReport, LogError>> + Send;
    fn install_snapshot(
        &self,
        channel_dc: String,
        snapshot: Snapshot,
    ) -> impl Future<Output = Result<ApplyReport, LogError>> + Send;
    /// [`EventLog::stage_snapshot_chunk`], as one durable write.
    fn stage_snapshot_chunk(
        &self,
        channel_dc: String,
        chunk: SnapshotChunk,
    ) -> impl Future<Output = Result<ChunkOutcome, LogError>> + Send;
    fn purge_remote_tombstones(
        &self,
        origin: String,
        upto_seq: u64,
    ) -> impl Future<Output = Result<(), LogError>> + Send;
    /// The peer durably holds this origin up to `mark` (input of the purge floor).
    fn peer_acked(&self, peer_dc: String, mark: Mark) -> impl Future<Output = Result<(), LogError>> + Send;
    /// The receiver's current mark of an origin, and the id of the event at it when known.
    fn mark_of(
        &self,
        origin: String,
    ) -> impl Future<Output = Result<(Option<Mark>, Option<Uuid>), LogError>> + Send;
    /// Starts a new history of the own origin unless the own epoch is already above
    /// `above`: [`EventLog::begin_epoch`] with [`epoch::above`](crate::epoch::above) of the
    /// higher of `above` and the own epoch, with `tiebreak`. Returns the own mark after it.
    fn begin_epoch(&self, above: u64, tiebreak: u64) -> impl Future<Output = Result<Mark, LogError>> + Send;
    /// Changes whenever the own origin's last seq does.
    fn own_progress(&self) -> watch::Receiver<u64>;
    /// The own origin's epoch as of its last durable write, when the store can say without
    /// a read of the log: a peer's ack is then checked against it where it arrives, not
    /// behind the writes the log is busy with. `None`: acks are handled with the log.
    fn own_epoch(&self) -> Option<u64> {
        None
    }
    /// True when this side's operator retired `dc`: its connections are refused and it is
    /// not dialed (see docs/replication.md, "Retiring a DC").
    fn retired(&self, _dc: &str) -> bool {
        false
    }
}

/// A configured peer DC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    pub dc: String,
    /// Where its gateway may be: one address for a single-node DC, every node's for a DC
    /// group (only its leader runs a gateway). The dialer dials them all at once and keeps
    /// the first connection whose handshake completes, so finding a new leader costs one
    /// round trip, not a handshake timeout per follower.
    pub addrs: Vec<SocketAddr>,
}

/// Gateway settings.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    pub local_dc: String,
    pub listen: SocketAddr,
    /// The peer DCs, their addresses and which sources may start a handshake (and how
    /// many handshakes run at once): changed in place by a reload.
    pub peers: Arc<PeerBook>,
    pub stream: StreamTuning,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    /// The schema version this node writes on the streams it dials (its Hello and
    /// everything after). A receiver answers in the version of the Hello it got.
    pub schema_version_write: u16,
    /// The node's secret for QUIC stateless resets: random per node and stable across its
    /// restarts (the node keeps it in its data dir), never derived from the DC's key.
    pub reset_secret: [u8; 32],
}

/// A running gateway. Dropping it does not stop it; call [`Gateway::shutdown`].
pub struct Gateway {
    endpoint: quinn::Endpoint,
    tls: Arc<ReloadableTls>,
    stats: Arc<GatewayStats>,
    started: tokio::time::Instant,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

pub fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("tls: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("cannot bind the replication listener on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

impl Gateway {
    /// Binds the listener and starts one dialer per peer and the accept loop.
    pub fn start<S: ReplicaStore>(
        cfg: GatewayConfig,
        tls: Arc<ReloadableTls>,
        store: S,
    ) -> Result<Gateway, GatewayError> {
        Self::start_with_stats(cfg, tls, store, Arc::default(), tokio::time::Instant::now())
    }

    /// [`Gateway::start`], counting in `stats` with the monotonic clock `started` (a DC
    /// group's leader starts a gateway each time it takes over, and keeps one set of
    /// counters, on one clock, across them).
    pub fn start_with_stats<S: ReplicaStore>(
        cfg: GatewayConfig,
        tls: Arc<ReloadableTls>,
        store: S,
        stats: Arc<GatewayStats>,
        started: tokio::time::Instant,
    ) -> Result<Gateway, GatewayError> {
        let server_cfg = tls.server_config(ALPN)?;
        let socket = std::net::UdpSocket::bind(cfg.listen)
            .map_err(|source| GatewayError::Bind { addr: cfg.listen, source })?;
        let reset_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &cfg.reset_secret);
        let endpoint_cfg = quinn::EndpointConfig::new(Arc::new(reset_key));
        let runtime = quinn::default_runtime().ok_or_else(|| GatewayError::Bind {
            addr: cfg.listen,
            source: std::io::Error::other("no async runtime for quinn"),
        })?;
        let endpoint = quinn::Endpoint::new(endpoint_cfg, Some(server_cfg), socket, runtime)
            .map_err(|source| GatewayError::Bind { addr: cfg.listen, source })?;
        for dc in cfg.peers.dcs() {
            stats.with_peer(dc, |_| ());
        }
        let (shutdown, shut_rx) = watch::channel(false);
        let cfg = Arc::new(cfg);
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(receive::accept_loop(
            endpoint.clone(),
            cfg.clone(),
            store.clone(),
            stats.clone(),
            started,
            shut_rx.clone(),
        )));
        for peer in cfg.peers.dcs().to_vec() {
            tasks.push(tokio::spawn(dial_loop(
                endpoint.clone(),
                cfg.clone(),
                peer,
                tls.clone(),
                store.clone(),
                stats.clone(),
                shut_rx.clone(),
            )));
        }
        Ok(Gateway { endpoint, tls, stats, started, shutdown, tasks })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    pub fn stats(&self) -> Arc<GatewayStats> {
        self.stats.clone()
    }

    /// Milliseconds since the gateway started (the clock of `in_last_contact_mono_ms`).
    pub fn mono_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Re-reads the certificate files. New connections use the new material; established
    /// connections and their streams continue untouched. On error the old material stays.
    pub fn reload_tls(&self) -> Result<(), tls::TlsError> {
        self.tls.reload()?;
        self.endpoint.set_server_config(Some(self.tls.server_config(ALPN)?));
        info!("replication certificates reloaded");
        Ok(())
    }

    /// Stops every task and closes the endpoint. Returns once the UDP port is free again
    /// (bounded: at most a few seconds), so a restarted node can bind it at once.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let addr = self.endpoint.local_addr().ok();
        self.endpoint.close(0u32.into(), b"shutdown");
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), self.endpoint.wait_idle()).await;
        drop(self.endpoint);
        if let Some(addr) = addr {
            // quinn's driver releases the socket once the last endpoint handle is gone,
            // which happens as aborted tasks unwind; wait for it.
            for _ in 0..150 {
                if std::net::UdpSocket::bind(addr).is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            warn!(%addr, "replication socket still bound after shutdown");
        }
    }
}

async fn write_frame(send: &mut quinn::SendStream, frame: &Frame, version: u16) -> Result<(), StreamError> {
    let bytes = encode_frame_as(frame, version)
        .map_err(|e| StreamError { code: tandem_schemas::RefuseCode::Internal, message: e.to_string() })?;
    let len = u32::try_from(bytes.len()).map_err(|_| StreamError {
        code: tandem_schemas::RefuseCode::Internal,
        message: "frame too large".into(),
    })?;
    let io = |e: quinn::WriteError| StreamError {
        code: tandem_schemas::RefuseCode::Internal,
        message: e.to_string(),
    };
    send.write_all(&len.to_be_bytes()).await.map_err(io)?;
    send.write_all(&bytes).await.map_err(io)?;
    Ok(())
}

/// A read error as text, with the peer's close code and reason when it closed the
/// connection (a refusing receiver says why it refused in its close reason).
fn read_error_text(e: &quinn::ReadError) -> String {
    match e {
        quinn::ReadError::ConnectionLost(c) => format!("connection lost: {c}"),
        other => other.to_string(),
    }
}

/// Closes a peer's connection after a refusal, with [`CLOSE_REFUSED`] and the refusal as
/// the reason (at most [`CLOSE_REASON_BYTES_MAX`] bytes), once the `Refuse` frame was
/// read by the peer or after a short grace: the peer reports the reason either way.
async fn close_refused(conn: &quinn::Connection, send: &mut quinn::SendStream, e: &StreamError) {
    let _ = send.finish();
    let _ = tokio::time::timeout(Duration::from_millis(500), send.stopped()).await;
    let reason = format!("refused ({:?}): {}", e.code, e.message);
    let mut end = reason.len().min(CLOSE_REASON_BYTES_MAX);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    conn.close(CLOSE_REFUSED.into(), &reason.as_bytes()[..end]);
}

/// Frames and events a sender had ready, and the error that ended the polling, if any.
type Drained = (Vec<Frame>, Vec<SenderEvent>, Option<StreamError>);

/// Calls `poll` until it has nothing more (bounded: at most one window's worth plus a
/// ping per round), collecting what it produced.
fn drain(mut poll: impl FnMut() -> Result<Option<(Frame, Vec<SenderEvent>)>, StreamError>) -> Drained {
    let (mut frames, mut events) = (Vec::new(), Vec::new());
    for _ in 0..64 {
        match poll() {
            Ok(Some((f, ev))) => {
                frames.push(f);
                events.extend(ev);
            }
            Ok(None) => break,
            Err(e) => return (frames, events, Some(e)),
        }
    }
    (frames, events, None)
}

/// Application close code: this side refused the stream (the reason says why).
pub const CLOSE_REFUSED: u32 = 5;

/// Longest close reason sent with a refusal.
pub const CLOSE_REASON_BYTES_MAX: usize = 512;

/// Bytes read from a stream at a time while a frame arrives: a reader's memory grows with
/// what the peer has actually sent, never with the length it declared.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Reads one frame and the schema version it came in; `Ok(None)` on a clean end of stream.
///
/// The declared length is checked before anything else is read against the limit of the
/// frame type that follows ([`frame_bytes_max_for`]: whole snapshots only when
/// `whole_snapshots`, i.e. from a schema-1 peer), and the body is read incrementally.
/// A frame over its limit is counted in `frames_too_large`.
async fn read_frame(
    recv: &mut quinn::RecvStream,
    whole_snapshots: bool,
    stats: &GatewayStats,
) -> Result<Option<(Frame, u16)>, StreamError> {
    let io = |m: String| StreamError { code: tandem_schemas::RefuseCode::Invalid, message: m };
    let mut len = [0u8; 4];
    match recv.read_exact(&mut len).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(quinn::ReadExactError::ReadError(e)) => return Err(io(read_error_text(&e))),
        Err(e) => return Err(io(e.to_string())),
    }
    let len = u32::from_be_bytes(len) as usize;
    let too_large = |max: usize| {
        stats.frames_too_large.fetch_add(1, Ordering::Relaxed);
        io(format!("frame of {len} bytes exceeds the limit of {max} bytes"))
    };
    // Even a whole snapshot cannot be longer than this; its type is read first.
    if len > SNAPSHOT_FRAME_BYTES_MAX || (!whole_snapshots && len > FRAME_BYTES_MAX) {
        return Err(too_large(if whole_snapshots { SNAPSHOT_FRAME_BYTES_MAX } else { FRAME_BYTES_MAX }));
    }
    let mut buf = Vec::with_capacity(len.min(READ_CHUNK_BYTES));
    let mut max = FRAME_BYTES_MAX;
    let mut head_checked = false;
    while buf.len() < len {
        let want = (len - buf.len()).min(if head_checked { READ_CHUNK_BYTES } else { FRAME_HEAD_BYTES });
        match recv.read_chunk(want, true).await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk.bytes),
            Ok(None) => return Err(io("stream ended inside a frame".into())),
            Err(e) => return Err(io(read_error_text(&e))),
        }
        if !head_checked && (buf.len() >= FRAME_HEAD_BYTES || buf.len() == len) {
            head_checked = true;
            max = frame_bytes_max_for(&buf, whole_snapshots);
            if len > max {
                return Err(too_large(max));
            }
        }
    }
    decode_frame_versioned(&buf, max).map(Some).map_err(|e| io(e.to_string()))
}

async fn dial_loop<S: ReplicaStore>(
    endpoint: quinn::Endpoint,
    cfg: Arc<GatewayConfig>,
    dc: String,
    tls: Arc<ReloadableTls>,
    store: S,
    stats: Arc<GatewayStats>,
    mut shut: watch::Receiver<bool>,
) {
    let mut backoff_ms = cfg.backoff_initial_ms.max(1);
    // The schema version written to this peer's next session: the configured one, or,
    // right after a session showed the peer does not read it (it answered in an older
    // version, or closed without a word after our Hello: a DC not yet upgraded), the older
    // one. Every later session tries the configured version again.
    let mut version = cfg.schema_version_write;
    // The cut of a snapshot an earlier stream was sending, for a resume by the next one.
    let mut cache = ReaderCache::default();
    // Which of the peer's addresses the next session dials: the one that last worked,
    // else the next after a failure.
    loop {
        if *shut.borrow() {
            return;
        }
        // Its addresses of the moment (a reload may have changed them).
        let peer = cfg.peers.peer(&dc);
        if store.retired(&peer.dc) {
            // A retired DC is not dialed; look again now and then (it may be unretired).
            stats.with_peer(&peer.dc, |p| {
                p.out_connected = false;
                p.out_last_error = "retired here: not dialed".into();
            });
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(cfg.backoff_max_ms.max(100))) => continue,
                _ = shut.changed() => return,
            }
        }
        if stats.fenced.lock().is_some() {
            // An older incarnation ships nothing more, to anyone, until it is restarted.
            stats.with_peer(&peer.dc, |p| p.out_connected = false);
            let _ = shut.changed().await;
            return;
        }
        let started = tokio::time::Instant::now();
        let tried = version;
        let mut wire = WireVersion { version, silent: false, cache: std::mem::take(&mut cache) };
        let res = tokio::select! {
            r = send_session(&endpoint, &cfg, &peer, &tls, &store, &stats, &mut wire) => r,
            _ = shut.changed() => return,
        };
        cache = std::mem::take(&mut wire.cache);
        version = wire.version;
        if version == tried {
            version = if wire.silent && tried > tandem_schemas::SCHEMA_VERSION_MIN {
                debug!(peer = %peer.dc, version = tried - 1, "peer closed after our Hello without a word; trying an older schema version");
                tried - 1
            } else {
                cfg.schema_version_write
            };
        }
        stats.with_peer(&peer.dc, |p| {
            p.out_connected = false;
            p.out_failures += 1;
            match &res {
                Err(e) => p.out_last_error = e.clone(),
                Ok(SessionEnd::NewEpoch) => p.out_last_error = "took a new epoch; reconnecting".into(),
                Ok(SessionEnd::Fenced) => p.out_last_error = "fenced: an older incarnation of this DC".into(),
            }
        });
        if let Err(e) = &res {
            debug!(peer = %peer.dc, error = %e, "replication stream to peer ended");
        }
        if let Ok(SessionEnd::NewEpoch) = &res {
            // The new history ships at once: no backoff.
            backoff_ms = cfg.backoff_initial_ms.max(1);
            continue;
        }
        // A session that ran for a while resets the backoff.
        if started.elapsed() > Duration::from_secs(10) {
            backoff_ms = cfg.backoff_initial_ms.max(1);
        }
        let jitter = rand::thread_rng().gen_range(0..=backoff_ms / 2);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(backoff_ms / 2 + jitter)) => {}
            _ = shut.changed() => return,
        }
        backoff_ms = (backoff_ms * 2).min(cfg.backoff_max_ms.max(1));
    }
}

fn now_ms(started: tokio::time::Instant) -> u64 {
    started.elapsed().as_millis() as u64
}

/// What a send session carries from the one before and to the one after: the schema
/// version it writes (and what it learned about the peer's), and a snapshot cut to resume.
struct WireVersion {
    /// Written by the session; lowered when the peer answers in an older version.
    version: u16,
    /// The Hello went out and nothing came back (yet).
    silent: bool,
    /// The cut of the snapshot this session was sending, for a resume by the next one.
    cache: ReaderCache,
}

/// How a send session ended without an error.
enum SessionEnd {
    /// The own origin took a new epoch: reconnect at once.
    NewEpoch,
    /// This process is fenced: ship nothing more.
    Fenced,
}

/// The first schema version with chunked snapshots (`SnapshotResume`, `SnapshotChunk`,
/// `ChunkAck`): a receiver answering an older Hello takes whole snapshots only.
const CHUNKED_SNAPSHOTS_SINCE: u16 = 2;

/// How long a snapshot's cut is kept for a resume once its stream ended (holding a
/// RocksDB snapshot pins the table files of that cut).
pub const SNAPSHOT_RESUME_KEEP_MS: u64 = 10 * 60 * 1000;

/// The reader of the snapshot the last stream to a peer was sending, and when it was left.
#[derive(Default)]
struct ReaderCache {
    reader: Option<(tokio::time::Instant, SharedReader)>,
}

impl ReaderCache {
    fn take_fresh(&mut self) -> Option<SharedReader> {
        let (at, r) = self.reader.take()?;
        (at.elapsed() < Duration::from_millis(SNAPSHOT_RESUME_KEEP_MS)).then_some(r)
    }
    fn keep(&mut self, r: Option<SharedReader>) {
        self.reader = r.map(|r| (tokio::time::Instant::now(), r));
    }
}

/// Info-level snapshot log lines at most this often per peer (a snapshot that is refused
/// over and over must not flood the log).
const SNAPSHOT_LOG_EVERY_MS: u64 = 10_000;

// The session's parts are many and distinct; bundling them would only rename them.
#[allow(clippy::too_many_arguments)]
async fn send_session<S: ReplicaStore>(
    endpoint: &quinn::Endpoint,
    cfg: &GatewayConfig,
    peer: &PeerConfig,
    tls: &ReloadableTls,
    store: &S,
    stats: &GatewayStats,
    wire: &mut WireVersion,
) -> Result<SessionEnd, String> {
    let client_cfg = tls.client_config(ALPN).map_err(|e| e.to_string())?;
    let (conn, addr) = dial(endpoint, &client_cfg, &peer.addrs, &peer.dc).await?;
    debug!(peer = %peer.dc, %addr, "connected to the peer's gateway");
    let res = session_on(&conn, cfg, peer, store, stats, wire).await;
    if wire.silent && closed_with_a_word(conn.close_reason().as_ref()) {
        // The peer read our Hello and said why it closed: not a peer of an older version.
        wire.silent = false;
    }
    res
}

/// Records a peer's acks of the own origin (the purge floor's input) as they come, the
/// latest one each time the store is free: a record that waits for the log's writes does
/// not hold up the stream. Ends only when a record fails, with the error.
async fn record_acks<S: ReplicaStore>(
    store: S,
    peer: String,
    mut acks: watch::Receiver<Option<Mark>>,
) -> String {
    while acks.changed().await.is_ok() {
        let Some(mark) = *acks.borrow_and_update() else { continue };
        if let Err(e) = store.peer_acked(peer.clone(), mark).await {
            return e.to_string();
        }
    }
    // The session dropped its side; the task is aborted with it before this is seen.
    std::future::pending().await
}

/// A task aborted when its handle is dropped (a session's helper ends with the session).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One send session on a connection `dial` made.
async fn session_on<S: ReplicaStore>(
    conn: &quinn::Connection,
    cfg: &GatewayConfig,
    peer: &PeerConfig,
    store: &S,
    stats: &GatewayStats,
    wire: &mut WireVersion,
) -> Result<SessionEnd, String> {
    let v = wire.version;
    let conn = conn.clone();
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    let clock = tokio::time::Instant::now();
    let peer_dc = peer.dc.clone();
    let tuning = cfg.stream.clone();
    let (mut sender, hello) = store
        .with_log(Box::new(move |log: &dyn EventLog| Sender::new(log, &peer_dc, tuning, 0)))
        .await
        .map_err(|e| e.to_string())?;
    sender.offer_reader(wire.cache.take_fresh());
    write_frame(&mut send, &hello, v).await.map_err(|e| e.message)?;
    // Until the peer's first frame: a peer that cannot read our version may just close.
    wire.silent = true;
    stats.with_peer(&peer.dc, |p| {
        p.out_connected = true;
        p.out_connects += 1;
    });
    info!(peer = %peer.dc, "replication stream to peer open");
    let mut progress = store.own_progress();
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.stream.ping_interval_ms.clamp(10, 1000)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_snapshot_log: Option<tokio::time::Instant> = None;
    let (acks, recorded) = watch::channel(None);
    let mut recorder = AbortOnDrop(tokio::spawn(record_acks(store.clone(), peer.dc.clone(), recorded)));
    loop {
        // Send everything the window allows.
        let now = now_ms(clock);
        let (s, out) = store
            .with_log(Box::new(move |log: &dyn EventLog| {
                let out = drain(|| sender.poll_transmit(log, now));
                (sender, out)
            }))
            .await
            .map_err(|e| e.to_string())?;
        sender = s;
        let (mut frames, mut events, mut err) = out;
        // Snapshot chunks are read from their cut here, off the log's thread.
        if err.is_none() && sender.wants_snapshot_read() {
            let (s, (f, ev, e)) = tokio::task::spawn_blocking(move || {
                let out = drain(|| sender.poll_snapshot());
                (sender, out)
            })
            .await
            .map_err(|e| format!("snapshot reader: {e}"))?;
            sender = s;
            frames.extend(f);
            events.extend(ev);
            err = e;
        }
        wire.cache.keep(sender.reader());
        for f in &frames {
            write_frame(&mut send, f, v).await.map_err(|e| e.message)?;
            stats.frames_sent.fetch_add(1, Ordering::Relaxed);
        }
        let inflight = sender.inflight_batches() as u64;
        stats.with_peer(&peer.dc, |p| {
            if inflight == 0 {
                p.out_oldest_unacked_wall_ms = 0;
            } else if p.out_inflight_batches == 0 || p.out_oldest_unacked_wall_ms == 0 {
                p.out_oldest_unacked_wall_ms = wall_ms();
            }
            p.out_inflight_batches = inflight;
        });
        for ev in events {
            match ev {
                SenderEvent::SnapshotSent(m) => {
                    info!(peer = %peer.dc, epoch = m.epoch, seq = m.seq, "sent the last of a snapshot to peer");
                    stats.with_peer(&peer.dc, |p| {
                        p.snapshots_sent += 1;
                        p.out_snapshot_id = 0;
                        p.out_snapshot_next_chunk = 0;
                    });
                }
                SenderEvent::ChunkSent { snapshot_id, index, bytes, last, resumed } => {
                    let first = index == 0 || resumed;
                    if first
                        && last_snapshot_log
                            .is_none_or(|t| t.elapsed().as_millis() as u64 >= SNAPSHOT_LOG_EVERY_MS)
                    {
                        last_snapshot_log = Some(tokio::time::Instant::now());
                        info!(peer = %peer.dc, snapshot_id, from_chunk = index, resumed, "sending a snapshot to peer in chunks");
                    }
                    stats.with_peer(&peer.dc, |p| {
                        p.snapshot_chunks_sent += 1;
                        p.snapshot_bytes_sent += bytes;
                        p.snapshots_resumed += u64::from(resumed);
                        if !last {
                            p.out_snapshot_id = snapshot_id;
                            p.out_snapshot_next_chunk = index + 1;
                        }
                    });
                }
                SenderEvent::LogUnreadable { after_seq, error } => {
                    tracing::error!(peer = %peer.dc, after_seq, %error,
                        "own log entries unreadable; sent a snapshot in their place");
                    stats.with_peer(&peer.dc, |p| p.log_unreadable += 1);
                }
                // Acks and epoch verdicts come from the peer's frames, not from sending.
                SenderEvent::PeerAcked(_)
                | SenderEvent::ChunkAcked { .. }
                | SenderEvent::NewEpoch { .. }
                | SenderEvent::Fenced { .. } => {}
            }
        }
        if let Some(e) = err {
            let _ = write_frame(&mut send, &e.to_frame(), v).await;
            close_refused(&conn, &mut send, &e).await;
            return Err(e.message);
        }
        tokio::select! {
            f = read_frame(&mut recv, false, stats) => {
                let f = f.map_err(|e| e.message)?;
                let Some((f, answered_in)) = f else { return Err("peer closed the stream".into()) };
                wire.silent = false;
                if answered_in < v {
                    // A receiver answers in the version of the Hello; an older one means
                    // the peer does not read ours. Speak its version from now on.
                    wire.version = answered_in;
                    warn!(peer = %peer.dc, version = answered_in, "peer answers in an older schema version; writing that version to it");
                    return Err(format!("peer speaks schema version {answered_in}; reconnecting in it"));
                }
                stats.frames_received.fetch_add(1, Ordering::Relaxed);
                let res = match (f, store.own_epoch()) {
                    (Frame::Ack { batch_id, mark }, Some(epoch)) => sender.handle_ack(batch_id, mark, epoch),
                    (f, _) => {
                        let (s, res) = store
                            .with_log(Box::new(move |log: &dyn EventLog| {
                                let r = sender.handle_frame(log, f);
                                (sender, r)
                            }))
                            .await
                            .map_err(|e| e.to_string())?;
                        sender = s;
                        res
                    }
                };
                match res {
                    Ok(evs) => {
                        for ev in evs {
                            match ev {
                                SenderEvent::PeerAcked(m) => {
                                    let left = sender.inflight_batches() as u64;
                                    stats.with_peer(&peer.dc, |p| {
                                        p.out_acked_seq = m.seq;
                                        p.out_last_ack_wall_ms = wall_ms();
                                        p.out_inflight_batches = left;
                                        // The oldest unacked batch is now a younger one.
                                        p.out_oldest_unacked_wall_ms = if left == 0 { 0 } else { wall_ms() };
                                    });
                                    // Recorded off this loop (the latest ack wins), so the
                                    // next batch does not wait for the record.
                                    acks.send_replace(Some(m));
                                }
                                SenderEvent::ChunkAcked { .. } => {
                                    stats.with_peer(&peer.dc, |p| p.snapshot_chunks_acked += 1);
                                }
                                SenderEvent::SnapshotSent(_)
                                | SenderEvent::ChunkSent { .. }
                                | SenderEvent::LogUnreadable { .. } => {}
                                SenderEvent::NewEpoch { above, reason } => {
                                    let tiebreak = rand::thread_rng().gen::<u64>();
                                    let own = store.begin_epoch(above, tiebreak).await.map_err(|e| e.to_string())?;
                                    stats.new_epochs.fetch_add(1, Ordering::Relaxed);
                                    warn!(peer = %peer.dc, epoch = own.epoch, seq = own.seq, %reason, "replication: took a new epoch");
                                    let _ = send.finish();
                                    return Ok(SessionEnd::NewEpoch);
                                }
                                SenderEvent::Fenced { reason } => {
                                    let first = {
                                        let mut f = stats.fenced.lock();
                                        let first = f.is_none();
                                        f.get_or_insert_with(|| reason.clone());
                                        first
                                    };
                                    if first {
                                        tracing::error!(peer = %peer.dc, %reason, "replication: this process is fenced and stops shipping to every peer; restart it on the current data dir of its DC");
                                    }
                                    let _ = send.finish();
                                    return Ok(SessionEnd::Fenced);
                                }
                            }
                        }
                        wire.cache.keep(sender.reader());
                    }
                    Err(e) => {
                        stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
                        if sender.reader().is_some() {
                            info!(peer = %peer.dc, error = %e, "peer refused the snapshot being sent; the stream restarts");
                        }
                        let _ = write_frame(&mut send, &e.to_frame(), v).await;
                        return Err(e.message);
                    }
                }
            }
            _ = progress.changed() => {}
            _ = tick.tick() => {}
            r = conn.closed() => return Err(format!("connection closed: {r}")),
            e = &mut recorder.0 => {
                return Err(format!("recording the peer's ack: {}", e.unwrap_or_else(|e| e.to_string())));
            }
        }
    }
}
