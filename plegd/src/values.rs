//! The kinds of value a setting can hold (a positive duration, a bounded count, the
//! metrics address, the OTLP endpoint). Each kind is parsed and limited here once, and
//! the same code serves flags and environment (through `FromStr`, for clap) and the
//! `--config` file (through serde), so a value means the same wherever it is written.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

/// A duration greater than zero and at most `MAX_SECS` seconds, written with units:
/// `500ms`, `1s`, `3m`. The upper bound keeps every deadline and timer that plegd
/// computes from it far from overflowing (`20000y` would panic inside tonic).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PositiveDuration<const MAX_SECS: u64>(pub Duration);

/// One hour, in seconds.
pub const HOUR: u64 = 3600;
/// One day, in seconds.
pub const DAY: u64 = 24 * HOUR;

impl<const MAX_SECS: u64> FromStr for PositiveDuration<MAX_SECS> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim_start().starts_with('-') {
            return Err("must not be negative".into());
        }
        let d =
            humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 1s, 3m)"))?;
        if d.is_zero() {
            return Err("must be greater than zero".into());
        }
        let max = Duration::from_secs(MAX_SECS);
        if d > max {
            return Err(format!(
                "must be at most {}",
                humantime::format_duration(max)
            ));
        }
        Ok(PositiveDuration(d))
    }
}

impl<const MAX_SECS: u64> fmt::Display for PositiveDuration<MAX_SECS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        humantime::format_duration(self.0).fmt(f)
    }
}

/// A whole number from 1 to `MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct Count<const MAX: u32>(pub u32);

impl<const MAX: u32> TryFrom<i64> for Count<MAX> {
    type Error = String;
    fn try_from(n: i64) -> Result<Self, String> {
        match u32::try_from(n) {
            Ok(n) if (1..=MAX).contains(&n) => Ok(Count(n)),
            _ => Err(format!("must be between 1 and {MAX}")),
        }
    }
}

impl<const MAX: u32> FromStr for Count<MAX> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let n: i64 = s
            .parse()
            .map_err(|e| format!("{e} (expected 1 to {MAX})"))?;
        Count::try_from(n)
    }
}

impl<const MAX: u32> From<Count<MAX>> for i64 {
    fn from(c: Count<MAX>) -> i64 {
        i64::from(c.0)
    }
}

impl<const MAX: u32> Count<MAX> {
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

/// A size in bytes from 1 MiB to 1 GiB: `16MiB`, `512KiB`... or a plain number of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MessageSize(pub usize);

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
const GIB: usize = 1024 * MIB;

impl FromStr for MessageSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (number, unit) = s.split_at(digits);
        let unit_bytes = match unit.trim() {
            "" | "B" => 1,
            "KiB" => KIB,
            "MiB" => MIB,
            "GiB" => GIB,
            other => return Err(format!("unknown unit {other:?} (examples: 16MiB, 512KiB)")),
        };
        let n: usize = number
            .parse()
            .map_err(|_| "expected a size such as 16MiB".to_string())?;
        match n.checked_mul(unit_bytes) {
            Some(b) if (MIB..=GIB).contains(&b) => Ok(MessageSize(b)),
            _ => Err("must be between 1MiB and 1GiB".into()),
        }
    }
}

impl fmt::Display for MessageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b.is_multiple_of(GIB) {
            write!(f, "{}GiB", b / GIB)
        } else if b.is_multiple_of(MIB) {
            write!(f, "{}MiB", b / MIB)
        } else if b.is_multiple_of(KIB) {
            write!(f, "{}KiB", b / KIB)
        } else {
            write!(f, "{b}")
        }
    }
}

/// How plegd writes its log lines on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Readable lines; colour only on a terminal, never with NO_COLOR.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl From<LogFormat> for plegd_telemetry::logging::LogFormat {
    fn from(f: LogFormat) -> Self {
        match f {
            LogFormat::Text => plegd_telemetry::logging::LogFormat::Text,
            LogFormat::Json => plegd_telemetry::logging::LogFormat::Json,
        }
    }
}

/// Where to serve `/metrics`, `/healthz` and `/readyz`: `HOST:PORT`, or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum MetricsAddr {
    Off,
    On(SocketAddr),
}

impl FromStr for MetricsAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "off" {
            return Ok(MetricsAddr::Off);
        }
        s.parse::<SocketAddr>()
            .map(MetricsAddr::On)
            .map_err(|e| format!("{e} (expected HOST:PORT such as 127.0.0.1:9464, or 'off')"))
    }
}

impl fmt::Display for MetricsAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricsAddr::Off => f.write_str("off"),
            MetricsAddr::On(a) => a.fmt(f),
        }
    }
}

