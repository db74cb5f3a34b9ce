//! A file descriptor kept in reserve for when the process runs out: an accept loop
//! that fails for lack of descriptors gives the spare up, accepts (and answers or
//! closes) the connection waiting, then takes the spare back. Without it, the
//! connection stays in the kernel's backlog, the accept fails again at once, and the
//! endpoint answers no one until some other descriptor is closed.
//!
//! A connection accepted on the spare's descriptor is shut down, not closed, when it
//! ends, and its descriptor is the spare from then on ([`SpareFd::take_back`]). A
//! close and a reopen would leave the number free for a moment, and another part of
//! the process (another accept loop with clients waiting) could take it for good.

use std::fs::File;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};

/// The spare (`/dev/null`, opened for reading, or the socket of the last connection
/// it was given up for). Clones share it.
#[derive(Clone, Debug)]
pub struct SpareFd(Arc<Mutex<Option<OwnedFd>>>);

/// A connected socket the spare can take back.
pub trait Connection: Into<OwnedFd> {
    /// Shuts it down both ways: its peer reads the end, as if it were closed.
    fn shut_down(&self);
}

impl Connection for TcpStream {
    fn shut_down(&self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

impl Connection for UnixStream {
    fn shut_down(&self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

fn dev_null() -> Option<OwnedFd> {
    File::open("/dev/null").ok().map(OwnedFd::from)
}

impl SpareFd {
    /// Opens the spare (none if even that fails: the first [`SpareFd::restore`] tries
    /// again).
    pub fn open() -> Self {
        SpareFd(Arc::new(Mutex::new(dev_null())))
    }

    fn slot(&self) -> MutexGuard<'_, Option<OwnedFd>> {
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
            *slot = dev_null();
        }
        slot.is_some()
    }

    /// Ends `conn` (shut down both ways) and keeps its descriptor as the spare if
    /// none is held; else closes it.
    pub fn take_back(&self, conn: impl Connection) {
        conn.shut_down();
        let mut slot = self.slot();
        if slot.is_none() {
            *slot = Some(conn.into());
        }
    }

    /// The spare's descriptor number, if held.
    #[cfg(test)]
    pub(crate) fn number(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.slot().as_ref().map(|fd| fd.as_raw_fd())
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

    #[test]
    fn a_connection_taken_back_is_the_spare_and_its_peer_reads_the_end() {
        use std::io::Read;
        use std::os::fd::AsRawFd;

        let spare = SpareFd::open();
        assert!(spare.give_up());
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let number = ours.as_raw_fd();
        spare.take_back(ours);
        // The same descriptor, never closed: no other thread could have taken it.
        assert_eq!(spare.number(), Some(number));
        let mut rest = Vec::new();
        assert_eq!(theirs.read_to_end(&mut rest).unwrap(), 0);

        // A spare already held stays; the connection is closed.
        let (other, mut peer) = UnixStream::pair().unwrap();
        spare.take_back(other);
        assert_eq!(spare.number(), Some(number));
        assert_eq!(peer.read_to_end(&mut rest).unwrap(), 0);
    }
}
