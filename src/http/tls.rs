//! HTTPS on the client API (`[http.tls]`): the rustls server configuration (ring provider
//! passed explicitly, TLS 1.2 and 1.3, ALPN h2 and http/1.1, optional or required client
//! certificates verified against `client_ca`), re-read on reload ([`HttpsTls`]), the
//! handshake the listener runs on each accepted connection within its own timeout
//! ([`handshake`]), and the name a verified client certificate stands for ([`cert_name`]).
//!
//! The files are read with the replication side's readers (`tandem_replicator::tls`): the
//! same PEM errors naming the file, and the same key file rules (owned by the node's user
//! or root, not writable by group or others).
//!
//! Must never: serve plain HTTP on the TLS port (a plain request gets one canned 400
//! answer and the connection closes), hold a connection slot through a stalled handshake,
//! or swap in material that failed to load.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::RwLock;
use rustls::pki_types::CertificateDer;
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use tandem_replicator::tls::{load_cert_chain, load_key_for, load_roots, FileRole, TlsError};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::limits::HttpState;
use crate::config::{ClientCerts, HttpTlsSection};

/// The application protocols offered, in order of preference.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];
/// Longest client certificate name that can be a principal (`cert:<name>`); a longer one
/// (or one with control characters) authenticates nobody.
pub const CERT_NAME_BYTES_MAX: usize = 128;
/// A plain HTTP request on the TLS port: after the 400, at most this much of what it sent
/// is read and dropped, for at most [`PLAIN_DRAIN_TIME`], before the close.
const PLAIN_DRAIN_BYTES: usize = 64 * 1024;
const PLAIN_DRAIN_TIME: Duration = Duration::from_millis(200);
/// The prefix of a client certificate's principal.
pub const CERT_PRINCIPAL_PREFIX: &str = "cert:";

/// The name of the verified client certificate of a connection, put into each of its
/// requests' extensions.
#[derive(Clone, Debug)]
pub struct ClientCert(pub Arc<str>);

/// The HTTPS material in use and the settings it was built from; reloadable.
pub struct HttpsTls {
    current: RwLock<(HttpTlsSection, TlsAcceptor)>,
}

impl std::fmt::Debug for HttpsTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpsTls").field("section", &self.current.read().0).finish_non_exhaustive()
    }
}

impl HttpsTls {
    /// Reads the files of `section` and builds the server configuration.
    pub fn load(section: &HttpTlsSection) -> Result<HttpsTls, TlsError> {
        let acceptor = TlsAcceptor::from(server_config(section)?);
        Ok(HttpsTls { current: RwLock::new((section.clone(), acceptor)) })
    }

    /// Builds the configuration of `section` anew from its files, without using it yet:
    /// [`HttpsTls::swap`] puts it in force. An error changes nothing. (The node's reload
    /// runs one at a time, so a prepared configuration is never swapped in over a newer.)
    pub fn prepare(section: &HttpTlsSection) -> Result<Prepared, TlsError> {
        Ok(Prepared { section: section.clone(), acceptor: TlsAcceptor::from(server_config(section)?) })
    }

    /// Puts prepared material in force: connections accepted from now on use it;
    /// established ones keep what they were handshaken with.
    pub fn swap(&self, prepared: Prepared) {
        *self.current.write() = (prepared.section, prepared.acceptor);
    }

    /// The acceptor for a new connection and the handshake's time limit.
    pub fn acceptor(&self) -> (TlsAcceptor, Duration) {
        let c = self.current.read();
        (c.1.clone(), Duration::from_millis(c.0.handshake_timeout_ms))
    }
}

/// Material built by [`HttpsTls::prepare`], not yet in force.
pub struct Prepared {
    section: HttpTlsSection,
    acceptor: TlsAcceptor,
}

/// The rustls server configuration of `section`.
pub fn server_config(section: &HttpTlsSection) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = load_cert_chain(FileRole::Cert, &section.cert)?;
    check_valid_now(&chain[0], &section.cert, SystemTime::now())?;
    let key = load_key_for(&chain, &section.cert, &section.key)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|source| TlsError::Rustls { what: "HTTPS protocol versions", source })?;
    let builder = match &section.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = Arc::new(load_roots(ca)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
            let verifier = match section.client_certs {
                ClientCerts::Optional => verifier.allow_unauthenticated(),
                ClientCerts::Required => verifier,
            };
            builder
                .with_client_cert_verifier(verifier.build().map_err(|source| TlsError::Verifier { source })?)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|source| TlsError::Rustls { what: "HTTPS certificate", source })?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Refuses a server certificate that is not valid at `now` (expired or not yet valid),
