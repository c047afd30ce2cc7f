//! The `[acl]` section of the config: whether ACLs are on, where the tokens file is, and
//! the policies tokens may name.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Grants, Rule, ADMIN_POLICY};

/// `[acl]`. `enabled` has no default on purpose: a node whose `http_addr` is not a
/// loopback address refuses to start until the config says `true` or `false`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AclSection {
    pub enabled: Option<bool>,
    /// The tokens file (hashes only); default `<data_dir>/acl-tokens.toml`. Re-read on
    /// reload.
    pub tokens_file: Option<PathBuf>,
    pub policies: Vec<PolicySection>,
    /// `[[acl.certs]]`: client certificates (`[http.tls] client_ca`) that authenticate
    /// without a token, by name, with their policies.
    pub certs: Vec<CertSection>,
}

/// `[[acl.certs]]`: a verified client certificate whose name (its subject common name, else
/// its first DNS name) is `name` is the principal `cert:<name>` with `policies`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertSection {
    pub name: String,
    pub policies: Vec<String>,
}

/// `[[acl.policies]]`: a named set of grants.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySection {
    pub name: String,
    #[serde(default)]
    pub rules: Vec<RuleSection>,
    /// Reload, retire or unretire a DC, hand a group's lead over (`/v1/admin/*`).
    #[serde(default)]
    pub admin: bool,
    /// `GET /v1/status`.
    #[serde(default)]
    pub status: bool,
    /// `GET /metrics`.
    #[serde(default)]
    pub metrics: bool,
}

/// One rule of a policy: `read` and/or `write` on a namespace (`"*"`: all) and the services
/// whose names start with `service_prefix` (empty: all; listing a namespace needs a rule
/// without a prefix).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSection {
    pub namespace: String,
    #[serde(default)]
    pub service_prefix: String,
    #[serde(default)]
    pub read: bool,
    #[serde(default)]
    pub write: bool,
}

impl PolicySection {
    pub(super) fn grants(&self) -> Grants {
        Grants {
            rules: self
                .rules
                .iter()
                .map(|r| Rule {
                    namespace: r.namespace.clone(),
                    service_prefix: r.service_prefix.clone(),
                    read: r.read,
                    write: r.write,
                })
                .collect(),
            admin: self.admin,
            status: self.status,
            metrics: self.metrics,
        }
    }
}

impl AclSection {
    /// The tokens file of a node whose data dir is `data_dir`.
    pub fn tokens_path(&self, data_dir: &Path) -> PathBuf {
        self.tokens_file.clone().unwrap_or_else(|| data_dir.join("acl-tokens.toml"))
    }

    /// Checks names and rules; returns the key at fault and why.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let mut seen = std::collections::BTreeSet::new();
        for p in &self.policies {
            let key = format!("[[acl.policies]] {:?}", p.name);
            if p.name.is_empty()
                || p.name.len() > 64
                || !p.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err((key, "name: 1-64 of letters, digits, - _ .".into()));
            }
            if p.name == ADMIN_POLICY {
                return Err((key, "\"admin\" is built in (it grants everything)".into()));
            }
            if !seen.insert(p.name.as_str()) {
                return Err((key, "defined twice".into()));
            }
            for r in &p.rules {
                if r.namespace != "*" {
                    tandem_schemas::validate_name("namespace", &r.namespace)
                        .map_err(|e| (key.clone(), e.to_string()))?;
                }
                if r.service_prefix.len() > 128 {
                    return Err((key.clone(), "service_prefix: at most 128 bytes".into()));
                }
                if !r.read && !r.write {
                    return Err((key.clone(), "a rule grants read, write or both".into()));
                }
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for c in &self.certs {
            let key = format!("[[acl.certs]] {:?}", c.name);
            if c.name.is_empty()
                || c.name.len() > crate::http::tls::CERT_NAME_BYTES_MAX
                || c.name.chars().any(char::is_control)
            {
                return Err((key, "name: 1-128 bytes, no control characters".into()));
            }
            if !names.insert(c.name.as_str()) {
                return Err((key, "defined twice".into()));
            }
            if c.policies.is_empty() {
                return Err((key, "policies: at least one".into()));
            }
            for name in &c.policies {
                if name != ADMIN_POLICY && !self.policies.iter().any(|p| &p.name == name) {
                    return Err((key, format!("policy {name:?} is not defined under [[acl.policies]]")));
                }
            }
        }
        Ok(())
    }
}
