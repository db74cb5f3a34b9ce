//! The runtime's true history, as the executor mutates it, and the checks of what
//! plegd published against it.
//!
//! plegd samples each sandbox's and container's state at its relists and publishes
//! kubelet's events for the difference between two samples (docs/architecture.md,
//! "Event semantics"). So what a correct plegd publishes about one ID is exactly what some
//! sequence of samples of that ID's true history, taken in order, yields. The check
//! runs that as a small automaton over the history: the set of positions the last
//! sample may have been at, advanced by each published event.
//!
//! - soundness: every event moves the automaton (it matches a real transition, in
//!   order for this ID), and no ContainerDied follows another without a start between;
//! - completeness: at the end, the last sample can be the final state (every change
//!   visible in the final state was published). Published events are read from a
//!   subscriber that never drops; a dropping subscriber is checked against it.

use std::collections::BTreeMap;
use std::fmt;

use plegd_actors::{Delivery, EventKind};
use plegd_runtime::{ContainerState, PodRef, SandboxState};

/// One ID's state as Generic PLEG compares it (kubelet's plegContainerState).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum St {
    /// Absent: before creation, after removal.
    Gone,
    Running,
    Exited,
    /// Created or unknown.
    Unknown,
}

impl St {
    pub fn of_container(s: Option<ContainerState>) -> St {
        match s {
            None => St::Gone,
            Some(ContainerState::Running) => St::Running,
            Some(ContainerState::Exited) => St::Exited,
            Some(ContainerState::Created | ContainerState::Unknown) => St::Unknown,
        }
    }

    pub fn of_sandbox(s: Option<SandboxState>) -> St {
        match s {
            None => St::Gone,
            Some(SandboxState::Ready) => St::Running,
            Some(SandboxState::NotReady) => St::Exited,
            Some(SandboxState::Unknown) => St::Unknown,
        }
    }

    fn letter(self) -> char {
        match self {
            St::Gone => 'N',
            St::Running => 'R',
            St::Exited => 'E',
            St::Unknown => 'U',
        }
    }
}

/// One sandbox's or container's true history.
#[derive(Clone, Debug)]
pub struct IdTruth {
    pub pod: PodRef,
    pub sandbox: bool,
    /// Consecutive states, each different from the one before; starts with Gone.
    pub history: Vec<St>,
}

/// Every ID the run created, with its history.
#[derive(Clone, Debug, Default)]
pub struct Truth {
    ids: BTreeMap<String, IdTruth>,
    /// Pods that ever existed (a PodSync must name one of them).
    pods: BTreeMap<String, PodRef>,
    /// The exit code of each container that exited (a container exits at most once).
    exits: BTreeMap<String, i32>,
}

impl Truth {
    /// Records the state `id` has now (right after the step that changed it).
    pub fn observe(&mut self, id: &str, pod: &PodRef, sandbox: bool, now: St) {
        self.pods.insert(pod.uid.clone(), pod.clone());
        let t = self.ids.entry(id.to_string()).or_insert_with(|| IdTruth {
            pod: pod.clone(),
            sandbox,
            history: vec![St::Gone],
        });
        if t.history.last() != Some(&now) {
            t.history.push(now);
        }
    }

    /// Records that container `id` exited with `code`.
    pub fn exited(&mut self, id: &str, code: i32) {
        self.exits.insert(id.to_string(), code);
    }

    /// State changes the runtime went through.
    pub fn transitions(&self) -> usize {
        self.ids.values().map(|t| t.history.len() - 1).sum()
    }

