//! The process's heartbeat batcher: every instance this process holds is renewed in one
//! `POST /v1/heartbeats` per period, not one request per instance.
//!
//! Providers that talk to the same registry addresses (with the same timeouts) join one
//! [`Group`]; the group's task wakes when the earliest member is due and takes along every
//! member due within half of its own period (an early renewal is harmless), so members
//! started at different times fall into step after one round and stay there. Above
//! [`HEARTBEAT_BATCH_MAX`] instances the batch goes out in chunks. Each entry of the
//! answer is handled per instance, as a single heartbeat's answer would be: `unknown`
//! (404) registers the instance again, `conflict` (409, another DC owns it) and failed
//! requests count as failed beats and retry with the member's own capped backoff. The
//! instances one round found unknown register again together (`POST /v1/registrations`,
//! as `Provider::register_all`), in a task of their own, so that a slow write never delays
//! the other instances' beats: a registry that lost its data gets one request per chunk
//! back from each process, not one per instance.
//!
//! The task runs while the group has members and ends with the last one.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::provider::{reregister_together, Shared};
use super::{jittered, Backoff, RetryConfig};
use crate::api::{HeartbeatBatch, HeartbeatItem, HEARTBEAT_BATCH_MAX};
use crate::client::{Client, ClientError};

/// Providers with equal keys share a group (and its requests, sent with the token).
#[derive(Clone, Debug, PartialEq, Eq)]
struct GroupKey {
    addrs: Vec<String>,
    connect_timeout: Duration,
    request_timeout: Duration,
    tls: Option<crate::ClientTls>,
    token: Option<crate::client::Token>,
}

/// The groups of this process (dead entries are swept on each join).
static GROUPS: Mutex<Vec<(GroupKey, Weak<Group>)>> = Mutex::new(Vec::new());

/// The instances of one set of registry addresses, and the task that renews them.
pub(crate) struct Group {
    client: Client,
    inner: Mutex<Inner>,
    wake: Notify,
}

struct Inner {
    members: BTreeMap<u64, Member>,
    next_id: u64,
    task: Option<JoinHandle<()>>,
}

struct Member {
    provider: Arc<Shared>,
    interval: Duration,
    jitter_pct: u32,
    backoff: Backoff,
    due: Instant,
}

/// A provider's place in its group; dropping it stops the instance's heartbeats.
pub(crate) struct Membership {
    group: Arc<Group>,
    id: u64,
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.group.inner.lock().members.remove(&self.id);
        self.group.wake.notify_one();
    }
}

/// Adds `provider` (heartbeat period `interval`) to the group of its addresses, starting
/// the group's task if it is not running.
pub(crate) fn join(provider: Arc<Shared>, interval: Duration) -> Membership {
    let cfg = &provider.cfg;
    let key = GroupKey {
        addrs: cfg.addrs.clone(),
        connect_timeout: cfg.connect_timeout,
        request_timeout: cfg.request_timeout,
        tls: cfg.tls.clone(),
        token: cfg.token.clone(),
    };
    let group = {
        let mut groups = GROUPS.lock();
        groups.retain(|(_, g)| g.strong_count() > 0);
        match groups.iter().find(|(k, _)| *k == key).and_then(|(_, g)| g.upgrade()) {
            Some(g) => g,
            None => {
                let g = Arc::new(Group {
                    client: cfg.client(),
                    inner: Mutex::new(Inner { members: BTreeMap::new(), next_id: 0, task: None }),
                    wake: Notify::new(),
                });
                groups.push((key, Arc::downgrade(&g)));
                g
            }
        }
    };
    // Retries stay within one period, as a heartbeat must not wait longer than that.
    let retry = RetryConfig { initial: cfg.retry.initial.min(interval), max: cfg.retry.max.min(interval) };
    let jitter_pct = cfg.provider.heartbeat_jitter_pct;
    let member = Member {
        interval,
        jitter_pct,
        backoff: Backoff::new(retry),
        due: Instant::now() + jittered(interval, jitter_pct, &mut rand::thread_rng()),
        provider,
    };
    let id = {
        let mut inner = group.inner.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.members.insert(id, member);
        // Not running, or ended with the runtime it ran on: start it here.
        if inner.task.as_ref().is_none_or(JoinHandle::is_finished) {
            inner.task = Some(tokio::spawn(run(group.clone())));
        }
        id
    };
    group.wake.notify_one();
    Membership { group, id }
}

