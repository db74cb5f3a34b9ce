//! Giving back a table's room. After a burst of short-lived pods, hash tables and
//! queues keep the room they grew to unless told (the memory a churn leaves behind);
//! every long-lived table does the same check after it forgets entries.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hash};

use dashmap::DashMap;

/// A table is shrunk once it has room for more than this many times its entries.
/// Three, not more: a churn with the same live pods all along doubles a hash table
/// once (removes and inserts at over half its capacity leave it no free slot; it then
/// grows rather than rehash in place), to 3.5 times its pods at 1,000 of them. Not
/// two either: a table with up to twice its entries' room is what inserting them
/// leaves, and shrinking it would only make it grow again at the next entries.
pub(crate) const SHRINK_RATIO: usize = 3;

/// Whether a table with `capacity` room for `len` entries should give room back:
/// above [`SHRINK_RATIO`] times its entries, counted as at least `min_room` (so a
/// small table is left alone).
pub(crate) fn too_roomy(capacity: usize, len: usize, min_room: usize) -> bool {
    capacity > SHRINK_RATIO * len.max(min_room)
}

/// Shrinks `table` to fit if it is [`too_roomy`]; true if it did.
pub(crate) fn give_back_room(table: &mut impl Roomy, min_room: usize) -> bool {
    let roomy = too_roomy(table.capacity(), table.len(), min_room);
    if roomy {
        table.shrink_to_fit();
    }
    roomy
}

/// A table whose room [`give_back_room`] can give back.
pub(crate) trait Roomy {
    fn capacity(&self) -> usize;
    fn len(&self) -> usize;
    fn shrink_to_fit(&mut self);
}

impl<K: Hash + Eq, V, S: BuildHasher> Roomy for HashMap<K, V, S> {
    fn capacity(&self) -> usize {
        HashMap::capacity(self)
    }
    fn len(&self) -> usize {
        HashMap::len(self)
    }
    fn shrink_to_fit(&mut self) {
        HashMap::shrink_to_fit(self)
    }
}

impl<T: Hash + Eq, S: BuildHasher> Roomy for HashSet<T, S> {
    fn capacity(&self) -> usize {
        HashSet::capacity(self)
    }
    fn len(&self) -> usize {
        HashSet::len(self)
    }
    fn shrink_to_fit(&mut self) {
        HashSet::shrink_to_fit(self)
    }
}

impl<T> Roomy for VecDeque<T> {
    fn capacity(&self) -> usize {
        VecDeque::capacity(self)
    }
    fn len(&self) -> usize {
        VecDeque::len(self)
    }
    fn shrink_to_fit(&mut self) {
        VecDeque::shrink_to_fit(self)
    }
}

/// A shared table: it shrinks behind its own locks, so a shared reference will do.
impl<K: Hash + Eq, V, S: BuildHasher + Clone> Roomy for &DashMap<K, V, S> {
    fn capacity(&self) -> usize {
        DashMap::capacity(self)
    }
    fn len(&self) -> usize {
        DashMap::len(self)
    }
    fn shrink_to_fit(&mut self) {
        DashMap::shrink_to_fit(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_gives_back_room_only_above_three_times_its_entries() {
        assert!(!too_roomy(300, 100, 64));
        assert!(too_roomy(301, 100, 64));
        // A small table counts as `min_room` entries.
        assert!(!too_roomy(192, 0, 64));
        assert!(too_roomy(193, 0, 64));
    }

    #[test]
    fn give_back_room_shrinks_a_table_a_burst_left_large() {
        let mut map: HashMap<u32, u32> = (0..10_000).map(|i| (i, i)).collect();
        map.retain(|k, _| *k < 10);
        assert!(give_back_room(&mut map, 64));
        assert!(map.capacity() <= SHRINK_RATIO * 64, "{}", map.capacity());
        assert_eq!(map.len(), 10);
        assert!(!give_back_room(&mut map, 64));

        let shared: DashMap<u32, u32> = (0..10_000).map(|i| (i, i)).collect();
        shared.retain(|k, _| *k < 10);
        assert!(give_back_room(&mut &shared, 64));
        assert_eq!(shared.len(), 10);
    }
}
