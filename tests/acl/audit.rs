//! The audit log: one JSON line per state change and admin call (register, a line per
//! entry of a batch of registrations, status,
//! deregister, reload, retire and unretire a DC, a token created with the command line),
//! with the principal's token id, the client address, the target and the outcome;
//! refusals (401, 403) sampled to `[audit] refusals_per_minute`; heartbeats not audited;
//! and no token secret anywhere in the file.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;
use tandem::audit::Record;
use tandem::config::Config;

use super::{reg, Acl};
use crate::common::eventually;

const AUDIT: &str = "\n[audit]\nrefusals_per_minute = 5\n";

fn lines(cfg: &Config) -> Vec<Record> {
    let text = std::fs::read_to_string(cfg.audit.path(&cfg.data_dir)).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_change_and_admin_call_is_audited_without_secrets() {
    let t = Acl::start_with(AUDIT).await;
    let cfg = Config::load(&t.config).unwrap();
    let ok = StatusCode::OK;
    let o1 = "/v1/instances/default/orders/o1";
    assert_eq!(t.call("orders", Method::POST, "/v1/register", Some(reg("default", "o1"))).await.0, ok);
    assert_eq!(t.call("orders", Method::PUT, "/v1/heartbeat/default/orders/o1", None).await.0, ok);
    // A batch: a line per registration; refused whole, one line for the request.
    let batch = json!({"instances": [reg("default", "o5"), reg("default", "o6")]});
    assert_eq!(t.call("orders", Method::POST, "/v1/registrations", Some(batch)).await.0, ok);
    let mut bad = reg("default", "o8");
    bad["port"] = json!(0);
    let batch = json!({"instances": [reg("default", "o7"), bad]});
    assert_eq!(
        t.call("orders", Method::POST, "/v1/registrations", Some(batch)).await.0,
        StatusCode::BAD_REQUEST
    );
    let draining = Some(json!({"status": "draining"}));
    assert_eq!(t.call("orders", Method::PUT, &format!("{o1}/status"), draining).await.0, ok);
    assert_eq!(t.call("rival", Method::DELETE, o1, None).await.0, StatusCode::FORBIDDEN);
    assert_eq!(
        t.call("unknown", Method::GET, "/v1/services/default/orders", None).await.0,
        StatusCode::UNAUTHORIZED
    );
    // A token made with the command line, then loaded by a reload.
    let created = tandem::acl::cli::token(tandem::acl::cli::TokenCommand::Create {
        config: t.config.clone(),
        policies: vec!["reader".into()],
        description: "audited".into(),
        expires: None,
        principal: None,
    });
    assert!(created.is_ok(), "{created:?}");
    assert_eq!(t.call("admin", Method::POST, "/v1/admin/reload", Some(json!({}))).await.0, ok);
    let dc_z = Some(json!({"dc": "dc-z"}));
    assert_eq!(t.call("admin", Method::POST, "/v1/admin/retire-dc", dc_z.clone()).await.0, ok);
    assert_eq!(t.call("admin", Method::POST, "/v1/admin/unretire-dc", dc_z).await.0, ok);
    assert_eq!(t.call("orders", Method::DELETE, o1, None).await.0, ok);
    // More refusals than the sampling lets through: 2 above, 10 here, 5 a minute written.
    for _ in 0..10 {
        assert_eq!(t.call("none", Method::GET, "/v1/status", None).await.0, StatusCode::UNAUTHORIZED);
    }

    let (orders, rival, admin) = (t.id_of("orders"), t.id_of("rival"), t.id_of("admin"));
    let want: Vec<(&str, &str, &str, &str, u16)> = vec![
        ("register", "default/orders/o1", "ok", &orders, 200),
        ("register", "default/orders/o5", "ok", &orders, 200),
        ("register", "default/orders/o6", "ok", &orders, 200),
        ("register", "default/orders/o7 and 1 more", "failed", &orders, 400),
        ("status", "default/orders/o1", "ok", &orders, 200),
        ("deregister", "default/orders/o1", "refused", &rival, 403),
        ("request", "GET /v1/services/default/orders", "refused", "-", 401),
        ("token_create", "", "ok", "local", 0),
        ("reload", "POST /v1/admin/reload", "ok", &admin, 200),
        ("retire_dc", "dc-z", "ok", &admin, 200),
        ("unretire_dc", "dc-z", "ok", &admin, 200),
        ("deregister", "default/orders/o1", "ok", &orders, 200),
    ];
    // Every line this test reads, the last refusals among them (the writer thread may still
    // hold them when the second deregister is in the file).
    eventually(Duration::from_secs(5), "the audit lines are written", || {
        let got = lines(&cfg);
        async move {
            got.iter().filter(|r| r.action == "deregister").count() == 2
                && got.iter().filter(|r| r.outcome == "refused").count() >= 5
        }
    })
    .await;
    // The command line appends its own line, so only the node's lines are in request order.
    let got = lines(&cfg);
    for (action, target, outcome, principal, status) in &want {
        let found = got.iter().position(|r| {
            r.action == *action
                && (target.is_empty() || r.target == *target)
                && r.outcome == *outcome
                && r.principal == *principal
                && r.status == *status
        });
        let Some(i) = found else { panic!("no {action} {target} {outcome} by {principal}: {got:#?}") };
        let r = &got[i];
        assert_eq!(r.dc, "dc-a");
        assert!(r.time.ends_with('Z') && r.time.len() == 24, "{}", r.time);
        assert_eq!(r.client, if *principal == "local" { "local" } else { "127.0.0.1" });
    }
    let by_action = |a: &str| got.iter().filter(|r| r.action == a).cloned().collect::<Vec<_>>();
    assert_eq!(by_action("deregister")[0].code.as_deref(), Some("forbidden"));
    assert_eq!(by_action("status")[0].detail.as_deref(), Some("to Draining"));
    assert!(
        by_action("reload")[0].detail.as_deref().unwrap().contains("tokens 7 -> 8"),
        "{:?}",
        by_action("reload")
    );
    assert!(!got.iter().any(|r| r.target.contains("heartbeat")), "heartbeats are not audited");
    // Refusals are sampled: 5 written of 12, the rest counted.
    let refusals = got.iter().filter(|r| r.outcome == "refused").count();
    assert_eq!(refusals, 5, "{got:#?}");
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
    assert!(text.contains("tandem_audit_lines_total{dc=\"dc-a\",outcome=\"sampled_out\"} 7"), "{text}");

    // No secret in the file: not the tokens used, not the one created, no token prefix.
    let raw = std::fs::read_to_string(cfg.audit.path(&cfg.data_dir)).unwrap();
    assert!(!raw.contains("tdm_"), "{raw}");
    for (who, secret) in &t.tokens {
        if let Some(s) = secret {
            assert!(!raw.contains(&s[4..]), "{who}'s secret is in the audit log");
        }
    }
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(cfg.audit.path(&cfg.data_dir)).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    t.stop().await;
}
