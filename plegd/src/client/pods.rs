//! `plegd pods [--json]`: the pods in a plegd's cache — a table (namespace, name,
//! uid, containers with their state), or one JSON object per pod.

use clap::Args;
use plegd_api::convert::container_state_name;
use plegd_api::v1;
use serde::Serialize;

use super::{call_failed, connect, print_line, within, SocketArg};
use crate::exit::ExitError;

#[derive(Args, Debug)]
pub struct PodsArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// One JSON object per pod (pod_uid, pod_name, pod_namespace, containers).
    #[arg(long)]
    pub json: bool,
}

/// A container in `--json` output (`plegd pods` and `plegd status`).
#[derive(Serialize)]
pub struct JsonContainer<'a> {
    container_id: &'a str,
    container_name: &'a str,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<i32>,
}

pub fn json_containers(pod: &v1::Pod) -> Vec<JsonContainer<'_>> {
    pod.containers
        .iter()
        .map(|c| JsonContainer {
            container_id: &c.container_id,
            container_name: &c.container_name,
            state: container_state_name(c.state),
            exit_code: c.exit_code,
        })
        .collect()
}

#[derive(Serialize)]
struct JsonPod<'a> {
    pod_uid: &'a str,
    pod_name: &'a str,
    pod_namespace: &'a str,
    containers: Vec<JsonContainer<'a>>,
}

/// `app=running, init=exited(0)`.
pub fn container_summary(pod: &v1::Pod) -> String {
    let list: Vec<String> = pod
        .containers
        .iter()
        .map(|c| {
            let state = container_state_name(c.state);
            match c.exit_code {
                Some(code) => format!("{}={state}({code})", c.container_name),
                None => format!("{}={state}", c.container_name),
            }
        })
        .collect();
    if list.is_empty() {
        "-".into()
    } else {
        list.join(", ")
    }
}

pub async fn run(args: PodsArgs) -> Result<(), ExitError> {
    let socket = &args.socket.api_socket;
    let list = within(socket, args.socket.timeout, async {
        let mut client = connect(socket).await?;
        client
            .list_pods(v1::ListPodsRequest {})
            .await
            .map_err(|s| call_failed(socket, &s))
    })
    .await?
    .into_inner();
    let mut pods = list.pods;
    pods.sort_by(|a, b| (&a.pod_namespace, &a.pod_name).cmp(&(&b.pod_namespace, &b.pod_name)));
    if args.json {
        for p in &pods {
            let line = serde_json::to_string(&JsonPod {
                pod_uid: &p.pod_uid,
                pod_name: &p.pod_name,
                pod_namespace: &p.pod_namespace,
                containers: json_containers(p),
            })
            .map_err(ExitError::runtime("encoding a pod"))?;
            print_line(&line)?;
        }
        return Ok(());
    }
    let w_ns = pods
        .iter()
        .map(|p| p.pod_namespace.len())
        .max()
        .unwrap_or(0)
        .max(9);
    let w_name = pods
        .iter()
        .map(|p| p.pod_name.len())
        .max()
        .unwrap_or(0)
        .max(4);
    let w_uid = pods
        .iter()
        .map(|p| p.pod_uid.len())
        .max()
        .unwrap_or(0)
        .max(3);
    print_line(&format!(
        "{:w_ns$}  {:w_name$}  {:w_uid$}  CONTAINERS",
        "NAMESPACE", "NAME", "UID"
    ))?;
    for p in &pods {
        print_line(&format!(
            "{:w_ns$}  {:w_name$}  {:w_uid$}  {}",
            p.pod_namespace,
            p.pod_name,
            p.pod_uid,
            container_summary(p)
        ))?;
    }
    Ok(())
}
