//! The two DCs a drill runs against, and the faults it can inflict on them.
//!
//! - **Sandbox** (default): two real `tandem server` child processes on loopback, each with
//!   its own TOML config, data dir and log file in the drill dir, their replication links
//!   each running through a user-space [`Relay`] (dc-a's peer address is relay_ab, which
//!   forwards to dc-b's listen address; dc-b's peer address is relay_ba, forwarding to
//!   dc-a's).
//! - **Netns** (`--netns`, Linux, root): each DC runs in its own network namespace via
//!   `ip netns exec`; the namespaces are joined by a veth pair for replication (partitions
//!   take it down) and each has a veth to the root namespace for the drill's HTTP clients.
//!   Relay-only faults (one-way cuts, packet faults) are not available there.
//! - **Targets** (`--target-a`, `--target-b`): a user's own deployment. Nothing is started;
//!   each fault is handed to the user's `--fault-hook` command, or only marked.
//!
//! Every child process is killed when the [`Cluster`] is dropped (also on panic), and the
//! namespaces are deleted; every wait has a timeout.
//!
//! The network namespaces of `--netns` are set up and torn down in `netns`; the nodes'
//! configs, certificates and ports are written in `configs`; groups (`--nodes N`) and the
//! leader kill are in `group`, a member cut off from its group in `isolation`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::process::{Child, Command};

use crate::api::Api;
use crate::plan::{Action, Capabilities, Cut, PacketFaults};
use crate::relay::{Direction, Faults, LinkFaults, Probability, Relay};

mod backups;
mod configs;
mod group;
mod hook;
mod incarnations;
mod isolation;
mod netns;
mod roll;

use crate::ports::free_port;
pub use backups::Restore;
use configs::{make_certs, node_config, toml_str};
pub use group::{Failover, DRAIN};
use incarnations::OldIncarnation;
pub use incarnations::SplitCheck;
pub use isolation::{Isolation, Probes, PROBE_SERVICE};
use netns::Netns;
pub use roll::Roll;

/// The DC names of the sandbox.
pub const SANDBOX_DCS: [&str; 2] = ["dc-a", "dc-b"];

/// How long a node may take to answer after (re)start.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest the sandbox waits for both DCs' replication links before a drill's clock.
const LINK_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a fault hook may run.
const HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the drill runs.
#[derive(Clone, Debug)]
pub enum Environment {
    Sandbox,
    Netns,
    Targets { a: String, b: String, hook: Option<String> },
}

/// Timings of the nodes a drill starts.
#[derive(Clone, Debug)]
pub struct NodeTuning {
    pub heartbeat_interval_ms: u64,
    pub suspect_after_ms: u64,
    pub unhealthy_after_ms: u64,
    pub expire_after_ms: u64,
    pub check_interval_ms: u64,
    pub self_preservation_window_ms: u64,
    pub ping_interval_ms: u64,
    pub stale_after_ms: u64,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    pub purge_grace_ms: u64,
    pub batch_events_max: usize,
    pub window_batches_max: usize,
    /// In a group: every member link runs through a relay, so that one member can be cut
    /// off (the drills that do; a relay costs a hop on every Raft message).
    pub relay_members: bool,
    /// In a group: every member starts as the previous release (emulated:
    /// `[cluster] emulate_previous_release`, `[replication] schema_version = 1`) and
    /// becomes this one at its first restart (`rolling-upgrade`).
    pub previous_release: bool,
    /// In a group: `[cluster] snapshot_every_entries` (`node-disk-loss`: a member that
    /// lost its disk comes back from a snapshot).
    pub snapshot_every_entries: Option<u64>,
}

impl Default for NodeTuning {
    fn default() -> Self {
        NodeTuning {
            heartbeat_interval_ms: 200,
            suspect_after_ms: 600,
            unhealthy_after_ms: 1_200,
            expire_after_ms: 2_400,
            check_interval_ms: 100,
            self_preservation_window_ms: 2_000,
            ping_interval_ms: 200,
            stale_after_ms: 1_500,
            backoff_initial_ms: 50,
            backoff_max_ms: 1_000,
            purge_grace_ms: 600_000,
            batch_events_max: 64,
            window_batches_max: 4,
            relay_members: false,
            previous_release: false,
            snapshot_every_entries: None,
        }
    }
}

