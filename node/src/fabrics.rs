//! NVMe over Fabrics connect and disconnect through the kernel's own interfaces.
//!
//! **Why write `/dev/nvme-fabrics` ourselves rather than call nvme-cli.** The kernel interface
//! is one write of a `key=value,...` option string to `/dev/nvme-fabrics` (answered with
//! `instance=N,cntlid=M` on the same descriptor) and one write of `1` to
//! `/sys/class/nvme/nvmeN/delete_controller`. That is all `nvme connect`/`nvme disconnect` do
//! underneath. Doing it directly:
//! * drops a runtime dependency whose flags and defaults changed across versions (libnvme
//!   rewrite, `/etc/nvme/config.json`, hostid handling) and that is not on minimal hosts;
//! * gives us the kernel's errno instead of parsed text (`EALREADY` for a duplicate connect,
//!   `EIO` when the target answers the Fabrics Connect with an error status: no such subsystem,
//!   or our host NQN not admitted; `ECONNREFUSED` when nothing listens);
//! * keeps every option explicit in one place, [`connect_options`], unit-tested.
//!
//! **Find before attach.** [`find_controller`] asks sysfs for a usable controller to the same
//! subsystem NQN, transport address/service and host NQN, and [`ensure_connected`] connects only
//! when there is none, so a retried NodeStageVolume reuses the live (or reconnecting)
//! controller; the kernel would refuse a duplicate anyway.

use std::net::IpAddr;

use crate::error::{Error, Result};
use crate::host::Host;
use crate::sysfs::{self, Controller};

/// Tunables of the connection (flags of the binary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricsConfig {
    /// Seconds the kernel keeps reconnecting a lost controller before failing I/O and deleting
    /// it; -1 = forever.
    pub ctrl_loss_tmo: i32,
    /// Seconds between reconnect attempts.
    pub reconnect_delay: u32,
    /// I/O queues to ask for; 0 = the kernel's default (one per CPU).
    pub nr_io_queues: u32,
}

impl Default for FabricsConfig {
    fn default() -> Self {
        // The kernel's defaults are 600 s / 10 s; an appliance reboot must not cost the node
        // its volume, so keep trying for 30 minutes, every 2 s.
        FabricsConfig {
            ctrl_loss_tmo: 1800,
            reconnect_delay: 2,
            nr_io_queues: 0,
        }
    }
}

/// The host's NVMe identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIdentity {
    /// Host NQN (the CSI node id).
    pub nqn: String,
    /// Host identifier (UUID text), if known.
    pub id: Option<String>,
}

/// Where a volume's subsystem lives: parsed from publish_context at the edge.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Target {
    /// Only `tcp` today.
    pub transport: String,
    /// The target's IP address, in canonical form.
    pub traddr: String,
    /// The target's TCP port.
    pub trsvcid: u16,
    /// The subsystem NQN.
    pub subsysnqn: String,
}

impl Target {
    /// Validates the pieces a publish_context carries.
    pub fn parse(transport: &str, traddr: &str, trsvcid: &str, subsysnqn: &str) -> Result<Self> {
        if transport != "tcp" {
            return Err(Error::InvalidArgument(format!(
                "publish_context transport {transport:?} is not supported (only \"tcp\")"
            )));
        }
        let addr: IpAddr = traddr.parse().map_err(|_| {
            Error::InvalidArgument(format!(
                "publish_context targetAddress {traddr:?} is not an IP address"
            ))
        })?;
        let port: u16 = trsvcid.parse().ok().filter(|p| *p != 0).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "publish_context targetPort {trsvcid:?} is not a TCP port"
            ))
        })?;
        // An NQN is at most 223 bytes and must not break the comma-separated option string.
        if !subsysnqn.starts_with("nqn.")
            || subsysnqn.len() > 223
            || subsysnqn.contains([',', '=', '\n'])
            || subsysnqn.chars().any(char::is_whitespace)
        {
            return Err(Error::InvalidArgument(format!(
                "publish_context subsystemNqn {subsysnqn:?} is not a valid NQN"
            )));
        }
        Ok(Target {
            transport: transport.to_owned(),
            traddr: addr.to_string(),
            trsvcid: port,
            subsysnqn: subsysnqn.to_owned(),
        })
    }

    /// True when sysfs controller `c` is a controller of this host to this target.
    pub fn is_reached_by(&self, c: &Controller, host: &HostIdentity) -> bool {
        let same_addr = c
            .traddr
            .parse::<IpAddr>()
            .is_ok_and(|a| a.to_string() == self.traddr);
        c.transport == self.transport
            && c.subsysnqn == self.subsysnqn
            && same_addr
            && c.trsvcid == self.trsvcid.to_string()
            && c.hostnqn == host.nqn
    }
}

