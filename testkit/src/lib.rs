//! What plegd's tests (`integration-tests`, `plegd/tests`), its benchmark
//! (`plegd-bench`) and the compose demo's workload (`plegd-workload`) share, written
//! once. A crate of its own, not part of `integration-tests`: the benchmark and the
//! workload are shipped binaries, and `integration-tests` would bring its test-only
//! dependencies (the simulator, the actors, plotters, OTLP) into them.
//!
//! - [`cri`]: the busybox host-network pod and a CRI client that makes, reads and
//!   removes such pods.
//! - [`process`]: a child process stopped on drop, a free port, a one-shot HTTP GET,
//!   a process's `/proc` figures.
//! - [`metrics`]: Prometheus text, read.

pub mod cri;
pub mod metrics;
pub mod process;
