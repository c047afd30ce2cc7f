//! Instance ownership by principal: only the principal that registered an instance (or an
//! admin) may re-register, change, deregister or renew it; the owner survives a restart on
//! the same data dir; two principals racing for one new id cannot both win; tokens that
//! share a principal share ownership (rotation); a deregistration frees the id.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::{reg, Acl};

/// The address discovery shows for `default/orders/<id>`, as the admin sees it.
async fn address_of(t: &Acl, id: &str) -> Option<String> {
    let (_, a) = t.call("admin", Method::GET, "/v1/services/default/orders", None).await;
    a["instances"].as_array()?.iter().find(|i| i["instance_id"] == id).map(|i| i["address"].to_string())
}

fn moved(id: &str) -> Value {
    let mut r = reg("default", id);
    r["address"] = json!("10.6.6.6");
    r
}

/// Every write `who` may not make on `id`: each is 403 naming the owner, and nothing changes.
async fn refused_everything(t: &Acl, who: &str, id: &str, owner_hint: &str) {
    let before = address_of(t, id).await;
    assert!(before.is_some(), "{id} is registered");
    let path = format!("/v1/instances/default/orders/{id}");
    let batch = json!({"instances": [{"service": "orders", "instance_id": id}]});
    let calls: [(Method, String, Option<Value>); 6] = [
        (Method::POST, "/v1/register".into(), Some(moved(id))),
        (Method::POST, "/v1/registrations".into(), Some(json!({"instances": [moved("free"), moved(id)]}))),
        (Method::PUT, format!("{path}/status"), Some(json!({"status": "out_of_service"}))),
        (Method::DELETE, path.clone(), None),
        (Method::PUT, format!("/v1/heartbeat/default/orders/{id}"), None),
        (Method::POST, "/v1/heartbeats".into(), Some(batch)),
    ];
    for (method, p, body) in calls {
        let (got, answer) = t.call(who, method.clone(), &p, body).await;
        assert_eq!(got, StatusCode::FORBIDDEN, "{method} {p} as {who}: {answer}");
        assert_eq!(answer["error"]["code"], "forbidden");
        let msg = answer["error"]["message"].as_str().unwrap();
        assert!(msg.contains("owned by principal") && msg.contains(owner_hint), "{msg}");
        assert_eq!(address_of(t, id).await, before, "a refused {method} {p} changed nothing");
    }
    assert_eq!(address_of(t, "free").await, None, "a refused batch wrote none of its entries");
    let (_, a) = t.call("admin", Method::GET, "/v1/services/default/orders", None).await;
    let inst = a["instances"].as_array().unwrap().iter().find(|i| i["instance_id"] == id).unwrap().clone();
    assert_eq!(inst["status"], "up", "{inst}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_or_an_admin_may_change_an_instance_and_it_survives_a_restart() {
    let mut t = Acl::start().await;
    let ok = StatusCode::OK;
    assert_eq!(t.call("orders", Method::POST, "/v1/register", Some(reg("default", "o1"))).await.0, ok);
    refused_everything(&t, "rival", "o1", "t-").await;
    // The owner may renew and re-register it.
    assert_eq!(t.call("orders", Method::PUT, "/v1/heartbeat/default/orders/o1", None).await.0, ok);
    assert_eq!(t.call("orders", Method::POST, "/v1/register", Some(reg("default", "o1"))).await.0, ok);

    // The owner is durable: after a restart on the same data dir it still decides.
    t.restart().await;
    refused_everything(&t, "rival", "o1", "t-").await;
    assert_eq!(t.call("orders", Method::PUT, "/v1/heartbeat/default/orders/o1", None).await.0, ok);
    // An admin may change it (and its re-registration makes the admin the owner).
    let status = Some(json!({"status": "draining"}));
    assert_eq!(t.call("admin", Method::PUT, "/v1/instances/default/orders/o1/status", status).await.0, ok);
    assert_eq!(t.call("admin", Method::POST, "/v1/register", Some(reg("default", "o1"))).await.0, ok);
    refused_everything(&t, "orders", "o1", "t-").await;
    // A deregistration frees the id: anyone with the scope may register it again.
    assert_eq!(t.call("admin", Method::DELETE, "/v1/instances/default/orders/o1", None).await.0, ok);
    assert_eq!(t.call("rival", Method::POST, "/v1/register", Some(reg("default", "o1"))).await.0, ok);
    refused_everything(&t, "orders", "o1", "t-").await;

    // Tokens sharing a principal share its instances (a rotated token keeps them).
    assert_eq!(t.call("ci-1", Method::POST, "/v1/register", Some(reg("default", "c1"))).await.0, ok);
    refused_everything(&t, "orders", "c1", "orders-ci").await;
    assert_eq!(t.call("ci-2", Method::PUT, "/v1/heartbeat/default/orders/c1", None).await.0, ok);
    assert_eq!(t.call("ci-2", Method::DELETE, "/v1/instances/default/orders/c1", None).await.0, ok);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_principals_racing_for_a_new_id_cannot_both_win() {
    let owner = Acl::start().await;
    let t = &owner;
    let races = (0..16).map(|i| async move {
        let id = format!("race-{i}");
        let (a, b) = tokio::join!(
            t.call("orders", Method::POST, "/v1/register", Some(moved(&id))),
            t.call("rival", Method::POST, "/v1/register", Some(reg("default", &id))),
        );
        (id, a.0, b.0)
    });
    for (id, a, b) in futures::future::join_all(races).await {
        let mut got = [a, b];
        got.sort();
        assert_eq!(got, [StatusCode::OK, StatusCode::FORBIDDEN], "{id}: exactly one principal owns it");
    }
    owner.stop().await;
}

/// Providers of one process that hold different tokens renew each with its own: the SDK's
/// heartbeat batcher groups instances by their token too. One group for both sent every
/// renewal with the first one's token, and the registry refused the batch (403) for the
/// instance the other principal owns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_with_different_tokens_in_one_process_renew_each_with_its_own() {
    use std::time::Duration;
    use tandem_client::sdk::{ClientConfig, InstanceSpec, Provider};
    let t = Acl::start().await;
    let cfg = |who: &str| {
        let mut c = ClientConfig::new([t.base.clone()]);
        c.token = t.token(who).map(tandem_client::client::Token::new);
        c.retry.initial = Duration::from_millis(50);
        c.retry.max = Duration::from_millis(200);
        c
    };
    let ttl = Duration::from_millis(1_600);
    let orders =
        Provider::register(cfg("orders"), InstanceSpec::new("orders", "10.0.0.7", 1).ttl(ttl)).await.unwrap();
    let team_b = Provider::register(
        cfg("team-b"),
        InstanceSpec::new("orders", "10.0.0.8", 2).namespace("team-b").ttl(ttl),
    )
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while [&orders, &team_b].iter().any(|p| p.state().heartbeats_ok < 3) {
        assert!(tokio::time::Instant::now() < deadline, "{:?} / {:?}", orders.state(), team_b.state());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for p in [&orders, &team_b] {
        assert_eq!(p.state().heartbeats_failed, 0, "{:?}", p.state());
    }
    drop((orders, team_b));
    t.stop().await;
}
