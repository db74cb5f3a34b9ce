//! Drops of the OTLP event export: each one counted in
//! `plegd_otlp_events_dropped_total` at once, and told in the log at most once per
//! [`WARN_EVERY`] (with how many since the last warning), so that a collector down for
//! hours costs a few log lines, not one per event.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use plegd_telemetry::Metrics;

/// The shortest interval between two drop warnings.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// Shared by the subscriber thread and the export task.
pub struct Drops {
    metrics: Arc<Metrics>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    last_warning: Option<Instant>,
    /// Dropped since the last warning.
    untold: u64,
}

impl Drops {
    pub fn new(metrics: Arc<Metrics>) -> Drops {
        Drops {
            metrics,
            state: Mutex::new(State::default()),
        }
    }

    /// Counts `n` records dropped because of `why`.
    pub fn count(&self, n: u64, why: &str) {
        if n == 0 {
            return;
        }
        self.metrics.otlp_events_dropped.inc_by(n);
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.untold += n;
        let now = Instant::now();
        if s.last_warning
            .is_none_or(|t| now.duration_since(t) >= WARN_EVERY)
        {
            tracing::warn!(
                dropped = s.untold,
                reason = why,
                "lifecycle events not exported over OTLP (plegd_otlp_events_dropped_total); \
                 the events themselves are published as usual"
            );
            s.untold = 0;
            s.last_warning = Some(now);
        }
    }

    /// Tells what was dropped since the last warning (at shutdown).
    pub fn tell_rest(&self) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.untold > 0 {
            tracing::warn!(
                dropped = s.untold,
                "lifecycle events not exported over OTLP since the last warning"
            );
            s.untold = 0;
        }
    }

    /// How many were dropped since the last warning (for tests).
    #[cfg(test)]
    fn untold(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .untold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_drop_is_counted_and_warnings_are_rate_limited() {
        let metrics = Arc::new(Metrics::new());
        let drops = Drops::new(metrics.clone());
        drops.count(3, "first");
        // The first drop is told at once; the next ones wait for the interval.
        assert_eq!(drops.untold(), 0);
        for _ in 0..1000 {
            drops.count(2, "again");
        }
        assert_eq!(drops.untold(), 2000);
        assert_eq!(metrics.otlp_events_dropped.get(), 2003);
        drops.tell_rest();
        assert_eq!(drops.untold(), 0);
        drops.count(0, "nothing");
        assert_eq!(metrics.otlp_events_dropped.get(), 2003);
    }
}
