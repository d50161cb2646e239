//! What the kernel says about NVMe controllers and namespaces, read from sysfs.
//!
//! * Controllers: `/sys/class/nvme/nvmeN/{transport,address,subsysnqn,hostnqn,state}`. `address`
//!   is `traddr=..,trsvcid=..` (newer kernels append `,src_addr=..`).
//! * Namespaces: `/sys/block/<disk>/{nguid,uuid,size,dev}`. `nguid` and `uuid` print as UUID
//!   text (`%pU`); when a namespace has no UUID the kernel prints the NGUID in `uuid` for
//!   backward compatibility, so a `uuid` equal to the `nguid` means "no UUID". With native
//!   multipath the disk is the head `nvmeSnY` and per-path `nvmeXcYnZ` disks are hidden (no
//!   device node): those are skipped. A namespace is found by its identifiers only, never by
//!   name or enumeration order.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::host::Host;

/// A controller as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controller {
    /// `nvmeN`.
    pub name: String,
    /// `tcp`, `rdma`, `loop`, `pcie`...
    pub transport: String,
    /// `traddr` from `address`.
    pub traddr: String,
    /// `trsvcid` from `address`.
    pub trsvcid: String,
    /// `subsysnqn`.
    pub subsysnqn: String,
    /// `hostnqn` (empty for PCIe controllers).
    pub hostnqn: String,
    /// `state`: `live`, `connecting`, `resetting`, `deleting`, `dead`, `new`...
    pub state: String,
}

impl Controller {
    /// True when the kernel is not tearing this controller down: a controller that is
    /// reconnecting is still the one to reuse (the kernel keeps its namespaces).
    pub fn usable(&self) -> bool {
        !matches!(
            self.state.as_str(),
            "deleting" | "deleting (no IO)" | "dead"
        )
    }
}

fn read_attr(dir: &Path, name: &str) -> io::Result<String> {
    Ok(fs::read_to_string(dir.join(name))?.trim().to_owned())
}

fn read_attr_or_empty(dir: &Path, name: &str) -> io::Result<String> {
    match read_attr(dir, name) {
        Ok(v) => Ok(v),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e),
    }
}

/// Splits `traddr=1.2.3.4,trsvcid=4420[,src_addr=..]` into (traddr, trsvcid).
pub fn parse_address(address: &str) -> (String, String) {
    let mut traddr = String::new();
    let mut trsvcid = String::new();
    for part in address.split(',') {
        if let Some(v) = part.trim().strip_prefix("traddr=") {
            v.clone_into(&mut traddr);
        } else if let Some(v) = part.trim().strip_prefix("trsvcid=") {
            v.clone_into(&mut trsvcid);
        }
    }
    (traddr, trsvcid)
}

/// The directory of controller `name`.
pub fn controller_dir<H: Host + ?Sized>(host: &H, name: &str) -> PathBuf {
    host.sys_root().join("class/nvme").join(name)
}

