//! The discovery log page (Linux `discovery.c`, `struct nvmf_disc_rsp_page_hdr` and
//! `struct nvmf_disc_rsp_page_entry`): one entry per subsystem the connecting host is published
//! to, nothing else; the generation counter changes whenever that list (or access) changes.

use std::net::SocketAddr;

use edgevol_core::{crc32c, VolumeId};

use crate::naming::subsystem_nqn;

/// Discovery log page identifier.
pub const LID: u8 = 0x70;
/// Size of the header and of each entry.
pub const ENTRY_LEN: usize = 1024;

const TRTYPE_TCP: u8 = 3;
const ADRFAM_IPV4: u8 = 1;
const ADRFAM_IPV6: u8 = 2;
const SUBTYPE_NVME: u8 = 2;
/// TREQ: secure channel not required.
const TREQ_NOT_REQUIRED: u8 = 2;

fn put(buf: &mut [u8], at: usize, bytes: &[u8], max: usize) {
    let n = bytes.len().min(max);
    if let Some(dst) = buf.get_mut(at..at + n) {
        dst.copy_from_slice(&bytes[..n]);
    }
}

/// The generation counter of a host's log: the revoke count in the high half, a fingerprint of
/// the listed subsystems in the low half. Stable while nothing changes, different after any
/// publish, unpublish or revoke.
pub fn generation(changes: u64, subsystems: &[String]) -> u64 {
    let mut crc = 0u32;
    for nqn in subsystems {
        crc = edgevol_core::crc32c_append(crc, nqn.as_bytes());
        crc = edgevol_core::crc32c_append(crc, &[0]);
    }
    let fingerprint = if subsystems.is_empty() {
        crc32c(b"empty")
    } else {
        crc
    };
    (changes << 32) | u64::from(fingerprint)
}

/// The NQNs of `volumes` on appliance `appliance`.
pub fn subsystems(appliance: &str, volumes: &[VolumeId]) -> Vec<String> {
    volumes
        .iter()
        .map(|&v| subsystem_nqn(appliance, v))
        .collect()
}

/// The whole log page for `subsystems` reached at `endpoint`.
pub fn log_page(endpoint: SocketAddr, genctr: u64, subsystems: &[String]) -> Vec<u8> {
    let mut page = vec![0u8; ENTRY_LEN * (1 + subsystems.len())];
    put(&mut page, 0, &genctr.to_le_bytes(), 8);
    let numrec = u64::try_from(subsystems.len()).unwrap_or(u64::MAX);
    put(&mut page, 8, &numrec.to_le_bytes(), 8);
    let adrfam = if endpoint.is_ipv4() {
        ADRFAM_IPV4
    } else {
        ADRFAM_IPV6
    };
    let port = endpoint.port().to_string();
    let addr = endpoint.ip().to_string();
    for (i, nqn) in subsystems.iter().enumerate() {
        let at = ENTRY_LEN * (i + 1);
        let Some(e) = page.get_mut(at..at + ENTRY_LEN) else {
            break;
        };
        e[0] = TRTYPE_TCP;
        e[1] = adrfam;
        e[2] = SUBTYPE_NVME;
        e[3] = TREQ_NOT_REQUIRED;
        // PORTID 1, CNTLID FFFFh (dynamic), ASQSZ 32.
        put(e, 4, &1u16.to_le_bytes(), 2);
        put(e, 6, &0xffffu16.to_le_bytes(), 2);
        put(e, 8, &32u16.to_le_bytes(), 2);
        put(e, 32, port.as_bytes(), 32);
        put(e, 256, nqn.as_bytes(), 256);
        put(e, 512, addr.as_bytes(), 256);
        // TSAS: TCP security type 0 (none).
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_at_linux_offsets() {
        let subs = subsystems("box", &[VolumeId(3)]);
        let page = log_page("10.0.2.2:4420".parse().unwrap(), 9, &subs);
        assert_eq!(page.len(), 2048);
        assert_eq!(&page[0..8], &9u64.to_le_bytes());
        assert_eq!(&page[8..16], &1u64.to_le_bytes());
        let e = &page[1024..];
        assert_eq!(&e[0..3], &[3, 1, 2]);
        assert_eq!(&e[32..36], b"4420");
        assert_eq!(&e[256..256 + subs[0].len()], subs[0].as_bytes());
        assert_eq!(&e[512..520], b"10.0.2.2");
    }

    #[test]
    fn generation_tracks_the_list() {
        let a = subsystems("box", &[VolumeId(1)]);
        let b = subsystems("box", &[VolumeId(1), VolumeId(2)]);
        assert_eq!(generation(0, &a), generation(0, &a));
        assert_ne!(generation(0, &a), generation(0, &b));
        assert_ne!(generation(0, &a), generation(1, &a));
        assert_ne!(generation(0, &[]), generation(0, &a));
    }
}
