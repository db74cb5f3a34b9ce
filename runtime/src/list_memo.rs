//! What the global relist remembers of the last lists it read: a keyed fingerprint of
//! each entry (each `PodSandbox` of ListPodSandbox, each `Container` of
//! ListContainers) that was fully checked, so that the next read skips checking the
//! bulk of an entry that did not change — its labels, annotations and image spec,
//! most of the 17.5 MB of a 10,000-pod node's lists.
//!
//! An entry's fingerprint is the sum of a keyed 64-bit hash of each of its parts:
//! each map field (a label, an annotation: one top-level field per pair) on its own,
//! and each run of the other top-level fields between them as one (keys and values'
//! bytes, the fields plegd reads as well as those the light read below skips). It
//! does not depend on the map fields' order. A container's map fields are not among
//! its parts: plegd keeps none of them, and CRI sets them when it creates the
//! container, so they are checked when the memo first meets its other fields (a new
//! container, or one whose state changed) and not hashed again on every read. A runtime does not send an unchanged
//! entry as the same bytes: containerd's Go protobuf marshals a map in Go's random
//! map order on every list, and plegd-sim builds a sandbox's labels anew for each
//! list too — a hash of the entry's bytes whole would miss nearly every entry. The
//! other fields come in the order of their numbers (Go marshals them so); in another
//! order they make another fingerprint, and the entry is checked in full: time, never
//! a wrong read. (A run hashed as one part costs fewer instructions than a hash a
//! field.) Whether a message is valid
//! does not depend on the order of its fields either: prost checks each field on its
//! own (its key's wire type, its strings' UTF-8, its embedded messages and map
//! entries, all at the entry's recursion depth), so any order of parts, each whole
//! fields checked before, is valid.
//!
//! The contract ([`crate::list_wire`] applies it): every entry is walked field by
//! field; the fields plegd reads (IDs, the pod's identity, state, attempt, creation
//! time) are read from the bytes and checked exactly as a full read reads and checks
//! them (UTF-8, wire types, the last value winning; their fields unknown to plegd
//! skipped as prost skips them), every other field is skipped by its length
//! unchecked; every field, read or skipped, is hashed in its part (but a container's
//! map fields). If the memo holds the sum of those hashes, that is all; otherwise the
//! entry is fully checked, as prost checks it, and its sum remembered. So a
//! fingerprint only vouches that the skipped fields were checked before (a
//! container's labels and annotations: as they were listed then, which a runtime
//! changing them in place, against CRI, would not be told); the one value it stands
//! for is a vouched
//! sandbox's labels, which the packed lists take from the read that remembered it
//! (`crate::packed_lists`). In the read itself, a collision (an entry's parts summing
//! like some remembered entry's) could at worst let through a field plegd does not
//! read there (an invalid image spec, a sandbox's invalid label) that prost would
//! have refused, or
//! keep a sandbox's old labels. The hash is keyed with a per-process random seed,
//! so a pod's author, who controls its labels and annotations, cannot aim at a
//! collision.
//!
//! A read also tells whether its lists are the last good read's, entry for entry, in
//! every field its parts hold ([`ListMemo::unchanged`]): there was a last good read, this one read
//! as many entries, each remembered, none met twice, and it met every remembered
//! one. The global relist then knows the lists' fingerprint against its records is
//! the last one's. An entry that names a field plegd reads twice never counts as
//! remembered, nor is a sandbox whose labels name one key twice (the last value
//! wins, so the two fields' order counts, which the sum of parts need not see). Here
//! a collision could hide a change until the next change on the node, as a
//! collision of the records' fingerprint could.
//!
//! The memo holds exactly the fingerprints of the last read that succeeded: a read
//! builds the next set in place (marking remembered ones it meets, adding those of
//! the entries it checked); only when the whole read succeeds does that set replace the last one, a
//! failed read leaves the memo as it was. Its tables keep their room from read to
//! read (they give it back when the node shrinks to a quarter). Each fingerprint is
//! kept where its entry's ID field places it, and the read asks for that slot when
//! it meets the ID, well before it knows the fingerprint (`crate::memo_slots`).

use std::hash::{BuildHasher as _, Hasher as _};

