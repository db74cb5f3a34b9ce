//! Logging set-up: `tracing` to stderr, filtered by `RUST_LOG` or the given default.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once; later calls are no-ops (tests call it freely).
pub fn init(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
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
