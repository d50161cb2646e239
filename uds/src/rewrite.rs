//! The client-to-server half of an HTTP/2 connection, with every request's `:authority` made
//! valid: sans-I/O ([`AuthorityFix::feed`] takes bytes read from the client and appends the bytes
//! the server should read).
//!
//! Frames other than HEADERS and CONTINUATION pass unchanged. A header block is decoded with
//! the client's HPACK state, `:authority` replaced by `localhost` when it is not a valid URI
//! authority, and the block re-encoded with literals only (no dynamic table, no Huffman), so the
//! server's decoder never depends on the client's table. The server's side of the connection is
//! untouched.

use std::fmt;

use loona_hpack::decoder::DecoderError;
use loona_hpack::Decoder;

/// What a client connection begins with (RFC 9113 section 3.4); passed through unchecked.
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
/// The server's SETTINGS_MAX_FRAME_SIZE: hyper and tonic keep the HTTP/2 default, so no client
/// may send a larger frame, and ours never do.
pub const MAX_FRAME_SIZE: usize = 16_384;
/// The server's SETTINGS_HEADER_TABLE_SIZE (the default; neither hyper nor tonic changes it):
/// the largest dynamic table the client's encoder may use.
const HEADER_TABLE_SIZE: usize = 4_096;
/// Largest header block accepted (all its fragments) and written (the literals it expands to):
/// well above any CSI request's headers, and above the 16 KiB header list hyper's server takes.
pub const MAX_HEADER_BLOCK: usize = 256 * 1024;
/// The authority a unix socket stands for (what grpc-go sends there).
const LOCAL_AUTHORITY: &[u8] = b"localhost";

const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

/// Why a connection cannot go on: the client broke HTTP/2 framing or HPACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A frame longer than the server's SETTINGS_MAX_FRAME_SIZE.
    FrameTooLarge(usize),
    /// A HEADERS frame whose padding or priority fields do not fit in it.
    BadHeadersFrame,
    /// A frame other than the expected CONTINUATION inside a header block.
    ExpectedContinuation,
    /// A CONTINUATION frame outside a header block.
    UnexpectedContinuation,
    /// A header block larger than [`MAX_HEADER_BLOCK`], as received or once rewritten (its
    /// indexes expanded into literals).
    HeaderBlockTooLarge,
    /// The header block does not decode (HPACK).
    Hpack(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::FrameTooLarge(len) => {
                write!(f, "HTTP/2 frame of {len} bytes (max {MAX_FRAME_SIZE})")
            }
            Error::BadHeadersFrame => f.write_str("HEADERS frame with bad padding or priority"),
            Error::ExpectedContinuation => {
                f.write_str("header block interrupted by a frame other than CONTINUATION")
            }
            Error::UnexpectedContinuation => f.write_str("CONTINUATION outside a header block"),
            Error::HeaderBlockTooLarge => {
                write!(f, "header block larger than {MAX_HEADER_BLOCK} bytes")
            }
            Error::Hpack(e) => write!(f, "HPACK: {e}"),
        }
    }
}

impl std::error::Error for Error {}

