//! Target queue tests: a test initiator and a queue shuttle bytes in memory (quinn's `Pair`),
//! optionally in random chunk sizes, with a RAM "namespace" executing reads and writes.

use super::*;
use crate::fabrics_cmd::{fctype, ConnectCmd, ConnectData, CNTLID_DYNAMIC};
use crate::initiator::{
    Completed, Data, Initiator, InitiatorClose, InitiatorConfig, InitiatorEvent,
};
use crate::pdu::{CapsuleCmd, DataPdu, EncodeOptions, IcReq, Pdu, PduType};
use crate::pdu_error::Fes;
use crate::sqe::FABRICS_OPCODE;

const RAM_LEN: usize = 4 * 1024 * 1024;

/// A queue, an initiator, and a tiny RAM namespace that executes what the queue hands out.
struct Pair {
    target: Queue,
    host: Initiator,
    ram: Vec<u8>,
    /// xorshift state for random chunk sizes; 0 = whole buffers.
    rng: u64,
    to_target: Vec<u8>,
    to_host: Vec<u8>,
    completed: Vec<Completed>,
    target_closed: Option<CloseReason>,
    host_closed: Option<InitiatorClose>,
    initialized: bool,
    /// Reads complete spliced: their data stays here (the token is the index) until sent.
    splice: bool,
    held: Vec<Vec<u8>>,
}

impl Pair {
    fn new(config: QueueConfig, host: InitiatorConfig, seed: u64) -> Self {
        Pair {
            target: Queue::new(config, Duration::ZERO).unwrap(),
            host: Initiator::new(host),
            ram: vec![0; RAM_LEN],
            rng: seed,
            to_target: Vec::new(),
            to_host: Vec::new(),
            completed: Vec::new(),
            target_closed: None,
            host_closed: None,
            initialized: false,
            splice: false,
            held: Vec::new(),
        }
    }

    /// Initialized, admin-connected pair.
    fn connected(config: QueueConfig, host: InitiatorConfig, seed: u64, qid: u16) -> Self {
        let mut p = Pair::new(config, host, seed);
        p.drive();
        assert!(p.initialized && p.host.is_live());
        let cid = p
            .host
            .connect(
                ConnectCmd {
                    qid,
                    sqsize: 31,
                    cattr: 0,
                    kato_ms: 0,
                },
                &ConnectData {
                    hostid: [1; 16],
                    cntlid: if qid == 0 { CNTLID_DYNAMIC } else { 1 },
                    subsysnqn: "nqn.2026-01.io.edgevol:test".into(),
                    hostnqn: "nqn.2014-08.org.nvmexpress:uuid:test".into(),
                },
            )
            .unwrap();
        p.drive();
        let c = p.take(cid);
        assert!(c.cqe.status().is_success());
        assert_eq!(c.cqe.result, 1, "cntlid");
        assert_eq!(p.target.slot_count(), 64);
        p
    }

