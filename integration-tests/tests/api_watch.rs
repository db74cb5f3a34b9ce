//! The subscriber API's Watch, through a real tonic client on a real unix socket,
//! against plegd's actors over the fake runtime: fan-out with filters, initial
//! events racing changes, resume, refused revisions, overflow, bookmarks, a thousand
//! watchers, shutdown.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use integration_tests::api::*;
use integration_tests::wait::{recv_until, wait_until, TIMEOUT};
use plegd_actors::{Delivery, EventKind, HintSourceState, PlegConfig, Subscription};
use plegd_api::v1::{self, watch_response::Kind};
use plegd_runtime::ContainerState;

/// (revision, type, container) of the published events, as a direct subscriber saw
/// them.
fn reference(got: &[Delivery]) -> Vec<(u64, &'static str, String, String)> {
    got.iter()
        .map(|d| {
            (
                d.event.revision,
                d.event.kind.as_str(),
                d.event.container_id.clone(),
                d.event.pod.uid.clone(),
            )
        })
        .collect()
}

fn seen(got: &[v1::Event]) -> Vec<(u64, &'static str, String, String)> {
    got.iter()
        .map(|e| {
            let kind = plegd_api::convert::event_kind(kind_of(e)).expect("a known type");
            (
                e.revision,
                kind.as_str(),
                e.container_id.clone(),
                e.pod_uid.clone(),
            )
        })
        .collect()
}

async fn direct(served: &Served) -> Subscription {
    served.pleg.subscribe("reference", 65_536).await.unwrap()
}

