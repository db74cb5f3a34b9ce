//! glibc's allocator settings, fixed before plegd starts any thread.
//!
//! glibc serves blocks of at least `M_MMAP_THRESHOLD` (128 KiB) with their own
//! mapping, but by default it raises that threshold to the size of any such block
//! freed (up to 32 MiB). Every global relist decodes the runtime's two full lists
//! into vectors of several MiB at 10,000 pods and frees them: after the first one,
//! blocks that large come from the heap instead, and the heap grows and fragments
//! around the long-lived pod records (BENCHMARKS.md, "Memory"). Fixing both
//! thresholds turns that adjustment off: large blocks keep their own mappings and
//! go back to the kernel when freed.

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

/// Other C libraries: nothing to fix.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn fix_thresholds() -> bool {
    true
}
