//! What a node's HTTP handlers and background tasks share ([`NodeShared`]), and its
//! configuration reload. Its own module so that `http` and `node` both use it without
//! importing each other.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use tandem_replicator::gateway::{Admission, Gateway, GatewayStats, PeerBook, PeerConfig};
use tandem_replicator::tls::TlsError;
use tandem_schemas::Mark;
use tokio::sync::watch;

use crate::config::{Config, ConfigError};
use crate::node::committer::NodeCommitter;
use crate::node::group::Group;
use crate::registry::Registry;

/// Marks and floors as of the last durable write, readable without the committer.
#[derive(Debug)]
pub struct LiveMarks {
    pub own: Mark,
    pub floor: u64,
    pub remote: BTreeMap<String, Mark>,
    /// DCs retired here -> when (wall-clock ms).
    pub retired: BTreeMap<String, u64>,
}

/// Encoded discovery answers: (namespace, service, filter) -> (index, the stale flags of the
/// service's remote owners it was computed with, JSON bytes).
pub type AnswerCache =
    hashbrown::HashMap<(String, String, String), (u64, crate::registry::StaleFlags, axum::body::Bytes)>;

/// Looks an [`AnswerCache`] entry up by borrowed names, without building its key. Hashes
/// exactly as the tuple does (field by field, each as a `str`).
#[derive(Hash)]
pub struct AnswerRef<'a>(pub &'a str, pub &'a str, pub &'a str);

impl hashbrown::Equivalent<(String, String, String)> for AnswerRef<'_> {
    fn equivalent(&self, key: &(String, String, String)) -> bool {
        key.0 == self.0 && key.1 == self.1 && key.2 == self.2
    }
}

/// What the HTTP handlers and the background tasks share.
pub struct NodeShared {
    pub registry: Arc<Registry>,
    pub committer: NodeCommitter,
    /// This node's member of its DC's group (`[cluster]`), if it has one.
    pub group: Option<Arc<Group>>,
    /// What forwarding writes to the group's leader did.
    pub forward_stats: crate::http::forward::ForwardStats,
    pub live: Arc<parking_lot::RwLock<LiveMarks>>,
    pub gateway_stats: Option<Arc<GatewayStats>>,
    /// The peer DCs' addresses and the replication listener's admission, which a reload
    /// changes in place (every gateway this node starts reads them).
    pub peer_book: Option<Arc<PeerBook>>,
    /// Encoded discovery answers by (namespace, service, filter), with their index.
    pub answers: Mutex<AnswerCache>,
    /// Turns true when the node shuts down (streaming watches end).
    pub closing: watch::Receiver<bool>,
    pub(crate) gateway: Mutex<Option<Gateway>>,
    pub(crate) gateway_clock: tokio::time::Instant,
    pub(crate) config_path: Option<PathBuf>,
    /// The data dir (the event log's RocksDB; a member's Raft log under `raft/`).
    pub(crate) data_dir: PathBuf,
    pub(crate) started: std::time::Instant,
    /// The HTTP side's limits: counters, admin rate, sampled refusal logs.
    pub http: Arc<crate::http::limits::HttpState>,
    /// The access rules in force and their counters.
    pub acl: Arc<crate::acl::AclState>,
    /// What the Consul and Nacos front ends keep (Consul's TTL checks).
    pub compat: crate::compat::Compat,
    /// The audit log.
    pub audit: Arc<crate::audit::Audit>,
    /// Stored records the log skipped on read because they break the schema's rules.
    pub invalid_records: Arc<crate::store::InvalidRecords>,
    /// The HTTPS material of the client API (`[http.tls]`), when it speaks HTTPS.
    pub https: Option<Arc<crate::http::tls::HttpsTls>>,
    /// One reload at a time (SIGHUP and `POST /v1/admin/reload` may meet).
    pub(crate) reloading: Mutex<()>,
    /// How late the node's runtime wakes a timer (`node/lateness.rs`).
    pub runtime_lateness: Arc<crate::node::lateness::RuntimeLateness>,
}

