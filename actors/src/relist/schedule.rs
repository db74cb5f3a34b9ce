//! The global relist's schedule and the verdict on a targeted request (KEP-3386
//! "Design Details": polling is the source of truth, the event stream only a hint),
//! pure and clock-free: callers pass `now`, so tests drive it with a fake clock.
//!
//! - A global relist is due one relist period after the last one started, whatever
//!   the event stream does.
//! - It can be brought forward (after a stream reconnect, events around the gap may be
//!   lost) at most once per period; a brought-forward relist that failed (the runtime
//!   still down) does not use up the period's one.
//! - A targeted request enqueued before the start of the last successful global
//!   relist is covered: that relist read the pod after the request's cause. A pod a
//!   sync holds was skipped by every global relist, so its request is coalesced into
//!   the sync gate's pending relist instead.
//! - `kubelet_pleg_relist_interval_seconds` is the time between the starts of two
//!   global relists, successful or not.

use std::time::{Duration, Instant};

/// Longer periods are shortened to this, so `start + period` cannot overflow an
/// `Instant` (the period comes from configuration).
const MAX_PERIOD: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// When the next global relist is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// One period after the last global relist started (at start-up: at once).
    Periodic(Instant),
    /// Brought forward to this instant; if it succeeds it uses up the period's one.
    BroughtForward(Instant),
}

/// When the global relist runs and what it covers. Owned by the RelistDispatcher.
#[derive(Clone, Copy, Debug)]
pub struct GlobalSchedule {
    period: Duration,
    next: Next,
    /// Start of the last global relist, successful or not.
    last_start: Option<Instant>,
    /// Start of the last successful global relist.
    covered_until: Option<Instant>,
    /// Start of the last brought-forward global relist that succeeded.
    last_brought_forward: Option<Instant>,
}

/// What to do with a targeted relist request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Relist the pod.
    Run,
    /// A global relist that started after the request has completed: nothing to do.
    Skip,
    /// A sync holds the pod: the request is its sync gate's pending relist.
    Coalesce,
}

impl GlobalSchedule {
    /// A schedule whose first global relist is due at `now`.
    pub fn new(period: Duration, now: Instant) -> Self {
        GlobalSchedule {
            period: period.min(MAX_PERIOD),
            next: Next::Periodic(now),
            last_start: None,
            covered_until: None,
            last_brought_forward: None,
        }
    }

    /// When the next global relist is due.
    pub fn next_due(&self) -> Instant {
        match self.next {
            Next::Periodic(t) | Next::BroughtForward(t) => t,
        }
    }

