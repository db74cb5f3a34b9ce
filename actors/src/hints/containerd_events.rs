//! containerd's own event service as a hint source: task exit, OOM and delete events
//! of the CRI namespace (`plegd_runtime::containerd_events`). containerd gives every
//! subscriber every event (1.7 included), so plegd can use it beside any other CRI
//! event consumer. Each event names a container (or sandbox) ID: the cache maps it to
//! its pod, and an ID the cache does not know asks for nothing (the next global
//! relist finds it). `/tasks/oom` asks too, so the next read reports `OOMKilled` as
//! early as the runtime does. Source `containerd_events`.
//!
//! Each task event is announced to the CRI stream's bookkeeping (`cri_stops.rs`):
//! while that stream reports the stops, the pod is read only after its grace, and no
//! more once the stream has reported it.

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
use crate::hints::cri_stops::{CriStops, Expect};
use crate::hints::{Hint, HintSource, ItemContext, ItemStream, SourceError};

/// When a task event asks again, until the cache has the container exited (each is
/// a one-pod relist, about 2 ms): every 10 ms at first, then sparser. CRI records an
/// exit only after its `runc delete` (measured: 16-70 ms after the exit on containerd
/// 1.7 and 2.1, over a second in a burst on two cores); past the last, the global
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
    Duration::from_millis(3500),
    Duration::from_millis(5000),
];

pub struct ContainerdEvents {
    runtime: Arc<dyn RuntimeClient>,
    invalid_log: RateLimiter,
    stops: CriStops,
}

impl ContainerdEvents {
    pub fn new(runtime: Arc<dyn RuntimeClient>, stops: CriStops) -> Self {
        ContainerdEvents {
            runtime,
            invalid_log: RateLimiter::new(Duration::from_secs(30)),
            stops,
        }
    }
}

/// What a task event of `id` asks for: a relist now and [`RECHECKS`] later — or, when
/// the CRI stream should report the stop within `grace`, the same schedule from the
/// grace on (rechecks, each dropped once the stream has reported the stop: a stop it
/// misses is still read as densely as before); nothing when the stream already
/// reported it.
fn schedule(id: &str, expect: Expect) -> Vec<Hint> {
    let recheck = |delay| Hint::After {
        delay,
        hint: Box::new(Hint::Recheck { id: id.to_string() }),
    };
    match expect {
        Expect::Reported => vec![],
        Expect::Unknown => std::iter::once(Hint::Container { id: id.to_string() })
            .chain(RECHECKS.iter().map(|&d| recheck(d)))
            .collect(),
        Expect::Within(grace) => std::iter::once(recheck(grace))
            .chain(RECHECKS.iter().map(|&d| recheck(grace + d)))
            .collect(),
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

    /// A relist now and [`RECHECKS`] later (see [`schedule`]): containerd publishes a
    /// task's exit (and its delete, during CRI's own handling of the exit) before CRI
    /// records the container as exited, so the read at once may still find it running.
    fn hint(&mut self, env: Envelope, _: ItemContext) -> Vec<Hint> {
        match containerd_events::read(&env) {
            TaskEvent::Task { container_id, .. } => {
                let expect = self.stops.announce(&container_id, Instant::now());
                schedule(&container_id, expect)
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
        ContainerdEvents::new(Arc::new(plegd_sim::FakeRuntime::new()), CriStops::default())
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

    /// A CRI stream that is up and reported `MIN_LAGS` stops 40 ms after an early
    /// source announced them: the grace is 40 ms.
    fn reporting_stream() -> CriStops {
        crate::hints::cri_stops::reporting_stream(Duration::from_millis(40))
    }

    /// Regression (issue 11): while the CRI stream reports the stops, a task event
    /// asked for a read at once and every 10 ms until the runtime's CRI status flipped —
    /// reads that could only find the container running (the stream's own event comes
    /// right after the flip), loading containerd while it finished the exit (+16 ms p50
    /// on containerd 1.7). Now: the first read at the grace, none once reported.
    #[test]
    fn while_the_cri_stream_reports_stops_a_task_event_waits_for_its_grace() {
        let stops = reporting_stream();
        let grace = stops.grace().expect("a grace");
        assert_eq!(grace, Duration::from_millis(40));
        let mut s = ContainerdEvents::new(Arc::new(plegd_sim::FakeRuntime::new()), stops.clone());
        let hints = s.hint(envelope(CRI_NAMESPACE, TOPIC_EXIT, "c1"), ctx());
        let recheck = |delay| Hint::After {
            delay,
            hint: Box::new(Hint::Recheck { id: "c1".into() }),
        };
        let later: Vec<Hint> = RECHECKS.iter().map(|&d| recheck(grace + d)).collect();
        assert_eq!(hints[0], recheck(grace));
        assert_eq!(hints[1..], later[..]);
        assert!(!hints.iter().any(|h| matches!(h, Hint::Container { .. })));
        // The stream reports it; the task's delete event then asks for nothing.
        stops.reported("c1", Instant::now());
        assert_eq!(
            s.hint(envelope(CRI_NAMESPACE, TOPIC_DELETE, "c1"), ctx()),
            vec![]
        );
        // The stream down: a read at once again.
        stops.set_streaming(false);
        let hints = s.hint(envelope(CRI_NAMESPACE, TOPIC_EXIT, "c2"), ctx());
        assert_eq!(hints[0], Hint::Container { id: "c2".into() });
        assert_eq!(hints.len(), 1 + RECHECKS.len());
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
