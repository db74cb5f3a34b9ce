//! One relist of the Generic PLEG, global or of one pod. Both kinds share one path:
//! list → group by pod UID → diff against the last reconciled record → read the full
//! status of pods that changed → cache updates + lifecycle events.
//!
//! Rules (kubelet's Generic PLEG, see docs/architecture.md): a pod whose status
//! read fails gets its error cached, keeps its old record, emits nothing, and is
//! reinspected next time; a reinspection that succeeds with no change emits PodSync.
//! One pod's failure never blocks the others. The relist timestamp is taken before
//! any read. A pod whose read says another state than its lists (it changed between
//! the two) is read again by the next global relist, with no PodSync: the lists
//! may by then agree with its record again, and the cache would keep the read.
//!
//! A status read takes each sandbox from the list entry the pod's record was built
//! from and reuses the last status of containers still running (`status`), so what
//! fails a read — and marks the pod for reinspection — is a ContainerStatus call that
//! fails other than with NotFound (or PodSandboxStatus of a record's sandbox with no
//! list entry at hand, which today's paths never leave).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::Either;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::Semaphore;

use super::beside::{Beside, BesideAsk, BesideCounts, GlobalStep};
use super::changes;
use super::chunks::{group_all, Entries, Plan, CHUNK_PODS};
use super::diff::pod_events;
use super::early::{self, EarlyExits};
use super::fingerprint::Fingerprint;
use super::output::{cri_time, non_empty};
use super::output::{CacheUpdate, RelistOutput};
use super::pod_read::{listed_of, PodPlan, PodRead, Reader, Work, WHOLE_NODE_LISTS};
use super::record::{group, Id, PlegState, RecordTable, Records};
use super::status::{
    index_containers, index_sandboxes, read_disagrees, LastReads, PodStatus, PrefetchCounts,
    EXIT_SETTLE,
};
use crate::event::{EventKind, Exit, LifecycleEvent, RelistSource};
use crate::room::give_back_room;
use plegd_runtime::{
    ContainerRef, ContainerState, ContainerStatus, ListView, RuntimeClient, RuntimeError, Sandbox,
    SandboxRef,
};

/// What to relist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RelistScope {
    Global,
    /// One pod; `prefetch`: containers whose status is read together with the pod's
    /// lists (`status` module docs), e.g. the one a CRI event is about.
    Pod {
        uid: String,
        source: RelistSource,
        prefetch: Vec<String>,
    },
}

impl RelistScope {
    pub fn source(&self) -> RelistSource {
        match self {
            RelistScope::Global => RelistSource::Global,
            RelistScope::Pod { source, .. } => *source,
        }
    }
}

/// A pod a batch of targeted relists reads ([`GenericPleg::relist_pods_each`]), as
/// the caller holds it (the dispatcher: a request taken into a batch), handed back
/// with the pod's output. `(uid, source, prefetch)` is one.
pub trait PodAsk {
    fn uid(&self) -> &str;
    /// The source of the request: its events' `relist_source`.
    fn source(&self) -> RelistSource;
    /// The containers whose status is read together with the pod's lists (as
    /// [`RelistScope::Pod`]'s).
    fn prefetch(&self) -> &[String];
}

impl PodAsk for (String, RelistSource, Vec<String>) {
    fn uid(&self) -> &str {
        &self.0
    }

    fn source(&self) -> RelistSource {
        self.1
    }

    fn prefetch(&self) -> &[String] {
        &self.2
    }
}

/// Whether a batch of targeted relists ([`GenericPleg::relist_pods_each`]) hands over
/// the deaths its prefetches show before the pods' lists answer (`early` module), and
/// where it takes containers to read beside its reads (`beside` module: for pods
/// whose read is in progress).
pub enum EarlyDeaths<'a> {
    Off,
    On(Option<&'a mut UnboundedReceiver<BesideAsk>>),
}

/// What a batch of targeted relists hands over ([`GenericPleg::relist_pods_each`]).
#[derive(Debug)]
pub enum PodStep<T> {
    /// Deaths a pod's prefetched statuses showed while its lists were still being
    /// read (`early` module): already in the records, to be applied and published.
    Early(RelistOutput),
    /// A pod's read ended: its tag, its output, and its lists' error if they failed.
    Read(T, RelistOutput, Option<RuntimeError>),
}

/// The records' table gives its room back counting it as at least this many pods
/// ([`crate::room`]).
const RECORDS_MIN_ROOM: usize = 256;

