//! What the benchmark knows about the machine and the process: the machine line, the
//! commit, the build profile, CPU time per thread group, RSS, and core pinning.
//!
//! Everything here reads `/proc` or runs `git`/`uname`; nothing here measures load.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The cargo profile this binary was built with (`debug` for the dev profile, `release`).
/// tandem's benches run in the dev profile (docs/benchmarks.md, "Why the figures come from a
/// dev-profile build"): every crate at opt-level 2, RocksDB's C++ and lz4's C at -O3 (their
/// build scripts' graph at opt-level 0), no debug assertions or overflow checks (root
/// Cargo.toml).
pub const PROFILE: &str = if is_release() { "release" } else { "debug" };

/// What the build running this binary is, for the headers and notes of a report.
pub const BUILD: &str = if is_release() {
    "cargo release profile: opt-level 3 for every crate, RocksDB included; no debug assertions"
} else {
    "cargo dev profile: opt-level 2 for every crate, RocksDB's C++ and lz4's C at -O3 \
     (librocksdb-sys and lz4-sys opt-level 3); no debug assertions or overflow checks; root Cargo.toml"
};

const fn is_release() -> bool {
    matches!(tandem::BUILD_PROFILE.as_bytes(), b"release")
}

/// Each CPU's steal time so far (`/proc/stat`: time the hypervisor ran something else
/// while this virtual CPU had work), in ms at the kernel's 10 ms accounting; empty when
/// not readable. A step's difference says how much of its latency tail the machine's host
/// took: a stall on every CPU at once is steal, not the process.
pub fn steal_ms() -> Vec<u64> {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .filter_map(|l| l.split_whitespace().nth(8)?.parse::<u64>().ok())
        .map(|jiffies| jiffies * 10)
        .collect()
}

/// Prefix of the load generator's thread names; every other thread of the process except
/// the main thread belongs to the server side.
pub const LOAD_THREAD: &str = "bench-load";
/// Thread name of the in-process server runtime.
pub const SERVER_THREAD: &str = "tandem-srv";

/// `CPU model, N cores, kernel, RAM`.
pub fn machine_line() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let mhz = cpuinfo
        .lines()
        .find(|l| l.starts_with("cpu MHz"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| format!(" @ {:.0} MHz", v.trim().parse::<f64>().unwrap_or(0.0)))
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let ram_kib: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let kernel = run("uname", &["-srm"]).unwrap_or_else(|| "unknown kernel".into());
    format!("{model}{mhz}, {cores} cores, {kernel}, {:.1} GiB RAM", ram_kib as f64 / 1024.0 / 1024.0)
}

/// Short hash of HEAD, with `+dirty` when the work tree has changes.
pub fn git_commit() -> String {
    let hash = run("git", &["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = run("git", &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{hash}+dirty")
    } else {
        hash
    }
}

