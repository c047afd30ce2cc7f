//! `[http.tls]`: HTTPS on the client API — the listener's certificate and key, and the
//! optional CA whose client certificates the node verifies (docs/security.md, "HTTPS").

use std::path::PathBuf;

use serde::Deserialize;

use super::{inv, ConfigError};

/// `[http.tls]`. Present: the HTTP API speaks only HTTPS (TLS 1.2 and 1.3, ALPN h2 and
/// http/1.1). The files are re-read on reload (SIGHUP or `POST /v1/admin/reload`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HttpTlsSection {
    /// PEM file: the listener's certificate, end-entity first, then intermediates.
    pub cert: PathBuf,
    /// PEM file: its private key (owned by the node's user or root, mode 0600).
    pub key: PathBuf,
    /// PEM file: the CA(s) client certificates must chain to. Absent: no client
    /// certificates are asked for.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: `optional` (default; a client may present one) or `required`
    /// (a handshake without a valid client certificate fails).
    #[serde(default)]
    pub client_certs: ClientCerts,
    /// A TLS handshake must finish within this (counted from the accept); a stalled one
    /// is closed and counted, and frees its connection slot.
    #[serde(default = "d_handshake_timeout_ms")]
    pub handshake_timeout_ms: u64,
}

/// Whether a client certificate is required when `client_ca` is set.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ClientCerts {
    #[default]
    Optional,
    Required,
}

fn d_handshake_timeout_ms() -> u64 {
    HANDSHAKE_TIMEOUT_MS_DEFAULT
}

/// The default of `[http.tls] handshake_timeout_ms`.
pub const HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 10_000;

impl HttpTlsSection {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(100..=600_000).contains(&self.handshake_timeout_ms) {
            return Err(inv("[http.tls] handshake_timeout_ms", "must be 100..=600000"));
        }
        if self.client_certs == ClientCerts::Required && self.client_ca.is_none() {
            return Err(inv("[http.tls] client_certs", "\"required\" needs client_ca"));
        }
        Ok(())
    }
}
