//! The `tandem` command line: `server`, `dev`, `certs`, `chaos`, and client commands for people and
//! scripts (`register`, `heartbeat`, `deregister`, `status-set`, `discover`, `watch`,
//! `status`). Client commands print JSON on stdout and errors on stderr; the exit status is
//! 0 on success, 1 on an error answer, 2 when no registry answered.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde_json::{json, Value};

use crate::config::Config;
use crate::node::Node;
use tandem_client::api::StatusName;
use tandem_client::{Client, ClientError};

mod backup;
mod cluster;
mod dev;
pub use dev::dev_configs;

#[derive(Parser)]
#[command(name = "tandem", version = crate::VERSION, about = "A service registry for two (or more) data centers")]
pub struct Cli {
    /// Log format: human or json.
    #[arg(long, global = true, env = "TANDEM_LOG_FORMAT")]
    log_format: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum AclCmd {
    /// Tokens: random 256-bit secrets; the tokens file keeps only their SHA-256.
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Create a token in the tokens file of a node's config and print its secret (once).
    /// The node loads it on reload (SIGHUP or POST /v1/admin/reload).
    Create {
        /// The node's config file (its `[acl]` section names the tokens file and policies).
        #[arg(long, short)]
        config: PathBuf,
        /// A policy of `[[acl.policies]]`, or `admin` (repeat).
        #[arg(long = "policy", required = true)]
        policies: Vec<String>,
        #[arg(long, default_value = "")]
        description: String,
        /// Expire after this long: 90d, 12h, 30m.
        #[arg(long)]
        expires: Option<String>,
        /// Who owns the instances this token registers (default: the token's id). Give a
        /// successor token the same principal to keep them across a rotation.
        #[arg(long)]
        principal: Option<String>,
    },
    /// List the tokens of a node's config (ids, policies, expiry; never secrets).
    List {
        #[arg(long, short)]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Every member of the DC's group as its own status shows it (role, term, leader,
    /// serving writes, applied and last log index, the leader's matched index per member).
    /// Exit status 1 unless every member answers, all follow one leader that serves
    /// writes, every member is caught up (at most 100 entries behind the leader's log) and
    /// all run one [failover]/[protection]. --addr: any member (the others are found from
    /// its member list). --wait SECS: ask again every second until it is so, for at most
    /// SECS (a rolling upgrade waits on it after each member's restart).
    Status {
        #[arg(long, value_name = "SECS")]
        wait: Option<u64>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Hand the lead of the DC's group to member --to (its node id): the leader stops
    /// serving writes (clients see 503 no_leader and retry), lets --to catch up and
    /// campaign, and answers once --to leads; then waits until it serves writes. About one
    /// election timeout of refused writes. --addr: any member (a follower forwards it).
    TransferLeader {
        #[arg(long)]
        to: u64,
        #[command(flatten)]
        conn: Conn,
    },
    /// Add node --id (started with [cluster] join = true) to the group: a learner, sent
    /// the log or a snapshot, promoted to voter once at most 100 entries behind (unless
    /// --learner). Refused if the voters after it would not hold a quorum that answers now.
    Add {
        #[command(flatten)]
        node: NewNode,
        /// Leave it a learner: it follows and serves reads, and never votes.
        #[arg(long)]
        learner: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove member --id from the group (not the leader: transfer the lead first).
    /// Refused if the voters after it would not hold a quorum that answers now.
    Remove {
        #[arg(long)]
        id: u64,
        #[command(flatten)]
        conn: Conn,
    },
    /// Put node --id (started with [cluster] join = true) in member --old's place: added as
    /// a learner, caught up, then swapped for --old in one change.
    Replace {
        /// The member it replaces (its node id).
        #[arg(long)]
        old: u64,
        #[command(flatten)]
        node: NewNode,
        #[command(flatten)]
        conn: Conn,
    },
}

/// A node to add to a group: its id and where its member link and HTTP API listen.
#[derive(clap::Args)]
struct NewNode {
    /// Its node id (its certificate names n<id>.<dc>.tandem-node); never a removed one's.
    #[arg(long)]
    id: u64,
    /// Where its member link listens (HOST:PORT, UDP).
    #[arg(long)]
    raft_addr: String,
    /// Where its HTTP API listens (HOST:PORT).
    #[arg(long)]
    http_addr: String,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one registry node from a TOML config file.
    Server {
        #[arg(long, short)]
        config: PathBuf,
        /// Override `http_addr`.
        #[arg(long)]
        http_addr: Option<SocketAddr>,
        /// Override `data_dir`.
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Run a complete two-DC sandbox on loopback (dc-a and dc-b, replicating over QUIC).
    Dev {
        /// Where certificates and data dirs live (created when missing).
        #[arg(long, default_value = ".tandem-dev")]
        dir: PathBuf,
        /// HTTP port of dc-a; dc-b uses the next one.
        #[arg(long, default_value_t = 8500)]
        http_port: u16,
        /// Replication (UDP) port of dc-a; dc-b uses the next one.
        #[arg(long, default_value_t = 7500)]
        repl_port: u16,
        /// Mark remote copies stale after this many ms of link silence.
        #[arg(long, default_value_t = 10_000)]
        stale_after_ms: u64,
        /// Nodes per DC: a Raft group of N (node k of a DC serves HTTP on its DC's port +
        /// 10*(k-1)); 1 runs each DC as a single node.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=NODES_PER_DC_MAX))]
        nodes: u64,
        /// A folder of `tandem chaos` runs for the console's Drills page (`[ui] drills_dir`).
        #[arg(long)]
        drills: Option<PathBuf>,
    },
    /// Create a development CA and a certificate and key per DC (the replication link's),
    /// and with `--nodes` one per node of each DC's Raft group (the member link's).
    Certs {
        #[arg(long, default_value = "certs")]
        out: PathBuf,
        /// DC names (repeat); default dc-a and dc-b.
        #[arg(long = "dc")]
        dcs: Vec<String>,
        /// Also a node certificate for nodes 1..=N of each DC (`n<id>.<dc>.tandem-node`:
        /// never accepted as a DC, and a DC's never as a node).
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=NODES_PER_DC_MAX))]
        nodes: u64,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
    },
    /// Run partition-heal chaos drills with an invariant checker (`tandem chaos --help`).
    #[command(disable_help_flag = true)]
    Chaos {
        /// Drills and options, passed to the drill runner (see `tandem chaos --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Access control: manage the tokens of a node (`tandem acl token create --help`).
    Acl {
        #[command(subcommand)]
        cmd: AclCmd,
    },
    /// Register an instance.
    Register {
        #[command(flatten)]
        conn: Conn,
        #[arg(long)]
        service: String,
        #[arg(long)]
        address: String,
        #[arg(long)]
        port: u16,
        #[arg(long)]
        instance_id: Option<String>,
        #[arg(long)]
        zone: Option<String>,
        #[arg(long)]
        weight: Option<u32>,
        #[arg(long = "app-version")]
        app_version: Option<String>,
        #[arg(long = "tag")]
        tags: Vec<String>,
        /// key=value (repeat).
        #[arg(long = "meta")]
        metadata: Vec<String>,
        #[arg(long)]
        ttl_ms: Option<u64>,
        #[arg(long)]
        persistent: bool,
        /// Keep heartbeating every this many ms until Ctrl-C, then deregister.
        #[arg(long)]
        keepalive_ms: Option<u64>,
    },
    /// Renew an instance's lease once.
    Heartbeat {
        #[command(flatten)]
        conn: Conn,
        service: String,
        instance_id: String,
    },
    /// Deregister an instance.
    Deregister {
        #[command(flatten)]
        conn: Conn,
        service: String,
        instance_id: String,
    },
    /// Retire a lost DC at the node(s) of --addr: its copies go and its frames are refused
    /// (run it at every DC that stays; see docs/replication.md).
    RetireDc {
        #[command(flatten)]
        conn: Conn,
        dc: String,
    },
    /// Lift a retirement: the DC may replicate again, from scratch.
    UnretireDc {
        #[command(flatten)]
        conn: Conn,
        dc: String,
    },
    /// Set an instance's status: up, draining or out_of_service.
    StatusSet {
        #[command(flatten)]
        conn: Conn,
        service: String,
        instance_id: String,
        /// up, draining or out_of_service.
        #[arg(value_parser = parse_status)]
        status: StatusName,
    },
    /// Discover a service's instances.
    Discover {
        #[command(flatten)]
        conn: Conn,
        service: String,
        /// Only this owner DC's instances (or "all"), without policy.
        #[arg(long)]
        dc: Option<String>,
        /// Say for every known instance why it is or is not in the answer.
        #[arg(long)]
        explain: bool,
    },
    /// Print a service's instances each time they change (blocking queries).
    Watch {
        #[command(flatten)]
        conn: Conn,
        service: String,
        /// Stop after this many changes (default: until Ctrl-C).
        #[arg(long)]
        count: Option<u64>,
    },
    /// Show the node's status: DC, log, replication marks and links, self-preservation.
    Status {
        #[command(flatten)]
        conn: Conn,
    },
    /// Write a consistent backup of the DC (the state and its meta, checked by SHA-256)
    /// to --out, taken from the node that serves its writes while it serves (--addr: give
    /// every member's address; a follower refuses). Docs: docs/operations.md.
    Backup(backup::BackupArgs),
    /// Seed the empty data dir of --config's node from a backup, offline. The restored DC
    /// starts a new, fenced epoch. A group member starts as the only member; add the others.
    Restore(backup::RestoreArgs),
    /// A DC's Raft group (`tandem cluster status --help`).
    Cluster {
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
}

#[derive(clap::Args)]
struct Conn {
    /// Registry HTTP address(es), comma-separated.
    #[arg(long, env = "TANDEM_ADDR", default_value = "http://127.0.0.1:8500", value_delimiter = ',')]
    addr: Vec<String>,
    /// ACL token (when the registry has ACLs on).
    #[arg(long, env = "TANDEM_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// HTTPS: the CA certificate (PEM) the registry's certificate must chain to; then the
    /// addresses must be https:// URLs.
    #[arg(long, env = "TANDEM_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// HTTPS: a client certificate (PEM) to present, with --client-key.
    #[arg(long, env = "TANDEM_CLIENT_CERT", requires = "client_key", requires = "ca_cert")]
    client_cert: Option<PathBuf>,
    /// HTTPS: the client certificate's private key (PEM).
    #[arg(long, env = "TANDEM_CLIENT_KEY", requires = "client_cert")]
    client_key: Option<PathBuf>,
    #[arg(long, short, default_value = "default")]
    namespace: String,
}

impl Conn {
    /// The HTTPS settings of --ca-cert and --client-cert/--client-key, if given.
    fn tls(&self) -> Result<Option<tandem_client::ClientTls>, ClientError> {
        let Some(ca) = &self.ca_cert else { return Ok(None) };
        let tls = tandem_client::ClientTls::from_ca_file(ca)?;
        match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => Ok(Some(tls.with_identity_files(cert, key)?)),
            _ => Ok(Some(tls)),
        }
    }

    /// The client (its TLS settings were checked by [`check_tls`] before).
    fn client(&self) -> Client {
        self.client_of(&self.addr)
    }

    /// A client of `addrs` with these flags' TLS settings and token.
    fn client_of(&self, addrs: &[String]) -> Client {
        let tls = self.tls().ok().flatten();
        let c = Client::with_tls(addrs, tandem_client::ClientOptions::default(), tls.as_ref());
        match &self.token {
            Some(t) => c.with_token(t),
            None => c,
        }
    }
}

/// Refuses a client command whose TLS files do not load (before any request).
fn check_tls(cmd: &Cmd) -> Result<(), ClientError> {
    let conn = match cmd {
        Cmd::Register { conn, .. }
        | Cmd::Heartbeat { conn, .. }
        | Cmd::Deregister { conn, .. }
        | Cmd::RetireDc { conn, .. }
        | Cmd::UnretireDc { conn, .. }
        | Cmd::StatusSet { conn, .. }
        | Cmd::Discover { conn, .. }
        | Cmd::Watch { conn, .. }
        | Cmd::Status { conn }
        | Cmd::Cluster { cmd: ClusterCmd::Status { conn, .. } }
        | Cmd::Cluster { cmd: ClusterCmd::TransferLeader { conn, .. } }
        | Cmd::Cluster { cmd: ClusterCmd::Add { conn, .. } }
        | Cmd::Cluster { cmd: ClusterCmd::Remove { conn, .. } }
        | Cmd::Cluster { cmd: ClusterCmd::Replace { conn, .. } } => conn,
        // Backup checks its own; restore, like the rest, runs no client.
        _ => return Ok(()),
    };
    conn.tls().map(drop)
}

fn init_tracing(format: Option<&str>, level: Option<&str>) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(level.unwrap_or("info,quinn=warn,rustls=warn,openraft=warn")));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        Some("json") => builder.json().try_init(),
        _ => builder.fmt_fields(crate::log_fields::escaped()).try_init(),
    };
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match crate::node_runtime().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    rt.block_on(run(cli))
}

