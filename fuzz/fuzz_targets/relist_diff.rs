//! Fuzz target: the Generic PLEG's relist diff. A sequence of arbitrary runtime lists
//! (sandboxes and containers, from a small ID space so that IDs collide, move between
//! pods, lose their sandbox, ...) is grouped into pod records as a global relist does
//! (`pleg::record::group`, each list against the records of the one before) and every
//! pod is diffed (`pleg::diff::pod_events`). Checks, besides "no panic":
//!
//! - group: each listed sandbox is in its pod's record with its listed state; a
//!   container is in a record only through a sandbox listed now or known before, and
//!   in the record of the pod that owns that sandbox; a record is named by its newest
//!   listed sandbox (or keeps its old name); nothing else is in a record;
//! - pod_events: exactly the table of docs/architecture.md ("Event semantics"), per ID of the union of old and new
//!   (sandboxes first, then containers, each by ID, each ID once): → running:
//!   ContainerStarted; → exited: ContainerDied; → unknown: ContainerChanged; gone:
//!   ContainerRemoved, preceded by ContainerDied unless it was exited. So no
//!   ContainerDied for an ID that was already exited, or that is running or unknown
//!   now (an ID first seen exited does get one, as in kubelet), no ContainerRemoved
//!   for an ID still present or never known, no event for an unchanged ID;
//! - both are deterministic: the same lists (in fresh hash maps) give the same
//!   records and the same events.
#![no_main]

use std::collections::{BTreeMap, BTreeSet, HashMap};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use plegd_actors::fuzzing::{group, pod_events, PlegState, PodRecord};
use plegd_actors::EventKind;
use plegd_runtime::{Container, ContainerState, PodRef, Sandbox, SandboxState};

#[derive(Arbitrary, Debug)]
struct Input {
    lists: Vec<List>,
}

#[derive(Arbitrary, Debug)]
struct List {
    sandboxes: Vec<Sb>,
    containers: Vec<Ctr>,
}

#[derive(Arbitrary, Debug)]
struct Sb {
    id: u8,
    uid: u8,
    name: u8,
    state: u8,
}

#[derive(Arbitrary, Debug)]
struct Ctr {
    id: u8,
    sandbox: u8,
    state: u8,
}

/// Sandbox and container IDs share one small space (as they share one in kubelet's
/// diff), pod UIDs another.
fn id(n: u8) -> String {
    format!("id{}", n % 16)
}

fn sandbox(s: &Sb) -> Sandbox {
    Sandbox {
        id: id(s.id),
        pod: PodRef {
            uid: format!("uid{}", s.uid % 4),
            name: format!("name{}", s.name % 3),
            namespace: "ns".into(),
        },
        attempt: 0,
        state: match s.state % 3 {
            0 => SandboxState::Ready,
            1 => SandboxState::NotReady,
            _ => SandboxState::Unknown,
        },
        created_at: 0,
        labels: Default::default(),
    }
}

fn container(c: &Ctr) -> Container {
    Container {
        id: id(c.id),
        sandbox_id: id(c.sandbox),
        name: "c".into(),
        attempt: 0,
        state: match c.state % 4 {
            0 => ContainerState::Created,
            1 => ContainerState::Running,
            2 => ContainerState::Exited,
            _ => ContainerState::Unknown,
        },
        created_at: 0,
    }
}

fuzz_target!(|input: Input| {
    let mut records: HashMap<String, PodRecord> = HashMap::new();
    for list in input.lists.iter().take(6) {
        let sandboxes: Vec<Sandbox> = list.sandboxes.iter().take(24).map(sandbox).collect();
        let containers: Vec<Container> = list.containers.iter().take(24).map(container).collect();
        let new = group(&sandboxes, &containers, &records);
        check_group(&sandboxes, &containers, &records, &new);
        let again = group(&sandboxes, &containers, &rehash(&records));
        assert_eq!(new, again, "group is not deterministic");

        let uids: BTreeSet<&String> = records.keys().chain(new.keys()).collect();
        for uid in uids {
            let (old, now) = (records.get(uid), new.get(uid));
            let events = pod_events(old, now);
            assert_eq!(
                events,
                pod_events(old, now),
                "pod_events is not deterministic"
            );
            assert_eq!(
                events,
                expected_events(old, now),
                "pod {uid}: {old:?} -> {now:?}"
            );
        }
        records = new;
    }
});

