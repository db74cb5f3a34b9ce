//! Watch's filters, checked once when the stream opens and applied in plegd (a client
//! never receives what it did not ask for): pod UIDs, namespaces, event types and the
//! label selector on the pod's labels. An empty filter lets everything through.

use std::collections::{BTreeMap, HashSet};

use plegd_actors::EventKind;
use plegd_protocol::v1;
use tonic::Status;

use crate::convert::event_kind;
use crate::selector::LabelSelector;

/// At most this many pod UIDs, and as many namespaces, in one request.
pub const MAX_FILTER_VALUES: usize = 1000;
/// The longest pod UID or namespace accepted.
pub const MAX_NAME_BYTES: usize = 256;

#[derive(Clone, Debug, Default)]
pub struct WatchFilter {
    uids: HashSet<String>,
    namespaces: HashSet<String>,
    types: Vec<EventKind>,
    selector: LabelSelector,
}

/// Checks a pod UID given in a request.
pub fn check_uid(what: &str, uid: &str) -> Result<(), Status> {
    if uid.is_empty() {
        return Err(Status::invalid_argument(format!("{what}: empty pod UID")));
    }
    if uid.len() > MAX_NAME_BYTES {
        return Err(Status::invalid_argument(format!(
            "{what}: a pod UID longer than {MAX_NAME_BYTES} bytes"
        )));
    }
    Ok(())
}

fn names(field: &str, values: &[String]) -> Result<HashSet<String>, Status> {
    if values.len() > MAX_FILTER_VALUES {
        return Err(Status::invalid_argument(format!(
            "{field}: more than {MAX_FILTER_VALUES} values"
        )));
    }
    for v in values {
        if v.is_empty() || v.len() > MAX_NAME_BYTES {
            return Err(Status::invalid_argument(format!(
                "{field}: each value must have 1 to {MAX_NAME_BYTES} bytes"
            )));
        }
    }
    Ok(values.iter().cloned().collect())
}

impl WatchFilter {
    /// The filters of a WatchRequest, or InvalidArgument saying which is wrong.
    pub fn from_request(req: &v1::WatchRequest) -> Result<Self, Status> {
        let mut types = Vec::new();
        for t in &req.types {
            let kind = v1::EventType::try_from(*t)
                .ok()
                .and_then(event_kind)
                .ok_or_else(|| {
                    Status::invalid_argument(format!("types: unknown event type {t}"))
                })?;
            types.push(kind);
        }
        let selector = LabelSelector::parse(&req.label_selector)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(WatchFilter {
            uids: names("pod_uids", &req.pod_uids)?,
            namespaces: names("namespaces", &req.namespaces)?,
            types,
            selector,
        })
    }

    pub fn wants_type(&self, kind: EventKind) -> bool {
        self.types.is_empty() || self.types.contains(&kind)
    }

    /// Whether the pod is selected; `labels` is asked only when the selector needs it.
    pub fn wants_pod(
        &self,
        uid: &str,
        namespace: &str,
        labels: impl FnOnce() -> BTreeMap<String, String>,
    ) -> bool {
        (self.uids.is_empty() || self.uids.contains(uid))
            && (self.namespaces.is_empty() || self.namespaces.contains(namespace))
            && (self.selector.is_empty() || self.selector.matches(&labels()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> v1::WatchRequest {
        v1::WatchRequest::default()
    }

    #[test]
    fn each_filter_narrows_and_empty_lets_everything_through() {
        let all = WatchFilter::from_request(&req()).unwrap();
        assert!(all.wants_type(EventKind::PodSync));
        assert!(all.wants_pod("u", "ns", || panic!("labels not needed")));
        let f = WatchFilter::from_request(&v1::WatchRequest {
            pod_uids: vec!["u1".into(), "u2".into()],
            namespaces: vec!["ns".into()],
            types: vec![v1::EventType::ContainerDied.into()],
            label_selector: "app=web".into(),
            ..req()
        })
        .unwrap();
        let web = || BTreeMap::from([("app".to_string(), "web".to_string())]);
        assert!(f.wants_pod("u1", "ns", web));
        assert!(!f.wants_pod("u3", "ns", web));
        assert!(!f.wants_pod("u1", "other", web));
        assert!(!f.wants_pod("u1", "ns", BTreeMap::new));
        assert!(f.wants_type(EventKind::ContainerDied));
        assert!(!f.wants_type(EventKind::ContainerStarted));
    }

    #[test]
    fn bad_filters_are_invalid_arguments_naming_the_field() {
        for (r, says) in [
            (
                v1::WatchRequest {
                    types: vec![0],
                    ..req()
                },
                "unknown event type 0",
            ),
            (
                v1::WatchRequest {
                    types: vec![42],
                    ..req()
                },
                "unknown event type 42",
            ),
            (
                v1::WatchRequest {
                    label_selector: "app".into(),
                    ..req()
                },
                "label selector term \"app\"",
            ),
            (
                v1::WatchRequest {
                    pod_uids: vec![String::new()],
                    ..req()
                },
                "pod_uids",
            ),
            (
                v1::WatchRequest {
                    namespaces: vec!["n".into(); MAX_FILTER_VALUES + 1],
                    ..req()
                },
                "namespaces: more than",
            ),
        ] {
            let err = WatchFilter::from_request(&r).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(err.message().contains(says), "{}", err.message());
        }
    }
}
