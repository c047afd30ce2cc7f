//! Mutual TLS over real loopback QUIC: who is let in, who is refused, and what a certificate
//! rotation does to new and established connections. Every wait is bounded by `WAIT`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use quinn::{ConnectionError, Endpoint, TransportErrorCode};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::AlertDescription;
use tandem_replicator::tls::{
    client_config, generate_dc_cert, generate_dev_pki, peer_dc, server_config, DevPki, FileRole,
    ReloadableTls, TlsError, TlsMaterial, TlsPaths,
};
use tokio::time::timeout;

const ALPN: &[u8] = b"tandem-tls-test/1";
const WAIT: Duration = Duration::from_secs(10);
const READ_BYTES_MAX: usize = 64 * 1024;
const DAY: Duration = Duration::from_secs(24 * 60 * 60);

fn dev_pki(dir: &Path, dcs: &[&str]) -> Result<DevPki> {
    Ok(generate_dev_pki(dir, dcs, false)?)
}

fn material(pki: &DevPki, dc: &str) -> Result<TlsMaterial> {
    let paths = pki.paths(dc).context("dc not generated")?;
    Ok(TlsMaterial::load(paths)?)
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn server_endpoint(config: quinn::ServerConfig) -> Result<(Endpoint, SocketAddr)> {
    let endpoint = Endpoint::server(config, loopback())?;
    let addr = endpoint.local_addr()?;
    Ok((endpoint, addr))
}

fn client_endpoint() -> Result<Endpoint> {
    Ok(Endpoint::client(loopback())?)
}

/// The server side of one handshake: the accepted connection or why it failed.
async fn accept_one(endpoint: &Endpoint) -> Result<Result<quinn::Connection, ConnectionError>> {
    let incoming = timeout(WAIT, endpoint.accept())
        .await
        .context("timed out waiting for an incoming connection")?
        .context("server endpoint closed")?;
    timeout(WAIT, incoming).await.context("timed out in the server handshake")
}

/// The client side of a handshake the server is expected to refuse. In TLS 1.3 the client
/// may finish its half before the server has judged the client certificate, so the
/// refusal can arrive either as a failed handshake or as an immediate close.
async fn client_refusal(
    endpoint: &Endpoint,
    config: quinn::ClientConfig,
    addr: SocketAddr,
    server_name: &str,
) -> Result<ConnectionError> {
    let connecting = endpoint.connect_with(config, addr, server_name)?;
    match timeout(WAIT, connecting).await.context("timed out in the client handshake")? {
        Err(error) => Ok(error),
        Ok(conn) => timeout(WAIT, conn.closed())
            .await
            .context("timed out waiting for the server to close a refused connection"),
    }
}

fn crypto_code(alert: AlertDescription) -> TransportErrorCode {
    TransportErrorCode::crypto(u8::from(alert))
}

/// The transport error code a failed connection ended with, whichever side closed it.
fn error_code(error: &ConnectionError) -> Option<TransportErrorCode> {
    match error {
        ConnectionError::TransportError(e) => Some(e.code),
        ConnectionError::ConnectionClosed(close) => Some(close.error_code),
        _ => None,
    }
}

/// Opens a bi stream, sends `message`, and returns what the peer sent back.
async fn round_trip(conn: &quinn::Connection, message: &[u8]) -> Result<Vec<u8>> {
    let (mut send, mut recv) = timeout(WAIT, conn.open_bi()).await??;
    send.write_all(message).await?;
    send.finish()?;
    Ok(timeout(WAIT, recv.read_to_end(READ_BYTES_MAX)).await??)
}

/// Echoes every bi stream of `conn` back until the connection closes.
async fn echo_streams(conn: quinn::Connection) {
    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
        tokio::spawn(async move {
            if let Ok(data) = recv.read_to_end(READ_BYTES_MAX).await {
                let _ = send.write_all(&data).await;
                let _ = send.finish();
            }
        });
    }
}

/// Accepts connections forever, echoing each one's streams.
fn spawn_echo_server(endpoint: Endpoint) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(incoming) = endpoint.accept().await {
            tokio::spawn(async move {
                if let Ok(conn) = incoming.await {
                    echo_streams(conn).await;
                }
            });
        }
    })
}

