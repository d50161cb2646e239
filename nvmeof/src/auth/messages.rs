//! The AUTH_Send / AUTH_Receive payloads of DH-HMAC-CHAP: decoding and encoding of every
//! message (NVMe base specification 2.x "Authentication", TP 8006; Linux include/linux/nvme.h
//! `struct nvmf_auth_dhchap_*`). All integers are little-endian.
//!
//! | message | auth_type | auth_id | layout |
//! |---|---|---|---|
//! | AUTH_Negotiate | 00h | 00h | t_id @4, sc_c @6, napd @7, napd 64-byte protocol descriptors @8 |
//! | DH-HMAC-CHAP_Challenge | 01h | 01h | t_id @4, hl @6, hashid @8, dhgid @9, dhvlen @10, seqnum @12, C1 @16, DH value |
//! | DH-HMAC-CHAP_Reply | 01h | 02h | t_id @4, hl @6, cvalid @8, dhvlen @10, seqnum @12, R1 @16, C2, DH value |
//! | DH-HMAC-CHAP_Success1 | 01h | 03h | t_id @4, hl @6, rvalid @8, R2 @16 (if rvalid) |
//! | DH-HMAC-CHAP_Success2 | 01h | 04h | t_id @4, 16 bytes |
//! | AUTH_Failure2 | 00h | F0h | t_id @4, rescode @6, rescode_exp @7 |
//! | AUTH_Failure1 | 00h | F1h | t_id @4, rescode @6, rescode_exp @7 |
//!
//! A protocol descriptor: authid @0 (01h: DH-HMAC-CHAP), halen @2, dhlen @3, up to 30 hash ids
//! @4, up to 30 DH group ids @34.
//!
//! Decoding takes any bytes and never panics: every length is checked against the buffer before
//! it is used, reserved fields are ignored (as Linux does) and bytes after the message are
//! allowed (an AUTH_Send transfer may be longer than its message). Encoding writes the exact
//! message; a field longer than its length field can express is cut to fit.

use core::fmt;

/// `auth_type` values.
pub mod auth_type {
    /// Messages common to every protocol (Negotiate, Failure1, Failure2).
    pub const COMMON: u8 = 0x00;
    /// DH-HMAC-CHAP messages.
    pub const DHCHAP: u8 = 0x01;
}

/// `auth_id` values.
pub mod auth_id {
    /// AUTH_Negotiate.
    pub const NEGOTIATE: u8 = 0x00;
    /// DH-HMAC-CHAP_Challenge.
    pub const CHALLENGE: u8 = 0x01;
    /// DH-HMAC-CHAP_Reply.
    pub const REPLY: u8 = 0x02;
    /// DH-HMAC-CHAP_Success1.
    pub const SUCCESS1: u8 = 0x03;
    /// DH-HMAC-CHAP_Success2.
    pub const SUCCESS2: u8 = 0x04;
    /// AUTH_Failure2 (host to controller).
    pub const FAILURE2: u8 = 0xf0;
    /// AUTH_Failure1 (controller to host).
    pub const FAILURE1: u8 = 0xf1;
}

/// `authid` of a DH-HMAC-CHAP protocol descriptor (`NVME_AUTH_DHCHAP_AUTH_ID`).
pub const PROTOCOL_DHCHAP: u8 = 0x01;
/// Hash ids a descriptor can hold (`NVME_AUTH_DHCHAP_MAX_HASH_IDS`).
pub const MAX_HASH_IDS: usize = 30;
/// DH group ids a descriptor can hold (`NVME_AUTH_DHCHAP_MAX_DH_IDS`).
pub const MAX_DH_IDS: usize = 30;
/// Size of a protocol descriptor.
pub const DESCRIPTOR_LEN: usize = 64;
/// Size of AUTH_Negotiate before its descriptors.
pub const NEGOTIATE_HEADER_LEN: usize = 8;
/// Size of the fixed part of Challenge, Reply and Success1.
pub const HEADER_LEN: usize = 16;
/// Size of Success2.
pub const SUCCESS2_LEN: usize = 16;
/// Size of Failure1 and Failure2.
pub const FAILURE_LEN: usize = 8;
/// `sc_c` for "no secure channel concatenation" (`NVME_AUTH_SECP_NOSC`).
pub const SC_C_NONE: u8 = 0x00;
/// Failure `rescode`: authentication failed (`NVME_AUTH_DHCHAP_FAILURE_REASON_FAILED`).
pub const RESCODE_FAILED: u8 = 0x01;

