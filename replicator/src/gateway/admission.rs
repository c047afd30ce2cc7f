//! Who may start a handshake with the replication listener, decided for each incoming
//! connection before any TLS work ([`Admission`]):
//!
//! 1. **Source address** ([`SourceRule`]): by default only the IP addresses of the
//!    configured peers; packets from anywhere else are dropped without an answer (no
//!    handshake, no amplification, nothing for a scanner to see). Deployments where a
//!    peer's packets arrive from another address (NAT, a relay, the chaos drills' relay
//!    outside loopback) name the source networks (`"10.20.0.0/16"`) or opt out (`"any"`).
//! 2. **Address validation**: a source that has not proven it receives at its address gets
//!    a QUIC Retry (a stateless token round trip) before the node keeps any state for it,
//!    so a spoofed source costs the node one small packet.
//! 3. **Concurrent handshakes** are capped ([`Admission::handshakes_max`]); beyond it an
//!    incoming connection is refused at once (QUIC `CONNECTION_REFUSED`), and a dialer
//!    retries with its backoff.
//!
//! Each refusal is counted ([`GatewayStats`](super::GatewayStats)) and logged sampled.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use ipnet::IpNet;
use serde::Deserialize;

/// Handshakes the listener runs at once, by default. A replication listener serves a
/// handful of peer DCs (and, with a cluster, a few nodes each), which reconnect rarely.
pub const HANDSHAKES_MAX_DEFAULT: usize = 16;

/// One entry of `[replication] accept_from`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum SourceRule {
    /// The IP addresses of the configured peers (`"peers"`).
    Peers,
    /// Any source (`"any"`): the opt-out, for NAT and relays that hide the peer's address.
    Any,
    /// A network or a single address (`"10.20.0.0/16"`, `"192.0.2.7"`, `"::1"`).
    Net(IpNet),
}

impl SourceRule {
    /// The default: only the configured peers' addresses.
    pub fn defaults() -> Vec<SourceRule> {
        vec![SourceRule::Peers]
    }
}

impl FromStr for SourceRule {
    type Err = String;
    fn from_str(s: &str) -> Result<SourceRule, String> {
        match s {
            "peers" => Ok(SourceRule::Peers),
            "any" => Ok(SourceRule::Any),
            _ => s
                .parse::<IpNet>()
                .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                .map(SourceRule::Net)
                .map_err(|_| {
                    format!("{s:?} is not \"peers\", \"any\", an IP address or a network like \"10.0.0.0/8\"")
                }),
        }
    }
}

impl TryFrom<String> for SourceRule {
    type Error = String;
    fn try_from(s: String) -> Result<SourceRule, String> {
        s.parse()
    }
}

impl fmt::Display for SourceRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceRule::Peers => f.write_str("peers"),
            SourceRule::Any => f.write_str("any"),
            SourceRule::Net(n) => write!(f, "{n}"),
        }
    }
}

/// A listener's admission rules, resolved against the peers' addresses: the gateway's
/// change with a reload ([`PeerBook`]), the member link's with the group's membership
/// ([`Admission::with_peers`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    rules: Vec<SourceRule>,
    any: bool,
    nets: Vec<IpNet>,
    /// Handshakes run at once; more are refused.
    pub handshakes_max: usize,
}

impl Admission {
    /// The rules `rules` resolved against the peers' addresses `peers`.
    pub fn new(
        rules: &[SourceRule],
        peers: impl IntoIterator<Item = SocketAddr>,
        handshakes_max: usize,
    ) -> Self {
        let mut nets = Vec::new();
        let mut any = false;
        let peers: Vec<IpNet> = peers.into_iter().map(|a| IpNet::from(a.ip().to_canonical())).collect();
        for r in rules {
            match r {
                SourceRule::Any => any = true,
                SourceRule::Peers => nets.extend(peers.iter().copied()),
                SourceRule::Net(n) => nets.push(*n),
            }
        }
        nets.sort();
        nets.dedup();
        Admission { rules: rules.to_vec(), any, nets, handshakes_max: handshakes_max.max(1) }
    }

    /// The same rules resolved against other peers' addresses (`"peers"` follows them).
    pub fn with_peers(&self, peers: impl IntoIterator<Item = SocketAddr>) -> Self {
        Admission::new(&self.rules, peers, self.handshakes_max)
    }

    /// Admits every source (tests, and the opt-out).
    pub fn open(handshakes_max: usize) -> Self {
        Admission::new(&[SourceRule::Any], [], handshakes_max)
    }

    /// May a connection from `ip` start a handshake? (An IPv4 address seen as IPv4-mapped
    /// IPv6 on a dual-stack socket counts as the IPv4 address.)
    pub fn admits(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.any || self.nets.iter().any(|n| n.contains(&ip))
    }
}

/// What the admission decided for one incoming connection, before any TLS work. Returned
/// once per incoming connection and matched at once: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Screened {
    /// Its source is not admitted: dropped without an answer.
    Dropped,
    /// Its source has not proven its address: a QUIC Retry was sent (no state kept).
    Retried,
    /// `handshakes_max` handshakes are running: refused at once.
    Busy,
    /// Go on with the handshake.
    Admitted(quinn::Incoming),
}

