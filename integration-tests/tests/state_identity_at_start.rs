//! The instance id is exposed (Hello, ListPods, `Pleg::instance_id`) as soon as plegd
//! starts; a client resumes with it. So it must be stored before it is exposed: a
//! plegd killed right after it started on a fresh state dir must come back as the
//! same instance. A copy of the state dir taken at that moment is what the killed
//! process leaves (the page cache holds every write that returned; a rename that has
//! not happened has not).
//!
//! Found by the chaos suite's restart seeds (`chaos --restarts`, seeds 90 and 693 of
//! 1,000): a subscriber got the first Hello of a plegd killed about 100 ms after its
//! start on a loaded machine; the plegd started again on the same dir was another
//! instance and refused the resume with `other-instance`, though no revision had been
//! issued: the first state file was written, synced and renamed by the state thread
//! after `Pleg::start_with_state` returned, and nothing waited for it before the API
//! served. Now start-up waits for it.

use std::sync::Arc;
use std::time::Duration;

use plegd_actors::state;
use plegd_actors::{Pleg, PlegConfig};
use plegd_sim::FakeRuntime;
use plegd_telemetry::Metrics;

const TTL: Duration = Duration::from_secs(300);

#[actix_rt::test]
async fn a_copy_of_a_fresh_state_dir_taken_right_after_start_holds_the_exposed_instance() {
    let config = PlegConfig {
        relist_period: Duration::from_millis(30),
        hint_sources: vec![],
        ..PlegConfig::default()
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let copy = tempfile::tempdir().expect("a temporary directory");
    let rt = FakeRuntime::new();
    let opened = state::open(dir.path(), config.history_events, TTL).expect("a fresh state dir");
    let pleg = Pleg::start_with_state(
        Arc::new(rt),
        &config,
        Arc::new(Metrics::new()),
        Some(opened),
    );
    // What a client sees at once (the API's Hello is this id).
    let exposed = pleg.instance_id().to_string();
    // What a SIGKILL now leaves.
    let file = dir.path().join("state");
    if file.exists() {
        std::fs::copy(&file, copy.path().join("state")).expect("copy the state file");
    }
    pleg.stop();
    let reopened = state::open(copy.path(), config.history_events, TTL).expect("the copy opens");
    let again = reopened
        .loaded
        .as_ref()
        .map(|l| l.instance_id().to_string());
    assert_eq!(
        again.as_deref(),
        Some(exposed.as_str()),
        "instance {exposed} was exposed, but a plegd killed then comes back as {} (discarded: {:?})",
        again.as_deref().unwrap_or("a new instance"),
        reopened.discarded
    );
}
