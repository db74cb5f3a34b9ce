//! The settings: one struct, read by clap (flags, environment, defaults) and by serde
//! (the `--config` TOML file, and `--print-config`). Each key, its default and its
//! limit (through its value's type, see `values.rs`) are written once, here.
//!
//! Precedence: flags > environment > file > defaults. Clap does the first two and the
//! defaults; the file then fills in what clap took from its defaults.

use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory as _};
use serde::{Deserialize, Serialize};

use crate::exit::{ConfigError, MAX_CONFIG_FILE};
use crate::values::{
    true_or_false, ApiSocket, Count, HintSources, LogFormat, MessageSize, MetricsAddr,
    OtlpEndpoint, PositiveDuration, SocketMode, StateDir, TrimPeriod, DAY, HOUR,
};

/// Every setting of `plegd run` and `plegd demo`. A config file key is the long flag
/// name (`relist-period`).
#[derive(Args, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Settings {
    /// The CRI runtime's socket, as unix:///path/to/socket (required: here, in the
    /// environment or in the config file).
    #[arg(long, env = "PLEGD_RUNTIME_ENDPOINT", value_name = "ENDPOINT")]
    pub runtime_endpoint: Option<String>,
    /// Period of the global relist, which runs whatever the event stream does (10ms to
    /// 1h).
    #[arg(long, env = "PLEGD_RELIST_PERIOD", default_value = "1s")]
    pub relist_period: PositiveDuration<HOUR>,
    /// /healthz fails when the last successful global relist is older than this (at
    /// least twice --relist-period, at most 1d).
    #[arg(long, env = "PLEGD_HEALTH_THRESHOLD", default_value = "3m")]
    pub health_threshold: PositiveDuration<DAY>,
    /// Deadline of each unary CRI call (at most 10m).
    #[arg(long, env = "PLEGD_RUNTIME_REQUEST_TIMEOUT", default_value = "2s")]
    pub runtime_request_timeout: PositiveDuration<{ 10 * 60 }>,
    /// The largest CRI response (or event) plegd decodes, for every call; kubelet's
    /// is 16MiB. A relist whose answer is larger fails, and the log names the call.
    #[arg(long, env = "PLEGD_RUNTIME_MAX_MESSAGE_SIZE", default_value = "16MiB")]
    pub runtime_max_message_size: MessageSize,
    /// Read the global relist's lists with CRI's streaming list calls
    /// (StreamPodSandboxes, StreamContainers; containerd from 2.4) when the runtime
    /// offers them: many messages, so a node past the runtime's own send limit
    /// (containerd's default: 16MiB, 10,000 to 20,000 pods) is still read. A runtime that
    /// answers UNIMPLEMENTED gets the unary lists until plegd restarts (logged once).
    /// false: always the unary lists.
    #[arg(long, env = "PLEGD_RUNTIME_LIST_STREAMING", default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    #[serde(deserialize_with = "true_or_false")]
    pub runtime_list_streaming: bool,
    /// Pods the on-demand (targeted) relist queue holds, one request per pod (a newer
    /// request for a pod merges); a request for one more pod is dropped (counted) and
    /// the next global relist reconciles.
    #[arg(long, env = "PLEGD_QUEUE_CAPACITY", default_value = "1024")]
    pub queue_capacity: Count<1_000_000>,
    /// Status calls (PodSandboxStatus, ContainerStatus) in flight at once during a
    /// relist, over all its pods; also how many pods a batch of targeted relists lists
    /// at once. 32: at 10,000 pods the first relist takes ≈ 0.7 s instead of ≈ 0.9 s
    /// at 8, and a storm of 5,000 stops stays on the event path (docs/architecture.md,
    /// "Performance decisions").
    #[arg(long, env = "PLEGD_STATUS_CONCURRENCY", default_value = "32")]
    pub status_concurrency: Count<256>,
    /// Watch the CRI event stream (GetContainerEvents) to notice container exits in
    /// milliseconds. Only a hint: the global relist stays the source of truth.
    /// false: the old spelling of leaving cri-events out of --hint-sources.
    #[arg(long, env = "PLEGD_EVENTED", default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    #[serde(deserialize_with = "true_or_false")]
    pub evented: bool,
    /// Relist hint sources, comma-separated: cri-events (CRI GetContainerEvents), nri
    /// (the NRI plugin), containerd-events (containerd's own event service: task start,
    /// exit, OOM, delete; coexists with other CRI event consumers on containerd 1.7), or
    /// none (polling only, still correct). Default: every source the runtime
    /// supports, detected at start. Each only asks for targeted relists; an unusable
    /// one is retried with the reconnect backoff below and never stops plegd.
    #[arg(long, env = "PLEGD_HINT_SOURCES", value_name = "SOURCES")]
    pub hint_sources: Option<HintSources>,
    /// The runtime's NRI socket, for the nri hint source (an absolute path). The
    /// source is detected on containerd and CRI-O, or when a socket is there at start;
    /// while missing it is looked for every 2 s. containerd 1.7 enables NRI with
    /// [plugins."io.containerd.nri.v1.nri"] disable = false, 2.x has it on.
    #[arg(long, env = "PLEGD_NRI_SOCKET", value_name = "PATH", default_value = plegd_actors::DEFAULT_NRI_SOCKET)]
    pub nri_socket: PathBuf,
    /// Event stream: delay of the second reconnect attempt (the first is immediate);
    /// later ones grow exponentially, with jitter (at most 1h).
    #[arg(long, env = "PLEGD_RECONNECT_BASE", default_value = "500ms")]
    pub reconnect_base: PositiveDuration<HOUR>,
    /// Event stream: longest delay between reconnect attempts (also the retry period
    /// of a runtime that does not implement the stream; at most 1h).
    #[arg(long, env = "PLEGD_RECONNECT_CAP", default_value = "60s")]
    pub reconnect_cap: PositiveDuration<HOUR>,
    /// Event stream: a connection must stay up this long before the backoff resets (at
    /// most 1d).
    #[arg(long, env = "PLEGD_RECONNECT_HEALTHY_RESET", default_value = "60s")]
    pub reconnect_healthy_reset: PositiveDuration<DAY>,
    /// Write events as JSON lines to PATH ('-' for stdout).
    #[arg(long, env = "PLEGD_EVENTS_JSON", value_name = "PATH|-")]
    pub events_json: Option<PathBuf>,
    /// Serve /metrics, /healthz and /readyz on this address ('off' to disable).
    #[arg(long, env = "PLEGD_METRICS_ADDR", default_value = "127.0.0.1:9464")]
    pub metrics_addr: MetricsAddr,
    /// Export traces over OTLP/gRPC to this endpoint (e.g. http://127.0.0.1:4317).
    /// Unset: no trace export. The other standard OTEL_* variables (OTEL_SERVICE_NAME,
    /// OTEL_TRACES_SAMPLER, OTEL_SDK_DISABLED, ...) are honoured too.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<OtlpEndpoint>,
    /// Export every lifecycle event as an OTLP log record (OpenTelemetry semantic
    /// conventions: plegd.container.started|died|removed, plegd.pod.sync) to
    /// --otlp-events-endpoint, or else to --otlp-endpoint. A collector that is down or
    /// slow costs counted drops (plegd_otlp_events_dropped_total), never a delay.
    #[arg(long, env = "PLEGD_OTLP_EVENTS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_name = "true|false")]
    #[serde(deserialize_with = "true_or_false")]
    pub otlp_events: bool,
    /// Where --otlp-events sends the log records (OTLP/gRPC, e.g.
    /// http://127.0.0.1:4317). Default: --otlp-endpoint.
    #[arg(long, env = "PLEGD_OTLP_EVENTS_ENDPOINT")]
    pub otlp_events_endpoint: Option<OtlpEndpoint>,
    /// This node's name, on every exported span (k8s.node.name). Default: the host
    /// name. The DaemonSet sets it from the pod's spec.nodeName.
    #[arg(long, env = "PLEGD_NODE_NAME", value_name = "NAME", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub node_name: Option<String>,
    /// Log lines on stderr: text (readable; colour only on a terminal, never with
    /// NO_COLOR) or json (one object per line with timestamp, level, target, message
    /// and fields, for log collectors).
    #[arg(long, env = "PLEGD_LOG_FORMAT", default_value = "text", value_enum)]
    pub log_format: LogFormat,

    // The subscriber API (plegd.v1, README "Subscriber API").
    /// Serve the subscriber API (gRPC, plegd.v1) on this unix socket, mode 0660, its
    /// directory created if missing; 'off' disables it. Default: /run/plegd/plegd.sock
    /// for run, a socket in the demo's temporary directory for demo (logged at start).
    #[arg(long, env = "PLEGD_API_SOCKET", value_name = "PATH|off")]
    pub api_socket: Option<ApiSocket>,
    /// The group of the API socket (a name or a numeric id); members of the group may
    /// connect. Default: plegd's own group.
    #[arg(long, env = "PLEGD_API_SOCKET_GROUP", value_name = "GROUP", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub api_socket_group: Option<String>,
    /// Serve Sync and RequestRelist (the calls that change what other consumers see)
    /// on this second unix socket, with the read calls too; the API socket refuses
    /// them (PERMISSION_DENIED). Its mode and group decide who may call them. 'off'
    /// disables it; served only with the API socket. Default: plegd-control.sock
    /// beside the API socket.
    #[arg(long, env = "PLEGD_API_CONTROL_SOCKET", value_name = "PATH|off")]
    pub api_control_socket: Option<ApiSocket>,
    /// The control socket's mode, in octal (never writable by others).
    #[arg(
        long,
        env = "PLEGD_API_CONTROL_SOCKET_MODE",
        value_name = "MODE",
        default_value = "0660"
    )]
    pub api_control_socket_mode: SocketMode,
    /// The group of the control socket (a name or a numeric id); with mode 0660, its
    /// members may hold pods and ask for relists. Default: plegd's own group.
    #[arg(long, env = "PLEGD_API_CONTROL_SOCKET_GROUP", value_name = "GROUP", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub api_control_socket_group: Option<String>,
    /// The longest a Sync may hold a pod without a renew (SyncRequest.renew); then
    /// plegd ends the hold as cancelled (SyncReleased reason EXPIRED), logs and counts
    /// it. At most 1d.
    #[arg(long, env = "PLEGD_MAX_SYNC_HOLD", default_value = "5m")]
    pub max_sync_hold: PositiveDuration<DAY>,
    /// Pods that may wait for a targeted relist asked for by API clients
    /// (RequestRelist), apart from the runtime's hints (--queue-capacity): beyond it
    /// a request is answered DROPPED and the next global relist covers the pod.
    #[arg(long, env = "PLEGD_API_RELIST_BUDGET", default_value = "256")]
    pub api_relist_budget: Count<1_000_000>,
    /// Where plegd keeps what it needs to go on where it stopped after a restart (its
    /// identity, revisions, pod records, tombstones and event history), so that a
    /// client resuming with since_revision gets what it missed and the changes made
    /// while plegd was down; 'off' starts anew each time (clients re-list). One plegd
    /// per directory. Default: /var/lib/plegd for run, the demo's temporary directory
    /// for demo. README "Restarts and upgrades".
    #[arg(long, env = "PLEGD_STATE_DIR", value_name = "DIR|off")]
    pub state_dir: Option<StateDir>,
    /// Events kept in memory for Watch's since_revision (a client resuming from an
    /// older revision must list again; at most 16777216).
    #[arg(long, env = "PLEGD_HISTORY_EVENTS", default_value = "65536")]
    pub history_events: Count<16_777_216>,
    /// Events queued for each Watch stream whose client does not keep up (at most
    /// 1048576); beyond it the stream drops events and tells them as a Gap, which the
    /// client replays with since_revision while --history-events still holds them.
    #[arg(long, env = "PLEGD_WATCH_QUEUE", default_value = "1024")]
    pub watch_queue: Count<1_048_576>,
    /// How long GetPodStatus still answers for a pod that went away, with its last
    /// status (at most 1d).
    #[arg(long, env = "PLEGD_TOMBSTONE_TTL", default_value = "5m")]
    pub tombstone_ttl: PositiveDuration<DAY>,
    /// How often at least plegd gives the memory it freed back to the kernel (glibc's
    /// malloc_trim, ≈ 0.2–0.4 ms at 10,000 pods); it also does after every global
    /// relist. off: never. Without it, what short-lived pods freed stays in plegd's RSS
    /// (docs/architecture.md, "Performance decisions"). At most 1h.
    #[arg(
        long,
        env = "PLEGD_MEMORY_TRIM_PERIOD",
        default_value = "10s",
        value_name = "DURATION|off"
    )]
    pub memory_trim_period: TrimPeriod,
}

