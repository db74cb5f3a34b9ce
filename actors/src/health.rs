//! Generic PLEG health: healthy while the last successful global relist is younger
//! than a threshold (kubelet: 3 min). Before the first success, the process start
//! counts as the last success, so a slow first relist is not a failed liveness probe;
//! readiness (`ready`) is separate and waits for the first success. The event stream
//! never affects either (KEP-3386: losing the fast path is not a health failure).
//!
//! It also keeps whether the runtime answers: the last global relist's outcome (its
//! error, if it failed) and since when relists have succeeded without a failure —
//! what `plegd status` shows and how the NRI source tells a runtime that is starting
//! from one without NRI. [`HealthLog`] logs each change of health once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

/// No time recorded.
const NEVER: u64 = u64::MAX;

struct Inner {
    start: Instant,
    threshold: Duration,
    /// Milliseconds after `start` of the last successful global relist.
    last_ok_ms: AtomicU64,
    /// Milliseconds after `start` of the first success after the last failure
    /// ([`NEVER`]: failing, or no relist yet).
    answering_since_ms: AtomicU64,
    ready: AtomicBool,
    /// The last global relist's error, while it is the last outcome.
    last_error: Mutex<Option<String>>,
}

/// Whether the runtime answers, as the last global relist found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// No global relist has ended yet.
    Unknown,
    /// The last one succeeded; relists have succeeded for this long.
    Answering(Duration),
    /// The last one failed with this error.
    Failing(String),
}

impl Health {
    pub fn new(threshold: Duration) -> Self {
        Health {
            inner: Arc::new(Inner {
                start: Instant::now(),
                threshold,
                last_ok_ms: AtomicU64::new(0),
                answering_since_ms: AtomicU64::new(NEVER),
                ready: AtomicBool::new(false),
                last_error: Mutex::new(None),
            }),
        }
    }

    fn ms(&self, at: Instant) -> u64 {
        let ms = at.saturating_duration_since(self.inner.start).as_millis();
        u64::try_from(ms).unwrap_or(NEVER - 1)
    }

