//! The client side, for plegd's CLI (`plegd watch`, `pods`, `status`), the example
//! node agent and the tests: a plegd.v1 client connected to a unix socket, with an
//! error that names the socket when nothing answers there.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use plegd_protocol::v1::plegd_client::PlegdClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::server::MAX_RESPONSE_BYTES;

/// The default socket of `plegd run` and of the clients.
pub const DEFAULT_SOCKET: &str = "/run/plegd/plegd.sock";
/// The default control socket (Sync, RequestRelist) of `plegd run`.
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/plegd/plegd-control.sock";

#[derive(Debug, thiserror::Error)]
#[error("no plegd answers at {}: {reason}", path.display())]
pub struct Unreachable {
    pub path: PathBuf,
    pub reason: String,
}

/// Connects to the plegd serving `path` (fails at once when nothing answers).
pub async fn connect(path: &Path) -> Result<PlegdClient<Channel>, Unreachable> {
    let socket = path.to_path_buf();
    // The URI is a placeholder: the connector dials the socket.
    let channel = Endpoint::from_static("http://plegd.local")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { dial(&socket).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|e| Unreachable {
            path: path.to_owned(),
            reason: source_chain(&e),
        })?;
    Ok(PlegdClient::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES))
}

/// Connects to `socket`. A full backlog (plegd busy accepting a flood of connections)
/// answers EAGAIN at once: that is tried again after a short pause, within the
/// connect timeout.
async fn dial(socket: &Path) -> std::io::Result<UnixStream> {
    let mut pause = Duration::from_millis(1);
    loop {
        match UnixStream::connect(socket).await {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            done => return done,
        }
    }
}

/// The deepest cause of an error: "connection refused", "no such file or directory".
fn source_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}