/// `--config` and `--print-config`: how to read and show the settings, not settings.
#[derive(Args, Clone, Debug)]
pub struct ConfigArgs {
    /// A TOML file with any of the settings above (lower precedence than flags and
    /// environment).
    #[arg(long, env = "PLEGD_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration (TOML) and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// A stand-alone command holding only the settings, for asking clap about them.
#[derive(clap::Parser)]
struct SettingsOnly {
    #[command(flatten)]
    settings: Settings,
}

impl Settings {
    /// The keys a config file may hold: the settings' long flag names.
    pub fn keys() -> Vec<String> {
        SettingsOnly::command()
            .get_arguments()
            .filter_map(|a| a.get_long())
            .map(str::to_string)
            .collect()
    }

    /// Reads the `--config` file at `path` and applies each of its keys whose
    /// setting clap took from its default (neither a flag nor the environment gave
    /// it). `matches` are those of the subcommand that parsed `self`.
    pub fn overlay_file(&mut self, path: &Path, matches: &ArgMatches) -> Result<(), ConfigError> {
        let text = read_config_file(path)?;
        let file: toml::Table = text.parse().map_err(|error| ConfigError::FileSyntax {
            path: path.to_owned(),
            error: Box::new(error),
        })?;
        let known = Self::keys();
        if let Some(key) = file.keys().find(|k| !known.contains(k)) {
            return Err(ConfigError::UnknownKey {
                path: path.to_owned(),
                key: key.clone(),
                known,
            });
        }
        let mut merged = self.to_table()?;
        for (key, value) in file {
            let source = matches.value_source(&key.replace('-', "_"));
            if !matches!(source, None | Some(ValueSource::DefaultValue)) {
                continue;
            }
            merged.insert(key.clone(), value);
            // Read back after each key, so that a bad value is reported with its key.
            *self =
                Settings::deserialize(merged.clone()).map_err(|error| ConfigError::FileValue {
                    path: path.to_owned(),
                    key,
                    error: Box::new(error),
                })?;
        }
        Ok(())
    }

