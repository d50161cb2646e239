//! Identify data structures (`struct nvme_id_ctrl`, `struct nvme_id_ns`, the active namespace
//! list and the namespace identification descriptors of include/linux/nvme.h), built from
//! values: no I/O here.

use super::controller::{Kind, MAX_AERS, MAX_QUEUE_SIZE, VERSION};
use super::errors;
use super::subsys::NSID;

/// Size of every Identify structure.
pub const LEN: usize = 4096;

/// What Identify Controller reports beyond the controller's own state.
#[derive(Debug, Clone)]
pub struct ControllerInfo<'a> {
    /// Controller id.
    pub cntlid: u16,
    /// Discovery or I/O.
    pub kind: &'a Kind,
    /// Subsystem NQN.
    pub subnqn: &'a str,
    /// Serial number (<= 20 ASCII characters).
    pub serial: &'a str,
    /// MDTS in units of 4 KiB pages, as a power of two.
    pub mdts: u8,
    /// In-capsule data bytes on I/O queues.
    pub io_in_capsule: u32,
}

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(dst) = buf.get_mut(at..at + bytes.len()) {
        dst.copy_from_slice(bytes);
    }
}

/// ASCII field padded with spaces, as the spec wants for SN, MN and FR.
fn put_ascii(buf: &mut [u8], at: usize, len: usize, text: &str) {
    let mut field = vec![b' '; len];
    for (d, s) in field
        .iter_mut()
        .zip(text.bytes().filter(u8::is_ascii_graphic))
    {
        *d = s;
    }
    put(buf, at, &field);
}

/// Identify Controller (CNS 01h).
pub fn controller(info: &ControllerInfo<'_>) -> Vec<u8> {
    let mut b = vec![0u8; LEN];
    let discovery = matches!(info.kind, Kind::Discovery);
    put_ascii(&mut b, 4, 20, info.serial);
    put_ascii(&mut b, 24, 40, "edgevol");
    put_ascii(&mut b, 64, 8, env!("CARGO_PKG_VERSION"));
    // CMIC bit 1: the subsystem may have several controllers (readers on several hosts).
    b[76] = if discovery { 0 } else { 1 << 1 };
    b[77] = info.mdts;
    put(&mut b, 78, &info.cntlid.to_le_bytes());
    put(&mut b, 80, &VERSION.to_le_bytes());
    // OAES: namespace attribute notices (I/O controllers).
    let oaes: u32 = if discovery {
        0
    } else {
        super::controller::AEN_NS_ATTR
    };
    put(&mut b, 92, &oaes.to_le_bytes());
    // CNTRLTYPE: 1 I/O, 2 discovery.
    b[111] = if discovery { 2 } else { 1 };
    // AERL (0's based), LPA bit 2: extended data for Get Log Page, ELPE (0's based): the
    // error log ring.
    b[259] = u8::try_from(MAX_AERS - 1).unwrap_or(0);
    b[261] = 1 << 2;
    b[262] = u8::try_from(errors::SLOTS - 1).unwrap_or(u8::MAX);
    // KAS: keep-alive granularity in 100 ms units: whole seconds.
    put(&mut b, 320, &10u16.to_le_bytes());
    // SQES / CQES: required and maximum entry sizes 64 and 16 bytes.
    b[512] = 0x66;
    b[513] = 0x44;
    put(&mut b, 514, &MAX_QUEUE_SIZE.to_le_bytes());
    if !discovery {
        // NN, ONCS (DSM, Write Zeroes), VWC present.
        put(&mut b, 516, &NSID.to_le_bytes());
        put(&mut b, 520, &((1u16 << 2) | (1 << 3)).to_le_bytes());
        b[525] = 1;
    }
    // SGLS: supported (byte aligned), keyed data block descriptors, offset for in-capsule data
    // (what Linux nvmet-tcp reports and the host's tcp.c checks).
    let sgls: u32 = 1 | (1 << 2) | (1 << 20);
    put(&mut b, 536, &sgls.to_le_bytes());
    put(&mut b, 768, info.subnqn.as_bytes());
    // IOCCSZ / IORCSZ in 16-byte units; ICDOFF 0; MSDBD 1.
    let ioccsz = (64 + info.io_in_capsule) / 16;
    put(&mut b, 1792, &ioccsz.to_le_bytes());
    put(&mut b, 1796, &1u32.to_le_bytes());
    b[1803] = 1;
    b
}

