//! The HTTP listener (in place of `axum::serve`, which has no limits): accepts client
//! connections within a node-wide cap, a per-address cap and the descriptor budget (the
//! open-files limit less what RocksDB and the node keep), serves each with hyper's
//! HTTP/1.1 and HTTP/2 limits (header read timeout, header size, HTTP/2 streams and
//! keep-alive pings), and closes a connection that has had no request in flight for
//! `idle_timeout_ms`. A refused connection gets a canned 503 if its socket takes it at once,
//! and is closed; every refusal and close is counted ([`HttpState`]) and logged sampled.
//! With `[http.tls]`, an admitted connection first completes its TLS handshake within
//! `handshake_timeout_ms` (holding its slot only that long; see `tls`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use super::limits::{ClientAddr, HttpState};
use super::tls::{ClientCert, HttpsTls};
use crate::config::Config;

/// Descriptors kept for the node besides RocksDB's table files and client connections:
/// RocksDB's WAL, manifest and info log, the replication socket, the runtime, stdio,
/// the listener, files opened on reload.
pub const DESCRIPTORS_RESERVED: u64 = 128;
/// Most bytes the future of a plain connection's task may take (a test holds it to this).
#[cfg(test)]
const PLAIN_TASK_BYTES_MAX: usize = 4096;
/// A connection asked to close (idle, or the node stopping) gets this long to finish.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// The smallest connection cap the descriptor budget may leave; below it the node
/// refuses to start (raise `LimitNOFILE` or lower `[store] max_open_files`).
const CONNECTIONS_MIN: u64 = 16;

/// The listener's limits, fixed at start.
#[derive(Clone, Debug)]
pub struct ListenerLimits {
    /// `connections_max` lowered to the descriptor budget.
    pub connections: u64,
    pub per_address: u64,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub header_bytes_max: usize,
    pub h2_streams_max: u32,
    pub h2_keepalive_interval: Duration,
    pub h2_keepalive_timeout: Duration,
}

impl ListenerLimits {
    /// The limits of `cfg` under an open-files limit of `open_files` (None: unlimited).
    pub fn new(cfg: &Config, open_files: Option<u64>) -> anyhow::Result<ListenerLimits> {
        let h = &cfg.http;
        let connections = match open_files {
            None => h.connections_max,
            Some(n) => {
                let kept = u64::from(cfg.store.max_open_files) + DESCRIPTORS_RESERVED;
                let budget = n.saturating_sub(kept);
                if budget < CONNECTIONS_MIN {
                    anyhow::bail!(
                        "the open-files limit ({n}) leaves {budget} descriptors for client connections \
                         after {kept} kept for RocksDB ([store] max_open_files) and the node; raise it \
                         (LimitNOFILE, ulimit -n) or lower [store] max_open_files"
                    );
                }
                h.connections_max.min(budget)
            }
        };
        Ok(ListenerLimits {
            connections,
            per_address: h.connections_per_address_max.min(connections),
            header_read_timeout: Duration::from_millis(h.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(h.idle_timeout_ms),
            header_bytes_max: h.header_bytes_max,
            h2_streams_max: h.h2_streams_max,
            h2_keepalive_interval: Duration::from_millis(h.h2_keepalive_interval_ms),
            h2_keepalive_timeout: Duration::from_millis(h.h2_keepalive_timeout_ms),
        })
    }

    fn builder(&self) -> Builder<TokioExecutor> {
        let mut b = Builder::new(TokioExecutor::new());
        b.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            .max_buf_size(self.header_bytes_max.max(8192));
        b.http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(self.h2_streams_max)
            .max_header_list_size(u32::try_from(self.header_bytes_max).unwrap_or(u32::MAX))
            .keep_alive_interval(Some(self.h2_keepalive_interval))
            .keep_alive_timeout(self.h2_keepalive_timeout);
        b
    }
}

/// The soft open-files limit of this process (`RLIMIT_NOFILE`), None when unlimited.
#[allow(unsafe_code, clippy::unnecessary_cast)] // rlim_t is u64 on Linux, not everywhere
pub fn open_files_limit() -> Option<u64> {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct it is given, which lives on this stack.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) };
    (rc == 0 && rl.rlim_cur != libc::RLIM_INFINITY).then_some(rl.rlim_cur as u64)
}

