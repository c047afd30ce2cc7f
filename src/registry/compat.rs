//! What the Consul and Nacos front ends (`crate::compat`) need of the registry besides the
//! native calls: an edit of a local record decided on the committer, and reads of the view
//! by namespace.

use std::sync::Arc;

use tandem_schemas::InstanceRecord;

use super::owners::Writer;
use super::view::SvcRef;
use super::write::{Edit, Outcome, Patch};
use super::Registry;
use crate::error::ApiError;

/// What an edit did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edited {
    /// Written as the event of this seq.
    Written(u64),
    /// The record already was so: nothing written.
    Unchanged,
}

impl Registry {
    /// Changes the fields of local instance `ns/svc/id` with `edit`, run on the committer
    /// against the instance's latest minted state (so two edits of one record never lose
    /// each other's change). `edit` returns whether it changed anything; a record it
    /// leaves as it was writes nothing.
    pub async fn edit_as(
        &self,
        ns: &str,
        svc: &str,
        id: &str,
        edit: impl Fn(&mut InstanceRecord) -> bool + Send + Sync + 'static,
        by: &Writer,
    ) -> Result<Edited, ApiError> {
        let (key, _) = self.local_key(ns, svc, id)?;
        let patch = Patch::Edit(Edit(Arc::new(edit)));
        match self.commit_as(vec![(key, patch)], Some(by.clone())).await?.into_iter().next() {
            Some(Outcome::Forbidden(e)) => Err(e),
            Some(Outcome::Written(ev)) => Ok(Edited::Written(ev.seq)),
            Some(Outcome::Unchanged) => Ok(Edited::Unchanged),
            Some(Outcome::Gone) | None => {
                Err(ApiError::not_found(format!("instance {id} of {ns}/{svc} is already gone")))
            }
        }
    }

    /// The record and seq of instance `ns/svc/id` whatever its owner.
    pub fn instance(&self, ns: &str, svc: &str, id: &str) -> Option<(u64, Arc<InstanceRecord>)> {
        self.view.find(ns, svc, id).map(|h| (h.seq, h.record))
    }

    /// Calls `f` with every instance of namespace `ns` (every owner), service by service in
    /// name order, under the view's read lock: `f` must be quick and must not call back
    /// into the registry.
    pub fn each_instance(&self, ns: &str, mut f: impl FnMut(&str, u64, &InstanceRecord)) {
        let v = self.view.view.read();
        let mut names: Vec<&str> = v.services.keys().filter(|(n, _)| **n == *ns).map(|(_, s)| &**s).collect();
        names.sort_unstable();
        for name in names {
            if let Some(s) = v.services.get(&SvcRef(ns, name)) {
                for h in s.instances.values() {
                    f(name, h.seq, &h.record);
                }
            }
        }
    }

    /// Waits until the view's index (any service's change) passes `index` or `wait`
    /// elapses.
    pub async fn wait_for_any(&self, index: u64, wait: std::time::Duration) {
        let mut rx = self.view.global.subscribe();
        let _ = tokio::time::timeout(wait, rx.wait_for(|i| *i > index)).await;
    }

    /// Every namespace the view holds, in name order.
    pub fn namespaces(&self) -> Vec<String> {
        let v = self.view.view.read();
        let mut out: Vec<String> = v.namespaces.keys().map(|n| n.to_string()).collect();
        out.sort_unstable();
        out
    }
}
