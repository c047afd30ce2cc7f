//! Byte encodings of the keys and small values stored in RocksDB.
//!
//! Instance keys are encoded so that byte order equals the derived order of
//! [`InstanceKey`] (owner_dc, namespace, service, instance_id, each compared bytewise): each
//! field is written with `0x00` escaped as `0x00 0xFF` and is terminated by `0x00 0x01`.
//! A shorter field therefore sorts before any longer field it prefixes, and all keys of one
//! owner DC share the prefix [`owner_prefix`], which lets an origin's state be scanned as a
//! range.
//!
//! Decoders take untrusted bytes: they are bounded and return [`LogError::Corrupt`].

use tandem_replicator::log::LogError;
use tandem_schemas::{InstanceKey, Mark};

/// Longest encoded instance key accepted when decoding. Validated keys are far shorter
/// (32 + 128 + 128 + 256 bytes before escaping).
pub(crate) const KEY_BYTES_MAX: usize = 4096;

const ESCAPE: u8 = 0x00;
const ESCAPED_ZERO: u8 = 0xFF;
const TERMINATOR: u8 = 0x01;

fn push_field(out: &mut Vec<u8>, field: &str) {
    for &b in field.as_bytes() {
        if b == ESCAPE {
            out.extend_from_slice(&[ESCAPE, ESCAPED_ZERO]);
        } else {
            out.push(b);
        }
    }
    out.extend_from_slice(&[ESCAPE, TERMINATOR]);
}

/// The order-preserving encoding of an instance key.
pub(crate) fn encode_key(k: &InstanceKey) -> Vec<u8> {
    let len = k.owner_dc.len() + k.namespace.len() + k.service.len() + k.instance_id.len() + 8;
    let mut out = Vec::with_capacity(len);
    for field in [&k.owner_dc, &k.namespace, &k.service, &k.instance_id] {
        push_field(&mut out, field);
    }
    out
}

/// The prefix shared by the encoded keys of every instance owned by `owner_dc`.
pub(crate) fn owner_prefix(owner_dc: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(owner_dc.len() + 2);
    push_field(&mut out, owner_dc);
    out
}

/// The smallest byte string greater than every key starting with `prefix` (an exclusive
/// upper bound for a range scan). `prefix` is an [`owner_prefix`], so it ends with the
/// terminator, which is below `0xFF`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    match end.last_mut() {
        Some(last) if *last < u8::MAX => *last += 1,
        // Not produced by `owner_prefix`; an empty end bound would mean "no upper bound",
        // so fall back to a bound past every key with this prefix.
        Some(_) | None => end.push(u8::MAX),
    }
    end
}

/// Decodes an encoded instance key.
pub(crate) fn decode_key(bytes: &[u8]) -> Result<InstanceKey, LogError> {
    if bytes.len() > KEY_BYTES_MAX {
        return Err(corrupt_key(format!("{} bytes, more than {KEY_BYTES_MAX}", bytes.len())));
    }
    let mut rest = bytes;
    let mut fields: [String; 4] = Default::default();
    for field in &mut fields {
        let mut raw = Vec::new();
        loop {
            match rest {
                [ESCAPE, ESCAPED_ZERO, tail @ ..] => {
                    raw.push(0);
                    rest = tail;
                }
                [ESCAPE, TERMINATOR, tail @ ..] => {
                    rest = tail;
                    break;
                }
                [ESCAPE, ..] => return Err(corrupt_key("bad escape sequence".into())),
                [b, tail @ ..] => {
                    raw.push(*b);
                    rest = tail;
                }
                [] => return Err(corrupt_key("truncated field".into())),
            }
        }
        *field = String::from_utf8(raw).map_err(|_| corrupt_key("field is not UTF-8".into()))?;
    }
    if !rest.is_empty() {
        return Err(corrupt_key(format!("{} trailing bytes", rest.len())));
    }
    let [owner_dc, namespace, service, instance_id] = fields;
    Ok(InstanceKey {
        owner_dc: owner_dc.into(),
        namespace: namespace.into(),
        service: service.into(),
        instance_id: instance_id.into(),
    })
}

fn corrupt_key(problem: String) -> LogError {
    LogError::Corrupt(format!("instance key: {problem}"))
}

/// A seq as a log key: big-endian, so that byte order is numeric order.
pub(crate) fn seq_key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

pub(crate) fn decode_u64(what: &str, bytes: &[u8]) -> Result<u64, LogError> {
    let arr: [u8; 8] = bytes
        .try_into()
        .map_err(|_| LogError::Corrupt(format!("{what}: {} bytes, expected 8", bytes.len())))?;
    Ok(u64::from_be_bytes(arr))
}

pub(crate) fn encode_mark(m: Mark) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&m.epoch.to_be_bytes());
    out[8..].copy_from_slice(&m.seq.to_be_bytes());
    out
}

pub(crate) fn decode_mark(what: &str, bytes: &[u8]) -> Result<Mark, LogError> {
    if bytes.len() != 16 {
        return Err(LogError::Corrupt(format!("{what}: {} bytes, expected 16", bytes.len())));
    }
    let (epoch, seq) = bytes.split_at(8);
    Ok(Mark { epoch: decode_u64(what, epoch)?, seq: decode_u64(what, seq)? })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(o: &str, n: &str, s: &str, i: &str) -> InstanceKey {
        InstanceKey { owner_dc: o.into(), namespace: n.into(), service: s.into(), instance_id: i.into() }
    }

    fn any_key() -> impl Strategy<Value = InstanceKey> {
        // Small alphabets, including NUL and 0xFF-ish chars, so that prefixes and escapes
        // collide often.
        let field = || proptest::string::string_regex("[ab\u{0}\u{1}\u{ff}]{0,4}").unwrap();
        (field(), field(), field(), field()).prop_map(|(o, n, s, i)| key(&o, &n, &s, &i))
    }

    proptest! {
        #[test]
        fn key_encoding_round_trips(k in any_key()) {
            prop_assert_eq!(decode_key(&encode_key(&k)).unwrap(), k);
        }

        #[test]
        fn key_encoding_preserves_order(a in any_key(), b in any_key()) {
            prop_assert_eq!(encode_key(&a).cmp(&encode_key(&b)), a.cmp(&b));
        }

        #[test]
        fn owner_prefix_bounds_exactly_the_owners_keys(k in any_key(), owner in "[ab\u{0}]{0,3}") {
            let prefix = owner_prefix(&owner);
            let enc = encode_key(&k);
            let inside = enc.as_slice() >= prefix.as_slice() && enc < prefix_end(&prefix);
            prop_assert_eq!(inside, *k.owner_dc == *owner);
            prop_assert_eq!(enc.starts_with(&prefix), *k.owner_dc == *owner);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_key(&bytes);
        }
    }

    #[test]
    fn corrupt_keys_are_reported() {
        for bad in [&b""[..], b"dc\x00\x01ns", b"\x00\x02", b"\xff\xfe\x00\x01\x00\x01\x00\x01\x00\x01"] {
            assert!(matches!(decode_key(bad), Err(LogError::Corrupt(_))), "{bad:?}");
        }
        let mut long = encode_key(&key("a", "b", "c", "d"));
        long.push(b'x');
        assert!(matches!(decode_key(&long), Err(LogError::Corrupt(_))));
        assert!(matches!(decode_mark("m", &[0; 15]), Err(LogError::Corrupt(_))));
        assert!(matches!(decode_u64("u", &[0; 9]), Err(LogError::Corrupt(_))));
    }
}
