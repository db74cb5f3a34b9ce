//! The global relist's two lists as [`crate::list_sink`] reads them as they arrive:
//! only the fields plegd reads of each entry, packed (their strings in one block), not
//! the responses' bytes. At 10,000 realistic pods ≈ 150 bytes a container instead of
//! ≈ 850, ≈ 170 bytes a sandbox instead of ≈ 450.
//!
//! A sandbox's labels are kept only when its entry was checked in full (the list
//! memo did not vouch for it: a sandbox not seen before, or the first read). An entry
//! the memo vouches for is a sandbox of the last good read, with the same ID, read in
//! full then or before, and a sandbox's labels never change (CRI sets them when it
//! runs the sandbox): its labels are taken from the pod's last status read
//! ([`crate::SandboxRef::to_sandbox`] says which).

use crate::list_memo::{EntryMemo, ListMemo};
use crate::list_wire::{self, ContainerFields, SandboxFields, WireError};

/// A list the sink reads a response's entries into.
pub(crate) trait PackedList: Default + Send + 'static {
    /// Reads one entry's bytes with the memo's part for this list, and keeps it.
    fn read(&mut self, entry: &[u8], memo: &mut EntryMemo) -> Result<(), WireError>;
    /// This list's part of the memo, and the list kept for its next read.
    fn parts(memo: &mut ListMemo) -> (&mut EntryMemo, &mut Self);
}

const TOO_LARGE: &str = "the list's strings are over 4 GiB";

/// The room a list keeps is let go when it is over three times what it holds (a
/// small list's is left alone).
fn fits(capacity: usize, len: usize, least: usize) -> bool {
    capacity <= 3 * len.max(least)
}

const MIN_ENTRIES: usize = 256;

/// Entries of `N` strings each and the rest `E`, their strings in one block.
#[derive(Clone, Debug)]
struct Block<E, const N: usize> {
    text: String,
    entries: Vec<Packed<E, N>>,
}

