//! Frames with extreme seqs, epochs and ids decode without panicking (checked arithmetic in
//! validation): a crafted frame is refused as invalid or accepted, never a crash.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tandem_schemas::*;

fn record(id: u64) -> InstanceRecord {
    InstanceRecord {
        key: InstanceKey {
            owner_dc: "dc-a".into(),
            namespace: "default".into(),
            service: "orders".into(),
            instance_id: format!("i{id}").into(),
        },
        address: "10.0.0.7".into(),
        port: 8080,
        zone: "az1".into(),
        weight: 1,
        app_version: "1".into(),
        tags: vec![],
        metadata: BTreeMap::new(),
        persistent: false,
        lease_ttl_ms: 30_000,
        status: Status::Up,
        health: Health::Healthy,
        damped: false,
    }
}

fn event(epoch: u64, seq: u64) -> ChangeEvent {
    ChangeEvent {
        event_id: uuid::Uuid::from_u128(u128::from(seq)),
        origin_dc: "dc-a".into(),
        origin_epoch: epoch,
        seq,
        commit_time_ms: seq,
        op: Op::Register(record(seq)),
    }
}

/// Seqs and epochs at the edges of u64, and a few ordinary ones.
fn extreme() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just(u64::MAX / 2),
        Just(1 << 63),
        any::<u64>(),
    ]
}

fn decode_both_versions(frame: &Frame) {
    for v in [SCHEMA_VERSION_MIN, SCHEMA_VERSION] {
        if let Ok(bytes) = encode_frame_as(frame, v) {
            let _ = decode_frame(&bytes, FRAME_BYTES_MAX);
            let _ = decode_frame(&bytes, SNAPSHOT_FRAME_BYTES_MAX);
        }
    }
}

#[test]
fn a_batch_whose_first_seq_is_u64_max_is_invalid_not_a_panic() {
    let frame = Frame::Batch { batch_id: 1, events: vec![event(1, u64::MAX), event(1, 0)] };
    let err = decode_frame(&encode_frame(&frame), FRAME_BYTES_MAX).unwrap_err();
    assert!(matches!(err, DecodeError::Invalid(_)), "{err}");
    let frame = Frame::Batch { batch_id: 1, events: vec![event(1, u64::MAX - 1), event(1, u64::MAX)] };
    assert!(decode_frame(&encode_frame(&frame), FRAME_BYTES_MAX).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn batches_with_extreme_seqs_never_panic(
        epoch in extreme(),
        seqs in proptest::collection::vec(extreme(), 0..4),
        batch_id in extreme(),
    ) {
        let events = seqs.iter().map(|&s| event(epoch, s)).collect();
        decode_both_versions(&Frame::Batch { batch_id, events });
    }

    #[test]
    fn control_and_snapshot_frames_with_extreme_numbers_never_panic(
        a in extreme(), b in extreme(), c in extreme(), last in any::<bool>(),
    ) {
        let mark = Mark { epoch: a, seq: b };
        let inst = SnapshotInstance { seq: c, record: record(c) };
        let tomb = Tombstone { key: record(a).key, seq: c, reason: DeregisterReason::Explicit };
        for frame in [
            Frame::Hello { dc: "dc-a".into(), epoch: a, last_seq: b },
            Frame::HelloAck { dc: "dc-a".into(), mark: Some(mark), mark_event_id: None },
            Frame::Ack { batch_id: c, mark },
            Frame::Ping { last_seq: a, floor_seq: b, now_ms: c },
            Frame::ChunkAck { batch_id: a, snapshot_id: b, index: c },
            Frame::SnapshotResume { staged: Some(StagedSnapshot { snapshot_id: a, chunks: b }) },
            Frame::Snapshot {
                batch_id: a,
                snapshot: Snapshot {
                    origin_dc: "dc-a".into(),
                    mark,
                    instances: vec![inst.clone()],
                    tombstones: vec![tomb.clone()],
                },
            },
            Frame::SnapshotChunk {
                batch_id: a,
                chunk: SnapshotChunk {
                    snapshot_id: b,
                    index: c,
                    mark,
                    instances: vec![inst.clone()],
                    tombstones: vec![tomb.clone()],
                    last,
                },
            },
        ] {
            decode_both_versions(&frame);
        }
    }
}

#[test]
fn element_counts_are_bounded_while_decoding() {
    // One event too many: refused by the decoder itself (malformed), before validation.
    let events = (1..=BATCH_EVENTS_MAX as u64 + 1).map(|s| event(1, s)).collect();
    let bytes = encode_frame(&Frame::Batch { batch_id: 1, events });
    assert!(matches!(decode_frame(&bytes, FRAME_BYTES_MAX), Err(DecodeError::Malformed(_))));
    let bytes = encode_frame_as(
        &Frame::Batch {
            batch_id: 1,
            events: (1..=BATCH_EVENTS_MAX as u64 + 1).map(|s| event(1, s)).collect(),
        },
        1,
    )
    .unwrap();
    assert!(matches!(decode_frame(&bytes, FRAME_BYTES_MAX), Err(DecodeError::Malformed(_))));
    let mut r = record(1);
    r.tags = (0..=LIMITS.tags_max).map(|i| format!("t{i}")).collect();
    assert!(matches!(decode_record(&encode_record(&r)), Err(DecodeError::Malformed(_))));
    let mut r = record(1);
    r.metadata = (0..=LIMITS.metadata_entries_max).map(|i| (format!("k{i}"), String::new())).collect();
    assert!(matches!(decode_record(&encode_record(&r)), Err(DecodeError::Malformed(_))));
    // At the limits, everything still decodes.
    let events = (1..=BATCH_EVENTS_MAX as u64).map(|s| event(1, s)).collect();
    assert!(decode_frame(&encode_frame(&Frame::Batch { batch_id: 1, events }), FRAME_BYTES_MAX).is_ok());
}

#[test]
fn only_a_whole_snapshot_from_a_schema_1_peer_may_exceed_the_frame_limit() {
    let snap = Frame::Snapshot {
        batch_id: 1,
        snapshot: Snapshot {
            origin_dc: "dc-a".into(),
            mark: Mark { epoch: 1, seq: 1 },
            instances: vec![],
            tombstones: vec![],
        },
    };
    let batch = Frame::Batch { batch_id: 1, events: vec![event(1, 1)] };
    for v in [1, 2] {
        let s = encode_frame_as(&snap, v).unwrap();
        assert_eq!(frame_bytes_max_for(&s[..FRAME_HEAD_BYTES.min(s.len())], true), SNAPSHOT_FRAME_BYTES_MAX);
        assert_eq!(frame_bytes_max_for(&s[..FRAME_HEAD_BYTES.min(s.len())], false), FRAME_BYTES_MAX);
        let b = encode_frame_as(&batch, v).unwrap();
        assert_eq!(frame_bytes_max_for(&b[..FRAME_HEAD_BYTES], true), FRAME_BYTES_MAX);
    }
    assert_eq!(frame_bytes_max_for(&[], true), FRAME_BYTES_MAX);
    assert_eq!(frame_bytes_max_for(&[0xff, 0xff, 0xff, 0xff], true), FRAME_BYTES_MAX);
    assert_eq!(frame_bytes_max_for(&[9, 3], true), FRAME_BYTES_MAX);
}