/// at start and at reload alike, so a renewal that went wrong keeps the material in use
/// instead of making every client refuse the node.
fn check_valid_now(
    cert: &CertificateDer<'_>,
    path: &std::path::Path,
    now: SystemTime,
) -> Result<(), TlsError> {
    use x509_cert::der::Decode;
    let not_valid = |reason: String| TlsError::CertNotValidNow { path: path.to_owned(), reason };
    let parsed = x509_cert::Certificate::from_der(cert.as_ref())
        .map_err(|e| not_valid(format!("its validity cannot be read ({e})")))?;
    let validity = &parsed.tbs_certificate.validity;
    let now_unix = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    if now_unix < validity.not_before.to_unix_duration() {
        return Err(not_valid(format!("not valid before {}", validity.not_before)));
    }
    if now_unix > validity.not_after.to_unix_duration() {
        return Err(not_valid(format!("expired at {}", validity.not_after)));
    }
    Ok(())
}

/// How a connection's TLS handshake ended when it did not succeed.
#[derive(Debug)]
pub enum HandshakeFailure {
    /// Not done within `handshake_timeout_ms`.
    TimedOut,
    /// The client spoke plain HTTP to the TLS port (answered 400 `https_required`).
    PlainHttp,
    /// Anything else: bad records, no shared version or cipher, a refused client
    /// certificate, the peer went away.
    Failed(std::io::Error),
}

/// A first byte that starts a plain HTTP/1.x request (a method's first letter) or an
/// HTTP/2 prior-knowledge preface, never a TLS record (0x14..=0x17).
fn looks_like_plain_http(first: u8) -> bool {
    first.is_ascii_uppercase()
}

/// Runs the TLS handshake on `stream` within `limit`. A client that speaks plain HTTP gets
/// a canned 400 and is refused; a slow or failing handshake is counted in `state` by the
/// caller.
pub async fn handshake<IO>(
    acceptor: TlsAcceptor,
    limit: Duration,
    tcp: TcpStream,
    wrap: impl FnOnce(TcpStream) -> IO,
) -> Result<TlsStream<IO>, HandshakeFailure>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let work = async {
        let mut first = [0u8; 1];
        // Peeking leaves the byte for rustls; a closed socket reads 0 and fails below.
        if tcp.peek(&mut first).await.is_ok_and(|n| n == 1) && looks_like_plain_http(first[0]) {
            let body = r#"{"error":{"code":"https_required","message":"this port speaks HTTPS only; use an https:// URL"}}"#;
            let answer = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\n\
                 content-length: {}\r\n\r\n{body}",
                body.len()
            );
            // Best effort and never waiting; then read what the client sent (briefly, and
            // at most PLAIN_DRAIN_BYTES) so closing does not reset the answer away.
            let mut tcp = tcp;
            let _ = tcp.try_write(answer.as_bytes());
            let _ = tcp.shutdown().await;
            let drain = async {
                let mut buf = [0u8; 4096];
                let mut total = 0;
                while total < PLAIN_DRAIN_BYTES {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => total += n,
                    }
                }
            };
            let _ = tokio::time::timeout(PLAIN_DRAIN_TIME, drain).await;
            return Err(HandshakeFailure::PlainHttp);
        }
        acceptor.accept(wrap(tcp)).await.map_err(HandshakeFailure::Failed)
    };
    match tokio::time::timeout(limit, work).await {
        Ok(r) => r,
        Err(_) => Err(HandshakeFailure::TimedOut),
    }
}

/// Counts (and sample-logs) a handshake that did not succeed.
pub fn count_failure(state: &HttpState, peer: std::net::IpAddr, failure: &HandshakeFailure) {
    let (counter, what): (&AtomicU64, String) = match failure {
        HandshakeFailure::TimedOut => (&state.tls_handshakes_timed_out, "timed out".into()),
        HandshakeFailure::PlainHttp => (&state.tls_plain_http, "plain HTTP on the HTTPS port".into()),
        HandshakeFailure::Failed(e) => (&state.tls_handshakes_failed, e.to_string()),
    };
    HttpState::bump(counter);
    if let Some(held_back) = state.log_tls.admit() {
        tracing::warn!(peer = %peer, reason = %what.escape_debug(), held_back, "TLS handshake on the HTTP API failed (sampled: one line per 10 s)");
    }
}

/// The verified client certificate's name of an established connection, if any.
pub fn peer_cert_name<IO>(stream: &TlsStream<IO>) -> Option<Arc<str>> {
    let chain = stream.get_ref().1.peer_certificates()?;
    cert_name(chain.first()?).map(Arc::from)
}