impl Admission {
    /// Screens `incoming` with `running` handshakes in flight: its source, address
    /// validation, the handshake cap. The listeners of both links (the replication
    /// gateway's and the member link's) count and log what it decides.
    pub fn screen(&self, incoming: quinn::Incoming, running: u64) -> Screened {
        if !self.admits(incoming.remote_address().ip()) {
            incoming.ignore();
            return Screened::Dropped;
        }
        if !incoming.remote_address_validated() && incoming.may_retry() {
            // Fails only if a retry was already sent for this connection attempt.
            let _ = incoming.retry();
            return Screened::Retried;
        }
        if running >= self.handshakes_max as u64 {
            incoming.refuse();
            return Screened::Busy;
        }
        Screened::Admitted(incoming)
    }
}

/// A gateway's peer DCs, their addresses and the listener's admission, shared by every
/// gateway a node starts (a DC group's leader starts one at each take-over) and changed in
/// place by a reload ([`PeerBook::replace`]): a dialer dials the addresses of the moment,
/// and the listener admits by them. Which DCs are peers is fixed.
#[derive(Debug)]
pub struct PeerBook {
    dcs: Vec<String>,
    now: parking_lot::RwLock<(Vec<super::PeerConfig>, Admission)>,
}

impl PeerBook {
    pub fn new(peers: Vec<super::PeerConfig>, admission: Admission) -> std::sync::Arc<PeerBook> {
        let dcs = peers.iter().map(|p| p.dc.clone()).collect();
        std::sync::Arc::new(PeerBook { dcs, now: parking_lot::RwLock::new((peers, admission)) })
    }

    /// The peer DCs.
    pub fn dcs(&self) -> &[String] {
        &self.dcs
    }

    /// Peer `dc` with its addresses of the moment (none for a DC that is not a peer).
    pub fn peer(&self, dc: &str) -> super::PeerConfig {
        let now = self.now.read();
        now.0
            .iter()
            .find(|p| p.dc == dc)
            .cloned()
            .unwrap_or(super::PeerConfig { dc: dc.into(), addrs: vec![] })
    }

    /// The admission of the moment.
    pub fn admission(&self) -> Admission {
        self.now.read().1.clone()
    }

    /// Replaces the peers' addresses and the admission. Refused (nothing changed) when
    /// `peers` names other DCs than the book's: which DCs are peers changes by a restart.
    pub fn replace(&self, peers: Vec<super::PeerConfig>, admission: Admission) -> Result<(), String> {
        let mut dcs: Vec<&str> = peers.iter().map(|p| p.dc.as_str()).collect();
        let mut mine: Vec<&str> = self.dcs.iter().map(String::as_str).collect();
        dcs.sort_unstable();
        mine.sort_unstable();
        if dcs != mine {
            return Err(format!("the peer DCs are {mine:?}; {dcs:?} differ (a restart changes them)"));
        }
        *self.now.write() = (peers, admission);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn rules_parse_and_name_what_is_wrong() {
        assert_eq!("peers".parse::<SourceRule>(), Ok(SourceRule::Peers));
        assert_eq!("any".parse::<SourceRule>(), Ok(SourceRule::Any));
        assert_eq!("10.0.0.0/8".parse::<SourceRule>().unwrap().to_string(), "10.0.0.0/8");
        assert_eq!("192.0.2.7".parse::<SourceRule>().unwrap().to_string(), "192.0.2.7/32");
        assert_eq!("::1".parse::<SourceRule>().unwrap().to_string(), "::1/128");
        let e = "everyone".parse::<SourceRule>().unwrap_err();
        assert!(e.contains("\"everyone\""), "{e}");
        assert!("10.0.0.0/33".parse::<SourceRule>().is_err());
    }

    #[test]
    fn by_default_only_the_peers_addresses_are_admitted() {
        let ad = Admission::new(&SourceRule::defaults(), [a("10.20.0.5:7500"), a("[2001:db8::5]:7500")], 16);
        assert!(ad.admits("10.20.0.5".parse().unwrap()));
        assert!(ad.admits("::ffff:10.20.0.5".parse().unwrap()), "IPv4-mapped is the IPv4 address");
        assert!(ad.admits("2001:db8::5".parse().unwrap()));
        assert!(!ad.admits("10.20.0.6".parse().unwrap()));
        assert!(!ad.admits("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn networks_widen_and_any_opens() {
        let rules = vec![SourceRule::Peers, "192.0.2.0/24".parse().unwrap()];
        let ad = Admission::new(&rules, [a("10.20.0.5:7500")], 16);
        assert!(ad.admits("192.0.2.200".parse().unwrap()));
        assert!(ad.admits("10.20.0.5".parse().unwrap()));
        assert!(!ad.admits("192.0.3.1".parse().unwrap()));
        let open = Admission::new(&[SourceRule::Any], [], 0);
        assert!(open.admits("203.0.113.9".parse().unwrap()));
        assert_eq!(open.handshakes_max, 1, "a cap of 0 would refuse every peer");
        // No peers and no networks: nothing is admitted (a node with no peers).
        assert!(!Admission::new(&SourceRule::defaults(), [], 16).admits("10.0.0.1".parse().unwrap()));
        // New peers (a member added to a group): "peers" follows them, networks stay.
        let moved = ad.with_peers([a("10.20.0.9:7500")]);
        assert!(moved.admits("10.20.0.9".parse().unwrap()) && moved.admits("192.0.2.200".parse().unwrap()));
        assert!(!moved.admits("10.20.0.5".parse().unwrap()), "a former peer's address is no longer admitted");
    }
}
