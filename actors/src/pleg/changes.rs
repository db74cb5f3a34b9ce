//! Which pods a global relist must rebuild: the listed sandboxes and containers are
//! compared with the pod records, entry by entry, so that a relist where nothing
//! changed builds no record, no diff and allocates nothing per pod (at
//! 10,000 pods, grouping every pod and diffing every record took ~30 % of a
//! no-change relist, most of it in malloc/free).
//!
//! An entry is unchanged when its pod's record holds the same ID with the same
//! state (and, for a sandbox, the same pod; for a container, the same sandbox); a
//! pod is unchanged when every entry listed for it is, and the lists still hold as
//! many entries of it as its record — so whatever [`group`](super::record::group)
//! would rebuild for it equals its record, and [`pod_events`](super::diff::pod_events)
//! is empty. Anything this cannot decide cheaply (an ID listed twice, a container
//! whose sandbox is not listed) answers `None`: rebuild everything, as before.

use std::collections::{BTreeSet, HashMap};

use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::record::{IdKey, PlegState, PodRecord};
use plegd_runtime::{ContainerRef, SandboxRef};

/// The change check's tables, kept from one relist to the next (cleared, never
/// freed): allocating and freeing tables of a few hundred KB every relist made glibc
/// raise its mmap threshold and fragment the heap (RSS per pod grew by
/// 1–3 KiB). They hold list indices, so they borrow nothing.
#[derive(Default)]
pub struct Scratch {
    state: foldhash::fast::RandomState,
    /// Listed sandboxes by ID (index into the sandbox list).
    owner: HashTable<u32>,
    /// Listed containers by ID (index into the container list).
    listed: HashTable<u32>,
    /// Listed pods by UID: an index into `pods`.
    slots: HashTable<u32>,
    /// Per listed pod: one of its sandboxes (index into the sandbox list), and its
    /// sandboxes and containers found unchanged (list indices and counts of entries
    /// are u32: 12 bytes a pod, kept at the node's size).
    pods: Vec<(u32, u32, u32)>,
    /// Per listed sandbox: its pod (index into `pods`).
    pod_of: Vec<u32>,
    /// Per listed sandbox: its ID packed (what its containers' sandbox IDs are
    /// compared with), so each ID is packed once.
    keys: Vec<Option<[u8; 32]>>,
}

