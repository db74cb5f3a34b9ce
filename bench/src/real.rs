//! `--containerd ENDPOINT`: plegd against a real containerd. plegd
//! runs as its own process with its default hint sources (plus `--nri-socket` when the
//! containerd of `scripts/containerd-up.sh` has one next to its socket); the harness
//! makes host-network busybox pods (single exits: 20 containers a pod; a burst: 20
//! pods of one container) whose container process is `sleep`, and kills
//! those processes (SIGKILL, one `kill` for all the processes of a burst, as a crash:
//! not through CRI, whose StopContainer calls containerd serialises), one at a time
//! and 20 at once.
//!
//! For each exit it measures when plegd's ContainerDied reached its stdout and:
//! - on containerd 2.x, which broadcasts CRI events to every subscriber: when a raw
//!   GetContainerEvents subscriber in this process received the same container's
//!   CONTAINER_STOPPED_EVENT (the runtime's own speed), so plegd − raw is what plegd
//!   adds; and when that subscriber's own check of the event (the reads of plegd's
//!   targeted relist, sent on arrival) was answered, side by side with plegd's; and
//!   when a second such subscriber, a status poller (the container's ContainerStatus
//!   alone, sent on arrival and again until it says EXITED), had its EXITED answer;
//!   and a second status poller the same as the first but in a process of its own
//!   (`poller_process`), whose answers − the first's show how far apart two identical
//!   clients fall (what plegd − poller is read against).
//!   Their reads load containerd at the moment plegd reads too, so the single exits
//!   are made in three sets in turn: with them all checking; with them quiet
//!   (stamping arrivals only): plegd − raw without them; and with the first status
//!   poller alone checking: on the same exits as plegd's, the floor of one status read;
//! - on containerd 1.x, which splits CRI events between concurrent subscribers (a raw
//!   subscriber would take events from plegd's stream): no raw CRI subscriber;
//! - on both: when a raw subscriber of containerd's own event service (which publishes
//!   to every subscriber, on 1.7 too) received the container's /tasks/exit; the exit
//!   (the container's `finished_at`, set by the runtime) → plegd's ContainerDied; and
//!   the kill → ContainerDied.
//!
//! First, before plegd starts, containerd's own floor: on 1.x, exit → a raw CRI event
//! (the stream's only subscriber); on 2.x, a raw CRI event's arrival → the answers of
//! the reads a client must make before it reports that exit as true (both filtered
//! lists and the container's ContainerStatus, sent together on arrival: what plegd's
//! targeted relist reads), for single exits and bursts. plegd treats every event as a
//! hint and reports what its reads say (a death on the status read alone, which it
//! sends first), so the status poller beside it is the closer mark.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use futures::future::join_all;
use futures::StreamExt as _;

use crate::cpu_wait::{CpuWaits, SinceArrival, Waited};
use crate::fanout_row::percentile;
use crate::poller_process;
use crate::procs::{epoch_ns, Plegd, Seen};
use crate::real_cri::{kill, Check, Pod, RawExits, RealCri};
use crate::workloads;

const BURST: usize = 20;
/// Warm-up exits at most, until plegd reports one through a hint (not the global relist).
const WARMUP: usize = 10;
const PATIENCE: Duration = Duration::from_secs(30);

/// One exit as the harness saw it.
struct Sample {
    id: String,
    killed: Instant,
    /// The container's finished_at, ns since the epoch.
    finished_ns: i64,
    plegd: Option<Seen>,
    /// What the checking raw CRI subscribers saw, in the order of [`CHECKS`]
    /// (containerd 2.x only); the first one's event arrival is the raw CRI
    /// CONTAINER_STOPPED_EVENT's.
    checked: [Checked; CHECKS.len()],
    /// The raw /tasks/exit's arrival (containerd's event service).
    raw_task: Option<Instant>,
    /// The reads of a targeted relist of the pod, made by the harness after plegd
    /// reported the death: (both lists, ContainerStatus), singles only.
    reads: Option<(Duration, Duration)>,
    /// The waits for a CPU of the threads that carry plegd's ContainerDied, from the
    /// raw CRI event's arrival (containerd 2.x only) to plegd's ContainerDied.
    waited: Option<Waited>,
}

/// A checking raw CRI subscriber's view of one exit.
#[derive(Clone, Copy, Default)]
struct Checked {
    /// Its CONTAINER_STOPPED_EVENT's arrival.
    arrived: Option<Instant>,
    /// The answer of its reads that said EXITED.
    answered: Option<Instant>,
}

/// A checking raw CRI subscriber beside plegd (containerd 2.x only) and how the rows
/// name it.
struct Checker {
    check: Check,
    /// In a process of its own (`poller_process`; a status poller only), not on the
    /// harness's runtime.
    own_process: bool,
    /// Its answer, beside plegd.
    client: &'static str,
    /// Its answer, after "plegd's ContainerDied −".
    answer: &'static str,
}

/// The checking raw CRI subscribers beside plegd: one that checks each event with the
/// reads of plegd's targeted relist, all three at once (the event's arrival in the
/// rows is its); a status poller; and a second status poller the same as the first,
/// in a process of its own as plegd is, so that the rows show how far apart two
/// identical clients' answers fall (the tail plegd − the poller is read against).
const CHECKS: [Checker; 3] = [
    Checker {
        check: Check::PodReads,
        own_process: false,
        client: "the raw subscriber's own check of the event answered",
        answer: "the raw subscriber's check answered",
    },
    Checker {
        check: Check::Status,
        own_process: false,
        client: "the status poller's EXITED answer (ContainerStatus alone, sent on arrival and again until EXITED)",
        answer: "the status poller's EXITED answer",
    },
    Checker {
        check: Check::Status,
        own_process: true,
        client: "a second status poller's EXITED answer (the same as the first, in a process of its own)",
        answer: "the second status poller's EXITED answer",
    },
];
/// Where the status pollers are in [`CHECKS`].
const POLLER: usize = 1;
const SECOND_POLLER: usize = 2;

