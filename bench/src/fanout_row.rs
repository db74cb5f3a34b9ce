//! The fan-out row: single exits and bursts of 20 exits while `W` watchers
//! of the subscriber API receive every event; latency from StopContainer's return to
//! each watcher's ContainerDied, and to plegd's own stdout line (its publication) for
//! comparison; events missed; the global relist schedule meanwhile ("nothing a
//! consumer does may slow the relist schedule").

use std::time::{Duration, Instant};

use anyhow::Result;
use futures::future::join_all;

use crate::cri::Cri;
use crate::fanout::Watchers;
use crate::procs::{own_threads_cpu, Plegd, PATIENCE};
use crate::schedule::{self, Schedule};

/// What one watcher count measured.
pub struct FanoutRun {
    pub pods: usize,
    pub watchers: usize,
    pub connections: usize,
    pub singles: usize,
    /// StopContainer's return → each watcher's ContainerDied (singles × watchers).
    pub single: Vec<Duration>,
    /// StopContainer's return → plegd's stdout line (one per single).
    pub single_stdout: Vec<Duration>,
    /// Each watcher's receipt − the stdout line's, ms (negative: the watcher was first).
    pub over_stdout: Vec<f64>,
    pub bursts: usize,
    /// Bursts: each stop's return → each watcher's ContainerDied.
    pub burst: Vec<Duration>,
    /// Per burst: the last stop → the last watcher's last ContainerDied.
    pub burst_last: Vec<Duration>,
    /// Receipts that never came (exits × watchers − received).
    pub lost: usize,
    /// Events the streams said they missed; unexplained `seq` gaps; streams that ended.
    pub missed: u64,
    pub gaps: u64,
    pub failed: usize,
    pub schedule: Schedule,
    /// CPU over the run: plegd's (all threads), its API thread's, the bench's watchers'.
    pub cpu: Cpu,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub plegd: Duration,
    pub plegd_api: Duration,
    pub watchers: Duration,
}

impl Cpu {
    fn now(plegd: &Plegd) -> Result<Cpu> {
        Ok(Cpu {
            plegd: plegd.cpu()?,
            plegd_api: plegd.thread_cpu(API_THREAD)?,
            watchers: own_threads_cpu(crate::WATCHERS_THREAD)?,
        })
    }

    fn since(self, before: Cpu) -> Cpu {
        Cpu {
            plegd: self.plegd.saturating_sub(before.plegd),
            plegd_api: self.plegd_api.saturating_sub(before.plegd_api),
            watchers: self.watchers.saturating_sub(before.watchers),
        }
    }
}

/// The thread plegd serves its subscriber API on (`api/src/server.rs`).
const API_THREAD: &str = "plegd-api";

impl FanoutRun {
    pub fn all_missed(&self) -> u64 {
        self.lost as u64 + self.missed + self.gaps + self.failed as u64
    }
}

/// Percentile `p` (0..=1, nearest rank) of `v`.
pub fn percentile<T: Copy + PartialOrd>(v: &[T], p: f64) -> Option<T> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len().max(1)) - 1;
    v.get(i).copied()
}

/// Everything that goes into one run, besides plegd and the runtime.
pub struct Plan<'a> {
    pub watchers: usize,
    pub connections: usize,
    /// Containers stopped one at a time.
    pub singles: &'a [String],
    /// Containers stopped at once, per burst.
    pub bursts: Vec<&'a [String]>,
    pub period: Duration,
    /// Single exits start this far apart (so the run spans several relist periods).
    pub pace: Duration,
}

pub fn run(
    rt: &tokio::runtime::Runtime,
    watch_rt: &tokio::runtime::Runtime,
    plegd: &Plegd,
    cri: &Cri,
    pods: usize,
    plan: &Plan<'_>,
) -> Result<FanoutRun> {
    let w = Watchers::start(
        watch_rt,
        plegd.api_socket(),
        plan.watchers,
        plan.connections,
    )?;
    let cpu0 = Cpu::now(plegd)?;
    let ((single, single_stdout, over_stdout, burst, burst_last, lost), schedule) =
        schedule::during(plegd, plan.period, || {
            let mut single = Vec::new();
            let mut single_stdout = Vec::new();
            let mut over_stdout = Vec::new();
            let mut lost = 0;
            let start = Instant::now();
            for (i, id) in plan.singles.iter().enumerate() {
                let ids = std::slice::from_ref(id);
                // Pacing the workload (not waiting for a condition).
                let at = start + plan.pace.mul_f64(i as f64);
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
                let t0 = rt.block_on(cri.stop(id))?;
                let got = w.wait_died(ids, Duration::from_secs(10));
                let line = plegd.events.wait_died(ids, Duration::from_secs(1));
                let line = line[0].first().map(|s| s.at);
                if let Some(l) = line {
                    single_stdout.push(l.saturating_duration_since(t0));
                }
                lost += w.count.saturating_sub(got[0].len());
                for at in &got[0] {
                    single.push(at.saturating_duration_since(t0));
                    if let Some(l) = line {
                        over_stdout.push(signed_ms(*at, l));
                    }
                }
            }
            let mut burst = Vec::new();
            let mut burst_last = Vec::new();
            for ids in &plan.bursts {
                let stopped: Vec<Instant> = rt
                    .block_on(join_all(ids.iter().map(|id| cri.stop(id))))
                    .into_iter()
                    .collect::<Result<_>>()?;
                let got = w.wait_died(ids, PATIENCE);
                for (t0, ats) in stopped.iter().zip(&got) {
                    lost += w.count.saturating_sub(ats.len());
                    burst.extend(ats.iter().map(|at| at.saturating_duration_since(*t0)));
                }
                let last_stop = stopped.iter().max().copied();
                let last_seen = got.iter().flatten().max().copied();
                if let (Some(s), Some(l)) = (last_stop, last_seen) {
                    burst_last.push(l.saturating_duration_since(s));
                }
            }
            Ok((single, single_stdout, over_stdout, burst, burst_last, lost))
        })?;
    let cpu = Cpu::now(plegd)?.since(cpu0);
    let (missed, gaps, failed) = w.losses();
    Ok(FanoutRun {
        pods,
        watchers: w.count,
        connections: w.connections,
        singles: plan.singles.len(),
        single,
        single_stdout,
        over_stdout,
        bursts: plan.bursts.len(),
        burst,
        burst_last,
        lost,
        missed,
        gaps,
        failed,
        schedule,
        cpu,
    })
}

/// `a − b` in ms, negative when `a` came first.
fn signed_ms(a: Instant, b: Instant) -> f64 {
    if a >= b {
        (a - b).as_secs_f64() * 1e3
    } else {
        -((b - a).as_secs_f64() * 1e3)
    }
}
