//! A budget of debug lines: up to `burst` lines per window, the rest counted, so that
//! one line per hint or per relist can follow a single exit's latency in the log while
//! a storm of thousands a second writes a few dozen lines. The first line
//! let through after some were suppressed reports how many.
//!
//! Unlike `plegd_telemetry::logging::RateLimiter` (one line per interval, for
//! warnings), a budget lets a burst through: 20 exits at once are 20 lines.

use std::time::{Duration, Instant};

/// Not thread-safe: one per actor and kind of line.
#[derive(Debug)]
pub(crate) struct LogBudget {
    window: Duration,
    burst: u32,
    window_start: Option<Instant>,
    used: u32,
    suppressed: u64,
}

impl LogBudget {
    pub(crate) fn new(burst: u32, window: Duration) -> Self {
        LogBudget {
            window,
            burst: burst.max(1),
            window_start: None,
            used: 0,
            suppressed: 0,
        }
    }

    /// Some(n) if a line may be written now, n being how many were suppressed since
    /// the last one written; None if this one must be suppressed (it is counted).
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        let new_window = self
            .window_start
            .is_none_or(|start| now.saturating_duration_since(start) >= self.window);
        if new_window {
            self.window_start = Some(now);
            self.used = 0;
        }
        if self.used >= self.burst {
            self.suppressed += 1;
            return None;
        }
        self.used += 1;
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// Lines per window of each per-hint and per-relist debug line.
pub(crate) const LINES_PER_WINDOW: u32 = 50;
/// The window of [`LINES_PER_WINDOW`].
pub(crate) const WINDOW: Duration = Duration::from_secs(1);

/// Test only: what `tracing` writes on this thread, at debug level and up.
///
/// One global subscriber for the test binary writes each line to the buffer its
/// thread installed, if any (an actix test and its actors run on one thread). A
/// per-thread default subscriber would not do: tracing caches whether a call site is
/// enabled globally, from whichever thread reaches it first.
#[cfg(test)]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_burst_goes_through_then_the_rest_of_the_window_is_counted() {
        let mut b = LogBudget::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(b.allow(t0), Some(0));
        assert_eq!(b.allow(t0 + ms(1)), Some(0));
        assert_eq!(b.allow(t0 + ms(2)), Some(0));
        for i in 3..100 {
            assert_eq!(b.allow(t0 + ms(i)), None);
        }
        // The next window: the first line reports the 97 suppressed, the next none.
        assert_eq!(b.allow(t0 + ms(1000)), Some(97));
        assert_eq!(b.allow(t0 + ms(1001)), Some(0));
        assert_eq!(b.allow(t0 + ms(1002)), Some(0));
        assert_eq!(b.allow(t0 + ms(1003)), None);
        assert_eq!(b.allow(t0 + ms(5000)), Some(1));
    }

    #[test]
    fn a_zero_burst_still_lets_one_line_through() {
        let mut b = LogBudget::new(0, Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(b.allow(t0), Some(0));
        assert_eq!(b.allow(t0), None);
    }
}
