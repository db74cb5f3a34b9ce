//! One recheck schedule for every hint source, and the bookkeeping the watchers share
//! so that a change several sources report costs the reads of one.
//!
//! containerd's task events and NRI's hooks come before CRI's status says what they
//! announce (measured on containerd 1.7 and 2.1): a task's exit comes tens of
//! milliseconds to seconds before CRI records it, because CRI first deletes the task;
//! the task's delete (and NRI's StopContainer, called from it) comes a few to a
//! hundred milliseconds before; a task's start a few milliseconds before CRI records
//! the container running. So a source does not read the pod once: it asks for the
//! [`schedule`] of its [`Sign`], and each recheck asks for a read only while the cache
//! does not show the awaited change (plus one read after it first does: a relist can
//! cache a status its container list did not show yet).
//!
//! Shared by every watcher ([`Rechecks`], cheap to clone):
//! - **claims**: the first source to report a sign of a change runs its schedule; a
//!   source reporting the same or an earlier sign of it afterwards asks for nothing (a
//!   stop that containerd's delete and NRI's hook both report is rechecked once);
//! - **pending requests**: a pod whose last hint request has not been read yet gets no
//!   second one, whichever source asks;
//! - **confirmations**: the one read after the cache first shows the change.
//!
//! Hint-side bookkeeping only: it moves reads, never writes state; whatever it drops,
//! the global relist still finds.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use crate::cache::PodCache;
use crate::hints::cri_stops::Expect;
use crate::hints::Hint;
use crate::room::give_back_room;

/// What a recheck waits for the cache to show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Awaited {
    /// The container running (or already exited).
    Started,
    /// The container exited (or gone).
    Exited,
    /// The sandbox not ready (or gone).
    SandboxStopped,
    /// The container or sandbox gone from its pod (or the pod gone).
    Removed,
}

/// How close a source's event is to the change CRI will record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Sign {
    /// The task started: CRI records the container running within milliseconds.
    Starting,
    /// The task exited: CRI records the exit only after deleting the task.
    Exited,
    /// The task was deleted, or NRI's stop hook ran: CRI records the stop next.
    Imminent,
    /// NRI's removal hook ran: CRI has removed it.
    Removed,
}

impl Sign {
    /// What the cache is to show after this sign (`sandbox`: of a sandbox).
    pub fn awaited(self, sandbox: bool) -> Awaited {
        match (self, sandbox) {
            (Sign::Starting, _) => Awaited::Started,
            (Sign::Removed, _) => Awaited::Removed,
            (_, true) => Awaited::SandboxStopped,
            (_, false) => Awaited::Exited,
        }
    }

    /// When a source rechecks after this sign, from the sign on.
    pub fn delays(self) -> &'static [Duration] {
        match self {
            Sign::Starting => STARTING,
            Sign::Exited => EXITED,
            Sign::Imminent => IMMINENT,
            Sign::Removed => REMOVED,
        }
    }
}

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// After a start: at once (the read also tells the cache about a container it did not
/// know, so that its exit can be traced), then until CRI has it running.
const STARTING: &[Duration] = &[ms(0), ms(10), ms(50), ms(250), ms(1000)];
/// After an exit: only in case the delete that should follow never comes (CRI could
/// not delete the task); the delete brings the dense schedule.
const EXITED: &[Duration] = &[ms(500), ms(1500), ms(3000), ms(5000)];
/// After a removal hook: at once, and in case the read came too early.
const REMOVED: &[Duration] = &[ms(0), ms(100), ms(1000)];
/// After a delete or a stop hook: densely where CRI usually records the stop (a few
/// to 150 ms on containerd 1.7 and 2.1 on two loaded cores), then sparser for a
/// runtime slowed by a burst of exits.
const IMMINENT: &[Duration] = &[
    ms(5),
    ms(15),
    ms(30),
    ms(60),
    ms(120),
    ms(250),
    ms(500),
    ms(1000),
    ms(2000),
    ms(4000),
];

