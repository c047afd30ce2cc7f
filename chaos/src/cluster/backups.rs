//! `backup-restore` (docs/operations.md, "Backup and restore"), with the operator's
//! commands run as processes of the drill's `tandem` binary:
//!
//! - **Backup** (the DC serves): `tandem backup --out <dir> --addr <every member>`; the
//!   leader answers (a follower refuses and the next address is asked).
//! - **Restore** (the DC was killed whole): every member's data dir is wiped, then
//!   `tandem restore --from <dir> --config <first member's config>`.
//! - **Restart** after a restore: the first member starts alone and serves as the only
//!   member of its group; each other member starts with `[cluster] join = true` on its
//!   empty data dir and is added (`POST /v1/admin/cluster/members`: a learner sent a Raft
//!   snapshot of the restored state, then a voter). The step is done once every member
//!   follows and caught up and the DC took an epoch above the one it had before the loss.

use std::time::Duration;

use anyhow::{bail, Context as _};
use serde_json::{json, Value};
use tokio::process::Command;
use tokio::time::Instant;

use super::Cluster;

/// Longest a `tandem backup` or `tandem restore` may take (the drill's state is small).
const COMMAND_WAIT: Duration = Duration::from_secs(60);
/// Longest wait for the restored member to serve, for each member to be added and caught
/// up, and for the new epoch.
const RESTORED_WAIT: Duration = Duration::from_secs(60);

/// One backup and the restore from it, as the drill saw them.
#[derive(Clone, Debug, Default)]
pub struct Restore {
    pub dc: String,
    /// `tandem backup`: how long it took, the export's size, the Raft index it is of.
    pub backup_ms: u64,
    pub bytes: u64,
    pub index: u64,
    /// `tandem restore` (offline, into the first member's data dir).
    pub restore_ms: u64,
    /// From the first member's start until it served writes alone.
    pub serving_ms: u64,
    /// From then until every other member was added and caught up.
    pub joined_ms: u64,
    /// Members back in the group.
    pub members: usize,
    /// The DC's epoch when backed up, and after the restore (its first handshake moves it
    /// above the old one).
    pub epoch: (u64, Option<u64>),
}

