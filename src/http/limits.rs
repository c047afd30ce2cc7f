//! What the HTTP API refuses, per request, before a handler runs: requests for a Host this
//! node does not serve (DNS rebinding), admin calls without a JSON content type or the
//! `X-Tandem-Admin` header (cross-site bodyless POSTs) or beyond the admin rate, and
//! requests that outlive their time budget. Also [`HttpState`], the listener's and these
//! checks' counters (shown in `/metrics`), [`Slots`], the caps on streaming watches and
//! blocking queries (in total and per client address), and [`LogSampler`], which keeps a
//! flood of refusals from flooding the log.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;

use crate::config::Config;
use crate::error::ApiError;
use crate::shared::NodeShared;

/// The header that marks a deliberate admin call (a browser cannot send it cross-site
/// without a CORS preflight, which this node never grants).
pub const ADMIN_HEADER: &str = "x-tandem-admin";

/// Counters of the HTTP side's limits (all monotonic except the two gauges).
#[derive(Debug, Default)]
pub struct HttpState {
    /// Gauge: client connections open now.
    pub connections_open: AtomicU64,
    /// Gauge: the connection cap in force (`connections_max`, lowered to the descriptor
    /// budget).
    pub connections_limit: AtomicU64,
    /// Connections closed at accept: the node-wide cap was reached.
    pub refused_total_cap: AtomicU64,
    /// Connections closed at accept: their address held its per-address cap.
    pub refused_per_address: AtomicU64,
    /// Accept failed for want of descriptors (the budget was exceeded from elsewhere).
    pub refused_descriptors: AtomicU64,
    /// Connections closed because a request head did not arrive in time.
    pub closed_header_timeout: AtomicU64,
    /// Connections closed because a request head was too large (answered 431).
    pub closed_header_too_large: AtomicU64,
    /// Connections closed after `idle_timeout_ms` without a request in flight.
    pub closed_idle: AtomicU64,
    /// Requests answered 503 `request_timeout`.
    pub request_timeouts: AtomicU64,
    /// HTTPS: handshakes completed.
    pub tls_handshakes_ok: AtomicU64,
    /// HTTPS: handshakes that failed (bad records, no common version or cipher, a refused
    /// or missing client certificate, the peer left).
    pub tls_handshakes_failed: AtomicU64,
    /// HTTPS: handshakes not done within `[http.tls] handshake_timeout_ms` (closed).
    pub tls_handshakes_timed_out: AtomicU64,
    /// HTTPS: connections that spoke plain HTTP to the TLS port (answered 400, closed).
    pub tls_plain_http: AtomicU64,
    /// Requests refused for their Host header.
    pub refused_host: AtomicU64,
    /// `GET /v1/admin/backup` (`backup.rs`).
    pub backups: super::backup::BackupStats,
    /// Admin calls refused for lacking a JSON content type or the admin header.
    pub refused_admin_unmarked: AtomicU64,
    /// Admin calls refused by the admin rate limit.
    pub refused_admin_rate: AtomicU64,
    /// Streaming watches open now, and those refused.
    pub streams: Slots,
    /// Blocking queries waiting now, and those refused.
    pub blocking: Slots,
    /// One sampler per kind of refusal, so each kind shows up in the log.
    pub(crate) log_accept: LogSampler,
    pub(crate) log_tls: LogSampler,
    pub(crate) log_request: LogSampler,
    /// The request-rate limits per principal and per client address.
    pub rates: super::rate::Rates,
    admin_bucket: Mutex<Option<(f64, Instant)>>,
}

impl HttpState {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Logs a rate-limit refusal (sampled: one line per 10 s).
    pub(crate) fn log_rate(&self, what: &str) {
        if let Some(held_back) = self.log_request.admit() {
            tracing::warn!(
                refused = "rate",
                by = what,
                held_back,
                "HTTP request refused (sampled: one line per 10 s)"
            );
        }
    }