    /// The settings as TOML, keys sorted (what `--print-config` prints; a valid
    /// `--config` file).
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(&self.to_table()?).map_err(ConfigError::Render)
    }

    fn to_table(&self) -> Result<toml::Table, ConfigError> {
        toml::Table::try_from(self).map_err(ConfigError::Render)
    }
}

/// Reads a config file whole: only a regular file (a FIFO would block start-up
/// forever), and only up to [`MAX_CONFIG_FILE`] bytes (`/dev/zero` would never end).
fn read_config_file(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read as _;
    let read_error = |error| ConfigError::ReadFile {
        path: path.to_owned(),
        error,
    };
    // Opened without blocking, so that a FIFO with no writer cannot hold start-up.
    let file = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(read_error)?
    };
    if !file.metadata().map_err(read_error)?.is_file() {
        return Err(ConfigError::NotAFile {
            path: path.to_owned(),
        });
    }
    let mut text = String::new();
    file.take(MAX_CONFIG_FILE + 1)
        .read_to_string(&mut text)
        .map_err(read_error)?;
    if text.len() as u64 > MAX_CONFIG_FILE {
        return Err(ConfigError::FileTooLarge {
            path: path.to_owned(),
        });
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn parse(args: &[&str]) -> (Settings, ArgMatches) {
        let matches = SettingsOnly::command().get_matches_from(args);
        let settings = SettingsOnly::try_parse_from(args).unwrap().settings;
        (settings, matches)
    }

    fn with_file(args: &[&str], text: &str) -> Result<Settings, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plegd.toml");
        std::fs::write(&path, text).unwrap();
        let (mut settings, matches) = parse(args);
        settings.overlay_file(&path, &matches).map(|()| settings)
    }

    #[test]
    fn every_key_is_a_field_and_a_flag() {
        let (settings, _) = parse(&["plegd", "--events-json", "-"]);
        let mut keys = Settings::keys();
        keys.sort();
        let mut table: Vec<String> = settings.to_table().unwrap().keys().cloned().collect();
        // Optional keys with no value are not serialized.
        table.extend([
            "api-socket".into(),
            "api-socket-group".into(),
            "api-control-socket".into(),
            "api-control-socket-group".into(),
            "hint-sources".into(),
            "node-name".into(),
            "otlp-endpoint".into(),
            "otlp-events-endpoint".into(),
            "runtime-endpoint".into(),
            "state-dir".into(),
        ]);
        table.sort();
        assert_eq!(keys, table);
    }

    #[test]
    fn the_flags_defaults_are_the_librarys_defaults() {
        // One default per setting: `plegd` with no flags runs the core exactly as
        // `PlegConfig::default()` (what tests and library users get) does.
        let (s, _) = parse(&["plegd"]);
        let got = s.service_config().unwrap().pleg;
        let want = plegd_actors::PlegConfig::default();
        assert_eq!(got.relist_period, want.relist_period);
        assert_eq!(got.health_threshold, want.health_threshold);
        assert_eq!(got.queue_capacity, want.queue_capacity);
        assert_eq!(got.status_concurrency, want.status_concurrency);
        assert_eq!(got.history_events, want.history_events);
        assert_eq!(got.tombstone_ttl, want.tombstone_ttl);
        assert_eq!(got.nri_socket, want.nri_socket);
        assert_eq!(got.api_relist_budget, want.api_relist_budget);
        assert_eq!(got.max_sync_hold, want.max_sync_hold);
        let api = s.service_config().unwrap().watch_queue;
        assert_eq!(api, plegd_api::DEFAULT_WATCH_QUEUE);
    }

    #[test]
    fn the_watch_queue_comes_from_a_flag_or_the_file_within_bounds() {
        let queue = |s: Settings| s.service_config().unwrap().watch_queue;
        let (s, _) = parse(&["plegd", "--watch-queue", "16"]);
        assert_eq!(queue(s), 16);
        let s = with_file(&["plegd"], "watch-queue = 4096\n").unwrap();
        assert_eq!(queue(s), 4096);
        for bad in ["0", "1048577", "-1", "many"] {
            let arg = format!("--watch-queue={bad}");
            let err = SettingsOnly::try_parse_from(["plegd", arg.as_str()])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains("--watch-queue"), "{bad}: {err}");
        }
        let err = with_file(&["plegd"], "watch-queue = 0\n").unwrap_err();
        assert!(err.to_string().contains("between 1 and 1048576"), "{err}");
    }

    #[test]
    fn the_control_socket_mode_is_octal_and_never_open_to_others() {
        let mode = |m: &str| m.parse::<SocketMode>();
        assert_eq!(mode("0660"), Ok(SocketMode(0o660)));
        assert_eq!(mode("600"), Ok(SocketMode(0o600)));
        assert_eq!(SocketMode(0o640).to_string(), "0640");
        for bad in ["0666", "0662", "1777", "0o660", "rw", ""] {
            assert!(mode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hint_sources_from_a_file_a_flag_or_the_old_evented_spelling() {
        use plegd_actors::{HintSelection, HintSourceName::*};
        let selection = |s: Settings| s.service_config().unwrap().hint_selection;
        let s = with_file(&["plegd"], "hint-sources = \"none\"\n").unwrap();
        assert_eq!(selection(s), HintSelection::Only(vec![]));
        let (s, _) = parse(&["plegd", "--hint-sources", "containerd-events,cri-events"]);
        assert_eq!(
            selection(s),
            HintSelection::Only(vec![ContainerdEvents, CriEvents])
        );
        let (s, _) = parse(&["plegd", "--evented=false"]);
        assert_eq!(selection(s), HintSelection::Detect { cri_events: false });
        let (s, _) = parse(&["plegd"]);
        assert_eq!(selection(s), HintSelection::default());
    }

    #[test]
    fn the_file_fills_in_defaults_only() {
        let s = with_file(
            &["plegd", "--relist-period", "2s"],
            "relist-period = \"5s\"\nqueue-capacity = 7\n",
        )
        .unwrap();
        assert_eq!(s.relist_period.to_string(), "2s");
        assert_eq!(s.queue_capacity, Count(7));
    }

    #[test]
    fn a_bad_file_value_names_its_key() {
        let err = with_file(&["plegd"], "queue-capacity = 7\nstatus-concurrency = 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"status-concurrency\"") && err.contains("between 1 and 256"),
            "{err}"
        );
        let err = with_file(&["plegd"], "bogus = 1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown key \"bogus\""), "{err}");
    }

    #[test]
    fn print_config_reads_back_as_the_same_settings() {
        let (s, _) = parse(&[
            "plegd",
            "--runtime-endpoint",
            "unix:///x.sock",
            "--reconnect-cap",
            "90s",
            "--events-json",
            "/tmp/e.jsonl",
            "--otlp-endpoint",
            "http://h:4317",
            "--metrics-addr",
            "[::1]:80",
            "--evented",
            "false",
            "--runtime-list-streaming",
            "false",
            "--otlp-events",
            "--otlp-events-endpoint",
            "http://agent:4317",
        ]);
        let back = with_file(&["plegd"], &s.to_toml().unwrap()).unwrap();
        assert_eq!(back, s);
    }
}