/// A failure's reason code explanation (`rescode_exp`, `NVME_AUTH_DHCHAP_FAILURE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// 01h: authentication failed (wrong response, no usable key).
    Failed,
    /// 02h: the authentication protocol is not usable.
    NotUsable,
    /// 03h: secure channel concatenation mismatch.
    ConcatMismatch,
    /// 04h: no usable hash function.
    HashUnusable,
    /// 05h: no usable DH group.
    DhGroupUnusable,
    /// 06h: incorrect payload.
    IncorrectPayload,
    /// 07h: incorrect protocol message.
    IncorrectMessage,
    /// Any other value a peer sent.
    Other(u8),
}

impl Reason {
    /// The wire value.
    pub const fn code(self) -> u8 {
        match self {
            Reason::Failed => 0x01,
            Reason::NotUsable => 0x02,
            Reason::ConcatMismatch => 0x03,
            Reason::HashUnusable => 0x04,
            Reason::DhGroupUnusable => 0x05,
            Reason::IncorrectPayload => 0x06,
            Reason::IncorrectMessage => 0x07,
            Reason::Other(c) => c,
        }
    }

    /// The reason for a wire value.
    pub const fn from_code(code: u8) -> Reason {
        match code {
            0x01 => Reason::Failed,
            0x02 => Reason::NotUsable,
            0x03 => Reason::ConcatMismatch,
            0x04 => Reason::HashUnusable,
            0x05 => Reason::DhGroupUnusable,
            0x06 => Reason::IncorrectPayload,
            0x07 => Reason::IncorrectMessage,
            c => Reason::Other(c),
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Failed => f.write_str("authentication failed"),
            Reason::NotUsable => f.write_str("authentication protocol not usable"),
            Reason::ConcatMismatch => f.write_str("secure channel concatenation mismatch"),
            Reason::HashUnusable => f.write_str("hash function not usable"),
            Reason::DhGroupUnusable => f.write_str("DH group not usable"),
            Reason::IncorrectPayload => f.write_str("incorrect payload"),
            Reason::IncorrectMessage => f.write_str("incorrect protocol message"),
            Reason::Other(c) => write!(f, "reason {c:#04x}"),
        }
    }
}

/// Why bytes are not a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The buffer ends before the message does.
    Truncated {
        /// Bytes the message needs.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// No message has this auth_type and auth_id.
    UnknownMessage {
        /// auth_type.
        auth_type: u8,
        /// auth_id.
        auth_id: u8,
    },
    /// A protocol descriptor lists more than 30 hash or DH group ids.
    IdListTooLong,
}

impl DecodeError {
    /// The failure reason a receiver reports for it.
    pub const fn reason(self) -> Reason {
        match self {
            DecodeError::UnknownMessage { .. } => Reason::IncorrectMessage,
            DecodeError::Truncated { .. } | DecodeError::IdListTooLong => Reason::IncorrectPayload,
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { need, have } => {
                write!(f, "message needs {need} bytes, has {have}")
            }
            DecodeError::UnknownMessage { auth_type, auth_id } => {
                write!(f, "unknown message type {auth_type:#04x}/{auth_id:#04x}")
            }
            DecodeError::IdListTooLong => f.write_str("protocol descriptor id list too long"),
        }
    }
}

impl std::error::Error for DecodeError {}

