//! [`PackedRing`]: the in-memory history's packed events, oldest first, one after
//! another in a few large blocks rather than each in a block of its own.
//!
//! A block per event scattered the history over the heap: the events published last
//! in a burst of short-lived pods outlive it, each among the burst's freed memory, and
//! glibc can give back only whole free pages (`plegd/src/malloc.rs`). With 1,024
//! events of history, those ≈ 160 KB kept ≈ 0.5 MB more of plegd's RSS after a churn
//! of 20,000 pods on the realistic node than 64 events did. In chunks, the history's
//! pages are its own and full, and a chunk whose events are all evicted goes back
//! whole.

use std::collections::VecDeque;

/// The smallest and largest chunk. A chunk is sized for about a tenth of a full
/// history (at ≈ 160 bytes an event), so the one being filled and the one being
/// evicted waste at most about a fifth of it; at most 64 KiB, below glibc's mmap
/// threshold (128 KiB), so a chunk is not a mapping of its own each.
const MIN_CHUNK: usize = 4 << 10;
const MAX_CHUNK: usize = 64 << 10;

/// Where an event is: its chunk's sequence number (counted from the first chunk ever
/// made), its offset and length in it.
#[derive(Clone, Copy)]
struct Place {
    chunk: u64,
    offset: u32,
    len: u32,
}

/// Packed events (bytes as `PackedEvent` makes them, revision first), oldest first.
pub(crate) struct PackedRing {
    /// Chunks, oldest first; each holds whole events, never grows past its capacity.
    chunks: VecDeque<Vec<u8>>,
    /// The sequence number of `chunks[0]`.
    first_chunk: u64,
    /// Each event's place, oldest first.
    places: VecDeque<Place>,
    chunk_size: usize,
}

impl PackedRing {
    /// A ring for a history of up to `events` events.
    pub(crate) fn new(events: usize) -> Self {
        PackedRing {
            chunks: VecDeque::new(),
            first_chunk: 0,
            places: VecDeque::new(),
            chunk_size: events.saturating_mul(16).clamp(MIN_CHUNK, MAX_CHUNK),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.places.len()
    }

    /// Appends an event's bytes.
    pub(crate) fn push_back(&mut self, bytes: &[u8]) {
        let Ok(len) = u32::try_from(bytes.len()) else {
            return;
        };
        let fits = self
            .chunks
            .back()
            .is_some_and(|c| c.capacity() - c.len() >= bytes.len());
        if !fits {
            self.chunks
                .push_back(Vec::with_capacity(self.chunk_size.max(bytes.len())));
        }
        let chunk = self.first_chunk + self.chunks.len() as u64 - 1;
        let Some(back) = self.chunks.back_mut() else {
            return;
        };
        let Ok(offset) = u32::try_from(back.len()) else {
            return;
        };
        back.extend_from_slice(bytes);
        self.places.push_back(Place { chunk, offset, len });
    }

    /// Drops the oldest event; returns its length. A chunk left without events goes.
    pub(crate) fn pop_front(&mut self) -> Option<usize> {
        let gone = self.places.pop_front()?;
        let keep_from = self.places.front().map_or(u64::MAX, |p| p.chunk);
        while self.first_chunk < keep_from && !self.chunks.is_empty() {
            self.chunks.pop_front();
            self.first_chunk += 1;
        }
        if self.chunks.is_empty() {
            // The next chunk is numbered after the last one made.
            self.first_chunk = self.first_chunk.max(gone.chunk + 1);
        }
        Some(gone.len as usize)
    }

    /// The bytes of the event at `i` (0: the oldest).
    pub(crate) fn get(&self, i: usize) -> Option<&[u8]> {
        let p = self.places.get(i)?;
        let chunk = self
            .chunks
            .get(usize::try_from(p.chunk.checked_sub(self.first_chunk)?).ok()?)?;
        chunk.get(p.offset as usize..p.offset as usize + p.len as usize)
    }

    /// Every event's bytes, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The index of the first event for which `pred` is false (`pred` true for a
    /// prefix), as `VecDeque::partition_point`.
    pub(crate) fn partition_point(&self, mut pred: impl FnMut(&[u8]) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.get(mid).is_some_and(&mut pred) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Heap bytes the events' places take (and the list of chunks).
    pub(crate) fn places_bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<Vec<u8>>()
            + self.places.capacity() * std::mem::size_of::<Place>()
    }

    /// Chunks held.
    #[cfg(test)]
    pub(crate) fn chunks(&self) -> usize {
        self.chunks.len()
    }

    /// Heap bytes the ring takes: its chunks whole, and the places.
    #[cfg(test)]
    fn heap_bytes(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum::<usize>() + self.places_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(i: u32, len: usize) -> Vec<u8> {
        let mut b = u64::from(i).to_le_bytes().to_vec();
        b.resize(len, i as u8);
        b
    }

    #[test]
    fn events_come_back_in_order_across_chunks_and_evictions() {
        let mut ring = PackedRing::new(100);
        let mut held = VecDeque::new();
        for i in 0..5000u32 {
            let e = event(i, 20 + (i as usize * 7) % 300);
            ring.push_back(&e);
            held.push_back(e);
            if held.len() > 100 {
                let len = ring.pop_front();
                assert_eq!(len, held.pop_front().map(|e| e.len()));
            }
            assert_eq!(ring.len(), held.len());
        }
        assert!(ring.iter().eq(held.iter().map(Vec::as_slice)));
        let revision = |b: &[u8]| u64::from_le_bytes(b[..8].try_into().unwrap());
        assert_eq!(ring.partition_point(|b| revision(b) <= 4949), 50);
        // Emptied, it starts again.
        while ring.pop_front().is_some() {}
        assert_eq!((ring.len(), ring.chunks.len()), (0, 0));
        ring.push_back(&event(7, 9000));
        assert_eq!(ring.get(0), Some(&event(7, 9000)[..]));
    }

    /// The history's events, each in a block of its own, outlived a churn scattered
    /// among its freed memory (see the module docs): in chunks, 1,024 events of
    /// ≈ 160 bytes take a handful of blocks, and evicted chunks go.
    #[test]
    fn a_full_history_takes_a_few_chunks() {
        let mut ring = PackedRing::new(1024);
        for i in 0..20_000u32 {
            ring.push_back(&event(i, 160));
            if ring.len() > 1024 {
                ring.pop_front();
            }
        }
        assert!(ring.chunks.len() <= 12, "{} chunks", ring.chunks.len());
        assert!(
            ring.heap_bytes() < 1024 * 160 * 3 / 2,
            "{}",
            ring.heap_bytes()
        );
    }
}
