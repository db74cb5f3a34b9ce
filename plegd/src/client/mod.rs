//! The CLI clients of the subscriber API (`plegd watch`, `plegd pods`, `plegd
//! status`): each connects to a plegd's socket, asks, and prints — readable lines, or
//! JSON with the fields of `plegd run`'s output. Any failure is exit 1 with one line
//! saying which: nothing answers at the socket (named), a refused revision, an
//! unknown pod.

mod clients;
mod pods;
mod status;
mod watch;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use plegd_api::v1::plegd_client::PlegdClient;
use tonic::transport::Channel;

use crate::exit::ExitError;

pub use pods::PodsArgs;
pub use status::StatusArgs;
pub use watch::WatchArgs;

/// Where the plegd to ask listens, and how long to wait for it.
#[derive(Args, Debug, Clone)]
pub struct SocketArg {
    /// The plegd API socket.
    #[arg(long, env = "PLEGD_API_SOCKET", value_name = "PATH", default_value = plegd_api::DEFAULT_SOCKET)]
    pub api_socket: PathBuf,
    /// How long to wait for plegd's answer: pods and status end with exit 1 past it
    /// (status --newer-than waits up to 30s more); watch, for its start (connect and
    /// plegd's Hello), then it watches for as long as it runs.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_timeout)]
    pub timeout: Duration,
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("must be more than 0s".to_string()),
        Err(e) => Err(format!("{e} (e.g. 10s, 500ms, 1m)")),
    }
}

/// `fut`, if it ends within `deadline`; else the one line that says plegd at
/// `socket` did not answer.
async fn within<T>(
    socket: &Path,
    deadline: Duration,
    fut: impl Future<Output = Result<T, ExitError>>,
) -> Result<T, ExitError> {
    tokio::time::timeout(deadline, fut)
        .await
        .unwrap_or_else(|_| {
            Err(ExitError::Runtime(anyhow::anyhow!(
                "plegd at {} did not answer within {} (--timeout)",
                socket.display(),
                humantime::format_duration(deadline)
            )))
        })
}

/// The client subcommands.
#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Watch a running plegd's pod lifecycle events (one line each; --json: the
    /// fields of `plegd run`'s output). SIGINT/SIGTERM stop it (exit 0).
    Watch(WatchArgs),
    /// List the pods in a running plegd's cache.
    Pods(PodsArgs),
    /// Show one pod as a running plegd's cache holds it (also after it went away,
    /// for plegd's --tombstone-ttl); without a UID, plegd itself. Both list the
    /// hint sources and their states.
    Status(StatusArgs),
}

/// Runs a client command on a small runtime of its own. The signals `main` held are
/// let through by `watch` once its handlers are in, by the others at once (their
/// default action ends them).
pub fn run(command: ClientCommand) -> Result<(), ExitError> {
    if !matches!(command, ClientCommand::Watch(_)) {
        crate::signals::release();
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ExitError::runtime("cannot start a runtime"))?;
    let result = runtime.block_on(async move {
        match command {
            ClientCommand::Watch(a) => watch::run(a).await,
            ClientCommand::Pods(a) => pods::run(a).await,
            ClientCommand::Status(a) => status::run(a).await,
        }
    });
    match result {
        // The reader went away (`plegd watch | head -1`): nothing more to say to it.
        Err(ExitError::Runtime(e)) if e.is::<StdoutClosed>() => Ok(()),
        other => other,
    }
}

/// Stdout was closed by its reader: the command ends quietly, with exit 0.
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed")]
struct StdoutClosed;

async fn connect(socket: &Path) -> Result<PlegdClient<Channel>, ExitError> {
    plegd_api::connect(socket)
        .await
        .map_err(|e| ExitError::Runtime(anyhow::Error::new(e)))
}

/// A failed call, said in one line naming the socket.
fn call_failed(socket: &Path, status: &tonic::Status) -> ExitError {
    let at = socket.display();
    let line = match status.code() {
        tonic::Code::Unavailable => format!("plegd at {at} is unavailable: {}", status.message()),
        tonic::Code::FailedPrecondition => format!("plegd at {at} refused: {}", status.message()),
        tonic::Code::NotFound | tonic::Code::InvalidArgument | tonic::Code::DeadlineExceeded => {
            format!("plegd at {at}: {}", status.message())
        }
        code => format!("plegd at {at}: {code:?}: {}", status.message()),
    };
    ExitError::Runtime(anyhow::anyhow!(line))
}

/// RFC 3339 with nanoseconds, as `plegd run` writes times.
fn rfc3339(ns: i64) -> String {
    humantime::format_rfc3339_nanos(plegd_api::convert::from_unix_nanos(ns)).to_string()
}

/// Writes a line to stdout now (a pipe reader sees each event as it comes).
fn print_line(line: &str) -> Result<(), ExitError> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => ExitError::Runtime(anyhow::Error::new(StdoutClosed)),
            _ => ExitError::runtime("writing to stdout")(e),
        })
}
