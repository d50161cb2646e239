//! Log pages other than discovery: the identifiers served, SMART / Health Information (from the
//! pool's capacity, the volume's counters and the controller's error count), and the windowing
//! every Get Log Page applies (offset and length in bytes; reads past the end return zeros, as
//! Linux `nvmet_copy_to_sgl` of a zeroed buffer does). Error Information is each controller's
//! record of its failed commands, newest first: its ring and entry encoding are in
//! [`super::errors`].

use edgevol_core::Capacity;

/// Error Information.
pub const ERROR: u8 = 0x01;
/// SMART / Health Information.
pub const SMART: u8 = 0x02;
/// Changed Namespace List.
pub const CHANGED_NS: u8 = 0x04;
/// Size of the SMART log.
pub const SMART_LEN: usize = 512;
/// Available spare threshold reported (percent).
pub const SPARE_THRESHOLD: u8 = 10;

/// `len` bytes of `page` from `offset`, zero-padded.
pub fn window(page: &[u8], offset: u64, len: u32) -> Vec<u8> {
    let mut out = vec![0u8; usize::try_from(len).unwrap_or(0)];
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    if let Some(src) = page.get(start..) {
        let n = src.len().min(out.len());
        out[..n].copy_from_slice(&src[..n]);
    }
    out
}

/// A volume's traffic since start.
#[derive(Debug, Clone, Copy, Default)]
pub struct Traffic {
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Read commands.
    pub reads: u64,
    /// Write commands.
    pub writes: u64,
}

fn percent(part: u64, whole: u64) -> u8 {
    if whole == 0 {
        return 0;
    }
    u8::try_from((u128::from(part) * 100 / u128::from(whole)).min(100)).unwrap_or(100)
}

/// The SMART log. For a thin pool the scarce resource is free clusters, so Available Spare is the
/// pool's free share and Percentage Used its used share; Critical Warning bit 0 says the free
/// share fell below the threshold. Data units are thousands of 512-byte units, rounded up.
/// `error_entries` is the controller's Error Information count.
pub fn smart(capacity: &Capacity, t: &Traffic, error_entries: u64) -> Vec<u8> {
    let mut b = vec![0u8; SMART_LEN];
    let spare = percent(capacity.free, capacity.total);
    b[0] = u8::from(spare < SPARE_THRESHOLD);
    b[3] = spare;
    b[4] = SPARE_THRESHOLD;
    b[5] = percent(capacity.used, capacity.total);
    let units = |bytes: u64| u128::from(bytes.div_ceil(512).div_ceil(1000));
    b[32..48].copy_from_slice(&units(t.bytes_read).to_le_bytes());
    b[48..64].copy_from_slice(&units(t.bytes_written).to_le_bytes());
    b[64..80].copy_from_slice(&u128::from(t.reads).to_le_bytes());
    b[80..96].copy_from_slice(&u128::from(t.writes).to_le_bytes());
    b[176..192].copy_from_slice(&u128::from(error_entries).to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_smart() {
        assert_eq!(window(&[1, 2, 3, 4], 2, 4), vec![3, 4, 0, 0]);
        assert_eq!(window(&[1, 2], 8, 2), vec![0, 0]);
        let cap = Capacity {
            total: 100,
            free: 5,
            used: 95,
            reserved: 0,
            pending_free: 0,
        };
        let b = smart(
            &cap,
            &Traffic {
                bytes_read: 512_001,
                ..Traffic::default()
            },
            3,
        );
        assert_eq!((b[0], b[3], b[5]), (1, 5, 95));
        assert_eq!(b[32], 2);
        assert_eq!(&b[176..192], &3u128.to_le_bytes());
    }
}
