//! A pod's full status: each sandbox + the ContainerStatus of each container
//! (containerd 1.7's PodSandboxStatus carries no container statuses).
//!
//! Status calls are what a relist costs per pod (≈ 23 µs of plegd CPU each over CRI),
//! so a read makes only those that can tell plegd something new:
//! - a sandbox is taken from the ListPodSandbox entry its record was built from (it
//!   carries every field plegd keeps); only one with no entry at hand is read;
//! - a container the list says is Running, whose last status read (the cache's,
//!   [`LastReads`]) said Running with the same id, attempt and created_at, reuses that
//!   read: nothing plegd keeps changes while it runs;
//! - an Exited one likewise, once that read began at least [`EXIT_SETTLE`] after its
//!   `finished_at` (containerd may record an OOM kill's reason just after the exit);
//! - everything else is read, and every container of a pod whose last read failed.
//!
//! Prefetch: a targeted relist reads the container its hint names, and the pod's
//! exits not yet settled ([`unsettled_exits`]), with the pod's lists (one that may
//! show a death first: `pod_read`). A
//! container the rules above read takes that status if it has the list entry's id,
//! state, attempt and created_at; otherwise, or if the prefetch failed, it is read as
//! usual. Global relists never prefetch.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::try_join_all;
use tokio::sync::Semaphore;

use super::record::PodRecord;
use plegd_runtime::{
    Container, ContainerState, ContainerStatus, PodRef, RuntimeClient, RuntimeError, Sandbox,
};

/// What the cache holds for a pod: read from the runtime, never from an event payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodStatus {
    pub pod: PodRef,
    pub sandboxes: Vec<Sandbox>,
    pub containers: Vec<ContainerStatus>,
}

/// How long after its `finished_at` an exited container's status may still change
/// (module docs). containerd handles a container's OOM and exit events within
/// milliseconds of each other; 5 s leaves a wide margin on a loaded node and costs
/// about 5 reads per exit at the default 1 s relist period.
pub const EXIT_SETTLE: Duration = Duration::from_secs(5);

/// A pod's last status read, and when that read began.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastRead {
    pub status: PodStatus,
    pub read_at: SystemTime,
}

/// Where a relist finds the last status read of a pod (plegd: the cache, which the
/// dispatcher has updated with every earlier relist before it starts the next one).
pub trait LastReads: Send + Sync + 'static {
    /// The pod's last status read, if it succeeded and no read of the pod failed
    /// since (None otherwise: every container is read again).
    fn last_read(&self, uid: &str) -> Option<LastRead>;
}

/// True if `st` is an exit whose status a read that began `read_at` shows for good:
/// Exited, with a `finished_at`, at least `settle` before `read_at`.
fn settled_exit(st: &ContainerStatus, read_at: SystemTime, settle: Duration) -> bool {
    let Ok(read_ns) = read_at.duration_since(UNIX_EPOCH) else {
        return false;
    };
    let read_ns = i64::try_from(read_ns.as_nanos()).unwrap_or(i64::MAX);
    let settle_ns = i64::try_from(settle.as_nanos()).unwrap_or(i64::MAX);
    st.state == ContainerState::Exited
        && st.finished_at > 0
        && read_ns.saturating_sub(st.finished_at) >= settle_ns
}

/// The containers `last` found exited whose status had not settled then: a read of
/// the pod will call their ContainerStatus (a targeted relist prefetches them).
pub fn unsettled_exits(last: &LastRead, settle: Duration) -> impl Iterator<Item = &str> {
    last.status
        .containers
        .iter()
        .filter(move |st| {
            st.state == ContainerState::Exited && !settled_exit(st, last.read_at, settle)
        })
        .map(|st| st.id.as_str())
}

