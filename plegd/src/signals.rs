//! The signals plegd answers, installed before any start-up work (so a SIGTERM while
//! the demo sets up still ends in a clean shutdown that removes its socket directory):
//! SIGTERM and SIGINT stop plegd gracefully; SIGHUP reopens the `--events-json` file,
//! the way log rotation expects (it never stops plegd).

use actix_rt::signal::unix::{signal, Signal, SignalKind};

use crate::exit::ExitError;

/// What a signal asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asked {
    Stop(&'static str),
    Reopen,
}

pub struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    /// Installs the handlers (inside the runtime). From now on these signals are
    /// queued for [`Self::next`] instead of killing the process.
    pub fn install() -> Result<Signals, ExitError> {
        let install = |kind, name| {
            signal(kind).map_err(ExitError::runtime(match name {
                "SIGTERM" => "cannot install the SIGTERM handler",
                "SIGINT" => "cannot install the SIGINT handler",
                _ => "cannot install the SIGHUP handler",
            }))
        };
        Ok(Signals {
            term: install(SignalKind::terminate(), "SIGTERM")?,
            int: install(SignalKind::interrupt(), "SIGINT")?,
            hup: install(SignalKind::hangup(), "SIGHUP")?,
        })
    }

    /// Runs `work` to its end, unless SIGTERM or SIGINT comes first: then None, said in
    /// the log (`doing` names the work). SIGHUP does not interrupt it.
    pub async fn unless_stopped<T>(
        &mut self,
        doing: &'static str,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return Some(out),
                asked = self.next() => {
                    if let Asked::Stop(signal) = asked {
                        tracing::info!(signal, "stopped while {doing}");
                        return None;
                    }
                }
            }
        }
    }

    /// The next signal received.
    pub async fn next(&mut self) -> Asked {
        tokio::select! {
            _ = self.term.recv() => Asked::Stop("SIGTERM"),
            _ = self.int.recv() => Asked::Stop("SIGINT"),
            _ = self.hup.recv() => Asked::Reopen,
        }
    }
}
