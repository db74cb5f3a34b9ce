//! The state dir on disk: its lock, the state file and the marker that says the file
//! is behind what plegd served. A relist's commit is appended by its caller, the
//! dispatcher, in place: one `write(2)` into the page cache (not a sync: a killed
//! process loses nothing the page cache holds), as the publisher writes its history
//! file. New state files and the stop, which sync, are written by a thread of their
//! own (`StateStore`), so that no actor waits for a sync (but once when writing starts
//! to fail: the behind marker is synced before the revision is shown).
//!
//! Files in the dir: `lock` (held for the process's life, with its pid), `state`
//! (header, snapshot, commits, and a stop record after a clean stop), `behind` (one
//! byte, `1` while the file misses something plegd served: a restart then starts
//! fresh), `state.new` while a new state file is written (renamed over `state`
//! once synced), and `history`, the publisher's history (made anew at each start
//! from `state`, see `history_file`).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use tokio::sync::oneshot;

use super::codec;
use super::frame;
use super::load::{load, Loaded};

/// A new state file is written once the current one is this many times the size of
/// its snapshot (and at least [`MIN_REWRITE`]).
const REWRITE_RATIO: u64 = 4;
const MIN_REWRITE: u64 = 64 << 20;
/// While writing fails, a new state file is tried at most this often.
const RETRY: Duration = Duration::from_secs(10);

/// Why a state dir cannot be used at all.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another plegd holds it.
    #[error("another plegd (pid {holder}) uses the state dir {dir}; two must never share one")]
    Locked { dir: PathBuf, holder: String },
    /// It cannot be made, opened or locked.
    #[error("the state dir {dir} cannot be used: {why}")]
    Unusable { dir: PathBuf, why: String },
}

/// What opening a state dir found.
pub struct Opened {
    pub store: StateStore,
    /// What plegd goes on from; None: it starts fresh.
    pub loaded: Option<Loaded>,
    /// Why it starts fresh with state that was there (None: went on, or there was
    /// none).
    pub discarded: Option<String>,
}

/// This boot's id (Linux); empty when it cannot be read (a restart after an unclean
/// stop then always starts fresh).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Opens (making it if needed) and locks the state dir, and reads what it holds.
/// `history`: events kept for resumes; `tombstone_ttl`: the cache's.
pub fn open(dir: &Path, history: usize, tombstone_ttl: Duration) -> Result<Opened, OpenError> {
    let unusable = |why: String| OpenError::Unusable {
        dir: dir.to_path_buf(),
        why,
    };
    std::fs::create_dir_all(dir).map_err(|e| unusable(format!("cannot make it: {e}")))?;
    let mut lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.join("lock"))
        .map_err(|e| unusable(format!("cannot open its lock file: {e}")))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = lock.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(OpenError::Locked {
                dir: dir.to_path_buf(),
                holder: if holder.is_empty() { "unknown" } else { holder }.to_string(),
            });
        }
        Err(TryLockError::Error(e)) => return Err(unusable(format!("cannot lock it: {e}"))),
    }
    let _ = lock.set_len(0);
    let _ = lock.seek(SeekFrom::Start(0));
    let _ = write!(lock, "{}", std::process::id());

    let behind_path = dir.join("behind");
    let behind = std::fs::read(&behind_path).is_ok_and(|b| b.first() == Some(&b'1'));
    let state_path = dir.join("state");
    let (loaded, discarded) = match std::fs::read(&state_path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, None),
        Err(e) => (None, Some(format!("the state file cannot be read: {e}"))),
        Ok(_) if behind => (
            None,
            Some(
                "plegd could not write its state (a full or failing disk) before it stopped: \
                 the state on disk is behind what it served"
                    .into(),
            ),
        ),
        Ok(bytes) => match load(&bytes, &boot_id(), history, tombstone_ttl) {
            Ok(loaded) => (Some(loaded), None),
            Err(why) => (None, Some(why)),
        },
    };
    if discarded.is_some() && state_path.exists() {
        // Kept for a look, never read again.
        let _ = std::fs::rename(&state_path, dir.join("state.discarded"));
    }
    // Made now, while there is room, so that a full disk can still mark the file
    // behind; cleared once no state file is left that it would speak of.
    let marked = if behind && !state_path.exists() {
        write_marker(&behind_path, b'0')
    } else {
        prepare_marker(dir)
    };
    marked.map_err(|e| unusable(format!("cannot write in it: {e}")))?;
    let store = StateStore::start(dir.to_path_buf(), lock, behind_path)
        .map_err(|e| unusable(format!("cannot start its writer: {e}")))?;
    Ok(Opened {
        store,
        loaded,
        discarded,
    })
}

