//! Codec tests: every PDU type round-trips through `encode` and the incremental decoder, with and
//! without digests; malformed PDUs give the right typed error; chunking never changes the result.

use super::*;
use crate::decoder::{Decoded, Decoder, DecoderConfig};
use crate::pdu_error::{Fes, HeaderField, PduError};
use crate::status::StatusCode;
use proptest::prelude::*;

fn config(receiver: Direction, digests: Digests) -> DecoderConfig {
    DecoderConfig {
        receiver,
        digests,
        pda: 0,
        max_data_pdu: 128 * 1024,
        max_in_capsule: 16 * 1024,
    }
}

fn receiver_of(pdu: &Pdu) -> Direction {
    match pdu.pdu_type().direction() {
        Direction::HostToController => Direction::ControllerToHost,
        Direction::ControllerToHost => Direction::HostToController,
    }
}

/// Decodes `bytes` fed in one piece, expecting exactly whole PDUs.
fn decode_all(cfg: DecoderConfig, bytes: &[u8]) -> Vec<Result<Pdu, PduError>> {
    let mut dec = Decoder::new(cfg);
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let d = dec.decode(&bytes[at..]);
        at += d.consumed;
        match d.result {
            Some(r) => {
                let fatal = matches!(&r, Err(e) if e.is_fatal());
                out.push(r);
                if fatal {
                    break;
                }
            }
            None => assert_eq!(at, bytes.len(), "decoder stalled with input left"),
        }
    }
    out
}

fn sample_pdus() -> Vec<Pdu> {
    let mut sqe = crate::sqe::Sqe::default();
    sqe.set_opcode(0x01)
        .set_cid(7)
        .set_nsid(1)
        .set_in_capsule(300);
    let mut read = crate::sqe::Sqe::default();
    read.set_opcode(0x02).set_cid(8).set_transport_data(8192);
    vec![
        Pdu::IcReq(IcReq {
            pfv: PFV_1_0,
            hpda: 0,
            digests: Digests::BOTH,
            maxr2t: 0,
        }),
        Pdu::IcResp(IcResp {
            pfv: PFV_1_0,
            cpda: 0,
            digests: Digests::BOTH,
            maxh2cdata: 128 * 1024,
        }),
        Pdu::H2cTermReq(TermReq {
            fes: Fes::PduSequenceError as u16,
            fei: 0,
            header: vec![4; 24],
        }),
        Pdu::C2hTermReq(TermReq {
            fes: Fes::InvalidHeaderField as u16,
            fei: 2,
            header: vec![],
        }),
        Pdu::CapsuleCmd(CapsuleCmd {
            sqe,
            data: (0..300u32).map(|i| (i % 251) as u8).collect(),
        }),
        Pdu::CapsuleCmd(CapsuleCmd {
            sqe: read,
            data: DataBuf::default(),
        }),
        Pdu::CapsuleResp(CapsuleResp {
            cqe: Cqe::new(7, StatusCode::InvalidField.status(), 0x55),
        }),
        Pdu::H2cData(DataPdu {
            cccid: 7,
            ttag: 3,
            offset: 4096,
            last: true,
            success: false,
            data: vec![0xab; 4096].into(),
        }),
        Pdu::C2hData(DataPdu {
            cccid: 8,
            ttag: 0,
            offset: 0,
            last: true,
            success: true,
            data: vec![0xcd; 513].into(),
        }),
        Pdu::R2t(R2t {
            cccid: 7,
            ttag: 3,
            offset: 0,
            length: 65536,
        }),
    ]
}

#[test]
fn every_pdu_type_round_trips_with_and_without_digests() {
    for digests in [
        Digests::NONE,
        Digests::BOTH,
        Digests {
            header: true,
            data: false,
        },
        Digests {
            header: false,
            data: true,
        },
    ] {
        for pda in [0u8, 3] {
            for pdu in sample_pdus() {
                let opts = EncodeOptions { digests, pda };
                let mut bytes = Vec::new();
                pdu.encode(&opts, &mut bytes).unwrap();
                assert_eq!(bytes.len(), pdu.encoded_len(&opts));
                let mut cfg = config(receiver_of(&pdu), digests);
                cfg.pda = pda;
                let got = decode_all(cfg, &bytes);
                assert_eq!(got, vec![Ok(pdu.clone())], "{digests:?} pda {pda}");
            }
        }
    }
}