/// Which checking CRI subscribers check a single exit beside plegd (the others only
/// stamp its arrival).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Beside {
    All,
    /// None: what plegd − the raw event is without their reads.
    Quiet,
    /// The first status poller alone: on the same exits as plegd's, the floor of a
    /// client that answers each event with one ContainerStatus.
    Poller,
}

impl Beside {
    /// The set a single exit `i` (from 0) belongs to, on containerd 2.x: each in turn.
    fn of(i: usize) -> Beside {
        [Beside::All, Beside::Quiet, Beside::Poller][i % 3]
    }

    /// Whether checker `k` of [`CHECKS`] is quiet.
    fn quiets(self, k: usize) -> bool {
        match self {
            Beside::All => false,
            Beside::Quiet => true,
            Beside::Poller => k != POLLER,
        }
    }
}

/// The raw subscribers.
struct Raws {
    /// The checking CRI subscribers, in the order of [`CHECKS`] (containerd 2.x only).
    cri: Option<[RawExits; CHECKS.len()]>,
    /// Each one's: while set, it only stamps each event's arrival.
    quiet: [Arc<AtomicBool>; CHECKS.len()],
    task: RawExits,
}

impl Raws {
    /// Lets the checking CRI subscribers that `beside` names check and quiets the
    /// others, each once it has taken it.
    fn set_beside(&self, beside: Beside) -> Result<()> {
        for (k, q) in self.quiet.iter().enumerate() {
            q.store(beside.quiets(k), Ordering::SeqCst);
        }
        for (k, r) in self.cri.iter().flatten().enumerate() {
            r.set_quiet(beside.quiets(k))?;
        }
        Ok(())
    }

    /// What the checking CRI subscribers saw of `ids` (waiting up to `patience` for
    /// each), in the order of `ids`.
    fn checked(&self, ids: &[String], patience: Duration) -> Result<Vec<[Checked; CHECKS.len()]>> {
        let mut out = vec![[Checked::default(); CHECKS.len()]; ids.len()];
        for (k, r) in self.cri.iter().flatten().enumerate() {
            for ((row, id), answered) in out.iter_mut().zip(ids).zip(r.wait(ids, patience)?) {
                row[k] = Checked {
                    arrived: r.arrived(id),
                    answered,
                };
            }
        }
        Ok(out)
    }
}

fn ms_between(a: Instant, b: Instant) -> f64 {
    (epoch_ns(a) - epoch_ns(b)) as f64 / 1e6
}

/// What the harness needs from the command line.
pub struct Options<'a> {
    pub endpoint: &'a str,
    pub plegd: &'a Path,
    pub plegd_args: &'a [String],
    pub singles: usize,
    pub bursts: usize,
}

pub fn run(
    o: &Options<'_>,
    rt: &tokio::runtime::Runtime,
    watch_rt: &tokio::runtime::Runtime,
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cri = RealCri::new(o.endpoint, &dir.path().join("logs"))?;
    let (name, version) = rt.block_on(cri.version()).map_err(|e| {
        anyhow!(
            "no containerd answers CRI at {}: {e:#}\n\
             Start one (as root) with scripts/containerd-up.sh (PLEGD_CRI_CONTAINERD=2 for 2.1) \
             and pass the socket it prints: --containerd unix://SOCKET",
            o.endpoint
        )
    })?;
    let major: u32 = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .ok_or_else(|| anyhow!("{name} reports version {version:?}: not MAJOR.MINOR..."))?;
    let broadcast = major >= 2;
    let mut args: Vec<String> = o.plegd_args.to_vec();
    let socket = plegd_runtime::parse_unix_endpoint(o.endpoint)
        .map_err(|e| anyhow!("--containerd {:?}: {e}", o.endpoint))?;
    let nri = socket.with_file_name("nri.sock");
    if nri.exists() && !args.iter().any(|a| a.starts_with("--nri-socket")) {
        args.push(format!("--nri-socket={}", nri.display()));
    }
    let args_ref: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut pods = Vec::new();
    // containerd's own floor first, with no plegd running (on 1.x the CRI event stream
    // is then the raw subscriber's alone).
    let floor = if broadcast {
        verified_floor(o, rt, watch_rt, &cri, &mut pods)
    } else {
        containerd_floor(o, rt, watch_rt, &cri, &mut pods).map(|singles| Floor {
            singles,
            bursts: Vec::new(),
        })
    };
    let plegd = match Plegd::start(o.plegd, o.endpoint, dir.path(), &args_ref) {
        Ok(p) => p,
        Err(e) => {
            remove_pods(rt, &cri, &pods);
            return Err(e);
        }
    };
    let quiet: [Arc<AtomicBool>; CHECKS.len()] = Default::default();
    let checkers = match broadcast.then(|| checkers(o.endpoint, &cri, watch_rt, &quiet)) {
        Some(Err(e)) => {
            remove_pods(rt, &cri, &pods);
            return Err(e);
        }
        Some(Ok(c)) => Some(c),
        None => None,
    };
    let raws = Raws {
        cri: checkers,
        quiet,
        task: cri.raw_task_exits(watch_rt),
    };
    let waits = match CpuWaits::new(plegd.pid()) {
        Ok(w) => Arc::new(SinceArrival::new(w)),
        Err(e) => {
            remove_pods(rt, &cri, &pods);
            return Err(e);
        }
    };
    if let Some(first) = raws.cri.as_ref().map(|c| &c[0]) {
        let (w, r) = (waits.clone(), waits.clone());
        first.on_arrival(move |id| w.arrived(id));
        plegd.events.on_died(move |id| r.reported(id));
    }
    let out = floor.and_then(|floor| {
        measure(o, rt, &cri, &plegd, &raws, &waits, &mut pods).map(|m| (m, floor))
    });
    drop(raws);
    remove_pods(rt, &cri, &pods);
    let (m, floor) = out?;
    let hints = plegd
        .metrics()
        .map(|m| m.labels_at_one("plegd_hint_source_state").join(", "))
        .unwrap_or_default();
    println!(
        "plegd-bench --containerd: {name} {version} at {}; plegd {}; {}",
        o.endpoint,
        o.plegd.display(),
        crate::machine()
    );
    println!("plegd's hint sources at the end: {hints}");
    println!(
        "raw CRI subscriber: {}; raw subscriber of containerd's event service (/tasks/exit): yes; \
         {} warm-up exit(s) before the first one plegd found through a hint",
        if broadcast {
            "yes (containerd 2.x broadcasts CRI events to every subscriber)"
        } else {
            "none (containerd 1.x splits CRI events between subscribers: one would take events from plegd's stream); \
             measured against containerd's own event service, the exit (finished_at) and the kill instead"
        },
        m.warmup
    );
    print_rows(&m, broadcast, &floor);
    println!("at the end: {}", crate::machine());
    Ok(())
}

