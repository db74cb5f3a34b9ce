//! Command line: `plegd run` (a real CRI runtime) and `plegd demo` (the built-in
//! simulated runtime). Every value is checked here; a bad one fails at start with the
//! flag's name and the reason.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

const AFTER_HELP: &str = "\
Exit status: 0 after a clean shutdown (SIGTERM/SIGINT), 1 when the runtime cannot be
reached or is not a CRI v1 runtime at start, 2 for bad flags or configuration.

Configuration precedence: flags > environment (PLEGD_*, shown with each flag) >
the --config TOML file (keys are the flag names without dashes, e.g.
relist-period = '1s') > defaults. --print-config shows the result and exits.

Durations take units: 500ms, 1s, 3m. Logs go to stderr (RUST_LOG=debug for more).";

#[derive(Parser, Debug)]
#[command(
    name = "plegd",
    version,
    about = "Pod lifecycle events from a CRI runtime: polled for truth, hinted by the CRI event stream",
    after_help = AFTER_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Watch a real CRI runtime (containerd 1.7+/2.x, CRI-O) and publish its pods'
    /// lifecycle events. Events go to stdout as JSON lines unless --events-json says
    /// otherwise.
    #[command(after_help = AFTER_HELP)]
    Run(RunArgs),
    /// Run the whole service against a built-in simulated runtime (a real CRI gRPC
    /// server on a temporary unix socket, with pods starting, exiting, restarting and
    /// going away). Needs no container runtime. Prints readable events by default.
    #[command(after_help = AFTER_HELP)]
    Demo(DemoArgs),
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The CRI runtime's socket, as unix:///path/to/socket (required: here, in the
    /// environment or in the config file).
    #[arg(long, env = "PLEGD_RUNTIME_ENDPOINT", value_name = "ENDPOINT")]
    pub runtime_endpoint: Option<String>,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Pods the simulated node keeps running.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub pods: u32,
    /// Time between two churn steps (a container exits, restarts, a pod is replaced...).
    #[arg(long, default_value = "300ms", value_parser = parse_positive_duration)]
    pub churn_period: Duration,
    /// Seed of the churn workload (same seed, same story).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop after this long (default: run until SIGTERM/SIGINT).
    #[arg(long, value_parser = parse_positive_duration)]
    pub duration: Option<Duration>,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Period of the global relist, which runs whatever the event stream does.
    #[arg(long, env = "PLEGD_RELIST_PERIOD", default_value = "1s", value_parser = parse_positive_duration)]
    pub relist_period: Duration,
    /// /healthz fails when the last successful global relist is older than this.
    #[arg(long, env = "PLEGD_HEALTH_THRESHOLD", default_value = "3m", value_parser = parse_positive_duration)]
    pub health_threshold: Duration,
    /// Deadline of each unary CRI call.
    #[arg(long, env = "PLEGD_RUNTIME_REQUEST_TIMEOUT", default_value = "2s", value_parser = parse_positive_duration)]
    pub runtime_request_timeout: Duration,
    /// Capacity of the on-demand (targeted) relist queue; a full queue drops requests
    /// (counted) and the next global relist reconciles.
    #[arg(long, env = "PLEGD_QUEUE_CAPACITY", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub queue_capacity: u32,
    /// Pods whose status is read concurrently during a relist.
    #[arg(long, env = "PLEGD_STATUS_CONCURRENCY", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub status_concurrency: u32,
    /// Watch the CRI event stream (GetContainerEvents) to notice container exits in
    /// milliseconds. Only a hint: the global relist stays the source of truth.
    #[arg(long, env = "PLEGD_EVENTED", default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    pub evented: bool,
    /// Event stream: delay of the second reconnect attempt (the first is immediate);
    /// later ones grow exponentially, with jitter.
    #[arg(long, env = "PLEGD_RECONNECT_BASE", default_value = "500ms", value_parser = parse_positive_duration)]
    pub reconnect_base: Duration,
    /// Event stream: longest delay between reconnect attempts (also the retry period
    /// of a runtime that does not implement the stream).
    #[arg(long, env = "PLEGD_RECONNECT_CAP", default_value = "60s", value_parser = parse_positive_duration)]
    pub reconnect_cap: Duration,
    /// Event stream: a connection must stay up this long before the backoff resets.
    #[arg(long, env = "PLEGD_RECONNECT_HEALTHY_RESET", default_value = "60s", value_parser = parse_positive_duration)]
    pub reconnect_healthy_reset: Duration,
    /// Write events as JSON lines to PATH ('-' for stdout).
    #[arg(long, env = "PLEGD_EVENTS_JSON", value_name = "PATH|-")]
    pub events_json: Option<PathBuf>,
    /// Serve /metrics, /healthz and /readyz on this address ('off' to disable).
    #[arg(long, env = "PLEGD_METRICS_ADDR", default_value = "127.0.0.1:9464", value_parser = parse_metrics_addr)]
    pub metrics_addr: MetricsAddr,
    /// Export traces over OTLP/gRPC to this endpoint (e.g. http://127.0.0.1:4317).
    /// Unset: no trace export. The other standard OTEL_* variables (OTEL_SERVICE_NAME,
    /// OTEL_TRACES_SAMPLER, OTEL_SDK_DISABLED, ...) are honoured too.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_parser = parse_otlp_endpoint)]
    pub otlp_endpoint: Option<String>,
    /// A TOML file with any of the settings above (lower precedence than flags and
    /// environment).
    #[arg(long, env = "PLEGD_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration (TOML) and exit.
    #[arg(long)]
    pub print_config: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsAddr {
    Off,
    On(SocketAddr),
}

pub fn parse_otlp_endpoint(s: &str) -> Result<String, String> {
    match s.split_once("://") {
        Some(("http" | "https", rest)) if !rest.is_empty() => Ok(s.to_string()),
        _ => Err("expected http://HOST:PORT or https://HOST:PORT (OTLP over gRPC)".into()),
    }
}

pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    if s.trim_start().starts_with('-') {
        return Err("must not be negative".into());
    }
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 1s, 3m)"))?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}

pub fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    if s == "off" {
        return Ok(MetricsAddr::Off);
    }
    s.parse::<SocketAddr>()
        .map(MetricsAddr::On)
        .map_err(|e| format!("{e} (expected HOST:PORT such as 127.0.0.1:9464, or 'off')"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bad_values_are_refused_with_the_flag_name() {
        for args in [
            vec!["plegd", "demo", "--relist-period", "0s"],
            vec!["plegd", "demo", "--relist-period", "-1s"],
            vec!["plegd", "demo", "--relist-period", "fast"],
            vec!["plegd", "demo", "--metrics-addr", "localhost"],
            vec!["plegd", "demo", "--pods", "0"],
            vec!["plegd", "demo", "--unknown-flag"],
        ] {
            let err = Cli::try_parse_from(&args).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{args:?}");
        }
        let err = Cli::try_parse_from(["plegd", "demo", "--relist-period", "0s"]).unwrap_err();
        assert!(err.to_string().contains("--relist-period"), "{err}");
    }

    #[test]
    fn defaults() {
        let cli = Cli::try_parse_from(["plegd", "demo"]).unwrap();
        let Command::Demo(d) = cli.command else {
            panic!("not demo")
        };
        assert_eq!(d.common.relist_period, Duration::from_secs(1));
        assert_eq!(d.common.health_threshold, Duration::from_secs(180));
        assert!(matches!(d.common.metrics_addr, MetricsAddr::On(_)));
    }
}