    /// Records a successful global relist that completed at `at`.
    pub fn relist_succeeded(&self, at: Instant) {
        let ms = self.ms(at);
        self.inner.last_ok_ms.fetch_max(ms, Ordering::Relaxed);
        let _ = self.inner.answering_since_ms.compare_exchange(
            NEVER,
            ms,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        self.inner.ready.store(true, Ordering::Relaxed);
        *self.error() = None;
    }

    /// Records a global relist that failed (its lists did not answer).
    pub fn relist_failed(&self, error: &str) {
        self.inner
            .answering_since_ms
            .store(NEVER, Ordering::Relaxed);
        *self.error() = Some(error.to_string());
    }

    fn error(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.inner
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The last global relist's error, while it is the last outcome.
    pub fn last_error(&self) -> Option<String> {
        self.error().clone()
    }

    /// Whether the runtime answers, as of `now`.
    pub fn runtime(&self, now: Instant) -> Runtime {
        if let Some(e) = self.error().clone() {
            return Runtime::Failing(e);
        }
        match self.answering_for(now) {
            Some(d) => Runtime::Answering(d),
            None => Runtime::Unknown,
        }
    }

    /// How long global relists have succeeded without a failure, as of `now` (None:
    /// the last one failed, or none has ended).
    pub fn answering_for(&self, now: Instant) -> Option<Duration> {
        match self.inner.answering_since_ms.load(Ordering::Relaxed) {
            NEVER => None,
            ms => Some(now.saturating_duration_since(self.inner.start + Duration::from_millis(ms))),
        }
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

/// A change of health worth a log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HealthChange {
    /// Unhealthy now: why, the last global relist's error if it failed, and the age
    /// of the last successful one.
    Lost {
        reason: String,
        runtime_error: Option<String>,
        last_relist_age: Duration,
    },
    /// Healthy again after `unhealthy_for`.
    Regained {
        unhealthy_for: Duration,
        last_relist_age: Duration,
    },
}

/// Watches [`Health`] for changes (call [`HealthLog::check`] periodically): each way
/// once, whatever the number of checks in between.
pub struct HealthLog {
    health: Health,
    /// Since when unhealthy (None: healthy).
    unhealthy_since: Option<Instant>,
}

impl HealthLog {
    pub fn new(health: Health) -> Self {
        HealthLog {
            health,
            unhealthy_since: None,
        }
    }

    /// The change since the last check, if any, as of `now`.
    pub fn check(&mut self, now: Instant) -> Option<HealthChange> {
        let last_relist_age = self.health.since_last_relist(now);
        match (self.health.check_at(now), self.unhealthy_since) {
            (Err(reason), None) => {
                self.unhealthy_since = Some(now);
                let runtime_error = match self.health.runtime(now) {
                    Runtime::Failing(e) => Some(e),
                    _ => None,
                };
                Some(HealthChange::Lost {
                    reason,
                    runtime_error,
                    last_relist_age,
                })
            }
            (Ok(()), Some(since)) => {
                self.unhealthy_since = None;
                Some(HealthChange::Regained {
                    unhealthy_for: now.saturating_duration_since(since),
                    last_relist_age,
                })
            }
            _ => None,
        }
    }

    /// Checks and logs the change, if any.
    pub fn log(&mut self, now: Instant) {
        match self.check(now) {
            Some(HealthChange::Lost {
                reason,
                runtime_error,
                last_relist_age,
            }) => tracing::error!(
                reason,
                runtime_error,
                last_relist_age_s = last_relist_age.as_secs_f64(),
                "plegd is unhealthy: /healthz now fails"
            ),
            Some(HealthChange::Regained {
                unhealthy_for,
                last_relist_age,
            }) => tracing::info!(
                unhealthy_for_s = unhealthy_for.as_secs_f64(),
                last_relist_age_s = last_relist_age.as_secs_f64(),
                "plegd is healthy again"
            ),
            None => {}
        }
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

    /// `a` within a millisecond of `b` (times are kept in milliseconds).
    fn about(a: Duration, b: Duration) -> bool {
        a.abs_diff(b) <= Duration::from_millis(1)
    }

    #[test]
    fn the_runtime_answers_since_the_first_success_after_the_last_failure() {
        let h = Health::new(Duration::from_secs(180));
        let t0 = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(h.runtime(t0), Runtime::Unknown);
        h.relist_succeeded(t0 + s(1));
        h.relist_succeeded(t0 + s(2));
        assert!(about(h.answering_for(t0 + s(5)).expect("answering"), s(4)));
        h.relist_failed("ListPodSandbox failed: Unavailable");
        assert_eq!(h.answering_for(t0 + s(6)), None);
        assert_eq!(
            h.runtime(t0 + s(6)),
            Runtime::Failing("ListPodSandbox failed: Unavailable".into())
        );
        assert_eq!(
            h.last_error().as_deref(),
            Some("ListPodSandbox failed: Unavailable")
        );
        h.relist_succeeded(t0 + s(7));
        assert_eq!(h.last_error(), None);
        h.relist_succeeded(t0 + s(8));
        assert!(matches!(h.runtime(t0 + s(10)), Runtime::Answering(d) if about(d, s(3))));
    }

    #[test]
    fn each_change_of_health_is_told_once_each_way() {
        let h = Health::new(Duration::from_secs(180));
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut log = HealthLog::new(h.clone());
        h.relist_succeeded(t0 + s(1));
        assert_eq!(log.check(t0 + s(100)), None);
        h.relist_failed("ListPodSandbox timed out after 2s");
        let lost = log.check(t0 + s(182)).expect("lost");
        assert!(matches!(
            &lost,
            HealthChange::Lost { runtime_error: Some(e), last_relist_age, .. }
                if e.contains("timed out") && about(*last_relist_age, s(181))
        ));
        assert_eq!(log.check(t0 + s(183)), None);
        assert_eq!(log.check(t0 + s(190)), None);
        h.relist_succeeded(t0 + s(195));
        assert!(matches!(
            log.check(t0 + s(196)),
            Some(HealthChange::Regained { unhealthy_for, last_relist_age })
                if unhealthy_for == s(14) && about(last_relist_age, s(1))
        ));
        assert_eq!(log.check(t0 + s(197)), None);
    }
}
