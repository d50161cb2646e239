//! The one socket option the data path needs that the safe crates do not offer: `SO_ZEROCOPY`,
//! without which Linux ignores `MSG_ZEROCOPY` on a send (and sends no notifications).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `SO_ZEROCOPY` of `asm-generic/socket.h` (x86 and arm use it; the libc crate lacks it).
const SO_ZEROCOPY: libc::c_int = 60;

/// Lets sends on the socket pass `MSG_ZEROCOPY` (Linux 4.14 and later). Fails with the kernel's
/// error where it cannot (older kernels: `ENOPROTOOPT`; not a TCP or UDP socket).
pub fn enable_zerocopy(socket: BorrowedFd<'_>) -> io::Result<()> {
    let one: libc::c_int = 1;
    // 4 bytes.
    #[allow(clippy::cast_possible_truncation)]
    let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: passes a live `c_int` and its exact size; the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ZEROCOPY,
            std::ptr::from_ref(&one).cast(),
            len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_tcp_socket_takes_it_and_a_file_is_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        enable_zerocopy(listener.as_fd()).unwrap();
        let file = tempfile::tempfile().unwrap();
        let e = enable_zerocopy(file.as_fd()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTSOCK), "{e}");
    }
}