use crate::memo_slots::Slots;
use crate::node_lists::ListRoom;
use crate::NodeLists;

/// An entry's fingerprint, less the two flag bits.
const KEY: u64 = u64::MAX >> 2;
/// The read's flags.
const FLAGS: u64 = !KEY;
/// Met in the read under way (a remembered entry).
const SEEN: u64 = 1 << 63;
/// Added by the read under way (not remembered before it).
const FRESH: u64 = 1 << 62;
/// A table keeps at least this many slots (a small node's is left alone).
const MIN_ROOM: usize = 512;

/// The entries of one list (the sandboxes' or the containers') checked in the last
/// good read.
#[derive(Debug, Default)]
pub(crate) struct EntryMemo {
    /// foldhash's quality hasher, seeded at random per process (and per memo):
    /// keyed, unlike a plain hash of the bytes. Its fast variant has the same seeds
    /// and byte loop (21 GB/s on whole entries of the realistic node, against 20 for
    /// quality) and leaves out the final mix; fingerprints add the parts' hashes up,
    /// which wants each one fully mixed, for one multiply a part.
    state: foldhash::quality::RandomState,
    /// Entries' fingerprints (the [`KEY`] bits) with the read's flags ([`SEEN`],
    /// [`FRESH`]), each placed by its entry's ID field; 16–32 bytes an entry (12 a
    /// slot).
    table: Slots,
    /// The read under way: its entries, the remembered ones it met (each once), the
    /// ones it added.
    read: Counts,
    /// Whether the last read that ended was the one before it, entry for entry.
    unchanged: bool,
    /// The entries of the last good read (None: no good read since the memo was
    /// made or cleared).
    last_entries: Option<usize>,
}

#[derive(Debug, Default)]
struct Counts {
    entries: usize,
    met: usize,
    added: usize,
}

impl EntryMemo {
    /// One more entry in the read under way.
    #[inline(always)]
    pub(crate) fn count_entry(&mut self) {
        self.read.entries += 1;
    }

    /// A fingerprint to add an entry's fields to.
    #[inline(always)]
    pub(crate) fn fingerprint(&self) -> Fingerprint<'_> {
        Fingerprint {
            state: &self.state,
            table: &self.table,
            place: 0,
            sum: 0,
            read_tags: 0,
            repeated: false,
        }
    }

    /// Whether an entry with this fingerprint was checked before, and when; the read
    /// under way is marked as meeting it.
    #[inline(always)]
    pub(crate) fn knows(&mut self, key: Key) -> Known {
        match self.table.find(key.bits, key.place, FLAGS) {
            Some(i) => {
                let v = self.table.value_mut(i);
                if *v & SEEN == 0 {
                    self.read.met += 1;
                }
                let known = match *v & FRESH {
                    0 => Known::LastRead,
                    _ => Known::ThisRead,
                };
                *v |= SEEN;
                known
            }
            None => Known::No,
        }
    }

    /// Remembers an entry this read checked fully (one [`EntryMemo::knows`] did not
    /// know).
    #[inline(always)]
    pub(crate) fn add(&mut self, key: Key) {
        if self.table.insert(key.bits | FRESH, key.place, MIN_ROOM) {
            self.read.added += 1;
        }
    }

    /// The read succeeded: its entries (met or added) are the memo.
    fn commit(&mut self) {
        let Counts {
            entries,
            met,
            added,
        } = std::mem::take(&mut self.read);
        self.unchanged =
            self.last_entries == Some(entries) && entries == met && met == self.table.len() - added;
        self.last_entries = Some(entries);
        self.table.retain(|v| {
            let keep = *v & (SEEN | FRESH) != 0;
            *v &= KEY;
            keep
        });
        self.table.shrink(MIN_ROOM);
    }

    /// The read failed: the memo is what it was before it.
    fn abandon(&mut self) {
        self.read = Counts::default();
        self.unchanged = false;
        self.table.retain(|v| {
            let keep = *v & FRESH == 0;
            *v &= KEY;
            keep
        });
    }

    /// Whether this fingerprint is remembered (without marking it met).
    #[cfg(test)]
    pub(crate) fn holds(&self, key: Key) -> bool {
        self.table.find(key.bits, key.place, FLAGS).is_some()
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

/// Whether a memo holds a fingerprint: no, from the last good read, or from an entry
/// checked earlier in the read under way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Known {
    No,
    LastRead,
    ThisRead,
}

