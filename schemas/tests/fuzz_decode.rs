//! Random and mutated bytes never panic the decoders (a cheap, always-on fuzz pass; the
//! coverage-guided targets live in fuzz/).

use proptest::prelude::*;
use tandem_schemas::*;

fn sample() -> Vec<u8> {
    encode_frame(&Frame::Ping { last_seq: 3, floor_seq: 1, now_ms: 9 })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_frame(&bytes, FRAME_BYTES_MAX);
        let _ = decode_event(&bytes);
        let _ = decode_record(&bytes);
    }

    #[test]
    fn mutated_frames_never_panic(pos in 0usize..64, val in any::<u8>()) {
        let mut b = sample();
        let i = pos % b.len();
        b[i] = val;
        let _ = decode_frame(&b, FRAME_BYTES_MAX);
    }
}
