//! A failing pool drive under live I/O (hal's fault device behind the pool and its data path):
//! commands that touch bad blocks fail with NVMe media errors, the volume turns abnormal and the
//! errors are counted in metrics, while another volume on the same drive keeps being served.
#![allow(clippy::cast_possible_truncation)] // test sizes are small constants

use crate::nvme_host;

use std::sync::{Arc, Mutex};

use edgevol_appliance::config::{HostAuthPolicy, NvmeConfig};
use edgevol_appliance::csi::controller::ControllerService;
use edgevol_appliance::csi::ids::Ids;
use edgevol_appliance::hostkeys::HostKeys;
use edgevol_appliance::naming;
use edgevol_appliance::nvme::auth::HostAuth;
use edgevol_appliance::pool::PoolDevice;
use edgevol_appliance::state::State;
use edgevol_core::{BlockDevice, Pool, ReadSegment, VolumeId, VolumeSpec};
use edgevol_hal::{FaultConfig, FaultDevice};
use edgevol_proto::csi::v1::controller_server::Controller;
use edgevol_proto::csi::v1::ControllerGetVolumeRequest;
use nvme_host::{admin_and_queue, io, ok, status};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const MIB: u64 = 1 << 20;

/// The device block holding byte 0 of `volume`.
fn first_block(pool: &mut Pool<PoolDevice>, volume: VolumeId) -> u64 {
    let bs = u64::from(pool.device_mut().block_size());
    match pool.map_read(volume, 0, 4096).unwrap().next().unwrap() {
        ReadSegment::Data { device_offset, .. } => device_offset / bs,
        ReadSegment::Zero { .. } => panic!("volume {volume:?} holds no data at 0"),
    }
}

async fn condition(ctl: &ControllerService, state: &State, id: VolumeId) -> (bool, String) {
    let r = ctl
        .controller_get_volume(tonic::Request::new(ControllerGetVolumeRequest {
            volume_id: Ids::new(&state.appliance_id).volume(id),
        }))
        .await
        .unwrap()
        .into_inner();
    let c = r.status.unwrap().volume_condition.unwrap();
    (c.abnormal, c.message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_errors_fail_their_commands_and_mark_only_that_volume() {
    let dir = tempfile::tempdir().unwrap();
    // A dev pool file, reopened behind the fault device.
    let pool = edgevol_appliance::pool::open(&[dir.path().join("pool.img")], true).unwrap();
    let PoolDevice::File(file) = pool.into_device() else {
        panic!("a dev pool is a file");
    };
    let faults = Arc::new(Mutex::new(FaultDevice::new(file, FaultConfig::default())));
    let mut pool = Pool::open(PoolDevice::Faulty(faults.clone())).unwrap();
    let (a, b) = (
        pool.create_volume(VolumeSpec::new("a", 4 * MIB)).unwrap(),
        pool.create_volume(VolumeSpec::new("b", 4 * MIB)).unwrap(),
    );
    pool.publish(a, HOST, false).unwrap();
    pool.publish(b, HOST, false).unwrap();

    let state = Arc::new(State::new("test-box".into(), Default::default()));
    state.set_pool(pool);
    let target = edgevol_appliance::nvme::start(
        state.clone(),
        &NvmeConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            advertise: "127.0.0.1".parse().unwrap(),
            io_threads: 0,
            io_cpus: Vec::new(),
            busy_poll: std::time::Duration::from_micros(
                edgevol_appliance::config::DEFAULT_BUSY_POLL_US,
            ),
        },
        HostAuth::new(
            Arc::new(HostKeys::open(dir.path()).unwrap()),
            HostAuthPolicy {
                allow_unauthenticated_hosts: true,
                ..HostAuthPolicy::default()
            },
        ),
    )
    .await
    .unwrap();
    let addr = target.endpoint;
    let (nqn_a, nqn_b) = (
        naming::subsystem_nqn("test-box", a),
        naming::subsystem_nqn("test-box", b),
    );
    let (_admin_a, mut qa) = admin_and_queue(addr, &nqn_a, HOST).await;
    let (_admin_b, mut qb) = admin_and_queue(addr, &nqn_b, HOST).await;
    let data = vec![0xa5u8; 8192];
    for q in [&mut qa, &mut qb] {
        let (sqe, d) = io::write(0, &data, false);
        ok(&q.cmd(sqe, d).await);
    }

    // Volume a's first block goes bad for reads and writes.
    let bad = {
        let mut pool = state.pool().unwrap().lock().unwrap();
        first_block(&mut pool, a)
    };
    {
        let mut f = faults.lock().unwrap();
        f.config_mut().read_errors.insert(bad);
        f.config_mut().write_errors.insert(bad);
    }
    let (sqe, d) = io::read(0, 2);
    assert_eq!(
        status(&qa.cmd(sqe, d).await),
        (2, 0x81, false),
        "Unrecovered Read Error"
    );
    let (sqe, d) = io::write(0, &data[..4096], false);
    assert_eq!(
        status(&qa.cmd(sqe, d).await),
        (2, 0x80, false),
        "Write Fault"
    );
    // The rest of a, and all of b, keep being served.
    let (sqe, d) = io::read(1, 1);
    let c = qa.cmd(sqe, d).await;
    ok(&c);
    assert_eq!(c.data, data[4096..]);
    let (sqe, d) = io::read(0, 2);
    let c = qb.cmd(sqe, d).await;
    ok(&c);
    assert_eq!(c.data, data);
    let (sqe, d) = io::write(0, &data[..4096], true);
    ok(&qb.cmd(sqe, d).await);

    // Condition: a abnormal with the count, b healthy.
    let ctl = ControllerService::new(state.clone(), Some(target.info()));
    let (abnormal, message) = condition(&ctl, &state, a).await;
    assert!(abnormal, "{message}");
    assert!(message.contains("2 I/O command(s) failed"), "{message}");
    assert!(
        message.contains("a write"),
        "latest is the write: {message}"
    );
    assert_eq!(
        condition(&ctl, &state, b).await,
        (false, "pool healthy".into())
    );

    // Metrics: counted for a only, also in the per-op error counters.
    let text = edgevol_appliance::metrics::gather(&edgevol_appliance::metrics::Sources {
        state: state.clone(),
        subsystems: Some(target.subsystems.clone()),
        devices: Vec::new(),
        registry: Default::default(),
    })
    .await;
    let ids = Ids::new(&state.appliance_id);
    let (ida, idb) = (ids.volume(a), ids.volume(b));
    for (line, want) in [
        (
            format!("edgevol_volume_media_errors_total{{volume_id=\"{ida}\"}}"),
            2,
        ),
        (
            format!("edgevol_volume_media_errors_total{{volume_id=\"{idb}\"}}"),
            0,
        ),
        (
            format!("edgevol_volume_io_errors_total{{volume_id=\"{ida}\",op=\"read\"}}"),
            1,
        ),
        (
            format!("edgevol_volume_io_errors_total{{volume_id=\"{ida}\",op=\"write\"}}"),
            1,
        ),
    ] {
        let got = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{line} ")))
            .unwrap_or_else(|| panic!("{line} missing from:\n{text}"));
        assert_eq!(got, want.to_string(), "{line}");
    }
    target.stop().await;
}