/// The Generic PLEG's state: the last reconciled record of each pod and the pods
/// to reinspect. Owned by exactly one RelistDispatcher.
pub struct GenericPleg {
    runtime: Arc<dyn RuntimeClient>,
    records: Records,
    reinspect: HashSet<String>,
    /// Pods whose last read disagreed with their record ([`read_disagrees`]).
    reread: HashSet<String>,
    concurrency: usize,
    /// The global relist's change check's tables, reused.
    scratch: changes::Scratch,
    /// What the last global relist's lists held, checked: an entry that did not
    /// change is not checked again.
    memo: plegd_runtime::ListMemo,
    /// The records' fingerprint of the last global relist's lists, if it was taken
    /// (None inside: lists that may name an ID twice): the next relist's lists are
    /// the same when the memo finds them unchanged, entry for entry, and so is their
    /// fingerprint (at 10,000 pods, taking it was ≈ 15 % of a no-change relist).
    lists_print: Option<Option<Fingerprint>>,
    /// The last status reads (the cache): running containers' statuses are reused
    /// from them (unless `read_every_status`), and events of a container gone before
    /// a read name it from them. None: every container is read.
    last_reads: Option<Arc<dyn LastReads>>,
    /// Tests: the last reads only name gone containers; every status is read.
    #[cfg(test)]
    read_every_status: bool,
    /// Pods per chunk of a global relist.
    chunk_pods: usize,
    /// How long after its exit a container's status is read again ([`EXIT_SETTLE`]).
    exit_settle: Duration,
    /// What the unit of work in progress reported early, until it ends.
    early: Reported,
    /// Each output lists the records it changed ([`RelistOutput::records`]): the
    /// state dir stores them.
    keep_records: bool,
    /// Tests: every global relist rebuilds every pod at once, with the records (the
    /// reference chunks and the change check are compared with).
    #[cfg(test)]
    rebuild_all: bool,
    /// Tests: global relists whose lists matched the records' fingerprint.
    #[cfg(test)]
    fingerprint_matches: usize,
    /// Tests: global relists that took the last one's lists' fingerprint.
    #[cfg(test)]
    lists_prints_reused: usize,
}

impl GenericPleg {
    /// `concurrency`: pods whose status is read at once (containerd: 8 in flight on one
    /// channel relisted 50 pods in 8.5 ms vs 26–29 ms one at a time).
    pub fn new(runtime: Arc<dyn RuntimeClient>, concurrency: usize) -> Self {
        GenericPleg {
            runtime,
            records: Records::default(),
            reinspect: HashSet::new(),
            reread: HashSet::new(),
            concurrency: concurrency.max(1),
            scratch: changes::Scratch::default(),
            memo: plegd_runtime::ListMemo::default(),
            lists_print: None,
            last_reads: None,
            #[cfg(test)]
            read_every_status: false,
            chunk_pods: CHUNK_PODS,
            exit_settle: EXIT_SETTLE,
            early: Reported::default(),
            keep_records: false,
            #[cfg(test)]
            rebuild_all: false,
            #[cfg(test)]
            fingerprint_matches: 0,
            #[cfg(test)]
            lists_prints_reused: 0,
        }
    }

    /// Tests: see `lists_prints_reused`.
    #[cfg(test)]
    pub(crate) fn lists_prints_reused(&self) -> usize {
        self.lists_prints_reused
    }

    /// Tests: see `fingerprint_matches`.
    #[cfg(test)]
    pub(crate) fn fingerprint_matches(&self) -> usize {
        self.fingerprint_matches
    }

    /// Tests: see `read_every_status`.
    #[cfg(test)]
    pub(crate) fn reading_every_status(mut self) -> Self {
        self.read_every_status = true;
        self
    }

    /// Tests: see `rebuild_all`.
    #[cfg(test)]
    pub(crate) fn rebuilding_all_at_once(mut self) -> Self {
        self.rebuild_all = true;
        self
    }

    /// Tests: global relists read and hand over at most `pods` pods at a time (at
    /// least 1; default [`CHUNK_PODS`]; `usize::MAX`: all at once).
    #[cfg(test)]
    pub(crate) fn with_chunk_pods(mut self, pods: usize) -> Self {
        self.chunk_pods = pods.max(1);
        self
    }

    /// Tests: an exited container's status is reused once a read that began `settle`
    /// after its exit showed it (default [`EXIT_SETTLE`]).
    #[cfg(test)]
    pub(crate) fn with_exit_settle(mut self, settle: Duration) -> Self {
        self.exit_settle = settle;
        self
    }

    /// Reuses the status of a container still running since `last_reads` last saw it
    /// (plegd gives the cache: the dispatcher applies each relist to it before the
    /// next begins) instead of calling ContainerStatus again.
    pub fn with_last_reads(mut self, last_reads: Arc<dyn LastReads>) -> Self {
        self.last_reads = Some(last_reads);
        self
    }

    /// Goes on from stored records (a restart on a state dir): the next relist is
    /// diffed against them, pods whose last read failed are reinspected and those
    /// whose last read ([`Self::with_last_reads`], given first) disagreed with their
    /// record are read again. Every output from now on lists the records it changed
    /// ([`RelistOutput::records`]).
    pub(crate) fn restored(mut self, records: Records, reinspect: HashSet<String>) -> Self {
        if let Some(last) = &self.last_reads {
            self.reread = records
                .iter()
                .filter(|(uid, r)| {
                    last.last_read(uid)
                        .is_some_and(|l| read_disagrees(r, &l.status))
                })
                .map(|(uid, _)| uid.clone())
                .collect();
        }
        self.records = records;
        // Taken with the old records' keys.
        self.lists_print = None;
        self.reinspect = reinspect;
        self.keep_records = true;
        self
    }

    /// Every pod's record (a new state file's snapshot).
    pub(crate) fn records(&self) -> &Records {
        &self.records
    }

    /// Tests: the last reconciled record of a pod.
    #[cfg(test)]
    pub(crate) fn record(&self, uid: &str) -> Option<&super::PodRecord> {
        self.records.get(uid)
    }

    /// Number of pods with a record.
    pub fn pod_count(&self) -> usize {
        self.records.len()
    }

    /// Tests: whether a pod awaits reinspection.
    #[cfg(test)]
    pub(crate) fn needs_reinspection(&self, uid: &str) -> bool {
        self.reinspect.contains(uid)
    }

