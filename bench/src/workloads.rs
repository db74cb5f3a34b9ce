//! The benchmark's workloads, each against a running plegd and simulated runtime.
//! Every figure is measured from outside plegd: its events as they reach its stdout,
//! its metrics, its CPU time and memory in `/proc`.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::future::join_all;

use crate::cri::Cri;
use crate::procs::{Plegd, PATIENCE};

const GLOBAL: &str = "kubelet_pleg_relist_duration_seconds";
const TARGETED: &str = "kubelet_pleg_pod_relist_duration_seconds";
const REQUESTS: &str = "plegd_relist_requests_total";

/// Latencies of a set of exits, with how many plegd found through the event path.
#[derive(Clone, Debug, Default)]
pub struct Exits {
    pub latencies: Vec<Duration>,
    pub evented: usize,
    pub missing: usize,
    pub duplicates: usize,
}

impl Exits {
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        let mut v = self.latencies.clone();
        v.sort();
        let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len().max(1)) - 1;
        v.get(i).copied()
    }
}

/// The first global relist, as plegd's histogram recorded it (ready = one relist done).
pub fn first_relist(plegd: &Plegd) -> Result<Option<Duration>> {
    let m = plegd.metrics()?;
    let count = m.sum(&format!("{GLOBAL}_count"), &[]);
    Ok((count == 1.0).then(|| Duration::from_secs_f64(m.sum(&format!("{GLOBAL}_sum"), &[]))))
}

/// Steady global relists with nothing changing: wall time (plegd's histogram) and plegd's
/// CPU time per relist, over `window`.
pub struct Steady {
    pub relists: u64,
    pub wall: Duration,
    pub cpu: Duration,
}

