//! The list memo's table of fingerprints ([`crate::list_memo`]): open addressing with
//! linear probing, each entry placed by its *place* — a keyed hash of the list
//! entry's ID field, which a read meets first — rather than by the fingerprint, which
//! it knows only at the entry's end. So the read touches the slot's cache line when it
//! meets the ID ([`Slots::touch`]), and by the time it asks for the fingerprint the
//! line is on its way in. At 10,000 pods a relist streams ≈ 20 MB through the caches
//! between two lookups of one line: in a table placed by the fingerprint (hashbrown's)
//! nearly every lookup waited for memory, ≈ 13 % of a no-change relist's CPU.
//!
//! hashbrown cannot place a value by one hash and find it by another without storing
//! both and rehashing, nor say where a lookup will land before it is made: hence this
//! small table of its own. A fingerprint is never 0 (an empty slot).

/// The longest probe: a key further than this from its home slot is not stored, and
/// not looked for (only entries sharing one ID field can crowd one home: a runtime
/// listing one ID many times costs full reads, never a long probe).
const MAX_PROBE: usize = 128;

/// Fingerprints with their places; at most three quarters full (a lookup that finds
/// its key probes ≈ 2.5 slots, mostly in one cache line).
#[derive(Debug, Default)]
pub(crate) struct Slots {
    /// A fingerprint with the read's flags, or 0 (empty).
    values: Vec<u64>,
    /// Each slot's place (its entry's home: `place & mask`).
    places: Vec<u32>,
    len: usize,
}

