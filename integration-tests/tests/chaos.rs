//! The seeded chaos suite's CI run (README "Chaos"): a fixed list of seeds, each a
//! random schedule of pod churn and faults against plegd's real actors, checked for
//! convergence, soundness, completeness and boundedness (integration-tests/src/chaos).
//! A failure prints the seed; `cargo run --release -p integration-tests --bin chaos --
//! --seed N` replays it, and `--seeds N` runs many more.

use std::collections::BTreeSet;

use integration_tests::chaos::schedule::Step;
use integration_tests::chaos::{assert_all_passed, generate, run_seeds, Outcome, Transport};

/// Between them, both transports and every kind of step occur (checked below); more
/// seeds belong in the runner, not in CI.
const SEEDS: &[u64] = &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 24];

#[test]
fn the_seed_list_covers_every_transport_and_step() {
    let schedules: Vec<_> = SEEDS.iter().map(|s| generate(*s)).collect();
    for t in [Transport::Direct, Transport::Cri] {
        assert!(schedules.iter().any(|s| s.config.transport == t), "{t:?}");
    }
    let seen: BTreeSet<&str> = schedules
        .iter()
        .flat_map(|s| s.steps.iter().map(|t| t.step.kind()))
        .collect();
    let missing: Vec<&&str> = Step::KINDS.iter().filter(|k| !seen.contains(**k)).collect();
    assert!(missing.is_empty(), "no seed has {missing:?}");
    assert!(schedules.iter().any(|s| !s.config.evented));
    assert!(schedules.iter().any(|s| s.config.queue_capacity <= 2));
    assert!(schedules.iter().any(|s| s.config.quiet_until_first_event));
}

#[test]
fn seeded_chaos() {
    let print = |o: &Outcome| println!("{}", o.report());
    let (outcomes, leak) = run_seeds(SEEDS, 2, &print);
    assert_all_passed(&outcomes, &leak);
}
