//! Loopback ports for servers that tests and drills start: chosen below the OS's
//! ephemeral range, so that no `:0` bind in the meantime can take one.

/// Where [`free_port`] picks when the OS does not say where its ephemeral range starts.
const EPHEMERAL_FROM_DEFAULT: u16 = 32_768;
/// The lowest port [`free_port`] hands out.
const PORTS_FROM: u16 = 10_000;

/// A loopback port free now (UDP or TCP), below the OS's ephemeral range and not handed
/// out before by this process. Below the ephemeral range: a port is chosen here, closed,
/// and bound by the node it is written for only later, and meanwhile every `:0` bind (a
/// QUIC client endpoint of another node, a relay's upstream socket) draws from the
/// ephemeral range, so none can take it. Not handed out before: two members of a group
/// on one port number are refused.
pub fn free_port(udp: bool) -> anyhow::Result<u16> {
    static GIVEN: parking_lot::Mutex<Option<std::collections::HashSet<u16>>> = parking_lot::Mutex::new(None);
    let below = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .filter(|low| *low > PORTS_FROM + 1_000)
        .unwrap_or(EPHEMERAL_FROM_DEFAULT);
    for _ in 0..10_000 {
        let port = rand::Rng::gen_range(&mut rand::thread_rng(), PORTS_FROM..below);
        if GIVEN.lock().get_or_insert_with(Default::default).contains(&port) {
            continue;
        }
        let at = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let free =
            if udp { std::net::UdpSocket::bind(at).is_ok() } else { std::net::TcpListener::bind(at).is_ok() };
        if free && GIVEN.lock().get_or_insert_with(Default::default).insert(port) {
            return Ok(port);
        }
    }
    anyhow::bail!(
        "no free loopback port between {PORTS_FROM} and {below} this process has not handed out yet"
    )
}
