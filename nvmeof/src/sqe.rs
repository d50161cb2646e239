//! The 64-byte submission queue entry and its SGL data pointer, as carried by a CapsuleCmd PDU.
//!
//! Layout from `struct nvme_common_command` / `struct nvme_sgl_desc` (include/linux/nvme.h):
//! opcode at 0, flags at 1, command id at 2, nsid at 4, cdw2..3 at 8, metadata at 16, the data
//! pointer at 24..40 (SGL: address u64, length u32, 3 reserved bytes, type byte at 39), cdw10..15
//! at 40..64. All integers are little-endian.

/// Size of an SQE on the wire.
pub const SQE_LEN: usize = 64;

/// Opcode of every Fabrics command (Connect, Property Get/Set, ...).
pub const FABRICS_OPCODE: u8 = 0x7f;

/// SGL descriptor type byte (upper nibble: descriptor type, lower nibble: subtype).
pub mod sgl_type {
    /// Data Block descriptor, Offset subtype: data is in the capsule at `addr` (in-capsule data).
    pub const IN_CAPSULE: u8 = 0x01;
    /// Transport SGL Data Block, transport-specific subtype 0xA: data moves in H2CData/C2HData.
    pub const TRANSPORT_DATA_BLOCK: u8 = 0x5a;
}

/// Where a command's data lives, decoded from the SGL descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataPointer {
    /// Data is in the same capsule, starting `offset` bytes after the SQE.
    InCapsule {
        /// Offset of the data inside the capsule's data area (the controller's ICDOFF is 0).
        offset: u64,
        /// Data length in bytes.
        length: u32,
    },
    /// Data is transferred with R2T/H2CData (writes) or C2HData (reads).
    Transport {
        /// Data length in bytes (0: no data).
        length: u32,
    },
    /// Any other descriptor type: not usable on NVMe/TCP.
    Unsupported {
        /// The raw type byte.
        type_byte: u8,
    },
}

impl DataPointer {
    /// The data length the descriptor announces (0 for unsupported descriptors).
    pub const fn length(self) -> u32 {
        match self {
            DataPointer::InCapsule { length, .. } | DataPointer::Transport { length } => length,
            DataPointer::Unsupported { .. } => 0,
        }
    }
}

/// Direction of a command's data transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataDirection {
    /// No data.
    None,
    /// Host to controller (writes, Connect).
    HostToController,
    /// Controller to host (reads, Identify).
    ControllerToHost,
}

/// A submission queue entry (by value: 64 bytes).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; SQE_LEN]);

impl core::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sqe")
            .field("opcode", &self.opcode())
            .field("cid", &self.cid())
            .field("nsid", &self.nsid())
            .field("dptr", &self.data_pointer())
            .finish()
    }
}

impl Default for Sqe {
    fn default() -> Self {
        Sqe([0; SQE_LEN])
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

impl Sqe {
    /// Builds an SQE from its first 64 bytes.
    pub fn from_bytes(bytes: &[u8; SQE_LEN]) -> Self {
        Sqe(*bytes)
    }

    /// Command opcode.
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }
    /// Flags byte (FUSE in bits 1:0, PSDT in bits 7:6).
    pub fn flags(&self) -> u8 {
        self.0[1]
    }
    /// Command identifier.
    pub fn cid(&self) -> u16 {
        le16(&self.0, 2)
    }
    /// Namespace identifier (on a Fabrics command, byte 4 is the fctype instead).
    pub fn nsid(&self) -> u32 {
        le32(&self.0, 4)
    }
    /// Fabrics command type (byte 4), meaningful when `opcode() == FABRICS_OPCODE`.
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }
    /// True for a Fabrics command.
    pub fn is_fabrics(&self) -> bool {
        self.opcode() == FABRICS_OPCODE
    }
    /// Command dword `n` (0..=15).
    ///
    /// # Panics
    /// If `n > 15` (a programming error, never wire input).
    pub fn cdw(&self, n: usize) -> u32 {
        assert!(n < 16, "an SQE has 16 dwords");
        le32(&self.0, n * 4)
    }
    /// Address field of the SGL descriptor.
    pub fn sgl_addr(&self) -> u64 {
        le64(&self.0, 24)
    }
    /// Length field of the SGL descriptor.
    pub fn sgl_length(&self) -> u32 {
        le32(&self.0, 32)
    }
    /// Type byte of the SGL descriptor.
    pub fn sgl_type(&self) -> u8 {
        self.0[39]
    }
    /// The decoded data pointer.
    pub fn data_pointer(&self) -> DataPointer {
        match self.sgl_type() {
            sgl_type::IN_CAPSULE => DataPointer::InCapsule {
                offset: self.sgl_addr(),
                length: self.sgl_length(),
            },
            sgl_type::TRANSPORT_DATA_BLOCK => DataPointer::Transport {
                length: self.sgl_length(),
            },
            type_byte => DataPointer::Unsupported { type_byte },
        }
    }
    /// Direction of the data transfer: Linux `nvme_is_write` (opcode bit 0; on Fabrics commands
    /// fctype bit 0), otherwise controller-to-host when the SGL announces data.
    pub fn data_direction(&self) -> DataDirection {
        let write = if self.is_fabrics() {
            self.fctype() & 1 == 1
        } else {
            self.opcode() & 1 == 1
        };
        if self.data_pointer().length() == 0 {
            DataDirection::None
        } else if write {
            DataDirection::HostToController
        } else {
            DataDirection::ControllerToHost
        }
    }

