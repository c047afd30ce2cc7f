//! kill -9 in the middle of group commits: every acknowledged event survives.
//!
//! The parent test runs this very test binary again as a child (`--exact crash_child`) with
//! `TANDEM_CRASH_CHILD=<dir>`. The child appends through the [`Committer`] from many tasks
//! and prints `ACK <seq>` for each acknowledged event, flushed. The parent kills it with
//! SIGKILL once it has seen acks for a while, reopens the dir and checks that every acked
//! seq is in the log and the own mark is at or past the last ack.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tandem::store::{Committer, RocksLog};
use tandem_replicator::log::conformance::reg;
use tandem_replicator::log::EventLog;

const CHILD_ENV: &str = "TANDEM_CRASH_CHILD";
const DC: &str = "dc-crash";
/// Acks the parent waits for before it starts the kill countdown.
const ACKS_BEFORE_KILL: usize = 50;
/// How long the child keeps appending after that before the SIGKILL.
const RUN_BEFORE_KILL: Duration = Duration::from_millis(300);
/// Bounds every wait, so a broken child fails the test instead of hanging it.
const WAIT_MAX: Duration = Duration::from_secs(60);

/// Kills the child when the parent test fails before doing so itself.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn acked_events_survive_kill_9_mid_group_commit() {
    let dir = tempfile::TempDir::new().unwrap();
    let exe = std::env::current_exe().unwrap();
    let child = Command::new(exe)
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let stdout = child.0.stdout.take().unwrap();

    // Only whole lines count: a line cut by the kill was never a complete ack.
    let (ack_tx, ack_rx) = mpsc::channel::<u64>();
    let reader = std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            match lines.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let Some(seq) = line.strip_suffix('\n').and_then(|l| l.strip_prefix("ACK ")) else {
                continue;
            };
            if ack_tx.send(seq.parse().unwrap()).is_err() {
                break;
            }
        }
    });

    let mut acked = BTreeSet::new();
    let started = Instant::now();
    while acked.len() < ACKS_BEFORE_KILL {
        let left = WAIT_MAX.checked_sub(started.elapsed()).expect("the child never acked enough events");
        acked.insert(ack_rx.recv_timeout(left).expect("the child stopped before acking enough events"));
    }
    let kill_at = Instant::now() + RUN_BEFORE_KILL;
    while let Some(left) = kill_at.checked_duration_since(Instant::now()) {
        match ack_rx.recv_timeout(left) {
            Ok(seq) => {
                acked.insert(seq);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => break,
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the child exited before the kill"),
        }
    }
    // std's Child::kill is SIGKILL on Unix: no destructor, no flush, no orderly close.
    child.0.kill().unwrap();
    let status = child.0.wait().unwrap();
    assert!(!status.success(), "the child must die by the signal, not exit");
    reader.join().unwrap();
    acked.extend(ack_rx.try_iter());

    let log = RocksLog::open(dir.path(), DC).unwrap();
    let last_acked = *acked.last().unwrap();
    let own = log.own_mark();
    assert!(own.seq >= last_acked, "own seq {} is behind the last ack {last_acked}", own.seq);
    let logged = log.read_own(0, usize::MAX).unwrap();
    // The log is gapless from 1 and every acked seq is in it.
    let logged_seqs: Vec<u64> = logged.iter().map(|e| e.seq).collect();
    assert_eq!(logged_seqs, (1..=own.seq).collect::<Vec<u64>>());
    let missing: Vec<&u64> = acked.iter().filter(|s| **s > own.seq).collect();
    assert!(missing.is_empty(), "acked but lost: {missing:?}");
    assert_eq!(log.instances().unwrap().len() as u64, own.seq);
    eprintln!("crash test: {} acks seen, {} events durable after kill -9", acked.len(), own.seq);
}

/// The child side; does nothing unless started by the test above.
#[test]
fn crash_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    run_child(Path::new(&dir));
}

fn run_child(dir: &Path) {
    const TASKS: usize = 16;
    let log = RocksLog::open(dir, DC).unwrap();
    let handle = Committer::spawn(log, Box::new(|_| {})).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let deadline = tokio::time::Instant::now() + WAIT_MAX;
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let h = handle.clone();
            tasks.push(tokio::spawn(async move {
                let mut i = 0u64;
                // Ends by itself only if the parent never kills it.
                while tokio::time::Instant::now() < deadline {
                    let id = format!("t{t}-{i}");
                    let evs = h.append_local(move |m| vec![reg(DC, m.epoch, m.seq + 1, &id)]).await.unwrap();
                    let mut out = std::io::stdout().lock();
                    for ev in evs {
                        writeln!(out, "ACK {}", ev.seq).unwrap();
                    }
                    out.flush().unwrap();
                    i += 1;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}
