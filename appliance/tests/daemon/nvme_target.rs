//! The NVMe/TCP target of a real dev daemon, driven over loopback by the test initiator.
#![allow(clippy::cast_possible_truncation)] // test sizes and seeds are small constants

use crate::common;
use crate::nvme_host;

use std::net::SocketAddr;
use std::time::Duration;

use common::DevAppliance;
use edgevol_appliance::naming::{self, DISCOVERY_NQN};
use edgevol_core::{VolumeId, VolumeSpec};
use edgevol_nvmeof::initiator::Data;
use edgevol_nvmeof::pdu::Digests;
use nvme_host::{io, ok, status, Admin, Ended, Queue, WAIT};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:99999999-2222-3333-4444-555555555555";
const MIB: u64 = 1 << 20;

struct Fixture {
    app: DevAppliance,
    addr: SocketAddr,
}

impl Fixture {
    async fn start() -> Fixture {
        Self::start_with(|_| {}).await
    }

    /// A fixture whose daemon configuration `change` adjusts first.
    async fn start_with(change: impl FnOnce(&mut edgevol_appliance::config::Config)) -> Fixture {
        let app = DevAppliance::start_with(change).await;
        app.ready().await;
        let addr = app.running.target.endpoint;
        Fixture { app, addr }
    }

    async fn volume(&self, name: &str, size: u64, host: &str, readonly: bool) -> VolumeId {
        let (name, host) = (name.to_owned(), host.to_owned());
        self.app
            .running
            .state
            .on_pool(move |_, pool| {
                let mut spec = VolumeSpec::new(name, size);
                spec.access_modes = edgevol_core::AccessModes::EMPTY
                    .with(edgevol_core::AccessMode::MultiNodeMultiWriter);
                let id = pool.create_volume(spec).unwrap();
                pool.publish(id, &host, readonly).unwrap();
                id
            })
            .await
            .unwrap()
    }

    async fn publish(&self, id: VolumeId, host: &str) {
        let host = host.to_owned();
        self.app
            .running
            .state
            .on_pool(move |_, pool| pool.publish(id, &host, false))
            .await
            .unwrap()
            .unwrap();
    }

    async fn used(&self) -> u64 {
        self.app
            .running
            .state
            .on_pool(|_, pool| pool.capacity().used)
            .await
            .unwrap()
    }

    async fn pool_uuid(&self) -> [u8; 16] {
        self.app
            .running
            .state
            .on_pool(|_, pool| pool.uuid())
            .await
            .unwrap()
    }

    /// An admin queue of `HOST` on volume `id` and its I/O queue 1 (the admin queue keeps the
    /// controller).
    async fn connect(&self, id: VolumeId) -> (Admin, Queue) {
        nvme_host::admin_and_queue(self.addr, &self.nqn(id), HOST).await
    }

    fn nqn(&self, id: VolumeId) -> String {
        naming::subsystem_nqn("test-box", id)
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8).wrapping_mul(7))
        .collect()
}

async fn run(q: &mut Queue, (sqe, data): (edgevol_nvmeof::sqe::Sqe, Data)) -> Vec<u8> {
    let c = q.cmd(sqe, data).await;
    ok(&c);
    c.data
}

