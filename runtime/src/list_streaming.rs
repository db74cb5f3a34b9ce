//! The global relist's lists through CRI's streaming list calls, StreamPodSandboxes
//! and StreamContainers (KEP-5825, CRIListStreaming): the unary lists are one message
//! each, and a runtime refuses to send one over its own gRPC send limit (containerd's
//! default: 16 MiB, 10,000 to 20,000 pods with kubelet's metadata), so past that size
//! only the streams can read the node.
//!
//! Used when the runtime offers them; a runtime that answers UNIMPLEMENTED does not,
//! and from then on the global relist uses the unary lists (said once in the log, as
//! kubelet remembers it until it restarts). `--runtime-list-streaming=false` keeps
//! plegd on the unary lists.
//!
//! Each streamed message has the unary response's shape — its field 1 is the repeated
//! entry, `PodSandbox` or `Container` — so the messages of one stream, appended in
//! order, are one valid `ListPodSandboxResponse` or `ListContainersResponse`. The
//! global relist reads both streams as it reads the unary lists, message by message as
//! they arrive, each message on its own ([`crate::list_sink`]). Only
//! [`crate::RuntimeClient::list_node`] appends them (one copy), read in place as the
//! unary responses' bytes ([`NodeLists::Wire`], [`crate::list_wire`]), each message
//! first checked to be a whole sequence of fields, so that no field spans two messages
//! and the appended bytes are read exactly as each message on its own would be (an
//! entry the reader then refuses is reported under the unary call's name: the view
//! does not know which path brought the bytes).

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use prost::bytes::Bytes;
use prost::encoding::{decode_key, skip_field, DecodeContext};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

use tonic::client::{Grpc, GrpcService};

use crate::cri_client::{call_error, request};
use crate::list_memo::ListMemo;
use crate::list_sink::{Sink, SinkChannel};
use crate::packed_lists::{ContainerList, PackedList, SandboxList};
use crate::raw_codec::RawCodec;
use crate::{NodeLists, RuntimeError};

/// The streaming list calls' messages (generated from `proto/cri_list_streaming.proto`
/// with the published names and field numbers), and the CRI messages they carry.
#[allow(clippy::all, missing_docs, unreachable_pub, rust_2018_idioms)]
pub mod proto {
    pub use k8s_cri::v1::{Container, ContainerFilter, PodSandbox, PodSandboxFilter};
    tonic::include_proto!("runtime.v1");
}

pub const STREAM_POD_SANDBOXES: &str = "/runtime.v1.RuntimeService/StreamPodSandboxes";
pub const STREAM_CONTAINERS: &str = "/runtime.v1.RuntimeService/StreamContainers";

/// Not asked yet.
const UNKNOWN: u8 = 0;
/// The runtime answered them.
const OFFERED: u8 = 1;
/// The runtime answered UNIMPLEMENTED.
const NOT_OFFERED: u8 = 2;
/// `--runtime-list-streaming=false`.
const OFF: u8 = 3;

/// Whether the global relist reads the node through the streams, as far as plegd
/// knows; shared by the clones of one client.
#[derive(Debug)]
pub(crate) struct ListStreaming {
    state: AtomicU8,
}

impl ListStreaming {
    pub(crate) fn new(enabled: bool) -> Self {
        ListStreaming {
            state: AtomicU8::new(if enabled { UNKNOWN } else { OFF }),
        }
    }

    /// Whether the next global relist tries the streams.
    pub(crate) fn should_try(&self) -> bool {
        matches!(self.state.load(Ordering::Relaxed), UNKNOWN | OFFERED)
    }

    /// Whether the last global relist read the node through the streams.
    pub(crate) fn in_use(&self) -> bool {
        self.state.load(Ordering::Relaxed) == OFFERED
    }

    fn offered(&self) {
        if self.state.swap(OFFERED, Ordering::Relaxed) != OFFERED {
            tracing::info!(
                "the runtime offers the streaming list calls (StreamPodSandboxes, StreamContainers): global relists read the node through them, whatever its size"
            );
        }
    }

