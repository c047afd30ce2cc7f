//! Request-rate limits per principal and per client address (`[limits]
//! requests_per_second_per_principal`, `requests_per_second_per_address`, and their
//! bursts), with governor's keyed GCRA limiters. A request over either gets 429
//! `rate_limited` with `Retry-After` (whole seconds until one more is allowed). Runs after
//! authentication (a request without a valid token is refused before it spends anything)
//! and before every other check. IPv6 clients are keyed by their /64, so one host cannot
//! dodge the limit by cycling addresses. The per-principal limit applies with ACLs on only
//! (with them off every request is the one principal `anonymous`).
//!
//! Bounded: each limiter forgets keys that are back at a full burst once it tracks more
//! than [`KEYS_MAX`], and starts afresh if that is not enough.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::Response;
use governor::clock::{Clock as _, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use parking_lot::Mutex;

use super::limits::{retry_after, ClientAddr, HttpState};
use crate::acl::Principal;
use crate::config::LimitsSection;
use crate::error::ApiError;
use crate::shared::NodeShared;

/// Most keys one limiter tracks before it forgets the idle ones.
pub const KEYS_MAX: usize = 100_000;

type Keyed<K> = RateLimiter<K, DefaultKeyedStateStore<K>, DefaultClock>;

/// The limiters in force and their counters.
#[derive(Default)]
pub struct Rates {
    limiters: Mutex<Option<Arc<Limiters>>>,
    /// Requests refused by the per-principal rate.
    pub refused_principal: AtomicU64,
    /// Requests refused by the per-address rate.
    pub refused_address: AtomicU64,
}

impl std::fmt::Debug for Rates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rates").finish_non_exhaustive()
    }
}

/// (rate, burst) per principal, then per address.
type Settings = [(u32, u32); 2];

struct Limiters {
    settings: Settings,
    principal: Option<Keyed<Arc<str>>>,
    address: Option<Keyed<IpAddr>>,
}

fn keyed<K: Clone + std::hash::Hash + Eq>((rate, burst): (u32, u32)) -> Option<Keyed<K>> {
    let rate = std::num::NonZeroU32::new(rate)?;
    let burst = std::num::NonZeroU32::new(burst).unwrap_or(rate);
    Some(RateLimiter::keyed(Quota::per_second(rate).allow_burst(burst)))
}

impl Rates {
    /// The limiters for `cfg` (built anew when a reload changed the settings).
    fn current(&self, cfg: &LimitsSection) -> Arc<Limiters> {
        let settings = [
            (cfg.requests_per_second_per_principal, cfg.requests_burst_per_principal),
            (cfg.requests_per_second_per_address, cfg.requests_burst_per_address),
        ];
        let mut l = self.limiters.lock();
        match l.as_ref() {
            Some(cur) if cur.settings == settings => cur.clone(),
            _ => {
                let fresh = Arc::new(Limiters {
                    settings,
                    principal: keyed(settings[0]),
                    address: keyed(settings[1]),
                });
                *l = Some(fresh.clone());
                fresh
            }
        }
    }

    /// Forgets every key (a limiter outgrew [`KEYS_MAX`] with only busy keys).
    fn reset(&self) {
        *self.limiters.lock() = None;
    }
}

/// The key of a client address: IPv4 as is, IPv6 by its /64.
pub fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

/// Takes one request from `key`'s allowance; on refusal, whole seconds until the next.
fn take<K: Clone + std::hash::Hash + Eq>(lim: &Keyed<K>, key: &K, rates: &Rates) -> Result<(), u64> {
    let out = lim.check_key(key).map_err(|not_until| {
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        wait.as_millis().div_ceil(1000).max(1) as u64
    });
    if lim.len() > KEYS_MAX {
        lim.retain_recent();
        if lim.len() > KEYS_MAX {
            rates.reset();
        }
    }
    out
}

/// The refusal (429) of a request over its address's, then its principal's rate, if it is.
pub fn refusal(node: &NodeShared, req: &Request) -> Option<Response> {
    let cfg = node.registry.config();
    let rates = &node.http.rates;
    let lim = rates.current(&cfg.limits);
    let refuse = |counter: &AtomicU64, what: &str, key: &str, rate: u32, secs: u64| {
        HttpState::bump(counter);
        node.http.log_rate(what);
        let e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "more than {rate} requests a second from this {what} ([limits] {key}); retry in {secs} s"
            ),
        );
        retry_after(e, secs)
    };
    if let (Some(l), Some(addr)) = (&lim.address, req.extensions().get::<ClientAddr>()) {
        if let Err(secs) = take(l, &address_key(addr.0), rates) {
            let rate = cfg.limits.requests_per_second_per_address;
            return Some(refuse(
                &rates.refused_address,
                "client address",
                "requests_per_second_per_address",
                rate,
                secs,
            ));
        }
    }
    if node.acl.current().enabled() {
        if let (Some(l), Some(p)) = (&lim.principal, req.extensions().get::<Principal>()) {
            if let Err(secs) = take(l, &p.name, rates) {
                let rate = cfg.limits.requests_per_second_per_principal;
                return Some(refuse(
                    &rates.refused_principal,
                    "principal",
                    "requests_per_second_per_principal",
                    rate,
                    secs,
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_clients_share_their_slash_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(address_key(a), address_key(b));
        assert_ne!(address_key(a), address_key(c));
        let v4: IpAddr = "10.0.0.7".parse().unwrap();
        assert_eq!(address_key(v4), v4);
        assert_eq!(address_key("::ffff:10.0.0.7".parse().unwrap()), v4);
    }

    #[test]
    fn a_burst_then_refusal_with_a_wait() {
        let rates = Rates::default();
        let lim = keyed::<IpAddr>((1, 3)).unwrap();
        let k: IpAddr = "10.0.0.7".parse().unwrap();
        for _ in 0..3 {
            assert!(take(&lim, &k, &rates).is_ok());
        }
        assert_eq!(take(&lim, &k, &rates), Err(1), "one a second: the next in at most 1 s");
        assert!(take(&lim, &"10.0.0.8".parse().unwrap(), &rates).is_ok(), "keys are independent");
        assert!(keyed::<IpAddr>((0, 5)).is_none(), "0 is no limit");
    }
}
