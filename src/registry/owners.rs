//! Instance ownership: the principal that registered an own instance is the only one (with
//! the admins) that may re-register, change or deregister it, or renew its lease.
//!
//! The owner is recorded in the same durable write as the registration (see
//! [`CommitLog::append_local_owned`](crate::store::CommitLog::append_local_owned)) and
//! removed with the deregistration (explicit or a lease expiry). Judged on the committer
//! thread against the latest minted owner (a write in flight included), so two principals
//! racing to register one instance id cannot both win. Heartbeats are judged against the
//! same map, in memory.
//!
//! With ACLs off every request is the anonymous principal, which is an admin: nothing is
//! refused, and what it registers is recorded as owned by `anonymous`. With ACLs on, an
//! instance owned by `anonymous` (registered with ACLs off) or by no one (registered
//! before owners were recorded) may be changed by any principal with `write` on its
//! service, and a registration by a token claims it.

use std::sync::Arc;

use axum::http::StatusCode;
use tandem_schemas::InstanceKey;

use crate::error::ApiError;

/// The owner recorded for what the anonymous principal (ACLs off) registers.
pub const ANONYMOUS: &str = "anonymous";

/// Who writes, as ownership sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Writer {
    /// The principal recorded as owner of what it registers (a token's `principal`, else
    /// its id; `anonymous` with ACLs off). Never a secret.
    pub principal: Arc<str>,
    /// May change any instance (the `admin` scope; everyone with ACLs off).
    pub admin: bool,
}

impl Writer {
    /// ACLs off (and the registry's own tests): owns what it registers, may change anything.
    pub fn anonymous() -> Writer {
        Writer { principal: ANONYMOUS.into(), admin: true }
    }
}

/// Keyed by instance, doubling without hashing a key again (`hashed.rs`): a doubling runs
/// under the registry's lock.
type Map<V> = crate::hashed::HashedMap<InstanceKey, V>;

/// The owners of the own live instances: as durable, and as minted by writes in flight.
///
/// Only owners that restrict anything are held: an instance owned by [`ANONYMOUS`] is
/// judged exactly as one owned by no one (see [`judge`]), so it costs no entry here. With
/// ACLs off that is every instance, and a node holding a million leases spends nothing on
/// ownership (an entry costs about 180 B at that size: an `InstanceKey`, an owner and 32
/// bits of its hash in a table of 2^21 buckets). Nor does the log record an owner for
/// them; a data dir an earlier build wrote may still hold owner records naming
/// `anonymous`, which [`Owners::load`] skips.
#[derive(Debug, Default)]
pub(super) struct Owners {
    /// Owners other than [`ANONYMOUS`], one shared copy per principal.
    durable: Map<Arc<str>>,
    /// Key -> (seq of the write in flight, owner it sets; `None`: removes).
    inflight: Map<(u64, Option<Arc<str>>)>,
}

/// An owner change a write minted: (key, seq, owner after it).
pub(super) type OwnerChange = (InstanceKey, u64, Option<Arc<str>>);

impl Owners {
    pub(super) fn load(&mut self, owners: Vec<(InstanceKey, Arc<str>)>) {
        // Each stored record read back is its own allocation: share one per principal.
        let mut principals: hashbrown::HashSet<Arc<str>, foldhash::fast::RandomState> =
            hashbrown::HashSet::default();
        self.durable = owners
            .into_iter()
            .filter(|(_, o)| !restricts_nothing(o))
            .map(|(k, o)| (k, principals.get_or_insert(o).clone()))
            .collect();
        self.inflight.clear();
    }

    /// The latest minted owner of `key`.
    pub(super) fn current(&self, key: &InstanceKey) -> Option<Arc<str>> {
        match self.inflight.get(key) {
            Some((_, owner)) => owner.clone(),
            None => self.durable.get(key).cloned(),
        }
    }

    pub(super) fn mint(&mut self, change: &OwnerChange) {
        let (key, seq, owner) = change;
        self.inflight.insert(key.clone(), (*seq, owner.clone()));
    }

    /// Once the outcome of a write is known (on the committer, in commit order): what it
    /// wrote becomes durable here; its in-flight entries go unless a later write replaced them.
    pub(super) fn settle(&mut self, changes: &[OwnerChange], written: bool) {
        for (key, seq, owner) in changes {
            if written {
                match owner {
                    Some(o) if !restricts_nothing(o) => self.durable.insert(key.clone(), o.clone()),
                    _ => self.durable.remove(key),
                };
            }
            if self.inflight.get(key).is_some_and(|(s, _)| s == seq) {
                self.inflight.remove(key);
            }
        }
    }

