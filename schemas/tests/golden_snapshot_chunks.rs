//! Byte-exact golden vectors of the snapshot-streaming frames (`SnapshotChunk`, `ChunkAck`,
//! `SnapshotResume`), appended after the schema-1 variants of `Frame`.
//!
//! Kept apart from `golden.rs` so that these vectors are blessed on their own:
//! `TANDEM_BLESS=1 cargo test -p tandem-schemas --test golden_snapshot_chunks` writes only
//! the `schemas/golden/frame_snapshot_chunk*.hex`, `frame_chunk_ack.hex` and
//! `frame_snapshot_resume*.hex` files.

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
        persistent: true,
        lease_ttl_ms: 0,
        status: Status::Up,
        health: Health::Healthy,
        damped: false,
    }
}

fn vectors() -> Vec<(&'static str, Vec<u8>)> {
    let chunk = SnapshotChunk {
        snapshot_id: 0x0123_4567_89ab_cdef,
        index: 3,
        mark: Mark { epoch: 9, seq: 40 },
        instances: vec![SnapshotInstance { seq: 12, record: record() }],
        tombstones: vec![Tombstone { key: key("gone"), seq: 39, reason: DeregisterReason::Explicit }],
        last: false,
    };
    let last = SnapshotChunk { index: 4, instances: vec![], tombstones: vec![], last: true, ..chunk.clone() };
    vec![
        ("frame_snapshot_chunk", encode_frame(&Frame::SnapshotChunk { batch_id: 6, chunk })),
        ("frame_snapshot_chunk_last", encode_frame(&Frame::SnapshotChunk { batch_id: 7, chunk: last })),
        (
            "frame_chunk_ack",
            encode_frame(&Frame::ChunkAck { batch_id: 6, snapshot_id: 0x0123_4567_89ab_cdef, index: 3 }),
        ),
        (
            "frame_snapshot_resume",
            encode_frame(&Frame::SnapshotResume {
                staged: Some(StagedSnapshot { snapshot_id: 0x0123_4567_89ab_cdef, chunks: 4 }),
            }),
        ),
        ("frame_snapshot_resume_none", encode_frame(&Frame::SnapshotResume { staged: None })),
    ]
}

fn dir() -> PathBuf {
    manifest_dir().join("golden")
}

#[test]
fn snapshot_streaming_frames_match_golden_vectors() {
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
fn snapshot_streaming_frames_have_no_schema_1_form() {
    for (name, bytes) in vectors() {
        let f = decode_frame(&bytes, FRAME_BYTES_MAX).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            matches!(
                tandem_schemas::encode_frame_as(&f, 1),
                Err(tandem_schemas::EncodeError::NoSuchFrame { version: 1, .. })
            ),
            "{name} must not be written as schema 1"
        );
    }
}

#[test]
fn snapshot_streaming_frames_decode_back_to_the_same_values() {
    for (name, bytes) in vectors() {
        let f = decode_frame(&bytes, FRAME_BYTES_MAX).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(encode_frame(&f), bytes, "{name}");
    }
}

#[test]
fn a_chunk_with_entries_of_two_owners_or_past_its_cut_is_refused() {
    let mut chunk = SnapshotChunk {
        snapshot_id: 1,
        index: 0,
        mark: Mark { epoch: 9, seq: 40 },
        instances: vec![SnapshotInstance { seq: 12, record: record() }],
        tombstones: vec![Tombstone {
            key: InstanceKey { owner_dc: "dc-x".into(), ..key("gone") },
            seq: 39,
            reason: DeregisterReason::Explicit,
        }],
        last: false,
    };
    let bytes = encode_frame(&Frame::SnapshotChunk { batch_id: 1, chunk: chunk.clone() });
    assert!(matches!(decode_frame(&bytes, FRAME_BYTES_MAX), Err(DecodeError::Invalid(_))));
    chunk.tombstones.clear();
    chunk.instances[0].seq = 41;
    let bytes = encode_frame(&Frame::SnapshotChunk { batch_id: 1, chunk });
    assert!(matches!(decode_frame(&bytes, FRAME_BYTES_MAX), Err(DecodeError::Invalid(_))));
}

/// The package's directory, read when the test runs (cargo sets it) rather than when it
/// was compiled: a test binary reused from another checkout's build (one shared target
/// dir) reads this checkout's files.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
