//! `plegd-bench`: plegd's benchmark suite (issue 11, BENCHMARKS.md). It starts the
//! simulated runtime (`plegd-sim`) and the release `plegd` as two processes talking
//! CRI over a unix socket, drives each workload, and prints one table:
//!
//! - per node size: the first global relist, a steady no-change global relist (wall
//!   time and plegd's CPU), resident memory, single exits (latency, the targeted
//!   relist's duration), bursts of 20 exits, and on large nodes a storm of stops;
//! - single-exit latency with `--evented=false`, and memory after a churn of
//!   short-lived pods.
//!
//! `--smoke` runs a seconds-long version of everything (scripts/test.sh), so the
//! harness cannot rot.

mod cri;
mod procs;
mod workloads;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::Parser;

use cri::Cri;
use procs::{Plegd, Sim};
use workloads::Exits;

#[derive(Parser)]
#[command(
    name = "plegd-bench",
    about = "plegd's benchmark suite against the simulated CRI runtime"
)]
struct Args {
    /// The plegd binary (default: `plegd` next to this one; build it with --release).
    #[arg(long)]
    plegd: Option<PathBuf>,
    /// The simulated runtime's binary (default: `plegd-sim` next to this one).
    #[arg(long)]
    sim: Option<PathBuf>,
    /// A seconds-long run of every workload at small sizes: checks the harness, not plegd.
    #[arg(long)]
    smoke: bool,
    /// Node sizes (pods, 2 containers each); 0 measures the empty node's memory.
    #[arg(long, value_delimiter = ',', default_value = "0,100,1000,5000,10000")]
    sizes: Vec<usize>,
    /// Exits measured one at a time at each size.
    #[arg(long, default_value_t = 40)]
    singles: usize,
    /// Bursts of 20 simultaneous exits at each size.
    #[arg(long, default_value_t = 3)]
    bursts: usize,
    /// Stops of the storm, on nodes with at least this many pods.
    #[arg(long, default_value_t = 5000)]
    storm_stops: usize,
    /// The storm's stops are spread evenly over this time.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    storm_window: Duration,
    /// How long steady global relists are measured at each size.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    steady_window: Duration,
    /// Short-lived pods of the churn run.
    #[arg(long, default_value_t = 20000)]
    churn_pods: usize,
    /// Live pods during the churn run.
    #[arg(long, default_value_t = 1000)]
    churn_live: usize,
    /// Exits measured with `--evented=false` (on the smallest non-empty node).
    #[arg(long, default_value_t = 10)]
    polled_singles: usize,
    /// More arguments for plegd (e.g. `--plegd-arg=--status-concurrency=16`).
    #[arg(long = "plegd-arg", allow_hyphen_values = true)]
    plegd_args: Vec<String>,
}

impl Args {
    fn smoke(mut self) -> Self {
        self.sizes = vec![0, 60, 300];
        self.singles = 5;
        self.bursts = 1;
        self.storm_stops = 200;
        self.storm_window = Duration::from_millis(200);
        self.steady_window = Duration::from_secs(2);
        self.churn_pods = 200;
        self.churn_live = 50;
        self.polled_singles = 2;
        self
    }
}

const CONTAINERS: usize = 2;
/// plegd's default `--relist-period`, which the steady window is cut to (do not
/// change it with --plegd-arg).
const PERIOD: Duration = Duration::from_secs(1);
const BURST: usize = 20;

/// What one node size measured.
#[derive(Default)]
struct SizeRun {
    pods: usize,
    first_relist: Option<Duration>,
    ready: Duration,
    steady: Option<workloads::Steady>,
    rss_kib: u64,
    singles: Option<Exits>,
    targeted: Option<Duration>,
    bursts: Vec<Duration>,
    storm: Option<workloads::Storm>,
}

fn beside_me(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe().context("this binary's path")?;
    Ok(me.with_file_name(name))
}

fn plegd_args(args: &Args, more: &[&str]) -> Vec<String> {
    args.plegd_args
        .iter()
        .cloned()
        .chain(more.iter().map(|s| s.to_string()))
        .collect()
}

