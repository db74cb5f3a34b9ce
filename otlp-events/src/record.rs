//! One lifecycle event → one OTLP log record. The attribute names are the
//! OpenTelemetry semantic conventions' where one exists (`k8s.*`, `container.*`,
//! `process.exit.code`), plegd's own under `plegd.*`. Like the JSON output, a detail
//! the runtime did not report is left out, never invented.

use std::time::SystemTime;

use opentelemetry::logs::{LogRecord as _, Logger as _, Severity};
use opentelemetry_sdk::logs::{SdkLogRecord, SdkLogger};
use plegd_actors::{Delivery, EventKind, LifecycleEvent};

/// The record's event name: low cardinality, one per event type.
pub fn event_name(kind: EventKind) -> &'static str {
    match kind {
        EventKind::ContainerStarted => "plegd.container.started",
        EventKind::ContainerDied => "plegd.container.died",
        EventKind::ContainerRemoved => "plegd.container.removed",
        EventKind::PodSync => "plegd.pod.sync",
        // Never published (kubelet filters it too); named all the same.
        EventKind::ContainerChanged => "plegd.container.changed",
    }
}

/// The reason the kernel's OOM killer gives, as CRI reports it.
const OOM_KILLED: &str = "OOMKilled";

/// INFO; WARN for a non-zero exit; ERROR for an OOM kill.
pub fn severity(event: &LifecycleEvent) -> (Severity, &'static str) {
    match &event.exit {
        Some(x) if x.reason.as_deref() == Some(OOM_KILLED) => (Severity::Error, "ERROR"),
        Some(x) if x.code != 0 => (Severity::Warn, "WARN"),
        _ => (Severity::Info, "INFO"),
    }
}

/// An image reference split as the conventions want it: `container.image.name`
/// without tag or digest, and the tag (`container.image.tags`) if one is written.
/// `docker.io/library/busybox:1.36` → (`docker.io/library/busybox`, `1.36`); a port
/// in the registry (`reg:5000/app`) is not a tag.
pub fn image_name_and_tag(image: &str) -> (&str, Option<&str>) {
    let name = image.split_once('@').map_or(image, |(n, _)| n);
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    match name[last_slash..].rfind(':') {
        Some(colon) => {
            let at = last_slash + colon;
            (&name[..at], Some(&name[at + 1..]))
        }
        None => (name, None),
    }
}

/// Makes the records of one plegd: the node and runtime are the same on each.
pub struct RecordMaker {
    pub logger: SdkLogger,
    pub node_name: String,
    pub runtime_name: Option<String>,
    /// plegd's instance (`plegd.instance_id`): with `plegd.revision`, what tells a
    /// record from another across restarts.
    pub instance_id: Option<String>,
}

impl RecordMaker {
    /// The record of `d`, observed (published) at `observed`.
    pub fn make(&self, d: &Delivery, observed: SystemTime) -> SdkLogRecord {
        let e = &d.event;
        let mut r = self.logger.create_log_record();
        r.set_event_name(event_name(e.kind));
        r.set_timestamp(e.time);
        r.set_observed_timestamp(observed);
        let (number, text) = severity(e);
        r.set_severity_number(number);
        r.set_severity_text(text);
        r.set_body(body(e).into());
        r.add_attribute("k8s.pod.uid", e.pod.uid.clone());
        r.add_attribute("k8s.pod.name", e.pod.name.clone());
        r.add_attribute("k8s.namespace.name", e.pod.namespace.clone());
        r.add_attribute("k8s.node.name", self.node_name.clone());
        if !e.container_name.is_empty() {
            r.add_attribute("k8s.container.name", e.container_name.clone());
        }
        if let Some(attempt) = e.attempt {
            r.add_attribute("k8s.container.restart_count", i64::from(attempt));
        }
        if !e.container_id.is_empty() {
            r.add_attribute("container.id", e.container_id.clone());
        }
        if let Some(image) = &e.image {
            let (name, tag) = image_name_and_tag(image);
            r.add_attribute("container.image.name", name.to_string());
            if let Some(tag) = tag {
                r.add_attribute(
                    "container.image.tags",
                    opentelemetry::logs::AnyValue::ListAny(Box::new(vec![tag.to_string().into()])),
                );
            }
        }
        if let Some(runtime) = &self.runtime_name {
            r.add_attribute("container.runtime.name", runtime.clone());
        }
        if let Some(x) = &e.exit {
            r.add_attribute("process.exit.code", i64::from(x.code));
            if let Some(reason) = &x.reason {
                r.add_attribute(
                    "k8s.container.status.last_terminated_reason",
                    reason.clone(),
                );
            }
        }
        r.add_attribute("plegd.relist_source", e.relist_source.as_str());
        r.add_attribute(
            "plegd.revision",
            i64::try_from(e.revision).unwrap_or(i64::MAX),
        );
        r.add_attribute("plegd.sandbox", e.sandbox);
        if let Some(instance) = &self.instance_id {
            r.add_attribute("plegd.instance_id", instance.clone());
        }
        r
    }
}

