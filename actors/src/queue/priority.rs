//! The global relist goes first (KEP-3386: the dispatcher "gives the periodic global
//! relist priority"). The dispatcher publishes here when the next global relist is due
//! and whether one is running; hint sources take no stream item while one is due or
//! running, unless the running one hears them (it reads what the first few name beside
//! its own reads, `relist::machine`). On a busy thread a storm of hints would otherwise take the time the global
//! relist needs: it then waits in the sources' streams (and the runtime's buffers),
//! not in plegd, and costs latency, never correctness (the global relist reads every
//! pod anyway).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt as _};
use tokio::sync::Notify;

/// The longest a hint source waits at once: a dispatcher that never gets to its due
/// global relist (stalled, stopping) slows hints, never stops them.
const MAX_WAIT: Duration = Duration::from_secs(1);

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
    /// The running global relist takes hints.
    hearing: AtomicBool,
    changed: Notify,
}

impl Default for GlobalPriority {
    /// Never due: hints never wait.
    fn default() -> Self {
        GlobalPriority(Arc::new(Inner {
            base: Instant::now(),
            due: AtomicU64::new(NEVER),
            running: AtomicBool::new(false),
            hearing: AtomicBool::new(false),
            changed: Notify::new(),
        }))
    }
}

impl GlobalPriority {
    /// The dispatcher's view: whether a global relist is running and whether it hears
    /// hints, when the next is due.
    pub(crate) fn set(&self, running: bool, hearing: bool, next_due: Instant) {
        let nanos = next_due.saturating_duration_since(self.0.base).as_nanos();
        self.0
            .due
            .store(u64::try_from(nanos).unwrap_or(NEVER - 1), Ordering::SeqCst);
        self.0.hearing.store(hearing, Ordering::SeqCst);
        self.0.running.store(running, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }

    /// True while a global relist is due at `now`, or running and not hearing them:
    /// hints wait.
    pub fn first(&self, now: Instant) -> bool {
        if self.0.running.load(Ordering::SeqCst) {
            return !self.0.hearing.load(Ordering::SeqCst);
        }
        let due = self.0.due.load(Ordering::SeqCst);
        due != NEVER && now.saturating_duration_since(self.0.base).as_nanos() >= u128::from(due)
    }

    /// Returns once no global relist is due or running (or after [`MAX_WAIT`]).
    pub async fn wait(&self) {
        let deadline = tokio::time::Instant::now() + MAX_WAIT;
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.first(Instant::now()) {
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
}