    fn chunk(&mut self, available: usize) -> usize {
        if self.rng == 0 {
            return available;
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let n = usize::try_from(self.rng % 9000).unwrap_or(1) + 1;
        n.min(available)
    }

    fn execute(&mut self, cmd: Command) {
        let sqe = cmd.sqe;
        let lba_bytes = || {
            let lba = u64::from(sqe.cdw(10)) | (u64::from(sqe.cdw(11)) << 32);
            usize::try_from(lba * 512).unwrap()
        };
        let done = if sqe.opcode() == FABRICS_OPCODE && sqe.fctype() == fctype::CONNECT {
            let c = ConnectCmd::parse(&sqe).unwrap();
            ConnectData::parse(&cmd.data).unwrap();
            self.target.install(c.qid, c.sqsize).unwrap();
            self.target.complete(cmd.tag, Completion::success(1))
        } else if sqe.opcode() == 0x01 {
            let at = lba_bytes();
            // Received page-aligned (in the capsule, or over several H2CData PDUs), as an
            // O_DIRECT device writes it.
            assert!(cmd.data.is_aligned(), "{} bytes aligned", cmd.data.len());
            self.ram[at..at + cmd.data.len()].copy_from_slice(&cmd.data);
            let done = self.target.complete(cmd.tag, Completion::success(0));
            self.target.recycle(cmd.data);
            done
        } else if sqe.opcode() == 0x02 {
            let at = lba_bytes();
            let len = usize::try_from(cmd.read_len).unwrap();
            let data = self.ram[at..at + len].to_vec();
            let c = Completion {
                status: Status::SUCCESS,
                result: 0,
                data: &data,
            };
            if self.splice {
                let token = u32::try_from(self.held.len()).unwrap();
                let done = self.target.complete_spliced(cmd.tag, c, token);
                self.held.push(data);
                done
            } else {
                self.target.complete(cmd.tag, c)
            }
        } else {
            self.target.complete(
                cmd.tag,
                Completion::error(StatusCode::InvalidOpcode.status()),
            )
        };
        done.unwrap();
    }

    fn target_events(&mut self) {
        while let Some(e) = self.target.poll_event() {
            match e {
                Event::Initialized { .. } => {}
                Event::Command(c) => self.execute(c),
                Event::Closed(r) => self.target_closed = Some(r),
            }
        }
    }

    fn host_events(&mut self) {
        while let Some(e) = self.host.poll_event() {
            match e {
                InitiatorEvent::Initialized { .. } => self.initialized = true,
                InitiatorEvent::Completed(c) => self.completed.push(c),
                InitiatorEvent::Closed(r) => self.host_closed = Some(r),
            }
        }
    }

    /// Shuttles bytes both ways until neither side has anything left to say.
    fn drive(&mut self) {
        loop {
            let mut progress = self.host.poll_transmit(&mut self.to_target);
            while !self.to_target.is_empty() && !self.target.is_closed() {
                let n = self.chunk(self.to_target.len());
                let used = self.target.handle_input(&self.to_target[..n]);
                self.to_target.drain(..used);
                self.target_events();
                progress |= used > 0;
                if used == 0 {
                    break;
                }
            }
            self.target_events();
            progress |= self.target_transmit();
            while !self.to_host.is_empty() && !self.host.is_closed() {
                let n = self.chunk(self.to_host.len());
                let used = self.host.handle_input(&self.to_host[..n]);
                self.to_host.drain(..used);
                progress |= used > 0;
                if used == 0 {
                    break;
                }
            }
            self.host_events();
            if !progress {
                return;
            }
        }
    }

    fn take(&mut self, cid: u16) -> Completed {
        let at = self
            .completed
            .iter()
            .position(|c| c.cid == cid)
            .unwrap_or_else(|| panic!("cid {cid} did not complete"));
        self.completed.remove(at)
    }

    fn write(&mut self, lba: u32, data: Vec<u8>) -> u16 {
        let mut sqe = Sqe::default();
        sqe.set_opcode(0x01).set_nsid(1).set_cdw(10, lba);
        self.host.submit(sqe, Data::Write(data)).unwrap()
    }

    fn read(&mut self, lba: u32, len: u32) -> u16 {
        let mut sqe = Sqe::default();
        sqe.set_opcode(0x02).set_nsid(1).set_cdw(10, lba);
        self.host.submit(sqe, Data::Read(len)).unwrap()
    }

    /// The target's transmit, spliced data put in place as a vectored write would send it.
    fn target_transmit(&mut self) -> bool {
        if !self.splice {
            return self.target.poll_transmit(&mut self.to_host);
        }
        let (mut bytes, mut splices) = (Vec::new(), Vec::new());
        let any = self.target.poll_transmit_vectored(&mut bytes, &mut splices);
        let mut from = 0;
        for s in splices {
            self.to_host.extend_from_slice(&bytes[from..s.at]);
            let held = &self.held[usize::try_from(s.token).unwrap()];
            self.to_host
                .extend_from_slice(&held[s.start..s.start + s.len]);
            from = s.at;
        }
        self.to_host.extend_from_slice(&bytes[from..]);
        any
    }

    /// Sends raw bytes from the host and drives; returns the target's close reason.
    fn inject(&mut self, bytes: &[u8]) {
        self.host.send_raw(bytes);
        self.drive();
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from(i % 251).unwrap() ^ seed)
        .collect()
}

fn small_limits() -> QueueConfig {
    QueueConfig {
        maxh2cdata: 8192,
        max_c2h_data: 4096,
        io_in_capsule: 4096,
        ..QueueConfig::default()
    }
}

fn host_config(digests: Digests) -> InitiatorConfig {
    InitiatorConfig {
        digests,
        in_capsule_limit: 4096,
        ..InitiatorConfig::default()
    }
}

/// In-capsule writes, R2T writes split over several H2CData PDUs, and multi-PDU reads, with
/// digests off and on, in whole buffers and in random chunks, read data copied or spliced.
#[test]
fn writes_and_reads_round_trip_in_every_mode() {
    for digests in [
        Digests::NONE,
        Digests::BOTH,
        Digests {
            header: true,
            data: false,
        },
    ] {
        for (seed, splice) in [
            (0u64, false),
            (1, true),
            (0x9e37_79b9_7f4a_7c15, false),
            (42, true),
        ] {
            let mut p = Pair::connected(small_limits(), host_config(digests), seed, 1);
            p.splice = splice;
            assert_eq!(p.target.digests(), digests);
            let small = pattern(2048, 1); // in-capsule
            let large = pattern(40_000, 2); // R2T, 5 H2CData PDUs of <= 8192
            let w1 = p.write(0, small.clone());
            let w2 = p.write(100, large.clone());
            p.drive();
            assert!(p.take(w1).cqe.status().is_success());
            assert!(p.take(w2).cqe.status().is_success());
            assert_eq!(&p.ram[..2048], &small[..]);
            assert_eq!(&p.ram[100 * 512..100 * 512 + 40_000], &large[..]);
            // 40000 bytes come back in 10 C2HData PDUs of <= 4096.
            let r = p.read(100, 40_000);
            let r_small = p.read(0, 2048);
            p.drive();
            let got = p.take(r);
            assert!(got.cqe.status().is_success());
            assert!(got.data_digest_ok);
            assert_eq!(got.data, large);
            assert_eq!(p.take(r_small).data, small);
            assert!(p.target_closed.is_none() && p.host_closed.is_none());
            assert_eq!(p.host.in_flight(), 0);
        }
    }
}

#[test]
fn many_commands_in_flight_complete_independently() {
    let mut p = Pair::connected(small_limits(), host_config(Digests::BOTH), 7, 2);
    let mut cids = Vec::new();
    for i in 0..32u32 {
        let len = if i % 2 == 0 { 1024 } else { 9000 };
        cids.push((
            p.write(i * 64, pattern(len, u8::try_from(i).unwrap())),
            i,
            len,
        ));
    }
    p.drive();
    for (cid, i, len) in cids {
        assert!(p.take(cid).cqe.status().is_success());
        let at = usize::try_from(i * 64 * 512).unwrap();
        assert_eq!(
            &p.ram[at..at + len],
            &pattern(len, u8::try_from(i).unwrap())[..]
        );
    }
    // Unknown opcode: a status, not a protocol error.
    let mut sqe = Sqe::default();
    sqe.set_opcode(0x7e);
    let cid = p.host.submit(sqe, Data::None).unwrap();
    p.drive();
    assert_eq!(p.take(cid).cqe.status(), StatusCode::InvalidOpcode.status());
}

fn raw(pdu: &Pdu, opts: EncodeOptions) -> Vec<u8> {
    let mut b = Vec::new();
    pdu.encode(&opts, &mut b).unwrap();
    b
}

fn write_capsule(cid: u16, len: usize) -> Pdu {
    let mut sqe = Sqe::default();
    sqe.set_opcode(0x01)
        .set_cid(cid)
        .set_in_capsule(u32::try_from(len).unwrap());
    Pdu::CapsuleCmd(CapsuleCmd {
        sqe,
        data: pattern(len, 9).into(),
    })
}

/// Runs `bad` on one connected pair while a second pair keeps working; returns what the first
/// pair's target closed with and checks the host got a C2HTermReq with the same FES/FEI.
fn expect_term(digests: Digests, bad: impl FnOnce(&mut Pair)) -> PduError {
    let mut victim = Pair::connected(small_limits(), host_config(digests), 0, 1);
    let mut bystander = Pair::connected(small_limits(), host_config(digests), 3, 1);
    let w = bystander.write(8, pattern(20_000, 4));
    bad(&mut victim);
    let Some(CloseReason::ProtocolError(err)) = victim.target_closed.take() else {
        panic!(
            "target did not close with a protocol error: {:?}",
            victim.target_closed
        );
    };
    assert!(victim.target.is_closed());
    match victim.host_closed.take() {
        Some(InitiatorClose::PeerTerminated { fes, fei, header }) => {
            assert_eq!((fes, fei), (err.fes() as u16, err.fei()));
            assert!(header.len() >= 8 && header.len() <= 128);
        }
        other => panic!("host did not receive a C2HTermReq: {other:?}"),
    }
    // The closed queue takes nothing more.
    assert_eq!(victim.target.handle_input(&[0; 64]), 0);
    // The other connection is untouched.
    bystander.drive();
    assert!(bystander.take(w).cqe.status().is_success());
    let r = bystander.read(8, 20_000);
    bystander.drive();
    assert_eq!(bystander.take(r).data, pattern(20_000, 4));
    assert!(bystander.target_closed.is_none());
    err
}

#[test]
fn wrong_hlen_terminates_with_invalid_header_field() {
    let e = expect_term(Digests::NONE, |p| {
        let mut b = raw(&write_capsule(900, 512), EncodeOptions::default());
        b[2] = 24;
        p.inject(&b);
    });
    assert_eq!((e.fes(), e.fei()), (Fes::InvalidHeaderField, 2));
}

#[test]
fn unknown_type_terminates() {
    let e = expect_term(Digests::NONE, |p| {
        let mut b = raw(&write_capsule(900, 0), EncodeOptions::default());
        b[0] = 0x0c;
        p.inject(&b);
    });
    assert_eq!((e.fes(), e.fei()), (Fes::InvalidHeaderField, 0));
}

#[test]
fn bad_header_digest_terminates() {
    let e = expect_term(Digests::BOTH, |p| {
        let opts = p.host.encode_options();
        let mut b = raw(&write_capsule(900, 512), opts);
        b[20] ^= 0x40;
        p.inject(&b);
    });
    assert_eq!(e.fes(), Fes::HeaderDigestError);
}

#[test]
fn oversized_plen_terminates_with_data_limit_exceeded() {
    let e = expect_term(Digests::NONE, |p| {
        let mut b = raw(&write_capsule(900, 512), EncodeOptions::default());
        b[4..8].copy_from_slice(&(1u32 << 30).to_le_bytes());
        p.inject(&b[..80]);
    });
    assert_eq!(e.fes(), Fes::DataLimitExceeded);
}

#[test]
fn h2c_data_with_unknown_ttag_terminates() {
    let e = expect_term(Digests::NONE, |p| {
        let b = raw(
            &Pdu::H2cData(DataPdu {
                cccid: 1,
                ttag: 40_000,
                offset: 0,
                last: true,
                success: false,
                data: vec![1; 512].into(),
            }),
            EncodeOptions::default(),
        );
        p.inject(&b);
    });
    assert_eq!((e.fes(), e.fei()), (Fes::InvalidHeaderField, 10));
}

/// Holds back the R2T a large write gets, then answers it with H2CData at `offset`.
fn answer_r2t_at(p: &mut Pair, offset: u32, len: usize) {
    let cid = p.write(0, pattern(16_384, 5));
    let mut bytes = Vec::new();
    p.host.poll_transmit(&mut bytes);
    assert_eq!(p.target.handle_input(&bytes), bytes.len());
    let mut out = Vec::new();
    p.target.poll_transmit(&mut out);
    let mut dec = Decoder::new(DecoderConfig {
        receiver: Direction::HostToController,
        digests: p.target.digests(),
        pda: 0,
        max_data_pdu: 1 << 20,
        max_in_capsule: 0,
    });
    let Some(Ok(Pdu::R2t(r2t))) = dec.decode(&out).result else {
        panic!("expected an R2T");
    };
    assert_eq!((r2t.cccid, r2t.offset, r2t.length), (cid, 0, 16_384));
    let b = raw(
        &Pdu::H2cData(DataPdu {
            cccid: cid,
            ttag: r2t.ttag,
            offset,
            last: true,
            success: false,
            data: vec![7; len].into(),
        }),
        p.host.encode_options(),
    );
    p.inject(&b);
}

#[test]
fn h2c_data_outside_the_r2t_terminates_with_data_out_of_range() {
    let e = expect_term(Digests::NONE, |p| answer_r2t_at(p, 12_288, 8192));
    assert_eq!(e.fes(), Fes::DataOutOfRange);
    let e = expect_term(Digests::BOTH, |p| answer_r2t_at(p, 4096, 512));
    assert_eq!(e.fes(), Fes::DataOutOfRange);
}

#[test]
fn h2c_data_beyond_maxh2cdata_terminates() {
    let e = expect_term(Digests::NONE, |p| answer_r2t_at(p, 0, 8196));
    assert_eq!(e.fes(), Fes::DataLimitExceeded);
}

#[test]
fn data_digest_error_fails_only_that_command() {
    let opts = EncodeOptions {
        digests: Digests::BOTH,
        pda: 0,
    };
    let mut b = raw(&write_capsule(500, 1024), opts);
    let at = b.len() - 100;
    b[at] ^= 1;
    // A good command after it still runs.
    b.extend_from_slice(&raw(&write_capsule(501, 1024), opts));
    let mut q = Queue::new(small_limits(), Duration::ZERO).unwrap();
    let mut ic = raw(
        &Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::BOTH,
            maxr2t: 0,
        }),
        EncodeOptions::default(),
    );
    ic.extend_from_slice(&b);
    assert_eq!(q.handle_input(&ic), ic.len());
    let mut out = Vec::new();
    q.poll_transmit(&mut out);
    let mut dec = Decoder::new(DecoderConfig {
        receiver: Direction::HostToController,
        digests: Digests::BOTH,
        pda: 0,
        max_data_pdu: 1 << 20,
        max_in_capsule: 0,
    });
    let first = dec.decode(&out);
    assert!(matches!(first.result, Some(Ok(Pdu::IcResp(_)))));
    let second = dec.decode(&out[first.consumed..]);
    let Some(Ok(Pdu::CapsuleResp(resp))) = second.result else {
        panic!("expected a response capsule");
    };
    assert_eq!(resp.cqe.cid, 500);
    assert_eq!(
        resp.cqe.status(),
        StatusCode::TransientTransportError.status()
    );
    assert!(!q.is_closed());
    assert!(matches!(q.poll_event(), Some(Event::Initialized { .. })));
    let Some(Event::Command(cmd)) = q.poll_event() else {
        panic!("the good command is handed out");
    };
    assert_eq!(cmd.sqe.cid(), 501, "the corrupted command is not executed");
    assert_eq!(q.poll_event(), None);
}