    /// Checks the events a never-dropping subscriber received (in order), against the
    /// histories. Every problem is listed.
    pub fn check_events(&self, events: &[Delivery], complete: bool) -> Vec<String> {
        let mut problems = Vec::new();
        let mut per_id: BTreeMap<&str, Vec<EventKind>> = BTreeMap::new();
        let mut last_time: BTreeMap<&str, std::time::SystemTime> = BTreeMap::new();
        for d in events {
            let ev = &d.event;
            // Relists run one at a time and stamp a pod's events with the start of
            // their read of it: a pod's events never go back in time.
            if let Some(prev) = last_time.insert(ev.pod.uid.as_str(), ev.time) {
                if ev.time < prev {
                    problems.push(format!(
                        "seq {}: {} of pod {} is older than the pod's previous event",
                        d.seq, ev.kind, ev.pod.uid
                    ));
                }
            }
            if d.missed != 0 {
                problems.push(format!(
                    "the checking subscriber missed {} events before seq {}",
                    d.missed, d.seq
                ));
            }
            if ev.kind == EventKind::PodSync {
                if !ev.container_id.is_empty() || self.pods.get(&ev.pod.uid) != Some(&ev.pod) {
                    problems.push(format!(
                        "PodSync of a pod that never existed or with a container: {ev:?}"
                    ));
                }
                continue;
            }
            if ev.kind == EventKind::ContainerChanged {
                problems.push(format!("ContainerChanged published: {ev:?}"));
                continue;
            }
            // A death tells the exit the runtime reported, when the read saw one (a
            // container removed before plegd read it has none to tell).
            if let Some(exit) = ev
                .exit
                .as_ref()
                .filter(|_| ev.kind == EventKind::ContainerDied)
            {
                let real = self.exits.get(&ev.container_id);
                if real != Some(&exit.code) {
                    problems.push(format!(
                        "seq {}: ContainerDied of {} with exit code {}, but it exited with {real:?}",
                        d.seq, ev.container_id, exit.code
                    ));
                }
            }
            match self.ids.get(&ev.container_id) {
                None => problems.push(format!(
                    "{} about {:?}, which the runtime never had (seq {})",
                    ev.kind, ev.container_id, d.seq
                )),
                Some(t) if t.pod != ev.pod => problems.push(format!(
                    "{} about {} names pod {:?}, but it belongs to {:?}",
                    ev.kind, ev.container_id, ev.pod, t.pod
                )),
                Some(_) => per_id
                    .entry(ev.container_id.as_str())
                    .or_default()
                    .push(ev.kind),
            }
        }
        for (id, t) in &self.ids {
            let kinds = per_id.remove(id.as_str()).unwrap_or_default();
            if let Err(why) = check_id(&t.history, &kinds, complete) {
                problems.push(format!(
                    "{} {id} of pod {}: history {} published {}: {why}",
                    if t.sandbox { "sandbox" } else { "container" },
                    t.pod.uid,
                    Hist(&t.history),
                    Kinds(&kinds),
                ));
            }
        }
        problems
    }
}

/// Runs the sampling automaton for one ID: Ok if `kinds` is what some in-order
/// sampling of `history` publishes (and, if `complete`, one ending at its last state).
pub fn check_id(history: &[St], kinds: &[EventKind], complete: bool) -> Result<(), String> {
    use EventKind::*;
    let mut died_since_start = false;
    for (i, k) in kinds.iter().enumerate() {
        match k {
            ContainerStarted => died_since_start = false,
            ContainerDied if died_since_start => {
                return Err(format!("ContainerDied twice without a start (event {i})"));
            }
            ContainerDied => died_since_start = true,
            _ => {}
        }
    }
    // Positions the last sample may be at. Sampling an unknown state publishes
    // nothing (ContainerChanged is filtered), nor does sampling the same state again.
    let closure = |set: &[bool]| -> Vec<bool> {
        let mut out = set.to_vec();
        for p in 0..history.len() {
            if !set[p] {
                continue;
            }
            for (j, st) in history.iter().enumerate().skip(p + 1) {
                if *st == history[p] || *st == St::Unknown {
                    out[j] = true;
                }
            }
        }
        out
    };
    let mut at = vec![false; history.len()];
    at[0] = true;
    at = closure(&at);
    let mut i = 0;
    while i < kinds.len() {
        let mut next = vec![false; history.len()];
        // Died immediately followed by Removed may be one sample (→ gone, from a state
        // other than exited) as well as two.
        let pair = kinds[i] == ContainerDied && kinds.get(i + 1) == Some(&ContainerRemoved);
        let mut next_pair = vec![false; history.len()];
        for p in (0..history.len()).filter(|&p| at[p]) {
            let from = history[p];
            for (j, to) in history.iter().copied().enumerate().skip(p + 1) {
                let ok = match kinds[i] {
                    ContainerStarted => to == St::Running && from != St::Running,
                    ContainerDied => to == St::Exited && from != St::Exited,
                    ContainerRemoved => to == St::Gone && from == St::Exited,
                    PodSync | ContainerChanged => false,
                };
                if ok {
                    next[j] = true;
                }
                if pair && to == St::Gone && from != St::Exited && from != St::Gone {
                    next_pair[j] = true;
                }
            }
        }
        // Follow the two readings of a Died+Removed pair: as one sample, and as two.
        let single = closure(&next);
        let mut after_two = vec![false; history.len()];
        if pair {
            for p in (0..history.len()).filter(|&p| single[p]) {
                for j in p + 1..history.len() {
                    if history[j] == St::Gone && history[p] == St::Exited {
                        after_two[j] = true;
                    }
                }
            }
            let mut merged = closure(&after_two);
            for (m, x) in merged.iter_mut().zip(closure(&next_pair)) {
                *m |= x;
            }
            at = merged;
            i += 2;
        } else {
            at = single;
            i += 1;
        }
        if !at.iter().any(|&x| x) {
            return Err(format!(
                "event {} ({:?}) matches no transition of the runtime",
                i - 1,
                kinds[i - 1]
            ));
        }
    }
    if complete && !at[history.len() - 1] {
        return Err(format!(
            "incomplete: the last state {:?} was never published",
            history[history.len() - 1]
        ));
    }
    Ok(())
}

