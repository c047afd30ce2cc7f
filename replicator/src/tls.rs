//! Mutual TLS for the replication link between DC gateways.
//!
//! What this module does:
//! - Loads a DC's TLS material (CA certificate, own certificate chain, private key) from PEM
//!   files, with errors that name the file and say what is wrong with it.
//! - Builds quinn server and client configurations that require *mutual* authentication
//!   against the configured CA: the server demands a client certificate, the client checks
//!   that the server certificate carries the DC name it dialled (`server_name` = peer DC).
//! - Tells the caller which DC is on the other end of an established connection
//!   ([`peer_dc`]): the single DNS subject alternative name of the peer's certificate.
//! - Reloads material without a restart ([`ReloadableTls`]).
//! - Generates a development PKI ([`generate_dev_pki`]) and single DC certificates
//!   ([`generate_dc_cert`]) for tests, rotation drills and local setups.
//!
//! Rotation: write the new certificate and key over the old files (this module's writers
//! replace files by rename, so a reader never sees half a file), then call
//! [`ReloadableTls::reload`] (the daemon does that on SIGHUP) and hand the fresh
//! [`ReloadableTls::server_config`] to `quinn::Endpoint::set_server_config`; dialling code
//! builds a fresh [`ReloadableTls::client_config`] per connection attempt. quinn applies a
//! new server config to *new* connections only: established connections and their streams
//! continue under the keys they were handshaken with. A reload that fails (unreadable file,
//! key that does not match the certificate, certificate not valid under the CA, or a
//! certificate for a different DC) leaves the material in use unchanged. Between the
//! replacement of the certificate file and the key file a reload may see a mismatched pair;
//! it is refused, and a later reload picks up the complete pair.
//!
//! Architecture invariants (what this module must never do):
//! - It never uses a process-default rustls `CryptoProvider`: every config is built with
//!   the *ring* provider passed in explicitly, so linking another provider changes nothing.
//! - It never accepts a peer without a certificate chain verified against the configured CA,
//!   never offers an unauthenticated fallback, and never resumes TLS sessions: every
//!   connection gets a full handshake, so an expired or rotated certificate takes effect on
//!   the next connection.
//! - It never decides which DCs may connect: [`peer_dc`] reports the authenticated name and
//!   the caller checks it against its configured peers.
//! - It never logs, prints or `Debug`-formats private key bytes.
//! - It never panics on bytes from the network (peer certificates are parsed fallibly).
//! - It reads no clock except where documented: [`ReloadableTls`] checks validity "now",
//!   and the dev generators stamp "now" into new certificates.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;

/// File name of the development CA certificate written by [`generate_dev_pki`].
pub const DEV_CA_CERT_FILE: &str = "ca.pem";
/// File name of the development CA private key written by [`generate_dev_pki`].
pub const DEV_CA_KEY_FILE: &str = "ca.key";
/// How long a DC certificate made by [`generate_dev_pki`] is valid.
pub const DEV_DC_CERT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// How long the development CA made by [`generate_dev_pki`] is valid (longer than a DC
/// certificate, so DC certificates can be rotated under the same CA).
pub const DEV_CA_VALIDITY: Duration = Duration::from_secs(5 * 365 * 24 * 60 * 60);
/// How far back [`generate_dev_pki`] dates `not_before`, to tolerate clock skew between DCs.
pub const DEV_CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(60 * 60);
/// Longest DC name accepted (a DNS label is at most 63 bytes; a DC name may have dots).
pub const DC_NAME_BYTES_MAX: usize = 253;

/// Subject common name of every development CA; [`generate_dc_cert`] relies on it.
const DEV_CA_COMMON_NAME: &str = "tandem development CA";
const DEV_CA_ORGANIZATION: &str = "tandem";
/// Latest instant a certificate may name: 9999-12-31T23:59:59Z (X.509 GeneralizedTime).
const CERT_TIME_SECS_MAX: u64 = 253_402_300_799;
/// At most this many names are copied into an error about a certificate's names.
const ERROR_NAMES_MAX: usize = 8;

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

/// Which of the three files an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileRole {
    /// The CA certificate file ([`TlsPaths::ca_cert`]).
    CaCert,
    /// The DC's own certificate file ([`TlsPaths::cert`]).
    Cert,
    /// The DC's private key file ([`TlsPaths::key`]).
    Key,
}

impl fmt::Display for FileRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileRole::CaCert => "CA certificate",
            FileRole::Cert => "certificate",
            FileRole::Key => "private key",
        })
    }
}

