//! The I/O engines: one OS thread per core, each running its own single-threaded tokio runtime.
//! An I/O queue moves onto the engine with the fewest queues once its Connect binds it (on a tie,
//! engine `(qid - 1) % threads`) and stays there: its socket, its PDUs and (on a page-cache
//! device) its reads and writes all run on that thread to completion, with no hand-off per
//! command. A host's queues (Linux makes one per CPU) so land on different threads and use
//! every core, and so do the single queues of many volumes (each of which is qid 1). Admin and discovery queues stay on the
//! daemon's runtime: they are few and not on the data path.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// One engine thread.
#[derive(Debug)]
struct Engine {
    handle: Handle,
    /// I/O queues it serves now.
    queues: Arc<AtomicUsize>,
    /// Dropped (or sent) to stop the thread.
    stop: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

/// The engine threads of one target.
#[derive(Debug)]
pub struct Engines {
    engines: Vec<Engine>,
    /// Device operations started on queues' io_uring rings.
    ring_operations: AtomicU64,
    /// Busy polls that found work before the engine slept.
    busy_polls_found: Arc<AtomicU64>,
}

/// Counts a queue on its engine while it lives there.
#[derive(Debug)]
pub struct Placement {
    queues: Arc<AtomicUsize>,
}

impl Drop for Placement {
    fn drop(&mut self) {
        self.queues.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Engines {
    /// Starts `threads` engines (at least one), named `edgevol-io-N`, each polling its queues
    /// for up to `busy_poll` before it sleeps ([`super::busy_poll`]; zero: never).
    pub fn start(threads: usize, busy_poll: Duration) -> std::io::Result<Self> {
        Self::launch(&vec![None; threads.max(1)], busy_poll)
    }

    /// One engine per core the process may use.
    pub fn per_core(busy_poll: Duration) -> std::io::Result<Self> {
        Self::start(
            thread::available_parallelism().map_or(1, usize::from),
            busy_poll,
        )
    }

    /// One engine per CPU of `cpus`, each pinned to its CPU (as SPDK's reactors are to their
    /// cores): a queue's thread then never migrates, shares its core only with what the
    /// system puts there, and keeps its caches warm. Fails, naming the CPU, where the process
    /// may not run on one of them.
    pub fn pinned(cpus: &[usize], busy_poll: Duration) -> std::io::Result<Self> {
        let cpus: Vec<Option<usize>> = cpus.iter().copied().map(Some).collect();
        Self::launch(&cpus, busy_poll)
    }

    /// An engine per entry of `cpus`, pinned where it names a CPU.
    fn launch(cpus: &[Option<usize>], busy_poll: Duration) -> std::io::Result<Self> {
        let found = Arc::new(AtomicU64::new(0));
        let mut engines = Engines {
            engines: Vec::with_capacity(cpus.len()),
            ring_operations: AtomicU64::new(0),
            busy_polls_found: found.clone(),
        };
        for (i, &cpu) in cpus.iter().enumerate() {
            let rt = Builder::new_current_thread()
                .enable_all()
                .on_thread_park(super::busy_poll::before_sleep)
                .on_thread_unpark(super::busy_poll::after_wake)
                .build()?;
            let handle = rt.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            let (pinned_tx, pinned) = std::sync::mpsc::channel();
            let found = found.clone();
            let thread = thread::Builder::new()
                .name(format!("edgevol-io-{i}"))
                .spawn(move || {
                    let pin = cpu.map_or(Ok(()), pin_to);
                    let ok = pin.is_ok();
                    let _ = pinned_tx.send(pin);
                    if ok {
                        super::busy_poll::start(busy_poll, found);
                        // Runs the thread's queues until the target drops its engines.
                        let _ = rt.block_on(stopped);
                    }
                })?;
            // Dropping `engines` on an error stops and joins the threads started so far.
            engines.engines.push(Engine {
                handle,
                queues: Arc::default(),
                stop: Some(stop),
                thread: Some(thread),
            });
            pinned
                .recv()
                .map_err(|_| std::io::Error::other("an I/O thread ended at its start"))??;
        }
        Ok(engines)
    }

    /// Number of engine threads.
    pub fn threads(&self) -> usize {
        self.engines.len()
    }

    /// Device operations the engines' queues ran on their io_uring rings (the rest ran in
    /// place or on the worker threads).
    pub fn ring_operations(&self) -> u64 {
        self.ring_operations.load(Ordering::Relaxed)
    }

    /// Busy polls that found a command or a completion before the engine slept
    /// ([`super::busy_poll`]).
    pub fn busy_polls_found(&self) -> u64 {
        self.busy_polls_found.load(Ordering::Relaxed)
    }

    pub(crate) fn count_ring_operation(&self) {
        self.ring_operations.fetch_add(1, Ordering::Relaxed);
    }

    /// The engine for a new I/O queue `qid` (1-based, as NVMe numbers them): the one with the
    /// fewest queues, the qid's own on a tie.
    pub fn index_of(&self, qid: u16) -> usize {
        let n = self.engines.len();
        let own = usize::from(qid.saturating_sub(1)) % n;
        let load = |i: usize| self.engines[i].queues.load(Ordering::Relaxed);
        (0..n)
            .map(|k| (own + k) % n)
            .min_by_key(|&i| load(i))
            .unwrap_or(own)
    }

    /// Runs `queue` (an I/O queue's remaining life) on the engine of `qid`.
    pub fn spawn<F>(&self, qid: u16, queue: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let engine = &self.engines[self.index_of(qid)];
        engine.queues.fetch_add(1, Ordering::Relaxed);
        let placement = Placement {
            queues: engine.queues.clone(),
        };
        engine.handle.spawn(async move {
            let _placement = placement;
            queue.await
        })
    }

    /// I/O queues each engine serves now (metrics, tests).
    pub fn queues_per_thread(&self) -> Vec<usize> {
        self.engines
            .iter()
            .map(|e| e.queues.load(Ordering::Relaxed))
            .collect()
    }
}

impl Drop for Engines {
    fn drop(&mut self) {
        for e in &mut self.engines {
            drop(e.stop.take());
        }
        for e in &mut self.engines {
            if let Some(t) = e.thread.take() {
                // Never join from an engine thread itself (the last queue may drop us there).
                if t.thread().id() != thread::current().id() {
                    let _ = t.join();
                }
            }
        }
    }
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) -> std::io::Result<()> {
    use nix::sched::{sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let mut set = CpuSet::new();
    set.set(cpu)
        .and_then(|()| sched_setaffinity(Pid::from_raw(0), &set))
        .map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "nvme.io_cpus: cannot run on CPU {cpu} ({e}): not one this process may use"
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sched::CpuSet;

    #[tokio::test]
    async fn io_queues_spread_over_the_engines_and_are_counted_while_they_live() {
        let engines = Engines::start(2, Duration::ZERO).unwrap();
        let (release, wait) = tokio::sync::watch::channel(false);
        let names: Vec<_> = (1..=4u16)
            .map(|qid| {
                let mut wait = wait.clone();
                engines.spawn(qid, async move {
                    let _ = wait.wait_for(|go| *go).await;
                    thread::current().name().map(str::to_owned)
                })
            })
            .collect();
        tokio::task::yield_now().await;
        assert_eq!(engines.queues_per_thread(), vec![2, 2]);
        release.send_replace(true);
        let mut names: Vec<_> = futures_names(names).await;
        names.sort();
        assert_eq!(
            names,
            [
                "edgevol-io-0",
                "edgevol-io-0",
                "edgevol-io-1",
                "edgevol-io-1"
            ]
        );
        assert_eq!(engines.queues_per_thread(), vec![0, 0]);
    }

    #[tokio::test]
    async fn single_queues_of_many_controllers_spread_too() {
        let engines = Engines::start(2, Duration::ZERO).unwrap();
        let (release, wait) = tokio::sync::watch::channel(false);
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let mut wait = wait.clone();
                engines.spawn(1, async move {
                    let _ = wait.wait_for(|go| *go).await;
                    thread::current().name().map(str::to_owned)
                })
            })
            .collect();
        tokio::task::yield_now().await;
        assert_eq!(engines.queues_per_thread(), vec![2, 2]);
        release.send_replace(true);
        let names = futures_names(handles).await;
        assert!(names.iter().any(|n| n == "edgevol-io-1"), "{names:?}");
    }

    /// Each pinned engine runs on its CPU alone; a CPU the process may not use fails the
    /// start, naming it, and leaves no thread behind.
    #[tokio::test]
    async fn pinned_engines_run_on_their_cpu_and_a_cpu_out_of_reach_is_refused() {
        use nix::sched::sched_getaffinity;
        use nix::unistd::Pid;
        let allowed = sched_getaffinity(Pid::from_raw(0)).unwrap();
        let cpus: Vec<usize> = (0..CpuSet::count())
            .filter(|&c| allowed.is_set(c).unwrap_or(false))
            .collect();
        let engines = Engines::pinned(&cpus, Duration::ZERO).unwrap();
        assert_eq!(engines.threads(), cpus.len());
        for (i, &cpu) in cpus.iter().enumerate() {
            let qid = u16::try_from(i + 1).unwrap();
            assert_eq!(engines.index_of(qid), i);
            let on = engines
                .spawn(qid, async {
                    let set = sched_getaffinity(Pid::from_raw(0)).unwrap();
                    (0..CpuSet::count())
                        .filter(|&c| set.is_set(c).unwrap_or(false))
                        .collect::<Vec<_>>()
                })
                .await
                .unwrap();
            assert_eq!(on, [cpu], "engine {i}");
        }
        drop(engines);
        // The last CPU a set can name, which this machine does not have.
        let beyond = CpuSet::count() - 1;
        assert!(!allowed.is_set(beyond).unwrap());
        let e = Engines::pinned(&[cpus[0], beyond], Duration::ZERO).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains(&format!("CPU {beyond}")), "{e}");
    }

    async fn futures_names(handles: Vec<JoinHandle<Option<String>>>) -> Vec<String> {
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap().unwrap());
        }
        out
    }
}
