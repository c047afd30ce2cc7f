//! HTTP/2 limits probed with raw frames (a library client keeps to the server's settings,
//! a hostile one does not): more concurrent streams than `h2_streams_max` (the extra ones
//! are refused with REFUSED_STREAM), a header list over `header_bytes_max` (answered 431,
//! the connection stays usable), and a client that never answers keep-alive pings (closed
//! after `h2_keepalive_interval_ms` + `h2_keepalive_timeout_ms`). A well-behaved client is
//! served throughout.

use super::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const REFUSED_STREAM: u32 = 0x7;
/// The largest frame payload a peer must accept (SETTINGS_MAX_FRAME_SIZE's default).
const FRAME_PAYLOAD_MAX: usize = 16_384;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK integer with an `n`-bit prefix, the prefix's other bits set from `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

fn hpack_str(out: &mut Vec<u8>, s: &[u8]) {
    hpack_int(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// The header block of `GET path` (literals without indexing, no Huffman), plus `extra`.
fn get_block(addr: SocketAddr, path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut b = vec![0x82, 0x86]; // :method GET, :scheme http
    hpack_int(&mut b, 0x00, 4, 4); // :path, by the static table's name
    hpack_str(&mut b, path.as_bytes());
    hpack_int(&mut b, 0x00, 4, 1); // :authority
    hpack_str(&mut b, addr.to_string().as_bytes());
    for (name, value) in extra {
        b.push(0x00); // literal, new name
        hpack_str(&mut b, name.as_bytes());
        hpack_str(&mut b, value.as_bytes());
    }
    b
}

/// A request on `stream` as HEADERS (+ CONTINUATION) frames, ending the stream.
fn request(stream: u32, block: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let chunks: Vec<&[u8]> = block.chunks(FRAME_PAYLOAD_MAX).collect();
    for (i, c) in chunks.iter().enumerate() {
        let last = if i + 1 == chunks.len() { END_HEADERS } else { 0 };
        out.extend(if i == 0 {
            frame(HEADERS, END_STREAM | last, stream, c)
        } else {
            frame(CONTINUATION, last, stream, c)
        });
    }
    out
}

struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// The next frame, or None when the connection closed or `deadline` passed.
async fn read_frame(s: &mut TcpStream, deadline: tokio::time::Instant) -> Option<Frame> {
    let mut head = [0u8; 9];
    tokio::time::timeout_at(deadline, s.read_exact(&mut head)).await.ok()?.ok()?;
    let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    tokio::time::timeout_at(deadline, s.read_exact(&mut payload)).await.ok()?.ok()?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Some(Frame { kind: head[3], flags: head[4], stream, payload })
}

/// A raw HTTP/2 connection past the handshake (SETTINGS both ways, acknowledged).
async fn handshake(addr: SocketAddr) -> TcpStream {
    let mut s = connect_from([127, 0, 0, 2], addr).await.unwrap();
    s.write_all(&[PREFACE, &frame(SETTINGS, 0, 0, &[])].concat()).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let f = read_frame(&mut s, deadline).await.expect("the server's SETTINGS");
        if f.kind == SETTINGS && f.flags & ACK == 0 {
            s.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
            return s;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_limits_refuse_extra_streams_and_big_headers_and_close_silent_connections() {
    const STREAMS_MAX: u32 = 8;
    const OPENED: u32 = 12;
    let dir = tempfile::tempdir().unwrap();
    let cfg = tuned(dir.path(), |c| {
        c.http.h2_streams_max = STREAMS_MAX;
        c.http.h2_keepalive_interval_ms = 400;
        c.http.h2_keepalive_timeout_ms = 400;
    });
    let node = Node::start(cfg, None).await.unwrap();
    let addr = node.http_addr();
    let c = client(&node);
    well_behaved(&c, 0).await;
    let index = c.discover("default", "calm", "").await.unwrap()["index"].as_u64().unwrap();
    let waiting = format!("/v1/services/default/calm?index={index}&wait=10s");

    // 12 blocking queries on one connection, which allows 8 at once.
    let mut s = handshake(addr).await;
    let mut burst = Vec::new();
    for i in 0..OPENED {
        burst.extend(request(1 + 2 * i, &get_block(addr, &waiting, &[])));
    }
    s.write_all(&burst).await.unwrap();
    let mut refused = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while refused.len() < (OPENED - STREAMS_MAX) as usize {
        let Some(f) = read_frame(&mut s, deadline).await else { break };
        assert_ne!(f.kind, GOAWAY, "the connection was ended, not the extra streams");
        if f.kind == RST_STREAM {
            let code = u32::from_be_bytes(f.payload[..4].try_into().unwrap());
            assert_eq!(code, REFUSED_STREAM, "stream {}", f.stream);
            refused.push(f.stream);
        }
    }
    refused.sort_unstable();
    assert_eq!(refused, vec![17, 19, 21, 23], "the streams past the limit are refused");
    // The 8 held streams do not keep a well-behaved client out; its write answers them.
    well_behaved(&c, 1).await;
    let mut answered = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while answered < STREAMS_MAX {
        let f = read_frame(&mut s, deadline).await.expect("the held streams are answered");
        if (f.kind == DATA || f.kind == HEADERS) && f.flags & END_STREAM != 0 {
            answered += 1;
        }
    }

    // A header list over header_bytes_max (64 KiB): 431, and the connection still serves.
    let big = "x".repeat(100 * 1024);
    s.write_all(&request(25, &get_block(addr, "/v1/status", &[("x-big", &big)]))).await.unwrap();
    s.write_all(&request(27, &get_block(addr, "/v1/status", &[]))).await.unwrap();
    let (mut big_answer, mut status_served) = (None, false);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while big_answer.is_none() || !status_served {
        let f = read_frame(&mut s, deadline).await.expect("answers to streams 25 and 27");
        assert_ne!(f.kind, GOAWAY, "an oversized header list ended the connection");
        match (f.kind, f.stream) {
            (HEADERS, 25) | (RST_STREAM, 25) => big_answer = Some(f),
            (DATA, 27) if f.flags & END_STREAM != 0 => status_served = true,
            _ => {}
        }
    }
    let big_answer = big_answer.unwrap();
    assert_eq!(big_answer.kind, HEADERS, "an oversized header list is answered, not reset");
    // ":status: 431", its value plain or Huffman-coded.
    let p = &big_answer.payload;
    let says_431 = p.windows(3).any(|w| w == b"431" || w == [0x69, 0x90, 0xff]);
    assert!(says_431, "not a 431: {p:02x?}");

    // A client that never answers the server's pings: closed once the keep-alive times out,
    // even with a request in flight.
    let started = Instant::now();
    s.write_all(&request(
        29,
        &get_block(addr, &format!("/v1/services/default/quiet?index={}&wait=10s", u64::MAX - 1), &[]),
    ))
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    let closed = loop {
        match read_frame(&mut s, deadline).await {
            None => break tokio::time::Instant::now() < deadline,
            Some(f) if f.kind == GOAWAY => break true,
            Some(_) => {}
        }
    };
    assert!(closed, "a connection that ignores pings stayed open for {:?}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    well_behaved(&c, 2).await;
    node.shutdown().await;
}
