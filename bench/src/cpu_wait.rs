//! Time threads spent runnable but waiting for a CPU (the second field of a thread's
//! `/proc/…/task/TID/schedstat`) while an exit was under way: on a busy node a late
//! exit's milliseconds can go there rather than into anyone's work.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

/// The threads that carry plegd's ContainerDied to the harness: plegd's actor thread
/// (hint streams, CRI reads, relists, the publisher), its event output thread, and
/// the harness's thread reading plegd's stdout. Each is read from its own schedstat
/// file, found once, so that a reading costs three small reads.
pub struct CpuWaits {
    plegd: PathBuf,
    output: PathBuf,
    reader: PathBuf,
}

/// The waits so far, or (after [`Waited::since`]) over a span.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Waited {
    pub plegd: Duration,
    pub output: Duration,
    pub reader: Duration,
    /// plegd's actor thread's time on a CPU meanwhile (busy, not waiting).
    pub plegd_ran: Duration,
}

/// plegd's event output thread (`plegd/src/output.rs`).
const PLEGD_OUTPUT: &str = "event-output";
/// The harness's thread that reads plegd's stdout (`procs::Plegd`).
pub const READER: &str = "plegd-events";

impl CpuWaits {
    /// The threads of plegd's process `plegd` (its actors run on its main thread,
    /// whatever the binary is called) and of this one.
    pub fn new(plegd: u32) -> Result<CpuWaits> {
        let tasks = PathBuf::from(format!("/proc/{plegd}/task"));
        let main = tasks.join(plegd.to_string()).join("schedstat");
        if !main.exists() {
            bail!("no {}: has plegd exited?", main.display());
        }
        CpuWaits::of(main, &tasks, Path::new("/proc/self/task"))
    }

    /// plegd's actor thread's schedstat file `actors`; its output thread under
    /// `plegd_tasks`, the reader under `own_tasks`.
    fn of(actors: PathBuf, plegd_tasks: &Path, own_tasks: &Path) -> Result<CpuWaits> {
        Ok(CpuWaits {
            plegd: actors,
            output: schedstat_of(plegd_tasks, PLEGD_OUTPUT)?,
            reader: schedstat_of(own_tasks, READER)?,
        })
    }

    pub fn now(&self) -> Result<Waited> {
        let (plegd_ran, plegd) = schedstat(&self.plegd)?;
        Ok(Waited {
            plegd,
            output: schedstat(&self.output)?.1,
            reader: schedstat(&self.reader)?.1,
            plegd_ran,
        })
    }
}

/// The waits at each raw CRI event's arrival and at plegd's ContainerDied line of the
/// same container, to count from the one to the other.
pub struct SinceArrival {
    threads: CpuWaits,
    at: Mutex<Stamps>,
}

#[derive(Default)]
struct Stamps {
    arrived: HashMap<String, Waited>,
    reported: HashMap<String, Waited>,
}

impl SinceArrival {
    pub fn new(threads: CpuWaits) -> SinceArrival {
        SinceArrival {
            threads,
            at: Mutex::default(),
        }
    }

    /// `id`'s raw CRI event arrived now (a reading that fails leaves it out).
    pub fn arrived(&self, id: &str) {
        if let Ok(w) = self.threads.now() {
            self.lock().arrived.entry(id.to_string()).or_insert(w);
        }
    }

    /// plegd's ContainerDied of `id` was read now.
    pub fn reported(&self, id: &str) {
        if let Ok(w) = self.threads.now() {
            self.lock().reported.entry(id.to_string()).or_insert(w);
        }
    }