#[test]
fn sequence_errors() {
    // A command before the ICReq.
    let mut q = Queue::new(QueueConfig::default(), Duration::ZERO).unwrap();
    let b = raw(&write_capsule(1, 0), EncodeOptions::default());
    q.handle_input(&b);
    let Some(Event::Closed(CloseReason::ProtocolError(e))) = q.poll_event() else {
        panic!("expected a close");
    };
    assert_eq!(
        e,
        PduError::Sequence(SequenceError::ExpectedInitialization(PduType::CapsuleCmd))
    );
    let mut out = Vec::new();
    assert!(q.poll_transmit(&mut out));
    assert_eq!(out[0], PduType::C2hTermReq as u8);
    assert_eq!(
        u16::from_le_bytes([out[8], out[9]]),
        Fes::PduSequenceError as u16
    );
    // The TermReq carries the offending header.
    assert_eq!(&out[24..32], &b[..8]);

    // A second ICReq.
    let e = expect_term(Digests::NONE, |p| {
        p.inject(&raw(
            &Pdu::IcReq(IcReq {
                pfv: 0,
                hpda: 0,
                digests: Digests::NONE,
                maxr2t: 0,
            }),
            EncodeOptions::default(),
        ));
    });
    assert_eq!(e, PduError::Sequence(SequenceError::RepeatedInitialization));

    // More commands than slots before Connect installed the queue.
    let mut p = Pair::new(small_limits(), host_config(Digests::NONE), 0);
    p.drive();
    let mut sqe = Sqe::default();
    sqe.set_opcode(0x02);
    // Send both before the target answers: the first occupies the only slot.
    let mut both = raw(&write_capsule(1, 0), EncodeOptions::default());
    both.extend_from_slice(&raw(&write_capsule(2, 0), EncodeOptions::default()));
    p.target.handle_input(&both);
    let mut closed = None;
    while let Some(e) = p.target.poll_event() {
        if let Event::Closed(r) = e {
            closed = Some(r);
        }
    }
    assert_eq!(
        closed,
        Some(CloseReason::ProtocolError(PduError::Sequence(
            SequenceError::QueueFull
        )))
    );
}

