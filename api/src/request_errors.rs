//! A malformed or oversized request is the client's error: INVALID_ARGUMENT. tonic
//! answers them itself, before any handler runs, with OUT_OF_RANGE (a message longer
//! than the limit; refused from its length prefix, before its body is read) or
//! INTERNAL: bytes that do not decode, a compressed flag without `grpc-encoding` (the
//! gRPC compression spec asks for INTERNAL there; plegd's API says every malformed
//! request is INVALID_ARGUMENT), a flag that is neither 0 nor 1, a stream that ends
//! inside a message (a length prefix or a body cut off), a unary or server-streaming
//! call without its request message. This layer rewrites exactly those answers, told
//! by tonic 0.14's messages ([`DECODE_ERRORS`]); for the messages of a client stream
//! (Sync), the handler maps them with [`as_invalid_argument`]. Other refusals keep
//! their code: an unknown method is UNIMPLEMENTED, an unsupported `grpc-encoding`
//! UNIMPLEMENTED (as the spec says).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codegen::http;
use tonic::Code;

/// How tonic's own decode errors begin (tonic 0.14's `codec/decode.rs` and
/// `server/grpc.rs`; prost's DecodeError). A test of each sends the bytes that cause
/// it (integration-tests `api_malformed`), so a tonic that words them differently
/// fails there.
const DECODE_ERRORS: [(Code, &str); 6] = [
    (Code::OutOfRange, "Error, decoded message length too large"),
    (Code::Internal, "failed to decode Protobuf message"),
    (
        Code::Internal,
        "protocol error: received message with compressed-flag but no grpc-encoding",
    ),
    (
        Code::Internal,
        "protocol error: received message with invalid compression flag",
    ),
    (Code::Internal, "Unexpected EOF decoding stream"),
    (Code::Internal, "Missing request message"),
];

fn is_decode_error(code: Code, message: &str) -> bool {
    DECODE_ERRORS
        .iter()
        .any(|(c, prefix)| *c == code && message.starts_with(prefix))
}

/// A decode error of a request message → INVALID_ARGUMENT; other statuses unchanged.
pub fn as_invalid_argument(status: tonic::Status) -> tonic::Status {
    if is_decode_error(status.code(), status.message()) {
        tonic::Status::invalid_argument(format!("bad request: {}", status.message()))
    } else {
        status
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct RequestErrorsLayer;

impl<S> tower::Layer<S> for RequestErrorsLayer {
    type Service = RequestErrors<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestErrors { inner }
    }
}

#[derive(Clone, Debug)]
pub struct RequestErrors<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for RequestErrors<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut response = fut.await?;
            // A status in the headers: tonic's trailers-only answer, given before any
            // message (so before any handler of ours could have run).
            if let Some(status) = tonic::Status::from_header_map(response.headers()) {
                if is_decode_error(status.code(), status.message()) {
                    let rewritten = as_invalid_argument(status);
                    let headers = response.headers_mut();
                    headers.remove("grpc-message");
                    if let Err(e) = rewritten.add_header(headers) {
                        tracing::debug!(error = %e, "cannot rewrite a decode error");
                    }
                }
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tonics_decode_errors_are_rewritten() {
        let too_long = tonic::Status::out_of_range(
            "Error, decoded message length too large: found 70000 bytes, the limit is: 65536 bytes",
        );
        assert_eq!(as_invalid_argument(too_long).code(), Code::InvalidArgument);
        let garbage =
            tonic::Status::internal("failed to decode Protobuf message: invalid wire type");
        assert_eq!(as_invalid_argument(garbage).code(), Code::InvalidArgument);
        for tonics in [
            "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            "protocol error: received message with invalid compression flag: 2 (valid flags are 0 and 1), while sending request",
            "Unexpected EOF decoding stream.",
            "Missing request message.",
        ] {
            let status = as_invalid_argument(tonic::Status::internal(tonics));
            assert_eq!(status.code(), Code::InvalidArgument, "{tonics}");
            assert!(status.message().ends_with(tonics), "{status:?}");
        }
        for other in [
            tonic::Status::internal("something else"),
            tonic::Status::out_of_range("other"),
            tonic::Status::failed_precondition("Error, decoded message length too large"),
        ] {
            let code = other.code();
            assert_eq!(as_invalid_argument(other).code(), code);
        }
    }
}
