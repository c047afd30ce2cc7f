//! The quinn server and client configurations for the replication link (and, with a node's
//! material and its own ALPN, for the member link inside a DC): mutual TLS 1.3
//! against the configured CA with one ALPN id, no session resumption, no 0-RTT, and the
//! ring crypto provider passed explicitly (never a process default). Both sides apply one
//! identity rule: a certificate names exactly one DC (the accepting side reads it with
//! [`peer_dc`](super::peer_dc); the dialing side checks it in the handshake with
//! [`OneDcServerVerifier`]).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, OtherError, SignatureScheme};

use super::identity::{capped, cert_dns_names, single_dc_name, single_node_name};
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
    m.require_dc()?;
    server_config_with(m, alpn, tuning.transport_config()?)
}

/// A quinn server config as [`server_config_tuned`] makes, with any kind of material and
/// the given transport settings (the member link's come from here too).
pub(crate) fn server_config_with(
    m: &TlsMaterial,
    alpn: &[u8],
    transport: quinn::TransportConfig,
) -> Result<quinn::ServerConfig, TlsError> {
    check_alpn(alpn)?;
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
    m.require_dc()?;
    client_config_with(m, alpn, tuning.transport_config()?, NameRule::Dc)
}

/// Which single name a dialed server's certificate must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameRule {
    /// Exactly one DC name, the one dialed (the replication link).
    Dc,
    /// Exactly one node name, the one dialed (the member link).
    Node,
}

/// A quinn client config as [`client_config_tuned`] makes, with any kind of material, the
/// given transport settings and the given rule for the server's name.
pub(crate) fn client_config_with(
    m: &TlsMaterial,
    alpn: &[u8],
    transport: quinn::TransportConfig,
    rule: NameRule,
) -> Result<quinn::ClientConfig, TlsError> {
    check_alpn(alpn)?;
    let provider = ring_provider();
    let webpki = WebPkiServerVerifier::builder_with_provider(m.roots.clone(), provider.clone())
        .build()
        .map_err(|source| TlsError::Verifier { source })?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|source| TlsError::Rustls { what: "client protocol versions", source })?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(OneNameServerVerifier { webpki, rule }))
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

/// The dialer's check of the server: the chain, validity and name checks of webpki (the
/// certificate must chain to the CA and name the DC or node dialled), and then the rule the
/// accepting side applies to clients: the certificate names exactly one DC (or, on the
/// member link, exactly one node), the one dialled. A certificate that also names others
/// (or anything else) identifies no single DC or node and is refused with a
/// `certificate_unknown` alert whose reason names the rule (`PeerDcName`, `PeerNodeName`)
/// and the names found.
#[derive(Debug)]
struct OneNameServerVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    rule: NameRule,
}

impl ServerCertVerifier for OneNameServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified =
            self.webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)?;
        let names = cert_dns_names(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        let single = match self.rule {
            NameRule::Dc => single_dc_name(&names),
            NameRule::Node => single_node_name(&names).map(|node| node.dns_name()),
        };
        match (single, server_name) {
            (Some(name), ServerName::DnsName(dialled)) if name == dialled.as_ref() => Ok(verified),
            _ => {
                let names = capped(names.iter().copied());
                let error = match self.rule {
                    NameRule::Dc => TlsError::PeerDcName { names },
                    NameRule::Node => TlsError::PeerNodeName { names },
                };
                Err(rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(error)))))
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
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
