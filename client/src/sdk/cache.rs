//! The consumer's cache of one service, with push-empty protection.
//!
//! Pure: answers and the time (`now_ms`, any monotonic origin) are passed in; the cache
//! returns what it did. No I/O, no clock, so every rule here is testable with a table.
//!
//! Push-empty protection, the exact rule: when the cache lists at least one instance and an
//! answer lists none, the answer is held back and the cache keeps its instances. The empty
//! answer is applied only when both hold:
//! 1. at least `confirmations` empty answers arrived in a row (a non-empty answer in
//!    between starts the count again; failed requests neither count nor reset it), and
//! 2. at least `confirm_after` passed between the first of them and the one that applies.
//!
//! While an empty answer is held, the consumer re-reads every
//! `confirm_after / (confirmations - 1)` (see [`Cache::recheck_in`]), so a confirmed empty
//! is applied about `confirm_after` after it first appeared, and a real recovery (a
//! non-empty answer) ends the hold at once. An empty answer into an empty cache is applied
//! at once: there is nothing to protect. The rule does not look at the answer's
//! `failover` or index: a registry that restarted without its data (the case this protects
//! against) answers exactly like one whose service really emptied, so only time and
//! repetition can tell them apart on the client.

use std::sync::Arc;
use std::time::Duration;

use super::model::{Answer, ServiceView, ViewSource};

/// When an empty answer may replace a non-empty cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmptyRule {
    /// Empty answers in a row needed (at least 1).
    pub confirmations: u32,
    /// Least time from the first of them to the one that applies.
    pub confirm_after: Duration,
}

impl Default for EmptyRule {
    fn default() -> Self {
        EmptyRule { confirmations: 3, confirm_after: Duration::from_secs(15) }
    }
}

/// An empty answer being held back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingEmpty {
    /// When the first empty answer in the current run arrived.
    pub first_ms: u64,
    /// Empty answers in the current run.
    pub seen: u32,
    /// Index of the latest of them.
    pub index: u64,
}

/// What [`Cache::handle_answer`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The answer replaced the view; `changed`: it differs materially (see
    /// [`ServiceView::differs_materially`]), so watchers should be told.
    Applied { changed: bool },
    /// An empty answer was held back; the cache is unchanged.
    EmptyHeld(PendingEmpty),
    /// A held empty answer was confirmed and applied: the cache is now empty.
    EmptyConfirmed,
}

/// One service's cache.
#[derive(Clone, Debug)]
pub struct Cache {
    view: Arc<ServiceView>,
    pending: Option<PendingEmpty>,
    rule: EmptyRule,
}

impl Cache {
    pub fn new(namespace: &str, service: &str, rule: EmptyRule) -> Cache {
        Cache { view: Arc::new(ServiceView::empty(namespace, service)), pending: None, rule }
    }

    /// Starts from a view read from the disk snapshot.
    pub fn restore(&mut self, view: ServiceView) {
        self.view = Arc::new(view);
        self.pending = None;
    }

    pub fn view(&self) -> &Arc<ServiceView> {
        &self.view
    }

    pub fn pending_empty(&self) -> Option<PendingEmpty> {
        self.pending
    }

    /// Folds one registry answer in, applying the push-empty rule.
    pub fn handle_answer(&mut self, answer: Answer, now_ms: u64) -> Outcome {
        if answer.instances.is_empty() && !self.view.instances.is_empty() {
            let p =
                self.pending.get_or_insert(PendingEmpty { first_ms: now_ms, seen: 0, index: answer.index });
            p.seen = p.seen.saturating_add(1);
            p.index = answer.index;
            let old_enough = now_ms.saturating_sub(p.first_ms) >= self.rule.confirm_after.as_millis() as u64;
            if p.seen < self.rule.confirmations || !old_enough {
                return Outcome::EmptyHeld(*p);
            }
            self.pending = None;
            self.view = Arc::new(self.view_of(answer));
            return Outcome::EmptyConfirmed;
        }
        self.pending = None;
        let next = self.view_of(answer);
        let changed = self.view.differs_materially(&next);
        self.view = Arc::new(next);
        Outcome::Applied { changed }
    }

    /// While an empty answer is held: how soon to read again so that the rule can confirm
    /// it in about `confirm_after`. `None` when nothing is held.
    pub fn recheck_in(&self, now_ms: u64) -> Option<Duration> {
        let p = self.pending?;
        let age = Duration::from_millis(now_ms.saturating_sub(p.first_ms));
        let remaining = self.rule.confirm_after.saturating_sub(age);
        if p.seen >= self.rule.confirmations || self.rule.confirmations <= 1 {
            return Some(remaining);
        }
        Some(self.rule.confirm_after / (self.rule.confirmations - 1))
    }

    fn view_of(&self, a: Answer) -> ServiceView {
        ServiceView {
            namespace: self.view.namespace.clone(),
            service: self.view.service.clone(),
            index: a.index,
            instances: a.instances,
            failover: a.failover,
            protected: a.protected,
            source: ViewSource::Registry,
        }
    }
}
