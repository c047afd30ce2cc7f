//! [`MemberLink`]: the endpoint, the accept loop that serves other members' requests, and
//! calls to them over one cached connection per member.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::{watch, Mutex};
use tracing::{debug, info, warn};

use super::{
    CallError, Handler, MemberConfig, MemberStats, ALPN, CONNECTION_WINDOW_BYTES, DIAL_TIMEOUT,
    FRAME_BYTES_MAX, STREAMS_MAX, STREAM_WINDOW_BYTES,
};
use crate::gateway::{Admission, Screened, TransportTuning};
use crate::sampled::LogSampler;
use crate::tls::{self, NameRule, NodeName, ReloadableTls, TlsError, TlsMaterial};

/// Close code: the peer is not a configured member of this DC's group.
const CLOSE_NOT_A_MEMBER: u32 = 1;
/// Stream reset code: the caller gave the call up (its timeout, or it dropped the call)
/// before an answer came.
const RESET_GIVEN_UP: u32 = 2;

/// A call's request stream, reset when the call ends without an answer: QUIC would
/// otherwise keep retransmitting the finished request, and a request given up while the
/// link was cut (a forwarded write the client was told failed) would be served once it
/// healed, seconds later. A request the callee already received is served either way:
/// only that window stays in doubt.
struct ResetUnlessAnswered(Option<quinn::SendStream>);

impl Drop for ResetUnlessAnswered {
    fn drop(&mut self) {
        if let Some(mut s) = self.0.take() {
            let _ = s.reset(RESET_GIVEN_UP.into());
        }
    }
}

/// Stream reset code: the request or answer is over [`FRAME_BYTES_MAX`].
const RESET_TOO_LARGE: u32 = 1;

/// Why a member link could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot bind the member listener on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

/// One member's slot: its address and the connection to it, dialed on first use.
struct Slot {
    addr: SocketAddr,
    name: NodeName,
    conn: Mutex<Option<quinn::Connection>>,
}

struct Inner {
    /// Taken at shutdown, so the socket is released even while clones of the link live.
    endpoint: RwLock<Option<quinn::Endpoint>>,
    tls: Arc<ReloadableTls>,
    me: NodeName,
    slots: RwLock<BTreeMap<u64, Arc<Slot>>>,
    /// Follows the members' addresses ([`MemberLink::set_members`]).
    admission: RwLock<Admission>,
    stats: Arc<MemberStats>,
}