/// True if `status` says of a sandbox or container another state than `record` (the
/// lists it was read after): it changed between the list and the read, and may have
/// changed back before the next list, which would then see nothing to read again.
pub fn read_disagrees(record: &PodRecord, status: &PodStatus) -> bool {
    use super::record::PlegState;
    let sandboxes = status.sandboxes.iter().any(|sb| {
        record
            .sandboxes
            .get(&sb.id)
            .is_some_and(|s| *s != PlegState::from(sb.state))
    });
    sandboxes
        || status.containers.iter().any(|st| {
            record
                .containers
                .get(&st.id)
                .is_some_and(|(_, s)| *s != PlegState::from(st.state))
        })
}

/// The list entries a pod's record was built from (the last one listed of an id wins,
/// as in `record::group`).
#[derive(Debug, Default)]
pub struct Listed {
    pub sandboxes: HashMap<String, Sandbox>,
    pub containers: HashMap<String, Container>,
    /// Sandboxes listed without their labels (lists read with the list memo keep
    /// only those of entries not seen before: `plegd_runtime::SandboxRef::to_sandbox`).
    pub unlabeled: HashMap<String, Sandbox>,
}

impl Listed {
    /// The entries of `record`'s sandboxes and containers among `sandboxes` and
    /// `containers` (indexes of one relist's lists by id); those of `sandboxes` whose
    /// IDs are in `unlabeled` have no labels. `uid` is the record's pod: a sandbox id
    /// listed under another pod is no entry of this one.
    pub fn of(
        uid: &str,
        record: &PodRecord,
        sandboxes: &HashMap<&str, &Sandbox>,
        containers: &HashMap<&str, &Container>,
        unlabeled: &HashSet<String>,
    ) -> Listed {
        let (unlabeled, sandboxes) = record
            .sandboxes
            .keys()
            .filter_map(|id| id.with_str(|id| sandboxes.get(id).copied()))
            .filter(|s| s.pod.uid == uid)
            .map(|s| (s.id.clone(), (*s).clone()))
            .partition(|(id, _)| unlabeled.contains(id));
        Listed {
            sandboxes,
            unlabeled,
            containers: record
                .containers
                .iter()
                .filter_map(|(id, (sb, _))| {
                    id.with_str(|id| containers.get(id).copied())
                        .filter(|c| *sb == c.sandbox_id.as_str())
                })
                .map(|c| (c.id.clone(), (*c).clone()))
                .collect(),
        }
    }

    /// The sandboxes listed without their labels get those of `last`'s read of the
    /// same sandbox ID (a sandbox's labels never change: CRI sets them when it runs
    /// it). One `last` does not hold is left out, to be read with PodSandboxStatus.
    pub fn label_from(&mut self, last: Option<&LastRead>) {
        for (id, mut sandbox) in self.unlabeled.drain() {
            let read = last.and_then(|l| l.status.sandboxes.iter().find(|s| s.id == id));
            if let Some(read) = read {
                sandbox.labels = read.labels.clone();
                self.sandboxes.insert(id, sandbox);
            }
        }
    }
}

/// Indexes list entries by id; a later entry of an id replaces an earlier one.
pub fn index_sandboxes(list: &[Sandbox]) -> HashMap<&str, &Sandbox> {
    list.iter().map(|s| (s.id.as_str(), s)).collect()
}

/// See [`index_sandboxes`].
pub fn index_containers(list: &[Container]) -> HashMap<&str, &Container> {
    list.iter().map(|c| (c.id.as_str(), c)).collect()
}

/// The statuses of `last` that still hold: containers listed Running now whose last
/// read said Running, and containers listed Exited whose last read showed that exit
/// settled (`settle` after it), each with the same id, attempt and created_at.
pub fn reusable(
    listed: &Listed,
    last: Option<LastRead>,
    settle: Duration,
) -> HashMap<String, ContainerStatus> {
    let Some(LastRead { status, read_at }) = last else {
        return HashMap::new();
    };
    status
        .containers
        .into_iter()
        .filter(|st| {
            let still = match st.state {
                ContainerState::Running => true,
                ContainerState::Exited => settled_exit(st, read_at, settle),
                _ => false,
            };
            still
                && listed.containers.get(&st.id).is_some_and(|c| {
                    c.state == st.state && c.attempt == st.attempt && c.created_at == st.created_at
                })
        })
        .map(|st| (st.id.clone(), st))
        .collect()
}

