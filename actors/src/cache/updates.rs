//! Applying a relist: its cache updates, then what its events said of each pod.

use std::time::SystemTime;

use actix::prelude::*;

use super::entry::ReadStamp;
use super::{CacheOwner, StoredPod};
use crate::event::{EventKind, RelistSource};
use crate::packed_status::{PackedReported, PackedStatus};
use crate::pleg::CacheUpdate;
use plegd_runtime::ContainerState;

impl CacheOwner {
    pub(crate) fn apply(&mut self, update: CacheUpdate) {
        match update {
            CacheUpdate::Delete {
                uid,
                read_at,
                source,
            } => {
                if let Some((uid, last)) = self.shared.pods.remove(uid.as_str()) {
                    self.bury(uid.into(), last, read_at, source);
                }
            }
            CacheUpdate::Set {
                uid,
                status,
                read_at,
                source,
            } => {
                // Back (same UID): alive again.
                self.shared.tombstones.remove(&uid);
                let mut entry = self
                    .shared
                    .pods
                    .entry(uid.into())
                    .or_insert_with(|| StoredPod {
                        status: None,
                        error: None,
                        read: ReadStamp::NEVER,
                        reported: PackedReported::default(),
                    });
                let read = ReadStamp::new(read_at, source);
                // Never let an older read overwrite a newer one.
                if read.at < entry.read.at {
                    return;
                }
                entry.read = read;
                match status {
                    Ok(s) => {
                        entry.status = Some(PackedStatus::pack(&s, &mut self.buf));
                        entry.error = None;
                    }
                    Err(e) => entry.error = Some(e.into_boxed_str()),
                }
            }
            CacheUpdate::Container {
                uid,
                status,
                read_at,
            } => {
                let Some(mut entry) = self.shared.pods.get_mut(uid.as_str()) else {
                    return;
                };
                let older = ReadStamp::new(read_at, RelistSource::Global).at < entry.read.at;
                let Some(mut pod) = entry.status.as_ref().and_then(PackedStatus::unpack) else {
                    return;
                };
                let Some(old) = pod.containers.iter_mut().find(|c| c.id == status.id) else {
                    return;
                };
                // A read of the whole pod that began later has it already, unless that
                // read still saw the container before its exit (it may have reused an
                // earlier status): an exit is final, and an ID names one container.
                let exit_unseen =
                    status.state == ContainerState::Exited && old.state != ContainerState::Exited;
                if older && !exit_unseen {
                    return;
                }
                *old = status;
                // `read` stays the pod's last read's: the other containers were
                // not read again (what `LastReads` reuses is judged by it).
                entry.status = Some(PackedStatus::pack(&pod, &mut self.buf));
            }
        }
    }
}

/// Apply the cache updates of one relist; `global_timestamp` is set for a successful
/// global relist (its start time). The sender awaits the reply before publishing the
/// relist's events, so a subscriber that reads the cache after an event sees its cause.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ApplyRelist {
    pub updates: Vec<CacheUpdate>,
    pub global_timestamp: Option<SystemTime>,
    /// With a global timestamp: the pods that relist left alone (held by a sync).
    pub held: Vec<String>,
    /// The latest revision issued, that of this relist's last event if it had any:
    /// once applied, the cache reflects every event up to it.
    pub revision: u64,
    /// This relist's events, in order, as (pod UID, sandbox or container ID, kind):
    /// folded into each pod's `reported`.
    pub events: Vec<(String, String, EventKind)>,
    /// A chunk of a global relist that more chunks follow: snapshots wait until a
    /// message without it (the last chunk) is applied, so that no snapshot presents a
    /// relist half applied.
    pub more: bool,
}

impl Handler<ApplyRelist> for CacheOwner {
    type Result = ();

    fn handle(&mut self, msg: ApplyRelist, _: &mut Self::Context) {
        self.apply_relist(msg);
    }
}

