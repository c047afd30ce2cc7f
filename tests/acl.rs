//! Access control against a real node (RocksDB on disk, HTTP on loopback): every endpoint
//! × {no token, unknown token, read token, write token of another namespace, write token,
//! admin} gives the expected status, and a refused request changes nothing; other headers
//! grant nothing; expiry, revocation by reload, the bootstrap token, and the refusal to
//! start exposed without an ACL decision. `acl/owners.rs`: instance ownership by principal;
//! `acl/limits.rs`: namespace quotas and request rates; `acl/audit.rs`: the audit log;
//! `acl/https.rs`: HTTPS on the client API and client certificates as principals.

#[path = "acl/audit.rs"]
mod audit;
mod common;
#[path = "acl/https.rs"]
mod https;
#[path = "acl/limits.rs"]
mod limits;
#[path = "acl/owners.rs"]
mod owners;

use std::path::Path;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tandem::acl::tokens::TokenFile;
use tandem::config::Config;
use tandem::node::Node;

const POLICIES: &str = r#"
[acl]
enabled = true

[[acl.policies]]
name = "reader"
rules = [{ namespace = "default", read = true }]

[[acl.policies]]
name = "team-b"
rules = [{ namespace = "team-b", read = true, write = true }]

[[acl.policies]]
name = "orders"
rules = [{ namespace = "default", service_prefix = "orders", read = true, write = true }]
"#;

/// Who calls, in the matrix's column order.
const WHO: [&str; 6] = ["none", "unknown", "reader", "team-b", "orders", "admin"];

pub(crate) struct Acl {
    _dir: tempfile::TempDir,
    pub(crate) config: std::path::PathBuf,
    node: Option<Node>,
    pub(crate) http: reqwest::Client,
    pub(crate) base: String,
    pub(crate) tokens: Vec<(String, Option<String>)>,
}

/// Tokens besides the matrix's: another principal with the `orders` policy, and two tokens
/// that share the principal `orders-ci` (a rotation).
const EXTRA: [(&str, &str, Option<&str>); 3] =
    [("rival", "orders", None), ("ci-1", "orders", Some("orders-ci")), ("ci-2", "orders", Some("orders-ci"))];

impl Acl {
    async fn start() -> Acl {
        Acl::start_with("").await
    }

    /// A node with the matrix's policies and tokens, and `extra` appended to its config.
    pub(crate) async fn start_with(extra: &str) -> Acl {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("dc-a");
        let config = dir.path().join("dc-a.toml");
        std::fs::write(
            &config,
            format!(
                "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:0\"\n{POLICIES}\n{extra}",
                data.display()
            ),
        )
        .unwrap();
        let cfg = Config::load(&config).unwrap();
        std::fs::create_dir_all(&data).unwrap();
        std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let mut file = TokenFile::default();
        let mut tokens =
            vec![("none".to_owned(), None), ("unknown".to_owned(), Some(format!("tdm_{}", "0".repeat(64))))];
        for who in &WHO[2..] {
            let policy = if *who == "admin" { "admin" } else { who };
            let (_, secret) = file.create(vec![policy.into()], String::new(), 0, None);
            tokens.push(((*who).to_owned(), Some(secret)));
        }
        for (who, policy, principal) in EXTRA {
            let (_, secret) = file.create(vec![policy.into()], String::new(), 0, None);
            file.tokens.last_mut().unwrap().principal = principal.map(Into::into);
            tokens.push((who.to_owned(), Some(secret)));
        }
        file.store(&cfg.acl.tokens_path(&cfg.data_dir)).unwrap();
        let node = Node::start(cfg, Some(config.clone())).await.unwrap();
        let base = format!("http://{}", node.http_addr());
        Acl { _dir: dir, config, node: Some(node), http: reqwest::Client::new(), base, tokens }
    }

    /// Stops the node and starts it again on the same data dir and config.
    pub(crate) async fn restart(&mut self) {
        self.node.take().unwrap().shutdown().await;
        let node = Node::start(Config::load(&self.config).unwrap(), Some(self.config.clone())).await.unwrap();
        self.base = format!("http://{}", node.http_addr());
        self.node = Some(node);
    }

    pub(crate) async fn stop(mut self) {
        self.node.take().unwrap().shutdown().await;
    }

    /// The public id of `who`'s token.
    pub(crate) fn id_of(&self, who: &str) -> String {
        let cfg = Config::load(&self.config).unwrap();
        let hash = hex::encode(tandem::acl::tokens::hash_secret(self.token(who).unwrap()));
        let file = TokenFile::load(&cfg.acl.tokens_path(&cfg.data_dir)).unwrap();
        file.tokens.into_iter().find(|e| e.sha256 == hash).unwrap().id
    }

    pub(crate) fn token(&self, who: &str) -> Option<&str> {
        self.tokens.iter().find(|(w, _)| w == who).and_then(|(_, t)| t.as_deref())
    }

