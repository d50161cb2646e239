//! Resolution of flags over the file over defaults, and the one-line errors of bad input.

use super::*;
use std::path::Path;

use clap::Parser;

fn write(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("edgevold.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn dev_defaults_live_under_the_data_dir() {
    let c = Config::from_args(Args {
        dev: true,
        ..Args::default()
    })
    .unwrap();
    let dir = PathBuf::from(DEFAULT_DEV_DIR);
    assert_eq!(c.data_dir, dir);
    assert_eq!(c.devices, vec![dir.join("pool.img")]);
    assert_eq!(c.tls.ca, dir.join("pki/ca.pem"));
    assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(c.nvme.listen.to_string(), "127.0.0.1:4420");
    assert_eq!(c.nvme.advertise.to_string(), "127.0.0.1");
}

#[test]
fn metrics_are_on_in_dev_off_otherwise_and_configurable() {
    let dev = Config::from_args(Args {
        dev: true,
        ..Args::default()
    })
    .unwrap();
    assert_eq!(
        dev.metrics,
        MetricsConfig {
            listen: Some(DEV_METRICS_LISTEN.parse().unwrap()),
            best_effort: true
        }
    );
    let base = || Args {
        data_dir: Some("/tmp/x".into()),
        devices: vec!["/dev/nvme0n1".into()],
        nvme_advertise: Some("192.0.2.7".parse().unwrap()),
        ..Args::default()
    };
    assert_eq!(
        Config::from_args(base()).unwrap().metrics,
        MetricsConfig::default()
    );
    let flag = parse_metrics_listen("0.0.0.0:9100").unwrap();
    let c = Config::from_args(Args {
        metrics_listen: Some(flag),
        ..base()
    })
    .unwrap();
    assert_eq!(c.metrics.listen, Some("0.0.0.0:9100".parse().unwrap()));
    assert!(!c.metrics.best_effort, "an address asked for must bind");
    let off = Config::from_args(Args {
        dev: true,
        metrics_listen: Some(parse_metrics_listen("off").unwrap()),
        ..Args::default()
    })
    .unwrap();
    assert_eq!(off.metrics.listen, None);
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "[metrics]\nlisten = \"127.0.0.1:9700\"\n");
    let c = Config::from_args(Args {
        config: Some(path),
        ..base()
    })
    .unwrap();
    assert_eq!(c.metrics.listen, Some("127.0.0.1:9700".parse().unwrap()));
    let path = write(dir.path(), "[metrics]\nlisten = \"nowhere\"\n");
    let e = Config::from_args(Args {
        config: Some(path),
        ..base()
    })
    .unwrap_err()
    .0;
    assert!(
        e.contains("nowhere") && e.contains("HOST:PORT or off"),
        "{e}"
    );
}

#[test]
fn a_wildcard_nvme_listener_needs_an_advertised_address() {
    let base = || Args {
        data_dir: Some("/tmp/x".into()),
        devices: vec!["/dev/nvme0n1".into()],
        ..Args::default()
    };
    let e = Config::from_args(base()).unwrap_err().0;
    assert!(
        e.contains("0.0.0.0:4420") && e.contains("--nvme-advertise"),
        "{e}"
    );
    let c = Config::from_args(Args {
        nvme_advertise: Some("192.0.2.7".parse().unwrap()),
        ..base()
    })
    .unwrap();
    assert_eq!(c.nvme.advertise.to_string(), "192.0.2.7");
    let e = Config::from_args(Args {
        nvme_advertise: Some("0.0.0.0".parse().unwrap()),
        ..base()
    })
    .unwrap_err()
    .0;
    assert!(e.contains("not an address hosts can connect to"), "{e}");
}

