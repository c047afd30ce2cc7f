//! etcd 3.4 as a peer: a single member with WAL fsync on, spoken to through its gRPC-gateway
//! JSON API; register = lease grant + put, heartbeat = lease keep-alive, discover =
//! serializable prefix range.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::json;

use super::{b64, free_tcp, instance_value, measured, ok_json, row, spawn, wait_ready, PeerFigures, Proc};
use crate::load::{closed_loop, rate, OpResult};
use crate::sys::rss_bytes;
use crate::{cpu_now, Ctx};

/// Starts a single-member etcd (WAL fsync on) on loopback, pinned like tandem's server,
/// and waits until it answers. Returns the process, its client URL and its data dir.
pub(crate) async fn start_etcd(ctx: &Ctx, bin: &Path) -> anyhow::Result<(Proc, String, tempfile::TempDir)> {
    let dir = ctx.tempdir("tandem-bench-etcd")?;
    let (cp, pp) = (free_tcp()?, free_tcp()?);
    let client_url = format!("http://127.0.0.1:{cp}");
    let peer_url = format!("http://127.0.0.1:{pp}");
    let args: Vec<String> = vec![
        "--name".into(),
        "bench".into(),
        "--data-dir".into(),
        dir.path().join("data").to_string_lossy().into_owned(),
        "--listen-client-urls".into(),
        client_url.clone(),
        "--advertise-client-urls".into(),
        client_url.clone(),
        "--listen-peer-urls".into(),
        peer_url.clone(),
        "--initial-advertise-peer-urls".into(),
        peer_url.clone(),
        "--initial-cluster".into(),
        format!("bench={peer_url}"),
        "--log-level".into(),
        "error".into(),
        "--logger".into(),
        "zap".into(),
    ];
    let proc = spawn(ctx, "etcd", bin, &args, &[], &dir.path().join("etcd.log"))?;
    wait_ready(&ctx.http, &format!("{client_url}/health"), Duration::from_secs(20)).await?;
    Ok((proc, client_url, dir))
}

/// One registration at etcd, as `compare` (and `cluster`) measure it: a lease grant, then
/// a put of the instance's value with that lease. `tag` keeps the keys of steps apart.
pub(crate) async fn register_once(http: reqwest::Client, base: Arc<String>, tag: String, i: u64) -> OpResult {
    let g =
        ok_json(http.post(format!("{base}/v3/lease/grant")).json(&json!({"TTL": 30})).send().await).await?;
    let id = g["ID"].as_str().ok_or("grant without ID")?.to_owned();
    let (svc, inst) = (format!("svc-{}", i % 1000), format!("{tag}-i{i}"));
    let body = json!({"key": b64(format!("/services/{svc}/{inst}").as_bytes()),
                      "value": b64(instance_value(&svc, &inst).as_bytes()), "lease": id});
    ok_json(http.post(format!("{base}/v3/kv/put")).json(&body).send().await).await.map(|_| ())
}