/// An entry's fingerprint, and where the memo keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    /// The fingerprint's [`KEY`] bits (never 0).
    bits: u64,
    /// A keyed hash of the entry's ID field (0 without one).
    place: u32,
}

/// An entry's fingerprint, being summed up.
pub(crate) struct Fingerprint<'m> {
    state: &'m foldhash::quality::RandomState,
    table: &'m Slots,
    place: u32,
    sum: u64,
    /// The tags of the fields plegd reads met so far (bit n: tag n).
    read_tags: u32,
    repeated: bool,
}

impl Fingerprint<'_> {
    /// Adds a part of an entry (a field's or a run of fields' bytes, keys and all).
    #[inline(always)]
    pub(crate) fn field(&mut self, bytes: &[u8]) {
        // The bytes alone (`write` mixes their length in): `hash_one` would add a
        // length prefix, a second mix for nothing.
        let mut h = self.state.build_hasher();
        h.write(bytes);
        self.sum = self.sum.wrapping_add(h.finish());
    }

    /// The entry's ID field (key and all), met first in a read: where the memo keeps
    /// the entry, whose slot is brought into the cache now (see `crate::memo_slots`).
    #[inline(always)]
    pub(crate) fn id(&mut self, field: &[u8]) {
        let mut h = self.state.build_hasher();
        h.write(field);
        self.place = h.finish() as u32;
        self.table.touch(self.place);
    }

    /// Notes a top-level field plegd reads, of tag `tag` (under 32), without hashing it.
    #[inline(always)]
    pub(crate) fn note_read(&mut self, tag: u32) {
        let bit = 1 << tag;
        self.repeated |= self.read_tags & bit != 0;
        self.read_tags |= bit;
    }

    /// The entry's key for [`EntryMemo::knows`] and [`EntryMemo::add`]; None for
    /// an entry that named a field plegd reads twice (never remembered).
    #[inline(always)]
    pub(crate) fn key(&self) -> Option<Key> {
        (!self.repeated).then_some(Key {
            // 0 is an empty slot: a sum of 0 counts as 1.
            bits: (self.sum & KEY).max(1),
            place: self.place,
        })
    }
}

/// The entries of the last global relist's lists that were fully checked, for the
/// next one ([`crate::NodeLists::view_memo`]); see the module's comment.
#[derive(Debug, Default)]
pub struct ListMemo {
    pub(crate) sandboxes: EntryMemo,
    pub(crate) containers: EntryMemo,
    pub(crate) room: ListRoom,
}

impl ListMemo {
    /// The fingerprints remembered: (sandboxes', containers'), one per entry of the
    /// last good read (entries alike share one).
    pub fn len(&self) -> (usize, usize) {
        (self.sandboxes.len(), self.containers.len())
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0)
    }

    /// Whether the last read, which succeeded, held the same entries as the good read
    /// before it, each in every field its fingerprint holds (see the module's comment); false after a read
    /// that failed or did not use the memo, and after a [`ListMemo::clear`].
    pub fn unchanged(&self) -> bool {
        self.sandboxes.unchanged && self.containers.unchanged
    }

    /// Forgets every entry: the next read checks every entry in full.
    pub fn clear(&mut self) {
        *self = ListMemo::default();
    }

    /// The bytes its tables hold (their room included), and the lists kept for the
    /// next read.
    pub fn heap_bytes(&self) -> usize {
        [&self.sandboxes, &self.containers]
            .iter()
            .map(|m| m.table.heap_bytes())
            .sum::<usize>()
            + self.room.heap_bytes()
    }

    /// The global relist is done with its lists (and their view): what of them the
    /// next read can fill again is kept for it.
    pub fn keep(&mut self, lists: NodeLists) {
        self.room.keep(lists);
    }

    /// Ends a read: its entries replace the memo if it succeeded, are forgotten if not.
    pub(crate) fn finish(&mut self, succeeded: bool) {
        for m in [&mut self.sandboxes, &mut self.containers] {
            if succeeded {
                m.commit();
            } else {
                m.abandon();
            }
        }
    }
}
