//! Did the global relist stay on schedule while a workload ran? plegd's own figures:
//! the global relists in the window (`kubelet_pleg_relist_interval_seconds`: count and
//! mean interval between two starts) and the longest gap between two successful ones
//! (`kubelet_pleg_last_seen_seconds`, scraped every 100 ms: exact to plegd's clock,
//! whatever the scrape's own delay).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::procs::Plegd;
use plegd_testkit::metrics::Scrape;

const INTERVAL: &str = "kubelet_pleg_relist_interval_seconds";
const LAST_SEEN: &str = "kubelet_pleg_last_seen_seconds";

/// The global relists during a window.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub window: Duration,
    pub period: Duration,
    /// Global relists started in the window.
    pub relists: u64,
    /// Mean interval between the starts of two of them.
    pub mean_interval: Option<Duration>,
    /// Longest time between two successful ones (their `last_seen`).
    pub longest_gap: Option<Duration>,
}

impl Schedule {
    /// Relists the window should hold at the period.
    pub fn expected(&self) -> f64 {
        self.window.as_secs_f64() / self.period.as_secs_f64()
    }
}

/// Scrapes plegd every 100 ms until `stop`; returns the distinct `last_seen` values.
fn sample(plegd: &Plegd, stop: &AtomicBool) -> Vec<f64> {
    let mut seen: Vec<f64> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        if let Ok(m) = plegd.metrics() {
            let v = m.sum(LAST_SEEN, &[]);
            if v > 0.0 && seen.last() != Some(&v) {
                seen.push(v);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    seen
}

/// Runs `work` while watching plegd's global relist schedule; returns what `work`
/// returned and the schedule over its run.
pub fn during<T>(
    plegd: &Plegd,
    period: Duration,
    work: impl FnOnce() -> Result<T>,
) -> Result<(T, Schedule)> {
    let m0 = plegd.metrics()?;
    let start = Instant::now();
    let stop = AtomicBool::new(false);
    let (out, seen) = std::thread::scope(|s| {
        let sampler = s.spawn(|| sample(plegd, &stop));
        let out = work();
        stop.store(true, Ordering::Relaxed);
        (out, sampler.join().unwrap_or_default())
    });
    let window = start.elapsed();
    let out = out?;
    let m1 = plegd.metrics()?;
    Ok((out, schedule(&m0, &m1, &seen, window, period)))
}

fn schedule(
    m0: &Scrape,
    m1: &Scrape,
    seen: &[f64],
    window: Duration,
    period: Duration,
) -> Schedule {
    let delta = |name: &str| m1.sum(name, &[]) - m0.sum(name, &[]);
    let n = delta(&format!("{INTERVAL}_count"));
    let sum = delta(&format!("{INTERVAL}_sum"));
    let longest_gap = seen
        .windows(2)
        .map(|w| w[1] - w[0])
        .fold(None, |m: Option<f64>, g| Some(m.map_or(g, |m| m.max(g))))
        .map(Duration::from_secs_f64);
    Schedule {
        window,
        period,
        relists: n.max(0.0) as u64,
        mean_interval: (n > 0.0).then(|| Duration::from_secs_f64(sum / n)),
        longest_gap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_gap_is_between_two_successive_relists() {
        let m = |count: f64, sum: f64| {
            Scrape::parse(&format!("{INTERVAL}_count {count}\n{INTERVAL}_sum {sum}\n"))
        };
        let s = schedule(
            &m(10.0, 10.0),
            &m(14.0, 14.4),
            &[100.0, 101.0, 102.5, 103.5],
            Duration::from_secs(4),
            Duration::from_secs(1),
        );
        assert_eq!(s.relists, 4);
        assert_eq!(s.mean_interval, Some(Duration::from_secs_f64(1.1)));
        assert_eq!(s.longest_gap, Some(Duration::from_secs_f64(1.5)));
        assert_eq!(s.expected(), 4.0);
    }
}
