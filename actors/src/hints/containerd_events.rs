//! containerd's own event service as a hint source: task exit, OOM and delete events
//! of the CRI namespace (`plegd_runtime::containerd_events`). containerd gives every
//! subscriber every event (1.7 included), so plegd can use it beside any other CRI
//! event consumer. Each event names a container (or sandbox) ID: the cache maps it to
//! its pod, and an ID the cache does not know asks for nothing (the next global
//! relist finds it). `/tasks/oom` asks too, so the next read reports `OOMKilled` as
//! early as the runtime does. Source `containerd_events`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::LocalBoxFuture;
use futures::{FutureExt as _, StreamExt as _};
use plegd_runtime::containerd_events::{self, Envelope, TaskEvent};
use plegd_runtime::RuntimeClient;
use plegd_telemetry::logging::RateLimiter;
use plegd_telemetry::HintSourceName;

use crate::event::RelistSource;
use crate::hints::cri_events::source_error;
use crate::hints::{Hint, HintSource, ItemContext, ItemStream, SourceError};

/// When a task event asks again, until the cache has the container exited (each is
/// a one-pod relist, about 2 ms): every 10 ms at first, then sparser. CRI records an
/// exit only after its `runc delete` (measured: 16-70 ms after the exit on containerd
/// 1.7 and 2.1, up to a second in a burst on two cores); past the last, the global
/// relist finds it.
pub const RECHECKS: &[Duration] = &[
    Duration::from_millis(10),
    Duration::from_millis(20),
    Duration::from_millis(30),
    Duration::from_millis(40),
    Duration::from_millis(50),
    Duration::from_millis(60),
    Duration::from_millis(80),
    Duration::from_millis(100),
    Duration::from_millis(150),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_millis(1000),
    Duration::from_millis(2000),
];

pub struct ContainerdEvents {
    runtime: Arc<dyn RuntimeClient>,
    invalid_log: RateLimiter,
}

impl ContainerdEvents {
    pub fn new(runtime: Arc<dyn RuntimeClient>) -> Self {
        ContainerdEvents {
            runtime,
            invalid_log: RateLimiter::new(Duration::from_secs(30)),
        }
    }
}

impl HintSource for ContainerdEvents {
    type Item = Envelope;

    fn name(&self) -> HintSourceName {
        HintSourceName::ContainerdEvents
    }

    fn relist_source(&self) -> RelistSource {
        RelistSource::ContainerdEvents
    }

    fn describe(&self) -> &'static str {
        "containerd event service"
    }

    fn open(
        &mut self,
        _attempt: u64,
    ) -> LocalBoxFuture<'static, Result<ItemStream<Envelope>, SourceError>> {
        let runtime = self.runtime.clone();
        async move {
            let stream = runtime.task_events().await.map_err(|e| source_error(&e))?;
            Ok(stream
                .map(|item| item.map_err(|e| source_error(&e)))
                .boxed_local())
        }
        .boxed_local()
    }

    /// A relist now and [`RECHECKS`] later: containerd publishes a task's exit (and its
    /// delete, during CRI's own handling of the exit) before CRI records the
    /// container as exited, so the read at once may still find it running.
    fn hint(&mut self, env: Envelope, _: ItemContext) -> Vec<Hint> {
        match containerd_events::read(&env) {
            TaskEvent::Task { container_id, .. } => {
                let later = RECHECKS.iter().map(|&delay| Hint::After {
                    delay,
                    hint: Box::new(Hint::Recheck {
                        id: container_id.clone(),
                    }),
                });
                let now = Hint::Container {
                    id: container_id.clone(),
                };
                std::iter::once(now).chain(later).collect()
            }
            TaskEvent::Other => vec![],
            TaskEvent::Invalid { reason } => {
                if let Some(suppressed) = self.invalid_log.allow(Instant::now()) {
                    tracing::info!(
                        reason,
                        suppressed,
                        "ignoring an invalid containerd task event"
                    );
                }
                vec![]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plegd_runtime::containerd_events::{
        envelope, CRI_NAMESPACE, TOPIC_DELETE, TOPIC_EXIT, TOPIC_OOM,
    };

    fn source() -> ContainerdEvents {
        ContainerdEvents::new(Arc::new(plegd_sim::FakeRuntime::new()))
    }

    fn ctx() -> ItemContext {
        ItemContext {
            attempt_started: None,
        }
    }

    #[test]
    fn a_task_event_asks_for_its_container_now_and_rechecks_later() {
        let mut s = source();
        for topic in [TOPIC_EXIT, TOPIC_OOM, TOPIC_DELETE] {
            let hints = s.hint(envelope(CRI_NAMESPACE, topic, "c1"), ctx());
            assert_eq!(hints.len(), 1 + RECHECKS.len(), "{topic}");
            assert_eq!(hints[0], Hint::Container { id: "c1".into() });
            for (h, &delay) in hints[1..].iter().zip(RECHECKS) {
                let recheck = Box::new(Hint::Recheck { id: "c1".into() });
                assert_eq!(
                    h,
                    &Hint::After {
                        delay,
                        hint: recheck
                    }
                );
            }
        }
        assert!(RECHECKS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn garbage_other_namespaces_and_topics_ask_for_nothing() {
        let mut s = source();
        let mut no_payload = envelope(CRI_NAMESPACE, TOPIC_EXIT, "c1");
        no_payload.event = None;
        let mut garbage = envelope(CRI_NAMESPACE, TOPIC_EXIT, "c1");
        if let Some(any) = garbage.event.as_mut() {
            any.value = vec![0xff; 9];
        }
        for env in [
            no_payload,
            garbage,
            envelope(CRI_NAMESPACE, TOPIC_EXIT, ""),
            envelope("moby", TOPIC_EXIT, "c1"),
            envelope(CRI_NAMESPACE, "/tasks/start", "c1"),
            Envelope::default(),
        ] {
            assert_eq!(s.hint(env.clone(), ctx()), vec![], "{env:?}");
        }
    }
}
