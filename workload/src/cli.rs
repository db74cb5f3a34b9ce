//! The workload generator's flags (`plegd-workload --help`). Every flag can also be
//! set in the environment (`WORKLOAD_PODS=6`, ...).

use std::time::Duration;

use clap::Parser;

/// Creates and destroys pods through CRI, as a busy kubelet would, so that plegd has
/// lifecycle events to publish: containers are started, stopped (SIGTERM or SIGKILL)
/// and restarted as the next attempt, sandboxes are stopped and recreated, pods are
/// replaced. The steps are those of `plegd demo`'s simulated churn (plegd-sim), played
/// against a real runtime.
///
/// Pods use the node's network namespace (no CNI needed) and carry the label
/// plegd-demo=workload: leftovers of an earlier run are removed at start, and every
/// pod this run made is removed at SIGTERM or SIGINT (then it exits 0).
///
/// Exit status: 0 after SIGTERM/SIGINT or --steps; 1 when the runtime does not answer
/// within --wait or the image cannot be pulled; 2 for bad flags.
#[derive(Debug, Clone, Parser)]
#[command(name = "plegd-workload", version)]
pub struct Args {
    /// The CRI runtime's socket, unix:///path/to/socket.
    #[arg(
        long,
        env = "WORKLOAD_RUNTIME_ENDPOINT",
        value_name = "ENDPOINT",
        default_value = "unix:///run/containerd/containerd.sock"
    )]
    pub runtime_endpoint: String,

    /// The containers' image, pulled through CRI at start if missing. Its `sh` runs
    /// each container (trapping SIGTERM, so a graceful stop exits 143).
    #[arg(
        long,
        env = "WORKLOAD_IMAGE",
        value_name = "IMAGE",
        default_value = "docker.io/library/busybox:1.36"
    )]
    pub image: String,

    /// Pods kept alive (one or two containers each).
    #[arg(long, env = "WORKLOAD_PODS", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub pods: u32,

    /// Time between two steps.
    #[arg(long, env = "WORKLOAD_PERIOD", default_value = "3s", value_parser = positive_duration)]
    pub period: Duration,

    /// Seed of the step sequence (same seed, same story); default: the clock.
    #[arg(long, env = "WORKLOAD_SEED")]
    pub seed: Option<u64>,

    /// Stop after this many steps, removing the pods (default: run until SIGTERM).
    #[arg(long, env = "WORKLOAD_STEPS")]
    pub steps: Option<u64>,

    /// How long to wait at start for the runtime to answer CRI Version.
    #[arg(long, env = "WORKLOAD_WAIT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub wait: Duration,

    /// Deadline of each CRI call (RunPodSandbox may pull the pause image); pulling
    /// the containers' image gets ten times as long.
    #[arg(long, env = "WORKLOAD_REQUEST_TIMEOUT", default_value = "60s",
          value_parser = positive_duration)]
    pub request_timeout: Duration,

    /// Root of the pods' log directories, in the runtime's file system.
    #[arg(
        long,
        env = "WORKLOAD_LOG_ROOT",
        value_name = "DIR",
        default_value = "/var/log/pods"
    )]
    pub log_root: String,
}

fn positive_duration(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("must be more than zero".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}