/// An OTLP/gRPC collector: `http://HOST:PORT` or `https://HOST:PORT`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OtlpEndpoint(pub String);

impl FromStr for OtlpEndpoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once("://") {
            Some(("http" | "https", rest)) if !rest.is_empty() => Ok(OtlpEndpoint(s.to_string())),
            _ => Err("expected http://HOST:PORT or https://HOST:PORT (OTLP over gRPC)".into()),
        }
    }
}

impl fmt::Display for OtlpEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A setting that is an absolute path or `off`: the type, its parsing (the error
/// names what is expected) and its text.
macro_rules! path_or_off {
    ($(#[$doc:meta])* $name:ident, $expected:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub enum $name {
            Off,
            Path(std::path::PathBuf),
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                if s == "off" {
                    return Ok($name::Off);
                }
                let path = std::path::Path::new(s);
                if !path.is_absolute() || path.file_name().is_none() {
                    return Err(concat!("expected ", $expected, ", or 'off'").into());
                }
                Ok($name::Path(path.to_owned()))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    $name::Off => f.write_str("off"),
                    $name::Path(p) => p.display().fmt(f),
                }
            }
        }

        impl $name {
            /// The path: this one, `default` when unset, None when off.
            pub fn or_default(
                setting: Option<&$name>,
                default: impl FnOnce() -> std::path::PathBuf,
            ) -> Option<std::path::PathBuf> {
                match setting {
                    None => Some(default()),
                    Some($name::Off) => None,
                    Some($name::Path(p)) => Some(p.clone()),
                }
            }
        }
    };
}

path_or_off!(
    /// Where to serve the subscriber API: an absolute socket path, or `off`.
    ApiSocket,
    "an absolute socket path such as /run/plegd/plegd.sock"
);

path_or_off!(
    /// Where plegd keeps its state: an absolute directory, or `off`.
    StateDir,
    "an absolute directory such as /var/lib/plegd"
);

/// A socket file's mode in octal (`0660`, `660`): at most 0777, never writable by
/// others (anyone on the host could then call it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SocketMode(pub u32);

impl FromStr for SocketMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mode = u32::from_str_radix(s, 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| format!("{s:?} is not an octal mode from 0000 to 0777"))?;
        if mode & 0o002 != 0 {
            return Err(format!(
                "{s}: others may write to the socket (anyone on the host could call it)"
            ));
        }
        Ok(SocketMode(mode))
    }
}

impl fmt::Display for SocketMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

/// How often plegd gives the heap's free pages back to the kernel: a duration (at
/// most 1h), or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum TrimPeriod {
    Off,
    Every(PositiveDuration<HOUR>),
}

impl TrimPeriod {
    /// The period, or None for `off`.
    pub fn get(self) -> Option<Duration> {
        match self {
            TrimPeriod::Off => None,
            TrimPeriod::Every(d) => Some(d.0),
        }
    }
}

impl FromStr for TrimPeriod {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "off" {
            return Ok(TrimPeriod::Off);
        }
        s.parse()
            .map(TrimPeriod::Every)
            .map_err(|e| format!("{e}, or 'off'"))
    }
}

impl fmt::Display for TrimPeriod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrimPeriod::Off => f.write_str("off"),
            TrimPeriod::Every(d) => d.fmt(f),
        }
    }
}

/// `--hint-sources`: a comma-separated list of relist hint sources (`cri-events`,
/// `nri`, `containerd-events`), or `none` for polling only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HintSources(pub Vec<plegd_actors::HintSourceName>);

impl FromStr for HintSources {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        use plegd_actors::HintSourceName;
        let known = || {
            let names: Vec<_> = HintSourceName::ALL.iter().map(|n| n.as_str()).collect();
            names.join(", ")
        };
        if s.trim() == "none" {
            return Ok(HintSources(vec![]));
        }
        let mut list = vec![];
        for item in s.split(',').map(str::trim) {
            let name = HintSourceName::ALL
                .iter()
                .copied()
                .find(|n| n.as_str() == item)
                .ok_or_else(|| {
                    format!("unknown hint source {item:?} (known: {}; or none)", known())
                })?;
            if list.contains(&name) {
                return Err(format!("{item} is given twice"));
            }
            list.push(name);
        }
        Ok(HintSources(list))
    }
}

impl fmt::Display for HintSources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let names: Vec<_> = self.0.iter().map(|n| n.as_str()).collect();
        f.write_str(&names.join(","))
    }
}

/// serde's `try_from = "String"` for every kind above that is written as text.
macro_rules! text_conversions {
    ($($t:ty),*) => {$(
        impl TryFrom<String> for $t {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                s.parse()
            }
        }
        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.to_string()
            }
        }
    )*};
}
text_conversions!(
    MessageSize,
    MetricsAddr,
    OtlpEndpoint,
    ApiSocket,
    StateDir,
    HintSources,
    TrimPeriod,
    SocketMode
);

