//! The old → new diff, exactly as kubelet's Generic PLEG computes it.

use std::collections::BTreeSet;

use super::record::{Id, PlegState, PodRecord};
use crate::event::EventKind;

/// Events for one ID going from `old` to `new` (kubelet's generateEvents).
pub fn events_for(old: PlegState, new: PlegState) -> &'static [EventKind] {
    use EventKind::*;
    if old == new {
        return &[];
    }
    match new {
        PlegState::Running => &[ContainerStarted],
        PlegState::Exited => &[ContainerDied],
        PlegState::Unknown => &[ContainerChanged],
        PlegState::NonExistent => match old {
            PlegState::Exited => &[ContainerRemoved],
            _ => &[ContainerDied, ContainerRemoved],
        },
    }
}

/// Events for a whole pod: over the union of old and new sandbox and container IDs.
/// Returns (id, kind) pairs in a stable order (sandboxes, then containers, by ID).
pub fn pod_events(old: Option<&PodRecord>, new: Option<&PodRecord>) -> Vec<(String, EventKind)> {
    let mut sandbox_ids = BTreeSet::new();
    let mut container_ids = BTreeSet::new();
    for rec in [old, new].into_iter().flatten() {
        sandbox_ids.extend(rec.sandboxes.keys());
        container_ids.extend(rec.containers.keys());
    }
    // One ID space, as kubelet's set of IDs: an ID that is both a sandbox and a
    // container is diffed once, or its events would be published twice (fuzzing).
    container_ids.retain(|id| !sandbox_ids.contains(id));
    let state = |rec: Option<&PodRecord>, id: &Id| {
        rec.map(|r| r.state_of_id(id))
            .unwrap_or(PlegState::NonExistent)
    };
    let mut out = Vec::new();
    for id in sandbox_ids.into_iter().chain(container_ids) {
        for kind in events_for(state(old, id), state(new, id)) {
            out.push((id.to_string(), *kind));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use EventKind::*;
    use PlegState::*;

    #[test]
    fn transitions_match_kubelet() {
        let cases: &[(PlegState, PlegState, &[EventKind])] = &[
            (NonExistent, Running, &[ContainerStarted]),
            (NonExistent, Exited, &[ContainerDied]),
            (NonExistent, Unknown, &[ContainerChanged]),
            (Unknown, Running, &[ContainerStarted]),
            (Running, Exited, &[ContainerDied]),
            (Running, NonExistent, &[ContainerDied, ContainerRemoved]),
            (Unknown, NonExistent, &[ContainerDied, ContainerRemoved]),
            (Exited, NonExistent, &[ContainerRemoved]),
            (Exited, Running, &[ContainerStarted]),
            (Running, Unknown, &[ContainerChanged]),
            (Running, Running, &[]),
            (Exited, Exited, &[]),
            (NonExistent, NonExistent, &[]),
        ];
        for (old, new, want) in cases {
            assert_eq!(events_for(*old, *new), *want, "{old:?} -> {new:?}");
        }
    }

    /// Found by fuzzing (fuzz/, target relist_diff): an ID listed both as a sandbox and
    /// as a container of the pod was diffed twice, so each of its events was published
    /// twice. The crashing input grouped sandbox `id0` (unknown) and a container `id0`
    /// (created) of that sandbox: `[ContainerChanged, ContainerChanged]`.
    #[test]
    fn an_id_that_is_a_sandbox_and_a_container_is_diffed_once() {
        use crate::pleg::record::IdMap;
        let record = |state: PlegState| PodRecord {
            pod: super::super::record::PodName::new("uid0", "name0", "ns"),
            sandboxes: IdMap::from([("id0".to_string(), state)]),
            containers: IdMap::from([("id0", ("id0".into(), state))]),
        };
        let id0 = |kinds: &[EventKind]| -> Vec<(String, EventKind)> {
            kinds.iter().map(|k| ("id0".to_string(), *k)).collect()
        };
        let unknown = record(Unknown);
        assert_eq!(pod_events(None, Some(&unknown)), id0(&[ContainerChanged]));
        let running = record(Running);
        assert_eq!(
            pod_events(Some(&unknown), Some(&running)),
            id0(&[ContainerStarted])
        );
        assert_eq!(
            pod_events(Some(&running), None),
            id0(&[ContainerDied, ContainerRemoved])
        );
    }
}