/// Why the environment could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The environment is not available here (no permission for namespaces...): the drill
    /// is skipped, never passed.
    #[error("{0}")]
    Skipped(String),
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// One process of a DC: the DC itself, or one member of its group.
struct Node {
    /// Its node id in its DC's group (1 for a DC of one node): member `k` starts as
    /// `k + 1`, and a replacement takes a new one (`add-remove-node`).
    id: u64,
    /// Base URL of its HTTP API.
    base: String,
    config: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    log: Option<PathBuf>,
    child: Option<Child>,
    paused: bool,
    /// The config its next start writes first (an upgrade to this release).
    next_config: Option<String>,
}

impl Node {
    fn new(base: String, config: Option<PathBuf>, data_dir: Option<PathBuf>, log: Option<PathBuf>) -> Node {
        Node { id: 1, base, config, data_dir, log, child: None, paused: false, next_config: None }
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }
}

/// One DC of the drill: one node, or a group of members.
pub struct Dc {
    pub name: String,
    /// Base URL the drill's clients use: the node, or one member that is up.
    pub base: String,
    nodes: Vec<Node>,
    /// `ip netns exec <ns>` prefix in netns mode.
    netns: Option<String>,
    /// Members a leader kill took down (indices into `nodes`), until they restart.
    killed: Vec<usize>,
    /// The member the next leader kill or cut takes down (chosen by [`Cluster::prepare`]).
    doomed: Option<usize>,
    /// The member cut off from the group, while it is.
    cut: Option<isolation::MemberCut>,
    /// The members restarted in the current round of a roll; the member that stays up
    /// for the next stop (the leader's heir); the member stopped, until it starts again.
    round: std::collections::BTreeSet<usize>,
    heir: Option<usize>,
    stopped: Option<(usize, Roll)>,
    /// The highest node id a member of its group took (a replacement takes the next).
    last_id: u64,
    /// The last backup taken (`backup-restore`), until it is restored; restored and not
    /// started yet.
    backup: Option<(PathBuf, backups::Restore)>,
    restored: bool,
}

impl Dc {
    fn new(name: &str, nodes: Vec<Node>, netns: Option<String>) -> Dc {
        let base = nodes.first().map(|n| n.base.clone()).unwrap_or_default();
        Dc {
            name: name.to_owned(),
            base,
            nodes,
            netns,
            killed: Vec::new(),
            doomed: None,
            cut: None,
            round: Default::default(),
            heir: None,
            stopped: None,
            last_id: 0,
            backup: None,
            restored: false,
        }
    }

    /// The log files of its processes.
    pub fn log_paths(&self) -> impl Iterator<Item = &Path> {
        self.nodes.iter().filter_map(|n| n.log.as_deref())
    }

    /// Its processes (1, or the members of its group).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The base URL of each of its processes.
    pub fn node_bases(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.base.clone()).collect()
    }
}

/// The two DCs and the fault machinery between them.
pub struct Cluster {
    pub env: Environment,
    pub dcs: [Dc; 2],
    /// relays[0][k] carries dc-a's dials to dc-b's node k, relays[1][k] dc-b's to dc-a's.
    relays: Option<[Vec<Relay>; 2]>,
    netns: Option<Netns>,
    bin: PathBuf,
    api: Api,
    /// The sandbox's dir and node settings (a split writes its replacement's config there).
    dir: Option<PathBuf>,
    tuning: NodeTuning,
    /// Per side: the old process of a split, and how many replacements were started.
    old: [Option<OldIncarnation>; 2],
    generation: [u32; 2],
    split_checks: Vec<SplitCheck>,
    /// Per leader kill: the DC, and how long after the kill another member served writes.
    failovers: Vec<Failover>,
    /// Per DC: the relays on its member links (`relay_members`).
    member_relays: [Vec<group::MemberRelay>; 2],
    /// Every member cut off and joined again.
    isolations: Vec<Isolation>,
    /// Where the probes of a cut-off member read: (namespace, service).
    probe_target: Option<(String, String)>,
    /// Every member taken down and started again (`rolling-upgrade`, `node-disk-loss`).
    rolls: Vec<Roll>,
    /// Every backup restored (`backup-restore`).
    restores: Vec<backups::Restore>,
}

