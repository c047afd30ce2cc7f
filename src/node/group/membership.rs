//! The group's members, and changing them (`tandem cluster add|remove|replace`,
//! `/v1/admin/cluster/members`; docs/operations.md, "Adding, removing and replacing a
//! member").
//!
//! The configured `[cluster] members` only form the group. From then on its membership is
//! the one in its Raft log: openraft's, each member's node carrying both of its addresses
//! ([`crate::cluster::node_of`]). Every member follows it ([`follow_membership`]): its member link calls
//! and admits exactly the members the log names, so a member added by `tandem cluster
//! add` is reached without editing any file or restarting anyone, and a removed one is
//! refused.
//!
//! A change is made on the leader, one at a time:
//! - **add**: the new node (started with `[cluster] join = true`, so that it never forms a
//!   group of its own) becomes a learner; the leader sends it the log or a snapshot; once
//!   it holds all but [`CAUGHT_UP_ENTRIES_MAX`] entries of the leader's log (within
//!   [`CATCH_UP_TIMEOUT`]) it is promoted to a voter. Until then it votes for no one and
//!   counts toward no quorum, so a slow catch-up never stalls writes.
//! - **remove**: the member leaves the voters and the membership in one change.
//! - **replace**: the new node is added as a learner and caught up, then one change swaps
//!   it for the old one (openraft's joint consensus: never a moment with neither).
//!
//! Refused (nothing changed): a change whose voters afterwards would not include a quorum
//! that answers now ([`MembershipError::WouldLoseQuorum`]: each voter is asked for its log
//! reach within [`PROBE_TIMEOUT`]), removing the leader (hand the lead over first), a second
//! change while one runs, an id or address already in the group, and more than
//! [`MEMBERS_MAX`] members.

use std::collections::BTreeSet;

use super::*;
use crate::cluster::addrs_of;
use crate::config::MEMBERS_MAX;

/// How far behind the leader's last log entry a learner may be when it is promoted (as
/// `tandem cluster status` counts a member caught up).
pub const CAUGHT_UP_ENTRIES_MAX: u64 = 100;

/// Longest a new member may take to catch up before its promotion is given up (it stays a
/// learner: `tandem cluster remove` takes it out, or `add` again promotes it once caught up).
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);

/// Longest a membership entry may take to commit (a voter lost right after the quorum
/// check): the change is then reported failed, and may still take effect.
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long each voter has to answer before a change counts it as down.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// One member of the group as its membership names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    pub raft_addr: SocketAddr,
    /// Unknown only for a member that a group formed by an earlier release names and the
    /// file does not.
    pub http_addr: Option<SocketAddr>,
    /// A voter (a learner otherwise: it catches up and votes for no one).
    pub voter: bool,
}

/// The members `metrics` names (the log's membership), or the file's before this member
/// holds any membership (a joining node that was not added yet). A member the file lists
/// is reached at the file's addresses.
pub fn members_of(
    metrics: &openraft::RaftMetrics<NodeId, BasicNode>,
    section: &ClusterSection,
) -> Vec<Member> {
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let mut members: Vec<Member> = membership
        .nodes()
        .filter_map(|(id, node)| {
            // The file's addresses first: where this member reaches that one may differ from
            // where the member that added it does (a relay, another network); a member the
            // file does not list is reached where the membership says.
            let (raft, http) = match section.member(*id) {
                Some(m) => (m.raft_addr, Some(m.http_addr)),
                None => addrs_of(node)?,
            };
            Some(Member { id: *id, raft_addr: raft, http_addr: http, voter: voters.contains(id) })
        })
        .collect();
    if members.is_empty() {
        members = section
            .members
            .iter()
            .map(|m| Member { id: m.id, raft_addr: m.raft_addr, http_addr: Some(m.http_addr), voter: true })
            .collect();
    }
    members
}

