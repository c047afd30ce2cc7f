//! A small HTTP client for tandem's API, used by the CLI, the tests and the SDK.
//!
//! It holds several registry addresses of one DC and moves to the next one when a request
//! cannot reach the current one (connection errors and 5xx), never on 4xx answers. HTTPS
//! takes a [`ClientTls`](crate::ClientTls) (the registry's CA, optionally a client
//! certificate).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::api::{
    ErrorBody, HeartbeatBatchAnswer, RegisterAnswer, RegisterRequest, RetireAnswer, RetireRequest,
    StatusChange, StatusName, UnretireAnswer,
};

/// Errors of the client, split by who must react.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ClientError {
    /// The registry answered with an error: the request was understood and refused.
    #[error("{status} {code}: {message}")]
    Api { status: u16, code: String, message: String },
    /// No registry address answered; retrying later may work.
    #[error("no registry reachable: {0}")]
    Unreachable(String),
    #[error("unexpected answer: {0}")]
    Decode(String),
    /// The client's own settings are unusable (a CA or client certificate file).
    #[error("client settings: {0}")]
    Config(String),
}

impl ClientError {
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            ClientError::Unreachable(_) | ClientError::Decode(_) | ClientError::Config(_) => None,
        }
    }
}

/// Largest response body the client reads; a larger answer is refused as a decode error
/// (a registry answer is far smaller; this bounds what a broken or hostile server costs).
pub const RESPONSE_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Timeouts of a [`Client`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// Per address: how long a TCP connect may take before the next address is tried.
    pub connect_timeout: Duration,
    /// Per address: how long a non-blocking request may take.
    pub request_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions { connect_timeout: Duration::from_secs(2), request_timeout: Duration::from_secs(10) }
    }
}

/// An ACL token. Its `Debug` never shows the secret, so a configuration can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    pub fn new(secret: impl Into<String>) -> Token {
        Token(secret.into())
    }
    /// The secret, to send.
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// A client of one DC's registry nodes.
pub struct Client {
    http: reqwest::Client,
    bases: Vec<String>,
    current: AtomicUsize,
    request_timeout: Duration,
    /// Sent as `Authorization: Bearer` with every request.
    token: Option<String>,
}

impl Client {
    /// `addrs`: base URLs such as `http://127.0.0.1:8500` (at least one).
    pub fn new(addrs: &[String]) -> Client {
        Client::with_options(addrs, ClientOptions::default())
    }

    pub fn with_options(addrs: &[String], opts: ClientOptions) -> Client {
        Client::with_tls(addrs, opts, None)
    }

    /// A client of `https://` addresses when `tls` is given (then plain `http://` ones are
    /// refused): the registry's certificate must chain to `tls`'s CA.
    pub fn with_tls(addrs: &[String], opts: ClientOptions, tls: Option<&crate::ClientTls>) -> Client {
        let mut b = reqwest::Client::builder()
            .connect_timeout(opts.connect_timeout)
            .timeout(Duration::from_secs(330));
        if let Some(tls) = tls {
            b = tls.apply(b);
        }
        // A ClientTls was built once when it was made.
        let http = b.build().expect("a plain client, or one with checked TLS settings, always builds");
        let bases = addrs.iter().map(|a| a.trim_end_matches('/').to_owned()).collect();
        Client {
            http,
            bases,
            current: AtomicUsize::new(0),
            request_timeout: opts.request_timeout,
            token: None,
        }
    }

    /// The same client, sending `token` (`Authorization: Bearer`) with every request: for
    /// a registry with ACLs on.
    pub fn with_token(mut self, token: &str) -> Client {
        self.token = Some(token.to_owned());
        self
    }

    pub fn addrs(&self) -> &[String] {
        &self.bases
    }