impl CacheOwner {
    /// What [`ApplyRelist`] does; also how a restart replays the stored relists.
    pub(crate) fn apply_relist(&mut self, msg: ApplyRelist) {
        for u in msg.updates {
            self.apply(u);
        }
        // After the updates. A pod's events come one after the other: its states are
        // unpacked and packed again once for them all.
        let mut events = msg.events.into_iter().peekable();
        while let Some((uid, id, kind)) = events.next() {
            let mut run = vec![(id, kind)];
            while let Some((_, id, kind)) = events.next_if(|(u, ..)| *u == uid) {
                run.push((id, kind));
            }
            if let Some(mut pod) = self.shared.pods.get_mut(uid.as_str()) {
                pod.reported = fold(&pod.reported, run, true, &mut self.buf);
            } else if let Some(mut t) = self.shared.tombstones.get_mut(uid.as_str()) {
                // Found gone by this relist: its tombstone shows the pod as its last
                // events left it, the deaths before the removals (or every container
                // would be absent, and shown as last read: running).
                t.last.reported = fold(&t.last.reported, run, false, &mut self.buf);
            }
        }
        self.revision = self.revision.max(msg.revision);
        self.prune();
        self.shrink();
        if msg.global_timestamp.is_some() {
            let previous = self.shared.changes.borrow().0;
            let held = &msg.held;
            self.shared.held_cover.retain(|uid, _| held.contains(uid));
            for uid in held {
                self.shared
                    .held_cover
                    .entry(uid.clone())
                    .or_insert(previous);
            }
        }
        self.shared.changes.send_modify(|(global, n)| {
            if let Some(t) = msg.global_timestamp {
                if global.is_none_or(|g| t > g) {
                    *global = Some(t);
                }
            }
            *n += 1;
        });
        self.partial = msg.more;
        if !self.partial && !self.waiting.is_empty() {
            let snapshot = self.snapshot();
            for tx in self.waiting.drain(..) {
                let _ = tx.send(snapshot.clone());
            }
        }
    }
}
/// `reported` with a pod's events folded in, in order: the last start or death of
/// each sandbox and container; a removal takes its entry out when `removals`.
fn fold(
    reported: &PackedReported,
    events: Vec<(String, EventKind)>,
    removals: bool,
    buf: &mut Vec<u8>,
) -> PackedReported {
    let mut states = reported.unpack();
    for (id, kind) in events {
        match kind {
            EventKind::ContainerStarted | EventKind::ContainerDied => {
                states.insert(id, kind);
            }
            EventKind::ContainerRemoved if removals => {
                states.remove(&id);
            }
            EventKind::ContainerRemoved | EventKind::PodSync | EventKind::ContainerChanged => {}
        }
    }
    PackedReported::pack(&states, buf)
}

#[cfg(test)]
mod tests {
    use actix::prelude::*;
    use plegd_runtime::ContainerStatus;

    use super::*;
    use crate::cache::test_support::*;
    use crate::cache::*;
    use crate::event::{EventKind, RelistSource};
    use crate::pleg::CacheUpdate;

    /// An early death (`pleg::early`): one container's status replaced, the pod's
    /// read time kept, even from a read older than the pod's when that still says
    /// the container runs (an exit is final); nothing else from an older read, nor
    /// for an unknown container or an unknown pod.
    #[test]
    fn a_container_update_replaces_that_container_only() {
        use plegd_runtime::ContainerState::{Exited, Running};
        let (mut owner, cache) = CacheOwner::new(TTL);
        let mut st = status("a");
        st.containers.push(container(Running, 0));
        let mut other = container(Running, 0);
        other.id = "d".into();
        st.containers.push(other.clone());
        owner.apply(CacheUpdate::Set {
            uid: "a".into(),
            status: Ok(st),
            read_at: at(5),
            source: RelistSource::Global,
        });
        let update = |read_at, status: ContainerStatus| CacheUpdate::Container {
            uid: "a".into(),
            status,
            read_at,
        };
        let state_of = |id: &str| {
            let pod = cache.get("a").unwrap();
            let st = pod.status.unwrap();
            let c = st.containers.into_iter().find(|c| c.id == id).unwrap();
            (c.state, c.exit_code, pod.modified)
        };
        owner.apply(update(at(4), container(Exited, 9)));
        assert_eq!(
            state_of("c"),
            (Exited, 9, at(5)),
            "older than the pod's read, which saw it running"
        );
        owner.apply(update(at(6), container(Exited, 2)));
        assert_eq!(state_of("c"), (Exited, 2, at(5)));
        owner.apply(update(at(4), container(Exited, 7)));
        assert_eq!(
            state_of("c"),
            (Exited, 2, at(5)),
            "an older read of the exit"
        );
        owner.apply(update(at(4), container(Running, 0)));
        assert_eq!(state_of("c"), (Exited, 2, at(5)), "an older read");
        assert_eq!(state_of("d"), (Running, 0, at(5)));
        let mut unknown = container(Exited, 1);
        unknown.id = "x".into();
        owner.apply(update(at(7), unknown));
        assert_eq!(cache.get("a").unwrap().status.unwrap().containers.len(), 2);
        owner.apply(CacheUpdate::Container {
            uid: "nobody".into(),
            status: container(Exited, 1),
            read_at: at(7),
        });
        assert!(cache.get("nobody").is_none());
    }

