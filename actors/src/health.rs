//! Generic PLEG health: healthy while the last successful global relist is younger
//! than a threshold (kubelet: 3 min). Before the first success, the process start
//! counts as the last success, so a slow first relist is not a failed liveness probe;
//! readiness (`ready`) is separate and waits for the first success. The event stream
//! never affects either (KEP-3386: losing the fast path is not a health failure).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

struct Inner {
    start: Instant,
    threshold: Duration,
    /// Milliseconds after `start` of the last successful global relist.
    last_ok_ms: AtomicU64,
    ready: AtomicBool,
}

impl Health {
    pub fn new(threshold: Duration) -> Self {
        Health {
            inner: Arc::new(Inner {
                start: Instant::now(),
                threshold,
                last_ok_ms: AtomicU64::new(0),
                ready: AtomicBool::new(false),
            }),
        }
    }

    /// Records a successful global relist that completed at `at`.
    pub fn relist_succeeded(&self, at: Instant) {
        let ms = at.saturating_duration_since(self.inner.start).as_millis() as u64;
        self.inner.last_ok_ms.fetch_max(ms, Ordering::Relaxed);
        self.inner.ready.store(true, Ordering::Relaxed);
    }

    /// Time since the last successful global relist (or since start), as of `now`.
    pub fn since_last_relist(&self, now: Instant) -> Duration {
        let last =
            self.inner.start + Duration::from_millis(self.inner.last_ok_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(last)
    }

    /// Ok while the Generic PLEG is healthy as of `now`; Err says why not.
    pub fn check_at(&self, now: Instant) -> Result<(), String> {
        let age = self.since_last_relist(now);
        if age > self.inner.threshold {
            Err(format!(
                "pleg was last seen active {:.1}s ago; threshold is {:.1}s",
                age.as_secs_f64(),
                self.inner.threshold.as_secs_f64()
            ))
        } else {
            Ok(())
        }
    }

    pub fn check(&self) -> Result<(), String> {
        self.check_at(Instant::now())
    }

    /// True after the first successful global relist.
    pub fn ready(&self) -> bool {
        self.inner.ready.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_until_threshold_then_recovers() {
        let h = Health::new(Duration::from_secs(180));
        let t0 = Instant::now();
        assert!(!h.ready());
        assert!(h.check_at(t0 + Duration::from_secs(179)).is_ok());
        assert!(h.check_at(t0 + Duration::from_secs(181)).is_err());
        h.relist_succeeded(t0 + Duration::from_secs(100));
        assert!(h.ready());
        assert!(h.check_at(t0 + Duration::from_secs(279)).is_ok());
        let err = h.check_at(t0 + Duration::from_secs(290)).unwrap_err();
        assert!(err.contains("threshold"), "{err}");
        // An older completion never moves the clock back.
        h.relist_succeeded(t0 + Duration::from_secs(50));
        assert!(h.check_at(t0 + Duration::from_secs(279)).is_ok());
    }
}