#[actix_rt::test]
async fn every_watcher_gets_every_event_its_filters_select_with_the_same_revisions() {
    let served = Served::start(Duration::from_millis(20), 1024);
    let all_ref = direct(&served).await;
    let mut client = served.client().await;
    let everything = v1::WatchRequest::default();
    let mut all = Vec::new();
    for _ in 0..20 {
        all.push(watch(&mut client, everything.clone()).await);
    }
    let mut by_uid = watch(
        &mut client,
        v1::WatchRequest {
            pod_uids: vec!["u1".into()],
            ..everything.clone()
        },
    )
    .await;
    let mut by_ns = watch(
        &mut client,
        v1::WatchRequest {
            namespaces: vec!["ns-b".into()],
            ..everything.clone()
        },
    )
    .await;
    let mut by_label = watch(
        &mut client,
        v1::WatchRequest {
            label_selector: "app=web,tier!=db".into(),
            ..everything.clone()
        },
    )
    .await;
    let mut by_type = watch(
        &mut client,
        v1::WatchRequest {
            types: vec![v1::EventType::ContainerDied.into()],
            ..everything.clone()
        },
    )
    .await;
    assert_eq!(all[0].hello.node_name, NODE);
    assert_eq!(all[0].hello.instance_id, served.pleg.instance_id());
    // Every hint source, named and in the states of plegd_hint_source_state.
    let names: Vec<&str> = all[0]
        .hello
        .hint_sources
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names, ["cri-events", "nri", "containerd-events"]);
    for s in &all[0].hello.hint_sources {
        assert!(
            HintSourceState::ALL.iter().any(|st| st.as_str() == s.state),
            "{s:?}"
        );
    }

    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let sb1 = served
        .rt
        .run_pod_with_labels("u1", "web", "ns-a", labels(&[("app", "web")]));
    let c1 = served.rt.run_container(&sb1, "app");
    let sb2 = served.rt.run_pod_with_labels(
        "u2",
        "db",
        "ns-b",
        labels(&[("app", "web"), ("tier", "db")]),
    );
    let c2 = served.rt.run_container(&sb2, "db");
    // After u2's start is published: u1's death comes strictly later.
    let mut got = recv_until(&all_ref, "u2 started", |d| d.event.container_id == c2).await;
    served.rt.exit_container(&c1, 3);
    served.rt.exit_container(&c2, 0);
    // Both deaths may come in one relist, in either order: wait for both.
    let mut deaths = 0;
    got.extend(
        recv_until(&all_ref, "both deaths", |d| {
            if d.event.kind == EventKind::ContainerDied
                && d.event.pod.uid.starts_with('u')
                && !d.event.sandbox
            {
                deaths += 1;
            }
            deaths == 2
        })
        .await,
    );
    let expected = reference(&got);
    let last = expected.iter().map(|e| e.0).max().unwrap();
    for w in &mut all {
        let events = events_until(&mut w.stream, "the last event", |e| e.revision == last).await;
        assert_eq!(seen(&events), expected);
        assert!(events
            .iter()
            .enumerate()
            .all(|(i, e)| e.seq == i as u64 + 1 && e.missed == 0));
    }
    type Row = (u64, &'static str, String, String);
    type Keep = fn(&Row) -> bool;
    let filtered: [(&mut Watching, Keep); 4] = [
        (&mut by_uid, |e| e.3 == "u1"),
        (&mut by_label, |e| e.3 == "u1"),
        (&mut by_ns, |e| e.3 == "u2"),
        (&mut by_type, |e| e.1 == "ContainerDied"),
    ];
    for (w, keep) in filtered {
        let want: Vec<_> = expected.iter().filter(|e| keep(e)).cloned().collect();
        let last = want.last().unwrap().0;
        let events = events_until(&mut w.stream, "its last event", |e| e.revision == last).await;
        assert_eq!(seen(&events), want);
        // Its own sequence: contiguous over what it was sent.
        assert!(events
            .iter()
            .enumerate()
            .all(|(i, e)| e.seq == i as u64 + 1));
    }
    // The enriched fields travel: the death of c1 with its exit code.
    let died = expected
        .iter()
        .find(|e| e.1 == "ContainerDied" && e.2 == c1)
        .unwrap()
        .0;
    let mut one = watch(
        &mut client,
        v1::WatchRequest {
            since_revision: Some(died - 1),
            ..everything
        },
    )
    .await;
    let e = events_until(&mut one.stream, "c1's death", |e| e.revision == died).await;
    let e = e.last().unwrap();
    assert_eq!(
        (e.exit_code, e.container_name.as_str(), e.sandbox),
        (Some(3), "app", false)
    );
    assert_eq!(e.pod_namespace, "ns-a");
    // The initial events obey the selector too.
    let mut initial = watch(
        &mut client,
        v1::WatchRequest {
            label_selector: "tier=db".into(),
            send_initial_events: true,
            ..Default::default()
        },
    )
    .await;
    let mut pods = Vec::new();
    loop {
        match next(&mut initial.stream).await {
            Kind::Event(e) => pods.push(e.pod_uid),
            Kind::Bookmark(_) => break,
            Kind::Hello(_) => panic!("a second Hello"),
            Kind::Gap(g) => panic!("a gap in the initial events: {g:?}"),
        }
    }
    assert!(
        !pods.is_empty() && pods.iter().all(|u| u == "u2"),
        "{pods:?}"
    );
}

/// Folds lifecycle events into container states (running/exited; removed = gone).
fn fold(state: &mut BTreeMap<String, &'static str>, kind: EventKind, id: &str) {
    match kind {
        EventKind::ContainerStarted => {
            state.insert(id.to_string(), "running");
        }
        EventKind::ContainerDied => {
            state.insert(id.to_string(), "exited");
        }
        EventKind::ContainerRemoved => {
            state.remove(id);
        }
        EventKind::PodSync | EventKind::ContainerChanged => {}
    }
}

