//! A queue's data buffers, reused so that a command allocates nothing: each takes a spare and
//! gives it back when done; read data long enough is sent straight from its buffer, which is a
//! spare again once the transmit is written.

use crate::nvme::io::ReadBuf;

/// Bytes of spare data buffers a queue keeps (a full queue of 4 KiB commands, or 16 of
/// 128 KiB), and the largest buffer it keeps.
const SPARE_BYTES: usize = 2 << 20;
const SPARE_MAX: usize = 128 * 1024;

/// Read data at least this long (a 4 KiB block) is sent from its own buffer (spliced into a
/// vectored write): an iovec costs the kernel less than the copy into the transmit buffer costs
/// the engine, which on a small or emulated core is most of what a 4 KiB read costs it in user
/// space. Shorter data (512-byte blocks) is copied.
pub(super) const SPLICE_MIN: usize = 4096;

#[derive(Default)]
pub(super) struct Buffers {
    /// Data buffers of finished commands, for the next ones, and their bytes.
    spare: Vec<ReadBuf>,
    spare_bytes: usize,
    /// Read buffers whose data the queue's transmit sends from (a splice's token is the index).
    sending: Vec<ReadBuf>,
}

impl Buffers {
    /// A buffer for the next command: a spare, or an empty one that grows on first use.
    pub(super) fn take(&mut self) -> ReadBuf {
        let buf = self.spare.pop().unwrap_or_default();
        self.spare_bytes -= buf.capacity();
        buf
    }

    /// Keeps `buf` for a later command, within the spare bounds.
    pub(super) fn keep(&mut self, mut buf: ReadBuf) {
        let size = buf.capacity();
        if size <= SPARE_MAX && self.spare_bytes + size <= SPARE_BYTES {
            buf.clear();
            self.spare_bytes += size;
            self.spare.push(buf);
        }
    }

    /// The splice token of the next buffer sent from.
    pub(super) fn next_token(&self) -> u32 {
        u32::try_from(self.sending.len()).unwrap_or(u32::MAX)
    }

    /// The transmit sends from `buf` (under [`Buffers::next_token`]) until [`Buffers::sent`].
    pub(super) fn send_from(&mut self, buf: ReadBuf) {
        self.sending.push(buf);
    }

    /// The buffers the transmit sends from, by token.
    pub(super) fn sending(&self) -> &[ReadBuf] {
        &self.sending
    }

    /// The transmit that sent from `sending` was written: its buffers are spares again.
    pub(super) fn sent(&mut self) {
        let mut sending = std::mem::take(&mut self.sending);
        for buf in sending.drain(..) {
            self.keep(buf);
        }
        self.sending = sending;
    }
}
