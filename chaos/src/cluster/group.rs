//! DCs that are Raft groups (`--nodes N`, sandbox only): each member's `[cluster]` table,
//! finding the member that serves writes, and the leader kill: the clients move off the
//! leader, it gets SIGKILL, and the step is done once another member serves writes; the
//! killed member restarts later as a follower.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde_json::Value;
use tokio::time::Instant;

use super::{free_port, toml_str, Cluster};
use crate::plan::Action;
use crate::relay::{Faults, Relay};

/// Longest wait for another member to serve writes after a leader kill (an election takes
/// about a second with the default timings).
const FAILOVER_WAIT: Duration = Duration::from_secs(20);
/// Pause between status polls while waiting for a leader.
const LEADER_POLL: Duration = Duration::from_millis(25);
/// How long requests the clients sent to the leader before they moved off it may take to
/// complete before it is killed.
pub const DRAIN: Duration = Duration::from_millis(300);

/// One leader kill as the drill saw it.
#[derive(Clone, Debug)]
pub struct Failover {
    pub dc: String,
    /// The member killed and the one that served writes next (node ids).
    pub killed: u64,
    pub next: u64,
    /// From the SIGKILL until a status poll found the next member serving writes (an upper
    /// bound of the write gap; clients see it plus their retry interval).
    pub gap_ms: u64,
}

/// A DC's members: (id, raft address it listens on, HTTP address), and where each member
/// dials each other (`dial[k][j]`: the listen address, or a relay in front of it).
pub(super) struct Members {
    list: Vec<(u64, SocketAddr, SocketAddr)>,
    dial: Vec<Vec<SocketAddr>>,
}

/// Members 1..=N of a group whose HTTP addresses are `http`, each with a free member-link
/// port, dialled directly.
pub(super) fn members(http: &[SocketAddr]) -> anyhow::Result<Members> {
    let mut list = Vec::new();
    for (k, h) in http.iter().enumerate() {
        list.push((k as u64 + 1, SocketAddr::from(([127, 0, 0, 1], free_port(true)?)), *h));
    }
    let dial = (0..list.len()).map(|_| list.iter().map(|m| m.1).collect()).collect();
    Ok(Members { list, dial })
}

/// One relay on a member link: member `from`'s dials to member `to` (indices).
pub(super) struct MemberRelay {
    pub from: usize,
    pub to: usize,
    pub relay: Relay,
}

/// Puts a relay in front of every member for every other member's dials (a member's
/// `[cluster] members` lists the relay as the other's `raft_addr`; the node certificates
/// name the members, not their addresses), so that a drill can cut one member off.
pub(super) async fn relay_members(members: &mut Members, seed: u64) -> anyhow::Result<Vec<MemberRelay>> {
    let n = members.list.len();
    let mut out = Vec::new();
    for from in 0..n {
        for to in (0..n).filter(|to| *to != from) {
            let seed = seed.wrapping_add(1_000 + (from * n + to) as u64);
            // On a port of free_port's, so that no node is given it as well.
            let at = SocketAddr::from(([127, 0, 0, 1], free_port(true)?));
            let relay = Relay::start(at, members.list[to].1, Faults::NONE, seed)
                .await
                .with_context(|| format!("relay member {} -> {}", from + 1, to + 1))?;
            members.dial[from][to] = relay.local_addr();
            out.push(MemberRelay { from, to, relay });
        }
    }
    Ok(out)
}

/// The `[cluster]` table of member `k` (0-based) of DC `dc`, with the node certificate
/// `tandem certs --nodes` made, and the default Raft timings.
pub(super) fn cluster_section(dc: &str, k: usize, members: &Members, certs: &Path) -> String {
    let list: Vec<String> = members
        .list
        .iter()
        .zip(&members.dial[k])
        .map(|((id, _, http), raft)| {
            format!("{{ id = {id}, raft_addr = \"{raft}\", http_addr = \"{http}\" }}")
        })
        .collect();
    let id = members.list[k].0;
    let name = format!("n{id}.{dc}.tandem-node");
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n[cluster]\nnode_id = {id}\nmembers = [{}]\nca_cert = {}\ncert = {}\nkey = {}",
        list.join(", "),
        toml_str(&certs.join("ca.pem")),
        toml_str(&certs.join(format!("{name}.pem"))),
        toml_str(&certs.join(format!("{name}.key")))
    );
    s
}