/// Containers of `sandboxes` exiting and new ones starting, one sandbox after the
/// other every millisecond, from a thread of its own until stopped.
struct Churn {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl Churn {
    fn start(rt: &plegd_sim::FakeRuntime, sandboxes: &[String]) -> Churn {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (rt, halt, sandboxes) = (rt.clone(), stop.clone(), sandboxes.to_vec());
        let thread = std::thread::spawn(move || {
            let mut n = 0;
            while !halt.load(std::sync::atomic::Ordering::SeqCst) {
                let sb = &sandboxes[n % sandboxes.len()];
                for c in rt.containers_of(sb) {
                    if c.state == ContainerState::Running {
                        rt.exit_container(&c.id, 1);
                    }
                }
                rt.run_container(sb, &format!("app{n}"));
                n += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            n
        });
        Churn { stop, thread }
    }

    /// Stops it; the changes it made.
    fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().expect("the churn thread ends")
    }
}

#[actix_rt::test]
async fn initial_events_then_live_events_have_no_gap_and_no_duplicate_under_racing_changes() {
    let served = Served::start(Duration::from_millis(5), 65_536);
    let reference_sub = direct(&served).await;
    let rt = served.rt.clone();
    let mut sandboxes = Vec::new();
    for i in 0..6 {
        let sb = rt.run_pod(&format!("u{i}"), &format!("p{i}"), "ns");
        rt.run_container(&sb, "app");
        sandboxes.push(sb);
    }
    // Changes racing the snapshot: containers exit and new ones start, all along.
    let churn = Churn::start(&rt, &sandboxes);
    let mut client = served.client().await;
    let mut runs = Vec::new();
    for _ in 0..5 {
        let mut w = watch(
            &mut client,
            v1::WatchRequest {
                send_initial_events: true,
                ..Default::default()
            },
        )
        .await;
        let mut snapshot = BTreeMap::new();
        let bookmark = loop {
            match next(&mut w.stream).await {
                Kind::Event(e) => {
                    assert!(e.snapshot, "only snapshot events before the bookmark");
                    let kind = plegd_api::convert::event_kind(kind_of(&e)).unwrap();
                    fold(&mut snapshot, kind, &e.container_id);
                }
                Kind::Bookmark(b) => {
                    assert!(b.initial_events_end);
                    break b.revision;
                }
                Kind::Hello(_) => panic!("a second Hello"),
                Kind::Gap(g) => panic!("a gap in the initial events: {g:?}"),
            }
        };
        runs.push((w, snapshot, bookmark));
    }
    let changes = churn.stop();
    // A last change everyone must see.
    let marker = rt.run_container(&sandboxes[0], "marker");
    let published = recv_until(&reference_sub, "the marker", |d| {
        d.event.container_id == marker
    })
    .await;
    let mut truth = BTreeMap::new();
    for d in &published {
        fold(&mut truth, d.event.kind, &d.event.container_id);
    }
    for (mut w, snapshot, bookmark) in runs {
        // The snapshot is exactly what the events up to its revision say.
        let mut at_bookmark = BTreeMap::new();
        for d in published.iter().filter(|d| d.event.revision <= bookmark) {
            fold(&mut at_bookmark, d.event.kind, &d.event.container_id);
        }
        assert_eq!(snapshot, at_bookmark, "snapshot at revision {bookmark}");
        // Then exactly the events after it: no gap, no duplicate.
        let live = events_until(&mut w.stream, "the marker", |e| e.container_id == marker).await;
        assert!(live.iter().all(|e| !e.snapshot));
        let after: Vec<_> = published
            .iter()
            .filter(|d| d.event.revision > bookmark)
            .cloned()
            .collect();
        assert_eq!(
            seen(&live),
            reference(&after),
            "live events after revision {bookmark}"
        );
        let mut state = snapshot.clone();
        for d in &after {
            fold(&mut state, d.event.kind, &d.event.container_id);
        }
        // Snapshot and live events together: the runtime's state.
        assert_eq!(state, truth);
    }
    assert!(changes > 0);
}

/// Regression: a live Watch's Hello read the latest revision after subscribing, so an
/// event published between the two was both counted in the Hello and sent; a client
/// that starts from the Hello's revision dropped it as seen.
#[actix_rt::test]
async fn a_live_watch_sends_only_events_after_its_hellos_revision() {
    let served = Served::start(Duration::from_millis(5), 65_536);
    let rt = served.rt.clone();
    let sandboxes: Vec<_> = (0..4)
        .map(|i| rt.run_pod(&format!("u{i}"), &format!("p{i}"), "ns"))
        .collect();
    let churn = Churn::start(&rt, &sandboxes);
    let mut client = served.client().await;
    for _ in 0..60 {
        let mut w = watch(&mut client, v1::WatchRequest::default()).await;
        let first = events_until(&mut w.stream, "a live event", |_| true).await;
        assert!(
            first[0].revision > w.hello.latest_revision,
            "event {} sent after a Hello at {}",
            first[0].revision,
            w.hello.latest_revision
        );
    }
    churn.stop();
}

#[actix_rt::test]
async fn resuming_replays_exactly_and_unservable_revisions_are_refused_clearly() {
    let served = Served::start_with(
        PlegConfig {
            relist_period: Duration::from_millis(10),
            history_events: 16,
            ..PlegConfig::default()
        },
        1024,
    );
    let reference_sub = direct(&served).await;
    let sb = served.rt.run_pod("u1", "web", "ns");
    let mut last = String::new();
    for i in 0..4 {
        last = served.rt.run_container(&sb, &format!("c{i}"));
    }
    let published = recv_until(&reference_sub, "c3", |d| d.event.container_id == last).await;
    let all = reference(&published);
    let mut client = served.client().await;
    let instance = served.pleg.instance_id().to_string();
    let from = all[1].0;
    let mut w = watch(
        &mut client,
        v1::WatchRequest {
            since_revision: Some(from),
            instance_id: instance.clone(),
            ..Default::default()
        },
    )
    .await;
    let replay = events_until(&mut w.stream, "c3", |e| e.container_id == last).await;
    assert_eq!(seen(&replay), all[2..].to_vec());

    // Push the early revisions out of the 16-event history.
    for i in 4..30 {
        last = served.rt.run_container(&sb, &format!("c{i}"));
    }
    recv_until(&reference_sub, "c29", |d| d.event.container_id == last).await;
    let latest = served.pleg.latest_revision();
    let refused = |req: v1::WatchRequest| {
        let mut client = client.clone();
        async move {
            match client.watch(req).await {
                Ok(_) => panic!("accepted"),
                Err(status) => status,
            }
        }
    };
    for (req, reason, says) in [
        (
            v1::WatchRequest {
                since_revision: Some(from),
                ..Default::default()
            },
            "too-old",
            "too old",
        ),
        (
            v1::WatchRequest {
                since_revision: Some(latest + 100),
                ..Default::default()
            },
            "future",
            "never issued",
        ),
        (
            v1::WatchRequest {
                since_revision: Some(latest),
                instance_id: "0".repeat(32),
                ..Default::default()
            },
            "other-instance",
            "not this plegd's",
        ),
    ] {
        let status = refused(req).await;
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
        assert_eq!(status.metadata().get("plegd-reason").unwrap(), reason);
        assert!(status.message().contains(says), "{}", status.message());
    }
    // The newest revision, with the right instance, is fine: nothing to replay.
    let mut w = watch(
        &mut client,
        v1::WatchRequest {
            since_revision: Some(latest),
            instance_id: instance,
            ..Default::default()
        },
    )
    .await;
    let next_one = served.rt.run_container(&sb, "next");
    let got = events_until(&mut w.stream, "the next", |e| e.container_id == next_one).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].revision, latest + 1);
}