struct Hist<'a>(&'a [St]);

impl fmt::Display for Hist<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("→")?;
            }
            write!(f, "{}", s.letter())?;
        }
        Ok(())
    }
}

struct Kinds<'a>(&'a [EventKind]);

impl fmt::Display for Kinds<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("nothing");
        }
        let names: Vec<&str> = self
            .0
            .iter()
            .map(|k| match k {
                EventKind::ContainerStarted => "Started",
                EventKind::ContainerDied => "Died",
                EventKind::ContainerRemoved => "Removed",
                EventKind::PodSync => "PodSync",
                EventKind::ContainerChanged => "Changed",
            })
            .collect();
        f.write_str(&names.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EventKind::*;
    use St::*;

    #[test]
    fn the_automaton_accepts_samplings_and_nothing_else() {
        let h = [Gone, Unknown, Running, Exited, Gone];
        // Seen running, then exited, then gone; or running, then gone (one sample for
        // the exit and the removal): the same events.
        check_id(
            &h,
            &[ContainerStarted, ContainerDied, ContainerRemoved],
            true,
        )
        .unwrap();
        // Never seen at all.
        check_id(&h, &[], true).unwrap();
        // First seen exited.
        check_id(&h, &[ContainerDied, ContainerRemoved], true).unwrap();
        // Incomplete: the removal was not published.
        assert!(check_id(&h, &[ContainerStarted, ContainerDied], true).is_err());
        check_id(&h, &[ContainerStarted, ContainerDied], false).unwrap();
        // Out of order.
        assert!(check_id(&h, &[ContainerDied, ContainerStarted], false).is_err());
        // Running → gone directly: Died+Removed is one sample, not two.
        let direct = [Gone, Running, Gone];
        check_id(
            &direct,
            &[ContainerStarted, ContainerDied, ContainerRemoved],
            true,
        )
        .unwrap();
        assert!(check_id(&direct, &[ContainerStarted, ContainerDied], false).is_err());
        // A restart through unknown publishes Started twice.
        let flap = [Gone, Running, Unknown, Running];
        check_id(&flap, &[ContainerStarted, ContainerStarted], true).unwrap();
        assert!(check_id(
            &[Gone, Running],
            &[ContainerStarted, ContainerStarted],
            true
        )
        .is_err());
        // Died twice without a start between is refused outright.
        let h2 = [Gone, Running, Exited, Unknown, Exited];
        assert!(check_id(
            &h2,
            &[ContainerStarted, ContainerDied, ContainerDied],
            false
        )
        .is_err());
        // Unknown → gone without exiting is still a death.
        check_id(
            &[Gone, Unknown, Gone],
            &[ContainerDied, ContainerRemoved],
            true,
        )
        .unwrap();
    }
}
