//! Which container stops each hint source reported, judged against the stops plegd
//! published: a source can be up and still miss stops (containerd 1.7 gives each CRI
//! event to one of its subscribers; a runtime may drop events), and `streaming` alone
//! would hide that. Each published ContainerDied is judged [`JUDGE_AFTER`] later, for
//! every source that was up from before the container's exit until then: reported, or
//! missed. The counts are on `plegd_hint_source_stops_total{source, result}`, in the
//! Hello's hint sources and `plegd status`. Bookkeeping only: it never asks for a
//! relist.
//!
//! Sources report sandboxes' stops too (the CRI stream's sandbox events, containerd's
//! pause tasks, NRI's StopPodSandbox), and those are not judged: a published sandbox
//! death only makes every source forget the sandbox at the same time a container's
//! would be judged. Stops of pods plegd never saw (a pod that came and went between
//! two relists) are never published: those stay until [`RETAIN`] or [`MAX_TRACKED`]
//! forgets them. So a stop is remembered by a keyed 64-bit hash of its ID, in the
//! table's own block, not as a string of its own: each string outlived the burst of
//! pods it came with, on a page of the heap that the burst's freed memory could not
//! be given back around (a churn of short-lived pods left up to 4,096 of them per
//! source, ≈ 0.3 MB of 64-hex IDs, plus their pages). Two IDs of one hash would at
//! worst count one's report for the other. The tables keep only the room they need
//! (`room.rs`).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher as _, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use plegd_telemetry::HintSourceName;

use crate::room::give_back_room;

/// How long after a stop's publication it is judged: a source's report may come after
/// a relist published the stop (the global relist found it first).
pub const JUDGE_AFTER: Duration = Duration::from_secs(3);
/// How long before a container's exit a source must have been up for the stop to be
/// its to report (its subscription takes a moment to be in place).
const UP_BEFORE: Duration = Duration::from_secs(1);
/// How long a reported stop is remembered.
const RETAIN: Duration = Duration::from_secs(30);
/// The most stops remembered per source, and waiting to be judged.
const MAX_TRACKED: usize = 4096;
/// A table this small keeps its room (`room.rs`).
const MIN_ROOM: usize = 64;

/// What a judgment found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Reported,
    Missed,
}

/// Shared by the hint sources, their watchers and the judge (cheap to clone).
#[derive(Clone, Default)]
pub struct Coverage(Arc<Mutex<Inner>>);

#[derive(Default)]
struct Inner {
    sources: HashMap<HintSourceName, Source>,
    /// Published stops waiting for judgment: container or sandbox ID (its [`Key`]),
    /// when it exited (on the monotonic clock; None: a sandbox, forgotten, not
    /// judged), when to judge.
    deaths: VecDeque<(Key, Option<Instant>, Instant)>,
    /// Keys the hash of IDs (random per process).
    keys: RandomState,
}

/// A container's or sandbox's ID as remembered: its keyed hash.
type Key = u64;

#[derive(Default)]
struct Source {
    /// Up since (None: down).
    up_since: Option<Instant>,
    /// Stops it reported (their [`Key`]), and when first.
    reported: HashMap<Key, Instant>,
    judged: u64,
    missed: u64,
}

impl Coverage {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The source's connection went up or down.
    pub fn up(&self, source: HintSourceName, up: bool, now: Instant) {
        let mut st = self.lock();
        let s = st.sources.entry(source).or_default();
        match (up, s.up_since) {
            (true, None) => s.up_since = Some(now),
            (false, _) => s.up_since = None,
            (true, Some(_)) => {}
        }
    }

    /// The source reported the stop of container (or sandbox) `id`.
    pub fn reported(&self, source: HintSourceName, id: &str, now: Instant) {
        let mut st = self.lock();
        let key = st.keys.hash_one(id);
        let s = st.sources.entry(source).or_default();
        if s.reported.len() >= MAX_TRACKED {
            s.reported
                .retain(|_, at| now.saturating_duration_since(*at) < RETAIN);
            if s.reported.len() >= MAX_TRACKED {
                s.reported.clear();
            }
        }
        s.reported.entry(key).or_insert(now);
    }

    /// plegd published the death of container `id`, which exited at `finished_at`
    /// (wall clock; None: unknown, then now).
    pub fn died(&self, id: &str, finished_at: Option<SystemTime>, now: Instant, wall: SystemTime) {
        let ago = finished_at
            .and_then(|f| wall.duration_since(f).ok())
            .unwrap_or_default();
        let exited = now.checked_sub(ago).unwrap_or(now);
        self.lock().wait(id, Some(exited), now);
    }

    /// plegd published the death of sandbox `id`: not judged, but forgotten by every
    /// source when a container's death would be judged (a report may come after the
    /// publication).
    pub fn sandbox_died(&self, id: &str, now: Instant) {
        self.lock().wait(id, None, now);
    }

    /// Judges the deaths due by `now`: for each source that was up from before the
    /// exit until now, whether it reported the stop.
    pub fn judge(&self, now: Instant) -> Vec<(HintSourceName, Verdict)> {
        let mut st = self.lock();
        let mut verdicts = Vec::new();
        while st.deaths.front().is_some_and(|(_, _, due)| *due <= now) {
            let Some((key, exited, _)) = st.deaths.pop_front() else {
                break;
            };
            let Some(exited) = exited else {
                for s in st.sources.values_mut() {
                    s.reported.remove(&key);
                }
                continue;
            };
            for (&name, s) in st.sources.iter_mut() {
                let covered = s.up_since.is_some_and(|since| since + UP_BEFORE <= exited);
                if !covered {
                    continue;
                }
                s.judged += 1;
                let verdict = if s.reported.remove(&key).is_some() {
                    Verdict::Reported
                } else {
                    s.missed += 1;
                    Verdict::Missed
                };
                verdicts.push((name, verdict));
            }
        }
        for s in st.sources.values_mut() {
            s.reported
                .retain(|_, at| now.saturating_duration_since(*at) < RETAIN);
            give_back_room(&mut s.reported, MIN_ROOM);
        }
        give_back_room(&mut st.deaths, MIN_ROOM);
        verdicts
    }

