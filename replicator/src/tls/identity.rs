//! Identity: which names are valid DC names, and which DC a certificate (or the peer of an
//! established connection) identifies — exactly one DNS subject alternative name; and the
//! same for a member node of a DC's Raft group, whose one name is `n<id>.<dc>.tandem-node`.
//!
//! The two kinds never stand in for each other: the top-level label `tandem-node` is
//! reserved, so no DC name ends with it ([`validate_dc_name`]) and a node's name is never a
//! DC's; a DC's name never has the node form. The DC replication link reads DC names only
//! ([`peer_dc`]), the member link node names only ([`peer_node`]).

use rustls::pki_types::{CertificateDer, ServerName};

use super::TlsError;

/// Longest DC name accepted (a DNS label is at most 63 bytes; a DC name may have dots).
pub const DC_NAME_BYTES_MAX: usize = 253;
/// The reserved top-level label of every node name (`n<id>.<dc>.tandem-node`).
pub const NODE_NAME_SUFFIX: &str = "tandem-node";
/// At most this many names are copied into an error about a certificate's names.
const ERROR_NAMES_MAX: usize = 8;

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
    if name.rsplit('.').next() == Some(NODE_NAME_SUFFIX) {
        return Err(invalid("the label \"tandem-node\" is reserved for node certificates"));
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

/// The DC on the other end of an established connection: the single DNS subject
/// alternative name of the peer's end-entity certificate.
///
/// The certificate chain was verified against the CA during the handshake (configs from
/// this module make that mandatory on both sides); this function only reads the name.
/// The caller must still check the name against its configured peers.
pub fn peer_dc(conn: &quinn::Connection) -> Result<String, TlsError> {
    peer_names(conn, |names| {
        single_dc_name(names).ok_or_else(|| TlsError::PeerDcName { names: capped(names.iter().copied()) })
    })
}

/// Runs `read` on the DNS names of the peer's end-entity certificate (verified against
/// the CA in the handshake).
fn peer_names<T>(
    conn: &quinn::Connection,
    read: impl FnOnce(&[&str]) -> Result<T, TlsError>,
) -> Result<T, TlsError> {
    let identity = conn.peer_identity().ok_or(TlsError::NoPeerCertificate)?;
    let chain =
        identity.downcast::<Vec<CertificateDer<'static>>>().map_err(|_| TlsError::NoPeerCertificate)?;
    let end_entity = chain.first().ok_or(TlsError::NoPeerCertificate)?;
    let names = cert_dns_names(end_entity).map_err(|source| TlsError::PeerCertificate { source })?;
    read(&names)
}

/// A member node of a DC's Raft group, as its certificate names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeName {
    /// The DC the node belongs to (a valid DC name).
    pub dc: String,
    /// The node's id in that DC's group.
    pub id: u64,
}

impl NodeName {
    /// Node `id` of DC `dc`; fails if `dc` is not a valid DC name.
    pub fn new(dc: &str, id: u64) -> Result<NodeName, TlsError> {
        validate_dc_name(dc)?;
        Ok(NodeName { dc: dc.to_owned(), id })
    }

    /// The DNS name a node certificate carries: `n<id>.<dc>.tandem-node`.
    pub fn dns_name(&self) -> String {
        format!("n{}.{}.{NODE_NAME_SUFFIX}", self.id, self.dc)
    }

    /// Reads a node name back: `n<id>` (decimal, no leading zero), a valid DC name, the
    /// reserved label. Anything else is not a node name.
    pub fn parse(name: &str) -> Option<NodeName> {
        let rest = name.strip_suffix(NODE_NAME_SUFFIX)?.strip_suffix('.')?;
        let (first, dc) = rest.split_once('.')?;
        let digits = first.strip_prefix('n')?;
        let id: u64 = digits.parse().ok()?;
        (id.to_string() == digits && validate_dc_name(dc).is_ok()).then(|| NodeName { dc: dc.to_owned(), id })
    }
}

impl std::fmt::Display for NodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {} of {}", self.id, self.dc)
    }
}

/// The member node on the other end of an established member-link connection: the single
/// DNS subject alternative name of the peer's certificate, in the node form. The caller
/// must still check that it is a configured member of the own DC.
pub fn peer_node(conn: &quinn::Connection) -> Result<NodeName, TlsError> {
    peer_names(conn, |names| {
        single_node_name(names).ok_or_else(|| TlsError::PeerNodeName { names: capped(names.iter().copied()) })
    })
}

pub(super) fn single_node_name(names: &[&str]) -> Option<NodeName> {
    match names {
        [name] => NodeName::parse(name),
        _ => None,
    }
}

pub(super) fn cert_dns_names<'a>(der: &'a CertificateDer<'a>) -> Result<Vec<&'a str>, webpki::Error> {
    let cert = webpki::EndEntityCert::try_from(der)?;
    // Bounded: a name list longer than this cannot identify a single DC anyway.
    Ok(cert.valid_dns_names().take(ERROR_NAMES_MAX + 1).collect())
}

pub(super) fn single_dc_name(names: &[&str]) -> Option<String> {
    match names {
        [name] if validate_dc_name(name).is_ok() => Some((*name).to_owned()),
        _ => None,
    }
}

pub(super) fn capped<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    names.take(ERROR_NAMES_MAX).map(str::to_owned).collect()
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
        for bad in [
            "",
            "ca",
            "DC-A",
            "dc_a",
            "-dc",
            "dc-",
            "dc..a",
            ".dc",
            "dc.",
            "10.0.0.1",
            "*.dc",
            &too_long,
            "tandem-node",
            "n1.dc-a.tandem-node",
        ] {
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
        assert_eq!(single_dc_name(&["n1.dc-a.tandem-node"]), None, "a node's name is never a DC's");
    }

    #[test]
    fn a_node_name_round_trips_and_nothing_else_is_one() {
        for (dc, id) in [("dc-a", 1), ("eu-west-1", 0), ("dc1.example", u64::MAX)] {
            let node = NodeName::new(dc, id).unwrap();
            assert_eq!(NodeName::parse(&node.dns_name()), Some(node.clone()));
            assert_eq!(single_node_name(&[&node.dns_name()]), Some(node));
        }
        assert!(NodeName::new("ca", 1).is_err());
        for bad in [
            "dc-a",
            "n1.dc-a",
            "1.dc-a.tandem-node",
            "n01.dc-a.tandem-node",
            "n-1.dc-a.tandem-node",
            "nx.dc-a.tandem-node",
            "n1..tandem-node",
            "n1.DC-A.tandem-node",
            "n1.ca.tandem-node",
            "n1.dc-a.tandem-node.x",
            "n18446744073709551616.dc-a.tandem-node",
        ] {
            assert_eq!(NodeName::parse(bad), None, "{bad:?} read as a node name");
        }
        assert_eq!(single_node_name(&["n1.dc-a.tandem-node", "n2.dc-a.tandem-node"]), None);
        assert_eq!(single_node_name(&["dc-a"]), None, "a DC's name is never a node's");
    }
}
