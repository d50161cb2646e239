//! Golden bytes of the firmware state record, format 1: `tests/golden/firmware-state.0` and
//! `.1`, the two copies of a boot partition after a rolled-back update (written by
//! [`known_states`] below). Every later build must decode each copy to the very state spelled
//! out here and open the pair to the newest, so the slot state written by any released firmware
//! keeps opening after an update. A record of a newer format is refused in words and left as
//! found.
//!
//! On a deliberate format change: bump `FORMAT` in `src/record.rs` (the frame, and so the bytes
//! pinned in [`the_frame_is_as_documented`], stays), keep these files (this build must still read
//! them, or refuse them in words), and add golden copies of the new format beside them. To
//! rewrite these two (only while format 1 is still what `encode` writes):
//! `EDGEVOL_REGENERATE_GOLDEN=1 cargo test -p edgevol-firmware --test golden_record
//! this_build_writes`, then the whole file without the variable.

use std::fs;
use std::path::{Path, PathBuf};

use edgevol_firmware::boot_dir::BootDir;
use edgevol_firmware::dir_media::DirMedia;
use edgevol_firmware::key::SigningKey;
use edgevol_firmware::manager::{Firmware, FirmwareError, Identity};
use edgevol_firmware::record::{decode, encode, Store, StoreError, RECORD_LEN};
use edgevol_firmware::slots::{Reason, Rollback, Slot, SlotId, Slots, Status};

fn golden(copy: usize) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/firmware-state.{copy}"))
}

/// The two copies' sequence numbers and states, spelled out: copy 0 (sequence 7) is a trial
/// that booted after a daemon exit had failed the previous update; copy 1 (sequence 8, the
/// newest) is that trial failed by the health check.
fn known_states() -> [(u64, Slots); 2] {
    let good = |boots| Slot {
        status: Status::Good,
        version: "1.4.0".into(),
        boots,
    };
    [
        (
            7,
            Slots {
                primary: SlotId::A,
                slots: [
                    good(11),
                    Slot {
                        status: Status::TryOnce { booted: true },
                        version: "1.5.0".into(),
                        boots: 1,
                    },
                ],
                last_rollback: Some(Rollback {
                    slot: SlotId::B,
                    version: "1.3.9".into(),
                    reason: Reason::DaemonExited(Some(78)),
                }),
            },
        ),
        (
            8,
            Slots {
                primary: SlotId::A,
                slots: [
                    good(12),
                    Slot {
                        status: Status::Bad,
                        version: "1.5.0".into(),
                        boots: 1,
                    },
                ],
                last_rollback: Some(Rollback {
                    slot: SlotId::B,
                    version: "1.5.0".into(),
                    reason: Reason::HealthCheckFailed("pool not open after 60 s".into()),
                }),
            },
        ),
    ]
}

/// A boot partition directory holding the golden copies.
fn boot_partition() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for copy in 0..2 {
        fs::copy(golden(copy), DirMedia::new(dir.path()).path(copy)).unwrap();
    }
    dir
}

#[test]
fn this_build_writes_the_golden_records_byte_for_byte() {
    for (copy, (seq, state)) in known_states().iter().enumerate() {
        let bytes = encode(*seq, state).unwrap();
        if std::env::var_os("EDGEVOL_REGENERATE_GOLDEN").is_some() {
            fs::create_dir_all(golden(copy).parent().unwrap()).unwrap();
            fs::write(golden(copy), &bytes).unwrap();
        }
        assert_eq!(
            bytes,
            fs::read(golden(copy)).unwrap(),
            "copy {copy}: format 1 changed without a FORMAT bump"
        );
    }
}

#[test]
fn every_golden_copy_decodes_to_its_known_state() {
    for (copy, known) in known_states().into_iter().enumerate() {
        let bytes = fs::read(golden(copy)).unwrap();
        assert_eq!(bytes.len(), RECORD_LEN);
        assert_eq!(decode(&bytes), Some(known), "copy {copy}");
    }
}

/// The frame every format shares, as literal bytes of copy 1: magic, format 1, sequence 8,
/// payload length, and the zeros after the CRC.
#[test]
fn the_frame_is_as_documented() {
    let bytes = fs::read(golden(1)).unwrap();
    assert_eq!(&bytes[..13], b"EVSL\x01\x08\0\0\0\0\0\0\0");
    let payload_len = usize::from(u16::from_le_bytes([bytes[13], bytes[14]]));
    // primary, two slots of (status, boots u32, version), the rollback (tag, slot, version,
    // reason tag, reason text).
    assert_eq!(
        payload_len,
        1 + 2 * (1 + 4 + 1 + 5) + 1 + 1 + 1 + 5 + 1 + 1 + 24
    );
    assert_eq!(&bytes[15..17], &[0, 4], "primary A; slot A good");
    let crc_at = 15 + payload_len;
    let crc = u32::from_le_bytes(bytes[crc_at..crc_at + 4].try_into().unwrap());
    assert_eq!(crc, crc32c::crc32c(&bytes[..crc_at]));
    assert!(bytes[crc_at + 4..].iter().all(|&b| b == 0));
}

#[test]
fn the_golden_boot_partition_opens_to_the_newest_state_and_saves_over_the_older_copy() {
    let dir = boot_partition();
    let [_, (_, newest)] = known_states();
    let (mut store, state) = Store::open(DirMedia::new(dir.path())).unwrap();
    assert_eq!(state.as_ref(), Some(&newest));
    let mut next = newest.clone();
    next.slots[0].boots += 1;
    store.save(&next).unwrap();
    let media = DirMedia::new(dir.path());
    assert_eq!(decode(&fs::read(media.path(0)).unwrap()), Some((9, next)));
    assert_eq!(
        fs::read(media.path(1)).unwrap(),
        fs::read(golden(1)).unwrap()
    );
}

/// `record` in format `format`, its frame whole: what newer firmware would write.
fn reframed(record: &[u8], format: u8) -> Vec<u8> {
    let mut out = record.to_vec();
    out[4] = format;
    let crc_at = 15 + usize::from(u16::from_le_bytes([out[13], out[14]]));
    let crc = crc32c::crc32c(&out[..crc_at]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Every file of `dir` and its bytes.
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let bytes = fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    out.sort();
    out
}

/// Newer firmware saved its state in format 2 over the older copy: this firmware's store, and
/// the manager the daemon and `edgevol firmware fail-trial` start with, refuse it in words and
/// the boot partition is left as found.
#[test]
fn a_newer_format_on_the_boot_partition_is_refused_in_words_and_left_alone() {
    let dir = boot_partition();
    let media = DirMedia::new(dir.path());
    let newer = reframed(&fs::read(golden(0)).unwrap(), 2);
    fs::write(media.path(0), newer).unwrap();
    let before = contents(dir.path());
    let words = "firmware state record copy 0 has format 2, newer than this firmware reads (1): \
                 boot the slot that wrote it, or update; nothing was written over it";

    let e = Store::open(media.clone()).unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::TooNew {
                copy: 0,
                found: 2,
                supported: 1
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.to_string(), words);

    let e = Firmware::start(
        media,
        BootDir::new(dir.path()),
        Identity {
            key: SigningKey::generate().unwrap().0.verifying_key(),
            arch: "x86_64".into(),
            running: SlotId::A,
            version: "1.4.0".into(),
        },
    )
    .unwrap_err();
    // Its own variant: the daemon maps it to its own exit status, not "try again".
    assert!(matches!(e, FirmwareError::StoreTooNew(_)), "{e:?}");
    assert_eq!(e.to_string(), words);
    assert_eq!(contents(dir.path()), before, "nothing written");
}