/// A header block being received: its HEADERS frame's stream, flags and priority, and the
/// fragments so far.
#[derive(Debug)]
struct Block {
    stream: [u8; 4],
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The client-to-server byte stream of one connection, rewritten (see the module docs).
pub struct AuthorityFix {
    preface_left: usize,
    input: Vec<u8>,
    block: Option<Block>,
    decoder: Decoder<'static>,
}

impl fmt::Debug for AuthorityFix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthorityFix")
            .field("preface_left", &self.preface_left)
            .field("buffered", &self.input.len())
            .field("in_block", &self.block.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for AuthorityFix {
    fn default() -> Self {
        Self::new()
    }
}

impl AuthorityFix {
    /// The state at the start of a connection (before the client preface).
    pub fn new() -> AuthorityFix {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        AuthorityFix {
            preface_left: PREFACE_LEN,
            input: Vec::new(),
            block: None,
            decoder,
        }
    }

    /// Takes `input` read from the client and appends to `out` what the server should read.
    /// An incomplete frame waits in the fix until the rest arrives. After an error the
    /// connection must be closed.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        if self.preface_left > 0 {
            let n = self.preface_left.min(input.len());
            out.extend_from_slice(&input[..n]);
            self.preface_left -= n;
            input = &input[n..];
        }
        self.input.extend_from_slice(input);
        let mut at = 0;
        let result = loop {
            let Some(header) = self.input.get(at..at + FRAME_HEADER_LEN) else {
                break Ok(());
            };
            let len =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            if len > MAX_FRAME_SIZE {
                break Err(Error::FrameTooLarge(len));
            }
            let Some(frame) = self.input.get(at..at + FRAME_HEADER_LEN + len) else {
                break Ok(());
            };
            let frame = frame.to_vec();
            at += frame.len();
            if let Err(e) = self.frame(&frame, out) {
                break Err(e);
            }
        };
        self.input.drain(..at);
        result
    }

    /// One whole frame (header and payload).
    fn frame(&mut self, frame: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        let (kind, flags) = (frame[3], frame[4]);
        let stream: [u8; 4] = [frame[5], frame[6], frame[7], frame[8]];
        let payload = &frame[FRAME_HEADER_LEN..];
        match (kind, self.block.as_mut()) {
            (TYPE_HEADERS, None) => {
                let (priority, fragment) = headers_payload(flags, payload)?;
                self.block = Some(Block {
                    stream,
                    end_stream: flags & FLAG_END_STREAM != 0,
                    priority,
                    fragment: fragment.to_vec(),
                });
            }
            (TYPE_CONTINUATION, Some(block)) if block.stream == stream => {
                if block.fragment.len() + payload.len() > MAX_HEADER_BLOCK {
                    return Err(Error::HeaderBlockTooLarge);
                }
                block.fragment.extend_from_slice(payload);
            }
            (TYPE_CONTINUATION, None) => return Err(Error::UnexpectedContinuation),
            (_, Some(_)) => return Err(Error::ExpectedContinuation),
            (_, None) => {
                out.extend_from_slice(frame);
                return Ok(());
            }
        }
        if flags & FLAG_END_HEADERS != 0 {
            let block = self
                .block
                .take()
                .expect("a block was just started or extended");
            self.rewrite(&block, out)?;
        }
        Ok(())
    }

    /// Decodes a whole header block, fixes `:authority`, and writes it out as HEADERS (and
    /// CONTINUATION frames when the literal encoding outgrows a frame).
    fn rewrite(&mut self, block: &Block, out: &mut Vec<u8>) -> Result<(), Error> {
        let mut encoded = Vec::with_capacity(block.fragment.len() * 2);
        // An index of one byte can name a 4 KiB table entry: without this bound a 256 KiB block
        // would be written out as a gigabyte of literals.
        let mut too_large = false;
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                if too_large {
                    return;
                }
                let value: &[u8] = if &*name == b":authority" && !valid_authority(&value) {
                    LOCAL_AUTHORITY
                } else {
                    &value
                };
                encode_literal(&name, value, &mut encoded);
                too_large = encoded.len() > MAX_HEADER_BLOCK;
            })
            .map_err(|e: DecoderError| Error::Hpack(e.to_string()))?;
        if too_large {
            return Err(Error::HeaderBlockTooLarge);
        }

        let mut head = Vec::new();
        let mut flags = FLAG_END_HEADERS;
        if block.end_stream {
            flags |= FLAG_END_STREAM;
        }
        if let Some(priority) = block.priority {
            flags |= FLAG_PRIORITY;
            head.extend_from_slice(&priority);
        }
        let first = (MAX_FRAME_SIZE - head.len()).min(encoded.len());
        let (first_chunk, rest) = encoded.split_at(first);
        let mut chunks = rest.chunks(MAX_FRAME_SIZE).peekable();
        if chunks.peek().is_some() {
            flags &= !FLAG_END_HEADERS;
        }
        head.extend_from_slice(first_chunk);
        write_frame(out, TYPE_HEADERS, flags, block.stream, &head);
        while let Some(chunk) = chunks.next() {
            let flags = if chunks.peek().is_none() {
                FLAG_END_HEADERS
            } else {
                0
            };
            write_frame(out, TYPE_CONTINUATION, flags, block.stream, chunk);
        }
        Ok(())
    }
}