/// The checking CRI subscribers of [`CHECKS`], in its order.
fn checkers(
    endpoint: &str,
    cri: &RealCri,
    watch_rt: &tokio::runtime::Runtime,
    quiet: &[Arc<AtomicBool>; CHECKS.len()],
) -> Result<[RawExits; CHECKS.len()]> {
    let mut out = Vec::with_capacity(CHECKS.len());
    for (c, quiet) in CHECKS.iter().zip(quiet) {
        out.push(if c.own_process {
            poller_process::spawn(endpoint)?
        } else {
            cri.checked_stopped_events(watch_rt, c.check, quiet.clone())
        });
    }
    out.try_into()
        .map_err(|_| anyhow!("not one subscriber for each checker"))
}

/// Removes the pods the harness made (errors are told, not fatal: the figures stand).
fn remove_pods(rt: &tokio::runtime::Runtime, cri: &RealCri, pods: &[Pod]) {
    eprintln!("plegd-bench: removing the {} pods made", pods.len());
    for p in pods {
        if let Err(e) = rt.block_on(cri.remove_pod(&p.id)) {
            eprintln!("plegd-bench: {e:#}");
        }
    }
}

/// What the exits after plegd started gave.
struct Measured {
    /// The single exits with every checking subscriber checking beside plegd.
    singles: Vec<Sample>,
    /// With none ([`Beside::Quiet`]).
    quiet: Vec<Sample>,
    /// With the first status poller alone ([`Beside::Poller`]).
    poller: Vec<Sample>,
    bursts: Vec<Vec<Sample>>,
    warmup: usize,
}

/// containerd's own speed, measured before plegd starts, ms: on 1.x, exit
/// (finished_at) → a raw CRI event (singles only); on 2.x, a raw CRI event's arrival →
/// the answers of a verifying reader's reads (singles and bursts).
struct Floor {
    singles: Vec<f64>,
    bursts: Vec<f64>,
}

/// containerd 2.x with no plegd running: how soon after a CONTAINER_STOPPED_EVENT
/// arrives a client can have checked it against the runtime's status, with plegd's
/// reads (both filtered lists and the container's ContainerStatus in flight together,
/// sent on arrival: `RealCri::checked_stopped_events`), for --singles single exits and
/// --bursts bursts of 20. plegd reports an exit only after such reads (the event is
/// a hint), so this is the least plegd's ContainerDied − raw event can be here.
fn verified_floor(
    o: &Options<'_>,
    rt: &tokio::runtime::Runtime,
    watch_rt: &tokio::runtime::Runtime,
    cri: &RealCri,
    pods: &mut Vec<Pod>,
) -> Result<Floor> {
    eprintln!(
        "plegd-bench: containerd's floor for a reader that checks each event, no plegd: {} single exits, {} bursts of {BURST}",
        o.singles, o.bursts
    );
    let raw = cri.checked_stopped_events(watch_rt, Check::PodReads, Default::default());
    let (singles, bursts) = containers_to_kill(o, rt, cri, pods, o.singles, "vfloor-")?;
    let verified = |ids: &[String]| -> Result<Vec<f64>> {
        let pids: Vec<u32> = rt
            .block_on(join_all(ids.iter().map(|id| cri.pid(id))))
            .into_iter()
            .collect::<Result<_>>()?;
        kill(&pids)?;
        let done = raw.wait(ids, PATIENCE)?;
        Ok(ids
            .iter()
            .zip(done)
            .filter_map(|(id, done)| Some(ms_between(done?, raw.arrived(id)?)))
            .collect())
    };
    let mut floor = Floor {
        singles: Vec::new(),
        bursts: Vec::new(),
    };
    for id in &singles {
        floor.singles.extend(verified(std::slice::from_ref(id))?);
    }
    for ids in &bursts {
        floor.bursts.extend(verified(ids)?);
    }
    Ok(floor)
}

/// containerd 1.x's own speed with no plegd running: --singles exits one at a time,
/// exit (finished_at) → a raw CRI CONTAINER_STOPPED_EVENT, ms. Warm-up exits first
/// until the raw stream gets one (a stream an earlier client cancelled leaves a
/// receiver behind in containerd 1.7 that takes one later event).
fn containerd_floor(
    o: &Options<'_>,
    rt: &tokio::runtime::Runtime,
    watch_rt: &tokio::runtime::Runtime,
    cri: &RealCri,
    pods: &mut Vec<Pod>,
) -> Result<Vec<f64>> {
    eprintln!(
        "plegd-bench: containerd's floor, no plegd: {} single exits",
        o.singles
    );
    let raw = cri.raw_stopped_events(watch_rt);
    let warm = group(rt, cri, pods, "floor-warmup", WARMUP)?;
    let mut ids = Vec::new();
    for (i, chunk) in (0..o.singles).collect::<Vec<_>>().chunks(BURST).enumerate() {
        ids.extend(group(rt, cri, pods, &format!("floor-{i}"), chunk.len())?);
    }
    let one = |id: &String, patience: Duration| -> Result<Option<f64>> {
        kill(&[rt.block_on(cri.pid(id))?])?;
        let at = raw.wait(std::slice::from_ref(id), patience)?[0];
        let finished_ns = rt.block_on(cri.finished_at(id))?;
        Ok(at.map(|at| (epoch_ns(at) - finished_ns) as f64 / 1e6))
    };
    for id in &warm {
        if one(id, Duration::from_secs(2))?.is_some() {
            break;
        }
    }
    let mut out = Vec::new();
    for id in &ids {
        match one(id, PATIENCE)? {
            Some(ms) => out.push(ms),
            None => bail!("the raw CRI event stream did not get the exit of {id} in {PATIENCE:?}"),
        }
    }
    Ok(out)
}