enum Job {
    Commit(Vec<u8>, oneshot::Sender<bool>),
    Rewrite(Vec<u8>, oneshot::Sender<bool>),
    Stop(u64, oneshot::Sender<bool>),
}

struct Shared {
    /// The state file misses something plegd served (a write failed).
    failing: AtomicBool,
    /// Bytes of the state file, and of its snapshot.
    size: AtomicU64,
    snapshot_size: AtomicU64,
    /// The least size at which a new state file is written ([`MIN_REWRITE`]).
    min_rewrite: AtomicU64,
    /// When a new state file was last tried while failing.
    last_try: Mutex<Option<Instant>>,
    /// The last write's error (for `/readyz` and the log).
    error: Mutex<Option<String>>,
    /// New state files written.
    rewrites: AtomicU64,
    /// Jobs sent to the writer thread and not yet done: a commit made meanwhile goes
    /// after them, through the thread.
    queued: AtomicUsize,
}

/// The writer of a state dir (cheap to clone): commits in place, new files and the
/// stop on its thread.
#[derive(Clone)]
pub struct StateStore {
    tx: Sender<Job>,
    writer: Arc<Mutex<Writer>>,
    shared: Arc<Shared>,
    dir: Arc<Path>,
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore")
            .field("failing", &self.failing())
            .finish()
    }
}

impl StateStore {
    fn start(dir: PathBuf, lock: File, behind: PathBuf) -> std::io::Result<StateStore> {
        let (tx, rx) = unbounded();
        let shared = Arc::new(Shared {
            failing: AtomicBool::new(false),
            size: AtomicU64::new(0),
            snapshot_size: AtomicU64::new(0),
            min_rewrite: AtomicU64::new(MIN_REWRITE),
            last_try: Mutex::new(None),
            error: Mutex::new(None),
            rewrites: AtomicU64::new(0),
            queued: AtomicUsize::new(0),
        });
        let writer = Arc::new(Mutex::new(Writer {
            dir: dir.clone(),
            lock: Some(lock),
            behind,
            file: None,
            shared: shared.clone(),
        }));
        let thread = (writer.clone(), shared.clone());
        std::thread::Builder::new()
            .name("plegd-state".into())
            .spawn(move || run(&thread.0, &thread.1, rx))?;
        Ok(StateStore {
            tx,
            writer,
            shared,
            dir: dir.into(),
        })
    }

    /// Appends one relist's commit; true once it is written (a killed process keeps
    /// it). False: not written (the store is failing, see [`Self::failing`]).
    /// Written in place unless a job of the writer thread is pending (it goes after
    /// that job): the hop to the thread and back cost a commit 250 µs on average in
    /// a storm of targeted relists on a busy node, the `write(2)` a few. The check and
    /// the write are not one step: commits, new files and the stop are asked for by
    /// one caller at a time (the dispatcher).
    pub(crate) async fn commit(&self, commit: &codec::CommitRef<'_>, buf: &mut Vec<u8>) -> bool {
        let mut bytes = Vec::new();
        frame::put(&mut bytes, codec::COMMIT, &codec::commit(commit, buf));
        if self.shared.queued.load(Ordering::SeqCst) == 0 {
            return lock(&self.writer).append(&bytes);
        }
        self.ask(|tx| Job::Commit(bytes, tx)).await
    }

