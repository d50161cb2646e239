//! The daemon ends, non-zero, when the pool cannot open or its opening panics.

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
