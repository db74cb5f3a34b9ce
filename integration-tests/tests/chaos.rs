//! The seeded chaos suite's CI run (README "Chaos"): a fixed list of seeds, each a
//! random schedule of pod churn and faults against plegd's real actors, checked for
//! convergence, soundness, completeness and boundedness (integration-tests/src/chaos).
//! A failure prints the seed; `cargo run --release -p integration-tests --bin chaos --
//! --seed N` replays it, and `--seeds N` runs many more.

use integration_tests::chaos::{generate, run_seeds, Outcome, Transport};

/// Chosen so that both transports, every fault and every consumer action occur (the
/// test checks the first two); more seeds belong in the runner, not in CI.
const SEEDS: &[u64] = &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

#[test]
fn seeded_chaos() {
    let transports: Vec<Transport> = SEEDS.iter().map(|s| generate(*s).config.transport).collect();
    assert!(transports.contains(&Transport::Direct) && transports.contains(&Transport::Cri));
    let print = |o: &Outcome| println!("{}", o.report());
    let (outcomes, leak) = run_seeds(SEEDS, 2, &print);
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.passed())
        .map(Outcome::report)
        .collect();
    assert!(failed.is_empty(), "{} seeds failed:\n{}", failed.len(), failed.join("\n"));
    assert!(leak.is_none(), "{leak:?}");
}
