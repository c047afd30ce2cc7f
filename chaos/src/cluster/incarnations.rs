//! Faults on a DC's incarnations: its data dir copied aside and restored later (a VM or disk
//! snapshot rolled back), and a replacement process started next to a still-running old one
//! (split incarnation). Sandbox only: the DC's files and ports are the drill's.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::process::Child;

use super::{free_port, node_config, Cluster, Node, SANDBOX_DCS};

/// How long the old process of a split may take to report itself fenced.
const FENCED_WAIT: Duration = Duration::from_secs(10);

/// The old process of a split DC, still running next to its replacement.
pub(super) struct OldIncarnation {
    child: Child,
    base: String,
}

/// What the drill saw of a split's old process before killing it.
#[derive(Clone, Debug)]
pub struct SplitCheck {
    pub dc: String,
    /// It reported itself fenced (`/v1/status` `replication.fenced`).
    pub fenced: bool,
    pub detail: String,
}

/// Copies the tree at `from` to `to` (files and directories only).
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

impl Cluster {
    /// The DC's one process (these faults are about a DC of one node).
    fn single(&mut self, side: usize) -> anyhow::Result<&mut Node> {
        let dc = &mut self.dcs[side];
        let n = dc.nodes.len();
        match dc.nodes.as_mut_slice() {
            [node] => Ok(node),
            _ => bail!("{} runs {n} nodes: this fault needs a DC of one", dc.name),
        }
    }

    fn data_dir(&mut self, side: usize) -> anyhow::Result<std::path::PathBuf> {
        let name = self.dcs[side].name.clone();
        match &self.single(side)?.data_dir {
            Some(d) => Ok(d.clone()),
            None => bail!("{name}'s data dir is not the drill's"),
        }
    }

    /// Keeps a copy of the (killed) DC's data dir: crash-consistent, as a disk snapshot.
    pub(super) fn save(&mut self, side: usize) -> anyhow::Result<()> {
        if self.single(side)?.child.is_some() {
            bail!("{} must be down while its data dir is copied", self.dcs[side].name);
        }
        let dir = self.data_dir(side)?;
        let saved = dir.with_extension("saved");
        if saved.exists() {
            std::fs::remove_dir_all(&saved)?;
        }
        copy_tree(&dir, &saved).with_context(|| format!("copying {} aside", dir.display()))
    }

    /// Replaces the (killed) DC's data dir with the copy [`Cluster::save`] kept.
    pub(super) fn restore(&mut self, side: usize) -> anyhow::Result<()> {
        if self.single(side)?.child.is_some() {
            bail!("{} must be down while its data dir is restored", self.dcs[side].name);
        }
        let dir = self.data_dir(side)?;
        let saved = dir.with_extension("saved");
        if !saved.exists() {
            bail!("no saved copy of {}", dir.display());
        }
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        copy_tree(&saved, &dir).with_context(|| format!("restoring {}", dir.display()))
    }

    /// Starts a replacement of the DC on an empty data dir and new ports; once it answers,
    /// the peer's dials (the relay towards this DC) and the drill's clients move to it. The
    /// old process keeps running until [`Cluster::end_split`].
    pub(super) async fn split(&mut self, side: usize) -> anyhow::Result<()> {
        let (Some(root), Some(relays)) = (self.dir.clone(), self.relays.as_ref()) else {
            bail!("split-incarnation needs the sandbox (its relays move the peer's dials)")
        };
        if self.old[side].is_some() {
            bail!("{} is already split", self.dcs[side].name);
        }
        // This DC dials its peer through relays[side]; the peer dials it through the other.
        let peer_addrs: Vec<SocketAddr> = relays[side].iter().map(|r| r.local_addr()).collect();
        let name = self.dcs[side].name.clone();
        self.generation[side] += 1;
        let g = self.generation[side];
        let data_dir = root.join(&name).join(format!("data-{g}"));
        std::fs::create_dir_all(&data_dir)?;
        let http = SocketAddr::from(([127, 0, 0, 1], free_port(false)?));
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port(true)?));
        let cfg = node_config(
            &name,
            &data_dir,
            http,
            listen,
            SANDBOX_DCS[1 - side],
            &peer_addrs,
            &root.join("certs"),
            &self.tuning,
        );
        let config = root.join(format!("{name}-{g}.toml"));
        std::fs::write(&config, cfg)?;
        let base = format!("http://{http}");
        let node = self.single(side)?;
        let Some(old_child) = node.child.take() else { bail!("{name} is not running") };
        let old_base = std::mem::replace(&mut node.base, base.clone());
        node.config = Some(config);
        node.data_dir = Some(data_dir);
        node.log = Some(root.join(format!("{name}-{g}.log")));
        self.dcs[side].base = base;
        self.old[side] = Some(OldIncarnation { child: old_child, base: old_base });
        self.spawn(side)?;
        self.wait_ready(side).await?;
        if let Some(relays) = self.relays.as_ref() {
            relays[1 - side].iter().for_each(|r| r.set_upstream(listen));
        }
        Ok(())
    }

    /// Checks that the split's old process reports itself fenced (bounded wait), then
    /// kills it.
    pub(super) async fn end_split(&mut self, side: usize) -> anyhow::Result<()> {
        let Some(mut old) = self.old[side].take() else { bail!("{} is not split", self.dcs[side].name) };
        let deadline = tokio::time::Instant::now() + FENCED_WAIT;
        let check = loop {
            let seen = self.api.status(&old.base, Duration::from_millis(500)).await;
            let fenced = seen
                .as_ref()
                .ok()
                .and_then(|(_, raw)| raw.pointer("/replication/fenced").and_then(|v| v.as_bool()))
                .unwrap_or(false);
            if fenced || tokio::time::Instant::now() > deadline {
                let detail = match &seen {
                    Ok((_, raw)) => format!(
                        "old process at {}: replication.fenced = {fenced}, reason: {}",
                        old.base,
                        raw.pointer("/replication/fenced_reason").and_then(|v| v.as_str()).unwrap_or("-")
                    ),
                    Err(e) => format!("old process at {}: status failed: {e}", old.base),
                };
                break SplitCheck { dc: self.dcs[side].name.clone(), fenced, detail };
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        self.split_checks.push(check);
        let _ = old.child.start_kill();
        tokio::time::timeout(Duration::from_secs(10), old.child.wait())
            .await
            .context("the old process did not die within 10s of SIGKILL")??;
        Ok(())
    }

    /// What the drill saw of each split's old process.
    pub fn split_checks(&self) -> &[SplitCheck] {
        &self.split_checks
    }

    /// Kills old processes still running (at shutdown).
    pub(super) fn kill_old_incarnations(&mut self) {
        for old in self.old.iter_mut().flatten() {
            let _ = old.child.start_kill();
        }
    }
}
