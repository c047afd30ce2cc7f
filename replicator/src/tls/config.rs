//! The quinn server and client configurations for the replication link: mutual TLS 1.3
//! against the configured CA with one ALPN id, no session resumption, no 0-RTT, and the
//! ring crypto provider passed explicitly (never a process default).

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;

use super::{TlsError, TlsMaterial};
use crate::gateway::TransportTuning;

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

pub(super) fn ring_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn check_alpn(alpn: &[u8]) -> Result<(), TlsError> {
    if alpn.is_empty() || alpn.len() > 255 {
        return Err(TlsError::Alpn { len: alpn.len() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::generate_dev_pki;

    #[test]
    fn alpn_must_be_1_to_255_bytes() {
        assert!(matches!(check_alpn(b""), Err(TlsError::Alpn { len: 0 })));
        assert!(matches!(check_alpn(&[b'x'; 256]), Err(TlsError::Alpn { len: 256 })));
        assert!(check_alpn(b"tandem/1").is_ok());
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
}
