//! NVMe names of a volume: its subsystem NQN and its namespace's NGUID and UUID.
//!
//! All three are derived, never stored: from the appliance id, the pool's UUID and the volume's
//! id, which are stable for the pool's life (core never reuses an id). So they survive restarts,
//! and two volumes (of this pool or of another box's) never share one.

use edgevol_core::VolumeId;

/// Our NQN namespace (`nqn.<yyyy-mm>.<reversed domain>`).
pub const NQN_PREFIX: &str = "nqn.2024-11.io.edgevol";

/// The well-known NQN of discovery controllers.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// `nqn.2024-11.io.edgevol:<appliance>:v<id>`.
pub fn subsystem_nqn(appliance: &str, volume: VolumeId) -> String {
    format!("{NQN_PREFIX}:{appliance}:v{}", volume.0)
}

/// The volume a subsystem NQN of this appliance names.
pub fn parse_subsystem_nqn(appliance: &str, nqn: &str) -> Option<VolumeId> {
    let digits = nqn
        .strip_prefix(NQN_PREFIX)?
        .strip_prefix(':')?
        .strip_prefix(appliance)?
        .strip_prefix(":v")?;
    if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(VolumeId)
}

/// Whether `s` looks like a host NVMe qualified name (`nqn.` prefix, at most 223 bytes,
/// printable): what a CSI node id and an enrolled host NQN must be.
pub fn is_host_nqn(s: &str) -> bool {
    s.starts_with("nqn.")
        && s.len() <= edgevol_core::limits::MAX_NQN_LEN
        && s.bytes().all(|b| b.is_ascii_graphic())
}

/// Namespace Globally Unique Identifier: 8 bytes of the pool UUID, then the volume id (BE).
pub fn nguid(pool_uuid: [u8; 16], volume: VolumeId) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&pool_uuid[..8]);
    id[8..].copy_from_slice(&volume.0.to_be_bytes());
    id
}

/// Namespace UUID: the other 8 bytes of the pool UUID and the volume id, shaped as an RFC 9562
/// version 8 (custom) UUID.
pub fn namespace_uuid(pool_uuid: [u8; 16], volume: VolumeId) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&pool_uuid[8..]);
    id[8..].copy_from_slice(&volume.0.to_be_bytes());
    id[6] = (id[6] & 0x0f) | 0x80; // version 8
    id[8] = (id[8] & 0x3f) | 0x80; // RFC 9562 variant
    id
}

/// Lower-case hex, as Linux shows an NGUID in sysfs (without separators).
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(&mut out, bytes);
    out
}

/// Appends `bytes` as lower-case hex: one allocation per name, not one per byte (publish
/// contexts carry two of these names per call).
fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
}

/// `8-4-4-4-12` lower-case UUID text.
pub fn uuid_string(id: [u8; 16]) -> String {
    let mut out = String::with_capacity(36);
    for (i, group) in [&id[..4], &id[4..6], &id[6..8], &id[8..10], &id[10..]]
        .into_iter()
        .enumerate()
    {
        if i > 0 {
            out.push('-');
        }
        push_hex(&mut out, group);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_unique_and_parse_back() {
        let pool = *b"0123456789abcdef";
        let nqn = subsystem_nqn("box-7", VolumeId(42));
        assert_eq!(nqn, "nqn.2024-11.io.edgevol:box-7:v42");
        assert!(nqn.len() <= 223);
        assert_eq!(parse_subsystem_nqn("box-7", &nqn), Some(VolumeId(42)));
        assert_eq!(parse_subsystem_nqn("box-8", &nqn), None);
        assert_eq!(parse_subsystem_nqn("box-7", DISCOVERY_NQN), None);
        assert_eq!(
            parse_subsystem_nqn("box-7", "nqn.2024-11.io.edgevol:box-7:v042"),
            None
        );
        assert_ne!(nguid(pool, VolumeId(1)), nguid(pool, VolumeId(2)));
        assert_eq!(nguid(pool, VolumeId(1)), nguid(pool, VolumeId(1)));
        let u = uuid_string(namespace_uuid(pool, VolumeId(1)));
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "8", "version 8: {u}");
        assert_eq!(hex(&nguid(pool, VolumeId(1))).len(), 32);
    }

    #[test]
    fn hex_and_uuid_text_are_lower_case_and_grouped() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
        assert_eq!(hex(&[]), "");
        let id = [
            0x6f, 0x1c, 0x2d, 0x3e, 0x4b, 0x5a, 0x69, 0x78, 0x8a, 0x9b, 0x0c, 0x1d, 0x2e, 0x3f,
            0x4a, 0x5b,
        ];
        assert_eq!(uuid_string(id), "6f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b");
    }
}