    /// Takes one admin call from a bucket of `per_minute` calls refilled evenly; on
    /// refusal, the seconds until the next call is allowed.
    fn take_admin_call(&self, per_minute: u32) -> Result<(), u64> {
        let cap = f64::from(per_minute.max(1));
        let rate = cap / 60.0;
        let now = Instant::now();
        let mut b = self.admin_bucket.lock();
        let (tokens, last) = b.get_or_insert((cap, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * rate).min(cap);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - *tokens) / rate).ceil().max(1.0) as u64)
        }
    }
}

/// The client address of a request, set by the listener.
#[derive(Clone, Copy, Debug)]
pub struct ClientAddr(pub IpAddr);

/// Places of one kind (streaming watches, waiting blocking queries): at most a node-wide
/// number at once, and at most a per-address number for one client address.
#[derive(Debug, Default)]
pub struct Slots {
    /// Gauge: places taken now.
    pub open: AtomicU64,
    /// Refused for the node-wide cap.
    pub refused_total: AtomicU64,
    /// Refused for the per-address cap.
    pub refused_per_address: AtomicU64,
    by_address: Mutex<HashMap<IpAddr, u64>>,
}

/// Which cap refused a place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotRefusal {
    Total,
    PerAddress,
}

/// A place taken in [`Slots`] (which one: `pick` from the node's [`HttpState`]); freed on drop.
pub struct Slot {
    state: Arc<HttpState>,
    pick: fn(&HttpState) -> &Slots,
    ip: Option<IpAddr>,
}

impl Slots {
    /// Takes a place for `ip` (None: a request that came not through the listener, counted
    /// in the total only), unless `max` are taken or `per_address` by `ip`.
    pub fn take(
        state: &Arc<HttpState>,
        pick: fn(&HttpState) -> &Slots,
        ip: Option<IpAddr>,
        max: u64,
        per_address: u64,
    ) -> Result<Slot, SlotRefusal> {
        let s = pick(state);
        if s.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).is_err() {
            HttpState::bump(&s.refused_total);
            return Err(SlotRefusal::Total);
        }
        if let Some(ip) = ip {
            let mut by = s.by_address.lock();
            let n = by.entry(ip).or_insert(0);
            if *n >= per_address {
                if *n == 0 {
                    by.remove(&ip);
                }
                drop(by);
                s.open.fetch_sub(1, Ordering::AcqRel);
                HttpState::bump(&s.refused_per_address);
                return Err(SlotRefusal::PerAddress);
            }
            *n += 1;
        }
        Ok(Slot { state: state.clone(), pick, ip })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let s = (self.pick)(&self.state);
        if let Some(ip) = self.ip {
            let mut by = s.by_address.lock();
            if let Some(n) = by.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    by.remove(&ip);
                }
            }
        }
        s.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Takes a streaming-watch place (`streams`) or a blocking-query place (`blocking`) for
/// `ip` under the caps in force; a refusal is the client's error: 429 per address, 503
/// node-wide, both with `Retry-After: 1`, logged sampled.
#[allow(clippy::result_large_err)] // a refusal is answered at once, never stored
pub fn take_slot(node: &NodeShared, ip: Option<IpAddr>, streams: bool) -> Result<Slot, Response> {
    let cfg = node.registry.config();
    let h = &cfg.http;
    let (pick, max, per_address, code, what, keys): (fn(&HttpState) -> &Slots, _, _, _, _, _) = if streams {
        (
            |s| &s.streams,
            h.watch_streams_max,
            h.watch_streams_per_address_max,
            "too_many_watches",
            "streaming watches",
            ("watch_streams_max", "watch_streams_per_address_max"),
        )
    } else {
        (
            |s| &s.blocking,
            h.blocking_queries_max,
            h.blocking_queries_per_address_max,
            "too_many_blocking_queries",
            "blocking queries",
            ("blocking_queries_max", "blocking_queries_per_address_max"),
        )
    };
    Slots::take(&node.http, pick, ip, max, per_address).map_err(|why| {
        let (status, message, key) = match why {
            SlotRefusal::Total => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{max} {what} are open on this node ([http] {})", keys.0),
                keys.0,
            ),
            SlotRefusal::PerAddress => (
                StatusCode::TOO_MANY_REQUESTS,
                format!("{per_address} {what} are open from this client address ([http] {})", keys.1),
                keys.1,
            ),
        };
        log_refusal(node, key, &ip.map(|i| i.to_string()).unwrap_or_default());
        retry_after(ApiError::new(status, code, message), 1)
    })
}

