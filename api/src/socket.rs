//! The API socket, made safely: its directory is created if missing; a lock file
//! beside it (`PATH.lock`, held for plegd's lifetime) tells a live plegd from a
//! crashed one, so a live plegd's socket is never stolen and a stale one is replaced;
//! the socket is bound under a temporary name, given mode 0660 (and a group) and only
//! then renamed into place, so it is never reachable with looser permissions. Any path
//! that fits a socket address (107 bytes) works: when the temporary name would not
//! fit, it is shorter, or reached through the directory's descriptor.

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// The socket's mode: owner and group may connect.
pub const SOCKET_MODE: u32 = 0o660;

/// The longest path a unix socket can have: `sun_path`'s 108 bytes on Linux, less the
/// terminating NUL.
pub const MAX_SOCKET_PATH: usize = 107;

/// Why the socket could not be made; each names the path.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("--api-socket {}: another plegd serves this socket (its lock {} is held); not replacing it", path.display(), lock.display())]
    Live { path: PathBuf, lock: PathBuf },
    #[error("--api-socket {}: a live server answers on this socket; not replacing it", path.display())]
    Answering { path: PathBuf },
    #[error("--api-socket {}: exists and is not a socket; not replacing it", path.display())]
    NotASocket { path: PathBuf },
    #[error("--api-socket {}: {len} bytes long; a unix socket path has at most {MAX_SOCKET_PATH}", path.display())]
    PathTooLong { path: PathBuf, len: usize },
    #[error("--api-socket {}: the path has no file name", path.display())]
    NoFileName { path: PathBuf },
    #[error("--api-socket-group {group:?}: no such group in /etc/group")]
    UnknownGroup { group: String },
    #[error("--api-socket-group {group:?}: not a group id a file can have (0 to {MAX_GID})")]
    GroupOutOfRange { group: String },
    #[error("--api-socket {}: {doing}", path.display())]
    Io {
        path: PathBuf,
        doing: &'static str,
        #[source]
        error: io::Error,
    },
}

/// The bound socket. Dropping it removes the socket file (if it is still ours) and
/// releases the lock.
#[derive(Debug)]
pub struct BoundSocket {
    path: PathBuf,
    listener: Option<UnixListener>,
    _lock: File,
}

impl BoundSocket {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The listener, once (for the server).
    pub fn take_listener(&mut self) -> Option<UnixListener> {
        self.listener.take()
    }
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        // Still holding the lock: no other plegd can have bound here meanwhile.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Where the lock file of the socket at `path` is.
pub fn lock_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// Binds the API socket at `path` with mode 0660, group `group` when given (a name
/// from /etc/group or a numeric id).
pub fn bind(path: &Path, group: Option<&str>) -> Result<BoundSocket, SocketError> {
    bind_with_mode(path, group, SOCKET_MODE)
}

/// As [`bind`], with the socket's `mode` (the control socket's own).
pub fn bind_with_mode(
    path: &Path,
    group: Option<&str>,
    mode: u32,
) -> Result<BoundSocket, SocketError> {
    let io_err = |doing| {
        let path = path.to_owned();
        move |error| SocketError::Io { path, doing, error }
    };
    let gid = group.map(resolve_group).transpose()?;
    check_path(path)?;
    let name = path.file_name().ok_or_else(|| SocketError::NoFileName {
        path: path.to_owned(),
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(io_err("cannot create its directory"))?;

    let lock_file = lock_path(path);
    let created = !lock_file.exists();
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_file)
        .map_err(io_err("cannot open its lock file"))?;
    // A lock file this call made goes again when it refuses the path (held, so no
    // other plegd is using it): a refused path is left as it was found.
    let refuse = |e: SocketError| {
        if created {
            let _ = std::fs::remove_file(&lock_file);
        }
        e
    };
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(SocketError::Live {
                path: path.to_owned(),
                lock: lock_file,
            })
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io_err("cannot lock its lock file")(e)),
    }

    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            // Left by a plegd that died (the lock is free), unless something else
            // serves it.
            if UnixStream::connect(path).is_ok() {
                return Err(refuse(SocketError::Answering {
                    path: path.to_owned(),
                }));
            }
        }
        Ok(_) => {
            return Err(refuse(SocketError::NotASocket {
                path: path.to_owned(),
            }))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(refuse(io_err("cannot inspect it")(e))),
    }

    // Held while the temporary name is in use: it may be reached through it.
    let dir_handle = File::open(&dir).map_err(io_err("cannot open its directory"))?;
    let tmp = temp_path(&dir, name, std::process::id(), dir_handle.as_raw_fd());
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(io_err("cannot bind"))?;
    let placed = (|| {
        std::fs::set_permissions(&tmp, Permissions::from_mode(mode))?;
        if let Some(gid) = gid {
            std::os::unix::fs::chown(&tmp, None, Some(gid))?;
        }
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err("cannot set its mode, group or name")(e));
    }
    drop(dir_handle);
    listener
        .set_nonblocking(true)
        .map_err(io_err("cannot make it non-blocking"))?;
    Ok(BoundSocket {
        path: path.to_owned(),
        listener: Some(listener),
        _lock: lock,
    })
}

