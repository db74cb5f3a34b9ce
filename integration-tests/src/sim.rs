//! The simulated CRI server from a test's side: a server over a `FakeRuntime` on a
//! fresh socket, plegd's CRI client for it, and the generated client for the RPCs
//! plegd's client does not make.

use std::path::{Path, PathBuf};
use std::time::Duration;

use plegd_runtime::cri::runtime_service_client::RuntimeServiceClient;
use plegd_runtime::CriRuntime;
use plegd_sim::{serve_unix, FakeRuntime, SimServer};
use tempfile::TempDir;
use tonic::transport::Channel;

/// Deadline of plegd's unary CRI calls in these tests.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// The socket path the helpers here use inside `dir`.
pub fn socket_in(dir: &TempDir) -> PathBuf {
    dir.path().join("cri.sock")
}

/// A server over `runtime` on a fresh socket, and a CRI client for it.
pub async fn serve(runtime: &FakeRuntime) -> (TempDir, SimServer, CriRuntime) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let server = serve_unix(&socket_in(&dir), runtime.clone())
        .await
        .expect("the simulated CRI server starts");
    let client =
        CriRuntime::new(&server.endpoint(), REQUEST_TIMEOUT).expect("a valid unix endpoint");
    (dir, server, client)
}

/// The generated client, for RPCs and request fields that plegd's client does not use.
pub fn raw_client(path: &Path) -> RuntimeServiceClient<Channel> {
    RuntimeServiceClient::new(plegd_runtime::unix_channel(path))
}
