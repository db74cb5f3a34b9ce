//! The command tree: `plegd run` (a real CRI runtime) and `plegd demo` (the built-in
//! simulated runtime), each with the settings (`config.rs`) and the `--config` and
//! `--print-config` flags; and the subscriber API's clients (`client/`: `plegd
//! watch`, `pods`, `status`). A bad value fails at start with the flag's name and the
//! reason.

use clap::{Args, Parser, Subcommand};

use crate::client::ClientCommand;
use crate::config::{ConfigArgs, Settings};
use crate::values::{Count, PositiveDuration, DAY, HOUR};

const AFTER_HELP: &str = "\
Exit status: 0 after a clean shutdown (SIGTERM/SIGINT), 1 when the runtime cannot be
reached or is not a CRI v1 runtime at start (or another plegd serves the API socket),
2 for bad flags or configuration. The clients (watch, pods, status) exit 1 when no
plegd answers at the socket or it refuses the request.

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
    #[command(flatten)]
    Client(ClientCommand),
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub settings: Settings,
    #[command(flatten)]
    pub config: ConfigArgs,
}

#[derive(Args, Debug)]
// The demo brings its own runtime: --runtime-endpoint is left out of its help, refused
// if given, and PLEGD_RUNTIME_ENDPOINT is not read.
#[command(mut_arg("runtime_endpoint", demo_has_no_runtime_endpoint))]
pub struct DemoArgs {
    #[command(flatten)]
    pub workload: Workload,
    #[command(flatten)]
    pub settings: Settings,
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// The simulated node's workload (`plegd demo` only; not settings of the service).
#[derive(Args, Debug)]
pub struct Workload {
    /// Pods the simulated node keeps running.
    #[arg(long, default_value = "8")]
    pub pods: Count<100_000>,
    /// Time between two churn steps (a container exits, restarts, a pod is replaced...).
    #[arg(long, default_value = "300ms")]
    pub churn_period: PositiveDuration<HOUR>,
    /// Seed of the churn workload (same seed, same story).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop after this long (default: run until SIGTERM/SIGINT).
    #[arg(long)]
    pub duration: Option<PositiveDuration<{ 366 * DAY }>>,
}

fn demo_has_no_runtime_endpoint(arg: clap::Arg) -> clap::Arg {
    arg.hide(true)
        .env(None)
        .value_parser(|_: &str| -> Result<String, &'static str> {
            Err("plegd demo runs its own simulated runtime; --runtime-endpoint is for plegd run")
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::MetricsAddr;
    use clap::CommandFactory;
    use std::time::Duration;

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
            vec!["plegd", "demo", "--runtime-endpoint", "unix:///x.sock"],
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
        assert_eq!(d.settings.relist_period.0, Duration::from_secs(1));
        assert_eq!(d.settings.health_threshold.0, Duration::from_secs(180));
        assert!(matches!(d.settings.metrics_addr, MetricsAddr::On(_)));
    }
}
