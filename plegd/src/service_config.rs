//! The checked configuration the service runs with, made once at start from the
//! settings (after the config file). Single values were already checked when parsed
//! (see `values.rs`); this adds what needs several of them or a runtime's rules, so
//! that past start-up no setting can be invalid.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plegd_actors::{
    hint_source_unavailable, HintSelection, HintSourceName, PlegConfig, ReconnectPolicy,
};
use plegd_runtime::RuntimeVersion;
use plegd_telemetry::traces::Identity;

use crate::config::Settings;
use crate::exit::ConfigError;
use crate::values::{ApiSocket, MetricsAddr, SocketMode, StateDir};

/// The shortest `--relist-period`: shorter, the global relists run back to back and
/// keep the runtime busy.
pub const MIN_RELIST_PERIOD: Duration = Duration::from_millis(10);

/// What the service runs with, whichever the runtime.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// `pleg.hint_sources` is set by [`ServiceConfig::for_runtime`] from this.
    pub pleg: PlegConfig,
    pub hint_selection: HintSelection,
    /// Deadline of each unary CRI call.
    pub runtime_request_timeout: Duration,
    /// The largest CRI response decoded.
    pub runtime_max_message_size: usize,
    /// `--runtime-list-streaming`: the global relist may use the streaming lists.
    pub runtime_list_streaming: bool,
    /// `--events-json`: a path, `-` for stdout, or unset for the command's default.
    pub events_json: Option<PathBuf>,
    /// `None`: no `/metrics` endpoint.
    pub metrics_addr: Option<SocketAddr>,
    pub otlp_endpoint: Option<String>,
    /// `--otlp-events`: the collector the lifecycle events go to as log records.
    pub otlp_events: Option<String>,
    /// Who this plegd is, on exported telemetry.
    pub identity: Identity,
    /// `--api-socket`: unset for the command's default.
    pub api_socket: Option<ApiSocket>,
    pub api_socket_group: Option<String>,
    /// `--api-control-socket`: unset for beside the API socket.
    pub api_control_socket: Option<ApiSocket>,
    pub api_control_socket_mode: SocketMode,
    pub api_control_socket_group: Option<String>,
    /// `--watch-queue`: each Watch stream's queue.
    pub watch_queue: usize,
    /// `--state-dir`: unset for the command's default.
    pub state_dir: Option<StateDir>,
}

/// The host name, as the kernel has it.
fn host_name() -> Result<String, ConfigError> {
    let read = std::fs::read_to_string("/proc/sys/kernel/hostname").map_err(|e| {
        ConfigError::NodeName {
            reason: e.to_string(),
        }
    })?;
    let name = read.trim();
    if name.is_empty() {
        return Err(ConfigError::NodeName {
            reason: "it is empty".into(),
        });
    }
    Ok(name.to_string())
}

impl ServiceConfig {
    /// This configuration for the runtime plegd found at start: the hint sources
    /// `--hint-sources` selects (or detects) on it.
    pub fn for_runtime(&self, runtime: &RuntimeVersion) -> ServiceConfig {
        let mut config = self.clone();
        let nri_socket = std::fs::metadata(&self.pleg.nri_socket)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
        config.pleg.hint_sources = self.hint_selection.resolve(runtime, nri_socket);
        config
    }
}

/// Whether two socket paths name one place: the same file name in the same directory,
/// the directories compared as the file system resolves them (`..`, symbolic links)
/// when they exist.
fn same_place(a: &Path, b: &Path) -> bool {
    let resolved = |p: &Path| {
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty())?;
        Some(std::fs::canonicalize(dir).ok()?.join(p.file_name()?))
    };
    match (resolved(a), resolved(b)) {
        (Some(a), Some(b)) => a == b,
        _ => a.components().eq(b.components()),
    }
}

impl Settings {
    /// `--hint-sources` and its old spelling `--evented=false`, checked: a source
    /// this build lacks, or cri-events with `--evented=false`, is refused.
    fn hint_selection(&self) -> Result<HintSelection, ConfigError> {
        let Some(list) = &self.hint_sources else {
            return Ok(HintSelection::Detect {
                cri_events: self.evented,
            });
        };
        let refuse = |name: HintSourceName, reason: String| ConfigError::HintSource {
            source_name: name.as_str(),
            reason,
        };
        for &name in &list.0 {
            if let Some(why) = hint_source_unavailable(name) {
                return Err(refuse(name, why.to_string()));
            }
        }
        if !self.evented && list.0.contains(&HintSourceName::CriEvents) {
            return Err(refuse(
                HintSourceName::CriEvents,
                "--evented=false says no CRI event stream".into(),
            ));
        }
        Ok(HintSelection::Only(list.0.clone()))
    }

