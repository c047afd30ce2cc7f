//! Access control, run first by the one middleware ([`super::stack`]). Every request is
//! authenticated first (401 `unauthenticated` without a valid token or a client
//! certificate bound under `[[acl.certs]]`, when ACLs are on); a route whose scope its
//! method and path decide is authorized here (403 `forbidden`, naming the missing scope);
//! the principal then goes into the request's extensions, where the handlers that decide
//! on their body (register, batched registrations and heartbeats) check it. Unknown paths need
//! `admin`: deny by default.
//!
//! Path segments are percent-decoded exactly as the router decodes them for the handlers,
//! so `/v1/services/default/%6Frders` is judged as `orders`.

use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::acl::{Need, Principal};
use crate::error::ApiError;
use crate::shared::NodeShared;

/// Authenticates a request and authorizes what its method and path decide: the request
/// with its [`Principal`] in its extensions, or the refusal (already counted and audited).
pub async fn authorize(node: &NodeShared, req: Request) -> Result<Request, Response> {
    let acl = node.acl.current();
    // The console's static files hold no data: served to anyone, so that a browser can
    // load the page that then asks for a token.
    if crate::ui::is_static(req.uri().path()) {
        let mut req = req;
        req.extensions_mut().insert(Principal::nobody());
        return Ok(req);
    }
    let mut req = if acl.enabled() { compat_token(req).await? } else { req };
    let cert = req.extensions().get::<super::tls::ClientCert>().map(|c| c.0.clone());
    let principal =
        match acl.authenticate(req.headers(), cert.as_deref(), tandem_replicator::gateway::wall_ms()) {
            Ok(p) => p,
            Err(why) => {
                node.acl.refused(false, req.uri().path(), why.message());
                let mut r =
                    ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", why.message()).into_response();
                r.headers_mut()
                    .insert(axum::http::header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                audit_refusal(node, &req, "-", &r);
                return Err(r);
            }
        };
    if acl.enabled() {
        let need = match need(req.method(), req.uri().path(), req.uri().query()) {
            Ok(n) => n,
            Err(e) => return Err(e.into_response()),
        };
        if let Err(e) = principal.check(&need) {
            node.acl.refused(true, req.uri().path(), &e.message);
            let r = e.into_response();
            audit_refusal(node, &req, &principal.id, &r);
            return Err(r);
        }
    }
    req.extensions_mut().insert(principal);
    Ok(req)
}

/// Consul's clients present their token as `X-Consul-Token` or `?token=`, Nacos's as
/// `accessToken` (query or form body): moved into tandem's own token header, so that one
/// authentication judges every front end. A token header already given wins.
async fn compat_token(req: Request) -> Result<Request, Response> {
    if req.headers().contains_key(axum::http::header::AUTHORIZATION)
        || req.headers().contains_key(crate::acl::TOKEN_HEADER)
    {
        return Ok(req);
    }
    let path = req.uri().path();
    let nacos = path.starts_with("/nacos/");
    // Only on the front ends' own paths: tandem's API takes its token in a header only,
    // never in a URL.
    let consul = ["/v1/agent/", "/v1/health/", "/v1/catalog/", "/v1/status/", "/v1/query", "/v1/sd/"]
        .iter()
        .any(|p| path.starts_with(p));
    if !nacos && !consul {
        return Ok(req);
    }
    let mut token: Option<String> =
        req.headers().get("x-consul-token").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let query = req.uri().query().unwrap_or("").to_owned();
    if token.is_none() {
        let key = if nacos { "accessToken" } else { "token" };
        token = form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == key).map(|(_, v)| v.into_owned());
    }
    let form = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
    let req = if token.is_none() && nacos && form {
        // A form body is read (within the body limit) and put back as it was.
        let (parts, body) = req.into_parts();
        // A body past the limit (or cut off) is refused as the handler would refuse it.
        let Ok(bytes) = axum::body::to_bytes(body, super::REQUEST_BODY_BYTES_MAX).await else {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("a request body of at most {} bytes", super::REQUEST_BODY_BYTES_MAX),
            )
            .into_response());
        };
        token = form_urlencoded::parse(&bytes).find(|(k, _)| k == "accessToken").map(|(_, v)| v.into_owned());
        Request::from_parts(parts, axum::body::Body::from(bytes))
    } else {
        req
    };
    let mut req = req;
    if let Some(v) = token.and_then(|t| HeaderValue::from_str(t.trim()).ok()) {
        req.headers_mut().insert(crate::acl::TOKEN_HEADER, v);
    }
    Ok(req)
}

