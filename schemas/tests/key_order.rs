//! `InstanceKey`'s hand-written order (names sharing an allocation compare equal without
//! being read) is exactly the order of its fields' contents, whether or not two keys
//! share their names' allocations; and a key's borrowed names (`InstanceNames`, a lookup
//! without a key) hash as the key does and match exactly the keys of the same contents.

use std::cmp::Ordering;
use std::sync::Arc;

use proptest::prelude::*;
use tandem_schemas::{InstanceKey, InstanceNames, Name};

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

    #[test]
    fn names_hash_as_their_key_and_match_only_its_contents(a in fields(), b in fields()) {
        let key = |f: &[String; 4]| InstanceKey {
            owner_dc: f[0].as_str().into(),
            namespace: f[1].as_str().into(),
            service: f[2].as_str().into(),
            instance_id: f[3].as_str().into(),
        };
        let (x, y) = (key(&a), key(&b));
        let names = InstanceNames { owner_dc: &b[0], namespace: &b[1], service: &b[2], instance_id: &b[3] };
        prop_assert_eq!(names, y.names());
        let hash = |h: &dyn Fn(&mut std::collections::hash_map::DefaultHasher)| {
            let mut s = std::collections::hash_map::DefaultHasher::new();
            h(&mut s);
            std::hash::Hasher::finish(&s)
        };
        prop_assert_eq!(hash(&|s| std::hash::Hash::hash(&names, s)), hash(&|s| std::hash::Hash::hash(&y, s)));
        prop_assert_eq!(names.is(&x), x == y);
        prop_assert!(names.is(&y));
    }
}