#[actix_rt::test]
async fn a_stalled_watcher_overflows_alone_and_can_resume_while_others_keep_up() {
    let served = Served::start(Duration::from_millis(5), 256);
    let reference_sub = direct(&served).await;
    let mut client = served.client().await;
    // Its own connection, so its HTTP/2 flow control cannot hold the others up.
    let mut stalled_client = served.client_with_small_window().await;
    let mut stalled = watch(&mut stalled_client, v1::WatchRequest::default()).await;
    let mut healthy = watch(&mut client, v1::WatchRequest::default()).await;
    let relists_before = integration_tests::pleg::global_relists(&served.pleg);

    // Thousands of events, a few per relist (a pace a reading watcher keeps up with):
    // far beyond the stalled stream's buffers (its queue of 256, the stream's 16,
    // HTTP/2's window).
    let rt = served.rt.clone();
    let maker = tokio::task::spawn_blocking(move || {
        for p in 0..20 {
            let sb = rt.run_pod(&format!("u{p}"), "p", "ns");
            for c in 0..100 {
                rt.run_container(&sb, &format!("c{c}"));
                // Pacing, not synchronisation.
                std::thread::sleep(Duration::from_micros(500));
            }
        }
    });
    let is_last = |e: &v1::Event| e.pod_uid == "u19" && e.container_name == "c99";
    let started = Instant::now();
    let mut latencies = Vec::new();
    let got = events_until(&mut healthy.stream, "the last container", |e| {
        let at = plegd_api::convert::from_unix_nanos(e.time_unix_nano);
        latencies.push(
            std::time::SystemTime::now()
                .duration_since(at)
                .unwrap_or_default(),
        );
        is_last(e)
    })
    .await;
    maker.await.unwrap();
    let got_published = recv_until(&reference_sub, "the last container", |d| {
        d.event.pod.uid == "u19" && d.event.container_name == "c99"
    })
    .await;
    assert_eq!(
        seen(&got),
        reference(&got_published),
        "the healthy watcher lost nothing"
    );
    assert!(got.iter().all(|e| e.missed == 0));
    latencies.sort();
    println!(
        "healthy watcher: {} events in {:?}; read→received latency p50 {:?}, p99 {:?}, max {:?}; global relists meanwhile: {}",
        got.len(),
        started.elapsed(),
        latencies[latencies.len() / 2],
        latencies[latencies.len() * 99 / 100],
        latencies[latencies.len() - 1],
        integration_tests::pleg::global_relists(&served.pleg) - relists_before,
    );
    // The stalled one now reads: a gap told as `missed`, its sequence showing it. Its
    // queue is full, so markers are made until one reaches it after it drained.
    let reader = tokio::spawn(async move {
        let tail = events_until(&mut stalled.stream, "a marker", |e| {
            e.container_name.starts_with("marker")
        })
        .await;
        (stalled, tail)
    });
    let marker_pod = served.rt.run_pod("markers", "m", "ns");
    let deadline = Instant::now() + TIMEOUT;
    let mut markers = 0;
    while !reader.is_finished() {
        assert!(
            Instant::now() < deadline,
            "no marker reached the stalled watcher"
        );
        served
            .rt
            .run_container(&marker_pod, &format!("marker{markers}"));
        markers += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_stalled, tail) = reader.await.unwrap();
    let end = tail.last().unwrap().revision;
    let published = recv_until(&reference_sub, "the marker", |d| d.event.revision == end).await;
    let published: Vec<_> = got_published.into_iter().chain(published).collect();
    let mut prev_seq = 0;
    let mut missed_total = 0;
    let mut before_gap = None;
    let mut received = Vec::new();
    for e in &tail {
        assert_eq!(e.seq, prev_seq + 1 + e.missed, "a gap equals missed");
        if e.missed > 0 && before_gap.is_none() {
            before_gap = Some(received.last().copied().unwrap_or(0));
        }
        missed_total += e.missed;
        prev_seq = e.seq;
        received.push(e.revision);
    }
    assert!(missed_total > 0, "the stalled watcher overflowed");
    assert_eq!(received.len() as u64 + missed_total, published.len() as u64);
    assert!(served.pleg.metrics().discard_events.get() >= missed_total);
    // It resumes from its last revision before the gap: the history fills it in.
    let resume_from = before_gap.unwrap();
    let mut again = watch(
        &mut client,
        v1::WatchRequest {
            since_revision: Some(resume_from),
            ..Default::default()
        },
    )
    .await;
    let replay = events_until(&mut again.stream, "the marker", |e| e.revision == end).await;
    let want: Vec<_> = published
        .iter()
        .filter(|d| d.event.revision > resume_from)
        .cloned()
        .collect();
    assert_eq!(seen(&replay), reference(&want));
}

