//! Namespace quotas (own instances, services, metadata bytes: 507 `quota_exceeded`) and
//! request rates per principal and per client address (429 `rate_limited` with
//! `Retry-After`): each is hit, counted in `/metrics`, and recovers (a deregistration makes
//! room; a second later the rate allows requests again). The rate limit is 1 a second with
//! a small burst, so each recovery waits about a second (bounded: at most 3 s in all).

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::{reg, Acl};

const LIMITS: &str = r#"
[limits]
requests_per_second_per_principal = 1
requests_burst_per_principal = 40

[limits.namespace.team-b]
instances_max = 2
services_max = 1
metadata_bytes_max = 100
"#;

fn team_b(service: &str, id: &str, metadata_bytes: usize) -> Value {
    let mut r = reg("team-b", id);
    r["service"] = json!(service);
    r["metadata"] = json!({ "k": "v".repeat(metadata_bytes.saturating_sub(1)) });
    r
}

async fn metric(t: &Acl, line_start: &str) -> f64 {
    let text = t
        .http
        .get(format!("{}/metrics", t.base))
        .bearer_auth(t.token("admin").unwrap())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {line_start} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_quotas_refuse_and_recover() {
    let t = Acl::start_with(LIMITS).await;
    let ok = StatusCode::OK;
    let call = |body: Value| t.call("team-b", Method::POST, "/v1/register", Some(body));
    assert_eq!(call(team_b("orders", "b1", 10)).await.0, ok);
    assert_eq!(call(team_b("orders", "b2", 10)).await.0, ok);
    let refused = |(status, answer): (StatusCode, Value), key: &str| {
        assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{answer}");
        assert_eq!(answer["error"]["code"], "quota_exceeded");
        let msg = answer["error"]["message"].as_str().unwrap().to_owned();
        assert!(msg.contains(key), "{msg}");
    };
    // Instances: a third is refused; replacing one that is held is not a new one.
    refused(call(team_b("orders", "b3", 10)).await, "instances_max = 2");
    assert_eq!(call(team_b("orders", "b1", 20)).await.0, ok);
    // Metadata bytes: 20 + 10 held; 90 more would pass 100.
    refused(call(team_b("orders", "b2", 90)).await, "metadata_bytes_max = 100");
    // Services: team-b holds one.
    assert_eq!(t.call("admin", Method::DELETE, "/v1/instances/team-b/orders/b2", None).await.0, ok);
    refused(call(team_b("payments", "p1", 10)).await, "services_max = 1");
    // Room again: the deregistration freed an instance.
    assert_eq!(call(team_b("orders", "b3", 10)).await.0, ok);
    // Other namespaces keep the defaults.
    assert_eq!(t.call("orders", Method::POST, "/v1/register", Some(reg("default", "o1"))).await.0, ok);
    let refused_metric =
        |limit: &str| format!("tandem_registrations_refused_total{{dc=\"dc-a\",limit=\"{limit}\"}}");
    assert_eq!(metric(&t, &refused_metric("namespace_instances_max")).await, 1.0);
    assert_eq!(metric(&t, &refused_metric("namespace_metadata_bytes_max")).await, 1.0);
    assert_eq!(metric(&t, &refused_metric("namespace_services_max")).await, 1.0);
    let ns = "tandem_namespace_instances{dc=\"dc-a\",namespace=\"team-b\"}";
    assert_eq!(metric(&t, ns).await, 2.0);
    let bytes = "tandem_namespace_metadata_bytes{dc=\"dc-a\",namespace=\"team-b\"}";
    assert_eq!(metric(&t, bytes).await, 30.0, "b1 with 20 bytes, b3 with 10 (keys and values)");

    // A batch's entries count together: one free place, two new instances (each would fit
    // alone). Nothing of it is written.
    assert_eq!(t.call("admin", Method::DELETE, "/v1/instances/team-b/orders/b3", None).await.0, ok);
    let batch = |a: Value, b: Value| Some(json!({ "instances": [a, b] }));
    let two_new = batch(team_b("orders", "b5", 10), team_b("orders", "b6", 10));
    let (status, answer) = t.call("team-b", Method::POST, "/v1/registrations", two_new).await;
    refused((status, answer.clone()), "instances_max = 2");
    assert!(answer["error"]["message"].as_str().unwrap().starts_with("instances[1]: "), "{answer}");
    assert_eq!(metric(&t, ns).await, 1.0, "nothing of the refused batch was written");
    // Metadata bytes too: b1's 20 replaced by 60, and 60 more, pass 100 together.
    let too_big = batch(team_b("orders", "b1", 60), team_b("orders", "b5", 60));
    refused(t.call("team-b", Method::POST, "/v1/registrations", too_big).await, "metadata_bytes_max = 100");
    // A re-registration is not a new instance, and its smaller metadata makes room.
    let fits = batch(team_b("orders", "b1", 5), team_b("orders", "b5", 95));
    assert_eq!(t.call("team-b", Method::POST, "/v1/registrations", fits).await.0, ok);
    assert_eq!(metric(&t, ns).await, 2.0);
    assert_eq!(metric(&t, bytes).await, 100.0);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_rates_per_principal_and_per_address_refuse_and_recover() {
    let t = Acl::start_with(LIMITS).await;
    // Per principal: the burst goes through, then 429 with Retry-After; another principal
    // is not affected.
    let path = "/v1/services/default/orders";
    let mut first_refusal = None;
    for i in 0..60 {
        let r = t
            .http
            .get(format!("{}{path}", t.base))
            .bearer_auth(t.token("rival").unwrap())
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(r.headers()["retry-after"], "1");
            let answer: Value = r.json().await.unwrap();
            assert_eq!(answer["error"]["code"], "rate_limited");
            assert!(answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("requests_per_second_per_principal"));
            first_refusal = Some(i);
            break;
        }
        assert_eq!(r.status(), StatusCode::OK);
    }
    let at = first_refusal.expect("the principal's rate was hit");
    assert!((40..=42).contains(&at), "the burst of 40 (and the refill meanwhile) went through: {at}");
    assert_eq!(t.call("orders", Method::GET, path, None).await.0, StatusCode::OK, "other principals go on");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        t.call("rival", Method::GET, path, None).await.0,
        StatusCode::OK,
        "recovered after Retry-After"
    );
    assert!(
        metric(&t, "tandem_http_requests_refused_total{dc=\"dc-a\",reason=\"principal_rate\"}").await >= 1.0
    );

    // Per address: every principal from 127.0.0.2 shares one allowance; 127.0.0.1 does not.
    // The same [limits] table, its rate keys moved from principals to addresses.
    let text = std::fs::read_to_string(&t.config)
        .unwrap()
        .replace("requests_per_second_per_principal = 1", "requests_per_second_per_address = 1")
        .replace("requests_burst_per_principal = 40", "requests_burst_per_address = 3");
    std::fs::write(&t.config, text).unwrap();
    assert_eq!(t.call("admin", Method::POST, "/v1/admin/reload", Some(json!({}))).await.0, StatusCode::OK);
    let other = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let from_other = |who: &'static str| {
        let (other, t) = (&other, &t);
        async move {
            other.get(format!("{}{path}", t.base)).bearer_auth(t.token(who).unwrap()).send().await.unwrap()
        }
    };
    for who in ["rival", "orders", "reader"] {
        assert_eq!(from_other(who).await.status(), StatusCode::OK, "{who}: within the burst of 3");
    }
    let r = from_other("admin").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "the address's burst is spent, whoever asks");
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(t.call("rival", Method::GET, path, None).await.0, StatusCode::OK, "127.0.0.1 has its own");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(from_other("rival").await.status(), StatusCode::OK, "recovered");
    assert!(
        metric(&t, "tandem_http_requests_refused_total{dc=\"dc-a\",reason=\"address_rate\"}").await >= 1.0
    );
    t.stop().await;
}