/// The rechecks a source asks for after `sign` of `id` (`pod`: its UID, when the
/// source knows it), given what the CRI stream is expected to do about a stop
/// (`expect`; ignored for a start, which the stream does not relist): nothing when
/// the stream reported it; from its grace on while it should; else the sign's delays.
/// A delay of zero is a recheck at once.
pub fn schedule(
    id: &str,
    pod: Option<&str>,
    sign: Sign,
    awaited: Awaited,
    expect: Expect,
) -> Vec<Hint> {
    let from = match (awaited, expect) {
        (Awaited::Started | Awaited::Removed, _) => Duration::ZERO,
        (_, Expect::Reported) => return Vec::new(),
        (_, Expect::Within(grace)) => grace,
        (_, Expect::Unknown) => Duration::ZERO,
    };
    let mut delays: Vec<Duration> = sign
        .delays()
        .iter()
        .copied()
        .filter(|&d| d >= from)
        .collect();
    if !from.is_zero() && delays.first() != Some(&from) {
        delays.insert(0, from);
    }
    delays
        .into_iter()
        .map(|delay| {
            let recheck = Hint::Recheck {
                id: id.to_string(),
                pod: pod.map(String::from),
                awaited,
            };
            if delay.is_zero() {
                recheck
            } else {
                Hint::After {
                    delay,
                    hint: Box::new(recheck),
                }
            }
        })
        .collect()
}

/// How long a claim, a pending request or a confirmation is remembered at most.
const RETAIN: Duration = Duration::from_secs(10);
/// A request counts as pending at most this long (its relist may have failed before
/// reading the pod, which never advances the cache's read time).
pub const PENDING_FOR: Duration = Duration::from_secs(1);
/// Entries of each table before the oldest are forgotten.
const MAX_TRACKED: usize = 4096;
/// A table this small keeps its room (`room.rs`).
const MIN_ROOM: usize = 64;

/// Shared by every hint watcher.
#[derive(Clone, Default)]
pub struct Rechecks(Arc<Mutex<Inner>>);

#[derive(Default)]
struct Inner {
    /// The strongest sign claimed of each change, and when.
    claims: HashMap<(String, Awaited), (Sign, Instant)>,
    /// When a hint last asked for each pod.
    requested: HashMap<String, SystemTime>,
    /// Changes the cache showed, read once more since.
    confirmed: HashSet<(String, Awaited)>,
    /// When the tables last forgot what no longer counts.
    swept: Option<Instant>,
}

impl Rechecks {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind: keep using it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A source saw `sign` of a change: true when it is to run the schedule (no source
    /// claimed this change with this sign or a later one).
    pub fn claim(&self, id: &str, awaited: Awaited, sign: Sign, now: Instant) -> bool {
        let mut st = self.lock();
        let key = (id.to_string(), awaited);
        match st.claims.get(&key) {
            Some(&(held, at)) if held >= sign && now.saturating_duration_since(at) < RETAIN => {
                false
            }
            _ => {
                if st.claims.len() >= MAX_TRACKED {
                    st.claims
                        .retain(|_, (_, at)| now.saturating_duration_since(*at) < RETAIN);
                    if st.claims.len() >= MAX_TRACKED {
                        st.claims.clear();
                    }
                }
                st.claims.insert(key, (sign, now));
                true
            }
        }
    }

    /// Whether a hint's last request for `uid` is still pending: made less than
    /// [`PENDING_FOR`] ago and no read of the pod has begun since.
    pub fn pending(&self, cache: &PodCache, uid: &str, now: SystemTime) -> bool {
        let at = self.lock().requested.get(uid).copied();
        at.is_some_and(|at| is_pending(cache, uid, at, now))
    }

    /// A hint asked for `uid` now.
    pub fn requested(&self, cache: &PodCache, uid: &str, now: SystemTime) {
        let mut st = self.lock();
        if st.requested.len() >= MAX_TRACKED {
            st.requested
                .retain(|uid, &mut at| is_pending(cache, uid, at, now));
            if st.requested.len() >= MAX_TRACKED {
                st.requested.clear();
            }
        }
        st.requested.insert(uid.to_string(), now);
    }

    /// The cache shows the change: true the first time (read once more), false after.
    pub fn confirm(&self, id: &str, awaited: Awaited) -> bool {
        let mut st = self.lock();
        if st.confirmed.len() >= MAX_TRACKED {
            st.confirmed.clear();
        }
        st.confirmed.insert((id.to_string(), awaited))
    }

    /// Forgets what no longer counts and gives back the room (the watchers call this
    /// every second: without new hints nothing else would).
    pub fn tidy(&self, cache: &PodCache, now: Instant, wall: SystemTime) {
        let mut st = self.lock();
        if st
            .swept
            .is_some_and(|at| now.saturating_duration_since(at) < PENDING_FOR)
        {
            return;
        }
        st.swept = Some(now);
        st.claims
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < RETAIN);
        st.requested
            .retain(|uid, &mut at| is_pending(cache, uid, at, wall));
        st.confirmed.retain(|(id, _)| cache.owner_of(id).is_some());
        give_back_room(&mut st.claims, MIN_ROOM);
        give_back_room(&mut st.requested, MIN_ROOM);
        give_back_room(&mut st.confirmed, MIN_ROOM);
    }