#[test]
fn file_values_are_relative_to_the_file_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        r#"
appliance_id = "box-1"
listen = "0.0.0.0:9600"
data_dir = "state"
devices = ["/dev/nvme0n1", "pool.img"]
[nvme]
listen = "0.0.0.0:4420"
advertise = "192.0.2.1"
io_threads = 3
io_cpus = [5, 1, 3]
busy_poll_us = 20
[tls]
ca = "pki/ca.pem"
[topology]
"example.com/rack" = "r7"
"#,
    );
    let c = Config::from_args(Args {
        config: Some(path.clone()),
        listen: Some("127.0.0.1:1".parse().unwrap()),
        ..Args::default()
    })
    .unwrap();
    assert_eq!(c.appliance_id.as_deref(), Some("box-1"));
    assert_eq!(c.listen.to_string(), "127.0.0.1:1");
    assert_eq!(c.nvme.io_threads, 3);
    assert_eq!(
        c.nvme.io_cpus,
        [5, 1, 3],
        "in the order given: thread N on the Nth"
    );
    assert_eq!(c.nvme.busy_poll, std::time::Duration::from_micros(20));
    assert_eq!(c.data_dir, dir.path().join("state"));
    assert_eq!(
        c.devices,
        vec![PathBuf::from("/dev/nvme0n1"), dir.path().join("pool.img")]
    );
    assert_eq!(c.tls.ca, dir.path().join("pki/ca.pem"));
    assert_eq!(c.tls.key, dir.path().join("state/pki/server.key"));
    assert_eq!(c.topology["example.com/rack"], "r7");
    assert!(!c.format_blank, "off unless asked for");
    let path = write(
        dir.path(),
        "format_blank = true\ndata_dir = \"s\"\ndevices = [\"d\"]\n[nvme]\nadvertise = \"192.0.2.1\"",
    );
    let c = Config::from_args(Args {
        config: Some(path),
        ..Args::default()
    })
    .unwrap();
    assert!(c.format_blank);
}

#[test]
fn bad_files_and_values_give_one_line_naming_the_culprit() {
    let dir = tempfile::tempdir().unwrap();
    let config = |text: &str| {
        let path = write(dir.path(), text);
        Config::from_args(Args {
            config: Some(path),
            dev: true,
            ..Args::default()
        })
        .unwrap_err()
        .0
    };
    let e = config("listen = [");
    assert!(e.contains("edgevold.toml at line 1"), "{e}");
    assert!(!e.contains('\n'), "{e}");
    let e = config("colour = \"blue\"");
    assert!(e.contains("unknown field `colour`"), "{e}");
    let e = config("appliance_id = \"Box_1\"");
    assert!(e.contains("appliance id \"Box_1\""), "{e}");
    let e = config("[topology]\n\"edgevol.io/appliance\" = \"x\"");
    assert!(e.contains("set by the appliance"), "{e}");
    let e = config("[topology]\n\"rack\" = \"-bad\"");
    assert!(e.contains("topology value \"-bad\""), "{e}");
    let e = config("[nvme]\nio_cpus = [0, 2, 0]");
    assert!(e.contains("nvme.io_cpus names CPU 0 twice"), "{e}");
    let e = config("[nvme]\nio_cpus = [4096]");
    assert!(e.contains("nvme.io_cpus names CPU 4096, above 1023"), "{e}");
    let e = config("[nvme]\nio_threads = 3\nio_cpus = [0, 1]");
    assert!(
        e.contains("nvme.io_threads 3 disagrees with nvme.io_cpus (2 CPUs"),
        "{e}"
    );

    let missing = dir.path().join("nope.toml");
    let e = Config::from_args(Args {
        config: Some(missing),
        ..Args::default()
    })
    .unwrap_err()
    .0;
    assert!(e.contains("nope.toml") && e.contains("No such file"), "{e}");
}

#[test]
fn authentication_is_required_unless_allowed_by_file_or_flag() {
    let dir = tempfile::tempdir().unwrap();
    let with = |text: &str, flag: Option<bool>| {
        let path = write(dir.path(), text);
        Config::from_args(Args {
            config: Some(path),
            dev: true,
            nvme_allow_unauthenticated_hosts: flag,
            ..Args::default()
        })
        .map(|c| c.host_auth.allow_unauthenticated_hosts)
    };
    let dev = Config::from_args(Args {
        dev: true,
        ..Args::default()
    })
    .unwrap();
    assert_eq!(dev.host_auth, HostAuthPolicy::default());
    assert!(
        !dev.host_auth.allow_unauthenticated_hosts,
        "required by default"
    );
    assert_eq!(dev.host_auth.warning(), None);
    assert_eq!(with("", None), Ok(false));
    assert_eq!(
        with("[nvme]\nallow_unauthenticated_hosts = true\n", None),
        Ok(true)
    );
    assert_eq!(
        with("[nvme]\nallow_unauthenticated_hosts = false\n", None),
        Ok(false)
    );
    assert_eq!(with("", Some(true)), Ok(true));
    // The flag wins both ways: an operator can turn the file's setting off for one start.
    assert_eq!(
        with("[nvme]\nallow_unauthenticated_hosts = true\n", Some(false)),
        Ok(false)
    );
    let e = with("[nvme]\nallow_unauthenticated_hosts = \"yes\"\n", None)
        .unwrap_err()
        .0;
    assert!(e.contains("at line 2") && e.contains("bool"), "{e}");
    let allowed = HostAuthPolicy {
        allow_unauthenticated_hosts: true,
        ..HostAuthPolicy::default()
    };
    assert!(allowed
        .warning()
        .is_some_and(|w| w.contains("nvme.allow_unauthenticated_hosts")));
}