fn need(buf: &[u8], n: usize) -> Result<(), DecodeError> {
    if buf.len() < n {
        Err(DecodeError::Truncated {
            need: n,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

fn le16(buf: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([buf[at], buf[at + 1]])
}

fn le32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

/// `bytes` cut or zero-padded to exactly `len`.
fn put_exact(out: &mut Vec<u8>, bytes: &[u8], len: usize) {
    let n = bytes.len().min(len);
    out.extend_from_slice(&bytes[..n]);
    out.resize(out.len() + (len - n), 0);
}

/// `n` as a length field of type `T`; callers cut `n` to the field's range first.
fn field<T: TryFrom<usize> + Bounded>(n: usize) -> T {
    T::try_from(n).unwrap_or(T::MAX)
}

trait Bounded {
    const MAX: Self;
}

impl Bounded for u8 {
    const MAX: u8 = u8::MAX;
}

impl Bounded for u16 {
    const MAX: u16 = u16::MAX;
}

fn put_header(out: &mut Vec<u8>, auth_type: u8, auth_id: u8, t_id: u16) {
    out.extend_from_slice(&[auth_type, auth_id, 0, 0]);
    out.extend_from_slice(&t_id.to_le_bytes());
}

/// The first six bytes every message shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// auth_type.
    pub auth_type: u8,
    /// auth_id.
    pub auth_id: u8,
    /// Transaction identifier.
    pub t_id: u16,
}

impl Header {
    /// Decodes the shared header.
    pub fn decode(buf: &[u8]) -> Result<Header, DecodeError> {
        need(buf, 6)?;
        Ok(Header {
            auth_type: buf[0],
            auth_id: buf[1],
            t_id: le16(buf, 4),
        })
    }
}

/// One protocol descriptor of AUTH_Negotiate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Protocol {
    /// authid ([`PROTOCOL_DHCHAP`] for DH-HMAC-CHAP).
    pub auth_id: u8,
    /// Hash ids the host offers, in its order (at most 30).
    pub hash_ids: Vec<u8>,
    /// DH group ids the host offers, in its order (at most 30).
    pub dh_group_ids: Vec<u8>,
}

/// AUTH_Negotiate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiate {
    /// Transaction identifier.
    pub t_id: u16,
    /// Secure channel concatenation ([`SC_C_NONE`]: none).
    pub sc_c: u8,
    /// Protocol descriptors (napd of them).
    pub protocols: Vec<Protocol>,
}

impl Negotiate {
    fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        need(buf, NEGOTIATE_HEADER_LEN)?;
        let napd = usize::from(buf[7]);
        need(buf, NEGOTIATE_HEADER_LEN + napd * DESCRIPTOR_LEN)?;
        let mut protocols = Vec::with_capacity(napd);
        for d in buf[NEGOTIATE_HEADER_LEN..]
            .chunks_exact(DESCRIPTOR_LEN)
            .take(napd)
        {
            let halen = usize::from(d[2]);
            let dhlen = usize::from(d[3]);
            if halen > MAX_HASH_IDS || dhlen > MAX_DH_IDS {
                return Err(DecodeError::IdListTooLong);
            }
            protocols.push(Protocol {
                auth_id: d[0],
                hash_ids: d[4..4 + halen].to_vec(),
                dh_group_ids: d[34..34 + dhlen].to_vec(),
            });
        }
        Ok(Negotiate {
            t_id: le16(buf, 4),
            sc_c: buf[6],
            protocols,
        })
    }

    /// Appends the message (at most 255 descriptors of at most 30 ids each).
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_header(out, auth_type::COMMON, auth_id::NEGOTIATE, self.t_id);
        let napd = self.protocols.len().min(255);
        out.push(self.sc_c);
        out.push(field::<u8>(napd));
        for p in &self.protocols[..napd] {
            let halen = p.hash_ids.len().min(MAX_HASH_IDS);
            let dhlen = p.dh_group_ids.len().min(MAX_DH_IDS);
            out.extend_from_slice(&[p.auth_id, 0, field(halen), field(dhlen)]);
            put_exact(out, &p.hash_ids[..halen], MAX_HASH_IDS);
            put_exact(out, &p.dh_group_ids[..dhlen], MAX_DH_IDS);
        }
    }
}

