//! `plegd-bench`: plegd's benchmark suite (BENCHMARKS.md). It starts the
//! simulated runtime (`plegd-sim`) and the release `plegd` as two processes talking
//! CRI over a unix socket, drives each workload, and prints one table:
//!
//! - per node size: the first global relist, a steady no-change global relist (wall
//!   time and plegd's CPU), resident memory, single exits (latency, the targeted
//!   relist's duration), bursts of 20 exits, and on large nodes a storm of stops;
//! - single-exit latency with `--evented=false`, and memory after a churn of
//!   short-lived pods (with plegd's defaults, and with its event history and
//!   tombstones bounded small, so a leak shows apart from what they hold by design);
//! - fan-out: single exits and bursts while 1, 100 and 1,000 watchers of the
//!   subscriber API receive every event, and whether the global relist kept its period.
//!
//! `--smoke` runs a seconds-long version of everything (scripts/test.sh), so the
//! harness cannot rot. `--containerd ENDPOINT` measures against a real containerd
//! instead (module `real`).

mod cpu_wait;
mod cri;
mod fanout;
mod fanout_row;
mod floor;
mod poller_process;
mod procs;
mod real;
mod real_cri;
mod schedule;
mod storm_floor;
mod workloads;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::Parser;

use cri::Cri;
use procs::{Node, Plegd, Sim};
use workloads::Exits;

#[derive(Parser)]
#[command(
    name = "plegd-bench",
    about = "plegd's benchmark suite: the release plegd against the simulated CRI runtime (or a real containerd), one table",
    long_about = "plegd's benchmark suite (BENCHMARKS.md). Starts the simulated runtime \
(plegd-sim) and the release plegd as two processes and prints one table: per node size the \
first and the no-change global relist, memory, single exits, bursts of 20 exits, storms; \
polled exits (--evented=false); memory over a churn of short-lived pods (plegd's defaults, \
then history and tombstones bounded); fan-out to 1, 100, 1,000 watchers of the subscriber API. \
With --containerd, measures plegd against a real containerd instead. --smoke: seconds."
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
    /// Which groups of rows to run: sizes (per node size: relists, memory, exits,
    /// storm; and the polled exits), churn, fanout.
    #[arg(long, value_delimiter = ',', default_value = "sizes,churn,fanout")]
    only: Vec<Rows>,
    /// The light node of earlier rounds (container IDs of 14 characters, no labels
    /// nor annotations) instead of the realistic one: containerd's 64-hex IDs,
    /// Deployment pods with kubelet's labels and annotations (plegd_sim::kubelet).
    #[arg(long)]
    light_node: bool,
    /// On the realistic node, every this-many-th sandbox (0: none) carries one more
    /// annotation of --heavy-bytes bytes (a heavier pod: a mesh's sidecar status...).
    #[arg(long, default_value_t = 0)]
    heavy_every: usize,
    #[arg(long, default_value_t = 2048)]
    heavy_bytes: usize,
    /// First global relists measured at each size: each by a fresh plegd on the same
    /// node, and as many of the bare client's reads of the same objects (its floor);
    /// the rows give the first and the median.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    first_relists: u32,
    /// Reads of both lists by the bare client whose CPU is the floor of a no-change
    /// global relist (at each size), --floor-pace apart.
    #[arg(long, default_value_t = 10)]
    floor_reads: u32,
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    floor_pace: Duration,
    /// Internal: be the floor's child at this CRI endpoint (glibc's thresholds fixed
    /// as plegd's; --floor-reads raw reads; prints their CPU per read in ns).
    #[arg(long, hide = true)]
    floor_child: Option<String>,
    /// Internal: be a status poller in a process of its own at this CRI endpoint
    /// (`--containerd`'s second poller; poller_process.rs).
    #[arg(long, hide = true)]
    status_poller_child: Option<String>,
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
    /// Also run the churn with plegd's event history and tombstones bounded small
    /// (--bounded-history-events, --bounded-tombstone-ttl): what remains of the growth
    /// then is not what they hold by design.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    churn_bounded: bool,
    /// plegd's --history-events in the bounded churn.
    #[arg(long, default_value_t = 1024)]
    bounded_history_events: usize,
    /// plegd's --tombstone-ttl in the bounded churn (the churn's RSS "after" is read
    /// 3 global relists, and at least 1.5 --memory-trim-period, after the last pod
    /// went: keep it under 3 s).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    bounded_tombstone_ttl: Duration,
    /// Watcher counts of the fan-out rows (0: none). Each gets a fresh node and plegd.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    fanout: Vec<usize>,
    /// Pods of the fan-out node: at least --singles + 20 × --bursts.
    #[arg(long, default_value_t = 100)]
    fanout_pods: usize,
    /// The fan-out's single exits start this far apart, so its run spans several
    /// global relist periods (the bursts follow, each after the last one's events).
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    fanout_pace: Duration,
    /// Client connections the watchers share (round robin; plegd serves at most 256
    /// connections at once, up to 2,048 streams on each).
    #[arg(long, default_value_t = 8)]
    fanout_connections: usize,
    /// Measure against this real containerd (unix:///path/to/containerd.sock, as
    /// scripts/containerd-up.sh prints it; root needed) instead of the simulated
    /// runtime: --singles container exits (SIGKILL of the container's process) one at
    /// a time and --bursts bursts of 20 at once; plegd's ContainerDied against a raw
    /// CRI GetContainerEvents subscriber (containerd 2.x only: 1.x splits CRI events
    /// between subscribers), a raw subscriber of containerd's event service
    /// (/tasks/exit), the exit (finished_at) and the kill. Fails at once when no
    /// containerd answers there.
    #[arg(long, value_name = "ENDPOINT")]
    containerd: Option<String>,
    /// More arguments for plegd (e.g. `--plegd-arg=--status-concurrency=16`;
    /// `--plegd-arg=--state-dir=run` gives each plegd a state dir of its own, fresh).
    #[arg(long = "plegd-arg", allow_hyphen_values = true)]
    plegd_args: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Rows {
    Sizes,
    Churn,
    Fanout,
}

