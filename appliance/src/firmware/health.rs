//! The health check that decides a trial boot, and the watchdog it feeds.
//!
//! [`Trial`] is the decision, without I/O or clock: fed one probe result per tick, it confirms
//! after `hold` of uninterrupted health and fails after `max_failures` failed probes in a row
//! (a daemon that never gets healthy is failed with a reason, not only by the watchdog). [`supervise`] runs the
//! probes (pool open, the CSI server running, the NVMe/TCP listener accepting; CSI is not
//! probed by connecting: its TLS layer would log every probe as a failed handshake), pets the
//! watchdog after each healthy
//! probe only, and acts on the verdict: confirm the slot, or record why it failed and reboot.
//!
//! The watchdog is armed (opened) at the first healthy probe, not at start: opening starts its
//! timer (30 s on the i6300esb), and a daemon still opening its pool (a first-boot format of a
//! large drive runs for minutes) would be reset before it ever was healthy, and on a first boot
//! reset again and again. Until then init's ready wait is the guard (a daemon silent for 120 s
//! is failed, on a trial boot rolled back).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgevol_firmware::dir_media::DirMedia;
use edgevol_firmware::manager::Firmware;
use edgevol_firmware::slots::Reason;

use super::watchdog::Watchdog;
use super::Reboot;
use crate::state::State;

/// Time between probes (and watchdog pets).
pub const TICK: Duration = Duration::from_secs(1);
/// Failed probes in a row that fail a trial: two minutes, as long as init waits for a silent
/// daemon to become ready. A pool on a slow or busy drive takes seconds to open (over 10 s seen
/// under TCG), and that is not a reason to throw an update away.
pub const MAX_FAILURES: u32 = 120;

/// What a trial boot should do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Keep probing.
    Pending,
    /// Healthy for long enough: keep this slot.
    Confirm,
    /// Give up: roll back, for this reason.
    Fail(String),
}

/// A trial's progress.
#[derive(Debug)]
pub struct Trial {
    hold: Duration,
    healthy_for: Duration,
    failures: u32,
    max_failures: u32,
}

impl Trial {
    /// Confirms after `hold` of health; fails after `max_failures` failed probes in a row.
    pub fn new(hold: Duration, max_failures: u32) -> Trial {
        Trial {
            hold,
            healthy_for: Duration::ZERO,
            failures: 0,
            max_failures,
        }
    }

    /// One probe, `tick` after the previous one.
    pub fn observe(&mut self, probe: Result<(), String>, tick: Duration) -> Verdict {
        match probe {
            Ok(()) => {
                self.failures = 0;
                self.healthy_for += tick;
                if self.healthy_for >= self.hold {
                    Verdict::Confirm
                } else {
                    Verdict::Pending
                }
            }
            Err(why) => {
                self.healthy_for = Duration::ZERO;
                self.failures += 1;
                if self.failures >= self.max_failures {
                    Verdict::Fail(why)
                } else {
                    Verdict::Pending
                }
            }
        }
    }
}

/// What is probed.
#[derive(Debug, Clone)]
pub struct Probes {
    /// The pool (open or not).
    pub state: Arc<State>,
    /// Whether the CSI server is serving (set by its task).
    pub csi_serving: Arc<AtomicBool>,
    /// The NVMe/TCP endpoint.
    pub nvme: SocketAddr,
}

impl Probes {
    /// Every check once; the first failure named.
    pub async fn run(&self) -> Result<(), String> {
        if !self.state.is_ready() {
            return Err("pool not open".into());
        }
        if !self.csi_serving.load(Ordering::Acquire) {
            return Err("CSI server not serving".into());
        }
        let addr = self.nvme;
        match tokio::time::timeout(TICK, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("NVMe/TCP target not accepting on {addr}: {e}")),
            Err(_) => Err(format!(
                "NVMe/TCP target not accepting on {addr} within {TICK:?}"
            )),
        }
    }
}

