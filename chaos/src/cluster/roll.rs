//! Members of a DC's group taken down one at a time and started again (`rolling-upgrade`,
//! `node-disk-loss`), as an operator's runbook does it (docs/operations.md):
//!
//! - **Which member:** each round takes the followers first (one not yet restarted in
//!   the round), the leader last; the drill's clients move off the member first.
//! - **An upgrade** stops the member with SIGTERM. A leader of this release hands its lead
//!   to a member already restarted (`POST /v1/admin/cluster/transfer-leader`) before it
//!   stops; a leader of the previous release cannot (it has no transfer), so the group
//!   elects another once it is gone. The member starts again with its config of this
//!   release (the sandbox starts every member as the previous release:
//!   `[cluster] emulate_previous_release` and `[replication] schema_version = 1`).
//! - **A disk loss** kills the member with SIGKILL and wipes its data dir; it starts
//!   again empty, and must come back from the group (a Raft snapshot, since the sandbox's
//!   members snapshot every few entries) with the DC's epoch unchanged.
//! - **A lost machine** (`add-remove-node`) kills the member and wipes its data dir too;
//!   the group then removes it (`DELETE /v1/admin/cluster/members/{id}`), and a node
//!   under the next unused id starts on the same addresses with `[cluster] join = true`
//!   and is added (`POST /v1/admin/cluster/members`: a learner caught up by a snapshot,
//!   then a voter), as docs/operations.md's runbook replaces a dead member.
//! - **Started again**, the step is done once the member follows the serving leader and
//!   applied what that one had.

use std::time::Duration;

use anyhow::{bail, Context as _};
use serde_json::{json, Value};
use tokio::process::Command;
use tokio::time::Instant;

use super::Cluster;
use crate::plan::Stop;

/// Longest wait for another member to serve writes after the leader stopped.
const FAILOVER_WAIT: Duration = Duration::from_secs(20);
/// Longest a member may take to exit after SIGTERM before it is killed (and the step
/// fails: a graceful stop that hangs is a finding).
const TERM_WAIT: Duration = Duration::from_secs(10);
/// Longest wait for a started member to follow the leader and catch up.
const CATCH_UP_WAIT: Duration = Duration::from_secs(30);
/// Longest a leadership transfer may take (the node's own bound is 10 s).
const TRANSFER_WAIT: Duration = Duration::from_secs(15);
/// Longest a membership change may take (a new member's catch-up is bounded at 120 s by
/// the node; a drill's state is small).
const CHANGE_WAIT: Duration = Duration::from_secs(60);

/// One member taken down and started again, as the drill saw it.
#[derive(Clone, Debug, Default)]
pub struct Roll {
    pub dc: String,
    /// The member (node id), and whether it led when it was stopped.
    pub member: u64,
    pub was_leader: bool,
    /// `upgrade` (SIGTERM, started as this release), `restart` (SIGTERM, same release),
    /// `disk loss` (SIGKILL, data dir wiped).
    pub how: String,
    /// A leader of this release: how long its transfer took (`Err`: why it failed; the
    /// group then elects another).
    pub transfer: Option<Result<u64, String>>,
    /// A leader: from the step's start (transfer included) until another member served
    /// writes, and which.
    pub gap_ms: Option<u64>,
    pub next: Option<u64>,
    /// From its start until it followed the leader and applied what that one had.
    pub catch_up_ms: u64,
    /// A lost machine: how long the removal of the old member took, the replacement's id,
    /// and how long its addition took (learner, catch-up, promotion).
    pub removed_ms: Option<u64>,
    pub replaced_by: Option<u64>,
    pub added_ms: Option<u64>,
    /// The DC's epoch (its leader's log) before the stop and once the member caught up.
    pub epoch: (Option<u64>, Option<u64>),
}

/// The DC's epoch (its own log's) in a member's `/v1/status`.
fn epoch_of(raw: &Value) -> Option<u64> {
    raw.get("log")?.get("epoch")?.as_u64()
}

impl Cluster {
    /// Before a `StopMember`: picks the member (the leader, or the next follower of the
    /// round) and moves the clients' base to a member that stays up (for a leader, the one
    /// it hands its lead to). Returns whether the base moved.
    pub(super) async fn prepare_stop(&mut self, side: usize, leader: bool) -> anyhow::Result<bool> {
        let n = self.dcs[side].nodes.len();
        if n < 3 {
            bail!("{} is not a group of three or more", self.dcs[side].name);
        }
        let serving = self.serving_member(side, None, Instant::now() + FAILOVER_WAIT).await?;
        let dc = &mut self.dcs[side];
        if dc.round.len() >= n {
            dc.round.clear();
        }
        let pick = if leader {
            serving
        } else {
            (0..n)
                .find(|k| *k != serving && !dc.round.contains(k))
                .or_else(|| (0..n).find(|k| *k != serving))
                .context("no follower")?
        };
        // The clients (and a leader's lead) go to a member restarted in this round if
        // there is one, else to the leader, else any other.
        let stay = (0..n)
            .filter(|k| *k != pick && dc.nodes[*k].child.is_some())
            .max_by_key(|k| (dc.round.contains(k), *k == serving))
            .context("no other member up")?;
        dc.doomed = Some(pick);
        dc.heir = Some(stay);
        if dc.base == dc.nodes[pick].base {
            dc.base = dc.nodes[stay].base.clone();
            return Ok(true);
        }
        Ok(false)
    }