/// Measured between two relists: after one completes (found by polling, before the
/// window), half a period on, for a whole number of periods, with no scrape inside
/// the window (a scrape costs plegd CPU too): the window holds exactly that many
/// relists, and the CPU in it is theirs plus plegd's idle cost.
pub fn steady(plegd: &Plegd, window: Duration, period: Duration) -> Result<Steady> {
    let count =
        |p: &Plegd| -> Result<f64> { Ok(p.metrics()?.sum(&format!("{GLOBAL}_count"), &[])) };
    let c0 = count(plegd)?;
    let deadline = Instant::now() + PATIENCE;
    while count(plegd)? == c0 {
        if Instant::now() > deadline {
            bail!("no global relist for {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(period / 2);
    let periods = (window.as_secs_f64() / period.as_secs_f64())
        .round()
        .max(1.0);
    let (m0, cpu0) = (plegd.metrics()?, plegd.cpu()?);
    std::thread::sleep(period.mul_f64(periods));
    let (cpu1, m1) = (plegd.cpu()?, plegd.metrics()?);
    let n = m1.sum(&format!("{GLOBAL}_count"), &[]) - m0.sum(&format!("{GLOBAL}_count"), &[]);
    let wall = m1.sum(&format!("{GLOBAL}_sum"), &[]) - m0.sum(&format!("{GLOBAL}_sum"), &[]);
    let n = n.max(1.0);
    Ok(Steady {
        relists: n as u64,
        wall: Duration::from_secs_f64(wall / n),
        cpu: (cpu1 - cpu0).div_f64(n),
    })
}

fn exits(plegd: &Plegd, ids: &[String], stopped: &[Instant], patience: Duration) -> Exits {
    let seen = plegd.events.wait_died(ids, patience);
    let mut out = Exits::default();
    for (s, t0) in seen.iter().zip(stopped) {
        match s.first() {
            None => out.missing += 1,
            Some(first) => {
                out.latencies.push(first.at.saturating_duration_since(*t0));
                out.evented += usize::from(first.evented);
                out.duplicates += s.len() - 1;
            }
        }
    }
    out
}

/// Exits one at a time (each waited for before the next): latency from the stop to
/// its ContainerDied, and the mean targeted relist (plegd's histogram) they caused.
pub fn single_exits(
    rt: &tokio::runtime::Runtime,
    plegd: &Plegd,
    cri: &Cri,
    ids: &[String],
) -> Result<(Exits, Option<Duration>)> {
    let before = plegd.metrics()?;
    let mut all = Exits::default();
    for id in ids {
        let t0 = Instant::now();
        rt.block_on(cri.stop(id))?;
        let one = exits(
            plegd,
            std::slice::from_ref(id),
            &[t0],
            Duration::from_secs(10),
        );
        all.latencies.extend(one.latencies);
        all.evented += one.evented;
        all.missing += one.missing;
        all.duplicates += one.duplicates;
    }
    let after = plegd.metrics()?;
    let label = ["relist_source=\"evented_pleg\""];
    let n = after.sum(&format!("{TARGETED}_count"), &label)
        - before.sum(&format!("{TARGETED}_count"), &label);
    let sum = after.sum(&format!("{TARGETED}_sum"), &label)
        - before.sum(&format!("{TARGETED}_sum"), &label);
    Ok((all, (n > 0.0).then(|| Duration::from_secs_f64(sum / n))))
}

/// `ids` stopped at once: the time from the last stop to the last ContainerDied.
pub fn burst(
    rt: &tokio::runtime::Runtime,
    plegd: &Plegd,
    cri: &Cri,
    ids: &[String],
) -> Result<(Duration, Exits)> {
    let stopped: Vec<Instant> = rt
        .block_on(join_all(ids.iter().map(|id| cri.stop(id))))
        .into_iter()
        .collect::<Result<_>>()?;
    let seen = plegd.events.wait_died(ids, PATIENCE);
    let last_stop = stopped.iter().max().copied().unwrap_or_else(Instant::now);
    let last_seen = seen
        .iter()
        .filter_map(|s| s.first().map(|s| s.at))
        .max()
        .unwrap_or(last_stop);
    let ex = exits(plegd, ids, &stopped, Duration::ZERO);
    Ok((last_seen.saturating_duration_since(last_stop), ex))
}

/// A storm: `ids` stopped evenly spread over `window` ([`spread_stops`]). Latency
/// from each stop to its ContainerDied.
pub struct Storm {
    pub exits: Exits,
    pub total: Duration,
    pub dropped: f64,
    /// plegd's CPU from the first stop until every exit was published (or given up
    /// on): the storm's targeted relists, and the global relists that fell in it.
    pub cpu: Duration,
}

pub fn storm(
    rt: &tokio::runtime::Runtime,
    plegd: &Plegd,
    cri: &Cri,
    ids: &[String],
    window: Duration,
) -> Result<Storm> {
    let before = plegd.metrics()?;
    let cpu_before = plegd.cpu()?;
    let (start, stopped) = spread_stops(rt, cri, ids, window)?;
    let ex = exits(plegd, ids, &stopped, PATIENCE);
    let cpu = plegd.cpu()?.saturating_sub(cpu_before);
    let last = ex
        .latencies
        .iter()
        .zip(&stopped)
        .map(|(l, t)| *t + *l)
        .max()
        .unwrap_or(start);
    let after = plegd.metrics()?;
    let dropped = after.sum(REQUESTS, &["result=\"dropped\""])
        - before.sum(REQUESTS, &["result=\"dropped\""]);
    Ok(Storm {
        exits: ex,
        total: last - start,
        dropped,
        cpu,
    })
}

/// `ids` stopped evenly spread over `window`, each stop sent on its own (a slow one
/// never delays the next): when the first was due, and when each returned.
pub fn spread_stops(
    rt: &tokio::runtime::Runtime,
    cri: &Cri,
    ids: &[String],
    window: Duration,
) -> Result<(Instant, Vec<Instant>)> {
    let start = Instant::now();
    let step = window.div_f64(ids.len().max(1) as f64);
    let stopped: Vec<Instant> = rt.block_on(async {
        let tasks: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let (cri, id) = (cri.clone(), id.clone());
                let at = tokio::time::Instant::from_std(start + step.mul_f64(i as f64));
                tokio::spawn(async move {
                    tokio::time::sleep_until(at).await;
                    cri.stop(&id).await
                })
            })
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await??);
        }
        anyhow::Ok(out)
    })?;
    Ok((start, stopped))
}

/// Waits for `n` more global relists.
pub fn relists(plegd: &Plegd, n: u32) -> Result<()> {
    let count = || -> Result<f64> { Ok(plegd.metrics()?.sum(&format!("{GLOBAL}_count"), &[])) };
    let target = count()? + f64::from(n);
    let deadline = Instant::now() + PATIENCE;
    while count()? < target {
        if Instant::now() > deadline {
            bail!("fewer than {n} global relists in {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Short-lived pods: `total` pods, `concurrency` at a time, each living `lifetime`.
pub fn churn(
    rt: &tokio::runtime::Runtime,
    cri: &Cri,
    total: usize,
    concurrency: usize,
    lifetime: Duration,
) -> Result<Duration> {
    let start = Instant::now();
    rt.block_on(async {
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                let (cri, next) = (cri.clone(), next.clone());
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= total {
                            return anyhow::Ok(());
                        }
                        let sandbox = cri
                            .run_pod(&format!("churn-{i:08}-0000-4000-8000-000000000000"))
                            .await?;
                        tokio::time::sleep(lifetime).await;
                        cri.remove_pod(&sandbox).await?;
                    }
                })
            })
            .collect();
        for w in workers {
            w.await??;
        }
        anyhow::Ok(())
    })?;
    Ok(start.elapsed())
}