    /// Entries remembered (claims, requests, confirmations).
    pub fn tracked(&self) -> usize {
        let st = self.lock();
        st.claims.len() + st.requested.len() + st.confirmed.len()
    }
}

fn is_pending(cache: &PodCache, uid: &str, at: SystemTime, now: SystemTime) -> bool {
    now.duration_since(at).unwrap_or_default() < PENDING_FOR
        && cache.get(uid).is_some_and(|e| e.modified < at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(delay: Duration, id: &str, awaited: Awaited) -> Hint {
        Hint::After {
            delay,
            hint: Box::new(Hint::Recheck {
                id: id.into(),
                pod: None,
                awaited,
            }),
        }
    }

    #[test]
    fn each_sign_has_its_delays_from_the_sign_on() {
        let hints = schedule("c1", None, Sign::Imminent, Awaited::Exited, Expect::Unknown);
        let want: Vec<Hint> = IMMINENT
            .iter()
            .map(|&d| after(d, "c1", Awaited::Exited))
            .collect();
        assert_eq!(hints, want);
        // A start reads at once, whatever the CRI stream does about stops.
        let hints = schedule(
            "c1",
            Some("u"),
            Sign::Starting,
            Awaited::Started,
            Expect::Reported,
        );
        assert_eq!(
            hints[0],
            Hint::Recheck {
                id: "c1".into(),
                pod: Some("u".into()),
                awaited: Awaited::Started
            }
        );
        assert_eq!(hints.len(), STARTING.len());
        for delays in [STARTING, EXITED, IMMINENT, REMOVED] {
            assert!(delays.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn while_the_cri_stream_reports_stops_rechecks_begin_at_its_grace() {
        let grace = ms(40);
        let hints = schedule(
            "c1",
            None,
            Sign::Imminent,
            Awaited::Exited,
            Expect::Within(grace),
        );
        assert_eq!(hints[0], after(grace, "c1", Awaited::Exited));
        let rest: Vec<Hint> = IMMINENT
            .iter()
            .filter(|&&d| d >= grace)
            .map(|&d| after(d, "c1", Awaited::Exited))
            .collect();
        assert_eq!(hints[1..], rest[..]);
        let reported = schedule(
            "c1",
            None,
            Sign::Imminent,
            Awaited::Exited,
            Expect::Reported,
        );
        assert_eq!(reported, vec![]);
    }

    #[test]
    fn a_change_is_claimed_once_per_sign_and_a_later_sign_takes_over() {
        let r = Rechecks::default();
        let t0 = Instant::now();
        assert!(r.claim("c1", Awaited::Exited, Sign::Exited, t0));
        // The same sign from another source: nothing more.
        assert!(!r.claim("c1", Awaited::Exited, Sign::Exited, t0 + ms(1)));
        // The delete comes: the dense schedule runs.
        assert!(r.claim("c1", Awaited::Exited, Sign::Imminent, t0 + ms(50)));
        // NRI's hook for the same stop, after the delete: nothing more.
        assert!(!r.claim("c1", Awaited::Exited, Sign::Imminent, t0 + ms(52)));
        assert!(!r.claim("c1", Awaited::Exited, Sign::Exited, t0 + ms(53)));
        // Another change of the same container is claimed apart.
        assert!(r.claim("c1", Awaited::Started, Sign::Starting, t0));
        // Long after, the same ID is a new change (a restarted task).
        assert!(r.claim("c1", Awaited::Exited, Sign::Exited, t0 + RETAIN + ms(60)));
    }

    #[test]
    fn a_change_is_confirmed_once() {
        let r = Rechecks::default();
        assert!(r.confirm("c1", Awaited::Exited));
        assert!(!r.confirm("c1", Awaited::Exited));
        assert!(r.confirm("c1", Awaited::Started));
    }

    #[test]
    fn what_is_remembered_is_bounded() {
        let r = Rechecks::default();
        let t0 = Instant::now();
        for i in 0..3 * MAX_TRACKED {
            r.claim(&format!("c{i}"), Awaited::Exited, Sign::Imminent, t0);
            r.confirm(&format!("c{i}"), Awaited::Exited);
        }
        assert!(r.tracked() <= 2 * MAX_TRACKED);
    }
}
