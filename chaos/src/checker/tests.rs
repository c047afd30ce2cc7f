//! Unit tests of the checker's pure helpers: lease-expiry arithmetic and view digests.

use super::state::expiry_within;
use super::*;

#[test]
fn expiry_needs_a_gap_of_a_ttl_while_the_owner_ran() {
    assert_eq!(expiry_within(&[], 0, 999, 1000), None);
    assert_eq!(expiry_within(&[], 0, 1000, 1000), Some(1000));
    // Killed at 500, respawned at 3000: no segment of 1000 until 4000.
    assert_eq!(expiry_within(&[(500, Some(3000))], 0, 3999, 1000), None);
    assert_eq!(expiry_within(&[(500, Some(3000))], 0, 4000, 1000), Some(4000));
    // Still dead: nothing expires.
    assert_eq!(expiry_within(&[(500, None)], 0, 99_999, 1000), None);
    // A gap before the kill counts.
    assert_eq!(expiry_within(&[(1500, Some(3000))], 0, 3100, 1000), Some(1000));
}

#[test]
fn digest_is_order_free_and_content_sensitive() {
    let v1 = ServiceView {
        index: 1,
        instances: vec![
            ObservedInstance {
                id: "x".into(),
                owner_dc: "a".into(),
                seq: 1,
                status: "up".into(),
                health: "healthy".into(),
                stale: false,
                damped: false,
            },
            ObservedInstance {
                id: "y".into(),
                owner_dc: "b".into(),
                seq: 2,
                status: "up".into(),
                health: "healthy".into(),
                stale: true,
                damped: false,
            },
        ],
    };
    let mut v2 = v1.clone();
    v2.instances.reverse();
    v2.instances[0].stale = false;
    let s = "svc".to_owned();
    assert_eq!(digest(&view_set([(&s, &v1)])), digest(&view_set([(&s, &v2)])));
    v2.instances[0].seq = 3;
    assert_ne!(digest(&view_set([(&s, &v1)])), digest(&view_set([(&s, &v2)])));
}
