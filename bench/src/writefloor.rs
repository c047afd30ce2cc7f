//! The per-watcher write floor (issue 21, the bound under M4): one pre-encoded line written
//! to each of N idle TCP connections, one `write` system call each, by a separate process
//! pinned to the server's core (`serve-write-floor`, this binary), read by N tasks on the
//! load core the way the HTTP/1.1 stream watchers read. Reported in the watch table, beside
//! tandem's fan-out: what the kernel's loopback TCP path alone costs per change.

use std::io::{BufRead as _, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::AsyncReadExt as _;

use crate::load::{ms, rate, Lat};
use crate::probe::Child;
use crate::Ctx;

/// Bytes of the line written per change (about tandem's answer line for the watched service
/// of 4 instances).
pub const LINE_BYTES: usize = 1024;
/// Changes written.
const ROUNDS: usize = 20;
/// Pause between two changes once every watcher has read the previous one.
const GAP: Duration = Duration::from_millis(100);

/// `serve-write-floor`: accepts `n` connections on 127.0.0.1 (prints `addr=ADDR`, then
/// `ready`), then for each line on stdin writes one line of `LINE_BYTES` to every connection
/// and prints `done WALL_NS CPU_NS` (this thread's CPU time for the loop). Stops on stdin EOF,
/// at most after 10 minutes.
pub fn serve(n: usize) -> anyhow::Result<()> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    println!("addr={}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut conns = Vec::with_capacity(n);
    listener.set_nonblocking(true)?;
    while conns.len() < n {
        anyhow::ensure!(Instant::now() < deadline, "only {} of {n} connections arrived", conns.len());
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                s.set_nodelay(true)?;
                conns.push(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => return Err(e.into()),
        }
    }
    println!("ready");
    std::io::stdout().flush()?;
    let mut line = vec![b'x'; LINE_BYTES];
    line[LINE_BYTES - 1] = b'\n';
    let stop = Instant::now() + Duration::from_secs(600);
    let mut cmd = String::new();
    while Instant::now() < stop {
        cmd.clear();
        if std::io::stdin().lock().read_line(&mut cmd)? == 0 {
            break;
        }
        let (t, c) = (Instant::now(), thread_cpu_ns());
        for s in &mut conns {
            // A connection whose reader went away is skipped; the parent counts the miss.
            let _ = s.write_all(&line);
        }
        println!("done {} {}", t.elapsed().as_nanos(), thread_cpu_ns().saturating_sub(c));
        std::io::stdout().flush()?;
    }
    Ok(())
}

/// CPU time of the calling thread, ns.
#[allow(unsafe_code)]
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec it is given, which lives on this stack.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// Adds the floor's row to the watch table (the last table of the report).
pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let n = ctx.opts.watchers.clamp(1, crate::watch::WATCHERS_MAX);
    let exe = std::env::current_exe()?;
    let mut cmd = if ctx.pin {
        let mut c = std::process::Command::new("taskset");
        c.arg("-c").arg("0").arg(exe);
        c
    } else {
        std::process::Command::new(exe)
    };
    cmd.arg("serve-write-floor")
        .arg("--watchers")
        .arg(n.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    let mut child = Child::new(cmd.spawn()?);
    let mut stdin = child.stdin().ok_or_else(|| anyhow::anyhow!("no stdin"))?;
    let stdout = child.stdout().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(stdout).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let wait_line =
        |within: Duration| rx.recv_timeout(within).map_err(|e| anyhow::anyhow!("write floor: {e}"));
    let addr = wait_line(Duration::from_secs(30))?;
    let addr =
        addr.strip_prefix("addr=").ok_or_else(|| anyhow::anyhow!("write floor said {addr:?}"))?.to_owned();
    // Readers on the load core: each notes when it has read every whole line.
    let reads: Arc<Vec<Mutex<Vec<Instant>>>> = Arc::new((0..n).map(|_| Mutex::new(Vec::new())).collect());
    let delivered: Arc<Vec<AtomicU64>> = Arc::new((0..ROUNDS).map(|_| AtomicU64::new(0)).collect());
    let errors = Arc::new(AtomicU64::new(0));
    let (r2, d2, e2, a2) = (reads.clone(), delivered.clone(), errors.clone(), addr.clone());
    let readers = ctx
        .on_load(async move {
            let sem = Arc::new(tokio::sync::Semaphore::new(256));
            let mut tasks = Vec::with_capacity(n);
            for i in 0..n {
                let (reads, delivered, errors, addr, sem) =
                    (r2.clone(), d2.clone(), e2.clone(), a2.clone(), sem.clone());
                tasks.push(tokio::spawn(async move {
                    let permit = sem.acquire_owned().await;
                    let conn = tokio::net::TcpStream::connect(&addr).await;
                    drop(permit);
                    let Ok(mut conn) = conn else {
                        errors.fetch_add(1, Ordering::Relaxed);
                        return;
                    };
                    let mut buf = vec![0u8; 8192];
                    let mut total = 0usize;
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
                    while total < ROUNDS * LINE_BYTES {
                        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
                            Ok(Ok(k)) if k > 0 => {
                                let before = total / LINE_BYTES;
                                total += k;
                                let now = Instant::now();
                                for r in before..(total / LINE_BYTES).min(ROUNDS) {
                                    reads[i].lock().push(now);
                                    delivered[r].fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            _ => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                return;
                            }
                        }
                    }
                }));
            }
            tasks
        })
        .await?;
    let ready = wait_line(Duration::from_secs(150))?;
    anyhow::ensure!(ready == "ready", "write floor said {ready:?}");
    let cpu0 = crate::sys::CpuSplit::now();
    let (mut starts, mut loop_wall, mut loop_cpu) = (Vec::new(), Lat::default(), Duration::ZERO);
    let t0 = Instant::now();
    for r in 0..ROUNDS {
        let t = Instant::now();
        writeln!(stdin, "w")?;
        stdin.flush()?;
        starts.push(t);
        let done = wait_line(Duration::from_secs(30))?;
        let mut f = done.split_whitespace().skip(1).map(|v| v.parse::<u64>().unwrap_or(0));
        loop_wall.push(Duration::from_nanos(f.next().unwrap_or(0)));
        loop_cpu += Duration::from_nanos(f.next().unwrap_or(0));
        let deadline = Instant::now() + Duration::from_secs(10);
        while delivered[r].load(Ordering::Relaxed) + errors.load(Ordering::Relaxed) < n as u64
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(GAP).await;
    }
    let elapsed = t0.elapsed();
    let load_cpu = crate::sys::CpuSplit::now().since(cpu0).load;
    drop(stdin);
    drop(child);
    for t in readers {
        t.abort();
    }
    let (mut last, mut each, mut missed) = (Lat::default(), Lat::default(), 0u64);
    for (r, start) in starts.iter().enumerate() {
        let mut latest = Duration::ZERO;
        let mut complete = true;
        for rd in reads.iter() {
            match rd.lock().get(r) {
                Some(t) => {
                    let d = t.saturating_duration_since(*start);
                    each.push(d);
                    latest = latest.max(d);
                }
                None => {
                    missed += 1;
                    complete = false;
                }
            }
        }
        if complete {
            last.push(latest);
        }
    }
    let (last, each, loop_wall) = (last.finish(), each.finish(), loop_wall.finish());
    let cpu_per_change = loop_cpu.as_secs_f64() / ROUNDS as f64;
    ctx.report.row(vec![
        format!("floor: one pre-encoded {LINE_BYTES}-byte line written to each idle TCP connection (a write() each)"),
        format!("{} ({} connected)", rate(n as f64), rate(n as f64 - errors.load(Ordering::Relaxed) as f64)),
        format!("{ROUNDS} (as soon as the last was read, + {} ms)", GAP.as_millis()),
        format!("{} / {} / {}", ms(last.q_ms(0.5)), ms(last.q_ms(0.99)), ms(last.max_ms())),
        each.summary(),
        format!("{} ({missed})", rate(each.count() as f64)),
        format!("{cpu_per_change:.3}"),
        format!(
            "{:.2} / {:.2}",
            loop_cpu.as_secs_f64() / elapsed.as_secs_f64(),
            load_cpu.as_secs_f64() / elapsed.as_secs_f64()
        ),
        format!("{} reader", errors.load(Ordering::Relaxed)),
    ]);
    ctx.report.note(format!(
        "write floor: a separate process (this binary, serve-write-floor) on CPU 0 writes one {LINE_BYTES}-byte line \
         to each of {} connections per change, one write() each, blocking sockets; its loop took {} / {} ms (p50 / \
         p99) of wall time and {:.3} s of its thread's CPU per change; latency counts from the parent's command on a \
         pipe (tens of us) to each reader (tokio tasks on CPU 1, one read and a count per delivery) having the line",
        rate(n as f64),
        ms(loop_wall.q_ms(0.5)),
        ms(loop_wall.q_ms(0.99)),
        cpu_per_change
    ));
    ctx.floors.write_floor = Some((n, last.q_ms(0.99), cpu_per_change));
    Ok(())
}
