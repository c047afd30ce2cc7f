//! Mutual TLS for the replication link between DC gateways.
//!
//! What this module does:
//! - Loads a DC's TLS material (CA certificate, own certificate chain, private key) from PEM
//!   files, with errors that name the file and say what is wrong with it.
//! - Builds quinn server and client configurations that require *mutual* authentication
//!   against the configured CA: the server demands a client certificate, the client checks
//!   that the server certificate carries the DC name it dialled (`server_name` = peer DC)
//!   and no other name: both sides apply the same identity rule, exactly one DC name.
//! - Tells the caller which DC is on the other end of an established connection
//!   ([`peer_dc`]): the single DNS subject alternative name of the peer's certificate.
//! - Does the same for the member link inside a DC ([`peer_node`]): a node's certificate
//!   names one node, `n<id>.<dc>.tandem-node` ([`NodeName`]). A node's certificate is never
//!   a DC's and a DC's never a node's, in either direction of either link (the label
//!   `tandem-node` is reserved, and each link's configs refuse the other kind of material).
//! - Reloads material without a restart ([`ReloadableTls`]).
//! - Generates a development PKI ([`generate_dev_pki`]) and single DC certificates
//!   ([`generate_dc_cert`]) for tests, rotation drills and local setups, and other
//!   certificates under the same CA ([`generate_leaf_cert`]: HTTPS servers, client
//!   certificates).
//! - Offers its file readers to the node's HTTPS listener ([`load_cert_chain`],
//!   [`load_key_for`] with the key file's owner and mode rules, [`load_roots`]).
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
//!
//! Where things are:
//! - `material`: loading a DC's PEM files into cross-checked material.
//! - `config`: the quinn server and client configurations (mutual TLS, TLS 1.3, one ALPN id).
//! - `identity`: DC and node names and the peer's identity read from its certificate
//!   ([`peer_dc`], [`peer_node`]).
//! - `reload`: [`ReloadableTls`], material re-read while the process runs.
//! - `dev_pki`: development CA and DC certificate generation.
//! - `pem_file`: writing generated PEM files (temporary file, then rename or link).
//! - `error`: [`TlsError`] and what it says about each file.
//!
//! The QUIC transport settings ([`TransportTuning`](crate::gateway::TransportTuning)) belong
//! to the gateway; the configs here take them as an argument.

mod config;
mod dev_pki;
mod error;
mod identity;
mod material;
mod pem_file;
mod reload;

pub use config::{client_config, client_config_tuned, server_config, server_config_tuned};
pub(crate) use config::{client_config_with, server_config_with, NameRule};
pub use dev_pki::{
    generate_dc_cert, generate_dev_ca, generate_dev_node_certs, generate_dev_pki, generate_leaf_cert,
    generate_node_cert, node_cert_paths, DevPki, GeneratedCert, DEV_CA_CERT_FILE, DEV_CA_KEY_FILE,
    DEV_CA_VALIDITY, DEV_CLOCK_SKEW_ALLOWANCE, DEV_DC_CERT_VALIDITY,
};
pub use error::{CaInputError, FileRole, TlsError};
pub use identity::{peer_dc, peer_node, validate_dc_name, NodeName, DC_NAME_BYTES_MAX, NODE_NAME_SUFFIX};
pub use material::{load_cert_chain, load_key_for, load_roots, TlsMaterial, TlsPaths};
pub use reload::ReloadableTls;
