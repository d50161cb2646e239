//! The daemon ends, non-zero, when the pool cannot open or its opening panics, or its host-key
//! store cannot be read.

use std::path::Path;
use std::time::Duration;

use super::{start, DaemonError, PANICS_ON_OPEN};
use crate::config::{Args, Config};

fn config(dir: &Path, device: &Path) -> Config {
    Config::from_args(Args {
        dev: true,
        data_dir: Some(dir.join("data")),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        nvme_listen: Some("127.0.0.1:0".parse().unwrap()),
        metrics_listen: Some(crate::config::MetricsListen::Off),
        appliance_id: Some("panics-box".into()),
        devices: vec![device.to_path_buf()],
        ..Args::default()
    })
    .unwrap()
}

/// How the started daemon ends by itself (it must, well within the bound).
async fn ends(config: Config) -> DaemonError {
    let mut running = start(config).await.expect("starts; the pool opens after");
    let ended = tokio::time::timeout(Duration::from_secs(60), running.wait())
        .await
        .expect("the daemon ends by itself");
    assert!(!running.state.is_ready(), "no pool was opened");
    ended.expect_err("it ends with an error")
}

/// Opening the pool panics: the daemon does not answer "not ready" forever, it stops with the
/// panic, for an exit status of 70.
#[tokio::test]
async fn a_panic_opening_the_pool_ends_the_daemon_with_70() {
    let dir = tempfile::tempdir().unwrap();
    let e = ends(config(dir.path(), &dir.path().join(PANICS_ON_OPEN))).await;
    match &e {
        DaemonError::Panicked { task, message } => {
            assert_eq!(*task, "pool open");
            assert!(
                message.contains("injected panic opening the pool"),
                "{message}"
            );
        }
        other => panic!("want Panicked, got {other:?}"),
    }
    assert_eq!(e.exit_code(), 70);
    assert!(e.to_string().contains("pool open panicked"), "{e}");
}

/// A device that holds something else than a pool: the daemon stops with the pool's error,
/// exit status 1.
#[tokio::test]
async fn a_pool_that_cannot_open_ends_the_daemon_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let device = dir.path().join("not-a-pool.img");
    std::fs::write(&device, vec![0xa5u8; 8 << 20]).unwrap();
    let e = ends(config(dir.path(), &device)).await;
    assert!(matches!(e, DaemonError::Pool(_)), "want Pool, got {e:?}");
    assert_eq!(e.exit_code(), 1);
}

/// A pool written by firmware with a feature this one lacks: the daemon stops with the pool's
/// words and exit status 78 (EX_CONFIG), which image/init reports instead of restarting.
#[tokio::test]
async fn a_pool_this_firmware_cannot_read_ends_the_daemon_with_78() {
    let dir = tempfile::tempdir().unwrap();
    let device = dir.path().join("pool.img");
    drop(crate::pool::open(std::slice::from_ref(&device), true).unwrap());
    let feature = edgevol_core::Feature {
        set: edgevol_core::FeatureSet::Incompatible,
        bit: 5,
    };
    crate::pool::restamp(&device, 4, edgevol_core::Features::NONE.with(feature));
    let e = ends(config(dir.path(), &device)).await;
    assert!(
        matches!(
            e,
            DaemonError::Pool(crate::pool::PoolError::Unsupported { .. })
        ),
        "want Unsupported, got {e:?}"
    );
    assert_eq!(e.exit_code(), 78);
    assert!(
        e.to_string()
            .contains("pool uses incompatible feature bit 5"),
        "{e}"
    );
}

/// A host-key store written by newer firmware (a whole file of format version 2): the daemon
/// does not start, says so in words (never "damaged"), exits with 79, and leaves the file as
/// found; a damaged store still exits with 1.
#[tokio::test]
async fn a_host_key_store_of_a_newer_version_ends_the_start_with_79() {
    use crate::hostkeys::file::{encode, FILE_NAME};
    use crate::hostkeys::table::Table;
    use std::os::unix::fs::DirBuilderExt;

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&data)
        .unwrap();
    let mut newer = encode(&Table::default()).to_vec();
    newer[8..12].copy_from_slice(&2u32.to_le_bytes());
    let at = newer.len() - 32;
    let sum = ring::digest::digest(&ring::digest::SHA256, &newer[..at]);
    newer[at..].copy_from_slice(sum.as_ref());
    let path = data.join(FILE_NAME);
    std::fs::write(&path, &newer).unwrap();

    let e = start(config(dir.path(), &dir.path().join("pool.img")))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            DaemonError::HostKeys(crate::hostkeys::StoreError::TooNew { .. })
        ),
        "{e:?}"
    );
    assert_eq!(e.exit_code(), 79);
    assert_eq!(
        e.to_string(),
        format!(
            "host key store {} has format version 2, newer than this firmware reads (1): boot \
             the slot that wrote it, or update",
            path.display()
        )
    );
    assert_eq!(std::fs::read(&path).unwrap(), newer, "left as found");

    // The same file with its checksum broken is damage: exit status 1.
    newer[at] ^= 1;
    std::fs::write(&path, &newer).unwrap();
    let e = start(config(dir.path(), &dir.path().join("pool.img")))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("is damaged (checksum"), "{e}");
    assert_eq!(e.exit_code(), 1);
}

/// A firmware state record written by newer firmware ends the start like a newer host-key
/// store (79: restarting cannot help); any other state-record failure is 1. That the manager
/// reports such a record as `StoreTooNew` is shown by firmware/tests/golden_record.rs.
#[test]
fn a_firmware_state_record_of_a_newer_format_ends_the_daemon_with_79() {
    use edgevol_firmware::manager::FirmwareError;
    let newer = DaemonError::Firmware(crate::firmware::StartError::Manager(
        FirmwareError::StoreTooNew("firmware state record copy 0 has format 2".into()),
    ));
    assert_eq!(newer.exit_code(), 79);
    let io = DaemonError::Firmware(crate::firmware::StartError::Manager(FirmwareError::Store(
        "disk full".into(),
    )));
    assert_eq!(io.exit_code(), 1);
}
