//! A small HTTP client for tandem's API, used by the CLI, the tests and the SDK.
//!
//! It holds several registry addresses of one DC and moves to the next one when a request
//! cannot reach the current one (connection errors and 5xx), never on 4xx answers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

/// Errors of the client, split by who must react.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The registry answered with an error: the request was understood and refused.
    #[error("{status} {code}: {message}")]
    Api { status: u16, code: String, message: String },
    /// No registry address answered; retrying later may work.
    #[error("no registry reachable: {0}")]
    Unreachable(String),
    #[error("unexpected answer: {0}")]
    Decode(String),
}

impl ClientError {
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            ClientError::Unreachable(_) | ClientError::Decode(_) => None,
        }
    }
}

/// A client of one DC's registry nodes.
pub struct Client {
    http: reqwest::Client,
    bases: Vec<String>,
    current: AtomicUsize,
}

impl Client {
    /// `addrs`: base URLs such as `http://127.0.0.1:8500` (at least one).
    pub fn new(addrs: &[String]) -> Client {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(330))
            .build()
            .expect("a plain HTTP client always builds");
        let bases = addrs.iter().map(|a| a.trim_end_matches('/').to_owned()).collect();
        Client { http, bases, current: AtomicUsize::new(0) }
    }

    pub fn addrs(&self) -> &[String] {
        &self.bases
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
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
            if let Some(b) = body {
                req = req.json(b);
            }
            match req.send().await {
                Ok(resp) => {
                    let status = resp.status();
                    let headers = resp.headers().clone();
                    let text = resp.text().await.map_err(|e| ClientError::Decode(e.to_string()))?;
                    let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
                    if status.is_server_error() {
                        last = format!("{url}: {status}");
                        continue;
                    }
                    self.current.store(idx, Ordering::Relaxed);
                    if !status.is_success() {
                        let code = v["error"]["code"].as_str().unwrap_or("unknown").to_owned();
                        let message = v["error"]["message"].as_str().unwrap_or("").to_owned();
                        return Err(ClientError::Api { status: status.as_u16(), code, message });
                    }
                    return Ok((v, headers));
                }
                Err(e) => last = format!("{url}: {e}"),
            }
        }
        Err(ClientError::Unreachable(last))
    }

    pub async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, ClientError> {
        let (v, _) = self.send(method, path, body, Duration::from_secs(10)).await?;
        serde_json::from_value(v).map_err(|e| ClientError::Decode(e.to_string()))
    }

    pub async fn register(&self, body: &Value) -> Result<Value, ClientError> {
        self.call(reqwest::Method::POST, "/v1/register", Some(body)).await
    }

    pub async fn heartbeat(&self, ns: &str, svc: &str, id: &str) -> Result<Value, ClientError> {
        self.call(reqwest::Method::PUT, &format!("/v1/heartbeat/{ns}/{svc}/{}", enc(id)), None).await
    }

    pub async fn deregister(&self, ns: &str, svc: &str, id: &str) -> Result<Value, ClientError> {
        self.call(reqwest::Method::DELETE, &format!("/v1/instances/{ns}/{svc}/{}", enc(id)), None).await
    }

    pub async fn set_status(&self, ns: &str, svc: &str, id: &str, status: &str) -> Result<Value, ClientError> {
        let body = serde_json::json!({ "status": status });
        self.call(reqwest::Method::PUT, &format!("/v1/instances/{ns}/{svc}/{}/status", enc(id)), Some(&body)).await
    }

    /// Discovery; `query` is appended as is (e.g. `dc=all&explain=true`).
    pub async fn discover(&self, ns: &str, svc: &str, query: &str) -> Result<Value, ClientError> {
        let q = if query.is_empty() { String::new() } else { format!("?{query}") };
        self.call(reqwest::Method::GET, &format!("/v1/services/{ns}/{svc}{q}"), None).await
    }

    /// A blocking query: returns when the service's index passes `index` or after `wait`.
    pub async fn watch(&self, ns: &str, svc: &str, index: u64, wait: Duration) -> Result<Value, ClientError> {
        let path = format!("/v1/services/{ns}/{svc}?index={index}&wait={}ms", wait.as_millis());
        let (v, _) = self.send(reqwest::Method::GET, &path, None, wait + Duration::from_secs(10)).await?;
        Ok(v)
    }

    pub async fn status(&self) -> Result<Value, ClientError> {
        self.call(reqwest::Method::GET, "/v1/status", None).await
    }
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
