//! Node configuration: one TOML file per node (see `examples/tandem.toml`).
//!
//! The keys `dc`, `data_dir`, `http_addr` and the `[replication]` table with `listen`,
//! `peers = [{ dc, addr }]`, `ca_cert`, `cert`, `key` are public contract. Everything else
//! has a default; unknown keys are rejected so that a typo never goes unnoticed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tandem_replicator::gateway::SourceRule;

use crate::failover::PolicyConfig;

mod cluster;
mod https;
mod limits;
use crate::health::HealthConfig;
pub use cluster::{
    ClusterSection, MemberSection, ELECTION_TIMEOUT_MS_DEFAULT, HEARTBEAT_INTERVAL_MS_DEFAULT, MEMBERS_MAX,
    SNAPSHOT_EVERY_ENTRIES_DEFAULT, SNAPSHOT_LOG_KEPT_MAX,
};
pub use https::{ClientCerts, HttpTlsSection, HANDSHAKE_TIMEOUT_MS_DEFAULT};
pub use limits::{LimitsSection, NamespaceQuota, Quota};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Name of this node's DC: 1-32 of a-z, 0-9, '-'.
    pub dc: String,
    /// Where RocksDB keeps the event log and state.
    pub data_dir: PathBuf,
    /// Client-facing HTTP API.
    #[serde(default = "default_http_addr")]
    pub http_addr: SocketAddr,
    #[serde(default)]
    pub health: HealthSection,
    #[serde(default)]
    pub protection: ProtectionSection,
    #[serde(default)]
    pub replication: Option<ReplicationSection>,
    /// This node's DC group (absent: the DC is this one node); see docs/cluster.md.
    #[serde(default)]
    pub cluster: Option<ClusterSection>,
    #[serde(default)]
    pub failover: PolicyConfig,
    #[serde(default)]
    pub log: LogSection,
    #[serde(default)]
    pub store: StoreSection,
    #[serde(default)]
    pub http: HttpSection,
    /// Access control (tokens and policies); see docs/security.md.
    #[serde(default)]
    pub acl: crate::acl::AclSection,
    #[serde(default)]
    pub limits: LimitsSection,
    /// The audit log of state changes, admin calls and refusals.
    #[serde(default)]
    pub audit: crate::audit::AuditSection,
    /// The web console (`/ui/`).
    #[serde(default)]
    pub ui: crate::ui::UiSection,
}

fn default_http_addr() -> SocketAddr {
    "127.0.0.1:8500".parse().expect("constant address")
}

/// Lease and health timing (defaults follow Nacos: beat 5 s, unhealthy 15 s, gone 30 s).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthSection {
    pub heartbeat_interval_ms: u64,
    pub suspect_after_ms: u64,
    pub unhealthy_after_ms: u64,
    pub expire_after_ms: u64,
    pub recovery_heartbeats: u32,
    pub flap_window_ms: u64,
    pub flap_transitions_max: u32,
    /// How often the lease checker runs.
    pub check_interval_ms: u64,
}

impl Default for HealthSection {
    fn default() -> Self {
        let d = HealthConfig::default();
        HealthSection {
            heartbeat_interval_ms: d.heartbeat_interval_ms,
            suspect_after_ms: d.suspect_after_ms,
            unhealthy_after_ms: d.unhealthy_after_ms,
            expire_after_ms: d.expire_after_ms,
            recovery_heartbeats: d.recovery_heartbeats,
            flap_window_ms: d.flap_window_ms,
            flap_transitions_max: d.flap_transitions_max,
            check_interval_ms: 200,
        }
    }
}

/// Server-side protection against collapsed answers.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ProtectionSection {
    pub self_preservation: bool,
    /// Expiry pauses when renewals fall below this share of those expected.
    pub self_preservation_threshold: f64,
    pub self_preservation_window_ms: u64,
    /// Longest a namespace's lease expiry may stay paused; then expiry resumes there.
    pub self_preservation_max_pause_ms: u64,
    /// Default protect threshold: when the healthy share of a service falls below it,
    /// discovery returns all its instances. 0 disables.
    pub protect_threshold: f64,
    /// Per-service protect thresholds: `"namespace/service" = 0.3`.
    pub services: std::collections::BTreeMap<String, f64>,
}