    /// Stops judged for `source`, and of those missed.
    pub fn counts(&self, source: HintSourceName) -> (u64, u64) {
        let st = self.lock();
        st.sources
            .get(&source)
            .map_or((0, 0), |s| (s.judged, s.missed))
    }
}

impl Inner {
    /// Queues a published death for [`Coverage::judge`] (`exited`: see `deaths`).
    fn wait(&mut self, id: &str, exited: Option<Instant>, now: Instant) {
        if self.deaths.len() >= MAX_TRACKED {
            self.deaths.pop_front();
        }
        let key = self.keys.hash_one(id);
        self.deaths.push_back((key, exited, now + JUDGE_AFTER));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HintSourceName::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_stop_is_judged_for_each_source_that_was_up_from_before_the_exit() {
        let c = Coverage::default();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        c.up(CriEvents, true, t0);
        c.up(ContainerdEvents, true, t0);
        // NRI came up only after the exit: not its to report.
        c.up(Nri, true, t0 + 9 * S + S / 2);
        c.reported(ContainerdEvents, "c1", t0 + 10 * S);
        // Exited at t0 + 10 s, published at t0 + 10.1 s.
        let published = t0 + 10 * S + S / 10;
        c.died("c1", Some(wall), published, wall + S / 10);
        assert_eq!(c.judge(published + S), vec![]);
        let mut verdicts = c.judge(published + JUDGE_AFTER);
        verdicts.sort_by_key(|(s, _)| s.as_str());
        assert_eq!(
            verdicts,
            [
                (ContainerdEvents, Verdict::Reported),
                (CriEvents, Verdict::Missed),
            ]
        );
        assert_eq!(c.counts(CriEvents), (1, 1));
        assert_eq!(c.counts(ContainerdEvents), (1, 0));
        assert_eq!(c.counts(Nri), (0, 0));
    }

    #[test]
    fn a_report_after_the_publication_counts_and_a_source_down_meanwhile_is_not_judged() {
        let c = Coverage::default();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        c.up(CriEvents, true, t0);
        c.up(Nri, true, t0);
        c.died("c1", Some(wall), t0 + 5 * S, wall);
        // The CRI stream's report comes after the relist published the stop.
        c.reported(CriEvents, "c1", t0 + 6 * S);
        // NRI went down and up again: its window broke.
        c.up(Nri, false, t0 + 6 * S);
        c.up(Nri, true, t0 + 7 * S);
        assert_eq!(
            c.judge(t0 + 5 * S + JUDGE_AFTER),
            vec![(CriEvents, Verdict::Reported)]
        );
    }

    /// After a churn of short-lived pods, each source still remembered every
    /// sandbox's stop it reported (never judged) for RETAIN, thousands of them, and
    /// its table kept the room it grew to: 336 KB for 4,096 stops, on top of their IDs.
    #[test]
    fn a_churn_leaves_no_stop_remembered_nor_the_room_it_took() {
        let c = Coverage::default();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        c.up(CriEvents, true, t0);
        let pods = 2000;
        for i in 0..pods {
            let (sandbox, container) = (format!("sandbox-{i}"), format!("container-{i}"));
            c.reported(CriEvents, &container, t0 + 2 * S);
            c.reported(CriEvents, &sandbox, t0 + 2 * S);
            c.died(&container, Some(wall + 2 * S), t0 + 2 * S, wall + 2 * S);
            c.sandbox_died(&sandbox, t0 + 2 * S);
        }
        let grown = c.lock().sources[&CriEvents].reported.capacity();
        assert!(grown >= 2 * pods, "{grown}");
        // Judged well within RETAIN of the reports.
        let verdicts = c.judge(t0 + 2 * S + JUDGE_AFTER);
        // Containers only: a sandbox is not judged.
        assert_eq!(verdicts.len(), pods);
        assert!(verdicts
            .iter()
            .all(|v| *v == (CriEvents, Verdict::Reported)));
        assert_eq!(c.counts(CriEvents), (pods as u64, 0));
        let st = c.lock();
        let reported = &st.sources[&CriEvents].reported;
        assert_eq!(reported.len(), 0);
        let small = crate::room::SHRINK_RATIO * MIN_ROOM;
        assert!(reported.capacity() <= small, "{}", reported.capacity());
        assert!(st.deaths.is_empty());
        assert!(st.deaths.capacity() <= small, "{}", st.deaths.capacity());
    }

    #[test]
    fn what_is_remembered_is_bounded() {
        let c = Coverage::default();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        for i in 0..3 * MAX_TRACKED {
            c.reported(CriEvents, &format!("c{i}"), t0);
            c.died(&format!("d{i}"), Some(wall), t0, wall);
        }
        let st = c.lock();
        assert!(st.deaths.len() <= MAX_TRACKED);
        assert!(st.sources.values().all(|s| s.reported.len() <= MAX_TRACKED));
    }
}
