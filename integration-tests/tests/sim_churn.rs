//! The churn workload: pod count stays put, containers come and go, seeds reproduce,
//! runtime errors are survived, and churn cleans up after itself.

use std::cell::Cell;
use std::collections::HashSet;
use std::time::Duration;

use plegd_runtime::{Container, ContainerState, PodRef, RuntimeClient, RuntimeError};
use plegd_sim::{spawn_churn, Churn, ChurnConfig, ChurnRuntime, ChurnStep, FakeRuntime};

use integration_tests::sim::serve;
use integration_tests::wait::wait_until;

#[tokio::test]
async fn churn_keeps_the_pod_count_and_makes_exits() {
    let rt = FakeRuntime::new();
    let pods = 8;
    let churn = spawn_churn(
        rt.clone(),
        ChurnConfig {
            pods,
            period: Duration::from_millis(5),
            seed: 7,
        },
    )
    .unwrap();
    // The pods exist as soon as spawn_churn returns.
    assert_eq!(rt.pod_count(), pods);
    let mut seen_exited = HashSet::new();
    let mut counts = Vec::new();
    let mut last_seen = 0;
    // Poll the runtime as plegd would, until enough steps and exits were seen.
    let mut stats = churn.stats();
    while stats.steps < 200 || seen_exited.len() < 5 {
        counts.push(rt.pod_count());
        for c in rt.list_containers(None).await.unwrap() {
            if c.state == ContainerState::Exited {
                seen_exited.insert(c.id);
            }
        }
        // wait_until a step happened, so every iteration looks at a new state.
        last_seen = last_seen.max(stats.steps);
        wait_until("a churn step", || churn.stats().steps > last_seen).await;
        stats = churn.stats();
    }
    churn.stop();
    assert_eq!(rt.pod_count(), pods, "pod count after stopping");
    // A step in progress may briefly hold one sandbox more or less.
    assert!(
        counts.iter().all(|&n| n + 1 >= pods && n <= pods + 1),
        "{counts:?}"
    );
    assert!(stats.exits > 0 && stats.restarts > 0, "{stats:?}");
    assert!(
        stats.pods_replaced + stats.sandboxes_recreated > 0,
        "{stats:?}"
    );
    for s in rt.list_sandboxes(None).await.unwrap() {
        assert_eq!(s.pod.namespace, "demo");
        assert!(s.pod.uid.starts_with("sim-pod-") && s.pod.name.starts_with("web-"));
    }
}

#[tokio::test]
async fn churn_is_visible_over_cri() {
    let rt = FakeRuntime::new();
    let (_dir, _server, client) = serve(&rt).await;
    let churn = spawn_churn(
        rt.clone(),
        ChurnConfig {
            pods: 3,
            period: Duration::from_millis(5),
            seed: 1,
        },
    )
    .unwrap();
    let sandboxes = client.list_sandboxes(None).await.unwrap();
    assert!((2..=4).contains(&sandboxes.len()), "{sandboxes:?}");
    wait_until("some churn", || churn.stats().steps >= 20).await;
    drop(churn);
    let containers = client.list_containers(None).await.unwrap();
    let names: HashSet<&str> = containers.iter().map(|c| c.name.as_str()).collect();
    assert!(names.contains("app"), "{names:?}");
    assert!(names.iter().all(|n| ["app", "sidecar"].contains(n)));
}

/// What a runtime holds, without timestamps.
fn snapshot(rt: &FakeRuntime, churn: &Churn) -> Vec<(String, String, u32, ContainerState, i32)> {
    let mut out = Vec::new();
    for uid in churn.pod_uids() {
        for sb in rt.sandboxes_of(&uid) {
            for c in rt.containers_of(&sb) {
                out.push((c.id, c.name, c.attempt, c.state, c.exit_code));
            }
        }
    }
    out
}

