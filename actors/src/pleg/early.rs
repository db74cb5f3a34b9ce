//! Deaths a batch reports before the pod's lists answer.
//!
//! A targeted relist asked by a hint that names a container reads that container's
//! ContainerStatus together with the pod's lists (the prefetch). The status read is a
//! poll of the runtime like any other: when it says the container has exited and the
//! pod's record has it running (or created/unknown), the death is as certain as the
//! one the lists would show. So the batch publishes that ContainerDied at once, with
//! the exit from the status read, instead of waiting for the lists, which containerd
//! 2.1 serves slowly during a burst (its ListContainers takes every container's status
//! lock before it filters).
//!
//! What it changes, in this order, so that nothing is reported twice and nothing is
//! lost:
//! - the pod's record says the container exited (a later diff, global or targeted,
//!   finds no change for it; a list that no longer shows it gives ContainerRemoved
//!   alone, as for any exited container);
//! - the cache's status of the pod has that container's new status
//!   ([`CacheUpdate::Container`]), before the event is published;
//! - the pod's read, when its lists answer, is diffed against the record so changed
//!   (its own diff was taken against the record before the read).
//!
//! - the pod's status read, if its lists were taken before the exit, does not reuse
//!   the cache's running status of the container (`status::take_prefetched`), so the
//!   cache does not say running after the death, whichever comes first.
//!
//! Nothing else is taken from the prefetch early: a container the record does not
//! have (its sandbox is not known from a status read), a sandbox, a running or
//! created container all wait for the lists as before. A pod a sync holds reports
//! nothing early (its read is handed back unread or not committed either), nor does
//! a pod awaiting reinspection (its cache entry holds the error of its last read; the
//! read that clears it reports the change).
//!
//! A read whose lists answer in the same poll as its prefetch is committed first;
//! its early message then finds the death in the record and does nothing.

use std::time::SystemTime;

use super::diff::events_for;
use super::output::{cri_time, non_empty, CacheUpdate, RelistOutput};
use super::record::{PlegState, PodRecord};
use crate::event::{EventKind, Exit, LifecycleEvent, RelistSource};
use plegd_runtime::{ContainerState, ContainerStatus};

/// Exits a pod's prefetch read while its lists were still being read.
#[derive(Debug)]
pub(super) struct EarlyExits {
    pub uid: String,
    pub source: RelistSource,
    /// When the prefetch read began: the events' time.
    pub read_at: SystemTime,
    pub exited: Vec<ContainerStatus>,
}

/// True if a status read saying `st` is a death of a container `record` knows.
fn is_death(record: &PodRecord, st: &ContainerStatus) -> bool {
    st.state == ContainerState::Exited
        && record.containers.contains_key(&st.id)
        && events_for(record.state_of(&st.id), PlegState::Exited)
            .contains(&EventKind::ContainerDied)
}

/// The statuses of `statuses` that report a death of a container `record` knows
/// (what a read hands the batch at once; the batch checks again against the record
/// as it is then).
pub(super) fn deaths_in<'a>(
    record: Option<&PodRecord>,
    statuses: impl IntoIterator<Item = &'a ContainerStatus>,
) -> Vec<ContainerStatus> {
    let Some(record) = record else {
        return Vec::new();
    };
    statuses
        .into_iter()
        .filter(|st| is_death(record, st))
        .cloned()
        .collect()
}

/// Applies `early` to the pod's `record` (module docs): each death it still holds is
/// marked in the record and comes out as a cache update and a ContainerDied. Empty if
/// none does (the pod's read was committed first, or the record changed meanwhile).
pub(super) fn apply(record: &mut PodRecord, early: EarlyExits) -> RelistOutput {
    let mut out = RelistOutput::default();
    for st in early.exited {
        if !is_death(record, &st) {
            continue;
        }
        if let Some((_, state)) = record.containers.get_mut(&st.id) {
            *state = PlegState::Exited;
        }
        out.events.push(LifecycleEvent {
            revision: 0,
            time: early.read_at,
            pod: record.pod.clone(),
            kind: EventKind::ContainerDied,
            container_id: st.id.clone(),
            relist_source: early.source,
            container_name: st.name.clone(),
            sandbox: false,
            attempt: Some(st.attempt),
            image: non_empty(&st.image),
            exit: Some(Exit {
                code: st.exit_code,
                reason: non_empty(&st.reason),
                message: non_empty(&st.message),
                started_at: cri_time(st.started_at),
                finished_at: cri_time(st.finished_at),
            }),
        });
        out.cache.push(CacheUpdate::Container {
            uid: early.uid.clone(),
            status: st,
            read_at: early.read_at,
        });
    }
    out
}