#[test]
fn hashes_and_dh_groups_are_chosen_by_name_in_preference_order() {
    let dir = tempfile::tempdir().unwrap();
    let with = |text: &str| {
        Config::from_args(Args {
            config: Some(write(dir.path(), text)),
            dev: true,
            ..Args::default()
        })
        .map(|c| c.host_auth)
    };
    let p =
        with("[nvme]\nauth_hashes = [\"sha512\", \"sha256\"]\nauth_dh_groups = [\"ffdhe4096\"]\n")
            .unwrap();
    assert_eq!(p.hashes, [HashId::Sha512, HashId::Sha256]);
    assert_eq!(p.dh_groups, [DhGroup::Ffdhe4096]);
    let d = with("").unwrap();
    assert_eq!(d.hashes, HashId::ALL);
    assert_eq!(d.dh_groups.first(), Some(&DhGroup::Ffdhe2048));
    assert_eq!(d.dh_groups.len(), DhGroup::ALL.len());
    let e = with("[nvme]\nauth_hashes = [\"md5\"]\n").unwrap_err().0;
    assert!(
        e.contains("nvme.auth_hashes: unknown \"md5\"") && e.contains("sha384"),
        "{e}"
    );
    let e = with("[nvme]\nauth_dh_groups = []\n").unwrap_err().0;
    assert!(e.contains("nvme.auth_dh_groups is empty"), "{e}");
}

#[test]
fn the_allow_unauthenticated_flag_takes_a_value() {
    let parse = |args: &[&str]| Args::try_parse_from([&["edgevold"], args].concat());
    let a = parse(&["--nvme-allow-unauthenticated-hosts", "true"]).unwrap();
    assert_eq!(a.nvme_allow_unauthenticated_hosts, Some(true));
    let a = parse(&["--nvme-allow-unauthenticated-hosts=false"]).unwrap();
    assert_eq!(a.nvme_allow_unauthenticated_hosts, Some(false));
    assert!(parse(&["--nvme-allow-unauthenticated-hosts", "maybe"]).is_err());
    assert_eq!(parse(&[]).unwrap().nvme_allow_unauthenticated_hosts, None);
}

#[test]
fn firmware_section_defaults_bounds_and_off() {
    let dir = tempfile::tempdir().unwrap();
    let load = |text: &str| {
        Config::from_args(Args {
            dev: true,
            config: Some(write(dir.path(), text)),
            ..Args::default()
        })
    };
    assert_eq!(load("").unwrap().firmware, None);
    let f = load("[firmware]\n").unwrap().firmware.unwrap();
    assert_eq!(f.boot_dir, PathBuf::from("/boot"));
    assert_eq!(
        f.public_key,
        PathBuf::from("/etc/edgevol/firmware-signing.pub")
    );
    assert_eq!(f.cmdline, PathBuf::from("/proc/cmdline"));
    assert_eq!(f.health_hold, Duration::from_secs(DEFAULT_HEALTH_SECS));
    assert_eq!(f.watchdog, Some(PathBuf::from("/dev/watchdog")));
    assert_eq!(f.reboot_command, ["reboot", "-f"]);
    let f = load("[firmware]\nhealth_secs = 5\nwatchdog = \"off\"\nboot_dir = \"b\"\n")
        .unwrap()
        .firmware
        .unwrap();
    assert_eq!((f.health_hold, f.watchdog), (Duration::from_secs(5), None));
    assert_eq!(f.boot_dir, dir.path().join("b"));
    let e = load("[firmware]\nhealth_secs = 0\n").unwrap_err().0;
    assert!(e.contains("firmware.health_secs = 0"), "{e}");
    let e = load("[firmware]\nreboot_command = []\n").unwrap_err().0;
    assert!(e.contains("reboot_command is empty"), "{e}");
    assert!(load("[firmware]\nbogus = 1\n").is_err());
}

#[test]
fn without_dev_a_data_dir_and_device_are_required() {
    let e = Config::from_args(Args::default()).unwrap_err().0;
    assert!(e.contains("no data dir"), "{e}");
    let e = Config::from_args(Args {
        data_dir: Some("/tmp/x".into()),
        ..Args::default()
    })
    .unwrap_err()
    .0;
    assert!(e.contains("no device"), "{e}");
}
