//! The NRI plugin (`plegd-nri`) as a hint source. The runtime calls plegd at each
//! container and sandbox stop and removal, and waits for the answer: the plugin
//! answers at once and hands the call over here through a bounded queue (full: the
//! hint is dropped and counted as a dropped `nri` request; the global relist covers
//! it). A call names the pod with its UID, so a hint is a targeted relist of that pod
//! (`relist_source` `nri`); one without a UID is mapped through the cache. A
//! Synchronize — the runtime's whole state, sent after every (re)connection — brings
//! the next global relist forward.
//!
//! A hook comes early: containerd 1.7 calls StopContainer from inside the task's
//! deletion, before its CRI status says EXITED (measured: a ContainerStatus 3.5 ms
//! after the hook still read RUNNING; the status flips once `runc delete` is done,
//! tens of milliseconds later, up to about a second in a burst of exits). So a hook's
//! pod is relisted at once and again after each of [`FOLLOW_UPS`] — unless the cache
//! already shows what the hook announced (the container exited or gone, the sandbox
//! not ready or gone): a burst of exits does not multiply into a burst of reads.
//! A stop hook is announced to the CRI stream's bookkeeping (`cri_stops.rs`): while
//! that stream reports the stops, the hook's pod is read only from the first follow-up
//! past the grace, and no more once the stream has reported it (its own relist reads
//! the pod after the runtime recorded the stop).
//!
//! One connection attempt is one NRI registration: dial the socket, RegisterPlugin,
//! wait for Configure. No socket (NRI disabled in the runtime) is `unsupported`,
//! retried every backoff cap. The runtime closing the connection (its restart, or
//! plegd missing a hook timeout — which the immediate answer rules out) ends the
//! stream; the watcher reconnects with the usual backoff.

use std::cell::Cell;
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime};

use futures::future::LocalBoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt as _};
use plegd_nri::{Change, NriHint, Plugin, PluginConfig, SessionEnd};
use plegd_runtime::{ContainerState, SandboxState};
use plegd_telemetry::{HintSourceName, Metrics, RequestResult};
use tokio::sync::mpsc;

use crate::cache::PodCache;
use crate::event::RelistSource;
use crate::hints::cri_stops::{CriStops, Expect};
use crate::hints::{Hint, HintSource, ItemContext, ItemStream, SourceError};

/// Hints waiting between the plugin's hook handlers and the watcher.
const HINT_QUEUE: usize = 1024;

/// When a hook's pod is read again after the immediate read (since the hook), until
/// the cache shows what the hook announced: densely where the runtime's status
/// usually catches up (measured on containerd 1.7: EXITED 55–200 ms after the hook),
/// then sparser, for runtimes slowed by a burst of exits. The global relist (every
/// second by default) covers whatever is left.
pub(crate) const FOLLOW_UPS: [Duration; 13] = [
    Duration::from_millis(20),
    Duration::from_millis(40),
    Duration::from_millis(60),
    Duration::from_millis(80),
    Duration::from_millis(100),
    Duration::from_millis(150),
    Duration::from_millis(200),
    Duration::from_millis(300),
    Duration::from_millis(500),
    Duration::from_millis(800),
    Duration::from_millis(1_200),
    Duration::from_millis(2_000),
    Duration::from_millis(3_000),
];

/// One call of the runtime, or a later look at it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    hint: NriHint,
    follow_up: bool,
    /// When the hook came (its follow-ups keep it).
    at: Instant,
    /// Shared by a hook's follow-ups: the read time of the cache entry that first
    /// showed what the hook announced.
    settled_at: Rc<Cell<Option<SystemTime>>>,
}

pub struct Nri {
    config: PluginConfig,
    metrics: Arc<Metrics>,
    /// Read only: whether a follow-up still has something to find.
    cache: PodCache,
    stops: CriStops,
}

impl Nri {
    pub fn new(
        config: PluginConfig,
        metrics: Arc<Metrics>,
        cache: PodCache,
        stops: CriStops,
    ) -> Self {
        Nri {
            config,
            metrics,
            cache,
            stops,
        }
    }

