//! The test library: what the component, mock-CRI-server and real-containerd tests
//! (tests/) and the benchmarks (benches/) share, written once.
//!
//! - [`wait`]: condition waits with a generous timeout (never fixed sleeps) and event
//!   collection from a subscription.
//! - [`api`]: the subscriber API served over the fake runtime, and clients for it.
//! - [`pleg`]: starting plegd's core over the fake runtime, a running pod, counters.
//! - [`process`]: plegd as a process (start, signal, wait, HTTP GET).
//! - [`sim`]: the simulated CRI server on a fresh socket, and CRI clients for it.
//! - [`traces`]: the identity test spans are exported under.
//! - [`otlp`]: in-process OTLP collectors (a logs receiver, one that refuses, one
//!   that stalls).
//! - [`chaos`]: the seeded chaos suite's engine (schedules, execution, checks).
//! - [`soak`]: plegd as a process under churn and runtime restarts, sampled over time.
//! - [`containerd`]: a private real containerd (started by the project's script),
//!   serialised between tests, and a small CRI client for busybox pods.

pub mod api;
pub mod chaos;
pub mod containerd;
pub mod otlp;
pub mod pleg;
pub mod process;
pub mod sim;
pub mod soak;
pub mod traces;
pub mod wait;