async fn run(cli: Cli) -> ExitCode {
    let fmt = cli.log_format.clone();
    let res = match cli.cmd {
        Cmd::Server { config, http_addr, data_dir } => server(config, http_addr, data_dir, fmt).await,
        Cmd::Dev { dir, http_port, repl_port, stale_after_ms, nodes, drills } => {
            init_tracing(fmt.as_deref(), None);
            dev::dev(dir, http_port, repl_port, stale_after_ms, nodes, drills).await
        }
        Cmd::Certs { out, dcs, nodes, force } => dev::certs(out, dcs, nodes, force),
        Cmd::Acl { cmd: AclCmd::Token { cmd } } => crate::acl::cli::token(cmd_args(cmd)),
        Cmd::Restore(args) => backup::restore(args),
        Cmd::Backup(args) => return backup::backup(args).await,
        Cmd::Chaos { args } => {
            // Drills start `tandem server` processes from this very binary.
            let bin = match std::env::current_exe() {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("error: cannot find the tandem binary: {e}");
                    return ExitCode::from(2);
                }
            };
            return tandem_chaos::drills::main(args, bin).await;
        }
        other => return client_cmd(other).await,
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn cmd_args(cmd: TokenCmd) -> crate::acl::cli::TokenCommand {
    use crate::acl::cli::TokenCommand;
    match cmd {
        TokenCmd::Create { config, policies, description, expires, principal } => {
            TokenCommand::Create { config, policies, description, expires, principal }
        }
        TokenCmd::List { config } => TokenCommand::List { config },
    }
}

async fn server(
    path: PathBuf,
    http_addr: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    fmt: Option<String>,
) -> anyhow::Result<()> {
    let mut cfg = Config::load(&path)?;
    if let Some(a) = http_addr {
        cfg.http_addr = a;
    }
    if let Some(d) = data_dir {
        cfg.data_dir = d;
    }
    init_tracing(fmt.as_deref().or(cfg.log.format.as_deref()), cfg.log.level.as_deref());
    let node = Node::start(cfg, Some(path)).await?;
    println!("tandem node {} serving HTTP on http://{}", node.shared.registry.dc, node.http_addr());
    wait_for_stop(&[&node]).await;
    node.shutdown().await;
    Ok(())
}

/// The audit line of a reload on SIGHUP.
fn tandem_audit_signal(result: &Result<(), crate::shared::ReloadError>) -> crate::audit::Record {
    crate::audit::Record {
        principal: "signal".into(),
        client: "local".into(),
        action: "reload".into(),
        target: "SIGHUP".into(),
        outcome: if result.is_ok() { "ok" } else { "failed" }.into(),
        status: 0,
        detail: result.as_ref().err().map(|e| format!("refused: {e}")),
        ..Default::default()
    }
}

/// Waits for Ctrl-C or SIGTERM; SIGHUP reloads the nodes' configuration.
pub(crate) async fn wait_for_stop(nodes: &[&Node]) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut hup = signal(SignalKind::hangup()).ok();
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = async { match term.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => break,
            _ = async { match hup.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {
                for n in nodes {
                    let result = n.shared.reload();
                    let rec = tandem_audit_signal(&result);
                    n.shared.audit.record(rec);
                    match result {
                        Ok(()) => tracing::info!("reloaded on SIGHUP"),
                        Err(e) => tracing::error!(error = %e, "reload refused; the old configuration stays"),
                    }
                }
            }
        }
    }
    tracing::info!("stopping");
}

