//! Pod records: per pod, the state of each sandbox and container as the lists said,
//! grouped by the sandbox's pod UID (never by labels).

use std::collections::HashMap;

use super::fingerprint::{EntryKeys, Fingerprint};
pub use crate::id_map::{Id, IdKey, IdMap};
use plegd_runtime::{Container, ContainerState, PodRef, Sandbox, SandboxState};

/// Pod records by pod UID. Hashed with a randomly keyed fast hash (pod UIDs come
/// from outside; SipHash was a tenth of a no-change relist).
pub type RecordTable = HashMap<String, PodRecord, foldhash::fast::RandomState>;

/// Every pod's record: the Generic PLEG's table, read as a [`RecordTable`], changed
/// only through its own methods, which keep its [`Fingerprint`] (what a global relist's
/// lists are checked against first).
#[derive(Clone, Default)]
pub struct Records {
    table: RecordTable,
    keys: EntryKeys,
    print: Fingerprint,
}

impl Records {
    pub fn insert(&mut self, uid: String, rec: PodRecord) -> Option<PodRecord> {
        self.print.add(self.keys.of_record(&rec));
        let old = self.table.insert(uid, rec);
        self.forget(old)
    }

    pub fn remove(&mut self, uid: &str) -> Option<PodRecord> {
        let old = self.table.remove(uid);
        self.forget(old)
    }

    /// `change` applied to `uid`'s record, if there is one.
    pub fn update<T>(&mut self, uid: &str, change: impl FnOnce(&mut PodRecord) -> T) -> Option<T> {
        let rec = self.table.get_mut(uid)?;
        self.print.remove(self.keys.of_record(rec));
        let out = change(rec);
        self.print.add(self.keys.of_record(rec));
        Some(out)
    }

    pub fn reserve(&mut self, pods: usize) {
        self.table.reserve(pods);
    }

    /// The fingerprint of every entry the records hold.
    pub fn fingerprint(&self) -> Fingerprint {
        self.print
    }

    /// What lists are fingerprinted with, to compare with [`fingerprint`](Self::fingerprint).
    pub fn entry_keys(&self) -> &EntryKeys {
        &self.keys
    }

    fn forget(&mut self, old: Option<PodRecord>) -> Option<PodRecord> {
        if let Some(old) = &old {
            self.print.remove(self.keys.of_record(old));
        }
        old
    }
}

impl std::ops::Deref for Records {
    type Target = RecordTable;

    fn deref(&self) -> &RecordTable {
        &self.table
    }
}

impl crate::room::Roomy for Records {
    fn capacity(&self) -> usize {
        self.table.capacity()
    }
    fn len(&self) -> usize {
        self.table.len()
    }
    fn shrink_to_fit(&mut self) {
        self.table.shrink_to_fit();
    }
}

/// The state Generic PLEG compares (kubelet's plegContainerState).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlegState {
    Running,
    Exited,
    Unknown,
    NonExistent,
}

impl From<ContainerState> for PlegState {
    fn from(s: ContainerState) -> Self {
        match s {
            ContainerState::Running => PlegState::Running,
            ContainerState::Exited => PlegState::Exited,
            ContainerState::Created | ContainerState::Unknown => PlegState::Unknown,
        }
    }
}

impl From<SandboxState> for PlegState {
    fn from(s: SandboxState) -> Self {
        match s {
            SandboxState::Ready => PlegState::Running,
            SandboxState::NotReady => PlegState::Exited,
            SandboxState::Unknown => PlegState::Unknown,
        }
    }
}

/// A pod's UID, namespace and name in one block: every record keeps one (three
/// strings took three blocks and 72 bytes inline), and every global relist compares
/// it with the listed sandbox's.
#[derive(Clone, PartialEq, Eq)]
pub struct PodName {
    /// `uid`, `namespace` and `name` one after the other.
    text: Box<str>,
    /// Where the namespace and the name start in `text`.
    namespace_at: u32,
    name_at: u32,
}

