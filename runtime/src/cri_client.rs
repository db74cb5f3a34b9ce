//! The CRI runtime client: tonic over a unix socket.
//!
//! Two channels to the same socket: one for unary calls, each bounded by the request
//! timeout, and one for the event streams (CRI's, and containerd's event service)
//! with no timeout at all — containerd sends no
//! response headers until the first event, so any deadline on the stream would kill an
//! idle stream (and on containerd 1.7 each killed stream swallows a later event).
//! Channels are lazy and must be built inside a long-lived tokio runtime (the actix
//! System arbiter): tonic spawns the connection worker on the current runtime.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::cri;
use crate::cri::runtime_service_client::RuntimeServiceClient;
use async_trait::async_trait;
use futures::StreamExt;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::containerd_events::{self, EventsClient, SubscribeRequest, TaskEventStream};
use crate::convert;
use crate::event_read::EventRead;
use crate::list_read::{ContainersRead, SandboxesRead};
use crate::list_sink::{Sink, SinkChannel};
use crate::list_streaming::ListStreaming;
use crate::packed_lists::{ContainerList, PackedList, SandboxList};
use crate::raw_codec::RawCodec;
use crate::status_read;
use crate::{
    Container, ContainerStatus, EventStream, ListMemo, NodeLists, RuntimeClient, RuntimeError,
    RuntimeVersion, Sandbox,
};
use prost::Message as _;

/// Parses `unix:///absolute/path` into the socket path. Anything else is refused with
/// a reason (plegd talks to a node-local runtime only).
pub fn parse_unix_endpoint(endpoint: &str) -> Result<PathBuf, RuntimeError> {
    let bad = |reason: &str| RuntimeError::BadEndpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let path = match endpoint.split_once("://") {
        Some(("unix", rest)) => rest,
        Some((scheme, _)) => {
            return Err(bad(&format!(
                "scheme {scheme:?} is not supported; use unix:///path/to/socket"
            )))
        }
        None => return Err(bad("expected unix:///path/to/socket")),
    };
    if !path.starts_with('/') {
        return Err(bad(
            "the socket path must be absolute (unix:///path/to/socket)",
        ));
    }
    if path.len() > 107 {
        return Err(bad("unix socket paths are limited to 107 bytes"));
    }
    Ok(PathBuf::from(path))
}

/// A CRI v1 runtime reached over a unix socket.
#[derive(Clone)]
pub struct CriRuntime {
    endpoint: String,
    socket: PathBuf,
    unary: RuntimeServiceClient<Channel>,
    /// The unary channel for calls whose response is read undecoded (the global
    /// relist's lists).
    raw: tonic::client::Grpc<Channel>,
    /// The same channel, for a call whose response's message goes to a [`Sink`] (the
    /// global relist's ListContainers, read as it arrives).
    sunk: tonic::client::Grpc<SinkChannel<Channel>>,
    /// The streams' channel: GetContainerEvents, each event read as `event_read` says.
    stream: tonic::client::Grpc<Channel>,
    /// containerd's event service, on the streams' channel.
    events: EventsClient<Channel>,
    timeout: Duration,
    max_message_size: usize,
    /// Whether the global relist reads the node through the streaming list calls.
    streaming: Arc<ListStreaming>,
}

/// The largest CRI response plegd decodes by default: kubelet's 16 MiB. tonic's own
/// default (4 MiB) fails every relist of a node with 10,000 pods × 2 containers
/// (≈ 440 bytes per listed container with kubelet's labels), or of one pod with 150
/// containers carrying 30 KB annotations.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// A lazy gRPC channel to a unix socket: it dials on first use (and again after the
/// server comes back). Build it inside a tokio runtime that outlives it. Every CRI
/// client in the tree (plegd's, the workload's, the tests' raw clients) uses this one.
pub fn unix_channel(socket: &Path) -> Channel {
    let socket = socket.to_path_buf();
    // The URI is a placeholder: the connector ignores it and dials the socket.
    Endpoint::from_static("http://cri.local")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
}