    /// Takes the member [`Cluster::prepare_stop`] picked down. Returns the progress note.
    pub(super) async fn stop_member(
        &mut self,
        side: usize,
        leader: bool,
        how: Stop,
    ) -> anyhow::Result<String> {
        let (Some(k), Some(heir)) = (self.dcs[side].doomed.take(), self.dcs[side].heir.take()) else {
            bail!("stop-member without prepare")
        };
        let at = Instant::now();
        let base = self.dcs[side].nodes[k].base.clone();
        let before =
            self.api.status(&base, Duration::from_secs(1)).await.ok().and_then(|(_, r)| epoch_of(&r));
        let upgrade = self.dcs[side].nodes[k].next_config.is_some();
        let mut roll = Roll {
            dc: self.dcs[side].name.clone(),
            member: self.dcs[side].nodes[k].id,
            was_leader: leader,
            how: match how {
                Stop::DiskLoss => "disk loss",
                Stop::Replace => "replaced",
                Stop::Upgrade if upgrade => "upgrade",
                Stop::Upgrade => "restart",
            }
            .into(),
            epoch: (before, None),
            ..Roll::default()
        };
        let mut note = String::new();
        match how {
            Stop::Upgrade => {
                if leader && !upgrade {
                    let t = Instant::now();
                    let body = json!({ "to": self.dcs[side].nodes[heir].id });
                    let r =
                        self.api.post(&base, "/v1/admin/cluster/transfer-leader", &body, TRANSFER_WAIT).await;
                    roll.transfer = Some(match r {
                        Ok((200, _)) => Ok(t.elapsed().as_millis() as u64),
                        Ok((s, b)) => Err(format!("{s} {b}")),
                        Err(e) => Err(e),
                    });
                    note = match &roll.transfer {
                        Some(Ok(ms)) => {
                            format!("lead handed to n{} in {ms}ms; ", self.dcs[side].nodes[heir].id)
                        }
                        Some(Err(e)) => {
                            format!("transfer to n{} failed ({e}); ", self.dcs[side].nodes[heir].id)
                        }
                        None => String::new(),
                    };
                }
                self.terminate_node(side, k).await?;
            }
            Stop::DiskLoss | Stop::Replace => {
                self.kill_node(side, k).await?;
                let d = self.dcs[side].nodes[k].data_dir.clone().context("no data dir")?;
                std::fs::remove_dir_all(&d).with_context(|| format!("wiping {}", d.display()))?;
                std::fs::create_dir_all(&d)?;
            }
        }
        let id = self.dcs[side].nodes[k].id;
        note.push_str(&format!(
            "n{id} {}",
            match how {
                Stop::DiskLoss => "killed, disk wiped",
                Stop::Replace => "killed, machine lost",
                Stop::Upgrade => "stopped",
            }
        ));
        if how == Stop::Replace {
            let t = Instant::now();
            let heir_base = self.dcs[side].nodes[heir].base.clone();
            match self.api.delete(&heir_base, &format!("/v1/admin/cluster/members/{id}"), CHANGE_WAIT).await {
                Ok((200, _)) => {}
                Ok((s, b)) => bail!("removing n{id} was answered {s} {b}"),
                Err(e) => bail!("removing n{id}: {e}"),
            }
            roll.removed_ms = Some(t.elapsed().as_millis() as u64);
            note.push_str(&format!("; removed from the group in {}ms", t.elapsed().as_millis()));
        }
        if leader {
            let next = self.serving_member(side, Some(k), at + FAILOVER_WAIT).await?;
            let gap = at.elapsed().as_millis() as u64;
            (roll.gap_ms, roll.next) = (Some(gap), Some(next as u64 + 1));
            note.push_str(&format!("; n{} served writes {gap}ms after the step began", next + 1));
        }
        self.dcs[side].stopped = Some((k, roll));
        Ok(note)
    }

