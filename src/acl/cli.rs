//! `tandem acl token create|list`: writes and reads a node's tokens file (hashes only).

use std::path::PathBuf;

use anyhow::{bail, Context as _};

use super::tokens::TokenFile;
use super::ADMIN_POLICY;
use crate::config::Config;

/// What `tandem acl token` was asked to do.
pub enum TokenCommand {
    Create {
        config: PathBuf,
        policies: Vec<String>,
        description: String,
        expires: Option<String>,
        principal: Option<String>,
    },
    List {
        config: PathBuf,
    },
}

/// Runs a token command. `create` prints the secret on stdout (once: it is stored nowhere).
pub fn token(cmd: TokenCommand) -> anyhow::Result<()> {
    let now = tandem_replicator::gateway::wall_ms();
    match cmd {
        TokenCommand::Create { config, policies, description, expires, principal } => {
            let cfg = Config::load(&config).with_context(|| format!("cannot load {}", config.display()))?;
            for p in &policies {
                if p != ADMIN_POLICY && !cfg.acl.policies.iter().any(|d| d.name == *p) {
                    bail!("policy {p:?} is not defined in [[acl.policies]] of {}", config.display());
                }
            }
            if description.len() > 256 || description.chars().any(char::is_control) {
                bail!("--description: at most 256 bytes, no control characters");
            }
            if let Some(p) = &principal {
                let ok = (1..=128).contains(&p.len())
                    && p.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                    && p != crate::registry::ANONYMOUS;
                if !ok {
                    bail!("--principal: 1 to 128 of A-Z a-z 0-9 . _ - (and not `anonymous`)");
                }
            }
            let expires_at_ms = expires.as_deref().map(|e| parse_span(e).map(|ms| now + ms)).transpose()?;
            let path = cfg.acl.tokens_path(&cfg.data_dir);
            let mut file = TokenFile::load(&path)?;
            let (entry, secret) = file.create(policies, description, now, expires_at_ms);
            if let Some(last) = file.tokens.last_mut() {
                last.principal = principal;
            }
            file.store(&path)?;
            let rec = crate::audit::Record {
                principal: "local".into(),
                client: "local".into(),
                action: "token_create".into(),
                target: entry.id.clone(),
                outcome: "ok".into(),
                detail: Some(format!("policies {}", entry.policies.join(","))),
                ..Default::default()
            };
            if let Err(e) = crate::audit::append_local(&cfg, rec) {
                eprintln!("warning: cannot write the audit log: {e}");
            }
            eprintln!(
                "token {} created in {}; reload the node to use it. The secret below is shown once:",
                entry.id,
                path.display()
            );
            println!("{secret}");
        }
        TokenCommand::List { config } => {
            let cfg = Config::load(&config).with_context(|| format!("cannot load {}", config.display()))?;
            let file = TokenFile::load(&cfg.acl.tokens_path(&cfg.data_dir))?;
            for t in &file.tokens {
                let expiry = match t.expires_at_ms {
                    Some(at) if at <= now => "expired".to_owned(),
                    Some(at) => format!("expires in {} s", (at - now) / 1000),
                    None => "no expiry".to_owned(),
                };
                println!("{}\t{}\t{}\t{}", t.id, t.policies.join(","), expiry, t.description);
            }
        }
    }
    Ok(())
}

/// `90d`, `12h`, `30m`, `45s` -> ms.
fn parse_span(s: &str) -> anyhow::Result<u64> {
    let bad = || anyhow::anyhow!("--expires {s:?}: use a span such as 90d, 12h or 30m");
    let i = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = s.split_at(i);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let unit_ms = match unit {
        "d" => 86_400_000,
        "h" => 3_600_000,
        "m" => 60_000,
        "s" => 1_000,
        _ => return Err(bad()),
    };
    n.checked_mul(unit_ms).filter(|ms| *ms > 0).ok_or_else(bad)
}