/// The same records in a new map (a new hasher, so a new iteration order).
fn rehash(records: &HashMap<String, PodRecord>) -> HashMap<String, PodRecord> {
    records
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn check_group(
    sandboxes: &[Sandbox],
    containers: &[Container],
    previous: &HashMap<String, PodRecord>,
    new: &HashMap<String, PodRecord>,
) {
    // The last listing of a (pod, sandbox) pair wins, and names the pod.
    let mut listed: BTreeMap<(&str, &str), PlegState> = BTreeMap::new();
    let mut named: BTreeMap<&str, &PodRef> = BTreeMap::new();
    for sb in sandboxes {
        listed.insert((&sb.pod.uid, &sb.id), sb.state.into());
        named.insert(&sb.pod.uid, &sb.pod);
    }
    for ((uid, sb), state) in &listed {
        let rec = new.get(*uid).expect("a listed sandbox's pod has a record");
        assert_eq!(rec.sandboxes.get(*sb), Some(state), "sandbox {sb} of {uid}");
    }
    for (uid, rec) in new {
        assert_eq!(
            rec.pod.uid(),
            uid.as_str(),
            "record of {uid} names another pod"
        );
        match named.get(uid.as_str()) {
            Some(pod) => assert_eq!(
                &rec.pod.to_pod_ref(),
                *pod,
                "{uid} not named by its newest sandbox"
            ),
            None => {
                let prev = previous.get(uid).expect("a record from nowhere");
                assert_eq!(rec.pod, prev.pod, "{uid} renamed without a sandbox");
            }
        }
        for sb in rec.sandboxes.keys() {
            assert!(
                listed.contains_key(&(uid.as_str(), sb.to_string().as_str())),
                "sandbox {sb} in {uid} was not listed for it"
            );
        }
        for (cid, (sb, state)) in &rec.containers {
            let listing = containers
                .iter()
                .rev()
                .find(|c| *cid == c.id && *sb == c.sandbox_id)
                .unwrap_or_else(|| panic!("container {cid} in {uid} was not listed in {sb}"));
            assert_eq!(*state, PlegState::from(listing.state));
            let owned_now = listed.contains_key(&(uid.as_str(), sb.to_string().as_str()));
            let owned_before = previous
                .get(uid)
                .is_some_and(|p| p.sandbox_ids().any(|id| id == sb));
            assert!(
                owned_now || owned_before,
                "container {cid} in {uid}, whose sandbox {sb} it neither lists nor knew"
            );
        }
    }
    // A container whose sandbox is listed now is in the pod its last listing names.
    for c in containers {
        if let Some(sb) = sandboxes.iter().rev().find(|s| s.id == c.sandbox_id) {
            let rec = &new[&sb.pod.uid];
            assert!(
                rec.containers.contains_key(&c.id),
                "container {} of listed sandbox {} not in {}",
                c.id,
                sb.id,
                sb.pod.uid
            );
        }
    }
}

/// The state of an ID in a record, read off its maps (a sandbox first: the ID space
/// is shared).
fn state(rec: Option<&PodRecord>, id: &str) -> PlegState {
    let Some(rec) = rec else {
        return PlegState::NonExistent;
    };
    if let Some(s) = rec.sandboxes.get(id) {
        return *s;
    }
    rec.containers
        .get(id)
        .map(|(_, s)| *s)
        .unwrap_or(PlegState::NonExistent)
}

/// docs/architecture.md "Event semantics", written out independently of diff.rs.
fn expected_events(old: Option<&PodRecord>, new: Option<&PodRecord>) -> Vec<(String, EventKind)> {
    let mut sandbox_ids = BTreeSet::new();
    let mut container_ids = BTreeSet::new();
    for rec in [old, new].into_iter().flatten() {
        sandbox_ids.extend(rec.sandboxes.keys().map(|id| id.to_string()));
        container_ids.extend(rec.containers.keys().map(|id| id.to_string()));
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for id in sandbox_ids.into_iter().chain(container_ids) {
        if !seen.insert(id.clone()) {
            continue;
        }
        let (o, n) = (state(old, &id), state(new, &id));
        if o == n {
            continue;
        }
        use EventKind::*;
        let kinds: &[EventKind] = match (o, n) {
            (_, PlegState::Running) => &[ContainerStarted],
            (_, PlegState::Exited) => &[ContainerDied],
            (_, PlegState::Unknown) => &[ContainerChanged],
            (PlegState::Exited, PlegState::NonExistent) => &[ContainerRemoved],
            (_, PlegState::NonExistent) => &[ContainerDied, ContainerRemoved],
        };
        out.extend(kinds.iter().map(|k| (id.clone(), *k)));
    }
    out
}