    /// Whether the CRI stream covers a stop hook or its follow-up: it has reported the
    /// stop, or should within its grace (the hook's own read and the follow-ups before
    /// the grace wait for it). Removals and Synchronize are never covered (a CRI event
    /// of a removal asks for no relist).
    fn covered_by_cri(&self, call: &Call) -> bool {
        let id = match &call.hint {
            NriHint::Container {
                change: Change::Stopped,
                container_id,
                ..
            } => container_id.as_str(),
            NriHint::Sandbox {
                change: Change::Stopped,
                pod,
            } => pod.sandbox_id.as_str(),
            _ => return false,
        };
        if id.is_empty() {
            return false;
        }
        if call.follow_up {
            self.stops.was_reported(id)
                || self
                    .stops
                    .grace()
                    .is_some_and(|grace| call.at.elapsed() < grace)
        } else {
            self.stops.announce(id, Instant::now()) != Expect::Unknown
        }
    }
}

/// When the cache's entry that shows what `hint` announced was read; `None` while it
/// does not (a pod or container the cache does not know is not settled: the pod may be
/// newer than the last global relist).
///
/// Seeing it settled is not enough to stop: plegd's events come from the container
/// list, its cache from ContainerStatus, and the runtime's status can flip between a
/// relist's two calls — that relist caches EXITED and publishes nothing. Only a read
/// that began after the one showing it settled is sure to have published the change.
fn settled(cache: &PodCache, hint: &NriHint) -> Option<SystemTime> {
    let uid = match hint {
        NriHint::Synchronized { .. } => return None,
        NriHint::Container {
            pod, container_id, ..
        } => pod
            .as_ref()
            .map(|p| p.uid.clone())
            .filter(|u| !u.is_empty())
            .or_else(|| cache.pod_of_container(container_id)),
        NriHint::Sandbox { pod, .. } => Some(pod.uid.clone()).filter(|u| !u.is_empty()),
    };
    let entry = uid.and_then(|uid| cache.get(&uid))?;
    let status = entry.status?;
    let settled = match hint {
        NriHint::Container {
            change,
            container_id,
            ..
        } => match status.containers.iter().find(|c| c.id == *container_id) {
            None => true,
            Some(c) => *change == Change::Stopped && c.state == ContainerState::Exited,
        },
        NriHint::Sandbox { change, pod } => {
            match status.sandboxes.iter().find(|s| s.id == pod.sandbox_id) {
                None => true,
                Some(s) => *change == Change::Stopped && s.state == SandboxState::NotReady,
            }
        }
        NriHint::Synchronized { .. } => false,
    };
    settled.then_some(entry.modified)
}

/// How a failed registration counts: no socket, or nobody listening on it, means the
/// runtime runs without NRI.
fn source_error(end: &SessionEnd, config: &PluginConfig) -> SourceError {
    match end {
        SessionEnd::Connect(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            SourceError::unsupported(format!(
                "no NRI socket at {} ({e}): NRI is not enabled in the runtime",
                config.socket().display()
            ))
        }
        other => SourceError::failed(other.to_string()),
    }
}

/// What one call of the runtime asks for.
fn hint_of(item: NriHint) -> Option<Hint> {
    let by_uid = |uid: String| Hint::Pod {
        uid,
        cause: None,
        container: None,
    };
    match item {
        NriHint::Synchronized { .. } => Some(Hint::Global),
        // The container's status is read together with its pod's lists (prefetch).
        NriHint::Container {
            pod, container_id, ..
        } => match pod.filter(|p| !p.uid.is_empty()) {
            Some(pod) => Some(Hint::Pod {
                uid: pod.uid,
                cause: None,
                container: Some(container_id).filter(|id| !id.is_empty()),
            }),
            None => Some(Hint::Container { id: container_id }),
        },
        NriHint::Sandbox { pod, .. } if !pod.uid.is_empty() => Some(by_uid(pod.uid)),
        NriHint::Sandbox { pod, .. } if !pod.sandbox_id.is_empty() => {
            Some(Hint::Container { id: pod.sandbox_id })
        }
        NriHint::Sandbox { .. } => None,
    }
}

