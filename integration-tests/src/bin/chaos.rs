//! The chaos suite's runner, for more seeds than CI runs (README "Chaos"):
//!
//! ```text
//! cargo run --release -p integration-tests --bin chaos -- --seeds 1000 [--from 0] [--jobs 2]
//! cargo run --release -p integration-tests --bin chaos -- --seed 17 [--schedule]
//! ```
//!
//! `--restarts` runs the restart suite instead: plegd's binary as a child process,
//! stopped and killed and started again on its state dir. The binary is `plegd` next
//! to this one unless `--plegd PATH` says otherwise, so build both first:
//!
//! ```text
//! cargo build --release -p plegd -p integration-tests --bin plegd --bin chaos
//! target/release/chaos --restarts --seeds 1000 --jobs 6
//! ```
//!
//! Prints one line per seed (every problem of a failing one), then a summary; exits 1
//! if any seed failed. `--schedule` prints the replayed seed's schedule first.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use integration_tests::chaos::{generate_in, run_seeds_in, Mode, Outcome, Suite};

struct Args {
    seeds: Vec<u64>,
    jobs: usize,
    schedule: bool,
    restarts: bool,
    plegd: Option<PathBuf>,
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: chaos [--restarts [--plegd PATH]] --seeds N [--from S] [--jobs J]   run seeds S..S+N\n       chaos [--restarts [--plegd PATH]] --seed N [--schedule]              replay one seed"
    );
    ExitCode::from(2)
}

fn parse() -> Option<Args> {
    let mut args = std::env::args().skip(1);
    let (mut count, mut from, mut one, mut jobs, mut schedule) = (None, 0u64, None, 1, false);
    let (mut restarts, mut plegd) = (false, None);
    while let Some(a) = args.next() {
        if a == "--plegd" {
            plegd = Some(PathBuf::from(args.next()?));
            continue;
        }
        let mut value = || args.next()?.parse::<u64>().ok();
        match a.as_str() {
            "--seeds" => count = Some(value()?),
            "--from" => from = value()?,
            "--seed" => one = Some(value()?),
            "--jobs" => jobs = usize::try_from(value()?).ok()?,
            "--schedule" => schedule = true,
            "--restarts" => restarts = true,
            _ => return None,
        }
    }
    let seeds = match (one, count) {
        (Some(s), None) => vec![s],
        (None, Some(n)) => (from..from.checked_add(n)?).collect(),
        _ => return None,
    };
    Some(Args {
        seeds,
        jobs,
        schedule,
        restarts,
        plegd,
    })
}

/// The suite to run; the restart suite's plegd binary must exist.
fn mode(args: &Args) -> Result<Mode, String> {
    if !args.restarts {
        return Ok(Mode::Actors);
    }
    let plegd = match &args.plegd {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| format!("this executable's path: {e}"))?
            .with_file_name("plegd"),
    };
    if !plegd.is_file() {
        return Err(format!(
            "no plegd binary at {} (build it, or give --plegd PATH)",
            plegd.display()
        ));
    }
    Ok(Mode::Restarts { plegd })
}

fn main() -> ExitCode {
    let Some(args) = parse() else {
        return usage();
    };
    let mode = match mode(&args) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("chaos: {e}");
            return ExitCode::from(2);
        }
    };
    if args.schedule {
        for seed in &args.seeds {
            let s = generate_in(mode.suite(), *seed);
            println!("seed {seed}: {:#?}", s.config);
            for (i, t) in s.steps.iter().enumerate() {
                println!("{i:4} +{:>3}ms {:?}", t.pause.as_millis(), t.step);
            }
        }
    }
    let started = Instant::now();
    let print = |o: &Outcome| println!("{}", o.report());
    let (outcomes, leak) = run_seeds_in(&mode, &args.seeds, args.jobs, &print);
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.passed()).collect();
    // Convergence in relist periods: one, plus the relist in progress when the faults
    // stopped, is what a correct plegd needs.
    let periods = |o: &&Outcome| {
        o.stats.convergence.as_secs_f64() / o.stats.relist_period.as_secs_f64().max(1e-9)
    };
    let slowest = outcomes
        .iter()
        .filter(|o| o.passed())
        .max_by(|a, b| periods(a).total_cmp(&periods(b)));
    let took = started.elapsed();
    println!(
        "\n{} seeds, {} passed, {} failed, in {:.1?} ({} jobs)",
        outcomes.len(),
        outcomes.len() - failed.len(),
        failed.len(),
        took,
        args.jobs,
    );
    if !outcomes.is_empty() {
        // The wall time per seed at this many jobs, and what 1,000 seeds would take.
        let per_seed = took.as_secs_f64() / outcomes.len() as f64;
        let mean_run =
            outcomes.iter().map(|o| o.took.as_secs_f64()).sum::<f64>() / outcomes.len() as f64;
        println!(
            "{:.2} s of wall time per seed ({:.2} s per run on average); 1,000 seeds: about {:.0} min",
            per_seed,
            mean_run,
            per_seed * 1000.0 / 60.0
        );
    }
    if mode.suite() == Suite::Restarts {
        let sum = |f: fn(&Outcome) -> u64| outcomes.iter().map(f).sum::<u64>();
        println!(
            "plegd restarts: {} clean stops, {} SIGKILLs, {} starts failed while the runtime was down",
            sum(|o| o.stats.clean_stops),
            sum(|o| o.stats.kills),
            sum(|o| o.stats.failed_starts),
        );
    }
    if let Some(o) = slowest {
        println!(
            "slowest convergence: seed {}, {:?} = {:.2} relist periods of {:?}",
            o.seed,
            o.stats.convergence,
            periods(&o),
            o.stats.relist_period
        );
    }
    if !failed.is_empty() {
        let seeds: Vec<String> = failed.iter().map(|o| o.seed.to_string()).collect();
        println!("failed seeds: {}", seeds.join(" "));
    }
    if let Some(leak) = &leak {
        println!("{leak}");
    }
    if failed.is_empty() && leak.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
