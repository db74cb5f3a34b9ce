//! Deaths a batch reports before the pod's lists answer (containerd 2.1 serves
//! ListContainers slowly during a burst). A targeted relist's prefetched
//! ContainerStatus is a poll like any other: when it shows an exit that the pod's
//! record does not have, that ContainerDied is published at once, with its exit.
//!
//! So that nothing is reported twice or lost, in this order: the pod's record says
//! the container exited (a later diff finds no change for it); the cache gets its new
//! status ([`CacheUpdate::Container`]) before the event is published; the pod's read,
//! when its lists answer, is diffed against the record so changed and does not reuse
//! the cache's running status (`status::take_prefetched`).
//!
//! Only a known container's exit goes early: not a sandbox, a container the record
//! lacks, a pod a sync holds or one awaiting reinspection. A read whose lists answer
//! in the same poll as its prefetch is committed first; its early message then finds
//! the death in the record and does nothing.

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
    st.state == ContainerState::Exited && may_die(record, &st.id)
}

/// True if an exit of container `id` would be a death `record` does not have yet.
fn may_die(record: &PodRecord, id: &str) -> bool {
    record.containers.contains_key(id)
        && events_for(record.state_of(id), PlegState::Exited).contains(&EventKind::ContainerDied)
}

/// `ids` split in two: those whose status read could report a death early (a
/// container `record` knows and has not seen exit), and the rest.
pub(super) fn split_possible_deaths(
    record: Option<&PodRecord>,
    ids: &[String],
) -> (Vec<String>, Vec<String>) {
    ids.iter()
        .cloned()
        .partition(|id| record.is_some_and(|record| may_die(record, id)))
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
            pod: record.pod.to_pod_ref(),
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