/// What Identify Namespace reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Size in bytes.
    pub size: u64,
    /// Bytes of mapped clusters.
    pub used: u64,
    /// log2 of the logical block size.
    pub lba_shift: u8,
    /// NGUID.
    pub nguid: [u8; 16],
    /// UUID.
    pub uuid: [u8; 16],
    /// Write protected for this host.
    pub readonly: bool,
}

/// Identify Namespace (CNS 00h).
pub fn namespace(ns: &NamespaceInfo) -> Vec<u8> {
    let mut b = vec![0u8; LEN];
    let blocks = ns.size >> ns.lba_shift;
    put(&mut b, 0, &blocks.to_le_bytes());
    put(&mut b, 8, &blocks.to_le_bytes());
    put(
        &mut b,
        16,
        &(ns.used.min(ns.size) >> ns.lba_shift).to_le_bytes(),
    );
    // NSFEAT bit 0: thin provisioning (NUSE is meaningful).
    b[24] = 1;
    // NLBAF 0 (one format), FLBAS 0. NMIC bit 0: may be attached to several controllers.
    b[30] = 1;
    // NSATTR bit 0: write protected.
    b[99] = u8::from(ns.readonly);
    put(&mut b, 104, &ns.nguid);
    // LBAF0: no metadata, LBADS.
    b[130] = ns.lba_shift;
    b
}

/// Active namespace list (CNS 02h): namespace 1 if `after` is below it.
pub fn active_namespaces(after: u32) -> Vec<u8> {
    let mut b = vec![0u8; LEN];
    if after < NSID {
        put(&mut b, 0, &NSID.to_le_bytes());
    }
    b
}

/// Namespace identification descriptors (CNS 03h): NGUID, UUID, CSI (NVM).
pub fn descriptors(ns: &NamespaceInfo) -> Vec<u8> {
    let mut b = vec![0u8; LEN];
    let mut at = 0;
    for (nidt, id) in [(2u8, &ns.nguid[..]), (3, &ns.uuid[..]), (4, &[0u8][..])] {
        let len = u8::try_from(id.len()).unwrap_or(0);
        put(&mut b, at, &[nidt, len, 0, 0]);
        put(&mut b, at + 4, id);
        at += 4 + id.len();
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> NamespaceInfo {
        NamespaceInfo {
            size: 1 << 30,
            used: 1 << 20,
            lba_shift: 12,
            nguid: [7; 16],
            uuid: [9; 16],
            readonly: true,
        }
    }

    #[test]
    fn namespace_fields_at_linux_offsets() {
        let b = namespace(&ns());
        assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), 1 << 18);
        assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), 256);
        assert_eq!(b[99], 1);
        assert_eq!(&b[104..120], &[7; 16]);
        assert_eq!(b[130], 12);
    }

    #[test]
    fn descriptors_list_nguid_uuid_csi() {
        let b = descriptors(&ns());
        assert_eq!(&b[0..4], &[2, 16, 0, 0]);
        assert_eq!(&b[20..24], &[3, 16, 0, 0]);
        assert_eq!(&b[24..40], &[9; 16]);
        assert_eq!(&b[40..45], &[4, 1, 0, 0, 0]);
        assert_eq!(&b[45..49], &[0; 4], "terminated");
    }

    #[test]
    fn controller_fields() {
        let kind = Kind::Discovery;
        let b = controller(&ControllerInfo {
            cntlid: 5,
            kind: &kind,
            subnqn: "nqn.x",
            serial: "abc",
            mdts: 8,
            io_in_capsule: 16384,
        });
        assert_eq!(&b[78..80], &[5, 0]);
        assert_eq!(b[111], 2);
        assert_eq!(usize::from(b[262]) + 1, errors::SLOTS, "ELPE");
        assert_eq!(&b[768..773], b"nqn.x");
        assert_eq!(u32::from_le_bytes(b[1792..1796].try_into().unwrap()), 1028);
        assert_eq!(&b[4..8], b"abc ");
        assert_eq!(active_namespaces(1), vec![0u8; LEN]);
        assert_eq!(&active_namespaces(0)[..4], &[1, 0, 0, 0]);
    }
}
