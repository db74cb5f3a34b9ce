//! [`IdMap`]: the few sandboxes or containers of one pod by ID, in a vector; and
//! [`Id`], such an ID packed.

use std::cmp::Ordering;
use std::fmt;

use crate::packed::{hex_32, spell_hex};

/// A sandbox or container ID as plegd keeps it for a long time (in every pod
/// record): a runtime's ID of 64 lowercase hex digits (containerd's, CRI-O's) as the
/// 32 bytes it spells, inline; any other ID as its string. 40 bytes and no heap
/// block for a 64-hex ID, against 24 and a block of 64 for a `String`.
///
/// Ordered, compared and printed as the string it stands for.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Id {
    Hex([u8; 32]),
    /// Never 64 lowercase hex digits (those are `Hex`), so equal IDs are equal values.
    Text(Box<str>),
}

impl Id {
    pub fn new(id: &str) -> Self {
        match hex_32(id) {
            Some(bytes) => Id::Hex(bytes),
            None => Id::Text(id.into()),
        }
    }

    /// Runs `f` on the string this ID stands for (spelled on the stack).
    pub fn with_str<T>(&self, f: impl FnOnce(&str) -> T) -> T {
        match self {
            Id::Hex(bytes) => {
                let mut buf = [0u8; 64];
                spell_hex(bytes, &mut buf);
                // Hex digits are ASCII.
                f(std::str::from_utf8(&buf).unwrap_or_default())
            }
            Id::Text(s) => f(s),
        }
    }

    /// Whether this ID stands for `id`.
    pub fn is(&self, id: &str) -> bool {
        self.cmp_str(id) == Ordering::Equal
    }

    /// This ID's order against the string `id` (the order of their strings).
    pub fn cmp_str(&self, id: &str) -> Ordering {
        match self {
            Id::Text(s) => (**s).cmp(id),
            Id::Hex(bytes) => match hex_32(id) {
                Some(other) => bytes.cmp(&other),
                None => self.with_str(|s| s.cmp(id)),
            },
        }
    }
}

/// An ID to look up, packed as [`Id`] packs it but borrowing the string of any other
/// shape (no allocation): what the global relist makes of each listed ID, once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdKey<'a> {
    Hex([u8; 32]),
    Text(&'a str),
}

impl<'a> IdKey<'a> {
    pub fn of(id: &'a str) -> Self {
        match hex_32(id) {
            Some(bytes) => IdKey::Hex(bytes),
            None => IdKey::Text(id),
        }
    }
}

impl Id {
    /// This ID's order against a key (the order of their strings).
    pub fn cmp_key(&self, key: &IdKey<'_>) -> Ordering {
        match (self, key) {
            (Id::Hex(a), IdKey::Hex(b)) => a.cmp(b),
            (Id::Text(a), IdKey::Text(b)) => (**a).cmp(b),
            (Id::Hex(_), IdKey::Text(b)) => self.cmp_str(b),
            (Id::Text(a), IdKey::Hex(b)) => Id::Hex(*b).cmp_str(a).reverse(),
        }
    }

    /// Whether this ID is the key's (canonical packing: no compare of strings).
    pub fn is_key(&self, key: &IdKey<'_>) -> bool {
        match (self, key) {
            (Id::Hex(a), IdKey::Hex(b)) => a == b,
            (Id::Text(a), IdKey::Text(b)) => **a == **b,
            _ => false,
        }
    }
}

impl From<&str> for Id {
    fn from(id: &str) -> Self {
        Id::new(id)
    }
}

impl From<String> for Id {
    fn from(id: String) -> Self {
        match hex_32(&id) {
            Some(bytes) => Id::Hex(bytes),
            None => Id::Text(id.into_boxed_str()),
        }
    }
}

impl From<&String> for Id {
    fn from(id: &String) -> Self {
        Id::new(id)
    }
}

impl Ord for Id {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            // Lowercase hex digits sort as the nibbles they spell.
            (Id::Hex(a), Id::Hex(b)) => a.cmp(b),
            (_, Id::Text(b)) => self.cmp_str(b),
            (Id::Text(_), Id::Hex(_)) => other.with_str(|b| self.cmp_str(b)),
        }
    }
}

impl PartialOrd for Id {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq<str> for Id {
    fn eq(&self, other: &str) -> bool {
        self.is(other)
    }
}

impl PartialEq<String> for Id {
    fn eq(&self, other: &String) -> bool {
        self.is(other)
    }
}

impl PartialEq<Id> for String {
    fn eq(&self, other: &Id) -> bool {
        other.is(self)
    }
}

impl PartialEq<&str> for Id {
    fn eq(&self, other: &&str) -> bool {
        self.is(other)
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_str(|s| f.write_str(s))
    }
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_str(|s| fmt::Debug::fmt(s, f))
    }
}

/// A map from IDs, sorted by ID: the few sandboxes or containers of one pod, with
/// the parts of `BTreeMap`'s API plegd uses. A vector of exactly as many entries
/// as the pod has: a `BTreeMap` allocates a node for 11 entries even for one (≈ 300
/// bytes for a pod's sandbox, ≈ 640 for its containers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdMap<V>(Vec<(Id, V)>);

type Entry<'a, V> = fn(&'a (Id, V)) -> (&'a Id, &'a V);

impl<V> IdMap<V> {
    pub fn new() -> Self {
        IdMap(Vec::new())
    }

    fn find(&self, id: &str) -> Result<usize, usize> {
        self.find_key(&IdKey::of(id))
    }

