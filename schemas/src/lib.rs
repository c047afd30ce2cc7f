//! The wire format of tandem.
//!
//! Everything that crosses a process boundary between DCs — change events, the replication
//! frames that carry them, snapshots — is defined here and nowhere else. postcard is not
//! self-describing, so **field order is the wire format**: reordering, inserting or removing
//! a field, or reordering enum variants, is a breaking change that needs a new
//! [`SCHEMA_VERSION`] (see docs/schemas.md). Golden vectors in `tests/golden.rs` pin the
//! bytes.
//!
//! Architecture invariant: this crate does no I/O and depends on no runtime, storage or
//! network crate. Decoding untrusted bytes is bounded ([`decode_frame`]) and never panics.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

mod bounded;
mod chunk;
mod v1;
mod validate;

pub use chunk::{SnapshotChunk, StagedSnapshot, FRAME_HEADROOM_BYTES};

pub use validate::{
    validate_address, validate_dc, validate_event, validate_instance_id, validate_key, validate_name,
    validate_record, Limits, ValidationError, LIMITS,
};

/// Version of the wire schema. Bumped for any change that an older peer would misread.
///
/// Version 2 (issue 13): `HelloAck` carries the event id at the receiver's mark, and
/// `RefuseCode::Fenced` exists. Version 1 is still read and converted, and can still be
/// written ([`encode_frame_as`]) for peers that read only version 1 (docs/schemas.md).
pub const SCHEMA_VERSION: u16 = 2;

/// The oldest schema version this build reads (and can write).
pub const SCHEMA_VERSION_MIN: u16 = 1;

/// Largest encoded frame a peer may send (one batch of events or one control message).
pub const FRAME_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Largest encoded single-frame snapshot ([`Frame::Snapshot`], the schema-1 path for peers
/// that do not stream snapshots in chunks). Chunked snapshots ([`Frame::SnapshotChunk`])
/// keep to [`FRAME_BYTES_MAX`]; this limit goes away with the single-frame path.
pub const SNAPSHOT_FRAME_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Most events one batch frame may carry.
pub const BATCH_EVENTS_MAX: usize = 4096;

/// Bytes of a frame's start that [`frame_bytes_max_for`] needs to tell its type (the
/// schema version and the frame variant, both varints; fewer when the frame is shorter).
pub const FRAME_HEAD_BYTES: usize = 4;

/// The largest frame that may start with `head` (its first [`FRAME_HEAD_BYTES`] bytes, or
/// the whole frame when shorter): a whole [`Frame::Snapshot`] may take up to
/// [`SNAPSHOT_FRAME_BYTES_MAX`] when `whole_snapshots` (the peer speaks schema 1, which
/// has no chunks); every other frame, and anything unreadable, [`FRAME_BYTES_MAX`]. A
/// reader checks a frame's declared length against this before reading the rest.
pub fn frame_bytes_max_for(head: &[u8], whole_snapshots: bool) -> usize {
    /// `Frame::Snapshot`'s variant index, the same in schema 1 and 2.
    const SNAPSHOT_VARIANT: u32 = 3;
    if !whole_snapshots {
        return FRAME_BYTES_MAX;
    }
    let variant = postcard::take_from_bytes::<u16>(head)
        .ok()
        .filter(|(v, _)| (SCHEMA_VERSION_MIN..=SCHEMA_VERSION).contains(v))
        .and_then(|(_, rest)| postcard::take_from_bytes::<u32>(rest).ok())
        .map(|(variant, _)| variant);
    if variant == Some(SNAPSHOT_VARIANT) {
        SNAPSHOT_FRAME_BYTES_MAX
    } else {
        FRAME_BYTES_MAX
    }
}

/// A shared, immutable name. Cloning one is a reference-count increment, so the many
/// copies of a key (view, leases, in-flight writes) and the names every instance of a
/// service repeats (DC, namespace, service) share one allocation. Encoded as a string.
pub type Name = std::sync::Arc<str>;

/// Reads a [`Name`] in one allocation: serde's own `Arc<str>` reads a `Box<str>` and then
/// copies it, two allocations and a free for every name of every record decoded (a node's
/// start reads seven per instance). The wire format is unchanged: a string.
fn name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Name, D::Error> {
    struct NameVisitor;
    impl serde::de::Visitor<'_> for NameVisitor {
        type Value = Name;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Name, E> {
            Ok(Name::from(v))
        }
    }
    d.deserialize_str(NameVisitor)
}