impl CriRuntime {
    /// ListContainers with this filter, read as `list_read` says, each entry converted
    /// (one plegd cannot read is left out, logged at debug).
    async fn list_containers_by(
        &self,
        filter: Option<cri::ContainerFilter>,
    ) -> Result<Vec<Container>, RuntimeError> {
        const OP: &str = "ListContainers";
        let bytes = self
            .raw_unary(
                OP,
                "/runtime.v1.RuntimeService/ListContainers",
                cri::ListContainersRequest { filter },
            )
            .await?;
        let resp = ContainersRead::decode(bytes).map_err(|e| RuntimeError::Invalid {
            op: OP,
            reason: e.to_string(),
        })?;
        Ok(resp
            .containers
            .into_iter()
            .filter_map(|c| {
                convert::container_from_listed(c.into())
                    .map_err(|e| tracing::debug!(error = %e, "ignoring a listed container"))
                    .ok()
            })
            .collect())
    }
    /// Builds the client. Does not connect: the first call does (see [`Self::check`]).
    /// Must be called inside a tokio runtime that outlives the client.
    pub fn new(endpoint: &str, request_timeout: Duration) -> Result<Self, RuntimeError> {
        let socket = parse_unix_endpoint(endpoint)?;
        let streams = unix_channel(&socket);
        let unary = unix_channel(&socket);
        Ok(CriRuntime {
            endpoint: endpoint.to_string(),
            raw: tonic::client::Grpc::new(unary.clone())
                .max_decoding_message_size(DEFAULT_MAX_MESSAGE_SIZE),
            sunk: tonic::client::Grpc::new(SinkChannel(unary.clone()))
                .max_decoding_message_size(DEFAULT_MAX_MESSAGE_SIZE),
            unary: RuntimeServiceClient::new(unary)
                .max_decoding_message_size(DEFAULT_MAX_MESSAGE_SIZE),
            stream: tonic::client::Grpc::new(streams.clone())
                .max_decoding_message_size(DEFAULT_MAX_MESSAGE_SIZE),
            events: EventsClient::new(streams).max_decoding_message_size(DEFAULT_MAX_MESSAGE_SIZE),
            socket,
            timeout: request_timeout,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            streaming: Arc::new(ListStreaming::new(true)),
        })
    }

    /// Whether the global relist may read the node through CRI's streaming list calls
    /// when the runtime offers them (the default), or only through the unary lists.
    pub fn with_list_streaming(mut self, enabled: bool) -> Self {
        self.streaming = Arc::new(ListStreaming::new(enabled));
        self
    }

    /// Whether the last global relist read the node through the streaming list calls.
    pub fn list_streaming_in_use(&self) -> bool {
        self.streaming.in_use()
    }

    /// The largest response decoded, for unary calls and each event alike.
    pub fn with_max_message_size(mut self, bytes: usize) -> Self {
        self.unary = self.unary.max_decoding_message_size(bytes);
        self.raw = self.raw.max_decoding_message_size(bytes);
        self.sunk = self.sunk.max_decoding_message_size(bytes);
        self.stream = self.stream.max_decoding_message_size(bytes);
        self.events = self.events.clone().max_decoding_message_size(bytes);
        self.max_message_size = bytes;
        self
    }

    /// The start-up check: the socket exists and a CRI v1 server answers Version.
    pub async fn check(&self) -> Result<RuntimeVersion, RuntimeError> {
        match std::fs::metadata(&self.socket) {
            Err(e) => {
                return Err(RuntimeError::Unreachable {
                    endpoint: self.endpoint.clone(),
                    reason: format!("socket {}: {e}", self.socket.display()),
                })
            }
            Ok(meta) => {
                use std::os::unix::fs::FileTypeExt;
                if !meta.file_type().is_socket() {
                    return Err(RuntimeError::Unreachable {
                        endpoint: self.endpoint.clone(),
                        reason: format!("{} is not a unix socket", self.socket.display()),
                    });
                }
            }
        }
        match self.version().await {
            Ok(v) => Ok(v),
            Err(RuntimeError::Rpc {
                code: tonic::Code::Unimplemented,
                ..
            }) => Err(RuntimeError::Unreachable {
                endpoint: self.endpoint.clone(),
                reason: "the server does not implement CRI runtime.v1 (Version is unimplemented)"
                    .into(),
            }),
            Err(e @ RuntimeError::Timeout { .. }) => Err(RuntimeError::Unreachable {
                endpoint: self.endpoint.clone(),
                reason: e.to_string(),
            }),
            Err(RuntimeError::Rpc {
                code: tonic::Code::Unavailable | tonic::Code::Unknown,
                message,
                ..
            }) => Err(RuntimeError::Unreachable {
                endpoint: self.endpoint.clone(),
                reason: format!("not a CRI gRPC server or not answering: {message}"),
            }),
            Err(e) => Err(e),
        }
    }

