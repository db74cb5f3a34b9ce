//! The metric set. One [`Metrics`] owns its own registry, so tests can run many
//! instances side by side and read exact values.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::labels::{
    ApiConnectionClose, HintSourceName, HintSourceState, PrefetchResult, RelistPhase, RelistSource,
    RequestResult, ResolveResult, StreamEventType,
};

pub struct Metrics {
    registry: Registry,
    // Generic PLEG (kubelet names).
    pub relist_duration: Histogram,
    pub relist_interval: Histogram,
    pod_relist_duration: HistogramVec,
    pub last_seen: prometheus::Gauge,
    pub discard_events: IntCounter,
    events_total: IntCounterVec,
    relist_errors: IntCounterVec,
    relist_prefetch: IntCounterVec,
    // Relist requests (on-demand queue).
    relist_requests: IntCounterVec,
    pub queue_depth: IntGauge,
    /// Pods waiting for a targeted relist in the dispatcher (taken off the queue).
    pub relist_pending: IntGauge,
    // Evented PLEG stream (kubelet names + stream state).
    pub connection_errors: IntCounter,
    pub connection_successes: IntCounter,
    pub connection_latency: Histogram,
    pub stream_connected: IntGauge,
    pub reconnect_attempts: IntCounter,
    stream_events: IntCounterVec,
    // Subscribers.
    pub subscribers: IntGauge,
    pub subscriber_drops: IntCounter,
    // The publisher's history (for resuming subscribers).
    pub history_events: IntGauge,
    pub history_bytes: IntGauge,
    // The state dir (--state-dir).
    pub state_persisting: IntGauge,
    pub state_bytes: IntGauge,
    pub state_write_failures: IntCounter,
    // Sync gates.
    pub sync_gates: IntGauge,
    // Lifecycle events as OTLP log records (--otlp-events).
    pub otlp_events_exported: IntCounter,
    pub otlp_events_dropped: IntCounter,
    // Hint sources: 1 on each source's current state.
    hint_source_state: IntGaugeVec,
    // Hint IDs the cache did not know, traced to their pods.
    hint_resolutions: IntCounterVec,
    // Published container stops each hint source reported or missed.
    hint_stops: IntCounterVec,
    // Subscriber API connections plegd closed itself.
    api_connections_closed: IntCounterVec,
    // API: refused calls, expired sync holds.
    api_refused: IntCounterVec,
    pub sync_holds_expired: IntCounter,
}

/// Why the API refused a call (`plegd_api_refused_total{method, reason}`): a fixed set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Sync on the read socket (PERMISSION_DENIED).
    SyncOnReadSocket,
    /// RequestRelist on the read socket (PERMISSION_DENIED).
    RelistOnReadSocket,
    /// Sync of a pod plegd does not know while the most such holds are held
    /// (RESOURCE_EXHAUSTED).
    UnknownPodHolds,
    /// RequestRelist while the API clients' budget is full (answered DROPPED).
    RelistBudget,
}

impl Refusal {
    pub const ALL: &'static [Refusal] = &[
        Refusal::SyncOnReadSocket,
        Refusal::RelistOnReadSocket,
        Refusal::UnknownPodHolds,
        Refusal::RelistBudget,
    ];

    /// The `method` and `reason` labels.
    pub fn labels(self) -> [&'static str; 2] {
        match self {
            Refusal::SyncOnReadSocket => ["Sync", "read_socket"],
            Refusal::RelistOnReadSocket => ["RequestRelist", "read_socket"],
            Refusal::UnknownPodHolds => ["Sync", "unknown_pod_holds"],
            Refusal::RelistBudget => ["RequestRelist", "budget"],
        }
    }
}

