//! ContainerStatus as plegd reads it: the response decoded by prost into messages
//! that declare only the fields plegd uses, with CRI's field numbers and types. The
//! rest — labels, annotations, mounts, resources, the user, the image spec's other
//! fields, the response's `info` — is skipped by its length instead of being decoded
//! into strings, maps and vectors that every targeted relist would throw away.
//!
//! What it reads, it reads exactly as prost's decoding of
//! `cri::ContainerStatusResponse` does (the last scalar wins, a repeated embedded
//! message merges). Fields it does not declare are skipped as prost skips unknown
//! fields: wire type and length checked, contents not. So it accepts every response
//! prost accepts, and also one whose skipped fields prost would refuse (a label that is
//! not UTF-8): a runtime's fault in a field plegd never uses does not fail the read.
//! The tests check both against prost.

use crate::{convert, cri, ContainerStatus, RuntimeError};

/// `cri::ContainerStatusResponse`, its status only.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusRead {
    #[prost(message, optional, tag = "1")]
    pub status: Option<StatusRead>,
}

/// `cri::ContainerStatus`, the fields plegd uses.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusRead {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<cri::ContainerMetadata>,
    #[prost(enumeration = "cri::ContainerState", tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    #[prost(int64, tag = "5")]
    pub started_at: i64,
    #[prost(int64, tag = "6")]
    pub finished_at: i64,
    #[prost(int32, tag = "7")]
    pub exit_code: i32,
    #[prost(message, optional, tag = "8")]
    pub image: Option<ImageRead>,
    #[prost(string, tag = "9")]
    pub image_ref: String,
    #[prost(string, tag = "10")]
    pub reason: String,
    #[prost(string, tag = "11")]
    pub message: String,
}

/// `cri::ImageSpec`, its image only.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageRead {
    #[prost(string, tag = "1")]
    pub image: String,
}

