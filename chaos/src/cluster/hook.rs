//! Target mode's fault hook (`--fault-hook CMD`): each step of the plan handed to the
//! user's command as `CMD <action> [args]`, bounded in time; a restart waits until the DC
//! answers.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::process::Command;

use super::{Cluster, HOOK_TIMEOUT, READY_TIMEOUT};
use crate::plan::{Action, Cut};

impl Cluster {
    pub(super) async fn run_hook(&self, hook: &str, action: Action) -> anyhow::Result<()> {
        let (a, b) = (&self.dcs[0].name, &self.dcs[1].name);
        let args: Vec<String> = match action {
            Action::Cut(Cut::Both) => vec!["partition".into(), "both".into()],
            Action::Cut(Cut::AToB) => vec!["partition".into(), format!("{a}->{b}")],
            Action::Cut(Cut::BToA) => vec!["partition".into(), format!("{b}->{a}")],
            Action::Heal => vec!["heal".into()],
            Action::Packets(p) => vec![
                "packets".into(),
                p.loss_pct.to_string(),
                p.delay_ms.to_string(),
                p.jitter_ms.to_string(),
                p.duplicate_pct.to_string(),
                p.reorder_pct.to_string(),
            ],
            Action::ClearPackets => vec!["clear-packets".into()],
            Action::Kill { side, wipe: false } => vec!["kill".into(), self.dcs[side].name.clone()],
            Action::Kill { side, wipe: true } => vec!["kill-wipe".into(), self.dcs[side].name.clone()],
            Action::Restart { side } => vec!["restart".into(), self.dcs[side].name.clone()],
            Action::Pause { side } => vec!["pause".into(), self.dcs[side].name.clone()],
            Action::Resume { side } => vec!["resume".into(), self.dcs[side].name.clone()],
            Action::Save { side } => vec!["save".into(), self.dcs[side].name.clone()],
            Action::Restore { side } => vec!["restore".into(), self.dcs[side].name.clone()],
            Action::Backup { side } => vec!["backup".into(), self.dcs[side].name.clone()],
            Action::Split { side } => vec!["split".into(), self.dcs[side].name.clone()],
            Action::EndSplit { side } => vec!["end-split".into(), self.dcs[side].name.clone()],
            Action::KillLeader { side } => vec!["kill-leader".into(), self.dcs[side].name.clone()],
            Action::RestartMember { side } => vec!["restart-member".into(), self.dcs[side].name.clone()],
            Action::IsolateMember { side, leader } => vec![
                if leader { "isolate-leader" } else { "isolate-follower" }.into(),
                self.dcs[side].name.clone(),
            ],
            Action::RejoinMember { side } => vec!["rejoin-member".into(), self.dcs[side].name.clone()],
            Action::StopMember { side, leader, how } => vec![
                match how {
                    crate::plan::Stop::Upgrade => "stop-member",
                    crate::plan::Stop::DiskLoss => "kill-wipe-member",
                    crate::plan::Stop::Replace => "replace-member",
                }
                .into(),
                self.dcs[side].name.clone(),
                if leader { "leader" } else { "follower" }.into(),
            ],
            Action::StartMember { side } => vec!["start-member".into(), self.dcs[side].name.clone()],
        };
        let line = format!("{hook} {}", args.join(" "));
        // The arguments go in as positional parameters, never through the shell's parser.
        let st = tokio::time::timeout(
            HOOK_TIMEOUT,
            Command::new("sh")
                .arg("-c")
                .arg(format!("{hook} \"$@\""))
                .arg("tandem-chaos-hook")
                .args(&args)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .status(),
        )
        .await
        .with_context(|| format!("fault hook `{line}` ran longer than {HOOK_TIMEOUT:?}"))??;
        if !st.success() {
            bail!("fault hook `{line}` failed ({st})");
        }
        if let Action::Restart { side } = action {
            // The user's restart: wait until the DC answers again.
            let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
            while self.api.status(&self.dcs[side].base, Duration::from_millis(500)).await.is_err() {
                if tokio::time::Instant::now() > deadline {
                    bail!(
                        "{} did not answer within {READY_TIMEOUT:?} after the hook restarted it",
                        self.dcs[side].name
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }
}
