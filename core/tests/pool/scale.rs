//! A pool with 10,000 volumes reopens with every volume intact.
// Host-only test code on 64-bit machines: byte counts of test devices fit in usize.
#![allow(clippy::cast_possible_truncation)]

use edgevol_core::*;

#[test]
fn ten_thousand_volumes_reopen() {
    let options = FormatOptions {
        uuid: [3; 16],
        cluster_size: 64 << 10,
        checkpoint_bytes: 4 << 20,
        journal_bytes: 1 << 20,
    };
    let mut pool = Pool::format(RamDevice::new(4096, 8192), options).unwrap();
    for i in 0..10_000u64 {
        let mut spec = VolumeSpec::new(format!("pvc-{i:08}-0000-4000-8000-000000000000"), (1 + i % 16) << 30);
        spec.parameters = vec![("csi.storage.k8s.io/fstype".into(), "xfs".into())];
        let v = pool.create_volume(spec).unwrap();
        if i % 100 == 0 {
            pool.publish(v, &format!("nqn.2014-08.org.nvmexpress:uuid:{i}"), false)
                .unwrap();
        }
    }
    let before: Vec<Volume> = pool.volumes(None).cloned().collect();
    let pool = Pool::open(pool.into_device()).unwrap();
    let after: Vec<Volume> = pool.volumes(None).cloned().collect();
    assert_eq!(after.len(), 10_000);
    assert!(before == after, "volumes differ after reopen");
    assert_eq!(
        pool.volume_by_name("pvc-00009999-0000-4000-8000-000000000000")
            .unwrap()
            .size(),
        16 << 30
    );
    assert_eq!(pool.volume(VolumeId(100)).unwrap().publications().len(), 1);
}
