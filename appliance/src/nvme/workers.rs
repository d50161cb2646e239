//! The blocking side of the data path: threads that run the I/O commands an engine must not
//! wait for (Flush, FUA, write-through, Write Zeroes, Deallocate, and queued reads and writes
//! on a drive when the queue has no io_uring), so the drive sees the queue's depth while the
//! engine goes on receiving and completing.
//!
//! In place of tokio's blocking pool, which allocates a task (and a JoinSet entry) per call:
//! here a job is a plain value in a queue whose memory is kept, and its result goes back
//! through the submitting queue's [`Replies`], so a command allocates nothing. Threads start
//! when there is work and none is idle, up to a bound, and stay.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;

use tokio::sync::Notify;

/// A unit of blocking work.
pub trait Job: Send + 'static {
    /// Runs it (on a worker thread).
    fn run(self);
}

/// The workers of one target.
pub struct Workers<J: Job> {
    shared: Arc<Shared<J>>,
    threads: Mutex<Vec<thread::JoinHandle<()>>>,
}

impl<J: Job> std::fmt::Debug for Workers<J> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let q = self.shared.lock();
        f.debug_struct("Workers")
            .field("threads", &q.threads)
            .field("idle", &q.idle)
            .field("queued", &q.jobs.len())
            .finish()
    }
}

struct Shared<J> {
    queue: Mutex<Queue<J>>,
    wake: Condvar,
    max: usize,
}

struct Queue<J> {
    jobs: VecDeque<J>,
    threads: usize,
    idle: usize,
    stop: bool,
}

impl<J> Shared<J> {
    fn lock(&self) -> MutexGuard<'_, Queue<J>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<J: Job> Workers<J> {
    /// Workers for at most `max` jobs at once (at least one).
    pub fn new(max: usize) -> Self {
        Workers {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue {
                    jobs: VecDeque::new(),
                    threads: 0,
                    idle: 0,
                    stop: false,
                }),
                wake: Condvar::new(),
                max: max.max(1),
            }),
            threads: Mutex::new(Vec::new()),
        }
    }

    /// Queues `job`; a worker runs it.
    pub fn run(&self, job: J) {
        let mut q = self.shared.lock();
        q.jobs.push_back(job);
        // Each idle worker will take one of the queued jobs (a woken one stays counted idle
        // until it runs): start a thread only for the jobs beyond them.
        if q.jobs.len() <= q.idle {
            drop(q);
            self.shared.wake.notify_one();
            return;
        }
        if q.threads < self.shared.max {
            q.threads += 1;
            let n = q.threads;
            drop(q);
            self.spawn(n);
        }
        // Otherwise every worker is busy: the job waits for the first one free.
    }

    fn spawn(&self, n: usize) {
        let shared = self.shared.clone();
        let spawned = thread::Builder::new()
            .name(format!("edgevol-blk-{n}"))
            .spawn(move || work(&shared));
        match spawned {
            Ok(handle) => self
                .threads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(handle),
            Err(e) => {
                // The queued job waits for a running worker; with none at all, run it here.
                tracing::error!(%e, "I/O worker thread not started");
                let mut q = self.shared.lock();
                q.threads -= 1;
                if q.threads == 0 {
                    let jobs: Vec<J> = q.jobs.drain(..).collect();
                    drop(q);
                    jobs.into_iter().for_each(Job::run);
                }
            }
        }
    }

    /// Threads started so far.
    pub fn threads(&self) -> usize {
        self.shared.lock().threads
    }
}

fn work<J: Job>(shared: &Shared<J>) {
    let mut q = shared.lock();
    loop {
        if let Some(job) = q.jobs.pop_front() {
            drop(q);
            job.run();
            q = shared.lock();
            continue;
        }
        if q.stop {
            return;
        }
        q.idle += 1;
        q = shared.wake.wait(q).unwrap_or_else(|p| p.into_inner());
        q.idle -= 1;
    }
}

impl<J: Job> Drop for Workers<J> {
    /// Runs what is queued, then stops the threads.
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

/// Where a queue's finished jobs come back: a list whose memory is kept, and a wake-up for the
/// queue's task.
#[derive(Debug)]
pub struct Replies<T> {
    done: Mutex<Vec<T>>,
    notify: Notify,
}

impl<T> Default for Replies<T> {
    fn default() -> Self {
        Replies {
            done: Mutex::new(Vec::new()),
            notify: Notify::new(),
        }
    }
}

impl<T> Replies<T> {
    /// Hands a result back and wakes the queue.
    pub fn push(&self, result: T) {
        self.done
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(result);
        self.notify.notify_one();
    }

    /// Until a result may be waiting (a push before the wait counts too).
    pub async fn ready(&self) {
        self.notify.notified().await;
    }

    /// Moves every result into `into` (which keeps its own memory, as this list does).
    pub fn take(&self, into: &mut Vec<T>) {
        into.append(&mut self.done.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    struct Blocks {
        barrier: Arc<Barrier>,
        replies: Arc<Replies<usize>>,
        n: usize,
    }

    impl Job for Blocks {
        fn run(self) {
            self.barrier.wait();
            self.replies.push(self.n);
        }
    }

    /// Jobs run concurrently up to the bound (four block on one barrier until all four run),
    /// every result comes back, and no more threads start than were needed.
    #[tokio::test]
    async fn jobs_run_at_once_up_to_the_bound_and_every_result_comes_back() {
        let workers = Workers::new(4);
        let replies = Arc::new(Replies::default());
        let barrier = Arc::new(Barrier::new(4));
        for n in 0..4 {
            workers.run(Blocks {
                barrier: barrier.clone(),
                replies: replies.clone(),
                n,
            });
        }
        let mut got = Vec::new();
        while got.len() < 4 {
            replies.ready().await;
            replies.take(&mut got);
        }
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2, 3]);
        assert_eq!(workers.threads(), 4);
        // Idle workers are reused: four more jobs start no thread.
        for n in 4..8 {
            workers.run(Blocks {
                barrier: barrier.clone(),
                replies: replies.clone(),
                n,
            });
        }
        got.clear();
        while got.len() < 4 {
            replies.ready().await;
            replies.take(&mut got);
        }
        assert_eq!(workers.threads(), 4);
    }

    struct Count(Arc<AtomicUsize>);

    impl Job for Count {
        fn run(self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Past the bound jobs queue; dropping the workers runs everything queued first.
    #[test]
    fn queued_jobs_run_before_the_workers_stop() {
        let count = Arc::new(AtomicUsize::new(0));
        let workers = Workers::new(1);
        for _ in 0..100 {
            workers.run(Count(count.clone()));
        }
        assert_eq!(workers.threads(), 1);
        drop(workers);
        assert_eq!(count.load(Ordering::SeqCst), 100);
    }
}
