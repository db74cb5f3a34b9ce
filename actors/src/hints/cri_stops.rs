//! What the CRI event stream has reported, for the sources whose events come earlier
//! (containerd's event service, NRI): shared by the hint sources only, never plegd's
//! state.
//!
//! containerd publishes a task's exit (and calls NRI's StopContainer) before its CRI
//! plugin records the container as exited; the CRI plugin sends its
//! CONTAINER_STOPPED_EVENT right after it does (measured on 1.7 and 2.1: 30–70 ms after
//! the exit for a single exit, up to 500 ms in a burst). A read of the pod before then
//! finds the container running: when the CRI stream reports the stop, the early
//! sources' reads were all for nothing, and they load the runtime while it is finishing
//! the exit (the three default sources cost +16 ms p50 on containerd 1.7 against
//! the CRI stream alone). The early sources exist for the stops the stream
//! does not report: it is down, the runtime has none (1.6), or containerd 1.7 gave the
//! event to another subscriber.
//!
//! So an early source [`announce`](CriStops::announce)s each stop it sees and gets an
//! [`Expect`]: while the stream is up and has reported the early sources' recent stops,
//! it waits a grace before its first read — how long the stream took to report them
//! (the 75th percentile of the last [`LAGS`], within [`MIN_GRACE`]..[`MAX_GRACE`]) —
//! and drops every recheck once the stream has reported the stop
//! ([`reported`](CriStops::reported)): the stream's own relist reads the pod after the
//! runtime recorded it. A stop the stream misses is read at the grace and rechecked
//! as densely as before (containerd 1.7 gives each CRI event to one subscriber: those
//! must still be found quickly); without the stream, or before it has reported
//! [`MIN_LAGS`] of them, nothing waits. The percentile trades the two: a quarter of the
//! reported stops get a read or two before their report, the missed ones wait about
//! what a reported one takes. A hint lost or late here only moves a read:
//! the global relist still finds everything.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::room::give_back_room;

/// How many stop-to-report lags the grace is taken from.
pub const LAGS: usize = 32;
/// Lags needed before an early source waits for the stream.
pub const MIN_LAGS: usize = 3;
/// The shortest grace.
pub const MIN_GRACE: Duration = Duration::from_millis(20);
/// The longest grace: a missed stop is read at most this late (the global relist
/// comes every second by default).
pub const MAX_GRACE: Duration = Duration::from_millis(600);
/// How long a stop is remembered (announced or reported).
const RETAIN: Duration = Duration::from_secs(10);
/// The most stops remembered of each kind; beyond it the oldest are forgotten.
const MAX_REMEMBERED: usize = 4096;
/// A table of remembered stops this small keeps its room (`room.rs`).
const MIN_ROOM: usize = 64;

/// What an early source may expect of the CRI stream for a stop it saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The stream has already reported it: its relist covers the stop.
    Reported,
    /// The stream should report it within this grace: read then, not before.
    Within(Duration),
    /// No stream, or it has not shown it reports stops: read now.
    Unknown,
}

/// Shared by every hint watcher (cheap to clone).
#[derive(Clone, Default)]
pub struct CriStops(Arc<Mutex<Inner>>);

#[derive(Default)]
struct Inner {
    streaming: bool,
    /// Stops an early source announced that the stream has not reported: when first
    /// announced.
    announced: Remembered,
    /// Stops the stream reported, and when.
    reported: Remembered,
    /// The last lags from an announcement to the stream's report.
    lags: VecDeque<Duration>,
}

impl CriStops {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind: keep using it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The CRI stream is up (or down: then nothing waits for it).
    pub fn set_streaming(&self, up: bool) {
        self.lock().streaming = up;
    }

    /// The CRI stream reported the stop of this container or sandbox.
    pub fn reported(&self, id: &str, now: Instant) {
        let mut st = self.lock();
        if let Some(at) = st.announced.remove(id) {
            let lag = now.saturating_duration_since(at);
            if st.lags.len() == LAGS {
                st.lags.pop_front();
            }
            st.lags.push_back(lag);
        }
        st.announced.forget_old(now);
        st.reported.insert(id, now);
    }

    /// Whether the CRI stream has reported this stop (recently).
    pub fn was_reported(&self, id: &str) -> bool {
        self.lock().reported.contains_key(id)
    }

    /// An early source saw the stop of this container or sandbox: what it may expect.
    pub fn announce(&self, id: &str, now: Instant) -> Expect {
        let mut st = self.lock();
        if st.reported.contains_key(id) {
            return Expect::Reported;
        }
        if !st.announced.contains_key(id) {
            st.reported.forget_old(now);
            st.announced.insert(id, now);
        }
        match st.grace() {
            Some(grace) => Expect::Within(grace),
            None => Expect::Unknown,
        }
    }

