//! gRPC servers on unix sockets that every gRPC client can call.
//!
//! gRPC C-core (Python's grpcio, C++, Ruby, PHP) and grpc-java send the socket path,
//! percent-encoded, as a request's `:authority` (`%2Frun%2Fedgevol%2Fcsi.sock`). That is no URI
//! authority, and h2 (under hyper and tonic) resets such a stream with PROTOCOL_ERROR before any
//! handler runs. On a unix socket the authority names nothing, so [`UnixGrpcStream`] rewrites the
//! client's header blocks before the server parses them: an invalid `:authority` becomes
//! `localhost`, what grpc-go sends. See [`rewrite`] for how.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::{Connected, UdsConnectInfo};

pub mod rewrite;

pub use rewrite::AuthorityFix;

/// How much is read from the client at a time.
const READ_CHUNK: usize = 16 * 1024;

/// A server's end of a client connection: reads go through [`AuthorityFix`], writes pass
/// unchanged. Generic over the transport so tests can use an in-memory pipe.
#[derive(Debug)]
pub struct UnixGrpcStream<S = UnixStream> {
    inner: S,
    fix: AuthorityFix,
    /// Rewritten bytes not yet handed to the server, from `pos` on.
    pending: Vec<u8>,
    pos: usize,
    scratch: Box<[u8]>,
}

impl<S> UnixGrpcStream<S> {
    /// Wraps a freshly accepted connection (nothing read from it yet).
    pub fn new(inner: S) -> UnixGrpcStream<S> {
        UnixGrpcStream {
            inner,
            fix: AuthorityFix::new(),
            pending: Vec::new(),
            pos: 0,
            scratch: vec![0; READ_CHUNK].into_boxed_slice(),
        }
    }

    /// The wrapped transport.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// The accepted connections of `listener`, each wrapped, for `serve_with_incoming`.
pub fn incoming(listener: UnixListener) -> impl Stream<Item = io::Result<UnixGrpcStream>> {
    UnixListenerStream::new(listener).map(|accepted| accepted.map(UnixGrpcStream::new))
}

impl<S: AsyncRead + Unpin> AsyncRead for UnixGrpcStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.pos < this.pending.len() {
                let n = buf.remaining().min(this.pending.len() - this.pos);
                buf.put_slice(&this.pending[this.pos..this.pos + n]);
                this.pos += n;
                if this.pos == this.pending.len() {
                    this.pending.clear();
                    this.pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                return Poll::Ready(Ok(())); // end of stream
            }
            this.fix
                .feed(read.filled(), &mut this.pending)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for UnixGrpcStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl Connected for UnixGrpcStream<UnixStream> {
    type ConnectInfo = UdsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