    fn find_key(&self, key: &IdKey<'_>) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.cmp_key(key))
    }

    fn find_id(&self, id: &Id) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.cmp(id))
    }

    pub fn get(&self, id: &str) -> Option<&V> {
        self.find(id).ok().map(|i| &self.0[i].1)
    }

    /// [`get`](Self::get) by a key already packed.
    pub fn get_key(&self, key: &IdKey<'_>) -> Option<&V> {
        self.find_key(key).ok().map(|i| &self.0[i].1)
    }

    /// [`get`](Self::get) by an ID already packed.
    pub fn get_id(&self, id: &Id) -> Option<&V> {
        self.find_id(id).ok().map(|i| &self.0[i].1)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut V> {
        self.find(id).ok().map(|i| &mut self.0[i].1)
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.find(id).is_ok()
    }

    /// Inserts or replaces; returns the value replaced. Grows by one entry at a time
    /// (a pod has a few): no spare capacity is kept.
    pub fn insert(&mut self, id: impl Into<Id>, value: V) -> Option<V> {
        let id = id.into();
        match self.find_id(&id) {
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
    pub fn iter(&self) -> std::iter::Map<std::slice::Iter<'_, (Id, V)>, Entry<'_, V>> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// IDs, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &Id> {
        self.0.iter().map(|(k, _)| k)
    }

    /// Values, by ID.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }
}

impl<'a, V> IntoIterator for &'a IdMap<V> {
    type Item = (&'a Id, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (Id, V)>, Entry<'a, V>>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<K: Into<Id>, V> FromIterator<(K, V)> for IdMap<V> {
    /// As `BTreeMap`: a later entry with the same ID replaces an earlier one.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> Self {
        let mut map = IdMap::new();
        for (id, v) in entries {
            map.insert(id, v);
        }
        map
    }
}

impl<K: Into<Id>, V, const N: usize> From<[(K, V); N]> for IdMap<V> {
    fn from(entries: [(K, V); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl<V> IntoIterator for IdMap<V> {
    type Item = (Id, V);
    type IntoIter = std::vec::IntoIter<(Id, V)>;

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
            assert!(map
                .iter()
                .map(|(k, v)| (k.to_string(), v))
                .eq(model.iter().map(|(k, v)| (k.clone(), v))));
            assert!(map.keys().eq(model.keys()));
            assert!(map.values().eq(model.values()));
            for probe in ["id0", "id3", "id6", "nope"] {
                assert_eq!(map.get(probe), model.get(probe));
                assert_eq!(map.contains_key(probe), model.contains_key(probe));
            }
        }
        let from: IdMap<u8> = IdMap::from([("b", 1), ("a", 2), ("b", 3)]);
        assert!(from
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .eq(
                BTreeMap::from([("b".to_string(), 1), ("a".into(), 2), ("b".into(), 3)])
                    .into_iter()
            ));
        // No spare room is kept.
        assert_eq!(from.0.capacity(), 2);
    }

    /// IDs of every shape: 64 lowercase hex digits (packed), near misses of it (one
    /// digit uppercase or off the alphabet, 63 or 65 digits), and short ones.
    fn ids(x: &mut u64) -> String {
        let mut next = || {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            *x
        };
        // Few distinct prefixes, so that IDs share long heads and tie often.
        let hex: String = (0..64)
            .map(|i| {
                let d = if i < 60 { next() % 2 } else { next() % 16 };
                char::from(b"0123456789abcdef"[d as usize])
            })
            .collect();
        match next() % 6 {
            0 | 1 => hex,
            2 => hex.to_uppercase(),
            3 => hex[..63].to_string(),
            4 => format!("{hex}0"),
            _ => format!("{}g{}", &hex[..31], &hex[32..]),
        }
    }

    #[test]
    fn an_id_is_ordered_compared_and_printed_as_its_string() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let all: Vec<String> = (0..400).map(|_| ids(&mut x)).collect();
        for a in &all {
            let id = Id::new(a);
            assert_eq!(id.to_string(), *a);
            assert_eq!(
                matches!(id, Id::Hex(_)),
                a.len() == 64 && *a == a.to_lowercase() && !a.contains('g')
            );
            for b in all.iter().take(60) {
                let other = Id::new(b);
                assert_eq!(id.cmp(&other), a.cmp(b), "{a} vs {b}");
                assert_eq!(id.cmp_str(b), a.cmp(b), "{a} vs {b}");
                assert_eq!(id == other, a == b);
                assert_eq!(id.is(b), a == b);
            }
        }
        // A packed ID takes no heap block and fits in 40 bytes.
        assert_eq!(std::mem::size_of::<Id>(), 40);
    }

    #[test]
    fn an_id_map_of_runtime_ids_behaves_as_a_btree_map_of_their_strings() {
        use std::collections::BTreeMap;
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let pool: Vec<String> = (0..9).map(|_| ids(&mut x)).collect();
        let mut map = IdMap::new();
        let mut model = BTreeMap::new();
        for step in 0..3000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = &pool[(x % 9) as usize];
            if x.is_multiple_of(3) {
                assert_eq!(map.remove(id), model.remove(id));
            } else {
                assert_eq!(
                    map.insert(id.as_str(), step),
                    model.insert(id.clone(), step)
                );
            }
            assert!(map
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .eq(model.iter().map(|(k, v)| (k.clone(), *v))));
            for probe in &pool {
                assert_eq!(map.get(probe), model.get(probe));
                assert_eq!(map.get_id(&Id::new(probe)), model.get(probe));
            }
        }
    }
}