    /// Tests: whether a pod's last read disagreed with its record.
    #[cfg(test)]
    pub(crate) fn needs_reread(&self, uid: &str) -> bool {
        self.reread.contains(uid)
    }

    /// One relist as one output (plegd's dispatcher runs [`Self::relist_global`] and
    /// [`Self::relist_pods_each`]; tests and benches, in integration-tests and bench/,
    /// drive this). `held(uid)` pods are left untouched (a sync holds them).
    /// Err means the lists failed: nothing changed, no timestamp may advance (what
    /// became of a prefetch then goes uncounted).
    pub async fn relist(
        &mut self,
        scope: &RelistScope,
        held: &dyn Fn(&str) -> bool,
    ) -> Result<RelistOutput, RuntimeError> {
        let RelistScope::Pod {
            uid,
            source,
            prefetch,
        } = scope
        else {
            // Its chunks, one after the other, as one output.
            let mut all = RelistOutput::default();
            self.relist_global(held, |out, _| {
                all.append(out);
                std::future::ready(())
            })
            .await?;
            return Ok(all);
        };
        let pods = vec![(uid.clone(), *source, prefetch.clone())];
        let mut result = Ok(RelistOutput::default());
        // No early deaths: an error here must mean that nothing changed.
        self.relist_pods_each(pods, None, None, held, EarlyDeaths::Off, |step| {
            if let PodStep::Read(_, out, error) = step {
                result = match error {
                    Some(e) => Err(e),
                    None => Ok(out),
                };
            }
            std::future::ready(())
        })
        .await;
        result
    }

    /// Targeted relists of several pods (the dispatcher's batch), each handed over
    /// as soon as it is read: `each(PodStep::Read(tag, output, error))` is called
    /// once for every pod asked, in the order their reads end, and awaited before the
    /// next pod is committed (the dispatcher applies and publishes each meanwhile,
    /// while the other pods' reads go on; none of 20 exits at once waits for
    /// the slowest pod's read). Each pod is read as `pod_read` says, `concurrency`
    /// pods at once (in the order asked) and one bound on their status calls
    /// (prefetches included); each pod's events carry its ask's source.
    ///
    /// `early`: a prefetch that shows a death of a container the record knows is
    /// handed over at once, as `each(PodStep::Early(output))`, before the pod's lists
    /// answer (`early` module). Such a pod's read may then fail with some of its
    /// deaths already applied. So is a death that a read asked beside the batch shows
    /// (`beside` module; reads still in flight when the batch ends are dropped).
    ///
    /// `more`: pods asked while the others are read (the dispatcher's requests that
    /// come meanwhile) join them; the call ends once nothing is being read and `more`
    /// is closed (without `more`: once every pod asked is read). A pod asked while it
    /// is being read (or twice at once) is read after that read is handed over: its
    /// plan is taken from the record that read leaves.
    ///
    /// `give_way`: once it says true (a global relist is due), no read starts but the
    /// first `concurrency`: once the reads in progress end, the call returns the pods
    /// not read yet, those asked meanwhile included, unread and not handed over.
    ///
    /// A pod a sync holds when its read is due is handed back unread, in
    /// `output.held` (as is one taken while it was read). A pod whose lists fail
    /// changes nothing and comes with its error (its output counts only its
    /// prefetches); the others go on.
    pub async fn relist_pods_each<T, F, Fut>(
        &mut self,
        pods: Vec<T>,
        mut more: Option<&mut UnboundedReceiver<T>>,
        give_way: Option<&dyn Fn() -> bool>,
        held: &dyn Fn(&str) -> bool,
        early: EarlyDeaths<'_>,
        mut each: F,
    ) -> Vec<T>
    where
        T: PodAsk,
        F: FnMut(PodStep<T>) -> Fut,
        Fut: Future<Output = ()>,
    {
        let reader = self.reader();
        let calls = Semaphore::new(self.concurrency);
        let whole_node = Semaphore::new(WHOLE_NODE_LISTS);
        let (early_tx, mut early_rx) = unbounded_channel();
        let (early_tx, asks) = match early {
            EarlyDeaths::Off => (None, None),
            EarlyDeaths::On(asks) => (Some(&early_tx), asks),
        };
        self.early.timing = early_tx.is_some();
        let mut beside = Beside::new(asks, self.runtime.clone());
        let (reader, calls, whole_node) = (&reader, &calls, &whole_node);
        let mut asked: VecDeque<T> = pods.into();
        let mut reads = FuturesUnordered::new();
        let mut open = more.is_some();
        // Reads started: the first `concurrency` start whatever `give_way` says, so a
        // batch always makes progress, even one that starts when it says true.
        let mut started = 0usize;
        // The pods being read: a pod asked again meanwhile waits for that read's end
        // (its plan is taken from the record that read leaves).
        let mut reading: HashSet<String> = HashSet::new();
        loop {
            let over = started >= self.concurrency && give_way.is_some_and(|f| f());
            if over {
                open = false;
            }
            while !over && reads.len() < self.concurrency {
                let Some(ask) = asked
                    .iter()
                    .position(|a| !reading.contains(a.uid()))
                    .and_then(|i| asked.remove(i))
                else {
                    break;
                };
                if held(ask.uid()) {
                    let out = RelistOutput {
                        held: vec![ask.uid().to_string()],
                        ..RelistOutput::default()
                    };
                    each(PodStep::Read(ask, out, None)).await;
                    continue;
                }
                let plan = self.plan(&ask);
                reading.insert(ask.uid().to_string());
                started += 1;
                // Others waiting for a place: this read holds its place the shortest.
                let unhurried = asked.is_empty();
                reads.push(async move {
                    let read = reader
                        .read_pod(plan, calls, whole_node, early_tx, unhurried)
                        .await;
                    (ask, read)
                });
            }
            // Nothing is being read: the end once nothing more can be asked, else wait
            // for what is.
            if reads.is_empty() && (over || !open) {
                break;
            }
            let next_ask = async {
                match more.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // A read's early deaths before its end (it sends them first).
                biased;
                Some(exits) = early_rx.recv() => {
                    let out = self.early_deaths(exits, held);
                    if !out.is_empty() {
                        each(PodStep::Early(out)).await;
                    }
                }
                exits = beside.next_exits() => {
                    let out = self.early_deaths(exits, held);
                    if !out.is_empty() {
                        each(PodStep::Early(out)).await;
                    }
                }
                Some((tag, (read, prefetch))) = reads.next() => {
                    reading.remove(tag.uid());
                    let mut out = RelistOutput {
                        prefetch,
                        ..RelistOutput::default()
                    };
                    let error = match read {
                        Ok(Some(read)) => {
                            self.commit(read, held, &mut out);
                            None
                        }
                        Ok(None) => None,
                        Err(e) => Some(e),
                    };
                    each(PodStep::Read(tag, out, error)).await;
                }
                ask = next_ask, if open => match ask {
                    Some(ask) => asked.push_back(ask),
                    None => open = false,
                },
            }
        }
        // A read that sent its deaths and ended in the same poll: they come last.
        while let Ok(exits) = early_rx.try_recv() {
            let out = self.early_deaths(exits, held);
            if !out.is_empty() {
                each(PodStep::Early(out)).await;
            }
        }
        // No read of this call is left to commit.
        self.early.clear();
        // What was not read: asked, or asked meanwhile (none unless it gave way).
        let mut left: Vec<T> = asked.into();
        if let Some(rx) = more {
            while let Ok(ask) = rx.try_recv() {
                left.push(ask);
            }
        }
        left
    }

