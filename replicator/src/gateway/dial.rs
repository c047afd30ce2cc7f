//! Dialing a peer's gateway: every address at once, a fresh attempt while none completed
//! its handshake, and how to read the way a peer closed a connection.

use std::net::SocketAddr;
use std::time::Duration;

use super::CLOSE_REPLACED;

/// While no handshake of a dial has completed, a fresh attempt to every address this often
/// ([`DIAL_ATTEMPTS_MAX`] in all). A lost first handshake packet (sent to a gateway not
/// listening yet: a peer starting, a new leader of a peer group taking over) otherwise
/// waits for QUIC's own retransmissions, 1 s and then 3 s after the first: long enough to
/// miss a window between faults (`long-partition --nodes 3` saw a DC never connect in
/// the 3 s before its partition).
pub const REDIAL_MS: u64 = 500;

/// Attempts per address in one dial (one every [`REDIAL_MS`]).
pub const DIAL_ATTEMPTS_MAX: usize = 4;

/// Dials every address at once and keeps the first connection whose handshake completes
/// (the other attempts are dropped); while none has, dials them all again every
/// [`REDIAL_MS`], up to [`DIAL_ATTEMPTS_MAX`] times. A DC group's followers run no
/// gateway: only its leader's address answers.
pub(super) async fn dial(
    endpoint: &quinn::Endpoint,
    client_cfg: &quinn::ClientConfig,
    addrs: &[SocketAddr],
    server_name: &str,
) -> Result<(quinn::Connection, SocketAddr), String> {
    type Attempts = tokio::task::JoinSet<Result<(quinn::Connection, SocketAddr), String>>;
    let mut attempts = Attempts::new();
    let mut last_error = "no address configured".to_owned();
    let start = |attempts: &mut Attempts, last_error: &mut String| {
        for &addr in addrs {
            match endpoint.connect_with(client_cfg.clone(), addr, server_name) {
                Ok(connecting) => {
                    attempts.spawn(async move {
                        connecting.await.map(|c| (c, addr)).map_err(|e| format!("connect {addr}: {e}"))
                    });
                }
                Err(e) => *last_error = format!("connect {addr}: {e}"),
            }
        }
    };
    start(&mut attempts, &mut last_error);
    let mut started = 1;
    let every = Duration::from_millis(REDIAL_MS);
    let mut redial = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            done = attempts.join_next() => match done {
                None => return Err(last_error),
                Some(Ok(Ok(won))) => return Ok(won),
                Some(Ok(Err(e))) => last_error = e,
                Some(Err(e)) => last_error = format!("connect: {e}"),
            },
            _ = redial.tick(), if started < DIAL_ATTEMPTS_MAX => {
                start(&mut attempts, &mut last_error);
                started += 1;
            }
        }
    }
}

/// Whether the peer closed the connection for a reason of this protocol that has nothing
/// to do with the schema version: a newer connection of this DC replaced it (the
/// receiver keeps one per DC; a dial's spare attempt may complete after the one it used).
/// A peer that cannot read our Hello closes without a word, which makes the next session
/// write the older version.
pub(super) fn closed_with_a_word(reason: Option<&quinn::ConnectionError>) -> bool {
    matches!(
        reason,
        Some(quinn::ConnectionError::ApplicationClosed(c)) if c.error_code == quinn::VarInt::from(CLOSE_REPLACED)
    )
}
