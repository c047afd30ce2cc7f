//! The JSON contract of tandem's HTTP API: every request body and answer, defined once.
//!
//! The server (`tandem`'s `http` and `registry` modules) serializes and parses these very
//! types, the SDK and the chaos harness read them, and `client/tests/golden.rs` pins their
//! JSON to the files under `client/golden/`: a change of a field name, of optional-field
//! skipping or of an enum's spelling fails that test.
//!
//! Requests are strict (`deny_unknown_fields`, closed enums: a typo is a 400, not a silent
//! default). Answers are lenient on the reading side (missing optional parts default,
//! unknown health or status names read as `Unknown`), so a newer server does not break an
//! older client; the server always writes every field.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A shared string: the server hands out its records' names by reference count.
pub type Name = Arc<str>;

/// The namespace of requests that name none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Most entries one `POST /v1/heartbeats` may carry; the SDK sends larger sets in chunks.
pub const HEARTBEAT_BATCH_MAX: usize = 512;

/// Most entries one `POST /v1/registrations` may carry (the request body's bound,
/// [`REQUEST_BODY_BYTES_MAX`], comes first for entries with much metadata).
pub const REGISTER_BATCH_MAX: usize = 256;

/// Largest request body the registry accepts (a larger one is refused with 413).
pub const REQUEST_BODY_BYTES_MAX: usize = 64 * 1024;

// ---------------------------------------------------------------------------------------
// Requests.

/// `POST /v1/register`: registers (or re-registers) one instance.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// `None`: "default".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub service: String,
    /// `None`: the registry generates one (`service#host:port#uuid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    pub address: String,
    /// Wider than a port so that an out-of-range value gets a clear 400.
    pub port: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// The application's version (not the instance's event version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Lease length; `None`: the registry's default. Not with `persistent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusName>,
}

impl RegisterRequest {
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE)
    }
}

/// One entry of `POST /v1/heartbeats`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub service: String,
    pub instance_id: String,
}

impl HeartbeatItem {
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE)
    }
}

/// `POST /v1/heartbeats`: renews many leases at once (at most [`HEARTBEAT_BATCH_MAX`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatBatch {
    pub instances: Vec<HeartbeatItem>,
}

/// `POST /v1/registrations`: registers (or re-registers) many instances at once (at most
/// [`REGISTER_BATCH_MAX`]), in one durable write. Each entry follows the rules of
/// `POST /v1/register`; an entry that breaks one refuses the whole batch (nothing written),
/// and its position is named in the error (`instances[3]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterBatch {
    pub instances: Vec<RegisterRequest>,
}

/// `PUT /v1/instances/{ns}/{svc}/{id}/status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StatusChange {
    pub status: StatusName,
}

/// A status a client may set: the closed set a request accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusName {
    Up,
    Draining,
    OutOfService,
}

impl From<StatusName> for Status {
    fn from(s: StatusName) -> Status {
        match s {
            StatusName::Up => Status::Up,
            StatusName::Draining => Status::Draining,
            StatusName::OutOfService => Status::OutOfService,
        }
    }
}

impl TryFrom<Status> for StatusName {
    type Error = Status;
    fn try_from(s: Status) -> Result<StatusName, Status> {
        match s {
            Status::Up => Ok(StatusName::Up),
            Status::Draining => Ok(StatusName::Draining),
            Status::OutOfService => Ok(StatusName::OutOfService),
            Status::Unknown => Err(s),
        }
    }
}

impl From<StatusName> for tandem_schemas::Status {
    fn from(s: StatusName) -> tandem_schemas::Status {
        match s {
            StatusName::Up => tandem_schemas::Status::Up,
            StatusName::Draining => tandem_schemas::Status::Draining,
            StatusName::OutOfService => tandem_schemas::Status::OutOfService,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Answers.

/// The answer of `POST /v1/register`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct RegisterAnswer {
    pub instance_id: String,
    pub owner_dc: String,
    /// Seq of the event that made this registration (the version of the instance).
    pub version: u64,
    pub epoch: u64,
    /// The lease granted (0: persistent, no lease).
    pub lease_ttl_ms: u64,
}

/// The answer of `POST /v1/registrations`: one [`RegisterAnswer`] per entry, in the
/// request's order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct RegisterBatchAnswer {
    pub instances: Vec<RegisterAnswer>,
}

/// The answer of `PUT /v1/heartbeat/{ns}/{svc}/{id}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct HeartbeatAnswer {
    pub ok: bool,
}

/// The answer of `POST /v1/heartbeats`: how many leases were renewed, and the positions
/// (in the request) of the entries unknown here (re-register them) or owned by another DC.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct HeartbeatBatchAnswer {
    pub renewed: usize,
    pub unknown: Vec<usize>,
    pub conflict: Vec<usize>,
}

/// The answer of a deregistration or a status change: the seq of the event written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct WriteAnswer {
    pub version: u64,
}

/// The answer of `GET /v1/services/{ns}/{svc}`; a streaming watch (`?stream=true`) sends
/// one per line (newline-delimited JSON, a bare newline as keep-alive).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct DiscoverAnswer {
    /// Empty when a (foreign) server leaves it out.
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub service: String,
    /// The service's watch index: pass it back as `?index=` to wait for the next change.
    pub index: u64,
    pub instances: Vec<Instance>,
    /// Always written by the registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<Failover>,
    /// True when the protect threshold made the answer include unhealthy local instances.
    #[serde(default)]
    pub protected: bool,
    /// With `?explain=true`: why each instance is in the answer or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explain: Option<Vec<ExplainLine>>,
}