    /// The runtime endpoint `plegd run` needs: given, and a `unix:///` socket path.
    pub fn checked_runtime_endpoint(&self) -> Result<String, ConfigError> {
        let endpoint = self
            .runtime_endpoint
            .clone()
            .ok_or(ConfigError::NoRuntimeEndpoint)?;
        plegd_runtime::parse_unix_endpoint(&endpoint).map_err(ConfigError::RuntimeEndpoint)?;
        Ok(endpoint)
    }

    /// Where `--otlp-events` sends (its own endpoint, else the traces'), if on.
    fn otlp_events_endpoint(&self) -> Result<Option<String>, ConfigError> {
        match (
            self.otlp_events,
            &self.otlp_events_endpoint,
            &self.otlp_endpoint,
        ) {
            (false, None, _) => Ok(None),
            (false, Some(_), _) => Err(ConfigError::OtlpEventsEndpointUnused),
            (true, Some(e), _) | (true, None, Some(e)) => Ok(Some(e.0.clone())),
            (true, None, None) => Err(ConfigError::NoOtlpEventsEndpoint),
        }
    }

    /// Values that are fine alone but not as given: a relist period that would keep
    /// the runtime busy, a health threshold /healthz cannot meet, a blank node name (a
    /// flag refuses an empty one; the file and the environment did not), the control
    /// socket on the API socket's path.
    fn check_together(&self) -> Result<(), ConfigError> {
        let period = self.relist_period.0;
        if period < MIN_RELIST_PERIOD {
            return Err(ConfigError::RelistPeriod {
                period: self.relist_period.to_string(),
                min: MIN_RELIST_PERIOD,
            });
        }
        if self.health_threshold.0 < period.saturating_mul(2) {
            return Err(ConfigError::HealthThreshold {
                threshold: self.health_threshold.to_string(),
                period: self.relist_period.to_string(),
            });
        }
        if let Some(name) = &self.node_name {
            if name.is_empty() || name.trim() != name || name.chars().any(char::is_control) {
                return Err(ConfigError::NodeNameBlank { name: name.clone() });
            }
        }
        if let (Some(ApiSocket::Path(api)), Some(ApiSocket::Path(control))) =
            (&self.api_socket, &self.api_control_socket)
        {
            if same_place(api, control) {
                return Err(ConfigError::SameSockets {
                    path: control.clone(),
                });
            }
        }
        Ok(())
    }

    /// Everything but the runtime endpoint, checked.
    pub fn service_config(&self) -> Result<ServiceConfig, ConfigError> {
        let reconnect = ReconnectPolicy::new(
            self.reconnect_base.0,
            self.reconnect_cap.0,
            self.reconnect_healthy_reset.0,
        )
        .map_err(ConfigError::Reconnect)?;
        let hint_selection = self.hint_selection()?;
        self.check_together()?;
        if !self.nri_socket.is_absolute() {
            return Err(ConfigError::NriSocket {
                path: self.nri_socket.clone(),
            });
        }
        Ok(ServiceConfig {
            hint_selection,
            pleg: PlegConfig {
                relist_period: self.relist_period.0,
                health_threshold: self.health_threshold.0,
                queue_capacity: self.queue_capacity.get(),
                status_concurrency: self.status_concurrency.get(),
                reconnect,
                history_events: self.history_events.get(),
                tombstone_ttl: self.tombstone_ttl.0,
                nri_socket: self.nri_socket.clone(),
                api_relist_budget: self.api_relist_budget.get(),
                max_sync_hold: self.max_sync_hold.0,
                ..PlegConfig::default()
            },
            runtime_request_timeout: self.runtime_request_timeout.0,
            runtime_max_message_size: self.runtime_max_message_size.0,
            runtime_list_streaming: self.runtime_list_streaming,
            events_json: self.events_json.clone(),
            metrics_addr: match self.metrics_addr {
                MetricsAddr::Off => None,
                MetricsAddr::On(addr) => Some(addr),
            },
            otlp_endpoint: self.otlp_endpoint.as_ref().map(|e| e.0.clone()),
            otlp_events: self.otlp_events_endpoint()?,
            api_socket: self.api_socket.clone(),
            api_socket_group: self.api_socket_group.clone(),
            api_control_socket: self.api_control_socket.clone(),
            api_control_socket_mode: self.api_control_socket_mode,
            api_control_socket_group: self.api_control_socket_group.clone(),
            watch_queue: self.watch_queue.get(),
            state_dir: self.state_dir.clone(),
            identity: {
                let host_name = host_name();
                let node_name = match (&self.node_name, &host_name) {
                    (Some(n), _) => n.clone(),
                    (None, Ok(h)) => h.clone(),
                    (None, Err(e)) => {
                        return Err(ConfigError::NodeName {
                            reason: e.to_string(),
                        })
                    }
                };
                Identity {
                    node_name,
                    host_name: host_name.unwrap_or_default(),
                    service_version: env!("CARGO_PKG_VERSION").to_string(),
                }
            },
        })
    }
}