/// Everything that can go wrong in this module.
///
/// Loading and config-building variants never change state: a failed
/// [`ReloadableTls::reload`] keeps the material in use. Generation variants say what may
/// already be on disk.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file that must exist does not. Nothing changed.
    #[error("{role} file {path} does not exist")]
    Missing { role: FileRole, path: PathBuf },

    /// A file exists but could not be read. Nothing changed.
    #[error("cannot read {role} file {path}: {source}")]
    Read { role: FileRole, path: PathBuf, source: io::Error },

    /// A file is not well-formed PEM. Nothing changed.
    #[error("{role} file {path} is not valid PEM: {source}")]
    Pem { role: FileRole, path: PathBuf, source: pem::Error },

    /// A file is readable but holds no PEM item of the kind its role needs. Nothing changed.
    #[error("{role} file {path} contains no PEM {role}")]
    NoPemItem { role: FileRole, path: PathBuf },

    /// A certificate in a file is not a parsable X.509 v3 certificate (or, for the CA file,
    /// not usable as a trust anchor). Nothing changed.
    #[error("{role} file {path} holds an unusable certificate: {source}")]
    BadCertificate { role: FileRole, path: PathBuf, source: webpki::Error },

    /// The private key cannot be used by the ring provider (unsupported algorithm or
    /// malformed key). Nothing changed.
    #[error("private key file {path} is not usable: {source}")]
    BadKey { path: PathBuf, source: rustls::Error },

    /// The private key does not belong to the certificate. Nothing changed.
    #[error("private key file {key} does not match the certificate in {cert}")]
    KeyMismatch { cert: PathBuf, key: PathBuf },

    /// The certificate does not carry exactly one DNS subject alternative name that is a
    /// valid DC name, so it cannot identify a DC. Nothing changed.
    #[error(
        "certificate file {path} must carry exactly one DNS subject alternative name that is a \
         valid DC name (lowercase letters, digits, '-', '.'); found {names:?}"
    )]
    CertDcName { path: PathBuf, names: Vec<String> },

    /// The certificate does not chain to the CA for the named usage at the given time
    /// (expired, not yet valid, signed by another CA, missing extended key usage). Nothing
    /// changed.
    #[error("certificate file {cert} is not valid for {usage} under the CA in {ca}: {source}")]
    CertNotTrusted { cert: PathBuf, ca: PathBuf, usage: &'static str, source: webpki::Error },

    /// A reload found a certificate for a different DC than the one in use. A DC's identity
    /// does not change by rotation; restart with new configuration instead. Nothing changed.
    #[error("certificate file {path} is for DC {reloaded:?}, but the material in use is for DC {loaded:?}")]
    IdentityChanged { path: PathBuf, loaded: String, reloaded: String },

    /// A file to be generated already exists and overwriting was not requested. Nothing was
    /// written (all targets are checked before the first write).
    #[error("refusing to overwrite existing file {path}")]
    Exists { path: PathBuf },

    /// Writing a generated file failed. Files written before this one stay written; the
    /// named file is either absent or unchanged (writes go through a temporary file and a
    /// rename).
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: io::Error },

    /// A DC name is not usable as a certificate name and file name. Nothing changed.
    #[error("invalid DC name {name:?}: {reason}")]
    InvalidDcName { name: String, reason: &'static str },

    /// The same DC name was given twice. Nothing changed.
    #[error("DC name {name:?} given more than once")]
    DuplicateDc { name: String },

    /// A validity period is empty or outside what a certificate can express. Nothing changed.
    #[error("invalid certificate validity: {reason}")]
    InvalidValidity { reason: &'static str },

    /// Certificate or key generation failed inside rcgen. Nothing was written.
    #[error("cannot generate {what}: {source}")]
    Generate { what: &'static str, source: rcgen::Error },

    /// The CA certificate PEM given to [`generate_dc_cert`] is not usable. Nothing changed.
    #[error("CA certificate PEM is not usable: {reason}")]
    CaCertInput { reason: CaInputError },

    /// The CA key PEM given to [`generate_dc_cert`] is not usable. Nothing changed.
    #[error("CA private key PEM is not usable: {source}")]
    CaKeyInput { source: rcgen::Error },

    /// The CA certificate and key given to [`generate_dc_cert`] do not belong together, or
    /// the CA was not made by [`generate_dev_ca`]/[`generate_dev_pki`] (only such a CA can
    /// sign here; use real PKI tooling for any other CA). Nothing changed.
    #[error(
        "the CA certificate was not made by tandem's dev PKI generator with this CA key; \
         generate_dc_cert can only sign with a tandem development CA"
    )]
    NotDevCa,

    /// An ALPN protocol id must be 1 to 255 bytes. Nothing changed.
    #[error("ALPN protocol id must be 1..=255 bytes, got {len}")]
    Alpn { len: usize },

    /// The transport tuning is inconsistent. Nothing changed.
    #[error("invalid transport tuning: {reason}")]
    Tuning { reason: &'static str },

    /// rustls refused to build a configuration. Nothing changed.
    #[error("cannot build TLS {what}: {source}")]
    Rustls { what: &'static str, source: rustls::Error },

    /// rustls refused to build the client certificate verifier (for example, an empty CA
    /// file). Nothing changed.
    #[error("cannot build client certificate verifier: {source}")]
    Verifier { source: rustls::server::VerifierBuilderError },

    /// quinn cannot use the TLS configuration (no QUIC initial cipher suite). Nothing changed.
    #[error("TLS configuration is not usable for QUIC: {source}")]
    QuicCrypto { source: quinn::crypto::rustls::NoInitialCipherSuite },

    /// The connection carries no peer certificate chain (handshake incomplete, or a TLS
    /// configuration not built by this module).
    #[error("the peer presented no certificate")]
    NoPeerCertificate,

    /// The peer's end-entity certificate cannot be parsed.
    #[error("the peer's certificate cannot be parsed: {source}")]
    PeerCertificate { source: webpki::Error },

    /// The peer's certificate does not carry exactly one DNS subject alternative name that
    /// is a valid DC name.
    #[error(
        "the peer's certificate must carry exactly one DNS subject alternative name that is a \
         valid DC name; found {names:?}"
    )]
    PeerDcName { names: Vec<String> },
}