/// One instance as discovery lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub instance_id: Name,
    pub owner_dc: Name,
    pub address: Name,
    pub port: u16,
    #[serde(default = "empty_name")]
    pub zone: Name,
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// The application's version.
    #[serde(default = "empty_name")]
    pub version: Name,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub health: Health,
    #[serde(default)]
    pub status: Status,
    /// A remote copy whose replication link has been silent too long.
    #[serde(default)]
    pub stale: bool,
    #[serde(default)]
    pub persistent: bool,
    #[serde(default)]
    pub damped: bool,
    /// Seq of the owner DC's event that produced this state.
    #[serde(default)]
    pub seq: u64,
}

fn empty_name() -> Name {
    Name::from("")
}

fn default_weight() -> u32 {
    100
}

impl Instance {
    /// The identity of an instance: (owner DC, instance id).
    pub fn key(&self) -> (String, String) {
        (self.owner_dc.to_string(), self.instance_id.to_string())
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    Healthy,
    Suspect,
    Unhealthy,
    /// A name this client does not know (or none): never preferred.
    #[default]
    #[serde(other)]
    Unknown,
}

impl Health {
    /// The name the HTTP API uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Suspect => "suspect",
            Health::Unhealthy => "unhealthy",
            Health::Unknown => "unknown",
        }
    }
}

impl From<tandem_schemas::Health> for Health {
    fn from(h: tandem_schemas::Health) -> Health {
        match h {
            tandem_schemas::Health::Healthy => Health::Healthy,
            tandem_schemas::Health::Suspect => Health::Suspect,
            tandem_schemas::Health::Unhealthy => Health::Unhealthy,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Up,
    Draining,
    OutOfService,
    /// A name this client does not know (or none): never picked.
    #[default]
    #[serde(other)]
    Unknown,
}

impl Status {
    /// The name the HTTP API uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Up => "up",
            Status::Draining => "draining",
            Status::OutOfService => "out_of_service",
            Status::Unknown => "unknown",
        }
    }
}

impl From<tandem_schemas::Status> for Status {
    fn from(s: tandem_schemas::Status) -> Status {
        match s {
            tandem_schemas::Status::Up => Status::Up,
            tandem_schemas::Status::Draining => Status::Draining,
            tandem_schemas::Status::OutOfService => Status::OutOfService,
        }
    }
}

/// The `failover` object of a discovery answer: whether remote DCs' instances are in it
/// and why.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Failover {
    #[serde(default)]
    pub active: bool,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub mode: FailoverMode,
    #[serde(default)]
    pub local_healthy: u32,
    #[serde(default)]
    pub local_total: u32,
    #[serde(default)]
    pub threshold: Threshold,
    /// Remote DCs whose instances are in the answer.
    #[serde(default)]
    pub dcs: Vec<String>,
}

/// The failover mode of a service's policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailoverMode {
    /// Only this DC's instances, whatever happens.
    LocalOnly,
    /// This DC's instances; remote ones join when the local side falls below the trigger.
    LocalFirst,
    /// Every DC's instances, always.
    Global,
    /// A name this client does not know (or none).
    #[default]
    #[serde(other)]
    Unknown,
}

/// The failover trigger of a service's policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Threshold {
    #[serde(default)]
    pub min_healthy: u32,
    #[serde(default)]
    pub min_healthy_pct: f64,
}

/// One line of `?explain=true`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExplainLine {
    pub instance_id: String,
    pub owner_dc: String,
    pub included: bool,
    pub reason: String,
}

/// The answer of `GET /v1/services?namespace=`. (Field order as the wire has always had
/// it: alphabetical.)
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceList {
    /// The node's view index (all services).
    pub index: u64,
    pub namespace: String,
    pub services: Vec<ServiceSummary>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceSummary {
    /// Instances of every DC in this node's view.
    pub instances: usize,
    pub service: String,
}

/// The answer of `POST /v1/admin/reload`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadAnswer {
    pub reloaded: bool,
}

/// The body of `POST /v1/admin/retire-dc` and `POST /v1/admin/unretire-dc`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetireRequest {
    /// The DC to retire (or unretire); never the node's own.
    pub dc: String,
}

/// The answer of `POST /v1/admin/retire-dc`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetireAnswer {
    pub dc: String,
    /// False when the DC was already retired (nothing changed).
    pub newly_retired: bool,
    /// When it was retired, wall-clock ms.
    pub retired_at_ms: u64,
    /// Its live copies removed from this DC's view.
    pub copies_removed: u64,
    /// Its tombstones removed.
    pub tombstones_removed: u64,
}

/// The answer of `POST /v1/admin/unretire-dc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnretireAnswer {
    /// False when the DC was not retired.
    pub unretired: bool,
}

/// Every error answer: `{"error":{"code":"...","message":"..."}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// A stable machine-readable code (`invalid_argument`, `not_found`, `not_owner`,
/// `unavailable`, ...) and a message for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> ErrorBody {
        ErrorBody { error: ErrorDetail { code: code.into(), message: message.into() } }
    }
}
