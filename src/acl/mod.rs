//! Access control: tokens with policies, deny by default when `[acl] enabled = true`.
//!
//! A token is a random 256-bit secret shown once. The node keeps only the SHA-256 of each
//! secret (in the tokens file, `tokens.rs`) and finds a presented token by the hash of what
//! was presented, so no comparison of secrets depends on how much of one matched. A token
//! names policies; a policy grants `read` (discover, watch, list) and/or `write` (register,
//! heartbeat, deregister, status) per namespace and optional service prefix, plus the
//! operator scopes `admin` (reload, retire a DC), `status` and `metrics`. The built-in
//! policy `admin` grants everything. Only the token grants anything: no other header, no
//! client address, no default secret.
//!
//! A client certificate verified by the HTTPS listener (`[http.tls] client_ca`) also
//! authenticates, like etcd's: its name (common name, else first DNS name) bound under
//! `[[acl.certs]]` is the principal `cert:<name>` with that entry's policies. A token,
//! when one is presented, decides instead (an explicit credential wins); a certificate
//! bound to nothing authenticates nobody.
//!
//! Must never: store or log a secret, or let any request through without a decision.

pub mod cli;
mod policy;
pub mod tokens;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::HeaderMap;
use parking_lot::{Mutex, RwLock};

pub use policy::{AclSection, CertSection, PolicySection, RuleSection};
use tokens::{TokenEntry, TokenFile};

/// The header a token may also be presented in (besides `Authorization: Bearer`).
pub const TOKEN_HEADER: &str = "x-tandem-token";
/// The built-in policy that grants every scope.
pub const ADMIN_POLICY: &str = "admin";

/// What a request needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    /// A valid token, whatever it grants (the handler decides on the body).
    Authenticated,
    /// Read one service, or (`service: None`) list a whole namespace.
    Read {
        namespace: String,
        service: Option<String>,
    },
    Write {
        namespace: String,
        service: String,
    },
    Admin,
    Status,
    Metrics,
}

impl Need {
    /// The scope a refusal names.
    pub fn scope(&self) -> String {
        match self {
            Need::Authenticated => "a valid token".into(),
            Need::Read { namespace, service: Some(s) } => format!("read on {namespace}/{s}"),
            Need::Read { namespace, service: None } => format!("read on all of namespace {namespace}"),
            Need::Write { namespace, service } => format!("write on {namespace}/{service}"),
            Need::Admin => "admin".into(),
            Need::Status => "status".into(),
            Need::Metrics => "metrics".into(),
        }
    }
}

/// One grant on a namespace (`*`: every namespace) and service prefix (empty: all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub namespace: String,
    pub service_prefix: String,
    pub read: bool,
    pub write: bool,
}

impl Rule {
    fn covers(&self, namespace: &str, service: Option<&str>) -> bool {
        (self.namespace == "*" || self.namespace == namespace)
            && match service {
                Some(s) => s.starts_with(&self.service_prefix),
                None => self.service_prefix.is_empty(),
            }
    }
}

/// What one principal may do: the union of its policies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    pub rules: Vec<Rule>,
    pub admin: bool,
    pub status: bool,
    pub metrics: bool,
}

impl Grants {
    fn everything() -> Grants {
        Grants {
            rules: vec![Rule {
                namespace: "*".into(),
                service_prefix: String::new(),
                read: true,
                write: true,
            }],
            admin: true,
            status: true,
            metrics: true,
        }
    }

    fn add(&mut self, other: &Grants) {
        self.rules.extend(other.rules.iter().cloned());
        self.admin |= other.admin;
        self.status |= other.status;
        self.metrics |= other.metrics;
    }

    pub fn allows(&self, need: &Need) -> bool {
        match need {
            Need::Authenticated => true,
            Need::Read { namespace, service } => {
                self.rules.iter().any(|r| r.read && r.covers(namespace, service.as_deref()))
            }
            Need::Write { namespace, service } => {
                self.rules.iter().any(|r| r.write && r.covers(namespace, Some(service)))
            }
            Need::Admin => self.admin,
            Need::Status => self.status || self.admin,
            Need::Metrics => self.metrics || self.admin,
        }
    }
}

/// Who made a request: a token's id and grants, or everyone when ACLs are off.
#[derive(Clone, Debug)]
pub struct Principal {
    /// The token's public id (`anonymous` when ACLs are off); never the secret.
    pub id: Arc<str>,
    /// Who owns what it registers: the token's `principal` when set (so a successor token
    /// with the same principal keeps the instances), else its id.
    pub name: Arc<str>,
    pub grants: Arc<Grants>,
}

impl Principal {
    pub fn anonymous() -> Principal {
        // Every request has it when ACLs are off: built once, then shared.
        static ANONYMOUS: std::sync::LazyLock<Principal> = std::sync::LazyLock::new(|| {
            let id: Arc<str> = crate::registry::ANONYMOUS.into();
            Principal { id: id.clone(), name: id, grants: Arc::new(Grants::everything()) }
        });
        ANONYMOUS.clone()
    }