/// A ContainerStatusResponse's bytes as plegd's [`ContainerStatus`] (its sandbox ID
/// left empty: the wire does not carry it).
pub fn container_status(bytes: &[u8], container_id: &str) -> Result<ContainerStatus, RuntimeError> {
    let invalid = |reason: String| RuntimeError::Invalid {
        op: "ContainerStatus",
        reason,
    };
    let read = <ContainerStatusRead as prost::Message>::decode(bytes)
        .map_err(|e| invalid(e.to_string()))?;
    let status = read
        .status
        .ok_or_else(|| invalid(format!("no status for container {container_id}")))?;
    Ok(convert::container_status_from_read(status))
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::wire_testing::{embedded, mangle, shuffled, AgainstProst, Rng};

    /// What this reader must read of a status prost decoded whole.
    fn read_of(s: cri::ContainerStatus) -> StatusRead {
        StatusRead {
            id: s.id,
            metadata: s.metadata,
            state: s.state,
            created_at: s.created_at,
            started_at: s.started_at,
            finished_at: s.finished_at,
            exit_code: s.exit_code,
            image: s.image.map(|i| ImageRead { image: i.image }),
            image_ref: s.image_ref,
            reason: s.reason,
            message: s.message,
        }
    }

    /// Each field of a status (every one CRI defines, read or skipped) encoded as a
    /// status of its own: concatenated in any order they are one status.
    fn status_fields_encoded(rng: &mut Rng) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut one = |s: cri::ContainerStatus| out.push(s.encode_to_vec());
        let signed = |rng: &mut Rng| match rng.below(3) {
            0 => -(rng.below(1 << 33) as i64),
            _ => rng.varint_value() as i64,
        };
        for _ in 0..rng.below(3) {
            one(cri::ContainerStatus {
                id: rng.text(),
                image_ref: rng.text(),
                ..Default::default()
            });
        }
        for _ in 0..rng.below(3) {
            one(cri::ContainerStatus {
                metadata: Some(cri::ContainerMetadata {
                    name: rng.text(),
                    attempt: rng.varint_value() as u32,
                }),
                ..Default::default()
            });
        }
        for _ in 0..rng.below(3) {
            one(cri::ContainerStatus {
                state: signed(rng) as i32,
                created_at: signed(rng),
                started_at: signed(rng),
                finished_at: signed(rng),
                exit_code: signed(rng) as i32,
                ..Default::default()
            });
        }
        for _ in 0..rng.below(3) {
            one(cri::ContainerStatus {
                reason: rng.text(),
                message: rng.text(),
                image: Some(rng.image_spec()),
                ..Default::default()
            });
        }
        // What it skips: kubelet's labels and annotations, mounts, resources, user.
        for _ in 0..rng.below(3) {
            one(cri::ContainerStatus {
                labels: rng.map(),
                annotations: rng.map(),
                log_path: rng.text(),
                image_id: rng.text(),
                ..Default::default()
            });
        }
        for _ in 0..rng.below(3) {
            one(cri::ContainerStatus {
                mounts: (0..rng.below(3))
                    .map(|_| cri::Mount {
                        container_path: rng.text(),
                        host_path: rng.text(),
                        readonly: rng.chance(50),
                        propagation: rng.below(4) as i32,
                        uid_mappings: vec![cri::IdMapping {
                            host_id: rng.varint_value() as u32,
                            container_id: 0,
                            length: 65536,
                        }],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            });
        }
        for _ in 0..rng.below(2) {
            one(cri::ContainerStatus {
                resources: Some(cri::ContainerResources {
                    linux: Some(cri::LinuxContainerResources {
                        cpu_shares: rng.varint_value() as i64,
                        memory_limit_in_bytes: signed(rng),
                        cpuset_cpus: rng.text(),
                        unified: rng.map(),
                        ..Default::default()
                    }),
                    windows: None,
                }),
                user: Some(cri::ContainerUser {
                    linux: Some(cri::LinuxContainerUser {
                        uid: rng.varint_value() as i64,
                        gid: rng.varint_value() as i64,
                        supplemental_groups: vec![rng.varint_value() as i64],
                    }),
                }),
                ..Default::default()
            });
        }
        out
    }

    /// A response: its status in one or more field-1 parts (prost merges them), with
    /// `info` entries and unknown fields between them.
    fn response(rng: &mut Rng) -> Vec<u8> {
        let fields = status_fields_encoded(rng);
        let mut parts = embedded(rng, 1, fields);
        for _ in 0..rng.below(2) {
            parts.push(
                cri::ContainerStatusResponse {
                    status: None,
                    info: rng.map(),
                }
                .encode_to_vec(),
            );
        }
        if rng.chance(30) {
            parts.push(
                cri::ContainerStatusResponse {
                    status: Some(cri::ContainerStatus {
                        exit_code: -1,
                        ..Default::default()
                    }),
                    info: Default::default(),
                }
                .encode_to_vec(),
            );
        }
        shuffled(rng, parts)
    }

    /// Against prost's decoding of the whole response, on generated responses and
    /// the same bytes broken: what prost reads, this reads the same; what prost
    /// accepts, this accepts; what this refuses, prost refuses. Some responses prost
    /// refuses for a skipped field are read.
    #[test]
    fn reads_what_prost_reads_and_accepts_all_it_accepts() {
        let mut rng = Rng::seeded(0x6a09_e667_f3bc_c908);
        let mut against = AgainstProst::default();
        for _ in 0..20_000 {
            let mut bytes = response(&mut rng);
            if rng.chance(60) {
                bytes = mangle(&mut rng, bytes);
            }
            against.check(
                &bytes,
                |w: cri::ContainerStatusResponse| w.status.map(read_of),
                |r: ContainerStatusRead| r.status,
            );
        }
        against.assert_at_least(5_000, 1_000, 100);
    }

    /// A response's bytes become plegd's status: the image's name, else its
    /// reference; the sandbox left to the caller; no status is an error that names
    /// the container.
    #[test]
    fn converts_a_status_and_refuses_none() {
        let whole = cri::ContainerStatusResponse {
            status: Some(cri::ContainerStatus {
                id: "c1".into(),
                metadata: Some(cri::ContainerMetadata {
                    name: "app".into(),
                    attempt: 2,
                }),
                state: cri::ContainerState::ContainerExited as i32,
                finished_at: 7,
                exit_code: -1,
                reason: "Error".into(),
                image_ref: "docker.io/library/busybox@sha256:ab".into(),
                labels: [("io.kubernetes.pod.name".into(), "web".into())].into(),
                ..Default::default()
            }),
            info: Default::default(),
        };
        let st = container_status(&whole.encode_to_vec(), "c1").expect("read");
        assert_eq!(st.id, "c1");
        assert_eq!((st.name.as_str(), st.attempt), ("app", 2));
        assert_eq!(st.state, crate::ContainerState::Exited);
        assert_eq!((st.exit_code, st.finished_at), (-1, 7));
        assert_eq!(st.image, "docker.io/library/busybox@sha256:ab");
        assert_eq!(st.sandbox_id, "");
        let none = cri::ContainerStatusResponse::default().encode_to_vec();
        match container_status(&none, "c9") {
            Err(RuntimeError::Invalid { op, reason }) => {
                assert_eq!(op, "ContainerStatus");
                assert!(reason.contains("c9"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            container_status(&[0x0a, 0x05, 0x0a], "c1"),
            Err(RuntimeError::Invalid { .. })
        ));
    }
}
