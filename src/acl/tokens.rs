//! The tokens file: one `[[tokens]]` entry per token with its public id, the SHA-256 of its
//! secret, its policies and an optional expiry. Never the secret itself. Written 0600 by
//! `tandem acl token create` (and at the first start with ACLs on, for the bootstrap admin
//! token); re-read by the node on reload. Revoking a token is deleting its entry and
//! reloading.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{AclError, ADMIN_POLICY};

/// Prefix of every secret, so a leaked one is easy to recognise (and to scan for).
pub const SECRET_PREFIX: &str = "tdm_";
/// Largest tokens file read, bytes.
pub const TOKENS_FILE_BYTES_MAX: u64 = 4 << 20;
/// Where the bootstrap admin token is written, inside the data dir (0600).
pub const BOOTSTRAP_FILE: &str = "acl-bootstrap-token";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenFile {
    #[serde(default)]
    pub tokens: Vec<TokenEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// Public id, for logs, audit and revocation.
    pub id: String,
    /// SHA-256 of the secret, 64 hex digits.
    pub sha256: String,
    pub policies: Vec<String>,
    /// Who owns the instances this token registers (default: the token's id). Tokens that
    /// share a principal share ownership, so a successor token (rotation) keeps them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub created_at_ms: u64,
    /// Refused from this wall-clock ms on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}

impl TokenEntry {
    pub(super) fn hash(&self) -> Result<[u8; 32], AclError> {
        let bad = || AclError::BadHash { id: self.id.clone() };
        let bytes = hex::decode(&self.sha256).map_err(|_| bad())?;
        bytes.try_into().map_err(|_| bad())
    }
}

/// The SHA-256 of a presented secret. Secrets are 256 random bits, so a fast hash is
/// enough: there is nothing to guess from it.
pub fn hash_secret(secret: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// A new secret: the prefix and 256 random bits in hex.
pub fn generate_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("{SECRET_PREFIX}{}", hex::encode(bytes))
}

impl TokenFile {
    /// Reads the tokens file; a missing file holds no tokens.
    pub fn load(path: &Path) -> Result<TokenFile, AclError> {
        let err = |reason: String| AclError::File { path: path.display().to_string(), reason };
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TokenFile::default()),
            Err(e) => return Err(err(e.to_string())),
        };
        if meta.len() > TOKENS_FILE_BYTES_MAX {
            return Err(err(format!("larger than {TOKENS_FILE_BYTES_MAX} bytes")));
        }
        check_private(path, &meta).map_err(err)?;
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        // The parser's message names the line; the file holds no secrets, only hashes.
        toml::from_str(&text).map_err(|e| err(e.message().to_owned()))
    }

    /// Writes the file whole (a temporary file, then a rename), mode 0600.
    pub fn store(&self, path: &Path) -> Result<(), AclError> {
        let err = |reason: String| AclError::File { path: path.display().to_string(), reason };
        let text = String::from("# tandem ACL tokens: SHA-256 hashes of the secrets, never the secrets.\n")
            + &toml::to_string(self).map_err(|e| err(e.to_string()))?;
        let tmp = path.with_extension("tmp");
        write_private(&tmp, text.as_bytes()).map_err(|e| err(e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(|e| err(e.to_string()))
    }

    /// Adds a token with these policies; returns its entry and the secret (shown once).
    pub fn create(
        &mut self,
        policies: Vec<String>,
        description: String,
        now_ms: u64,
        expires_at_ms: Option<u64>,
    ) -> (TokenEntry, String) {
        let secret = generate_secret();
        let entry = TokenEntry {
            id: format!("t-{}", uuid::Uuid::now_v7().simple()),
            sha256: hex::encode(hash_secret(&secret)),
            policies,
            principal: None,
            description,
            created_at_ms: now_ms,
            expires_at_ms,
        };
        self.tokens.push(entry.clone());
        (entry, secret)
    }
}

/// At the first start with ACLs on (no tokens file yet): creates the tokens file with one
/// admin token and writes its secret to `<data_dir>/acl-bootstrap-token` (0600). Returns
/// the path of that file when it made one.
pub fn bootstrap(tokens_path: &Path, data_dir: &Path, now_ms: u64) -> Result<Option<PathBuf>, AclError> {
    if tokens_path.exists() {
        return Ok(None);
    }
    let mut file = TokenFile::default();
    let (_, secret) = file.create(vec![ADMIN_POLICY.into()], "bootstrap admin token".into(), now_ms, None);
    let secret_path = data_dir.join(BOOTSTRAP_FILE);
    write_private(&secret_path, format!("{secret}\n").as_bytes())
        .map_err(|e| AclError::File { path: secret_path.display().to_string(), reason: e.to_string() })?;
    file.store(tokens_path)?;
    Ok(Some(secret_path))
}

/// Creates (or truncates) a file readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// The tokens file decides who may do what: refuse one others may write.
fn check_private(path: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt as _;
    if meta.mode() & 0o022 != 0 {
        return Err(format!("{} is writable by group or others; chmod 600 it", path.display()));
    }
    Ok(())
}