    /// A principal granted nothing (a request for the console's static files, which need
    /// no token).
    pub fn nobody() -> Principal {
        let id: Arc<str> = "-".into();
        let grants = Grants { rules: Vec::new(), admin: false, status: false, metrics: false };
        Principal { id: id.clone(), name: id, grants: Arc::new(grants) }
    }

    /// The principal as instance ownership sees it.
    pub fn writer(&self) -> crate::registry::Writer {
        crate::registry::Writer { principal: self.name.clone(), admin: self.grants.admin }
    }

    /// `Ok` when the principal may do what `need` says; else the 403 error.
    pub fn check(&self, need: &Need) -> Result<(), crate::error::ApiError> {
        if self.grants.allows(need) {
            return Ok(());
        }
        Err(crate::error::ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "forbidden",
            format!("token {} lacks {}", self.id, need.scope()),
        ))
    }
}

/// Why a request was not authenticated (401).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unauthenticated {
    NoToken,
    UnknownToken,
    Expired,
    /// A verified client certificate whose name no `[[acl.certs]]` entry binds.
    UnboundCert,
}

impl Unauthenticated {
    pub fn message(self) -> &'static str {
        match self {
            Unauthenticated::NoToken => {
                "this node requires a token: Authorization: Bearer <token> or X-Tandem-Token"
            }
            Unauthenticated::UnknownToken => "unknown token",
            Unauthenticated::Expired => "token expired",
            Unauthenticated::UnboundCert => {
                "the client certificate is bound to no policy ([[acl.certs]]); present a token"
            }
        }
    }
}

/// The access rules in force: policies from the config, tokens from the tokens file.
#[derive(Debug, Default)]
pub struct Acl {
    enabled: bool,
    tokens: HashMap<[u8; 32], (TokenEntry, Arc<Grants>)>,
    /// `[[acl.certs]]`: certificate name -> the principal's id and grants.
    certs: HashMap<String, (Arc<str>, Arc<Grants>)>,
}

impl Acl {
    /// ACLs off: every request is the anonymous principal.
    pub fn disabled() -> Acl {
        Acl::default()
    }