#[test]
fn icreq_parameters_are_checked() {
    let ic = |pfv, digests| {
        raw(
            &Pdu::IcReq(IcReq {
                pfv,
                hpda: 0,
                digests,
                maxr2t: 0,
            }),
            EncodeOptions::default(),
        )
    };
    let mut q = Queue::new(QueueConfig::default(), Duration::ZERO).unwrap();
    q.handle_input(&ic(1, Digests::NONE));
    assert_eq!(
        q.poll_event(),
        Some(Event::Closed(CloseReason::ProtocolError(
            PduError::UnsupportedParameter { offset: 8 }
        )))
    );
    let cfg = QueueConfig {
        allowed_digests: Digests::NONE,
        ..QueueConfig::default()
    };
    let mut q = Queue::new(cfg, Duration::ZERO).unwrap();
    q.handle_input(&ic(0, Digests::BOTH));
    let Some(Event::Closed(CloseReason::ProtocolError(e))) = q.poll_event() else {
        panic!("expected a close");
    };
    assert_eq!((e.fes(), e.fei()), (Fes::UnsupportedParameter, 11));
    assert_eq!(
        QueueConfig {
            maxh2cdata: 1000,
            ..QueueConfig::default()
        }
        .validate(),
        Err(ConfigError::MaxH2cData)
    );
}