/// Why a CA certificate PEM given to [`generate_dc_cert`] is unusable.
#[derive(Debug, thiserror::Error)]
pub enum CaInputError {
    /// Not well-formed PEM, or no certificate in it.
    #[error("{0}")]
    Pem(pem::Error),
    /// Not a parsable certificate.
    #[error("{0}")]
    Certificate(webpki::Error),
}

/// QUIC transport settings for the replication link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportTuning {
    /// How often an idle connection sends a keep-alive (so NATs and the idle timer stay
    /// open, and a dead path is noticed).
    pub keep_alive_interval: Duration,
    /// How long without any packet from the peer before the connection is declared dead.
    /// Must exceed `keep_alive_interval`. quinn uses the smaller of both sides' values.
    pub idle_timeout: Duration,
}

impl Default for TransportTuning {
    fn default() -> Self {
        // A dead peer is noticed within 3 s (keep-alives every 500 ms keep a live one open).
        TransportTuning {
            keep_alive_interval: Duration::from_millis(500),
            idle_timeout: Duration::from_secs(3),
        }
    }
}

impl TransportTuning {
    /// The quinn transport config for these settings.
    pub fn transport_config(&self) -> Result<quinn::TransportConfig, TlsError> {
        if self.keep_alive_interval.is_zero() {
            return Err(TlsError::Tuning { reason: "keep_alive_interval must be greater than zero" });
        }
        if self.keep_alive_interval >= self.idle_timeout {
            return Err(TlsError::Tuning { reason: "keep_alive_interval must be shorter than idle_timeout" });
        }
        let idle_timeout = quinn::IdleTimeout::try_from(self.idle_timeout)
            .map_err(|_| TlsError::Tuning { reason: "idle_timeout is too large for QUIC" })?;
        let mut config = quinn::TransportConfig::default();
        config.keep_alive_interval(Some(self.keep_alive_interval)).max_idle_timeout(Some(idle_timeout));
        Ok(config)
    }
}

/// A DC's loaded and cross-checked TLS material.
///
/// Loading checks that each file parses, that the key matches the certificate and that the
/// certificate names exactly one DC. It does not judge validity dates or the chain to the
/// CA: [`TlsMaterial::check_chain`] does (and [`ReloadableTls`] runs it), so that tests and
/// tools can load a deliberately bad certificate.
pub struct TlsMaterial {
    paths: TlsPaths,
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    dc: String,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key is deliberately absent.
        f.debug_struct("TlsMaterial")
            .field("paths", &self.paths)
            .field("dc", &self.dc)
            .field("ca_certs", &self.roots.roots.len())
            .field("chain_len", &self.chain.len())
            .finish_non_exhaustive()
    }
}