    /// Forgets the stops remembered longer than [`RETAIN`] and gives back the room
    /// (the hint watchers call this every second: without new stops, nothing else
    /// would).
    pub fn tidy(&self, now: Instant) {
        let mut st = self.lock();
        st.announced.forget_old(now);
        st.reported.forget_old(now);
    }

    /// Stops remembered, announced and reported, and the room their tables hold.
    #[cfg(test)]
    pub fn remembered(&self) -> (usize, usize) {
        let st = self.lock();
        (
            st.announced.len() + st.reported.len(),
            st.announced.room() + st.reported.room(),
        )
    }

    /// The grace an early source now waits for the stream, if it waits.
    #[cfg(test)]
    pub fn grace(&self) -> Option<Duration> {
        self.lock().grace()
    }
}

impl Inner {
    fn grace(&self) -> Option<Duration> {
        if !self.streaming || self.lags.len() < MIN_LAGS {
            return None;
        }
        let mut lags: Vec<Duration> = self.lags.iter().copied().collect();
        lags.sort_unstable();
        let p75 = lags[(lags.len() * 3 / 4).min(lags.len() - 1)];
        Some(p75.clamp(MIN_GRACE, MAX_GRACE))
    }
}

/// Stops remembered for [`RETAIN`], at most [`MAX_REMEMBERED`]: after a churn of
/// short-lived pods it holds the last seconds' stops, not thousands for good.
#[derive(Default)]
struct Remembered {
    at: HashMap<String, Instant>,
    /// Every insertion in order (an id removed or inserted again stays here until it
    /// is older than RETAIN, then is checked against `at`).
    order: VecDeque<(Instant, String)>,
}

impl Remembered {
    fn contains_key(&self, id: &str) -> bool {
        self.at.contains_key(id)
    }

    fn remove(&mut self, id: &str) -> Option<Instant> {
        self.at.remove(id)
    }

    /// Remembers `id` from `now` on, forgetting what is too old or too many.
    fn insert(&mut self, id: &str, now: Instant) {
        self.forget_old(now);
        while self.at.len() >= MAX_REMEMBERED {
            match self.order.pop_front() {
                Some((at, old)) => self.forget(&old, at),
                None => self.at.clear(),
            }
        }
        self.at.insert(id.to_string(), now);
        self.order.push_back((now, id.to_string()));
    }

    /// Forgets what was remembered longer than [`RETAIN`] before `now`.
    fn forget_old(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < RETAIN {
                break;
            }
            if let Some((at, id)) = self.order.pop_front() {
                self.forget(&id, at);
            }
        }
        give_back_room(&mut self.at, MIN_ROOM);
        give_back_room(&mut self.order, MIN_ROOM);
    }

    /// Forgets `id` if it is still remembered from `at` (not inserted again since).
    fn forget(&mut self, id: &str, at: Instant) {
        if self.at.get(id) == Some(&at) {
            self.at.remove(id);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.at.len()
    }

    #[cfg(test)]
    fn room(&self) -> usize {
        self.at.capacity() + self.order.capacity()
    }
}