#[test]
fn icreq_timeout_closes_without_sleeping() {
    let start = Duration::from_secs(100);
    let mut q = Queue::new(QueueConfig::default(), start).unwrap();
    assert_eq!(q.poll_timeout(), Some(start + Duration::from_secs(10)));
    q.handle_timeout(start + Duration::from_secs(9));
    assert!(!q.is_closed());
    q.handle_timeout(start + Duration::from_secs(10));
    assert!(q.is_closed());
    assert_eq!(
        q.poll_event(),
        Some(Event::Closed(CloseReason::IcReqTimeout))
    );
    assert_eq!(q.poll_timeout(), None);
    // Once live there is no transport timer.
    let mut p = Pair::new(QueueConfig::default(), host_config(Digests::NONE), 0);
    p.drive();
    assert_eq!(p.target.poll_timeout(), None);
}

#[test]
fn host_misuse_is_an_error_not_a_panic() {
    let mut p = Pair::connected(small_limits(), host_config(Digests::NONE), 0, 1);
    assert_eq!(
        p.target.complete(CommandTag(5), Completion::success(0)),
        Err(HostError::UnknownTag)
    );
    assert_eq!(p.target.install(1, 31), Err(HostError::NotInstallable));
    let mut sqe = Sqe::default();
    sqe.set_opcode(0x02);
    p.host.submit(sqe, Data::Read(4096)).unwrap();
    let mut bytes = Vec::new();
    p.host.poll_transmit(&mut bytes);
    p.target.handle_input(&bytes);
    let Some(Event::Command(cmd)) = p.target.poll_event() else {
        panic!("expected a command");
    };
    assert_eq!(cmd.read_len, 4096);
    assert_eq!(
        p.target.complete(
            cmd.tag,
            Completion {
                status: Status::SUCCESS,
                result: 0,
                data: &[0; 10],
            }
        ),
        Err(HostError::DataLength {
            given: 10,
            expected: 4096
        })
    );
    let mut q = Queue::new(QueueConfig::default(), Duration::ZERO).unwrap();
    assert_eq!(q.install(0, 31), Err(HostError::NotInstallable));
    let mut p = Pair::new(QueueConfig::default(), host_config(Digests::NONE), 0);
    p.drive();
    assert_eq!(p.target.install(0, 128), Err(HostError::QueueTooLarge));
}

