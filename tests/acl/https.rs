//! HTTPS on the client API against a real node (`[http.tls]`, certificates from a
//! development CA made with rcgen, loopback only): the client crate registers and
//! discovers over HTTPS, the SDK watches (HTTP/2 by ALPN too); plain HTTP to the TLS port gets a clean 400
//! and the node stays up; a client certificate bound under `[[acl.certs]]` is a principal
//! with its policies and nothing without one; a stalled handshake is closed within
//! `handshake_timeout_ms` and counted while a good client is served; a reload swaps the
//! certificate for new connections and a broken file keeps the old one.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use reqwest::StatusCode;
use serde_json::{json, Value};
use tandem::config::Config;
use tandem::node::Node;
use tandem_client::{Client, ClientError, ClientOptions, ClientTls};
use tandem_replicator::tls::{generate_dev_ca, generate_leaf_cert, GeneratedCert};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A development CA and the files of one node's HTTPS material.
struct Pki {
    dir: tempfile::TempDir,
    ca: GeneratedCert,
}

impl Pki {
    fn new() -> Pki {
        let now = SystemTime::now();
        let ca = generate_dev_ca(now - Duration::from_secs(3600), now + Duration::from_secs(86_400)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), &ca.cert_pem).unwrap();
        Pki { dir, ca }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn leaf(&self, common_name: &str, sans: &[&str]) -> GeneratedCert {
        let now = SystemTime::now();
        let sans: Vec<String> = sans.iter().map(|s| (*s).to_owned()).collect();
        generate_leaf_cert(
            &self.ca.cert_pem,
            &self.ca.key_pem,
            common_name,
            &sans,
            now - Duration::from_secs(3600),
            now + Duration::from_secs(86_400),
        )
        .unwrap()
    }

    /// Writes a new server certificate for 127.0.0.1 over `server.pem` / `server.key`.
    fn server_cert(&self) -> Vec<u8> {
        let c = self.leaf("tandem-node", &["localhost", "127.0.0.1"]);
        c.write(&self.path("server.pem"), &self.path("server.key"), true).unwrap();
        pem_der(&c.cert_pem)
    }

    /// A client's HTTPS settings, with the client certificate named `cert_name` if given.
    fn client_tls(&self, cert_name: Option<&str>) -> ClientTls {
        let tls = ClientTls::from_ca_pem(self.ca.cert_pem.as_bytes()).unwrap();
        match cert_name {
            None => tls,
            Some(n) => {
                let c = self.leaf(n, &[]);
                tls.with_identity_pem(c.cert_pem.as_bytes(), c.key_pem.as_bytes()).unwrap()
            }
        }
    }

    fn reqwest(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca.cert_pem.as_bytes()).unwrap())
            .tls_info(true)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    }
}

fn pem_der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap().to_vec()
}

