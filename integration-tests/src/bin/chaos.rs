//! The chaos suite's runner, for more seeds than CI runs (README "Chaos"):
//!
//! ```text
//! cargo run --release -p integration-tests --bin chaos -- --seeds 1000 [--from 0] [--jobs 2]
//! cargo run --release -p integration-tests --bin chaos -- --seed 17 [--schedule]
//! ```
//!
//! Prints one line per seed (every problem of a failing one), then a summary; exits 1
//! if any seed failed. `--schedule` prints the replayed seed's schedule first.

use std::process::ExitCode;
use std::time::Instant;

use integration_tests::chaos::{generate, run_seeds, Outcome};

struct Args {
    seeds: Vec<u64>,
    jobs: usize,
    schedule: bool,
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: chaos --seeds N [--from S] [--jobs J]   run seeds S..S+N\n       chaos --seed N [--schedule]              replay one seed"
    );
    ExitCode::from(2)
}

fn parse() -> Option<Args> {
    let mut args = std::env::args().skip(1);
    let (mut count, mut from, mut one, mut jobs, mut schedule) = (None, 0u64, None, 1, false);
    while let Some(a) = args.next() {
        let mut value = || args.next()?.parse::<u64>().ok();
        match a.as_str() {
            "--seeds" => count = Some(value()?),
            "--from" => from = value()?,
            "--seed" => one = Some(value()?),
            "--jobs" => jobs = usize::try_from(value()?).ok()?,
            "--schedule" => schedule = true,
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
    })
}

fn main() -> ExitCode {
    let Some(args) = parse() else {
        return usage();
    };
    if args.schedule {
        for seed in &args.seeds {
            let s = generate(*seed);
            println!("seed {seed}: {:#?}", s.config);
            for (i, t) in s.steps.iter().enumerate() {
                println!("{i:4} +{:>3}ms {:?}", t.pause.as_millis(), t.step);
            }
        }
    }
    let started = Instant::now();
    let print = |o: &Outcome| println!("{}", o.report());
    let (outcomes, leak) = run_seeds(&args.seeds, args.jobs, &print);
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
    println!(
        "\n{} seeds, {} passed, {} failed, in {:.1?} ({} jobs)",
        outcomes.len(),
        outcomes.len() - failed.len(),
        failed.len(),
        started.elapsed(),
        args.jobs,
    );
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