    /// True if a global relist is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next_due()
    }

    /// True if a completed global relist started after `enqueued_at`.
    pub fn covers(&self, enqueued_at: Instant) -> bool {
        self.covered_until.is_some_and(|c| enqueued_at < c)
    }

    /// The verdict on a request enqueued at `enqueued_at`, given whether a sync holds
    /// its pod now. A held pod's request is always coalesced, covered or not: global
    /// relists skipped the pod, and the gate relists it on release.
    pub fn verdict(&self, enqueued_at: Instant, held: bool) -> Verdict {
        if held {
            Verdict::Coalesce
        } else if self.covers(enqueued_at) {
            Verdict::Skip
        } else {
            Verdict::Run
        }
    }

    /// Brings the next global relist forward to `now`, unless one brought forward
    /// succeeded less than a period ago or one is already due. True if the due time
    /// changed (the caller's timer must be re-armed).
    pub fn bring_forward(&mut self, now: Instant) -> bool {
        if self
            .last_brought_forward
            .is_some_and(|t| now.saturating_duration_since(t) < self.period)
        {
            return false;
        }
        if self.next_due() <= now {
            return false;
        }
        self.next = Next::BroughtForward(now);
        true
    }

    /// Records a global relist that started at `start` and has completed (`ok`: its
    /// lists succeeded). The next one is due a period after `start`. Returns the
    /// interval since the previous global relist's start, to observe as
    /// `relist_interval` (None for the first one).
    pub fn completed(&mut self, start: Instant, ok: bool) -> Option<Duration> {
        let interval = self
            .last_start
            .map(|prev| start.saturating_duration_since(prev));
        self.last_start = Some(start);
        let brought_forward = matches!(self.next, Next::BroughtForward(_));
        self.next = Next::Periodic(start + self.period);
        if ok {
            self.covered_until = Some(start);
            if brought_forward {
                self.last_brought_forward = Some(start);
            }
        }
        interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: Duration = Duration::from_secs(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_first_relist_is_due_at_once_then_one_period_after_each_start() {
        let t0 = Instant::now();
        let mut s = GlobalSchedule::new(PERIOD, t0);
        assert!(s.due(t0));
        assert_eq!(s.next_due(), t0);
        // A relist that took 300 ms: the next is due a period after its start.
        assert_eq!(s.completed(t0, true), None);
        assert_eq!(s.next_due(), t0 + PERIOD);
        assert!(!s.due(t0 + ms(999)));
        assert!(s.due(t0 + PERIOD));
        // A failed relist reschedules just the same.
        let t1 = t0 + ms(1200);
        assert_eq!(s.completed(t1, false), Some(ms(1200)));
        assert_eq!(s.next_due(), t1 + PERIOD);
    }

    #[test]
    fn the_interval_runs_from_start_to_start_whatever_the_outcome() {
        let t0 = Instant::now();
        let mut s = GlobalSchedule::new(PERIOD, t0);
        assert_eq!(s.completed(t0, false), None);
        assert_eq!(s.completed(t0 + ms(1000), false), Some(ms(1000)));
        assert_eq!(s.completed(t0 + ms(2500), true), Some(ms(1500)));
        assert_eq!(s.completed(t0 + ms(2600), true), Some(ms(100)));
    }

    #[test]
    fn only_a_successful_relist_covers_requests_enqueued_before_its_start() {
        let t0 = Instant::now();
        let mut s = GlobalSchedule::new(PERIOD, t0);
        assert!(!s.covers(t0), "nothing covers before the first relist");
        let start = t0 + ms(10);
        s.completed(start, false);
        assert!(!s.covers(t0), "a failed relist read nothing");
        s.completed(start, true);
        assert!(s.covers(t0));
        assert!(s.covers(start - ms(1)));
        assert!(!s.covers(start), "enqueued at the start: maybe not seen");
        assert!(!s.covers(start + ms(1)));
        // A later failure does not take the coverage back.
        s.completed(start + PERIOD, false);
        assert!(s.covers(t0));
        assert!(!s.covers(start + ms(1)));
    }

    #[test]
    fn a_held_pod_is_coalesced_covered_or_not_else_covered_is_skipped() {
        let t0 = Instant::now();
        let mut s = GlobalSchedule::new(PERIOD, t0);
        assert_eq!(s.verdict(t0, false), Verdict::Run);
        assert_eq!(s.verdict(t0, true), Verdict::Coalesce);
        s.completed(t0 + ms(1), true);
        assert_eq!(s.verdict(t0, false), Verdict::Skip);
        assert_eq!(s.verdict(t0, true), Verdict::Coalesce);
        assert_eq!(s.verdict(t0 + ms(2), false), Verdict::Run);
        assert_eq!(s.verdict(t0 + ms(2), true), Verdict::Coalesce);
    }

    #[test]
    fn bring_forward_at_most_once_per_period() {
        let t0 = Instant::now();
        let mut s = GlobalSchedule::new(PERIOD, t0);
        // Already due (start-up): nothing to bring forward.
        assert!(!s.bring_forward(t0));
        s.completed(t0, true);
        let t1 = t0 + ms(100);
        assert!(s.bring_forward(t1));
        assert!(s.due(t1));
        assert_eq!(s.next_due(), t1);
        // Asking again before it ran changes nothing.
        assert!(!s.bring_forward(t1 + ms(1)));
        s.completed(t1 + ms(2), true);
        assert_eq!(s.next_due(), t1 + ms(2) + PERIOD);
        // Used up: refused for a period after that relist's start ...
        assert!(!s.bring_forward(t1 + ms(500)));
        assert!(!s.bring_forward(t1 + ms(2) + ms(999)));
        assert_eq!(s.next_due(), t1 + ms(2) + PERIOD);
        // ... then honoured again (if the periodic one is not already due).
        let t2 = t1 + ms(2) + ms(1000);
        assert!(!s.bring_forward(t2), "due anyway at that instant");
        s.completed(t2, true);
        assert!(s.bring_forward(t2 + ms(1)));
    }

    #[test]
    fn a_brought_forward_relist_that_failed_does_not_use_up_the_period() {
        let t0 = Instant::now();
        let mut s = GlobalSchedule::new(PERIOD, t0);
        s.completed(t0, true);
        let mut t = t0 + ms(10);
        for _ in 0..3 {
            assert!(
                s.bring_forward(t),
                "a failed one is honoured again at {t:?}"
            );
            s.completed(t, false);
            t += ms(10);
        }
        assert!(s.bring_forward(t));
        s.completed(t, true);
        assert!(!s.bring_forward(t + ms(10)), "a successful one uses it up");
    }

    #[test]
    fn a_periodic_relist_does_not_use_up_the_brought_forward_one() {
        let t0 = Instant::now();
        let mut s = GlobalSchedule::new(PERIOD, t0);
        s.completed(t0, true);
        s.completed(t0 + PERIOD, true);
        assert!(s.bring_forward(t0 + PERIOD + ms(1)));
    }

    #[test]
    fn an_absurd_period_cannot_overflow_the_clock() {
        let t0 = Instant::now();
        let mut s = GlobalSchedule::new(Duration::MAX, t0);
        s.completed(t0, true);
        assert_eq!(s.next_due(), t0 + MAX_PERIOD);
        assert!(s.bring_forward(t0 + ms(1)));
    }
}
