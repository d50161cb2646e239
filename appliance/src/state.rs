//! The appliance's identity and its pool handle: what the CSI services, the NVMe/TCP target,
//! the metrics exporter and the periodic sync share.
//!
//! This module imports nothing of the services above it (no gRPC, NVMe or metrics type): pool
//! calls fail with [`PoolUnavailable`] or with the closure's own error, and each side maps those
//! to its wire status in one place (`csi::status`, `nvme::status`). The daemon hands the other
//! shared handles (the target's access hooks, the counters, the metrics registry) to the parts
//! that need them.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use edgevol_core::Pool;

use crate::group_commit::{Answer, CommitFailed, GroupCommit};
use crate::pool::PoolDevice;

/// Why a pool call did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolUnavailable {
    /// The pool is still opening (recovery after a start): retry shortly.
    NotReady,
    /// An earlier call panicked while holding the pool: its in-memory state is unknown, so it
    /// serves nothing more until the daemon restarts (recovery then replays the journal).
    Poisoned,
    /// The blocking task running the call did not finish (it panicked, or the runtime is
    /// shutting down).
    TaskFailed,
}

impl fmt::Display for PoolUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoolUnavailable::NotReady => "the pool is still opening",
            PoolUnavailable::Poisoned => {
                "the pool lock was poisoned by a panic; edgevold must be restarted"
            }
            PoolUnavailable::TaskFailed => "the pool task did not finish",
        })
    }
}

impl std::error::Error for PoolUnavailable {}

/// The pool did not open within the time a caller gave it ([`State::wait_ready`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReadyWithin {
    /// The appliance whose pool was awaited.
    pub appliance_id: String,
    /// How long the caller waited.
    pub waited: Duration,
}

impl fmt::Display for NotReadyWithin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the pool of appliance {:?} did not open and recover within {:?}",
            self.appliance_id, self.waited
        )
    }
}

impl std::error::Error for NotReadyWithin {}

/// Told how long a successful pool call held the pool (see [`observe_holds`]).
pub type HoldObserver = Arc<dyn Fn(Duration) + Send + Sync>;

tokio::task_local! {
    static HOLD_OBSERVER: HoldObserver;
}

/// Runs `fut` with `observer` told how long each successful pool call it makes held the pool
/// (for [`State::with_pool_committed`]: staged and committed, the wait for the group commit
/// included). The metrics layer wraps mutating CSI calls in it: that is their metadata commit.
pub async fn observe_holds<F: Future>(observer: HoldObserver, fut: F) -> F::Output {
    HOLD_OBSERVER.scope(observer, fut).await
}

/// The appliance's shared state: who it is, and its pool once open.
#[derive(Debug)]
pub struct State {
    /// This appliance's id.
    pub appliance_id: String,
    /// Its topology segments, the appliance segment included.
    pub topology: BTreeMap<String, String>,
    /// The pool, once opened and recovered.
    pool: OnceLock<Mutex<Pool<PoolDevice>>>,
    /// Turns true when `pool` is set: what [`State::wait_ready`] awaits.
    opened: tokio::sync::watch::Sender<bool>,
    /// Whether the poisoned lock was logged (once: every later call finds it poisoned).
    poison_logged: AtomicBool,
    /// Group commit of the calls that stage (`with_pool_committed`).
    commits: GroupCommit,
}

impl State {
    /// A state whose pool is still opening.
    pub fn new(appliance_id: String, topology: BTreeMap<String, String>) -> Self {
        State {
            appliance_id,
            topology,
            pool: OnceLock::new(),
            opened: tokio::sync::watch::Sender::new(false),
            poison_logged: AtomicBool::new(false),
            commits: GroupCommit::default(),
        }
    }

    /// Whether the pool is open and recovered: what CSI Probe reports.
    pub fn is_ready(&self) -> bool {
        self.pool.get().is_some()
    }