/// Every NVMe controller on the host. A controller that vanishes while it is read (deleted
/// concurrently) is left out.
pub fn controllers<H: Host + ?Sized>(host: &H) -> io::Result<Vec<Controller>> {
    let class = host.sys_root().join("class/nvme");
    let entries = match fs::read_dir(&class) {
        Ok(e) => e,
        // No nvme module loaded yet: no controllers.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("nvme") {
            continue;
        }
        match read_controller(&entry.path(), name) {
            Ok(c) => out.push(c),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn read_controller(dir: &Path, name: String) -> io::Result<Controller> {
    let (traddr, trsvcid) = parse_address(&read_attr_or_empty(dir, "address")?);
    Ok(Controller {
        transport: read_attr(dir, "transport")?,
        subsysnqn: read_attr(dir, "subsysnqn")?,
        hostnqn: read_attr_or_empty(dir, "hostnqn")?,
        state: read_attr_or_empty(dir, "state")?,
        traddr,
        trsvcid,
        name,
    })
}

/// The state of controller `name`, or `None` when it does not exist.
pub fn controller_state<H: Host + ?Sized>(host: &H, name: &str) -> io::Result<Option<String>> {
    match read_attr(&controller_dir(host, name), "state") {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// What a controller's `fast_io_fail_tmo` attribute says (Linux 5.10 and later; writable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailFast {
    /// `off`: I/O queued while the controller reconnects waits until it is deleted.
    Off,
    /// Queued I/O fails this many seconds after the connection was lost.
    After(u32),
    /// No such attribute (an older kernel, or the controller is gone), or unreadable text.
    Unknown,
}

/// The `fast_io_fail_tmo` of controller `name`.
pub fn controller_fail_fast<H: Host + ?Sized>(host: &H, name: &str) -> io::Result<FailFast> {
    match read_attr(&controller_dir(host, name), "fast_io_fail_tmo") {
        Ok(v) if v == "off" => Ok(FailFast::Off),
        Ok(v) => Ok(v.parse().map_or(FailFast::Unknown, FailFast::After)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(FailFast::Unknown),
        Err(e) => Err(e),
    }
}

/// A namespace identity: NGUID and/or UUID, each 16 bytes as 32 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceId {
    /// NGUID, 32 hex digits, if known.
    pub nguid: Option<String>,
    /// UUID, 32 hex digits (dashes removed), if known.
    pub uuid: Option<String>,
}

/// Normalises an identifier as sysfs or a publish_context writes it (UUID text or plain hex)
/// to 32 lowercase hex digits. `None` when it is not 16 bytes of hex, or all zero.
pub fn normalize_id(text: &str) -> Option<String> {
    let hex: String = text
        .trim()
        .chars()
        .filter(|c| *c != '-')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    if hex.chars().all(|c| c == '0') {
        return None;
    }
    Some(hex)
}

impl NamespaceId {
    /// Whether a namespace showing `nguid`/`uuid` (already normalised) is this one: every
    /// identifier both sides know must agree, and at least one must.
    fn matches(&self, nguid: Option<&str>, uuid: Option<&str>) -> bool {
        let mut agreed = false;
        for (want, have) in [(&self.nguid, nguid), (&self.uuid, uuid)] {
            if let (Some(w), Some(h)) = (want.as_deref(), have) {
                if w != h {
                    return false;
                }
                agreed = true;
            }
        }
        agreed
    }
}

/// A namespace block device found in sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    /// Disk name (`nvme1n1`).
    pub disk: String,
    /// `major:minor` from `dev`.
    pub dev: String,
    /// Size in bytes (`size` is in 512-byte sectors whatever the LBA size).
    pub size_bytes: u64,
}

/// True for hidden per-path multipath disks (`nvme0c1n1`).
fn is_path_disk(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("nvme") else {
        return false;
    };
    let digits = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    digits.starts_with('c')
}

/// Reads one disk's `size` in bytes.
pub fn disk_size<H: Host + ?Sized>(host: &H, disk: &str) -> io::Result<u64> {
    let dir = host.sys_root().join("block").join(disk);
    let sectors = read_attr(&dir, "size")?;
    let sectors: u64 = sectors
        .parse()
        .map_err(|_| io::Error::other(format!("{}/size: not a number", dir.display())))?;
    Ok(sectors.saturating_mul(512))
}

/// Finds the namespace with identity `id` among the host's NVMe disks.
pub fn find_namespace<H: Host + ?Sized>(
    host: &H,
    id: &NamespaceId,
) -> io::Result<Option<Namespace>> {
    let block = host.sys_root().join("block");
    let entries = match fs::read_dir(&block) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut found: Vec<Namespace> = Vec::new();
    for entry in entries {
        let entry = entry?;
        let disk = entry.file_name().to_string_lossy().into_owned();
        if !disk.starts_with("nvme") || is_path_disk(&disk) {
            continue;
        }
        let dir = entry.path();
        let nguid = read_attr_or_empty(&dir, "nguid")?;
        let uuid = read_attr_or_empty(&dir, "uuid")?;
        let nguid = normalize_id(&nguid);
        let mut uuid = normalize_id(&uuid);
        if uuid.is_some() && uuid == nguid {
            // The kernel's fallback: no UUID, the NGUID printed again.
            uuid = None;
        }
        if !id.matches(nguid.as_deref(), uuid.as_deref()) {
            continue;
        }
        let dev = match read_attr(&dir, "dev") {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        found.push(Namespace {
            size_bytes: disk_size(host, &disk)?,
            disk,
            dev,
        });
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => {
            let names: Vec<_> = found.iter().map(|n| n.disk.as_str()).collect();
            Err(io::Error::other(format!(
                "several disks carry the same namespace identity: {}",
                names.join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeHost;

    const NGUID: &str = "0123456789abcdef0123456789abcdef";
    const NGUID_TEXT: &str = "01234567-89ab-cdef-0123-456789abcdef";
    const UUID: &str = "9f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b";

    #[test]
    fn address_parsing_ignores_src_addr() {
        assert_eq!(
            parse_address("traddr=10.0.0.2,trsvcid=4420,src_addr=10.0.0.9"),
            ("10.0.0.2".to_owned(), "4420".to_owned())
        );
        assert_eq!(parse_address(""), (String::new(), String::new()));
    }

    #[test]
    fn normalize_accepts_uuid_text_and_plain_hex() {
        assert_eq!(normalize_id(NGUID_TEXT).as_deref(), Some(NGUID));
        assert_eq!(normalize_id(&NGUID.to_uppercase()).as_deref(), Some(NGUID));
        assert_eq!(normalize_id("00000000-0000-0000-0000-000000000000"), None);
        assert_eq!(normalize_id("0123"), None);
        assert_eq!(normalize_id("zz23456789abcdef0123456789abcdef"), None);
    }

    #[test]
    fn finds_namespace_by_nguid_not_by_order() {
        let host = FakeHost::new();
        host.add_disk(
            "nvme0n1",
            "259:0",
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
            UUID,
            2048,
        );
        host.add_disk("nvme3n1", "259:3", NGUID_TEXT, NGUID_TEXT, 4096);
        let id = NamespaceId {
            nguid: Some(NGUID.to_owned()),
            uuid: None,
        };
        let ns = find_namespace(&host, &id).unwrap().unwrap();
        assert_eq!(ns.disk, "nvme3n1");
        assert_eq!(ns.dev, "259:3");
        assert_eq!(ns.size_bytes, 4096 * 512);
    }

    #[test]
    fn uuid_equal_to_nguid_means_no_uuid() {
        // The namespace has only an NGUID; the kernel prints it in `uuid` too. Asking for
        // NGUID + a real UUID must still match on the NGUID.
        let host = FakeHost::new();
        host.add_disk("nvme1n1", "259:1", NGUID_TEXT, NGUID_TEXT, 8);
        let id = NamespaceId {
            nguid: Some(NGUID.to_owned()),
            uuid: normalize_id(UUID),
        };
        assert_eq!(find_namespace(&host, &id).unwrap().unwrap().disk, "nvme1n1");
    }

    #[test]
    fn finds_by_uuid_and_refuses_disagreeing_identifiers() {
        let host = FakeHost::new();
        host.add_disk("nvme1n1", "259:1", NGUID_TEXT, UUID, 8);
        let by_uuid = NamespaceId {
            nguid: None,
            uuid: normalize_id(UUID),
        };
        assert_eq!(
            find_namespace(&host, &by_uuid).unwrap().unwrap().disk,
            "nvme1n1"
        );
        let wrong_nguid = NamespaceId {
            nguid: Some("ffffffffffffffffffffffffffffffff".to_owned()),
            uuid: normalize_id(UUID),
        };
        assert_eq!(find_namespace(&host, &wrong_nguid).unwrap(), None);
    }

    #[test]
    fn hidden_path_disks_are_skipped_and_duplicates_refused() {
        let host = FakeHost::new();
        host.add_disk("nvme0c0n1", "259:9", NGUID_TEXT, UUID, 8);
        let id = NamespaceId {
            nguid: Some(NGUID.to_owned()),
            uuid: None,
        };
        assert_eq!(find_namespace(&host, &id).unwrap(), None);
        host.add_disk("nvme0n1", "259:1", NGUID_TEXT, UUID, 8);
        assert_eq!(find_namespace(&host, &id).unwrap().unwrap().disk, "nvme0n1");
        host.add_disk("nvme5n1", "259:5", NGUID_TEXT, UUID, 8);
        assert!(find_namespace(&host, &id).is_err());
    }

    #[test]
    fn lists_controllers_with_their_attributes() {
        let host = FakeHost::new();
        host.add_controller(
            "nvme2",
            "tcp",
            "traddr=10.0.0.2,trsvcid=4420",
            "nqn.a",
            "nqn.h",
            "live",
        );
        host.add_controller("nvme0", "pcie", "0000:00:04.0", "nqn.local", "", "live");
        let all = controllers(&host).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].name, "nvme2");
        assert_eq!(all[1].traddr, "10.0.0.2");
        assert_eq!(all[1].trsvcid, "4420");
        assert_eq!(all[1].hostnqn, "nqn.h");
        assert_eq!(
            controller_state(&host, "nvme2").unwrap().as_deref(),
            Some("live")
        );
        assert_eq!(controller_state(&host, "nvme9").unwrap(), None);
    }
}
