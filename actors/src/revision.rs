//! Revisions: one node-wide, strictly increasing number per published event and per
//! plegd instance (Kubernetes' resourceVersion), and the instance's id that scopes it.
//!
//! Why the RelistDispatcher issues them, not the EventPublisher: a subscriber that
//! lists the cache and then watches from the revision the list reflects (list + watch,
//! or a watch with initial events) must see each change exactly once. The dispatcher
//! issues a relist's revisions *before* it applies that relist's cache updates and
//! hands the last one to the CacheOwner in the same message, so the cache and the
//! revision it reflects change together (a snapshot is read by the CacheOwner between
//! two applies). Had the publisher numbered the events after the cache was written, a
//! snapshot taken in between would hold changes whose events come after its revision:
//! duplicates. A subscriber may therefore ask for a revision already issued but not yet
//! published; the publisher then skips the live events up to it (see `publisher`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::event::LifecycleEvent;

/// The revisions issued and shown. Only the dispatcher issues (one relist at a time);
/// anyone may read what is shown. A revision is shown once the relist that issued it
/// is stored (with a state dir, `state`; at once without): no consumer ever holds a
/// revision that a restart could issue again. Cheap to clone; clones share the
/// counters.
#[derive(Clone, Debug, Default)]
pub struct Revisions {
    issued: Arc<AtomicU64>,
    latest: Arc<AtomicU64>,
}

impl Revisions {
    /// Going on from `latest` (a restart on a state dir).
    pub fn starting_at(latest: u64) -> Self {
        Revisions {
            issued: Arc::new(AtomicU64::new(latest)),
            latest: Arc::new(AtomicU64::new(latest)),
        }
    }

    /// The latest revision shown so far (0 before any event).
    pub fn latest(&self) -> u64 {
        self.latest.load(Ordering::SeqCst)
    }

    /// Gives `events`, in order, the next revisions; returns the latest revision issued
    /// (unchanged when `events` is empty). Shown by [`Self::show`].
    pub fn issue(&self, events: &mut [LifecycleEvent]) -> u64 {
        let n = events.len() as u64;
        let base = self.issued.fetch_add(n, Ordering::SeqCst);
        for (i, ev) in events.iter_mut().enumerate() {
            ev.revision = base + i as u64 + 1;
        }
        base + n
    }

    /// Shows every revision up to `revision` (issued, and stored if there is a state
    /// dir).
    pub fn show(&self, revision: u64) {
        self.latest.fetch_max(revision, Ordering::SeqCst);
    }
}

/// A new instance id: 128 random bits as 32 lowercase hex digits. A client that
/// resumes from a revision names the instance it got it from; another instance (a
/// restarted plegd) refuses it rather than replaying unrelated numbers.
pub fn new_instance_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EventKind, RelistSource};
    use plegd_runtime::PodRef;
    use std::time::SystemTime;

    fn event() -> LifecycleEvent {
        LifecycleEvent {
            revision: 0,
            time: SystemTime::now(),
            pod: PodRef {
                uid: "u".into(),
                name: "n".into(),
                namespace: "ns".into(),
            },
            kind: EventKind::PodSync,
            container_id: String::new(),
            relist_source: RelistSource::Global,
            container_name: String::new(),
            sandbox: false,
            attempt: None,
            image: None,
            exit: None,
        }
    }

    #[test]
    fn revisions_follow_each_other_across_relists_and_an_empty_relist_issues_none() {
        let r = Revisions::default();
        assert_eq!(r.latest(), 0);
        let mut first = vec![event(), event(), event()];
        assert_eq!(r.issue(&mut first), 3);
        assert_eq!(r.latest(), 0, "issued is not shown");
        r.show(3);
        assert_eq!(r.issue(&mut []), 3);
        let mut second = vec![event()];
        assert_eq!(r.clone().issue(&mut second), 4);
        r.show(4);
        let got: Vec<u64> = first.iter().chain(&second).map(|e| e.revision).collect();
        assert_eq!(got, [1, 2, 3, 4]);
        assert_eq!(r.latest(), 4);
        let resumed = Revisions::starting_at(4);
        let mut third = vec![event()];
        assert_eq!(resumed.issue(&mut third), 5);
        assert_eq!(resumed.latest(), 4);
    }

    #[test]
    fn instance_ids_are_32_lowercase_hex_digits_and_differ() {
        let a = new_instance_id();
        let b = new_instance_id();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
        assert_ne!(a, b);
    }
}