    /// Waits until the pool is open and recovered ([`is_ready`](Self::is_ready)), for at most
    /// `timeout`: there is no wait without a deadline, and the error says what was awaited.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), NotReadyWithin> {
        let mut opened = self.opened.subscribe();
        // `wait_for` looks at the current value first; the sender lives in `self`, so it cannot
        // close while we wait.
        let open = matches!(
            tokio::time::timeout(timeout, opened.wait_for(|&open| open)).await,
            Ok(Ok(_))
        );
        if open {
            return Ok(());
        }
        Err(NotReadyWithin {
            appliance_id: self.appliance_id.clone(),
            waited: timeout,
        })
    }

    /// Installs the opened pool; from now on the appliance is ready.
    pub fn set_pool(&self, pool: Pool<PoolDevice>) {
        if self.pool.set(Mutex::new(pool)).is_err() {
            tracing::error!("pool opened twice; keeping the first");
        }
        self.opened.send_replace(true);
    }

    /// The pool's mutex, if open (for callers that manage the lock themselves).
    pub fn pool(&self) -> Option<&Mutex<Pool<PoolDevice>>> {
        self.pool.get()
    }

    /// Locks the pool on this thread (a blocking call: never on the reactor).
    pub fn lock_pool(&self) -> Result<MutexGuard<'_, Pool<PoolDevice>>, PoolUnavailable> {
        let pool = self.pool.get().ok_or(PoolUnavailable::NotReady)?;
        pool.lock().map_err(|_| {
            if !self.poison_logged.swap(true, Ordering::Relaxed) {
                tracing::error!("{}", PoolUnavailable::Poisoned);
            }
            PoolUnavailable::Poisoned
        })
    }

    /// Runs `f` on the pool on the blocking pool (core commits flush the device), one call at a
    /// time: calls on the pool are serialized, so two calls on the same volume never interleave.
    /// Fails with `f`'s error, or with [`PoolUnavailable`] converted into it.
    pub async fn with_pool<T, E, F>(self: &Arc<Self>, f: F) -> Result<T, E>
    where
        F: FnOnce(&State, &mut Pool<PoolDevice>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<PoolUnavailable> + Send + 'static,
    {
        let observer = HOLD_OBSERVER.try_with(Clone::clone).ok();
        self.spawn_on_pool(move |state, pool| {
            let started = Instant::now();
            let result = f(state, pool);
            if let (Some(observe), Ok(_)) = (observer, &result) {
                observe(started.elapsed());
            }
            result
        })
        .await
    }

    /// [`State::with_pool`] for the control plane: `f` runs with the other calls in flight under
    /// one hold of the pool, its control operations staged (core's group commit), and the call
    /// returns once the one hard commit covering them all has finished ([`crate::group_commit`]).
    /// Every call waits, reads and refusals too: what it answers may rest on another call's
    /// staged record, which must not be shown before it is durable. Fails with `f`'s error, or
    /// the commit's, or [`PoolUnavailable`].
    pub async fn with_pool_committed<T, E, F>(self: &Arc<Self>, f: F) -> Result<T, E>
    where
        F: FnOnce(&State, &mut Pool<PoolDevice>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<PoolUnavailable> + From<CommitFailed> + Send + 'static,
    {
        if !self.is_ready() {
            return Err(PoolUnavailable::NotReady.into());
        }
        let observer = HOLD_OBSERVER.try_with(Clone::clone).ok();
        let started = Instant::now();
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<T, E>>();
        self.commits.submit(
            self,
            Box::new(move |pool| match pool {
                Err(e) => {
                    let _ = tx.send(Err(e.into()));
                    None
                }
                Ok((state, pool)) => {
                    let result = f(state, pool);
                    let answer: Answer = Box::new(move |committed| {
                        // The call may have been cancelled: nobody to answer then.
                        let _ = tx.send(committed.map_err(E::from).and(result));
                    });
                    Some((pool.commit_ticket(), answer))
                }
            }),
        );
        let result = rx
            .await
            .unwrap_or_else(|_| Err(PoolUnavailable::TaskFailed.into()));
        if let (Some(observe), Ok(_)) = (observer, &result) {
            observe(started.elapsed());
        }
        result
    }

    pub(crate) fn commits(&self) -> &GroupCommit {
        &self.commits
    }

    async fn spawn_on_pool<T, E, F>(self: &Arc<Self>, f: F) -> Result<T, E>
    where
        F: FnOnce(&State, &mut Pool<PoolDevice>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<PoolUnavailable> + Send + 'static,
    {
        if !self.is_ready() {
            return Err(PoolUnavailable::NotReady.into());
        }
        let state = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut pool = state.lock_pool()?;
            f(&state, &mut pool)
        })
        .await
        .unwrap_or_else(|_| Err(PoolUnavailable::TaskFailed.into()))
    }

    /// [`State::with_pool`] for a call that cannot fail by itself: only the pool may be
    /// unavailable.
    pub async fn on_pool<T, F>(self: &Arc<Self>, f: F) -> Result<T, PoolUnavailable>
    where
        F: FnOnce(&State, &mut Pool<PoolDevice>) -> T + Send + 'static,
        T: Send + 'static,
    {
        self.with_pool(move |state, pool| Ok(f(state, pool))).await
    }
}