/// A refusal made here (outside the audit layer) to the audit log, sampled.
fn audit_refusal(node: &NodeShared, req: &Request, principal: &str, resp: &Response) {
    if node.audit.enabled() {
        let client = req.extensions().get::<super::limits::ClientAddr>().copied();
        node.audit.refusal(super::audit::line(req.method(), req.uri().path(), principal, client, resp));
    }
}

/// For the handlers that decide on their body: checks `need` and counts a refusal.
pub fn check(node: &NodeShared, principal: &Principal, need: &Need) -> Result<(), ApiError> {
    principal.check(need).inspect_err(|e| node.acl.refused(true, "(body)", &e.message))
}

/// Counts (and sample-logs) an ownership refusal (403 from the registry) like any other.
pub fn owned<T>(node: &NodeShared, result: Result<T, ApiError>) -> Result<T, ApiError> {
    result.inspect_err(|e| {
        if e.status == StatusCode::FORBIDDEN {
            node.acl.refused(true, "(owner)", &e.message);
        }
    })
}

/// What a request needs, from its method, path and query.
pub fn need(method: &Method, path: &str, query: Option<&str>) -> Result<Need, ApiError> {
    let segs: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| ApiError::invalid_field("path", "not UTF-8 after percent-decoding"))
        })
        .collect::<Result<_, _>>()?;
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let write = |ns: &str, svc: &str| Need::Write { namespace: ns.to_owned(), service: svc.to_owned() };
    Ok(match (method, segs.as_slice()) {
        (&Method::POST, ["v1", "register" | "registrations" | "heartbeats"]) => Need::Authenticated,
        (&Method::PUT, ["v1", "heartbeat", ns, svc, _]) => write(ns, svc),
        (&Method::DELETE, ["v1", "instances", ns, svc, _]) => write(ns, svc),
        (&Method::PUT, ["v1", "instances", ns, svc, _, "status"]) => write(ns, svc),
        (&Method::GET, ["v1", "services", ns, svc]) => {
            Need::Read { namespace: (*ns).to_owned(), service: Some((*svc).to_owned()) }
        }
        (&Method::GET, ["v1", "services"]) => {
            let ns = form_urlencoded::parse(query.unwrap_or("").as_bytes())
                .find(|(k, _)| k == "namespace")
                .map_or_else(|| "default".to_owned(), |(_, v)| v.into_owned());
            Need::Read { namespace: ns, service: None }
        }
        (&Method::GET, ["v1", "status"]) => Need::Status,
        // Consul's API (`crate::compat`): its writes name their service in the body or
        // through the service id, and the handler checks `write` on it.
        (&Method::PUT, ["v1", "agent", "service", "register"])
        | (&Method::PUT, ["v1", "agent", "service", "deregister" | "maintenance", _])
        | (&Method::PUT, ["v1", "agent", "check", _, _]) => Need::Authenticated,
        (&Method::GET, ["v1", "health" | "catalog", "service", svc]) => {
            Need::Read { namespace: "default".to_owned(), service: Some((*svc).to_owned()) }
        }
        (&Method::GET, ["v1", "catalog", "services"])
        | (&Method::GET, ["v1", "agent", "services" | "checks"]) => {
            Need::Read { namespace: "default".to_owned(), service: None }
        }
        (&Method::GET, ["v1", "catalog", "datacenters"])
        | (&Method::GET, ["v1", "status", "leader" | "peers"])
        | (&Method::GET, ["v1", "agent", "self"]) => Need::Status,
        // Prepared queries: the handler checks `write` (or `read`) on the query's service.
        (&Method::POST, ["v1", "query"])
        | (_, ["v1", "query", _])
        | (&Method::GET, ["v1", "query", _, _]) => Need::Authenticated,
        (&Method::GET, ["v1", "query"]) => Need::Read { namespace: "default".to_owned(), service: None },
        // Nacos's: writes as Consul's; reads of a service by its query.
        (_, ["nacos", "v1", "ns", "instance"]) if *method != Method::GET => Need::Authenticated,
        (&Method::PUT, ["nacos", "v1", "ns", "instance", "beat"]) => Need::Authenticated,
        (&Method::GET, ["nacos", "v1", "ns", "instance"])
        | (&Method::GET, ["nacos", "v1", "ns", "instance", "list"]) => nacos_read(query, true),
        (&Method::GET, ["nacos", "v1", "ns", "service", "list"]) => nacos_read(query, false),
        // The console's calls: a namespace's services (read), its event stream (only
        // indexes: any valid token), the drill reports (status).
        (&Method::GET, ["v1", "ui", "services"]) => {
            let ns = form_urlencoded::parse(query.unwrap_or("").as_bytes())
                .find(|(k, _)| k == "namespace")
                .map_or_else(|| "default".to_owned(), |(_, v)| v.into_owned());
            Need::Read { namespace: ns, service: None }
        }
        (&Method::GET, ["v1", "ui", "events"]) => Need::Authenticated,
        (&Method::GET, ["v1", "ui", "drills", ..]) => Need::Status,
        // Prometheus's service discovery lists every instance: the scope Prometheus
        // already holds to scrape /metrics.
        (&Method::GET, ["v1", "sd", "prometheus"]) => Need::Metrics,
        (&Method::GET, ["metrics"]) => Need::Metrics,
        _ => Need::Admin,
    })
}