/// Keeps `link`'s members equal to the group's membership, as this member's Raft learns
/// of changes, until Raft shuts down.
pub fn follow_membership(raft: &Raft<TypeConfig>, link: MemberLink, section: ClusterSection) {
    let mut metrics = raft.metrics();
    tokio::spawn(async move {
        let mut seen: Option<Vec<(u64, SocketAddr)>> = None;
        loop {
            let addrs: Vec<(u64, SocketAddr)> = members_of(&metrics.borrow_and_update(), &section)
                .iter()
                .map(|m| (m.id, m.raft_addr))
                .collect();
            if seen.as_ref() != Some(&addrs) {
                if seen.is_some() {
                    tracing::info!(members = ?addrs, "the group's members changed");
                }
                link.set_members(&addrs);
                seen = Some(addrs);
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    });
}

/// A change of the group's membership that was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Add this node (as a learner only, when `voter` is false).
    Add {
        id: NodeId,
        raft_addr: SocketAddr,
        http_addr: SocketAddr,
        voter: bool,
    },
    Remove {
        id: NodeId,
    },
    /// Add `new` and then swap it for `old` in one change.
    Replace {
        old: NodeId,
        id: NodeId,
        raft_addr: SocketAddr,
        http_addr: SocketAddr,
    },
}

/// A change that was made.
#[derive(Clone, Debug, Serialize)]
pub struct Changed {
    /// The voters and learners after it.
    pub voters: Vec<NodeId>,
    pub learners: Vec<NodeId>,
    /// From the request to the change committed.
    pub took_ms: u64,
}

/// Why a change was not made. Nothing changed, except for [`MembershipError::NotCaughtUp`]
/// (the node stays a learner) and [`MembershipError::Failed`] (as the error says).
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error("this node does not serve writes now: send the request to the leader")]
    NotServing,
    #[error("{0}")]
    Invalid(String),
    #[error("node {0} is already a member of this group")]
    Exists(NodeId),
    #[error("node {0} is not a member of this group")]
    Unknown(NodeId),
    #[error(
        "node {0} leads this group: hand the lead to another member first (tandem cluster transfer-leader)"
    )]
    IsLeader(NodeId),
    #[error(
        "refused: after the change {up} of its {voters} voters answer now, and a quorum is {needed} \
         (not answering: {down:?}); bring them back first, or remove a dead member before adding"
    )]
    WouldLoseQuorum { up: usize, voters: usize, needed: usize, down: Vec<NodeId> },
    #[error(
        "node {id} did not catch up within {}s (it holds index {matched} of the leader's {last}): it stays \
         a learner; `tandem cluster remove --id {id}` takes it out",
        CATCH_UP_TIMEOUT.as_secs()
    )]
    NotCaughtUp { id: NodeId, matched: u64, last: u64 },
    #[error("another membership change is under way")]
    Busy,
    #[error("the change failed: {0}")]
    Failed(String),
    #[error("this node emulates the previous release, which had no membership changes")]
    NotInThisRelease,
}

