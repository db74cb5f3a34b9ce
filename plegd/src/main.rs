//! plegd: the binary. Parses flags, picks the runtime (a real CRI socket or the
//! built-in simulator), starts the service and shuts it down on SIGTERM/SIGINT.

mod cli;
mod client;
mod config;
mod cursor;
mod demo;
mod exit;
mod output;
mod serve;
mod service_config;
mod signals;
mod values;

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{ArgMatches, CommandFactory, FromArgMatches};

use crate::cli::{Cli, Command, Workload};
use crate::config::{ConfigArgs, Settings};
use crate::exit::ExitError;
use crate::service_config::ServiceConfig;

/// What to run, checked, and how to log.
struct Checked {
    job: Job,
    log_format: values::LogFormat,
    /// `plegd demo` was given a runtime endpoint (file or environment): it is not used.
    endpoint_ignored: bool,
    /// `--memory-trim-period`.
    memory_trim: Option<std::time::Duration>,
}

/// What to run.
enum Job {
    Run {
        endpoint: String,
        config: ServiceConfig,
    },
    Demo {
        workload: Workload,
        config: ServiceConfig,
    },
}

/// Applies the config file and checks the settings; handles --print-config.
/// Ok(None): nothing more to do.
fn configure(command: Command, matches: &ArgMatches) -> Result<Option<Checked>, ExitError> {
    let Some((_, matches)) = matches.subcommand() else {
        // Not reached: clap requires a subcommand. Its own error, if it were.
        Cli::command()
            .error(ErrorKind::MissingSubcommand, "a subcommand is required")
            .exit()
    };
    let overlay = |settings: &mut Settings, args: &ConfigArgs| match &args.config {
        Some(path) => settings.overlay_file(path, matches),
        None => Ok(()),
    };
    let mut endpoint_ignored = false;
    let (job, settings, args) = match command {
        Command::Run(mut a) => {
            overlay(&mut a.settings, &a.config)?;
            let job = Job::Run {
                endpoint: a.settings.checked_runtime_endpoint()?,
                config: a.settings.service_config()?,
            };
            (job, a.settings, a.config)
        }
        Command::Demo(mut a) => {
            overlay(&mut a.settings, &a.config)?;
            endpoint_ignored = a.settings.runtime_endpoint.take().is_some();
            let job = Job::Demo {
                workload: a.workload,
                config: a.settings.service_config()?,
            };
            (job, a.settings, a.config)
        }
        // Handled before (`main`).
        Command::Client(_) => return Ok(None),
    };
    check_api_socket(&settings)?;
    if args.print_config {
        start_logging(settings.log_format, endpoint_ignored);
        print!("{}", settings.to_toml()?);
        return Ok(None);
    }
    Ok(Some(Checked {
        job,
        log_format: settings.log_format,
        endpoint_ignored,
        memory_trim: settings.memory_trim_period.get(),
    }))
}

/// What binding the API socket checks of the flags (its path's length, its group),
/// checked before --print-config too, so that it shows only what would start.
fn check_api_socket(settings: &Settings) -> Result<(), ExitError> {
    match &settings.api_socket {
        Some(values::ApiSocket::Off) => return Ok(()),
        Some(values::ApiSocket::Path(path)) => {
            plegd_api::check_path(path).map_err(serve::socket_error)?
        }
        None => {}
    }
    if let Some(group) = &settings.api_socket_group {
        plegd_api::resolve_group(group).map_err(serve::socket_error)?;
    }
    // The control socket: as given, or beside a given API socket (the defaults fit).
    let control = match (&settings.api_control_socket, &settings.api_socket) {
        (Some(values::ApiSocket::Path(path)), _) => Some(path.clone()),
        (None, Some(values::ApiSocket::Path(api))) => Some(plegd_api::control_socket_beside(api)),
        _ => None,
    };
    if let Some(path) = control {
        plegd_api::check_path(&path).map_err(serve::control_socket_error)?;
    }
    if let Some(group) = &settings.api_control_socket_group {
        plegd_api::resolve_group(group).map_err(serve::control_socket_error)?;
    }
    Ok(())
}

/// Logging starts once the settings are known (they choose the format).
fn start_logging(format: values::LogFormat, endpoint_ignored: bool) {
    plegd_telemetry::logging::init("info", format.into());
    if endpoint_ignored {
        tracing::warn!(
            key = "runtime-endpoint",
            "plegd demo uses its simulated runtime; this key is not used"
        );
    }
}

fn fail(e: ExitError) -> ExitCode {
    let code = e.exit_code();
    eprintln!("plegd: error: {:#}", anyhow::Error::new(e));
    ExitCode::from(code)
}

fn main() -> ExitCode {
    // First, while plegd has one thread (see plegd_telemetry::malloc; the mask is
    // inherited by every thread started later).
    let signals_held = signals::hold();
    let malloc_fixed = plegd_telemetry::malloc::fix_thresholds();
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Command::Client(command) = cli.command {
        return match client::run(command) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e),
        };
    }
    let checked = match configure(cli.command, &matches) {
        Ok(Some(checked)) => checked,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => return fail(e),
    };
    start_logging(checked.log_format, checked.endpoint_ignored);
    if !signals_held {
        tracing::warn!("could not hold signals back during start-up: one sent now kills plegd");
    }
    if !malloc_fixed {
        tracing::warn!(
            "glibc refused the fixed mmap/trim thresholds; memory may grow with its defaults"
        );
    }
    if let Some(period) = checked.memory_trim {
        if let Err(e) = plegd_telemetry::malloc::start_trimming(period) {
            tracing::warn!(error = %e, "could not start the memory trim thread; freed memory stays in RSS");
        }
    }
    let job = checked.job;
    let system = actix_rt::System::new();
    let result = system.block_on(async move {
        // Before any start-up work: a signal during start-up still shuts down cleanly.
        let mut signals = signals::Signals::install()?;
        match job {
            Job::Run { endpoint, config } => {
                serve::run_real(&endpoint, &config, &mut signals).await
            }
            Job::Demo { workload, config } => demo::run(workload, &config, &mut signals).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}
