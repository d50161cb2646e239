//! The data path's device handle in the target's unit tests: the real one, which can also be
//! told to panic on a read (no real device can be made to), so that a test proves a panic
//! inside one I/O command fails only that command.

use std::sync::atomic::{AtomicU64, Ordering};

use edgevol_hal::uring::Ring;
use edgevol_hal::DataHandle;

use crate::pool::PoolDevice;

/// No read panics.
const NONE: u64 = u64::MAX;

/// A [`DataHandle`] whose read of a chosen device offset panics.
#[derive(Debug)]
pub struct PanickingHandle {
    inner: DataHandle,
    /// The device byte offset whose read panics ([`NONE`]: none).
    panic_at: AtomicU64,
}

impl PanickingHandle {
    /// [`DataHandle::open`]; no read panics yet.
    pub fn open(pool: &PoolDevice) -> Result<Self, edgevol_hal::Error> {
        Ok(PanickingHandle {
            inner: DataHandle::open(pool)?,
            panic_at: AtomicU64::new(NONE),
        })
    }

    /// From now on a read covering device byte `offset` panics (`None`: no read does).
    pub fn panic_on_read_of(&self, offset: Option<u64>) {
        self.panic_at
            .store(offset.unwrap_or(NONE), Ordering::Relaxed);
    }

    /// As [`DataHandle::is_direct`].
    pub fn is_direct(&self) -> bool {
        self.inner.is_direct()
    }

    /// As [`DataHandle::in_memory`].
    pub fn in_memory(&self) -> bool {
        self.inner.in_memory()
    }

    /// As [`DataHandle::ring`].
    pub fn ring<T>(&self, ops: u32) -> Option<Result<Ring<T>, edgevol_hal::Error>> {
        self.inner.ring(ops)
    }

    /// As [`DataHandle::read_at`], or a panic (see [`PanickingHandle::panic_on_read_of`]).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), edgevol_hal::Error> {
        let at = self.panic_at.load(Ordering::Relaxed);
        if (offset..offset + buf.len() as u64).contains(&at) {
            panic!("injected panic in the device read of byte {at}");
        }
        self.inner.read_at(offset, buf)
    }

    /// As [`DataHandle::write_at`].
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), edgevol_hal::Error> {
        self.inner.write_at(offset, data)
    }
}