/// One node's end of the member link: it serves the other members' requests with a
/// [`Handler`] and calls them ([`MemberLink::call`]). Cheap to clone.
#[derive(Clone)]
pub struct MemberLink {
    inner: Arc<Inner>,
    shutdown: Arc<watch::Sender<bool>>,
    accept: Arc<parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

fn transport(tuning: &TransportTuning) -> Result<quinn::TransportConfig, TlsError> {
    let mut config = tuning.transport_config()?;
    config
        .max_concurrent_bidi_streams(STREAMS_MAX.into())
        .stream_receive_window(STREAM_WINDOW_BYTES.into())
        .receive_window(CONNECTION_WINDOW_BYTES.into())
        .send_window(u64::from(CONNECTION_WINDOW_BYTES));
    Ok(config)
}

/// The member link's server config: a node's material, the member ALPN.
pub fn server_config(m: &TlsMaterial, tuning: &TransportTuning) -> Result<quinn::ServerConfig, TlsError> {
    m.require_node()?;
    tls::server_config_with(m, ALPN, transport(tuning)?)
}

/// The member link's client config: a node's material, the member ALPN, and a server that
/// must name exactly the node dialed.
pub fn client_config(m: &TlsMaterial, tuning: &TransportTuning) -> Result<quinn::ClientConfig, TlsError> {
    m.require_node()?;
    tls::client_config_with(m, ALPN, transport(tuning)?, NameRule::Node)
}

impl MemberLink {
    /// Binds the listener and serves the members' requests with `handler`. `tls` must hold
    /// a node's certificate; that node is this link's identity.
    pub fn start<H: Handler>(
        cfg: MemberConfig,
        tls: Arc<ReloadableTls>,
        handler: H,
    ) -> Result<MemberLink, StartError> {
        let material = tls.current();
        let me = material.require_node()?.clone();
        let server_cfg = server_config(&material, tls.tuning())?;
        let socket = std::net::UdpSocket::bind(cfg.listen)
            .map_err(|source| StartError::Bind { addr: cfg.listen, source })?;
        let reset_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &cfg.reset_secret);
        let runtime = quinn::default_runtime().ok_or_else(|| StartError::Bind {
            addr: cfg.listen,
            source: std::io::Error::other("no async runtime for quinn"),
        })?;
        let endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::new(Arc::new(reset_key)),
            Some(server_cfg),
            socket,
            runtime,
        )
        .map_err(|source| StartError::Bind { addr: cfg.listen, source })?;
        let accept_endpoint = endpoint.clone();
        let inner = Arc::new(Inner {
            endpoint: RwLock::new(Some(endpoint)),
            tls,
            me,
            slots: RwLock::new(BTreeMap::new()),
            admission: RwLock::new(cfg.admission),
            stats: Arc::new(MemberStats::default()),
        });
        let (shutdown, shut_rx) = watch::channel(false);
        let link = MemberLink {
            inner,
            shutdown: Arc::new(shutdown),
            accept: Arc::new(parking_lot::Mutex::new(None)),
        };
        link.set_members(&cfg.members);
        let accept =
            tokio::spawn(accept_loop(accept_endpoint, link.inner.clone(), Arc::new(handler), shut_rx));
        *link.accept.lock() = Some(accept);
        Ok(link)
    }

    /// This node.
    pub fn me(&self) -> &NodeName {
        &self.inner.me
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint().ok_or_else(|| std::io::Error::other("the member link was shut down"))?.local_addr()
    }

    fn endpoint(&self) -> Option<quinn::Endpoint> {
        self.inner.endpoint.read().clone()
    }

    /// The link's counters.
    pub fn stats(&self) -> Arc<MemberStats> {
        self.inner.stats.clone()
    }

    /// Replaces the members (a membership change): a member whose address is unchanged
    /// keeps its connection; a removed member's connection is closed, and its address is
    /// no longer admitted by `"peers"`.
    pub fn set_members(&self, members: &[(u64, SocketAddr)]) {
        let mut slots = self.inner.slots.write();
        {
            let mut admission = self.inner.admission.write();
            *admission = admission.with_peers(members.iter().map(|(_, a)| *a));
        }
        let mut next = BTreeMap::new();
        for (id, addr) in members {
            let kept = slots.remove(id).filter(|slot| slot.addr == *addr);
            let slot = kept.unwrap_or_else(|| {
                Arc::new(Slot {
                    addr: *addr,
                    name: NodeName { dc: self.inner.me.dc.clone(), id: *id },
                    conn: Mutex::new(None),
                })
            });
            next.insert(*id, slot);
        }
        for (_, gone) in std::mem::replace(&mut *slots, next) {
            if let Ok(conn) = gone.conn.try_lock() {
                if let Some(conn) = conn.as_ref() {
                    conn.close(CLOSE_NOT_A_MEMBER.into(), b"no longer a member");
                }
            }
        }
    }

    /// Whether `id` is a configured member.
    pub fn is_member(&self, id: u64) -> bool {
        self.inner.slots.read().contains_key(&id)
    }

    /// The members and their addresses.
    pub fn members(&self) -> Vec<(u64, SocketAddr)> {
        self.inner.slots.read().iter().map(|(id, slot)| (*id, slot.addr)).collect()
    }

    /// Sends `request` to member `to` and returns its answer, all within `timeout` (the
    /// dial included, at most [`DIAL_TIMEOUT`] of it).
    pub async fn call(&self, to: u64, request: &[u8], timeout: Duration) -> Result<Vec<u8>, CallError> {
        let stats = &self.inner.stats;
        stats.calls.fetch_add(1, Ordering::Relaxed);
        let res = self.call_inner(to, request, timeout).await;
        if res.is_err() {
            stats.calls_failed.fetch_add(1, Ordering::Relaxed);
        }
        res
    }

    async fn call_inner(&self, to: u64, request: &[u8], timeout: Duration) -> Result<Vec<u8>, CallError> {
        if request.len() > FRAME_BYTES_MAX {
            return Err(CallError::TooLarge { bytes: request.len(), max: FRAME_BYTES_MAX });
        }
        let slot = self.inner.slots.read().get(&to).cloned().ok_or(CallError::UnknownMember { node: to })?;
        let deadline = tokio::time::Instant::now() + timeout;
        let conn = self.connection(&slot, deadline).await?;
        let failed = |reason: String| CallError::Failed { node: to, reason };
        let exchange = async {
            let (send, mut recv) = conn.open_bi().await.map_err(|e| failed(e.to_string()))?;
            let mut send = ResetUnlessAnswered(Some(send));
            let stream = send.0.as_mut().expect("set above");
            stream.write_all(request).await.map_err(|e| failed(e.to_string()))?;
            stream.finish().map_err(|e| failed(e.to_string()))?;
            match recv.read_to_end(FRAME_BYTES_MAX).await {
                Ok(answer) => {
                    send.0 = None;
                    Ok(answer)
                }
                Err(quinn::ReadToEndError::TooLong) => {
                    self.inner.stats.frames_refused.fetch_add(1, Ordering::Relaxed);
                    let _ = recv.stop(RESET_TOO_LARGE.into());
                    Err(failed(format!(
                        "the answer is over the member link's limit of {FRAME_BYTES_MAX} bytes"
                    )))
                }
                Err(e) => Err(failed(e.to_string())),
            }
        };
        match tokio::time::timeout_at(deadline, exchange).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => {
                self.forget_if_closed(&slot, &conn).await;
                Err(e)
            }
            Err(_) => Err(CallError::Timeout { node: to, timeout }),
        }
    }

    /// The live connection to `slot`'s member, dialed if there is none. Callers of the same
    /// member wait for one dial.
    async fn connection(
        &self,
        slot: &Slot,
        deadline: tokio::time::Instant,
    ) -> Result<quinn::Connection, CallError> {
        let timeout_error = || CallError::Timeout {
            node: slot.name.id,
            timeout: deadline.saturating_duration_since(tokio::time::Instant::now()),
        };
        let mut held =
            tokio::time::timeout_at(deadline, slot.conn.lock()).await.map_err(|_| timeout_error())?;
        if let Some(conn) = held.as_ref().filter(|c| c.close_reason().is_none()) {
            return Ok(conn.clone());
        }
        *held = None;
        let unreachable =
            |reason: String| CallError::Unreachable { node: slot.name.id, addr: slot.addr, reason };
        let material = self.inner.tls.current();
        let client_cfg =
            client_config(&material, self.inner.tls.tuning()).map_err(|e| unreachable(e.to_string()))?;
        let endpoint = self.endpoint().ok_or_else(|| unreachable("the member link was shut down".into()))?;
        self.inner.stats.dials.fetch_add(1, Ordering::Relaxed);
        let connecting = endpoint
            .connect_with(client_cfg, slot.addr, &slot.name.dns_name())
            .map_err(|e| unreachable(e.to_string()))?;
        let dial_deadline = deadline.min(tokio::time::Instant::now() + DIAL_TIMEOUT);
        let conn = match tokio::time::timeout_at(dial_deadline, connecting).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(unreachable(e.to_string())),
            Err(_) => return Err(unreachable(format!("no handshake within {DIAL_TIMEOUT:?}"))),
        };
        *held = Some(conn.clone());
        Ok(conn)
    }

    async fn forget_if_closed(&self, slot: &Slot, conn: &quinn::Connection) {
        if conn.close_reason().is_some() {
            let mut held = slot.conn.lock().await;
            if held.as_ref().is_some_and(|c| c.stable_id() == conn.stable_id()) {
                *held = None;
            }
        }
    }

    /// Re-reads the node's certificate files: new connections use the new material. On
    /// error the old material stays.
    pub fn reload_tls(&self) -> Result<(), TlsError> {
        let material = self.inner.tls.reload()?;
        if let Some(endpoint) = self.endpoint() {
            endpoint.set_server_config(Some(server_config(&material, self.inner.tls.tuning())?));
        }
        info!("member link certificates reloaded");
        Ok(())
    }

    /// Stops serving, closes every connection and the endpoint, and returns once the UDP
    /// port is free again (bounded: a few seconds), so a restarted node can bind it. Calls
    /// after it fail; clones of the link may outlive it.
    pub async fn shutdown(&self) {
        let _ = self.shutdown.send(true);
        let Some(endpoint) = self.inner.endpoint.write().take() else { return };
        let addr = endpoint.local_addr().ok();
        endpoint.close(0u32.into(), b"shutdown");
        let accept = self.accept.lock().take();
        if let Some(task) = accept {
            task.abort();
            let _ = task.await;
        }
        self.inner.slots.write().clear();
        // The close frames go out at once; a peer that misses them learns by a stateless reset
        // or its idle timeout, and redials.
        let _ = tokio::time::timeout(Duration::from_millis(300), endpoint.wait_idle()).await;
        drop(endpoint);
        if let Some(addr) = addr {
            for _ in 0..150 {
                if std::net::UdpSocket::bind(addr).is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            warn!(%addr, "member link socket still bound after shutdown (another handle holds it)");
        }
    }
}

