//! The socket side of a connection (what Linux nvmet's `tcp.c` does around the sans-I/O
//! queue): receive with one copy from the kernel, transmit read data from the buffers it was
//! read into (large transmits with no copy at all, [`super::zero_copy`]), and move the socket
//! to another runtime.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd};

use edgevol_nvmeof::queue::{Queue, Splice};
use nix::sys::socket::{sendmsg, MsgFlags};
use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::buffers::Buffers;
use super::zero_copy::{self, ZeroCopy};
use super::Conn;
use crate::nvme::io;

/// Room made in the receive buffer before each socket read.
const READ_CHUNK: usize = 64 * 1024;

/// The rest of a PDU's data at least this long is received straight into its buffer; a shorter
/// rest comes with what follows it, in one read into the receive buffer.
const SINK_MIN: usize = 8 * 1024;

/// Slices per `writev`: enough for a batch of 64 reads with their headers (two each).
const SLICES: usize = 132;

/// The socket side of a connection and its buffers.
pub(super) struct Link {
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    /// Received bytes not yet consumed start at `rx_start`.
    rx: Vec<u8>,
    rx_start: usize,
    out: Vec<u8>,
    /// Where the read data the queue did not copy goes in `out`.
    splices: Vec<Splice>,
    /// Bytes were received straight into a PDU's buffer: the queue must look at them.
    sunk: bool,
    zc: ZeroCopy,
}

/// A link on its way to another runtime: tokio streams belong to the runtime they were made
/// on, so the socket travels as a std stream, with the buffers and what they hold.
pub(super) struct Unregistered {
    stream: std::net::TcpStream,
    rx: Vec<u8>,
    rx_start: usize,
    out: Vec<u8>,
    splices: Vec<Splice>,
    zc: ZeroCopy,
}

impl Link {
    pub(super) fn new(stream: TcpStream) -> Self {
        let mut zc = ZeroCopy::default();
        match edgevol_hal::net::enable_zerocopy(stream.as_fd()) {
            Ok(()) => zc.enable(),
            Err(e) => tracing::debug!(%e, "NVMe/TCP sends copy: no SO_ZEROCOPY"),
        }
        let (rd, wr) = stream.into_split();
        Link {
            rd,
            wr,
            rx: Vec::new(),
            rx_start: 0,
            out: Vec::new(),
            splices: Vec::new(),
            sunk: false,
            zc,
        }
    }

    /// Takes the socket off this runtime's reactor.
    pub(super) fn unregister(self) -> std::io::Result<Unregistered> {
        let stream = self
            .rd
            .reunite(self.wr)
            .map_err(std::io::Error::other)?
            .into_std()?;
        Ok(Unregistered {
            stream,
            rx: self.rx,
            rx_start: self.rx_start,
            out: self.out,
            splices: self.splices,
            zc: self.zc,
        })
    }

    /// Hands the queue what was received and not consumed yet (its receive budget bounds how
    /// much it takes).
    pub(super) fn feed(&mut self, queue: &mut Queue) {
        if self.rx_start < self.rx.len() || std::mem::take(&mut self.sunk) {
            let n = queue.handle_input(&self.rx[self.rx_start..]);
            self.rx_start += n;
            if self.rx_start == self.rx.len() {
                self.rx.clear();
                self.rx_start = 0;
            }
        }
    }

    /// The socket, for the engine's busy polling.
    pub(super) fn socket(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.rd.as_ref().as_fd()
    }

    /// Received bytes wait that the queue did not take yet.
    pub(super) fn has_buffered(&self) -> bool {
        self.rx_start < self.rx.len()
    }

    /// Receives from the socket (one copy from the kernel): the rest of a large PDU's data
    /// straight into the buffer the command will own, anything else into the buffer the queue
    /// parses from. Returns the bytes read (0: the peer closed).
    pub(super) async fn receive(&mut self, queue: &mut Queue) -> std::io::Result<usize> {
        if let Some((data, lacking)) = queue.data_sink() {
            if lacking >= SINK_MIN {
                // Into the room after the data received so far (the buffer holds the PDU's
                // data whole, so the room is at least what it lacks).
                let room = data.spare_mut();
                let take = lacking.min(room.len());
                let n = self.rd.read(&mut room[..take]).await?;
                data.commit(n);
                self.sunk = true;
                return Ok(n);
            }
        }
        self.rx.reserve(READ_CHUNK);
        let n = self.rd.read_buf(&mut self.rx).await?;
        self.sunk = false;
        Ok(n)
    }
}

impl Unregistered {
    /// Registers the socket with this runtime's reactor.
    pub(super) fn register(self) -> std::io::Result<Link> {
        let (rd, wr) = TcpStream::from_std(self.stream)?.into_split();
        Ok(Link {
            rd,
            wr,
            rx: self.rx,
            rx_start: self.rx_start,
            out: self.out,
            splices: self.splices,
            sunk: false,
            zc: self.zc,
        })
    }
}