/// Now, as nanoseconds since the Unix epoch: what core stores as creation times.
pub fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn opened() -> (tempfile::TempDir, Arc<State>) {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(State::new("box".into(), BTreeMap::new()));
        state.set_pool(crate::pool::open(&[dir.path().join("pool.img")], true).unwrap());
        (dir, state)
    }

    #[tokio::test]
    async fn calls_before_the_pool_opens_are_not_ready() {
        let state = Arc::new(State::new("box".into(), BTreeMap::new()));
        assert_eq!(
            state.on_pool(|_, pool| pool.volume_count()).await,
            Err(PoolUnavailable::NotReady)
        );
        assert_eq!(state.lock_pool().err(), Some(PoolUnavailable::NotReady));
    }

    #[tokio::test]
    async fn waiting_for_the_pool_ends_when_it_opens_or_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(State::new("box".into(), BTreeMap::new()));
        // Nobody opens it: the deadline ends the wait, and the error names what was awaited.
        let e = state
            .wait_ready(Duration::from_millis(20))
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the pool of appliance \"box\" did not open and recover within 20ms"
        );
        // Opened while a caller waits with an hour to go: the wait ends then.
        let waiter = {
            let state = state.clone();
            tokio::spawn(async move { state.wait_ready(Duration::from_secs(3600)).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        state.set_pool(crate::pool::open(&[dir.path().join("pool.img")], true).unwrap());
        tokio::time::timeout(Duration::from_secs(60), waiter)
            .await
            .expect("woken when the pool opened")
            .unwrap()
            .unwrap();
        // Already open: no wait at all.
        state.wait_ready(Duration::ZERO).await.unwrap();
    }

    #[tokio::test]
    async fn a_panicking_call_fails_and_poisons_the_pool_for_later_ones() {
        let (_dir, state) = opened();
        assert_eq!(state.on_pool(|_, pool| pool.volume_count()).await, Ok(0));
        let panicked = state
            .on_pool(|_, _| -> usize { panic!("injected: a bug under the pool lock") })
            .await;
        assert_eq!(panicked, Err(PoolUnavailable::TaskFailed));
        assert_eq!(
            state.on_pool(|_, pool| pool.volume_count()).await,
            Err(PoolUnavailable::Poisoned)
        );
        assert_eq!(state.lock_pool().err(), Some(PoolUnavailable::Poisoned));
    }

    #[tokio::test]
    async fn observed_holds_are_the_successful_calls_of_the_scope() {
        let (_dir, state) = opened();
        let seen = Arc::new(AtomicU32::new(0));
        let counter = seen.clone();
        let observer: HoldObserver = Arc::new(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        let s = state.clone();
        observe_holds(observer, async move {
            s.on_pool(|_, pool| pool.volume_count()).await.unwrap();
            let refused: Result<(), PoolUnavailable> =
                s.with_pool(|_, _| Err(PoolUnavailable::NotReady)).await;
            assert!(refused.is_err());
        })
        .await;
        // Outside the scope: not observed.
        state.on_pool(|_, pool| pool.volume_count()).await.unwrap();
        assert_eq!(seen.load(Ordering::Relaxed), 1);
    }
}