/// A node on loopback speaking HTTPS with `pki`'s server certificate; `extra` is appended
/// to its config (after `[http.tls]`'s keys, so it may add more of them, then tables).
async fn start(pki: &Pki, tls_extra: &str, extra: &str) -> (Node, PathBuf) {
    pki.server_cert();
    let data = pki.path("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let config = pki.path("node.toml");
    std::fs::write(
        &config,
        format!(
            "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:0\"\n[http.tls]\ncert = \"{}\"\nkey = \"{}\"\n{tls_extra}\n{extra}",
            data.display(),
            pki.path("server.pem").display(),
            pki.path("server.key").display(),
        ),
    )
    .unwrap();
    let node = Node::start(Config::load(&config).unwrap(), Some(config.clone())).await.unwrap();
    (node, config)
}

fn base(node: &Node) -> String {
    format!("https://127.0.0.1:{}", node.http_addr().port())
}

async fn metric(http: &reqwest::Client, base: &str, outcome: &str) -> u64 {
    let text = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let want = format!("tandem_http_tls_handshakes_total{{dc=\"dc-a\",outcome=\"{outcome}\"}}");
    text.lines()
        .find_map(|l| l.strip_prefix(want.as_str()).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no sample {want} in /metrics"))
}

/// The counter of `outcome` once it reached `want` (handshakes are counted just after
/// their connection closes, so look again for a bounded while).
async fn metric_reaches(http: &reqwest::Client, base: &str, outcome: &str, want: u64) -> u64 {
    let mut n = 0;
    for _ in 0..50 {
        n = metric(http, base, outcome).await;
        if n >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    n
}

fn register_body(service: &str) -> Value {
    json!({"service": service, "address": "10.0.0.1", "port": 80})
}

#[tokio::test]
async fn the_client_crate_registers_and_discovers_over_https_and_plain_http_is_refused_cleanly() {
    let pki = Pki::new();
    let (node, _) = start(&pki, "", "").await;
    let base = base(&node);
    let tls = pki.client_tls(None);
    let c = Client::with_tls(std::slice::from_ref(&base), ClientOptions::default(), Some(&tls));
    let r = c.register(&register_body("orders")).await.unwrap();
    assert!(r["instance_id"].is_string(), "{r}");
    let d = c.discover("default", "orders", "").await.unwrap();
    assert_eq!(d["instances"].as_array().unwrap().len(), 1, "{d}");

    // The SDK too: a consumer watches over HTTPS; tls with an http:// address is refused.
    let mut sdk = tandem_client::sdk::ClientConfig::new([base.clone()]);
    sdk.tls = Some(tls.clone());
    let consumer = tandem_client::sdk::Consumer::watch(sdk.clone(), "default", "orders").await.unwrap();
    assert_eq!(consumer.view().source, tandem_client::sdk::ViewSource::Registry);
    assert_eq!(consumer.instances().len(), 1);
    drop(consumer);
    sdk.addrs = vec![format!("http://127.0.0.1:{}", node.http_addr().port())];
    assert!(sdk.validate().is_err());

    // HTTP/2 by ALPN, and HTTP/1.1.
    let http = pki.reqwest();
    let h2 = http.get(format!("{base}/v1/status")).send().await.unwrap();
    assert_eq!((h2.status(), h2.version()), (StatusCode::OK, reqwest::Version::HTTP_2));
    let h1 = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(pki.ca.cert_pem.as_bytes()).unwrap())
        .http1_only()
        .build()
        .unwrap();
    let r = h1.get(format!("{base}/v1/status")).send().await.unwrap();
    assert_eq!((r.status(), r.version()), (StatusCode::OK, reqwest::Version::HTTP_11));

    // Plain HTTP to the TLS port: one clean 400 naming the problem, then the close.
    let plain = format!("http://127.0.0.1:{}", node.http_addr().port());
    let r = reqwest::Client::new().get(format!("{plain}/v1/status")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "https_required");
    // Not TLS, not HTTP: the handshake fails and is counted.
    let mut junk = tokio::net::TcpStream::connect(node.http_addr()).await.unwrap();
    junk.write_all(&[0x01; 64]).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), junk.read_to_end(&mut buf)).await.unwrap();
    // A client that does not trust the node's CA gets no answer; the client crate refuses
    // plain http:// addresses once TLS is set.
    let stranger = Pki::new().client_tls(None);
    let c2 = Client::with_tls(std::slice::from_ref(&base), ClientOptions::default(), Some(&stranger));
    assert!(matches!(c2.status().await, Err(ClientError::Unreachable(_))));
    let c3 = Client::with_tls(&[plain], ClientOptions::default(), Some(&tls));
    assert!(matches!(c3.status().await, Err(ClientError::Unreachable(_))));

    // The node stayed up and counted each.
    assert_eq!(c.discover("default", "orders", "").await.unwrap()["instances"].as_array().unwrap().len(), 1);
    assert_eq!(metric_reaches(&http, &base, "plain_http", 1).await, 1);
    assert_eq!(metric_reaches(&http, &base, "failed", 2).await, 2, "junk and the untrusting client");
    assert!(metric(&http, &base, "ok").await >= 3);
    node.shutdown().await;
}

const CERT_POLICIES: &str = r#"
[acl]
enabled = true

[[acl.policies]]
name = "orders"
rules = [{ namespace = "default", service_prefix = "orders", read = true, write = true }]

[[acl.certs]]
name = "orders-bot"
policies = ["orders"]

[[acl.certs]]
name = "ops"
policies = ["admin"]
"#;

