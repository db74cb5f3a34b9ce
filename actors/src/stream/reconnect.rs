//! The event stream's reconnect policy (KEP-3386 "Design Details"), pure and
//! clock-free: callers pass `now`, so tests drive it with a fake clock.
//!
//! - the first retry after a healthy period is immediate;
//! - then exponential backoff with jitter, capped (default 60 s), forever;
//! - the backoff resets only after a connection stayed healthy `healthy_reset`
//!   (default 60 s), so a flapping runtime cannot cause a tight loop;
//! - Unimplemented waits the cap every time (a runtime upgrade is picked up later).
//!
//! The exponential part is the `backoff` crate's. That crate is flagged unmaintained
//! (RUSTSEC-2025-0012); it is used only here, behind [`ReconnectBackoff`], so it can be
//! swapped for `backon` without touching the StreamWatcher.

use std::time::{Duration, Instant};

use backoff::backoff::Backoff as _;
use backoff::{ExponentialBackoff, ExponentialBackoffBuilder};

/// Validated reconnect settings: an invalid policy cannot be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReconnectPolicy {
    base: Duration,
    cap: Duration,
    healthy_reset: Duration,
}

/// Why a [`ReconnectPolicy`] cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReconnectPolicyError {
    #[error("the reconnect base delay must be greater than zero")]
    ZeroBase,
    #[error("the reconnect cap ({cap:?}) must not be below the base delay ({base:?})")]
    CapBelowBase { base: Duration, cap: Duration },
    #[error("the healthy-reset duration must be greater than zero")]
    ZeroHealthyReset,
    #[error("reconnect durations must be at most {MAX_RECONNECT_DURATION:?}")]
    TooLong,
}

/// The longest cap or healthy-reset time: far beyond any sensible value, and small
/// enough that no deadline computed from it can overflow an `Instant`.
pub const MAX_RECONNECT_DURATION: Duration = Duration::from_secs(24 * 3600);

impl ReconnectPolicy {
    pub fn new(
        base: Duration,
        cap: Duration,
        healthy_reset: Duration,
    ) -> Result<Self, ReconnectPolicyError> {
        if base.is_zero() {
            return Err(ReconnectPolicyError::ZeroBase);
        }
        if cap < base {
            return Err(ReconnectPolicyError::CapBelowBase { base, cap });
        }
        if healthy_reset.is_zero() {
            return Err(ReconnectPolicyError::ZeroHealthyReset);
        }
        if cap > MAX_RECONNECT_DURATION || healthy_reset > MAX_RECONNECT_DURATION {
            return Err(ReconnectPolicyError::TooLong);
        }
        Ok(ReconnectPolicy {
            base,
            cap,
            healthy_reset,
        })
    }
}

impl Default for ReconnectPolicy {
    fn default() -> Self {
        ReconnectPolicy {
            base: Duration::from_millis(500),
            cap: Duration::from_secs(60),
            healthy_reset: Duration::from_secs(60),
        }
    }
}

/// How a connection attempt, or the stream it opened, ended: it decides the next delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Any error, EOF or clean close.
    Failed,
    /// The runtime does not implement GetContainerEvents.
    Unimplemented,
    /// The runtime does not have the source now (NRI's socket is missing while CRI
    /// answers): looked for again after `retry`, whatever the backoff.
    Absent { retry: Duration },
}

/// The delay before each reconnect. Holds no clock and no connection state: the
/// caller says when the connection came up and when it ended.
pub struct ReconnectBackoff {
    policy: ReconnectPolicy,
    exp: ExponentialBackoff,
    /// Failures since the last reset.
    failures: u32,
}

impl ReconnectBackoff {
    pub fn new(policy: ReconnectPolicy) -> Self {
        ReconnectBackoff {
            exp: Self::exponential(&policy),
            policy,
            failures: 0,
        }
    }

    fn exponential(policy: &ReconnectPolicy) -> ExponentialBackoff {
        ExponentialBackoffBuilder::new()
            .with_initial_interval(policy.base)
            .with_multiplier(2.0)
            .with_randomization_factor(0.2)
            .with_max_interval(policy.cap)
            .with_max_elapsed_time(None)
            .build()
    }