fn peer_cert(conn: &quinn::Connection) -> Result<CertificateDer<'static>> {
    let identity = conn.peer_identity().context("no peer identity")?;
    let chain = identity
        .downcast::<Vec<CertificateDer<'static>>>()
        .map_err(|_| anyhow::anyhow!("peer identity is not a certificate chain"))?;
    chain.first().cloned().context("empty peer chain")
}

fn cert_der_from_pem(pem: &str) -> Result<CertificateDer<'static>> {
    Ok(CertificateDer::from_pem_slice(pem.as_bytes())?)
}

fn read_string(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

#[tokio::test]
async fn two_dcs_from_one_ca_connect_exchange_bytes_and_learn_each_others_name() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = dev_pki(dir.path(), &["dc-a", "dc-b"])?;
    let a = material(&pki, "dc-a")?;
    let b = material(&pki, "dc-b")?;
    assert_eq!(a.dc(), "dc-a");
    assert_eq!(b.dc(), "dc-b");

    let (server, addr) = server_endpoint(server_config(&a, ALPN)?)?;
    let server_task = tokio::spawn(async move {
        let conn = accept_one(&server).await??;
        let peer = peer_dc(&conn)?;
        let (mut send, mut recv) = timeout(WAIT, conn.accept_bi()).await??;
        let request = timeout(WAIT, recv.read_to_end(READ_BYTES_MAX)).await??;
        send.write_all(b"pong from a").await?;
        send.finish()?;
        // Keep the connection until the client has read the reply and closed.
        let _ = timeout(WAIT, conn.closed()).await;
        anyhow::Ok((peer, request))
    });

    let client = client_endpoint()?;
    let conn = timeout(WAIT, client.connect_with(client_config(&b, ALPN)?, addr, "dc-a")?).await??;
    assert_eq!(peer_dc(&conn)?, "dc-a");
    let reply = round_trip(&conn, b"ping from b").await?;
    assert_eq!(reply, b"pong from a");
    conn.close(0u32.into(), b"done");

    let (server_saw_peer, request) = timeout(WAIT, server_task).await???;
    assert_eq!(server_saw_peer, "dc-b");
    assert_eq!(request, b"ping from b");
    Ok(())
}

#[tokio::test]
async fn client_without_certificate_is_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = dev_pki(dir.path(), &["dc-a"])?;
    let a = material(&pki, "dc-a")?;
    let (server, addr) = server_endpoint(server_config(&a, ALPN)?)?;

    // A client that trusts the right CA but has no certificate to show.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert_der_from_pem(&read_string(&pki.ca_cert)?)?)?;
    let mut tls =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let anonymous =
        quinn::ClientConfig::new(Arc::new(quinn::crypto::rustls::QuicClientConfig::try_from(tls)?));

    let client = client_endpoint()?;
    let (server_side, client_side) =
        tokio::join!(accept_one(&server), client_refusal(&client, anonymous, addr, "dc-a"),);
    let Err(server_error) = server_side? else {
        bail!("server accepted a client without a certificate");
    };
    let expected = crypto_code(AlertDescription::CertificateRequired);
    assert_eq!(error_code(&server_error), Some(expected), "{server_error}");
    assert_eq!(error_code(&client_side?), Some(expected));
    Ok(())
}

#[tokio::test]
async fn client_with_certificate_from_another_ca_is_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ours = dev_pki(&dir.path().join("ours"), &["dc-a", "dc-b"])?;
    let theirs = dev_pki(&dir.path().join("theirs"), &["dc-b"])?;
    let a = material(&ours, "dc-a")?;
    // The intruder trusts our CA (so it accepts our server) but its own certificate was
    // signed by another CA, under the same CA name.
    let intruder_files = theirs.paths("dc-b").context("dc-b")?;
    let intruder = TlsMaterial::load(&TlsPaths {
        ca_cert: ours.ca_cert.clone(),
        cert: intruder_files.cert.clone(),
        key: intruder_files.key.clone(),
    })?;
    assert!(matches!(intruder.check_chain(SystemTime::now()), Err(TlsError::CertNotTrusted { .. })));

    let (server, addr) = server_endpoint(server_config(&a, ALPN)?)?;
    let client = client_endpoint()?;
    let (server_side, client_side) = tokio::join!(
        accept_one(&server),
        client_refusal(&client, client_config(&intruder, ALPN)?, addr, "dc-a"),
    );
    let Err(server_error) = server_side? else {
        bail!("server accepted a client certificate from another CA");
    };
    // Both dev CAs carry the same name, so the issuer is found and its signature fails.
    let expected = crypto_code(AlertDescription::DecryptError);
    assert_eq!(error_code(&server_error), Some(expected), "{server_error}");
    assert_eq!(error_code(&client_side?), Some(expected));
    Ok(())
}

