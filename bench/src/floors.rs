//! The machine's floors, measured in the same run as tandem: fsync latency of the data disk,
//! RocksDB synced batched writes at tandem's event size, and one quinn stream on loopback
//! with the replication link's TLS configuration.

use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tandem_replicator::tls::{self, TlsMaterial, TlsPaths};
use tandem_schemas::{ChangeEvent, Health, InstanceKey, InstanceRecord, Op, Status};

use crate::load::{ms, rate, Lat};
use crate::Ctx;

/// Bytes per frame of the quinn stream floor (about one replicated event).
pub const FRAME_BYTES: usize = 200;
/// Frames per write on the quinn stream floor.
const FRAMES_PER_WRITE: usize = 64;

pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let dir = ctx.tempdir("tandem-bench-floors")?;
    let step = ctx.step().min(Duration::from_secs(4));

    ctx.report.table(
        "floor: write 4 KiB + fdatasync on the data disk, one thread",
        &["pattern", "syncs/s", "latency ms p50 / p99 / p999 / max", "samples"],
    );
    for append in [false, true] {
        let path = dir.path().join(if append { "append.probe" } else { "overwrite.probe" });
        let lat = tokio::task::spawn_blocking(move || fsync_probe(&path, append, step)).await??;
        if !append {
            ctx.floors.fsync_p99_ms = Some(lat.q_ms(0.99));
            ctx.floors.fsync_p50_ms = Some(lat.q_ms(0.5));
        }
        ctx.report.row(vec![
            if append { "append (file grows, like a WAL)".into() } else { "overwrite one block".into() },
            rate(lat.count() as f64 / step.as_secs_f64()),
            lat.summary(),
            lat.count().to_string(),
        ]);
    }

    let ev_bytes = tandem_schemas::encode_event(&sample_event()).len();
    ctx.report.table(
        "floor: RocksDB WriteBatch with sync=true, one writer, one column family",
        &["puts per batch", "value bytes", "batches/s", "puts/s", "batch latency ms p50 / p99 / max"],
    );
    let rdir = dir.path().join("rocksdb");
    let rows = tokio::task::spawn_blocking(move || rocksdb_probe(&rdir, ev_bytes, step)).await??;
    for (batch, lat) in rows {
        let per_s = lat.count() as f64 / step.as_secs_f64();
        if batch == 64 {
            ctx.floors.rocksdb_batch64_puts_per_s = Some(per_s * 64.0);
        }
        ctx.report.row(vec![
            batch.to_string(),
            ev_bytes.to_string(),
            rate(per_s),
            rate(per_s * batch as f64),
            format!("{} / {} / {}", ms(lat.q_ms(0.5)), ms(lat.q_ms(0.99)), ms(lat.max_ms())),
        ]);
    }
    ctx.report.note(format!(
        "value = one encoded REGISTER ChangeEvent as tandem writes it to its log ({ev_bytes} bytes); \
         tandem's own write also updates state and marks in the same batch"
    ));

    let pki = tls::generate_dev_pki(&dir.path().join("certs"), &["dc-a", "dc-b"], false)?;
    let a = pki.paths("dc-a").context("dc-a paths")?.clone();
    let b = pki.paths("dc-b").context("dc-b paths")?.clone();
    quinn_floor(ctx, &a, &b, step).await?;
    Ok(())
}

/// A REGISTER event of the shape the benchmarks register.
pub fn sample_event() -> ChangeEvent {
    ChangeEvent {
        event_id: uuid::Uuid::now_v7(),
        origin_dc: "dc-a".into(),
        origin_epoch: 1,
        seq: 123_456,
        commit_time_ms: 1_700_000_000_000,
        op: Op::Register(InstanceRecord {
            key: InstanceKey {
                owner_dc: "dc-a".into(),
                namespace: "default".into(),
                service: "svc-123".into(),
                instance_id: "s2-i123456".into(),
            },
            address: "10.20.30.40".into(),
            port: 8080,
            zone: "zone-a".into(),
            weight: 100,
            app_version: "1.4.2".into(),
            tags: Vec::new(),
            metadata: Default::default(),
            persistent: false,
            lease_ttl_ms: 30_000,
            status: Status::Up,
            health: Health::Healthy,
            damped: false,
        }),
    }
}

/// Writes 4 KiB and fdatasyncs, back to back, for `dur` (at most 100,000 times).
fn fsync_probe(path: &Path, append: bool, dur: Duration) -> anyhow::Result<Lat> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let buf = vec![0x5au8; 4096];
    let mut lat = Lat::default();
    let deadline = Instant::now() + dur;
    for _ in 0..100_000 {
        if Instant::now() >= deadline {
            break;
        }
        let t = Instant::now();
        if append {
            f.write_all(&buf)?;
        } else {
            f.write_all_at(&buf, 0)?;
        }
        f.sync_data()?;
        lat.push(t.elapsed());
    }
    let _ = std::fs::remove_file(path);
    Ok(lat.finish())
}

