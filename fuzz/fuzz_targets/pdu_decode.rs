//! Arbitrary bytes into the NVMe/TCP PDU decoder and the target queue.
//!
//! Byte 0 picks digests and whether a valid ICReq is prepended (so the fuzzer reaches the live
//! state); byte 1 seeds the chunk sizes. Commands the queue hands out are completed (Connect
//! installs the queue) so R2T, C2HData and response paths run too. Oracle: nothing panics, the
//! queue consumes input or is closed/budget-limited, and every byte the target transmits decodes
//! as a valid controller-to-host PDU stream.
//!
//! Seeds (fuzz/corpus/pdu_decode/): what the test initiator sends on a real connection to this
//! queue (ICReq, Connect, Property Get/Set, writes in capsule and through R2T, reads), with and
//! without digests.
//!
//! Run from the repository root: `scripts/fuzz.sh pdu_decode 60`
#![no_main]

use core::time::Duration;

use edgevol_fuzz::pdu_queue_config;
use edgevol_nvmeof::decoder::{Decoder, DecoderConfig};
use edgevol_nvmeof::fabrics_cmd::{fctype, ConnectCmd};
use edgevol_nvmeof::pdu::{Digests, Direction, EncodeOptions, IcReq, Pdu, PFV_1_0};
use edgevol_nvmeof::queue::{Completion, Event, HostError, Queue};
use edgevol_nvmeof::sqe::FABRICS_OPCODE;
use edgevol_nvmeof::status::Status;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let Some((&seed, body)) = rest.split_first() else {
        return;
    };
    let digests = Digests::from_bits(mode);

    // The decoder alone, as a target would run it.
    let mut dec = Decoder::new(DecoderConfig {
        receiver: Direction::ControllerToHost,
        digests,
        pda: 0,
        max_data_pdu: 8192,
        max_in_capsule: 8192,
    });
    let mut at = 0;
    while at < body.len() {
        let d = dec.decode(&body[at..]);
        at += d.consumed;
        if d.consumed == 0 {
            assert!(dec.is_failed());
            break;
        }
    }

    // The queue, optionally past a valid ICReq.
    let mut stream = Vec::new();
    if mode & 0x80 != 0 {
        Pdu::IcReq(IcReq {
            pfv: PFV_1_0,
            hpda: (mode >> 2) & 0x3,
            digests,
            maxr2t: 0,
        })
        .encode(&EncodeOptions::default(), &mut stream)
        .expect("ICReq encodes");
    }
    stream.extend_from_slice(body);
    let mut q = Queue::new(pdu_queue_config(), Duration::ZERO).expect("valid config");
    let mut out = Vec::new();
    // The HPDA of the ICReq the queue accepted (the stream's first PDU, prepended or not): the
    // target aligns C2HData to it, so the oracle's decoder must too.
    let mut hpda = None;
    let mut at = 0;
    let mut chunk = usize::from(seed) + 1;
    while at < stream.len() && !q.is_closed() {
        let end = (at + chunk).min(stream.len());
        let used = q.handle_input(&stream[at..end]);
        at += used;
        chunk = chunk * 7 % 509 + 1;
        while let Some(event) = q.poll_event() {
            if let Event::Initialized { .. } = event {
                // ICReq: HPDA at byte 10 of its header.
                hpda = Some(stream[10]);
            }
            if let Event::Command(cmd) = event {
                let sqe = cmd.sqe;
                if sqe.opcode() == FABRICS_OPCODE && sqe.fctype() == fctype::CONNECT {
                    if let Ok(c) = ConnectCmd::parse(&sqe) {
                        let _ = q.install(c.qid, c.sqsize);
                    }
                }
                let data = vec![0xa5; usize::try_from(cmd.read_len).unwrap_or(0)];
                let done = q.complete(
                    cmd.tag,
                    Completion {
                        status: Status::SUCCESS,
                        result: 0,
                        data: &data,
                    },
                );
                // A later PDU of the same input may have closed the queue already.
                assert!(
                    done.is_ok() || (q.is_closed() && done == Err(HostError::Closed)),
                    "a handed-out command must complete: {done:?}"
                );
            }
        }
        q.poll_transmit(&mut out);
        if used == 0 && !q.is_closed() {
            // Only an empty chunk consumes nothing on a live queue.
            assert_eq!(end, at);
        }
    }
    q.poll_transmit(&mut out);

    // What the target sends must be well-formed.
    let mut host = Decoder::new(DecoderConfig {
        receiver: Direction::HostToController,
        digests: Digests::NONE,
        pda: hpda.unwrap_or(0),
        max_data_pdu: 8192,
        max_in_capsule: 0,
    });
    let mut at = 0;
    while at < out.len() {
        let d = host.decode(&out[at..]);
        at += d.consumed;
        match d.result {
            Some(Ok(Pdu::IcResp(r))) => {
                let mut cfg = *host.config();
                cfg.digests = r.digests;
                host.set_config(cfg);
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("target sent a malformed PDU: {e}"),
            None => assert_eq!(at, out.len(), "decoder stalled"),
        }
    }
    assert!(host.is_idle(), "target sent a truncated PDU");
});
