//! `tandem dev`: the two-DC sandbox on loopback with embedded defaults (`./run.sh`), one
//! node or a Raft group of N per DC.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;

use super::wait_for_stop;
use crate::config::{Config, PeerSection, ReplicationSection};
use crate::node::Node;

/// Configs of the two sandbox DCs, `nodes` per DC: node k (1-based) of DC i (dc-a 0,
/// dc-b 1) serves HTTP on `http_port + i + 10*(k-1)`, its gateway (when it leads) on
/// `repl_port + i + 10*(k-1)` and its member link on `repl_port + 100 + i + 10*(k-1)`. One
/// node per DC is a single node, as before; more make each DC a group.
pub fn dev_configs(
    dir: &std::path::Path,
    http_port: u16,
    repl_port: u16,
    stale_after_ms: u64,
    nodes: u64,
) -> anyhow::Result<[Vec<Config>; 2]> {
    let certs = dir.join("certs");
    let pki = tandem_replicator::tls::generate_dev_pki(&certs, &["dc-a", "dc-b"], false)
        .or_else(|_| tandem_replicator::tls::generate_dev_pki(&certs, &["dc-a", "dc-b"], true))
        .context("cannot create development certificates")?;
    let ids: Vec<u64> = (1..=nodes).collect();
    let at = |base: u16, dc: u16, k: u64| -> anyhow::Result<SocketAddr> {
        let port = u64::from(base) + u64::from(dc) + 10 * (k - 1);
        let port = u16::try_from(port).context("a sandbox port is past 65535: choose lower base ports")?;
        Ok(SocketAddr::from(([127, 0, 0, 1], port)))
    };
    let mk = |dc: &str, i: u16, peer: &str, j: u16, k: u64| -> anyhow::Result<Config> {
        let paths = pki.paths(dc).context("missing certificate paths")?;
        let data = if nodes == 1 { dir.join(dc).join("data") } else { dir.join(dc).join(format!("n{k}")) };
        let mut c = Config::single(dc, data, at(http_port, i, k)?);
        let peer_addrs = ids.iter().map(|n| at(repl_port, j, *n)).collect::<anyhow::Result<Vec<_>>>()?;
        c.replication = Some(ReplicationSection {
            listen: at(repl_port, i, k)?,
            peers: vec![PeerSection {
                dc: peer.into(),
                addr: peer_addrs[0],
                addrs: peer_addrs[1..].to_vec(),
                namespaces: None,
            }],
            ca_cert: paths.ca_cert.clone(),
            cert: paths.cert.clone(),
            key: paths.key.clone(),
            batch_events_max: 512,
            window_batches_max: 8,
            frame_bytes_max: tandem_schemas::FRAME_BYTES_MAX,
            backoff_initial_ms: 100,
            backoff_max_ms: 2_000,
            stale_after_ms,
            purge_grace_ms: 600_000,
            ping_interval_ms: 500,
            schema_version: tandem_schemas::SCHEMA_VERSION,
            accept_from: tandem_replicator::gateway::SourceRule::defaults(),
            handshakes_max: tandem_replicator::gateway::HANDSHAKES_MAX_DEFAULT,
        });
        if nodes > 1 {
            let node_certs = tandem_replicator::tls::generate_dev_node_certs(&certs, dc, &[k], true)
                .context("cannot create development node certificates")?;
            let (_, node) = node_certs.into_iter().next().context("missing node certificate")?;
            let members = ids
                .iter()
                .map(|n| {
                    Ok(crate::config::MemberSection {
                        id: *n,
                        raft_addr: at(repl_port + 100, i, *n)?,
                        http_addr: at(http_port, i, *n)?,
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            c.cluster = Some(crate::config::ClusterSection::with_defaults(k, members, node));
        }
        Ok(c)
    };
    let dc = |name: &str, i: u16, peer: &str, j: u16| {
        ids.iter().map(|k| mk(name, i, peer, j, *k)).collect::<anyhow::Result<Vec<Config>>>()
    };
    Ok([dc("dc-a", 0, "dc-b", 1)?, dc("dc-b", 1, "dc-a", 0)?])
}

/// Runs the sandbox until Ctrl-C (or SIGTERM); SIGHUP reloads every node.
pub(super) async fn dev(
    dir: PathBuf,
    http_port: u16,
    repl_port: u16,
    stale_after_ms: u64,
    nodes: u64,
    drills: Option<PathBuf>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let [a, b] = dev_configs(&dir, http_port, repl_port, stale_after_ms, nodes)?;
    let mut running: Vec<(&str, Node)> = Vec::new();
    for (dc, mut cfg) in a.into_iter().map(|c| ("dc-a", c)).chain(b.into_iter().map(|c| ("dc-b", c))) {
        cfg.ui.drills_dir.clone_from(&drills);
        running.push((dc, Node::start(cfg, None).await?));
    }
    let http_of = |dc: &str| -> Vec<SocketAddr> {
        running.iter().filter(|(d, _)| *d == dc).map(|(_, n)| n.http_addr()).collect()
    };
    let (ha, hb) = (http_of("dc-a")[0], http_of("dc-b")[0]);
    let shape =
        if nodes == 1 { "one node each".to_owned() } else { format!("{nodes} nodes each (Raft groups)") };
    println!("tandem dev: two DCs on loopback, {shape}; data and certificates in {}", dir.display());
    println!("  ACLs are off: any local process may read and change everything (loopback only;");
    println!("  a server on another address needs [acl], see docs/security.md)");
    for dc in ["dc-a", "dc-b"] {
        let addrs: Vec<String> = http_of(dc).iter().map(|a| format!("http://{a}")).collect();
        println!("  {dc}  {}", addrs.join("  "));
    }
    if nodes > 1 {
        // Which node leads each DC (bounded wait: the groups elect within about a second).
        for dc in ["dc-a", "dc-b"] {
            let mut leader = None;
            for _ in 0..50 {
                leader = running
                    .iter()
                    .filter(|(d, _)| *d == dc)
                    .find_map(|(_, n)| n.shared.group.as_ref().filter(|g| g.serving()).map(|g| g.id));
                if leader.is_some() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            match leader {
                Some(id) => {
                    println!("  {dc} is led by node {id} (any node takes writes: followers forward them)")
                }
                None => println!("  {dc} has no leader yet (see /v1/status, field cluster)"),
            }
        }
    }
    println!();
    println!("console: http://{ha}/ui/ (dc-a)  http://{hb}/ui/ (dc-b)");
    println!();
    println!("try:");
    println!("  curl -s -XPOST http://{ha}/v1/register -d '{{\"service\":\"orders\",\"address\":\"10.0.0.7\",\"port\":8080,\"persistent\":true}}' -H 'content-type: application/json'");
    println!("  curl -s 'http://{hb}/v1/services/default/orders?dc=all'");
    println!("  curl -s http://{hb}/v1/status");
    println!("Ctrl-C stops both DCs.");
    let nodes_ref: Vec<&Node> = running.iter().map(|(_, n)| n).collect();
    wait_for_stop(&nodes_ref).await;
    futures::future::join_all(running.into_iter().map(|(_, n)| n.shutdown())).await;
    Ok(())
}

/// `tandem certs`: a development CA, a certificate per DC and one per node of each DC.
pub fn certs(out: PathBuf, mut dcs: Vec<String>, nodes: u64, force: bool) -> anyhow::Result<()> {
    use tandem_replicator::tls;
    if dcs.is_empty() {
        dcs = vec!["dc-a".into(), "dc-b".into()];
    }
    let names: Vec<&str> = dcs.iter().map(String::as_str).collect();
    let ids: Vec<u64> = (1..=nodes).collect();
    if !force {
        // Refuse before writing anything, node files included.
        let mut existing = Vec::new();
        for dc in &names {
            for id in &ids {
                let paths = tls::node_cert_paths(&out, &tls::NodeName::new(dc, *id)?);
                existing.extend([paths.cert, paths.key].into_iter().filter(|p| p.exists()));
            }
        }
        if let Some(path) = existing.first() {
            anyhow::bail!("refusing to overwrite existing file {} (--force replaces it)", path.display());
        }
    }
    let pki = tls::generate_dev_pki(&out, &names, force)?;
    println!("development CA: {}", out.join("ca.pem").display());
    for dc in &names {
        if let Some(p) = pki.paths(dc) {
            println!("{dc}: cert {} key {}", p.cert.display(), p.key.display());
        }
        for (node, p) in tls::generate_dev_node_certs(&out, dc, &ids, force)? {
            println!("{dc} node {}: cert {} key {}", node.id, p.cert.display(), p.key.display());
        }
    }
    Ok(())
}
