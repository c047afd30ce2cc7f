//! Writing generated PEM files: through a temporary file in the same directory, then a
//! rename (overwrite) or a hard link (refuses an existing file), keys with mode 0600, so a
//! concurrent reader sees the old or the new file, never half of one.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use super::{GeneratedCert, TlsError};

impl GeneratedCert {
    /// Writes the key (mode 0600) and the certificate, each by temporary file and rename so
    /// that a concurrent reader sees the old or the new file, never a mix. Without
    /// `overwrite`, fails with [`TlsError::Exists`] before writing if either file exists.
    pub fn write(&self, cert_path: &Path, key_path: &Path, overwrite: bool) -> Result<(), TlsError> {
        if !overwrite {
            refuse_existing(&[cert_path, key_path])?;
        }
        write_file(key_path, self.key_pem.as_bytes(), Privacy::Private, overwrite)?;
        write_file(cert_path, self.cert_pem.as_bytes(), Privacy::Public, overwrite)
    }
}

pub(super) fn refuse_existing(paths: &[&Path]) -> Result<(), TlsError> {
    for path in paths {
        // symlink_metadata: a dangling symlink also counts as "exists".
        if fs::symlink_metadata(path).is_ok() {
            return Err(TlsError::Exists { path: path.to_path_buf() });
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Privacy {
    /// Mode 0600: private keys.
    Private,
    /// Mode 0644: certificates.
    Public,
}

/// Writes `contents` to `path` through a temporary file in the same directory, then
/// renames it into place (`overwrite`) or hard-links it, which fails if `path` exists.
fn write_file(path: &Path, contents: &[u8], privacy: Privacy, overwrite: bool) -> Result<(), TlsError> {
    let write_error = |source| TlsError::Write { path: path.to_owned(), source };
    let file_name = path
        .file_name()
        .ok_or_else(|| write_error(io::Error::new(io::ErrorKind::InvalidInput, "path has no file name")))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);

    let result = write_tmp_then_place(&tmp, path, contents, privacy, overwrite);
    if result.is_err() {
        // Best effort: the temporary file is ours and useless now.
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(|source| match source.kind() {
        io::ErrorKind::AlreadyExists => TlsError::Exists { path: path.to_owned() },
        _ => write_error(source),
    })
}

fn write_tmp_then_place(
    tmp: &Path,
    path: &Path,
    contents: &[u8],
    privacy: Privacy,
    overwrite: bool,
) -> io::Result<()> {
    // A stale temporary file from a crashed run would make create_new fail.
    match fs::remove_file(tmp) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(match privacy {
            Privacy::Private => 0o600,
            Privacy::Public => 0o644,
        });
    }
    #[cfg(not(unix))]
    let _ = privacy;
    let mut file = options.open(tmp)?;
    file.write_all(contents)?;
    file.sync_all()?;
    drop(file);
    if overwrite {
        fs::rename(tmp, path)
    } else {
        fs::hard_link(tmp, path)?;
        fs::remove_file(tmp)
    }
}