/// Probes forever: arms the `watchdog_device` at the first healthy probe and pets it while
/// healthy; on a trial boot, confirms the slot or fails it and reboots.
pub async fn supervise(
    firmware: Arc<Mutex<Firmware<DirMedia>>>,
    probes: Probes,
    hold: Duration,
    mut watchdog_device: Option<PathBuf>,
    reboot: Reboot,
) {
    let mut watchdog: Option<Watchdog> = None;
    let on_trial = firmware.lock().map(|f| f.on_trial()).unwrap_or(false);
    let mut trial = on_trial.then(|| Trial::new(hold, MAX_FAILURES));
    if on_trial {
        tracing::info!(
            hold_s = hold.as_secs(),
            "firmware: trial boot, health check running"
        );
    }
    let mut interval = tokio::time::interval(TICK);
    loop {
        interval.tick().await;
        let probe = probes.run().await;
        if probe.is_ok() {
            // Once: a device that cannot be opened is logged, not retried every second.
            if let Some(path) = watchdog_device.take() {
                watchdog = Watchdog::arm(&path);
            }
            if let Some(dog) = &mut watchdog {
                if let Err(e) = dog.pet() {
                    tracing::error!(error = %e, "watchdog: pet failed");
                }
            }
        }
        let Some(t) = &mut trial else { continue };
        match t.observe(probe, TICK) {
            Verdict::Pending => {}
            Verdict::Confirm => {
                trial = None;
                let fw = firmware.clone();
                let confirmed = tokio::task::spawn_blocking(move || {
                    fw.lock().map_err(|_| None)?.confirm().map_err(Some)
                })
                .await;
                match confirmed {
                    Ok(Ok(())) => {
                        tracing::info!("firmware: trial healthy, slot confirmed");
                        // Committed: the pool may now get the features this build writes.
                        let (state, fw) = (probes.state.clone(), firmware.clone());
                        let _ = tokio::task::spawn_blocking(move || {
                            crate::pool_features::enable_wanted(&state, Some(&fw))
                        })
                        .await;
                    }
                    Ok(Err(e)) => {
                        tracing::error!(error = ?e.map(|e| e.to_string()), "firmware: confirm failed")
                    }
                    Err(e) => tracing::error!(error = %e, "firmware: confirm task failed"),
                }
            }
            Verdict::Fail(why) => {
                tracing::error!(reason = %why, "firmware: trial failed its health check, rolling back");
                let fw = firmware.clone();
                let reason = Reason::HealthCheckFailed(why);
                let failed = tokio::task::spawn_blocking(move || {
                    fw.lock()
                        .map_err(|_| None)?
                        .fail_trial(reason)
                        .map_err(Some)
                })
                .await;
                if let Ok(Err(e)) = &failed {
                    tracing::error!(error = ?e.as_ref().map(|e| e.to_string()), "firmware: recording the failure failed");
                }
                // Recorded or not, the previous slot boots next: the loader's boot-once is spent.
                reboot.now();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn confirms_after_the_hold_of_uninterrupted_health() {
        let mut t = Trial::new(Duration::from_secs(3), 5);
        assert_eq!(t.observe(Ok(()), S), Verdict::Pending);
        assert_eq!(t.observe(Ok(()), S), Verdict::Pending);
        // A failure restarts the hold.
        assert_eq!(t.observe(Err("x".into()), S), Verdict::Pending);
        assert_eq!(t.observe(Ok(()), S), Verdict::Pending);
        assert_eq!(t.observe(Ok(()), S), Verdict::Pending);
        assert_eq!(t.observe(Ok(()), S), Verdict::Confirm);
    }

    #[test]
    fn fails_after_consecutive_failures_with_the_last_reason() {
        let mut t = Trial::new(Duration::from_secs(60), 3);
        assert_eq!(t.observe(Err("a".into()), S), Verdict::Pending);
        assert_eq!(t.observe(Ok(()), S), Verdict::Pending);
        assert_eq!(t.observe(Err("b".into()), S), Verdict::Pending);
        assert_eq!(t.observe(Err("c".into()), S), Verdict::Pending);
        assert_eq!(
            t.observe(Err("NVMe/TCP target not accepting".into()), S),
            Verdict::Fail("NVMe/TCP target not accepting".into())
        );
    }
}