#[tokio::test]
async fn a_client_certificate_is_a_principal_with_its_policies_and_nothing_without_one() {
    let pki = Pki::new();
    let ca = pki.path("ca.pem");
    let tls_keys = format!("client_ca = \"{}\"", ca.display());
    let (node, config) = start(&pki, &tls_keys, CERT_POLICIES).await;
    let base = base(&node);
    let opts = ClientOptions::default();
    let bot = Client::with_tls(std::slice::from_ref(&base), opts, Some(&pki.client_tls(Some("orders-bot"))));
    let r = bot.register(&register_body("orders-api")).await.unwrap();
    let id = r["instance_id"].as_str().unwrap().to_owned();
    assert!(matches!(
        bot.register(&register_body("billing")).await,
        Err(ClientError::Api { status: 403, .. })
    ));
    assert!(matches!(bot.status().await, Err(ClientError::Api { status: 403, .. })));

    // Without a certificate (and no token), or with one bound to nothing: 401.
    let none = Client::with_tls(std::slice::from_ref(&base), opts, Some(&pki.client_tls(None)));
    assert!(matches!(
        none.discover("default", "orders-api", "").await,
        Err(ClientError::Api { status: 401, .. })
    ));
    let stranger =
        Client::with_tls(std::slice::from_ref(&base), opts, Some(&pki.client_tls(Some("stranger"))));
    let e = stranger.discover("default", "orders-api", "").await.unwrap_err();
    assert!(
        matches!(&e, ClientError::Api { status: 401, message, .. } if message.contains("acl.certs")),
        "{e}"
    );
    // The certificate's principal owns what it registered: another principal may not renew it.
    let ops = Client::with_tls(std::slice::from_ref(&base), opts, Some(&pki.client_tls(Some("ops"))));
    let d = ops.discover("default", "orders-api", "").await.unwrap();
    assert_eq!(d["instances"].as_array().unwrap().len(), 1);
    assert!(bot.heartbeat("default", "orders-api", &id).await.is_ok());

    // Required client certificates (a reload): a client without one fails its handshake.
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace(&tls_keys, &format!("{tls_keys}\nclient_certs = \"required\"")))
        .unwrap();
    let answer: Value = ops.call(reqwest::Method::POST, "/v1/admin/reload", Some(&json!({}))).await.unwrap();
    assert_eq!(answer["reloaded"], true);
    let none = Client::with_tls(std::slice::from_ref(&base), opts, Some(&pki.client_tls(None)));
    assert!(matches!(none.status().await, Err(ClientError::Unreachable(_))));
    assert!(bot.discover("default", "orders-api", "").await.is_ok());
    node.shutdown().await;
}

#[tokio::test]
async fn a_stalled_handshake_is_closed_within_its_bound_and_counted_while_others_are_served() {
    let pki = Pki::new();
    let (node, _) = start(&pki, "handshake_timeout_ms = 300", "").await;
    let base = base(&node);
    let http = pki.reqwest();
    // One sends nothing, one half a ClientHello (a record header promising 512 bytes).
    let silent = tokio::net::TcpStream::connect(node.http_addr()).await.unwrap();
    let mut half = tokio::net::TcpStream::connect(node.http_addr()).await.unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03]).await.unwrap();
    // A good client is served meanwhile.
    let r = http.get(format!("{base}/v1/status")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let started = Instant::now();
    for mut s in [silent, half] {
        let mut buf = Vec::new();
        // Bounded: the node closes it after 300 ms; 10 s is the test's own limit.
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "a stalled handshake was not closed");
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(metric_reaches(&http, &base, "timed_out", 2).await, 2);
    node.shutdown().await;
}

#[tokio::test]
async fn a_reload_swaps_the_certificate_for_new_connections_and_a_broken_file_keeps_the_old() {
    let pki = Pki::new();
    let (node, _) = start(&pki, "", "").await;
    let base = base(&node);
    let served = |http: reqwest::Client| {
        let url = format!("{base}/v1/status");
        async move {
            let r = http.get(url).send().await.unwrap();
            let info = r.extensions().get::<reqwest::tls::TlsInfo>().unwrap();
            info.peer_certificate().unwrap().to_vec()
        }
    };
    let first = std::fs::read_to_string(pki.path("server.pem")).unwrap();
    assert_eq!(served(pki.reqwest()).await, pem_der(&first));

    let reload = |expect: StatusCode| {
        let url = format!("{base}/v1/admin/reload");
        let http = pki.reqwest();
        async move {
            let r = http.post(url).json(&json!({})).send().await.unwrap();
            let status = r.status();
            let body: Value = r.json().await.unwrap();
            assert_eq!(status, expect, "{body}");
            body
        }
    };
    let second = pki.server_cert();
    assert_ne!(second, pem_der(&first));
    reload(StatusCode::OK).await;
    assert_eq!(served(pki.reqwest()).await, second);

    // A broken certificate file, then a key file others may write: refused, the second
    // certificate stays in use.
    let good_cert = std::fs::read(pki.path("server.pem")).unwrap();
    std::fs::write(pki.path("server.pem"), "-----BEGIN CERTIFICATE-----\nnot base64\n").unwrap();
    let body = reload(StatusCode::BAD_REQUEST).await;
    assert!(body["error"]["message"].as_str().unwrap().contains("[http.tls]"), "{body}");
    assert_eq!(served(pki.reqwest()).await, second);
    std::fs::write(pki.path("server.pem"), good_cert).unwrap();
    set_mode(&pki.path("server.key"), 0o666);
    reload(StatusCode::BAD_REQUEST).await;
    assert_eq!(served(pki.reqwest()).await, second);
    set_mode(&pki.path("server.key"), 0o600);
    node.shutdown().await;
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
}
