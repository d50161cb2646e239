//! Zero-copy sends of read data (Linux `MSG_ZEROCOPY`, as SPDK's posix sockets send large
//! payloads): the kernel sends from the read buffers' own pages instead of copying them into
//! socket buffers, which on a small core is most of what a 128 KiB read costs in the transmit.
//!
//! The price is that the memory is shared with the network stack until the kernel says it is
//! done with it (after the peer acknowledged the data, since TCP resends from it): a transmit's
//! buffers and its header bytes stay pinned here until a notification on the socket's error
//! queue covers every send that carried them, and only then become spares. The kernel numbers
//! zero-copy sends per socket, from 0, and notifies inclusive ranges of those numbers, mostly in
//! order and coalesced.
//!
//! Where the kernel copies anyway (loopback, a NIC without scatter-gather) it says so in the
//! notification, and the link stops asking: a copy in the system call is cheaper than a
//! deferred one. The accounting here is sans-I/O; [`reap`] reads the notifications.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

use crate::nvme::io::ReadBuf;

/// Read data a transmit carries from at least which it is sent zero-copy: the kernel's guide
/// is above about 10 KB per send, below which pinning and notifying cost more than the copy.
pub(super) const ZERO_COPY_MIN: usize = 64 * 1024;

/// Transmits held at most; beyond it (notifications late or lost) the link copies, so that
/// the memory held stays bounded.
const PINNED_MAX: usize = 16;

/// `SO_EE_ORIGIN_ZEROCOPY` and `SO_EE_CODE_ZEROCOPY_COPIED` of `linux/errqueue.h`.
const ORIGIN_ZEROCOPY: u8 = 5;
const CODE_COPIED: u8 = 1;

/// One transmit's memory while the kernel may still read it.
#[derive(Default)]
pub(super) struct Pinned {
    /// Its sends, by the kernel's numbers (unwrapped to 64 bits), inclusive.
    first: u64,
    last: u64,
    /// How many of them were notified.
    done: u64,
    /// The header bytes between the read data.
    pub(super) out: Vec<u8>,
    /// The read buffers sent from.
    pub(super) bufs: Vec<ReadBuf>,
}

impl Pinned {
    fn released(&self) -> bool {
        self.done > self.last - self.first
    }
}

/// A link's zero-copy state.
#[derive(Default)]
pub(super) struct ZeroCopy {
    /// The socket takes `MSG_ZEROCOPY` and the kernel has not reported a copy.
    on: bool,
    /// Zero-copy sends so far: the number of the next one.
    sent: u64,
    pinned: VecDeque<Pinned>,
    /// Released holders, kept for their allocations.
    spare: Vec<Pinned>,
}

impl ZeroCopy {
    /// Zero-copy sends are asked for from now on (the socket has `SO_ZEROCOPY`).
    pub(super) fn enable(&mut self) {
        self.on = true;
    }

    /// Whether a transmit carrying `spliced` bytes of read data should be sent zero-copy.
    pub(super) fn wanted(&self, spliced: usize) -> bool {
        self.on && spliced >= ZERO_COPY_MIN && self.pinned.len() < PINNED_MAX
    }

    /// Transmits still pinned.
    pub(super) fn pinned(&self) -> usize {
        self.pinned.len()
    }

    /// The number the next zero-copy send gets; call [`ZeroCopy::sent_one`] once it sent data.
    pub(super) fn next(&self) -> u64 {
        self.sent
    }

    /// A send with `MSG_ZEROCOPY` sent data (one that failed or sent nothing has no number).
    pub(super) fn sent_one(&mut self) {
        self.sent += 1;
    }

    /// Holds a transmit's memory, sent by the zero-copy sends numbered `first..self.next()`,
    /// and hands back an emptied holder whose `out` and `bufs` the caller swaps in for them.
    pub(super) fn pin(&mut self, first: u64, out: &mut Vec<u8>, bufs: &mut Vec<ReadBuf>) {
        let mut p = self.spare.pop().unwrap_or_default();
        std::mem::swap(&mut p.out, out);
        std::mem::swap(&mut p.bufs, bufs);
        p.first = first;
        p.last = self.sent - 1;
        p.done = 0;
        self.pinned.push_back(p);
    }

    /// The kernel is done with sends `lo..=hi` (its 32-bit numbers); `copied`: it copied
    /// them. Every transmit now wholly done goes to `release`, which empties it.
    pub(super) fn completed(
        &mut self,
        lo: u32,
        hi: u32,
        copied: bool,
        mut release: impl FnMut(&mut Pinned),
    ) {
        if copied {
            self.on = false;
        }
        // Numbers are outstanding within 2^32 of the next one: the nearest below it is meant
        // (the casts keep the low 32 bits, the kernel's number).
        #[allow(clippy::cast_possible_truncation)]
        let (next32, lo32) = (self.sent as u32, lo);
        let Some(lo) = self.sent.checked_sub(u64::from(next32.wrapping_sub(lo32))) else {
            return;
        };
        let hi = lo + u64::from(hi.wrapping_sub(lo32));
        let mut i = 0;
        while i < self.pinned.len() {
            let p = &mut self.pinned[i];
            let (from, to) = (p.first.max(lo), p.last.min(hi));
            if from <= to {
                p.done += to - from + 1;
            }
            if p.released() {
                let mut p = self.pinned.remove(i).expect("index in range");
                release(&mut p);
                p.out.clear();
                self.spare.push(p);
            } else {
                i += 1;
            }
        }
    }
}

