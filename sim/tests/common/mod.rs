//! Helpers shared by the simulator's tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plegd_runtime::cri::runtime_service_client::RuntimeServiceClient;
use plegd_runtime::CriRuntime;
use plegd_sim::{serve_unix, FakeRuntime, SimServer};
use tempfile::TempDir;
use tonic::transport::Channel;

/// Generous: CI machines are slow, and a passing test never waits this long.
pub const PATIENCE: Duration = Duration::from_secs(10);
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

pub fn socket_in(dir: &TempDir) -> PathBuf {
    dir.path().join("cri.sock")
}

/// A server over `runtime` on a fresh socket, and a CRI client for it.
pub async fn serve(runtime: &FakeRuntime) -> (TempDir, SimServer, CriRuntime) {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_unix(&socket_in(&dir), runtime.clone()).await.unwrap();
    let client = CriRuntime::new(&server.endpoint(), REQUEST_TIMEOUT).unwrap();
    (dir, server, client)
}

/// The generated client, for RPCs and request fields that plegd's client does not use.
pub fn raw_client(path: &Path) -> RuntimeServiceClient<Channel> {
    RuntimeServiceClient::new(plegd_runtime::unix_channel(path))
}

/// Polls `cond` until it holds; fails the test after [`PATIENCE`].
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
