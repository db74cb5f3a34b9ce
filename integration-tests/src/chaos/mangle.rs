//! The chaos run's event filter for the fake runtime: drops, duplicates, delays,
//! strips the UID from or ages each emitted event, as the current [`Mangle`] says.
//! Each decision comes from the seed and the event's number (events are emitted only
//! by the executor's steps, in schedule order), so a seed mangles the same events the
//! same way on every run.

use std::sync::{Arc, Mutex, MutexGuard};

use plegd_runtime::cri;
use plegd_sim::EventFilter;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::schedule::Mangle;

#[derive(Default)]
struct State {
    seed: u64,
    mode: Mangle,
    /// The runtime is down or the exit is silent: every event is lost.
    suppress: bool,
    /// Events emitted so far (the decisions' input).
    count: u64,
    /// Held back, in emission order.
    delayed: Vec<cri::ContainerEventResponse>,
}

/// Shared between the executor (which sets the mode) and the fake runtime (which
/// calls the filter). Cheap to clone.
#[derive(Clone, Default)]
pub struct Mangler(Arc<Mutex<State>>);

impl Mangler {
    pub fn new(seed: u64) -> Self {
        Mangler(Arc::new(Mutex::new(State {
            seed,
            ..State::default()
        })))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_mode(&self, mode: Mangle) {
        self.lock().mode = mode;
    }

    pub fn set_suppress(&self, on: bool) {
        self.lock().suppress = on;
    }

    /// The held-back events, oldest first; none are held afterwards.
    pub fn take_delayed(&self) -> Vec<cri::ContainerEventResponse> {
        std::mem::take(&mut self.lock().delayed)
    }

    /// The filter to install in the fake runtime.
    pub fn filter(&self) -> EventFilter {
        let me = self.clone();
        Arc::new(move |ev| me.apply(ev))
    }

    fn apply(&self, mut ev: cri::ContainerEventResponse) -> Vec<cri::ContainerEventResponse> {
        let mut st = self.lock();
        st.count += 1;
        if st.suppress {
            return vec![];
        }
        let m = st.mode;
        if m == Mangle::default() {
            return vec![ev];
        }
        let mut rng =
            ChaCha8Rng::seed_from_u64(st.seed ^ st.count.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut roll = |p: u8| rng.random_range(0..100u8) < p;
        if roll(m.drop) {
            return vec![];
        }
        if roll(m.strip_uid) {
            if let Some(meta) = ev
                .pod_sandbox_status
                .as_mut()
                .and_then(|s| s.metadata.as_mut())
            {
                meta.uid.clear();
            }
        }
        if roll(m.stale) {
            // An hour old: buffered by a runtime, or replayed.
            ev.created_at = ev.created_at.saturating_sub(3_600_000_000_000);
        }
        let copies = if roll(m.duplicate) { 2 } else { 1 };
        if roll(m.delay) {
            for _ in 0..copies {
                st.delayed.push(ev.clone());
            }
            return vec![];
        }
        vec![ev; copies]
    }
}