impl PodName {
    pub fn new(uid: &str, name: &str, namespace: &str) -> Self {
        let text: Box<str> = [uid, namespace, name].concat().into();
        // A string too long for u32 offsets cannot come from a CRI runtime (its
        // messages are capped far below 4 GiB); kept whole as the UID, it still
        // compares unequal to any listed pod.
        let at = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        PodName {
            namespace_at: at(uid.len()),
            name_at: at(uid.len() + namespace.len()),
            text,
        }
    }

    fn part(&self, from: u32, to: usize) -> &str {
        self.text.get(from as usize..to).unwrap_or_default()
    }

    pub fn uid(&self) -> &str {
        self.part(0, self.namespace_at as usize)
    }

    pub fn namespace(&self) -> &str {
        self.part(self.namespace_at, self.name_at as usize)
    }

    pub fn name(&self) -> &str {
        self.part(self.name_at, self.text.len())
    }

    /// Whether this is the pod with this UID, name and namespace.
    pub fn is(&self, uid: &str, name: &str, namespace: &str) -> bool {
        self.text.len() == uid.len() + name.len() + namespace.len()
            && self.uid() == uid
            && self.namespace() == namespace
            && self.name() == name
    }

    pub fn to_pod_ref(&self) -> PodRef {
        PodRef {
            uid: self.uid().to_string(),
            name: self.name().to_string(),
            namespace: self.namespace().to_string(),
        }
    }
}

impl From<&PodRef> for PodName {
    fn from(pod: &PodRef) -> Self {
        PodName::new(&pod.uid, &pod.name, &pod.namespace)
    }
}

impl std::fmt::Debug for PodName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodName")
            .field("uid", &self.uid())
            .field("name", &self.name())
            .field("namespace", &self.namespace())
            .finish()
    }
}

/// One pod as the lists saw it. Sandboxes and containers share one ID space: a
/// sandbox is treated like a container (kubelet does the same).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRecord {
    pub pod: PodName,
    /// Sandbox ID → state.
    pub sandboxes: IdMap<PlegState>,
    /// Container ID → (sandbox ID, state).
    pub containers: IdMap<(Id, PlegState)>,
}

impl PodRecord {
    /// Every sandbox id of the pod: its listed sandboxes and those its containers
    /// belong to (a sandbox missing from a list is still known through them).
    pub fn sandbox_ids(&self) -> impl Iterator<Item = &Id> {
        self.sandboxes
            .keys()
            .chain(self.containers.values().map(|(sb, _)| sb))
    }

    /// The state of a sandbox or container ID in this record.
    pub fn state_of(&self, id: &str) -> PlegState {
        self.state_of_id(&Id::new(id))
    }

    /// [`state_of`](Self::state_of) an ID already packed.
    pub fn state_of_id(&self, id: &Id) -> PlegState {
        self.sandboxes
            .get_id(id)
            .copied()
            .or_else(|| self.containers.get_id(id).map(|(_, s)| *s))
            .unwrap_or(PlegState::NonExistent)
    }
}

