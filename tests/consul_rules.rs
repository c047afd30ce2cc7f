//! The rules of the Consul and Nacos front ends (`tandem::compat`) that their clients cannot
//! observe, against one in-process node: a `pass` of a passing check writes nothing and a
//! change of status is one event; a lapsed TTL is one event, then the service is reaped;
//! prepared queries and TTL checks survive a restart; Consul's and Nacos's ways of
//! presenting a token authenticate; what tandem does not support is refused plainly.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use reqwest::header::CONTENT_TYPE;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tandem::acl::tokens::TokenFile;
use tandem::config::Config;
use tandem::node::Node;

/// Plain HTTP calls against one node.
struct Api {
    h: reqwest::Client,
    base: String,
}

impl Api {
    fn of(node: &Node) -> Api {
        Api { h: reqwest::Client::new(), base: format!("http://{}", node.http_addr()) }
    }

    async fn put(&self, path: &str, body: Option<&Value>) -> (StatusCode, String) {
        let mut req = self.h.put(format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.unwrap();
        (resp.status(), resp.text().await.unwrap())
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let resp = self.h.get(format!("{}{path}", self.base)).send().await.unwrap();
        (resp.status(), resp.json().await.unwrap_or(Value::Null))
    }

    /// The DC's own event seq (`log.last_seq` of `/v1/status`): it moves by one per
    /// durable own event.
    async fn own_seq(&self) -> u64 {
        let (status, st) = self.get("/v1/status").await;
        assert_eq!(status, StatusCode::OK, "{st}");
        st["log"]["last_seq"].as_u64().unwrap()
    }

    /// Waits (bounded) until the own seq is `want`, then checks that it stays there a
    /// little while (a write that lands late shows).
    async fn seq_settles_at(&self, want: u64, what: &str) {
        let mut last = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while tokio::time::Instant::now() < deadline {
            last = self.own_seq().await;
            if last == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(last, want, "{what}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(self.own_seq().await, want, "{what} (and stays)");
    }

    /// `/v1/health/service/<svc>`: its entries.
    async fn health(&self, svc: &str) -> Vec<Value> {
        let (status, v) = self.get(&format!("/v1/health/service/{svc}")).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v.as_array().cloned().unwrap_or_default()
    }

    /// The status of check `check` of service `svc` as `/v1/health/service` shows it.
    async fn check_status(&self, svc: &str, check: &str) -> Option<String> {
        self.health(svc)
            .await
            .iter()
            .flat_map(|e| e["Checks"].as_array().cloned().unwrap_or_default())
            .find_map(|c| {
                (c["CheckID"] == check).then(|| c["Status"].as_str().unwrap_or_default().to_owned())
            })
    }
}

/// A Consul registration of `id` (service `web`) with one TTL check, passing.
fn consul_service(id: &str, ttl: &str, extra_check: Value) -> Value {
    let mut check = json!({"TTL": ttl, "Status": "passing"});
    check.as_object_mut().unwrap().extend(extra_check.as_object().cloned().unwrap_or_default());
    json!({"Name": "web", "ID": id, "Address": "10.0.0.1", "Port": 8080, "Check": check})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_of_a_passing_check_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let api = Api::of(&node);
    let reg = consul_service("web1", "10s", json!({}));
    assert_eq!(api.put("/v1/agent/service/register", Some(&reg)).await.0, StatusCode::OK);
    let s0 = api.own_seq().await;
    assert!(s0 >= 1, "the registration is an event");

    let pass = "/v1/agent/check/pass/service:web1";
    let warn = "/v1/agent/check/warn/service:web1";
    for _ in 0..50 {
        assert_eq!(api.put(pass, None).await.0, StatusCode::OK);
    }
    api.seq_settles_at(s0, "50 passes of a passing check write nothing").await;
    assert_eq!(api.check_status("web", "service:web1").await.as_deref(), Some("passing"));

    assert_eq!(api.put(warn, None).await.0, StatusCode::OK);
    api.seq_settles_at(s0 + 1, "a warn of a passing check is one event").await;
    assert_eq!(api.check_status("web", "service:web1").await.as_deref(), Some("warning"));
    assert_eq!(api.put(warn, None).await.0, StatusCode::OK);
    api.seq_settles_at(s0 + 1, "a second warn writes nothing").await;
    assert_eq!(api.put(pass, None).await.0, StatusCode::OK);
    api.seq_settles_at(s0 + 2, "a pass of a warning check is one event").await;
    assert_eq!(api.check_status("web", "service:web1").await.as_deref(), Some("passing"));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_ttl_turns_critical_once_then_the_service_is_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let api = Api::of(&node);
    let reg = consul_service("web1", "1s", json!({"DeregisterCriticalServiceAfter": "2s"}));
    assert_eq!(api.put("/v1/agent/service/register", Some(&reg)).await.0, StatusCode::OK);
    let s0 = api.own_seq().await;

    // No pass: the TTL lapses after 1 s (the timer ticks every 250 ms).
    eventually(Duration::from_secs(4), "the lapsed check reads critical", || async {
        api.check_status("web", "service:web1").await.as_deref() == Some("critical")
    })
    .await;
    // One event for the lapse, not one per tick; the reap is 2 s after it.
    api.seq_settles_at(s0 + 1, "a lapse is one event").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(api.own_seq().await, s0 + 1, "a critical check writes nothing more until its reap");

    eventually(Duration::from_secs(5), "the critical service is reaped", || async {
        api.health("web").await.is_empty()
    })
    .await;
    api.seq_settles_at(s0 + 2, "the reap is one event").await;
    let (_, agent) = api.get("/v1/agent/services").await;
    assert_eq!(agent, json!({}), "the agent no longer holds it");
    let metrics = api.h.get(format!("{}/metrics", api.base)).send().await.unwrap().text().await.unwrap();
    assert_eq!(metric_sum(&metrics, "tandem_consul_ttl_lapses_total", &[]), 1.0, "one lapse counted");
    assert_eq!(metric_sum(&metrics, "tandem_consul_services_reaped_total", &[]), 1.0);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_ids_and_service_ids_are_the_dcs() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let api = Api::of(&node);
    let reg = |name: &str, id: &str| {
        let mut r = consul_service(id, "1s", json!({"CheckID": "shared"}));
        r["Name"] = json!(name);
        r
    };
    assert_eq!(api.put("/v1/agent/service/register", Some(&reg("web", "web1"))).await.0, StatusCode::OK);
    // Another service may take neither the check id nor the service id.
    let (s, body) = api.put("/v1/agent/service/register", Some(&reg("api", "api1"))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("held by service ID \"web1\""), "{body}");
    let mut other = reg("api", "web1");
    other["Check"]["CheckID"] = json!("api-check");
    let (s, body) = api.put("/v1/agent/service/register", Some(&other)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("deregister it first"), "{body}");
    // web1's check is still timed: without a pass it lapses.
    eventually(Duration::from_secs(4), "web1's check lapses", || async {
        api.check_status("web", "shared").await.as_deref() == Some("critical")
    })
    .await;
    assert!(api.health("api").await.is_empty(), "nothing of api was registered");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_queries_and_ttl_checks_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = single_config(dir.path(), "dc-a");
    let node = Node::start(cfg.clone(), None).await.unwrap();
    let api = Api::of(&node);
    let resp = api
        .h
        .post(format!("{}/v1/query", api.base))
        .json(&json!({"Name": "q1", "Service": {"Service": "web"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let id = resp.json::<Value>().await.unwrap()["ID"].as_str().unwrap().to_owned();
    let reg = consul_service("web1", "2s", json!({}));
    assert_eq!(api.put("/v1/agent/service/register", Some(&reg)).await.0, StatusCode::OK);
    node.shutdown().await;

    let node = Node::start(cfg, None).await.unwrap();
    let api = Api::of(&node);
    // Within the check's TTL of the start: it still passes, the query answers it.
    for by in [id.as_str(), "q1"] {
        let (status, v) = api.get(&format!("/v1/query/{by}/execute")).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        let nodes = v["Nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 1, "query {by}: {v}");
        assert_eq!(nodes[0]["Service"]["ID"], "web1", "query {by}: {v}");
    }
    // No pass since the restart: the TTL table was rebuilt from the record, so it lapses.
    eventually(Duration::from_secs(5), "the restored TTL check lapses", || async {
        api.check_status("web", "service:web1").await.as_deref() == Some("critical")
    })
    .await;
    let (_, v) = api.get("/v1/query/q1/execute").await;
    assert_eq!(v["Nodes"], json!([]), "a query never answers a critical instance: {v}");
    node.shutdown().await;
}

const ACL_POLICIES: &str = r#"
[acl]
enabled = true

[[acl.policies]]
name = "web-writer"
rules = [{ namespace = "default", service_prefix = "web", read = true, write = true }]

[[acl.policies]]
name = "reader"
rules = [{ namespace = "default", read = true }]
"#;

/// A node with ACLs on and two tokens: (node, writer of `web`, reader of `default`).
async fn acl_node(dir: &Path) -> (Node, String, String) {
    let data = dir.join("dc-a");
    let config = dir.join("dc-a.toml");
    let toml = format!(
        "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:0\"\n{ACL_POLICIES}",
        data.display()
    );
    std::fs::write(&config, toml).unwrap();
    let cfg = Config::load(&config).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let mut file = TokenFile::default();
    let (_, writer) = file.create(vec!["web-writer".into()], String::new(), 0, None);
    let (_, reader) = file.create(vec!["reader".into()], String::new(), 0, None);
    file.store(&cfg.acl.tokens_path(&cfg.data_dir)).unwrap();
    (Node::start(cfg, Some(config)).await.unwrap(), writer, reader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_and_nacos_tokens_authenticate() {
    let dir = tempfile::tempdir().unwrap();
    let (node, writer, reader) = acl_node(dir.path()).await;
    let api = Api::of(&node);
    let register = |id: &str, path: String, token: Option<&str>| {
        let mut req = api.h.put(format!("{}{path}", api.base)).json(&consul_service(id, "10s", json!({})));
        if let Some(t) = token {
            req = req.header("X-Consul-Token", t);
        }
        async move {
            let resp = req.send().await.unwrap();
            (resp.status(), resp.text().await.unwrap())
        }
    };
    let path = "/v1/agent/service/register".to_owned();
    let (s, b) = register("web1", path.clone(), Some(&writer)).await;
    assert_eq!(s, StatusCode::OK, "X-Consul-Token: {b}");
    let (s, b) = register("web2", format!("{path}?token={writer}"), None).await;
    assert_eq!(s, StatusCode::OK, "?token=: {b}");
    let (s, b) = register("web3", path.clone(), None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "no token: {b}");
    let (s, b) = register("web3", path.clone(), Some(&reader)).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "the reader registers: {b}");
    // A token in tandem's own header wins over X-Consul-Token.
    let resp = api
        .h
        .put(format!("{}{path}", api.base))
        .bearer_auth(&reader)
        .header("X-Consul-Token", &writer)
        .json(&consul_service("web3", "10s", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN, "the bearer token decides");

    let health = |token: Option<&str>| {
        let mut req = api.h.get(format!("{}/v1/health/service/web", api.base));
        if let Some(t) = token {
            req = req.header("X-Consul-Token", t);
        }
        async move {
            let resp = req.send().await.unwrap();
            (resp.status(), resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (s, v) = health(Some(&reader)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let mut ids: Vec<&str> =
        v.as_array().unwrap().iter().filter_map(|e| e["Service"]["ID"].as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["web1", "web2"]);
    assert_eq!(health(None).await.0, StatusCode::UNAUTHORIZED);

    // Nacos: `accessToken` in the query, or in a form body beside the other parameters.
    let nacos = format!("{}/nacos/v1/ns/instance", api.base);
    let resp = api
        .h
        .post(format!("{nacos}?serviceName=web&ip=10.0.0.9&port=80&accessToken={writer}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.text().await.unwrap(), "ok", "accessToken in the query");
    let form = |token: &str| {
        let body = format!("serviceName=web&ip=10.0.0.10&port=80&accessToken={token}");
        api.h.post(&nacos).header(CONTENT_TYPE, "application/x-www-form-urlencoded").body(body).send()
    };
    let resp = form(&writer).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.text().await.unwrap(), "ok", "accessToken in a form body");
    assert_eq!(form(&reader).await.unwrap().status(), StatusCode::FORBIDDEN, "the reader registers");
    // A beat renews a lease: it needs write, as tandem's own heartbeat does.
    let beat = |ip: &str, token: &str| {
        let url = format!("{nacos}/beat?serviceName=web&ip={ip}&port=80&accessToken={token}");
        api.h.put(url).send()
    };
    assert_eq!(beat("10.0.0.9", &reader).await.unwrap().status(), StatusCode::FORBIDDEN, "the reader beats");
    // Refused for lacking write, not for not owning the instance: one nobody owns too.
    let resp = beat("10.9.9.9", &reader).await.unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN, "the reader beats: {}", resp.text().await.unwrap());
    let resp = beat("10.0.0.9", &writer).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], 10200, "the writer's beat renews");
    let resp = api.h.post(format!("{nacos}?serviceName=web&ip=10.0.0.11&port=80")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "no token");
    // A form body past the body limit is refused as too large, not read as empty.
    let big = format!("serviceName=web&ip=10.0.0.12&port=80&pad={}", "x".repeat(70 * 1024));
    let resp = api
        .h
        .post(&nacos)
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE, "an oversized form body");
    // The form body reached the handler whole: both Nacos instances are listed.
    let list = format!("{}/nacos/v1/ns/instance/list?serviceName=web&accessToken={reader}", api.base);
    let v: Value = api.h.get(list).send().await.unwrap().json().await.unwrap();
    let mut ips: Vec<&str> = v["hosts"].as_array().unwrap().iter().filter_map(|h| h["ip"].as_str()).collect();
    ips.sort_unstable();
    assert_eq!(ips, ["10.0.0.1", "10.0.0.1", "10.0.0.10", "10.0.0.9"], "{v}");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_checks_and_filters_are_refused_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let api = Api::of(&node);
    let plain_400 = |resp: reqwest::Response, what: &'static str| async move {
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{what}");
        let ct = resp.headers().get(CONTENT_TYPE).and_then(|c| c.to_str().ok()).unwrap_or("").to_owned();
        assert!(ct.starts_with("text/plain"), "{what}: content-type {ct}");
        resp.text().await.unwrap()
    };
    let register =
        |body: Value| api.h.put(format!("{}/v1/agent/service/register", api.base)).json(&body).send();

    let http_check = json!({"Name": "web", "ID": "web1", "Port": 80,
        "Check": {"HTTP": "http://127.0.0.1:1/health", "Interval": "10s"}});
    let body = plain_400(register(http_check).await.unwrap(), "an HTTP check").await;
    assert!(body.contains("TTL"), "{body}");
    let no_ttl = json!({"Name": "web", "ID": "web1", "Port": 80, "Checks": [{"Interval": "10s"}]});
    let body = plain_400(register(no_ttl).await.unwrap(), "a check without a TTL").await;
    assert!(body.contains("TTL"), "{body}");
    assert_eq!(api.health("web").await, Vec::<Value>::new(), "nothing was registered");

    for (id, team) in [("web1", "core"), ("web2", "edge")] {
        let mut reg = consul_service(id, "10s", json!({}));
        reg["Meta"] = json!({"team": team});
        reg["Port"] = json!(81);
        assert_eq!(register(reg).await.unwrap().status(), StatusCode::OK);
    }
    let filtered = |f: &str| {
        let q: String = form_urlencoded::Serializer::new(String::new()).append_pair("filter", f).finish();
        api.h.get(format!("{}/v1/health/service/web?{q}", api.base)).send()
    };
    let refused =
        [("Service.Port > 80", "supports =="), ("Service.Nope == x", "selector"), ("Service.ID ==", "value")];
    for (f, why) in refused {
        let body = plain_400(filtered(f).await.unwrap(), "a filter tandem cannot apply").await;
        assert!(body.contains(why), "{f}: {body}");
    }
    let resp = filtered("Service.Meta.team == core").await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let v: Value = resp.json().await.unwrap();
    let ids: Vec<&str> = v.as_array().unwrap().iter().filter_map(|e| e["Service"]["ID"].as_str()).collect();
    assert_eq!(ids, ["web1"], "{v}");
    node.shutdown().await;
}