/// The file system and device holding `dir` (`df` output), for the fsync floor's label.
pub fn disk_of(dir: &Path) -> String {
    run("df", &["--output=source,fstype", &dir.to_string_lossy()])
        .and_then(|s| s.lines().nth(1).map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")))
        .unwrap_or_else(|| "unknown".into())
}

fn run(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Pins the calling thread to one CPU. Returns false when the kernel refused.
#[allow(unsafe_code)]
pub fn pin_current_thread(cpu: usize) -> bool {
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: `set` is a plain bitset owned by this frame; CPU_ZERO/CPU_SET only write
    // inside it (cpu < CPU_SETSIZE was checked), and sched_setaffinity(0, ..) reads it and
    // changes only the calling thread's affinity.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// CPU time of this process split into (server side, load generator).
///
/// The load generator's threads (named [`LOAD_THREAD`]...) are summed from
/// `/proc/self/task/*`; the server side is the whole process (`/proc/self/stat`, which keeps
/// the time of threads that have exited) minus the load generator and the main thread
/// (which only orchestrates). Resolution: 10 ms for the process total.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSplit {
    pub server: Duration,
    pub load: Duration,
}

impl CpuSplit {
    pub fn now() -> CpuSplit {
        let pid = std::process::id().to_string();
        let total =
            std::fs::read_to_string("/proc/self/stat").ok().and_then(|s| stat_cpu(&s)).unwrap_or_default();
        let mut load = Duration::ZERO;
        let mut main = Duration::ZERO;
        if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
            for e in dir.flatten() {
                let tid = e.file_name().to_string_lossy().into_owned();
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                if tid == pid {
                    main = thread_cpu(&e.path()).unwrap_or_default();
                } else if comm.trim().starts_with(LOAD_THREAD) {
                    load += thread_cpu(&e.path()).unwrap_or_default();
                }
            }
        }
        CpuSplit { server: total.saturating_sub(load + main), load }
    }

    pub fn since(self, before: CpuSplit) -> CpuSplit {
        CpuSplit {
            server: self.server.saturating_sub(before.server),
            load: self.load.saturating_sub(before.load),
        }
    }
}

/// On-CPU time of this process's server-side threads so far, summed by thread name (the
/// runtime's workers, the committer, RocksDB's background threads...), without the load
/// generator's and the main thread. A thread that exits in between takes its time with it.
pub fn server_threads_cpu() -> std::collections::BTreeMap<String, Duration> {
    let pid = std::process::id().to_string();
    let mut by_name = std::collections::BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let name = comm.trim();
        if e.file_name().to_string_lossy() == pid || name.starts_with(LOAD_THREAD) {
            continue;
        }
        *by_name.entry(name.to_owned()).or_default() += thread_cpu(&e.path()).unwrap_or_default();
    }
    by_name
}

/// On-CPU time of the calling thread so far. A load thread that exits before a step's last
/// [`CpuSplit::now`] reads it at its end: `/proc/self/stat` then keeps its time, which the
/// split would count as the server's.
pub fn this_thread_cpu() -> Duration {
    thread_cpu(Path::new("/proc/thread-self")).unwrap_or_default()
}

/// On-CPU time of one task: `schedstat` (ns) when the kernel has it, else `stat` ticks.
fn thread_cpu(task: &Path) -> Option<Duration> {
    if let Ok(s) = std::fs::read_to_string(task.join("schedstat")) {
        if let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()) {
            return Some(Duration::from_nanos(ns));
        }
    }
    stat_cpu(&std::fs::read_to_string(task.join("stat")).ok()?)
}

/// utime + stime of a `/proc/<pid>/stat` line (USER_HZ = 100 on Linux).
fn stat_cpu(stat: &str) -> Option<Duration> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// CPU time (user + system) of another process and all its threads.
pub fn process_cpu(pid: u32) -> Option<Duration> {
    stat_cpu(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Sends SIGINT to process `pid` (a child this process started, e.g. `perf stat`, which
/// then writes its counts and exits).
#[allow(unsafe_code)]
pub fn interrupt(pid: u32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) takes two integers and touches no memory of this process.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
}

/// Sends SIGTERM to process `pid` (a server child this process started, which then stops
/// gracefully: `roll`).
#[allow(unsafe_code)]
pub fn terminate(pid: u32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) takes two integers and touches no memory of this process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
}

/// How long a memory step waits between closing its loading connections and reading a
/// server's RSS (tandem gives freed heap back within 500 ms of a burst of closes, and hands
/// a quiet log's memtables to table files within 1.25 s of its last write, trimming 250 ms
/// later; every server gets the same wait).
pub const SETTLE_BEFORE_RSS: std::time::Duration = std::time::Duration::from_millis(3000);

/// Resident set size of a process, bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = s.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_reads_utime_and_stime_after_the_command_name() {
        let line = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 1 0 100 0 0";
        assert_eq!(stat_cpu(line), Some(Duration::from_millis(2000)));
    }
}
