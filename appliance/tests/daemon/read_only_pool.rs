//! A pool with a read-only-compatible feature this build lacks, as a real dev daemon serves it:
//! it opens read-only, CSI changes are FAILED_PRECONDITION in words, NVMe reads and flushes work
//! and every writing command is Namespace Is Write Protected (generic 20h, DNR).

use crate::common;
use crate::nvme_host;

use std::os::unix::fs::FileExt;
use std::path::Path;

use edgevol_appliance::naming;
use edgevol_appliance::start;
use edgevol_core::VolumeSpec;
use edgevol_nvmeof::pdu::Digests;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use nvme_host::{io, ok, status, Admin};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";

/// Gives the dev pool file's superblocks (4 KiB blocks) format version 4 with read-only-
/// compatible feature bit 5, which no build knows: core's `superblock.rs` layout, spelled out.
fn add_unknown_read_only_feature(path: &Path) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut head = vec![0u8; 8192];
    file.read_exact_at(&mut head, 0).unwrap();
    for copy in 0..2 {
        let sb = &mut head[copy * 4096..copy * 4096 + 100];
        sb[8..12].copy_from_slice(&4u32.to_le_bytes());
        let crc = edgevol_core::crc32c(&sb[..68]);
        sb[68..72].copy_from_slice(&crc.to_le_bytes());
        sb[72..80].fill(0);
        sb[80..88].copy_from_slice(&(1u64 << 5).to_le_bytes());
        sb[88..96].fill(0);
        let crc = edgevol_core::crc32c(&sb[..96]);
        sb[96..100].copy_from_slice(&crc.to_le_bytes());
    }
    file.write_all_at(&head, 0).unwrap();
    file.sync_all().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_pool_serves_reads_and_refuses_changes_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let config = || common::dev_config(dir.path(), "127.0.0.1:0".parse().unwrap());
    // Written by "other firmware": a volume published to HOST, with data.
    let running = start(config()).await.unwrap();
    common::pool_ready(&running.state).await;
    let id = running
        .state
        .on_pool(|_, pool| {
            let id = pool.create_volume(VolumeSpec::new("vol", 1 << 20)).unwrap();
            pool.publish(id, HOST, false).unwrap();
            id
        })
        .await
        .unwrap();
    running.stop().await.unwrap();
    add_unknown_read_only_feature(&dir.path().join("pool.img"));
    let before = metadata_area(&dir.path().join("pool.img"));

    let running = start(config()).await.unwrap();
    common::pool_ready(&running.state).await;
    let feature = edgevol_core::Feature {
        set: edgevol_core::FeatureSet::ReadOnlyCompatible,
        bit: 5,
    };
    let read_only = running
        .state
        .on_pool(|_, pool| pool.read_only())
        .await
        .unwrap();
    assert_eq!(read_only, Some(feature));

    // CSI: FAILED_PRECONDITION, in words.
    let tls = common::tls_for(
        &dir.path().join("pki"),
        &dir.path().join("pki/controller.pem"),
        &dir.path().join("pki/controller.key"),
    );
    let mut csi = ControllerClient::new(common::channel(running.local_addr, tls).await);
    let e = csi
        .create_volume(common::block_volume("new".into()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().starts_with(
            "the pool is read-only: it uses read-only-compatible feature bit 5 (unknown to this firmware), which this firmware (version"
        ),
        "{}",
        e.message()
    );

    // NVMe: reads and flushes work, every writing command is write protected.
    let addr = running.target.endpoint;
    let nqn = naming::subsystem_nqn("test-box", id);
    let admin = Admin::connect(addr, &nqn, HOST, 0).await.unwrap();
    let mut q = admin
        .io_queue(addr, 1, &nqn, HOST, Digests::NONE)
        .await
        .unwrap();
    let (sqe, data) = io::read(0, 1);
    ok(&q.cmd(sqe, data).await);
    for (sqe, data) in [
        io::write(0, &[1u8; 4096], false),
        io::write_zeroes(0, 1),
        io::deallocate(&[(0, 1)]),
    ] {
        let opcode = sqe.opcode();
        assert_eq!(
            status(&q.cmd(sqe, data).await),
            (0, 0x20, true),
            "opcode {opcode:#x}"
        );
    }
    let (sqe, data) = io::flush();
    ok(&q.cmd(sqe, data).await);
    running.stop().await.unwrap();
    assert!(
        metadata_area(&dir.path().join("pool.img")) == before,
        "a read-only mount writes nothing, not even at shutdown"
    );
}

/// The first 64 MiB of the (large, sparse) pool file: superblocks, checkpoints, journal.
fn metadata_area(path: &Path) -> Vec<u8> {
    let mut bytes = vec![0u8; 64 << 20];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut bytes, 0)
        .unwrap();
    bytes
}