fn measure(
    o: &Options<'_>,
    rt: &tokio::runtime::Runtime,
    cri: &RealCri,
    plegd: &Plegd,
    raws: &Raws,
    waits: &SinceArrival,
    pods: &mut Vec<Pod>,
) -> Result<Measured> {
    eprintln!("plegd-bench: making containers");
    let warm = group(rt, cri, pods, "warmup", WARMUP)?;
    // On 2.x, three times the single exits, each set in turn (`Beside`): with the
    // checking subscribers all checking, all quiet (plegd − the raw event without
    // their reads), and the status poller alone (the floor on the same exits).
    let sets = raws.cri.is_some();
    let singles = o.singles * if sets { 3 } else { 1 };
    let (singles_ids, burst_ids) = containers_to_kill(o, rt, cri, pods, singles, "")?;
    // plegd has seen every container running.
    workloads::relists(plegd, 2)?;
    eprintln!("plegd-bench: warm-up");
    let mut warmup = 0;
    for id in &warm {
        warmup += 1;
        let s = exits(rt, cri, plegd, raws, waits, std::slice::from_ref(id))?;
        let hinted = s[0].plegd.as_ref().is_some_and(|p| p.source != "global");
        let raw_cri = raws.cri.is_none() || s[0].checked.iter().all(|c| c.arrived.is_some());
        if hinted && raw_cri && s[0].raw_task.is_some() {
            break;
        }
    }
    eprintln!("plegd-bench: {} single exits", singles_ids.len());
    let (mut singles, mut quiet, mut poller) = (Vec::new(), Vec::new(), Vec::new());
    for (i, id) in singles_ids.iter().enumerate() {
        let beside = if sets { Beside::of(i) } else { Beside::All };
        raws.set_beside(beside)?;
        let s = exits(rt, cri, plegd, raws, waits, std::slice::from_ref(id));
        raws.set_beside(Beside::All)?;
        match beside {
            Beside::All => &mut singles,
            Beside::Quiet => &mut quiet,
            Beside::Poller => &mut poller,
        }
        .extend(s?);
    }
    eprintln!("plegd-bench: {} bursts of {BURST}", burst_ids.len());
    let mut bursts = Vec::new();
    for ids in &burst_ids {
        bursts.push(exits(rt, cri, plegd, raws, waits, ids)?);
    }
    Ok(Measured {
        singles,
        quiet,
        poller,
        bursts,
        warmup,
    })
}

/// The containers of `singles` single exits (pods of 20) and of --bursts bursts of 20,
/// in pods named with `prefix`. A burst's containers are in 20 pods: each pod has its
/// own shim (containerd 2.x has one per pod), so the runtime handles the 20 exits side
/// by side.
fn containers_to_kill(
    o: &Options<'_>,
    rt: &tokio::runtime::Runtime,
    cri: &RealCri,
    pods: &mut Vec<Pod>,
    count: usize,
    prefix: &str,
) -> Result<(Vec<String>, Vec<Vec<String>>)> {
    let mut singles = Vec::new();
    for (i, chunk) in (0..count).collect::<Vec<_>>().chunks(BURST).enumerate() {
        singles.extend(group(
            rt,
            cri,
            pods,
            &format!("{prefix}single-{i}"),
            chunk.len(),
        )?);
    }
    let mut bursts = Vec::new();
    for i in 0..o.bursts {
        let mut ids = Vec::with_capacity(BURST);
        for j in 0..BURST {
            ids.extend(group(rt, cri, pods, &format!("{prefix}burst-{i}-{j}"), 1)?);
        }
        bursts.push(ids);
    }
    Ok((singles, bursts))
}

/// A pod with `n` running containers (4 made at a time); returns their IDs.
fn group(
    rt: &tokio::runtime::Runtime,
    cri: &RealCri,
    pods: &mut Vec<Pod>,
    name: &str,
    n: usize,
) -> Result<Vec<String>> {
    let pod = rt.block_on(cri.run_pod(name))?;
    let ids = rt.block_on(
        futures::stream::iter(0..n)
            .map(|i| {
                let pod = &pod;
                async move { cri.run_container(pod, &format!("c{i}")).await }
            })
            .buffered(4)
            .collect::<Vec<_>>(),
    );
    pods.push(pod);
    ids.into_iter().collect()
}

/// Kills the processes of `ids` at once and waits for plegd's ContainerDied (and the
/// raw event) of each.
fn exits(
    rt: &tokio::runtime::Runtime,
    cri: &RealCri,
    plegd: &Plegd,
    raws: &Raws,
    waits: &SinceArrival,
    ids: &[String],
) -> Result<Vec<Sample>> {
    let pids: Vec<u32> = rt
        .block_on(join_all(ids.iter().map(|id| cri.pid(id))))
        .into_iter()
        .collect::<Result<_>>()?;
    let killed = kill(&pids)?;
    let seen = plegd.events.wait_died(ids, PATIENCE);
    let checked = raws.checked(ids, PATIENCE)?;
    // Both stamped by now: the arrival's before its check, the line's before it is seen.
    let waited = ids.iter().map(|id| waits.span(id));
    let raw_task = raws.task.wait(ids, PATIENCE)?;
    let mut out = Vec::with_capacity(ids.len());
    for ((((id, seen), checked), raw_task), waited) in
        ids.iter().zip(seen).zip(checked).zip(raw_task).zip(waited)
    {
        let finished_ns = rt.block_on(cri.finished_at(id))?;
        if finished_ns == 0 {
            bail!("{id} was killed but has no finished_at");
        }
        // After a single exit, containerd is quiet again: what plegd's reads cost then.
        let reads = match ids.len() {
            1 => Some(rt.block_on(cri.time_targeted_reads(id))?),
            _ => None,
        };
        out.push(Sample {
            id: id.clone(),
            killed,
            finished_ns,
            plegd: seen.into_iter().next(),
            checked,
            raw_task,
            reads,
            waited,
        });
    }
    Ok(out)
}

