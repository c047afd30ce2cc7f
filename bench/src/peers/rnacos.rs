//! r-nacos as a peer, through the Nacos HTTP API v1: register (persistent and ephemeral),
//! heartbeat (beat) and discover (instance list).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::{free_tcp, measured, ok_json, ok_text, row, spawn, wait_ready, PeerFigures};
use crate::load::{closed_loop, rate};
use crate::sys::rss_bytes;
use crate::{cpu_now, Ctx};

fn nacos_ip(i: u64) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

pub(super) async fn rnacos(ctx: &mut Ctx, bin: &Path) -> anyhow::Result<PeerFigures> {
    let dir = ctx.tempdir("tandem-bench-rnacos")?;
    let (hp, gp, cp) = (free_tcp()?, free_tcp()?, free_tcp()?);
    let env: Vec<(&str, String)> = vec![
        ("RNACOS_HTTP_PORT", hp.to_string()),
        ("RNACOS_GRPC_PORT", gp.to_string()),
        ("RNACOS_HTTP_CONSOLE_PORT", cp.to_string()),
        ("RNACOS_SDK_HOST", "127.0.0.1".into()),
        ("RNACOS_CONSOLE_HOST", "127.0.0.1".into()),
        ("RNACOS_RAFT_NODE_ADDR", format!("127.0.0.1:{gp}")),
        ("RNACOS_DATA_DIR", dir.path().join("data").to_string_lossy().into_owned()),
        ("RUST_LOG", "error".into()),
    ];
    let proc = spawn(ctx, "r-nacos", bin, &[], &env, &dir.path().join("rnacos.log"))?;
    let base = Arc::new(format!("http://127.0.0.1:{hp}/nacos/v1/ns"));
    wait_ready(&ctx.http, &format!("{base}/instance/list?serviceName=probe"), Duration::from_secs(30))
        .await?;
    ctx.report.note(format!("r-nacos ({}) at http://127.0.0.1:{hp}", bin.display()));
    let mut fig = PeerFigures { rss_bytes_empty: rss_bytes(proc.pid()), ..Default::default() };

    // heartbeat: N ephemeral instances, then beats. Seeded through a client of its own,
    // closed before the RSS is read (as tandem's memory step does).
    let seed_http = crate::http_client()?;
    let n = ctx.opts.leases.max(1);
    {
        let (http, base) = (seed_http.clone(), base.clone());
        let seeded = ctx
            .on_load(closed_loop(256, Duration::from_secs(300), n, cpu_now, move |i| {
                let (http, base) = (http.clone(), base.clone());
                async move {
                    let url = format!(
                        "{base}/instance?serviceName=hb-{}&ip={}&port=8080&ephemeral=true",
                        i % 100,
                        nacos_ip(i)
                    );
                    ok_text(http.post(url).send().await).await
                }
            }))
            .await?;
        anyhow::ensure!(seeded.ok == n, "r-nacos: registered {} of {n}: {:?}", seeded.ok, seeded.first_error);
    }

    // discover.
    let (services, per) = (ctx.opts.services.max(1), ctx.opts.per_service.max(1));
    {
        let (http, base) = (seed_http.clone(), base.clone());
        let seeded = ctx
            .on_load(closed_loop(256, Duration::from_secs(300), services * per, cpu_now, move |i| {
                let (http, base) = (http.clone(), base.clone());
                async move {
                    let url = format!(
                        "{base}/instance?serviceName=d-{}&ip={}&port=8080&ephemeral=true",
                        i / per,
                        nacos_ip(i)
                    );
                    ok_text(http.post(url).send().await).await
                }
            }))
            .await?;
        anyhow::ensure!(
            seeded.ok == services * per,
            "r-nacos: seeded {}: {:?}",
            seeded.ok,
            seeded.first_error
        );
    }
    drop(seed_http);
    tokio::time::sleep(crate::sys::SETTLE_BEFORE_RSS).await;
    fig.rss_bytes_with_dataset = rss_bytes(proc.pid());
    fig.instances_in_dataset = services * per + n;
    ctx.report.note(format!(
        "r-nacos RSS empty {:.1} MiB, with {} instances {:.1} MiB (before the register steps add more)",
        fig.rss_bytes_empty.unwrap_or(0) as f64 / 1048576.0,
        rate(fig.instances_in_dataset as f64),
        fig.rss_bytes_with_dataset.unwrap_or(0) as f64 / 1048576.0
    ));
    {
        let (http, base) = (ctx.http.clone(), base.clone());
        let (run, cpu) = measured(
            &proc,
            ctx.on_load(closed_loop(64, ctx.step(), u64::MAX, cpu_now, move |i| {
                let (http, base) = (http.clone(), base.clone());
                async move {
                    let k = i.wrapping_mul(7_919) % n;
                    let url = format!(
                        "{base}/instance/beat?serviceName=hb-{}&ip={}&port=8080",
                        k % 100,
                        nacos_ip(k)
                    );
                    ok_text(http.put(url).send().await).await
                }
            })),
        )
        .await?;
        fig.keepalive_per_cpu_s = Some(run.ok as f64 / cpu.as_secs_f64().max(1e-9));
        row(ctx, "r-nacos", &format!("heartbeat = beat ({} instances)", rate(n as f64)), 64, &run, cpu);
    }
    {
        let (http, base) = (ctx.http.clone(), base.clone());
        let (run, cpu) = measured(
            &proc,
            ctx.on_load(closed_loop(32, ctx.step(), u64::MAX, cpu_now, move |i| {
                let (http, base) = (http.clone(), base.clone());
                async move {
                    let svc = i.wrapping_mul(7_919) % services;
                    let v =
                        ok_json(http.get(format!("{base}/instance/list?serviceName=d-{svc}")).send().await)
                            .await?;
                    let n = v["hosts"].as_array().map_or(0, |a| a.len()) as u64;
                    if n != per {
                        return Err(format!("list returned {n} hosts, expected {per}"));
                    }
                    Ok(())
                }
            })),
        )
        .await?;
        fig.discover_per_cpu_s = Some(run.ok as f64 / cpu.as_secs_f64().max(1e-9));
        row(
            ctx,
            "r-nacos",
            &format!("discover = instance/list ({} services x {per})", rate(services as f64)),
            32,
            &run,
            cpu,
        );
    }
    for (ephemeral, label) in [(false, "register, persistent (raft)"), (true, "register, ephemeral (memory)")]
    {
        let (http, base) = (ctx.http.clone(), base.clone());
        let offset = if ephemeral { 1u64 << 20 } else { 0 };
        let (run, cpu) = measured(
            &proc,
            ctx.on_load(closed_loop(256, ctx.step(), 1 << 20, cpu_now, move |i| {
                let (http, base) = (http.clone(), base.clone());
                async move {
                    let url = format!(
                        "{base}/instance?serviceName=reg-{}&ip={}&port=8080&ephemeral={ephemeral}&weight=1",
                        i % 1000,
                        nacos_ip(i + offset)
                    );
                    ok_text(http.post(url).send().await).await
                }
            })),
        )
        .await?;
        if !ephemeral {
            fig.register_best_per_s = Some(run.per_sec());
        }
        row(ctx, "r-nacos", label, 256, &run, cpu);
    }
    drop(proc);
    Ok(fig)
}