    #[actix_rt::test]
    async fn each_pod_keeps_what_the_events_last_said_of_its_sandboxes_and_containers() {
        use EventKind::*;
        let (owner, cache) = CacheOwner::new(TTL);
        let owner = owner.start();
        let ev = |uid: &str, id: &str, kind| (uid.to_string(), id.to_string(), kind);
        let reported = |uid: &str| {
            cache.get(uid).map(|p| {
                p.reported
                    .into_iter()
                    .map(|(id, kind)| (id.to_string(), kind))
                    .collect()
            })
        };
        owner
            .send(ApplyRelist {
                events: vec![
                    ev("a", "sa", ContainerStarted),
                    ev("a", "c1", ContainerStarted),
                    ev("a", "c2", ContainerDied),
                    // No cache entry (never read): nothing is made up for it.
                    ev("nobody", "cx", ContainerStarted),
                ],
                ..relist(vec![set("a", at(1))], 4)
            })
            .await
            .unwrap();
        assert_eq!(
            reported("a"),
            Some(vec![
                ("c1".to_string(), ContainerStarted),
                ("c2".to_string(), ContainerDied),
                ("sa".to_string(), ContainerStarted)
            ])
        );
        assert!(cache.get("nobody").is_none());
        // Later events replace, Removed deletes; a failed read keeps them.
        owner
            .send(ApplyRelist {
                events: vec![
                    ev("a", "c1", ContainerDied),
                    ev("a", "c2", ContainerRemoved),
                    ev("a", "", PodSync),
                ],
                ..relist(
                    vec![CacheUpdate::Set {
                        uid: "a".into(),
                        status: Err("unavailable".into()),
                        read_at: at(2),
                        source: RelistSource::Global,
                    }],
                    7,
                )
            })
            .await
            .unwrap();
        assert_eq!(
            reported("a"),
            Some(vec![
                ("c1".to_string(), ContainerDied),
                ("sa".to_string(), ContainerStarted)
            ])
        );
        // Gone: the tombstone keeps the last entry with the deaths of its last
        // relist, not its removals (regression: it showed the sandbox started).
        owner
            .send(ApplyRelist {
                events: vec![
                    ev("a", "c1", ContainerRemoved),
                    ev("a", "sa", ContainerDied),
                    ev("a", "sa", ContainerRemoved),
                ],
                ..relist(vec![delete("a", at(3))], 10)
            })
            .await
            .unwrap();
        let PodLookup::Removed { last, .. } = cache.lookup("a") else {
            panic!("no tombstone: {:?}", cache.lookup("a"));
        };
        let buried: Vec<_> = last
            .reported
            .into_iter()
            .map(|(id, kind)| (id.to_string(), kind))
            .collect();
        assert_eq!(
            buried,
            vec![
                ("c1".to_string(), ContainerDied),
                ("sa".to_string(), ContainerDied)
            ]
        );
        // Back with the same UID: nothing reported yet of the new one.
        owner.send(relist(vec![set("a", at(4))], 10)).await.unwrap();
        assert_eq!(reported("a"), Some(vec![]));
    }
}
