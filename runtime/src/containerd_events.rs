//! containerd's own event service (`containerd.services.events.v1.Events/Subscribe`),
//! on the same socket as CRI: unlike CRI's GetContainerEvents on containerd 1.7, it
//! gives every subscriber every event, so plegd can share the node with other event
//! consumers. plegd subscribes to the task start, exit, OOM and delete topics of the
//! CRI namespace (`k8s.io`); items are the wire envelopes, unvalidated, read by
//! [`read`]. Bindings: the maintained `containerd-client` crate, re-exported.

use futures::stream::BoxStream;
use prost::Message as _;

pub use containerd_client::events::{TaskDelete, TaskExit, TaskOom, TaskStart};
/// containerd-client's message modules, for code generated against them (plegd-sim's
/// event server).
pub use containerd_client::services::v1 as containerd_services;
pub use containerd_client::services::v1::events_client::EventsClient;
pub use containerd_client::services::v1::SubscribeRequest;
pub use containerd_client::types as containerd_types;
pub use containerd_client::types::Envelope;
/// The envelope's payload type.
pub use prost_types::Any;

use crate::RuntimeError;

/// The namespace CRI runs every pod in.
pub const CRI_NAMESPACE: &str = "k8s.io";
pub const TOPIC_START: &str = "/tasks/start";
pub const TOPIC_EXIT: &str = "/tasks/exit";
pub const TOPIC_OOM: &str = "/tasks/oom";
pub const TOPIC_DELETE: &str = "/tasks/delete";

/// The raw task event stream.
pub type TaskEventStream = BoxStream<'static, Result<Envelope, RuntimeError>>;

/// The Subscribe filters: one per topic, each also on the CRI namespace (containerd
/// ORs the filters and ANDs the terms of one).
pub fn subscribe_filters() -> Vec<String> {
    [TOPIC_START, TOPIC_EXIT, TOPIC_OOM, TOPIC_DELETE]
        .iter()
        .map(|t| format!("namespace=={CRI_NAMESPACE},topic==\"{t}\""))
        .collect()
}

/// Which task event an envelope is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskTopic {
    /// The task started: CRI records the container running right after.
    Start,
    /// The task exited: CRI records it only after it deleted the task.
    Exit,
    Oom,
    /// The task was deleted: for a container CRI runs, the last step before CRI
    /// records the exit.
    Delete,
}

/// One envelope, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskEvent {
    /// A task event of the CRI namespace about this container (or sandbox) ID.
    Task {
        topic: TaskTopic,
        container_id: String,
    },
    /// Another namespace or topic (the filters should have kept it away).
    Other,
    /// No payload, one that does not decode as its topic's message, or no container
    /// ID: ignored.
    Invalid { reason: String },
}

/// What one envelope says. Pure; never panics on any input.
pub fn read(env: &Envelope) -> TaskEvent {
    let topic = match env.topic.as_str() {
        TOPIC_START => TaskTopic::Start,
        TOPIC_EXIT => TaskTopic::Exit,
        TOPIC_OOM => TaskTopic::Oom,
        TOPIC_DELETE => TaskTopic::Delete,
        _ => return TaskEvent::Other,
    };
    if env.namespace != CRI_NAMESPACE {
        return TaskEvent::Other;
    }
    let Some(any) = &env.event else {
        return TaskEvent::Invalid {
            reason: format!("{} without a payload", env.topic),
        };
    };
    let bytes = any.value.as_slice();
    let id = match topic {
        TaskTopic::Start => TaskStart::decode(bytes).map(|m| m.container_id),
        TaskTopic::Exit => TaskExit::decode(bytes).map(|m| m.container_id),
        TaskTopic::Oom => TaskOom::decode(bytes).map(|m| m.container_id),
        TaskTopic::Delete => TaskDelete::decode(bytes).map(|m| m.container_id),
    };
    match id {
        Ok(id) if !id.is_empty() => TaskEvent::Task {
            topic,
            container_id: id,
        },
        Ok(_) => TaskEvent::Invalid {
            reason: format!("{} without a container ID", env.topic),
        },
        Err(e) => TaskEvent::Invalid {
            reason: format!("{}: undecodable payload: {e}", env.topic),
        },
    }
}

/// An envelope as containerd sends it, for the simulated runtime and tests.
pub fn envelope(namespace: &str, topic: &str, container_id: &str) -> Envelope {
    let (type_url, value) = match topic {
        TOPIC_START => (
            "containerd.events.TaskStart",
            TaskStart {
                container_id: container_id.into(),
                pid: 1,
            }
            .encode_to_vec(),
        ),
        TOPIC_OOM => (
            "containerd.events.TaskOOM",
            TaskOom {
                container_id: container_id.into(),
            }
            .encode_to_vec(),
        ),
        TOPIC_DELETE => (
            "containerd.events.TaskDelete",
            TaskDelete {
                container_id: container_id.into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        _ => (
            "containerd.events.TaskExit",
            TaskExit {
                container_id: container_id.into(),
                id: container_id.into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
    };
    Envelope {
        timestamp: None,
        namespace: namespace.into(),
        topic: topic.into(),
        event: Some(Any {
            type_url: type_url.into(),
            value,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_task_topic_of_the_cri_namespace_names_its_container() {
        for (topic, want) in [
            (TOPIC_START, TaskTopic::Start),
            (TOPIC_EXIT, TaskTopic::Exit),
            (TOPIC_OOM, TaskTopic::Oom),
            (TOPIC_DELETE, TaskTopic::Delete),
        ] {
            assert_eq!(
                read(&envelope(CRI_NAMESPACE, topic, "c1")),
                TaskEvent::Task {
                    topic: want,
                    container_id: "c1".into()
                }
            );
            assert_eq!(read(&envelope("moby", topic, "c1")), TaskEvent::Other);
        }
        assert_eq!(
            read(&envelope(CRI_NAMESPACE, "/tasks/create", "c1")),
            TaskEvent::Other
        );
    }

    #[test]
    fn garbage_is_invalid_never_a_panic() {
        let mut no_payload = envelope(CRI_NAMESPACE, TOPIC_EXIT, "c1");
        no_payload.event = None;
        let mut garbage = envelope(CRI_NAMESPACE, TOPIC_EXIT, "c1");
        if let Some(any) = garbage.event.as_mut() {
            any.value = vec![0xff, 0xff, 0xff, 0xff, 0x0f];
        }
        for env in [no_payload, garbage, envelope(CRI_NAMESPACE, TOPIC_OOM, "")] {
            assert!(matches!(read(&env), TaskEvent::Invalid { .. }), "{env:?}");
        }
    }

    #[test]
    fn the_filters_name_the_namespace_and_each_topic() {
        assert_eq!(
            subscribe_filters(),
            [
                "namespace==k8s.io,topic==\"/tasks/start\"",
                "namespace==k8s.io,topic==\"/tasks/exit\"",
                "namespace==k8s.io,topic==\"/tasks/oom\"",
                "namespace==k8s.io,topic==\"/tasks/delete\"",
            ]
        );
    }
}
