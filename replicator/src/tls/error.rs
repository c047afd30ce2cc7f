//! The errors of the TLS module: [`TlsError`], which file ([`FileRole`]) an error is about,
//! and why a CA given to the dev PKI generator is unusable ([`CaInputError`]).

use std::fmt;
use std::io;
use std::path::PathBuf;

use rustls::pki_types::pem;

/// Which of the three files an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileRole {
    /// The CA certificate file ([`TlsPaths::ca_cert`](super::TlsPaths::ca_cert)).
    CaCert,
    /// The DC's own certificate file ([`TlsPaths::cert`](super::TlsPaths::cert)).
    Cert,
    /// The DC's private key file ([`TlsPaths::key`](super::TlsPaths::key)).
    Key,
    /// A development CA's private key file (`ca.key`), read to sign node certificates.
    CaKey,
}

impl fmt::Display for FileRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileRole::CaCert => "CA certificate",
            FileRole::CaKey => "CA private key",
            FileRole::Cert => "certificate",
            FileRole::Key => "private key",
        })
    }
}

/// Everything that can go wrong in this module.
///
/// Loading and config-building variants never change state: a failed
/// [`ReloadableTls::reload`](super::ReloadableTls::reload) keeps the material in use.
/// Generation variants say what may already be on disk.
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

    /// The private key file is owned by another user (not this process's user, not root),
    /// or group or others may write it: whoever can replace the key can impersonate the
    /// DC. Nothing changed.
    #[error("private key file {path} {problem}; make it owned by the node's user with mode 0600")]
    KeyFileUnsafe { path: PathBuf, problem: String },

    /// The private key does not belong to the certificate. Nothing changed.
    #[error("private key file {key} does not match the certificate in {cert}")]
    KeyMismatch { cert: PathBuf, key: PathBuf },

    /// The certificate does not carry exactly one DNS subject alternative name that is a
    /// valid DC name (or a node name), so it cannot identify a DC or a node. Nothing changed.
    #[error(
        "certificate file {path} must carry exactly one DNS subject alternative name that is a \
         valid DC name (lowercase letters, digits, '-', '.') or, for a node, \
         n<id>.<dc>.tandem-node; found {names:?}"
    )]
    CertDcName { path: PathBuf, names: Vec<String> },

    /// The certificate does not chain to the CA for the named usage at the given time
    /// (expired, not yet valid, signed by another CA, missing extended key usage). Nothing
    /// changed.
    #[error("certificate file {cert} is not valid for {usage} under the CA in {ca}: {source}")]
    CertNotTrusted { cert: PathBuf, ca: PathBuf, usage: &'static str, source: webpki::Error },

    /// A reload found a certificate for a different DC (or node) than the one in use. An
    /// identity does not change by rotation; restart with new configuration instead.
    /// Nothing changed.
    #[error("certificate file {path} names {reloaded:?}, but the material in use names {loaded:?}")]
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

    /// The CA certificate PEM given to [`generate_dc_cert`](super::generate_dc_cert) is not
    /// usable. Nothing changed.
    #[error("CA certificate PEM is not usable: {reason}")]
    CaCertInput { reason: CaInputError },

    /// The CA key PEM given to [`generate_dc_cert`](super::generate_dc_cert) is not usable.
    /// Nothing changed.
    #[error("CA private key PEM is not usable: {source}")]
    CaKeyInput { source: rcgen::Error },

    /// The CA certificate and key given to [`generate_dc_cert`](super::generate_dc_cert) do
    /// not belong together, or the CA was not made by
    /// [`generate_dev_ca`](super::generate_dev_ca)/[`generate_dev_pki`](super::generate_dev_pki)
    /// (only such a CA can sign here; use real PKI tooling for any other CA). Nothing changed.
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

    /// The peer's certificate does not carry exactly one DNS subject alternative name in
    /// the node form `n<id>.<dc>.tandem-node`.
    #[error(
        "the peer's certificate must carry exactly one DNS subject alternative name of the \
         form n<id>.<dc>.tandem-node; found {names:?}"
    )]
    PeerNodeName { names: Vec<String> },

    /// The material is of the other kind than the link needs: a node's certificate where a
    /// DC's is needed (the replication link), or a DC's where a node's is (the member link).
    #[error("{}: {found}, but {link} needs {needed}", path.display())]
    CertKind { path: PathBuf, found: String, link: &'static str, needed: &'static str },

    /// A certificate that is not valid now (expired, or not yet valid), or whose validity
    /// cannot be read: a server would present it and every client would refuse it.
    #[error("{}: {reason}; renew the certificate", path.display())]
    CertNotValidNow { path: PathBuf, reason: String },
}

/// Why a CA certificate PEM given to [`generate_dc_cert`](super::generate_dc_cert) is unusable.
#[derive(Debug, thiserror::Error)]
pub enum CaInputError {
    /// Not well-formed PEM, or no certificate in it.
    #[error("{0}")]
    Pem(pem::Error),
    /// Not a parsable certificate.
    #[error("{0}")]
    Certificate(webpki::Error),
}
