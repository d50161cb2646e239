//! Golden bytes of the host-key file, format version 1: `appliance/tests/golden/host-keys-v1`,
//! written by [`known_table`] below (enrolments, a second certificate, a rotation pending, an
//! authentication, a revocation). Every later build must decode the committed file to the very
//! table spelled out in [`the_golden_file_decodes_to_the_known_table`], so the keys an appliance
//! holds survive every update; while version 1 is what [`encode`] writes, it must also write
//! those bytes exactly.
//!
//! On a deliberate format change: bump `VERSION` in `file.rs` (the frame, pinned in
//! [`the_frame_is_as_documented`], stays), keep this file and its test (this build must still
//! read version 1, or refuse it in words), and add a golden file of the new version beside it.
//! To rewrite this one (only while version 1 is what `encode` writes):
//! `EDGEVOL_REGENERATE_GOLDEN=1 cargo test -p edgevol-appliance --lib hostkeys::file::golden::this_build`,
//! then the tests again without the variable.

use std::path::{Path, PathBuf};

use super::{decode, encode, StoreFile, VERSION};
use crate::hostkeys::table::tests::{counter, known};
use crate::hostkeys::table::{KeyPair, RevokedCert, Table};

const NQN_A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001";
const NQN_B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-0000-0000-000000000002";
const NQN_C: &str = "nqn.2014-08.org.nvmexpress:uuid:cccccccc-0000-0000-0000-000000000003";
const T0: u64 = 1_700_000_000;

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/host-keys-v1")
}

/// The table of the golden file, made by the table's own operations; secrets `known(1)`,
/// `known(2)`, ... in the order they are made.
fn known_table() -> Table {
    let mut t = Table::default();
    let mut secret = counter();
    t.enrol("node-a", [0xa1; 32], NQN_A, T0, &mut secret)
        .unwrap();
    t.enrol("node-b", [0xb1; 32], NQN_B, T0 + 100, &mut secret)
        .unwrap();
    t.enrol("node-a", [0xa2; 32], NQN_A, T0 + 150, &mut secret)
        .unwrap();
    t.rotate("node-a", T0 + 200, &mut secret).unwrap();
    t.confirm(NQN_B, 2, T0 + 300);
    t.enrol("node-c", [0xc1; 32], NQN_C, T0 + 350, &mut secret)
        .unwrap();
    t.revoke("node-c", T0 + 400).unwrap();
    t
}

fn assert_pair(pair: &KeyPair, generation: u64, created: u64, host: u8, ctrl: u8) {
    assert_eq!((pair.generation, pair.created), (generation, created));
    assert!(
        pair.host.ct_eq(&known(host)),
        "generation {generation}: host secret"
    );
    assert!(
        pair.ctrl.ct_eq(&known(ctrl)),
        "generation {generation}: controller secret"
    );
}

#[test]
fn this_build_writes_the_golden_file_byte_for_byte() {
    let bytes = encode(&known_table());
    if std::env::var_os("EDGEVOL_REGENERATE_GOLDEN").is_some() {
        std::fs::create_dir_all(golden().parent().unwrap()).unwrap();
        std::fs::write(golden(), &bytes).unwrap();
    }
    assert!(
        *bytes == std::fs::read(golden()).unwrap(),
        "format version {VERSION} changed without a version bump"
    );
}

#[test]
fn the_golden_file_decodes_to_the_known_table() {
    let t = decode(&std::fs::read(golden()).unwrap()).unwrap();
    assert_eq!(t.next_generation, 5);
    let names: Vec<&str> = t.nodes().map(|(name, _)| name).collect();
    assert_eq!(names, ["node-a", "node-b"]);

    let a = t.node("node-a").unwrap();
    assert_eq!((a.host_nqn.as_str(), a.enrolled), (NQN_A, T0));
    assert_pair(&a.current, 1, T0, 1, 2);
    assert_pair(a.pending.as_ref().unwrap(), 3, T0 + 200, 5, 6);
    assert_eq!(a.certificates, [[0xa1; 32], [0xa2; 32]]);
    assert_eq!(a.last_authenticated, None);

    let b = t.node("node-b").unwrap();
    assert_eq!((b.host_nqn.as_str(), b.enrolled), (NQN_B, T0 + 100));
    assert_pair(&b.current, 2, T0 + 100, 3, 4);
    assert!(b.pending.is_none());
    assert_eq!(b.certificates, [[0xb1; 32]]);
    assert_eq!(b.last_authenticated, Some(T0 + 300));

    assert_eq!(
        t.revoked(),
        [RevokedCert {
            node: "node-c".into(),
            sha256: [0xc1; 32],
            revoked: T0 + 400,
        }]
    );
}

/// The frame every version shares, as literal bytes: magic, version 1, the payload length, and
/// the SHA-256 of everything before it at the end.
#[test]
fn the_frame_is_as_documented() {
    let bytes = std::fs::read(golden()).unwrap();
    assert_eq!(&bytes[..12], b"EVHKEYS\n\x01\0\0\0");
    let len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    assert_eq!(bytes.len(), 16 + len + 32);
    let (body, sum) = bytes.split_at(16 + len);
    assert_eq!(
        ring::digest::digest(&ring::digest::SHA256, body).as_ref(),
        sum
    );
}

/// As the daemon opens it: the committed file in a data directory loads, whole.
#[test]
fn the_golden_file_loads_from_a_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = StoreFile::in_dir(dir.path());
    std::fs::copy(golden(), file.path()).unwrap();
    let t = file.load().unwrap();
    assert_eq!(t.keys_for(NQN_A).len(), 2, "current and pending");
    assert!(t.keys_for(NQN_C).is_empty(), "revoked");
}
