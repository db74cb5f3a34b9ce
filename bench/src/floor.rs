//! The floor of a global relist: what receiving the node's two lists costs a client
//! that does nothing with them. The client ([`BareLists`]) makes both calls on
//! plegd's transport (`plegd_runtime::unix_channel`: tonic's channel, hyper, h2, the
//! socket), both in flight together, and drops each response's body frame by frame
//! as HTTP/2 delivers it: no message is ever gathered, decoded or kept. It runs on a
//! thread of its own with a single-threaded tokio runtime, so the thread's CPU time
//! is all of the client's work. A second figure decodes the lists into prost's
//! messages, as a client of the generated types would, and drops them. A third reads
//! them as the first, in a child process with glibc's allocator set as plegd sets it
//! (`plegd_telemetry::malloc`: fixed mmap threshold, the heap trimmed after each read
//! as plegd trims it after each global relist).

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _, Result};
use plegd_runtime::cri;
use plegd_runtime::cri::runtime_service_client::RuntimeServiceClient;
use tonic::codegen::Bytes;
use tonic::transport::Channel;

use crate::procs::own_threads_cpu;

/// The floor thread's name (its CPU time is read from /proc by it).
const THREAD: &str = "floor";

/// The largest list the prost-decoding client accepts: any the bench makes (it
/// measures reading, and polices no limit; plegd's is --runtime-max-message-size).
const MAX_MESSAGE: usize = 1 << 30;

/// CPU per read of both lists, and their sizes.
pub struct Floor {
    pub reads: u32,
    /// Received and dropped as it arrives (plegd's transport).
    pub raw: Duration,
    /// The same, with plegd's glibc thresholds (in a child process).
    pub raw_fixed: Duration,
    /// Decoded into prost's messages and dropped.
    pub decoded: Duration,
    /// Bytes of the ListPodSandbox and ListContainers response bodies.
    pub bytes: (usize, usize),
}

/// `reads` reads of both lists (after 2 unmeasured ones) each way, `pace` apart.
pub fn measure(endpoint: &str, reads: u32, pace: Duration) -> Result<Floor> {
    let endpoint = endpoint.to_string();
    let (e, reads) = (endpoint.clone(), reads.max(1));
    let mut floor = on_floor_thread(move || run(&e, reads, pace))?;
    floor.raw_fixed = measure_fixed(&endpoint, reads, pace)?;
    Ok(floor)
}

/// `f` on the floor's thread.
fn on_floor_thread<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    std::thread::Builder::new()
        .name(THREAD.into())
        .spawn(f)
        .context("the floor's thread")?
        .join()
        .map_err(|_| anyhow!("the floor's thread panicked"))?
}

/// The raw reads' CPU per read, in a child (`plegd-bench --floor-child`): the glibc
/// setting is the process's, and fixed for good once made.
fn measure_fixed(endpoint: &str, reads: u32, pace: Duration) -> Result<Duration> {
    let out = Command::new(std::env::current_exe().context("the bench's own path")?)
        .args(["--floor-child", endpoint])
        .arg(format!("--floor-reads={reads}"))
        .arg(format!("--floor-pace={}ms", pace.as_millis()))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("the floor's child")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("the floor's child failed ({}): {text}", out.status);
    }
    let nanos: u64 = text
        .trim()
        .parse()
        .with_context(|| format!("the floor's child printed {text:?}, not nanoseconds"))?;
    Ok(Duration::from_nanos(nanos))
}

/// `--floor-child`: glibc's thresholds fixed as plegd's, then the raw reads; prints
/// their CPU per read in nanoseconds.
pub fn child(endpoint: &str, reads: u32, pace: Duration) -> Result<()> {
    use plegd_telemetry::malloc;
    if !malloc::fix_thresholds() || !malloc::defer_heap_trims() {
        bail!("glibc refused plegd's mmap and trim thresholds");
    }
    let endpoint = endpoint.to_string();
    let raw = on_floor_thread(move || {
        let rt = runtime()?;
        rt.block_on(async {
            let client = BareLists::new(&endpoint)?;
            // As plegd's trim thread after each global relist (here on the floor's
            // thread, so its CPU is counted).
            let (raw, _) = per_read(reads.max(1), pace, || async {
                let read = client.read().await;
                malloc::trim();
                read
            })
            .await?;
            Ok(raw)
        })
    })?;
    println!("{}", raw.as_nanos());
    Ok(())
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("the floor's async runtime")
}