    /// Starts the member a `StopMember` took down (with its config of this release, if it
    /// was of the previous one) and waits until it caught up. Returns the progress note.
    pub(super) async fn start_member(&mut self, side: usize) -> anyhow::Result<String> {
        let Some((k, mut roll)) = self.dcs[side].stopped.take() else {
            bail!("start-member without a stopped member")
        };
        if let Some(text) = self.dcs[side].nodes[k].next_config.take() {
            let path = self.dcs[side].nodes[k].config.clone().context("no config file")?;
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        let t = Instant::now();
        if roll.how == "replaced" {
            self.start_replacement(side, k, &mut roll).await?;
        } else {
            self.spawn_node(side, k)?;
        }
        let leader = self.wait_follows(side, k, t + CATCH_UP_WAIT).await?;
        roll.catch_up_ms = t.elapsed().as_millis() as u64;
        let lb = self.dcs[side].nodes[leader].base.clone();
        roll.epoch.1 =
            self.api.status(&lb, Duration::from_secs(1)).await.ok().and_then(|(_, r)| epoch_of(&r));
        self.dcs[side].round.insert(k);
        let note = format!(
            "n{} ({}) follows n{} and caught up in {}ms",
            self.dcs[side].nodes[k].id, roll.how, self.dcs[side].nodes[leader].id, roll.catch_up_ms
        );
        self.rolls.push(roll);
        Ok(note)
    }

    /// Starts the node that replaces member `k` (removed, its machine lost): the next unused
    /// id, on `k`'s addresses, with `join = true`; then adds it through the member the
    /// clients use.
    async fn start_replacement(&mut self, side: usize, k: usize, roll: &mut Roll) -> anyhow::Result<()> {
        let dc = &self.dcs[side];
        let old = dc.nodes[k].id;
        let new = dc.nodes.iter().map(|n| n.id).max().unwrap_or(0).max(dc.last_id) + 1;
        if new > super::configs::MEMBER_IDS_MAX {
            bail!(
                "{} has used every node id with a certificate (1..={})",
                dc.name,
                super::configs::MEMBER_IDS_MAX
            );
        }
        let path = dc.nodes[k].config.clone().context("no config file")?;
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let name = |id: u64| format!("n{id}.{}.tandem-node", dc.name);
        let join = if text.contains("\njoin = true\n") { "" } else { "join = true\n" };
        let text = text
            .replace(&format!("node_id = {old}\n"), &format!("node_id = {new}\n{join}"))
            .replace(&format!("{{ id = {old}, "), &format!("{{ id = {new}, "))
            .replace(&name(old), &name(new));
        std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
        let entry = text
            .lines()
            .find(|l| l.starts_with("members = "))
            .and_then(|l| l.split(&format!("{{ id = {new}, ")).nth(1))
            .context("the replacement's own entry")?;
        let addr = |key: &str| -> anyhow::Result<String> {
            let at = entry.split(&format!("{key} = \"")).nth(1).context("an address")?;
            Ok(at.split('"').next().unwrap_or_default().to_owned())
        };
        let (raft, http) = (addr("raft_addr")?, addr("http_addr")?);
        self.dcs[side].nodes[k].id = new;
        self.dcs[side].last_id = new;
        self.spawn_node(side, k)?;
        let t = Instant::now();
        let base = self.dcs[side].base.clone();
        let body = json!({ "id": new, "raft_addr": raft, "http_addr": http });
        match self.api.post(&base, "/v1/admin/cluster/members", &body, CHANGE_WAIT).await {
            Ok((200, _)) => {}
            Ok((s, b)) => bail!("adding n{new} was answered {s} {b}"),
            Err(e) => bail!("adding n{new}: {e}"),
        }
        roll.added_ms = Some(t.elapsed().as_millis() as u64);
        roll.replaced_by = Some(new);
        Ok(())
    }

    /// SIGTERM to member `k`, then a bounded wait for it to exit (SIGKILL and an error
    /// past [`TERM_WAIT`]).
    async fn terminate_node(&mut self, side: usize, k: usize) -> anyhow::Result<()> {
        let name = self.dcs[side].name.clone();
        let node = &mut self.dcs[side].nodes[k];
        let Some(mut child) = node.child.take() else { bail!("{name} n{} is not running", k + 1) };
        if let Some(pid) = child.id() {
            let st = tokio::time::timeout(
                Duration::from_secs(5),
                Command::new("kill").arg("-TERM").arg(pid.to_string()).status(),
            )
            .await
            .context("kill timed out")??;
            if !st.success() {
                bail!("kill -TERM {pid} failed");
            }
        }
        match tokio::time::timeout(TERM_WAIT, child.wait()).await {
            Ok(status) => {
                status?;
                Ok(())
            }
            Err(_) => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                bail!("{name} n{} did not exit within {TERM_WAIT:?} of SIGTERM", k + 1)
            }
        }
    }

    /// Every member taken down and started again so far.
    pub fn rolls(&self) -> &[Roll] {
        &self.rolls
    }
}
