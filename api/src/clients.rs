//! Who is connected, for operators (ListClients, `plegd status --clients`): each open
//! Watch stream and each active sync hold registers here while it lasts, through a
//! guard whose drop removes it. Small on purpose: a mutex over two maps, written at
//! open and close; a watcher's progress goes through atomics, and its queue depth is
//! read from its subscription when asked.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::SystemTime;

use plegd_actors::Subscription;
use plegd_protocol::v1;

use crate::convert::unix_nanos;

/// Every open Watch stream and active sync hold. Cheap to clone.
#[derive(Clone, Default)]
pub struct Clients(Arc<Mutex<Registry>>);

#[derive(Default)]
struct Registry {
    next: u64,
    watchers: HashMap<u64, Watcher>,
    holds: HashMap<u64, Hold>,
}

struct Watcher {
    filter: String,
    capacity: u64,
    opened_at: i64,
    queue: Weak<Subscription>,
    progress: Arc<Progress>,
}

/// What a watcher's task updates as it goes.
#[derive(Default)]
struct Progress {
    dropped: AtomicU64,
    revision: AtomicU64,
}

struct Hold {
    pod_uid: String,
    since: i64,
    expires_at: Arc<AtomicI64>,
    pod_known: bool,
}

impl Clients {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Every mutation is one insert or one remove: a panic leaves it consistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, f: impl FnOnce(&mut Registry, u64)) -> u64 {
        let mut r = self.lock();
        r.next += 1;
        let id = r.next;
        f(&mut r, id);
        id
    }

    /// Registers an open Watch stream; it is listed until the guard is dropped.
    pub fn watcher(
        &self,
        req: &v1::WatchRequest,
        capacity: usize,
        queue: Weak<Subscription>,
    ) -> WatcherGuard {
        let progress = Arc::new(Progress::default());
        let watcher = Watcher {
            filter: filter_text(req),
            capacity: capacity as u64,
            opened_at: unix_nanos(SystemTime::now()),
            queue,
            progress: progress.clone(),
        };
        let id = self.add(|r, id| {
            r.watchers.insert(id, watcher);
        });
        WatcherGuard {
            clients: self.clone(),
            id,
            progress,
        }
    }

    /// Registers an active sync hold; listed until the guard is dropped.
    pub fn hold(&self, pod_uid: &str, expires_at: SystemTime, pod_known: bool) -> HoldGuard {
        let expires = Arc::new(AtomicI64::new(unix_nanos(expires_at)));
        let hold = Hold {
            pod_uid: pod_uid.to_string(),
            since: unix_nanos(SystemTime::now()),
            expires_at: expires.clone(),
            pod_known,
        };
        let id = self.add(|r, id| {
            r.holds.insert(id, hold);
        });
        HoldGuard {
            clients: self.clone(),
            id,
            expires,
        }
    }

    /// ListClients' answer: watchers by the time they opened, holds by pod.
    pub fn list(&self) -> v1::ListClientsResponse {
        let r = self.lock();
        let mut watchers: Vec<v1::WatcherInfo> = r
            .watchers
            .values()
            .map(|w| v1::WatcherInfo {
                filter: w.filter.clone(),
                queue_depth: w.queue.upgrade().map_or(0, |s| s.len() as u64),
                queue_capacity: w.capacity,
                dropped: w.progress.dropped.load(Ordering::Relaxed),
                revision: w.progress.revision.load(Ordering::Relaxed),
                opened_at_unix_nano: w.opened_at,
            })
            .collect();
        watchers.sort_by_key(|w| w.opened_at_unix_nano);
        let mut holds: Vec<v1::HoldInfo> = r
            .holds
            .values()
            .map(|h| v1::HoldInfo {
                pod_uid: h.pod_uid.clone(),
                held_since_unix_nano: h.since,
                expires_at_unix_nano: h.expires_at.load(Ordering::Relaxed),
                pod_known: h.pod_known,
            })
            .collect();
        holds.sort_by(|a, b| a.pod_uid.cmp(&b.pod_uid));
        v1::ListClientsResponse { watchers, holds }
    }
}

/// An open Watch stream's entry.
pub struct WatcherGuard {
    clients: Clients,
    id: u64,
    progress: Arc<Progress>,
}

impl WatcherGuard {
    /// The stream has reached `revision`.
    pub fn reached(&self, revision: u64) {
        self.progress.revision.store(revision, Ordering::Relaxed);
    }

    /// `n` more events were dropped for the stream.
    pub fn dropped(&self, n: u64) {
        self.progress.dropped.fetch_add(n, Ordering::Relaxed);
    }
}

impl Drop for WatcherGuard {
    fn drop(&mut self) {
        self.clients.lock().watchers.remove(&self.id);
    }
}

/// An active hold's entry.
pub struct HoldGuard {
    clients: Clients,
    id: u64,
    expires: Arc<AtomicI64>,
}

impl HoldGuard {
    /// The hold was renewed until `at`.
    pub fn renewed(&self, at: SystemTime) {
        self.expires.store(unix_nanos(at), Ordering::Relaxed);
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        self.clients.lock().holds.remove(&self.id);
    }
}

/// A Watch request's filters as text, e.g. `namespaces=kube-system
/// types=CONTAINER_DIED`; empty for every event.
pub fn filter_text(req: &v1::WatchRequest) -> String {
    let mut parts = Vec::new();
    if !req.pod_uids.is_empty() {
        // A long list is cut: its first few and how many more.
        const SHOWN: usize = 3;
        let mut uids = req.pod_uids[..req.pod_uids.len().min(SHOWN)].join(",");
        if req.pod_uids.len() > SHOWN {
            uids.push_str(&format!(",+{}", req.pod_uids.len() - SHOWN));
        }
        parts.push(format!("pod_uids={uids}"));
    }
    if !req.namespaces.is_empty() {
        parts.push(format!("namespaces={}", req.namespaces.join(",")));
    }
    if !req.types.is_empty() {
        let names: Vec<String> = req
            .types
            .iter()
            .map(|&t| {
                v1::EventType::try_from(t)
                    .map(|t| t.as_str_name().to_string())
                    .unwrap_or_else(|_| t.to_string())
            })
            .collect();
        parts.push(format!("types={}", names.join(",")));
    }
    if !req.label_selector.is_empty() {
        parts.push(format!("selector={}", req.label_selector));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_read_as_text_and_entries_go_with_their_guards() {
        let req = v1::WatchRequest {
            namespaces: vec!["kube-system".into()],
            types: vec![v1::EventType::ContainerDied as i32],
            ..Default::default()
        };
        assert_eq!(
            filter_text(&req),
            "namespaces=kube-system types=CONTAINER_DIED"
        );
        assert_eq!(filter_text(&v1::WatchRequest::default()), "");
        let clients = Clients::default();
        let w = clients.watcher(&req, 8, Weak::new());
        w.reached(7);
        w.dropped(2);
        w.dropped(1);
        let later = SystemTime::now() + std::time::Duration::from_secs(60);
        let h = clients.hold("u1", SystemTime::now(), false);
        h.renewed(later);
        let list = clients.list();
        assert_eq!(list.watchers.len(), 1);
        let got = &list.watchers[0];
        assert_eq!((got.revision, got.dropped, got.queue_capacity), (7, 3, 8));
        assert_eq!(list.holds.len(), 1);
        assert_eq!(list.holds[0].expires_at_unix_nano, unix_nanos(later));
        assert!(!list.holds[0].pod_known);
        drop((w, h));
        let list = clients.list();
        assert!(list.watchers.is_empty() && list.holds.is_empty());
    }
}
