//! A node whose list is over the runtime's own send limit, through the real binary:
//! on a runtime without the streaming list calls, plegd says which call hit whose
//! limit in its log, on /readyz and /healthz and in `plegd status`, and never becomes
//! ready; on one with them, the same node is read and plegd is ready. The node is
//! small and the simulated runtime's send limit smaller (containerd's is 16 MiB), so
//! the same paths run in a second.

use std::path::Path;
use std::process::Stdio;

use integration_tests::process::{
    command, free_port, http_get, run_to_end, signal, wait_exit, wait_until, Reaped,
};
use plegd_runtime::{cri, RuntimeClient as _};
use plegd_sim::kubelet::{self, Kubelet};
use plegd_sim::{spawn_in_thread, FakeRuntime, ListServing};
use prost::Message as _;

const PODS: usize = 120;

/// A kubelet-dressed node whose ListContainers response is over the returned send
/// limit and whose ListPodSandbox response is under it.
fn node_over_a_limit() -> (FakeRuntime, usize) {
    let rt = FakeRuntime::with_kubelet(Kubelet {
        heavy_every: 0,
        heavy_bytes: 0,
    });
    kubelet::run_deployment_pods(&rt, PODS, "ns", |i| format!("uid-{i}"), &["app", "sidecar"]);
    let lens = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(async {
            let sandboxes = rt.list_sandboxes(None).await.expect("sandboxes");
            let containers = rt.list_containers(None).await.expect("containers");
            (
                cri::ListPodSandboxResponse {
                    items: rt.sandboxes_to_wire(&sandboxes),
                }
                .encoded_len(),
                cri::ListContainersResponse {
                    containers: rt.containers_to_wire(&containers),
                }
                .encoded_len(),
            )
        });
    assert!(lens.0 < lens.1, "{lens:?}");
    (rt, (lens.0 + lens.1) / 2)
}

/// `plegd run` on `endpoint` with its metrics on `port` and its API on `api`, stderr
/// to `log`.
fn plegd(endpoint: &str, port: u16, api: &Path, log: &Path) -> Reaped {
    let child = command(env!("CARGO_BIN_EXE_plegd"))
        .args(["run", "--runtime-endpoint", endpoint])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args(["--relist-period", "100ms", "--hint-sources", "none"])
        .arg("--api-socket")
        .arg(api)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("the log file"))
        .spawn()
        .expect("plegd starts");
    Reaped(child)
}

fn stop(mut plegd: Reaped) {
    signal(&plegd.0, "TERM");
    let (status, _) = wait_exit(&mut plegd.0);
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_node_over_the_runtimes_send_limit_is_named_without_streams_and_read_with_them() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (rt, limit) = node_over_a_limit();
    rt.set_list_serving(ListServing {
        send_limit: Some(limit),
        streaming: false,
        stream_batch: 25,
    });
    let server = spawn_in_thread(&dir.path().join("cri.sock"), rt.clone()).expect("the sim");
    let (port, api, log) = (
        free_port(),
        dir.path().join("api.sock"),
        dir.path().join("plegd.log"),
    );

    // No streams: every global relist fails on ListContainers, and says so.
    let run = plegd(&server.endpoint(), port, &api, &log);
    let said = "ListContainers: the runtime refused to send its response";
    let mut readyz = (0, String::new());
    wait_until("/readyz names the refused list", || {
        readyz = http_get(port, "/readyz").unwrap_or_default();
        readyz.1.contains(said)
    });
    let (code, readyz) = readyz;
    assert_eq!(code, 503, "{readyz}");
    assert!(
        readyz.contains(&format!("send limit of {limit} bytes")),
        "{readyz}"
    );
    assert!(
        readyz.contains("does not offer the streaming list calls"),
        "{readyz}"
    );
    let status = run_to_end(
        command(env!("CARGO_BIN_EXE_plegd"))
            .args(["status", "--api-socket"])
            .arg(&api),
    )
    .0;
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(
        status.contains("FAILING") && status.contains(said),
        "{status}"
    );
    stop(run);
    let text = std::fs::read_to_string(&log).expect("the log");
    assert!(
        text.contains("global relist failed") && text.contains(said),
        "{text}"
    );
    assert_eq!(
        text.matches("global relists use ListPodSandbox and ListContainers")
            .count(),
        1,
        "said once: {text}"
    );
    let calls = rt.list_stream_calls();
    assert!(calls.asked_once(), "{calls:?}");

    // The same node on a runtime with the streams: read, ready.
    rt.set_list_serving(ListServing {
        send_limit: Some(limit),
        streaming: true,
        stream_batch: 25,
    });
    let run = plegd(&server.endpoint(), port, &api, &log);
    wait_until("ready", || {
        http_get(port, "/readyz").is_some_and(|(code, _)| code == 200)
    });
    let (_, readyz) = http_get(port, "/readyz").expect("/readyz answers");
    assert!(!readyz.contains("failed"), "{readyz}");
    stop(run);
    let text = std::fs::read_to_string(&log).expect("the log");
    assert!(
        text.contains("the runtime offers the streaming list calls"),
        "{text}"
    );
    assert!(!text.contains("global relist failed"), "{text}");
}
