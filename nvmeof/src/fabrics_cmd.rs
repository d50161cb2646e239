//! Fabrics command capsules: Connect (with its 1024-byte data), Property Get and Property Set.
//!
//! Layouts from `struct nvmf_connect_command`, `struct nvmf_connect_data`,
//! `struct nvmf_property_get_command` and `struct nvmf_property_set_command` (include/linux/nvme.h).
//! Parsing checks field shapes only; policy (which host may connect, which cntlid) is the
//! controller's.

use crate::sqe::{Sqe, FABRICS_OPCODE};
use crate::status::{Status, StatusCode};

/// Fabrics command types (SQE byte 4).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// Authentication Send.
    pub const AUTH_SEND: u8 = 0x05;
    /// Authentication Receive.
    pub const AUTH_RECEIVE: u8 = 0x06;
    /// Disconnect.
    pub const DISCONNECT: u8 = 0x08;
}

/// Size of the Connect data.
pub const CONNECT_DATA_LEN: usize = 1024;
/// Size of an NQN field in the Connect data (`NVMF_NQN_FIELD_LEN`).
pub const NQN_FIELD_LEN: usize = 256;
/// Longest NQN, without its terminating NUL (`NVMF_NQN_SIZE`).
pub const NQN_MAX_LEN: usize = 223;
/// cntlid a host sends to ask for a dynamic controller.
pub const CNTLID_DYNAMIC: u16 = 0xffff;

/// Offsets of Connect data fields, for the IPO of an invalid-parameter completion.
pub mod connect_data_offset {
    /// hostid.
    pub const HOSTID: u16 = 0;
    /// cntlid.
    pub const CNTLID: u16 = 16;
    /// subsysnqn.
    pub const SUBSYSNQN: u16 = 256;
    /// hostnqn.
    pub const HOSTNQN: u16 = 512;
}

/// Offsets of Connect SQE fields, for the IPO of an invalid-parameter completion.
pub mod connect_sqe_offset {
    /// recfmt.
    pub const RECFMT: u16 = 40;
    /// qid.
    pub const QID: u16 = 42;
    /// sqsize.
    pub const SQSIZE: u16 = 44;
}

/// Connect command fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectCmd {
    /// Queue to create (0: admin).
    pub qid: u16,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    /// Connect attributes (bit 2: SQ flow control disable).
    pub cattr: u8,
    /// Keep-alive timeout in milliseconds (admin queue).
    pub kato_ms: u32,
}

/// Connect data fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectData {
    /// Host identifier.
    pub hostid: [u8; 16],
    /// Controller id: [`CNTLID_DYNAMIC`] on the admin queue, the allocated one on I/O queues.
    pub cntlid: u16,
    /// Subsystem NQN.
    pub subsysnqn: String,
    /// Host NQN.
    pub hostnqn: String,
}

/// A Connect that cannot be accepted as formed: the status and the CQE result naming the field
/// (IATTR in bits 23:16: 0 for the SQE, 1 for the data; IPO in bits 15:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectError {
    /// The completion status.
    pub status: Status,
    /// The CQE dword 0 result.
    pub result: u32,
}

impl ConnectError {
    /// Invalid parameter in the Connect SQE at `offset`.
    pub fn sqe_field(offset: u16) -> Self {
        ConnectError {
            status: StatusCode::ConnectInvalidParameters.status(),
            result: u32::from(offset),
        }
    }
    /// Invalid parameter in the Connect data at `offset`.
    pub fn data_field(offset: u16) -> Self {
        ConnectError {
            status: StatusCode::ConnectInvalidParameters.status(),
            result: (1 << 16) | u32::from(offset),
        }
    }
}

impl ConnectCmd {
    /// Parses the Connect SQE fields (the caller has checked opcode and fctype).
    pub fn parse(sqe: &Sqe) -> Result<Self, ConnectError> {
        let b = &sqe.0;
        let recfmt = u16::from_le_bytes([b[40], b[41]]);
        if recfmt != 0 {
            return Err(ConnectError {
                status: StatusCode::ConnectIncompatibleFormat.status(),
                result: u32::from(connect_sqe_offset::RECFMT),
            });
        }
        let sqsize = u16::from_le_bytes([b[44], b[45]]);
        if sqsize == 0 {
            return Err(ConnectError::sqe_field(connect_sqe_offset::SQSIZE));
        }
        Ok(ConnectCmd {
            qid: u16::from_le_bytes([b[42], b[43]]),
            sqsize,
            cattr: b[46],
            kato_ms: u32::from_le_bytes([b[48], b[49], b[50], b[51]]),
        })
    }

