//! The data dir's permissions: RocksDB's files hold every registration, so the dir is
//! created 0700 and a dir that group or others may write (and so swap files in) refuses
//! the start. Also the node's own secret for QUIC stateless resets, kept in the data dir.

use std::path::Path;

use anyhow::Context as _;

/// Creates `dir` (mode 0700, parents too) if it is missing, and refuses one that group or
/// others may write. A dir others may read is allowed but logged.
pub fn prepare(dir: &Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("cannot create data_dir {}", dir.display()))?;
        }
        let meta =
            std::fs::metadata(dir).with_context(|| format!("cannot read data_dir {}", dir.display()))?;
        if !meta.is_dir() {
            anyhow::bail!("data_dir {} is not a directory", dir.display());
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o022 != 0 {
            anyhow::bail!(
                "data_dir {} is writable by group or others (mode {mode:o}); run chmod 700 on it",
                dir.display()
            );
        }
        if mode & 0o077 != 0 {
            tracing::warn!(
                dir = %dir.display(),
                mode = format_args!("{mode:o}"),
                "data_dir is readable by group or others: they can read every registration; use mode 0700"
            );
        }
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create data_dir {}", dir.display()))?;
    Ok(())
}

/// The file, in the data dir, of the node's QUIC stateless-reset secret.
pub const RESET_SECRET_FILE: &str = "stateless-reset.key";

/// The node's secret for QUIC stateless resets: 32 random bytes made at the first start and
/// kept 0600 in the data dir. Per node, not derived from the DC's key, so nodes that share
/// a DC certificate never share it; stable across restarts, so a restarted node resets the
/// connections its previous process left open at peers at once.
pub fn reset_secret(dir: &Path) -> anyhow::Result<[u8; 32]> {
    let path = dir.join(RESET_SECRET_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt as _;
                let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
                if mode & 0o077 != 0 {
                    anyhow::bail!(
                        "{} is readable by group or others (mode {mode:o}); run chmod 600 on it",
                        path.display()
                    );
                }
            }
            <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
                anyhow::anyhow!(
                    "{} holds {} bytes, expected 32; delete it to make a new one",
                    path.display(),
                    bytes.len()
                )
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut secret = [0u8; 32];
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
                .map_err(|_| anyhow::anyhow!("no randomness for the stateless-reset secret"))?;
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt as _;
                opts.mode(0o600);
            }
            let mut f = opts.open(&path).with_context(|| format!("cannot create {}", path.display()))?;
            std::io::Write::write_all(&mut f, &secret)?;
            f.sync_all()?;
            Ok(secret)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_new_dir_is_private_and_a_writable_one_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/b");
        prepare(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o775)).unwrap();
        let e = prepare(&d).unwrap_err().to_string();
        assert!(e.contains("writable by group or others") && e.contains("775"), "{e}");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare(&d).unwrap();
    }

    #[test]
    fn the_reset_secret_is_random_per_node_private_and_stable() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = reset_secret(a.path()).unwrap();
        assert_eq!(reset_secret(a.path()).unwrap(), first, "stable across restarts");
        assert_ne!(reset_secret(b.path()).unwrap(), first, "per node");
        let path = a.path().join(RESET_SECRET_FILE);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(reset_secret(a.path()).unwrap_err().to_string().contains("chmod 600"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, b"short").unwrap();
        assert!(reset_secret(a.path()).unwrap_err().to_string().contains("expected 32"));
    }
}