/// Refusals are logged one line per period per kind.
#[derive(Default)]
struct Samplers {
    admission: LogSampler,
    identity: LogSampler,
}

async fn accept_loop<H: Handler>(
    endpoint: quinn::Endpoint,
    inner: Arc<Inner>,
    handler: Arc<H>,
    mut shut: watch::Receiver<bool>,
) {
    // Connection tasks live in this set: they end with the loop.
    let mut conns = tokio::task::JoinSet::new();
    let samplers = Arc::new(Samplers::default());
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => i,
            _ = shut.changed() => return,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let Some(incoming) = incoming else { return };
        let stats = &inner.stats;
        let source = incoming.remote_address();
        let screened =
            inner.admission.read().screen(incoming, stats.handshakes_in_flight.load(Ordering::Relaxed));
        let incoming = match screened {
            Screened::Admitted(incoming) => incoming,
            Screened::Retried => continue,
            Screened::Dropped | Screened::Busy => {
                stats.refused_admission.fetch_add(1, Ordering::Relaxed);
                if let Some(held_back) = samplers.admission.admit() {
                    warn!(%source, held_back, "refused a member handshake: source not admitted or too many handshakes (sampled)");
                }
                continue;
            }
        };
        stats.handshakes_in_flight.fetch_add(1, Ordering::Relaxed);
        let inner = inner.clone();
        let handler = handler.clone();
        let samplers = samplers.clone();
        conns.spawn(async move {
            let handshake = incoming.await;
            inner.stats.handshakes_in_flight.fetch_sub(1, Ordering::Relaxed);
            let refuse = |what: String| {
                inner.stats.refused_connections.fetch_add(1, Ordering::Relaxed);
                if let Some(held_back) = samplers.identity.admit() {
                    warn!(%source, held_back, "refused a member connection: {what} (sampled)");
                }
            };
            let conn = match handshake {
                Ok(conn) => conn,
                Err(e) => return refuse(format!("TLS handshake failed: {e}")),
            };
            let from = match tls::peer_node(&conn) {
                Ok(node) if node.dc == inner.me.dc && inner.slots.read().contains_key(&node.id) => node.id,
                Ok(node) => {
                    refuse(format!("{node} is not a configured member of {}", inner.me.dc));
                    conn.close(CLOSE_NOT_A_MEMBER.into(), b"not a configured member");
                    return;
                }
                Err(e) => {
                    refuse(e.to_string());
                    conn.close(CLOSE_NOT_A_MEMBER.into(), b"no node identity");
                    return;
                }
            };
            serve(conn, from, inner, handler).await;
        });
    }
}