    async fn unary<T, F, Fut>(&self, op: &'static str, call: F) -> Result<T, RuntimeError>
    where
        F: FnOnce(RuntimeServiceClient<Channel>, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.timed(op, call(self.unary.clone(), self.timeout)).await
    }

    /// A call bounded by the request timeout, its status turned into a [`RuntimeError`].
    async fn timed<T>(
        &self,
        op: &'static str,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, RuntimeError> {
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Err(RuntimeError::Timeout {
                op,
                timeout: self.timeout,
            }),
            Ok(Err(status)) => Err(call_error(op, self.max_message_size, self.timeout, status)),
            Ok(Ok(resp)) => Ok(resp.into_inner()),
        }
    }
}

impl CriRuntime {
    /// A unary call whose response comes back as its bytes (decoded by the caller).
    async fn raw_unary<Req: prost::Message + Send + Sync + 'static>(
        &self,
        op: &'static str,
        path: &'static str,
        req: Req,
    ) -> Result<prost::bytes::Bytes, RuntimeError> {
        let mut grpc = self.raw.clone();
        let timeout = self.timeout;
        self.timed(op, async move {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
            grpc.unary(
                request(req, timeout),
                PathAndQuery::from_static(path),
                RawCodec::<Req>::default(),
            )
            .await
        })
        .await
    }
}

impl CriRuntime {
    /// A list call of the whole node (`op` at `path`), its message read as it
    /// arrives into `sink`: the bytes tonic hands back are empty when the sink took
    /// it.
    async fn sunk_list<Req, L>(
        &self,
        op: &'static str,
        path: &'static str,
        req: Req,
        sink: &Sink<L>,
    ) -> Result<prost::bytes::Bytes, RuntimeError>
    where
        Req: prost::Message + Send + Sync + 'static,
        L: PackedList,
    {
        let mut grpc = self.sunk.clone();
        let timeout = self.timeout;
        let mut req = request(req, timeout);
        req.extensions_mut().insert(sink.taker());
        self.timed(op, async move {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
            grpc.unary(
                req,
                PathAndQuery::from_static(path),
                RawCodec::<Req>::default(),
            )
            .await
        })
        .await
    }

    /// The node's lists through the streaming list calls, if the runtime offers them
    /// and they are not turned off (None: read the unary lists).
    async fn streamed_lists(
        &self,
        memo: Option<&mut ListMemo>,
    ) -> Result<Option<NodeLists>, RuntimeError> {
        if !self.streaming.should_try() {
            return Ok(None);
        }
        self.streaming
            .node_lists(
                &self.raw,
                memo.map(|memo| (&self.sunk, memo)),
                self.timeout,
                self.max_message_size,
            )
            .await
    }

    /// A too-large list's error with what would read it instead.
    fn hinted(&self, e: RuntimeError) -> RuntimeError {
        match e {
            RuntimeError::RuntimeTooLarge {
                op,
                size,
                limit,
                message,
                ..
            } => RuntimeError::RuntimeTooLarge {
                op,
                size,
                limit,
                hint: self.streaming.unary_hint(),
                message,
            },
            e => e,
        }
    }
}

/// A failed call's status as a [`RuntimeError`], for a call made with `timeout`:
/// tonic enforces the request's timeout itself and reports it as `Cancelled`
/// ("Timeout expired"), which is the timeout it is, not a cancellation.
pub(crate) fn call_error(
    op: &'static str,
    limit: usize,
    timeout: Duration,
    status: tonic::Status,
) -> RuntimeError {
    let tonics_deadline = status.code() == tonic::Code::Cancelled
        && status.message() == tonic::TimeoutExpired(()).to_string();
    if tonics_deadline {
        return RuntimeError::Timeout { op, timeout };
    }
    status_error(op, limit, status)
}