/// Writes `data` from the first block on, one 128 KiB command at a time.
async fn write_from_start(q: &mut Queue, data: &[u8]) {
    for (i, chunk) in data.chunks(128 << 10).enumerate() {
        run(q, io::write(i as u64 * 32, chunk, false)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identify_and_data_path_round_trips() {
    let f = Fixture::start().await;
    let id = f.volume("v1", 64 * MIB, HOST, false).await;
    let nqn = f.nqn(id);
    let mut admin = Admin::connect(f.addr, &nqn, HOST, 0).await.unwrap();

    let ctrl = admin.identify(1, 0).await;
    ok(&ctrl);
    assert_eq!(ctrl.data[111], 1, "I/O controller");
    assert_eq!(
        u16::from_le_bytes([ctrl.data[78], ctrl.data[79]]),
        admin.cntlid
    );
    assert_eq!(&ctrl.data[768..768 + nqn.len()], nqn.as_bytes());
    assert_eq!(ctrl.data[768 + nqn.len()], 0);
    let ns = admin.identify(0, 1).await;
    ok(&ns);
    let nsze = u64::from_le_bytes(ns.data[0..8].try_into().unwrap());
    assert_eq!(nsze, 64 * MIB / 4096);
    assert_eq!(ns.data[130], 12, "4 KiB LBA");
    let uuid = f.pool_uuid().await;
    assert_eq!(&ns.data[104..120], &naming::nguid(uuid, id));
    let desc = admin.identify(3, 1).await;
    ok(&desc);
    assert_eq!(&desc.data[0..2], &[2, 16]);
    assert_eq!(&desc.data[4..20], &naming::nguid(uuid, id));
    assert_eq!(&desc.data[20..22], &[3, 16]);
    assert_eq!(&desc.data[24..40], &naming::namespace_uuid(uuid, id));
    assert_eq!(&desc.data[40..42], &[4, 1]);
    let list = admin.identify(2, 0).await;
    assert_eq!(&list.data[0..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(status(&admin.identify(0, 2).await).1, 0x0b, "invalid ns");
    // The NVM command set's controller and namespace structures (CNS 06h / 05h, CSI 0), which
    // Linux reads at connect: served, all zero (no limits of our own).
    for (cns, nsid) in [(6, 0), (5, 1)] {
        let nvm = admin.identify(cns, nsid).await;
        ok(&nvm);
        assert!(nvm.data.iter().all(|&b| b == 0), "CNS {cns}");
    }
    assert_eq!(status(&admin.identify(5, 2).await).1, 0x0b, "invalid ns");
    let q = admin.set_features(0x07, 0x0001_0001).await;
    ok(&q);
    assert_eq!(q.cqe.result, 0x0001_0001);
    ok(&admin.keep_alive().await);

    // Two I/O queues, one with both digests; a third above the granted count is refused.
    let mut q1 = admin
        .io_queue(f.addr, 1, &nqn, HOST, Digests::NONE)
        .await
        .unwrap();
    let mut q2 = admin
        .io_queue(f.addr, 2, &nqn, HOST, Digests::BOTH)
        .await
        .unwrap();
    let refused = admin
        .io_queue(f.addr, 3, &nqn, HOST, Digests::NONE)
        .await
        .err()
        .expect("qid 3 > 2 granted");
    assert_eq!(status(&refused).1, 0x82);
    assert_eq!(refused.cqe.result, 42, "IPO of QID in the SQE");

    // In-capsule (4 KiB), R2T (256 KiB, several H2CData), and a read across both.
    let small = pattern(1, 4096);
    let big = pattern(2, 256 * 1024);
    run(&mut q1, io::write(0, &small, false)).await;
    run(&mut q2, io::write(1, &big, false)).await;
    let back = run(&mut q1, io::read(0, 65)).await;
    assert_eq!(&back[..4096], &small[..]);
    assert_eq!(&back[4096..], &big[..]);
    let back = run(&mut q2, io::read(1, 64)).await;
    assert_eq!(back, big);
    // Never written: zeros.
    assert_eq!(run(&mut q1, io::read(4096, 16)).await, vec![0u8; 16 * 4096]);
    // Past the end.
    let (sqe, data) = io::read(nsze, 1);
    assert_eq!(status(&q1.cmd(sqe, data).await).1, 0x80);

    // Pipelined writes on both queues, FUA and Flush.
    let mut cids = Vec::new();
    for i in 0..8u64 {
        let (sqe, data) = io::write(512 + i, &pattern(i as u8, 4096), i % 2 == 0);
        let q = if i % 2 == 0 { &mut q1 } else { &mut q2 };
        cids.push((i, q.submit(sqe, data)));
    }
    for (i, cid) in cids {
        let q = if i % 2 == 0 { &mut q1 } else { &mut q2 };
        ok(&q.wait(cid).await);
    }
    run(&mut q2, io::flush()).await;
    let back = run(&mut q1, io::read(512, 8)).await;
    for i in 0..8usize {
        assert_eq!(&back[i * 4096..(i + 1) * 4096], &pattern(i as u8, 4096)[..]);
    }

    // Write Zeroes across a partial cluster.
    run(&mut q1, io::write_zeroes(1, 2)).await;
    let back = run(&mut q1, io::read(0, 4)).await;
    assert_eq!(&back[..4096], &small[..]);
    assert!(back[4096..3 * 4096].iter().all(|&b| b == 0));
    assert_eq!(&back[3 * 4096..], &big[2 * 4096..3 * 4096]);

    // DSM deallocate of whole clusters frees them.
    let cluster_blocks = (MIB / 4096) as u32;
    let fill = pattern(9, MIB as usize);
    run(
        &mut q1,
        io::write(8 * u64::from(cluster_blocks), &fill, false),
    )
    .await;
    run(&mut q1, io::flush()).await;
    let before = f.used().await;
    run(
        &mut q2,
        io::deallocate(&[(8 * u64::from(cluster_blocks), cluster_blocks)]),
    )
    .await;
    run(&mut q2, io::flush()).await;
    assert_eq!(before - f.used().await, MIB, "one cluster freed");
    assert_eq!(
        run(&mut q1, io::read(8 * u64::from(cluster_blocks), 4)).await,
        vec![0u8; 4 * 4096]
    );

    // Copy-on-write: a snapshot keeps its data after the volume is overwritten.
    let snap = f
        .app
        .running
        .state
        .on_pool(move |_, pool| pool.create_snapshot(id, "s1", 0))
        .await
        .unwrap()
        .unwrap();
    run(&mut q1, io::write(0, &pattern(77, 4096), true)).await;
    let old = f
        .app
        .running
        .state
        .on_pool(move |_, pool| {
            let segs: Vec<_> = pool.map_read(snap, 0, 8192).unwrap().collect();
            let mut out = Vec::new();
            for s in segs {
                match s {
                    edgevol_core::ReadSegment::Data { device_offset, len } => {
                        let mut buf = vec![0u8; len as usize];
                        edgevol_core::BlockDevice::read(
                            pool.device_mut(),
                            device_offset / 4096,
                            &mut buf,
                        )
                        .unwrap();
                        out.extend(buf);
                    }
                    edgevol_core::ReadSegment::Zero { len } => out.extend(vec![0u8; len as usize]),
                }
            }
            out
        })
        .await
        .unwrap();
    assert_eq!(&old[..4096], &small[..], "snapshot kept the old block");
    assert_eq!(
        &old[4096..],
        &vec![0u8; 4096][..],
        "zeroed before the snapshot"
    );
    let now = run(&mut q2, io::read(0, 2)).await;
    assert_eq!(&now[..4096], &pattern(77, 4096)[..]);
    assert_eq!(
        &now[4096..],
        &vec![0u8; 4096][..],
        "rest of the cluster copied"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_control_and_discovery() {
    let f = Fixture::start().await;
    let a = f.volume("a", 16 * MIB, HOST, false).await;
    let b = f.volume("b", 16 * MIB, OTHER, false).await;

    // Not published: Connect Invalid Host, IATTR 1 (data), IPO 512 (hostnqn).
    let refused = Admin::connect(f.addr, &f.nqn(b), HOST, 0)
        .await
        .err()
        .expect("refused");
    assert_eq!(status(&refused), (1, 0x84, true));
    assert_eq!(refused.cqe.result, (1 << 16) | 512);
    // Unknown subsystem: Invalid Parameters on SUBNQN.
    let refused = Admin::connect(f.addr, "nqn.2024-11.io.edgevol:test-box:v999", HOST, 0)
        .await
        .err()
        .expect("refused");
    assert_eq!(status(&refused).1, 0x82);
    assert_eq!(refused.cqe.result, (1 << 16) | 256);
    // An I/O queue naming somebody else's controller.
    let mine = Admin::connect(f.addr, &f.nqn(a), HOST, 0).await.unwrap();
    let mut q = Queue::open(f.addr, Digests::NONE, 8192).await;
    let c = q.connect(1, mine.cntlid, &f.nqn(a), OTHER, 0).await;
    assert_eq!(c.cqe.result, (1 << 16) | 16, "IPO of CNTLID");

    // Discovery lists only what the host is published to; the generation follows changes.
    let mut disc = Admin::connect(f.addr, DISCOVERY_NQN, HOST, 0)
        .await
        .unwrap();
    let id = disc.identify(1, 0).await;
    assert_eq!(id.data[111], 2, "discovery controller");
    let log = disc.get_log(0x70, 4096).await;
    ok(&log);
    assert_eq!(u64::from_le_bytes(log.data[8..16].try_into().unwrap()), 1);
    let e = &log.data[1024..2048];
    assert_eq!(e[0], 3, "tcp");
    assert_eq!(e[1], 1, "ipv4");
    let nqn = f.nqn(a);
    assert_eq!(&e[256..256 + nqn.len()], nqn.as_bytes());
    assert_eq!(&e[512..521], b"127.0.0.1");
    let port = f.addr.port().to_string();
    assert_eq!(&e[32..32 + port.len()], port.as_bytes());
    let gen1 = u64::from_le_bytes(log.data[0..8].try_into().unwrap());
    let again = disc.get_log(0x70, 4096).await;
    assert_eq!(&again.data[0..8], &log.data[0..8], "stable while unchanged");
    f.publish(b, HOST).await;
    let log = disc.get_log(0x70, 4096).await;
    assert_eq!(u64::from_le_bytes(log.data[8..16].try_into().unwrap()), 2);
    assert_ne!(u64::from_le_bytes(log.data[0..8].try_into().unwrap()), gen1);
    // Now admitted.
    Admin::connect(f.addr, &f.nqn(b), HOST, 0).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_closes_live_queues_and_readonly_refuses_writes() {
    let f = Fixture::start().await;
    let v = f.volume("v", 16 * MIB, HOST, false).await;
    let nqn = f.nqn(v);
    let mut admin = Admin::connect(f.addr, &nqn, HOST, 0).await.unwrap();
    ok(&admin.set_features(0x07, 0).await);
    let mut q1 = admin
        .io_queue(f.addr, 1, &nqn, HOST, Digests::NONE)
        .await
        .unwrap();
    run(&mut q1, io::write(0, &pattern(3, 4096), false)).await;
    // A bystander on another volume keeps working.
    let w = f.volume("w", 16 * MIB, HOST, false).await;
    let wnqn = f.nqn(w);
    let other = Admin::connect(f.addr, &wnqn, HOST, 0).await.unwrap();
    let mut oq = other
        .io_queue(f.addr, 1, &wnqn, HOST, Digests::NONE)
        .await
        .unwrap();

    let state = f.app.running.state.clone();
    state
        .on_pool(move |_, pool| pool.unpublish(v, HOST))
        .await
        .unwrap()
        .unwrap();
    f.app.running.target.access.revoke(v, HOST);
    assert!(matches!(q1.wait_closed().await, Ended::Eof));
    assert!(matches!(admin.q.wait_closed().await, Ended::Eof));
    run(&mut oq, io::read(0, 1)).await;
    assert!(Admin::connect(f.addr, &nqn, HOST, 0).await.is_err());

    // Read-only publication: reads work, writes are refused, the namespace says so.
    let ro = f.volume("ro", 16 * MIB, OTHER, true).await;
    let ronqn = f.nqn(ro);
    let mut admin = Admin::connect(f.addr, &ronqn, OTHER, 0).await.unwrap();
    assert_eq!(admin.identify(0, 1).await.data[99], 1, "write protected");
    let mut q = admin
        .io_queue(f.addr, 1, &ronqn, OTHER, Digests::NONE)
        .await
        .unwrap();
    run(&mut q, io::read(0, 1)).await;
    for (sqe, data) in [
        io::write(0, &[1u8; 4096], false),
        io::write_zeroes(0, 1),
        io::deallocate(&[(0, 1)]),
    ] {
        assert_eq!(status(&q.cmd(sqe, data).await), (0, 0x20, true));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_expiry_tears_the_controller_down() {
    let f = Fixture::start().await;
    let v = f.volume("v", 16 * MIB, HOST, false).await;
    let nqn = f.nqn(v);
    // A 1 s KATO (times the load's scale: the I/O queue and the Keep Alive come within it).
    let kato = common::scaled_ms(1000);
    let mut admin = Admin::connect(f.addr, &nqn, HOST, kato).await.unwrap();
    let mut q1 = admin
        .io_queue(f.addr, 1, &nqn, HOST, Digests::NONE)
        .await
        .unwrap();
    ok(&admin.keep_alive().await);
    // No more traffic: both queues close once the KATO passes.
    assert!(matches!(admin.q.wait_closed().await, Ended::Eof));
    assert!(matches!(q1.wait_closed().await, Ended::Eof));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_change_raises_an_async_event() {
    let f = Fixture::start().await;
    let v = f.volume("v", 16 * MIB, HOST, false).await;
    let nqn = f.nqn(v);
    let mut admin = Admin::connect(f.addr, &nqn, HOST, 0).await.unwrap();
    ok(&admin.set_features(0x0b, 1 << 8).await);
    let mut aer = edgevol_nvmeof::sqe::Sqe::default();
    aer.set_opcode(edgevol_nvmeof::admin::opcode::ASYNC_EVENT_REQUEST);
    let cid = admin.q.submit(aer, Data::None);
    ok(&admin.keep_alive().await);
    assert!(admin.q.try_take(cid).is_none(), "AER parked");
    let state = f.app.running.state.clone();
    state
        .on_pool(move |_, pool| pool.expand_volume(v, 32 * MIB))
        .await
        .unwrap()
        .unwrap();
    f.app.running.target.access.namespace_changed(v);
    let event = admin.q.wait(cid).await;
    ok(&event);
    assert_eq!(event.cqe.result & 0xffff_ffff, 0x0004_0002);
    let log = admin.get_log(0x04, 4096).await;
    assert_eq!(&log.data[0..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    let ns = admin.identify(0, 1).await;
    assert_eq!(
        u64::from_le_bytes(ns.data[0..8].try_into().unwrap()),
        32 * MIB / 4096
    );
}

/// One Error Information Log Entry as the host reads it (`struct nvme_error_slot`).
#[derive(Debug, PartialEq, Eq)]
struct ErrorEntry {
    count: u64,
    sqid: u16,
    cid: u16,
    status: u16,
    location: u16,
    lba: u64,
    nsid: u32,
}

fn error_entries(page: &[u8]) -> Vec<ErrorEntry> {
    let u16_at = |e: &[u8], at: usize| u16::from_le_bytes([e[at], e[at + 1]]);
    page.chunks_exact(64)
        .map(|e| ErrorEntry {
            count: u64::from_le_bytes(e[0..8].try_into().unwrap()),
            sqid: u16_at(e, 8),
            cid: u16_at(e, 10),
            status: u16_at(e, 12),
            location: u16_at(e, 14),
            lba: u64::from_le_bytes(e[16..24].try_into().unwrap()),
            nsid: u32::from_le_bytes(e[24..28].try_into().unwrap()),
        })
        .collect()
}

fn smart_error_count(smart: &[u8]) -> u128 {
    u128::from_le_bytes(smart[176..192].try_into().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_commands_fill_the_error_log_newest_first() {
    const SLOTS: usize = 128;
    let f = Fixture::start().await;
    let v = f.volume("v", 16 * MIB, HOST, false).await;
    let nqn = f.nqn(v);
    let mut admin = Admin::connect(f.addr, &nqn, HOST, 0).await.unwrap();
    let ctrl = admin.identify(1, 0).await;
    ok(&ctrl);
    assert_eq!(usize::from(ctrl.data[262]) + 1, SLOTS, "ELPE");
    let log = admin.get_log(0x01, 64 * SLOTS as u32).await;
    ok(&log);
    assert!(log.data.iter().all(|&b| b == 0), "no errors yet");
    let mut q1 = admin
        .io_queue(f.addr, 1, &nqn, HOST, Digests::NONE)
        .await
        .unwrap();

    // LBA Out of Range and Invalid Opcode on I/O queue 1, Invalid Namespace on the admin queue.
    let nsze = 16 * MIB / 4096;
    let (sqe, data) = io::read(nsze, 1);
    let past_end = q1.cmd(sqe, data).await;
    assert_eq!(status(&past_end), (0, 0x80, true));
    assert!(past_end.cqe.status().more, "More: the log has the details");
    let unserved = || {
        // Compare (05h) is not served.
        let mut sqe = edgevol_nvmeof::sqe::Sqe::default();
        sqe.set_opcode(0x05).set_nsid(1);
        sqe
    };
    let bad_opcode = q1.cmd(unserved(), Data::None).await;
    assert_eq!(status(&bad_opcode), (0, 0x01, true));
    let bad_ns = admin.identify(0, 2).await;
    assert_eq!(status(&bad_ns), (0, 0x0b, true));

    let log = admin.get_log(0x01, 4096).await;
    ok(&log);
    let entries = error_entries(&log.data);
    // Status Field: status in bits 15:1 (DNR is bit 14 of the status), phase bit 0 clear.
    let dnr = 1 << 14;
    assert_eq!(
        entries[0],
        ErrorEntry {
            count: 3,
            sqid: 0,
            cid: bad_ns.cid,
            status: (dnr | 0x0b) << 1,
            location: 4,
            lba: 0,
            nsid: 2,
        }
    );
    assert_eq!(
        entries[1],
        ErrorEntry {
            count: 2,
            sqid: 1,
            cid: bad_opcode.cid,
            status: (dnr | 0x01) << 1,
            location: 0,
            lba: 0,
            nsid: 1,
        }
    );
    assert_eq!(
        entries[2],
        ErrorEntry {
            count: 1,
            sqid: 1,
            cid: past_end.cid,
            status: (dnr | 0x80) << 1,
            location: 40,
            lba: nsze,
            nsid: 1,
        }
    );
    assert!(log.data[3 * 64..].iter().all(|&b| b == 0), "unused: zero");

    // Offset and length window the page: the second entry alone.
    let mut sqe = edgevol_nvmeof::sqe::Sqe::default();
    sqe.set_opcode(edgevol_nvmeof::admin::opcode::GET_LOG_PAGE)
        .set_nsid(0xffff_ffff)
        .set_cdw(10, (15 << 16) | 0x01)
        .set_cdw(12, 64);
    let one = admin.q.cmd(sqe, Data::Read(64)).await;
    ok(&one);
    assert_eq!(error_entries(&one.data)[0].count, 2);

    let smart = admin.get_log(0x02, 512).await;
    ok(&smart);
    assert_eq!(smart_error_count(&smart.data), 3);

    // More failures than the ring holds: only the newest stay, still newest first.
    let more = SLOTS + 2;
    let mut last = 0;
    for batch in 0..more.div_ceil(16) {
        let n = 16.min(more - batch * 16);
        let cids: Vec<u16> = (0..n).map(|_| q1.submit(unserved(), Data::None)).collect();
        for cid in cids {
            assert_eq!(status(&q1.wait(cid).await).1, 0x01);
            last = cid;
        }
    }
    let total = (3 + more) as u64;
    let log = admin.get_log(0x01, 64 * SLOTS as u32).await;
    ok(&log);
    let entries = error_entries(&log.data);
    assert_eq!(entries.len(), SLOTS);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e.count, total - i as u64, "entry {i}");
        assert_eq!((e.sqid, e.status, e.nsid), (1, (dnr | 0x01) << 1, 1));
    }
    assert_eq!(entries[0].cid, last);
    let smart = admin.get_log(0x02, 512).await;
    assert_eq!(smart_error_count(&smart.data), u128::from(total));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_pdus_close_only_their_connection() {
    let f = Fixture::start().await;
    let v = f.volume("v", 16 * MIB, HOST, false).await;
    let (_admin, mut good) = f.connect(v).await;
    // Unknown PDU type, wrong hlen, oversized plen: each gets a TermReq and a close.
    let bad: [&[u8]; 3] = [
        &[0x7e, 0, 8, 0, 8, 0, 0, 0],
        &[0x04, 0, 12, 0, 72, 0, 0, 0],
        &[0x04, 0, 72, 0, 0xff, 0xff, 0xff, 0x7f],
    ];
    for raw in bad {
        let mut q = Queue::open(f.addr, Digests::NONE, 8192).await;
        q.send_raw(raw);
        assert!(matches!(q.wait_closed().await, Ended::TermReq), "{raw:?}");
    }
    // The other connection is untouched.
    run(&mut good, io::write(0, &pattern(5, 4096), false)).await;
    assert_eq!(run(&mut good, io::read(0, 1)).await, pattern(5, 4096));
}

/// Reads a snapshot through core (the pool's own handle).
async fn snapshot_bytes(f: &Fixture, snap: edgevol_core::SnapshotId, len: u64) -> Vec<u8> {
    f.app
        .running
        .state
        .on_pool(move |_, pool| {
            let segs: Vec<_> = pool.map_read(snap, 0, len).unwrap().collect();
            let mut out = Vec::new();
            for s in segs {
                match s {
                    edgevol_core::ReadSegment::Zero { len } => {
                        out.resize(out.len() + usize::try_from(len).unwrap(), 0)
                    }
                    edgevol_core::ReadSegment::Data { device_offset, len } => {
                        let mut buf = vec![0; usize::try_from(len).unwrap()];
                        let bs =
                            u64::from(edgevol_core::BlockDevice::block_size(pool.device_mut()));
                        edgevol_core::BlockDevice::read(
                            pool.device_mut(),
                            device_offset / bs,
                            &mut buf,
                        )
                        .unwrap();
                        out.extend(buf);
                    }
                }
            }
            out
        })
        .await
        .unwrap()
}

/// The data path runs outside the pool lock: snapshots taken while pipelined writes are in flight
/// hold, for every block, the last acknowledged generation or the one in flight (whole, never
/// torn, never older); trims + flushes of another volume during reads never hand a cluster in use
/// to it; everything reads back and no pin outlives its I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_trims_race_in_flight_io() {
    const BLOCKS: u64 = 32;
    let f = Fixture::start().await;
    let id = f.volume("racing", 8 * MIB, HOST, false).await;
    let other = f.volume("churn", 8 * MIB, HOST, false).await;
    let (_admin, mut q) = f.connect(id).await;
    let oq_admin = Admin::connect(f.addr, &f.nqn(other), HOST, 0)
        .await
        .unwrap();
    let mut oq = oq_admin
        .io_queue(f.addr, 1, &f.nqn(other), HOST, Digests::NONE)
        .await
        .unwrap();
    let block = |gen: u8, b: u64| pattern(gen.wrapping_mul(31).wrapping_add(b as u8), 4096);
    // Generation 1 allocates the clusters (under the lock); later ones are in place (detached).
    for b in 0..BLOCKS {
        run(&mut q, io::write(b, &block(1, b), false)).await;
    }
    let state = f.app.running.state.clone();
    for gen in 2..8u8 {
        let cids: Vec<u16> = (0..BLOCKS)
            .map(|b| {
                let (sqe, data) = io::write(b, &block(gen, b), false);
                q.submit(sqe, data)
            })
            .collect();
        // Snapshot while generation `gen` is in flight; generation gen-1 is acknowledged.
        let name = format!("during-{gen}");
        let snap = state
            .on_pool(move |_, pool| pool.create_snapshot(id, &name, 0))
            .await
            .unwrap()
            .unwrap();
        // Meanwhile another volume is written, read, trimmed and flushed.
        run(&mut oq, io::write(0, &pattern(gen, 1 << 20), false)).await;
        let (sqe, data) = io::read(0, 256);
        let rcid = oq.submit(sqe, data);
        run(&mut oq, io::deallocate(&[(0, 256)])).await;
        run(&mut oq, io::flush()).await;
        let back = oq.wait(rcid).await;
        ok(&back);
        assert!(
            back.data == pattern(gen, 1 << 20) || back.data == vec![0; 1 << 20],
            "a read racing a trim returns the old data or zeros"
        );
        for cid in cids {
            ok(&q.wait(cid).await);
        }
        let image = snapshot_bytes(&f, snap, BLOCKS * 4096).await;
        for b in 0..BLOCKS {
            let got = &image[(b * 4096) as usize..((b + 1) * 4096) as usize];
            assert!(
                got == block(gen - 1, b).as_slice() || got == block(gen, b).as_slice(),
                "snapshot during generation {gen}: block {b} is neither the acknowledged nor the in-flight write"
            );
        }
        // The snapshot never changes afterwards.
        run(&mut q, io::write(0, &block(99, 0), false)).await;
        assert_eq!(snapshot_bytes(&f, snap, BLOCKS * 4096).await, image);
        run(&mut q, io::write(0, &block(gen, 0), false)).await;
    }
    let back = run(&mut q, io::read(0, u32::try_from(BLOCKS).unwrap())).await;
    for b in 0..BLOCKS {
        assert_eq!(
            &back[(b * 4096) as usize..((b + 1) * 4096) as usize],
            block(7, b).as_slice()
        );
    }
    run(&mut q, io::flush()).await;
    let (pending, writes) = state
        .on_pool(|_, pool| (pool.capacity().pending_free, pool.writes_in_flight()))
        .await
        .unwrap();
    assert_eq!((pending, writes), (0, 0), "every pin released");
}

/// Right after a start the listener is up before the pool is open: a Connect then is answered
/// Controller Busy without DNR (Linux retries it), and the same host is admitted once it is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_before_the_pool_is_open_is_retryable() {
    let state = std::sync::Arc::new(edgevol_appliance::state::State::new(
        "test-box".into(),
        Default::default(),
    ));
    let dir = tempfile::tempdir().unwrap();
    let target = edgevol_appliance::nvme::start(
        state.clone(),
        &edgevol_appliance::config::NvmeConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            advertise: "127.0.0.1".parse().unwrap(),
            io_threads: 0,
            io_cpus: Vec::new(),
            busy_poll: std::time::Duration::from_micros(
                edgevol_appliance::config::DEFAULT_BUSY_POLL_US,
            ),
        },
        edgevol_appliance::nvme::auth::HostAuth::new(
            std::sync::Arc::new(edgevol_appliance::hostkeys::HostKeys::open(dir.path()).unwrap()),
            edgevol_appliance::config::HostAuthPolicy {
                allow_unauthenticated_hosts: true,
                ..Default::default()
            },
        ),
    )
    .await
    .unwrap();
    let addr = target.endpoint;
    // The pool exists (as on a restart) but the daemon has not opened it yet.
    let mut pool = edgevol_appliance::pool::open(&[dir.path().join("pool.img")], true).unwrap();
    let id = pool.create_volume(VolumeSpec::new("v", MIB)).unwrap();
    pool.publish(id, HOST, false).unwrap();
    let nqn = naming::subsystem_nqn("test-box", id);
    let busy = Admin::connect(addr, &nqn, HOST, 0)
        .await
        .err()
        .expect("refused while the pool opens");
    assert_eq!(
        status(&busy),
        (1, 0x81, false),
        "Controller Busy, retryable"
    );

    state.set_pool(pool);
    Admin::connect(addr, &nqn, HOST, 0)
        .await
        .map_err(|c| c.cqe.status())
        .expect("admitted once the pool is open");
    target.stop().await;
}

/// A host's I/O queues (Linux opens one per CPU) run on different engine threads, and each
/// carries its own I/O there; a queue's engine slot frees when it disconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_queues_of_one_connection_spread_over_the_engine_threads() {
    let f = Fixture::start_with(|c| c.nvme.io_threads = 2).await;
    let engines = f.app.running.target.engines.clone();
    assert_eq!(engines.threads(), 2);
    let id = f.volume("spread", 8 * MIB, HOST, false).await;
    let nqn = f.nqn(id);
    let admin = Admin::connect(f.addr, &nqn, HOST, 0).await.unwrap();
    let mut queues = Vec::new();
    for qid in 1..=2u16 {
        queues.push(
            admin
                .io_queue(f.addr, qid, &nqn, HOST, Digests::NONE)
                .await
                .unwrap(),
        );
    }
    for (i, q) in queues.iter_mut().enumerate() {
        let data = pattern(i as u8, 64 << 10);
        let lba = i as u64 * 128;
        run(q, io::write(lba, &data, false)).await;
        assert_eq!(run(q, io::read(lba, 16)).await, data);
    }
    // The queue moves to its engine after its Connect completes: allow the hand-over a moment.
    tokio::time::timeout(WAIT, async {
        while engines.queues_per_thread() != [1, 1] {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("one queue per engine: {:?}", engines.queues_per_thread()));
    drop(queues);
    tokio::time::timeout(WAIT, async {
        while engines.queues_per_thread() != [0, 0] {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("closed queues leave their engines");
}

/// On an `O_DIRECT` pool, the device I/O of a queue's queued Reads and cached Writes runs on the
/// queue's own io_uring: 32 writes in flight at once, then 32 reads of them, some across cluster
/// boundaries, come back exact, holes read as zeros, and the engines counted both on their
/// rings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_io_on_an_o_direct_pool_runs_on_the_queues_io_uring() {
    let f = Fixture::start().await;
    let engines = f.app.running.target.engines.clone();
    let id = f.volume("ring", 8 * MIB, HOST, false).await;
    let (_admin, mut q) = f.connect(id).await;
    let fill = pattern(0xee, 6 * MIB as usize);
    write_from_start(&mut q, &fill).await;
    // 32 writes of 24 KiB (4 KiB blocks), some across a 1 MiB cluster boundary, all submitted
    // before the first completion is awaited.
    let before = engines.ring_operations();
    let at = |i: u64| i * 40 + 3;
    let cids: Vec<u16> = (0..32u64)
        .map(|i| {
            let (sqe, data) = io::write(at(i), &pattern(i as u8, 24 << 10), false);
            q.submit(sqe, data)
        })
        .collect();
    for cid in cids {
        ok(&q.wait(cid).await);
    }
    let writes_on_ring = engines.ring_operations() - before;
    let before = engines.ring_operations();
    let cids: Vec<u16> = (0..32u64)
        .map(|i| {
            let (sqe, data) = io::read(at(i), 6);
            q.submit(sqe, data)
        })
        .collect();
    for (i, cid) in cids.into_iter().enumerate() {
        let c = q.wait(cid).await;
        ok(&c);
        assert_eq!(c.data, pattern(i as u8, 24 << 10), "read {i}");
    }
    // Beyond the filled 6 MiB: a hole reads as zeros; half data, half hole reads both.
    let hole = run(&mut q, io::read(7 * 256, 4)).await;
    assert!(hole.iter().all(|&b| b == 0));
    let edge = run(&mut q, io::read(6 * 256 - 2, 4)).await;
    assert_eq!(edge[..8192], fill[fill.len() - 8192..]);
    assert!(edge[8192..].iter().all(|&b| b == 0));
    let on_ring = engines.ring_operations() - before;
    // The first command of a batch may run in place (nothing queued behind it yet).
    assert!(
        writes_on_ring >= 16,
        "queued writes ran on the ring: {writes_on_ring} operations"
    );
    assert!(
        on_ring >= 16,
        "queued reads ran on the ring: {on_ring} operations"
    );
    eprintln!("{writes_on_ring} of 32 writes and {on_ring} of 34 reads on the ring");
}

/// On an `O_DIRECT` pool, a lone cached Write (nothing else in flight) still goes on the queue's
/// io_uring, whose submission issues it to the drive at once, while a lone Read runs in place:
/// a synchronous write to a block device would be issued by the kernel's block worker thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_write_on_an_o_direct_pool_goes_on_the_ring_and_a_lone_read_runs_in_place() {
    let f = Fixture::start().await;
    let engines = f.app.running.target.engines.clone();
    let id = f.volume("lone", 4 * MIB, HOST, false).await;
    let (_admin, mut q) = f.connect(id).await;
    // Allocate the clusters first, so that the writes measured below overwrite in place.
    let fill = pattern(0x5a, 2 * MIB as usize);
    write_from_start(&mut q, &fill).await;
    let before = engines.ring_operations();
    for i in 0..8u64 {
        run(&mut q, io::write(i * 64, &pattern(i as u8, 4096), false)).await;
    }
    let writes = engines.ring_operations() - before;
    let before = engines.ring_operations();
    for i in 0..8u64 {
        assert_eq!(
            run(&mut q, io::read(i * 64, 1)).await,
            pattern(i as u8, 4096),
            "read {i}"
        );
    }
    let reads = engines.ring_operations() - before;
    assert_eq!(writes, 8, "lone writes on the ring");
    assert_eq!(reads, 0, "lone reads in place");
}