    async fn send<B: Serialize + ?Sized>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<(Value, reqwest::header::HeaderMap), ClientError> {
        if self.bases.is_empty() {
            return Err(ClientError::Unreachable("no registry address configured".into()));
        }
        let start = self.current.load(Ordering::Relaxed);
        let mut last = String::new();
        for i in 0..self.bases.len() {
            let idx = (start + i) % self.bases.len();
            let url = format!("{}{}", self.bases[idx], path);
            let mut req = self.http.request(method.clone(), &url).timeout(timeout);
            if let Some(t) = &self.token {
                req = req.bearer_auth(t);
            }
            if path.starts_with("/v1/admin/") {
                // Marks an operator's call (a browser's cross-site form cannot send it).
                req = req.header("x-tandem-admin", "1");
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            match req.send().await {
                Ok(resp) => {
                    let status = resp.status();
                    let headers = resp.headers().clone();
                    let body = read_body(resp).await.map_err(ClientError::Decode)?;
                    let v: Value = serde_json::from_slice(&body)
                        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
                    // A 5xx is that node's trouble: try the next address. Except 507 (a
                    // node's cap on services or namespaces): a definite refusal.
                    if status.is_server_error() && status != reqwest::StatusCode::INSUFFICIENT_STORAGE {
                        last = match serde_json::from_value::<ErrorBody>(v) {
                            Ok(b) => format!("{url}: {status} {}: {}", b.error.code, b.error.message),
                            Err(_) => format!("{url}: {status}"),
                        };
                        continue;
                    }
                    self.current.store(idx, Ordering::Relaxed);
                    if !status.is_success() {
                        let (code, message) = match serde_json::from_value::<ErrorBody>(v) {
                            Ok(b) => (b.error.code, b.error.message),
                            Err(_) => ("unknown".to_owned(), String::new()),
                        };
                        return Err(ClientError::Api { status: status.as_u16(), code, message });
                    }
                    return Ok((v, headers));
                }
                Err(e) => last = format!("{url}: {}", with_causes(&e)),
            }
        }
        Err(ClientError::Unreachable(last))
    }

    /// One request; the answer is decoded as `T` (a [`crate::api`] type, or a `Value`).
    pub async fn call<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let (v, _) = self.send(method, path, body, self.request_timeout).await?;
        serde_json::from_value(v).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// POST /v1/register with any body (the CLI and tests send raw JSON too); the answer
    /// as JSON.
    pub async fn register(&self, body: &(impl Serialize + ?Sized)) -> Result<Value, ClientError> {
        self.call(reqwest::Method::POST, "/v1/register", Some(body)).await
    }

    /// POST /v1/register, typed.
    pub async fn register_instance(&self, req: &RegisterRequest) -> Result<RegisterAnswer, ClientError> {
        self.call(reqwest::Method::POST, "/v1/register", Some(req)).await
    }

    /// POST /v1/registrations (at most [`crate::api::REGISTER_BATCH_MAX`] entries): a
    /// [`crate::api::RegisterBatch`], or raw JSON. One answer per entry, in order.
    pub async fn register_batch(
        &self,
        batch: &(impl Serialize + ?Sized),
    ) -> Result<crate::api::RegisterBatchAnswer, ClientError> {
        self.call(reqwest::Method::POST, "/v1/registrations", Some(batch)).await
    }

    /// POST /v1/heartbeats (at most [`crate::api::HEARTBEAT_BATCH_MAX`] entries): a
    /// [`crate::api::HeartbeatBatch`], or raw JSON.
    pub async fn heartbeat_batch(
        &self,
        batch: &(impl Serialize + ?Sized),
    ) -> Result<HeartbeatBatchAnswer, ClientError> {
        self.call(reqwest::Method::POST, "/v1/heartbeats", Some(batch)).await
    }

    pub async fn heartbeat(&self, ns: &str, svc: &str, id: &str) -> Result<Value, ClientError> {
        self.call(reqwest::Method::PUT, &format!("/v1/heartbeat/{ns}/{svc}/{}", enc(id)), NO_BODY).await
    }

    pub async fn deregister(&self, ns: &str, svc: &str, id: &str) -> Result<Value, ClientError> {
        self.call(reqwest::Method::DELETE, &format!("/v1/instances/{ns}/{svc}/{}", enc(id)), NO_BODY).await
    }

    pub async fn set_status(
        &self,
        ns: &str,
        svc: &str,
        id: &str,
        status: StatusName,
    ) -> Result<Value, ClientError> {
        let body = StatusChange { status };
        self.call(reqwest::Method::PUT, &format!("/v1/instances/{ns}/{svc}/{}/status", enc(id)), Some(&body))
            .await
    }

    /// Discovery; `query` is appended as is (e.g. `dc=all&explain=true`).
    pub async fn discover(&self, ns: &str, svc: &str, query: &str) -> Result<Value, ClientError> {
        let q = if query.is_empty() { String::new() } else { format!("?{query}") };
        self.call(reqwest::Method::GET, &format!("/v1/services/{ns}/{svc}{q}"), NO_BODY).await
    }

    /// A blocking query: returns when the service's index passes `index` or after `wait`.
    pub async fn watch(&self, ns: &str, svc: &str, index: u64, wait: Duration) -> Result<Value, ClientError> {
        let path = format!("/v1/services/{ns}/{svc}?index={index}&wait={}ms", wait.as_millis());
        let (v, _) = self.send(reqwest::Method::GET, &path, NO_BODY, wait + Duration::from_secs(10)).await?;
        Ok(v)
    }

    pub async fn status(&self) -> Result<Value, ClientError> {
        self.call(reqwest::Method::GET, "/v1/status", NO_BODY).await
    }

    /// POST /v1/admin/retire-dc: forget a lost DC's copies here and refuse its frames.
    pub async fn retire_dc(&self, dc: &str) -> Result<RetireAnswer, ClientError> {
        let body = RetireRequest { dc: dc.to_owned() };
        self.call(reqwest::Method::POST, "/v1/admin/retire-dc", Some(&body)).await
    }

    /// POST /v1/admin/cluster/transfer-leader: the DC group's leader hands its lead to
    /// member `to` (any member forwards it to the leader); the answer as JSON (`leader`,
    /// `term`, `took_ms`).
    pub async fn transfer_leader(&self, to: u64) -> Result<Value, ClientError> {
        let body = serde_json::json!({ "to": to });
        self.call(reqwest::Method::POST, "/v1/admin/cluster/transfer-leader", Some(&body)).await
    }

    /// POST /v1/admin/cluster/members: add node `id` (started with `[cluster] join =
    /// true`) to the DC's group; a voter once it caught up, unless `learner`. Waits for the
    /// catch-up (at most [`MEMBER_CHANGE_TIMEOUT`]).
    pub async fn add_member(
        &self,
        id: u64,
        raft_addr: &str,
        http_addr: &str,
        learner: bool,
    ) -> Result<Value, ClientError> {
        let body = serde_json::json!({ "id": id, "raft_addr": raft_addr, "http_addr": http_addr, "learner": learner });
        let path = "/v1/admin/cluster/members";
        self.send(reqwest::Method::POST, path, Some(&body), MEMBER_CHANGE_TIMEOUT).await.map(|(v, _)| v)
    }

    /// DELETE /v1/admin/cluster/members/{id}: remove member `id` from the DC's group.
    pub async fn remove_member(&self, id: u64) -> Result<Value, ClientError> {
        let path = format!("/v1/admin/cluster/members/{id}");
        self.send::<Value>(reqwest::Method::DELETE, &path, None, MEMBER_CHANGE_TIMEOUT).await.map(|(v, _)| v)
    }

    /// POST /v1/admin/cluster/members/{old}/replace: add node `id` and, once it caught up,
    /// swap it for member `old` in one change.
    pub async fn replace_member(
        &self,
        old: u64,
        id: u64,
        raft_addr: &str,
        http_addr: &str,
    ) -> Result<Value, ClientError> {
        let body = serde_json::json!({ "id": id, "raft_addr": raft_addr, "http_addr": http_addr });
        let path = format!("/v1/admin/cluster/members/{old}/replace");
        self.send(reqwest::Method::POST, &path, Some(&body), MEMBER_CHANGE_TIMEOUT).await.map(|(v, _)| v)
    }

    /// GET /v1/admin/backup: the DC's state as a backup, from the node among this client's
    /// addresses that serves the DC's writes (a follower answers 503 `not_leader`, and the
    /// next address is asked). The export goes to `out` as it arrives (at most
    /// `bytes_max` bytes, else a decode error); returns the backup's meta (the node's
    /// `x-tandem-backup` header, JSON) and the bytes written.
    pub async fn backup(
        &self,
        out: &mut (dyn std::io::Write + Send),
        bytes_max: u64,
    ) -> Result<(Value, u64), ClientError> {
        let mut last = String::from("no registry address configured");
        for base in &self.bases {
            let url = format!("{base}/v1/admin/backup");
            let mut req = self.http.get(&url).timeout(BACKUP_TIMEOUT).header("x-tandem-admin", "1");
            if let Some(t) = &self.token {
                req = req.bearer_auth(t);
            }
            let mut resp = match req.send().await {
                Ok(r) => r,
                Err(e) => {
                    last = format!("{url}: {}", with_causes(&e));
                    continue;
                }
            };
            let status = resp.status();
            if !status.is_success() {
                let body = read_body(resp).await.map_err(ClientError::Decode)?;
                let (code, message) = match serde_json::from_slice::<ErrorBody>(&body) {
                    Ok(b) => (b.error.code, b.error.message),
                    Err(_) => ("unknown".to_owned(), String::from_utf8_lossy(&body).into_owned()),
                };
                if status.is_server_error() && status != reqwest::StatusCode::INSUFFICIENT_STORAGE {
                    last = format!("{url}: {status} {code}: {message}");
                    continue;
                }
                return Err(ClientError::Api { status: status.as_u16(), code, message });
            }
            let meta = resp
                .headers()
                .get("x-tandem-backup")
                .and_then(|v| serde_json::from_slice::<Value>(v.as_bytes()).ok())
                .ok_or_else(|| ClientError::Decode(format!("{url}: no x-tandem-backup header")))?;
            let mut written = 0u64;
            while let Some(chunk) = resp.chunk().await.map_err(|e| ClientError::Decode(with_causes(&e)))? {
                written += chunk.len() as u64;
                if written > bytes_max {
                    return Err(ClientError::Decode(format!("backup larger than {bytes_max} bytes")));
                }
                out.write_all(&chunk)
                    .map_err(|e| ClientError::Decode(format!("cannot write the backup: {e}")))?;
            }
            return Ok((meta, written));
        }
        Err(ClientError::Unreachable(last))
    }

    /// POST /v1/admin/unretire-dc: let a retired DC replicate again (from scratch).
    pub async fn unretire_dc(&self, dc: &str) -> Result<UnretireAnswer, ClientError> {
        let body = RetireRequest { dc: dc.to_owned() };
        self.call(reqwest::Method::POST, "/v1/admin/unretire-dc", Some(&body)).await
    }
}

/// How long a backup may take to arrive (the node's own bound is 300 s past its request
/// timeout).
pub const BACKUP_TIMEOUT: Duration = Duration::from_secs(330);

/// How long a membership change may take to answer: a new member's catch-up (at most
/// 120 s on the leader) and the forward to the leader.
pub const MEMBER_CHANGE_TIMEOUT: Duration = Duration::from_secs(260);

/// An error and its causes, so that "error sending request" says why (a refused
/// connection, a certificate the CA does not vouch for).
fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    // Bounded: a cause chain is short; a cycle must not spin.
    for _ in 0..8 {
        let Some(c) = cause else { break };
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// The body of a request without one.
const NO_BODY: Option<&Value> = None;

/// Reads a response body of at most [`RESPONSE_BYTES_MAX`] bytes.
async fn read_body(mut resp: reqwest::Response) -> Result<Vec<u8>, String> {
    let too_large = || format!("response body larger than {RESPONSE_BYTES_MAX} bytes");
    if resp.content_length().is_some_and(|n| n > RESPONSE_BYTES_MAX as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > RESPONSE_BYTES_MAX {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Percent-encodes an instance id for a path segment ('#' would end the path).
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b':' | b'@') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
