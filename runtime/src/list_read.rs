//! A targeted relist's two lists (ListPodSandbox and ListContainers, filtered to one
//! pod) as plegd reads them: decoded by prost into messages that declare only the
//! fields plegd keeps of an entry, with CRI's field numbers and types. A sandbox's
//! annotations and runtime handler, a container's image (spec, ref and ID), labels and
//! annotations are skipped by their length instead of being decoded into maps and strings that every
//! targeted relist would throw away. (The global relist reads the whole node's lists
//! in place instead: `list_wire`.)
//!
//! The same contract as `status_read`: what it reads, it reads exactly as prost's
//! decoding of the whole response does, and it accepts every response prost accepts,
//! and also one whose skipped fields prost would refuse (an annotation that is not
//! UTF-8). The tests check both against prost.

use std::collections::HashMap;

use crate::cri;

/// `cri::ListPodSandboxResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxesRead {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<SandboxEntryRead>,
}

/// `cri::PodSandbox`, the fields plegd keeps.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxEntryRead {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<cri::PodSandboxMetadata>,
    #[prost(enumeration = "cri::PodSandboxState", tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    #[prost(map = "string, string", tag = "5")]
    pub labels: HashMap<String, String>,
}

/// `cri::ListContainersResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainersRead {
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<ContainerEntryRead>,
}

/// `cri::Container`, the fields plegd keeps.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerEntryRead {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<cri::ContainerMetadata>,
    #[prost(enumeration = "cri::ContainerState", tag = "6")]
    pub state: i32,
    #[prost(int64, tag = "7")]
    pub created_at: i64,
}

impl From<SandboxEntryRead> for cri::PodSandbox {
    /// The entry with what was read; its other fields empty.
    fn from(s: SandboxEntryRead) -> Self {
        cri::PodSandbox {
            id: s.id,
            metadata: s.metadata,
            state: s.state,
            created_at: s.created_at,
            labels: s.labels,
            ..Default::default()
        }
    }
}

impl From<ContainerEntryRead> for cri::Container {
    /// The entry with what was read; its other fields empty.
    fn from(c: ContainerEntryRead) -> Self {
        cri::Container {
            id: c.id,
            pod_sandbox_id: c.pod_sandbox_id,
            metadata: c.metadata,
            state: c.state,
            created_at: c.created_at,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::encoding::{encode_key, encode_varint, WireType};
    use prost::Message as _;

    use super::*;
    use crate::wire_testing::{entry, mangle, unknown_field, AgainstProst, Rng};

    fn signed(rng: &mut Rng) -> i64 {
        match rng.below(3) {
            0 => -(rng.below(1 << 33) as i64),
            _ => rng.varint_value() as i64,
        }
    }

    /// Each field of a sandbox (read or skipped) encoded as a sandbox of its own.
    fn sandbox_fields(rng: &mut Rng) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for _ in 0..rng.below(3) {
            let s = cri::PodSandbox {
                id: rng.text(),
                metadata: rng.chance(70).then(|| cri::PodSandboxMetadata {
                    name: rng.text(),
                    uid: rng.text(),
                    namespace: rng.text(),
                    attempt: rng.varint_value() as u32,
                }),
                ..Default::default()
            };
            out.push(s.encode_to_vec());
        }
        for _ in 0..rng.below(3) {
            let s = cri::PodSandbox {
                state: signed(rng) as i32,
                created_at: signed(rng),
                labels: rng.map(),
                ..Default::default()
            };
            out.push(s.encode_to_vec());
        }
        // What it skips.
        for _ in 0..rng.below(3) {
            let s = cri::PodSandbox {
                annotations: rng.map(),
                runtime_handler: rng.text(),
                ..Default::default()
            };
            out.push(s.encode_to_vec());
        }
        out
    }

    /// Each field of a container (read or skipped) encoded as a container of its own.
    fn container_fields(rng: &mut Rng) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for _ in 0..rng.below(3) {
            let c = cri::Container {
                id: rng.text(),
                pod_sandbox_id: rng.text(),
                metadata: rng.chance(70).then(|| cri::ContainerMetadata {
                    name: rng.text(),
                    attempt: rng.varint_value() as u32,
                }),
                ..Default::default()
            };
            out.push(c.encode_to_vec());
        }
        for _ in 0..rng.below(3) {
            let c = cri::Container {
                state: signed(rng) as i32,
                created_at: signed(rng),
                ..Default::default()
            };
            out.push(c.encode_to_vec());
        }
        // What it skips: the image and kubelet's labels and annotations.
        for _ in 0..rng.below(3) {
            let c = cri::Container {
                image: Some(rng.image_spec()),
                image_ref: rng.text(),
                labels: rng.map(),
                annotations: rng.map(),
                image_id: rng.text(),
                ..Default::default()
            };
            out.push(c.encode_to_vec());
        }
        out
    }

    /// A response of a few entries (field 1), each one's fields shuffled with unknown
    /// fields among them, and unknown fields between the entries.
    fn response(rng: &mut Rng, fields: fn(&mut Rng) -> Vec<Vec<u8>>) -> Vec<u8> {
        let mut parts = Vec::new();
        for _ in 0..rng.below(4) {
            let entry_fields = fields(rng);
            let body = entry(rng, entry_fields);
            let mut out = Vec::new();
            encode_key(1, WireType::LengthDelimited, &mut out);
            encode_varint(body.len() as u64, &mut out);
            out.extend(body);
            parts.push(out);
        }
        for _ in 0..rng.below(2) {
            let at = rng.below(parts.len() as u64 + 1) as usize;
            parts.insert(at, unknown_field(rng, 3));
        }
        parts.concat()
    }

    /// Both lists against prost's decoding of the whole response, on generated
    /// responses and the same bytes broken: what prost reads, this reads the same;
    /// what prost accepts, this accepts; what this refuses, prost refuses. Some
    /// responses prost refuses for a skipped field are read.
    #[test]
    fn reads_what_prost_reads_and_accepts_all_it_accepts() {
        let mut rng = Rng::seeded(0x3c6e_f372_fe94_f82b);
        let mut against = [AgainstProst::default(), AgainstProst::default()];
        for _ in 0..20_000 {
            let sandboxes = rng.chance(50);
            let fields = if sandboxes {
                sandbox_fields
            } else {
                container_fields
            };
            let mut bytes = response(&mut rng, fields);
            if rng.chance(60) {
                bytes = mangle(&mut rng, bytes);
            }
            if sandboxes {
                against[1].check(
                    &bytes,
                    |w: cri::ListPodSandboxResponse| {
                        w.items
                            .into_iter()
                            .map(|s| cri::PodSandbox {
                                annotations: Default::default(),
                                runtime_handler: String::new(),
                                ..s
                            })
                            .collect()
                    },
                    |r: SandboxesRead| -> Vec<cri::PodSandbox> {
                        r.items.into_iter().map(cri::PodSandbox::from).collect()
                    },
                )
            } else {
                against[0].check(
                    &bytes,
                    |w: cri::ListContainersResponse| {
                        w.containers
                            .into_iter()
                            .map(|c| cri::Container {
                                image: None,
                                image_ref: String::new(),
                                labels: Default::default(),
                                annotations: Default::default(),
                                image_id: String::new(),
                                ..c
                            })
                            .collect()
                    },
                    |r: ContainersRead| -> Vec<cri::Container> {
                        r.containers.into_iter().map(cri::Container::from).collect()
                    },
                )
            }
        }
        for against in &against {
            against.assert_at_least(2_500, 500, 50);
        }
    }
}