impl TlsMaterial {
    /// Reads and cross-checks the three files.
    pub fn load(paths: &TlsPaths) -> Result<TlsMaterial, TlsError> {
        let ca_pem = read_file(FileRole::CaCert, &paths.ca_cert)?;
        let ca_certs = parse_certs(FileRole::CaCert, &paths.ca_cert, &ca_pem)?;
        let mut roots = RootCertStore::empty();
        for der in &ca_certs {
            let anchor = webpki::anchor_from_trusted_cert(der).map_err(|source| {
                TlsError::BadCertificate { role: FileRole::CaCert, path: paths.ca_cert.clone(), source }
            })?;
            roots.roots.push(anchor.to_owned());
        }

        let cert_pem = read_file(FileRole::Cert, &paths.cert)?;
        let chain = parse_certs(FileRole::Cert, &paths.cert, &cert_pem)?;
        // parse_certs never returns an empty chain.
        let names = cert_dns_names(&chain[0]).map_err(|source| TlsError::BadCertificate {
            role: FileRole::Cert,
            path: paths.cert.clone(),
            source,
        })?;
        let dc = single_dc_name(&names).ok_or_else(|| TlsError::CertDcName {
            path: paths.cert.clone(),
            names: capped(names.iter().copied()),
        })?;

        let key_pem = read_file(FileRole::Key, &paths.key)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|error| pem_error(FileRole::Key, &paths.key, error))?;
        warn_if_key_exposed(&paths.key);
        match CertifiedKey::from_der(chain.clone(), key.clone_key(), &ring_provider()) {
            Ok(_) => {}
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
                return Err(TlsError::KeyMismatch { cert: paths.cert.clone(), key: paths.key.clone() });
            }
            Err(source) => {
                return Err(TlsError::BadKey { path: paths.key.clone(), source });
            }
        }

        Ok(TlsMaterial { paths: paths.clone(), roots: Arc::new(roots), chain, key, dc })
    }

    /// The files this material was read from.
    pub fn paths(&self) -> &TlsPaths {
        &self.paths
    }

    /// The DC this material identifies (the DNS SAN of the own certificate).
    /// A secret for QUIC stateless resets, derived from this DC's private key: stable
    /// across restarts, so a restarted node resets the connections its previous process
    /// left open at peers at once instead of leaving them to the idle timeout.
    pub fn stateless_reset_secret(&self) -> [u8; 32] {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"tandem stateless reset v1\0");
        ctx.update(self.key.secret_der());
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }

    pub fn dc(&self) -> &str {
        &self.dc
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

/// A quinn server config with default [`TransportTuning`]; see [`server_config_tuned`].
pub fn server_config(m: &TlsMaterial, alpn: &[u8]) -> Result<quinn::ServerConfig, TlsError> {
    server_config_tuned(m, alpn, &TransportTuning::default())
}

/// A quinn server config that presents `m`'s certificate, requires a client certificate
/// that chains to `m`'s CA, speaks only TLS 1.3 with the single ALPN id `alpn`, and never
/// resumes sessions or accepts 0-RTT data.
pub fn server_config_tuned(
    m: &TlsMaterial,
    alpn: &[u8],
    tuning: &TransportTuning,
) -> Result<quinn::ServerConfig, TlsError> {
    check_alpn(alpn)?;
    let transport = tuning.transport_config()?;
    let provider = ring_provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(m.roots.clone(), provider.clone())
        .build()
        .map_err(|source| TlsError::Verifier { source })?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|source| TlsError::Rustls { what: "server protocol versions", source })?
        .with_client_cert_verifier(verifier)
        .with_single_cert(m.chain.clone(), m.key.clone_key())
        .map_err(|source| TlsError::Rustls { what: "server certificate", source })?;
    tls.alpn_protocols = vec![alpn.to_vec()];
    // Full handshake on every connection: rotation and expiry apply at once, and the
    // link opens rarely enough that resumption would buy nothing.
    tls.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    tls.send_tls13_tickets = 0;
    tls.max_early_data_size = 0;
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|source| TlsError::QuicCrypto { source })?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// A quinn client config with default [`TransportTuning`]; see [`client_config_tuned`].
pub fn client_config(m: &TlsMaterial, alpn: &[u8]) -> Result<quinn::ClientConfig, TlsError> {
    client_config_tuned(m, alpn, &TransportTuning::default())
}