#[tokio::test]
async fn server_whose_certificate_names_another_dc_is_refused_by_the_client() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = dev_pki(dir.path(), &["dc-a", "dc-b", "dc-c"])?;
    // dc-c answers at the address the client believes is dc-a.
    let c = material(&pki, "dc-c")?;
    let b = material(&pki, "dc-b")?;
    let (server, addr) = server_endpoint(server_config(&c, ALPN)?)?;

    let client = client_endpoint()?;
    let connecting = client.connect_with(client_config(&b, ALPN)?, addr, "dc-a")?;
    let (server_side, client_side) = tokio::join!(accept_one(&server), timeout(WAIT, connecting));
    let Err(client_error) = client_side.context("timed out in the client handshake")? else {
        bail!("client accepted a server certificate for the wrong DC");
    };
    let expected = crypto_code(AlertDescription::BadCertificate);
    assert_eq!(error_code(&client_error), Some(expected), "{client_error}");
    assert!(server_side?.is_err());
    Ok(())
}

/// A server certificate that names the dialled DC and another one identifies no single DC:
/// the dialer applies the accepting side's rule (exactly one DC name) and refuses it, even
/// though webpki alone would accept it for the dialled name.
#[tokio::test]
async fn server_whose_certificate_names_two_dcs_is_refused_by_the_client() -> Result<()> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let dir = tempfile::tempdir()?;
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "test CA");
    let ca = ca_params.self_signed(&ca_key)?;
    let leaf = |names: &[&str]| -> Result<(String, String)> {
        let key = KeyPair::generate()?;
        let params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        Ok((params.signed_by(&key, &ca, &ca_key)?.pem(), key.serialize_pem()))
    };
    // The dialer: dc-b, from this CA, loaded as a node loads its files.
    let (b_cert, b_key) = leaf(&["dc-b"])?;
    let paths = TlsPaths {
        ca_cert: dir.path().join("ca.crt"),
        cert: dir.path().join("dc-b.crt"),
        key: dir.path().join("dc-b.key"),
    };
    std::fs::write(&paths.ca_cert, ca.pem())?;
    std::fs::write(&paths.cert, b_cert)?;
    std::fs::write(&paths.key, b_key)?;
    std::fs::set_permissions(&paths.key, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let b = TlsMaterial::load(&paths)?;

    // The server: a certificate from the same CA naming dc-a and dc-c (a node would refuse
    // to load it; a misissued certificate on another host need not be a node).
    let (two_cert, two_key) = leaf(&["dc-a", "dc-c"])?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert_der_from_pem(&two_cert)?],
            rustls::pki_types::PrivateKeyDer::from_pem_slice(two_key.as_bytes())?,
        )?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
    let (server, addr) = server_endpoint(quinn::ServerConfig::with_crypto(Arc::new(quic)))?;

    let client = client_endpoint()?;
    let connecting = client.connect_with(client_config(&b, ALPN)?, addr, "dc-a")?;
    let (server_side, client_side) = tokio::join!(accept_one(&server), timeout(WAIT, connecting));
    let Err(client_error) = client_side.context("timed out in the client handshake")? else {
        bail!("client accepted a server certificate that names two DCs");
    };
    let expected = crypto_code(AlertDescription::CertificateUnknown);
    assert_eq!(error_code(&client_error), Some(expected), "{client_error}");
    assert!(client_error.to_string().contains("PeerDcName"), "the error says why: {client_error}");
    assert!(server_side?.is_err());
    Ok(())
}