/// Identity of an instance: who owns it and what it is. The owner DC never changes.
///
/// Compared field by field in this order, as a derived order would, but two names that
/// share their allocation are equal without reading them: within a service the DC,
/// namespace and service names of every key are one allocation, so a lookup among a
/// service's instances compares instance ids only (issue 21).
#[derive(Clone, Debug, Eq, Serialize, Deserialize)]
pub struct InstanceKey {
    #[serde(deserialize_with = "name")]
    pub owner_dc: Name,
    #[serde(deserialize_with = "name")]
    pub namespace: Name,
    #[serde(deserialize_with = "name")]
    pub service: Name,
    #[serde(deserialize_with = "name")]
    pub instance_id: Name,
}

fn name_cmp(a: &Name, b: &Name) -> std::cmp::Ordering {
    if std::sync::Arc::ptr_eq(a, b) {
        std::cmp::Ordering::Equal
    } else {
        a.cmp(b)
    }
}

impl PartialEq for InstanceKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Ord for InstanceKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        name_cmp(&self.owner_dc, &other.owner_dc)
            .then_with(|| name_cmp(&self.namespace, &other.namespace))
            .then_with(|| name_cmp(&self.service, &other.service))
            .then_with(|| name_cmp(&self.instance_id, &other.instance_id))
    }
}

/// By content, field by field, as a derived hash would (equal keys hash alike).
impl std::hash::Hash for InstanceKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.owner_dc.hash(state);
        self.namespace.hash(state);
        self.service.hash(state);
        self.instance_id.hash(state);
    }
}

impl PartialOrd for InstanceKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl InstanceKey {
    /// This key's names, borrowed.
    pub fn names(&self) -> InstanceNames<'_> {
        InstanceNames {
            owner_dc: &self.owner_dc,
            namespace: &self.namespace,
            service: &self.service,
            instance_id: &self.instance_id,
        }
    }
}

/// An instance's names, borrowed: a lookup among keys that needs no key of its own (no
/// allocation, no reference count touched). It hashes as the [`InstanceKey`] of the same
/// names does (field by field, by content), so a hash table of keys finds one by its names
/// ([`InstanceNames::is`] tells the match).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceNames<'a> {
    pub owner_dc: &'a str,
    pub namespace: &'a str,
    pub service: &'a str,
    pub instance_id: &'a str,
}

impl InstanceNames<'_> {
    /// Whether `key` has these names.
    pub fn is(&self, key: &InstanceKey) -> bool {
        *key.instance_id == *self.instance_id
            && *key.service == *self.service
            && *key.namespace == *self.namespace
            && *key.owner_dc == *self.owner_dc
    }
}

/// As [`InstanceKey`]'s: the same names hash alike.
impl std::hash::Hash for InstanceNames<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.owner_dc.hash(state);
        self.namespace.hash(state);
        self.service.hash(state);
        self.instance_id.hash(state);
    }
}

/// Status the instance sets for itself (graceful up/down).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Status {
    Up,
    Draining,
    OutOfService,
}

/// Health as judged by the owner DC's lease checker. Only the owner decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Health {
    Healthy,
    Suspect,
    Unhealthy,
}

/// The replicated description of one instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceRecord {
    pub key: InstanceKey,
    #[serde(deserialize_with = "name")]
    pub address: Name,
    pub port: u16,
    /// Shared by the instances of a zone (see [`Name`]).
    #[serde(deserialize_with = "name")]
    pub zone: Name,
    pub weight: u32,
    /// Application version string of the instance (not the event version); shared by the
    /// instances that run it.
    #[serde(deserialize_with = "name")]
    pub app_version: Name,
    #[serde(deserialize_with = "bounded::tags")]
    pub tags: Vec<String>,
    #[serde(deserialize_with = "bounded::metadata")]
    pub metadata: BTreeMap<String, String>,
    pub persistent: bool,
    /// Lease length for ephemeral instances, in milliseconds (0 for persistent ones).
    pub lease_ttl_ms: u32,
    pub status: Status,
    pub health: Health,
    /// True while flap damping holds this instance in its last stable health.
    pub damped: bool,
}

/// Why an instance was removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeregisterReason {
    Explicit,
    LeaseExpired,
    Evicted,
}

/// What a change event does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    Register(InstanceRecord),
    Update(InstanceRecord),
    Deregister { key: InstanceKey, reason: DeregisterReason },
}

impl Op {
    pub fn key(&self) -> &InstanceKey {
        match self {
            Op::Register(r) | Op::Update(r) => &r.key,
            Op::Deregister { key, .. } => key,
        }
    }
}

/// One visible change, minted by the owner DC of the instance it touches.
///
/// The version of an event is the dot (origin_dc, origin_epoch, seq); `commit_time_ms` is
/// wall-clock metadata for lag figures and never decides an ordering.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeEvent {
    pub event_id: Uuid,
    pub origin_dc: String,
    pub origin_epoch: u64,
    pub seq: u64,
    pub commit_time_ms: u64,
    pub op: Op,
}

