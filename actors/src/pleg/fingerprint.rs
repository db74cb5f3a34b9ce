//! The records' fingerprint: a keyed sum over every entry the change check compares
//! (each sandbox's ID, state and pod; each container's ID, sandbox ID and state),
//! kept up to date as the records change ([`Records`](super::record::Records)).
//!
//! When a global relist's lists sum to the records' fingerprint, name no ID twice,
//! and the records hold no loose container ([`Fingerprint`]), every listed container's
//! sandbox is listed once, under the pod whose record holds the container with that
//! state, and every listed sandbox is in its pod's record with its state: exactly
//! what [`changed_pods`](super::changes::changed_pods) checks, entry by entry, before
//! it answers "no pod changed". It is then not run, and no record is looked up (at
//! 10,000 pods its tables and look-ups, mostly cache misses, were ≈ 30 % of a
//! no-change relist).
//!
//! A sum, so the order of the lists does not count (containerd lists from a map).
//! Each entry is hashed by two foldhash hashers of different random seeds (128 bits):
//! not a cryptographic hash, but keyed, so the sums are unknown outside plegd, and
//! pod authors, who name pods, cannot aim a change at a collision. The quality
//! variant, whose final mix each hash gets before it is added (as the list memo's
//! fingerprints do). A collision would hide a change until the next change on the
//! node.

use std::hash::{BuildHasher, Hasher};

use foldhash::quality::{FoldHasher, RandomState};
use hashbrown::hash_table::{Entry, HashTable};
use plegd_runtime::{ContainerRef, SandboxRef};

use super::record::{PlegState, PodRecord};

/// A multiset of entries: the wrapping sum of their keyed hashes and their count;
/// for records, also how many of their containers are loose (their sandbox is not
/// one of their own record's: listed under another pod, or not listed when they
/// were). Lists have none, so records with a loose container never match them: where
/// such a container belongs is decided by grouping the lists whole, as before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fingerprint {
    sum: u128,
    entries: u64,
    loose: u64,
}

impl Fingerprint {
    fn add_entry(&mut self, hash: u128) {
        self.sum = self.sum.wrapping_add(hash);
        self.entries = self.entries.wrapping_add(1);
    }

    pub fn add(&mut self, other: Fingerprint) {
        self.sum = self.sum.wrapping_add(other.sum);
        self.entries = self.entries.wrapping_add(other.entries);
        self.loose = self.loose.wrapping_add(other.loose);
    }

    pub fn remove(&mut self, other: Fingerprint) {
        self.sum = self.sum.wrapping_sub(other.sum);
        self.entries = self.entries.wrapping_sub(other.entries);
        self.loose = self.loose.wrapping_sub(other.loose);
    }
}

/// The two random keys entries are hashed with; one per records' table, for its life.
#[derive(Clone, Default)]
pub struct EntryKeys {
    low: RandomState,
    high: RandomState,
}

/// What tells a sandbox's entry from a container's with the same fields.
const SANDBOX: u8 = 0;
const CONTAINER: u8 = 1;

impl EntryKeys {
    /// The hash of a `kind` of entry with this ID, and of its other `fields` too:
    /// (the ID's alone, to tell IDs listed twice; the entry's).
    fn hash(&self, kind: u8, id: &str, fields: impl Fn(&mut FoldHasher<'static>)) -> (u64, u128) {
        let mut low = self.low.build_hasher();
        let mut high = self.high.build_hasher();
        for h in [&mut low, &mut high] {
            h.write_u8(kind);
            text(h, id);
        }
        let id_hash = low.finish();
        fields(&mut low);
        fields(&mut high);
        let entry = u128::from(high.finish()) << 64 | u128::from(low.finish());
        (id_hash, entry)
    }

    fn sandbox(
        &self,
        id: &str,
        state: PlegState,
        uid: &str,
        name: &str,
        namespace: &str,
    ) -> (u64, u128) {
        self.hash(SANDBOX, id, |h| {
            h.write_u8(state as u8);
            text(h, uid);
            text(h, name);
            text(h, namespace);
        })
    }

    fn container(&self, id: &str, sandbox_id: &str, state: PlegState) -> (u64, u128) {
        self.hash(CONTAINER, id, |h| {
            text(h, sandbox_id);
            h.write_u8(state as u8);
        })
    }

    /// The entries of one pod's record.
    pub fn of_record(&self, rec: &PodRecord) -> Fingerprint {
        let mut print = Fingerprint::default();
        let pod = &rec.pod;
        for (id, state) in rec.sandboxes.iter() {
            let (_, hash) =
                id.with_str(|id| self.sandbox(id, *state, pod.uid(), pod.name(), pod.namespace()));
            print.add_entry(hash);
        }
        for (id, (sandbox, state)) in rec.containers.iter() {
            let (_, hash) =
                id.with_str(|id| sandbox.with_str(|sandbox| self.container(id, sandbox, *state)));
            print.add_entry(hash);
            if rec.sandboxes.get_id(sandbox).is_none() {
                print.loose += 1;
            }
        }
        print
    }

    /// The entries of a global relist's lists; `None` if they may name an ID twice
    /// (two sandboxes, or two containers, whose IDs hash alike). Such lists are
    /// grouped in list order, which a sum cannot see: they are left to the change
    /// check (which sends them to be grouped whole).
    pub fn of_lists<'v>(
        &self,
        sandboxes: impl Iterator<Item = SandboxRef<'v>>,
        containers: impl Iterator<Item = ContainerRef<'v>>,
    ) -> Option<Fingerprint> {
        let mut print = Fingerprint::default();
        let most = |hint: (usize, Option<usize>)| hint.1.unwrap_or(hint.0);
        let mut seen =
            HashTable::with_capacity(most(sandboxes.size_hint()) + most(containers.size_hint()));
        let mut first =
            |(id_hash, entry): (u64, u128)| match seen.entry(id_hash, |&x| x == id_hash, |&x| x) {
                Entry::Occupied(_) => None,
                Entry::Vacant(slot) => {
                    slot.insert(id_hash);
                    Some(entry)
                }
            };
        for sb in sandboxes {
            let state = PlegState::from(sb.state);
            print.add_entry(first(self.sandbox(
                sb.id,
                state,
                sb.uid,
                sb.name,
                sb.namespace,
            ))?);
        }
        for c in containers {
            print.add_entry(first(self.container(
                c.id,
                c.sandbox_id,
                PlegState::from(c.state),
            ))?);
        }
        Some(print)
    }
}