    /// Builds the rules of `section` with the tokens of `file`. A token naming an unknown
    /// policy is refused (a typo must not silently grant nothing, or everything).
    pub fn new(section: &AclSection, file: &TokenFile) -> Result<Acl, AclError> {
        if section.enabled != Some(true) {
            return Ok(Acl::disabled());
        }
        let mut policies: HashMap<&str, Grants> = HashMap::new();
        policies.insert(ADMIN_POLICY, Grants::everything());
        for p in &section.policies {
            policies.insert(&p.name, p.grants());
        }
        let mut tokens = HashMap::new();
        for t in &file.tokens {
            let hash = t.hash()?;
            if t.id == crate::registry::ANONYMOUS
                || t.principal.as_deref() == Some(crate::registry::ANONYMOUS)
            {
                return Err(AclError::ReservedName(t.id.clone()));
            }
            let mut g = Grants::default();
            for name in &t.policies {
                let p = policies
                    .get(name.as_str())
                    .ok_or_else(|| AclError::UnknownPolicy { token: t.id.clone(), policy: name.clone() })?;
                g.add(p);
            }
            if tokens.insert(hash, (t.clone(), Arc::new(g))).is_some() {
                return Err(AclError::DuplicateToken(t.id.clone()));
            }
        }
        let mut certs = HashMap::new();
        for c in &section.certs {
            let mut g = Grants::default();
            for name in &c.policies {
                let p = policies.get(name.as_str()).ok_or_else(|| AclError::UnknownPolicy {
                    token: format!("[[acl.certs]] {}", c.name),
                    policy: name.clone(),
                })?;
                g.add(p);
            }
            let id: Arc<str> = format!("{}{}", crate::http::tls::CERT_PRINCIPAL_PREFIX, c.name).into();
            certs.insert(c.name.clone(), (id, Arc::new(g)));
        }
        Ok(Acl { enabled: true, tokens, certs })
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Number of tokens loaded.
    pub fn tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Finds the principal of a request from its token header, else from the name of its
    /// connection's verified client certificate (`cert`); `now_ms` judges expiry.
    pub fn authenticate(
        &self,
        headers: &HeaderMap,
        cert: Option<&str>,
        now_ms: u64,
    ) -> Result<Principal, Unauthenticated> {
        if !self.enabled {
            return Ok(Principal::anonymous());
        }
        let Some(secret) = presented_token(headers) else {
            let name = cert.ok_or(Unauthenticated::NoToken)?;
            let (id, grants) = self.certs.get(name).ok_or(Unauthenticated::UnboundCert)?;
            return Ok(Principal { id: id.clone(), name: id.clone(), grants: grants.clone() });
        };
        let (entry, grants) =
            self.tokens.get(&tokens::hash_secret(secret)).ok_or(Unauthenticated::UnknownToken)?;
        if entry.expires_at_ms.is_some_and(|t| now_ms >= t) {
            return Err(Unauthenticated::Expired);
        }
        let id: Arc<str> = entry.id.as_str().into();
        let name = entry.principal.as_deref().map_or_else(|| id.clone(), Arc::from);
        Ok(Principal { id, name, grants: grants.clone() })
    }
}

/// Refuses a node whose `http_addr` is not a loopback address when `[acl] enabled` is not
/// set either way (secure by default); warns at every start when it is set to `false`.
pub fn check_exposure(cfg: &crate::config::Config) -> anyhow::Result<()> {
    let exposed = !cfg.http_addr.ip().is_loopback();
    match cfg.acl.enabled {
        None if exposed => anyhow::bail!(
            "http_addr {} is not a loopback address and [acl] enabled is not set: set `enabled = true` \
             under [acl] (clients then need tokens; see docs/security.md), or `enabled = false` to \
             serve everyone who can reach the address",
            cfg.http_addr
        ),
        Some(false) if exposed => {
            tracing::warn!(http_addr = %cfg.http_addr, "ACLs are off ([acl] enabled = false): anyone who reaches http_addr may read and change every registration");
            Ok(())
        }
        Some(true) if exposed && cfg.http.tls.is_none() => {
            tracing::warn!(http_addr = %cfg.http_addr, "ACLs are on but the HTTP API is plain HTTP on a non-loopback address: tokens travel in clear text; configure [http.tls] (docs/security.md, \"HTTPS\")");
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The access rules a node starts with (after [`check_exposure`] and once its data dir
/// exists): with ACLs on and no tokens file yet, makes the bootstrap admin token first.
pub fn start(cfg: &crate::config::Config) -> anyhow::Result<Acl> {
    match cfg.acl.enabled {
        Some(false) | None => Ok(Acl::disabled()),
        Some(true) => {
            let path = cfg.acl.tokens_path(&cfg.data_dir);
            if let Some(secret_file) =
                tokens::bootstrap(&path, &cfg.data_dir, tandem_replicator::gateway::wall_ms())?
            {
                tracing::warn!(file = %secret_file.display(), "ACLs on and no tokens file: a bootstrap admin token was made; its secret is in this file (0600). Create scoped tokens with `tandem acl token create`, then delete the file");
                eprintln!(
                    "tandem: bootstrap admin token written to {} (shown nowhere else)",
                    secret_file.display()
                );
            }
            let acl = Acl::new(&cfg.acl, &tokens::TokenFile::load(&path)?)?;
            tracing::info!(tokens = acl.tokens(), file = %path.display(), "ACLs on: every request needs a token");
            Ok(acl)
        }
    }
}

/// The token of a request: `Authorization: Bearer <t>` or `X-Tandem-Token: <t>`.
fn presented_token(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let (scheme, rest) = v.split_once(' ')?;
        return scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim()).filter(|t| !t.is_empty());
    }
    headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok()).map(str::trim).filter(|t| !t.is_empty())
}

/// Why the access rules could not be loaded. The rules in force stay.
#[derive(Debug, thiserror::Error)]
pub enum AclError {
    #[error("tokens file {path}: {reason}")]
    File { path: String, reason: String },
    #[error("token {token} names policy {policy:?}, which [acl] does not define")]
    UnknownPolicy { token: String, policy: String },
    #[error("token {0}: the same secret hash is listed twice")]
    DuplicateToken(String),
    #[error("token {0}: `anonymous` is reserved (what ACLs off register as) as an id or principal")]
    ReservedName(String),
    #[error("token {id}: sha256 must be 64 hex digits")]
    BadHash { id: String },
}

/// The node's access rules and their counters, shared by the HTTP handlers.
#[derive(Debug)]
pub struct AclState {
    acl: RwLock<Arc<Acl>>,
    pub unauthenticated: AtomicU64,
    pub forbidden: AtomicU64,
    /// When a refusal was last logged (refusal logs are sampled).
    last_log: Mutex<Option<std::time::Instant>>,
}

impl AclState {
    pub fn new(acl: Acl) -> AclState {
        AclState {
            acl: RwLock::new(Arc::new(acl)),
            unauthenticated: AtomicU64::new(0),
            forbidden: AtomicU64::new(0),
            last_log: Mutex::new(None),
        }
    }

    pub fn current(&self) -> Arc<Acl> {
        self.acl.read().clone()
    }

    pub fn replace(&self, acl: Acl) {
        *self.acl.write() = Arc::new(acl);
    }

    /// Counts a refusal and logs at most one line per 10 s.
    pub fn refused(&self, forbidden: bool, path: &str, why: &str) {
        let counter = if forbidden { &self.forbidden } else { &self.unauthenticated };
        counter.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last_log.lock();
        if last.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(10)) {
            *last = Some(std::time::Instant::now());
            tracing::warn!(path = %path.escape_debug(), reason = %why.escape_debug(), "request refused by ACL (sampled: one line per 10 s)");
        }
    }
}

impl Default for AclState {
    fn default() -> Self {
        AclState::new(Acl::disabled())
    }
}

#[cfg(test)]
mod tests;