    fn not_offered(&self, answer: &RuntimeError) {
        if self.state.swap(NOT_OFFERED, Ordering::Relaxed) != NOT_OFFERED {
            tracing::info!(
                answer = %answer,
                "the runtime does not offer the streaming list calls (StreamPodSandboxes, StreamContainers): global relists use ListPodSandbox and ListContainers, each one message under the runtime's send limit, until plegd restarts"
            );
        }
    }

    /// What would read a unary list that was over the runtime's send limit.
    pub(crate) fn unary_hint(&self) -> &'static str {
        match self.state.load(Ordering::Relaxed) {
            NOT_OFFERED => "; this runtime does not offer the streaming list calls (StreamPodSandboxes, StreamContainers; containerd from 2.4) that would carry it",
            OFF => "; --runtime-list-streaming=false keeps plegd from the streaming list calls that would carry it",
            _ => "",
        }
    }

    /// The node's lists through the two streams, both in flight at once. `Ok(None)`:
    /// the runtime does not offer them (remembered; the caller lists with the unary
    /// calls). With `sunk`, the containers' messages are read as they arrive into
    /// the list memo's reader ([`crate::list_sink`]; [`NodeLists::Sunk`]), its
    /// read left for the caller to finish; without, they are appended
    /// ([`NodeLists::Wire`]).
    pub(crate) async fn node_lists(
        &self,
        grpc: &Grpc<Channel>,
        sunk: Option<(&Grpc<SinkChannel<Channel>>, &mut ListMemo)>,
        timeout: Duration,
        limit: usize,
    ) -> Result<Option<NodeLists>, RuntimeError> {
        let how = || Reading { timeout, limit };
        let read = match sunk {
            Some((sunk, memo)) => {
                let sandbox_sink = Sink::<SandboxList>::streamed(limit, memo);
                let container_sink = Sink::<ContainerList>::streamed(limit, memo);
                // Either failing fails both (the other is not read to its end).
                let called = futures::try_join!(
                    sunk_stream(
                        sunk,
                        "StreamPodSandboxes",
                        STREAM_POD_SANDBOXES,
                        proto::StreamPodSandboxesRequest::default(),
                        &sandbox_sink,
                        how(),
                    ),
                    sunk_stream(
                        sunk,
                        "StreamContainers",
                        STREAM_CONTAINERS,
                        proto::StreamContainersRequest::default(),
                        &container_sink,
                        how(),
                    )
                );
                let (sandboxes, containers) = match called {
                    Ok((s, c)) => (Ok(s), Ok(c)),
                    Err(e) => (Err(e), Ok(Vec::new())),
                };
                let sandboxes = sandbox_sink.outcome("StreamPodSandboxes", sandboxes, memo);
                let containers = container_sink.outcome("StreamContainers", containers, memo);
                let read = match (sandboxes, containers) {
                    (Ok(sandboxes), Ok(containers)) => Ok(NodeLists::Sunk {
                        sandboxes,
                        containers,
                    }),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                };
                if read.is_err() {
                    // What the sinks' reads marked in the memo is forgotten (also
                    // when a runtime offers only one of the streams: the unary lists
                    // are read next).
                    memo.finish(false);
                }
                read
            }
            None => {
                let sandboxes = streamed_list(
                    grpc.clone(),
                    "StreamPodSandboxes",
                    STREAM_POD_SANDBOXES,
                    request(proto::StreamPodSandboxesRequest::default(), timeout),
                    how(),
                );
                let containers = streamed_list(
                    grpc.clone(),
                    "StreamContainers",
                    STREAM_CONTAINERS,
                    request(proto::StreamContainersRequest::default(), timeout),
                    how(),
                );
                futures::try_join!(sandboxes, containers).map(|(sandboxes, containers)| {
                    NodeLists::Wire {
                        sandboxes: appended(&sandboxes),
                        containers: appended(&containers),
                    }
                })
            }
        };
        match read {
            Ok(lists) => {
                self.offered();
                Ok(Some(lists))
            }
            Err(e) if e.code() == tonic::Code::Unimplemented => {
                self.not_offered(&e);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// One stream read as it arrives into `sink` (the empty messages tonic gets in
/// place of those it took).
async fn sunk_stream<Req, L>(
    grpc: &Grpc<SinkChannel<Channel>>,
    op: &'static str,
    path: &'static str,
    req: Req,
    sink: &Sink<L>,
    how: Reading,
) -> Result<Vec<Bytes>, RuntimeError>
where
    Req: prost::Message + Send + Sync + 'static,
    L: PackedList,
{
    let mut req = request(req, how.timeout);
    req.extensions_mut().insert(sink.taker());
    streamed_list(grpc.clone(), op, path, req, how).await
}

/// How one stream is read.
struct Reading {
    /// For the whole stream, from the call to its end.
    timeout: Duration,
    /// plegd's receive limit, for the error that names it.
    limit: usize,
}

/// One stream's messages, each checked to be whole fields (see the module's
/// comment): on a channel whose [`Sink`] takes them, the empty messages tonic gets
/// in their place.
async fn streamed_list<T, Req>(
    mut grpc: Grpc<T>,
    op: &'static str,
    path: &'static str,
    req: tonic::Request<Req>,
    how: Reading,
) -> Result<Vec<Bytes>, RuntimeError>
where
    T: GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError>,
    Req: prost::Message + Send + Sync + 'static,
{
    let read = async {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {}", e.into())))
            .map_err(|s| call_error(op, how.limit, how.timeout, s))?;
        let mut stream = grpc
            .server_streaming(
                req,
                PathAndQuery::from_static(path),
                RawCodec::<Req>::default(),
            )
            .await
            .map_err(|s| call_error(op, how.limit, how.timeout, s))?
            .into_inner();
        let mut messages = Vec::new();
        while let Some(message) = stream
            .message()
            .await
            .map_err(|s| call_error(op, how.limit, how.timeout, s))?
        {
            whole_fields(&message).map_err(|reason| RuntimeError::Invalid { op, reason })?;
            messages.push(message);
        }
        Ok(messages)
    };
    match tokio::time::timeout(how.timeout, read).await {
        Ok(result) => result,
        Err(_) => Err(RuntimeError::Timeout {
            op,
            timeout: how.timeout,
        }),
    }
}

/// Checks that `message` is a sequence of whole fields (prost's checks of keys,
/// lengths and groups at its top level; the entries are checked when the lists are
/// read).
fn whole_fields(message: &[u8]) -> Result<(), String> {
    let mut rest = message;
    while !rest.is_empty() {
        let (tag, wire_type) = decode_key(&mut rest).map_err(|e| e.to_string())?;
        skip_field(wire_type, tag, &mut rest, DecodeContext::default())
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Messages checked by [`whole_fields`], appended: one list response.
fn appended(messages: &[Bytes]) -> Bytes {
    if let [one] = messages {
        return one.clone();
    }
    let mut out = Vec::with_capacity(messages.iter().map(Bytes::len).sum());
    for m in messages {
        out.extend_from_slice(m);
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::{convert, cri, Container, ContainerState, PodRef, Sandbox, SandboxState};

    fn sandbox(i: usize) -> Sandbox {
        Sandbox {
            id: format!("sb{i}"),
            pod: PodRef {
                uid: format!("u{i}"),
                name: format!("web-{i}"),
                namespace: "ns".into(),
            },
            attempt: 0,
            state: SandboxState::Ready,
            created_at: i as i64,
            labels: [("app".to_string(), format!("web-{i}"))].into(),
        }
    }

    fn container(i: usize) -> Container {
        Container {
            id: format!("c{i}"),
            sandbox_id: format!("sb{i}"),
            name: "app".into(),
            attempt: 1,
            state: ContainerState::Running,
            created_at: i as i64,
        }
    }

    /// The streamed messages of `n` sandboxes and containers, `per` entries each.
    fn streamed(n: usize, per: usize) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let sandboxes: Vec<_> = (0..n).map(sandbox).collect();
        let containers: Vec<_> = (0..n).map(container).collect();
        let s = sandboxes
            .chunks(per)
            .map(|chunk| {
                proto::StreamPodSandboxesResponse {
                    pod_sandboxes: chunk.iter().map(convert::sandbox_to_wire).collect(),
                }
                .encode_to_vec()
            })
            .collect();
        let c = containers
            .chunks(per)
            .map(|chunk| {
                proto::StreamContainersResponse {
                    containers: chunk.iter().map(convert::container_to_wire).collect(),
                }
                .encode_to_vec()
            })
            .collect();
        (s, c)
    }

    fn appended(messages: &[Vec<u8>]) -> Result<Bytes, String> {
        let mut checked = Vec::new();
        for m in messages {
            whole_fields(m)?;
            checked.push(Bytes::copy_from_slice(m));
        }
        Ok(super::appended(&checked))
    }

    #[test]
    fn streamed_messages_appended_are_the_unary_lists() {
        let (s, c) = streamed(10, 3);
        assert_eq!(s.len(), 4);
        let lists = NodeLists::Wire {
            sandboxes: appended(&s).expect("whole messages"),
            containers: appended(&c).expect("whole messages"),
        };
        let view = lists.view().expect("valid lists");
        let ids: Vec<_> = view.sandboxes().iter().map(|s| s.id).collect();
        let want: Vec<_> = (0..10).map(|i| format!("sb{i}")).collect();
        assert_eq!(ids, want);
        assert_eq!(
            view.sandboxes()[7].to_sandbox().expect("labels"),
            (sandbox(7), true)
        );
        let got: Vec<_> = view.containers().iter().map(|c| c.to_container()).collect();
        assert_eq!(got, (0..10).map(container).collect::<Vec<_>>());
        // prost agrees: the appended bytes are a ListContainersResponse of every entry.
        let decoded = cri::ListContainersResponse::decode(appended(&c).expect("whole"))
            .expect("prost decodes");
        assert_eq!(decoded.containers.len(), 10);
    }

    #[test]
    fn a_message_that_ends_inside_a_field_is_refused() {
        let (s, _) = streamed(4, 2);
        for cut in [1, 2, s[0].len() - 1] {
            // The first message cut short, then a whole one: appended, the second's
            // bytes would complete the first's last field.
            let messages = vec![s[0][..cut].to_vec(), s[1].clone()];
            assert!(appended(&messages).is_err(), "cut at {cut} accepted");
            assert!(
                proto::StreamPodSandboxesResponse::decode(&s[0][..cut]).is_err(),
                "prost accepts the cut at {cut}: the test is wrong"
            );
        }
        // A group opened in one message and closed in the next.
        let open_group = vec![0x13];
        let close_group = vec![0x14];
        assert!(appended(&[open_group, close_group]).is_err());
    }

    #[test]
    fn unknown_fields_of_a_message_are_kept_and_skipped_when_read() {
        let (s, _) = streamed(2, 1);
        // Field 2, a varint: not in today's message, skipped by every reader.
        let mut with_unknown = s[0].clone();
        with_unknown.extend_from_slice(&[0x10, 0x05]);
        let lists = NodeLists::Wire {
            sandboxes: appended(&[with_unknown, s[1].clone()]).expect("whole"),
            containers: Bytes::new(),
        };
        assert_eq!(lists.view().expect("valid").sandboxes().len(), 2);
    }

    #[test]
    fn the_state_is_remembered_and_named_in_the_hint() {
        let off = ListStreaming::new(false);
        assert!(!off.should_try());
        assert!(off.unary_hint().contains("--runtime-list-streaming=false"));
        let on = ListStreaming::new(true);
        assert!(on.should_try() && !on.in_use());
        assert_eq!(on.unary_hint(), "");
        on.offered();
        assert!(on.should_try() && on.in_use());
        on.not_offered(&RuntimeError::Rpc {
            op: "StreamContainers",
            code: tonic::Code::Unimplemented,
            message: "unknown method".into(),
        });
        assert!(!on.should_try() && !on.in_use());
        assert!(on.unary_hint().contains("does not offer"));
    }
}
