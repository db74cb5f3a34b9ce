//! A file descriptor kept in reserve for when the process runs out: an accept loop
//! that fails for lack of descriptors gives the spare up, accepts (and answers or
//! closes) the connection waiting, then takes the spare back. Without it, the
//! connection stays in the kernel's backlog, the accept fails again at once, and the
//! endpoint answers no one until some other descriptor is closed.

use std::fs::File;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

/// The spare (`/dev/null`, opened for reading). Clones share it.
#[derive(Clone, Debug)]
pub struct SpareFd(Arc<Mutex<Option<File>>>);

impl SpareFd {
    /// Opens the spare (none if even that fails: the first [`SpareFd::restore`] tries
    /// again).
    pub fn open() -> Self {
        SpareFd(Arc::new(Mutex::new(File::open("/dev/null").ok())))
    }

    fn slot(&self) -> MutexGuard<'_, Option<File>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes the spare: true if it was held (so a descriptor is free now).
    pub fn give_up(&self) -> bool {
        self.slot().take().is_some()
    }

    /// Opens the spare again if it is not held; fails while the process is still out
    /// of descriptors (try again later).
    pub fn restore(&self) -> bool {
        let mut slot = self.slot();
        if slot.is_none() {
            *slot = File::open("/dev/null").ok();
        }
        slot.is_some()
    }

    /// True while the spare is held.
    pub fn held(&self) -> bool {
        self.slot().is_some()
    }
}

/// True for the errors of an accept that one free descriptor would let succeed
/// (EMFILE: this process's limit; ENFILE: the system's).
pub fn out_of_fds(e: &io::Error) -> bool {
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    matches!(e.raw_os_error(), Some(ENFILE | EMFILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spare_is_given_up_once_and_restored() {
        let spare = SpareFd::open();
        assert!(spare.held());
        assert!(spare.give_up());
        assert!(!spare.give_up(), "nothing left to give up");
        assert!(spare.restore());
        assert!(spare.held());
        assert!(out_of_fds(&io::Error::from_raw_os_error(24)));
        assert!(!out_of_fds(&io::Error::from_raw_os_error(104)));
    }
}