#[actix_rt::test]
async fn an_idle_stream_gets_bookmarks_with_the_revision_it_reached() {
    let served = Served::start(Duration::from_millis(20), 1024);
    let reference_sub = direct(&served).await;
    let mut client = served.client().await;
    // Watches another pod: u1's events move its resume point all the same.
    let mut w = watch(
        &mut client,
        v1::WatchRequest {
            pod_uids: vec!["other".into()],
            bookmark_interval_seconds: 1,
            ..Default::default()
        },
    )
    .await;
    let sb = served.rt.run_pod("u1", "web", "ns");
    let c = served.rt.run_container(&sb, "app");
    let d = integration_tests::wait::expect_event(&reference_sub, EventKind::ContainerStarted, &c)
        .await;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        assert!(
            Instant::now() < deadline,
            "no bookmark at revision {}",
            d.event.revision
        );
        match next(&mut w.stream).await {
            Kind::Bookmark(b) if b.revision == d.event.revision => {
                assert!(!b.initial_events_end);
                break;
            }
            Kind::Bookmark(b) => assert!(b.revision < d.event.revision),
            other => panic!("only bookmarks on this stream: {other:?}"),
        }
    }
}

#[actix_rt::test]
async fn a_thousand_concurrent_watchers_each_get_the_event() {
    let served = Served::start(Duration::from_millis(20), 64);
    let opened = Instant::now();
    let mut watchers = Vec::new();
    for _ in 0..10 {
        let mut client = served.client().await;
        for _ in 0..100 {
            watchers.push(watch(&mut client, v1::WatchRequest::default()).await);
        }
    }
    let open_time = opened.elapsed();
    wait_until("1,000 subscribers", || {
        served.pleg.metrics().subscribers.get() >= 1000
    })
    .await;
    let interval = &served.pleg.metrics().relist_interval;
    let (sum0, n0) = (interval.get_sample_sum(), interval.get_sample_count());
    let sb = served.rt.run_pod("u1", "web", "ns");
    let c = served.rt.run_container(&sb, "app");
    let started = Instant::now();
    let tasks: Vec<_> = watchers
        .into_iter()
        .map(|mut w| {
            let c = c.clone();
            tokio::spawn(async move {
                events_until(&mut w.stream, "the container", |e| e.container_id == c).await;
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let (sum, n) = (
        interval.get_sample_sum() - sum0,
        interval.get_sample_count() - n0,
    );
    println!(
        "1,000 watchers: opened in {open_time:?}; every one had the event {:?} after the change; \
         meanwhile {n} global relists, {:.1} ms apart on average (period 20 ms)",
        started.elapsed(),
        if n > 0 { sum / n as f64 * 1e3 } else { 0.0 }
    );
}

#[actix_rt::test]
async fn shutdown_ends_streams_with_unavailable_and_removes_the_socket() {
    let mut served = Served::start(Duration::from_millis(20), 64);
    let mut client = served.client().await;
    let mut w = watch(&mut client, v1::WatchRequest::default()).await;
    assert!(served.socket.exists());
    assert!(served.stop_server().await, "the server stopped in time");
    let end = tokio::time::timeout(TIMEOUT, w.stream.message())
        .await
        .unwrap();
    let status = end.expect_err("the stream ends with a status");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.message().contains("shutting down"), "{status:?}");
    assert!(!served.socket.exists());
}