/// Answers one member's requests, one task per stream (quinn's stream credit bounds them
/// at [`STREAMS_MAX`]).
async fn serve<H: Handler>(conn: quinn::Connection, from: u64, inner: Arc<Inner>, handler: Arc<H>) {
    let mut streams = tokio::task::JoinSet::new();
    loop {
        let (mut send, mut recv) = tokio::select! {
            s = conn.accept_bi() => match s {
                Ok(s) => s,
                Err(e) => {
                    debug!(from, error = %e, "member connection ended");
                    return;
                }
            },
            Some(_) = streams.join_next(), if !streams.is_empty() => continue,
        };
        // Removed from the members since it connected (a membership change): no more.
        if !inner.slots.read().contains_key(&from) {
            inner.stats.refused_connections.fetch_add(1, Ordering::Relaxed);
            conn.close(CLOSE_NOT_A_MEMBER.into(), b"no longer a member");
            return;
        }
        let inner = inner.clone();
        let handler = handler.clone();
        streams.spawn(async move {
            let request = match recv.read_to_end(FRAME_BYTES_MAX).await {
                Ok(request) => request,
                Err(quinn::ReadToEndError::TooLong) => {
                    inner.stats.frames_refused.fetch_add(1, Ordering::Relaxed);
                    let _ = recv.stop(RESET_TOO_LARGE.into());
                    let _ = send.reset(RESET_TOO_LARGE.into());
                    return;
                }
                Err(_) => return,
            };
            let answer = handler.handle(from, request).await;
            if answer.len() > FRAME_BYTES_MAX {
                inner.stats.frames_refused.fetch_add(1, Ordering::Relaxed);
                let _ = send.reset(RESET_TOO_LARGE.into());
                return;
            }
            inner.stats.served.fetch_add(1, Ordering::Relaxed);
            if send.write_all(&answer).await.is_ok() {
                let _ = send.finish();
            }
        });
    }
}
