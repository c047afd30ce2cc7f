//! The human log format's fields, with every control character escaped: values a peer or a
//! client supplies (a close reason, a path, a DC name) reach the logs, and a newline or an
//! escape sequence in one must not forge a log line or drive the terminal. (The JSON format
//! escapes them already.)

use std::fmt::Write as _;

use tracing_subscriber::field::MakeExt as _;
use tracing_subscriber::fmt::format::{self, Writer};
use tracing_subscriber::fmt::FormatFields;

/// `s` with each control character (newlines, carriage returns, ESC...) written as its
/// escape (`\n`, `\u{1b}`).
pub fn escape_controls(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            let _ = write!(out, "{}", c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The field formatter of the human format: `name=value` separated by spaces, the message
/// first as is, every value escaped.
pub fn escaped() -> impl for<'w> FormatFields<'w> + Send + Sync + 'static {
    format::debug_fn(|w: &mut Writer<'_>, field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
        let text = escape_controls(&format!("{value:?}"));
        if field.name() == "message" {
            write!(w, "{text}")
        } else {
            write!(w, "{}={text}", field.name())
        }
    })
    .delimited(" ")
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_peer_supplied_newline_or_escape_cannot_forge_a_log_line() {
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .fmt_fields(escaped())
            .with_writer(move || buf.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let reason = "refused\n2026-12-01T00:00:00Z  INFO tandem: forged \u{1b}[31mred";
            tracing::warn!(peer = %"dc-b\r\n", %reason, "peer closed: {}", "x\ny");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "one event, one line: {text:?}");
        assert!(
            text.contains(r"refused\n2026") && text.contains(r"\u{1b}[31m") && text.contains(r"x\ny"),
            "{text}"
        );
        assert!(text.contains(r"peer=dc-b\r\n"), "{text}");
        assert_eq!(escape_controls("plain é"), "plain é");
    }
}