pub use tandem_replicator::sampled::LogSampler;

/// An error answer with `Retry-After`.
pub fn retry_after(e: ApiError, secs: u64) -> Response {
    let mut r = e.into_response();
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// The host a request names (`:authority` or `Host`), without its port or brackets.
fn request_host(req: &Request) -> Option<&str> {
    let raw = match req.uri().host() {
        Some(h) => h,
        None => req.headers().get(header::HOST)?.to_str().ok()?,
    };
    Some(strip_port(raw))
}

fn strip_port(h: &str) -> &str {
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match h.rsplit_once(':') {
        // One colon: name:port. More: a bare IPv6 address.
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => h,
    }
}

/// Whether this node answers requests naming `host`: the loopback names and addresses,
/// the host of `http_addr` (any IP literal when bound to a wildcard address: an IP literal
/// cannot be rebound), and `[http] allowed_hosts` (`*` allows every host).
pub fn host_allowed(cfg: &Config, host: &str) -> bool {
    let host = host.trim_end_matches('.');
    let listed = &cfg.http.allowed_hosts;
    if listed.iter().any(|h| h == "*" || strip_port(h).eq_ignore_ascii_case(host)) {
        return true;
    }
    let suffix = host.get(host.len().saturating_sub(".localhost".len())..);
    if host.eq_ignore_ascii_case("localhost") || suffix.is_some_and(|s| s.eq_ignore_ascii_case(".localhost"))
    {
        return true;
    }
    match host.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback() || cfg.http_addr.ip().is_unspecified() || ip == cfg.http_addr.ip(),
        Err(_) => false,
    }
}

/// Whether an admin call says it is one: a JSON content type or the admin header. Both
/// need a CORS preflight from a browser, so a cross-site page cannot send them.
fn admin_marked(req: &Request) -> bool {
    let h = req.headers();
    h.contains_key(ADMIN_HEADER)
        || h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|ct| {
            let mime = ct.split(';').next().unwrap_or("").trim();
            mime.eq_ignore_ascii_case("application/json")
        })
}

/// What a backup (`GET /v1/admin/backup`) may take besides `request_timeout_ms`: its
/// largest export at about 2 MB/s.
pub const BACKUP_TIME_MAX: Duration = Duration::from_secs(300);

/// How long a request may take: `request_timeout_ms`, plus its `wait` for a blocking query
/// (a streaming watch answers at once; its body is bounded by its own keep-alive), or
/// plus twice a new member's catch-up bound for a membership change, or plus
/// [`BACKUP_TIME_MAX`] for a backup.
fn budget(cfg: &Config, req: &Request) -> Duration {
    let base = Duration::from_millis(cfg.http.request_timeout_ms);
    if req.uri().path().starts_with(super::members::MEMBERS_PATH) {
        return base + crate::node::group::CATCH_UP_TIMEOUT * 2;
    }
    if req.uri().path() == crate::backup::BACKUP_PATH {
        return base + BACKUP_TIME_MAX;
    }
    let q = req.uri().query().unwrap_or("");
    if let Some(wait) = crate::compat::catalog::blocking_budget(req.uri().path(), q) {
        return base + wait;
    }
    if !req.uri().path().starts_with("/v1/services/") || !q.split('&').any(|kv| kv.starts_with("index=")) {
        return base;
    }
    let wait = q
        .split('&')
        .find_map(|kv| kv.strip_prefix("wait="))
        .map_or(Ok(super::WAIT_DEFAULT), super::parse_wait)
        .unwrap_or(super::WAIT_MAX);
    base + wait
}

fn log_refusal(node: &NodeShared, what: &'static str, detail: &str) {
    if let Some(held_back) = node.http.log_request.admit() {
        tracing::warn!(
            refused = what,
            detail,
            held_back,
            "HTTP request refused (sampled: one line per 10 s)"
        );
    }
}