/// DH-HMAC-CHAP_Challenge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    /// Transaction identifier.
    pub t_id: u16,
    /// Hash id.
    pub hash_id: u8,
    /// DH group id.
    pub dh_group_id: u8,
    /// Sequence number S1.
    pub seqnum: u32,
    /// Challenge C1 (hl bytes, at most 255).
    pub challenge: Vec<u8>,
    /// The controller's DH public value (dhvlen bytes; empty with the null group).
    pub dh_value: Vec<u8>,
}

impl Challenge {
    fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        need(buf, HEADER_LEN)?;
        let hl = usize::from(buf[6]);
        let dhvlen = usize::from(le16(buf, 10));
        need(buf, HEADER_LEN + hl + dhvlen)?;
        let c = HEADER_LEN;
        Ok(Challenge {
            t_id: le16(buf, 4),
            hash_id: buf[8],
            dh_group_id: buf[9],
            seqnum: le32(buf, 12),
            challenge: buf[c..c + hl].to_vec(),
            dh_value: buf[c + hl..c + hl + dhvlen].to_vec(),
        })
    }

    /// Length of the encoded message.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.challenge.len().min(255) + self.dh_value.len().min(0xffff)
    }

    /// Appends the message.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_header(out, auth_type::DHCHAP, auth_id::CHALLENGE, self.t_id);
        let hl = self.challenge.len().min(255);
        let dhvlen = self.dh_value.len().min(0xffff);
        out.extend_from_slice(&[field(hl), 0, self.hash_id, self.dh_group_id]);
        out.extend_from_slice(&field::<u16>(dhvlen).to_le_bytes());
        out.extend_from_slice(&self.seqnum.to_le_bytes());
        out.extend_from_slice(&self.challenge[..hl]);
        out.extend_from_slice(&self.dh_value[..dhvlen]);
    }
}

/// DH-HMAC-CHAP_Reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Transaction identifier.
    pub t_id: u16,
    /// Response R1 (hl bytes, at most 255).
    pub response: Vec<u8>,
    /// The host asks for the controller's response (bidirectional authentication).
    pub cvalid: bool,
    /// Challenge C2 (on the wire even when `cvalid` is clear; cut or zero-padded to hl).
    pub challenge: Vec<u8>,
    /// Sequence number S2 (0: no bidirectional authentication).
    pub seqnum: u32,
    /// The host's DH public value (dhvlen bytes; empty with the null group).
    pub dh_value: Vec<u8>,
}

impl Reply {
    fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        need(buf, HEADER_LEN)?;
        let hl = usize::from(buf[6]);
        let dhvlen = usize::from(le16(buf, 10));
        need(buf, HEADER_LEN + 2 * hl + dhvlen)?;
        let r = HEADER_LEN;
        Ok(Reply {
            t_id: le16(buf, 4),
            response: buf[r..r + hl].to_vec(),
            cvalid: buf[8] & 1 != 0,
            challenge: buf[r + hl..r + 2 * hl].to_vec(),
            seqnum: le32(buf, 12),
            dh_value: buf[r + 2 * hl..r + 2 * hl + dhvlen].to_vec(),
        })
    }

    /// Appends the message.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_header(out, auth_type::DHCHAP, auth_id::REPLY, self.t_id);
        let hl = self.response.len().min(255);
        let dhvlen = self.dh_value.len().min(0xffff);
        out.extend_from_slice(&[field(hl), 0, u8::from(self.cvalid), 0]);
        out.extend_from_slice(&field::<u16>(dhvlen).to_le_bytes());
        out.extend_from_slice(&self.seqnum.to_le_bytes());
        out.extend_from_slice(&self.response[..hl]);
        put_exact(out, &self.challenge, hl);
        out.extend_from_slice(&self.dh_value[..dhvlen]);
    }
}

/// DH-HMAC-CHAP_Success1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Success1 {
    /// Transaction identifier.
    pub t_id: u16,
    /// Hash length (Linux always sets it; its host checks it against the negotiated hash).
    pub hl: u8,
    /// Response R2, present (rvalid) in bidirectional authentication; hl bytes.
    pub response: Option<Vec<u8>>,
}