    /// Containers reported early in the unit of work in progress (none once it has
    /// ended).
    #[cfg(test)]
    pub(crate) fn early_pending(&self) -> usize {
        self.early.deaths.values().map(Vec::len).sum()
    }

    /// Applies a pod's early deaths (`early` module) to its record, unless a sync
    /// holds the pod or it awaits reinspection; what to apply to the cache and
    /// publish.
    fn early_deaths(&mut self, exits: EarlyExits, held: &dyn Fn(&str) -> bool) -> RelistOutput {
        early_deaths(
            &mut self.records,
            &self.reinspect,
            &mut self.early,
            self.keep_records,
            exits,
            held,
        )
    }

    /// What a read of `ask`'s pod needs of the state (`pod_read`).
    fn plan(&self, ask: &impl PodAsk) -> PodPlan {
        let uid = ask.uid();
        let previous = self.records.get(uid);
        let last = match (&self.last_reads, previous) {
            (Some(last), Some(_)) if self.reuses_statuses() => last.last_read(uid),
            _ => None,
        };
        PodPlan::new(
            uid,
            ask.source(),
            ask.prefetch(),
            previous,
            self.reinspect.contains(uid),
            last,
            self.exit_settle,
        )
    }

    /// A global relist, handed over in chunks of at most `chunk_pods` pods (see
    /// `chunks`): `each(output, last)` is called for every chunk, in order, and awaited
    /// before the next chunk's statuses are read (the dispatcher applies and publishes
    /// it meanwhile: the next chunk's reads may reuse what the cache says). There is
    /// always a last chunk, even with no pod. Err before the first chunk: the lists
    /// failed, nothing changed. Err after some (only when a sandbox's labels do not
    /// decode although the list memo vouched for the entry: a keyed-hash collision):
    /// the chunks handed over are applied, the rest of the relist is not, and the memo
    /// is forgotten, so the next relist checks every entry and refuses the lists.
    pub async fn relist_global<F, Fut>(
        &mut self,
        held: &dyn Fn(&str) -> bool,
        mut each: F,
    ) -> Result<(), RuntimeError>
    where
        F: FnMut(RelistOutput, bool) -> Fut,
        Fut: Future<Output = ()>,
    {
        self.relist_global_hearing(held, None, |step| match step {
            GlobalStep::Chunk { out, last } => Either::Left(each(out, last)),
            // Only what is read beside comes early: nothing is.
            GlobalStep::Early(_) => Either::Right(std::future::ready(())),
        })
        .await
        .map(|_| ())
    }

    /// [`Self::relist_global`], reading beside it the containers `asks` names while
    /// it runs (`beside` module): `each` gets each chunk as
    /// [`GlobalStep::Chunk`], and the deaths those reads show, at once, as
    /// [`GlobalStep::Early`] (between two chunks, or before the first). On success,
    /// what it read beside.
    pub async fn relist_global_hearing<F, Fut>(
        &mut self,
        held: &dyn Fn(&str) -> bool,
        asks: Option<&mut UnboundedReceiver<BesideAsk>>,
        mut each: F,
    ) -> Result<BesideCounts, RuntimeError>
    where
        F: FnMut(GlobalStep) -> Fut,
        Fut: Future<Output = ()>,
    {
        // No death can come early to a pod with no record (the first relist's).
        self.early.timing = asks.is_some() && !self.records.is_empty();
        let mut beside = Beside::new(asks, self.runtime.clone());
        let result = self.global_parts(held, &mut beside, &mut each).await;
        // What was read beside holds against this relist's lists only.
        self.early.clear();
        result.map(|()| beside.counts)
    }