/// Open connections, in total and by client address.
struct Conns {
    state: Arc<HttpState>,
    by_address: Mutex<HashMap<IpAddr, u64>>,
    limits: ListenerLimits,
}

#[derive(Clone, Copy)]
enum Refusal {
    Total,
    PerAddress,
}

/// One admitted connection; dropping it frees its place.
struct Slot {
    conns: Arc<Conns>,
    ip: IpAddr,
}

impl Conns {
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Refusal> {
        let open = &self.state.connections_open;
        let cap = self.limits.connections;
        if open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < cap).then_some(n + 1)).is_err() {
            return Err(Refusal::Total);
        }
        let mut by = self.by_address.lock();
        let n = by.entry(ip).or_insert(0);
        if *n >= self.limits.per_address {
            drop(by);
            open.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::PerAddress);
        }
        *n += 1;
        crate::heap::connection_opened();
        Ok(Slot { conns: self.clone(), ip })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut by = self.conns.by_address.lock();
        if let Some(n) = by.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                by.remove(&self.ip);
            }
        }
        drop(by);
        self.conns.state.connections_open.fetch_sub(1, Ordering::AcqRel);
        crate::heap::connection_closed();
    }
}

/// What the listener serves: a tower service of axum's requests and answers (the node's
/// [`App`](super::stack::App), or an axum `Router`).
pub trait App:
    tower_service::Service<
        axum::extract::Request,
        Response = axum::response::Response,
        Error = Infallible,
        Future: Send,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> App for S where
    S: tower_service::Service<
            axum::extract::Request,
            Response = axum::response::Response,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// Serves `app` on `listener` until `shut` turns true (or its sender goes away).
pub async fn serve<A: App>(
    listener: TcpListener,
    app: A,
    state: Arc<HttpState>,
    limits: ListenerLimits,
    tls: Option<Arc<HttpsTls>>,
    mut shut: watch::Receiver<bool>,
) {
    state.connections_limit.store(limits.connections, Ordering::Relaxed);
    let builder = limits.builder();
    let conns = Arc::new(Conns { state: state.clone(), by_address: Mutex::default(), limits });
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shut.wait_for(|c| *c) => return,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                accept_failed(&state, e).await;
                continue;
            }
        };
        match conns.admit(peer.ip()) {
            Ok(slot) => {
                let served = (builder.clone(), stream, app.clone(), state.clone(), shut.clone(), slot);
                spawn_connection(tls.clone(), served, conns.limits.idle_timeout);
            }
            Err(why) => refuse(&state, &conns.limits, stream, peer, why),
        }
    }
}

/// Spawns the task that serves one admitted connection, and says how many bytes its
/// future takes. Plain and TLS connections get tasks of their own types: one future for
/// both would make every plain connection's task as large as a TLS one's, which holds its
/// TLS session inline.
fn spawn_connection<A: App>(
    tls: Option<Arc<HttpsTls>>,
    (builder, stream, app, state, shut, slot): (
        Builder<TokioExecutor>,
        TcpStream,
        A,
        Arc<HttpState>,
        watch::Receiver<bool>,
        Slot,
    ),
    idle: Duration,
) -> usize {
    match tls {
        None => {
            let task = run_connection(builder, stream, app, state, idle, shut, slot);
            let bytes = std::mem::size_of_val(&task);
            tokio::spawn(task);
            bytes
        }
        Some(tls) => {
            let task =
                async move { run_tls_connection(builder, stream, app, state, idle, shut, slot, &tls).await };
            let bytes = std::mem::size_of_val(&task);
            tokio::spawn(task);
            bytes
        }
    }
}

async fn accept_failed(state: &HttpState, e: std::io::Error) {
    use std::io::ErrorKind::*;
    if matches!(e.kind(), ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted) {
        return;
    }
    let out_of_descriptors = matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE));
    if out_of_descriptors {
        HttpState::bump(&state.refused_descriptors);
    }
    if let Some(held_back) = state.log_accept.admit() {
        tracing::warn!(error = %e, held_back, "HTTP accept failed (sampled: one line per 10 s)");
    }
    // The pending connection stays queued; let descriptors free up before trying again.
    tokio::time::sleep(Duration::from_millis(50)).await;
}