impl Success1 {
    fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        need(buf, HEADER_LEN)?;
        let hl = buf[6];
        let response = if buf[8] & 1 != 0 {
            need(buf, HEADER_LEN + usize::from(hl))?;
            Some(buf[HEADER_LEN..HEADER_LEN + usize::from(hl)].to_vec())
        } else {
            None
        };
        Ok(Success1 {
            t_id: le16(buf, 4),
            hl,
            response,
        })
    }

    /// Length of the encoded message.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.response.as_ref().map_or(0, |_| usize::from(self.hl))
    }

    /// Appends the message.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_header(out, auth_type::DHCHAP, auth_id::SUCCESS1, self.t_id);
        out.extend_from_slice(&[self.hl, 0, u8::from(self.response.is_some())]);
        out.extend_from_slice(&[0; 7]);
        if let Some(r) = &self.response {
            put_exact(out, r, usize::from(self.hl));
        }
    }
}

/// DH-HMAC-CHAP_Success2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Success2 {
    /// Transaction identifier.
    pub t_id: u16,
}

impl Success2 {
    fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        need(buf, SUCCESS2_LEN)?;
        Ok(Success2 { t_id: le16(buf, 4) })
    }

    /// Appends the message.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_header(out, auth_type::DHCHAP, auth_id::SUCCESS2, self.t_id);
        out.extend_from_slice(&[0; 10]);
    }
}

/// AUTH_Failure1 or AUTH_Failure2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Transaction identifier.
    pub t_id: u16,
    /// Reason code ([`RESCODE_FAILED`]).
    pub rescode: u8,
    /// Reason code explanation.
    pub reason: Reason,
}

impl Failure {
    /// A failure with rescode [`RESCODE_FAILED`], as Linux sends them.
    pub const fn new(t_id: u16, reason: Reason) -> Self {
        Failure {
            t_id,
            rescode: RESCODE_FAILED,
            reason,
        }
    }

    fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        need(buf, FAILURE_LEN)?;
        Ok(Failure {
            t_id: le16(buf, 4),
            rescode: buf[6],
            reason: Reason::from_code(buf[7]),
        })
    }

    fn encode(&self, out: &mut Vec<u8>, id: u8) {
        put_header(out, auth_type::COMMON, id, self.t_id);
        out.extend_from_slice(&[self.rescode, self.reason.code()]);
    }
}

/// Any message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// AUTH_Negotiate.
    Negotiate(Negotiate),
    /// DH-HMAC-CHAP_Challenge.
    Challenge(Challenge),
    /// DH-HMAC-CHAP_Reply.
    Reply(Reply),
    /// DH-HMAC-CHAP_Success1.
    Success1(Success1),
    /// DH-HMAC-CHAP_Success2.
    Success2(Success2),
    /// AUTH_Failure1.
    Failure1(Failure),
    /// AUTH_Failure2.
    Failure2(Failure),
}