/// Synced batches of 1, 64 and 512 puts of `value_bytes`, each for a third of `dur`.
fn rocksdb_probe(dir: &Path, value_bytes: usize, dur: Duration) -> anyhow::Result<Vec<(usize, Lat)>> {
    let db = rocksdb::DB::open_default(dir).context("cannot open the probe RocksDB")?;
    let mut opts = rocksdb::WriteOptions::default();
    opts.set_sync(true);
    let value = vec![0xa5u8; value_bytes];
    let mut key = 0u64;
    let mut out = Vec::new();
    for batch_puts in [1usize, 64, 512] {
        let mut lat = Lat::default();
        let deadline = Instant::now() + dur / 3;
        for _ in 0..100_000 {
            if Instant::now() >= deadline {
                break;
            }
            let mut batch = rocksdb::WriteBatch::default();
            for _ in 0..batch_puts {
                key += 1;
                batch.put(key.to_be_bytes(), &value);
            }
            let t = Instant::now();
            db.write_opt(batch, &opts).context("probe write")?;
            lat.push(t.elapsed());
        }
        let lat = lat.finish();
        // Rescale: rows report per-second rates over a third of the step.
        out.push((batch_puts, rescale(lat, 3)));
    }
    drop(db);
    let _ = std::fs::remove_dir_all(dir);
    Ok(out)
}

/// Repeats every sample `k` times so that `count / step` is the rate over `step / k`.
fn rescale(lat: Lat, k: usize) -> Lat {
    let mut out = Lat::default();
    for _ in 0..k {
        out.extend(lat.clone());
    }
    out.finish()
}

/// Bytes and frames per second through one quinn bi stream, loopback, mutual TLS with the
/// replication link's configs: the server end on the server runtime, the client on the load
/// runtime. Returns (MB/s, frames/s).
pub async fn quinn_stream(
    ctx: &Ctx,
    a: &TlsPaths,
    b: &TlsPaths,
    dur: Duration,
) -> anyhow::Result<(f64, f64)> {
    let ma = TlsMaterial::load(a)?;
    let mb = TlsMaterial::load(b)?;
    let alpn = tandem_replicator::gateway::ALPN;
    let server_cfg = tls::server_config(&mb, alpn)?;
    let client_cfg = tls::client_config(&ma, alpn)?;
    let server = ctx
        .srv
        .spawn(async move { quinn::Endpoint::server(server_cfg, "127.0.0.1:0".parse().expect("constant")) })
        .await??;
    let addr = server.local_addr()?;
    let reader = ctx.srv.spawn(async move {
        let incoming = tokio::time::timeout(Duration::from_secs(10), server.accept())
            .await
            .context("no connection")?
            .context("endpoint closed")?;
        let conn = incoming.await?;
        let (_send, mut recv) = conn.accept_bi().await?;
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        let mut first: Option<Instant> = None;
        loop {
            let Some(n) = recv.read(&mut buf).await? else { break };
            first.get_or_insert_with(Instant::now);
            total += n as u64;
        }
        let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
        conn.close(0u32.into(), b"done");
        server.wait_idle().await;
        anyhow::Ok((total, secs))
    });
    let writer = ctx.load.spawn(async move {
        let client = quinn::Endpoint::client("127.0.0.1:0".parse().expect("constant"))?;
        let conn = client.connect_with(client_cfg, addr, "dc-b")?.await?;
        let (mut send, _recv) = conn.open_bi().await?;
        let chunk = vec![0x42u8; FRAME_BYTES * FRAMES_PER_WRITE];
        let deadline = Instant::now() + dur;
        // Bounded by the deadline and by a byte cap (64 GiB).
        let mut sent = 0u64;
        while Instant::now() < deadline && sent < 64 << 30 {
            send.write_all(&chunk).await?;
            sent += chunk.len() as u64;
        }
        send.finish()?;
        let _ = tokio::time::timeout(Duration::from_secs(10), send.stopped()).await;
        let _ = tokio::time::timeout(Duration::from_secs(10), conn.closed()).await;
        anyhow::Ok(sent)
    });
    let sent = writer.await??;
    let (received, secs) = reader.await??;
    anyhow::ensure!(received == sent, "quinn floor: sent {sent} bytes, received {received}");
    let secs = secs.max(1e-9);
    Ok((received as f64 / secs / 1e6, received as f64 / FRAME_BYTES as f64 / secs))
}

async fn quinn_floor(ctx: &mut Ctx, a: &TlsPaths, b: &TlsPaths, dur: Duration) -> anyhow::Result<()> {
    let (mbps, fps) = quinn_stream(ctx, a, b, dur).await?;
    ctx.report.table(
        "floor: one quinn bi stream on loopback, mutual TLS 1.3 (the replication link's configs)",
        &["write size", "MB/s", "200-byte frames/s"],
    );
    ctx.report.row(vec![
        format!("{} frames of {FRAME_BYTES} B", FRAMES_PER_WRITE),
        format!("{mbps:.1}"),
        rate(fps),
    ]);
    ctx.floors.quinn_frames_per_s = Some(fps);
    Ok(())
}
