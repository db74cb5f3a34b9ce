//! An output's cursor in the state dir: the instance and the last revision the output
//! wrote. stdout cannot resume like an API client, so after a restart the event
//! writer goes on after its cursor from the stored history: at least once (what it
//! wrote after the last save is written again), each line identifiable by its
//! instance and revision.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often the cursor is saved while events are written (and once at the end).
const SAVE_EVERY: Duration = Duration::from_secs(1);

pub struct Cursor {
    path: PathBuf,
    instance: String,
    /// The last revision saved, and when.
    saved: u64,
    at: Instant,
    /// A failed save was said in the log (once, until one succeeds again).
    told: bool,
}

impl Cursor {
    /// The cursor `name` in `dir` for `instance`.
    pub fn new(dir: &Path, name: &str, instance: &str) -> Cursor {
        Cursor {
            path: dir.join(format!("{name}.cursor")),
            instance: instance.to_string(),
            saved: 0,
            at: Instant::now(),
            told: false,
        }
    }

    /// The revision to go on after: the saved one, if it is this instance's (None:
    /// no cursor, or another instance's); Err with why when it cannot be read.
    pub fn load(&self) -> Result<Option<u64>, String> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", self.path.display())),
        };
        let damaged = || format!("{}: not \"INSTANCE REVISION\"", self.path.display());
        let (instance, revision) = text.trim().split_once(' ').ok_or_else(damaged)?;
        let revision: u64 = revision.parse().map_err(|_| damaged())?;
        Ok((instance == self.instance).then_some(revision))
    }

    /// A save is due (the last one is [`SAVE_EVERY`] old).
    pub fn due(&self) -> bool {
        self.at.elapsed() >= SAVE_EVERY
    }

    /// Saves `revision` (written to a new file, then renamed: a killed process
    /// leaves the old cursor or the new one) if a save is due or `now`.
    pub fn save(&mut self, revision: u64, now: bool) {
        if revision == self.saved || (!now && self.at.elapsed() < SAVE_EVERY) {
            return;
        }
        let tmp = self.path.with_extension("cursor.new");
        let written = std::fs::write(&tmp, format!("{} {revision}\n", self.instance))
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        match written {
            Ok(()) => {
                self.saved = revision;
                self.at = Instant::now();
                self.told = false;
            }
            // Not fatal: a restart writes again from an older cursor (at least once).
            Err(e) => {
                self.at = Instant::now();
                if !self.told {
                    self.told = true;
                    tracing::warn!(error = %e, path = %self.path.display(), "cannot save the output's cursor: after a restart, the output writes again what it wrote since the last save");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_is_read_back_only_by_its_instance() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Cursor::new(dir.path(), "output", "abc");
        assert_eq!(c.load(), Ok(None));
        c.save(42, true);
        assert_eq!(c.load(), Ok(Some(42)));
        assert_eq!(Cursor::new(dir.path(), "output", "other").load(), Ok(None));
        // Regression: a damaged cursor was taken as none, silently.
        for damaged in ["abc x\n", "zzz\n", ""] {
            std::fs::write(dir.path().join("output.cursor"), damaged).unwrap();
            let err = c.load().expect_err(damaged);
            assert!(err.contains("output.cursor"), "{err}");
        }
    }
}
