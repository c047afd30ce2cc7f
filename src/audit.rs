//! The audit log: one JSON line per state change (register, deregister, status, reload,
//! token creation, DC retirement) and per admin call, whatever its outcome, plus the
//! refusals (401, 403, 429) of every request, sampled. Each line holds the time, the DC,
//! the principal (a token's id, `anonymous` with ACLs off, `-` when none was
//! authenticated), the client address, the action, its target, the outcome, the HTTP status
//! and the error code. Never a secret: no header, no body, no query string; a token is
//! named by its public id only. Heartbeats are not audited (they change nothing on disk);
//! their refusals are, sampled, like every refusal.
//!
//! Lines go through a bounded queue to a writer thread, so a slow disk never holds a
//! request; a full queue drops the line and counts it. The writer takes every line queued
//! at once and writes them in one system call, then rests [`WRITE_PAUSE`]: lines queued
//! meanwhile wake nobody (under load, no thread wake-up and no write per line), and reach
//! the file at most that much later. Dropping the log (the node stopping) writes what is
//! queued before it returns (waiting 2 s at most). The file (`[audit] path`, default
//! `<data_dir>/audit.log`, mode 0600) is rotated by size: past `file_bytes_max` it becomes
//! `audit.log.1` (`.1` becomes `.2`, …), keeping at most `files_max` rotated files.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Lines waiting for the writer thread at most.
pub const QUEUE_LINES_MAX: usize = 4096;
/// How long the writer rests after writing what was queued (see the module docs).
pub const WRITE_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// `[audit]`. Fixed at start (a reload does not move the file).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct AuditSection {
    pub enabled: bool,
    /// The file; default `<data_dir>/audit.log`.
    pub path: Option<PathBuf>,
    /// Size past which the file is rotated.
    pub file_bytes_max: u64,
    /// Rotated files kept (`audit.log.1` … `audit.log.N`); older ones are deleted.
    pub files_max: u32,
    /// Refusal lines written per minute at most; the next line written says how many
    /// were left out (`suppressed`).
    pub refusals_per_minute: u32,
}

impl Default for AuditSection {
    fn default() -> Self {
        AuditSection {
            enabled: true,
            path: None,
            file_bytes_max: 64 << 20,
            files_max: 4,
            refusals_per_minute: 60,
        }
    }
}

impl AuditSection {
    pub fn path(&self, data_dir: &Path) -> PathBuf {
        self.path.clone().unwrap_or_else(|| data_dir.join("audit.log"))
    }

    pub fn validate(&self) -> Result<(), (String, String)> {
        if !(4096..=(1u64 << 40)).contains(&self.file_bytes_max) {
            return Err(("[audit] file_bytes_max".into(), "must be 4096..=2^40".into()));
        }
        if !(1..=1000).contains(&self.files_max) {
            return Err(("[audit] files_max".into(), "must be 1..=1000".into()));
        }
        if self.refusals_per_minute > 1_000_000 {
            return Err(("[audit] refusals_per_minute".into(), "must be 0..=1000000".into()));
        }
        Ok(())
    }
}

/// One audit line.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Record {
    /// UTC, RFC 3339 with milliseconds.
    pub time: String,
    pub dc: String,
    /// A token's id (never its secret), `anonymous` (ACLs off), `-` (not authenticated),
    /// `local` (the command line), `signal` (SIGHUP).
    pub principal: String,
    /// The client's IP address (`local` for the command line and signals).
    pub client: String,
    /// `register`, `deregister`, `status`, `reload`, `retire_dc`, `unretire_dc`,
    /// `token_create`, or `request` (any other request, audited when refused).
    pub action: String,
    /// What it acted on: `namespace/service/instance`, a DC, a token id, or
    /// `METHOD /path` (never the query string).
    pub target: String,
    /// `ok`, `refused` (401, 403, 429) or `failed` (any other error).
    pub outcome: String,
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Refusal lines left out by the sampling since the last one written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suppressed: Option<u64>,
}

/// The node's audit log.
pub struct Audit {
    tx: Option<SyncSender<Vec<u8>>>,
    /// The writer thread, joined when the log is dropped.
    writer: Option<std::thread::JoinHandle<()>>,
    dc: String,
    refusals_per_minute: u32,
    /// (window start, lines written in it, lines left out since the last written).
    sampling: Mutex<(Option<Instant>, u32, u64)>,
    pub written: std::sync::Arc<AtomicU64>,
    /// Lines dropped: the queue was full.
    pub dropped: AtomicU64,
    /// Refusal lines left out by the sampling.
    pub sampled_out: AtomicU64,
    /// Lines the writer could not write (disk full, I/O error).
    pub failed: std::sync::Arc<AtomicU64>,
}