#[test]
fn wire_layout_matches_linux() {
    // A C2HData with both digests: hlen 24, pdo = 24 + 4, plen = pdo + data + 4 (nvmet_setup_c2h_data_pdu).
    let pdu = Pdu::C2hData(DataPdu {
        cccid: 0x0102,
        ttag: 0,
        offset: 0,
        last: true,
        success: false,
        data: vec![1, 2, 3, 4].into(),
    });
    let mut b = Vec::new();
    pdu.encode(
        &EncodeOptions {
            digests: Digests::BOTH,
            pda: 0,
        },
        &mut b,
    )
    .unwrap();
    assert_eq!(b[0], 0x07);
    assert_eq!(b[1], flags::HDGSTF | flags::DDGSTF | flags::LAST_PDU);
    assert_eq!(b[2], 24);
    assert_eq!(b[3], 28);
    assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 36);
    assert_eq!(&b[8..10], &[0x02, 0x01]);
    assert_eq!(
        u32::from_le_bytes(b[24..28].try_into().unwrap()),
        crc32c(&b[..24])
    );
    assert_eq!(
        u32::from_le_bytes(b[32..36].try_into().unwrap()),
        crc32c(&[1, 2, 3, 4])
    );
    // CRC32C check value.
    assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    // A response capsule has no data: pdo 0, plen = hlen (+ hdgst).
    let mut r = Vec::new();
    Pdu::CapsuleResp(CapsuleResp {
        cqe: Cqe::default(),
    })
    .encode(&EncodeOptions::default(), &mut r)
    .unwrap();
    assert_eq!((r[2], r[3], r.len()), (24, 0, 24));
    // ICReq: 128 bytes, never digested even when digests are negotiated.
    let mut ic = Vec::new();
    sample_pdus()[0]
        .encode(
            &EncodeOptions {
                digests: Digests::BOTH,
                pda: 0,
            },
            &mut ic,
        )
        .unwrap();
    assert_eq!((ic.len(), ic[1], ic[11]), (128, 0, 3));
}

#[test]
fn several_pdus_in_one_chunk_and_byte_by_byte() {
    let opts = EncodeOptions {
        digests: Digests::BOTH,
        pda: 0,
    };
    let pdus: Vec<Pdu> = sample_pdus()
        .into_iter()
        .filter(|p| p.pdu_type().direction() == Direction::ControllerToHost)
        .collect();
    let mut stream = Vec::new();
    for p in &pdus {
        p.encode(&opts, &mut stream).unwrap();
    }
    let cfg = config(Direction::HostToController, Digests::BOTH);
    // ICResp is never digested; the decoder applies digests only to the types that carry them.
    let whole: Vec<Pdu> = decode_all(cfg, &stream)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(whole, pdus);
    let mut dec = Decoder::new(cfg);
    let mut one_by_one = Vec::new();
    for byte in &stream {
        let d = dec.decode(std::slice::from_ref(byte));
        assert_eq!(d.consumed, 1);
        if let Some(r) = d.result {
            one_by_one.push(r.unwrap());
        }
    }
    assert_eq!(one_by_one, pdus);
    assert!(dec.is_idle());
}

fn encoded(pdu: &Pdu, digests: Digests) -> Vec<u8> {
    let mut b = Vec::new();
    pdu.encode(&EncodeOptions { digests, pda: 0 }, &mut b)
        .unwrap();
    b
}

