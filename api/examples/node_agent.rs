//! A node agent on plegd's subscriber API (README "Subscriber API"): it watches
//! every container death on the node and never misses one across its own restarts
//! or plegd's hiccups — it lists once (initial events), then resumes from the last
//! revision it saw; a refused revision (too old, or another plegd instance) makes it
//! list again. With `--sync UID` it first holds that pod while it "syncs" it, as a
//! pod worker would, so plegd relists the pod once the sync is over: on the control
//! socket (`--api-control-socket`, by default the one beside the API socket), which
//! alone serves Sync.
//!
//! ```text
//! cargo run -p plegd-api --example node_agent -- [--api-socket PATH] [--api-control-socket PATH] [--sync UID]
//! ```

use std::path::PathBuf;
use std::time::Duration;

use plegd_api::v1::{self, watch_response::Kind};
use tokio_stream::wrappers::ReceiverStream;

/// Where a resumed watch goes on from.
#[derive(Clone, Debug)]
struct ResumePoint {
    instance_id: String,
    revision: u64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut socket = std::env::var_os("PLEGD_API_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(plegd_api::DEFAULT_SOCKET));
    let mut control: Option<PathBuf> = None;
    let mut sync = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--api-socket" => socket = args.next().ok_or("--api-socket PATH")?.into(),
            "--api-control-socket" => {
                control = Some(args.next().ok_or("--api-control-socket PATH")?.into())
            }
            "--sync" => sync = Some(args.next().ok_or("--sync UID")?),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if let Some(uid) = sync {
        let control = control.unwrap_or_else(|| plegd_api::control_socket_beside(&socket));
        sync_pod(&control, &uid).await?;
    }
    watch_forever(&socket).await
}

/// Holds `uid`'s relists while "syncing" it, then ends the sync successfully: plegd
/// relists the pod once (post_sync). Dropping the stream instead would cancel it.
async fn sync_pod(socket: &std::path::Path, uid: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut client = plegd_api::connect(socket).await?;
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tx.send(v1::SyncRequest {
        kind: Some(v1::sync_request::Kind::Begin(v1::SyncBegin {
            pod_uid: uid.to_string(),
        })),
    })
    .await?;
    let mut answers = client.sync(ReceiverStream::new(rx)).await?.into_inner();
    if let Some(v1::SyncResponse {
        kind: Some(v1::sync_response::Kind::Held(h)),
    }) = answers.message().await?
    {
        println!("holding pod {uid} on node {}", h.node_name);
    }
    // ... the pod worker's sync would run here (one longer than plegd's --max-sync-hold
    // sends `renew` before the `held`'s expires_at_unix_nano) ...
    tx.send(v1::SyncRequest {
        kind: Some(v1::sync_request::Kind::End(v1::SyncEnd {
            outcome: v1::SyncOutcome::SyncSuccess.into(),
        })),
    })
    .await?;
    while answers.message().await?.is_some() {}
    println!("sync of {uid} done; plegd relists it now");
    Ok(())
}

/// Watches container deaths forever, resuming after any interruption.
async fn watch_forever(socket: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let mut resume: Option<ResumePoint> = None;
    loop {
        match watch_once(socket, &mut resume).await {
            // A revision plegd cannot serve: list again (initial events).
            Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                println!("resume refused ({}); listing again", status.message());
                resume = None;
            }
            Err(status) => {
                println!("watch interrupted ({}); resuming in 1s", status.message());
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Ok(()) => {}
        }
    }
}

/// One Watch stream, moving `resume` forward with every event and bookmark. Ends
/// (Ok) at a Gap: the caller resumes from before it, and plegd's history fills it in.
async fn watch_once(
    socket: &std::path::Path,
    resume: &mut Option<ResumePoint>,
) -> Result<(), tonic::Status> {
    let mut client = plegd_api::connect(socket)
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let request = v1::WatchRequest {
        types: vec![v1::EventType::ContainerDied.into()],
        send_initial_events: resume.is_none(),
        since_revision: resume.as_ref().map(|r| r.revision),
        instance_id: resume
            .as_ref()
            .map(|r| r.instance_id.clone())
            .unwrap_or_default(),
        // Keeps the resume point fresh on a quiet node.
        bookmark_interval_seconds: 30,
        ..v1::WatchRequest::default()
    };
    let mut stream = client.watch(request).await?.into_inner();
    let mut instance_id = String::new();
    while let Some(msg) = stream.message().await? {
        match msg.kind {
            Some(Kind::Hello(h)) => instance_id = h.instance_id,
            Some(Kind::Gap(g)) => {
                // Resume from the last revision before the loss: the replay sends
                // exactly the lost deaths.
                println!("lost events after revision {}; resuming", g.after_revision);
                *resume = Some(ResumePoint {
                    instance_id: instance_id.clone(),
                    revision: g.after_revision,
                });
                return Ok(());
            }
            Some(Kind::Event(e)) => {
                if e.sandbox {
                    continue; // the pod's sandbox: not a container of the pod's spec
                }
                let what = if e.snapshot { "already dead" } else { "died" };
                println!(
                    "{}/{} {} {what}: exit {:?} {}",
                    e.pod_namespace,
                    e.pod_name,
                    e.container_name,
                    e.exit_code,
                    e.reason.as_deref().unwrap_or("")
                );
                // The initial events' revision is a resume point only once they are
                // all in: the bookmark after them says so.
                if !e.snapshot {
                    *resume = Some(ResumePoint {
                        instance_id: instance_id.clone(),
                        revision: e.revision,
                    });
                }
            }
            Some(Kind::Bookmark(b)) => {
                *resume = Some(ResumePoint {
                    instance_id: instance_id.clone(),
                    revision: b.revision,
                });
            }
            None => {}
        }
    }
    Ok(())
}