/// Over this, plegd − the raw CRI event makes an exit late (the goal at p99).
const LATE_MS: f64 = 5.0;

/// Where a late exit's time went, if plegd's ContainerDied came more than [`LATE_MS`]
/// after the raw CRI event: the event → the event's `time` (the status read that
/// showed the death began: an early death's, sent before the pod's lists, or the one
/// after them) → the line on stdout; "?" if the line had no `time`.
fn late_exit(set: &str, s: &Sample) -> Option<String> {
    let plegd = s.plegd.as_ref()?;
    let raw = s.checked[0].arrived?;
    if ms_between(plegd.at, raw) <= LATE_MS {
        return None;
    }
    exit_times(set, s)
}

/// Where an exit's time went, as [`late_exit`] shows it (none without the raw event
/// or plegd's line).
fn exit_times(set: &str, s: &Sample) -> Option<String> {
    let plegd = s.plegd.as_ref()?;
    let raw = s.checked[0].arrived?;
    let id = s.id.get(..12).unwrap_or(&s.id);
    let waited = s.waited.map_or("waits not known".into(), |w| w.describe());
    if plegd.read_ns == 0 {
        return Some(format!("{set} {id} {} ? ms, {waited}", plegd.source));
    }
    let ms = |ns: i64| ns as f64 / 1e6;
    // A quiet poller's "answer" is only its event's arrival.
    let poller = s.checked[POLLER]
        .answered
        .filter(|_| set != "quiet")
        .map_or(String::new(), |p| {
            format!(" (poller {:.2})", ms_between(p, raw))
        });
    Some(format!(
        "{set} {id} {} {:.2} + {:.2} ms{poller}, {waited}",
        plegd.source,
        ms(plegd.read_ns - epoch_ns(raw)),
        ms(epoch_ns(plegd.at) - plegd.read_ns)
    ))
}

/// What a late single exit's excess over [`LATE_MS`] is within.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Late {
    /// The status poller checked it and answered at most [`LATE_MS`] before plegd's
    /// line: containerd's answer was late for every client.
    Floor,
    /// The threads that carry plegd's line waited for a CPU at least that long after
    /// the raw event.
    Cpu,
    /// Else: plegd's actor thread was on a CPU (on this exit or other work) for the
    /// rest of the excess: plegd was busy.
    Busy,
    /// Else: plegd's actor thread was idle most of the excess, waiting for answers to
    /// its reads (this exit's, or others' it waits on).
    Idle,
}

impl Late {
    const ALL: [Late; 4] = [Late::Floor, Late::Cpu, Late::Busy, Late::Idle];

    fn describe(self) -> &'static str {
        match self {
            Late::Floor => "the status poller, checking, answered at most 5 ms before plegd's line (containerd's answer was late)",
            Late::Cpu => "(else) plegd's actor and output threads and the harness's reader waited for a CPU, summed, at least that long from the raw event to the line",
            Late::Busy => "(else) those waits and the time plegd's actor thread ran (busy) cover it",
            Late::Idle => "(else) plegd's actor thread was idle, waiting for answers of containerd",
        }
    }
}

/// Why a single exit of `set` is late (none if it is not, or not known: no raw event
/// or no line).
fn why_late(set: &str, s: &Sample) -> Option<Late> {
    let raw = s.checked[0].arrived?;
    let at = s.plegd.as_ref()?.at;
    let late = ms_between(at, raw);
    if late <= LATE_MS {
        return None;
    }
    // A quiet poller's "answer" is only its event's arrival.
    let poller = s.checked[POLLER].answered.filter(|_| set != "quiet");
    if poller.is_some_and(|p| ms_between(at, p) <= LATE_MS) {
        return Some(Late::Floor);
    }
    Some(within_waits(s, late - LATE_MS))
}

/// Why an exit of a burst is more than [`LATE_MS`] behind the status poller's EXITED
/// answer (none if it is not, or not known): the poller is the floor there.
fn why_behind_poller(s: &Sample) -> Option<Late> {
    let behind = ms_between(s.plegd.as_ref()?.at, s.checked[POLLER].answered?);
    (behind > LATE_MS).then(|| within_waits(s, behind - LATE_MS))
}