impl std::fmt::Debug for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Audit").field("enabled", &self.tx.is_some()).finish_non_exhaustive()
    }
}

impl Audit {
    pub fn disabled() -> Audit {
        Audit {
            tx: None,
            writer: None,
            dc: String::new(),
            refusals_per_minute: 0,
            sampling: Mutex::new((None, 0, 0)),
            written: Default::default(),
            dropped: AtomicU64::new(0),
            sampled_out: AtomicU64::new(0),
            failed: Default::default(),
        }
    }

    /// Opens the file (created 0600) and starts the writer thread.
    pub fn start(cfg: &crate::config::Config) -> anyhow::Result<Audit> {
        let a = &cfg.audit;
        if !a.enabled {
            return Ok(Audit::disabled());
        }
        let path = a.path(&cfg.data_dir);
        let mut file = RotatingFile::open(path.clone(), a.file_bytes_max, a.files_max)
            .map_err(|e| anyhow::anyhow!("cannot open the audit log {}: {e}", path.display()))?;
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE_LINES_MAX);
        let mut audit = Audit::disabled();
        let (written, failed) = (audit.written.clone(), audit.failed.clone());
        let writer = std::thread::Builder::new().name("tandem-audit".into()).spawn(move || {
            let mut last_warn: Option<Instant> = None;
            let mut lines = Vec::new();
            while let Ok(line) = rx.recv() {
                lines.push(line);
                lines.extend(rx.try_iter().take(QUEUE_LINES_MAX));
                let n = lines.len() as u64;
                match file.append_lines(&lines) {
                    Ok(()) => written.fetch_add(n, Ordering::Relaxed),
                    Err(e) => {
                        if last_warn.is_none_or(|t| t.elapsed().as_secs() >= 10) {
                            last_warn = Some(Instant::now());
                            tracing::warn!(error = %e, file = %file.path.display(), "cannot write the audit log (sampled: one line per 10 s)");
                        }
                        failed.fetch_add(n, Ordering::Relaxed)
                    }
                };
                lines.clear();
                std::thread::sleep(WRITE_PAUSE);
            }
        })?;
        audit.writer = Some(writer);
        tracing::info!(file = %path.display(), "audit log");
        audit.tx = Some(tx);
        audit.dc = cfg.dc.clone();
        audit.refusals_per_minute = a.refusals_per_minute;
        Ok(audit)
    }

    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Records a state change or admin call (never sampled).
    pub fn record(&self, mut rec: Record) {
        let Some(tx) = &self.tx else { return };
        rec.dc.clone_from(&self.dc);
        rec.time = rfc3339_ms(tandem_replicator::gateway::wall_ms());
        let mut line = serde_json::to_vec(&rec).unwrap_or_default();
        line.push(b'\n');
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = tx.try_send(line) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a refusal, sampled: at most `refusals_per_minute` a minute.
    pub fn refusal(&self, mut rec: Record) {
        if self.tx.is_none() {
            return;
        }
        {
            let mut s = self.sampling.lock();
            let now = Instant::now();
            if s.0.is_none_or(|t| now.duration_since(t).as_secs() >= 60) {
                *s = (Some(now), 0, s.2);
            }
            if s.1 >= self.refusals_per_minute {
                s.2 += 1;
                self.sampled_out.fetch_add(1, Ordering::Relaxed);
                return;
            }
            s.1 += 1;
            rec.suppressed = Some(std::mem::take(&mut s.2)).filter(|n| *n > 0);
        }
        self.record(rec);
    }
}

/// How long dropping the log waits for the writer to write what is queued (a disk that
/// hangs must not hang the node's stop).
const DROP_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(2);

impl Drop for Audit {
    /// The writer writes what is queued and stops once the queue's sender is gone.
    fn drop(&mut self) {
        self.tx = None;
        let Some(writer) = self.writer.take() else { return };
        let deadline = Instant::now() + DROP_WAIT_MAX;
        while !writer.is_finished() && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if writer.is_finished() {
            let _ = writer.join();
        } else {
            tracing::warn!("the audit log's writer did not finish within 2 s; its queued lines may be lost");
        }
    }
}

/// Appends one line to the audit file of `cfg` from outside the node (the command line),
/// rotating like the node does.
pub fn append_local(cfg: &crate::config::Config, mut rec: Record) -> std::io::Result<()> {
    let a = &cfg.audit;
    if !a.enabled {
        return Ok(());
    }
    rec.dc.clone_from(&cfg.dc);
    rec.time = rfc3339_ms(tandem_replicator::gateway::wall_ms());
    let mut line = serde_json::to_vec(&rec).unwrap_or_default();
    line.push(b'\n');
    RotatingFile::open(a.path(&cfg.data_dir), a.file_bytes_max, a.files_max)?.append(&line)
}

