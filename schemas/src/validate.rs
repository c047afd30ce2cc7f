//! Limits on every field that crosses the wire, and the checks that enforce them.
//!
//! The same limits guard the HTTP API (clients) and the replication stream (peers), so a
//! record accepted by one DC is always accepted by the other.

use crate::{
    ChangeEvent, Frame, InstanceKey, InstanceRecord, Mark, Op, Snapshot, SnapshotInstance, Tombstone,
    BATCH_EVENTS_MAX,
};

/// Size limits of instance fields. Documented in docs/schemas.md.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub dc_name_bytes_max: usize,
    pub name_bytes_max: usize,
    pub instance_id_bytes_max: usize,
    pub address_bytes_max: usize,
    pub zone_bytes_max: usize,
    pub app_version_bytes_max: usize,
    pub tags_max: usize,
    pub tag_bytes_max: usize,
    pub metadata_entries_max: usize,
    pub metadata_key_bytes_max: usize,
    pub metadata_value_bytes_max: usize,
    pub metadata_total_bytes_max: usize,
    pub weight_max: u32,
    pub lease_ttl_ms_max: u32,
}

/// The limits in force for schema version 1.
pub const LIMITS: Limits = Limits {
    dc_name_bytes_max: 32,
    name_bytes_max: 128,
    instance_id_bytes_max: 256,
    address_bytes_max: 253,
    zone_bytes_max: 64,
    app_version_bytes_max: 64,
    tags_max: 32,
    tag_bytes_max: 64,
    metadata_entries_max: 64,
    metadata_key_bytes_max: 128,
    metadata_value_bytes_max: 1024,
    metadata_total_bytes_max: 16 * 1024,
    weight_max: 10_000,
    lease_ttl_ms_max: 24 * 3600 * 1000,
};

/// A field that breaks a limit or a naming rule. Validation never changes any state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ValidationError {
    pub field: &'static str,
    pub problem: String,
}

fn err(field: &'static str, problem: impl Into<String>) -> ValidationError {
    ValidationError { field, problem: problem.into() }
}

/// DC names: 1..=32 bytes of lowercase ASCII letters, digits and '-', not starting with '-'.
pub fn validate_dc(field: &'static str, s: &str) -> Result<(), ValidationError> {
    if s.is_empty() || s.len() > LIMITS.dc_name_bytes_max {
        return Err(err(field, format!("must be 1 to {} bytes", LIMITS.dc_name_bytes_max)));
    }
    if s.starts_with('-') || !s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return Err(err(field, "may hold only a-z, 0-9 and '-', and must not start with '-'"));
    }
    Ok(())
}

/// Namespace and service names: 1..=128 bytes of ASCII letters, digits, '-', '_', '.', ':'.
pub fn validate_name(field: &'static str, s: &str) -> Result<(), ValidationError> {
    if s.is_empty() || s.len() > LIMITS.name_bytes_max {
        return Err(err(field, format!("must be 1 to {} bytes", LIMITS.name_bytes_max)));
    }
    if !s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':')) {
        return Err(err(field, "may hold only ASCII letters, digits, '-', '_', '.' and ':'"));
    }
    Ok(())
}

/// Instance ids: like names, plus '#' and '@' (generated ids are `service#addr:port#uuid`),
/// '[' and ']' for IPv6 addresses.
pub fn validate_instance_id(s: &str) -> Result<(), ValidationError> {
    let field = "instance_id";
    if s.is_empty() || s.len() > LIMITS.instance_id_bytes_max {
        return Err(err(field, format!("must be 1 to {} bytes", LIMITS.instance_id_bytes_max)));
    }
    if !s.bytes().all(|b| {
        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'#' | b'@' | b'[' | b']')
    }) {
        return Err(err(field, "may hold only ASCII letters, digits and - _ . : # @ [ ]"));
    }
    Ok(())
}

/// Addresses: an IP address or a DNS host name.
pub fn validate_address(s: &str) -> Result<(), ValidationError> {
    let field = "address";
    if s.is_empty() || s.len() > LIMITS.address_bytes_max {
        return Err(err(field, format!("must be 1 to {} bytes", LIMITS.address_bytes_max)));
    }
    if s.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if s.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(err(field, "must be an IP address or a DNS host name"))
    }
}

fn validate_short(field: &'static str, s: &str, max: usize) -> Result<(), ValidationError> {
    if s.len() > max {
        return Err(err(field, format!("must be at most {max} bytes")));
    }
    if s.chars().any(char::is_control) {
        return Err(err(field, "must not contain control characters"));
    }
    Ok(())
}

pub fn validate_key(k: &InstanceKey) -> Result<(), ValidationError> {
    validate_dc("owner_dc", &k.owner_dc)?;
    validate_name("namespace", &k.namespace)?;
    validate_name("service", &k.service)?;
    validate_instance_id(&k.instance_id)
}

