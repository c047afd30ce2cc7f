//! `tandem backup` and `tandem restore` (docs/operations.md, "Backup and restore"; the
//! format and what a restore does: [`crate::backup`]).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use tandem_client::ClientError;

use crate::backup::{BackupMeta, BACKUP_BYTES_MAX, META_FILE, STATE_FILE};
use crate::config::Config;

#[derive(clap::Args)]
pub struct BackupArgs {
    /// The dir to write the backup to (created; refused if it already holds one).
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    conn: super::Conn,
}

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The backup's dir (what `tandem backup --out` wrote).
    #[arg(long)]
    from: PathBuf,
    /// The config of the node to seed: its `dc` must be the backup's, its `data_dir`
    /// empty or absent.
    #[arg(long, short)]
    config: PathBuf,
}

/// `tandem backup`: the export goes to `state.export.partial`, is checked against the
/// node's SHA-256 as read back from the disk, then the meta is written and the export
/// renamed: a dir with `backup.json` holds a whole, checked backup.
pub async fn backup(args: BackupArgs) -> ExitCode {
    if let Err(e) = args.conn.tls() {
        return super::client_exit(e);
    }
    match take(&args).await {
        Ok(meta) => {
            let out = serde_json::json!({ "dir": args.out, "backup": meta });
            println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => match e.downcast::<ClientError>() {
            Ok(e) => super::client_exit(e),
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
        },
    }
}

async fn take(args: &BackupArgs) -> anyhow::Result<BackupMeta> {
    let dir = &args.out;
    anyhow::ensure!(
        !dir.join(META_FILE).exists(),
        "{} already holds a backup; give another --out",
        dir.display()
    );
    crate::node::data_dir::prepare(dir)?;
    let partial = dir.join(format!("{STATE_FILE}.partial"));
    let mut file = private_file(&partial)?;
    let (meta, written) = args.conn.client().backup(&mut file, BACKUP_BYTES_MAX as u64).await?;
    file.sync_all().with_context(|| format!("cannot sync {}", partial.display()))?;
    drop(file);
    let meta: BackupMeta =
        serde_json::from_value(meta).context("the node's backup meta is not one this build reads")?;
    let export =
        std::fs::read(&partial).with_context(|| format!("cannot read back {}", partial.display()))?;
    let sum = crate::backup::sha256_hex(&export);
    anyhow::ensure!(
        written == meta.state_bytes && sum == meta.state_sha256,
        "the backup arrived damaged: {written} bytes with SHA-256 {sum}, the node sent {} bytes with {}",
        meta.state_bytes,
        meta.state_sha256
    );
    let meta_path = dir.join(META_FILE);
    let state_path = dir.join(STATE_FILE);
    std::fs::rename(&partial, &state_path)
        .with_context(|| format!("cannot write {}", state_path.display()))?;
    let json = serde_json::to_vec_pretty(&meta).context("cannot encode the backup's meta")?;
    std::io::Write::write_all(&mut private_file(&meta_path)?, &json)
        .with_context(|| format!("cannot write {}", meta_path.display()))?;
    // The names are durable once the dir is.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))?;
    Ok(meta)
}

/// A new file only its owner may read (0600): a backup holds every registration.
fn private_file(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    opts.open(path).with_context(|| format!("cannot create {}", path.display()))
}

/// `tandem restore`: seeds the node's empty data dir, and says what to do next.
pub fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let cfg = Config::load(&args.config)?;
    let done = crate::backup::restore(&cfg, &args.from)?;
    let next = match &cfg.cluster {
        Some(section) => {
            let others: Vec<String> = section
                .members
                .iter()
                .filter(|m| m.id != section.node_id)
                .map(|m| {
                    format!(
                        "tandem cluster add --id {} --raft-addr {} --http-addr {} --addr http://{}",
                        m.id,
                        m.raft_addr,
                        m.http_addr,
                        section.me().http_addr
                    )
                })
                .collect();
            serde_json::json!({
                "start": format!("tandem server --config {}: this node starts as the only member of its group", args.config.display()),
                "then": "start each other member with [cluster] join = true on an empty data dir, and add it:",
                "add": others,
            })
        }
        None => serde_json::json!({
            "start": format!("tandem server --config {}", args.config.display()),
        }),
    };
    let out = serde_json::json!({ "restored": done, "next": next });
    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    Ok(())
}
