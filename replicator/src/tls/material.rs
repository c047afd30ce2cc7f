//! A DC's TLS material read from its PEM files: where the files are ([`TlsPaths`]), the
//! loaded and cross-checked certificate chain, key and CA roots ([`TlsMaterial`]), and the
//! readers that turn files into it with errors naming the file at fault.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;

use super::config::ring_provider;
use super::identity::{capped, cert_dns_names, single_dc_name, single_node_name, NodeName};
use super::{FileRole, TlsError};

/// Where a DC's TLS material lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPaths {
    /// PEM file with the CA certificate(s) that peers' certificates must chain to.
    pub ca_cert: PathBuf,
    /// PEM file with this DC's certificate, end-entity first, then any intermediates.
    pub cert: PathBuf,
    /// PEM file with this DC's private key (PKCS#8, SEC1 or PKCS#1).
    pub key: PathBuf,
}

/// A DC's loaded and cross-checked TLS material.
///
/// Loading checks that each file parses, that the key matches the certificate and that the
/// certificate names exactly one DC. It does not judge validity dates or the chain to the
/// CA: [`TlsMaterial::check_chain`] does (and [`ReloadableTls`](super::ReloadableTls) runs
/// it), so that tests and tools can load a deliberately bad certificate.
pub struct TlsMaterial {
    paths: TlsPaths,
    pub(super) roots: Arc<RootCertStore>,
    pub(super) chain: Vec<CertificateDer<'static>>,
    pub(super) key: PrivateKeyDer<'static>,
    pub(super) dc: String,
    /// For a node's certificate (the member link): which node it names.
    pub(super) node: Option<NodeName>,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key is deliberately absent.
        f.debug_struct("TlsMaterial")
            .field("paths", &self.paths)
            .field("dc", &self.dc)
            .field("node", &self.node)
            .field("ca_certs", &self.roots.roots.len())
            .field("chain_len", &self.chain.len())
            .finish_non_exhaustive()
    }
}

impl TlsMaterial {
    /// Reads and cross-checks the three files.
    pub fn load(paths: &TlsPaths) -> Result<TlsMaterial, TlsError> {
        let roots = load_roots(&paths.ca_cert)?;
        let chain = load_cert_chain(FileRole::Cert, &paths.cert)?;
        // load_cert_chain never returns an empty chain.
        let names = cert_dns_names(&chain[0]).map_err(|source| TlsError::BadCertificate {
            role: FileRole::Cert,
            path: paths.cert.clone(),
            source,
        })?;
        let (dc, node) = match (single_dc_name(&names), single_node_name(&names)) {
            (Some(dc), _) => (dc, None),
            (None, Some(node)) => (node.dc.clone(), Some(node)),
            (None, None) => {
                return Err(TlsError::CertDcName {
                    path: paths.cert.clone(),
                    names: capped(names.iter().copied()),
                })
            }
        };
        let key = load_key_for(&chain, &paths.cert, &paths.key)?;
        Ok(TlsMaterial { paths: paths.clone(), roots: Arc::new(roots), chain, key, dc, node })
    }

    /// The files this material was read from.
    pub fn paths(&self) -> &TlsPaths {
        &self.paths
    }

    /// The DC this material identifies (the DNS SAN of the own certificate, or the DC of
    /// the node it names).
    pub fn dc(&self) -> &str {
        &self.dc
    }

    /// The node this material identifies, for a node's certificate; `None` for a DC's.
    pub fn node(&self) -> Option<&NodeName> {
        self.node.as_ref()
    }

    /// The name the certificate carries: the DC's (`dc-a`) or the node's
    /// (`n1.dc-a.tandem-node`).
    pub fn identity(&self) -> String {
        match &self.node {
            Some(node) => node.dns_name(),
            None => self.dc.clone(),
        }
    }

    /// Fails unless this is a DC's certificate (the replication link's).
    pub(crate) fn require_dc(&self) -> Result<(), TlsError> {
        match self.node {
            None => Ok(()),
            Some(_) => Err(self.kind_error("the DC replication link", "a DC certificate")),
        }
    }

    /// Fails unless this is a node's certificate (the member link's).
    pub(crate) fn require_node(&self) -> Result<&NodeName, TlsError> {
        self.node.as_ref().ok_or_else(|| self.kind_error("the member link", "a node certificate"))
    }

    fn kind_error(&self, link: &'static str, needed: &'static str) -> TlsError {
        let found = match &self.node {
            Some(node) => format!("a certificate of {node}"),
            None => format!("a certificate of DC {}", self.dc),
        };
        TlsError::CertKind { path: self.paths.cert.clone(), found, link, needed }
    }