/// Why a configuration reload was refused; the running configuration stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("this node was started without a config file; nothing to reload")]
    NoConfigFile,
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A key that only a restart may change (`dc`, `data_dir`).
    #[error("{key} cannot change at runtime (restart the node to change it)")]
    Immutable { key: &'static str },
    #[error("[replication] certificates: {0}")]
    Certificates(#[from] TlsError),
    #[error("[http.tls] certificates: {0}")]
    HttpsCertificates(TlsError),
    #[error("[cluster] certificates: {0}")]
    MemberCertificates(TlsError),
    #[error("[acl] {0}")]
    Acl(#[from] crate::acl::AclError),
}

/// The key a reload names when it would change which DCs are peers (their addresses do
/// reload).
const PEER_DCS_KEY: &str = "[replication] peers (which DCs; their addresses reload)";

/// Whether a peer present in both configurations has another replication scope in `new`
/// (scopes are taken at start: see `RocksLog::rescope`).
fn scope_changed(old: &Config, new: &Config) -> bool {
    let (Some(o), Some(n)) = (&old.replication, &new.replication) else { return false };
    n.peers.iter().any(|np| o.peers.iter().any(|op| op.dc == np.dc && op.scope() != np.scope()))
}

impl NodeShared {
    /// Re-reads the config file: failover policy and protection settings take effect at
    /// once; replication, member-link and HTTPS certificates are reloaded (new connections
    /// use them); the peer DCs' addresses and `accept_from` take effect at the next dial
    /// and handshake. An invalid file changes nothing.
    pub fn reload(&self) -> Result<(), ReloadError> {
        let _one_at_a_time = self.reloading.lock();
        let path = self.config_path.as_ref().ok_or(ReloadError::NoConfigFile)?;
        let new = Config::load(path)?;
        let old = self.registry.config();
        if new.dc != old.dc {
            return Err(ReloadError::Immutable { key: "dc" });
        }
        if new.data_dir != old.data_dir {
            return Err(ReloadError::Immutable { key: "data_dir" });
        }
        if new.acl.enabled != old.acl.enabled {
            return Err(ReloadError::Immutable { key: "[acl] enabled" });
        }
        if new.cluster != old.cluster {
            return Err(ReloadError::Immutable { key: "[cluster]" });
        }
        if scope_changed(&old, &new) {
            return Err(ReloadError::Immutable { key: "[replication] peers.namespaces" });
        }
        if new.http.tls.is_some() != old.http.tls.is_some() {
            return Err(ReloadError::Immutable { key: "[http.tls] (on or off)" });
        }
        let acl = crate::acl::Acl::new(
            &new.acl,
            &crate::acl::tokens::TokenFile::load(&new.acl.tokens_path(&new.data_dir))?,
        )?;
        let https = match (&self.https, &new.http.tls) {
            (Some(_), Some(section)) => {
                Some(crate::http::tls::HttpsTls::prepare(section).map_err(ReloadError::HttpsCertificates)?)
            }
            _ => None,
        };
        let peers = match (&self.peer_book, &new.replication) {
            (Some(book), Some(r)) => {
                let (peers, admission) = peers_of(r);
                let (mut now, mut next): (Vec<&String>, Vec<&String>) =
                    (book.dcs().iter().collect(), peers.iter().map(|p| &p.dc).collect());
                now.sort();
                next.sort();
                if now != next {
                    return Err(ReloadError::Immutable { key: PEER_DCS_KEY });
                }
                Some((book, peers, admission))
            }
            (None, None) => None,
            _ => return Err(ReloadError::Immutable { key: "[replication] (on or off)" }),
        };
        if let Some(gw) = self.gateway.lock().as_ref() {
            gw.reload_tls()?;
        }
        if let Some(g) = &self.group {
            g.reload_tls().map_err(ReloadError::MemberCertificates)?;
        }
        if let Some((book, peers, admission)) = peers {
            book.replace(peers, admission).map_err(|_| ReloadError::Immutable { key: PEER_DCS_KEY })?;
        }
        if let (Some(tls), Some(prepared)) = (&self.https, https) {
            tls.swap(prepared);
        }
        self.acl.replace(acl);
        if let Some(g) = &self.group {
            g.set_own_policy(new.policy_digest());
        }
        self.registry.set_config(Arc::new(new));
        tracing::info!(path = %path.display(), "configuration reloaded");
        Ok(())
    }
}

/// The peers of `[replication]` as the gateway dials them (every address of each), and the
/// listener's admission.
pub fn peers_of(r: &crate::config::ReplicationSection) -> (Vec<PeerConfig>, Admission) {
    let peers: Vec<PeerConfig> =
        r.peers.iter().map(|p| PeerConfig { dc: p.dc.clone(), addrs: p.all_addrs() }).collect();
    let admission =
        Admission::new(&r.accept_from, peers.iter().flat_map(|p| p.addrs.clone()), r.handshakes_max);
    (peers, admission)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_peer_scope_is_a_restart_change() {
        let toml = |peers: &str| {
            let text = format!(
                "dc = \"dc-a\"\ndata_dir = \"/tmp/x\"\nhttp_addr = \"127.0.0.1:0\"\n[replication]\n\
                 listen = \"127.0.0.1:0\"\npeers = [{peers}]\nca_cert = \"c\"\ncert = \"c\"\nkey = \"k\"\n"
            );
            toml::from_str::<Config>(&text).unwrap()
        };
        let all = toml(r#"{ dc = "dc-b", addr = "127.0.0.1:1" }"#);
        let only_a = toml(r#"{ dc = "dc-b", addr = "127.0.0.1:1", namespaces = ["a"] }"#);
        let only_a_moved = toml(r#"{ dc = "dc-b", addr = "127.0.0.1:2", namespaces = ["a"] }"#);
        let other_peer = toml(r#"{ dc = "dc-c", addr = "127.0.0.1:1", namespaces = ["a"] }"#);
        assert!(scope_changed(&all, &only_a) && scope_changed(&only_a, &all));
        assert!(!scope_changed(&only_a, &only_a_moved));
        assert!(!scope_changed(&all, &other_peer));
    }
}
