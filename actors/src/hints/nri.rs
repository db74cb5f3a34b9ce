//! The NRI plugin (`plegd-nri`) as a hint source. The runtime calls plegd at each
//! container and sandbox stop and removal, and waits for the answer: the plugin
//! answers at once and hands the call over here through a bounded queue (full: the
//! hint is dropped and counted as a dropped `nri` request; the global relist covers
//! it). A call names the pod with its UID, so its hints are targeted relists of that
//! pod (`relist_source` `nri`); one without a UID is mapped through the cache or the
//! runtime. A Synchronize — the runtime's whole state, sent after every (re)connection
//! — brings the next global relist forward.
//!
//! A stop hook comes early (containerd calls StopContainer while it deletes the task,
//! before CRI records the exit): it is a [`Sign::Imminent`] of the stop and asks for
//! that sign's rechecks (`rechecks.rs`) unless another source already runs them; a
//! removal is read at once and until the pod's read no longer has it. A stop hook is
//! announced to the CRI stream's bookkeeping (`cri_stops.rs`): while that stream
//! reports stops, the rechecks begin at its grace, and none is asked once it has
//! reported the stop.
//!
//! One connection attempt is one NRI registration: dial the socket, RegisterPlugin,
//! wait for Configure. No socket, or nobody listening on it, while the runtime answers
//! CRI (for [`NRI_GRACE`] since its last failure) means the runtime runs without NRI:
//! `unsupported`, and the socket is looked for again every [`LOOK_AGAIN`]; while CRI
//! fails or has just come back (a runtime restarting) it is an ordinary failure,
//! retried with the capped backoff. The runtime closing the connection (its restart,
//! or plegd missing a hook timeout — which the immediate answer rules out) ends the
//! stream; the watcher reconnects with the usual backoff.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::LocalBoxFuture;
use futures::{FutureExt as _, StreamExt as _};
use plegd_nri::{Change, NriHint, Plugin, PluginConfig, SessionEnd};
use plegd_telemetry::{HintSourceName, Metrics, RequestResult};
use tokio::sync::mpsc;

use crate::event::RelistSource;
use crate::health::Health;
use crate::hints::coverage::Coverage;
use crate::hints::cri_stops::{CriStops, Expect};
use crate::hints::rechecks::{schedule, Awaited, Rechecks, Sign};
use crate::hints::{Hint, HintSource, ItemContext, ItemStream, SourceError};

/// Hints waiting between the plugin's hook handlers and the watcher.
const HINT_QUEUE: usize = 1024;

/// How long the runtime must have answered CRI before a missing or refusing NRI
/// socket means it has no NRI (containerd opens its NRI socket while it starts).
pub const NRI_GRACE: Duration = Duration::from_secs(10);
/// How often a runtime without NRI is looked at again for its socket.
pub const LOOK_AGAIN: Duration = Duration::from_secs(2);

pub struct Nri {
    config: PluginConfig,
    metrics: Arc<Metrics>,
    stops: CriStops,
    rechecks: Rechecks,
    health: Health,
    coverage: Coverage,
}

impl Nri {
    pub fn new(
        config: PluginConfig,
        metrics: Arc<Metrics>,
        (stops, rechecks, coverage): (CriStops, Rechecks, Coverage),
        health: Health,
    ) -> Self {
        Nri {
            config,
            metrics,
            stops,
            rechecks,
            health,
            coverage,
        }
    }

    /// What a stop or removal of `id` (`sandbox`: a sandbox's) in pod `uid` asks for.
    fn change(&self, id: &str, uid: Option<String>, change: Change, sandbox: bool) -> Vec<Hint> {
        let now = Instant::now();
        let (sign, awaited) = match change {
            Change::Stopped => (Sign::Imminent, Sign::Imminent.awaited(sandbox)),
            Change::Removed => (Sign::Removed, Awaited::Removed),
        };
        let expect = match change {
            Change::Stopped => {
                self.coverage.reported(HintSourceName::Nri, id, now);
                self.stops.announce(id, now)
            }
            Change::Removed => Expect::Unknown,
        };
        if expect == Expect::Reported || !self.rechecks.claim(id, awaited, sign, now) {
            return Vec::new();
        }
        schedule(id, uid.as_deref(), sign, awaited, expect)
    }
}

/// How a failed registration counts: no socket, or nobody listening on it, while the
/// runtime has answered CRI for `answering` (None: it does not answer now).
fn source_error(
    end: &SessionEnd,
    config: &PluginConfig,
    answering: Option<Duration>,
) -> SourceError {
    match end {
        SessionEnd::Connect(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            let path = config.socket().display();
            match answering {
                Some(up) if up >= NRI_GRACE => SourceError::absent(
                    format!("no NRI socket at {path} ({e}) while the runtime answers CRI: NRI is not enabled in the runtime"),
                    LOOK_AGAIN,
                ),
                _ => SourceError::failed(format!(
                    "no NRI socket at {path} ({e}); the runtime is down or starting"
                )),
            }
        }
        other => SourceError::failed(other.to_string()),
    }
}

