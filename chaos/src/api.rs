//! A bounded HTTP client for the parts of tandem's API the drills use, turning answers into
//! checker records: every request has a timeout, and every failure is classified as
//! certainly-not-applied ([`Outcome::Failed`]) or maybe-applied ([`Outcome::Unknown`]).
//! Bodies and answers are the contract types of `tandem_client::api`, as the server's.

use std::time::Duration;

use serde::Deserialize as _;
use serde_json::Value;
use tandem_client::api::{
    DiscoverAnswer, ErrorBody, HeartbeatBatch, HeartbeatBatchAnswer, HeartbeatItem, RegisterRequest,
    StatusChange, StatusName,
};

use crate::checker::{Mark, ObservedInstance, Outcome, PeerLinkView, ServiceView, StatusView, ViewScope};

/// A client of one or more registries (the base URL is given per call).
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
}

impl Default for Api {
    fn default() -> Self {
        Api::new()
    }
}

impl Api {
    pub fn new() -> Api {
        Api::with_token(None).expect("a plain HTTP client always builds")
    }

    /// A client that presents `token` (`Authorization: Bearer`) with every request, for
    /// registries with ACLs on (docs/security.md). Refused when the token cannot be a
    /// header value.
    pub fn with_token(token: Option<&str>) -> Result<Api, String> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(t) = token {
            let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", t.trim()))
                .map_err(|_| "the token holds characters a header cannot carry".to_owned())?;
            v.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(1))
            .pool_idle_timeout(Duration::from_secs(10))
            .default_headers(headers)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Api { http })
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<(u16, Value), (bool, String)> {
        match req.timeout(timeout).send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                match resp.text().await {
                    Ok(text) => Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text)))),
                    Err(e) => Err((false, format!("reading the answer: {e}"))),
                }
            }
            // A connect error means the request never left: certainly not applied.
            Err(e) => Err((e.is_connect(), short_error(&e))),
        }
    }

    async fn write(&self, req: reqwest::RequestBuilder, timeout: Duration) -> Outcome {
        match self.send(req, timeout).await {
            Ok((s, body)) if (200..300).contains(&s) => Outcome::Acked {
                version: body.get("version").and_then(Value::as_u64),
                epoch: body.get("epoch").and_then(Value::as_u64),
            },
            Ok((s, body)) if (400..500).contains(&s) => {
                Outcome::Failed { http_status: Some(s), message: error_code(&body) }
            }
            Ok((s, body)) => Outcome::Unknown { message: format!("{s} {}", error_code(&body)) },
            Err((true, m)) => Outcome::Failed { http_status: None, message: m },
            Err((false, m)) => Outcome::Unknown { message: m },
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn register(
        &self,
        base: &str,
        namespace: &str,
        service: &str,
        id: &str,
        address: &str,
        port: u16,
        persistent: bool,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Outcome {
        let body = RegisterRequest {
            namespace: Some(namespace.to_owned()),
            service: service.to_owned(),
            instance_id: Some(id.to_owned()),
            address: address.to_owned(),
            port: u32::from(port),
            persistent: persistent.then_some(true),
            ttl_ms: (!persistent).then_some(ttl_ms),
            ..RegisterRequest::default()
        };
        self.write(self.http.post(format!("{base}/v1/register")).json(&body), timeout).await
    }

    pub async fn heartbeat(&self, base: &str, ns: &str, svc: &str, id: &str, timeout: Duration) -> Outcome {
        self.write(self.http.put(format!("{base}/v1/heartbeat/{ns}/{svc}/{id}")), timeout).await
    }

    /// `POST /v1/heartbeats` for `ids` of one service: the leases renewed, or why not.
    pub async fn heartbeats(
        &self,
        base: &str,
        ns: &str,
        svc: &str,
        ids: &[String],
        timeout: Duration,
    ) -> Result<HeartbeatBatchAnswer, String> {
        let body = HeartbeatBatch {
            instances: ids
                .iter()
                .map(|id| HeartbeatItem {
                    namespace: Some(ns.to_owned()),
                    service: svc.to_owned(),
                    instance_id: id.clone(),
                })
                .collect(),
        };
        let (s, body) = self
            .send(self.http.post(format!("{base}/v1/heartbeats")).json(&body), timeout)
            .await
            .map_err(|e| e.1)?;
        if s != 200 {
            return Err(format!("{s} {}", error_code(&body)));
        }
        HeartbeatBatchAnswer::deserialize(&body).map_err(|e| format!("the answer: {e}"))
    }

    pub async fn deregister(&self, base: &str, ns: &str, svc: &str, id: &str, timeout: Duration) -> Outcome {
        self.write(self.http.delete(format!("{base}/v1/instances/{ns}/{svc}/{id}")), timeout).await
    }

    pub async fn set_status(
        &self,
        base: &str,
        ns: &str,
        svc: &str,
        id: &str,
        status: &str,
        timeout: Duration,
    ) -> Outcome {
        let status: StatusName = match serde_json::from_value(Value::String(status.to_owned())) {
            Ok(s) => s,
            Err(e) => {
                return Outcome::Failed { http_status: None, message: format!("status {status:?}: {e}") }
            }
        };
        let req = self
            .http
            .put(format!("{base}/v1/instances/{ns}/{svc}/{id}/status"))
            .json(&StatusChange { status });
        self.write(req, timeout).await
    }

    /// A discovery answer: `?dc=all` or the policy's.
    pub async fn view(
        &self,
        base: &str,
        ns: &str,
        svc: &str,
        scope: ViewScope,
        timeout: Duration,
    ) -> Result<ServiceView, String> {
        let q = match scope {
            ViewScope::All => "?dc=all",
            ViewScope::Policy => "",
        };
        let (s, body) = self
            .send(self.http.get(format!("{base}/v1/services/{ns}/{svc}{q}")), timeout)
            .await
            .map_err(|e| e.1)?;
        if s != 200 {
            return Err(format!("{s} {}", error_code(&body)));
        }
        parse_view(&body)
    }

    /// A discovery read of one member as a client that follows the index sees it
    /// (`?dc=all`, with `index` and `wait` when given): the status and the group headers.
    pub async fn read_member(
        &self,
        base: &str,
        ns: &str,
        svc: &str,
        index: Option<(u64, u64)>,
        timeout: Duration,
    ) -> Result<MemberRead, String> {
        let q = match index {
            Some((i, wait_ms)) => format!("?dc=all&index={i}&wait={wait_ms}ms"),
            None => "?dc=all".to_owned(),
        };
        let resp = self
            .http
            .get(format!("{base}/v1/services/{ns}/{svc}{q}"))
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| short_error(&e))?;
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let read = MemberRead {
            status: resp.status().as_u16(),
            index: header("x-tandem-index").and_then(|v| v.parse().ok()),
            last_contact_ms: header("x-tandem-last-contact").and_then(|v| v.parse().ok()),
            known_leader: header("x-tandem-known-leader").map(|v| v == "true"),
            code: String::new(),
        };
        let text = resp.text().await.map_err(|e| e.to_string())?;
        let code = if read.status == 200 {
            String::new()
        } else {
            error_code(&serde_json::from_str(&text).unwrap_or(Value::String(text)))
        };
        Ok(MemberRead { code, ..read })
    }

    /// `/v1/status`: the parts the checker uses, and the whole answer.
    pub async fn status(&self, base: &str, timeout: Duration) -> Result<(StatusView, Value), String> {
        let (s, body) =
            self.send(self.http.get(format!("{base}/v1/status")), timeout).await.map_err(|e| e.1)?;
        if s != 200 {
            return Err(format!("{s} {}", error_code(&body)));
        }
        Ok((parse_status(&body)?, body))
    }

    /// POST of a JSON `body` to `path` (an admin call): the status and the answer.
    pub async fn post(
        &self,
        base: &str,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<(u16, Value), String> {
        self.send(self.http.post(format!("{base}{path}")).json(body), timeout).await.map_err(|e| e.1)
    }

    /// DELETE of `path` (an admin call, marked as one): the status and the answer.
    pub async fn delete(&self, base: &str, path: &str, timeout: Duration) -> Result<(u16, Value), String> {
        let req = self.http.delete(format!("{base}{path}")).header("x-tandem-admin", "1");
        self.send(req, timeout).await.map_err(|e| e.1)
    }

    /// `/metrics` as text.
    pub async fn metrics(&self, base: &str, timeout: Duration) -> Result<String, String> {
        let resp = self
            .http
            .get(format!("{base}/metrics"))
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| short_error(&e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| e.to_string())?;
        if status != 200 {
            let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
            return Err(format!("{status} {}", error_code(&body)));
        }
        Ok(text)
    }
}

/// What [`Api::read_member`] saw.
#[derive(Clone, Debug)]
pub struct MemberRead {
    pub status: u16,
    /// `X-Tandem-Index`.
    pub index: Option<u64>,
    /// `X-Tandem-Last-Contact`: how long ago the member last heard from its leader.
    pub last_contact_ms: Option<u64>,
    /// `X-Tandem-Known-Leader`.
    pub known_leader: Option<bool>,
    /// The error code of an answer other than 200.
    pub code: String,
}

fn short_error(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        "connection refused or unreachable".into()
    } else {
        let mut s = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(x) = src {
            s = format!("{s}: {x}");
            src = x.source();
        }
        s
    }
}

fn error_code(body: &Value) -> String {
    match ErrorBody::deserialize(body) {
        Ok(e) => e.error.code,
        Err(_) => body.to_string(),
    }
}

/// Parses a discovery answer.
pub fn parse_view(body: &Value) -> Result<ServiceView, String> {
    let answer = DiscoverAnswer::deserialize(body).map_err(|e| format!("malformed discovery answer: {e}"))?;
    let instances = answer
        .instances
        .into_iter()
        .map(|i| ObservedInstance {
            id: i.instance_id.to_string(),
            owner_dc: i.owner_dc.to_string(),
            seq: i.seq,
            status: i.status.as_str().to_owned(),
            health: i.health.as_str().to_owned(),
            stale: i.stale,
            damped: i.damped,
        })
        .collect();
    Ok(ServiceView { index: answer.index, instances })
}

/// Parses `/v1/status`.
pub fn parse_status(body: &Value) -> Result<StatusView, String> {
    let mark = |v: &Value| -> Option<Mark> {
        Some(Mark {
            epoch: v.get("epoch")?.as_u64()?,
            seq: v.get("last_seq").or_else(|| v.get("seq"))?.as_u64()?,
        })
    };
    let log = body.get("log").and_then(mark).ok_or("status without log epoch/last_seq")?;
    let mut applied = std::collections::BTreeMap::new();
    if let Some(map) = body.get("applied").and_then(Value::as_object) {
        for (origin, m) in map {
            if let Some(m) = mark(m) {
                applied.insert(origin.clone(), m);
            }
        }
    }
    let mut peers = std::collections::BTreeMap::new();
    if let Some(map) = body.get("peers").and_then(Value::as_object) {
        for (peer, p) in map {
            let inbound = &p["inbound"];
            let origin = Mark {
                epoch: inbound["origin_epoch"].as_u64().unwrap_or(0),
                seq: inbound["origin_last_seq"].as_u64().unwrap_or(0),
            };
            if let Some(stale) = inbound["stale"].as_bool() {
                peers.insert(peer.clone(), PeerLinkView { stale, origin });
            }
        }
    }
    let preservation_active = body.pointer("/self_preservation/active").and_then(Value::as_bool);
    Ok(StatusView { log, applied, peers, preservation_active })
}
