//! Interop with the Linux kernel initiator (nvme-tcp) in a QEMU TCG guest, which reaches this
//! process's target at 10.0.2.2 through slirp. Ignored by default: `scripts/test-nvme-qemu.sh`
//! runs it (it needs the QEMU harness of `scripts/setup-qemu.sh`).

mod common;

use edgevol_appliance::naming;
use edgevol_core::VolumeSpec;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0e0e0e0e-1111-2222-3333-444444444444";
const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "boots a QEMU guest: scripts/test-nvme-qemu.sh"]
async fn linux_initiator_writes_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::qemu_appliance(dir.path(), "qemu-box").await;
    let state = running.state.clone();
    let port = running.target.endpoint.port();
    let id = state
        .on_pool(|_, pool| {
            let id = pool
                .create_volume(VolumeSpec::new("linux", 64 * MIB))
                .unwrap();
            pool.publish(id, HOST, false).unwrap();
            id
        })
        .await
        .unwrap();
    let nqn = naming::subsystem_nqn("qemu-box", id);
    let refused = "nqn.2014-08.org.nvmexpress:uuid:deadbeef-0000-0000-0000-000000000000";

    // 2 MiB of a known pattern written at 1 MiB, read back after dropping the page cache, then
    // the same bytes are checked here through core.
    let cmd = format!(
        "ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && \
         (echo transport=tcp,traddr=10.0.2.2,trsvcid={port},nqn={nqn},hostnqn={refused} > /dev/nvme-fabrics && echo REFUSED-CONNECTED || echo UNPUBLISHED-REFUSED) && \
         echo transport=tcp,traddr=10.0.2.2,trsvcid={port},nqn={nqn},hostnqn={HOST} > /dev/nvme-fabrics && \
         sleep 2 && ls /dev/nvme* && cat /sys/block/nvme0n1/size && \
         yes EDGEVOL-NVME-TCP | head -c 2097152 > /tmp/a && \
         dd if=/tmp/a of=/dev/nvme0n1 bs=65536 seek=16 conv=fsync && \
         echo 3 > /proc/sys/vm/drop_caches && \
         dd if=/dev/nvme0n1 of=/tmp/b bs=65536 skip=16 count=32 && \
         cmp /tmp/a /tmp/b && echo NVME-TCP-ROUNDTRIP-PASS && \
         echo 1 > /sys/class/nvme/nvme0/delete_controller"
    );
    let log = common::qemu_cache().join("logs/nvme-tcp.log");
    let status = common::guest::GuestRun::new("nvme-tcp", &log, 150, 512)
        .args(["--fail-marker", "REFUSED-CONNECTED"])
        .run(&cmd, "NVME-TCP-ROUNDTRIP-PASS")
        .await;
    assert!(
        status.success(),
        "guest run failed: {status} (see {})",
        log.display()
    );

    let data = common::volume_bytes(&state, id, MIB, 2 * MIB).await;
    let line = b"EDGEVOL-NVME-TCP\n";
    let expected: Vec<u8> = line.iter().copied().cycle().take(data.len()).collect();
    assert!(data == expected, "the guest's bytes are in the volume");
    running.stop().await.unwrap();
}