    /// Builds a Connect SQE with in-capsule data (for initiators).
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut sqe = Sqe::default();
        sqe.set_opcode(FABRICS_OPCODE)
            .set_cid(cid)
            .set_fctype(fctype::CONNECT)
            .set_in_capsule(1024);
        sqe.0[42..44].copy_from_slice(&self.qid.to_le_bytes());
        sqe.0[44..46].copy_from_slice(&self.sqsize.to_le_bytes());
        sqe.0[46] = self.cattr;
        sqe.0[48..52].copy_from_slice(&self.kato_ms.to_le_bytes());
        sqe
    }
}

fn parse_nqn(field: &[u8], offset: u16) -> Result<String, ConnectError> {
    let len = field
        .iter()
        .position(|&c| c == 0)
        .filter(|&n| n > 0 && n <= NQN_MAX_LEN)
        .ok_or(ConnectError::data_field(offset))?;
    core::str::from_utf8(&field[..len])
        .map(str::to_owned)
        .map_err(|_| ConnectError::data_field(offset))
}

impl ConnectData {
    /// Parses the 1024-byte Connect data.
    pub fn parse(data: &[u8]) -> Result<Self, ConnectError> {
        if data.len() != CONNECT_DATA_LEN {
            return Err(ConnectError {
                status: StatusCode::DataSglLengthInvalid.status(),
                result: 0,
            });
        }
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&data[0..16]);
        let sub = usize::from(connect_data_offset::SUBSYSNQN);
        let host = usize::from(connect_data_offset::HOSTNQN);
        Ok(ConnectData {
            hostid,
            cntlid: u16::from_le_bytes([data[16], data[17]]),
            subsysnqn: parse_nqn(
                &data[sub..sub + NQN_FIELD_LEN],
                connect_data_offset::SUBSYSNQN,
            )?,
            hostnqn: parse_nqn(
                &data[host..host + NQN_FIELD_LEN],
                connect_data_offset::HOSTNQN,
            )?,
        })
    }

    /// Encodes the Connect data (for initiators). NQNs longer than [`NQN_MAX_LEN`] are cut.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut d = vec![0u8; CONNECT_DATA_LEN];
        d[0..16].copy_from_slice(&self.hostid);
        d[16..18].copy_from_slice(&self.cntlid.to_le_bytes());
        for (nqn, at) in [
            (&self.subsysnqn, connect_data_offset::SUBSYSNQN),
            (&self.hostnqn, connect_data_offset::HOSTNQN),
        ] {
            let n = nqn.len().min(NQN_MAX_LEN);
            let at = usize::from(at);
            d[at..at + n].copy_from_slice(&nqn.as_bytes()[..n]);
        }
        d
    }
}

/// Width of a property access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PropertySize {
    /// 4 bytes.
    Four,
    /// 8 bytes.
    Eight,
}

/// Property Get fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PropertyGet {
    /// Access width.
    pub size: PropertySize,
    /// Property offset (CAP 0x0, VS 0x8, CC 0x14, CSTS 0x1c, ...).
    pub offset: u32,
}

/// Property Set fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PropertySet {
    /// Access width.
    pub size: PropertySize,
    /// Property offset.
    pub offset: u32,
    /// Value to write (only the low 4 bytes for a 4-byte access).
    pub value: u64,
}

fn property_head(sqe: &Sqe) -> Result<(PropertySize, u32), Status> {
    let b = &sqe.0;
    let size = match b[40] & 0x7 {
        0 => PropertySize::Four,
        1 => PropertySize::Eight,
        _ => return Err(StatusCode::InvalidField.status()),
    };
    Ok((size, u32::from_le_bytes([b[44], b[45], b[46], b[47]])))
}