/// The pods whose lists differ from their records (new, changed or gone), or `None`
/// when every pod must be rebuilt.
///
/// Each pod's record is looked up once (by its first listed sandbox), each container
/// finds it through its sandbox. That no entry of an unchanged pod went away is
/// checked by counting: the unchanged entries of the pods not found changed are as
/// many as their records hold (each is a different entry of its record, as IDs are
/// listed once, so no pod can make up for another); only when that fails is every
/// record checked on its own.
pub fn changed_pods<'a, S: BuildHasher>(
    sandboxes: &[SandboxRef<'a>],
    containers: &[ContainerRef<'a>],
    records: &'a HashMap<String, PodRecord, S>,
    scratch: &mut Scratch,
) -> Option<BTreeSet<&'a str>> {
    let Scratch {
        state,
        owner,
        listed,
        slots,
        pods,
        pod_of,
        keys,
    } = scratch;
    owner.clear();
    listed.clear();
    slots.clear();
    pods.clear();
    pod_of.clear();
    keys.clear();
    let hash = |s: &str| state.hash_one(s);
    let uid_at = |i: u32| sandboxes[i as usize].uid;
    // The record of each listed pod (by slot), looked up once.
    let mut recs: Vec<Option<&'a PodRecord>> = Vec::new();
    let mut changed = BTreeSet::new();
    for (i, sb) in sandboxes.iter().enumerate() {
        let i = u32::try_from(i).ok()?;
        let h = hash(sb.id);
        if owner
            .find(h, |&j| sandboxes[j as usize].id == sb.id)
            .is_some()
        {
            return None;
        }
        owner.insert_unique(h, i, |&j| hash(sandboxes[j as usize].id));
        let uid = sb.uid;
        let hu = hash(uid);
        let slot = match slots.find(hu, |&s| uid_at(pods[s as usize].0) == uid) {
            Some(&s) => s,
            None => {
                let s = u32::try_from(pods.len()).ok()?;
                pods.push((i, 0, 0));
                recs.push(records.get(uid));
                slots.insert_unique(hu, s, |&s| hash(uid_at(pods[s as usize].0)));
                s
            }
        };
        pod_of.push(slot);
        let key = IdKey::of(sb.id);
        keys.push(match key {
            IdKey::Hex(bytes) => Some(bytes),
            IdKey::Text(_) => None,
        });
        let same = recs[slot as usize].is_some_and(|rec| {
            rec.sandboxes.get_key(&key) == Some(&PlegState::from(sb.state))
                && rec.pod.is(sb.uid, sb.name, sb.namespace)
        });
        if same {
            pods[slot as usize].1 += 1;
        } else {
            changed.insert(uid);
        }
    }
    for (i, c) in containers.iter().enumerate() {
        let i = u32::try_from(i).ok()?;
        let h = hash(c.id);
        if listed
            .find(h, |&j| containers[j as usize].id == c.id)
            .is_some()
        {
            return None;
        }
        listed.insert_unique(h, i, |&j| hash(containers[j as usize].id));
        // A container whose sandbox is not listed belongs to whatever pod the records
        // knew that sandbox in: rare (a sandbox going away), and left to `group`.
        let sb = *owner.find(hash(c.sandbox_id), |&j| {
            sandboxes[j as usize].id == c.sandbox_id
        })?;
        let slot = pod_of[sb as usize] as usize;
        // The sandbox's ID is the container's sandbox ID (the table compared them).
        let sandbox_key = match keys[sb as usize] {
            Some(bytes) => IdKey::Hex(bytes),
            None => IdKey::Text(c.sandbox_id),
        };
        let same = recs[slot].is_some_and(|rec| {
            rec.containers
                .get_key(&IdKey::of(c.id))
                .is_some_and(|(sb, state)| {
                    *state == PlegState::from(c.state) && sb.is_key(&sandbox_key)
                })
        });
        if same {
            pods[slot].2 += 1;
        } else {
            changed.insert(uid_at(sb));
        }
    }
    // Whether the pods not found changed lost no entry: their unchanged entries are
    // as many as their records hold (per pod there are never more).
    let counts_of = |uid: &str| {
        slots
            .find(hash(uid), |&s| uid_at(pods[s as usize].0) == uid)
            .map_or((0, 0), |&s| {
                let p = pods[s as usize];
                (p.1 as usize, p.2 as usize)
            })
    };
    let size = |rec: &PodRecord| rec.sandboxes.len() + rec.containers.len();
    let mut held_by_records: usize = records.values().map(size).sum();
    let mut unchanged: usize = pods.iter().map(|p| p.1 as usize + p.2 as usize).sum();
    for uid in &changed {
        let (s, c) = counts_of(uid);
        unchanged -= s + c;
        held_by_records -= records.get(*uid).map_or(0, size);
    }
    if unchanged != held_by_records {
        // Some pod lost entries (or all): find which.
        for (uid, rec) in records {
            let (s, c) = counts_of(uid);
            if s != rec.sandboxes.len() || c != rec.containers.len() {
                changed.insert(uid.as_str());
            }
        }
    }
    Some(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    use crate::pleg::diff::pod_events;
    use crate::pleg::record::{group, Records};
    use plegd_runtime::{
        Container, ContainerState, ListView, NodeLists, PodRef, Sandbox, SandboxState,
    };
    use rand::{Rng as _, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// [`changed_pods`] of decoded lists.
    fn changed<'a>(
        sandboxes: &'a [Sandbox],
        containers: &'a [Container],
        records: &'a HashMap<String, PodRecord>,
        scratch: &mut Scratch,
    ) -> Option<BTreeSet<&'a str>> {
        let view = ListView::of(sandboxes, containers);
        changed_pods(view.sandboxes(), view.containers(), records, scratch)
    }

    fn sandbox(id: &str, uid: &str, state: SandboxState) -> Sandbox {
        Sandbox {
            id: id.into(),
            pod: PodRef {
                uid: uid.into(),
                name: format!("name-{uid}"),
                namespace: "ns".into(),
            },
            attempt: 0,
            state,
            created_at: 0,
            labels: Default::default(),
        }
    }

    fn container(id: &str, sandbox_id: &str, state: ContainerState) -> Container {
        Container {
            id: id.into(),
            sandbox_id: sandbox_id.into(),
            name: "c".into(),
            attempt: 0,
            state,
            created_at: 0,
        }
    }

    fn node() -> (Vec<Sandbox>, Vec<Container>) {
        let sandboxes = vec![
            sandbox("s1", "u1", SandboxState::Ready),
            sandbox("s2", "u2", SandboxState::Ready),
        ];
        let containers = vec![
            container("c1", "s1", ContainerState::Running),
            container("c2", "s2", ContainerState::Running),
            container("c3", "s2", ContainerState::Exited),
        ];
        (sandboxes, containers)
    }

    #[test]
    fn nothing_changed_and_what_changed() {
        let (sandboxes, mut containers) = node();
        let records = group(&sandboxes, &containers, &HashMap::new());
        let none: BTreeSet<&str> = BTreeSet::new();
        assert_eq!(
            changed(&sandboxes, &containers, &records, &mut Scratch::default()),
            Some(none)
        );
        // Created and Unknown are the same PLEG state: no change.
        containers[0].state = ContainerState::Unknown;
        let records = group(&sandboxes, &containers, &HashMap::new());
        containers[0].state = ContainerState::Created;
        assert_eq!(
            changed(&sandboxes, &containers, &records, &mut Scratch::default())
                .unwrap()
                .len(),
            0
        );
        containers[1].state = ContainerState::Exited;
        assert_eq!(
            changed(&sandboxes, &containers, &records, &mut Scratch::default()),
            Some(BTreeSet::from(["u2"]))
        );
        // One gone, one new pod.
        let (mut sandboxes, mut containers) = node();
        containers.pop();
        sandboxes.push(sandbox("s9", "u9", SandboxState::Ready));
        let records = group(&node().0, &node().1, &HashMap::new());
        assert_eq!(
            changed(&sandboxes, &containers, &records, &mut Scratch::default()),
            Some(BTreeSet::from(["u2", "u9"]))
        );
        // A pod gone altogether.
        assert_eq!(
            changed(
                &sandboxes[..1],
                &containers[..1],
                &records,
                &mut Scratch::default()
            ),
            Some(BTreeSet::from(["u2"]))
        );
    }

    #[test]
    fn what_it_cannot_tell_cheaply_rebuilds_everything() {
        let (sandboxes, containers) = node();
        let records = group(&sandboxes, &containers, &HashMap::new());
        // A container whose sandbox is not listed.
        assert_eq!(
            changed(
                &sandboxes[..1],
                &containers,
                &records,
                &mut Scratch::default()
            ),
            None
        );
        // An ID listed twice.
        let twice = [sandboxes.clone(), sandboxes[..1].to_vec()].concat();
        assert_eq!(
            changed(&twice, &containers, &records, &mut Scratch::default()),
            None
        );
        let twice = [containers.clone(), containers[..1].to_vec()].concat();
        assert_eq!(
            changed(&sandboxes, &twice, &records, &mut Scratch::default()),
            None
        );
    }

    /// Random lists, the same on every run (a seeded generator).
    fn lists(rng: &mut ChaCha8Rng) -> (Vec<Sandbox>, Vec<Container>) {
        let sb_states = [
            SandboxState::Ready,
            SandboxState::NotReady,
            SandboxState::Unknown,
        ];
        let c_states = [
            ContainerState::Created,
            ContainerState::Running,
            ContainerState::Exited,
            ContainerState::Unknown,
        ];
        let mut sandboxes = Vec::new();
        for i in 0..rng.random_range(0..5) {
            let uid = format!("u{}", rng.random_range(0..3));
            let state = sb_states[rng.random_range(0..3)];
            sandboxes.push(sandbox(
                &format!("s{}", i + rng.random_range(0..2)),
                &uid,
                state,
            ));
        }
        let mut containers = Vec::new();
        for i in 0..rng.random_range(0..6) {
            let state = c_states[rng.random_range(0..4)];
            let sb = format!("s{}", rng.random_range(0..5));
            containers.push(container(
                &format!("c{}", i + rng.random_range(0..2)),
                &sb,
                state,
            ));
        }
        (sandboxes, containers)
    }

    /// Against `group` and `pod_events` over the whole lists (what every relist did
    /// before): a pod said unchanged has no event and keeps its record, and the
    /// changed pods rebuilt from their own entries alone are what the whole lists give.
    #[test]
    fn agrees_with_grouping_everything() {
        let mut rng = ChaCha8Rng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
        let mut decided = 0;
        // One scratch for every draw, as a GenericPleg keeps one.
        let mut scratch = Scratch::default();
        let mut wire_scratch = Scratch::default();
        for _ in 0..20_000 {
            let (s0, c0) = lists(&mut rng);
            let records = group(&s0, &c0, &HashMap::new());
            let (s1, c1) = lists(&mut rng);
            let whole = group(&s1, &c1, &records);
            let decoded = changed(&s1, &c1, &records, &mut scratch);
            // The same lists read from their CRI bytes (the CRI client's path) say
            // the same.
            let wire = NodeLists::encoded(&s1, &c1);
            let view = wire.view().expect("valid bytes");
            assert_eq!(
                changed_pods(
                    view.sandboxes(),
                    view.containers(),
                    &records,
                    &mut wire_scratch
                ),
                decoded,
                "{s0:?} {c0:?} → {s1:?} {c1:?}"
            );
            let Some(changed) = decoded else {
                continue;
            };
            decided += 1;
            for uid in records.keys().chain(whole.keys()) {
                if !changed.contains(uid.as_str()) {
                    assert_eq!(
                        whole.get(uid),
                        records.get(uid),
                        "{s0:?} {c0:?} → {s1:?} {c1:?}"
                    );
                    assert!(pod_events(records.get(uid), whole.get(uid)).is_empty());
                }
            }
            let sub_s: Vec<_> = s1
                .iter()
                .filter(|s| changed.contains(s.pod.uid.as_str()))
                .cloned()
                .collect();
            let ids: HashSet<&str> = sub_s.iter().map(|s| s.id.as_str()).collect();
            let sub_c: Vec<_> = c1
                .iter()
                .filter(|c| ids.contains(c.sandbox_id.as_str()))
                .cloned()
                .collect();
            let rebuilt = group(&sub_s, &sub_c, &HashMap::new());
            for uid in &changed {
                assert_eq!(
                    rebuilt.get(*uid),
                    whole.get(*uid),
                    "{s0:?} {c0:?} → {s1:?} {c1:?}"
                );
            }
        }
        // Most draws are decided, not sent back to the slow path.
        assert!(decided > 2_000, "only {decided} decided");
    }

    /// A global relist skips this check when its lists' fingerprint is the records'
    /// (`fingerprint`): grouping them whole then changes no record and reports no
    /// event, as the check would have found. Lists that name an ID twice are never
    /// skipped (their grouping depends on their order). Half the draws
    /// list the records' own lists again, shuffled, some with one entry changed.
    #[test]
    fn lists_with_the_records_fingerprint_change_no_pod() {
        use rand::seq::SliceRandom as _;
        let mut rng = ChaCha8Rng::seed_from_u64(0x2545_f491_4f6c_dd1d);
        let (mut same, mut twice) = (0, 0);
        for _ in 0..20_000 {
            let (s0, c0) = lists(&mut rng);
            let mut records = Records::default();
            for (uid, rec) in group(&s0, &c0, &HashMap::new()) {
                records.insert(uid, rec);
            }
            let (mut s1, mut c1) = if rng.random_bool(0.5) {
                lists(&mut rng)
            } else {
                (s0.clone(), c0.clone())
            };
            s1.shuffle(&mut rng);
            c1.shuffle(&mut rng);
            if rng.random_bool(0.3) && !c1.is_empty() {
                let i = rng.random_range(0..c1.len());
                c1[i].state = ContainerState::Exited;
            }
            if rng.random_bool(0.1) && !s1.is_empty() {
                let i = rng.random_range(0..s1.len());
                s1[i].pod.name.push('x');
            }
            let view = ListView::of(&s1, &c1);
            let listed = records
                .entry_keys()
                .of_lists(view.each_sandbox(), view.each_container());
            let sandbox_ids: HashSet<&str> = s1.iter().map(|s| s.id.as_str()).collect();
            let container_ids: HashSet<&str> = c1.iter().map(|c| c.id.as_str()).collect();
            if sandbox_ids.len() < s1.len() || container_ids.len() < c1.len() {
                // An ID listed twice: grouped in list order, never skipped.
                assert_eq!(listed, None);
                twice += 1;
                continue;
            }
            if listed != Some(records.fingerprint()) {
                continue;
            }
            same += 1;
            let whole = group(&s1, &c1, &records);
            for uid in records.keys().chain(whole.keys()) {
                assert!(
                    pod_events(records.get(uid), whole.get(uid)).is_empty(),
                    "{s0:?} {c0:?} → {s1:?} {c1:?}"
                );
                assert_eq!(
                    whole.get(uid),
                    records.get(uid),
                    "{s0:?} {c0:?} → {s1:?} {c1:?}"
                );
            }
        }
        assert!(
            same > 1_500 && twice > 1_000,
            "only {same} draws matched the records; {twice} named an ID twice"
        );
    }
}