    async fn global_parts<F, Fut>(
        &mut self,
        held: &dyn Fn(&str) -> bool,
        beside: &mut Beside<'_>,
        each: &mut F,
    ) -> Result<(), RuntimeError>
    where
        F: FnMut(GlobalStep) -> Fut,
        Fut: Future<Output = ()>,
    {
        let lists = beside
            .during(
                self.runtime.list_node_memo(&mut self.memo),
                &mut |exits| {
                    early_deaths(
                        &mut self.records,
                        &self.reinspect,
                        &mut self.early,
                        self.keep_records,
                        exits,
                        held,
                    )
                },
                each,
            )
            .await?;
        let view = lists.view_memo(&mut self.memo)?;
        let plan = self.global_plan(&view, held);
        // The first relist builds every pod's record first, from the lists in place
        // and in their order: the records are what every later relist compares the
        // lists with, in list order, so they are kept together, not scattered among
        // the chunks' transients (which made a no-change relist at 10,000 pods
        // ≈ 40 % slower: cache misses).
        let mut records = match plan.entries {
            Entries::ByPod(_) if self.records.is_empty() => {
                Some(group_all(view.sandboxes(), view.containers()))
            }
            _ => None,
        };
        let chunks = plan.chunks();
        let last = chunks.len() - 1;
        for (i, range) in chunks.into_iter().enumerate() {
            let mut left_held = Vec::new();
            let work = match self.chunk_work(
                &view,
                &plan,
                range,
                records.as_mut(),
                held,
                &mut left_held,
            ) {
                Ok(work) => work,
                Err(e) => {
                    self.memo.clear();
                    return Err(e);
                }
            };
            let mut out = self.process(work, held, beside, each).await;
            out.held.extend(left_held);
            each(GlobalStep::Chunk {
                out,
                last: i == last,
            })
            .await;
        }
        // A churn of short-lived pods leaves the records' table at the size its peak
        // grew it to (a hash table that removes and inserts at over half its capacity
        // doubles once, even with the same live pods): give the room back once it is
        // well above what the pods need (memory after a churn).
        give_back_room(&mut self.records, RECORDS_MIN_ROOM);
        drop(view);
        self.memo.keep(lists);
        Ok(())
    }

    /// Tests: the records' table's room.
    #[cfg(test)]
    pub(crate) fn records_capacity(&self) -> usize {
        self.records.capacity()
    }