/// The name a client certificate stands for: its subject common name, else its first DNS
/// subject alternative name (etcd's rule: the common name is the user). None when it has
/// neither, or the name is empty, longer than [`CERT_NAME_BYTES_MAX`] or holds control
/// characters.
pub fn cert_name(der: &CertificateDer<'_>) -> Option<String> {
    use x509_cert::der::{Decode, Tag, Tagged};
    let cert = x509_cert::Certificate::from_der(der.as_ref()).ok()?;
    let tbs = &cert.tbs_certificate;
    let common_name = tbs
        .subject
        .0
        .iter()
        .flat_map(|rdn| rdn.0.iter())
        .find(|atv| atv.oid == x509_cert::der::oid::db::rfc4519::CN)
        .and_then(|atv| match atv.value.tag() {
            Tag::Utf8String | Tag::PrintableString | Tag::Ia5String => {
                std::str::from_utf8(atv.value.value()).ok().map(str::to_owned)
            }
            _ => None,
        })
        .filter(|cn| !cn.is_empty());
    let name = common_name.or_else(|| {
        let ext = tbs
            .extensions
            .as_ref()?
            .iter()
            .find(|e| e.extn_id == x509_cert::der::oid::db::rfc5280::ID_CE_SUBJECT_ALT_NAME)?;
        let sans = x509_cert::ext::pkix::SubjectAltName::from_der(ext.extn_value.as_bytes()).ok()?;
        sans.0.iter().find_map(|n| match n {
            x509_cert::ext::pkix::name::GeneralName::DnsName(d) => Some(d.as_str().to_owned()),
            _ => None,
        })
    })?;
    let ok = !name.is_empty() && name.len() <= CERT_NAME_BYTES_MAX && !name.chars().any(char::is_control);
    ok.then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(common_name: &str, sans: &[&str]) -> CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject;
        let now = SystemTime::now();
        let ca = tandem_replicator::tls::generate_dev_ca(
            UNIX_EPOCH + Duration::from_secs(1),
            now + Duration::from_secs(3600),
        )
        .unwrap();
        let sans: Vec<String> = sans.iter().map(|s| (*s).to_owned()).collect();
        let c = tandem_replicator::tls::generate_leaf_cert(
            &ca.cert_pem,
            &ca.key_pem,
            common_name,
            &sans,
            UNIX_EPOCH + Duration::from_secs(1),
            now + Duration::from_secs(3600),
        )
        .unwrap();
        CertificateDer::from_pem_slice(c.cert_pem.as_bytes()).unwrap()
    }

    #[test]
    fn a_client_certificate_stands_for_its_common_name_else_its_first_dns_name() {
        assert_eq!(cert_name(&leaf("ops-bot", &["other.example"])).as_deref(), Some("ops-bot"));
        assert_eq!(cert_name(&leaf("", &["a.example", "b.example"])).as_deref(), Some("a.example"));
        assert_eq!(cert_name(&leaf(&"x".repeat(CERT_NAME_BYTES_MAX + 1), &[])), None);
        assert_eq!(cert_name(&CertificateDer::from(vec![0x30, 0x03, 1, 2, 3])), None);
    }

    #[test]
    fn a_server_certificate_is_refused_outside_its_validity() {
        // Valid from 1970-01-01T00:00:01Z to an hour from now.
        let cert = leaf("api.example", &["api.example"]);
        let path = std::path::Path::new("/etc/tandem/http.pem");
        let now = SystemTime::now();
        assert!(check_valid_now(&cert, path, now).is_ok());
        let later = check_valid_now(&cert, path, now + Duration::from_secs(2 * 3600)).unwrap_err();
        assert!(later.to_string().contains("expired at"), "{later}");
        assert!(later.to_string().contains("/etc/tandem/http.pem"), "the error names the file: {later}");
        let before = check_valid_now(&cert, path, UNIX_EPOCH).unwrap_err();
        assert!(before.to_string().contains("not valid before"), "{before}");
        let garbage = CertificateDer::from(vec![0x30, 0x03, 1, 2, 3]);
        assert!(check_valid_now(&garbage, path, now).is_err());
    }

    #[test]
    fn plain_http_is_told_from_a_tls_record_by_its_first_byte() {
        for b in b"GPHDOC" {
            assert!(looks_like_plain_http(*b));
        }
        assert!(looks_like_plain_http(b'P')); // "PRI * HTTP/2.0"
        for b in [0x14u8, 0x15, 0x16, 0x17, 0x80] {
            assert!(!looks_like_plain_http(b));
        }
    }
}
