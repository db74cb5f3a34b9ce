//! glibc's allocator settings, fixed before plegd starts any thread (and by
//! `plegd-bench`'s floor, to measure a bare client under plegd's settings).
//!
//! glibc serves blocks of at least `M_MMAP_THRESHOLD` (128 KiB) with their own
//! mapping, but by default it raises that threshold to the size of any such block
//! freed (up to 32 MiB). Every global relist decodes the runtime's two full lists
//! into vectors of several MiB at 10,000 pods and frees them: after the first one,
//! blocks that large come from the heap instead, and the heap grows and fragments
//! around the long-lived pod records (docs/architecture.md, "Performance
//! decisions"). Fixing both thresholds turns that adjustment off: large blocks keep
//! their own mappings and go back to the kernel when freed.
//!
//! Small blocks are another matter: glibc gives back only the free memory at the top
//! of a heap. A churn of short-lived pods frees their records, events and strings
//! between blocks that live on (the event history, the id maps, live pods' records),
//! and those free pages stay in plegd's RSS: 2–8 MiB after 10,000 pods, run to run
//! (docs/architecture.md, "Performance decisions"). `malloc_trim` gives back every
//! whole free page of every heap (`madvise`); [`start_trimming`] calls it on its own
//! thread after every global relist ([`relist_ended`]) and at least every
//! `--memory-trim-period`. It takes ≈ 0.2–0.4 ms at 10,000 pods, holding each heap's
//! lock in turn, so an allocation on another thread may wait that long.
//!
//! Once that thread runs, glibc no longer trims a heap's top on every `free` past
//! 128 KiB ([`defer_heap_trims`]): during a relist the runtime's lists pass through
//! the heap frame by frame (HTTP/2's 16 KiB frames, the lists' growing blocks), and
//! trimming the top as each is freed had the next one fault its pages in again,
//! about 800 page faults a relist at 10,000 pods. The trim after the relist gives
//! them back instead, once.

use std::time::Duration;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
use std::time::Instant;

/// Blocks from this size on get their own mapping (glibc's default start value).
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;
/// Free memory at the top of the heap beyond this is given back (glibc's default).
const TRIM_THRESHOLD: libc::c_int = 128 * 1024;
/// The same once the trim thread gives memory back after each relist: more than a
/// relist at 10,000 realistic pods leaves free at the top of the heap.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const DEFERRED_TRIM_THRESHOLD: libc::c_int = 64 * 1024 * 1024;

/// Wakes the trim thread (after a global relist); set once it runs.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
static NUDGE: std::sync::OnceLock<std::sync::mpsc::SyncSender<()>> = std::sync::OnceLock::new();

/// Fixes glibc's mmap and trim thresholds. Call it first thing in `main`, while the
/// process has one thread. Returns false if glibc refused a setting (plegd then
/// runs with glibc's defaults).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn fix_thresholds() -> bool {
    // SAFETY: mallopt only changes the allocator's parameters; called from `main`
    // before any thread is started, so no allocation runs concurrently, and both
    // values are in the range glibc accepts (0..=HEAP_MAX / 2).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    }
}

/// Gives the heaps' free pages back to the kernel after each global relist and at
/// least every `period`, on a thread of its own that lives as long as the process (it
/// holds nothing to clean up at exit); from then on, heaps' tops wait for it
/// ([`defer_heap_trims`]).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn start_trimming(period: Duration) -> std::io::Result<()> {
    use std::sync::mpsc::RecvTimeoutError;
    // One wake-up pending at most: relists that end while a trim runs need one more.
    let (nudge, woken) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("plegd-trim".into())
        .spawn(move || loop {
            if let Err(RecvTimeoutError::Disconnected) = woken.recv_timeout(period) {
                return;
            }
            let start = Instant::now();
            let released = trim();
            tracing::debug!(released, took = ?start.elapsed(), "malloc_trim");
        })?;
    if NUDGE.set(nudge).is_ok() && !defer_heap_trims() {
        tracing::warn!(
            "glibc refused the deferred trim threshold; the heap's top is trimmed on free"
        );
    }
    Ok(())
}

/// A global relist ended: the trim thread, if it runs, gives back what it freed (the
/// runtime's lists). Never blocks.
pub fn relist_ended() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if let Some(nudge) = NUDGE.get() {
        let _ = nudge.try_send(());
    }
}

/// glibc stops trimming a heap's top as blocks are freed, up to 64 MiB of it: for a
/// process that trims on its own after each burst of work (plegd's trim thread; the
/// bench's floor with plegd's settings). False if glibc refused it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn defer_heap_trims() -> bool {
    // SAFETY: mallopt takes the main arena's lock itself and only changes the
    // allocator's parameters; the value is in the range glibc accepts.
    unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, DEFERRED_TRIM_THRESHOLD) == 1 }
}

/// One `malloc_trim(0)`: true if it gave memory back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn trim() -> bool {
    // SAFETY: malloc_trim takes each arena's lock itself and only releases free
    // pages; it is safe to call from any thread at any time.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Other C libraries: no malloc_trim; the setting does nothing.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn start_trimming(_period: Duration) -> std::io::Result<()> {
    Ok(())
}

/// Other C libraries: nothing to fix.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn fix_thresholds() -> bool {
    true
}

/// Other C libraries: nothing to defer.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn defer_heap_trims() -> bool {
    true
}

/// Other C libraries: nothing to trim.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() -> bool {
    false
}