impl Args {
    /// The node plegd-sim builds, of `pods` pods.
    fn node(&self, pods: usize) -> Node {
        Node {
            pods,
            containers: CONTAINERS,
            light: self.light_node,
            heavy_every: self.heavy_every,
            heavy_bytes: self.heavy_bytes,
        }
    }

    /// What the churn's pods carry: kubelet's metadata unless on the light node.
    fn kubelet(&self) -> Option<plegd_sim::Kubelet> {
        (!self.light_node).then_some(plegd_sim::Kubelet {
            heavy_every: self.heavy_every,
            heavy_bytes: self.heavy_bytes,
        })
    }

    fn smoke(mut self) -> Self {
        self.sizes = vec![0, 60, 300];
        self.singles = 5;
        self.first_relists = 2;
        self.bursts = 1;
        self.storm_stops = 200;
        self.storm_window = Duration::from_millis(200);
        self.steady_window = Duration::from_secs(2);
        self.floor_reads = 3;
        self.churn_pods = 200;
        self.churn_live = 50;
        self.polled_singles = 2;
        self.fanout = vec![3];
        self.fanout_pods = 60;
        self.fanout_connections = 2;
        self.fanout_pace = Duration::from_millis(50);
        // The churn row waits 1.5 trim periods for each reading (default 10 s): the
        // smoke run checks the harness, not plegd's memory.
        if !self
            .plegd_args
            .iter()
            .any(|a| a.starts_with("--memory-trim-period"))
        {
            self.plegd_args.push("--memory-trim-period=1s".into());
        }
        self
    }
}

const CONTAINERS: usize = 2;
/// plegd's --runtime-max-message-size against the simulated runtime (see `main`).
const SIM_MAX_MESSAGE: &str = "64MiB";
/// plegd's default `--relist-period`, which the steady window is cut to (do not
/// change it with --plegd-arg).
const PERIOD: Duration = Duration::from_secs(1);
/// How often the memory row samples plegd's RSS over two periods.
const RSS_SAMPLE: Duration = Duration::from_millis(10);
const BURST: usize = 20;
/// ContainerStatus calls in flight of the bare reads: plegd's default `--status-concurrency`.
const STATUS_IN_FLIGHT: usize = 32;
/// The name of the bench's watcher thread (its CPU time is shown in the fan-out rows).
const WATCHERS_THREAD: &str = "watchers";