impl Slots {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.values.capacity() * size_of::<u64>() + self.places.capacity() * size_of::<u32>()
    }

    #[inline(always)]
    fn home(&self, place: u32) -> usize {
        place as usize & (self.values.len() - 1)
    }

    /// Asks for the home slot of `place` in the cache, for a lookup soon after (a
    /// prefetch: the read goes on meanwhile; a plain load there made it wait, and
    /// saved a sixth of what this does). Does nothing but on x86-64.
    #[inline(always)]
    pub(crate) fn touch(&self, place: u32) {
        if self.values.is_empty() {
            return;
        }
        let slot: *const u64 = &self.values[self.home(place)];
        #[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
        // SAFETY: a prefetch is a hint: it reads nothing into the program, cannot
        // fault, and `slot` points into the table; the build has SSE, which
        // `_mm_prefetch` needs.
        #[allow(unsafe_code)]
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(slot.cast());
        }
        #[cfg(not(all(target_arch = "x86_64", target_feature = "sse")))]
        let _ = slot;
    }

    /// The slot that holds `key` (its value less the bits of `flags`) placed at
    /// `place`.
    #[inline(always)]
    pub(crate) fn find(&self, key: u64, place: u32, flags: u64) -> Option<usize> {
        if self.values.is_empty() {
            return None;
        }
        let mask = self.values.len() - 1;
        let mut i = self.home(place);
        for _ in 0..=MAX_PROBE {
            match self.values[i] {
                0 => return None,
                v if v & !flags == key => return Some(i),
                _ => i = (i + 1) & mask,
            }
        }
        None
    }

    /// The value of slot `i` (from [`Slots::find`]), to change its flags.
    #[inline(always)]
    pub(crate) fn value_mut(&mut self, i: usize) -> &mut u64 {
        &mut self.values[i]
    }

    /// Stores `value` (a fingerprint with flags, not 0) at `place`; false if its home
    /// is crowded past [`MAX_PROBE`] (it is then not stored).
    pub(crate) fn insert(&mut self, value: u64, place: u32, min_room: usize) -> bool {
        if 4 * (self.len + 1) > 3 * self.values.len() {
            self.resize((2 * (self.len + 1)).max(min_room).next_power_of_two());
        }
        let mask = self.values.len() - 1;
        let mut i = self.home(place);
        for _ in 0..=MAX_PROBE {
            if self.values[i] == 0 {
                self.values[i] = value;
                self.places[i] = place;
                self.len += 1;
                return true;
            }
            i = (i + 1) & mask;
        }
        false
    }

    /// Keeps the slots `keep` says to keep (it may change their value, and sees each
    /// slot once).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&mut u64) -> bool) {
        let n = self.values.len();
        // From just after an empty slot (there is one: the table is at most three
        // quarters full), so that a slot moved back by a removal comes from further on in
        // the pass, never from a slot already seen.
        let Some(start) = self.values.iter().position(|&v| v == 0) else {
            return;
        };
        for step in 1..=n {
            let i = (start + step) & (n - 1);
            while self.values[i] != 0 && !keep(&mut self.values[i]) {
                self.remove(i);
            }
        }
    }

    /// Empties slot `i`, moving back the slots after it that their homes allow
    /// (backward-shift deletion: no slot ends further from its home than before).
    fn remove(&mut self, mut i: usize) {
        let mask = self.values.len() - 1;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            if self.values[j] == 0 {
                break;
            }
            let home = self.home(self.places[j]);
            // Whether `home` lies cyclically in (i, j]: then the slot at j must stay.
            let stays = if i <= j {
                i < home && home <= j
            } else {
                i < home || home <= j
            };
            if !stays {
                self.values[i] = self.values[j];
                self.places[i] = self.places[j];
                i = j;
            }
        }
        self.values[i] = 0;
        self.len -= 1;
    }

    /// Gives back room beyond four times what it holds (and `min_room` slots).
    pub(crate) fn shrink(&mut self, min_room: usize) {
        let fit = (2 * self.len).max(min_room).next_power_of_two();
        if self.values.len() > 2 * fit {
            self.resize(fit);
        }
    }

    fn resize(&mut self, slots: usize) {
        let old_values = std::mem::take(&mut self.values);
        let old_places = std::mem::take(&mut self.places);
        self.values = vec![0; slots];
        self.places = vec![0; slots];
        self.len = 0;
        // From just after an empty slot (as `retain`): each run of full slots goes in
        // in its own order, so a grow puts no value further from its home than before
        // (from slot 0, a run that wraps past the end would go in tail first).
        let n = old_values.len();
        let start = old_values.iter().position(|&v| v == 0).unwrap_or(0);
        for step in 1..=n {
            let i = (start + step) & (n - 1);
            if old_values[i] != 0 {
                // Only a shrink can crowd a home past MAX_PROBE: such a value is
                // dropped (the entry is read fully next time).
                self.insert(old_values[i], old_places[i], 0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAG: u64 = 1 << 63;

    #[test]
    fn values_are_found_at_their_place_and_only_there() {
        let mut s = Slots::default();
        for k in 1..=1000u64 {
            assert!(s.insert(k, (k * 7919) as u32, 16));
        }
        assert_eq!(s.len(), 1000);
        assert!(s.values.len() >= 2000);
        for k in 1..=1000u64 {
            assert_eq!(
                s.find(k, (k * 7919) as u32, FLAG).map(|i| s.values[i]),
                Some(k)
            );
        }
        assert!(s.find(5000, 1, FLAG).is_none());
    }

    #[test]
    fn a_flag_does_not_hide_a_value() {
        let mut s = Slots::default();
        s.insert(42 | FLAG, 3, 16);
        assert!(s.find(42, 3, FLAG).is_some());
        assert!(s.find(42, 3, 0).is_none(), "without the flag bit cleared");
    }

    #[test]
    fn a_crowded_home_refuses_past_the_longest_probe_and_stays_short() {
        let mut s = Slots::default();
        let stored = (1..=200u64).filter(|&k| s.insert(k, 9, 1024)).count();
        assert_eq!(stored, MAX_PROBE + 1);
        for k in 1..=200u64 {
            assert_eq!(s.find(k, 9, 0).is_some(), k as usize <= MAX_PROBE + 1);
        }
    }

    /// A run of full slots that wraps past the table's end, its first values homed at
    /// the end: a grow keeps every one of them within reach of its home.
    #[test]
    fn a_grow_keeps_a_run_that_wraps_past_the_end() {
        let mut s = Slots::default();
        assert!(s.insert(1, 510, 512) && s.insert(2, 510, 512));
        for k in 3..=130 {
            assert!(s.insert(k, 511, 512), "{k}");
        }
        for k in 0..254 {
            assert!(s.insert(1000 + k, 200 + k as u32, 512));
        }
        assert_eq!(s.values.len(), 512);
        assert!(s.insert(5000, 460, 512));
        assert_eq!(s.values.len(), 1024, "grown");
        assert_eq!(s.len(), 385);
        for (k, p) in [
            (1, 510),
            (2, 510),
            (3, 511),
            (130, 511),
            (1000, 200),
            (5000, 460),
        ] {
            assert!(s.find(k, p, 0).is_some(), "{k} lost by the grow");
        }
    }

    /// Removing any set of values (in one pass, across the table's wrap) leaves every
    /// other one findable, against a plain set.
    #[test]
    fn retain_keeps_every_value_findable() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for round in 0..200 {
            let mut s = Slots::default();
            let mut model = std::collections::HashMap::new();
            let n = 1 + next() as usize % 300;
            // Few distinct places (clusters that wrap), or many.
            let spread = if round % 2 == 0 { 16 } else { u32::MAX };
            for _ in 0..n {
                let key = (next() >> 2) | 1;
                let place = next() as u32 % spread;
                if s.insert(key, place, 16) {
                    model.insert(key, place);
                }
            }
            let gone = |k: u64| k.is_multiple_of(3);
            s.retain(|v| !gone(*v));
            model.retain(|&k, _| !gone(k));
            assert_eq!(s.len(), model.len(), "round {round}");
            for (&k, &p) in &model {
                assert!(s.find(k, p, 0).is_some(), "round {round}: {k} lost");
            }
            let kept = s.values.iter().filter(|&&v| v != 0).count();
            assert_eq!(kept, model.len());
            s.shrink(16);
            // A shrink may drop a value its crowded home no longer has room for;
            // never where homes are spread.
            let found = model
                .iter()
                .filter(|&(&k, &p)| s.find(k, p, 0).is_some())
                .count();
            assert_eq!(found, s.len(), "round {round}");
            if spread == u32::MAX {
                assert_eq!(found, model.len(), "round {round}: lost by the shrink");
            }
        }
    }
}