/// A HEADERS payload's priority fields and header block fragment (padding removed).
fn headers_payload(flags: u8, payload: &[u8]) -> Result<(Option<[u8; 5]>, &[u8]), Error> {
    let mut rest = payload;
    let mut pad = 0;
    if flags & FLAG_PADDED != 0 {
        let (&n, after) = rest.split_first().ok_or(Error::BadHeadersFrame)?;
        pad = usize::from(n);
        rest = after;
    }
    let mut priority = None;
    if flags & FLAG_PRIORITY != 0 {
        let fields = rest.get(..5).ok_or(Error::BadHeadersFrame)?;
        priority = Some(<[u8; 5]>::try_from(fields).expect("five bytes"));
        rest = &rest[5..];
    }
    let end = rest.len().checked_sub(pad).ok_or(Error::BadHeadersFrame)?;
    Ok((priority, &rest[..end]))
}

/// Whether HTTP parsers (h2's, through `http`) accept `value` as a request's authority.
fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// One header field as "literal without indexing, new name" (RFC 7541 section 6.2.2), strings
/// without Huffman coding.
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    encode_string(name, out);
    encode_string(value, out);
}

fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    encode_integer(s.len(), 7, 0x00, out);
    out.extend_from_slice(s);
}

/// An HPACK integer with an N-bit prefix (RFC 7541 section 5.1); `high` holds the bits of the
/// first byte above the prefix.
#[allow(clippy::cast_possible_truncation)] // each cast is of a value below 0x80 or the prefix
fn encode_integer(mut value: usize, prefix_bits: u8, high: u8, out: &mut Vec<u8>) {
    let max_prefix = (1usize << prefix_bits) - 1;
    if value < max_prefix {
        out.push(high | value as u8);
        return;
    }
    out.push(high | max_prefix as u8);
    value -= max_prefix;
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn write_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: [u8; 4], payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("a frame is at most MAX_FRAME_SIZE");
    debug_assert!(payload.len() <= MAX_FRAME_SIZE);
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream);
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;
    use loona_hpack::Encoder;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn headers_frame(flags: u8, stream: u32, block: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(&mut out, TYPE_HEADERS, flags, stream.to_be_bytes(), block);
        out
    }

    /// Splits `bytes` into frames: (type, flags, stream, payload).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut frames = Vec::new();
        while !bytes.is_empty() {
            let len =
                usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            frames.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        frames
    }

    fn request(authority: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (
                b":path".to_vec(),
                b"/csi.v1.Identity/GetPluginInfo".to_vec(),
            ),
            (b":authority".to_vec(), authority.to_vec()),
            (b"te".to_vec(), b"trailers".to_vec()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
        ]
    }

    fn encode(encoder: &mut Encoder<'_>, headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        encoder.encode(headers.iter().map(|(n, v)| (&n[..], &v[..])))
    }

    fn decode_all(out: &[u8]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut decoder = Decoder::new();
        frames(out)
            .into_iter()
            .filter(|f| f.0 == TYPE_HEADERS)
            .map(|f| decoder.decode(&f.3).unwrap())
            .collect()
    }

    #[test]
    fn socket_path_authority_becomes_localhost_across_the_dynamic_table() {
        // C-core's :authority for unix:/run/edgevol/csi.sock, indexed by the client's encoder
        // on the first request and referenced from its table on the second.
        let mut encoder = Encoder::new();
        let first = encode(&mut encoder, &request(b"%2Frun%2Fedgevol%2Fcsi.sock"));
        let second = encode(&mut encoder, &request(b"%2Frun%2Fedgevol%2Fcsi.sock"));
        assert!(
            second.len() < first.len(),
            "the second block uses the dynamic table"
        );

        let mut fix = AuthorityFix::new();
        let mut out = Vec::new();
        let mut input = PREFACE.to_vec();
        input.extend(headers_frame(FLAG_END_HEADERS, 1, &first));
        input.extend(headers_frame(FLAG_END_HEADERS, 3, &second));
        // Byte by byte: frames split anywhere still come out whole.
        for b in &input {
            fix.feed(std::slice::from_ref(b), &mut out).unwrap();
        }
        assert_eq!(&out[..PREFACE.len()], PREFACE);
        let blocks = decode_all(&out[PREFACE.len()..]);
        assert_eq!(blocks, vec![request(b"localhost"), request(b"localhost")]);
    }

    #[test]
    fn valid_authorities_and_other_frames_pass_unchanged() {
        let mut encoder = Encoder::new();
        let block = encode(&mut encoder, &request(b"localhost:50051"));
        let mut input = PREFACE.to_vec();
        // SETTINGS (empty), then a padded HEADERS with priority, then DATA.
        input.extend([0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        let mut payload = vec![3];
        payload.extend([0, 0, 0, 0, 15]);
        payload.extend(&block);
        payload.extend([0, 0, 0]);
        input.extend(headers_frame(
            FLAG_END_HEADERS | FLAG_PADDED | FLAG_PRIORITY,
            1,
            &payload,
        ));
        input.extend([0, 0, 5, 0x0, FLAG_END_STREAM, 0, 0, 0, 1, 0, 0, 0, 0, 0]);

        let mut fix = AuthorityFix::new();
        let mut out = Vec::new();
        fix.feed(&input, &mut out).unwrap();
        let got = frames(&out[PREFACE.len()..]);
        assert_eq!(got.len(), 3);
        assert_eq!((got[0].0, got[0].3.len()), (0x4, 0));
        let (kind, flags, stream, payload) = &got[1];
        assert_eq!((*kind, *stream), (TYPE_HEADERS, 1));
        assert_eq!(*flags, FLAG_END_HEADERS | FLAG_PRIORITY, "padding dropped");
        assert_eq!(&payload[..5], &[0, 0, 0, 0, 15]);
        assert_eq!(
            Decoder::new().decode(&payload[5..]).unwrap(),
            request(b"localhost:50051")
        );
        assert_eq!(got[2], (0x0, FLAG_END_STREAM, 1, vec![0; 5]));
    }

    #[test]
    fn continuation_frames_are_joined_and_large_blocks_split() {
        // One header value larger than a frame: the client must use CONTINUATION, and so must
        // the rewritten block (literals, no Huffman).
        let mut headers = request(b"%2Ftmp%2Fcsi.sock");
        headers.push((b"x-big".to_vec(), vec![b'a'; 20_000]));
        let block = encode(&mut Encoder::new(), &headers);
        let mut input = PREFACE.to_vec();
        let (a, b) = block.split_at(10_000);
        input.extend(headers_frame(FLAG_END_STREAM, 1, a));
        write_frame(
            &mut input,
            TYPE_CONTINUATION,
            FLAG_END_HEADERS,
            1u32.to_be_bytes(),
            b,
        );

        let mut fix = AuthorityFix::new();
        let mut out = Vec::new();
        fix.feed(&input, &mut out).unwrap();
        let got = frames(&out[PREFACE.len()..]);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].0, got[0].1), (TYPE_HEADERS, FLAG_END_STREAM));
        assert_eq!((got[1].0, got[1].1), (TYPE_CONTINUATION, FLAG_END_HEADERS));
        let joined: Vec<u8> = got.iter().flat_map(|f| f.3.clone()).collect();
        headers[3].1 = b"localhost".to_vec();
        assert_eq!(Decoder::new().decode(&joined).unwrap(), headers);
    }

    #[test]
    fn broken_framing_and_hpack_are_errors() {
        let mut out = Vec::new();
        let mut input = PREFACE.to_vec();
        input.extend([0x01, 0, 0, 0x0, 0, 0, 0, 0, 1]);
        assert_eq!(
            AuthorityFix::new().feed(&input, &mut out),
            Err(Error::FrameTooLarge(65_536))
        );

        let mut input = PREFACE.to_vec();
        input.extend(headers_frame(0, 1, &[0x82]));
        input.extend([0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        assert_eq!(
            AuthorityFix::new().feed(&input, &mut out),
            Err(Error::ExpectedContinuation)
        );

        let mut input = PREFACE.to_vec();
        write_frame(
            &mut input,
            TYPE_CONTINUATION,
            FLAG_END_HEADERS,
            [0, 0, 0, 1],
            &[0x82],
        );
        assert_eq!(
            AuthorityFix::new().feed(&input, &mut out),
            Err(Error::UnexpectedContinuation)
        );

        let mut input = PREFACE.to_vec();
        input.extend(headers_frame(FLAG_END_HEADERS | FLAG_PADDED, 1, &[9, 0x82]));
        assert_eq!(
            AuthorityFix::new().feed(&input, &mut out),
            Err(Error::BadHeadersFrame)
        );

        // Index 70: past the static table, and the dynamic table is empty.
        let mut input = PREFACE.to_vec();
        input.extend(headers_frame(FLAG_END_HEADERS, 1, &[0x80 | 70]));
        assert!(matches!(
            AuthorityFix::new().feed(&input, &mut out),
            Err(Error::Hpack(_))
        ));
    }

    #[test]
    fn indexes_expanding_past_the_block_limit_are_refused() {
        // One 4000-byte value into the client's dynamic table, then blocks of one-byte indexes
        // of it (62: the first dynamic entry): each index is 4 KiB of literal once rewritten.
        let mut entry = vec![0x40];
        encode_string(b"x-big", &mut entry);
        encode_string(&[b'a'; 4000], &mut entry);
        let within = vec![0x80 | 62; MAX_HEADER_BLOCK / 4100];
        let beyond = vec![0x80 | 62; MAX_HEADER_BLOCK / 4000 + 1];
        let mut input = PREFACE.to_vec();
        input.extend(headers_frame(FLAG_END_HEADERS, 1, &entry));
        input.extend(headers_frame(FLAG_END_HEADERS, 3, &within));
        let mut fix = AuthorityFix::new();
        let mut out = Vec::new();
        fix.feed(&input, &mut out).unwrap();
        // Stream 3's block, HEADERS and CONTINUATIONs, literals only: a fresh decoder reads it.
        let block: Vec<u8> = frames(&out[PREFACE.len()..])
            .into_iter()
            .filter(|f| f.2 == 3)
            .flat_map(|f| f.3)
            .collect();
        let fields = Decoder::new().decode(&block).unwrap();
        assert_eq!(
            fields.len(),
            within.len(),
            "below the limit: every field written"
        );
        assert_eq!(fields[0].1.len(), 4000);

        let before = out.len();
        let input = headers_frame(FLAG_END_HEADERS, 5, &beyond);
        assert_eq!(fix.feed(&input, &mut out), Err(Error::HeaderBlockTooLarge));
        assert_eq!(out.len(), before, "nothing of the refused block is written");
    }

    #[test]
    fn integers_use_continuation_bytes_past_the_prefix() {
        let mut out = Vec::new();
        encode_integer(10, 5, 0, &mut out);
        encode_integer(1337, 5, 0, &mut out);
        encode_integer(127, 7, 0x80, &mut out);
        // RFC 7541 C.1.1 and C.1.2; 127 fills a 7-bit prefix and needs a zero continuation.
        assert_eq!(out, [10, 31, 154, 10, 0xff, 0]);
    }
}