impl Cluster {
    /// Sets up the environment and starts the DCs (waiting until both answer), `nodes`
    /// processes per DC (more than one: a group; the sandbox only). `api` is the client
    /// every request of the drill goes through (with the token, if any).
    pub async fn start(
        env: Environment,
        bin: &Path,
        dir: &Path,
        tuning: &NodeTuning,
        relay_seed: u64,
        api: Api,
        nodes: usize,
    ) -> Result<Cluster, SetupError> {
        if nodes != 1 && !matches!(env, Environment::Sandbox) {
            return Err(SetupError::Skipped(format!(
                "groups of {nodes} nodes per DC run in the loopback sandbox only (not --netns or targets)"
            )));
        }
        match env.clone() {
            Environment::Sandbox => Ok(Self::start_sandbox(bin, dir, tuning, relay_seed, api, nodes).await?),
            Environment::Netns => Self::start_netns(bin, dir, tuning, api).await,
            Environment::Targets { a, b, hook } => Ok(Self::start_targets(bin, a, b, hook, api).await?),
        }
    }

    /// Builds a cluster around its DCs (nothing started yet).
    fn assemble(
        env: Environment,
        dcs: [Dc; 2],
        relays: Option<[Vec<Relay>; 2]>,
        bin: &Path,
        api: Api,
        dir: Option<&Path>,
        tuning: &NodeTuning,
    ) -> Cluster {
        Cluster {
            env,
            dcs,
            relays,
            netns: None,
            bin: bin.to_owned(),
            api,
            dir: dir.map(Path::to_owned),
            tuning: tuning.clone(),
            old: [None, None],
            generation: [0; 2],
            split_checks: Vec::new(),
            failovers: Vec::new(),
            member_relays: Default::default(),
            isolations: Vec::new(),
            probe_target: None,
            rolls: Vec::new(),
            restores: Vec::new(),
        }
    }

    /// The client the drill's requests go through.
    pub fn api(&self) -> &Api {
        &self.api
    }

    pub fn capabilities(&self) -> Capabilities {
        match &self.env {
            Environment::Sandbox => Capabilities { one_way: true, packets: true },
            Environment::Netns => Capabilities { one_way: false, packets: false },
            Environment::Targets { hook, .. } => {
                Capabilities { one_way: hook.is_some(), packets: hook.is_some() }
            }
        }
    }

    /// Can this environment kill, pause and restart processes?
    pub fn controls_processes(&self) -> bool {
        match &self.env {
            Environment::Sandbox | Environment::Netns => true,
            Environment::Targets { hook, .. } => hook.is_some(),
        }
    }

