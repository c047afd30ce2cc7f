//! The client SDK: a [`Provider`] that keeps one instance registered (or many, registered
//! together with [`Provider::register_all`]), and a [`Consumer`]
//! that keeps one service's instance list fresh, survives registry restarts and outages,
//! and picks instances with outlier ejection.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tandem_client::sdk::SdkError> {
//! use tandem_client::sdk::{ClientConfig, Consumer, InstanceSpec, Provider};
//! let cfg = ClientConfig::new(["http://127.0.0.1:8500"]);
//! let provider = Provider::register(cfg.clone(), InstanceSpec::new("orders", "10.0.0.7", 8080)).await?;
//! let orders = Consumer::watch(cfg, "default", "orders").await?;
//! if let Some(i) = orders.pick() {
//!     println!("call {}:{}", i.address, i.port);
//! }
//! provider.shutdown().await?; // draining, wait for propagation, deregister
//! # Ok(()) }
//! ```
//!
//! Code map:
//! - [`model`]: the SDK's typed view of discovery answers, parsed at the boundary.
//! - [`cache`]: the pure cache with push-empty protection (no I/O, no clock).
//! - [`balance`]: pure selection and outlier ejection (no I/O, no clock).
//! - [`snapshot`]: the on-disk snapshot of a cache (the only module here that touches files).
//! - [`provider`], [`consumer`]: thin async drivers around the above; `beats` renews every
//!   instance of the process in one batched request per period.
//!
//! What this module must never do: panic on a server's answer (a bad answer is an error and
//! the cache stays); replace a non-empty cache by an unconfirmed empty answer; retry or
//! read without a bound; send a request to another DC's registry (only the configured
//! addresses, which are the local DC's nodes).

pub mod balance;
mod beats;
pub mod cache;
pub mod consumer;
pub mod model;
pub mod provider;
pub mod snapshot;

use std::path::PathBuf;
use std::time::Duration;

use rand::Rng;

use crate::client::ClientError;

pub use balance::{Balancer, EjectionConfig, Reported, Strategy};
pub use cache::{Cache, EmptyRule, Outcome, PendingEmpty};
pub use consumer::{Consumer, ConsumerStatus};
pub use model::{FailoverInfo, Health, Instance, ServiceView, Status, ViewSource};
pub use provider::{InstanceSpec, Provider, ProviderState};

/// Longest blocking query the server accepts (see `http::WAIT_MAX`).
pub const WATCH_WAIT_MAX: Duration = Duration::from_secs(300);

/// Errors of the SDK.
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    /// The configuration is unusable; nothing was started.
    #[error("invalid SDK configuration: {0}")]
    Config(String),
    /// The registry refused or could not be reached. `ClientError::Unreachable` is
    /// retryable; `ClientError::Api` with a 4xx is not (the request itself is wrong).
    #[error(transparent)]
    Registry(#[from] ClientError),
}

impl SdkError {
    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            SdkError::Config(_) | SdkError::Registry(ClientError::Config(_)) => false,
            SdkError::Registry(ClientError::Unreachable(_) | ClientError::Decode(_)) => true,
            SdkError::Registry(ClientError::Api { status, .. }) => *status >= 500,
        }
    }
}

/// Everything the SDK needs to talk to one DC's registry nodes.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Base URLs of the local DC's registry nodes, such as `http://127.0.0.1:8500`. A request
    /// moves to the next one on a connection error or a 5xx, never on a 4xx.
    pub addrs: Vec<String>,
    pub connect_timeout: Duration,
    /// Bound of one non-blocking request.
    pub request_timeout: Duration,
    /// The ACL token sent with every request (`Authorization: Bearer`), when the registry
    /// has ACLs on. Never logged.
    pub token: Option<crate::client::Token>,
    /// HTTPS settings for `https://` addresses (the registry's CA, optionally a client
    /// certificate).
    pub tls: Option<crate::ClientTls>,
    pub retry: RetryConfig,
    pub provider: ProviderConfig,
    pub consumer: ConsumerConfig,
}

/// Backoff after a failed request: doubles from `initial` up to `max`, with jitter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryConfig {
    pub initial: Duration,
    pub max: Duration,
}

