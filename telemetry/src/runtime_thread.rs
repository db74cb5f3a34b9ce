//! A thread with a tokio runtime of its own: what keeps the API server and the OTLP
//! exports off the actors' thread (and the actors' runtime), so that a slow client
//! or collector never delays a relist.

use std::thread::JoinHandle;

use tokio::runtime::{Builder, Runtime};

/// Who runs the thread's runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workers {
    /// The thread itself (a current-thread runtime: its work runs only while the
    /// thread is in `block_on`).
    Own,
    /// One worker thread of this name beside it (a multi-thread runtime: its tasks run
    /// whatever the thread itself is doing).
    One(&'static str),
}

/// Builds a runtime and starts the thread `name`; then `setup` runs on it, with the
/// runtime. If `setup` gives `Ok((value, run))`, `value` is returned to the
/// caller and `run` goes on with the runtime on the thread until it returns; else
/// its error is. Returns once `setup` has returned, with the thread's handle.
pub fn spawn<T, E, Run>(
    name: &str,
    workers: Workers,
    setup: impl FnOnce(&Runtime) -> Result<(T, Run), E> + Send + 'static,
) -> Result<(T, JoinHandle<()>), E>
where
    T: Send + 'static,
    E: From<std::io::Error> + Send + 'static,
    Run: FnOnce(Runtime),
{
    // Built here, run there: a runtime that cannot be built is the caller's error.
    let rt = match workers {
        Workers::Own => Builder::new_current_thread().enable_all().build(),
        Workers::One(worker) => Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(worker)
            .enable_all()
            .build(),
    }?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || match setup(&rt) {
            Ok((value, run)) => {
                // The caller waits for this answer: it is there to take it.
                if ready_tx.send(Ok(value)).is_ok() {
                    run(rt);
                }
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
            }
        })?;
    let value = ready_rx.recv().map_err(|_| {
        E::from(std::io::Error::other(format!(
            "the {name} thread ended at start"
        )))
    })??;
    Ok((value, thread))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_comes_back_and_the_run_goes_on_with_the_runtime() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (value, thread) = spawn("rt-test", Workers::Own, move |rt: &Runtime| {
            let v = rt.block_on(async { 42 });
            Ok::<_, std::io::Error>((v, move |rt: Runtime| {
                let name = std::thread::current().name().map(str::to_owned);
                let _ = tx.send((rt.block_on(async { 7 }), name));
            }))
        })
        .expect("started");
        assert_eq!(value, 42);
        assert_eq!(rx.recv().ok(), Some((7, Some("rt-test".to_string()))));
        assert!(thread.join().is_ok());
    }

    #[test]
    fn a_worker_thread_has_its_name() {
        let (name, thread) = spawn("rt-outer", Workers::One("rt-worker"), |rt: &Runtime| {
            let name = rt.block_on(async {
                tokio::spawn(async { std::thread::current().name().map(str::to_owned) })
                    .await
                    .ok()
                    .flatten()
            });
            Ok::<_, std::io::Error>((name, |_rt: Runtime| {}))
        })
        .expect("started");
        assert_eq!(name.as_deref(), Some("rt-worker"));
        assert!(thread.join().is_ok());
    }

    #[test]
    fn a_failed_setup_is_the_callers_error() {
        let answer = spawn("rt-fail", Workers::Own, |_rt: &Runtime| {
            Err::<((), fn(Runtime)), _>(std::io::Error::other("no"))
        });
        assert_eq!(answer.err().map(|e| e.to_string()), Some("no".into()));
    }
}