/// What one node size measured.
#[derive(Default)]
struct SizeRun {
    pods: usize,
    first_relist: Option<Duration>,
    /// The first relists of the fresh plegds after it (--first-relists).
    first_relist_again: Vec<Duration>,
    ready: Duration,
    /// plegd's CPU from its start to ready (the first relist and start-up).
    ready_cpu: Option<Duration>,
    /// The bare reads a first relist makes (`Cri::read_every_status`): wall; reads.
    bare_reads: Option<(Duration, usize)>,
    /// The same reads again (--first-relists).
    bare_reads_again: Vec<Duration>,
    steady: Option<workloads::Steady>,
    /// A bare client's reads of the same two lists (the no-change relist's floor).
    floor: Option<floor::Floor>,
    /// Resident memory between global relists (the least sampled over two periods).
    rss_kib: u64,
    /// The most sampled then (a relist's lists held).
    rss_peak_kib: u64,
    /// plegd_event_history_bytes then: the subscriber API's history, counted apart
    /// from the memory per pod.
    history_bytes: f64,
    singles: Option<Exits>,
    targeted: Option<Duration>,
    bursts: Vec<Duration>,
    storm: Option<workloads::Storm>,
    storm_floor: Option<storm_floor::StormFloor>,
}

/// "; again: B, C; median M" for a measure taken again (nothing if it was not).
fn again(first: Option<Duration>, more: &[Duration]) -> String {
    if more.is_empty() {
        return String::new();
    }
    let mut all: Vec<Duration> = first.into_iter().chain(more.iter().copied()).collect();
    all.sort();
    let more: Vec<String> = more.iter().map(|d| ms(*d)).collect();
    let n = all.len();
    let median = (all[(n - 1) / 2] + all[n / 2]) / 2;
    format!("; again: {}; median {}", more.join(", "), ms(median))
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
    Plegd::start(bin, &sim.endpoint(), sim.dir(), &args)
}

fn run_size(
    args: &Args,
    bins: &(PathBuf, PathBuf),
    rt: &tokio::runtime::Runtime,
    pods: usize,
    polled: &mut Option<Exits>,
) -> Result<SizeRun> {
    let sim = Sim::start(&bins.1, args.node(pods))?;
    let cri = Cri::new(sim.socket());
    let mut run = SizeRun {
        pods,
        ..SizeRun::default()
    };
    // The first relist and its floor, each alone on the node: the bare client's reads
    // with no plegd running, then a fresh plegd's first relist, --first-relists times
    // (the last plegd stays).
    let mut last = None;
    for i in 0..args.first_relists.max(1) {
        drop(last.take());
        if pods > 0 {
            let (took, reads) = rt.block_on(cri.read_every_status(STATUS_IN_FLIGHT))?;
            match i {
                0 => run.bare_reads = Some((took, reads)),
                _ => run.bare_reads_again.push(took),
            }
        }
        let plegd = start_plegd(&bins.0, &sim, &plegd_args(args, &[]))?;
        if i == 0 {
            run.ready = plegd.started.elapsed();
            run.first_relist = workloads::first_relist(&plegd)?;
            run.ready_cpu = Some(plegd.cpu()?);
        } else {
            run.first_relist_again
                .extend(workloads::first_relist(&plegd)?);
        }
        last = Some(plegd);
    }
    let Some(plegd) = last else {
        bail!("no plegd was started");
    };
    run.steady = Some(workloads::steady(&plegd, args.steady_window, PERIOD)?);
    (run.rss_kib, run.rss_peak_kib) = plegd.rss_range_kib(2 * PERIOD, RSS_SAMPLE)?;
    run.history_bytes = plegd
        .metrics()?
        .find("plegd_event_history_bytes", &[])
        .unwrap_or(0.0);
    if pods == 0 {
        return Ok(run);
    }
    run.floor = Some(floor::measure(
        &sim.endpoint(),
        args.floor_reads,
        args.floor_pace,
    )?);
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
        drop((plegd, sim));
        run.storm_floor = Some(measure_storm_floor(args, &bins.1, rt, pods)?);
        return Ok(run);
    }
    if polled.is_none() && pods >= args.polled_singles && pods < args.storm_stops {
        drop(plegd);
        let plegd = start_plegd(&bins.0, &sim, &plegd_args(args, &["--evented=false"]))?;
        let ids = &second[pods - args.polled_singles..];
        *polled = Some(workloads::single_exits(rt, &plegd, &cri, ids)?.0);
    }
    Ok(run)
}