/// A quinn client config that presents `m`'s certificate and accepts a server only if its
/// certificate chains to `m`'s CA and names the `server_name` passed to
/// `Endpoint::connect_with`, which must be the peer's DC name. TLS 1.3 only, single ALPN id
/// `alpn`, no session resumption, no 0-RTT.
pub fn client_config_tuned(
    m: &TlsMaterial,
    alpn: &[u8],
    tuning: &TransportTuning,
) -> Result<quinn::ClientConfig, TlsError> {
    check_alpn(alpn)?;
    let transport = tuning.transport_config()?;
    let mut tls = rustls::ClientConfig::builder_with_provider(ring_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|source| TlsError::Rustls { what: "client protocol versions", source })?
        .with_root_certificates(m.roots.clone())
        .with_client_auth_cert(m.chain.clone(), m.key.clone_key())
        .map_err(|source| TlsError::Rustls { what: "client certificate", source })?;
    tls.alpn_protocols = vec![alpn.to_vec()];
    tls.resumption = rustls::client::Resumption::disabled();
    tls.enable_early_data = false;
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
        .map_err(|source| TlsError::QuicCrypto { source })?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// The DC on the other end of an established connection: the single DNS subject
/// alternative name of the peer's end-entity certificate.
///
/// The certificate chain was verified against the CA during the handshake (configs from
/// this module make that mandatory on both sides); this function only reads the name.
/// The caller must still check the name against its configured peers.
pub fn peer_dc(conn: &quinn::Connection) -> Result<String, TlsError> {
    let identity = conn.peer_identity().ok_or(TlsError::NoPeerCertificate)?;
    let chain =
        identity.downcast::<Vec<CertificateDer<'static>>>().map_err(|_| TlsError::NoPeerCertificate)?;
    let end_entity = chain.first().ok_or(TlsError::NoPeerCertificate)?;
    let names = cert_dns_names(end_entity).map_err(|source| TlsError::PeerCertificate { source })?;
    single_dc_name(&names).ok_or_else(|| TlsError::PeerDcName { names: capped(names.iter().copied()) })
}

/// TLS material that can be re-read from its files while the process runs.
///
/// Readers take a cheap snapshot ([`ReloadableTls::current`]); [`ReloadableTls::reload`]
/// swaps in new material only after it passed every check. Configs built from it use the
/// [`TransportTuning`] set with [`ReloadableTls::with_tuning`] (default otherwise).
#[derive(Debug)]
pub struct ReloadableTls {
    paths: TlsPaths,
    tuning: TransportTuning,
    current: Mutex<Arc<TlsMaterial>>,
    /// Serializes reloads so two concurrent reloads cannot interleave their checks.
    reloading: Mutex<()>,
}

impl ReloadableTls {
    /// Loads the material and checks its chain to the CA at the current time.
    pub fn load(paths: TlsPaths) -> Result<ReloadableTls, TlsError> {
        let material = load_checked(&paths, SystemTime::now())?;
        Ok(ReloadableTls {
            paths,
            tuning: TransportTuning::default(),
            current: Mutex::new(Arc::new(material)),
            reloading: Mutex::new(()),
        })
    }

    /// Uses `tuning` for every config built from now on; fails if it is inconsistent.
    pub fn with_tuning(mut self, tuning: TransportTuning) -> Result<ReloadableTls, TlsError> {
        tuning.transport_config()?;
        self.tuning = tuning;
        Ok(self)
    }

    /// Re-reads the files. On success the new material is in use for configs built from
    /// now on and is returned; on error the old material stays in use.
    ///
    /// The new certificate must chain to the (re-read) CA at the current time and must name
    /// the same DC as the material in use.
    pub fn reload(&self) -> Result<Arc<TlsMaterial>, TlsError> {
        let _reloading = self.reloading.lock();
        let material = load_checked(&self.paths, SystemTime::now())?;
        let loaded_dc = self.current.lock().dc.clone();
        if material.dc != loaded_dc {
            return Err(TlsError::IdentityChanged {
                path: self.paths.cert.clone(),
                loaded: loaded_dc,
                reloaded: material.dc,
            });
        }
        let material = Arc::new(material);
        *self.current.lock() = material.clone();
        Ok(material)
    }

    /// A snapshot of the material in use.
    pub fn current(&self) -> Arc<TlsMaterial> {
        self.current.lock().clone()
    }

    /// The files this material is read from.
    pub fn paths(&self) -> &TlsPaths {
        &self.paths
    }

    /// The transport tuning configs are built with.
    pub fn tuning(&self) -> &TransportTuning {
        &self.tuning
    }

    /// A fresh server config from the material in use (see [`server_config_tuned`]); hand
    /// it to `quinn::Endpoint::set_server_config` after a reload.
    pub fn server_config(&self, alpn: &[u8]) -> Result<quinn::ServerConfig, TlsError> {
        server_config_tuned(&self.current(), alpn, &self.tuning)
    }

    /// A fresh client config from the material in use (see [`client_config_tuned`]); build
    /// one per connection attempt so a reload applies to the next dial.
    pub fn client_config(&self, alpn: &[u8]) -> Result<quinn::ClientConfig, TlsError> {
        client_config_tuned(&self.current(), alpn, &self.tuning)
    }
}

/// A freshly generated certificate and its private key, both PEM.
pub struct GeneratedCert {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PKCS#8 PEM. Never log it.
    pub key_pem: String,
}

impl fmt::Debug for GeneratedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GeneratedCert").field("cert_pem", &self.cert_pem).finish_non_exhaustive()
    }
}

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