    /// Own instances owned by a named principal (not [`ANONYMOUS`]).
    pub(super) fn len(&self) -> usize {
        self.durable.len()
    }
}

/// An owner that [`judge`] treats as no owner at all.
fn restricts_nothing(owner: &str) -> bool {
    owner == ANONYMOUS
}

/// Whether `writer` may change an instance owned by `owner`; else the 403, naming why.
pub(super) fn judge(owner: Option<&str>, writer: &Writer, key: &InstanceKey) -> Result<(), ApiError> {
    match owner {
        None => Ok(()),
        Some(o) if restricts_nothing(o) || *o == *writer.principal || writer.admin => Ok(()),
        Some(o) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "instance {}/{}/{} is owned by principal {o}; principal {} is neither its owner nor an admin",
                key.namespace, key.service, key.instance_id, writer.principal
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> InstanceKey {
        InstanceKey {
            owner_dc: "dc-a".into(),
            namespace: "default".into(),
            service: "orders".into(),
            instance_id: id.into(),
        }
    }

    #[test]
    fn only_the_owner_or_an_admin_may_change_an_owned_instance() {
        let a = Writer { principal: "a".into(), admin: false };
        let b = Writer { principal: "b".into(), admin: false };
        let admin = Writer { principal: "root".into(), admin: true };
        let k = key("o1");
        assert!(judge(Some("a"), &a, &k).is_ok());
        let e = judge(Some("a"), &b, &k).unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::FORBIDDEN, "forbidden"));
        assert!(e.message.contains("owned by principal a"), "{}", e.message);
        assert!(judge(Some("a"), &admin, &k).is_ok());
        // Unowned, or registered with ACLs off: any writer with the scope.
        assert!(judge(None, &b, &k).is_ok());
        assert!(judge(Some(ANONYMOUS), &b, &k).is_ok());
    }

    #[test]
    fn in_flight_owners_win_and_settle_in_order() {
        let mut o = Owners::default();
        let k = key("o1");
        let first: OwnerChange = (k.clone(), 5, Some("a".into()));
        let second: OwnerChange = (k.clone(), 6, None);
        o.mint(&first);
        assert_eq!(o.current(&k).as_deref(), Some("a"));
        o.mint(&second);
        assert_eq!(o.current(&k), None);
        o.settle(std::slice::from_ref(&first), true);
        assert_eq!(o.current(&k), None, "the later write still in flight decides");
        o.settle(std::slice::from_ref(&second), false);
        assert_eq!(o.current(&k).as_deref(), Some("a"), "the failed removal left the durable owner");
    }

    #[test]
    fn anonymous_owners_take_no_entry_and_judge_as_none() {
        let mut o = Owners::default();
        let (anon, named) = (key("o1"), key("o2"));
        o.load(vec![(anon.clone(), ANONYMOUS.into()), (named.clone(), "a".into())]);
        assert_eq!(o.len(), 1, "only the named owner is held");
        let b = Writer { principal: "b".into(), admin: false };
        assert!(judge(o.current(&anon).as_deref(), &b, &anon).is_ok());
        assert!(judge(o.current(&named).as_deref(), &b, &named).is_err());

        // A write that makes a named instance anonymous (ACLs turned off, then a
        // re-register) frees its entry; one that names it again takes it back.
        let to_anon: OwnerChange = (named.clone(), 7, Some(ANONYMOUS.into()));
        o.mint(&to_anon);
        o.settle(std::slice::from_ref(&to_anon), true);
        assert_eq!(o.len(), 0);
        assert!(judge(o.current(&named).as_deref(), &b, &named).is_ok());
        let to_a: OwnerChange = (named.clone(), 8, Some("a".into()));
        o.mint(&to_a);
        o.settle(std::slice::from_ref(&to_a), true);
        assert_eq!(o.len(), 1);
        assert!(judge(o.current(&named).as_deref(), &b, &named).is_err());
    }

    #[test]
    fn loaded_owners_share_one_copy_per_principal() {
        let mut o = Owners::default();
        o.load((0..3).map(|i| (key(&format!("i{i}")), Arc::<str>::from("a"))).collect());
        let held: Vec<Arc<str>> = (0..3).map(|i| o.current(&key(&format!("i{i}"))).unwrap()).collect();
        assert!(held.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
    }
}
