//! [`IdMap`]: the few sandboxes or containers of one pod by ID, in a vector.

/// A map from IDs, sorted by ID: the few sandboxes or containers of one pod, with
/// the parts of `BTreeMap`'s API plegd uses. A vector of exactly as many entries
/// as the pod has: a `BTreeMap` allocates a node for 11 entries even for one (≈ 300
/// bytes for a pod's sandbox, ≈ 640 for its containers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdMap<V>(Vec<(String, V)>);

type Entry<'a, V> = fn(&'a (String, V)) -> (&'a String, &'a V);

impl<V> IdMap<V> {
    pub fn new() -> Self {
        IdMap(Vec::new())
    }

    fn find(&self, id: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(id))
    }

    pub fn get(&self, id: &str) -> Option<&V> {
        self.find(id).ok().map(|i| &self.0[i].1)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut V> {
        self.find(id).ok().map(|i| &mut self.0[i].1)
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.find(id).is_ok()
    }

    /// Inserts or replaces; returns the value replaced. Grows by one entry at a time
    /// (a pod has a few): no spare capacity is kept.
    pub fn insert(&mut self, id: String, value: V) -> Option<V> {
        match self.find(&id) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.reserve_exact(1);
                self.0.insert(i, (id, value));
                None
            }
        }
    }

    pub fn remove(&mut self, id: &str) -> Option<V> {
        let i = self.find(id).ok()?;
        Some(self.0.remove(i).1)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Entries by ID.
    pub fn iter(&self) -> std::iter::Map<std::slice::Iter<'_, (String, V)>, Entry<'_, V>> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// IDs, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(k, _)| k)
    }

    /// Values, by ID.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }
}

impl<'a, V> IntoIterator for &'a IdMap<V> {
    type Item = (&'a String, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (String, V)>, Entry<'a, V>>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<V> FromIterator<(String, V)> for IdMap<V> {
    /// As `BTreeMap`: a later entry with the same ID replaces an earlier one.
    fn from_iter<I: IntoIterator<Item = (String, V)>>(entries: I) -> Self {
        let mut map = IdMap::new();
        for (id, v) in entries {
            map.insert(id, v);
        }
        map
    }
}

impl<V, const N: usize> From<[(String, V); N]> for IdMap<V> {
    fn from(entries: [(String, V); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl<V> IntoIterator for IdMap<V> {
    type Item = (String, V);
    type IntoIter = std::vec::IntoIter<(String, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_map_behaves_as_a_btree_map_of_the_same_entries() {
        use std::collections::BTreeMap;
        // A fixed pseudo-random sequence of inserts and removes over a few IDs.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut map = IdMap::new();
        let mut model = BTreeMap::new();
        for step in 0..2000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = format!("id{}", x % 7);
            if x.is_multiple_of(3) {
                assert_eq!(map.remove(&id), model.remove(&id));
            } else {
                assert_eq!(map.insert(id.clone(), step), model.insert(id, step));
            }
            assert_eq!(map.len(), model.len());
            assert_eq!(map.is_empty(), model.is_empty());
            assert!(map.iter().eq(model.iter()));
            assert!(map.keys().eq(model.keys()));
            assert!(map.values().eq(model.values()));
            for probe in ["id0", "id3", "id6", "nope"] {
                assert_eq!(map.get(probe), model.get(probe));
                assert_eq!(map.contains_key(probe), model.contains_key(probe));
            }
        }
        let from: IdMap<u8> = IdMap::from([("b".into(), 1), ("a".into(), 2), ("b".into(), 3)]);
        assert!(from.iter().eq(BTreeMap::from([
            ("b".to_string(), 1),
            ("a".into(), 2),
            ("b".into(), 3)
        ])
        .iter()));
        // No spare room is kept.
        assert_eq!(from.0.capacity(), 2);
    }
}