#[test]
fn bad_data_pointers_complete_with_a_status() {
    let mut p = Pair::connected(small_limits(), host_config(Digests::NONE), 0, 1);
    // In-capsule SGL on a read.
    let mut sqe = Sqe::default();
    sqe.set_opcode(0x02).set_cid(700).set_in_capsule(512);
    let mut q_bytes = raw(
        &Pdu::CapsuleCmd(CapsuleCmd {
            sqe,
            data: vec![0; 512].into(),
        }),
        EncodeOptions::default(),
    );
    // SGL length larger than the capsule data.
    let mut sqe = Sqe::default();
    sqe.set_opcode(0x01).set_cid(701).set_in_capsule(1024);
    q_bytes.extend_from_slice(&raw(
        &Pdu::CapsuleCmd(CapsuleCmd {
            sqe,
            data: vec![0; 512].into(),
        }),
        EncodeOptions::default(),
    ));
    // Transfer above max_transfer.
    let mut sqe = Sqe::default();
    sqe.set_opcode(0x02)
        .set_cid(702)
        .set_transport_data(64 << 20);
    q_bytes.extend_from_slice(&raw(
        &Pdu::CapsuleCmd(CapsuleCmd {
            sqe,
            data: DataBuf::default(),
        }),
        EncodeOptions::default(),
    ));
    // A keyed SGL descriptor.
    let mut sqe = Sqe::default();
    sqe.set_opcode(0x02).set_cid(703).set_sgl(0x1000, 512, 0x40);
    q_bytes.extend_from_slice(&raw(
        &Pdu::CapsuleCmd(CapsuleCmd {
            sqe,
            data: DataBuf::default(),
        }),
        EncodeOptions::default(),
    ));
    assert_eq!(p.target.handle_input(&q_bytes), q_bytes.len());
    assert_eq!(p.target.poll_event(), None);
    let mut out = Vec::new();
    p.target.poll_transmit(&mut out);
    let mut dec = Decoder::new(DecoderConfig {
        receiver: Direction::HostToController,
        digests: Digests::NONE,
        pda: 0,
        max_data_pdu: 1 << 20,
        max_in_capsule: 0,
    });
    let mut statuses = Vec::new();
    let mut rest = &out[..];
    while !rest.is_empty() {
        let d = dec.decode(rest);
        rest = &rest[d.consumed..];
        if let Some(Ok(Pdu::CapsuleResp(r))) = d.result {
            statuses.push((r.cqe.cid, r.cqe.status()));
        }
    }
    assert_eq!(
        statuses,
        vec![
            (700, StatusCode::InvalidField.status()),
            (701, StatusCode::DataSglLengthInvalid.status()),
            (702, StatusCode::DataSglLengthInvalid.status()),
            (703, StatusCode::SglDescriptorTypeInvalid.status()),
        ]
    );
    assert!(!p.target.is_closed());
}