/// A bare client of the node's two lists on plegd's transport; see the module doc.
#[derive(Clone)]
pub struct BareLists(Channel);

impl BareLists {
    pub fn new(endpoint: &str) -> Result<Self> {
        let socket = plegd_runtime::parse_unix_endpoint(endpoint)?;
        Ok(BareLists(plegd_runtime::unix_channel(&socket)))
    }

    /// Both lists, in flight together, received and dropped; their bodies' bytes.
    pub async fn read(&self) -> Result<(usize, usize)> {
        futures::try_join!(
            self.call("/runtime.v1.RuntimeService/ListPodSandbox"),
            self.call("/runtime.v1.RuntimeService/ListContainers"),
        )
    }

    /// One call with an empty request message (a list of everything); the bytes of
    /// the response's body, each frame dropped as it arrives. Fails unless the
    /// runtime's gRPC status says OK.
    async fn call(&self, path: &'static str) -> Result<usize> {
        use http_body_util::BodyExt as _;
        use tower::ServiceExt as _;
        // gRPC's 5-byte message head: not compressed, 0 bytes long.
        let empty = http_body_util::Full::new(Bytes::from_static(&[0; 5]));
        let req = http::Request::post(format!("http://localhost{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(tonic::body::Body::new(empty))
            .context("the floor's request")?;
        let resp = self.0.clone().oneshot(req).await.context(path)?;
        let mut status = resp.headers().get("grpc-status").cloned();
        let mut body = resp.into_body();
        let mut bytes = 0;
        while let Some(frame) = body.frame().await {
            match frame
                .with_context(|| format!("{path}'s response"))?
                .into_data()
            {
                Ok(data) => bytes += data.len(),
                Err(frame) => {
                    if let Some(trailers) = frame.trailers_ref() {
                        status = trailers.get("grpc-status").cloned().or(status);
                    }
                }
            }
        }
        match status {
            Some(s) if s == "0" => Ok(bytes),
            s => bail!("{path}: the runtime answered grpc-status {s:?}"),
        }
    }
}

fn run(endpoint: &str, reads: u32, pace: Duration) -> Result<Floor> {
    let rt = runtime()?;
    rt.block_on(async {
        let client = BareLists::new(endpoint)?;
        let socket = plegd_runtime::parse_unix_endpoint(endpoint)?;
        let generated = RuntimeServiceClient::new(plegd_runtime::unix_channel(&socket))
            .max_decoding_message_size(MAX_MESSAGE);
        let (raw, bytes) = per_read(reads, pace, || client.read()).await?;
        let (decoded, _) = per_read(reads, pace, || async {
            let (mut a, mut b) = (generated.clone(), generated.clone());
            let (s, c) = futures::try_join!(
                a.list_pod_sandbox(cri::ListPodSandboxRequest::default()),
                b.list_containers(cri::ListContainersRequest::default())
            )
            .context("the floor's decoded lists")?;
            drop((s, c));
            Ok((0, 0))
        })
        .await?;
        Ok(Floor {
            reads,
            raw,
            raw_fixed: Duration::ZERO,
            decoded,
            bytes,
        })
    })
}

/// CPU of this thread per call of `read`, over `reads` calls `pace` apart (after 2
/// unmeasured ones: the connection made, the buffers grown), and the last call's
/// answer.
async fn per_read<T, F, Fut>(reads: u32, pace: Duration, mut read: F) -> Result<(Duration, T)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    read().await?;
    let mut last = read().await?;
    let start = own_threads_cpu(THREAD)?;
    for _ in 0..reads {
        tokio::time::sleep(pace).await;
        last = read().await?;
    }
    Ok(((own_threads_cpu(THREAD)? - start) / reads, last))
}