#[tokio::test]
async fn expired_client_certificate_is_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = dev_pki(dir.path(), &["dc-a"])?;
    let a = material(&pki, "dc-a")?;
    let now = SystemTime::now();
    let expired = generate_dc_cert(
        &read_string(&pki.ca_cert)?,
        &read_string(&pki.ca_key)?,
        "dc-b",
        now - 3 * DAY,
        now - DAY,
    )?;
    let paths = TlsPaths {
        ca_cert: pki.ca_cert.clone(),
        cert: dir.path().join("dc-b-expired.pem"),
        key: dir.path().join("dc-b-expired.key"),
    };
    expired.write(&paths.cert, &paths.key, false)?;
    let b = TlsMaterial::load(&paths)?;
    match b.check_chain(now) {
        Err(TlsError::CertNotTrusted { source: webpki::Error::CertExpired { .. }, .. }) => {}
        other => bail!("expected an expiry error, got {other:?}"),
    }
    assert!(matches!(ReloadableTls::load(paths.clone()), Err(TlsError::CertNotTrusted { .. })));

    let (server, addr) = server_endpoint(server_config(&a, ALPN)?)?;
    let client = client_endpoint()?;
    let (server_side, client_side) =
        tokio::join!(accept_one(&server), client_refusal(&client, client_config(&b, ALPN)?, addr, "dc-a"),);
    let Err(server_error) = server_side? else {
        bail!("server accepted an expired client certificate");
    };
    let expected = crypto_code(AlertDescription::CertificateExpired);
    assert_eq!(error_code(&server_error), Some(expected), "{server_error}");
    assert_eq!(error_code(&client_side?), Some(expected));
    Ok(())
}

#[tokio::test]
async fn reload_serves_new_certificate_to_new_connections_and_keeps_open_ones() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = dev_pki(dir.path(), &["dc-a", "dc-b"])?;
    let a_paths = pki.paths("dc-a").context("dc-a")?.clone();
    let tls = ReloadableTls::load(a_paths.clone())?;
    let old_cert = tls.current().cert_der().clone();
    let b = material(&pki, "dc-b")?;

    let (server, addr) = server_endpoint(tls.server_config(ALPN)?)?;
    let echo = spawn_echo_server(server.clone());
    let client = client_endpoint()?;

    let old_conn = timeout(WAIT, client.connect_with(client_config(&b, ALPN)?, addr, "dc-a")?).await??;
    assert_eq!(round_trip(&old_conn, b"before").await?, b"before");
    assert_eq!(peer_cert(&old_conn)?, old_cert);
    // A stream opened before the rotation and finished after it.
    let (mut open_send, mut open_recv) = timeout(WAIT, old_conn.open_bi()).await??;
    open_send.write_all(b"half ").await?;

    // Rotate: new key and certificate for the same DC under the same CA.
    let now = SystemTime::now();
    let rotated = generate_dc_cert(
        &read_string(&pki.ca_cert)?,
        &read_string(&pki.ca_key)?,
        "dc-a",
        now - Duration::from_secs(60),
        now + 30 * DAY,
    )?;
    rotated.write(&a_paths.cert, &a_paths.key, true)?;
    let new_cert = cert_der_from_pem(&rotated.cert_pem)?;
    assert_ne!(new_cert, old_cert);
    let reloaded = tls.reload()?;
    assert_eq!(reloaded.cert_der(), &new_cert);
    assert_eq!(tls.current().cert_der(), &new_cert);
    server.set_server_config(Some(tls.server_config(ALPN)?));

    let new_conn = timeout(WAIT, client.connect_with(client_config(&b, ALPN)?, addr, "dc-a")?).await??;
    assert_eq!(peer_cert(&new_conn)?, new_cert);
    assert_eq!(peer_dc(&new_conn)?, "dc-a");
    assert_eq!(round_trip(&new_conn, b"after").await?, b"after");

    // The established connection and its open stream are untouched (the stream first: a
    // replication connection takes one bidirectional stream at a time).
    assert_eq!(peer_cert(&old_conn)?, old_cert);
    open_send.write_all(b"and half").await?;
    open_send.finish()?;
    let echoed = timeout(WAIT, open_recv.read_to_end(READ_BYTES_MAX)).await??;
    assert_eq!(echoed, b"half and half");
    assert_eq!(round_trip(&old_conn, b"still here").await?, b"still here");

    old_conn.close(0u32.into(), b"done");
    new_conn.close(0u32.into(), b"done");
    server.close(0u32.into(), b"done");
    timeout(WAIT, echo).await??;
    Ok(())
}