    /// The waits from `id`'s raw CRI event's arrival to plegd's first ContainerDied of
    /// it: none if either is missing, or the line came first.
    pub fn span(&self, id: &str) -> Option<Waited> {
        let at = self.lock();
        Some(at.reported.get(id)?.since(at.arrived.get(id)?))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Stamps> {
        self.at.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The schedstat file of the one thread under `tasks` named `name`.
fn schedstat_of(tasks: &Path, name: &str) -> Result<PathBuf> {
    let mut found = Vec::new();
    for task in std::fs::read_dir(tasks).with_context(|| tasks.display().to_string())? {
        let task = task?.path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            found.push(task.join("schedstat"));
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        n => bail!(
            "{n} threads named {name:?} under {}: expected one",
            tasks.display()
        ),
    }
}

/// A thread's time on a CPU and time waiting for one, from its schedstat file.
fn schedstat(path: &Path) -> Result<(Duration, Duration)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{} (has the thread ended?)", path.display()))?;
    let mut fields = text.split_whitespace().map(|v| v.parse::<u64>().ok());
    match (fields.next().flatten(), fields.next().flatten()) {
        (Some(ran), Some(waited)) => Ok((Duration::from_nanos(ran), Duration::from_nanos(waited))),
        _ => bail!("no run and wait times in {}: {text:?}", path.display()),
    }
}

impl Waited {
    /// The waits between `before` and `self`.
    pub fn since(&self, before: &Waited) -> Waited {
        Waited {
            plegd: self.plegd.saturating_sub(before.plegd),
            output: self.output.saturating_sub(before.output),
            reader: self.reader.saturating_sub(before.reader),
            plegd_ran: self.plegd_ran.saturating_sub(before.plegd_ran),
        }
    }

    /// As the late-exit row shows it, ms.
    pub fn describe(&self) -> String {
        let ms = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1e3);
        format!(
            "waited for a CPU: plegd {}, its output {}, the harness's reader {} ms; plegd's actor thread ran {} ms",
            ms(self.plegd),
            ms(self.output),
            ms(self.reader),
            ms(self.plegd_ran)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};
    use std::thread::JoinHandle;

    fn spin(for_: Duration) {
        let start = std::time::Instant::now();
        while start.elapsed() < for_ {
            std::hint::black_box(());
        }
    }

    /// What stands for plegd's actor thread in this process.
    const ACTORS: &str = "plegd-actors";

    /// The threads of [`CpuWaits`] in this process: a thread named [`ACTORS`] for
    /// plegd's main thread.
    fn in_this_process() -> Result<CpuWaits> {
        let own = Path::new("/proc/self/task");
        CpuWaits::of(schedstat_of(own, ACTORS)?, own, own)
    }

    #[test]
    fn a_process_without_its_threads_is_refused() {
        let gone = CpuWaits::new(u32::MAX).err().map(|e| e.to_string());
        assert_eq!(
            gone.as_deref(),
            Some("no /proc/4294967295/task/4294967295/schedstat: has plegd exited?")
        );
    }

    /// The tests that name threads of this process, one at a time.
    static NAMING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A thread named `name` (once this returns) that runs `body`, then stays alive (a
    /// thread that ended has no schedstat) until unparked.
    fn named(name: &str, body: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
        let (started, named) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _ = started.send(());
                body();
                std::thread::park_timeout(Duration::from_secs(60));
            })
            .expect("a thread");
        named.recv().expect("the thread started");
        thread
    }

    fn end(threads: Vec<JoinHandle<()>>) {
        for t in &threads {
            t.thread().unpark();
        }
        for t in threads {
            t.join().expect("the thread ran");
        }
    }

    #[test]
    fn a_reader_kept_from_a_cpu_is_seen_waiting_and_sleeping_threads_are_not() {
        let _one = NAMING.lock().unwrap_or_else(|e| e.into_inner());
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        // The reader and a hog for every CPU spin together: some must wait for one.
        let go = Arc::new(Barrier::new(cpus + 2));
        let done = Arc::new(Barrier::new(2));
        let mut threads = vec![named(ACTORS, || {}), named(PLEGD_OUTPUT, || {})];
        let (g, d) = (go.clone(), done.clone());
        threads.push(named(READER, move || {
            g.wait();
            spin(Duration::from_millis(300));
            d.wait();
        }));
        let hogs: Vec<_> = (0..cpus)
            .map(|_| {
                let go = go.clone();
                std::thread::spawn(move || {
                    go.wait();
                    spin(Duration::from_millis(300));
                })
            })
            .collect();
        let waits = in_this_process().expect("the three threads");
        let before = waits.now().expect("schedstat");
        go.wait();
        done.wait();
        let span = waits.now().expect("schedstat").since(&before);
        for h in hogs {
            h.join().expect("hogged");
        }
        end(threads);
        assert!(span.reader > Duration::ZERO, "{span:?}");
        // The threads named as plegd's slept: neither waited nor ran.
        assert_eq!(
            (span.plegd, span.output, span.plegd_ran),
            (Duration::ZERO, Duration::ZERO, Duration::ZERO)
        );
    }

    #[test]
    fn a_second_thread_of_a_name_is_refused() {
        let _one = NAMING.lock().unwrap_or_else(|e| e.into_inner());
        let threads = vec![
            named(ACTORS, || {}),
            named(PLEGD_OUTPUT, || {}),
            named(READER, || {}),
            named(READER, || {}),
        ];
        let err = in_this_process().err().map(|e| e.to_string());
        end(threads);
        assert_eq!(
            err.as_deref(),
            Some("2 threads named \"plegd-events\" under /proc/self/task: expected one")
        );
    }

    #[test]
    fn a_span_is_the_difference_and_is_described_in_ms() {
        let at = Duration::from_micros;
        let before = Waited {
            plegd: at(1_000),
            output: at(2_000),
            reader: at(0),
            plegd_ran: at(10_000),
        };
        let after = Waited {
            plegd: at(4_250),
            output: at(2_000),
            reader: at(1_500),
            plegd_ran: at(10_700),
        };
        assert_eq!(
            after.since(&before).describe(),
            "waited for a CPU: plegd 3.25, its output 0.00, the harness's reader 1.50 ms; \
             plegd's actor thread ran 0.70 ms"
        );
    }
}
