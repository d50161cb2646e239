//! The socket side of a connection (what Linux nvmet's `tcp.c` does around the sans-I/O
//! queue): receive with one copy from the kernel, transmit read data from the buffers it was
//! read into, and move the socket to another runtime.

use std::io::IoSlice;

use edgevol_nvmeof::queue::{Queue, Splice};
use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

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
}

/// A link on its way to another runtime: tokio streams belong to the runtime they were made
/// on, so the socket travels as a std stream, with the buffers and what they hold.
pub(super) struct Unregistered {
    stream: std::net::TcpStream,
    rx: Vec<u8>,
    rx_start: usize,
    out: Vec<u8>,
    splices: Vec<Splice>,
}

impl Link {
    pub(super) fn new(stream: TcpStream) -> Self {
        let (rd, wr) = stream.into_split();
        Link {
            rd,
            wr,
            rx: Vec::new(),
            rx_start: 0,
            out: Vec::new(),
            splices: Vec::new(),
            sunk: false,
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

    /// Closes the sending side.
    pub(super) async fn shutdown(&mut self) {
        let _ = self.wr.shutdown().await;
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
        })
    }
}

/// Sends what the queue has to send, read data from the buffers it was read into (one vectored
/// write, no copy), then keeps those buffers for the next commands.
pub(super) async fn transmit(conn: &mut Conn, link: &mut Link) -> std::io::Result<()> {
    if !conn
        .queue
        .poll_transmit_vectored(&mut link.out, &mut link.splices)
    {
        return Ok(());
    }
    let sent = send(
        &mut link.wr,
        &link.out,
        &link.splices,
        conn.buffers.sending(),
    )
    .await;
    link.out.clear();
    link.splices.clear();
    conn.buffers.sent();
    sent
}

/// Writes `bytes` with each splice's data put in at its offset.
async fn send(
    wr: &mut OwnedWriteHalf,
    bytes: &[u8],
    splices: &[Splice],
    bufs: &[io::ReadBuf],
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
            write_all_vectored(wr, &mut slices).await?;
            slices.clear();
        }
    }
    if from < bytes.len() {
        slices.push(IoSlice::new(&bytes[from..]));
    }
    write_all_vectored(wr, &mut slices).await
}

async fn write_all_vectored(
    wr: &mut OwnedWriteHalf,
    mut slices: &mut [IoSlice<'_>],
) -> std::io::Result<()> {
    while !slices.is_empty() {
        let n = wr.write_vectored(slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}
