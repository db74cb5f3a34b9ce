//! Any gRPC client's `:authority` is served. Stock clients on a unix socket send
//! what their stack makes of the target: gRPC C-core (grpcio) the percent-encoded
//! socket path, grpc-java the raw path, grpc-go and grpc-js `localhost`. The first two
//! are not RFC 3986 authorities, and h2's server used to reset such a stream before
//! tonic saw it (patches/h2). tonic's own client cannot send them, so these requests
//! are hand-built HTTP/2 frames on a raw unix socket.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use integration_tests::api::{Served, NODE};
use integration_tests::wait::{wait_until, TIMEOUT};
use plegd_api::v1;
use prost::Message as _;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const GOAWAY: u8 = 7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a small frame");
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 section 5.1), first byte's high
/// bits zero.
fn hpack_int(out: &mut Vec<u8>, n: u32, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(u8::try_from(v).expect("below the prefix"));
        return;
    }
    out.push(u8::try_from(max).expect("a prefix"));
    v -= max;
    while v >= 128 {
        out.push(u8::try_from(v % 128).expect("7 bits") | 0x80);
        v /= 128;
    }
    out.push(u8::try_from(v).expect("7 bits"));
}

/// Header fields as HPACK literals without indexing, new names, no Huffman coding.
fn hpack(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0);
        hpack_int(&mut out, 7, name.len());
        out.extend(name.as_bytes());
        hpack_int(&mut out, 7, value.len());
        out.extend(value.as_bytes());
    }
    out
}

/// How the server answered stream 1.
enum Answer {
    /// Its DATA payload, once the trailers ended the stream.
    Served(Vec<u8>),
    /// RST_STREAM with this error code.
    Reset(u32),
    /// GOAWAY with this error code.
    GoAway(u32),
}

fn read_frame(s: &mut UnixStream) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head)?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0; len];
    s.read_exact(&mut payload)?;
    Ok((head[3], head[4], stream, payload))
}

fn code(payload: &[u8], at: usize) -> u32 {
    payload
        .get(at..at + 4)
        .map_or(u32::MAX, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Calls ListPods on stream 1 of a new connection with `authority`.
fn list_pods_with_authority(socket: &Path, authority: &str) -> std::io::Result<Answer> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.write_all(PREFACE)?;
    s.write_all(&frame(SETTINGS, 0, 0, &[]))?;
    let headers = hpack(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/plegd.v1.Plegd/ListPods"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]);
    s.write_all(&frame(HEADERS, END_HEADERS, 1, &headers))?;
    // An empty ListPodsRequest: not compressed, length 0.
    s.write_all(&frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 0]))?;
    let mut data = Vec::new();
    loop {
        let (kind, flags, stream, payload) = read_frame(&mut s)?;
        match (kind, stream) {
            (SETTINGS, 0) if flags & ACK == 0 => s.write_all(&frame(SETTINGS, ACK, 0, &[]))?,
            (GOAWAY, 0) => return Ok(Answer::GoAway(code(&payload, 4))),
            (RST_STREAM, 1) => return Ok(Answer::Reset(code(&payload, 0))),
            (DATA, 1) => data.extend(payload),
            (HEADERS, 1) if flags & END_STREAM != 0 => return Ok(Answer::Served(data)),
            _ => {}
        }
    }
}

async fn assert_served(served: &Served, authority: String) {
    let socket = served.socket.clone();
    let shown = authority.clone();
    let answer = tokio::task::spawn_blocking(move || list_pods_with_authority(&socket, &authority))
        .await
        .expect("the client thread")
        .expect("the exchange completes");
    let data = match answer {
        Answer::Served(data) => data,
        Answer::Reset(code) => {
            panic!("ListPods with :authority {shown:?}: stream reset, code {code}")
        }
        Answer::GoAway(code) => panic!("ListPods with :authority {shown:?}: GOAWAY, code {code}"),
    };
    assert!(data.len() >= 5, "a gRPC message for {shown:?}: {data:?}");
    assert_eq!(data[0], 0, "not compressed");
    let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
    assert_eq!(data.len(), 5 + len, "one message for {shown:?}");
    let list = v1::ListPodsResponse::decode(&data[5..]).expect("a ListPodsResponse");
    assert_eq!(list.node_name, NODE);
    assert_eq!(list.instance_id, served.pleg.instance_id());
}

#[actix_rt::test]
async fn list_pods_is_served_whatever_the_clients_authority() {
    let served = Served::start(Duration::from_secs(3600), 64);
    wait_until("the first global relist", || served.pleg.health().ready()).await;
    let path = served.socket.to_str().expect("a UTF-8 temporary path");
    // gRPC C-core (grpcio): the path percent-encoded, leading slash dropped.
    let encoded = path.trim_start_matches('/').replace('/', "%2F");
    assert_served(&served, encoded).await;
    // ... and with the leading slash encoded too (other C-core versions).
    assert_served(&served, path.replace('/', "%2F")).await;
    // grpc-java: the raw path.
    assert_served(&served, path.to_owned()).await;
    // grpc-go, grpc-js: localhost; tonic: what it is given.
    assert_served(&served, "localhost".into()).await;
    assert_served(&served, "plegd.local:80".into()).await;
}
