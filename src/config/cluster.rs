//! `[cluster]`: this node's place in its DC's Raft group (docs/cluster.md). Absent: the
//! node is its DC's only node, as before. Taken at start; a reload that changes it is
//! refused (membership changes go through `tandem cluster`, not the file).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;
use tandem_replicator::gateway::SourceRule;

/// Most members of one DC's group (and most nodes `tandem certs --nodes` makes per DC).
pub const MEMBERS_MAX: usize = 9;

/// One member of the group, as every member's file lists it (the same list on each).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MemberSection {
    /// The member's id: 1..=2^63, its certificate names `n<id>.<dc>.tandem-node`.
    pub id: u64,
    /// Where the member's link listens (UDP, QUIC with mutual TLS).
    pub raft_addr: SocketAddr,
    /// Where the member's HTTP API is reached (a follower forwards writes there).
    pub http_addr: SocketAddr,
}

/// The `[cluster]` table.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// This node's id: one of `members`.
    pub node_id: u64,
    /// Every member of the group, this node included (odd counts survive the most
    /// failures per node: 3 survive one, 5 survive two).
    pub members: Vec<MemberSection>,
    /// The CA that signed the members' node certificates, and this node's certificate
    /// and key (`tandem certs --nodes N` makes them). A DC certificate is refused here.
    pub ca_cert: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// How often the leader tells followers it is alive.
    #[serde(default = "d_heartbeat")]
    pub heartbeat_interval_ms: u64,
    /// A follower that heard no leader for a random time in this range stands for
    /// election: the bound on how long a DC is without a leader after one dies.
    #[serde(default = "d_election_min")]
    pub election_timeout_min_ms: u64,
    #[serde(default = "d_election_max")]
    pub election_timeout_max_ms: u64,
    /// How long a follower waits for the leader's answer to a forwarded write, and then
    /// for its own apply to reach it.
    #[serde(default = "d_forward_timeout")]
    pub forward_timeout_ms: u64,
    /// Sources that may start a handshake on the member link: `"peers"` (the members'
    /// addresses, the default), networks or addresses, or `"any"`.
    #[serde(default = "SourceRule::defaults")]
    pub accept_from: Vec<SourceRule>,
    /// A member snapshots its state every this many Raft entries and purges the log
    /// behind the snapshot (keeping at most [`SNAPSHOT_LOG_KEPT_MAX`] entries): a member
    /// further behind (one back from a disk loss, a new member) is sent the snapshot.
    #[serde(default = "d_snapshot_every")]
    pub snapshot_every_entries: u64,
    /// Testing an upgrade without a second build (docs/operations.md, "Testing an
    /// upgrade"): this member speaks the member link as the previous release did. It
    /// answers the requests added since (`Request::added_since_previous_release`)
    /// as undecodable, never sends them, and has no leadership transfer. Not for
    /// production; off by default.
    #[serde(default)]
    pub emulate_previous_release: bool,
    /// This node joins a group that was formed without it (`tandem cluster add` or
    /// `replace` makes it a member): it never forms a group of its own, and waits, with an
    /// empty log, until the leader adds it. `members` lists the group's members and this
    /// node (so that it admits the leader's connection). Ignored once its log holds
    /// anything.
    #[serde(default)]
    pub join: bool,
}

/// The default `snapshot_every_entries`.
pub const SNAPSHOT_EVERY_ENTRIES_DEFAULT: u64 = 5_000;
/// Most Raft entries a member keeps behind its last snapshot.
pub const SNAPSHOT_LOG_KEPT_MAX: u64 = 1_000;

/// The default Raft heartbeat interval (ms).
pub const HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 100;
/// The default election timeout range (ms): a killed leader's writes resume about 1.1 s
/// later (kill to another member serving writes; about 2.1 s with 500..1000, where
/// openraft's leader lease of the range's maximum makes the first candidate's votes
/// fail): docs/cluster.md.
pub const ELECTION_TIMEOUT_MS_DEFAULT: (u64, u64) = (300, 600);

