//! The QUIC transport settings of the replication link ([`TransportTuning`]): keep-alive
//! interval and idle timeout, checked for consistency and turned into a quinn config, with
//! the per-connection limits of a replication link (one bidirectional stream, no
//! unidirectional ones, no datagrams, receive windows of about two frames).

use std::time::Duration;

use crate::tls::TlsError;

/// Bidirectional streams a peer may have open on one connection: a replication link is one
/// stream (the dialer's).
pub const STREAMS_BIDI_MAX: u32 = 1;

/// Receive window of a stream and of a whole connection: about twice the largest frame
/// (`FRAME_BYTES_MAX`), so a sender keeps a frame in flight while the last is applied,
/// and a peer can make a node buffer at most this much per connection.
pub const RECEIVE_WINDOW_BYTES: u32 = 2 * tandem_schemas::FRAME_BYTES_MAX as u32;

/// How long an accepted connection may go without opening its stream before it is closed.
pub const STREAM_OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// QUIC transport settings for the replication link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportTuning {
    /// How often an idle connection sends a keep-alive (so NATs and the idle timer stay
    /// open, and a dead path is noticed).
    pub keep_alive_interval: Duration,
    /// How long without any packet from the peer before the connection is declared dead.
    /// Must exceed `keep_alive_interval`. quinn uses the smaller of both sides' values.
    pub idle_timeout: Duration,
}

impl Default for TransportTuning {
    fn default() -> Self {
        // A dead peer is noticed within 3 s (keep-alives every 500 ms keep a live one open).
        TransportTuning {
            keep_alive_interval: Duration::from_millis(500),
            idle_timeout: Duration::from_secs(3),
        }
    }
}

impl TransportTuning {
    /// The quinn transport config for these settings.
    pub fn transport_config(&self) -> Result<quinn::TransportConfig, TlsError> {
        if self.keep_alive_interval.is_zero() {
            return Err(TlsError::Tuning { reason: "keep_alive_interval must be greater than zero" });
        }
        if self.keep_alive_interval >= self.idle_timeout {
            return Err(TlsError::Tuning { reason: "keep_alive_interval must be shorter than idle_timeout" });
        }
        let idle_timeout = quinn::IdleTimeout::try_from(self.idle_timeout)
            .map_err(|_| TlsError::Tuning { reason: "idle_timeout is too large for QUIC" })?;
        let mut config = quinn::TransportConfig::default();
        config.keep_alive_interval(Some(self.keep_alive_interval)).max_idle_timeout(Some(idle_timeout));
        config
            .max_concurrent_bidi_streams(STREAMS_BIDI_MAX.into())
            .max_concurrent_uni_streams(0u32.into())
            .stream_receive_window(RECEIVE_WINDOW_BYTES.into())
            .receive_window(RECEIVE_WINDOW_BYTES.into())
            .send_window(u64::from(RECEIVE_WINDOW_BYTES))
            .datagram_receive_buffer_size(None);
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_tuning_rejects_keep_alive_not_below_idle_timeout() {
        assert!(TransportTuning::default().transport_config().is_ok());
        let equal = TransportTuning {
            keep_alive_interval: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
        };
        assert!(matches!(equal.transport_config(), Err(TlsError::Tuning { .. })));
        let zero = TransportTuning { keep_alive_interval: Duration::ZERO, ..TransportTuning::default() };
        assert!(matches!(zero.transport_config(), Err(TlsError::Tuning { .. })));
        let huge =
            TransportTuning { idle_timeout: Duration::from_secs(u64::MAX), ..TransportTuning::default() };
        assert!(matches!(huge.transport_config(), Err(TlsError::Tuning { .. })));
    }
}
