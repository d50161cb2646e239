//! A host over loopback TCP: the sans-I/O test initiator of `edgevol-nvmeof` on a tokio socket.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use edgevol_nvmeof::admin::opcode as admin_op;
use edgevol_nvmeof::auth::host::{Host as AuthHost, HostError, TestRng};
use edgevol_nvmeof::auth::AuthCommand;
use edgevol_nvmeof::fabrics_cmd::{
    ConnectCmd, ConnectData, PropertyGet, PropertySet, PropertySize, CNTLID_DYNAMIC,
};
use edgevol_nvmeof::initiator::{
    Completed, Data, Initiator, InitiatorClose, InitiatorConfig, InitiatorEvent,
};
use edgevol_nvmeof::io_cmd::opcode as io_op;
use edgevol_nvmeof::pdu::Digests;
use edgevol_nvmeof::sqe::Sqe;
use edgevol_nvmeof::status::Status;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// Longest any single wait may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);
/// I/O queue in-capsule limit the target advertises (IOCCSZ * 16 - 64).
pub const IO_IN_CAPSULE: u32 = 16 * 1024;

/// How a connection ended, seen from the host.
#[derive(Debug)]
pub enum Ended {
    /// The target sent a C2HTermReq (then closed).
    TermReq,
    /// The socket closed without one.
    Eof,
}

/// One host queue.
pub struct Queue {
    stream: TcpStream,
    pub ini: Initiator,
    done: HashMap<u16, Completed>,
    closed: Option<InitiatorClose>,
    eof: bool,
    /// Receive buffer, kept across reads (a fresh 256 KiB buffer per read costs the host an
    /// mmap and page faults each time, which benchmarks would charge to the target).
    rx: Vec<u8>,
    /// The socket as a std stream (a duplicate descriptor, non-blocking like tokio's), for
    /// [`Queue::cmd_polling`].
    polled: Option<std::net::TcpStream>,
}

impl Queue {
    pub async fn open(addr: SocketAddr, digests: Digests, in_capsule_limit: u32) -> Queue {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let ini = Initiator::new(InitiatorConfig {
            digests,
            in_capsule_limit,
            ..InitiatorConfig::default()
        });
        let mut q = Queue {
            stream,
            ini,
            done: HashMap::new(),
            closed: None,
            eof: false,
            rx: vec![0u8; 256 * 1024],
            polled: None,
        };
        while !q.ini.is_live() {
            q.pump().await;
            assert!(
                !q.eof && q.closed.is_none(),
                "ICReq refused: {:?}",
                q.closed
            );
        }
        q
    }

    async fn flush_out(&mut self) {
        let mut out = Vec::new();
        if self.ini.poll_transmit(&mut out) {
            // A closed peer makes this fail; the read side reports it.
            let _ = self.stream.write_all(&out).await;
        }
    }

    /// Sends what is queued, then reads once and feeds the initiator.
    async fn pump(&mut self) {
        self.flush_out().await;
        // Cancel-safe from here on (a caller may wait with a timeout): nothing is taken out of
        // `self` before the read completes.
        let n = match timeout(WAIT, self.stream.read(&mut self.rx)).await {
            Ok(Ok(n)) => n,
            Ok(Err(_)) => 0,
            Err(_) => panic!("no answer from the target within {WAIT:?}"),
        };
        if n == 0 {
            self.eof = true;
            return;
        }
        self.feed(n);
        self.flush_out().await;
    }

    /// Hands the initiator the first `n` bytes of the receive buffer.
    fn feed(&mut self, n: usize) {
        let buf = std::mem::take(&mut self.rx);
        let mut at = 0;
        while at < n {
            let used = self.ini.handle_input(&buf[at..n]);
            at += used;
            self.drain();
            if used == 0 {
                break;
            }
        }
        self.rx = buf;
    }