    /// Which pods this global relist visits, and how its chunks find their entries.
    fn global_plan<'v>(&mut self, view: &ListView<'v>, held: &dyn Fn(&str) -> bool) -> Plan<'v> {
        let last_print = self.lists_print.take();
        let owned = |uid: &String| Cow::Owned(uid.clone());
        let all = |this: &Self| {
            Plan::all(
                this.records
                    .keys()
                    .chain(this.reinspect.iter())
                    .map(owned)
                    .chain(view.each_sandbox().map(|s| Cow::Borrowed(s.uid)))
                    .collect(),
            )
        };
        #[cfg(test)]
        if self.rebuild_all {
            return all(self);
        }
        if self.records.is_empty() {
            // The first relist (or every pod's first read failed): every pod is new,
            // placed by the lists alone. Pods known only from a failed first read are
            // visited too, so that one that is gone gets its cache entry deleted.
            let uids: Vec<Cow<'v, str>> = view
                .each_sandbox()
                .map(|s| Cow::Borrowed(s.uid))
                .chain(self.reinspect.iter().map(owned))
                .collect();
            let plan = Plan::by_pod(uids, view, |_| true, self.chunk_pods);
            self.records.reserve(plan.uids.len());
            return plan;
        }
        // Lists that hold exactly what the records do need no look-up of a record.
        let listed = match last_print {
            Some(print) if self.memo.unchanged() => {
                #[cfg(test)]
                {
                    self.lists_prints_reused += 1;
                }
                print
            }
            _ => self
                .records
                .entry_keys()
                .of_lists(view.each_sandbox(), view.each_container()),
        };
        self.lists_print = Some(listed);
        let changed = if listed == Some(self.records.fingerprint()) {
            #[cfg(test)]
            {
                self.fingerprint_matches += 1;
            }
            Some(HashSet::new())
        } else {
            changes::changed_pods(
                view.sandboxes(),
                view.containers(),
                &self.records,
                &mut self.scratch,
            )
            .map(|c| c.into_iter().map(String::from).collect::<HashSet<String>>())
        };
        match changed {
            // Only the pods that changed are rebuilt (and only their entries decoded);
            // every container listed has its sandbox listed (else `changed_pods` says
            // None, and lists matching the fingerprint hold no loose container), so
            // the records are not needed to place it.
            Some(mut changed) => {
                // A pod to reinspect is rebuilt too: its record was kept, unchanged or
                // not, and it is diffed against what the lists say now. So is one to
                // read again.
                changed.extend(self.reinspect.iter().cloned());
                changed.extend(self.reread.iter().cloned());
                // Held pods are reported whether they changed or not.
                let uids: Vec<Cow<'v, str>> = changed
                    .iter()
                    .chain(self.records.keys().filter(|uid| held(uid)))
                    .map(owned)
                    .collect();
                Plan::by_pod(uids, view, |uid| changed.contains(uid), self.chunk_pods)
            }
            None => all(self),
        }
    }

    /// The work of one chunk of a global relist: its pods' records built from their
    /// list entries (or taken from `built`, every pod's built at once) and diffed.
    fn chunk_work(
        &self,
        view: &ListView<'_>,
        plan: &Plan<'_>,
        range: Range<usize>,
        mut built: Option<&mut RecordTable>,
        held: &dyn Fn(&str) -> bool,
        left_held: &mut Vec<String>,
    ) -> Result<Vec<Work>, RuntimeError> {
        let (mut current, (sandboxes, unlabeled), containers, last) = match plan.entries_of(&range)
        {
            Some(entries) => {
                let sandboxes = owned_sandboxes(
                    entries
                        .sandboxes
                        .iter()
                        .map(|&(i, _)| &view.sandboxes()[i as usize]),
                )?;
                let containers: Vec<_> = entries
                    .containers
                    .iter()
                    .map(|&(i, _)| view.containers()[i as usize].to_container())
                    .collect();
                let current = match built {
                    Some(_) => HashMap::new(),
                    None => group(&sandboxes.0, &containers, &HashMap::new()),
                };
                (current, sandboxes, containers, Some(entries))
            }
            None => {
                let sandboxes = owned_sandboxes(view.sandboxes().iter())?;
                let containers: Vec<_> = view
                    .containers()
                    .iter()
                    .map(ContainerRef::to_container)
                    .collect();
                let current = group(&sandboxes.0, &containers, &self.records);
                (current, sandboxes, containers, None)
            }
        };
        // Indexed by id: the last listed entry of an id over the whole lists.
        let (sandbox_index, container_index) = match &last {
            Some(entries) => (
                index_last(&sandboxes, &entries.sandboxes, |s| s.id.as_str()),
                index_last(&containers, &entries.containers, |c| c.id.as_str()),
            ),
            None => (index_sandboxes(&sandboxes), index_containers(&containers)),
        };
        let mut work = Vec::new();
        for uid in &plan.uids[range] {
            if held(uid) {
                left_held.push(uid.to_string());
                continue;
            }
            let (uid, new) = match built.as_deref_mut() {
                Some(built) => match built.remove_entry(uid.as_ref()) {
                    Some((uid, rec)) => (uid, Some(rec)),
                    None => (uid.to_string(), None),
                },
                None => {
                    let new = current.remove(uid.as_ref());
                    (uid.to_string(), new)
                }
            };
            let changes = pod_events(self.records.get(&uid), new.as_ref());
            let reinspect = self.reinspect.contains(&uid);
            if changes.is_empty() && !reinspect && !self.reread.contains(&uid) {
                continue;
            }
            let listed = listed_of(
                &uid,
                new.as_ref(),
                &sandbox_index,
                &container_index,
                &unlabeled,
            );
            work.push(Work {
                uid,
                source: RelistSource::Global,
                new,
                changes,
                reinspect,
                listed,
                prefetched: HashMap::new(),
            });
        }
        Ok(work)
    }

    /// Whether running containers' statuses are reused from the last reads.
    fn reuses_statuses(&self) -> bool {
        #[cfg(test)]
        return !self.read_every_status;
        #[cfg(not(test))]
        true
    }

    /// The handles a pod's read calls through.
    fn reader(&self) -> Reader {
        Reader {
            runtime: self.runtime.clone(),
            last_reads: self.last_reads.clone().filter(|_| self.reuses_statuses()),
            exit_settle: self.exit_settle,
        }
    }

    /// Reads the status of every pod of `work` (`concurrency` at once, one bound on
    /// the calls in flight for the whole relist), then commits them in order.
    async fn process<F, Fut>(
        &mut self,
        work: Vec<Work>,
        held: &dyn Fn(&str) -> bool,
        beside: &mut Beside<'_>,
        each: &mut F,
    ) -> RelistOutput
    where
        F: FnMut(GlobalStep) -> Fut,
        Fut: Future<Output = ()>,
    {
        let reader = self.reader();
        let calls = Semaphore::new(self.concurrency);
        let mut prefetch = PrefetchCounts::default();
        let reads = futures::stream::iter(work)
            .map(|w| reader.read_status(w, &calls, &mut prefetch))
            .buffered(self.concurrency)
            .collect::<Vec<_>>();
        let reads = beside
            .during(reads, &mut |exits| self.early_deaths(exits, held), each)
            .await;
        let mut out = RelistOutput {
            prefetch,
            ..RelistOutput::default()
        };
        for read in reads {
            self.commit(read, held, &mut out);
        }
        out
    }

    /// Commits one pod's read: its record, its cache update and its events, into
    /// `out`.
    fn commit(&mut self, read: PodRead, held: &dyn Fn(&str) -> bool, out: &mut RelistOutput) {
        let PodRead {
            work: mut w,
            read_at,
            status,
        } = read;
        // A sync took the pod while it was being read: what was read may be an
        // intermediate state. Leave record and cache as they were; the pod is
        // diffed again after the release.
        if held(&w.uid) {
            out.held.push(w.uid);
            return;
        }
        // Deaths reported while this pod was read (or an earlier read of it in this
        // unit: the message may come after that read's commit): the record has
        // them, and a container never comes back from its exit (a list read before
        // it says otherwise). Kept until the unit ends.
        let early = self.early.deaths.get(&w.uid).cloned();
        if let Some(statuses) = &early {
            if let Some(new) = &mut w.new {
                for id in statuses.iter().map(|st| &st.id) {
                    if let Some((_, state)) = new.containers.get_mut(id) {
                        if *state != PlegState::NonExistent {
                            *state = PlegState::Exited;
                        }
                    }
                }
            }
            w.changes = pod_events(self.records.get(&w.uid), w.new.as_ref());
        }
        out.pods_inspected += 1;
        let pod = match (&w.new, self.records.get(&w.uid)) {
            (Some(rec), _) | (None, Some(rec)) => rec.pod.to_pod_ref(),
            (None, None) => {
                // Known only from a failed first read, and now gone.
                out.cache.push(CacheUpdate::Delete {
                    uid: w.uid.clone(),
                    read_at,
                    source: w.source,
                });
                self.reinspect.remove(&w.uid);
                self.reread.remove(&w.uid);
                return;
            }
        };
        // What the events will say of each sandbox and container, from this read
        // (and, for one that is gone, only what the records knew).
        let mut sandbox_ids: HashSet<String> = self
            .records
            .get(&w.uid)
            .map(|r| r.sandboxes.keys().map(Id::to_string).collect())
            .unwrap_or_default();
        if let Some(rec) = &w.new {
            sandbox_ids.extend(rec.sandboxes.keys().map(Id::to_string));
        }
        let details = match &status {
            Some(Ok(st)) => details_of(st),
            _ => HashMap::new(),
        };
        match status {
            None => {
                out.cache.push(CacheUpdate::Delete {
                    uid: w.uid.clone(),
                    read_at,
                    source: w.source,
                });
                if self.records.remove(&w.uid).is_some() && self.keep_records {
                    out.records.push((w.uid.clone(), None));
                }
                self.reinspect.remove(&w.uid);
                self.reread.remove(&w.uid);
            }
            Some(Err(e)) => {
                tracing::debug!(pod = %w.uid, error = %e, "status read failed; will reinspect");
                out.status_errors += 1;
                out.cache.push(CacheUpdate::Set {
                    uid: w.uid.clone(),
                    status: Err(e.to_string()),
                    read_at,
                    source: w.source,
                });
                self.reread.remove(&w.uid);
                self.reinspect.insert(w.uid);
                return;
            }
            Some(Ok(mut status)) => {
                // A status read before a death reported early says what was.
                for st in early.iter().flatten() {
                    let read = status.containers.iter_mut().find(|c| c.id == st.id);
                    if let Some(read) = read.filter(|c| c.state != ContainerState::Exited) {
                        *read = st.clone();
                    }
                }
                let record = w.new.as_ref().or_else(|| self.records.get(&w.uid));
                if record.is_some_and(|r| read_disagrees(r, &status)) {
                    self.reread.insert(w.uid.clone());
                } else {
                    self.reread.remove(&w.uid);
                }
                out.cache.push(CacheUpdate::Set {
                    uid: w.uid.clone(),
                    status: Ok(status),
                    read_at,
                    source: w.source,
                });
                self.reinspect.remove(&w.uid);
                if let Some(rec) = w.new {
                    if self.keep_records {
                        out.records.push((w.uid.clone(), Some(rec.clone())));
                    }
                    // The key moves in: kept where it was made (the first
                    // relist makes every record's key before anything else).
                    self.records.insert(w.uid, rec);
                }
            }
        }
        // The event's time is when this relist read the pod (the read's start), or
        // that of the pod's last event in this unit if later (a death read beside
        // this read, after it began).
        let now = self.early.event_time(&pod.uid, read_at);
        let events_before = out.events.len();
        let source = w.source;
        let published: Vec<_> = w
            .changes
            .iter()
            .filter(|(_, k)| *k != EventKind::ContainerChanged)
            .collect();
        if published.is_empty() && w.reinspect {
            out.events.push(LifecycleEvent {
                revision: 0,
                time: now,
                pod: pod.clone(),
                kind: EventKind::PodSync,
                container_id: String::new(),
                relist_source: source,
                container_name: String::new(),
                sandbox: false,
                attempt: None,
                image: None,
                exit: None,
            });
        }
        // A container gone from this read: its name, attempt and image (which never
        // change in a container's life) as the pod's last read showed them; never
        // its exit, which that read did not see.
        let last = match &self.last_reads {
            Some(reads) if published.iter().any(|(id, _)| !details.contains_key(id)) => reads
                .last_read(&pod.uid)
                .map(|r| details_of(&r.status))
                .unwrap_or_default(),
            _ => HashMap::new(),
        };
        for (id, kind) in published {
            let detail = details.get(id);
            let named = detail.or_else(|| last.get(id));
            out.events.push(LifecycleEvent {
                revision: 0,
                time: now,
                pod: pod.clone(),
                kind: *kind,
                container_id: id.clone(),
                relist_source: source,
                container_name: named.map(|d| d.name.clone()).unwrap_or_default(),
                sandbox: sandbox_ids.contains(id),
                attempt: named.map(|d| d.attempt),
                image: named.and_then(|d| d.image.clone()),
                exit: match kind {
                    EventKind::ContainerDied => detail.and_then(|d| d.exit.clone()),
                    _ => None,
                },
            });
        }
        if out.events.len() > events_before {
            self.early.published(&pod.uid, now);
        }
    }
}