pub fn validate_record(r: &InstanceRecord) -> Result<(), ValidationError> {
    validate_key(&r.key)?;
    validate_address(&r.address)?;
    if r.port == 0 {
        return Err(err("port", "must be 1 to 65535"));
    }
    validate_short("zone", &r.zone, LIMITS.zone_bytes_max)?;
    validate_short("version", &r.app_version, LIMITS.app_version_bytes_max)?;
    if r.weight > LIMITS.weight_max {
        return Err(err("weight", format!("must be 0 to {}", LIMITS.weight_max)));
    }
    if r.tags.len() > LIMITS.tags_max {
        return Err(err("tags", format!("at most {} tags", LIMITS.tags_max)));
    }
    for t in &r.tags {
        if t.is_empty() {
            return Err(err("tags", "a tag must not be empty"));
        }
        validate_short("tags", t, LIMITS.tag_bytes_max)?;
    }
    if r.metadata.len() > LIMITS.metadata_entries_max {
        return Err(err("metadata", format!("at most {} entries", LIMITS.metadata_entries_max)));
    }
    let mut total = 0usize;
    for (k, v) in &r.metadata {
        if k.is_empty() {
            return Err(err("metadata", "keys must not be empty"));
        }
        validate_short("metadata", k, LIMITS.metadata_key_bytes_max)?;
        validate_short("metadata", v, LIMITS.metadata_value_bytes_max)?;
        total = total.saturating_add(k.len()).saturating_add(v.len());
    }
    if total > LIMITS.metadata_total_bytes_max {
        return Err(err(
            "metadata",
            format!("keys and values together must be at most {} bytes", LIMITS.metadata_total_bytes_max),
        ));
    }
    if r.persistent && r.lease_ttl_ms != 0 {
        return Err(err("ttl_ms", "persistent instances have no lease"));
    }
    if !r.persistent && (r.lease_ttl_ms == 0 || r.lease_ttl_ms > LIMITS.lease_ttl_ms_max) {
        return Err(err(
            "ttl_ms",
            format!("must be 1 to {} for ephemeral instances", LIMITS.lease_ttl_ms_max),
        ));
    }
    Ok(())
}

/// An event is valid when its fields are, its origin owns the key it touches, and its seq
/// is at least 1 (seq 0 means "nothing yet").
pub fn validate_event(ev: &ChangeEvent) -> Result<(), ValidationError> {
    validate_dc("origin_dc", &ev.origin_dc)?;
    if ev.seq == 0 {
        return Err(err("seq", "must be at least 1"));
    }
    match &ev.op {
        Op::Register(r) | Op::Update(r) => validate_record(r)?,
        Op::Deregister { key, .. } => validate_key(key)?,
    }
    if *ev.op.key().owner_dc != *ev.origin_dc {
        return Err(err("owner_dc", "an event may only touch instances its origin DC owns"));
    }
    Ok(())
}

fn validate_snapshot(s: &Snapshot) -> Result<(), ValidationError> {
    validate_dc("origin_dc", &s.origin_dc)?;
    validate_snapshot_entries(Some(&s.origin_dc), s.mark, &s.instances, &s.tombstones)
}

/// The entries of a snapshot or chunk: valid, of one owner (`owner`, or the first entry's
/// when a chunk does not name its origin; the receiver checks it against its channel), and
/// at or below the cut.
fn validate_snapshot_entries(
    owner: Option<&str>,
    mark: Mark,
    instances: &[SnapshotInstance],
    tombstones: &[Tombstone],
) -> Result<(), ValidationError> {
    let first =
        instances.first().map(|i| &*i.record.key.owner_dc).or(tombstones.first().map(|t| &*t.key.owner_dc));
    let Some(owner) = owner.or(first) else { return Ok(()) };
    for i in instances {
        validate_record(&i.record)?;
        if *i.record.key.owner_dc != *owner || i.seq == 0 || i.seq > mark.seq {
            return Err(err("snapshot", "instance not owned by the origin or seq out of range"));
        }
    }
    for t in tombstones {
        validate_key(&t.key)?;
        if *t.key.owner_dc != *owner || t.seq == 0 || t.seq > mark.seq {
            return Err(err("snapshot", "tombstone not owned by the origin or seq out of range"));
        }
    }
    Ok(())
}

pub(crate) fn validate_frame(f: &Frame) -> Result<(), ValidationError> {
    match f {
        Frame::Hello { dc, .. } | Frame::HelloAck { dc, .. } => validate_dc("dc", dc),
        Frame::Batch { events, .. } => {
            if events.len() > BATCH_EVENTS_MAX {
                return Err(err("events", format!("at most {BATCH_EVENTS_MAX} events per batch")));
            }
            for w in events.windows(2) {
                // Checked: a crafted batch may start at u64::MAX (decoding never panics).
                if w[0].seq.checked_add(1) != Some(w[1].seq) || w[1].origin_dc != w[0].origin_dc {
                    return Err(err("events", "a batch holds consecutive seqs of one origin"));
                }
            }
            events.iter().try_for_each(validate_event)
        }
        Frame::Snapshot { snapshot, .. } => validate_snapshot(snapshot),
        Frame::SnapshotChunk { chunk, .. } => {
            validate_snapshot_entries(None, chunk.mark, &chunk.instances, &chunk.tombstones)
        }
        Frame::Ack { .. } | Frame::Ping { .. } | Frame::ChunkAck { .. } | Frame::SnapshotResume { .. } => {
            Ok(())
        }
        Frame::Refuse { message, .. } => {
            if message.len() > 4096 {
                Err(err("message", "at most 4096 bytes"))
            } else {
                Ok(())
            }
        }
    }
}