    /// Runs one command without ever sleeping: sends, then reads the socket without blocking in
    /// a loop until the command completes, as a polling initiator (SPDK's `spdk_nvme_perf`)
    /// does, so that a benchmark's queue-depth-1 latency is the target's and the link's, not
    /// this host's wake-up. Blocks the calling thread; nothing else may use the queue meanwhile.
    pub fn cmd_polling(&mut self, sqe: Sqe, data: Data) -> Completed {
        use std::io::{ErrorKind, Read};
        let cid = self.submit(sqe, data);
        let mut sock = match self.polled.take() {
            Some(s) => s,
            None => {
                use std::os::fd::AsFd;
                let fd = self.stream.as_fd().try_clone_to_owned().unwrap();
                std::net::TcpStream::from(fd)
            }
        };
        let deadline = std::time::Instant::now() + WAIT;
        let completed = loop {
            let mut out = Vec::new();
            if self.ini.poll_transmit(&mut out) {
                write_spinning(&mut sock, &out);
            }
            if let Some(c) = self.done.remove(&cid) {
                break c;
            }
            match sock.read(&mut self.rx) {
                Ok(0) => panic!("the target closed the connection waiting for cid {cid}"),
                Ok(n) => self.feed(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "no answer from the target within {WAIT:?}"
                    );
                    std::hint::spin_loop();
                }
                Err(e) => panic!("receive from the target: {e}"),
            }
        };
        self.polled = Some(sock);
        completed
    }

    fn drain(&mut self) {
        while let Some(ev) = self.ini.poll_event() {
            match ev {
                InitiatorEvent::Completed(c) => {
                    self.done.insert(c.cid, c);
                }
                InitiatorEvent::Closed(c) => self.closed = Some(c),
                InitiatorEvent::Initialized { .. } => {}
            }
        }
    }

    pub fn submit(&mut self, sqe: Sqe, data: Data) -> u16 {
        self.ini.submit(sqe, data).unwrap()
    }

    pub async fn wait(&mut self, cid: u16) -> Completed {
        loop {
            if let Some(c) = self.done.remove(&cid) {
                return c;
            }
            assert!(
                !self.eof && self.closed.is_none(),
                "connection ended waiting for cid {cid}: {:?}",
                self.closed
            );
            self.pump().await;
        }
    }

    /// Whether command `cid` has completed, without waiting.
    pub fn try_take(&mut self, cid: u16) -> Option<Completed> {
        self.done.remove(&cid)
    }

    pub async fn cmd(&mut self, sqe: Sqe, data: Data) -> Completed {
        let cid = self.submit(sqe, data);
        self.wait(cid).await
    }

    /// Waits until the target closes the connection.
    pub async fn wait_closed(&mut self) -> Ended {
        loop {
            if let Some(InitiatorClose::PeerTerminated { .. }) = self.closed {
                return Ended::TermReq;
            }
            if self.eof {
                return Ended::Eof;
            }
            self.pump().await;
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.ini.send_raw(bytes);
    }

    pub async fn connect(
        &mut self,
        qid: u16,
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
        kato_ms: u32,
    ) -> Completed {
        let cid = self
            .ini
            .connect(
                ConnectCmd {
                    qid,
                    sqsize: 31,
                    cattr: 0,
                    kato_ms,
                },
                &ConnectData {
                    hostid: [7; 16],
                    cntlid,
                    subsysnqn: subnqn.into(),
                    hostnqn: hostnqn.into(),
                },
            )
            .unwrap();
        self.wait(cid).await
    }
}

/// How a host's DH-HMAC-CHAP transaction ended, when it did not succeed.
#[derive(Debug)]
pub enum AuthEnd {
    /// An AUTH command itself failed with this status.
    Command(Completed),
    /// The host stopped or refused (it sent its AUTH_Failure2 when it refused).
    Host(HostError),
}

impl Queue {
    pub async fn auth_send(&mut self, message: Vec<u8>) -> Result<(), AuthEnd> {
        let len = u32::try_from(message.len()).unwrap();
        let c = self
            .cmd(
                AuthCommand::Send { tl: len }.to_sqe(0),
                Data::Write(message),
            )
            .await;
        if c.cqe.status().is_success() {
            Ok(())
        } else {
            Err(AuthEnd::Command(c))
        }
    }

    pub async fn auth_receive(&mut self) -> Result<Vec<u8>, AuthEnd> {
        // Linux's host reads every message with a 4 KiB allocation length.
        let c = self
            .cmd(
                AuthCommand::Receive { al: 4096 }.to_sqe(0),
                Data::Read(4096),
            )
            .await;
        if c.cqe.status().is_success() {
            Ok(c.data)
        } else {
            Err(AuthEnd::Command(c))
        }
    }