impl Message {
    /// Decodes one message from the start of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Message, DecodeError> {
        let h = Header::decode(buf)?;
        match (h.auth_type, h.auth_id) {
            (auth_type::COMMON, auth_id::NEGOTIATE) => {
                Negotiate::decode(buf).map(Message::Negotiate)
            }
            (auth_type::COMMON, auth_id::FAILURE1) => Failure::decode(buf).map(Message::Failure1),
            (auth_type::COMMON, auth_id::FAILURE2) => Failure::decode(buf).map(Message::Failure2),
            (auth_type::DHCHAP, auth_id::CHALLENGE) => {
                Challenge::decode(buf).map(Message::Challenge)
            }
            (auth_type::DHCHAP, auth_id::REPLY) => Reply::decode(buf).map(Message::Reply),
            (auth_type::DHCHAP, auth_id::SUCCESS1) => Success1::decode(buf).map(Message::Success1),
            (auth_type::DHCHAP, auth_id::SUCCESS2) => Success2::decode(buf).map(Message::Success2),
            (auth_type, auth_id) => Err(DecodeError::UnknownMessage { auth_type, auth_id }),
        }
    }

    /// Appends the encoded message.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Message::Negotiate(m) => m.encode(out),
            Message::Challenge(m) => m.encode(out),
            Message::Reply(m) => m.encode(out),
            Message::Success1(m) => m.encode(out),
            Message::Success2(m) => m.encode(out),
            Message::Failure1(m) => m.encode(out, auth_id::FAILURE1),
            Message::Failure2(m) => m.encode(out, auth_id::FAILURE2),
        }
    }

    /// The encoded message in a new buffer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }

    /// Its transaction identifier.
    pub fn t_id(&self) -> u16 {
        match self {
            Message::Negotiate(m) => m.t_id,
            Message::Challenge(m) => m.t_id,
            Message::Reply(m) => m.t_id,
            Message::Success1(m) => m.t_id,
            Message::Success2(m) => m.t_id,
            Message::Failure1(m) | Message::Failure2(m) => m.t_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(m: &Message, bytes: &[u8]) {
        assert_eq!(m.to_bytes(), bytes, "{m:?}");
        assert_eq!(Message::decode(bytes).as_ref(), Ok(m));
        // Every shorter prefix is refused without a panic.
        for n in 0..bytes.len() {
            assert!(Message::decode(&bytes[..n]).is_err(), "prefix {n} of {m:?}");
        }
        // Trailing bytes (a longer transfer) are ignored.
        let mut longer = bytes.to_vec();
        longer.extend_from_slice(&[0xee; 9]);
        assert_eq!(Message::decode(&longer).as_ref(), Ok(m));
    }

    #[test]
    fn negotiate_as_linux_sends_it() {
        // nvme_auth_set_dhchap_negotiate_data: t_id 5, no concatenation, one descriptor with
        // SHA-256/384/512 and the null group plus ffdhe2048..8192.
        let m = Message::Negotiate(Negotiate {
            t_id: 5,
            sc_c: 0,
            protocols: vec![Protocol {
                auth_id: PROTOCOL_DHCHAP,
                hash_ids: vec![1, 2, 3],
                dh_group_ids: vec![0, 1, 2, 3, 4, 5],
            }],
        });
        let mut bytes = vec![0u8; 72];
        bytes[..12].copy_from_slice(&[0, 0, 0, 0, 5, 0, 0, 1, 1, 0, 3, 6]);
        bytes[12..15].copy_from_slice(&[1, 2, 3]);
        bytes[42..48].copy_from_slice(&[0, 1, 2, 3, 4, 5]);
        round_trip(&m, &bytes);
    }

    #[test]
    fn challenge_layout() {
        let m = Message::Challenge(Challenge {
            t_id: 0x0102,
            hash_id: 1,
            dh_group_id: 1,
            seqnum: 0x0a0b_0c0d,
            challenge: vec![0xc1; 32],
            dh_value: vec![0xd1; 256],
        });
        let mut bytes = vec![
            0x01, 0x01, 0, 0, 0x02, 0x01, 32, 0, 1, 1, 0x00, 0x01, 0x0d, 0x0c, 0x0b, 0x0a,
        ];
        bytes.extend_from_slice(&[0xc1; 32]);
        bytes.extend_from_slice(&[0xd1; 256]);
        round_trip(&m, &bytes);
        if let Message::Challenge(c) = &m {
            assert_eq!(c.encoded_len(), bytes.len());
        }
    }

    #[test]
    fn reply_layout_with_and_without_c2() {
        let m = Message::Reply(Reply {
            t_id: 7,
            response: vec![0xaa; 48],
            cvalid: true,
            challenge: vec![0xbb; 48],
            seqnum: 0x1234_5678,
            dh_value: vec![],
        });
        let mut bytes = vec![
            0x01, 0x02, 0, 0, 7, 0, 48, 0, 1, 0, 0, 0, 0x78, 0x56, 0x34, 0x12,
        ];
        bytes.extend_from_slice(&[0xaa; 48]);
        bytes.extend_from_slice(&[0xbb; 48]);
        round_trip(&m, &bytes);

        // Unidirectional: C2 is still on the wire, zero, with seqnum 0 (Linux's host).
        let m = Message::Reply(Reply {
            t_id: 7,
            response: vec![0xaa; 32],
            cvalid: false,
            challenge: vec![0; 32],
            seqnum: 0,
            dh_value: vec![0x44; 3],
        });
        let mut bytes = vec![0x01, 0x02, 0, 0, 7, 0, 32, 0, 0, 0, 3, 0, 0, 0, 0, 0];
        bytes.extend_from_slice(&[0xaa; 32]);
        bytes.extend_from_slice(&[0; 32]);
        bytes.extend_from_slice(&[0x44; 3]);
        round_trip(&m, &bytes);
    }

    #[test]
    fn success_and_failure_layouts() {
        let m = Message::Success1(Success1 {
            t_id: 9,
            hl: 32,
            response: Some(vec![0x77; 32]),
        });
        let mut bytes = vec![0x01, 0x03, 0, 0, 9, 0, 32, 0, 1, 0, 0, 0, 0, 0, 0, 0];
        bytes.extend_from_slice(&[0x77; 32]);
        round_trip(&m, &bytes);

        let m = Message::Success1(Success1 {
            t_id: 9,
            hl: 64,
            response: None,
        });
        round_trip(&m, &[0x01, 0x03, 0, 0, 9, 0, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0]);

        let m = Message::Success2(Success2 { t_id: 0xbeef });
        round_trip(
            &m,
            &[0x01, 0x04, 0, 0, 0xef, 0xbe, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        );

        let m = Message::Failure1(Failure::new(3, Reason::IncorrectPayload));
        round_trip(&m, &[0x00, 0xf1, 0, 0, 3, 0, 0x01, 0x06]);
        let m = Message::Failure2(Failure::new(3, Reason::Failed));
        round_trip(&m, &[0x00, 0xf0, 0, 0, 3, 0, 0x01, 0x01]);
    }

    #[test]
    fn malformed_messages_are_refused() {
        assert_eq!(
            Message::decode(&[0x01, 0x09, 0, 0, 0, 0, 0, 0]),
            Err(DecodeError::UnknownMessage {
                auth_type: 1,
                auth_id: 9
            })
        );
        // Negotiate is a common message: with auth_type 01h it is unknown.
        assert!(matches!(
            Message::decode(&[0x01, 0x00, 0, 0, 0, 0, 0, 1]),
            Err(DecodeError::UnknownMessage { .. })
        ));
        // napd 2 with one descriptor's worth of bytes.
        let mut neg = vec![0u8; 72];
        neg[7] = 2;
        assert_eq!(
            Message::decode(&neg),
            Err(DecodeError::Truncated {
                need: 136,
                have: 72
            })
        );
        neg[7] = 1;
        neg[10] = 31;
        assert_eq!(Message::decode(&neg), Err(DecodeError::IdListTooLong));
        // A challenge whose dhvlen runs past the buffer.
        let mut ch = vec![0x01, 0x01, 0, 0, 0, 0, 32, 0, 1, 1, 0x00, 0x01, 0, 0, 0, 0];
        ch.extend_from_slice(&[0; 32 + 255]);
        assert_eq!(
            Message::decode(&ch),
            Err(DecodeError::Truncated {
                need: 304,
                have: 303
            })
        );
        assert_eq!(
            DecodeError::Truncated { need: 1, have: 0 }.reason(),
            Reason::IncorrectPayload
        );
        for code in 0..=255u8 {
            assert_eq!(Reason::from_code(code).code(), code);
        }
    }

    #[test]
    fn encoding_cuts_fields_to_their_length_fields() {
        let m = Negotiate {
            t_id: 1,
            sc_c: 0,
            protocols: vec![Protocol {
                auth_id: 1,
                hash_ids: vec![1; 40],
                dh_group_ids: vec![],
            }],
        };
        let mut out = Vec::new();
        m.encode(&mut out);
        assert_eq!(out.len(), 72);
        assert_eq!(out[10], 30);
        let Ok(Message::Negotiate(back)) = Message::decode(&out) else {
            panic!("decodes")
        };
        assert_eq!(back.protocols[0].hash_ids.len(), 30);
    }
}
