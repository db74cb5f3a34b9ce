//! The signals plegd answers, held back from `main`'s first line and handled from the
//! first thing plegd does in its runtime, before the service or the demo starts (so a
//! SIGTERM while the settings are read or the demo sets up still ends in a clean
//! shutdown that removes its socket directory): SIGTERM and SIGINT stop plegd gracefully; SIGHUP reopens the
//! `--events-json` file, the way log rotation expects (it never stops plegd).

use actix_rt::signal::unix::{signal, Signal, SignalKind};
use nix::sys::signal::{SigSet, Signal as Sig};

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

/// The signals plegd answers, as a set.
fn answered() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [Sig::SIGTERM, Sig::SIGINT, Sig::SIGHUP] {
        set.add(sig);
    }
    set
}

/// Holds the signals plegd answers back (blocked on this thread and on every thread it
/// starts from now on) until [`Signals::install`] or [`release`] lets them through on
/// this thread: `main`'s first line, so one sent while plegd starts waits for its
/// handler instead of killing plegd. A thread started meanwhile (the trim thread)
/// keeps them blocked for good, which is harmless while this thread takes them and no
/// such thread starts a process (it would inherit the mask). False if the mask could
/// not be set (plegd then starts without it).
pub fn hold() -> bool {
    answered().thread_block().is_ok()
}

/// Lets the held signals through again: with their default action for a command that
/// installs no handler (the API client's `pods` and `status`), else once its handlers
/// are in (`watch`).
pub fn release() {
    let _ = answered().thread_unblock();
}

impl Signals {
    /// Installs the handlers (inside the runtime, on the thread that called [`hold`]),
    /// then lets the held signals through. From now on these signals are queued for
    /// [`Self::next`] instead of killing the process; one sent before is taken now.
    pub fn install() -> Result<Signals, ExitError> {
        let install = |kind, name| {
            signal(kind).map_err(ExitError::runtime(match name {
                "SIGTERM" => "cannot install the SIGTERM handler",
                "SIGINT" => "cannot install the SIGINT handler",
                _ => "cannot install the SIGHUP handler",
            }))
        };
        let installed = (|| {
            Ok(Signals {
                term: install(SignalKind::terminate(), "SIGTERM")?,
                int: install(SignalKind::interrupt(), "SIGINT")?,
                hup: install(SignalKind::hangup(), "SIGHUP")?,
            })
        })();
        release();
        installed
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