/// The storm's floor ([`storm_floor`]) on fresh nodes of `pods`: app-1 of the first
/// pods alone, app-0 of the same pods beside the lists; a targeted relist's reads on
/// a second fresh node.
fn measure_storm_floor(
    args: &Args,
    sim_bin: &Path,
    rt: &tokio::runtime::Runtime,
    pods: usize,
) -> Result<storm_floor::StormFloor> {
    use storm_floor::{Reads, Storm};
    let storm = |reads, lists_every| Storm {
        window: args.storm_window,
        in_flight: STATUS_IN_FLIGHT,
        reads,
        lists_every,
    };
    let mut floor = storm_floor::StormFloor::default();
    for fresh in 0..2 {
        let sim = Sim::start(sim_bin, args.node(pods))?;
        let cri = Cri::new(sim.socket());
        let node = rt.block_on(cri.pods())?;
        let n = args.storm_stops.min(node.len());
        let container = |i: usize| -> Vec<(String, String)> {
            node[..n]
                .iter()
                .map(|p| (p.sandbox.clone(), p.containers[i].clone()))
                .collect()
        };
        let endpoint = sim.endpoint();
        let runtime = (&cri, endpoint.as_str());
        if fresh == 0 {
            floor.alone =
                storm_floor::answered(rt, runtime, &container(1), &storm(Reads::Status, None))?;
            floor.beside_lists = storm_floor::answered(
                rt,
                runtime,
                &container(0),
                &storm(Reads::Status, Some(PERIOD)),
            )?;
        } else {
            floor.pod_reads = storm_floor::answered(
                rt,
                runtime,
                &container(1),
                &storm(Reads::Pod, Some(PERIOD)),
            )?;
        }
    }
    Ok(floor)
}

struct Churn {
    /// What plegd ran with besides its defaults ("" for none).
    settings: String,
    live: usize,
    pods: usize,
    took: Duration,
    before_kib: u64,
    peak_kib: u64,
    after_kib: u64,
    /// RssAnon before and after.
    anon_kib: (u64, u64),
}

fn run_churn(
    args: &Args,
    bins: &(PathBuf, PathBuf),
    rt: &tokio::runtime::Runtime,
    settings: &[&str],
) -> Result<Churn> {
    let plegd_args = plegd_args(args, settings);
    let settle = memory_settles_in(&bins.0, &plegd_args)?;
    let sim = Sim::start(&bins.1, args.node(args.churn_live))?;
    let plegd = start_plegd(&bins.0, &sim, &plegd_args)?;
    settled(&plegd, settle)?;
    let before_kib = plegd.rss_kib()?;
    let before_anon_kib = plegd.anon_kib()?;
    churn_hook(&plegd, "before");
    let cri = Cri::new(sim.socket()).playing_kubelet(args.kubelet());
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
    settled(&plegd, settle)?;
    churn_hook(&plegd, "after");
    Ok(Churn {
        settings: settings.join(" "),
        live: args.churn_live,
        pods: args.churn_pods,
        took,
        before_kib,
        peak_kib,
        after_kib: plegd.rss_kib()?,
        anon_kib: (before_anon_kib, plegd.anon_kib()?),
    })
}

/// Runs `$PLEGD_BENCH_CHURN_HOOK` (a shell command; none if unset) with plegd's pid and
/// the moment (`before`, `after`) as `$1` and `$2`, right after the churn's reading of
/// RSS then: e.g. a look at glibc's heaps with gdb (`call malloc_stats()`).
fn churn_hook(plegd: &Plegd, moment: &str) {
    let Ok(hook) = std::env::var("PLEGD_BENCH_CHURN_HOOK") else {
        return;
    };
    let status = std::process::Command::new("sh")
        .args(["-c", &hook, "hook", &plegd.pid().to_string(), moment])
        .status();
    if let Err(e) = status {
        eprintln!("plegd-bench: PLEGD_BENCH_CHURN_HOOK: {e}");
    }
}