fn d_heartbeat() -> u64 {
    HEARTBEAT_INTERVAL_MS_DEFAULT
}
fn d_election_min() -> u64 {
    ELECTION_TIMEOUT_MS_DEFAULT.0
}
fn d_election_max() -> u64 {
    ELECTION_TIMEOUT_MS_DEFAULT.1
}
fn d_forward_timeout() -> u64 {
    5_000
}
fn d_snapshot_every() -> u64 {
    SNAPSHOT_EVERY_ENTRIES_DEFAULT
}

impl ClusterSection {
    /// Member `node_id` of `members` with its node certificate `tls` and every other key
    /// at its default: for the groups a process writes itself (`tandem dev`, benchmarks).
    pub fn with_defaults(
        node_id: u64,
        members: Vec<MemberSection>,
        tls: tandem_replicator::tls::TlsPaths,
    ) -> ClusterSection {
        ClusterSection {
            node_id,
            members,
            ca_cert: tls.ca_cert,
            cert: tls.cert,
            key: tls.key,
            heartbeat_interval_ms: d_heartbeat(),
            election_timeout_min_ms: d_election_min(),
            election_timeout_max_ms: d_election_max(),
            forward_timeout_ms: d_forward_timeout(),
            accept_from: SourceRule::defaults(),
            snapshot_every_entries: d_snapshot_every(),
            emulate_previous_release: false,
            join: false,
        }
    }

    /// The section's own rules: (key, reason) of the first one broken.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let inv = |key: &str, reason: String| Err((format!("[cluster] {key}"), reason));
        if self.members.is_empty() || self.members.len() > MEMBERS_MAX {
            return inv(
                "members",
                format!("must list 1..={MEMBERS_MAX} members, this lists {}", self.members.len()),
            );
        }
        for (i, m) in self.members.iter().enumerate() {
            if m.id == 0 || m.id > i64::MAX as u64 {
                return inv("members.id", format!("{} is not within 1..=2^63-1", m.id));
            }
            for other in &self.members[..i] {
                if other.id == m.id {
                    return inv("members.id", format!("member {} is listed twice", m.id));
                }
                if other.raft_addr == m.raft_addr || other.http_addr == m.http_addr {
                    return inv("members", format!("members {} and {} share an address", other.id, m.id));
                }
            }
        }
        if !self.members.iter().any(|m| m.id == self.node_id) {
            return inv("node_id", format!("{} is not among the members", self.node_id));
        }
        if !(10..=10_000).contains(&self.heartbeat_interval_ms) {
            return inv("heartbeat_interval_ms", "must be 10..=10000".into());
        }
        if self.election_timeout_min_ms < 3 * self.heartbeat_interval_ms
            || self.election_timeout_min_ms > 60_000
        {
            return inv(
                "election_timeout_min_ms",
                "must be at least 3 heartbeat intervals and at most 60000".into(),
            );
        }
        if self.election_timeout_max_ms <= self.election_timeout_min_ms
            || self.election_timeout_max_ms > 120_000
        {
            return inv(
                "election_timeout_max_ms",
                "must be above election_timeout_min_ms, at most 120000".into(),
            );
        }
        if !(100..=600_000).contains(&self.forward_timeout_ms) {
            return inv("forward_timeout_ms", "must be 100..=600000".into());
        }
        if !(10..=10_000_000).contains(&self.snapshot_every_entries) {
            return inv("snapshot_every_entries", "must be 10..=10000000".into());
        }
        if self.accept_from.is_empty() {
            return inv("accept_from", "must name at least one source (\"peers\" is the default)".into());
        }
        Ok(())
    }

    /// This node's own entry.
    pub fn me(&self) -> &MemberSection {
        // validate() checked that node_id is listed; the first member stands in otherwise.
        self.members.iter().find(|m| m.id == self.node_id).unwrap_or(&self.members[0])
    }

    /// A member's entry.
    pub fn member(&self, id: u64) -> Option<&MemberSection> {
        self.members.iter().find(|m| m.id == id)
    }
}

impl super::Config {
    /// A digest of what every member of a DC group must answer discovery alike from, and
    /// that each member reads from its own file: `[failover]` and `[protection]` (16 hex
    /// digits of a SHA-256). A follower whose digest differs from its leader's refuses
    /// discovery (`policy_mismatch`, docs/cluster.md, "Reads on followers").
    pub fn policy_digest(&self) -> String {
        let text = format!("{:?}|{:?}", self.failover, self.protection);
        let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
        d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}