    async fn refused(&mut self, e: HostError) -> AuthEnd {
        if let HostError::Refused { failure2, .. } = &e {
            // Linux sends its AUTH_Failure2 and stops; the answer does not matter.
            let _ = self.auth_send(failure2.clone()).await;
        }
        AuthEnd::Host(e)
    }

    /// Runs one DH-HMAC-CHAP transaction `t_id` on this queue as Linux's host does
    /// (Negotiate, Challenge, Reply, Success1 and, when bidirectional, Success2).
    pub async fn authenticate(&mut self, host: &mut AuthHost, t_id: u16) -> Result<(), AuthEnd> {
        let mut rng = TestRng::new(u64::from(t_id) + 0x5eed);
        self.auth_send(host.negotiate(t_id)).await?;
        let challenge = self.auth_receive().await?;
        let reply = match host.handle_challenge(&challenge, &mut rng) {
            Ok(reply) => reply,
            Err(e) => return Err(self.refused(e).await),
        };
        self.auth_send(reply).await?;
        let success1 = self.auth_receive().await?;
        match host.handle_success1(&success1) {
            Ok(Some(success2)) => self.auth_send(success2).await,
            Ok(None) => Ok(()),
            Err(e) => Err(self.refused(e).await),
        }
    }
}

pub fn ok(c: &Completed) {
    assert!(
        c.cqe.status().is_success(),
        "command failed: {:?}",
        c.cqe.status()
    );
}

pub fn status(c: &Completed) -> (u8, u8, bool) {
    let s: Status = c.cqe.status();
    (s.sct, s.sc, s.dnr)
}

/// An admin queue connected and enabled, with the controller id.
pub struct Admin {
    pub q: Queue,
    pub cntlid: u16,
}

impl Admin {
    /// Connects the admin queue of a new controller; `Err` carries the failed completion.
    pub async fn connect(
        addr: SocketAddr,
        subnqn: &str,
        hostnqn: &str,
        kato_ms: u32,
    ) -> Result<Admin, Completed> {
        let mut q = Queue::open(addr, Digests::NONE, 8192).await;
        let c = q.connect(0, CNTLID_DYNAMIC, subnqn, hostnqn, kato_ms).await;
        if !c.cqe.status().is_success() {
            return Err(c);
        }
        let cntlid = u16::try_from(c.cqe.result & 0xffff).unwrap();
        let mut admin = Admin { q, cntlid };
        admin.enable().await;
        Ok(admin)
    }

    pub async fn enable(&mut self) {
        let cap = self
            .q
            .cmd(
                PropertyGet {
                    size: PropertySize::Eight,
                    offset: 0,
                }
                .to_sqe(0),
                Data::None,
            )
            .await;
        ok(&cap);
        assert_eq!(cap.cqe.result & 0xffff, 127, "MQES");
        let set = PropertySet {
            size: PropertySize::Four,
            offset: 0x14,
            value: 1 | (6 << 16) | (4 << 20),
        };
        ok(&self.q.cmd(set.to_sqe(0), Data::None).await);
        let csts = self
            .q
            .cmd(
                PropertyGet {
                    size: PropertySize::Four,
                    offset: 0x1c,
                }
                .to_sqe(0),
                Data::None,
            )
            .await;
        assert_eq!(csts.cqe.result & 1, 1, "CSTS.RDY");
    }

    pub async fn identify(&mut self, cns: u32, nsid: u32) -> Completed {
        let mut sqe = Sqe::default();
        sqe.set_opcode(admin_op::IDENTIFY)
            .set_nsid(nsid)
            .set_cdw(10, cns);
        self.q.cmd(sqe, Data::Read(4096)).await
    }

    pub async fn set_features(&mut self, fid: u32, cdw11: u32) -> Completed {
        let mut sqe = Sqe::default();
        sqe.set_opcode(admin_op::SET_FEATURES)
            .set_cdw(10, fid)
            .set_cdw(11, cdw11);
        self.q.cmd(sqe, Data::None).await
    }

    pub async fn get_log(&mut self, lid: u8, len: u32) -> Completed {
        let mut sqe = Sqe::default();
        sqe.set_opcode(admin_op::GET_LOG_PAGE)
            .set_nsid(0xffff_ffff)
            .set_cdw(10, ((len / 4 - 1) << 16) | u32::from(lid));
        self.q.cmd(sqe, Data::Read(len)).await
    }