/// A version of one origin's history: which epoch and how far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Mark {
    pub epoch: u64,
    pub seq: u64,
}

/// A tombstone: the key and the version of the deregistration that removed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    pub key: InstanceKey,
    pub seq: u64,
    pub reason: DeregisterReason,
}

/// A live instance as held in a snapshot, with the seq of the event that produced it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInstance {
    pub seq: u64,
    pub record: InstanceRecord,
}

/// One origin's whole state at `mark`: every live instance and tombstone it owns.
/// Anything of this origin at or below `mark.seq` that is not in the snapshot is removed
/// by the receiver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub origin_dc: String,
    pub mark: Mark,
    pub instances: Vec<SnapshotInstance>,
    pub tombstones: Vec<Tombstone>,
}

/// Replication frames. Every frame travels inside an [`Envelope`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Frame {
    /// Sender -> receiver, first frame: who I am and which history I ship.
    Hello { dc: String, epoch: u64, last_seq: u64 },
    /// Receiver -> sender: who I am and how far I have applied the sender's origin.
    /// `mark` is `None` when the receiver holds nothing of that origin. Its epoch is the
    /// highest epoch of the origin the receiver has seen (a receiver never goes back to an
    /// older epoch). `mark_event_id` (schema 2) is the id of the event at the mark, when
    /// the receiver knows it (it does not after a snapshot, or for marks written by a
    /// schema 1 build): the origin checks that its own log holds that event at that seq.
    HelloAck { dc: String, mark: Option<Mark>, mark_event_id: Option<Uuid> },
    /// Sender -> receiver: consecutive events of the sender's own origin.
    Batch {
        batch_id: u64,
        #[serde(deserialize_with = "bounded::batch_events")]
        events: Vec<ChangeEvent>,
    },
    /// Sender -> receiver: the origin's whole state; the tail follows as batches.
    Snapshot { batch_id: u64, snapshot: Snapshot },
    /// Receiver -> sender: everything up to `mark` is durably applied.
    Ack { batch_id: u64, mark: Mark },
    /// Sender -> receiver, when idle: proves the link is alive. Carries the sender's last
    /// seq (lag in events) and its purge floor: the sender has purged its log and its
    /// tombstones at or below `floor_seq`, so the receiver may drop its copies of those
    /// tombstones too.
    Ping { last_seq: u64, floor_seq: u64, now_ms: u64 },
    /// Either way: a fatal refusal with a reason; the connection closes after it.
    Refuse { code: RefuseCode, message: String },
    // Snapshot streaming (see the `chunk` module). New variants go at the end: earlier
    // variants keep their bytes.
    /// Sender -> receiver: one chunk of a snapshot of the sender's origin. The receiver
    /// stages it durably and answers with a `ChunkAck`; the last chunk is installed with
    /// everything staged before it, atomically, and answered with an `Ack`.
    SnapshotChunk { batch_id: u64, chunk: SnapshotChunk },
    /// Receiver -> sender: chunk `index` of `snapshot_id` is durably staged.
    ChunkAck { batch_id: u64, snapshot_id: u64, index: u64 },
    /// Receiver -> sender, just before the `HelloAck`, from a receiver that takes chunked
    /// snapshots: what it has staged of the sender's origin (`None`: nothing).
    SnapshotResume { staged: Option<StagedSnapshot> },
}

/// Why a peer refused the other end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefuseCode {
    SchemaVersion,
    UnknownDc,
    WrongOrigin,
    CursorRegressed,
    Gap,
    Invalid,
    Internal,
    /// Schema 2: the receiver follows a newer epoch of the origin than the one the sender
    /// ships; the sender is an older incarnation and must stop shipping.
    Fenced,
}

/// The outer layer of every frame: the schema version first, so any future version can
/// read at least that much and refuse cleanly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    pub schema_version: u16,
    pub frame: Frame,
}

/// Errors from decoding bytes received from a peer. Decoding never changes any state.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("peer speaks schema version {got}, this node speaks {min} to {expected}", min = SCHEMA_VERSION_MIN)]
    SchemaVersion { got: u16, expected: u16 },
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("invalid frame: {0}")]
    Invalid(#[from] ValidationError),
}

/// Why a frame could not be encoded in a requested schema version.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    #[error("schema version {0} is not one this build writes ({min} to {max})", min = SCHEMA_VERSION_MIN, max = SCHEMA_VERSION)]
    UnknownVersion(u16),
    #[error("a {frame} frame has no schema version {version} form")]
    NoSuchFrame { version: u16, frame: &'static str },
}