/// Refuses a path longer than a unix socket address can hold ([`MAX_SOCKET_PATH`]).
pub fn check_path(path: &Path) -> Result<(), SocketError> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(SocketError::PathTooLong {
            path: path.to_owned(),
            len,
        });
    }
    Ok(())
}

/// Where the socket is bound before it is renamed to `dir/name`: beside it, as
/// `.NAME.PID.tmp`; when that is longer than a socket address can be, `.plegd.PID.tmp`;
/// when even that is, the same name through `/proc/self/fd/DIR_FD`, which is short
/// whatever the directory.
fn temp_path(dir: &Path, name: &OsStr, pid: u32, dir_fd: i32) -> PathBuf {
    let mut long = OsString::from(".");
    long.push(name);
    long.push(format!(".{pid}.tmp"));
    let short = format!(".plegd.{pid}.tmp");
    let fits = |p: &Path| p.as_os_str().as_bytes().len() <= MAX_SOCKET_PATH;
    let beside = dir.join(&long);
    if fits(&beside) {
        return beside;
    }
    let beside = dir.join(&short);
    if fits(&beside) {
        return beside;
    }
    PathBuf::from(format!("/proc/self/fd/{dir_fd}/{short}"))
}

/// The largest group id a file can be given: chown takes 4294967295 (-1) for "leave
/// the group as it is".
pub const MAX_GID: u32 = u32::MAX - 1;

