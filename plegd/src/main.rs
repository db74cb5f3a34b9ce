//! plegd: the binary. Parses flags, picks the runtime (a real CRI socket or the
//! built-in simulator), starts the service and shuts it down on SIGTERM/SIGINT.

mod cli;
mod config;
mod demo;
mod output;
mod serve;

use std::process::ExitCode;

use anyhow::anyhow;
use clap::{CommandFactory, FromArgMatches};

use crate::cli::{Cli, Command};

/// Why plegd could not run, and the exit status that says so.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Bad flags or configuration: exit 2.
    #[error("{0:#}")]
    Config(anyhow::Error),
    /// The runtime cannot be used, or the service failed: exit 1.
    #[error("{0:#}")]
    Runtime(anyhow::Error),
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::Config(_) => 2,
            Failure::Runtime(_) => 1,
        }
    }
}

/// Merges the config file into the parsed flags; handles --print-config.
/// Ok(None): nothing more to do.
fn resolve(mut cli: Cli, matches: &clap::ArgMatches) -> Result<Option<Cli>, Failure> {
    let sub = matches
        .subcommand()
        .map(|(_, m)| m)
        .ok_or_else(|| Failure::Config(anyhow!("no subcommand")))?;
    let (common, endpoint, accepts) = match &mut cli.command {
        Command::Run(a) => (&mut a.common, &mut a.runtime_endpoint, true),
        Command::Demo(a) => (&mut a.common, &mut None, false),
    };
    config::apply_file(common, sub, endpoint, accepts).map_err(Failure::Config)?;
    if accepts && endpoint.is_none() {
        return Err(Failure::Config(anyhow!(
            "no runtime endpoint: give --runtime-endpoint, PLEGD_RUNTIME_ENDPOINT or \
             runtime-endpoint in the --config file"
        )));
    }
    if let Some(e) = endpoint.as_deref() {
        plegd_runtime::parse_unix_endpoint(e).map_err(|err| {
            Failure::Config(anyhow!(
                "--runtime-endpoint (runtime-endpoint in the config file): {err}"
            ))
        })?;
    }
    if common.print_config {
        print!("{}", config::render(common, endpoint.as_deref()));
        return Ok(None);
    }
    Ok(Some(cli))
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    plegd_telemetry::logging::init("info");
    let cli = match resolve(cli, &matches) {
        Ok(Some(cli)) => cli,
        Ok(None) => return ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("plegd: error: {f}");
            return ExitCode::from(f.exit_code());
        }
    };
    let system = actix_rt::System::new();
    let result = system.block_on(async move {
        match cli.command {
            Command::Run(args) => serve::run_real(args).await,
            Command::Demo(args) => demo::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("plegd: error: {f}");
            ExitCode::from(f.exit_code())
        }
    }
}