    async fn start_sandbox(
        bin: &Path,
        dir: &Path,
        tuning: &NodeTuning,
        relay_seed: u64,
        api: Api,
        nodes: usize,
    ) -> anyhow::Result<Cluster> {
        let certs = dir.join("certs");
        make_certs(bin, &certs, nodes).await?;
        let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        let mut listen: [Vec<SocketAddr>; 2] = Default::default();
        let mut http: [Vec<SocketAddr>; 2] = Default::default();
        for side in 0..2 {
            for _ in 0..nodes {
                listen[side].push(loopback(free_port(true)?));
                http[side].push(loopback(free_port(false)?));
            }
        }
        // relays[side][k]: side's dials to the other side's node k.
        let mut relays: [Vec<Relay>; 2] = Default::default();
        for side in 0..2 {
            for (k, to) in listen[1 - side].iter().enumerate() {
                let seed = relay_seed.wrapping_add((2 * k + side) as u64);
                // On a port of free_port's, so that no node is given it as well.
                let at = loopback(free_port(true)?);
                let r = Relay::start(at, *to, Faults::NONE, seed).await.with_context(|| {
                    format!("relay {} -> {} node {k}", SANDBOX_DCS[side], SANDBOX_DCS[1 - side])
                })?;
                relays[side].push(r);
            }
        }
        let mut dcs = Vec::new();
        let mut member_relays: [Vec<group::MemberRelay>; 2] = Default::default();
        for side in 0..2 {
            let name = SANDBOX_DCS[side];
            let peers: Vec<SocketAddr> = relays[side].iter().map(Relay::local_addr).collect();
            let mut members = if nodes > 1 { Some(group::members(&http[side])?) } else { None };
            if let (Some(m), true) = (members.as_mut(), tuning.relay_members) {
                member_relays[side] =
                    group::relay_members(m, relay_seed.wrapping_add(side as u64 * 100)).await?;
            }
            let mut dc_nodes = Vec::new();
            for k in 0..nodes {
                let (data_dir, config, log) = if nodes == 1 {
                    (
                        dir.join(name).join("data"),
                        dir.join(format!("{name}.toml")),
                        dir.join(format!("{name}.log")),
                    )
                } else {
                    let n = k + 1;
                    (
                        dir.join(name).join("data").join(format!("n{n}")),
                        dir.join(format!("{name}-n{n}.toml")),
                        dir.join(format!("{name}-n{n}.log")),
                    )
                };
                std::fs::create_dir_all(&data_dir)?;
                let mut cfg = node_config(
                    name,
                    &data_dir,
                    http[side][k],
                    listen[side][k],
                    SANDBOX_DCS[1 - side],
                    &peers,
                    &certs,
                    tuning,
                );
                let mut next_config = None;
                if let Some(m) = &members {
                    // The [cluster] table comes last: what follows is in it.
                    cfg.push_str(&group::cluster_section(name, k, m, &certs));
                    if let Some(n) = tuning.snapshot_every_entries {
                        cfg.push_str(&format!("snapshot_every_entries = {n}\n"));
                    }
                    if tuning.previous_release {
                        let previous =
                            cfg.replacen("[replication]\n", "[replication]\nschema_version = 1\n", 1)
                                + "emulate_previous_release = true\n";
                        next_config = Some(std::mem::replace(&mut cfg, previous));
                    }
                }
                std::fs::write(&config, cfg)?;
                let mut node =
                    Node::new(format!("http://{}", http[side][k]), Some(config), Some(data_dir), Some(log));
                node.next_config = next_config;
                node.id = k as u64 + 1;
                dc_nodes.push(node);
            }
            dcs.push(Dc::new(name, dc_nodes, None));
        }
        let [a, b]: [Dc; 2] = dcs.try_into().map_err(|_| anyhow::anyhow!("two DCs"))?;
        let mut c =
            Cluster::assemble(Environment::Sandbox, [a, b], Some(relays), bin, api, Some(dir), tuning);
        c.member_relays = member_relays;
        c.spawn(0)?;
        c.spawn(1)?;
        c.wait_ready(0).await?;
        c.wait_ready(1).await?;
        c.wait_linked().await;
        Ok(c)
    }

