//! A global relist's pods, in chunks: which pods it visits, in order, and which list
//! entries each chunk needs to build its pods' records on its own (for memory).
//!
//! The first global relist of a node reads every pod. Built all at once, its
//! transients — every list entry as owned structs, every status read, every event —
//! made a heap peak of ≈ 44 MB at 10,000 pods, and the long-lived blocks allocated
//! meanwhile (records, packed statuses and events) were left scattered among them, so
//! glibc kept most of those pages. Visited in chunks of a few hundred pods, each
//! chunk read, applied and published before the next is built, the transients are
//! one chunk's, reused chunk after chunk.
//!
//! Equivalence with grouping every pod at once (`record::group` of the whole lists):
//! - pods are visited in the same order (by UID) and each once, so the chunks' outputs,
//!   one after the other, are what one output of all would have been;
//! - a chunk's entries are those of its pods in list order: its sandboxes by their
//!   pod's UID; its containers by the pod of the *last listed* sandbox of their
//!   sandbox id (group's rule), found over all the lists, so a container goes to the
//!   pod it would have gone to, and is left out when no sandbox of its id is listed
//!   (group leaves it out too: no pod had a record then);
//! - an id's list entry, that a pod's status read takes its sandbox (or reuses a
//!   running container's status) from, is the last listed one of that id over all the
//!   lists (status.rs' indexes): a chunk indexes only entries that are.
//!
//! A global relist whose pods cannot be placed without the records (a container whose
//! sandbox is not listed, an id listed twice, while records exist: `changes` answers
//! None) groups everything at once, with the records, in one chunk, as before.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;

use super::record::{Id, IdMap, PodName, PodRecord, RecordTable};
use plegd_runtime::{ContainerRef, ListView, SandboxRef};

/// Pods of a global relist read and applied at once (plegd's default). 256 pods: a
/// chunk's transients are a few hundred KB, and each chunk still has many more status
/// reads than the calls in flight.
pub const CHUNK_PODS: usize = 256;

/// The pods a global relist visits, sorted by UID, each once; and where each chunk's
/// entries are.
pub struct Plan<'v> {
    pub uids: Vec<Cow<'v, str>>,
    pub entries: Entries,
    /// Pods per chunk.
    chunk: usize,
}

/// Where a chunk's list entries are.
pub enum Entries {
    /// Every listed entry, grouped with the records, in one chunk.
    All,
    /// Per pod (index in `uids`), its entries (indices in the view's lists).
    ByPod(ByPod),
}

pub struct ByPod {
    /// The placed sandboxes and containers as (pod, index in the list, the last listed
    /// entry of its id among those placed: the one an index by id holds), sorted by
    /// pod then index. Only placed entries: a relist that rebuilds a few pods holds a
    /// few.
    sandboxes: Vec<(u32, u32, bool)>,
    containers: Vec<(u32, u32, bool)>,
}

/// The entries of pods `range` (sorted by pod then index), in list order.
fn of(entries: &[(u32, u32, bool)], range: &Range<usize>) -> Vec<(u32, bool)> {
    let from = entries.partition_point(|e| (e.0 as usize) < range.start);
    let to = entries.partition_point(|e| (e.0 as usize) < range.end);
    let mut items: Vec<(u32, bool)> = entries[from..to].iter().map(|e| (e.1, e.2)).collect();
    items.sort_unstable();
    items
}

/// One chunk's entries: indices in the view's lists, in list order, and whether each
/// is the last listed entry of its id.
pub struct ChunkEntries {
    pub sandboxes: Vec<(u32, bool)>,
    pub containers: Vec<(u32, bool)>,
}

