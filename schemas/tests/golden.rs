//! Byte-exact golden vectors of the wire format.
//!
//! postcard is not self-describing: field order and enum variant order are the format. If
//! this test fails, the change broke compatibility with deployed peers and stored logs.
//! Either undo it, or introduce a new schema version (docs/schemas.md) and regenerate the
//! vectors with `TANDEM_BLESS=1 cargo test -p tandem-schemas --test golden`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use tandem_schemas::*;

fn key(id: &str) -> InstanceKey {
    InstanceKey {
        owner_dc: "dc-a".into(),
        namespace: "default".into(),
        service: "orders".into(),
        instance_id: id.into(),
    }
}

fn record() -> InstanceRecord {
    InstanceRecord {
        key: key("orders#10.0.0.7:8080#1"),
        address: "10.0.0.7".into(),
        port: 8080,
        zone: "az1".into(),
        weight: 100,
        app_version: "2.3.1".into(),
        tags: vec!["canary".into()],
        metadata: BTreeMap::from([("team".to_string(), "pay".to_string())]),
        persistent: false,
        lease_ttl_ms: 30_000,
        status: Status::Draining,
        health: Health::Suspect,
        damped: true,
    }
}

fn event(seq: u64, op: Op) -> ChangeEvent {
    ChangeEvent {
        event_id: uuid::Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001),
        origin_dc: "dc-a".into(),
        origin_epoch: 0x1122_3344_5566_7788,
        seq,
        commit_time_ms: 1_764_000_000_000,
        op,
    }
}

fn vectors() -> Vec<(&'static str, Vec<u8>)> {
    let reg = event(1, Op::Register(record()));
    let upd = event(2, Op::Update(record()));
    let dereg = event(
        3,
        Op::Deregister { key: key("orders#10.0.0.7:8080#1"), reason: DeregisterReason::LeaseExpired },
    );
    let snap = Snapshot {
        origin_dc: "dc-a".into(),
        mark: Mark { epoch: 9, seq: 40 },
        instances: vec![SnapshotInstance { seq: 12, record: record() }],
        tombstones: vec![Tombstone { key: key("gone"), seq: 39, reason: DeregisterReason::Explicit }],
    };
    vec![
        ("event_register", encode_event(&reg)),
        ("event_update", encode_event(&upd)),
        ("event_deregister", encode_event(&dereg)),
        ("record", encode_record(&record())),
        ("frame_hello", encode_frame(&Frame::Hello { dc: "dc-a".into(), epoch: 7, last_seq: 300 })),
        (
            "frame_hello_ack",
            encode_frame(&Frame::HelloAck {
                dc: "dc-b".into(),
                mark: Some(Mark { epoch: 7, seq: 12 }),
                mark_event_id: Some(uuid::Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0002)),
            }),
        ),
        (
            "frame_hello_ack_none",
            encode_frame(&Frame::HelloAck { dc: "dc-b".into(), mark: None, mark_event_id: None }),
        ),
        ("frame_batch", encode_frame(&Frame::Batch { batch_id: 5, events: vec![reg, upd, dereg] })),
        ("frame_snapshot", encode_frame(&Frame::Snapshot { batch_id: 6, snapshot: snap })),
        ("frame_ack", encode_frame(&Frame::Ack { batch_id: 5, mark: Mark { epoch: 7, seq: 3 } })),
        ("frame_ping", encode_frame(&Frame::Ping { last_seq: 3, floor_seq: 1, now_ms: 1_764_000_000_123 })),
        ("frame_refuse", encode_frame(&Frame::Refuse { code: RefuseCode::Gap, message: "gap".into() })),
        (
            "frame_refuse_fenced",
            encode_frame(&Frame::Refuse { code: RefuseCode::Fenced, message: "fenced".into() }),
        ),
    ]
}

fn dir() -> PathBuf {
    manifest_dir().join("golden")
}

#[test]
fn wire_format_matches_golden_vectors() {
    let bless = std::env::var_os("TANDEM_BLESS").is_some();
    let mut failures = Vec::new();
    for (name, bytes) in vectors() {
        let path = dir().join(format!("{name}.hex"));
        let hex_now = hex::encode(&bytes);
        if bless {
            std::fs::write(&path, format!("{hex_now}\n")).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|_| panic!("missing golden vector {}", path.display()));
        if want.trim() != hex_now {
            failures.push(format!("{name}:\n  golden {}\n  now    {hex_now}", want.trim()));
        }
    }
    assert!(failures.is_empty(), "wire format changed:\n{}", failures.join("\n"));
}