#[test]
fn a_host_that_never_reads_cannot_grow_the_transmit_buffer() {
    let mut p = Pair::connected(small_limits(), host_config(Digests::NONE), 0, 1);
    // Commands refused at once (keyed SGL) hold no slot: only backpressure bounds their responses.
    let mut sqe = Sqe::default();
    sqe.set_opcode(0x02).set_sgl(0x1000, 512, 0x40);
    let one = raw(
        &Pdu::CapsuleCmd(CapsuleCmd {
            sqe,
            data: DataBuf::default(),
        }),
        EncodeOptions::default(),
    );
    let stream: Vec<u8> = one
        .iter()
        .copied()
        .cycle()
        .take(one.len() * 20_000)
        .collect();
    let mut at = 0;
    loop {
        let used = p.target.handle_input(&stream[at..]);
        at += used;
        if used == 0 {
            break;
        }
    }
    assert!(at < stream.len(), "input stops being consumed");
    assert_eq!(p.target.poll_event(), None);
    let mut out = Vec::new();
    p.target.poll_transmit(&mut out);
    assert!(out.len() <= TX_HIGH_WATER + 24, "{}", out.len());
    // Once drained, it consumes again.
    assert!(p.target.handle_input(&stream[at..]) > 0);
    assert!(!p.target.is_closed());
}

/// A spliced completion sends exactly the bytes of a copied one (every C2HData PDU, its padding
/// and digests), only the data comes from the caller's buffer; offsets follow what was already
/// in the output buffer.
#[test]
fn spliced_read_data_goes_out_exactly_as_copied_data() {
    let mut bytes = Vec::new();
    for splice in [false, true] {
        let mut p = Pair::connected(small_limits(), host_config(Digests::BOTH), 0, 1);
        p.ram[512..512 + 10_000].copy_from_slice(&pattern(10_000, 9));
        p.read(1, 10_000);
        p.splice = splice;
        p.host.poll_transmit(&mut p.to_target);
        let used = p.target.handle_input(&p.to_target);
        p.to_target.drain(..used);
        p.target_events();
        p.to_host.extend_from_slice(b"already queued");
        assert!(p.target_transmit());
        bytes.push(std::mem::take(&mut p.to_host));
        assert_eq!(p.held.len(), usize::from(splice));
    }
    assert_eq!(bytes[0], bytes[1]);
    // 3 C2HData PDUs of <= 4096 bytes, each with header and data digests, and a CapsuleResp.
    assert!(bytes[0].len() > 14 + 10_000 + 3 * 8);
}