/// A short readable line, for whoever reads the collector's debug output.
fn body(e: &LifecycleEvent) -> String {
    let what = match (e.sandbox, e.container_name.as_str()) {
        (true, _) => " sandbox".to_string(),
        (false, "") => String::new(),
        (false, name) => format!(" container {name}"),
    };
    let exit = e
        .exit
        .as_ref()
        .map(|x| match &x.reason {
            Some(r) => format!(" exit {} ({r})", x.code),
            None => format!(" exit {}", x.code),
        })
        .unwrap_or_default();
    format!(
        "{} {}/{}{what}{exit}",
        e.kind.as_str(),
        e.pod.namespace,
        e.pod.name
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    use opentelemetry::logs::{AnyValue, LoggerProvider as _};
    use opentelemetry_sdk::logs::SdkLoggerProvider;
    use plegd_actors::{Exit, RelistSource};
    use plegd_runtime::PodRef;

    use super::*;

    fn died(code: i32, reason: Option<&str>) -> LifecycleEvent {
        LifecycleEvent {
            revision: 42,
            time: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            pod: PodRef {
                uid: "u1".into(),
                name: "web".into(),
                namespace: "ns".into(),
            },
            kind: EventKind::ContainerDied,
            container_id: "c1".into(),
            relist_source: RelistSource::EventedPleg,
            container_name: "app".into(),
            sandbox: false,
            attempt: Some(3),
            image: Some("reg:5000/team/app:1.2@sha256:ab".into()),
            exit: Some(Exit {
                code,
                reason: reason.map(str::to_string),
                ..Exit::default()
            }),
        }
    }

    #[test]
    fn severity_follows_the_exit() {
        assert_eq!(severity(&died(0, Some("Completed"))).1, "INFO");
        assert_eq!(severity(&died(1, Some("Error"))).1, "WARN");
        assert_eq!(severity(&died(137, Some("OOMKilled"))).1, "ERROR");
        let mut started = died(0, None);
        started.exit = None;
        assert_eq!(severity(&started).0, Severity::Info);
    }

    #[test]
    fn image_references_split_into_name_and_tag() {
        for (image, name, tag) in [
            (
                "docker.io/library/busybox:1.36",
                "docker.io/library/busybox",
                Some("1.36"),
            ),
            ("busybox", "busybox", None),
            ("reg:5000/app", "reg:5000/app", None),
            ("reg:5000/app:v2", "reg:5000/app", Some("v2")),
            ("app@sha256:abc", "app", None),
            ("app:1@sha256:abc", "app", Some("1")),
        ] {
            assert_eq!(image_name_and_tag(image), (name, tag), "{image}");
        }
    }

    #[test]
    fn a_death_carries_every_attribute() {
        let provider = SdkLoggerProvider::builder().build();
        let maker = RecordMaker {
            instance_id: Some("abc".into()),
            logger: provider.logger("t"),
            node_name: "node-1".into(),
            runtime_name: Some("containerd".into()),
        };
        let observed = UNIX_EPOCH + Duration::from_secs(1_700_000_001);
        let d = Delivery {
            seq: 1,
            missed: 0,
            event: Arc::new(died(137, Some("OOMKilled"))),
        };
        let r = maker.make(&d, observed);
        assert_eq!(r.event_name(), Some("plegd.container.died"));
        assert_eq!(r.timestamp(), Some(d.event.time));
        assert_eq!(r.observed_timestamp(), Some(observed));
        assert_eq!(r.severity_number(), Some(Severity::Error));
        let attrs: HashMap<String, AnyValue> = r
            .attributes_iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let s = |v: &str| AnyValue::String(v.to_string().into());
        for (k, v) in [
            ("k8s.pod.uid", s("u1")),
            ("k8s.pod.name", s("web")),
            ("k8s.namespace.name", s("ns")),
            ("k8s.node.name", s("node-1")),
            ("k8s.container.name", s("app")),
            ("k8s.container.restart_count", AnyValue::Int(3)),
            ("container.id", s("c1")),
            ("container.image.name", s("reg:5000/team/app")),
            ("container.runtime.name", s("containerd")),
            ("process.exit.code", AnyValue::Int(137)),
            (
                "k8s.container.status.last_terminated_reason",
                s("OOMKilled"),
            ),
            ("plegd.relist_source", s("evented_pleg")),
            ("plegd.revision", AnyValue::Int(42)),
            ("plegd.sandbox", AnyValue::Boolean(false)),
            ("plegd.instance_id", s("abc")),
        ] {
            assert_eq!(attrs.get(k), Some(&v), "{k}");
        }
        assert_eq!(
            attrs.get("container.image.tags"),
            Some(&AnyValue::ListAny(Box::new(vec![s("1.2")])))
        );
    }
}
