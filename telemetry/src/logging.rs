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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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

/// Lets one message through per `interval` and counts the rest, so a flapping
/// runtime cannot flood the log. Not thread-safe: one per actor.
pub struct RateLimiter {
    interval: std::time::Duration,
    last: Option<std::time::Instant>,
    suppressed: u64,
}

impl RateLimiter {
    pub fn new(interval: std::time::Duration) -> Self {
        RateLimiter {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// Some(n) if a message may be logged now, n being how many were suppressed since
    /// the last one; None if this one must be suppressed.
    pub fn allow(&mut self, now: std::time::Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
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
}
