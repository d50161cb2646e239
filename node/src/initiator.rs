//! Is the host's NVMe/TCP initiator there, and if not, can the plugin load it?
//!
//! Connecting needs two kernel modules: `nvme-fabrics`, whose misc device `/dev/nvme-fabrics`
//! takes the connect string, and the transport, `nvme-tcp` (which depends on `nvme-fabrics`).
//! What the kernel answers when one is missing (drivers/nvme/host/fabrics.c):
//! * no `nvme-fabrics`: there is no `/dev/nvme-fabrics`, and opening it fails with ENOENT;
//! * `nvme-fabrics` without `nvme-tcp`: `nvmf_create_ctrl` first calls
//!   `request_module("nvme-tcp")` itself (the host's modprobe, outside any container), and when
//!   still no transport is registered it logs "no handler found for transport tcp" and fails
//!   the write with EINVAL, the errno of an option the kernel does not know too. So after an
//!   EINVAL the plugin looks for the transport: `/sys/module/nvme_tcp` exists while it is
//!   loaded, and also when it is built in (it has module parameters since Linux 5.8), and
//!   `modules.builtin` names a built-in one.
//!
//! At start the plugin loads what is missing with modprobe (the DaemonSet mounts the host's
//! `/lib/modules`) and logs what it found; NodeStageVolume checks again before it connects and
//! answers FAILED_PRECONDITION, naming the module and the fix, rather than UNAVAILABLE, which a
//! CO retries forever.

use std::io;

use crate::error::{Error, Result};
use crate::host::Host;

/// The module whose device takes connect strings.
pub const FABRICS_MODULE: &str = "nvme-fabrics";
/// The TCP transport.
pub const TCP_MODULE: &str = "nvme-tcp";

/// What the kernel offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Initiator {
    /// `/dev/nvme-fabrics` is there and the TCP transport is loaded or built in.
    Ready,
    /// `/dev/nvme-fabrics` is there, the TCP transport is not: the kernel tries to load it at
    /// the first connect.
    NoTransport,
    /// No `/dev/nvme-fabrics`: nothing can connect.
    NoFabrics,
}

fn fabrics_present<H: Host + ?Sized>(host: &H) -> bool {
    host.dev_root().join("nvme-fabrics").exists()
}

fn tcp_present<H: Host + ?Sized>(host: &H) -> bool {
    module_present(host, "nvme_tcp", "nvme-tcp.ko")
}

/// Whether the kernel module `name` (as /sys/module names it) is loaded, or `file` is built into
/// the running kernel (its modules.builtin).
pub(crate) fn module_present<H: Host + ?Sized>(host: &H, name: &str, file: &str) -> bool {
    if host.sys_root().join("module").join(name).exists() {
        return true;
    }
    let Ok(release) = host.kernel_release() else {
        return false;
    };
    let builtin = host
        .modules_root()
        .join(release.trim())
        .join("modules.builtin");
    std::fs::read_to_string(builtin).is_ok_and(|list| {
        list.lines().any(|l| {
            let l = l.trim();
            l == file || l.strip_suffix(file).is_some_and(|dir| dir.ends_with('/'))
        })
    })
}

/// What the kernel offers now.
pub fn check<H: Host + ?Sized>(host: &H) -> Initiator {
    match (fabrics_present(host), tcp_present(host)) {
        (false, _) => Initiator::NoFabrics,
        (true, false) => Initiator::NoTransport,
        (true, true) => Initiator::Ready,
    }
}

