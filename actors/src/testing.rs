//! What the actors' unit tests share besides the mock actors (`mock.rs`).

use std::time::{Duration, Instant};

/// Generous: CI machines are slow and shared.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Polls `cond` every millisecond until it holds; panics with `what` after
/// [`TIMEOUT`]. Tests wait on conditions, never on fixed sleeps.
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Test only: what `tracing` writes on this thread, at debug level and up.
///
/// One global subscriber for the test binary writes each line to the buffer its
/// thread installed, if any (an actix test and its actors run on one thread). A
/// per-thread default subscriber would not do: tracing caches whether a call site is
/// enabled globally, from whichever thread reaches it first.
pub(crate) mod capture {
    use std::cell::RefCell;
    use std::sync::{Arc, Mutex, Once};

    type Buffer = Arc<Mutex<Vec<u8>>>;

    thread_local! {
        static CURRENT: RefCell<Option<Buffer>> = const { RefCell::new(None) };
    }

    /// The lines written on this thread since [`Captured::install`], as text.
    #[derive(Clone, Default)]
    pub(crate) struct Captured(Buffer);

    /// Captures until dropped.
    pub(crate) struct Installed;

    impl Drop for Installed {
        fn drop(&mut self) {
            CURRENT.with(|c| *c.borrow_mut() = None);
        }
    }

    impl Captured {
        /// Captures what the current thread writes, until the guard is dropped.
        pub(crate) fn install(&self) -> Installed {
            static GLOBAL: Once = Once::new();
            GLOBAL.call_once(|| {
                let subscriber = tracing_subscriber::fmt()
                    .with_max_level(tracing::Level::DEBUG)
                    .with_ansi(false)
                    .with_writer(|| Writer)
                    .finish();
                let _ = tracing::subscriber::set_global_default(subscriber);
            });
            CURRENT.with(|c| *c.borrow_mut() = Some(self.0.clone()));
            Installed
        }

        pub(crate) fn lines(&self) -> Vec<String> {
            let bytes = self.0.lock().map(|b| b.clone()).unwrap_or_default();
            String::from_utf8_lossy(&bytes)
                .lines()
                .map(String::from)
                .collect()
        }

        /// The lines that contain every one of `parts`.
        pub(crate) fn matching(&self, parts: &[&str]) -> Vec<String> {
            self.lines()
                .into_iter()
                .filter(|l| parts.iter().all(|p| l.contains(p)))
                .collect()
        }
    }

    /// Writes to the current thread's buffer, or nowhere.
    struct Writer;

    impl std::io::Write for Writer {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            CURRENT.with(|c| {
                if let Some(buf) = c.borrow().as_ref() {
                    if let Ok(mut b) = buf.lock() {
                        b.extend_from_slice(data);
                    }
                }
            });
            Ok(data.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}

/// A ContainerStarted of pod `uid`'s container `c-<uid>`, with `revision`.
pub(crate) fn started_event(revision: u64, uid: &str) -> crate::event::LifecycleEvent {
    use crate::event::{EventKind, LifecycleEvent, RelistSource};
    LifecycleEvent {
        revision,
        time: std::time::SystemTime::now(),
        pod: plegd_runtime::PodRef {
            uid: uid.into(),
            name: "n".into(),
            namespace: "ns".into(),
        },
        kind: EventKind::ContainerStarted,
        container_id: format!("c-{uid}"),
        relist_source: RelistSource::Global,
        container_name: "app".into(),
        sandbox: false,
        attempt: None,
        image: None,
        exit: None,
    }
}
