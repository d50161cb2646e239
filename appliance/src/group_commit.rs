//! Group commit of the control plane: concurrent CSI calls share one pool lock, one journal
//! write and one flush, and each is answered only after the flush that covers it.
//!
//! A call hands its operation to the *committer* and waits for its answer. The committer is one
//! blocking task at a time, started by the first call that finds none running (the leader; the
//! others follow). Each pass takes every operation queued so far, runs them all under one hold of
//! the pool lock with core in group-commit mode (each validates, applies and stages its records,
//! no I/O), then hard-commits everything staged once (`Pool::commit_staged`: flush data, frames,
//! flush), releases the lock, hands the answers to the runtime in one task (`deliver`) and starts
//! the next pass. Operations queued during a pass go in the next one, so the busier the control
//! plane, the larger the groups; no call waits for a timer, and no pass waits for the previous
//! pass's calls to be woken.
//!
//! Compared with a lock acquisition and a blocking-pool round trip per call, a pass costs one of
//! each for the whole group: at 100 calls in flight, threads no longer queue on the pool lock.
//!
//! Answers: an operation whose ticket the pass's commit covers gets its own result; if the
//! commit failed, every operation it covered gets the commit's error, never success. Core then
//! refuses further work after a device error, so later calls fail too until the daemon restarts
//! and recovers. An operation that staged nothing and read only durable state (its ticket was
//! committed before the pass) is answered whatever the commit did.
//!
//! A panic in an operation poisons the pool as it always did (every later call fails with
//! [`PoolUnavailable::Poisoned`]); the calls of that pass fail with
//! [`PoolUnavailable::TaskFailed`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use edgevol_core::{CommitTicket, Pool};

use crate::pool::PoolDevice;
use crate::state::{PoolUnavailable, State};

/// Why a call's commit did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitFailed {
    /// Core's commit failed (the device, or the metadata area).
    Core(edgevol_core::Error),
    /// The pool could not run the call.
    Unavailable(PoolUnavailable),
}

/// Answers a call once the commit's outcome for it is known.
pub type Answer = Box<dyn FnOnce(Result<(), CommitFailed>) + Send>;

/// A queued operation: runs on the pool (or learns why it cannot) and returns its ticket and how
/// to answer it.
pub type Job = Box<
    dyn for<'a> FnOnce(
            Result<(&'a State, &'a mut Pool<PoolDevice>), PoolUnavailable>,
        ) -> Option<(CommitTicket, Answer)>
        + Send,
>;

/// The queue of operations and whether a committer runs.
#[derive(Default)]
pub struct GroupCommit {
    queue: Mutex<Queue>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let q = self.queue();
        f.debug_struct("GroupCommit")
            .field("queued", &q.jobs.len())
            .field("running", &q.running)
            .finish()
    }
}

#[derive(Default)]
struct Queue {
    jobs: Vec<Job>,
    running: bool,
}

impl GroupCommit {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        // Updates are single pushes and swaps: a panic cannot leave one half done.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `job`; starts a committer if none runs.
    pub fn submit(&self, state: &Arc<State>, job: Job) {
        let mut q = self.queue();
        q.jobs.push(job);
        if !q.running {
            q.running = true;
            let state = state.clone();
            tokio::task::spawn_blocking(move || commit_passes(&state));
        }
    }
}

/// Clears `running` when the committer ends, also by a panic; a job queued meanwhile gets a new
/// committer.
struct Running<'a>(&'a Arc<State>);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut q = self.0.commits().queue();
        q.running = false;
        if !q.jobs.is_empty() {
            q.running = true;
            let state = self.0.clone();
            tokio::task::spawn_blocking(move || commit_passes(&state));
        }
    }
}

/// Passes until the queue is empty.
fn commit_passes(state: &Arc<State>) {
    let running = Running(state);
    loop {
        let jobs = {
            let mut q = state.commits().queue();
            if q.jobs.is_empty() {
                q.running = false;
                std::mem::forget(running);
                return;
            }
            std::mem::take(&mut q.jobs)
        };
        deliver(pass(state, jobs));
    }
}

/// Answers of one pass, each with its call's outcome.
type Outcomes = Vec<(Answer, Result<(), CommitFailed>)>;