fn refuse(state: &HttpState, limits: &ListenerLimits, stream: TcpStream, peer: SocketAddr, why: Refusal) {
    let (counter, key, cap) = match why {
        Refusal::Total => (&state.refused_total_cap, "connections_max", limits.connections),
        Refusal::PerAddress => {
            (&state.refused_per_address, "connections_per_address_max", limits.per_address)
        }
    };
    HttpState::bump(counter);
    if let Some(held_back) = state.log_accept.admit() {
        tracing::warn!(peer = %peer, limit = key, cap, held_back, "HTTP connection refused (sampled: one line per 10 s)");
    }
    let body = format!(
        "{{\"error\":{{\"code\":\"too_many_connections\",\"message\":\"{cap} connections open ([http] {key})\"}}}}"
    );
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    // Best effort and never waiting: a socket that cannot take it at once is just closed.
    let _ = stream.try_write(answer.as_bytes());
}

/// Whether a connection has a request in flight, since when it has not, and how many
/// bytes it had read when it last went idle (to tell a half-sent head from an idle one).
struct Activity {
    in_flight: AtomicU64,
    idle: Mutex<(Instant, u64)>,
    read: Arc<AtomicU64>,
}

impl Activity {
    fn idle_since(&self) -> Option<Instant> {
        (self.in_flight.load(Ordering::Acquire) == 0).then(|| self.idle.lock().0)
    }
}

/// Marks a request in flight until its answer's body is done or dropped.
struct Busy(Arc<Activity>);

impl Busy {
    fn enter(a: &Arc<Activity>) -> Busy {
        a.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(a.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.idle.lock() = (Instant::now(), self.0.read.load(Ordering::Relaxed));
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer body that keeps its request counted as in flight while it is sent (a
/// streaming watch is in flight for its whole life).
struct Tracked {
    inner: Body,
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A TCP stream that counts the bytes read from it.
struct Counted {
    inner: TcpStream,
    read: Arc<AtomicU64>,
}

impl AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut me.inner).poll_read(cx, buf);
        me.read.fetch_add((buf.filled().len() - before) as u64, Ordering::Relaxed);
        r
    }
}

impl AsyncWrite for Counted {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Runs the TLS handshake (bounded, counted), then serves the connection like a plain one
/// with the client certificate's name (if any) in every request.
#[allow(clippy::too_many_arguments)]
async fn run_tls_connection<A: App>(
    builder: Builder<TokioExecutor>,
    stream: TcpStream,
    app: A,
    state: Arc<HttpState>,
    idle: Duration,
    mut shut: watch::Receiver<bool>,
    slot: Slot,
    tls: &HttpsTls,
) {
    let (acceptor, limit) = tls.acceptor();
    let read = Arc::new(AtomicU64::new(0));
    let counted = read.clone();
    let wrap = move |inner| Counted { inner, read: counted };
    let accepted = tokio::select! {
        r = super::tls::handshake(acceptor, limit, stream, wrap) => r,
        _ = shut.wait_for(|c| *c) => return,
    };
    let stream = match accepted {
        Ok(s) => s,
        Err(failure) => {
            super::tls::count_failure(&state, slot.ip, &failure);
            return;
        }
    };
    HttpState::bump(&state.tls_handshakes_ok);
    let cert = super::tls::peer_cert_name(&stream).map(ClientCert);
    serve_io(builder, stream, read, app, state, idle, shut, slot, cert).await;
}

async fn run_connection<A: App>(
    builder: Builder<TokioExecutor>,
    stream: TcpStream,
    app: A,
    state: Arc<HttpState>,
    idle: Duration,
    shut: watch::Receiver<bool>,
    slot: Slot,
) {
    let read = Arc::new(AtomicU64::new(0));
    let io = Counted { inner: stream, read: read.clone() };
    serve_io(builder, io, read, app, state, idle, shut, slot, None).await;
}

/// Serves one connection (plain, or TLS once handshaken) until it ends, idles out or the
/// node stops.
#[allow(clippy::too_many_arguments)]
async fn serve_io<IO, A: App>(
    builder: Builder<TokioExecutor>,
    io: IO,
    read: Arc<AtomicU64>,
    app: A,
    state: Arc<HttpState>,
    idle: Duration,
    mut shut: watch::Receiver<bool>,
    slot: Slot,
    cert: Option<ClientCert>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ip = slot.ip;
    let activity = Arc::new(Activity {
        in_flight: AtomicU64::new(0),
        idle: Mutex::new((Instant::now(), 0)),
        read: read.clone(),
    });
    let act = activity.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        let busy = Busy::enter(&act);
        req.extensions_mut().insert(ClientAddr(ip));
        if let Some(c) = &cert {
            req.extensions_mut().insert(c.clone());
        }
        let mut app = app.clone();
        async move {
            let answer = app.call(req.map(Body::new)).await;
            Ok::<_, Infallible>(match answer {
                Ok(resp) => resp.map(|b| Body::new(Tracked { inner: b, _busy: busy })),
                Err(never) => match never {},
            })
        }
    });
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut closing_by: Option<Instant> = None;
    loop {
        let idle_check = activity.idle_since().map_or_else(|| Instant::now() + idle, |t| t + idle);
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    classify_close(&state, &activity, &*e);
                }
                return;
            }
            _ = tokio::time::sleep_until(idle_check), if closing_by.is_none() => {
                if activity.idle_since().is_some_and(|t| t.elapsed() >= idle) {
                    HttpState::bump(&state.closed_idle);
                    conn.as_mut().graceful_shutdown();
                    closing_by = Some(Instant::now() + CLOSE_GRACE);
                }
            }
            _ = shut.wait_for(|c| *c), if closing_by.is_none() => {
                conn.as_mut().graceful_shutdown();
                closing_by = Some(Instant::now() + CLOSE_GRACE);
            }
            _ = tokio::time::sleep_until(closing_by.unwrap_or_else(Instant::now)), if closing_by.is_some() => return,
        }
    }
}

