//! Why the simulator (its server or its churn workload) could not be started.

use std::path::PathBuf;

/// Why the simulator could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("bad socket path {path:?}: {reason}")]
    BadPath { path: PathBuf, reason: String },
    #[error("cannot create socket {path:?}: directory {dir:?} does not exist")]
    MissingDirectory { path: PathBuf, dir: PathBuf },
    #[error("{path:?} exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("a server is already listening on {path:?}")]
    InUse { path: PathBuf },
    #[error("cannot remove stale socket {path:?}: {source}")]
    StaleSocket {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot bind {path:?}: {source}")]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start a simulator thread: {source}")]
    Thread { source: std::io::Error },
    #[error("cannot build the simulator's tokio runtime: {source}")]
    Runtime { source: std::io::Error },
    #[error("the simulator thread exited before it was serving")]
    ThreadExited,
}
