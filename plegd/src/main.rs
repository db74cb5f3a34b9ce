//! plegd: the binary. Parses flags, picks the runtime (a real CRI socket or the
//! built-in simulator), starts the service and shuts it down on SIGTERM/SIGINT.

mod cli;
mod demo;
mod output;
mod service;

use std::process::ExitCode;

use clap::Parser;

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

fn main() -> ExitCode {
    let cli = Cli::parse();
    plegd_telemetry::logging::init("info");
    let system = actix_rt::System::new();
    let result = system.block_on(async move {
        match cli.command {
            Command::Run(args) => service::run_real(args).await,
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
