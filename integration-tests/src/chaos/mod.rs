//! Seeded chaos: random schedules of pod starts, exits, restarts and removals
//! interleaved with stream, call and consumer faults, run against plegd's real actors
//! over the fault-injecting fake runtime; after the faults stop, plegd must converge to
//! the runtime and must have published exactly what a correct Generic PLEG could have
//! (README "Chaos").
//!
//! Two suites share the engine: the actors suite runs plegd's actors in this process;
//! the restart suite runs plegd's binary as a child process on a state dir and stops
//! it (SIGTERM or SIGKILL) and starts it again, some of the time while the runtime is
//! down too, and checks that a subscriber resuming by revision gets an exact account
//! across every restart.
//!
//! - [`schedule`]: a seed (and suite) → plegd's settings and the whole list of steps,
//!   up front;
//! - [`runtime_side`]: the fake runtime, its server and the true history, which both
//!   executors drive;
//! - [`exec`]: runs one actors-suite schedule (in process or over the simulated CRI
//!   server) and checks it;
//! - [`exec_child`]: runs one restart-suite schedule against plegd as a child process
//!   ([`plegd_child`]) and checks it through [`resuming_watch`];
//! - [`truth`]: the runtime's true history and the event checks;
//! - [`mangle`]: the event filter (dropped, duplicated, delayed, stale, UID-less).
//!
//! A failing seed replays the same schedule: `cargo run --release -p
//! integration-tests --bin chaos -- --seed N` (with `--restarts` for the restart
//! suite).

pub mod exec;
pub mod exec_child;
pub mod mangle;
pub mod plegd_child;
pub mod resuming_watch;
pub mod runtime_side;
pub mod schedule;
pub mod truth;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use exec::Stats;
pub use schedule::{generate, generate_in, Schedule, Suite, Transport};

/// Which suite to run, with what it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    Actors,
    /// The restart suite, with the `plegd` binary to run.
    Restarts {
        plegd: PathBuf,
    },
}

impl Mode {
    pub fn suite(&self) -> Suite {
        match self {
            Mode::Actors => Suite::Actors,
            Mode::Restarts { .. } => Suite::Restarts,
        }
    }
}

/// The result of one seed.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub seed: u64,
    pub suite: Suite,
    pub transport: Transport,
    /// Empty: the seed passed.
    pub problems: Vec<String>,
    pub stats: Stats,
    pub took: Duration,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }

    /// One line for a pass; the seed, how to replay it and every problem for a
    /// failure.
    pub fn report(&self) -> String {
        let plegd = match self.suite {
            Suite::Actors => format!("{} relists", self.stats.global_relists),
            Suite::Restarts => format!(
                "{} clean stops, {} kills, {} failed starts",
                self.stats.clean_stops, self.stats.kills, self.stats.failed_starts
            ),
        };
        let head = format!(
            "seed {} ({:?}): {} steps, {} transitions, {} events, {plegd}, converged in {:?}, {:?}",
            self.seed,
            self.transport,
            self.stats.steps,
            self.stats.transitions,
            self.stats.events,
            self.stats.convergence,
            self.took,
        );
        if self.passed() {
            return format!("ok   {head}");
        }
        let flag = match self.suite {
            Suite::Actors => "",
            Suite::Restarts => " --restarts",
        };
        let mut out = format!(
            "FAIL {head}\n  replay: cargo run --release -p integration-tests --bin chaos -- --seed {}{flag}",
            self.seed
        );
        for p in self.problems.iter().take(30) {
            out.push_str("\n  - ");
            out.push_str(p);
        }
        if self.problems.len() > 30 {
            out.push_str(&format!("\n  ... {} more", self.problems.len() - 30));
        }
        out
    }
}

/// Runs one seed of the actors suite in a fresh actix System on the calling thread
/// (which must not be in one already).
pub fn run_seed(seed: u64) -> Outcome {
    run_seed_in(&Mode::Actors, seed)
}

/// Runs one seed of `mode`'s suite in a fresh actix System on the calling thread.
pub fn run_seed_in(mode: &Mode, seed: u64) -> Outcome {
    let schedule = generate_in(mode.suite(), seed);
    let transport = schedule.config.transport;
    let started = Instant::now();
    let system = actix_rt::System::new();
    let (problems, stats) = match mode {
        Mode::Actors => system.block_on(exec::run(schedule)),
        Mode::Restarts { plegd } => system.block_on(exec_child::run(schedule, plegd)),
    };
    drop(system);
    Outcome {
        seed,
        suite: mode.suite(),
        transport,
        problems,
        stats,
        took: started.elapsed(),
    }
}