/// The files written by [`generate_dev_pki`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevPki {
    /// The development CA certificate (`<dir>/ca.pem`).
    pub ca_cert: PathBuf,
    /// The development CA private key (`<dir>/ca.key`).
    pub ca_key: PathBuf,
    /// Per DC, in the order given: its name and its [`TlsPaths`].
    pub dcs: Vec<(String, TlsPaths)>,
}

impl DevPki {
    /// The paths for one DC, if it was generated.
    pub fn paths(&self, dc: &str) -> Option<&TlsPaths> {
        self.dcs.iter().find(|(name, _)| name == dc).map(|(_, paths)| paths)
    }
}

/// Creates a development CA (`ca.pem`, `ca.key`) and, per DC, `<dc>.pem` and `<dc>.key`
/// in `dir` (created if missing). Each DC certificate names the DC as its only DNS SAN,
/// allows server and client authentication, and is valid for [`DEV_DC_CERT_VALIDITY`]
/// (dated back by [`DEV_CLOCK_SKEW_ALLOWANCE`]). Keys are written with mode 0600.
///
/// Without `overwrite`, fails with [`TlsError::Exists`] before writing anything if any
/// target file exists. For development and tests only: the CA key sits next to the
/// certificates.
pub fn generate_dev_pki(dir: &Path, dcs: &[&str], overwrite: bool) -> Result<DevPki, TlsError> {
    for (index, dc) in dcs.iter().enumerate() {
        validate_dc_name(dc)?;
        if dcs[..index].contains(dc) {
            return Err(TlsError::DuplicateDc { name: (*dc).to_owned() });
        }
    }
    let pki = DevPki {
        ca_cert: dir.join(DEV_CA_CERT_FILE),
        ca_key: dir.join(DEV_CA_KEY_FILE),
        dcs: dcs
            .iter()
            .map(|dc| {
                let paths = TlsPaths {
                    ca_cert: dir.join(DEV_CA_CERT_FILE),
                    cert: dir.join(format!("{dc}.pem")),
                    key: dir.join(format!("{dc}.key")),
                };
                ((*dc).to_owned(), paths)
            })
            .collect(),
    };
    if !overwrite {
        let mut targets: Vec<&Path> = vec![&pki.ca_cert, &pki.ca_key];
        for (_, paths) in &pki.dcs {
            targets.push(&paths.cert);
            targets.push(&paths.key);
        }
        refuse_existing(&targets)?;
    }

    // Generate everything before writing anything.
    let now = SystemTime::now();
    let not_before = now.checked_sub(DEV_CLOCK_SKEW_ALLOWANCE).unwrap_or(UNIX_EPOCH);
    let ca_not_after = now
        .checked_add(DEV_CA_VALIDITY)
        .ok_or(TlsError::InvalidValidity { reason: "CA expiry overflows the clock" })?;
    let dc_not_after = now
        .checked_add(DEV_DC_CERT_VALIDITY)
        .ok_or(TlsError::InvalidValidity { reason: "certificate expiry overflows the clock" })?;
    let ca = generate_dev_ca(not_before, ca_not_after)?;
    let dc_certs = dcs
        .iter()
        .map(|dc| generate_dc_cert(&ca.cert_pem, &ca.key_pem, dc, not_before, dc_not_after))
        .collect::<Result<Vec<_>, _>>()?;

    fs::create_dir_all(dir).map_err(|source| TlsError::Write { path: dir.to_owned(), source })?;
    ca.write(&pki.ca_cert, &pki.ca_key, overwrite)?;
    for ((_, paths), cert) in pki.dcs.iter().zip(&dc_certs) {
        cert.write(&paths.cert, &paths.key, overwrite)?;
    }
    Ok(pki)
}