#[tokio::test]
async fn failed_reload_keeps_the_material_in_use() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = dev_pki(dir.path(), &["dc-a", "dc-b"])?;
    let other = dev_pki(&dir.path().join("other"), &["dc-a"])?;
    let a_paths = pki.paths("dc-a").context("dc-a")?.clone();
    let tls = ReloadableTls::load(a_paths.clone())?;
    let in_use = tls.current().cert_der().clone();
    let original_cert = read_string(&a_paths.cert)?;
    let original_key = read_string(&a_paths.key)?;
    let restore = || -> Result<()> {
        std::fs::write(&a_paths.cert, &original_cert)?;
        std::fs::write(&a_paths.key, &original_key)?;
        Ok(())
    };

    // Garbage in the certificate file.
    std::fs::write(&a_paths.cert, "not a certificate")?;
    let error = tls.reload().err().context("reload accepted garbage")?;
    assert!(
        matches!(&error, TlsError::NoPemItem { role: FileRole::Cert, path } if *path == a_paths.cert),
        "{error:?}"
    );
    assert!(error.to_string().contains(&a_paths.cert.display().to_string()));
    assert_eq!(tls.current().cert_der(), &in_use);

    // A new certificate whose key has not been written yet.
    let now = SystemTime::now();
    let half_rotated = generate_dc_cert(
        &read_string(&pki.ca_cert)?,
        &read_string(&pki.ca_key)?,
        "dc-a",
        now - Duration::from_secs(60),
        now + DAY,
    )?;
    std::fs::write(&a_paths.cert, &half_rotated.cert_pem)?;
    assert!(matches!(tls.reload(), Err(TlsError::KeyMismatch { .. })));
    assert_eq!(tls.current().cert_der(), &in_use);

    // A certificate for another DC.
    let b_paths = pki.paths("dc-b").context("dc-b")?;
    std::fs::write(&a_paths.cert, read_string(&b_paths.cert)?)?;
    std::fs::write(&a_paths.key, read_string(&b_paths.key)?)?;
    assert!(matches!(
        tls.reload(),
        Err(TlsError::IdentityChanged { ref loaded, ref reloaded, .. })
            if loaded == "dc-a" && reloaded == "dc-b"
    ));
    assert_eq!(tls.current().cert_der(), &in_use);

    // A certificate for the right DC from a CA we do not trust.
    let foreign = other.paths("dc-a").context("other dc-a")?;
    std::fs::write(&a_paths.cert, read_string(&foreign.cert)?)?;
    std::fs::write(&a_paths.key, read_string(&foreign.key)?)?;
    assert!(matches!(tls.reload(), Err(TlsError::CertNotTrusted { .. })));
    assert_eq!(tls.current().cert_der(), &in_use);

    // A missing key file.
    restore()?;
    std::fs::remove_file(&a_paths.key)?;
    assert!(matches!(
        tls.reload(),
        Err(TlsError::Missing { role: FileRole::Key, ref path }) if *path == a_paths.key
    ));
    assert_eq!(tls.current().cert_der(), &in_use);

    // Repaired files reload fine, and configs still build throughout.
    restore()?;
    tls.reload()?;
    tls.server_config(ALPN)?;
    tls.client_config(ALPN)?;
    Ok(())
}

#[test]
fn load_errors_name_the_file_and_the_problem() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = dev_pki(dir.path(), &["dc-a", "dc-b"])?;
    let a = pki.paths("dc-a").context("dc-a")?;
    let b = pki.paths("dc-b").context("dc-b")?;

    let missing = TlsPaths { ca_cert: dir.path().join("nope.pem"), ..a.clone() };
    let error = TlsMaterial::load(&missing).err().context("loaded a missing CA")?;
    assert!(matches!(error, TlsError::Missing { role: FileRole::CaCert, .. }));
    assert!(error.to_string().contains("nope.pem"), "{error}");

    let truncated_path = dir.path().join("truncated.pem");
    let cert_pem = read_string(&a.cert)?;
    std::fs::write(&truncated_path, &cert_pem[..cert_pem.len() / 2])?;
    let truncated = TlsPaths { cert: truncated_path.clone(), ..a.clone() };
    let error = TlsMaterial::load(&truncated).err().context("loaded half a PEM")?;
    assert!(
        matches!(&error, TlsError::Pem { role: FileRole::Cert, path, .. } if *path == truncated_path),
        "{error:?}"
    );

    let key_as_cert = TlsPaths { cert: a.key.clone(), ..a.clone() };
    assert!(matches!(TlsMaterial::load(&key_as_cert), Err(TlsError::NoPemItem { role: FileRole::Cert, .. })));

    let cert_as_key = TlsPaths { key: a.cert.clone(), ..a.clone() };
    assert!(matches!(TlsMaterial::load(&cert_as_key), Err(TlsError::NoPemItem { role: FileRole::Key, .. })));

    let mismatched = TlsPaths { key: b.key.clone(), ..a.clone() };
    let error = TlsMaterial::load(&mismatched).err().context("loaded a foreign key")?;
    assert!(matches!(error, TlsError::KeyMismatch { .. }), "{error:?}");
    assert!(error.to_string().contains("dc-b.key"), "{error}");
    Ok(())
}

