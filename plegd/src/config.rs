//! The effective configuration: flags > environment > the `--config` TOML file >
//! defaults. Clap handles the first two and the defaults; this module fills in
//! what only the file sets, with the same parsers, and names the key on any error.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use clap::parser::ValueSource;
use clap::ArgMatches;

use crate::cli::{
    parse_metrics_addr, parse_otlp_endpoint, parse_positive_duration, CommonArgs, MetricsAddr,
};

/// Keys a config file may hold (the long flag names).
const KEYS: &[&str] = &[
    "runtime-endpoint",
    "relist-period",
    "health-threshold",
    "runtime-request-timeout",
    "queue-capacity",
    "status-concurrency",
    "evented",
    "reconnect-base",
    "reconnect-cap",
    "reconnect-healthy-reset",
    "events-json",
    "metrics-addr",
    "otlp-endpoint",
];

/// Loads the file named by `--config` and applies every key whose flag was neither
/// given nor set in the environment. Returns the file's runtime-endpoint if any.
pub fn apply_file(
    common: &mut CommonArgs,
    matches: &ArgMatches,
    runtime_endpoint: &mut Option<String>,
    accepts_endpoint: bool,
) -> anyhow::Result<()> {
    let Some(path) = common.config.clone() else {
        return Ok(());
    };
    let table = load(&path)?;
    let from_file = |id: &str| {
        !matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    };
    let ctx = |key: &str| format!("config file {}: key {key:?}", path.display());
    for (key, value) in &table {
        let id = key.replace('-', "_");
        if key == "runtime-endpoint" {
            let v = as_str(value).with_context(|| ctx(key))?;
            if !accepts_endpoint {
                tracing::warn!(
                    key,
                    "plegd demo uses its simulated runtime; this key is not used"
                );
            } else if from_file(&id) {
                *runtime_endpoint = Some(v.to_string());
            }
            continue;
        }
        if !from_file(&id) {
            continue;
        }
        let dur = |v: &toml::Value| -> anyhow::Result<Duration> {
            parse_positive_duration(as_str(v)?).map_err(|e| anyhow!(e))
        };
        let count = |v: &toml::Value, max: i64| -> anyhow::Result<u32> {
            let n = v
                .as_integer()
                .ok_or_else(|| anyhow!("expected an integer"))?;
            if !(1..=max).contains(&n) {
                bail!("must be between 1 and {max}");
            }
            Ok(n as u32)
        };
        let applied: anyhow::Result<()> = (|| {
            match key.as_str() {
                "relist-period" => common.relist_period = dur(value)?,
                "health-threshold" => common.health_threshold = dur(value)?,
                "runtime-request-timeout" => common.runtime_request_timeout = dur(value)?,
                "reconnect-base" => common.reconnect_base = dur(value)?,
                "reconnect-cap" => common.reconnect_cap = dur(value)?,
                "reconnect-healthy-reset" => common.reconnect_healthy_reset = dur(value)?,
                "queue-capacity" => common.queue_capacity = count(value, 1_000_000)?,
                "status-concurrency" => common.status_concurrency = count(value, 256)?,
                "evented" => {
                    common.evented = value
                        .as_bool()
                        .ok_or_else(|| anyhow!("expected true or false"))?
                }
                "events-json" => common.events_json = Some(as_str(value)?.into()),
                "metrics-addr" => {
                    common.metrics_addr =
                        parse_metrics_addr(as_str(value)?).map_err(|e| anyhow!(e))?
                }
                "otlp-endpoint" => {
                    common.otlp_endpoint =
                        Some(parse_otlp_endpoint(as_str(value)?).map_err(|e| anyhow!(e))?)
                }
                _ => unreachable_key(key)?,
            }
            Ok(())
        })();
        applied.with_context(|| ctx(key))?;
    }
    Ok(())
}

fn unreachable_key(key: &str) -> anyhow::Result<()> {
    bail!("unknown key {key:?}")
}

fn as_str(v: &toml::Value) -> anyhow::Result<&str> {
    v.as_str().ok_or_else(|| anyhow!("expected a string"))
}

fn load(path: &Path) -> anyhow::Result<BTreeMap<String, toml::Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--config {}: cannot read", path.display()))?;
    let table: BTreeMap<String, toml::Value> = toml::from_str(&text)
        .with_context(|| format!("--config {}: not valid TOML", path.display()))?;
    for key in table.keys() {
        if !KEYS.contains(&key.as_str()) {
            bail!(
                "config file {}: unknown key {key:?} (known: {})",
                path.display(),
                KEYS.join(", ")
            );
        }
    }
    Ok(table)
}

fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// The effective configuration as TOML (what `--print-config` prints).
pub fn render(common: &CommonArgs, runtime_endpoint: Option<&str>) -> String {
    let mut t = toml::map::Map::new();
    let mut put = |k: &str, v: toml::Value| {
        t.insert(k.to_string(), v);
    };
    if let Some(e) = runtime_endpoint {
        put("runtime-endpoint", e.into());
    }
    put("relist-period", fmt_duration(common.relist_period).into());
    put(
        "health-threshold",
        fmt_duration(common.health_threshold).into(),
    );
    put(
        "runtime-request-timeout",
        fmt_duration(common.runtime_request_timeout).into(),
    );
    put("queue-capacity", i64::from(common.queue_capacity).into());
    put(
        "status-concurrency",
        i64::from(common.status_concurrency).into(),
    );
    put("evented", common.evented.into());
    put("reconnect-base", fmt_duration(common.reconnect_base).into());
    put("reconnect-cap", fmt_duration(common.reconnect_cap).into());
    put(
        "reconnect-healthy-reset",
        fmt_duration(common.reconnect_healthy_reset).into(),
    );
    if let Some(p) = &common.events_json {
        put("events-json", p.display().to_string().into());
    }
    put(
        "metrics-addr",
        match common.metrics_addr {
            MetricsAddr::Off => "off".to_string(),
            MetricsAddr::On(a) => a.to_string(),
        }
        .into(),
    );
    if let Some(o) = &common.otlp_endpoint {
        put("otlp-endpoint", o.clone().into());
    }
    toml::to_string(&toml::Value::Table(t)).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
}