/// For the early sources' tests: a CRI stream that is up and has reported
/// [`MIN_LAGS`] stops `lag` after an early source announced them (the grace is `lag`).
#[cfg(test)]
pub fn reporting_stream(lag: Duration) -> CriStops {
    let stops = CriStops::default();
    stops.set_streaming(true);
    let t = Instant::now();
    for i in 0..MIN_LAGS {
        let id = format!("learned-{i}");
        stops.announce(&id, t);
        stops.reported(&id, t + lag);
    }
    stops
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// `n` stops announced, then reported `lag` later each.
    fn learn(stops: &CriStops, t0: Instant, n: usize, lag: Duration) -> Instant {
        let mut t = t0;
        for i in 0..n {
            let id = format!("learn-{i}-{t:?}");
            stops.announce(&id, t);
            t += lag;
            stops.reported(&id, t);
            t += MS;
        }
        t
    }

    #[test]
    fn nothing_waits_without_the_stream_or_before_it_reported_enough_stops() {
        let stops = CriStops::default();
        let t0 = Instant::now();
        // Lags learned while down: still nothing waits.
        let t = learn(&stops, t0, MIN_LAGS, 40 * MS);
        assert_eq!(stops.announce("c1", t), Expect::Unknown);
        stops.set_streaming(true);
        assert!(matches!(stops.announce("c1", t), Expect::Within(_)));
        // Down again: read now.
        stops.set_streaming(false);
        assert_eq!(stops.announce("c2", t), Expect::Unknown);
        // Up, but too few lags.
        let fresh = CriStops::default();
        fresh.set_streaming(true);
        let t = learn(&fresh, t0, MIN_LAGS - 1, 40 * MS);
        assert_eq!(fresh.announce("c1", t), Expect::Unknown);
    }

    #[test]
    fn the_grace_is_the_recent_lags_75th_percentile_within_bounds() {
        let stops = CriStops::default();
        stops.set_streaming(true);
        let t0 = Instant::now();
        let t = learn(&stops, t0, 9, 40 * MS);
        assert_eq!(stops.grace(), Some(40 * MS));
        // Two slow reports among twelve do not move it; three do.
        let t = learn(&stops, t, 2, 400 * MS);
        assert_eq!(stops.grace(), Some(40 * MS));
        let t = learn(&stops, t, 1, 400 * MS);
        assert_eq!(stops.grace(), Some(400 * MS));
        // Only the last 32 count.
        let t = learn(&stops, t, LAGS, 40 * MS);
        assert_eq!(stops.grace(), Some(40 * MS));
        // Bounded.
        let t = learn(&stops, t, LAGS, 2000 * MS);
        assert_eq!(stops.grace(), Some(MAX_GRACE));
        learn(&stops, t, LAGS, MS);
        assert_eq!(stops.grace(), Some(MIN_GRACE));
    }

    #[test]
    fn a_reported_stop_is_covered_and_the_lag_counts_from_the_first_announcement() {
        let stops = CriStops::default();
        stops.set_streaming(true);
        let t0 = Instant::now();
        let t = learn(&stops, t0, MIN_LAGS - 1, 40 * MS);
        // Announced twice (a task exit, then NRI's hook): the lag is from the first.
        stops.announce("c1", t);
        stops.announce("c1", t + 30 * MS);
        stops.reported("c1", t + 80 * MS);
        assert!(stops.was_reported("c1"));
        assert_eq!(stops.announce("c1", t + 90 * MS), Expect::Reported);
        assert_eq!(stops.grace(), Some(80 * MS));
        // A report nobody announced counts no lag.
        stops.reported("c2", t + 100 * MS);
        assert_eq!(stops.grace(), Some(80 * MS));
        assert!(!stops.was_reported("c3"));
    }

    #[test]
    fn what_is_remembered_is_bounded() {
        let stops = CriStops::default();
        let t0 = Instant::now();
        for i in 0..3 * MAX_REMEMBERED {
            let id = format!("c{i}");
            stops.announce(&id, t0);
            stops.reported(&format!("r{i}"), t0);
        }
        let st = stops.lock();
        assert!(st.announced.len() <= MAX_REMEMBERED);
        assert!(st.reported.len() <= MAX_REMEMBERED);
        assert!(st.lags.len() <= LAGS);
    }

    /// Memory after a churn: what a churn's stops filled is forgotten once
    /// older than RETAIN, and its room given back; before, up to 4,096 ids of each kind
    /// stayed for good (forgotten only once the table was full).
    #[test]
    fn a_churns_stops_are_forgotten_after_a_while() {
        let stops = CriStops::default();
        let t0 = Instant::now();
        for i in 0..3000 {
            stops.announce(&format!("early-{i}"), t0);
            stops.reported(&format!("c{i}"), t0);
        }
        let room = {
            let st = stops.lock();
            assert_eq!((st.announced.len(), st.reported.len()), (3000, 3000));
            st.reported.room()
        };
        let later = t0 + RETAIN + MS;
        assert_eq!(stops.announce("one", later), Expect::Unknown);
        stops.reported("two", later);
        assert!(!stops.was_reported("c0"));
        let st = stops.lock();
        assert_eq!((st.announced.len(), st.reported.len()), (1, 1));
        assert!(
            st.reported.room() < room / 10,
            "{} of {room}",
            st.reported.room()
        );
    }

    /// A stop reported again is remembered from its last report.
    #[test]
    fn a_stop_reported_again_is_remembered_from_then() {
        let stops = CriStops::default();
        let t0 = Instant::now();
        stops.reported("c1", t0);
        stops.reported("c1", t0 + RETAIN / 2);
        stops.reported("c2", t0 + RETAIN + MS);
        assert!(stops.was_reported("c1"));
        stops.reported("c3", t0 + RETAIN + RETAIN / 2 + MS);
        assert!(!stops.was_reported("c1"));
        assert!(stops.was_reported("c2"));
    }
}