    /// Sets the opcode.
    pub fn set_opcode(&mut self, v: u8) -> &mut Self {
        self.0[0] = v;
        self
    }
    /// Sets the flags byte.
    pub fn set_flags(&mut self, v: u8) -> &mut Self {
        self.0[1] = v;
        self
    }
    /// Sets the command identifier.
    pub fn set_cid(&mut self, v: u16) -> &mut Self {
        self.0[2..4].copy_from_slice(&v.to_le_bytes());
        self
    }
    /// Sets the namespace identifier.
    pub fn set_nsid(&mut self, v: u32) -> &mut Self {
        self.0[4..8].copy_from_slice(&v.to_le_bytes());
        self
    }
    /// Sets the Fabrics command type (byte 4).
    pub fn set_fctype(&mut self, v: u8) -> &mut Self {
        self.0[4] = v;
        self
    }
    /// Sets command dword `n` (0..=15).
    ///
    /// # Panics
    /// If `n > 15`.
    pub fn set_cdw(&mut self, n: usize, v: u32) -> &mut Self {
        assert!(n < 16, "an SQE has 16 dwords");
        self.0[n * 4..n * 4 + 4].copy_from_slice(&v.to_le_bytes());
        self
    }
    /// Sets the SGL descriptor (address, length, type byte) and the PSDT flag bits to "SGL".
    pub fn set_sgl(&mut self, addr: u64, length: u32, type_byte: u8) -> &mut Self {
        self.0[24..32].copy_from_slice(&addr.to_le_bytes());
        self.0[32..36].copy_from_slice(&length.to_le_bytes());
        self.0[36..39].fill(0);
        self.0[39] = type_byte;
        // PSDT = 01b: SGL for data, metadata as a contiguous buffer (NVME_CMD_SGL_METABUF).
        self.0[1] = (self.0[1] & 0x3f) | 0x40;
        self
    }
    /// Sets an in-capsule data pointer of `length` bytes at offset 0.
    pub fn set_in_capsule(&mut self, length: u32) -> &mut Self {
        self.set_sgl(0, length, sgl_type::IN_CAPSULE)
    }
    /// Sets a transport data block pointer of `length` bytes (0: no data).
    pub fn set_transport_data(&mut self, length: u32) -> &mut Self {
        self.set_sgl(0, length, sgl_type::TRANSPORT_DATA_BLOCK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors_read_what_setters_wrote() {
        let mut sqe = Sqe::default();
        sqe.set_opcode(0x02)
            .set_cid(0xbeef)
            .set_nsid(1)
            .set_cdw(10, 0x1234_5678)
            .set_cdw(12, 7)
            .set_transport_data(4096);
        assert_eq!(sqe.opcode(), 0x02);
        assert_eq!(sqe.cid(), 0xbeef);
        assert_eq!(sqe.nsid(), 1);
        assert_eq!(sqe.cdw(10), 0x1234_5678);
        assert_eq!(sqe.cdw(12), 7);
        assert_eq!(sqe.flags() & 0xc0, 0x40);
        assert_eq!(sqe.0[39], 0x5a);
        assert_eq!(sqe.data_pointer(), DataPointer::Transport { length: 4096 });
        assert_eq!(sqe.data_direction(), DataDirection::ControllerToHost);
    }

    #[test]
    fn direction_follows_opcode_and_fctype() {
        let mut write = Sqe::default();
        write.set_opcode(0x01).set_in_capsule(512);
        assert_eq!(write.data_direction(), DataDirection::HostToController);
        assert_eq!(
            write.data_pointer(),
            DataPointer::InCapsule {
                offset: 0,
                length: 512
            }
        );

        let mut connect = Sqe::default();
        connect
            .set_opcode(FABRICS_OPCODE)
            .set_fctype(0x01)
            .set_in_capsule(1024);
        assert_eq!(connect.data_direction(), DataDirection::HostToController);

        let mut prop_get = Sqe::default();
        prop_get
            .set_opcode(FABRICS_OPCODE)
            .set_fctype(0x04)
            .set_transport_data(0);
        assert_eq!(prop_get.data_direction(), DataDirection::None);

        let mut keyed = Sqe::default();
        keyed.set_sgl(0x1000, 8, 0x40);
        assert_eq!(
            keyed.data_pointer(),
            DataPointer::Unsupported { type_byte: 0x40 }
        );
    }
}