/// Waits for a membership entry to commit, at most [`COMMIT_TIMEOUT`].
async fn committed<T, E: std::fmt::Display>(
    change: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, MembershipError> {
    match tokio::time::timeout(COMMIT_TIMEOUT, change).await {
        Ok(r) => r.map_err(|e| MembershipError::Failed(e.to_string())),
        Err(_) => Err(MembershipError::Failed(format!(
            "not committed within {}s (a quorum of voters stopped answering?); it may still take effect: see \
             tandem cluster status",
            COMMIT_TIMEOUT.as_secs()
        ))),
    }
}

impl Group {
    /// The group's members, as its log's membership names them.
    pub fn members(&self) -> Vec<Member> {
        members_of(&self.raft.metrics().borrow(), &self.section)
    }

    /// Makes `change` (see the module's rules) and answers once it is committed.
    pub async fn change_members(&self, change: Change) -> Result<Changed, MembershipError> {
        let started = std::time::Instant::now();
        if self.section.emulate_previous_release {
            return Err(MembershipError::NotInThisRelease);
        }
        let _one = self.changing.try_lock().map_err(|_| MembershipError::Busy)?;
        if !self.serving() {
            return Err(MembershipError::NotServing);
        }
        let members = self.members();
        let voters: BTreeSet<NodeId> = members.iter().filter(|m| m.voter).map(|m| m.id).collect();
        match change {
            Change::Add { id, raft_addr, http_addr, voter } => {
                self.add_learner(&members, id, raft_addr, http_addr).await?;
                if voter {
                    self.caught_up(id).await?;
                    let after: BTreeSet<NodeId> = voters.iter().copied().chain([id]).collect();
                    self.check_quorum(&after).await?;
                    committed(
                        self.raft.change_membership(openraft::ChangeMembers::AddVoterIds([id].into()), false),
                    )
                    .await?;
                    tracing::info!(node = self.id, voter = id, "promoted a learner to voter");
                }
            }
            Change::Remove { id } => {
                let Some(gone) = members.iter().find(|m| m.id == id) else {
                    return Err(MembershipError::Unknown(id));
                };
                if id == self.id {
                    return Err(MembershipError::IsLeader(id));
                }
                if gone.voter {
                    let after: BTreeSet<NodeId> = voters.iter().copied().filter(|v| *v != id).collect();
                    self.check_quorum(&after).await?;
                    committed(
                        self.raft
                            .change_membership(openraft::ChangeMembers::RemoveVoters([id].into()), false),
                    )
                    .await?;
                } else {
                    committed(
                        self.raft.change_membership(openraft::ChangeMembers::RemoveNodes([id].into()), false),
                    )
                    .await?;
                }
                tracing::info!(node = self.id, removed = id, "removed a member");
            }
            Change::Replace { old, id, raft_addr, http_addr } => {
                if !voters.contains(&old) {
                    return Err(MembershipError::Unknown(old));
                }
                if old == self.id {
                    return Err(MembershipError::IsLeader(old));
                }
                let after: BTreeSet<NodeId> =
                    voters.iter().copied().filter(|v| *v != old).chain([id]).collect();
                if id == old {
                    return Err(MembershipError::Invalid(format!("node {id} cannot replace itself")));
                }
                // The new node may take the old one's addresses (the same machine, its disk
                // wiped).
                let others: Vec<Member> = members.iter().filter(|m| m.id != old).cloned().collect();
                self.add_learner(&others, id, raft_addr, http_addr).await?;
                self.caught_up(id).await?;
                self.check_quorum(&after).await?;
                committed(
                    self.raft.change_membership(openraft::ChangeMembers::ReplaceAllVoters(after), false),
                )
                .await?;
                tracing::info!(node = self.id, old, new = id, "replaced a member");
            }
        }
        let now = self.members();
        Ok(Changed {
            voters: now.iter().filter(|m| m.voter).map(|m| m.id).collect(),
            learners: now.iter().filter(|m| !m.voter).map(|m| m.id).collect(),
            took_ms: started.elapsed().as_millis() as u64,
        })
    }

    /// Adds `id` as a learner, unless it is one already (an earlier `add` whose catch-up
    /// ran out: it is promoted, not added again). `members`: those whose id and addresses
    /// it must not take.
    async fn add_learner(
        &self,
        members: &[Member],
        id: NodeId,
        raft: SocketAddr,
        http: SocketAddr,
    ) -> Result<(), MembershipError> {
        if members.iter().any(|m| m.id == id && !m.voter) {
            return Ok(());
        }
        self.check_new(members, id, raft, http)?;
        committed(self.raft.add_learner(id, crate::cluster::node_of(raft, http), false)).await?;
        tracing::info!(node = self.id, learner = id, raft = %raft, "added a learner");
        Ok(())
    }

    /// Refuses a new member whose id or addresses the group already holds, or one past
    /// [`MEMBERS_MAX`].
    fn check_new(
        &self,
        members: &[Member],
        id: NodeId,
        raft: SocketAddr,
        http: SocketAddr,
    ) -> Result<(), MembershipError> {
        if id == 0 || id > i64::MAX as u64 {
            return Err(MembershipError::Invalid(format!("node id {id} is not within 1..=2^63-1")));
        }
        if members.iter().any(|m| m.id == id) {
            return Err(MembershipError::Exists(id));
        }
        if let Some(m) = members.iter().find(|m| m.raft_addr == raft || m.http_addr == Some(http)) {
            return Err(MembershipError::Invalid(format!(
                "node {} already listens on one of these addresses",
                m.id
            )));
        }
        if members.len() >= MEMBERS_MAX {
            return Err(MembershipError::Invalid(format!("a group has at most {MEMBERS_MAX} members")));
        }
        Ok(())
    }

    /// Waits until learner `id` holds all but [`CAUGHT_UP_ENTRIES_MAX`] entries of this
    /// leader's log.
    async fn caught_up(&self, id: NodeId) -> Result<(), MembershipError> {
        let mut metrics = self.raft.metrics();
        let matched_of = |m: &openraft::RaftMetrics<NodeId, BasicNode>| {
            let matched = m.replication.as_ref().and_then(|r| r.get(&id)).and_then(|l| l.map(|l| l.index));
            (matched.unwrap_or(0), m.last_log_index.unwrap_or(0))
        };
        let waited = tokio::time::timeout(
            CATCH_UP_TIMEOUT,
            metrics.wait_for(|m| {
                let (matched, last) = matched_of(m);
                m.state != ServerState::Leader || matched + CAUGHT_UP_ENTRIES_MAX >= last
            }),
        )
        .await;
        let (matched, last) = matched_of(&self.raft.metrics().borrow());
        match waited {
            Ok(Ok(m)) if m.state == ServerState::Leader => Ok(()),
            Ok(_) => Err(MembershipError::NotServing),
            Err(_) => Err(MembershipError::NotCaughtUp { id, matched, last }),
        }
    }

    /// Refuses when fewer than a quorum of `voters` answer now (this node answers itself).
    async fn check_quorum(&self, voters: &BTreeSet<NodeId>) -> Result<(), MembershipError> {
        if voters.is_empty() {
            return Err(MembershipError::Invalid("a group keeps at least one voter".into()));
        }
        let asks = voters.iter().filter(|v| **v != self.id).map(|v| async move {
            (*v, crate::cluster::log_state(&self.link, *v, PROBE_TIMEOUT).await.is_ok())
        });
        let answers = futures::future::join_all(asks).await;
        let down: Vec<NodeId> = answers.iter().filter(|(_, up)| !up).map(|(v, _)| *v).collect();
        let up = voters.len() - down.len();
        let needed = voters.len() / 2 + 1;
        if up < needed {
            return Err(MembershipError::WouldLoseQuorum { up, voters: voters.len(), needed, down });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::config::MemberSection;

    fn at(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// This member's file lists members 1..=3 at addresses of its own (relays in front of
    /// them); the membership that member 1 formed names them at its own, and member 4,
    /// added later, only there.
    #[test]
    fn the_file_names_where_its_members_are_reached_and_the_membership_the_rest() {
        let section = ClusterSection::with_defaults(
            2,
            (1..=3)
                .map(|id| MemberSection {
                    id,
                    raft_addr: at(9000 + id as u16),
                    http_addr: at(8000 + id as u16),
                })
                .collect(),
            tandem_replicator::tls::TlsPaths { ca_cert: "c".into(), cert: "c".into(), key: "k".into() },
        );
        let mut metrics = openraft::RaftMetrics::<NodeId, BasicNode>::new_initial(2);
        assert_eq!(members_of(&metrics, &section).len(), 3, "no membership yet: the file's");
        let nodes: BTreeMap<NodeId, BasicNode> = (1..=4)
            .map(|id| (id, crate::cluster::node_of(at(7000 + id as u16), at(6000 + id as u16))))
            .collect();
        let membership = openraft::Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes);
        metrics.membership_config = Arc::new(openraft::StoredMembership::new(None, membership));
        let members = members_of(&metrics, &section);
        let of = |id: NodeId| members.iter().find(|m| m.id == id).cloned().unwrap();
        assert_eq!((of(1).raft_addr, of(1).http_addr, of(1).voter), (at(9001), Some(at(8001)), true));
        assert_eq!((of(4).raft_addr, of(4).http_addr, of(4).voter), (at(7004), Some(at(6004)), false));
        // A group formed by an earlier release: the node carries its Raft address alone.
        let lone = BasicNode::new(at(7005).to_string());
        assert_eq!(addrs_of(&lone), Some((at(7005), None)));
        assert_eq!(addrs_of(&BasicNode::new("not an address")), None);
    }
}
