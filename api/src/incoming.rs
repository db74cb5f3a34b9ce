//! The API socket's connections, bounded: at most `max` are served at once, and the
//! next waits in the kernel's backlog until one closes (each connection is a file
//! descriptor of plegd's, which also needs some for its runtime and its output). An
//! accept that fails (out of descriptors) is retried after a pause instead of at once,
//! so it cannot spin the API thread.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::Connected;

/// Pause after a failed accept.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// A connection holding one of the permits.
pub struct Limited {
    stream: UnixStream,
    _permit: OwnedSemaphorePermit,
}

/// The connections of `listener`, at most `max` at once.
pub fn bounded(
    listener: UnixListener,
    max: usize,
) -> impl Stream<Item = io::Result<Limited>> + Send + 'static {
    let permits = Arc::new(Semaphore::new(max.max(1)));
    futures::stream::unfold((listener, permits), |(listener, permits)| async move {
        // Closed only when dropped: never here.
        let permit = permits.clone().acquire_owned().await.ok()?;
        let mut told = false;
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let conn = Limited {
                        stream,
                        _permit: permit,
                    };
                    return Some((Ok(conn), (listener, permits)));
                }
                Err(e) => {
                    if !told {
                        tracing::warn!(error = %e, "cannot accept an API connection; retrying");
                        told = true;
                    }
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            }
        }
    })
}

impl Connected for Limited {
    type ConnectInfo = <UnixStream as Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
