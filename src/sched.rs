//! A scheduler hint for the node's request path: its runtime's threads and the committer
//! ask the kernel's fair scheduler (EEVDF, Linux 6.12 and later) for a short slice.
//!
//! A thread's slice is how long it may run before a thread woken on the same core gets
//! its turn. With the default slice (a few ms on a small machine), a registration whose
//! synced write just finished waits for the runtime's slice to end before the committer
//! answers it, and a request that just arrived waits for the committer's. A short slice
//! changes no thread's share of the CPU, only how soon a woken one runs: on the register
//! step's open loop at half of saturation (one core for the node) the p99 fell by a third
//! (docs/benchmarks.md, issue 21's twenty-third round).
//!
//! Only the calling thread changes, and only when it runs under the normal policy
//! (`SCHED_OTHER`): its nice value is kept. An older kernel takes the request and keeps its
//! own slice ([`Slice::Unsupported`]). `TANDEM_SCHED_SLICE_US` sets the slice in
//! microseconds (`0` leaves the kernel's default); `tandem` refuses to start with a value
//! out of the kernel's bounds.

use std::sync::OnceLock;

/// The slice asked for by default, microseconds: the kernel's shortest.
pub const SLICE_US_DEFAULT: u64 = 100;
/// The kernel's bounds of a requested slice, microseconds (0.1 ms to 100 ms).
pub const SLICE_US_MIN: u64 = 100;
pub const SLICE_US_MAX: u64 = 100_000;
/// Environment variable that sets the slice, microseconds; `0` turns the hint off.
pub const SLICE_ENV: &str = "TANDEM_SCHED_SLICE_US";

/// What a thread's request for a slice came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Slice {
    /// The thread runs with this slice, microseconds (read back from the kernel).
    Set(u64),
    /// `TANDEM_SCHED_SLICE_US=0`: nothing asked.
    Off,
    /// The thread does not run under the normal policy (an operator's real-time policy
    /// is left alone).
    NotNormal,
    /// The kernel took the request and kept its own slice (before Linux 6.12), or this is
    /// not Linux.
    Unsupported,
    /// The kernel refused the request.
    Refused(String),
}

/// The slice `TANDEM_SCHED_SLICE_US` asks for (`None`: off), or why its value is refused.
pub fn parse_slice_us(value: Option<&str>) -> Result<Option<u64>, String> {
    let Some(v) = value else { return Ok(Some(SLICE_US_DEFAULT)) };
    let us: u64 =
        v.trim().parse().map_err(|_| format!("{SLICE_ENV}={v:?}: not a whole number of microseconds"))?;
    match us {
        0 => Ok(None),
        SLICE_US_MIN..=SLICE_US_MAX => Ok(Some(us)),
        _ => Err(format!(
            "{SLICE_ENV}={us}: out of the kernel's bounds, {SLICE_US_MIN}..={SLICE_US_MAX} us (0 turns the hint off)"
        )),
    }
}

/// The slice of this process, from its environment once (a value out of bounds reads as
/// the default here; `tandem`'s start refuses it first, see [`check_env`]).
fn configured() -> Option<u64> {
    static SLICE: OnceLock<Option<u64>> = OnceLock::new();
    *SLICE.get_or_init(|| {
        parse_slice_us(std::env::var(SLICE_ENV).ok().as_deref()).unwrap_or(Some(SLICE_US_DEFAULT))
    })
}

/// Whether `TANDEM_SCHED_SLICE_US` holds a value this process takes.
pub fn check_env() -> Result<(), String> {
    parse_slice_us(std::env::var(SLICE_ENV).ok().as_deref()).map(|_| ())
}

/// What the first request-path thread of this process got (for the node's start log).
pub fn first_outcome() -> Option<&'static Slice> {
    FIRST.get()
}

static FIRST: OnceLock<Slice> = OnceLock::new();

