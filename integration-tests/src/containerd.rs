//! Driving a real containerd through CRI from tests and benches. Needs root: the
//! tests using it are `#[ignore]`d for a plain `cargo test` (say, on a laptop) and
//! run by `scripts/test.sh` (CI) with `--include-ignored`.
//!
//! - [`containerd`] brings containerd up once per process with
//!   `scripts/containerd-up.sh` (idempotent: ~0.1 s when it is already up) and returns
//!   its socket. If it cannot, it panics with the script's output: these tests fail,
//!   they are never skipped.
//! - [`Session::begin`] serialises every user of containerd: an async mutex inside the
//!   process, plus a host-wide lock (an abstract unix socket) against other processes
//!   (another `cargo test` on the same machine). containerd 1.7 does not broadcast CRI
//!   events: concurrent GetContainerEvents streams split them between them, and every
//!   cancelled stream leaves a server goroutine behind that swallows one later event.
//!   It also makes sure containerd answers (a previous test may have killed it) and
//!   removes every pod.
//! - [`Cri::make_sole_receiver`] deals with the swallowed events: it generates events
//!   until the caller's stream has received one. containerd hands its events out in
//!   FIFO order to the waiting streams, so from then on no leftover goroutine of an
//!   earlier (cancelled) stream is waiting any more and the caller's stream gets every
//!   event.
//! - [`Cri`]: the test kit's busybox-pod client (`plegd_testkit::cri`), failing the
//!   test on any error, with what only the tests do (ending containers, raw event
//!   streams).

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use plegd_runtime::cri;
use plegd_runtime::cri::runtime_service_client::RuntimeServiceClient;
use plegd_testkit::cri::{Busybox, CallError, Owner};
use tokio::sync::{Mutex, MutexGuard};
use tonic::transport::Channel;

pub use plegd_testkit::cri::BUSYBOX;
/// Label on every pod made here.
pub const LABEL: &str = "plegd-ci-test";
/// The file a [`wait_script`] container waits for before exiting by itself.
const EXIT_FILE: &str = "tmp/exit-now";

/// Which containerd build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// Debian trixie's containerd 1.7.x: has GetContainerEvents.
    V1_7,
    /// Debian bookworm's containerd 1.6.20: GetContainerEvents is Unimplemented.
    V1_6,
    /// Debian sid's containerd 2.1.x: CRI events go to every stream.
    V2_1,
}

impl Flavor {
    pub fn as_str(self) -> &'static str {
        match self {
            Flavor::V1_7 => "1.7",
            Flavor::V1_6 => "1.6",
            Flavor::V2_1 => "2",
        }
    }
}

/// A containerd started by `scripts/containerd-up.sh`.
#[derive(Debug)]
pub struct Containerd {
    pub flavor: Flavor,
    pub base: PathBuf,
    pub socket: PathBuf,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The state directory of `flavor`: `$PLEGD_CRI_BASE` or `/var/lib/plegd-ci`, with a
/// `-1.6` or `-2.1` suffix for 1.6 and 2.1 (the scripts' defaults; they never share
/// state).
pub fn base_dir(flavor: Flavor) -> PathBuf {
    let base = std::env::var_os("PLEGD_CRI_BASE")
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| "/var/lib/plegd-ci".into());
    match flavor {
        Flavor::V1_7 => PathBuf::from(base),
        Flavor::V1_6 | Flavor::V2_1 => {
            let mut b = base;
            b.push(if flavor == Flavor::V1_6 {
                "-1.6"
            } else {
                "-2.1"
            });
            PathBuf::from(b)
        }
    }
}

