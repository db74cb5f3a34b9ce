//! Traces a container or sandbox ID the cache does not know to its pod: a container
//! born since the last global relist (containerd's task events name only the ID).
//! Filtered calls only — ListContainers by the ID, then, when the cache does not
//! know its sandbox either, ListPodSandbox by the sandbox ID (an ID no container has
//! is tried as a sandbox's) — never a whole-node list; at most [`RATE`] a second
//! (beyond it the ID waits for the next global relist, counted `limited`). An answer
//! is remembered for [`REMEMBER`], so a change's rechecks ask the runtime once; an
//! ID in no pod asks for nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use plegd_runtime::RuntimeClient;
use plegd_telemetry::{Metrics, ResolveResult};

use crate::cache::PodCache;

/// Resolutions a second, and the burst allowed at once.
pub const RATE: u32 = 20;
/// How long an answer (a pod, or none) is remembered.
pub const REMEMBER: Duration = Duration::from_secs(10);
/// The most answers remembered.
const MAX_REMEMBERED: usize = 1024;

/// Where an ID belongs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: String,
    /// The ID is a container's (not a sandbox's).
    pub container: bool,
}

/// What a caller may do with an ID now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Known (or remembered): its pod, or None when it is in no pod.
    Known(Option<Owner>),
    /// Ask the runtime: [`Resolver::resolve`] (which remembers the answer).
    Ask,
    /// Being asked already, or over the rate: nothing now.
    Wait,
}

/// Shared by every hint watcher (cheap to clone).
#[derive(Clone)]
pub struct Resolver {
    runtime: Arc<dyn RuntimeClient>,
    metrics: Arc<Metrics>,
    state: Arc<Mutex<State>>,
}

struct State {
    tokens: f64,
    refilled: Instant,
    /// Answers, and when given.
    answers: HashMap<String, (Option<Owner>, Instant)>,
    /// IDs being asked.
    asking: Vec<String>,
}

impl Resolver {
    pub fn new(runtime: Arc<dyn RuntimeClient>, metrics: Arc<Metrics>) -> Self {
        Resolver {
            runtime,
            metrics,
            state: Arc::new(Mutex::new(State {
                tokens: f64::from(RATE),
                refilled: Instant::now(),
                answers: HashMap::new(),
                asking: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What to do about `id` now: the cache's answer, a remembered one, or ask.
    pub fn lookup(&self, cache: &PodCache, id: &str, now: Instant) -> Lookup {
        if let Some((uid, state)) = cache.owner_of(id) {
            return Lookup::Known(Some(Owner {
                uid,
                container: state.is_some(),
            }));
        }
        let mut st = self.lock();
        if let Some((owner, at)) = st.answers.get(id) {
            if now.saturating_duration_since(*at) < REMEMBER {
                return Lookup::Known(owner.clone());
            }
        }
        if st.asking.iter().any(|a| a == id) {
            return Lookup::Wait;
        }
        let elapsed = now.saturating_duration_since(st.refilled).as_secs_f64();
        st.tokens = (st.tokens + elapsed * f64::from(RATE)).min(f64::from(RATE));
        st.refilled = now;
        if st.tokens < 1.0 {
            drop(st);
            self.metrics.count_resolution(ResolveResult::Limited);
            return Lookup::Wait;
        }
        st.tokens -= 1.0;
        st.asking.push(id.to_string());
        Lookup::Ask
    }

    /// Asks the runtime where `id` belongs (after [`Lookup::Ask`]); the answer is
    /// remembered. A failed call is not: the next hint may ask again.
    pub async fn resolve(&self, cache: &PodCache, id: &str) -> Option<Owner> {
        let answer = find(self.runtime.as_ref(), cache, id).await;
        let now = Instant::now();
        let mut st = self.lock();
        st.asking.retain(|a| a != id);
        let result = match &answer {
            Ok(Some(_)) => ResolveResult::Found,
            Ok(None) => ResolveResult::NoPod,
            Err(_) => ResolveResult::Failed,
        };
        if let Ok(owner) = &answer {
            if st.answers.len() >= MAX_REMEMBERED {
                st.answers
                    .retain(|_, (_, at)| now.saturating_duration_since(*at) < REMEMBER);
                if st.answers.len() >= MAX_REMEMBERED {
                    st.answers.clear();
                }
            }
            st.answers.insert(id.to_string(), (owner.clone(), now));
        }
        drop(st);
        self.metrics.count_resolution(result);
        answer.ok().flatten()
    }
}

/// The runtime's answer: the container's pod (its sandbox known to the cache, or
/// read by its ID), or the sandbox's own pod.
async fn find(
    runtime: &dyn RuntimeClient,
    cache: &PodCache,
    id: &str,
) -> Result<Option<Owner>, plegd_runtime::RuntimeError> {
    let (sandbox_id, container) = match runtime.container_by_id(id).await? {
        Some(c) => (c.sandbox_id, true),
        None => (id.to_string(), false),
    };
    if sandbox_id.is_empty() {
        return Ok(None);
    }
    if let Some(uid) = cache.pod_of_container(&sandbox_id) {
        return Ok(Some(Owner { uid, container }));
    }
    let sandboxes = runtime.list_sandboxes(Some(&sandbox_id)).await?;
    Ok(sandboxes
        .into_iter()
        .find(|s| s.id == sandbox_id && !s.pod.uid.is_empty())
        .map(|s| Owner {
            uid: s.pod.uid,
            container,
        }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use plegd_sim::FakeRuntime;
    use plegd_telemetry::ResolveResult;

    /// At most RATE traces at once, refilled at RATE a second; beyond, an ID waits for
    /// the next global relist (counted `limited`).
    #[test]
    fn tracing_is_rate_limited() {
        let metrics = Arc::new(Metrics::new());
        let r = Resolver::new(Arc::new(FakeRuntime::new()), metrics.clone());
        let cache = crate::cache::CacheOwner::new(Duration::from_secs(300)).1;
        let t0 = Instant::now();
        for i in 0..RATE {
            assert_eq!(r.lookup(&cache, &format!("c{i}"), t0), Lookup::Ask);
        }
        assert_eq!(r.lookup(&cache, "one-more", t0), Lookup::Wait);
        assert_eq!(metrics.resolutions(ResolveResult::Limited), 1);
        // An ID being asked already waits, whatever the budget.
        assert_eq!(
            r.lookup(&cache, "c0", t0 + Duration::from_secs(1)),
            Lookup::Wait
        );
        // A second later the budget is back.
        assert_eq!(
            r.lookup(&cache, "one-more", t0 + Duration::from_secs(1)),
            Lookup::Ask
        );
    }
}