    pub(crate) async fn call(
        &self,
        who: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = self.token(who) {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let v = resp.json::<Value>().await.unwrap_or(Value::Null);
        (status, v)
    }

    /// What the node holds, as the admin sees it: any refused call must leave it as it was.
    async fn state(&self) -> Value {
        let (_, a) = self.call("admin", Method::GET, "/v1/services/default/orders?dc=all", None).await;
        let (_, b) = self.call("admin", Method::GET, "/v1/services/team-b/orders?dc=all", None).await;
        json!([a["instances"], b["instances"]])
    }
}

pub(crate) fn reg(ns: &str, id: &str) -> Value {
    json!({"namespace": ns, "service": "orders", "instance_id": id, "address": "10.0.0.7", "port": 8080, "ttl_ms": 60000})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_each_principal_as_its_scopes_say() {
    let mut t = Acl::start().await;
    // The instances the writes act on, each registered by the token that writes it below
    // (an owned instance refuses other principals: acl/owners.rs).
    assert_eq!(
        t.call("orders", Method::POST, "/v1/register", Some(reg("default", "o1"))).await.0,
        StatusCode::OK
    );
    assert_eq!(
        t.call("team-b", Method::POST, "/v1/register", Some(reg("team-b", "b1"))).await.0,
        StatusCode::OK
    );

    use StatusCode as S;
    let (u, f, ok) = (S::UNAUTHORIZED, S::FORBIDDEN, S::OK);
    let batch = json!({"instances": [{"service": "orders", "instance_id": "o1"}]});
    let status = json!({"status": "draining"});
    // (method, path, body, expected per WHO)
    let matrix: Vec<(Method, &str, Option<Value>, [StatusCode; 6])> = vec![
        (Method::POST, "/v1/register", Some(reg("default", "o2")), [u, u, f, f, ok, ok]),
        (Method::POST, "/v1/register", Some(reg("team-b", "b2")), [u, u, f, ok, f, ok]),
        (Method::PUT, "/v1/heartbeat/default/orders/o1", None, [u, u, f, f, ok, ok]),
        (Method::POST, "/v1/heartbeats", Some(batch), [u, u, f, f, ok, ok]),
        (
            Method::POST,
            "/v1/registrations",
            Some(json!({"instances": [reg("default", "o3")]})),
            [u, u, f, f, ok, ok],
        ),
        // Every entry needs its scope: orders may not write team-b, nor team-b default.
        (
            Method::POST,
            "/v1/registrations",
            Some(json!({"instances": [reg("default", "o4"), reg("team-b", "b4")]})),
            [u, u, f, f, f, ok],
        ),
        (Method::PUT, "/v1/instances/default/orders/o1/status", Some(status), [u, u, f, f, ok, ok]),
        (Method::GET, "/v1/services/default/orders", None, [u, u, ok, f, ok, ok]),
        (Method::GET, "/v1/services/default/%6Frders", None, [u, u, ok, f, ok, ok]),
        (Method::GET, "/v1/services/team-b/orders", None, [u, u, f, ok, f, ok]),
        (Method::GET, "/v1/services?namespace=default", None, [u, u, ok, f, f, ok]),
        (Method::GET, "/v1/status", None, [u, u, f, f, f, ok]),
        (Method::GET, "/metrics", None, [u, u, f, f, f, ok]),
        (Method::POST, "/v1/admin/retire-dc", Some(json!({"dc": "dc-z"})), [u, u, f, f, f, ok]),
        (Method::POST, "/v1/admin/unretire-dc", Some(json!({"dc": "dc-z"})), [u, u, f, f, f, ok]),
        (Method::GET, "/v1/no-such-endpoint", None, [u, u, f, f, f, S::NOT_FOUND]),
        (Method::DELETE, "/v1/instances/default/orders/o1", None, [u, u, f, f, ok, S::NOT_FOUND]),
    ];
    for (method, path, body, want) in matrix {
        for (who, want) in WHO.iter().zip(want) {
            let before = t.state().await;
            let (got, answer) = t.call(who, method.clone(), path, body.clone()).await;
            assert_eq!(got, want, "{method} {path} as {who}: {answer}");
            match got {
                S::UNAUTHORIZED => assert_eq!(answer["error"]["code"], "unauthenticated"),
                S::FORBIDDEN => {
                    assert_eq!(answer["error"]["code"], "forbidden");
                    assert!(answer["error"]["message"].as_str().unwrap().contains("lacks"), "{answer}");
                }
                _ => {}
            }
            if got == S::UNAUTHORIZED || got == S::FORBIDDEN {
                assert_eq!(t.state().await, before, "a refused {method} {path} as {who} changed nothing");
            }
        }
    }
    // The refusals were counted.
    let metrics = t
        .http
        .get(format!("{}/metrics", t.base))
        .bearer_auth(t.token("admin").unwrap())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |name: &str| -> u64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    assert!(count("tandem_http_requests_unauthenticated_total") >= 30, "{metrics}");
    assert!(count("tandem_http_requests_forbidden_total") >= 20, "{metrics}");
    // An orderly stop: RocksDB must not be torn down by the process exit under a live
    // committer thread.
    t.node.take().unwrap().shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_other_header_grants_anything_and_revoked_or_expired_tokens_stop_working() {
    let mut t = Acl::start().await;
    let reader = t.token("reader").unwrap().to_owned();
    for (h, v) in [
        ("user-agent", "Nacos-Server"),
        ("x-forwarded-for", "127.0.0.1"),
        ("x-real-ip", "127.0.0.1"),
        ("cookie", "token=admin"),
        ("x-tandem-admin", "1"),
        ("authorization", "Basic YWRtaW46YWRtaW4="),
        ("authorization", "Bearer"),
        ("x-tandem-token", ""),
    ] {
        let r =
            t.http.get(format!("{}/v1/services/default/orders", t.base)).header(h, v).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{h}: {v}");
    }
    let r = t
        .http
        .get(format!("{}/v1/services/default/orders", t.base))
        .header("x-tandem-token", &reader)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "X-Tandem-Token works like Authorization: Bearer");

    // Revoke the reader (remove its line, reload); add an expired token.
    let cfg = Config::load(&t.config).unwrap();
    let path = cfg.acl.tokens_path(&cfg.data_dir);
    let mut file = TokenFile::load(&path).unwrap();
    file.tokens.retain(|e| e.policies != ["reader"]);
    let (_, expired) = file.create(vec!["admin".into()], String::new(), 0, Some(1));
    file.store(&path).unwrap();
    assert_eq!(t.call("admin", Method::POST, "/v1/admin/reload", Some(json!({}))).await.0, StatusCode::OK);
    assert_eq!(
        t.call("reader", Method::GET, "/v1/services/default/orders", None).await.0,
        StatusCode::UNAUTHORIZED
    );
    t.tokens.push(("expired".into(), Some(expired)));
    let (got, answer) = t.call("expired", Method::GET, "/v1/status", None).await;
    assert_eq!(got, StatusCode::UNAUTHORIZED);
    assert_eq!(answer["error"]["message"], "token expired");
    t.node.take().unwrap().shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_start_with_acls_on_makes_a_bootstrap_admin_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = single_config(dir.path(), "dc-a");
    cfg.acl.enabled = Some(true);
    let node = Node::start(cfg.clone(), None).await.unwrap();
    let secret_file = cfg.data_dir.join(tandem::acl::tokens::BOOTSTRAP_FILE);
    let secret = std::fs::read_to_string(&secret_file).unwrap().trim().to_owned();
    let c = client(&node).with_token(&secret);
    assert!(c.status().await.is_ok(), "the bootstrap token is an admin token");
    assert_eq!(client(&node).status().await.unwrap_err().status(), Some(401));
    let tokens = std::fs::read_to_string(cfg.acl.tokens_path(&cfg.data_dir)).unwrap();
    assert!(!tokens.contains(&secret[4..]), "the tokens file holds hashes only");
    node.shutdown().await;
}

#[tokio::test]
async fn an_exposed_node_without_an_acl_decision_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    // Refused before anything is opened or bound.
    let cfg = Config::single("dc-a", dir.path().join("dc-a"), "0.0.0.0:0".parse().unwrap());
    let err = Node::start(cfg.clone(), None).await.err().expect("refused").to_string();
    assert!(err.contains("[acl] enabled is not set"), "{err}");
    // Deciding either way is accepted (checked without binding: the rule alone).
    let mut off = cfg.clone();
    off.acl.enabled = Some(false);
    assert!(tandem::acl::check_exposure(&off).is_ok());
    assert!(!Path::new(&cfg.data_dir).exists(), "nothing was created");
}

#[tokio::test]
async fn tandem_dev_says_at_start_that_acls_are_off() {
    use tokio::io::AsyncBufReadExt as _;
    let dir = tempfile::tempdir().unwrap();
    // Two consecutive ports each (dc-a, dc-b); a pair bound and freed just before.
    let (http, repl) = (free_tcp_port(), free_udp_port());
    let mut child = tokio::process::Command::new(tandem_bin())
        .args(["dev", "--dir"])
        .arg(dir.path())
        .args(["--http-port", &http.to_string(), "--repl-port", &repl.to_string(), "--nodes", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let said = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while let Ok(Some(line)) = out.next_line().await {
            if line.contains("ACLs are off") {
                return Some(line);
            }
        }
        None
    })
    .await;
    child.kill().await.unwrap();
    let line = said.expect("tandem dev printed its banner in time").expect("it says ACLs are off");
    assert!(line.contains("loopback only"), "{line}");
}