    pub async fn keep_alive(&mut self) -> Completed {
        let mut sqe = Sqe::default();
        sqe.set_opcode(admin_op::KEEP_ALIVE);
        self.q.cmd(sqe, Data::None).await
    }

    /// Opens I/O queue `qid` of this controller.
    pub async fn io_queue(
        &self,
        addr: SocketAddr,
        qid: u16,
        subnqn: &str,
        hostnqn: &str,
        digests: Digests,
    ) -> Result<Queue, Completed> {
        let mut q = Queue::open(addr, digests, IO_IN_CAPSULE).await;
        let c = q.connect(qid, self.cntlid, subnqn, hostnqn, 0).await;
        if c.cqe.status().is_success() {
            Ok(q)
        } else {
            Err(c)
        }
    }
}

/// An admin queue of `hostnqn` on subsystem `subnqn` at `addr`, and its I/O queue 1 (no
/// digests). Keep the admin queue while the I/O queue is used: it keeps the controller.
pub async fn admin_and_queue(addr: SocketAddr, subnqn: &str, hostnqn: &str) -> (Admin, Queue) {
    let admin = Admin::connect(addr, subnqn, hostnqn, 0).await.unwrap();
    let q = admin
        .io_queue(addr, 1, subnqn, hostnqn, Digests::NONE)
        .await
        .unwrap();
    (admin, q)
}

/// Fills `buf` from a non-blocking socket, retrying reads that would block (a polling host
/// never sleeps); false at end of stream.
pub fn read_spinning(s: &mut std::net::TcpStream, buf: &mut [u8]) -> bool {
    use std::io::{ErrorKind, Read};
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return false,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => panic!("receive: {e}"),
        }
    }
    true
}

/// Writes all of `buf` to a non-blocking socket, retrying writes that would block.
pub fn write_spinning(s: &mut std::net::TcpStream, buf: &[u8]) {
    use std::io::{ErrorKind, Write};
    let mut sent = 0;
    while sent < buf.len() {
        match s.write(&buf[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => panic!("send: {e}"),
        }
    }
}

/// SQE builders for I/O commands on namespace 1 with 4 KiB blocks.
pub mod io {
    use super::*;

    pub const BLOCK: u64 = 4096;

    fn rw(opcode: u8, slba: u64, blocks: u32) -> Sqe {
        let mut sqe = Sqe::default();
        sqe.set_opcode(opcode)
            .set_nsid(1)
            .set_cdw(10, u32::try_from(slba & 0xffff_ffff).unwrap())
            .set_cdw(11, u32::try_from(slba >> 32).unwrap())
            .set_cdw(12, blocks - 1);
        sqe
    }

    pub fn write(slba: u64, data: &[u8], fua: bool) -> (Sqe, Data) {
        let blocks = u32::try_from(data.len() as u64 / BLOCK).unwrap();
        let mut sqe = rw(io_op::WRITE, slba, blocks);
        if fua {
            sqe.set_cdw(12, (blocks - 1) | (1 << 30));
        }
        (sqe, Data::Write(data.to_vec()))
    }

    pub fn read(slba: u64, blocks: u32) -> (Sqe, Data) {
        (
            rw(io_op::READ, slba, blocks),
            Data::Read(u32::try_from(u64::from(blocks) * BLOCK).unwrap()),
        )
    }

    pub fn write_zeroes(slba: u64, blocks: u32) -> (Sqe, Data) {
        (rw(io_op::WRITE_ZEROES, slba, blocks), Data::None)
    }

    pub fn flush() -> (Sqe, Data) {
        let mut sqe = Sqe::default();
        sqe.set_opcode(io_op::FLUSH).set_nsid(1);
        (sqe, Data::None)
    }

    /// Dataset Management deallocate of (slba, blocks) ranges.
    pub fn deallocate(ranges: &[(u64, u32)]) -> (Sqe, Data) {
        let mut sqe = Sqe::default();
        sqe.set_opcode(io_op::DATASET_MANAGEMENT)
            .set_nsid(1)
            .set_cdw(10, u32::try_from(ranges.len() - 1).unwrap())
            .set_cdw(11, 1 << 2);
        let mut data = Vec::new();
        for &(slba, nlb) in ranges {
            data.extend_from_slice(&0u32.to_le_bytes());
            data.extend_from_slice(&nlb.to_le_bytes());
            data.extend_from_slice(&slba.to_le_bytes());
        }
        (sqe, Data::Write(data))
    }
}