/// The hooks' hints as they come, and the connection's end as an error.
fn hints_until(
    mut hints: mpsc::Receiver<NriHint>,
    end: LocalBoxFuture<'static, SessionEnd>,
) -> ItemStream<NriHint> {
    let ended = futures::stream::once(end)
        .map(|session_end| Err(SourceError::failed(session_end.to_string())));
    let hints = futures::stream::poll_fn(move |cx| hints.poll_recv(cx)).map(Ok);
    futures::stream::select(hints, ended).boxed_local()
}

impl HintSource for Nri {
    type Item = NriHint;

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
        let health = self.health.clone();
        async move {
            let established = plugin
                .establish()
                .await
                .map_err(|end| source_error(&end, &config, health.answering_for(Instant::now())))?;
            // The connection lives in this stream: dropping the stream closes it.
            let end = established.ended().boxed_local();
            Ok(hints_until(rx, end))
        }
        .boxed_local()
    }

    fn hint(&mut self, hint: NriHint, _ctx: ItemContext) -> Vec<Hint> {
        let uid = |uid: String| Some(uid).filter(|u| !u.is_empty());
        match hint {
            NriHint::Synchronized { .. } => vec![Hint::Global],
            NriHint::Container {
                change,
                pod,
                container_id,
            } => self.change(&container_id, pod.and_then(|p| uid(p.uid)), change, false),
            NriHint::Sandbox { change, pod } if !pod.sandbox_id.is_empty() => {
                self.change(&pod.sandbox_id, uid(pod.uid), change, true)
            }
            NriHint::Sandbox { pod, .. } => uid(pod.uid)
                .map(|uid| Hint::Pod {
                    uid,
                    cause: None,
                    container: None,
                })
                .into_iter()
                .collect(),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use plegd_nri::{Change, PodRef};
    use plegd_runtime::{ContainerState, SandboxState};
    use std::time::SystemTime;

    fn pod(uid: &str, sandbox: &str) -> PodRef {
        PodRef {
            uid: uid.into(),
            sandbox_id: sandbox.into(),
            ..PodRef::default()
        }
    }

    fn source(stops: CriStops) -> Nri {
        Nri::new(
            PluginConfig::new("/nonexistent"),
            Arc::new(Metrics::new()),
            (stops, Rechecks::default(), Coverage::default()),
            Health::new(Duration::from_secs(180)),
        )
    }

    fn ctx() -> ItemContext {
        ItemContext {
            attempt_started: None,
        }
    }

    fn stopped(uid: &str, id: &str) -> NriHint {
        NriHint::Container {
            change: Change::Stopped,
            pod: Some(pod(uid, "s1")),
            container_id: id.into(),
        }
    }

    #[test]
    fn a_hook_asks_for_its_signs_rechecks_by_uid_or_by_id_and_a_synchronize_is_global() {
        let mut s = source(CriStops::default());
        // A stop hook: the imminent stop's rechecks, of the pod by UID.
        assert_eq!(
            s.hint(stopped("u1", "c1"), ctx()),
            schedule(
                "c1",
                Some("u1"),
                Sign::Imminent,
                Awaited::Exited,
                Expect::Unknown
            )
        );
        // Without a UID: by ID (the cache or the runtime maps it).
        assert_eq!(
            s.hint(stopped("", "c2"), ctx()),
            schedule("c2", None, Sign::Imminent, Awaited::Exited, Expect::Unknown)
        );
        // A removal: at once and a little later, until gone.
        let removed = NriHint::Container {
            change: Change::Removed,
            pod: None,
            container_id: "c1".into(),
        };
        assert_eq!(
            s.hint(removed, ctx()),
            schedule("c1", None, Sign::Removed, Awaited::Removed, Expect::Unknown)
        );
        // Sandboxes alike; one without an ID by its UID, once.
        let sandbox = |change, pod| NriHint::Sandbox { change, pod };
        assert_eq!(
            s.hint(sandbox(Change::Stopped, pod("u2", "s2")), ctx()),
            schedule(
                "s2",
                Some("u2"),
                Sign::Imminent,
                Awaited::SandboxStopped,
                Expect::Unknown
            )
        );
        assert_eq!(
            s.hint(sandbox(Change::Removed, pod("u3", "")), ctx()),
            vec![Hint::Pod {
                uid: "u3".into(),
                cause: None,
                container: None
            }]
        );
        assert_eq!(s.hint(sandbox(Change::Removed, pod("", "")), ctx()), vec![]);
        assert_eq!(
            s.hint(
                NriHint::Synchronized {
                    pods: 3,
                    containers: 4
                },
                ctx()
            ),
            vec![Hint::Global]
        );
    }

    /// containerd's delete of the task comes with NRI's stop hook: whichever comes
    /// second asks for nothing.
    #[test]
    fn a_stop_another_source_rechecks_asks_for_nothing() {
        let mut s = source(CriStops::default());
        assert!(s
            .rechecks
            .claim("c1", Awaited::Exited, Sign::Imminent, Instant::now()));
        assert_eq!(s.hint(stopped("u1", "c1"), ctx()), vec![]);
        // Once per stop: the hook again (a duplicate call) asks for nothing either.
        assert!(!s.hint(stopped("u1", "c2"), ctx()).is_empty());
        assert_eq!(s.hint(stopped("u1", "c2"), ctx()), vec![]);
    }

    /// While the CRI stream reports the stops, a stop hook (which containerd calls
    /// before its CRI status says EXITED) asks for no read before the grace, and none
    /// once the stream reported the stop; removals as before.
    #[test]
    fn while_the_cri_stream_reports_stops_a_stop_hook_waits_for_its_grace() {
        let stops = crate::hints::cri_stops::reporting_stream(Duration::from_millis(40));
        let grace = stops.grace().expect("a grace");
        let mut s = source(stops.clone());
        let hints = s.hint(stopped("u1", "c1"), ctx());
        assert_eq!(
            hints,
            schedule(
                "c1",
                Some("u1"),
                Sign::Imminent,
                Awaited::Exited,
                Expect::Within(grace)
            )
        );
        assert!(matches!(&hints[0], Hint::After { delay, .. } if *delay == grace));
        stops.reported("c2", Instant::now());
        assert_eq!(s.hint(stopped("u1", "c2"), ctx()), vec![]);
        // The stream down: from the sign on.
        stops.set_streaming(false);
        assert_eq!(
            s.hint(stopped("u1", "c3"), ctx()),
            schedule(
                "c3",
                Some("u1"),
                Sign::Imminent,
                Awaited::Exited,
                Expect::Unknown
            )
        );
    }

    /// Regression: after a containerd restart the first reconnect met the socket
    /// missing (SIGTERM) or refusing (SIGKILL) while containerd was still starting, and
    /// NRI went `unsupported`, retried only every reconnect cap (NRI back 60 s after the
    /// kill). Now a missing or refusing socket is `unsupported` only while the runtime
    /// has answered CRI for NRI_GRACE; otherwise an ordinary failure.
    #[test]
    fn no_socket_is_unsupported_only_while_the_runtime_answers_cri() {
        let config = PluginConfig::new("/nonexistent/nri.sock");
        let missing = || SessionEnd::Connect(io::Error::from(io::ErrorKind::NotFound));
        let refused = || SessionEnd::Connect(io::Error::from(io::ErrorKind::ConnectionRefused));
        let denied = SessionEnd::Connect(io::Error::from(io::ErrorKind::PermissionDenied));
        for end in [missing(), refused()] {
            let e = source_error(&end, &config, Some(NRI_GRACE));
            assert_eq!(
                e.end,
                crate::hints::AttemptEnd::Absent { retry: LOOK_AGAIN },
                "{e:?}"
            );
            assert!(e.reason.contains("/nonexistent/nri.sock"), "{}", e.reason);
            for answering in [None, Some(Duration::ZERO), Some(NRI_GRACE / 2)] {
                let e = source_error(&end, &config, answering);
                assert_eq!(e.end, crate::hints::AttemptEnd::Failed, "{answering:?}");
                assert!(e.reason.contains("down or starting"), "{}", e.reason);
            }
        }
        assert_eq!(
            source_error(&denied, &config, Some(NRI_GRACE)).end,
            crate::hints::AttemptEnd::Failed
        );
        let timeout = SessionEnd::RegistrationTimeout(std::time::Duration::from_secs(5));
        assert_eq!(
            source_error(&timeout, &config, Some(NRI_GRACE)).end,
            crate::hints::AttemptEnd::Failed
        );
    }

    /// The hooks' hints as they come; the connection's end is an error item.
    #[tokio::test]
    async fn the_hooks_come_as_they_are_called_and_the_end_as_an_error() {
        let (tx, rx) = mpsc::channel(8);
        let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
        let end = async move {
            let _ = end_rx.await;
            SessionEnd::Closed(plegd_nri::mux::MuxEnd::PeerClosed)
        };
        let mut items = hints_until(rx, end.boxed_local());
        tx.send(stopped("u1", "c1")).await.unwrap();
        let first = items.next().await.expect("an item").expect("a hint");
        assert_eq!(first, stopped("u1", "c1"));
        drop(end_tx);
        assert!(items.next().await.expect("the end").is_err());
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
}