    /// Waits (at most [`LINK_TIMEOUT`]) until each DC's replication sender is connected to
    /// the other's, so that the drill's clock starts from two linked DCs, as after a
    /// single node's start: a group's sender can take a few seconds to find the other
    /// group's leader (docs/cluster.md, "Replication from a group"), and a partition
    /// planned for 3 s in must not fall before the first link. Not linked by then: the
    /// drill goes on (its checks judge what happens).
    async fn wait_linked(&self) {
        let deadline = tokio::time::Instant::now() + LINK_TIMEOUT;
        for side in 0..2 {
            let other = SANDBOX_DCS[1 - side];
            'side: loop {
                for node in &self.dcs[side].nodes {
                    if let Ok((_, raw)) = self.api.status(&node.base, Duration::from_millis(500)).await {
                        if raw["peers"][other]["outbound"]["state"] == "up" {
                            break 'side;
                        }
                    }
                }
                if tokio::time::Instant::now() > deadline {
                    eprintln!("note: {} not linked to {other} within {LINK_TIMEOUT:?}", SANDBOX_DCS[side]);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    async fn start_targets(
        bin: &Path,
        a: String,
        b: String,
        hook: Option<String>,
        api: Api,
    ) -> anyhow::Result<Cluster> {
        let mut dcs = Vec::new();
        for base in [a, b] {
            let base = base.trim_end_matches('/').to_owned();
            let (_, raw) = api
                .status(&base, Duration::from_secs(5))
                .await
                .map_err(|e| anyhow::anyhow!("{base}/v1/status: {e}"))?;
            let name = raw.get("dc").and_then(|v| v.as_str()).context("status without dc")?.to_owned();
            dcs.push(Dc::new(&name, vec![Node::new(base, None, None, None)], None));
        }
        let [a, b]: [Dc; 2] = dcs.try_into().map_err(|_| anyhow::anyhow!("two DCs"))?;
        if a.name == b.name {
            bail!("both targets say they are DC {}", a.name);
        }
        let env = Environment::Targets { a: a.base.clone(), b: b.base.clone(), hook };
        Ok(Cluster::assemble(env, [a, b], None, bin, api, None, &NodeTuning::default()))
    }

    /// Starts every process of the DC that is not running.
    fn spawn(&mut self, side: usize) -> anyhow::Result<()> {
        for k in 0..self.dcs[side].nodes.len() {
            if self.dcs[side].nodes[k].child.is_none() {
                self.spawn_node(side, k)?;
            }
        }
        Ok(())
    }

    fn spawn_node(&mut self, side: usize, k: usize) -> anyhow::Result<()> {
        let dc = &mut self.dcs[side];
        let node = &mut dc.nodes[k];
        let (Some(config), Some(log)) = (&node.config, &node.log) else {
            bail!("{} is not run by the drill", dc.name)
        };
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        let mut cmd = match &dc.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        cmd.arg("server").arg("--config").arg(config);
        cmd.stdin(Stdio::null()).stdout(Stdio::from(out)).stderr(Stdio::from(err)).kill_on_drop(true);
        let child = cmd.spawn().with_context(|| format!("cannot start {}", self.bin.display()))?;
        node.child = Some(child);
        node.paused = false;
        Ok(())
    }

    /// Waits until every running process of the DC answers `/v1/status` and, in a group,
    /// one member serves writes (bounded).
    pub async fn wait_ready(&mut self, side: usize) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        for k in 0..self.dcs[side].nodes.len() {
            loop {
                let node = &mut self.dcs[side].nodes[k];
                let Some(child) = node.child.as_mut() else { break };
                if let Ok(Some(status)) = child.try_wait() {
                    bail!(
                        "{} exited during start ({status}); log tail:\n{}",
                        self.dcs[side].name,
                        self.log_tail(side)
                    );
                }
                if self.api.status(&node.base, Duration::from_millis(500)).await.is_ok() {
                    break;
                }
                if tokio::time::Instant::now() > deadline {
                    bail!(
                        "{} did not answer within {READY_TIMEOUT:?}; log tail:\n{}",
                        self.dcs[side].name,
                        self.log_tail(side)
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if self.dcs[side].nodes.len() > 1 {
            self.serving_member(side, None, deadline).await?;
        }
        Ok(())
    }

    pub fn log_tail(&self, side: usize) -> String {
        let mut out = Vec::new();
        for p in self.dcs[side].log_paths() {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push(format!("== {}\n{}", p.display(), lines[lines.len().saturating_sub(15)..].join("\n")));
        }
        out.join("\n")
    }

    /// Performs one action. Returns a note when the action was only marked (not injected).
    pub async fn apply(&mut self, action: Action) -> anyhow::Result<Option<String>> {
        if let Environment::Targets { hook, .. } = &self.env {
            let Some(hook) = hook.clone() else {
                return Ok(Some("no --fault-hook: marked only, nothing injected".into()));
            };
            return self.run_hook(&hook, action).await.map(|()| None);
        }
        match action {
            Action::Cut(cut) => self.cut(cut)?,
            Action::Heal => self.heal()?,
            Action::Packets(p) => self.packets(Some(p))?,
            Action::ClearPackets => self.packets(None)?,
            Action::Kill { side, wipe } => {
                self.kill(side).await?;
                if wipe {
                    for d in self.dcs[side].nodes.iter().filter_map(|n| n.data_dir.as_ref()) {
                        std::fs::remove_dir_all(d).with_context(|| format!("wiping {}", d.display()))?;
                        std::fs::create_dir_all(d)?;
                    }
                }
            }
            Action::Restart { side } if self.dcs[side].restored => {
                return self.start_restored(side).await.map(Some)
            }
            Action::Restart { side } => {
                self.spawn(side)?;
                self.wait_ready(side).await?;
            }
            Action::Pause { side } => self.signal(side, "-STOP", true).await?,
            Action::Resume { side } => self.signal(side, "-CONT", false).await?,
            Action::Save { side } => self.save(side)?,
            Action::Restore { side } if self.dcs[side].nodes.len() > 1 => self.restore_backup(side).await?,
            Action::Restore { side } => self.restore(side)?,
            Action::Backup { side } => return self.backup(side).await.map(Some),
            Action::Split { side } => self.split(side).await?,
            Action::EndSplit { side } => self.end_split(side).await?,
            Action::KillLeader { side } => return self.kill_leader(side).await.map(Some),
            Action::RestartMember { side } => self.restart_members(side).await?,
            Action::IsolateMember { side, leader } => return self.isolate(side, leader).await.map(Some),
            Action::RejoinMember { side } => return self.rejoin(side).await.map(Some),
            Action::StopMember { side, leader, how } => {
                return self.stop_member(side, leader, how).await.map(Some)
            }
            Action::StartMember { side } => return self.start_member(side).await.map(Some),
        }
        Ok(None)
    }

    fn cut(&self, cut: Cut) -> anyhow::Result<()> {
        if let Some([abs, bas]) = &self.relays {
            // An a->b relay: forward = a->b (a's dial), backward = b->a; b->a relays the
            // reverse.
            let (ab, ba) = match cut {
                Cut::Both => (Direction::Both, Direction::Both),
                Cut::AToB => (Direction::Forward, Direction::Backward),
                Cut::BToA => (Direction::Backward, Direction::Forward),
            };
            abs.iter().for_each(|r| r.handle().partition(ab));
            bas.iter().for_each(|r| r.handle().partition(ba));
            return Ok(());
        }
        if let Some(ns) = &self.netns {
            if cut != Cut::Both {
                bail!("one-way cuts need the relay; not available with --netns");
            }
            return ns.link(false);
        }
        bail!("no link to cut")
    }

    fn heal(&self) -> anyhow::Result<()> {
        if let Some(relays) = &self.relays {
            relays.iter().flatten().for_each(|r| r.handle().heal());
            return Ok(());
        }
        if let Some(ns) = &self.netns {
            return ns.link(true);
        }
        bail!("no link to heal")
    }

    fn packets(&self, p: Option<PacketFaults>) -> anyhow::Result<()> {
        let Some(relays) = &self.relays else { bail!("packet faults need the relay") };
        let faults = match p {
            None => Faults::NONE,
            Some(p) => Faults::symmetric(LinkFaults {
                partitioned: false,
                loss: Probability::percent(p.loss_pct),
                delay_ms: p.delay_ms,
                jitter_ms: p.jitter_ms,
                duplicate: Probability::percent(p.duplicate_pct),
                reorder: Probability::percent(p.reorder_pct),
                reorder_hold_ms: p.reorder_hold_ms,
            }),
        };
        for r in relays.iter().flatten() {
            // Keep a partition in force if there is one.
            let partitioned = r.handle().faults();
            let mut f = faults;
            f.forward.partitioned = partitioned.forward.partitioned;
            f.backward.partitioned = partitioned.backward.partitioned;
            r.handle().set_faults(f);
        }
        Ok(())
    }

    /// SIGKILL of every process of the DC at once, then reap (bounded). At once: a group
    /// killed member by member would elect another leader that ships on meanwhile (a
    /// member in an fsync dies only once it returns), after the checker was told the DC
    /// is down.
    pub async fn kill(&mut self, side: usize) -> anyhow::Result<()> {
        for node in &mut self.dcs[side].nodes {
            if let Some(child) = node.child.as_mut() {
                let _ = child.start_kill();
            }
        }
        for k in 0..self.dcs[side].nodes.len() {
            self.kill_node(side, k).await?;
        }
        Ok(())
    }

    async fn kill_node(&mut self, side: usize, k: usize) -> anyhow::Result<()> {
        let dc = &mut self.dcs[side];
        let node = &mut dc.nodes[k];
        if let Some(mut child) = node.child.take() {
            let _ = child.start_kill();
            tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .with_context(|| format!("{} did not die within 10s of SIGKILL", dc.name))??;
        }
        node.paused = false;
        Ok(())
    }

    /// Sends `sig` to every process of the DC.
    async fn signal(&mut self, side: usize, sig: &str, paused: bool) -> anyhow::Result<()> {
        let dc = &mut self.dcs[side];
        let pids: Vec<u32> = dc.nodes.iter().filter_map(Node::pid).collect();
        if pids.is_empty() {
            bail!("{} is not running", dc.name);
        }
        for pid in pids {
            let st = tokio::time::timeout(
                Duration::from_secs(5),
                Command::new("kill").arg(sig).arg(pid.to_string()).status(),
            )
            .await
            .context("kill timed out")??;
            if !st.success() {
                bail!("kill {sig} {pid} failed");
            }
        }
        dc.nodes.iter_mut().filter(|n| n.child.is_some()).for_each(|n| n.paused = paused);
        Ok(())
    }

    /// Relay counters: (a->b forwarded, dropped), (b->a forwarded, dropped), summed over
    /// both relays' directions.
    pub fn relay_totals(&self) -> Option<(u64, u64, u64, u64)> {
        let [abs, bas] = self.relays.as_ref()?;
        let (mut a_to_b, mut b_to_a) = ((0, 0), (0, 0));
        for x in abs.iter().map(|r| r.handle().stats()) {
            a_to_b = (a_to_b.0 + x.forward.forwarded, a_to_b.1 + x.forward.dropped());
            b_to_a = (b_to_a.0 + x.backward.forwarded, b_to_a.1 + x.backward.dropped());
        }
        for y in bas.iter().map(|r| r.handle().stats()) {
            a_to_b = (a_to_b.0 + y.backward.forwarded, a_to_b.1 + y.backward.dropped());
            b_to_a = (b_to_a.0 + y.forward.forwarded, b_to_a.1 + y.forward.dropped());
        }
        Some((a_to_b.0, a_to_b.1, b_to_a.0, b_to_a.1))
    }

    /// Stops the DCs (SIGTERM, then SIGKILL after a bounded wait) and removes namespaces.
    pub async fn shutdown(mut self) {
        self.kill_old_incarnations();
        for side in 0..2 {
            if self.dcs[side].nodes.iter().any(|n| n.paused) {
                let _ = self.signal(side, "-CONT", false).await;
            }
            for pid in self.dcs[side].nodes.iter().filter_map(Node::pid) {
                let _ = tokio::time::timeout(
                    Duration::from_secs(2),
                    Command::new("kill").arg("-TERM").arg(pid.to_string()).status(),
                )
                .await;
            }
            for node in &mut self.dcs[side].nodes {
                if let Some(mut child) = node.child.take() {
                    if tokio::time::timeout(Duration::from_secs(5), child.wait()).await.is_err() {
                        let _ = child.start_kill();
                        let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
                    }
                }
            }
        }
        if let Some(relays) = self.relays.take() {
            for r in relays.into_iter().flatten() {
                r.shutdown().await;
            }
        }
        for r in std::mem::take(&mut self.member_relays).into_iter().flatten() {
            r.relay.shutdown().await;
        }
        // Namespaces go with `self` (Drop).
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill_old_incarnations();
        for node in self.dcs.iter_mut().flat_map(|dc| dc.nodes.iter_mut()) {
            if let Some(child) = node.child.as_mut() {
                // SIGKILL works on stopped processes too.
                let _ = child.start_kill();
            }
        }
        if let Some(ns) = self.netns.take() {
            // Processes in the namespaces must be gone before the veths go away; give the
            // kernel a moment to reap them.
            std::thread::sleep(Duration::from_millis(100));
            drop(ns);
        }
    }
}
