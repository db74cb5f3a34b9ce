//! plegd-sim: a simulated CRI runtime. A real CRI v1 gRPC server on a unix socket
//! over an in-memory, scriptable runtime ([`FakeRuntime`], which tests also call
//! directly as a `plegd_runtime::RuntimeClient`), so plegd (and tests) can run the real
//! tonic client against scripted state, faults, latency, event streams and runtime
//! restarts — with no containerd on the machine.
//!
//! - [`server`]: the `RuntimeService` implementation ([`CriServer`]), with the
//!   streaming list calls beside it ([`list_streaming`]);
//!   [`events_server`]: containerd's event service beside it, as containerd serves it.
//! - [`socket`]: serving it on a unix socket, in the caller's tokio runtime
//!   ([`serve_unix`]) or on a thread of its own ([`spawn_in_thread`]).
//! - [`churn`]: a seeded workload of pods and containers coming and going, for
//!   `plegd demo` (over [`FakeRuntime`]) and the compose demo's workload generator
//!   (over CRI, through [`ChurnRuntime`]).

pub mod churn;
mod cri_writes;
mod error;
pub mod events_server;
mod fake;
mod filter;
mod intercept;
pub mod kubelet;
pub mod list_streaming;
pub mod server;
pub mod socket;
mod wire;

pub use churn::{
    spawn_churn, Churn, ChurnConfig, ChurnHandle, ChurnRuntime, ChurnStats, ChurnStep,
};
pub use cri_writes::{KILL_EXIT_CODE, STOP_EXIT_CODE};
pub use error::SimError;
pub use fake::{EventFilter, FakeRuntime, ListServing, ListStreamCalls, Op, CONTAINERD_SEND_LIMIT};
pub use intercept::{Intercept, Intercepted};
pub use kubelet::{ContainerMeta, Kubelet};
pub use server::CriServer;
pub use socket::{
    serve_unix, spawn_in_thread, SimServer, ThreadedSimServer, SHUTDOWN_GRACE, THREAD_STOP_GRACE,
};
