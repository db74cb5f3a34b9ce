//! Logging set-up: `tracing` to stderr, filtered by `RUST_LOG` or the given default.
//! Text for people (colour only on a terminal, never with `NO_COLOR`), or JSON lines
//! for log collectors (container logs, a DaemonSet), which parse them without a regex.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One readable line per event.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the
    /// event's fields at the top level.
    Json,
}

/// Whether text logs may carry ANSI colour: only to a terminal, and never when
/// `NO_COLOR` is set (https://no-color.org).
pub fn colour(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Installs the global subscriber once; later calls are no-ops (tests call it freely).
pub fn init(default_filter: &str, format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    // A log line that cannot be written (stderr a file on a full disk) is lost, not
    // reported on stderr again: that report panics when stderr fails.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_target(false)
            .with_ansi(colour(
                std::io::stderr().is_terminal(),
                std::env::var_os("NO_COLOR"),
            ))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_target(true)
            .try_init(),
    };
}

/// Lines a second of each per-event debug line (a single exit's latency can be
/// followed in the log; a storm writes a few dozen lines a second).
pub const EVENT_LINES_PER_SECOND: u32 = 50;

/// Lets `burst` messages through per window and counts the rest, so a flapping
/// runtime or a storm cannot flood the log: one a window for warnings
/// ([`RateLimiter::new`]), a burst for per-event debug lines
/// ([`RateLimiter::with_burst`]: 20 exits at once are 20 lines, a storm of thousands a
/// second a few dozen). The first message let through after suppressed ones reports
/// how many. Not thread-safe: one per actor and kind of line.
#[derive(Debug)]
pub struct RateLimiter {
    window: std::time::Duration,
    burst: u32,
    window_start: Option<std::time::Instant>,
    used: u32,
    suppressed: u64,
}

impl RateLimiter {
    /// One message per `interval`.
    pub fn new(interval: std::time::Duration) -> Self {
        Self::with_burst(1, interval)
    }

    /// The budget of a per-event debug line (one per hint, per relist):
    /// [`EVENT_LINES_PER_SECOND`].
    pub fn for_event_lines() -> Self {
        Self::with_burst(EVENT_LINES_PER_SECOND, std::time::Duration::from_secs(1))
    }

    /// Up to `burst` messages (at least one) per `window`.
    pub fn with_burst(burst: u32, window: std::time::Duration) -> Self {
        RateLimiter {
            window,
            burst: burst.max(1),
            window_start: None,
            used: 0,
            suppressed: 0,
        }
    }

    /// Some(n) if a message may be logged now, n being how many were suppressed since
    /// the last one; None if this one must be suppressed (it is counted).
    pub fn allow(&mut self, now: std::time::Instant) -> Option<u64> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn colour_only_on_a_terminal_and_never_with_no_color() {
        assert!(colour(true, None));
        assert!(!colour(false, None));
        assert!(!colour(true, Some("1".into())));
        // An empty NO_COLOR does not count (no-color.org).
        assert!(colour(true, Some("".into())));
    }

    #[test]
    fn rate_limiter_lets_one_through_per_interval() {
        let mut rl = RateLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(rl.allow(t0), Some(0));
        for i in 1..=100 {
            assert_eq!(rl.allow(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(rl.allow(t0 + Duration::from_secs(10)), Some(100));
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_burst_goes_through_then_the_rest_of_the_window_is_counted() {
        let mut b = RateLimiter::with_burst(3, Duration::from_secs(1));
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
        let mut b = RateLimiter::with_burst(0, Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(b.allow(t0), Some(0));
        assert_eq!(b.allow(t0), None);
    }
}
