//! The global relist goes first (KEP-3386: the dispatcher "gives the periodic global
//! relist priority"). The dispatcher publishes here when the next global relist is due
//! and whether one is running; hint sources take no stream item while one is due, nor
//! while one runs, but for the first [`HEARD_BESIDE`] items of a running one that
//! hears them (it reads the containers they name beside its own reads,
//! `relist::machine`). On a busy thread a storm of hints would otherwise take the time
//! the global relist needs: it then waits in the sources' streams (and the runtime's
//! buffers), not in plegd, and costs latency, never correctness (the global relist
//! reads every pod anyway).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt as _};
use tokio::sync::Notify;

/// The longest a hint source waits at once: a dispatcher that never gets to its due
/// global relist (stalled, stopping) slows hints, never stops them.
const MAX_WAIT: Duration = Duration::from_secs(1);

/// The stream items the hint sources take, all together, while a global relist runs
/// and hears them (each source may also take one it was already waiting for when the
/// relist started).
pub const HEARD_BESIDE: usize = 64;

/// Not due (a queue that no dispatcher reads).
const NEVER: u64 = u64::MAX;

/// Shared by the dispatcher (which sets it) and every hint source. Cheap to clone.
#[derive(Clone)]
pub struct GlobalPriority(Arc<Inner>);

struct Inner {
    base: Instant,
    /// When the next global relist is due, in nanoseconds since `base`.
    due: AtomicU64,
    running: AtomicBool,
    /// The items the running global relist still takes from the hint sources.
    hearing: AtomicUsize,
    changed: Notify,
}

impl Default for GlobalPriority {
    /// Never due: hints never wait.
    fn default() -> Self {
        GlobalPriority(Arc::new(Inner {
            base: Instant::now(),
            due: AtomicU64::new(NEVER),
            running: AtomicBool::new(false),
            hearing: AtomicUsize::new(0),
            changed: Notify::new(),
        }))
    }
}

impl GlobalPriority {
    /// The dispatcher's view: whether a global relist is running and whether it hears
    /// hints, when the next is due. A relist that starts hearing takes
    /// [`HEARD_BESIDE`] items; told it no longer hears, it takes none.
    pub(crate) fn set(&self, running: bool, hearing: bool, next_due: Instant) {
        let nanos = next_due.saturating_duration_since(self.0.base).as_nanos();
        self.0
            .due
            .store(u64::try_from(nanos).unwrap_or(NEVER - 1), Ordering::SeqCst);
        let started = running && !self.0.running.load(Ordering::SeqCst);
        if !(running && hearing) {
            self.0.hearing.store(0, Ordering::SeqCst);
        } else if started {
            self.0.hearing.store(HEARD_BESIDE, Ordering::SeqCst);
        }
        self.0.running.store(running, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }

    /// True while a global relist is due at `now`, or running and not hearing them:
    /// hints wait.
    pub fn first(&self, now: Instant) -> bool {
        if self.0.running.load(Ordering::SeqCst) {
            return self.0.hearing.load(Ordering::SeqCst) == 0;
        }
        let due = self.0.due.load(Ordering::SeqCst);
        due != NEVER && now.saturating_duration_since(self.0.base).as_nanos() >= u128::from(due)
    }

    /// A hint source's turn to take an item at `now`: no global relist is due or
    /// running, or the running one hears it (one of its items taken).
    fn turn(&self, now: Instant) -> bool {
        if self.0.running.load(Ordering::SeqCst) {
            return self
                .0
                .hearing
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        }
        !self.first(now)
    }

    /// Returns once it is a hint source's turn to take an item (or after
    /// [`MAX_WAIT`]).
    pub async fn wait(&self) {
        let deadline = tokio::time::Instant::now() + MAX_WAIT;
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.turn(Instant::now()) {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return;
            }
        }
    }

    /// `stream`'s items, each taken only once [`Self::wait`] returns.
    pub fn pace<S>(&self, stream: S) -> impl Stream<Item = S::Item>
    where
        S: Stream + Unpin,
    {
        futures::stream::unfold((stream, self.clone()), |(mut s, p)| async move {
            p.wait().await;
            let item = s.next().await?;
            Some((item, (s, p)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_wait_while_a_global_relist_is_due_or_running() {
        let p = GlobalPriority::default();
        let t0 = Instant::now();
        assert!(!p.first(t0), "no dispatcher: never");
        p.set(false, false, t0 + Duration::from_millis(100));
        assert!(!p.first(t0));
        assert!(p.first(t0 + Duration::from_millis(100)), "due");
        p.set(true, false, t0 + Duration::from_millis(100));
        assert!(p.first(t0), "running");
        p.set(false, false, t0 + Duration::from_millis(100));
        p.set(true, true, t0 + Duration::from_millis(100));
        assert!(!p.first(t0), "running and hearing");
        assert!(
            !p.first(t0 + Duration::from_millis(100)),
            "running and hearing"
        );
        p.set(false, false, t0 + Duration::from_secs(1));
        assert!(!p.first(t0 + Duration::from_millis(999)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_hint_goes_on_when_the_global_relist_ends() {
        let p = GlobalPriority::default();
        p.set(true, false, Instant::now());
        let start = tokio::time::Instant::now();
        let waiter = tokio::spawn({
            let p = p.clone();
            async move { p.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        p.set(false, false, Instant::now() + Duration::from_secs(3600));
        waiter.await.unwrap();
        assert!(start.elapsed() < MAX_WAIT, "woken, not timed out");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_dispatcher_delays_hints_by_the_longest_wait_only() {
        let p = GlobalPriority::default();
        p.set(true, false, Instant::now());
        let start = tokio::time::Instant::now();
        p.wait().await;
        assert_eq!(start.elapsed(), MAX_WAIT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hearing_global_relist_takes_a_bounded_number_of_items() {
        let p = GlobalPriority::default();
        p.set(true, true, Instant::now() + Duration::from_secs(1));
        let start = tokio::time::Instant::now();
        for _ in 0..HEARD_BESIDE {
            p.wait().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "heard at once");
        assert!(p.first(Instant::now()), "then the sources wait");
        // Told again while it runs (a relist brought forward): no new items.
        p.set(true, true, Instant::now() + Duration::from_secs(1));
        let waiter = tokio::spawn({
            let p = p.clone();
            async move { p.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        p.set(false, false, Instant::now() + Duration::from_secs(1));
        waiter.await.unwrap();
        assert!(start.elapsed() < MAX_WAIT, "woken at its end");
        // The next relist hears again; told it no longer hears, it takes nothing.
        p.set(true, true, Instant::now() + Duration::from_secs(1));
        assert!(!p.first(Instant::now()));
        p.set(true, false, Instant::now() + Duration::from_secs(1));
        assert!(p.first(Instant::now()));
    }
}
