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
//! thread every `--memory-trim-period`. It takes ≈ 0.2 ms at 10,000 pods, holding
//! each heap's lock in turn, so an allocation on another thread may wait that long.

use std::time::Duration;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
use std::time::Instant;

/// Blocks from this size on get their own mapping (glibc's default start value).
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;
/// Free memory at the top of the heap beyond this is given back (glibc's default).
const TRIM_THRESHOLD: libc::c_int = 128 * 1024;

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

/// Gives the heaps' free pages back to the kernel every `period`, on a thread of its
/// own that lives as long as the process (it holds nothing to clean up at exit).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn start_trimming(period: Duration) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("plegd-trim".into())
        .spawn(move || loop {
            std::thread::sleep(period);
            let start = Instant::now();
            let released = trim();
            tracing::debug!(released, took = ?start.elapsed(), "malloc_trim");
        })
        .map(drop)
}

/// One `malloc_trim(0)`: true if it gave memory back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim() -> bool {
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
