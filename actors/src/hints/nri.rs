//! The NRI plugin (`plegd-nri`) as a hint source. The runtime calls plegd at each
//! container and sandbox stop and removal, and waits for the answer: the plugin
//! answers at once and hands the call over here through a bounded queue (full: the
//! hint is dropped and counted as a dropped `nri` request; the global relist covers
//! it). A call names the pod with its UID, so a hint is a targeted relist of that pod
//! (`relist_source` `nri`); one without a UID is mapped through the cache. A
//! Synchronize — the runtime's whole state, sent after every (re)connection — brings
//! the next global relist forward.
//!
//! One connection attempt is one NRI registration: dial the socket, RegisterPlugin,
//! wait for Configure. No socket (NRI disabled in the runtime) is `unsupported`,
//! retried every backoff cap. The runtime closing the connection (its restart, or
//! plegd missing a hook timeout — which the immediate answer rules out) ends the
//! stream; the watcher reconnects with the usual backoff.

use std::io;
use std::sync::Arc;

use futures::future::LocalBoxFuture;
use futures::{FutureExt as _, StreamExt as _};
use plegd_nri::{NriHint, Plugin, PluginConfig, SessionEnd};
use plegd_telemetry::{HintSourceName, Metrics, RequestResult};
use tokio::sync::mpsc;

use crate::event::RelistSource;
use crate::hints::{Hint, HintSource, ItemContext, ItemStream, SourceError};

/// Hints waiting between the plugin's hook handlers and the watcher.
const HINT_QUEUE: usize = 1024;

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
            let hints = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|hint| (Ok(hint), rx))
            });
            // The connection lives in this stream: dropping the stream closes it.
            let end = futures::stream::once(established.ended())
                .map(|end| Err(SourceError::failed(end.to_string())));
            Ok(futures::stream::select(hints, end).boxed_local())
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