/// How long plegd's memory takes to settle: plegd gives its heap's free pages back
/// every `--memory-trim-period` (plegd_telemetry::malloc), and what a churn freed shows in
/// its RSS until then. One and a half periods contain a whole period, so a trim that
/// began after the wait did; read from the effective configuration (`--print-config`:
/// the defaults, the environment and the given flags), not assumed. Zero with the trim
/// off.
fn memory_settles_in(bin: &Path, plegd_args: &[String]) -> Result<Duration> {
    let out = std::process::Command::new(bin)
        .args(["run", "--runtime-endpoint", "unix:///dev/null"])
        .args(plegd_args)
        .arg("--print-config")
        .output()
        .with_context(|| format!("{} --print-config", bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} --print-config failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let config = String::from_utf8_lossy(&out.stdout);
    let period = config
        .lines()
        .find_map(|l| l.strip_prefix("memory-trim-period = "))
        .map(|v| v.trim().trim_matches('"'))
        .context("no memory-trim-period in plegd's --print-config")?;
    if period == "off" {
        return Ok(Duration::ZERO);
    }
    let period = humantime::parse_duration(period)
        .with_context(|| format!("plegd's memory-trim-period {period:?}"))?;
    Ok(period * 3 / 2)
}

/// Waits until plegd's memory has settled: 3 global relists, and at least `settle`
/// (the same wait before the churn's "before" reading as before its "after").
fn settled(plegd: &Plegd, settle: Duration) -> Result<()> {
    let start = std::time::Instant::now();
    workloads::relists(plegd, 3)?;
    while start.elapsed() < settle {
        workloads::relists(plegd, 1)?;
    }
    Ok(())
}

/// One fan-out row: a fresh node of --fanout-pods pods and plegd, `watchers` watchers.
fn run_fanout(
    args: &Args,
    bins: &(PathBuf, PathBuf),
    rts: (&tokio::runtime::Runtime, &tokio::runtime::Runtime),
    watchers: usize,
) -> Result<fanout_row::FanoutRun> {
    let pods = args.fanout_pods;
    let need = args.singles + BURST * args.bursts;
    if pods < need {
        bail!("--fanout-pods {pods} is too few for --singles and --bursts: at least {need}");
    }
    let sim = Sim::start(&bins.1, args.node(pods))?;
    let plegd = start_plegd(&bins.0, &sim, &plegd_args(args, &[]))?;
    let cri = Cri::new(sim.socket());
    let node = rts.0.block_on(cri.pods())?;
    let first: Vec<String> = node.iter().map(|p| p.containers[0].clone()).collect();
    if first.len() < need {
        bail!("the simulated node has {} pods, not {pods}", first.len());
    }
    let plan = fanout_row::Plan {
        watchers,
        connections: args.fanout_connections,
        singles: &first[..args.singles],
        bursts: first[args.singles..need].chunks_exact(BURST).collect(),
        period: PERIOD,
        pace: args.fanout_pace,
    };
    fanout_row::run(rts.0, rts.1, &plegd, &cri, pods, &plan)
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

fn print_table(
    runs: &[SizeRun],
    polled: Option<&Exits>,
    churns: &[Churn],
    fanouts: &[fanout_row::FanoutRun],
) {
    let empty = runs.iter().find(|r| r.pods == 0).map(|r| r.rss_kib);
    let empty_peak = runs.iter().find(|r| r.pods == 0).map(|r| r.rss_peak_kib);
    println!("| measure | pods | figure |");
    println!("|---|---|---|");
    for r in runs {
        let p = r.pods;
        println!(
            "| first global relist (plegd's histogram); start to ready; plegd CPU to ready | {p} | {}; {}; {}{} |",
            opt_ms(r.first_relist),
            ms(r.ready),
            opt_ms(r.ready_cpu),
            again(r.first_relist, &r.first_relist_again)
        );
        if let Some((took, reads)) = r.bare_reads {
            println!(
                "| the same reads by a bare tonic client, no plegd running (both lists, {reads} ContainerStatus, {STATUS_IN_FLIGHT} in flight) | {p} | {}{} |",
                ms(took),
                again(Some(took), &r.bare_reads_again)
            );
        }
        if let Some(s) = &r.steady {
            println!(
                "| no-change global relist: wall; plegd CPU ({} relists) | {p} | {}; {} |",
                s.relists,
                ms(s.wall),
                ms(s.cpu)
            );
        }
        if let Some(f) = &r.floor {
            // plegd's no-change relist CPU ÷ a floor.
            let over = |floor: Duration| {
                r.steady
                    .as_ref()
                    .filter(|_| !floor.is_zero())
                    .map_or("–".to_string(), |s| {
                        format!("{:.1}×", s.cpu.as_secs_f64() / floor.as_secs_f64())
                    })
            };
            let ratio = over(f.raw);
            println!(
                "| floor: a bare client on plegd's transport receiving both lists, each frame dropped as it arrives: CPU per read ({} reads); decoded by prost and dropped; plegd's no-change relist CPU ÷ floor; list bytes (sandboxes, containers) | {p} | {}; {}; {ratio}; {:.0} KiB, {:.0} KiB |",
                f.reads,
                ms(f.raw),
                ms(f.decoded),
                f.bytes.0 as f64 / 1024.0,
                f.bytes.1 as f64 / 1024.0,
            );
            let ratio_fixed = over(f.raw_fixed);
            println!(
                "| the same floor with plegd's glibc thresholds and trim (in a child process): CPU per read; plegd's no-change relist CPU ÷ it | {p} | {}; {ratio_fixed} |",
                ms(f.raw_fixed),
            );
        }
        let per_pod = match (empty, p) {
            (Some(e), p) if p > 0 => {
                let over = (r.rss_kib as f64 - e as f64) * 1024.0;
                format!(
                    "; {:.0} B/pod over empty; without the event history ({:.1} MB): {:.0} B/pod",
                    over / p as f64,
                    r.history_bytes / 1e6,
                    (over - r.history_bytes) / p as f64
                )
            }
            _ => String::new(),
        };
        println!(
            "| resident memory between global relists (the least of 2 s of samples) | {p} | {}{per_pod} |",
            mib(r.rss_kib)
        );
        let peak_per_pod = match (empty_peak, p) {
            (Some(e), p) if p > 0 => format!(
                "; {:.0} B/pod over the empty node's most",
                (r.rss_peak_kib as f64 - e as f64) * 1024.0 / p as f64
            ),
            _ => String::new(),
        };
        println!(
            "| resident memory at its most (2 s of samples: a relist holds the runtime's two lists) | {p} | {}{peak_per_pod} |",
            mib(r.rss_peak_kib)
        );
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
                "| storm of {} stops: all published after; latency; requests dropped; plegd's CPU meanwhile | {p} | {}; {}; {}; {} |",
                s.exits.latencies.len() + s.exits.missing,
                ms(s.total),
                exits_cell(&s.exits),
                s.dropped,
                ms(s.cpu)
            );
        }
        if let Some(f) = &r.storm_floor {
            println!(
                "| the storm's floor, on a fresh node with no plegd: stop → a bare client's EXITED answer to its CRI event ({STATUS_IN_FLIGHT} containers read at once): ContainerStatus; the same beside a bare read of both lists every {}; the pod's two lists and ContainerStatus beside them | {p} | {}; {}; {} |",
                humantime::format_duration(PERIOD),
                answered_cell(&f.alone),
                answered_cell(&f.beside_lists),
                answered_cell(&f.pod_reads)
            );
        }
    }
    if let Some(e) = polled {
        println!(
            "| single exit, --evented=false | small | {} |",
            exits_cell(e)
        );
    }
    for churn in churns {
        let settings = if churn.settings.is_empty() {
            String::new()
        } else {
            format!(", plegd {}", churn.settings)
        };
        println!(
            "| churn: {} short-lived pods ({} live) in {:.0} s{settings}: RSS before; peak; after; after − before, RSS and RssAnon (heap) | {} | {}; {}; {}; {:+} KiB, {:+} KiB |",
            churn.pods,
            churn.live,
            churn.took.as_secs_f64(),
            churn.live,
            mib(churn.before_kib),
            mib(churn.peak_kib),
            mib(churn.after_kib),
            churn.after_kib as i64 - churn.before_kib as i64,
            churn.anon_kib.1 as i64 - churn.anon_kib.0 as i64
        );
    }
    for f in fanouts {
        print_fanout(f);
    }
}