/// Whether `excess_ms` is within the waits for a CPU of the threads that carry the
/// line, else whether plegd's actor thread was busy or idle.
fn within_waits(s: &Sample, excess_ms: f64) -> Late {
    let Some(w) = s.waited else {
        return Late::Idle;
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let waited = ms(w.plegd + w.output + w.reader);
    if waited >= excess_ms {
        Late::Cpu
    } else if waited + ms(w.plegd_ran) >= excess_ms {
        Late::Busy
    } else {
        Late::Idle
    }
}

/// The rows of how long the threads that carry plegd's line waited for a CPU, over the
/// exits of `what`.
fn print_waits(what: &str, set: &[&Sample]) {
    type Whose = fn(&Waited) -> Duration;
    let rows: [(&str, Whose); 3] = [
        ("plegd's actor thread", |w| w.plegd),
        ("plegd's event output thread", |w| w.output),
        ("the harness's thread reading plegd's stdout", |w| w.reader),
    ];
    for (whose, of) in rows {
        let waits: Vec<f64> = set
            .iter()
            .filter_map(|s| Some(of(&s.waited?).as_secs_f64() * 1e3))
            .collect();
        println!(
            "| {what}: {whose} runnable but waiting for a CPU from the raw CRI event to plegd's ContainerDied | {} |",
            cell(&waits)
        );
    }
}

/// plegd's ContainerDied − the raw CRI event, ms, of each exit of `set` that has both.
fn minus_raw(set: &[Sample]) -> Vec<f64> {
    set.iter()
        .filter_map(|s| Some(ms_between(s.plegd.as_ref()?.at, s.checked[0].arrived?)))
        .collect()
}

fn cell(v: &[f64]) -> String {
    if v.is_empty() {
        return "–".into();
    }
    let p = |q| percentile(v, q).map_or("–".into(), |x: f64| format!("{x:.2}"));
    format!(
        "p50 {} p99 {} min {} max {} ms (n {})",
        p(0.5),
        p(0.99),
        p(0.0),
        p(1.0),
        v.len()
    )
}

/// How many of `late` (ms) are over 5, 10 and 20 ms: a figure of the tail that,
/// unlike a p99 of 160, does not rest on two exits.
fn behind(late: &[f64]) -> String {
    let over = |ms: f64| late.iter().filter(|&&d| d > ms).count();
    format!(
        "{} / {} / {} of {}",
        over(5.0),
        over(10.0),
        over(20.0),
        late.len()
    )
}

fn sources(samples: &[&Sample]) -> String {
    let mut by: std::collections::BTreeMap<&str, usize> = Default::default();
    let mut missing = 0;
    for s in samples {
        match &s.plegd {
            Some(p) => *by.entry(p.source.as_str()).or_default() += 1,
            None => missing += 1,
        }
    }
    let mut parts: Vec<String> = by.iter().map(|(k, v)| format!("{k} {v}")).collect();
    if missing > 0 {
        parts.push(format!("NOT REPORTED {missing}"));
    }
    parts.join(", ")
}

fn print_rows(m: &Measured, broadcast: bool, floor: &Floor) {
    let Measured {
        singles,
        quiet,
        poller,
        bursts,
        ..
    } = m;
    println!("| measure | figure |");
    println!("|---|---|");
    if broadcast {
        for (what, set) in [
            ("single exit", &floor.singles),
            ("20 exits at once", &floor.bursts),
        ] {
            println!(
                "| floor, before plegd started: {what}: a raw CRI CONTAINER_STOPPED_EVENT (arrival) → a reader's check of it answered (both filtered lists and ContainerStatus in flight together, sent on arrival) | {} |",
                cell(set)
            );
        }
    } else {
        println!(
            "| floor, before plegd started: single exit (finished_at) → a raw CRI CONTAINER_STOPPED_EVENT, the stream's only subscriber | {} |",
            cell(&floor.singles)
        );
    }
    let all_bursts: Vec<&Sample> = bursts.iter().flatten().collect();
    let singles: Vec<&Sample> = singles.iter().collect();
    for (what, set) in [("single exit", &singles), ("20 exits at once", &all_bursts)] {
        let exit_to = |at: Instant, finished_ns: i64| (epoch_ns(at) - finished_ns) as f64 / 1e6;
        let minus = |raw: fn(&Sample) -> Option<Instant>| -> Vec<f64> {
            set.iter()
                .filter_map(|s| Some(ms_between(s.plegd.as_ref()?.at, raw(s)?)))
                .collect()
        };
        let from_exit = |raw: fn(&Sample) -> Option<Instant>| -> Vec<f64> {
            set.iter()
                .filter_map(|s| Some(exit_to(raw(s)?, s.finished_ns)))
                .collect()
        };
        let exit_plegd: Vec<f64> = set
            .iter()
            .filter_map(|s| Some(exit_to(s.plegd.as_ref()?.at, s.finished_ns)))
            .collect();
        let kill_plegd: Vec<f64> = set
            .iter()
            .filter_map(|s| Some(ms_between(s.plegd.as_ref()?.at, s.killed)))
            .collect();
        if broadcast {
            println!(
                "| {what}: plegd's ContainerDied − the raw CRI CONTAINER_STOPPED_EVENT (arrival) | {} |",
                cell(&minus(|s| s.checked[0].arrived))
            );
            for (k, Checker { client, answer, .. }) in CHECKS.iter().enumerate() {
                let answered: Vec<f64> = set
                    .iter()
                    .filter_map(|s| Some(ms_between(s.checked[k].answered?, s.checked[k].arrived?)))
                    .collect();
                println!(
                    "| {what}: beside plegd, {client} − its arrival | {} |",
                    cell(&answered)
                );
                let died: Vec<f64> = set
                    .iter()
                    .filter_map(|s| Some(ms_between(s.plegd.as_ref()?.at, s.checked[k].answered?)))
                    .collect();
                println!(
                    "| {what}: plegd's ContainerDied − {answer} | {} |",
                    cell(&died)
                );
                println!(
                    "| {what}: plegd's ContainerDied more than 5 / 10 / 20 ms after {answer} | {} |",
                    behind(&died)
                );
            }
            let twins: Vec<f64> = set
                .iter()
                .filter_map(|s| {
                    Some(ms_between(
                        s.checked[SECOND_POLLER].answered?,
                        s.checked[POLLER].answered?,
                    ))
                })
                .collect();
            println!(
                "| {what}: two identical clients apart: the second status poller's EXITED answer − the first's | {} |",
                cell(&twins)
            );
            println!(
                "| {what}: the second status poller's EXITED answer more than 5 / 10 / 20 ms after the first's | {} |",
                behind(&twins)
            );
        }
        println!(
            "| {what}: plegd's ContainerDied − the raw /tasks/exit of containerd's event service (arrival) | {} |",
            cell(&minus(|s| s.raw_task))
        );
        if broadcast {
            println!(
                "| {what}: exit (finished_at) → raw CRI CONTAINER_STOPPED_EVENT | {} |",
                cell(&from_exit(|s| s.checked[0].arrived))
            );
        }
        println!(
            "| {what}: exit (finished_at) → raw /tasks/exit | {} |",
            cell(&from_exit(|s| s.raw_task))
        );
        println!(
            "| {what}: exit (finished_at) → plegd's ContainerDied | {} |",
            cell(&exit_plegd)
        );
        println!(
            "| {what}: kill → plegd's ContainerDied | {} |",
            cell(&kill_plegd)
        );
        println!(
            "| {what}: found by (plegd's relist_source) | {} |",
            sources(set)
        );
        let reads: Vec<(Duration, Duration)> = set.iter().filter_map(|s| s.reads).collect();
        if !reads.is_empty() {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            let lists: Vec<f64> = reads.iter().map(|r| ms(r.0)).collect();
            let status: Vec<f64> = reads.iter().map(|r| ms(r.1)).collect();
            let both: Vec<f64> = reads.iter().map(|r| ms(r.0 + r.1)).collect();
            println!(
                "| {what}: the targeted relist's reads, made by the harness after plegd reported: both filtered lists in flight together; then ContainerStatus; the two | {}; {}; {} |",
                cell(&lists),
                cell(&status),
                cell(&both)
            );
        }
    }
    if !quiet.is_empty() {
        let what = "single exit, no subscriber checking it beside plegd (one in three)";
        println!(
            "| {what}: plegd's ContainerDied − the raw CRI CONTAINER_STOPPED_EVENT (arrival) | {} |",
            cell(&minus_raw(quiet))
        );
        let quiet: Vec<&Sample> = quiet.iter().collect();
        println!(
            "| {what}: found by (plegd's relist_source) | {} |",
            sources(&quiet)
        );
    }
    if !poller.is_empty() {
        let what = "single exit, the status poller alone checking it beside plegd (one in three)";
        println!(
            "| {what}: plegd's ContainerDied − the raw CRI CONTAINER_STOPPED_EVENT (arrival) | {} |",
            cell(&minus_raw(poller))
        );
        let answered: Vec<f64> = poller
            .iter()
            .filter_map(|s| {
                Some(ms_between(
                    s.checked[POLLER].answered?,
                    s.checked[0].arrived?,
                ))
            })
            .collect();
        println!(
            "| {what}: the floor on the same exits: the status poller's EXITED answer − the raw CRI event | {} |",
            cell(&answered)
        );
        let died: Vec<f64> = poller
            .iter()
            .filter_map(|s| {
                Some(ms_between(
                    s.plegd.as_ref()?.at,
                    s.checked[POLLER].answered?,
                ))
            })
            .collect();
        println!(
            "| {what}: plegd's ContainerDied − the status poller's EXITED answer | {} |",
            cell(&died)
        );
        println!(
            "| {what}: plegd's ContainerDied more than 5 / 10 / 20 ms after the status poller's EXITED answer | {} |",
            behind(&died)
        );
    }
    if broadcast {
        let labeled: Vec<(&str, &Sample)> = singles
            .iter()
            .map(|s| ("checked", *s))
            .chain(quiet.iter().map(|s| ("quiet", s)))
            .chain(poller.iter().map(|s| ("poller", s)))
            .collect();
        let late: Vec<String> = labeled
            .iter()
            .filter_map(|&(set, s)| late_exit(set, s))
            .collect();
        println!(
            "| single exits with plegd's ContainerDied more than {LATE_MS} ms after the raw CRI event, each: its set; the container; relist_source; the raw event → the event's time (the status read that showed the death began); that → ContainerDied on stdout; the status poller's EXITED answer − the raw event, where it checked; how long the threads that carry plegd's line waited for a CPU from the raw event to ContainerDied | {} |",
            if late.is_empty() { "none".into() } else { late.join("; ") }
        );
        let every: Vec<&Sample> = labeled.iter().map(|&(_, s)| s).collect();
        print_waits("single exits, the three sets", &every);
        let mut by: std::collections::BTreeMap<Late, usize> = Default::default();
        for &(set, s) in &labeled {
            if let Some(why) = why_late(set, s) {
                *by.entry(why).or_default() += 1;
            }
        }
        println!(
            "| single exits more than {LATE_MS} ms after the raw CRI event, by what the excess over {LATE_MS} ms is within: {} | {} |",
            Late::ALL.map(Late::describe).join("; "),
            Late::ALL.map(|w| by.get(&w).copied().unwrap_or(0).to_string()).join(" / ")
        );
        print_waits("20 exits at once", &all_bursts);
        let mut by: std::collections::BTreeMap<Late, usize> = Default::default();
        for s in &all_bursts {
            if let Some(why) = why_behind_poller(s) {
                *by.entry(why).or_default() += 1;
            }
        }
        let counted = [Late::Cpu, Late::Busy, Late::Idle];
        println!(
            "| 20 exits at once: plegd's ContainerDied more than {LATE_MS} ms after the status poller's EXITED answer, by what the excess over {LATE_MS} ms is within: {} | {} of {} |",
            counted.map(Late::describe).join("; "),
            counted.map(|w| by.get(&w).copied().unwrap_or(0).to_string()).join(" / "),
            all_bursts.len()
        );
        let busy: Vec<String> = all_bursts
            .iter()
            .filter(|s| why_behind_poller(s) == Some(Late::Busy))
            .filter_map(|s| exit_times("burst", s))
            .collect();
        println!(
            "| 20 exits at once, those while plegd was busy, each as the late single exits | {} |",
            if busy.is_empty() {
                "none".into()
            } else {
                busy.join("; ")
            }
        );
    }
    for (i, b) in bursts.iter().enumerate() {
        let last_plegd = b
            .iter()
            .filter_map(|s| s.plegd.as_ref().map(|p| p.at))
            .max();
        let last_exit = b.iter().map(|s| s.finished_ns).max().unwrap_or(0);
        let last = |raw: fn(&Sample) -> Option<Instant>| {
            let last_raw = b.iter().filter_map(raw).max();
            match (last_plegd, last_raw) {
                (Some(p), Some(r)) => format!("{:.2} ms", ms_between(p, r)),
                _ => "–".into(),
            }
        };
        let exit_cell = last_plegd.map_or("–".into(), |p| {
            format!("{:.2} ms", (epoch_ns(p) - last_exit) as f64 / 1e6)
        });
        let (cri_head, cri_cell) = if broadcast {
            (
                "; last raw CRI event → last ContainerDied; last status poller's EXITED answer → last ContainerDied",
                format!(
                    "; {}; {}",
                    last(|s| s.checked[0].arrived),
                    last(|s| s.checked[POLLER].answered)
                ),
            )
        } else {
            ("", String::new())
        };
        println!(
            "| {BURST} exits at once, burst {}: last exit → last ContainerDied; last /tasks/exit → last ContainerDied{cri_head} | {exit_cell}; {}{cri_cell} |",
            i + 1,
            last(|s| s.raw_task),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{behind, Beside, CHECKS, POLLER};

    use super::{
        epoch_ns, late_exit, why_behind_poller, why_late, Checked, Late, Sample, Seen, Waited,
    };
    use std::time::{Duration, Instant};

    /// A single exit plegd reported `plegd_ms` after the raw event, its status read
    /// begun 2 ms after it; the status poller answered `poller_ms` after it; plegd's
    /// threads and the reader waited for a CPU `waited_us` each.
    fn sample(plegd_ms: u64, poller_ms: u64, waited_us: [u64; 3]) -> Sample {
        ran(plegd_ms, poller_ms, waited_us, 500)
    }

    /// The same, plegd's actor thread on a CPU `ran_us` meanwhile.
    fn ran(plegd_ms: u64, poller_ms: u64, waited_us: [u64; 3], ran_us: u64) -> Sample {
        let raw = Instant::now();
        let mut checked = [Checked::default(); CHECKS.len()];
        checked[0].arrived = Some(raw);
        checked[POLLER] = Checked {
            arrived: Some(raw),
            answered: Some(raw + Duration::from_millis(poller_ms)),
        };
        Sample {
            id: "0123456789abcdef".into(),
            killed: raw,
            finished_ns: 0,
            plegd: Some(Seen {
                at: raw + Duration::from_millis(plegd_ms),
                evented: true,
                source: "evented_pleg".into(),
                read_ns: epoch_ns(raw + Duration::from_millis(2)),
            }),
            checked,
            raw_task: None,
            reads: None,
            waited: Some(Waited {
                plegd: Duration::from_micros(waited_us[0]),
                output: Duration::from_micros(waited_us[1]),
                reader: Duration::from_micros(waited_us[2]),
                plegd_ran: Duration::from_micros(ran_us),
            }),
        }
    }

    #[test]
    fn a_late_exit_shows_the_pollers_answer_only_where_it_checked() {
        let sample = sample(9, 1, [3_100, 0, 250]);
        let line = |set| late_exit(set, &sample).unwrap();
        assert_eq!(
            line("poller"),
            "poller 0123456789ab evented_pleg 2.00 + 7.00 ms (poller 1.00), \
             waited for a CPU: plegd 3.10, its output 0.00, the harness's reader 0.25 ms; \
             plegd's actor thread ran 0.50 ms"
        );
        // Quiet, the poller only stamps its event's arrival: no answer to show.
        assert_eq!(
            line("quiet"),
            "quiet 0123456789ab evented_pleg 2.00 + 7.00 ms, \
             waited for a CPU: plegd 3.10, its output 0.00, the harness's reader 0.25 ms; \
             plegd's actor thread ran 0.50 ms"
        );
    }

    #[test]
    fn a_late_exit_is_put_down_to_the_floor_the_cpu_or_plegd_busy_or_idle() {
        // Not late.
        assert_eq!(why_late("poller", &sample(5, 0, [0; 3])), None);
        // 9 ms: the poller's 4 ms answer leaves 5 ms to plegd.
        assert_eq!(why_late("poller", &sample(9, 4, [0; 3])), Some(Late::Floor));
        // 4 ms over 5; plegd's actor thread ran 0.5 ms of it.
        assert_eq!(why_late("checked", &sample(9, 3, [0; 3])), Some(Late::Idle));
        // The waits summed over the three threads cover it.
        let cpu = [2_000, 1_000, 1_000];
        assert_eq!(why_late("checked", &sample(9, 3, cpu)), Some(Late::Cpu));
        // The waits and the run time cover it.
        let nearly = [2_000, 1_000, 500];
        assert_eq!(why_late("checked", &sample(9, 3, nearly)), Some(Late::Busy));
        assert_eq!(
            why_late("checked", &ran(9, 3, nearly, 499)),
            Some(Late::Idle)
        );
        assert_eq!(
            why_late("checked", &ran(9, 3, [0; 3], 4_000)),
            Some(Late::Busy)
        );
        // A quiet poller's answer is its event's arrival, no floor.
        assert_eq!(why_late("quiet", &sample(9, 4, [0; 3])), Some(Late::Idle));
        assert_eq!(why_late("quiet", &sample(9, 4, cpu)), Some(Late::Cpu));
    }

    #[test]
    fn an_exit_of_a_burst_behind_the_poller_is_put_down_to_the_cpu_or_plegd_busy_or_idle() {
        assert_eq!(why_behind_poller(&sample(9, 4, [0; 3])), None);
        assert_eq!(why_behind_poller(&sample(12, 4, [0; 3])), Some(Late::Idle));
        let three = [1_000, 1_000, 1_000];
        assert_eq!(why_behind_poller(&sample(12, 4, three)), Some(Late::Cpu));
        assert_eq!(why_behind_poller(&sample(13, 4, three)), Some(Late::Idle));
        assert_eq!(
            why_behind_poller(&ran(13, 4, three, 1_000)),
            Some(Late::Busy)
        );
    }

    #[test]
    fn the_single_exits_take_the_three_sets_in_turn() {
        let sets: Vec<Beside> = (0..6).map(Beside::of).collect();
        use Beside::*;
        assert!(sets == [All, Quiet, Poller, All, Quiet, Poller]);
        for k in 0..CHECKS.len() {
            assert!(!All.quiets(k));
            assert!(Quiet.quiets(k));
            assert_eq!(Poller.quiets(k), k != POLLER, "checker {k}");
        }
    }

    #[test]
    fn the_tail_counts_what_is_over_each_bound() {
        assert_eq!(behind(&[-3.0, 1.0, 5.0, 6.0, 11.0, 25.0]), "3 / 2 / 1 of 6");
        assert_eq!(behind(&[]), "0 / 0 / 0 of 0");
    }
}
