//! The runtime boundary: what plegd needs from a CRI runtime, as one trait with two
//! implementations — [`cri::CriRuntime`] (tonic over a unix socket) and
//! [`fake::FakeRuntime`] (in memory, scriptable, with fault injection).
//!
//! The domain types here are plegd's view of CRI objects: just what the Generic PLEG
//! diffs and caches. Pod identity (UID, name, namespace) always comes from the
//! sandbox's metadata, never from `io.kubernetes.*` labels (pods made by crictl or
//! other clients do not carry them).

pub mod convert;
pub mod cri;
pub mod fake;

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use plegd_protocol::cri::ContainerEventResponse;

/// Wall-clock nanoseconds since the Unix epoch (CRI's time unit).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Who a pod is, as its sandbox's metadata says.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct PodRef {
    pub uid: String,
    pub name: String,
    pub namespace: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SandboxState {
    Ready,
    NotReady,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// A sandbox as ListPodSandbox reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sandbox {
    pub id: String,
    pub pod: PodRef,
    pub attempt: u32,
    pub state: SandboxState,
    /// Nanoseconds since the Unix epoch.
    pub created_at: i64,
}

/// A container as ListContainers reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    pub attempt: u32,
    pub state: ContainerState,
    pub created_at: i64,
}

/// PodSandboxStatus of one sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxStatus {
    pub id: String,
    pub pod: PodRef,
    pub attempt: u32,
    pub state: SandboxState,
    pub created_at: i64,
}

/// ContainerStatus of one container. Times are nanoseconds since the Unix epoch, 0 if unset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerStatus {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    pub attempt: u32,
    pub state: ContainerState,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
}

/// What the runtime says about itself (CRI Version).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeVersion {
    pub runtime_name: String,
    pub runtime_version: String,
    pub runtime_api_version: String,
}

/// The raw CRI event stream. Items are the wire messages, unvalidated: the
/// StreamWatcher validates them and never stores their payload.
pub type EventStream = BoxStream<'static, Result<ContainerEventResponse, RuntimeError>>;

/// Every way a runtime call can fail. `code` is the gRPC status code where there is
/// one, so callers can tell Unimplemented or NotFound apart from transport failures.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("bad runtime endpoint {endpoint:?}: {reason}")]
    BadEndpoint { endpoint: String, reason: String },
    #[error("cannot reach the runtime at {endpoint}: {reason}")]
    Unreachable { endpoint: String, reason: String },
    #[error("{op} failed: {code:?}: {message}")]
    Rpc {
        op: &'static str,
        code: tonic::Code,
        message: String,
    },
    #[error("{op} timed out after {timeout:?}")]
    Timeout { op: &'static str, timeout: Duration },
    #[error("{op} returned an invalid response: {reason}")]
    Invalid { op: &'static str, reason: String },
}

impl RuntimeError {
    /// The gRPC code this error corresponds to.
    pub fn code(&self) -> tonic::Code {
        match self {
            RuntimeError::BadEndpoint { .. } => tonic::Code::InvalidArgument,
            RuntimeError::Unreachable { .. } => tonic::Code::Unavailable,
            RuntimeError::Rpc { code, .. } => *code,
            RuntimeError::Timeout { .. } => tonic::Code::DeadlineExceeded,
            RuntimeError::Invalid { .. } => tonic::Code::Internal,
        }
    }

    /// True when the object asked for does not exist (it went away between calls).
    pub fn is_not_found(&self) -> bool {
        self.code() == tonic::Code::NotFound
    }
}

/// What plegd reads from a container runtime.
#[async_trait]
pub trait RuntimeClient: Send + Sync + 'static {
    /// CRI Version: checked once at start (is this a CRI server at all?).
    async fn version(&self) -> Result<RuntimeVersion, RuntimeError>;
    /// ListPodSandbox, unfiltered.
    async fn list_sandboxes(&self) -> Result<Vec<Sandbox>, RuntimeError>;
    /// ListContainers, optionally only those of one sandbox.
    async fn list_containers(
        &self,
        sandbox_id: Option<&str>,
    ) -> Result<Vec<Container>, RuntimeError>;
    /// PodSandboxStatus of one sandbox.
    async fn sandbox_status(&self, sandbox_id: &str) -> Result<SandboxStatus, RuntimeError>;
    /// ContainerStatus of one container.
    async fn container_status(&self, container_id: &str) -> Result<ContainerStatus, RuntimeError>;
    /// Opens GetContainerEvents. May resolve only when the first event arrives
    /// (containerd sends no headers before it): never put a deadline on it.
    async fn container_events(&self) -> Result<EventStream, RuntimeError>;
}
