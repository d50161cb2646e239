//! The daemon's background tasks whose failure means it cannot go on: it stops, and exits
//! non-zero for its supervisor to restart it, rather than run on without them (a pool that
//! never opens answers "not ready" forever; a dead health check never confirms a trial).

use std::future::pending;

use tokio::sync::Notify;
use tokio::task::{JoinError, JoinHandle};

use super::DaemonError;

/// The handles of the watched tasks, taken (`None`) once ended.
pub(super) struct Watched {
    /// Opens the pool and makes it ready; ends at once.
    pub(super) pool_open: Option<JoinHandle<Result<(), DaemonError>>>,
    /// The firmware health supervisor, which ends only to reboot.
    pub(super) health: Option<JoinHandle<()>>,
    /// The periodic sync, which ends only when told to, after the server.
    pub(super) sync: Option<JoinHandle<()>>,
}

impl Watched {
    /// Until `stop` is notified (`None`), or a watched task fails (the error that ends the
    /// daemon).
    pub(super) async fn until_stop_or_failure(&mut self, stop: &Notify) -> Option<DaemonError> {
        loop {
            tokio::select! {
                () = stop.notified() => return None,
                opened = ended(&mut self.pool_open) => match opened {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Some(e),
                    Err(e) => return Some(panicked("pool open", e)),
                },
                // Ending normally, it has asked for a reboot: let that happen.
                supervised = ended(&mut self.health) => {
                    if let Err(e) = supervised {
                        return Some(panicked("firmware health supervisor", e));
                    }
                }
                // Unflushed writes would no longer become durable every interval.
                synced = ended(&mut self.sync) => return Some(match synced {
                    Ok(()) => DaemonError::Task("periodic sync ended".to_owned()),
                    Err(e) => panicked("periodic sync", e),
                }),
            }
        }
    }
}

impl Watched {
    /// Once told to stop: until the periodic sync has (`None` if it had already ended).
    pub(super) async fn sync_stopped(&mut self) -> Option<Result<(), DaemonError>> {
        let sync = self.sync.take()?;
        Some(sync.await.map_err(|e| panicked("periodic sync", e)))
    }
}

/// Until the task in `slot` ends (never, if none), which empties the slot.
async fn ended<T>(slot: &mut Option<JoinHandle<T>>) -> Result<T, JoinError> {
    let Some(handle) = slot else {
        return pending().await;
    };
    let result = handle.await;
    *slot = None;
    result
}

/// A task that ended by a panic (or was cancelled, which nothing here does).
pub(super) fn panicked(task: &'static str, error: JoinError) -> DaemonError {
    let message = match error.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_owned()),
        Err(e) => e.to_string(),
    };
    DaemonError::Panicked { task, message }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn watched(health: JoinHandle<()>, sync: JoinHandle<()>) -> Watched {
        Watched {
            pool_open: Some(tokio::spawn(async { Ok(()) })),
            health: Some(health),
            sync: Some(sync),
        }
    }

    /// A health supervisor that panics stops the daemon with the panic.
    #[tokio::test]
    async fn a_panicking_health_supervisor_is_fatal() {
        let mut w = watched(
            tokio::spawn(async { panic!("health probe bug") }),
            tokio::spawn(pending()),
        );
        match w.until_stop_or_failure(&Notify::new()).await {
            Some(DaemonError::Panicked { task, message }) => {
                assert_eq!(task, "firmware health supervisor");
                assert_eq!(message, "health probe bug");
            }
            other => panic!("want Panicked, got {other:?}"),
        }
    }

    /// A health supervisor that ends (it asked for a reboot) and a pool that opened are not
    /// failures: the daemon runs until told to stop.
    #[tokio::test]
    async fn ended_health_and_an_opened_pool_wait_for_the_stop() {
        let stop_sync = Arc::new(Notify::new());
        let told = stop_sync.clone();
        let sync = tokio::spawn(async move { told.notified().await });
        let mut w = watched(tokio::spawn(async {}), sync);
        let stop = Arc::new(Notify::new());
        let later = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            later.notify_one();
        });
        assert!(w.until_stop_or_failure(&stop).await.is_none());
        assert!(
            w.pool_open.is_none() && w.health.is_none(),
            "both seen to end"
        );
        stop_sync.notify_one();
        assert!(
            matches!(w.sync_stopped().await, Some(Ok(()))),
            "sync still running, then stopped"
        );
    }

    /// The periodic sync panicking, or ending before it was told to, is fatal.
    #[tokio::test]
    async fn a_sync_that_ends_or_panics_is_fatal() {
        let mut w = watched(
            tokio::spawn(pending()),
            tokio::spawn(async { panic!("{}", String::from("sync bug")) }),
        );
        match w.until_stop_or_failure(&Notify::new()).await {
            Some(DaemonError::Panicked { task, message }) => {
                assert_eq!((task, message.as_str()), ("periodic sync", "sync bug"));
            }
            other => panic!("want Panicked, got {other:?}"),
        }
        let mut w = watched(tokio::spawn(pending()), tokio::spawn(async {}));
        assert!(matches!(
            w.until_stop_or_failure(&Notify::new()).await,
            Some(DaemonError::Task(_))
        ));
    }
}