/// The hooks' hints as they come, each container or sandbox hint again after every
/// [`FOLLOW_UPS`] delay, until the connection ends (its end is the last item).
fn with_follow_ups(
    mut hints: mpsc::Receiver<NriHint>,
    end: LocalBoxFuture<'static, SessionEnd>,
) -> ItemStream<Call> {
    let mut later = FuturesUnordered::new();
    let mut end = Some(end);
    futures::stream::poll_fn(move |cx| {
        if let Poll::Ready(Some(hint)) = hints.poll_recv(cx) {
            let settled_at = Rc::new(Cell::new(None));
            let at = Instant::now();
            if !matches!(hint, NriHint::Synchronized { .. }) {
                for delay in FOLLOW_UPS {
                    let again = Call {
                        hint: hint.clone(),
                        follow_up: true,
                        at,
                        settled_at: settled_at.clone(),
                    };
                    later.push(tokio::time::sleep(delay).map(move |()| again));
                }
            }
            let call = Call {
                hint,
                follow_up: false,
                at,
                settled_at,
            };
            return Poll::Ready(Some(Ok(call)));
        }
        if let Poll::Ready(Some(call)) = later.poll_next_unpin(cx) {
            return Poll::Ready(Some(Ok(call)));
        }
        match end.as_mut().map(|e| e.poll_unpin(cx)) {
            Some(Poll::Ready(session_end)) => {
                end = None;
                Poll::Ready(Some(Err(SourceError::failed(session_end.to_string()))))
            }
            Some(Poll::Pending) => Poll::Pending,
            None => Poll::Ready(None),
        }
    })
    .boxed_local()
}

impl HintSource for Nri {
    type Item = Call;

    fn name(&self) -> HintSourceName {
        HintSourceName::Nri
    }

    fn relist_source(&self) -> RelistSource {
        RelistSource::Nri
    }

