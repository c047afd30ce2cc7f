//! `acl`: the cost of token checks. Two in-process nodes on the server runtime, one with
//! ACLs off and one with ACLs on (a scoped policy, a token presented as
//! `Authorization: Bearer` on every request), measured in the same run with the same load:
//! durable registrations and discovery. Steps run in the order off, on, on, off for each
//! operation, so that a drift over the run (RocksDB growing, compactions) falls on both
//! sides alike; the summary divides each side's total server CPU by its requests.

use std::sync::Arc;

use serde_json::json;
use tandem::acl::{PolicySection, RuleSection};
use tandem::node::Node;

use crate::load::{closed_loop, rate, Run};
use crate::nodes::{check, seed};
use crate::{bench_config, cpu_now, Ctx};

/// Concurrency of the register steps (where register saturates the server core).
const REGISTER_CONC: usize = 64;
/// Concurrency of the discover steps.
const DISCOVER_CONC: usize = 32;
/// Services (of `per_service` instances) seeded in each node for the discover steps.
const DISCOVER_SERVICES_MAX: u64 = 1_000;

/// One node and the token its requests present (`None`: ACLs off).
struct Side {
    node: Node,
    token: Option<Arc<str>>,
    label: &'static str,
}

async fn start_side(ctx: &Ctx, dir: &std::path::Path, acl: bool) -> anyhow::Result<Side> {
    let mut cfg = bench_config(dir, if acl { "dc-on" } else { "dc-off" });
    let mut token = None;
    if acl {
        cfg.acl.enabled = Some(true);
        cfg.acl.policies = vec![PolicySection {
            name: "bench".into(),
            rules: vec![RuleSection {
                namespace: "default".into(),
                service_prefix: String::new(),
                read: true,
                write: true,
            }],
            admin: false,
            status: false,
            metrics: false,
        }];
        let mut file = tandem::acl::tokens::TokenFile::default();
        let (_, secret) = file.create(vec!["bench".into()], "tandem-bench".into(), 0, None);
        std::fs::create_dir_all(&cfg.data_dir)?;
        file.store(&cfg.acl.tokens_path(&cfg.data_dir))?;
        token = Some(Arc::from(format!("Bearer {secret}").as_str()));
    } else {
        cfg.acl.enabled = Some(false);
    }
    let node = ctx.start_node(cfg).await?;
    Ok(Side { node, token, label: if acl { "on (token checked)" } else { "off" } })
}

/// Adds the token header, if any.
fn auth(req: reqwest::RequestBuilder, token: &Option<Arc<str>>) -> reqwest::RequestBuilder {
    match token {
        Some(t) => req.header(reqwest::header::AUTHORIZATION, &**t),
        None => req,
    }
}

fn row(ctx: &mut Ctx, op: &str, side: &Side, conc: usize, run: &Run) {
    let errors = match &run.first_error {
        Some(e) => format!("{} first: {}", run.errors, e.chars().take(80).collect::<String>()),
        None => run.errors.to_string(),
    };
    ctx.report.row(vec![
        op.into(),
        side.label.into(),
        conc.to_string(),
        rate(run.per_sec()),
        run.lat.summary(),
        format!("{:.1}", run.server_cpu_s_per_kop() * 1000.0),
        format!("{:.2} / {:.2}", run.server_cores(), run.load_cores()),
        errors,
    ]);
}

/// Server CPU µs per successful request over several runs.
fn us_per_request(runs: &[&Run]) -> f64 {
    let cpu: f64 = runs.iter().map(|r| r.cpu.server.as_secs_f64()).sum();
    let ok: u64 = runs.iter().map(|r| r.ok).sum();
    cpu * 1e6 / ok.max(1) as f64
}

pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let dir = ctx.tempdir("tandem-bench-acl")?;
    let sides = [start_side(ctx, dir.path(), false).await?, start_side(ctx, dir.path(), true).await?];
    ctx.report.table(
        "acl: the cost of token checks, ACLs off vs on, same run (closed loop; order off, on, on, off)",
        &[
            "operation",
            "ACLs",
            "concurrency",
            "requests/s",
            "latency ms p50 / p99 / p999 / max",
            "server CPU µs per request",
            "CPU cores server / load",
            "errors",
        ],
    );
    let order = [0usize, 1, 1, 0];
    // Register: new ephemeral instances, as `register` does.
    let mut reg: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
    for (round, &s) in order.iter().enumerate() {
        let url = Arc::new(format!("http://{}/v1/register", sides[s].node.http_addr()));
        let (http, token) = (ctx.http.clone(), sides[s].token.clone());
        let run = ctx
            .on_load(closed_loop(REGISTER_CONC, ctx.step(), u64::MAX, cpu_now, move |i| {
                let (http, url, token) = (http.clone(), url.clone(), token.clone());
                async move {
                    let body = json!({
                        "service": format!("svc-{}", i % 1000),
                        "instance_id": format!("r{round}-i{i}"),
                        "address": "10.20.30.40", "port": 8080, "zone": "zone-a", "version": "1.4.2",
                    });
                    check(auth(http.post(url.as_str()).json(&body), &token).send().await).await
                }
            }))
            .await?;
        row(ctx, "register (POST /v1/register)", &sides[s], REGISTER_CONC, &run);
        reg[s].push(run);
    }
    // Discover: the same services in both nodes.
    let services = ctx.opts.services.clamp(1, DISCOVER_SERVICES_MAX);
    let per = ctx.opts.per_service.max(1);
    for side in &sides {
        seed(ctx, &side.node, services * per, true, move |i| {
            (format!("d-{}", i / per), format!("inst-{}", i % per))
        })
        .await?;
    }
    let mut disc: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
    for &s in &order {
        let base = Arc::new(format!("http://{}/v1/services/default", sides[s].node.http_addr()));
        let (http, token) = (ctx.http.clone(), sides[s].token.clone());
        let run = ctx
            .on_load(closed_loop(DISCOVER_CONC, ctx.step(), u64::MAX, cpu_now, move |i| {
                let (http, base, token) = (http.clone(), base.clone(), token.clone());
                async move {
                    let svc = i.wrapping_mul(7_919) % services;
                    check(auth(http.get(format!("{base}/d-{svc}")), &token).send().await).await
                }
            }))
            .await?;
        row(ctx, "discover (GET /v1/services/default/{svc})", &sides[s], DISCOVER_CONC, &run);
        disc[s].push(run);
    }
    for (op, runs) in [("register", &reg), ("discover", &disc)] {
        let off = us_per_request(&runs[0].iter().collect::<Vec<_>>());
        let on = us_per_request(&runs[1].iter().collect::<Vec<_>>());
        ctx.report.note(format!(
            "cost of token checks, {op}: {on:.1} µs of server CPU per request with ACLs on vs {off:.1} off: \
             {:+.1} µs per request, ratio {:.3} (both rounds of each side together)",
            on - off,
            on / off.max(1e-9)
        ));
    }
    ctx.report.note(format!(
        "ACLs on: policy `bench` (read and write on namespace default), a token presented as \
         Authorization: Bearer on every request (SHA-256 of the secret, a lookup, the rule check, the \
         per-principal rate limiter off, the audit log on for register in both nodes); discover over {} \
         services x {per} in each node",
        rate(services as f64)
    ));
    for side in sides {
        ctx.stop_node(side.node).await;
    }
    Ok(())
}