/// Runs `tandem <args>` (bounded); its standard output on success.
async fn tandem(bin: &std::path::Path, args: &[String]) -> anyhow::Result<String> {
    let out = tokio::time::timeout(COMMAND_WAIT, Command::new(bin).args(args).kill_on_drop(true).output())
        .await
        .with_context(|| format!("tandem {} did not finish within {COMMAND_WAIT:?}", args[0]))??;
    if !out.status.success() {
        bail!(
            "tandem {} failed ({}): {}{}",
            args[0],
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Cluster {
    /// `tandem backup` of the DC, into a new dir next to its data. Returns the note.
    pub(super) async fn backup(&mut self, side: usize) -> anyhow::Result<String> {
        let root = self.dir.clone().context("backup-restore needs the sandbox")?;
        let dc = &self.dcs[side];
        let n = self.restores.iter().filter(|r| r.dc == dc.name).count() + 1;
        let out = root.join(&dc.name).join(format!("backup-{n}"));
        let addrs: Vec<String> = dc.nodes.iter().map(|m| m.base.clone()).collect();
        let t = Instant::now();
        let args =
            ["backup", "--out", &out.display().to_string(), "--addr", &addrs.join(",")].map(String::from);
        let said: Value =
            serde_json::from_str(&tandem(&self.bin, &args).await?).context("tandem backup's output")?;
        let meta = &said["backup"];
        let run = Restore {
            dc: dc.name.clone(),
            backup_ms: t.elapsed().as_millis() as u64,
            bytes: meta["state_bytes"].as_u64().unwrap_or(0),
            index: meta["applied_index"].as_u64().unwrap_or(0),
            epoch: (meta["epoch"].as_u64().unwrap_or(0), None),
            ..Restore::default()
        };
        let note = format!(
            "backed up from n{} in {}ms: {} bytes at index {}",
            meta["node_id"], run.backup_ms, run.bytes, run.index
        );
        self.dcs[side].backup = Some((out, run));
        Ok(note)
    }

    /// Wipes every member's data dir of the (killed) DC and restores its last backup into
    /// the first member's.
    pub(super) async fn restore_backup(&mut self, side: usize) -> anyhow::Result<()> {
        let dc = &mut self.dcs[side];
        let Some((dir, run)) = dc.backup.as_mut() else { bail!("{} has no backup to restore", dc.name) };
        if dc.nodes.iter().any(|n| n.child.is_some()) {
            bail!("{} must be down while it is restored", dc.name);
        }
        for d in dc.nodes.iter().filter_map(|n| n.data_dir.as_ref()) {
            std::fs::remove_dir_all(d).with_context(|| format!("wiping {}", d.display()))?;
        }
        let config = dc.nodes[0].config.clone().context("no config file")?;
        let t = Instant::now();
        let args =
            ["restore", "--from", &dir.display().to_string(), "--config", &config.display().to_string()]
                .map(String::from);
        tandem(&self.bin, &args).await?;
        run.restore_ms = t.elapsed().as_millis() as u64;
        for d in dc.nodes.iter().skip(1).filter_map(|n| n.data_dir.as_ref()) {
            std::fs::create_dir_all(d)?;
        }
        dc.restored = true;
        Ok(())
    }

    /// Starts a restored group: the first member alone, then each other one joins. Returns
    /// the note.
    pub(super) async fn start_restored(&mut self, side: usize) -> anyhow::Result<String> {
        let Some((_, mut run)) = self.dcs[side].backup.take() else { bail!("no backup was restored") };
        self.dcs[side].restored = false;
        let t = Instant::now();
        self.spawn_node(side, 0)?;
        let first = self.serving_member(side, None, t + RESTORED_WAIT).await?;
        if first != 0 {
            bail!("the restored member is not the one that serves");
        }
        run.serving_ms = t.elapsed().as_millis() as u64;
        let joined = Instant::now();
        let base = self.dcs[side].nodes[0].base.clone();
        let first_config = self.dcs[side].nodes[0].config.clone().context("no config file")?;
        let first_text = std::fs::read_to_string(&first_config)?;
        for k in 1..self.dcs[side].nodes.len() {
            let id = self.dcs[side].nodes[k].id;
            let path = self.dcs[side].nodes[k].config.clone().context("no config file")?;
            let text = std::fs::read_to_string(&path)?;
            if !text.contains("\njoin = true\n") {
                let text =
                    text.replace(&format!("node_id = {id}\n"), &format!("node_id = {id}\njoin = true\n"));
                std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            }
            // Added at the addresses the first member's file gives it.
            let entry = first_text
                .lines()
                .find(|l| l.starts_with("members = "))
                .and_then(|l| l.split(&format!("{{ id = {id}, ")).nth(1))
                .context("the member's entry in the first member's file")?;
            let addr = |key: &str| -> anyhow::Result<String> {
                let at = entry.split(&format!("{key} = \"")).nth(1).context("an address")?;
                Ok(at.split('"').next().unwrap_or_default().to_owned())
            };
            self.spawn_node(side, k)?;
            let body = json!({ "id": id, "raft_addr": addr("raft_addr")?, "http_addr": addr("http_addr")? });
            match self.api.post(&base, "/v1/admin/cluster/members", &body, RESTORED_WAIT).await {
                Ok((200, _)) => {}
                Ok((s, b)) => bail!("adding n{id} to the restored group was answered {s} {b}"),
                Err(e) => bail!("adding n{id} to the restored group: {e}"),
            }
            self.wait_follows(side, k, joined + RESTORED_WAIT).await?;
            run.members += 1;
        }
        run.members += 1;
        run.joined_ms = joined.elapsed().as_millis() as u64;
        // The restored history takes a new epoch at its first handshake with the peer.
        let deadline = Instant::now() + RESTORED_WAIT;
        while run.epoch.1.is_none_or(|e| e <= run.epoch.0) && Instant::now() < deadline {
            run.epoch.1 = self
                .api
                .status(&base, Duration::from_secs(1))
                .await
                .ok()
                .and_then(|(_, r)| r["log"]["epoch"].as_u64());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let note = format!(
            "restored in {}ms; n1 served alone {}ms after its start; {} members back {}ms later; epoch {} -> {:?}",
            run.restore_ms, run.serving_ms, run.members, run.joined_ms, run.epoch.0, run.epoch.1
        );
        self.restores.push(run);
        Ok(note)
    }

    /// Every backup restored so far.
    pub fn restores(&self) -> &[Restore] {
        &self.restores
    }
}