impl<'v> Plan<'v> {
    /// Every pod at once with its records (see the module docs).
    pub fn all(uids: Vec<Cow<'v, str>>) -> Plan<'v> {
        Plan {
            uids: sorted(uids),
            entries: Entries::All,
            chunk: usize::MAX,
        }
    }

    /// `uids`: the pods to visit (any order, repeats allowed); `placed(uid)`: whether
    /// that pod's listed sandboxes are grouped (the others' entries are left out, and
    /// so are the containers of their sandbox ids). Every pod with a placed sandbox
    /// must be among `uids`; `chunk`: pods per chunk (at least 1).
    pub fn by_pod(
        uids: Vec<Cow<'v, str>>,
        view: &ListView<'v>,
        placed: impl Fn(&str) -> bool,
        chunk: usize,
    ) -> Plan<'v> {
        let uids = sorted(uids);
        if uids.is_empty() {
            return Plan {
                uids,
                entries: Entries::ByPod(ByPod {
                    sandboxes: Vec::new(),
                    containers: Vec::new(),
                }),
                chunk: chunk.max(1),
            };
        }
        let (sandboxes, containers) = (view.sandboxes(), view.containers());
        let pod_index: HashMap<&str, u32> = uids
            .iter()
            .enumerate()
            .map(|(i, u)| (u.as_ref(), i as u32))
            .collect();
        // The last listed placed sandbox of each id: (its index, its pod).
        let mut owner: HashMap<&str, (u32, u32)> = HashMap::new();
        let mut placed_sandboxes = Vec::new();
        for (i, sb) in sandboxes.iter().enumerate() {
            if !placed(sb.uid) {
                continue;
            }
            let Some(&pod) = pod_index.get(sb.uid) else {
                debug_assert!(false, "a placed pod not planned");
                continue;
            };
            owner.insert(sb.id, (i as u32, pod));
            placed_sandboxes.push((pod, i as u32, false));
        }
        for e in &mut placed_sandboxes {
            e.2 = owner.get(sandboxes[e.1 as usize].id).map(|o| o.0) == Some(e.1);
        }
        let mut last_container: HashMap<&str, u32> = HashMap::new();
        let mut placed_containers = Vec::new();
        for (i, c) in containers.iter().enumerate() {
            if let Some(&(_, pod)) = owner.get(c.sandbox_id) {
                last_container.insert(c.id, i as u32);
                placed_containers.push((pod, i as u32, false));
            }
        }
        for e in &mut placed_containers {
            e.2 = last_container.get(containers[e.1 as usize].id) == Some(&e.1);
        }
        placed_sandboxes.sort_unstable();
        placed_containers.sort_unstable();
        drop((owner, last_container, pod_index));
        Plan {
            entries: Entries::ByPod(ByPod {
                sandboxes: placed_sandboxes,
                containers: placed_containers,
            }),
            uids,
            chunk: chunk.max(1),
        }
    }

    /// The chunks, as ranges of `uids`: at least one (an empty one when there is no
    /// pod, so that the relist still ends with a last chunk).
    pub fn chunks(&self) -> Vec<Range<usize>> {
        let n = self.uids.len();
        if n == 0 {
            return std::iter::once(0..0).collect();
        }
        let size = self.chunk.min(n);
        (0..n).step_by(size).map(|a| a..(a + size).min(n)).collect()
    }

    /// The entries of the pods `range` (by-pod plans only).
    pub fn entries_of(&self, range: &Range<usize>) -> Option<ChunkEntries> {
        let Entries::ByPod(by) = &self.entries else {
            return None;
        };
        Some(ChunkEntries {
            sandboxes: of(&by.sandboxes, range),
            containers: of(&by.containers, range),
        })
    }
}