/// What a Nacos read needs: `read` on its namespace, and on its service when it names one.
fn nacos_read(query: Option<&str>, service: bool) -> Need {
    let pairs: Vec<(String, String)> =
        form_urlencoded::parse(query.unwrap_or("").as_bytes()).into_owned().collect();
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty());
    let namespace = match get("namespaceId") {
        None | Some("public") => "default".to_owned(),
        Some(ns) => ns.to_owned(),
    };
    let service = service.then(|| {
        let full = get("serviceName").unwrap_or("");
        let (group, name) = full
            .split_once("@@")
            .unwrap_or((get("groupName").unwrap_or(crate::compat::nacos::DEFAULT_GROUP), full));
        crate::compat::nacos::tandem_service(group, name)
    });
    Need::Read { namespace, service }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_need_their_scope_and_unknown_paths_need_admin() {
        let n = |m: Method, p: &str, q: Option<&str>| need(&m, p, q).unwrap();
        let read =
            |ns: &str, svc: Option<&str>| Need::Read { namespace: ns.into(), service: svc.map(Into::into) };
        assert_eq!(n(Method::GET, "/v1/services/default/%6Frders", None), read("default", Some("orders")));
        assert_eq!(n(Method::GET, "/v1/services", Some("namespace=team%2Da")), read("team-a", None));
        assert_eq!(n(Method::GET, "/v1/services", None), read("default", None));
        assert_eq!(
            n(Method::PUT, "/v1/instances/default/orders/orders%231/status", None),
            Need::Write { namespace: "default".into(), service: "orders".into() }
        );
        assert_eq!(n(Method::POST, "/v1/register", None), Need::Authenticated);
        assert_eq!(n(Method::POST, "/v1/admin/retire-dc", None), Need::Admin);
        assert_eq!(n(Method::POST, "/v1/admin/cluster/transfer-leader", None), Need::Admin);
        assert_eq!(n(Method::GET, "/v1/nope", None), Need::Admin);
        assert_eq!(n(Method::POST, "/v1/services/default/orders", None), Need::Admin);
        assert_eq!(n(Method::GET, "/metrics", None), Need::Metrics);
        assert!(need(&Method::GET, "/v1/services/%ff/x", None).is_err());
    }
}
