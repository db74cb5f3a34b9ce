//! A process from outside: a child stopped and reaped on drop, a free port for it to
//! serve on, one HTTP GET of what it serves, its figures in `/proc`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A running child stopped and reaped when dropped, so that a failed assertion or an
/// error leaves no process behind: SIGTERM first, so that it can clean up after
/// itself (`plegd demo` removes its temporary directory), then SIGKILL if it still
/// runs after [`STOP_DEADLINE`]. A test that means to kill it calls `.0.kill()`.
pub struct Reaped(pub Child);

/// How long a dropped [`Reaped`] child has to exit after its SIGTERM.
pub const STOP_DEADLINE: Duration = Duration::from_secs(10);

impl Drop for Reaped {
    fn drop(&mut self) {
        if !matches!(self.0.try_wait(), Ok(None)) {
            return;
        }
        // Not reaped yet, so the pid is still this child's.
        let pid = Pid::from_raw(self.0.id() as i32);
        if kill(pid, Signal::SIGTERM).is_ok() {
            let deadline = Instant::now() + STOP_DEADLINE;
            while Instant::now() < deadline {
                if !matches!(self.0.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A port on 127.0.0.1 nobody listens on now (the kernel picks it; another program
/// may take it before the caller's child binds it, which makes that child fail).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One GET of `path` on 127.0.0.1:`port`, on a fresh connection: the status code and
/// the whole response (head and body), or `None` if the connection failed, was
/// refused or closed without a response. Five seconds at most for each step.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    // A server that stopped accepting would leave a plain connect hanging for minutes.
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, response))
}

/// A number field of `/proc/PID/status` (`field` with its colon: `VmRSS:` and
/// `RssAnon:` in KiB, `Threads:` a count); `None` if the process or the field is
/// not there.
pub fn status_field(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_resident_size_and_threads() {
        let pid = std::process::id();
        assert!(status_field(pid, "VmRSS:").is_some_and(|kib| kib > 0));
        assert!(status_field(pid, "Threads:").is_some_and(|n| n >= 1));
        assert_eq!(status_field(pid, "NoSuchField:"), None);
    }

    #[test]
    fn a_get_of_a_closed_port_is_none() {
        let port = free_port().expect("a free port");
        assert_eq!(http_get(port, "/"), None);
    }
}