/// The provider's heartbeat and shutdown timing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderConfig {
    /// Heartbeat period; `None`: an eighth of the lease the registry granted. The registry
    /// marks an instance suspect after a quarter of its lease without a heartbeat (7.5 s of
    /// 30 s), so a beat every eighth stays clear of that even with jitter; a longer
    /// period makes the instance go suspect and back between beats, each a durable health
    /// event.
    pub heartbeat_interval: Option<Duration>,
    /// Each period is moved by up to this percentage either way, so that instances started
    /// together do not beat together.
    pub heartbeat_jitter_pct: u32,
    /// Attempts of the first registration before `Provider::register` gives up (only
    /// retryable errors are retried).
    pub register_attempts_max: u32,
    pub drain: DrainConfig,
}

/// Graceful shutdown: status draining, wait for propagation, deregister.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainConfig {
    /// Wait at most this long for a discovery read of the registry to show the instance as
    /// draining (zero: do not wait for it).
    pub confirm_within: Duration,
    /// Then wait this long more, so consumers' caches pick the change up before the
    /// instance goes away.
    pub linger: Duration,
}

/// The consumer's cache, snapshot and selection settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ConsumerConfig {
    /// How long one blocking query waits for a change (at most 300 s).
    pub watch_wait: Duration,
    /// A plain (non-blocking) full read reconciles the cache at least this often.
    pub full_pull_interval: Duration,
    /// Least time between two requests of one consumer, so that a misbehaving server
    /// answering blocking queries at once cannot make the consumer spin.
    pub request_interval_min: Duration,
    /// Where the disk snapshot of each watched service lives; `None`: no snapshot.
    pub snapshot_dir: Option<PathBuf>,
    /// Larger snapshot files are ignored (never read into memory).
    pub snapshot_bytes_max: u64,
    /// Answers (and snapshots) listing more instances are refused.
    pub instances_max: usize,
    pub empty_rule: EmptyRule,
    pub strategy: Strategy,
    pub ejection: EjectionConfig,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig { initial: Duration::from_millis(100), max: Duration::from_secs(5) }
    }
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            heartbeat_interval: None,
            heartbeat_jitter_pct: 10,
            register_attempts_max: 3,
            drain: DrainConfig::default(),
        }
    }
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig { confirm_within: Duration::from_secs(5), linger: Duration::from_secs(2) }
    }
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            watch_wait: Duration::from_secs(30),
            full_pull_interval: Duration::from_secs(60),
            request_interval_min: Duration::from_millis(50),
            snapshot_dir: None,
            snapshot_bytes_max: 8 * 1024 * 1024,
            instances_max: 10_000,
            empty_rule: EmptyRule::default(),
            strategy: Strategy::WeightedRandom,
            ejection: EjectionConfig::default(),
        }
    }
}

impl ClientConfig {
    /// Defaults for the given registry addresses.
    pub fn new<I, S>(addrs: I) -> ClientConfig
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientConfig {
            addrs: addrs.into_iter().map(Into::into).collect(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            token: None,
            tls: None,
            retry: RetryConfig::default(),
            provider: ProviderConfig::default(),
            consumer: ConsumerConfig::default(),
        }
    }

    /// Checks every bound; the SDK refuses to start on an invalid configuration.
    pub fn validate(&self) -> Result<(), SdkError> {
        let bad = |m: &str| Err(SdkError::Config(m.to_owned()));
        if self.addrs.is_empty() {
            return bad("addrs: at least one registry address");
        }
        if let Some(a) = self.addrs.iter().find(|a| !(a.starts_with("http://") || a.starts_with("https://")))
        {
            return Err(SdkError::Config(format!("addrs: {a:?} is not an http:// URL")));
        }
        if self.tls.is_some() {
            if let Some(a) = self.addrs.iter().find(|a| !a.starts_with("https://")) {
                return Err(SdkError::Config(format!("addrs: {a:?} is not an https:// URL (tls is set)")));
            }
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return bad("connect_timeout and request_timeout must be positive");
        }
        if self.retry.initial.is_zero() || self.retry.max < self.retry.initial {
            return bad("retry: need 0 < initial <= max");
        }
        let p = &self.provider;
        if p.heartbeat_interval.is_some_and(|d| d < Duration::from_millis(10)) {
            return bad("provider.heartbeat_interval must be at least 10 ms");
        }
        if p.heartbeat_jitter_pct > 50 {
            return bad("provider.heartbeat_jitter_pct must be 0..=50");
        }
        if p.register_attempts_max == 0 {
            return bad("provider.register_attempts_max must be at least 1");
        }
        let c = &self.consumer;
        if c.watch_wait < Duration::from_millis(10) || c.watch_wait > WATCH_WAIT_MAX {
            return bad("consumer.watch_wait must be 10 ms to 300 s");
        }
        if c.full_pull_interval < Duration::from_millis(100) {
            return bad("consumer.full_pull_interval must be at least 100 ms");
        }
        if c.request_interval_min > Duration::from_secs(10) {
            return bad("consumer.request_interval_min must be at most 10 s");
        }
        if c.instances_max == 0 || c.snapshot_bytes_max == 0 {
            return bad("consumer.instances_max and snapshot_bytes_max must be positive");
        }
        if c.empty_rule.confirmations == 0 {
            return bad("consumer.empty_rule.confirmations must be at least 1");
        }
        c.ejection.validate().map_err(SdkError::Config)
    }