fn start_plegd(bin: &Path, sim: &Sim, args: &[String]) -> Result<Plegd> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Plegd::start(bin, sim, &args)
}

fn run_size(
    args: &Args,
    bins: &(PathBuf, PathBuf),
    rt: &tokio::runtime::Runtime,
    pods: usize,
    polled: &mut Option<Exits>,
) -> Result<SizeRun> {
    let sim = Sim::start(&bins.1, pods, CONTAINERS)?;
    let plegd = start_plegd(&bins.0, &sim, &plegd_args(args, &[]))?;
    let mut run = SizeRun {
        pods,
        ready: plegd.started.elapsed(),
        first_relist: workloads::first_relist(&plegd)?,
        ..SizeRun::default()
    };
    run.steady = Some(workloads::steady(&plegd, args.steady_window, PERIOD)?);
    run.rss_kib = plegd.rss_kib()?;
    if pods == 0 {
        return Ok(run);
    }
    let cri = Cri::new(sim.socket());
    let node = rt.block_on(cri.pods())?;
    if node.len() != pods {
        bail!("the simulated node has {} pods, not {pods}", node.len());
    }
    // app-0 of the first pods: single exits, then bursts; app-1: the storm, and from
    // the last pods, the polled exits.
    let first: Vec<String> = node.iter().map(|p| p.containers[0].clone()).collect();
    let second: Vec<String> = node.iter().map(|p| p.containers[1].clone()).collect();
    let singles = args.singles.min(first.len());
    let (ex, targeted) = workloads::single_exits(rt, &plegd, &cri, &first[..singles])?;
    run.singles = Some(ex);
    run.targeted = targeted;
    for chunk in first[singles..].chunks_exact(BURST).take(args.bursts) {
        run.bursts
            .push(workloads::burst(rt, &plegd, &cri, chunk)?.0);
    }
    if pods >= args.storm_stops {
        run.storm = Some(workloads::storm(
            rt,
            &plegd,
            &cri,
            &second[..args.storm_stops],
            args.storm_window,
        )?);
    }
    if polled.is_none() && pods >= args.polled_singles && pods < args.storm_stops {
        drop(plegd);
        let plegd = start_plegd(&bins.0, &sim, &plegd_args(args, &["--evented=false"]))?;
        let ids = &second[pods - args.polled_singles..];
        *polled = Some(workloads::single_exits(rt, &plegd, &cri, ids)?.0);
    }
    Ok(run)
}

struct Churn {
    live: usize,
    pods: usize,
    took: Duration,
    before_kib: u64,
    peak_kib: u64,
    after_kib: u64,
}

fn run_churn(
    args: &Args,
    bins: &(PathBuf, PathBuf),
    rt: &tokio::runtime::Runtime,
) -> Result<Churn> {
    let sim = Sim::start(&bins.1, args.churn_live, CONTAINERS)?;
    let plegd = start_plegd(&bins.0, &sim, &plegd_args(args, &[]))?;
    workloads::relists(&plegd, 3)?;
    let before_kib = plegd.rss_kib()?;
    let cri = Cri::new(sim.socket());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (took, peak_kib) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut peak = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(plegd.rss_kib().unwrap_or(0));
                std::thread::sleep(Duration::from_millis(100));
            }
            peak
        });
        let took = workloads::churn(rt, &cri, args.churn_pods, 64, Duration::from_millis(300));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (took, sampler.join().unwrap_or(0))
    });
    let took = took?;
    workloads::relists(&plegd, 3)?;
    Ok(Churn {
        live: args.churn_live,
        pods: args.churn_pods,
        took,
        before_kib,
        peak_kib,
        after_kib: plegd.rss_kib()?,
    })
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