impl Drop for ZeroCopy {
    /// Memory the kernel may still send from (a link dropped before its notifications came) is
    /// never freed: the allocator would hand it to another command, whose data (another
    /// volume's) the kernel could then resend to this peer.
    fn drop(&mut self) {
        let held: usize = self
            .pinned
            .drain(..)
            .map(|p| {
                let bytes = p.out.capacity() + p.bufs.iter().map(ReadBuf::capacity).sum::<usize>();
                std::mem::forget(p);
                bytes
            })
            .sum();
        if held > 0 {
            tracing::warn!(
                bytes = held,
                "NVMe/TCP link closed before the kernel released its zero-copy sends: memory kept"
            );
        }
    }
}

/// Reads every notification waiting on `socket`'s error queue into `zc` (no waiting: the
/// error queue never blocks). Returns whether any came.
pub(super) fn reap(
    socket: BorrowedFd<'_>,
    zc: &mut ZeroCopy,
    mut release: impl FnMut(&mut Pinned),
) -> bool {
    let mut any = false;
    let mut space = nix::cmsg_space!(nix::libc::sock_extended_err, nix::libc::sockaddr_in6);
    loop {
        let msg = match recvmsg::<()>(
            socket.as_raw_fd(),
            &mut [],
            Some(&mut space),
            MsgFlags::MSG_ERRQUEUE,
        ) {
            Ok(msg) => msg,
            Err(Errno::EINTR) => continue,
            // EAGAIN: none left. Anything else: the socket's trouble shows on its next send.
            Err(_) => return any,
        };
        let Ok(cmsgs) = msg.cmsgs() else {
            return any;
        };
        for c in cmsgs {
            let err = match c {
                ControlMessageOwned::Ipv4RecvErr(err, _)
                | ControlMessageOwned::Ipv6RecvErr(err, _) => err,
                _ => continue,
            };
            if err.ee_origin == ORIGIN_ZEROCOPY && err.ee_errno == 0 {
                any = true;
                let copied = err.ee_code & CODE_COPIED != 0;
                zc.completed(err.ee_info, err.ee_data, copied, &mut release);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins a transmit of `sends` zero-copy sends, its header bytes marked with `mark`.
    fn transmit(zc: &mut ZeroCopy, sends: u64, mark: u8) {
        let first = zc.next();
        for _ in 0..sends {
            zc.sent_one();
        }
        let mut out = vec![mark];
        zc.pin(first, &mut out, &mut Vec::new());
        assert!(out.is_empty(), "a fresh holder is handed back");
    }

    fn completed(zc: &mut ZeroCopy, lo: u32, hi: u32) -> Vec<u8> {
        let mut released = Vec::new();
        zc.completed(lo, hi, false, |p| released.push(p.out[0]));
        released
    }

    #[test]
    fn a_transmit_is_released_only_once_every_one_of_its_sends_is_notified() {
        let mut zc = ZeroCopy::default();
        zc.enable();
        transmit(&mut zc, 2, b'a'); // sends 0, 1
        transmit(&mut zc, 1, b'b'); // send 2
        transmit(&mut zc, 3, b'c'); // sends 3..=5
        assert_eq!(completed(&mut zc, 0, 0), b"");
        assert_eq!(completed(&mut zc, 1, 3), b"ab");
        // Out of order (a resend, a teardown): 5 before 4.
        assert_eq!(completed(&mut zc, 5, 5), b"");
        assert_eq!(completed(&mut zc, 4, 4), b"c");
        assert_eq!(zc.pinned(), 0);
        // The holders come back for the next transmits.
        assert_eq!(zc.spare.len(), 3);
    }

    #[test]
    fn numbers_wrap_at_32_bits() {
        let mut zc = ZeroCopy::default();
        zc.enable();
        zc.sent = u64::from(u32::MAX) - 1;
        transmit(&mut zc, 4, b'w'); // u32::MAX - 1, u32::MAX, 0, 1
        assert_eq!(completed(&mut zc, u32::MAX - 1, 0), b"");
        assert_eq!(completed(&mut zc, 1, 1), b"w");
    }

    #[test]
    fn a_copy_reported_by_the_kernel_turns_zero_copy_off_and_still_releases() {
        let mut zc = ZeroCopy::default();
        zc.enable();
        assert!(zc.wanted(ZERO_COPY_MIN));
        assert!(!zc.wanted(ZERO_COPY_MIN - 1));
        transmit(&mut zc, 1, b'x');
        let mut released = 0;
        zc.completed(0, 0, true, |_| released += 1);
        assert_eq!(released, 1);
        assert!(!zc.wanted(ZERO_COPY_MIN));
    }

    #[test]
    fn pinned_transmits_are_bounded() {
        let mut zc = ZeroCopy::default();
        zc.enable();
        for _ in 0..PINNED_MAX {
            assert!(zc.wanted(ZERO_COPY_MIN));
            transmit(&mut zc, 1, 0);
        }
        assert!(!zc.wanted(ZERO_COPY_MIN));
        // A number not sent yet (a stray notification) releases nothing.
        let next = u32::try_from(PINNED_MAX).unwrap();
        assert_eq!(completed(&mut zc, next, next), b"");
        assert_eq!(zc.pinned(), PINNED_MAX);
    }
}
