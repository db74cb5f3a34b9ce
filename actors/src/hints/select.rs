//! Which hint sources run (`--hint-sources`), decided once at start from the
//! selection and the runtime, and the one place each source's watcher is built.

use std::path::Path;
use std::sync::Arc;

use actix::prelude::*;
use plegd_runtime::{RuntimeClient, RuntimeVersion};
use plegd_telemetry::{HintSourceName, Metrics};

use crate::health::Health;
use crate::hints::containerd_events::ContainerdEvents;
use crate::hints::cri_events::CriEvents;
use crate::hints::nri::Nri;
use crate::hints::watcher::{GetState, HintWatcher, WatcherDeps, WatcherState};
use crate::stop::Stop;

/// `--hint-sources` as given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HintSelection {
    /// Every source the runtime supports, detected at start; `cri_events` false is
    /// the old `--evented=false`.
    Detect { cri_events: bool },
    /// Exactly these (none: polling only, still correct).
    Only(Vec<HintSourceName>),
}

impl Default for HintSelection {
    fn default() -> Self {
        HintSelection::Detect { cri_events: true }
    }
}

/// Why a source cannot be selected in this build.
pub fn unavailable(source: HintSourceName) -> Option<&'static str> {
    match source {
        HintSourceName::CriEvents | HintSourceName::ContainerdEvents | HintSourceName::Nri => None,
    }
}

impl HintSelection {
    /// The sources to run against this runtime. Detection: the CRI event stream on
    /// every runtime (one that lacks it shows `unsupported` and is retried),
    /// containerd's event service on containerd, and the NRI plugin on the runtimes
    /// that have NRI (containerd, CRI-O) or when the NRI socket exists at start
    /// (`nri_socket`); a runtime with NRI off shows it `unsupported`, and its socket is
    /// looked for again while plegd runs, so NRI enabled later is used.
    pub fn resolve(&self, runtime: &RuntimeVersion, nri_socket: bool) -> Vec<HintSourceName> {
        match self {
            HintSelection::Only(list) => list.clone(),
            HintSelection::Detect { cri_events } => {
                let containerd = runtime.runtime_name == "containerd";
                let has_nri = containerd || runtime.runtime_name == "cri-o" || nri_socket;
                HintSourceName::ALL
                    .iter()
                    .copied()
                    .filter(|&s| unavailable(s).is_none())
                    .filter(|&s| match s {
                        HintSourceName::CriEvents => *cri_events,
                        HintSourceName::ContainerdEvents => containerd,
                        HintSourceName::Nri => has_nri,
                    })
                    .collect()
            }
        }
    }
}

/// A running source's watcher, whatever its type.
#[derive(Clone)]
pub(crate) struct RunningSource {
    pub name: HintSourceName,
    pub stop: Recipient<Stop>,
    pub state: Recipient<GetState>,
}

impl RunningSource {
    fn start<S: crate::hints::HintSource>(source: S, deps: WatcherDeps) -> Self {
        let name = source.name();
        let addr = HintWatcher::new(source, deps).start();
        RunningSource {
            name,
            stop: addr.clone().recipient(),
            state: addr.recipient(),
        }
    }

    pub async fn get_state(&self) -> Option<WatcherState> {
        self.state.send(GetState).await.ok()
    }
}

/// Starts the watcher of `name`.
pub(crate) fn start_source(
    name: HintSourceName,
    runtime: &Arc<dyn RuntimeClient>,
    nri_socket: &Path,
    metrics: &Arc<Metrics>,
    health: &Health,
    deps: WatcherDeps,
) -> RunningSource {
    match name {
        HintSourceName::CriEvents => {
            let (stops, coverage) = (deps.cri_stops.clone(), deps.coverage.clone());
            RunningSource::start(
                CriEvents::new(runtime.clone(), metrics.clone(), stops, coverage),
                deps,
            )
        }
        HintSourceName::Nri => RunningSource::start(
            Nri::new(
                plegd_nri::PluginConfig::new(nri_socket),
                metrics.clone(),
                (
                    deps.cri_stops.clone(),
                    deps.rechecks.clone(),
                    deps.coverage.clone(),
                ),
                health.clone(),
            ),
            deps,
        ),
        HintSourceName::ContainerdEvents => {
            let (stops, rechecks) = (deps.cri_stops.clone(), deps.rechecks.clone());
            let source =
                ContainerdEvents::new(runtime.clone(), stops, rechecks, deps.coverage.clone());
            RunningSource::start(source, deps)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(name: &str, version: &str) -> RuntimeVersion {
        RuntimeVersion {
            runtime_name: name.into(),
            runtime_version: version.into(),
            runtime_api_version: "v1".into(),
        }
    }

    #[test]
    fn detection_picks_what_the_runtime_supports_and_a_list_is_taken_as_is() {
        use HintSourceName::*;
        let containerd = runtime("containerd", "1.7.24~ds1");
        let crio = runtime("cri-o", "1.31.0");
        let other = runtime("plegd-sim", "0.1.0");
        let detect = HintSelection::default();
        // NRI on the runtimes that have it, socket or not yet (it is looked for while
        // plegd runs); elsewhere when its socket is there. containerd's event service
        // only on containerd.
        assert_eq!(
            detect.resolve(&containerd, false),
            [CriEvents, Nri, ContainerdEvents]
        );
        assert_eq!(detect.resolve(&crio, false), [CriEvents, Nri]);
        assert_eq!(detect.resolve(&other, false), [CriEvents]);
        assert_eq!(detect.resolve(&other, true), [CriEvents, Nri]);
        // --evented=false: the same, without the CRI stream.
        let no_cri = HintSelection::Detect { cri_events: false };
        assert_eq!(no_cri.resolve(&containerd, false), [Nri, ContainerdEvents]);
        assert_eq!(no_cri.resolve(&other, false), []);
        assert_eq!(no_cri.resolve(&crio, false), [Nri]);
        // A list is exactly that, whatever the runtime; an empty one is polling only.
        let only = HintSelection::Only(vec![ContainerdEvents]);
        assert_eq!(only.resolve(&crio, true), [ContainerdEvents]);
        assert_eq!(HintSelection::Only(vec![]).resolve(&containerd, true), []);
        assert_eq!(HintSelection::Only(vec![Nri]).resolve(&other, false), [Nri]);
    }

    #[test]
    fn every_source_is_part_of_this_build() {
        for &source in HintSourceName::ALL {
            assert_eq!(unavailable(source), None, "{source}");
        }
    }
}
