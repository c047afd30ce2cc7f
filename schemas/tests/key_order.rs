//! `InstanceKey`'s hand-written order (names sharing an allocation compare equal without
//! being read) is exactly the order of its fields' contents, whether or not two keys
//! share their names' allocations.

use std::cmp::Ordering;
use std::sync::Arc;

use proptest::prelude::*;
use tandem_schemas::{InstanceKey, Name};

fn contents(k: &InstanceKey) -> (String, String, String, String) {
    (k.owner_dc.to_string(), k.namespace.to_string(), k.service.to_string(), k.instance_id.to_string())
}

/// A few short names, so that equal ones are common.
fn name() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["", "a", "ab", "b", "dc-a", "dc-b", "orders"]).prop_map(str::to_owned)
}

fn fields() -> impl Strategy<Value = [String; 4]> {
    [name(), name(), name(), name()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn the_order_is_the_order_of_the_contents(a in fields(), b in fields(), share in any::<[bool; 4]>()) {
        let ka: [Name; 4] = a.clone().map(Name::from);
        // Each of b's names is either a's allocation (when the contents are equal and
        // `share` says so) or one of its own.
        let kb: [Name; 4] = std::array::from_fn(|i| {
            if share[i] && a[i] == b[i] { ka[i].clone() } else { Name::from(b[i].as_str()) }
        });
        let key = |n: &[Name; 4]| InstanceKey {
            owner_dc: n[0].clone(),
            namespace: n[1].clone(),
            service: n[2].clone(),
            instance_id: n[3].clone(),
        };
        let (x, y) = (key(&ka), key(&kb));
        let want = contents(&x).cmp(&contents(&y));
        prop_assert_eq!(x.cmp(&y), want);
        prop_assert_eq!(y.cmp(&x), want.reverse());
        prop_assert_eq!(x == y, want == Ordering::Equal);
        prop_assert_eq!(x.partial_cmp(&y), Some(want));
        prop_assert!(Arc::ptr_eq(&x.namespace, &ka[1]));
    }
}
