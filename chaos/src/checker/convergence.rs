//! Convergence of two final views (pure, also used by drills to decide when to stop
//! waiting): the replicated view as a set, its digest, and what differs between two DCs.

use std::collections::BTreeSet;

use super::{ServiceView, StatusView};

/// (service, owner, id, seq, status, health): what must be equal in every DC at the end.
pub type ViewEntry = (String, String, String, u64, String, String);

/// The replicated view of a DC across services, as a set.
pub fn view_set<'a>(views: impl IntoIterator<Item = (&'a String, &'a ServiceView)>) -> BTreeSet<ViewEntry> {
    let mut out = BTreeSet::new();
    for (svc, v) in views {
        for i in &v.instances {
            out.insert((
                svc.clone(),
                i.owner_dc.clone(),
                i.id.clone(),
                i.seq,
                i.status.clone(),
                i.health.clone(),
            ));
        }
    }
    out
}

/// FNV-1a over the sorted entries: equal sets have equal digests.
pub fn digest(set: &BTreeSet<ViewEntry>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (svc, owner, id, seq, status, health) in set {
        for part in [
            svc.as_bytes(),
            owner.as_bytes(),
            id.as_bytes(),
            &seq.to_be_bytes(),
            status.as_bytes(),
            health.as_bytes(),
        ] {
            eat(part);
            eat(&[0xff]);
        }
    }
    h
}

/// Why two DCs have not converged, or `None` when they have: differing entries (at most
/// `limit` of each side) and marks that have not caught up.
pub fn divergence(
    a: (&str, &BTreeSet<ViewEntry>, &StatusView),
    b: (&str, &BTreeSet<ViewEntry>, &StatusView),
    limit: usize,
) -> Option<Vec<String>> {
    let mut out = Vec::new();
    if digest(a.1) != digest(b.1) || a.1 != b.1 {
        for e in a.1.difference(b.1).take(limit) {
            out.push(format!("only in {}: {}", a.0, entry_line(e)));
        }
        for e in b.1.difference(a.1).take(limit) {
            out.push(format!("only in {}: {}", b.0, entry_line(e)));
        }
    }
    for (x, y) in [(&a, &b), (&b, &a)] {
        let held = x.2.applied.get(y.0).copied();
        if held != Some(y.2.log) {
            out.push(format!(
                "{} has applied {} up to {}, but {}'s log is at {}",
                x.0,
                y.0,
                held.map_or("nothing".to_owned(), |m| m.to_string()),
                y.0,
                y.2.log
            ));
        }
    }
    (!out.is_empty()).then_some(out)
}

fn entry_line(e: &ViewEntry) -> String {
    format!("{}/{} owner {} seq {} {} {}", e.0, e.2, e.1, e.3, e.4, e.5)
}
