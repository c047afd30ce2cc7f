//! The web console (`/ui/`) in a real browser: headless Debian chromium driven by npm
//! puppeteer-core (`compat/console_scenario.js`) against two in-process DCs joined through
//! fault relays. The script loads dc-b's console once and follows a registration at dc-a,
//! the failover view, a partition (it prints `CONTROL partition`; this test cuts the relays
//! and answers `ok`) and its heal, then every page at mobile width. `compat/browser-setup.sh`
//! installs the browser and puppeteer-core; when it cannot, the test is skipped, except
//! with CI=true where that fails it. Screenshots are kept in `CARGO_TARGET_TMPDIR/console-shots`.

mod common;

use std::fs::File;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

/// How long the browser script may run before it is killed (it passes in well under this).
const SCRIPT_DEADLINE: Duration = Duration::from_secs(120);
/// How long `compat/browser-setup.sh` may take (a first install fetches chromium).
const SETUP_DEADLINE: Duration = Duration::from_secs(900);
/// Staleness window of both DCs: a partition shows as stale this long after the last ping.
const STALE_AFTER_MS: u64 = 1_500;

/// The package's directory at run time (a test binary reused from another checkout reads
/// this checkout's scripts).
fn repo() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Kills process group `pgid`.
fn kill_group(pgid: u32, signal: &str) {
    let group = format!("-{pgid}");
    let _ = Command::new("kill").args([signal, "--", &group]).stderr(Stdio::null()).status();
}

/// Runs browser-setup.sh: Ok(the NODE_PATH it printed) or Err(its output).
fn setup() -> Result<String, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("setup.log");
    let out = File::create(&log).expect("create a log file");
    let err = out.try_clone().expect("clone the log file");
    let mut child = Command::new("bash")
        .arg(repo().join("compat/browser-setup.sh"))
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start bash: {e}"))?;
    let deadline = Instant::now() + SETUP_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for setup") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            kill_group(child.id(), "-KILL");
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut text = String::new();
    let _ = File::open(&log).and_then(|mut f| f.read_to_string(&mut text));
    match status {
        Some(s) if s.success() => {
            println!("{text}");
            text.lines()
                .find_map(|l| l.strip_prefix("NODE_PATH="))
                .map(str::to_owned)
                .ok_or_else(|| format!("{text}\ncompat/browser-setup.sh printed no NODE_PATH= line"))
        }
        Some(_) => Err(text),
        None => Err(format!("{text}\ncompat/browser-setup.sh did not finish within {SETUP_DEADLINE:?}")),
    }
}

/// The running script (its own process group) and the browser it launched (chromium runs
/// in a process group of its own); both groups are killed when dropped.
struct Script {
    child: Child,
    stdin: Option<ChildStdin>,
    browser: Option<u32>,
}

impl Script {
    /// Writes a line to the script (a script that is gone shows by its exit).
    fn answer(&mut self, word: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(format!("{word}\n").as_bytes()).and_then(|()| stdin.flush());
        }
    }

    /// SIGTERM first (puppeteer then closes its browser), SIGKILL after a grace period.
    fn stop(&mut self) {
        self.stdin = None;
        if self.child.try_wait().ok().flatten().is_none() {
            kill_group(self.child.id(), "-TERM");
            let until = Instant::now() + Duration::from_secs(3);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
            kill_group(self.child.id(), "-KILL");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(pid) = self.browser.take() {
            // Only while that pid is still a chromium (not a reused pid).
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains("chrom") {
                kill_group(pid, "-KILL");
            }
        }
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sends each line of `from` to `tx`, prefixed with `tag`.
fn forward(from: impl std::io::Read + Send + 'static, tag: &'static str, tx: mpsc::UnboundedSender<String>) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            if tx.send(format!("{tag}{line}")).is_err() {
                break;
            }
        }
    });
}

/// The folder the screenshots are kept in, emptied.
fn shots_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-shots");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the screenshot folder");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_a_browser_against_two_dcs() {
    let node_path = match setup() {
        Ok(p) => p,
        Err(out) => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("compat/browser-setup.sh could not install the browser test:\n{out}");
            }
            let reason =
                out.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("browser-setup.sh failed");
            eprintln!("SKIPPED: the browser test is not installed: {reason}");
            return;
        }
    };
    let pair = common::pair_with(|c| {
        if let Some(r) = c.replication.as_mut() {
            r.stale_after_ms = STALE_AFTER_MS;
        }
    })
    .await;
    let a = pair.a.as_ref().unwrap().http_addr().to_string();
    let b = pair.b.as_ref().unwrap().http_addr().to_string();
    let shots = shots_dir();
    let work = tempfile::tempdir().expect("tempdir");
    println!("dc-a {a}, dc-b {b}; screenshots in {}", shots.display());

    let mut child = Command::new("node")
        .arg(repo().join("compat/console_scenario.js"))
        .current_dir(work.path())
        .env("NODE_PATH", &node_path)
        .env("TANDEM_A", &a)
        .env("TANDEM_B", &b)
        .env("SHOTS", &shots)
        .env_remove("CHROMIUM")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start node: {e}"));
    let (tx, mut rx) = mpsc::unbounded_channel();
    forward(child.stdout.take().unwrap(), "", tx.clone());
    forward(child.stderr.take().unwrap(), "stderr: ", tx);
    let stdin = child.stdin.take();
    let mut script = Script { child, stdin, browser: None };

    let started = Instant::now();
    let deadline = started + SCRIPT_DEADLINE;
    let mut output = String::new();
    let mut exited = None;
    let mut exited_at: Option<Instant> = None;
    let line_wait = Duration::from_millis(200);
    while Instant::now() < deadline {
        let line = match tokio::time::timeout(line_wait, rx.recv()).await {
            Ok(Some(line)) => line,
            // Both pipes closed.
            Ok(None) => break,
            Err(_) => {
                if exited.is_none() {
                    exited = script.child.try_wait().expect("wait for the script");
                    exited_at = exited.map(|_| Instant::now());
                }
                // After the exit, a short while for the last lines (a grandchild may hold
                // a pipe open).
                if exited_at.is_some_and(|t| t.elapsed() > Duration::from_secs(2)) {
                    break;
                }
                continue;
            }
        };
        println!("{line}");
        output.push_str(&line);
        output.push('\n');
        if let Some(rest) = line.strip_prefix("BROWSER ") {
            script.browser = rest.split_whitespace().next().and_then(|p| p.parse().ok());
        } else if let Some(word) = line.strip_prefix("CONTROL ") {
            match word.trim() {
                "partition" => {
                    pair.partition();
                    script.answer("ok");
                }
                "heal" => {
                    pair.heal();
                    script.answer("ok");
                }
                other => script.answer(&format!("unknown control {other}")),
            }
        }
    }
    let status = match exited {
        Some(s) => Some(s),
        None => {
            // The pipes closed: the script is exiting or has.
            let until = Instant::now() + Duration::from_secs(5);
            loop {
                match script.child.try_wait().expect("wait for the script") {
                    Some(s) => break Some(s),
                    None if Instant::now() >= until || Instant::now() >= deadline => break None,
                    None => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
    };
    script.stop();
    drop(script);
    pair.stop().await;
    println!(
        "console scenario after {:.1} s; screenshots in {}",
        started.elapsed().as_secs_f64(),
        shots.display()
    );
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("compat/console_scenario.js failed ({s}):\n{output}"),
        None => {
            panic!("compat/console_scenario.js did not finish within {SCRIPT_DEADLINE:?}; killed:\n{output}")
        }
    }
}
