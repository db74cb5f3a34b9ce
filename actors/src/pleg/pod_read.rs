//! Reading pods: a targeted relist's lists of one pod (filtered by sandbox id, so
//! its cost does not grow with the node), the statuses read together with them
//! (prefetch), and any pod's status read (`status`).
//!
//! A read borrows nothing of the Generic PLEG: what it needs of the records is
//! taken first ([`PodPlan`]), and the handles it calls through are cloned
//! ([`Reader`]). So the pods of a batch are read concurrently while the Generic PLEG
//! commits each one as soon as its read ends (20 exits at once are published one by
//! one, none waits for the slowest pod's read).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::{join_all, try_join_all};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::Semaphore;

use super::diff::pod_events;
use super::early::{deaths_in, split_possible_deaths, EarlyExits};
use super::record::{group, Id, PodRecord};
use super::status::{
    index_containers, index_sandboxes, read_pod_status, reusable, take_prefetched, unsettled_exits,
    LastRead, LastReads, Listed, PodStatus, PrefetchCounts,
};
use crate::event::{EventKind, RelistSource};
use plegd_runtime::{Container, ContainerStatus, RuntimeClient, RuntimeError, Sandbox};

/// Whole-node sandbox lists (the reads of pods plegd has not seen) in flight at once
/// in a batch: each decodes every sandbox of the node (≈ 0.3 MB at 1,000 pods), and a
/// batch that took the requests of a churn's new pods as they came read 32 at once,
/// which put the churn's heap peak at 19 MB and left pages behind (memory
/// after a churn; heaptrack).
pub(super) const WHOLE_NODE_LISTS: usize = 2;

/// What a targeted read of one pod needs of the Generic PLEG's state, taken before
/// the read begins (nothing else changes the pod's record until it is committed: a
/// batch holds each pod once).
pub(super) struct PodPlan {
    pub uid: String,
    pub source: RelistSource,
    /// The sandbox ids of the pod's record, sorted (empty: a pod plegd has not seen).
    pub known: Vec<String>,
    /// The pod's record.
    pub previous: Option<PodRecord>,
    /// The pod awaits reinspection.
    pub reinspect: bool,
    /// Containers whose status is read with the lists (those that may show a death
    /// first, [`Reader::read_pod`]): those asked for, and the exits whose status had
    /// not settled at the pod's last read (the read after the lists would call them
    /// anyway).
    pub prefetch: Vec<String>,
}

