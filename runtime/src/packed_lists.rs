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

/// The offset where a string just pushed onto `text` ends (None: the block would
/// outgrow u32 offsets).
fn pushed(text: &mut String, s: &str) -> Option<u32> {
    text.push_str(s);
    u32::try_from(text.len()).ok()
}

const TOO_LARGE: &str = "the list's strings are over 4 GiB";

/// The containers plegd reads of a `ListContainersResponse`, packed.
#[derive(Clone, Debug, Default)]
pub struct ContainerList {
    text: String,
    entries: Vec<PackedContainer>,
}

#[derive(Clone, Copy, Debug)]
struct PackedContainer {
    /// Where the ID, the sandbox ID and the name end in `text` (each starts where the
    /// one before ends).
    ends: [u32; 3],
    attempt: u32,
    state: i32,
    created_at: i64,
}

/// The room a list keeps is let go when it is over three times what it holds (a
/// small list's is left alone).
fn fits(capacity: usize, len: usize, least: usize) -> bool {
    capacity <= 3 * len.max(least)
}

const MIN_ENTRIES: usize = 256;

impl ContainerList {
    fn push(&mut self, f: &ContainerFields<'_>) -> bool {
        let mut ends = [0u32; 3];
        for (end, s) in ends.iter_mut().zip([f.id, f.sandbox_id, f.name]) {
            match pushed(&mut self.text, s) {
                Some(at) => *end = at,
                None => return false,
            }
        }
        self.entries.push(PackedContainer {
            ends,
            attempt: f.attempt,
            state: f.state,
            created_at: f.created_at,
        });
        true
    }

    /// The entries, as [`list_wire::containers`] reads them.
    pub(crate) fn iter(&self) -> impl Iterator<Item = ContainerFields<'_>> {
        let mut start = 0;
        self.entries.iter().map(move |e| {
            let [id, sandbox_id, name] = e.ends.map(|end| {
                let s = &self.text[start..end as usize];
                start = end as usize;
                s
            });
            ContainerFields {
                id,
                sandbox_id,
                name,
                attempt: e.attempt,
                state: e.state,
                created_at: e.created_at,
            }
        })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether its room is worth keeping for the next read.
    pub(crate) fn fits(&self) -> bool {
        fits(self.entries.capacity(), self.entries.len(), MIN_ENTRIES)
            && fits(self.text.capacity(), self.text.len(), 64 * MIN_ENTRIES)
    }

    pub(crate) fn clear(&mut self) {
        self.text.clear();
        self.entries.clear();
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.text.capacity() + self.entries.capacity() * std::mem::size_of::<PackedContainer>()
    }
}

impl PackedList for ContainerList {
    fn read(&mut self, entry: &[u8], memo: &mut EntryMemo) -> Result<(), WireError> {
        let f = list_wire::container_entry(entry, Some(memo))?;
        if self.push(&f) {
            Ok(())
        } else {
            Err(TOO_LARGE.into())
        }
    }

    fn parts(memo: &mut ListMemo) -> (&mut EntryMemo, &mut Self) {
        (&mut memo.containers, &mut memo.room.containers)
    }
}

/// The sandboxes plegd reads of a `ListPodSandboxResponse`, packed; the labels of
/// those checked in full.
#[derive(Clone, Debug, Default)]
pub struct SandboxList {
    text: String,
    /// The label fields of entries checked in full, as they came (each a
    /// `PodSandbox` field 5, key and all).
    labels: Vec<u8>,
    entries: Vec<PackedSandbox>,
}

#[derive(Clone, Copy, Debug)]
struct PackedSandbox {
    /// Where the ID, the pod's UID, name and namespace end in `text`.
    ends: [u32; 4],
    /// Where its label fields are in `labels`, if they were kept.
    labels: Option<[u32; 2]>,
    attempt: u32,
    state: i32,
    created_at: i64,
    has_metadata: bool,
}

impl SandboxList {
    fn push(&mut self, f: &SandboxFields<'_>, entry: &[u8], full: bool) -> Result<(), WireError> {
        let mut ends = [0u32; 4];
        for (end, s) in ends.iter_mut().zip([f.id, f.uid, f.name, f.namespace]) {
            *end = pushed(&mut self.text, s).ok_or(TOO_LARGE)?;
        }
        let labels = if full {
            let start = u32::try_from(self.labels.len()).map_err(|_| TOO_LARGE)?;
            list_wire::sandbox_label_fields(entry, |field| self.labels.extend_from_slice(field));
            let end = u32::try_from(self.labels.len()).map_err(|_| TOO_LARGE)?;
            Some([start, end])
        } else {
            None
        };
        self.entries.push(PackedSandbox {
            ends,
            labels,
            attempt: f.attempt,
            state: f.state,
            created_at: f.created_at,
            has_metadata: f.has_metadata,
        });
        Ok(())
    }

    /// The entries, as [`list_wire::sandboxes`] reads them, each with its label
    /// fields if they were kept (read them with [`list_wire::sandbox_labels`]).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SandboxFields<'_>, Option<&[u8]>)> {
        let mut start = 0;
        self.entries.iter().map(move |e| {
            let [id, uid, name, namespace] = e.ends.map(|end| {
                let s = &self.text[start..end as usize];
                start = end as usize;
                s
            });
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
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether its room is worth keeping for the next read (the labels' room aside:
    /// [`SandboxList::clear`]).
    pub(crate) fn fits(&self) -> bool {
        fits(self.entries.capacity(), self.entries.len(), MIN_ENTRIES)
            && fits(self.text.capacity(), self.text.len(), 64 * MIN_ENTRIES)
    }

    /// Empties it for the next read. The labels' room is let go on its own when over
    /// three times what this read kept (after the first read, which keeps every
    /// sandbox's labels, the next one keeps almost none).
    pub(crate) fn clear(&mut self) {
        self.text.clear();
        self.entries.clear();
        if fits(self.labels.capacity(), self.labels.len(), 64 * MIN_ENTRIES) {
            self.labels.clear();
        } else {
            self.labels = Vec::new();
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.text.capacity()
            + self.labels.capacity()
            + self.entries.capacity() * std::mem::size_of::<PackedSandbox>()
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
