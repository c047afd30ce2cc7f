//! Real third-party clients against a real two-DC `tandem dev` sandbox (3 nodes per DC):
//! py-consul, python-consul and npm `consul` on the Consul-compatible API, nacos-sdk-python
//! and npm `nacos-naming` on the Nacos-compatible API, and Prometheus on the HTTP-SD
//! endpoint. `compat/setup.sh` installs the clients, pinned, into a cache folder; each
//! scenario under compat/ runs as a child process with a deadline, all at once against one
//! sandbox (their service names differ). When the clients cannot be installed the test is
//! skipped, except with CI=true where that fails it.

mod common;

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Nodes per DC of the sandbox.
const NODES: u16 = 3;
/// How long one scenario may run before it is killed (they pass in well under a minute).
const SCENARIO_DEADLINE: Duration = Duration::from_secs(100);
/// How long the sandbox may take until every node answers `GET /v1/ready` with 200.
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// How long `compat/setup.sh` may take (a first install downloads every client).
const SETUP_DEADLINE: Duration = Duration::from_secs(900);

/// The package's directory at run time (a test binary reused from another checkout reads
/// this checkout's scripts).
fn repo() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The cache folder setup.sh installs into.
fn cache_dir() -> PathBuf {
    match std::env::var_os("TANDEM_COMPAT_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tandem-compat"),
    }
}

/// A child process (in its own process group) whose output goes to `log`; the whole group
/// is killed when dropped, so a scenario's own children (Prometheus) go with it.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(mut cmd: Command, log: &Path) -> Proc {
        let out = File::create(log).expect("create a log file");
        let err = out.try_clone().expect("clone the log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Proc { child, log: log.to_owned() }
    }

    /// Waits up to `deadline`: Some(success) when it exited, None when it was killed.
    fn wait_until(&mut self, deadline: Instant) -> Option<bool> {
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for a child") {
                return Some(status.success());
            }
            if Instant::now() >= deadline {
                self.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn output(&self) -> String {
        let mut text = String::new();
        let _ = File::open(&self.log).and_then(|mut f| f.read_to_string(&mut text));
        text
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs setup.sh: Ok(its output) when every client is installed.
fn setup() -> Result<String, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("compat/setup.sh"));
    let mut proc = Proc::spawn(cmd, &dir.path().join("setup.log"));
    let done = proc.wait_until(Instant::now() + SETUP_DEADLINE);
    let out = proc.output();
    match done {
        Some(true) => Ok(out),
        Some(false) => Err(out),
        None => Err(format!("{out}\ncompat/setup.sh did not finish within {SETUP_DEADLINE:?}")),
    }
}

fn tcp_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

fn udp_free(port: u16) -> bool {
    UdpSocket::bind(("127.0.0.1", port)).is_ok()
}

/// Offsets from a base port of every node of both DCs (`tandem dev` puts node k of DC i
/// at base + i + 10*(k-1)).
fn offsets() -> impl Iterator<Item = u16> {
    (0..NODES).flat_map(|k| [10 * k, 10 * k + 1])
}

/// HTTP and replication base ports whose every sandbox port (HTTP, gateway, member link;
/// TCP and UDP) is free now, below the ephemeral range.
fn free_bases() -> (u16, u16) {
    use rand::Rng as _;
    let below: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    let top = below.saturating_sub(400).max(12_000);
    for _ in 0..500 {
        let http = rand::thread_rng().gen_range(10_000..top);
        let repl = http + 200;
        let ports = offsets().map(|o| http + o).chain(offsets().flat_map(|o| [repl + o, repl + 100 + o]));
        if ports.into_iter().all(|p| tcp_free(p) && udp_free(p)) {
            return (http, repl);
        }
    }
    panic!("no free loopback ports for the sandbox below {below}");
}

/// The status code of `GET {path}` at `addr`, read off a plain HTTP/1.1 exchange.
fn get_status(addr: &str, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut head = [0u8; 32];
    let n = s.read(&mut head).ok()?;
    std::str::from_utf8(&head[..n]).ok()?.split(' ').nth(1)?.parse().ok()
}

/// The running sandbox: its process (killed when dropped) and every node's HTTP address.
struct Sandbox {
    proc: Proc,
    a: Vec<String>,
    b: Vec<String>,
    _dir: tempfile::TempDir,
}