/// Groups listed sandboxes and containers into pod records keyed by pod UID.
///
/// A container stays attached to its pod through its sandbox id: if the sandbox is
/// missing from this list (or was listed without usable metadata) but `previous`
/// records knew it, the container keeps that pod — only the sandbox changes, as
/// kubelet reports it. A container whose sandbox was never known cannot be attributed
/// and is left out (the next relist sees it once its sandbox is listed).
pub fn group<S: std::hash::BuildHasher>(
    sandboxes: &[Sandbox],
    containers: &[Container],
    previous: &HashMap<String, PodRecord, S>,
) -> HashMap<String, PodRecord> {
    let mut pods: HashMap<String, PodRecord> = HashMap::new();
    let mut owner: HashMap<Id, &str> = HashMap::new();
    for (uid, rec) in previous {
        for id in rec.sandbox_ids() {
            // A sandbox ID known in two pods (a runtime listed it under two UIDs) goes
            // to the same one whatever the map's order: the smallest UID (fuzzing).
            let known = owner.entry(id.clone()).or_insert(uid);
            *known = (*known).min(uid.as_str());
        }
    }
    for sb in sandboxes {
        owner.insert(Id::new(&sb.id), &sb.pod.uid);
        let rec = pods.entry(sb.pod.uid.clone()).or_insert_with(|| PodRecord {
            pod: (&sb.pod).into(),
            sandboxes: IdMap::new(),
            containers: IdMap::new(),
        });
        // The newest sandbox names the pod (a recreated pod keeps its UID).
        rec.pod = (&sb.pod).into();
        rec.sandboxes.insert(sb.id.as_str(), sb.state.into());
    }
    for c in containers {
        let Some(uid) = owner.get(&Id::new(&c.sandbox_id)) else {
            continue;
        };
        let rec = match pods.get_mut(*uid) {
            Some(rec) => rec,
            None => match previous.get(*uid) {
                // Its sandbox is missing from this list: the pod as it was known.
                Some(prev) => pods.entry(uid.to_string()).or_insert_with(|| PodRecord {
                    pod: prev.pod.clone(),
                    sandboxes: IdMap::new(),
                    containers: IdMap::new(),
                }),
                None => continue,
            },
        };
        rec.containers
            .insert(c.id.as_str(), (Id::new(&c.sandbox_id), c.state.into()));
    }
    pods
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Sandbox `id` of pod `uid`, ready.
    pub(in crate::pleg) fn sandbox(id: &str, uid: &str) -> Sandbox {
        Sandbox {
            id: id.into(),
            pod: PodRef {
                uid: uid.into(),
                name: format!("name-{uid}"),
                namespace: "ns".into(),
            },
            attempt: 0,
            state: SandboxState::Ready,
            created_at: 0,
            labels: Default::default(),
        }
    }

    /// Found by fuzzing (fuzz/, target relist_diff): a sandbox ID that the previous
    /// records knew in two pods (listed under UIDs `uid3` and `uid2`) gave an unlisted
    /// sandbox's container to whichever pod the hash map visited last, so the same
    /// lists grouped differently from one run to the next.
    #[test]
    fn a_pod_name_gives_back_its_parts_and_is_only_its_own_pod() {
        let pod = PodName::new("3f2c-uid", "web-7d4b9-x2x", "default");
        assert_eq!(
            (pod.uid(), pod.name(), pod.namespace()),
            ("3f2c-uid", "web-7d4b9-x2x", "default")
        );
        assert_eq!(
            pod.to_pod_ref(),
            PodRef {
                uid: "3f2c-uid".into(),
                name: "web-7d4b9-x2x".into(),
                namespace: "default".into(),
            }
        );
        assert!(pod.is("3f2c-uid", "web-7d4b9-x2x", "default"));
        // The same characters cut elsewhere are another pod.
        assert!(!pod.is("3f2c-ui", "web-7d4b9-x2x", "ddefault"));
        assert!(!pod.is("3f2c-uid", "tweb-7d4b9-x2x", "defaul"));
        assert!(!pod.is("3f2c-uid", "web-7d4b9-x2x", "default2"));
        let empty = PodName::new("", "", "");
        assert!(empty.is("", "", "") && !empty.is("", "a", ""));
        assert_eq!(PodName::from(&pod.to_pod_ref()), pod);
    }

    #[test]
    fn a_sandbox_known_in_two_pods_keeps_its_containers_in_one_of_them() {
        let first = [sandbox("id0", "uid3"), sandbox("id0", "uid2")];
        let previous = group(&first, &[], &HashMap::new());
        assert_eq!(previous.len(), 2);
        let container = Container {
            id: "c0".into(),
            sandbox_id: "id0".into(),
            name: "c".into(),
            attempt: 0,
            state: ContainerState::Created,
            created_at: 0,
        };
        for _ in 0..32 {
            // A new map: a new hasher, so another iteration order.
            let previous: HashMap<_, _> = previous
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let now = group(&[], std::slice::from_ref(&container), &previous);
            assert_eq!(now.keys().collect::<Vec<_>>(), ["uid2"]);
            assert_eq!(now["uid2"].pod.name(), "name-uid2");
            assert!(now["uid2"].containers.contains_key("c0"));
        }
    }
}