pub(super) async fn etcd(ctx: &mut Ctx, bin: &Path) -> anyhow::Result<PeerFigures> {
    let (proc, client_url, _dir) = start_etcd(ctx, bin).await?;
    let version =
        ctx.http.get(format!("{client_url}/version")).send().await?.text().await.unwrap_or_default();
    ctx.report
        .note(format!("etcd {} (WAL fsync on, single member), JSON gateway at {client_url}", version.trim()));
    let base = Arc::new(client_url);
    let mut fig = PeerFigures { rss_bytes_empty: rss_bytes(proc.pid()), ..Default::default() };

    // register = lease grant + put with it.
    for c in [64usize, 256] {
        let (http, base) = (ctx.http.clone(), base.clone());
        let (run, cpu) = measured(
            &proc,
            ctx.on_load(closed_loop(c, ctx.step(), u64::MAX, cpu_now, move |i| {
                register_once(http.clone(), base.clone(), format!("c{c}"), i)
            })),
        )
        .await?;
        fig.register_best_per_s = Some(fig.register_best_per_s.unwrap_or(0.0).max(run.per_sec()));
        row(ctx, "etcd", "register = lease grant + put(lease)", c, &run, cpu);
    }

    // heartbeat = keep-alive on N leases.
    let n = ctx.opts.leases.max(1);
    let ids: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::with_capacity(n as usize)));
    {
        let (http, base, ids) = (ctx.http.clone(), base.clone(), ids.clone());
        let seeded = ctx
            .on_load(closed_loop(256, Duration::from_secs(300), n, cpu_now, move |_| {
                let (http, base, ids) = (http.clone(), base.clone(), ids.clone());
                async move {
                    let g = ok_json(
                        http.post(format!("{base}/v3/lease/grant")).json(&json!({"TTL": 300})).send().await,
                    )
                    .await?;
                    ids.lock().push(g["ID"].as_str().ok_or("grant without ID")?.to_owned());
                    Ok(())
                }
            }))
            .await?;
        anyhow::ensure!(
            seeded.ok == n,
            "etcd: granted {} of {n} leases: {:?}",
            seeded.ok,
            seeded.first_error
        );
    }
    let ids = Arc::new(std::mem::take(&mut *ids.lock()));
    {
        let (http, base, ids) = (ctx.http.clone(), base.clone(), ids.clone());
        let (run, cpu) = measured(
            &proc,
            ctx.on_load(closed_loop(64, ctx.step(), u64::MAX, cpu_now, move |i| {
                let (http, base, ids) = (http.clone(), base.clone(), ids.clone());
                async move {
                    let id = &ids[(i.wrapping_mul(7_919) % ids.len() as u64) as usize];
                    let v = ok_json(
                        http.post(format!("{base}/v3/lease/keepalive")).json(&json!({"ID": id})).send().await,
                    )
                    .await?;
                    if v["result"]["TTL"].is_null() && v["TTL"].is_null() {
                        return Err(format!("keepalive answer without TTL: {v}"));
                    }
                    Ok(())
                }
            })),
        )
        .await?;
        fig.keepalive_per_cpu_s = Some(run.ok as f64 / cpu.as_secs_f64().max(1e-9));
        row(ctx, "etcd", &format!("heartbeat = lease keep-alive ({} leases)", rate(n as f64)), 64, &run, cpu);
    }

    // discover = serializable prefix range over services x instances. Seeded through a
    // client of its own, closed before the RSS is read (as tandem's memory step does).
    let seed_http = crate::http_client()?;
    let (services, per) = (ctx.opts.services.max(1), ctx.opts.per_service.max(1));
    {
        let (http, base) = (seed_http.clone(), base.clone());
        let seeded = ctx
            .on_load(closed_loop(256, Duration::from_secs(300), services * per, cpu_now, move |i| {
                let (http, base) = (http.clone(), base.clone());
                async move {
                    let (svc, inst) = (format!("d-{}", i / per), format!("inst-{}", i % per));
                    let body = json!({"key": b64(format!("/services/{svc}/{inst}").as_bytes()),
                                      "value": b64(instance_value(&svc, &inst).as_bytes())});
                    ok_json(http.post(format!("{base}/v3/kv/put")).json(&body).send().await).await.map(|_| ())
                }
            }))
            .await?;
        anyhow::ensure!(
            seeded.ok == services * per,
            "etcd: seeded {} keys: {:?}",
            seeded.ok,
            seeded.first_error
        );
    }
    {
        let (http, base) = (ctx.http.clone(), base.clone());
        let (run, cpu) = measured(
            &proc,
            ctx.on_load(closed_loop(32, ctx.step(), u64::MAX, cpu_now, move |i| {
                let (http, base) = (http.clone(), base.clone());
                async move {
                    let svc = i.wrapping_mul(7_919) % services;
                    let prefix = format!("/services/d-{svc}/");
                    let end = format!("/services/d-{svc}0");
                    let v = ok_json(
                        http.post(format!("{base}/v3/kv/range"))
                            .json(&json!({"key": b64(prefix.as_bytes()), "range_end": b64(end.as_bytes()), "serializable": true}))
                            .send()
                            .await,
                    )
                    .await?;
                    let n = v["kvs"].as_array().map_or(0, |a| a.len()) as u64;
                    if n != per {
                        return Err(format!("range returned {n} keys, expected {per}"));
                    }
                    Ok(())
                }
            })),
        )
        .await?;
        fig.discover_per_cpu_s = Some(run.ok as f64 / cpu.as_secs_f64().max(1e-9));
        row(
            ctx,
            "etcd",
            &format!("discover = serializable prefix range ({} services x {per})", rate(services as f64)),
            32,
            &run,
            cpu,
        );
    }
    drop(seed_http);
    tokio::time::sleep(crate::sys::SETTLE_BEFORE_RSS).await;
    fig.rss_bytes_with_dataset = rss_bytes(proc.pid());
    fig.instances_in_dataset = services * per + n;
    ctx.report.note(format!(
        "etcd RSS with {} leases and {} keys: {:.1} MiB",
        rate(n as f64),
        rate((services * per) as f64),
        fig.rss_bytes_with_dataset.unwrap_or(0) as f64 / 1048576.0
    ));
    drop(proc);
    Ok(fig)
}

/// Members of a bench's etcd cluster (`cluster`, `roll`).
const GROUP_MEMBERS: usize = 3;

/// Client and peer ports of [`GROUP_MEMBERS`] etcd members on loopback.
pub(crate) fn group_ports() -> anyhow::Result<Vec<(u16, u16)>> {
    (0..GROUP_MEMBERS).map(|_| Ok((free_tcp()?, free_tcp()?))).collect()
}

/// Member `k` of an etcd cluster on `ports` (static initial cluster `token`, data in
/// `dir/m<k+1>`, default settings otherwise): its client URL and its flags.
pub(crate) fn member_args(ports: &[(u16, u16)], k: usize, dir: &Path, token: &str) -> (String, Vec<String>) {
    let initial = ports
        .iter()
        .enumerate()
        .map(|(k, (_, p))| format!("m{}=http://127.0.0.1:{p}", k + 1))
        .collect::<Vec<_>>()
        .join(",");
    let (c, p) = ports[k];
    let (client, peer) = (format!("http://127.0.0.1:{c}"), format!("http://127.0.0.1:{p}"));
    let name = format!("m{}", k + 1);
    let data = dir.join(&name).to_string_lossy().into_owned();
    let flags = [
        ("--name", name.as_str()),
        ("--data-dir", &data),
        ("--listen-client-urls", &client),
        ("--advertise-client-urls", &client),
        ("--listen-peer-urls", &peer),
        ("--initial-advertise-peer-urls", &peer),
        ("--initial-cluster", &initial),
        ("--initial-cluster-state", "new"),
        ("--initial-cluster-token", token),
        ("--log-level", "error"),
        ("--logger", "zap"),
    ];
    let args = flags.iter().flat_map(|(f, v)| [(*f).to_owned(), (*v).to_owned()]).collect();
    (client, args)
}
