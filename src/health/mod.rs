//! Leases and health of ephemeral instances: a pure state machine, flap damping, and
//! cluster-wide self-preservation.
//!
//! Architecture invariant: this module does no I/O and never reads a clock. Every input
//! carries `now_ms`, a monotonic millisecond clock supplied by the caller, and every output
//! is a returned value. The registry drives it: [`Lease::heartbeat`] for each renewal,
//! [`Lease::tick`] from the periodic lease check, and each returned [`Transition`] becomes
//! exactly one change event. A call returns at most one transition; when much time has
//! passed it returns the final state directly (Healthy -> Unhealthy in one step), never a
//! burst of intermediate ones.
//!
//! # The lease state machine
//!
//! *Silence* is the time since the last renewal, `now_ms - last_renew_ms`; creating the
//! lease counts as a renewal. A lease has an *actual* health, driven by the rules below,
//! and a *published* health ([`Lease::health`]), which equals the actual one except while
//! the lease is damped (next section).
//!
//! Silence only ever makes health worse:
//!
//! - silence `>= suspect_after_ms`: at least Suspect;
//! - silence `>= unhealthy_after_ms`: Unhealthy;
//! - silence `>= expire_after_ms`: `tick` returns [`Transition::Expire`] unless expiry is
//!   paused, in which case the lease stays Unhealthy.
//!
//! `tick` applies these rules. `heartbeat` applies them too (never expiring: the heartbeat
//! proves the instance is alive) before it applies the renewal, so the health after a
//! heartbeat does not depend on whether a tick happened to run in the silence before it. A
//! heartbeat that ends a silence of 20 s with no tick in between therefore reports
//! Unhealthy, exactly as if the lease checker had seen the silence.
//!
//! A heartbeat is *consecutive* when the silence before it was shorter than
//! `suspect_after_ms`, i.e. short enough to have kept a healthy instance healthy. The
//! *streak* counts consecutive heartbeats; a heartbeat after a longer silence starts a new
//! streak of 1. After the silence rules, a heartbeat moves the actual health at most one
//! step up, and the way back from Unhealthy is slow (slow to kill, slow to revive):
//!
//! - Healthy stays Healthy;
//! - Suspect that has not been Unhealthy since it was last Healthy becomes Healthy (one
//!   heartbeat is enough);
//! - Unhealthy becomes Suspect once the streak reaches `recovery_heartbeats`, and the streak
//!   restarts at 0;
//! - Suspect reached on the way back from Unhealthy becomes Healthy once the streak reaches
//!   `recovery_heartbeats` again.
//!
//! With the default `recovery_heartbeats = 2`, an Unhealthy instance needs four consecutive
//! heartbeats to be Healthy again: Unhealthy, Suspect (2nd), Suspect, Healthy (4th). Health
//! never moves from Unhealthy to Healthy in one call, published or actual.
//!
//! After [`Transition::Expire`] the lease is finished: every later call returns `None`. The
//! caller removes the instance; a later heartbeat for it is a heartbeat for an unknown
//! instance, which the client answers by registering again.
//!
//! # Flap damping
//!
//! A *flip* is a change of the actual health. While a lease is not damped, each flip is
//! published as `Transition::Health { to, damped: false }` and its time is recorded; a
//! record is forgotten once it is `flap_window_ms` old. The flip that would make more than
//! `flap_transitions_max` records in the window is not published: instead the lease
//! becomes damped and returns [`Transition::Damped(true)`](Transition::Damped). A damped
//! lease holds the health it published before that flip (the current one, not an older
//! "stable" one, so engaging damping never changes the published health).
//!
//! While damped, flips are not published (the call returns `None`), and each flip restarts
//! the quiet period. Expiry is not damped: an instance that stops heartbeating altogether
//! still expires. The first call that finds `flap_window_ms` without a flip before it
//! releases the lease and publishes the actual health: `Transition::Health { to, damped:
//! false }` when it differs from the held one, `Transition::Damped(false)` otherwise. If
//! that call flips as well, the flip is folded into the same transition and recorded as the
//! first flip of the new window. One exception keeps the published path through Suspect:
//! when the held health is Unhealthy and the actual one is Healthy, the actual health is
//! set back to Suspect on the way back from Unhealthy (the streak restarts), and Suspect is
//! published.
//!
//! Consequence: within any window of `flap_window_ms`, a lease emits at most
//! `flap_transitions_max + 1` health transitions (the release plus one undamped run).
//!
//! # Self-preservation
//!
//! [`SelfPreservation`] pauses expiry in a namespace whose renewals collapse, as Eureka
//! does (a mass heartbeat loss is more likely a network or client problem than the death
//! of most instances, and expiring them all would collapse discovery), for at most
//! `self_preservation_max_pause_ms`. The [`LeaseTable`] keeps its accounting: it sees every
//! renewal and every lease that is added, removed, parked or expired. The caller asks
//! [`LeaseTable::evaluate_preservation`] before each lease check, and [`LeaseTable::check`]
//! pauses expiry in the namespaces it decided. The rules (which leases are expected to
//! renew, how often, and when a namespace pauses) are the docs of `preservation.rs`.
//!
//! Health transitions (Suspect, Unhealthy) are not paused: only removal is.

mod config;
mod due;
mod lease;
mod preservation;
mod table;

pub use config::*;
pub use lease::*;
pub use preservation::*;
pub use table::*;

#[cfg(test)]
mod preservation_tests;
#[cfg(test)]
mod tests;
