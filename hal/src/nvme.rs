//! NVMe drives through the Linux driver: block I/O via [`LinuxBlockDevice`] plus admin passthrough
//! (`NVME_IOCTL_ADMIN_CMD`) for Identify Controller/Namespace, the Namespace Identification
//! Descriptor list and the SMART / Health log. The parsers are plain functions over the 4 KiB /
//! 512 B pages so they are tested without a drive.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;
use std::path::Path;

use edgevol_core::{BlockDevice, ErrorType};

use crate::buf::AlignedBuf;
use crate::error::Error;
use crate::linux_block::{BlockOptions, LinuxBlockDevice};

/// `struct nvme_passthru_cmd` from `<linux/nvme_ioctl.h>` (72 bytes).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct NvmePassthruCmd {
    pub opcode: u8,
    pub flags: u8,
    pub rsvd1: u16,
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    pub metadata: u64,
    pub addr: u64,
    pub metadata_len: u32,
    pub data_len: u32,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
    pub timeout_ms: u32,
    pub result: u32,
}
const _: () = assert!(std::mem::size_of::<NvmePassthruCmd>() == 72);

mod ioctl {
    // NVME_IOCTL_ID = _IO('N', 0x40); NVME_IOCTL_ADMIN_CMD = _IOWR('N', 0x41, struct nvme_admin_cmd).
    nix::ioctl_none!(nvme_ioctl_id, b'N', 0x40);
    nix::ioctl_readwrite!(nvme_admin_cmd, b'N', 0x41, super::NvmePassthruCmd);
}

const OPC_GET_LOG_PAGE: u8 = 0x02;
const OPC_IDENTIFY: u8 = 0x06;
const CNS_NAMESPACE: u32 = 0x00;
const CNS_CONTROLLER: u32 = 0x01;
const CNS_NS_DESCRIPTORS: u32 = 0x03;
const LID_SMART: u32 = 0x02;
const ADMIN_TIMEOUT_MS: u32 = 10_000;

/// Sends one admin command whose data (if any) is read into `data`. Returns the completion's
/// DW0 (`result`).
pub fn admin_command(
    fd: &impl AsRawFd,
    cmd: &mut NvmePassthruCmd,
    data: &mut [u8],
) -> Result<u32, Error> {
    cmd.addr = data.as_mut_ptr() as u64;
    cmd.data_len =
        u32::try_from(data.len()).map_err(|_| Error::Unsupported("admin data > 4 GiB"))?;
    if cmd.timeout_ms == 0 {
        cmd.timeout_ms = ADMIN_TIMEOUT_MS;
    }
    // SAFETY: `cmd` is a valid nvme_passthru_cmd; `addr`/`data_len` describe `data`, which is
    // exclusively borrowed and outlives the synchronous ioctl. The kernel writes `result` back.
    let r = unsafe { ioctl::nvme_admin_cmd(fd.as_raw_fd(), cmd) }
        .map_err(|e| Error::errno("NVME_IOCTL_ADMIN_CMD", None, e))?;
    if r != 0 {
        return Err(Error::Nvme {
            opcode: cmd.opcode,
            status: r.unsigned_abs(),
        });
    }
    Ok(cmd.result)
}

/// The namespace id behind a namespace block device (`NVME_IOCTL_ID`).
pub fn namespace_id(fd: &impl AsRawFd) -> Result<u32, Error> {
    // SAFETY: no argument; fd is open for the call.
    let r = unsafe { ioctl::nvme_ioctl_id(fd.as_raw_fd()) }
        .map_err(|e| Error::errno("NVME_IOCTL_ID", None, e))?;
    u32::try_from(r).map_err(|_| Error::Corrupt("negative namespace id"))
}

fn identify(fd: &impl AsRawFd, cns: u32, nsid: u32) -> Result<AlignedBuf, Error> {
    let mut page = AlignedBuf::zeroed(4096);
    let mut cmd = NvmePassthruCmd {
        opcode: OPC_IDENTIFY,
        nsid,
        cdw10: cns,
        ..Default::default()
    };
    admin_command(fd, &mut cmd, &mut page)?;
    Ok(page)
}

/// Reads Identify Controller.
pub fn identify_controller(fd: &impl AsRawFd) -> Result<IdentifyController, Error> {
    Ok(IdentifyController::parse(&identify(fd, CNS_CONTROLLER, 0)?))
}