fn opt_ms(d: Option<Duration>) -> String {
    d.map_or("–".into(), ms)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn exits_cell(e: &Exits) -> String {
    format!(
        "p50 {} p99 {} max {} ({}/{} evented{}{})",
        opt_ms(e.percentile(0.5)),
        opt_ms(e.percentile(0.99)),
        opt_ms(e.percentile(1.0)),
        e.evented,
        e.latencies.len() + e.missing,
        if e.missing > 0 {
            format!(", {} missing", e.missing)
        } else {
            String::new()
        },
        if e.duplicates > 0 {
            format!(", {} duplicates", e.duplicates)
        } else {
            String::new()
        },
    )
}

/// The machine, for the record: CPUs, their model, the load average.
fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!("{cpus} CPUs ({model}), load average {}", load.join(" "))
}

fn print_table(runs: &[SizeRun], polled: Option<&Exits>, churn: &Churn) {
    let empty = runs.iter().find(|r| r.pods == 0).map(|r| r.rss_kib);
    println!("| measure | pods | figure |");
    println!("|---|---|---|");
    for r in runs {
        let p = r.pods;
        println!(
            "| first global relist (plegd's histogram); start to ready | {p} | {}; {} |",
            opt_ms(r.first_relist),
            ms(r.ready)
        );
        if let Some(s) = &r.steady {
            println!(
                "| no-change global relist: wall; plegd CPU ({} relists) | {p} | {}; {} |",
                s.relists,
                ms(s.wall),
                ms(s.cpu)
            );
        }
        let per_pod = match (empty, p) {
            (Some(e), p) if p > 0 => format!(
                "; {:.2} KiB/pod over empty",
                (r.rss_kib as f64 - e as f64) / p as f64
            ),
            _ => String::new(),
        };
        println!("| resident memory | {p} | {}{per_pod} |", mib(r.rss_kib));
        if let Some(e) = &r.singles {
            println!("| single exit → ContainerDied | {p} | {} |", exits_cell(e));
            println!(
                "| targeted relist (plegd's histogram, mean) | {p} | {} |",
                opt_ms(r.targeted)
            );
        }
        if !r.bursts.is_empty() {
            let cells: Vec<String> = r.bursts.iter().map(|d| ms(*d)).collect();
            println!(
                "| {BURST} exits at once: last stop → last ContainerDied | {p} | {} |",
                cells.join(", ")
            );
        }
        if let Some(s) = &r.storm {
            println!(
                "| storm of {} stops: all published after; latency; requests dropped | {p} | {}; {}; {} |",
                s.exits.latencies.len() + s.exits.missing,
                ms(s.total),
                exits_cell(&s.exits),
                s.dropped
            );
        }
    }
    if let Some(e) = polled {
        println!(
            "| single exit, --evented=false | small | {} |",
            exits_cell(e)
        );
    }
    println!(
        "| churn: {} short-lived pods ({} live) in {:.0} s: RSS before; peak; after | {} | {}; {}; {} |",
        churn.pods,
        churn.live,
        churn.took.as_secs_f64(),
        churn.live,
        mib(churn.before_kib),
        mib(churn.peak_kib),
        mib(churn.after_kib)
    );
}

fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args = args.smoke();
    }
    let bins = (
        args.plegd.clone().map_or_else(|| beside_me("plegd"), Ok)?,
        args.sim
            .clone()
            .map_or_else(|| beside_me("plegd-sim"), Ok)?,
    );
    for b in [&bins.0, &bins.1] {
        if !b.is_file() {
            bail!(
                "{} not found: build it (cargo build --release -p plegd -p plegd-sim)",
                b.display()
            );
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("the async runtime")?;
    // The CRI channel is made outside the runtime's futures.
    let _entered = rt.enter();
    println!("plegd-bench: {}; {}", bins.0.display(), machine());
    let mut runs = Vec::new();
    let mut polled = None;
    for &pods in &args.sizes {
        eprintln!("plegd-bench: {pods} pods");
        runs.push(
            run_size(&args, &bins, &rt, pods, &mut polled)
                .with_context(|| format!("at {pods} pods"))?,
        );
    }
    eprintln!("plegd-bench: churn");
    let churn = run_churn(&args, &bins, &rt).context("churn")?;
    print_table(&runs, polled.as_ref(), &churn);
    println!("at the end: {}", machine());
    Ok(())
}