    /// Writes a new state file from a snapshot's bytes (synced, then renamed over the
    /// old one); true once done. Commits sent after it go to the new file.
    /// Taken in order at once (before any commit sent after this call), awaited
    /// apart.
    pub(crate) fn rewrite(&self, bytes: Vec<u8>) -> impl std::future::Future<Output = bool> {
        *lock(&self.shared.last_try) = Some(Instant::now());
        self.ask(|tx| Job::Rewrite(bytes, tx))
    }

    /// A clean stop: records the last revision, syncs the file and lets the dir go
    /// (nothing is written after it). False: the stop is not recorded (a restart will
    /// not go on from this file as if cleanly stopped).
    pub async fn stop(&self, revision: u64) -> bool {
        self.ask(|tx| Job::Stop(revision, tx)).await
    }

    /// Sends `job` now; its answer is awaited apart.
    fn ask(
        &self,
        job: impl FnOnce(oneshot::Sender<bool>) -> Job,
    ) -> impl std::future::Future<Output = bool> {
        let (tx, rx) = oneshot::channel();
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        let sent = self.tx.send(job(tx)).is_ok();
        if !sent {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
        }
        async move { sent && rx.await.unwrap_or(false) }
    }

    /// True while the state file misses something plegd served.
    /// Where the publisher keeps its history (`history_file`).
    pub(crate) fn history_path(&self) -> PathBuf {
        self.dir.join("history")
    }

    pub fn failing(&self) -> bool {
        self.shared.failing.load(Ordering::SeqCst)
    }

    /// The last write's error, while failing.
    pub fn error(&self) -> Option<String> {
        lock(&self.shared.error).clone()
    }

    /// Bytes of the state file.
    pub fn size(&self) -> u64 {
        self.shared.size.load(Ordering::Relaxed)
    }

    /// A new state file is due: the file has grown well past its snapshot, or writing
    /// failed and the last try is [`RETRY`] old.
    pub(crate) fn rewrite_due(&self, now: Instant) -> bool {
        if self.failing() {
            return lock(&self.shared.last_try).is_none_or(|t| now.duration_since(t) >= RETRY);
        }
        let snapshot = self.shared.snapshot_size.load(Ordering::Relaxed);
        let least = self.shared.min_rewrite.load(Ordering::Relaxed);
        self.size() > (snapshot * REWRITE_RATIO).max(least)
    }

    /// Tests: a new state file once the file is `bytes` (and four times its snapshot).
    #[cfg(test)]
    pub(crate) fn rewrite_at(&self, bytes: u64) {
        self.shared.min_rewrite.store(bytes, Ordering::Relaxed);
    }

