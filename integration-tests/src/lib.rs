//! The test library: what the component, mock-CRI-server and real-containerd tests
//! (tests/) and the benchmarks (benches/) share, written once.
//!
//! - [`wait`]: condition waits with a generous timeout (never fixed sleeps) and event
//!   collection from a subscription.
//! - [`pleg`]: starting plegd's core over the fake runtime, a running pod, counters.
//! - [`sim`]: the simulated CRI server on a fresh socket, and CRI clients for it.
//! - [`soak`]: plegd as a process under churn and runtime restarts, sampled over time.
//! - [`containerd`]: a private real containerd (started by the project's script),
//!   serialised between tests, and a small CRI client for busybox pods.

pub mod containerd;
pub mod pleg;
pub mod sim;
pub mod soak;
pub mod wait;