/// Most nodes per DC `tandem certs --nodes` makes certificates for (a Raft group is 3 or
/// 5 voters; room for learners while members are replaced).
pub const NODES_PER_DC_MAX: u64 = crate::config::MEMBERS_MAX as u64;

fn parse_status(s: &str) -> Result<StatusName, String> {
    serde_json::from_value(Value::String(s.to_owned()))
        .map_err(|_| format!("{s:?}: use up, draining or out_of_service"))
}

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn client_exit(e: ClientError) -> ExitCode {
    eprintln!("error: {e}");
    match e {
        ClientError::Unreachable(_) => ExitCode::from(2),
        ClientError::Api { .. } | ClientError::Decode(_) | ClientError::Config(_) => ExitCode::from(1),
    }
}

async fn client_cmd(cmd: Cmd) -> ExitCode {
    if let Err(e) = check_tls(&cmd) {
        return client_exit(e);
    }
    let res: Result<(), ClientError> = match cmd {
        Cmd::Register {
            conn,
            service,
            address,
            port,
            instance_id,
            zone,
            weight,
            app_version,
            tags,
            metadata,
            ttl_ms,
            persistent,
            keepalive_ms,
        } => {
            let mut meta = serde_json::Map::new();
            for kv in metadata {
                match kv.split_once('=') {
                    Some((k, v)) => {
                        meta.insert(k.to_owned(), Value::String(v.to_owned()));
                    }
                    None => {
                        eprintln!("error: --meta takes key=value, got {kv:?}");
                        return ExitCode::from(1);
                    }
                }
            }
            let mut body =
                json!({"namespace": conn.namespace, "service": service, "address": address, "port": port});
            let o = body.as_object_mut().expect("object literal");
            let mut put = |k: &str, v: Value| {
                o.insert(k.into(), v);
            };
            if let Some(v) = instance_id {
                put("instance_id", v.into());
            }
            if let Some(v) = zone {
                put("zone", v.into());
            }
            if let Some(v) = weight {
                put("weight", v.into());
            }
            if let Some(v) = app_version {
                put("version", v.into());
            }
            if !tags.is_empty() {
                put("tags", tags.into());
            }
            if !meta.is_empty() {
                put("metadata", Value::Object(meta));
            }
            if let Some(v) = ttl_ms {
                put("ttl_ms", v.into());
            }
            if persistent {
                put("persistent", true.into());
            }
            let client = conn.client();
            match client.register(&body).await {
                Ok(v) => {
                    print_json(&v);
                    match keepalive_ms {
                        Some(ms) => keepalive(&client, &conn.namespace, &service, &body, v, ms).await,
                        None => Ok(()),
                    }
                }
                Err(e) => Err(e),
            }
        }
        Cmd::Heartbeat { conn, service, instance_id } => {
            conn.client().heartbeat(&conn.namespace, &service, &instance_id).await.map(|v| print_json(&v))
        }
        Cmd::Deregister { conn, service, instance_id } => {
            conn.client().deregister(&conn.namespace, &service, &instance_id).await.map(|v| print_json(&v))
        }
        Cmd::RetireDc { conn, dc } => conn
            .client()
            .retire_dc(&dc)
            .await
            .map(|v| print_json(&serde_json::to_value(v).unwrap_or_default())),
        Cmd::UnretireDc { conn, dc } => conn
            .client()
            .unretire_dc(&dc)
            .await
            .map(|v| print_json(&serde_json::to_value(v).unwrap_or_default())),
        Cmd::StatusSet { conn, service, instance_id, status } => conn
            .client()
            .set_status(&conn.namespace, &service, &instance_id, status)
            .await
            .map(|v| print_json(&v)),
        Cmd::Discover { conn, service, dc, explain } => {
            let mut q = Vec::new();
            if let Some(dc) = dc {
                q.push(format!("dc={dc}"));
            }
            if explain {
                q.push("explain=true".into());
            }
            conn.client().discover(&conn.namespace, &service, &q.join("&")).await.map(|v| print_json(&v))
        }
        Cmd::Watch { conn, service, count } => {
            let client = conn.client();
            let mut index = 0u64;
            let mut seen = 0u64;
            loop {
                match client.watch(&conn.namespace, &service, index, Duration::from_secs(60)).await {
                    Ok(v) => {
                        let new_index = v["index"].as_u64().unwrap_or(index);
                        if new_index != index {
                            println!("{}", serde_json::to_string(&v).unwrap_or_default());
                            index = new_index;
                            seen += 1;
                            if count.is_some_and(|c| seen >= c) {
                                break Ok(());
                            }
                        }
                    }
                    Err(e @ ClientError::Api { .. }) => break Err(e),
                    Err(e) => {
                        eprintln!("watch: {e}; retrying in 1 s");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        }
        Cmd::Status { conn } => conn.client().status().await.map(|v| print_json(&v)),
        Cmd::Cluster { cmd: ClusterCmd::Status { conn, wait } } => {
            let scheme =
                conn.addr.first().and_then(|a| a.split_once("://")).map_or("http", |(s, _)| s).to_owned();
            let member = |url: &str| conn.client_of(&[url.to_owned()]);
            let until = wait.map(|s| std::time::Instant::now() + Duration::from_secs(s));
            loop {
                let res = cluster::status(&conn.client(), &scheme, &member).await;
                match (res, until) {
                    (Ok(true), _) => return ExitCode::SUCCESS,
                    (Ok(false) | Err(_), Some(t)) if std::time::Instant::now() < t => {
                        println!("-- not yet; asking again in 1 s");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    (Ok(false), _) => return ExitCode::from(1),
                    (Err(e), _) => break Err(e),
                }
            }
        }
        Cmd::Cluster { cmd: ClusterCmd::TransferLeader { conn, to } } => {
            let scheme =
                conn.addr.first().and_then(|a| a.split_once("://")).map_or("http", |(s, _)| s).to_owned();
            let member = |url: &str| conn.client_of(&[url.to_owned()]);
            cluster::transfer_leader(&conn.client(), to, &scheme, &member).await
        }
        Cmd::Cluster { cmd: ClusterCmd::Add { conn, node, learner } } => cluster::changed(
            conn.client().add_member(node.id, &node.raft_addr, &node.http_addr, learner).await,
        ),
        Cmd::Cluster { cmd: ClusterCmd::Remove { conn, id } } => {
            cluster::changed(conn.client().remove_member(id).await)
        }
        Cmd::Cluster { cmd: ClusterCmd::Replace { conn, old, node } } => cluster::changed(
            conn.client().replace_member(old, node.id, &node.raft_addr, &node.http_addr).await,
        ),
        Cmd::Server { .. }
        | Cmd::Dev { .. }
        | Cmd::Certs { .. }
        | Cmd::Chaos { .. }
        | Cmd::Acl { .. }
        | Cmd::Backup(_)
        | Cmd::Restore(_) => Ok(()),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => client_exit(e),
    }
}

/// Heartbeats until Ctrl-C (re-registering on 404), then drains and deregisters.
async fn keepalive(
    client: &Client,
    ns: &str,
    svc: &str,
    body: &Value,
    reg: Value,
    every_ms: u64,
) -> Result<(), ClientError> {
    let mut id = reg["instance_id"].as_str().unwrap_or_default().to_owned();
    let mut body = body.clone();
    body["instance_id"] = Value::String(id.clone());
    let mut tick = tokio::time::interval(Duration::from_millis(every_ms.max(100)));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                match client.heartbeat(ns, svc, &id).await {
                    Ok(_) => {}
                    Err(ClientError::Api { status: 404, .. }) => {
                        let v = client.register(&body).await?;
                        id = v["instance_id"].as_str().unwrap_or_default().to_owned();
                        eprintln!("re-registered {id}");
                    }
                    Err(e) => eprintln!("heartbeat: {e}"),
                }
            }
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    let _ = client.set_status(ns, svc, &id, StatusName::Draining).await;
    client.deregister(ns, svc, &id).await.map(|v| print_json(&v))
}

#[cfg(test)]
mod tests {
    use tandem_replicator::tls::{NodeName, TlsMaterial};

    use super::dev::certs;

    #[test]
    fn certs_makes_both_kinds_and_overwrites_nothing_without_force() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        certs(out.clone(), vec!["dc-a".into(), "dc-b".into()], 3, false).unwrap();
        let dc = TlsMaterial::load(&tandem_replicator::tls::TlsPaths {
            ca_cert: out.join("ca.pem"),
            cert: out.join("dc-b.pem"),
            key: out.join("dc-b.key"),
        })
        .unwrap();
        assert_eq!((dc.dc(), dc.node()), ("dc-b", None));
        let node = NodeName::new("dc-b", 3).unwrap();
        let paths = tandem_replicator::tls::node_cert_paths(&out, &node);
        assert_eq!(TlsMaterial::load(&paths).unwrap().node(), Some(&node));
        let before = std::fs::read(&paths.cert).unwrap();

        // Only a node file in the way (the DC files moved off): refused before any write.
        std::fs::remove_file(out.join("dc-a.pem")).unwrap();
        let refused = certs(out.clone(), vec!["dc-a".into()], 1, false).unwrap_err();
        assert!(refused.to_string().contains("n1.dc-a.tandem-node.pem"), "{refused}");
        assert!(!out.join("dc-a.pem").exists(), "nothing was written");
        certs(out.clone(), vec!["dc-a".into(), "dc-b".into()], 3, true).unwrap();
        assert_ne!(std::fs::read(&paths.cert).unwrap(), before, "--force replaced it");
    }
}
