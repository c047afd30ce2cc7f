//! `--netns` mode: two network namespaces joined by a veth pair for replication (a
//! partition takes it down), each with a veth to the root namespace for the drill's HTTP
//! clients; the DCs run inside them via `ip netns exec`. Needs root; deleted on drop.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context as _};

use super::{make_certs, node_config, Cluster, Dc, Environment, Node, NodeTuning, SetupError, SANDBOX_DCS};
use crate::api::Api;

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl Cluster {
    pub(super) async fn start_netns(
        bin: &Path,
        dir: &Path,
        tuning: &NodeTuning,
        api: Api,
    ) -> Result<Cluster, SetupError> {
        if !is_root() {
            return Err(SetupError::Skipped(
                "network namespaces need root (this process is not uid 0)".into(),
            ));
        }
        let id = (u64::from(std::process::id()) * 16 + NEXT_ID.fetch_add(1, Ordering::Relaxed)) % 100_000;
        let ns = Netns::create(id)?;
        let certs = dir.join("certs");
        make_certs(bin, &certs, 1).await?;
        let mut dcs = Vec::new();
        for side in 0..2 {
            let name = SANDBOX_DCS[side];
            let data_dir = dir.join(name).join("data");
            std::fs::create_dir_all(&data_dir).map_err(anyhow::Error::from)?;
            let http: SocketAddr =
                format!("{}:8500", ns.ctl_addr(side)).parse().map_err(anyhow::Error::from)?;
            let listen: SocketAddr =
                format!("{}:7500", ns.repl_addr(side)).parse().map_err(anyhow::Error::from)?;
            let peer: SocketAddr =
                format!("{}:7500", ns.repl_addr(1 - side)).parse().map_err(anyhow::Error::from)?;
            let cfg =
                node_config(name, &data_dir, http, listen, SANDBOX_DCS[1 - side], &[peer], &certs, tuning);
            let config = dir.join(format!("{name}.toml"));
            std::fs::write(&config, cfg).map_err(anyhow::Error::from)?;
            let node = Node::new(
                format!("http://{http}"),
                Some(config),
                Some(data_dir),
                Some(dir.join(format!("{name}.log"))),
            );
            dcs.push(Dc::new(name, vec![node], Some(ns.names[side].clone())));
        }
        let [a, b]: [Dc; 2] = dcs.try_into().map_err(|_| anyhow::anyhow!("two DCs"))?;
        let mut c = Cluster::assemble(Environment::Netns, [a, b], None, bin, api, Some(dir), tuning);
        c.netns = Some(ns);
        c.spawn(0)?;
        c.spawn(1)?;
        c.wait_ready(0).await?;
        c.wait_ready(1).await?;
        Ok(c)
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// Two network namespaces joined by a veth pair, each with a veth to the root namespace.
/// Deleted on drop.
pub(super) struct Netns {
    names: [String; 2],
    /// The replication veth ends, inside each namespace.
    repl_if: [String; 2],
    octet: u64,
    /// Root-side ends of the control veths.
    ctl_root_if: [String; 2],
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run `ip`")?;
    if !out.status.success() {
        bail!("`ip {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

impl Netns {
    fn create(id: u64) -> Result<Netns, SetupError> {
        let names = [format!("tchaos{id}a"), format!("tchaos{id}b")];
        if let Err(e) = ip(&["netns", "add", &names[0]]) {
            return Err(SetupError::Skipped(format!("cannot create a network namespace: {e:#}")));
        }
        let ns = Netns {
            names: names.clone(),
            repl_if: [format!("tcr{id}a"), format!("tcr{id}b")],
            octet: 20 + id % 200,
            ctl_root_if: [format!("tch{id}a"), format!("tch{id}b")],
        };
        // From here on, `ns` cleans up whatever was created if a step fails.
        let k = ns.octet;
        let steps: Vec<Vec<String>> = {
            let mut v: Vec<Vec<String>> = vec![
                vec!["netns".into(), "add".into(), names[1].clone()],
                vec![
                    "link".into(),
                    "add".into(),
                    ns.repl_if[0].clone(),
                    "type".into(),
                    "veth".into(),
                    "peer".into(),
                    "name".into(),
                    ns.repl_if[1].clone(),
                ],
            ];
            for side in 0..2 {
                let ctl_ns_if = format!("tcc{id}{}", ["a", "b"][side]);
                v.push(vec![
                    "link".into(),
                    "set".into(),
                    ns.repl_if[side].clone(),
                    "netns".into(),
                    names[side].clone(),
                ]);
                v.push(vec![
                    "link".into(),
                    "add".into(),
                    ns.ctl_root_if[side].clone(),
                    "type".into(),
                    "veth".into(),
                    "peer".into(),
                    "name".into(),
                    ctl_ns_if.clone(),
                ]);
                v.push(vec![
                    "link".into(),
                    "set".into(),
                    ctl_ns_if.clone(),
                    "netns".into(),
                    names[side].clone(),
                ]);
                v.push(vec![
                    "-n".into(),
                    names[side].clone(),
                    "addr".into(),
                    "add".into(),
                    format!("10.231.{k}.{}/24", side + 1),
                    "dev".into(),
                    ns.repl_if[side].clone(),
                ]);
                v.push(vec![
                    "-n".into(),
                    names[side].clone(),
                    "addr".into(),
                    "add".into(),
                    format!("10.{}.{k}.2/24", 232 + side),
                    "dev".into(),
                    ctl_ns_if.clone(),
                ]);
                v.push(vec![
                    "addr".into(),
                    "add".into(),
                    format!("10.{}.{k}.1/24", 232 + side),
                    "dev".into(),
                    ns.ctl_root_if[side].clone(),
                ]);
                v.push(vec![
                    "-n".into(),
                    names[side].clone(),
                    "link".into(),
                    "set".into(),
                    "lo".into(),
                    "up".into(),
                ]);
                v.push(vec![
                    "-n".into(),
                    names[side].clone(),
                    "link".into(),
                    "set".into(),
                    ns.repl_if[side].clone(),
                    "up".into(),
                ]);
                v.push(vec![
                    "-n".into(),
                    names[side].clone(),
                    "link".into(),
                    "set".into(),
                    ctl_ns_if,
                    "up".into(),
                ]);
                v.push(vec!["link".into(), "set".into(), ns.ctl_root_if[side].clone(), "up".into()]);
            }
            v
        };
        for s in steps {
            let args: Vec<&str> = s.iter().map(String::as_str).collect();
            ip(&args).map_err(SetupError::Failed)?;
        }
        Ok(ns)
    }

    fn repl_addr(&self, side: usize) -> String {
        format!("10.231.{}.{}", self.octet, side + 1)
    }

    fn ctl_addr(&self, side: usize) -> String {
        format!("10.{}.{}.2", 232 + side, self.octet)
    }

    /// Takes the replication link down (both ends) or up.
    pub(super) fn link(&self, up: bool) -> anyhow::Result<()> {
        let state = if up { "up" } else { "down" };
        for side in 0..2 {
            ip(&["-n", &self.names[side], "link", "set", &self.repl_if[side], state])?;
        }
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for side in 0..2 {
            let _ = ip(&["link", "del", &self.ctl_root_if[side]]);
            let _ = ip(&["netns", "del", &self.names[side]]);
        }
    }
}
