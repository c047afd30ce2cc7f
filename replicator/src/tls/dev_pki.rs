//! Development PKI generation: a self-signed development CA, DC certificates signed by it,
//! and [`generate_dev_pki`], which writes both for a set of DCs (tests, drills, local setups).

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::pem_file::refuse_existing;
use super::{validate_dc_name, CaInputError, FileRole, NodeName, TlsError, TlsPaths};

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

/// Subject common name of every development CA; [`generate_dc_cert`] relies on it.
const DEV_CA_COMMON_NAME: &str = "tandem development CA";
const DEV_CA_ORGANIZATION: &str = "tandem";
/// Latest instant a certificate may name: 9999-12-31T23:59:59Z (X.509 GeneralizedTime).
const CERT_TIME_SECS_MAX: u64 = 253_402_300_799;

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
    let (rebuilt, ca_key) = dev_ca_from_pem(ca_cert_pem, ca_key_pem, not_before, not_after)?;
    sign_leaf(&rebuilt, &ca_key, dc, &[dc.to_owned()], not_before, not_after)
}

/// A new certificate for member node `node` of a DC's Raft group, signed by a development
/// CA, valid from `not_before` to `not_after`. Its only DNS SAN is the node's name
/// (`n<id>.<dc>.tandem-node`): the member link accepts it, the DC replication link never
/// does. It allows server and client authentication.
pub fn generate_node_cert(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    node: &NodeName,
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<GeneratedCert, TlsError> {
    validate_dc_name(&node.dc)?;
    let (rebuilt, ca_key) = dev_ca_from_pem(ca_cert_pem, ca_key_pem, not_before, not_after)?;
    let name = node.dns_name();
    sign_leaf(&rebuilt, &ca_key, &name, std::slice::from_ref(&name), not_before, not_after)
}

/// Where [`generate_dev_node_certs`] writes node `node`'s files in `dir`:
/// `<node name>.pem` and `.key` beside the CA's `ca.pem` (no DC's files can collide: no DC
/// name ends with the node names' reserved label).
pub fn node_cert_paths(dir: &Path, node: &NodeName) -> TlsPaths {
    let name = node.dns_name();
    TlsPaths {
        ca_cert: dir.join(DEV_CA_CERT_FILE),
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}.key")),
    }
}

/// Writes a certificate and key for each of `nodes` of DC `dc` into `dir`, signed by the
/// development CA already there (`ca.pem`, `ca.key`, made by [`generate_dev_pki`]), valid
/// as long as a DC certificate. Without `overwrite`, fails with [`TlsError::Exists`] before
/// writing anything if any target file exists.
pub fn generate_dev_node_certs(
    dir: &Path,
    dc: &str,
    nodes: &[u64],
    overwrite: bool,
) -> Result<Vec<(NodeName, TlsPaths)>, TlsError> {
    let named = nodes
        .iter()
        .map(|id| NodeName::new(dc, *id).map(|node| (node.clone(), node_cert_paths(dir, &node))))
        .collect::<Result<Vec<_>, _>>()?;
    if !overwrite {
        let targets: Vec<&Path> =
            named.iter().flat_map(|(_, p)| [p.cert.as_path(), p.key.as_path()]).collect();
        refuse_existing(&targets)?;
    }
    let read = |role: FileRole, path: PathBuf| {
        fs::read_to_string(&path).map_err(|source| TlsError::Read { role, path, source })
    };
    let ca_cert = read(FileRole::CaCert, dir.join(DEV_CA_CERT_FILE))?;
    let ca_key = read(FileRole::CaKey, dir.join(DEV_CA_KEY_FILE))?;
    let now = SystemTime::now();
    let not_before = now.checked_sub(DEV_CLOCK_SKEW_ALLOWANCE).unwrap_or(UNIX_EPOCH);
    let not_after = now
        .checked_add(DEV_DC_CERT_VALIDITY)
        .ok_or(TlsError::InvalidValidity { reason: "certificate expiry overflows the clock" })?;
    let certs = named
        .iter()
        .map(|(node, _)| generate_node_cert(&ca_cert, &ca_key, node, not_before, not_after))
        .collect::<Result<Vec<_>, _>>()?;
    for ((_, paths), cert) in named.iter().zip(&certs) {
        cert.write(&paths.cert, &paths.key, overwrite)?;
    }
    Ok(named)
}

/// A new certificate signed by a development CA, with subject common name `common_name`
/// and the subject alternative names `alt_names` (DNS names, or IP addresses written as
/// such), valid from `not_before` to `not_after`, allowing server and client
/// authentication: an HTTPS listener's certificate, or a client certificate.
pub fn generate_leaf_cert(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    common_name: &str,
    alt_names: &[String],
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<GeneratedCert, TlsError> {
    let (rebuilt, ca_key) = dev_ca_from_pem(ca_cert_pem, ca_key_pem, not_before, not_after)?;
    sign_leaf(&rebuilt, &ca_key, common_name, alt_names, not_before, not_after)
}

fn sign_leaf(
    ca: &rcgen::Certificate,
    ca_key: &KeyPair,
    common_name: &str,
    alt_names: &[String],
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<GeneratedCert, TlsError> {
    let mut params = CertificateParams::new(alt_names.to_vec())
        .map_err(|source| TlsError::Generate { what: "certificate parameters", source })?;
    set_validity(&mut params, not_before, not_after)?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name.push(DnType::OrganizationName, DEV_CA_ORGANIZATION);
    params.distinguished_name = name;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages =
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().map_err(|source| TlsError::Generate { what: "certificate key", source })?;
    let cert = params
        .signed_by(&key, ca, ca_key)
        .map_err(|source| TlsError::Generate { what: "certificate", source })?;
    Ok(GeneratedCert { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// The development CA of `ca_cert_pem` and `ca_key_pem`, rebuilt so it can sign.
fn dev_ca_from_pem(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<(rcgen::Certificate, KeyPair), TlsError> {
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

    Ok((rebuilt, ca_key))
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn debug_output_never_contains_the_private_key() {
        let ca =
            generate_dev_ca(UNIX_EPOCH + Duration::from_secs(1), SystemTime::now() + Duration::from_secs(60))
                .unwrap();
        let shown = format!("{ca:?}");
        assert!(!shown.contains("PRIVATE KEY"));
        assert!(!shown.contains(&ca.key_pem));
    }
}
