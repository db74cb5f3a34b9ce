//! The publisher's history kept in a file of the state dir (`history`) instead of
//! memory: the packed events (`packed`) one after another, and in memory only each
//! one's revision and offset (16 bytes an event, against ≈ 126 packed). A replay reads
//! its events back with `pread` (from the page cache, as a rule).
//!
//! The file is derived, not stored state: it is made anew at each start from what the
//! state file held, so it needs neither checksums nor syncs. Evicted events leave dead
//! bytes at its head; once they outweigh the live ones (and pass [`COMPACT_MIN`]), the
//! live ones are copied to a new file that replaces it.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::packed::PackedEvent;

/// Dead bytes at the file's head below which it is never compacted.
const COMPACT_MIN: u64 = 1 << 20;

pub(crate) struct HistoryFile {
    path: PathBuf,
    file: File,
    /// (revision, offset) of each event held, oldest first.
    index: VecDeque<(u64, u64)>,
    /// Where the next event goes: the end of the written bytes.
    end: u64,
    /// Events pushed since the last [`Self::flush`], packed one after another.
    pending: Vec<u8>,
}

/// The file could not be written or read: the history goes back to memory with
/// what could be read (`events`, oldest first); the `lost` oldest events could not.
pub(crate) struct Unspilled {
    pub(crate) events: VecDeque<PackedEvent>,
    pub(crate) lost: Vec<u64>,
}

impl HistoryFile {
    /// Makes the file at `path` anew (empty).
    pub(crate) fn create(path: &Path) -> std::io::Result<HistoryFile> {
        Ok(HistoryFile {
            path: path.to_path_buf(),
            file: new_file(path)?,
            index: VecDeque::new(),
            end: 0,
            pending: Vec::new(),
        })
    }

    /// Adds an event; written by the next [`Self::flush`].
    #[cfg(test)]
    pub(crate) fn push(&mut self, event: &PackedEvent) {
        self.push_bytes(event.as_bytes());
    }

    /// Adds an event's packed bytes ([`PackedEvent::pack_into`]'s).
    pub(crate) fn push_bytes(&mut self, event: &[u8]) {
        let offset = self.end + self.pending.len() as u64;
        self.index
            .push_back((crate::packed::revision_of(event), offset));
        self.pending.extend_from_slice(event);
    }

    /// Writes what was pushed since the last flush (one `write(2)`).
    pub(crate) fn flush(&mut self) -> std::io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.file.write_all_at(&self.pending, self.end)?;
        self.end += self.pending.len() as u64;
        self.pending.clear();
        if self.pending.capacity() > 64 << 10 {
            self.pending.shrink_to(64 << 10);
        }
        Ok(())
    }

    /// Drops the oldest event (its revision); compacts the file when due.
    pub(crate) fn pop_front(&mut self) -> Option<u64> {
        let (revision, _) = self.index.pop_front()?;
        if let Err(e) = self.compact_if_due() {
            // The dead head stays; the next eviction tries again.
            tracing::debug!(error = %e, "cannot compact the history file");
        }
        Some(revision)
    }

    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// The revision of the event at `i` (0: the oldest held).
    pub(crate) fn revision(&self, i: usize) -> Option<u64> {
        self.index.get(i).map(|&(r, _)| r)
    }

    /// How many of the events held have a revision at most `revision`.
    pub(crate) fn count_through(&self, revision: u64) -> usize {
        self.index.partition_point(|&(r, _)| r <= revision)
    }

    /// The event at `i`, read back. Err: the file could not be read.
    pub(crate) fn get(&self, i: usize) -> std::io::Result<Option<PackedEvent>> {
        let Some(&(_, start)) = self.index.get(i) else {
            return Ok(None);
        };
        let stop = self.index.get(i + 1).map_or(self.end, |&(_, o)| o);
        let bytes = self.read(start, stop)?;
        PackedEvent::from_bytes(&bytes)
            .map(Some)
            .ok_or_else(|| std::io::Error::other("a history event that does not unpack"))
    }

    /// Heap bytes the index and the write buffer take.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.index.capacity() * std::mem::size_of::<(u64, u64)>() + self.pending.capacity()
    }

    /// Bytes of the file.
    #[cfg(test)]
    pub(crate) fn file_bytes(&self) -> u64 {
        self.end
    }

    /// Every event held, read back, oldest first; the oldest that cannot be read are
    /// told as lost (their revisions). Ends the file (it is removed).
    pub(crate) fn into_memory(self) -> Unspilled {
        let mut out = Unspilled {
            events: VecDeque::with_capacity(self.index.len()),
            lost: Vec::new(),
        };
        let head = self.index.front().map_or(self.end, |&(_, o)| o);
        let written = self.read(head, self.end).ok();
        for (i, &(revision, start)) in self.index.iter().enumerate() {
            let stop = self
                .index
                .get(i + 1)
                .map_or(self.end + self.pending.len() as u64, |&(_, o)| o);
            let bytes = if start >= self.end {
                let (a, b) = ((start - self.end) as usize, (stop - self.end) as usize);
                self.pending.get(a..b)
            } else {
                let (a, b) = ((start - head) as usize, (stop - head) as usize);
                written.as_deref().and_then(|w| w.get(a..b))
            };
            match bytes.and_then(PackedEvent::from_bytes) {
                Some(ev) => out.events.push_back(ev),
                // Only the oldest may be dropped: a replay tells them as evicted.
                None if out.events.is_empty() => out.lost.push(revision),
                None => {
                    out.lost.extend(out.events.drain(..).map(|e| e.revision()));
                    out.lost.push(revision);
                }
            }
        }
        let _ = std::fs::remove_file(&self.path);
        out
    }

    fn read(&self, start: u64, stop: u64) -> std::io::Result<Vec<u8>> {
        let len = usize::try_from(stop.saturating_sub(start))
            .map_err(|_| std::io::Error::other("a history event beyond memory"))?;
        let mut buf = vec![0; len];
        self.file.read_exact_at(&mut buf, start)?;
        Ok(buf)
    }

    fn compact_if_due(&mut self) -> std::io::Result<()> {
        let head = self.index.front().map_or(self.end, |&(_, o)| o);
        let live = self.end - head;
        if head < COMPACT_MIN || head < live {
            return Ok(());
        }
        let new_path = self.path.with_extension("new");
        let mut new = new_file(&new_path)?;
        let mut from = &self.file;
        from.seek(SeekFrom::Start(head))?;
        // File to file: the kernel copies (copy_file_range), no buffer here.
        let copied = std::io::copy(&mut std::io::Read::take(from, live), &mut new)?;
        if copied != live {
            return Err(std::io::Error::other("the history file ended early"));
        }
        std::fs::rename(&new_path, &self.path)?;
        self.file = new;
        for (_, offset) in &mut self.index {
            *offset -= head;
        }
        self.end = live;
        Ok(())
    }
}