impl PodPlan {
    /// The plan of a read of `uid`, `last` its last status read (the cache's).
    pub fn new(
        uid: &str,
        source: RelistSource,
        asked: &[String],
        previous: Option<&PodRecord>,
        reinspect: bool,
        last: Option<LastRead>,
        settle: Duration,
    ) -> PodPlan {
        let known: Vec<String> = previous
            .map(|r| {
                r.sandbox_ids()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .map(Id::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let mut prefetch = asked.to_vec();
        if let (false, Some(last)) = (known.is_empty(), last) {
            for id in unsettled_exits(&last, settle) {
                if !prefetch.iter().any(|p| p == id) {
                    prefetch.push(id.to_string());
                }
            }
        }
        PodPlan {
            uid: uid.to_string(),
            source,
            known,
            previous: previous.cloned(),
            reinspect,
            prefetch,
        }
    }
}

/// One pod a relist reads: what the lists say of it, against its record.
pub(super) struct Work {
    pub uid: String,
    /// Which relist asked: the events' `relist_source`.
    pub source: RelistSource,
    pub new: Option<PodRecord>,
    pub changes: Vec<(String, EventKind)>,
    pub reinspect: bool,
    /// The list entries `new` was built from.
    pub listed: Listed,
    /// Container statuses read together with the lists (targeted relists only).
    pub prefetched: HashMap<String, ContainerStatus>,
}

/// The list entries of a pod's new record (none if the pod is gone); see
/// [`Listed::of`].
pub(super) fn listed_of(
    uid: &str,
    new: Option<&PodRecord>,
    sandboxes: &HashMap<&str, &Sandbox>,
    containers: &HashMap<&str, &Container>,
    unlabeled: &HashSet<String>,
) -> Listed {
    new.map(|rec| Listed::of(uid, rec, sandboxes, containers, unlabeled))
        .unwrap_or_default()
}

/// A pod read: what the relist found of it, when its status read began, and the
/// status (None: the pod is gone).
pub(super) struct PodRead {
    pub work: Work,
    pub read_at: SystemTime,
    pub status: Option<Result<PodStatus, RuntimeError>>,
}

/// The handles a read calls through; cheap to clone.
#[derive(Clone)]
pub(super) struct Reader {
    pub runtime: Arc<dyn RuntimeClient>,
    /// The last status reads (the cache), for statuses that still hold.
    pub last_reads: Option<Arc<dyn LastReads>>,
    /// How long after its exit a container's status is read again.
    pub exit_settle: Duration,
}

impl Reader {
    /// Reads `w`'s pod status (if the pod is still listed): its sandboxes from the
    /// lists, the statuses that still hold from the last read (asked now: the last
    /// relist that read this pod has been applied), the prefetched ones that agree
    /// with the lists, the rest with ContainerStatus within `calls`. The prefetches'
    /// fate is counted in `counts` before the returned future runs.
    pub fn read_status<'a>(
        &self,
        mut w: Work,
        calls: &'a Semaphore,
        counts: &mut PrefetchCounts,
    ) -> impl Future<Output = PodRead> + 'a {
        let last = match (&w.new, &self.last_reads) {
            (Some(_), Some(last)) => last.last_read(&w.uid),
            _ => None,
        };
        w.listed.label_from(last.as_ref());
        let mut reuse = reusable(&w.listed, last, self.exit_settle);
        // A pod that is gone lists nothing: its prefetches go unused.
        let prefetched = std::mem::take(&mut w.prefetched);
        take_prefetched(&w.listed, &mut reuse, prefetched, counts);
        let runtime = self.runtime.clone();
        async move {
            let read_at = SystemTime::now();
            let status = match &w.new {
                Some(rec) => {
                    Some(read_pod_status(runtime.as_ref(), rec, &w.listed, &reuse, calls).await)
                }
                None => None,
            };
            PodRead {
                work: w,
                read_at,
                status,
            }
        }
    }

    /// A targeted read of one pod: its lists (a known pod's by sandbox id, all at once;
    /// a pod plegd has not seen yet can only be found in the whole list) together with
    /// the prefetches, then its status. When `unhurried` (no other pod waits for a
    /// place among the batch's reads), the prefetches that may report a death early go
    /// first, alone, and the lists with the other prefetches (the pod's unsettled
    /// exits) once they have answered: on containerd 2.1 a ContainerStatus sent with
    /// the pod's two lists answers later than one sent alone, and the other prefetches
    /// would only hold the death back (docs/architecture.md). Otherwise all go at once,
    /// holding the read's place the shortest; a death is still handed over as soon as
    /// the prefetches that may show one have answered. Always re-reads the status (that
    /// is what was asked for); a pod that is gone and unknown is a no-op. A new sandbox of a known
    /// pod (a recreated sandbox) is found by the next global relist. A prefetch that
    /// fails only means "not prefetched".
    /// A new pod's whole-node list waits for one of `whole_node` (at most
    /// [`WHOLE_NODE_LISTS`] per batch). `early`: where the prefetches that show a
    /// death of a container the record knows go as soon as they are read, before the
    /// lists answer (`early` module). Ends with Ok(None) if the pod is gone and was
    /// never known (nothing to do), Err if its lists failed (nothing changes); with
    /// what became of its prefetches.
    pub async fn read_pod(
        &self,
        plan: PodPlan,
        calls: &Semaphore,
        whole_node: &Semaphore,
        early: Option<&UnboundedSender<EarlyExits>>,
        unhurried: bool,
    ) -> (Result<Option<PodRead>, RuntimeError>, PrefetchCounts) {
        let lists = async {
            if plan.known.is_empty() {
                self.list_new_pod(&plan.uid, whole_node).await
            } else {
                self.list_known_pod(&plan.known).await
            }
        };
        // The statuses that may show a death are read on their own: the others (the
        // pod's exits not yet settled, deaths the record has) would hold it back.
        let (watched, settling) = split_possible_deaths(plan.previous.as_ref(), &plan.prefetch);
        let watch = async {
            let read_at = SystemTime::now();
            let read = prefetch_statuses(self.runtime.as_ref(), &watched, calls).await;
            if !watched.is_empty() && early.is_some() && !plan.reinspect {
                tracing::debug!(
                    pod = %plan.uid,
                    containers = watched.len(),
                    took_ms = read_at.elapsed().unwrap_or_default().as_secs_f64() * 1e3,
                    "status read that may show a death"
                );
            }
            if let (Some(early), false) = (early, plan.reinspect) {
                let exited = deaths_in(plan.previous.as_ref(), read.0.values());
                if !exited.is_empty() {
                    // The receiver is the batch's, alive while this read is.
                    let _ = early.send(EarlyExits {
                        uid: plan.uid.clone(),
                        source: plan.source,
                        read_at,
                        exited,
                    });
                }
            }
            read
        };
        let settling = prefetch_statuses(self.runtime.as_ref(), &settling, calls);
        let status_first = unhurried && early.is_some() && !plan.reinspect && !watched.is_empty();
        let (lists, (mut prefetched, mut counts), (settled, settled_counts)) = if status_first {
            let watched = watch.await;
            let (lists, settled) = futures::join!(lists, settling);
            (lists, watched, settled)
        } else {
            futures::join!(lists, watch, settling)
        };
        prefetched.extend(settled);
        counts.add(settled_counts);
        let (sandboxes, containers) = match lists {
            Ok(lists) => lists,
            Err(e) => {
                counts.unused += prefetched.len();
                return (Err(e), counts);
            }
        };
        let uid = plan.uid;
        let previous: HashMap<String, PodRecord> = plan
            .previous
            .iter()
            .map(|r| (uid.clone(), r.clone()))
            .collect();
        let new = group(&sandboxes, &containers, &previous).remove(&uid);
        if new.is_none() && plan.previous.is_none() && !plan.reinspect {
            counts.unused += prefetched.len();
            return (Ok(None), counts);
        }
        let changes = pod_events(plan.previous.as_ref(), new.as_ref());
        let listed = listed_of(
            &uid,
            new.as_ref(),
            &index_sandboxes(&sandboxes),
            &index_containers(&containers),
            &HashSet::new(),
        );
        let work = Work {
            uid,
            source: plan.source,
            new,
            changes,
            reinspect: plan.reinspect,
            listed,
            prefetched,
        };
        let read = self.read_status(work, calls, &mut counts).await;
        (Ok(Some(read)), counts)
    }

    /// The lists of a pod plegd has not seen: its sandboxes can only be found in the
    /// whole list, then their containers are listed by sandbox id.
    async fn list_new_pod(
        &self,
        uid: &str,
        whole_node: &Semaphore,
    ) -> Result<(Vec<Sandbox>, Vec<Container>), RuntimeError> {
        let sandboxes: Vec<Sandbox> = {
            // Held until the whole list is dropped.
            let _permit = whole_node.acquire().await;
            self.runtime
                .list_sandboxes(None)
                .await?
                .into_iter()
                .filter(|s| s.pod.uid == uid)
                .collect()
        };
        let ids: BTreeSet<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
        let containers = self.list_containers_of(ids).await?;
        Ok((sandboxes, containers))
    }

    /// The lists of a known pod, by its sandbox ids: each sandbox and each sandbox's
    /// containers, all at once (one round trip, not one per call: a single exit's
    /// relist waits for these before its status read). Containers are listed by every
    /// known id, listed now or not: a sandbox missing from one list keeps its
    /// containers attached. Any call that fails fails the pod's lists.
    async fn list_known_pod(
        &self,
        known: &[String],
    ) -> Result<(Vec<Sandbox>, Vec<Container>), RuntimeError> {
        let sandboxes = try_join_all(known.iter().map(|id| self.runtime.list_sandboxes(Some(id))));
        let containers = self.list_containers_of(known.iter().map(String::as_str));
        let (sandboxes, mut containers) = futures::try_join!(sandboxes, containers)?;
        let sandboxes: Vec<Sandbox> = sandboxes.into_iter().flatten().collect();
        // A sandbox listed under an id plegd did not ask by (a runtime whose filter
        // matched another sandbox): its containers too, as for any listed sandbox.
        let more: BTreeSet<&str> = sandboxes
            .iter()
            .map(|s| s.id.as_str())
            .filter(|id| known.binary_search_by(|k| k.as_str().cmp(id)).is_err())
            .collect();
        if !more.is_empty() {
            containers.extend(self.list_containers_of(more).await?);
        }
        Ok((sandboxes, containers))
    }

    /// ListContainers by each of these sandbox ids, at once.
    async fn list_containers_of<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a str>,
    ) -> Result<Vec<Container>, RuntimeError> {
        let lists = try_join_all(
            ids.into_iter()
                .map(|id| self.runtime.list_containers(Some(id))),
        );
        Ok(lists.await?.into_iter().flatten().collect())
    }
}

/// ContainerStatus of each of `ids` at once, each call within `calls`: the statuses
/// read, and the count of those that failed (any error, NotFound included: the
/// container is then read as if there were no prefetch).
async fn prefetch_statuses(
    runtime: &dyn RuntimeClient,
    ids: &[String],
    calls: &Semaphore,
) -> (HashMap<String, ContainerStatus>, PrefetchCounts) {
    let reads = join_all(ids.iter().map(|id| async move {
        let _permit = calls.acquire().await;
        (id, runtime.container_status(id).await)
    }))
    .await;
    let mut counts = PrefetchCounts::default();
    let mut statuses = HashMap::new();
    for (id, read) in reads {
        match read {
            Ok(st) => {
                statuses.insert(id.clone(), st);
            }
            Err(e) => {
                tracing::debug!(container = %id, error = %e, "prefetched status read failed");
                counts.failed += 1;
            }
        }
    }
    (statuses, counts)
}