/// Latencies of answers, with how many never came.
fn answered_cell(e: &Exits) -> String {
    let missing = if e.missing > 0 {
        format!(
            " ({} of {} unanswered)",
            e.missing,
            e.missing + e.latencies.len()
        )
    } else {
        String::new()
    };
    format!("{}{missing}", lat_cell(&e.latencies))
}

fn lat_cell(v: &[Duration]) -> String {
    use fanout_row::percentile;
    format!(
        "p50 {} p99 {} max {}",
        opt_ms(percentile(v, 0.5)),
        opt_ms(percentile(v, 0.99)),
        opt_ms(percentile(v, 1.0))
    )
}

fn print_fanout(f: &fanout_row::FanoutRun) {
    use fanout_row::percentile;
    let (w, p) = (f.watchers, f.pods);
    let who = format!(
        "fan-out, {w} watcher{} on {} connection{}",
        if w == 1 { "" } else { "s" },
        f.connections,
        if f.connections == 1 { "" } else { "s" }
    );
    let signed = |v: Option<f64>| v.map_or("–".to_string(), |ms| format!("{ms:+.2} ms"));
    println!(
        "| {who}: single exit, stop → each watcher's ContainerDied ({} exits × {w}); stop → plegd's stdout line; watcher − stdout line | {p} | {}; p50 {}; p50 {} p99 {} |",
        f.singles,
        lat_cell(&f.single),
        opt_ms(percentile(&f.single_stdout, 0.5)),
        signed(percentile(&f.over_stdout, 0.5)),
        signed(percentile(&f.over_stdout, 0.99)),
    );
    if f.bursts > 0 {
        let last: Vec<String> = f.burst_last.iter().map(|d| ms(*d)).collect();
        println!(
            "| {who}: {BURST} exits at once ({} bursts), stop → each watcher's ContainerDied; last stop → last receipt | {p} | {}; {} |",
            f.bursts,
            lat_cell(&f.burst),
            last.join(", ")
        );
    }
    let s = &f.schedule;
    println!(
        "| {who}: events missed (not received, `missed`, seq gaps, streams ended); global relists during the run: count (expected at the period), mean interval, longest gap | {p} | {} ({}, {}, {}, {}); {} in {:.1} s ({:.1}), {}, {} |",
        f.all_missed(),
        f.lost,
        f.missed,
        f.gaps,
        f.failed,
        s.relists,
        s.window.as_secs_f64(),
        s.expected(),
        opt_ms(s.mean_interval),
        opt_ms(s.longest_gap),
    );
    println!(
        "| {who}: CPU over the run: plegd (all threads); its API thread; the bench's watcher thread | {p} | {}; {}; {} in {:.1} s |",
        ms(f.cpu.plegd),
        ms(f.cpu.plegd_api),
        ms(f.cpu.watchers),
        s.window.as_secs_f64(),
    );
}