fn first_error(cfg: DecoderConfig, bytes: &[u8]) -> PduError {
    match decode_all(cfg, bytes).pop() {
        Some(Err(e)) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn malformed_headers_are_typed_errors_with_fes_and_fei() {
    let target = config(Direction::ControllerToHost, Digests::NONE);
    let cmd = sample_pdus()[4].clone();

    let mut b = encoded(&cmd, Digests::NONE);
    b[2] = 64;
    let e = first_error(target, &b);
    assert_eq!(e, PduError::field(HeaderField::Hlen));
    assert_eq!((e.fes(), e.fei()), (Fes::InvalidHeaderField, 2));

    let mut b = encoded(&cmd, Digests::NONE);
    b[0] = 0x08;
    let e = first_error(target, &b);
    assert_eq!((e.fes(), e.fei()), (Fes::InvalidHeaderField, 0));

    // A controller-to-host type sent to a target.
    let b = encoded(&sample_pdus()[9], Digests::NONE);
    assert_eq!(first_error(target, &b), PduError::field(HeaderField::Type));

    // Header digest flag missing while negotiated.
    let b = encoded(&cmd, Digests::NONE);
    let e = first_error(config(Direction::ControllerToHost, Digests::BOTH), &b);
    assert_eq!((e.fes(), e.fei()), (Fes::InvalidHeaderField, 1));

    // PDO not where the alignment puts it.
    let mut b = encoded(&cmd, Digests::NONE);
    b[3] = 76;
    assert_eq!(first_error(target, &b), PduError::field(HeaderField::Pdo));

    // plen smaller than the header.
    let mut b = encoded(&cmd, Digests::NONE);
    b[4..8].copy_from_slice(&20u32.to_le_bytes());
    assert_eq!(first_error(target, &b), PduError::field(HeaderField::Plen));

    // ICReq with a wrong plen.
    let mut b = encoded(&sample_pdus()[0], Digests::NONE);
    b[4..8].copy_from_slice(&132u32.to_le_bytes());
    assert_eq!(first_error(target, &b), PduError::field(HeaderField::Plen));

    // H2CData whose datal disagrees with plen.
    let mut b = encoded(&sample_pdus()[7], Digests::NONE);
    b[16..20].copy_from_slice(&4000u32.to_le_bytes());
    let e = first_error(target, &b);
    assert_eq!((e.fes(), e.fei()), (Fes::InvalidHeaderField, 16));
}

#[test]
fn oversized_plen_is_refused_before_buffering() {
    let mut cfg = config(Direction::ControllerToHost, Digests::NONE);
    cfg.max_data_pdu = 4096;
    let data = Pdu::H2cData(DataPdu {
        cccid: 1,
        ttag: 0,
        offset: 0,
        last: true,
        success: false,
        data: vec![0; 8192].into(),
    });
    let b = encoded(&data, Digests::NONE);
    let mut dec = Decoder::new(cfg);
    // Only the common header is needed to refuse it.
    let d = dec.decode(&b[..8]);
    let e = d.result.unwrap().unwrap_err();
    assert_eq!(
        e,
        PduError::DataLimitExceeded {
            length: 8192,
            max: 4096
        }
    );
    assert_eq!(e.fes(), Fes::DataLimitExceeded);
    assert!(dec.is_failed());
    assert_eq!(dec.decode(&b[8..]).consumed, 0);

    // A 4 GiB plen on a capsule.
    let mut b = encoded(&sample_pdus()[4], Digests::NONE);
    b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let e = first_error(config(Direction::ControllerToHost, Digests::NONE), &b);
    assert_eq!(e.fes(), Fes::DataLimitExceeded);
}

#[test]
fn digest_errors() {
    let cfg = config(Direction::ControllerToHost, Digests::BOTH);
    let cmd = sample_pdus()[4].clone();
    let good = encoded(&cmd, Digests::BOTH);

    let mut b = good.clone();
    b[10] ^= 0xff; // inside the SQE, covered by the header digest
    let e = first_error(cfg, &b);
    assert!(matches!(e, PduError::HeaderDigest { .. }));
    assert_eq!(e.fes(), Fes::HeaderDigestError);
    assert!(e.is_fatal());

    let mut b = good.clone();
    let last = b.len() - 10;
    b[last] ^= 1; // inside the data
    match first_error(cfg, &b) {
        PduError::DataDigest { pdu, .. } => {
            assert!(matches!(*pdu, Pdu::CapsuleCmd(ref c) if c.sqe.cid() == 7));
        }
        other => panic!("expected a data digest error, got {other:?}"),
    }
    // A data digest error is not fatal: the next PDU decodes.
    let mut two = b.clone();
    two.extend_from_slice(&good);
    let got = decode_all(cfg, &two);
    assert_eq!(got.len(), 2);
    assert_eq!(got[1], Ok(cmd));
}

fn stream() -> (Vec<u8>, Vec<Pdu>) {
    let opts = EncodeOptions {
        digests: Digests::BOTH,
        pda: 0,
    };
    let pdus: Vec<Pdu> = sample_pdus()
        .into_iter()
        .filter(|p| p.pdu_type().direction() == Direction::HostToController)
        .collect();
    let mut bytes = Vec::new();
    for p in &pdus {
        p.encode(&opts, &mut bytes).unwrap();
    }
    (bytes, pdus)
}

proptest! {
    #[test]
    fn random_chunking_yields_the_same_pdus(cuts in proptest::collection::vec(1usize..300, 1..64)) {
        let (bytes, pdus) = stream();
        let mut dec = Decoder::new(config(Direction::ControllerToHost, Digests::BOTH));
        let mut got = Vec::new();
        let mut at = 0;
        let mut cut = cuts.iter().cycle();
        while at < bytes.len() {
            let end = (at + cut.next().copied().unwrap_or(1)).min(bytes.len());
            let mut chunk = &bytes[at..end];
            while !chunk.is_empty() {
                let d = dec.decode(chunk);
                chunk = &chunk[d.consumed..];
                if let Some(r) = d.result {
                    got.push(r.unwrap());
                }
            }
            at = end;
        }
        prop_assert_eq!(got, pdus);
        prop_assert!(dec.is_idle());
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_stall_only_when_failed(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        for digests in [Digests::NONE, Digests::BOTH] {
            let mut dec = Decoder::new(config(Direction::ControllerToHost, digests));
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let d = dec.decode(rest);
                rest = &rest[d.consumed..];
                if d.consumed == 0 {
                    prop_assert!(dec.is_failed());
                    break;
                }
            }
        }
    }
}

proptest! {
    /// The borrowed C2HData a read completes with is byte-for-byte the owned PDU's encoding.
    #[test]
    fn borrowed_c2h_data_encodes_like_the_owned_pdu(
        cccid: u16,
        offset: u32,
        last: bool,
        data in proptest::collection::vec(any::<u8>(), 0..300),
        header: bool,
        ddgst: bool,
        pda in 0u8..4,
    ) {
        let opts = EncodeOptions { digests: Digests { header, data: ddgst }, pda };
        let mut owned = Vec::new();
        Pdu::C2hData(DataPdu { cccid, ttag: 0, offset, last, success: false, data: data.clone().into() })
            .encode(&opts, &mut owned)
            .unwrap();
        let mut borrowed = Vec::new();
        C2hDataRef { cccid, offset, last, data: &data }.encode(&opts, &mut borrowed).unwrap();
        prop_assert_eq!(owned, borrowed);
    }
}

#[test]
fn a_recycled_buffer_carries_the_next_pdus_data() {
    let h2c = |byte: u8| {
        let mut b = Vec::new();
        Pdu::H2cData(DataPdu {
            cccid: 1,
            ttag: 0,
            offset: 0,
            last: true,
            success: false,
            data: vec![byte; 4096].into(),
        })
        .encode(&EncodeOptions::default(), &mut b)
        .unwrap();
        b
    };
    let data_of = |d: Decoded| match d.result {
        Some(Ok(Pdu::H2cData(d))) => d.data,
        other => panic!("expected H2CData, got {other:?}"),
    };
    let mut dec = Decoder::new(config(Direction::ControllerToHost, Digests::NONE));
    let first = data_of(dec.decode(&h2c(1)));
    let at = first.as_ptr();
    dec.recycle(first);
    let second = data_of(dec.decode(&h2c(2)));
    assert_eq!(
        second,
        vec![2; 4096],
        "the recycled buffer holds the new data only"
    );
    assert_eq!(second.as_ptr(), at, "and it is the same allocation");
}

/// A 128 KiB H2CData PDU with both digests, arriving in segment-sized chunks, is copied from the
/// input straight into the recycled buffer it is handed over in: no staging copy of its data
/// in the decoder, no new allocation, the data digest checked.
#[test]
fn large_data_goes_straight_into_the_recycled_buffer() {
    let digests = Digests {
        header: true,
        data: true,
    };
    let data: Vec<u8> = (0..128 * 1024u32).map(|i| (i % 249) as u8).collect();
    let pdu = Pdu::H2cData(DataPdu {
        cccid: 9,
        ttag: 3,
        offset: 0,
        last: true,
        success: false,
        data: data.clone().into(),
    });
    let wire = encoded(&pdu, digests);
    let mut dec = Decoder::new(config(Direction::ControllerToHost, digests));
    let spare = DataBuf::with_capacity(128 * 1024);
    let recycled_at = spare.as_ptr();
    dec.recycle(spare);
    let mut got = None;
    let mut at = 0;
    for chunk in wire.chunks(1448) {
        let mut used = 0;
        while used < chunk.len() {
            let d = dec.decode(&chunk[used..]);
            used += d.consumed;
            if let Some(r) = d.result {
                got = Some(r.unwrap());
            }
        }
        at += chunk.len();
        assert!(
            dec.header_capacity() < 256,
            "the header buffer stays small ({} bytes at {at})",
            dec.header_capacity()
        );
    }
    let Some(Pdu::H2cData(d)) = got else {
        panic!("expected H2CData, got {got:?}");
    };
    assert_eq!(d.data, data);
    assert_eq!(d.data.as_ptr(), recycled_at, "the recycled allocation");
    assert!(d.data.is_aligned(), "page-aligned for an O_DIRECT write");

    // A flipped data byte is a data digest error, the PDU still handed back.
    let mut bad = wire.clone();
    let last_data = bad.len() - DIGEST_LEN - 1;
    bad[last_data] ^= 1;
    assert!(matches!(
        decode_all(config(Direction::ControllerToHost, digests), &bad)[0],
        Err(PduError::DataDigest { .. })
    ));
}

/// Data received straight into the PDU's buffer through `data_sink` (as a socket read would,
/// after the header came through the input) decodes exactly as data passed as input, with and
/// without a data digest, and a bad digest is still caught.
#[test]
fn data_through_the_sink_decodes_as_input_does() {
    let data: Vec<u8> = (0..40_000u32).map(|i| (i % 241) as u8).collect();
    let pdu = Pdu::H2cData(DataPdu {
        cccid: 4,
        ttag: 1,
        offset: 0,
        last: true,
        success: false,
        data: data.clone().into(),
    });
    for (digests, corrupt) in [
        (Digests::NONE, false),
        (Digests::BOTH, false),
        (Digests::BOTH, true),
    ] {
        let mut wire = encoded(&pdu, digests);
        let trailer = if digests.data { 4 } else { 0 };
        let data_at = wire.len() - trailer - data.len();
        if corrupt {
            wire[data_at + 7] ^= 1;
        }
        let mut dec = Decoder::new(config(Direction::ControllerToHost, digests));
        assert!(dec.data_sink().is_none(), "no PDU yet");
        // The header and 1000 bytes of data as input.
        let d = dec.decode(&wire[..data_at + 1000]);
        assert_eq!((d.consumed, d.result.is_none()), (data_at + 1000, true));
        // The rest of the data into the sink, in two reads.
        let mut from = data_at + 1000;
        for part in [20_000, data.len() - 21_000] {
            let (sink, lacking) = dec.data_sink().expect("in the data");
            assert_eq!(lacking, data_at + data.len() - from);
            sink.extend_from_slice(&wire[from..from + part]);
            from += part;
        }
        assert!(dec.data_sink().is_none(), "the data is complete");
        let d = dec.decode(&wire[from..]);
        assert_eq!(d.consumed, trailer);
        match d.result.expect("the PDU is complete") {
            Ok(Pdu::H2cData(d)) => {
                assert!(!corrupt);
                assert_eq!(d.data, data);
            }
            Err(PduError::DataDigest { .. }) => assert!(corrupt),
            other => panic!("unexpected {other:?}"),
        }
    }
}