/// A string, its length first: no two lists of fields write the same bytes.
fn text(h: &mut impl Hasher, s: &str) {
    h.write_usize(s.len());
    h.write(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use rand::{Rng as _, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::pleg::record::{Id, IdMap, PodName, Records};

    fn record(rng: &mut ChaCha8Rng) -> PodRecord {
        let states = [PlegState::Running, PlegState::Exited, PlegState::Unknown];
        let mut rec = PodRecord {
            pod: PodName::new("u", &format!("n{}", rng.random_range(0..3)), "ns"),
            sandboxes: IdMap::new(),
            containers: IdMap::new(),
        };
        for _ in 0..rng.random_range(0..3) {
            let id = format!("{:064x}", rng.random_range(0..4u8));
            rec.sandboxes.insert(id, states[rng.random_range(0..3)]);
        }
        for _ in 0..rng.random_range(0..4) {
            let sandbox = Id::new(&format!("{:064x}", rng.random_range(0..4u8)));
            let id = format!("c{}", rng.random_range(0..6));
            rec.containers
                .insert(id, (sandbox, states[rng.random_range(0..3)]));
        }
        rec
    }

    /// However the records change, their fingerprint is the sum of their records'.
    #[test]
    fn the_records_fingerprint_follows_every_change() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut records = Records::default();
        for _ in 0..5_000 {
            let uid = format!("u{}", rng.random_range(0..8));
            match rng.random_range(0..3) {
                0 => {
                    records.insert(uid, record(&mut rng));
                }
                1 => {
                    records.remove(&uid);
                }
                _ => {
                    let new = record(&mut rng);
                    records.update(&uid, |rec| rec.containers = new.containers);
                }
            }
            let mut whole = Fingerprint::default();
            for rec in records.values() {
                whole.add(records.entry_keys().of_record(rec));
            }
            assert_eq!(records.fingerprint(), whole);
        }
    }

    /// Every field the change check compares counts, and a packed ID counts as the
    /// string it spells.
    #[test]
    fn each_compared_field_changes_an_entrys_hash() {
        let keys = EntryKeys::default();
        let id = "ab".repeat(32);
        let base = keys.sandbox(&id, PlegState::Running, "u", "n", "ns").1;
        for other in [
            keys.sandbox(&"ac".repeat(32), PlegState::Running, "u", "n", "ns"),
            keys.sandbox(&id, PlegState::Exited, "u", "n", "ns"),
            keys.sandbox(&id, PlegState::Running, "v", "n", "ns"),
            keys.sandbox(&id, PlegState::Running, "u", "m", "ns"),
            keys.sandbox(&id, PlegState::Running, "u", "n", "nt"),
            // The same characters cut elsewhere.
            keys.sandbox(&id, PlegState::Running, "un", "", "ns"),
            keys.container(&id, "u", PlegState::Running),
        ] {
            assert_ne!(base, other.1);
        }
        let c = keys.container("c", &id, PlegState::Running).1;
        assert_ne!(c, keys.container("c", &id, PlegState::Exited).1);
        assert_ne!(
            c,
            keys.container("c", &"cd".repeat(32), PlegState::Running).1
        );
        let rec = PodRecord {
            pod: PodName::new("u", "n", "ns"),
            sandboxes: [(Id::new(&id), PlegState::Running)].into_iter().collect(),
            containers: [(Id::new("c"), (Id::new(&id), PlegState::Running))]
                .into_iter()
                .collect(),
        };
        let mut expected = Fingerprint::default();
        expected.add_entry(base);
        expected.add_entry(c);
        assert_eq!(keys.of_record(&rec), expected);
    }
}