    /// New state files written so far (the first included).
    pub fn rewrites(&self) -> u64 {
        self.shared.rewrites.load(Ordering::Relaxed)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The writer thread: takes its jobs in order, each done before the next is taken
/// (and before a commit made after it is written in place).
fn run(writer: &Mutex<Writer>, shared: &Shared, rx: Receiver<Job>) {
    for job in rx {
        let (ok, tx, last) = {
            let mut w = lock(writer);
            match job {
                Job::Commit(bytes, tx) => (w.append(&bytes), tx, false),
                Job::Rewrite(bytes, tx) => (w.rewrite(&bytes), tx, false),
                Job::Stop(revision, tx) => (w.stop(revision), tx, true),
            }
        };
        shared.queued.fetch_sub(1, Ordering::SeqCst);
        let _ = tx.send(ok);
        if last {
            return;
        }
    }
}

struct Writer {
    dir: PathBuf,
    /// Held (locked) until the stop.
    lock: Option<File>,
    behind: PathBuf,
    /// The state file, open for appending; None until the first rewrite and after
    /// the stop.
    file: Option<File>,
    shared: Arc<Shared>,
}

impl Writer {
    /// Records the stop, syncs and lets the dir go: nothing is written after it.
    fn stop(&mut self, revision: u64) -> bool {
        let mut bytes = Vec::new();
        frame::put(&mut bytes, codec::STOP, &codec::stop(revision));
        let ok = self.append(&bytes) && self.file.as_ref().is_some_and(|f| f.sync_data().is_ok());
        self.file = None;
        self.lock = None;
        ok
    }

    fn append(&mut self, bytes: &[u8]) -> bool {
        if self.shared.failing.load(Ordering::SeqCst) {
            return false;
        }
        let Some(file) = &mut self.file else {
            return false;
        };
        let at = self.shared.size.load(Ordering::Relaxed);
        match file.write_all(bytes) {
            Ok(()) => {
                self.shared
                    .size
                    .store(at + bytes.len() as u64, Ordering::Relaxed);
                true
            }
            Err(e) => {
                // A part written (a full disk) is cut off: the file ends on its last
                // whole record.
                let _ = file.set_len(at);
                let _ = file.seek(SeekFrom::Start(at));
                self.fail(format!("cannot append to the state file: {e}"));
                false
            }
        }
    }

    /// Marks the file behind; if even that cannot be written, the stored identity can
    /// no longer be trusted after a crash, and plegd stops rather than risk handing out
    /// a revision twice (a restart then starts fresh: the file is consistent, the
    /// marker missing, and nothing after it was shown).
    fn fail(&mut self, why: String) {
        tracing::warn!(error = %why, "the state dir is failing: plegd goes on from memory and tries again every {}s", RETRY.as_secs());
        *lock(&self.shared.error) = Some(why);
        self.shared.failing.store(true, Ordering::SeqCst);
        if let Err(e) = write_marker(&self.behind, b'1') {
            tracing::error!(
                error = %e,
                "cannot mark the state dir as behind either; stopping so that no revision is ever issued twice"
            );
            std::process::exit(1);
        }
    }

    fn rewrite(&mut self, bytes: &[u8]) -> bool {
        let new = self.dir.join("state.new");
        let written = (|| -> std::io::Result<File> {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&new)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&new, self.dir.join("state"))?;
            File::open(&self.dir)?.sync_all()?;
            Ok(f)
        })();
        match written {
            Ok(f) => {
                self.file = Some(f);
                let len = bytes.len() as u64;
                self.shared.size.store(len, Ordering::Relaxed);
                self.shared.snapshot_size.store(len, Ordering::Relaxed);
                self.shared.rewrites.fetch_add(1, Ordering::Relaxed);
                if self.shared.failing.load(Ordering::SeqCst) {
                    if let Err(e) = write_marker(&self.behind, b'0') {
                        tracing::warn!(error = %e, "cannot clear the state dir's behind marker");
                        return false;
                    }
                    tracing::info!("the state dir is written again");
                    *lock(&self.shared.error) = None;
                    self.shared.failing.store(false, Ordering::SeqCst);
                }
                true
            }
            Err(e) => {
                let _ = std::fs::remove_file(&new);
                if self.shared.failing.load(Ordering::SeqCst) {
                    *lock(&self.shared.error) = Some(format!("cannot write a new state file: {e}"));
                } else {
                    self.fail(format!("cannot write a new state file: {e}"));
                }
                false
            }
        }
    }
}

/// Writes the behind marker in place (one byte, synced); the file is made once, so
/// on most file systems a full disk does not stop it being written again.
fn write_marker(path: &Path, value: u8) -> std::io::Result<()> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    f.write_all_at(&[value], 0)?;
    f.sync_data()
}

/// Makes the behind marker at `0` if it is not there, so that it exists before any
/// disk fills up.
fn prepare_marker(dir: &Path) -> std::io::Result<()> {
    let path = dir.join("behind");
    if !path.exists() {
        write_marker(&path, b'0')?;
    }
    Ok(())
}