impl PropertyGet {
    /// Parses a Property Get SQE.
    pub fn parse(sqe: &Sqe) -> Result<Self, Status> {
        let (size, offset) = property_head(sqe)?;
        Ok(PropertyGet { size, offset })
    }
    /// Builds a Property Get SQE.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut sqe = Sqe::default();
        sqe.set_opcode(FABRICS_OPCODE)
            .set_cid(cid)
            .set_fctype(fctype::PROPERTY_GET)
            .set_transport_data(0);
        sqe.0[40] = u8::from(self.size == PropertySize::Eight);
        sqe.0[44..48].copy_from_slice(&self.offset.to_le_bytes());
        sqe
    }
}

impl PropertySet {
    /// Parses a Property Set SQE.
    pub fn parse(sqe: &Sqe) -> Result<Self, Status> {
        let (size, offset) = property_head(sqe)?;
        let mut v = [0u8; 8];
        v.copy_from_slice(&sqe.0[48..56]);
        let value = u64::from_le_bytes(v);
        let value = match size {
            PropertySize::Four => value & 0xffff_ffff,
            PropertySize::Eight => value,
        };
        Ok(PropertySet {
            size,
            offset,
            value,
        })
    }
    /// Builds a Property Set SQE.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut sqe = Sqe::default();
        sqe.set_opcode(FABRICS_OPCODE)
            .set_cid(cid)
            .set_fctype(fctype::PROPERTY_SET)
            .set_transport_data(0);
        sqe.0[40] = u8::from(self.size == PropertySize::Eight);
        sqe.0[44..48].copy_from_slice(&self.offset.to_le_bytes());
        sqe.0[48..56].copy_from_slice(&self.value.to_le_bytes());
        sqe
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> ConnectData {
        ConnectData {
            hostid: [7; 16],
            cntlid: CNTLID_DYNAMIC,
            subsysnqn: "nqn.2026-01.io.edgevol:vol-1".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1234".into(),
        }
    }

    #[test]
    fn connect_round_trips_at_linux_offsets() {
        let cmd = ConnectCmd {
            qid: 3,
            sqsize: 127,
            cattr: 0,
            kato_ms: 0,
        };
        let sqe = cmd.to_sqe(9);
        assert_eq!((sqe.opcode(), sqe.fctype(), sqe.cid()), (0x7f, 0x01, 9));
        assert_eq!(&sqe.0[42..46], &[3, 0, 127, 0]);
        assert_eq!(ConnectCmd::parse(&sqe), Ok(cmd));
        let bytes = data().to_bytes();
        assert_eq!(&bytes[256..260], b"nqn.");
        assert_eq!(&bytes[16..18], &[0xff, 0xff]);
        assert_eq!(ConnectData::parse(&bytes), Ok(data()));
    }

    #[test]
    fn connect_errors_name_the_field() {
        let mut sqe = ConnectCmd {
            qid: 0,
            sqsize: 0,
            cattr: 0,
            kato_ms: 1000,
        }
        .to_sqe(1);
        let e = ConnectCmd::parse(&sqe).unwrap_err();
        assert_eq!(e.status, StatusCode::ConnectInvalidParameters.status());
        assert_eq!(e.result, 44);
        sqe.0[40] = 1;
        let e = ConnectCmd::parse(&sqe).unwrap_err();
        assert_eq!(e.status, StatusCode::ConnectIncompatibleFormat.status());

        let mut bytes = data().to_bytes();
        bytes[512..768].fill(b'a'); // no NUL terminator
        assert_eq!(
            ConnectData::parse(&bytes).unwrap_err(),
            ConnectError::data_field(512)
        );
        let mut bytes = data().to_bytes();
        bytes[256] = 0; // empty NQN
        assert_eq!(
            ConnectData::parse(&bytes).unwrap_err().result,
            (1 << 16) | 256
        );
        assert!(ConnectData::parse(&bytes[..512]).is_err());
    }

    #[test]
    fn properties_round_trip() {
        let get = PropertyGet {
            size: PropertySize::Eight,
            offset: 0,
        };
        assert_eq!(PropertyGet::parse(&get.to_sqe(1)), Ok(get));
        let set = PropertySet {
            size: PropertySize::Four,
            offset: 0x14,
            value: 0x0046_0001,
        };
        assert_eq!(PropertySet::parse(&set.to_sqe(2)), Ok(set));
        let mut bad = set.to_sqe(3);
        bad.0[40] = 2;
        assert_eq!(
            PropertySet::parse(&bad),
            Err(StatusCode::InvalidField.status())
        );
    }
}