/// Reads Identify Namespace and the Namespace Identification Descriptor list (CNS 3; controllers
/// before NVMe 1.3 reject it, in which case NGUID/EUI64 come from Identify Namespace alone).
pub fn identify_namespace(fd: &impl AsRawFd, nsid: u32) -> Result<IdentifyNamespace, Error> {
    let mut ns = IdentifyNamespace::parse(&identify(fd, CNS_NAMESPACE, nsid)?)?;
    match identify(fd, CNS_NS_DESCRIPTORS, nsid) {
        Ok(page) => ns.merge_descriptors(&page),
        Err(Error::Nvme { .. }) => {}
        Err(e) => return Err(e),
    }
    Ok(ns)
}

/// Reads the SMART / Health Information log (global, NSID 0xFFFFFFFF).
pub fn smart_log(fd: &impl AsRawFd) -> Result<SmartLog, Error> {
    let mut page = AlignedBuf::zeroed(512);
    let numd = 512 / 4 - 1; // 0-based dword count
    let mut cmd = NvmePassthruCmd {
        opcode: OPC_GET_LOG_PAGE,
        nsid: 0xFFFF_FFFF,
        cdw10: (numd << 16) | LID_SMART,
        ..Default::default()
    };
    admin_command(fd, &mut cmd, &mut page)?;
    Ok(SmartLog::parse(&page))
}

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn le64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}
fn le128(b: &[u8], o: usize) -> u128 {
    u128::from_le_bytes(b[o..o + 16].try_into().expect("16 bytes"))
}
/// ASCII fields are space padded (and sometimes NUL padded by emulators).
fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches([' ', '\0'])
        .trim_start()
        .to_string()
}

/// Identify Controller (CNS 01h), the fields edgevol uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentifyController {
    /// PCI vendor id.
    pub vid: u16,
    /// Serial number (SN).
    pub serial: String,
    /// Model number (MN).
    pub model: String,
    /// Firmware revision (FR).
    pub firmware: String,
    /// IEEE OUI identifier.
    pub ieee_oui: [u8; 3],
    /// Controller id.
    pub cntlid: u16,
    /// Version (VER): major << 16 | minor << 8 | tertiary.
    pub version: u32,
    /// Maximum data transfer size as a power of two of the minimum page size (0 = no limit).
    pub mdts: u8,
    /// Warning composite temperature threshold, Kelvin.
    pub wctemp: u16,
    /// Critical composite temperature threshold, Kelvin.
    pub cctemp: u16,
    /// Total NVM capacity in bytes (0 if not reported).
    pub tnvmcap: u128,
    /// Number of namespaces.
    pub nn: u32,
    /// Optional NVM command support (ONCS): bit 2 Dataset Management, bit 3 Write Zeroes.
    pub oncs: u16,
    /// Volatile write cache present (VWC bit 0).
    pub volatile_write_cache: bool,
    /// NVM subsystem NQN.
    pub subnqn: String,
}

impl IdentifyController {
    /// Parses a 4096-byte Identify Controller page.
    pub fn parse(p: &[u8]) -> Self {
        Self {
            vid: le16(p, 0),
            serial: ascii(&p[4..24]),
            model: ascii(&p[24..64]),
            firmware: ascii(&p[64..72]),
            ieee_oui: [p[73], p[74], p[75]],
            mdts: p[77],
            cntlid: le16(p, 78),
            version: le32(p, 80),
            wctemp: le16(p, 266),
            cctemp: le16(p, 268),
            tnvmcap: le128(p, 280),
            nn: le32(p, 516),
            oncs: le16(p, 520),
            volatile_write_cache: p[525] & 1 != 0,
            subnqn: ascii(&p[768..1024]),
        }
    }

    /// Whether Dataset Management (deallocate) is supported.
    pub fn supports_deallocate(&self) -> bool {
        self.oncs & (1 << 2) != 0
    }
}

/// One LBA format of a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LbaFormat {
    /// Metadata bytes per block.
    pub metadata_size: u16,
    /// Data bytes per block (2^LBADS).
    pub data_size: u32,
    /// Relative performance: 0 best .. 3 degraded.
    pub relative_performance: u8,
}