    /// The own end-entity certificate.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.chain[0]
    }

    /// Checks that the own certificate chains to the CA at `now` for both server and client
    /// authentication (the link uses one certificate in both roles).
    pub fn check_chain(&self, now: SystemTime) -> Result<(), TlsError> {
        let end_entity = webpki::EndEntityCert::try_from(&self.chain[0]).map_err(|source| {
            TlsError::BadCertificate { role: FileRole::Cert, path: self.paths.cert.clone(), source }
        })?;
        let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
        let time = UnixTime::since_unix_epoch(since_epoch);
        let provider = ring_provider();
        let usages = [
            (webpki::KeyUsage::server_auth(), "server authentication"),
            (webpki::KeyUsage::client_auth(), "client authentication"),
        ];
        for (usage, usage_name) in usages {
            end_entity
                .verify_for_usage(
                    provider.signature_verification_algorithms.all,
                    &self.roots.roots,
                    &self.chain[1..],
                    time,
                    usage,
                    None,
                    None,
                )
                .map_err(|source| TlsError::CertNotTrusted {
                    cert: self.paths.cert.clone(),
                    ca: self.paths.ca_cert.clone(),
                    usage: usage_name,
                    source,
                })?;
        }
        Ok(())
    }
}

/// The trust anchors of a CA file (one or more PEM certificates). Also what the node's
/// HTTPS listener reads its client CA with.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let ca_certs = load_cert_chain(FileRole::CaCert, path)?;
    let mut roots = RootCertStore::empty();
    for der in &ca_certs {
        let anchor = webpki::anchor_from_trusted_cert(der).map_err(|source| TlsError::BadCertificate {
            role: FileRole::CaCert,
            path: path.to_owned(),
            source,
        })?;
        roots.roots.push(anchor.to_owned());
    }
    Ok(roots)
}

/// Every certificate of a PEM file, in file order (end-entity first for a chain); never
/// empty on success.
pub fn load_cert_chain(role: FileRole, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_file(role, path)?;
    parse_certs(role, path, &pem)
}

/// The private key of `key_path` (PKCS#8, SEC1 or PKCS#1) after the file's owner and mode
/// checks (refused when another user owns it or group or others may write it), checked to
/// belong to `chain`'s end-entity certificate (read from `cert_path`).
pub fn load_key_for(
    chain: &[CertificateDer<'static>],
    cert_path: &Path,
    key_path: &Path,
) -> Result<PrivateKeyDer<'static>, TlsError> {
    let key_pem = read_file(FileRole::Key, key_path)?;
    let key =
        PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| pem_error(FileRole::Key, key_path, error))?;
    check_key_file(key_path)?;
    match CertifiedKey::from_der(chain.to_vec(), key.clone_key(), &ring_provider()) {
        Ok(_) => Ok(key),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::KeyMismatch { cert: cert_path.to_owned(), key: key_path.to_owned() })
        }
        Err(source) => Err(TlsError::BadKey { path: key_path.to_owned(), source }),
    }
}

fn read_file(role: FileRole, path: &Path) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => TlsError::Missing { role, path: path.to_owned() },
        _ => TlsError::Read { role, path: path.to_owned(), source },
    })
}

/// All certificates in a PEM file; never empty on success.
fn parse_certs(
    role: FileRole,
    path: &Path,
    pem_bytes: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem_bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| pem_error(role, path, error))?;
    if certs.is_empty() {
        return Err(TlsError::NoPemItem { role, path: path.to_owned() });
    }
    Ok(certs)
}

fn pem_error(role: FileRole, path: &Path, error: pem::Error) -> TlsError {
    match error {
        pem::Error::NoItemsFound => TlsError::NoPemItem { role, path: path.to_owned() },
        source => TlsError::Pem { role, path: path.to_owned(), source },
    }
}

/// Refuses a key file owned by another user (neither this process's nor root's) or
/// writable by group or others: whoever can replace it can impersonate the DC. Logs a
/// warning if group or others may only read it (refusing would turn a hygiene issue into
/// an outage).
fn check_key_file(path: &Path) -> Result<(), TlsError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let unsafe_file = |problem: String| TlsError::KeyFileUnsafe { path: path.to_owned(), problem };
        let Ok(metadata) = fs::metadata(path) else { return Ok(()) };
        let mode = metadata.mode() & 0o777;
        let me = effective_uid();
        if metadata.uid() != me && metadata.uid() != 0 {
            return Err(unsafe_file(format!(
                "is owned by uid {} (this process runs as uid {me})",
                metadata.uid()
            )));
        }
        if mode & 0o022 != 0 {
            return Err(unsafe_file(format!("is writable by group or others (mode {mode:o})")));
        }
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format_args!("{mode:o}"),
                "private key file is readable by group or others; use mode 0600"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

#[cfg(unix)]
#[allow(unsafe_code)]
fn effective_uid() -> u32 {
    // SAFETY: geteuid takes no arguments, touches no memory and cannot fail.
    unsafe { libc::geteuid() }
}