    fn describe(&self) -> &'static str {
        "NRI plugin"
    }

    fn open(
        &mut self,
        _attempt: u64,
    ) -> LocalBoxFuture<'static, Result<ItemStream<Self::Item>, SourceError>> {
        let (tx, rx) = mpsc::channel(HINT_QUEUE);
        let metrics = self.metrics.clone();
        // Runs in the hook, before the runtime gets its answer: never waits.
        let sink = move |hint: NriHint| {
            if tx.try_send(hint).is_err() {
                metrics.count_request(RequestResult::Dropped, RelistSource::Nri);
            }
        };
        let plugin = Plugin::new(self.config.clone(), sink);
        let config = self.config.clone();
        async move {
            let established = plugin
                .establish()
                .await
                .map_err(|end| source_error(&end, &config))?;
            // The connection lives in this stream: dropping the stream closes it.
            let end = established.ended().boxed_local();
            Ok(with_follow_ups(rx, end))
        }
        .boxed_local()
    }

    fn hint(&mut self, call: Call, _ctx: ItemContext) -> Vec<Hint> {
        if self.covered_by_cri(&call) {
            return Vec::new();
        }
        if call.follow_up {
            if let Some(read_at) = settled(&self.cache, &call.hint) {
                match call.settled_at.get() {
                    // A read after the one that showed it: the change is published.
                    Some(first) if read_at > first => return Vec::new(),
                    Some(_) => {}
                    None => call.settled_at.set(Some(read_at)),
                }
            }
        }
        hint_of(call.hint).into_iter().collect()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use plegd_nri::{Change, PodRef};

    fn pod(uid: &str, sandbox: &str) -> PodRef {
        PodRef {
            uid: uid.into(),
            sandbox_id: sandbox.into(),
            ..PodRef::default()
        }
    }

    #[test]
    fn a_call_names_its_pod_by_uid_or_by_id_its_container_to_prefetch_and_a_synchronize_is_global()
    {
        let pod_hint = |uid: &str| {
            Some(Hint::Pod {
                uid: uid.into(),
                cause: None,
                container: None,
            })
        };
        let container = |pod| NriHint::Container {
            change: Change::Stopped,
            pod,
            container_id: "c1".into(),
        };
        // By UID, its container's status read together with the pod's lists.
        assert_eq!(
            hint_of(container(Some(pod("u1", "s1")))),
            Some(Hint::Pod {
                uid: "u1".into(),
                cause: None,
                container: Some("c1".into()),
            })
        );
        // Without a pod, or with an empty UID: the cache maps the container.
        let by_id = Some(Hint::Container { id: "c1".into() });
        assert_eq!(hint_of(container(None)), by_id);
        assert_eq!(hint_of(container(Some(pod("", "s1")))), by_id);
        let sandbox = |pod| NriHint::Sandbox {
            change: Change::Removed,
            pod,
        };
        assert_eq!(hint_of(sandbox(pod("u2", "s2"))), pod_hint("u2"));
        assert_eq!(
            hint_of(sandbox(pod("", "s2"))),
            Some(Hint::Container { id: "s2".into() })
        );
        assert_eq!(hint_of(sandbox(pod("", ""))), None);
        assert_eq!(
            hint_of(NriHint::Synchronized {
                pods: 3,
                containers: 4
            }),
            Some(Hint::Global)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_hook_is_asked_again_after_each_follow_up_delay_and_the_end_comes_last() {
        let (tx, rx) = mpsc::channel(8);
        let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
        let end = async move {
            let _ = end_rx.await;
            SessionEnd::Closed(plegd_nri::mux::MuxEnd::PeerClosed)
        };
        let mut items = with_follow_ups(rx, end.boxed_local());
        let stop = NriHint::Sandbox {
            change: Change::Stopped,
            pod: pod("u1", "s1"),
        };
        let start = tokio::time::Instant::now();
        tx.send(stop.clone()).await.unwrap();
        tx.send(NriHint::Synchronized {
            pods: 1,
            containers: 0,
        })
        .await
        .unwrap();
        let mut seen = Vec::new();
        for _ in 0..2 + FOLLOW_UPS.len() {
            let item = items.next().await.expect("an item").expect("not the end");
            seen.push((start.elapsed(), item));
        }
        // The hook and the Synchronize at once; the hook again after each delay,
        // the Synchronize never again.
        let what = |(at, call): &(Duration, Call)| (*at, call.hint.clone(), call.follow_up);
        assert_eq!(what(&seen[0]), (Duration::ZERO, stop.clone(), false));
        assert!(matches!(seen[1].1.hint, NriHint::Synchronized { .. }));
        for (i, delay) in FOLLOW_UPS.iter().enumerate() {
            assert_eq!(what(&seen[2 + i]), (*delay, stop.clone(), true));
            // One hook's follow-ups share what they saw.
            assert!(Rc::ptr_eq(&seen[2 + i].1.settled_at, &seen[0].1.settled_at));
        }
        // The connection's end is an error item, then the stream ends.
        drop(end_tx);
        assert!(items.next().await.expect("the end").is_err());
        assert!(items.next().await.is_none());
    }

    /// A cache holding pod `u1`: container `c1` in `c1_state`, sandbox `s1` in
    /// `s1_state`.
    fn cache_with(c1_state: ContainerState, s1_state: SandboxState) -> PodCache {
        let (mut owner, cache) = crate::cache::CacheOwner::new(std::time::Duration::from_secs(300));
        write(&mut owner, c1_state, s1_state);
        cache
    }

    /// A read of pod `u1` (now) into the cache.
    pub(in crate::hints) fn write(
        owner: &mut crate::cache::CacheOwner,
        c1_state: ContainerState,
        s1_state: SandboxState,
    ) {
        write_pod(owner, ("u1", "s1", "c1"), c1_state, s1_state);
    }

    /// A read (now) into the cache of pod `uid` (name `web`, namespace `ns`) with
    /// sandbox `sandbox` and container `container` (`app`).
    pub(in crate::hints) fn write_pod(
        owner: &mut crate::cache::CacheOwner,
        (uid, sandbox, container): (&str, &str, &str),
        c1_state: ContainerState,
        s1_state: SandboxState,
    ) {
        let pod_ref = plegd_runtime::PodRef {
            uid: uid.into(),
            name: "web".into(),
            namespace: "ns".into(),
        };
        let status = crate::pleg::PodStatus {
            pod: pod_ref.clone(),
            sandboxes: vec![plegd_runtime::Sandbox {
                id: sandbox.into(),
                pod: pod_ref,
                attempt: 0,
                state: s1_state,
                created_at: 1,
                labels: Default::default(),
            }],
            containers: vec![plegd_runtime::ContainerStatus {
                id: container.into(),
                sandbox_id: sandbox.into(),
                name: "app".into(),
                attempt: 0,
                state: c1_state,
                created_at: 1,
                started_at: 1,
                finished_at: 0,
                exit_code: 0,
                reason: String::new(),
                message: String::new(),
                image: String::new(),
            }],
        };
        owner.apply(crate::pleg::CacheUpdate::Set {
            uid: uid.into(),
            status: Ok(status),
            read_at: SystemTime::now(),
            source: crate::RelistSource::Global,
        });
    }

    #[test]
    fn a_follow_up_is_skipped_once_the_cache_shows_what_the_hook_announced() {
        use ContainerState::*;
        use SandboxState::*;
        let ctr = |change, uid: &str, id: &str| NriHint::Container {
            change,
            pod: Some(pod(uid, "s1")),
            container_id: id.into(),
        };
        let sandbox = |change, id: &str| NriHint::Sandbox {
            change,
            pod: pod("u1", id),
        };
        let running = cache_with(Running, Ready);
        let exited = cache_with(Exited, NotReady);
        // Stopped: settled once exited (or gone), not while running.
        assert!(settled(&running, &ctr(Change::Stopped, "u1", "c1")).is_none());
        assert!(settled(&exited, &ctr(Change::Stopped, "u1", "c1")).is_some());
        assert!(settled(&running, &ctr(Change::Stopped, "u1", "gone")).is_some());
        // Without a UID the cache maps the container.
        assert!(settled(&exited, &ctr(Change::Stopped, "", "c1")).is_some());
        // Removed: settled only once gone.
        assert!(settled(&exited, &ctr(Change::Removed, "u1", "c1")).is_none());
        assert!(settled(&exited, &ctr(Change::Removed, "u1", "gone")).is_some());
        // Sandboxes alike.
        assert!(settled(&running, &sandbox(Change::Stopped, "s1")).is_none());
        assert!(settled(&exited, &sandbox(Change::Stopped, "s1")).is_some());
        assert!(settled(&exited, &sandbox(Change::Removed, "s1")).is_none());
        assert!(settled(&exited, &sandbox(Change::Removed, "s2")).is_some());
        // A pod the cache does not know: keep looking.
        assert!(settled(&exited, &ctr(Change::Stopped, "u9", "c9")).is_none());
    }

    #[test]
    fn follow_ups_stop_once_a_read_after_the_one_showing_the_exit_is_in() {
        use ContainerState::*;
        use SandboxState::*;
        let (mut owner, cache) = crate::cache::CacheOwner::new(std::time::Duration::from_secs(300));
        write(&mut owner, Running, Ready);
        let mut source = Nri::new(
            PluginConfig::new("/nonexistent"),
            Arc::new(Metrics::new()),
            cache,
            CriStops::default(),
        );
        let ctx = ItemContext {
            attempt_started: None,
        };
        let settled_at = Rc::new(Cell::new(None));
        let at = Instant::now();
        let call = |follow_up| Call {
            hint: NriHint::Container {
                change: Change::Stopped,
                pod: Some(pod("u1", "s1")),
                container_id: "c1".into(),
            },
            follow_up,
            at,
            settled_at: settled_at.clone(),
        };
        let asks = |h: Vec<Hint>| matches!(h.as_slice(), [Hint::Pod { .. }]);
        // The hook always asks; a follow-up asks while the cache says running.
        assert!(asks(source.hint(call(false), ctx)));
        assert!(asks(source.hint(call(true), ctx)));
        // A read cached EXITED (maybe one whose container list still said running:
        // nothing published): the follow-ups still ask, until a later read is in.
        std::thread::sleep(Duration::from_millis(2));
        write(&mut owner, Exited, Ready);
        assert!(asks(source.hint(call(true), ctx)));
        assert!(asks(source.hint(call(true), ctx)));
        std::thread::sleep(Duration::from_millis(2));
        write(&mut owner, Exited, Ready);
        assert!(source.hint(call(true), ctx).is_empty());
        assert!(source.hint(call(true), ctx).is_empty());
        // The hook itself always asks.
        assert!(asks(source.hint(call(false), ctx)));
    }

    /// Regression (issue 11): while the CRI stream reports the stops, NRI's stop hook
    /// (which containerd calls before its CRI status says EXITED) asked for a read at
    /// once and every follow-up until then — reads that could only find the container
    /// running, loading containerd while it finished the exit. Now: none before the
    /// grace, none once the stream reported the stop; removals as before.
    #[test]
    fn while_the_cri_stream_reports_stops_a_stop_hook_waits_for_its_grace() {
        use ContainerState::*;
        use SandboxState::*;
        let stops = crate::hints::cri_stops::reporting_stream(Duration::from_millis(40));
        let grace = stops.grace().expect("a grace");
        let mut source = Nri::new(
            PluginConfig::new("/nonexistent"),
            Arc::new(Metrics::new()),
            cache_with(Running, Ready),
            stops.clone(),
        );
        let ctx = ItemContext {
            attempt_started: None,
        };
        let call = |change, id: &str, follow_up, at| Call {
            hint: NriHint::Container {
                change,
                pod: Some(pod("u1", "s1")),
                container_id: id.into(),
            },
            follow_up,
            at,
            settled_at: Rc::new(Cell::new(None)),
        };
        let asks = |h: Vec<Hint>| matches!(h.as_slice(), [Hint::Pod { .. }]);
        let now = Instant::now();
        // The hook and a follow-up within the grace: nothing.
        assert!(source
            .hint(call(Change::Stopped, "c1", false, now), ctx)
            .is_empty());
        assert!(source
            .hint(call(Change::Stopped, "c1", true, now), ctx)
            .is_empty());
        // A follow-up past the grace (the stream missed the stop): a read.
        let earlier = now - grace - Duration::from_millis(1);
        assert!(asks(
            source.hint(call(Change::Stopped, "c1", true, earlier), ctx)
        ));
        // Once the stream reported it: nothing, whenever.
        stops.reported("c1", Instant::now());
        assert!(source
            .hint(call(Change::Stopped, "c1", true, earlier), ctx)
            .is_empty());
        assert!(source
            .hint(call(Change::Stopped, "c1", false, now), ctx)
            .is_empty());
        // A removal is not the stream's: read at once.
        assert!(asks(
            source.hint(call(Change::Removed, "c1", false, now), ctx)
        ));
        // The stream down: read at once.
        stops.set_streaming(false);
        assert!(asks(
            source.hint(call(Change::Stopped, "c2", false, now), ctx)
        ));
    }

    #[test]
    fn no_socket_is_unsupported_and_anything_else_a_failure() {
        let config = PluginConfig::new("/nonexistent/nri.sock");
        let missing = SessionEnd::Connect(io::Error::from(io::ErrorKind::NotFound));
        let refused = SessionEnd::Connect(io::Error::from(io::ErrorKind::ConnectionRefused));
        let denied = SessionEnd::Connect(io::Error::from(io::ErrorKind::PermissionDenied));
        for end in [missing, refused] {
            let e = source_error(&end, &config);
            assert_eq!(e.end, crate::hints::AttemptEnd::Unimplemented, "{e:?}");
            assert!(e.reason.contains("/nonexistent/nri.sock"), "{}", e.reason);
        }
        assert_eq!(
            source_error(&denied, &config).end,
            crate::hints::AttemptEnd::Failed
        );
        let timeout = SessionEnd::RegistrationTimeout(std::time::Duration::from_secs(5));
        assert_eq!(
            source_error(&timeout, &config).end,
            crate::hints::AttemptEnd::Failed
        );
    }
}