/// Identify Namespace (CNS 00h) plus the identifiers of the descriptor list (CNS 03h).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentifyNamespace {
    /// Namespace size in blocks (NSZE).
    pub size_blocks: u64,
    /// Capacity in blocks (NCAP).
    pub capacity_blocks: u64,
    /// Blocks in use (NUSE); below NSZE on thin-provisioned namespaces.
    pub utilization_blocks: u64,
    /// Supported LBA formats.
    pub lba_formats: Vec<LbaFormat>,
    /// Index of the format in use (FLBAS).
    pub current_format: usize,
    /// Deallocate read behaviour (DLFEAT bits 2:0): 1 = reads return zeros, 2 = ones, 0 = unknown.
    pub dealloc_read_value: u8,
    /// Namespace globally unique id (all zeros = absent).
    pub nguid: [u8; 16],
    /// IEEE extended unique id (all zeros = absent).
    pub eui64: [u8; 8],
    /// Namespace UUID from the descriptor list, if any.
    pub uuid: Option<[u8; 16]>,
}

impl IdentifyNamespace {
    /// Parses a 4096-byte Identify Namespace page.
    pub fn parse(p: &[u8]) -> Result<Self, Error> {
        let nlbaf = usize::from(p[25]) + 1;
        let flbas = p[26];
        // FLBAS bits 3:0 are the low index, bits 6:5 the high bits (formats beyond 16).
        let current = usize::from(flbas & 0x0F) | (usize::from((flbas >> 5) & 0x3) << 4);
        if nlbaf > 64 || current >= nlbaf {
            return Err(Error::Corrupt("identify namespace: bad NLBAF/FLBAS"));
        }
        let mut lba_formats = Vec::with_capacity(nlbaf);
        for i in 0..nlbaf {
            let o = 128 + 4 * i;
            let lbads = p[o + 2];
            if !(9..=31).contains(&lbads) && i == current {
                return Err(Error::Corrupt(
                    "identify namespace: LBADS of current format out of range",
                ));
            }
            lba_formats.push(LbaFormat {
                metadata_size: le16(p, o),
                data_size: 1u32.checked_shl(u32::from(lbads)).unwrap_or(0),
                relative_performance: p[o + 3] & 0x3,
            });
        }
        Ok(Self {
            size_blocks: le64(p, 0),
            capacity_blocks: le64(p, 8),
            utilization_blocks: le64(p, 16),
            lba_formats,
            current_format: current,
            dealloc_read_value: p[33] & 0x7,
            nguid: p[104..120].try_into().expect("16 bytes"),
            eui64: p[120..128].try_into().expect("8 bytes"),
            uuid: None,
        })
    }

    /// Fills identifiers from a Namespace Identification Descriptor list (CNS 03h). Descriptor
    /// values win over the Identify Namespace fields when both are present.
    pub fn merge_descriptors(&mut self, p: &[u8]) {
        let mut o = 0;
        while o + 4 <= p.len() {
            let (nidt, nidl) = (p[o], usize::from(p[o + 1]));
            if nidt == 0 || o + 4 + nidl > p.len() {
                break;
            }
            let v = &p[o + 4..o + 4 + nidl];
            match (nidt, nidl) {
                (1, 8) => self.eui64.copy_from_slice(v),
                (2, 16) => self.nguid.copy_from_slice(v),
                (3, 16) => self.uuid = Some(v.try_into().expect("16 bytes")),
                _ => {}
            }
            o += 4 + nidl;
        }
    }

    /// The LBA format in use.
    pub fn current_lba_format(&self) -> LbaFormat {
        self.lba_formats[self.current_format]
    }

    /// Whether an NGUID is reported.
    pub fn has_nguid(&self) -> bool {
        self.nguid != [0; 16]
    }

    /// Whether an EUI64 is reported.
    pub fn has_eui64(&self) -> bool {
        self.eui64 != [0; 8]
    }
}

/// SMART / Health Information (log page 02h).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmartLog {
    /// Critical warning bits: 0 spare low, 1 temperature, 2 reliability degraded, 3 read-only,
    /// 4 volatile backup failed, 5 persistent memory read-only.
    pub critical_warning: u8,
    /// Composite temperature, Kelvin.
    pub temperature_kelvin: u16,
    /// Available spare, percent.
    pub available_spare: u8,
    /// Available spare threshold, percent.
    pub available_spare_threshold: u8,
    /// Estimate of life used, percent (may exceed 100).
    pub percentage_used: u8,
    /// Data units (1000 x 512 bytes) read.
    pub data_units_read: u128,
    /// Data units (1000 x 512 bytes) written.
    pub data_units_written: u128,
    /// Read commands completed.
    pub host_read_commands: u128,
    /// Write commands completed.
    pub host_write_commands: u128,
    /// Power cycles.
    pub power_cycles: u128,
    /// Power-on hours.
    pub power_on_hours: u128,
    /// Unsafe shutdowns.
    pub unsafe_shutdowns: u128,
    /// Unrecovered data integrity errors.
    pub media_errors: u128,
    /// Error log entries over the life of the controller.
    pub error_log_entries: u128,
}

