//! Pod lifecycle events: what plegd publishes.

use std::fmt;
use std::time::SystemTime;

use plegd_runtime::PodRef;

/// Kubelet's PodLifecycleEventType, minus the ones Generic PLEG never publishes
/// (ContainerChanged is computed but filtered, as in kubelet).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    /// A pod whose earlier status read failed was re-read successfully with no change.
    PodSync,
    /// Computed (→ created/unknown) but never published.
    ContainerChanged,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::ContainerStarted => "ContainerStarted",
            EventKind::ContainerDied => "ContainerDied",
            EventKind::ContainerRemoved => "ContainerRemoved",
            EventKind::PodSync => "PodSync",
            EventKind::ContainerChanged => "ContainerChanged",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which relist detected a change: the KEP's `relist_source`, one value set shared
/// with the metric label.
pub use plegd_telemetry::RelistSource;

/// One lifecycle event of one pod.
///
/// Everything but `revision` comes from the relist that found the change — from its
/// authoritative status read, never from an event payload. A detail the runtime did
/// not report is `None`, never invented.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifecycleEvent {
    /// Node-wide, strictly increasing per plegd instance; given by the dispatcher
    /// just before the relist's cache update (0 until then; see `revision`).
    pub revision: u64,
    /// When the relist that found the change had read the pod's status, or, if later,
    /// the time of the pod's previous event (a death read beside that read).
    pub time: SystemTime,
    pub pod: PodRef,
    pub kind: EventKind,
    /// The container or sandbox the event is about (empty for PodSync).
    pub container_id: String,
    pub relist_source: RelistSource,
    /// The container's name (empty for a sandbox and for PodSync).
    pub container_name: String,
    /// True when `container_id` is the pod's sandbox.
    pub sandbox: bool,
    /// CRI metadata.attempt of the container or sandbox.
    pub attempt: Option<u32>,
    pub image: Option<String>,
    /// On ContainerDied, how the container ended.
    pub exit: Option<Exit>,
}

/// How a container ended, as its ContainerStatus says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exit {
    pub code: i32,
    /// e.g. `OOMKilled`, `Error`, `Completed`.
    pub reason: Option<String>,
    pub message: Option<String>,
    pub started_at: Option<SystemTime>,
    pub finished_at: Option<SystemTime>,
}