/// A failed call's status as a [`RuntimeError`]. A response too large for one
/// message is told apart by whose limit it hit: plegd's receive limit (tonic's
/// decoder refuses it: OutOfRange, "decoded message length too large: found N bytes,
/// the limit is: M bytes") or the runtime's send limit (the runtime refuses to send
/// it: grpc-go's ResourceExhausted "trying to send message larger than max (N vs.
/// M)", as containerd and CRI-O answer, or a tonic server's OutOfRange "encoded
/// message length too large").
pub(crate) fn status_error(op: &'static str, limit: usize, status: tonic::Status) -> RuntimeError {
    let message = status.message();
    let (size, their_limit) = first_two_numbers(message);
    match status.code() {
        tonic::Code::OutOfRange if message.contains("decoded message length too large") => {
            return RuntimeError::TooLarge {
                op,
                limit,
                size,
                message: message.to_string(),
            }
        }
        tonic::Code::OutOfRange if message.contains("encoded message length too large") => {}
        tonic::Code::ResourceExhausted if message.contains("send message larger than max") => {}
        code => {
            return RuntimeError::Rpc {
                op,
                code,
                message: message.to_string(),
            }
        }
    }
    RuntimeError::RuntimeTooLarge {
        op,
        size,
        limit: their_limit,
        hint: "",
        message: message.to_string(),
    }
}

/// The first two unsigned numbers in `text` (a message size and a limit, as the gRPC
/// stacks word them).
fn first_two_numbers(text: &str) -> (Option<usize>, Option<usize>) {
    let mut numbers = text
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().ok());
    (numbers.next().flatten(), numbers.next().flatten())
}

pub(crate) fn request<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(timeout);
    req
}

#[async_trait]
impl RuntimeClient for CriRuntime {
    async fn version(&self) -> Result<RuntimeVersion, RuntimeError> {
        let v = self
            .unary("Version", |mut c, t| async move {
                c.version(request(cri::VersionRequest::default(), t)).await
            })
            .await?;
        Ok(RuntimeVersion {
            runtime_name: v.runtime_name,
            runtime_version: v.runtime_version,
            runtime_api_version: v.runtime_api_version,
        })
    }

    async fn list_sandboxes(&self, id: Option<&str>) -> Result<Vec<Sandbox>, RuntimeError> {
        let req = cri::ListPodSandboxRequest {
            filter: id.map(|id| cri::PodSandboxFilter {
                id: id.to_string(),
                ..Default::default()
            }),
        };
        const OP: &str = "ListPodSandbox";
        let bytes = self
            .raw_unary(OP, "/runtime.v1.RuntimeService/ListPodSandbox", req)
            .await?;
        let resp = SandboxesRead::decode(bytes).map_err(|e| RuntimeError::Invalid {
            op: OP,
            reason: e.to_string(),
        })?;
        // One sandbox plegd cannot attribute (no metadata or an empty UID, e.g. run by
        // crictl: containerd only requires metadata) must not fail the whole node's
        // relist; its containers are left out with it.
        Ok(resp
            .items
            .into_iter()
            .filter_map(|s| {
                convert::sandbox_from_listed(s.into())
                    .map_err(|e| tracing::debug!(error = %e, "ignoring a listed sandbox"))
                    .ok()
            })
            .collect())
    }

    async fn list_containers(
        &self,
        sandbox_id: Option<&str>,
    ) -> Result<Vec<Container>, RuntimeError> {
        let filter = sandbox_id.map(|id| cri::ContainerFilter {
            pod_sandbox_id: id.to_string(),
            ..Default::default()
        });
        self.list_containers_by(filter).await
    }

    async fn container_by_id(&self, id: &str) -> Result<Option<Container>, RuntimeError> {
        let filter = cri::ContainerFilter {
            id: id.to_string(),
            ..Default::default()
        };
        let listed = self.list_containers_by(Some(filter)).await?;
        // A runtime that ignored the filter still answers only for this ID.
        Ok(listed.into_iter().find(|c| c.id == id))
    }