/// The records `record::group` makes of these lists with no earlier record, built
/// from the lists in place (no owned entry on the way), in list order.
pub fn group_all(sandboxes: &[SandboxRef<'_>], containers: &[ContainerRef<'_>]) -> RecordTable {
    let mut pods = RecordTable::with_capacity_and_hasher(sandboxes.len(), Default::default());
    let mut owner: HashMap<&str, &str> = HashMap::with_capacity(sandboxes.len());
    for sb in sandboxes {
        owner.insert(sb.id, sb.uid);
        let pod = || PodName::new(sb.uid, sb.name, sb.namespace);
        let rec = match pods.get_mut(sb.uid) {
            Some(rec) => {
                // The newest sandbox names the pod.
                if !rec.pod.is(sb.uid, sb.name, sb.namespace) {
                    rec.pod = pod();
                }
                rec
            }
            None => pods.entry(sb.uid.to_string()).or_insert(PodRecord {
                pod: pod(),
                sandboxes: IdMap::new(),
                containers: IdMap::new(),
            }),
        };
        rec.sandboxes.insert(sb.id, sb.state.into());
    }
    for c in containers {
        if let Some(rec) = owner.get(c.sandbox_id).and_then(|uid| pods.get_mut(*uid)) {
            rec.containers
                .insert(c.id, (Id::new(c.sandbox_id), c.state.into()));
        }
    }
    pods
}

fn sorted(mut uids: Vec<Cow<'_, str>>) -> Vec<Cow<'_, str>> {
    uids.sort_unstable();
    uids.dedup();
    uids
}

#[cfg(test)]
mod tests {
    use super::super::record::tests::sandbox;
    use super::*;
    use plegd_runtime::{Container, ContainerState};

    fn container(id: &str, sandbox_id: &str) -> Container {
        Container {
            id: id.into(),
            sandbox_id: sandbox_id.into(),
            name: id.into(),
            attempt: 0,
            state: ContainerState::Running,
            created_at: 0,
        }
    }

    #[test]
    fn chunks_cover_every_pod_once_in_uid_order_and_an_empty_plan_has_one_chunk() {
        let uids = ["c", "a", "b", "a", "e", "d"].map(Cow::Borrowed).to_vec();
        let none = ListView::default();
        let plan = Plan::by_pod(uids, &none, |_| true, 2);
        assert_eq!(plan.uids, ["a", "b", "c", "d", "e"]);
        assert_eq!(plan.chunks(), [0..2, 2..4, 4..5]);
        let empty = Plan::by_pod(Vec::new(), &none, |_| true, 2);
        let one_empty: Vec<Range<usize>> = std::iter::once(0..0).collect();
        assert_eq!(empty.chunks(), one_empty);
        assert_eq!(Plan::all(Vec::new()).chunks(), one_empty);
    }

    /// A container goes to the pod of the last listed sandbox of its id; entries keep
    /// list order; only the last listed entry of an id is marked so.
    #[test]
    fn entries_follow_the_last_listed_sandbox_of_an_id() {
        let sandboxes = [
            sandbox("s1", "b"),
            sandbox("dup", "a"),
            sandbox("s2", "a"),
            sandbox("dup", "b"),
            sandbox("x", "skipped"),
        ];
        let containers = [
            container("c-dup", "dup"),
            container("c1", "s1"),
            container("orphan", "gone"),
            container("c2", "s2"),
            container("cx", "x"),
            container("c1", "s1"),
        ];
        let view = ListView::of(&sandboxes, &containers);
        let uids = ["a", "b"].map(Cow::Borrowed).to_vec();
        let plan = Plan::by_pod(uids, &view, |u| u != "skipped", 1);
        let a = plan.entries_of(&(0..1)).unwrap();
        assert_eq!(a.sandboxes, [(1, false), (2, true)]);
        assert_eq!(a.containers, [(3, true)]);
        let b = plan.entries_of(&(1..2)).unwrap();
        assert_eq!(b.sandboxes, [(0, true), (3, true)]);
        assert_eq!(b.containers, [(0, true), (1, false), (5, true)]);
        let both = plan.entries_of(&(0..2)).unwrap();
        assert_eq!(
            both.sandboxes.iter().map(|e| e.0).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert!(Plan::all(Vec::new()).entries_of(&(0..0)).is_none());
    }
}
