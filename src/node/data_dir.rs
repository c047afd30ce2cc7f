//! The data dir's permissions: RocksDB's files hold every registration, so the dir is
//! created 0700 and a dir that group or others may write (and so swap files in) refuses
//! the start.

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
}
