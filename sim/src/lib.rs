//! plegd-sim: a simulated CRI runtime. A real CRI v1 gRPC server on a unix socket
//! over plegd's in-memory [`FakeRuntime`], so plegd (and tests) can run the real
//! tonic client against scripted state, faults, latency, event streams and runtime
//! restarts — with no containerd on the machine.
//!
//! - [`server`]: the `RuntimeService` implementation ([`CriServer`]).
//! - [`socket`]: serving it on a unix socket, in the caller's tokio runtime
//!   ([`serve_unix`]) or on a thread of its own ([`spawn_in_thread`]).
//! - [`churn`]: a seeded workload of pods and containers coming and going, for
//!   `plegd demo`.

mod checked;
pub mod churn;
mod error;
mod filter;
mod lifecycle;
pub mod server;
pub mod socket;

pub use churn::{spawn_churn, Churn, ChurnConfig, ChurnHandle, ChurnStats, ChurnStep};
pub use error::SimError;
pub use lifecycle::{KILL_EXIT_CODE, STOP_EXIT_CODE};
pub use plegd_actors::runtime::fake::{FakeRuntime, Op};
pub use server::CriServer;
pub use socket::{
    serve_unix, spawn_in_thread, SimServer, ThreadedSimServer, SHUTDOWN_GRACE, THREAD_STOP_GRACE,
};