/// What became of one member's beat.
#[derive(Debug)]
enum Beat {
    Renewed,
    /// The registry does not know the instance: register it again.
    Unknown,
    Failed(String),
}

async fn run(group: Arc<Group>) {
    loop {
        let next = {
            let mut inner = group.inner.lock();
            match inner.members.values().map(|m| m.due).min() {
                Some(d) => d,
                None => {
                    inner.task = None;
                    return;
                }
            }
        };
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = group.wake.notified() => continue,
        }
        let now = Instant::now();
        // Every member due within half its period goes now: early is harmless, and it
        // brings members that started at different times into one request.
        let due: Vec<(u64, Arc<Shared>)> = {
            let inner = group.inner.lock();
            inner
                .members
                .iter()
                .filter(|(_, m)| m.due <= now + m.interval / 2)
                .map(|(id, m)| (*id, m.provider.clone()))
                .collect()
        };
        if due.is_empty() {
            continue;
        }
        // What each member was when its beat went out: an "unknown" about an instance that
        // was registered again meanwhile is stale.
        let sent: Vec<Sent> = due.iter().map(|(_, p)| Sent::of(p)).collect();
        let beats = beat(&group, &due).await;
        let mut unknown = Vec::new();
        for (((id, provider), beat), sent) in due.into_iter().zip(beats).zip(sent) {
            if let Beat::Unknown = beat {
                // Not sent again while it is being registered again.
                group.reschedule(id, None);
                unknown.push((id, provider, sent));
            } else {
                let ok = settle(&provider, beat).await;
                group.reschedule(id, Some(ok));
            }
        }
        if !unknown.is_empty() {
            // Registering again is a durable write, slower than a heartbeat: it runs on its
            // own, so that the other instances' beats never wait for it.
            let g = group.clone();
            tokio::spawn(async move {
                let oks = settle_unknown(&unknown).await;
                for ((id, _, _), ok) in unknown.iter().zip(oks) {
                    g.reschedule(*id, Some(ok));
                }
            });
        }
    }
}

impl Group {
    /// Schedules member `id`'s next beat after one that went well (`Some(true)`: a period
    /// from now, jittered), failed (`Some(false)`: its backoff) or is still being settled
    /// (`None`: a period from now, so that it is not sent again meanwhile).
    fn reschedule(&self, id: u64, ok: Option<bool>) {
        let mut inner = self.inner.lock();
        // Gone meanwhile (shutdown or drop): nothing to schedule.
        let Some(m) = inner.members.get_mut(&id) else { return };
        let mut rng = rand::thread_rng();
        let delay = match ok {
            Some(true) => {
                m.backoff.reset();
                jittered(m.interval, m.jitter_pct, &mut rng)
            }
            Some(false) => m.backoff.next_delay(&mut rng),
            None => m.interval,
        };
        m.due = Instant::now() + delay;
        drop(inner);
        self.wake.notify_one();
    }
}

