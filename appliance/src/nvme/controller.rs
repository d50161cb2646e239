//! One controller (Linux `struct nvmet_ctrl`): who it belongs to, its registers (CC/CSTS), its
//! features, its keep-alive clock, its pending asynchronous events and its error log. Pure
//! state: the queue tasks lock it briefly, never across I/O.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use edgevol_core::VolumeId;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::errors::ErrorLog;

/// Most I/O queues one controller may have (Set Features Number of Queues is capped here).
pub const MAX_IO_QUEUES: u16 = 16;
/// Largest queue (sqsize + 1) a host may create: CAP.MQES + 1.
pub const MAX_QUEUE_SIZE: u16 = 128;
/// Keep-alive of a discovery controller whose host asked for none (`NVMET_DISC_KATO_MS`).
pub const DISCOVERY_KATO: Duration = Duration::from_secs(120);
/// Outstanding Async Event Requests allowed (AERL + 1).
pub const MAX_AERS: usize = 4;

/// Controller registers (NVMe base spec, "Controller Registers").
pub mod reg {
    /// Controller Capabilities.
    pub const CAP: u32 = 0x00;
    /// Version.
    pub const VS: u32 = 0x08;
    /// Controller Configuration.
    pub const CC: u32 = 0x14;
    /// Controller Status.
    pub const CSTS: u32 = 0x1c;
    /// NVM Subsystem Reset.
    pub const NSSR: u32 = 0x20;
}

/// The version we report: NVMe 1.4.
pub const VERSION: u32 = 0x0001_0400;

/// Feature identifiers served.
pub mod fid {
    /// Volatile Write Cache.
    pub const VOLATILE_WC: u8 = 0x06;
    /// Number of Queues.
    pub const NUM_QUEUES: u8 = 0x07;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT: u8 = 0x0b;
    /// Keep Alive Timer.
    pub const KATO: u8 = 0x0f;
}

/// Async event configuration bit: Namespace Attribute Notices (also the OAES bit).
pub const AEN_NS_ATTR: u32 = 1 << 8;

/// Async event completion result for "namespace attribute changed": type Notice (2), info 0,
/// log page Changed Namespace List (04h).
pub const AEN_RESULT_NS_CHANGED: u32 = 0x02 | (0x04 << 16);

/// What a controller serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The discovery controller.
    Discovery,
    /// A volume's I/O subsystem.
    Volume {
        /// The volume.
        id: VolumeId,
        /// The host may only read.
        readonly: bool,
    },
}

/// CAP: MQES, CQR, TO = 7.5 s, CSS = NVM command set, MPSMIN = MPSMAX = 4 KiB.
pub const fn cap() -> u64 {
    (MAX_QUEUE_SIZE as u64 - 1) | (1 << 16) | (15 << 24) | (1 << 37)
}

const CC_EN: u32 = 1;
const CSTS_RDY: u32 = 1;
const CSTS_CFS: u32 = 1 << 1;
const CSTS_SHST_COMPLETE: u32 = 2 << 2;

/// What a CC write asked the controller to do, beyond storing the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CcEffect {
    /// Nothing more.
    None,
    /// Shutdown notification: make everything durable.
    Shutdown,
}

/// Mutable controller state.
#[derive(Debug)]
pub struct Registers {
    /// Controller Configuration.
    pub cc: u32,
    /// Controller Status.
    pub csts: u32,
    /// Keep-alive timeout (None: disabled).
    pub kato: Option<Duration>,
    /// Asynchronous Event Configuration.
    pub aec: u32,
    /// Volatile write cache enabled.
    pub wce: bool,
    /// I/O queues granted (Number of Queues).
    pub io_queues: u16,
    /// I/O queues connected.
    pub connected: BTreeSet<u16>,
    /// Last command seen on any queue.
    pub last_activity: Instant,
    /// Events waiting for an Async Event Request.
    pub events: VecDeque<u32>,
    /// Namespace-attribute events are masked until the Changed NS List is read.
    pub ns_attr_masked: bool,
    /// Namespaces changed since the log was last read.
    pub changed: BTreeSet<u32>,
}