/// A group name (from /etc/group) or a numeric group id (0 to [`MAX_GID`]); what
/// [`bind`] gives the socket. Checked at start and by `--print-config` alike.
pub fn resolve_group(group: &str) -> Result<u32, SocketError> {
    if !group.is_empty() && group.bytes().all(|b| b.is_ascii_digit()) {
        return match group.parse::<u32>() {
            Ok(gid) if gid <= MAX_GID => Ok(gid),
            _ => Err(SocketError::GroupOutOfRange {
                group: group.to_string(),
            }),
        };
    }
    let unknown = || SocketError::UnknownGroup {
        group: group.to_string(),
    };
    let text = std::fs::read_to_string("/etc/group").map_err(|_| unknown())?;
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let gid = fields.nth(1)?.parse::<u32>().ok()?;
            (name == group).then_some(gid)
        })
        .next()
        .ok_or_else(unknown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn the_socket_is_0660_in_a_created_directory_and_removed_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/plegd/plegd.sock");
        let bound = bind(&path, None).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.mode() & 0o777, 0o660);
        // Nothing else is left in the directory but the lock.
        let mut names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["plegd.sock", "plegd.sock.lock"]);
        drop(bound);
        assert!(!path.exists());
    }

    #[test]
    fn a_live_socket_is_never_stolen_and_a_stale_one_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plegd.sock");
        let first = bind(&path, None).unwrap();
        let err = bind(&path, None).unwrap_err();
        assert!(matches!(err, SocketError::Live { .. }), "{err}");
        assert!(err.to_string().contains("another plegd serves"), "{err}");
        assert!(path.exists(), "the live socket is left alone");
        assert!(UnixStream::connect(&path).is_ok(), "and still serves");
        drop(first);
        // A crash leaves the socket file behind, with nothing listening and the lock
        // released with the process.
        let stale = dir.path().join("stale.sock");
        drop(UnixListener::bind(&stale).unwrap());
        assert!(stale.exists());
        let again = bind(&stale, None).unwrap();
        assert!(UnixStream::connect(&stale).is_ok(), "the new socket serves");
        drop(again);
    }

    #[test]
    fn something_else_answering_or_a_plain_file_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.sock");
        let _other = UnixListener::bind(&path).unwrap();
        let err = bind(&path, None).unwrap_err();
        assert!(matches!(err, SocketError::Answering { .. }), "{err}");
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let err = bind(&file, None).unwrap_err();
        assert!(matches!(err, SocketError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
        // Each left as found: no lock file of ours beside them.
        assert!(!lock_path(&path).exists() && !lock_path(&file).exists());
        // One that was there already (a plegd's before) stays.
        std::fs::write(lock_path(&file), "").unwrap();
        bind(&file, None).unwrap_err();
        assert!(lock_path(&file).exists());
    }

    #[test]
    fn the_group_is_set_by_name_or_id_and_an_unknown_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.sock");
        let own_gid = std::fs::metadata(dir.path()).unwrap().gid();
        let bound = bind(&path, Some(&own_gid.to_string())).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().gid(), own_gid);
        drop(bound);
        let err = bind(&path, Some("no-such-group-plegd")).unwrap_err();
        assert!(matches!(err, SocketError::UnknownGroup { .. }), "{err}");
        assert!(matches!(resolve_group("root"), Ok(0)));
    }

    /// A path of `len` bytes under `dir`: directories of 50-byte names, then the socket.
    fn path_of_len(dir: &Path, len: usize) -> PathBuf {
        let mut p = dir.to_path_buf();
        while p.as_os_str().len() + 1 + 50 + 1 + 5 < len {
            p.push("d".repeat(50));
        }
        let rest = len - p.as_os_str().len() - 1;
        p.push("s".repeat(rest));
        assert_eq!(p.as_os_str().len(), len);
        p
    }

    #[test]
    fn every_path_that_fits_a_socket_address_is_bound_and_a_longer_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        // Long file names and short ones, so that each temporary name is needed.
        for len in [100, 104, 106, MAX_SOCKET_PATH] {
            for name_len in [1, 8, 40] {
                let long = path_of_len(dir.path(), len - name_len - 1);
                std::fs::create_dir_all(&long).unwrap();
                let path = long.join("n".repeat(name_len));
                assert_eq!(path.as_os_str().len(), len);
                let bound = bind(&path, None).unwrap_or_else(|e| panic!("{len}: {e}"));
                assert!(std::fs::metadata(&path).unwrap().file_type().is_socket());
                assert_eq!(
                    std::fs::metadata(&path).unwrap().mode() & 0o777,
                    0o660,
                    "{len}"
                );
                assert!(UnixStream::connect(&path).is_ok(), "{len}");
                drop(bound);
                let left: Vec<_> = std::fs::read_dir(&long)
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .filter(|n| n.as_bytes().ends_with(b".tmp"))
                    .collect();
                assert!(left.is_empty(), "{left:?}");
            }
        }
        let path = path_of_len(dir.path(), MAX_SOCKET_PATH + 1);
        let err = bind(&path, None).unwrap_err();
        assert!(matches!(err, SocketError::PathTooLong { .. }), "{err}");
        assert!(err.to_string().contains("at most 107"), "{err}");
    }

    #[test]
    fn a_group_id_chown_cannot_set_is_refused() {
        assert!(matches!(resolve_group("4294967294"), Ok(4_294_967_294)));
        for group in ["4294967295", "4294967296", "99999999999999999999"] {
            let err = resolve_group(group).unwrap_err();
            assert!(matches!(err, SocketError::GroupOutOfRange { .. }), "{err}");
            assert!(err.to_string().contains("4294967294"), "{err}");
        }
    }
}
