//! A regression guard on the instructions of a no-change global relist at
//! 1,000 pods (2 containers each) of the realistic node (containerd's 64-hex IDs,
//! kubelet's labels and annotations: `plegd_sim::kubelet`), counted by valgrind's
//! callgrind — instruction
//! counts, unlike times, hardly move on a loaded 2-core machine. Fails when they grow
//! by more than 10 % over the committed baseline (`relist_instructions.baseline`).
//!
//! The relists run in-process against the fake runtime on one thread, its two lists
//! handed over as CRI's protobuf bytes (encoded once, before the count), as the CRI
//! client hands them over: so the count is plegd's relist logic — the lists read in
//! place, compared with the records — not tonic's transport (plegd-bench measures that
//! end to end) nor the fake runtime's copies. Callgrind counts only inside
//! `measured_relists`. A dev build counts them, with the lists' reader (plegd-runtime)
//! and the hash and UTF-8 check it calls optimized as in a release build (the
//! workspace's Cargo.toml says why).
//!
//! After an intended change: `PLEGD_UPDATE_BASELINE=1 cargo test -p plegd-bench --test
//! relist_instructions` rewrites the baseline (commit it with the change's reason).

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use plegd_actors::{GenericPleg, RelistScope};
use plegd_runtime::{
    cri, Container, ContainerStatus, EventStream, ListMemo, NodeLists, RuntimeClient, RuntimeError,
    RuntimeVersion, Sandbox,
};
use plegd_sim::kubelet::{self, Kubelet};
use plegd_sim::FakeRuntime;
use prost::Message as _;

const PODS: usize = 1000;
const RELISTS: u64 = 5;
const BASELINE: &str = "relist_instructions.baseline";
/// Set in the child run under callgrind.
const CHILD: &str = "PLEGD_RELIST_INSTRUCTIONS_CHILD";

fn node() -> FakeRuntime {
    let rt = FakeRuntime::with_kubelet(Kubelet::default());
    kubelet::run_deployment_pods(
        &rt,
        PODS,
        "bench",
        |i| format!("{i:08x}-0000-4000-8000-{i:012x}"),
        &["app-0", "app-1"],
    );
    rt
}

/// The fake runtime, its node lists handed over as bytes (as `CriRuntime` does:
/// the messages its CRI server sends), encoded on the first global relist and the
/// same bytes after that (the node does not change).
struct WireListed {
    fake: FakeRuntime,
    lists: Mutex<Option<NodeLists>>,
}

#[async_trait]
impl RuntimeClient for WireListed {
    async fn version(&self) -> Result<RuntimeVersion, RuntimeError> {
        self.fake.version().await
    }
    async fn list_sandboxes(&self, id: Option<&str>) -> Result<Vec<Sandbox>, RuntimeError> {
        self.fake.list_sandboxes(id).await
    }
    async fn list_containers(&self, id: Option<&str>) -> Result<Vec<Container>, RuntimeError> {
        self.fake.list_containers(id).await
    }
    async fn list_node(&self) -> Result<NodeLists, RuntimeError> {
        if let Some(lists) = self.lists.lock().expect("not poisoned").clone() {
            return Ok(lists);
        }
        let items = self
            .fake
            .sandboxes_to_wire(&self.fake.list_sandboxes(None).await?);
        let containers = self
            .fake
            .containers_to_wire(&self.fake.list_containers(None).await?);
        let lists = NodeLists::Wire {
            sandboxes: cri::ListPodSandboxResponse { items }.encode_to_vec().into(),
            containers: cri::ListContainersResponse { containers }
                .encode_to_vec()
                .into(),
        };
        *self.lists.lock().expect("not poisoned") = Some(lists.clone());
        Ok(lists)
    }
    /// As `CriRuntime` reads them: ListContainers's message given to the global
    /// relist's reader in HTTP/2's default 16 KiB frames.
    async fn list_node_memo(&self, memo: &mut ListMemo) -> Result<NodeLists, RuntimeError> {
        match self.list_node().await? {
            NodeLists::Wire {
                sandboxes,
                containers,
            } => NodeLists::sunk(&sandboxes, &containers, 16 * 1024, memo),
            lists => Ok(lists),
        }
    }
    async fn sandbox_status(&self, id: &str) -> Result<Sandbox, RuntimeError> {
        self.fake.sandbox_status(id).await
    }
    async fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        self.fake.container_status(id).await
    }
    async fn container_events(&self) -> Result<EventStream, RuntimeError> {
        self.fake.container_events().await
    }
}

/// The measured part: `RELISTS` global relists of a node where nothing changes.
#[inline(never)]
fn measured_relists(rt: &tokio::runtime::Runtime, pleg: &mut GenericPleg) -> usize {
    let mut events = 0;
    for _ in 0..RELISTS {
        let out = rt
            .block_on(pleg.relist(&RelistScope::Global, &|_| false))
            .expect("the fake runtime lists");
        events += out.events.len() + out.cache.len();
    }
    events
}

/// The workload (also a plain test: a no-change relist publishes and updates nothing).
#[test]
fn no_change_relists_at_1k_pods() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    let runtime = WireListed {
        fake: node(),
        lists: Mutex::new(None),
    };
    let mut pleg = GenericPleg::new(Arc::new(runtime), 8);
    let first = rt
        .block_on(pleg.relist(&RelistScope::Global, &|_| false))
        .expect("the fake runtime lists");
    assert_eq!(first.events.len(), PODS * 3);
    assert_eq!(measured_relists(&rt, &mut pleg), 0);
}

/// The `totals:` (or `summary:`) line of a callgrind output file.
fn instructions(out: &Path) -> u64 {
    let text = std::fs::read_to_string(out).expect("callgrind's output file");
    text.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("an instruction total in callgrind's output")
}

#[test]
fn no_change_relist_instructions_stay_within_10_percent_of_the_baseline() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("callgrind.out");
    let me = std::env::current_exe().expect("this test binary's path");
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg("--toggle-collect=*measured_relists*")
        .arg(&me)
        .args([
            "--exact",
            "no_change_relists_at_1k_pods",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap_or_else(|e| {
            panic!("valgrind cannot run ({e}): install it (scripts/setup.sh does)")
        });
    assert!(
        status.status.success(),
        "the relists under callgrind failed: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let per_relist = instructions(&out) / RELISTS;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(BASELINE);
    if std::env::var_os("PLEGD_UPDATE_BASELINE").is_some() {
        std::fs::write(&path, format!("{per_relist}\n")).expect("writing the baseline");
        eprintln!(
            "baseline written: {per_relist} instructions per no-change relist of {PODS} pods"
        );
        return;
    }
    let baseline: u64 = std::fs::read_to_string(&path)
        .expect("the committed baseline")
        .trim()
        .parse()
        .expect("the baseline is a number");
    let ratio = per_relist as f64 / baseline as f64;
    eprintln!(
        "no-change global relist of {PODS} pods: {per_relist} instructions (baseline {baseline}, {:+.1} %)",
        (ratio - 1.0) * 100.0
    );
    assert!(
        ratio <= 1.10,
        "a no-change global relist of {PODS} pods costs {per_relist} instructions, {:.1} % over the baseline {baseline}: \
         find the cause (callgrind_annotate), or if intended update the baseline (see this file's header)",
        (ratio - 1.0) * 100.0
    );
}
