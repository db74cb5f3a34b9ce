//! The storm's floor: the same storm on a fresh node of the same size, with no plegd.
//! A bare client answers each CONTAINER_STOPPED_EVENT with reads of that container,
//! sent on arrival (as many containers at once as plegd's `--status-concurrency`)
//! and again until its status says EXITED; the latency is from each stop to that
//! answer. Measured three ways, each on containers of its own: ContainerStatus alone;
//! the same with another bare client reading both lists every relist period beside
//! it (what a global relist asks of the runtime whoever makes it); and a targeted
//! relist's reads (the pod's two lists and the status) beside those lists.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::StreamExt as _;

use crate::cri::Cri;
use crate::floor;
use crate::procs::PATIENCE;
use crate::workloads::{self, Exits};

/// Reads of one stopped container before the client gives up on it (it is then
/// counted as unanswered).
const TRIES: usize = 100;

/// What the floor's client reads of each stopped container.
#[derive(Clone, Copy)]
pub enum Reads {
    Status,
    /// The pod's two lists and the container's status, in flight together.
    Pod,
}

/// The three ways, in the module doc's order.
#[derive(Default)]
pub struct StormFloor {
    pub alone: Exits,
    pub beside_lists: Exits,
    pub pod_reads: Exits,
}

/// How the storm is made and answered.
pub struct Storm {
    pub window: Duration,
    pub in_flight: usize,
    pub reads: Reads,
    /// Both lists read this often beside the storm (None: not read).
    pub lists_every: Option<Duration>,
}

/// Stops `pods`' containers (sandbox, container) as [`Storm`] says, on the runtime of
/// `cri` and `endpoint`, and gives each stop's answer.
pub fn answered(
    rt: &tokio::runtime::Runtime,
    (cri, endpoint): (&Cri, &str),
    pods: &[(String, String)],
    storm: &Storm,
) -> Result<Exits> {
    let sandbox_of: Arc<HashMap<String, String>> = Arc::new(
        pods.iter()
            .map(|(sandbox, id)| (id.clone(), sandbox.clone()))
            .collect(),
    );
    let ids: Vec<String> = pods.iter().map(|(_, id)| id.clone()).collect();
    let answers: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut events = rt.block_on(cri.stopped_containers())?;
    let (arrived, to_read) = futures::channel::mpsc::unbounded::<String>();
    let listen = rt.spawn(async move {
        while let Some(id) = events.next().await {
            if arrived.unbounded_send(id).is_err() {
                return;
            }
        }
    });
    let (reader, reads, record) = (cri.clone(), storm.reads, answers.clone());
    let answer = rt.spawn(
        to_read
            .map(move |id| {
                let (reader, sandbox_of) = (reader.clone(), sandbox_of.clone());
                async move {
                    let sandbox = sandbox_of.get(&id)?;
                    for _ in 0..TRIES {
                        let exited = match reads {
                            Reads::Status => reader.exited(&id).await,
                            Reads::Pod => reader.pod_reads_exited(sandbox, &id).await,
                        };
                        match exited {
                            Ok(true) => return Some((id, Instant::now())),
                            Ok(false) => continue,
                            Err(_) => return None,
                        }
                    }
                    None
                }
            })
            .buffer_unordered(storm.in_flight.max(1))
            .for_each(move |done| {
                if let (Some((id, at)), Ok(mut m)) = (done, record.lock()) {
                    m.insert(id, at);
                }
                futures::future::ready(())
            }),
    );
    let lists = match storm.lists_every {
        None => None,
        Some(period) => {
            let client = floor::BareLists::new(endpoint)?;
            Some(rt.spawn(async move {
                let mut tick = tokio::time::interval(period);
                loop {
                    tick.tick().await;
                    // As the no-change relist's floor reads them.
                    let _ = client.read().await;
                }
            }))
        }
    };
    let stopped = workloads::spread_stops(rt, cri, &ids, storm.window);
    let deadline = Instant::now() + PATIENCE;
    let all_in = || answers.lock().map(|m| m.len() >= ids.len()).unwrap_or(true);
    while stopped.is_ok() && !all_in() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for task in [Some(listen), Some(answer), lists].into_iter().flatten() {
        task.abort();
    }
    let (_, stopped) = stopped?;
    let Ok(answers) = answers.lock() else {
        bail!("the storm floor's record of answers was poisoned");
    };
    let mut out = Exits::default();
    for (id, t0) in ids.iter().zip(&stopped) {
        match answers.get(id) {
            Some(at) => out.latencies.push(at.saturating_duration_since(*t0)),
            None => out.missing += 1,
        }
    }
    if out.latencies.is_empty() && !ids.is_empty() {
        bail!("no stop of the storm's floor was answered: did the runtime's CRI event stream report them?");
    }
    Ok(out)
}