/// An append-only file rotated by size.
struct RotatingFile {
    path: PathBuf,
    file: std::fs::File,
    size: u64,
    bytes_max: u64,
    files_max: u32,
}

impl RotatingFile {
    fn open(path: PathBuf, bytes_max: u64, files_max: u32) -> std::io::Result<RotatingFile> {
        let file = open_append(&path)?;
        let size = file.metadata()?.len();
        Ok(RotatingFile { path, file, size, bytes_max, files_max })
    }

    /// Writes `line` in one write (appends of whole lines never interleave).
    fn append(&mut self, line: &[u8]) -> std::io::Result<()> {
        self.append_lines(&[line])
    }

    /// Appends `lines` in as few writes as the rotation allows: one, unless the file
    /// reaches `bytes_max` among them (a line never straddles two files).
    fn append_lines(&mut self, lines: &[impl AsRef<[u8]>]) -> std::io::Result<()> {
        let mut out = Vec::with_capacity(lines.iter().map(|l| l.as_ref().len()).sum());
        for line in lines.iter().map(AsRef::as_ref) {
            let held = self.size + out.len() as u64;
            if held > 0 && held + line.len() as u64 > self.bytes_max {
                self.write_out(&mut out)?;
                self.rotate()?;
            }
            out.extend_from_slice(line);
        }
        self.write_out(&mut out)
    }

    fn write_out(&mut self, out: &mut Vec<u8>) -> std::io::Result<()> {
        if !out.is_empty() {
            self.file.write_all(out)?;
            self.size += out.len() as u64;
            out.clear();
        }
        Ok(())
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let nth = |n: u32| PathBuf::from(format!("{}.{n}", self.path.display()));
        let _ = std::fs::remove_file(nth(self.files_max));
        for n in (1..self.files_max).rev() {
            if nth(n).exists() {
                std::fs::rename(nth(n), nth(n + 1))?;
            }
        }
        std::fs::rename(&self.path, nth(1))?;
        self.file = open_append(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new().append(true).create(true).mode(0o600).open(path)
}

/// Unix ms as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn rfc3339_ms(ms: u64) -> String {
    let (secs, milli) = (ms / 1000, ms % 1000);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{milli:03}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339_ms(1_798_761_599_999), "2026-12-31T23:59:59.999Z");
    }

    #[test]
    fn the_file_rotates_by_size_and_keeps_a_bounded_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let mut f = RotatingFile::open(path.clone(), 100, 2).unwrap();
        for i in 0..20 {
            f.append(format!("{i:039}\n").as_bytes()).unwrap();
        }
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(&path).lines().count(), 2, "two 40-byte lines per 100-byte file");
        assert!(read(&path).contains(&format!("{:039}", 19)));
        assert!(read(&dir.path().join("audit.log.2")).contains(&format!("{:039}", 15)));
        assert!(!dir.path().join("audit.log.3").exists(), "at most files_max rotated files");
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn lines_written_together_rotate_as_lines_written_one_by_one() {
        let (one, all) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let lines: Vec<String> = (0..23).map(|i| format!("{i:0w$}\n", w = 20 + (i * 7) % 30)).collect();
        let mut f = RotatingFile::open(one.path().join("audit.log"), 100, 3).unwrap();
        for line in &lines {
            f.append(line.as_bytes()).unwrap();
        }
        let mut f = RotatingFile::open(all.path().join("audit.log"), 100, 3).unwrap();
        f.append_lines(&lines[..2]).unwrap();
        f.append_lines(&lines[2..]).unwrap();
        for name in ["audit.log", "audit.log.1", "audit.log.2", "audit.log.3"] {
            let read = |d: &Path| std::fs::read_to_string(d.join(name)).unwrap();
            assert_eq!(read(one.path()), read(all.path()), "{name}");
            assert!(read(all.path()).len() <= 100 || read(all.path()).lines().count() == 1, "{name}");
        }
    }

    #[test]
    fn queued_lines_are_in_the_file_once_the_log_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg =
            crate::config::Config::single("dc-a", dir.path().to_path_buf(), "127.0.0.1:0".parse().unwrap());
        cfg.audit.enabled = true;
        let audit = Audit::start(&cfg).unwrap();
        for i in 0..500 {
            audit.record(Record {
                action: "register".into(),
                target: format!("default/web/w{i}"),
                ..Record::default()
            });
        }
        let written = audit.written.clone();
        drop(audit);
        let text = std::fs::read_to_string(cfg.audit.path(&cfg.data_dir)).unwrap();
        assert_eq!(text.lines().count(), 500);
        assert_eq!(written.load(Ordering::Relaxed), 500);
        assert!(text.lines().last().unwrap().contains("default/web/w499"));
    }
}