/// Encodes an envelope for the current schema version.
pub fn encode_frame(frame: &Frame) -> Vec<u8> {
    let env = Envelope { schema_version: SCHEMA_VERSION, frame: frame.clone() };
    // Encoding owned, well-formed values into a Vec cannot fail.
    postcard::to_allocvec(&env).expect("postcard encoding into a Vec is infallible")
}

/// Encodes an envelope in schema `version` (see [`SCHEMA_VERSION_MIN`]): what a node
/// writes to a peer that reads only an older version during an upgrade. A field the old
/// version lacks is dropped; a refusal code it lacks becomes its nearest older one.
pub fn encode_frame_as(frame: &Frame, version: u16) -> Result<Vec<u8>, EncodeError> {
    match version {
        SCHEMA_VERSION => Ok(encode_frame(frame)),
        1 => v1::encode(frame),
        other => Err(EncodeError::UnknownVersion(other)),
    }
}

/// Decodes and validates one frame of untrusted bytes. `max` bounds the input size
/// (use [`FRAME_BYTES_MAX`] or [`SNAPSHOT_FRAME_BYTES_MAX`]).
pub fn decode_frame(bytes: &[u8], max: usize) -> Result<Frame, DecodeError> {
    decode_frame_versioned(bytes, max).map(|(f, _)| f)
}

/// [`decode_frame`], also returning the schema version the frame was written in (a
/// receiver answers a Hello in the version it came in). Version 1 frames are converted.
pub fn decode_frame_versioned(bytes: &[u8], max: usize) -> Result<(Frame, u16), DecodeError> {
    if bytes.len() > max {
        return Err(DecodeError::TooLarge { len: bytes.len(), max });
    }
    // Read the version alone first so that a newer peer gets a precise refusal rather
    // than a "malformed" one.
    let (version, _) =
        postcard::take_from_bytes::<u16>(bytes).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    let frame = match version {
        SCHEMA_VERSION => {
            let env: Envelope =
                postcard::from_bytes(bytes).map_err(|e| DecodeError::Malformed(e.to_string()))?;
            env.frame
        }
        1 => v1::decode(bytes)?,
        got => return Err(DecodeError::SchemaVersion { got, expected: SCHEMA_VERSION }),
    };
    validate::validate_frame(&frame)?;
    Ok((frame, version))
}

/// Encodes one change event (the form stored in the event log).
pub fn encode_event(ev: &ChangeEvent) -> Vec<u8> {
    postcard::to_allocvec(ev).expect("postcard encoding into a Vec is infallible")
}

/// Decodes and validates one stored or received change event.
pub fn decode_event(bytes: &[u8]) -> Result<ChangeEvent, DecodeError> {
    if bytes.len() > FRAME_BYTES_MAX {
        return Err(DecodeError::TooLarge { len: bytes.len(), max: FRAME_BYTES_MAX });
    }
    let ev: ChangeEvent = postcard::from_bytes(bytes).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    validate_event(&ev)?;
    Ok(ev)
}

/// Encodes an instance record (the form stored as materialized state).
pub fn encode_record(r: &InstanceRecord) -> Vec<u8> {
    postcard::to_allocvec(r).expect("postcard encoding into a Vec is infallible")
}

/// Decodes and validates an instance record.
pub fn decode_record(bytes: &[u8]) -> Result<InstanceRecord, DecodeError> {
    if bytes.len() > FRAME_BYTES_MAX {
        return Err(DecodeError::TooLarge { len: bytes.len(), max: FRAME_BYTES_MAX });
    }
    let r: InstanceRecord = postcard::from_bytes(bytes).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    validate_record(&r)?;
    Ok(r)
}

/// Encodes any schema value with postcard (keys, tombstones, snapshots).
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).expect("postcard encoding into a Vec is infallible")
}

/// [`encode`] (or [`encode_event`], for an event) into `buf`, cleared first: a writer that
/// encodes many values reuses one buffer, where `encode` starts each from an empty `Vec`
/// and grows it about six times for a registration's record.
pub fn encode_into<T: Serialize + ?Sized>(v: &T, buf: &mut Vec<u8>) {
    buf.clear();
    *buf = postcard::to_extend(v, std::mem::take(buf)).expect("postcard encoding into a Vec is infallible");
}

/// Decodes any schema value with a size bound; callers validate the content.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8], max: usize) -> Result<T, DecodeError> {
    if bytes.len() > max {
        return Err(DecodeError::TooLarge { len: bytes.len(), max });
    }
    postcard::from_bytes(bytes).map_err(|e| DecodeError::Malformed(e.to_string()))
}