    /// The connection, up since `up_since`, ended at `now`: how long to wait before the
    /// next attempt. `up_since` is when the stream opened, or when a still-pending attempt
    /// began (containerd sends no headers before its first event, so a pending attempt
    /// on a quiet node is a healthy stream).
    pub fn failed(&mut self, up_since: Instant, now: Instant, end: AttemptEnd) -> Duration {
        if now.saturating_duration_since(up_since) >= self.policy.healthy_reset {
            self.failures = 0;
            self.exp = Self::exponential(&self.policy);
        }
        self.failures = self.failures.saturating_add(1);
        match end {
            AttemptEnd::Unimplemented => return self.policy.cap,
            AttemptEnd::Absent { retry } => return retry.min(self.policy.cap),
            AttemptEnd::Failed => {}
        }
        if self.failures == 1 {
            return Duration::ZERO;
        }
        self.exp
            .next_backoff()
            .unwrap_or(self.policy.cap)
            .min(self.policy.cap)
    }

    /// Failures since the last reset.
    #[cfg(test)]
    fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> ReconnectPolicy {
        ReconnectPolicy::new(
            Duration::from_millis(100),
            Duration::from_secs(60),
            Duration::from_secs(60),
        )
        .unwrap()
    }

    #[test]
    fn invalid_policies_cannot_be_built() {
        let s = Duration::from_secs(1);
        assert!(ReconnectPolicy::new(Duration::ZERO, s, s).is_err());
        assert!(ReconnectPolicy::new(s * 2, s, s).is_err());
        assert!(ReconnectPolicy::new(s, s, Duration::ZERO).is_err());
        // No deadline computed from a policy may overflow an Instant.
        let forever = Duration::from_secs(u64::MAX / 4);
        assert_eq!(
            ReconnectPolicy::new(s, forever, s),
            Err(ReconnectPolicyError::TooLong)
        );
        assert_eq!(
            ReconnectPolicy::new(s, s, forever),
            Err(ReconnectPolicyError::TooLong)
        );
    }

    #[test]
    fn first_retry_immediate_then_exponential_with_jitter_capped_forever() {
        let mut b = ReconnectBackoff::new(policy());
        let now = Instant::now();
        assert_eq!(b.failed(now, now, AttemptEnd::Failed), Duration::ZERO);
        let mut prev = Duration::ZERO;
        let mut delays = vec![];
        for _ in 0..200 {
            let d = b.failed(now, now, AttemptEnd::Failed);
            assert!(d <= Duration::from_secs(60), "{d:?} over the cap");
            assert!(d >= Duration::from_millis(80), "{d:?} is a tight loop");
            delays.push(d);
            prev = prev.max(d);
        }
        // Grows (jitter ±20 % around 100 ms, 200 ms, 400 ms ...) ...
        assert!(delays[0] <= Duration::from_millis(120));
        assert!(delays[3] > delays[0] * 4);
        // ... and stays near the cap, retrying forever.
        assert!(delays[199] >= Duration::from_secs(47), "{:?}", delays[199]);
        assert_eq!(b.failures(), 201);
    }

    #[test]
    fn backoff_resets_only_after_a_healthy_minute() {
        let mut b = ReconnectBackoff::new(policy());
        let t0 = Instant::now();
        for _ in 0..10 {
            b.failed(t0, t0, AttemptEnd::Failed);
        }
        // Flapping: connected for 59 s, then fails again: no reset.
        let d = b.failed(t0, t0 + Duration::from_secs(59), AttemptEnd::Failed);
        assert!(d >= Duration::from_secs(20), "{d:?}");
        // Healthy for 60 s: the next retry is immediate again.
        let t1 = t0 + Duration::from_secs(100);
        assert_eq!(
            b.failed(t1, t1 + Duration::from_secs(60), AttemptEnd::Failed),
            Duration::ZERO
        );
        assert_eq!(b.failures(), 1);
    }

    #[test]
    fn unimplemented_waits_the_cap() {
        let mut b = ReconnectBackoff::new(policy());
        let now = Instant::now();
        for _ in 0..5 {
            assert_eq!(
                b.failed(now, now, AttemptEnd::Unimplemented),
                Duration::from_secs(60)
            );
        }
    }
}