impl SmartLog {
    /// Parses a 512-byte SMART / Health log page.
    pub fn parse(p: &[u8]) -> Self {
        Self {
            critical_warning: p[0],
            temperature_kelvin: le16(p, 1),
            available_spare: p[3],
            available_spare_threshold: p[4],
            percentage_used: p[5],
            data_units_read: le128(p, 32),
            data_units_written: le128(p, 48),
            host_read_commands: le128(p, 64),
            host_write_commands: le128(p, 80),
            power_cycles: le128(p, 112),
            power_on_hours: le128(p, 128),
            unsafe_shutdowns: le128(p, 144),
            media_errors: le128(p, 160),
            error_log_entries: le128(p, 176),
        }
    }

    /// Composite temperature in degrees Celsius.
    pub fn temperature_celsius(&self) -> i32 {
        i32::from(self.temperature_kelvin) - 273
    }

    /// Whether the drive asks for attention: any critical warning, spare below threshold, or
    /// media errors. The appliance reports such a volume condition as abnormal.
    pub fn is_degraded(&self) -> bool {
        self.critical_warning != 0
            || self.available_spare < self.available_spare_threshold
            || self.media_errors > 0
    }
}

/// An NVMe namespace block device (`/dev/nvmeXnY`) with admin passthrough on the same descriptor.
#[derive(Debug)]
pub struct NvmeDevice {
    block: LinuxBlockDevice,
    nsid: u32,
}

impl NvmeDevice {
    /// Opens a namespace block device with default [`BlockOptions`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::open_with(path, &BlockOptions::default())
    }

    /// Opens a namespace block device.
    pub fn open_with(path: impl AsRef<Path>, opts: &BlockOptions) -> Result<Self, Error> {
        let block = LinuxBlockDevice::open_with(path, opts)?;
        let nsid = namespace_id(block.file())?;
        Ok(Self { block, nsid })
    }

    /// Namespace id.
    pub fn nsid(&self) -> u32 {
        self.nsid
    }
    /// The underlying block device (geometry, discard, write zeroes, a second descriptor).
    pub fn block(&self) -> &LinuxBlockDevice {
        &self.block
    }
    /// Identify Controller.
    pub fn identify_controller(&self) -> Result<IdentifyController, Error> {
        identify_controller(self.block.file())
    }
    /// Identify Namespace of this namespace, with its descriptor list.
    pub fn identify_namespace(&self) -> Result<IdentifyNamespace, Error> {
        identify_namespace(self.block.file(), self.nsid)
    }
    /// The SMART / Health log.
    pub fn smart_log(&self) -> Result<SmartLog, Error> {
        smart_log(self.block.file())
    }
}

impl ErrorType for NvmeDevice {
    type Error = Error;
}

impl BlockDevice for NvmeDevice {
    fn block_size(&self) -> u32 {
        self.block.block_size()
    }
    fn block_count(&self) -> u64 {
        self.block.block_count()
    }
    fn read(&mut self, block: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.block.read_blocks(block, buf)
    }
    fn write(&mut self, block: u64, data: &[u8]) -> Result<(), Error> {
        self.block.write_blocks(block, data)
    }
    fn flush(&mut self) -> Result<(), Error> {
        self.block.sync()
    }
    fn discard(&mut self, block: u64, count: u64) -> Result<(), Error> {
        self.block.discard_blocks(block, count)
    }
}