impl Default for ProtectionSection {
    fn default() -> Self {
        ProtectionSection {
            self_preservation: true,
            self_preservation_threshold: 0.85,
            self_preservation_window_ms: 60_000,
            self_preservation_max_pause_ms: HealthConfig::default().self_preservation_max_pause_ms,
            protect_threshold: 0.5,
            services: Default::default(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PeerSection {
    pub dc: String,
    pub addr: SocketAddr,
    /// The other nodes' gateway addresses when the peer is a DC group (only its leader
    /// runs a gateway; the dialer tries `addr`, then these, in turn).
    #[serde(default)]
    pub addrs: Vec<SocketAddr>,
    /// The replication scope of this peer: the namespaces it may replicate into this DC
    /// (absent: all). Its events of other namespaces are applied as no-ops, and its
    /// snapshots are installed in part (docs/replication.md, "Replication scope"). Taken at
    /// start; a reload that changes it is refused.
    #[serde(default)]
    pub namespaces: Option<Vec<String>>,
}

/// Most namespaces one peer's replication scope may name.
pub const PEER_SCOPE_NAMESPACES_MAX: usize = 1024;

/// Most addresses one peer lists (`addr` and `addrs`): a DC group's members.
pub const PEER_ADDRS_MAX: usize = MEMBERS_MAX;

impl PeerSection {
    /// Every address of the peer's gateway: `addr`, then `addrs` (without repeats).
    pub fn all_addrs(&self) -> Vec<SocketAddr> {
        let mut all = vec![self.addr];
        for a in &self.addrs {
            if !all.contains(a) {
                all.push(*a);
            }
        }
        all
    }

    /// The peer's replication scope.
    pub fn scope(&self) -> tandem_replicator::scope::Scope {
        tandem_replicator::scope::Scope::from_config(self.namespaces.as_deref())
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicationSection {
    /// UDP address of this DC's replication gateway (QUIC).
    pub listen: SocketAddr,
    pub peers: Vec<PeerSection>,
    pub ca_cert: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Most events per replication batch.
    #[serde(default = "d_batch")]
    pub batch_events_max: usize,
    /// Most unacknowledged batches per stream.
    #[serde(default = "d_window")]
    pub window_batches_max: usize,
    /// Largest replication frame this node sends, bytes: batches are cut by size as well
    /// as by count, and snapshots travel in chunks of at most this.
    #[serde(default = "d_frame_bytes")]
    pub frame_bytes_max: usize,
    #[serde(default = "d_backoff_initial")]
    pub backoff_initial_ms: u64,
    #[serde(default = "d_backoff_max")]
    pub backoff_max_ms: u64,
    /// A remote origin's instances are marked stale after its link was silent this long.
    #[serde(default = "d_stale")]
    pub stale_after_ms: u64,
    /// Own log entries and tombstones are purged only when every peer acked past them and
    /// they are older than this.
    #[serde(default = "d_grace")]
    pub purge_grace_ms: u64,
    /// Liveness ping when a stream is idle.
    #[serde(default = "d_ping")]
    pub ping_interval_ms: u64,
    /// Wire schema version written on the streams this DC dials (docs/schemas.md): the
    /// newest by default; a peer that answers in an older one is written that one. Set 1
    /// to write only version 1.
    #[serde(default = "d_schema_version")]
    pub schema_version: u16,
    /// Sources that may start a replication handshake: `"peers"` (the configured peers'
    /// IP addresses, the default), networks or addresses (`"10.20.0.0/16"`), or `"any"`
    /// (the opt-out, for NAT and relays that hide a peer's address). Packets from other
    /// sources are dropped unanswered.
    #[serde(default = "SourceRule::defaults")]
    pub accept_from: Vec<SourceRule>,
    /// Replication handshakes run at once; more are refused (the dialer retries).
    #[serde(default = "d_handshakes_max")]
    pub handshakes_max: usize,
}

fn d_handshakes_max() -> usize {
    tandem_replicator::gateway::HANDSHAKES_MAX_DEFAULT
}

fn d_batch() -> usize {
    512
}
fn d_window() -> usize {
    8
}
fn d_frame_bytes() -> usize {
    tandem_schemas::FRAME_BYTES_MAX
}
/// Smallest `frame_bytes_max` accepted (tests lower it to stream small states in many chunks).
pub const FRAME_BYTES_MIN: usize = 16 * 1024;
fn d_backoff_initial() -> u64 {
    200
}
fn d_backoff_max() -> u64 {
    10_000
}
fn d_stale() -> u64 {
    30_000
}
fn d_grace() -> u64 {
    3_600_000
}
fn d_ping() -> u64 {
    1_000
}
fn d_schema_version() -> u16 {
    tandem_schemas::SCHEMA_VERSION
}

#[derive(Clone, Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// "human" (default) or "json".
    pub format: Option<String>,
    /// A tracing filter such as "info" or "tandem=debug".
    pub level: Option<String>,
}

/// The client-facing HTTP API and its limits (docs/deploy.md, "Limits"). The listener's
/// limits (connections, timeouts, header size, HTTP/2) take effect at start; `allowed_hosts`,
/// the stream and blocking-query caps and `admin_calls_per_minute` also on reload.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSection {
    /// Most streaming watches (`?stream=true`) open at once; one more is refused with 503
    /// `too_many_watches` (each holds a connection and a task).
    pub watch_streams_max: u64,
    /// Most streaming watches open at once from one client IP address; one more is refused
    /// with 429 `too_many_watches` (so one client cannot take every stream). Above
    /// `watch_streams_max` it has no effect.
    pub watch_streams_per_address_max: u64,
    /// Most blocking queries (`?index=`) waiting at once; one more is refused with 503
    /// `too_many_blocking_queries`.
    pub blocking_queries_max: u64,
    /// Most blocking queries waiting at once from one client IP address; one more gets 429.
    pub blocking_queries_per_address_max: u64,
    /// Most client connections open at once (further capped by the descriptor budget: the
    /// open-files limit less what RocksDB and the node keep). One more is closed at accept.
    pub connections_max: u64,
    /// Most connections open at once from one client IP address. Load generators and
    /// clients behind a NAT need more; set it explicitly for them. (The SDK holds a
    /// connection per provider: a host with many SDK instances takes as many.)
    pub connections_per_address_max: u64,
    /// HTTP/1.1: a request head must arrive whole within this, counted from when the
    /// connection is ready for its next request (so it also ends idle keep-alive).
    pub header_read_timeout_ms: u64,
    /// A connection with no request in flight for this long is closed (HTTP/2 above all).
    pub idle_timeout_ms: u64,
    /// A request (reading its body and producing its answer) must finish within this;
    /// blocking queries get their `wait` on top, streaming watches are bounded by their own
    /// keep-alive once their answer has started.
    pub request_timeout_ms: u64,
    /// Largest request head (HTTP/1.1 read buffer, HTTP/2 header list), bytes.
    pub header_bytes_max: usize,
    /// HTTP/2: most concurrent streams per connection.
    pub h2_streams_max: u32,
    /// HTTP/2: ping an idle connection this often, and close it when a ping goes
    /// unanswered for `h2_keepalive_timeout_ms`.
    pub h2_keepalive_interval_ms: u64,
    pub h2_keepalive_timeout_ms: u64,
    /// Host names (the `Host` header, port ignored) this node answers. Empty (the default)
    /// allows the loopback names and the host of `http_addr` (any IP literal when it is a
    /// wildcard address); `["*"]` turns the check off. Guards against DNS rebinding.
    pub allowed_hosts: Vec<String>,
    /// Admin calls (`/v1/admin/*`) allowed per minute, node-wide; more get 429.
    pub admin_calls_per_minute: u32,
    /// `[http.tls]`: HTTPS instead of plain HTTP (turning it on or off takes a restart;
    /// its files are re-read on reload).
    pub tls: Option<HttpTlsSection>,
}

impl Default for HttpSection {
    fn default() -> Self {
        HttpSection {
            watch_streams_max: 65_536,
            watch_streams_per_address_max: 16_384,
            blocking_queries_max: 65_536,
            blocking_queries_per_address_max: 16_384,
            connections_max: 16_384,
            connections_per_address_max: 1_024,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            request_timeout_ms: 10_000,
            header_bytes_max: 64 * 1024,
            h2_streams_max: 256,
            h2_keepalive_interval_ms: 20_000,
            h2_keepalive_timeout_ms: 10_000,
            allowed_hosts: Vec::new(),
            admin_calls_per_minute: 30,
            tls: None,
        }
    }
}

impl HttpSection {
    fn validate(&self) -> Result<(), ConfigError> {
        let ranges: [(&str, u64, u64, u64); 13] = [
            ("watch_streams_max", self.watch_streams_max, 1, 1_000_000),
            ("watch_streams_per_address_max", self.watch_streams_per_address_max, 1, 1_000_000),
            ("blocking_queries_max", self.blocking_queries_max, 1, 1_000_000),
            ("blocking_queries_per_address_max", self.blocking_queries_per_address_max, 1, 1_000_000),
            ("connections_max", self.connections_max, 1, 1_000_000),
            ("connections_per_address_max", self.connections_per_address_max, 1, 1_000_000),
            ("header_read_timeout_ms", self.header_read_timeout_ms, 100, 600_000),
            ("idle_timeout_ms", self.idle_timeout_ms, 100, 3_600_000),
            ("request_timeout_ms", self.request_timeout_ms, 100, 600_000),
            ("header_bytes_max", self.header_bytes_max as u64, 8_192, 1 << 20),
            ("h2_streams_max", u64::from(self.h2_streams_max), 1, 65_536),
            ("h2_keepalive_interval_ms", self.h2_keepalive_interval_ms, 100, 3_600_000),
            ("h2_keepalive_timeout_ms", self.h2_keepalive_timeout_ms, 100, 3_600_000),
        ];
        for (key, v, lo, hi) in ranges {
            if !(lo..=hi).contains(&v) {
                return Err(inv(format!("[http] {key}"), format!("must be {lo}..={hi}")));
            }
        }
        // (The stream and blocking-query caps per address may exceed their totals: the
        // total is checked first, so the lower one rules.)
        if self.connections_per_address_max > self.connections_max {
            return Err(inv("[http] connections_per_address_max", "must be at most connections_max"));
        }
        if !(1..=10_000).contains(&self.admin_calls_per_minute) {
            return Err(inv("[http] admin_calls_per_minute", "must be 1..=10000"));
        }
        if let Some(tls) = &self.tls {
            tls.validate()?;
        }
        for h in &self.allowed_hosts {
            let ok = h == "*"
                || (!h.is_empty()
                    && h.len() <= 253
                    && h.chars().all(|c| c.is_ascii_alphanumeric() || "-.:[]_".contains(c)));
            if !ok {
                return Err(inv("[http] allowed_hosts", format!("{h:?} is not a host name (or \"*\")")));
            }
        }
        Ok(())
    }
}

/// The event log's write path.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSection {
    /// Longest time a group commit waits for more concurrent writes before its fsync
    /// (0 = never wait). Only rounds that already hold two or more writes wait, and only
    /// until they are as large as the previous round ended up, or until three gaps pass
    /// with no new write.
    pub group_commit_linger_us: u64,
    /// Sleep between two looks for new writes while waiting.
    pub group_commit_gap_us: u64,
    /// A wait never holds out for more writes than this.
    pub group_commit_target: usize,
    /// RocksDB memtable size per column family, MiB (bounds the memory the log's
    /// unflushed writes take).
    pub write_buffer_mib: usize,
    /// Most table files RocksDB keeps open. Part of the descriptor budget: the HTTP
    /// listener refuses connections before they could take RocksDB's descriptors.
    pub max_open_files: u32,
    /// After a failed write (full disk, I/O error) the event log refuses writes; the first
    /// recovery attempt (reopen and a probe write) waits this long, ms.
    pub recovery_backoff_initial_ms: u64,
    /// Each failed attempt doubles the wait, up to this, ms.
    pub recovery_backoff_max_ms: u64,
}

impl Default for StoreSection {
    fn default() -> Self {
        use crate::store as c;
        StoreSection {
            group_commit_linger_us: c::LINGER_MAX_US_DEFAULT,
            group_commit_gap_us: c::LINGER_GAP_US_DEFAULT,
            group_commit_target: c::LINGER_TARGET_DEFAULT,
            write_buffer_mib: c::WRITE_BUFFER_MIB_DEFAULT,
            max_open_files: c::MAX_OPEN_FILES_DEFAULT,
            recovery_backoff_initial_ms: c::RECOVERY_BACKOFF_INITIAL_MS_DEFAULT,
            recovery_backoff_max_ms: c::RECOVERY_BACKOFF_MAX_MS_DEFAULT,
        }
    }
}

impl StoreSection {
    pub fn committer_limits(&self) -> crate::store::CommitterLimits {
        crate::store::CommitterLimits {
            linger_max: std::time::Duration::from_micros(self.group_commit_linger_us),
            linger_gap: std::time::Duration::from_micros(self.group_commit_gap_us),
            linger_target: self.group_commit_target,
            recovery_backoff_initial: std::time::Duration::from_millis(self.recovery_backoff_initial_ms),
            recovery_backoff_max: std::time::Duration::from_millis(self.recovery_backoff_max_ms),
            ..Default::default()
        }
    }
}

/// A configuration problem, with the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Parse { path: PathBuf, source: Box<toml::de::Error> },
    /// A value out of its range or inconsistent with another; `key` names it as it is
    /// written in the file (`[store] group_commit_linger_us`).
    #[error("invalid config: {key}: {reason}")]
    Invalid { key: String, reason: String },
    #[error("invalid config: [health] {0}")]
    Health(#[from] crate::health::HealthConfigError),
    #[error("invalid config: [failover] {0}")]
    Failover(#[from] crate::failover::PolicyError),
}

fn inv(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.into(), reason: reason.into() }
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.into(), source })?;
        let cfg: Config = toml::from_str(&text)
            .map_err(|source| ConfigError::Parse { path: path.into(), source: Box::new(source) })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// A single node on embedded defaults.
    pub fn single(dc: &str, data_dir: PathBuf, http_addr: SocketAddr) -> Config {
        Config {
            dc: dc.into(),
            data_dir,
            http_addr,
            health: Default::default(),
            protection: Default::default(),
            replication: None,
            cluster: None,
            failover: Default::default(),
            log: Default::default(),
            store: Default::default(),
            http: Default::default(),
            acl: Default::default(),
            limits: Default::default(),
            audit: Default::default(),
            ui: Default::default(),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        tandem_schemas::validate_dc("dc", &self.dc).map_err(|e| inv("dc", e.to_string()))?;
        let p = &self.protection;
        if !(1..=crate::health::DURATION_MS_LIMIT).contains(&p.self_preservation_max_pause_ms) {
            return Err(inv("[protection] self_preservation_max_pause_ms", "must be 1..=86400000 (one day)"));
        }
        self.health_config().validate()?;
        if !(0.0..=1.0).contains(&p.self_preservation_threshold) {
            return Err(inv("[protection] self_preservation_threshold", "must be within 0..=1"));
        }
        if !(0.0..=1.0).contains(&p.protect_threshold) {
            return Err(inv("[protection] protect_threshold", "must be within 0..=1"));
        }
        for (k, v) in &p.services {
            if !(0.0..=1.0).contains(v) || !k.contains('/') {
                return Err(inv(format!("[protection.services] {k:?}"), "use \"namespace/service\" = 0..=1"));
            }
        }
        if self.health.check_interval_ms == 0 || self.health.check_interval_ms > 10_000 {
            return Err(inv("[health] check_interval_ms", "must be 1..=10000"));
        }
        self.http.validate()?;
        self.acl.validate().map_err(|(key, reason)| inv(key, reason))?;
        self.limits.validate().map_err(|(key, reason)| inv(key, reason))?;
        self.audit.validate().map_err(|(key, reason)| inv(key, reason))?;
        let st = &self.store;
        if st.group_commit_linger_us > 10_000 {
            return Err(inv("[store] group_commit_linger_us", "must be 0..=10000"));
        }
        if st.group_commit_gap_us == 0 || st.group_commit_gap_us > st.group_commit_linger_us.max(1) {
            return Err(inv("[store] group_commit_gap_us", "must be 1..=group_commit_linger_us"));
        }
        if !(2..=1024).contains(&st.group_commit_target) {
            return Err(inv("[store] group_commit_target", "must be 2..=1024"));
        }
        if !(1..=1024).contains(&st.write_buffer_mib) {
            return Err(inv("[store] write_buffer_mib", "must be 1..=1024"));
        }
        if !(16..=1_000_000).contains(&st.max_open_files) {
            return Err(inv("[store] max_open_files", "must be 16..=1000000"));
        }
        if !(10..=60_000).contains(&st.recovery_backoff_initial_ms) {
            return Err(inv("[store] recovery_backoff_initial_ms", "must be 10..=60000"));
        }
        if !(st.recovery_backoff_initial_ms..=300_000).contains(&st.recovery_backoff_max_ms) {
            return Err(inv(
                "[store] recovery_backoff_max_ms",
                "must be recovery_backoff_initial_ms..=300000",
            ));
        }
        if let Some(r) = &self.replication {
            for peer in &r.peers {
                tandem_schemas::validate_dc("replication.peers.dc", &peer.dc)
                    .map_err(|e| inv("[replication] peers.dc", e.to_string()))?;
                if peer.dc == self.dc {
                    return Err(inv("[replication] peers.dc", format!("{} is this node's own DC", peer.dc)));
                }
                if peer.all_addrs().len() > PEER_ADDRS_MAX {
                    return Err(inv(
                        "[replication] peers.addrs",
                        format!("{} lists more than {PEER_ADDRS_MAX} addresses", peer.dc),
                    ));
                }
                let namespaces = peer.namespaces.as_deref().unwrap_or_default();
                if namespaces.len() > PEER_SCOPE_NAMESPACES_MAX {
                    return Err(inv(
                        "[replication] peers.namespaces",
                        format!(
                            "{} names {} namespaces; at most {PEER_SCOPE_NAMESPACES_MAX}",
                            peer.dc,
                            namespaces.len()
                        ),
                    ));
                }
                for ns in namespaces {
                    tandem_schemas::validate_name("replication.peers.namespaces", ns)
                        .map_err(|e| inv("[replication] peers.namespaces", format!("{}: {e}", peer.dc)))?;
                }
            }
            let mut names: Vec<&str> = r.peers.iter().map(|p| p.dc.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            if names.len() != r.peers.len() {
                return Err(inv("[replication] peers", "a peer DC is listed twice"));
            }
            if r.batch_events_max == 0 || r.batch_events_max > tandem_schemas::BATCH_EVENTS_MAX {
                return Err(inv(
                    "[replication] batch_events_max",
                    format!("must be 1..={}", tandem_schemas::BATCH_EVENTS_MAX),
                ));
            }
            if !(FRAME_BYTES_MIN..=tandem_schemas::FRAME_BYTES_MAX).contains(&r.frame_bytes_max) {
                return Err(inv(
                    "[replication] frame_bytes_max",
                    format!("must be {FRAME_BYTES_MIN}..={}", tandem_schemas::FRAME_BYTES_MAX),
                ));
            }
            if r.window_batches_max == 0 || r.window_batches_max > 1024 {
                return Err(inv("[replication] window_batches_max", "must be 1..=1024"));
            }
            if r.backoff_initial_ms == 0 || r.backoff_max_ms < r.backoff_initial_ms {
                return Err(inv(
                    "[replication] backoff_initial_ms",
                    "need 0 < backoff_initial_ms <= backoff_max_ms",
                ));
            }
            if !(tandem_schemas::SCHEMA_VERSION_MIN..=tandem_schemas::SCHEMA_VERSION)
                .contains(&r.schema_version)
            {
                return Err(inv(
                    "[replication] schema_version",
                    format!(
                        "must be {}..={}",
                        tandem_schemas::SCHEMA_VERSION_MIN,
                        tandem_schemas::SCHEMA_VERSION
                    ),
                ));
            }
            if r.ping_interval_ms == 0 || r.ping_interval_ms >= r.stale_after_ms {
                return Err(inv(
                    "[replication] ping_interval_ms",
                    "need 0 < ping_interval_ms < stale_after_ms",
                ));
            }
            if r.handshakes_max == 0 || r.handshakes_max > 1024 {
                return Err(inv("[replication] handshakes_max", "must be 1..=1024"));
            }
            if r.accept_from.is_empty() {
                return Err(inv(
                    "[replication] accept_from",
                    "must name at least one source (\"peers\" is the default; \"any\" opts out)",
                ));
            }
        }
        if let Some(c) = &self.cluster {
            c.validate().map_err(|(key, reason)| inv(key, reason))?;
        }
        self.failover.validate()?;
        Ok(())
    }

    pub fn health_config(&self) -> HealthConfig {
        let h = &self.health;
        let p = &self.protection;
        HealthConfig {
            heartbeat_interval_ms: h.heartbeat_interval_ms,
            suspect_after_ms: h.suspect_after_ms,
            unhealthy_after_ms: h.unhealthy_after_ms,
            expire_after_ms: h.expire_after_ms,
            recovery_heartbeats: h.recovery_heartbeats,
            flap_window_ms: h.flap_window_ms,
            flap_transitions_max: h.flap_transitions_max,
            self_preservation_enabled: p.self_preservation,
            self_preservation_threshold: p.self_preservation_threshold,
            self_preservation_window_ms: p.self_preservation_window_ms,
            self_preservation_max_pause_ms: p.self_preservation_max_pause_ms,
            ..HealthConfig::default()
        }
    }

    /// The protect threshold of one service.
    pub fn protect_threshold(&self, namespace: &str, service: &str) -> f64 {
        let k = format!("{namespace}/{service}");
        self.protection.services.get(&k).copied().unwrap_or(self.protection.protect_threshold)
    }
}

#[cfg(test)]
mod tests;
