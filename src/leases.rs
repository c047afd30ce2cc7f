//! The lease lifecycle of a registry: every live local ephemeral instance has exactly one
//! lease, and every lease has its instance ([`check_invariant`]).

use std::collections::BTreeSet;

use tandem_schemas::{InstanceKey, InstanceRecord};

use crate::health::LeaseTable;

/// Checks the lease invariant: the live local ephemeral instances of the latest minted
/// state (`in_view`, overlaid with `in_flight`: a key's write in flight, `None` for a
/// deregistration) are exactly the keys of `leases`. Returns the number of leases.
pub fn check_invariant<'a>(
    local_dc: &str,
    in_view: impl Iterator<Item = &'a InstanceRecord>,
    in_flight: impl Iterator<Item = (&'a InstanceKey, Option<&'a InstanceRecord>)>,
    leases: &LeaseTable<InstanceKey>,
) -> Result<usize, String> {
    let leased = |r: &InstanceRecord| *r.key.owner_dc == *local_dc && !r.persistent;
    let flight: Vec<(&InstanceKey, Option<&InstanceRecord>)> = in_flight.collect();
    let overlaid: BTreeSet<&InstanceKey> = flight.iter().map(|(k, _)| *k).collect();
    let mut live: BTreeSet<&InstanceKey> =
        in_view.filter(|r| leased(r) && !overlaid.contains(&r.key)).map(|r| &r.key).collect();
    live.extend(flight.iter().filter_map(|(k, r)| r.filter(|r| leased(r)).map(|_| *k)));
    let with_lease: BTreeSet<&InstanceKey> = leases.keys().collect();
    if let Some(k) = live.difference(&with_lease).next() {
        return Err(format!("live instance {} has no lease", k.instance_id));
    }
    if let Some(k) = with_lease.difference(&live).next() {
        return Err(format!("lease of {} has no live instance", k.instance_id));
    }
    Ok(with_lease.len())
}