/// What became of one relist's prefetched container statuses (see the module docs),
/// for `plegd_relist_prefetch_total`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchCounts {
    /// Stood in for the container's read.
    pub used: usize,
    /// Disagreed with the list entry: the container was read again.
    pub read_again: usize,
    /// The call failed (NotFound included).
    pub failed: usize,
    /// Not needed (the container was not read, or the pod was not).
    pub unused: usize,
}

impl PrefetchCounts {
    pub fn add(&mut self, other: PrefetchCounts) {
        self.used += other.used;
        self.read_again += other.read_again;
        self.failed += other.failed;
        self.unused += other.unused;
    }
}

/// Adds to `reuse` the prefetched statuses a read may take: those of containers it
/// would read (listed, not in `reuse`) that have their list entry's id, state,
/// attempt and created_at. Counts what became of each in `counts`.
///
/// A prefetch that says the container exited takes the place of a reused status that
/// says otherwise, or is read again if the list disagrees: a container never comes
/// back from its exit, so the last read is out of date (a list taken before the exit
/// still says running; `early`: the death may be published from this prefetch, and
/// the pod's status must not say running after it).
pub fn take_prefetched(
    listed: &Listed,
    reuse: &mut HashMap<String, ContainerStatus>,
    prefetched: HashMap<String, ContainerStatus>,
    counts: &mut PrefetchCounts,
) {
    for (id, st) in prefetched {
        let Some(entry) = listed.containers.get(&id) else {
            counts.unused += 1;
            continue;
        };
        let agrees = st.id == entry.id
            && st.state == entry.state
            && st.attempt == entry.attempt
            && st.created_at == entry.created_at;
        if st.state == ContainerState::Exited
            && reuse
                .get(&id)
                .is_some_and(|old| old.state != ContainerState::Exited)
        {
            reuse.remove(&id);
        }
        match reuse.entry(id) {
            Entry::Occupied(_) => counts.unused += 1,
            Entry::Vacant(_) if !agrees => counts.read_again += 1,
            Entry::Vacant(slot) => {
                counts.used += 1;
                slot.insert(st);
            }
        }
    }
}

/// Reads the record's pod: sandboxes from `listed` (PodSandboxStatus only for one not
/// there), containers from `reuse` (reused or prefetched statuses) or ContainerStatus,
/// concurrently within `calls` (the relist's bound on calls in flight). A container
/// that answers NotFound is gone (it went away after the list) and is left out, as
/// kubelet does; any other failure fails the whole read: a partial status would look
/// like a change that did not happen.
pub async fn read_pod_status(
    runtime: &dyn RuntimeClient,
    record: &PodRecord,
    listed: &Listed,
    reuse: &HashMap<String, ContainerStatus>,
    calls: &Semaphore,
) -> Result<PodStatus, RuntimeError> {
    let sandboxes = try_join_all(record.sandboxes.keys().map(|id| {
        let id = id.to_string();
        let entry = listed.sandboxes.get(&id).cloned();
        async move {
            match entry {
                Some(sb) => Ok(sb),
                None => {
                    let _permit = calls.acquire().await;
                    runtime.sandbox_status(&id).await
                }
            }
        }
    }));
    let containers = try_join_all(record.containers.iter().map(|(id, (sb, _))| {
        let id = id.to_string();
        let kept = reuse.get(&id).cloned();
        async move {
            let read = match kept {
                Some(st) => Ok(st),
                None => {
                    let _permit = calls.acquire().await;
                    runtime.container_status(&id).await
                }
            };
            match read {
                Ok(mut st) => {
                    st.sandbox_id = sb.to_string();
                    Ok(Some(st))
                }
                Err(e) if e.is_not_found() => Ok(None),
                Err(e) => Err(e),
            }
        }
    }));
    let (sandboxes, containers) = futures::try_join!(sandboxes, containers)?;
    Ok(PodStatus {
        pod: record.pod.to_pod_ref(),
        sandboxes,
        containers: containers.into_iter().flatten().collect(),
    })
}
