//! A minimal HTTP/1.1 keep-alive client for the open-loop steps: one request at a time per
//! connection, `content-length` bodies only (what tandem answers). It costs the load core a
//! small fraction of what reqwest does per request, so that an open-loop step at a given
//! rate measures the server rather than the load generator's HTTP stack.

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// One keep-alive connection to `addr`, opened on first use and again after an error.
pub struct RawConn {
    addr: String,
    /// Source address to bind (`scale` spreads its clients over 127.0.0.x).
    source: Option<std::net::IpAddr>,
    conn: Option<TcpStream>,
    buf: Vec<u8>,
    /// Where the last answer's body starts in `buf`.
    body_at: usize,
}

impl RawConn {
    pub fn new(addr: &str) -> RawConn {
        RawConn { addr: addr.to_owned(), source: None, conn: None, buf: Vec::with_capacity(4096), body_at: 0 }
    }

    /// A connection from `source` (port chosen by the kernel), with a read buffer of
    /// `capacity` bytes to start with.
    pub fn bound(addr: &str, source: std::net::IpAddr, capacity: usize) -> RawConn {
        RawConn {
            addr: addr.to_owned(),
            source: Some(source),
            conn: None,
            buf: Vec::with_capacity(capacity),
            body_at: 0,
        }
    }

    /// Forgets the last answer and gives back what the read buffer grew beyond `capacity`
    /// (a client that registered many instances keeps a small buffer for its renewals).
    pub fn shrink(&mut self, capacity: usize) {
        self.buf.clear();
        self.body_at = 0;
        self.buf.shrink_to(capacity);
    }

    /// The body of the last answer read.
    pub fn answer(&self) -> &[u8] {
        self.buf.get(self.body_at..).unwrap_or_default()
    }

    /// Sends a POST of `body` (JSON) to `path` and reads the whole answer. `Err` unless the
    /// status is 2xx.
    pub async fn post_json(&mut self, path: &str, body: &[u8]) -> Result<(), String> {
        let result = self.exchange(path, body).await;
        if result.is_err() {
            self.conn = None;
        }
        result
    }

    /// Opens the connection now if it is not open (a step that measures latency opens its
    /// connections before its schedule starts, so that no request waits for a handshake).
    pub async fn connect(&mut self) -> Result<(), String> {
        if self.conn.is_none() {
            let c = match self.source {
                None => TcpStream::connect(&self.addr).await.map_err(|e| e.to_string())?,
                Some(src) => {
                    let to: std::net::SocketAddr = self.addr.parse().map_err(|_| "bad address")?;
                    let sock = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
                    sock.bind(std::net::SocketAddr::new(src, 0)).map_err(|e| format!("bind {src}: {e}"))?;
                    sock.connect(to).await.map_err(|e| e.to_string())?
                }
            };
            let _ = c.set_nodelay(true);
            self.conn = Some(c);
        }
        Ok(())
    }

    async fn exchange(&mut self, path: &str, body: &[u8]) -> Result<(), String> {
        self.connect().await?;
        let conn = self.conn.as_mut().ok_or("no connection")?;
        let mut req = Vec::with_capacity(160 + body.len());
        req.extend_from_slice(
            format!(
                "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                self.addr,
                body.len()
            )
            .as_bytes(),
        );
        req.extend_from_slice(body);
        conn.write_all(&req).await.map_err(|e| e.to_string())?;
        self.buf.clear();
        // Headers, then content-length bytes of body.
        let (head_end, status, length) = loop {
            let mut chunk = [0u8; 2048];
            let n = conn.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
            if let Some(p) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buf[..p]).map_err(|_| "head not UTF-8")?;
                let status: u16 = head.get(9..12).and_then(|s| s.parse().ok()).ok_or("no status")?;
                let length = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length").then(|| v.trim().parse::<usize>().ok())?
                    })
                    .ok_or("no content-length")?;
                break (p + 4, status, length);
            }
            if self.buf.len() > 64 * 1024 {
                return Err("header too long".into());
            }
        };
        while self.buf.len() < head_end + length {
            let mut chunk = [0u8; 4096];
            let n = conn.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed mid-body".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        self.body_at = head_end;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(format!("status {status}: {}", String::from_utf8_lossy(&self.buf[head_end..])))
        }
    }
}

/// `n` connections to `addr`, opened on `load` (the load generator's runtime) whichever
/// runtime calls. A socket is driven by the runtime that opened it: one opened on the
/// bench's main thread (a runtime on no core of its own) would route every answer of the
/// step through that thread, on the server's core part of the time. That added a hop to
/// every request of the open-loop register step (M1) until the twentieth round of issue 21.
pub async fn open_on(
    load: &tokio::runtime::Handle,
    addr: &str,
    n: usize,
) -> anyhow::Result<Vec<tokio::sync::Mutex<RawConn>>> {
    let addr = addr.to_owned();
    load.spawn(async move {
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            let mut c = RawConn::new(&addr);
            c.connect().await.map_err(|e| anyhow::anyhow!("connection to {addr}: {e}"))?;
            conns.push(tokio::sync::Mutex::new(c));
        }
        anyhow::Ok(conns)
    })
    .await?
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};

    use super::*;

    /// Answers each request on each accepted connection with an empty 200 until the client
    /// closes (`conns` connections, then the thread ends).
    fn empty_200s(conns: usize) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        std::thread::spawn(move || {
            for s in listener.incoming().take(conns) {
                let Ok(mut s) = s else { return };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while matches!(s.read(&mut buf), Ok(n) if n > 0) {
                        if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    /// Connections opened for the load runtime belong to it: they still work once the
    /// runtime that asked for them is gone (a socket opened on the caller's runtime fails
    /// then, and meanwhile routes every answer through the caller's thread).
    #[test]
    fn connections_opened_on_the_load_runtime_belong_to_it() {
        let addr = empty_200s(2);
        let load =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("rt");
        let caller = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        let conns = caller.block_on(open_on(load.handle(), &addr, 2)).expect("open");
        drop(caller);
        let answered = load.block_on(async move {
            for c in &conns {
                c.lock().await.post_json("/v1/register", b"{}").await?;
            }
            Ok::<_, String>(())
        });
        assert_eq!(answered, Ok(()));
    }
}