fn latency_buckets() -> Vec<f64> {
    vec![
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ]
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let hist = |name: &str, help: &str| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(latency_buckets()))
                .expect("static histogram options are valid")
        };
        let counter = |name: &str, help: &str| {
            IntCounter::with_opts(Opts::new(name, help)).expect("static counter options are valid")
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels)
                .expect("static counter options are valid")
        };
        let gauge = |name: &str, help: &str| {
            IntGauge::with_opts(Opts::new(name, help)).expect("static gauge options are valid")
        };
        let m = Metrics {
            relist_duration: hist(
                "kubelet_pleg_relist_duration_seconds",
                "Duration of a global relist (list, diff, status reads, cache update, publish).",
            ),
            relist_interval: hist(
                "kubelet_pleg_relist_interval_seconds",
                "Interval between the starts of two global relists.",
            ),
            pod_relist_duration: HistogramVec::new(
                HistogramOpts::new(
                    "kubelet_pleg_pod_relist_duration_seconds",
                    "Duration of a targeted (one pod) relist, by what asked for it.",
                )
                .buckets(latency_buckets()),
                &["relist_source"],
            )
            .expect("static histogram options are valid"),
            last_seen: prometheus::Gauge::with_opts(Opts::new(
                "kubelet_pleg_last_seen_seconds",
                "Unix time of the last successful global relist.",
            ))
            .expect("static gauge options are valid"),
            discard_events: counter(
                "kubelet_pleg_discard_events",
                "Lifecycle events dropped because a subscriber's queue was full.",
            ),
            events_total: counter_vec(
                "kubelet_pleg_events_total",
                "Lifecycle events generated, by the relist that detected them.",
                &["relist_source"],
            ),
            relist_errors: counter_vec(
                "plegd_relist_errors_total",
                "Relist failures: phase=list (the whole relist failed) or status (one pod's status read).",
                &["phase"],
            ),
            relist_prefetch: counter_vec(
                "plegd_relist_prefetch_total",
                "Container statuses a targeted relist read together with the pod's lists, by what became of them (used, read_again, failed, unused).",
                &["result"],
            ),
            relist_requests: counter_vec(
                "plegd_relist_requests_total",
                "Targeted relist requests by outcome (queued, coalesced, dropped, skipped, done) and source.",
                &["result", "relist_source"],
            ),
            queue_depth: gauge(
                "plegd_relist_queue_depth",
                "Targeted relist requests waiting in the dispatcher's mailbox.",
            ),
            relist_pending: gauge(
                "plegd_relist_pending_pods",
                "Pods whose targeted relist request the dispatcher has taken off its queue and not run yet (one per pod).",
            ),
            connection_errors: counter(
                "kubelet_evented_pleg_connection_error_count",
                "Event stream connection attempts or streams that failed (EOF included).",
            ),
            connection_successes: counter(
                "kubelet_evented_pleg_connection_success_count",
                "Event stream connections that delivered a first event.",
            ),
            connection_latency: hist(
                "kubelet_evented_pleg_connection_latency_seconds",
                "Time from an event's created_at to its receipt by plegd.",
            ),
            stream_connected: gauge(
                "plegd_evented_stream_connected",
                "1 while the CRI event stream is open, else 0.",
            ),
            reconnect_attempts: counter(
                "plegd_evented_reconnect_attempts_total",
                "Event stream reconnect attempts.",
            ),
            stream_events: counter_vec(
                "plegd_evented_stream_events_total",
                "CRI events received, by type (created, started, stopped, deleted, unknown, invalid).",
                &["type"],
            ),
            subscribers: gauge("plegd_subscribers", "Current lifecycle event subscribers."),
            subscriber_drops: counter(
                "plegd_subscriber_dropped_events_total",
                "Events a subscriber missed because its queue was full (each is also in kubelet_pleg_discard_events).",
            ),
            history_events: gauge(
                "plegd_event_history_events",
                "Lifecycle events held for subscribers that resume from a revision (at most --history-events).",
            ),
            history_bytes: gauge(
                "plegd_event_history_bytes",
                "Heap bytes of the events held for resuming subscribers (packed events and the ring's slots).",
            ),
            state_persisting: gauge(
                "plegd_state_persisting",
                "1 while every relist is stored in the state dir; 0 while plegd serves from memory (no state dir, or writing it fails).",
            ),
            state_bytes: gauge(
                "plegd_state_file_bytes",
                "Bytes of the state file (a snapshot and the relists stored since).",
            ),
            state_write_failures: counter(
                "plegd_state_write_failures_total",
                "Relists that could not be stored in the state dir (served from memory; a restart then starts fresh).",
            ),
            sync_gates: gauge(
                "plegd_sync_gates",
                "Live PodSyncGate actors (pods held by a sync or recently released).",
            ),
            otlp_events_exported: counter(
                "plegd_otlp_events_exported_total",
                "Lifecycle events the collector accepted as OTLP log records (--otlp-events).",
            ),
            otlp_events_dropped: counter(
                "plegd_otlp_events_dropped_total",
                "Lifecycle events never exported as OTLP log records: export queue full, collector down, slow or refusing, or still queued at shutdown.",
            ),
            hint_source_state: IntGaugeVec::new(
                Opts::new(
                    "plegd_hint_source_state",
                    "1 on the current state of each relist hint source (off, detected, connecting, streaming, waiting, unsupported, stopped).",
                ),
                &["source", "state"],
            )
            .expect("static gauge options are valid"),
            hint_stops: counter_vec(
                "plegd_hint_source_stops_total",
                "Published container stops judged for each hint source that was up from before the exit, by whether the source reported them (reported, missed).",
                &["source", "result"],
            ),
            hint_resolutions: counter_vec(
                "plegd_hint_resolutions_total",
                "Container or sandbox IDs of hints that the cache did not know, by what tracing them to their pods gave (found, no_pod, limited, failed).",
                &["result"],
            ),
            api_connections_closed: counter_vec(
                "plegd_api_connections_closed_total",
                "Subscriber API connections plegd closed itself, by reason (handshake_timeout, bad_preface, handshake_evicted, too_many_connections, served_evicted, idle, out_of_fds).",
                &["reason"],
            ),
            api_refused: counter_vec(
                "plegd_api_refused_total",
                "API calls refused, by method and reason (read_socket: Sync or RequestRelist on the read socket; unknown_pod_holds: too many holds of pods plegd does not know; budget: the API clients' RequestRelist budget was full).",
                &["method", "reason"],
            ),
            sync_holds_expired: counter(
                "plegd_sync_holds_expired_total",
                "Sync holds plegd ended because they reached --max-sync-hold without a renew.",
            ),
            registry,
        };
        m.register_all();
        m
    }

    fn register_all(&self) {
        let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(self.relist_duration.clone()),
            Box::new(self.relist_interval.clone()),
            Box::new(self.pod_relist_duration.clone()),
            Box::new(self.last_seen.clone()),
            Box::new(self.discard_events.clone()),
            Box::new(self.events_total.clone()),
            Box::new(self.relist_errors.clone()),
            Box::new(self.relist_prefetch.clone()),
            Box::new(self.relist_requests.clone()),
            Box::new(self.queue_depth.clone()),
            Box::new(self.relist_pending.clone()),
            Box::new(self.connection_errors.clone()),
            Box::new(self.connection_successes.clone()),
            Box::new(self.connection_latency.clone()),
            Box::new(self.stream_connected.clone()),
            Box::new(self.reconnect_attempts.clone()),
            Box::new(self.stream_events.clone()),
            Box::new(self.subscribers.clone()),
            Box::new(self.subscriber_drops.clone()),
            Box::new(self.history_events.clone()),
            Box::new(self.history_bytes.clone()),
            Box::new(self.state_persisting.clone()),
            Box::new(self.state_bytes.clone()),
            Box::new(self.state_write_failures.clone()),
            Box::new(self.sync_gates.clone()),
            Box::new(self.otlp_events_exported.clone()),
            Box::new(self.otlp_events_dropped.clone()),
            Box::new(self.hint_source_state.clone()),
            Box::new(self.hint_resolutions.clone()),
            Box::new(self.hint_stops.clone()),
            Box::new(self.api_refused.clone()),
            Box::new(self.sync_holds_expired.clone()),
            Box::new(self.api_connections_closed.clone()),
        ];
        for c in collectors {
            self.registry
                .register(c)
                .expect("metric names are unique within one registry");
        }
        // Pre-create the labelled series so a scrape shows zeros, not absences.
        for &r in Refusal::ALL {
            self.api_refused.with_label_values(&r.labels());
        }
        for &s in RelistSource::ALL {
            self.events_total.with_label_values(&[s.as_str()]);
            self.pod_relist_duration.with_label_values(&[s.as_str()]);
            for &r in RequestResult::ALL {
                self.relist_requests
                    .with_label_values(&[r.as_str(), s.as_str()]);
            }
        }
        for &p in RelistPhase::ALL {
            self.relist_errors.with_label_values(&[p.as_str()]);
        }
        for &s in HintSourceName::ALL {
            for result in ["reported", "missed"] {
                self.hint_stops.with_label_values(&[s.as_str(), result]);
            }
        }
        for &r in ResolveResult::ALL {
            self.hint_resolutions.with_label_values(&[r.as_str()]);
        }
        for &r in PrefetchResult::ALL {
            self.relist_prefetch.with_label_values(&[r.as_str()]);
        }
        for &t in StreamEventType::ALL {
            self.stream_events.with_label_values(&[t.as_str()]);
        }
        for &source in HintSourceName::ALL {
            self.set_hint_source_state(source, HintSourceState::Off);
        }
        for &r in ApiConnectionClose::ALL {
            self.api_connections_closed.with_label_values(&[r.as_str()]);
        }
    }

    /// Sets `plegd_hint_source_state{source}`: 1 on `state`, 0 on every other state.
    pub fn set_hint_source_state(&self, source: HintSourceName, state: HintSourceState) {
        for &s in HintSourceState::ALL {
            self.hint_source_state
                .with_label_values(&[source.as_str(), s.as_str()])
                .set(i64::from(s == state));
        }
    }

    /// A hint source's current state, as exported.
    pub fn hint_source_state(&self, source: HintSourceName) -> HintSourceState {
        HintSourceState::ALL
            .iter()
            .copied()
            .find(|s| {
                self.hint_source_state
                    .with_label_values(&[source.as_str(), s.as_str()])
                    .get()
                    == 1
            })
            .unwrap_or(HintSourceState::Off)
    }

    /// Every hint source with its state, for `/readyz`: `cri-events=streaming ...`.
    pub fn hint_source_summary(&self) -> String {
        HintSourceName::ALL
            .iter()
            .map(|&s| format!("{s}={}", self.hint_source_state(s)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// `plegd_api_connections_closed_total{reason}`.
    pub fn api_connections_closed(&self, reason: ApiConnectionClose) -> u64 {
        self.api_connections_closed
            .with_label_values(&[reason.as_str()])
            .get()
    }

    /// Counts one API connection plegd closed.
    pub fn count_api_connection_closed(&self, reason: ApiConnectionClose) {
        self.api_connections_closed
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    /// `kubelet_pleg_events_total{relist_source}` for one source.
    pub fn events(&self, source: RelistSource) -> u64 {
        self.events_total
            .with_label_values(&[source.as_str()])
            .get()
    }

    /// Counts one published event.
    pub fn count_event(&self, source: RelistSource) {
        self.events_total
            .with_label_values(&[source.as_str()])
            .inc();
    }

    /// `plegd_api_refused_total{method, reason}` for one refusal.
    pub fn refused(&self, r: Refusal) -> u64 {
        self.api_refused.with_label_values(&r.labels()).get()
    }

    /// Counts one refused API call.
    pub fn count_refused(&self, r: Refusal) {
        self.api_refused.with_label_values(&r.labels()).inc();
    }

    /// `plegd_relist_requests_total{result, relist_source}` for one pair.
    pub fn requests(&self, result: RequestResult, source: RelistSource) -> u64 {
        self.relist_requests
            .with_label_values(&[result.as_str(), source.as_str()])
            .get()
    }

    /// `plegd_hint_resolutions_total{result}`.
    pub fn resolutions(&self, result: ResolveResult) -> u64 {
        self.hint_resolutions
            .with_label_values(&[result.as_str()])
            .get()
    }

    /// Counts one judged container stop of a hint source.
    pub fn count_hint_stop(&self, source: HintSourceName, reported: bool) {
        let result = if reported { "reported" } else { "missed" };
        self.hint_stops
            .with_label_values(&[source.as_str(), result])
            .inc();
    }

    /// Counts one resolution of an unknown hint ID.
    pub fn count_resolution(&self, result: ResolveResult) {
        self.hint_resolutions
            .with_label_values(&[result.as_str()])
            .inc();
    }

    /// Counts one request outcome.
    pub fn count_request(&self, result: RequestResult, source: RelistSource) {
        self.relist_requests
            .with_label_values(&[result.as_str(), source.as_str()])
            .inc();
    }

    /// `plegd_relist_errors_total{phase}`.
    pub fn relist_errors(&self, phase: RelistPhase) -> u64 {
        self.relist_errors
            .with_label_values(&[phase.as_str()])
            .get()
    }

    /// Counts `n` relist failures in `phase`.
    pub fn count_relist_errors(&self, phase: RelistPhase, n: u64) {
        self.relist_errors
            .with_label_values(&[phase.as_str()])
            .inc_by(n);
    }

    /// `plegd_relist_prefetch_total{result}`.
    pub fn prefetches(&self, result: PrefetchResult) -> u64 {
        self.relist_prefetch
            .with_label_values(&[result.as_str()])
            .get()
    }

    /// Counts `n` prefetched container statuses that ended as `result`.
    pub fn count_prefetches(&self, result: PrefetchResult, n: u64) {
        if n > 0 {
            self.relist_prefetch
                .with_label_values(&[result.as_str()])
                .inc_by(n);
        }
    }

    /// Events the CRI stream delivered, of one type.
    pub fn stream_events(&self, t: StreamEventType) -> u64 {
        self.stream_events.with_label_values(&[t.as_str()]).get()
    }

    /// Counts one CRI stream event.
    pub fn count_stream_event(&self, t: StreamEventType) {
        self.stream_events.with_label_values(&[t.as_str()]).inc();
    }

    /// The targeted-relist duration histogram of one source.
    pub fn pod_relist_histogram(&self, source: RelistSource) -> Histogram {
        self.pod_relist_duration
            .with_label_values(&[source.as_str()])
    }

    /// Records how long a targeted relist took.
    pub fn observe_pod_relist(&self, source: RelistSource, seconds: f64) {
        self.pod_relist_duration
            .with_label_values(&[source.as_str()])
            .observe(seconds);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        // Encoding our own well-formed families into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kep_names_are_exposed_with_bounded_labels() {
        let m = Metrics::new();
        m.count_event(RelistSource::Global);
        let text = m.encode();
        for name in [
            "kubelet_evented_pleg_connection_error_count",
            "kubelet_evented_pleg_connection_success_count",
            "kubelet_evented_pleg_connection_latency_seconds",
            "kubelet_pleg_pod_relist_duration_seconds",
            "kubelet_pleg_relist_interval_seconds",
            "kubelet_pleg_relist_duration_seconds",
            "kubelet_pleg_last_seen_seconds",
            "kubelet_pleg_discard_events",
            "kubelet_pleg_events_total",
        ] {
            assert!(text.contains(name), "{name} missing");
        }
        assert!(text.contains("kubelet_pleg_events_total{relist_source=\"global\"} 1"));
        // Every hint source starts off, and one state at a time reads 1.
        assert!(text.contains("plegd_hint_source_state{source=\"nri\",state=\"off\"} 1"));
        m.set_hint_source_state(HintSourceName::CriEvents, HintSourceState::Streaming);
        assert_eq!(
            m.hint_source_state(HintSourceName::CriEvents),
            HintSourceState::Streaming
        );
        assert_eq!(
            m.hint_source_summary(),
            "cri-events=streaming nri=off containerd-events=off"
        );
        let text = m.encode();
        assert!(text.contains("plegd_hint_source_state{source=\"cri-events\",state=\"off\"} 0"));
        for fam in m.registry.gather() {
            for metric in fam.get_metric() {
                for l in metric.get_label() {
                    assert!(
                        [
                            "relist_source",
                            "result",
                            "phase",
                            "type",
                            "le",
                            "source",
                            "state",
                            "method",
                            "reason"
                        ]
                        .contains(&l.name()),
                        "unexpected label {} on {}",
                        l.name(),
                        fam.name()
                    );
                }
            }
        }
    }
}