/// A tokio runtime of one worker thread (named `thread`, if given); `what` names it
/// in the error.
pub(crate) fn one_worker_runtime(
    what: &str,
    thread: Option<&str>,
) -> Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(1).enable_all();
    if let Some(name) = thread {
        builder.thread_name(name);
    }
    builder.build().with_context(|| what.to_string())
}

fn main() -> Result<()> {
    let mut args = Args::parse();
    if let Some(endpoint) = &args.floor_child {
        return floor::child(endpoint, args.floor_reads, args.floor_pace);
    }
    if let Some(endpoint) = &args.status_poller_child {
        return poller_process::run_child(endpoint);
    }
    if args.smoke {
        args = args.smoke();
    }
    // The realistic node's ListContainers outgrows plegd's default limit (16 MiB, as
    // kubelet's) at about 9,000 pods (17.5 MB at 10,000): the simulated runtime's
    // rows raise it unless told otherwise. A real containerd refuses to send more
    // than 16 MiB anyway (plegd then names the call and the limit, and reads the
    // streaming lists where the runtime offers them).
    if args.containerd.is_none()
        && !args
            .plegd_args
            .iter()
            .any(|a| a.starts_with("--runtime-max-message-size"))
    {
        args.plegd_args
            .push(format!("--runtime-max-message-size={SIM_MAX_MESSAGE}"));
    }
    let bins = (
        args.plegd.clone().map_or_else(|| beside_me("plegd"), Ok)?,
        args.sim
            .clone()
            .map_or_else(|| beside_me("plegd-sim"), Ok)?,
    );
    let needed: &[&PathBuf] = if args.containerd.is_some() {
        &[&bins.0]
    } else {
        &[&bins.0, &bins.1]
    };
    for b in needed {
        if !b.is_file() {
            bail!(
                "{} not found: build it (cargo build --release -p plegd -p plegd-sim)",
                b.display()
            );
        }
    }
    let rt = one_worker_runtime("the async runtime", None)?;
    // The CRI channel is made outside the runtime's futures.
    let _entered = rt.enter();
    // The watchers' (and the raw CRI subscriber's) own runtime: one worker thread, so
    // they never compete with the harness's CRI calls (which run on `rt`).
    let watch_rt = one_worker_runtime("the watchers' async runtime", Some(WATCHERS_THREAD))?;
    if let Some(endpoint) = &args.containerd {
        let o = real::Options {
            endpoint,
            plegd: &bins.0,
            plegd_args: &args.plegd_args,
            singles: args.singles,
            bursts: args.bursts,
        };
        return real::run(&o, &rt, &watch_rt);
    }
    println!(
        "plegd-bench: {} {}; {}; {}",
        bins.0.display(),
        args.plegd_args.join(" "),
        machine(),
        if args.light_node {
            "the light node (short IDs, no labels nor annotations)".to_string()
        } else if args.heavy_every > 0 {
            format!(
                "the realistic node (64-hex IDs, kubelet's labels and annotations; every {}th sandbox +{} B)",
                args.heavy_every, args.heavy_bytes
            )
        } else {
            "the realistic node (64-hex IDs, kubelet's labels and annotations)".to_string()
        }
    );
    let mut runs = Vec::new();
    let mut polled = None;
    let sizes = if args.only.contains(&Rows::Sizes) {
        args.sizes.clone()
    } else {
        Vec::new()
    };
    for &pods in &sizes {
        eprintln!("plegd-bench: {pods} pods");
        runs.push(
            run_size(&args, &bins, &rt, pods, &mut polled)
                .with_context(|| format!("at {pods} pods"))?,
        );
    }
    let mut churns = Vec::new();
    if args.only.contains(&Rows::Churn) {
        eprintln!("plegd-bench: churn");
        churns.push(run_churn(&args, &bins, &rt, &[]).context("churn")?);
    }
    if args.churn_bounded && args.only.contains(&Rows::Churn) {
        eprintln!("plegd-bench: churn, history and tombstones bounded");
        let history = format!("--history-events={}", args.bounded_history_events);
        let ttl = format!(
            "--tombstone-ttl={}",
            humantime::format_duration(args.bounded_tombstone_ttl)
        );
        churns.push(
            run_churn(&args, &bins, &rt, &[history.as_str(), ttl.as_str()])
                .context("churn, bounded")?,
        );
    }
    let mut fanouts = Vec::new();
    let fanout = if args.only.contains(&Rows::Fanout) {
        args.fanout.clone()
    } else {
        Vec::new()
    };
    for &w in fanout.iter().filter(|&&w| w > 0) {
        eprintln!("plegd-bench: fan-out to {w} watchers");
        let f = run_fanout(&args, &bins, (&rt, &watch_rt), w)
            .with_context(|| format!("fan-out to {w} watchers"))?;
        // The smoke run checks the harness: every watcher must get every event.
        if args.smoke && f.all_missed() > 0 {
            bail!(
                "fan-out to {w} watchers: {} events missed (not received {}, missed {}, seq gaps {}, streams ended {})",
                f.all_missed(),
                f.lost,
                f.missed,
                f.gaps,
                f.failed
            );
        }
        fanouts.push(f);
    }
    print_table(&runs, polled.as_ref(), &churns, &fanouts);
    println!("at the end: {}", machine());
    Ok(())
}