/// Counts why hyper ended a connection: a request head too slow (or, with nothing read
/// since the last answer, an idle HTTP/1.1 keep-alive connection) or too large.
fn classify_close(state: &HttpState, activity: &Activity, e: &(dyn std::error::Error + 'static)) {
    let Some(e) = e.downcast_ref::<hyper::Error>() else { return };
    if e.is_timeout() {
        let read_at_idle = activity.idle.lock().1;
        if activity.read.load(Ordering::Relaxed) > read_at_idle {
            HttpState::bump(&state.closed_header_timeout);
        } else {
            HttpState::bump(&state.closed_idle);
        }
    } else if e.is_parse_too_large() {
        HttpState::bump(&state.closed_header_too_large);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a plain connection's task holds while it idles: hyper's connection and this
    /// listener's state, not a TLS session's (a node with 10,000 client connections holds
    /// 10,000 of these; docs/benchmarks.md, scale): 3,080 bytes, where one future serving
    /// both kinds of connection took 8,608.
    #[tokio::test]
    async fn a_plain_connection_task_is_small() {
        let c = Config::single("dc-a", "/tmp/x".into(), "127.0.0.1:0".parse().unwrap());
        let limits = ListenerLimits::new(&c, None).unwrap();
        let state = Arc::new(HttpState::default());
        let conns =
            Arc::new(Conns { state: state.clone(), by_address: Mutex::default(), limits: limits.clone() });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (stream, peer) = listener.accept().await.unwrap();
        let slot = conns.admit(peer.ip()).unwrap_or_else(|_| panic!("admitted"));
        let (_tx, shut) = watch::channel(false);
        let served = (limits.builder(), stream, axum::Router::new(), state, shut, slot);
        let bytes = spawn_connection(None, served, limits.idle_timeout);
        assert!(bytes <= PLAIN_TASK_BYTES_MAX, "a plain connection's future takes {bytes} bytes");
    }

    #[test]
    fn the_descriptor_budget_lowers_the_connection_cap() {
        let mut c = Config::single("dc-a", "/tmp/x".into(), "127.0.0.1:0".parse().unwrap());
        c.store.max_open_files = 256;
        c.http.connections_max = 10_000;
        assert_eq!(ListenerLimits::new(&c, None).unwrap().connections, 10_000);
        assert_eq!(
            ListenerLimits::new(&c, Some(1024)).unwrap().connections,
            1024 - 256 - DESCRIPTORS_RESERVED
        );
        let e = ListenerLimits::new(&c, Some(300)).unwrap_err().to_string();
        assert!(e.contains("max_open_files"), "{e}");
        c.http.connections_per_address_max = 5_000;
        assert_eq!(ListenerLimits::new(&c, Some(1024)).unwrap().per_address, 640);
    }
}