/// A member's `/v1/status` `cluster` part: (node id, serves writes).
fn group_of(raw: &Value) -> Option<(u64, bool)> {
    let c = raw.get("cluster")?;
    Some((c.get("node_id")?.as_u64()?, c.get("serving_writes")?.as_bool()?))
}

impl Cluster {
    /// The member (index) that serves writes, other than `not`, once one does; fails after
    /// `deadline`.
    pub(super) async fn serving_member(
        &self,
        side: usize,
        not: Option<usize>,
        deadline: Instant,
    ) -> anyhow::Result<usize> {
        loop {
            for (k, node) in self.dcs[side].nodes.iter().enumerate() {
                if Some(k) == not || node.child.is_none() {
                    continue;
                }
                if let Ok((_, raw)) = self.api.status(&node.base, Duration::from_millis(500)).await {
                    if group_of(&raw).is_some_and(|(_, serving)| serving) {
                        return Ok(k);
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "no member of {} served writes in time; log tail:\n{}",
                    self.dcs[side].name,
                    self.log_tail(side)
                );
            }
            tokio::time::sleep(LEADER_POLL).await;
        }
    }

    /// Before `action`: a leader kill picks the member to kill and moves the clients' base
    /// off it (the drill's clients follow `Dc::base` before the step). Returns whether the
    /// clients must be given time to finish requests sent to the old base.
    pub async fn prepare(&mut self, action: Action) -> anyhow::Result<bool> {
        if let Action::IsolateMember { side, leader } = action {
            return self.prepare_isolation(side, leader).await;
        }
        if let Action::StopMember { side, leader, .. } = action {
            return self.prepare_stop(side, leader).await;
        }
        let Action::KillLeader { side } = action else { return Ok(false) };
        if self.dcs[side].nodes.len() < 3 {
            bail!("{} is not a group of three or more: no leader to kill", self.dcs[side].name);
        }
        let leader = self.serving_member(side, None, Instant::now() + FAILOVER_WAIT).await?;
        let dc = &mut self.dcs[side];
        dc.doomed = Some(leader);
        if dc.base != dc.nodes[leader].base {
            return Ok(false);
        }
        let Some(next) = dc.nodes.iter().enumerate().find(|(k, n)| *k != leader && n.child.is_some()) else {
            bail!("{} has no other member up", dc.name);
        };
        dc.base = next.1.base.clone();
        Ok(true)
    }

    /// SIGKILL of the member [`Cluster::prepare`] picked, then a bounded wait until another
    /// member serves writes. Returns the progress note.
    pub(super) async fn kill_leader(&mut self, side: usize) -> anyhow::Result<String> {
        let Some(k) = self.dcs[side].doomed.take() else { bail!("kill-leader without prepare") };
        let killed_at = Instant::now();
        self.kill_node(side, k).await?;
        self.dcs[side].killed.push(k);
        let next = self.serving_member(side, Some(k), killed_at + FAILOVER_WAIT).await?;
        let gap_ms = killed_at.elapsed().as_millis() as u64;
        let ids = (self.dcs[side].nodes[k].id, self.dcs[side].nodes[next].id);
        let f = Failover { dc: self.dcs[side].name.clone(), killed: ids.0, next: ids.1, gap_ms };
        let note = format!("n{} killed; n{} served writes {}ms later", f.killed, f.next, f.gap_ms);
        self.failovers.push(f);
        Ok(note)
    }

    /// Restarts the members a leader kill took down and waits until they answer.
    pub(super) async fn restart_members(&mut self, side: usize) -> anyhow::Result<()> {
        for k in std::mem::take(&mut self.dcs[side].killed) {
            self.spawn_node(side, k)?;
        }
        self.wait_ready(side).await
    }

    /// Every leader kill so far.
    pub fn failovers(&self) -> &[Failover] {
        &self.failovers
    }
}