/// Runs `jobs` under one hold of the pool lock and commits what they staged; returns how to
/// answer each (after the commit: nothing is answered before it).
fn pass(state: &State, jobs: Vec<Job>) -> Outcomes {
    let mut pool = match state.lock_pool() {
        Ok(pool) => pool,
        Err(e) => {
            jobs.into_iter().for_each(|job| drop(job(Err(e))));
            return Vec::new();
        }
    };
    // A panic unwinds with the guard held: the pool is poisoned, as for any call that panics.
    let mut answers = Vec::with_capacity(jobs.len());
    pool.set_group_commit(true);
    for job in jobs {
        answers.extend(job(Ok((state, &mut pool))));
    }
    pool.set_group_commit(false);
    let upto = pool.commit_ticket();
    let outcome = pool.commit_staged(upto);
    let outcomes = answers
        .into_iter()
        .map(|(ticket, answer)| {
            let result = match (pool.is_committed(ticket), outcome) {
                (true, _) => Ok(()),
                (false, Err(e)) => Err(CommitFailed::Core(e)),
                // Unreachable: an Ok commit covers every ticket taken before it.
                (false, Ok(())) => Err(CommitFailed::Unavailable(PoolUnavailable::TaskFailed)),
            };
            (answer, result)
        })
        .collect::<Outcomes>();
    drop(pool);
    if let Err(error) = outcome {
        tracing::error!(
            ?error,
            calls = outcomes.len(),
            "group commit of control operations failed"
        );
    }
    outcomes
}

/// Hands a pass's answers to the runtime in one task, so the committer starts its next pass at
/// once: answering wakes every waiting call, and on a busy machine the woken tasks preempt the
/// thread that wakes them; one hand-off is one cross-thread wake-up instead of one per call, and
/// the calls then wake on a worker thread, next to each other (their responses leave together).
/// Without a runtime (or once it shuts down, when the task is dropped and the calls fail with
/// [`PoolUnavailable::TaskFailed`]) they are answered here.
fn deliver(outcomes: Outcomes) {
    if outcomes.is_empty() {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(async move { answer_all(outcomes) })),
        Err(_) => answer_all(outcomes),
    }
}

fn answer_all(outcomes: Outcomes) {
    for (answer, result) in outcomes {
        // A panic in an answer (a dropped receiver does not panic) must not stop the others.
        let _ = catch_unwind(AssertUnwindSafe(|| answer(result)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Debug, PartialEq)]
    enum Failed {
        Unavailable(PoolUnavailable),
        Commit(CommitFailed),
    }

    impl From<PoolUnavailable> for Failed {
        fn from(e: PoolUnavailable) -> Self {
            Failed::Unavailable(e)
        }
    }

    impl From<CommitFailed> for Failed {
        fn from(e: CommitFailed) -> Self {
            Failed::Commit(e)
        }
    }

    async fn count(state: &Arc<State>) -> Result<usize, Failed> {
        state
            .with_pool_committed(|_, pool| Ok(pool.volume_count()))
            .await
    }

    /// A job that stages nothing and answers through `answer`.
    fn job(answer: impl FnOnce(Result<(), CommitFailed>) + Send + 'static) -> Job {
        Box::new(move |pool| {
            let (_, pool) = pool.ok()?;
            Some((pool.commit_ticket(), Box::new(answer) as Answer))
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 3)]
    async fn a_pass_does_not_wait_for_the_previous_pass_to_be_answered() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(State::new("box".into(), BTreeMap::new()));
        state.set_pool(crate::pool::open(&[dir.path().join("pool.img")], true).unwrap());
        // The first call's answer does not return before the second call is answered: answered
        // by the committer in turn, the second call's pass would never run.
        let (started_tx, started) = std::sync::mpsc::channel();
        let (second_tx, second) = std::sync::mpsc::channel::<()>();
        let (first_tx, first) = tokio::sync::oneshot::channel();
        state.commits().submit(
            &state,
            job(move |result| {
                started_tx.send(()).unwrap();
                // A guard against a hang, not a timing: a minute is "never" here.
                let second_answered = second.recv_timeout(std::time::Duration::from_secs(60));
                let _ = first_tx.send((result, second_answered.is_ok()));
            }),
        );
        tokio::task::spawn_blocking(move || started.recv().unwrap())
            .await
            .unwrap();
        state.commits().submit(
            &state,
            job(move |result| {
                assert_eq!(result, Ok(()));
                second_tx.send(()).unwrap();
            }),
        );
        let (result, second_answered) = first.await.unwrap();
        assert_eq!(result, Ok(()));
        assert!(
            second_answered,
            "the second pass waited for the first's answers"
        );
    }

    #[tokio::test]
    async fn a_panicking_operation_fails_its_call_and_poisons_the_pool_for_later_ones() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(State::new("box".into(), BTreeMap::new()));
        state.set_pool(crate::pool::open(&[dir.path().join("pool.img")], true).unwrap());
        assert_eq!(count(&state).await, Ok(0));
        let panicked: Result<(), Failed> = state
            .with_pool_committed(|_, _| panic!("injected: a bug under the pool lock"))
            .await;
        assert_eq!(
            panicked,
            Err(Failed::Unavailable(PoolUnavailable::TaskFailed))
        );
        // A committer still serves the queue, and finds the pool poisoned.
        assert_eq!(
            count(&state).await,
            Err(Failed::Unavailable(PoolUnavailable::Poisoned))
        );
    }
}