#[test]
fn churn_is_reproducible_from_its_seed() {
    let run = |seed: u64| {
        let rt = FakeRuntime::new();
        let mut churn = Churn::new(rt.clone(), 5, seed);
        let steps: Vec<ChurnStep> = (0..300).map(|_| churn.step()).collect();
        assert_eq!(rt.pod_count(), 5);
        assert_eq!(churn.stats().steps, 300);
        (steps, snapshot(&rt, &churn))
    };
    let (steps, state) = run(42);
    assert_eq!(run(42), (steps.clone(), state));
    assert_ne!(run(43).0, steps);
    for kind in [
        ChurnStep::ContainerExited,
        ChurnStep::ContainerRestarted,
        ChurnStep::PodReplaced,
        ChurnStep::SandboxStopped,
        ChurnStep::SandboxRecreated,
    ] {
        assert!(steps.contains(&kind), "no {kind:?} in 300 steps");
    }
}

#[test]
fn churn_without_pods_idles() {
    let rt = FakeRuntime::new();
    let mut churn = Churn::new(rt.clone(), 0, 0);
    assert_eq!(churn.step(), ChurnStep::Idle);
    assert_eq!(rt.pod_count(), 0);
}

#[test]
fn churn_replaces_a_pod_removed_behind_its_back() {
    let rt = FakeRuntime::new();
    let mut churn = Churn::new(rt.clone(), 2, 3);
    let uid = churn.pod_uids()[0].clone();
    for sb in rt.sandboxes_of(&uid) {
        rt.remove_pod(&sb);
    }
    assert_eq!(churn.step(), ChurnStep::PodReplaced);
    assert!(!churn.pod_uids().contains(&uid));
    assert_eq!(rt.pod_count(), 2);
}

#[test]
fn churn_removes_its_pods() {
    let rt = FakeRuntime::new();
    let mut churn = Churn::new(rt.clone(), 3, 7);
    for _ in 0..50 {
        churn.step();
    }
    assert!(churn.remove_pods() >= 3);
    assert_eq!(rt.pod_count(), 0);
    assert!(churn.pod_uids().is_empty());
    assert_eq!(churn.step(), ChurnStep::Idle);
}

/// A runtime whose first RunPodSandbox calls fail, as a real one may.
struct FailingRuns {
    rt: FakeRuntime,
    failures_left: Cell<u32>,
}

impl ChurnRuntime for FailingRuns {
    fn run_sandbox(&self, pod: &PodRef) -> Result<String, RuntimeError> {
        if self.failures_left.get() > 0 {
            self.failures_left.set(self.failures_left.get() - 1);
            return Err(RuntimeError::Rpc {
                op: "RunPodSandbox",
                code: tonic::Code::Unavailable,
                message: "runtime restarting".into(),
            });
        }
        self.rt.run_sandbox(pod)
    }
    fn stop_sandbox(&self, id: &str) -> Result<(), RuntimeError> {
        self.rt.stop_sandbox(id)
    }
    fn remove_sandbox(&self, id: &str) -> Result<(), RuntimeError> {
        self.rt.remove_sandbox(id)
    }
    fn pod_sandboxes(&self, uid: &str) -> Result<Vec<String>, RuntimeError> {
        self.rt.pod_sandboxes(uid)
    }
    fn sandbox_containers(&self, id: &str) -> Result<Vec<Container>, RuntimeError> {
        self.rt.sandbox_containers(id)
    }
    fn launch_container(&self, pod: &PodRef, sb: &str, name: &str) -> Result<String, RuntimeError> {
        self.rt.launch_container(pod, sb, name)
    }
    fn end_container(&self, id: &str, code: i32) -> Result<(), RuntimeError> {
        self.rt.end_container(id, code)
    }
}

#[test]
fn churn_counts_runtime_errors_and_repairs_the_pods_they_cost() {
    let rt = FakeRuntime::new();
    let flaky = FailingRuns {
        rt: rt.clone(),
        failures_left: Cell::new(2),
    };
    let mut churn = Churn::new(flaky, 3, 5);
    assert_eq!(churn.stats().errors, 2);
    assert_eq!(rt.pod_count(), 1);
    // The two pods without a sandbox are replaced first, one per step.
    assert_eq!(churn.step(), ChurnStep::PodReplaced);
    assert_eq!(churn.step(), ChurnStep::PodReplaced);
    assert_eq!(rt.pod_count(), 3);
    for uid in churn.pod_uids() {
        assert_eq!(rt.sandboxes_of(&uid).len(), 1, "{uid}");
    }
}
