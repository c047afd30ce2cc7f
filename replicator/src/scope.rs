//! The replication scope of a peer DC: the namespaces it may replicate into this DC.
//!
//! A receiver applies an event of a namespace outside the origin's scope as a no-op (the
//! seq is consumed, the mark advances, nothing is written) and installs only the in-scope
//! part of the origin's snapshots. The scope in force is the one the receiver's mark was
//! acquired under; the log records it durably, and a configured scope that is wider than
//! the recorded one resets the mark's seq so that the origin resyncs
//! (docs/replication.md, "Replication scope"). Pure: no I/O.

use std::borrow::Cow;
use std::collections::BTreeSet;

use tandem_schemas::Snapshot;

/// The namespaces a peer DC may replicate into this DC.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Scope {
    /// Every namespace (the default: no `namespaces` configured for the peer).
    #[default]
    All,
    /// Only these namespaces (possibly none).
    Only(BTreeSet<String>),
}

impl Scope {
    /// A scope of exactly these namespaces.
    pub fn only<I: IntoIterator<Item = S>, S: Into<String>>(namespaces: I) -> Self {
        Scope::Only(namespaces.into_iter().map(Into::into).collect())
    }

    /// `Some(list)` as configured (`namespaces = [..]`), `None`: every namespace.
    pub fn from_config(namespaces: Option<&[String]>) -> Self {
        match namespaces {
            None => Scope::All,
            Some(list) => Scope::only(list.iter().cloned()),
        }
    }

    /// Whether events of `namespace` apply here.
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Only(set) => set.contains(namespace),
        }
    }

    /// Whether every namespace `other` allows is allowed by `self` (`other` is no wider).
    pub fn covers(&self, other: &Scope) -> bool {
        match (self, other) {
            (Scope::All, Scope::All | Scope::Only(_)) => true,
            (Scope::Only(_), Scope::All) => false,
            (Scope::Only(mine), Scope::Only(theirs)) => theirs.is_subset(mine),
        }
    }

    /// The part of `snap` this scope allows, and how many entries (instances and
    /// tombstones) it left out. Borrowed when nothing is left out.
    pub fn filter_snapshot<'a>(&self, snap: &'a Snapshot) -> (Cow<'a, Snapshot>, usize, Option<String>) {
        let out_inst = snap.instances.iter().filter(|i| !self.allows(&i.record.key.namespace));
        let out_tomb = snap.tombstones.iter().filter(|t| !self.allows(&t.key.namespace));
        let sample = out_inst
            .clone()
            .map(|i| i.record.key.namespace.to_string())
            .next()
            .or_else(|| out_tomb.clone().map(|t| t.key.namespace.to_string()).next());
        let left_out = out_inst.count() + out_tomb.count();
        if left_out == 0 {
            return (Cow::Borrowed(snap), 0, None);
        }
        let kept = Snapshot {
            origin_dc: snap.origin_dc.clone(),
            mark: snap.mark,
            instances: snap
                .instances
                .iter()
                .filter(|i| self.allows(&i.record.key.namespace))
                .cloned()
                .collect(),
            tombstones: snap.tombstones.iter().filter(|t| self.allows(&t.key.namespace)).cloned().collect(),
        };
        (Cow::Owned(kept), left_out, sample)
    }

    /// The stored form: `None` for every namespace, else the names joined by `\n` (names
    /// never hold one).
    pub fn to_stored(&self) -> Option<String> {
        match self {
            Scope::All => None,
            Scope::Only(set) => Some(set.iter().map(String::as_str).collect::<Vec<_>>().join("\n")),
        }
    }

    /// Reads [`Scope::to_stored`]'s form back.
    pub fn from_stored(stored: Option<&str>) -> Self {
        match stored {
            None => Scope::All,
            Some("") => Scope::Only(BTreeSet::new()),
            Some(s) => Scope::only(s.split('\n')),
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::All => f.write_str("all namespaces"),
            Scope::Only(set) => {
                f.write_str("[")?;
                for (i, ns) in set.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(ns)?;
                }
                f.write_str("]")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_and_allows() {
        let a = Scope::only(["a"]);
        let ab = Scope::only(["a", "b"]);
        assert!(Scope::All.covers(&ab) && Scope::All.covers(&Scope::All));
        assert!(!ab.covers(&Scope::All));
        assert!(ab.covers(&a) && !a.covers(&ab) && a.covers(&a));
        assert!(a.covers(&Scope::only(Vec::<String>::new())));
        assert!(a.allows("a") && !a.allows("b") && Scope::All.allows("b"));
    }

    #[test]
    fn stored_form_round_trips() {
        for s in
            [Scope::All, Scope::only(Vec::<String>::new()), Scope::only(["a"]), Scope::only(["b", "a.x"])]
        {
            assert_eq!(Scope::from_stored(s.to_stored().as_deref()), s);
        }
    }
}
