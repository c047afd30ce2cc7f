//! What the sandbox writes for its nodes: each node's TOML config, the certificates
//! (`tandem certs`), and the loopback ports they listen on.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::process::Command;

use super::{NodeTuning, SANDBOX_DCS};

pub(super) fn toml_str(p: &Path) -> String {
    let s = p.display().to_string();
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn node_config(
    dc: &str,
    data_dir: &Path,
    http: SocketAddr,
    listen: SocketAddr,
    peer: &str,
    peer_addrs: &[SocketAddr],
    certs: &Path,
    t: &NodeTuning,
) -> String {
    let peer_addr = peer_addrs.first().copied().unwrap_or(listen);
    let more: Vec<String> = peer_addrs.iter().skip(1).map(|a| format!("\"{a}\"")).collect();
    let mut s = String::new();
    let _ = writeln!(s, "# Written by `tandem chaos` for one drill.");
    let _ = writeln!(s, "dc = \"{dc}\"\ndata_dir = {}\nhttp_addr = \"{http}\"\n", toml_str(data_dir));
    let _ = writeln!(
        s,
        "[health]\nheartbeat_interval_ms = {}\nsuspect_after_ms = {}\nunhealthy_after_ms = {}\nexpire_after_ms = {}\ncheck_interval_ms = {}\n",
        t.heartbeat_interval_ms, t.suspect_after_ms, t.unhealthy_after_ms, t.expire_after_ms, t.check_interval_ms
    );
    let _ = writeln!(s, "[protection]\nself_preservation_window_ms = {}\n", t.self_preservation_window_ms);
    // The drill's nodes serve only the drill (loopback or the drill's own namespaces).
    let _ = writeln!(s, "[acl]\nenabled = false\n");
    let _ = writeln!(
        s,
        "[replication]\nlisten = \"{listen}\"\npeers = [{{ dc = \"{peer}\", addr = \"{peer_addr}\", addrs = [{}] }}]\nca_cert = {}\ncert = {}\nkey = {}",
        more.join(", "),
        toml_str(&certs.join("ca.pem")),
        toml_str(&certs.join(format!("{dc}.pem"))),
        toml_str(&certs.join(format!("{dc}.key")))
    );
    let _ = writeln!(
        s,
        "batch_events_max = {}\nwindow_batches_max = {}\nbackoff_initial_ms = {}\nbackoff_max_ms = {}\nstale_after_ms = {}\npurge_grace_ms = {}\nping_interval_ms = {}\n",
        t.batch_events_max,
        t.window_batches_max,
        t.backoff_initial_ms,
        t.backoff_max_ms,
        t.stale_after_ms,
        t.purge_grace_ms,
        t.ping_interval_ms
    );
    let _ = writeln!(s, "[log]\nlevel = \"info,quinn=warn,rustls=warn,openraft=warn\"");
    s
}

/// Node ids with a certificate in a sandbox of groups: its members' and the replacements
/// of `add-remove-node` (`tandem certs --nodes`' maximum).
pub(super) const MEMBER_IDS_MAX: u64 = 9;

pub(super) async fn make_certs(bin: &Path, dir: &Path, nodes: usize) -> anyhow::Result<()> {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(bin)
            .args(["certs", "--out"])
            .arg(dir)
            .args(["--dc", SANDBOX_DCS[0], "--dc", SANDBOX_DCS[1], "--force"])
            .args(if nodes > 1 { vec!["--nodes".to_owned(), MEMBER_IDS_MAX.to_string()] } else { Vec::new() })
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .context("`tandem certs` timed out")?
    .with_context(|| format!("cannot run {}", bin.display()))?;
    if !out.status.success() {
        bail!("`tandem certs` failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}