/// Sends what the queue has to send, read data from the buffers it was read into (one vectored
/// write, no copy; zero-copy when there is enough of it), then keeps those buffers for the next
/// commands, once the kernel is done with them.
pub(super) async fn transmit(conn: &mut Conn, link: &mut Link) -> std::io::Result<()> {
    if link.zc.pinned() > 0 {
        link.reap(&mut conn.buffers);
    }
    if !conn
        .queue
        .poll_transmit_vectored(&mut link.out, &mut link.splices)
    {
        return Ok(());
    }
    let spliced = link.splices.iter().map(|s| s.len).sum();
    let first = link.zc.next();
    let zc = link.zc.wanted(spliced).then_some(&mut link.zc);
    let sent = send(
        &link.wr,
        &link.out,
        &link.splices,
        conn.buffers.sending(),
        zc,
    )
    .await;
    link.splices.clear();
    let zero_copy_sends = link.zc.next() - first;
    if zero_copy_sends > 0 {
        // The kernel sends from this memory until it notifies: hold it, go on with other.
        link.zc
            .pin(first, &mut link.out, conn.buffers.sending_mut());
        conn.subs.engines.count_zero_copy_sends(zero_copy_sends);
    } else {
        link.out.clear();
        conn.buffers.sent();
    }
    sent
}

impl Link {
    /// Takes the kernel's zero-copy notifications: what it is done with becomes spares.
    fn reap(&mut self, buffers: &mut Buffers) {
        let socket = self.wr.as_ref().as_fd();
        zero_copy::reap(socket, &mut self.zc, |p| buffers.keep_all(&mut p.bufs));
    }

    /// Closes the sending side. Memory the kernel still sends from stays held, with the
    /// socket, until it is done with it.
    pub(super) async fn shutdown(mut self) {
        let _ = self.wr.shutdown().await;
        if self.zc.pinned() > 0 {
            tokio::spawn(self.release_when_sent());
        }
    }

    /// Waits (a minute at most) for the kernel to finish with the pinned memory of a closed
    /// link; past that, [`ZeroCopy`]'s drop keeps the memory from reuse for good.
    async fn release_when_sent(mut self) {
        let give_up = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut pause = std::time::Duration::from_millis(1);
        while self.zc.pinned() > 0 && tokio::time::Instant::now() < give_up {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(100));
            let socket = self.wr.as_ref().as_fd();
            zero_copy::reap(socket, &mut self.zc, |p| p.bufs.clear());
        }
    }
}

/// Writes `bytes` with each splice's data put in at its offset; with `zc`, zero-copy.
async fn send(
    wr: &OwnedWriteHalf,
    bytes: &[u8],
    splices: &[Splice],
    bufs: &[io::ReadBuf],
    mut zc: Option<&mut ZeroCopy>,
) -> std::io::Result<()> {
    let mut slices = SmallVec::<[IoSlice<'_>; SLICES]>::new();
    let mut from = 0;
    for s in splices {
        let data = usize::try_from(s.token)
            .ok()
            .and_then(|t| bufs.get(t))
            .and_then(|b| b.data().get(s.start..s.start + s.len))
            .ok_or_else(|| std::io::Error::other("spliced data out of range"))?;
        if s.at > from {
            slices.push(IoSlice::new(&bytes[from..s.at]));
        }
        slices.push(IoSlice::new(data));
        from = s.at;
        if slices.len() >= SLICES - 2 {
            write_all_vectored(wr, &mut slices, zc.as_deref_mut()).await?;
            slices.clear();
        }
    }
    if from < bytes.len() {
        slices.push(IoSlice::new(&bytes[from..]));
    }
    write_all_vectored(wr, &mut slices, zc).await
}

async fn write_all_vectored(
    wr: &OwnedWriteHalf,
    mut slices: &mut [IoSlice<'_>],
    mut zc: Option<&mut ZeroCopy>,
) -> std::io::Result<()> {
    while !slices.is_empty() {
        let n = match zc.as_deref_mut() {
            Some(zc) => send_zero_copy(wr.as_ref(), slices, zc).await,
            None => write_vectored(wr.as_ref(), slices).await,
        };
        let n = match n {
            // Over the socket's or the user's pinned-memory limit: copy the rest.
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) && zc.is_some() => {
                zc = None;
                continue;
            }
            n => n?,
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

async fn write_vectored(stream: &TcpStream, slices: &[IoSlice<'_>]) -> std::io::Result<usize> {
    loop {
        stream.writable().await?;
        match stream.try_write_vectored(slices) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            n => return n,
        }
    }
}

/// One `sendmsg` with `MSG_ZEROCOPY`; a send that moved data takes the next number.
async fn send_zero_copy(
    stream: &TcpStream,
    slices: &[IoSlice<'_>],
    zc: &mut ZeroCopy,
) -> std::io::Result<usize> {
    let flags = MsgFlags::from_bits_retain(nix::libc::MSG_ZEROCOPY) | MsgFlags::MSG_NOSIGNAL;
    loop {
        stream.writable().await?;
        let sent = stream.try_io(Interest::WRITABLE, || {
            sendmsg::<()>(stream.as_raw_fd(), slices, &[], flags, None).map_err(Into::into)
        });
        match sent {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Ok(n) if n > 0 => {
                zc.sent_one();
                return Ok(n);
            }
            n => return n,
        }
    }
}
