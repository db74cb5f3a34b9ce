//! Fan-out: many watchers of plegd's subscriber API (plegd.v1 Watch over its unix
//! socket), each stamping every ContainerDied when its stream delivers it. They run
//! in the bench process on their own small tokio runtime (one worker thread), shared
//! out over a few client connections: plegd serves at most 256 connections at once
//! (`api/src/incoming.rs`) and up to 2,048 streams on each, so 1,000 watchers must
//! share connections anyway.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use plegd_api::v1;
use plegd_api::v1::plegd_client::PlegdClient;
use plegd_api::v1::watch_response::Kind;
use tonic::transport::Channel;

use crate::procs::PATIENCE;

#[derive(Default)]
struct Received {
    /// Streams that must see each event.
    expected: usize,
    hellos: usize,
    /// Per container, when each watcher's stream delivered its ContainerDied.
    died: HashMap<String, Vec<Instant>>,
    /// Sum of the events' `missed` (a watcher's queue was full in plegd).
    missed: u64,
    /// Gaps in a stream's `seq` that `missed` does not explain.
    gaps: u64,
    /// Streams that ended or failed, with why.
    failed: Vec<String>,
}

#[derive(Default)]
struct Shared {
    received: Mutex<Received>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Received> {
        self.received.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `done` holds (or `patience` passed); returns the guard either way.
    fn wait(
        &self,
        patience: Duration,
        done: impl Fn(&Received) -> bool,
    ) -> MutexGuard<'_, Received> {
        let deadline = Instant::now() + patience;
        let mut r = self.lock();
        loop {
            let now = Instant::now();
            if done(&r) || now >= deadline {
                return r;
            }
            r = self
                .changed
                .wait_timeout(r, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

/// `count` Watch streams (no filter: every event of the node) on `connections`
/// client connections.
pub struct Watchers {
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    pub count: usize,
    pub connections: usize,
}

impl Watchers {
    /// Connects, opens every stream and waits for each one's Hello (plegd subscribes a
    /// stream before it sends the Hello: from then on it gets every event).
    pub fn start(
        rt: &tokio::runtime::Runtime,
        socket: &Path,
        count: usize,
        connections: usize,
    ) -> Result<Watchers> {
        let connections = connections.clamp(1, count.max(1));
        let clients = rt.block_on(async {
            let mut clients = Vec::with_capacity(connections);
            for _ in 0..connections {
                clients.push(plegd_api::connect(socket).await?);
            }
            anyhow::Ok(clients)
        })?;
        let shared = Arc::new(Shared::default());
        shared.lock().expected = count;
        let tasks = (0..count)
            .map(|i| rt.spawn(watch(clients[i % connections].clone(), shared.clone())))
            .collect();
        let w = Watchers {
            shared,
            tasks,
            count,
            connections,
        };
        let r = w
            .shared
            .wait(PATIENCE, |r| r.hellos + r.failed.len() >= count);
        if let Some(why) = r.failed.first() {
            bail!("{} of {count} Watch streams failed: {why}", r.failed.len());
        }
        if r.hellos < count {
            bail!(
                "only {} of {count} Watch streams said Hello within {PATIENCE:?}",
                r.hellos
            );
        }
        drop(r);
        Ok(w)
    }

    /// Waits until every stream delivered the ContainerDied of each of `ids` (or
    /// `patience` passed); returns the receipts of each, in the order of `ids`.
    pub fn wait_died(&self, ids: &[String], patience: Duration) -> Vec<Vec<Instant>> {
        let n = self.count;
        let r = self.shared.wait(patience, |r| {
            !r.failed.is_empty()
                || ids
                    .iter()
                    .all(|id| r.died.get(id).is_some_and(|v| v.len() >= n))
        });
        ids.iter()
            .map(|id| r.died.get(id).cloned().unwrap_or_default())
            .collect()
    }

    /// Events the streams said they missed, plus unexplained gaps, plus streams that
    /// ended (each must be 0).
    pub fn losses(&self) -> (u64, u64, usize) {
        let r = self.shared.lock();
        (r.missed, r.gaps, r.failed.len())
    }
}

impl Drop for Watchers {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn watch(client: PlegdClient<Channel>, shared: Arc<Shared>) {
    let why = match stream(client, &shared).await {
        Ok(()) => "the stream ended".to_string(),
        Err(e) => format!("{e:#}"),
    };
    shared.lock().failed.push(why);
    shared.changed.notify_all();
}

async fn stream(mut client: PlegdClient<Channel>, shared: &Shared) -> Result<()> {
    let mut stream = client
        .watch(v1::WatchRequest::default())
        .await
        .context("Watch")?
        .into_inner();
    let mut last_seq = 0u64;
    while let Some(msg) = stream.message().await.context("the Watch stream")? {
        let at = Instant::now();
        match msg.kind {
            Some(Kind::Hello(_)) => {
                let mut r = shared.lock();
                r.hellos += 1;
                if r.hellos == r.expected {
                    shared.changed.notify_all();
                }
            }
            Some(Kind::Event(e)) => {
                let gap = e.seq.saturating_sub(last_seq + 1);
                last_seq = e.seq;
                let mut r = shared.lock();
                r.missed += e.missed;
                r.gaps += gap.saturating_sub(e.missed);
                if e.r#type == v1::EventType::ContainerDied as i32 {
                    let expected = r.expected;
                    let seen = r.died.entry(e.container_id).or_default();
                    seen.push(at);
                    // The waiter needs every stream's receipt: wake it once.
                    if seen.len() == expected {
                        shared.changed.notify_all();
                    }
                }
            }
            Some(Kind::Bookmark(_) | Kind::Gap(_)) | None => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use integration_tests::api::Served;
    use plegd_sim::FakeRuntime;

    use super::*;

    /// plegd's core and its API server over the fake runtime, on an actix system of
    /// their own thread (the test thread blocks in the watchers' waits). Sending on
    /// the returned channel stops the API server: every stream ends.
    fn serve() -> (
        FakeRuntime,
        PathBuf,
        tokio::sync::oneshot::Sender<()>,
        std::thread::JoinHandle<()>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                let mut served = Served::start(Duration::from_millis(50), 64);
                tx.send((served.rt.clone(), served.socket.clone()))
                    .expect("the test waits");
                let _ = stopped.await;
                assert!(served.stop_server().await, "the API server stops");
            });
        });
        let (fake, socket) = rx.recv().expect("the server starts");
        (fake, socket, stop, thread)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime")
    }

    #[test]
    fn every_watcher_gets_each_death_and_every_ended_stream_is_counted() {
        let (fake, socket, stop, thread) = serve();
        let rt = runtime();
        let w = Watchers::start(&rt, &socket, 3, 2).expect("3 watchers");
        assert_eq!((w.count, w.connections), (3, 2));
        let sb = fake.run_pod("u1", "web", "ns");
        let c = fake.run_container(&sb, "app");
        fake.exit_container(&c, 1);
        let got = w.wait_died(std::slice::from_ref(&c), Duration::from_secs(60));
        assert_eq!(
            got[0].len(),
            3,
            "each of the 3 watchers got the ContainerDied"
        );
        assert_eq!(w.losses(), (0, 0, 0));
        stop.send(()).expect("the server thread waits");
        let r = w
            .shared
            .wait(Duration::from_secs(60), |r| r.failed.len() == 3);
        assert_eq!(
            r.failed.len(),
            3,
            "every stream's end is counted: {:?}",
            r.failed
        );
        drop(r);
        assert_eq!(w.losses().2, 3);
        thread.join().expect("the server thread");
    }

    #[test]
    fn no_plegd_at_the_socket_is_a_clear_error() {
        let rt = runtime();
        let dir = tempfile::tempdir().expect("a directory");
        let err = Watchers::start(&rt, &dir.path().join("none.sock"), 1, 1)
            .err()
            .expect("nothing answers there");
        assert!(
            format!("{err:#}").contains("no plegd answers at"),
            "{err:#}"
        );
    }
}
