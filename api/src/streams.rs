//! Counts the streams open on each API connection, for its idle timeout
//! ([`crate::incoming`]): a request's stream is open from the call until its response
//! body is dropped (a Watch: until the stream ends). Also gives the handlers the
//! socket's [`UdsConnectInfo`], as tonic does for a plain unix stream.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};
use tonic::codegen::http;
use tonic::transport::server::UdsConnectInfo;

use crate::incoming::{ConnInfo, StreamGuard};

#[derive(Clone, Copy, Debug, Default)]
pub struct StreamsLayer;

impl<S> tower::Layer<S> for StreamsLayer {
    type Service = Streams<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Streams { inner }
    }
}

#[derive(Clone, Debug)]
pub struct Streams<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for Streams<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Tracked<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<ReqBody>) -> Self::Future {
        // Counted now, in the connection's own poll, before its next read.
        let guard = match req.extensions().get::<ConnInfo>().cloned() {
            Some(info) => {
                req.extensions_mut().insert::<UdsConnectInfo>(info.uds);
                Some(info.activity.begin())
            }
            None => None,
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let response = fut.await?;
            Ok(response.map(|inner| Tracked {
                inner,
                _guard: guard,
            }))
        })
    }
}

/// A response body that keeps its stream counted as open.
pub struct Tracked<B> {
    inner: B,
    _guard: Option<StreamGuard>,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