impl Registers {
    /// Applies a CC write (Linux `nvmet_update_cc`).
    pub fn write_cc(&mut self, value: u32) -> CcEffect {
        let old = self.cc;
        self.cc = value;
        let enabled = value & CC_EN != 0;
        if enabled && old & CC_EN == 0 {
            // IOSQES 6 (64 bytes), IOCQES 4 (16 bytes), MPS 4 KiB, CSS NVM: else Fatal.
            let iosqes = (value >> 16) & 0xf;
            let iocqes = (value >> 20) & 0xf;
            let mps = (value >> 7) & 0xf;
            let css = (value >> 4) & 0x7;
            if iosqes != 6 || iocqes != 4 || mps != 0 || css != 0 {
                self.csts |= CSTS_CFS;
            } else {
                self.csts |= CSTS_RDY;
            }
        }
        if !enabled && old & CC_EN != 0 {
            // Reset: not ready, shutdown state cleared.
            self.csts = 0;
        }
        let shn = (value >> 14) & 0x3;
        if shn != 0 && (old >> 14) & 0x3 == 0 {
            self.csts |= CSTS_SHST_COMPLETE;
            return CcEffect::Shutdown;
        }
        if shn == 0 {
            self.csts &= !CSTS_SHST_COMPLETE;
        }
        CcEffect::None
    }

    /// Whether the controller is enabled and ready.
    pub fn ready(&self) -> bool {
        self.csts & CSTS_RDY != 0
    }

    /// Whether the keep-alive timer expired at `now`: at [`Self::deadline`] itself, so a driver
    /// woken exactly there (a paused test clock stops on it) does not re-arm for the same instant.
    pub fn expired(&self, now: Instant) -> bool {
        self.kato
            .is_some_and(|kato| now.saturating_duration_since(self.last_activity) >= kato)
    }

    /// When the keep-alive timer expires, if it runs.
    pub fn deadline(&self) -> Option<Instant> {
        self.kato.map(|k| self.last_activity + k)
    }

    /// Records a namespace change; true if an event was queued for an AER.
    pub fn namespace_changed(&mut self, nsid: u32) -> bool {
        self.changed.insert(nsid);
        if self.aec & AEN_NS_ATTR == 0 || self.ns_attr_masked {
            return false;
        }
        self.ns_attr_masked = true;
        self.events.push_back(AEN_RESULT_NS_CHANGED);
        true
    }

    /// The Changed Namespace List log (1024 nsids); reading without RAE unmasks the event.
    pub fn take_changed(&mut self, retain: bool) -> Vec<u8> {
        let mut page = vec![0u8; 4096];
        if self.changed.len() > 1024 {
            // Overflow: first entry FFFFFFFFh.
            page[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        } else {
            for (slot, nsid) in page.chunks_exact_mut(4).zip(&self.changed) {
                slot.copy_from_slice(&nsid.to_le_bytes());
            }
        }
        if !retain {
            self.changed.clear();
            self.ns_attr_masked = false;
        }
        page
    }
}

/// A live controller, shared by its queues and the registry.
#[derive(Debug)]
pub struct Controller {
    /// Controller id.
    pub cntlid: u16,
    /// Host NQN of its Connect.
    pub host: String,
    /// Subsystem NQN of its Connect.
    pub subnqn: String,
    /// What it serves.
    pub kind: Kind,
    regs: Mutex<Registers>,
    // Its own lock: every queue records failures here without contending for the registers.
    errors: Mutex<ErrorLog>,
    closed: watch::Sender<bool>,
    /// Wakes the admin queue when an event is queued.
    pub aen: Notify,
}

impl Controller {
    /// A new controller with keep-alive `kato` (None: off).
    pub fn new(
        cntlid: u16,
        host: String,
        subnqn: String,
        kind: Kind,
        kato: Option<Duration>,
    ) -> Arc<Self> {
        Arc::new(Controller {
            cntlid,
            host,
            subnqn,
            kind,
            regs: Mutex::new(Registers {
                cc: 0,
                csts: 0,
                kato,
                aec: 0,
                wce: true,
                io_queues: MAX_IO_QUEUES,
                connected: BTreeSet::new(),
                last_activity: Instant::now(),
                events: VecDeque::new(),
                ns_attr_masked: false,
                changed: BTreeSet::new(),
            }),
            errors: Mutex::new(ErrorLog::default()),
            closed: watch::Sender::new(false),
            aen: Notify::new(),
        })
    }

    /// Locks the registers (never held across an await or I/O).
    pub fn regs(&self) -> MutexGuard<'_, Registers> {
        self.regs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Locks the error log (never held across an await or I/O).
    pub fn errors(&self) -> MutexGuard<'_, ErrorLog> {
        self.errors.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes traffic (resets the keep-alive timer).
    pub fn touch(&self) {
        self.regs().last_activity = Instant::now();
    }