/// Sends the heartbeats of `due` in chunks of at most [`HEARTBEAT_BATCH_MAX`]; one
/// outcome per member, in order.
async fn beat(group: &Group, due: &[(u64, Arc<Shared>)]) -> Vec<Beat> {
    let items: Vec<HeartbeatItem> = due
        .iter()
        .map(|(_, p)| {
            let (ns, service, instance_id) = p.ids();
            HeartbeatItem { namespace: Some(ns), service, instance_id }
        })
        .collect();
    let mut out = Vec::with_capacity(items.len());
    for chunk in items.chunks(HEARTBEAT_BATCH_MAX) {
        let batch = HeartbeatBatch { instances: chunk.to_vec() };
        match group.client.heartbeat_batch(&batch).await {
            Ok(answer) => {
                let mut beats: Vec<Beat> = (0..chunk.len()).map(|_| Beat::Renewed).collect();
                for &i in answer.unknown.iter().filter(|&&i| i < chunk.len()) {
                    beats[i] = Beat::Unknown;
                }
                for &i in answer.conflict.iter().filter(|&&i| i < chunk.len()) {
                    beats[i] = Beat::Failed(
                        ClientError::Api {
                            status: 409,
                            code: "not_owner".into(),
                            message: "another DC owns this instance".into(),
                        }
                        .to_string(),
                    );
                }
                out.extend(beats);
            }
            Err(e) => {
                tracing::warn!(error = %e, instances = chunk.len(), "heartbeat batch failed");
                out.extend(chunk.iter().map(|_| Beat::Failed(e.to_string())));
            }
        }
    }
    out
}

/// Applies one beat's outcome (renewed or failed) to the provider's state; whether it
/// counts as a good beat.
async fn settle(provider: &Shared, beat: Beat) -> bool {
    let ok = match beat {
        Beat::Renewed => true,
        Beat::Unknown => return settle_unknown(&[(0, provider, Sent::of(provider))]).await[0],
        Beat::Failed(e) => {
            let id = provider.state.borrow().instance_id.clone();
            tracing::warn!(instance = %id, error = %e, "heartbeat failed");
            provider.state.send_modify(|s| s.last_error = Some(e));
            false
        }
    };
    count(provider, ok);
    ok
}

/// A member as its beat found it: its instance id, and how often it had registered again.
struct Sent {
    instance_id: String,
    reregistrations: u64,
}

impl Sent {
    fn of(p: &Shared) -> Sent {
        let st = p.state.borrow();
        Sent { instance_id: st.instance_id.clone(), reregistrations: st.reregistrations }
    }
}

/// The members a round found unknown (in the group's order) register again together;
/// whether each counts as a good beat.
///
/// Each one's `write` is held meanwhile, taken in the group's order (every caller takes
/// them so, and no other holder waits for a second one). Only a member that is as its beat
/// found it registers again: not one stopped since, nor one registered again since (a
/// status change's, or the one an earlier round started, still in flight when this beat
/// went out: registering it once more would be a durable write for nothing).
async fn settle_unknown<P: std::ops::Deref<Target = Shared>>(members: &[(u64, P, Sent)]) -> Vec<bool> {
    for (_, _, sent) in members {
        tracing::warn!(instance = %sent.instance_id, "registry does not know this instance; registering again");
    }
    let mut held = Vec::with_capacity(members.len());
    for (_, p, _) in members {
        held.push(p.write.lock().await);
    }
    let due: Vec<usize> = (0..members.len())
        .filter(|&i| {
            let (_, p, sent) = &members[i];
            let st = p.state.borrow();
            st.instance_id == sent.instance_id
                && st.reregistrations == sent.reregistrations
                && !p.stopped.load(Ordering::Relaxed)
        })
        .collect();
    let shared: Vec<&Shared> = due.iter().map(|&i| &*members[i].1).collect();
    let mut oks = vec![true; members.len()];
    for (&i, res) in due.iter().zip(reregister_together(&shared).await) {
        if let Err(e) = res {
            members[i].1.state.send_modify(|s| s.last_error = Some(e.to_string()));
            oks[i] = false;
        }
    }
    drop(held);
    for ((_, p, _), &ok) in members.iter().zip(&oks) {
        count(p, ok);
    }
    oks
}

/// Counts one beat of `provider`, good or failed.
fn count(provider: &Shared, ok: bool) {
    provider.state.send_modify(|s| {
        if ok {
            s.heartbeats_ok += 1;
            s.consecutive_failures = 0;
        } else {
            s.heartbeats_failed += 1;
            s.consecutive_failures = s.consecutive_failures.saturating_add(1);
        }
    });
}