    /// The two lists undecoded: the global relist reads them in place and decodes only
    /// the pods that changed. Both are in flight at once: a global relist
    /// waits for one round trip, not two (targeted requests wait for it). Either
    /// failing fails both. Through the streaming list calls when the runtime offers
    /// them ([`crate::list_streaming`]), else the unary ones.
    async fn list_node(&self) -> Result<NodeLists, RuntimeError> {
        if let Some(lists) = self.streamed_lists(None).await? {
            return Ok(lists);
        }
        let sandboxes = self.raw_unary(
            "ListPodSandbox",
            "/runtime.v1.RuntimeService/ListPodSandbox",
            cri::ListPodSandboxRequest::default(),
        );
        let containers = self.raw_unary(
            "ListContainers",
            "/runtime.v1.RuntimeService/ListContainers",
            cri::ListContainersRequest::default(),
        );
        match futures::try_join!(sandboxes, containers) {
            Ok((sandboxes, containers)) => Ok(NodeLists::Wire {
                sandboxes,
                containers,
            }),
            Err(e) => Err(self.hinted(e)),
        }
    }

    /// [`RuntimeClient::list_node`], both lists read as they arrive, with `memo`
    /// ([`crate::list_sink`]): never a whole response in memory at once.
    async fn list_node_memo(&self, memo: &mut ListMemo) -> Result<NodeLists, RuntimeError> {
        if let Some(lists) = self.streamed_lists(Some(memo)).await? {
            return Ok(lists);
        }
        let sandbox_sink = Sink::<SandboxList>::new(self.max_message_size, memo);
        let container_sink = Sink::<ContainerList>::new(self.max_message_size, memo);
        let called = futures::join!(
            self.sunk_list(
                "ListPodSandbox",
                "/runtime.v1.RuntimeService/ListPodSandbox",
                cri::ListPodSandboxRequest::default(),
                &sandbox_sink,
            ),
            self.sunk_list(
                "ListContainers",
                "/runtime.v1.RuntimeService/ListContainers",
                cri::ListContainersRequest::default(),
                &container_sink,
            )
        );
        let sandboxes = sandbox_sink.outcome("ListPodSandbox", called.0.map(|m| vec![m]), memo);
        let containers = container_sink.outcome("ListContainers", called.1.map(|m| vec![m]), memo);
        let lists = match (sandboxes, containers) {
            (Ok(sandboxes), Ok(containers)) => Ok(NodeLists::Sunk {
                sandboxes,
                containers,
            }),
            (Err(e), _) | (_, Err(e)) => Err(self.hinted(e)),
        };
        if lists.is_err() {
            // What the sinks' reads marked in the memo is forgotten.
            memo.finish(false);
        }
        lists
    }

    async fn sandbox_status(&self, sandbox_id: &str) -> Result<Sandbox, RuntimeError> {
        let pod_sandbox_id = sandbox_id.to_string();
        let resp = self
            .unary("PodSandboxStatus", |mut c, t| async move {
                c.pod_sandbox_status(request(
                    cri::PodSandboxStatusRequest {
                        pod_sandbox_id,
                        verbose: false,
                    },
                    t,
                ))
                .await
            })
            .await?;
        let status = resp.status.ok_or_else(|| RuntimeError::Invalid {
            op: "PodSandboxStatus",
            reason: format!("no status for sandbox {sandbox_id}"),
        })?;
        convert::sandbox_status_from_wire(&status)
    }

    async fn container_status(&self, container_id: &str) -> Result<ContainerStatus, RuntimeError> {
        let bytes = self
            .raw_unary(
                "ContainerStatus",
                "/runtime.v1.RuntimeService/ContainerStatus",
                cri::ContainerStatusRequest {
                    container_id: container_id.to_string(),
                    verbose: false,
                },
            )
            .await?;
        // The sandbox ID is filled in by the caller, which knows it from ListContainers.
        status_read::container_status(&bytes, container_id)
    }

    async fn container_events(&self) -> Result<EventStream, RuntimeError> {
        const OP: &str = "GetContainerEvents";
        let mut grpc = self.stream.clone();
        let limit = self.max_message_size;
        grpc.ready().await.map_err(|e| {
            status_error(
                OP,
                limit,
                tonic::Status::unknown(format!("Service was not ready: {e}")),
            )
        })?;
        let resp = grpc
            .server_streaming(
                tonic::Request::new(cri::GetEventsRequest::default()),
                PathAndQuery::from_static("/runtime.v1.RuntimeService/GetContainerEvents"),
                tonic_prost::ProstCodec::<cri::GetEventsRequest, EventRead>::default(),
            )
            .await
            .map_err(|s| status_error(OP, limit, s))?;
        Ok(resp
            .into_inner()
            .map(move |item| {
                item.map(cri::ContainerEventResponse::from)
                    .map_err(|s| status_error(OP, limit, s))
            })
            .boxed())
    }

