//! The blocking side of the data path: threads that run the I/O commands an engine must not
//! wait for (Flush, FUA, write-through, Write Zeroes, Deallocate, and queued reads and writes
//! on a drive when the queue has no io_uring), so the drive sees the queue's depth while the
//! engine goes on receiving and completing.
//!
//! In place of tokio's blocking pool, which allocates a task (and a JoinSet entry) per call:
//! here a job is a plain value in a queue whose memory is kept, and its result goes back
//! through the submitting queue's [`Replies`], so a command allocates nothing. Threads start
//! when there is work and none is idle, up to a bound, and stay.
//!
//! A job that panics is caught: its reply says so (an I/O command fails with Internal Error)
//! and the worker goes on with the next job, so the target never loses a thread to a panic. A
//! panic while handing a reply back would leave a command unanswered forever, so that one ends
//! the process for its supervisor to restart.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;

use tokio::sync::Notify;

/// A unit of blocking work.
pub trait Job: Send + 'static {
    /// Does the work, on a worker thread. A panic here is caught and the worker lives on.
    fn run(&mut self);

    /// Hands the outcome back, once, after [`Job::run`]; `panicked` says `run` panicked, and
    /// the reply must then report a failure. Keep it to moves and a push: it must not panic.
    fn reply(self, panicked: bool);
}

/// Runs `job` and hands its reply back, whatever `run` does.
fn run_caught<J: Job>(mut job: J, #[cfg(test)] panic: bool) {
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        #[cfg(test)]
        if panic {
            panic!("injected panic in a worker job");
        }
        job.run();
    }));
    if ran.is_err() {
        tracing::error!("an I/O worker job panicked: it fails, the worker goes on");
    }
    let replied =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.reply(ran.is_err())));
    if replied.is_err() {
        // The command can never be answered and its queue would wait for it forever: better
        // a restart, which recovers the pool from its journal, than a hung connection.
        tracing::error!("an I/O worker job panicked handing its reply back: exiting");
        std::process::exit(i32::from(PANIC_EXIT));
    }
}

/// The exit status when a panic leaves the daemon unable to go on (EX_SOFTWARE).
pub const PANIC_EXIT: u8 = 70;

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
    /// Test builds: the next job panics in place of running.
    #[cfg(test)]
    panic_next: std::sync::atomic::AtomicBool,
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
                #[cfg(test)]
                panic_next: std::sync::atomic::AtomicBool::new(false),
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
                    for job in jobs {
                        self.shared.run(job);
                    }
                }
            }
        }
    }

    /// Threads started so far.
    pub fn threads(&self) -> usize {
        self.shared.lock().threads
    }

    /// Test builds: worker threads that have ended (none should before the workers drop).
    #[cfg(test)]
    pub fn ended_threads(&self) -> usize {
        let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        threads.iter().filter(|t| t.is_finished()).count()
    }

    /// Test builds: the next job a worker takes panics before it runs (its reply says so).
    #[cfg(test)]
    pub fn panic_next_job(&self) {
        self.shared
            .panic_next
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl<J: Job> Shared<J> {
    /// Runs one job on this thread.
    fn run(&self, job: J) {
        run_caught(
            job,
            #[cfg(test)]
            self.panic_next
                .swap(false, std::sync::atomic::Ordering::SeqCst),
        );
    }
}

fn work<J: Job>(shared: &Shared<J>) {
    let mut q = shared.lock();
    loop {
        if let Some(job) = q.jobs.pop_front() {
            drop(q);
            shared.run(job);
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
        fn run(&mut self) {
            self.barrier.wait();
        }

        fn reply(self, panicked: bool) {
            assert!(!panicked);
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
        fn run(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }

        fn reply(self, _: bool) {}
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

    /// Answers whether it panicked; panics in `run` when told to.
    struct Outcome {
        panic: bool,
        replies: Arc<Replies<(usize, bool)>>,
        n: usize,
    }

    impl Job for Outcome {
        fn run(&mut self) {
            if self.panic {
                panic!("job {} panics", self.n);
            }
        }

        fn reply(self, panicked: bool) {
            self.replies.push((self.n, panicked));
        }
    }

    async fn next(replies: &Replies<(usize, bool)>) -> (usize, bool) {
        let mut got = Vec::new();
        while got.is_empty() {
            replies.ready().await;
            replies.take(&mut got);
        }
        assert_eq!(got.len(), 1);
        got[0]
    }

    /// A job that panics still replies, saying so; the worker that ran it lives and runs the
    /// next jobs (no new thread starts), whether the panic is the job's own or injected.
    #[tokio::test]
    async fn a_panicking_job_replies_and_its_worker_lives() {
        let workers = Workers::new(1);
        let replies = Arc::new(Replies::default());
        let job = |n, panic| Outcome {
            panic,
            replies: replies.clone(),
            n,
        };
        workers.run(job(0, false));
        assert_eq!(next(&replies).await, (0, false));
        assert_eq!(workers.threads(), 1);
        workers.run(job(1, true));
        assert_eq!(next(&replies).await, (1, true));
        workers.panic_next_job();
        workers.run(job(2, false));
        assert_eq!(next(&replies).await, (2, true));
        workers.run(job(3, false));
        assert_eq!(next(&replies).await, (3, false));
        assert_eq!(workers.threads(), 1, "no thread lost, none added");
        assert_eq!(workers.ended_threads(), 0);
    }

    struct PanicsReplying;

    impl Job for PanicsReplying {
        fn run(&mut self) {}

        fn reply(self, _: bool) {
            panic!("a reply that panics");
        }
    }

    const CHILD: &str = "EDGEVOL_TEST_REPLY_PANIC_CHILD";

    /// A reply that panics (a command that can never be answered) ends the process with
    /// [`PANIC_EXIT`]. Runs itself in a child process, which is the one that exits.
    #[test]
    fn a_panicking_reply_exits_the_process() {
        if std::env::var_os(CHILD).is_some() {
            let workers = Workers::new(1);
            workers.run(PanicsReplying);
            drop(workers);
            unreachable!("the worker exits the process");
        }
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "nvme::workers::tests::a_panicking_reply_exits_the_process",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(i32::from(PANIC_EXIT)));
    }
}

#[cfg(test)]
mod panic_tests;