fn new_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::started_event;

    fn packed(revision: u64) -> PackedEvent {
        let mut ev = started_event(revision, "u1");
        ev.time = std::time::UNIX_EPOCH;
        PackedEvent::pack(&ev, &mut Vec::new())
    }

    #[test]
    fn events_come_back_as_pushed_through_evictions_and_compactions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history");
        let mut f = HistoryFile::create(&path).unwrap();
        let cap = 2_000;
        let mut next = 1;
        let mut compacted = false;
        for _ in 0..40 {
            for _ in 0..500 {
                f.push(&packed(next));
                next += 1;
            }
            f.flush().unwrap();
            while f.len() > cap {
                f.pop_front();
            }
            let before = f.file_bytes();
            compacted |= before < (next - 1) * 40;
            for i in [0, f.len() / 2, f.len() - 1] {
                let ev = f.get(i).unwrap().unwrap();
                assert_eq!(Some(ev.revision()), f.revision(i));
                assert_eq!(ev.unpack(), packed(ev.revision()).unpack());
            }
            if f.len() == cap {
                assert_eq!(f.revision(0), Some(next - cap as u64));
                assert_eq!(f.count_through(next - 11), cap - 10);
            }
        }
        assert!(compacted, "the dead head was never compacted");
        // The file holds the live events only, give or take the compaction threshold.
        let live: u64 = (0..f.len())
            .map(|i| f.get(i).unwrap().unwrap().as_bytes().len() as u64)
            .sum();
        assert!(
            f.file_bytes() <= 2 * live + COMPACT_MIN,
            "{}",
            f.file_bytes()
        );
        assert!(!path.with_extension("new").exists());
    }

    #[test]
    fn back_to_memory_keeps_the_written_and_the_pending_events() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = HistoryFile::create(&dir.path().join("history")).unwrap();
        for r in 1..=10 {
            f.push(&packed(r));
        }
        f.flush().unwrap();
        f.pop_front();
        for r in 11..=12 {
            f.push(&packed(r));
        }
        let back = f.into_memory();
        assert!(back.lost.is_empty());
        let revisions: Vec<u64> = back.events.iter().map(PackedEvent::revision).collect();
        assert_eq!(revisions, (2..=12).collect::<Vec<_>>());
        assert!(!dir.path().join("history").exists());
    }

    #[test]
    fn a_file_cut_under_it_loses_only_the_oldest_and_says_which() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history");
        let mut f = HistoryFile::create(&path).unwrap();
        for r in 1..=5 {
            f.push(&packed(r));
        }
        f.flush().unwrap();
        // Someone cut the file: no read of the written events succeeds.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(3)
            .unwrap();
        assert!(f.get(1).is_err());
        f.push(&packed(6));
        let back = f.into_memory();
        assert_eq!(back.lost, vec![1, 2, 3, 4, 5]);
        assert_eq!(back.events.len(), 1);
        assert_eq!(back.events[0].revision(), 6);
    }
}