    async fn task_events(&self) -> Result<TaskEventStream, RuntimeError> {
        const OP: &str = "Events/Subscribe";
        let mut client = self.events.clone();
        let req = SubscribeRequest {
            filters: containerd_events::subscribe_filters(),
        };
        let resp = client
            .subscribe(req)
            .await
            .map_err(|s| status_error(OP, self.max_message_size, s))?;
        let limit = self.max_message_size;
        Ok(resp
            .into_inner()
            .map(move |item| item.map_err(|s| status_error(OP, limit, s)))
            .boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_parsed_strictly() {
        assert_eq!(
            parse_unix_endpoint("unix:///run/containerd/containerd.sock").ok(),
            Some(PathBuf::from("/run/containerd/containerd.sock"))
        );
        for bad in [
            "tcp://127.0.0.1:1234",
            "/run/containerd/containerd.sock",
            "unix://relative.sock",
            "",
        ] {
            let err = parse_unix_endpoint(bad).err();
            assert!(
                matches!(err, Some(RuntimeError::BadEndpoint { .. })),
                "{bad:?} accepted"
            );
        }
        let long = format!("unix:///{}", "x".repeat(120));
        assert!(parse_unix_endpoint(&long).is_err());
    }

    /// A response too large for one message, as each side's gRPC stack reports it,
    /// names whose limit it hit and the sizes; other statuses stay what they were.
    #[test]
    fn a_response_too_large_names_whose_limit_it_hit() {
        const OURS: usize = 16 << 20;
        // tonic's decoder, in plegd: our receive limit.
        let ours = status_error(
            "ListContainers",
            OURS,
            tonic::Status::out_of_range(
                "Error, decoded message length too large: found 17825792 bytes, the limit is: 16777216 bytes",
            ),
        );
        assert!(
            matches!(
                ours,
                RuntimeError::TooLarge {
                    op: "ListContainers",
                    limit: OURS,
                    size: Some(17825792),
                    ..
                }
            ),
            "{ours:?}"
        );
        assert!(
            ours.to_string().contains("--runtime-max-message-size"),
            "{ours}"
        );
        // grpc-go in containerd or CRI-O: the runtime's send limit.
        let theirs = status_error(
            "ListContainers",
            OURS,
            tonic::Status::resource_exhausted(
                "grpc: trying to send message larger than max (16779959 vs. 16777216)",
            ),
        );
        assert!(
            matches!(
                theirs,
                RuntimeError::RuntimeTooLarge {
                    op: "ListContainers",
                    size: Some(16779959),
                    limit: Some(16777216),
                    ..
                }
            ),
            "{theirs:?}"
        );
        assert_eq!(theirs.code(), tonic::Code::ResourceExhausted);
        let text = theirs.to_string();
        assert!(
            text.contains("runtime's own send limit of 16777216 bytes"),
            "{text}"
        );
        assert!(text.contains("not of plegd"), "{text}");
        assert!(!text.contains("--runtime-max-message-size"), "{text}");
        // A runtime on tonic refusing to encode it: also the runtime's.
        let tonic_server = status_error(
            "ListPodSandbox",
            OURS,
            tonic::Status::out_of_range(
                "Error, encoded message length too large: found 20 bytes, the limit is: 10 bytes",
            ),
        );
        assert!(
            matches!(
                tonic_server,
                RuntimeError::RuntimeTooLarge {
                    size: Some(20),
                    limit: Some(10),
                    ..
                }
            ),
            "{tonic_server:?}"
        );
        // Other exhausted resources are not a size.
        let other = status_error(
            "ListPodSandbox",
            OURS,
            tonic::Status::resource_exhausted("too many requests"),
        );
        assert!(
            matches!(
                other,
                RuntimeError::Rpc {
                    code: tonic::Code::ResourceExhausted,
                    ..
                }
            ),
            "{other:?}"
        );
    }
}