/// The option string written to `/dev/nvme-fabrics` (tokens of drivers/nvme/host/fabrics.c).
pub fn connect_options(target: &Target, host: &HostIdentity, cfg: &FabricsConfig) -> String {
    let mut opts = format!(
        "nqn={},transport={},traddr={},trsvcid={},hostnqn={}",
        target.subsysnqn, target.transport, target.traddr, target.trsvcid, host.nqn
    );
    if let Some(id) = &host.id {
        opts.push_str(&format!(",hostid={id}"));
    }
    if cfg.nr_io_queues > 0 {
        opts.push_str(&format!(",nr_io_queues={}", cfg.nr_io_queues));
    }
    opts.push_str(&format!(
        ",reconnect_delay={},ctrl_loss_tmo={}",
        cfg.reconnect_delay, cfg.ctrl_loss_tmo
    ));
    opts
}

/// Parses the kernel's `instance=N,cntlid=M` answer into the controller name `nvmeN`.
pub fn parse_connect_answer(answer: &str) -> Option<String> {
    answer
        .trim()
        .split(',')
        .find_map(|kv| kv.strip_prefix("instance="))
        .and_then(|n| n.parse::<u32>().ok())
        .map(|n| format!("nvme{n}"))
}

/// The usable controller of this host to `target`, if the kernel has one.
pub fn find_controller<H: Host + ?Sized>(
    host: &H,
    target: &Target,
    ident: &HostIdentity,
) -> Result<Option<Controller>> {
    let all = sysfs::controllers(host).map_err(|e| Error::io("listing NVMe controllers", &e))?;
    Ok(all
        .into_iter()
        .find(|c| c.usable() && target.is_reached_by(c, ident)))
}

/// Returns the controller to `target`, connecting only when none exists.
pub fn ensure_connected<H: Host + ?Sized>(
    host: &H,
    target: &Target,
    ident: &HostIdentity,
    cfg: &FabricsConfig,
) -> Result<String> {
    if let Some(c) = find_controller(host, target, ident)? {
        return Ok(c.name);
    }
    let options = connect_options(target, ident, cfg);
    tracing::info!(subsysnqn = %target.subsysnqn, traddr = %target.traddr,
        trsvcid = target.trsvcid, "connecting NVMe/TCP controller");
    let answer = host
        .connect_fabrics(&options)
        .map_err(|e| connect_error(target, ident, &e))?;
    parse_connect_answer(&answer).ok_or_else(|| {
        Error::Internal(format!(
            "unexpected answer from /dev/nvme-fabrics: {answer:?}"
        ))
    })
}

/// The CSI outcome of a failed write to `/dev/nvme-fabrics`. The kernel turns a Fabrics Connect
/// that the target answered with an error status into EIO: the edgevol target answers so for a
/// subsystem it does not have (Connect Invalid Parameters on SUBNQN: the volume was deleted) and
/// for a host NQN the volume is not published to (Connect Invalid Host), both "the volume does
/// not exist" from this node's view (NOT_FOUND: the CO checks the volume and its
/// ControllerPublishVolume). Everything else (refused or unreachable port, timeouts, resets)
/// means the target could not be asked: UNAVAILABLE, a retry may succeed.
pub fn connect_error(target: &Target, ident: &HostIdentity, err: &std::io::Error) -> Error {
    const EIO: i32 = 5;
    if err.raw_os_error() == Some(EIO) {
        Error::NotFound(format!(
            "the target at {}:{} refused to connect host {} to subsystem {} ({err}): the volume \
             does not exist there, or is not published to this node",
            target.traddr, target.trsvcid, ident.nqn, target.subsysnqn
        ))
    } else {
        Error::Unavailable(format!(
            "connecting to {} at {}:{} failed: {err}",
            target.subsysnqn, target.traddr, target.trsvcid
        ))
    }
}