#[test]
fn encoding_into_a_reused_buffer_writes_the_same_bytes() {
    // The event log's writer encodes a round's events and records into one buffer.
    let long = event(1, Op::Register(record()));
    let short = event(2, Op::Deregister { key: key("i"), reason: DeregisterReason::Explicit });
    let mut buf = Vec::new();
    encode_into(&long, &mut buf);
    assert_eq!(buf, encode_event(&long));
    encode_into(&short, &mut buf);
    assert_eq!(buf, encode_event(&short), "what the longer value left is not kept");
    encode_into(&(7u64, record()), &mut buf);
    assert_eq!(buf, encode(&(7u64, record())));
}

#[test]
fn golden_vectors_decode_back_to_the_same_values() {
    for (name, bytes) in vectors() {
        if name.starts_with("frame_") {
            let f = decode_frame(&bytes, FRAME_BYTES_MAX).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(encode_frame(&f), bytes, "{name}");
        } else if name.starts_with("event_") {
            let e = decode_event(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(encode_event(&e), bytes, "{name}");
        } else {
            let r = decode_record(&bytes).unwrap();
            assert_eq!(encode_record(&r), bytes);
        }
    }
}

#[test]
fn a_newer_schema_version_is_refused_precisely() {
    let mut bytes = encode_frame(&Frame::Ack { batch_id: 1, mark: Mark { epoch: 1, seq: 1 } });
    bytes[0] = 3; // schema version 3 (varint)
    assert_eq!(
        decode_frame(&bytes, FRAME_BYTES_MAX),
        Err(DecodeError::SchemaVersion { got: 3, expected: SCHEMA_VERSION })
    );
}

/// The schema 1 vectors (`golden/v1/`, decode-only fixtures of what version 1 peers send)
/// still decode, convert to the version 2 frame, and encode back to the same bytes when
/// written as version 1.
#[test]
fn schema_1_frames_still_decode_and_can_still_be_written() {
    let mut seen = 0;
    for entry in std::fs::read_dir(dir().join("v1")).unwrap() {
        let path = entry.unwrap().path();
        let bytes = hex::decode(std::fs::read_to_string(&path).unwrap().trim()).unwrap();
        let name = path.display().to_string();
        let (frame, version) =
            decode_frame_versioned(&bytes, FRAME_BYTES_MAX).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(version, 1, "{name}");
        assert_eq!(encode_frame_as(&frame, 1).unwrap(), bytes, "{name}");
        if let Frame::HelloAck { mark_event_id, .. } = &frame {
            assert_eq!(*mark_event_id, None, "{name}: a version 1 HelloAck knows no event id");
        }
        seen += 1;
    }
    assert_eq!(seen, 7, "one schema 1 vector per frame kind");
    // What version 1 cannot say is written in its nearest form.
    let fenced = Frame::Refuse { code: RefuseCode::Fenced, message: "old".into() };
    let back = decode_frame(&encode_frame_as(&fenced, 1).unwrap(), FRAME_BYTES_MAX).unwrap();
    assert_eq!(back, Frame::Refuse { code: RefuseCode::CursorRegressed, message: "old".into() });
    assert_eq!(encode_frame_as(&fenced, 9), Err(EncodeError::UnknownVersion(9)));
}

#[test]
fn oversized_and_truncated_frames_are_refused_without_panic() {
    let bytes = encode_frame(&Frame::Hello { dc: "dc-a".into(), epoch: 7, last_seq: 300 });
    assert!(matches!(decode_frame(&bytes, 3), Err(DecodeError::TooLarge { .. })));
    for cut in 0..bytes.len() {
        assert!(decode_frame(&bytes[..cut], FRAME_BYTES_MAX).is_err());
    }
}

#[test]
fn events_that_touch_another_owner_are_invalid() {
    let mut ev = event(1, Op::Register(record()));
    ev.origin_dc = "dc-b".into();
    let bytes = encode_event(&ev);
    assert!(matches!(decode_event(&bytes), Err(DecodeError::Invalid(_))));
}

/// The package's directory, read when the test runs (cargo sets it) rather than when it
/// was compiled: a test binary reused from another checkout's build (one shared target
/// dir) reads this checkout's files.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
