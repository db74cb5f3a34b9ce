//! CRI's streaming list calls, StreamPodSandboxes and StreamContainers (KEP-5825),
//! served beside the unary `RuntimeService` ([`CriService`]): the same entries as
//! ListPodSandbox and ListContainers, in messages of `stream_batch` entries each, each
//! under the send limit ([`crate::ListServing`]). A runtime built before them answers
//! UNIMPLEMENTED, in grpc-go's words (containerd's and CRI-O's): so does this one
//! unless [`crate::ListServing::streaming`] is set.
//!
//! Both services are `runtime.v1.RuntimeService`, and a tonic router takes each
//! service name once, so [`CriService`] is that name and hands each call to the one
//! that serves its method.

use std::convert::Infallible;
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::StreamExt;
use plegd_runtime::cri::runtime_service_server::RuntimeServiceServer;
use plegd_runtime::list_streaming::proto::{
    StreamContainersRequest, StreamContainersResponse, StreamPodSandboxesRequest,
    StreamPodSandboxesResponse,
};
use plegd_runtime::list_streaming::{STREAM_CONTAINERS, STREAM_POD_SANDBOXES};
use tonic::body::Body;
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;
use tonic::{Request, Response, Status};

use crate::fake::ListServing;
use crate::server::{within_send_limit, CriServer};

#[allow(
    clippy::all,
    missing_docs,
    unreachable_pub,
    rust_2018_idioms,
    trivial_casts,
    unused_lifetimes
)]
mod generated {
    tonic::include_proto!("runtime.v1");
}

use generated::runtime_service_server::{self as streaming, RuntimeServiceServer as Streams};

/// The simulated runtime's `runtime.v1.RuntimeService`: the unary calls
/// ([`CriServer`]) and the streaming list calls.
#[derive(Clone)]
pub struct CriService {
    unary: RuntimeServiceServer<CriServer>,
    streams: Streams<StreamingLists>,
}

impl CriService {
    pub fn new(server: CriServer) -> Self {
        CriService {
            streams: Streams::new(StreamingLists(server.clone())),
            unary: RuntimeServiceServer::new(server),
        }
    }
}

impl NamedService for CriService {
    const NAME: &'static str = "runtime.v1.RuntimeService";
}

impl Service<http::Request<Body>> for CriService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Both generated services are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        match req.uri().path() {
            STREAM_POD_SANDBOXES | STREAM_CONTAINERS => self.streams.call(req),
            _ => self.unary.call(req),
        }
    }
}

/// The streaming list calls over the same runtime as the unary ones.
#[derive(Clone)]
struct StreamingLists(CriServer);

type Messages<T> = BoxStream<'static, Result<T, Status>>;

/// grpc-go's answer for a method its server does not have.
fn unknown_method(method: &str) -> Status {
    Status::unimplemented(format!(
        "unknown method {method} for service runtime.v1.RuntimeService"
    ))
}

/// `entries` in messages of `serving.stream_batch` each, made by `message`; a message
/// over the send limit fails the stream there (the ones before it were sent).
fn batched<E, M>(
    entries: Vec<E>,
    serving: ListServing,
    message: impl Fn(Vec<E>) -> M,
) -> Messages<M>
where
    E: Send + 'static,
    M: tonic_prost::prost::Message + Send + 'static,
{
    let per = serving.stream_batch.max(1);
    let mut out = Vec::new();
    let mut entries = entries.into_iter().peekable();
    while entries.peek().is_some() {
        let m = message(entries.by_ref().take(per).collect());
        match within_send_limit(&m, serving.send_limit) {
            Ok(()) => out.push(Ok(m)),
            Err(refused) => {
                out.push(Err(refused));
                break;
            }
        }
    }
    futures::stream::iter(out).boxed()
}

#[tonic::async_trait]
impl streaming::RuntimeService for StreamingLists {
    type StreamPodSandboxesStream = Messages<StreamPodSandboxesResponse>;

    async fn stream_pod_sandboxes(
        &self,
        req: Request<StreamPodSandboxesRequest>,
    ) -> Result<Response<Self::StreamPodSandboxesStream>, Status> {
        let serving = self.0.runtime().list_stream_called(false);
        if !serving.streaming {
            return Err(unknown_method("StreamPodSandboxes"));
        }
        let filter = req.into_inner().filter.unwrap_or_default();
        let items = self.0.sandboxes_listed(filter).await?;
        Ok(Response::new(batched(items, serving, |pod_sandboxes| {
            StreamPodSandboxesResponse { pod_sandboxes }
        })))
    }

    type StreamContainersStream = Messages<StreamContainersResponse>;

    async fn stream_containers(
        &self,
        req: Request<StreamContainersRequest>,
    ) -> Result<Response<Self::StreamContainersStream>, Status> {
        let serving = self.0.runtime().list_stream_called(true);
        if !serving.streaming {
            return Err(unknown_method("StreamContainers"));
        }
        let filter = req.into_inner().filter.unwrap_or_default();
        let containers = self.0.containers_listed(filter).await?;
        Ok(Response::new(batched(containers, serving, |containers| {
            StreamContainersResponse { containers }
        })))
    }
}