    /// Tears the controller down: every queue of it closes.
    pub fn shut(&self) {
        self.closed.send_replace(true);
    }

    /// Whether it was torn down.
    pub fn is_shut(&self) -> bool {
        *self.closed.borrow()
    }

    /// A receiver that changes when the controller is torn down.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }

    /// The volume it serves, if any.
    pub fn volume(&self) -> Option<VolumeId> {
        match self.kind {
            Kind::Volume { id, .. } => Some(id),
            Kind::Discovery => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctrl() -> Arc<Controller> {
        Controller::new(
            1,
            "h".into(),
            "s".into(),
            Kind::Volume {
                id: VolumeId(1),
                readonly: false,
            },
            Some(Duration::from_secs(5)),
        )
    }

    #[test]
    fn enable_shutdown_reset() {
        let c = ctrl();
        let mut r = c.regs();
        let cc = 1 | (6 << 16) | (4 << 20);
        assert_eq!(r.write_cc(cc), CcEffect::None);
        assert!(r.ready());
        assert_eq!(r.write_cc(cc | (1 << 14)), CcEffect::Shutdown);
        assert_eq!(r.csts & 0xc, 0x8, "SHST complete");
        assert_eq!(r.write_cc(0), CcEffect::None);
        assert_eq!(r.csts, 0);
        // Bad entry sizes: Controller Fatal Status.
        r.write_cc(1);
        assert_eq!(r.csts & CSTS_CFS, CSTS_CFS);
        assert!(!r.ready());
    }

    #[test]
    fn keep_alive_expiry_uses_the_time_given() {
        let c = ctrl();
        let r = c.regs();
        let t = r.last_activity;
        assert!(!r.expired(t + Duration::from_millis(4999)));
        // Expired at the deadline itself: a driver woken exactly there tears it down rather
        // than re-arming for the same instant.
        assert!(r.expired(t + Duration::from_secs(5)));
        assert_eq!(r.deadline(), Some(t + Duration::from_secs(5)));
    }

    /// The keep-alive timer end to end on the paused tokio clock (virtual time: quinn's
    /// `idle_timeout` test), so a busy machine cannot stretch it: Keep Alives 0.9 KATO apart
    /// keep a controller for over three KATOs; then it lives a KATO less a millisecond without
    /// traffic, and is torn down once the KATO has passed.
    #[tokio::test(start_paused = true)]
    async fn keep_alive_expires_one_kato_after_the_last_command_in_virtual_time() {
        use crate::nvme::test_host::{ok, Admin, Ended};
        const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0d0d0d0d-1111-2222-3333-444444444444";
        const KATO: Duration = Duration::from_secs(1);
        const TICK: Duration = Duration::from_millis(1);
        let lo = crate::nvme::test_target::serve_one_volume(HOST, "kato").await;
        let kato_ms = u32::try_from(KATO.as_millis()).unwrap();
        let mut admin = Admin::connect(lo.addr, &lo.nqn, HOST, kato_ms)
            .await
            .unwrap();
        let start = Instant::now();
        for _ in 0..4 {
            tokio::time::sleep(KATO * 9 / 10).await;
            ok(&admin.keep_alive().await);
        }
        let last = Instant::now();
        assert!(last - start > 3 * KATO, "kept alive past three KATOs");
        let early = tokio::time::timeout(KATO - TICK, admin.q.wait_closed()).await;
        assert!(early.is_err(), "torn down before its KATO: {early:?}");
        let ended = tokio::time::timeout(KATO, admin.q.wait_closed()).await;
        assert!(matches!(ended, Ok(Ended::Eof)), "{ended:?}");
        let silent = last.elapsed();
        assert!(
            silent >= KATO && silent <= KATO + 10 * TICK,
            "torn down {silent:?} after the last Keep Alive, KATO {KATO:?}"
        );
    }

    #[test]
    fn ns_events_mask_until_the_log_is_read() {
        let c = ctrl();
        let mut r = c.regs();
        assert!(!r.namespace_changed(1), "AEN not enabled");
        r.aec = AEN_NS_ATTR;
        r.take_changed(false);
        assert!(r.namespace_changed(1));
        assert!(!r.namespace_changed(1), "masked");
        assert_eq!(r.events.pop_front(), Some(AEN_RESULT_NS_CHANGED));
        let page = r.take_changed(true);
        assert_eq!(&page[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
        assert!(!r.namespace_changed(1), "RAE kept the mask");
        r.take_changed(false);
        assert!(r.namespace_changed(1));
    }
}