/// The checks of every route (Host, admin calls): the request's time budget, or the refusal.
pub fn admit(node: &NodeShared, req: &Request) -> Result<Duration, Box<Response>> {
    let cfg = node.registry.config();
    let st = &node.http;
    if let Some(host) = request_host(req) {
        if !host_allowed(&cfg, host) {
            HttpState::bump(&st.refused_host);
            log_refusal(node, "host", host);
            return Err(Box::new(
                ApiError::new(
                    StatusCode::FORBIDDEN,
                    "host_not_allowed",
                    "this node does not serve that Host name ([http] allowed_hosts)",
                )
                .into_response(),
            ));
        }
    }
    if req.uri().path().starts_with("/v1/admin/") {
        if !admin_marked(req) {
            HttpState::bump(&st.refused_admin_unmarked);
            log_refusal(node, "admin_unmarked", req.uri().path());
            return Err(Box::new(
                ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "admin_needs_json",
                    format!("admin calls need Content-Type: application/json or the {ADMIN_HEADER} header"),
                )
                .into_response(),
            ));
        }
        if let Err(secs) = st.take_admin_call(cfg.http.admin_calls_per_minute) {
            HttpState::bump(&st.refused_admin_rate);
            log_refusal(node, "admin_rate", req.uri().path());
            let e = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!(
                    "more than {} admin calls a minute ([http] admin_calls_per_minute)",
                    cfg.http.admin_calls_per_minute
                ),
            );
            return Err(Box::new(retry_after(e, secs)));
        }
    }
    Ok(budget(&cfg, req))
}

/// The answer to a request that ran past its time budget (`limit`, from [`admit`]).
pub fn timed_out(node: &NodeShared, limit: Duration) -> Response {
    HttpState::bump(&node.http.request_timeouts);
    let e = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "request_timeout",
        format!("the request took longer than {} ms ([http] request_timeout_ms)", limit.as_millis()),
    );
    retry_after(e, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(addr: &str, hosts: &[&str]) -> Config {
        let mut c = Config::single("dc-a", "/tmp/x".into(), addr.parse().unwrap());
        c.http.allowed_hosts = hosts.iter().map(|h| (*h).to_owned()).collect();
        c
    }

    #[test]
    fn hosts_default_to_loopback_and_the_bound_address() {
        let c = cfg("10.0.0.7:8500", &[]);
        for ok in ["localhost", "LOCALHOST", "a.localhost", "127.0.0.1", "::1", "10.0.0.7", "localhost."] {
            assert!(host_allowed(&c, ok), "{ok}");
        }
        for bad in ["evil.example", "10.0.0.8", "localhost.evil.example", ""] {
            assert!(!host_allowed(&c, bad), "{bad}");
        }
        // Bound to every address: any IP literal, still no names.
        let c = cfg("0.0.0.0:8500", &[]);
        assert!(host_allowed(&c, "192.168.1.4"));
        assert!(!host_allowed(&c, "evil.example"));
        // Listed names, and the wildcard.
        let c = cfg("10.0.0.7:8500", &["Registry.DC-A.internal"]);
        assert!(host_allowed(&c, "registry.dc-a.internal"));
        assert!(!host_allowed(&c, "evil.example"));
        assert!(host_allowed(&cfg("10.0.0.7:8500", &["*"]), "evil.example"));
    }

    #[test]
    fn ports_and_brackets_are_stripped() {
        assert_eq!(strip_port("evil.example:8500"), "evil.example");
        assert_eq!(strip_port("[::1]:8500"), "::1");
        assert_eq!(strip_port("::1"), "::1");
        assert_eq!(strip_port("localhost"), "localhost");
    }

    #[test]
    fn the_admin_bucket_refills_per_minute() {
        let st = HttpState::default();
        for _ in 0..3 {
            assert!(st.take_admin_call(3).is_ok());
        }
        let wait = st.take_admin_call(3).unwrap_err();
        assert!((1..=20).contains(&wait), "{wait}");
    }
}
