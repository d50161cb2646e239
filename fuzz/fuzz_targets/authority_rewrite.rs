//! Arbitrary client bytes into the unix-socket `:authority` rewriter (`edgevol_uds::AuthorityFix`,
//! in front of every gRPC server edgevol runs on a unix socket: HTTP/2 framing and HPACK from
//! any local client).
//!
//! Byte 0: bit 7 set prepends the client preface (so every other byte is a frame); the low bits
//! seed the chunk sizes of a second, piecewise feed. Oracle: nothing panics, and
//! - fed whole or in chunks, the rewriter emits the same bytes and the same result;
//! - what it emits is well-formed: whole frames of at most MAX_FRAME_SIZE bytes, every header
//!   block a HEADERS frame (unpadded) and its CONTINUATIONs ending in END_HEADERS, decodable by a
//!   fresh HPACK decoder (literals only), at most MAX_HEADER_BLOCK bytes however much the
//!   client's indexes expand, every `:authority` in it a valid URI authority;
//! - what it emits is a fixed point: rewritten again, it comes out unchanged and without error.
//!
//! Seeds (fuzz/corpus/authority_rewrite/): connections of C-core-like, Java-like and Go-like
//! clients (socket path, `localhost`, host:port authorities; dynamic table, padding,
//! priority, CONTINUATION, SETTINGS and DATA frames), encoded with an HPACK encoder.
//!
//! Run from the repository root: `scripts/fuzz.sh authority_rewrite 60`
#![no_main]

use edgevol_fuzz::H2_PREFACE;
use edgevol_uds::rewrite::{Error, MAX_FRAME_SIZE, MAX_HEADER_BLOCK};
use edgevol_uds::AuthorityFix;
use libfuzzer_sys::fuzz_target;
use loona_hpack::Decoder;

const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

fn rewrite(input: &[u8]) -> (Vec<u8>, Result<(), Error>) {
    let mut out = Vec::new();
    let result = AuthorityFix::new().feed(input, &mut out);
    (out, result)
}

fn rewrite_in_chunks(input: &[u8], seed: u8) -> (Vec<u8>, Result<(), Error>) {
    let mut fix = AuthorityFix::new();
    let mut out = Vec::new();
    let mut chunk = usize::from(seed & 0x3f) + 1;
    let mut at = 0;
    while at < input.len() {
        let end = (at + chunk).min(input.len());
        if let Err(e) = fix.feed(&input[at..end], &mut out) {
            return (out, Err(e));
        }
        at = end;
        chunk = chunk * 7 % 509 + 1;
    }
    (out, Ok(()))
}

/// Checks the frames emitted after the preface.
fn check_frames(mut bytes: &[u8]) {
    let mut decoder = Decoder::new();
    let mut block: Option<([u8; 4], Vec<u8>)> = None;
    while !bytes.is_empty() {
        assert!(bytes.len() >= 9, "a partial frame header was emitted");
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        assert!(len <= MAX_FRAME_SIZE, "emitted a frame of {len} bytes");
        assert!(bytes.len() >= 9 + len, "a partial frame was emitted");
        let (kind, flags) = (bytes[3], bytes[4]);
        let stream = [bytes[5], bytes[6], bytes[7], bytes[8]];
        let payload = &bytes[9..9 + len];
        bytes = &bytes[9 + len..];
        let fragment = match (kind, &mut block) {
            (TYPE_HEADERS, None) => {
                assert_eq!(flags & FLAG_PADDED, 0, "padding is dropped");
                let skip = if flags & FLAG_PRIORITY != 0 { 5 } else { 0 };
                assert!(payload.len() >= skip, "priority fields cut");
                block = Some((stream, Vec::new()));
                &payload[skip..]
            }
            (TYPE_CONTINUATION, Some((s, _))) => {
                assert_eq!(*s, stream, "CONTINUATION of another stream");
                payload
            }
            (TYPE_CONTINUATION, None) => panic!("emitted a CONTINUATION outside a block"),
            (_, Some(_)) => panic!("emitted a frame inside a header block"),
            (_, None) => continue,
        };
        let (_, fields) = block.as_mut().expect("in a block");
        fields.extend_from_slice(fragment);
        if flags & FLAG_END_HEADERS != 0 {
            let (_, fields) = block.take().expect("in a block");
            // HPACK indexes expand: 1 byte may name a 4 KiB table entry.
            assert!(
                fields.len() <= MAX_HEADER_BLOCK,
                "emitted a header block of {} bytes",
                fields.len()
            );
            let headers = decoder
                .decode(&fields)
                .expect("an emitted header block decodes");
            for (name, value) in headers {
                if name == b":authority" {
                    assert!(
                        http::uri::Authority::try_from(&value[..]).is_ok(),
                        "emitted an invalid :authority {value:?}"
                    );
                }
            }
        }
    }
    assert!(
        block.is_none(),
        "a header block was emitted without its end"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let mut input = Vec::with_capacity(H2_PREFACE.len() + body.len());
    if mode & 0x80 != 0 {
        input.extend_from_slice(H2_PREFACE);
    }
    input.extend_from_slice(body);

    let (out, result) = rewrite(&input);
    assert_eq!(
        rewrite_in_chunks(&input, mode),
        (out.clone(), result),
        "chunking changed the output"
    );

    let preface = input.len().min(H2_PREFACE.len());
    assert_eq!(
        &out[..preface],
        &input[..preface],
        "the preface passes unchanged"
    );
    check_frames(&out[preface..]);

    let (again, result) = rewrite(&out);
    assert_eq!(result, Ok(()), "the rewriter refused its own output");
    assert_eq!(again, out, "the output is not a fixed point");
});