    pub(crate) fn client(&self) -> crate::client::Client {
        let c = crate::client::Client::with_tls(
            &self.addrs,
            crate::client::ClientOptions {
                connect_timeout: self.connect_timeout,
                request_timeout: self.request_timeout,
            },
            self.tls.as_ref(),
        );
        match &self.token {
            Some(t) => c.with_token(t.secret()),
            None => c,
        }
    }
}

/// Exponential backoff with "equal jitter": each delay is half the current step plus a
/// random part of the other half, and the step doubles up to the cap.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    pub fn new(cfg: RetryConfig) -> Backoff {
        Backoff { initial: cfg.initial, max: cfg.max.max(cfg.initial), step: cfg.initial }
    }

    /// The next delay: within `[step/2, step]`, never above the cap.
    pub fn next_delay<R: Rng + ?Sized>(&mut self, rng: &mut R) -> Duration {
        let step = self.step;
        self.step = (step * 2).min(self.max);
        let half = step / 2;
        let extra_ms = rng.gen_range(0..=half.as_millis().min(u128::from(u64::MAX)) as u64);
        half + Duration::from_millis(extra_ms)
    }

    /// After a success: start again from the initial step.
    pub fn reset(&mut self) {
        self.step = self.initial;
    }
}

/// `d` moved by up to `pct` percent either way.
pub fn jittered<R: Rng + ?Sized>(d: Duration, pct: u32, rng: &mut R) -> Duration {
    if pct == 0 {
        return d;
    }
    let span = d.as_millis().min(u128::from(u64::MAX / 200)) as u64 * u64::from(pct.min(100)) / 100;
    let off = rng.gen_range(0..=2 * span);
    Duration::from_millis((d.as_millis() as u64).saturating_sub(span).saturating_add(off))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn backoff_doubles_to_the_cap_and_stays_within_bounds() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let cfg = RetryConfig { initial: Duration::from_millis(100), max: Duration::from_millis(1_000) };
        let mut b = Backoff::new(cfg);
        let mut steps = vec![];
        for _ in 0..10 {
            let d = b.next_delay(&mut rng);
            assert!(d <= Duration::from_millis(1_000), "{d:?}");
            steps.push(d);
        }
        assert!(steps[0] >= Duration::from_millis(50) && steps[0] <= Duration::from_millis(100));
        assert!(steps[9] >= Duration::from_millis(500), "capped step is 1 s, delay at least half: {steps:?}");
        b.reset();
        assert!(b.next_delay(&mut rng) <= Duration::from_millis(100));
    }

    #[test]
    fn jitter_stays_within_the_percentage() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for _ in 0..1_000 {
            let d = jittered(Duration::from_millis(1_000), 10, &mut rng);
            assert!(d >= Duration::from_millis(900) && d <= Duration::from_millis(1_100), "{d:?}");
        }
        assert_eq!(jittered(Duration::from_millis(5), 0, &mut rng), Duration::from_millis(5));
    }

    #[test]
    fn config_validation_names_the_field() {
        assert!(ClientConfig::new(["http://127.0.0.1:8500"]).validate().is_ok());
        let e = ClientConfig::new(Vec::<String>::new()).validate().unwrap_err();
        assert!(e.to_string().contains("addrs"), "{e}");
        let e = ClientConfig::new(["127.0.0.1:8500"]).validate().unwrap_err();
        assert!(e.to_string().contains("http://"), "{e}");
        let mut c = ClientConfig::new(["http://x"]);
        c.consumer.watch_wait = Duration::from_secs(600);
        assert!(c.validate().unwrap_err().to_string().contains("watch_wait"));
    }
}
