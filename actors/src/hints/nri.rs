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
//! pod is relisted at once and again after each of [`FOLLOW_UPS`]; a relist that finds
//! nothing new publishes nothing, and one a newer global relist covered is skipped.
//!
//! One connection attempt is one NRI registration: dial the socket, RegisterPlugin,
//! wait for Configure. No socket (NRI disabled in the runtime) is `unsupported`,
//! retried every backoff cap. The runtime closing the connection (its restart, or
//! plegd missing a hook timeout — which the immediate answer rules out) ends the
//! stream; the watcher reconnects with the usual backoff.

use std::io;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::future::LocalBoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt as _};
use plegd_nri::{NriHint, Plugin, PluginConfig, SessionEnd};
use plegd_telemetry::{HintSourceName, Metrics, RequestResult};
use tokio::sync::mpsc;

use crate::event::RelistSource;
use crate::hints::{Hint, HintSource, ItemContext, ItemStream, SourceError};

/// Hints waiting between the plugin's hook handlers and the watcher.
const HINT_QUEUE: usize = 1024;

/// When a hook's pod is read again after the immediate read (since the hook): the
/// runtime's status catches up with the hook within these in the usual case, and the
/// global relist (default every second) covers the rest.
pub(crate) const FOLLOW_UPS: [Duration; 5] = [
    Duration::from_millis(25),
    Duration::from_millis(75),
    Duration::from_millis(150),
    Duration::from_millis(300),
    Duration::from_millis(600),
];

pub struct Nri {
    config: PluginConfig,
    metrics: Arc<Metrics>,
}

impl Nri {
    pub fn new(config: PluginConfig, metrics: Arc<Metrics>) -> Self {
        Nri { config, metrics }
    }
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
    let by_uid = |uid: String| Hint::Pod { uid, cause: None };
    match item {
        NriHint::Synchronized { .. } => Some(Hint::Global),
        NriHint::Container {
            pod, container_id, ..
        } => match pod.filter(|p| !p.uid.is_empty()) {
            Some(pod) => Some(by_uid(pod.uid)),
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
) -> ItemStream<NriHint> {
    let mut later = FuturesUnordered::new();
    let mut end = Some(end);
    futures::stream::poll_fn(move |cx| {
        if let Poll::Ready(Some(hint)) = hints.poll_recv(cx) {
            if !matches!(hint, NriHint::Synchronized { .. }) {
                for delay in FOLLOW_UPS {
                    let again = hint.clone();
                    later.push(tokio::time::sleep(delay).map(move |()| again));
                }
            }
            return Poll::Ready(Some(Ok(hint)));
        }
        if let Poll::Ready(Some(hint)) = later.poll_next_unpin(cx) {
            return Poll::Ready(Some(Ok(hint)));
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

    fn hint(&mut self, item: NriHint, _ctx: ItemContext) -> Option<Hint> {
        hint_of(item)
    }
}

#[cfg(test)]
mod tests {
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
    fn a_call_names_its_pod_by_uid_or_by_id_and_a_synchronize_is_global() {
        let pod_hint = |uid: &str| {
            Some(Hint::Pod {
                uid: uid.into(),
                cause: None,
            })
        };
        let container = |pod| NriHint::Container {
            change: Change::Stopped,
            pod,
            container_id: "c1".into(),
        };
        assert_eq!(hint_of(container(Some(pod("u1", "s1")))), pod_hint("u1"));
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
        assert_eq!(seen[0], (Duration::ZERO, stop.clone()));
        assert!(matches!(seen[1].1, NriHint::Synchronized { .. }));
        for (i, delay) in FOLLOW_UPS.iter().enumerate() {
            assert_eq!(seen[2 + i], (*delay, stop.clone()));
        }
        // The connection's end is an error item, then the stream ends.
        drop(end_tx);
        assert!(items.next().await.expect("the end").is_err());
        assert!(items.next().await.is_none());
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
