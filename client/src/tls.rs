//! HTTPS settings of a [`Client`](crate::Client) ([`ClientTls`]): the CA the registry's
//! certificate must chain to (no built-in root store: a registry's CA is the operator's
//! own), and optionally a client certificate for a registry that maps certificates to
//! principals (`[[acl.certs]]`). TLS is reqwest's rustls with ring; this crate names no
//! rustls type itself.

use std::fmt;
use std::path::Path;

use crate::ClientError;

/// HTTPS settings: a CA bundle and an optional client identity, both checked when made.
#[derive(Clone)]
pub struct ClientTls {
    ca_pem: Vec<u8>,
    ca: Vec<reqwest::Certificate>,
    /// The client certificate (chain) and key, PEM, concatenated; never shown.
    identity_pem: Option<Vec<u8>>,
    identity: Option<reqwest::Identity>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_certs", &self.ca.len())
            .field("client_cert", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

impl PartialEq for ClientTls {
    fn eq(&self, other: &Self) -> bool {
        self.ca_pem == other.ca_pem && self.identity_pem == other.identity_pem
    }
}

impl Eq for ClientTls {}

impl ClientTls {
    /// Trusts the certificates of a PEM bundle (one or more CA certificates).
    pub fn from_ca_pem(pem: &[u8]) -> Result<ClientTls, ClientError> {
        let ca = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| ClientError::Config(format!("CA certificate: {e}")))?;
        if ca.is_empty() {
            return Err(ClientError::Config("CA certificate: no PEM certificate found".into()));
        }
        let tls = ClientTls { ca_pem: pem.to_vec(), ca, identity_pem: None, identity: None };
        tls.check()?;
        Ok(tls)
    }

    /// Trusts the CA certificates of the PEM file `path`.
    pub fn from_ca_file(path: &Path) -> Result<ClientTls, ClientError> {
        let pem = std::fs::read(path).map_err(|e| {
            ClientError::Config(format!("cannot read CA certificate {}: {e}", path.display()))
        })?;
        ClientTls::from_ca_pem(&pem).map_err(|e| match e {
            ClientError::Config(m) => ClientError::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Also presents a client certificate (`cert_pem`: end-entity first, then any
    /// intermediates; `key_pem`: its PKCS#8, SEC1 or PKCS#1 key).
    pub fn with_identity_pem(mut self, cert_pem: &[u8], key_pem: &[u8]) -> Result<ClientTls, ClientError> {
        let mut pem = key_pem.to_vec();
        pem.push(b'\n');
        pem.extend_from_slice(cert_pem);
        let identity = reqwest::Identity::from_pem(&pem)
            .map_err(|e| ClientError::Config(format!("client certificate or key: {e}")))?;
        self.identity_pem = Some(pem);
        self.identity = Some(identity);
        self.check()?;
        Ok(self)
    }

    /// Also presents the client certificate and key of these PEM files.
    pub fn with_identity_files(self, cert: &Path, key: &Path) -> Result<ClientTls, ClientError> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|e| ClientError::Config(format!("cannot read {}: {e}", p.display())))
        };
        self.with_identity_pem(&read(cert)?, &read(key)?)
    }

    /// Puts these settings on a reqwest client builder: only this CA is trusted.
    pub(crate) fn apply(&self, mut b: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        b = b.tls_built_in_root_certs(false).https_only(true);
        for c in &self.ca {
            b = b.add_root_certificate(c.clone());
        }
        if let Some(id) = &self.identity {
            b = b.identity(id.clone());
        }
        b
    }

    /// Builds a client once, so that [`Client::with_tls`](crate::Client::with_tls) cannot
    /// fail later.
    fn check(&self) -> Result<(), ClientError> {
        self.apply(reqwest::Client::builder())
            .build()
            .map(drop)
            .map_err(|e| ClientError::Config(format!("TLS settings: {e}")))
    }
}