fn start_sandbox() -> Sandbox {
    let dir = tempfile::tempdir().expect("tempdir");
    let (http, repl) = free_bases();
    let mut cmd = Command::new(common::tandem_bin());
    cmd.args(["dev", "--dir"])
        .arg(dir.path().join("sandbox"))
        .args(["--http-port", &http.to_string(), "--repl-port", &repl.to_string()])
        .args(["--nodes", &NODES.to_string()])
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1");
    let mut proc = Proc::spawn(cmd, &dir.path().join("tandem-dev.log"));
    let at = |dc: u16| -> Vec<String> {
        (0..NODES).map(|k| format!("127.0.0.1:{}", http + dc + 10 * k)).collect()
    };
    let (a, b) = (at(0), at(1));
    let deadline = Instant::now() + READY_DEADLINE;
    for addr in a.iter().chain(&b) {
        while get_status(addr, "/v1/ready") != Some(200) {
            if let Ok(Some(status)) = proc.child.try_wait() {
                panic!("tandem dev exited ({status}):\n{}", proc.output());
            }
            if Instant::now() > deadline {
                panic!("{addr} not ready within {READY_DEADLINE:?}; tandem dev said:\n{}", proc.output());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Sandbox { proc, a, b, _dir: dir }
}

struct Scenario {
    name: &'static str,
    program: &'static str,
    script: &'static str,
    /// (variable, directory under the cache folder)
    path_env: Option<(&'static str, &'static str)>,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "py-consul 1.8.0",
        program: "python3",
        script: "consul_scenario.py",
        path_env: Some(("PYTHONPATH", "py/py-consul-1.8.0")),
    },
    Scenario {
        name: "python-consul 1.1.0",
        program: "python3",
        script: "consul_scenario.py",
        path_env: Some(("PYTHONPATH", "py/python-consul-1.1.0")),
    },
    Scenario {
        name: "npm consul 2.0.1",
        program: "node",
        script: "consul_scenario.js",
        path_env: Some(("NODE_PATH", "npm/consul-2.0.1/node_modules")),
    },
    Scenario {
        name: "nacos-sdk-python 2.0.11",
        program: "python3",
        script: "nacos_scenario.py",
        path_env: Some(("PYTHONPATH", "py/nacos-sdk-python-2.0.11")),
    },
    Scenario {
        name: "npm nacos-naming 2.6.3",
        program: "node",
        script: "nacos_scenario.js",
        path_env: Some(("NODE_PATH", "npm/nacos-naming-2.6.3/node_modules")),
    },
    Scenario {
        name: "prometheus http_sd",
        program: "python3",
        script: "prometheus_scenario.py",
        path_env: None,
    },
];

#[test]
fn third_party_clients_against_a_two_dc_sandbox() {
    match setup() {
        Ok(out) => println!("{out}"),
        Err(out) => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("compat/setup.sh could not install the clients:\n{out}");
            }
            let reason = out.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("compat/setup.sh failed");
            eprintln!("SKIPPED: the compatibility clients are not installed: {reason}");
            return;
        }
    }
    let sandbox = start_sandbox();
    let logs = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let mut running: Vec<(&Scenario, Proc)> = SCENARIOS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut cmd = Command::new(s.program);
            cmd.arg(repo().join("compat").join(s.script))
                .current_dir(logs.path())
                .env("TANDEM_A", &sandbox.a[0])
                .env("TANDEM_B", &sandbox.b[0])
                .env("TANDEM_A_ALL", sandbox.a.join(","))
                .env("TANDEM_B_ALL", sandbox.b.join(","))
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .env("PYTHONUNBUFFERED", "1")
                .env_remove("PYTHONPATH")
                .env_remove("NODE_PATH");
            for var in ["CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_SSL", "CONSUL_HTTP_SSL_VERIFY"]
            {
                cmd.env_remove(var);
            }
            if let Some((var, dir)) = s.path_env {
                cmd.env(var, cache_dir().join(dir));
            }
            let proc = Proc::spawn(cmd, &logs.path().join(format!("scenario-{i}.log")));
            (s, proc)
        })
        .collect();
    let deadline = started + SCENARIO_DEADLINE;
    let mut failed = Vec::new();
    let mut summary = Vec::new();
    for (s, proc) in &mut running {
        let done = proc.wait_until(deadline);
        let verdict = match done {
            Some(true) => "passed",
            Some(false) => "FAILED",
            None => "KILLED (deadline)",
        };
        println!("===== {} ({}): {verdict}\n{}", s.name, s.script, proc.output());
        summary.push(format!("{}: {verdict}", s.name));
        if done != Some(true) {
            failed.push(s.name);
        }
    }
    println!("compat scenarios after {:.1} s: {}", started.elapsed().as_secs_f64(), summary.join(", "));
    if !failed.is_empty() {
        println!("===== tandem dev log\n{}", sandbox.proc.output());
    }
    drop(running);
    drop(sandbox);
    assert!(failed.is_empty(), "compat scenarios failed: {}", failed.join(", "));
}
