//! The console's access rules with ACLs on: its static files load without a token (they
//! hold no data), every call it makes is judged like any client's, and the namespaces it
//! offers are only those the token may read. (The browser test, tests/console.rs, runs
//! with ACLs off.)

mod common;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tandem::acl::tokens::TokenFile;
use tandem::config::Config;
use tandem::node::Node;

const POLICIES: &str = r#"
[acl]
enabled = true

[[acl.policies]]
name = "team-a"
rules = [{ namespace = "team-a", read = true, write = true }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_loads_without_a_token_and_reads_only_what_the_token_may() {
    let dir = tempfile::tempdir().unwrap();
    let (data, config) = (dir.path().join("dc-a"), dir.path().join("dc-a.toml"));
    let toml =
        format!("dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:0\"\n{POLICIES}", data.display());
    std::fs::write(&config, toml).unwrap();
    let cfg = Config::load(&config).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let mut file = TokenFile::default();
    let (_, team_a) = file.create(vec!["team-a".into()], String::new(), 0, None);
    let (_, admin) = file.create(vec!["admin".into()], String::new(), 0, None);
    file.store(&cfg.acl.tokens_path(&cfg.data_dir)).unwrap();
    let node = Node::start(cfg, Some(config)).await.unwrap();
    let base = format!("http://{}", node.http_addr());
    let h = reqwest::Client::new();

    // The page and its script: no token needed, and only the node's own code may run.
    for path in ["/ui/", "/ui/app.js", "/ui/app.css"] {
        let resp = h.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let csp = resp.headers()["content-security-policy"].to_str().unwrap().to_owned();
        assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
    }
    // Its data: refused without a token.
    for path in ["/v1/ui/services", "/v1/ui/events", "/v1/ui/drills"] {
        let resp = h.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    // Two namespaces hold a service each.
    for ns in ["team-a", "team-b"] {
        let body =
            json!({"namespace": ns, "service": "web", "address": "10.0.0.1", "port": 80, "persistent": true});
        let resp =
            h.post(format!("{base}/v1/register")).bearer_auth(&admin).json(&body).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{ns}");
    }
    let services = |ns: &str, token: &str| {
        h.get(format!("{base}/v1/ui/services?namespace={ns}")).bearer_auth(token.to_owned()).send()
    };
    let resp = services("team-a", &team_a).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["namespaces"], json!(["team-a"]), "only the namespaces the token may read: {v}");
    assert_eq!(v["services"][0]["dcs"]["dc-a"], json!({"healthy": 1, "total": 1, "stale": false}), "{v}");
    assert_eq!(
        services("team-b", &team_a).await.unwrap().status(),
        StatusCode::FORBIDDEN,
        "another namespace"
    );
    let v: Value = services("team-a", &admin).await.unwrap().json().await.unwrap();
    assert_eq!(v["namespaces"], json!(["team-a", "team-b"]), "{v}");
    // The drill reports need `status`, which team-a's token lacks.
    let resp = h.get(format!("{base}/v1/ui/drills")).bearer_auth(&team_a).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    // The event stream answers any valid token (it carries indexes only) at once.
    let mut resp = h.get(format!("{base}/v1/ui/events")).bearer_auth(&team_a).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let first = tokio::time::timeout(std::time::Duration::from_secs(5), resp.chunk()).await.unwrap().unwrap();
    let first = String::from_utf8(first.unwrap().to_vec()).unwrap();
    assert!(first.starts_with("data: {\"index\":"), "{first}");
    drop(resp);
    node.shutdown().await;
}