/// [`GenericPleg::early_deaths`], on the fields it needs (a global relist's lists
/// borrow others meanwhile).
fn early_deaths(
    records: &mut Records,
    reinspect: &HashSet<String>,
    early: &mut Reported,
    keep_records: bool,
    mut exits: EarlyExits,
    held: &dyn Fn(&str) -> bool,
) -> RelistOutput {
    // A pod awaiting reinspection (its last status read failed) reports nothing
    // early: its cache entry holds the error, and the read that clears it says
    // what changed (or PodSync).
    if held(&exits.uid) || reinspect.contains(&exits.uid) {
        return RelistOutput::default();
    }
    let uid = exits.uid.clone();
    // Not before the pod's last event in this unit (a read committed meanwhile).
    exits.read_at = early.event_time(&uid, exits.read_at);
    let time = exits.read_at;
    let Some(mut out) = records.update(&uid, |record| early::apply(record, exits)) else {
        return RelistOutput::default();
    };
    if !out.events.is_empty() {
        early.published(&uid, time);
    }
    if keep_records && !out.events.is_empty() {
        out.records.push((uid.clone(), records.get(&uid).cloned()));
    }
    let statuses: Vec<ContainerStatus> = out
        .cache
        .iter()
        .filter_map(|u| match u {
            CacheUpdate::Container { status, .. } => Some(status.clone()),
            _ => None,
        })
        .collect();
    if !statuses.is_empty() {
        early.deaths.entry(uid).or_default().extend(statuses);
    }
    out
}

