//! The disk snapshot of a consumer's cache: one JSON file per service, so that a process
//! that starts while no registry node answers still has the last known instances.
//!
//! File: `<dir>/<namespace>@<service>.json` (':' in names written as `%3A`; '@' and '%'
//! never occur in names, so the mapping is one to one). Written atomically: a temporary file
//! in the same directory, fsync, rename over the old file, fsync of the directory. Read with
//! a size bound, and checked: the format version, the namespace and service, the instance
//! count. A file that fails any check is ignored, never half used.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::model::{normalize, FailoverInfo, Instance, ServiceView, ViewSource};

/// Version of the file layout; another version is ignored.
pub const SNAPSHOT_FORMAT: u32 = 1;

/// The file layout (version 1). Its own type, so that the format changes only on purpose.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotFile {
    format: u32,
    namespace: String,
    service: String,
    index: u64,
    /// Wall clock, ms since the Unix epoch.
    saved_at_ms: u64,
    instances: Vec<Instance>,
    #[serde(default)]
    failover: Option<FailoverInfo>,
    #[serde(default)]
    protected: bool,
}

/// Why a snapshot was not used.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("snapshot {path} is larger than {bytes_max} bytes; ignored")]
    TooLarge { path: PathBuf, bytes_max: u64 },
    #[error("snapshot {path} is unusable: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// Where the snapshot of `namespace/service` lives in `dir`.
pub fn path_for(dir: &Path, namespace: &str, service: &str) -> PathBuf {
    let esc = |s: &str| s.replace(':', "%3A");
    dir.join(format!("{}@{}.json", esc(namespace), esc(service)))
}

/// Writes `view` atomically; `saved_at_ms` is the wall-clock time to record.
pub fn write(dir: &Path, view: &ServiceView, saved_at_ms: u64) -> Result<PathBuf, SnapshotError> {
    let path = path_for(dir, &view.namespace, &view.service);
    let io = |source| SnapshotError::Io { path: path.clone(), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    let file = SnapshotFile {
        format: SNAPSHOT_FORMAT,
        namespace: view.namespace.clone(),
        service: view.service.clone(),
        index: view.index,
        saved_at_ms,
        instances: view.instances.clone(),
        failover: view.failover.clone(),
        protected: view.protected,
    };
    let bytes = serde_json::to_vec_pretty(&file)
        .map_err(|e| SnapshotError::Invalid { path: path.clone(), reason: e.to_string() })?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("snapshot");
    let tmp = dir.join(format!(".{name}.tmp-{}-{:016x}", std::process::id(), rand::random::<u64>()));
    let res = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        // Make the rename itself durable; a failure here leaves a valid file either way.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res.map_err(io)?;
    Ok(path)
}

/// Reads the snapshot of `namespace/service` from `dir`: `Ok(None)` when there is none.
pub fn read(
    dir: &Path,
    namespace: &str,
    service: &str,
    bytes_max: u64,
    instances_max: usize,
) -> Result<Option<ServiceView>, SnapshotError> {
    let path = path_for(dir, namespace, service);
    let f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(SnapshotError::Io { path, source }),
    };
    let mut bytes = Vec::new();
    f.take(bytes_max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| SnapshotError::Io { path: path.clone(), source })?;
    if bytes.len() as u64 > bytes_max {
        return Err(SnapshotError::TooLarge { path, bytes_max });
    }
    let invalid = |reason: String| SnapshotError::Invalid { path: path.clone(), reason };
    let file: SnapshotFile = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    if file.format != SNAPSHOT_FORMAT {
        return Err(invalid(format!("format {} (this SDK reads {SNAPSHOT_FORMAT})", file.format)));
    }
    if file.namespace != namespace || file.service != service {
        return Err(invalid(format!("holds {}/{}, not {namespace}/{service}", file.namespace, file.service)));
    }
    if file.instances.len() > instances_max {
        return Err(invalid(format!(
            "{} instances, more than instances_max {instances_max}",
            file.instances.len()
        )));
    }
    Ok(Some(ServiceView {
        namespace: file.namespace,
        service: file.service,
        index: file.index,
        instances: normalize(file.instances),
        failover: file.failover,
        protected: file.protected,
        source: ViewSource::Snapshot { saved_at_ms: file.saved_at_ms },
    }))
}
