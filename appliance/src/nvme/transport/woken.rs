//! A future polled again only once something it waits for has woken it.
//!
//! `select!` polls every branch on every pass of the connection's loop. For the rare events (the
//! target stopping, the controller's teardown) each poll of a tokio `watch` took a lock to look
//! at its waiter: a few hundred instructions per command for nothing. [`Woken`] polls the inner
//! future with a waker of its own, which records the wake-up and passes it on to the task; until
//! that happens, polling it costs one atomic swap.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

/// `F`, polled only when it was woken since its last poll (and on its first).
pub(super) struct Woken<F> {
    inner: Pin<Box<F>>,
    flag: Arc<Flag>,
    /// The waker `inner` is polled with: `flag`'s.
    waker: Waker,
    /// The task's waker last handed to `flag` (to see, without its lock, whether it changed).
    task: Option<Waker>,
}

/// Whether the inner future was woken, and whom to wake then.
#[derive(Default)]
struct Flag {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        let task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(task) = task.as_ref() {
            task.wake_by_ref();
        }
    }
}

impl<F: Future> Woken<F> {
    pub(super) fn new(inner: F) -> Self {
        let flag = Arc::new(Flag {
            // The first poll always reaches the inner future, which registers its waker.
            woken: AtomicBool::new(true),
            task: Mutex::default(),
        });
        Woken {
            inner: Box::pin(inner),
            waker: Waker::from(flag.clone()),
            flag,
            task: None,
        }
    }
}

impl<F: Future> Future for Woken<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        if !this.task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
            let task = cx.waker().clone();
            *this
                .flag
                .task
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(task.clone());
            this.task = Some(task);
        }
        // A wake-up after this swap sets the flag again and wakes the task: none is lost.
        if !this.flag.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        this.inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts its polls; ready once `ready` is set.
    struct Counted {
        polls: Arc<AtomicUsize>,
        ready: Arc<AtomicBool>,
        waker: Arc<Mutex<Option<Waker>>>,
    }

    impl Future for Counted {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            if self.ready.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    struct TaskWakes(AtomicUsize);
    impl Wake for TaskWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn the_inner_future_is_polled_only_after_it_was_woken_and_its_wake_up_reaches_the_task() {
        let polls = Arc::new(AtomicUsize::new(0));
        let ready = Arc::new(AtomicBool::new(false));
        let inner_waker = Arc::new(Mutex::new(None::<Waker>));
        let mut f = Woken::new(Counted {
            polls: polls.clone(),
            ready: ready.clone(),
            waker: inner_waker.clone(),
        });
        let task = Arc::new(TaskWakes(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);

        // The first poll reaches it; the next ones, with no wake-up, do not.
        for _ in 0..5 {
            assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::Relaxed), 1);

        // Woken (not ready yet): the task is woken, and the next poll reaches the inner future.
        inner_waker.lock().unwrap().take().unwrap().wake();
        assert_eq!(task.0.load(Ordering::Relaxed), 1);
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 2);

        // Ready and woken: the output comes through.
        ready.store(true, Ordering::Release);
        inner_waker.lock().unwrap().take().unwrap().wake();
        assert!(Pin::new(&mut f).poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn a_watch_change_gets_through() {
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let mut f = Woken::new(async move {
            let _ = rx.changed().await;
            *rx.borrow()
        });
        assert!(futures_poll_once(&mut f).await.is_none());
        tx.send_replace(true);
        assert!(f.await);
    }

    /// Polls `f` once.
    async fn futures_poll_once<F: Future + Unpin>(f: &mut F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            Poll::Ready(match Pin::new(&mut *f).poll(cx) {
                Poll::Ready(v) => Some(v),
                Poll::Pending => None,
            })
        })
        .await
    }
}