/// Deletes controller `name` (write `1` to its `delete_controller`). A controller that no
/// longer exists is already disconnected.
pub fn disconnect<H: Host + ?Sized>(host: &H, name: &str) -> Result<()> {
    let attr = sysfs::controller_dir(host, name).join("delete_controller");
    if !attr.exists() {
        return Ok(());
    }
    tracing::info!(controller = name, "deleting NVMe controller");
    host.write_attr(&attr, "1")
        .map_err(|e| Error::io(format!("disconnecting {name} ({})", attr.display()), &e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeHost;

    fn target() -> Target {
        Target::parse(
            "tcp",
            "10.0.0.2",
            "4420",
            "nqn.2024-01.io.edgevol:app1:vol1",
        )
        .unwrap()
    }

    fn ident() -> HostIdentity {
        HostIdentity {
            nqn: "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555".into(),
            id: Some("11111111-2222-3333-4444-555555555555".into()),
        }
    }

    #[test]
    fn option_string_has_every_token() {
        let cfg = FabricsConfig {
            ctrl_loss_tmo: -1,
            reconnect_delay: 5,
            nr_io_queues: 4,
        };
        assert_eq!(
            connect_options(&target(), &ident(), &cfg),
            "nqn=nqn.2024-01.io.edgevol:app1:vol1,transport=tcp,traddr=10.0.0.2,trsvcid=4420,\
             hostnqn=nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555,\
             hostid=11111111-2222-3333-4444-555555555555,nr_io_queues=4,reconnect_delay=5,\
             ctrl_loss_tmo=-1"
        );
        let no_id = HostIdentity {
            nqn: "nqn.h".into(),
            id: None,
        };
        let s = connect_options(&target(), &no_id, &FabricsConfig::default());
        assert!(!s.contains("hostid="), "{s}");
        assert!(
            !s.contains("nr_io_queues"),
            "default leaves queues to the kernel: {s}"
        );
        assert!(s.ends_with("reconnect_delay=2,ctrl_loss_tmo=1800"), "{s}");
    }

    #[test]
    fn target_parsing_rejects_bad_fields() {
        assert!(Target::parse("rdma", "10.0.0.2", "4420", "nqn.a").is_err());
        assert!(Target::parse("tcp", "host.example", "4420", "nqn.a").is_err());
        assert!(Target::parse("tcp", "10.0.0.2", "0", "nqn.a").is_err());
        assert!(Target::parse("tcp", "10.0.0.2", "70000", "nqn.a").is_err());
        assert!(Target::parse("tcp", "10.0.0.2", "4420", "iqn.a").is_err());
        assert!(Target::parse("tcp", "10.0.0.2", "4420", "nqn.a,traddr=x").is_err());
        let v6 = Target::parse("tcp", "FD00:0:0::2", "4420", "nqn.a").unwrap();
        assert_eq!(v6.traddr, "fd00::2");
    }

    #[test]
    fn connect_answer_names_the_controller() {
        assert_eq!(
            parse_connect_answer("instance=3,cntlid=1\n").as_deref(),
            Some("nvme3")
        );
        assert_eq!(parse_connect_answer("garbage"), None);
    }

    #[test]
    fn reuses_a_live_controller_and_ignores_others() {
        let host = FakeHost::new();
        let id = ident();
        // Same subsystem, other host NQN; same host, other port; a dying one.
        host.add_controller(
            "nvme0",
            "tcp",
            "traddr=10.0.0.2,trsvcid=4420",
            &target().subsysnqn,
            "nqn.other",
            "live",
        );
        host.add_controller(
            "nvme1",
            "tcp",
            "traddr=10.0.0.2,trsvcid=4421",
            &target().subsysnqn,
            &id.nqn,
            "live",
        );
        host.add_controller(
            "nvme2",
            "tcp",
            "traddr=10.0.0.2,trsvcid=4420",
            &target().subsysnqn,
            &id.nqn,
            "deleting",
        );
        assert_eq!(find_controller(&host, &target(), &id).unwrap(), None);
        host.add_controller(
            "nvme4",
            "tcp",
            "traddr=10.0.0.2,trsvcid=4420,src_addr=10.0.0.9",
            &target().subsysnqn,
            &id.nqn,
            "connecting",
        );
        let name = ensure_connected(&host, &target(), &id, &FabricsConfig::default()).unwrap();
        assert_eq!(name, "nvme4");
        assert!(
            host.fabrics_writes().is_empty(),
            "no connect when one exists"
        );
    }

    #[test]
    fn connects_when_none_and_disconnect_is_idempotent() {
        let host = FakeHost::new();
        let id = ident();
        let name = ensure_connected(&host, &target(), &id, &FabricsConfig::default()).unwrap();
        assert_eq!(host.fabrics_writes().len(), 1);
        assert!(host.fabrics_writes()[0].starts_with("nqn=nqn.2024-01.io.edgevol:app1:vol1,"));
        assert_eq!(
            find_controller(&host, &target(), &id)
                .unwrap()
                .unwrap()
                .name,
            name
        );
        disconnect(&host, &name).unwrap();
        assert_eq!(find_controller(&host, &target(), &id).unwrap(), None);
        disconnect(&host, &name).unwrap();
    }

    #[test]
    fn connect_and_disconnect_failures_are_errors() {
        let host = FakeHost::new();
        host.fail_next("connect");
        let err =
            ensure_connected(&host, &target(), &ident(), &FabricsConfig::default()).unwrap_err();
        assert!(matches!(err, Error::Unavailable(_)), "{err}");
        let name = ensure_connected(&host, &target(), &ident(), &FabricsConfig::default()).unwrap();
        host.fail_next("delete_controller");
        assert!(disconnect(&host, &name).is_err());
    }
}
