//! Tests of the configuration: parsing, defaults and validation.
use super::*;

fn base() -> Config {
    Config::single("dc-a", PathBuf::from("/tmp/x"), "127.0.0.1:0".parse().unwrap())
}

fn key_of(cfg: &Config) -> String {
    match cfg.validate().unwrap_err() {
        ConfigError::Invalid { key, .. } => key,
        ConfigError::Failover(e) => format!("[failover] {}", e.key),
        other => other.to_string(),
    }
}

/// A `[cluster]` table of three members, as parsed from TOML.
fn cluster_of(node_id: u64) -> ClusterSection {
    toml::from_str(&format!(
        "node_id = {node_id}\nca_cert = \"ca.pem\"\ncert = \"n.pem\"\nkey = \"n.key\"\nmembers = [\
         {{ id = 1, raft_addr = \"127.0.0.1:7001\", http_addr = \"127.0.0.1:8001\" }},\
         {{ id = 2, raft_addr = \"127.0.0.1:7002\", http_addr = \"127.0.0.1:8002\" }},\
         {{ id = 3, raft_addr = \"127.0.0.1:7003\", http_addr = \"127.0.0.1:8003\" }}]"
    ))
    .unwrap()
}

#[test]
fn a_cluster_table_names_the_key_it_breaks() {
    let mut c = base();
    c.cluster = Some(cluster_of(2));
    assert!(c.validate().is_ok());
    let defaults = c.cluster.as_ref().unwrap();
    assert_eq!(
        (defaults.heartbeat_interval_ms, defaults.election_timeout_min_ms, defaults.election_timeout_max_ms),
        (100, 300, 600)
    );
    assert_eq!(defaults.me().id, 2);
    type Breaks = fn(&mut ClusterSection);
    let broken: [(&str, Breaks); 7] = [
        ("[cluster] node_id", |s| s.node_id = 4),
        ("[cluster] members.id", |s| s.members[1].id = 1),
        ("[cluster] members.id", |s| s.members[0].id = 0),
        ("[cluster] members", |s| s.members[2].raft_addr = s.members[0].raft_addr),
        ("[cluster] members", |s| s.members.clear()),
        ("[cluster] election_timeout_min_ms", |s| s.election_timeout_min_ms = 200),
        ("[cluster] election_timeout_max_ms", |s| s.election_timeout_max_ms = 300),
    ];
    for (key, breaks) in broken {
        let mut section = cluster_of(2);
        breaks(&mut section);
        let mut c = base();
        c.cluster = Some(section);
        assert_eq!(key_of(&c), key);
    }
    let mut section = cluster_of(1);
    let one = section.members[0].clone();
    section.members = (1..=10).map(|id| MemberSection { id, ..one.clone() }).collect();
    let mut c = base();
    c.cluster = Some(section);
    assert_eq!(key_of(&c), "[cluster] members", "more than MEMBERS_MAX");
}

#[test]
fn each_invalid_setting_names_its_key() {
    assert!(base().validate().is_ok());
    let mut c = base();
    c.store.group_commit_linger_us = 20_000;
    assert_eq!(key_of(&c), "[store] group_commit_linger_us");
    let mut c = base();
    c.protection.protect_threshold = 1.5;
    assert_eq!(key_of(&c), "[protection] protect_threshold");
    let mut c = base();
    c.http.watch_streams_max = 0;
    assert_eq!(key_of(&c), "[http] watch_streams_max");
    let mut c = base();
    c.http.blocking_queries_per_address_max = 0;
    assert_eq!(key_of(&c), "[http] blocking_queries_per_address_max");
    let mut c = base();
    c.limits.services_max = 0;
    assert_eq!(key_of(&c), "[limits] services_max");
    for bad in [0, 86_400_001] {
        let mut c = base();
        c.protection.self_preservation_max_pause_ms = bad;
        assert_eq!(key_of(&c), "[protection] self_preservation_max_pause_ms");
    }
    let mut c = base();
    c.http.connections_per_address_max = c.http.connections_max + 1;
    assert_eq!(key_of(&c), "[http] connections_per_address_max");
    let mut c = base();
    c.http.request_timeout_ms = 0;
    assert_eq!(key_of(&c), "[http] request_timeout_ms");
    let mut c = base();
    c.http.allowed_hosts = vec!["evil example".into()];
    assert_eq!(key_of(&c), "[http] allowed_hosts");
    let mut c = base();
    let mut tls = HttpTlsSection {
        cert: "c.pem".into(),
        key: "c.key".into(),
        client_ca: None,
        client_certs: ClientCerts::Required,
        handshake_timeout_ms: HANDSHAKE_TIMEOUT_MS_DEFAULT,
    };
    c.http.tls = Some(tls.clone());
    assert_eq!(key_of(&c), "[http.tls] client_certs");
    tls.client_certs = ClientCerts::Optional;
    tls.handshake_timeout_ms = 0;
    c.http.tls = Some(tls);
    assert_eq!(key_of(&c), "[http.tls] handshake_timeout_ms");
    let mut c = base();
    c.store.max_open_files = 1;
    assert_eq!(key_of(&c), "[store] max_open_files");
    let mut c = base();
    c.failover.default.min_healthy_pct = Some(2.0);
    assert_eq!(key_of(&c), "[failover] min_healthy_pct");
    let mut c = base();
    c.dc = "not a dc!".into();
    assert_eq!(key_of(&c), "dc");
    // A peer's replication scope: valid names, at most PEER_SCOPE_NAMESPACES_MAX.
    let with_scope = |namespaces: Vec<String>| {
        let toml = "dc = \"dc-a\"\ndata_dir = \"/tmp/x\"\nhttp_addr = \"127.0.0.1:0\"\n[replication]\n\
                    listen = \"127.0.0.1:0\"\npeers = [{ dc = \"dc-b\", addr = \"127.0.0.1:1\" }]\n\
                    ca_cert = \"c\"\ncert = \"c\"\nkey = \"k\"\n";
        let mut c: Config = toml::from_str(toml).unwrap();
        c.replication.as_mut().unwrap().peers[0].namespaces = Some(namespaces);
        c
    };
    assert!(with_scope(vec!["a".into(), "b.c".into()]).validate().is_ok());
    assert!(with_scope(vec![]).validate().is_ok());
    assert_eq!(key_of(&with_scope(vec!["not a name".into()])), "[replication] peers.namespaces");
    let many = (0..=PEER_SCOPE_NAMESPACES_MAX).map(|i| format!("n{i}")).collect();
    assert_eq!(key_of(&with_scope(many)), "[replication] peers.namespaces");
    // The message says the key and the rule.
    let mut c = base();
    c.store.write_buffer_mib = 0;
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "invalid config: [store] write_buffer_mib: must be 1..=1024"
    );
}
