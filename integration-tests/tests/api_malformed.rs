//! Malformed gRPC requests sent as raw HTTP/2 frames over the API socket: each is
//! INVALID_ARGUMENT (never INTERNAL or UNKNOWN), whatever RPC it is for; requests a
//! server must refuse otherwise keep their code (an unknown method: UNIMPLEMENTED).

use std::time::Duration;

use integration_tests::api::*;
use plegd_api::v1;
use prost::bytes::Bytes;
use prost::Message as _;
use tonic::codegen::http;
use tonic::Code;

const UNARY: [&str; 3] = [
    "/plegd.v1.Plegd/ListPods",
    "/plegd.v1.Plegd/GetPodStatus",
    "/plegd.v1.Plegd/Watch",
];
const SYNC: &str = "/plegd.v1.Plegd/Sync";

/// A gRPC message frame: the compressed flag, the length, the bytes.
fn frame(flag: u8, message: &[u8]) -> Vec<u8> {
    let mut out = vec![flag];
    out.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// A request message each RPC accepts.
fn valid(path: &str) -> Vec<u8> {
    match path {
        "/plegd.v1.Plegd/GetPodStatus" => v1::GetPodStatusRequest {
            pod_uid: "u1".into(),
            newer_than_unix_nano: None,
        }
        .encode_to_vec(),
        SYNC => v1::SyncRequest {
            kind: Some(v1::sync_request::Kind::Begin(v1::SyncBegin {
                pod_uid: "u1".into(),
            })),
        }
        .encode_to_vec(),
        _ => Vec::new(),
    }
}

/// What plegd answered a raw request: the gRPC status (None: the call went on past
/// its headers with no status within a second, as a stream that was accepted does)
/// and its message.
#[derive(Debug)]
struct Answer {
    code: Option<Code>,
    message: String,
}

/// Sends one request on a new HTTP/2 connection: `headers` on top of a gRPC call's
/// usual ones (a header given with an empty value is left out), then the body in
/// `chunks`, ending the stream after the last (with the headers if none).
async fn raw(served: &Served, path: &str, headers: &[(&str, &str)], chunks: &[Vec<u8>]) -> Answer {
    // Sync is served on the control socket only.
    let socket = if path == SYNC {
        &served.control
    } else {
        &served.socket
    };
    let io = tokio::net::UnixStream::connect(socket)
        .await
        .expect("the API socket accepts");
    let (client, connection) = h2::client::handshake(io).await.expect("HTTP/2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await.expect("the connection is ready");
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("http://plegd.local{path}"));
    let mut given = vec![("content-type", "application/grpc"), ("te", "trailers")];
    for (name, value) in headers {
        given.retain(|(n, _)| n != name);
        given.push((name, value));
    }
    for (name, value) in given.into_iter().filter(|(_, v)| !v.is_empty()) {
        req = req.header(name, value);
    }
    let (response, mut body) = client
        .send_request(req.body(()).unwrap(), chunks.is_empty())
        .expect("the request is sent");
    for (i, chunk) in chunks.iter().enumerate() {
        body.send_data(Bytes::from(chunk.clone()), i + 1 == chunks.len())
            .expect("the body is sent");
    }
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("an answer within 10 s")
        .expect("an HTTP/2 response");
    let status_of = |headers: &http::HeaderMap| {
        tonic::Status::from_header_map(headers).map(|s| Answer {
            code: Some(s.code()),
            message: s.message().to_string(),
        })
    };
    if let Some(answer) = status_of(response.headers()) {
        return answer;
    }
    let mut body = response.into_body();
    let rest = async {
        while let Some(data) = body.data().await {
            let data = data.expect("the response body");
            let _ = body.flow_control().release_capacity(data.len());
        }
        body.trailers().await.expect("the trailers")
    };
    match tokio::time::timeout(Duration::from_secs(1), rest).await {
        Ok(Some(trailers)) => status_of(&trailers).unwrap_or(Answer {
            code: None,
            message: "trailers without a status".into(),
        }),
        Ok(None) => Answer {
            code: None,
            message: "no trailers".into(),
        },
        Err(_) => Answer {
            code: None,
            message: "still open".into(),
        },
    }
}

/// The three requests tonic answered with INTERNAL, and a compressed flag that is
/// neither 0 nor 1: INVALID_ARGUMENT on every RPC.
#[actix_rt::test]
async fn a_bad_flag_a_cut_off_message_or_none_at_all_is_an_invalid_argument() {
    let served = Served::start(Duration::from_millis(50), 64);
    served.rt.run_pod("u1", "web", "ns");
    let mut wrong = Vec::new();
    for path in UNARY.into_iter().chain([SYNC]) {
        let message = valid(path);
        let whole = frame(0, &message);
        let mut cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
            (
                "the compressed flag without grpc-encoding",
                vec![frame(1, &message)],
            ),
            ("a compressed flag of 2", vec![frame(2, &message)]),
            ("a length prefix cut off", vec![whole[..3].to_vec()]),
            (
                "a body shorter than its prefix",
                vec![frame(0, &[message.clone(), vec![0x0a; 8]].concat())[..7].to_vec()],
            ),
            (
                "a cut-off prefix in a second data frame",
                vec![vec![0], whole[1..4].to_vec()],
            ),
        ];
        if path != SYNC {
            // Sync without messages is refused by its handler (its first message
            // must be begin).
            cases.push(("no request message", Vec::new()));
        }
        for (what, chunks) in cases {
            let answer = raw(&served, path, &[], &chunks).await;
            if answer.code != Some(Code::InvalidArgument)
                || !answer.message.starts_with("bad request: ")
            {
                wrong.push(format!("{path}, {what}: {answer:?}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // Sync with a hold: a message cut off mid-hold ends it with INVALID_ARGUMENT.
    let begin = frame(0, &valid(SYNC));
    let answer = raw(&served, SYNC, &[], &[begin.clone(), vec![0, 0]]).await;
    assert_eq!(answer.code, Some(Code::InvalidArgument), "{answer:?}");
    // The server is fine after all that: a well-formed call is answered.
    let ok = raw(&served, UNARY[0], &[], &[frame(0, &[])]).await;
    assert_eq!(ok.code, Some(Code::Ok), "{ok:?}");
}

/// What a request is, its path, its extra headers, its body and the code it gets.
type Case = (
    &'static str,
    &'static str,
    Vec<(&'static str, &'static str)>,
    Vec<Vec<u8>>,
    Option<Code>,
);

/// Other malformed requests: none is INTERNAL or UNKNOWN. Unknown methods and
/// services, and a compression plegd does not take, are UNIMPLEMENTED.
#[actix_rt::test]
async fn no_malformed_request_is_an_internal_error() {
    let served = Served::start(Duration::from_millis(50), 64);
    let list = "/plegd.v1.Plegd/ListPods";
    let empty = vec![frame(0, &[])];
    let cases: Vec<Case> = vec![
        (
            "an unknown method",
            "/plegd.v1.Plegd/Nope",
            vec![],
            empty.clone(),
            Some(Code::Unimplemented),
        ),
        (
            "an unknown service",
            "/nope.v1.Nope/ListPods",
            vec![],
            empty.clone(),
            Some(Code::Unimplemented),
        ),
        (
            "an unsupported grpc-encoding",
            list,
            vec![("grpc-encoding", "snappy")],
            vec![frame(1, &[])],
            Some(Code::Unimplemented),
        ),
        (
            "bytes that are no protobuf",
            list,
            vec![],
            vec![frame(0, &[0x0a, 0xff, 0xff, 0xff])],
            Some(Code::InvalidArgument),
        ),
        // Accepted as they are: a malformed grpc-timeout is ignored, a second request
        // message after the first is not read, and neither the content-type nor `te`
        // is checked.
        (
            "a malformed grpc-timeout",
            list,
            vec![("grpc-timeout", "soon")],
            empty.clone(),
            Some(Code::Ok),
        ),
        (
            "two request messages",
            list,
            vec![],
            vec![[frame(0, &[]), frame(0, &[])].concat()],
            Some(Code::Ok),
        ),
        (
            "a content-type that is not gRPC",
            list,
            vec![("content-type", "application/json")],
            empty.clone(),
            Some(Code::Ok),
        ),
        (
            "no te header",
            list,
            vec![("te", "")],
            empty.clone(),
            Some(Code::Ok),
        ),
    ];
    for (what, path, headers, chunks, want) in cases {
        let answer = raw(&served, path, &headers, &chunks).await;
        assert!(
            !matches!(answer.code, Some(Code::Internal | Code::Unknown)),
            "{what}: {answer:?}"
        );
        assert_eq!(answer.code, want, "{what}: {answer:?}");
    }
}