#[test]
fn dev_pki_writes_private_keys_0600_and_never_overwrites_unasked() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = dev_pki(dir.path(), &["dc-a", "dc-b"])?;
    assert_eq!(pki.ca_cert, dir.path().join("ca.pem"));
    assert_eq!(pki.ca_key, dir.path().join("ca.key"));
    let a = pki.paths("dc-a").context("dc-a")?;
    assert_eq!(a.cert, dir.path().join("dc-a.pem"));
    assert_eq!(a.key, dir.path().join("dc-a.key"));
    TlsMaterial::load(a)?.check_chain(SystemTime::now())?;

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for key in [&pki.ca_key, &a.key, &pki.paths("dc-b").context("dc-b")?.key] {
            let mode = std::fs::metadata(key)?.permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", key.display());
        }
    }

    let before = read_string(&a.cert)?;
    let error = generate_dev_pki(dir.path(), &["dc-a", "dc-c"], false)
        .err()
        .context("overwrote without being asked")?;
    assert!(matches!(error, TlsError::Exists { .. }), "{error:?}");
    assert_eq!(read_string(&a.cert)?, before);
    assert!(!dir.path().join("dc-c.pem").exists(), "nothing is written on refusal");

    let again = generate_dev_pki(dir.path(), &["dc-a"], true)?;
    assert_ne!(read_string(&a.cert)?, before);
    TlsMaterial::load(again.paths("dc-a").context("dc-a")?)?.check_chain(SystemTime::now())?;

    assert!(matches!(
        generate_dev_pki(dir.path(), &["dc-a", "dc-a"], true),
        Err(TlsError::DuplicateDc { .. })
    ));
    for bad in ["", "DC-A", "ca", "dc_a", "-dc", "10.0.0.1", "dc..a"] {
        assert!(
            matches!(
                generate_dev_pki(&dir.path().join("bad"), &[bad], false),
                Err(TlsError::InvalidDcName { .. })
            ),
            "{bad:?} accepted"
        );
    }
    Ok(())
}

#[test]
fn dc_cert_generation_refuses_a_ca_key_that_is_not_the_cas() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let one = dev_pki(&dir.path().join("one"), &[])?;
    let two = dev_pki(&dir.path().join("two"), &[])?;
    let now = SystemTime::now();
    let result =
        generate_dc_cert(&read_string(&one.ca_cert)?, &read_string(&two.ca_key)?, "dc-a", now, now + DAY);
    assert!(matches!(result, Err(TlsError::NotDevCa)), "{result:?}");
    let result = generate_dc_cert(&read_string(&one.ca_cert)?, &read_string(&one.ca_key)?, "dc-a", now, now);
    assert!(matches!(result, Err(TlsError::InvalidValidity { .. })), "{result:?}");
    Ok(())
}

#[cfg(unix)]
#[test]
fn a_key_file_others_may_write_or_another_user_owns_is_refused() -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir()?;
    let pki = dev_pki(dir.path(), &["dc-a"])?;
    let a = pki.paths("dc-a").context("dc-a")?;
    let set_mode = |m: u32| std::fs::set_permissions(&a.key, std::fs::Permissions::from_mode(m));
    // Readable by others: loaded (with a warning).
    set_mode(0o644)?;
    TlsMaterial::load(a)?;
    // Writable by group or others: refused, and the message names the file and the mode.
    set_mode(0o620)?;
    let error = TlsMaterial::load(a).err().context("a group-writable key was loaded")?;
    assert!(matches!(error, TlsError::KeyFileUnsafe { .. }), "{error:?}");
    assert!(error.to_string().contains("mode 620"), "{error}");
    set_mode(0o600)?;
    // Owned by another user: refused (only a privileged test run can hand the file over).
    let handed_over = std::process::Command::new("chown").arg("12345").arg(&a.key).status();
    if handed_over.is_ok_and(|s| s.success()) {
        let error = TlsMaterial::load(a).err().context("a key owned by another user was loaded")?;
        assert!(error.to_string().contains("owned by uid 12345"), "{error}");
    }
    Ok(())
}