impl<E, const N: usize> Default for Block<E, N> {
    fn default() -> Self {
        Block {
            text: String::new(),
            entries: Vec::new(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Packed<E, const N: usize> {
    /// Where each string ends in `text` (each starts where the one before ends).
    ends: [u32; N],
    rest: E,
}

impl<E, const N: usize> Block<E, N> {
    fn push(&mut self, strings: [&str; N], rest: E) -> Result<(), WireError> {
        let mut ends = [0u32; N];
        for (end, s) in ends.iter_mut().zip(strings) {
            self.text.push_str(s);
            *end = u32::try_from(self.text.len()).map_err(|_| TOO_LARGE)?;
        }
        self.entries.push(Packed { ends, rest });
        Ok(())
    }

    fn iter(&self) -> impl Iterator<Item = ([&str; N], &E)> {
        let mut start = 0;
        self.entries.iter().map(move |e| {
            let strings = e.ends.map(|end| {
                let s = &self.text[start..end as usize];
                start = end as usize;
                s
            });
            (strings, &e.rest)
        })
    }

    fn fits(&self) -> bool {
        fits(self.entries.capacity(), self.entries.len(), MIN_ENTRIES)
            && fits(self.text.capacity(), self.text.len(), 64 * MIN_ENTRIES)
    }

    fn clear(&mut self) {
        self.text.clear();
        self.entries.clear();
    }

    fn heap_bytes(&self) -> usize {
        self.text.capacity() + self.entries.capacity() * std::mem::size_of::<Packed<E, N>>()
    }
}

/// The containers plegd reads of a `ListContainersResponse`, packed: their ID,
/// sandbox ID and name, and the rest.
#[derive(Clone, Debug, Default)]
pub struct ContainerList(Block<ContainerRest, 3>);

#[derive(Clone, Copy, Debug)]
struct ContainerRest {
    attempt: u32,
    state: i32,
    created_at: i64,
}

impl ContainerList {
    /// The entries, as [`list_wire::containers`] reads them.
    pub(crate) fn iter(&self) -> impl Iterator<Item = ContainerFields<'_>> {
        self.0
            .iter()
            .map(|([id, sandbox_id, name], e)| ContainerFields {
                id,
                sandbox_id,
                name,
                attempt: e.attempt,
                state: e.state,
                created_at: e.created_at,
            })
    }

    pub fn len(&self) -> usize {
        self.0.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.entries.is_empty()
    }

    /// Whether its room is worth keeping for the next read.
    pub(crate) fn fits(&self) -> bool {
        self.0.fits()
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.0.heap_bytes()
    }
}

impl PackedList for ContainerList {
    fn read(&mut self, entry: &[u8], memo: &mut EntryMemo) -> Result<(), WireError> {
        let f = list_wire::container_entry(entry, Some(memo))?;
        let rest = ContainerRest {
            attempt: f.attempt,
            state: f.state,
            created_at: f.created_at,
        };
        self.0.push([f.id, f.sandbox_id, f.name], rest)
    }

    fn parts(memo: &mut ListMemo) -> (&mut EntryMemo, &mut Self) {
        (&mut memo.containers, &mut memo.room.containers)
    }
}

/// The sandboxes plegd reads of a `ListPodSandboxResponse`, packed: their ID, pod
/// UID, name and namespace, and the rest; the labels of those checked in full.
#[derive(Clone, Debug, Default)]
pub struct SandboxList {
    block: Block<SandboxRest, 4>,
    /// The label fields of entries checked in full, as they came (each a
    /// `PodSandbox` field 5, key and all).
    labels: Vec<u8>,
}

#[derive(Clone, Copy, Debug)]
struct SandboxRest {
    /// Where its label fields are in `labels`, if they were kept.
    labels: Option<[u32; 2]>,
    attempt: u32,
    state: i32,
    created_at: i64,
    has_metadata: bool,
}

impl SandboxList {
    fn push(&mut self, f: &SandboxFields<'_>, entry: &[u8], full: bool) -> Result<(), WireError> {
        let labels = if full {
            let start = u32::try_from(self.labels.len()).map_err(|_| TOO_LARGE)?;
            list_wire::sandbox_label_fields(entry, |field| self.labels.extend_from_slice(field));
            let end = u32::try_from(self.labels.len()).map_err(|_| TOO_LARGE)?;
            Some([start, end])
        } else {
            None
        };
        let rest = SandboxRest {
            labels,
            attempt: f.attempt,
            state: f.state,
            created_at: f.created_at,
            has_metadata: f.has_metadata,
        };
        self.block.push([f.id, f.uid, f.name, f.namespace], rest)
    }

    /// The entries, as [`list_wire::sandboxes`] reads them, each with its label
    /// fields if they were kept (read them with [`list_wire::sandbox_labels`]).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SandboxFields<'_>, Option<&[u8]>)> {
        self.block.iter().map(|([id, uid, name, namespace], e)| {
            let fields = SandboxFields {
                id,
                has_metadata: e.has_metadata,
                uid,
                name,
                namespace,
                attempt: e.attempt,
                state: e.state,
                created_at: e.created_at,
            };
            let labels = e
                .labels
                .map(|[from, to]| &self.labels[from as usize..to as usize]);
            (fields, labels)
        })
    }

    pub fn len(&self) -> usize {
        self.block.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.block.entries.is_empty()
    }

    /// Whether its room is worth keeping for the next read (the labels' room aside:
    /// [`SandboxList::clear`]).
    pub(crate) fn fits(&self) -> bool {
        self.block.fits()
    }

    /// Empties it for the next read. The labels' room is let go on its own when over
    /// three times what this read kept (after the first read, which keeps every
    /// sandbox's labels, the next one keeps almost none).
    pub(crate) fn clear(&mut self) {
        self.block.clear();
        if fits(self.labels.capacity(), self.labels.len(), 64 * MIN_ENTRIES) {
            self.labels.clear();
        } else {
            self.labels = Vec::new();
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.block.heap_bytes() + self.labels.capacity()
    }
}

impl PackedList for SandboxList {
    fn read(&mut self, entry: &[u8], memo: &mut EntryMemo) -> Result<(), WireError> {
        let (f, full) = list_wire::sandbox_entry(entry, Some(memo))?;
        self.push(&f, entry, full)
    }

    fn parts(memo: &mut ListMemo) -> (&mut EntryMemo, &mut Self) {
        (&mut memo.sandboxes, &mut memo.room.sandboxes)
    }
}
