//! GetContainerEvents as plegd reads it: each event decoded by prost into messages that
//! declare only the fields a hint uses (the container, the event's type and time, the
//! pod sandbox's ID and metadata), with CRI's field numbers and types. The sandbox's
//! labels, annotations and network and every container status the event carries are
//! skipped by their length: a hint never stores them, and decoding them into maps and
//! strings was most of what an event cost plegd (a storm of 5,000 stops at 10,000
//! pods: ≈ 8 % of plegd's CPU).
//!
//! The same contract as `status_read`: what it reads, it reads exactly as prost's
//! decoding of `cri::ContainerEventResponse` does, and it accepts every event prost
//! accepts, and also one whose skipped fields prost would refuse (a label that is not
//! UTF-8). The tests check both against prost.

use crate::cri;

/// `cri::ContainerEventResponse`, the fields a hint uses.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EventRead {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(enumeration = "cri::ContainerEventType", tag = "2")]
    pub container_event_type: i32,
    #[prost(int64, tag = "3")]
    pub created_at: i64,
    #[prost(message, optional, tag = "4")]
    pub pod_sandbox_status: Option<SandboxRead>,
}

/// `cri::PodSandboxStatus`, its ID and metadata.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxRead {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<cri::PodSandboxMetadata>,
}

impl From<EventRead> for cri::ContainerEventResponse {
    /// The event with what was read; the sandbox's other fields and the container
    /// statuses empty.
    fn from(e: EventRead) -> Self {
        cri::ContainerEventResponse {
            container_id: e.container_id,
            container_event_type: e.container_event_type,
            created_at: e.created_at,
            pod_sandbox_status: e.pod_sandbox_status.map(|s| cri::PodSandboxStatus {
                id: s.id,
                metadata: s.metadata,
                ..Default::default()
            }),
            containers_statuses: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::wire_testing::{embedded, mangle, shuffled, AgainstProst, Rng};

    /// What this reader must read of an event prost decoded whole: the skipped
    /// fields cleared.
    fn read_of(e: cri::ContainerEventResponse) -> cri::ContainerEventResponse {
        cri::ContainerEventResponse {
            pod_sandbox_status: e.pod_sandbox_status.map(|s| cri::PodSandboxStatus {
                state: 0,
                created_at: 0,
                network: None,
                linux: None,
                labels: Default::default(),
                annotations: Default::default(),
                runtime_handler: String::new(),
                ..s
            }),
            containers_statuses: Vec::new(),
            ..e
        }
    }

    /// Each field of a sandbox status (read or skipped) encoded as a status of its
    /// own: concatenated in any order they are one status.
    fn sandbox_fields(rng: &mut Rng) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut one = |s: cri::PodSandboxStatus| out.push(s.encode_to_vec());
        for _ in 0..rng.below(3) {
            one(cri::PodSandboxStatus {
                id: rng.text(),
                ..Default::default()
            });
        }
        for _ in 0..rng.below(3) {
            one(cri::PodSandboxStatus {
                metadata: Some(cri::PodSandboxMetadata {
                    name: rng.text(),
                    uid: rng.text(),
                    namespace: rng.text(),
                    attempt: rng.varint_value() as u32,
                }),
                ..Default::default()
            });
        }
        // What it skips: the pod's labels and annotations, its network, its state.
        for _ in 0..rng.below(3) {
            one(cri::PodSandboxStatus {
                state: rng.below(3) as i32,
                created_at: rng.varint_value() as i64,
                labels: rng.map(),
                annotations: rng.map(),
                network: Some(cri::PodSandboxNetworkStatus {
                    ip: rng.text(),
                    additional_ips: vec![cri::PodIp { ip: rng.text() }],
                }),
                runtime_handler: rng.text(),
                linux: Some(cri::LinuxPodSandboxStatus {
                    namespaces: Some(cri::Namespace {
                        options: Some(cri::NamespaceOption {
                            network: rng.below(3) as i32,
                            target_id: rng.text(),
                            ..Default::default()
                        }),
                    }),
                }),
                ..Default::default()
            });
        }
        out
    }

    /// An event: its scalars, its sandbox status in one or more field-4 parts (prost
    /// merges them), container statuses with kubelet's labels, and unknown fields,
    /// in any order.
    fn event(rng: &mut Rng) -> Vec<u8> {
        let mut parts: Vec<Vec<u8>> = Vec::new();
        for _ in 0..rng.below(3) {
            parts.push(
                cri::ContainerEventResponse {
                    container_id: rng.text(),
                    container_event_type: rng.below(5) as i32,
                    created_at: rng.varint_value() as i64,
                    ..Default::default()
                }
                .encode_to_vec(),
            );
        }
        let fields = sandbox_fields(rng);
        parts.extend(embedded(rng, 4, fields));
        for _ in 0..rng.below(3) {
            parts.push(
                cri::ContainerEventResponse {
                    containers_statuses: vec![cri::ContainerStatus {
                        id: rng.text(),
                        state: rng.below(4) as i32,
                        labels: rng.map(),
                        annotations: rng.map(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }
                .encode_to_vec(),
            );
        }
        shuffled(rng, parts)
    }

    /// Against prost's decoding of the whole event, on generated events and the same
    /// bytes broken: what prost reads, this reads the same; what prost accepts, this
    /// accepts; what this refuses, prost refuses. Some events prost refuses for a
    /// skipped field are read.
    #[test]
    fn reads_what_prost_reads_and_accepts_all_it_accepts() {
        let mut rng = Rng::seeded(0xbb67_ae85_84ca_a73b);
        let mut against = AgainstProst::default();
        for _ in 0..20_000 {
            let mut bytes = event(&mut rng);
            if rng.chance(60) {
                bytes = mangle(&mut rng, bytes);
            }
            against.check(&bytes, read_of, |r: EventRead| {
                cri::ContainerEventResponse::from(r)
            });
        }
        against.assert_at_least(5_000, 1_000, 100);
    }
}