fn tail(text: &[u8], lines: usize) -> String {
    let text = String::from_utf8_lossy(text);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs `scripts/containerd-up.sh BASE` (blocking) and returns the socket path, the
/// script's only stdout line.
pub fn run_up_script(flavor: Flavor, base: &Path) -> Result<PathBuf, String> {
    let script = workspace_root().join("scripts/containerd-up.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(base)
        .env("PLEGD_CRI_CONTAINERD", flavor.as_str())
        // NRI on (1.7 only with this; 2.x has it on anyway; a runtime with no plugin
        // registered behaves as without): the NRI tests register one on BASE/nri.sock.
        .env("PLEGD_CRI_NRI", "1")
        .output()
        .map_err(|e| format!("cannot run bash {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {} failed ({}); its last output:\n{}",
            script.display(),
            base.display(),
            out.status,
            tail(&out.stderr, 40)
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    match lines.as_slice() {
        [sock] if sock.starts_with('/') => Ok(PathBuf::from(sock)),
        _ => Err(format!(
            "{} must print exactly one line, the socket path; it printed {stdout:?}",
            script.display()
        )),
    }
}

static V1_7: OnceLock<Result<Containerd, String>> = OnceLock::new();
static V1_6: OnceLock<Result<Containerd, String>> = OnceLock::new();
static V2_1: OnceLock<Result<Containerd, String>> = OnceLock::new();

/// The containerd of `flavor`, brought up once per process. Panics (the test fails)
/// with the reason when it cannot be started.
pub fn containerd(flavor: Flavor) -> &'static Containerd {
    match try_containerd(flavor) {
        Ok(c) => c,
        Err(e) => panic!(
            "the real-runtime tests need containerd {} and it could not be started: {e}\n\
             They need root on Debian 12 with apt access (see docs/containerd.md); \
             they are not skipped.",
            flavor.as_str()
        ),
    }
}

/// As [`containerd`], returning the error instead of panicking.
pub fn try_containerd(flavor: Flavor) -> Result<&'static Containerd, String> {
    let cell = match flavor {
        Flavor::V1_7 => &V1_7,
        Flavor::V1_6 => &V1_6,
        Flavor::V2_1 => &V2_1,
    };
    cell.get_or_init(|| {
        let base = base_dir(flavor);
        let t = Instant::now();
        let socket = run_up_script(flavor, &base)?;
        eprintln!(
            "[containerd] {} up at {} ({:.1} s)",
            flavor.as_str(),
            socket.display(),
            t.elapsed().as_secs_f64()
        );
        Ok(Containerd {
            flavor,
            base,
            socket,
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

impl Containerd {
    /// plegd's `--runtime-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Its NRI socket (`scripts/containerd-up.sh` with `PLEGD_CRI_NRI=1` on 1.7; on by
    /// default on 2.x; none on 1.6).
    pub fn nri_socket(&self) -> PathBuf {
        self.base.join("nri.sock")
    }

    /// containerd's PID, from BASE/containerd.pid.
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.base.join("containerd.pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// (Re)starts it with the up script, off the async runtime's thread (plegd's actors
    /// keep running meanwhile).
    pub async fn up(&'static self) -> Result<(), String> {
        let socket = tokio::task::spawn_blocking(move || run_up_script(self.flavor, &self.base))
            .await
            .map_err(|e| format!("up script task: {e}"))??;
        if socket != self.socket {
            return Err(format!(
                "the socket moved: {} -> {}",
                self.socket.display(),
                socket.display()
            ));
        }
        Ok(())
    }
}

/// Sends `signal` (a name: TERM, KILL, ...) to a process by PID.
pub fn signal_pid(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed: {status}");
}

pub fn pid_alive(pid: u32) -> bool {
    // A zombie still has /proc/PID; its state letter is Z.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => stat
            .rsplit_once(") ")
            .map(|(_, rest)| !rest.starts_with('Z'))
            .unwrap_or(true),
    }
}

/// Waits (polling, generous deadline) until process `pid` is gone.
pub async fn wait_pid_gone(pid: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while pid_alive(pid) {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) still alive after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

static LOCK: Mutex<()> = Mutex::const_new(());

/// Holds a host-wide lock: an abstract unix socket (released by the kernel when the
/// process dies, whatever happens).
pub struct HostLock {
    /// Held, never read: the lock is the bound name.
    _listener: UnixListener,
}

impl HostLock {
    pub async fn acquire() -> HostLock {
        use std::hash::{Hash, Hasher};
        // Keyed by BASE (hashed: abstract names are limited to 107 bytes).
        let mut h = std::collections::hash_map::DefaultHasher::new();
        base_dir(Flavor::V1_7).hash(&mut h);
        let name = format!("plegd-ci-containerd-tests-{:016x}", h.finish());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract name");
        let start = Instant::now();
        let mut told = false;
        loop {
            match UnixListener::bind_addr(&addr) {
                Ok(l) => return HostLock { _listener: l },
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    if !told && start.elapsed() > Duration::from_secs(5) {
                        eprintln!("[containerd] waiting for another process's containerd tests");
                        told = true;
                    }
                    assert!(
                        start.elapsed() < Duration::from_secs(1800),
                        "another process held the containerd test lock for 30 min"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("binding the containerd test lock {name:?}: {e}"),
            }
        }
    }
}

/// Exclusive use of the containerds for one test: hold it for the whole test.
pub struct Session {
    pub containerd: &'static Containerd,
    pub cri: Cri,
    _host: HostLock,
    _guard: MutexGuard<'static, ()>,
}

impl Session {
    /// Takes the locks, makes sure containerd `flavor` is up and answers CRI (starting
    /// it again if a previous test left it down) and removes every pod.
    pub async fn begin(flavor: Flavor) -> Session {
        let guard = LOCK.lock().await;
        let host = HostLock::acquire().await;
        let containerd = containerd(flavor);
        let cri = Cri::connect(&containerd.socket);
        if cri.version().await.is_err() {
            eprintln!("[containerd] not answering: starting it again");
            if let Err(e) = containerd.up().await {
                panic!("containerd {} could not be restarted: {e}", flavor.as_str());
            }
        }
        cri.wait_ready(Duration::from_secs(30)).await;
        let removed = cri.remove_all_pods().await;
        if removed > 0 {
            eprintln!("[containerd] removed {removed} pods left by an earlier run");
        }
        Session {
            containerd,
            cri,
            _host: host,
            _guard: guard,
        }
    }
}

/// A pod sandbox made by [`Cri::run_pod`].
pub use plegd_testkit::cri::Pod;

/// How a test container ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Death {
    /// Exits by itself with this code (after [`Cri::trigger_exit`]).
    Exit(i32),
    /// SIGKILL of its process, as a crash: 137.
    Kill,
    /// CRI StopContainer (SIGTERM, trapped): 0.
    Stop,
}

/// A container command that runs until told to exit (the file /tmp/exit-now appears in
/// its root, see [`Cri::trigger_exit`]), then exits with `code` by itself. SIGTERM
/// (StopContainer) makes it exit 0 at once.
pub fn wait_script(code: i32) -> String {
    format!("trap 'exit 0' TERM; until [ -e /{EXIT_FILE} ]; do sleep 0.2; done; exit {code}")
}

/// A container command that runs until told to (as [`wait_script`]), then touches more
/// memory than a small limit allows (as the container's main process): with a memory
/// limit, the kernel OOM-kills it and containerd reports OOMKilled, 137.
pub fn oom_script() -> String {
    format!(
        "until [ -e /{EXIT_FILE} ]; do sleep 0.2; done; exec dd if=/dev/zero of=/dev/null bs=256M count=1"
    )
}

/// A container command that sleeps until stopped (SIGTERM → exit 0) or killed.
pub const SLEEP_SCRIPT: &str = "trap 'exit 0' TERM; sleep 3600 & wait";

/// Who the tests' pods belong to.
const OWNER: Owner = Owner {
    label: LABEL,
    namespace: "plegd-ci",
    uid_prefix: "plegd-test",
};

/// The tests' CRI client over containerd's unix socket: [`Busybox`], failing the test
/// on any error. Build it inside the runtime that uses it (tonic spawns the
/// connection on the current runtime).
#[derive(Clone)]
pub struct Cri {
    pub busybox: Busybox,
}

/// The value, or the test fails with the call's error.
fn must<T>(answer: Result<T, CallError>) -> T {
    answer.unwrap_or_else(|e| panic!("{e}"))
}

impl Cri {
    pub fn connect(socket: &Path) -> Cri {
        let base = socket.parent().unwrap_or(Path::new("/tmp"));
        Cri {
            busybox: Busybox::connect(socket, &base.join("logs"), OWNER),
        }
    }

    fn c(&self) -> RuntimeServiceClient<Channel> {
        self.busybox.client.clone()
    }

    pub async fn version(&self) -> Result<cri::VersionResponse, tonic::Status> {
        self.busybox.version().await
    }

    /// Polls Version until it answers (the CRI plugin may still be initialising).
    pub async fn wait_ready(&self, within: Duration) -> cri::VersionResponse {
        let deadline = Instant::now() + within;
        loop {
            match self.version().await {
                Ok(v) => return v,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "CRI Version did not answer within {within:?}: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs a host-network pod (network NODE, pid namespace POD: no CNI needed).
    pub async fn run_pod(&self, name: &str) -> Pod {
        must(self.busybox.run_pod(name).await)
    }

    /// Creates a busybox container running `sh -c script` (not started).
    pub async fn create_container(&self, pod: &Pod, name: &str, script: &str) -> String {
        self.create_limited_container(pod, name, script, None).await
    }

    /// As [`Self::create_container`], with a memory limit (cgroup memory.limit) when
    /// `memory_limit` is given.
    pub async fn create_limited_container(
        &self,
        pod: &Pod,
        name: &str,
        script: &str,
        memory_limit: Option<i64>,
    ) -> String {
        must(
            self.busybox
                .create_container(pod, name, script, memory_limit)
                .await,
        )
    }

    pub async fn start_container(&self, id: &str) {
        must(self.busybox.start_container(id).await)
    }

    /// Creates and starts a container; returns its ID.
    pub async fn run_container(&self, pod: &Pod, name: &str, script: &str) -> String {
        must(self.busybox.run_container(pod, name, script).await)
    }

    /// CRI StopContainer (SIGTERM, SIGKILL after `timeout_s`).
    pub async fn stop_container(&self, id: &str, timeout_s: i64) {
        must(self.busybox.stop_container(id, timeout_s).await)
    }

    /// RemoveContainer (one already gone is fine).
    pub async fn remove_container(&self, id: &str) {
        must(self.busybox.remove_container(id).await)
    }

    pub async fn container_status(&self, id: &str) -> cri::ContainerStatus {
        must(self.busybox.container_status(id).await)
    }

    /// The host PID of the container's process (verbose ContainerStatus).
    pub async fn container_pid(&self, id: &str) -> u32 {
        must(self.busybox.pid(id).await)
    }

    /// Makes a [`wait_script`] container exit by itself: creates /tmp/exit-now in its
    /// root through /proc/PID/root (works while containerd is down, too).
    pub async fn trigger_exit(&self, id: &str) -> u32 {
        let pid = self.container_pid(id).await;
        trigger_exit_pid(pid);
        pid
    }

    /// SIGKILLs the container's process (a crash, not through the runtime).
    pub async fn kill_container(&self, id: &str) -> u32 {
        let pid = self.container_pid(id).await;
        signal_pid(pid, "KILL");
        pid
    }

    /// Ends a container the way `death` says.
    pub async fn end_container(&self, id: &str, death: Death) {
        match death {
            Death::Exit(_) => {
                self.trigger_exit(id).await;
            }
            Death::Kill => {
                self.kill_container(id).await;
            }
            Death::Stop => self.stop_container(id, 10).await,
        }
    }

    /// Polls ContainerStatus until the container is EXITED.
    pub async fn wait_exited(&self, id: &str) -> cri::ContainerStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let st = self.container_status(id).await;
            if st.state == cri::ContainerState::ContainerExited as i32 {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "{id} not exited after 30 s: {st:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn pods(&self) -> Vec<cri::PodSandbox> {
        must(self.busybox.pods().await)
    }

    /// StopPodSandbox then RemovePodSandbox (a pod already gone is fine).
    pub async fn remove_pod(&self, id: &str) {
        must(self.busybox.remove_pod(id).await)
    }

    /// Removes every pod (8 at a time); returns how many there were.
    pub async fn remove_all_pods(&self) -> usize {
        let ids: Vec<String> = self.pods().await.into_iter().map(|p| p.id).collect();
        let n = ids.len();
        futures::stream::iter(ids)
            .for_each_concurrent(8, |id| async move { self.remove_pod(&id).await })
            .await;
        n
    }

    /// Generates events (a CreateContainer each) in `pod` until `received` — the
    /// number of events the caller's stream has received — grows. From then on no
    /// leftover of an earlier, cancelled stream waits in containerd any more, so the
    /// caller's stream is the only receiver (module docs). The containers made here are
    /// removed again.
    pub async fn make_sole_receiver(&self, pod: &Pod, received: impl Fn() -> u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut made = Vec::new();
        let before = received();
        'outer: for i in 0.. {
            made.push(
                self.create_container(pod, &format!("flush-{i}"), "exit 0")
                    .await,
            );
            let round = Instant::now() + Duration::from_millis(500);
            while Instant::now() < round {
                if received() > before {
                    break 'outer;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(
                Instant::now() < deadline,
                "the event stream received none of {} events in 60 s",
                made.len()
            );
        }
        if made.len() > 1 {
            eprintln!(
                "[containerd] {} events went to leftovers of earlier streams",
                made.len() - 1
            );
        }
        for id in made {
            self.remove_container(&id).await;
        }
    }

    /// Opens a raw GetContainerEvents stream (no plegd) in a local task. containerd sends
    /// no headers before the first event, so the call resolves only then.
    pub fn raw_events(&self) -> RawEvents {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let count = Arc::new(AtomicU64::new(0));
        let (mut client, n) = (self.c(), count.clone());
        let task = actix_rt::spawn(async move {
            let mut stream = match client
                .get_container_events(cri::GetEventsRequest::default())
                .await
            {
                Ok(s) => s.into_inner(),
                Err(e) => return Err(e),
            };
            while let Some(item) = stream.next().await {
                let ev = item?;
                let at = plegd_runtime::now_ns();
                n.fetch_add(1, Ordering::SeqCst);
                if tx.send((at, ev)).is_err() {
                    break;
                }
            }
            Ok(())
        });
        RawEvents { rx, count, task }
    }
}

/// A raw CRI event stream: events with their receipt time (ns since the epoch).
pub struct RawEvents {
    pub rx: tokio::sync::mpsc::UnboundedReceiver<(i64, cri::ContainerEventResponse)>,
    pub count: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Result<(), tonic::Status>>,
}

impl RawEvents {
    pub fn received(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Waits for the event of `kind` about `container_id`; returns its receipt time.
    pub async fn wait_for(&mut self, kind: cri::ContainerEventType, container_id: &str) -> i64 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Err(_) => panic!("no {kind:?} for {container_id} within 30 s"),
                Ok(None) => panic!("the raw event stream ended"),
                Ok(Some((at, ev))) => {
                    if ev.container_event_type == kind as i32 && ev.container_id == container_id {
                        return at;
                    }
                }
            }
        }
    }
}

impl Drop for RawEvents {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Creates the exit file in the root of process `pid` (see [`wait_script`]).
pub fn trigger_exit_pid(pid: u32) {
    let path = format!("/proc/{pid}/root/{EXIT_FILE}");
    std::fs::write(&path, b"").unwrap_or_else(|e| panic!("creating {path}: {e}"));
}

/// Every event the StreamWatcher has received (all types, valid or not).
pub fn stream_events_received(m: &plegd_telemetry::Metrics) -> u64 {
    plegd_telemetry::StreamEventType::ALL
        .iter()
        .map(|&t| m.stream_events(t))
        .sum()
}

/// plegd's core on this session's containerd through its real CRI client: these hint
/// sources (NRI on the session's NRI socket, which must exist), a global relist every
/// `period`, this reconnect policy; returns once the first global relist is done, with
/// a subscription taken before it.
pub async fn start_pleg(
    s: &Session,
    sources: &[plegd_actors::HintSourceName],
    period: Duration,
    reconnect: plegd_actors::ReconnectPolicy,
) -> (plegd_actors::Pleg, plegd_actors::Subscription) {
    let runtime = plegd_runtime::CriRuntime::new(&s.containerd.endpoint(), Duration::from_secs(10))
        .expect("CRI client for containerd's socket");
    if sources.contains(&plegd_actors::HintSourceName::Nri) {
        let socket = s.containerd.nri_socket();
        assert!(
            socket.exists(),
            "{} is missing: this containerd runs without NRI (containerd-up.sh with \
             PLEGD_CRI_NRI=1)",
            socket.display()
        );
    }
    let cfg = plegd_actors::PlegConfig {
        relist_period: period,
        hint_sources: sources.to_vec(),
        nri_socket: s.containerd.nri_socket(),
        reconnect,
        ..plegd_actors::PlegConfig::default()
    };
    let metrics = Arc::new(plegd_telemetry::Metrics::new());
    let pleg = plegd_actors::Pleg::start(Arc::new(runtime), &cfg, metrics);
    let sub = pleg.subscribe("test", 100_000).await.expect("subscribe");
    let health = pleg.health().clone();
    crate::wait::wait_until("plegd's first global relist", || health.ready()).await;
    (pleg, sub)
}
