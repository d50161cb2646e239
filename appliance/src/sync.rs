//! How long an acknowledged write can be exposed, and to what.
//!
//! - **A daemon crash** (kill -9, panic, OOM) loses nothing acknowledged: every write persists
//!   its mapping to the journal before it is acknowledged (core's soft commit: a journal write
//!   the OS page cache keeps when the process dies; concurrent writes share one append). The
//!   next start reopens the pool in the same [`boot_epoch`] and replays those frames.
//! - **A power cut** loses at most what the host never flushed, and of that only what the
//!   periodic [`run`] sync had not yet made durable: at most `sync_interval` (1 s by default) of
//!   writes. A host Flush or FUA write is durable when acknowledged, as before.
//!
//! The epoch is the kernel's boot id: the same across daemon restarts within one boot, new after
//! every power cycle, which is what lets core tell a process crash from a power cut at replay.

use std::sync::Arc;
use std::time::Duration;

use edgevol_core::Epoch;
use tokio::sync::Notify;

use crate::state::State;

/// Where Linux publishes the id of the current boot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The current boot's epoch, or `None` when the kernel does not say (then every write commits
/// to the journal with a device flush: slower, as safe).
pub fn boot_epoch() -> Option<Epoch> {
    match std::fs::read_to_string(BOOT_ID) {
        Ok(text) => parse_boot_id(&text),
        Err(e) => {
            tracing::warn!(path = BOOT_ID, error = %e, "no boot id: every write will flush the journal");
            None
        }
    }
}

/// A boot id (`8-4-4-4-12` hex) as 16 bytes.
fn parse_boot_id(text: &str) -> Option<Epoch> {
    let hex: Vec<u8> = text.trim().bytes().filter(|&b| b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(Epoch(out))
}

/// Syncs the pool every `interval` while anything is not durable against a power cut, until
/// `stop` is notified. An idle pool costs nothing (core's `sync` does no I/O then).
pub async fn run(state: Arc<State>, interval: Duration, stop: Arc<Notify>) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.notified() => return,
            _ = tick.tick() => {}
        }
        let state = state.clone();
        let synced = tokio::task::spawn_blocking(move || {
            let Some(pool) = state.pool() else {
                return Ok(());
            };
            let mut pool = pool.lock().map_err(|_| "pool lock poisoned".to_owned())?;
            if !pool.needs_sync() {
                return Ok(());
            }
            pool.sync().map_err(|e| format!("{e:?}"))
        })
        .await;
        match synced {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "periodic sync failed"),
            Err(e) => tracing::error!(error = %e, "periodic sync task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_ids_parse_and_garbage_does_not() {
        let e = parse_boot_id("6f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b\n").unwrap();
        assert_eq!(e.0[0], 0x6f);
        assert_eq!(e.0[15], 0x5b);
        assert_eq!(parse_boot_id("6f1c2d3e"), None);
        assert_eq!(parse_boot_id("zz1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b"), None);
    }

    #[test]
    fn this_machine_has_a_boot_id() {
        // Linux always publishes one; the daemon only runs on Linux.
        assert!(boot_epoch().is_some());
    }
}
