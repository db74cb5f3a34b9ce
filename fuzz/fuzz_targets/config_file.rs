//! Fuzz target: plegd's settings file. plegd is a binary crate, so this target
//! compiles its real `config.rs`, `exit.rs` and `values.rs` in (`#[path]`; no copy) and
//! drives `Settings::overlay_file` the way `plegd run --config FILE` does: arbitrary
//! bytes are written to a file and overlaid on settings parsed by clap, some of them
//! given as flags. Each line of the input is also parsed as every kind of value, the
//! way a flag or environment variable is (`FromStr`). Checks, besides "no panic":
//!
//! - a file that is accepted leaves every flag's value alone (flags > file);
//! - accepted settings render as TOML (`--print-config`), and that TOML, read back as
//!   a config file, gives the same settings;
//! - a refused file gives an error that can be displayed (it names the key);
//! - a value accepted from text prints as text that parses back to the same value.
#![no_main]

#[allow(dead_code)]
#[path = "../../plegd/src/config.rs"]
mod config;
#[allow(dead_code)]
#[path = "../../plegd/src/exit.rs"]
mod exit;
#[allow(dead_code)]
#[path = "../../plegd/src/values.rs"]
mod values;

use std::collections::HashMap;
use std::fmt::Debug;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Mutex, OnceLock};

use clap::{ArgMatches, CommandFactory as _, FromArgMatches as _};
use libfuzzer_sys::fuzz_target;

use config::Settings;
use values::{Count, MetricsAddr, OtlpEndpoint, PositiveDuration, DAY, HOUR};

/// The settings alone, as a command (config.rs has one too, private to it).
#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    settings: Settings,
}

/// What clap made of a command line: the settings, its matches, the keys it gave.
type Parsed = (Settings, ArgMatches, Vec<String>);

/// Settings and matches for a command line that gives the keys of `mask` as flags.
fn parse(mask: u16) -> Parsed {
    static CACHE: OnceLock<Mutex<HashMap<u16, Parsed>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let keys = Settings::keys();
    let mask = mask & ((1 << keys.len().min(16)) - 1) as u16;
    if let Some(hit) = cache.lock().unwrap().get(&mask) {
        return hit.clone();
    }
    let mut args = vec!["plegd".to_string()];
    let mut given = Vec::new();
    for (i, key) in keys.into_iter().enumerate() {
        if mask & (1 << i) == 0 {
            continue;
        }
        let value = match key.as_str() {
            "runtime-endpoint" => "unix:///flag.sock",
            "events-json" => "-",
            "otlp-endpoint" => "http://flag:4317",
            "evented" => "false",
            "metrics-addr" => "off",
            "queue-capacity" | "status-concurrency" => "3",
            // Every other setting is a duration.
            _ => "7s",
        };
        args.push(format!("--{key}"));
        args.push(value.into());
        given.push(key);
    }
    let matches = Cli::command()
        .try_get_matches_from(&args)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let settings = Cli::from_arg_matches(&matches).unwrap().settings;
    let hit = (settings, matches, given);
    cache.lock().unwrap().insert(mask, hit.clone());
    hit
}

fn scratch_file() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        dir.join(format!("plegd-fuzz-config-{}.toml", std::process::id()))
    })
}

fn overlay(text: &[u8], mask: u16) -> (Settings, Settings, Vec<String>, Result<(), String>) {
    let (mut settings, matches, given) = parse(mask);
    let from_flags = settings.clone();
    let path = scratch_file();
    std::fs::write(path, text).unwrap();
    let result = settings.overlay_file(path, &matches).map_err(|e| {
        // Every message of the chain, as main prints it.
        let mut msg = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            msg.push_str(&format!(": {s}"));
            source = s.source();
        }
        msg
    });
    (from_flags, settings, given, result)
}

fuzz_target!(|data: &[u8]| {
    let Some((mask, text)) = data.split_first_chunk::<2>() else {
        return;
    };
    let mask = u16::from_le_bytes(*mask);
    let (from_flags, settings, given, result) = overlay(text, mask);
    if result.is_ok() {
        let flags = toml::Table::try_from(&from_flags).unwrap();
        let now = toml::Table::try_from(&settings).unwrap();
        for key in &given {
            assert_eq!(
                flags.get(key),
                now.get(key),
                "the file overrode flag --{key}"
            );
        }
        let printed = settings
            .to_toml()
            .expect("accepted settings render as TOML");
        let (_, back, _, reread) = overlay(printed.as_bytes(), 0);
        reread.unwrap_or_else(|e| panic!("--print-config output refused: {e}\n{printed}"));
        assert_eq!(
            back, settings,
            "--print-config output reads back differently\n{printed}"
        );
    }

    for line in String::from_utf8_lossy(text).lines().take(8) {
        round_trip::<PositiveDuration<HOUR>>(line, ToString::to_string);
        round_trip::<PositiveDuration<DAY>>(line, ToString::to_string);
        round_trip::<PositiveDuration<{ 10 * 60 }>>(line, ToString::to_string);
        round_trip::<Count<256>>(line, |c| i64::from(*c).to_string());
        round_trip::<Count<1_000_000>>(line, |c| i64::from(*c).to_string());
        round_trip::<MetricsAddr>(line, ToString::to_string);
        round_trip::<OtlpEndpoint>(line, ToString::to_string);
    }
});

/// A value parsed from text (a flag, the environment) prints as text that parses back
/// to the same value: what `--print-config` relies on.
fn round_trip<T>(text: &str, print: fn(&T) -> String)
where
    T: FromStr<Err = String> + PartialEq + Debug,
{
    let Ok(value) = text.parse::<T>() else {
        return;
    };
    let printed = print(&value);
    match printed.parse::<T>() {
        Ok(back) => assert_eq!(back, value, "{text:?} printed as {printed:?}"),
        Err(e) => panic!("{text:?} printed as {printed:?}, which is refused: {e}"),
    }
}