/// Runs `modprobe module`; on failure, says why in one line.
fn modprobe<H: Host + ?Sized>(host: &H, module: &str) -> std::result::Result<(), String> {
    match host.modprobe(module) {
        Ok(out) if out.success() => Ok(()),
        Ok(out) => {
            let said = out
                .stderr
                .lines()
                .chain(out.stdout.lines())
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("no output")
                .to_owned();
            let code = out
                .code
                .map_or_else(|| "a signal".to_owned(), |c| format!("status {c}"));
            Err(format!(
                "modprobe {module} failed ({code}): {said}{}",
                modules_hint(host)
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(format!(
            "modprobe {module}: no modprobe in the plugin's image"
        )),
        Err(e) => Err(format!("modprobe {module}: {e}")),
    }
}

/// A hint when the container cannot see the running kernel's modules.
fn modules_hint<H: Host + ?Sized>(host: &H) -> String {
    match host.kernel_release() {
        Ok(release) if !host.modules_root().join(release.trim()).is_dir() => format!(
            "; the plugin's container has no {}: mount the host's /lib/modules into it",
            host.modules_root().join(release.trim()).display()
        ),
        _ => String::new(),
    }
}

/// modprobe said yes, yet there is no device node: the plugin looks at a `/dev` of its own.
fn no_device_after_modprobe<H: Host + ?Sized>(host: &H) -> String {
    format!(
        "modprobe succeeded but {} did not appear: mount the host's /dev into the plugin's \
         container",
        host.dev_root().join("nvme-fabrics").display()
    )
}

/// The operator's message: what is missing, what the plugin tried, and the fix.
fn missing_message<H: Host + ?Sized>(host: &H, found: Initiator, tried: &str) -> String {
    let kernel = host.kernel_release().map_or_else(
        |_| "the host's kernel".to_owned(),
        |r| format!("the host's kernel {}", r.trim()),
    );
    let what = match found {
        Initiator::NoFabrics => "no /dev/nvme-fabrics (module nvme-fabrics not loaded)",
        Initiator::NoTransport | Initiator::Ready => {
            "no NVMe/TCP transport (module nvme-tcp not loaded)"
        }
    };
    format!(
        "this node cannot connect NVMe/TCP volumes: {kernel} has {what}; {tried}. Fix: run \
         `modprobe nvme-tcp` on the host (it loads nvme-fabrics too; list nvme-tcp in \
         /etc/modules-load.d/ to keep it across reboots), or boot a kernel built with \
         CONFIG_NVME_TCP"
    )
}

/// At start: loads `nvme-fabrics` when `/dev/nvme-fabrics` is missing and `nvme-tcp` when the
/// transport is not there, then logs what the node can do (an error when it cannot connect).
pub fn prepare<H: Host + ?Sized>(host: &H) -> Initiator {
    let mut tried = Vec::new();
    for (missing, module) in [
        (!fabrics_present(host), FABRICS_MODULE),
        (!tcp_present(host), TCP_MODULE),
    ] {
        if !missing {
            continue;
        }
        match modprobe(host, module) {
            Ok(()) => tracing::info!(module, "loaded the kernel module with modprobe"),
            Err(why) => tried.push(why),
        }
    }
    let found = check(host);
    if tried.is_empty() {
        match found {
            Initiator::Ready => {}
            Initiator::NoFabrics => tried.push(no_device_after_modprobe(host)),
            Initiator::NoTransport => tried.push(format!(
                "modprobe {TCP_MODULE} succeeded but no TCP transport shows in {}",
                host.sys_root().join("module").display()
            )),
        }
    }
    let tried = tried.join("; ");
    match found {
        Initiator::Ready => {
            tracing::info!("NVMe/TCP initiator ready: /dev/nvme-fabrics and nvme-tcp are there");
        }
        Initiator::NoTransport => tracing::warn!(
            "{}. The kernel tries to load nvme-tcp itself at the first connect; if it cannot, \
             NodeStageVolume answers FAILED_PRECONDITION",
            missing_message(host, found, &tried)
        ),
        Initiator::NoFabrics => tracing::error!(
            "{}. Until then NodeStageVolume answers FAILED_PRECONDITION",
            missing_message(host, found, &tried)
        ),
    }
    found
}

/// Before a connect: FAILED_PRECONDITION when `/dev/nvme-fabrics` is missing even after one more
/// `modprobe nvme-tcp` (an operator may have installed the module since the start).
pub fn require_fabrics<H: Host + ?Sized>(host: &H, volume_id: &str) -> Result<()> {
    if fabrics_present(host) {
        return Ok(());
    }
    let tried = match modprobe(host, TCP_MODULE) {
        Ok(()) if fabrics_present(host) => {
            tracing::info!(
                module = TCP_MODULE,
                "loaded the kernel module with modprobe"
            );
            return Ok(());
        }
        Ok(()) => no_device_after_modprobe(host),
        Err(why) => why,
    };
    Err(Error::FailedPrecondition(format!(
        "volume {volume_id}: {}",
        missing_message(host, Initiator::NoFabrics, &tried)
    )))
}

/// After a refused write to `/dev/nvme-fabrics`: FAILED_PRECONDITION when the kernel answered
/// EINVAL and has no TCP transport even after its own attempt to load it; `None` otherwise.
pub fn transport_missing<H: Host + ?Sized>(host: &H, err: &io::Error) -> Option<Error> {
    const EINVAL: i32 = 22;
    if err.raw_os_error() != Some(EINVAL) || tcp_present(host) {
        return None;
    }
    Some(Error::FailedPrecondition(missing_message(
        host,
        Initiator::NoTransport,
        &format!("the kernel refused the connect ({err}) and could not load nvme-tcp itself"),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{capture, FakeHost};

    #[test]
    fn a_host_with_the_initiator_needs_nothing() {
        let host = FakeHost::new();
        let (found, log) = capture(|| prepare(&host));
        assert_eq!(found, Initiator::Ready);
        assert!(log.contains("NVMe/TCP initiator ready"), "{log}");
        assert!(host.commands_of("modprobe").is_empty());
        assert!(require_fabrics(&host, "v1").is_ok());
    }

    #[test]
    fn missing_modules_are_loaded_at_start() {
        let host = FakeHost::new();
        host.remove_initiator();
        host.set_loadable(&[FABRICS_MODULE, TCP_MODULE]);
        let (found, log) = capture(|| prepare(&host));
        assert_eq!(found, Initiator::Ready);
        assert_eq!(
            host.commands_of("modprobe"),
            vec![vec![FABRICS_MODULE.to_owned()], vec![TCP_MODULE.to_owned()]]
        );
        assert!(log.contains("loaded the kernel module"), "{log}");
        assert!(log.contains("initiator ready"), "{log}");
    }

    #[test]
    fn a_kernel_without_the_modules_is_logged_with_the_fix() {
        let host = FakeHost::new();
        host.remove_initiator();
        host.set_modules("6.1.0-minimal", "kernel/fs/ext4/ext4.ko:\n", "");
        let (found, log) = capture(|| prepare(&host));
        assert_eq!(found, Initiator::NoFabrics);
        for want in [
            "ERROR",
            "6.1.0-minimal",
            "6.1.0-minimal has no /dev/nvme-fabrics",
            "modprobe nvme-tcp failed (status 1): modprobe: FATAL: Module nvme-tcp not found",
            "`modprobe nvme-tcp` on the host",
            "CONFIG_NVME_TCP",
        ] {
            assert!(log.contains(want), "{want:?} not in {log}");
        }
        let err = require_fabrics(&host, "v1").unwrap_err();
        let Error::FailedPrecondition(msg) = err else {
            panic!("{err:?}")
        };
        assert!(msg.starts_with("volume v1: "), "{msg}");
        assert!(
            msg.contains("nvme-tcp") && msg.contains("CONFIG_NVME_TCP"),
            "{msg}"
        );
    }

    #[test]
    fn modprobe_missing_or_without_lib_modules_is_named() {
        let host = FakeHost::new();
        host.remove_initiator();
        host.set_modprobe_missing();
        let (_, log) = capture(|| prepare(&host));
        assert!(log.contains("no modprobe in the plugin's image"), "{log}");
        let host = FakeHost::new();
        host.remove_initiator();
        host.set_release("6.12.0-nomodules");
        let (_, log) = capture(|| prepare(&host));
        assert!(log.contains("mount the host's /lib/modules"), "{log}");
        assert!(log.contains("6.12.0-nomodules"), "{log}");
    }

    #[test]
    fn a_loaded_module_whose_device_the_container_does_not_see_is_named() {
        let host = FakeHost::new();
        host.remove_initiator();
        host.set_loadable(&[FABRICS_MODULE, TCP_MODULE]);
        // The kernel makes the node in the host's devtmpfs, not in this /dev.
        host.hide_device_nodes();
        let (_, log) = capture(|| prepare(&host));
        assert!(
            log.contains("did not appear: mount the host's /dev"),
            "{log}"
        );
        let err = require_fabrics(&host, "v1").unwrap_err();
        assert!(
            matches!(&err, Error::FailedPrecondition(m) if m.contains("mount the host's /dev")),
            "{err:?}"
        );
    }

    #[test]
    fn fabrics_without_tcp_warns_and_an_einval_connect_names_the_transport() {
        let host = FakeHost::new();
        host.remove_initiator();
        host.set_loadable(&[FABRICS_MODULE]);
        let (found, log) = capture(|| prepare(&host));
        assert_eq!(found, Initiator::NoTransport);
        assert!(log.contains("WARN"), "{log}");
        assert!(log.contains("module nvme-tcp not loaded"), "{log}");
        assert!(require_fabrics(&host, "v1").is_ok(), "the device is there");
        let einval = io::Error::from_raw_os_error(22);
        let err = transport_missing(&host, &einval).unwrap();
        assert!(
            matches!(&err, Error::FailedPrecondition(m) if m.contains("nvme-tcp")),
            "{err:?}"
        );
        // Another errno, or a transport that is there: not this module's business.
        assert!(transport_missing(&host, &io::Error::from_raw_os_error(5)).is_none());
        host.load_module("nvme_tcp");
        assert!(transport_missing(&host, &einval).is_none());
    }

    /// The plugin as main() builds it, on a host whose kernel has no NVMe/TCP initiator: the
    /// start-up check is logged, and NodeStageVolume answers FAILED_PRECONDITION naming nvme-tcp
    /// and the fix, connecting nothing and keeping no record.
    #[tokio::test]
    async fn a_node_without_the_initiator_says_so_at_start_and_at_stage() {
        use clap::Parser;
        use edgevol_proto::csi::v1::node_server::Node;
        use edgevol_proto::csi::v1::volume_capability::{access_mode, AccessMode, AccessType};
        use edgevol_proto::csi::v1::{NodeStageVolumeRequest, VolumeCapability};
        use std::sync::Arc;

        let host = Arc::new(FakeHost::new());
        host.remove_initiator();
        host.set_modules("6.1.0-minimal", "kernel/fs/ext4/ext4.ko:\n", "");
        let w = |x: &str| host.work.join(x).to_string_lossy().into_owned();
        std::fs::write(w("uuid"), "6f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b\n").unwrap();
        let args = crate::Args::parse_from([
            "edgevol-node".to_owned(),
            format!("--endpoint=unix://{}", w("csi.sock")),
            format!("--node-id-file={}", w("hostnqn")),
            format!("--hostid-file={}", w("hostid")),
            format!("--state-dir={}", w("state")),
            format!("--uuid-source={}", w("uuid")),
        ]);
        let dyn_host: Arc<dyn crate::host::Host> = host.clone();
        let (plugin, log) = capture(|| crate::build(&args, dyn_host));
        let plugin = plugin.expect("the plugin starts: other volumes' calls still work");
        assert!(log.contains("ERROR"), "{log}");
        assert!(log.contains("has no /dev/nvme-fabrics"), "{log}");
        assert!(log.contains("modprobe nvme-tcp"), "{log}");

        let request = NodeStageVolumeRequest {
            volume_id: "v1".into(),
            publish_context: [
                ("transport", "tcp"),
                ("targetAddress", "10.0.0.2"),
                ("targetPort", "4420"),
                ("subsystemNqn", "nqn.2024-11.io.edgevol:box-7:v0"),
                ("nguid", "000102030405060708090a0b0c0d0e0f"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
            staging_target_path: w("staging/v1"),
            volume_capability: Some(VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: access_mode::Mode::SingleNodeWriter as i32,
                }),
                access_type: Some(AccessType::Mount(Default::default())),
            }),
            ..Default::default()
        };
        let status = plugin
            .node
            .node_stage_volume(tonic::Request::new(request))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
        for want in [
            "nvme-tcp",
            "modprobe nvme-tcp",
            "CONFIG_NVME_TCP",
            "6.1.0-minimal",
        ] {
            assert!(
                status.message().contains(want),
                "{want:?}: {}",
                status.message()
            );
        }
        assert!(host.fabrics_writes().is_empty(), "nothing connected");
        assert!(
            std::fs::read_dir(w("state")).unwrap().next().is_none(),
            "no record kept"
        );
    }

    #[test]
    fn a_built_in_transport_counts() {
        let host = FakeHost::new();
        host.remove_initiator();
        host.set_loadable(&[FABRICS_MODULE]);
        host.set_modules(
            "6.12.0-builtin",
            "",
            "kernel/drivers/nvme/host/nvme-fabrics.ko\nkernel/drivers/nvme/host/nvme-tcp.ko\n",
        );
        let (found, _) = capture(|| prepare(&host));
        assert_eq!(found, Initiator::Ready);
    }
}