/// Open file descriptors and threads of this process.
pub fn resources() -> (usize, usize) {
    let count = |dir: &str| std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
    (count("/proc/self/fd"), count("/proc/self/task"))
}

/// What each open file descriptor is, for a report.
fn open_fds() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return vec![];
    };
    dir.filter_map(Result::ok)
        .map(|e| {
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            format!("{}={}", e.file_name().to_string_lossy(), target.display())
        })
        .collect()
}

/// Waits until the process has no more file descriptors and threads than
/// `baseline`; the problem if it does not happen within the slack.
fn back_to(baseline: (usize, usize)) -> Option<String> {
    let deadline = Instant::now() + exec::SLACK;
    loop {
        let now = resources();
        if now.0 <= baseline.0 && now.1 <= baseline.1 {
            return None;
        }
        if Instant::now() >= deadline {
            return Some(format!(
                "resources not released: {} fds and {} threads, {} and {} before; fds: {}",
                now.0,
                now.1,
                baseline.0,
                baseline.1,
                open_fds().join(" ")
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Panics with every failed seed's report, or the batch's leak, if any (the CI seed
/// lists' check).
pub fn assert_all_passed(outcomes: &[Outcome], leak: &Option<String>) {
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.passed())
        .map(Outcome::report)
        .collect();
    assert!(
        failed.is_empty(),
        "{} seeds failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert!(leak.is_none(), "{leak:?}");
}

/// Runs `seeds` of the actors suite on `jobs` threads (see [`run_seeds_in`]).
pub fn run_seeds(
    seeds: &[u64],
    jobs: usize,
    done: &(dyn Fn(&Outcome) + Sync),
) -> (Vec<Outcome>, Option<String>) {
    run_seeds_in(&Mode::Actors, seeds, jobs, done)
}

/// Runs `seeds` of `mode`'s suite on `jobs` threads, calling `done` as each finishes.
/// With one job, each seed must give back every file descriptor and thread it took
/// (else it fails); with more, the whole batch must.
pub fn run_seeds_in(
    mode: &Mode,
    seeds: &[u64],
    jobs: usize,
    done: &(dyn Fn(&Outcome) + Sync),
) -> (Vec<Outcome>, Option<String>) {
    // Tokio opens a process-wide socket pair (its signal driver's) the first time a
    // runtime with I/O is built, and keeps it: open it before counting.
    drop(actix_rt::System::new());
    let baseline = resources();
    let jobs = jobs.clamp(1, seeds.len().max(1));
    let outcomes = Mutex::new(Vec::new());
    let finish = |outcome: Outcome| {
        done(&outcome);
        outcomes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(outcome);
    };
    if jobs == 1 {
        for &seed in seeds {
            let mut outcome = run_on_thread(mode, seed);
            if let Some(p) = back_to(baseline) {
                outcome.problems.push(p);
            }
            finish(outcome);
        }
    } else {
        let next = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..jobs {
                scope.spawn(|| {
                    while let Some(&seed) = seeds.get(next.fetch_add(1, Ordering::SeqCst)) {
                        finish(run_on_thread(mode, seed));
                    }
                });
            }
        });
    }
    let leak = back_to(baseline);
    let mut outcomes = outcomes.into_inner().unwrap_or_else(|e| e.into_inner());
    outcomes.sort_by_key(|o| o.seed);
    (outcomes, leak)
}

/// Runs a seed on a thread of its own, so its System and everything on it are gone
/// when it ends.
fn run_on_thread(mode: &Mode, seed: u64) -> Outcome {
    let owned = mode.clone();
    match std::thread::Builder::new()
        .name(format!("chaos-{seed}"))
        .spawn(move || run_seed_in(&owned, seed))
        .map(|t| t.join())
    {
        Ok(Ok(o)) => o,
        Ok(Err(_)) => failed(mode, seed, "the run panicked".into()),
        Err(e) => failed(mode, seed, format!("harness: thread: {e}")),
    }
}

fn failed(mode: &Mode, seed: u64, why: String) -> Outcome {
    Outcome {
        seed,
        suite: mode.suite(),
        transport: generate_in(mode.suite(), seed).config.transport,
        problems: vec![why],
        stats: Stats::default(),
        took: Duration::ZERO,
    }
}