/// A new self-signed development CA valid from `not_before` to `not_after`.
pub fn generate_dev_ca(not_before: SystemTime, not_after: SystemTime) -> Result<GeneratedCert, TlsError> {
    let key = KeyPair::generate().map_err(|source| TlsError::Generate { what: "CA key", source })?;
    let cert = dev_ca_params(not_before, not_after)?
        .self_signed(&key)
        .map_err(|source| TlsError::Generate { what: "CA certificate", source })?;
    Ok(GeneratedCert { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// A new certificate for DC `dc`, signed by a development CA (one made by
/// [`generate_dev_ca`] or [`generate_dev_pki`]), valid from `not_before` to `not_after`.
///
/// Both instants may be in the past, which makes an already-expired certificate for
/// tests. The certificate's only DNS SAN is `dc`; it allows server and client
/// authentication.
pub fn generate_dc_cert(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    dc: &str,
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<GeneratedCert, TlsError> {
    validate_dc_name(dc)?;
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(|source| TlsError::CaKeyInput { source })?;
    let ca_der = CertificateDer::from_pem_slice(ca_cert_pem.as_bytes())
        .map_err(|error| TlsError::CaCertInput { reason: CaInputError::Pem(error) })?;
    let given_anchor = webpki::anchor_from_trusted_cert(&ca_der)
        .map_err(|error| TlsError::CaCertInput { reason: CaInputError::Certificate(error) })?;

    // rcgen 0.13 signs only with an rcgen `Certificate` as issuer and cannot parse one
    // from PEM without x509-parser. A dev CA is fully determined by its fixed name and its
    // key, so rebuild it and prove it is the same CA: same subject, same public key.
    let rebuilt = dev_ca_params(not_before, not_after)?
        .self_signed(&ca_key)
        .map_err(|source| TlsError::Generate { what: "CA certificate", source })?;
    let rebuilt_anchor = webpki::anchor_from_trusted_cert(rebuilt.der())
        .map_err(|error| TlsError::CaCertInput { reason: CaInputError::Certificate(error) })?;
    if given_anchor.subject != rebuilt_anchor.subject
        || given_anchor.subject_public_key_info != rebuilt_anchor.subject_public_key_info
    {
        return Err(TlsError::NotDevCa);
    }

    let mut params = CertificateParams::new(vec![dc.to_owned()])
        .map_err(|source| TlsError::Generate { what: "DC certificate parameters", source })?;
    set_validity(&mut params, not_before, not_after)?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, dc);
    name.push(DnType::OrganizationName, DEV_CA_ORGANIZATION);
    params.distinguished_name = name;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages =
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().map_err(|source| TlsError::Generate { what: "DC key", source })?;
    let cert = params
        .signed_by(&key, &rebuilt, &ca_key)
        .map_err(|source| TlsError::Generate { what: "DC certificate", source })?;
    Ok(GeneratedCert { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// Checks that `name` can serve as a DC name: a lowercase DNS name (letters, digits, '-'
/// and '.'; labels not starting or ending with '-'), not an IP address, and not `ca` (which
/// would collide with the CA files).
pub fn validate_dc_name(name: &str) -> Result<(), TlsError> {
    let invalid = |reason| TlsError::InvalidDcName { name: name.to_owned(), reason };
    if name.is_empty() || name.len() > DC_NAME_BYTES_MAX {
        return Err(invalid("must be 1 to 253 bytes"));
    }
    if name == "ca" {
        return Err(invalid("\"ca\" is reserved for the CA files"));
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(invalid("each dot-separated label must be 1 to 63 bytes"));
        }
        if !label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
            return Err(invalid("only lowercase letters, digits, '-' and '.' are allowed"));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(invalid("a label must not start or end with '-'"));
        }
    }
    match ServerName::try_from(name) {
        Ok(ServerName::DnsName(_)) => Ok(()),
        Ok(_) => Err(invalid("an IP address is not a DC name")),
        Err(_) => Err(invalid("not a valid DNS name")),
    }
}

fn ring_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load_checked(paths: &TlsPaths, now: SystemTime) -> Result<TlsMaterial, TlsError> {
    let material = TlsMaterial::load(paths)?;
    material.check_chain(now)?;
    Ok(material)
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

fn cert_dns_names<'a>(der: &'a CertificateDer<'a>) -> Result<Vec<&'a str>, webpki::Error> {
    let cert = webpki::EndEntityCert::try_from(der)?;
    // Bounded: a name list longer than this cannot identify a single DC anyway.
    Ok(cert.valid_dns_names().take(ERROR_NAMES_MAX + 1).collect())
}

fn single_dc_name(names: &[&str]) -> Option<String> {
    match names {
        [name] if validate_dc_name(name).is_ok() => Some((*name).to_owned()),
        _ => None,
    }
}

fn capped<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    names.take(ERROR_NAMES_MAX).map(str::to_owned).collect()
}

fn check_alpn(alpn: &[u8]) -> Result<(), TlsError> {
    if alpn.is_empty() || alpn.len() > 255 {
        return Err(TlsError::Alpn { len: alpn.len() });
    }
    Ok(())
}

fn dev_ca_params(not_before: SystemTime, not_after: SystemTime) -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::default();
    set_validity(&mut params, not_before, not_after)?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, DEV_CA_COMMON_NAME);
    name.push(DnType::OrganizationName, DEV_CA_ORGANIZATION);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    Ok(params)
}

fn set_validity(
    params: &mut CertificateParams,
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<(), TlsError> {
    if not_before >= not_after {
        return Err(TlsError::InvalidValidity { reason: "not_before must be earlier than not_after" });
    }
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + since_epoch_for_cert(not_before)?;
    params.not_after = epoch + since_epoch_for_cert(not_after)?;
    Ok(())
}

fn since_epoch_for_cert(t: SystemTime) -> Result<Duration, TlsError> {
    let since = t.duration_since(UNIX_EPOCH).map_err(|_| TlsError::InvalidValidity {
        reason: "certificate times before 1970 are not supported",
    })?;
    if since.as_secs() > CERT_TIME_SECS_MAX {
        return Err(TlsError::InvalidValidity {
            reason: "certificate times after 9999-12-31 cannot be expressed",
        });
    }
    Ok(since)
}

fn refuse_existing(paths: &[&Path]) -> Result<(), TlsError> {
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

/// Logs a warning if the key file is readable by group or others. Loading goes on: the
/// operator owns the file system, and refusing would turn a hygiene issue into an outage.
fn warn_if_key_exposed(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(metadata) = fs::metadata(path) {
            let mode = metadata.permissions().mode();
            if mode & 0o077 != 0 {
                tracing::warn!(
                    path = %path.display(),
                    mode = format_args!("{:o}", mode & 0o777),
                    "private key file is accessible by group or others; use mode 0600"
                );
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dc_names_are_lowercase_dns_names_and_not_ca() {
        for good in ["dc-a", "eu-west-1", "dc1.example", "a"] {
            assert!(validate_dc_name(good).is_ok(), "{good:?} refused");
        }
        let too_long = "a".repeat(DC_NAME_BYTES_MAX + 1);
        for bad in
            ["", "ca", "DC-A", "dc_a", "-dc", "dc-", "dc..a", ".dc", "dc.", "10.0.0.1", "*.dc", &too_long]
        {
            assert!(validate_dc_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_certificate_identifies_a_dc_only_by_exactly_one_valid_name() {
        assert_eq!(single_dc_name(&["dc-a"]), Some("dc-a".to_owned()));
        assert_eq!(single_dc_name(&[]), None);
        assert_eq!(single_dc_name(&["dc-a", "dc-b"]), None);
        assert_eq!(single_dc_name(&["*.example"]), None);
        assert_eq!(single_dc_name(&["DC-A"]), None);
    }

    #[test]
    fn transport_tuning_rejects_keep_alive_not_below_idle_timeout() {
        assert!(TransportTuning::default().transport_config().is_ok());
        let equal = TransportTuning {
            keep_alive_interval: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
        };
        assert!(matches!(equal.transport_config(), Err(TlsError::Tuning { .. })));
        let zero = TransportTuning { keep_alive_interval: Duration::ZERO, ..TransportTuning::default() };
        assert!(matches!(zero.transport_config(), Err(TlsError::Tuning { .. })));
        let huge =
            TransportTuning { idle_timeout: Duration::from_secs(u64::MAX), ..TransportTuning::default() };
        assert!(matches!(huge.transport_config(), Err(TlsError::Tuning { .. })));
    }

    #[test]
    fn alpn_must_be_1_to_255_bytes() {
        assert!(matches!(check_alpn(b""), Err(TlsError::Alpn { len: 0 })));
        assert!(matches!(check_alpn(&[b'x'; 256]), Err(TlsError::Alpn { len: 256 })));
        assert!(check_alpn(b"tandem/1").is_ok());
    }

    #[test]
    fn validity_must_be_a_nonempty_period_a_certificate_can_express() {
        let mut params = CertificateParams::default();
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert!(set_validity(&mut params, now, now).is_err());
        assert!(set_validity(&mut params, now, now - Duration::from_secs(1)).is_err());
        let too_late = UNIX_EPOCH + Duration::from_secs(CERT_TIME_SECS_MAX + 1);
        assert!(set_validity(&mut params, now, too_late).is_err());
        assert!(set_validity(&mut params, now, now + Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn configs_build_without_a_process_default_provider() {
        // Proves something only while no test in this binary installed a default; the
        // configs must build either way.
        let none_installed = CryptoProvider::get_default().is_none();
        let dir = tempfile::tempdir().unwrap();
        let pki = generate_dev_pki(dir.path(), &["dc-a"], false).unwrap();
        let material = TlsMaterial::load(pki.paths("dc-a").unwrap()).unwrap();
        server_config(&material, b"t").unwrap();
        client_config(&material, b"t").unwrap();
        if none_installed {
            assert!(CryptoProvider::get_default().is_none(), "building a config installed a default");
        }
    }

    #[test]
    fn debug_output_never_contains_the_private_key() {
        let ca =
            generate_dev_ca(UNIX_EPOCH + Duration::from_secs(1), SystemTime::now() + Duration::from_secs(60))
                .unwrap();
        let shown = format!("{ca:?}");
        assert!(!shown.contains("PRIVATE KEY"));
        assert!(!shown.contains(&ca.key_pem));
    }
}