/// Formats 8 or 16 identifier bytes as lowercase hex (nvme-cli style).
pub fn hex_id(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(p: &mut [u8], o: usize, s: &[u8]) {
        p[o..o + s.len()].copy_from_slice(s);
    }

    #[test]
    fn parse_identify_controller() {
        let mut p = vec![0u8; 4096];
        put(&mut p, 0, &0x1b36u16.to_le_bytes());
        put(&mut p, 4, b"EDGEVOLTEST01       ");
        put(&mut p, 24, b"QEMU NVMe Ctrl                          ");
        put(&mut p, 64, b"7.2.22  ");
        put(&mut p, 73, &[0x00, 0x54, 0x52]);
        p[77] = 7;
        put(&mut p, 80, &0x0001_0400u32.to_le_bytes());
        put(&mut p, 266, &343u16.to_le_bytes());
        put(&mut p, 516, &256u32.to_le_bytes());
        put(&mut p, 520, &0x000Cu16.to_le_bytes());
        p[525] = 1;
        put(&mut p, 768, b"nqn.2019-08.org.qemu:EDGEVOLTEST01");
        let c = IdentifyController::parse(&p);
        assert_eq!(c.vid, 0x1b36);
        assert_eq!(c.serial, "EDGEVOLTEST01");
        assert_eq!(c.model, "QEMU NVMe Ctrl");
        assert_eq!(c.firmware, "7.2.22");
        assert_eq!(c.mdts, 7);
        assert_eq!(c.version, 0x0001_0400);
        assert_eq!(c.wctemp, 343);
        assert_eq!(c.nn, 256);
        assert!(c.supports_deallocate());
        assert!(c.volatile_write_cache);
        assert_eq!(c.subnqn, "nqn.2019-08.org.qemu:EDGEVOLTEST01");
    }

    #[test]
    fn parse_identify_namespace_and_descriptors() {
        let mut p = vec![0u8; 4096];
        put(&mut p, 0, &262144u64.to_le_bytes());
        put(&mut p, 8, &262144u64.to_le_bytes());
        put(&mut p, 16, &1000u64.to_le_bytes());
        p[25] = 1; // two formats
        p[26] = 1; // using format 1
        p[33] = 0x09; // DLFEAT: reads of deallocated blocks return zeros
        put(&mut p, 120, &[0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77]);
        put(&mut p, 128, &[0, 0, 9, 0]); // 512 B
        put(&mut p, 132, &[8, 0, 12, 2]); // 4 KiB + 8 B metadata, degraded perf
        let mut ns = IdentifyNamespace::parse(&p).unwrap();
        assert_eq!(ns.size_blocks, 262144);
        assert_eq!(ns.utilization_blocks, 1000);
        assert_eq!(ns.lba_formats.len(), 2);
        assert_eq!(
            ns.current_lba_format(),
            LbaFormat {
                metadata_size: 8,
                data_size: 4096,
                relative_performance: 2
            }
        );
        assert_eq!(ns.dealloc_read_value, 1);
        assert!(ns.has_eui64() && !ns.has_nguid());
        assert_eq!(hex_id(&ns.eui64), "0011223344556677");

        let mut d = vec![0u8; 4096];
        put(&mut d, 0, &[2, 16, 0, 0]);
        put(&mut d, 4, &[0xAB; 16]);
        put(&mut d, 20, &[3, 16, 0, 0]);
        put(&mut d, 24, &[0xCD; 16]);
        put(&mut d, 40, &[1, 8, 0, 0]);
        put(&mut d, 44, &[0xEF; 8]);
        ns.merge_descriptors(&d);
        assert_eq!(ns.nguid, [0xAB; 16]);
        assert_eq!(ns.uuid, Some([0xCD; 16]));
        assert_eq!(ns.eui64, [0xEF; 8]);

        p[26] = 5; // current format beyond NLBAF
        assert!(matches!(
            IdentifyNamespace::parse(&p),
            Err(Error::Corrupt(_))
        ));
    }

    #[test]
    fn parse_smart() {
        let mut p = vec![0u8; 512];
        p[0] = 0x04;
        put(&mut p, 1, &323u16.to_le_bytes());
        p[3] = 100;
        p[4] = 10;
        p[5] = 3;
        put(&mut p, 48, &17u128.to_le_bytes());
        put(&mut p, 80, &1234u128.to_le_bytes());
        put(&mut p, 160, &2u128.to_le_bytes());
        let s = SmartLog::parse(&p);
        assert_eq!(s.temperature_celsius(), 50);
        assert_eq!(s.percentage_used, 3);
        assert_eq!(s.data_units_written, 17);
        assert_eq!(s.host_write_commands, 1234);
        assert_eq!(s.media_errors, 2);
        assert!(s.is_degraded());
        p[0] = 0;
        put(&mut p, 160, &0u128.to_le_bytes());
        assert!(!SmartLog::parse(&p).is_degraded());
    }
}