/// Asks for the configured slice for the calling thread (a runtime worker, the
/// committer). Never fails the caller: the outcome says what happened.
pub fn request_latency_slice() -> Slice {
    let outcome = match configured() {
        None => Slice::Off,
        Some(us) => request_slice(us),
    };
    let _ = FIRST.set(outcome.clone());
    outcome
}

/// `struct sched_attr` of `sched_setattr(2)`, as the kernel reads it (the first 56 bytes,
/// `SCHED_ATTR_SIZE_VER1`).
#[cfg(target_os = "linux")]
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn sched_attr(set: Option<&SchedAttr>) -> Result<SchedAttr, std::io::Error> {
    let size = std::mem::size_of::<SchedAttr>() as u32;
    let mut attr = SchedAttr::default();
    // SAFETY: both calls get a pointer to a live `SchedAttr` of `size` bytes, laid out as
    // the kernel's `struct sched_attr` (VER1), for the calling thread (pid 0); the kernel
    // reads or writes only within it.
    let rc = unsafe {
        match set {
            Some(a) => libc::syscall(libc::SYS_sched_setattr, 0, a as *const SchedAttr, 0u32),
            None => libc::syscall(libc::SYS_sched_getattr, 0, &mut attr as *mut SchedAttr, size, 0u32),
        }
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(attr)
}

#[cfg(target_os = "linux")]
fn request_slice(us: u64) -> Slice {
    const SCHED_OTHER: u32 = 0;
    let now = match sched_attr(None) {
        Ok(a) => a,
        Err(e) => return Slice::Refused(format!("sched_getattr: {e}")),
    };
    if now.policy != SCHED_OTHER {
        return Slice::NotNormal;
    }
    let want = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: SCHED_OTHER,
        nice: now.nice,
        runtime: us * 1_000,
        ..SchedAttr::default()
    };
    if let Err(e) = sched_attr(Some(&want)) {
        return Slice::Refused(format!("sched_setattr: {e}"));
    }
    match sched_attr(None) {
        Ok(a) if a.runtime == us * 1_000 => Slice::Set(us),
        Ok(_) => Slice::Unsupported,
        Err(e) => Slice::Refused(format!("sched_getattr: {e}")),
    }
}

#[cfg(not(target_os = "linux"))]
fn request_slice(_us: u64) -> Slice {
    Slice::Unsupported
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slice_is_the_default_unless_set_and_out_of_bounds_values_are_refused() {
        assert_eq!(parse_slice_us(None), Ok(Some(SLICE_US_DEFAULT)));
        assert_eq!(parse_slice_us(Some("0")), Ok(None));
        assert_eq!(parse_slice_us(Some(" 250 ")), Ok(Some(250)));
        assert_eq!(parse_slice_us(Some("100000")), Ok(Some(100_000)));
        for bad in ["99", "100001", "-1", "1ms", ""] {
            let e = parse_slice_us(Some(bad)).unwrap_err();
            assert!(e.starts_with(SLICE_ENV), "{bad}: {e}");
        }
    }

    /// The calling thread gets the slice and keeps its nice value; read back from the kernel.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_gets_the_slice_it_asks_for_and_keeps_its_nice_value() {
        std::thread::spawn(|| {
            // A thread an operator niced: it stays niced.
            let size = std::mem::size_of::<SchedAttr>() as u32;
            sched_attr(Some(&SchedAttr { size, nice: 3, ..SchedAttr::default() })).expect("nice 3");
            let before = sched_attr(None).expect("sched_getattr");
            assert_eq!(before.nice, 3);
            match request_slice(300) {
                Slice::Set(us) => assert_eq!(us, 300),
                Slice::Unsupported => {
                    eprintln!("SKIPPED: this kernel keeps its own slice (custom slices need Linux 6.12)");
                    return;
                }
                other => panic!("{other:?}"),
            }
            let after = sched_attr(None).expect("sched_getattr");
            assert_eq!((after.policy, after.nice), (before.policy, before.nice));
            assert_eq!(after.runtime, 300_000);
        })
        .join()
        .unwrap();
    }
}