impl<const MAX_SECS: u64> TryFrom<String> for PositiveDuration<MAX_SECS> {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl<const MAX_SECS: u64> From<PositiveDuration<MAX_SECS>> for String {
    fn from(v: PositiveDuration<MAX_SECS>) -> String {
        v.to_string()
    }
}

/// A boolean setting in the config file, refused with "expected true or false".
pub fn true_or_false<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = bool;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("true or false")
        }
        fn visit_bool<E>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
    }
    d.deserialize_bool(Visitor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_positive_and_keep_their_units() {
        let d: PositiveDuration<DAY> = "1m".parse().unwrap();
        assert_eq!(d.0, Duration::from_secs(60));
        assert_eq!(d.to_string(), "1m");
        for (bad, reason) in [
            ("0s", "greater than zero"),
            ("-1s", "negative"),
            ("soon", "500ms"),
        ] {
            let err = bad.parse::<PositiveDuration<DAY>>().unwrap_err();
            assert!(err.contains(reason), "{bad}: {err}");
        }
    }

    #[test]
    fn message_sizes_have_units_and_bounds() {
        assert_eq!("16MiB".parse::<MessageSize>(), Ok(MessageSize(16 * MIB)));
        assert_eq!("1048576".parse::<MessageSize>(), Ok(MessageSize(MIB)));
        assert_eq!(MessageSize(16 * MIB).to_string(), "16MiB");
        assert_eq!(MessageSize(1536 * KIB).to_string(), "1536KiB");
        for bad in [
            "0",
            "1KiB",
            "2GiB",
            "16MB",
            "lots",
            "99999999999999999999GiB",
        ] {
            assert!(bad.parse::<MessageSize>().is_err(), "{bad}");
        }
    }

    /// Regression: `20000y` passed validation, then panicked inside tonic.
    #[test]
    fn durations_have_an_upper_bound() {
        assert!("1h".parse::<PositiveDuration<HOUR>>().is_ok());
        for bad in ["61m", "20000y", "300000000000y"] {
            let err = bad.parse::<PositiveDuration<HOUR>>().unwrap_err();
            assert!(err.contains("at most 1h"), "{bad}: {err}");
        }
    }

    #[test]
    fn counts_are_bounded_the_same_from_text_and_from_numbers() {
        assert_eq!("256".parse::<Count<256>>(), Ok(Count(256)));
        for bad in ["0", "257", "-1", "lots"] {
            assert!(bad.parse::<Count<256>>().is_err(), "{bad}");
        }
        assert_eq!(
            Count::<256>::try_from(0),
            Err("must be between 1 and 256".into())
        );
        assert!(Count::<256>::try_from(i64::from(u32::MAX) + 1).is_err());
    }

    #[test]
    fn addresses_and_endpoints_round_trip_as_text() {
        for s in ["off", "127.0.0.1:9464", "[::1]:80"] {
            assert_eq!(s.parse::<MetricsAddr>().unwrap().to_string(), s);
        }
        assert!("localhost".parse::<MetricsAddr>().is_err());
        assert!("http://h:4317".parse::<OtlpEndpoint>().is_ok());
        assert!("grpc://h".parse::<OtlpEndpoint>().is_err());
        assert!("http://".parse::<OtlpEndpoint>().is_err());
        for s in ["off", "/run/plegd/plegd.sock"] {
            assert_eq!(s.parse::<ApiSocket>().unwrap().to_string(), s);
        }
        for bad in ["plegd.sock", "", "/"] {
            assert!(bad.parse::<ApiSocket>().is_err(), "{bad:?}");
        }
        for s in ["off", "/var/lib/plegd"] {
            assert_eq!(s.parse::<StateDir>().unwrap().to_string(), s);
        }
        for bad in ["var/lib/plegd", "", "/", "./state"] {
            assert!(bad.parse::<StateDir>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn trim_periods_are_off_or_a_bounded_duration() {
        for s in ["off", "10s", "500ms", "1h"] {
            assert_eq!(s.parse::<TrimPeriod>().unwrap().to_string(), s);
        }
        assert_eq!("off".parse::<TrimPeriod>().unwrap().get(), None);
        assert_eq!(
            "2s".parse::<TrimPeriod>().unwrap().get(),
            Some(Duration::from_secs(2))
        );
        for (bad, reason) in [
            ("0s", "greater than zero"),
            ("2h", "at most 1h"),
            ("never", "'off'"),
        ] {
            let err = bad.parse::<TrimPeriod>().unwrap_err();
            assert!(err.contains(reason), "{bad}: {err}");
        }
    }
}
