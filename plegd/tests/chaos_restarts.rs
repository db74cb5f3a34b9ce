//! The chaos suite's restart seeds in CI (README "Chaos"): the built `plegd` binary
//! as a child process on a state dir, over the simulated CRI server with pod churn
//! and faults, stopped with SIGTERM or SIGKILL and started again, some of the time
//! while the runtime is down too; a subscriber that resumes by revision after each
//! restart must get an exact account (revisions 1..=N, each once, one instance) of
//! what the runtime did (integration-tests/src/chaos/exec_child.rs).
//!
//! It lives here because only plegd's own tests get the freshly built binary
//! (`CARGO_BIN_EXE_plegd`). More seeds: `target/release/chaos --restarts --seeds
//! 1000 --jobs 6` (after `cargo build --release -p plegd -p integration-tests --bin
//! plegd --bin chaos`); a failing seed replays with `--seed N`.

use integration_tests::chaos::schedule::Step;
use integration_tests::chaos::{
    assert_all_passed, generate_in, run_seeds_in, Mode, Outcome, Suite,
};

/// Between them: clean stops, kills and starts, a stop and a start while the runtime
/// is down (checked below). More seeds belong in the runner.
const SEEDS: &[u64] = &[1, 2, 3, 4, 5];

#[test]
fn the_restart_seeds_cover_stops_kills_and_starts_with_the_runtime_down() {
    let mut kinds = std::collections::BTreeSet::new();
    let (mut stop_while_down, mut start_while_down) = (false, false);
    for seed in SEEDS {
        let s = generate_in(Suite::Restarts, *seed);
        let mut down = false;
        for t in &s.steps {
            kinds.insert(t.step.kind());
            match t.step {
                Step::RuntimeDown => down = true,
                Step::RuntimeUp => down = false,
                Step::PlegdStop { .. } if down => stop_while_down = true,
                Step::PlegdStart if down => start_while_down = true,
                _ => {}
            }
        }
    }
    for k in Step::RESTART_KINDS {
        assert!(kinds.contains(k), "no seed has {k}");
    }
    assert!(stop_while_down && start_while_down);
}

#[test]
fn seeded_chaos_with_plegd_restarts() {
    let mode = Mode::Restarts {
        plegd: env!("CARGO_BIN_EXE_plegd").into(),
    };
    let print = |o: &Outcome| println!("{}", o.report());
    let (outcomes, leak) = run_seeds_in(&mode, SEEDS, 2, &print);
    assert_all_passed(&outcomes, &leak);
    // The seeds restarted plegd both ways.
    let kills: u64 = outcomes.iter().map(|o| o.stats.kills).sum();
    let clean: u64 = outcomes.iter().map(|o| o.stats.clean_stops).sum();
    assert!(kills > 0 && clean > 0, "{kills} kills, {clean} clean stops");
}