/// What a unit of work reported early (`early` and `beside` modules), until it ends.
#[derive(Default)]
struct Reported {
    /// The statuses of containers whose death it reported early, by pod: the diff of
    /// each read of the pod committed meanwhile is taken again against the record,
    /// they stay exited whatever its lists said, and a status that read took before
    /// the exit gives way to them.
    deaths: HashMap<String, Vec<ContainerStatus>>,
    /// The time of each pod's last event in the unit (where deaths come early, a
    /// read's events may otherwise go back before them).
    times: HashMap<String, SystemTime>,
    /// Deaths may come early in this unit: `times` is kept.
    timing: bool,
}

impl Reported {
    /// The time of an event of `uid` from a read that began at `read_at`: not before
    /// the pod's last event in this unit.
    fn event_time(&self, uid: &str, read_at: SystemTime) -> SystemTime {
        match self.times.get(uid) {
            Some(last) => read_at.max(*last),
            None => read_at,
        }
    }

    /// `uid` got events of `time` in this unit.
    fn published(&mut self, uid: &str, time: SystemTime) {
        if self.timing {
            self.times.insert(uid.to_string(), time);
        }
    }

    /// The unit ended: nothing kept (nor the room a storm's pods took).
    fn clear(&mut self) {
        if !self.deaths.is_empty() || !self.times.is_empty() {
            *self = Reported::default();
        }
        self.timing = false;
    }
}

/// The listed sandboxes `refs`, owned, and the IDs of those listed without their
/// labels ([`SandboxRef::to_sandbox`]).
fn owned_sandboxes<'a, 'v: 'a>(
    refs: impl Iterator<Item = &'a SandboxRef<'v>>,
) -> Result<(Vec<Sandbox>, HashSet<String>), RuntimeError> {
    let mut unlabeled = HashSet::new();
    let sandboxes = refs
        .map(|r| {
            let (sandbox, labeled) = r.to_sandbox()?;
            if !labeled {
                unlabeled.insert(sandbox.id.clone());
            }
            Ok(sandbox)
        })
        .collect::<Result<Vec<_>, RuntimeError>>()?;
    Ok((sandboxes, unlabeled))
}
/// Entries by id, only those marked as the last listed entry of their id.
fn index_last<'a, T>(
    entries: &'a [T],
    marks: &[(u32, bool)],
    id: impl Fn(&'a T) -> &'a str,
) -> HashMap<&'a str, &'a T> {
    entries
        .iter()
        .zip(marks)
        .filter(|(_, (_, last))| *last)
        .map(|(e, _)| (id(e), e))
        .collect()
}

/// What an event says about one sandbox or container, from the pod's status read.
struct Detail {
    name: String,
    attempt: u32,
    image: Option<String>,
    exit: Option<Exit>,
}

fn details_of(status: &PodStatus) -> HashMap<String, Detail> {
    let mut out = HashMap::new();
    for sb in &status.sandboxes {
        out.insert(
            sb.id.clone(),
            Detail {
                name: String::new(),
                attempt: sb.attempt,
                image: None,
                exit: None,
            },
        );
    }
    for c in &status.containers {
        let exit = (c.state == ContainerState::Exited).then(|| Exit {
            code: c.exit_code,
            reason: non_empty(&c.reason),
            message: non_empty(&c.message),
            started_at: cri_time(c.started_at),
            finished_at: cri_time(c.finished_at),
        });
        out.insert(
            c.id.clone(),
            Detail {
                name: c.name.clone(),
                attempt: c.attempt,
                image: non_empty(&c.image),
                exit,
            },
        );
    }
    out
}
