//! What edgevold ships: hal's test-only devices (its `testing` feature: the RAM and fault devices,
//! `PoolDevice::Faulty`) reach the appliance only through its dev-dependencies, so the pool
//! device of a release build is a file or a block device and nothing else.

use std::process::Command;

/// hal's features in the appliance's dependency tree over the given edge kinds.
fn hal_features(edges: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--prefix", "none"])
        .args(["-p", "edgevol-appliance", "-e", edges])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut features: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("edgevol-hal feature "))
        .map(|f| f.trim_end_matches(" (*)").trim_matches('"').to_owned())
        .collect();
    features.sort();
    features.dedup();
    features
}

#[test]
fn hal_test_only_devices_reach_edgevold_only_through_dev_dependencies() {
    assert_eq!(
        hal_features("features,normal,build"),
        ["default"],
        "a normal or build dependency turns on a hal feature edgevold must not ship"
    );
    // The tests do get them: the check above looks for the feature under its real name.
    assert!(hal_features("features,normal,build,dev").contains(&"testing".to_owned()));
}
